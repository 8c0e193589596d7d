//! Two VMs joined by two network links (`cargo xtask vm-pair`): real RoCE packets between
//! two kernels, each with its own soft-RoCE device on each link ([`PAIR_LINKS`]), where one
//! VM with two devices cannot exchange them (see docs/SOFTROCE.md). A link is a virtio
//! network device in each VM whose Ethernet frames travel between the two qemu processes as
//! UDP datagrams on the host's loopback.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::plan::{pair_mac, quote, PAIR_LINKS};
use super::{
    qemu, run_linked, GuestCommand, GuestPlan, Step, StepOutcome, VmError, VmOptions, VmReport,
};

/// How often a VM of a pair looks for the other's news in the shared directory.
const POLL: &str = "0.2";

/// Boots two VMs at once, joined by the network links [`PAIR_LINKS`] (real RoCE packets
/// between two kernels, each with its own soft-RoCE device on each link), and runs
/// `plans[i]` in VM `i`, which has [`super::PairLink::addr`]`(i)` on each link. Each VM
/// also has its own `rxe0`, as [`super::run`] sets up.
pub fn run_pair(plans: [&GuestPlan; 2], opts: &VmOptions) -> Result<[VmReport; 2], VmError> {
    // Installed and built once, before the two boots would race to do it.
    super::packages::ensure(super::packages::VM_PACKAGES)?;
    let kernel = super::kernel::Kernel::find()?;
    let cache = crate::workspace::target_dir()?.join("softroce-vm");
    super::initramfs::ensure(&kernel, &cache)?;
    let ports = free_udp_ports(2 * PAIR_LINKS.len())?;
    let links = [0, 1].map(|side| link_ends(&ports, side));
    let [first, second] = std::thread::scope(|scope| {
        let run = |i: usize| {
            let mut plan = plans[i].clone();
            plan.pair_side = Some(i);
            let links = &links[i];
            scope.spawn(move || run_linked(&plan, opts, links))
        };
        let handles = [run(0), run(1)];
        handles.map(|h| h.join().expect("a VM's thread panicked"))
    });
    Ok([first?, second?])
}

/// VM `side`'s ends of the [`PAIR_LINKS`], given two host UDP ports per link (`ports[2l]`
/// and `ports[2l + 1]` for link `l`): each end receives on its side's port and sends to the
/// other side's.
fn link_ends(ports: &[u16], side: usize) -> Vec<qemu::Link> {
    (0..PAIR_LINKS.len())
        .map(|l| qemu::Link {
            local_port: ports[2 * l + side],
            remote_port: ports[2 * l + 1 - side],
            mac: pair_mac(l, side),
        })
        .collect()
}

/// `n` distinct UDP ports on the host's loopback that were free a moment ago (all bound at
/// once, so they differ).
fn free_udp_ports(n: usize) -> Result<Vec<u16>, VmError> {
    let sockets = (0..n)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>();
    sockets
        .and_then(|sockets| {
            sockets
                .iter()
                .map(|s| s.local_addr().map(|a| a.port()))
                .collect()
        })
        .map_err(|e| VmError::io("finding free UDP ports for the VMs' links", e))
}

/// How long the client of a pair waits for its server to be ready (both VMs boot at once;
/// under emulation a boot takes 15–30 s).
const READY_WAIT_SECS: u32 = 300;

/// When the server of a pair is ready for its client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerReady {
    /// It listens on this TCP port (perftest's out-of-band exchange).
    TcpPort(u16),
    /// Its output has lines containing each of these texts (`rpc-bench server` prints
    /// `listening on <url>`; an rdma_cm listener has no port `ss` would show).
    Lines(Vec<String>),
}

/// The two plans of a client/server run across the links: VM 1 serves (`server`, in the
/// background, until the client is done), VM 0 runs `client` once the server is `ready`.
/// They meet through files in `dir`, a directory both see (under the writable share); the
/// server's output is kept there too and printed when it ends. Each step is limited to
/// `limit`.
pub fn client_server_plans(
    cwd: &Path,
    dir: &Path,
    ready: &ServerReady,
    server: &str,
    client: &str,
    limit: Duration,
) -> [GuestPlan; 2] {
    let file = |name: &str| quote(&dir.join(name).to_string_lossy());
    let (log, is_ready, done) = (
        file("server.log"),
        file("server-ready"),
        file("client-done"),
    );
    let listening = match ready {
        ServerReady::TcpPort(port) => format!("ss -Hltn 'sport = :{port}' | grep -q ."),
        ServerReady::Lines(texts) => texts
            .iter()
            .map(|text| format!("grep -qF {} {log}", quote(text)))
            .collect::<Vec<_>>()
            .join(" && "),
    };
    let server_script = format!(
        "({server}\n) >{log} 2>&1 & s=$!; \
         until {listening}; do kill -0 $s 2>/dev/null || break; sleep {POLL}; done; \
         touch {is_ready}; \
         until [ -e {done} ]; do kill -0 $s 2>/dev/null || break; sleep {POLL}; done; \
         kill $s 2>/dev/null; wait $s; rc=$?; cat {log}; \
         [ -e {done} ] && exit 0; exit $rc"
    );
    let tries = READY_WAIT_SECS * 5;
    let client_script = format!(
        "i=0; until [ -e {is_ready} ]; do i=$((i+1)); \
         [ $i -gt {tries} ] && {{ echo 'the server was not ready within {READY_WAIT_SECS} s'; exit 1; }}; \
         sleep {POLL}; done; ({client}\n); rc=$?; touch {done}; exit $rc"
    );
    let plan = |label: &str, script: String| {
        let mut plan = GuestPlan::new(cwd);
        plan.steps.push(
            Step::run(label, GuestCommand::new(["sh", "-c", script.as_str()])).with_timeout(limit),
        );
        plan
    };
    [plan("client", client_script), plan("server", server_script)]
}

/// How a client/server run across a pair of VMs ended.
#[derive(Debug)]
pub struct PairOutcome {
    /// The client's step, its exit code the pair's: the client's, or, if the client passed
    /// and the server did not, the server's.
    pub step: StepOutcome,
    /// How long each VM took to boot (client, server).
    pub boot_times: [Duration; 2],
}

/// Runs the plans `make` builds for a meeting directory (client first, server second, as
/// [`client_server_plans`] makes them) across a pair of VMs, in a fresh directory under the
/// writable share that is removed after. When either side fails, the server's last output
/// is printed (its script prints it when it ends, but not when its time limit kills it).
pub fn run_client_server(
    opts: &VmOptions,
    make: impl FnOnce(&Path) -> [GuestPlan; 2],
) -> Result<PairOutcome, VmError> {
    let dir = meeting_dir(&crate::workspace::target_dir()?)?;
    let [client, server] = make(&dir);
    let reports = run_pair([&client, &server], opts);
    let outcome = reports.and_then(|[client, server]| {
        let boot_times = [client.boot_time, server.boot_time];
        let mut step = client
            .steps
            .into_iter()
            .next()
            .ok_or_else(|| VmError::Parse("the pair's client reported nothing".into()))?;
        let server_code = server.steps.first().map_or(1, |s| s.exit_code);
        if step.success() && server_code != 0 {
            step.exit_code = server_code;
        }
        if !step.success() {
            eprintln!("[xtask] the pair's server exited with {server_code}; its last output:");
            let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            for line in &lines[lines.len().saturating_sub(40)..] {
                eprintln!("  {line}");
            }
        }
        Ok(PairOutcome { step, boot_times })
    });
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

/// A fresh directory for two VMs to meet in, under the writable share `share`.
fn meeting_dir(share: &Path) -> Result<PathBuf, VmError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let dir = share
        .join("softroce-vm")
        .join(format!("pair-{:x}-{nanos:x}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| VmError::io(format!("creating {}", dir.display()), e))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_link_end_sends_to_the_port_the_other_receives_on() {
        let ports = [1001, 1002, 1003, 1004];
        let [first, second] = [0, 1].map(|side| link_ends(&ports, side));
        assert_eq!(first.len(), PAIR_LINKS.len());
        for (a, b) in first.iter().zip(&second) {
            assert_eq!((a.remote_port, b.remote_port), (b.local_port, a.local_port));
            assert_ne!(a.mac, b.mac);
        }
        let mut locals: Vec<u16> = first.iter().chain(&second).map(|e| e.local_port).collect();
        locals.sort_unstable();
        locals.dedup();
        assert_eq!(
            locals.len(),
            ports.len(),
            "every end receives on a port of its own"
        );
        let mut macs: Vec<&str> = first
            .iter()
            .chain(&second)
            .map(|e| e.mac.as_str())
            .collect();
        macs.sort_unstable();
        macs.dedup();
        assert_eq!(macs.len(), 4, "four distinct MAC addresses");
    }

    #[test]
    fn the_client_waits_for_the_server_and_the_server_for_the_client() {
        let dir = Path::new("/t/pair");
        let [client, server] = client_server_plans(
            Path::new("/w"),
            dir,
            &ServerReady::Lines(vec!["listening on".into(), "tcp://".into()]),
            "serve",
            "call",
            Duration::from_secs(60),
        );
        let script = |plan: &GuestPlan| match &plan.steps[0].action {
            super::super::Action::Run(command) => command.argv[2].clone(),
            other => panic!("not a command: {other:?}"),
        };
        let (client, server) = (script(&client), script(&server));
        assert!(client.contains("until [ -e /t/pair/server-ready ]"));
        assert!(client.contains("(call\n); rc=$?; touch /t/pair/client-done; exit $rc"));
        assert!(server.starts_with("(serve\n) >/t/pair/server.log 2>&1 &"));
        assert!(server.contains(
            "until grep -qF 'listening on' /t/pair/server.log && grep -qF tcp:// /t/pair/server.log;"
        ));
        assert!(server.contains("touch /t/pair/server-ready"));
        assert!(server.contains("until [ -e /t/pair/client-done ]"));
    }
}
