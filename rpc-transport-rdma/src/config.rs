//! Settings of RDMA connections.

use std::time::Duration;

use rpc_core::auth::Credentials;

use crate::engine::Role;

/// How a connection's completions are processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// Spin on the completion queue without ever sleeping: lowest latency, one busy core per
    /// connection. For benchmarks and dedicated machines.
    Busy,
    /// Arm the completion queue and sleep on its completion channel: an idle connection costs
    /// no CPU, every message pays a wake-up.
    Event,
    /// Spin for `spin` after the last completion, then sleep as in [`PollMode::Event`]. A
    /// blocking call spins on its own completions for up to `spin` before parking.
    Adaptive {
        /// How long to keep spinning after activity.
        spin: Duration,
    },
}

impl PollMode {
    /// How long to spin before sleeping; `None` for forever.
    pub(crate) fn spin(self) -> Option<Duration> {
        match self {
            PollMode::Busy => None,
            PollMode::Event => Some(Duration::ZERO),
            PollMode::Adaptive { spin } => Some(spin),
        }
    }
}

impl Default for PollMode {
    fn default() -> Self {
        PollMode::Adaptive {
            spin: Duration::from_millis(1),
        }
    }
}

/// The send slots a connection registers at first, unless [`RdmaConfig::send_window`] says
/// otherwise: enough for calls one at a time; concurrency doubles the ring as needed.
pub const DEFAULT_SEND_WINDOW: u32 = 2;

/// How long a connection may be idle before it is probed, unless [`RdmaConfig::keepalive`]
/// says otherwise (the same for every transport). A thousand idle connections cost about 70
/// probes a second.
pub use rpc_core::transport::DEFAULT_KEEPALIVE;
use rpc_core::transport::{DEFAULT_KEEPALIVE_TIMEOUT, DEFAULT_STALL_LIMIT};

/// The initial receive window of a connection on a shared receive queue, unless
/// [`RdmaConfig::recv_window`] says otherwise: what every connection commits however idle
/// (a busy one has it doubled while the queue has buffers to spare).
pub const DEFAULT_SHARED_WINDOW: u32 = 4;

/// Where a connection's receives land ([`RdmaConfig::recv`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Receives {
    /// Server connections receive from a shared receive queue with the default bounds,
    /// client connections into a ring of their own: a server's memory follows the windows
    /// its connections use, not their number; a client, with a connection or a few, keeps
    /// the ring's slightly shorter path.
    #[default]
    Auto,
    /// Each connection registers and posts a ring of `slots` receive slots.
    Ring,
    /// Connections receive from one shared receive queue per device and slot size, with
    /// these bounds.
    Shared(SharedRecvConfig),
}

/// Bounds of a shared receive queue ([`Receives::Shared`]). Past them a connection
/// is refused (`RESOURCE_EXHAUSTED` naming the numbers), and grown windows give back
/// released slots until the queue has room again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedRecvConfig {
    /// Buffers registered and posted at a time, as connections need them.
    pub chunk: u32,
    /// Most buffers the queue holds (the device's `max_srq_wr` permitting).
    pub max_buffers: u32,
    /// Posted buffers never committed to a window: they absorb the frames a peer sends
    /// beyond its credits until its connection is closed, so honest peers see no RNR.
    pub slack: u32,
}

impl Default for SharedRecvConfig {
    fn default() -> Self {
        let pool = crate::protocol::PoolConfig::default();
        SharedRecvConfig {
            chunk: pool.chunk,
            max_buffers: pool.max_buffers,
            slack: pool.slack,
        }
    }
}

/// Ring geometry and behaviour of RDMA connections.
///
/// ```
/// use rpc_transport_rdma::{PollMode, RdmaConfig};
/// let config = RdmaConfig {
///     slots: 32,
///     slot_size: 16 * 1024,
///     poll_mode: PollMode::Busy,
///     ..RdmaConfig::default()
/// };
/// assert!(config.max_inline_payload() < 16 * 1024);
/// ```
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    /// Slots in each of the send and receive rings (one credit per receive slot).
    pub slots: u32,
    /// Bytes per ring slot: the largest frame (64-byte header, metadata, message) sent by
    /// SEND. The peer's receive slot size caps what we send.
    pub slot_size: u32,
    /// Completion processing.
    pub poll_mode: PollMode,
    /// `rnr_retry_count` of the queue pairs. The credit protocol never lets an RNR happen, so
    /// the default is 0: an RNR would be a bug and fails loudly instead of stalling.
    pub rnr_retry: u8,
    /// Transport retries before a silent peer is declared dead (`retry_count`, 0–7), asked
    /// for by clients; a server's queue pairs take what each client asked for. Not 7:
    /// soft-RoCE retries forever at 7 (hardware 7 times), which [`RdmaConfig::keepalive_timeout`]
    /// then has to catch.
    pub retry_count: u8,
    /// Local ACK timeout of the queue pairs, as the verbs exponent: 4.096 µs × 2^n (0–31)
    /// before an unacknowledged packet is sent again; a silent peer is declared dead after
    /// about `retry_count + 1` of them. `None`: what rdma_cm derives from the route (on
    /// RoCE, seconds per retry).
    pub ack_timeout: Option<u8>,
    /// How long address and route resolution and the connection handshake may take.
    pub connect_timeout: Duration,
    /// Clients: what to authenticate with ([`rpc_core::auth`]); the server must prove it
    /// holds the same secret. `None`: connect without credentials.
    pub credentials: Option<Credentials>,
    /// Inline data the queue pairs are asked to support; the device may grant less.
    pub max_inline: u32,
    /// Longest a sender waits for a free slot or credit. A peer that holds every receive
    /// slot that long is stuck (or hostile): the connection is closed rather than letting
    /// it pin the sending threads.
    pub stall_limit: Duration,
    /// Bodies larger than a slot go by RDMA WRITE in chunks of this many bytes, so that
    /// small frames of other calls pass between them.
    pub large_chunk: u32,
    /// RDMA WRITE chunks outstanding at once per connection.
    pub large_write_window: u32,
    /// Largest body (metadata plus message) a peer may send us by RDMA WRITE; larger ones
    /// are refused before any byte moves, with `RESOURCE_EXHAUSTED` naming both sizes.
    /// Servers and channels lower it to their message size limit plus the metadata limit
    /// ([`RdmaConfig::limit_bodies`]), so a peer can never make us register more than one
    /// acceptable message per grant.
    pub large_max_message: u64,
    /// Registered memory a connection may lend to large bodies at once (both directions).
    /// Registered lazily: a connection that never moves a large body registers nothing.
    pub large_budget: u64,
    /// Registered large-body memory a connection keeps for reuse once idle.
    pub large_cache: u64,
    /// Buffers the peer may be writing into at once; further requests wait their turn.
    pub large_max_grants: u32,
    /// Buffer requests that may wait for a grant beyond `large_max_grants`; past it they are
    /// refused at once (`RESOURCE_EXHAUSTED`), so a peer cannot grow the queue without bound.
    pub large_max_queued: u32,
    /// Longest a peer may hold a buffer we granted at its request without announcing the
    /// body written into it, beyond the time the body takes to write at
    /// `large_grant_min_rate`. A peer past it is hoarding registered memory: the connection
    /// is closed with `RESOURCE_EXHAUSTED` naming the grant, and everything it held is
    /// freed. (Response buffers we advertise are not timed: a handler may take its time.)
    pub large_grant_timeout: Duration,
    /// Slowest a peer is expected to write a granted body, in bytes per second: a grant of
    /// `len` bytes may be held `large_grant_timeout` plus `len / large_grant_min_rate`
    /// (a 1 GiB body at the default 4 MiB/s: 256 s more; soft-RoCE in an emulated VM
    /// writes at 10-60 MB/s). A receiver does not see RDMA
    /// WRITEs land, only the notice after the last one, so this is what tells a slow
    /// writer from a hoarder. 0 counts as 1.
    pub large_grant_min_rate: u64,
    /// Receive slots the application may hold at once as zero-copy views of received
    /// messages (`0..=window - 3`); `None`: a quarter of the initial window (`recv_window`).
    /// Past it, received messages are handed up as copies and their slots go straight back
    /// to the ring, so keeping received `Bytes` never starves a connection of receives or
    /// its peer of credits.
    pub lend_limit: Option<u32>,
    /// Send slots registered at first (`1..=slots`); `None`: [`DEFAULT_SEND_WINDOW`]. A
    /// connection whose senders find the ring full gets it doubled, up to `slots`, so the
    /// memory follows the frames in flight, not the configured ring.
    pub send_window: Option<u32>,
    /// Receive slots posted at first, the peer's initial credits (`3..=slots`); `None`: all
    /// of them with a ring of the connection's own, [`DEFAULT_SHARED_WINDOW`] with a shared
    /// receive queue. A peer that uses up the window gets it doubled, up to `slots` (see
    /// docs/PROTOCOL.md, "Receive windows"). The lend limit and the credit threshold follow
    /// this initial window.
    pub recv_window: Option<u32>,
    /// Where receives land: a ring of receive slots per connection, or one shared receive
    /// queue per device and slot size (see docs/PROTOCOL.md, "Shared receive queue"). The
    /// default, [`Receives::Auto`], shares a queue among a server's connections and gives
    /// each client connection its own ring. A queue pair in error flushes no receive of a
    /// shared queue: such a connection is closed by the device's asynchronous event, or,
    /// with devices that raise none (soft-RoCE), by its next keepalive probe
    /// ([`RdmaConfig::keepalive`]).
    pub recv: Receives,
    /// Entries of each completion queue the connections of one device share (the device's
    /// limit permitting). A connection reserves room for its whole send and receive queues
    /// on a CQ; once no CQ has room, another is created.
    pub cq_entries: u32,
    /// Idle time after which a connection is probed (a zero-length RDMA WRITE its peer's
    /// queue pair must acknowledge); `None`: never. A connection whose probe fails is
    /// closed, its calls failing with `UNAVAILABLE`: its peer died or stopped answering
    /// (noticed after this interval plus the transport's retries, `retry_count` times
    /// `ack_timeout`), or its queue pair went to the error state without a completion to say
    /// so (a forged rkey on a shared receive queue, with a device that raises no
    /// asynchronous event for it). Busy connections are never probed.
    pub keepalive: Option<Duration>,
    /// Longest a probe may go unacknowledged, with nothing else completing meanwhile, before
    /// the peer is declared dead and the connection closed (`UNAVAILABLE`), whatever the
    /// transport's own retries would take.
    pub keepalive_timeout: Duration,
    /// Header-only frames (the `Cancel` of a dropped call) that may wait for credits on one
    /// connection. Dropping a call never blocks: its Cancel is sent at once or queued;
    /// past this bound it is dropped, and the server's late answer to the call is ignored.
    pub control_queue: u32,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            slots: 64,
            slot_size: 8192,
            poll_mode: PollMode::default(),
            rnr_retry: 0,
            retry_count: 6,
            ack_timeout: None,
            connect_timeout: Duration::from_secs(5),
            credentials: None,
            max_inline: 256,
            stall_limit: DEFAULT_STALL_LIMIT,
            large_chunk: 256 * 1024,
            large_write_window: 2,
            large_max_message: 1 << 31,
            large_budget: 4 << 30,
            large_cache: 64 << 20,
            large_max_grants: 16,
            large_max_queued: 256,
            large_grant_timeout: Duration::from_secs(30),
            large_grant_min_rate: 4 << 20,
            lend_limit: None,
            send_window: None,
            recv_window: None,
            recv: Receives::Auto,
            cq_entries: 16 * 1024,
            control_queue: 1024,
            keepalive: Some(DEFAULT_KEEPALIVE),
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
        }
    }
}

impl RdmaConfig {
    /// Largest metadata plus message that fits one slot.
    pub fn max_inline_payload(&self) -> usize {
        (self.slot_size as usize).saturating_sub(rpc_core::HEADER_LEN)
    }

    /// Lowers [`RdmaConfig::large_max_message`] to what a message of `max_message_size`
    /// bytes and its metadata can take: the RPC layer refuses anything larger after it
    /// arrived, so lending a buffer for it would only let a peer pin memory.
    pub fn limit_bodies(&mut self, max_message_size: usize) {
        let most = (max_message_size as u64).saturating_add(rpc_core::MAX_METADATA_LEN as u64);
        self.large_max_message = self.large_max_message.min(most);
    }

    /// The shared receive queue bounds a connection of `role` receives with, if any.
    pub(crate) fn shared_recv(&self, role: Role) -> Option<SharedRecvConfig> {
        match self.recv {
            Receives::Auto if role == Role::Server => Some(SharedRecvConfig::default()),
            Receives::Auto | Receives::Ring => None,
            Receives::Shared(bounds) => Some(bounds),
        }
    }

    /// The protocol's configuration for a connection with `max_inline` bytes of inline
    /// data, receiving from a shared receive queue or not.
    pub(crate) fn protocol(&self, max_inline: u32, shared: bool) -> crate::protocol::Config {
        crate::protocol::Config {
            send_slots: self.slots,
            send_slot_size: self.slot_size,
            recv_slots: self.slots,
            recv_slot_size: self.slot_size,
            max_inline,
            lend_limit: self.lend_limit,
            send_window: Some(
                self.send_window
                    .unwrap_or(DEFAULT_SEND_WINDOW)
                    .min(self.slots),
            ),
            recv_window: if shared {
                Some(
                    self.recv_window
                        .unwrap_or(DEFAULT_SHARED_WINDOW.min(self.slots)),
                )
            } else {
                self.recv_window
            },
            shared_recv: shared,
            large: crate::protocol::LargeConfig {
                chunk_size: self.large_chunk,
                write_window: self.large_write_window,
                max_grants: self.large_max_grants,
                max_queued: self.large_max_queued,
                max_message: self.large_max_message,
            },
            ..crate::protocol::Config::default()
        }
    }
}
