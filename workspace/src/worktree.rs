//! Git worktrees of agent components: each component an agent works on gets
//! its own worktree on branch `fvd/<family>/<component>`, made from the
//! port's base commit, so attempts of different components never touch one
//! another's files and every attempt is a commit on its own branch.
//!
//! Worktrees live under `REPO/.fvd/worktrees/`, beside the embedded state,
//! and `.fvd/` is git-ignored from inside so the port's checkout stays clean.
//!
//! A port folder inside a larger checkout (a FastVideo clone with the port
//! under it, or fvd's own `examples/tinyport`) gets a worktree of that
//! checkout; its runs and its agent work in the same folder inside the
//! worktree (`Worktree::workdir`).

use std::path::{Path, PathBuf};

/// Commits carry this identity so they work on a machine without a git
/// configuration (a bare CI runner).
const IDENTITY: &[&str] = &["-c", "user.name=fvd", "-c", "user.email=fvd@localhost"];

/// The recorded diff of one attempt is cut at this many bytes.
pub const MAX_DIFF_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum WorktreeError {
    #[error(
        "port repository {repo} is not inside a git repository (components with an agent work in git worktrees; run git init and commit there): {detail}"
    )]
    NotARepo { repo: PathBuf, detail: String },
    #[error("port repository {repo} has no commit to branch from: {detail}")]
    NoBase { repo: PathBuf, detail: String },
    #[error("git {args} in {dir}: {detail}")]
    Git {
        args: String,
        dir: PathBuf,
        detail: String,
    },
    #[error("cannot prepare {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("component worktree: {0}")]
    Path(#[from] fvd_paths::PathError),
}

pub use fvd_store::model::Worktree;

/// One attempt as committed.
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    pub sha: String,
    /// `git show --stat` of the commit; empty when the attempt changed nothing.
    pub stat: String,
    /// The patch, cut at [`MAX_DIFF_BYTES`].
    pub diff: String,
}

/// Branch name of a component's worktree.
pub fn branch(family: &str, component: &str) -> String {
    format!("fvd/{family}/{component}")
}

/// Where a component's worktree lives: `REPO/.fvd/worktrees/<family>/<component>`,
/// refused if the names would lead elsewhere (or through a link).
pub fn path(repo: &Path, family: &str, component: &str) -> Result<PathBuf, WorktreeError> {
    Ok(fvd_paths::join_under_no_links(
        &repo.join(".fvd").join("worktrees"),
        Path::new(family).join(component),
    )?)
}

pub(crate) async fn git(dir: &Path, args: &[&str]) -> Result<String, WorktreeError> {
    let out = fvd_git::command(dir)
        .args(args)
        // Never ask for an editor: nobody is there to answer.
        .env("GIT_EDITOR", "true")
        .output()
        .await
        .map_err(|e| WorktreeError::Git {
            args: args.join(" "),
            dir: dir.to_path_buf(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(WorktreeError::Git {
            args: args.join(" "),
            dir: dir.to_path_buf(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
}

/// The lock that orders changes to `repo`'s worktree registrations within
/// this process (the orchestrator is the one process that makes them).
fn registration_lock(repo: &Path) -> std::sync::Arc<tokio::sync::Mutex<()>> {
    static LOCKS: std::sync::LazyLock<
        std::sync::Mutex<
            std::collections::HashMap<PathBuf, std::sync::Arc<tokio::sync::Mutex<()>>>,
        >,
    > = std::sync::LazyLock::new(Default::default);
    let mut locks = LOCKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    locks.entry(repo.to_path_buf()).or_default().clone()
}

/// Makes the component's worktree, or finds the one a previous start made.
/// `known` is the worktree the store recorded, if any. A new branch starts
/// at `base` (the commit the port is pinned to), or at the repository's
/// HEAD when there is none.
pub async fn ensure(
    repo: &Path,
    family: &str,
    component: &str,
    known: Option<Worktree>,
    base: Option<&str>,
) -> Result<Worktree, WorktreeError> {
    let start = base.unwrap_or("HEAD");
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| WorktreeError::Io { path, source }
    };
    let repo = std::fs::canonicalize(repo).map_err(io(repo))?;
    let prefix = git(&repo, &["rev-parse", "--show-prefix"])
        .await
        .map_err(|e| WorktreeError::NotARepo {
            repo: repo.clone(),
            detail: e.to_string(),
        })?;
    let fvd_dir = repo.join(".fvd");
    std::fs::create_dir_all(&fvd_dir).map_err(io(&fvd_dir))?;
    let ignore = fvd_dir.join(".gitignore");
    if !ignore.exists() {
        std::fs::write(&ignore, "*\n").map_err(io(&ignore))?;
    }
    let wt_path = path(&repo, family, component)?;
    let branch = branch(family, component);
    if let Some(k) = known
        && k.path == wt_path
        && wt_path.join(".git").exists()
    {
        return Ok(Worktree { prefix, ..k });
    }
    // Git's worktree registrations are not safe to change concurrently: a
    // `worktree add` reads every registration and fails on one another
    // `add` is half-way through writing, and a `prune` can remove it. The
    // components of a port start together, so registrations are changed
    // one at a time per repository.
    let lock = registration_lock(&repo);
    let _registering = lock.lock().await;
    // A worktree directory deleted by hand leaves a stale registration.
    git(&repo, &["worktree", "prune"]).await?;
    let wt = wt_path.to_string_lossy().to_string();
    let has_branch = git(
        &repo,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("refs/heads/{branch}"),
        ],
    )
    .await
    .is_ok();
    let base_commit = if has_branch {
        let base = git(&repo, &["merge-base", start, &branch]).await?;
        git(&repo, &["worktree", "add", &wt, &branch]).await?;
        base
    } else {
        let base = git(
            &repo,
            &["rev-parse", "--verify", &format!("{start}^{{commit}}")],
        )
        .await
        .map_err(|e| WorktreeError::NoBase {
            repo: repo.clone(),
            detail: e.to_string(),
        })?;
        git(&repo, &["worktree", "add", "-b", &branch, &wt, &base]).await?;
        base
    };
    Ok(Worktree {
        path: wt_path,
        branch,
        base_commit,
        prefix,
    })
}

/// Commits everything the agent changed in `worktree`, even nothing (an
/// empty commit still marks the attempt on the branch).
pub async fn commit(worktree: &Path, message: &str) -> Result<Commit, WorktreeError> {
    git(worktree, &["add", "-A"]).await?;
    let mut args: Vec<&str> = IDENTITY.to_vec();
    args.extend([
        "commit",
        "--quiet",
        "--allow-empty",
        "--no-verify",
        "-m",
        message,
    ]);
    git(worktree, &args).await?;
    described_head(worktree).await
}

/// The commit `worktree` has checked out, as an attempt's record shows it.
async fn described_head(worktree: &Path) -> Result<Commit, WorktreeError> {
    let sha = git(worktree, &["rev-parse", "HEAD"]).await?;
    let stat = git(worktree, &["show", "--stat", "--format=", "HEAD"]).await?;
    let mut diff = git(worktree, &["show", "--format=", "--patch", "HEAD"]).await?;
    if diff.len() > MAX_DIFF_BYTES {
        let mut cut = MAX_DIFF_BYTES;
        while !diff.is_char_boundary(cut) {
            cut -= 1;
        }
        diff.truncate(cut);
        diff.push_str("\n[diff cut at 64 KiB]\n");
    }
    Ok(Commit {
        sha,
        stat: stat.trim().to_string(),
        diff,
    })
}

/// Takes in an attempt's commit made elsewhere (on a worker, issue #32):
/// its `pack` (thin against `base`) goes into the worktree's repository,
/// the commit must descend from `base`, and the worktree and its branch
/// move to it. The commit is then recorded as [`commit`] records one.
pub async fn adopt(
    worktree: &Path,
    base: &str,
    sha: &str,
    pack: &[u8],
) -> Result<Commit, WorktreeError> {
    use tokio::io::AsyncWriteExt;
    let failed = |args: &str, detail: String| WorktreeError::Git {
        args: args.to_string(),
        dir: worktree.to_path_buf(),
        detail,
    };
    if !pack.is_empty() {
        let mut child = fvd_git::command(worktree)
            .args(["index-pack", "--stdin", "--fix-thin"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| failed("index-pack", e.to_string()))?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin
            .write_all(pack)
            .await
            .map_err(|e| failed("index-pack", e.to_string()))?;
        drop(stdin);
        let out = child
            .wait_with_output()
            .await
            .map_err(|e| failed("index-pack", e.to_string()))?;
        if !out.status.success() {
            return Err(failed(
                "index-pack",
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ));
        }
    }
    let commit = format!("{sha}^{{commit}}");
    git(worktree, &["rev-parse", "--verify", "--quiet", &commit]).await?;
    git(worktree, &["merge-base", "--is-ancestor", base, sha])
        .await
        .map_err(|_| {
            failed(
                "merge-base --is-ancestor",
                format!("the attempt's commit {sha} does not descend from its base {base}"),
            )
        })?;
    reset(worktree, sha).await?;
    described_head(worktree).await
}

/// The commit `worktree` has checked out.
pub async fn head(worktree: &Path) -> Result<String, WorktreeError> {
    git(worktree, &["rev-parse", "HEAD"]).await
}

/// Puts `worktree` back at `sha` exactly: what an agent cut off by a crash
/// half-wrote (edits, new files, even a commit) is thrown away, so the
/// attempt runs again from the state it first began in.
pub async fn reset(worktree: &Path, sha: &str) -> Result<(), WorktreeError> {
    git(worktree, &["reset", "--quiet", "--hard", sha]).await?;
    git(worktree, &["clean", "--quiet", "-fd"]).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn repo_with_commit(dir: &Path) {
        git(dir, &["init", "-q", "-b", "main"]).await.unwrap();
        std::fs::write(dir.join("a.txt"), "one\n").unwrap();
        git(dir, &["add", "-A"]).await.unwrap();
        let mut args: Vec<&str> = IDENTITY.to_vec();
        args.extend(["commit", "-q", "-m", "base"]);
        git(dir, &args).await.unwrap();
    }

    #[tokio::test]
    async fn a_new_branch_starts_at_the_pinned_commit_not_head() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        repo_with_commit(repo).await;
        let pinned = git(repo, &["rev-parse", "HEAD"]).await.unwrap();
        std::fs::write(repo.join("a.txt"), "later\n").unwrap();
        let mut args: Vec<&str> = IDENTITY.to_vec();
        args.extend(["commit", "-q", "-am", "later"]);
        git(repo, &args).await.unwrap();
        let wt = ensure(repo, "fam", "comp", None, Some(&pinned))
            .await
            .unwrap();
        assert_eq!(wt.base_commit, pinned);
        assert_eq!(head(&wt.path).await.unwrap(), pinned);
        assert_eq!(
            std::fs::read_to_string(wt.path.join("a.txt")).unwrap(),
            "one\n"
        );
    }

    /// A port's components start together: their worktrees are made at
    /// once. Without one registration at a time, git fails with "failed to
    /// read .git/worktrees/<other>/commondir" (seen on the real flux family).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn many_components_make_their_worktrees_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().to_path_buf();
        repo_with_commit(&repo).await;
        // Three ports of 16 components: the race does not show every time.
        for port in ["p0", "p1", "p2"] {
            let made: Vec<_> = (0..16)
                .map(|i| {
                    let repo = repo.clone();
                    fvd_telemetry::spawn(async move {
                        ensure(&repo, port, &format!("c{i}"), None, None).await
                    })
                })
                .collect();
            for (i, m) in made.into_iter().enumerate() {
                let wt = m
                    .await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{port} component c{i}: {e}"));
                assert!(wt.path.join("a.txt").is_file(), "{}", wt.path.display());
            }
        }
    }

    #[test]
    fn worktree_paths_stay_under_the_worktrees_folder() {
        let repo = Path::new("/r");
        assert_eq!(
            path(repo, "p", "c").unwrap(),
            Path::new("/r/.fvd/worktrees/p/c")
        );
        for (family, component) in [("p", "../../../x"), ("p", "/x"), ("..", "c")] {
            let err = path(repo, family, component).unwrap_err().to_string();
            assert!(err.contains("must stay inside"), "{component}: {err}");
        }
    }

    #[tokio::test]
    async fn worktree_branches_from_head_and_commits_attempts() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        repo_with_commit(repo).await;
        let head = git(repo, &["rev-parse", "HEAD"]).await.unwrap();
        let wt = ensure(repo, "fam", "comp", None, None).await.unwrap();
        assert_eq!(wt.base_commit, head);
        assert_eq!(wt.branch, "fvd/fam/comp");
        std::fs::write(wt.path.join("a.txt"), "two\n").unwrap();
        let c = commit(&wt.path, "fvd: comp attempt 1").await.unwrap();
        assert!(c.stat.contains("a.txt"), "{}", c.stat);
        assert!(c.diff.contains("+two"), "{}", c.diff);
        let empty = commit(&wt.path, "fvd: comp attempt 2").await.unwrap();
        assert_eq!(empty.stat, "");
        let log = git(repo, &["log", "--format=%s", "fvd/fam/comp"])
            .await
            .unwrap();
        assert_eq!(log, "fvd: comp attempt 2\nfvd: comp attempt 1\nbase");
        // The port's own checkout is untouched and sees no new files.
        assert_eq!(git(repo, &["status", "--porcelain"]).await.unwrap(), "");
        // A second start finds the same worktree again.
        let again = ensure(repo, "fam", "comp", Some(wt.clone()), None)
            .await
            .unwrap();
        assert_eq!(again, wt);
    }

    #[tokio::test]
    async fn a_port_folder_inside_a_checkout_works_in_the_same_folder_of_its_worktree() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path();
        std::fs::create_dir_all(top.join("examples/port")).unwrap();
        std::fs::write(top.join("examples/port/m.py"), "x = 1\n").unwrap();
        repo_with_commit(top).await;
        let inner = top.join("examples/port");
        let wt = ensure(&inner, "fam", "comp", None, None).await.unwrap();
        assert_eq!(wt.prefix, "examples/port/");
        assert_eq!(
            wt.path,
            path(&std::fs::canonicalize(&inner).unwrap(), "fam", "comp").unwrap()
        );
        assert!(wt.workdir().join("m.py").is_file());
        std::fs::write(wt.workdir().join("m.py"), "x = 2\n").unwrap();
        let c = commit(&wt.path, "fvd: comp attempt 1").await.unwrap();
        assert!(c.stat.contains("examples/port/m.py"), "{}", c.stat);
        // The checkout itself shows nothing new: .fvd/ ignores itself.
        assert_eq!(git(top, &["status", "--porcelain"]).await.unwrap(), "");
        let again = ensure(
            &inner,
            "fam",
            "comp",
            Some(Worktree {
                prefix: String::new(),
                ..wt.clone()
            }),
            None,
        )
        .await
        .unwrap();
        assert_eq!(again, wt);

        let bare = tempfile::tempdir().unwrap();
        let err = ensure(bare.path(), "fam", "comp", None, None)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("is not inside a git repository"),
            "{err}"
        );
    }
}
