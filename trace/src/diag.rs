//! Diagnostics: short coded findings that go into every report next to the
//! numbers (`{code, message}`), plus a collector that folds repeats of the
//! same code into one line, since a 200,000-row trace can trip the same
//! condition on every row.

use serde::{Deserialize, Serialize};

/// One finding. `code` is stable and machine-readable; `message` is for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnostic {
    pub code: String,
    pub message: String,
}

impl Diagnostic {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Diagnostic {
            code: code.to_string(),
            message: message.into(),
        }
    }
}

/// Collects diagnostics, keeping the first message of each code and a count.
#[derive(Debug, Default)]
pub struct Collector {
    entries: Vec<(Diagnostic, usize)>,
}

impl Collector {
    pub fn push(&mut self, code: &str, message: impl Into<String>) {
        if let Some(e) = self.entries.iter_mut().find(|(d, _)| d.code == code) {
            e.1 += 1;
        } else {
            self.entries.push((Diagnostic::new(code, message), 1));
        }
    }

    pub fn extend(&mut self, other: Vec<Diagnostic>) {
        for d in other {
            self.entries.push((d, 1));
        }
    }

    pub fn finish(self) -> Vec<Diagnostic> {
        self.entries
            .into_iter()
            .map(|(mut d, n)| {
                if n > 1 {
                    d.message = format!("{} (and {} more like it)", d.message, n - 1);
                }
                d
            })
            .collect()
    }
}
