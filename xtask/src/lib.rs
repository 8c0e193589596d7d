//! Project automation for rdma-rpc, used through `cargo run -p xtask -- <subcommand>`.
//!
//! The host kernel has no InfiniBand, so everything that needs real verbs runs inside a
//! throw-away qemu VM booting Debian's stock kernel with soft-RoCE (`rdma_rxe`); see
//! `docs/SOFTROCE.md`.
//!
//! * [`vm`]: boot the VM, set up `rxe0`, run a [`vm::GuestPlan`] (a list of commands) in one
//!   boot and report each command's exit code and output.
//! * [`count`]: instructions and allocations per round trip over the in-memory verbs
//!   provider, under callgrind and dhat on the host.
//! * [`perftest`]: the perftest baseline (`ib_send_lat`, `ib_write_bw`, ...) as reusable plan
//!   steps plus a parser for their figures, so benchmarks can run it in the same boot.
//! * [`ucx`]: UCX's `ucx_perftest` (active messages) the same way, the peer framework we
//!   compare with.
//! * [`test_rdma`]: build the RDMA test binaries on the host and run them all in one boot.
//! * [`workspace`]: where the workspace and its target directory are.

pub mod count;
pub mod demo;
pub mod large_bodies;
pub mod perftest;
pub mod rpc_bench;
pub mod test_rdma;
pub mod ucx;
pub mod vm;
pub mod workspace;
