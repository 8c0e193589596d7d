//! One module per target: `run` feeds it an input, `seeds` makes valid ones.

pub(crate) mod connect_params;
pub(crate) mod connection;
pub(crate) mod grpc_request;
pub(crate) mod header;
pub(crate) mod stream_inbox;
pub(crate) mod tcp_frames;
pub(crate) mod tcp_preface;
