//! Build script of the `fvd` binary: the text of `fvd --version`, which
//! names the package version, the git commit it was built from (short sha,
//! `-dirty` when tracked files differed from that commit) and the build
//! day (UTC; `SOURCE_DATE_EPOCH` when set, for reproducible builds).
//!
//! A build outside a git checkout (a source tarball, no `git` on the PATH)
//! says `commit unknown` and never fails. The script runs again when HEAD,
//! the ref it points to, the packed refs or the index change (a commit, a
//! checkout, a `git add`), and when the root package's `src/` does; an
//! edit to another crate alone leaves `-dirty` as it was last computed.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "build/date.rs"]
mod date;

/// `git ARGS` in the package's folder: its trimmed stdout when it succeeds.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The commit the package is built from, with `-dirty` when tracked files
/// differ from it; `None` outside a checkout of this package.
fn commit(dir: &Path) -> Option<String> {
    // A checkout whose files hold this package: a tarball unpacked inside
    // some other repository must not take that repository's commit.
    git(dir, &["ls-files", "--error-unmatch", "Cargo.toml"])?;
    let sha = git(dir, &["rev-parse", "--short", "HEAD"]).filter(|s| !s.is_empty())?;
    let dirty =
        git(dir, &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{sha}-dirty") } else { sha })
}

/// Tells cargo to run this script again when HEAD moves: the git dir's
/// `HEAD` (a worktree's own), the ref HEAD names, the packed refs and the
/// index (all found through `git rev-parse --git-path`, which knows a
/// worktree's common dir).
fn watch_git(dir: &Path) {
    let path = |p: &str| git(dir, &["rev-parse", "--git-path", p]).map(|s| dir.join(s));
    let mut watched: Vec<PathBuf> = ["HEAD", "packed-refs", "index"]
        .iter()
        .filter_map(|p| path(p))
        .collect();
    if let Some(head_ref) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        watched.extend(path(&head_ref));
    }
    for p in watched.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| ".".into()));
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build/date.rs");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    watch_git(&dir);
    let commit = commit(&dir).unwrap_or_else(|| "unknown".to_string());
    let secs = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64)
        });
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let day = date::utc_day(secs);
    println!("cargo:rustc-env=FVD_VERSION={version} (commit {commit}, built {day})");
    // The date of `fvd man`'s pages.
    println!("cargo:rustc-env=FVD_BUILD_DATE={day}");
}
