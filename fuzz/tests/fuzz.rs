//! Every fuzz target for a bounded time, through the `fvd-fuzz` binary (a
//! crash that kills the process is caught too, and its input recovered by
//! replaying the same run with each input written out first).
//!
//! `FVD_FUZZ_SECS` is the time of all targets together (default 8;
//! `scripts/test.sh` gives 60, which the test threads share), and
//! `FVD_FUZZ_SEED` fixes the seed (default: from the clock, printed).

use std::path::PathBuf;
use std::process::Command;

const TARGETS: usize = 8;

fn fuzz(target: &str) {
    let total: f64 = std::env::var("FVD_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8.0);
    let secs = total / TARGETS as f64;
    let seed = std::env::var("FVD_FUZZ_SEED").unwrap_or_else(|_| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        (t.as_nanos() as u64 ^ target.len() as u64).to_string()
    });
    let crashes = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-crashes");
    let bin = env!("CARGO_BIN_EXE_fvd-fuzz");
    let run = |extra: &[&str]| {
        Command::new(bin)
            .args(["run", target, "--secs", &secs.to_string(), "--seed", &seed])
            .arg("--crash-dir")
            .arg(&crashes)
            .args(extra)
            .output()
            .expect("fvd-fuzz runs")
    };
    let out = run(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    match out.status.code() {
        Some(0) => {
            assert!(
                stdout.starts_with(&format!("{target}: ")),
                "{stdout}{stderr}"
            );
        }
        Some(1) => panic!("fuzz target {target} found a failing input:\n{stdout}"),
        _ => {
            // Killed (a stack overflow aborts): the same seed, each input
            // written out first, leaves the input that killed it.
            let last = crashes.join(format!("{target}-last-input"));
            std::fs::create_dir_all(&crashes).unwrap();
            let again = run(&["--trace-inputs", last.to_str().unwrap()]);
            panic!(
                "fuzz target {target} killed the process ({}), seed {seed}:\n{stderr}\nreplayed: {}; the input that killed it is {}",
                out.status,
                again.status,
                last.display()
            );
        }
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
