//! Sans-IO wire protocol of the RDMA transport: ring slots and credits.
//!
//! Plain data in, plain [`Action`]s out; no verbs, no threads, no clocks. The verbs driver
//! owns the memory (one send region and one receive region per connection, sized by
//! [`Geometry`]), posts what the [`Connection`] asks for, and feeds completions back. The
//! rules are written up in `docs/PROTOCOL.md` (section "RDMA: rings, credits and signaling").
//!
//! * [`params`]: [`ConnectParams`], the rdma_cm private data, and its validation.
//! * [`geometry`]: local [`Config`] and the negotiated [`Geometry`] (memory layout, queue
//!   depths).
//! * [`credits`]: one credit per posted peer receive slot, one of them reserved for
//!   credit-only frames.
//! * `send_ring` / `recv_ring`: slot bookkeeping, selective signaling, frame validation.
//! * [`large`]: bodies too large for a slot: rendezvous, chunked RDMA WRITEs, grants
//!   revoked by memory-window invalidation.
//! * [`shared_pool`]: the commitments of a shared receive queue's buffers to many
//!   connections' receive windows.
//! * [`connection`]: the state machine tying them together.
//! * [`action`]: what the driver is asked to do, and `wr_id` packing.
//! * [`error`]: [`ProtocolViolation`], [`SendError`], [`ParamsError`].
//!
//! The driver loop (execute actions in order; a `PostRecv` must be posted before any later
//! `PostSend`, whose credits may count it):
//!
//! ```text
//! post RECV for every slot in config.initial_recv_posts()   // before connect/accept
//! exchange config.connect_params().encode() in rdma_cm private data
//! conn = Connection::new(Geometry::negotiate(&config, &ConnectParams::decode(peer_data)?)?)
//! loop {
//!   for wc in poll(send_cq, recv_cq):
//!     id = WorkId::from_wr_id(wc.wr_id)
//!     if wc.status != SUCCESS { conn.on_completion_error(id); disconnect }
//!     Send(slot) | Control => conn.on_send_complete(target)?
//!     Recv(slot)           => if let Some(rx) = conn.on_recv_complete(slot, wc.byte_len,
//!                                 &recv_mem[geometry.recv_offset(slot)..])? { deliver(rx) }
//!   for slot in released_by_upper_layer: conn.release_recv(slot)?
//!   for msg in outgoing: r = conn.reserve_send(len)    // WouldBlock: wait for Writable
//!                        encode msg into send_mem[slot]; conn.commit_send(r, &header)?
//!   while let Some(a) = conn.poll_action():             // strictly in order
//!     PostRecv{slot} => ibv_post_recv(slot)
//!     PostSend(w)    => w.prepare(&mut send_mem[geometry.send_offset(w.target)..]);
//!                       ibv_post_send(w)              // SIGNALED/INLINE per w
//!     Writable       => resume outgoing;   SendDropped{call_id, ..} => fail that call
//! }                                                    // any Err above: disconnect
//! ```

#![forbid(unsafe_code)]

pub mod action;
pub mod connection;
pub mod credits;
pub mod error;
pub mod geometry;
pub mod large;
pub mod params;
mod recv_ring;
pub mod reject;
mod send_ring;
pub mod shared_pool;

#[cfg(test)]
mod tests;

pub use action::{
    Action, ReadWork, Received, SendTarget, SendWork, WorkId, WriteWork, CREDITS_OFFSET,
};
pub use connection::{CloseReason, Connection, SendReservation, Stats};
pub use credits::RESERVED_CREDITS;
pub use error::{ParamsError, ProtocolViolation, SendError};
pub use geometry::{Config, Geometry, CONTROL_BUF_LEN};
pub use large::{BodyId, BodyStart, LargeConfig, LocalBuffer};
pub use params::{ConnectParams, CONNECT_PARAMS_LEN, FLAG_AUTH, TRANSPORT_VERSION};
pub use reject::{decode_reject, encode_reject};
pub use shared_pool::{Admission, PoolConfig, SharedPool};
