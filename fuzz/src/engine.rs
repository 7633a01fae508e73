//! A mutation fuzzer that runs on the stable toolchain, in process, with no
//! instrumentation: seeds are mutated (bit flips, interesting bytes and
//! numbers, dictionary tokens, splices of two inputs, the line and table
//! edits of a hand-written file, runs repeated thousands of times), every
//! input goes through the target under `catch_unwind`, and an input whose
//! *outcome* (the signature the target returns: which error, which verdict)
//! was not seen before joins the corpus. That signature stands in for the
//! edge coverage a libFuzzer build would give: coarser, but free of a second,
//! instrumented build of the workspace.
//!
//! Runs are reproducible from the seed and the run count ([`Config`]).

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

/// Longest input the mutator builds: parsers see files, not gigabytes; a
/// quadratic parser and a 10 KB echo still show at this size, and bigger
/// inputs would cost most of the time budget.
pub const MAX_INPUT: usize = 16 * 1024;
/// Inputs kept in the corpus at most (the seeds always stay).
const MAX_CORPUS: usize = 4096;

/// A fuzz target: one parser (or a few sharing an input format) and the
/// properties its results must have, checked with `assert!`.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub name: &'static str,
    /// Runs the parser; panics on a failed property. Returns a signature of
    /// the outcome (see the module doc).
    pub run: fn(&[u8]) -> u64,
    /// Tokens of the input format the mutator inserts.
    pub dictionary: &'static [&'static [u8]],
    /// Where seeds come from, relative to the workspace root (see
    /// [`crate::corpus::seeds`]).
    pub seeds: &'static [crate::corpus::Source],
}

/// How long and from where one fuzzing run goes.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub seed: u64,
    /// Stop after this long...
    pub time: Duration,
    /// ...or after this many inputs, whichever comes first.
    pub runs: u64,
}

/// An input that failed its target.
#[derive(Debug, Clone)]
pub struct Crash {
    pub input: Vec<u8>,
    /// The panic's message and location.
    pub message: String,
    /// Which run of the mutation sequence found it (replay with the seed).
    pub run: u64,
}

/// What one fuzzing run did.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub target: &'static str,
    pub seed: u64,
    pub seeds: usize,
    pub runs: u64,
    pub corpus: usize,
    pub signatures: usize,
    pub elapsed: Duration,
    /// The slowest single input and its time.
    pub slowest: Duration,
    pub crash: Option<Crash>,
}

impl Outcome {
    pub fn summary(&self) -> String {
        format!(
            "{}: {} inputs in {:.1}s ({} seeds, corpus {}, {} distinct outcomes, slowest input {:.1} ms, seed {:#x}){}",
            self.target,
            self.runs,
            self.elapsed.as_secs_f64(),
            self.seeds,
            self.corpus,
            self.signatures,
            self.slowest.as_secs_f64() * 1e3,
            self.seed,
            match &self.crash {
                Some(c) => format!(": CRASH at run {}: {}", c.run, c.message),
                None => String::new(),
            }
        )
    }
}

/// splitmix64: small, fast, and the same sequence on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// Runs `input` through `target`; the panic message when it fails.
pub fn run_one(target: &Target, input: &[u8]) -> Result<u64, String> {
    quiet_panics();
    QUIET.with(|q| q.set(true));
    let r = catch_unwind(AssertUnwindSafe(|| (target.run)(input)));
    QUIET.with(|q| q.set(false));
    r.map_err(|_| {
        LAST_PANIC
            .with(|p| p.take())
            .unwrap_or_else(|| "panic".into())
    })
}

thread_local! {
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Panics inside a target are recorded for the report instead of printed
/// (thousands of expected ones would drown the output); every other panic,
/// a failing test's included, goes to the hook that was there before.
fn quiet_panics() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if QUIET.with(|q| q.get()) {
                let msg = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                let at = info
                    .location()
                    .map(|l| format!(" at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{msg}{at}")));
            } else {
                previous(info);
            }
        }));
    });
}

/// Fuzzes `target` from `seeds` under `config`, stopping at the first crash
/// (minimized).
pub fn fuzz(target: &Target, seeds: Vec<Vec<u8>>, config: Config) -> Outcome {
    fuzz_with(target, seeds, config, &mut |_| {})
}

/// [`fuzz`], with `before` called on every input before it runs.
pub fn fuzz_with(
    target: &Target,
    seeds: Vec<Vec<u8>>,
    config: Config,
    before: &mut dyn FnMut(&[u8]),
) -> Outcome {
    let start = Instant::now();
    let mut rng = Rng::new(config.seed);
    let mut corpus: Vec<Vec<u8>> = if seeds.is_empty() {
        vec![Vec::new()]
    } else {
        seeds
    };
    let n_seeds = corpus.len();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut outcome = Outcome {
        target: target.name,
        seed: config.seed,
        seeds: n_seeds,
        runs: 0,
        corpus: 0,
        signatures: 0,
        elapsed: Duration::ZERO,
        slowest: Duration::ZERO,
        crash: None,
    };
    let mut check = |input: &[u8], run: u64, outcome: &mut Outcome| -> Option<u64> {
        before(input);
        let t = Instant::now();
        let r = run_one(target, input);
        outcome.slowest = outcome.slowest.max(t.elapsed());
        outcome.runs += 1;
        match r {
            Ok(sig) => Some(sig),
            Err(message) => {
                let input = minimize(target, input, &message);
                // The message of the input kept, which fails at the same place.
                let message = run_one(target, &input).err().unwrap_or(message);
                outcome.crash = Some(Crash {
                    input,
                    message,
                    run,
                });
                None
            }
        }
    };
    // Every seed first, as is.
    for (i, s) in corpus.clone().iter().enumerate() {
        match check(s, i as u64, &mut outcome) {
            Some(sig) => {
                seen.insert(sig);
            }
            None => return finish(outcome, corpus.len(), seen.len(), start),
        }
    }
    let mut run = n_seeds as u64;
    while run < config.runs && start.elapsed() < config.time {
        let base = &corpus[rng.below(corpus.len())];
        let other = &corpus[rng.below(corpus.len())];
        let input = mutate(&mut rng, base, other, target.dictionary);
        match check(&input, run, &mut outcome) {
            Some(sig) => {
                if seen.insert(sig) && corpus.len() < MAX_CORPUS {
                    corpus.push(input);
                }
            }
            None => break,
        }
        run += 1;
    }
    finish(outcome, corpus.len(), seen.len(), start)
}

fn finish(mut o: Outcome, corpus: usize, signatures: usize, start: Instant) -> Outcome {
    o.corpus = corpus;
    o.signatures = signatures;
    o.elapsed = start.elapsed();
    o
}

/// Where a panic message says it happened (`at FILE:LINE`), to tell one
/// bug from another while minimizing.
fn location(message: &str) -> &str {
    message.rsplit_once(" at ").map_or(message, |(_, at)| at)
}

/// A shorter input that fails at the same place: chunks removed while it
/// still does, halving the chunk size down to one byte, for a bounded time.
pub fn minimize(target: &Target, input: &[u8], message: &str) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let at = location(message).to_string();
    let fails_alike =
        |candidate: &[u8]| run_one(target, candidate).is_err_and(|m| location(&m) == at);
    let mut best = input.to_vec();
    let mut chunk = best.len() / 2;
    while chunk > 0 && Instant::now() < deadline {
        let mut i = 0;
        let mut shrunk = false;
        while i < best.len() && Instant::now() < deadline {
            let end = (i + chunk).min(best.len());
            let mut candidate = best[..i].to_vec();
            candidate.extend_from_slice(&best[end..]);
            if fails_alike(&candidate) {
                best = candidate;
                shrunk = true;
            } else {
                i += chunk;
            }
        }
        if !shrunk {
            chunk /= 2;
        }
    }
    best
}

/// Bytes that often matter to parsers of text formats.
const INTERESTING_BYTES: &[u8] = b"\x00\xff\x7f\x80\n\r\t \"'`|:#=,.-_[]{}()<>\\/@*";
/// Numbers at the edges of the integer and float types.
const INTERESTING_NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1",
    "255",
    "65536",
    "2147483648",
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "99999999999999999999999",
    "1e309",
    "-0.0",
    "NaN",
    "Infinity",
];

/// One input from `base`: one to eight stacked edits.
pub fn mutate(rng: &mut Rng, base: &[u8], other: &[u8], dict: &[&[u8]]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + rng.below(8) {
        edit(rng, &mut v, other, dict);
    }
    v.truncate(MAX_INPUT);
    v
}

fn edit(rng: &mut Rng, v: &mut Vec<u8>, other: &[u8], dict: &[&[u8]]) {
    let at = |rng: &mut Rng, v: &Vec<u8>| rng.below(v.len() + 1);
    match rng.below(14) {
        0 if !v.is_empty() => {
            let i = rng.below(v.len());
            v[i] ^= 1 << rng.below(8);
        }
        1 if !v.is_empty() => {
            let i = rng.below(v.len());
            v[i] = INTERESTING_BYTES[rng.below(INTERESTING_BYTES.len())];
        }
        2 if !v.is_empty() => {
            // Delete a range, usually short.
            let i = rng.below(v.len());
            let most = if rng.chance(4) {
                v.len() - i
            } else {
                16.min(v.len() - i)
            };
            let n = 1 + rng.below(most);
            v.drain(i..i + n);
        }
        3 if !v.is_empty() => {
            // Copy a range elsewhere.
            let i = rng.below(v.len());
            let n = 1 + rng.below(64.min(v.len() - i));
            let piece = v[i..i + n].to_vec();
            let j = at(rng, v);
            v.splice(j..j, piece);
        }
        4 | 5 if !dict.is_empty() => {
            let t = dict[rng.below(dict.len())];
            let j = at(rng, v);
            if rng.chance(2) || j + t.len() > v.len() {
                v.splice(j..j, t.iter().copied());
            } else {
                v[j..j + t.len()].copy_from_slice(t);
            }
        }
        6 if !other.is_empty() => {
            // Splice: a range of another input replaces one of this.
            let i = rng.below(other.len());
            let n = 1 + rng.below((other.len() - i).min(512));
            let j = at(rng, v);
            let k = (j + rng.below(64)).min(v.len());
            v.splice(j..k, other[i..i + n].iter().copied());
        }
        7 | 8 => lines(rng, v),
        9 => {
            let j = at(rng, v);
            let n = 1 + rng.below(8);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            v.splice(j..j, bytes);
        }
        10 => {
            // A number at the edge of its type, over a digit run or anywhere.
            let num = INTERESTING_NUMBERS[rng.below(INTERESTING_NUMBERS.len())].as_bytes();
            match v.iter().position(|b| b.is_ascii_digit()).map(|first| {
                let skip = rng.below(v.len() - first);
                let start = v[first + skip..]
                    .iter()
                    .position(|b| b.is_ascii_digit())
                    .map_or(first, |p| first + skip + p);
                let end = v[start..]
                    .iter()
                    .position(|b| !b.is_ascii_digit())
                    .map_or(v.len(), |p| start + p);
                (start, end)
            }) {
                Some((s, e)) => {
                    v.splice(s..e, num.iter().copied());
                }
                None => {
                    let j = at(rng, v);
                    v.splice(j..j, num.iter().copied());
                }
            }
        }
        11 if !v.is_empty() && rng.chance(4) => {
            // A range repeated many times: long keys, values and lines,
            // deep nesting, quadratic behaviour.
            let i = rng.below(v.len());
            let n = 1 + rng.below(32.min(v.len() - i));
            let times = 2 + rng.below(2048);
            let piece = v[i..i + n].repeat(times);
            let j = at(rng, v);
            v.splice(j..j, piece.into_iter().take(MAX_INPUT));
        }
        12 if !v.is_empty() => {
            let i = rng.below(v.len());
            v.truncate(i);
        }
        _ => {
            if !v.is_empty() {
                let i = rng.below(v.len());
                v[i] = v[i].wrapping_add(1 + rng.below(3) as u8);
            }
        }
    }
}

/// Edits of a hand-written text file, one line at a time: dropped,
/// doubled, cut short, swapped, re-indented, or a table cell removed (the
/// edits of the old contracts never-panic test).
fn lines(rng: &mut Rng, v: &mut Vec<u8>) {
    let mut ls: Vec<Vec<u8>> = v.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
    if ls.is_empty() {
        return;
    }
    let i = rng.below(ls.len());
    match rng.below(6) {
        0 => {
            ls.remove(i);
        }
        1 => {
            let l = ls[i].clone();
            ls.insert(i, l);
        }
        2 => {
            let keep = rng.below(ls[i].len() + 1);
            ls[i].truncate(keep);
        }
        3 => {
            let mut cells: Vec<Vec<u8>> = ls[i].split(|b| *b == b'|').map(<[u8]>::to_vec).collect();
            if cells.len() > 2 {
                cells.remove(rng.below(cells.len()));
                ls[i] = cells.join(&b'|');
            }
        }
        4 => {
            let j = rng.below(ls.len());
            ls.swap(i, j);
        }
        _ => {
            let trimmed: Vec<u8> = ls[i].iter().copied().skip_while(|b| *b == b' ').collect();
            let mut l = vec![b' '; rng.below(7)];
            l.extend(trimmed);
            ls[i] = l;
        }
    }
    *v = ls.join(&b'\n');
}

/// A signature from messages: their first words made of lowercase letters
/// and `_` only, so "line 3" and "line 7", or two different bad values,
/// are one outcome, and "unknown field" another.
pub fn signature(parts: &[&str]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in parts {
        for w in p
            .split_whitespace()
            .filter(|w| w.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
            .take(8)
        {
            w.hash(&mut h);
        }
        0u8.hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boom(input: &[u8]) -> u64 {
        assert!(!input.windows(3).any(|w| w == b"BUG"), "found the bug");
        input.len() as u64 % 7
    }

    const BOOM: Target = Target {
        name: "boom",
        run: boom,
        dictionary: &[b"BUG"],
        seeds: &[],
    };

    #[test]
    fn a_planted_bug_is_found_minimized_and_reproducible_from_the_seed() {
        let config = Config {
            seed: 7,
            // Ends at the crash, a few hundred inputs in; the bound is for a
            // broken engine, not a slow machine.
            time: Duration::from_secs(120),
            runs: 100_000,
        };
        let seeds = vec![b"some harmless text\nwith lines".to_vec()];
        let a = fuzz(&BOOM, seeds.clone(), config);
        let crash = a.crash.expect("the dictionary token is inserted soon");
        assert!(crash.run < 10_000, "found only at run {}", crash.run);
        assert_eq!(crash.input, b"BUG");
        assert!(
            crash.message.starts_with("found the bug at "),
            "{}",
            crash.message
        );
        let b = fuzz(&BOOM, seeds, config);
        assert_eq!(b.crash.unwrap().run, crash.run, "same seed, same sequence");
    }

    #[test]
    fn mutations_stay_within_the_size_bound() {
        let mut rng = Rng::new(1);
        let mut v = b"key: value\n| a | b |\n".to_vec();
        for _ in 0..20_000 {
            v = mutate(&mut rng, &v, b"other: 1", &[b"token"]);
            assert!(v.len() <= MAX_INPUT);
            if v.is_empty() {
                v = b"x".to_vec();
            }
        }
    }
}
