//! What `fvd gc` removes: agent worktrees (`REPO/.fvd/worktrees/F/C`) and
//! branches (`fvd/F/C`) that no port needs any more.
//!
//! [`inventory`] lists them with their size; [`plan`] decides, from what the
//! port's state says of each component ([`Fact`]) and whether its branch is
//! merged into the checkout's `HEAD`, what goes ([`Fate`]); [`apply`] does
//! it with git. The rules, strictest first:
//!
//! - Nothing of a port that is running is touched, nor a worktree with
//!   changes not committed (an agent's or a person's).
//! - A port or component the state no longer has (reset, removed from the
//!   spec): its worktree and branch go (the branch's head is printed, so it
//!   can be made again while git keeps the commits).
//! - A finished component (`non_skip_pass` or `blocked`) whose branch is
//!   merged into `HEAD`: both go. An unmerged or unfinished one stays.
//! - Over a size bound: worktrees of finished components go, largest first,
//!   their branches kept (a resumed agent loop makes the worktree again
//!   from the branch).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::worktree::{WorktreeError, git};

/// One component's agent workspace: its worktree and its branch, either of
/// which may be missing.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub family: String,
    pub component: String,
    pub worktree: Option<PathBuf>,
    /// `fvd/F/C` and its head, when the branch exists.
    pub branch: Option<(String, String)>,
    /// Bytes under the worktree (links not followed).
    pub bytes: u64,
    /// The worktree has changes not committed.
    pub dirty: bool,
    /// The branch's head is an ancestor of the checkout's `HEAD`.
    pub merged: bool,
}

/// What the port's state says of a component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fact {
    /// Its port is running (or paused for an answer or an environment).
    Running,
    /// Its port is recorded and stopped; whether the component is final.
    Stopped { finished: bool },
    /// No port of that family is recorded.
    NoPort,
    /// The port is recorded without that component.
    NoComponent,
}

/// Why something stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    Running,
    Dirty,
    Unmerged,
    Unfinished,
}

/// Why something goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    NoPort,
    NoComponent,
    Merged,
    /// Only the worktree, to get under the size bound.
    OverBound,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Keep(Kept),
    /// The worktree goes; the branch too when `branch`.
    Remove {
        why: Removed,
        branch: bool,
    },
}

impl std::fmt::Display for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kept::Running => "its port is running",
            Kept::Dirty => "its worktree has changes not committed",
            Kept::Unmerged => "its branch is not merged into HEAD",
            Kept::Unfinished => "the component has no final verdict yet",
        })
    }
}

impl std::fmt::Display for Removed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Removed::NoPort => "no port of its family is recorded",
            Removed::NoComponent => "its port has no such component",
            Removed::Merged => "finished, and its branch is merged into HEAD",
            Removed::OverBound => "finished; its worktree goes to get under the size bound",
        })
    }
}

/// Every agent worktree and `fvd/*/*` branch of `repo`'s checkout.
pub async fn inventory(repo: &Path) -> Result<Vec<Candidate>, WorktreeError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| WorktreeError::Io { path, source }
    };
    let repo = std::fs::canonicalize(repo).map_err(io(repo))?;
    let mut found: BTreeMap<(String, String), Candidate> = BTreeMap::new();
    let refs = git(
        &repo,
        &[
            "for-each-ref",
            "--format=%(refname:strip=2) %(objectname)",
            "refs/heads/fvd/",
        ],
    )
    .await?;
    let mut branches = Vec::new();
    for line in refs.lines() {
        let Some((name, sha)) = line.split_once(' ') else {
            continue;
        };
        let mut parts = name.splitn(3, '/');
        if let (Some("fvd"), Some(f), Some(c)) = (parts.next(), parts.next(), parts.next()) {
            branches.push((
                f.to_string(),
                c.to_string(),
                name.to_string(),
                sha.to_string(),
            ));
        }
    }
    let root = repo.join(".fvd").join("worktrees");
    let mut trees = Vec::new();
    if let Ok(families) = std::fs::read_dir(&root) {
        for f in families.flatten() {
            if !f.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            for c in std::fs::read_dir(f.path()).into_iter().flatten().flatten() {
                if c.file_type().is_ok_and(|t| t.is_dir()) {
                    trees.push((
                        f.file_name().to_string_lossy().into_owned(),
                        c.file_name().to_string_lossy().into_owned(),
                        c.path(),
                    ));
                }
            }
        }
    }
    for (f, c, path) in trees {
        let dirty =
            path.join(".git").exists() && !git(&path, &["status", "--porcelain"]).await?.is_empty();
        let cand = found
            .entry((f.clone(), c.clone()))
            .or_insert_with(|| blank(&f, &c));
        cand.bytes = size_of(&path);
        cand.dirty = dirty;
        cand.worktree = Some(path);
    }
    for (f, c, name, sha) in branches {
        let merged = git(&repo, &["merge-base", "--is-ancestor", &sha, "HEAD"])
            .await
            .is_ok();
        let cand = found
            .entry((f.clone(), c.clone()))
            .or_insert_with(|| blank(&f, &c));
        cand.merged = merged;
        cand.branch = Some((name, sha));
    }
    Ok(found.into_values().collect())
}

fn blank(family: &str, component: &str) -> Candidate {
    Candidate {
        family: family.to_string(),
        component: component.to_string(),
        worktree: None,
        branch: None,
        bytes: 0,
        dirty: false,
        merged: false,
    }
}

/// Bytes of the files under `dir`, links not followed.
fn size_of(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map_or(0, |m| m.len()),
                _ => {}
            }
        }
    }
    total
}

/// The fate of each candidate, given what the state says of it (`fact`)
/// and the bound on the worktrees' total size (`max_bytes`).
pub fn plan(
    candidates: &[Candidate],
    fact: impl Fn(&str, &str) -> Fact,
    max_bytes: Option<u64>,
) -> Vec<Fate> {
    let mut fates: Vec<Fate> = candidates
        .iter()
        .map(|c| {
            let f = fact(&c.family, &c.component);
            if f == Fact::Running {
                return Fate::Keep(Kept::Running);
            }
            if c.dirty {
                return Fate::Keep(Kept::Dirty);
            }
            match f {
                Fact::Running => Fate::Keep(Kept::Running),
                Fact::NoPort => Fate::Remove {
                    why: Removed::NoPort,
                    branch: true,
                },
                Fact::NoComponent => Fate::Remove {
                    why: Removed::NoComponent,
                    branch: true,
                },
                Fact::Stopped { finished: false } => Fate::Keep(Kept::Unfinished),
                Fact::Stopped { finished: true } if c.merged || c.branch.is_none() => {
                    Fate::Remove {
                        why: Removed::Merged,
                        branch: true,
                    }
                }
                Fact::Stopped { finished: true } => Fate::Keep(Kept::Unmerged),
            }
        })
        .collect();
    if let Some(max) = max_bytes {
        let mut left: u64 = candidates
            .iter()
            .zip(&fates)
            .filter(|(c, f)| c.worktree.is_some() && matches!(f, Fate::Keep(_)))
            .map(|(c, _)| c.bytes)
            .sum();
        let mut order: Vec<usize> = (0..candidates.len())
            .filter(|&i| fates[i] == Fate::Keep(Kept::Unmerged) && candidates[i].worktree.is_some())
            .collect();
        order.sort_by_key(|&i| std::cmp::Reverse(candidates[i].bytes));
        for i in order {
            if left <= max {
                break;
            }
            left -= candidates[i].bytes;
            fates[i] = Fate::Remove {
                why: Removed::OverBound,
                branch: false,
            };
        }
    }
    fates
}

/// Removes the candidate's worktree (and its branch when `branch`) in
/// `repo`'s checkout; the bytes freed.
pub async fn apply(repo: &Path, c: &Candidate, branch: bool) -> Result<u64, WorktreeError> {
    let mut freed = 0;
    if let Some(path) = &c.worktree {
        let p = path.to_string_lossy();
        if path.join(".git").exists() {
            git(repo, &["worktree", "remove", &p]).await?;
        } else {
            // A folder git no longer knows (its registration pruned): fvd
            // made it under .fvd/worktrees, nothing else points at it.
            std::fs::remove_dir_all(path).map_err(|source| WorktreeError::Io {
                path: path.clone(),
                source,
            })?;
        }
        freed = c.bytes;
        if let Some(family) = path.parent() {
            let _ = std::fs::remove_dir(family);
        }
    }
    git(repo, &["worktree", "prune"]).await?;
    if branch && let Some((name, _)) = &c.branch {
        git(repo, &["branch", "-D", name]).await?;
    }
    Ok(freed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(f: &str, c: &str, bytes: u64, dirty: bool, merged: bool) -> Candidate {
        Candidate {
            family: f.into(),
            component: c.into(),
            worktree: Some(PathBuf::from(format!("/r/.fvd/worktrees/{f}/{c}"))),
            branch: Some((format!("fvd/{f}/{c}"), "ab".repeat(20))),
            bytes,
            dirty,
            merged,
        }
    }

    #[test]
    fn the_rules_keep_what_a_port_still_needs() {
        let cands = [
            cand("run", "a", 10, false, true),
            cand("gone", "a", 10, false, false),
            cand("p", "dropped", 10, false, false),
            cand("p", "merged", 10, false, true),
            cand("p", "unmerged", 10, false, false),
            cand("p", "open", 10, false, true),
            cand("p", "dirty", 10, true, true),
            cand("gone", "dirty", 10, true, false),
        ];
        let fact = |f: &str, c: &str| match (f, c) {
            ("run", _) => Fact::Running,
            ("gone", _) => Fact::NoPort,
            (_, "dropped") => Fact::NoComponent,
            (_, "open") => Fact::Stopped { finished: false },
            _ => Fact::Stopped { finished: true },
        };
        let remove = |why, branch| Fate::Remove { why, branch };
        assert_eq!(
            plan(&cands, fact, None),
            [
                Fate::Keep(Kept::Running),
                remove(Removed::NoPort, true),
                remove(Removed::NoComponent, true),
                remove(Removed::Merged, true),
                Fate::Keep(Kept::Unmerged),
                Fate::Keep(Kept::Unfinished),
                Fate::Keep(Kept::Dirty),
                Fate::Keep(Kept::Dirty),
            ]
        );
    }

    #[test]
    fn over_the_bound_finished_worktrees_go_largest_first_and_keep_their_branches() {
        let cands = [
            cand("p", "small", 10, false, false),
            cand("p", "big", 100, false, false),
            cand("p", "mid", 50, false, false),
            cand("p", "open", 1000, false, false),
        ];
        let fact = |_: &str, c: &str| Fact::Stopped {
            finished: c != "open",
        };
        // 1,160 bytes kept; the bound is 1,060: `big` alone gets it there.
        let fates = plan(&cands, fact, Some(1060));
        let over = Fate::Remove {
            why: Removed::OverBound,
            branch: false,
        };
        assert_eq!(
            fates,
            [
                Fate::Keep(Kept::Unmerged),
                over,
                Fate::Keep(Kept::Unmerged),
                Fate::Keep(Kept::Unfinished),
            ]
        );
        // An unfinished worktree is never removed for the bound.
        let fates = plan(&cands, fact, Some(0));
        assert_eq!(fates[3], Fate::Keep(Kept::Unfinished));
        assert!(fates[..3].iter().all(|f| *f == over));
    }

    async fn sh(dir: &Path, args: &[&str]) {
        let out = tokio::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .current_dir(dir)
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    }

    /// A real checkout: worktrees made as the agent loop makes them, one
    /// merged into HEAD, one with a commit of its own, one dirty.
    #[tokio::test]
    async fn inventory_and_apply_on_a_real_checkout() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        sh(repo, &["init", "-q", "-b", "main"]).await;
        std::fs::write(repo.join("a.py"), "x = 1\n").unwrap();
        sh(repo, &["add", "."]).await;
        sh(repo, &["commit", "-q", "-m", "base"]).await;
        let mut made = Vec::new();
        for c in ["merged", "own", "dirty"] {
            made.push(
                crate::worktree::ensure(repo, "p", c, None, None)
                    .await
                    .unwrap(),
            );
        }
        for w in &made[..2] {
            std::fs::write(w.path.join("a.py"), format!("x = '{}'\n", w.branch)).unwrap();
            crate::worktree::commit(&w.path, "attempt 1").await.unwrap();
        }
        sh(repo, &["merge", "-q", "--no-edit", "fvd/p/merged"]).await;
        std::fs::write(made[2].path.join("scratch.txt"), "wip\n").unwrap();

        let cands = inventory(repo).await.unwrap();
        let by = |c: &str| cands.iter().find(|x| x.component == c).unwrap().clone();
        assert_eq!(cands.len(), 3, "{cands:?}");
        assert!(by("merged").merged && !by("own").merged);
        assert!(by("dirty").dirty && !by("own").dirty);
        assert!(by("own").bytes > 0);

        let fates = plan(&cands, |_, _| Fact::Stopped { finished: true }, None);
        for (c, f) in cands.iter().zip(&fates) {
            if let Fate::Remove { branch, .. } = f {
                apply(repo, c, *branch).await.unwrap();
            }
        }
        assert!(!made[0].path.exists(), "merged: worktree removed");
        let branches = tokio::process::Command::new("git")
            .args(["branch", "--list", "fvd/*"])
            .current_dir(repo)
            .output()
            .await
            .unwrap();
        let branches = String::from_utf8_lossy(&branches.stdout);
        assert!(!branches.contains("fvd/p/merged"), "{branches}");
        assert!(
            branches.contains("fvd/p/own") && branches.contains("fvd/p/dirty"),
            "{branches}"
        );
        assert!(made[1].path.exists() && made[2].path.exists());
        assert_eq!(
            std::fs::read_to_string(made[2].path.join("scratch.txt")).unwrap(),
            "wip\n",
            "a dirty worktree is never touched"
        );
        // Again: nothing is left to remove; the two kept stay kept.
        let cands = inventory(repo).await.unwrap();
        assert_eq!(cands.len(), 2);
    }
}
