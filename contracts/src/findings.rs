//! Findings: what a check reports about a contract block or a
//! `PORT_STATUS.md`, each pinned to a line and a field so a porter can jump
//! straight to the problem.

use std::fmt;

use serde::Serialize;

/// One problem found in a contract or status file.
///
/// `line` is 1-based and counts lines of the text that was checked (the whole
/// file when the CLI checks a markdown file); `0` means the problem concerns
/// the input as a whole. Messages are lowercase, carry no trailing period and
/// never repeat a value that looked like a secret.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Finding {
    pub line: usize,
    pub field: String,
    pub message: String,
}

impl Finding {
    pub fn new(line: usize, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            line,
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.line, self.field, self.message)
    }
}

/// Shifts every finding by `offset` lines, for blocks cut out of a larger file.
pub fn shift(findings: &mut [Finding], offset: usize) {
    for f in findings {
        if f.line > 0 {
            f.line += offset;
        }
    }
}

/// Errors of the typed parsers: the text could not become the requested type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContractError {
    /// The block parsed but did not fit the contract; the findings say where.
    #[error("{kind} does not match its contract: {} finding(s), first at line {}: {}", .findings.len(), first_line(.findings), first_message(.findings))]
    Invalid {
        kind: &'static str,
        findings: Vec<Finding>,
    },
    /// A kind name that fvd does not know.
    #[error("unknown contract kind `{0}`")]
    UnknownKind(String),
}

impl ContractError {
    /// The findings behind the error, empty for an unknown kind.
    pub fn findings(&self) -> &[Finding] {
        match self {
            ContractError::Invalid { findings, .. } => findings,
            ContractError::UnknownKind(_) => &[],
        }
    }
}

fn first_line(findings: &[Finding]) -> usize {
    findings.first().map_or(0, |f| f.line)
}

fn first_message(findings: &[Finding]) -> String {
    findings
        .first()
        .map_or_else(String::new, |f| format!("{}: {}", f.field, f.message))
}
