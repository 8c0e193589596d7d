//! The bodies of the fuzz targets, and a runner that feeds them on the stable toolchain.
//!
//! Each target takes any bytes and either works or fails with a named error; a panic (an
//! assertion, an overflow, an index out of bounds) is a finding. `fuzz/` wraps the same
//! bodies for cargo-fuzz (libFuzzer, nightly) for long runs; [`fuzz`] runs them anywhere,
//! in CI among the tests: first the saved corpus and each target's seeds (valid inputs its
//! encoders make), then inputs from one seeded random generator, fresh or mutated from
//! those, until its time is up. A finding names the seed, which replays it, and the input
//! is saved for `rpc-fuzz --replay`.
#![forbid(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

mod mutate;
mod targets;

/// A fuzz target.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// Its name, as cargo-fuzz knows it.
    pub name: &'static str,
    /// Feeds it one input.
    pub run: fn(&[u8]),
    /// Valid inputs, to mutate (those whose input is structured by `arbitrary` have none).
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "header",
        run: targets::header::run,
        seeds: targets::header::seeds,
    },
    Target {
        name: "connect_params",
        run: targets::connect_params::run,
        seeds: targets::connect_params::seeds,
    },
    Target {
        name: "tcp_frames",
        run: targets::tcp_frames::run,
        seeds: targets::tcp_frames::seeds,
    },
    Target {
        name: "tcp_preface",
        run: targets::tcp_preface::run,
        seeds: targets::tcp_preface::seeds,
    },
    Target {
        name: "grpc_request",
        run: targets::grpc_request::run,
        seeds: targets::grpc_request::seeds,
    },
    Target {
        name: "stream_inbox",
        run: targets::stream_inbox::run,
        seeds: Vec::new,
    },
    Target {
        name: "connection",
        run: targets::connection::run,
        seeds: Vec::new,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|target| target.name == name)
}

/// Longest random input made.
pub const MAX_INPUT: usize = 4096;

/// What a run of one target did.
#[derive(Debug, Clone)]
pub struct Report {
    pub target: &'static str,
    /// The generator's seed.
    pub seed: u64,
    /// Saved corpus inputs and seeds fed first.
    pub given: usize,
    /// Inputs fed in all.
    pub inputs: u64,
    pub elapsed: Duration,
}

/// An input that made a target panic.
#[derive(Debug, Clone)]
pub struct Finding {
    pub target: &'static str,
    /// The generator's seed, which replays the run up to this input.
    pub seed: u64,
    /// Which input of the run it was.
    pub index: u64,
    pub input: Vec<u8>,
    /// What the panic said.
    pub message: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: input {} of seed {} ({} bytes) panicked: {}",
            self.target,
            self.index,
            self.seed,
            self.input.len(),
            self.message
        )
    }
}

/// Longest one input may run: past it the run is stuck (an endless loop), and the process
/// ends after printing the input.
pub const STALL_LIMIT: Duration = Duration::from_secs(10);

/// Feeds `target` the saved inputs in `corpus` (its files, if the directory exists) and
/// its seeds, then random inputs from `seed` until `budget` has passed (at least one).
pub fn fuzz(
    target: &Target,
    corpus: Option<&Path>,
    seed: u64,
    budget: Duration,
) -> Result<Report, Finding> {
    let started = Instant::now();
    let mut pool = (target.seeds)();
    if let Some(dir) = corpus {
        pool.extend(read_dir(dir));
    }
    let given = pool.len();
    let watchdog = Watchdog::start(target.name, seed);
    let mut inputs = 0u64;
    let mut feed = |input: Vec<u8>| {
        let index = inputs;
        inputs += 1;
        watchdog.feeding(index, &input);
        feed(target, &input).map_err(|message| Finding {
            target: target.name,
            seed,
            index,
            input,
            message,
        })
    };
    for input in pool.clone() {
        feed(input)?;
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    for random in 0u64.. {
        // The clock is read once every 64 inputs.
        if random > 0 && random.is_multiple_of(64) && started.elapsed() >= budget {
            break;
        }
        let input = match pool.len() {
            n if n > 0 && rng.u8(..4) != 0 => {
                let base = &pool[rng.usize(..n)];
                let other = &pool[rng.usize(..n)];
                mutate::mutate(&mut rng, base, other)
            }
            _ => mutate::fresh(&mut rng),
        };
        feed(input)?;
    }
    Ok(Report {
        target: target.name,
        seed,
        given,
        inputs,
        elapsed: started.elapsed(),
    })
}

impl Finding {
    /// Saves the input in `dir` (made if missing), named after the target, seed and index.
    pub fn save(&self, dir: &Path) -> std::io::Result<std::path::PathBuf> {
        let path = dir.join(format!("{}-{}-{}", self.target, self.seed, self.index));
        std::fs::create_dir_all(dir)?;
        std::fs::write(&path, &self.input)?;
        Ok(path)
    }
}

/// Watches a run for an input that never returns ([`STALL_LIMIT`]).
struct Watchdog {
    shared: std::sync::Arc<Watched>,
}

struct Watched {
    /// The input being fed, and its index.
    current: std::sync::Mutex<(u64, Vec<u8>)>,
    fed: std::sync::atomic::AtomicU64,
    done: std::sync::atomic::AtomicBool,
}

impl Watchdog {
    fn start(target: &'static str, seed: u64) -> Watchdog {
        use std::sync::atomic::Ordering::Relaxed;
        let shared = std::sync::Arc::new(Watched {
            current: std::sync::Mutex::new((0, Vec::new())),
            fed: 0.into(),
            done: false.into(),
        });
        let watched = shared.clone();
        std::thread::spawn(move || {
            let mut last = u64::MAX;
            let mut since = Instant::now();
            while !watched.done.load(Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                let fed = watched.fed.load(Relaxed);
                if fed != last {
                    (last, since) = (fed, Instant::now());
                } else if since.elapsed() > STALL_LIMIT {
                    let (index, input) =
                        &*watched.current.lock().unwrap_or_else(|e| e.into_inner());
                    let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
                    eprintln!(
                        "FINDING {target}: input {index} of seed {seed} ran for more than                          {STALL_LIMIT:?}; input (hex): {hex}"
                    );
                    std::process::exit(3);
                }
            }
        });
        Watchdog { shared }
    }

    fn feeding(&self, index: u64, input: &[u8]) {
        let mut current = self
            .shared
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        current.0 = index;
        current.1.clear();
        current.1.extend_from_slice(input);
        drop(current);
        self.shared
            .fed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared
            .done
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Feeds one input; a panic's message is the error.
pub fn feed(target: &Target, input: &[u8]) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(|| (target.run)(input))).map_err(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".to_string())
    })
}

/// The files of `dir`, if it exists (cargo-fuzz's corpus of one target).
fn read_dir(dir: &Path) -> Vec<Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    files
        .iter()
        .filter_map(|path| std::fs::read(path).ok())
        .collect()
}

/// Structured input from fuzzer bytes, as cargo-fuzz's `fuzz_target!` makes it.
fn arbitrary_input<'a, T: arbitrary::Arbitrary<'a>>(data: &'a [u8]) -> Option<T> {
    T::arbitrary_take_rest(arbitrary::Unstructured::new(data)).ok()
}

/// Feeds `data` to the target called `name` (the cargo-fuzz wrappers' body).
///
/// # Panics
/// If there is no such target, or the target panics (a finding).
pub fn run(name: &str, data: &[u8]) {
    let target = target(name).unwrap_or_else(|| panic!("no fuzz target {name}"));
    (target.run)(data);
}
