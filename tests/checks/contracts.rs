//! `fvd contracts check` over one set of status files and contract
//! templates, laid out like `tests/fixtures` (status files and a
//! `contracts/` folder of templates under one root).

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use super::fvd;

/// One set of contract inputs and the facts about it the checks rely on.
#[derive(Debug, Clone)]
pub struct ContractFiles {
    /// Every other path is relative to this folder.
    pub root: PathBuf,
    /// A finished port's status file that follows the contract.
    pub complete: &'static str,
    pub family: &'static str,
    pub phase: &'static str,
    /// `(name, parity)` of every Component Matrix row of `complete`.
    pub components: &'static [(&'static str, &'static str)],
    /// Line and field of the one finding of the final handoff embedded in
    /// `complete`.
    pub final_handoff_finding: (u64, &'static str),
    /// Text in `complete` (a Parity cell and its closing pipe) to replace
    /// with a token, the component index of that row and the row's line.
    pub leak: (&'static str, usize, u64),
    /// A status file that barely follows the contract, and the line of its
    /// Decisions section (bullets where the contract has a table).
    pub sparse: &'static str,
    pub sparse_decisions_line: u64,
    /// Every status file and the exit code of checking it.
    pub status_files: &'static [(&'static str, i32)],
    /// Line of `model_family` in `contracts/prep_handoff.md`.
    pub prep_placeholder_line: u64,
    /// Line of `component` in the retry request of
    /// `contracts/conversion_request.md`.
    pub retry_placeholder_line: u64,
}

/// Runs `fvd contracts check ARGS…` in `dir`.
pub fn check_in(dir: &Path, args: &[&str]) -> Output {
    fvd()
        .current_dir(dir)
        .arg("contracts")
        .arg("check")
        .args(args)
        .output()
        .expect("run fvd")
}

pub fn code(o: &Output) -> i32 {
    o.status.code().expect("fvd exited by signal")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("utf-8 stdout")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("utf-8 stderr")
}

impl ContractFiles {
    fn check(&self, args: &[&str]) -> Output {
        check_in(&self.root, args)
    }
}

/// The complete file is valid; its JSON summary has the family, the phase
/// and every component with its parity. Returns the JSON for a snapshot.
pub fn complete_status_summary(c: &ContractFiles) -> String {
    let o = c.check(&[c.complete, "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(v["kind"], "port_status");
    assert_eq!(v["valid"], true);
    assert_eq!(v["findings"], Value::Array(vec![]));
    assert_eq!(v["summary"]["model_family"], c.family);
    assert_eq!(v["summary"]["phase"], c.phase);
    assert_eq!(v["summary"]["status"], "complete");
    let comps = v["summary"]["components"].as_array().expect("components");
    let pairs: Vec<(&str, &str)> = comps
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["parity"].as_str().unwrap()))
        .collect();
    assert_eq!(pairs, c.components);
    stdout(&o)
}

/// The same file given by absolute path from another directory.
pub fn complete_status_by_absolute_path(c: &ContractFiles) {
    let elsewhere = tempfile::tempdir().unwrap();
    let path = c.root.join(c.complete);
    let o = check_in(elsewhere.path(), &[path.to_str().unwrap(), "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        v["summary"]["components"].as_array().unwrap().len(),
        c.components.len()
    );
}

/// The sparse file: every missing section and the Decisions bullets are
/// reported, nothing is summarised. Returns the human report for a snapshot.
pub fn sparse_status_lists_what_the_contract_misses(c: &ContractFiles) -> String {
    let o = c.check(&[c.sparse]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains(&format!(
        "{}:0: Component Matrix: missing required section `## Component Matrix`\n",
        c.sparse
    )));
    assert!(out.contains(&format!(
        "{}:{}: Decisions: missing table",
        c.sparse, c.sparse_decisions_line
    )));

    let o = c.check(&[c.sparse, "--json"]);
    assert_eq!(code(&o), 1);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["valid"], false);
    assert_eq!(v["summary"]["model_family"], Value::Null);
    assert_eq!(v["summary"]["components"], Value::Array(vec![]));
    let f = &v["findings"][0];
    assert!(f["line"].is_u64() && f["field"].is_string() && f["message"].is_string());
    out
}

/// Every status file is checked with its exit code and nothing on stderr.
pub fn every_status_file_is_checked_without_error(c: &ContractFiles) {
    for (file, want) in c.status_files {
        let o = c.check(&[file]);
        assert_eq!(code(&o), *want, "{file}: {}{}", stdout(&o), stderr(&o));
        assert!(stderr(&o).is_empty(), "{file}: {}", stderr(&o));
    }
}

/// A template is never valid: placeholders are named with their lines, and
/// the second fence of the conversion request is the retry request.
pub fn templates_fail_on_placeholders(c: &ContractFiles) {
    let o = c.check(&["contracts/prep_handoff.md"]);
    assert_eq!(code(&o), 1);
    let out = stdout(&o);
    assert!(
        out.contains(&format!(
            "contracts/prep_handoff.md:{}: model_family: placeholder copied from the template",
            c.prep_placeholder_line
        )),
        "{out}"
    );
    assert!(out.ends_with("finding(s) in prep_handoff\n"));
    let o = c.check(&[
        "contracts/conversion_request.md",
        "--kind",
        "conversion_retry_request",
    ]);
    assert_eq!(code(&o), 1);
    assert!(
        stdout(&o).contains(&format!(
            "contracts/conversion_request.md:{}: conversion_retry_request.component: placeholder",
            c.retry_placeholder_line
        )),
        "{}",
        stdout(&o)
    );
}

/// `--kind final_handoff` checks the block embedded in the complete file,
/// with the file's line numbers.
pub fn embedded_final_handoff_is_checked_with_file_lines(c: &ContractFiles) {
    let o = c.check(&[c.complete, "--kind", "final_handoff", "--json"]);
    assert_eq!(code(&o), 1);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["kind"], "final_handoff");
    let findings = v["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{findings:#?}");
    let (line, field) = c.final_handoff_finding;
    assert_eq!(findings[0]["line"], line);
    assert_eq!(findings[0]["field"], field);
    let message = findings[0]["message"].as_str().unwrap();
    assert!(
        message.contains("expected one of reused | ported"),
        "{message}"
    );
}

/// Every contract document in `contracts/` is read as its contract and is
/// never valid (they are templates). `port_state.md` describes the status
/// file inside a fence, so it is a status file only when asked to be.
pub fn every_contract_template_is_recognised_and_never_valid(c: &ContractFiles) {
    let contracts = c.root.join("contracts");
    let o = check_in(&contracts, &["port_state.md"]);
    assert_eq!(code(&o), 2, "{}", stdout(&o));
    assert!(
        stderr(&o).contains("no contract block found"),
        "{}",
        stderr(&o)
    );
    let o = check_in(&contracts, &["port_state.md", "--kind", "port_state"]);
    assert_eq!(code(&o), 1);
    assert!(stdout(&o).ends_with("port_state.md: 10 finding(s) in port_status\n"));
    for (file, kind) in [
        ("prep_handoff.md", "prep_handoff"),
        ("port_status_template.md", "port_status"),
        ("escape_hatch.md", "escape_hatch"),
        ("component_context.md", "component_context"),
        ("parity_status.md", "parity_status"),
        ("conversion_request.md", "conversion_request"),
        ("conversion_handoff.md", "conversion_handoff"),
        ("component_skill_handoff.md", "component_skill_handoff"),
        ("pipeline_context.md", "pipeline_context"),
        ("pipeline_handoff.md", "pipeline_handoff"),
        ("final_handoff.md", "final_handoff"),
    ] {
        let o = check_in(&contracts, &[file, "--json"]);
        assert_eq!(code(&o), 1, "{file}: {}{}", stdout(&o), stderr(&o));
        let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(v["kind"], kind, "{file}");
        assert_eq!(v["valid"], false, "{file}");
    }
}

/// A token pasted into a Parity cell is reported by line and masked in the
/// summary; its value is never printed.
pub fn tokens_in_a_status_file_are_masked_in_the_summary(c: &ContractFiles) {
    let token = format!("hf_{}", "Pw4".repeat(11));
    let original = std::fs::read_to_string(c.root.join(c.complete)).unwrap();
    let (cell, index, line) = c.leak;
    let leaked = original.replacen(cell, &format!("{token} |"), 1);
    assert_ne!(leaked, original, "{cell} is not in {}", c.complete);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("PORT_STATUS.md"), leaked).unwrap();
    let o = check_in(dir.path(), &["PORT_STATUS.md", "--json"]);
    assert_eq!(code(&o), 1);
    let out = stdout(&o);
    assert!(!out.contains(&token), "{out}");
    assert!(!stderr(&o).contains(&token));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["summary"]["components"][index]["parity"], "[redacted]");
    assert_eq!(v["findings"][0]["field"], "table row");
    assert_eq!(v["findings"][0]["line"], line);
}
