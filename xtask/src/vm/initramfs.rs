//! The VM's initramfs: busybox, the virtio/9p modules and `init.sh`, cached on disk and
//! rebuilt only when one of its inputs changes (a hash stamp next to the archive).

use std::fs;
use std::path::{Path, PathBuf};

use super::cpio::Archive;
use super::kernel::{Kernel, INITRAMFS_MODULES};
use super::VmError;

/// The init script (PID 1 in the guest).
pub const INIT_SCRIPT: &str = include_str!("init.sh");
/// Statically linked busybox from Debian's `busybox-static`.
pub const BUSYBOX: &str = "/bin/busybox";
/// Bump when the archive layout changes in a way the other inputs do not capture.
const LAYOUT_VERSION: &str = "xtask-initramfs-v1";

/// Returns the path of an up-to-date initramfs for `kernel` under `cache_dir`, building it
/// if the stamp does not match the current inputs.
pub fn ensure(kernel: &Kernel, cache_dir: &Path) -> Result<PathBuf, VmError> {
    let modules = kernel.module_files(INITRAMFS_MODULES)?;
    let busybox = fs::read(BUSYBOX).map_err(|e| {
        VmError::io(
            format!("reading {BUSYBOX} (install the Debian package busybox-static)"),
            e,
        )
    })?;
    let mut module_data = Vec::with_capacity(modules.len());
    for path in &modules {
        let data =
            fs::read(path).map_err(|e| VmError::io(format!("reading {}", path.display()), e))?;
        module_data.push((path, data));
    }

    let mut hash = Fnv1a::new();
    hash.update(LAYOUT_VERSION.as_bytes());
    hash.update(kernel.version.as_bytes());
    hash.update(INIT_SCRIPT.as_bytes());
    hash.update(&busybox);
    for (path, data) in &module_data {
        hash.update(path.as_os_str().as_encoded_bytes());
        hash.update(data);
    }
    let stamp = format!("{:016x}", hash.finish());

    let archive_path = cache_dir.join(format!("initramfs-{}.cpio", kernel.version));
    let stamp_path = archive_path.with_extension("cpio.stamp");
    let fresh =
        archive_path.exists() && fs::read_to_string(&stamp_path).is_ok_and(|s| s.trim() == stamp);
    if fresh {
        return Ok(archive_path);
    }

    eprintln!(
        "[xtask vm] building initramfs for {} ({} modules) in {}",
        kernel.version,
        module_data.len(),
        cache_dir.display()
    );
    fs::create_dir_all(cache_dir)
        .map_err(|e| VmError::io(format!("creating {}", cache_dir.display()), e))?;
    let bytes =
        build(&busybox, &module_data).map_err(|e| VmError::io("writing the initramfs", e))?;
    // Write then rename, so that a concurrent run never boots a half-written archive.
    let tmp = archive_path.with_extension(format!("cpio.tmp{}", std::process::id()));
    fs::write(&tmp, bytes).map_err(|e| VmError::io(format!("writing {}", tmp.display()), e))?;
    fs::rename(&tmp, &archive_path)
        .map_err(|e| VmError::io(format!("renaming {}", tmp.display()), e))?;
    fs::write(&stamp_path, &stamp)
        .map_err(|e| VmError::io(format!("writing {}", stamp_path.display()), e))?;
    Ok(archive_path)
}

fn build(busybox: &[u8], modules: &[(&PathBuf, Vec<u8>)]) -> std::io::Result<Vec<u8>> {
    let mut archive = Archive::new(Vec::new());
    for dir in [
        "bin",
        "dev",
        "etc",
        "lib",
        "lib/modules",
        "mnt",
        "mnt/root",
        "proc",
        "sys",
        "tmp",
    ] {
        archive.dir(dir)?;
    }
    archive.char_device("dev/console", 0o600, 5, 1)?;
    archive.file("bin/busybox", 0o755, busybox)?;
    archive.file("init", 0o755, INIT_SCRIPT.as_bytes())?;
    let mut order = String::new();
    for (path, data) in modules {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("module.ko");
        let guest_path = format!("lib/modules/{name}");
        archive.file(&guest_path, 0o644, data)?;
        order.push('/');
        order.push_str(&guest_path);
        order.push('\n');
    }
    archive.file("etc/modules.order", 0o644, order.as_bytes())?;
    archive.finish()
}

/// 64-bit FNV-1a: a stable, dependency-free hash for the cache stamp.
struct Fnv1a(u64);

impl Fnv1a {
    fn new() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }

    fn update(&mut self, bytes: &[u8]) {
        // Length-prefix each input so that ("ab","c") and ("a","bc") differ.
        for &b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
