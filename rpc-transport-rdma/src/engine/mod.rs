//! The completion engine: what every RDMA connection of the process on one device, with one
//! poll mode and one [`Role`], shares.
//!
//! Client and server connections never share an engine: a blocking client call drives its
//! CQ on its own thread, and must not find itself running server handlers inline there.
//!
//! * One protection domain, which every engine on the device shares (so the application's
//!   buffers are registered once per device, not once per engine). Memory windows are
//!   type 2 and bind to one queue pair, so a grant still reaches only the peer it was made
//!   for.
//! * One completion channel and a few completion queues, each shared by many queue pairs
//!   and each on the next of the device's completion vectors.
//!   A connection reserves CQ entries for its whole send and receive queues on a CQ with
//!   room for them ([`Engine::attach`]), so no CQ can overflow; a full set of CQs grows by
//!   one.
//! * A [`Registry`] that routes each completion to its connection by the tag in its
//!   `wr_id` (a shared receive queue's receives: by the `qp_num` that received).
//! * Shared receive queues ([`Rings::recv`](crate::Rings::recv)), one per slot size and bounds,
//!   which its connections receive into ([`SharedRecv`]).
//! * One poller thread ([`poller`]) that processes every connection's completions when no
//!   caller does (a blocking caller spinning on its thread, an async caller holding a CQ's
//!   drive lease, see [`lease`]), and watches the rdma_cm channels of client connections. It is
//!   started with the engine's first connection and ends with its last, so a process
//!   without RDMA connections runs no poller, and an idle one (event or adaptive mode)
//!   sleeps in `epoll_wait`.
//!
//! Who processes a CQ's completions: whoever holds its poll lock ([`SharedCq`]); the
//! others see [`Polled::Busy`] and go on. A connection's completions are processed under
//! the CQ's poll lock and then its own protocol lock, so they are processed in CQ order;
//! frames are handed to the upper layer after both locks are dropped.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use rpc_core::Status;
use smallvec::SmallVec;

use crate::config::{PollMode, RdmaConfig};
use crate::conn::{Conn, Processed};
use crate::kick::Kick;
use crate::protocol::WorkId;
use crate::resources::verbs_status;
use crate::shared_recv::SharedRecv;
use crate::verbs::{CompletionChannel, CompletionQueue, Context, ProtectionDomain, WorkCompletion};

mod async_events;
mod attachment;
mod callers;
mod epoll;
mod lease;
mod poller;
mod registry;
mod shared_cq;
mod srqs;

pub(crate) use attachment::Attachment;

use callers::Callers;
use epoll::Epoll;
use registry::{Registry, Route, MAX_EARLY};
pub(crate) use shared_cq::SharedCq;

/// Completions taken from a CQ per poll.
const POLL_BATCH: usize = 32;
/// Epoll tokens of the engine's own fds; client rdma_cm channels use their connection tag.
const TOKEN_COMPLETIONS: u64 = u64::MAX;
const TOKEN_KICK: u64 = u64::MAX - 1;
const TOKEN_ASYNC: u64 = u64::MAX - 2;
/// Empty polls between two looks at the clock while spinning.
pub(crate) const CLOCK_EVERY: u32 = 1024;

/// Empty polls between two yields of the CPU while spinning...
const YIELD_EVERY: u32 = 128;
/// ...once this many went by without a completion. A yield is a system call (about 2 µs
/// under emulation) that a frame arriving meanwhile waits for, and a connection that
/// receives now and then (a ping-pong) would pay it on most frames; one that went quiet
/// for this long gives the CPU away.
const YIELD_AFTER: u32 = 4 * CLOCK_EVERY;

/// Whether a thread spinning on CQs (the poller, an async caller holding a drive lease)
/// gives the CPU away after `idle` empty looks: spinning must not starve the threads our
/// completions wake (an async runtime, a handler) or the kernel's own work (soft-RoCE runs
/// in softirqs) when cores are scarce.
fn should_yield(idle: u32) -> bool {
    idle >= YIELD_AFTER && idle.is_multiple_of(YIELD_EVERY)
}

/// Which side of its connections an engine serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Client,
    Server,
}

/// Engines of the process, one per (device context, poll mode, role).
static ENGINES: Mutex<Vec<Arc<Engine>>> = Mutex::new(Vec::new());

/// Most gather entries a send work request may have: a large body's WRITE gathers the runs
/// of application memory it sends in place and the copied bytes between them.
pub(crate) const SEND_SGES: u32 = 15;

/// The process's engines now.
pub(crate) fn engines() -> Vec<Arc<Engine>> {
    ENGINES.lock().clone()
}

/// What one look at a completion queue found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Polled {
    /// Completions were processed.
    Some,
    /// The queue was empty.
    Empty,
    /// Another thread is polling it right now.
    Busy,
}

/// Shared by the connections of one device and poll mode; see the module documentation.
pub(crate) struct Engine {
    context: Arc<Context>,
    mode: PollMode,
    /// `Polling::event_linger`.
    event_linger: u32,
    role: Role,
    pub(crate) pd: Arc<ProtectionDomain>,
    channel: Arc<CompletionChannel>,
    /// Entries per CQ (the device's limit permitting).
    cq_entries: u32,
    /// Gather entries per send work request its queue pairs are made with: up to
    /// [`SEND_SGES`], the device's limit permitting.
    pub(crate) max_send_sge: u32,
    /// The device's limit of receives per shared receive queue.
    max_srq_wr: u32,
    /// Shared receive queues, one per buffer size and bounds, created with their first
    /// connection.
    srqs: Mutex<Vec<Arc<SharedRecv>>>,
    /// `srqs` is not empty: completions may need routing by `qp_num`.
    has_srq: AtomicBool,
    cqs: RwLock<Arc<[Arc<SharedCq>]>>,
    /// Bumped whenever `cqs` changes, so the poller re-reads it only then.
    cqs_epoch: AtomicU64,
    registry: Registry,
    epoll: Epoll,
    kick: Kick,
    /// Connections attached; the poller leaves when it drops to 0 (under `ENGINES`).
    attached: AtomicUsize,
    retired: AtomicBool,
    /// Blocking callers polling a CQ themselves, and async lease holders.
    callers: Callers,
    /// Batches of completions processed, by anyone.
    completions_seen: AtomicU64,
    /// The poller sleeps without arming the CQs because blocking callers drive them.
    poller_unarmed: AtomicBool,
    /// Connections with work for the poller: a report or close that a thread inside the
    /// upper layer could not make itself.
    attention: Mutex<Vec<Weak<Conn>>>,
    has_attention: AtomicBool,
    /// Connections whose async senders wait for room (see `Conn::check_stall`).
    stalls: Mutex<Vec<Weak<Conn>>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("device", &self.context.name())
            .field("mode", &self.mode)
            .field("role", &self.role)
            .field("attached", &self.attached.load(Ordering::Relaxed))
            .finish()
    }
}

impl Engine {
    /// Attaches a new connection on `context` to the engine of its poll mode and role
    /// (created, with its poller, if there is none), reserving `entries` CQ entries for its
    /// queue pair.
    pub(crate) fn attach(
        context: &Arc<Context>,
        config: &RdmaConfig,
        role: Role,
        entries: u32,
    ) -> Result<Attachment, Status> {
        let mut created = false;
        let engine = {
            let mut engines = ENGINES.lock();
            let found = engines.iter().find(|e| {
                e.context.is_same(context)
                    && e.mode == config.polling.mode
                    && (!e.mode.sleeps_at_once() || e.event_linger == config.polling.event_linger)
                    && e.role == role
                    && !e.retired.load(Ordering::Acquire)
            });
            let engine = match found {
                Some(engine) => engine.clone(),
                None => {
                    // One protection domain per device context, whatever the engine: the
                    // application's buffers are registered (and pinned) once for all of
                    // them, and a body that arrived on one role's connection goes on from
                    // where it lies over the other's. Remote access is only ever through
                    // a window bound to one queue pair, so sharing it opens nothing.
                    let pd = engines
                        .iter()
                        .find(|e| e.context.is_same(context))
                        .map(|e| e.pd.clone());
                    let engine = Engine::new(context, pd, config, role)?;
                    poller::spawn(engine.clone()).map_err(|e| {
                        Status::internal(format!("cannot start the RDMA poller thread: {e}"))
                    })?;
                    engines.push(engine.clone());
                    created = true;
                    engine
                }
            };
            // Under the lock the poller retires under: it cannot leave now.
            engine.attached.fetch_add(1, Ordering::AcqRel);
            engine
        };
        if created {
            // The application's buffers, registered with the new device (outside the lock:
            // registering is slow, and other connections' set-ups need it).
            crate::app_memory::register_all(&engine);
        }
        // From here on, dropping the attachment undoes the count.
        let mut attachment = Attachment {
            cq: engine.place(entries).inspect_err(|_| {
                engine.attached.fetch_sub(1, Ordering::AcqRel);
                engine.kick.kick();
            })?,
            tag: 0,
            entries,
            cm_fd: AtomicI32::new(-1),
            qp_num: std::sync::OnceLock::new(),
            engine,
        };
        attachment.tag = attachment.engine.registry.reserve().ok_or_else(|| {
            Status::resource_exhausted("this process used up its RDMA connection tags")
        })?;
        Ok(attachment)
    }

    /// An engine on `context`, in the protection domain `pd` (a new one if `None`).
    fn new(
        context: &Arc<Context>,
        pd: Option<Arc<ProtectionDomain>>,
        config: &RdmaConfig,
        role: Role,
    ) -> Result<Arc<Engine>, Status> {
        let pd = match pd {
            Some(pd) => pd,
            None => ProtectionDomain::new(context).map_err(|e| verbs_status("ibv_alloc_pd", e))?,
        };
        let channel = CompletionChannel::new(context)
            .map_err(|e| verbs_status("ibv_create_comp_channel", e))?;
        channel
            .set_nonblocking(true)
            .map_err(|e| verbs_status("completion channel", e))?;
        let device = context
            .query_device()
            .map_err(|e| verbs_status("ibv_query_device", e))?;
        let epoll = Epoll::new()?;
        let kick = Kick::new()?;
        epoll.add(channel.fd(), TOKEN_COMPLETIONS)?;
        epoll.add(kick.fd(), TOKEN_KICK)?;
        // Every engine of the context watches its events; whichever reads one routes it.
        context
            .set_async_nonblocking(true)
            .map_err(|e| verbs_status("the device's asynchronous event fd", e))?;
        epoll.add(context.async_fd(), TOKEN_ASYNC)?;
        Ok(Arc::new(Engine {
            context: context.clone(),
            mode: config.polling.mode,
            event_linger: config.polling.event_linger,
            role,
            pd,
            channel,
            cq_entries: config.polling.cq_entries.min(device.max_cqe).max(1),
            max_send_sge: SEND_SGES.min(device.max_sge).max(1),
            max_srq_wr: device.max_srq_wr,
            srqs: Mutex::new(Vec::new()),
            has_srq: AtomicBool::new(false),
            cqs: RwLock::new(Arc::from(Vec::new())),
            cqs_epoch: AtomicU64::new(0),
            registry: Registry::default(),
            epoll,
            kick,
            attached: AtomicUsize::new(0),
            retired: AtomicBool::new(false),
            callers: Callers::default(),
            completions_seen: AtomicU64::new(0),
            poller_unarmed: AtomicBool::new(false),
            attention: Mutex::new(Vec::new()),
            has_attention: AtomicBool::new(false),
            stalls: Mutex::new(Vec::new()),
        }))
    }

    /// A CQ with room for `entries` more, reserved; a new CQ if none has room.
    fn place(&self, entries: u32) -> Result<Arc<SharedCq>, Status> {
        let mut cqs = self.cqs.write();
        for cq in cqs.iter().filter(|cq| !cq.failed.load(Ordering::Acquire)) {
            let mut reserved = cq.reserved.lock();
            if cq.cq.capacity().saturating_sub(*reserved) >= entries {
                *reserved += entries;
                return Ok(cq.clone());
            }
        }
        let size = self.cq_entries.max(entries);
        // Spread over the device's completion vectors, so many CQs do not share one
        // interrupt line.
        let index = cqs.len() as u32;
        let vector = index % self.context.num_comp_vectors();
        let cq = CompletionQueue::with_vector(
            &self.context,
            size,
            Some(&self.channel),
            u64::from(index),
            vector,
        )
        .map_err(|e| verbs_status("ibv_create_cq", e))?;
        if cq.capacity() < entries {
            return Err(Status::resource_exhausted(format!(
                "a connection needs {entries} completion queue entries; the device gives {}",
                cq.capacity()
            )));
        }
        let shared = Arc::new(SharedCq {
            cq,
            reserved: Mutex::new(entries),
            completions: Mutex::new(WorkCompletion::array(POLL_BATCH)),
            spinners: AtomicUsize::new(0),
            lease: lease::Lease::default(),
            failed: AtomicBool::new(false),
            released: AtomicU32::new(0),
        });
        let mut grown = cqs.to_vec();
        grown.push(shared.clone());
        *cqs = Arc::from(grown);
        self.cqs_epoch.fetch_add(1, Ordering::AcqRel);
        // A sleeping poller armed only the CQs it knew: it must arm this one before its
        // first completion, or that completion waits out the poller's whole sleep.
        self.kick.kick();
        Ok(shared)
    }

    /// The CQs, and the epoch they were read at.
    fn cqs(&self) -> (u64, Arc<[Arc<SharedCq>]>) {
        let epoch = self.cqs_epoch.load(Ordering::Acquire);
        (epoch, self.cqs.read().clone())
    }

    /// Polls `cq` once, if no other thread is, and processes what it found: each
    /// completion goes to its connection; received frames are handed up after the locks.
    pub(crate) fn poll(&self, cq: &SharedCq) -> Polled {
        if cq.failed.load(Ordering::Acquire) {
            return Polled::Empty;
        }
        let Some(mut buffer) = cq.completions.try_lock() else {
            return Polled::Busy;
        };
        let polled = match cq.cq.poll(&mut buffer) {
            Ok(polled) => polled,
            Err(e) => {
                // A CQ that cannot be polled serves nobody: fail its connections loudly,
                // once, and never poll it again.
                drop(buffer);
                self.fail_cq(cq, verbs_status("ibv_poll_cq", e));
                return Polled::Empty;
            }
        };
        if polled.is_empty() {
            cq.drained();
            drop(buffer);
            // Nothing arrived: idle time, in which work that waited costs no one.
            self.run_attention();
            return Polled::Empty;
        }
        self.completions_seen.fetch_add(1, Ordering::AcqRel);
        // Runs of completions of one connection, processed in CQ order under its lock.
        let mut runs: SmallVec<[Processed; 2]> = SmallVec::new();
        let shared_recv = self.has_srq.load(Ordering::Relaxed);
        for (range, route) in self.registry.route_batch(polled, shared_recv, tag_of) {
            let run = &polled[range];
            match route {
                Route::Conn(conn) => runs.push(conn.process(run)),
                Route::Held => {}
                Route::Srq(srq) => srq.reclaim(run),
                Route::Gone => {
                    tracing::trace!(n = run.len(), "completions of a closed connection");
                }
            }
        }
        drop(buffer);
        // One hand-up panicking drops the rest, which give back what they hold.
        for processed in runs {
            processed.hand_up();
        }
        Polled::Some
    }

    /// `cq` serves nobody any more: fails its connections loudly, once, and never polls it
    /// again.
    fn fail_cq(&self, cq: &SharedCq, status: Status) {
        if !cq.failed.swap(true, Ordering::AcqRel) {
            tracing::error!(%status, "closing the connections on a failed CQ");
            for conn in self.registry.live() {
                if conn.uses_cq(cq) {
                    conn.close(status.clone());
                }
            }
        }
    }

    /// Registers a connection created on `attachment`; processes the completions that
    /// arrived for it before.
    pub(crate) fn register(attachment: &Attachment, conn: &Arc<Conn>) -> Result<(), Status> {
        // Under the CQ's poll lock, which every routing happens under: the early
        // completions are processed before anything polled later.
        let lock = attachment.cq.completions.lock();
        let early = attachment.engine.registry.register(attachment.tag, conn);
        let processed = early
            .as_deref()
            .map(|early| Arc::clone(conn).process(early));
        drop(lock);
        let Some(processed) = processed else {
            return Err(Status::unavailable(format!(
                "more than {MAX_EARLY} completions arrived before the connection was set up"
            )));
        };
        processed.hand_up();
        Ok(())
    }

    /// `conn` has work for the poller (see `attention`).
    pub(crate) fn call_attention(&self, conn: &Weak<Conn>) {
        self.attention.lock().push(conn.clone());
        self.has_attention.store(true, Ordering::Release);
    }

    /// Wakes the poller so it does the work handed to it now rather than at its next look.
    pub(crate) fn wake_poller(&self) {
        self.kick.kick();
    }

    /// An async call is about to wait: the poller must watch the CQs.
    pub(crate) fn wake_if_unarmed(&self) {
        if self.poller_unarmed.load(Ordering::Acquire) {
            self.kick.kick();
        }
    }

    /// The poller watches `conn`, whose async senders wait for room, for a stall.
    pub(crate) fn watch_stall(&self, conn: &Weak<Conn>) {
        self.stalls.lock().push(conn.clone());
    }

    /// Closes the connections whose async senders waited for room past their stall limit.
    fn check_stalls(&self) {
        let watched = std::mem::take(&mut *self.stalls.lock());
        if watched.is_empty() {
            return;
        }
        let still: Vec<Weak<Conn>> = watched
            .into_iter()
            .filter(|weak| weak.upgrade().is_some_and(|conn| conn.check_stall()))
            .collect();
        self.stalls.lock().extend(still);
    }

    /// Ticks every connection's keepalive (`elapsed` since the last tick).
    fn keepalive_tick(&self, elapsed: Duration) {
        for conn in self.registry.live() {
            conn.keepalive_tick(elapsed);
        }
    }

    /// A client connection's rdma_cm channel is readable.
    fn cm_ready(&self, token: u64) {
        let conn = u32::try_from(token)
            .ok()
            .and_then(|tag| self.registry.get(tag));
        if let Some(conn) = conn {
            conn.check_cm();
        }
    }

    fn run_attention(&self) {
        if !(self.has_attention.load(Ordering::Acquire)
            && self.has_attention.swap(false, Ordering::AcqRel))
        {
            return;
        }
        // Drained, not taken: the list keeps its capacity, so asking for attention
        // allocates nothing.
        let conns: SmallVec<[Weak<Conn>; 4]> = self.attention.lock().drain(..).collect();
        for conn in conns.iter().filter_map(Weak::upgrade) {
            conn.attend();
        }
    }

    /// Spins on `cq` for up to `budget` (`None`: until something arrives) on the caller's
    /// thread: the run-to-completion path of blocking calls. True once anything was
    /// received, by this thread or another. Reads no clock unless the wait is long.
    pub(crate) fn spin(
        &self,
        cq: &SharedCq,
        budget: Option<Duration>,
        closed: impl Fn() -> bool,
    ) -> bool {
        /// Keeps the counts right even if a handler panics inside `poll`.
        struct Polling<'a>(&'a Callers, &'a AtomicUsize);
        impl Drop for Polling<'_> {
            fn drop(&mut self) {
                self.0.leave();
                self.1.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.callers.enter();
        cq.spinners.fetch_add(1, Ordering::AcqRel);
        let polling = Polling(&self.callers, &cq.spinners);
        let seen = self.completions_seen.load(Ordering::Acquire);
        let mut started: Option<Instant> = None;
        let mut spins: u32 = 0;
        let progressed = loop {
            if self.poll(cq) == Polled::Some
                || self.completions_seen.load(Ordering::Acquire) != seen
            {
                break true;
            }
            spins = spins.wrapping_add(1);
            // Clock reads are not free everywhere (an emulated HPET costs microseconds):
            // look at the time only now and then, and only once the wait is not short.
            if spins.is_multiple_of(CLOCK_EVERY) {
                if closed() {
                    break false;
                }
                if let Some(budget) = budget {
                    if started.get_or_insert_with(Instant::now).elapsed() >= budget {
                        break false;
                    }
                }
            }
            std::hint::spin_loop();
        };
        if progressed {
            self.callers.progressed();
        }
        drop(polling);
        if !progressed {
            // The caller is about to park: the poller must take over the CQs.
            self.kick.kick();
        }
        progressed
    }

    /// Whether it left the process's engines.
    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Leaves the process's engines if no connection is attached; true if it did.
    fn retire_if_unused(&self) -> bool {
        if self.attached.load(Ordering::Acquire) != 0 {
            return false;
        }
        let mut engines = ENGINES.lock();
        if self.attached.load(Ordering::Acquire) != 0 {
            return false;
        }
        self.retired.store(true, Ordering::Release);
        engines.retain(|e| !std::ptr::eq(Arc::as_ptr(e), self));
        let pd_in_use = engines.iter().any(|e| Arc::ptr_eq(&e.pd, &self.pd));
        drop(engines);
        // The last engine of a protection domain takes it along: the application's buffers
        // let go of their registrations with it. (An engine made later on the device gets
        // a new one, and registers them again.)
        if !pd_in_use {
            crate::app_memory::unregister_all(&self.pd);
        }
        true
    }
}

/// The tag in a completion's `wr_id`, and whether it is a receive's.
fn tag_of(wc: &WorkCompletion) -> (u32, bool) {
    WorkId::from_wr_id(wc.wr_id()).map_or((0, false), |(tag, work)| {
        (tag, matches!(work, WorkId::Recv(_)))
    })
}
