//! `fvd gc` through the real binary on an embedded state: agent worktrees
//! and branches (made as the agent loop makes them) of a merged finished
//! component, of a component and a family the state no longer has, and of
//! an unmerged one; what goes, what stays, and the size bound.

use std::path::Path;
use std::process::Output;

use crate::agent::git;
use crate::support::{Sandbox, TestComponent, fvd};

fn gc(repo: &Path, extra: &[&str]) -> (Output, String) {
    let out = fvd()
        .arg("gc")
        .args(extra)
        .arg("--repo")
        .arg(repo)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

/// A worktree and branch `fvd/F/C` under `REPO/.fvd/worktrees/F/C` with
/// one commit of its own.
fn agent_worktree(repo: &Path, family: &str, component: &str) {
    let path = format!(".fvd/worktrees/{family}/{component}");
    git(
        repo,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            &format!("fvd/{family}/{component}"),
            &path,
            "HEAD",
        ],
    );
    let wt = repo.join(&path);
    std::fs::write(wt.join(format!("{component}.txt")), "an attempt\n").unwrap();
    git(&wt, &["add", "-A"]);
    git(&wt, &["commit", "-q", "-m", "attempt 1"]);
}

fn branches(repo: &Path) -> String {
    git(repo, &["branch", "--list", "fvd/*"])
}

#[test]
fn gc_removes_what_no_port_needs_and_keeps_the_rest() {
    let sb = Sandbox::new();
    let repo = sb.repo();
    sb.port(
        "p",
        &[
            TestComponent::new("a", "assert True"),
            TestComponent::new("b", "assert False, 'off by 0.5'"),
        ],
    );
    git(repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join(".gitignore"), ".fvd/\n").unwrap();
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", "base"]);
    let out = fvd()
        .args(["submit", "--family", "p", "--wait", "--repo"])
        .arg(repo)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "b is red: {out:?}");

    // Without a state there is nothing to decide by: refused.
    let bare = tempfile::tempdir().unwrap();
    let (out, text) = gc(bare.path(), &[]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("no fvd state at"), "{text}");

    for (f, c) in [("p", "a"), ("p", "b"), ("p", "dropped"), ("gone", "x")] {
        agent_worktree(repo, f, c);
    }
    git(repo, &["merge", "-q", "--no-edit", "fvd/p/a"]);
    let before = branches(repo);

    let (out, text) = gc(repo, &["--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(
            "would remove p/a's worktree and branch: finished, and its branch is merged into HEAD"
        ) && text.contains(
            "would remove p/dropped's worktree and branch: its port has no such component"
        ) && text.contains(
            "would remove gone/x's worktree and branch: no port of its family is recorded"
        ) && text.contains("kept p/b: its branch is not merged into HEAD")
            && text.contains("would free 3 worktree(s) and 3 branch(es)"),
        "{text}"
    );
    assert_eq!(branches(repo), before, "a dry run removes nothing");
    assert!(repo.join(".fvd/worktrees/gone/x").exists());

    let (out, text) = gc(repo, &[]);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let left = branches(repo);
    assert!(
        left.contains("fvd/p/b")
            && !left.contains("fvd/p/a")
            && !left.contains("fvd/p/dropped")
            && !left.contains("fvd/gone/x"),
        "{left}"
    );
    assert!(
        text.contains("(fvd/gone/x was "),
        "the head of a removed branch is said: {text}"
    );
    for gone in ["p/a", "p/dropped", "gone/x"] {
        assert!(!repo.join(".fvd/worktrees").join(gone).exists(), "{gone}");
    }
    assert!(repo.join(".fvd/worktrees/p/b/b.txt").exists());
    assert_eq!(
        git(repo, &["worktree", "list", "--porcelain"])
            .matches("worktree ")
            .count(),
        2,
        "the checkout and p/b's worktree are registered, nothing stale"
    );

    // A bound of 0 GiB: the finished component's worktree goes, its
    // branch (the agent's work) stays.
    let (out, text) = gc(repo, &["--max-worktrees-gib", "0"]);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("removed p/b's worktree (branch kept)"),
        "{text}"
    );
    assert!(!repo.join(".fvd/worktrees/p/b").exists());
    assert!(branches(repo).contains("fvd/p/b"));
    let (out, text) = gc(repo, &["--max-worktrees-gib=-1"]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("not a non-negative number of GiB"), "{text}");
}
