//! The variant table as text: one line per row for the agent's packet and
//! `fvd status`, the one-line note a blocked reason gets, the evidence
//! `PORT_STATUS.md` shows, and what a variant's row finds next to the
//! baseline. Pure functions of the stored rows; the variant actor
//! ([`crate::variant_actor`]) fills the table.

use fvd_store::model::RecordedVerdict;
use fvd_store::states::VariantFinding;
use fvd_store::variants::{BASELINE, VariantRow};

/// Longest note a blocked reason gets from the table.
const NOTE_CHARS: usize = 160;

/// `KEY=VALUE KEY=VALUE` of a row.
fn overrides(row: &VariantRow) -> String {
    row.env.join(" ")
}

/// The one-line note of a finished table: the variants that pass, then
/// those that move the first divergence; or that none did.
pub fn table_note(rows: &[VariantRow]) -> String {
    let variants: Vec<&VariantRow> = rows.iter().filter(|r| r.name != BASELINE).collect();
    let mut parts: Vec<String> = Vec::new();
    for r in variants
        .iter()
        .filter(|r| r.finding == VariantFinding::Passes)
    {
        parts.push(format!("passes with {} (variant {})", overrides(r), r.name));
    }
    for r in variants
        .iter()
        .filter(|r| r.finding == VariantFinding::Moves)
    {
        parts.push(format!(
            "with {} (variant {}) the first divergence moves to {}",
            overrides(r),
            r.name,
            r.first_divergence
        ));
    }
    let mut s = if parts.is_empty() {
        let traced = rows.iter().any(|r| !r.first_divergence.is_empty());
        format!(
            "no variant of {} passes{}",
            variants.len(),
            if traced {
                " or moves the first divergence"
            } else {
                ""
            }
        )
    } else {
        parts.join("; ")
    };
    if s.chars().count() > NOTE_CHARS {
        s = s.chars().take(NOTE_CHARS).collect::<String>() + "…";
    }
    s
}

/// One row as a line of the agent's packet and of `fvd status`.
pub fn row_text(r: &VariantRow) -> String {
    let mut s = r.name.clone();
    if !r.env.is_empty() {
        s.push_str(&format!(" ({})", overrides(r)));
    }
    s.push_str(&format!(
        ": {}",
        if r.verdict.is_none() {
            r.state.as_str()
        } else {
            r.verdict.as_str()
        }
    ));
    if !r.first_divergence.is_empty() {
        s.push_str(&format!(", first divergence {}", r.first_divergence));
        if let Some(d) = r.drift {
            s.push_str(&format!(" {} drift {d:.3}", r.stat));
        }
    } else if !r.trace_error.is_empty() {
        s.push_str(&format!(", no first divergence ({})", r.trace_error));
    }
    if !matches!(r.finding, VariantFinding::None | VariantFinding::Baseline)
        && r.finding.as_str() != r.verdict.as_str()
    {
        s.push_str(&format!(" [{}]", r.finding));
    }
    s
}

/// The table as the agent's packet shows it, one line per row.
pub fn table_text(rows: &[VariantRow]) -> String {
    rows.iter()
        .map(|r| format!("- {}", row_text(r)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The table as `PORT_STATUS.md` evidence: each variant's name and finding.
pub fn evidence_text(rows: &[VariantRow]) -> String {
    rows.iter()
        .filter(|r| r.name != BASELINE)
        .map(|r| {
            let finding = match r.finding {
                VariantFinding::None | VariantFinding::Other => r.verdict.as_str(),
                other => other.as_str(),
            };
            match (r.finding, r.first_divergence.is_empty()) {
                (VariantFinding::Moves, false) => {
                    format!("{} {finding} to {}", r.name, r.first_divergence)
                }
                _ => format!("{} {finding}", r.name),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a variant's row says next to the baseline: it passes, it moves the
/// first divergence, it keeps the same one, it is red (untraced), or it
/// ended otherwise.
pub fn finding(
    verdict: RecordedVerdict,
    variant: Option<&fvd_trace::FirstDivergence>,
    baseline: Option<&fvd_trace::FirstDivergence>,
) -> VariantFinding {
    match verdict {
        RecordedVerdict::NonSkipPass => VariantFinding::Passes,
        RecordedVerdict::DebugRed => match (variant, baseline) {
            (Some(v), Some(b)) if v.port_module != b.port_module => VariantFinding::Moves,
            (Some(_), Some(_)) => VariantFinding::Same,
            _ => VariantFinding::Red,
        },
        _ => VariantFinding::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fvd_store::states::VariantState as RowState;

    fn fd(m: &str) -> fvd_trace::FirstDivergence {
        fvd_trace::FirstDivergence {
            reference_module: m.into(),
            port_module: m.into(),
            tensor: "out".into(),
            step: Some(0),
            stat: "abs_mean".into(),
            reference: serde_json::json!(1.0),
            port: serde_json::json!(1.5),
            drift: Some(0.333),
            tolerance: Some(0.005),
        }
    }

    fn row(name: &str, env: &[&str], verdict: &str, finding: &str, first: &str) -> VariantRow {
        VariantRow {
            name: name.into(),
            env: env.iter().map(|e| e.to_string()).collect(),
            state: RowState::Done,
            verdict: verdict.parse().unwrap(),
            finding: finding.parse().unwrap(),
            first_divergence: first.into(),
            stat: if first.is_empty() { "" } else { "abs_mean" }.into(),
            drift: (!first.is_empty()).then_some(0.25),
            ..VariantRow::default()
        }
    }

    #[test]
    fn a_variant_passes_moves_keeps_or_is_red() {
        let (a, b) = (fd("blocks.2.norm"), fd("blocks.1.attn"));
        assert_eq!(
            finding(RecordedVerdict::NonSkipPass, None, Some(&a)),
            VariantFinding::Passes
        );
        assert_eq!(
            finding(RecordedVerdict::DebugRed, Some(&b), Some(&a)),
            VariantFinding::Moves
        );
        assert_eq!(
            finding(RecordedVerdict::DebugRed, Some(&a), Some(&a)),
            VariantFinding::Same
        );
        assert_eq!(
            finding(RecordedVerdict::DebugRed, None, None),
            VariantFinding::Red
        );
        assert_eq!(
            finding(RecordedVerdict::Timeout, None, Some(&a)),
            VariantFinding::Other
        );
    }

    #[test]
    fn the_note_names_what_passes_or_moves_and_the_table_every_row() {
        let rows = vec![
            row(BASELINE, &[], "debug_red", BASELINE, "blocks.2.norm"),
            row("eps_fix", &["EPS_FIX=1"], "non_skip_pass", "passes", ""),
            row(
                "fp32",
                &["FASTVIDEO_DTYPE=fp32"],
                "debug_red",
                "moves",
                "blocks.1.attn",
            ),
            row(
                "tf32_off",
                &["TF32=0"],
                "debug_red",
                "same",
                "blocks.2.norm",
            ),
        ];
        assert_eq!(
            table_note(&rows),
            "passes with EPS_FIX=1 (variant eps_fix); with FASTVIDEO_DTYPE=fp32 (variant fp32) the first divergence moves to blocks.1.attn"
        );
        assert_eq!(
            table_text(&rows),
            "- baseline: debug_red, first divergence blocks.2.norm abs_mean drift 0.250\n\
             - eps_fix (EPS_FIX=1): non_skip_pass [passes]\n\
             - fp32 (FASTVIDEO_DTYPE=fp32): debug_red, first divergence blocks.1.attn abs_mean drift 0.250 [moves]\n\
             - tf32_off (TF32=0): debug_red, first divergence blocks.2.norm abs_mean drift 0.250 [same]"
        );
        assert_eq!(
            evidence_text(&rows),
            "eps_fix passes, fp32 moves to blocks.1.attn, tf32_off same"
        );
        let none = vec![
            row(BASELINE, &[], "debug_red", BASELINE, ""),
            row("a", &["A=1"], "debug_red", "red", ""),
            row("b", &["B=1"], "timeout", "other", ""),
        ];
        assert_eq!(table_note(&none), "no variant of 2 passes");
        assert_eq!(evidence_text(&none), "a red, b timeout");
    }
}
