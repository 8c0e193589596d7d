//! `test-rdma`: build the test binaries of the RDMA crates on the host, then run every one of
//! them in a single VM boot.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::vm::pair::{client_server_plans, ServerReady};
use crate::vm::plan::quote;
use crate::vm::{GuestCommand, GuestPlan, Step, VmError, PAIR_LINKS};

/// Crates whose tests need a real RDMA device. Add a crate here when it gains RDMA tests.
pub const RDMA_TEST_PACKAGES: &[&str] = &["rpc-transport-rdma", "rpc-examples", "rpc-bench"];

/// Guest-side limit for one test binary.
pub const PER_BINARY_TIMEOUT: Duration = Duration::from_secs(600);

/// A test executable built by cargo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestBinary {
    /// Package name.
    pub package: String,
    /// Target name (`rpc_transport_rdma` for unit tests, the file stem for `tests/*.rs`).
    pub target: String,
    /// Path of the executable.
    pub executable: PathBuf,
    /// The package's directory (cargo runs tests from there).
    pub package_dir: PathBuf,
}

/// Builds the tests of `packages` (`cargo test --no-run`) and lists their executables: the
/// integration tests (`tests/*.rs`), plus the library/binary unit tests with `unit_tests`
/// (those are pure and run on the host anyway; under emulation they are slow).
pub fn build(
    packages: &[String],
    release: bool,
    unit_tests: bool,
    cwd: &Path,
) -> Result<Vec<TestBinary>, VmError> {
    let mut cargo = Command::new(crate::workspace::cargo());
    cargo
        .args([
            "test",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(cwd)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for package in packages {
        cargo.args(["-p", package]);
    }
    if release {
        cargo.arg("--release");
    }
    if unit_tests {
        cargo.arg("--tests");
    } else {
        cargo.args(["--test", "*"]);
    }
    eprintln!("[xtask] building test binaries of {}", packages.join(", "));
    let output = cargo
        .output()
        .map_err(|e| VmError::io("running cargo test --no-run", e))?;
    if !output.status.success() {
        return Err(VmError::Command {
            what: "cargo test --no-run".into(),
            detail: format!("{} (see the compiler messages above)", output.status),
        });
    }
    parse_artifacts(&String::from_utf8_lossy(&output.stdout))
}

/// Test executables from cargo's JSON messages.
pub fn parse_artifacts(json_lines: &str) -> Result<Vec<TestBinary>, VmError> {
    let mut binaries = Vec::new();
    for line in json_lines.lines().filter(|l| l.starts_with('{')) {
        let msg: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| VmError::Parse(format!("cargo JSON message: {e}")))?;
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let Some(executable) = msg["executable"].as_str() else {
            continue;
        };
        let manifest = PathBuf::from(msg["manifest_path"].as_str().unwrap_or_default());
        let package_id = msg["package_id"].as_str().unwrap_or_default();
        binaries.push(TestBinary {
            package: package_name(package_id),
            target: msg["target"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            executable: PathBuf::from(executable),
            package_dir: manifest.parent().map(Path::to_path_buf).unwrap_or_default(),
        });
    }
    Ok(binaries)
}

/// `path+file:///work/main/rpc-transport-rdma#0.1.0` → `rpc-transport-rdma`;
/// `path+file:///x/y#name@0.1.0` → `name`.
fn package_name(id: &str) -> String {
    let tail = id.rsplit('/').next().unwrap_or(id);
    let (path_part, fragment) = tail.split_once('#').unwrap_or((tail, ""));
    match fragment.split_once('@') {
        Some((name, _)) => name.to_string(),
        None => path_part.to_string(),
    }
}

/// Test binaries that leave the device unusable for a while, so nothing may run after them
/// in the boot: `chaos_link` sets the link down under 64 connections, and soft-RoCE's
/// connection manager does not take new connections for minutes after.
pub const RUNS_LAST: &[&str] = &["chaos_link"];

/// Test binaries that need two hosts: each runs in the first VM of a pair (`vm-pair`),
/// against the echo server over rdma:// and tcp:// in the second, which takes its first
/// link down and up when asked (see [`pair_plans`]).
pub const PAIR_ONLY: &[&str] = &["chaos_pair", "chaos_pair_heal", "nic_pair"];

/// Where the second VM of a pair serves the echo service (the ports `chaos_pair` calls):
/// over rdma:// on every device (so through either link), over tcp:// on the first link.
const PAIR_SERVICES: [&str; 2] = ["rdma://0.0.0.0:7471", "tcp://{peer}:7472"];

/// Test binaries with no RDMA in them (gRPC over HTTP/2, against Python's grpcio and
/// tonic): the host's `cargo test` runs them, the VM does not run them again.
pub const HOST_ONLY: &[&str] = &[
    "grpc_interop",
    "grpc_hostile",
    "grpc_tonic",
    "one_port",
    "tcp_tls",
];

/// What the VM skips in the other binaries, which the host ran and which have no RDMA in
/// them: their gRPC tests (each suite's `grpc` case and those against grpcio) and their
/// TLS ones (each suite's `tcps` case).
pub const HOST_ONLY_TESTS: &[&str] = &["grpc", "tcps"];

/// One step per test binary, run from its package directory like `cargo test` does; those
/// of [`RUNS_LAST`] at the end, none of [`HOST_ONLY`].
pub fn plan(binaries: &[TestBinary], test_args: &[String], cwd: &Path) -> GuestPlan {
    let mut plan = GuestPlan::new(cwd);
    let mut ordered: Vec<&TestBinary> = binaries
        .iter()
        .filter(|b| ![HOST_ONLY, PAIR_ONLY].concat().contains(&b.target.as_str()))
        .collect();
    ordered.sort_by_key(|b| RUNS_LAST.contains(&b.target.as_str()));
    for binary in ordered {
        // The tests that need a device are `#[ignore]`d for plain `cargo test` on hosts
        // without one; here they run.
        let mut argv = vec![
            binary.executable.to_string_lossy().into_owned(),
            "--include-ignored".to_owned(),
        ];
        for skipped in HOST_ONLY_TESTS {
            argv.extend(["--skip".to_owned(), (*skipped).to_owned()]);
        }
        argv.extend(test_args.iter().cloned());
        let command = GuestCommand::new(argv)
            .in_dir(&binary.package_dir)
            .env("CARGO_MANIFEST_DIR", binary.package_dir.to_string_lossy());
        let label = format!("{} ({})", binary.target, binary.package);
        plan.steps
            .push(Step::run(label, command).with_timeout(PER_BINARY_TIMEOUT));
    }
    plan
}

/// The two plans that run `binary` (one of [`PAIR_ONLY`], with `test_args`) across a pair
/// of VMs meeting in `dir`: the first VM runs the tests, told the server's address on the
/// first link in `PAIR_PEER`, the route over each link as `device/local address/server's
/// address` in `PAIR_ROUTES` (comma-separated), and the meeting directory in `PAIR_DIR`; the second
/// serves the echo service over rdma:// and tcp:// with the package's `echo-server`, and
/// takes its first link down when the file `link-down` appears in `dir` and up when
/// `link-up` does, saying so with `link-is-down` and `link-is-up`; `link-blip` takes it
/// down for the seconds the file says, then up (`link-is-blipped`).
pub fn pair_plans(
    binary: &TestBinary,
    test_args: &[String],
    dir: &Path,
    cwd: &Path,
) -> [GuestPlan; 2] {
    let peer = &PAIR_LINKS[0].addr(1);
    let netdev = PAIR_LINKS[0].netdev;
    let routes: Vec<String> = PAIR_LINKS
        .iter()
        .map(|link| format!("{}/{}/{}", link.device, link.addr(0), link.addr(1)))
        .collect();
    let q = |path: &Path| quote(&path.to_string_lossy());
    let echo = binary
        .executable
        .parent()
        .and_then(Path::parent)
        .map(|profile_dir| profile_dir.join("echo-server"))
        .unwrap_or_default();
    // Each server's pid in `$e0`, `$e1`: the watch below ends when either exits, and the
    // pair's script then sees the server side gone.
    let server: Vec<String> = PAIR_SERVICES
        .iter()
        .enumerate()
        .map(|(i, url)| format!("{} {} & e{i}=$!;", q(&echo), url.replace("{peer}", peer)))
        .collect();
    let file = |name: &str| q(&dir.join(name));
    let mut watch: Vec<String> = ["down", "up"]
        .iter()
        .map(|state| {
            format!(
                "[ -e {ask} ] && [ ! -e {done} ] && ip link set {netdev} {state} && touch {done};",
                ask = file(&format!("link-{state}")),
                done = file(&format!("link-is-{state}")),
            )
        })
        .collect();
    // Down for as long as the file says, and up again.
    let (blip, blipped) = (file("link-blip"), file("link-is-blipped"));
    watch.push(format!(
        "[ -e {blip} ] && [ ! -e {blipped} ] && ip link set {netdev} down \
         && sleep \"$(cat {blip})\" && ip link set {netdev} up && touch {blipped};"
    ));
    let server = format!(
        "{} while kill -0 $e0 2>/dev/null && kill -0 $e1 2>/dev/null; do {} sleep 0.05; done; \
         echo 'an echo-server exited'; exit 1",
        server.join(" "),
        watch.join(" ")
    );
    let args: Vec<String> = test_args.iter().map(|arg| quote(arg)).collect();
    let client = format!(
        "cd {} && env PAIR_PEER={peer} PAIR_ROUTES={} PAIR_DIR={} CARGO_MANIFEST_DIR={} {} \
         --include-ignored {}",
        q(&binary.package_dir),
        routes.join(","),
        q(dir),
        q(&binary.package_dir),
        q(&binary.executable),
        args.join(" "),
    );
    let ready = ServerReady::Lines(
        PAIR_SERVICES
            .iter()
            .map(|url| format!("listening on {}", url.replace("{peer}", peer)))
            .collect(),
    );
    client_server_plans(cwd, dir, &ready, &server, &client, PER_BINARY_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_test_executables() {
        let json = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/rpc-transport-rdma#0.1.0","manifest_path":"/w/rpc-transport-rdma/Cargo.toml","target":{"name":"rc_pingpong"},"profile":{"test":true},"executable":"/t/debug/deps/rc_pingpong-1"}
{"reason":"compiler-artifact","package_id":"registry+https://x#libc@0.2.0","manifest_path":"/r/libc/Cargo.toml","target":{"name":"libc"},"profile":{"test":false},"executable":null}
{"reason":"build-finished","success":true}"#;
        let found = parse_artifacts(json).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].package, "rpc-transport-rdma");
        assert_eq!(found[0].target, "rc_pingpong");
        assert_eq!(found[0].package_dir, PathBuf::from("/w/rpc-transport-rdma"));
    }

    #[test]
    fn binaries_that_disturb_the_device_run_last_and_host_only_ones_not_at_all() {
        let binary = |target: &str| TestBinary {
            package: "rpc-examples".into(),
            target: target.into(),
            executable: PathBuf::from(format!("/t/{target}")),
            package_dir: PathBuf::from("/w/examples"),
        };
        let binaries = [
            binary("chaos_link"),
            binary("grpc_interop"),
            binary("auth"),
            binary("chaos"),
        ];
        let plan = plan(&binaries, &[], Path::new("/w"));
        let labels: Vec<&str> = plan.steps.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "auth (rpc-examples)",
                "chaos (rpc-examples)",
                "chaos_link (rpc-examples)"
            ]
        );
    }

    #[test]
    fn package_names() {
        assert_eq!(package_name("path+file:///w/xtask#0.1.0"), "xtask");
        assert_eq!(package_name("path+file:///w/dir#other@0.1.0"), "other");
    }
}
