//! What to run in one VM boot, and the guest shell script generated from it.
//!
//! A [`GuestPlan`] is a list of [`Step`]s run one after another as root in the guest, after
//! soft-RoCE is up. A step is either one command or a server/client pair (the server in the
//! background, the client in the foreground, as perftest and rdma_cm tools need). Each
//! step's exit code and console output come back in a [`super::StepOutcome`].

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The guest's RDMA address: veth0, with soft-RoCE device `rxe0` on it.
pub const GUEST_ADDR: &str = "192.168.77.1";
/// The guest's IPv6 RDMA address, on veth0 too (RoCE over IPv6).
pub const GUEST_ADDR6: &str = "fd77::1";
/// The soft-RoCE device on [`GUEST_ADDR`].
pub const GUEST_DEVICE: &str = "rxe0";

/// One link between the two VMs of a pair (`cargo xtask vm-pair`), as each VM sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairLink {
    /// Its network device in each VM (a virtio one, found by its MAC address and renamed
    /// to this, so that commands can take it down and up).
    pub netdev: &'static str,
    /// The soft-RoCE device on it in each VM.
    pub device: &'static str,
    /// Its /24, without the last byte.
    subnet: &'static str,
}

impl PairLink {
    /// The address of VM `side` (0 or 1) on this link.
    pub fn addr(&self, side: usize) -> String {
        format!("{}.{}", self.subnet, side + 1)
    }
}

/// The MAC address of VM `side`'s end of link `link` (its place in [`PAIR_LINKS`]).
pub fn pair_mac(link: usize, side: usize) -> String {
    format!("52:54:00:77:{link:02x}:{:02x}", side + 1)
}

/// The links between the two VMs of a pair: two, so that a host has two RDMA devices that
/// reach its peer, each through its own network.
pub const PAIR_LINKS: [PairLink; 2] = [
    PairLink {
        netdev: "link0",
        device: "rxe1",
        subnet: "192.168.78",
    },
    PairLink {
        netdev: "link1",
        device: "rxe2",
        subnet: "192.168.79",
    },
];

/// One command line to run in the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestCommand {
    /// Program and arguments (the program is looked up in the guest's `PATH`).
    pub argv: Vec<String>,
    /// Working directory; defaults to the plan's.
    pub cwd: Option<PathBuf>,
    /// Extra environment for this command only.
    pub env: Vec<(String, String)>,
}

impl GuestCommand {
    /// A command from program and arguments.
    pub fn new<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        GuestCommand {
            argv: argv.into_iter().map(Into::into).collect(),
            cwd: None,
            env: Vec::new(),
        }
    }

    /// Runs the command in `dir`.
    pub fn in_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Adds an environment variable for this command.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// How the guest decides that a background server is ready for its client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ready {
    /// Sleep this long.
    Delay(Duration),
    /// Wait (up to 30 s) until something listens on this TCP port, e.g. perftest's 18515.
    TcpPort(u16),
}

/// What a step runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// One command in the foreground.
    Run(GuestCommand),
    /// `server` in the background, then `client` once the server is ready; the step fails
    /// if either fails. The server's output is kept apart (see `StepOutcome::server_output`).
    ClientServer {
        server: GuestCommand,
        client: GuestCommand,
        ready: Ready,
    },
}

/// One entry of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Short name for reports.
    pub label: String,
    /// What to run.
    pub action: Action,
    /// Guest-side limit (the script's `limit`: every thread's stack printed, then the
    /// command killed; exit code 124 when it fires).
    pub timeout: Option<Duration>,
}

impl Step {
    /// A single-command step.
    pub fn run(label: impl Into<String>, command: GuestCommand) -> Self {
        Step {
            label: label.into(),
            action: Action::Run(command),
            timeout: None,
        }
    }

    /// A server/client step.
    pub fn client_server(
        label: impl Into<String>,
        server: GuestCommand,
        client: GuestCommand,
        ready: Ready,
    ) -> Self {
        Step {
            label: label.into(),
            action: Action::ClientServer {
                server,
                client,
                ready,
            },
            timeout: None,
        }
    }

    /// Sets the guest-side time limit.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// Everything one boot runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestPlan {
    /// Default working directory of the commands (a host path; the guest sees the host's root).
    pub cwd: PathBuf,
    /// Environment of every command, on top of the defaults (`PATH`, `HOME`,
    /// `RDMA_RPC_REQUIRE_DEVICE=1`, `RDMA_RPC_TEST_ADDR`).
    pub env: Vec<(String, String)>,
    /// The steps, run in order; a failing step does not stop the next.
    pub steps: Vec<Step>,
    /// This VM's side (0 or 1) of a pair of VMs (`cargo xtask vm-pair`): each of
    /// [`PAIR_LINKS`] gets that side's address and its soft-RoCE device.
    pub pair_side: Option<usize>,
}

impl GuestPlan {
    /// An empty plan whose commands run in `cwd`.
    pub fn new(cwd: impl Into<PathBuf>) -> Self {
        GuestPlan {
            cwd: cwd.into(),
            env: Vec::new(),
            steps: Vec::new(),
            pair_side: None,
        }
    }

    /// The environment every command starts from (before per-command additions).
    pub fn base_env(&self) -> Vec<(String, String)> {
        let host =
            |key: &str, default: &str| std::env::var(key).unwrap_or_else(|_| default.to_string());
        let mut env = vec![
            (
                "PATH".to_string(),
                host(
                    "PATH",
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                ),
            ),
            ("HOME".to_string(), host("HOME", "/root")),
            ("RDMA_RPC_REQUIRE_DEVICE".to_string(), "1".to_string()),
            ("RDMA_RPC_TEST_ADDR".to_string(), GUEST_ADDR.to_string()),
            // The guest console is not the caller's terminal: plain output, no colours.
            ("TERM".to_string(), "dumb".to_string()),
        ];
        for key in ["RUST_BACKTRACE", "RUST_LOG"] {
            if let Ok(value) = std::env::var(key) {
                env.push((key.to_string(), value));
            }
        }
        env.extend(self.env.iter().cloned());
        env
    }

    /// The POSIX shell script the guest runs (in a chroot of the host's root): soft-RoCE
    /// setup, then every step between begin/end markers carrying `nonce`. `run_dir` must be
    /// writable in the guest (it lies under the writable share); server logs go there.
    pub fn render(&self, nonce: &str, run_dir: &Path) -> String {
        let mut s = String::new();
        let run_dir = quote(&run_dir.to_string_lossy());
        let _ = writeln!(
            s,
            "# Generated by `cargo xtask`; runs as root in the soft-RoCE VM."
        );
        s.push_str("export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");
        let _ = writeln!(s, "mark() {{ echo \"@@xtask-vm {nonce} $*\"; }}");
        let _ = writeln!(s, "die() {{ mark fail \"$*\"; exit 1; }}");
        let _ = writeln!(s, "RUN_DIR={run_dir}");
        s.push_str(LIMIT);
        s.push_str(&render_setup(self.pair_side));
        let env = self.base_env();
        for (index, step) in self.steps.iter().enumerate() {
            let _ = writeln!(s, "\nmark begin {index}");
            match &step.action {
                Action::Run(command) => {
                    let _ = writeln!(
                        s,
                        "{} </dev/null 2>&1",
                        self.render_command(command, &env, step.timeout)
                    );
                    let _ = writeln!(s, "rc=$?");
                }
                Action::ClientServer {
                    server,
                    client,
                    ready,
                } => {
                    let log = format!("\"$RUN_DIR\"/step-{index}.server.log");
                    let _ = writeln!(
                        s,
                        "{} </dev/null >{log} 2>&1 &",
                        self.render_command(server, &env, step.timeout)
                    );
                    let _ = writeln!(s, "server=$!");
                    s.push_str(&render_ready(ready));
                    let _ = writeln!(
                        s,
                        "{} </dev/null 2>&1",
                        self.render_command(client, &env, step.timeout)
                    );
                    let _ = writeln!(s, "rc=$?");
                    let _ = writeln!(s, "[ $rc -eq 0 ] || kill $server 2>/dev/null");
                    let _ = writeln!(s, "wait $server; server_rc=$?");
                    let _ = writeln!(s, "[ $rc -eq 0 ] && rc=$server_rc");
                }
            }
            let _ = writeln!(s, "mark end {index} $rc");
        }
        let _ = writeln!(s, "\nmark done");
        s
    }

    fn render_command(
        &self,
        command: &GuestCommand,
        env: &[(String, String)],
        timeout: Option<Duration>,
    ) -> String {
        let cwd = command.cwd.as_deref().unwrap_or(&self.cwd);
        let mut words: Vec<String> = Vec::new();
        let run = match timeout {
            Some(limit) => format!("limit {}", limit.as_secs().max(1)),
            None => "exec".to_string(),
        };
        words.extend(["env", "-i"].map(String::from));
        for (key, value) in env.iter().chain(&command.env) {
            words.push(format!("{key}={value}"));
        }
        words.extend(command.argv.iter().cloned());
        let line: Vec<String> = words.iter().map(|w| quote(w)).collect();
        format!(
            "(cd {} || exit 126; {run} {})",
            quote(&cwd.to_string_lossy()),
            line.join(" ")
        )
    }
}

/// `limit SECONDS COMMAND...`, the guest's step timeout: runs COMMAND and returns its status.
/// One still running after SECONDS has the stack of every thread of it and of its children
/// printed (gdb, if installed), so a hang can be read from the log, then gets SIGTERM and,
/// 10 s later, SIGKILL; `limit` then returns 124, as coreutils `timeout` does.
const LIMIT: &str = r#"
limit() {
  limit_secs=$1; shift
  "$@" &
  limit_pid=$!
  limit_flag="$RUN_DIR/timed-out.$limit_pid"
  (
    sleep "$limit_secs" </dev/null >/dev/null 2>&1
    kill -0 "$limit_pid" 2>/dev/null || exit 0
    touch "$limit_flag"
    echo "[xtask] pid $limit_pid still running after ${limit_secs}s; its threads' stacks:"
    if command -v gdb >/dev/null; then
      for p in $limit_pid $(pgrep -P "$limit_pid"); do
        timeout 120 gdb -p "$p" -batch -nx -ex 'info threads' -ex 'thread apply all bt' \
          </dev/null 2>&1 | grep -v '^\[New LWP' | head -n 4000
      done
    else
      echo "[xtask] (no gdb installed)"
    fi
    kill -TERM "$limit_pid" 2>/dev/null
    sleep 10 </dev/null >/dev/null 2>&1
    kill -KILL "$limit_pid" 2>/dev/null
  ) &
  limit_dog=$!
  wait "$limit_pid"
  limit_rc=$?
  pkill -P "$limit_dog" sleep 2>/dev/null
  wait "$limit_dog" 2>/dev/null
  if [ -e "$limit_flag" ]; then
    rm -f "$limit_flag"
    return 124
  fi
  return $limit_rc
}
"#;

/// Loads soft-RoCE and creates `rxe0` on veth0 with [`GUEST_ADDR`] and [`GUEST_ADDR6`],
/// and, on one side of a pair of VMs, the [`PAIR_LINKS`].
fn render_setup(pair_side: Option<usize>) -> String {
    let mut s = String::from(
        "\nmark setup\n\
         # rxe needs the crc32 hash; the kernel cannot autoload it from inside the chroot.\n\
         modprobe crc32_generic || die 'modprobe crc32_generic'\n\
         modprobe crc32_pclmul 2>/dev/null || true\n\
         for m in rdma_rxe rdma_ucm veth; do modprobe $m || die \"modprobe $m\"; done\n\
         ip link set lo up\n\
         ip link add veth0 type veth peer name veth1 || die 'ip link add veth0'\n",
    );
    let _ = writeln!(
        s,
        "ip addr add {GUEST_ADDR}/24 dev veth0 || die 'ip addr add'"
    );
    // No duplicate address detection: the address is usable (and in rxe0's GID table) at
    // once.
    let _ = writeln!(
        s,
        "ip -6 addr add {GUEST_ADDR6}/64 dev veth0 nodad || die 'ip -6 addr add'"
    );
    s.push_str("ip link set veth0 up || die 'ip link set veth0 up'\n");
    // One rxe device only. A second one on veth1 in this netns would not work (the kernel
    // routes between two local addresses over `lo`, where no rxe listens), and one in
    // another netns does not work on 6.1 either (rdma_cm: RDMA_CM_EVENT_UNREACHABLE).
    s.push_str("ip link set veth1 up || die 'ip link set veth1 up'\n");
    let _ = writeln!(
        s,
        "rdma link add {GUEST_DEVICE} type rxe netdev veth0 || die 'rdma link add {GUEST_DEVICE}'"
    );
    if let Some(side) = pair_side {
        s.push_str("modprobe virtio_net || die 'modprobe virtio_net'\n");
        for (l, link) in PAIR_LINKS.iter().enumerate() {
            s.push_str(&render_link(link, &pair_mac(l, side), side));
        }
    }
    s.push_str("mark ready\n");
    s
}

/// `link` to the other VM of a pair, on `side`: its virtio network device (the one with
/// MAC address `mac`), renamed, with that side's address, and its soft-RoCE device. The
/// other VM may still be booting: nothing here waits for it.
fn render_link(link: &PairLink, mac: &str, side: usize) -> String {
    let PairLink { netdev, device, .. } = link;
    let addr = link.addr(side);
    let mut s = format!(
        "IF=\n\
         for d in /sys/class/net/*; do\n\
         \x20   [ \"$(cat \"$d/address\")\" = {mac} ] && IF=${{d##*/}}\n\
         done\n\
         [ -n \"$IF\" ] || die 'no network device with MAC {mac} for {netdev}'\n"
    );
    let _ = writeln!(
        s,
        "ip link set \"$IF\" name {netdev} || die 'naming the link {netdev}'"
    );
    let _ = writeln!(
        s,
        "ip addr add {addr}/24 dev {netdev} || die 'ip addr add {addr}'"
    );
    let _ = writeln!(
        s,
        "ip link set {netdev} up || die 'ip link set {netdev} up'"
    );
    let _ = writeln!(
        s,
        "rdma link add {device} type rxe netdev {netdev} || die 'rdma link add {device}'"
    );
    s
}

fn render_ready(ready: &Ready) -> String {
    match ready {
        Ready::Delay(delay) => format!("sleep {:.1}\n", delay.as_secs_f64()),
        Ready::TcpPort(port) => format!(
            "i=0; while ! ss -Hltn 'sport = :{port}' 2>/dev/null | grep -q .; do \
             i=$((i+1)); [ $i -ge 150 ] && break; sleep 0.2; done; sleep 0.2\n"
        ),
    }
}

/// Quotes `word` for a POSIX shell.
pub fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `script` after the `limit` function in `sh`, with `RUN_DIR` a fresh directory.
    fn run_with_limit(name: &str, script: &str) -> String {
        let dir = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let body = format!(
            "RUN_DIR={}\n{LIMIT}\n{script}",
            quote(&dir.to_string_lossy())
        );
        let out = std::process::Command::new("sh")
            .args(["-c", &body])
            .output()
            .expect("sh runs");
        std::fs::remove_dir_all(&dir).unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn limit_returns_the_status_of_a_command_that_ends_in_time() {
        let out = run_with_limit("in-time", "limit 30 sh -c 'exit 3'; echo \"rc=$?\"");
        assert_eq!(out.trim(), "rc=3");
    }

    #[test]
    fn limit_reports_and_kills_a_command_past_its_time() {
        let out = run_with_limit("past-time", "limit 1 sleep 60; echo \"rc=$?\"");
        assert!(out.contains("still running after 1s"), "{out}");
        assert!(out.trim_end().ends_with("rc=124"), "{out}");
    }

    #[test]
    fn quoting() {
        assert_eq!(quote("abc"), "abc");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), "'it'\\''s'");
        assert_eq!(quote(""), "''");
    }

    #[test]
    fn a_side_of_a_pair_sets_up_both_links_and_their_devices() {
        let mut plan = GuestPlan::new("/w");
        let alone = plan.render("n", Path::new("/r"));
        assert!(!alone.contains("virtio_net"));
        plan.pair_side = Some(1);
        let script = plan.render("n", Path::new("/r"));
        assert!(script.contains("modprobe virtio_net"));
        assert!(script.contains("= 52:54:00:77:00:02 ]"));
        assert!(script.contains("ip addr add 192.168.78.2/24 dev link0"));
        assert!(script.contains("rdma link add rxe1 type rxe netdev link0"));
        assert!(script.contains("= 52:54:00:77:01:02 ]"));
        assert!(script.contains("ip addr add 192.168.79.2/24 dev link1"));
        assert!(script.contains("rdma link add rxe2 type rxe netdev link1"));
        // Before the guest says it is ready.
        assert!(script.find("rxe netdev link1") < script.find("mark ready"));
    }

    #[test]
    fn script_has_markers_for_each_step() {
        let mut plan = GuestPlan::new("/work");
        plan.steps
            .push(Step::run("one", GuestCommand::new(["true"])));
        plan.steps.push(Step::client_server(
            "two",
            GuestCommand::new(["srv"]),
            GuestCommand::new(["cli", "x y"]),
            Ready::TcpPort(18515),
        ));
        let script = plan.render("N", Path::new("/t/run"));
        assert!(script.contains("mark begin 0"));
        assert!(script.contains("mark end 1 $rc"));
        assert!(script.contains("'x y'"));
        assert!(script.contains("rdma link add rxe0 type rxe netdev veth0"));
        assert!(script.contains("ip -6 addr add fd77::1/64 dev veth0 nodad"));
        assert!(script.trim_end().ends_with("mark done"));
    }
}
