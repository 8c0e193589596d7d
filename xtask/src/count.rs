//! `count`: instructions and allocations per 32 B round trip, on the host, over the
//! in-memory verbs provider (`rpc-rdma-verbs` built with `--cfg verbs_fabric`).
//!
//! `rpc-bench loopback` runs the real generated client, server dispatch, protocol and RDMA
//! driver; only the verbs calls are replaced. Callgrind counts each function's own
//! instructions at two call counts, `n` and `3n`; the difference over `2n` is the cost of
//! one round trip, without start-up and teardown. Empty completion-queue polls depend on
//! how the two threads happen to interleave, so they are reported apart and left out of
//! the figure; what remains repeats run to run. dhat counts allocations the same way.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use regex::Regex;
use serde::Serialize;

use crate::vm::{self, VmError};

/// Round trips of the shorter run (the longer one makes three times as many).
pub const DEFAULT_CALLS: u64 = 1000;
const WARMUP: u64 = 100;

/// Where each function's instructions go, first match wins. `ours` marks our crates.
const STAGES: &[(&str, &str, bool)] = &[
    (
        "idle polling (left out)",
        r"poll_cq|CompletionQueue::poll|Engine::poll\b|Engine::spin|Poller::|spin_loop|clock_gettime|Timespec|Instant::now|sched_yield|elapsed|Engine::run_attention|retire_if_unused|should_yield|Callers::",
        false,
    ),
    (
        "in-memory device (not ours)",
        r"rpc_rdma_verbs::fabric::",
        false,
    ),
    (
        "tracing and metrics (none observing)",
        r"rpc_core::observe|tracing::|metrics::",
        true,
    ),
    (
        "client stub, encode, decode",
        r"rpc_core::client|echo_client|rpc_core::codec|prost::|decode_message",
        true,
    ),
    (
        "send: frame, credits, post",
        r"conn::send|send_ring|OutgoingFrame|commit_send|Connection::flush|poll_action|reserve_send|pump_writes|RdmaClient|RdmaReplySink|QueuePair::post|build_send_wr|send_memory",
        true,
    ),
    (
        "hand-up to the waiting caller",
        r"hand_up|conn::recv::.*deliver|copies|call_table|Wakes::",
        true,
    ),
    (
        "completion processing",
        r"conn::recv|recv_ring|connection::recv|on_completion|rpc_wire::|engine::|run_actions|upcalls|Conn::unlock|shared_recv|CompletionChannel|req_notify",
        true,
    ),
    (
        "server dispatch and reply",
        r"rpc_core::server|echo_server",
        true,
    ),
    ("our other code", r"rpc_|rdma_rpc", true),
    ("copies (memcpy, memset)", r"memcpy|memset|memmove", false),
    (
        "allocator",
        r"malloc|free|_int_|realloc|alloc::alloc|__rdl_|__rust_(alloc|dealloc|realloc)",
        false,
    ),
    ("benchmark harness", r"rpc_bench|hdrhistogram", false),
];
const OTHER: &str = "other (std, locks, syscall wrappers)";

/// One stage's instructions per round trip.
#[derive(Debug, Clone, Serialize)]
pub struct Stage {
    pub stage: String,
    pub instructions: f64,
    pub ours: bool,
}

/// What `count` measured.
#[derive(Debug, Clone, Serialize)]
pub struct Counts {
    pub calls: u64,
    pub poll: String,
    /// Our crates' instructions per round trip, client and server, idle polls excluded.
    pub ours: f64,
    /// Every instruction per round trip but idle polls and the in-memory device's (with the
    /// library code it calls).
    pub without_idle_and_device: f64,
    /// The in-memory device's instructions with the library code it calls (its entry
    /// points' inclusive cost, but completion-queue polls').
    pub device: f64,
    pub stages: Vec<Stage>,
    /// Heap allocations per round trip, both sides (the in-memory device's own left out).
    pub allocations: f64,
}

/// Builds, measures, prints the table; writes `json` if given.
pub fn run(calls: u64, poll: &str, json: Option<&Path>) -> Result<Counts, VmError> {
    vm::packages::ensure(&["valgrind"])?;
    vm::packages::ensure(vm::packages::BUILD_PACKAGES)?;
    let bin = build()?;
    let out = crate::workspace::target_dir()?.join("count");
    std::fs::create_dir_all(&out).map_err(|e| VmError::io("creating target/count", e))?;
    let mut costs = Vec::new();
    let mut blocks = Vec::new();
    let mut inclusive = Vec::new();
    for n in [calls, 3 * calls] {
        let [own, with_callees] = callgrind(&bin, &out, n, poll)?;
        costs.push(own);
        inclusive.push(device_inclusive(&with_callees));
        blocks.push(dhat(&bin, &out, n, poll)?);
    }
    let per_call = |a: f64, b: f64| (b - a) / (2 * calls) as f64;
    let device = per_call(inclusive[0], inclusive[1]);
    let mut by_stage: HashMap<&str, f64> = HashMap::new();
    let matchers: Vec<(&str, Regex, bool)> = STAGES
        .iter()
        .map(|&(name, re, ours)| (name, Regex::new(re).expect("a valid stage pattern"), ours))
        .collect();
    for (function, &b) in &costs[1] {
        let a = costs[0].get(function).copied().unwrap_or(0.0);
        let stage = matchers
            .iter()
            .find(|(_, re, _)| re.is_match(function))
            .map_or(OTHER, |(name, _, _)| name);
        *by_stage.entry(stage).or_default() += per_call(a, b);
    }
    let stages: Vec<Stage> = STAGES
        .iter()
        .map(|&(name, _, ours)| (name, ours))
        .chain([(OTHER, false)])
        .map(|(name, ours)| Stage {
            stage: name.to_string(),
            instructions: by_stage.get(name).copied().unwrap_or(0.0),
            ours,
        })
        .collect();
    let ours = stages
        .iter()
        .filter(|s| s.ours)
        .map(|s| s.instructions)
        .sum();
    let all: f64 = stages.iter().map(|s| s.instructions).sum();
    let without_idle_and_device = all - stages[0].instructions - device;
    let counts = Counts {
        calls,
        poll: poll.to_string(),
        ours,
        without_idle_and_device,
        device,
        stages,
        allocations: per_call(blocks[0], blocks[1]),
    };
    print!("{}", counts.table());
    if let Some(path) = json {
        crate::workspace::write_json(path, &counts)?;
    }
    Ok(counts)
}

impl Counts {
    /// The table `count` prints.
    pub fn table(&self) -> String {
        let mut out = format!(
            "\n== instructions per 32 B round trip over the in-memory verbs provider \
             (callgrind, {} and {} calls, --poll {}) ==\n",
            self.calls,
            3 * self.calls,
            self.poll
        );
        for s in &self.stages {
            out.push_str(&format!(
                "  {:<40} {:>9.0}{}\n",
                s.stage,
                s.instructions,
                if s.ours { "  (ours)" } else { "" }
            ));
        }
        out.push_str(&format!(
            "  {:<40} {:>9.0}\n  {:<40} {:>9.0}\n  {:<40} {:>9.0}\n  {:<40} {:>9.2}\n",
            "in-memory device, with what it calls",
            self.device,
            "our code, idle polls excluded",
            self.ours,
            "everything but idle polls and the device",
            self.without_idle_and_device,
            "heap allocations per round trip (ours)",
            self.allocations,
        ));
        out
    }
}

/// Builds `rpc-bench` over the in-memory provider, in its own target directory.
fn build() -> Result<PathBuf, VmError> {
    let target = crate::workspace::target_dir()?.join("fabric");
    eprintln!("[xtask count] building rpc-bench over the in-memory verbs provider");
    let status = Command::new(crate::workspace::cargo())
        .args(["build", "--release", "-p", "rpc-bench"])
        .env("RUSTFLAGS", "--cfg verbs_fabric")
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(crate::workspace::root())
        .status()
        .map_err(|e| VmError::io("running cargo build", e))?;
    if !status.success() {
        return Err(VmError::Command {
            what: "cargo build --cfg verbs_fabric".into(),
            detail: status.to_string(),
        });
    }
    Ok(target.join("release").join("rpc-bench"))
}

fn bench_args(n: u64, poll: &str) -> Vec<String> {
    [
        "loopback",
        "--url",
        "rdma://127.0.0.1:0",
        "--size",
        "32",
        "--warmup",
        &WARMUP.to_string(),
        "--iters",
        &n.to_string(),
        "--poll",
        poll,
        "--json",
    ]
    .map(String::from)
    .into()
}

fn valgrind(tool_args: &[String], bin: &Path, n: u64, poll: &str) -> Result<String, VmError> {
    let output = Command::new("valgrind")
        .args(tool_args)
        .arg(bin)
        .args(bench_args(n, poll))
        .output()
        .map_err(|e| VmError::io("running valgrind", e))?;
    if !output.status.success() {
        return Err(VmError::Command {
            what: format!("valgrind {}", tool_args.join(" ")),
            detail: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Each function's own instructions in a run of `n` calls.
/// Each function's own instructions, and each function's with its callees', in a run of
/// `n` calls.
fn callgrind(
    bin: &Path,
    out: &Path,
    n: u64,
    poll: &str,
) -> Result<[HashMap<String, f64>; 2], VmError> {
    eprintln!("[xtask count] callgrind, {n} calls");
    let file = out.join(format!("callgrind.{n}.out"));
    valgrind(
        &[
            "--tool=callgrind".into(),
            format!("--callgrind-out-file={}", file.display()),
        ],
        bin,
        n,
        poll,
    )?;
    // Run where no source path resolves: from the workspace, a file named both by its
    // absolute and its relative path is listed twice, and so is its inclusive cost.
    let annotate = |inclusive: &str| {
        Command::new("callgrind_annotate")
            .args(["--threshold=100", "--auto=no", inclusive])
            .arg(&file)
            .current_dir(out)
            .output()
            .map(|out| self_costs(&String::from_utf8_lossy(&out.stdout)))
            .map_err(|e| VmError::io("running callgrind_annotate", e))
    };
    Ok([annotate("--inclusive=no")?, annotate("--inclusive=yes")?])
}

/// The inclusive cost of the in-memory device's entry points (the C calls it answers), but
/// completion-queue polls' (idle or not, they are the poller's).
pub fn device_inclusive(inclusive: &HashMap<String, f64>) -> f64 {
    let entry = Regex::new(r"^rpc_rdma_verbs::fabric::\w+::_*(ibv|rdma)_").expect("valid");
    inclusive
        .iter()
        .filter(|(f, _)| entry.is_match(f) && !f.contains("poll_cq"))
        .map(|(_, cost)| cost)
        .sum()
}

/// Parses `callgrind_annotate`'s per-function table (`Ir (pct) file:function`), self or
/// inclusive.
pub fn self_costs(text: &str) -> HashMap<String, f64> {
    let line = Regex::new(r"^\s*([\d,]+)\s+\([^)]*\)\s+(.*?)(?: \[.*\])?$").expect("valid");
    let calls = Regex::new(r" \([\d,]+x\)$").expect("valid");
    let mut costs = HashMap::new();
    let mut in_table = false;
    for l in text.lines() {
        if l.contains("file:function") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        let Some(m) = line.captures(l) else { continue };
        let cost: f64 = m[1].replace(',', "").parse().unwrap_or(0.0);
        let name = calls.replace(&m[2], "");
        if name.contains("PROGRAM TOTALS") {
            continue;
        }
        let function = name.split_once(':').map_or(&*name, |(_, f)| f).to_string();
        *costs.entry(function).or_insert(0.0) += cost;
    }
    costs
}

/// Heap blocks allocated in a run of `n` calls, but those the in-memory device allocates
/// for itself.
fn dhat(bin: &Path, out: &Path, n: u64, poll: &str) -> Result<f64, VmError> {
    eprintln!("[xtask count] dhat, {n} calls");
    let file = out.join(format!("dhat.{n}.json"));
    valgrind(
        &[
            "--tool=dhat".into(),
            format!("--dhat-out-file={}", file.display()),
        ],
        bin,
        n,
        poll,
    )?;
    let text =
        std::fs::read_to_string(&file).map_err(|e| VmError::io("reading dhat's output", e))?;
    let profile: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| VmError::Parse(format!("dhat's JSON: {e}")))?;
    blocks_outside_the_device(&profile)
        .ok_or_else(|| VmError::Parse("dhat's JSON has no `pps`/`ftbl`".into()))
}

/// Sums the blocks (`tbk`) of dhat's program points whose stacks do not pass through the
/// in-memory device.
pub fn blocks_outside_the_device(profile: &serde_json::Value) -> Option<f64> {
    let frames = profile["ftbl"].as_array()?;
    let device = |index: &serde_json::Value| {
        index
            .as_u64()
            .and_then(|i| frames.get(i as usize))
            .and_then(|f| f.as_str())
            .is_some_and(|f| f.contains("rpc_rdma_verbs::fabric"))
    };
    let points = profile["pps"].as_array()?;
    Some(
        points
            .iter()
            .filter(|pp| !pp["fs"].as_array().is_some_and(|fs| fs.iter().any(device)))
            .filter_map(|pp| pp["tbk"].as_f64())
            .sum(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_callgrind_annotate_self_costs() {
        let text = "\
--------------------------------------------------------------------------------
Ir                     file:function
--------------------------------------------------------------------------------
457,822,941 (100.0%)  PROGRAM TOTALS
 97,175,020 (21.23%)  ???:rpc_transport_rdma::engine::Engine::poll (2,961,741x) [/x/rpc-bench]
  1,418,000 ( 0.31%)  ./string/memcpy.S:__memcpy_avx_unaligned_erms [/usr/lib/libc.so.6]
    418,000 ( 0.09%)  src/a.rs:rpc_transport_rdma::engine::Engine::poll
";
        let costs = self_costs(text);
        assert_eq!(
            costs["rpc_transport_rdma::engine::Engine::poll"],
            97_593_020.0
        );
        assert_eq!(costs["__memcpy_avx_unaligned_erms"], 1_418_000.0);
        assert!(!costs.keys().any(|k| k.contains("TOTALS")));
    }

    #[test]
    fn allocations_of_the_device_itself_are_left_out() {
        let profile = serde_json::json!({
            "ftbl": ["[root]", "0x1: rpc_rdma_verbs::fabric::qp::ibv_post_recv (qp.rs:1)",
                     "0x2: new<rpc_examples::echo::EchoReply> (boxed.rs:1)"],
            "pps": [
                {"tbk": 3000, "fs": [1, 0]},
                {"tbk": 2000, "fs": [2, 0]},
                {"tbk": 7, "fs": [0]},
            ],
        });
        assert_eq!(blocks_outside_the_device(&profile), Some(2007.0));
        assert_eq!(blocks_outside_the_device(&serde_json::json!({})), None);
    }

    #[test]
    fn the_device_is_counted_at_its_entry_points() {
        let costs: HashMap<String, f64> = [
            ("rpc_rdma_verbs::fabric::qp::ibv_post_send", 100.0),
            ("rpc_rdma_verbs::fabric::work::execute", 90.0),
            ("rpc_rdma_verbs::fabric::cq::ibv_poll_cq", 50.0),
            ("rpc_rdma_verbs::fabric::device::___ibv_query_port", 5.0),
            ("rpc_transport_rdma::conn::Conn::run_actions", 400.0),
        ]
        .map(|(f, c)| (f.to_string(), c))
        .into();
        assert_eq!(device_inclusive(&costs), 105.0);
    }

    #[test]
    fn every_stage_pattern_compiles_and_idle_comes_first() {
        for (name, re, _) in STAGES {
            assert!(Regex::new(re).is_ok(), "{name}");
        }
        assert!(STAGES[0].0.starts_with("idle"));
    }
}
