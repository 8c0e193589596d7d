//! Errors of the VM runner: each says what is missing or what went wrong and what to do.

use std::time::Duration;

/// Everything that can stop the VM runner from producing a result.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// An I/O operation on the host failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A host command ran but failed.
    #[error("`{what}` failed:\n{detail}")]
    Command { what: String, detail: String },
    /// Output of a host tool could not be understood.
    #[error("cannot parse {0}")]
    Parse(String),
    /// Debian packages are missing and we cannot install them ourselves.
    #[error(
        "missing Debian packages: {missing}\n  install them as root with: \
         apt-get update && apt-get install -y {missing}"
    )]
    MissingPackages { missing: String },
    /// No qemu binary.
    #[error("`{0}` not found in PATH: install the Debian package qemu-system-x86")]
    QemuMissing(String),
    /// No usable guest kernel.
    #[error(
        "no Debian kernel with soft-RoCE found (looked for /boot/vmlinuz-* with \
         /lib/modules/<version>/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko): \
         install the Debian package linux-image-amd64{0}"
    )]
    KernelMissing(String),
    /// The VM did not reach the point where the commands run.
    #[error("the VM failed to boot: {reason}\n--- last console lines ---\n{log}")]
    BootFailed { reason: String, log: String },
    /// The guest's setup script reported a failure (module load, rxe setup, ...).
    #[error("guest setup failed: {reason}\n--- last console lines ---\n{log}")]
    GuestSetup { reason: String, log: String },
    /// The overall timeout expired; qemu was killed.
    #[error(
        "timed out after {limit:?} while {stage}; qemu was killed\n--- last console lines ---\n{log}"
    )]
    Timeout {
        limit: Duration,
        stage: String,
        log: String,
    },
    /// qemu exited before the plan finished.
    #[error("qemu exited ({status}) while {stage}\n--- qemu stderr ---\n{stderr}\n--- last console lines ---\n{log}")]
    QemuExited {
        status: String,
        stage: String,
        stderr: String,
        log: String,
    },
}

impl VmError {
    /// Wraps an I/O error with what we were doing.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        VmError::Io {
            context: context.into(),
            source,
        }
    }
}
