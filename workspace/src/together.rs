//! The components' fixes together (issue #42): an agent component's pass
//! was earned at its own attempt's commit, on a branch of its own, so the
//! pipeline (P7) must run at a commit that holds every such fix. That
//! commit is the port's commit when no fix moved, the one fix's commit
//! when one did (each attempt starts from the port's commit), and
//! otherwise a merge of them all made without a work tree
//! (`git merge-tree --write-tree`), kept under the port's snapshot refs so
//! the runs that name it can always be traced to their code. Fixes that
//! touch the same lines are not merged by guess: the error names the
//! components and the files.

use std::ffi::OsStr;
use std::path::Path;

use fvd_git::GitError;

#[derive(Debug, thiserror::Error)]
pub enum TogetherError {
    #[error(
        "the fixes of components {first} and {second} conflict in {files}: merge them by hand and resubmit"
    )]
    Conflict {
        first: String,
        second: String,
        files: String,
    },
    #[error(transparent)]
    Git(#[from] GitError),
}

/// One component's fix: the commit its pass was earned at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fix {
    pub component: String,
    pub commit: String,
}

/// The commit that holds `base` and every fix in `fixes`, for the
/// repository of `repo`: `base` itself when no fix moved from it.
pub async fn together(
    repo: &Path,
    family: &str,
    base: &str,
    fixes: &[Fix],
) -> Result<String, TogetherError> {
    let mut head = base.to_string();
    let mut holder = String::from("the port");
    for fix in fixes {
        if fix.commit.is_empty()
            || fix.commit == head
            || is_ancestor(repo, &fix.commit, &head).await?
        {
            continue;
        }
        if is_ancestor(repo, &head, &fix.commit).await? {
            head = fix.commit.clone();
            holder = format!("{holder}, {}", fix.component);
            continue;
        }
        head = merged(repo, family, &head, &holder, fix).await?;
        holder = format!("{holder}, {}", fix.component);
    }
    Ok(head)
}

async fn is_ancestor(repo: &Path, old: &str, new: &str) -> Result<bool, GitError> {
    let mut cmd = fvd_git::command(repo);
    cmd.args(["merge-base", "--is-ancestor", old, new]);
    let out = cmd.output().await.map_err(|e| GitError::Failed {
        args: format!("merge-base --is-ancestor {old} {new}"),
        dir: repo.to_path_buf(),
        detail: e.to_string(),
    })?;
    match out.status.code() {
        Some(0) => Ok(true),
        Some(1) => Ok(false),
        _ => Err(GitError::Failed {
            args: format!("merge-base --is-ancestor {old} {new}"),
            dir: repo.to_path_buf(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        }),
    }
}

/// `head` and `fix` merged without a work tree, committed as fvd (dated
/// as the later of the two, so the same fixes give the same commit), and
/// kept by a snapshot ref.
async fn merged(
    repo: &Path,
    family: &str,
    head: &str,
    holder: &str,
    fix: &Fix,
) -> Result<String, TogetherError> {
    let mut cmd = fvd_git::command(repo);
    cmd.args([
        "merge-tree",
        "--write-tree",
        "--name-only",
        "--no-messages",
        "-z",
        head,
        &fix.commit,
    ]);
    let failed = |detail: String| GitError::Failed {
        args: format!("merge-tree --write-tree {head} {}", fix.commit),
        dir: repo.to_path_buf(),
        detail,
    };
    let out = cmd.output().await.map_err(|e| failed(e.to_string()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut parts = text.split('\0').filter(|s| !s.is_empty());
    let tree = parts.next().unwrap_or_default().trim().to_string();
    match out.status.code() {
        Some(0) => {}
        Some(1) => {
            let mut files: Vec<&str> = parts.collect();
            files.sort_unstable();
            files.dedup();
            return Err(TogetherError::Conflict {
                first: holder.rsplit(", ").next().unwrap_or(holder).to_string(),
                second: fix.component.clone(),
                files: files.join(", "),
            });
        }
        _ => {
            return Err(failed(String::from_utf8_lossy(&out.stderr).trim().to_string()).into());
        }
    }
    let date = fvd_git::run(
        repo,
        &["log", "-1", "--format=%ct +0000", head, &fix.commit],
        &[],
    )
    .await?;
    let date = OsStr::new(date.lines().next().unwrap_or_default());
    let fvd = OsStr::new("fvd");
    let mail = OsStr::new("fvd@localhost");
    let message = format!(
        "fvd: the fixes of {holder} and {} together, for port {family}'s pipeline",
        fix.component
    );
    let sha = fvd_git::run(
        repo,
        &[
            "commit-tree",
            &tree,
            "-p",
            head,
            "-p",
            &fix.commit,
            "-m",
            &message,
        ],
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
    let name = format!("refs/fvd/snapshots/{family}/{sha}");
    fvd_git::run(repo, &["update-ref", &name, &sha], &[]).await?;
    Ok(sha)
}
