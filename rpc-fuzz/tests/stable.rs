//! Every fuzz target, fed on stable for a short time each (`RPC_FUZZ_SECONDS`, default 1):
//! its cargo-fuzz corpus if one is saved, its seeds, then seeded random inputs.

use std::path::Path;
use std::time::Duration;

#[test]
fn every_target_takes_its_seeds_and_random_inputs_without_a_panic() {
    let seconds: u64 = std::env::var("RPC_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let seed = std::env::var("RPC_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    for target in rpc_fuzz::TARGETS {
        let report = rpc_fuzz::fuzz(
            target,
            Some(&corpus.join(target.name)),
            seed,
            Duration::from_secs(seconds),
        )
        .unwrap_or_else(|finding| {
            let findings = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fuzz-findings");
            let saved = match finding.save(&findings) {
                Ok(path) => format!(
                    "saved to {0}; replay with: cargo run -p rpc-fuzz -- --target {1} --replay {0}",
                    path.display(),
                    finding.target
                ),
                Err(e) => format!("could not save the input: {e}"),
            };
            panic!("{finding}\n{saved}")
        });
        println!(
            "{}: {} inputs ({} given), seed {seed}",
            target.name, report.inputs, report.given
        );
    }
}

#[test]
fn a_panicking_input_is_a_finding_that_names_its_seed() {
    fn explodes(data: &[u8]) {
        assert!(data.len() < 3, "three bytes or more");
    }
    let target = rpc_fuzz::Target {
        name: "explodes",
        run: explodes,
        seeds: || vec![vec![1, 2]],
    };
    let finding = rpc_fuzz::fuzz(&target, None, 42, Duration::from_secs(5))
        .expect_err("random inputs of three bytes or more come within seconds");
    assert_eq!(finding.seed, 42);
    assert!(finding.input.len() >= 3);
    assert!(
        finding.message.contains("three bytes or more"),
        "{}",
        finding.message
    );
}
