//! The cleanup gate: before an agent component's pass counts, its worktree
//! must hold no untracked files outside the allowed paths, no stash entry
//! made on its branch, and none of the forbidden patterns (debug hooks,
//! breakpoints) on a line its branch adds against the base commit. A
//! refusal goes back to the agent as the next packet's verdict. The rules
//! come from the spec (`fvd_spec::cleanup`).

use fvd_spec::cleanup::CleanupRules;

use crate::worktree::{Worktree, WorktreeError, git};

/// The gate's findings for `wt`; empty when it is clean.
pub async fn check(wt: &Worktree, rules: &CleanupRules) -> Result<Vec<String>, WorktreeError> {
    let (forbidden, allowed) = rules.compiled().map_err(|e| WorktreeError::Git {
        args: "cleanup rules".into(),
        dir: wt.path.clone(),
        detail: e.to_string(),
    })?;
    let mut findings = Vec::new();

    let status = git(
        &wt.path,
        &["status", "--porcelain=v1", "--untracked-files=all"],
    )
    .await?;
    // Paths are the repository's; the allowed globs are the port folder's.
    let stray: Vec<&str> = status
        .lines()
        .filter_map(|l| l.strip_prefix("?? "))
        .filter(|p| {
            let local = p.strip_prefix(wt.prefix.as_str()).unwrap_or(p);
            !allowed.iter().any(|r| r.is_match(local))
        })
        .collect();
    if !stray.is_empty() {
        findings.push(format!(
            "untracked files outside the allowed paths: {}",
            list(&stray)
        ));
    }

    // The stash is shared by every worktree of the repository; only
    // entries made on this component's branch are its agent's.
    let stash = git(&wt.path, &["stash", "list", "--format=%gd %gs"]).await?;
    let on_branch = format!("on {}:", wt.branch);
    let mine: Vec<&str> = stash
        .lines()
        .filter(|l| l.to_lowercase().contains(&on_branch.to_lowercase()))
        .collect();
    if !mine.is_empty() {
        findings.push(format!("stash entries on {}: {}", wt.branch, list(&mine)));
    }

    let diff = git(
        &wt.path,
        &["diff", "--unified=0", "--no-color", &wt.base_commit, "HEAD"],
    )
    .await?;
    let mut file = String::new();
    let mut hits = Vec::new();
    for line in diff.lines() {
        if let Some(f) = line.strip_prefix("+++ ") {
            file = f.trim_start_matches("b/").to_string();
            continue;
        }
        let Some(added) = line.strip_prefix('+') else {
            continue;
        };
        if let Some(r) = forbidden.iter().find(|r| r.is_match(added)) {
            hits.push(format!("{file}: `{}` matches {}", added.trim(), r.as_str()));
        }
    }
    if !hits.is_empty() {
        findings.push(format!(
            "forbidden patterns in the diff against {}: {}",
            &wt.base_commit[..wt.base_commit.len().min(12)],
            list(&hits.iter().map(String::as_str).collect::<Vec<_>>())
        ));
    }
    Ok(findings)
}

/// At most a few entries, then a count: a finding stays one readable line.
fn list(items: &[&str]) -> String {
    const SHOWN: usize = 5;
    let mut s = items
        .iter()
        .take(SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > SHOWN {
        s.push_str(&format!(" and {} more", items.len() - SHOWN));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    async fn sh(dir: &Path, args: &[&str]) {
        let mut all = vec!["-c", "user.name=t", "-c", "user.email=t@localhost"];
        all.extend_from_slice(args);
        git(dir, &all).await.unwrap();
    }

    #[tokio::test]
    async fn each_rule_is_seen_and_a_clean_tree_passes() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        sh(repo, &["init", "-q", "-b", "main"]).await;
        std::fs::write(repo.join("m.py"), "x = 1\n").unwrap();
        sh(repo, &["add", "-A"]).await;
        sh(repo, &["commit", "-q", "-m", "base"]).await;
        let wt = crate::worktree::ensure(repo, "fam", "comp", None, None)
            .await
            .unwrap();
        let rules = CleanupRules {
            allowed_untracked: vec!["dumps/**".into()],
            ..CleanupRules::default()
        };
        assert_eq!(check(&wt, &rules).await.unwrap(), Vec::<String>::new());

        // An agent that leaves a hook in its commit, a stray file and a
        // stash entry on its branch fails all three rules.
        std::fs::write(
            wt.path.join("m.py"),
            "x = 1\nmodel.register_forward_hook(dump)\n",
        )
        .unwrap();
        crate::worktree::commit(&wt.path, "fvd: comp attempt 1")
            .await
            .unwrap();
        std::fs::create_dir_all(wt.path.join("dumps")).unwrap();
        std::fs::write(wt.path.join("dumps/a.npy"), "allowed").unwrap();
        std::fs::write(wt.path.join("m.py"), "x = 2\n").unwrap();
        sh(&wt.path, &["stash", "push", "-q", "-m", "wip"]).await;
        std::fs::write(wt.path.join("debug.txt"), "stray").unwrap();
        let f = check(&wt, &rules).await.unwrap();
        assert_eq!(f.len(), 3, "{f:?}");
        assert!(
            f[0].contains("debug.txt") && !f[0].contains("dumps"),
            "{f:?}"
        );
        assert!(f[1].starts_with("stash entries on fvd/fam/comp"), "{f:?}");
        assert!(
            f[2].contains("m.py: `model.register_forward_hook(dump)`"),
            "{f:?}"
        );

        // A stash made in the port's own checkout is not the agent's.
        sh(&wt.path, &["stash", "drop", "-q"]).await;
        std::fs::write(repo.join("m.py"), "x = 3\n").unwrap();
        sh(repo, &["stash", "push", "-q", "-m", "mine"]).await;
        std::fs::remove_file(wt.path.join("debug.txt")).unwrap();
        let f = check(&wt, &rules).await.unwrap();
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].starts_with("forbidden patterns"), "{f:?}");
    }

    #[test]
    fn a_bad_pattern_is_refused_with_its_text() {
        let rules = CleanupRules {
            forbidden: vec!["(unclosed".into()],
            ..CleanupRules::default()
        };
        let err = rules.validate().unwrap_err().to_string();
        assert!(err.starts_with("forbidden pattern \"(unclosed\""), "{err}");
    }
}
