//! Code by commit, the worker's side (issue #12): where a job runs.
//!
//! An assignment names the commit it runs. When the worker sees the job's
//! working directory and that work tree is at the commit (its files, as
//! `git add -A` would record them, are the commit's, but for the files fvd
//! itself writes there such as `PORT_STATUS.md`; ignored files such as
//! weights do not count), the job runs there: a shared file system, as
//! before. Otherwise the worker runs it in a checkout of its own:
//!
//! - one bare clone, `WORKSPACE/code/repo.git`, holds every commit fetched
//!   (each kept by a ref `refs/fvd/c/<sha>`); a missing commit is fetched
//!   over the `Connect` stream as a thin pack against the commits the clone
//!   already holds, so an agent's next attempt costs about its diff;
//! - one detached worktree per commit, `WORKSPACE/code/checkouts/<sha>`,
//!   reset and cleaned (ignored files such as `__pycache__` stay) before a
//!   job uses it while no other job does, so a job never runs what an
//!   earlier job left in tracked files; jobs of one commit share it;
//! - checkouts are evicted least recently used first once their total size
//!   is over the cap (`fvd worker --code-cache-mib`), never one a running
//!   job uses; the clone's objects (packed diffs) stay;
//! - paths the job needs and no commit holds (`worker_paths`: weights) are
//!   linked into the checkout from what the worker provides
//!   (`fvd worker --provide PATH=DIR`).
//!
//! The job's working directory is then the checkout plus the port folder's
//! place in the repository (`code_prefix`).

use std::collections::HashMap;
use std::ffi::OsString;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Default cap of the checkouts' total size (`--code-cache-mib`).
pub const DEFAULT_CACHE_BYTES: u64 = 20 * 1024 * 1024 * 1024;

/// Commits named as `have` in one request (the most recent ones).
pub const MAX_HAVES: usize = 256;

/// Longest wait for the next piece of a pack before the fetch fails.
pub const CHUNK_TIMEOUT: Duration = Duration::from_secs(120);

/// Times one fetch is asked again after the stream to the orchestrator
/// closed under it (a restart, a lost connection): the request waits in
/// the outbox for the next session, whose orchestrator adopts the job.
pub const FETCH_TRIES_ON_LOST_STREAM: u32 = 3;

/// A path the worker has for jobs that need it (`fvd worker --provide`).
#[derive(Debug, Clone, PartialEq)]
pub struct Provide {
    /// Relative to a port folder, as specs name it in `worker_paths`.
    pub path: String,
    /// Where it is on this machine, linked into each checkout that needs
    /// it; `None`: only in a shared checkout, where it already is.
    pub target: Option<PathBuf>,
}

impl Provide {
    /// `PATH=DIR` or `PATH` (see [`Provide::target`]). `DIR` must exist.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (path, target) = match s.split_once('=') {
            Some((p, t)) => (p, Some(PathBuf::from(t))),
            None => (s, None),
        };
        let bad = path.is_empty()
            || path.starts_with('/')
            || path
                .split('/')
                .any(|x| x.is_empty() || x == "." || x == "..");
        if bad {
            return Err(format!(
                "--provide {s:?}: {path:?} is not a relative path inside a port folder (parts joined by /, no . or ..)"
            ));
        }
        if let Some(t) = &target {
            if !t.is_absolute() {
                return Err(format!(
                    "--provide {s:?}: {} is not an absolute path",
                    t.display()
                ));
            }
            if !t.exists() {
                return Err(format!("--provide {s:?}: {} does not exist", t.display()));
            }
        }
        Ok(Self {
            path: path.to_string(),
            target,
        })
    }
}

/// What the worker does about the code of a job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobCode {
    pub job_id: String,
    /// The job's working directory as the orchestrator sees it.
    pub cwd: String,
    /// Empty: the port is not in git, the job runs in `cwd` as it is.
    pub commit: String,
    pub prefix: String,
    pub worker_paths: Vec<String>,
    pub fvd_writes: Vec<String>,
}

/// How a job's code was found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// No commit named: the job runs in its `cwd`.
    AsIs,
    /// The worker sees `cwd` at the job's commit.
    Shared,
    /// The worker's own checkout; `fetched` bytes came over the stream
    /// for it (0 when the clone already held the commit).
    ByCommit { fetched: u64 },
}

/// Where a job runs, and the checkout it holds while it runs.
#[derive(Debug)]
pub struct Placed {
    pub cwd: PathBuf,
    pub mode: Mode,
    /// Keeps the checkout from eviction until dropped.
    pub checkout: Option<CheckoutGuard>,
}

/// One piece of a fetched pack, as the stream delivered it.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub data: Vec<u8>,
    pub last: bool,
    pub error: String,
}

/// Why a pack did not arrive whole.
#[derive(Debug, thiserror::Error)]
enum ReceiveError {
    /// The session ended under the fetch: no verdict on the commit, so the
    /// fetch is asked again once the worker is connected.
    #[error("the stream to the orchestrator closed")]
    StreamLost,
    #[error("{0}")]
    Failed(String),
}

impl From<String> for ReceiveError {
    fn from(why: String) -> Self {
        ReceiveError::Failed(why)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    #[error("cannot prepare the code folder {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Git(#[from] fvd_git::GitError),
}

#[derive(Debug, Default)]
struct Table {
    entries: HashMap<String, Entry>,
    /// Increases with every use: the order of last use.
    clock: u64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    bytes: u64,
    last_used: u64,
    users: u32,
}

/// The worker's clone and checkouts.
#[derive(Debug)]
pub struct CodeCache {
    root: PathBuf,
    repo: PathBuf,
    checkouts: PathBuf,
    scratch: PathBuf,
    cap_bytes: u64,
    provides: Vec<Provide>,
    /// git's own locks are not meant for concurrent fetches and worktree
    /// changes in one repository: those run one at a time.
    git: tokio::sync::Mutex<()>,
    table: Mutex<Table>,
}

/// A checkout in use by one job: dropping it makes it evictable again.
#[derive(Debug)]
pub struct CheckoutGuard {
    cache: Arc<CodeCache>,
    sha: String,
}

impl Drop for CheckoutGuard {
    fn drop(&mut self) {
        let mut t = self.cache.table.lock().expect("code table lock");
        t.clock += 1;
        let now = t.clock;
        if let Some(e) = t.entries.get_mut(&self.sha) {
            e.users = e.users.saturating_sub(1);
            e.last_used = now;
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CodeError + '_ {
    move |source| CodeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

async fn git(dir: &Path, args: &[&str]) -> Result<String, fvd_git::GitError> {
    fvd_git::run(dir, args, &[]).await
}

/// The variables that run git in the checkout at `path` through its
/// administrative folder in the clone `repo`, never through its `.git`
/// file: a job can rewrite that file (its jail leaves only the clone
/// read-only), and fvd's git must not follow it to a repository of the
/// job's making (issue #38).
fn checkout_env(
    repo: &Path,
    path: &Path,
) -> Result<[(&'static str, OsString); 2], fvd_git::GitError> {
    match fvd_git::worktree_admin(repo, path) {
        Some(admin) => Ok(fvd_git::worktree_env(&admin, path)),
        None => Err(fvd_git::GitError::Failed {
            args: "worktree".into(),
            dir: path.to_path_buf(),
            detail: format!("not a worktree of {}", repo.display()),
        }),
    }
}

/// git in the checkout at `path` of the clone `repo` ([`checkout_env`]).
async fn git_checkout(
    repo: &Path,
    path: &Path,
    args: &[&str],
) -> Result<String, fvd_git::GitError> {
    let env = checkout_env(repo, path)?;
    let env: Vec<(&str, &std::ffi::OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    fvd_git::run(path, args, &env).await
}

impl CodeCache {
    /// Opens (or makes) `WORKSPACE/code`: the clone, and the checkouts a
    /// previous run of the worker left, which count against the cap.
    pub async fn open(
        workspace: &Path,
        cap_bytes: u64,
        provides: Vec<Provide>,
    ) -> Result<Arc<Self>, CodeError> {
        let root = std::path::absolute(workspace.join("code")).map_err(io(workspace))?;
        let repo = root.join("repo.git");
        let checkouts = root.join("checkouts");
        let scratch = root.join("tmp");
        for dir in [&root, &checkouts] {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch).map_err(io(&scratch))?;
        if !repo.join("HEAD").is_file() {
            git(&root, &["init", "-q", "--bare", "repo.git"]).await?;
        }
        // Checkouts of agent attempts an earlier worker did not finish.
        let _ = std::fs::remove_dir_all(root.join(ATTEMPTS));
        git(&repo, &["worktree", "prune"]).await?;
        let mut table = Table::default();
        let mut found: Vec<(std::time::SystemTime, String, PathBuf)> = Vec::new();
        for e in std::fs::read_dir(&checkouts)
            .map_err(io(&checkouts))?
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            if fvd_git::is_full_sha(&name) && path.join(".git").is_file() {
                let at = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .unwrap_or(std::time::UNIX_EPOCH);
                found.push((at, name, path));
            } else {
                let _ = std::fs::remove_dir_all(&path);
            }
        }
        found.sort();
        for (_, sha, path) in found {
            table.clock += 1;
            let bytes = size_of(path).await;
            table.entries.insert(
                sha,
                Entry {
                    bytes,
                    last_used: table.clock,
                    users: 0,
                },
            );
        }
        Ok(Arc::new(Self {
            root,
            repo,
            checkouts,
            scratch,
            cap_bytes,
            provides,
            git: tokio::sync::Mutex::new(()),
            table: Mutex::new(table),
        }))
    }

    /// `WORKSPACE/code`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The paths this worker provides, as it registers them.
    pub fn provided_paths(&self) -> Vec<String> {
        self.provides.iter().map(|p| p.path.clone()).collect()
    }

    /// Commits of the checkouts kept now, least recently used first.
    pub fn checkouts(&self) -> Vec<String> {
        let t = self.table.lock().expect("code table lock");
        let mut v: Vec<(&String, &Entry)> = t.entries.iter().collect();
        v.sort_by_key(|(_, e)| e.last_used);
        v.into_iter().map(|(s, _)| s.clone()).collect()
    }

    /// Where `job` runs: its `cwd` when that is at its commit (or it names
    /// none), else this worker's checkout of the commit, fetched with
    /// `fetch` (given the commits the clone holds, it returns the stream of
    /// the pack's chunks) when the clone lacks it. `Err` says in one line
    /// why the job cannot run here (an environment failure, never the
    /// code's).
    pub async fn place<F, Fut>(
        self: &Arc<Self>,
        job: &JobCode,
        fetch: F,
        cancel: &CancellationToken,
    ) -> Result<Placed, String>
    where
        F: FnMut(Vec<String>) -> Fut,
        Fut: Future<Output = Result<mpsc::UnboundedReceiver<Chunk>, String>>,
    {
        let cwd = PathBuf::from(&job.cwd);
        if job.commit.is_empty() {
            let missing = self.missing_in(&cwd, &job.worker_paths);
            if let Some(p) = missing.first() {
                return Err(format!(
                    "needs worker path {p}: not in {} (fvd worker --provide {p})",
                    cwd.display()
                ));
            }
            return Ok(Placed {
                cwd,
                mode: Mode::AsIs,
                checkout: None,
            });
        }
        if !fvd_git::is_full_sha(&job.commit) {
            return Err(format!(
                "job {} names commit {:?}, not a full sha",
                job.job_id, job.commit
            ));
        }
        if self.sees_at_commit(&cwd, job).await {
            let missing = self.missing_in(&cwd, &job.worker_paths);
            if missing.is_empty() {
                return Ok(Placed {
                    cwd,
                    mode: Mode::Shared,
                    checkout: None,
                });
            }
            // A path the shared checkout lacks and this worker has
            // elsewhere: a checkout of its own can link it.
            tracing::info!(job = %job.job_id, missing = ?missing, "the shared checkout lacks worker paths this worker provides: running by commit");
        }
        self.by_commit(job, fetch, cancel).await
    }

    /// Whether `cwd` exists and its work tree is at the job's commit.
    async fn sees_at_commit(&self, cwd: &Path, job: &JobCode) -> bool {
        if !cwd.is_dir() {
            return false;
        }
        let ignore: Vec<String> = job
            .fvd_writes
            .iter()
            .map(|p| format!("{}{p}", job.prefix))
            .collect();
        match fvd_git::is_at_commit(cwd, &job.commit, &ignore, &self.scratch).await {
            Ok(at) => at,
            Err(e) => {
                tracing::debug!(cwd = %cwd.display(), error = %e, "cannot compare the shared checkout with the job's commit");
                false
            }
        }
    }

    /// The job's worker paths that `dir` lacks.
    fn missing_in(&self, dir: &Path, paths: &[String]) -> Vec<String> {
        paths
            .iter()
            .filter(|p| {
                !fvd_paths::join_under(dir, p.as_str())
                    .map(|x| x.exists())
                    .unwrap_or(false)
            })
            .cloned()
            .collect()
    }

    async fn by_commit<F, Fut>(
        self: &Arc<Self>,
        job: &JobCode,
        fetch: F,
        cancel: &CancellationToken,
    ) -> Result<Placed, String>
    where
        F: FnMut(Vec<String>) -> Fut,
        Fut: Future<Output = Result<mpsc::UnboundedReceiver<Chunk>, String>>,
    {
        let sha = job.commit.as_str();
        let mut links = Vec::new();
        for p in &job.worker_paths {
            match self.provides.iter().find(|x| &x.path == p) {
                Some(Provide {
                    target: Some(t), ..
                }) => links.push((p.clone(), t.clone())),
                _ => {
                    return Err(format!(
                        "needs worker path {p}: this worker does not see the checkout at the job's commit and provides no {p} to link into its own (fvd worker --provide {p}=DIR)"
                    ));
                }
            }
        }
        let _git = self.git.lock().await;
        let short = &sha[..12];
        let fetched = self.ensure(job, fetch, cancel).await?;
        let checkout = self
            .checkout(sha)
            .await
            .map_err(|e| format!("cannot check out commit {short}: {e}"))?;
        let workdir = match port_folder(&checkout, &job.prefix, sha) {
            Ok(w) => w,
            Err(e) => {
                self.release(sha);
                return Err(e);
            }
        };
        if !workdir.is_dir() {
            self.release(sha);
            return Err(format!(
                "commit {short} has no folder {}",
                job.prefix.trim_end_matches('/')
            ));
        }
        for (rel, target) in &links {
            if let Err(e) = link(&workdir, rel, target) {
                self.release(sha);
                return Err(format!("needs worker path {rel}: {e}"));
            }
        }
        self.evict(sha).await;
        Ok(Placed {
            cwd: workdir,
            mode: Mode::ByCommit { fetched },
            checkout: Some(CheckoutGuard {
                cache: self.clone(),
                sha: sha.to_string(),
            }),
        })
    }

    /// Fetches the job's commit into the clone unless it holds it; the
    /// bytes fetched. Called with the git lock held.
    async fn ensure<F, Fut>(
        &self,
        job: &JobCode,
        mut fetch: F,
        cancel: &CancellationToken,
    ) -> Result<u64, String>
    where
        F: FnMut(Vec<String>) -> Fut,
        Fut: Future<Output = Result<mpsc::UnboundedReceiver<Chunk>, String>>,
    {
        let sha = job.commit.as_str();
        if fvd_git::has_commit(&self.repo, sha).await {
            return Ok(0);
        }
        let started = Instant::now();
        let mut lost = 0;
        let (fetched, n_haves) = loop {
            let haves = self.haves().await;
            let n_haves = haves.len();
            let chunks = fetch(haves).await?;
            match self.receive(sha, chunks, cancel).await {
                Ok(bytes) => break (bytes, n_haves),
                Err(ReceiveError::StreamLost) if lost < FETCH_TRIES_ON_LOST_STREAM => {
                    lost += 1;
                    tracing::info!(job = %job.job_id, commit = %sha, tries = lost, "the stream closed during the fetch of a commit: asked again for the next session");
                }
                Err(e) => {
                    return Err(format!(
                        "cannot fetch commit {} from the orchestrator: {e}",
                        &sha[..12]
                    ));
                }
            }
        };
        tracing::info!(job = %job.job_id, commit = %sha, bytes = fetched, haves = n_haves, ms = started.elapsed().as_millis() as u64, "fetched the code of a commit");
        Ok(fetched)
    }

    /// A checkout of its own for an agent attempt (issue #32): a detached
    /// worktree of the clone at the job's commit, sharing its objects,
    /// which the attempt may change freely; fetched first when the clone
    /// lacks the commit. Removed with [`AttemptCheckout::remove`], and by
    /// the next worker on this workspace if this one dies first.
    pub async fn attempt_checkout<F, Fut>(
        self: &Arc<Self>,
        job: &JobCode,
        fetch: F,
        cancel: &CancellationToken,
    ) -> Result<AttemptCheckout, String>
    where
        F: FnMut(Vec<String>) -> Fut,
        Fut: Future<Output = Result<mpsc::UnboundedReceiver<Chunk>, String>>,
    {
        let sha = job.commit.as_str();
        if !fvd_git::is_full_sha(sha) {
            return Err(format!(
                "agent job {} names commit {sha:?}, not a full sha",
                job.job_id
            ));
        }
        let _git = self.git.lock().await;
        let fetched = self.ensure(job, fetch, cancel).await?;
        let name: String = job
            .job_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = self.root.join(ATTEMPTS).join(name);
        if path.exists() {
            let _ = std::fs::remove_dir_all(&path);
            let _ = git(&self.repo, &["worktree", "prune"]).await;
        }
        let p = path.to_string_lossy().into_owned();
        git(&self.repo, &["worktree", "add", "-q", "--detach", &p, sha])
            .await
            .map_err(|e| format!("cannot check out commit {}: {e}", &sha[..12]))?;
        let workdir = port_folder(&path, &job.prefix, sha);
        let checkout = AttemptCheckout {
            cache: self.clone(),
            path: path.clone(),
            workdir: workdir.clone().unwrap_or(path),
            base: sha.to_string(),
            fetched,
        };
        let refused = match workdir {
            Err(e) => Some(e),
            Ok(w) if !w.is_dir() => Some(format!(
                "commit {} has no folder {}",
                &sha[..12],
                job.prefix.trim_end_matches('/')
            )),
            Ok(_) => None,
        };
        if let Some(why) = refused {
            drop(_git);
            checkout.remove().await;
            return Err(why);
        }
        Ok(checkout)
    }

    /// The commits the clone holds, most recent first.
    async fn haves(&self) -> Vec<String> {
        git(
            &self.repo,
            &[
                "for-each-ref",
                "--format=%(objectname)",
                "--sort=-committerdate",
                &format!("--count={MAX_HAVES}"),
                "refs/fvd/c/",
            ],
        )
        .await
        .map(|s| s.lines().map(str::to_string).collect())
        .unwrap_or_default()
    }

    /// Feeds a pack into the clone and keeps its commit by a ref; the
    /// pack's size.
    async fn receive(
        &self,
        sha: &str,
        mut chunks: mpsc::UnboundedReceiver<Chunk>,
        cancel: &CancellationToken,
    ) -> Result<u64, ReceiveError> {
        let mut child = fvd_git::command(&self.repo)
            .args(["index-pack", "--stdin", "--fix-thin"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("git index-pack: {e}"))?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        let mut bytes = 0u64;
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => return Err(ReceiveError::Failed("the job was cancelled".into())),
                n = tokio::time::timeout(CHUNK_TIMEOUT, chunks.recv()) => n,
            };
            let chunk = match next {
                Err(_) => {
                    return Err(ReceiveError::Failed(format!(
                        "no piece of the pack came in {} s",
                        CHUNK_TIMEOUT.as_secs()
                    )));
                }
                Ok(None) => return Err(ReceiveError::StreamLost),
                Ok(Some(c)) => c,
            };
            if !chunk.error.is_empty() {
                return Err(ReceiveError::Failed(chunk.error));
            }
            bytes += chunk.data.len() as u64;
            stdin
                .write_all(&chunk.data)
                .await
                .map_err(|e| format!("git index-pack: {e}"))?;
            if chunk.last {
                break;
            }
        }
        drop(stdin);
        let out = child
            .wait_with_output()
            .await
            .map_err(|e| format!("git index-pack: {e}"))?;
        if !out.status.success() {
            return Err(ReceiveError::Failed(format!(
                "git index-pack: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        git(
            &self.repo,
            &["update-ref", &format!("refs/fvd/c/{sha}"), sha],
        )
        .await
        .map_err(|e| format!("the pack did not hold the commit: {e}"))?;
        Ok(bytes)
    }

    /// The checkout of `sha`, made if needed, counted as used by one more
    /// job. Reset to the commit first when no other job uses it.
    async fn checkout(&self, sha: &str) -> Result<PathBuf, String> {
        let path = self.checkouts.join(sha);
        let users = self
            .table
            .lock()
            .expect("code table lock")
            .entries
            .get(sha)
            .map(|e| e.users);
        let ready = match users {
            Some(_) if !path.join(".git").is_file() => false,
            Some(0) => {
                // An earlier job may have changed or added files.
                git_checkout(&self.repo, &path, &["reset", "-q", "--hard", sha])
                    .await
                    .is_ok()
                    && git_checkout(&self.repo, &path, &["clean", "-q", "-fd"])
                        .await
                        .is_ok()
            }
            Some(_) => true,
            None => false,
        };
        let bytes = if ready {
            None
        } else {
            if path.exists() {
                let _ = std::fs::remove_dir_all(&path);
                let _ = git(&self.repo, &["worktree", "prune"]).await;
            }
            let p = path.to_string_lossy().into_owned();
            git(&self.repo, &["worktree", "add", "-q", "--detach", &p, sha])
                .await
                .map_err(|e| e.to_string())?;
            Some(size_of(path.clone()).await)
        };
        let mut t = self.table.lock().expect("code table lock");
        t.clock += 1;
        let now = t.clock;
        let e = t.entries.entry(sha.to_string()).or_insert(Entry {
            bytes: 0,
            last_used: now,
            users: 0,
        });
        if let Some(b) = bytes {
            e.bytes = b;
        }
        e.users += 1;
        e.last_used = now;
        Ok(path)
    }

    fn release(&self, sha: &str) {
        if let Some(e) = self
            .table
            .lock()
            .expect("code table lock")
            .entries
            .get_mut(sha)
        {
            e.users = e.users.saturating_sub(1);
        }
    }

    /// Removes checkouts no job uses, least recently used first, until the
    /// total is under the cap; never `keep`.
    async fn evict(&self, keep: &str) {
        loop {
            let victim = {
                let t = self.table.lock().expect("code table lock");
                let total: u64 = t.entries.values().map(|e| e.bytes).sum();
                if total <= self.cap_bytes {
                    return;
                }
                t.entries
                    .iter()
                    .filter(|(s, e)| e.users == 0 && s.as_str() != keep)
                    .min_by_key(|(_, e)| e.last_used)
                    .map(|(s, _)| s.clone())
            };
            let Some(sha) = victim else {
                return;
            };
            let path = self.checkouts.join(&sha);
            let p = path.to_string_lossy().into_owned();
            if git(&self.repo, &["worktree", "remove", "--force", &p])
                .await
                .is_err()
            {
                let _ = std::fs::remove_dir_all(&path);
                let _ = git(&self.repo, &["worktree", "prune"]).await;
            }
            tracing::info!(commit = %sha, "evicted a checkout (least recently used; over the cache cap)");
            self.table
                .lock()
                .expect("code table lock")
                .entries
                .remove(&sha);
        }
    }
}

/// The port folder (`prefix`) inside a checkout of `sha`.
fn port_folder(checkout: &Path, prefix: &str, sha: &str) -> Result<PathBuf, String> {
    match prefix.trim_end_matches('/') {
        "" => Ok(checkout.to_path_buf()),
        prefix => fvd_paths::join_under(checkout, prefix)
            .map_err(|e| format!("commit {}: port folder refused: {e}", &sha[..12])),
    }
}

/// Where agent attempts' checkouts go, under `WORKSPACE/code`.
const ATTEMPTS: &str = "attempts";

/// An agent attempt's own checkout ([`CodeCache::attempt_checkout`]).
#[derive(Debug)]
pub struct AttemptCheckout {
    cache: Arc<CodeCache>,
    /// The worktree's root.
    pub path: PathBuf,
    /// The port folder in it, where the agent starts.
    pub workdir: PathBuf,
    /// The commit it started from.
    pub base: String,
    /// Bytes fetched for it (0 when the clone held the commit).
    pub fetched: u64,
}

impl AttemptCheckout {
    /// Commits everything the agent changed (even nothing: an empty commit
    /// still marks the attempt) and returns the commit and the pack of
    /// what it adds to the base commit, thin against it.
    pub async fn commit(&self, message: &str) -> Result<(String, Vec<u8>), String> {
        let dir = &self.path;
        let repo = &self.cache.repo;
        git_checkout(repo, dir, &["add", "-A"])
            .await
            .map_err(|e| e.to_string())?;
        git_checkout(
            repo,
            dir,
            &[
                "-c",
                "user.name=fvd agent",
                "-c",
                "user.email=fvd-agent@localhost",
                "commit",
                "--quiet",
                "--allow-empty",
                "--no-verify",
                "-m",
                message,
            ],
        )
        .await
        .map_err(|e| e.to_string())?;
        let sha = git_checkout(repo, dir, &["rev-parse", "HEAD"])
            .await
            .map_err(|e| e.to_string())?;
        // Kept by the clone like a fetched commit: the run that tests it
        // here needs no fetch, and later packs are thin against it.
        git(
            &self.cache.repo,
            &["update-ref", &format!("refs/fvd/c/{sha}"), &sha],
        )
        .await
        .map_err(|e| e.to_string())?;
        let env = checkout_env(repo, dir).map_err(|e| e.to_string())?;
        let mut child = fvd_git::command(dir)
            .envs(env)
            .args(["pack-objects", "--revs", "--thin", "--stdout", "-q"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("git pack-objects: {e}"))?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin
            .write_all(format!("{sha}\n^{}\n", self.base).as_bytes())
            .await
            .map_err(|e| format!("git pack-objects: {e}"))?;
        drop(stdin);
        let out = child
            .wait_with_output()
            .await
            .map_err(|e| format!("git pack-objects: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "git pack-objects: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok((sha, out.stdout))
    }

    /// Removes the checkout; the clone keeps its objects.
    pub async fn remove(self) {
        let _git = self.cache.git.lock().await;
        let p = self.path.to_string_lossy().into_owned();
        if git(&self.cache.repo, &["worktree", "remove", "--force", &p])
            .await
            .is_err()
        {
            let _ = std::fs::remove_dir_all(&self.path);
            let _ = git(&self.cache.repo, &["worktree", "prune"]).await;
        }
    }
}

/// Links `workdir/rel` to `target`, unless the checkout already has
/// something there (the commit's own file, or the link of an earlier job).
fn link(workdir: &Path, rel: &str, target: &Path) -> Result<(), String> {
    let rel = Path::new(rel);
    let name = rel.file_name().ok_or("names no file")?;
    let parent = match rel.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(p) => fvd_paths::join_under_no_links(workdir, p).map_err(|e| e.to_string())?,
        None => workdir.to_path_buf(),
    };
    let dest = parent.join(name);
    if std::fs::symlink_metadata(&dest).is_ok() {
        return Ok(());
    }
    std::fs::create_dir_all(&parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    std::os::unix::fs::symlink(target, &dest).map_err(|e| format!("{}: {e}", dest.display()))
}

/// Bytes of the regular files under `dir`, links not followed.
async fn size_of(dir: PathBuf) -> u64 {
    fvd_telemetry::spawn_blocking(move || {
        let mut total = 0u64;
        let mut stack = vec![dir];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in entries.flatten() {
                let Ok(m) = e.path().symlink_metadata() else {
                    continue;
                };
                if m.is_dir() {
                    stack.push(e.path());
                } else if m.is_file() {
                    total += m.len();
                }
            }
        }
        total
    })
    .await
    .unwrap_or(0)
}
