//! Stable ids of `PORT_STATUS.md` rows: `Q###` open questions, `I###`
//! issues and blockers, `E###` escape hatches. Ids are never reused, so a
//! handoff can cite one and a reader can still find it after it resolves.

use std::fmt;
use std::str::FromStr;

/// Which table an id belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IdKind {
    Question,
    Issue,
    EscapeHatch,
}

impl IdKind {
    pub fn prefix(self) -> char {
        match self {
            IdKind::Question => 'Q',
            IdKind::Issue => 'I',
            IdKind::EscapeHatch => 'E',
        }
    }
}

/// A stable id such as `Q001`: one letter and at least three digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StableId {
    pub kind: IdKind,
    pub number: u32,
}

impl StableId {
    pub fn new(kind: IdKind, number: u32) -> Self {
        Self { kind, number }
    }

    /// The id after this one, for appending a row.
    pub fn next(self) -> Self {
        Self::new(self.kind, self.number + 1)
    }
}

impl fmt::Display for StableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:03}", self.kind.prefix(), self.number)
    }
}

/// Why a string is not a stable id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid stable id; expected Q###, I### or E### (three or more digits)")]
pub struct IdError;

impl FromStr for StableId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().trim_matches('`');
        let mut chars = s.chars();
        let kind = match chars.next() {
            Some('Q') => IdKind::Question,
            Some('I') => IdKind::Issue,
            Some('E') => IdKind::EscapeHatch,
            _ => return Err(IdError),
        };
        let digits = chars.as_str();
        if digits.len() < 3 || !digits.chars().all(|c| c.is_ascii_digit()) {
            return Err(IdError);
        }
        digits
            .parse()
            .map(|number| StableId { kind, number })
            .map_err(|_| IdError)
    }
}

/// Every well-formed id appearing as a word in `text`.
pub fn find_ids(text: &str) -> Vec<StableId> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter_map(|w| w.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_ids() {
        let q: StableId = "Q001".parse().unwrap();
        assert_eq!(q, StableId::new(IdKind::Question, 1));
        assert_eq!(q.next().to_string(), "Q002");
        assert_eq!(
            "`E012`".parse::<StableId>().unwrap().kind,
            IdKind::EscapeHatch
        );
        assert_eq!("I1234".parse::<StableId>().unwrap().number, 1234);
        for bad in ["Q1", "X001", "Q00a", "", "I", "E-001"] {
            assert!(bad.parse::<StableId>().is_err(), "{bad}");
        }
        assert_eq!(find_ids("see E002, I010 and Q1").len(), 2);
    }
}
