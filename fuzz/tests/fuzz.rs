//! Every fuzz target for a bounded time, through the `fvd-fuzz` binary (a
//! crash that kills the process is caught too, and its input recovered by
//! replaying the same run with each input written out first).
//!
//! `FVD_FUZZ_SECS` is the time of all targets together (default 8;
//! `scripts/test.sh` gives 60, which the test threads share), and
//! `FVD_FUZZ_SEED` fixes the seed (default: from the clock, printed).

use std::path::PathBuf;
use std::process::Command;

const TARGETS: usize = 9;

/// How one target's run ended.
enum Ended {
    Clean(String),
    Failed(String),
    /// Killed, with the input found by the traced replay.
    Killed {
        status: String,
        stderr: String,
        input: Option<Vec<u8>>,
        saved: PathBuf,
    },
}

fn run_target(target: &str, secs: f64, seed: &str) -> Ended {
    let crashes = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-crashes");
    let bin = env!("CARGO_BIN_EXE_fvd-fuzz");
    let run = |secs: f64, extra: &[&str]| {
        Command::new(bin)
            .args(["run", target, "--secs", &secs.to_string(), "--seed", seed])
            .arg("--crash-dir")
            .arg(&crashes)
            .args(extra)
            .output()
            .expect("fvd-fuzz runs")
    };
    let out = run(secs, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    match out.status.code() {
        Some(0) => Ended::Clean(stdout),
        Some(1) => Ended::Failed(stdout),
        _ => {
            // Killed (a stack overflow aborts): the same seed takes the same
            // inputs, and written out one by one, the last is the culprit.
            // Writing is slower, so the replay gets more time.
            std::fs::create_dir_all(&crashes).unwrap();
            let saved = crashes.join(format!("{target}-last-input"));
            let _ = run(
                secs * 20.0 + 5.0,
                &["--trace-inputs", saved.to_str().unwrap()],
            );
            Ended::Killed {
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                input: std::fs::read(&saved).ok(),
                saved,
            }
        }
    }
}

fn fuzz(target: &str) {
    let total: f64 = std::env::var("FVD_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8.0);
    let seed = std::env::var("FVD_FUZZ_SEED").unwrap_or_else(|_| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        (t.as_nanos() as u64 ^ target.len() as u64).to_string()
    });
    match run_target(target, total / TARGETS as f64, &seed) {
        Ended::Clean(stdout) => {
            println!("{stdout}");
            assert!(stdout.starts_with(&format!("{target}: ")), "{stdout}");
        }
        Ended::Failed(stdout) => panic!("fuzz target {target} found a failing input:\n{stdout}"),
        Ended::Killed {
            status,
            stderr,
            saved,
            ..
        } => panic!(
            "fuzz target {target} killed the process ({status}), seed {seed}:\n{stderr}\nthe input that killed it: {}",
            saved.display()
        ),
    }
}

/// A target that kills the process is caught, and its input recovered.
#[test]
fn an_aborting_input_is_recovered_by_replaying_the_seed() {
    match run_target("selftest_abort", 10.0, "7") {
        Ended::Killed { input, .. } => {
            let input = input.expect("the replay left the last input");
            assert!(
                input.windows(5).any(|w| w == b"ABORT"),
                "{:?}",
                String::from_utf8_lossy(&input)
            );
        }
        Ended::Clean(out) | Ended::Failed(out) => panic!("not killed: {out}"),
    }
}

#[test]
fn contract_block() {
    fuzz("contract_block");
}

#[test]
fn port_status() {
    fuzz("port_status");
}

#[test]
fn port_spec() {
    fuzz("port_spec");
}

#[test]
fn trace_jsonl() {
    fuzz("trace_jsonl");
}

#[test]
fn safetensors_header() {
    fuzz("safetensors_header");
}

#[test]
fn npy_header() {
    fuzz("npy_header");
}

#[test]
fn junit_verdict() {
    fuzz("junit_verdict");
}

#[test]
fn handoff() {
    fuzz("handoff");
}

#[test]
fn credentials() {
    fuzz("credentials");
}

/// The list above is every target of the binary.
#[test]
fn every_target_has_a_test() {
    let out = Command::new(env!("CARGO_BIN_EXE_fvd-fuzz"))
        .arg("list")
        .output()
        .unwrap();
    let listed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let here = include_str!("fuzz.rs");
    assert_eq!(listed.len(), TARGETS);
    for t in &listed {
        assert!(here.contains(&format!("fn {t}() {{")), "no test for {t}");
    }
}
