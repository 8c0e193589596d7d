//! [`ReplySink`]: where a connection's response frames go.

/// Where a connection's response frames go; implemented by transports. A server needs
/// nothing of its connection but the sending that a client's transport also does.
pub use crate::frame::FrameSender as ReplySink;
