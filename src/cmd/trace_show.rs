//! `fvd trace show FAMILY COMPONENT`: the latest drill-down investigation
//! of a component as the port's trace actor stored it — the first
//! divergence, the path of layer regexes that led there, and the final
//! comparison report with its diagnostics. Reads `REPO/.fvd/state.db`, or
//! asks an orchestrator with `--orchestrator`.

use super::exit::Exit;
use std::fmt::Write as _;

use clap::Args;
use fvd_store::states::TraceOutcome;
use fvd_store::traces::TraceInvestigation;

use super::server::runtime;
use super::source::{Source, Target};

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The port's family.
    pub family: String,
    /// The traced component.
    pub component: String,
    /// Print the investigation (steps and their reports) as one JSON object.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

pub fn show(args: ShowArgs) -> anyhow::Result<Exit> {
    let rt = runtime()?;
    let inv = consistent(rt.block_on(fetch(&args))?);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&inv)?);
    } else {
        print!("{}", render(&inv));
    }
    Ok(Exit::Success)
}

async fn fetch(args: &ShowArgs) -> anyhow::Result<TraceInvestigation> {
    let mut source = Source::open(&args.target, Some(&args.family)).await?;
    source.trace_report(&args.family, &args.component).await
}

/// The investigation as both views print it, so that the JSON says what
/// the text says. Each stored report is settled: one stored before
/// `fvd_trace::diag::PRECEDENCE` may hold findings another one explains,
/// and those go. A drill-down that ended at a leaf offers no next trace:
/// its last report's `drill_down` is the scope that step traced (that is
/// how the trace actor knew it was done), so it is cleared there.
pub fn consistent(mut inv: TraceInvestigation) -> TraceInvestigation {
    let last = inv.steps.iter().rposition(|st| st.report.is_some());
    for (i, st) in inv.steps.iter_mut().enumerate() {
        let Some(value) = st.report.as_mut() else {
            continue;
        };
        // A report that does not parse is shown as stored (the text says so).
        let Ok(mut report) = serde_json::from_value::<fvd_trace::Report>(value.clone()) else {
            continue;
        };
        report.settle();
        if Some(i) == last && inv.outcome == TraceOutcome::Leaf {
            report.drill_down = None;
            report.drill_down_reference = None;
        }
        let settled = serde_json::to_value(&report).unwrap_or_default();
        for key in [
            "verdict",
            "signatures",
            "diagnostics",
            "drill_down",
            "drill_down_reference",
        ] {
            value[key] = settled[key].clone();
        }
    }
    inv
}

/// The text view: headline, summary, drill path, then the last report.
/// Expects [`consistent`]'s investigation.
pub fn render(inv: &TraceInvestigation) -> String {
    let mut s = String::new();
    let outcome = match inv.outcome.as_str() {
        "" => "in progress".to_string(),
        o => o.to_string(),
    };
    let _ = writeln!(
        s,
        "{} / {}: trace of run {} ({outcome}, {} step{})",
        inv.family,
        inv.component,
        inv.job_id,
        inv.steps.len(),
        if inv.steps.len() == 1 { "" } else { "s" }
    );
    if !inv.summary.is_empty() {
        let _ = writeln!(s, "{}", inv.summary);
    }
    let _ = writeln!(s, "\ndrill path:");
    for st in &inv.steps {
        let found = if !st.error.is_empty() {
            format!("failed: {}", st.error)
        } else if st.report.is_none() {
            "running".to_string()
        } else if let Some(kinds) = untrusted(st.report.as_ref()) {
            format!("comparison untrusted ({kinds})")
        } else if st.first_module.is_empty() {
            "no divergence".to_string()
        } else {
            format!("first divergence {}", st.first_module)
        };
        // What was not recorded is left out, not printed empty.
        let reference = if st.reference_layers.is_empty() {
            String::new()
        } else {
            format!("  (reference {})", st.reference_layers)
        };
        let run = if st.job_id.is_empty() {
            "run not recorded".to_string()
        } else {
            format!("run {}", st.job_id)
        };
        let _ = writeln!(
            s,
            "  {}. FASTVIDEO_TRACE_LAYERS={}{reference}\n     {run}: {found}",
            st.step, st.layers
        );
        let t = &st.transport;
        if !t.compared_on.is_empty() {
            let _ = writeln!(
                s,
                "     compared on {} in {} ms: {} bytes in {} file(s), {} bytes on the wire",
                t.compared_on, t.compare_ms, t.files_bytes, t.files, t.wire_bytes
            );
        }
    }
    let last = inv
        .steps
        .iter()
        .rev()
        .find_map(|st| st.report.as_ref().map(|r| (st.step, r)));
    if let Some((step, value)) = last {
        match serde_json::from_value::<fvd_trace::Report>(value.clone()) {
            Ok(report) => {
                let _ = writeln!(s, "\nreport of step {step}:");
                s.push_str(&report.render_text());
                // Either the report offers a next trace or the drill-down is
                // done: `consistent` cleared a leaf's, never both.
                if inv.outcome == TraceOutcome::Leaf && report.drill_down.is_none() {
                    let _ = writeln!(
                        s,
                        "\ndrill-down done: the first divergence is a leaf of step {step}'s scope; nothing narrower to trace"
                    );
                }
            }
            Err(e) => {
                let _ = writeln!(s, "\nreport of step {step} does not parse: {e}");
            }
        }
    }
    s
}

/// The kinds of the checks that distrust a stored report, if any.
fn untrusted(report: Option<&serde_json::Value>) -> Option<String> {
    let kinds: Vec<&str> = report?["signatures"]
        .as_array()?
        .iter()
        .filter(|s| s["untrusted"] == true)
        .filter_map(|s| s["kind"].as_str())
        .collect();
    (!kinds.is_empty()).then(|| kinds.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fvd_store::traces::TraceStep;

    fn report(first: Option<(&str, f64)>, rows: &[(&str, f64)]) -> serde_json::Value {
        serde_json::json!({
            "first_divergence": first.map(|(m, d)| serde_json::json!({
                "reference_module": m.replace("blocks", "layers"),
                "port_module": m,
                "tensor": "out",
                "step": 0,
                "stat": "abs_mean",
                "reference": 0.8,
                "port": 0.8 * (1.0 + d),
                "drift": d,
                "tolerance": 0.005,
            })),
            "rows": rows.iter().enumerate().map(|(i, (m, d))| serde_json::json!({
                "index": i,
                "reference_module": m.replace("blocks", "layers"),
                "port_module": m,
                "tensor": "out",
                "step": 0,
                "reference_shape": [16, 32],
                "port_shape": [16, 32],
                "drift": {"abs_mean": d, "max": d / 2.0},
                "exceeded": if *d > 0.005 { vec!["abs_mean"] } else { vec![] },
                "diverged": *d > 0.005,
                "exact": *d == 0.0,
            })).collect::<Vec<_>>(),
            "diagnostics": [{"code": "modules_only_on_one_side", "message": "1 port module has no reference row"}],
            "unmatched": {"reference": [], "port": []},
            "drill_down": first.map(|_| "^blocks\\.2(\\.|$)"),
            "drill_down_reference": first.map(|_| "^layers\\.2(\\.|$)"),
            "exact_steps": [],
            "tolerances": {"abs_mean": 0.005, "max": 0.02},
        })
    }

    #[test]
    fn show_renders_the_drill_path_and_the_final_report() {
        let inv = TraceInvestigation {
            id: 1,
            family: "tinyport".into(),
            component: "refiner".into(),
            job_id: "tinyport.refiner.1".into(),
            state: fvd_store::states::TraceState::Done,
            outcome: TraceOutcome::Leaf,
            summary: "first divergence: blocks.2.norm abs_mean drift 0.310 (reference layers.2.norm, tensor out, step 0; first divergent leaf after 2 trace steps: ^blocks\\.\\d+$ -> ^blocks\\.2(\\.|$))".into(),
            started_ms: 0,
            finished_ms: Some(1),
            steps: vec![
                TraceStep {
                    step: 1,
                    layers: "^blocks\\.\\d+$".into(),
                    reference_layers: "^layers\\.\\d+$".into(),
                    job_id: "tinyport.refiner#trace.1".into(),
                    first_module: "blocks.2".into(),
                    report: Some(report(Some(("blocks.2", 0.2)), &[("blocks.0", 0.0), ("blocks.1", 1e-7), ("blocks.2", 0.2)])),
                    ..TraceStep::default()
                },
                TraceStep {
                    step: 2,
                    layers: "^blocks\\.2(\\.|$)".into(),
                    reference_layers: "^layers\\.2(\\.|$)".into(),
                    job_id: "tinyport.refiner#trace.2".into(),
                    first_module: "blocks.2.norm".into(),
                    report: Some(report(Some(("blocks.2.norm", 0.31)), &[("blocks.2.norm", 0.31), ("blocks.2.mlp.fc1", 0.25), ("blocks.2", 0.2)])),
                    ..TraceStep::default()
                },
            ],
        };
        insta::assert_snapshot!(render(&consistent(inv)));
    }

    /// The tinylm bug case of `tests/fixtures/traces` (block 2's second
    /// norm is broken) compared as a trace step of `layers` would be, in
    /// reference names; a narrowed step gets what the trace actor adds.
    fn fixture_report(layers: &str, narrowed: bool) -> serde_json::Value {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/traces");
        let renames = [
            r"^blocks\.(\d+)=>model.layers.$1",
            r"\.norm1$=>.attn_norm",
            r"\.norm2$=>.mlp_norm",
            r"\.attn$=>.self_attn",
            r"\.ffn(\.|$)=>.mlp$1",
            r"\.fc_in$=>.up_proj",
            r"\.fc_out$=>.down_proj",
        ];
        let mut r = fvd_trace::compare(
            &[dir.join("official.jsonl")],
            &[dir.join("port_bug.jsonl")],
            &fvd_trace::CompareOptions {
                rename: renames.iter().map(|r| r.to_string()).collect(),
                layers: Some(layers.into()),
                ..Default::default()
            },
        )
        .unwrap();
        if narrowed {
            // As stored before the precedence rule: every finding kept.
            r.diagnostics.push(fvd_trace::Diagnostic::new(
                "narrowed_scope",
                "this trace covers only ^blocks\\.2(\\.|$) (the previous step's first divergence was blocks.2, every module before it matched): diagnostics about inputs or the first block speak of this scope, not of the model",
            ));
        }
        serde_json::to_value(&r).unwrap()
    }

    /// The drill-down of the bug case to its leaf, as `fvd trace show`
    /// fetches it; step 2's report is `step2` (reference names).
    fn bug_drill_down(step2: &str) -> TraceInvestigation {
        let step = |n: u32, layers: &str, reference: &str, first: &str, report| TraceStep {
            step: n,
            layers: layers.into(),
            reference_layers: reference.into(),
            job_id: format!("tinylm.refiner#trace.{n}"),
            first_module: first.into(),
            report: Some(report),
            ..TraceStep::default()
        };
        TraceInvestigation {
            family: "tinylm".into(),
            component: "refiner".into(),
            job_id: "tinylm.refiner.1".into(),
            outcome: TraceOutcome::Leaf,
            steps: vec![
                step(
                    1,
                    "^blocks\\.\\d+$",
                    "^model\\.layers\\.\\d+$",
                    "blocks.2",
                    fixture_report("^model\\.layers\\.\\d+$", false),
                ),
                step(
                    2,
                    "^blocks\\.2(\\.|$)",
                    "^model\\.layers\\.2(\\.|$)",
                    "blocks.2.norm2",
                    fixture_report(step2, true),
                ),
            ],
            ..TraceInvestigation::default()
        }
    }

    /// Issue 43 item 9: the leaf step's report listed `[inputs_differ]`,
    /// `[early_divergence]` and `[narrowed_scope]`, offered `next trace:` and
    /// then said `drill-down done`, and printed `step null`; text and JSON
    /// now say one thing.
    #[test]
    fn a_finished_drill_down_says_one_thing() {
        // Block 2 whole (its norm1 and attention match), and its MLP half
        // (every row diverges): both gave contradicting findings.
        for step2 in ["^model\\.layers\\.2(\\.|$)", "^model\\.layers\\.2\\.mlp"] {
            let inv = consistent(bug_drill_down(step2));
            let text = render(&inv);
            let report_text = text
                .split("report of step 2:")
                .nth(1)
                .unwrap_or_else(|| panic!("{text}"));
            assert!(report_text.contains("[narrowed_scope]"), "{text}");
            for gone in [
                "[inputs_differ]",
                "[early_divergence]",
                "next trace:",
                "null",
                "None",
            ] {
                assert!(!report_text.contains(gone), "{gone} in:\n{text}");
            }
            assert!(text.contains("\ndrill-down done: "), "{text}");
            assert!(
                text.contains("first divergence: blocks.2.norm2 (reference model.layers.2.mlp_norm) tensor out: abs_mean"),
                "{text}"
            );
            // The JSON says the same: one finding, no next trace at the leaf.
            let json = serde_json::to_value(&inv).unwrap();
            let last = &json["steps"][1]["report"];
            let codes: Vec<&str> = last["diagnostics"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["code"].as_str().unwrap())
                .collect();
            assert!(codes.contains(&"narrowed_scope"), "{codes:?}");
            assert!(
                !codes.contains(&"inputs_differ") && !codes.contains(&"early_divergence"),
                "{codes:?}"
            );
            assert!(
                last["drill_down"].is_null() && last["drill_down_reference"].is_null(),
                "{last}"
            );
            // Step 1's next trace was taken: it stays.
            assert_eq!(
                json["steps"][0]["report"]["drill_down"],
                "^blocks\\.2(\\.|$)"
            );
        }
    }

    /// A drill-down still under way offers its next trace and is not done.
    #[test]
    fn a_drill_down_under_way_is_not_done() {
        let mut inv = bug_drill_down("^model\\.layers\\.2(\\.|$)");
        inv.outcome = TraceOutcome::default();
        inv.steps.truncate(1);
        let text = render(&consistent(inv));
        assert!(
            text.contains("next trace: FASTVIDEO_TRACE_LAYERS='^blocks\\.2(\\.|$)'"),
            "{text}"
        );
        assert!(!text.contains("drill-down done"), "{text}");
    }

    #[test]
    fn a_failed_step_says_why() {
        let inv = TraceInvestigation {
            family: "p".into(),
            component: "c".into(),
            job_id: "p.c.3".into(),
            outcome: TraceOutcome::Error,
            summary: "trace step 1 failed: no port trace file matches".into(),
            steps: vec![TraceStep {
                step: 1,
                layers: "^a$".into(),
                reference_layers: "^a$".into(),
                job_id: "p.c#trace.1".into(),
                error: "no port trace file matches \"port_rank*.jsonl\"".into(),
                ..TraceStep::default()
            }],
            ..TraceInvestigation::default()
        };
        let text = render(&inv);
        assert!(
            text.starts_with("p / c: trace of run p.c.3 (error, 1 step)\n"),
            "{text}"
        );
        assert!(
            text.contains("run p.c#trace.1: failed: no port trace file matches"),
            "{text}"
        );
        assert!(!text.contains("report of step"), "{text}");
    }

    #[test]
    fn an_untrusted_step_is_not_called_a_match() {
        let mut rep = report(None, &[("blocks.0", 0.3), ("blocks.0.attn", 0.0)]);
        rep["verdict"] = "untrusted".into();
        rep["signatures"] = serde_json::json!([{
            "kind": "layer_shift",
            "evidence": {"prefix": "blocks", "tensor": "out", "step": 0, "offset": 1,
                "direction": "reference_ahead", "pairs": [[0, 1], [1, 2]], "probed": 2,
                "insides_compared": 2, "insides_matching": 2},
            "untrusted": true,
            "message": "port blocks.N:out matches reference blocks.N+1:out for N = 0, 1",
            "check": "the dumpers' indexing of block outputs",
        }]);
        let inv = TraceInvestigation {
            family: "p".into(),
            component: "c".into(),
            job_id: "p.c.1".into(),
            outcome: TraceOutcome::Untrusted,
            steps: vec![TraceStep {
                step: 1,
                layers: "^a$".into(),
                reference_layers: "^a$".into(),
                job_id: "p.c#trace.1".into(),
                report: Some(rep),
                ..TraceStep::default()
            }],
            ..TraceInvestigation::default()
        };
        let text = render(&inv);
        assert!(
            text.contains("run p.c#trace.1: comparison untrusted (layer_shift)"),
            "{text}"
        );
        assert!(!text.contains("no divergence"), "{text}");
        assert!(
            text.contains("comparator checks:\n  [layer_shift] (untrusted) port blocks.N:out"),
            "{text}"
        );
    }
}
