//! Helpers shared by the integration tests: run the generator into a temporary directory.

#![allow(dead_code)] // Each test crate uses a different subset.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// The generator's defaults, but for the runtime's path: these tests compile and call the
/// generated code against `rpc-core` itself, below the `rdma-rpc` facade that applications
/// (and the default path, `::rdma_rpc`) name.
pub fn configure() -> rpc_codegen::Builder {
    rpc_codegen::configure().core_path("::rpc_core")
}

/// `tests/protos`, the include directory of the fixtures.
pub fn protos_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/protos")
}

/// The output of one generator run.
pub struct Output {
    pub dir: TempDir,
}

impl Output {
    /// The generated file of `package`.
    pub fn package(&self, package: &str) -> String {
        let path = self.dir.path().join(format!("{package}.rs"));
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    }

    /// Names of the generated files, sorted.
    pub fn files(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

/// Runs `builder` on `protos` (relative to [`protos_dir`]) with [`protos_dir`] as include.
pub fn generate(builder: rpc_codegen::Builder, protos: &[&str]) -> io::Result<Output> {
    let dir = tempfile::tempdir()?;
    let include = protos_dir();
    let protos: Vec<PathBuf> = protos.iter().map(|p| include.join(p)).collect();
    builder
        .out_dir(dir.path())
        .emit_rerun_if_changed(false)
        .compile_protos(&protos, &[include])?;
    Ok(Output { dir })
}

/// Writes `files` (name, contents) into a fresh include directory and compiles `protos`.
pub fn generate_sources(
    builder: rpc_codegen::Builder,
    files: &[(&str, &str)],
    protos: &[&str],
) -> (TempDir, io::Result<Output>) {
    let include = tempfile::tempdir().unwrap();
    for (name, contents) in files {
        let path = include.path().join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
    }
    let result = (|| {
        let dir = tempfile::tempdir()?;
        let protos: Vec<PathBuf> = protos.iter().map(|p| include.path().join(p)).collect();
        builder
            .out_dir(dir.path())
            .emit_rerun_if_changed(false)
            .compile_protos(&protos, &[include.path()])?;
        Ok(Output { dir })
    })();
    (include, result)
}

/// Parses generated code, panicking with the code on a syntax error.
pub fn parse(code: &str) -> syn::File {
    syn::parse_file(code).unwrap_or_else(|e| panic!("generated code does not parse: {e}\n{code}"))
}
