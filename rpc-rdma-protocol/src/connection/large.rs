//! The large-body side of the connection's API: what the driver calls for bodies that move
//! by RDMA WRITE (rendezvous, grants, advertised response buffers) and the completions of
//! the WRITEs, window binds and invalidations it posts.

use rpc_wire::{Code, Flags, Header, RemoteBuffer};

use super::Connection;
use crate::error::{ProtocolViolation, SendError};
use crate::large::{BodyId, BodyStart, LocalBuffer};
use crate::send_ring::Pending;

impl Connection {
    /// Posts the WRITEs and READs the write window allows, and commits the large-body
    /// path's header-only frames to the ring while it has room.
    pub(super) fn flush_large(&mut self) {
        self.large.pump_writes(&mut self.actions);
        self.large.pump_reads(&mut self.actions);
        while let Some(frame) = self.large.next_frame() {
            let Some((_, seq)) = self.send.reserve() else {
                break;
            };
            let frame = *frame;
            self.large.pop_frame();
            let committed = self.send.commit(
                seq,
                Pending {
                    len: frame.encoded_len() as u32,
                    kind: frame.kind,
                    call_id: frame.call_id,
                    frame: Some(frame),
                },
            );
            debug_assert!(committed);
        }
    }

    /// Reads the bodies the peer offers only once their notice came, so that
    /// [`Connection::offered_method`] names the method when [`Action::ReadNeeded`] asks
    /// for memory (a server with landings for some methods). Offers waiting for their
    /// notice hold no memory; more than `max_queued` of them is a violation, as a writer
    /// sends each notice right behind its offer. Set before the peer's first frame.
    pub fn read_after_notice(&mut self) {
        self.large.read_after_notice();
    }

    /// The method of `body`'s request, offered for reading, once its notice came and while
    /// the memory it lands in is still to be lent (answering [`Action::ReadNeeded`]).
    pub fn offered_method(&self, body: BodyId) -> Option<u32> {
        self.large
            .offered_notice(body)
            .filter(|notice| notice.kind == rpc_wire::FrameKind::Request)
            .map(|notice| notice.method_id)
    }

    /// Starts sending a body too large for a slot: `notice` is the request, response or
    /// stream message header (lengths describe the body: metadata, then payload), `local` the registered
    /// memory the body was encoded into, which the driver keeps until
    /// [`Action::TransferDone`] or [`Action::TransferFailed`] names the returned transfer.
    pub fn start_large(&mut self, notice: &Header, local: LocalBuffer) -> Result<u32, SendError> {
        if self.closed.is_some() {
            return Err(SendError::Closed);
        }
        self.check_advertisement(notice)?;
        let id = self.large.start(*notice, local)?;
        self.flush();
        Ok(id)
    }

    /// Starts sending a request body too large for a slot by offering it for the peer to
    /// RDMA READ: `notice` and `local` as for [`Connection::start_large`], `rkey` the key of
    /// the window the driver binds over the body's bytes with remote read access
    /// ([`Action::BindSource`] follows, before the offer is posted). The driver keeps the
    /// body and the window until [`Action::TransferDone`] or [`Action::TransferFailed`],
    /// which come after [`Action::InvalidateSource`] completed. With as many windows open
    /// to the peer as `max_grants` allows, the body goes by the rendezvous instead
    /// ([`BodyStart::Written`]) and the window is not used.
    pub fn start_source(
        &mut self,
        notice: &Header,
        local: LocalBuffer,
        rkey: u32,
    ) -> Result<BodyStart, SendError> {
        if self.closed.is_some() {
            return Err(SendError::Closed);
        }
        self.check_advertisement(notice)?;
        let id = self
            .large
            .start_source(*notice, local, rkey, &mut self.actions)?;
        self.flush();
        Ok(id)
    }

    /// Answers [`Action::ReadNeeded`]: the driver lent `len` bytes at `local` for the body;
    /// [`Action::PostRead`]s follow. `None` if the offer went away meanwhile (its call was
    /// cancelled), or `len` is short of the body (the offer is refused): take the buffer
    /// back.
    pub fn read_into(&mut self, body: BodyId, local: LocalBuffer, len: u64) -> Option<u32> {
        if self.closed.is_some() {
            return None;
        }
        let id = self.large.read_into(body, local, len, &mut self.actions);
        self.flush();
        id
    }

    /// Advertises `len` bytes at `addr` as the buffer for the response to `call_id`, which
    /// the driver makes writable by binding a memory window with `rkey`
    /// ([`Action::BindWindow`] follows, before any send posted after this call). Put the
    /// returned descriptor in the request's header with [`Flags::RESPONSE_BUFFER`]. `None`
    /// when no buffer can be advertised now (grant limit): send the request without one.
    ///
    /// The buffer stays writable until the response arrives (placed in it, or in a slot),
    /// the peer asks for a larger one, or the peer releases it after a cancel; then
    /// [`Action::ReleaseGrant`] or [`Action::DeliverLarge`] names the grant (its
    /// `generation`). If the request is not sent after all, call
    /// [`Connection::withdraw_advertisement`].
    pub fn advertise(
        &mut self,
        call_id: u64,
        addr: u64,
        rkey: u32,
        len: u64,
    ) -> Option<RemoteBuffer> {
        if self.closed.is_some() {
            return None;
        }
        let descriptor = self
            .large
            .advertise(call_id, addr, rkey, len, &mut self.actions)?;
        self.flush();
        Some(descriptor)
    }

    /// The request that was to advertise a response buffer for `call_id` was not sent:
    /// revoke the buffer.
    pub fn withdraw_advertisement(&mut self, call_id: u64) {
        if self.closed.is_some() {
            return;
        }
        self.large.end_advertisement(call_id, &mut self.actions);
        self.flush();
    }

    /// Answers [`Action::GrantNeeded`]: the driver lent `len` bytes at `addr` and will bind a
    /// memory window over them with `rkey` ([`Action::BindWindow`] follows). `None` if the
    /// request went away meanwhile (its call was cancelled): take the buffer back.
    pub fn grant(&mut self, body: BodyId, addr: u64, rkey: u32, len: u64) -> Option<u32> {
        if self.closed.is_some() {
            return None;
        }
        let id = self.large.grant(body, addr, rkey, len, &mut self.actions)?;
        self.flush();
        Some(id)
    }

    /// Answers [`Action::GrantNeeded`] with a refusal (`status`, e.g. `RESOURCE_EXHAUSTED`
    /// when the buffer budget is spent, and the most that could be lent, 0 if unknown); the
    /// peer fails the call with it.
    pub fn refuse(&mut self, body: BodyId, status: Code, limit: u64) {
        if self.closed.is_some() {
            return;
        }
        self.large.refuse(body, status, limit, &mut self.actions);
        self.flush();
    }

    /// An RDMA WRITE of `transfer` completed.
    pub fn on_write_complete(&mut self, transfer: u32) -> Result<(), ProtocolViolation> {
        if self.closed.is_some() {
            return Ok(());
        }
        if let Err(violation) = self.large.on_write_complete(transfer, &mut self.actions) {
            return Err(self.fail(violation));
        }
        self.flush();
        Ok(())
    }

    /// An RDMA READ into `grant`'s buffer completed.
    pub fn on_read_complete(&mut self, grant: u32) -> Result<(), ProtocolViolation> {
        if self.closed.is_some() {
            return Ok(());
        }
        if let Err(violation) = self.large.on_read_complete(grant, &mut self.actions) {
            return Err(self.fail(violation));
        }
        self.flush();
        Ok(())
    }

    /// Whether the body read into `grant` is all in and waits for its notice, which the
    /// peer sent right behind its offer: the driver times how long (a peer that never
    /// sends it holds the buffer, as with a grant it never writes).
    pub fn read_awaits_notice(&self, grant: u32) -> bool {
        self.large.read_awaits_notice(grant)
    }

    /// The invalidation of the window over `transfer`'s offered body completed.
    pub fn on_source_invalidated(&mut self, transfer: u32) -> Result<(), ProtocolViolation> {
        if self.closed.is_some() {
            return Ok(());
        }
        if let Err(violation) = self
            .large
            .on_source_invalidated(transfer, &mut self.actions)
        {
            return Err(self.fail(violation));
        }
        self.flush();
        Ok(())
    }

    /// The window bind of `grant` completed.
    pub fn on_bind_complete(&mut self, grant: u32) -> Result<(), ProtocolViolation> {
        if self.closed.is_some() {
            return Ok(());
        }
        self.large
            .on_bind_complete(grant)
            .map_err(|violation| self.fail(violation))
    }

    /// The invalidation of `grant`'s rkey completed.
    pub fn on_invalidated(&mut self, grant: u32) -> Result<(), ProtocolViolation> {
        if self.closed.is_some() {
            return Ok(());
        }
        if let Err(violation) = self.large.on_invalidated(grant, &mut self.actions) {
            return Err(self.fail(violation));
        }
        self.flush();
        Ok(())
    }

    /// A request may carry a response-buffer descriptor only as [`Connection::advertise`]
    /// made it.
    pub(super) fn check_advertisement(&self, header: &Header) -> Result<(), SendError> {
        if header.flags.contains(Flags::RESPONSE_BUFFER) {
            self.large.check_advertised(header)
        } else {
            Ok(())
        }
    }
}
