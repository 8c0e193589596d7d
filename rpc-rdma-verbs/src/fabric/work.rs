//! Executing one send-queue work request at post time: gather, check keys, deliver into the
//! peer, complete on both sides.

use std::os::raw::c_int;
use std::slice;

use rdma_sys::{
    ibv_access_flags, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc_flags, ibv_wc_opcode,
    ibv_wc_status, ibv_wr_opcode,
};

use super::memory;
use super::qp::{completion, NoRecv, QpShared, Recv};

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

/// What a work request came to on the sender's side.
struct Outcome {
    status: ibv_wc_status::Type,
    opcode: ibv_wc_opcode::Type,
    byte_len: u32,
}

/// Runs `wr` on `qp` now: `Err(errno)` if it cannot be posted at all (nothing happens then),
/// else its completion, if any, is on the send completion queue.
///
/// # Safety
/// `wr`'s SGE list is valid; the memory it and any rkey name is what the verbs contract
/// says (registered, not touched by safe code until the completion).
pub(super) unsafe fn execute(qp: &QpShared, wr: &ibv_send_wr) -> Result<(), c_int> {
    let n = usize::try_from(wr.num_sge).map_err(|_| libc::EINVAL)?;
    if n > super::device::MAX_SGE as usize {
        return Err(libc::EINVAL);
    }
    let signaled = qp.sq_sig_all || wr.send_flags & ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
    let outcome = if qp.in_error() {
        Outcome {
            status: ibv_wc_status::IBV_WC_WR_FLUSH_ERR,
            opcode: ibv_wc_opcode::IBV_WC_SEND,
            byte_len: 0,
        }
    } else {
        // SAFETY: per the contract.
        unsafe { run(qp, wr, sges(wr.sg_list, n)) }?
    };
    let ok = outcome.status == ibv_wc_status::IBV_WC_SUCCESS;
    if !ok {
        qp.fail();
    }
    if signaled || !ok {
        let mut wc = completion(wr.wr_id, qp.qp_num, outcome.status);
        wc.opcode = outcome.opcode;
        wc.byte_len = outcome.byte_len;
        qp.send_cq.push(wc);
    }
    Ok(())
}

/// # Safety
/// As for [`execute`].
unsafe fn run(qp: &QpShared, wr: &ibv_send_wr, list: &[ibv_sge]) -> Result<Outcome, c_int> {
    use ibv_wr_opcode::*;
    let outcome = |status, opcode, byte_len| Outcome {
        status,
        opcode,
        byte_len,
    };
    let inline = wr.send_flags & ibv_send_flags::IBV_SEND_INLINE.0 != 0;
    let imm = matches!(wr.opcode, IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE_WITH_IMM)
        // SAFETY: the union holds the immediate for these opcodes.
        .then(|| unsafe { wr.imm_data_invalidated_rkey_union.imm_data });
    match wr.opcode {
        IBV_WR_SEND | IBV_WR_SEND_WITH_IMM => {
            let op = ibv_wc_opcode::IBV_WC_SEND;
            // SAFETY: per the contract.
            let Some(data) = (unsafe { gather(qp, list, inline) }) else {
                return Ok(outcome(ibv_wc_status::IBV_WC_LOC_PROT_ERR, op, 0));
            };
            let status = deliver(qp, &data, imm, ibv_wc_opcode::IBV_WC_RECV, data.len());
            Ok(outcome(status, op, data.len() as u32))
        }
        IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => {
            let op = ibv_wc_opcode::IBV_WC_RDMA_WRITE;
            // SAFETY: per the contract.
            let Some(data) = (unsafe { gather(qp, list, inline) }) else {
                return Ok(outcome(ibv_wc_status::IBV_WC_LOC_PROT_ERR, op, 0));
            };
            let Some(peer) = qp.peer() else {
                return Ok(outcome(ibv_wc_status::IBV_WC_RETRY_EXC_ERR, op, 0));
            };
            // SAFETY: the union holds the remote address for RDMA opcodes.
            let remote = unsafe { wr.wr.rdma };
            if !data.is_empty() {
                let access = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
                let len = data.len() as u64;
                if !memory::allows(remote.rkey, peer.pd, remote.remote_addr, len, access) {
                    peer.fail();
                    return Ok(outcome(ibv_wc_status::IBV_WC_REM_ACCESS_ERR, op, 0));
                }
                // SAFETY: the key table says the peer registered these bytes for remote
                // write, and the verbs contract keeps them registered and untouched.
                unsafe { std::ptr::copy(data.as_ptr(), remote.remote_addr as *mut u8, data.len()) };
            }
            let status = match imm {
                Some(_) => deliver(
                    qp,
                    &[],
                    imm,
                    ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM,
                    data.len(),
                ),
                None => ibv_wc_status::IBV_WC_SUCCESS,
            };
            Ok(outcome(status, op, data.len() as u32))
        }
        IBV_WR_RDMA_READ => {
            let op = ibv_wc_opcode::IBV_WC_RDMA_READ;
            let Some(peer) = qp.peer() else {
                return Ok(outcome(ibv_wc_status::IBV_WC_RETRY_EXC_ERR, op, 0));
            };
            // SAFETY: the union holds the remote address for RDMA opcodes.
            let remote = unsafe { wr.wr.rdma };
            let len: u64 = list.iter().map(|s| u64::from(s.length)).sum();
            let access = ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
            if len > 0 && !memory::allows(remote.rkey, peer.pd, remote.remote_addr, len, access) {
                peer.fail();
                return Ok(outcome(ibv_wc_status::IBV_WC_REM_ACCESS_ERR, op, 0));
            }
            // SAFETY: checked above; the bytes are the peer's, registered for remote read.
            let data =
                unsafe { slice::from_raw_parts(remote.remote_addr as *const u8, len as usize) }
                    .to_vec();
            // SAFETY: per the contract.
            let status = unsafe { scatter(qp.pd, list, &data) };
            Ok(outcome(status, op, len as u32))
        }
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
            Ok(outcome(status, ibv_wc_opcode::IBV_WC_BIND_MW, 0))
        }
        IBV_WR_LOCAL_INV => {
            // SAFETY: the union holds the rkey for this opcode.
            let rkey = unsafe { wr.imm_data_invalidated_rkey_union.invalidated_rkey };
            let status = if memory::invalidate(rkey) {
                ibv_wc_status::IBV_WC_SUCCESS
            } else {
                ibv_wc_status::IBV_WC_LOC_PROT_ERR
            };
            Ok(outcome(status, ibv_wc_opcode::IBV_WC_LOCAL_INV, 0))
        }
        _ => Err(libc::EINVAL),
    }
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

/// Delivers a message into a receive of `qp`'s peer and completes it there; returns the
/// sender's status.
fn deliver(
    qp: &QpShared,
    data: &[u8],
    imm: Option<u32>,
    opcode: ibv_wc_opcode::Type,
    byte_len: usize,
) -> ibv_wc_status::Type {
    let Some(peer) = qp.peer() else {
        return ibv_wc_status::IBV_WC_RETRY_EXC_ERR;
    };
    let recv: Recv = match peer.take_recv() {
        Ok(recv) => recv,
        Err(NoRecv::Empty) => return ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR,
        Err(NoRecv::Error) => return ibv_wc_status::IBV_WC_RETRY_EXC_ERR,
    };
    let status = if opcode == ibv_wc_opcode::IBV_WC_RECV {
        // SAFETY: a posted receive lends its SGEs to the device until it completes.
        unsafe { scatter(peer.pd, &recv.sges, data) }
    } else {
        ibv_wc_status::IBV_WC_SUCCESS
    };
    let mut wc = completion(recv.wr_id, peer.qp_num, status);
    wc.opcode = opcode;
    wc.byte_len = byte_len as u32;
    wc.src_qp = qp.qp_num;
    if let Some(imm) = imm {
        wc.imm_data_invalidated_rkey_union.imm_data = imm;
        wc.wc_flags = ibv_wc_flags::IBV_WC_WITH_IMM.0;
    }
    let ok = status == ibv_wc_status::IBV_WC_SUCCESS;
    peer.recv_cq.push(wc);
    if !ok {
        peer.fail();
    }
    if ok {
        ibv_wc_status::IBV_WC_SUCCESS
    } else {
        ibv_wc_status::IBV_WC_REM_INV_REQ_ERR
    }
}
