//! Services shared by the demo binaries, the integration tests and the benchmarks.
//!
//! * [`echo`]: generated from `proto/echo.proto`; [`EchoService`] implements it.
//! * [`testing`] (package `rpc.testing`): generated from `proto/testing.proto`; [`Tester`] sleeps or fails on
//!   request and counts what happened, so tests can observe the server.
//! * [`streaming`] (package `rpc.streaming`): generated from `proto/streaming.proto`;
//!   [`Streamer`] produces, consumes and echoes streams.

pub mod echo {
    //! Generated from `proto/echo.proto`.
    rpc_core::include_proto!("echo");
}

pub mod rpc {
    //! Protobuf package `rpc`.
    pub mod testing {
        //! Generated from `proto/testing.proto` (package `rpc.testing`).
        rpc_core::include_proto!("rpc.testing");
    }
    pub mod streaming {
        //! Generated from `proto/streaming.proto` (package `rpc.streaming`).
        rpc_core::include_proto!("rpc.streaming");
    }
}

pub use rpc::{streaming, testing};

mod services;
mod streamer;

pub use services::{bulk_pattern, EchoService, Tester, TesterStats};
pub use streamer::{ChunkStream, Streamer, StreamerStats, STOP_AFTER};
