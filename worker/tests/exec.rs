//! Job execution with real subprocesses: nothing of a job survives its
//! timeout or cancellation (grandchildren that ignore SIGTERM or left the
//! process group included), GPU pinning, ordered and complete output, and
//! secrets that never leave.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use fvd_contracts::verdict::{ErrorKind, Verdict};
use fvd_worker::exec::{
    ExecError, JobEvent, JobOutcome, JobSpec, JunitFile, OutputStream, StopReason, run_job,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn spec(job_id: &str, argv: &[&str]) -> JobSpec {
    JobSpec {
        job_id: job_id.into(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![],
        secret_env_names: vec![],
        sandbox: fvd_worker::exec::JobSandbox::unjailed(),
        cwd: PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        gpus: vec![],
        timeout: Duration::from_secs(60),
        grace: Duration::from_secs(1),
        junit: None,
        warm: None,
        stdin: None,
    }
}

/// Run a job, collecting every event.
async fn run(spec: JobSpec, cancel: CancellationToken) -> (JobOutcome, Vec<JobEvent>) {
    let (tx, mut rx) = mpsc::channel(8);
    let collect = fvd_telemetry::spawn(async move {
        let mut v = Vec::new();
        while let Some(e) = rx.recv().await {
            v.push(e);
        }
        v
    });
    let outcome = run_job(spec, tx, cancel).await.expect("job runs");
    (outcome, collect.await.unwrap())
}

/// Concatenated output of one stream, checking that chunks are numbered
/// 0, 1, 2… across both streams and that each stream's offsets have no gap.
fn reassemble(events: &[JobEvent]) -> BTreeMap<&'static str, Vec<u8>> {
    assert!(
        matches!(events.first(), Some(JobEvent::Started { .. })),
        "first event must be Started: {:?}",
        events.first()
    );
    let mut next_seq = 0;
    let mut out: BTreeMap<&'static str, Vec<u8>> = BTreeMap::new();
    for e in events {
        if let JobEvent::Output {
            stream,
            seq,
            offset,
            data,
        } = e
        {
            assert_eq!(*seq, next_seq, "seq must increase by one");
            next_seq += 1;
            let name = match stream {
                OutputStream::Stdout => "stdout",
                OutputStream::Stderr => "stderr",
            };
            let buf = out.entry(name).or_default();
            assert_eq!(
                *offset,
                buf.len() as u64,
                "{name} offset must be contiguous"
            );
            assert!(!data.is_empty());
            buf.extend_from_slice(data);
        }
    }
    out
}

/// Whether `pid` is a live (non-zombie) process.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z' | 'X') | None)
        }
    }
}

async fn wait_gone(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while alive(pid) {
        assert!(Instant::now() < deadline, "pid {pid} still alive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn pids_tagged(text: &str, tag: &str) -> Vec<i32> {
    text.lines()
        .filter_map(|l| l.strip_prefix(tag))
        .map(|p| p.trim().parse().expect("pid"))
        .collect()
}

/// A python child that ignores SIGTERM, prints `TAG pid` and sleeps; with
/// `setsid` it first leaves the job's session and process group. The line
/// is one `write(2)`: `print` may write the text and its newline apart, and
/// two children sharing the pipe then interleave mid-line.
fn stubborn(tag: &str, setsid: bool) -> String {
    format!(
        "python3 -c 'import os, signal, time\n{}signal.signal(signal.SIGTERM, signal.SIG_IGN)\nos.write(1, (\"{tag} %d\\n\" % os.getpid()).encode())\ntime.sleep(3600)' &",
        if setsid { "os.setsid()\n" } else { "" }
    )
}

#[tokio::test]
async fn timeout_kills_grandchildren_that_ignore_sigterm() {
    let script = format!(
        "{}\n{}\nwait",
        stubborn("GRANDCHILD", false),
        stubborn("ESCAPED", true)
    );
    let mut s = spec("stubborn", &["sh", "-c", &script]);
    s.timeout = Duration::from_secs(3);
    s.grace = Duration::from_millis(500);
    let started = Instant::now();
    let (outcome, events) = run(s, CancellationToken::new()).await;
    let out = reassemble(&events);
    let stdout = String::from_utf8_lossy(&out["stdout"]).into_owned();
    let grandchildren = pids_tagged(&stdout, "GRANDCHILD");
    let escaped = pids_tagged(&stdout, "ESCAPED");
    assert_eq!(grandchildren.len(), 1, "{stdout}");
    assert_eq!(escaped.len(), 1, "{stdout}");

    assert!(outcome.timed_out);
    assert!(!outcome.cancelled);
    assert!(outcome.survivors.is_empty(), "{:?}", outcome.survivors);
    assert!(
        outcome.output_drained,
        "the escaped child held stdout; killing it must close the pipe"
    );
    assert!(events.contains(&JobEvent::Stopping {
        reason: StopReason::Timeout
    }));
    // Generous bound: the job must not have waited for the hour-long sleeps.
    assert!(started.elapsed() < Duration::from_secs(30));
    for pid in grandchildren.into_iter().chain(escaped) {
        wait_gone(pid).await;
    }
    assert_eq!(outcome.verdict(), Verdict::Timeout);
}

#[tokio::test]
async fn cancel_stops_the_job() {
    let mut s = spec("cancel", &["sh", "-c", "echo READY; exec sleep 3600"]);
    s.timeout = Duration::from_secs(600);
    let cancel = CancellationToken::new();
    let (tx, mut rx) = mpsc::channel(8);
    let job = fvd_telemetry::spawn(run_job(s, tx, cancel.clone()));
    let mut pid = None;
    // Cancel once the job has shown it is running.
    while let Some(e) = rx.recv().await {
        match e {
            JobEvent::Started { pid: p, .. } => pid = Some(p as i32),
            JobEvent::Output { data, .. } if data.starts_with(b"READY") => {
                cancel.cancel();
                break;
            }
            _ => {}
        }
    }
    fvd_telemetry::spawn(async move { while rx.recv().await.is_some() {} });
    let outcome = tokio::time::timeout(Duration::from_secs(60), job)
        .await
        .expect("cancel ends the job promptly")
        .unwrap()
        .unwrap();
    assert!(outcome.cancelled);
    assert!(!outcome.timed_out);
    assert_eq!(outcome.signal, Some(15), "sleep dies of SIGTERM");
    assert!(outcome.survivors.is_empty());
    wait_gone(pid.expect("started event")).await;
    assert!(matches!(
        outcome.verdict(),
        Verdict::Error {
            kind: ErrorKind::Cancelled,
            ..
        }
    ));
}

#[tokio::test]
async fn leftover_processes_are_stopped_after_the_main_process_exits() {
    let script = "sleep 3600 & echo LEFT $!";
    let (outcome, events) = run(
        spec("leftover", &["sh", "-c", script]),
        CancellationToken::new(),
    )
    .await;
    let out = reassemble(&events);
    let left = pids_tagged(&String::from_utf8_lossy(&out["stdout"]), "LEFT");
    assert_eq!(outcome.exit_code, Some(0));
    assert_eq!(
        outcome.leftovers.iter().map(|p| p.pid).collect::<Vec<_>>(),
        left
    );
    assert!(outcome.survivors.is_empty());
    wait_gone(left[0]).await;
}

#[tokio::test]
async fn cuda_visible_devices_is_exactly_the_lease() {
    let probe = "printf '%s|%s' \"${CUDA_VISIBLE_DEVICES-unset}\" \"$PYTHONUNBUFFERED\"";
    for (gpus, want) in [(vec![2, 0], "2,0|1"), (vec![5], "5|1"), (vec![], "|1")] {
        let mut s = spec("gpus", &["sh", "-c", probe]);
        // The lease wins over anything the spec's env says.
        s.env = vec![("CUDA_VISIBLE_DEVICES".into(), "0,1,2,3".into())];
        s.gpus = gpus;
        let (outcome, events) = run(s, CancellationToken::new()).await;
        assert_eq!(outcome.exit_code, Some(0));
        let out = reassemble(&events);
        assert_eq!(String::from_utf8_lossy(&out["stdout"]), want);
    }
}

#[tokio::test]
async fn output_chunks_reconstruct_both_streams() {
    // Interleaved writes of distinct lines to both streams, more than one
    // pipe buffer each.
    let py = "import sys\n\
              for i in range(4000):\n\
              \x20   sys.stdout.write(f'out {i:05d} ' + 'x' * 40 + '\\n')\n\
              \x20   if i % 2 == 0:\n\
              \x20       sys.stderr.write(f'err {i:05d}\\n')\n";
    let (outcome, events) = run(
        spec("streams", &["python3", "-c", py]),
        CancellationToken::new(),
    )
    .await;
    assert_eq!(outcome.exit_code, Some(0));
    let out = reassemble(&events);
    let want_out: String = (0..4000)
        .map(|i| format!("out {i:05} {}\n", "x".repeat(40)))
        .collect();
    let want_err: String = (0..4000)
        .step_by(2)
        .map(|i| format!("err {i:05}\n"))
        .collect();
    assert_eq!(String::from_utf8_lossy(&out["stdout"]), want_out);
    assert_eq!(String::from_utf8_lossy(&out["stderr"]), want_err);
    assert_eq!(
        outcome.output_bytes,
        (want_out.len() as u64, want_err.len() as u64)
    );
    assert!(outcome.output_tail.ends_with('\n'));
    assert!(outcome.output_tail.len() <= fvd_worker::exec::OUTPUT_TAIL_BYTES);
}

/// A worker's environment with a credential, keys, and what runs need.
fn worker_env() -> Vec<(String, String)> {
    fvd_sandbox::env::filtered([
        ("PATH", std::env::var("PATH").unwrap()),
        ("HOME", "/home/worker".to_string()),
        ("LC_ALL", "C.UTF-8".to_string()),
        ("CUDA_HOME", "/usr/local/cuda".to_string()),
        ("FVD_TOKEN", "worker-token-4f9a8b7c6d5e".to_string()),
        ("ANTHROPIC_API_KEY", "sk-ant-api03-secretvalue".to_string()),
        ("HF_TOKEN", "hf_notnamedbythespec0000000000000".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "aws-secret-value".to_string()),
    ])
}

/// The interpreter itself, not a shim (pyenv's adds variables of its own).
fn real_python() -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[tokio::test]
async fn a_job_sees_only_the_allow_listed_worker_variables_its_own_and_fvds() {
    let python = real_python();
    let mut s = spec(
        "env",
        &[
            &python,
            "-c",
            "import os; print(','.join(sorted(os.environ))); print(os.environ)",
        ],
    );
    s.env = vec![("SPEC_VAR".into(), "literal".into())];
    s.sandbox.base_env = worker_env();
    let (outcome, _) = run(s, CancellationToken::new()).await;
    assert_eq!(outcome.exit_code, Some(0), "{}", outcome.output_tail);
    let keys = outcome.output_tail.lines().next().unwrap();
    assert_eq!(
        keys,
        "CUDA_HOME,CUDA_VISIBLE_DEVICES,FVD_JOB_COOKIE,HOME,LC_ALL,PATH,PYTHONUNBUFFERED,SPEC_VAR"
    );
    for secret in ["worker-token", "sk-ant", "hf_notnamed", "aws-secret"] {
        assert!(!outcome.output_tail.contains(secret), "{secret}");
    }
}

/// The worker's token is redacted from a job's output like the job's own
/// secrets, in its encodings too.
#[tokio::test]
async fn the_workers_token_is_redacted_in_every_spelling() {
    let token = "worker-token-4f9a8b7c6d5e";
    let py = format!(
        "import base64, urllib.parse\nt = {token:?}\nprint(t)\nprint(base64.b64encode(t.encode()).decode())\nprint(base64.urlsafe_b64encode(('user:' + t).encode()).decode().rstrip('='))\nprint(urllib.parse.quote(t + '/x', safe=''))\n"
    );
    let mut s = spec("tok", &["python3", "-c", &py]);
    s.sandbox.secrets = fvd_contracts::redactor::Redactor::new([("fvd-token", token)]);
    let (outcome, events) = run(s, CancellationToken::new()).await;
    assert_eq!(outcome.exit_code, Some(0), "{}", outcome.output_tail);
    let out = reassemble(&events);
    let text = String::from_utf8_lossy(&out["stdout"]).into_owned();
    assert_eq!(text.matches("[redacted:fvd-token]").count(), 4, "{text}");
    let r = fvd_contracts::redactor::Redactor::new([("t", token)]);
    assert!(!r.finds(text.as_bytes()), "{text}");
    assert!(!r.finds(outcome.output_tail.as_bytes()));
}

#[tokio::test]
async fn secrets_never_leave_the_worker() {
    let secret = "hf_S3cr3tT0kenValue";
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("junit.xml");
    // Written one byte at a time, flushed, so the value is split across
    // reads; also echoed to stderr and written into the JUnit file.
    let py = "import os, sys, time\n\
              tok = os.environ['HF_TOKEN']\n\
              for _ in range(3):\n\
              \x20   for ch in 'token=' + tok + '\\n':\n\
              \x20       sys.stdout.write(ch); sys.stdout.flush()\n\
              sys.stderr.write(tok + tok + '\\n')\n\
              open(sys.argv[1], 'w').write('<testsuite><testcase name=\"' + tok + '\"/></testsuite>')\n";
    let mut s = spec("secret", &["python3", "-c", py, "{junitxml}"]);
    s.env = vec![("HF_TOKEN".into(), secret.into())];
    s.secret_env_names = vec!["HF_TOKEN".into()];
    s.junit = Some(junit);
    let (outcome, events) = run(s, CancellationToken::new()).await;
    assert_eq!(outcome.exit_code, Some(0), "{}", outcome.output_tail);
    let out = reassemble(&events);
    let all: Vec<u8> = out.values().flatten().copied().collect();
    let text = String::from_utf8_lossy(&all);
    assert!(!text.contains(secret), "{text}");
    for e in &events {
        if let JobEvent::Output { data, .. } = e {
            assert!(!String::from_utf8_lossy(data).contains(secret));
        }
    }
    assert_eq!(
        String::from_utf8_lossy(&out["stdout"]),
        "token=[redacted:HF_TOKEN]\n".repeat(3)
    );
    assert_eq!(
        String::from_utf8_lossy(&out["stderr"]),
        "[redacted:HF_TOKEN][redacted:HF_TOKEN]\n"
    );
    assert!(!outcome.output_tail.contains(secret));
    match &outcome.junit {
        JunitFile::Read(xml) => {
            assert!(!xml.contains(secret), "{xml}");
            assert!(xml.contains("[redacted:HF_TOKEN]"));
        }
        other => panic!("junit not read: {other:?}"),
    }
}

/// The documented limit: a descendant that leaves the group *and* clears its
/// environment cannot be found, so it keeps the output pipe open. The job
/// must still end, after a bounded drain, flagged as not drained.
#[tokio::test]
async fn an_unfindable_pipe_holder_does_not_hang_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("holder-ready");
    // The leader waits until the holder has left the group (it writes the
    // mark after setsid), so fvd's leftover sweep cannot catch it half-way.
    let script = format!(
        "setsid env -i sh -c 'echo HOLDER $$; echo x > {m}; exec sleep 120' &\n\
         while [ ! -s {m} ]; do sleep 0.01; done",
        m = mark.display()
    );
    let started = Instant::now();
    let (outcome, events) = run(
        spec("holder", &["sh", "-c", &script]),
        CancellationToken::new(),
    )
    .await;
    let out = reassemble(&events);
    let holders = pids_tagged(&String::from_utf8_lossy(&out["stdout"]), "HOLDER");
    // Clean up what fvd could not, before asserting anything.
    for pid in &holders {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    assert_eq!(holders.len(), 1);
    assert_eq!(outcome.exit_code, Some(0));
    assert!(!outcome.output_drained);
    assert!(started.elapsed() < Duration::from_secs(60));
    wait_gone(holders[0]).await;
}

#[tokio::test]
async fn unbounded_timeout_runs_to_completion() {
    let mut s = spec("no-timeout", &["sh", "-c", "exit 3"]);
    s.timeout = Duration::MAX;
    let (outcome, _) = run(s, CancellationToken::new()).await;
    assert_eq!(outcome.exit_code, Some(3));
    assert!(!outcome.timed_out);
}

#[tokio::test]
async fn stale_junit_is_removed_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("junit.xml");
    std::fs::write(&junit, "<testsuite><testcase name=\"old\"/></testsuite>").unwrap();
    let mut s = spec("stale", &["true"]);
    s.junit = Some(junit.clone());
    let (outcome, _) = run(s, CancellationToken::new()).await;
    assert_eq!(outcome.junit, JunitFile::Missing(junit));
}

#[tokio::test]
async fn unknown_program_is_a_spawn_error() {
    let (tx, _rx) = mpsc::channel(1);
    let err = run_job(
        spec("nope", &["/nonexistent/fvd-test-program"]),
        tx,
        CancellationToken::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ExecError::Spawn { .. }), "{err}");
    assert!(err.to_string().contains("/nonexistent/fvd-test-program"));
    let (tx, _rx) = mpsc::channel(1);
    let err = run_job(spec("empty", &[]), tx, CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(err, ExecError::EmptyArgv { .. }));
}
