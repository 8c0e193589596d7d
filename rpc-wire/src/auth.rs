//! Sizes of the connection handshake's authentication fields (the hello a client sends when
//! it connects, the proof a server answers with); `rpc_core::auth` makes and checks them.

/// Bytes of a client's hello.
pub const HELLO_LEN: usize = 32;
/// Bytes of the server's proof.
pub const PROOF_LEN: usize = 16;
