//! `rpc-bench connections`: many client connections to one server process, and what they
//! cost that process (threads, pinned memory, CPU while every connection is idle), read
//! from `/proc/<pid>`.

use std::time::Duration;

use rdma_rpc::{Endpoint, RdmaConfig};
use rpc_examples::echo::echo_client::EchoClient;
use rpc_examples::echo::EchoRequest;
use serde::Serialize;

use crate::clock::Instant;
use crate::error::BenchError;

/// What a `connections` run measured.
#[derive(Debug, Clone, Serialize)]
pub struct FleetReport {
    /// Connections opened (each completed one call).
    pub connections: usize,
    /// Time to open all of them, one after the other, seconds.
    pub connect_secs: f64,
    /// Threads of the server process with every connection open.
    pub server_threads: u64,
    /// The server process's pinned memory (VmPin), KiB.
    pub server_vm_pin_kib: u64,
    /// The server process's resident memory (VmRSS), KiB.
    pub server_rss_kib: u64,
    /// Share of one core the server process used while every connection was idle.
    pub server_idle_cpu: f64,
    /// Length of that idle window, seconds.
    pub idle_secs: f64,
}

impl FleetReport {
    /// The human-readable summary.
    pub fn text(&self) -> String {
        format!(
            "{} connections opened in {:.1} s; server: {} threads, VmPin {:.1} MiB, RSS {:.1} MiB, \
             {:.2}% of a core idle over {:.0} s\n",
            self.connections,
            self.connect_secs,
            self.server_threads,
            self.server_vm_pin_kib as f64 / 1024.0,
            self.server_rss_kib as f64 / 1024.0,
            self.server_idle_cpu * 100.0,
            self.idle_secs,
        )
    }
}

/// Opens `count` connections to `url` (served by process `server_pid`), makes one call on
/// each, then lets all of them sit idle for `idle` while measuring the server process.
pub fn run(
    url: &Endpoint,
    count: usize,
    server_pid: u32,
    idle: Duration,
    rdma: RdmaConfig,
) -> Result<FleetReport, BenchError> {
    let started = Instant::now();
    let mut clients = Vec::with_capacity(count);
    for n in 0..count {
        let channel = rdma_rpc::client()
            .rdma_config(rdma.clone())
            .connect_blocking(&url.to_string())
            .map_err(|e| BenchError::failed(&format!("connection {n} to {url}"), e))?;
        let client = EchoClient::new(channel);
        client
            .echo_blocking(EchoRequest {
                payload: vec![7; 32].into(),
                seq: n as u64,
            })
            .map_err(|e| BenchError::failed(&format!("call on connection {n}"), e))?;
        clients.push(client);
    }
    let connect_secs = started.elapsed().as_secs_f64();
    let proc = ProcStat::new(server_pid);
    let before = proc.cpu_ticks()?;
    let idle_started = std::time::Instant::now();
    std::thread::sleep(idle);
    let ticks = proc.cpu_ticks()?.saturating_sub(before);
    let idle_secs = idle_started.elapsed().as_secs_f64();
    let status = proc.status()?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let report = FleetReport {
        connections: clients.len(),
        connect_secs,
        server_threads: field("Threads:"),
        server_vm_pin_kib: field("VmPin:"),
        server_rss_kib: field("VmRSS:"),
        server_idle_cpu: ticks as f64 / clock_ticks_per_sec() / idle_secs,
        idle_secs,
    };
    drop(clients);
    Ok(report)
}

/// `/proc/<pid>` of the server.
struct ProcStat {
    pid: u32,
}

impl ProcStat {
    fn new(pid: u32) -> ProcStat {
        ProcStat { pid }
    }

    fn read(&self, file: &str) -> Result<String, BenchError> {
        let path = format!("/proc/{}/{file}", self.pid);
        std::fs::read_to_string(&path)
            .map_err(|e| BenchError::failed(&format!("reading {path}"), e))
    }

    fn status(&self) -> Result<String, BenchError> {
        self.read("status")
    }

    /// User plus system CPU time of the process, in clock ticks.
    fn cpu_ticks(&self) -> Result<u64, BenchError> {
        let stat = self.read("stat")?;
        // Fields after the command name (which may hold spaces) start after its ')'.
        let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of stat(5); `rest` starts at field 3.
        let tick = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Ok(tick(11) + tick(12))
    }
}

fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no memory preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}
