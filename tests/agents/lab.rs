//! The lab the real-CLI tests run in: a network namespace with only
//! loopback, the scripted model server (`model_server.py`) holding a fresh
//! key, and a copy of `examples/tinyport` whose one component,
//! `timestep_embed`, has the preset under test as its agent.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The programs the tests run: `FVD_AGENT_CLI_DIR`, else the cache folder
/// `scripts/agent-clis.sh` installs into.
pub fn cli_dir() -> PathBuf {
    let dir = std::env::var_os("FVD_AGENT_CLI_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/agents-cli/bin"));
    assert!(
        dir.is_dir(),
        "no coding-agent CLIs at {} (bash scripts/agent-clis.sh installs them)",
        dir.display()
    );
    dir
}

/// Runs the calling test again inside `unshare -n` (a network namespace
/// with nothing but loopback) and asserts that it passed there; returns
/// true when the caller is that inner run and must do the work.
pub fn isolated(name: &str) -> bool {
    if std::env::var_os("FVD_AGENTS_NETNS").is_some() {
        // Nothing beyond loopback can be reached from here.
        let out = std::net::TcpStream::connect_timeout(
            &"1.1.1.1:443".parse().unwrap(),
            Duration::from_secs(2),
        );
        assert!(out.is_err(), "the test's namespace reaches the internet");
        return true;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args(["-n", "--"])
        .arg(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("FVD_AGENTS_NETNS", "1")
        .output()
        .expect("unshare runs (util-linux; root or user namespaces)");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{name} inside unshare -n:\n{text}"
    );
    for line in text.lines().filter(|l| l.starts_with("timing: ")) {
        eprintln!("{line}");
    }
    false
}

/// A preset under test: its spec lines and the variables it is pointed by.
#[derive(Debug, Clone, Copy)]
pub struct Cli {
    pub preset: &'static str,
    pub model: &'static str,
    pub key_env: &'static str,
    pub base_env: &'static str,
    /// The upstream's base path (`/v1` for OpenAI's APIs).
    pub base_path: &'static str,
}

pub const CLAUDE: Cli = Cli {
    preset: "claude-code",
    model: "claude-sonnet-4-5",
    key_env: "ANTHROPIC_API_KEY",
    base_env: "ANTHROPIC_BASE_URL",
    base_path: "",
};
pub const CODEX: Cli = Cli {
    preset: "codex",
    model: "gpt-5-codex",
    key_env: "OPENAI_API_KEY",
    base_env: "OPENAI_BASE_URL",
    base_path: "/v1",
};
pub const OPENCODE: Cli = Cli {
    preset: "opencode",
    model: "openai/gpt-5",
    key_env: "OPENAI_API_KEY",
    base_env: "OPENAI_BASE_URL",
    base_path: "/v1",
};

#[cfg(feature = "agents-gemini")]
pub const GEMINI: Cli = Cli {
    preset: "gemini",
    model: "gemini-2.5-pro",
    key_env: "GEMINI_API_KEY",
    base_env: "GOOGLE_GEMINI_BASE_URL",
    base_path: "",
};

/// What every scripted reply costs: 1000 input, 50 output, 200 read from
/// the cache (and 10 written to it, which only Anthropic's usage carries).
pub const USAGE: (u64, u64, u64, u64) = (1000, 50, 200, 10);

/// USD of one reply at the default prices of the presets' models
/// (claude-sonnet-4-5, gpt-5, gemini-2.5-pro).
pub fn reply_usd(cli: Cli) -> f64 {
    let (i, o, cr, cw) = USAGE;
    let (pi, po, pcr, pcw, cw) = match cli.preset {
        "claude-code" => (3.0, 15.0, 0.3, 3.75, cw),
        "gemini" => (1.25, 10.0, 0.31, 0.0, 0),
        _ => (1.25, 10.0, 0.125, 0.0, 0),
    };
    (i as f64 * pi + o as f64 * po + cr as f64 * pcr + cw as f64 * pcw) / 1e6
}

#[derive(Debug)]
pub struct Lab {
    pub dir: tempfile::TempDir,
    pub repo: PathBuf,
    pub cli: Cli,
    pub key: String,
    server: Child,
    pub port: u16,
    log: PathBuf,
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// The fix of the planted bug: the official layout is cosines first.
pub const OLD: &str = "[np.sin(args), np.cos(args)]";
pub const NEW: &str = "[np.cos(args), np.sin(args)]";
pub const TEST: &str = "tests/local_tests/generic/test_tinyport_timestep_embed_parity.py";

/// The recorded handoff of the fix (a valid `component_skill_handoff`).
pub fn handoff() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/tinyport/tools/replay/timestep_embed/0002.handoff"),
    )
    .unwrap()
}

/// A script for the model server: its steps, for the packet of
/// `timestep_embed`, with `{workdir}` captured from the packet.
pub fn script(steps: Value) -> Value {
    let (i, o, cr, cw) = USAGE;
    json!({"scripts": [{
        "name": "timestep_embed",
        "marker": "fvd parity-debug: tinyport / timestep_embed",
        "usage": {"input": i, "output": o, "cache_read": cr, "cache_write": cw},
        "captures": {"workdir": "Work in `([^`]+)`"},
        "steps": steps,
    }]})
}

/// A step that writes the agent's environment next to its packet (through
/// python3, which every preset's allowlist lets run).
pub fn dump_env() -> Value {
    json!({"bash": "python3 -c \"import os, json; open(os.environ['FVD_PROMPT_FILE'] + '.env.json', 'w').write(json.dumps(dict(os.environ)))\""})
}

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

pub fn git(repo: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
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
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

fn random_hex(n: usize) -> String {
    use std::io::Read;
    let mut b = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Lab {
    /// The example port with `timestep_embed` alone, `agent` as its
    /// `[agent]` table's extra lines, and the model server running
    /// `script` with a fresh key.
    pub fn new(cli: Cli, agent: &str, script: Value) -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        copy_tree(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tinyport"),
            &repo,
        );
        let spec_path = repo.join("tests/local_tests/tinyport/port.toml");
        let spec = std::fs::read_to_string(&spec_path).unwrap();
        let mut parts = spec.split("\n[[component]]\n");
        let head = parts.next().unwrap().to_string();
        let comp: String = parts
            .find(|c| c.starts_with("name = \"timestep_embed\""))
            .unwrap()
            .lines()
            .take_while(|l| !l.trim().is_empty())
            .collect::<Vec<_>>()
            .join("\n");
        let spec = format!(
            "{head}\n[[component]]\n{comp}\n\n[agent]\npreset = \"{}\"\nmodel = \"{}\"\ntimeout_s = 120\n{agent}\n",
            cli.preset, cli.model
        );
        std::fs::write(&spec_path, spec).unwrap();
        git(&repo, &["init", "-q", "-b", "main"]);
        git(&repo, &["add", "-A"]);
        git(&repo, &["commit", "-q", "-m", "base"]);

        let key = format!("sk-fvdtest-{}", random_hex(20));
        let key_file = dir.path().join("server-key");
        std::fs::write(&key_file, &key).unwrap();
        let script_file = dir.path().join("server-script.json");
        std::fs::write(&script_file, script.to_string()).unwrap();
        let port_file = dir.path().join("server-port");
        let log = dir.path().join("server-log.jsonl");
        let server = Command::new("python3")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/model_server.py"))
            .arg("--lo-up")
            .arg("--script")
            .arg(&script_file)
            .arg("--key-file")
            .arg(&key_file)
            .arg("--port-file")
            .arg(&port_file)
            .arg("--log")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs the model server");
        let deadline = Instant::now() + Duration::from_secs(20);
        let port = loop {
            if let Ok(p) = std::fs::read_to_string(&port_file) {
                break p.trim().parse().unwrap();
            }
            assert!(Instant::now() < deadline, "the model server did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        Lab {
            dir,
            repo,
            cli,
            key,
            server,
            port,
            log,
        }
    }

    /// `fvd submit --wait` with `key` and the server's URL in fvd's
    /// environment: its exit code and its output.
    pub fn submit_with_key(&self, key: &str) -> (Option<i32>, String) {
        self.fvd_with_key(&["submit", "--family", "tinyport", "--wait"], key)
    }

    /// `fvd agents check --json` with `key`.
    pub fn check_with_key(&self, key: &str) -> (Option<i32>, String) {
        self.fvd_with_key(&["agents", "check", "--family", "tinyport", "--json"], key)
    }

    fn fvd_with_key(&self, args: &[&str], key: &str) -> (Option<i32>, String) {
        let path = format!(
            "{}:{}",
            cli_dir().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fvd"));
        cmd.args(args)
            .arg("--repo")
            .arg(&self.repo)
            .env_clear()
            .env("PATH", path)
            .env("HOME", self.dir.path())
            .env(
                "FVD_LOG",
                "debug,sqlx=warn,h2=warn,hyper=warn,tonic=warn,tower=warn",
            )
            .env(self.cli.key_env, key)
            .env(
                self.cli.base_env,
                format!("http://127.0.0.1:{}{}", self.port, self.cli.base_path),
            );
        let out = cmd.output().unwrap();
        let text = format!(
            "stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    }

    /// The port on a fleet (issue #32): `fvd orchestrator serve` with
    /// the key and the server's URL in its environment, and one worker
    /// (`w1`, CPU slots only) that has the agent CLIs and no key; then `fvd
    /// submit --wait` against it. Its exit code and output, and the fleet
    /// (stopped when dropped).
    pub fn submit_on_fleet(&self) -> (Option<i32>, String, Fleet) {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let url = format!("http://127.0.0.1:{port}");
        let db = self.dir.path().join("orchestrator.db");
        let path = format!(
            "{}:{}",
            cli_dir().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let log = |name: &str| std::fs::File::create(self.dir.path().join(name)).unwrap();
        let filter = "debug,sqlx=warn,h2=warn,hyper=warn,tonic=warn,tower=warn";
        let orchestrator = Command::new(env!("CARGO_BIN_EXE_fvd"))
            .args(["orchestrator", "serve", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--db")
            .arg(format!("sqlite://{}", db.display()))
            .env_clear()
            .env("PATH", &path)
            .env("HOME", self.dir.path())
            .env("FVD_LOG", filter)
            .env(self.cli.key_env, &self.key)
            .env(
                self.cli.base_env,
                format!("http://127.0.0.1:{}{}", self.port, self.cli.base_path),
            )
            .stdout(Stdio::null())
            .stderr(log("orchestrator.log"))
            .spawn()
            .unwrap();
        let worker = Command::new(env!("CARGO_BIN_EXE_fvd"))
            .args(["worker", "--orchestrator", &url, "--gpus", "none"])
            .args(["--cpu-slots", "2", "--worker-id", "w1", "--workspace"])
            .arg(self.dir.path().join("ws-w1"))
            .env_clear()
            .env("PATH", &path)
            .env("HOME", self.dir.path())
            .env("FVD_LOG", filter)
            .env("FVD_AGENT_CLI_DIR", cli_dir())
            .stdout(Stdio::null())
            .stderr(log("worker.log"))
            .spawn()
            .unwrap();
        let fleet = Fleet {
            children: vec![orchestrator, worker],
            url: url.clone(),
            db,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the orchestrator did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = Command::new(env!("CARGO_BIN_EXE_fvd"))
            .args([
                "submit",
                "--family",
                "tinyport",
                "--wait",
                "--orchestrator",
                &url,
            ])
            .arg("--repo")
            .arg(&self.repo)
            .env("FVD_LOG", "warn")
            .output()
            .unwrap();
        let text = format!(
            "stdout:\n{}\nstderr:\n{}\norchestrator:\n{}\nworker:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.path().join("orchestrator.log")).unwrap_or_default(),
            std::fs::read_to_string(self.dir.path().join("worker.log")).unwrap_or_default(),
        );
        (out.status.code(), text, fleet)
    }

    pub fn submit(&self) -> (Option<i32>, String) {
        self.submit_with_key(&self.key.clone())
    }

    /// `fvd ARGS --repo` with the key and the server's URL in fvd's
    /// environment (an embedded `answer` runs the port's agents).
    pub fn run(&self, args: &[&str]) -> (Option<i32>, String) {
        self.fvd_with_key(args, &self.key.clone())
    }

    /// `fvd attempts … --json`.
    pub fn ledger(&self) -> Value {
        ledger_from("--repo", self.repo.as_os_str())
    }

    /// `fvd status … --json`.
    pub fn status(&self) -> Value {
        let out = Command::new(env!("CARGO_BIN_EXE_fvd"))
            .args(["status", "tinyport", "--json", "--repo"])
            .arg(&self.repo)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Every request the model server logged.
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The usage the server returned, summed over its scripted replies
    /// (input, output, cache read, cache write).
    pub fn served(&self) -> (u64, u64, u64, u64) {
        let mut t = (0, 0, 0, 0);
        for r in self.requests().iter().filter(|r| r["status"] == 200) {
            let u = &r["usage"];
            t.0 += u["input"].as_u64().unwrap();
            t.1 += u["output"].as_u64().unwrap();
            t.2 += u["cache_read"].as_u64().unwrap();
            t.3 += u["cache_write"].as_u64().unwrap();
        }
        t
    }

    /// The folder of attempt `n`.
    pub fn attempt_dir(&self, n: u32) -> PathBuf {
        self.repo
            .join(format!(".fvd/agent/tinyport/timestep_embed/attempt-{n}"))
    }

    /// Asserts that no byte of the key (as is, base64 or URL-encoded) is
    /// in `texts` or in any file under the lab's repository (the state
    /// database and its log, every agent folder and worktree, the files of
    /// the port): only the server's own key file holds it.
    pub fn assert_key_absent(&self, texts: &[&str]) {
        self.assert_key_absent_in(texts, std::slice::from_ref(&self.repo), "state.db");
    }

    /// [`Lab::assert_key_absent`] over `roots` (folders walked, or files),
    /// among which a file named `expect` must be.
    pub fn assert_key_absent_in(&self, texts: &[&str], roots: &[PathBuf], expect: &str) {
        let forms = [
            self.key.clone(),
            base64(self.key.as_bytes()),
            self.key.replace('-', "%2D"),
        ];
        for t in texts {
            for f in &forms {
                assert!(!t.contains(f.as_str()), "the key is in fvd's output");
            }
        }
        let mut files = Vec::new();
        for root in roots {
            if root.is_file() {
                files.push(root.clone());
            } else {
                walk(root, &mut files);
            }
        }
        assert!(files.iter().any(|f| f.ends_with(expect)), "{files:?}");
        for f in files {
            let bytes = std::fs::read(&f).unwrap_or_default();
            for form in &forms {
                assert!(
                    !contains(&bytes, form.as_bytes()),
                    "the key is in {}",
                    f.display()
                );
            }
        }
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            walk(&e.path(), out);
        } else if t.is_file() {
            out.push(e.path());
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn base64(b: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..(c.len() + 1) {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// The one attempt row of the ledger, asserted to be the only one.
pub fn only_attempt(ledger: &Value) -> Value {
    let a = ledger["attempts"].as_array().unwrap();
    assert_eq!(a.len(), 1, "{ledger:#}");
    a[0].clone()
}

/// An orchestrator and its worker, killed when dropped.
pub struct Fleet {
    children: Vec<Child>,
    pub url: String,
    pub db: PathBuf,
}

impl Fleet {
    /// `fvd attempts … --json` from the orchestrator.
    pub fn ledger(&self) -> Value {
        ledger_from("--orchestrator", self.url.as_ref())
    }

    /// `fvd status tinyport --json` from the orchestrator.
    pub fn status(&self) -> Value {
        let (code, out) = self.fvd(&["status", "tinyport", "--json"], Path::new("."));
        assert_eq!(code, Some(0), "{out}");
        let json = &out[out.find('{').unwrap()..=out.rfind('}').unwrap()];
        serde_json::from_str(json).unwrap()
    }

    /// `fvd ARGS --orchestrator URL --repo REPO` (the repository names
    /// who answers, by its git user): exit code and output.
    pub fn fvd(&self, args: &[&str], repo: &Path) -> (Option<i32>, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_fvd"))
            .args(args)
            .args(["--orchestrator", &self.url])
            .arg("--repo")
            .arg(repo)
            .env("FVD_LOG", "warn")
            .output()
            .unwrap();
        let text = format!(
            "stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    }

    /// Rows of a query on the orchestrator's database.
    pub fn query(&self, sql: &str) -> Vec<Vec<Value>> {
        let out = Command::new("python3")
            .args([
                "-c",
                "import json, sqlite3, sys\nc = sqlite3.connect('file:' + sys.argv[1] + '?mode=ro', uri=True)\nprint(json.dumps(c.execute(sys.argv[2]).fetchall()))",
            ])
            .arg(&self.db)
            .arg(sql)
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_default()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `fvd attempts tinyport timestep_embed --json` from a state (`--repo`)
/// or an orchestrator (`--orchestrator`).
fn ledger_from(flag: &str, value: &std::ffi::OsStr) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_fvd"))
        .args(["attempts", "tinyport", "timestep_embed", "--json", flag])
        .arg(value)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
