//! rpc-bench: latency and throughput of the echo service over `tcp://` and `rdma://`, with a
//! tonic baseline and a raw-TCP floor for comparison.
//!
//! The `rpc-bench` binary (`src/bin/rpc-bench.rs`) is a thin shell over these modules:
//!
//! * [`cli`]: the command line (clap).
//! * [`result`]: [`BenchResult`], the JSON object a run prints with `--json`.
//! * [`payload`]: request payloads and the check every reply must pass.
//! * [`clock`]: the cycle-counter clock samples are timed with.
//! * [`recorder`]: per-call latency histogram, progress line, summary.
//! * [`ours`]: the echo service over rdma-rpc (server, blocking and concurrent clients).
//! * [`tonic_echo`]: the same echo service over tonic (gRPC over HTTP/2).
//! * [`floor`]: a raw length-prefixed ping-pong over a plain `TcpStream`.
//! * [`compare`]: `tcp-compare`, the three of them side by side (and ours over TLS).
//! * [`tls`]: a throwaway certificate for the `tcps://` runs.
//! * [`fleet`]: `connections`, many connections to one server process and what they cost it.
//! * [`error`]: [`BenchError`] and the process exit codes.

pub mod cli;
pub mod clock;
pub mod compare;
pub mod error;
pub mod fleet;
pub mod floor;
pub mod ours;
pub mod payload;
pub mod recorder;
pub mod result;
pub mod streaming;
pub mod tls;
pub mod tonic_echo;

pub use error::BenchError;
pub use result::BenchResult;
