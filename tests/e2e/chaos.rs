//! The chaos driver (issue #27): `kill -9`s of every kind a fleet sees,
//! each followed by the recovery a person or a supervisor would do, and
//! the invariants checked after every trial. Categories: the orchestrator
//! with runs in flight (they must be adopted), a worker mid-run (its test
//! must die with it), an agent attempt on a worker (the orchestrator or the
//! worker killed under it), `fvd answer`, a drain, a traced
//! rerun, code-by-commit transfers on both ends, and the two named kill
//! points right after a verdict and after an agent attempt is committed.
//!
//! CI runs a handful of kills (`FVD_CHAOS_KILLS`, default 8, about one per
//! category up to the agent attempts: about a minute). A long run:
//!
//! ```text
//! FVD_CHAOS_KILLS=150 FVD_CHAOS_REPORT=chaos.md FVD_CHAOS_SEED=7 \
//!     cargo test --test e2e chaos -- --nocapture
//! ```
//!
//! prints a table of categories and anomalies (and writes it to
//! `FVD_CHAOS_REPORT`); any anomaly fails the test. An anomaly is a broken
//! invariant: a wrong final verdict, more runs of a component than one plus
//! the kills that hit it, a lease epoch used twice, an attempt, question or
//! answer lost or doubled, a test process outliving its worker, an
//! orchestrator log storm, or a port that never ends.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Sandbox, TestComponent, fvd};

/// What one trial did and found.
#[derive(Debug, Default)]
struct Trial {
    kills: u32,
    anomalies: Vec<String>,
    /// Runs in flight adopted by a restarted orchestrator.
    adopted: u32,
    /// Runs started again after a kill (more than one run of a component).
    reruns: u32,
    /// Agent attempts' fleet jobs adopted by a restarted orchestrator
    /// (issue #38), and tries of attempts run again after a kill.
    agents_adopted: u32,
    agents_rerun: u32,
    /// ERROR lines the orchestrator logged.
    errors: u32,
}

impl Trial {
    fn anomaly(&mut self, what: impl Into<String>) {
        self.anomalies.push(what.into());
    }
}

/// A small deterministic generator (xorshift), seeded per run.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A duration between `lo` and `hi` milliseconds.
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo + 1))
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Polls `f` until it returns `Some` or `limit` passes (then `None`).
fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

const PORT_END: Duration = Duration::from_secs(180);

/// A fixed loopback address, so workers find a restarted orchestrator.
pub(crate) fn free_addr() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string()
}

fn components(status: &serde_json::Value) -> BTreeMap<String, (String, u64, String)> {
    status["components"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    (
                        c["name"].as_str().unwrap_or_default().to_string(),
                        (
                            c["status"].as_str().unwrap_or_default().to_string(),
                            c["runs"].as_u64().unwrap_or_default(),
                            c["reason"].as_str().unwrap_or_default().to_string(),
                        ),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Waits for the port to leave `running`: its final status, or an anomaly.
fn ended(
    t: &mut Trial,
    what: &str,
    status: impl Fn() -> Option<serde_json::Value>,
) -> Option<serde_json::Value> {
    let s = poll(PORT_END, || {
        let s = status()?;
        (s["state"] != "running").then_some(s)
    });
    if s.is_none() {
        t.anomaly(format!("{what}: the port did not end in {PORT_END:?}"));
    }
    s
}

/// Checks each component's final status and that it ran at most once more
/// per kill than an uninterrupted run (`want`: status and runs).
fn check_components(
    t: &mut Trial,
    what: &str,
    status: &serde_json::Value,
    want: &[(&str, &str, u64)],
    reason_starts: Option<(&str, &str)>,
) {
    let got = components(status);
    for (name, st, runs) in want {
        let Some((gst, gruns, reason)) = got.get(*name) else {
            t.anomaly(format!("{what}: component {name} missing"));
            continue;
        };
        if gst != st {
            t.anomaly(format!("{what}: {name} ended {gst}, not {st} ({reason})"));
        }
        if *gruns > runs + u64::from(t.kills) {
            t.anomaly(format!(
                "{what}: {name} ran {gruns} times: more than {runs} plus one per kill ({})",
                t.kills
            ));
        }
        t.reruns += gruns.saturating_sub(*runs) as u32;
        if let Some((n, prefix)) = reason_starts
            && n == *name
            && !reason.starts_with(prefix)
        {
            t.anomaly(format!(
                "{what}: {name}'s reason is {reason:?}, not {prefix}…"
            ));
        }
    }
}

/// Rows of a query on the SQLite file `db`, through Python's sqlite3 (the
/// tests need Python anyway).
pub(crate) fn query(db: &Path, sql: &str) -> Vec<Vec<serde_json::Value>> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sqlite3, sys\nc = sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True)\nprint(json.dumps(c.execute(sys.argv[2]).fetchall()))",
        ])
        .arg(db)
        .arg(sql)
        .output()
        .expect("run python3");
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// Store-wide invariants: no lease epoch given to two runs, no escape
/// hatch answered twice or of a duplicated question.
fn check_db(t: &mut Trial, what: &str, db: &Path) {
    for row in query(
        db,
        "SELECT lease_epoch, COUNT(*) FROM jobs WHERE lease_epoch IS NOT NULL GROUP BY lease_epoch HAVING COUNT(*) > 1",
    ) {
        t.anomaly(format!(
            "{what}: lease epoch {row:?} used by more than one run"
        ));
    }
    for row in query(
        db,
        "SELECT family, component, question, COUNT(*) FROM escape_hatches WHERE status <> 'withdrawn' GROUP BY family, component, question HAVING COUNT(*) > 1",
    ) {
        t.anomaly(format!("{what}: a question asked twice: {row:?}"));
    }
}

/// Test processes whose worker (of this sandbox) is dead: they must have
/// died with it.
fn check_orphans(t: &mut Trial, what: &str, sb: &Sandbox) {
    let dir = std::fs::canonicalize(sb.dir.path())
        .unwrap_or_else(|_| sb.dir.path().to_path_buf())
        .display()
        .to_string();
    let orphans = || -> Vec<(i32, String)> {
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(env) = std::fs::read(e.path().join("environ")) else {
                continue;
            };
            let Some(mark) = env
                .split(|b| *b == 0)
                .find_map(|v| v.strip_prefix(b"FVD_WORKER".as_slice()))
                .map(|v| String::from_utf8_lossy(v).to_string())
            else {
                continue;
            };
            if !mark.contains(&dir) {
                continue;
            }
            let worker: i32 = mark
                .trim_start_matches('=')
                .split('.')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            let zombie = std::fs::read_to_string(e.path().join("stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .map(|(_, r)| r.trim_start().starts_with('Z'))
                })
                .unwrap_or(true);
            if !zombie && !Path::new(&format!("/proc/{worker}")).exists() {
                out.push((pid, mark));
            }
        }
        out
    };
    // The reaper needs a moment.
    if poll(Duration::from_secs(5), || {
        orphans().is_empty().then_some(())
    })
    .is_none()
    {
        t.anomaly(format!(
            "{what}: test processes outlived their worker: {:?}",
            orphans()
        ));
    }
}

/// ERROR lines of the orchestrator's log (every incarnation), and an
/// anomaly past `max`: a restart loop logs far more.
fn check_log(t: &mut Trial, what: &str, sb: &Sandbox, max: u32) {
    let log = crate::durability::strip_colours(&sb.orchestrator_log());
    t.errors = log.lines().filter(|l| l.contains(" ERROR ")).count() as u32;
    for l in log
        .lines()
        .filter(|l| l.contains("adopted a run in flight"))
    {
        if l.contains("/agent-") {
            t.agents_adopted += 1;
        } else {
            t.adopted += 1;
        }
    }
    if t.errors > max {
        t.anomaly(format!(
            "{what}: {} ERROR lines in the orchestrator's log",
            t.errors
        ));
    }
}

fn restart(sb: &mut Sandbox, addr: &str, extra: &[&str]) {
    sb.kill_orchestrator();
    sb.serve_at(addr, extra);
}

fn remote(sb: &Sandbox, family: &str) -> Option<serde_json::Value> {
    sb.remote_status(family)
}

fn sleepy(rng: &mut Rng) -> String {
    format!(
        "time.sleep({:.2})\nassert True",
        0.5 + (rng.below(150) as f64) / 100.0
    )
}

/// Orchestrator `kill -9`s (one to three) while runs are in flight; the
/// worker stays: every run in flight must be adopted, not run again.
fn orchestrator_restarts(rng: &mut Rng) -> Trial {
    let mut t = Trial::default();
    let mut sb = Sandbox::new();
    let names = ["a", "b", "c"];
    let comps: Vec<TestComponent> = names
        .iter()
        .map(|n| TestComponent::new(n, &sleepy(rng)))
        .collect();
    sb.port("chaos", &comps);
    let addr = free_addr();
    sb.serve_at(&addr, &[]);
    sb.worker("w1", 3);
    if !sb.submit_remote("chaos", &[]).status.success() {
        t.anomaly("orchestrator: submit failed (see the orchestrator's log)");
        return t;
    }
    let kills = 1 + rng.below(3) as u32;
    for _ in 0..kills {
        let running = poll(Duration::from_secs(60), || {
            let s = remote(&sb, "chaos")?;
            if s["state"] != "running" {
                return Some(false);
            }
            components(&s)
                .values()
                .any(|c| c.0 == "running")
                .then_some(true)
        });
        if running != Some(true) {
            break;
        }
        std::thread::sleep(rng.ms(0, 400));
        restart(&mut sb, &addr, &[]);
        t.kills += 1;
    }
    if let Some(s) = ended(&mut t, "orchestrator", || remote(&sb, "chaos")) {
        let want: Vec<(&str, &str, u64)> = names.iter().map(|n| (*n, "non_skip_pass", 1)).collect();
        check_components(&mut t, "orchestrator", &s, &want, None);
    }
    check_db(
        &mut t,
        "orchestrator",
        &sb.dir.path().join("orchestrator.db"),
    );
    check_orphans(&mut t, "orchestrator", &sb);
    check_log(&mut t, "orchestrator", &sb, 5);
    t
}

/// A worker `kill -9`ed while its test runs, started again later: its
/// test dies with it and the run finishes once elsewhere or on it again.
fn worker_kill(rng: &mut Rng) -> Trial {
    let mut t = Trial::default();
    let mut sb = Sandbox::new();
    sb.port(
        "wchaos",
        &[
            TestComponent::new("a", &sleepy(rng)),
            TestComponent::new("b", &sleepy(rng)),
        ],
    );
    sb.serve();
    sb.worker("w1", 2);
    if !sb.submit_remote("wchaos", &[]).status.success() {
        t.anomaly("worker: submit failed");
        return t;
    }
    let on = poll(Duration::from_secs(60), || {
        let s = remote(&sb, "wchaos")?;
        components(&s)
            .values()
            .any(|c| c.0 == "running")
            .then_some(())
    });
    if on.is_some() {
        std::thread::sleep(rng.ms(0, 600));
        sb.kill_worker("w1");
        t.kills += 1;
        check_orphans(&mut t, "worker", &sb);
        std::thread::sleep(rng.ms(0, 1500));
        sb.worker("w1", 2);
    }
    if let Some(s) = ended(&mut t, "worker", || remote(&sb, "wchaos")) {
        check_components(
            &mut t,
            "worker",
            &s,
            &[("a", "non_skip_pass", 1), ("b", "non_skip_pass", 1)],
            None,
        );
    }
    check_db(&mut t, "worker", &sb.dir.path().join("orchestrator.db"));
    check_log(&mut t, "worker", &sb, 5);
    t
}

/// A worker asked to drain is `kill -9`ed before it finished: its runs go
/// back to the queue and finish once a worker is back.
fn drain_kill(rng: &mut Rng) -> Trial {
    let mut t = Trial::default();
    let mut sb = Sandbox::new();
    sb.port(
        "dchaos",
        &[
            TestComponent::new("a", &sleepy(rng)),
            TestComponent::new("b", &sleepy(rng)),
        ],
    );
    sb.serve();
    sb.worker("w1", 2);
    if !sb.submit_remote("dchaos", &[]).status.success() {
        t.anomaly("drain: submit failed");
        return t;
    }
    let on = poll(Duration::from_secs(60), || {
        let s = remote(&sb, "dchaos")?;
        components(&s)
            .values()
            .any(|c| c.0 == "running")
            .then_some(())
    });
    if on.is_some() {
        let out = fvd()
            .args(["worker", "drain", "--workspace"])
            .arg(sb.dir.path().join("ws-w1"))
            .output()
            .unwrap();
        if !out.status.success() {
            t.anomaly(format!(
                "drain: fvd worker drain failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        std::thread::sleep(rng.ms(0, 800));
        sb.kill_worker("w1");
        t.kills += 1;
        sb.worker("w1", 2);
    }
    if let Some(s) = ended(&mut t, "drain", || remote(&sb, "dchaos")) {
        check_components(
            &mut t,
            "drain",
            &s,
            &[("a", "non_skip_pass", 1), ("b", "non_skip_pass", 1)],
            None,
        );
    }
    check_db(&mut t, "drain", &sb.dir.path().join("orchestrator.db"));
    check_orphans(&mut t, "drain", &sb);
    check_log(&mut t, "drain", &sb, 5);
    t
}

/// The example port's agent component on a fleet whose agents run on the
/// worker (issue #32), each agent turn slowed down.
fn agent_sandbox() -> Sandbox {
    let sb = Sandbox::with_repo_in("repo");
    crate::agent::example_repo(&sb, |s| {
        crate::durability::keep_components(&s, &["timestep_embed"]).replace(
            "command = [\"python3\", \"-B\", \"tools/replay_agent.py\", ",
            "command = [\"sh\", \"-c\", \"sleep 1; exec python3 -B tools/replay_agent.py \\\"$@\\\"\", \"agent\", ",
        )
    });
    sb
}

/// Waits until the agent component's agent runs (its status `agent`).
fn agent_runs(sb: &Sandbox) -> bool {
    poll(Duration::from_secs(60), || {
        let s = remote(sb, "tinyport")?;
        components(&s)
            .get("timestep_embed")
            .is_some_and(|c| c.0 == "agent")
            .then_some(())
    })
    .is_some()
}

/// The ledger after a kill during an attempt: two attempts, both run on
/// the worker `w1`, `tries` in all, and one commit per attempt on the
/// branch.
fn check_attempts(t: &mut Trial, what: &str, sb: &Sandbox, tries: std::ops::RangeInclusive<u64>) {
    let url = sb.url.clone().unwrap_or_default();
    let l = crate::agent::ledger_of(sb, "timestep_embed", Some(&url));
    let attempts = l["attempts"].as_array().cloned().unwrap_or_default();
    if attempts.len() != 2 {
        t.anomaly(format!(
            "{what}: {} attempts recorded, not 2",
            attempts.len()
        ));
    }
    for a in &attempts {
        if a["worker_id"] != "w1" {
            t.anomaly(format!(
                "{what}: attempt {} ran on {}, not w1",
                a["attempt"], a["worker_id"]
            ));
        }
    }
    let n: u64 = attempts
        .iter()
        .map(|a| a["tries"].as_u64().unwrap_or(0))
        .sum();
    t.agents_rerun += n.saturating_sub(attempts.len() as u64) as u32;
    if !tries.contains(&n) {
        t.anomaly(format!("{what}: {n} tries for 2 attempts, not {tries:?}"));
    }
    let log = crate::agent::git(
        sb.repo(),
        &["log", "--format=%s", "fvd/tinyport/timestep_embed"],
    );
    if log.lines().filter(|l| l.starts_with("fvd: ")).count() != 2 {
        t.anomaly(format!(
            "{what}: the branch holds {log:?}, not one commit per attempt"
        ));
    }
}

/// The orchestrator `kill -9`ed while an attempt's agent runs on the
/// worker: the restarted orchestrator adopts the attempt's fleet job, and
/// the agent goes on (issue #38); a try no worker ran any more (killed
/// before its lease was written, or after it ended) runs once more under
/// its number, from its base. An adopted try run again too is an anomaly.
fn agent_attempt(rng: &mut Rng) -> Trial {
    let mut t = Trial::default();
    let mut sb = agent_sandbox();
    // Its agent runs a command of the spec's own (a wrapper around the
    // replay agent): allowed on this orchestrator.
    let allow = ["--allow-agent-commands"];
    let addr = free_addr();
    sb.serve_at(&addr, &allow);
    sb.worker("w1", 2);
    let submit = sb.submit_remote("tinyport", &[]);
    if !submit.status.success() {
        t.anomaly(format!(
            "agent: submit failed: {}",
            String::from_utf8_lossy(&submit.stderr)
        ));
        return t;
    }
    if agent_runs(&sb) {
        std::thread::sleep(rng.ms(0, 800));
        restart(&mut sb, &addr, &allow);
        t.kills += 1;
    }
    if let Some(s) = ended(&mut t, "agent", || remote(&sb, "tinyport")) {
        check_components(
            &mut t,
            "agent",
            &s,
            &[("timestep_embed", "non_skip_pass", 3)],
            None,
        );
    }
    // The attempt cut off ran once more (or had just been recorded).
    let most = 2 + u64::from(t.kills);
    check_attempts(&mut t, "agent", &sb, 2..=most);
    check_db(&mut t, "agent", &sb.dir.path().join("orchestrator.db"));
    check_orphans(&mut t, "agent", &sb);
    check_log(&mut t, "agent", &sb, 5);
    if t.agents_adopted + t.agents_rerun > t.kills {
        t.anomaly(format!(
            "agent: {} tries adopted and {} run again after {} kills",
            t.agents_adopted, t.agents_rerun, t.kills
        ));
    }
    t
}

/// The worker `kill -9`ed while an attempt's agent runs on it, started
/// again later: the agent dies with it, and the attempt is placed again
/// from its base under the same number, its ledger row opened once.
fn agent_worker_kill(rng: &mut Rng) -> Trial {
    let mut t = Trial::default();
    let mut sb = agent_sandbox();
    sb.serve_with(&["--allow-agent-commands"]);
    sb.worker("w1", 2);
    let submit = sb.submit_remote("tinyport", &[]);
    if !submit.status.success() {
        t.anomaly(format!(
            "agent worker: submit failed: {}",
            String::from_utf8_lossy(&submit.stderr)
        ));
        return t;
    }
    if agent_runs(&sb) {
        std::thread::sleep(rng.ms(0, 800));
        sb.kill_worker("w1");
        t.kills += 1;
        check_orphans(&mut t, "agent worker", &sb);
        std::thread::sleep(rng.ms(0, 1500));
        sb.worker("w1", 2);
    }
    if let Some(s) = ended(&mut t, "agent worker", || remote(&sb, "tinyport")) {
        check_components(
            &mut t,
            "agent worker",
            &s,
            &[("timestep_embed", "non_skip_pass", 3)],
            None,
        );
    }
    check_attempts(&mut t, "agent worker", &sb, 2..=2);
    check_db(
        &mut t,
        "agent worker",
        &sb.dir.path().join("orchestrator.db"),
    );
    check_log(&mut t, "agent worker", &sb, 5);
    t
}

/// `fvd answer` (embedded) `kill -9`ed at a random moment while the
/// answered attempt runs; a person answers again or resumes the port.
fn answer_kill(rng: &mut Rng) -> Trial {
    let mut t = Trial::default();
    let sb = Sandbox::new();
    crate::agent::example_repo(&sb, |s| {
        crate::durability::keep_components(&s, &["time_shift"])
    });
    let first = fvd()
        .args(["submit", "--family", "tinyport", "--wait", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    if first.status.code() != Some(3) {
        t.anomaly(format!(
            "answer: the first submit exited {:?}, not 3",
            first.status
        ));
        return t;
    }
    let mut child = fvd()
        .args(["answer", "tinyport", "E001", "--option", "1", "--repo"])
        .arg(sb.repo())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(rng.ms(0, 3000));
    let _ = child.kill();
    let _ = child.wait();
    t.kills += 1;
    // What a person does next: answer again if the answer did not land,
    // else resume the port.
    let open = sb
        .local_status("tinyport")
        .is_some_and(|s| s["escapes"][0]["status"] == "open");
    let next = if open {
        fvd()
            .args(["answer", "tinyport", "E001", "--option", "1", "--repo"])
            .arg(sb.repo())
            .output()
            .unwrap()
    } else {
        fvd()
            .args(["submit", "--family", "tinyport", "--wait", "--repo"])
            .arg(sb.repo())
            .output()
            .unwrap()
    };
    if next.status.code() != Some(0) {
        t.anomaly(format!(
            "answer: the recovery exited {:?}: {}",
            next.status,
            String::from_utf8_lossy(&next.stdout)
        ));
    }
    if let Some(s) = sb.local_status("tinyport") {
        check_components(
            &mut t,
            "answer",
            &s,
            &[("time_shift", "non_skip_pass", 2)],
            None,
        );
        let escapes = s["escapes"].as_array().cloned().unwrap_or_default();
        if escapes.len() != 1 || escapes[0]["status"] != "resolved" {
            t.anomaly(format!("answer: escapes {escapes:?}"));
        }
    }
    let l = crate::agent::ledger_of(&sb, "time_shift", None);
    let n = l["attempts"].as_array().map_or(0, Vec::len);
    if n != 2 {
        t.anomaly(format!("answer: {n} attempts, not 2"));
    }
    check_db(&mut t, "answer", &sb.repo().join(".fvd/state.db"));
    check_orphans(&mut t, "answer", &sb);
    t
}

/// The traced component on a fleet; the orchestrator is killed at a
/// random moment of its drill-down.
fn traced_rerun(rng: &mut Rng) -> Trial {
    let mut t = Trial::default();
    let mut sb = Sandbox::with_repo_in("repo");
    crate::agent::example_repo(&sb, |s| {
        crate::durability::keep_components(&s, &["refiner"])
    });
    let addr = free_addr();
    sb.serve_at(&addr, &[]);
    sb.worker("w1", 2);
    if !sb.submit_remote("tinyport", &[]).status.success() {
        t.anomaly("trace: submit failed");
        return t;
    }
    std::thread::sleep(rng.ms(300, 4000));
    restart(&mut sb, &addr, &[]);
    t.kills += 1;
    if let Some(s) = ended(&mut t, "trace", || remote(&sb, "tinyport")) {
        check_components(
            &mut t,
            "trace",
            &s,
            &[("refiner", "blocked", 1)],
            Some(("refiner", "debug_red: first divergence: blocks.2.norm ")),
        );
    }
    check_db(&mut t, "trace", &sb.dir.path().join("orchestrator.db"));
    check_log(&mut t, "trace", &sb, 5);
    t
}

/// A worker that cannot see the checkout fetches the code by commit; the
/// worker or the orchestrator is killed while it does.
fn code_by_commit(rng: &mut Rng) -> Trial {
    let mut t = Trial::default();
    let mut sb = Sandbox::with_repo_in("hidden/repo");
    crate::agent::example_repo(&sb, |s| {
        crate::durability::keep_components(&s, &["embed", "decoder_norm"])
    });
    let addr = free_addr();
    sb.serve_at(&addr, &[]);
    crate::bycommit::spawn_hidden_worker(&mut sb, "far", &[]);
    if !sb.submit_remote("tinyport", &[]).status.success() {
        t.anomaly("code: submit failed");
        return t;
    }
    std::thread::sleep(rng.ms(100, 2500));
    if rng.below(2) == 0 {
        sb.kill_worker("far");
        crate::bycommit::spawn_hidden_worker(&mut sb, "far", &[]);
    } else {
        restart(&mut sb, &addr, &[]);
    }
    t.kills += 1;
    if let Some(s) = ended(&mut t, "code", || remote(&sb, "tinyport")) {
        check_components(
            &mut t,
            "code",
            &s,
            &[
                ("embed", "non_skip_pass", 1),
                ("decoder_norm", "blocked", 1),
            ],
            None,
        );
    }
    check_db(&mut t, "code", &sb.dir.path().join("orchestrator.db"));
    check_log(&mut t, "code", &sb, 5);
    t
}

/// `FVD_CRASH_AT=verdict-committed:N` on the agent component (embedded).
fn verdict_point(rng: &mut Rng) -> Trial {
    let mut t = Trial::default();
    let sb = Sandbox::new();
    crate::agent::example_repo(&sb, |s| {
        crate::durability::keep_components(&s, &["timestep_embed"])
    });
    let nth = 1 + rng.below(3);
    let point = format!("verdict-committed:{nth}");
    t.kills += embedded_kill_and_resume(&mut t, &sb, &point, 0);
    if let Some(s) = sb.local_status("tinyport") {
        check_components(
            &mut t,
            "verdict",
            &s,
            &[("timestep_embed", "non_skip_pass", 3)],
            None,
        );
        // A verdict on record is never run again, whatever the kill.
        let runs = components(&s).get("timestep_embed").map_or(0, |c| c.1);
        if runs != 3 {
            t.anomaly(format!(
                "verdict: {runs} runs after a kill at {point}, not 3"
            ));
        }
    }
    let n = crate::agent::ledger_of(&sb, "timestep_embed", None)["attempts"]
        .as_array()
        .map_or(0, Vec::len);
    if n != 2 {
        t.anomaly(format!(
            "verdict: {n} attempts after a kill at {point}, not 2"
        ));
    }
    check_db(&mut t, "verdict", &sb.repo().join(".fvd/state.db"));
    t
}

/// `FVD_CRASH_AT=attempt-committed:N` (embedded): on the question of
/// `time_shift`, or on an attempt of `timestep_embed`.
fn attempt_point(rng: &mut Rng) -> Trial {
    let mut t = Trial::default();
    let sb = Sandbox::new();
    let asks = rng.below(2) == 0;
    let (comp, point, code, runs) = if asks {
        ("time_shift", "attempt-committed:1".to_string(), 3, 1)
    } else {
        (
            "timestep_embed",
            format!("attempt-committed:{}", 1 + rng.below(2)),
            0,
            3,
        )
    };
    crate::agent::example_repo(&sb, |s| crate::durability::keep_components(&s, &[comp]));
    t.kills += embedded_kill_and_resume(&mut t, &sb, &point, code);
    if let Some(s) = sb.local_status("tinyport") {
        let want = if asks { "ask_user" } else { "non_skip_pass" };
        let got = components(&s).get(comp).cloned().unwrap_or_default();
        if got.0 != want || got.1 != runs {
            t.anomaly(format!(
                "attempt: {comp} is {} after {} runs; want {want} after {runs}",
                got.0, got.1
            ));
        }
        if asks && s["escapes"].as_array().map_or(0, Vec::len) != 1 {
            t.anomaly(format!("attempt: escapes {}", s["escapes"]));
        }
    }
    let l = crate::agent::ledger_of(&sb, comp, None);
    let attempts = l["attempts"].as_array().cloned().unwrap_or_default();
    let want = if asks { 1 } else { 2 };
    if attempts.len() != want || attempts.iter().any(|a| a["tries"] != 1) {
        t.anomaly(format!("attempt: ledger {l} after a kill at {point}"));
    }
    check_db(&mut t, "attempt", &sb.repo().join(".fvd/state.db"));
    t
}

/// Runs `fvd submit --wait` with `FVD_CRASH_AT=point`, expects it killed,
/// then resumes it and expects `code`. Returns the kills (0 or 1).
fn embedded_kill_and_resume(t: &mut Trial, sb: &Sandbox, point: &str, code: i32) -> u32 {
    use std::os::unix::process::ExitStatusExt;
    let out = fvd()
        .args(["submit", "--family", "tinyport", "--wait", "--repo"])
        .arg(sb.repo())
        .env("FVD_CRASH_AT", point)
        .output()
        .unwrap();
    if out.status.signal() != Some(9) {
        t.anomaly(format!(
            "{point}: the submit was not killed there: {:?}",
            out.status
        ));
        return 0;
    }
    let again = fvd()
        .args(["submit", "--family", "tinyport", "--wait", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    if again.status.code() != Some(code) {
        t.anomaly(format!(
            "{point}: the resumed submit exited {:?}, not {code}: {}",
            again.status,
            String::from_utf8_lossy(&again.stdout)
        ));
    }
    1
}

type Scenario = fn(&mut Rng) -> Trial;

/// In order: CI's default handful of kills covers the first ones.
const SCENARIOS: &[(&str, Scenario)] = &[
    ("orchestrator (runs in flight)", orchestrator_restarts),
    ("kill point: verdict-committed", verdict_point),
    ("kill point: attempt-committed", attempt_point),
    ("worker (mid-run)", worker_kill),
    ("agent attempt on a worker (orchestrator)", agent_attempt),
    ("agent attempt on a worker (worker)", agent_worker_kill),
    ("fvd answer", answer_kill),
    ("drain", drain_kill),
    ("traced rerun", traced_rerun),
    ("code by commit", code_by_commit),
];

#[derive(Debug, Default)]
struct Row {
    trials: u32,
    kills: u32,
    adopted: u32,
    reruns: u32,
    agents_adopted: u32,
    agents_rerun: u32,
    max_errors: u32,
    anomalies: Vec<String>,
    seconds: f64,
}

#[test]
fn chaos_kills_leave_no_anomaly() {
    let target: u32 = std::env::var("FVD_CHAOS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let seed: u64 = std::env::var("FVD_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
        | 1;
    eprintln!("chaos: {target} kills, FVD_CHAOS_SEED={seed}");
    let mut rng = Rng(seed);
    let mut rows: BTreeMap<usize, Row> = BTreeMap::new();
    let mut kills = 0;
    let started = Instant::now();
    let mut i = 0;
    while kills < target {
        let (name, scenario) = SCENARIOS[i % SCENARIOS.len()];
        let t0 = Instant::now();
        let trial = scenario(&mut rng);
        let row = rows.entry(i % SCENARIOS.len()).or_default();
        row.trials += 1;
        row.kills += trial.kills;
        row.adopted += trial.adopted;
        row.reruns += trial.reruns;
        row.agents_adopted += trial.agents_adopted;
        row.agents_rerun += trial.agents_rerun;
        row.max_errors = row.max_errors.max(trial.errors);
        row.seconds += t0.elapsed().as_secs_f64();
        for a in &trial.anomalies {
            eprintln!("chaos: ANOMALY in {name}: {a}");
        }
        row.anomalies.extend(trial.anomalies);
        kills += trial.kills.max(1);
        eprintln!(
            "chaos: {name}: {} kill(s), {kills}/{target} after {:.0} s",
            trial.kills,
            started.elapsed().as_secs_f64()
        );
        i += 1;
    }
    let mut table = String::from(
        "| category | trials | kill -9s | runs adopted | runs rerun | agent attempts adopted | agent tries rerun | max ERROR lines | anomalies | seconds |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut all = Vec::new();
    let mut total = Row::default();
    for (k, row) in &rows {
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |\n",
            SCENARIOS[*k].0,
            row.trials,
            row.kills,
            row.adopted,
            row.reruns,
            row.agents_adopted,
            row.agents_rerun,
            row.max_errors,
            row.anomalies.len(),
            row.seconds
        ));
        total.trials += row.trials;
        total.kills += row.kills;
        total.adopted += row.adopted;
        total.reruns += row.reruns;
        total.agents_adopted += row.agents_adopted;
        total.agents_rerun += row.agents_rerun;
        total.seconds += row.seconds;
        all.extend(
            row.anomalies
                .iter()
                .map(|a| format!("{}: {a}", SCENARIOS[*k].0)),
        );
    }
    table.push_str(&format!(
        "| **total** | {} | {} | {} | {} | {} | {} | | {} | {:.0} |\n",
        total.trials,
        total.kills,
        total.adopted,
        total.reruns,
        total.agents_adopted,
        total.agents_rerun,
        all.len(),
        total.seconds
    ));
    eprintln!("\nchaos report (seed {seed}):\n{table}");
    if let Ok(path) = std::env::var("FVD_CHAOS_REPORT") {
        let mut text = format!("FVD_CHAOS_SEED={seed} FVD_CHAOS_KILLS={target}\n\n{table}");
        if !all.is_empty() {
            text.push_str("\nAnomalies:\n");
            for a in &all {
                text.push_str(&format!("- {a}\n"));
            }
        }
        let _ = std::fs::write(PathBuf::from(path), text);
    }
    assert!(
        all.is_empty(),
        "{} anomalies:\n{}",
        all.len(),
        all.join("\n")
    );
}
