//! fvd's Slurm worker job (`deploy/slurm/fvd-worker.sbatch`) on a real
//! one-node Slurm cluster that the test starts on localhost (`cluster.rs`).
//!
//! The example port, plus a slow stand-in component, runs against an
//! orchestrator the test runs, through the worker job:
//!
//! 1. the first allocation is `scancel`led while the slow component runs
//!    (Slurm's SIGTERM, as at a preemption): its run is handed back, not
//!    lost and not a verdict;
//! 2. a second allocation takes it up, finishes the port (an escape hatch
//!    answered on the way) and is then told to drain the way `--signal=
//!    B:USR1@…` does before a time limit, while the slow component runs:
//!    the run finishes and is reported, the worker exits, the job ends.
//!
//! Built only with `--features slurm` (root, `slurm-wlm` and `munge`
//! needed); `scripts/test.sh` installs the packages and runs it:
//!
//! ```sh
//! cargo test --locked --features slurm --test slurm
//! ```
//! It fails, never skips, when Slurm cannot be started.

mod cluster;
#[allow(dead_code)]
#[path = "../e2e/support.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use cluster::Cluster;
use support::{components, fvd, wait_for};

const FAMILY: &str = "tinyport";

/// Copies a folder tree (the example port) so the test can write into it.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == ".fvd" || name == "__pycache__" || name == ".pytest_cache" {
            continue;
        }
        let target = to.join(&name);
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn git(repo: &Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args([
            "-c",
            "user.name=fvd test",
            "-c",
            "user.email=fvd@test.invalid",
        ])
        .args(args)
        .current_dir(repo)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `examples/tinyport` in a git repository (its agents need one), plus
/// `long_step`: a stand-in for a long parity test that runs until
/// `release` exists.
fn write_port(repo: &Path, release: &Path) {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tinyport");
    copy_tree(&example, repo);
    let test = "tests/local_tests/generic/test_tinyport_long_step_parity.py";
    std::fs::write(
        repo.join(test),
        format!(
            "import os, time\n\n\n\
             def test_tinyport_long_step_parity():\n    \
             deadline = time.time() + 150\n    \
             while not os.path.exists({release:?}):\n        \
             assert time.time() < deadline, 'never released'\n        \
             time.sleep(0.05)\n",
            release = release.display().to_string()
        ),
    )
    .unwrap();
    let spec = repo.join("tests/local_tests/tinyport/port.toml");
    let mut text = std::fs::read_to_string(&spec).unwrap();
    text.push_str(&format!(
        "\n# The Slurm test's stand-in for a long parity test.\n\
         [[component]]\nname = \"long_step\"\ntype = \"generic\"\n\
         parity_test = \"{test}\"\ncoverage_scope = \"implementation_subcomponent\"\n\
         timeout_s = 180\n"
    ));
    std::fs::write(&spec, text).unwrap();
    git(repo, &["init", "-q"]);
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", "tinyport with a long step"]);
}

struct Orchestrator {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Drop for Orchestrator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(dir: &Path, token: &Path) -> Orchestrator {
    use std::io::{BufRead, BufReader};
    let log = dir.join("orchestrator.log");
    let mut child = fvd()
        .args(["orchestrator", "serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(format!("sqlite://{}", dir.join("state.db").display()))
        .arg("--token-file")
        .arg(token)
        .env("FVD_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn orchestrator");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("the orchestrator prints its address");
    let url = line
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "first line {line:?}");
    Orchestrator { child, url, log }
}

struct Fleet<'a> {
    cluster: &'a Cluster,
    orch: &'a Orchestrator,
    token: PathBuf,
    repo: PathBuf,
}

impl Fleet<'_> {
    /// `fvd status --json` of the port, through the orchestrator.
    fn status(&self) -> Option<serde_json::Value> {
        let out = fvd()
            .args(["status", FAMILY, "--json", "--orchestrator", &self.orch.url])
            .arg("--token-file")
            .arg(&self.token)
            .output()
            .expect("run fvd status");
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Submits the worker job with `deploy/slurm/fvd-worker.sbatch`.
    fn sbatch_worker(&self) -> u32 {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/slurm/fvd-worker.sbatch");
        let mut cmd = self.cluster.cmd("sbatch");
        cmd.arg("--parsable")
            .arg(format!(
                "--output={}/worker-%j.out",
                self.cluster.dir().display()
            ))
            .arg(script)
            .current_dir(self.cluster.dir())
            .env("FVD_BIN", env!("CARGO_BIN_EXE_fvd"))
            .env("FVD_ORCHESTRATOR", &self.orch.url)
            .env("FVD_TOKEN_FILE", &self.token)
            // The node-local scratch a site's Slurm names (job ids restart
            // at 1 in every test cluster: /tmp/JOBID could be shared).
            .env("SLURM_TMPDIR", self.scratch())
            .env("FVD_LOG", "info");
        self.cluster.sbatch(&mut cmd)
    }

    fn scratch(&self) -> PathBuf {
        self.cluster.dir().join("scratch")
    }

    fn worker_output(&self, job: u32) -> String {
        std::fs::read_to_string(self.cluster.dir().join(format!("worker-{job}.out")))
            .unwrap_or_default()
    }

    /// Everything a failure message needs.
    fn story(&self, jobs: &[u32]) -> String {
        let mut s = format!(
            "status: {}\n--- orchestrator\n{}\n",
            self.status().unwrap_or_default(),
            std::fs::read_to_string(&self.orch.log).unwrap_or_default()
        );
        for j in jobs {
            s.push_str(&format!("--- worker job {j}\n{}\n", self.worker_output(*j)));
        }
        s.push_str(&self.cluster.logs());
        s
    }

    /// The component row `(name, status, runs, worker_id)` of `name`.
    fn component(&self, name: &str) -> Option<(String, String, u64, String)> {
        components(&self.status()?)
            .into_iter()
            .find(|r| r.0 == name)
    }

    fn wait_until(&self, what: &str, jobs: &[u32], limit: Duration, ok: impl Fn(&Self) -> bool) {
        let start = std::time::Instant::now();
        while !ok(self) {
            assert!(
                start.elapsed() < limit,
                "timed out after {limit:?} waiting for {what}\n{}",
                self.story(jobs)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[test]
fn the_example_port_runs_through_slurm_worker_jobs_that_are_cancelled_and_drained() {
    let cluster = Cluster::start();
    let dir = cluster.dir().to_path_buf();
    let token = dir.join("token");
    std::fs::write(&token, "slurm-test-token-0123456789abcdef\n").unwrap();
    let repo = dir.join("repo");
    let release = dir.join("release");
    write_port(&repo, &release);
    let orch = serve(&dir, &token);
    let fleet = Fleet {
        cluster: &cluster,
        orch: &orch,
        token: token.clone(),
        repo: repo.clone(),
    };
    let submit = fvd()
        .args(["submit", "--family", FAMILY, "--orchestrator", &orch.url])
        .arg("--token-file")
        .arg(&token)
        .arg("--repo")
        .arg(&fleet.repo)
        .output()
        .unwrap();
    assert!(
        submit.status.success(),
        "submit: {}",
        String::from_utf8_lossy(&submit.stderr)
    );

    // 1. The first allocation runs the port until long_step is running.
    let first = fleet.sbatch_worker();
    let first_worker = format!("slurm-{first}-");
    fleet.wait_until(
        "long_step running on the first allocation",
        &[first],
        Duration::from_secs(90),
        |f| {
            f.component("long_step")
                .is_some_and(|r| r.1 == "running" && r.3.starts_with(&first_worker))
        },
    );
    // Preemption, the end of the allocation or a person: Slurm's SIGTERM
    // to every process of the job (the test included), SIGKILL 30 s later.
    cluster.scancel(&[], first);
    fleet.wait_until(
        "the first allocation to end",
        &[first],
        Duration::from_secs(60),
        |f| f.cluster.job_state(first).is_none(),
    );
    let out = fleet.worker_output(first);
    assert!(
        out.contains("handed them back") && out.contains("long_step"),
        "the worker handed its running jobs back:\n{}",
        fleet.story(&[first])
    );
    assert!(
        out.contains(&format!("workspace={}/fvd", fleet.scratch().display()))
            && !fleet.scratch().join("fvd").exists(),
        "the worker used the node-local scratch and left nothing there:\n{out}"
    );
    fleet.wait_until(
        "long_step to leave the first allocation's worker",
        &[first],
        Duration::from_secs(30),
        |f| f.component("long_step").is_some_and(|r| r.1 != "running"),
    );
    let row = fleet.component("long_step").expect("long_step row");
    assert_eq!(
        (row.1.as_str(), row.2),
        ("queued", 0),
        "the cut run is queued again, no verdict and no run counted:\n{}",
        fleet.story(&[first])
    );

    // 2. A second allocation picks the port up.
    let second = fleet.sbatch_worker();
    let second_worker = format!("slurm-{second}-");
    fleet.wait_until(
        "time_shift to ask its question",
        &[first, second],
        Duration::from_secs(120),
        |f| f.component("time_shift").is_some_and(|r| r.1 == "ask_user"),
    );
    let answer = fvd()
        .args(["answer", FAMILY, "E001", "--option", "1"])
        .args(["--orchestrator", &orch.url])
        .arg("--token-file")
        .arg(&token)
        .output()
        .unwrap();
    assert!(
        answer.status.success(),
        "answer: {}",
        String::from_utf8_lossy(&answer.stderr)
    );
    fleet.wait_until(
        "every component but long_step final, long_step running on the second allocation",
        &[first, second],
        Duration::from_secs(120),
        |f| {
            let Some(s) = f.status() else { return false };
            components(&s).iter().all(|r| {
                if r.0 == "long_step" {
                    r.1 == "running" && r.3.starts_with(&second_worker)
                } else {
                    r.1 == "non_skip_pass" || r.1 == "blocked"
                }
            })
        },
    );
    // What `--signal=B:USR1@…` sends before the time limit: the batch
    // shell asks every worker to drain.
    cluster.scancel(&["--batch", "--signal=USR1"], second);
    fleet.wait_until(
        "the drain to reach the orchestrator",
        &[first, second],
        Duration::from_secs(60),
        |f| {
            std::fs::read_to_string(&f.orch.log)
                .unwrap_or_default()
                .contains("worker drains")
        },
    );
    assert!(
        cluster.job_state(second).is_some(),
        "a draining worker stays while its job runs:\n{}",
        fleet.story(&[first, second])
    );
    std::fs::write(&release, "go").unwrap();
    fleet.wait_until(
        "the drained worker to leave and its job to end",
        &[first, second],
        Duration::from_secs(60),
        |f| f.cluster.job_state(second).is_none(),
    );

    let status = wait_for("the port to end", Duration::from_secs(30), || {
        let s = fleet.status()?;
        (s["state"] != "running").then_some(s)
    });
    let rows = components(&status);
    let verdict = |name: &str| {
        rows.iter()
            .find(|r| r.0 == name)
            .unwrap_or_else(|| panic!("no {name} in {rows:?}"))
            .clone()
    };
    let long = verdict("long_step");
    assert_eq!(
        (long.1.as_str(), long.2),
        ("non_skip_pass", 1),
        "drained, not cut: one run, reported:\n{}",
        fleet.story(&[first, second])
    );
    assert!(long.3.starts_with(&second_worker), "{long:?}");
    for name in ["embed", "transformer", "timestep_embed", "time_shift"] {
        assert_eq!(verdict(name).1, "non_skip_pass", "{name}: {rows:?}");
    }
    for name in ["vae", "decoder_norm", "refiner"] {
        assert_eq!(verdict(name).1, "blocked", "{name}: {rows:?}");
    }
    assert_eq!(status["state"], "blocked", "{status}");
    let out = fleet.worker_output(second);
    assert!(
        out.contains("USR1: draining") && out.contains("workers exited (0)"),
        "the batch shell drained its workers and ended by itself:\n{out}"
    );
    if std::env::var_os("FVD_SLURM_STORY").is_some() {
        eprintln!("{}", fleet.story(&[first, second]));
    }
}
