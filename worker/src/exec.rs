//! Job execution: one subprocess per job in its own process group, pinned to
//! its leased GPUs, with streamed and redacted output, a timeout and
//! cancellation that take down every process of the job, and a post-run
//! check that nothing of the job is left.
//!
//! A job's processes are found two ways: by process group (the leader is
//! started with `process_group(0)`, so its pgid is its pid) and by a
//! per-run cookie in the environment ([`JOB_COOKIE_ENV`]), which catches
//! descendants that left the group with `setsid`/`setpgid`. The worker does
//! not become a child subreaper: orphans it adopted would have to be reaped
//! with `waitpid(-1)`, which would steal exit statuses from tokio's own child
//! handling.
//!
//! What the job sees of the worker ([`JobSandbox`]): only the worker's
//! allow-listed variables (`fvd_sandbox::env`) under the job's own, and,
//! with a jail, no way to its credentials (`fvd_sandbox::jail`): the
//! program is started by the jail's launcher, which execs it in place (same
//! pid and group). Every byte that leaves the job is redacted of the
//! secrets the worker knows: the values of the variables the spec passes by
//! name and the worker's own token, in every spelling
//! (`fvd_contracts::redactor`).
//!
//! Limits: a descendant that both leaves the process group and clears its
//! environment (`setsid env -i …`) is not found (the output pipes it holds
//! are abandoned after [`DRAIN_TIMEOUT`], see [`JobOutcome::output_drained`]).
//! Like every pgid-based supervisor, signalling by pgid assumes the pid
//! space does not wrap around during the few seconds of a job's cleanup.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fvd_contracts::redactor::Redactor;
use fvd_contracts::verdict::{self, JunitEvidence, RunEvidence, Verdict};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Environment variable carrying the per-run cookie that marks every process
/// of a job, including those that left its process group.
pub const JOB_COOKIE_ENV: &str = "FVD_JOB_COOKIE";

/// The placeholder in argv replaced by the JUnit path.
pub const JUNIT_PLACEHOLDER: &str = "{junitxml}";

/// Most bytes of combined output kept in [`JobOutcome::output_tail`].
pub const OUTPUT_TAIL_BYTES: usize = 64 * 1024;

/// Most bytes of a run's output streamed as [`JobEvent::Output`] by
/// default (`fvd worker --max-output-mib`): the first half as it comes,
/// then, per stream, the last quarter, sent when the run ends behind a
/// line that says how much was left out. 300 MiB of test output once
/// became 611 MB of database for one run.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 16 * 1024 * 1024;

/// How long to wait for the output pipes to close once every process of the
/// job is gone; a holder fvd could not find (see the module doc) must not
/// hang the worker.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How long to wait for processes to vanish after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Interval of `/proc` polling while waiting for processes to exit.
const POLL: Duration = Duration::from_millis(25);

/// Size of one read from a pipe.
const CHUNK: usize = 64 * 1024;

/// Module name of the embedded pytest plugin (`-p fvd_pytest_plugin`).
pub const PYTEST_PLUGIN_MODULE: &str = "fvd_pytest_plugin";

/// The variable that names the file fvd's pytest plugin appends the run's
/// peak GPU memory to (MiB, one line per process: [`read_peak_gpu`]).
pub const PEAK_GPU_ENV: &str = "FVD_PEAK_GPU_FILE";

/// Source of the pytest plugin that records each test's real outcome (so a
/// non-strict xpass is not mistaken for a pass).
pub const PYTEST_PLUGIN_SOURCE: &str = include_str!("fvd_pytest_plugin.py");

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    pub job_id: String,
    /// Program and arguments; `{junitxml}` in any element becomes the JUnit
    /// path.
    pub argv: Vec<String>,
    /// Set on top of the worker's allow-listed variables
    /// ([`JobSandbox::base_env`]). `CUDA_VISIBLE_DEVICES` and
    /// [`JOB_COOKIE_ENV`] are always fvd's own and cannot be overridden.
    pub env: Vec<(String, String)>,
    /// Names in `env` whose values are redacted from every byte that leaves
    /// the job (output events, tail, JUnit text).
    pub secret_env_names: Vec<String>,
    /// What the job may see of the worker.
    pub sandbox: JobSandbox,
    pub cwd: PathBuf,
    /// Host GPU indices leased to the job; empty hides every GPU.
    pub gpus: Vec<u32>,
    pub timeout: Duration,
    /// Time between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Where pytest writes its JUnit report. Deleted before the run so a
    /// stale report is never read.
    pub junit: Option<PathBuf>,
    /// `Some` for a warm run (`[runner] mode = "warm"`): forked from a
    /// zygote ([`crate::zygote`]), or cold with a warning when it cannot be.
    pub warm: Option<crate::zygote::WarmSpec>,
    /// Written to the job's stdin, which is then closed (an agent's
    /// packet); `None`: stdin is empty. Cold runs only.
    pub stdin: Option<Vec<u8>>,
}

impl JobSpec {
    /// Whether [`prepare_pytest`] made pytest load fvd's plugin.
    pub fn loads_plugin(&self) -> bool {
        let flag = format!("-p {PYTEST_PLUGIN_MODULE}");
        self.env
            .iter()
            .any(|(k, v)| k == "PYTEST_ADDOPTS" && v.starts_with(&flag))
    }
}

/// What a job may see of the worker that runs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobSandbox {
    /// The worker's variables that reach the job (the allow-list of
    /// `fvd_sandbox::env`, read by the worker): nothing else of its
    /// environment does.
    pub base_env: Vec<(String, String)>,
    /// Secret values the worker knows besides the job's own (its token),
    /// redacted from everything the job sends back like those.
    pub secrets: Redactor,
    /// The jail the job starts in (off: none).
    pub jail: fvd_sandbox::Jail,
    /// The worker's CUDA MPS daemon (`--mps`), whose folders and GPU
    /// names a GPU job's environment gets.
    pub mps: Option<crate::mps::Mps>,
}

impl JobSandbox {
    /// This process's allow-listed variables, no other secret, no jail
    /// (tests and tools that run jobs outside a worker).
    pub fn unjailed() -> Self {
        Self {
            base_env: fvd_sandbox::env::inherited(),
            ..Self::default()
        }
    }
}

/// Which pipe an output chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// Why fvd is stopping the job's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopReason {
    Timeout,
    Cancelled,
    /// The main process exited but others of the job were still running.
    Leftovers,
}

/// Streamed while the job runs. `Started` comes first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEvent {
    Started {
        pid: u32,
        /// When the process was spawned, stamped here rather than where the
        /// event is read, which may lag under load.
        at: std::time::SystemTime,
    },
    /// A redacted chunk. `seq` increases by one per chunk across both
    /// streams; `offset` is the byte offset of `data` within its stream's
    /// redacted output, so chunks of a stream concatenate without gaps.
    Output {
        stream: OutputStream,
        seq: u64,
        offset: u64,
        data: Vec<u8>,
    },
    /// fvd sent SIGTERM to the job (SIGKILL follows after the grace).
    Stopping { reason: StopReason },
}

/// The JUnit report of a run, read after the job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JunitFile {
    NotRequested,
    /// The report's text, redacted.
    Read(String),
    Missing(PathBuf),
    Unreadable {
        path: PathBuf,
        error: String,
    },
}

pub use fvd_procs::ProcInfo;

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOutcome {
    pub job_id: String,
    pub exit_code: Option<i32>,
    /// The signal that ended the main process, if one did.
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub cancelled: bool,
    pub duration: Duration,
    pub junit: JunitFile,
    /// The last [`OUTPUT_TAIL_BYTES`] of combined output, redacted.
    pub output_tail: String,
    /// Bytes of (redacted) output per stream: stdout, stderr.
    pub output_bytes: (u64, u64),
    /// Processes still running after the main process exited, which fvd then
    /// stopped (a test that leaks a server, a daemonized helper).
    pub leftovers: Vec<ProcInfo>,
    /// Processes of the job still alive after all stopping: ought to be
    /// empty; the worker reports any.
    pub survivors: Vec<ProcInfo>,
    /// False when the output pipes were still open at [`DRAIN_TIMEOUT`]
    /// after every known process was gone; the output may be incomplete.
    pub output_drained: bool,
    /// [`prepare_pytest`] loaded fvd's pytest plugin for the run.
    pub plugin: bool,
    /// The most GPU memory the run held, as the plugin measured it
    /// ([`read_peak_gpu`]); `None`: unknown.
    pub peak_gpu_mib: Option<u64>,
}

impl JobOutcome {
    /// The evidence the verdict classifier needs (the worker is by definition
    /// not lost when it has an outcome).
    pub fn evidence(&self) -> RunEvidence<'_> {
        let junit = match &self.junit {
            JunitFile::NotRequested => JunitEvidence::Missing {
                path: "(no junit path was requested)",
            },
            JunitFile::Read(xml) => JunitEvidence::Xml(xml),
            JunitFile::Missing(p) => JunitEvidence::Missing {
                path: p.to_str().unwrap_or("(non-utf-8 path)"),
            },
            JunitFile::Unreadable { path, error } => JunitEvidence::Unreadable {
                path: path.to_str().unwrap_or("(non-utf-8 path)"),
                error,
            },
        };
        RunEvidence {
            junit,
            timed_out: self.timed_out,
            cancelled: self.cancelled,
            exit_code: self.exit_code,
            signal: self.signal,
            output_tail: &self.output_tail,
            worker_lost: false,
            plugin: self.plugin,
        }
    }

    /// Classify this run.
    pub fn verdict(&self) -> Verdict {
        verdict::classify(&self.evidence())
    }
}

/// A job that could not be run at all.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("job {job_id}: argv is empty")]
    EmptyArgv { job_id: String },
    #[error("job {job_id}: cannot spawn {program:?} in {cwd:?}: {source}")]
    Spawn {
        job_id: String,
        program: String,
        cwd: PathBuf,
        source: std::io::Error,
    },
    #[error("job {job_id}: cannot prepare junit path {path:?}: {source}")]
    Junit {
        job_id: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("job {job_id}: cannot prepare peak gpu memory file {path:?}: {source}")]
    PeakFile {
        job_id: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("job {job_id}: waiting for pid {pid} failed: {source}")]
    Wait {
        job_id: String,
        pid: u32,
        source: std::io::Error,
    },
}

/// Put the embedded pytest plugin into `scratch` and make pytest load it:
/// writes `scratch/fvd_pytest_plugin.py`, prepends `scratch` to the job's
/// `PYTHONPATH` and `-p fvd_pytest_plugin` to its `PYTEST_ADDOPTS` (each
/// keeping the job's or else the worker's value), and points `junit` at
/// `scratch/junit.xml` when no path was given, and names
/// `scratch/peak_gpu_mib` in [`PEAK_GPU_ENV`] (the job's own value is
/// replaced). The argv is left alone, so a wrapper script that runs pytest
/// (or pytest-xdist workers) load the plugin too; only `{junitxml}` (or an
/// appended `--junitxml`) must reach pytest.
pub async fn prepare_pytest(spec: &mut JobSpec, scratch: &Path) -> std::io::Result<()> {
    tokio::fs::create_dir_all(scratch).await?;
    tokio::fs::write(
        scratch.join(format!("{PYTEST_PLUGIN_MODULE}.py")),
        PYTEST_PLUGIN_SOURCE,
    )
    .await?;
    prepend_env(spec, "PYTHONPATH", &scratch.to_string_lossy(), ":");
    prepend_env(
        spec,
        "PYTEST_ADDOPTS",
        &format!("-p {PYTEST_PLUGIN_MODULE}"),
        " ",
    );
    if spec.junit.is_none() {
        spec.junit = Some(scratch.join("junit.xml"));
    }
    spec.env.retain(|(k, _)| k != PEAK_GPU_ENV);
    spec.env.push((
        PEAK_GPU_ENV.into(),
        scratch.join("peak_gpu_mib").to_string_lossy().into_owned(),
    ));
    Ok(())
}

/// The file the run's plugin reports its peak GPU memory to, when
/// [`prepare_pytest`] named one.
fn peak_gpu_file(spec: &JobSpec) -> Option<PathBuf> {
    spec.env
        .iter()
        .rfind(|(k, _)| k == PEAK_GPU_ENV)
        .filter(|_| spec.loads_plugin())
        .map(|(_, v)| PathBuf::from(v))
}

/// The run's peak GPU memory from the plugin's file: the largest of its
/// lines (one per process of the run: ranks, xdist workers). `None` when
/// no process wrote one (no CUDA) or nothing in it is a number.
pub async fn read_peak_gpu(path: &Path) -> Option<u64> {
    let text = tokio::fs::read_to_string(path).await.ok()?;
    text.lines()
        .filter_map(|l| l.trim().parse::<u64>().ok())
        .max()
}

/// Set `name` in the spec's env to `value`, followed by `sep` and the value
/// the job would otherwise have seen (its own env, else the worker's
/// allow-listed one).
fn prepend_env(spec: &mut JobSpec, name: &str, value: &str, sep: &str) {
    let existing = spec
        .env
        .iter()
        .rposition(|(k, _)| k == name)
        .map(|i| spec.env.remove(i).1)
        .or_else(|| {
            spec.sandbox
                .base_env
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
        .filter(|p| !p.is_empty());
    let value = match existing {
        Some(rest) => format!("{value}{sep}{rest}"),
        None => value.to_string(),
    };
    spec.env.push((name.to_string(), value));
}

/// The argv with the JUnit path substituted for `{junitxml}`, or appended as
/// `--junitxml=PATH` when no element mentions it.
pub fn junit_argv(argv: &[String], junit: Option<&Path>) -> Vec<String> {
    let Some(path) = junit else {
        return argv.to_vec();
    };
    let path = path.to_string_lossy();
    if argv.iter().any(|a| a.contains(JUNIT_PLACEHOLDER)) {
        argv.iter()
            .map(|a| a.replace(JUNIT_PLACEHOLDER, &path))
            .collect()
    } else {
        let mut v = argv.to_vec();
        v.push(format!("--junitxml={path}"));
        v
    }
}

/// `CUDA_VISIBLE_DEVICES` for a lease: the indices comma-joined, or the empty
/// string (no GPU visible) for a CPU job.
pub fn cuda_visible_devices(gpus: &[u32]) -> String {
    gpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Run one job to its end and report how it ended.
///
/// Events go to `events` (a slow receiver slows the job's output, a dropped
/// one is ignored). On timeout or `cancel`, SIGTERM goes to the whole job,
/// then SIGKILL after `spec.grace`. If the returned future is dropped, the
/// job's process group is killed.
pub async fn run_job(
    spec: JobSpec,
    events: mpsc::Sender<JobEvent>,
    cancel: CancellationToken,
) -> Result<JobOutcome, ExecError> {
    run_job_capped(spec, events, cancel, DEFAULT_MAX_OUTPUT_BYTES).await
}

/// [`run_job`], streaming at most `max_output` bytes of output (head and
/// tail kept; see [`DEFAULT_MAX_OUTPUT_BYTES`]). The output tail and the
/// byte counts of the outcome still see all of it.
pub async fn run_job_capped(
    spec: JobSpec,
    events: mpsc::Sender<JobEvent>,
    cancel: CancellationToken,
    max_output: u64,
) -> Result<JobOutcome, ExecError> {
    let job_id = spec.job_id.clone();
    let Some(program) = spec.argv.first().cloned() else {
        return Err(ExecError::EmptyArgv { job_id });
    };
    let plugin = spec.loads_plugin();
    let peak_file = peak_gpu_file(&spec);
    if let Some(path) = &peak_file {
        remove_stale(path).map_err(|source| ExecError::PeakFile {
            job_id: job_id.clone(),
            path: path.clone(),
            source,
        })?;
    }
    if let Some(path) = &spec.junit {
        remove_stale(path).map_err(|source| ExecError::Junit {
            job_id: job_id.clone(),
            path: path.clone(),
            source,
        })?;
    }
    let argv = junit_argv(&spec.argv, spec.junit.as_deref());
    let secrets = redactor(&spec);
    let cookie = new_cookie(&job_id);
    let env = job_env(&spec, &cookie);

    let start = Instant::now();
    let (warm, fallback) = match &spec.warm {
        None => (None, None),
        Some(w) => warm_fork(w, &spec, &argv, &env).await,
    };
    let mut cold_pipes = None;
    let mut child = match warm {
        Some(f) => Leader::Warm(f),
        None => {
            let (c, pipes) = spawn_cold(&spec, &program, &argv, &env)?;
            cold_pipes = Some(pipes);
            Leader::Cold(c)
        }
    };
    let pid = child.pid();
    let pgid = pid as i32;
    let mut guard = GroupGuard {
        pgid,
        cookie: cookie.clone(),
        armed: true,
    };
    tracing::info!(job_id, pid, gpus = ?spec.gpus, "job started");
    let _ = events
        .send(JobEvent::Started {
            pid,
            at: std::time::SystemTime::now(),
        })
        .await;

    let (raw_tx, raw_rx) = mpsc::channel::<Raw>(64);
    let readers = read_output(&mut child, cold_pipes, fallback, &raw_tx).await;
    let pump = fvd_telemetry::spawn(pump(raw_rx, events, secrets.clone(), max_output));

    let ended = wait_or_stop(&mut child, &spec, start, pid, &cookie, &raw_tx, &cancel).await?;
    let duration = start.elapsed();
    let survivors = job_processes(pgid, Some(&cookie));
    if survivors.is_empty() {
        guard.armed = false;
    } else {
        tracing::error!(job_id, ?survivors, "job processes survived SIGKILL");
    }
    drop(raw_tx);

    let output_drained = drain(readers).await;
    if !output_drained {
        tracing::warn!(
            job_id,
            "output pipes still open after the job ended; stopped reading"
        );
    }
    let (output_tail, output_bytes) = pump.await.unwrap_or_default();
    let junit = read_junit(spec.junit.as_deref(), &secrets).await;
    let peak_gpu_mib = match &peak_file {
        Some(path) => read_peak_gpu(path).await,
        None => None,
    };

    use std::os::unix::process::ExitStatusExt;
    let outcome = JobOutcome {
        job_id,
        exit_code: ended.status.code(),
        signal: ended.status.signal(),
        timed_out: ended.stop == Some(StopReason::Timeout),
        cancelled: ended.stop == Some(StopReason::Cancelled),
        duration,
        junit,
        output_tail,
        output_bytes,
        leftovers: ended.leftovers,
        survivors,
        output_drained,
        plugin,
        peak_gpu_mib,
    };
    tracing::info!(
        job_id = outcome.job_id,
        exit_code = ?outcome.exit_code,
        signal = ?outcome.signal,
        timed_out = outcome.timed_out,
        cancelled = outcome.cancelled,
        "job ended"
    );
    Ok(outcome)
}

/// Starts reading the job's stdout and stderr into `raw_tx` (a warm run's
/// from its zygote, a cold run's from its pipes), after the warning line
/// of a run that fell back to cold.
async fn read_output(
    child: &mut Leader,
    cold_pipes: Option<ColdPipes>,
    fallback: Option<String>,
    raw_tx: &mpsc::Sender<Raw>,
) -> Vec<tokio::task::JoinHandle<()>> {
    if let Some(line) = fallback {
        let _ = raw_tx
            .send(Raw::Chunk(OutputStream::Stderr, line.into_bytes()))
            .await;
    }
    let mut readers = Vec::new();
    let (out, err) = match child {
        Leader::Warm(f) => (
            f.stdout.take().map(Pipe::Warm),
            f.stderr.take().map(Pipe::Warm),
        ),
        Leader::Cold(_) => {
            let (out, err) = cold_pipes.unwrap_or((None, None));
            (out.map(Pipe::ColdOut), err.map(Pipe::ColdErr))
        }
    };
    for (pipe, stream) in [(out, OutputStream::Stdout), (err, OutputStream::Stderr)] {
        if let Some(pipe) = pipe {
            readers.push(fvd_telemetry::spawn(read_pipe(
                pipe,
                stream,
                raw_tx.clone(),
            )));
        }
    }
    readers
}

/// The job forked from its warm zygote, or (with the warning line its
/// output gets) `None` when it runs cold: the command is not one the zygote
/// serves, or the zygote did not start or fork.
async fn warm_fork(
    w: &crate::zygote::WarmSpec,
    spec: &JobSpec,
    argv: &[String],
    env: &std::collections::BTreeMap<String, String>,
) -> (Option<crate::zygote::Forked>, Option<String>) {
    let job_id = &spec.job_id;
    match crate::zygote::fork(w, argv, env, &spec.secret_env_names, &spec.cwd).await {
        Ok(f) => (Some(f), None),
        Err(e) => {
            fvd_telemetry::metrics::zygote("fallback");
            tracing::warn!(job_id, error = %e, "warm runner unavailable; running cold");
            let stage = match e {
                crate::zygote::WarmError::NotPytest => "the command is not `python -m pytest`",
                crate::zygote::WarmError::NotSingleNode(_) => {
                    "the command is not a single-node `torchrun --nproc_per_node=N -m pytest`"
                }
                crate::zygote::WarmError::NoInterpreter(_) => "interpreter not found",
                crate::zygote::WarmError::Start(_) => {
                    "the zygote did not start (the worker's log says why)"
                }
                crate::zygote::WarmError::Fork(_) => {
                    "the zygote could not fork (the worker's log says why)"
                }
            };
            let line = format!(
                "{}: {stage}; this run is cold\n",
                crate::zygote::WARNING_PREFIX
            );
            (None, Some(line))
        }
    }
}

/// The job started cold, in its jail: the process and its output pipes.
/// A program or folder that does not exist is a spawn error.
fn spawn_cold(
    spec: &JobSpec,
    program: &str,
    argv: &[String],
    env: &std::collections::BTreeMap<String, String>,
) -> Result<(Child, ColdPipes), ExecError> {
    let job_id = &spec.job_id;
    let spawn_err = |source| ExecError::Spawn {
        job_id: job_id.clone(),
        program: program.to_string(),
        cwd: spec.cwd.clone(),
        source,
    };
    // The launcher of a jail always starts: a program or folder that
    // does not exist is found out here, as a spawn would.
    if !spec.cwd.is_dir() {
        return Err(spawn_err(std::io::Error::from(
            std::io::ErrorKind::NotFound,
        )));
    }
    if fvd_sandbox::jail::resolve(program, env.get("PATH").map(String::as_str), &spec.cwd).is_none()
    {
        return Err(spawn_err(std::io::Error::from(
            std::io::ErrorKind::NotFound,
        )));
    }
    let mut cmd = command(spec, argv, env);
    if spec.stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut c = cmd.spawn().map_err(spawn_err)?;
    if let (Some(mut pipe), Some(bytes)) = (c.stdin.take(), spec.stdin.clone()) {
        fvd_telemetry::spawn(async move {
            use tokio::io::AsyncWriteExt;
            // A program that exits without reading all of it is
            // no error of the job's.
            let _ = pipe.write_all(&bytes).await;
        });
    }
    let pipes = (c.stdout.take(), c.stderr.take());
    Ok((c, pipes))
}

/// A cold job's stdout and stderr.
type ColdPipes = (
    Option<tokio::process::ChildStdout>,
    Option<tokio::process::ChildStderr>,
);

/// A job's main process: a child of the worker (cold) or of a zygote
/// (warm), leader of its own process group either way.
#[derive(Debug)]
enum Leader {
    Cold(Child),
    Warm(crate::zygote::Forked),
}

impl Leader {
    fn pid(&self) -> u32 {
        match self {
            // id() is only None after the child was reaped, which has not
            // happened.
            Leader::Cold(c) => c.id().unwrap_or_default(),
            Leader::Warm(f) => f.pid,
        }
    }

    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match self {
            Leader::Cold(c) => c.wait().await,
            Leader::Warm(f) => f.wait().await,
        }
    }

    fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        match self {
            Leader::Cold(c) => c.try_wait(),
            Leader::Warm(f) => f.try_wait(),
        }
    }
}

/// The whole environment of a job's process (cold or warm): the worker's
/// allow-listed variables, then the job's own, then fvd's.
fn job_env(spec: &JobSpec, cookie: &str) -> std::collections::BTreeMap<String, String> {
    let mut env: std::collections::BTreeMap<String, String> =
        spec.sandbox.base_env.iter().cloned().collect();
    env.insert("PYTHONUNBUFFERED".into(), "1".into());
    env.extend(spec.env.iter().cloned());
    env.insert(
        "CUDA_VISIBLE_DEVICES".into(),
        cuda_visible_devices(&spec.gpus),
    );
    if let Some(mps) = &spec.sandbox.mps {
        env.extend(mps.client_env(&spec.gpus));
    }
    env.insert(JOB_COOKIE_ENV.into(), cookie.into());
    env
}

/// The job's command: `argv` in its jail, in its own process group, output
/// piped, with exactly `env` (see [`job_env`]).
fn command(
    spec: &JobSpec,
    argv: &[String],
    env: &std::collections::BTreeMap<String, String>,
) -> Command {
    let mut cmd = Command::from(spec.sandbox.jail.command(argv));
    cmd.current_dir(&spec.cwd)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_clear()
        .envs(env);
    cmd
}

/// How the job's main process ended.
struct Ended {
    status: ExitStatus,
    /// Why fvd stopped the job, if it did.
    stop: Option<StopReason>,
    /// Processes the job left behind when it exited, which fvd stopped.
    leftovers: Vec<ProcInfo>,
}

/// Waits for the job's main process (`pid`, leader of its group) until it
/// exits, its timeout passes or `cancel` fires. A timed-out or cancelled
/// job is stopped as a whole; a job that exited has what it left behind
/// stopped.
async fn wait_or_stop(
    child: &mut Leader,
    spec: &JobSpec,
    start: Instant,
    pid: u32,
    cookie: &str,
    raw_tx: &mpsc::Sender<Raw>,
    cancel: &CancellationToken,
) -> Result<Ended, ExecError> {
    let job_id = spec.job_id.as_str();
    let pgid = pid as i32;
    let wait_err = |source| ExecError::Wait {
        job_id: job_id.to_string(),
        pid,
        source,
    };
    // A "no timeout" Duration::MAX must not overflow the clock.
    let deadline = tokio::time::Instant::from_std(
        start
            .checked_add(spec.timeout)
            .unwrap_or(start + Duration::from_secs(100 * 365 * 24 * 3600)),
    );
    let mut stop = None;
    let exited = tokio::select! {
        biased;
        st = child.wait() => Some(st.map_err(wait_err)?),
        _ = tokio::time::sleep_until(deadline) => { stop = Some(StopReason::Timeout); None }
        _ = cancel.cancelled() => { stop = Some(StopReason::Cancelled); None }
    };

    let mut leftovers = Vec::new();
    let status = match exited {
        Some(status) => {
            let left = job_processes(pgid, Some(cookie));
            if !left.is_empty() {
                tracing::warn!(job_id, count = left.len(), "job left processes behind");
                notify(raw_tx, StopReason::Leftovers).await;
                stop_job(None, pgid, cookie, spec.grace).await;
                leftovers = left;
            }
            status
        }
        None => {
            let reason = stop.unwrap_or(StopReason::Cancelled);
            tracing::warn!(job_id, ?reason, "stopping job");
            notify(raw_tx, reason).await;
            match stop_job(Some(child), pgid, cookie, spec.grace).await {
                Some(st) => st,
                // Still alive after SIGKILL: stuck in the kernel (D state);
                // nothing more can be done than to wait for it.
                None => child.wait().await.map_err(wait_err)?,
            }
        }
    };
    Ok(Ended {
        status,
        stop,
        leftovers,
    })
}

/// Waits for the output readers. Pipes close once every holder is gone;
/// the wait is bounded in case one was not found. False when a reader was
/// still reading at [`DRAIN_TIMEOUT`] (the output may be incomplete).
async fn drain(readers: Vec<tokio::task::JoinHandle<()>>) -> bool {
    let drain_deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
    let mut output_drained = true;
    for r in readers {
        let abort = r.abort_handle();
        if tokio::time::timeout_at(drain_deadline, r).await.is_err() {
            abort.abort();
            output_drained = false;
        }
    }
    output_drained
}

/// What became of the JUnit report at `path` (redacted when read).
async fn read_junit(path: Option<&Path>, secrets: &Redactor) -> JunitFile {
    let Some(path) = path else {
        return JunitFile::NotRequested;
    };
    match tokio::fs::read(path).await {
        Ok(bytes) => JunitFile::Read(String::from_utf8_lossy(&secrets.bytes(&bytes)).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            JunitFile::Missing(path.to_path_buf())
        }
        Err(e) => JunitFile::Unreadable {
            path: path.to_path_buf(),
            error: e.to_string(),
        },
    }
}

fn remove_stale(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    Ok(())
}

fn new_cookie(job_id: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // The job id may contain anything; only its shape matters for humans.
    let id: String = job_id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(64)
        .collect();
    format!("{id}.{}.{nanos}.{n}", std::process::id())
}

/// Every secret of a job: the values of the variables its spec passes by
/// name, and those the worker adds ([`JobSandbox::secrets`]).
pub fn redactor(spec: &JobSpec) -> Redactor {
    let mut r = spec.sandbox.secrets.clone();
    for name in &spec.secret_env_names {
        if let Some((_, value)) = spec.env.iter().rev().find(|(k, _)| k == name) {
            r.add(name, value.as_bytes());
        }
    }
    r
}

/// A job's output pipe: the worker's child's, or a named pipe a zygote's
/// child writes.
#[derive(Debug)]
enum Pipe {
    ColdOut(tokio::process::ChildStdout),
    ColdErr(tokio::process::ChildStderr),
    Warm(tokio::net::unix::pipe::Receiver),
}

impl Pipe {
    async fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Pipe::ColdOut(p) => p.read(buf).await,
            Pipe::ColdErr(p) => p.read(buf).await,
            Pipe::Warm(p) => p.read(buf).await,
        }
    }
}

enum Raw {
    Chunk(OutputStream, Vec<u8>),
    Eof(OutputStream),
    Stopping(StopReason),
}

async fn read_pipe(mut pipe: Pipe, stream: OutputStream, tx: mpsc::Sender<Raw>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx
                    .send(Raw::Chunk(stream, buf[..n].to_vec()))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    let _ = tx.send(Raw::Eof(stream)).await;
}

async fn notify(tx: &mpsc::Sender<Raw>, reason: StopReason) {
    // Never let a stalled event consumer delay stopping the job.
    let _ = tokio::time::timeout(Duration::from_millis(200), tx.send(Raw::Stopping(reason))).await;
}

/// Redact, number and forward output; keep the tail. Returns the tail and
/// the byte count per stream. Past `max_output / 2` bytes streamed, output
/// is held back per stream (its last `max_output / 4` bytes kept) and sent
/// when the run ends, after a line saying how much was left out.
async fn pump(
    mut rx: mpsc::Receiver<Raw>,
    events: mpsc::Sender<JobEvent>,
    secrets: Redactor,
    max_output: u64,
) -> (String, (u64, u64)) {
    let mut redactors = [secrets.stream(), secrets.stream()];
    let mut offsets = [0u64; 2];
    let mut seq = 0u64;
    let mut tail: VecDeque<u8> = VecDeque::new();
    let mut cap = OutputCap::new(max_output);
    let mut open = true;
    while let Some(msg) = rx.recv().await {
        let (stream, data) = match msg {
            Raw::Chunk(s, d) => (s, redactors[idx(s)].push(&d)),
            Raw::Eof(s) => (s, redactors[idx(s)].finish()),
            Raw::Stopping(reason) => {
                if open {
                    open = events.send(JobEvent::Stopping { reason }).await.is_ok();
                }
                continue;
            }
        };
        if data.is_empty() {
            continue;
        }
        tail.extend(&data);
        if tail.len() > OUTPUT_TAIL_BYTES {
            tail.drain(..tail.len() - OUTPUT_TAIL_BYTES);
        }
        let offset = offsets[idx(stream)];
        offsets[idx(stream)] += data.len() as u64;
        let Some(data) = cap.head(stream, offset, data) else {
            continue;
        };
        if open {
            let ev = JobEvent::Output {
                stream,
                seq,
                offset,
                data,
            };
            open = events.send(ev).await.is_ok();
        }
        seq += 1;
    }
    for ev in cap.finish(&mut seq) {
        if open {
            open = events.send(ev).await.is_ok();
        }
    }
    let tail: Vec<u8> = tail.into();
    (
        String::from_utf8_lossy(&tail).into_owned(),
        (offsets[0], offsets[1]),
    )
}

/// The cap on a run's streamed output: a head sent as it comes, then per
/// stream a tail held back (its oldest bytes dropped) until the end.
#[derive(Debug)]
struct OutputCap {
    max: u64,
    /// Bytes of the head still to send.
    head_left: u64,
    /// Most bytes held per stream.
    tail_max: usize,
    /// Per stream: the held bytes and the stream offset of the first.
    held: [(VecDeque<u8>, u64); 2],
    /// Per stream: bytes dropped from the middle.
    dropped: [u64; 2],
}

impl OutputCap {
    fn new(max: u64) -> Self {
        Self {
            max,
            head_left: max / 2,
            tail_max: (max / 4) as usize,
            held: Default::default(),
            dropped: [0; 2],
        }
    }

    /// What of `data` (at `offset` of `stream`) is sent now; the rest is
    /// held for the tail.
    fn head(&mut self, stream: OutputStream, offset: u64, mut data: Vec<u8>) -> Option<Vec<u8>> {
        let now = (data.len() as u64).min(self.head_left) as usize;
        self.head_left -= now as u64;
        let rest = data.split_off(now);
        if !rest.is_empty() {
            let (held, start) = &mut self.held[idx(stream)];
            if held.is_empty() {
                *start = offset + now as u64;
            }
            held.extend(rest);
            if held.len() > self.tail_max {
                let over = held.len() - self.tail_max;
                held.drain(..over);
                *start += over as u64;
                self.dropped[idx(stream)] += over as u64;
            }
        }
        (!data.is_empty()).then_some(data)
    }

    /// The held tails, each behind a line saying what was left out.
    fn finish(&mut self, seq: &mut u64) -> Vec<JobEvent> {
        let mut out = Vec::new();
        for stream in [OutputStream::Stdout, OutputStream::Stderr] {
            let (held, start) = std::mem::take(&mut self.held[idx(stream)]);
            let dropped = self.dropped[idx(stream)];
            if dropped > 0 {
                let note = format!(
                    "\n[fvd: {dropped} bytes of this run's {} left out here: its output passed the {} byte cap; the head and the last {} bytes are kept]\n",
                    match stream {
                        OutputStream::Stdout => "stdout",
                        OutputStream::Stderr => "stderr",
                    },
                    self.max,
                    held.len()
                );
                out.push(JobEvent::Output {
                    stream,
                    seq: *seq,
                    offset: start,
                    data: note.into_bytes(),
                });
                *seq += 1;
            }
            // In chunks of the usual size: one message of the whole tail
            // would pass gRPC's 4 MiB limit and break the stream.
            let held: Vec<u8> = held.into();
            for (i, piece) in held.chunks(CHUNK).enumerate() {
                out.push(JobEvent::Output {
                    stream,
                    seq: *seq,
                    offset: start + (i * CHUNK) as u64,
                    data: piece.to_vec(),
                });
                *seq += 1;
            }
        }
        out
    }
}

fn idx(s: OutputStream) -> usize {
    match s {
        OutputStream::Stdout => 0,
        OutputStream::Stderr => 1,
    }
}

/// SIGTERM every process of the job, wait up to `grace` for all of them (and
/// the leader, if still unreaped) to exit, then SIGKILL what is left and wait
/// (bounded) for it to vanish. Returns the leader's status if it was reaped
/// here.
async fn stop_job(
    mut leader: Option<&mut Leader>,
    pgid: i32,
    cookie: &str,
    grace: Duration,
) -> Option<ExitStatus> {
    let mut status = None;
    signal_job(pgid, cookie, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    loop {
        if status.is_none()
            && let Some(child) = leader.as_deref_mut()
            && let Ok(Some(st)) = child.try_wait()
        {
            status = Some(st);
        }
        let leader_done = leader.is_none() || status.is_some();
        if leader_done && job_processes(pgid, Some(cookie)).is_empty() {
            return status;
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
    signal_job(pgid, cookie, Signal::SIGKILL);
    if status.is_none()
        && let Some(child) = leader
    {
        status = tokio::time::timeout(KILL_WAIT, child.wait())
            .await
            .ok()
            .and_then(Result::ok);
    }
    let deadline = Instant::now() + KILL_WAIT;
    while !job_processes(pgid, Some(cookie)).is_empty() && Instant::now() < deadline {
        // A straggler that was forking while the group was signalled.
        signal_job(pgid, cookie, Signal::SIGKILL);
        tokio::time::sleep(POLL).await;
    }
    status
}

fn signal_job(pgid: i32, cookie: &str, sig: Signal) {
    // ESRCH (group already empty) is the good case.
    let _ = killpg(Pid::from_raw(pgid), sig);
    for p in job_processes(pgid, Some(cookie)) {
        if p.left_group {
            let _ = kill(Pid::from_raw(p.pid), sig);
        }
    }
}

/// Disarmed once the job is known to be gone; otherwise kills the job's
/// processes when `run_job` returns early or its future is dropped.
struct GroupGuard {
    pgid: i32,
    cookie: String,
    armed: bool,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed {
            signal_job(self.pgid, &self.cookie, Signal::SIGKILL);
        }
    }
}

/// Live (non-zombie) processes in process group `pgid`, plus, with a cookie,
/// those outside it whose environment carries `FVD_JOB_COOKIE=cookie`. The
/// calling process is never listed.
pub fn job_processes(pgid: i32, cookie: Option<&str>) -> Vec<ProcInfo> {
    fvd_procs::find(Some(pgid), cookie.map(|c| (JOB_COOKIE_ENV, c)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn output_past_the_cap_keeps_its_head_and_tail_and_says_what_it_left_out() {
        let (raw_tx, raw_rx) = mpsc::channel(64);
        let (tx, mut rx) = mpsc::channel(1024);
        let pumped = fvd_telemetry::spawn(pump(raw_rx, tx, Redactor::default(), 1000));
        // 3,000 bytes on stdout (byte i is i % 251), 10 on stderr at the end.
        let all: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        for c in all.chunks(100) {
            raw_tx
                .send(Raw::Chunk(OutputStream::Stdout, c.to_vec()))
                .await
                .unwrap();
        }
        raw_tx
            .send(Raw::Chunk(OutputStream::Stderr, b"last words".to_vec()))
            .await
            .unwrap();
        raw_tx.send(Raw::Eof(OutputStream::Stdout)).await.unwrap();
        raw_tx.send(Raw::Eof(OutputStream::Stderr)).await.unwrap();
        drop(raw_tx);
        let (_, bytes) = pumped.await.unwrap();
        assert_eq!(bytes, (3000, 10), "the counts see everything");
        let mut got = Vec::new();
        while let Ok(JobEvent::Output {
            stream,
            seq,
            offset,
            data,
        }) = rx.try_recv()
        {
            got.push((stream, seq, offset, data));
        }
        let seqs: Vec<u64> = got.iter().map(|g| g.1).collect();
        assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>(), "dense");
        let head: Vec<u8> = got
            .iter()
            .filter(|g| g.0 == OutputStream::Stdout && g.2 < 500)
            .flat_map(|g| g.3.clone())
            .collect();
        assert_eq!(head, all[..500], "the first half of the cap, as it came");
        let (_, _, at, note) = &got[got.len() - 3];
        assert_eq!(*at, 2750);
        let note = String::from_utf8_lossy(note);
        assert!(
            note.contains("2250 bytes of this run's stdout left out"),
            "{note}"
        );
        let (s, _, at, tail) = &got[got.len() - 2];
        assert_eq!((*s, *at), (OutputStream::Stdout, 2750));
        assert_eq!(tail[..], all[2750..], "the last quarter of the cap");
        let (s, _, _, last) = &got[got.len() - 1];
        assert_eq!((*s, &last[..]), (OutputStream::Stderr, &b"last words"[..]));
        let streamed: usize = got.iter().map(|g| g.3.len()).sum();
        assert!(streamed < 1000 + 200, "{streamed} bytes streamed");
    }

    #[tokio::test]
    async fn a_held_tail_leaves_in_chunks_of_the_usual_size() {
        let (raw_tx, raw_rx) = mpsc::channel(64);
        let (tx, mut rx) = mpsc::channel(4096);
        let max = 8 * CHUNK as u64;
        let pumped = fvd_telemetry::spawn(pump(raw_rx, tx, Redactor::default(), max));
        for _ in 0..40 {
            raw_tx
                .send(Raw::Chunk(OutputStream::Stdout, vec![b'x'; CHUNK]))
                .await
                .unwrap();
        }
        drop(raw_tx);
        pumped.await.unwrap();
        let mut sizes = Vec::new();
        let mut next = None;
        while let Ok(JobEvent::Output { offset, data, .. }) = rx.try_recv() {
            assert!(data.len() <= CHUNK, "a chunk of {} bytes", data.len());
            if data[0] == b'x' {
                if let Some(n) = next {
                    assert!(offset >= n, "offsets go forward");
                }
                next = Some(offset + data.len() as u64);
            }
            sizes.push(data.len());
        }
        let total: usize = sizes.iter().sum();
        assert!((6 * CHUNK..6 * CHUNK + 512).contains(&total), "{total}");
    }

    fn spec_with(vals: &[(&str, &str)], worker: &[(&str, &str)]) -> JobSpec {
        JobSpec {
            job_id: "t".into(),
            argv: vec!["x".into()],
            env: vals
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            secret_env_names: vals.iter().map(|(k, _)| k.to_string()).collect(),
            sandbox: JobSandbox {
                secrets: Redactor::new(worker.iter().copied()),
                ..JobSandbox::default()
            },
            cwd: ".".into(),
            gpus: vec![],
            timeout: Duration::from_secs(1),
            grace: Duration::from_secs(1),
            junit: None,
            warm: None,
            stdin: None,
        }
    }

    #[test]
    fn a_jobs_secrets_are_its_named_variables_and_the_workers_own() {
        let r = redactor(&spec_with(
            &[("TOK", "hf_secretvalue"), ("SHORT", "abc")],
            &[("fvd-token", "worker-token-value")],
        ));
        assert_eq!(
            r.text("hf_secretvalue abc worker-token-value"),
            "[redacted:TOK] abc [redacted:fvd-token]"
        );
    }

    #[tokio::test]
    async fn prepare_pytest_keeps_the_jobs_own_paths() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = JobSpec {
            job_id: "p".into(),
            argv: vec!["pytest".into(), "t.py".into()],
            env: vec![
                ("PYTHONPATH".into(), "/job/src".into()),
                ("PYTEST_ADDOPTS".into(), "-x".into()),
                (PEAK_GPU_ENV.into(), "/job/says".into()),
            ],
            secret_env_names: vec![],
            sandbox: JobSandbox {
                base_env: vec![("PYTEST_ADDOPTS".into(), "-q".into())],
                ..JobSandbox::default()
            },
            cwd: ".".into(),
            gpus: vec![],
            timeout: Duration::from_secs(1),
            grace: Duration::from_secs(1),
            junit: None,
            warm: None,
            stdin: None,
        };
        prepare_pytest(&mut spec, dir.path()).await.unwrap();
        let get = |k: &str| spec.env.iter().find(|(n, _)| n == k).unwrap().1.clone();
        assert_eq!(
            get("PYTHONPATH"),
            format!("{}:/job/src", dir.path().display())
        );
        assert_eq!(get("PYTEST_ADDOPTS"), "-p fvd_pytest_plugin -x");
        // The peak's file is fvd's, whatever the job said.
        let peak = dir.path().join("peak_gpu_mib");
        assert_eq!(get(PEAK_GPU_ENV), peak.display().to_string());
        assert_eq!(spec.env.len(), 3, "replaced, not duplicated");
        assert_eq!(spec.argv, vec!["pytest", "t.py"]);
        assert_eq!(spec.junit, Some(dir.path().join("junit.xml")));
        let plugin = std::fs::read_to_string(dir.path().join("fvd_pytest_plugin.py")).unwrap();
        assert_eq!(plugin, PYTEST_PLUGIN_SOURCE);
    }

    #[tokio::test]
    async fn a_run_s_peak_is_its_largest_process_s_and_no_file_is_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peak_gpu_mib");
        assert_eq!(read_peak_gpu(&path).await, None);
        std::fs::write(&path, "").unwrap();
        assert_eq!(read_peak_gpu(&path).await, None, "no process used cuda");
        std::fs::write(&path, "1200\n9000\nnot a number\n700\n").unwrap();
        assert_eq!(read_peak_gpu(&path).await, Some(9000));
    }

    #[test]
    fn junit_placeholder_or_append() {
        let p = Path::new("/s/j.xml");
        let a = vec!["pytest".to_string(), "--junitxml={junitxml}".to_string()];
        assert_eq!(junit_argv(&a, Some(p))[1], "--junitxml=/s/j.xml");
        let a = vec!["pytest".to_string(), "t.py".to_string()];
        assert_eq!(
            junit_argv(&a, Some(p)),
            vec!["pytest", "t.py", "--junitxml=/s/j.xml"]
        );
        assert_eq!(junit_argv(&a, None), a);
    }

    #[test]
    fn cuda_devices_spelling() {
        assert_eq!(cuda_visible_devices(&[]), "");
        assert_eq!(cuda_visible_devices(&[3, 1]), "3,1");
    }

    #[test]
    fn xml_escaped_secret_is_redacted() {
        let r = redactor(&spec_with(&[("TOK", "a<b&c\"d")], &[]));
        let xml = "<x m=\"a&lt;b&amp;c&quot;d\">a<b&c\"d</x>";
        let red = r.text(xml);
        assert!(
            !red.contains("a&lt;b&amp;c&quot;d") && !red.contains("a<b&c\"d"),
            "{red}"
        );
    }
}
