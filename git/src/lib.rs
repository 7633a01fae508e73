//! git plumbing that both sides of code by commit need (issue #12): the
//! submitting side pins a port to a commit, a worker decides whether the
//! checkout it sees is at a job's commit. Both ask the same question, "what
//! tree would `git add -A` record for this work tree?", and must get the
//! same answer, so it is answered here once: [`work_tree_id`] writes that
//! tree through a temporary copy of the index (the index, HEAD and the work
//! tree are never touched), and [`same_tree`] compares it with a commit.
//!
//! A crate of its own because the two sides (`fvd-workspace` and
//! `fvd-worker`) sit on the same layer and share no lower crate that runs
//! processes.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("git {args} in {dir}: {detail}")]
    Failed {
        args: String,
        dir: PathBuf,
        detail: String,
    },
}

impl GitError {
    /// What git said on stderr (or why it did not start).
    pub fn detail(&self) -> &str {
        match self {
            GitError::Failed { detail, .. } => detail,
        }
    }
}

/// Runs git in `dir` with extra variables; its stdout without the trailing
/// newline. Never prompts, and takes no optional lock (a status refresh
/// must not lock the index of a checkout someone else uses).
pub async fn run(dir: &Path, args: &[&str], envs: &[(&str, &OsStr)]) -> Result<String, GitError> {
    let mut cmd = Command::new("git");
    cmd.args(args)
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .stdin(std::process::Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let failed = |detail: String| GitError::Failed {
        args: args.join(" "),
        dir: dir.to_path_buf(),
        detail,
    };
    let out = cmd.output().await.map_err(|e| failed(e.to_string()))?;
    if !out.status.success() {
        return Err(failed(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
}

/// Where `dir` sits inside its repository (`examples/tinyport/`, empty at
/// the top); `None` when it is not inside a git work tree.
pub async fn prefix(dir: &Path) -> Option<String> {
    run(dir, &["rev-parse", "--show-prefix"], &[]).await.ok()
}

/// Whether the repository of `dir` holds commit `sha`.
pub async fn has_commit(dir: &Path, sha: &str) -> bool {
    run(dir, &["cat-file", "-e", &format!("{sha}^{{commit}}")], &[])
        .await
        .is_ok()
}

/// Whether `s` is a full hex object id (sha-1 or sha-256).
pub fn is_full_sha(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64)
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

static NEXT_INDEX: AtomicU64 = AtomicU64::new(0);

/// Where new objects go while a tree is taken: the repository's own object
/// store, or a folder of the caller's (the repository's objects are then
/// read through it as alternates, and the repository gets no write at all).
#[derive(Debug, Clone, Copy)]
pub enum Objects<'a> {
    Repository,
    Aside(&'a Path),
}

/// Where a work tree keeps things, from one `git rev-parse`.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// The top of the work tree.
    pub top: PathBuf,
    /// Its index file.
    pub index: PathBuf,
    /// The repository's common folder (its objects are under it).
    pub common: PathBuf,
    /// The commit checked out; `None` before the first commit.
    pub head: Option<String>,
}

/// The layout of the work tree that holds `dir`.
pub async fn layout(dir: &Path) -> Result<Layout, GitError> {
    let args = [
        "rev-parse",
        "--path-format=absolute",
        "--show-toplevel",
        "--git-path",
        "index",
        "--git-common-dir",
    ];
    let out = run(dir, &args, &[]).await?;
    let mut lines = out.lines().map(PathBuf::from);
    let (Some(top), Some(index), Some(common)) = (lines.next(), lines.next(), lines.next()) else {
        return Err(GitError::Failed {
            args: args.join(" "),
            dir: dir.to_path_buf(),
            detail: format!("unexpected output {out:?}"),
        });
    };
    let head = run(
        dir,
        &["rev-parse", "--verify", "--quiet", "HEAD^{commit}"],
        &[],
    )
    .await
    .ok();
    Ok(Layout {
        top,
        index,
        common,
        head,
    })
}

/// The variables that send new objects to `objects` for a repository
/// whose common folder is `common`.
fn object_env(common: &Path, objects: Objects<'_>) -> Vec<(&'static str, OsString)> {
    match objects {
        Objects::Repository => Vec::new(),
        Objects::Aside(dir) => vec![
            ("GIT_OBJECT_DIRECTORY", dir.as_os_str().to_owned()),
            (
                "GIT_ALTERNATE_OBJECT_DIRECTORIES",
                common.join("objects").into_os_string(),
            ),
        ],
    }
}

fn as_env<'a>(envs: &'a [(&'static str, OsString)]) -> Vec<(&'static str, &'a OsStr)> {
    envs.iter().map(|(k, v)| (*k, v.as_os_str())).collect()
}

/// The id of the tree `git add -A` would record for the work tree of
/// `layout` (tracked files as they are on disk, untracked ones that are
/// not ignored), written through a temporary copy of its index: the index,
/// HEAD and the work tree are left as they are.
pub async fn work_tree_id(layout: &Layout, objects: Objects<'_>) -> Result<String, GitError> {
    let tmp = std::env::temp_dir().join(format!(
        "fvd-index-{}-{}",
        std::process::id(),
        NEXT_INDEX.fetch_add(1, Ordering::Relaxed)
    ));
    let mut envs = object_env(&layout.common, objects);
    envs.push(("GIT_INDEX_FILE", tmp.clone().into_os_string()));
    let envs = as_env(&envs);
    // The copied index lets git skip files whose stat data did not change;
    // without one (or if the copy is unusable: torn by a concurrent write,
    // a split index) every file is hashed.
    let copied = layout.index.is_file() && std::fs::copy(&layout.index, &tmp).is_ok();
    let mut result = add_all(&layout.top, &envs).await;
    if result.is_err() && copied {
        let _ = std::fs::remove_file(&tmp);
        result = add_all(&layout.top, &envs).await;
    }
    let _ = std::fs::remove_file(&tmp);
    result
}

async fn add_all(top: &Path, envs: &[(&str, &OsStr)]) -> Result<String, GitError> {
    run(top, &["add", "-A", "--", "."], envs).await?;
    run(top, &["write-tree"], envs).await
}

/// `.` and an exclude pathspec per `ignore` (paths from the top).
fn pathspec(ignore: &[String]) -> Vec<String> {
    let mut v = vec![".".to_string()];
    v.extend(ignore.iter().map(|p| format!(":(top,exclude,literal){p}")));
    v
}

/// Whether commit (or tree) `a` and tree `b` hold the same files, leaving
/// out `ignore` (paths from the repository's top). `envs`: those of the
/// objects `b` was written to, when aside.
pub async fn same_tree(
    top: &Path,
    a: &str,
    b: &str,
    ignore: &[String],
    envs: &[(&str, &OsStr)],
) -> Result<bool, GitError> {
    let mut args: Vec<String> = ["diff-tree", "-r", "--quiet", a, b, "--"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(pathspec(ignore));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match run(top, &args, envs).await {
        Ok(_) => Ok(true),
        // diff-tree --quiet exits 1 on a difference, with nothing on stderr.
        Err(e) if e.detail().is_empty() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether the work tree of `layout` holds the files of commit `sha`
/// (as [`work_tree_id`] sees them), but for `ignore` (paths from the top).
/// New objects go to `objects`.
pub async fn tree_is_commit(
    layout: &Layout,
    sha: &str,
    ignore: &[String],
    objects: Objects<'_>,
) -> Result<bool, GitError> {
    let tree = work_tree_id(layout, objects).await?;
    let envs = object_env(&layout.common, objects);
    same_tree(&layout.top, sha, &tree, ignore, &as_env(&envs)).await
}

/// Whether the work tree that holds `dir` is at commit `sha`: its files
/// are those of the commit, but for `ignore` (paths from the repository's
/// top); ignored files do not count. Asked without writing to the
/// repository (new objects go to a temporary folder under `scratch`).
/// `Ok(false)` when the repository lacks the commit.
///
/// When HEAD is the commit, one `git status` answers (clean but for
/// `ignore`: at the commit; anything else: not, even a change undone in
/// the work tree but kept in the index). Otherwise (a snapshot of
/// uncommitted changes on top of HEAD) the work tree's tree is taken and
/// compared.
pub async fn is_at_commit(
    dir: &Path,
    sha: &str,
    ignore: &[String],
    scratch: &Path,
) -> Result<bool, GitError> {
    let layout = layout(dir).await?;
    if layout.head.as_deref() == Some(sha) {
        let mut args: Vec<String> = ["status", "--porcelain", "-z", "--untracked-files=all", "--"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(pathspec(ignore));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        return Ok(run(&layout.top, &args, &[]).await?.is_empty());
    }
    if !has_commit(&layout.top, sha).await {
        return Ok(false);
    }
    let aside = scratch.join(format!(
        "fvd-objects-{}-{}",
        std::process::id(),
        NEXT_INDEX.fetch_add(1, Ordering::Relaxed)
    ));
    if let Err(e) = std::fs::create_dir_all(&aside) {
        return Err(GitError::Failed {
            args: "(objects folder)".into(),
            dir: aside,
            detail: e.to_string(),
        });
    }
    let answer = tree_is_commit(&layout, sha, ignore, Objects::Aside(&aside)).await;
    let _ = std::fs::remove_dir_all(&aside);
    answer
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

    /// A commit of the work tree as it is, on top of `head`, made through
    /// a temporary index (as `fvd submit` snapshots uncommitted changes).
    fn snapshot_of(top: &Path, head: &str) -> String {
        let index = std::env::temp_dir().join(format!("fvd-git-test-{}", std::process::id()));
        let with_index = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@t"])
                .args(args)
                .env("GIT_INDEX_FILE", &index)
                .current_dir(top)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim_end().to_string()
        };
        with_index(&["add", "-A"]);
        let tree = with_index(&["write-tree"]);
        let sha = with_index(&["commit-tree", &tree, "-p", head, "-m", "snapshot"]);
        let _ = std::fs::remove_file(&index);
        sha
    }

    fn repo() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path();
        std::fs::create_dir_all(top.join("port")).unwrap();
        std::fs::write(top.join("port/m.py"), "x = 1\n").unwrap();
        std::fs::write(top.join("port/STATUS.md"), "s\n").unwrap();
        std::fs::write(top.join(".gitignore"), "weights/\n").unwrap();
        git(top, &["init", "-q", "-b", "main"]);
        git(top, &["add", "-A"]);
        git(top, &["commit", "-q", "-m", "base"]);
        dir
    }

    #[tokio::test]
    async fn a_work_tree_is_at_its_commit_until_a_file_a_job_reads_changes() {
        let dir = repo();
        let top = dir.path();
        let port = top.join("port");
        let scratch = tempfile::tempdir().unwrap();
        let head = git(top, &["rev-parse", "HEAD"]);
        let index_before = std::fs::read(top.join(".git/index")).unwrap();
        let ignore = vec!["port/STATUS.md".to_string()];
        let at = |ignore: Vec<String>| {
            let (port, head, s) = (port.clone(), head.clone(), scratch.path().to_path_buf());
            async move { is_at_commit(&port, &head, &ignore, &s).await.unwrap() }
        };
        assert!(at(ignore.clone()).await);
        // Ignored files and the files fvd writes do not count.
        std::fs::create_dir_all(top.join("weights")).unwrap();
        std::fs::write(top.join("weights/w.bin"), b"w").unwrap();
        std::fs::write(port.join("STATUS.md"), "s\nmore\n").unwrap();
        assert!(at(ignore.clone()).await);
        assert!(!at(Vec::new()).await);
        // An edit, or a new file that is not ignored, does.
        std::fs::write(port.join("m.py"), "x = 2\n").unwrap();
        assert!(!at(ignore.clone()).await);
        std::fs::write(port.join("m.py"), "x = 1\n").unwrap();
        assert!(at(ignore.clone()).await);
        std::fs::write(port.join("extra.py"), "").unwrap();
        assert!(!at(ignore.clone()).await);
        // A commit that is not HEAD (a snapshot of the uncommitted changes,
        // the untracked extra.py too, on top of it): the work tree's tree
        // is taken and compared.
        std::fs::write(port.join("m.py"), "x = 3\n").unwrap();
        let snapshot = snapshot_of(top, &head);
        let objects_before = git(top, &["count-objects"]);
        let at_snapshot = |ignore: Vec<String>| {
            let (port, sha, s) = (port.clone(), snapshot.clone(), scratch.path().to_path_buf());
            async move { is_at_commit(&port, &sha, &ignore, &s).await.unwrap() }
        };
        assert!(at_snapshot(ignore.clone()).await);
        std::fs::write(port.join("m.py"), "x = 1\n").unwrap();
        assert!(!at_snapshot(ignore.clone()).await);
        std::fs::remove_file(port.join("extra.py")).unwrap();
        assert!(at(ignore.clone()).await);
        // Asking wrote nothing to the repository and left no folder behind.
        assert_eq!(git(top, &["count-objects"]), objects_before);
        assert_eq!(std::fs::read(top.join(".git/index")).unwrap(), index_before);
        assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);
        // A commit the repository lacks is not where the tree is.
        assert!(
            !is_at_commit(&port, &"a".repeat(40), &[], scratch.path())
                .await
                .unwrap()
        );
        assert!(is_full_sha(&head));
        assert!(!is_full_sha("HEAD") && !is_full_sha(&head.to_uppercase()));
    }

    #[tokio::test]
    async fn outside_a_repository_there_is_no_prefix() {
        let bare = tempfile::tempdir().unwrap();
        assert_eq!(prefix(bare.path()).await, None);
        let dir = repo();
        assert_eq!(
            prefix(&dir.path().join("port")).await.as_deref(),
            Some("port/")
        );
        assert_eq!(prefix(dir.path()).await.as_deref(), Some(""));
    }
}
