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
//! (passed-through variables never reach a zygote). Not keys:
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
}

/// Why a warm start did not happen (the run then goes cold).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WarmError {
    #[error("the command is not `python -m pytest …`")]
    NotPytest,
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
}

/// `argv` taken apart when it is `python… -m pytest …` with at most the
/// flags `-B`, `-u` and `-P` (the ones a forked child can honour).
pub fn pytest_command(
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: &Path,
) -> Result<PytestCommand, WarmError> {
    let Some((prog, rest)) = argv.split_first() else {
        return Err(WarmError::NotPytest);
    };
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
    let interp = if prog.contains('/') {
        cwd.join(prog)
    } else {
        env.get("PATH")
            .map(String::as_str)
            .unwrap_or_default()
            .split(':')
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(d).join(prog))
            .find(|p| p.is_file())
            .ok_or_else(|| WarmError::NoInterpreter(prog.clone()))?
    };
    Ok(PytestCommand {
        interp,
        args: args.to_vec(),
        no_bytecode,
        safe_path,
    })
}

/// The zygote's environment for a job's: its import-time variables, less
/// secrets and the per-job `PYTHONPATH` entries.
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
    let req = serde_json::json!({
        "args": cmd.args,
        "no_bytecode": cmd.no_bytecode,
        "env": env,
        "cwd": cwd,
        "stdout": out_path,
        "stderr": err_path,
        "safe_path": safe_path,
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
            Err(WarmError::NotPytest)
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
    }
}
