//! Chaos on real verbs: 64 connections making calls while the link goes down
//! (`ip link set veth0 down` in the soft-RoCE VM; a plain `cargo test` ignores it). Every
//! call ends with a clear status within its deadline or the keepalive time, and the
//! device's resources and this process's pinned memory are back to their baseline.
//!
//! `cargo xtask test` runs this binary after every other one: soft-RoCE's connection manager
//! does not recover from a link flap with connections open (new connections time out for
//! minutes after; see `xtask`'s `RUNS_LAST`).

mod chaos_support;
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use chaos_support::*;
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::EchoRequest;
use rpc_transport_rdma::verbs::test_support::require_device;

/// Prints where each thread of this process waits, from `/proc` (its name, state, kernel
/// wait channel and, where readable, kernel stack): what a step that should have ended is
/// stuck in. Not gdb: attaching it stops the whole process, and under the VM's emulated CPU
/// loading this binary's debug information kept it stopped past the test binary's 10-minute
/// limit.
pub fn print_stacks(why: &str) {
    say(format!("{why}: where each thread waits follows"));
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return say("(no /proc/self/task here)".into());
    };
    for task in tasks.flatten() {
        let dir = task.path();
        let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        let state = read("stat");
        // `pid (comm) state ...`: the state follows the last parenthesis.
        let state = state
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .next();
        say(format!(
            "thread {} {:?} state {} waits in {}",
            task.file_name().to_string_lossy(),
            read("comm").trim(),
            state.unwrap_or("?"),
            read("wchan"),
        ));
        for frame in read("stack").lines().take(12) {
            say(format!("    {frame}"));
        }
    }
}

/// How long the probe of new connections after the link comes back may take.
const PROBE_BOUND: Duration = Duration::from_secs(20);

/// Sets veth0's link down for as long as it lives.
struct LinkDown;

impl LinkDown {
    fn set(up: bool) {
        let state = if up { "up" } else { "down" };
        let status = Command::new("ip")
            .args(["link", "set", "veth0", state])
            .status()
            .unwrap();
        assert!(status.success(), "ip link set veth0 {state}");
    }

    fn new() -> LinkDown {
        LinkDown::set(false);
        LinkDown
    }
}

impl LinkDown {
    /// Brings the link up and reports whether new connections to `url` work again within
    /// a few seconds (on soft-RoCE they do not: its connection manager's messages sent
    /// while the link was down leave it stuck, which is why this binary runs last).
    /// On its own thread and bounded (20 s): a probe that hangs is reported with every
    /// thread's stack and left behind, not a test that never ends.
    fn up_again(self, url: &str) {
        let url = url.to_owned();
        let probe = std::thread::spawn(move || self.probe(&url));
        let until = Instant::now() + PROBE_BOUND;
        while !probe.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !probe.is_finished() {
            print_stacks("link down: the probe of new connections did not end within 20 s");
        }
    }

    fn probe(self, url: &str) {
        drop(self);
        let since = Instant::now();
        let works = loop {
            let attempt = rdma_rpc::client()
                .connect_timeout(Duration::from_secs(1))
                .connect_blocking(url)
                .map_err(|e| e.to_string())
                .and_then(|channel| {
                    let mut request = rdma_rpc::Request::new(EchoRequest::default());
                    request.set_timeout(Duration::from_secs(1));
                    EchoClient::new(channel)
                        .echo_blocking(request)
                        .map_err(|e| e.to_string())
                });
            match attempt {
                Ok(_) => break Ok(since.elapsed()),
                Err(e) if since.elapsed() > Duration::from_secs(5) => break Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        match works {
            Ok(after) => say(format!(
                "link down: new connections work {after:?} after the link came up"
            )),
            Err(e) => say(format!(
                "link down: no new connection within 5 s of the link coming up: {e}"
            )),
        }
    }
}

impl Drop for LinkDown {
    fn drop(&mut self) {
        LinkDown::set(true);
    }
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn the_link_goes_down_under_64_connections() {
    require_device().expect("an RDMA device");
    let _serial = lock(&SERIAL);
    let baseline = baseline();
    let server = echo_server();
    let calling = Calling::start(server.local_url(), "link down");
    let down = LinkDown::new();
    std::thread::sleep(BOUND);
    down.up_again(server.local_url());
    calling.finish(0).report("link down");
    server.shutdown_blocking(Duration::from_secs(1));
    back_to(&baseline, "link down");
}
