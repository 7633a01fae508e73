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
    let inv = rt.block_on(fetch(&args))?;
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

/// The text view: headline, summary, drill path, then the last report.
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
        let _ = writeln!(
            s,
            "  {}. FASTVIDEO_TRACE_LAYERS={}  (reference {})\n     run {}: {found}",
            st.step, st.layers, st.reference_layers, st.job_id
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
                // The report's own "next trace" is the scope just traced.
                if inv.outcome == TraceOutcome::Leaf {
                    let _ = writeln!(
                        s,
                        "(drill-down done: that scope was step {step}'s; nothing narrower to trace)"
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
        insta::assert_snapshot!(render(&inv));
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
