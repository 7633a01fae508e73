//! Shared helpers for the end-to-end tests: locating the built binary and
//! the project's own test inputs in `tests/fixtures`.

use std::path::PathBuf;
use std::process::Command;

/// The `fvd` binary cargo built for this test run.
pub fn fvd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fvd"))
}

/// The repository's `tests/fixtures` (see its README): inputs the project
/// owns, so the tests need nothing beside the checkout.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// fvd's own debug logs, without the chatter of the libraries below it.
pub const LOG_FILTER: &str =
    "debug,sqlx=warn,h2=warn,hyper=warn,hyper_util=warn,tonic=warn,tower=warn";

/// Polls `f` until it returns `Some`, or panics naming `what` after `limit`.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One component of a generated port: its name and the body of its parity
/// test (Python, after `import os, time, pytest`).
#[derive(Debug, Clone)]
pub struct TestComponent {
    pub name: String,
    pub body: String,
}

impl TestComponent {
    pub fn new(name: &str, body: &str) -> Self {
        Self {
            name: name.into(),
            body: body.into(),
        }
    }
}

/// A throw-away port repository plus the processes of a fleet (an
/// orchestrator and workers, each a real `fvd` process on loopback), killed
/// when the sandbox is dropped.
#[derive(Debug)]
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    /// The port's repository: `dir` itself, or a folder below it
    /// ([`Sandbox::with_repo_in`]).
    repo: PathBuf,
    children: Vec<Child>,
    /// Worker id → index in `children`.
    workers: Vec<(String, usize)>,
    /// Index of the running orchestrator in `children`.
    orchestrator: Option<usize>,
    pub url: Option<String>,
    /// Named credentials (`--auth`): when set, the orchestrator checks
    /// them, workers dial with the `worker` token, submits and cancels use
    /// the `porter`'s and reads the `viewer`'s.
    pub auth: Option<Auth>,
    /// `FVD_LOG` of the orchestrator and workers; `None` leaves them at
    /// their default level ([`Sandbox::with_default_logs`]).
    log_filter: Option<&'static str>,
    /// Extra arguments of every orchestrator and worker (`--log-format
    /// json`, say), before their own.
    server_args: Vec<String>,
}

/// A credentials file of four roles made with `fvd auth add`, each token
/// in a file of its own: the sandbox's fleet in `--auth` mode.
/// The files live in a folder of their own, outside every repository (a
/// token must never be snapshotted into a port's commit).
#[derive(Debug, Clone)]
pub struct Auth {
    pub file: PathBuf,
    dir: PathBuf,
    _keep: std::sync::Arc<tempfile::TempDir>,
}

impl Auth {
    /// `auth.toml` with `fleet` (worker), `porter` (porter), `viewer`
    /// (viewer) and `root` (admin).
    pub fn new() -> Self {
        let keep = tempfile::tempdir().expect("tempdir for credentials");
        let dir = keep.path().to_path_buf();
        let a = Auth {
            file: dir.join("auth.toml"),
            dir,
            _keep: std::sync::Arc::new(keep),
        };
        for (name, role) in [
            ("fleet", "worker"),
            ("porter", "porter"),
            ("viewer", "viewer"),
            ("root", "admin"),
        ] {
            a.add(name, role);
        }
        a
    }

    /// Adds a credential with `fvd auth add --out` (a token file of mode
    /// 0600, as docs/fleet.md says) and returns its token file.
    pub fn add(&self, name: &str, role: &str) -> PathBuf {
        let path = self.token(name);
        let out = fvd()
            .args(["auth", "add", name, "--role", role, "--file"])
            .arg(&self.file)
            .arg("--out")
            .arg(&path)
            .output()
            .expect("run fvd auth add");
        assert!(
            out.status.success() && out.stdout.is_empty(),
            "fvd auth add {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        path
    }

    /// The token file of credential `name`.
    pub fn token(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.token"))
    }

    /// `--token-file PATH` of credential `name`, as arguments.
    pub fn args(&self, name: &str) -> Vec<String> {
        vec![
            "--token-file".into(),
            self.token(name).display().to_string(),
        ]
    }

    /// Every token's value, for tests that look for them in logs.
    pub fn tokens(&self) -> Vec<String> {
        ["fleet", "porter", "viewer", "root"]
            .iter()
            .filter_map(|n| std::fs::read_to_string(self.token(n)).ok())
            .map(|t| t.trim().to_string())
            .collect()
    }
}

impl Sandbox {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        Self {
            repo: dir.path().to_path_buf(),
            dir,
            children: Vec::new(),
            workers: Vec::new(),
            orchestrator: None,
            url: None,
            auth: None,
            log_filter: Some(LOG_FILTER),
            server_args: Vec::new(),
        }
    }

    /// The orchestrator and workers log at their default level (no
    /// `FVD_LOG`), with `args` (a log format, say) before their own.
    pub fn with_default_logs(mut self, args: &[&str]) -> Self {
        self.log_filter = None;
        self.server_args = args.iter().map(|a| a.to_string()).collect();
        self
    }

    /// What worker `id` logged so far.
    pub fn worker_log(&self, id: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("worker-{id}.log")))
            .unwrap_or_default()
    }

    /// This sandbox's fleet checks named credentials (`--auth`): see
    /// [`Sandbox::auth`].
    pub fn with_auth(mut self) -> Self {
        self.auth = Some(Auth::new());
        self
    }

    /// `--token-file` of credential `name` when the sandbox has
    /// credentials; nothing otherwise.
    pub fn token_args(&self, name: &str) -> Vec<String> {
        self.auth.as_ref().map(|a| a.args(name)).unwrap_or_default()
    }

    /// The pid of the running orchestrator.
    pub fn orchestrator_pid(&self) -> u32 {
        let i = self.orchestrator.expect("an orchestrator runs");
        self.children[i].id()
    }

    /// A sandbox whose repository is the folder `rel` below its own, so
    /// that logs, the orchestrator's database and workers' workspaces stay
    /// outside it (a worker may be kept from seeing the repository).
    pub fn with_repo_in(rel: &str) -> Self {
        let mut sb = Self::new();
        sb.repo = sb.dir.path().join(rel);
        std::fs::create_dir_all(&sb.repo).expect("repository folder");
        sb
    }

    pub fn repo(&self) -> &Path {
        &self.repo
    }

    /// Writes `tests/local_tests/<family>/port.toml` and one parity test per
    /// component, with a complete prep handoff.
    pub fn port(&self, family: &str, components: &[TestComponent]) -> &Self {
        write_port(self.repo(), family, components);
        self
    }

    /// Starts `fvd orchestrator serve` on a free loopback port.
    pub fn serve(&mut self) -> String {
        self.serve_with(&[])
    }

    /// Logs of the sandbox's processes go to files beside the repo, at
    /// debug level, so tests can search them (for secrets, say).
    fn log_file(&self, name: &str) -> std::fs::File {
        std::fs::File::create(self.dir.path().join(format!("{name}.log"))).expect("log file")
    }

    /// A log file that a restarted process continues: what the process
    /// before it logged stays there for the test to read.
    fn log_file_appended(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{name}.log")))
            .expect("log file")
    }

    /// What the orchestrator (every incarnation of it) logged so far.
    pub fn orchestrator_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("orchestrator.log")).unwrap_or_default()
    }

    /// Everything the sandbox's processes logged so far.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        for e in std::fs::read_dir(self.dir.path()).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "log") {
                all.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
            }
        }
        all
    }

    /// `serve()` with extra arguments (a token, say).
    pub fn serve_with(&mut self, extra: &[&str]) -> String {
        self.serve_at("127.0.0.1:0", extra)
    }

    /// Starts (or restarts, on the same database) the orchestrator on `addr`.
    pub fn serve_at(&mut self, addr: &str, extra: &[&str]) -> String {
        let db = self.dir.path().join("orchestrator.db");
        self.serve_db(addr, &db, extra, &[])
    }

    /// Starts the orchestrator on `addr` with its database at `db` and
    /// `env` added to its environment.
    pub fn serve_db(
        &mut self,
        addr: &str,
        db: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> String {
        let auth: Vec<String> = match &self.auth {
            Some(a) => vec!["--auth".into(), a.file.display().to_string()],
            None => Vec::new(),
        };
        let mut cmd = fvd();
        cmd.args(&self.server_args)
            .args(["orchestrator", "serve", "--listen", addr, "--db"])
            .arg(format!("sqlite://{}", db.display()))
            .args(auth)
            .args(extra)
            .envs(env.iter().copied());
        self.log_env(&mut cmd);
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(self.log_file_appended("orchestrator"))
            .spawn()
            .expect("spawn orchestrator");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("orchestrator prints its address");
        let url = line
            .trim()
            .rsplit(' ')
            .next()
            .expect("address on the first line")
            .to_string();
        assert!(
            url.starts_with("http://127.0.0.1:") || url.starts_with("https://127.0.0.1:"),
            "unexpected first line {line:?}; log:\n{}",
            self.logs()
        );
        self.orchestrator = Some(self.children.len());
        self.children.push(child);
        self.url = Some(url.clone());
        url
    }

    /// `FVD_LOG` as this sandbox sets it (or not at all).
    fn log_env(&self, cmd: &mut Command) {
        match self.log_filter {
            Some(filter) => cmd.env("FVD_LOG", filter),
            None => cmd.env_remove("FVD_LOG"),
        };
    }

    /// SIGKILLs the orchestrator process.
    pub fn kill_orchestrator(&mut self) {
        let i = self.orchestrator.take().expect("an orchestrator runs");
        self.children[i].kill().expect("kill orchestrator");
        self.children[i].wait().expect("reap orchestrator");
    }

    /// Starts `fvd worker` with `slots` CPU slots and no GPU.
    pub fn worker(&mut self, id: &str, slots: u32) {
        let child = self
            .worker_with(id, slots, &[])
            .spawn()
            .expect("spawn worker");
        self.workers.push((id.to_string(), self.children.len()));
        self.children.push(child);
    }

    /// The command of a worker, for a test that runs it itself.
    pub fn worker_with(&self, id: &str, slots: u32, extra: &[&str]) -> Command {
        let url = self.url.clone().expect("serve() first");
        self.worker_at(&url, id, slots, extra)
    }

    /// Starts `fvd worker` with `slots` CPU slots and its workspace at
    /// `workspace` (one outside `/tmp`, say).
    pub fn worker_in(&mut self, id: &str, slots: u32, workspace: &Path) {
        let url = self.url.clone().expect("serve() first");
        let child = self
            .worker_cmd(&url, id, slots, &[], workspace)
            .spawn()
            .expect("spawn worker");
        self.workers.push((id.to_string(), self.children.len()));
        self.children.push(child);
    }

    /// A worker command that dials `url` (a proxy, say) instead.
    pub fn worker_at(&self, url: &str, id: &str, slots: u32, extra: &[&str]) -> Command {
        let workspace = self.dir.path().join(format!("ws-{id}"));
        self.worker_cmd(url, id, slots, extra, &workspace)
    }

    /// Starts `fvd worker` offering every GPU that the `nvidia-smi` in
    /// `bin` (put first on its `PATH`: a fake one, say) lists.
    pub fn gpu_worker(&mut self, id: &str, slots: u32, bin: &Path) {
        self.gpu_worker_with(id, slots, bin, &[]);
    }

    /// [`Sandbox::gpu_worker`] with `extra` arguments.
    pub fn gpu_worker_with(&mut self, id: &str, slots: u32, bin: &Path, extra: &[&str]) {
        let url = self.url.clone().expect("serve() first");
        let workspace = self.dir.path().join(format!("ws-{id}"));
        let path = std::env::var("PATH").unwrap_or_default();
        let mut cmd = self.worker_cmd_gpus(&url, id, slots, extra, &workspace, "all");
        cmd.env("PATH", format!("{}:{path}", bin.display()));
        self.spawn_worker(id, cmd);
    }

    fn worker_cmd(
        &self,
        url: &str,
        id: &str,
        slots: u32,
        extra: &[&str],
        workspace: &Path,
    ) -> Command {
        self.worker_cmd_gpus(url, id, slots, extra, workspace, "none")
    }

    fn worker_cmd_gpus(
        &self,
        url: &str,
        id: &str,
        slots: u32,
        extra: &[&str],
        workspace: &Path,
        gpus: &str,
    ) -> Command {
        let mut cmd = fvd();
        cmd.args(&self.server_args)
            .args([
                "worker",
                "--orchestrator",
                url,
                "--gpus",
                gpus,
                "--worker-id",
                id,
            ])
            .args(["--cpu-slots", &slots.to_string(), "--workspace"])
            .arg(workspace)
            .args(self.token_args("fleet"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(self.log_file(&format!("worker-{id}")));
        self.log_env(&mut cmd);
        cmd
    }

    /// Starts a prepared worker command and keeps it for cleanup.
    pub fn spawn_worker(&mut self, id: &str, mut cmd: Command) {
        let child = cmd.spawn().expect("spawn worker");
        self.workers.push((id.to_string(), self.children.len()));
        self.children.push(child);
    }

    /// Waits (bounded) for the worker process `id` to exit by itself.
    pub fn wait_worker_exit(&mut self, id: &str, limit: Duration) -> std::process::ExitStatus {
        let i = self
            .workers
            .iter()
            .rev()
            .find(|(w, _)| w == id)
            .map(|(_, i)| *i)
            .expect("known worker");
        let child = &mut self.children[i];
        wait_for(&format!("worker {id} to exit"), limit, || {
            child.try_wait().unwrap()
        })
    }

    /// The process id of the worker process `id`.
    pub fn worker_pid(&self, id: &str) -> u32 {
        let i = self
            .workers
            .iter()
            .rev()
            .find(|(w, _)| w == id)
            .map(|(_, i)| *i)
            .expect("known worker");
        self.children[i].id()
    }

    /// SIGKILLs the worker process `id` (the latest one started under it).
    pub fn kill_worker(&mut self, id: &str) {
        let i = self
            .workers
            .iter()
            .rev()
            .find(|(w, _)| w == id)
            .map(|(_, i)| *i)
            .expect("known worker");
        self.children[i].kill().expect("kill worker");
        self.children[i].wait().expect("reap worker");
    }

    /// `fvd submit --family FAMILY` of the sandbox's repo to the sandbox's
    /// orchestrator, with `extra` flags (`--wait`, a token, a CA).
    pub fn submit_remote(&self, family: &str, extra: &[&str]) -> std::process::Output {
        let url = self.url.as_deref().expect("serve() first");
        fvd()
            .args(["submit", "--family", family, "--orchestrator", url])
            .args(self.token_args("porter"))
            .args(extra)
            .arg("--repo")
            .arg(self.repo())
            .output()
            .expect("run fvd submit")
    }

    /// `fvd status FAMILY --json` against the sandbox's orchestrator.
    pub fn remote_status(&self, family: &str) -> Option<serde_json::Value> {
        let url = self.url.as_deref()?;
        let out = fvd()
            .args(["status", family, "--json", "--orchestrator", url])
            .args(self.token_args("viewer"))
            .output()
            .expect("run fvd status");
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// `fvd status FAMILY --json` against the embedded state of the repo.
    pub fn local_status(&self, family: &str) -> Option<serde_json::Value> {
        let out = fvd()
            .args(["status", family, "--json", "--repo"])
            .arg(self.repo())
            .output()
            .expect("run fvd status");
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }
}

/// Writes `tests/local_tests/<family>/port.toml` under `root` and one
/// parity test per component, with a complete prep handoff.
pub fn write_port(root: &Path, family: &str, components: &[TestComponent]) {
    let mut spec = format!(
        r#"[prep]
model_family = "{family}"
workload_types = "T2V"
official_ref = "official.{family}"
official_ref_dir = "official"
official_ref_commit = "unknown"
hf_weights_path = "none"
hf_revision = "default"
local_weights_dir = "official_weights/{family}"
source_layout = "custom"
model_index_class = "none"
components_seen = "{names}"
needs_conversion = "no"
hf_token_env = "HF_TOKEN"
dependency_changes = "none"
official_env_status = "imports_ok"
local_tests_readme = "tests/local_tests/{family}/README.md"
port_state_file = "tests/local_tests/{family}/PORT_STATUS.md"
gitignore_entries_added = "none"
next_step = "add-model"
open_questions = "none"
escape_hatch = "none"

[defaults]
timeout_s = 60
"#,
        names = components
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let tests = root.join("tests/local_tests/generic");
    std::fs::create_dir_all(&tests).unwrap();
    std::fs::create_dir_all(root.join(format!("tests/local_tests/{family}"))).unwrap();
    for c in components {
        let rel = format!(
            "tests/local_tests/generic/test_{family}_{}_parity.py",
            c.name
        );
        spec.push_str(&format!(
            "\n[[component]]\nname = \"{}\"\ntype = \"generic\"\nparity_test = \"{rel}\"\ncoverage_scope = \"implementation_subcomponent\"\n",
            c.name
        ));
        let body: String = c.body.lines().map(|l| format!("    {l}\n")).collect();
        std::fs::write(
            root.join(&rel),
            format!("import os, time, pytest\n\n\ndef test_parity():\n{body}"),
        )
        .unwrap();
    }
    std::fs::write(
        root.join(format!("tests/local_tests/{family}/port.toml")),
        spec,
    )
    .unwrap();
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Workers first, so none logs a lost orchestrator on the way out.
        for c in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The `components` of a status JSON as `(name, status, runs, worker_id)`.
pub fn components(status: &serde_json::Value) -> Vec<(String, String, u64, String)> {
    status["components"]
        .as_array()
        .expect("components array")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_string(),
                c["status"].as_str().unwrap_or_default().to_string(),
                c["runs"].as_u64().unwrap_or_default(),
                c["worker_id"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// A TCP proxy on loopback that a test can stall: while paused it moves no
/// byte in either direction but keeps every connection open, the way a
/// network partition looks to both ends (no reset, just silence).
#[derive(Debug)]
pub struct Proxy {
    pub addr: std::net::SocketAddr,
    paused: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    /// Forwards every connection to `upstream` (`HOST:PORT`).
    pub fn start(upstream: &str) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let paused = Arc::new(AtomicBool::new(false));
        let upstream = upstream.to_string();
        let p = paused.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = std::net::TcpStream::connect(&upstream) else {
                    continue;
                };
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let p = p.clone();
                    std::thread::spawn(move || pump(from, to, &p));
                }
            }
        });
        Self { addr, paused }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn pause(&self, on: bool) {
        self.paused.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

fn pump(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    paused: &std::sync::atomic::AtomicBool,
) {
    use std::io::{Read, Write};
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
    let mut buf = [0u8; 16 * 1024];
    loop {
        if paused.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(std::net::Shutdown::Write);
                return;
            }
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

/// A real, small file system (a tmpfs of `mib` MiB) at a fresh folder,
/// unmounted when dropped: a disk that fills up for real, not a simulated
/// error. Needs root (the tests run as root here and in CI): it fails,
/// never skips, without.
#[derive(Debug)]
pub struct SmallDisk {
    pub dir: tempfile::TempDir,
}

impl SmallDisk {
    pub fn mount(mib: u32) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "fvd-test"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "a full-disk test mounts a tmpfs and needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self { dir }
    }

    /// Fills the disk with one file until the next block is refused.
    pub fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.dir.path().join("filler");
        let mut f = std::fs::File::create(&path).expect("filler");
        let block = vec![0x5a_u8; 64 * 1024];
        while f.write_all(&block).is_ok() {}
        while f.write_all(&[0x5a]).is_ok() {}
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}
