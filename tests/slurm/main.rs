//! fvd's Slurm deployment (`deploy/slurm`) on a real one-node Slurm cluster
//! that the test starts on localhost (`cluster.rs`), driven by the steps of
//! `deploy/slurm/README.md` as they are written there: every block marked
//! `<!-- step: NAME -->` runs in `bash -euo pipefail`, from the top of the
//! checkout, but `site`, whose variables the test provides itself (and
//! checks against the block, so the two cannot drift apart).
//!
//! The example port, plus a slow stand-in component:
//!
//! 1. `token` and `orchestrator` make the token and start the orchestrator,
//!    `workers` submits a worker job, and `submit` (`--wait`) starts the port
//!    and waits in the background;
//! 2. the test `scancel`s the worker job while the slow component runs
//!    (Slurm's SIGTERM, as at a preemption): its run is handed back, not lost
//!    and not a verdict;
//! 3. `workers` again: the second allocation carries the port on, `answer`
//!    answers its escape hatch, and `drain` drains the workers the way
//!    `--signal=B:USR1@…` does before a time limit, while the slow component
//!    runs: the run finishes and is reported, the worker exits, the job ends;
//! 4. `submit` and `answer` exit 1 (blocked components), and `stop` stops
//!    the orchestrator.
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
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use cluster::Cluster;
use support::{components, fvd, wait_for};

const FAMILY: &str = "tinyport";

/// The steps of `deploy/slurm/README.md`: each `<!-- step: NAME -->` line
/// and the ```sh block after it, in the order they are written.
fn readme_steps() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/slurm/README.md");
    let text = std::fs::read_to_string(&path).expect("read deploy/slurm/README.md");
    let mut steps = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let Some(name) = line
            .trim()
            .strip_prefix("<!-- step:")
            .and_then(|r| r.strip_suffix("-->"))
        else {
            continue;
        };
        let fence = lines.next().map(|(_, l)| l.trim());
        assert_eq!(
            fence,
            Some("```sh"),
            "{}:{}: a step marker is followed by a ```sh block",
            path.display(),
            n + 1
        );
        let body: Vec<&str> = lines
            .by_ref()
            .map(|(_, l)| l)
            .take_while(|l| l.trim() != "```")
            .collect();
        steps.push((name.trim().to_string(), body.join("\n")));
    }
    steps
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

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

/// The site the README's `site` block describes, as this test provides it,
/// and the README's other steps run against it.
struct Fleet<'a> {
    cluster: &'a Cluster,
    steps: Vec<(String, String)>,
    /// The site's values: what the `site` block exports.
    site: Vec<(&'static str, String)>,
    home: PathBuf,
    state: PathBuf,
    url: String,
}

impl Drop for Fleet<'_> {
    /// The orchestrator the `orchestrator` step started, when the test ends
    /// before the `stop` step ran.
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.state.join("orchestrator.pid")) {
            let _ = Command::new("kill").arg(pid.trim()).status();
        }
    }
}

impl<'a> Fleet<'a> {
    fn new(cluster: &'a Cluster, repo: &Path) -> Self {
        let dir = cluster.dir();
        let home = dir.join("home");
        let state = dir.join("state");
        std::fs::create_dir_all(&home).unwrap();
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let site = vec![
            ("FVD_BIN", env!("CARGO_BIN_EXE_fvd").to_string()),
            ("FVD_STATE", state.display().to_string()),
            ("FVD_PORT", port.to_string()),
            ("FVD_ORCHESTRATOR", url.clone()),
            ("WORKER_SBATCH_ARGS", "--nodes=1".to_string()),
            ("FAMILY", FAMILY.to_string()),
            ("REPO", repo.display().to_string()),
            // The example's agents are raw commands (its replay agent).
            ("FVD_SERVE_ARGS", "--allow-agent-commands".to_string()),
            ("ORCHESTRATOR_SBATCH_ARGS", "--nodes=1".to_string()),
        ];
        let steps = readme_steps();
        let order: Vec<&str> = steps.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            order,
            [
                "site",
                "token",
                "orchestrator",
                "workers",
                "submit",
                "answer",
                "drain",
                "stop",
                "orchestrator-job",
                "stop-job"
            ],
            "the README's steps, in the order this test runs them"
        );
        let (_, site_block) = steps
            .iter()
            .find(|(n, _)| n == "site")
            .expect("the README has a site step");
        let mut exported: Vec<&str> = site_block
            .lines()
            .filter_map(|l| l.trim().strip_prefix("export "))
            .flat_map(|l| l.split_whitespace())
            .filter_map(|w| w.split_once('=').map(|(k, _)| k))
            .filter(|k| {
                !k.is_empty()
                    && k.chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            })
            .collect();
        exported.sort_unstable();
        let mut provided: Vec<&str> = site.iter().map(|(k, _)| *k).collect();
        provided.sort_unstable();
        assert_eq!(
            exported, provided,
            "the README's site step sets what this test provides"
        );
        Fleet {
            cluster,
            steps,
            site,
            home,
            state,
            url,
        }
    }

    /// The README's step `name`, ready to run: `bash -euo pipefail -c` its
    /// block from the top of the checkout, with the site's values, a home
    /// of its own and the cluster's `SLURM_CONF`. `SLURM_TMPDIR` is the
    /// node-local scratch the site's Slurm would give the jobs (job ids
    /// restart at 1 in every test cluster: /tmp/JOBID could be shared), and
    /// `FVD_LOG=info` the servers' log level the test reads.
    fn step(&self, name: &str) -> Command {
        let (_, body) = self
            .steps
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("deploy/slurm/README.md has no step {name:?}"));
        let mut cmd = self.cluster.cmd("bash");
        cmd.args(["-euo", "pipefail", "-c", body])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("HOME", &self.home)
            .env("SLURM_TMPDIR", self.scratch())
            .env("FVD_LOG", "info")
            .envs(self.site.iter().map(|(k, v)| (*k, v.as_str())));
        cmd
    }

    /// Runs step `name` to its end; panics with its output unless it succeeds.
    fn run(&self, name: &str) -> String {
        let out = self.step(name).output().expect("run bash");
        assert!(
            out.status.success(),
            "step {name} of deploy/slurm/README.md failed ({}):\n{}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.story(&[])
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Step `name` in the background, its output in `HOME/NAME.out`.
    fn spawn(&self, name: &str) -> Child {
        let log = std::fs::File::create(self.home.join(format!("{name}.out"))).unwrap();
        self.step(name)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn bash")
    }

    /// The `workers` step: the job id `sbatch --parsable` printed.
    fn workers(&self) -> u32 {
        let out = self.run("workers");
        out.trim()
            .split(';')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("the workers step printed no job id: {out:?}"))
    }

    fn token(&self) -> PathBuf {
        self.home.join(".fvd/token")
    }

    /// `fvd status --json` of the port, through the orchestrator.
    fn status(&self) -> Option<serde_json::Value> {
        let out = fvd()
            .args(["status", FAMILY, "--json", "--orchestrator", &self.url])
            .arg("--token-file")
            .arg(self.token())
            .output()
            .expect("run fvd status");
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    fn scratch(&self) -> PathBuf {
        self.cluster.dir().join("scratch")
    }

    fn orchestrator_log(&self) -> String {
        std::fs::read_to_string(self.state.join("orchestrator.log")).unwrap_or_default()
    }

    fn worker_output(&self, job: u32) -> String {
        std::fs::read_to_string(self.home.join(format!(".fvd/fvd-worker-{job}.out")))
            .unwrap_or_default()
    }

    /// Everything a failure message needs.
    fn story(&self, jobs: &[u32]) -> String {
        let mut s = format!(
            "status: {}\n--- orchestrator\n{}\n",
            self.status().unwrap_or_default(),
            self.orchestrator_log()
        );
        for name in ["submit", "answer"] {
            let out = std::fs::read_to_string(self.home.join(format!("{name}.out")));
            if let Ok(out) = out {
                s.push_str(&format!("--- step {name}\n{out}\n"));
            }
        }
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
        let start = Instant::now();
        while !ok(self) {
            assert!(
                start.elapsed() < limit,
                "timed out after {limit:?} waiting for {what}\n{}",
                self.story(jobs)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The exit status of a step run with `spawn`, once it ended.
    fn exited(&self, what: &str, child: &mut Child, jobs: &[u32]) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("wait for a step") {
                return status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "timed out waiting for {what} to exit\n{}",
                self.story(jobs)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn the_readme_steps_run_the_example_port_through_worker_jobs_that_are_cancelled_and_drained() {
    let cluster = Cluster::start();
    let dir = cluster.dir().to_path_buf();
    let repo = dir.join("repo");
    let release = dir.join("release");
    write_port(&repo, &release);
    let fleet = Fleet::new(&cluster, &repo);

    // 1. The token, the orchestrator, the first allocation, and the port,
    //    waiting in the background.
    fleet.run("token");
    let token = std::fs::read_to_string(fleet.token()).expect("the token step wrote ~/.fvd/token");
    assert_eq!(token.trim().len(), 64, "a 32-byte hex token: {token:?}");
    fleet.run("orchestrator");
    let first = fleet.workers();
    let mut submit = fleet.spawn("submit");

    // 2. The first allocation runs the port until long_step is running.
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

    // 3. A second allocation picks the port up.
    let second = fleet.workers();
    let second_worker = format!("slurm-{second}-");
    fleet.wait_until(
        "time_shift to ask its question",
        &[first, second],
        Duration::from_secs(120),
        |f| f.component("time_shift").is_some_and(|r| r.1 == "ask_user"),
    );
    let mut answer = fleet.spawn("answer");
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
    // What `--signal=B:USR1@…` sends before the time limit, as the README's
    // drain step sends it: the batch shell asks every worker to drain.
    fleet.run("drain");
    fleet.wait_until(
        "the drain to reach the orchestrator",
        &[first, second],
        Duration::from_secs(60),
        |f| f.orchestrator_log().contains("worker drains"),
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

    // 4. The port ended blocked: both waiting steps say so with exit 1.
    let status = wait_for("the port to end", Duration::from_secs(30), || {
        let s = fleet.status()?;
        (s["state"] != "running").then_some(s)
    });
    for (name, child) in [("submit", &mut submit), ("answer", &mut answer)] {
        let code = fleet.exited(name, child, &[first, second]).code();
        assert_eq!(
            code,
            Some(1),
            "the {name} step waits for the port and exits 1 (blocked components):\n{}",
            fleet.story(&[first, second])
        );
    }
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

    // 5. The stop step ends the orchestrator.
    let pid = std::fs::read_to_string(fleet.state.join("orchestrator.pid")).unwrap();
    fleet.run("stop");
    wait_for("the orchestrator to exit", Duration::from_secs(30), || {
        // Gone, or a zombie its new parent has not reaped yet.
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()));
        let running = stat.is_ok_and(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z'))
        });
        (!running).then_some(())
    });

    // 6. The orchestrator as a Slurm job: its extra flags come from
    //    FVD_SERVE_ARGS (issue #43: the batch script passed none, so the
    //    example port, whose agents are raw commands, was refused on it).
    let out = fleet.run("orchestrator-job");
    let job: u32 = out
        .lines()
        .last()
        .and_then(|l| l.split(';').next())
        .and_then(|j| j.trim().parse().ok())
        .unwrap_or_else(|| panic!("the orchestrator-job step printed no job id: {out:?}"));
    let job_out = fleet.home.join(format!(".fvd/fvd-orchestrator-{job}.out"));
    let submitted = fvd()
        .args(["submit", "--family", FAMILY, "--orchestrator", &fleet.url])
        .arg("--token-file")
        .arg(fleet.token())
        .arg("--repo")
        .arg(&repo)
        .output()
        .expect("run fvd submit");
    assert!(
        submitted.status.success(),
        "the orchestrator job refused the example port ({}):\n{}\n{}\n--- job output\n{}",
        submitted.status,
        String::from_utf8_lossy(&submitted.stdout),
        String::from_utf8_lossy(&submitted.stderr),
        std::fs::read_to_string(&job_out).unwrap_or_default()
    );
    let log = std::fs::read_to_string(&job_out).unwrap_or_default();
    assert!(
        log.contains(&format!("fvd-orchestrator: {}", fleet.url)),
        "the job wrote another URL:\n{log}"
    );
    fleet.run("stop-job");
    wait_for(
        "the orchestrator job to end",
        Duration::from_secs(60),
        || cluster.job_state(job).is_none().then_some(()),
    );
}
