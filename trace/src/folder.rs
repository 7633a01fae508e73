//! Comparing the rank files one traced run left in a folder: a glob per
//! side picks that side's files among the folder's, and [`compare`](fn@crate::compare) merges
//! and compares them. The same code runs wherever the folder is: a worker
//! compares the files of its own job where the test wrote them (so a
//! traced rerun of any size sends back a report, not its files), and the
//! orchestrator compares files a worker sent back without a report.
//!
//! [`trimmed_json`] keeps a report within a byte budget (a message, a
//! database row) by keeping the rows around its first divergence.

use std::path::{Path, PathBuf};

use crate::{CompareOptions, Diagnostic, Report};

/// Rows kept on each side of the first divergence in a trimmed report.
pub const TRIM_CONTEXT_ROWS: usize = 40;

/// What a folder's comparison needs: the two sides' globs (relative to the
/// folder; `*` and `?` never cross a `/`) and the comparison's options in
/// their spec form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FolderSpec {
    pub reference: String,
    pub port: String,
    /// `REGEX=>TEMPLATE` rules (`--rename`).
    pub rename: Vec<String>,
    /// `STAT=REL` or `MODULE_REGEX:STAT=REL` (`--tol`).
    pub tol: Vec<String>,
    /// Steps compared (`--steps`); `None`: all.
    pub steps: Option<String>,
}

impl FolderSpec {
    /// The comparison options. No `layers` filter: each side's tracer
    /// already wrote only the modules of the run's regex.
    pub fn options(&self) -> Result<CompareOptions, String> {
        let steps = match &self.steps {
            Some(s) => Some(crate::parse_steps(s).map_err(|e| format!("trace steps: {e}"))?),
            None => None,
        };
        Ok(CompareOptions {
            rename: self.rename.clone(),
            tolerances: self.tol.clone(),
            layers: None,
            steps,
            merge: crate::MergeOptions::default(),
        })
    }
}

/// Compares the files of `dir` named by `written` (relative, `/`-separated
/// paths of the folder's regular files): each side is the files its glob
/// matches. No matching file on a side is an error naming what was there.
pub fn compare_folder(dir: &Path, written: &[String], spec: &FolderSpec) -> Result<Report, String> {
    let pick = |side: &str, glob: &str| -> Result<Vec<PathBuf>, String> {
        let chosen: Vec<PathBuf> = written
            .iter()
            .filter(|rel| glob_match(glob, rel))
            .map(|rel| dir.join(rel))
            .collect();
        if chosen.is_empty() {
            return Err(format!(
                "no {side} trace file matches {glob:?} among the {} file(s) the traced rerun wrote ({})",
                written.len(),
                if written.is_empty() {
                    "none: does the test trace with FASTVIDEO_TRACE_* and FVD_TRACE_DIR?"
                        .to_string()
                } else {
                    written.join(", ")
                }
            ));
        }
        Ok(chosen)
    };
    let reference = pick("reference", &spec.reference)?;
    let port = pick("port", &spec.port)?;
    crate::compare(&reference, &port, &spec.options()?).map_err(|e| e.to_string())
}

/// `*` and `?` glob over `/`-separated relative paths; neither crosses a `/`.
pub fn glob_match(glob: &str, path: &str) -> bool {
    let (g, p): (Vec<char>, Vec<char>) = (glob.chars().collect(), path.chars().collect());
    // Iterative wildcard match with one backtrack point per `*`.
    let (mut gi, mut pi) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while pi < p.len() {
        if gi < g.len() && (g[gi] == p[pi] || (g[gi] == '?' && p[pi] != '/')) {
            gi += 1;
            pi += 1;
        } else if gi < g.len() && g[gi] == '*' {
            star = Some((gi, pi));
            gi += 1;
        } else if let Some((sg, sp)) = star
            && p[sp] != '/'
        {
            star = Some((sg, sp + 1));
            gi = sg + 1;
            pi = sp + 1;
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|c| *c == '*')
}

/// The report as JSON of at most about `max` bytes: whole when it fits,
/// else only the rows around the first divergence (or the first rows),
/// with a `rows_trimmed` diagnostic saying which were kept.
pub fn trimmed_json(rep: &Report, max: usize) -> String {
    let full = serde_json::to_string(rep).unwrap_or_default();
    if full.len() <= max {
        return full;
    }
    let mut r = rep.clone();
    let at = r.rows.iter().position(|row| row.diverged).unwrap_or(0);
    let (lo, hi) = (
        at.saturating_sub(TRIM_CONTEXT_ROWS),
        (at + TRIM_CONTEXT_ROWS + 1).min(r.rows.len()),
    );
    let total = r.rows.len();
    r.rows = r.rows[lo..hi].to_vec();
    r.diagnostics.push(Diagnostic::new(
        "rows_trimmed",
        format!(
            "kept rows {lo}..{hi} of {total} around the first divergence; the traced run's files hold the rest"
        ),
    ));
    serde_json::to_string(&r).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_stay_inside_one_folder_level() {
        assert!(glob_match("port_rank*.jsonl", "port_rank0.jsonl"));
        assert!(glob_match("ref/rank?.jsonl", "ref/rank1.jsonl"));
        assert!(glob_match("*/*.jsonl", "ref/a.jsonl"));
        assert!(!glob_match("*.jsonl", "ref/a.jsonl"));
        assert!(!glob_match("port_rank*.jsonl", "reference_rank0.jsonl"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*b*c", "axxbyy"));
    }

    fn rec(module: &str, a: f64) -> String {
        format!(
            "{{\"module\": \"{module}\", \"tensor\": \"out\", \"step\": 0, \"abs_mean\": {a}, \"shape\": [2, 2], \"rank\": 0, \"world_size\": 1}}\n"
        )
    }

    #[test]
    fn a_folder_compares_the_files_its_globs_pick() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("reference_rank0.jsonl"),
            rec("b.0", 1.0) + &rec("b.1", 1.0),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("port_rank0.jsonl"),
            rec("b.0", 1.0) + &rec("b.1", 1.5),
        )
        .unwrap();
        let spec = FolderSpec {
            reference: "reference_rank*.jsonl".into(),
            port: "port_rank*.jsonl".into(),
            ..FolderSpec::default()
        };
        let written = vec![
            "port_rank0.jsonl".to_string(),
            "reference_rank0.jsonl".to_string(),
        ];
        let rep = compare_folder(dir.path(), &written, &spec).unwrap();
        assert_eq!(rep.first_divergence.unwrap().port_module, "b.1");

        let err = compare_folder(dir.path(), &written[..1], &spec).unwrap_err();
        assert!(
            err.contains("no reference trace file matches \"reference_rank*.jsonl\" among the 1 file(s) the traced rerun wrote (port_rank0.jsonl)"),
            "{err}"
        );
        let bad = FolderSpec {
            steps: Some("x".into()),
            ..spec
        };
        let err = compare_folder(dir.path(), &written, &bad).unwrap_err();
        assert!(err.starts_with("trace steps: "), "{err}");
    }

    #[test]
    fn an_oversized_report_keeps_the_rows_around_the_divergence() {
        let mut ref_side = String::new();
        let mut port_side = String::new();
        for i in 0..2_000 {
            ref_side.push_str(&rec(&format!("m.{i}"), 1.0));
            port_side.push_str(&rec(&format!("m.{i}"), if i >= 500 { 2.0 } else { 1.0 }));
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("r.jsonl"), ref_side).unwrap();
        std::fs::write(dir.path().join("p.jsonl"), port_side).unwrap();
        let spec = FolderSpec {
            reference: "r.jsonl".into(),
            port: "p.jsonl".into(),
            ..FolderSpec::default()
        };
        let rep = compare_folder(dir.path(), &["p.jsonl".into(), "r.jsonl".into()], &spec).unwrap();
        let whole = trimmed_json(&rep, usize::MAX);
        let json = trimmed_json(&rep, 64 * 1024);
        assert!(
            json.len() < 64 * 1024 && json.len() < whole.len(),
            "{}",
            json.len()
        );
        let back: Report = serde_json::from_str(&json).unwrap();
        assert_eq!(back.rows.len(), 2 * TRIM_CONTEXT_ROWS + 1);
        assert!(back.rows.iter().any(|row| row.diverged));
        assert_eq!(back.diagnostics.last().unwrap().code, "rows_trimmed");
        assert_eq!(back.first_divergence, rep.first_divergence);
    }
}
