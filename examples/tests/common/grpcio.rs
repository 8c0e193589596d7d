//! Python's grpcio serving the examples' Tester and Streamer (`tests/grpc/server.py`): the
//! gRPC server we did not write that our generated clients are tested against. Needs
//! `python3` with `grpcio` and `grpcio-tools` (the README's test command installs them).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_rpc::ServerBuilder;
use rpc_examples::streaming::streamer_server::StreamerServer;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::{Streamer, StreamerStats, Tester, TesterStats};

/// What the interop script's cases call: the examples' Tester and Streamer, health (Tester
/// serving) and reflection; with what the handlers count.
pub fn interop_services() -> (ServerBuilder, Arc<TesterStats>, Arc<StreamerStats>) {
    let tester = Tester::default();
    let streamer = Streamer::default();
    let (tester_stats, streamer_stats) = (tester.stats.clone(), streamer.stats.clone());
    let (reporter, health) = rdma_rpc::health::health_reporter();
    reporter.set_serving::<TesterServer<Tester>>();
    let (reflection, reflection_v1alpha) = rdma_rpc::reflection::builder()
        .register_encoded_file_descriptor_set(rpc_examples::FILE_DESCRIPTOR_SET)
        .and_then(|b| b.register_encoded_file_descriptor_set(rdma_rpc::health::FILE_DESCRIPTOR_SET))
        .unwrap()
        .build();
    let builder = rdma_rpc::Server::builder()
        .max_message_size(16 << 20)
        .add_service(health)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(TesterServer::new(tester))
        .add_service(StreamerServer::new(streamer));
    (builder, tester_stats, streamer_stats)
}

/// A running grpcio server, stopped when dropped.
pub struct GrpcioServer {
    child: Child,
    url: String,
}

impl GrpcioServer {
    /// Starts it on 127.0.0.1 (a free port); panics, naming what is missing, if it cannot.
    pub fn start() -> GrpcioServer {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/grpc/server.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs (install python3)");
        let mut first = String::new();
        let stdout = child.stdout.take().expect("piped");
        BufReader::new(stdout)
            .read_line(&mut first)
            .expect("the grpcio server prints its port");
        let port: u16 = first.trim().parse().unwrap_or_else(|_| {
            let _ = child.kill();
            panic!(
                "the grpcio server did not start (is grpcio installed? pip install grpcio \
                 grpcio-tools); it printed {first:?}"
            )
        });
        GrpcioServer {
            child,
            url: format!("grpc://127.0.0.1:{port}"),
        }
    }

    /// `grpc://127.0.0.1:port`.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for GrpcioServer {
    fn drop(&mut self) {
        // Closing its stdin tells it to stop; one that does not within a few seconds is
        // killed.
        drop(self.child.stdin.take());
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the interop script's `cases` against `target` (`host:port`), over TLS trusting the
/// authority of the PEM file `ca` if given.
pub fn run_cases(target: &str, ca: Option<&Path>, cases: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/grpc/interop.py");
    let mut python = Command::new("python3");
    python.arg(&script).arg(target).args(cases);
    if let Some(ca) = ca {
        python.env("GRPC_CA", ca);
    }
    let output = python.output().expect("python3 runs (install python3)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    print!("{stdout}");
    assert!(
        !stderr.contains("No module named 'grpc"),
        "grpcio is missing: pip install grpcio grpcio-tools\n{stderr}"
    );
    assert!(
        output.status.success(),
        "interop cases failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    for case in cases {
        assert!(
            stdout.contains(&format!("ok   {case} ")),
            "{case} did not run:\n{stdout}"
        );
    }
}
