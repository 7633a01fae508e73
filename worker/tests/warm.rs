//! The warm runner with real processes: a zygote imports a stand-in heavy
//! library once and forks each run; an edit of the checkout between two
//! runs is seen; a zygote that cannot start turns the run cold with one
//! warning; one job's environment, folder and process group do not leak
//! into the next; cancel and timeout kill the forked job's whole group.
//! Needs `python3` with pytest.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fvd_contracts::verdict::Verdict;
use fvd_worker::exec::{JobOutcome, JobSpec, prepare_pytest, run_job};
use fvd_worker::zygote::{WARNING_PREFIX, WarmSpec};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A checkout (`port/`: a module of its own and a test) and a library
/// folder outside it (`lib/heavy.py`: appends a line to `imports.log` and
/// sleeps 0.5 s each time it is imported).
struct Sandbox {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Sandbox {
    fn new() -> Sandbox {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        std::fs::create_dir_all(root.join("port")).unwrap();
        std::fs::create_dir_all(root.join("lib")).unwrap();
        std::fs::write(
            root.join("lib/heavy.py"),
            format!(
                "import os, time\nwith open({:?}, 'a') as f:\n    f.write('%d\\n' % os.getpid())\ntime.sleep(0.5)\n",
                root.join("imports.log")
            ),
        )
        .unwrap();
        std::fs::write(root.join("port/repo_mod.py"), "VALUE = 1\n").unwrap();
        std::fs::write(
            root.join("port/test_warm.py"),
            r#"import os, sys
import heavy  # noqa: F401
import repo_mod

def test_body():
    with open(os.environ["REPORT"], "w") as f:
        f.write("ppid=%d\npgid=%d\npid=%d\ncwd=%s\nfoo=%s\nvalue=%d\nenvkeys=%s\n" % (
            os.getppid(), os.getpgid(0), os.getpid(), os.getcwd(),
            os.environ.get("FOO", "-"), repo_mod.VALUE, ",".join(sorted(os.environ))))
    if os.environ.get("SLEEP"):
        import subprocess, time
        subprocess.Popen(["sleep", "3600"])
        time.sleep(3600)
    assert repo_mod.VALUE == int(os.environ.get("WANT", "1"))
"#,
        )
        .unwrap();
        Sandbox { _dir: dir, root }
    }

    fn imports(&self) -> usize {
        std::fs::read_to_string(self.root.join("imports.log"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    fn report(&self, name: &str) -> std::collections::BTreeMap<String, String> {
        std::fs::read_to_string(self.root.join(name))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    async fn spec(
        &self,
        job: &str,
        preload: Option<&[&str]>,
        env: &[(&str, &str)],
        scratch: &Path,
    ) -> JobSpec {
        let mut env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.push((
            "PYTHONPATH".into(),
            self.root.join("lib").display().to_string(),
        ));
        env.push(("PYTHONDONTWRITEBYTECODE".into(), "1".into()));
        env.push((
            "REPORT".into(),
            self.root
                .join(format!("{job}.report"))
                .display()
                .to_string(),
        ));
        let mut spec = JobSpec {
            job_id: job.into(),
            argv: [
                "python3",
                "-m",
                "pytest",
                "test_warm.py",
                "-q",
                "-p",
                "no:cacheprovider",
                "--junitxml={junitxml}",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            env,
            secret_env_names: vec![],
            sandbox: fvd_worker::exec::JobSandbox::unjailed(),
            cwd: self.root.join("port"),
            gpus: vec![],
            timeout: Duration::from_secs(60),
            grace: Duration::from_secs(1),
            junit: None,
            warm: preload.map(|p| WarmSpec {
                preload: p.iter().map(|s| s.to_string()).collect(),
                unkeyed_paths: vec![scratch.to_path_buf()],
                dir: self.root.join("z"),
                jail: fvd_sandbox::Jail::off(),
                write_beneath: None,
            }),
            stdin: None,
        };
        prepare_pytest(&mut spec, scratch).await.unwrap();
        spec
    }
}

async fn run(spec: JobSpec, cancel: CancellationToken) -> JobOutcome {
    let (tx, mut rx) = mpsc::channel(64);
    let sink = fvd_telemetry::spawn(async move { while rx.recv().await.is_some() {} });
    let outcome = run_job(spec, tx, cancel).await.expect("job runs");
    sink.await.unwrap();
    outcome
}

fn passed(o: &JobOutcome) -> bool {
    matches!(o.verdict(), Verdict::NonSkipPass { .. })
}

#[tokio::test]
async fn warm_runs_share_one_import_and_see_edits_of_the_checkout() {
    let sb = Sandbox::new();
    let preload: &[&str] = &["heavy"];
    let s1 = tempfile::tempdir().unwrap();
    let o = run(
        sb.spec("w1", Some(preload), &[("FOO", "one")], s1.path())
            .await,
        CancellationToken::new(),
    )
    .await;
    assert!(passed(&o), "{:?}\n{}", o.verdict(), o.output_tail);
    assert!(!o.output_tail.contains(WARNING_PREFIX), "{}", o.output_tail);
    let r1 = sb.report("w1.report");
    assert_ne!(
        r1["ppid"],
        std::process::id().to_string(),
        "forked by a zygote, not spawned by the worker"
    );
    assert_eq!(r1["pgid"], r1["pid"], "the child leads its own group");
    assert_eq!(r1["foo"], "one");
    assert_eq!(Path::new(&r1["cwd"]), sb.root.join("port"));
    // Zygote import + the child's: heavy came from the zygote only.
    assert_eq!(sb.imports(), 1, "heavy imported once, in the zygote");

    // An edit between two runs (an agent's) is seen by the next one; the
    // job's own scratch folder differs, yet the zygote is the same.
    std::fs::write(sb.root.join("port/repo_mod.py"), "VALUE = 2\n").unwrap();
    let s2 = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let o = run(
        sb.spec("w2", Some(preload), &[("WANT", "2")], s2.path())
            .await,
        CancellationToken::new(),
    )
    .await;
    let warm_time = started.elapsed();
    assert!(passed(&o), "{:?}\n{}", o.verdict(), o.output_tail);
    let r2 = sb.report("w2.report");
    assert_eq!(r2["value"], "2", "the edit is seen");
    assert_eq!(r2["foo"], "-", "the first job's FOO does not leak");
    assert_eq!(r2["ppid"], r1["ppid"], "same zygote");
    assert_ne!(r2["pid"], r1["pid"]);
    assert_eq!(sb.imports(), 1, "no second import of heavy");
    assert!(warm_time < Duration::from_secs(30), "took {warm_time:?}");

    // A red run is red (the verdict is read as for a cold run).
    let s3 = tempfile::tempdir().unwrap();
    let o = run(
        sb.spec("w3", Some(preload), &[("WANT", "3")], s3.path())
            .await,
        CancellationToken::new(),
    )
    .await;
    assert!(
        matches!(o.verdict(), Verdict::DebugRed { .. }),
        "{:?}\n{}",
        o.verdict(),
        o.output_tail
    );
}

/// A forked child gets the job's environment, built like a cold run's:
/// the worker's allow-listed variables only, never its credentials.
#[tokio::test]
async fn a_warm_child_sees_only_the_allow_listed_worker_variables() {
    let sb = Sandbox::new();
    let s1 = tempfile::tempdir().unwrap();
    let mut spec = sb
        .spec("envjob", Some(&["heavy"]), &[("FOO", "one")], s1.path())
        .await;
    spec.sandbox.base_env = fvd_sandbox::env::filtered([
        ("PATH", std::env::var("PATH").unwrap()),
        ("HOME", "/home/worker".to_string()),
        ("FVD_TOKEN", "worker-token-4f9a8b7c6d5e".to_string()),
        ("ANTHROPIC_API_KEY", "sk-ant-api03-secretvalue".to_string()),
    ]);
    let o = run(spec, CancellationToken::new()).await;
    assert!(passed(&o), "{:?}\n{}", o.verdict(), o.output_tail);
    assert!(!o.output_tail.contains(WARNING_PREFIX), "{}", o.output_tail);
    let r = sb.report("envjob.report");
    let keys: Vec<&str> = r["envkeys"].split(',').collect();
    let allowed = [
        "CUDA_VISIBLE_DEVICES",
        "FOO",
        "FVD_JOB_COOKIE",
        // Where fvd's plugin reports the run's peak GPU memory.
        "FVD_PEAK_GPU_FILE",
        "HOME",
        "PATH",
        "PYTEST_ADDOPTS",
        "PYTEST_CURRENT_TEST",
        "PYTEST_VERSION",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONPATH",
        "PYTHONUNBUFFERED",
        "REPORT",
    ];
    for k in &keys {
        assert!(allowed.contains(k), "{k} reached the warm child: {keys:?}");
    }
    for k in ["FOO", "HOME", "PATH", "FVD_JOB_COOKIE"] {
        assert!(keys.contains(&k), "{k}: {keys:?}");
    }
}

#[tokio::test]
async fn a_zygote_that_cannot_start_runs_the_job_cold_with_one_warning() {
    let sb = Sandbox::new();
    let s = tempfile::tempdir().unwrap();
    let o = run(
        sb.spec("f1", Some(&["no_such_module_fvd"]), &[], s.path())
            .await,
        CancellationToken::new(),
    )
    .await;
    assert!(passed(&o), "{:?}\n{}", o.verdict(), o.output_tail);
    assert_eq!(
        o.output_tail.matches(WARNING_PREFIX).count(),
        1,
        "{}",
        o.output_tail
    );
    let r = sb.report("f1.report");
    assert_eq!(r["ppid"], std::process::id().to_string(), "a cold child");

    // A command that is not `python -m pytest` is cold too, with the same
    // one line.
    let mut spec = sb.spec("f2", Some(&["heavy"]), &[], s.path()).await;
    spec.argv.drain(0..2);
    assert_eq!(spec.argv[0], "pytest");
    let o = run(spec, CancellationToken::new()).await;
    assert!(passed(&o), "{:?}\n{}", o.verdict(), o.output_tail);
    assert!(o.output_tail.contains(WARNING_PREFIX), "{}", o.output_tail);
}

async fn wait_report(sb: &Sandbox, name: &str) -> std::collections::BTreeMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = sb.report(name);
        if r.contains_key("value") {
            return r;
        }
        assert!(Instant::now() < deadline, "{name} never written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn cancel_and_timeout_kill_the_forked_jobs_whole_group() {
    let sb = Sandbox::new();
    let preload: &[&str] = &["heavy"];
    let s = tempfile::tempdir().unwrap();
    let cancel = CancellationToken::new();
    let spec = sb
        .spec("c1", Some(preload), &[("SLEEP", "1")], s.path())
        .await;
    let job = fvd_telemetry::spawn(run(spec, cancel.clone()));
    let r = wait_report(&sb, "c1.report").await;
    cancel.cancel();
    let o = job.await.unwrap();
    assert!(o.cancelled);
    assert!(o.survivors.is_empty(), "{:?}", o.survivors);
    let pgid: i32 = r["pgid"].parse().unwrap();
    assert!(
        fvd_worker::exec::job_processes(pgid, None).is_empty(),
        "the group is gone"
    );

    let s2 = tempfile::tempdir().unwrap();
    let mut spec = sb
        .spec("c2", Some(preload), &[("SLEEP", "1")], s2.path())
        .await;
    spec.timeout = Duration::from_secs(3);
    let o = run(spec, CancellationToken::new()).await;
    assert!(o.timed_out, "{}", o.output_tail);
    assert!(matches!(o.verdict(), Verdict::Timeout), "{:?}", o.verdict());
    assert!(o.survivors.is_empty(), "{:?}", o.survivors);
    let r = sb.report("c2.report");
    let pgid: i32 = r["pgid"].parse().unwrap();
    assert!(fvd_worker::exec::job_processes(pgid, None).is_empty());
    assert_eq!(r["ppid"], sb.report("c1.report")["ppid"], "one zygote");
}

#[tokio::test]
async fn a_checkout_module_a_preloaded_library_imported_is_dropped_in_the_child() {
    // A library that imports the checkout's own module at import time (the
    // spec check cannot see that) caches `repo_mod` (VALUE = 1) in the
    // zygote; the child must drop it, so the edit to 2 is seen.
    let sb = Sandbox::new();
    std::fs::write(
        sb.root.join("lib/sneaky.py"),
        "import repo_mod\nCACHED = repo_mod.VALUE\n",
    )
    .unwrap();
    let port = sb.root.join("port").display().to_string();
    // The checkout on the PYTHONPATH, an import-time variable: the zygote
    // can import it.
    let with_port = |mut spec: JobSpec| {
        for (k, v) in spec.env.iter_mut() {
            if k == "PYTHONPATH" {
                *v = format!("{v}:{port}");
            }
        }
        spec
    };
    let preload: &[&str] = &["sneaky"];
    let s0 = tempfile::tempdir().unwrap();
    let o = run(
        with_port(sb.spec("d0", Some(preload), &[], s0.path()).await),
        CancellationToken::new(),
    )
    .await;
    assert!(passed(&o), "{:?}\n{}", o.verdict(), o.output_tail);
    std::fs::write(sb.root.join("port/repo_mod.py"), "VALUE = 2\n").unwrap();
    let s1 = tempfile::tempdir().unwrap();
    let o = run(
        with_port(
            sb.spec("d1", Some(preload), &[("WANT", "2")], s1.path())
                .await,
        ),
        CancellationToken::new(),
    )
    .await;
    assert!(passed(&o), "{:?}\n{}", o.verdict(), o.output_tail);
    let (r0, r1) = (sb.report("d0.report"), sb.report("d1.report"));
    assert_eq!(r1["value"], "2", "the cached checkout module was dropped");
    assert_eq!(
        r1["ppid"], r0["ppid"],
        "both forked from the zygote that cached VALUE = 1"
    );
    assert_ne!(r1["ppid"], std::process::id().to_string());
}

/// A warm child ends with `os._exit` once pytest returns; what a normal
/// exit would still have done is done first: a buffered write to a file
/// the test left open reaches the file, atexit handlers run, a non-daemon
/// thread is waited for, and a failing test still exits red. A global's
/// `__del__` does not run (nothing guarantees it at exit in CPython): that
/// is how this test sees the fast exit was taken.
#[tokio::test]
async fn a_warm_child_exits_fast_yet_keeps_what_a_normal_exit_does() {
    let sb = Sandbox::new();
    std::fs::write(
        sb.root.join("port/test_exit.py"),
        r#"import atexit, os, threading, time
import heavy  # noqa: F401

LEFT = open(os.environ["OUT"] + ".left", "w")


class Finalised:
    # Bound now: at finalisation the module's globals may be gone.
    def __del__(self, open=open, path=os.environ["OUT"] + ".del"):
        with open(path, "w") as f:
            f.write("del\n")


KEEP = Finalised()


def test_leaves_work_for_the_exit():
    LEFT.write("buffered\n")

    def at_exit():
        with open(os.environ["OUT"] + ".atexit", "w") as f:
            f.write("ran\n")

    atexit.register(at_exit)
    if os.environ.get("THREAD"):

        def late():
            time.sleep(0.3)
            with open(os.environ["OUT"] + ".thread", "w") as f:
                f.write("joined\n")

        threading.Thread(target=late).start()
    assert os.environ.get("FAIL") != "1"
"#,
    )
    .unwrap();
    let read = |name: &str| std::fs::read_to_string(sb.root.join(name)).unwrap_or_default();
    let preload: &[&str] = &["heavy"];
    let job = |name: &'static str, extra: &'static [(&'static str, &'static str)]| {
        let sb = &sb;
        async move {
            let out = sb.root.join(name).display().to_string();
            let s = tempfile::tempdir().unwrap();
            let mut env: Vec<(&str, &str)> = extra.to_vec();
            env.push(("OUT", &out));
            let mut spec = sb.spec(name, Some(preload), &env, s.path()).await;
            spec.argv[3] = "test_exit.py".into();
            run(spec, CancellationToken::new()).await
        }
    };

    let o = job("fast", &[]).await;
    assert!(passed(&o), "{:?}\n{}", o.verdict(), o.output_tail);
    assert!(!o.output_tail.contains(WARNING_PREFIX), "{}", o.output_tail);
    assert_eq!(
        read("fast.left"),
        "buffered\n",
        "the left-open file's buffer"
    );
    assert_eq!(read("fast.atexit"), "ran\n");
    assert_eq!(read("fast.del"), "", "os._exit: no finalisation");

    let o = job("red", &[("FAIL", "1")]).await;
    assert!(
        matches!(o.verdict(), Verdict::DebugRed { .. }),
        "{:?}\n{}",
        o.verdict(),
        o.output_tail
    );
    assert_eq!(read("red.left"), "buffered\n");

    // A non-daemon thread still running: the normal exit, which waits.
    let o = job("thread", &[("THREAD", "1")]).await;
    assert!(passed(&o), "{:?}\n{}", o.verdict(), o.output_tail);
    assert_eq!(read("thread.thread"), "joined\n");
    assert_eq!(read("thread.left"), "buffered\n");
    assert_eq!(read("thread.atexit"), "ran\n");
}

/// A warm run reports its peak GPU memory as a cold one does: torch is
/// preloaded in the zygote (which never initialises CUDA), the forked
/// child initialises it and reports; the next child, which does not use
/// CUDA, reports none though the zygote imported torch.
#[tokio::test]
async fn a_warm_run_reports_its_peak_gpu_memory_and_one_without_cuda_none() {
    let sb = Sandbox::new();
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_torch/torch");
    std::fs::create_dir_all(sb.root.join("lib/torch")).unwrap();
    std::fs::copy(
        fake.join("__init__.py"),
        sb.root.join("lib/torch/__init__.py"),
    )
    .unwrap();
    std::fs::write(
        sb.root.join("port/test_gpu.py"),
        "import os\nimport torch\n\n\ndef test_gpu():\n    if os.environ.get('USE_CUDA'):\n        torch.cuda.init()\n",
    )
    .unwrap();
    let preload: &[&str] = &["torch"];
    for (job, use_cuda, want) in [("g1", "1", Some(2048 + 512)), ("g2", "", None)] {
        let s = tempfile::tempdir().unwrap();
        let env = [("FAKE_TORCH_PEAK_MIB", "2048"), ("USE_CUDA", use_cuda)];
        let mut spec = sb.spec(job, Some(preload), &env, s.path()).await;
        spec.argv[3] = "test_gpu.py".into();
        let o = run(spec, CancellationToken::new()).await;
        assert!(passed(&o), "{:?}\n{}", o.verdict(), o.output_tail);
        assert!(!o.output_tail.contains(WARNING_PREFIX), "{}", o.output_tail);
        assert_eq!(o.peak_gpu_mib, want, "{job}");
    }
}
