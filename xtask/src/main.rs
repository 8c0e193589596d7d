//! `cargo run -p xtask -- <subcommand>`: see `xtask --help` and docs/SOFTROCE.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use xtask::vm::{self, GuestCommand, GuestPlan, Step, VmError, VmOptions};
use xtask::{perftest, test_rdma};

/// Exit code when the VM itself could not run the command (as `docker run` uses 125).
const INFRA_FAILURE: u8 = 125;

#[derive(Debug, Parser)]
#[command(
    name = "xtask",
    about = "rdma-rpc project automation (soft-RoCE VM runner)"
)]
struct Cli {
    /// Show the qemu command line, boot messages and qemu's stderr.
    #[arg(long, short, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The main job: echo demo, perftest and rpc-bench over real verbs (soft-RoCE VM when
    /// the host has no RDMA device), tonic comparison over TCP; prints the table and writes
    /// target/bench/results.json and target/bench/figures.svg.
    Demo {
        /// Overall limit in seconds for the VM part.
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
    },
    /// Large requests read by the server (RDMA READ) against written into its grant, per
    /// size, with perftest's and UCX's figures from the same soft-RoCE boot; prints the
    /// ratios.
    LargeBodies {
        /// Times each size runs both ways, back to back.
        #[arg(long, default_value_t = 2)]
        rounds: u32,
        /// Also write the figures as JSON here.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
        /// Overall limit in seconds.
        #[arg(long, default_value_t = 1500)]
        timeout: u64,
    },
    /// Instructions and allocations per 32 B round trip, by stage, over the in-memory verbs
    /// provider on the host (callgrind and dhat; repeatable where times are not).
    Count {
        /// Round trips of the shorter run (the longer makes three times as many).
        #[arg(long, default_value_t = xtask::count::DEFAULT_CALLS)]
        calls: u64,
        /// Polling mode of both sides (busy, adaptive, event).
        #[arg(long, default_value = "event")]
        poll: String,
        /// Also write the figures as JSON here.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
    },
    /// Every test: the workspace's tests on the host, then the RDMA tests on real verbs in
    /// the soft-RoCE VM. Installs missing Debian packages first.
    Test {
        /// Overall limit in seconds for the VM part.
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
    },
    /// Run a command as root in the soft-RoCE VM (rxe0 on 192.168.77.1) and exit with its code.
    VmRun {
        /// Overall limit in seconds, boot included; qemu is killed when it passes.
        #[arg(long, default_value_t = 900)]
        timeout: u64,
        /// Extra environment for the command (repeatable).
        #[arg(long = "env", value_name = "K=V", value_parser = parse_key_value)]
        env: Vec<(String, String)>,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Boot two VMs joined by two network links (192.168.78.1 and .2 with soft-RoCE device
    /// rxe1 in each, 192.168.79.1 and .2 with rxe2) and run a server in the second and a
    /// client in the first: RoCE packets between two kernels.
    VmPair {
        /// Overall limit in seconds, boots included.
        #[arg(long, default_value_t = 900)]
        timeout: u64,
        /// The server is ready once it listens on this TCP port.
        #[arg(long, conflicts_with = "ready_line")]
        ready_port: Option<u16>,
        /// The server is ready once a line of its output contains this text.
        #[arg(long)]
        ready_line: Option<String>,
        /// Shell command of the server (second VM, 192.168.78.2 and 192.168.79.2).
        #[arg(long)]
        server: String,
        /// Shell command of the client (first VM, 192.168.78.1 and 192.168.79.1).
        #[arg(long)]
        client: String,
    },
    /// Run ib_{send,write}_{lat,bw} in one boot and print their figures.
    PerftestBaseline {
        /// Also write the results as JSON here.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
        /// Overall limit in seconds.
        #[arg(long, default_value_t = 1200)]
        timeout: u64,
    },
    /// Build the RDMA crates' test binaries and run them all in one boot.
    TestRdma {
        /// Additional package to test (repeatable); the default list is in test_rdma.rs.
        #[arg(long = "package", short = 'p')]
        packages: Vec<String>,
        /// Build in release mode.
        #[arg(long)]
        release: bool,
        /// Also run the packages' unit-test binaries (by default only `tests/*.rs`).
        #[arg(long)]
        unit_tests: bool,
        /// Overall limit in seconds.
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
        /// Arguments for every test binary (after `--`), e.g. `--nocapture` or a filter.
        #[arg(last = true)]
        test_args: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let verbose = cli.verbose;
    let result = match cli.command {
        Command::Test { timeout } => test_all(options(timeout, verbose)),
        Command::Demo { timeout } => demo(options(timeout, verbose)),
        Command::LargeBodies {
            rounds,
            json,
            timeout,
        } => xtask::large_bodies::run(&options(timeout, verbose), rounds, json.as_deref()).map(
            |ok| {
                if ok {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            },
        ),
        Command::Count { calls, poll, json } => {
            xtask::count::run(calls, &poll, json.as_deref()).map(|_| ExitCode::SUCCESS)
        }
        Command::VmRun {
            timeout,
            env,
            command,
        } => vm_run(options(timeout, verbose), env, command),
        Command::VmPair {
            timeout,
            ready_port,
            ready_line,
            server,
            client,
        } => {
            let ready = match (ready_port, ready_line) {
                (Some(port), _) => vm::ServerReady::TcpPort(port),
                (None, Some(line)) => vm::ServerReady::Lines(vec![line]),
                (None, None) => {
                    eprintln!("error: say when the server is ready: --ready-port or --ready-line");
                    return ExitCode::from(INFRA_FAILURE);
                }
            };
            vm_pair(options(timeout, verbose), &ready, &server, &client)
        }
        Command::PerftestBaseline { json, timeout } => {
            perftest_baseline(options(timeout, verbose), json)
        }
        Command::TestRdma {
            packages,
            release,
            unit_tests,
            timeout,
            test_args,
        } => test_rdma(
            options(timeout, verbose),
            packages,
            release,
            unit_tests,
            test_args,
        ),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(INFRA_FAILURE)
        }
    }
}

fn options(timeout: u64, verbose: bool) -> VmOptions {
    VmOptions {
        timeout: Duration::from_secs(timeout),
        verbose,
        ..VmOptions::default()
    }
}

fn current_dir() -> Result<PathBuf, VmError> {
    std::env::current_dir().map_err(|e| VmError::io("reading the current directory", e))
}

fn vm_run(
    opts: VmOptions,
    env: Vec<(String, String)>,
    command: Vec<String>,
) -> Result<ExitCode, VmError> {
    let mut plan = GuestPlan::new(current_dir()?);
    plan.env = env;
    let label = command.join(" ");
    plan.steps
        .push(Step::run(label, GuestCommand::new(command)));
    let report = vm::run(&plan, &opts)?;
    let code = report.steps.first().map_or(1, |s| s.exit_code);
    eprintln!(
        "[xtask vm] command exited with {code} after {:.1} s (boot {:.1} s)",
        report.total_time.as_secs_f64(),
        report.boot_time.as_secs_f64()
    );
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

fn vm_pair(
    opts: VmOptions,
    ready: &vm::ServerReady,
    server: &str,
    client: &str,
) -> Result<ExitCode, VmError> {
    let cwd = current_dir()?;
    let limit = opts.timeout.saturating_sub(Duration::from_secs(60));
    let outcome = vm::pair::run_client_server(&opts, |dir| {
        vm::pair::client_server_plans(&cwd, dir, ready, server, client, limit)
    })?;
    let code = outcome.step.exit_code;
    eprintln!(
        "[xtask vm-pair] exited with {code} (boots {:.1} s and {:.1} s)",
        outcome.boot_times[0].as_secs_f64(),
        outcome.boot_times[1].as_secs_f64()
    );
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

fn perftest_baseline(mut opts: VmOptions, json: Option<PathBuf>) -> Result<ExitCode, VmError> {
    opts.echo = opts.verbose;
    let suite = perftest::baseline_suite();
    let mut plan = GuestPlan::new(current_dir()?);
    plan.steps
        .extend(suite.iter().map(perftest::Perftest::step));
    let report = vm::run(&plan, &opts)?;
    let figures = match perftest::figures(&suite, &report.steps) {
        Ok(figures) => figures,
        Err(message) => {
            eprintln!("error: {message}");
            return Ok(ExitCode::FAILURE);
        }
    };
    println!(
        "perftest in the soft-RoCE VM (rxe0, TCG emulation; latency is one-way), boot {:.1} s, total {:.1} s",
        report.boot_time.as_secs_f64(),
        report.total_time.as_secs_f64()
    );
    print!("{}", perftest::table(&figures));
    if let Some(path) = json {
        let doc = serde_json::json!({
            "boot_time_s": report.boot_time.as_secs_f64(),
            "total_time_s": report.total_time.as_secs_f64(),
            "device": vm::GUEST_DEVICE,
            "figures": figures,
        });
        xtask::workspace::write_json(&path, &doc)?;
        eprintln!("[xtask] wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn test_rdma(
    opts: VmOptions,
    extra: Vec<String>,
    release: bool,
    unit_tests: bool,
    test_args: Vec<String>,
) -> Result<ExitCode, VmError> {
    vm::packages::ensure(vm::packages::BUILD_PACKAGES)?;
    let mut packages: Vec<String> = test_rdma::RDMA_TEST_PACKAGES
        .iter()
        .map(|s| s.to_string())
        .collect();
    packages.extend(extra);
    let cwd = current_dir()?;
    let binaries = test_rdma::build(&packages, release, unit_tests, &xtask::workspace::root())?;
    if binaries.is_empty() {
        eprintln!(
            "error: cargo built no test binaries for {}",
            packages.join(", ")
        );
        return Ok(ExitCode::FAILURE);
    }
    let plan = test_rdma::plan(&binaries, &test_args, &cwd);
    let report = vm::run(&plan, &opts)?;
    let mut steps = report.steps;
    let paired = binaries
        .iter()
        .filter(|b| test_rdma::PAIR_ONLY.contains(&b.target.as_str()));
    for binary in paired {
        let label = format!("{} ({}, two VMs)", binary.target, binary.package);
        steps.push(pair_step(binary, &test_args, label, &cwd, &opts));
    }
    eprintln!(
        "\n[xtask] test binaries in the soft-RoCE VM (boot {:.1} s):",
        report.boot_time.as_secs_f64()
    );
    let mut failed = 0;
    for step in &steps {
        let verdict = match step.exit_code {
            0 => "ok",
            124 => {
                failed += 1;
                "TIMED OUT"
            }
            _ => {
                failed += 1;
                "FAILED"
            }
        };
        eprintln!(
            "  {verdict:<9} {:<40} exit {:>3}  {:>6.1} s",
            step.label,
            step.exit_code,
            step.elapsed.as_secs_f64()
        );
    }
    if failed == 0 {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("[xtask] {failed} of {} test binaries failed", steps.len());
        Ok(ExitCode::FAILURE)
    }
}

/// Runs `binary` across a pair of VMs (see `test_rdma::pair_plans`) as one step of the
/// suite's report: a pair that fails to boot, or whose server fails, fails the step.
fn pair_step(
    binary: &test_rdma::TestBinary,
    test_args: &[String],
    label: String,
    cwd: &std::path::Path,
    opts: &VmOptions,
) -> vm::StepOutcome {
    let outcome = vm::pair::run_client_server(opts, |dir| {
        test_rdma::pair_plans(binary, test_args, dir, cwd)
    });
    match outcome {
        Ok(outcome) => vm::StepOutcome {
            label,
            ..outcome.step
        },
        Err(e) => {
            eprintln!("[xtask] {label}: the pair of VMs failed: {e}");
            vm::StepOutcome {
                label,
                exit_code: 125,
                elapsed: Duration::ZERO,
                output: Vec::new(),
                server_output: None,
            }
        }
    }
}

/// The README's main job.
fn demo(opts: VmOptions) -> Result<ExitCode, VmError> {
    let out_dir = xtask::workspace::target_dir()?.join("bench");
    if xtask::demo::run(&opts, &out_dir)? {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::FAILURE)
    }
}

/// The README's test command.
fn test_all(opts: VmOptions) -> Result<ExitCode, VmError> {
    vm::packages::ensure(vm::packages::BUILD_PACKAGES)?;
    vm::packages::ensure_python(vm::packages::PYTHON_PACKAGES)?;
    eprintln!("[xtask] host tests: cargo test --workspace");
    let status = std::process::Command::new(xtask::workspace::cargo())
        .args(["test", "--workspace"])
        .current_dir(xtask::workspace::root())
        .status()
        .map_err(|e| VmError::io("running cargo test", e))?;
    if !status.success() {
        eprintln!("[xtask] host tests failed ({status})");
        return Ok(ExitCode::FAILURE);
    }
    eprintln!("[xtask] RDMA tests on real verbs in the soft-RoCE VM");
    // One test at a time: the VM has 2 vCPUs and every RDMA connection has a poller thread.
    test_rdma(
        opts,
        Vec::new(),
        false,
        false,
        vec!["--test-threads=1".into()],
    )
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("expected K=V, got {s:?}")),
    }
}
