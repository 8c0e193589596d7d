//! Short runs of the real binary: the JSON parses as a `BenchResult` with sane values.
//! Correctness only, no timing thresholds.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::{args, assert_sane, run, run_json, BIN};
use rpc_transport_rdma::verbs::test_support::{require_device, test_addr};

#[test]
fn tcp_loopback_blocking() {
    let r = run_json(&args(
        "loopback --url tcp://127.0.0.1:0 --size 64 --iters 200 --json",
    ));
    assert_sane(&r, "tcp", 64, 200, 1);
    assert!(r.url.starts_with("tcp://127.0.0.1:"), "{}", r.url);
    assert_eq!(r.poll, None);
}

#[test]
fn tcp_loopback_concurrent_and_odd_sizes() {
    for (size, concurrency) in [(0, 4), (5, 3), (70_000, 8)] {
        let line = format!(
            "loopback --url tcp://127.0.0.1:0 --size {size} --iters 100 --warmup 10 \
             --concurrency {concurrency} --json"
        );
        let r = run_json(&args(&line));
        assert_eq!((r.size, r.iters, r.concurrency), (size, 100, concurrency));
        if size > 0 {
            assert_sane(&r, "tcp", size, 100, concurrency);
        }
    }
}

#[test]
fn text_output_names_the_figures() {
    let out = run(&args(
        "loopback --url tcp://127.0.0.1:0 --size 16 --iters 50",
    ));
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    for word in ["p50", "p99.9", "calls/s", "MiB/s"] {
        assert!(stdout.contains(word), "{word} missing from {stdout}");
    }
}

#[test]
fn server_and_client_processes() {
    let mut server = Command::new(BIN)
        .args(args("server --url tcp://127.0.0.1:0"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("server starts");
    let mut first = String::new();
    BufReader::new(server.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("server prints its URL");
    let url = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_owned();
    let line = format!("client --url {url} --size 128 --iters 100 --json");
    let result = std::panic::catch_unwind(|| {
        let r = run_json(&args(&line));
        // The server answers the standard health probe.
        for (service, code, says) in [
            ("", 0, "SERVING"),
            ("echo.Echo", 0, "SERVING"),
            ("kv.Store", 1, "NOT_FOUND"),
        ] {
            let probe = format!("health --url {url}");
            let out = run(&[args(&probe), vec!["--service", service]].concat());
            let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(code), "{service:?}: {said}");
            assert!(said.contains(says), "{service:?}: {said}");
        }
        r
    });
    let _ = server.kill();
    let _ = server.wait();
    let r = result.expect("client run");
    assert_sane(&r, "tcp", 128, 100, 1);
    assert_eq!(r.url, url);
}

#[test]
fn connecting_to_nothing_fails_with_a_message() {
    let out = run(&args("client --url tcp://127.0.0.1:1 --iters 1"));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("tcp://127.0.0.1:1"), "{stderr}");
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn rdma_loopback() {
    if require_device().is_none() {
        return;
    }
    let url = format!("rdma://{}:0", test_addr());
    let r = run_json(&args(&format!(
        "loopback --url {url} --size 64 --iters 200 --json"
    )));
    assert_sane(&r, "rdma", 64, 200, 1);
    assert!(r.poll.is_some());
    // Frames that fit a 4 KiB slot, over event polling with few slots: the small-message
    // path under a tight credit window.
    let r = run_json(&args(&format!(
        "loopback --url {url} --size 3000 --iters 50 --warmup 5 --concurrency 4 \
         --poll event --slots 16 --slot-size 4096 --json"
    )));
    assert_sane(&r, "rdma", 3000, 50, 4);
    assert_eq!(r.poll.as_deref(), Some("event"));
}
