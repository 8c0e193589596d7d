//! The wire between two endpoints: work requests in send-queue order, and what each does
//! when it executes (RC executes a send queue in order).

use super::{large, Endpoint, RecvCqe};
use crate::{ReadWork, SendTarget, WorkId, WriteWork, CREDITS_OFFSET};

/// A SEND on the wire.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    pub(super) target: SendTarget,
    pub(super) len: u32,
    pub(super) signaled: bool,
    pub(super) credits: u32,
}

/// A work request on the wire, in send-queue order (RC executes a send queue in order).
#[derive(Debug, Clone, Copy)]
pub(super) enum Wire {
    Send(InFlight),
    Write(WriteWork),
    Read(ReadWork),
    /// A local operation (window bind or invalidation): takes effect in queue order.
    Local(WorkId, Option<u32>),
    /// A keepalive probe: a zero-length WRITE the peer only acknowledges.
    Probe,
}

/// Executes the oldest work request on `from`'s wire: a SEND lands in `to`'s oldest posted
/// RECV, a WRITE in `to`'s memory through a valid window, a local operation on `from`.
pub(super) fn transmit(from: &mut Endpoint, to: &mut Endpoint) -> bool {
    let Some(wr) = from.wire.pop_front() else {
        return false;
    };
    let frame = match wr {
        Wire::Send(frame) => frame,
        Wire::Write(w) => {
            large::transmit_write(from, to, w);
            return true;
        }
        Wire::Read(r) => {
            large::transmit_read(from, to, r);
            return true;
        }
        Wire::Local(id, rkey) => {
            large::finish_local(from, id, rkey);
            return true;
        }
        Wire::Probe => {
            from.send_cq.push_back(WorkId::Probe);
            return true;
        }
    };
    assert!(
        frame.len <= to.geom.recv_slot_size,
        "local length error at the receiver"
    );
    let src = from.geom.send_offset(frame.target);
    let len = frame.len as usize;
    let size = to.geom.recv_slot_size;
    let Some(slot) = to.recv.land(&from.send_mem[src..src + len], size) else {
        panic!("RNR: {frame:?} arrived but the peer has no RECV posted");
    };
    let landed = to.recv.entry(slot, len, size);
    let wire_credits = &landed[CREDITS_OFFSET..CREDITS_OFFSET + 4];
    assert_eq!(
        wire_credits,
        frame.credits.to_le_bytes(),
        "credits not written by prepare"
    );
    to.recv_cq.push_back(RecvCqe {
        slot,
        len: frame.len,
        credits: frame.credits,
    });
    if frame.signaled {
        from.send_cq.push_back(frame.target.work_id());
    }
    true
}
