//! Bad arguments give a clear message and a non-zero exit code (2, as clap uses).

mod common;

use common::run;

fn assert_usage_error(args: &[&str], mentions: &[&str]) {
    let out = run(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "rpc-bench {args:?} should exit with 2:\n{stderr}"
    );
    for word in mentions {
        assert!(
            stderr.contains(word),
            "rpc-bench {args:?}: stderr should mention {word:?}:\n{stderr}"
        );
    }
    assert!(out.stdout.is_empty(), "nothing on stdout for a usage error");
}

#[test]
fn missing_url_is_named() {
    assert_usage_error(&["client", "--size", "64", "--iters", "10"], &["--url"]);
    assert_usage_error(&["loopback"], &["--url"]);
    assert_usage_error(&["server"], &["--url"]);
}

#[test]
fn bad_url_is_named_with_the_reason() {
    assert_usage_error(
        &["client", "--url", "http://127.0.0.1:1"],
        &["http://127.0.0.1:1", "unsupported scheme"],
    );
    assert_usage_error(
        &["loopback", "--url", "tcp://127.0.0.1"],
        &["tcp://127.0.0.1", "missing port"],
    );
    assert_usage_error(&["server", "--url", "nonsense"], &["nonsense", "--url"]);
}

#[test]
fn zero_iters_and_zero_concurrency_are_refused() {
    assert_usage_error(
        &["loopback", "--url", "tcp://127.0.0.1:0", "--iters", "0"],
        &["--iters", "0"],
    );
    assert_usage_error(
        &[
            "loopback",
            "--url",
            "tcp://127.0.0.1:0",
            "--concurrency",
            "0",
        ],
        &["--concurrency", "at least 1"],
    );
    assert_usage_error(&["tcp-compare", "--iters", "0"], &["--iters"]);
}

#[test]
fn bad_rdma_settings_are_refused() {
    assert_usage_error(
        &[
            "server",
            "--url",
            "rdma://127.0.0.1:0",
            "--poll",
            "sometimes",
        ],
        &["--poll", "sometimes", "busy"],
    );
    assert_usage_error(
        &["server", "--url", "rdma://127.0.0.1:0", "--slots", "2"],
        &["--slots", "2"],
    );
}

#[test]
fn unknown_subcommand_is_refused() {
    assert_usage_error(&["frobnicate"], &["frobnicate"]);
}
