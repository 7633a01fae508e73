//! Which repository a port's folder belongs to (issue #30): a port is its
//! repository's and its family's, so a second checkout submitting the same
//! family is recognised and refused instead of taking the port over.
//!
//! The identity is, in this order:
//! - `remote:HOST/PATH`: the URL of the repository's `origin` remote (else
//!   its first remote by name), with no scheme, user, password or port-less
//!   `git@host:` form left, no trailing `.git` or `/`, the host lowercased:
//!   `https://alice:TOKEN@GitHub.com/org/repo.git` and
//!   `git@github.com:org/repo` are both `remote:github.com/org/repo`.
//! - `root:SHA@PATH`: without a remote, the repository's root commit (the
//!   smallest when it has several) and the absolute path of its top.
//! - `path:PATH`: a folder outside git (or a repository without a commit).
//!
//! Invariant: no credential of a remote's URL reaches the identity (it is
//! stored and shown in refusals).

use std::path::Path;

/// The identity of the repository `folder` belongs to.
pub async fn repo_identity(folder: &Path) -> String {
    let path = folder
        .canonicalize()
        .unwrap_or_else(|_| folder.to_path_buf());
    let Ok(top) = fvd_git::run(&path, &["rev-parse", "--show-toplevel"], &[]).await else {
        return format!("path:{}", path.display());
    };
    let top = Path::new(top.trim()).to_path_buf();
    let remotes = fvd_git::run(&top, &["remote"], &[])
        .await
        .unwrap_or_default();
    let mut names: Vec<&str> = remotes
        .lines()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .collect();
    names.sort_by_key(|n| (*n != "origin", n.to_string()));
    if let Some(name) = names.first() {
        let key = format!("remote.{name}.url");
        if let Ok(url) = fvd_git::run(&top, &["config", "--get", &key], &[]).await
            && let Some(id) = normalize_remote(url.trim())
        {
            return format!("remote:{id}");
        }
    }
    match fvd_git::run(&top, &["rev-list", "--max-parents=0", "HEAD"], &[]).await {
        Ok(roots) => match roots.lines().map(str::trim).filter(|r| !r.is_empty()).min() {
            Some(root) => format!("root:{root}@{}", top.display()),
            None => format!("path:{}", top.display()),
        },
        Err(_) => format!("path:{}", top.display()),
    }
}

/// `HOST/PATH` of a remote URL, without credentials; `None` for an empty
/// one. A local path stays a path (made absolute by git already).
pub fn normalize_remote(url: &str) -> Option<String> {
    let url = url.trim();
    if url.is_empty() {
        return None;
    }
    let (host, path) = if let Some((_, rest)) = url.split_once("://") {
        // scheme://[user[:password]@]host[:port]/path
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        (host.to_ascii_lowercase(), path.to_string())
    } else if let Some((authority, path)) = url
        .split_once(':')
        .filter(|(a, _)| !a.contains('/') && !a.is_empty())
    {
        // scp-like: [user@]host:path
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        (host.to_ascii_lowercase(), path.to_string())
    } else {
        // A local path: no authority, nothing secret in it.
        return Some(
            url.trim_end_matches('/')
                .trim_end_matches(".git")
                .to_string(),
        );
    };
    let path = path.trim_matches('/');
    let path = path
        .strip_suffix(".git")
        .unwrap_or(path)
        .trim_end_matches('/');
    Some(if path.is_empty() {
        host
    } else {
        format!("{host}/{path}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remotes_lose_their_credentials_scheme_and_suffix() {
        for (url, want) in [
            (
                "https://alice:ghp_SECRET@GitHub.com/org/repo.git",
                "github.com/org/repo",
            ),
            ("git@github.com:org/repo", "github.com/org/repo"),
            ("ssh://git@github.com/org/repo.git/", "github.com/org/repo"),
            ("https://github.com/org/repo", "github.com/org/repo"),
            ("/srv/git/repo.git", "/srv/git/repo"),
        ] {
            assert_eq!(normalize_remote(url).as_deref(), Some(want), "{url}");
        }
        assert_eq!(normalize_remote(""), None);
    }

    fn git(dir: &Path, args: &[&str]) {
        let ok = std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }

    #[tokio::test]
    async fn a_clone_without_remote_is_its_root_commit_and_path_and_a_remote_wins() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::create_dir_all(a.join("sub")).unwrap();
        assert!(repo_identity(&a).await.starts_with("path:"));
        git(&a, &["init", "-q"]);
        // No commit yet: its path.
        assert_eq!(
            repo_identity(&a.join("sub")).await,
            format!("path:{}", a.canonicalize().unwrap().display())
        );
        std::fs::write(a.join("f"), "x").unwrap();
        git(&a, &["add", "f"]);
        git(&a, &["commit", "-qm", "root"]);
        let id = repo_identity(&a.join("sub")).await;
        assert!(
            id.starts_with("root:")
                && id.ends_with(&format!("@{}", a.canonicalize().unwrap().display())),
            "{id}"
        );
        // A copy at another path is another checkout.
        let b = dir.path().join("b");
        git(dir.path(), &["clone", "-q", a.to_str().unwrap(), "b"]);
        git(&b, &["remote", "remove", "origin"]);
        let other = repo_identity(&b).await;
        assert_ne!(id, other);
        assert_eq!(
            id.split('@').next(),
            other.split('@').next(),
            "same root commit"
        );
        // With a remote, every clone of it is the same repository.
        git(
            &a,
            &[
                "remote",
                "add",
                "origin",
                "https://u:p4ss@example.org/team/repo.git",
            ],
        );
        git(
            &b,
            &["remote", "add", "upstream", "git@example.org:team/repo"],
        );
        assert_eq!(repo_identity(&a).await, "remote:example.org/team/repo");
        assert_eq!(repo_identity(&b).await, "remote:example.org/team/repo");
    }
}
