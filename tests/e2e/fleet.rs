//! A fleet's lifecycle on the engines that start and stop workers (Slurm,
//! Kubernetes): a worker stopped by SIGTERM hands its running job back
//! instead of reporting a verdict, and the health service answers on the
//! binary's `--health-listen` addresses. The Slurm test itself, on a real
//! one-node cluster, is `tests/slurm`.

use std::time::Duration;

use crate::port::{blocks_until, status_of};
use crate::support::{Sandbox, TestComponent, components, wait_for};

/// The processes whose command line mentions `needle`, by pid.
fn pids_running(needle: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmd).contains(needle) && pid != std::process::id() as i32 {
            pids.push(pid);
        }
    }
    pids
}

fn sigterm(pid: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    );
}

#[test]
fn a_stopped_worker_hands_its_running_job_back_and_it_runs_once_elsewhere() {
    let mut sb = Sandbox::new().with_auth();
    let release = sb.repo().join("release");
    sb.port(
        "handback",
        &[TestComponent::new("slow", &blocks_until(&release))],
    );
    sb.serve();
    sb.worker("w1", 1);
    let submit = sb.submit_remote("handback", &[]);
    assert!(submit.status.success(), "{submit:?}");
    wait_for("slow running on w1", Duration::from_secs(60), || {
        let rows = components(&sb.remote_status("handback")?);
        rows.iter()
            .any(|r| r.0 == "slow" && r.1 == "running" && r.3 == "w1")
            .then_some(())
    });
    let test_file = "test_handback_slow_parity.py";
    let tests = wait_for("the test's process", Duration::from_secs(30), || {
        let p = pids_running(test_file);
        (!p.is_empty()).then_some(p)
    });
    // As Slurm's scancel or a preemption does: SIGTERM to every process of
    // the job step at once, the test first (the harder order: the test's
    // death reaches the worker before its own stop does).
    for pid in tests {
        sigterm(pid);
    }
    sigterm(sb.worker_pid("w1") as i32);
    let exit = sb.wait_worker_exit("w1", Duration::from_secs(30));
    assert!(exit.success(), "a stopped worker exits cleanly: {exit:?}");

    // Handed back: queued again (the orchestrator records it as it closes
    // the stream), no verdict, no run counted.
    let status = wait_for("slow to leave w1", Duration::from_secs(30), || {
        let s = sb.remote_status("handback")?;
        (status_of(&components(&s), "slow").1 != "running").then_some(s)
    });
    let rows = components(&status);
    let slow = status_of(&rows, "slow");
    assert_eq!(
        (slow.1.as_str(), slow.2),
        ("queued", 0),
        "the cut run is no verdict and no run: {status}"
    );
    let logs = sb.logs();
    assert!(
        logs.contains("handed them back"),
        "the worker says it handed the job back:\n{logs}"
    );

    std::fs::write(&release, "go").unwrap();
    sb.worker("w2", 1);
    let status = wait_for("the port to end", Duration::from_secs(60), || {
        let s = sb.remote_status("handback")?;
        (s["state"] != "running").then_some(s)
    });
    let rows = components(&status);
    let slow = status_of(&rows, "slow");
    assert_eq!(
        (slow.1.as_str(), slow.2, slow.3.as_str()),
        ("non_skip_pass", 1, "w2"),
        "one run, on the second worker: {status}"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn health_checks_answer_on_the_health_listen_addresses() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let mut sb = Sandbox::new().with_auth();
    let orch_health = format!("127.0.0.1:{}", free_port());
    let worker_health = format!("127.0.0.1:{}", free_port());
    let url = sb.serve_with(&["--health-listen", &orch_health]);
    let cmd = sb.worker_with("w1", 1, &["--health-listen", &worker_health]);
    sb.spawn_worker("w1", cmd);

    let rt = tokio::runtime::Runtime::new().unwrap();
    // One check; `None` while the address does not answer yet.
    let check = |addr: &str, name: &str| -> Option<ServingStatus> {
        rt.block_on(async {
            let channel = tonic::transport::Endpoint::from_shared(addr.to_string())
                .ok()?
                .connect()
                .await
                .ok()?;
            let r = HealthClient::new(channel)
                .check(HealthCheckRequest {
                    service: name.into(),
                })
                .await
                .ok()?;
            ServingStatus::try_from(r.into_inner().status).ok()
        })
    };
    let orch_side = format!("http://{orch_health}");
    let worker_side = format!("http://{worker_health}");
    for (addr, name) in [
        (url.as_str(), ""),
        (url.as_str(), "fvd.v1.WorkerService"),
        (orch_side.as_str(), ""),
        (orch_side.as_str(), "fvd.v1.PortService"),
        (worker_side.as_str(), ""),
        (worker_side.as_str(), "liveness"),
    ] {
        wait_for(
            &format!("{addr} {name:?} SERVING"),
            Duration::from_secs(30),
            || (check(addr, name) == Some(ServingStatus::Serving)).then_some(()),
        );
    }
    // The orchestrator dies: the worker reconnects, not ready but alive.
    sb.kill_orchestrator();
    wait_for(
        "the worker to report NOT_SERVING",
        Duration::from_secs(30),
        || (check(&worker_side, "") == Some(ServingStatus::NotServing)).then_some(()),
    );
    assert_eq!(
        check(&worker_side, "liveness"),
        Some(ServingStatus::Serving)
    );
}

#[test]
fn drain_wait_returns_once_the_drained_worker_has_exited() {
    let mut sb = Sandbox::new().with_auth();
    let release = sb.repo().join("release");
    sb.port(
        "drainwait",
        &[TestComponent::new("slow", &blocks_until(&release))],
    );
    sb.serve();
    sb.worker("w1", 1);
    let submit = sb.submit_remote("drainwait", &[]);
    assert!(submit.status.success(), "{submit:?}");
    wait_for("slow running on w1", Duration::from_secs(60), || {
        let rows = components(&sb.remote_status("drainwait")?);
        rows.iter()
            .any(|r| r.0 == "slow" && r.1 == "running")
            .then_some(())
    });
    // What a Kubernetes preStop hook runs.
    let mut drain = crate::support::fvd()
        .args(["worker", "drain", "--wait", "--workspace"])
        .arg(sb.repo().join("ws-w1"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(
        "the drain to reach the orchestrator",
        Duration::from_secs(30),
        || sb.logs().contains("worker drains").then_some(()),
    );
    assert!(
        drain.try_wait().unwrap().is_none(),
        "drain --wait returned while the worker still runs its job"
    );
    std::fs::write(&release, "go").unwrap();
    let status = wait_for("drain --wait to return", Duration::from_secs(60), || {
        drain.try_wait().unwrap()
    });
    assert!(status.success(), "{status:?}");
    let exit = sb.wait_worker_exit("w1", Duration::from_secs(5));
    assert!(exit.success(), "the worker had exited: {exit:?}");
    let rows = components(&sb.remote_status("drainwait").unwrap());
    let slow = status_of(&rows, "slow");
    assert_eq!(
        (slow.1.as_str(), slow.2),
        ("non_skip_pass", 1),
        "the drained run was reported: {rows:?}"
    );
}

/// `fvd workers` and `fvd queue` against a running orchestrator: the
/// worker with the run it holds and its free slots, and the run waiting
/// behind it in the queue with what it needs.
#[test]
fn workers_and_queue_show_the_fleet_s_leases_and_waiting_runs() {
    let mut sb = Sandbox::new();
    let release = sb.repo().join("release");
    // Both block until released: whichever the one slot takes first, the
    // other waits in the queue (which goes first is the scheduler's call).
    sb.port(
        "listed",
        &[
            TestComponent::new("first", &blocks_until(&release)),
            TestComponent::new("second", &blocks_until(&release)),
        ],
    );
    let url = sb.serve();
    sb.worker("w1", 1);
    assert!(sb.submit_remote("listed", &[]).status.success());
    let read = |what: &[&str]| -> Option<serde_json::Value> {
        let out = crate::support::fvd()
            .args(what)
            .args(["--json", "--orchestrator", &url])
            .output()
            .expect("run fvd");
        assert!(
            out.status.success(),
            "{what:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).ok()
    };
    let fleet = wait_for("w1 to hold a run", Duration::from_secs(60), || {
        let f = read(&["workers"])?;
        f["workers"][0]["jobs"][0]["component"]
            .as_str()
            .is_some()
            .then_some(f)
    });
    let running = fleet["workers"][0]["jobs"][0]["component"]
        .as_str()
        .unwrap()
        .to_string();
    let other = if running == "first" {
        "second"
    } else {
        "first"
    };
    assert_eq!(fleet["live"], true, "{fleet}");
    assert_eq!(fleet["workers"][0]["worker_id"], "w1", "{fleet}");
    assert_eq!(fleet["workers"][0]["cpu_slots"], 1, "{fleet}");
    assert_eq!(fleet["workers"][0]["free_cpu"], 0, "{fleet}");
    assert_eq!(
        fleet["workers"][0]["jobs"][0]["family"], "listed",
        "{fleet}"
    );
    // Each component queues its own run: the other's may come a moment
    // after the first lease.
    let queue = wait_for(
        "the other run to wait in the queue",
        Duration::from_secs(60),
        || {
            let q = read(&["queue", "listed"])?;
            (!q["jobs"].as_array()?.is_empty()).then_some(q)
        },
    );
    assert_eq!(queue["workers"], 1, "{queue}");
    let jobs = queue["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 1, "{queue}");
    assert_eq!(jobs[0]["component"], other, "{queue}");
    assert_eq!(jobs[0]["family"], "listed", "{queue}");

    std::fs::write(&release, "go").unwrap();
    wait_for("the queue to empty", Duration::from_secs(60), || {
        let q = read(&["queue"])?;
        q["jobs"].as_array()?.is_empty().then_some(())
    });
    let status = wait_for("the port to end", Duration::from_secs(60), || {
        let s = sb.remote_status("listed")?;
        (s["state"] != "running").then_some(s)
    });
    assert!(
        components(&status).iter().all(|r| r.1 == "non_skip_pass"),
        "{status}"
    );
}

/// `submit --wait` against an orchestrator no worker is connected to says
/// so within seconds, with what each run needs and a worker command that
/// can be pasted, instead of waiting silently.
#[test]
fn submit_wait_with_no_worker_says_so_and_what_the_runs_need() {
    let mut sb = Sandbox::new();
    sb.port("alone", &[TestComponent::new("a", "assert True")]);
    let url = sb.serve();
    let err_path = sb.dir.path().join("submit-wait.err");
    let (mut waiting, said) =
        submit_wait_until(&sb, "alone", &url, &err_path, "no worker is connected");
    assert!(
        said.contains(&format!("no worker is connected to {url}")),
        "names the orchestrator: {said}"
    );
    assert!(said.contains("a needs"), "names the waiting run: {said}");
    assert!(
        said.contains(&format!("fvd worker --orchestrator {url}")),
        "a worker command to paste: {said}"
    );
    // Its workspace is in the home folder of the machine it is pasted on,
    // never a relative folder in the porter's checkout (issue #43).
    assert!(
        said.contains("--workspace \"$HOME/fvd-worker\"")
            && !said.contains("--workspace fvd-worker"),
        "{said}"
    );
    assert_eq!(
        said.matches("no worker is connected").count(),
        1,
        "said once: {said}"
    );
    // A worker then takes the run and the wait ends with its verdict.
    sb.worker("w1", 1);
    let status = wait_for("the port to end", Duration::from_secs(60), || {
        waiting.try_wait().unwrap()
    });
    assert_eq!(
        status.code(),
        Some(0),
        "{}",
        std::fs::read_to_string(&err_path).unwrap()
    );
}

/// A rerun on one slot: the components queue their runs one by one in spec
/// order (short first), and the port's first placement waits for all of
/// them, so the run the last rerun showed to be the longest starts first
/// (`--placement duration`, the default), not the first one queued.
#[test]
fn a_rerun_starts_the_longest_run_first_though_it_was_queued_last() {
    let mut sb = Sandbox::new();
    let order = sb.dir.path().join("order.log");
    let body = |name: &str, secs: f64| {
        format!(
            "with open({:?}, 'a') as f:\n    f.write('{name}\\n')\ntime.sleep({secs})",
            order.display().to_string()
        )
    };
    sb.port(
        "paced",
        &[
            TestComponent::new("short", &body("short", 0.0)),
            TestComponent::new("mid", &body("mid", 0.6)),
            TestComponent::new("long", &body("long", 1.5)),
        ],
    );
    sb.serve();
    sb.worker("w1", 1);
    let out = sb.submit_remote("paced", &["--wait"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{}", sb.logs());
    std::fs::remove_file(&order).unwrap();
    let out = sb.submit_remote("paced", &["--wait", "--rerun"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{}", sb.logs());
    let started: Vec<String> = std::fs::read_to_string(&order)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(
        started,
        ["long", "mid", "short"],
        "longest expected first, from the first submit's runs"
    );
}

/// A worker is connected but cannot take the run (it has no GPU, the run
/// needs one): `submit --wait` says within seconds what the run needs and
/// that no registered worker has it, and names the capability (GPUs).
#[test]
fn submit_wait_with_an_incapable_worker_names_the_missing_capability() {
    let mut sb = Sandbox::new();
    sb.port("gpu_only", &[TestComponent::new("g", "assert True")]);
    let spec = sb.repo().join("tests/local_tests/gpu_only/port.toml");
    let text = std::fs::read_to_string(&spec).unwrap().replace(
        "coverage_scope = \"implementation_subcomponent\"\n",
        "coverage_scope = \"implementation_subcomponent\"\ngpus = 1\n",
    );
    std::fs::write(&spec, text).unwrap();
    let url = sb.serve();
    sb.worker("cpu_only", 1);
    let err_path = sb.dir.path().join("submit-wait.err");
    let (mut waiting, said) = submit_wait_until(&sb, "gpu_only", &url, &err_path, "waiting: needs");
    let _ = waiting.kill();
    let _ = waiting.wait();
    assert!(
        said.contains("waiting: needs 1 GPU") && said.contains("no registered worker has that"),
        "names the GPUs it needs: {said}"
    );
    assert!(
        !said.contains("no worker is connected"),
        "a worker is connected: {said}"
    );
}

/// `fvd submit --wait` of `family` on `url`, its stderr into `err_path`,
/// once that says `needle` (within a minute): the process and what it said.
fn submit_wait_until(
    sb: &Sandbox,
    family: &str,
    url: &str,
    err_path: &std::path::Path,
    needle: &str,
) -> (std::process::Child, String) {
    let waiting = crate::support::fvd()
        .args([
            "submit",
            "--family",
            family,
            "--wait",
            "--orchestrator",
            url,
        ])
        .args(sb.token_args("porter"))
        .arg("--repo")
        .arg(sb.repo())
        .env_remove("FVD_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(err_path).unwrap())
        .spawn()
        .expect("spawn fvd submit --wait");
    let said = wait_for(
        &format!("submit --wait to say {needle:?}"),
        Duration::from_secs(60),
        || {
            let text = std::fs::read_to_string(err_path).ok()?;
            text.contains(needle).then_some(text)
        },
    );
    (waiting, said)
}

/// On a team orchestrator (`--auth`), the no-worker hint never hands the
/// porter's own token to a worker (it would be refused, exit 6): it names
/// a placeholder and how a worker credential is made (issue #43).
#[test]
fn the_no_worker_hint_on_a_team_orchestrator_asks_for_a_worker_credential() {
    let mut sb = Sandbox::new().with_auth();
    sb.port("alone", &[TestComponent::new("a", "assert True")]);
    let url = sb.serve();
    let err_path = sb.dir.path().join("submit-wait.err");
    let (mut waiting, said) =
        submit_wait_until(&sb, "alone", &url, &err_path, "no worker is connected");
    let porter = sb.token_args("porter")[1].clone();
    assert!(
        !said.contains(&porter),
        "the porter's token file in the hint: {said}"
    );
    assert!(
        said.contains("--token-file WORKER_TOKEN_FILE")
            && said.contains("--role worker")
            && said.contains("a porter's or viewer's is refused"),
        "{said}"
    );
    let _ = waiting.kill();
    let _ = waiting.wait();
}

/// Two single-GPU components with a `gpu_memory_mib` run at the same time
/// on one GPU (a fake `nvidia-smi` lists it), while a `gpu_share = false`
/// one runs alone on it (issue #44). Each sharing run waits, bounded, for
/// the other to run beside it; the lone one checks nothing runs beside it.
#[test]
fn two_sharing_runs_share_one_gpu_while_a_lone_run_has_it_alone() {
    let mut sb = Sandbox::new();
    let marks = sb.dir.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let d = marks.display().to_string();
    let sharing = |me: &str, other: &str| {
        format!(
            "d = {d:?}\nassert os.environ['CUDA_VISIBLE_DEVICES'] == '0'\nopen(os.path.join(d, '{me}'), 'w').close()\nend = time.time() + 30\nwhile not os.path.exists(os.path.join(d, '{other}')):\n    assert time.time() < end, 'no run beside me'\n    time.sleep(0.05)\ntime.sleep(0.5)\nos.remove(os.path.join(d, '{me}'))"
        )
    };
    let alone = format!(
        "d = {d:?}\nassert os.environ['CUDA_VISIBLE_DEVICES'] == '0'\nopen(os.path.join(d, 'alone'), 'w').close()\nfor _ in range(20):\n    assert sorted(os.listdir(d)) == ['alone'], os.listdir(d)\n    time.sleep(0.05)\nos.remove(os.path.join(d, 'alone'))"
    );
    sb.port(
        "share",
        &[
            TestComponent::new("a", &sharing("a", "b")),
            TestComponent::new("b", &sharing("b", "a")),
            TestComponent::new("lone", &alone),
        ],
    );
    on_one_gpu(
        &sb,
        "share",
        &[("a", ""), ("b", ""), ("lone", "gpu_share = false\n")],
    );
    let bin = fake_gpu(&sb);
    sb.serve();
    sb.gpu_worker("gpu", 1, &bin);
    let out = sb.submit_remote("share", &["--wait"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{}", sb.logs());
}

/// Gives each named component of `family`'s spec one GPU of 2000 MiB, and
/// its extra spec lines.
fn on_one_gpu(sb: &Sandbox, family: &str, components: &[(&str, &str)]) {
    let with_memory: Vec<(&str, String)> = components
        .iter()
        .map(|(name, extra)| (*name, format!("gpu_memory_mib = 2000\n{extra}")))
        .collect();
    on_gpus(sb, family, &with_memory);
}

/// Gives each named component of `family`'s spec one GPU, and its extra
/// spec lines.
fn on_gpus(sb: &Sandbox, family: &str, components: &[(&str, String)]) {
    let spec = sb
        .repo()
        .join(format!("tests/local_tests/{family}/port.toml"));
    let mut text = std::fs::read_to_string(&spec).unwrap();
    for (name, extra) in components {
        let line = format!("name = \"{name}\"\n");
        text = text.replace(&line, &format!("{line}gpus = 1\n{extra}"));
    }
    std::fs::write(&spec, text).unwrap();
}

/// Issue #44: components whose spec gives no `gpu_memory_mib` learn it.
/// Their parity tests use CUDA through the stand-in torch of
/// `worker/tests/fake_torch`, which peaks at 3000 MiB; fvd's plugin
/// reports 3512 (the context's 512 MiB allowance added). The first submit
/// knows nothing: each run takes the 10000 MiB GPU whole (each checks that
/// nothing runs beside it). The orchestrator is then restarted with no
/// worker, and the rerun's queued runs ask (`fvd queue`) for what the
/// recorded peaks say (3512 × 1.25, rounded up to 4416 MiB); a worker then
/// runs both on the GPU at once: each waits, bounded, for the other beside
/// it. `fvd logs --json` shows each run's peak.
#[test]
fn runs_without_a_memory_estimate_take_a_whole_gpu_then_share_by_their_learned_peaks() {
    let mut sb = Sandbox::new();
    let marks = sb.dir.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let body = |me: &str, other: &str| {
        format!(
            "{}assert os.environ['CUDA_VISIBLE_DEVICES'] == '0'\nmark = lambda n: os.path.join({d:?}, n)\nfirst = not os.path.exists(mark('{me}-ran'))\nopen(mark('{me}-ran'), 'w').close()\nopen(mark('{me}'), 'w').close()\nif first:\n    for _ in range(20):\n        assert not os.path.exists(mark('{other}')), 'a first run shares its gpu'\n        time.sleep(0.05)\nelse:\n    end = time.time() + 30\n    while not os.path.exists(mark('{other}')):\n        assert time.time() < end, 'no run beside me'\n        time.sleep(0.05)\n    time.sleep(0.5)\nos.remove(mark('{me}'))",
            uses_cuda(3000),
            d = marks.display().to_string(),
        )
    };
    sb.port(
        "learn",
        &[
            TestComponent::new("a", &body("a", "b")),
            TestComponent::new("b", &body("b", "a")),
        ],
    );
    on_gpus(&sb, "learn", &[("a", String::new()), ("b", String::new())]);
    let bin = fake_gpu(&sb);
    sb.serve();
    sb.gpu_worker("gpu", 1, &bin);
    let out = sb.submit_remote("learn", &["--wait"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{}", sb.logs());
    // The learned estimate is the store's: a restarted orchestrator queues
    // the reruns asking for it.
    let asks = rerun_after_restart(&mut sb, "learn", 2);
    assert_eq!(
        asks,
        [("a".into(), 4416), ("b".into(), 4416)].into(),
        "{}",
        sb.logs()
    );
    sb.gpu_worker("gpu2", 1, &bin);
    let status = wait_for("the rerun to end", Duration::from_secs(90), || {
        let s = sb.remote_status("learn")?;
        (s["state"] != "running").then_some(s)
    });
    let rows = components(&status);
    assert!(
        rows.iter()
            .all(|r| (r.1.as_str(), r.2) == ("non_skip_pass", 2)),
        "{status}\n{}",
        sb.logs()
    );
    for (component, run) in [("a", "1"), ("b", "1"), ("a", "2"), ("b", "2")] {
        let end = logs_end(&sb, "learn", component, run);
        assert_eq!(end["peak_gpu_mib"], 3512, "{component} run {run}: {end}");
    }
}

/// Python lines of a parity test that uses CUDA through the stand-in
/// torch of `worker/tests/fake_torch`, peaking at `peak_mib` (fvd's plugin
/// reports 512 MiB more: the CUDA context's allowance).
pub(crate) fn uses_cuda(peak_mib: u32) -> String {
    let fake = fake_torch();
    format!(
        "import sys\nsys.path.insert(0, {:?})\nimport torch\nos.environ['FAKE_TORCH_PEAK_MIB'] = '{peak_mib}'\ntorch.cuda.init()\n",
        fake.display().to_string()
    )
}

/// The folder holding the stand-in torch (`worker/tests/fake_torch`).
fn fake_torch() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("worker/tests/fake_torch")
}

/// Restarts the orchestrator on its address and its database with the
/// fake GPU's worker gone, reruns `family` and returns what each of its
/// `runs` queued runs asks for (`fvd queue --json`'s `gpu_memory_mib`, by
/// component) once all are queued.
fn rerun_after_restart(
    sb: &mut Sandbox,
    family: &str,
    runs: usize,
) -> std::collections::BTreeMap<String, u64> {
    let url = sb.url.clone().unwrap();
    sb.kill_worker("gpu");
    sb.kill_orchestrator();
    sb.serve_at(url.trim_start_matches("http://"), &[]);
    let out = sb.submit_remote(family, &["--rerun"]);
    assert!(out.status.success(), "{out:?}\n{}", sb.logs());
    wait_for("the reruns to be queued", Duration::from_secs(60), || {
        let out = crate::support::fvd()
            .args(["queue", family, "--json", "--orchestrator", &url])
            .output()
            .unwrap();
        let q: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let asks: std::collections::BTreeMap<String, u64> = q["jobs"]
            .as_array()?
            .iter()
            .filter_map(|j| {
                let mib = j["needs"]["gpu_memory_mib"].as_u64()?;
                Some((j["component"].as_str()?.to_string(), mib))
            })
            .collect();
        (asks.len() == runs).then_some(asks)
    })
}

/// The `end` line of `fvd logs FAMILY COMPONENT --run RUN --json`.
fn logs_end(sb: &Sandbox, family: &str, component: &str, run: &str) -> serde_json::Value {
    let url = sb.url.as_deref().unwrap();
    let out = crate::support::fvd()
        .args(["logs", family, component, "--run", run, "--json"])
        .args(["--orchestrator", url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v.get("end").cloned())
        .unwrap_or_else(|| panic!("no end line: {text}"))
}

/// A folder for the marks a port's tests leave for each other, and the
/// Python lines that name it (`d`, `mark(name)`).
fn marks(sb: &Sandbox) -> (std::path::PathBuf, String) {
    let marks = sb.dir.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let d = format!(
        "d = {:?}\nmark = lambda n: os.path.join(d, n)\n",
        marks.display().to_string()
    );
    (marks, d)
}

/// Python lines, each indented by `indent`, that wait at most `limit_s`
/// seconds for mark `name` (the test fails when it does not come).
fn wait_mark(name: &str, indent: &str, limit_s: u32) -> String {
    format!(
        "{indent}end = time.time() + {limit_s}\n{indent}while not os.path.exists(mark('{name}')):\n{indent}    assert time.time() < end, 'no {name}'\n{indent}    time.sleep(0.05)\n"
    )
}

/// A folder with a fake `nvidia-smi` that lists one GPU of 10000 MiB.
fn fake_gpu(sb: &Sandbox) -> std::path::PathBuf {
    let bin = sb.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let smi = bin.join("nvidia-smi");
    std::fs::write(&smi, "#!/bin/sh\necho '0, GPU-fake-0, Fake GPU, 10000'\n").unwrap();
    let mut perm = std::fs::metadata(&smi).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(&smi, perm).unwrap();
    bin
}

/// Issue #44: a run that raises CUDA out-of-memory while it shares its GPU
/// is no verdict. `a` raises one on its first run, once `b` runs beside
/// it; that run is recorded as `shared_oom`, not counted, and `a` runs
/// again alone (nothing beside it), passes, and its record says why it
/// ran alone. `c` fails its numbers beside them: a failure, not rerun.
#[test]
fn an_oom_under_sharing_is_rerun_alone_and_the_alone_run_is_the_verdict() {
    let mut sb = Sandbox::new();
    let (_, d) = marks(&sb);
    let wait = |name: &str| wait_mark(name, "", 30);
    let a = format!(
        "{d}first = not os.path.exists(mark('a-ran'))\nopen(mark('a-ran'), 'w').close()\nif first:\n{}    open(mark('a-oom'), 'w').close()\n    raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 9.77 GiB total capacity)')\nassert not os.path.exists(mark('b')), 'b runs beside the alone run'",
        wait_mark("b", "    ", 30)
    );
    let b = format!(
        "{d}open(mark('b'), 'w').close()\n{}{}os.remove(mark('b'))",
        wait("a-ran"),
        wait("a-oom")
    );
    let c = format!(
        "{d}{}assert abs(1.0 - 1.5) < 1e-3, 'max abs diff 0.5'",
        wait("a-ran")
    );
    sb.port(
        "oom",
        &[
            TestComponent::new("a", &a),
            TestComponent::new("b", &b),
            TestComponent::new("c", &c),
        ],
    );
    on_one_gpu(&sb, "oom", &[("a", ""), ("b", ""), ("c", "")]);
    let bin = fake_gpu(&sb);
    sb.serve();
    sb.gpu_worker("gpu", 1, &bin);
    let out = sb.submit_remote("oom", &["--wait"]);
    assert_ne!(out.status.code(), Some(0), "c is red: {out:?}");
    let status = sb.remote_status("oom").expect("status");
    let rows = components(&status);
    let row = |n: &str| rows.iter().find(|r| r.0 == n).cloned().unwrap();
    // (name, status, runs, worker): the out-of-memory run is not counted.
    assert_eq!(row("a").1, "non_skip_pass", "{status}\n{}", sb.logs());
    assert_eq!(row("a").2, 1, "{status}");
    assert_eq!((row("b").1.as_str(), row("b").2), ("non_skip_pass", 1));
    assert_eq!(
        (row("c").1.as_str(), row("c").2),
        ("blocked", 1),
        "{status}"
    );
    let reason = |n: &str| {
        status["components"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == n)
            .map(|x| x["reason"].as_str().unwrap_or_default().to_string())
            .unwrap()
    };
    let alone = "ran alone after cuda out of memory while sharing gpu 0 in run 1 (RuntimeError: CUDA out of memory.";
    assert!(reason("a").contains(alone), "{}", reason("a"));
    assert!(reason("c").starts_with("debug_red:"), "{}", reason("c"));
    let record = std::fs::read_to_string(sb.repo().join("tests/local_tests/oom/PORT_STATUS.md"))
        .expect("PORT_STATUS.md written");
    assert!(record.contains(alone), "{record}");
    oom_run_logs(&sb);
    // The raise is the store's: a restarted orchestrator queues `a`'s
    // next run asking for it, the others for their spec's.
    let asks = rerun_after_restart(&mut sb, "oom", 3);
    let want = [("a".into(), 4000), ("b".into(), 2000), ("c".into(), 2000)];
    assert_eq!(asks, want.into(), "{}", sb.logs());
}

/// Issue #44: the run after a `shared_oom` one runs alone even when the
/// orchestrator restarted in between. `a` runs out of memory beside `b`;
/// its alone run is in flight when the worker and the orchestrator are
/// killed; the restarted orchestrator queues `a` again, alone because the
/// store's latest run of `a` is the `shared_oom` one, and its verdict says
/// so.
#[test]
fn the_run_after_an_oom_under_sharing_runs_alone_after_a_restart_too() {
    let mut sb = Sandbox::new();
    let (marks, d) = marks(&sb);
    let wait = |name: &str, indent: &str| wait_mark(name, indent, 60);
    // run 1 ran out of memory beside b; run 2 (alone) is cut by the kill
    // (it waits for `release`, so the orphan ends); run 3 is the verdict
    let a = format!(
        "{d}first = not os.path.exists(mark('a-ran'))\nopen(mark('a-ran'), 'w').close()\nif first:\n{}    open(mark('a-oom'), 'w').close()\n    raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 9.77 GiB total capacity)')\nif not os.path.exists(mark('a-cut')):\n    open(mark('a-cut'), 'w').close()\n{}    raise SystemExit(3)\nassert not os.path.exists(mark('b')), 'b runs beside the alone run'",
        wait("b", "    "),
        wait("release", "    ")
    );
    let b = format!(
        "{d}open(mark('b'), 'w').close()\n{}{}os.remove(mark('b'))",
        wait("a-ran", ""),
        wait("a-oom", "")
    );
    sb.port(
        "cut",
        &[TestComponent::new("a", &a), TestComponent::new("b", &b)],
    );
    on_one_gpu(&sb, "cut", &[("a", ""), ("b", "")]);
    let bin = fake_gpu(&sb);
    let url = sb.serve();
    sb.gpu_worker("gpu", 1, &bin);
    let out = sb.submit_remote("cut", &[]);
    assert!(out.status.success(), "{out:?}\n{}", sb.logs());
    wait_for("a's alone run", Duration::from_secs(60), || {
        marks.join("a-cut").exists().then_some(())
    });
    sb.kill_worker("gpu");
    sb.kill_orchestrator();
    std::fs::write(marks.join("release"), "").unwrap();
    sb.serve_at(url.trim_start_matches("http://"), &[]);
    sb.gpu_worker("gpu", 1, &bin);
    let out = sb.submit_remote("cut", &["--wait"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{}", sb.logs());
    let status = sb.remote_status("cut").expect("status");
    let a = status["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "a")
        .cloned()
        .unwrap();
    assert_eq!(a["status"], "non_skip_pass", "{status}");
    let why = a["reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("ran alone after cuda out of memory while sharing its gpu in run 1 (recorded before the orchestrator restarted)"),
        "{why}"
    );
}

/// `fvd logs oom a` of its two runs: the first ran out of memory under
/// sharing and says so; the second is the verdict.
fn oom_run_logs(sb: &Sandbox) {
    let url = sb.url.as_deref().unwrap();
    let run = |n: &str| {
        let out = crate::support::fvd()
            .args([
                "logs",
                "oom",
                "a",
                "--run",
                n,
                "--json",
                "--orchestrator",
                url,
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let end = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find_map(|v| v.get("end").cloned())
            .unwrap_or_else(|| panic!("no end line: {text}"));
        (end, text)
    };
    let (first, text) = run("1");
    assert_eq!(first["state"], "shared_oom", "{first}");
    let why = first["reason"].as_str().unwrap();
    assert!(
        why.starts_with("cuda out of memory while sharing gpu 0 with another run (RuntimeError: CUDA out of memory.")
            && why.ends_with("not a verdict; run 1 runs again alone, and later runs ask for 4000 mib"),
        "{why}"
    );
    assert!(
        text.contains("CUDA out of memory"),
        "its output is kept: {text}"
    );
    let (second, _) = run("2");
    assert_eq!(
        (second["state"].as_str(), second["verdict"].as_str()),
        (Some("finished"), Some("non_skip_pass")),
        "{second}"
    );
}

/// `fvd workers` while three sharing runs and nothing else hold the fake
/// GPU: one line for the GPU with its runs and leased memory, and each run
/// on it (issue #44). The runs end only once the test saw that line.
#[test]
fn fvd_workers_shows_several_runs_on_one_gpu_and_their_leased_memory() {
    let mut sb = Sandbox::new();
    let marks = sb.dir.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let body = format!(
        "end = time.time() + 60\nwhile not os.path.exists({:?}):\n    assert time.time() < end, 'never released'\n    time.sleep(0.05)",
        marks.join("release").display().to_string()
    );
    let names = ["a", "b", "c"];
    let parts: Vec<TestComponent> = names.iter().map(|n| TestComponent::new(n, &body)).collect();
    sb.port("seen", &parts);
    on_one_gpu(&sb, "seen", &[("a", ""), ("b", ""), ("c", "")]);
    let bin = fake_gpu(&sb);
    sb.serve();
    sb.gpu_worker("gpu", 1, &bin);
    let url = sb.url.clone().unwrap();
    let mut submit = crate::support::fvd()
        .args([
            "submit",
            "--family",
            "seen",
            "--orchestrator",
            &url,
            "--wait",
            "--repo",
        ])
        .arg(sb.repo())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let text = wait_for("three runs on GPU 0", Duration::from_secs(60), || {
        let out = crate::support::fvd()
            .args(["workers", "--orchestrator", &url])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.contains("GPU 0: 3 runs sharing it").then_some(text)
    });
    std::fs::write(marks.join("release"), "").unwrap();
    assert!(
        text.contains("  GPU 0: 3 runs sharing it, 6000 of 10000 MiB leased"),
        "{text}"
    );
    for n in names {
        assert!(text.contains(&format!("run 1 of seen {n} ")), "{n}: {text}");
    }
    let gpu_lines = text.lines().filter(|l| l.contains("GPU 0:")).count();
    assert_eq!(gpu_lines, 1, "one line for the shared GPU: {text}");
    let status = wait_for("the submit to end", Duration::from_secs(60), || {
        submit.try_wait().unwrap()
    });
    assert!(status.success(), "{status:?}\n{}", sb.logs());
}

/// Issue #44: a run sharing its GPU gets its part of the host's cores as
/// `OMP_NUM_THREADS` (cores ÷ the most runs the worker's one GPU may hold,
/// 4 by default), said by `FVD_RUN_THREADS`; a spec's own count is kept and
/// a run holding its GPU alone gets none. Warm, the zygote keeps torch's
/// import-time pool and the forked run's is resized (a stand-in torch), so
/// runs sharing a GPU and runs alone fork from one zygote.
#[test]
fn a_run_sharing_its_gpu_gets_its_part_of_the_cores() {
    let mut sb = Sandbox::new();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // A count in this environment reaches every run instead (the worker's
    // own environment wins, as a spec's does).
    let inherited = std::env::var("OMP_NUM_THREADS").ok();
    let chosen = (cores / 4).max(1).to_string();
    let want = inherited.clone().unwrap_or(chosen.clone());
    let fvd_set = if inherited.is_none() {
        format!("{chosen:?}")
    } else {
        "None".into()
    };
    let shared = format!(
        "assert os.environ.get('OMP_NUM_THREADS') == {want:?}, os.environ.get('OMP_NUM_THREADS')\nassert os.environ.get('FVD_RUN_THREADS') == {fvd_set}"
    );
    let alone = format!(
        "assert os.environ.get('OMP_NUM_THREADS') == {:?}\nassert 'FVD_RUN_THREADS' not in os.environ",
        inherited.clone().unwrap_or_default()
    )
    .replace("== \"\"", "is None");
    let own = "assert os.environ.get('OMP_NUM_THREADS') == '3'\nassert 'FVD_RUN_THREADS' not in os.environ";
    sb.port(
        "threads",
        &[
            TestComponent::new("a", &shared),
            TestComponent::new("b", own),
            TestComponent::new("c", &alone),
        ],
    );
    let alone_gpu = [("c", "gpu_share = false\n".to_string())];
    on_one_gpu(
        &sb,
        "threads",
        &[("a", ""), ("b", "set_env = { OMP_NUM_THREADS = \"3\" }\n")],
    );
    on_gpus(&sb, "threads", &alone_gpu);
    // Warm: the stand-in torch is preloaded by the zygote.
    let (marks, _) = marks(&sb);
    let pid = |name: &str| {
        format!(
            "import torch\nassert torch.IMPORTED_PID != os.getpid(), 'not forked'\nopen({:?}, 'w').write(str(torch.IMPORTED_PID))",
            marks.join(name).display().to_string()
        )
    };
    let warm_shared = format!(
        "{shared}\nimport torch\nassert torch.get_num_threads() == {want}, torch.get_num_threads()\n{}",
        pid("a")
    );
    let warm_alone = format!(
        "{alone}\nimport torch\nassert torch.get_num_threads() == torch.IMPORT_THREADS\n{}",
        pid("c")
    );
    sb.port(
        "threadsw",
        &[
            TestComponent::new("a", &warm_shared),
            TestComponent::new("c", &warm_alone),
        ],
    );
    on_one_gpu(&sb, "threadsw", &[("a", "")]);
    on_gpus(&sb, "threadsw", &alone_gpu);
    let spec = sb.repo().join("tests/local_tests/threadsw/port.toml");
    let fake = fake_torch();
    let text = std::fs::read_to_string(&spec).unwrap().replace(
        "[defaults]\n",
        &format!(
            "[defaults]\nset_env = {{ PYTHONPATH = {:?} }}\n",
            fake.display().to_string()
        ),
    ) + "\n[runner]\nmode = \"warm\"\npreload = [\"torch\"]\n";
    std::fs::write(&spec, text).unwrap();
    let bin = fake_gpu(&sb);
    sb.serve();
    sb.gpu_worker("gpu", 1, &bin);
    for family in ["threads", "threadsw"] {
        let out = sb.submit_remote(family, &["--wait"]);
        assert!(
            out.status.success(),
            "{family}: {}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            sb.logs()
        );
    }
    let read = |name: &str| std::fs::read_to_string(marks.join(name)).unwrap();
    assert_eq!(
        read("a"),
        read("c"),
        "one zygote for the shared and the alone run"
    );
}
