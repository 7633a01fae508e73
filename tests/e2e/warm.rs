//! The warm runner through the real binary: `[runner] mode = "warm"` runs
//! embedded (`fvd submit`) and on a fleet worker from a zygote that
//! imported a stand-in heavy library once; an edit of the checkout is seen
//! by the next run; a preload module of the repository is refused with its
//! line; zygotes die with their worker.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::port::status_of;
use crate::support::{Sandbox, TestComponent, components, fvd, wait_for};

/// A port `warmy` of two components whose tests import `heavy` (a library
/// outside the repository that logs each import to `imports.log`) and the
/// repository's `repo_mod`, write who forked them to `<name>.who`, and
/// pass while `repo_mod.VALUE == 1`.
fn warm_port(sb: &Sandbox, preload: &str) {
    let lib = sb.dir.path().join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(
        lib.join("heavy.py"),
        format!(
            "import os, time\nwith open({:?}, 'a') as f:\n    f.write('%d\\n' % os.getpid())\ntime.sleep(0.3)\n",
            sb.dir.path().join("imports.log").display().to_string()
        ),
    )
    .unwrap();
    std::fs::write(sb.repo().join("repo_mod.py"), "VALUE = 1\n").unwrap();
    let body = |name: &str| {
        format!(
            "import heavy, repo_mod\nwith open({:?}, 'w') as f:\n    f.write('%d %d' % (os.getppid(), os.getpgid(0) == os.getpid()))\nassert repo_mod.VALUE == 1",
            sb.dir
                .path()
                .join(format!("{name}.who"))
                .display()
                .to_string()
        )
    };
    sb.port(
        "warmy",
        &[
            TestComponent::new("first", &body("first")),
            TestComponent::new("second", &body("second")),
        ],
    );
    let spec_path = sb.repo().join("tests/local_tests/warmy/port.toml");
    let spec = std::fs::read_to_string(&spec_path).unwrap();
    let spec = spec.replace(
        "timeout_s = 60\n",
        &format!(
            "timeout_s = 60\nset_env = {{ PYTHONPATH = {:?}, PYTHONDONTWRITEBYTECODE = \"1\" }}\n",
            lib.display().to_string()
        ),
    );
    std::fs::write(
        &spec_path,
        format!("{spec}\n[runner]\nmode = \"warm\"\npreload = [\"{preload}\"]\n"),
    )
    .unwrap();
}

fn imports(sb: &Sandbox) -> usize {
    std::fs::read_to_string(sb.dir.path().join("imports.log"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// `(parent pid, leads its own group)` a component's test recorded.
fn who(sb: &Sandbox, name: &str) -> (u32, bool) {
    let text = std::fs::read_to_string(sb.dir.path().join(format!("{name}.who"))).unwrap();
    let (ppid, leader) = text.split_once(' ').unwrap();
    (ppid.parse().unwrap(), leader == "1")
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

fn submit(sb: &Sandbox, extra: &[&str]) -> (std::process::Output, u32) {
    let child = fvd()
        .args(["submit", "--family", "warmy", "--wait"])
        .args(extra)
        .arg("--repo")
        .arg(sb.repo())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    (child.wait_with_output().unwrap(), pid)
}

#[test]
fn warm_runs_embedded_fork_from_one_zygote_and_see_the_next_edit() {
    let sb = Sandbox::with_repo_in("repo");
    warm_port(&sb, "heavy");
    let (out, submit_pid) = submit(&sb, &[]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    let (p1, lead1) = who(&sb, "first");
    let (p2, lead2) = who(&sb, "second");
    assert!(lead1 && lead2, "each run leads its own process group");
    assert_ne!(p1, submit_pid, "forked by a zygote, not by fvd: {text}");
    assert_eq!(p1, p2, "one zygote for both components");
    assert_eq!(imports(&sb), 1, "heavy was imported once, by the zygote");

    // An agent's edit, say: the next run sees it (and fails on it).
    std::fs::write(sb.repo().join("repo_mod.py"), "VALUE = 2\n").unwrap();
    let (out, _) = submit(&sb, &["--rerun"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let status = sb.local_status("warmy").unwrap();
    let rows = components(&status);
    for name in ["first", "second"] {
        let row = status_of(&rows, name);
        assert_eq!(row.1, "blocked", "{status}");
    }
    assert!(
        status.to_string().contains("debug_red"),
        "the edit made both red: {status}"
    );
    assert_eq!(
        imports(&sb),
        2,
        "a new fvd process, a new zygote; one import"
    );
}

#[test]
fn a_preload_module_of_the_repository_is_refused_at_submit_with_its_line() {
    let sb = Sandbox::with_repo_in("repo");
    warm_port(&sb, "repo_mod");
    let (out, _) = submit(&sb, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let spec =
        std::fs::read_to_string(sb.repo().join("tests/local_tests/warmy/port.toml")).unwrap();
    let line = spec.lines().position(|l| l.starts_with("preload")).unwrap() + 1;
    assert!(
        err.contains(&format!("port.toml:{line}:")) && err.contains("repo_mod"),
        "{err}"
    );
}

#[test]
fn warm_runs_on_a_fleet_worker_and_its_zygote_dies_with_it() {
    let mut sb = Sandbox::with_repo_in("repo");
    warm_port(&sb, "heavy");
    sb.serve();
    sb.worker("w1", 2);
    let out = sb.submit_remote("warmy", &["--wait"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{}", sb.logs());
    let (zygote, lead) = who(&sb, "first");
    assert!(lead);
    assert_eq!(who(&sb, "second").0, zygote, "one zygote");
    assert_ne!(zygote, sb.worker_pid("w1"));
    assert!(
        cmdline(zygote).contains("fvd_zygote.py"),
        "{}",
        cmdline(zygote)
    );
    assert_eq!(imports(&sb), 1);
    assert!(
        !sb.logs().contains(fvd_worker::zygote::WARNING_PREFIX),
        "{}",
        sb.logs()
    );
    // SIGKILL: the worker cannot end it; the zygote sees its stdin close.
    sb.kill_worker("w1");
    wait_for("the zygote to exit", Duration::from_secs(15), || {
        (!Path::new(&format!("/proc/{zygote}")).exists() || cmdline(zygote).is_empty())
            .then_some(())
    });
}

/// A stand-in `torchrun` (a Python script, as pip installs it) that would
/// launch the ranks cold; the warm runner never executes it, it only reads
/// its `#!` line to find the interpreter. Running it records that it ran.
fn fake_torchrun(sb: &Sandbox) -> std::path::PathBuf {
    let bin = sb.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let python = which("python3");
    let ran = sb.dir.path().join("torchrun.ran");
    let script = bin.join("torchrun");
    std::fs::write(
        &script,
        format!(
            "#!{}\nimport sys\nopen({:?}, 'w').write(' '.join(sys.argv))\nsys.exit(3)\n",
            python.display(),
            ran.display().to_string()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

fn which(prog: &str) -> std::path::PathBuf {
    std::env::var("PATH")
        .unwrap()
        .split(':')
        .map(|d| Path::new(d).join(prog))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{prog} on PATH"))
}

/// `torchrun --standalone --nproc_per_node=2 -m pytest` under
/// `[runner] mode = "warm"`: two ranks forked from the zygote in one process
/// group led by rank 0, each with torchrun's variables and one rendezvous
/// port; rank 0's JUnit report is the verdict. A rank that fails (rank 0,
/// once rank 1 has recorded itself) ends the other at once (it would sleep
/// past the timeout), and the run is red.
#[test]
fn a_single_node_torchrun_runs_warm_as_ranks_forked_from_the_zygote() {
    let sb = Sandbox::with_repo_in("repo");
    let bin = fake_torchrun(&sb);
    let record = |name: &str| {
        format!(
            "import json\nwith open(os.path.join({:?}, '{name}.%s' % os.environ['RANK']), 'w') as f:\n    json.dump({{'pid': os.getpid(), 'ppid': os.getppid(), 'parent': open('/proc/%d/cmdline' % os.getppid()).read().replace(chr(0), ' '), 'pgid': os.getpgid(0), 'env': {{k: os.environ.get(k) for k in ['RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT']}}}}, f)",
            sb.dir.path().display().to_string()
        )
    };
    sb.port(
        "ranks",
        &[
            TestComponent::new("tp", &record("tp")),
            TestComponent::new(
                "tp_red",
                &format!(
                    "{}\nif os.environ['RANK'] == '1':\n    time.sleep(120)\nfor _ in range(600):\n    if os.path.exists(os.path.join({:?}, 'tp_red.1')):\n        break\n    time.sleep(0.1)\nassert os.environ['RANK'] != '0', 'rank 0 is off by 0.5'",
                    record("tp_red"),
                    sb.dir.path().display().to_string()
                ),
            ),
        ],
    );
    let spec_path = sb.repo().join("tests/local_tests/ranks/port.toml");
    let spec = std::fs::read_to_string(&spec_path).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let spec = spec
        .replace(
            "timeout_s = 60\n",
            &format!(
                "timeout_s = 100\nset_env = {{ PATH = {path:?}, PYTHONDONTWRITEBYTECODE = \"1\" }}\n"
            ),
        )
        .replace(
            "coverage_scope = \"implementation_subcomponent\"\n",
            "coverage_scope = \"implementation_subcomponent\"\ncommand = [\"torchrun\", \"--standalone\", \"--nproc_per_node=2\", \"-m\", \"pytest\", \"{test}\", \"-q\", \"-p\", \"no:cacheprovider\", \"--junitxml={junitxml}\"]\n",
        );
    std::fs::write(
        &spec_path,
        format!("{spec}\n[runner]\nmode = \"warm\"\npreload = [\"json\"]\n"),
    )
    .unwrap();
    let child = fvd()
        .args(["submit", "--family", "ranks", "--wait", "--repo"])
        .arg(sb.repo())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "tp_red is red: {text}");
    assert!(
        !sb.dir.path().join("torchrun.ran").exists(),
        "torchrun itself never ran: {text}"
    );
    let rank = |name: &str, r: u32| -> serde_json::Value {
        let p = sb.dir.path().join(format!("{name}.{r}"));
        serde_json::from_str(
            &std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("{} not written ({e}): {text}", p.display())),
        )
        .unwrap()
    };
    for name in ["tp", "tp_red"] {
        let (r0, r1) = (rank(name, 0), rank(name, 1));
        assert_eq!(r0["ppid"], r1["ppid"], "both ranks forked by one process");
        assert!(
            r0["parent"].as_str().unwrap().contains("fvd_zygote.py"),
            "forked by the zygote: {r0}"
        );
        assert_eq!(r0["pgid"], r0["pid"], "rank 0 leads the group");
        assert_eq!(r1["pgid"], r0["pid"], "rank 1 is in rank 0's group");
        for (r, v) in [(0, &r0), (1, &r1)] {
            let e = &v["env"];
            assert_eq!(e["RANK"], r.to_string());
            assert_eq!(e["LOCAL_RANK"], r.to_string());
            assert_eq!(e["WORLD_SIZE"], "2");
            assert_eq!(e["LOCAL_WORLD_SIZE"], "2");
            assert_eq!(e["MASTER_ADDR"], "127.0.0.1");
        }
        assert_eq!(r0["env"]["MASTER_PORT"], r1["env"]["MASTER_PORT"]);
    }
    assert_ne!(
        rank("tp", 0)["env"]["MASTER_PORT"],
        serde_json::Value::Null,
        "a rendezvous port is set"
    );
    let status = sb.local_status("ranks").unwrap();
    let rows = components(&status);
    assert_eq!(status_of(&rows, "tp").1, "non_skip_pass", "{status}");
    assert_eq!(status_of(&rows, "tp_red").1, "blocked", "{status}");
    let s = status.to_string();
    assert!(
        s.contains("debug_red") && s.contains("rank 0 is off by 0.5"),
        "rank 0's report is the verdict: {status}"
    );
    // Rank 1 would sleep past the timeout (a timeout is no debug_red):
    // rank 0's failure ended it, and the run's output says so.
    let logs = fvd()
        .args(["logs", "ranks", "tp_red", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(
        logs.contains("rank 0 exited with code 1; ending the other ranks"),
        "{logs}"
    );
    assert!(
        !text.contains(fvd_worker::zygote::WARNING_PREFIX),
        "no cold fallback: {text}"
    );
}

/// Two jobs forked by one jailed zygote (issue #38): the first holds a
/// secret in its environment while the second reads its
/// `/proc/PID/environ`. Each forked job has a Landlock domain of its own,
/// so the read is refused; from an unjailed zygote it succeeds (so the
/// test can fail).
#[tokio::test]
async fn jobs_forked_by_one_jailed_zygote_cannot_read_each_other() {
    use fvd_worker::exec::{JobSandbox, JobSpec, prepare_pytest, run_job};
    use fvd_worker::zygote::WarmSpec;
    use std::path::PathBuf;
    const SECRET: &str = "fvdsecret_Hq2Lw9Zp4Xk7Rt1Vn6";
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    std::fs::create_dir_all(root.join("port")).unwrap();
    std::fs::create_dir_all(root.join("lib")).unwrap();
    std::fs::write(root.join("lib/heavy.py"), "X = 1\n").unwrap();
    std::fs::write(
        root.join("port/test_pair.py"),
        r#"import os, time
import heavy  # noqa: F401

def test_role():
    mark, role = os.environ["MARK"], os.environ["ROLE"]
    if role == "holder":
        open(os.path.join(mark, "pid.tmp"), "w").write(str(os.getpid()))
        os.rename(os.path.join(mark, "pid.tmp"), os.path.join(mark, "pid"))
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(mark, "probed")) and time.time() < deadline:
            time.sleep(0.02)
        return
    deadline = time.time() + 30
    while not os.path.exists(os.path.join(mark, "pid")):
        assert time.time() < deadline, "the holder never started"
        time.sleep(0.02)
    pid = int(open(os.path.join(mark, "pid")).read())
    want = os.environ["WANT"].encode()
    # A forked run's variables are set after the fork: they are in its
    # memory, not in the block /proc/PID/environ shows (the zygote's).
    got = []
    for what in ("environ", "mem"):
        try:
            if what == "environ":
                data = open("/proc/%d/environ" % pid, "rb").read()
            else:
                data, m = b"", open("/proc/%d/mem" % pid, "rb")
                for l in open("/proc/%d/maps" % pid).read().splitlines():
                    a, b = [int(x, 16) for x in l.split()[0].split("-")]
                    if "rw" in l.split()[1] and b - a < (256 << 20):
                        try:
                            m.seek(a); data += m.read(b - a)
                        except OSError:
                            pass
            got.append("%s %s" % (what, "found" if want in data else "nothing"))
        except OSError as e:
            got.append("%s refused: %s" % (what, e.strerror))
    open(os.path.join(mark, "probed"), "w").write("\n".join(got))
"#,
    )
    .unwrap();
    let fvd = Path::new(env!("CARGO_BIN_EXE_fvd"));
    let jail = fvd_sandbox::Jail::start(fvd_sandbox::Mode::Auto, fvd, &[]).unwrap();
    let spec = |role: &str, mark: &Path, scratch: &Path, jail: &fvd_sandbox::Jail| {
        let env = vec![
            ("ROLE".to_string(), role.to_string()),
            ("MARK".to_string(), mark.display().to_string()),
            ("WANT".to_string(), SECRET.to_string()),
            (
                "PYTHONPATH".to_string(),
                root.join("lib").display().to_string(),
            ),
            ("PYTHONDONTWRITEBYTECODE".to_string(), "1".to_string()),
        ];
        let mut sandbox = JobSandbox::unjailed();
        sandbox.jail = jail.clone();
        JobSpec {
            job_id: format!("{role}-{}", mark.file_name().unwrap().to_string_lossy()),
            argv: [
                "python3",
                "-m",
                "pytest",
                "test_pair.py",
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
            sandbox,
            cwd: root.join("port"),
            gpus: vec![],
            timeout: Duration::from_secs(60),
            grace: Duration::from_secs(1),
            junit: None,
            warm: Some(WarmSpec {
                preload: vec!["heavy".into()],
                unkeyed_paths: vec![scratch.to_path_buf()],
                dir: root.join("z"),
                jail: jail.clone(),
                write_beneath: None,
            }),
            stdin: None,
        }
    };
    let run = |mut spec: JobSpec, scratch: PathBuf| async move {
        prepare_pytest(&mut spec, &scratch).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let sink = fvd_telemetry::spawn(async move { while rx.recv().await.is_some() {} });
        let o = run_job(spec, tx, tokio_util::sync::CancellationToken::new())
            .await
            .expect("job runs");
        sink.await.unwrap();
        o
    };
    for (name, jail) in [("jailed", jail.clone()), ("off", fvd_sandbox::Jail::off())] {
        let mark = root.join(format!("mark-{name}"));
        std::fs::create_dir_all(&mark).unwrap();
        let (s1, s2) = (
            root.join(format!("s1-{name}")),
            root.join(format!("s2-{name}")),
        );
        let mut holder = spec("holder", &mark, &s1, &jail);
        // The secret is the holder's own; the prober only knows what to
        // look for.
        holder.env.push(("HELD".into(), SECRET.into()));
        let prober = spec("prober", &mark, &s2, &jail);
        let (a, b) = tokio::join!(run(holder, s1), run(prober, s2));
        for o in [&a, &b] {
            assert!(
                !o.output_tail.contains(fvd_worker::zygote::WARNING_PREFIX),
                "{name}: the jobs ran cold: {}",
                o.output_tail
            );
        }
        let got = std::fs::read_to_string(mark.join("probed")).unwrap();
        if name == "jailed" {
            assert!(!got.contains("found"), "{name}: {got}");
            assert!(got.contains("mem refused"), "{name}: {got}");
        } else {
            assert!(
                got.contains("mem found"),
                "{name}: the unjailed read should succeed: {got}"
            );
        }
    }
}

/// A warm test on a worker writes what a cold one may (issue #39): its
/// checkout, its scratch folder, what lies outside the worker's
/// workspace; not the workspace's code store, other jobs' folders, the
/// zygotes' folder or its top. The workspace is outside `/tmp` (Landlock
/// cannot keep a folder there read-only).
#[test]
fn a_warm_test_on_a_worker_writes_only_its_checkout_and_scratch() {
    let mut sb = Sandbox::with_repo_in("repo");
    warm_port(&sb, "heavy");
    let ws_dir = outside_tmp();
    let ws = ws_dir.path().join("ws-w1");
    let mark = sb.dir.path().join("mark");
    std::fs::create_dir_all(&mark).unwrap();
    let refused: Vec<String> = [
        "jobs/forged.txt",
        "code/forged.txt",
        "zygotes/forged.txt",
        "forged.txt",
    ]
    .iter()
    .map(|p| ws.join(p).display().to_string())
    .collect();
    // Every test tries the writes: the port's root conftest.py does.
    std::fs::write(
        sb.repo().join("conftest.py"),
        format!(
            "import os, sys\nlines = []\nfor t in {refused:?} + [os.path.join(os.getcwd(), 'own.txt'), os.path.join(os.path.dirname(sys.modules['fvd_pytest_plugin'].__file__), 'scratch.txt')]:\n    try:\n        open(t, 'a').close()\n        lines.append('wrote ' + t)\n    except OSError as e:\n        lines.append('refused %s %s' % (t, e.errno))\nd = os.path.join(os.getcwd(), 'mv-%d' % os.getpid())\nos.makedirs(d)\nopen(os.path.join(d, 'x'), 'w').close()\ntry:\n    os.rename(os.path.join(d, 'x'), os.path.join(os.getcwd(), 'moved-%d' % os.getpid()))\n    lines.append('moved between folders')\nexcept OSError as e:\n    lines.append('move refused %s' % e.errno)\nopen(os.path.join({mark:?}, 'writes-%d.txt' % os.getpid()), 'w').write('\\n'.join(lines) + '\\n')\n",
            mark = mark.display().to_string(),
        ),
    )
    .unwrap();
    sb.serve_with(&[]);
    sb.worker_in("w1", 2, &ws);
    let out = sb.submit_remote("warmy", &["--wait"]);
    let text = format!(
        "{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        sb.logs()
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert_eq!(imports(&sb), 1, "both runs forked from one zygote: {text}");
    let mut tried = 0;
    for e in std::fs::read_dir(&mark).unwrap().flatten() {
        tried += 1;
        let got = std::fs::read_to_string(e.path()).unwrap();
        for t in &refused {
            assert!(got.contains(&format!("refused {t} ")), "{t}:\n{got}");
        }
        // A file moves between folders of its own (the one right a
        // Landlock domain refuses unless allowed).
        assert!(got.contains("moved between folders"), "{got}");
        // Its own checkout and scratch folder take writes.
        for own in ["own.txt", "scratch.txt"] {
            assert!(
                got.lines()
                    .any(|l| l.starts_with("wrote ") && l.ends_with(own)),
                "{own}:\n{got}"
            );
        }
    }
    assert_eq!(tried, 2, "each component's test tried its writes");
}

/// A folder for a worker's workspace that lies below none of the folders
/// jobs create files in directly (`/tmp`, `/var/tmp`, `/dev/shm`,
/// `$TMPDIR`): `/run`, else `$HOME`, else the build's own folder (a
/// checkout below `/tmp`, as CI's may be, has its target there too).
fn outside_tmp() -> tempfile::TempDir {
    let busy: Vec<std::path::PathBuf> = ["/tmp", "/var/tmp", "/dev/shm"]
        .iter()
        .map(std::path::PathBuf::from)
        .chain(std::env::var_os("TMPDIR").map(std::path::PathBuf::from))
        .map(|p| p.canonicalize().unwrap_or(p))
        .collect();
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let candidates = [
        Some("/run".into()),
        home,
        Some(env!("CARGO_TARGET_TMPDIR").into()),
    ];
    for c in candidates.into_iter().flatten() {
        let c: std::path::PathBuf = c;
        let real = c.canonicalize().unwrap_or(c.clone());
        if busy.iter().any(|b| real.starts_with(b)) {
            continue;
        }
        if let Ok(d) = tempfile::Builder::new()
            .prefix("fvd-warm-ws")
            .tempdir_in(&real)
        {
            return d;
        }
    }
    panic!(
        "no writable folder outside /tmp-like folders for the worker's workspace (tried /run, $HOME and the target folder)"
    );
}
