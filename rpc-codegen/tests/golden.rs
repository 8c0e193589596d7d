//! The checked-in `tests/generated/echo.rs` (compiled and called by `tests/roundtrip.rs`)
//! must be exactly what the generator produces for `tests/protos/echo.proto`.
//!
//! After an intended change to the generated code, refresh it with
//! `RPC_CODEGEN_BLESS=1 cargo test -p rpc-codegen --test golden`.

mod common;

use std::fs;
use std::path::Path;

#[test]
fn checked_in_echo_output_is_current() {
    let out = common::generate(common::configure(), &["echo.proto"]).unwrap();
    let generated = out.package("echo");
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/generated/echo.rs");
    if std::env::var_os("RPC_CODEGEN_BLESS").is_some() {
        fs::create_dir_all(golden.parent().unwrap()).unwrap();
        fs::write(&golden, &generated).unwrap();
        return;
    }
    let expected = fs::read_to_string(&golden).unwrap_or_default();
    assert!(
        generated == expected,
        "{} is stale; regenerate it with \
         `RPC_CODEGEN_BLESS=1 cargo test -p rpc-codegen --test golden`\n\
         --- generated ---\n{generated}",
        golden.display()
    );
}
