//! A process whose connections carry calls forks children that live a while before they
//! exec (soft-RoCE VM): the children run, and every call, small and large (RDMA WRITE into
//! registered memory), keeps its right answer while the parent goes on writing registered
//! memory under them: with fork protection (`fork_init`, or a kernel that copies pinned
//! pages at fork) the device and the parent keep seeing the same pages. One test in the
//! binary: `fork_init` must come before any other verb.

mod common;

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rdma_rpc::prelude::*;
use rdma_rpc::{fork_init, fork_status, ForkStatus};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::echo_server::EchoServer;
use rpc_examples::EchoService;
use rpc_transport_rdma::verbs::test_support::require_device;

use common::{echo_blocking_checked, pattern};

/// How long a child lives before it execs, while the parent's calls write registered
/// memory: copy-on-write would move the parent's pages away from the device then.
const CHILD_LINGERS: libc::timespec = libc::timespec {
    tv_sec: 0,
    tv_nsec: 20_000_000,
};

/// Forks; the child waits [`CHILD_LINGERS`] then execs `program`, the parent waits for it
/// and returns its exit code.
fn fork_exec(program: &CString) -> i32 {
    let argv = [program.as_ptr(), std::ptr::null()];
    // SAFETY: the child calls only async-signal-safe functions (`nanosleep`, `execv`,
    // `_exit`) before it is replaced, with arguments prepared before the fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: `CHILD_LINGERS` is a valid timespec; `argv` is a NULL-terminated array of
        // valid C strings.
        unsafe {
            libc::nanosleep(&CHILD_LINGERS, std::ptr::null_mut());
            libc::execv(program.as_ptr(), argv.as_ptr());
            libc::_exit(127);
        }
    }
    let mut status = 0;
    // SAFETY: `pid` is our child and `status` a valid out-pointer.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid, "waitpid: {}", std::io::Error::last_os_error());
    assert!(
        libc::WIFEXITED(status),
        "the child did not exit: {status:#x}"
    );
    libc::WEXITSTATUS(status)
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn forking_and_execing_while_calls_run_leaves_every_call_right() {
    require_device().expect("an RDMA device");
    fork_init().expect("ibv_fork_init before any other verb");
    let status = fork_status();
    assert_ne!(status, ForkStatus::Disabled, "fork_init enables protection");
    eprintln!("fork protection: {status:?}");

    let server = common::start_rdma(
        Server::builder().add_service(EchoServer::new(EchoService)),
        Default::default(),
    );
    let client = EchoClient::new(common::connect_rdma(&server, Default::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let caller = {
        let (client, stop) = (client.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seq = 0u64;
            while !stop.load(Ordering::SeqCst) || seq < 200 {
                // Small by SEND, large by RDMA WRITE into a granted buffer.
                let len = if seq % 4 == 3 { 300_000 } else { 2_000 };
                echo_blocking_checked(&client, seq, &pattern(len, seq));
                seq += 1;
            }
            seq
        })
    };
    let program = CString::new("/bin/true").unwrap();
    for _ in 0..20 {
        assert_eq!(fork_exec(&program), 0, "the child ran");
    }
    stop.store(true, Ordering::SeqCst);
    let calls = caller.join().expect("every call kept its answer");
    assert!(calls >= 200);
    echo_blocking_checked(&client, u64::MAX, &pattern(100_000, 9));
}
