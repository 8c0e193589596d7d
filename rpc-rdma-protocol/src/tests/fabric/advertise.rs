//! The fabric's side of advertised response buffers: requests that offer one, and
//! responses in a slot.

use rpc_wire::{Flags, FrameKind, Header};

use super::Endpoint;
use crate::SendError;

impl Endpoint {
    /// Sends a request of `payload` bytes advertising a fresh `buffer` byte response
    /// buffer. Returns the call id and whether the buffer was advertised (the grant limit
    /// may refuse it; the request then goes without one).
    pub(crate) fn send_advertising(
        &mut self,
        payload: u32,
        buffer: u64,
    ) -> Result<(u64, bool), SendError> {
        let call_id = self.next_call;
        let mut header = Header::new(FrameKind::Request, call_id);
        header.payload_len = payload;
        header.method_id = 7;
        let (addr, rkey) = self.large.new_window(buffer);
        let advertised = match self.conn.advertise(call_id, addr, rkey, buffer) {
            Some(descriptor) => {
                self.large
                    .lend(descriptor.generation, addr, rkey, descriptor.len);
                header.flags = Flags::RESPONSE_BUFFER;
                header.remote = descriptor;
                true
            }
            None => {
                self.large.forget_window(addr, rkey);
                false
            }
        };
        self.absorb();
        let sent = self.write_frame(header).map(|()| {
            assert!(self.commit(true));
        });
        if let Err(e) = sent {
            if advertised {
                self.conn.withdraw_advertisement(call_id);
                self.absorb();
            }
            return Err(e);
        }
        self.next_call += 1;
        Ok((call_id, advertised))
    }

    /// Answers the peer's `call_id` with a response of `payload` bytes in a slot.
    pub(crate) fn respond(&mut self, call_id: u64, payload: u32) -> Result<(), SendError> {
        let mut header = Header::new(FrameKind::Response, call_id);
        header.payload_len = payload;
        self.write_frame(header)?;
        assert!(self.commit(true));
        Ok(())
    }
}
