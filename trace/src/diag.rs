//! Diagnostics: short coded findings that go into every report next to the
//! numbers (`{code, message}`), plus a collector that folds repeats of the
//! same code into one line, since a 200,000-row trace can trip the same
//! condition on every row, and the precedence among findings that exclude
//! each other ([`explained_away`]).

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

/// Which finding explains which others. A comparison says one thing about
/// where its divergence comes from, so when findings that exclude each
/// other fire together the one that explains the divergence stays and the
/// ones it explains go (from the diagnostics, and a signature of that kind
/// with them). Rules apply in this order, each to what the ones above kept:
///
/// 1. `narrowed_scope` (the trace covers a scope inside the model, after a
///    step that saw every module before it match; the trace actor adds it):
///    every row diverging (`inputs_differ`) and a divergence at the first
///    traced block (`early_divergence`) only say where the scope starts,
///    not that the model's inputs differ or its first block is wrong.
/// 2. `inputs_differ` (a comparator check, or every compared row diverging):
///    a divergence at the first row or the first block is what different
///    inputs produce, not a second finding: `early_divergence` goes.
///
/// `nothing_compared` needs no rule: with no row compared, no finding about
/// rows fires.
pub const PRECEDENCE: [(&str, &[&str]); 2] = [
    ("narrowed_scope", &["inputs_differ", "early_divergence"]),
    ("inputs_differ", &["early_divergence"]),
];

/// The codes among `diagnostics` that a finding of higher precedence
/// explains ([`PRECEDENCE`]), and which therefore are not findings of
/// their own.
pub fn explained_away(diagnostics: &[Diagnostic]) -> Vec<&'static str> {
    let present = |gone: &[&str], code: &str| {
        !gone.contains(&code) && diagnostics.iter().any(|d| d.code == code)
    };
    let mut gone: Vec<&'static str> = Vec::new();
    for (winner, explains) in PRECEDENCE {
        if present(&gone, winner) {
            for code in explains {
                if present(&gone, code) {
                    gone.push(code);
                }
            }
        }
    }
    gone
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diags(codes: &[&str]) -> Vec<Diagnostic> {
        codes.iter().map(|c| Diagnostic::new(c, "m")).collect()
    }

    #[test]
    fn a_narrowed_scope_explains_inputs_and_an_early_divergence() {
        let all = diags(&[
            "inputs_differ",
            "early_divergence",
            "narrowed_scope",
            "dtype_differs",
        ]);
        assert_eq!(explained_away(&all), ["inputs_differ", "early_divergence"]);
    }

    #[test]
    fn inputs_that_differ_explain_an_early_divergence() {
        let all = diags(&["inputs_differ", "early_divergence", "exact_steps"]);
        assert_eq!(explained_away(&all), ["early_divergence"]);
        assert!(explained_away(&diags(&["early_divergence"])).is_empty());
        assert!(explained_away(&diags(&["narrowed_scope", "no_exact_row"])).is_empty());
    }
}
