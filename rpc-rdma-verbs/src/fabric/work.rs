//! Executing one send-queue work request at post time: gather, check keys, deliver into the
//! peer, complete on both sides. A request that needs a receive the peer has not posted
//! waits (receiver not ready, retried without end when `rnr_retry_count` is 7) until the
//! peer posts one, and everything the queue pair posts after it waits behind it.

use std::collections::VecDeque;
use std::os::raw::c_int;
use std::slice;

use rdma_sys::{
    ibv_access_flags, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc_flags, ibv_wc_opcode,
    ibv_wc_status, ibv_wr_opcode,
};

use super::memory;
use super::qp::{completion, NoRecv, QpShared, Recv};

/// `rnr_retry_count` that means "retry for ever".
pub(super) const RNR_RETRY_FOREVER: u8 = 7;

/// The SGE list of a work request.
///
/// # Safety
/// `list` holds `n` entries (or `n` is 0), valid for `'a`.
pub(super) unsafe fn sges<'a>(list: *const ibv_sge, n: usize) -> &'a [ibv_sge] {
    if n == 0 || list.is_null() {
        &[]
    } else {
        // SAFETY: per the contract.
        unsafe { slice::from_raw_parts(list, n) }
    }
}

/// A SEND or RDMA WRITE, its bytes gathered: what a queue pair keeps while it waits.
#[derive(Debug)]
pub(super) struct Transfer {
    wr_id: u64,
    signaled: bool,
    data: Vec<u8>,
    imm: Option<u32>,
    /// The peer's memory, for an RDMA WRITE.
    remote: Option<(u64, u32)>,
}

/// How an attempt to deliver a transfer ended.
enum Attempt {
    Done(ibv_wc_status::Type),
    /// The peer has no receive posted.
    NotReady,
}

/// Runs `wr` on `qp` now: `Err(errno)` if it cannot be posted at all (nothing happens then),
/// else its completion, if any, is on the send completion queue (or it waits for a
/// receive at the peer, see the module's doc).
///
/// # Safety
/// `wr`'s SGE list is valid; the memory it and any rkey name is what the verbs contract
/// says (registered, not touched by safe code until the completion).
pub(super) unsafe fn execute(qp: &QpShared, wr: &ibv_send_wr) -> Result<(), c_int> {
    use ibv_wr_opcode::*;
    let n = usize::try_from(wr.num_sge).map_err(|_| libc::EINVAL)?;
    if n > super::device::MAX_SGE as usize {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let list = unsafe { sges(wr.sg_list, n) };
    let signaled = qp.sq_sig_all || wr.send_flags & ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
    let complete = |status, opcode, byte_len| {
        finish(qp, wr.wr_id, signaled, status, opcode, byte_len);
        Ok(())
    };
    if qp.in_error() {
        return complete(ibv_wc_status::IBV_WC_WR_FLUSH_ERR, opcode_of(wr.opcode), 0);
    }
    match wr.opcode {
        IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => {
            let inline = wr.send_flags & ibv_send_flags::IBV_SEND_INLINE.0 != 0;
            // SAFETY: per the contract.
            let Some(data) = (unsafe { gather(qp, list, inline) }) else {
                return complete(ibv_wc_status::IBV_WC_LOC_PROT_ERR, opcode_of(wr.opcode), 0);
            };
            let with_imm = matches!(wr.opcode, IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE_WITH_IMM);
            let write = matches!(wr.opcode, IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM);
            // SAFETY: the union holds a plain integer (the immediate, for `WITH_IMM`).
            let imm = unsafe { wr.imm_data_invalidated_rkey_union.imm_data };
            // SAFETY: the union holds plain integers (the remote address, for RDMA opcodes).
            let remote = unsafe { wr.wr.rdma };
            let transfer = Transfer {
                wr_id: wr.wr_id,
                signaled,
                data,
                imm: with_imm.then_some(imm),
                remote: write.then_some((remote.remote_addr, remote.rkey)),
            };
            send(qp, transfer);
            Ok(())
        }
        // SAFETY: per the contract.
        IBV_WR_RDMA_READ => unsafe { read(qp, wr, list, signaled) },
        IBV_WR_BIND_MW => {
            // SAFETY: the union holds the bind for this opcode; its region is live.
            let (bind, lkey) = unsafe {
                let bind = wr.bind_mw_tso_union.bind_mw;
                (bind, (*bind.bind_info.mr).lkey)
            };
            let info = bind.bind_info;
            let bound = memory::bind(
                bind.mw as usize,
                bind.rkey,
                lkey,
                info.addr,
                info.length,
                info.mw_access_flags,
            );
            let status = if bound {
                ibv_wc_status::IBV_WC_SUCCESS
            } else {
                ibv_wc_status::IBV_WC_MW_BIND_ERR
            };
            complete(status, ibv_wc_opcode::IBV_WC_BIND_MW, 0)
        }
        IBV_WR_LOCAL_INV => {
            // SAFETY: the union holds the rkey for this opcode.
            let rkey = unsafe { wr.imm_data_invalidated_rkey_union.invalidated_rkey };
            let status = if memory::invalidate(rkey) {
                ibv_wc_status::IBV_WC_SUCCESS
            } else {
                ibv_wc_status::IBV_WC_LOC_PROT_ERR
            };
            complete(status, ibv_wc_opcode::IBV_WC_LOCAL_INV, 0)
        }
        _ => Err(libc::EINVAL),
    }
}

/// The send-side completion opcode of a work request opcode.
fn opcode_of(op: ibv_wr_opcode::Type) -> ibv_wc_opcode::Type {
    use ibv_wr_opcode::*;
    match op {
        IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => ibv_wc_opcode::IBV_WC_RDMA_WRITE,
        IBV_WR_RDMA_READ => ibv_wc_opcode::IBV_WC_RDMA_READ,
        IBV_WR_BIND_MW => ibv_wc_opcode::IBV_WC_BIND_MW,
        IBV_WR_LOCAL_INV => ibv_wc_opcode::IBV_WC_LOCAL_INV,
        _ => ibv_wc_opcode::IBV_WC_SEND,
    }
}

/// Completes a request on `qp`'s send queue: always when it failed (and the queue pair
/// then fails), else if it was signaled.
fn finish(
    qp: &QpShared,
    wr_id: u64,
    signaled: bool,
    status: ibv_wc_status::Type,
    opcode: ibv_wc_opcode::Type,
    byte_len: usize,
) {
    let ok = status == ibv_wc_status::IBV_WC_SUCCESS;
    if signaled || !ok {
        let mut wc = completion(wr_id, qp.qp_num, status);
        wc.opcode = opcode;
        wc.byte_len = byte_len as u32;
        qp.send_cq.push(wc);
    }
    if !ok {
        qp.fail();
    }
}

/// Transfers of a queue pair waiting for receives at its peer, and who is sending them.
#[derive(Debug, Default)]
pub(super) struct Waiting {
    queue: VecDeque<Transfer>,
    /// A thread is draining the queue (so the others only append).
    busy: bool,
    /// A receive was posted while the queue was being drained: try the front again.
    again: bool,
}

impl Waiting {
    /// Empties the queue (the queue pair failed): what waited, to complete as flushed.
    pub(super) fn flush(&mut self) -> VecDeque<Transfer> {
        std::mem::take(&mut self.queue)
    }
}

impl Transfer {
    pub(super) fn wr_id(&self) -> u64 {
        self.wr_id
    }

    pub(super) fn opcode(&self) -> ibv_wc_opcode::Type {
        if self.remote.is_some() {
            ibv_wc_opcode::IBV_WC_RDMA_WRITE
        } else {
            ibv_wc_opcode::IBV_WC_SEND
        }
    }
}

/// Sends `transfer` after what already waits, now if it can.
fn send(qp: &QpShared, transfer: Transfer) {
    {
        let mut waiting = qp.waiting.lock();
        waiting.queue.push_back(transfer);
        if waiting.busy {
            return;
        }
        waiting.busy = true;
    }
    drain(qp);
}

/// The peer of `qp` posted a receive: sends what waits, in order, until one finds none.
pub(super) fn retry_waiting(qp: &QpShared) {
    {
        let mut waiting = qp.waiting.lock();
        if waiting.busy {
            waiting.again = true;
            return;
        }
        if waiting.queue.is_empty() {
            return;
        }
        waiting.busy = true;
    }
    drain(qp);
}

/// Sends the waiting transfers in order, without holding the queue's lock while one is
/// delivered; stops at one that finds no receive (unless a receive came meanwhile).
fn drain(qp: &QpShared) {
    loop {
        let transfer = {
            let mut waiting = qp.waiting.lock();
            match waiting.queue.pop_front() {
                Some(transfer) => {
                    waiting.again = false;
                    transfer
                }
                None => {
                    waiting.busy = false;
                    return;
                }
            }
        };
        match attempt(qp, &transfer) {
            Attempt::Done(status) => complete_transfer(qp, &transfer, status),
            Attempt::NotReady if qp.rnr_retry() < RNR_RETRY_FOREVER => {
                let status = ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR;
                complete_transfer(qp, &transfer, status);
            }
            Attempt::NotReady => {
                let mut waiting = qp.waiting.lock();
                waiting.queue.push_front(transfer);
                if !std::mem::take(&mut waiting.again) {
                    waiting.busy = false;
                    return;
                }
            }
        }
    }
}

fn complete_transfer(qp: &QpShared, transfer: &Transfer, status: ibv_wc_status::Type) {
    let len = transfer.data.len();
    finish(
        qp,
        transfer.wr_id,
        transfer.signaled,
        status,
        transfer.opcode(),
        len,
    );
}

/// One try at delivering `transfer` into `qp`'s peer.
fn attempt(qp: &QpShared, transfer: &Transfer) -> Attempt {
    let Some(peer) = qp.peer() else {
        return Attempt::Done(ibv_wc_status::IBV_WC_RETRY_EXC_ERR);
    };
    let data = &transfer.data;
    if let Some((addr, rkey)) = transfer.remote {
        if !data.is_empty() {
            let access = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
            if !memory::allows(rkey, peer.pd, addr, data.len() as u64, access) {
                peer.fail();
                return Attempt::Done(ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
            }
            // SAFETY: the key table says the peer registered these bytes for remote write,
            // and the verbs contract keeps them registered and untouched.
            unsafe { std::ptr::copy(data.as_ptr(), addr as *mut u8, data.len()) };
        }
        if transfer.imm.is_none() {
            return Attempt::Done(ibv_wc_status::IBV_WC_SUCCESS);
        }
    }
    let recv: Recv = match peer.take_recv() {
        Ok(recv) => recv,
        Err(NoRecv::Empty) => return Attempt::NotReady,
        Err(NoRecv::Error) => return Attempt::Done(ibv_wc_status::IBV_WC_RETRY_EXC_ERR),
    };
    let (status, opcode) = if transfer.remote.is_some() {
        let opcode = ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM;
        (ibv_wc_status::IBV_WC_SUCCESS, opcode)
    } else {
        // SAFETY: a posted receive lends its SGEs to the device until it completes.
        let status = unsafe { scatter(peer.pd, &recv.sges, data) };
        (status, ibv_wc_opcode::IBV_WC_RECV)
    };
    let mut wc = completion(recv.wr_id, peer.qp_num, status);
    wc.opcode = opcode;
    wc.byte_len = data.len() as u32;
    wc.src_qp = qp.qp_num;
    if let Some(imm) = transfer.imm {
        wc.imm_data_invalidated_rkey_union.imm_data = imm;
        wc.wc_flags = ibv_wc_flags::IBV_WC_WITH_IMM.0;
    }
    peer.recv_cq.push(wc);
    if status == ibv_wc_status::IBV_WC_SUCCESS {
        Attempt::Done(status)
    } else {
        peer.fail();
        Attempt::Done(ibv_wc_status::IBV_WC_REM_INV_REQ_ERR)
    }
}

/// An RDMA READ: the peer's bytes into `list`, now.
///
/// # Safety
/// As for [`execute`].
unsafe fn read(
    qp: &QpShared,
    wr: &ibv_send_wr,
    list: &[ibv_sge],
    signaled: bool,
) -> Result<(), c_int> {
    let op = ibv_wc_opcode::IBV_WC_RDMA_READ;
    let len: u64 = list.iter().map(|s| u64::from(s.length)).sum();
    let Some(peer) = qp.peer() else {
        finish(
            qp,
            wr.wr_id,
            signaled,
            ibv_wc_status::IBV_WC_RETRY_EXC_ERR,
            op,
            0,
        );
        return Ok(());
    };
    // SAFETY: the union holds the remote address for RDMA opcodes.
    let remote = unsafe { wr.wr.rdma };
    let access = ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    if len > 0 && !memory::allows(remote.rkey, peer.pd, remote.remote_addr, len, access) {
        peer.fail();
        finish(
            qp,
            wr.wr_id,
            signaled,
            ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
            op,
            0,
        );
        return Ok(());
    }
    let source = remote.remote_addr as *const u8;
    // SAFETY: checked above; the bytes are the peer's, registered for remote read.
    let data = unsafe { slice::from_raw_parts(source, len as usize) }.to_vec();
    // SAFETY: per the contract.
    let status = unsafe { scatter(qp.pd, list, &data) };
    finish(qp, wr.wr_id, signaled, status, op, len as usize);
    Ok(())
}

/// Copies the bytes `list` names, each SGE checked against its lkey unless `inline`.
///
/// # Safety
/// As for [`execute`].
unsafe fn gather(qp: &QpShared, list: &[ibv_sge], inline: bool) -> Option<Vec<u8>> {
    let mut data = Vec::with_capacity(list.iter().map(|s| s.length as usize).sum());
    for sge in list {
        let (addr, len) = (sge.addr, u64::from(sge.length));
        if !inline && !memory::allows(sge.lkey, qp.pd, addr, len, 0) {
            return None;
        }
        // SAFETY: inside a region of this PD (or an inline source the caller lends for the
        // call); the verbs contract keeps it valid.
        data.extend_from_slice(unsafe { slice::from_raw_parts(addr as *const u8, len as usize) });
    }
    Some(data)
}

/// Scatters `data` into `list` (each SGE needs local write), in order.
///
/// # Safety
/// As for [`execute`], for the receive side's SGEs.
unsafe fn scatter(pd: usize, list: &[ibv_sge], mut data: &[u8]) -> ibv_wc_status::Type {
    let room: u64 = list.iter().map(|s| u64::from(s.length)).sum();
    if (data.len() as u64) > room {
        return ibv_wc_status::IBV_WC_LOC_LEN_ERR;
    }
    let write = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    for sge in list {
        if data.is_empty() {
            break;
        }
        let n = data.len().min(sge.length as usize);
        if !memory::allows(sge.lkey, pd, sge.addr, n as u64, write) {
            return ibv_wc_status::IBV_WC_LOC_PROT_ERR;
        }
        // SAFETY: inside a writable region of this PD, lent to the device by a posted receive.
        unsafe { std::ptr::copy(data.as_ptr(), sge.addr as *mut u8, n) };
        data = &data[n..];
    }
    ibv_wc_status::IBV_WC_SUCCESS
}
