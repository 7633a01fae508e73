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

use crate::attempt_caps;

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
    /// An attempt's commit refused or not taken in.
    #[error(transparent)]
    TakeIn(#[from] attempt_caps::TakeInError),
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
    // The agent writes its worktree, `.git` file included where its jail
    // cannot keep one file read-only (Landlock): fvd's git there is told
    // its folders by the repository instead (issue #38).
    let common = PathBuf::from(
        git(
            &repo,
            &["rev-parse", "--path-format=absolute", "--git-common-dir"],
        )
        .await?,
    );
    let trust = |wt: &Path| {
        if fvd_git::trust_worktree(&common, wt) {
            Ok(())
        } else {
            Err(WorktreeError::Git {
                args: "worktree list".into(),
                dir: repo.clone(),
                detail: format!(
                    "the repository ({}) lists no worktree at {}: fvd runs no git in a worktree its repository does not know",
                    common.display(),
                    wt.display()
                ),
            })
        }
    };
    if let Some(k) = known
        && k.path == wt_path
        && wt_path.join(".git").exists()
    {
        trust(&wt_path)?;
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
    trust(&wt_path)?;
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
    let mut diff = patch_head(worktree).await?;
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
/// its `pack` (thin against `base`) goes into the worktree's repository
/// only if the commit descends from `base` and unpacks within `limits`
/// ([`attempt_caps::take_in`]: checked from a quarantine, before anything
/// is checked out), and the worktree and its branch move to it. The commit
/// is then recorded as [`commit`] records one. A refused commit leaves the
/// worktree where it was and its objects out of the repository.
pub async fn adopt(
    worktree: &Path,
    base: &str,
    sha: &str,
    pack: &[u8],
    limits: &attempt_caps::AttemptLimits,
) -> Result<Commit, WorktreeError> {
    attempt_caps::take_in(worktree, base, sha, pack, limits).await?;
    reset(worktree, sha).await?;
    described_head(worktree).await
}

/// The patch of `worktree`'s HEAD, read no further than a byte past
/// [`MAX_DIFF_BYTES`]: git is stopped there, so a commit of hundreds of
/// MiB never comes into memory whole.
async fn patch_head(worktree: &Path) -> Result<String, WorktreeError> {
    use tokio::io::AsyncReadExt;
    let args = ["show", "--format=", "--patch", "HEAD"];
    let failed = |detail: String| WorktreeError::Git {
        args: args.join(" "),
        dir: worktree.to_path_buf(),
        detail,
    };
    let mut child = fvd_git::command(worktree)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut bytes = Vec::new();
    stdout
        .take(MAX_DIFF_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| failed(e.to_string()))?;
    if bytes.len() > MAX_DIFF_BYTES {
        // The rest is not read: git is stopped (SIGPIPE or the kill).
        let _ = child.kill().await;
    } else {
        let out = child
            .wait_with_output()
            .await
            .map_err(|e| failed(e.to_string()))?;
        if !out.status.success() {
            return Err(failed(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ));
        }
    }
    let mut diff = String::from_utf8_lossy(&bytes).into_owned();
    diff.truncate(diff.trim_end().len());
    Ok(diff)
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

    /// An agent that can write its worktree (Landlock cannot keep its
    /// `.git` file read-only) points the file at a repository of its own
    /// with a filter driver: fvd's git there still uses the repository's
    /// own folders, and the driver never runs (issue #38).
    #[tokio::test]
    async fn a_rewritten_dot_git_file_sends_fvd_s_git_nowhere() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        repo_with_commit(&repo).await;
        let wt = ensure(&repo, "fam", "comp", None, None).await.unwrap();
        let before = head(&wt.path).await.unwrap();
        // The agent's repository (in its attempt folder, say): a filter
        // driver on every file, which would leave a mark outside.
        let mark = dir.path().join("ran");
        let driver = dir.path().join("driver.sh");
        std::fs::write(
            &driver,
            format!("#!/bin/sh\ntouch {}\nexec cat\n", mark.display()),
        )
        .unwrap();
        std::fs::set_permissions(&driver, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let evil = dir.path().join("evil").join(".git");
        git(dir.path(), &["init", "-q", "evil"]).await.unwrap();
        let mut config = std::fs::read_to_string(evil.join("config")).unwrap();
        config.push_str(&format!(
            "[filter \"x\"]\n\tclean = {0}\n\tsmudge = {0}\n",
            driver.display()
        ));
        std::fs::write(evil.join("config"), config).unwrap();
        std::fs::write(wt.path.join(".gitattributes"), "* filter=x\n").unwrap();
        std::fs::write(
            wt.path.join(".git"),
            format!("gitdir: {}\n", evil.display()),
        )
        .unwrap();
        std::fs::write(wt.path.join("a.txt"), "the agent's\n").unwrap();
        let c = commit(&wt.path, "fvd: comp attempt 1").await.unwrap();
        reset(&wt.path, &c.sha).await.unwrap();
        assert!(!mark.exists(), "the agent's filter driver ran");
        // The commit is on the component's branch of the real repository.
        let on_branch = git(&repo, &["rev-parse", &wt.branch]).await.unwrap();
        assert_eq!(on_branch, c.sha);
        assert_eq!(
            git(&repo, &["rev-parse", &format!("{}^", c.sha)])
                .await
                .unwrap(),
            before
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

    /// Commits `files` on top of `base` in `repo` without a work tree
    /// (`git fast-import`): `files(i)` is the i-th file's path and text.
    /// The commit's sha.
    async fn import_commit(
        repo: &Path,
        base: &str,
        n: usize,
        files: impl Fn(usize) -> (String, Vec<u8>),
    ) -> String {
        use tokio::io::AsyncWriteExt;
        let mut child = fvd_git::command(repo)
            .args(["fast-import", "--quiet", "--force"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut w = tokio::io::BufWriter::new(child.stdin.take().unwrap());
        let mut paths = Vec::new();
        for i in 0..n {
            let (path, text) = files(i);
            w.write_all(format!("blob\nmark :{}\ndata {}\n", i + 1, text.len()).as_bytes())
                .await
                .unwrap();
            w.write_all(&text).await.unwrap();
            w.write_all(b"\n").await.unwrap();
            paths.push(path);
        }
        let message = "an attempt";
        w.write_all(
            format!(
                "commit refs/heads/attempt\ncommitter fvd <fvd@localhost> 1700000000 +0000\ndata {}\n{message}\nfrom {base}\n",
                message.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        for (i, p) in paths.iter().enumerate() {
            w.write_all(format!("M 100644 :{} {p}\n", i + 1).as_bytes())
                .await
                .unwrap();
        }
        w.write_all(b"\n").await.unwrap();
        w.shutdown().await.unwrap();
        drop(w);
        assert!(child.wait().await.unwrap().success());
        git(repo, &["rev-parse", "refs/heads/attempt"])
            .await
            .unwrap()
    }

    /// The objects of `sha` that a repository at `base` lacks: a thin pack,
    /// as a worker sends an attempt.
    async fn thin_pack(repo: &Path, base: &str, sha: &str) -> Vec<u8> {
        fvd_git::run_with_input(
            repo,
            &["pack-objects", "--stdout", "--thin", "--revs", "--quiet"],
            &[],
            format!("{sha}\n^{base}\n").as_bytes(),
        )
        .await
        .unwrap()
    }

    /// The red team's pack bomb (issue #38): 20,000 files of repetitive
    /// text, 195 MiB in all, in a pack of about a MiB. Refused with its
    /// numbers before anything is checked out: the worktree stays at its
    /// base, the repository never holds its objects, no quarantine is left.
    #[tokio::test]
    async fn a_pack_bomb_is_refused_with_its_numbers_before_any_checkout() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        repo_with_commit(&repo).await;
        let wt = ensure(&repo, "fam", "comp", None, None).await.unwrap();
        let base = head(&wt.path).await.unwrap();
        // The worker's side: a clone of its own, where the agent committed.
        let worker = dir.path().join("worker");
        git(
            dir.path(),
            &[
                "clone",
                "-q",
                &repo.to_string_lossy(),
                &worker.to_string_lossy(),
            ],
        )
        .await
        .unwrap();
        const FILES: usize = 20_000;
        const EACH: usize = 10 * 1024;
        let line = b"all work and no play makes jack a dull boy\n";
        let bomb = import_commit(&worker, &base, FILES, |i| {
            let mut text = format!("file {i}\n").into_bytes();
            while text.len() < EACH {
                text.extend_from_slice(line);
            }
            text.truncate(EACH);
            (format!("bomb/f{i:05}.txt"), text)
        })
        .await;
        let pack = thin_pack(&worker, &base, &bomb).await;
        assert!(
            pack.len() < 4 << 20,
            "the bomb packs to {} bytes",
            pack.len()
        );
        let limits = attempt_caps::AttemptLimits::default();
        let refused = adopt(&wt.path, &base, &bomb, &pack, &limits)
            .await
            .expect_err("the bomb is refused");
        let WorktreeError::TakeIn(attempt_caps::TakeInError::OverLimit(why)) = &refused else {
            panic!("refused for another cause: {refused}");
        };
        assert_eq!(
            why,
            &format!(
                "the attempt's commit unpacks to {} in {FILES} new or changed files (largest 10.0 KiB: bomb/f00000.txt), over the limit of 128 MiB / 5000 files (--max-attempt-unpacked-mib, --max-attempt-files)",
                attempt_caps::human((FILES * EACH) as u64)
            )
        );
        assert!(why.contains("195.3 MiB in 20000"), "{why}");
        assert_eq!(head(&wt.path).await.unwrap(), base);
        assert!(!wt.path.join("bomb").exists());
        assert!(
            git(&wt.path, &["cat-file", "-e", &format!("{bomb}^{{commit}}")])
                .await
                .is_err(),
            "the refused commit's objects stay out of the repository"
        );
        let objects = repo.join(".git").join("objects");
        let left: Vec<_> = std::fs::read_dir(&objects)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("incoming-"))
            .collect();
        assert!(left.is_empty(), "a quarantine is left: {left:?}");

        // An ordinary attempt of the same worker is taken in and checked out.
        let fix = import_commit(&worker, &base, 2, |i| {
            (format!("fix{i}.py"), format!("x = {i}\n").into_bytes())
        })
        .await;
        let pack = thin_pack(&worker, &base, &fix).await;
        let taken = adopt(&wt.path, &base, &fix, &pack, &limits).await.unwrap();
        assert_eq!(taken.sha, fix);
        assert_eq!(head(&wt.path).await.unwrap(), fix);
        assert_eq!(
            std::fs::read_to_string(wt.path.join("fix1.py")).unwrap(),
            "x = 1\n"
        );
        assert!(taken.diff.contains("+x = 0"), "{}", taken.diff);
    }

    /// Each limit on its own: the largest file, and a commit that only
    /// changes files of its base counts what it changes.
    #[tokio::test]
    async fn one_file_over_its_limit_is_refused_and_changes_count_against_the_base() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        repo_with_commit(&repo).await;
        let wt = ensure(&repo, "fam", "comp", None, None).await.unwrap();
        let base = head(&wt.path).await.unwrap();
        let worker = dir.path().join("worker");
        git(
            dir.path(),
            &[
                "clone",
                "-q",
                &repo.to_string_lossy(),
                &worker.to_string_lossy(),
            ],
        )
        .await
        .unwrap();
        let limits = attempt_caps::AttemptLimits {
            max_file_bytes: 1000,
            ..Default::default()
        };
        let big = import_commit(&worker, &base, 1, |_| ("w.bin".into(), vec![b'0'; 1001])).await;
        let pack = thin_pack(&worker, &base, &big).await;
        let refused = adopt(&wt.path, &base, &big, &pack, &limits)
            .await
            .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "the attempt's commit unpacks to 1001 B in 1 new or changed files (largest 1001 B: w.bin), over the limit of 1000 B a file (--max-attempt-file-mib)"
        );
        assert_eq!(head(&wt.path).await.unwrap(), base);
        // `a.txt` is the base's, unchanged: only `b.txt` counts.
        let one = import_commit(&worker, &base, 2, |i| {
            if i == 0 {
                ("a.txt".into(), b"one\n".to_vec())
            } else {
                ("b.txt".into(), b"two\n".to_vec())
            }
        })
        .await;
        let limits = attempt_caps::AttemptLimits {
            max_files: 1,
            ..Default::default()
        };
        let pack = thin_pack(&worker, &base, &one).await;
        let unpacked = attempt_caps::take_in(&wt.path, &base, &one, &pack, &limits)
            .await
            .unwrap();
        assert_eq!(
            unpacked,
            attempt_caps::Unpacked {
                bytes: 4,
                files: 1,
                largest: 4,
                largest_path: "b.txt".into()
            }
        );
    }
}
