//! The verbs objects of one connection, created on the device its cm_id is bound to.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use rpc_core::Status;

use crate::budget::ConnectionSlot;
use crate::config::RdmaConfig;
use crate::engine::{Attachment, Engine, Role};
use crate::large_pool::LargePool;
use crate::protocol::Config;
use crate::protocol::WorkId;
use crate::send_memory::SendMemory;
use crate::shared_recv::SharedRecv;
use crate::verbs::{
    AccessFlags, CmId, MemoryRegion, QpCapabilities, QpInitAttr, QueuePair, RecvRequest, Sge,
    VerbsError,
};

/// Field order is teardown order: the QP is destroyed before the rings are deregistered,
/// so no work request can name memory that is gone, before a shared receive queue gets the
/// connection's commitments back, and before the attachment gives its completion-queue
/// entries and tag back.
pub(crate) struct Resources {
    pub(crate) qp: QueuePair,
    pub(crate) send: SendMemory,
    pub(crate) recv: RecvMemory,
    /// Buffers and windows of large bodies (shared with the `Bytes` of delivered bodies,
    /// which keep their registration alive after the connection is gone).
    pub(crate) large: Arc<LargePool>,
    /// The connection's place in the shared completion engine.
    pub(crate) attachment: Attachment,
    pub(crate) protocol: Config,
    /// The connection's place among the process's ([`ConnectionSlot`]).
    _slot: ConnectionSlot,
}

/// Where a connection's frames land.
pub(crate) enum RecvMemory {
    /// A ring of its own: slot `s` at `s × slot size`, posted on its QP.
    Ring(MemoryRegion),
    /// Buffers of a shared receive queue.
    Shared(Commitment),
}

/// A connection's commitment of buffers of a shared receive queue: given back when dropped,
/// after the QP (which can then receive no more).
pub(crate) struct Commitment {
    pub(crate) shared: Arc<SharedRecv>,
    /// Buffers to give back: the admitted window until the connection exists, then what
    /// its protocol says at its end ([`Commitment::set`]).
    committed: AtomicU32,
}

impl Commitment {
    /// The connection ends with `n` receive slots posted: their commitments go back with
    /// the QP.
    pub(crate) fn set(&self, n: u32) {
        self.committed.store(n, Ordering::Release);
    }
}

impl Drop for Commitment {
    fn drop(&mut self) {
        self.shared.give_back(*self.committed.get_mut());
    }
}

pub(crate) fn verbs_status(what: &str, err: VerbsError) -> Status {
    Status::unavailable(format!("{what}: {err}"))
}

impl Resources {
    /// Attaches to the completion engine of `id`'s device, creates the QP (on a shared CQ)
    /// and both rings, and posts a receive in every receive slot, as the peer's initial
    /// credits assume.
    pub(crate) fn create(
        id: &CmId,
        config: &RdmaConfig,
        role: Role,
        slot: ConnectionSlot,
    ) -> Result<Resources, Status> {
        let ctx = id
            .context()
            .map_err(|e| verbs_status("no RDMA device for the address", e))?;
        // Sized from the configuration before the QP exists; the inline limit the device
        // grants does not change the queue depths.
        let bounds = config.shared_recv(role);
        let sizing = config.protocol(config.rings.max_inline, bounds.is_some());
        let attachment = Engine::attach(&ctx, config, role, sizing.cq_depth())?;
        let pd = attachment.engine.pd.clone();
        let cq = attachment.cq.cq.clone();
        let shared = bounds
            .map(|bounds| {
                attachment
                    .engine
                    .shared_recv(config.rings.slot_size, &bounds)
            })
            .transpose()?;
        let qp = create_qp(
            config.rings.max_inline,
            attachment.engine.max_send_sge,
            |max_inline_data, max_send_sge| {
                QueuePair::new(
                    id,
                    &pd,
                    QpInitAttr {
                        send_cq: cq.clone(),
                        recv_cq: cq.clone(),
                        caps: QpCapabilities {
                            max_send_wr: sizing.sq_depth(),
                            max_recv_wr: sizing.rq_depth(),
                            max_send_sge,
                            max_recv_sge: 1,
                            max_inline_data,
                        },
                        sq_sig_all: false,
                        srq: shared.as_ref().map(|s| s.srq().clone()),
                    },
                )
            },
        )
        .map_err(|e| verbs_status("rdma_create_qp", e))?;
        if let Some(exponent) = config.liveness.ack_timeout {
            // Before connect or accept, which move the QP to RTS with it.
            id.set_ack_timeout(exponent)
                .map_err(|e| verbs_status("setting the ACK timeout", e))?;
        }
        // Before any frame can arrive: shared receives and the device's events about the QP
        // are routed by its number.
        attachment.bind_qp(qp.qp_num());
        let protocol = config.protocol(qp.max_inline_data(), shared.is_some());
        protocol
            .validate()
            .map_err(|e| Status::invalid_argument(format!("RDMA ring configuration: {e}")))?;
        let send = SendMemory::new(
            &pd,
            protocol.send_window.unwrap_or(protocol.send_slots),
            protocol.send_slots,
            protocol.send_slot_size,
        )
        .map_err(|e| verbs_status("registering the send ring", e))?;
        let recv = match shared {
            Some(shared) => {
                let window = protocol.window();
                shared.admit(window)?;
                RecvMemory::Shared(Commitment {
                    shared,
                    committed: AtomicU32::new(window),
                })
            }
            None => {
                let len = protocol.recv_slots as usize * protocol.recv_slot_size as usize;
                let mr = MemoryRegion::alloc(&pd, len, AccessFlags::LOCAL_WRITE)
                    .map_err(|e| verbs_status("registering the receive ring", e))?;
                RecvMemory::Ring(mr)
            }
        };
        let large = LargePool::new(pd, config.large.budget, config.large.cache);
        let resources = Resources {
            qp,
            send,
            recv,
            large,
            attachment,
            protocol,
            _slot: slot,
        };
        for slot in protocol.initial_recv_posts() {
            resources
                .post_recv(slot)
                .map_err(|e| verbs_status("posting the initial receives", e))?;
        }
        Ok(resources)
    }

    /// The `wr_id` of `work` on this connection.
    pub(crate) fn wr_id(&self, work: WorkId) -> u64 {
        work.to_wr_id(self.attachment.tag)
    }

    /// The shared receive queue the connection receives from, if any.
    pub(crate) fn shared_recv(&self) -> Option<&Commitment> {
        match &self.recv {
            RecvMemory::Shared(commitment) => Some(commitment),
            RecvMemory::Ring(_) => None,
        }
    }

    /// Posts a receive into `slot` of the connection's own ring.
    pub(crate) fn post_recv(&self, slot: u32) -> Result<(), VerbsError> {
        let RecvMemory::Ring(ring) = &self.recv else {
            // The protocol emits no `PostRecv` in shared mode.
            debug_assert!(false, "PostRecv {slot} on a shared receive queue");
            tracing::error!(
                slot,
                "receive of its own asked for on a shared receive queue"
            );
            return Ok(());
        };
        let size = self.protocol.recv_slot_size;
        let offset = u64::from(slot) * u64::from(size);
        let sge = [Sge::new(ring.addr() + offset, size, ring.lkey())];
        let request = RecvRequest {
            wr_id: self.wr_id(WorkId::Recv(slot)),
            sges: &sge,
        };
        // SAFETY: the SGE lies inside the ring, which lives as long as the QP (it is
        // declared after it in this struct and so deregistered after the QP is destroyed).
        // The protocol hands out a slot for posting only when nobody reads it: after
        // `release_recv`, or before the connection starts.
        unsafe { self.qp.post_recv(&request) }
    }

    /// The bytes of receive entry `entry`: a slot of the ring, or a buffer of the shared
    /// receive queue.
    ///
    /// # Safety
    /// The entry must not be posted: its receive completed and it was not re-posted since.
    pub(crate) unsafe fn recv_entry(&self, entry: u32) -> &[u8] {
        let ring = match &self.recv {
            RecvMemory::Ring(ring) => ring,
            // SAFETY: the caller's contract.
            RecvMemory::Shared(commitment) => return unsafe { commitment.shared.buffer(entry) },
        };
        let size = self.protocol.recv_slot_size as usize;
        let offset = entry as usize * size;
        assert!(offset + size <= ring.len(), "receive slot out of range");
        // SAFETY: in bounds (checked above) of the registered, live buffer; the caller
        // guarantees the device does not write this slot while the slice lives.
        unsafe { std::slice::from_raw_parts((ring.addr() as usize + offset) as *const u8, size) }
    }
}

/// Creates a queue pair with `max_inline` bytes of inline data, or, if the device refuses,
/// with less: half as much each time, down to none (some iWARP and Intel devices offer
/// fewer than 256 bytes, and say so only by failing). Frames too large for what was granted
/// are sent from registered memory instead. The first error is returned if none works.
fn create_qp(
    max_inline: u32,
    max_send_sge: u32,
    mut create: impl FnMut(u32, u32) -> Result<QueuePair, VerbsError>,
) -> Result<QueuePair, VerbsError> {
    let first = match create(max_inline, max_send_sge) {
        Ok(qp) => return Ok(qp),
        Err(e) => e,
    };
    // Gather entries go first (they only spare large bodies a copy), then inline data.
    if max_send_sge > 1 {
        if let Ok(qp) = create(max_inline, 1) {
            tracing::debug!(asked = max_send_sge, "the device offers no gather entries");
            return Ok(qp);
        }
    }
    let mut inline = max_inline;
    while inline > 0 {
        inline = if inline > 16 { inline / 2 } else { 0 };
        if let Ok(qp) = create(inline, 1) {
            tracing::debug!(
                asked = max_inline,
                granted = inline,
                "the device offers less inline data"
            );
            return Ok(qp);
        }
    }
    Err(first)
}
