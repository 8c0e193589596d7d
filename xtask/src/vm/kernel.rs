//! The guest kernel: a Debian `vmlinuz` whose module tree has soft-RoCE, and the modules
//! the initramfs needs to mount the host's root over virtio-9p.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::VmError;

/// Modules (with their dependencies, which `modprobe --show-depends` resolves) that the
/// initramfs loads to mount the host's root: virtio PCI transport, 9p over virtio.
pub const INITRAMFS_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p"];

/// A kernel image plus its module tree.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// `uname -r` of the kernel, e.g. `6.1.0-56-amd64`.
    pub version: String,
    /// `/boot/vmlinuz-<version>`.
    pub image: PathBuf,
}

impl Kernel {
    /// The newest `/boot/vmlinuz-*` whose modules include `rdma_rxe`.
    pub fn find() -> Result<Kernel, VmError> {
        let entries = std::fs::read_dir("/boot").map_err(|e| VmError::io("reading /boot", e))?;
        let mut found: Vec<Kernel> = entries
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let version = name.strip_prefix("vmlinuz-")?.to_string();
                let rxe = Path::new("/lib/modules")
                    .join(&version)
                    .join("kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko");
                rxe.exists().then(|| Kernel {
                    image: entry.path(),
                    version,
                })
            })
            .collect();
        found.sort_by(|a, b| version_cmp(&a.version, &b.version));
        found
            .pop()
            .ok_or_else(|| VmError::KernelMissing(String::new()))
    }

    /// Module files (absolute host paths) to insmod in this order, dependencies first.
    pub fn module_files(&self, modules: &[&str]) -> Result<Vec<PathBuf>, VmError> {
        let mut files: Vec<PathBuf> = Vec::new();
        for module in modules {
            let output = Command::new("modprobe")
                .args(["--show-depends", "-S", &self.version, module])
                .output()
                .map_err(|e| VmError::io("running modprobe --show-depends", e))?;
            if !output.status.success() {
                return Err(VmError::Command {
                    what: format!("modprobe --show-depends -S {} {module}", self.version),
                    detail: String::from_utf8_lossy(&output.stderr).into_owned(),
                });
            }
            for line in String::from_utf8_lossy(&output.stdout).lines() {
                // "insmod /lib/modules/.../virtio.ko [params]" or "builtin virtio".
                let Some(path) = line.strip_prefix("insmod ") else {
                    continue;
                };
                let path = PathBuf::from(path.split_whitespace().next().unwrap_or_default());
                if path.extension().is_none_or(|ext| ext != "ko") {
                    return Err(VmError::Parse(format!(
                        "module {} (compressed modules are not supported)",
                        path.display()
                    )));
                }
                if !files.contains(&path) {
                    files.push(path);
                }
            }
        }
        Ok(files)
    }
}

/// Orders kernel versions numerically field by field ("6.1.0-56" > "6.1.0-9").
fn version_cmp(a: &str, b: &str) -> Ordering {
    let fields = |s: &str| -> Vec<u64> {
        s.split(|c: char| !c.is_ascii_digit())
            .filter(|f| !f.is_empty())
            .filter_map(|f| f.parse().ok())
            .collect()
    };
    fields(a).cmp(&fields(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically() {
        assert_eq!(
            version_cmp("6.1.0-56-amd64", "6.1.0-9-amd64"),
            Ordering::Greater
        );
        assert_eq!(
            version_cmp("6.10.0-1-amd64", "6.9.0-1-amd64"),
            Ordering::Greater
        );
    }
}
