//! The judge of a component, pinned (issue #39): what decides its verdict
//! is the port's own, never what an agent's attempt made of it.
//!
//! A component's *judge* is its parity test files; in every folder from the
//! repository's root down to each of them, `conftest.py` and pytest's
//! configuration (`pytest.ini`, `pyproject.toml`, `setup.cfg`, `tox.ini`:
//! pytest takes the first it finds going up); the official reference
//! (`official_ref_dir`), the port's spec and its `PORT_STATUS.md`.
//!
//! [`pin`] gives the commit a component's run tests: the attempt's own when
//! it left the judge as the port's base commit has it, else a commit of
//! fvd's whose tree is the attempt's with every changed judge path put back
//! as the base has it (a judge file the attempt added is left out). So a
//! loosened tolerance, an `assert True`, a report-flipping `conftest.py` or
//! an edited reference cannot turn red into green: the run judges the
//! attempt's code with the unchanged judge, and the change is listed.

use std::ffi::OsStr;
use std::path::Path;

/// The files pytest reads in each folder on the way to a test.
const PER_FOLDER: &[&str] = &[
    "conftest.py",
    "pytest.ini",
    "pyproject.toml",
    "setup.cfg",
    "tox.ini",
];

/// Ref namespace of the commits [`pin`] makes (kept from `git gc`).
pub const JUDGED_REFS: &str = "refs/fvd/judged";

#[derive(Debug, thiserror::Error)]
pub enum JudgeError {
    #[error("git {args} in {dir}: {detail}")]
    Git {
        args: String,
        dir: std::path::PathBuf,
        detail: String,
    },
    #[error("cannot prepare a private index in {dir}: {source}")]
    Io {
        dir: std::path::PathBuf,
        source: std::io::Error,
    },
}

impl From<fvd_git::GitError> for JudgeError {
    fn from(e: fvd_git::GitError) -> Self {
        let fvd_git::GitError::Failed { args, dir, detail } = e;
        JudgeError::Git { args, dir, detail }
    }
}

/// A private index file, removed when dropped.
struct Index(std::path::PathBuf);

impl Drop for Index {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The judge's paths, relative to the repository's root: `tests` and
/// `more` are relative to the port's folder, which sits at `prefix`
/// (`""` or `a/b/`) in the repository. A path that is absolute, names a
/// parent, or is `none` is left out.
pub fn paths(prefix: &str, tests: &[String], more: &[String]) -> Vec<String> {
    let usable = |p: &str| {
        let p = p.trim();
        !p.is_empty()
            && p != "none"
            && !p.starts_with('/')
            && !Path::new(p)
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
    };
    let full = |p: &str| {
        let p = p.trim().trim_start_matches("./").trim_end_matches('/');
        format!("{prefix}{p}")
    };
    let mut out: Vec<String> = Vec::new();
    let mut add = |p: String| {
        if !out.contains(&p) {
            out.push(p);
        }
    };
    for t in tests.iter().filter(|t| usable(t)) {
        let t = full(t);
        add(t.clone());
        let mut folder = Path::new(&t).parent();
        while let Some(f) = folder {
            for name in PER_FOLDER {
                let f = f.to_string_lossy();
                add(if f.is_empty() {
                    (*name).to_string()
                } else {
                    format!("{f}/{name}")
                });
            }
            folder = f.parent();
        }
    }
    for m in more.iter().filter(|m| usable(m)) {
        add(full(m));
    }
    out
}

/// The commit to test for `head`, an attempt on top of `base`, and the
/// judge paths the attempt changed (empty: `head` itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinned {
    pub commit: String,
    pub changed: Vec<String>,
    /// The patch of the change to those paths, cut at [`MAX_JUDGE_DIFF`].
    pub diff: String,
}

/// How much of a judge change's patch is kept.
pub const MAX_JUDGE_DIFF: usize = 16 * 1024;

/// Pins `judge` (paths from [`paths`]) of `head` to `base`, in the
/// repository or worktree at `dir` (see the module doc).
pub async fn pin(
    dir: &Path,
    base: &str,
    head: &str,
    judge: &[String],
) -> Result<Pinned, JudgeError> {
    if judge.is_empty() || base.is_empty() || base == head {
        return Ok(Pinned {
            commit: head.to_string(),
            changed: Vec::new(),
            diff: String::new(),
        });
    }
    let specs: Vec<String> = judge.iter().map(|p| format!(":(literal){p}")).collect();
    let mut args = vec![
        "diff",
        "--name-only",
        "--no-renames",
        "-z",
        base,
        head,
        "--",
    ];
    args.extend(specs.iter().map(String::as_str));
    let listed = fvd_git::run(dir, &args, &[]).await?;
    let mut changed: Vec<String> = listed
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    changed.sort();
    changed.dedup();
    if changed.is_empty() {
        return Ok(Pinned {
            commit: head.to_string(),
            changed,
            diff: String::new(),
        });
    }
    let mut diff_args = vec!["diff", "--no-renames", "--no-color", base, head, "--"];
    diff_args.extend(specs.iter().map(String::as_str));
    let diff = cut(fvd_git::run(dir, &diff_args, &[]).await?, MAX_JUDGE_DIFF);
    let tmp = std::env::temp_dir();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let index = Index(tmp.join(format!("fvd-judge-{}-{nanos}.index", std::process::id())));
    if let Err(source) = std::fs::write(&index.0, b"") {
        return Err(JudgeError::Io { dir: tmp, source });
    }
    let _ = std::fs::remove_file(&index.0);
    let env: [(&str, &OsStr); 1] = [("GIT_INDEX_FILE", index.0.as_os_str())];
    fvd_git::run(dir, &["read-tree", head], &env).await?;
    for p in &changed {
        let literal = format!(":(literal){p}");
        let entry = fvd_git::run(dir, &["ls-tree", "-z", base, "--", &literal], &[]).await?;
        let entry = entry.trim_end_matches('\0');
        match entry.split_once('\t') {
            Some((meta, _)) => {
                let f: Vec<&str> = meta.split_whitespace().collect();
                let (mode, sha) = (
                    f.first().copied().unwrap_or(""),
                    f.get(2).copied().unwrap_or(""),
                );
                let info = format!("{mode},{sha},{p}");
                fvd_git::run(dir, &["update-index", "--add", "--cacheinfo", &info], &env).await?;
            }
            None => {
                fvd_git::run(dir, &["update-index", "--force-remove", "--", p], &env).await?;
            }
        }
    }
    let tree = fvd_git::run(dir, &["write-tree"], &env).await?;
    let message = format!(
        "fvd: the judge of {} over {}\n\nThe attempt changed the judge ({}); this commit tests its code with the port's own.",
        short(base),
        short(head),
        changed.join(", ")
    );
    let identity: [(&str, &OsStr); 4] = [
        ("GIT_AUTHOR_NAME", OsStr::new("fvd")),
        ("GIT_AUTHOR_EMAIL", OsStr::new("fvd@localhost")),
        ("GIT_COMMITTER_NAME", OsStr::new("fvd")),
        ("GIT_COMMITTER_EMAIL", OsStr::new("fvd@localhost")),
    ];
    let commit = fvd_git::run(
        dir,
        &["commit-tree", &tree, "-p", head, "-m", &message],
        &identity,
    )
    .await?;
    let name = format!("{JUDGED_REFS}/{commit}");
    fvd_git::run(dir, &["update-ref", &name, &commit], &[]).await?;
    Ok(Pinned {
        commit,
        changed,
        diff,
    })
}

/// `text` no longer than `max` bytes (cut at a character's boundary, with
/// a line saying so).
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut at = max;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.truncate(at);
        text.push_str("\n[cut at 16 KiB]\n");
    }
    text
}

/// A person's answer to an attempt's judge change, as [`decide`] commits
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision<'a> {
    /// Kept, committed under this name.
    Approved { by: &'a str },
    /// Dropped from the branch.
    Rejected,
}

/// The commits of an attempt whose judge change was decided: the attempt
/// was `head` on top of `before`, and `pinned` is what [`pin`] made of it
/// (its code, with the judge as the port had it). The branch's new head is
/// a commit of the attempt's code alone on `before` (`code_message`), and,
/// when approved, the judge change on top of it authored by the person who
/// approved it (`judge_message`): so the branch never carries a judge
/// change nobody approved, and one that was approved names who did.
/// Returns the new head.
pub async fn decide(
    dir: &Path,
    before: &str,
    head: &str,
    pinned: &str,
    decision: Decision<'_>,
    code_message: &str,
    judge_message: &str,
) -> Result<String, JudgeError> {
    let fvd_identity: [(&str, &OsStr); 4] = [
        ("GIT_AUTHOR_NAME", OsStr::new("fvd")),
        ("GIT_AUTHOR_EMAIL", OsStr::new("fvd@localhost")),
        ("GIT_COMMITTER_NAME", OsStr::new("fvd")),
        ("GIT_COMMITTER_EMAIL", OsStr::new("fvd@localhost")),
    ];
    let code_tree = fvd_git::run(dir, &["rev-parse", &format!("{pinned}^{{tree}}")], &[]).await?;
    let code = fvd_git::run(
        dir,
        &["commit-tree", &code_tree, "-p", before, "-m", code_message],
        &fvd_identity,
    )
    .await?;
    let Decision::Approved { by } = decision else {
        return Ok(code);
    };
    let full_tree = fvd_git::run(dir, &["rev-parse", &format!("{head}^{{tree}}")], &[]).await?;
    let person: [(&str, &OsStr); 4] = [
        ("GIT_AUTHOR_NAME", OsStr::new(by)),
        ("GIT_AUTHOR_EMAIL", OsStr::new("")),
        ("GIT_COMMITTER_NAME", OsStr::new("fvd")),
        ("GIT_COMMITTER_EMAIL", OsStr::new("fvd@localhost")),
    ];
    let judged = fvd_git::run(
        dir,
        &["commit-tree", &full_tree, "-p", &code, "-m", judge_message],
        &person,
    )
    .await?;
    Ok(judged)
}

/// Whether `ancestor` is `commit` or one of its ancestors.
pub async fn is_ancestor(dir: &Path, ancestor: &str, commit: &str) -> bool {
    fvd_git::run(dir, &["merge-base", "--is-ancestor", ancestor, commit], &[])
        .await
        .is_ok()
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_judge_is_the_tests_what_pytest_reads_on_the_way_and_the_rest() {
        let p = paths(
            "examples/port/",
            &["tests/unit/test_x.py".into()],
            &[
                "official".into(),
                "none".into(),
                "../escape".into(),
                "/abs".into(),
            ],
        );
        for want in [
            "examples/port/tests/unit/test_x.py",
            "examples/port/tests/unit/conftest.py",
            "examples/port/tests/conftest.py",
            "examples/port/conftest.py",
            "examples/conftest.py",
            "conftest.py",
            "pytest.ini",
            "pyproject.toml",
            "examples/port/setup.cfg",
            "examples/port/tox.ini",
            "examples/port/official",
        ] {
            assert!(p.contains(&want.to_string()), "{want}: {p:?}");
        }
        assert!(
            !p.iter()
                .any(|x| x.contains("none") || x.contains("..") || x.starts_with('/')),
            "{p:?}"
        );
    }

    async fn git(dir: &Path, args: &[&str]) -> String {
        let mut all = vec!["-c", "user.name=t", "-c", "user.email=t@localhost"];
        all.extend_from_slice(args);
        fvd_git::run(dir, &all, &[]).await.unwrap()
    }

    async fn commit_files(dir: &Path, files: &[(&str, &str)], message: &str) -> String {
        for (p, text) in files {
            let p = dir.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        git(dir, &["add", "-A"]).await;
        git(dir, &["commit", "-q", "-m", message]).await;
        git(dir, &["rev-parse", "HEAD"]).await
    }

    async fn show(dir: &Path, commit: &str, path: &str) -> String {
        git(dir, &["show", &format!("{commit}:{path}")]).await
    }

    #[tokio::test]
    async fn a_judge_change_is_pinned_then_dropped_or_kept_under_the_approvers_name() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        git(repo, &["init", "-q", "-b", "main"]).await;
        let base = commit_files(
            repo,
            &[
                ("port.py", "eps = 1e-2\n"),
                ("tests/test_x.py", "atol = 1e-5\n"),
            ],
            "base",
        )
        .await;
        let head = commit_files(
            repo,
            &[
                ("port.py", "eps = 1e-6\n"),
                ("tests/test_x.py", "atol = 1.0\n"),
            ],
            "attempt",
        )
        .await;
        let judge = paths("", &["tests/test_x.py".into()], &[]);
        let pinned = pin(repo, &base, &head, &judge).await.unwrap();
        assert_eq!(pinned.changed, vec!["tests/test_x.py".to_string()]);
        assert!(
            pinned.diff.contains("-atol = 1e-5") && pinned.diff.contains("+atol = 1.0"),
            "{}",
            pinned.diff
        );
        assert!(
            !pinned.diff.contains("eps"),
            "only the judge's patch: {}",
            pinned.diff
        );
        assert_eq!(
            show(repo, &pinned.commit, "tests/test_x.py").await,
            "atol = 1e-5"
        );
        assert_eq!(show(repo, &pinned.commit, "port.py").await, "eps = 1e-6");

        let dropped = decide(
            repo,
            &base,
            &head,
            &pinned.commit,
            Decision::Rejected,
            "code",
            "",
        )
        .await
        .unwrap();
        assert_eq!(
            git(repo, &["rev-parse", &format!("{dropped}^")]).await,
            base
        );
        assert_eq!(show(repo, &dropped, "tests/test_x.py").await, "atol = 1e-5");
        assert_eq!(show(repo, &dropped, "port.py").await, "eps = 1e-6");
        assert!(
            !is_ancestor(repo, &head, &dropped).await,
            "the judge change is not on the branch"
        );

        let kept = decide(
            repo,
            &base,
            &head,
            &pinned.commit,
            Decision::Approved { by: "Ada Reviewer" },
            "code",
            "judge change approved",
        )
        .await
        .unwrap();
        assert_eq!(show(repo, &kept, "tests/test_x.py").await, "atol = 1.0");
        assert_eq!(
            git(repo, &["log", "-1", "--format=%an", &kept]).await,
            "Ada Reviewer"
        );
        let code = git(repo, &["rev-parse", &format!("{kept}^")]).await;
        assert_eq!(git(repo, &["rev-parse", &format!("{code}^")]).await, base);
        assert_eq!(show(repo, &code, "tests/test_x.py").await, "atol = 1e-5");
        let touched = git(repo, &["diff", "--name-only", &code, &kept]).await;
        assert_eq!(
            touched, "tests/test_x.py",
            "the approved commit is the judge change alone"
        );
        assert!(is_ancestor(repo, &kept, &kept).await && is_ancestor(repo, &base, &kept).await);

        // Judged against the approved judge, the same branch changes nothing.
        let again = pin(repo, &kept, &kept, &judge).await.unwrap();
        assert!(again.changed.is_empty() && again.commit == kept);
    }
}
