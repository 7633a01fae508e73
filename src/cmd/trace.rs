//! `fvd trace …`: offline activation-trace and tensor-dump comparison.
//!
//! Exit codes: 0 a match (rows compared, none diverged, no comparator check
//! distrusts the comparison), 1 divergence, an untrusted comparison or
//! nothing compared, 2 bad input (an `Err` here; `main` prints it and exits
//! 2). Clap's own usage errors also exit 2.

use super::exit::Exit;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use fvd_trace::dumps::{DumpOptions, compare_dumps};
use fvd_trace::{CompareOptions, MergeOptions, ShapeIndex, compare, merge_ranks, read_side};

#[derive(Debug, Subcommand)]
pub enum TraceCmd {
    /// Find the first divergence between a reference trace and a port trace.
    Compare(CompareArgs),
    /// Merge the per-rank traces of one run into one trace.
    Merge(MergeArgs),
    /// Compare full-tensor dumps (safetensors files or folders of .npy files).
    Dumps(DumpsArgs),
    /// Show a component's stored drill-down investigation (from a port).
    Show(super::trace_show::ShowArgs),
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Reference trace (several files: the ranks of one run).
    #[arg(long, num_args = 1.., required = true)]
    pub reference: Vec<PathBuf>,
    /// Port trace (several files: the ranks of one run).
    #[arg(long, num_args = 1.., required = true)]
    pub port: Vec<PathBuf>,
    /// `REGEX=>TEMPLATE` rewriting port module names into reference names; applied in order.
    #[arg(long = "rename", value_name = "REGEX=>TEMPLATE")]
    pub rename: Vec<String>,
    /// `STAT=REL` or `MODULE_REGEX:STAT=REL` (REL may be `off`); later ones win.
    #[arg(long = "tol", value_name = "STAT=REL")]
    pub tol: Vec<String>,
    /// Only reference modules matching this regex.
    #[arg(long, value_name = "REGEX")]
    pub layers: Option<String>,
    /// Only these steps, comma-separated (`null` for rows without a step).
    #[arg(long, value_name = "LIST")]
    pub steps: Option<String>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Write a drift plot (SVG).
    #[arg(long, value_name = "OUT.svg")]
    pub plot: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The rank files of one run.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// A full (unsharded) trace giving the full shapes, to infer the sharded
    /// dim when shard shapes are equal.
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// Rename rules mapping these files' module names to the reference's
    /// (used for the shape lookup only; output keeps the files' names).
    #[arg(long = "rename", value_name = "REGEX=>TEMPLATE")]
    pub rename: Vec<String>,
    /// Output JSONL.
    #[arg(short = 'o', long = "output", value_name = "OUT.jsonl")]
    pub output: PathBuf,
}

#[derive(Debug, Args)]
pub struct DumpsArgs {
    /// Reference dump: a .safetensors file or a folder of .npy files.
    pub a: PathBuf,
    /// Port dump.
    pub b: PathBuf,
    /// `REGEX=>TEMPLATE` applied to the module part of the port's keys.
    #[arg(long = "rename", value_name = "REGEX=>TEMPLATE")]
    pub rename: Vec<String>,
    /// Reference trace whose row order is the execution order.
    #[arg(long, value_name = "TRACE.jsonl")]
    pub order: Option<PathBuf>,
    /// Dim along which per-token cosine is computed (and the token checks run).
    #[arg(long, value_name = "N")]
    pub token_dim: Option<usize>,
    /// Dim of the per-channel check of the first divergent tensor (default: the last).
    #[arg(long, value_name = "N")]
    pub channel_dim: Option<usize>,
    /// A tensor diverges below this cosine.
    #[arg(long, default_value_t = fvd_trace::dumps::DEFAULT_MIN_COSINE)]
    pub min_cosine: f64,
    /// A tensor diverges above this rel_diff (1 − 2Σxy/Σ(x²+y²)).
    #[arg(long, default_value_t = fvd_trace::dumps::DEFAULT_MAX_REL_DIFF)]
    pub max_rel_diff: f64,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: TraceCmd) -> anyhow::Result<Exit> {
    match cmd {
        TraceCmd::Compare(a) => run_compare(a),
        TraceCmd::Merge(a) => run_merge(a),
        TraceCmd::Dumps(a) => run_dumps(a),
        TraceCmd::Show(a) => super::trace_show::show(a),
    }
}

fn run_compare(a: CompareArgs) -> anyhow::Result<Exit> {
    let opts = CompareOptions {
        rename: a.rename,
        tolerances: a.tol,
        layers: a.layers,
        steps: a
            .steps
            .as_deref()
            .map(fvd_trace::parse_steps)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--steps: {e}"))?,
        merge: MergeOptions::default(),
    };
    // A comparison run by an agent or a test joins the port's trace: the
    // worker gives them TRACEPARENT, FVD_FAMILY and FVD_COMPONENT.
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let span = fvd_telemetry::spans::trace_comparison(
        &tracing::Span::none(),
        &var("FVD_FAMILY"),
        &var("FVD_COMPONENT"),
    );
    fvd_telemetry::set_parent(&span, &var(fvd_telemetry::TRACEPARENT));
    let report = span.in_scope(|| compare(&a.reference, &a.port, &opts))?;
    fvd_telemetry::spans::first_divergence(
        &span,
        report.rows.len() as u64,
        report
            .first_divergence
            .as_ref()
            .map(|f| fvd_telemetry::spans::Divergence {
                port_module: &f.port_module,
                reference_module: &f.reference_module,
                stat: &f.stat,
            }),
    );
    drop(span);
    if let Some(path) = &a.plot {
        std::fs::write(path, fvd_trace::plot::render_svg(&report))
            .with_context(|| format!("cannot write plot {}", path.display()))?;
    }
    if a.json {
        let out = std::io::stdout();
        let mut w = std::io::BufWriter::new(out.lock());
        serde_json::to_writer(&mut w, &report)?;
        std::io::Write::write_all(&mut w, b"\n")?;
    } else {
        print!("{}", report.render_text());
    }
    Ok(Exit::success_if(report.verdict.passed()))
}

fn run_merge(a: MergeArgs) -> anyhow::Result<Exit> {
    let renamer = fvd_trace::Renamer::parse(&a.rename)?;
    let shapes = match &a.reference {
        Some(r) => Some(ShapeIndex::from_records(&fvd_trace::read_trace(r)?)),
        None => None,
    };
    let mut files = read_side(&a.files)?;
    for f in &mut files {
        fvd_trace::compare::rename_records(&mut f.records, &renamer);
    }
    let mut merged = merge_ranks(files, shapes.as_ref(), &MergeOptions::default());
    for r in &mut merged.records {
        if let Some(orig) = r.original_module.take() {
            r.module = orig;
        }
    }
    fvd_trace::write_trace(&a.output, &merged.records)?;
    for d in &merged.diagnostics {
        eprintln!("fvd: [{}] {}", d.code, d.message);
    }
    Ok(Exit::Success)
}

fn run_dumps(a: DumpsArgs) -> anyhow::Result<Exit> {
    let opts = DumpOptions {
        rename: a.rename,
        order: a.order,
        token_dim: a.token_dim,
        channel_dim: a.channel_dim,
        min_cosine: a.min_cosine,
        max_rel_diff: a.max_rel_diff,
    };
    let report = compare_dumps(&a.a, &a.b, &opts)?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.render_text());
    }
    Ok(Exit::success_if(report.verdict.passed()))
}
