//! What many connections cost a TCP server: alone in its process, since it counts the
//! process's threads and resident memory.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use rdma_rpc::prelude::*;
use rdma_rpc::{FrameKind, Header, ServerHandle};
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::testing::SleepRequest;
use rpc_examples::Tester;

const BULK: u32 = rdma_rpc::method_id("/rpc.testing.Tester/Bulk");

fn idle_call(client: &TesterClient) {
    client
        .sleep_blocking(SleepRequest {
            duration: Some(Duration::ZERO.try_into().unwrap()),
        })
        .expect("call");
}

/// Raw peers that declare 4 MiB frames and send one byte of them, and a thousand that send
/// nothing: the server's threads do not grow with them and its memory grows with what
/// arrived, not with what was declared.
#[test]
fn a_thousand_idle_and_two_hundred_half_frames_cost_no_threads_and_little_memory() {
    raise_fd_limit(4096);
    let server: ServerHandle = Server::builder()
        .add_service(TesterServer::new(Tester::default()))
        .start("tcp://127.0.0.1:0")
        .expect("server starts");
    let addr = server.local_url().trim_start_matches("tcp://").to_string();
    // Warm up: one call, so that lazily started threads exist before the baseline.
    let client = TesterClient::new(rdma_rpc::connect_blocking(server.local_url()).unwrap());
    idle_call(&client);
    let (threads_before, rss_before) = (threads(), rss_kib());

    let mut peers = Vec::new();
    for call in 0..200u64 {
        let mut stream = TcpStream::connect(&addr).unwrap();
        let mut header = Header::new(FrameKind::Request, call + 1);
        header.method_id = BULK;
        header.payload_len = 4 << 20;
        stream
            .write_all(&header.to_bytes()[..header.encoded_len()])
            .unwrap();
        stream.write_all(&[0]).unwrap();
        peers.push(stream);
    }
    for _ in 0..1000 {
        peers.push(TcpStream::connect(&addr).unwrap());
    }
    // Connections are accepted in order: once a newer one is answered, every raw peer was
    // accepted; a moment later each has had its bytes read.
    let last = TesterClient::new(rdma_rpc::connect_blocking(server.local_url()).unwrap());
    idle_call(&last);
    std::thread::sleep(Duration::from_millis(500));
    let (threads_after, rss_after) = (threads(), rss_kib());
    eprintln!(
        "threads {threads_before} -> {threads_after}, RSS {rss_before} KiB -> {rss_after} KiB"
    );
    assert!(
        threads_after <= threads_before,
        "threads grew with connections: {threads_before} -> {threads_after}"
    );
    assert!(
        rss_after - rss_before < 64 * 1024,
        "1,200 connections (200 declaring 4 MiB) took {} KiB",
        rss_after - rss_before
    );
    idle_call(&client);
    drop(peers);
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

fn rss_kib() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// Both ends of every connection live in this process: lift the soft descriptor limit.
fn raise_fd_limit(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by reference.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        assert!(
            lim.rlim_max >= want,
            "this test needs {want} file descriptors; the hard limit is {}",
            lim.rlim_max
        );
        lim.rlim_cur = lim.rlim_cur.max(want);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
}
