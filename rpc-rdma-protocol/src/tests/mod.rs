//! Tests of the whole state machine: two connections over an in-memory RC fabric
//! ([`fabric`]), scripted scenarios, hostile input, and random interleavings.

mod advertise;
pub(crate) mod fabric;
mod hostile;
pub(crate) mod large;
mod large_stream;
mod lending;
mod random;
mod random_large;
mod read;
mod read_after_notice;
mod scenarios;
mod shared;
