//! What embedded mode keeps in `REPO/.fvd/` besides the database: the
//! folder itself (with a `.gitignore`, so it never shows in `git status`),
//! and one run file per port a live `fvd submit` or `fvd answer` process is
//! running, so that `fvd cancel F` and `fvd reset F` reach or respect that
//! process without an `--orchestrator` flag.
//!
//! A run file (`.fvd/run/<family>.json`) holds the process id and the
//! loopback URL of its orchestrator; the bearer token of that orchestrator
//! sits beside it in `<family>.token`, readable by its owner only. Both are
//! removed when the process ends; a file whose process is gone (killed, or
//! its terminal lost) is stale and ignored.

use std::path::{Path, PathBuf};

use anyhow::Context;
use fvd_proto::auth::{Token, TokenSource};

/// Creates `REPO/.fvd/` (and its `.gitignore`, `*`) when it is missing, and
/// returns its path.
pub fn state_dir(repo: &Path) -> anyhow::Result<PathBuf> {
    let dir = repo.join(".fvd");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let ignore = dir.join(".gitignore");
    if !ignore.exists() {
        std::fs::write(&ignore, "# fvd's state: never commit it\n*\n")
            .with_context(|| format!("cannot write {}", ignore.display()))?;
    }
    Ok(dir)
}

/// A live process running a port of this repository.
#[derive(Debug)]
pub struct Live {
    pub pid: u32,
    pub url: String,
    pub token: Token,
}

fn run_dir(repo: &Path) -> PathBuf {
    repo.join(".fvd").join("run")
}

/// The live process running `family` in `repo`, if there is one.
pub fn live(repo: &Path, family: &str) -> Option<Live> {
    let dir = run_dir(repo);
    let text = std::fs::read_to_string(dir.join(format!("{family}.json"))).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let pid = u32::try_from(v.get("pid")?.as_u64()?).ok()?;
    if pid == std::process::id() || !alive(pid) {
        return None;
    }
    let url = v.get("url")?.as_str()?.to_string();
    let token = Token::load(&TokenSource::File(dir.join(format!("{family}.token")))).ok()?;
    Some(Live { pid, url, token })
}

/// Whether `pid` is a running fvd process (a reused pid of another
/// program does not count).
fn alive(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
        c.split(|b| *b == 0)
            .next()
            .is_some_and(|argv0| argv0.ends_with(b"fvd"))
    })
}

/// This process's run file for a port; removed on drop.
#[derive(Debug)]
pub struct RunFile {
    json: PathBuf,
    token: PathBuf,
}

impl RunFile {
    pub fn write(repo: &Path, family: &str, url: &str, token: &Token) -> anyhow::Result<Self> {
        let dir = run_dir(repo);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let json = dir.join(format!("{family}.json"));
        let token_path = dir.join(format!("{family}.token"));
        token
            .write_private(&token_path)
            .with_context(|| format!("cannot write {}", token_path.display()))?;
        let v = serde_json::json!({ "pid": std::process::id(), "url": url });
        std::fs::write(&json, v.to_string())
            .with_context(|| format!("cannot write {}", json.display()))?;
        Ok(Self {
            json,
            token: token_path,
        })
    }
}

impl Drop for RunFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.json);
        let _ = std::fs::remove_file(&self.token);
    }
}

/// Resolves when this process is asked to stop: Ctrl-C, SIGTERM, or its
/// terminal going away (SIGHUP).
pub async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        let _ = tokio::signal::ctrl_c().await;
        return "interrupt";
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "interrupt",
        _ = term.recv() => "SIGTERM",
        _ = hup.recv() => "SIGHUP (the terminal went away)",
    }
}
