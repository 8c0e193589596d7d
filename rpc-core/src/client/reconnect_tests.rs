//! A healing channel against a scripted server that can go down, come back, and kill
//! connections.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Context;
use std::time::{Duration, Instant};

use futures::executor::block_on;

use super::reconnect::ConnectWait;
use super::test_support::*;
use super::{Channel, ChannelConfig, Connectivity, ReconnectConfig, Source};
use crate::{Code, Request};

#[test]
fn connects_lazily_and_replaces_a_dead_connection() {
    let server = Arc::new(Server::default());
    let channel = healing(&server, no_jitter());
    assert_eq!(channel.connectivity(), Connectivity::Idle);
    assert_eq!(
        server.attempts(),
        0,
        "nothing happens before the first call"
    );

    call(&channel).expect("the first call connects");
    assert_eq!(channel.connectivity(), Connectivity::Ready);
    call_blocking(&channel, None).expect("a blocking call on the same connection");
    assert_eq!(server.attempts(), 1);

    server.kill();
    assert_eq!(channel.connectivity(), Connectivity::Idle);
    call(&channel).expect("the next call reconnects at once (no backoff after a success)");
    assert_eq!(server.attempts(), 2);
    server.kill();
    call_blocking(&channel, None).expect("a blocking call reconnects too");
    assert_eq!(server.attempts(), 3);
}

#[test]
fn calls_in_flight_on_a_dying_connection_fail_unavailable() {
    let server = Arc::new(Server::default());
    server.hold.store(true, Ordering::SeqCst);
    let channel = healing(&server, no_jitter());
    let pending = {
        let channel = channel.clone();
        std::thread::spawn(move || call_blocking(&channel, None))
    };
    eventually("the call is in flight", || channel.in_flight() == 1);
    server.kill();
    let status = pending.join().unwrap().unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    assert!(status.message().contains("reset"), "{status}");
}

#[test]
fn while_attempts_fail_calls_fail_fast_and_attempts_back_off() {
    let server = Arc::new(Server::default());
    server.down.store(true, Ordering::SeqCst);
    let channel = healing(&server, no_jitter());

    // The first call waits for the first attempt: nothing is known to be wrong yet.
    let status = call(&channel).unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    assert!(
        status.message().contains("refused"),
        "names the cause: {status}"
    );
    assert_eq!(channel.connectivity(), Connectivity::TransientFailure);

    // Then calls fail at once, without an attempt of their own.
    let attempts = server.attempts();
    for _ in 0..100 {
        let status = call_blocking(&channel, None).unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status}");
        assert!(status.message().contains("reconnecting"), "{status}");
    }
    assert!(
        server.attempts() <= attempts + 1,
        "calls do not start attempts"
    );

    eventually("five attempts", || server.attempts() >= 5);
    let gaps: Vec<Duration> = server
        .attempts
        .lock()
        .windows(2)
        .map(|w| w[1] - w[0])
        .collect();
    for (gap, expected) in gaps.iter().zip([20, 40, 80, 80]) {
        assert!(
            *gap >= Duration::from_millis(expected),
            "gaps {gaps:?} grow 20, 40, 80 ms and stay at the 80 ms cap"
        );
    }
    assert!(gaps[0] < gaps[2], "the delay grows: {gaps:?}");

    server.down.store(false, Ordering::SeqCst);
    eventually("connected again", || {
        channel.connectivity() == Connectivity::Ready
    });
    call(&channel).expect("calls go through once the server is back");
}

#[test]
fn wait_for_ready_calls_wait_until_their_deadline_or_the_connection() {
    let server = Arc::new(Server::default());
    server.down.store(true, Ordering::SeqCst);
    let reconnect = ReconnectConfig {
        wait_for_ready: true,
        connect_wait: Duration::from_millis(150),
        ..no_jitter()
    };
    let channel = healing(&server, reconnect);

    // A deadline bounds the wait, async (woken by the timer) and blocking alike.
    let mut request = Request::new(());
    request.set_timeout(Duration::from_millis(100));
    let started = Instant::now();
    let status = block_on(channel.unary::<(), ()>(1, request)).unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");
    assert!(
        status.message().contains("refused"),
        "names the cause: {status}"
    );
    assert!(started.elapsed() >= Duration::from_millis(100));
    let status = call_blocking(&channel, Some(Duration::from_millis(50))).unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");

    // Without a deadline, `connect_wait` bounds it.
    let started = Instant::now();
    let status = call_blocking(&channel, None).unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    assert!(status.message().contains("150ms"), "{status}");
    assert!(started.elapsed() >= Duration::from_millis(150));

    // A call waiting when the server comes back goes through.
    let waiting = {
        let channel = channel.clone();
        std::thread::spawn(move || call_blocking(&channel, Some(Duration::from_secs(10))))
    };
    std::thread::sleep(Duration::from_millis(30));
    server.down.store(false, Ordering::SeqCst);
    waiting
        .join()
        .unwrap()
        .expect("the waiting call went through");
}

#[test]
fn a_waiting_call_is_one_waiter_however_often_it_is_polled() {
    let server = Arc::new(Server::default());
    server.down.store(true, Ordering::SeqCst);
    let reconnect = ReconnectConfig {
        wait_for_ready: true,
        ..no_jitter()
    };
    let channel = healing(&server, reconnect);
    let Source::Healing(healing) = &channel.inner.source else {
        unreachable!()
    };
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut waits: Vec<ConnectWait> = (0..10).map(|_| ConnectWait::new(None, true)).collect();
    for _ in 0..1_000 {
        for wait in &mut waits {
            assert!(healing.poll_connection(&mut cx, wait).is_pending());
        }
    }
    assert_eq!(healing.waiters(), 10);
    waits.truncate(3);
    assert_eq!(healing.waiters(), 3, "a dropped wait leaves the waiters");
}

#[test]
fn dropping_the_channel_ends_its_helper_thread() {
    let server = Arc::new(Server::default());
    server.down.store(true, Ordering::SeqCst);
    let connector = Arc::new(ToServer(server.clone()));
    let channel = Channel::healing(
        connector.clone(),
        None,
        no_jitter(),
        ChannelConfig::default(),
    );
    call(&channel).unwrap_err();
    // The helper thread holds the connector until it ends.
    assert_eq!(
        Arc::strong_count(&connector),
        3,
        "ours, the channel's, its helper's"
    );
    drop(channel);
    eventually("the helper thread ended", || {
        Arc::strong_count(&connector) == 1
    });
    let attempts = server.attempts();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(server.attempts(), attempts, "no attempts after the drop");
}

#[test]
fn backoff_grows_to_its_cap_and_jitter_spreads_it() {
    let config = ReconnectConfig::default();
    let delays: Vec<u128> = (1..=12).map(|n| config.backoff(n).as_millis()).collect();
    assert_eq!(&delays[..4], &[100, 160, 256, 409]);
    assert_eq!(delays[11], 10_000, "capped by max_backoff");
    assert_eq!(config.backoff(u32::MAX), Duration::from_secs(10));

    let draws: Vec<Duration> = (0..1_000).map(|_| config.jittered_backoff(2)).collect();
    let (low, high) = (Duration::from_millis(128), Duration::from_millis(192));
    assert!(
        draws.iter().all(|d| (low..=high).contains(d)),
        "±20% of 160 ms"
    );
    assert!(draws.iter().any(|d| *d < Duration::from_millis(150)));
    assert!(draws.iter().any(|d| *d > Duration::from_millis(170)));
}

#[test]
fn a_server_that_drops_every_connection_at_once_gets_backoff_not_a_storm() {
    let server = Arc::new(Server::default());
    server.drops.store(true, Ordering::SeqCst);
    let reconnect = ReconnectConfig {
        min_connected: Duration::from_secs(10),
        ..no_jitter()
    };
    let channel = healing(&server, reconnect);
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(300) {
        let _ = call(&channel);
    }
    // Immediate attempts would number in the thousands; with 20, 40, 80, 80... ms between
    // them there is room for at most 7 in 300 ms.
    let attempts = server.attempts();
    assert!((2..=7).contains(&attempts), "{attempts} attempts in 300 ms");
    let status = call(&channel).unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    assert!(status.message().contains("died as soon as"), "{status}");
}

#[test]
fn a_panicking_connector_is_a_failed_attempt() {
    let server = Arc::new(Server::default());
    server.panics.store(true, Ordering::SeqCst);
    let channel = healing(&server, no_jitter());
    let status = call(&channel).unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    assert!(status.message().contains("panicked"), "{status}");
    server.panics.store(false, Ordering::SeqCst);
    eventually("connected after the panics", || {
        channel.connectivity() == Connectivity::Ready
    });
    call(&channel).expect("the helper thread survived its connector's panic");
}

#[test]
fn any_settings_give_a_delay() {
    let odd = [
        (
            f64::NAN,
            f64::NAN,
            Duration::from_secs(1),
            Duration::from_secs(5),
        ),
        (f64::INFINITY, 2.0, Duration::from_secs(1), Duration::MAX),
        (1e300, -1.0, Duration::MAX, Duration::MAX),
        (0.5, 7.0, Duration::ZERO, Duration::from_millis(1)),
    ];
    for (multiplier, jitter, initial_backoff, max_backoff) in odd {
        let config = ReconnectConfig {
            initial_backoff,
            max_backoff,
            multiplier,
            jitter,
            ..ReconnectConfig::default()
        };
        for failures in [0, 1, 2, 30, u32::MAX] {
            let delay = config.jittered_backoff(failures);
            assert!(delay <= Duration::from_secs(2 * 24 * 3600), "{delay:?}");
        }
    }
}
