//! A channel over several endpoints: tower's power-of-two-choices balancer
//! ([`tower::balance::p2c`]) over a [`Discover`](tower::discover::Discover) stream of
//! endpoint channels that may change at run time.
//!
//! Each call (unary or streaming) asks the balancer for an endpoint: of two endpoints drawn
//! at random among those connected, the one with fewer calls in flight. An endpoint whose
//! connection died is not ready: it reconnects as a healing channel does (backoff, jitter)
//! and takes calls again once connected, so calls go around a dead server. The balancer
//! runs on one helper thread per balanced channel (tower's [`Buffer`] worker), which ends
//! when the channel is dropped; callers wait for its pick on any executor.
//!
//! While no endpoint is connected, a call waits for one until its deadline (or
//! [`ReconnectConfig::connect_wait`]), unless every known endpoint is failing to connect
//! and the channel does not [wait for ready](ReconnectConfig::wait_for_ready): then it
//! fails fast, `UNAVAILABLE`. At most [`ChannelConfig::balance_queue`] calls wait for a
//! pick at once; more wait for room, within the same limit.

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use parking_lot::Mutex;
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::Change;
use tower::load::Load;
use tower::{BoxError, Service, ServiceExt};

use super::{Channel, ChannelConfig, Connectivity, ReconnectConfig, Source};
use crate::timer::WakeAt;
use crate::Status;

/// How often a call waiting for a connected endpoint looks whether every endpoint is
/// failing (then it fails fast, unless the channel waits for ready).
const FAIL_FAST_CHECK: Duration = Duration::from_millis(10);

/// Default of [`ChannelConfig::balance_queue`].
pub const DEFAULT_BALANCE_QUEUE: usize = 1024;

/// What a call asks the balancer for: an endpoint to call over.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pick;

type PickFuture =
    futures::future::MapErr<std::future::Ready<Result<Channel, Status>>, fn(Status) -> BoxError>;

/// The balancer's side of a balanced channel.
pub(crate) struct Balanced {
    picker: Buffer<Pick, PickFuture>,
    /// The endpoints the balancer knows, for connectivity, fail-fast and in-flight counts.
    endpoints: Arc<Mutex<Vec<Channel>>>,
    wait_for_ready: bool,
    connect_wait: Duration,
}

impl Balanced {
    /// The endpoint a call made now goes over, once the balancer picks one.
    pub(crate) async fn pick(&self, deadline: Option<Instant>) -> Result<Channel, Status> {
        let limit = deadline.or_else(|| Instant::now().checked_add(self.connect_wait));
        let mut picker = self.picker.clone();
        let mut picked = std::pin::pin!(async move { picker.ready().await?.call(Pick).await });
        let mut wake = WakeAt::default();
        let mut check_at: Option<Instant> = None;
        poll_fn(|cx| {
            if let Poll::Ready(picked) = picked.as_mut().poll(cx) {
                return Poll::Ready(picked.map_err(|error| {
                    Status::unavailable(format!("the balancer failed: {error}"))
                }));
            }
            let now = Instant::now();
            if limit.is_some_and(|at| now >= at) {
                return Poll::Ready(Err(match deadline {
                    Some(_) => Status::deadline_exceeded(
                        "deadline exceeded waiting for a connected endpoint",
                    ),
                    None => Status::unavailable(format!(
                        "no endpoint connected within {:?}",
                        self.connect_wait
                    )),
                }));
            }
            // The endpoints' attempts do not wake this wait: it looks whether all of them
            // are failing once it has waited FAIL_FAST_CHECK, and again every
            // FAIL_FAST_CHECK after (a pick that comes at once, the common case, looks at no
            // endpoint).
            let check = check_at.get_or_insert(now + FAIL_FAST_CHECK);
            if now >= *check {
                if !self.wait_for_ready {
                    if let Some(status) = self.failing() {
                        return Poll::Ready(Err(status));
                    }
                }
                *check = now + FAIL_FAST_CHECK;
            }
            let next = *check;
            wake.arm(limit.map_or(next, |at| at.min(next)), cx);
            Poll::Pending
        })
        .await
    }

    /// The fail-fast status when every known endpoint is failing to connect.
    fn failing(&self) -> Option<Status> {
        let endpoints = self.endpoints.lock();
        if endpoints.is_empty() {
            // Discovery may not have reported any yet: wait for it.
            return None;
        }
        let all_failing = endpoints.iter().all(|endpoint| {
            matches!(
                endpoint.connectivity(),
                Connectivity::TransientFailure | Connectivity::Shutdown
            )
        });
        all_failing.then(|| {
            let targets: Vec<&str> = endpoints.iter().map(Channel::peer).collect();
            Status::unavailable(format!(
                "none of the {} endpoints is connected, all are failing to connect: {}",
                endpoints.len(),
                targets.join(", ")
            ))
        })
    }

    /// The best state among the endpoints (`Idle` with none).
    pub(crate) fn connectivity(&self) -> Connectivity {
        use Connectivity::*;
        let rank = |c: &Connectivity| match c {
            Ready => 4,
            Connecting => 3,
            Idle => 2,
            TransientFailure => 1,
            Shutdown => 0,
        };
        let endpoints = self.endpoints.lock();
        endpoints
            .iter()
            .map(Channel::connectivity)
            .max_by_key(rank)
            .unwrap_or(Idle)
    }

    /// Calls in flight over all endpoints.
    pub(crate) fn in_flight(&self) -> usize {
        self.endpoints.lock().iter().map(Channel::in_flight).sum()
    }
}

impl Channel {
    /// A channel that balances its calls over the endpoint channels `discover` yields
    /// (`Change::Insert(key, channel)`, `Change::Remove(key)`; usually healing channels,
    /// made lazily), with tower's power-of-two-choices on calls in flight; see
    /// [the module](crate::client::balance). `reconnect` says whether calls wait for a
    /// connected endpoint or fail fast while all are failing; `config` applies to every
    /// call made on the returned channel. An error from `discover` stops the balancer:
    /// later calls fail `UNAVAILABLE`.
    ///
    /// # Errors
    ///
    /// `UNAVAILABLE` if no thread can be had for the balancer.
    pub fn balance<D, K, E>(
        discover: D,
        reconnect: &ReconnectConfig,
        config: ChannelConfig,
    ) -> Result<Channel, Status>
    where
        D: Stream<Item = Result<Change<K, Channel>, E>> + Send + 'static,
        K: Hash + Eq + Clone + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let endpoints = Arc::new(Mutex::new(Vec::new()));
        let discover = Endpoints {
            discover: Box::pin(discover),
            known: HashMap::new(),
            shared: endpoints.clone(),
        };
        let (picker, worker) = Buffer::pair(Balance::new(discover), config.balance_queue.max(1));
        std::thread::Builder::new()
            .name("rpc-balance".into())
            .spawn(move || futures::executor::block_on(worker))
            .map_err(|e| Status::unavailable(format!("no thread for the balancer: {e}")))?;
        let balanced = Balanced {
            picker,
            endpoints,
            wait_for_ready: reconnect.wait_for_ready,
            connect_wait: reconnect.connect_wait,
        };
        Ok(Channel::with_source(
            Source::Balanced(Box::new(balanced)),
            config,
        ))
    }
}

/// What discovery reports: endpoint channels added and removed.
type Changes<K, E> = Pin<Box<dyn Stream<Item = Result<Change<K, Channel>, E>> + Send>>;

/// The discovered endpoints as the balancer sees them, recorded for the channel.
struct Endpoints<K, E> {
    discover: Changes<K, E>,
    known: HashMap<K, Channel>,
    shared: Arc<Mutex<Vec<Channel>>>,
}

// Nothing in it is ever pinned in place (the stream it wraps is boxed).
impl<K, E> Unpin for Endpoints<K, E> {}

impl<K: Hash + Eq + Clone, E: Into<BoxError>> Stream for Endpoints<K, E> {
    type Item = Result<Change<K, Endpoint>, BoxError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let change = match this.discover.as_mut().poll_next(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error.into()))),
            Poll::Ready(Some(Ok(change))) => change,
        };
        let change = match change {
            Change::Insert(key, channel) => {
                this.known.insert(key.clone(), channel.clone());
                Change::Insert(key, Endpoint::new(channel))
            }
            Change::Remove(key) => {
                this.known.remove(&key);
                Change::Remove(key)
            }
        };
        *this.shared.lock() = this.known.values().cloned().collect();
        Poll::Ready(Some(Ok(change)))
    }
}

/// One endpoint in the balancer: ready while its channel is connected, loaded by the calls
/// in flight on it.
struct Endpoint {
    channel: Channel,
    /// Its place among the channel's waiters while it connects.
    waiter: Option<u64>,
}

impl Endpoint {
    fn new(channel: Channel) -> Endpoint {
        Endpoint {
            channel,
            waiter: None,
        }
    }
}

impl Service<Pick> for Endpoint {
    type Response = Channel;
    type Error = Status;
    type Future = std::future::Ready<Result<Channel, Status>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        match &self.channel.inner.source {
            Source::Healing(healing) => healing.poll_ready(cx, &mut self.waiter),
            Source::Fixed(conn) if conn.is_closed() => Poll::Ready(Err(Status::unavailable(
                format!("the connection to {} is closed", conn.peer()),
            ))),
            // A balanced endpoint picks its own.
            Source::Fixed(_) | Source::Balanced(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, _: Pick) -> Self::Future {
        std::future::ready(Ok(self.channel.clone()))
    }
}

impl Load for Endpoint {
    type Metric = usize;

    fn load(&self) -> usize {
        self.channel.in_flight()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let (Some(key), Source::Healing(healing)) = (self.waiter, &self.channel.inner.source) {
            healing.forget_waiter(key);
        }
    }
}
