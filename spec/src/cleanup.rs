//! The cleanup gate's rules as the spec gives them (`[agent]
//! forbidden_patterns` and `allowed_untracked`), checked when the spec is
//! read; `fvd_workspace::cleanup` applies them to a worktree.

use regex::Regex;

/// Patterns refused in an agent's diff when the spec names none: tracing
/// hooks and debugger stops are how a parity hunt leaves the code dirty.
pub const DEFAULT_FORBIDDEN: &[&str] = &[
    r"register_forward_hook",
    r"register_forward_pre_hook",
    r"breakpoint\(\)",
    r"pdb\.set_trace",
];

/// What the gate checks, from `[agent]` in the spec.
#[derive(Debug, Clone, PartialEq)]
pub struct CleanupRules {
    /// Regexes no added line may match.
    pub forbidden: Vec<String>,
    /// Globs (`*` within a path segment, `**` across) of untracked files
    /// that may stay.
    pub allowed_untracked: Vec<String>,
}

impl Default for CleanupRules {
    fn default() -> Self {
        Self {
            forbidden: DEFAULT_FORBIDDEN.iter().map(|s| s.to_string()).collect(),
            allowed_untracked: Vec::new(),
        }
    }
}

/// Why a rule of the spec cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    #[error("forbidden pattern {pattern:?} is not a regex: {message}")]
    Pattern { pattern: String, message: String },
}

impl CleanupRules {
    /// Refuses a rule that cannot be compiled, so a bad spec fails at
    /// submit instead of at the end of a component.
    pub fn validate(&self) -> Result<(), RuleError> {
        self.compiled().map(|_| ())
    }

    /// The forbidden patterns and the allowed globs, compiled.
    pub fn compiled(&self) -> Result<(Vec<Regex>, Vec<Regex>), RuleError> {
        let forbidden = self
            .forbidden
            .iter()
            .map(|p| {
                Regex::new(p).map_err(|e| RuleError::Pattern {
                    pattern: p.clone(),
                    message: e.to_string(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let allowed = self
            .allowed_untracked
            .iter()
            .map(|g| Regex::new(&glob_regex(g)).expect("a glob becomes a valid regex"))
            .collect();
        Ok((forbidden, allowed))
    }
}

/// The regex of a path glob: `**` any path, `*` and `?` within a segment.
fn glob_regex(glob: &str) -> String {
    let mut out = String::from("^");
    let mut chars = glob.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' if chars.peek() == Some(&'*') => {
                chars.next();
                out.push_str(".*");
            }
            '*' => out.push_str("[^/]*"),
            '?' => out.push_str("[^/]"),
            c => out.push_str(&regex::escape(&c.to_string())),
        }
    }
    out.push('$');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_within_and_across_segments() {
        let r = |g: &str| Regex::new(&glob_regex(g)).unwrap();
        assert!(r("*.log").is_match("run.log"));
        assert!(!r("*.log").is_match("dir/run.log"));
        assert!(r("**/*.log").is_match("dir/sub/run.log"));
        assert!(r("out/**").is_match("out/a/b.bin"));
        assert!(!r("out/**").is_match("output/a"));
        assert!(r("a?.txt").is_match("ab.txt"));
        assert!(!r("a.txt").is_match("abtxt"));
    }
}
