//! Code by commit, the orchestrator's side (issue #12): a worker that
//! cannot see a job's checkout asks for the job's commit over its
//! `Connect` stream (`FetchCode`, with the commits its clone already
//! holds), and gets the objects it lacks as a git pack in chunks
//! (`CodeChunk`).
//!
//! The mechanism is a thin pack (`git pack-objects --revs --thin` of the
//! commit, `^` every commit the worker has), not a bundle: a bundle must
//! name a ref, which would mean writing refs into the porter's repository
//! for every commit served, and it only wraps the same pack in a header the
//! worker does not need (it names the commit itself, and checks the result
//! by checking it out). A thin pack also lets deltas refer to objects the
//! worker already has, so an agent's next attempt costs about its diff.
//!
//! The pack is made from the port's repository, which the orchestrator
//! owns (it writes `PORT_STATUS.md` and the agents' worktrees there; the
//! worktrees share its objects), and only for the commit of a job leased to
//! the asking worker.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use fvd_store::{Store, StoreError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Bytes of pack per `CodeChunk`: well under gRPC's 4 MiB message limit.
pub const CHUNK_BYTES: usize = 1024 * 1024;

/// `have` commits read from one request; the rest are ignored (the pack is
/// then larger, never wrong).
pub const MAX_HAVES: usize = 256;

/// No pack larger than this is sent (`fvd orchestrator serve
/// --max-code-mib`): a checkout that large is a sign of data committed by
/// mistake, and the job then waits for an environment instead of filling a
/// worker's disk.
pub const DEFAULT_MAX_PACK_BYTES: u64 = 2 * 1024 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    #[error("job {job_id} is not leased to worker {worker_id}")]
    NotLeased { job_id: String, worker_id: String },
    #[error("job {job_id} runs commit {runs}, not {asked}")]
    OtherCommit {
        job_id: String,
        runs: String,
        asked: String,
    },
    #[error("port {0} has no row in the store")]
    NoPort(String),
    #[error("commit {commit} is not in the repository of {repo}")]
    NoCommit { commit: String, repo: PathBuf },
    #[error(
        "the code of commit {commit} is over the orchestrator's limit of {limit_mib} MiB (fvd orchestrator serve --max-code-mib)"
    )]
    TooLarge { commit: String, limit_mib: u64 },
    #[error("git {what} in {repo}: {detail}")]
    Git {
        what: &'static str,
        repo: PathBuf,
        detail: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the worker went away while its code was sent")]
    Gone,
}

/// What one answer cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Served {
    /// Bytes of pack sent.
    pub bytes: u64,
    /// `have` commits the repository knew, left out of the pack.
    pub haves: usize,
}

/// The repository that serves `commit` to `worker_id` for `job_id`: the
/// job's port's, when the job is leased to that worker and runs that
/// commit.
/// Where the jobs a worker asks code for are known: the store's runs, and
/// the agent attempts on the fleet (which have no row there).
#[derive(Debug, Clone, Copy)]
pub struct Sources<'a> {
    pub store: &'a Store,
    pub fleet: &'a fvd_workspace::agent::FleetAttempts,
}

pub async fn repository_for(
    from: Sources<'_>,
    worker_id: &str,
    job_id: &str,
    commit: &str,
) -> Result<PathBuf, CodeError> {
    let (store, fleet) = (from.store, from.fleet);
    let not_leased = || CodeError::NotLeased {
        job_id: job_id.to_string(),
        worker_id: worker_id.to_string(),
    };
    let Some(job) = store.job(job_id).await? else {
        // An agent attempt (issue #32) has no row: its registration says
        // which worker holds it and which commit it starts from.
        let attempt = fleet.held_by(job_id, worker_id).ok_or_else(not_leased)?;
        if attempt.commit != commit || commit.is_empty() {
            return Err(CodeError::OtherCommit {
                job_id: job_id.to_string(),
                runs: attempt.commit,
                asked: commit.to_string(),
            });
        }
        return Ok(attempt.repo);
    };
    if job.worker_id != worker_id || job.state != fvd_store::model::JobState::Running {
        return Err(not_leased());
    }
    if job.commit != commit || commit.is_empty() {
        return Err(CodeError::OtherCommit {
            job_id: job_id.to_string(),
            runs: job.commit,
            asked: commit.to_string(),
        });
    }
    let port = store
        .port(&job.family)
        .await?
        .ok_or_else(|| CodeError::NoPort(job.family.clone()))?;
    Ok(PathBuf::from(port.repo))
}

/// Sends, in chunks of at most [`CHUNK_BYTES`] on `out`, a pack of every
/// object reachable from `commit` and not from the `have` commits that the
/// repository of `repo` knows (others are ignored). More than `max_bytes`
/// is refused ([`CodeError::TooLarge`]) after what was already sent.
pub async fn pack(
    repo: &Path,
    commit: &str,
    have: &[String],
    max_bytes: u64,
    out: &mpsc::Sender<Vec<u8>>,
) -> Result<Served, CodeError> {
    let git_err = |what: &'static str, detail: String| CodeError::Git {
        what,
        repo: repo.to_path_buf(),
        detail,
    };
    if !fvd_git::is_full_sha(commit) || !fvd_git::has_commit(repo, commit).await {
        return Err(CodeError::NoCommit {
            commit: commit.to_string(),
            repo: repo.to_path_buf(),
        });
    }
    let haves = known_commits(repo, &have[..have.len().min(MAX_HAVES)]).await?;
    let mut child = fvd_git::command(repo)
        .args([
            "pack-objects",
            "--revs",
            "--thin",
            "--stdout",
            "--delta-base-offset",
            "-q",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| git_err("pack-objects", e.to_string()))?;
    let mut revs = format!("{commit}\n");
    for h in &haves {
        revs.push_str(&format!("^{h}\n"));
    }
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin
        .write_all(revs.as_bytes())
        .await
        .map_err(|e| git_err("pack-objects", e.to_string()))?;
    drop(stdin);
    let mut stderr = child.stderr.take().expect("piped stderr");
    let errors = fvd_telemetry::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    });
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut sent = 0u64;
    loop {
        let mut buf = vec![0u8; CHUNK_BYTES];
        let mut filled = 0;
        while filled < CHUNK_BYTES {
            let n = stdout
                .read(&mut buf[filled..])
                .await
                .map_err(|e| git_err("pack-objects", e.to_string()))?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 {
            break;
        }
        buf.truncate(filled);
        sent += filled as u64;
        if sent > max_bytes {
            return Err(CodeError::TooLarge {
                commit: commit.to_string(),
                limit_mib: max_bytes / (1024 * 1024),
            });
        }
        out.send(buf).await.map_err(|_| CodeError::Gone)?;
    }
    let status = child
        .wait()
        .await
        .map_err(|e| git_err("pack-objects", e.to_string()))?;
    if !status.success() {
        let text = errors.await.unwrap_or_default();
        return Err(git_err("pack-objects", text.trim().to_string()));
    }
    Ok(Served {
        bytes: sent,
        haves: haves.len(),
    })
}

/// The commits among `shas` that the repository holds (a worker may hold
/// commits of other repositories; naming one unknown to pack-objects would
/// fail the pack).
async fn known_commits(repo: &Path, shas: &[String]) -> Result<Vec<String>, CodeError> {
    let shas: Vec<&String> = shas.iter().filter(|s| fvd_git::is_full_sha(s)).collect();
    if shas.is_empty() {
        return Ok(Vec::new());
    }
    let git_err = |detail: String| CodeError::Git {
        what: "cat-file",
        repo: repo.to_path_buf(),
        detail,
    };
    let mut child = fvd_git::command(repo)
        .args(["cat-file", "--batch-check=%(objectname) %(objecttype)"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| git_err(e.to_string()))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let list: String = shas.iter().map(|s| format!("{s}\n")).collect();
    let writer = fvd_telemetry::spawn(async move {
        let _ = stdin.write_all(list.as_bytes()).await;
    });
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| git_err(e.to_string()))?;
    let _ = writer.await;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(" commit"))
        .map(str::to_string)
        .collect())
}

/// Serves one `FetchCode`: checks the request against the store, then
/// streams the pack on `out`. Logs what it sent.
pub async fn serve(
    from: Sources<'_>,
    worker_id: &str,
    job_id: &str,
    commit: &str,
    have: &[String],
    max_bytes: u64,
    out: &mpsc::Sender<Vec<u8>>,
) -> Result<Served, CodeError> {
    let started = Instant::now();
    let repo = repository_for(from, worker_id, job_id, commit).await?;
    let served = pack(&repo, commit, have, max_bytes, out).await?;
    tracing::info!(
        worker = %worker_id,
        job = %job_id,
        %commit,
        bytes = served.bytes,
        haves = served.haves,
        ms = started.elapsed().as_millis() as u64,
        "served the code of a commit"
    );
    Ok(served)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim_end().to_string()
    }

    async fn collect(
        repo: &Path,
        commit: &str,
        have: &[String],
        max: u64,
    ) -> (Result<Served, CodeError>, Vec<Vec<u8>>) {
        let (tx, mut rx) = mpsc::channel(1024);
        let r = pack(repo, commit, have, max, &tx).await;
        drop(tx);
        let mut chunks = Vec::new();
        while let Some(c) = rx.recv().await {
            chunks.push(c);
        }
        (r, chunks)
    }

    /// Unpacks `chunks` into `into` (a bare repository) as a worker does.
    fn index(into: &Path, chunks: &[Vec<u8>]) {
        use std::io::Write;
        let mut child = std::process::Command::new("git")
            .args(["index-pack", "--stdin", "--fix-thin"])
            .current_dir(into)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        for c in chunks {
            stdin.write_all(c).unwrap();
        }
        drop(stdin);
        assert!(child.wait().unwrap().success());
    }

    #[tokio::test]
    async fn a_pack_is_incremental_against_what_the_worker_has_and_chunked() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        git(repo, &["init", "-q", "-b", "main"]);
        // Incompressible, so the pack needs more than one chunk.
        let mut x = 0x2545f491u64;
        let noise: Vec<u8> = (0..3 * CHUNK_BYTES / 2)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        std::fs::write(repo.join("big.bin"), &noise).unwrap();
        let lines: String = (0..2000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(repo.join("m.py"), &lines).unwrap();
        git(repo, &["add", "-A"]);
        git(repo, &["commit", "-q", "-m", "one"]);
        let one = git(repo, &["rev-parse", "HEAD"]);
        std::fs::write(repo.join("m.py"), format!("{lines}x = 1\n")).unwrap();
        git(repo, &["commit", "-q", "-am", "two"]);
        let two = git(repo, &["rev-parse", "HEAD"]);

        let worker = tempfile::tempdir().unwrap();
        git(worker.path(), &["init", "-q", "--bare"]);
        let (r, chunks) = collect(repo, &one, &[], u64::MAX).await;
        let first = r.unwrap();
        assert!(chunks.len() >= 2, "{} chunks", chunks.len());
        assert!(chunks.iter().all(|c| c.len() <= CHUNK_BYTES));
        assert_eq!(
            first.bytes,
            chunks.iter().map(|c| c.len() as u64).sum::<u64>()
        );
        index(worker.path(), &chunks);
        assert_eq!(git(worker.path(), &["cat-file", "-t", &one]), "commit");

        // The next commit costs about its diff; unknown haves are ignored.
        let haves = vec![one.clone(), "f".repeat(40), "not a sha".into()];
        let (r, chunks) = collect(repo, &two, &haves, u64::MAX).await;
        let next = r.unwrap();
        assert_eq!(next.haves, 1);
        assert!(next.bytes < 2048, "{next:?}");
        index(worker.path(), &chunks);
        assert_eq!(git(worker.path(), &["cat-file", "-t", &two]), "commit");
        git(worker.path(), &["rev-list", "--objects", &two]);

        // Over the limit: refused, and not silently cut.
        let (r, _) = collect(repo, &one, &[], 1024).await;
        assert!(matches!(r, Err(CodeError::TooLarge { .. })), "{r:?}");
        let (r, chunks) = collect(repo, &"e".repeat(40), &[], u64::MAX).await;
        assert!(matches!(r, Err(CodeError::NoCommit { .. })), "{r:?}");
        assert!(chunks.is_empty());
    }
}
