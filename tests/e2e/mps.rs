//! CUDA MPS on a worker (`fvd worker --mps`, issue #44), with a stand-in
//! `nvidia-smi` (one GPU) and a stand-in `nvidia-cuda-mps-control` on the
//! worker's `PATH` that logs what it is asked: the worker starts its own
//! daemon for the GPUs it offers, a GPU run's environment names the
//! daemon's folders and its GPU by UUID while a CPU run's has nothing of
//! MPS, the daemon is told to quit when the worker stops, and one left by
//! a killed worker is told to quit before the next one starts; a run
//! sharing its GPU is capped at the MiB it was placed by, one alone is not.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{Sandbox, TestComponent, fvd, wait_for};

/// A stand-in of the control program: `-d` "starts" a daemon (a `control`
/// file in its pipe folder); a command read from stdin is answered only
/// while that file exists (`quit` removes it). Every call is logged to
/// `mps.log` beside its folder, with the environment that matters.
const CONTROL: &str = r#"#!/bin/sh
FAKE_MPS_LOG="$(dirname "$0")/../mps.log"
if [ "$1" = "-d" ]; then
  echo "start pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY visible=$CUDA_VISIBLE_DEVICES" >> "$FAKE_MPS_LOG"
  touch "$CUDA_MPS_PIPE_DIRECTORY/control"
  exit 0
fi
read cmd
if [ ! -f "$CUDA_MPS_PIPE_DIRECTORY/control" ]; then
  echo "Cannot find MPS control daemon process" >&2
  exit 1
fi
echo "$cmd" >> "$FAKE_MPS_LOG"
if [ "$cmd" = quit ]; then rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"; fi
exit 0
"#;

fn executable(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    let mut perm = std::fs::metadata(path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(path, perm).unwrap();
}

/// A folder with the two stand-ins; the control program's log.
fn fake_mps(sb: &Sandbox) -> (PathBuf, PathBuf) {
    let bin = sb.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    executable(
        &bin.join("nvidia-smi"),
        "#!/bin/sh\necho '0, GPU-fake-0, Fake GPU, 10000'\n",
    );
    executable(&bin.join("nvidia-cuda-mps-control"), CONTROL);
    (bin, sb.dir.path().join("mps.log"))
}

fn log_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_worker_under_mps_runs_gpu_jobs_through_its_own_daemon_and_stops_it() {
    let mut sb = Sandbox::new();
    let (bin, log) = fake_mps(&sb);
    let workspace = sb.dir.path().join("ws-gpu");
    let pipe = workspace.join("mps/pipe");
    let gpu = format!(
        "assert os.environ['CUDA_MPS_PIPE_DIRECTORY'] == {:?}, os.environ\nassert os.path.isdir(os.environ['CUDA_MPS_LOG_DIRECTORY'])\nassert os.environ['CUDA_VISIBLE_DEVICES'] == 'GPU-fake-0', os.environ['CUDA_VISIBLE_DEVICES']",
        pipe.display().to_string()
    );
    let capped = format!(
        "{gpu}\nassert os.environ['CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'] == '0=2000M', os.environ"
    );
    let alone = format!("{gpu}\nassert 'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT' not in os.environ");
    let cpu = "assert not any(k.startswith('CUDA_MPS_') for k in os.environ), os.environ\nassert os.environ['CUDA_VISIBLE_DEVICES'] == ''";
    sb.port(
        "mps",
        &[
            TestComponent::new("on_gpu", &capped),
            TestComponent::new("alone", &alone),
            TestComponent::new("on_cpu", cpu),
        ],
    );
    let spec = sb.repo().join("tests/local_tests/mps/port.toml");
    let text = std::fs::read_to_string(&spec)
        .unwrap()
        .replace(
            "name = \"on_gpu\"\n",
            "name = \"on_gpu\"\ngpus = 1\ngpu_memory_mib = 2000\n",
        )
        .replace(
            "name = \"alone\"\n",
            "name = \"alone\"\ngpus = 1\ngpu_memory_mib = 2000\ngpu_share = false\n",
        );
    std::fs::write(&spec, text).unwrap();
    sb.serve();
    sb.gpu_worker_with("gpu", 1, &bin, &["--mps"]);
    let out = sb.submit_remote("mps", &["--wait"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{}", sb.logs());
    let lines = log_lines(&log);
    assert_eq!(
        lines.first().map(String::as_str),
        Some(
            format!(
                "start pipe={} log={} visible=GPU-fake-0",
                pipe.display(),
                workspace.join("mps/log").display()
            )
            .as_str()
        ),
        "{lines:?}"
    );
    assert_eq!(lines.get(1).map(String::as_str), Some("get_server_list"));

    // stopped (SIGTERM): the daemon is told to quit
    let pid = sb.worker_pid("gpu");
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let status = sb.wait_worker_exit("gpu", Duration::from_secs(30));
    assert!(status.success(), "{status:?}\n{}", sb.logs());
    assert_eq!(log_lines(&log).last().map(String::as_str), Some("quit"));
    assert!(!pipe.join("control").exists());

    // a worker killed outright leaves its daemon; the next one on the same
    // workspace tells it to quit before it starts its own
    sb.gpu_worker_with("gpu", 1, &bin, &["--mps"]);
    wait_for("the second daemon", Duration::from_secs(30), || {
        (log_lines(&log).len() >= 5).then_some(())
    });
    sb.kill_worker("gpu");
    let before = log_lines(&log).len();
    sb.gpu_worker_with("gpu", 1, &bin, &["--mps"]);
    wait_for("the third daemon", Duration::from_secs(30), || {
        (log_lines(&log).len() >= before + 4).then_some(())
    });
    let lines = log_lines(&log);
    let tail: Vec<&str> = lines[before..before + 3]
        .iter()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(tail, ["get_server_list", "quit", "start"], "{lines:?}");
}

#[test]
fn mps_on_a_worker_without_gpus_is_refused_before_it_dials() {
    let sb = Sandbox::new();
    let out = fvd()
        .args([
            "worker",
            "--orchestrator",
            "http://127.0.0.1:9",
            "--gpus",
            "none",
            "--mps",
            "--workspace",
        ])
        .arg(sb.dir.path().join("ws"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("--mps: this worker offers no GPU"), "{err}");
}
