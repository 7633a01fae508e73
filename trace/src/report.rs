//! The result of a trace comparison: serializable as one JSON object (what
//! `fvd trace compare --json` prints and what an orchestrator stores) and
//! renderable as a short text report for people.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::diag::Diagnostic;
use crate::signature::Signature;

/// What a comparison concludes. Only `match` is a success: a comparison
/// of nothing, or one a comparator check does not trust, fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Rows were compared and none diverged.
    #[default]
    Match,
    /// A first divergence is named.
    Diverged,
    /// A comparator check says the comparison cannot be read (a dumper's
    /// block index off by one, inputs that differ): see `signatures`.
    Untrusted,
    /// No row (tensor) has a counterpart on the other side.
    NothingCompared,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Match => "match",
            Verdict::Diverged => "diverged",
            Verdict::Untrusted => "untrusted",
            Verdict::NothingCompared => "nothing_compared",
        }
    }

    /// The one success.
    pub fn passed(self) -> bool {
        self == Verdict::Match
    }

    pub(crate) fn of(compared: usize, signatures: &[Signature], diverged: bool) -> Self {
        if compared == 0 {
            Verdict::NothingCompared
        } else if signatures.iter().any(|s| s.untrusted) {
            Verdict::Untrusted
        } else if diverged {
            Verdict::Diverged
        } else {
            Verdict::Match
        }
    }
}

/// The verdict line of a comparison that is not a plain match or
/// divergence, and the diagnostic codes it already shows.
pub(crate) fn untrusted_line(
    signatures: &[Signature],
    first: Option<&FirstDivergence>,
    what: &str,
) -> String {
    let mut kinds: Vec<&str> = signatures
        .iter()
        .filter(|s| s.untrusted)
        .map(|s| s.kind())
        .collect();
    kinds.dedup();
    match first {
        Some(fd) => format!(
            "comparison untrusted ({}): the first difference, {} (reference {}) {}, is not a verdict on the port; fix what the checks above name and compare again",
            kinds.join(", "),
            fd.port_module,
            fd.reference_module,
            fd.tensor
        ),
        None => format!(
            "comparison untrusted ({}): no first divergence is named; the {what} may all be right; fix what the checks above name and compare again",
            kinds.join(", ")
        ),
    }
}

/// Whether `d` is already shown above the diagnostics list (a signature's
/// mirror, or the nothing-compared line).
pub(crate) fn shown_above(d: &Diagnostic, signatures: &[Signature]) -> bool {
    d.code == "nothing_compared"
        || signatures
            .iter()
            .any(|s| s.kind() == d.code && s.message == d.message)
}

/// The first row, in the reference's execution order, beyond tolerance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstDivergence {
    pub reference_module: String,
    pub port_module: String,
    pub tensor: String,
    pub step: Option<i64>,
    /// The stat that diverged most relative to its tolerance (`shape` for a
    /// shape mismatch).
    pub stat: String,
    pub reference: serde_json::Value,
    pub port: serde_json::Value,
    /// Relative drift of `stat` (null for a shape mismatch).
    pub drift: Option<f64>,
    pub tolerance: Option<f64>,
}

/// Drift per stat of one row, serialized as a JSON object. A small vector
/// with static names for the known stats: a report can hold hundreds of
/// thousands of rows, and a map of owned strings per row was a visible cost.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Drifts(pub Vec<(Cow<'static, str>, f64)>);

impl Drifts {
    pub fn get(&self, stat: &str) -> Option<f64> {
        self.0.iter().find(|(k, _)| k == stat).map(|(_, v)| *v)
    }

    pub fn insert(&mut self, stat: &str, value: f64) {
        let name = match crate::record::KNOWN_STATS.iter().find(|k| **k == stat) {
            Some(k) => Cow::Borrowed(*k),
            None => Cow::Owned(stat.to_string()),
        };
        self.0.push((name, value));
    }
}

impl Serialize for Drifts {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k.as_ref(), v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Drifts {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, Option<f64>>::deserialize(deserializer)?;
        Ok(Drifts(
            map.into_iter()
                .map(|(k, v)| (Cow::Owned(k), v.unwrap_or(f64::NAN)))
                .collect(),
        ))
    }
}

/// One aligned row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Position of the row in the (merged) reference trace.
    pub index: usize,
    pub reference_module: String,
    pub port_module: String,
    pub tensor: String,
    pub step: Option<i64>,
    pub reference_shape: Option<Vec<u64>>,
    pub port_shape: Option<Vec<u64>>,
    /// Relative drift of every numeric stat both sides have.
    pub drift: Drifts,
    /// Stats beyond tolerance (`shape` included).
    pub exceeded: Vec<String>,
    pub diverged: bool,
    /// Every common stat and the shape are bit-identical.
    pub exact: bool,
}

/// A module present on one side only, with the closest names on the other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unmatched {
    pub module: String,
    /// For a port module: its name after the rename rules, when they changed it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub renamed: Option<String>,
    pub nearest: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct UnmatchedSides {
    pub reference: Vec<Unmatched>,
    pub port: Vec<Unmatched>,
}

/// Everything `compare` found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// What the comparison concludes; written for JSON readers (Rust code
    /// calls [`Report::assess`], which also works on reports stored before
    /// this field existed).
    #[serde(default)]
    pub verdict: Verdict,
    /// Comparator checks that fired, before any verdict is read; each is
    /// also the first of the `diagnostics` with its kind as code.
    #[serde(default)]
    pub signatures: Vec<Signature>,
    /// Null when the comparison is untrusted because of a dumper's layer
    /// shift: the model is not shown to diverge.
    pub first_divergence: Option<FirstDivergence>,
    pub rows: Vec<Row>,
    pub diagnostics: Vec<Diagnostic>,
    pub unmatched: UnmatchedSides,
    /// Regex (port names, for `FASTVIDEO_TRACE_LAYERS`) of the next,
    /// narrower trace: the block holding the first divergence.
    pub drill_down: Option<String>,
    /// The same scope in reference names, for the upstream harness.
    pub drill_down_reference: Option<String>,
    /// Steps whose rows all match bit for bit.
    pub exact_steps: Vec<Option<i64>>,
    /// The global tolerance of each compared stat.
    pub tolerances: BTreeMap<String, f64>,
}

impl Report {
    pub fn diverged(&self) -> bool {
        self.first_divergence.is_some()
    }

    /// The verdict, computed from the report's contents. Nothing compared
    /// is read from the finding [`compare`](fn@crate::compare) puts first when no row
    /// aligned (a stored report may have been trimmed of its rows).
    pub fn assess(&self) -> Verdict {
        let nothing = self
            .diagnostics
            .iter()
            .any(|d| d.code == "nothing_compared");
        Verdict::of(
            usize::from(!nothing),
            &self.signatures,
            self.first_divergence.is_some(),
        )
    }

    /// Sets `verdict` from the contents (after a change to them), and
    /// drops the findings another one explains ([`crate::diag::PRECEDENCE`]):
    /// a caller that adds a finding settles the report, so that its JSON
    /// says one thing, as its text does.
    pub fn settle(&mut self) {
        self.drop_explained();
        self.verdict = self.assess();
    }

    /// Drops the diagnostics (and signatures of their kind) that a finding
    /// of higher precedence explains.
    pub(crate) fn drop_explained(&mut self) {
        let gone = crate::diag::explained_away(&self.diagnostics);
        if !gone.is_empty() {
            self.diagnostics
                .retain(|d| !gone.contains(&d.code.as_str()));
            self.signatures.retain(|s| !gone.contains(&s.kind()));
        }
    }

    /// Removes the signatures of `kind` and their diagnostics (a caller
    /// that knows they do not apply, e.g. an input check on a trace that
    /// starts inside the model), and settles the verdict again.
    pub fn drop_signatures(&mut self, kind: &str) {
        let gone: Vec<String> = self
            .signatures
            .iter()
            .filter(|s| s.kind() == kind)
            .map(|s| s.message.clone())
            .collect();
        self.signatures.retain(|s| s.kind() != kind);
        self.diagnostics
            .retain(|d| !(d.code == kind && gone.contains(&d.message)));
        self.settle();
    }

    /// The regex for the next trace, in the port's module names.
    pub fn drill_down(&self) -> Option<&str> {
        self.drill_down.as_deref()
    }

    /// A short text report: comparator checks, verdict, the rows around the
    /// first divergence, diagnostics, unmatched modules, drill-down.
    /// A stored report may predate [`crate::diag::PRECEDENCE`]: what a
    /// finding explains is left out here too.
    pub fn render_text(&self) -> String {
        let gone = crate::diag::explained_away(&self.diagnostics);
        let signatures: Vec<Signature> = self
            .signatures
            .iter()
            .filter(|s| !gone.contains(&s.kind()))
            .cloned()
            .collect();
        let mut s = crate::signature::render(&signatures);
        let nothing = self
            .diagnostics
            .iter()
            .any(|d| d.code == "nothing_compared");
        let verdict = Verdict::of(
            usize::from(!nothing),
            &signatures,
            self.first_divergence.is_some(),
        );
        match (verdict, &self.first_divergence) {
            (Verdict::NothingCompared, _) => {
                let why = self
                    .diagnostics
                    .iter()
                    .find(|d| d.code == "nothing_compared")
                    .map_or("no row has a counterpart on the other side", |d| {
                        d.message.as_str()
                    });
                let _ = writeln!(s, "nothing compared: {why}");
            }
            (Verdict::Untrusted, fd) => {
                let _ = writeln!(
                    s,
                    "{}",
                    untrusted_line(&signatures, fd.as_ref(), "model's blocks")
                );
            }
            (_, None) => {
                let _ = writeln!(s, "no divergence: {} rows compared", self.rows.len());
            }
            (_, Some(fd)) => {
                let drift = fd
                    .drift
                    .map_or(String::new(), |d| format!(", drift {}", pct(d)));
                // A row without a step says nothing of one.
                let step = fd.step.map_or(String::new(), |v| format!(" step {v}"));
                let _ = writeln!(
                    s,
                    "first divergence: {} (reference {}) tensor {}{step}: {} {} vs {}{}",
                    fd.port_module,
                    fd.reference_module,
                    fd.tensor,
                    fd.stat,
                    fd.reference,
                    fd.port,
                    drift
                );
            }
        }
        self.render_rows(&mut s);
        let rest: Vec<&Diagnostic> = self
            .diagnostics
            .iter()
            .filter(|d| !shown_above(d, &signatures) && !gone.contains(&d.code.as_str()))
            .collect();
        if !rest.is_empty() {
            let _ = writeln!(s, "\ndiagnostics:");
            for d in rest {
                let _ = writeln!(s, "  [{}] {}", d.code, d.message);
            }
        }
        for (side, list) in [
            ("reference", &self.unmatched.reference),
            ("port", &self.unmatched.port),
        ] {
            for u in list.iter().take(10) {
                let _ = writeln!(
                    s,
                    "only in {side}: {} (nearest: {})",
                    u.module,
                    u.nearest.join(", ")
                );
            }
        }
        if let Some(d) = &self.drill_down {
            let _ = writeln!(s, "\nnext trace: FASTVIDEO_TRACE_LAYERS='{d}'");
        }
        s
    }

    /// The table of rows: every row of a small trace, the rows around the
    /// first divergence of a big one. The step column is there only when a
    /// row has a step; a row without one, beside rows with one, shows `-`,
    /// which a line under the table explains.
    fn render_rows(&self, s: &mut String) {
        let stats: Vec<&String> = self.tolerances.keys().collect();
        let first = self.rows.iter().position(|r| r.diverged);
        let (lo, hi) = if self.rows.len() <= 80 {
            (0, self.rows.len())
        } else {
            let f = first.unwrap_or(0);
            (f.saturating_sub(5), (f + 6).min(self.rows.len()))
        };
        if hi <= lo {
            return;
        }
        let rows = &self.rows[lo..hi];
        let steps = rows.iter().any(|r| r.step.is_some());
        let _ = write!(s, "\n  {:<6} {:<40} {:<8}", "", "module", "tensor");
        if steps {
            let _ = write!(s, " {:>5}", "step");
        }
        for st in &stats {
            let _ = write!(s, " {:>10}", st);
        }
        let _ = writeln!(s);
        for row in rows {
            let mark = if row.diverged {
                "DIVERG"
            } else if row.exact {
                "exact"
            } else {
                "ok"
            };
            let _ = write!(s, "  {:<6} {:<40} {:<8}", mark, row.port_module, row.tensor);
            if steps {
                let step = row.step.map_or("-".to_string(), |v| v.to_string());
                let _ = write!(s, " {step:>5}");
            }
            for st in &stats {
                let v = row.drift.get(st).map_or("-".to_string(), pct);
                let _ = write!(s, " {:>10}", v);
            }
            if row.exceeded.iter().any(|e| e == "shape") {
                let _ = write!(
                    s,
                    "  shape {} vs {}",
                    shape_text(row.reference_shape.as_deref()),
                    shape_text(row.port_shape.as_deref())
                );
            }
            let _ = writeln!(s);
        }
        if steps && rows.iter().any(|r| r.step.is_none()) {
            let _ = writeln!(s, "  (step -: the row has no step recorded)");
        }
    }
}

/// A shape, or the words for a shape the trace did not record.
fn shape_text(shape: Option<&[u64]>) -> String {
    shape.map_or("not recorded".to_string(), |v| format!("{v:?}"))
}

fn pct(d: f64) -> String {
    if d == 0.0 {
        "0".to_string()
    } else {
        format!("{:.3}%", d * 100.0)
    }
}
