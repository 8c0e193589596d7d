//! The `grpc_request` target of `rpc-fuzz` (see its documentation there), under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rpc_fuzz::run("grpc_request", data));
