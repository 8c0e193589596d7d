//! The workspace root, its cargo target directory, and the result files written there.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::vm::VmError;

/// The workspace root (the parent of this crate's manifest directory).
pub fn root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// The cargo target directory, as `cargo metadata` reports it (honours `CARGO_TARGET_DIR`).
pub fn target_dir() -> Result<PathBuf, VmError> {
    let output = Command::new(cargo())
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root())
        .output()
        .map_err(|e| VmError::io("running `cargo metadata`", e))?;
    if !output.status.success() {
        return Err(VmError::Command {
            what: "cargo metadata".into(),
            detail: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    let meta: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| VmError::Parse(format!("cargo metadata output: {e}")))?;
    meta.get("target_directory")
        .and_then(|v| v.as_str())
        .map(PathBuf::from)
        .ok_or_else(|| VmError::Parse("cargo metadata has no target_directory".into()))
}

/// The cargo binary that runs us (`$CARGO`), or `cargo` from `PATH`.
pub fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Writes `value` as pretty-printed JSON, and a newline, to `path`.
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), VmError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| VmError::Parse(e.to_string()))?;
    std::fs::write(path, text + "\n")
        .map_err(|e| VmError::io(format!("writing {}", path.display()), e))
}
