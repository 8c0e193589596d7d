//! Boots qemu and follows the guest console until the plan is done, a deadline passes, or
//! qemu dies; qemu is always reaped (killed if need be) before returning.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::console::{self, Event, Tail};
use super::kernel::Kernel;
use super::{StepOutcome, VmError, VmOptions};

/// The qemu binary.
pub const QEMU: &str = "qemu-system-x86_64";

/// Everything needed to start the VM.
#[derive(Debug)]
pub struct Boot<'a> {
    pub kernel: &'a Kernel,
    pub initrd: &'a Path,
    /// Host directory shared read-write, mounted in the guest at the same path.
    pub share: &'a Path,
    /// Guest script path (a host path, visible in the guest).
    pub script: &'a Path,
    pub nonce: &'a str,
    /// Network links to another VM, if any.
    pub links: &'a [Link],
}

/// One end of a link between two VMs: a virtio network device whose Ethernet frames go
/// to the other end as UDP datagrams on the host's loopback (qemu's `socket` netdev).
#[derive(Debug, Clone)]
pub struct Link {
    /// Host UDP port this end receives on.
    pub local_port: u16,
    /// Host UDP port of the other end.
    pub remote_port: u16,
    /// This end's MAC address.
    pub mac: String,
}

/// What the console told us.
#[derive(Debug)]
pub struct ConsoleResult {
    pub boot_time: Duration,
    pub steps: Vec<StepOutcome>,
}

/// Where the guest got to; used to explain timeouts and failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    Kernel,
    Init,
    Root,
    Setup,
    Ready,
    Done,
}

/// The qemu command line for `boot`.
pub fn command(boot: &Boot<'_>) -> Command {
    let append = format!(
        "console=ttyS0 quiet loglevel=3 panic=-1 xtask.nonce={} xtask.script={} xtask.share={}",
        boot.nonce,
        boot.script.display(),
        boot.share.display()
    );
    let mut qemu = Command::new(QEMU);
    qemu.args([
        "-accel",
        "tcg,thread=multi",
        "-cpu",
        "max",
        "-m",
        "6144",
        "-smp",
        "2",
    ])
    .args(["-nographic", "-no-reboot", "-nic", "none"])
    .arg("-kernel")
    .arg(&boot.kernel.image)
    .arg("-initrd")
    .arg(boot.initrd)
    .args(["-append", &append])
    .args([
        "-virtfs",
        "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
    ])
    .arg("-virtfs")
    .arg(format!(
        "local,path={},mount_tag=results,security_model=none,multidevs=remap",
        boot.share.display()
    ));
    for (i, link) in boot.links.iter().enumerate() {
        qemu.arg("-netdev")
            .arg(format!(
                "socket,id=link{i},udp=127.0.0.1:{},localaddr=127.0.0.1:{}",
                link.remote_port, link.local_port
            ))
            .arg("-device")
            .arg(format!("virtio-net-pci,netdev=link{i},mac={}", link.mac));
    }
    qemu
}

/// Boots, follows the console, returns each step's outcome. `labels` names the plan's steps.
pub fn run(boot: &Boot<'_>, labels: &[String], opts: &VmOptions) -> Result<ConsoleResult, VmError> {
    let mut cmd = command(boot);
    if opts.verbose {
        eprintln!("[xtask vm] {cmd:?}");
    }
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => VmError::QemuMissing(QEMU.into()),
            _ => VmError::io(format!("starting {QEMU}"), e),
        })?;
    let lines = spawn_line_reader(child.stdout.take());
    let stderr = spawn_collector(child.stderr.take());
    let mut follower = Follower {
        nonce: boot.nonce,
        labels,
        opts,
        started,
        stage: Stage::Kernel,
        boot_time: Duration::ZERO,
        tail: Tail::new(80),
        current: None,
        steps: Vec::new(),
        failure: None,
    };
    let result = follower.follow(&lines);
    let finished = match result {
        Ok(()) => reap(&mut child, Duration::from_secs(20)),
        Err(_) => {
            kill(&mut child);
            None
        }
    };
    let stderr_text = stderr.lock().map(|s| s.clone()).unwrap_or_default();
    if opts.verbose && !stderr_text.trim().is_empty() {
        eprintln!("[xtask vm] qemu stderr:\n{stderr_text}");
    }
    let log = follower.tail.text();
    match result {
        Err(Ended::Deadline) => {
            let reason = follower.describe_stage();
            if follower.stage < Stage::Ready && started.elapsed() < opts.timeout {
                Err(VmError::BootFailed {
                    reason: format!("no soft-RoCE after {:?} ({reason})", opts.boot_timeout),
                    log,
                })
            } else {
                Err(VmError::Timeout {
                    limit: opts.timeout,
                    stage: reason,
                    log,
                })
            }
        }
        Err(Ended::QemuGone) => {
            let status = child
                .wait()
                .map(|s| s.to_string())
                .unwrap_or_else(|e| e.to_string());
            let stage = follower.describe_stage();
            if let Some(reason) = follower.failure.take() {
                return Err(VmError::GuestSetup { reason, log });
            }
            if follower.stage < Stage::Root {
                let panic = log
                    .lines()
                    .rev()
                    .find(|l| l.contains("Kernel panic"))
                    .map(str::to_string);
                return Err(VmError::BootFailed {
                    reason: panic.unwrap_or_else(|| {
                        format!(
                            "qemu exited ({status}) while {stage}: {}",
                            stderr_text.trim()
                        )
                    }),
                    log,
                });
            }
            Err(VmError::QemuExited {
                status,
                stage,
                stderr: stderr_text,
                log,
            })
        }
        Ok(()) => {
            if finished.is_none() {
                eprintln!("[xtask vm] the guest did not power off after finishing; killed qemu");
            }
            Ok(ConsoleResult {
                boot_time: follower.boot_time,
                steps: follower.steps,
            })
        }
    }
}

/// Why following the console stopped early.
enum Ended {
    /// The boot or overall deadline passed.
    Deadline,
    /// The console closed before the plan was done (qemu exited).
    QemuGone,
}

struct Follower<'a> {
    nonce: &'a str,
    labels: &'a [String],
    opts: &'a VmOptions,
    started: Instant,
    stage: Stage,
    boot_time: Duration,
    tail: Tail,
    current: Option<(usize, Instant, Vec<String>)>,
    steps: Vec<StepOutcome>,
    failure: Option<String>,
}

impl Follower<'_> {
    fn follow(&mut self, lines: &mpsc::Receiver<String>) -> Result<(), Ended> {
        loop {
            let limit = if self.stage < Stage::Ready {
                self.opts.boot_timeout.min(self.opts.timeout)
            } else {
                self.opts.timeout
            };
            let Some(left) = limit.checked_sub(self.started.elapsed()) else {
                return Err(Ended::Deadline);
            };
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if self.line(&line) {
                        return Ok(());
                    }
                }
                Err(RecvTimeoutError::Timeout) => return Err(Ended::Deadline),
                Err(RecvTimeoutError::Disconnected) => return Err(Ended::QemuGone),
            }
        }
    }

    /// Handles one console line; true once the plan is done.
    fn line(&mut self, line: &str) -> bool {
        let Some((before, event)) = console::parse(line, self.nonce) else {
            self.output(line);
            return false;
        };
        if !before.is_empty() {
            self.output(before);
        }
        let elapsed = self.started.elapsed().as_secs_f64();
        if self.opts.verbose {
            eprintln!("[xtask vm] +{elapsed:.2} s {event:?}");
        }
        match event {
            Event::Init => self.stage = Stage::Init,
            Event::Root => self.stage = Stage::Root,
            Event::Setup => self.stage = Stage::Setup,
            Event::Ready => {
                self.stage = Stage::Ready;
                self.boot_time = self.started.elapsed();
                eprintln!(
                    "[xtask vm] soft-RoCE up after {elapsed:.1} s (rxe0 on {})",
                    super::GUEST_ADDR
                );
            }
            Event::Begin(index) => {
                let label = self.labels.get(index).map(String::as_str).unwrap_or("?");
                if self.labels.len() > 1 {
                    eprintln!(
                        "[xtask vm] step {}/{}: {label}",
                        index + 1,
                        self.labels.len()
                    );
                }
                self.current = Some((index, Instant::now(), Vec::new()));
            }
            Event::End(index, exit_code) => {
                let (elapsed, output) = match self.current.take() {
                    Some((i, since, output)) if i == index => (since.elapsed(), output),
                    _ => (Duration::ZERO, Vec::new()),
                };
                self.steps.push(StepOutcome {
                    label: self.labels.get(index).cloned().unwrap_or_default(),
                    exit_code,
                    elapsed,
                    output,
                    server_output: None,
                });
            }
            Event::Fail(reason) => self.failure = Some(reason),
            Event::Exit(code) => {
                if self.stage != Stage::Done && self.failure.is_none() {
                    self.failure = Some(format!("the guest script exited early with code {code}"));
                }
            }
            Event::Done => {
                self.stage = Stage::Done;
                return true;
            }
        }
        false
    }

    fn output(&mut self, line: &str) {
        self.tail.push(line);
        if let Some((_, _, output)) = &mut self.current {
            output.push(line.to_string());
        }
        let show = self.opts.echo && self.stage >= Stage::Ready;
        if show {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        } else if self.opts.verbose {
            eprintln!("[guest] {line}");
        }
    }

    fn describe_stage(&self) -> String {
        match self.stage {
            Stage::Kernel => "booting the kernel (the initramfs init never ran)".into(),
            Stage::Init => {
                "in the initramfs: loading virtio/9p modules and mounting the host root".into()
            }
            Stage::Root => "starting the guest script".into(),
            Stage::Setup => "setting up soft-RoCE (modprobe rdma_rxe, veth, rdma link add)".into(),
            Stage::Ready => match &self.current {
                Some((index, since, _)) => format!(
                    "running step {} `{}` for {:.0} s (the command hung?)",
                    index + 1,
                    self.labels.get(*index).map(String::as_str).unwrap_or("?"),
                    since.elapsed().as_secs_f64()
                ),
                None => "between steps".into(),
            },
            Stage::Done => "powering off".into(),
        }
    }
}

/// Reads `stdout` line by line on a thread; the channel closes at end of file.
fn spawn_line_reader(stdout: Option<impl Read + Send + 'static>) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    if let Some(stdout) = stdout {
        thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let line = String::from_utf8_lossy(&buf);
                        let line = strip_escapes(line.trim_end_matches(['\n', '\r']));
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        });
    }
    rx
}

/// Drops carriage returns and terminal escape sequences (SeaBIOS clears the screen).
fn strip_escapes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                // ESC [ params final-byte, or ESC + one character.
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                } else if let Some(c) = chars.next() {
                    // Character-set designations (ESC ( B, ...) take one more character.
                    if "()*+-./".contains(c) {
                        chars.next();
                    }
                }
            }
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

/// Collects a stream into a string on a thread.
fn spawn_collector(stream: Option<impl Read + Send + 'static>) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    if let Some(mut stream) = stream {
        let text = Arc::clone(&text);
        thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut t) = text.lock() {
                    t.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        });
    }
    text
}

/// Waits up to `grace` for qemu to exit by itself, then kills it. `None` if it had to be killed.
fn reap(child: &mut Child, grace: Duration) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + grace;
    while Instant::now() < until {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => thread::sleep(Duration::from_millis(100)),
            Err(_) => break,
        }
    }
    kill(child);
    None
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}
