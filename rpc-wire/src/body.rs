//! Encoding message bodies straight into a transport's own memory.
//!
//! A transport asks for [`EncodeBody::encoded_len`], carves exactly that many bytes out of
//! its buffer (a registered ring slot, a socket write buffer) and lets the body write itself
//! there with [`EncodeBody::encode_into`]. No intermediate `Vec` exists per call. A
//! transport that can send bytes from where they lie (an application's registered memory)
//! uses [`EncodeBody::encode_gathered`] instead, and copies only the rest.

mod gather;

pub use gather::Gather;
use gather::Gathering;

/// A value that can serialize itself into a caller-provided byte slice.
///
/// Implemented for every [`prost::Message`]; object safe so that server handlers can return
/// type-erased responses.
pub trait EncodeBody: Send + Sync {
    /// Exact number of bytes [`EncodeBody::encode_into`] writes.
    fn encoded_len(&self) -> usize;

    /// Writes the encoding into `dst`, which is exactly [`EncodeBody::encoded_len`] bytes long.
    fn encode_into(&self, dst: &mut [u8]);

    /// Encodes like [`EncodeBody::encode_into`], but offers `gather` every run of bytes the
    /// message holds in one piece (a protobuf `bytes` field held as [`bytes::Bytes`]) and
    /// leaves out the runs it takes: `dst` receives the rest back to back. Without `dst`
    /// nothing is written: the call only counts, making the same offers, so that a first
    /// pass sizes the buffer of a second. Returns the bytes written (or that would be).
    ///
    /// The default offers nothing: a body that is not a prost message is written whole.
    fn encode_gathered(&self, dst: Option<&mut [u8]>, gather: &mut dyn Gather) -> usize {
        let _ = gather;
        if let Some(dst) = dst {
            self.encode_into(dst);
        }
        self.encoded_len()
    }
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

    fn encode_gathered(&self, dst: Option<&mut [u8]>, gather: &mut dyn Gather) -> usize {
        let mut buf = Gathering::new(dst, gather);
        prost::Message::encode_raw(self, &mut buf);
        buf.written()
    }
}

/// A body of any type, shared: cheap to clone (a retry sends the same message again), and
/// still encoded straight into the transport's memory.
#[derive(Clone)]
pub struct SharedBody(std::sync::Arc<dyn EncodeBody>);

impl SharedBody {
    /// Shares `body`.
    pub fn new(body: impl EncodeBody + 'static) -> SharedBody {
        SharedBody(std::sync::Arc::new(body))
    }
}

impl std::fmt::Debug for SharedBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBody")
            .field("len", &self.0.encoded_len())
            .finish()
    }
}

impl EncodeBody for SharedBody {
    fn encoded_len(&self) -> usize {
        self.0.encoded_len()
    }

    fn encode_into(&self, dst: &mut [u8]) {
        self.0.encode_into(dst);
    }

    fn encode_gathered(&self, dst: Option<&mut [u8]>, gather: &mut dyn Gather) -> usize {
        self.0.encode_gathered(dst, gather)
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
