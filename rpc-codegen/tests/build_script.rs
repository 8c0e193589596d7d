//! Running as a build script: `rpc_codegen::compile_protos` writes into `OUT_DIR` and prints
//! `cargo:rerun-if-changed` lines. The run happens in a child process (this test binary,
//! re-executed) so that `OUT_DIR` is set for it alone.

mod common;

use std::process::Command;

const CHILD_ENV: &str = "RPC_CODEGEN_TEST_CHILD";

#[test]
fn shorthand_writes_to_out_dir_and_prints_rerun_lines() {
    let out_dir = tempfile::tempdir().unwrap();
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("OUT_DIR", out_dir.path())
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let protos = common::protos_dir();
    let proto_line = format!(
        "cargo:rerun-if-changed={}",
        protos.join("echo.proto").display()
    );
    let include_line = format!("cargo:rerun-if-changed={}\n", protos.display());
    assert!(stdout.contains(&proto_line), "{stdout}");
    assert!(stdout.contains(&include_line), "{stdout}");

    let echo = std::fs::read_to_string(out_dir.path().join("echo.rs")).unwrap();
    assert!(echo.contains("pub mod echo_client"));
}

#[test]
#[ignore = "run in a child process by shorthand_writes_to_out_dir_and_prints_rerun_lines"]
fn child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    rpc_codegen::compile_protos(common::protos_dir().join("echo.proto")).unwrap();
}
