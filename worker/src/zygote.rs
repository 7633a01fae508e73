//! The warm runner (`[runner] mode = "warm"`): per worker and per key
//! (interpreter, preload list, the environment that matters at import
//! time) one zygote process (`fvd_zygote.py`) imports the preload modules
//! once, without initialising CUDA, and forks one child per job; the child
//! takes the job's whole environment, folder, process group and output
//! pipes and runs `pytest.main` with the cold command's arguments.
//!
//! The key ([`import_env`]): the interpreter's path, the preload list, and
//! the job's variables named `PYTHON*`, `LD_*`, `PATH`, `HOME`, `TMPDIR`,
//! `LANG`, `LC_*`, `XDG_*`, `TORCH*`, `PYTORCH_*`, `TRANSFORMERS_*`,
//! `DIFFUSERS_*`, `HF_*`, `TRITON_*`, `XFORMERS_*`, `OMP_*`, `MKL_*`,
//! `OPENBLAS_*`, `NUMEXPR_*`, `CUDA_HOME`, `CUDA_PATH`, secrets excepted
//! (passed-through variables never reach a zygote). Not keys: an
//! `OMP_NUM_THREADS` the worker chose for a run sharing its GPU (the child
//! resizes torch's pool to it, as it does for a torchrun rank),
//! `CUDA_VISIBLE_DEVICES` (CUDA is initialised in the child, never in the
//! zygote), `TRACEPARENT`, `FVD_*`, `FASTVIDEO_*` and the spec's other
//! variables: the libraries a zygote imports are not the repository's, and
//! the repository's modules are imported in the child, under the job's
//! environment. The zygote starts with exactly the key's variables.
//!
//! A zygote starts in the worker's jail (`fvd_sandbox::jail`), so the
//! children it forks are jailed like a cold run: with a namespace, in the
//! same covered mount namespace; with Landlock, in the domain made when the
//! zygote started (a file created later directly in a folder on the way to
//! a hidden path stays unreadable to its children, until the zygote is
//! replaced).
//!
//! A single-node `torchrun --nproc_per_node=N -m pytest …` runs warm too
//! ([`torchrun_command`]): the zygote of the interpreter torchrun's script
//! names forks N ranks in one process group (rank 0 leads it), each with
//! the variables torchrun sets (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
//! `MASTER_ADDR`, `MASTER_PORT` on a free port, …: [`rank_env`]), so each
//! rank initialises CUDA and NCCL after the fork. Rank 0 alone writes the
//! JUnit report (the others' `--junitxml` is dropped), and is the verdict;
//! a rank that fails ends the others (SIGTERM, then SIGKILL), as torchrun
//! does, and the group's status is the first failure's.
//!
//! Failures are never verdicts: a zygote that cannot start or fork turns the
//! run cold, with one warning line in its output ([`WARNING_PREFIX`]); a
//! zygote lost while its child runs ends the run as an execution error.
//! Zygotes die with the worker: each watches its stdin, a pipe only the
//! worker holds, and its parent pid, and kills its children's groups when
//! either goes; [`shutdown`] ends them at once.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::pipe;
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{OnceCell, oneshot};

/// Source of the zygote program.
pub const ZYGOTE_SOURCE: &str = include_str!("fvd_zygote.py");

/// How a run's output says it fell back to a cold start.
pub const WARNING_PREFIX: &str = "fvd: warm runner unavailable";

/// Longest wait for a zygote to import its preload list.
pub const START_TIMEOUT: Duration = Duration::from_secs(600);

/// Longest wait for a zygote to answer a fork request.
const FORK_TIMEOUT: Duration = Duration::from_secs(30);

/// What a warm job asks of the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmSpec {
    /// Modules the zygote imports.
    pub preload: Vec<String>,
    /// `PYTHONPATH` entries that differ per job and matter only to pytest
    /// (the plugin's scratch folder): left out of the key and of the
    /// zygote's environment; the child puts them on `sys.path`.
    pub unkeyed_paths: Vec<PathBuf>,
    /// A folder of the worker's for the zygotes' files (program, sockets,
    /// logs) and the jobs' named pipes.
    pub dir: PathBuf,
    /// The jail a zygote starts in; the children it forks stay in it.
    pub jail: fvd_sandbox::Jail,
    /// The paths (and whether each is a folder) below which a one-process
    /// child may write, as the rules of its own Landlock domain (issue
    /// #39: its checkout, its scratch folder and what lies outside the
    /// worker's workspace); `None`: no write rules (the workspace lies
    /// where Landlock cannot keep it read-only, below `/tmp`, say).
    pub write_beneath: Option<Vec<(PathBuf, bool)>>,
}

/// Why a warm start did not happen (the run then goes cold).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WarmError {
    #[error("the command is not `python -m pytest …`")]
    NotPytest,
    #[error(
        "torchrun {0} is not run warm: only a single node (--standalone or --nnodes=1) with --nproc_per_node=N and -m pytest"
    )]
    NotSingleNode(String),
    #[error("interpreter {0:?} not found on PATH")]
    NoInterpreter(String),
    #[error("zygote did not start: {0}")]
    Start(String),
    #[error("zygote fork failed: {0}")]
    Fork(String),
}

/// A job's child forked by a zygote: its pid (also its process group) and
/// its exit status, reported by the zygote that reaps it.
#[derive(Debug)]
pub struct Forked {
    pub pid: u32,
    /// The job's stdout and stderr, named pipes the child writes.
    /// Taken by the readers.
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
    status: Option<ExitStatus>,
    rx: oneshot::Receiver<Result<ExitStatus, String>>,
}

impl Forked {
    /// Waits for the child's exit status (cancel-safe).
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(s) = self.status {
            return Ok(s);
        }
        let got = (&mut self.rx)
            .await
            .unwrap_or_else(|_| Err("the zygote's answer was lost".into()));
        self.settle(got)
    }

    /// The exit status if the zygote reported it already.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        match self.rx.try_recv() {
            Ok(got) => self.settle(got).map(Some),
            Err(oneshot::error::TryRecvError::Empty) => Ok(None),
            Err(oneshot::error::TryRecvError::Closed) => self
                .settle(Err("the zygote's answer was lost".into()))
                .map(Some),
        }
    }

    fn settle(&mut self, got: Result<ExitStatus, String>) -> std::io::Result<ExitStatus> {
        match got {
            Ok(s) => {
                self.status = Some(s);
                Ok(s)
            }
            Err(e) => Err(std::io::Error::other(format!(
                "zygote lost while its child ran: {e}"
            ))),
        }
    }
}

/// One running zygote.
#[derive(Debug)]
struct Zygote {
    socket: PathBuf,
    /// Killed when dropped; its stdin, held only here, closing also ends it.
    _child: Mutex<Child>,
    _stdin: ChildStdin,
}

type Slot = Arc<OnceCell<Result<Arc<Zygote>, String>>>;

fn registry() -> &'static Mutex<HashMap<String, Slot>> {
    static R: OnceLock<Mutex<HashMap<String, Slot>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Ends every zygote of this process (the worker stops).
pub fn shutdown() {
    let slots: Vec<Slot> = registry()
        .lock()
        .map(|mut r| r.drain().map(|(_, v)| v).collect())
        .unwrap_or_default();
    for s in slots {
        if let Some(Ok(z)) = s.get()
            && let Ok(mut c) = z._child.lock()
        {
            let _ = c.start_kill();
        }
    }
}

/// Whether a variable is read at import time by the libraries a zygote
/// preloads (see the module doc).
pub fn import_env(name: &str) -> bool {
    const EXACT: &[&str] = &["PATH", "HOME", "TMPDIR", "LANG", "CUDA_HOME", "CUDA_PATH"];
    const PREFIX: &[&str] = &[
        "PYTHON",
        "LD_",
        "LC_",
        "XDG_",
        "TORCH",
        "PYTORCH_",
        "TRANSFORMERS_",
        "DIFFUSERS_",
        "HF_",
        "TRITON_",
        "XFORMERS_",
        "OMP_",
        "MKL_",
        "OPENBLAS_",
        "NUMEXPR_",
    ];
    EXACT.contains(&name) || PREFIX.iter().any(|p| name.starts_with(p))
}

/// A `python [-B] [-u] [-P] -m pytest …` command, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PytestCommand {
    /// The interpreter, resolved on the job's `PATH`.
    pub interp: PathBuf,
    /// The arguments pytest gets.
    pub args: Vec<String>,
    /// `-B`: the child writes no bytecode.
    pub no_bytecode: bool,
    /// `-P`: the child's `sys.path` does not start with its folder.
    pub safe_path: bool,
    /// Processes to fork: 1, or torchrun's `--nproc_per_node`.
    pub ranks: u32,
}

/// `argv` taken apart when it is `python… -m pytest …` with at most the
/// flags `-B`, `-u` and `-P` (the ones a forked child can honour), or a
/// single-node `torchrun … -m pytest …` ([`torchrun_command`]).
pub fn pytest_command(
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: &Path,
) -> Result<PytestCommand, WarmError> {
    let Some((prog, rest)) = argv.split_first() else {
        return Err(WarmError::NotPytest);
    };
    if Path::new(prog).file_name().and_then(|n| n.to_str()) == Some("torchrun") {
        return torchrun_command(prog, rest, env, cwd);
    }
    let (mut no_bytecode, mut safe_path) = (false, false);
    let mut i = 0;
    while let Some(flag) = rest
        .get(i)
        .filter(|f| f.len() > 1 && f.starts_with('-') && *f != "-m")
    {
        for c in flag[1..].chars() {
            match c {
                'B' => no_bytecode = true,
                'P' => safe_path = true,
                'u' => {}
                _ => return Err(WarmError::NotPytest),
            }
        }
        i += 1;
    }
    let [m, pytest, args @ ..] = &rest[i..] else {
        return Err(WarmError::NotPytest);
    };
    let base = Path::new(prog)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let python = base
        .strip_prefix("python")
        .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'));
    if !python || m != "-m" || pytest != "pytest" {
        return Err(WarmError::NotPytest);
    }
    let interp = resolve(prog, env, cwd).ok_or_else(|| WarmError::NoInterpreter(prog.clone()))?;
    Ok(PytestCommand {
        interp,
        args: args.to_vec(),
        no_bytecode,
        safe_path,
        ranks: 1,
    })
}

/// `prog` resolved as a command is (a path, or the first match on the job's
/// `PATH`).
fn resolve(prog: &str, env: &BTreeMap<String, String>, cwd: &Path) -> Option<PathBuf> {
    if prog.contains('/') {
        return Some(cwd.join(prog));
    }
    env.get("PATH")
        .map(String::as_str)
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(prog))
        .find(|p| p.is_file())
}

/// Most ranks a warm torchrun forks.
pub const MAX_RANKS: u32 = 64;

/// `torchrun OPTIONS -m pytest ARGS` taken apart: one node (`--standalone`,
/// `--nnodes=1`, `--node_rank=0`, `--max_restarts=0`), `--nproc_per_node=N`
/// ranks (both spellings, `=` or a separate value), the interpreter its
/// script's `#!` line names. Any other option (a rendezvous, several
/// nodes, restarts, `--no-python`) keeps the run cold.
pub fn torchrun_command(
    prog: &str,
    rest: &[String],
    env: &BTreeMap<String, String>,
    cwd: &Path,
) -> Result<PytestCommand, WarmError> {
    let mut ranks = None;
    let mut i = 0;
    loop {
        let Some(arg) = rest.get(i) else {
            return Err(WarmError::NotPytest);
        };
        if arg == "-m" || arg == "--module" {
            break;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        let name = name.replace('-', "_");
        let mut value = || -> Result<String, WarmError> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => {
                    i += 1;
                    rest.get(i)
                        .cloned()
                        .ok_or_else(|| WarmError::NotSingleNode(arg.clone()))
                }
            }
        };
        match name.as_str() {
            "__standalone" if inline.is_none() => {}
            "__nproc_per_node" => {
                let v = value()?;
                match v.parse::<u32>() {
                    Ok(n) if (1..=MAX_RANKS).contains(&n) => ranks = Some(n),
                    _ => return Err(WarmError::NotSingleNode(format!("--nproc_per_node={v}"))),
                }
            }
            "__nnodes" => {
                let v = value()?;
                if v != "1" && v != "1:1" {
                    return Err(WarmError::NotSingleNode(format!("--nnodes={v}")));
                }
            }
            "__node_rank" | "__max_restarts" => {
                let v = value()?;
                if v != "0" {
                    let flag = arg.split('=').next().unwrap_or(arg);
                    return Err(WarmError::NotSingleNode(format!("{flag}={v}")));
                }
            }
            _ => return Err(WarmError::NotSingleNode(arg.clone())),
        }
        i += 1;
    }
    let Some(ranks) = ranks else {
        return Err(WarmError::NotSingleNode(
            "without --nproc_per_node".to_string(),
        ));
    };
    let [_, module, args @ ..] = &rest[i..] else {
        return Err(WarmError::NotPytest);
    };
    if module != "pytest" {
        return Err(WarmError::NotPytest);
    }
    let script = resolve(prog, env, cwd).ok_or_else(|| WarmError::NoInterpreter(prog.into()))?;
    let interp = shebang_python(&script, env, cwd)
        .ok_or_else(|| WarmError::NoInterpreter(format!("{} (its #! line)", script.display())))?;
    Ok(PytestCommand {
        interp,
        args: args.to_vec(),
        no_bytecode: false,
        safe_path: false,
        ranks,
    })
}

/// The Python interpreter a script's `#!` line names (`#!/path/python3`,
/// or `#!/usr/bin/env python3` resolved on the job's `PATH`); `None` for
/// anything else (a shell script, say).
fn shebang_python(script: &Path, env: &BTreeMap<String, String>, cwd: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 512];
    let n = std::fs::File::open(script).ok()?.read(&mut head).ok()?;
    let line = std::str::from_utf8(&head[..n]).ok()?.lines().next()?;
    let mut words = line.strip_prefix("#!")?.split_whitespace();
    let mut prog = words.next()?;
    if Path::new(prog).file_name().and_then(|n| n.to_str()) == Some("env") {
        prog = words.next()?;
    }
    let base = Path::new(prog).file_name()?.to_str()?;
    let python = base
        .strip_prefix("python")
        .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'));
    if !python {
        return None;
    }
    resolve(prog, env, cwd).filter(|p| p.is_file())
}

/// The variables torchrun gives rank `rank` of `ranks` on one node, its
/// store at `127.0.0.1:master_port`; `run_id` names the run. `OMP_NUM_THREADS`
/// is 1 unless the job sets it, as torchrun does for several ranks.
pub fn rank_env(
    rank: u32,
    ranks: u32,
    master_port: u16,
    run_id: &str,
    job_env: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut e = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        e.insert(k.to_string(), v);
    };
    for k in ["RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK"] {
        set(k, if k == "GROUP_RANK" { 0 } else { rank }.to_string());
    }
    for k in ["WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_WORLD_SIZE"] {
        set(k, ranks.to_string());
    }
    set("GROUP_WORLD_SIZE", "1".into());
    set("ROLE_NAME", "default".into());
    set("MASTER_ADDR", "127.0.0.1".into());
    set("MASTER_PORT", master_port.to_string());
    set("TORCHELASTIC_RESTART_COUNT", "0".into());
    set("TORCHELASTIC_MAX_RESTARTS", "0".into());
    set("TORCHELASTIC_RUN_ID", run_id.to_string());
    if ranks > 1 && !job_env.contains_key("OMP_NUM_THREADS") {
        set("OMP_NUM_THREADS", "1".into());
    }
    e
}

/// A free TCP port on the loopback for rank 0's store (free now: the ranks
/// bind it a moment later, as torchrun's `--standalone` does).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The zygote's environment for a job's: its import-time variables, less
/// secrets, the per-job `PYTHONPATH` entries and a thread count the worker
/// chose for the run ([`crate::gpu::THREADS_SET_BY_FVD`]: the child sizes
/// its pool to it).
pub fn zygote_env(
    env: &BTreeMap<String, String>,
    secrets: &[String],
    unkeyed: &[PathBuf],
) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = env
        .iter()
        .filter(|(k, _)| import_env(k) && !secrets.contains(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(pp) = out.get_mut("PYTHONPATH") {
        let kept: Vec<&str> = pp
            .split(':')
            .filter(|e| !e.is_empty() && !unkeyed.iter().any(|u| Path::new(e) == u))
            .collect();
        *pp = kept.join(":");
    }
    let threads = crate::gpu::THREADS_VAR;
    if env.get(threads).is_some() && env.get(threads) == env.get(crate::gpu::THREADS_SET_BY_FVD) {
        out.remove(threads);
    }
    out.insert("PYTHONUNBUFFERED".into(), "1".into());
    out
}

/// Forks the job's child from the zygote of its key, starting the zygote
/// first when there is none. `env` is the job's whole environment.
pub async fn fork(
    warm: &WarmSpec,
    argv: &[String],
    env: &BTreeMap<String, String>,
    secrets: &[String],
    cwd: &Path,
) -> Result<Forked, WarmError> {
    let cmd = pytest_command(argv, env, cwd)?;
    let interp = &cmd.interp;
    let zenv = zygote_env(env, secrets, &warm.unkeyed_paths);
    let mut key = format!(
        "{}\0{}\0{}",
        interp.display(),
        warm.preload.join(","),
        warm.jail.describe()
    );
    for (k, v) in &zenv {
        key.push_str(&format!("\0{k}={v}"));
    }
    let slot = registry()
        .lock()
        .map_err(|_| WarmError::Start("registry poisoned".into()))?
        .entry(key.clone())
        .or_default()
        .clone();
    fvd_telemetry::metrics::zygote(if slot.initialized() { "hit" } else { "miss" });
    let zygote = slot
        .get_or_init(|| start(warm, interp, &zenv))
        .await
        .clone()
        .map_err(WarmError::Start)?;
    let forked = request(&zygote, warm, &cmd, env, cwd).await;
    if forked.is_err() {
        // A zygote that cannot fork is not asked again: the next job of
        // its key starts a new one.
        if let Ok(mut r) = registry().lock()
            && r.get(&key).is_some_and(|s| Arc::ptr_eq(s, &slot))
        {
            r.remove(&key);
        }
    }
    forked
}

fn next_id() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// The folder for sockets and pipes: `dir`, or a private folder under the
/// system's temporary one when `dir` is too long for a socket's path.
fn socket_dir(dir: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = if dir.as_os_str().len() > 80 {
        std::env::temp_dir().join(format!("fvd-zygotes-{}", std::process::id()))
    } else {
        dir.to_path_buf()
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    Ok(dir)
}

async fn start(
    warm: &WarmSpec,
    interp: &Path,
    zenv: &BTreeMap<String, String>,
) -> Result<Arc<Zygote>, String> {
    let dir = socket_dir(&warm.dir).map_err(|e| format!("{}: {e}", warm.dir.display()))?;
    let n = next_id();
    let program = dir.join("fvd_zygote.py");
    tokio::fs::write(&program, ZYGOTE_SOURCE)
        .await
        .map_err(|e| format!("{}: {e}", program.display()))?;
    let socket = dir.join(format!("z{n}.sock"));
    let _ = std::fs::remove_file(&socket);
    let log = dir.join(format!("z{n}.log"));
    let log_file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let mut argv = vec![
        interp.display().to_string(),
        program.display().to_string(),
        socket.display().to_string(),
    ];
    argv.extend(warm.preload.iter().cloned());
    let mut child = Command::from(warm.jail.command(&argv))
        .current_dir(&dir)
        .env_clear()
        .envs(zenv)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot spawn {}: {e}", interp.display()))?;
    let stdin = child.stdin.take().ok_or("no stdin pipe")?;
    let stdout = child.stdout.take().ok_or("no stdout pipe")?;
    let mut lines = BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(START_TIMEOUT, lines.next_line()).await;
    match ready {
        Ok(Ok(Some(l))) if l == "ready" => {
            tracing::info!(zygote = %socket.display(), preload = ?warm.preload, "zygote ready");
            Ok(Arc::new(Zygote {
                socket,
                _child: Mutex::new(child),
                _stdin: stdin,
            }))
        }
        other => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            let why = std::fs::read_to_string(&log).unwrap_or_default();
            let why = why
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            Err(match other {
                Err(_) => format!("no answer in {} s", START_TIMEOUT.as_secs()),
                _ => format!("exited before it was ready: {}", fvd_paths::cut(why)),
            })
        }
    }
}

async fn request(
    z: &Zygote,
    warm: &WarmSpec,
    cmd: &PytestCommand,
    env: &BTreeMap<String, String>,
    cwd: &Path,
) -> Result<Forked, WarmError> {
    let fork_err = |e: String| WarmError::Fork(e);
    let dir = z.socket.parent().unwrap_or(&warm.dir).to_path_buf();
    let n = next_id();
    let out_path = dir.join(format!("j{n}.out"));
    let err_path = dir.join(format!("j{n}.err"));
    let mut fifos = Fifos(vec![]);
    for p in [&out_path, &err_path] {
        let _ = std::fs::remove_file(p);
        nix::unistd::mkfifo(
            p.as_path(),
            nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
        )
        .map_err(|e| fork_err(format!("mkfifo {}: {e}", p.display())))?;
        fifos.0.push(p.clone());
    }
    // Opened before the request, so the zygote's non-blocking open of the
    // writing ends finds a reader.
    let stdout = pipe::OpenOptions::new()
        .open_receiver(&out_path)
        .map_err(|e| fork_err(format!("{}: {e}", out_path.display())))?;
    let stderr = pipe::OpenOptions::new()
        .open_receiver(&err_path)
        .map_err(|e| fork_err(format!("{}: {e}", err_path.display())))?;
    let safe_path = cmd.safe_path || env.get("PYTHONSAFEPATH").is_some_and(|v| !v.is_empty());
    let rank_env: Vec<BTreeMap<String, String>> = if cmd.ranks > 1 {
        let port = free_port().map_err(|e| fork_err(format!("a free port for rank 0: {e}")))?;
        let run_id = env
            .get(crate::exec::JOB_COOKIE_ENV)
            .cloned()
            .unwrap_or_else(|| format!("fvd-{n}"));
        (0..cmd.ranks)
            .map(|r| rank_env(r, cmd.ranks, port, &run_id, env))
            .collect()
    } else {
        Vec::new()
    };
    let req = serde_json::json!({
        "args": cmd.args,
        "no_bytecode": cmd.no_bytecode,
        "env": env,
        "cwd": cwd,
        "stdout": out_path,
        "stderr": err_path,
        "safe_path": safe_path,
        "ranks": cmd.ranks,
        "rank_env": rank_env,
        "write_beneath": warm.write_beneath,
    });
    let mut line = req.to_string();
    line.push('\n');
    let talk = async {
        let mut stream = UnixStream::connect(&z.socket)
            .await
            .map_err(|e| format!("connect {}: {e}", z.socket.display()))?;
        stream
            .write_all(line.as_bytes())
            .await
            .map_err(|e| format!("send: {e}"))?;
        let mut lines = BufReader::new(stream).lines();
        let answer = lines
            .next_line()
            .await
            .map_err(|e| format!("read: {e}"))?
            .ok_or("closed without an answer")?;
        let v: serde_json::Value =
            serde_json::from_str(&answer).map_err(|e| format!("answer {answer:?}: {e}"))?;
        match v.get("pid").and_then(serde_json::Value::as_u64) {
            Some(pid) => Ok((pid as u32, lines)),
            None => Err(format!(
                "refused: {}",
                v.get("error").and_then(|e| e.as_str()).unwrap_or("no pid")
            )),
        }
    };
    let (pid, mut lines) = tokio::time::timeout(FORK_TIMEOUT, talk)
        .await
        .map_err(|_| fork_err(format!("no answer in {} s", FORK_TIMEOUT.as_secs())))?
        .map_err(fork_err)?;
    drop(fifos);
    let (tx, rx) = oneshot::channel();
    fvd_telemetry::spawn(async move {
        let got = match lines.next_line().await {
            Ok(Some(l)) => serde_json::from_str::<serde_json::Value>(&l)
                .ok()
                .and_then(|v| v.get("status").and_then(serde_json::Value::as_i64))
                .map(|s| ExitStatus::from_raw(s as i32))
                .ok_or_else(|| format!("unreadable answer {l:?}")),
            Ok(None) => Err("closed without the exit status".to_string()),
            Err(e) => Err(e.to_string()),
        };
        let _ = tx.send(got);
    });
    Ok(Forked {
        pid,
        stdout: Some(stdout),
        stderr: Some(stderr),
        status: None,
        rx,
    })
}

/// Named pipes removed once both ends are open (or the request failed).
struct Fifos(Vec<PathBuf>);

impl Drop for Fifos {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_python_m_pytest_is_warm() {
        let e = env(&[("PATH", "/usr/bin:/bin")]);
        let cwd = Path::new("/");
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            pytest_command(&argv(&["torchrun", "-m", "pytest"]), &e, cwd),
            Err(WarmError::NotSingleNode("without --nproc_per_node".into()))
        );
        assert_eq!(
            pytest_command(&argv(&["python3", "-X", "dev", "-m", "pytest"]), &e, cwd),
            Err(WarmError::NotPytest)
        );
        let c = pytest_command(
            &argv(&["/x/python3.11", "-m", "pytest", "t.py", "-q"]),
            &e,
            cwd,
        )
        .unwrap();
        assert_eq!(c.interp, PathBuf::from("/x/python3.11"));
        assert_eq!(c.args, vec!["t.py", "-q"]);
        assert!(!c.no_bytecode && !c.safe_path);
        let c = pytest_command(
            &argv(&["/x/python3", "-B", "-uP", "-m", "pytest", "t.py"]),
            &e,
            cwd,
        )
        .unwrap();
        assert_eq!(c.args, vec!["t.py"]);
        assert!(c.no_bytecode && c.safe_path);
        assert_eq!(
            pytest_command(&argv(&["/x/python3", "-O", "-m", "pytest"]), &e, cwd),
            Err(WarmError::NotPytest)
        );
    }

    #[test]
    fn a_single_node_torchrun_of_pytest_is_warm_with_its_ranks() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let python = bin.join("python3.12");
        std::fs::write(&python, "").unwrap();
        std::fs::write(
            bin.join("torchrun"),
            format!("#!{}\nimport sys\n", python.display()),
        )
        .unwrap();
        let e = env(&[("PATH", &bin.display().to_string())]);
        let cwd = dir.path();
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for args in [
            &["--standalone", "--nproc_per_node=2"][..],
            &["--nproc-per-node", "2", "--nnodes=1"],
            &[
                "--nnodes",
                "1:1",
                "--node_rank=0",
                "--max-restarts=0",
                "--nproc_per_node=2",
            ],
        ] {
            let mut a = vec!["torchrun"];
            a.extend(args);
            a.extend(["-m", "pytest", "t.py", "--junitxml=j.xml"]);
            let c = pytest_command(&argv(&a), &e, cwd).unwrap();
            assert_eq!(
                (c.ranks, c.interp.as_path()),
                (2, python.as_path()),
                "{a:?}"
            );
            assert_eq!(c.args, ["t.py", "--junitxml=j.xml"]);
        }
        // Several nodes, a rendezvous, restarts, a script: cold.
        for (args, why) in [
            (&["--nnodes=2", "--nproc_per_node=2"][..], "--nnodes=2"),
            (
                &["--rdzv_endpoint=h:1", "--nproc_per_node=2"],
                "--rdzv_endpoint=h:1",
            ),
            (&["--nproc_per_node=gpu"], "--nproc_per_node=gpu"),
            (
                &["--max_restarts=3", "--nproc_per_node=2"],
                "--max_restarts=3",
            ),
        ] {
            let mut a = vec!["torchrun"];
            a.extend(args);
            a.extend(["-m", "pytest"]);
            assert_eq!(
                pytest_command(&argv(&a), &e, cwd),
                Err(WarmError::NotSingleNode(why.into())),
                "{a:?}"
            );
        }
        let script = argv(&["torchrun", "--nproc_per_node=2", "train.py"]);
        assert_eq!(
            pytest_command(&script, &e, cwd),
            Err(WarmError::NotSingleNode("train.py".into()))
        );
        let other = argv(&["torchrun", "--nproc_per_node=2", "-m", "unittest"]);
        assert_eq!(pytest_command(&other, &e, cwd), Err(WarmError::NotPytest));
        // A torchrun that is a shell script names no interpreter: cold.
        std::fs::write(
            bin.join("torchrun"),
            "#!/bin/sh\nexec python3 -m torch.distributed.run \"$@\"\n",
        )
        .unwrap();
        let ok = argv(&["torchrun", "--nproc_per_node=2", "-m", "pytest"]);
        assert!(matches!(
            pytest_command(&ok, &e, cwd),
            Err(WarmError::NoInterpreter(_))
        ));
        // `#!/usr/bin/env python3.12` is looked up on the job's PATH.
        std::fs::write(bin.join("torchrun"), "#!/usr/bin/env python3.12\n").unwrap();
        assert_eq!(pytest_command(&ok, &e, cwd).unwrap().interp, python);
    }

    #[test]
    fn each_rank_gets_torchrun_s_variables() {
        let job = env(&[]);
        let r1 = rank_env(1, 2, 4242, "run", &job);
        for (k, v) in [
            ("RANK", "1"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("GROUP_RANK", "0"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "4242"),
            ("TORCHELASTIC_RUN_ID", "run"),
            ("OMP_NUM_THREADS", "1"),
        ] {
            assert_eq!(r1.get(k).map(String::as_str), Some(v), "{k}");
        }
        let threads = env(&[("OMP_NUM_THREADS", "8")]);
        assert!(!rank_env(0, 2, 1, "r", &threads).contains_key("OMP_NUM_THREADS"));
        assert!(free_port().unwrap() > 0);
    }

    #[test]
    fn the_key_is_import_time_variables_without_secrets_or_job_paths() {
        let e = env(&[
            ("PYTHONPATH", "/scratch/job1:/repo"),
            ("CUDA_VISIBLE_DEVICES", "0"),
            ("TRACEPARENT", "00-abc"),
            ("FASTVIDEO_TRACE_LAYERS", "x"),
            ("HF_TOKEN", "hf_secret"),
            ("HF_HOME", "/hf"),
            ("TORCH_HOME", "/t"),
        ]);
        let z = zygote_env(&e, &["HF_TOKEN".into()], &[PathBuf::from("/scratch/job1")]);
        assert_eq!(
            z,
            env(&[
                ("HF_HOME", "/hf"),
                ("PYTHONPATH", "/repo"),
                ("PYTHONUNBUFFERED", "1"),
                ("TORCH_HOME", "/t"),
            ])
        );
        // A thread count the worker chose is no key (the child applies
        // it); one the spec or the worker's environment sets is.
        let chosen = env(&[("OMP_NUM_THREADS", "4"), ("FVD_RUN_THREADS", "4")]);
        assert!(!zygote_env(&chosen, &[], &[]).contains_key("OMP_NUM_THREADS"));
        let spec = env(&[("OMP_NUM_THREADS", "2"), ("FVD_RUN_THREADS", "4")]);
        assert_eq!(
            zygote_env(&spec, &[], &[])
                .get("OMP_NUM_THREADS")
                .map(String::as_str),
            Some("2")
        );
        assert_eq!(
            zygote_env(&env(&[("OMP_NUM_THREADS", "2")]), &[], &[])
                .get("OMP_NUM_THREADS")
                .map(String::as_str),
            Some("2")
        );
    }
}
