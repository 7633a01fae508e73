//! The commit a port runs (issue #12): `fvd submit` pins a port to a
//! commit of its repository so that every job names the code it tests and
//! a worker that cannot see the checkout can fetch exactly that code.
//!
//! The commit is the checkout's HEAD when the work tree matches it, or
//! `--commit REV`. Uncommitted changes are not refused: they are
//! snapshotted into a commit whose parent is HEAD, kept under
//! `refs/fvd/snapshots/<family>/<sha>`, so what runs is what the porter sees
//! in the checkout (as it always did on a shared file system), and the
//! verdict still names a commit that holds exactly that code. The snapshot
//! is written through a temporary index (`GIT_INDEX_FILE`, `write-tree`,
//! `commit-tree`, `update-ref`): the porter's working tree, index, HEAD and
//! branches are never touched. Its dates are HEAD's, so submitting the same
//! changes twice pins the same commit.
//!
//! What the snapshot takes is what `git add -A` would: tracked files and
//! untracked ones that are not ignored. Weights are ignored files, which
//! workers provide themselves (`worker_paths`); an untracked, not ignored
//! file over [`MAX_UNTRACKED_BYTES`] is refused rather than copied into the
//! repository's objects.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use fvd_git::{GitError, Objects};

/// Untracked files larger than this are not snapshotted: such a file is
/// almost always data the tests read (weights, dumps), not code.
pub const MAX_UNTRACKED_BYTES: u64 = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error(transparent)]
    Git(#[from] GitError),
    #[error("--commit {rev}: {repo} is not inside a git repository")]
    RevWithoutRepo { rev: String, repo: PathBuf },
    #[error("--commit {rev}: no such commit in {repo}: {detail}")]
    UnknownRev {
        rev: String,
        repo: PathBuf,
        detail: String,
    },
    #[error(
        "repository {repo} has no commit yet: commit the port first (fvd pins every port to a commit)"
    )]
    NoHead { repo: PathBuf },
    #[error(
        "{path} is untracked, not ignored and {mib} MiB: fvd does not snapshot such a file into a commit; git-ignore it and give it to workers through worker_paths and fvd worker --provide, or commit it"
    )]
    LargeUntracked { path: PathBuf, mib: u64 },
}

/// The commit a submitted port runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Pin {
    /// Full hex sha.
    pub sha: String,
    /// The ref that keeps a snapshot of uncommitted changes; `None` when the
    /// commit is HEAD or the one asked for.
    pub snapshot: Option<String>,
}

pub use fvd_git::{has_commit, is_full_sha, prefix};

/// The files that differ between two commits of the repository of `dir`
/// (paths from the top of the repository, renames as a deletion and an
/// addition).
pub async fn changed_files(dir: &Path, old: &str, new: &str) -> Result<Vec<String>, GitError> {
    let out = git(
        dir,
        &["diff", "--name-only", "--no-renames", "-z", old, new, "--"],
    )
    .await?;
    Ok(out
        .split('\0')
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect())
}

async fn git(dir: &Path, args: &[&str]) -> Result<String, GitError> {
    fvd_git::run(dir, args, &[]).await
}

/// The commit a port submitted from `repo` (its folder) runs: `rev` when
/// given, else HEAD, or a snapshot of the uncommitted changes on top of
/// HEAD. `fvd_writes` (relative to `repo`: the port's `PORT_STATUS.md`)
/// are files fvd itself writes into the checkout: a change to them alone is
/// not an uncommitted change. `None` when `repo` is not in a git work tree
/// and no `rev` was asked for: its jobs run in the folder itself.
pub async fn pin(
    repo: &Path,
    family: &str,
    rev: Option<&str>,
    fvd_writes: &[String],
) -> Result<Option<Pin>, CommitError> {
    let Some(prefix) = prefix(repo).await else {
        return match rev {
            Some(rev) => Err(CommitError::RevWithoutRepo {
                rev: rev.to_string(),
                repo: repo.to_path_buf(),
            }),
            None => Ok(None),
        };
    };
    if let Some(rev) = rev {
        let sha = git(
            repo,
            &[
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("{rev}^{{commit}}"),
            ],
        )
        .await
        .map_err(|e| CommitError::UnknownRev {
            rev: rev.to_string(),
            repo: repo.to_path_buf(),
            detail: match e.detail() {
                "" => "unknown revision".to_string(),
                d => d.to_string(),
            },
        })?;
        return Ok(Some(Pin {
            sha,
            snapshot: None,
        }));
    }
    let layout = fvd_git::layout(repo).await?;
    let Some(head) = layout.head.clone() else {
        return Err(CommitError::NoHead {
            repo: repo.to_path_buf(),
        });
    };
    let top = layout.top.clone();
    refuse_large_untracked(&top).await?;
    let tree = fvd_git::work_tree_id(&layout, Objects::Repository).await?;
    let ignore: Vec<String> = fvd_writes.iter().map(|p| format!("{prefix}{p}")).collect();
    if fvd_git::same_tree(&top, &head, &tree, &ignore, &[]).await? {
        return Ok(Some(Pin {
            sha: head,
            snapshot: None,
        }));
    }
    // HEAD's date, so that the same changes give the same commit.
    let date = git(&top, &["log", "-1", "--format=%ct +0000", "HEAD"]).await?;
    let date = OsStr::new(&date);
    let fvd = OsStr::new("fvd");
    let mail = OsStr::new("fvd@localhost");
    let message = format!("fvd: snapshot of the uncommitted changes submitted for port {family}");
    let sha = fvd_git::run(
        &top,
        &["commit-tree", &tree, "-p", &head, "-m", &message],
        &[
            ("GIT_AUTHOR_NAME", fvd),
            ("GIT_AUTHOR_EMAIL", mail),
            ("GIT_AUTHOR_DATE", date),
            ("GIT_COMMITTER_NAME", fvd),
            ("GIT_COMMITTER_EMAIL", mail),
            ("GIT_COMMITTER_DATE", date),
        ],
    )
    .await?;
    // Every snapshot a run named stays reachable (never collected), so a
    // recorded verdict can always be traced to its code.
    let name = format!("refs/fvd/snapshots/{family}/{sha}");
    git(&top, &["update-ref", &name, &sha]).await?;
    Ok(Some(Pin {
        sha,
        snapshot: Some(name),
    }))
}

/// What a submit would snapshot now, for `fvd submit --dry-run` and the
/// size warning: the files that differ from HEAD (changed, added, untracked
/// and not ignored), their bytes, the largest, and every refusal the
/// snapshot would make.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preview {
    /// HEAD, when the repository has one.
    pub head: Option<String>,
    /// Files the snapshot would add or change on top of HEAD (fvd's own
    /// status file aside).
    pub files: usize,
    /// Their bytes on disk.
    pub bytes: u64,
    /// The largest of them, largest first (at most three): path from the
    /// top of the repository, bytes.
    pub largest: Vec<(String, u64)>,
    /// What `pin` would refuse, one line each.
    pub refusals: Vec<String>,
}

/// What [`pin`] would take into a snapshot from `repo` now; `None` when
/// `repo` is not in a git work tree.
pub async fn preview(repo: &Path, fvd_writes: &[String]) -> Result<Option<Preview>, CommitError> {
    let Some(prefix) = prefix(repo).await else {
        return Ok(None);
    };
    let layout = fvd_git::layout(repo).await?;
    let top = layout.top.clone();
    let mut out = Preview {
        head: layout.head.clone(),
        ..Preview::default()
    };
    if layout.head.is_none() {
        out.refusals.push(
            CommitError::NoHead {
                repo: repo.to_path_buf(),
            }
            .to_string(),
        );
    }
    let ignore: Vec<String> = fvd_writes.iter().map(|p| format!("{prefix}{p}")).collect();
    let status = git(
        &top,
        &[
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=all",
            "--no-renames",
        ],
    )
    .await?;
    let mut sizes: Vec<(String, u64)> = Vec::new();
    for entry in status.split('\0').filter(|e| e.len() > 3) {
        let (code, rel) = entry.split_at(3);
        if ignore.iter().any(|i| i == rel) || code.trim() == "D" {
            continue;
        }
        let path = top.join(rel);
        let size = std::fs::symlink_metadata(&path).map_or(0, |m| m.len());
        if code.starts_with("??") && size > MAX_UNTRACKED_BYTES {
            out.refusals.push(
                CommitError::LargeUntracked {
                    path: path.clone(),
                    mib: size / (1024 * 1024),
                }
                .to_string(),
            );
        }
        sizes.push((rel.to_string(), size));
    }
    out.files = sizes.len();
    out.bytes = sizes.iter().map(|(_, b)| b).sum();
    sizes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    out.largest = sizes.into_iter().take(3).collect();
    Ok(Some(out))
}

/// The snapshot refs of `family` (`refs/fvd/snapshots/<family>/<sha>`).
pub async fn snapshot_refs(repo: &Path, family: &str) -> Result<Vec<String>, GitError> {
    if prefix(repo).await.is_none() {
        return Ok(Vec::new());
    }
    let list = git(
        repo,
        &[
            "for-each-ref",
            "--format=%(refname)",
            &format!("refs/fvd/snapshots/{family}/"),
        ],
    )
    .await?;
    Ok(list.lines().map(str::to_owned).collect())
}

/// Deletes the snapshot refs of `family` whose commit is not in `keep`
/// (the commits a recorded verdict or a running job names); returns how
/// many it deleted. With `keep` empty it deletes them all (`fvd reset`).
pub async fn prune_snapshots(
    repo: &Path,
    family: &str,
    keep: &[String],
) -> Result<usize, GitError> {
    let mut gone = 0;
    for name in snapshot_refs(repo, family).await? {
        let sha = name.rsplit('/').next().unwrap_or_default();
        if keep.iter().any(|k| k == sha) {
            continue;
        }
        git(repo, &["update-ref", "-d", &name]).await?;
        gone += 1;
    }
    Ok(gone)
}

/// Refuses to snapshot an untracked, not ignored file over
/// [`MAX_UNTRACKED_BYTES`].
async fn refuse_large_untracked(top: &Path) -> Result<(), CommitError> {
    let list = git(top, &["ls-files", "--others", "--exclude-standard", "-z"]).await?;
    for rel in list.split('\0').filter(|s| !s.is_empty()) {
        let path = top.join(rel);
        if let Ok(m) = std::fs::symlink_metadata(&path)
            && m.is_file()
            && m.len() > MAX_UNTRACKED_BYTES
        {
            return Err(CommitError::LargeUntracked {
                path,
                mib: m.len() / (1024 * 1024),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(dir: &Path, args: &[&str]) -> String {
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

    fn repo() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path();
        std::fs::create_dir_all(top.join("port/tests")).unwrap();
        std::fs::write(top.join("port/m.py"), "x = 1\n").unwrap();
        std::fs::write(top.join("port/tests/PORT_STATUS.md"), "# status\n").unwrap();
        std::fs::write(top.join(".gitignore"), "weights/\n").unwrap();
        run(top, &["init", "-q", "-b", "main"]);
        run(top, &["add", "-A"]);
        run(top, &["commit", "-q", "-m", "base"]);
        dir
    }

    #[tokio::test]
    async fn a_clean_checkout_pins_head_and_a_dirty_one_a_snapshot_that_touches_nothing() {
        let dir = repo();
        let top = dir.path();
        let port = top.join("port");
        let head = run(top, &["rev-parse", "HEAD"]);
        let writes = vec!["tests/PORT_STATUS.md".to_string()];
        let p = pin(&port, "fam", None, &writes).await.unwrap().unwrap();
        assert_eq!(
            p,
            Pin {
                sha: head.clone(),
                snapshot: None
            }
        );
        // fvd's own status file changing is not an uncommitted change,
        // nor is an ignored folder.
        std::fs::write(port.join("tests/PORT_STATUS.md"), "# status\nmore\n").unwrap();
        std::fs::create_dir_all(top.join("weights")).unwrap();
        std::fs::write(top.join("weights/w.bin"), vec![0u8; 1024]).unwrap();
        let p = pin(&port, "fam", None, &writes).await.unwrap().unwrap();
        assert_eq!(p.sha, head);

        // An edit and a new file: a snapshot on top of HEAD.
        std::fs::write(port.join("m.py"), "x = 2\n").unwrap();
        std::fs::write(port.join("new.py"), "y = 1\n").unwrap();
        let status_before = run(top, &["status", "--porcelain"]);
        let index_before = std::fs::read(top.join(".git/index")).unwrap();
        let p = pin(&port, "fam", None, &writes).await.unwrap().unwrap();
        assert_ne!(p.sha, head);
        let name = p.snapshot.clone().unwrap();
        assert_eq!(name, format!("refs/fvd/snapshots/fam/{}", p.sha));
        assert_eq!(run(top, &["rev-parse", &name]), p.sha);
        assert_eq!(run(top, &["rev-parse", &format!("{}^", p.sha)]), head);
        assert_eq!(
            run(top, &["show", &format!("{}:port/m.py", p.sha)]),
            "x = 2"
        );
        assert_eq!(
            run(top, &["show", &format!("{}:port/new.py", p.sha)]),
            "y = 1"
        );
        assert!(
            run(top, &["ls-tree", "-r", "--name-only", &p.sha])
                .lines()
                .all(|l| !l.starts_with("weights"))
        );
        // The porter's HEAD, index and work tree are as they were.
        assert_eq!(run(top, &["rev-parse", "HEAD"]), head);
        assert_eq!(run(top, &["status", "--porcelain"]), status_before);
        assert_eq!(std::fs::read(top.join(".git/index")).unwrap(), index_before);
        // The same changes pin the same snapshot.
        let again = pin(&port, "fam", None, &writes).await.unwrap().unwrap();
        assert_eq!(again, p);
        assert_eq!(prefix(&port).await.as_deref(), Some("port/"));
        assert!(has_commit(&port, &p.sha).await);
        assert!(!has_commit(&port, &"0".repeat(40)).await);
    }

    #[tokio::test]
    async fn a_named_commit_is_resolved_and_refused_when_unknown() {
        let dir = repo();
        let top = dir.path();
        let head = run(top, &["rev-parse", "HEAD"]);
        std::fs::write(top.join("port/m.py"), "x = 3\n").unwrap();
        let p = pin(top, "fam", Some("main"), &[]).await.unwrap().unwrap();
        assert_eq!(
            p,
            Pin {
                sha: head,
                snapshot: None
            }
        );
        let err = pin(top, "fam", Some("nope"), &[])
            .await
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("--commit nope: no such commit in"), "{err}");
        let bare = tempfile::tempdir().unwrap();
        assert_eq!(pin(bare.path(), "fam", None, &[]).await.unwrap(), None);
        let err = pin(bare.path(), "fam", Some("HEAD"), &[])
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not inside a git repository"), "{err}");
    }

    #[tokio::test]
    async fn a_preview_says_what_the_snapshot_holds_and_refuses() {
        let dir = repo();
        let top = dir.path();
        let port = top.join("port");
        let writes = vec!["tests/PORT_STATUS.md".to_string()];
        let clean = preview(&port, &writes).await.unwrap().unwrap();
        assert_eq!((clean.files, clean.bytes), (0, 0));
        assert!(clean.refusals.is_empty() && clean.head.is_some());
        std::fs::write(port.join("m.py"), "x = 22\n").unwrap();
        std::fs::create_dir_all(port.join("out")).unwrap();
        for i in 0..5 {
            std::fs::write(port.join(format!("out/{i}.txt")), vec![b'a'; 100 * (i + 1)]).unwrap();
        }
        std::fs::write(port.join("tests/PORT_STATUS.md"), "# fvd wrote this\n").unwrap();
        let big = port.join("dump.bin");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_UNTRACKED_BYTES + 1)
            .unwrap();
        let p = preview(&port, &writes).await.unwrap().unwrap();
        assert_eq!(p.files, 7, "{p:?}");
        assert_eq!(p.largest[0].0, "port/dump.bin");
        assert_eq!(p.largest[1], ("port/out/4.txt".to_string(), 500));
        assert_eq!(p.refusals.len(), 1, "{p:?}");
        assert!(p.refusals[0].contains("dump.bin is untracked"), "{p:?}");
        // what the preview refuses, pin refuses
        assert!(pin(&port, "fam", None, &writes).await.is_err());
        assert_eq!(
            preview(tempfile::tempdir().unwrap().path(), &[])
                .await
                .unwrap(),
            None
        );
    }

    #[tokio::test]
    async fn snapshot_refs_are_pruned_to_what_is_kept_and_reset_removes_them() {
        let dir = repo();
        let top = dir.path();
        let mut shas = Vec::new();
        for i in 0..3 {
            std::fs::write(top.join("port/m.py"), format!("x = {i}0\n")).unwrap();
            shas.push(pin(top, "fam", None, &[]).await.unwrap().unwrap().sha);
        }
        pin(top, "other", None, &[]).await.unwrap();
        assert_eq!(snapshot_refs(top, "fam").await.unwrap().len(), 3);
        let keep = vec![shas[0].clone(), shas[2].clone()];
        assert_eq!(prune_snapshots(top, "fam", &keep).await.unwrap(), 1);
        let left = snapshot_refs(top, "fam").await.unwrap();
        assert_eq!(left.len(), 2);
        assert!(left.iter().all(|r| !r.ends_with(&shas[1])));
        assert_eq!(prune_snapshots(top, "fam", &[]).await.unwrap(), 2);
        assert!(snapshot_refs(top, "fam").await.unwrap().is_empty());
        // another port's refs are its own
        assert_eq!(snapshot_refs(top, "other").await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_large_untracked_file_is_refused_not_snapshotted() {
        let dir = repo();
        let top = dir.path();
        let big = top.join("port/dump.bin");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_UNTRACKED_BYTES + 1).unwrap();
        let err = pin(top, "fam", None, &[]).await.unwrap_err().to_string();
        assert!(
            err.contains("dump.bin is untracked, not ignored and 64 MiB"),
            "{err}"
        );
    }
}
