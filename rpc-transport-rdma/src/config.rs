//! Settings of RDMA connections.

use std::time::Duration;

use rpc_core::auth::Credentials;

use crate::engine::Role;
use crate::nic::Nic;

/// How a connection's completions are processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// Spin on the completion queue without ever sleeping: lowest latency, one busy core per
    /// connection. For benchmarks and dedicated machines.
    Busy,
    /// Arm the completion queue and sleep on its completion channel: an idle connection costs
    /// no CPU; a message that arrives after the poller's short linger
    /// ([`Polling::event_linger`]) pays a wake-up.
    Event,
    /// Spin for `spin` after the last completion, then sleep as in [`PollMode::Event`]. A
    /// blocking call spins on its own completions for up to `spin` before parking.
    Adaptive {
        /// How long to keep spinning after activity.
        spin: Duration,
    },
}

impl PollMode {
    /// Whether the poller sleeps as soon as it finds nothing (after its
    /// [`Polling::event_linger`]): event polling, or adaptive with no spin.
    pub(crate) fn sleeps_at_once(self) -> bool {
        self.spin() == Some(Duration::ZERO)
    }

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

/// The send slots a connection registers at first, unless [`Rings::send_window`] says
/// otherwise: enough for calls one at a time; concurrency doubles the ring as needed.
pub const DEFAULT_SEND_WINDOW: u32 = 2;

/// How long a connection may be idle before it is probed, unless [`Liveness::keepalive`]
/// says otherwise (the same for every transport). A thousand idle connections cost about 70
/// probes a second.
pub use rpc_core::transport::DEFAULT_KEEPALIVE;
use rpc_core::transport::{DEFAULT_KEEPALIVE_TIMEOUT, DEFAULT_STALL_LIMIT};

/// The initial receive window of a connection on a shared receive queue, unless
/// [`Rings::recv_window`] says otherwise: what every connection commits however idle
/// (a busy one has it doubled while the queue has buffers to spare).
pub const DEFAULT_SHARED_WINDOW: u32 = 4;

/// Where a connection's receives land ([`Rings::recv`]).
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
#[non_exhaustive]
pub struct SharedRecvConfig {
    /// Buffers registered and posted at a time, as connections need them. Default 256.
    pub chunk: u32,
    /// Most buffers the queue holds (the device's `max_srq_wr` permitting). Default 16 Ki.
    pub max_buffers: u32,
    /// Posted buffers never committed to a window: they absorb the frames a peer sends
    /// beyond its credits until its connection is closed, so honest peers see no RNR.
    /// Default 64.
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

/// Generates, for each listed field of a settings struct, a builder method of the same name
/// that sets it and returns the struct, so settings chain from `default()`.
macro_rules! setters {
    ($ty:ident { $($field:ident: $value:ty),* $(,)? }) => {
        impl $ty {
            $(
                #[doc = concat!("Sets [`", stringify!($ty), "::", stringify!($field), "`].")]
                #[must_use]
                pub fn $field(mut self, $field: $value) -> Self {
                    self.$field = $field;
                    self
                }
            )*
        }
    };
}

setters!(SharedRecvConfig {
    chunk: u32,
    max_buffers: u32,
    slack: u32,
});

/// Settings of RDMA connections, in four groups: [`Rings`], [`LargeBodies`], [`Liveness`]
/// and [`Polling`]. Every field has a default; set what differs with the builder methods
/// (or assign the public fields of a `default()`).
///
/// ```
/// use rpc_transport_rdma::{PollMode, Polling, RdmaConfig, Rings};
/// let config = RdmaConfig::default()
///     .rings(Rings::default().slots(32).slot_size(16 * 1024))
///     .polling(Polling::default().mode(PollMode::Busy));
/// assert_eq!(config.rings.slots, 32);
/// assert!(config.max_inline_payload() < 16 * 1024);
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RdmaConfig {
    /// The send and receive rings: slots, their size, windows and where receives land.
    pub rings: Rings,
    /// Bodies larger than a slot, moved by RDMA WRITE into granted buffers.
    pub large: LargeBodies,
    /// Noticing a dead, stuck or hostile peer, and how long connecting may take.
    pub liveness: Liveness,
    /// How completions are processed.
    pub polling: Polling,
    /// Clients: what to authenticate with ([`rpc_core::auth`]); the server must prove it
    /// holds the same secret. `None`: connect without credentials.
    pub credentials: Option<Credentials>,
    /// The device, port and address connections go through; by default rdma_cm's choice
    /// by route.
    pub nic: Nic,
}

setters!(RdmaConfig {
    rings: Rings,
    large: LargeBodies,
    liveness: Liveness,
    polling: Polling,
    credentials: Option<Credentials>,
    nic: Nic,
});

/// The send and receive rings of a connection ([`RdmaConfig::rings`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Rings {
    /// Slots in each of the send and receive rings (one credit per receive slot). Default 64.
    pub slots: u32,
    /// Bytes per ring slot: the largest frame (64-byte header, metadata, message) sent by
    /// SEND. The peer's receive slot size caps what we send. Default 8 KiB.
    pub slot_size: u32,
    /// Inline data the queue pairs are asked to support; the device may grant less.
    /// Default 256.
    pub max_inline: u32,
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
    /// Frames of at most this many bytes (header, metadata and payload) are handed up as
    /// copies, cut from a chunk the receiving thread reuses, and their slot goes back as
    /// soon as they are handed up: for a small message a copy costs less than lending the
    /// slot, which takes an allocation and holds the slot for as long as the application
    /// keeps the message. Larger frames are handed up as zero-copy views of their slot
    /// (within `lend_limit`). 0: every frame is lent. Default 512.
    pub copy_below: u32,
    /// Receive slots the application may hold at once as zero-copy views of received
    /// messages (`0..=window - 3`); `None`: a quarter of the initial window (`recv_window`).
    /// Past it, received messages are handed up as copies and their slots go straight back
    /// to the ring, so keeping received `Bytes` never starves a connection of receives or
    /// its peer of credits.
    pub lend_limit: Option<u32>,
    /// Where receives land: a ring of receive slots per connection, or one shared receive
    /// queue per device and slot size (see docs/PROTOCOL.md, "Shared receive queue"). The
    /// default, [`Receives::Auto`], shares a queue among a server's connections and gives
    /// each client connection its own ring. A queue pair in error flushes no receive of a
    /// shared queue: such a connection is closed by the device's asynchronous event, or,
    /// with devices that raise none (soft-RoCE), by its next keepalive probe
    /// ([`Liveness::keepalive`]).
    pub recv: Receives,
}

impl Default for Rings {
    fn default() -> Self {
        Rings {
            slots: 64,
            slot_size: 8192,
            max_inline: 256,
            send_window: None,
            recv_window: None,
            copy_below: 512,
            lend_limit: None,
            recv: Receives::Auto,
        }
    }
}

setters!(Rings {
    slots: u32,
    slot_size: u32,
    max_inline: u32,
    send_window: Option<u32>,
    recv_window: Option<u32>,
    copy_below: u32,
    lend_limit: Option<u32>,
    recv: Receives,
});

/// Bodies larger than a slot ([`RdmaConfig::large`]): the server READs a request's body
/// from where the client offers it, or the receiver grants a registered buffer and the
/// sender writes the body into it by RDMA WRITE (docs/PROTOCOL.md, "Large messages").
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LargeBodies {
    /// Bodies go by RDMA WRITE or READ in chunks of this many bytes, so that small frames of
    /// other calls pass between them. Default 256 KiB.
    pub chunk: u32,
    /// RDMA WRITE and READ chunks outstanding at once per connection, all bodies together.
    /// (Connections ask for as many READs in flight as their devices allow, so this is
    /// the bound on READs too.) Default 2.
    pub write_window: u32,
    /// Request bodies of at least this many bytes (metadata plus message) are offered for
    /// the server to RDMA READ, which spares the round trip of asking for a buffer: the
    /// offer and the request go at once, and the server pulls the body. Smaller ones, and
    /// bodies with application memory sent in place, take the rendezvous (the server grants
    /// a buffer, the client WRITEs). `u64::MAX`: never. Default 0: every request body too
    /// large for a ring slot that lies in one piece (docs/BENCHMARKS.md, "Large requests
    /// read or written", has the figures).
    pub read_from: u64,
    /// Largest body (metadata plus message) a peer may send us by RDMA WRITE or offer us to
    /// READ; larger ones are refused before any byte moves, with `RESOURCE_EXHAUSTED` naming both sizes.
    /// Servers and channels lower it to their message size limit plus the metadata limit
    /// ([`RdmaConfig::limit_bodies`]), so a peer can never make us register more than one
    /// acceptable message per grant. Default 2 GiB.
    pub max_message: u64,
    /// Registered memory a connection may lend to large bodies at once (both directions).
    /// Registered lazily: a connection that never moves a large body registers nothing.
    /// Default 4 GiB.
    pub budget: u64,
    /// Registered large-body memory a connection keeps for reuse once idle. Default 64 MiB.
    pub cache: u64,
    /// Windows over this connection's memory open to the peer at once, and buffers lent to
    /// it: buffers it may write (granted at its request, or advertised for a response),
    /// buffers this side reads its bodies into, and request bodies offered for it to read.
    /// Further buffer requests and offers wait their turn; further requests of ours go
    /// without a response buffer and by the rendezvous. Default 16.
    pub max_grants: u32,
    /// Buffer requests that may wait for a grant beyond `max_grants`; past it they are
    /// refused at once (`RESOURCE_EXHAUSTED`), so a peer cannot grow the queue without bound.
    /// Default 256.
    pub max_queued: u32,
    /// Longest a peer may hold a buffer we granted at its request without announcing the
    /// body written into it, beyond the time the body takes to write at `grant_min_rate`.
    /// A peer past it is hoarding registered memory: the connection is closed with
    /// `RESOURCE_EXHAUSTED` naming the grant, and everything it held is freed. (Response
    /// buffers we advertise are not timed: a handler may take its time.) Default 30 s.
    pub grant_timeout: Duration,
    /// Slowest a peer is expected to write a granted body, in bytes per second: a grant of
    /// `len` bytes may be held `grant_timeout` plus `len / grant_min_rate` (a 1 GiB body at
    /// the default 4 MiB/s: 256 s more; soft-RoCE in an emulated VM writes at 10-60 MB/s).
    /// A receiver does not see RDMA WRITEs land, only the notice after the last one, so
    /// this is what tells a slow writer from a hoarder. 0 counts as 1.
    pub grant_min_rate: u64,
}

impl Default for LargeBodies {
    fn default() -> Self {
        LargeBodies {
            chunk: 256 * 1024,
            write_window: 2,
            read_from: 0,
            max_message: 1 << 31,
            budget: 4 << 30,
            cache: 64 << 20,
            max_grants: 16,
            max_queued: 256,
            grant_timeout: Duration::from_secs(30),
            grant_min_rate: 4 << 20,
        }
    }
}

setters!(LargeBodies {
    chunk: u32,
    write_window: u32,
    read_from: u64,
    max_message: u64,
    budget: u64,
    cache: u64,
    max_grants: u32,
    max_queued: u32,
    grant_timeout: Duration,
    grant_min_rate: u64,
});

/// Noticing a dead, stuck or hostile peer ([`RdmaConfig::liveness`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Liveness {
    /// How long address and route resolution and the connection handshake may take.
    /// Default 5 s.
    pub connect_timeout: Duration,
    /// Idle time after which a connection is probed (a zero-length RDMA WRITE its peer's
    /// queue pair must acknowledge); `None`: never. A connection whose probe fails is
    /// closed, its calls failing with `UNAVAILABLE`: its peer died or stopped answering
    /// (noticed after this interval plus the transport's retries, `retry_count` times
    /// `ack_timeout`), or its queue pair went to the error state without a completion to say
    /// so (a forged rkey on a shared receive queue, with a device that raises no
    /// asynchronous event for it). Busy connections are never probed. Default
    /// [`DEFAULT_KEEPALIVE`].
    pub keepalive: Option<Duration>,
    /// Longest a probe may go unacknowledged, with nothing else completing meanwhile, before
    /// the peer is declared dead and the connection closed (`UNAVAILABLE`), whatever the
    /// transport's own retries would take. Default 20 s.
    pub keepalive_timeout: Duration,
    /// Longest a sender waits for a free slot or credit. A peer that holds every receive
    /// slot that long is stuck (or hostile): the connection is closed rather than letting
    /// it pin the sending threads. Default 10 s.
    pub stall_limit: Duration,
    /// Header-only frames (the `Cancel` of a dropped call) that may wait for credits on one
    /// connection. Dropping a call never blocks: its Cancel is sent at once or queued;
    /// past this bound it is dropped, and the server's late answer to the call is ignored.
    /// Default 1024.
    pub control_queue: u32,
    /// Transport retries before a silent peer is declared dead (`retry_count`, 0–7), asked
    /// for by clients; a server's queue pairs take what each client asked for. Not 7:
    /// soft-RoCE retries forever at 7 (hardware 7 times), which
    /// [`Liveness::keepalive_timeout`] then has to catch. Default 6.
    pub retry_count: u8,
    /// Local ACK timeout of the queue pairs, as the verbs exponent: 4.096 µs × 2^n (0–31)
    /// before an unacknowledged packet is sent again; a silent peer is declared dead after
    /// about `retry_count + 1` of them. `None`: what rdma_cm derives from the route (on
    /// RoCE, seconds per retry).
    pub ack_timeout: Option<u8>,
    /// `rnr_retry_count` of the queue pairs. The credit protocol never lets an RNR happen, so
    /// the default is 0: an RNR would be a bug and fails loudly instead of stalling.
    pub rnr_retry: u8,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness {
            connect_timeout: Duration::from_secs(5),
            keepalive: Some(DEFAULT_KEEPALIVE),
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            stall_limit: DEFAULT_STALL_LIMIT,
            control_queue: 1024,
            retry_count: 6,
            ack_timeout: None,
            rnr_retry: 0,
        }
    }
}

setters!(Liveness {
    connect_timeout: Duration,
    keepalive: Option<Duration>,
    keepalive_timeout: Duration,
    stall_limit: Duration,
    control_queue: u32,
    retry_count: u8,
    ack_timeout: Option<u8>,
    rnr_retry: u8,
});

/// How completions are processed ([`RdmaConfig::polling`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Polling {
    /// Spinning, sleeping on the completion channel, or spinning a while then sleeping.
    /// Default [`PollMode::Adaptive`] with 1 ms of spinning.
    pub mode: PollMode,
    /// Entries of each completion queue the connections of one device share (the device's
    /// limit permitting). A connection reserves room for its whole send and receive queues
    /// on a CQ; once no CQ has room, another is created. Default 16 Ki.
    pub cq_entries: u32,
    /// With [`PollMode::Event`] (or adaptive with no spin): empty looks at the completion
    /// queues the poller takes after completions before it arms them and sleeps, so that
    /// completions close behind (the next messages of a busy connection) cost no wake-up.
    /// 0: it sleeps at the first empty look, and every message pays a wake-up. Default 64
    /// (a few microseconds). Connections with different lingers have pollers of their own.
    pub event_linger: u32,
}

impl Default for Polling {
    fn default() -> Self {
        Polling {
            mode: PollMode::default(),
            cq_entries: 16 * 1024,
            event_linger: 64,
        }
    }
}

setters!(Polling {
    mode: PollMode,
    cq_entries: u32,
    event_linger: u32,
});

impl RdmaConfig {
    /// Largest metadata plus message that fits one slot.
    pub fn max_inline_payload(&self) -> usize {
        (self.rings.slot_size as usize).saturating_sub(rpc_core::HEADER_LEN)
    }

    /// Lowers [`LargeBodies::max_message`] to what a message of `max_message_size`
    /// bytes and its metadata can take: the RPC layer refuses anything larger after it
    /// arrived, so lending a buffer for it would only let a peer pin memory.
    pub fn limit_bodies(&mut self, max_message_size: usize) {
        let most = (max_message_size as u64).saturating_add(rpc_core::MAX_METADATA_LEN as u64);
        self.large.max_message = self.large.max_message.min(most);
    }

    /// The shared receive queue bounds a connection of `role` receives with, if any.
    pub(crate) fn shared_recv(&self, role: Role) -> Option<SharedRecvConfig> {
        match self.rings.recv {
            Receives::Auto if role == Role::Server => Some(SharedRecvConfig::default()),
            Receives::Auto | Receives::Ring => None,
            Receives::Shared(bounds) => Some(bounds),
        }
    }

    /// The protocol's configuration for a connection with `max_inline` bytes of inline
    /// data, receiving from a shared receive queue or not.
    pub(crate) fn protocol(&self, max_inline: u32, shared: bool) -> crate::protocol::Config {
        crate::protocol::Config {
            send_slots: self.rings.slots,
            send_slot_size: self.rings.slot_size,
            recv_slots: self.rings.slots,
            recv_slot_size: self.rings.slot_size,
            max_inline,
            lend_limit: self.rings.lend_limit,
            send_window: Some(
                self.rings
                    .send_window
                    .unwrap_or(DEFAULT_SEND_WINDOW)
                    .min(self.rings.slots),
            ),
            recv_window: if shared {
                Some(
                    self.rings
                        .recv_window
                        .unwrap_or(DEFAULT_SHARED_WINDOW.min(self.rings.slots)),
                )
            } else {
                self.rings.recv_window
            },
            shared_recv: shared,
            large: crate::protocol::LargeConfig {
                chunk_size: self.large.chunk,
                write_window: self.large.write_window,
                max_grants: self.large.max_grants,
                max_queued: self.large.max_queued,
                max_message: self.large.max_message,
            },
            ..crate::protocol::Config::default()
        }
    }
}
