//! The components' fixes together: the commit P7 runs the pipeline at.

use std::path::Path;

use fvd_workspace::together::{Fix, TogetherError, together};

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

/// A repository with `a.py` and `b.py` at its first commit (returned).
fn repo(dir: &Path) -> String {
    git(dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("a.py"), "A = 1\n").unwrap();
    std::fs::write(dir.join("b.py"), "B = 1\n").unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "base"]);
    git(dir, &["rev-parse", "HEAD"])
}

/// A branch from `base` that writes `file`; its commit.
fn fix(dir: &Path, base: &str, branch: &str, file: &str, text: &str) -> String {
    git(dir, &["checkout", "-q", "-b", branch, base]);
    std::fs::write(dir.join(file), text).unwrap();
    git(dir, &["commit", "-q", "-am", branch]);
    let sha = git(dir, &["rev-parse", "HEAD"]);
    git(dir, &["checkout", "-q", "main"]);
    sha
}

fn fixed(component: &str, commit: &str) -> Fix {
    Fix {
        component: component.into(),
        commit: commit.into(),
    }
}

#[tokio::test]
async fn no_fix_is_the_port_s_commit_and_one_fix_is_its_own_commit() {
    let dir = tempfile::tempdir().unwrap();
    let base = repo(dir.path());
    assert_eq!(
        together(dir.path(), "fam", &base, &[fixed("a", &base)])
            .await
            .unwrap(),
        base
    );
    let a = fix(dir.path(), &base, "fa", "a.py", "A = 2\n");
    assert_eq!(
        together(
            dir.path(),
            "fam",
            &base,
            &[fixed("a", &base), fixed("b", &a)]
        )
        .await
        .unwrap(),
        a
    );
}

#[tokio::test]
async fn two_fixes_are_merged_into_one_commit_kept_by_a_snapshot_ref() {
    let dir = tempfile::tempdir().unwrap();
    let base = repo(dir.path());
    let a = fix(dir.path(), &base, "fa", "a.py", "A = 2\n");
    let b = fix(dir.path(), &base, "fb", "b.py", "B = 2\n");
    let fixes = [fixed("alpha", &a), fixed("beta", &b)];
    let both = together(dir.path(), "fam", &base, &fixes).await.unwrap();
    assert_ne!(both, a);
    assert_ne!(both, b);
    assert_eq!(git(dir.path(), &["show", &format!("{both}:a.py")]), "A = 2");
    assert_eq!(git(dir.path(), &["show", &format!("{both}:b.py")]), "B = 2");
    let parents = git(dir.path(), &["log", "-1", "--format=%P", &both]);
    assert_eq!(parents, format!("{a} {b}"));
    let refs = git(dir.path(), &["for-each-ref", "--format=%(refname)"]);
    assert!(
        refs.contains(&format!("refs/fvd/snapshots/fam/{both}")),
        "{refs}"
    );
    // the same fixes give the same commit
    let again = together(dir.path(), "fam", &base, &fixes).await.unwrap();
    assert_eq!(again, both);
    // the work tree and its branch are untouched
    assert_eq!(git(dir.path(), &["rev-parse", "HEAD"]), base);
    assert_eq!(git(dir.path(), &["status", "--porcelain"]), "");
}

#[tokio::test]
async fn fixes_that_touch_the_same_lines_are_named_not_merged() {
    let dir = tempfile::tempdir().unwrap();
    let base = repo(dir.path());
    let a = fix(dir.path(), &base, "fa", "a.py", "A = 2\n");
    let c = fix(dir.path(), &base, "fc", "a.py", "A = 3\n");
    let err = together(
        dir.path(),
        "fam",
        &base,
        &[fixed("alpha", &a), fixed("gamma", &c)],
    )
    .await
    .unwrap_err();
    assert!(matches!(err, TogetherError::Conflict { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "the fixes of components alpha and gamma conflict in a.py: merge them by hand and resubmit"
    );
}
