//! `rpc-fuzz`: runs every fuzz target (or one) on the stable toolchain for a time each,
//! and prints what it fed them; `--replay FILE` feeds one saved input again.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Runs the fuzz targets' bodies on stable: corpus, seeds, then random inputs")]
struct Args {
    /// Seconds of random inputs per target.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// The generator's seed (a finding prints the one that made it); random if not given.
    #[arg(long)]
    seed: Option<u64>,
    /// Only this target.
    #[arg(long)]
    target: Option<String>,
    /// cargo-fuzz's corpus: a directory per target, fed before the random inputs.
    #[arg(long, default_value = "fuzz/corpus")]
    corpus: PathBuf,
    /// Where a finding's input is saved.
    #[arg(long, default_value = "target/fuzz-findings")]
    findings: PathBuf,
    /// Feeds this one saved input to `--target` and exits.
    #[arg(long, requires = "target")]
    replay: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let targets: Vec<_> = match &args.target {
        Some(name) => match rpc_fuzz::target(name) {
            Some(target) => vec![target],
            None => {
                let names: Vec<_> = rpc_fuzz::TARGETS.iter().map(|t| t.name).collect();
                eprintln!("no target {name}; there are: {}", names.join(", "));
                return ExitCode::FAILURE;
            }
        },
        None => rpc_fuzz::TARGETS.iter().collect(),
    };
    if let Some(path) = &args.replay {
        let input = match std::fs::read(path) {
            Ok(input) => input,
            Err(e) => {
                eprintln!("cannot read {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        };
        return match rpc_fuzz::feed(targets[0], &input) {
            Ok(()) => {
                println!("{}: {} bytes, no panic", targets[0].name, input.len());
                ExitCode::SUCCESS
            }
            Err(message) => {
                eprintln!("{}: panicked: {message}", targets[0].name);
                ExitCode::FAILURE
            }
        };
    }
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    let budget = Duration::from_secs(args.seconds);
    println!(
        "{:<16} {:>8} {:>12} {:>10} {:>8}",
        "target", "given", "inputs", "inputs/s", "seed"
    );
    for target in targets {
        let corpus = args.corpus.join(target.name);
        match rpc_fuzz::fuzz(target, Some(&corpus), seed, budget) {
            Ok(report) => println!(
                "{:<16} {:>8} {:>12} {:>10.0} {:>8}",
                report.target,
                report.given,
                report.inputs,
                report.inputs as f64 / report.elapsed.as_secs_f64(),
                report.seed
            ),
            Err(finding) => {
                eprintln!("FINDING {finding}");
                match finding.save(&args.findings) {
                    Ok(saved) => eprintln!(
                        "saved to {0}; replay with: cargo run -p rpc-fuzz -- --target {1} --replay {0}",
                        saved.display(),
                        finding.target
                    ),
                    Err(e) => eprintln!("could not save the input: {e}"),
                }
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
