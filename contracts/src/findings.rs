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

/// Characters of one key of a field path echoed in a finding; a longer
/// key (a 10 KB unknown key is still one line of input) is cut with `…`.
pub const MAX_KEY_CHARS: usize = 64;
/// Characters of a whole field path, for paths of many short keys.
const MAX_FIELD_CHARS: usize = 4 * MAX_KEY_CHARS;

impl Finding {
    /// A finding; keys of `field` longer than [`MAX_KEY_CHARS`] are cut.
    pub fn new(line: usize, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            line,
            field: cut_field(field.into()),
            message: message.into(),
        }
    }
}

/// `field` with each dotted key, and the whole, cut to a readable length.
fn cut_field(field: String) -> String {
    fn cut(s: &str, max: usize) -> String {
        let mut out: String = s.chars().take(max).collect();
        out.push('…');
        out
    }
    if field.chars().count() <= MAX_KEY_CHARS {
        return field;
    }
    let keys: Vec<String> = field
        .split('.')
        .map(|k| {
            if k.chars().count() > MAX_KEY_CHARS {
                cut(k, MAX_KEY_CHARS)
            } else {
                k.to_owned()
            }
        })
        .collect();
    let joined = keys.join(".");
    if joined.chars().count() > MAX_FIELD_CHARS {
        cut(&joined, MAX_FIELD_CHARS)
    } else {
        joined
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_keys_are_cut_in_findings() {
        let f = Finding::new(3, "prep_handoff.model_family", "m");
        assert_eq!(f.field, "prep_handoff.model_family");
        let key = "k".repeat(10_000);
        let f = Finding::new(3, format!("prep_handoff.{key}"), "m");
        assert_eq!(
            f.field,
            format!("prep_handoff.{}…", "k".repeat(MAX_KEY_CHARS))
        );
        let block = format!("model_family: x\n{key}: 1\n");
        let found = crate::kind::check_block(crate::ContractKind::PrepHandoff, &block, 1);
        let unknown = found
            .iter()
            .find(|f| f.message == "unknown field for this contract")
            .expect("the unknown key is reported");
        assert_eq!(unknown.line, 2);
        assert_eq!(unknown.field, format!("{}…", "k".repeat(MAX_KEY_CHARS)));
        let dotted = "a.".repeat(5_000);
        let f = Finding::new(3, dotted, "m");
        assert_eq!(f.field.chars().count(), MAX_FIELD_CHARS + 1);
    }
}
