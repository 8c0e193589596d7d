//! The soft-RoCE VM: boots Debian's stock kernel under qemu (TCG) with the host's root
//! mounted read-only over virtio-9p, brings up `rxe0` on a veth pair, and runs a
//! [`GuestPlan`] in that one boot.
//!
//! * [`packages`]: Debian packages needed on the host, installed on demand.
//! * [`kernel`]: finding the guest kernel and the modules the initramfs needs.
//! * [`cpio`], [`initramfs`]: the cached initramfs (busybox + modules + `init.sh`).
//! * [`plan`]: what to run, and the guest shell script generated from it.
//! * [`console`]: the marker lines the guest prints to report progress and exit codes.
//! * [`qemu`]: starting qemu and following its console with deadlines.
//!
//! The host's cargo target directory is shared read-write at its own path, so results
//! written under it in the guest appear on the host.

pub mod console;
pub mod cpio;
mod error;
pub mod initramfs;
pub mod kernel;
pub mod packages;
pub mod pair;
pub mod plan;
pub mod qemu;

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use error::VmError;
pub use pair::{run_pair, ServerReady};
pub use plan::{
    Action, GuestCommand, GuestPlan, PairLink, Ready, Step, GUEST_ADDR, GUEST_DEVICE, PAIR_LINKS,
};

/// How to run the VM.
#[derive(Debug, Clone)]
pub struct VmOptions {
    /// Overall limit from starting qemu to power-off; qemu is killed when it passes.
    pub timeout: Duration,
    /// Limit for booting up to a working `rxe0`.
    pub boot_timeout: Duration,
    /// Print the steps' console output on our stdout as it arrives.
    pub echo: bool,
    /// Also print the qemu command line, boot messages and qemu's stderr.
    pub verbose: bool,
}

impl Default for VmOptions {
    fn default() -> Self {
        VmOptions {
            timeout: Duration::from_secs(900),
            boot_timeout: Duration::from_secs(180),
            echo: true,
            verbose: false,
        }
    }
}

/// The result of one step of a plan.
#[derive(Debug, Clone)]
pub struct StepOutcome {
    /// The step's label.
    pub label: String,
    /// Exit code (124: the step's guest-side timeout fired; 128+n: killed by signal n).
    pub exit_code: i32,
    /// Wall time in the guest, measured on the host between the step's markers.
    pub elapsed: Duration,
    /// Console lines printed while the step ran (stdout and stderr of the command or client).
    pub output: Vec<String>,
    /// For a client/server step: the server's output.
    pub server_output: Option<String>,
}

impl StepOutcome {
    /// Whether the step exited with 0.
    pub fn success(&self) -> bool {
        self.exit_code == 0
    }
}

/// The result of one boot.
#[derive(Debug, Clone)]
pub struct VmReport {
    /// From starting qemu to `rxe0` being ready.
    pub boot_time: Duration,
    /// From starting qemu to the last step's end.
    pub total_time: Duration,
    /// One outcome per step, in plan order.
    pub steps: Vec<StepOutcome>,
}

/// Boots the VM once and runs `plan` in it.
pub fn run(plan: &GuestPlan, opts: &VmOptions) -> Result<VmReport, VmError> {
    run_linked(plan, opts, &[])
}

pub(crate) fn run_linked(
    plan: &GuestPlan,
    opts: &VmOptions,
    links: &[qemu::Link],
) -> Result<VmReport, VmError> {
    packages::ensure(packages::VM_PACKAGES)?;
    if !in_path(qemu::QEMU) {
        return Err(VmError::QemuMissing(qemu::QEMU.into()));
    }
    let kernel = kernel::Kernel::find()?;
    let target = crate::workspace::target_dir()?;
    let cache = target.join("softroce-vm");
    let initrd = initramfs::ensure(&kernel, &cache)?;

    let nonce = nonce();
    let run_dir = cache.join("runs").join(&nonce);
    std::fs::create_dir_all(&run_dir)
        .map_err(|e| VmError::io(format!("creating {}", run_dir.display()), e))?;
    let script = run_dir.join("guest.sh");
    std::fs::write(&script, plan.render(&nonce, &run_dir))
        .map_err(|e| VmError::io(format!("writing {}", script.display()), e))?;
    for path in [&target, &script] {
        if path.to_string_lossy().contains(char::is_whitespace) {
            return Err(VmError::Parse(format!(
                "path {} (paths on the kernel command line cannot contain whitespace)",
                path.display()
            )));
        }
    }

    let boot = qemu::Boot {
        kernel: &kernel,
        initrd: &initrd,
        share: &target,
        script: &script,
        nonce: &nonce,
        links,
    };
    let labels: Vec<String> = plan.steps.iter().map(|s| s.label.clone()).collect();
    let started = Instant::now();
    let result = qemu::run(&boot, &labels, opts);
    let total_time = started.elapsed();
    let console = match result {
        Ok(console) => console,
        Err(e) => {
            eprintln!(
                "[xtask vm] kept the guest script and logs in {}",
                run_dir.display()
            );
            return Err(e);
        }
    };
    let mut steps = console.steps;
    if steps.len() != plan.steps.len() {
        eprintln!("[xtask vm] kept the guest script in {}", run_dir.display());
        return Err(VmError::Parse(format!(
            "the guest console: {} of {} steps reported an exit code",
            steps.len(),
            plan.steps.len()
        )));
    }
    for (index, step) in steps.iter_mut().enumerate() {
        if matches!(
            plan.steps.get(index).map(|s| &s.action),
            Some(Action::ClientServer { .. })
        ) {
            let log = run_dir.join(format!("step-{index}.server.log"));
            step.server_output = std::fs::read_to_string(log).ok();
        }
    }
    let _ = std::fs::remove_dir_all(&run_dir);
    Ok(VmReport {
        boot_time: console.boot_time,
        total_time,
        steps,
    })
}

/// A token unique to this run, for marker lines and the run directory.
fn nonce() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{:x}-{:x}", std::process::id(), nanos & 0xffff_ffff_ffff)
}

fn in_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir: PathBuf| dir.join(program).is_file()))
        .unwrap_or(false)
}
