//! Blocking callers that park while their handler runs, over real verbs (run in the
//! soft-RoCE VM by `cargo xtask test`). A binary of its own: the figure it checks is a
//! time, which tests running beside it on the VM's two CPUs stretch.

mod common;

use common::{connect_rdma as connect, sleep_for};

use std::time::{Duration, Instant};

use rdma_rpc::prelude::*;
use rdma_rpc::{PollMode, Polling, RdmaConfig, ServerHandle};
use rpc_examples::testing::tester_client::TesterClient;
use rpc_examples::testing::tester_server::TesterServer;
use rpc_examples::Tester;
use rpc_transport_rdma::verbs::test_support::require_device;

fn device() -> bool {
    require_device().is_some()
}

fn start(tester: &Tester, rdma: RdmaConfig) -> ServerHandle {
    common::start_rdma(
        Server::builder().add_service(TesterServer::new(tester.clone())),
        rdma,
    )
}

#[test]
#[ignore = "needs an RDMA device: `cargo xtask test` runs it on soft-RoCE in a VM"]
fn parked_blocking_callers_are_answered_without_a_stall() {
    if !device() {
        return;
    }
    // A handler slower than the adaptive spin makes each blocking caller park and hand the
    // CQ to the poller, which must then watch it (a poller that kept waiting for callers to
    // drive slept 50 ms per call). The median call is looked at: the first calls of a
    // connection, and any that other tests on the two CPUs delay, take longer.
    let server = start(&Tester::default(), RdmaConfig::default());
    let client = TesterClient::new(connect(&server, RdmaConfig::default()));
    // Busy polling never parks: its calls are what a call costs in this boot, on this load.
    let busy = TesterClient::new(connect(
        &server,
        RdmaConfig::default().polling(Polling::default().mode(PollMode::Busy)),
    ));
    let median_of = |client: &TesterClient<rdma_rpc::Channel>, handler: Duration| {
        let mut each: Vec<Duration> = (0..41)
            .map(|_| {
                let started = Instant::now();
                client
                    .sleep_blocking(sleep_for(handler))
                    .expect("sleep call");
                started.elapsed()
            })
            .collect();
        each.sort();
        (each[each.len() / 2], each)
    };
    // The bound is relative to the busy caller's, so a slow emulation does not fail the
    // test, and the 50 ms a stalled poller adds per call still does.
    let handler = Duration::from_millis(2);
    let (baseline, _) = median_of(&busy, handler);
    let (median, each) = median_of(&client, handler);
    let bound = baseline + Duration::from_millis(30);
    assert!(
        median < bound,
        "median call {median:?} for a {handler:?} handler, against {baseline:?} for a busy \
         caller (bound {bound:?}): parked callers wait for the poller (all: {each:?})"
    );
}
