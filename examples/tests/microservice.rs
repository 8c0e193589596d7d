//! The example microservice as its README runs it, over TCP (host) and RDMA (soft-RoCE VM):
//! `kv-server` and `kv-gateway` as processes, the HTTP API, health, Prometheus metrics, and
//! a clean exit on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use rpc_transport_rdma::verbs::test_support::test_addr;

/// A child process, killed if the test fails before it exits.
struct Process {
    name: &'static str,
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Process {
    fn start(name: &'static str, args: &[&str]) -> Process {
        let exe = match name {
            "kv-server" => env!("CARGO_BIN_EXE_kv-server"),
            _ => env!("CARGO_BIN_EXE_kv-gateway"),
        };
        let mut child = Command::new(exe)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Process {
            name,
            child,
            stdout,
        }
    }

    /// The next line it prints that starts with `prefix`, without the prefix.
    fn line_after(&mut self, prefix: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let read = self.stdout.read_line(&mut line).unwrap();
            assert!(read > 0, "{} ended before printing {prefix:?}", self.name);
            if let Some(rest) = line.trim_end().strip_prefix(prefix) {
                return rest.to_owned();
            }
        }
    }

    /// Sends SIGTERM; it must exit successfully within `within`.
    fn terminate(mut self, within: Duration) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        let sent = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(sent, 0);
        let until = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "{} exited {status}", self.name);
                return;
            }
            assert!(
                Instant::now() < until,
                "{} still running {within:?} after SIGTERM",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request; the status code and body.
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    (code, body.to_owned())
}

fn key_value_over_http(listen: &str) {
    let mut server = Process::start("kv-server", &["--listen", listen, "--grace-ms", "2000"]);
    let url = server.line_after("kv-server listening on ");
    let mut gateway = Process::start(
        "kv-gateway",
        // A generous budget per backend call: the first one connects, which over soft-RoCE
        // under emulation can take seconds.
        &[
            "--listen",
            "127.0.0.1:0",
            "--backend",
            &url,
            "--timeout-ms",
            "30000",
        ],
    );
    let http_url = gateway.line_after("kv-gateway listening on ");
    let addr = http_url.trim_start_matches("http://");

    assert_eq!(http(addr, "GET", "/healthz", "").0, 200);
    assert_eq!(http(addr, "PUT", "/kv/answer", "42").0, 201);
    assert_eq!(http(addr, "PUT", "/kv/answer", "43").0, 200, "replaced");
    assert_eq!(http(addr, "GET", "/kv/answer", ""), (200, "43".to_owned()));
    let (code, body) = http(addr, "GET", "/kv/missing", "");
    assert_eq!(code, 404);
    assert!(body.contains("NOT_FOUND"), "{body}");
    assert_eq!(http(addr, "DELETE", "/kv/answer", "").0, 204);
    assert_eq!(http(addr, "GET", "/kv/answer", "").0, 404);

    let (code, metrics) = http(addr, "GET", "/metrics", "");
    assert_eq!(code, 200);
    for line in [
        r#"grpc_client_handled_total{grpc_service="kv.Store",grpc_method="Put",grpc_code="OK"} 2"#,
        r#"grpc_client_handled_total{grpc_service="kv.Store",grpc_method="Get",grpc_code="OK"} 1"#,
        r#"grpc_client_handled_total{grpc_service="kv.Store",grpc_method="Get",grpc_code="NOT_FOUND"} 2"#,
        r#"grpc_client_handled_total{grpc_service="grpc.health.v1.Health",grpc_method="Check",grpc_code="OK"} 1"#,
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line} in\n{metrics}"
        );
    }

    // SIGTERM: the gateway stops; the server reports NOT_SERVING, drains and stops.
    gateway.terminate(Duration::from_secs(10));
    server.terminate(Duration::from_secs(10));
}

#[test]
fn tcp_key_value_over_http() {
    key_value_over_http("tcp://127.0.0.1:0");
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn rdma_key_value_over_http() {
    key_value_over_http(&format!("rdma://{}:0", test_addr()));
}
