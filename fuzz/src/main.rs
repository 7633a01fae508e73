//! `fvd-fuzz`: run one fuzz target, or replay inputs through it.
//!
//! ```text
//! fvd-fuzz list
//! fvd-fuzz run TARGET [--secs S] [--runs N] [--seed N] [--crash-dir DIR] [--trace-inputs FILE]
//! fvd-fuzz replay TARGET FILE...
//! ```
//!
//! `run` replays the target's seeds and regressions, then mutates them for
//! `--secs` (default 10) or `--runs` inputs. Exit 0: nothing failed; 1: an
//! input failed (minimized, saved under `--crash-dir`, default
//! `target/fuzz-crashes`, and printed with the seed and run that found it);
//! 2: usage. `--trace-inputs FILE` writes every input to FILE before running
//! it, so the input of a crash that kills the process (a stack overflow)
//! is left there; a run with the same seed takes the same inputs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use fvd_fuzz::engine::{self, Config, Target};
use fvd_fuzz::{corpus, targets};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fvd-fuzz: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> Result<ExitCode, String> {
    let target = |name: Option<&String>| -> Result<&'static Target, String> {
        let name = name.ok_or("a target name is needed (fvd-fuzz list)")?;
        targets::find(name).ok_or_else(|| format!("no target {name:?} (fvd-fuzz list)"))
    };
    match args.first().map(String::as_str) {
        Some("list") => {
            for t in targets::TARGETS {
                println!("{}", t.name);
            }
            Ok(ExitCode::SUCCESS)
        }
        Some("replay") => {
            let t = target(args.get(1))?;
            let mut failed = false;
            for f in &args[2..] {
                let input = std::fs::read(f).map_err(|e| format!("cannot read {f}: {e}"))?;
                match engine::run_one(t, &input) {
                    Ok(_) => println!("{f}: ok"),
                    Err(m) => {
                        println!("{f}: FAILED: {m}");
                        failed = true;
                    }
                }
            }
            Ok(if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        Some("run") => fuzz(target(args.get(1))?, &args[2..]),
        _ => Err("usage: fvd-fuzz list | run TARGET [options] | replay TARGET FILE...".into()),
    }
}

fn fuzz(t: &'static Target, opts: &[String]) -> Result<ExitCode, String> {
    let mut secs = 10.0_f64;
    let mut runs = u64::MAX;
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut crash_dir = corpus::root().join("target/fuzz-crashes");
    let mut trace_inputs: Option<PathBuf> = None;
    let mut it = opts.iter();
    while let Some(o) = it.next() {
        let mut value = || it.next().ok_or(format!("{o} needs a value"));
        match o.as_str() {
            "--secs" => secs = value()?.parse().map_err(|_| "--secs takes seconds")?,
            "--runs" => runs = value()?.parse().map_err(|_| "--runs takes a count")?,
            "--seed" => {
                let v = value()?;
                seed = match v.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16),
                    None => v.parse(),
                }
                .map_err(|_| "--seed takes a number")?;
            }
            "--crash-dir" => crash_dir = PathBuf::from(value()?),
            "--trace-inputs" => trace_inputs = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown option {other}")),
        }
    }
    let seeds: Vec<Vec<u8>> = corpus::seeds(t).into_iter().map(|(_, d)| d).collect();
    let config = Config {
        seed,
        time: Duration::from_secs_f64(secs),
        runs,
    };
    let outcome = match &trace_inputs {
        Some(file) => traced(t, seeds, config, file)?,
        None => engine::fuzz(t, seeds, config),
    };
    println!("{}", outcome.summary());
    let Some(crash) = outcome.crash else {
        return Ok(ExitCode::SUCCESS);
    };
    let saved = save(&crash_dir, t.name, &crash.input)?;
    println!(
        "failing input ({} bytes) saved to {}\n  replay: fvd-fuzz replay {} {}\n  once fixed, keep it: cp {} fuzz/regressions/{}/\n  input: {}",
        crash.input.len(),
        saved.display(),
        t.name,
        saved.display(),
        saved.display(),
        t.name,
        preview(&crash.input)
    );
    Ok(ExitCode::FAILURE)
}

/// The same run with each input written to `file` first (slow).
fn traced(
    t: &'static Target,
    seeds: Vec<Vec<u8>>,
    config: Config,
    file: &Path,
) -> Result<engine::Outcome, String> {
    // The engine's sequence is replayed here input by input.
    let mut last = None;
    let o = engine::fuzz_with(t, seeds, config, &mut |input: &[u8]| {
        if let Err(e) = std::fs::write(file, input) {
            last = Some(e.to_string());
        }
    });
    match last {
        Some(e) => Err(format!("cannot write {}: {e}", file.display())),
        None => Ok(o),
    }
}

fn save(dir: &Path, target: &str, input: &[u8]) -> Result<PathBuf, String> {
    use std::hash::{Hash, Hasher};
    let dir = dir.join(target);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    input.hash(&mut h);
    let path = dir.join(format!("crash-{:016x}", h.finish()));
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(input))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// The input as escaped text, cut.
fn preview(input: &[u8]) -> String {
    let s: String = input.escape_ascii().to_string();
    if s.len() > 300 {
        format!("{}… ({} more bytes)", &s[..300], s.len() - 300)
    } else {
        s
    }
}
