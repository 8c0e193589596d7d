//! Encoding message bodies straight into a transport's own memory.
//!
//! A transport asks for [`EncodeBody::encoded_len`], carves exactly that many bytes out of
//! its buffer (a registered ring slot, a socket write buffer) and lets the body write itself
//! there with [`EncodeBody::encode_into`]. No intermediate `Vec` exists per call.

/// A value that can serialize itself into a caller-provided byte slice.
///
/// Implemented for every [`prost::Message`]; object safe so that server handlers can return
/// type-erased responses.
pub trait EncodeBody: Send + Sync {
    /// Exact number of bytes [`EncodeBody::encode_into`] writes.
    fn encoded_len(&self) -> usize;

    /// Writes the encoding into `dst`, which is exactly [`EncodeBody::encoded_len`] bytes long.
    fn encode_into(&self, dst: &mut [u8]);
}

impl<M: prost::Message> EncodeBody for M {
    fn encoded_len(&self) -> usize {
        prost::Message::encoded_len(self)
    }

    fn encode_into(&self, mut dst: &mut [u8]) {
        // `&mut [u8]` is a `BufMut` that advances in place: prost writes into the slot itself.
        prost::Message::encode_raw(self, &mut dst);
        debug_assert!(dst.is_empty(), "encoded_len disagreed with encode_raw");
    }
}

/// Raw bytes used as a body (status messages, pre-encoded payloads).
#[derive(Debug, Clone, Copy)]
pub struct RawBody<'a>(pub &'a [u8]);

impl EncodeBody for RawBody<'_> {
    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn encode_into(&self, dst: &mut [u8]) {
        dst.copy_from_slice(self.0);
    }
}

/// The empty body.
#[derive(Debug, Clone, Copy, Default)]
pub struct EmptyBody;

impl EncodeBody for EmptyBody {
    fn encoded_len(&self) -> usize {
        0
    }

    fn encode_into(&self, _dst: &mut [u8]) {}
}
