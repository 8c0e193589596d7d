//! Debian packages the VM runner needs on the host, installed on demand.

use std::process::{Command, Stdio};

use super::VmError;

/// Packages needed to boot the soft-RoCE VM and run verbs programs and perftest in it
/// (the guest runs the host's own userland over 9p).
pub const VM_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "linux-image-amd64",
    "busybox-static",
    "kmod",
    "iproute2",
    "rdma-core",
    "ibverbs-providers",
    "ibverbs-utils",
    "rdmacm-utils",
    "perftest",
    // ucx_perftest: UCX active messages, the peer framework the demo compares with.
    "ucx-utils",
    // Prints the stacks of a test binary that outlived its timeout.
    "gdb",
];

/// Packages needed to build the RDMA crates (`rdma-sys` runs bindgen and pkg-config).
pub const BUILD_PACKAGES: &[&str] = &[
    "libibverbs-dev",
    "librdmacm-dev",
    "libclang-dev",
    "pkg-config",
];

/// Python packages the host tests use (module, pinned PyPI requirement): gRPC's Python
/// client, its health checker and its reflection client, the peers the `grpc://` tests run
/// against
/// (`examples/tests/grpc_interop.rs`).
pub const PYTHON_PACKAGES: &[(&str, &str)] = &[
    ("grpc", "grpcio==1.85.3"),
    ("grpc_tools", "grpcio-tools==1.85.1"),
    ("grpc_health", "grpcio-health-checking==1.85.1"),
    ("grpc_reflection", "grpcio-reflection==1.85.1"),
];

/// Installs whichever of the Python `packages` cannot be imported (`pip install`), and does
/// nothing when all can.
pub fn ensure_python(packages: &[(&str, &str)]) -> Result<(), VmError> {
    let importable = |module: &str| {
        Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(module, _)| !importable(module))
        .map(|(_, requirement)| *requirement)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!(
        "[xtask] installing missing Python packages: {}",
        missing.join(" ")
    );
    let status = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet"])
        .args(&missing)
        .status()
        .map_err(|e| VmError::io("running python3 -m pip (is python3 with pip installed?)", e))?;
    if status.success() {
        Ok(())
    } else {
        Err(VmError::Command {
            what: format!("pip install {}", missing.join(" ")),
            detail: status.to_string(),
        })
    }
}

/// Installs whichever of `packages` are missing (`apt-get update` + `apt-get install`), and
/// does nothing (no apt at all) when all are installed.
pub fn ensure(packages: &[&str]) -> Result<(), VmError> {
    let missing = missing(packages)?;
    if missing.is_empty() {
        return Ok(());
    }
    let list = missing.join(" ");
    if !is_root() {
        return Err(VmError::MissingPackages { missing: list });
    }
    eprintln!("[xtask vm] installing missing Debian packages: {list}");
    apt(&["update"])?;
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend(missing.iter().map(String::as_str));
    apt(&install)?;
    let still = self::missing(packages)?;
    if still.is_empty() {
        Ok(())
    } else {
        Err(VmError::MissingPackages {
            missing: still.join(" "),
        })
    }
}

/// The subset of `packages` that dpkg does not report as installed.
pub fn missing(packages: &[&str]) -> Result<Vec<String>, VmError> {
    let mut missing = Vec::new();
    for &package in packages {
        let status = Command::new("dpkg-query")
            .args(["-W", "-f=${db:Status-Abbrev}", package])
            .stderr(Stdio::null())
            .output()
            .map_err(|e| VmError::io("running dpkg-query (is this a Debian system?)", e))?;
        let installed = status.status.success() && status.stdout.starts_with(b"ii");
        if !installed {
            missing.push(package.to_string());
        }
    }
    Ok(missing)
}

fn apt(args: &[&str]) -> Result<(), VmError> {
    let status = Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .map_err(|e| VmError::io("running apt-get", e))?;
    if status.success() {
        Ok(())
    } else {
        Err(VmError::Command {
            what: format!("apt-get {}", args.join(" ")),
            detail: status.to_string(),
        })
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.trim_ascii() == b"0")
        .unwrap_or(false)
}
