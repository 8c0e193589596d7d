//! A balanced channel over scripted servers: spreading calls, going around a dead one,
//! endpoints added and removed at run time, failing fast or waiting when none is up.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use futures::executor::block_on;
use tower::discover::Change;

use super::test_support::*;
use super::{Channel, ChannelConfig, Connectivity, ReconnectConfig};
use crate::{Code, Request};

fn servers(n: usize) -> Vec<Arc<Server>> {
    (0..n).map(|_| Arc::new(Server::default())).collect()
}

fn answered(servers: &[Arc<Server>]) -> Vec<usize> {
    servers
        .iter()
        .map(|s| s.answered.load(Ordering::SeqCst))
        .collect()
}

/// A balanced channel over `servers`, each behind a lazy healing channel.
fn balanced(servers: &[Arc<Server>], reconnect: ReconnectConfig) -> Channel {
    let endpoints: Vec<Result<Change<usize, Channel>, Infallible>> = servers
        .iter()
        .enumerate()
        .map(|(i, server)| Ok(Change::Insert(i, healing(server, reconnect.clone()))))
        .collect();
    Channel::balance(
        futures::stream::iter(endpoints),
        &reconnect,
        ChannelConfig::default(),
    )
    .unwrap()
}

#[test]
fn calls_spread_over_the_endpoints_and_go_around_a_dead_one() {
    let servers = servers(3);
    let channel = balanced(&servers, no_jitter());
    assert_eq!(channel.connectivity(), Connectivity::Idle);
    for _ in 0..300 {
        call(&channel).expect("a call over some endpoint");
    }
    for _ in 0..30 {
        call_blocking(&channel, None).expect("a blocking call over some endpoint");
    }
    let spread = answered(&servers);
    assert_eq!(spread.iter().sum::<usize>(), 330);
    assert!(
        spread.iter().all(|&n| n > 0),
        "every endpoint takes calls: {spread:?}"
    );
    assert_eq!(channel.connectivity(), Connectivity::Ready);

    // Server 1 dies and stays down: no call fails because of it once it is known dead,
    // and it gets no more calls.
    servers[1].down.store(true, Ordering::SeqCst);
    servers[1].kill();
    let before = answered(&servers);
    for _ in 0..200 {
        call(&channel).expect("calls go around the dead endpoint");
    }
    let after = answered(&servers);
    assert_eq!(after[1], before[1], "the dead endpoint got calls");
    assert_eq!(after[0] + after[2], before[0] + before[2] + 200);
    assert!(after[0] > before[0] && after[2] > before[2], "{after:?}");

    // It comes back and takes calls again.
    servers[1].down.store(false, Ordering::SeqCst);
    eventually("the endpoint takes calls again", || {
        call(&channel).unwrap();
        answered(&servers)[1] > after[1]
    });
}

#[test]
fn the_less_loaded_endpoint_gets_the_call() {
    let servers = servers(2);
    servers[0].hold.store(true, Ordering::SeqCst);
    let channel = balanced(&servers, no_jitter());
    // Connect both, then pile calls up on the one that does not answer.
    eventually("both endpoints connected", || {
        channel.connectivity() == Connectivity::Ready
            && servers.iter().all(|s| !s.connections.lock().is_empty())
            || {
                let _ = call_blocking(&channel, Some(Duration::from_millis(1)));
                false
            }
    });
    let answered_before = answered(&servers)[1];
    let held: Vec<_> = (0..8)
        .map(|_| {
            let channel = channel.clone();
            std::thread::spawn(move || call_blocking(&channel, Some(Duration::from_secs(5))))
        })
        .collect();
    let held_by_0 = || servers[0].connections.lock()[0].in_flight();
    eventually(
        "the 8 calls are held by server 0 or answered by server 1",
        || held_by_0() + answered(&servers)[1] - answered_before == 8,
    );
    assert!(held_by_0() >= 1);
    let before = answered(&servers)[1];
    for _ in 0..100 {
        call(&channel).expect("answered by the endpoint with nothing in flight");
    }
    assert_eq!(answered(&servers)[1], before + 100);
    servers[0].kill();
    for handle in held {
        let _ = handle.join().unwrap();
    }
}

#[test]
fn endpoints_change_at_run_time() {
    let servers = servers(3);
    let (tx, rx) = mpsc::unbounded::<Result<Change<&str, Channel>, Infallible>>();
    let reconnect = no_jitter();
    let channel = Channel::balance(rx, &reconnect, ChannelConfig::default()).unwrap();
    let insert = |key, server: &Arc<Server>| {
        let endpoint = healing(server, reconnect.clone());
        tx.unbounded_send(Ok(Change::Insert(key, endpoint)))
            .unwrap();
    };

    // No endpoint yet: a call waits for discovery within its deadline.
    let status = call_blocking(&channel, Some(Duration::from_millis(50))).unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");

    insert("a", &servers[0]);
    for _ in 0..50 {
        call(&channel).unwrap();
    }
    assert_eq!(answered(&servers), [50, 0, 0]);

    insert("b", &servers[1]);
    insert("c", &servers[2]);
    eventually("the new endpoints take calls", || {
        call(&channel).unwrap();
        answered(&servers).iter().all(|&n| n > 0)
    });

    tx.unbounded_send(Ok(Change::Remove("a"))).unwrap();
    call(&channel).unwrap(); // the balancer sees the removal at its next pick
    let before = answered(&servers);
    for _ in 0..100 {
        call(&channel).unwrap();
    }
    assert_eq!(
        answered(&servers)[0],
        before[0],
        "a removed endpoint gets no calls"
    );
    eventually("the removed endpoint's channel is closed", || {
        servers[0].connections.lock()[0].is_closed()
    });
}

#[test]
fn with_every_endpoint_down_calls_fail_fast_or_wait_for_one() {
    let servers = servers(2);
    for server in &servers {
        server.down.store(true, Ordering::SeqCst);
    }
    let channel = balanced(&servers, no_jitter());
    // The first call (no deadline) waits while the first attempts run, then fails fast:
    // not after connect_wait (20 s), which is how long it waited before.
    let started = Instant::now();
    let status = call(&channel).unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "waited {:?}",
        started.elapsed()
    );
    assert_eq!(channel.connectivity(), Connectivity::TransientFailure);
    let started = Instant::now();
    let status = call(&channel).unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    assert!(
        status
            .message()
            .contains("none of the 2 endpoints is connected"),
        "{status}"
    );
    assert!(started.elapsed() < Duration::from_millis(50), "fails fast");

    // Waiting for ready: bounded by the deadline, and done as soon as one is back.
    let reconnect = ReconnectConfig {
        wait_for_ready: true,
        ..no_jitter()
    };
    let waiting = balanced(&servers, reconnect);
    let status = call_blocking(&waiting, Some(Duration::from_millis(100))).unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");
    let call = {
        let waiting = waiting.clone();
        std::thread::spawn(move || {
            let mut request = Request::new(());
            request.set_timeout(Duration::from_secs(5));
            block_on(waiting.unary::<(), ()>(1, request))
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    servers[1].down.store(false, Ordering::SeqCst);
    call.join()
        .unwrap()
        .expect("the waiting call goes once an endpoint connects");
}

#[test]
fn the_pick_queue_is_bounded_and_its_waits_end_at_the_deadline() {
    let servers = servers(1);
    servers[0].down.store(true, Ordering::SeqCst);
    let reconnect = ReconnectConfig {
        wait_for_ready: true,
        ..no_jitter()
    };
    let endpoint = healing(&servers[0], reconnect.clone());
    let config = ChannelConfig {
        balance_queue: 1,
        ..ChannelConfig::default()
    };
    let changes = futures::stream::iter([Ok::<_, Infallible>(Change::Insert(0, endpoint))]);
    let channel = Channel::balance(changes, &reconnect, config).unwrap();
    // Eight callers, one place in the queue: all wait, none beyond its deadline.
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let channel = channel.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                let status = call_blocking(&channel, Some(Duration::from_millis(100))).unwrap_err();
                (status, started.elapsed())
            })
        })
        .collect();
    for caller in callers {
        let (status, waited) = caller.join().unwrap();
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");
        assert!(waited < Duration::from_secs(2), "waited {waited:?}");
    }
    servers[0].down.store(false, Ordering::SeqCst);
    eventually("calls go once the endpoint is up", || {
        call_blocking(&channel, Some(Duration::from_millis(200))).is_ok()
    });
}
