//! First-divergence comparison of two traces, in the reference's execution
//! order.
//!
//! Rows are aligned on `(module, tensor, step, n)` after the port's module
//! names went through the rename rules, and walked in the order they first
//! appear in the reference trace (never sorted: `layers.10` runs after
//! `layers.2`). A row diverges when the shapes differ or a compared stat
//! drifts beyond its tolerance, where drift is
//! `|a − b| / max(|a|, |b|, floor)`.
//!
//! The floor is what makes stats that sit near zero comparable: `mean` (and
//! `min`/`max`) use the row's `abs_mean` as floor, `sum` uses
//! `abs_mean × numel` (the row's L1 mass), so a sum of ±noise that happens
//! to land near zero does not read as a 100% drift. `abs_mean` and `std` are
//! plain relative.
//!
//! Default tolerances (shape exact, `abs_mean` 5e-3, `max` 2e-2) are
//! calibrated on the GPT-2 fixture: fp32-vs-bf16 noise reaches 1.4e-3 on
//! abs_mean and 8e-3 on max, one changed input token reaches 9e-3 / 3e-2,
//! and a real bug (a wrong norm epsilon) reaches 0.93.
//!
//! Before the first divergence is read, two comparator checks run
//! ([`crate::signature`]): `inputs_differ` (the first row in execution
//! order, the model's input, diverges) and `layer_shift` (block outputs
//! match the neighbouring block on the other side while their insides match
//! in place: the first divergence is then not named). A comparison with no
//! aligned row has verdict `nothing_compared`, never a success.

use std::path::PathBuf;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::diag::{Collector, Diagnostic};
use crate::error::TraceError;
use crate::hash::{FastMap, fast_map};
use crate::merge::{MergeOptions, ShapeIndex, merge_ranks, occurrences};
use crate::record::{Name, Record, StatValue, read_side};
use crate::rename::Renamer;
use crate::report::{FirstDivergence, Report, Row, Unmatched, UnmatchedSides, Verdict};
use crate::signature::{self, InputsDiffer, ShiftRow, Signature, block_of};

/// Tolerances applied when the caller gives none for a stat.
pub const DEFAULT_TOLERANCES: [(&str, f64); 2] = [("abs_mean", 5e-3), ("max", 2e-2)];

/// Options of [`compare`]. Everything is plain data (strings for rules and
/// regexes) so that an orchestrator can deserialize it from its own config.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct CompareOptions {
    /// `REGEX=>TEMPLATE` rules rewriting port module names into reference names.
    pub rename: Vec<String>,
    /// `STAT=REL` or `MODULE_REGEX:STAT=REL`; later entries win. `REL` may be
    /// `off` to stop comparing a stat.
    pub tolerances: Vec<String>,
    /// Only rows whose reference module name matches (regex search).
    pub layers: Option<String>,
    /// Only these steps (`None` inside selects rows without a step).
    pub steps: Option<Vec<Option<i64>>>,
    #[serde(skip)]
    pub merge: MergeOptions,
}

/// One tolerance rule.
#[derive(Debug, Clone)]
pub struct Tolerance {
    pub module: Option<Regex>,
    pub stat: String,
    pub rel: f64,
}

impl Tolerance {
    pub fn parse(spec: &str) -> Result<Self, TraceError> {
        let bad = |m: &str| TraceError::Option {
            option: spec.to_string(),
            message: m.to_string(),
        };
        let (left, value) = spec
            .rsplit_once('=')
            .ok_or_else(|| bad("expected STAT=REL or MODULE_REGEX:STAT=REL"))?;
        let rel = match value.trim() {
            "off" | "none" => f64::INFINITY,
            v => v
                .parse::<f64>()
                .map_err(|_| bad("tolerance is not a number"))?,
        };
        if rel.is_nan() || rel < 0.0 {
            return Err(bad("tolerance must be a non-negative number"));
        }
        let (module, stat) = match left.rsplit_once(':') {
            Some((re, stat)) => (Some(Regex::new(re).map_err(|e| bad(&e.to_string()))?), stat),
            None => (None, left),
        };
        let stat = stat.trim();
        if stat.is_empty() {
            return Err(bad("empty stat name"));
        }
        Ok(Tolerance {
            module,
            stat: stat.to_string(),
            rel,
        })
    }
}

/// Tolerance rules resolved per module.
#[derive(Debug, Clone)]
pub struct Tolerances {
    rules: Vec<Tolerance>,
    /// Every stat some rule mentions, in first-mention order (shape first).
    stats: Vec<String>,
}

impl Tolerances {
    pub fn parse(specs: &[String]) -> Result<Self, TraceError> {
        let mut rules: Vec<Tolerance> = DEFAULT_TOLERANCES
            .iter()
            .map(|(s, r)| Tolerance {
                module: None,
                stat: s.to_string(),
                rel: *r,
            })
            .collect();
        for s in specs {
            rules.push(Tolerance::parse(s)?);
        }
        let mut stats: Vec<String> = Vec::new();
        for r in &rules {
            if r.stat != "shape" && !stats.contains(&r.stat) {
                stats.push(r.stat.clone());
            }
        }
        Ok(Tolerances { rules, stats })
    }

    /// The tolerance of `stat` for `module`: the last matching rule.
    pub fn get(&self, module: &str, stat: &str) -> Option<f64> {
        self.rules
            .iter()
            .rev()
            .find(|r| r.stat == stat && r.module.as_ref().is_none_or(|m| m.is_match(module)))
            .map(|r| r.rel)
            .filter(|r| r.is_finite())
    }

    fn shape_checked(&self, module: &str) -> bool {
        // Shape is compared unless a rule turns it off.
        self.rules
            .iter()
            .rev()
            .find(|r| r.stat == "shape" && r.module.as_ref().is_none_or(|m| m.is_match(module)))
            .is_none_or(|r| r.rel.is_finite())
    }
}

/// Relative drift of one stat, with the floor described in the module doc.
pub fn drift(stat: &str, a: f64, b: f64, abs_mean: Option<f64>, numel: Option<u64>) -> f64 {
    if a == b || (a.is_nan() && b.is_nan()) {
        return 0.0;
    }
    if !a.is_finite() || !b.is_finite() {
        return f64::INFINITY;
    }
    let scale = abs_mean.unwrap_or(0.0).abs();
    let floor = match stat {
        "sum" => scale * numel.unwrap_or(1) as f64,
        "mean" | "min" | "max" => scale,
        _ => 0.0,
    };
    (a - b).abs() / a.abs().max(b.abs()).max(floor).max(f64::MIN_POSITIVE)
}

/// Compare the reference run (`reference`: the rank files of one run) with
/// the port run (`port`).
pub fn compare(
    reference: &[PathBuf],
    port: &[PathBuf],
    opts: &CompareOptions,
) -> Result<Report, TraceError> {
    if reference.is_empty() {
        return Err(TraceError::NoInput { side: "reference" });
    }
    if port.is_empty() {
        return Err(TraceError::NoInput { side: "port" });
    }
    let renamer = Renamer::parse(&opts.rename)?;
    // Validate options before reading possibly large files.
    Tolerances::parse(&opts.tolerances)?;
    if let Some(l) = &opts.layers {
        Regex::new(l).map_err(|e| TraceError::Option {
            option: l.clone(),
            message: e.to_string(),
        })?;
    }
    // Both sides are read at once: parsing is most of the work and the
    // reference would otherwise be parsed on one core while the other idles.
    let (ref_files, port_files) = std::thread::scope(|s| {
        let r = s.spawn(|| read_side(reference));
        let p = read_side(port);
        (r.join().expect("reference reader panicked"), p)
    });
    let ref_merged = merge_ranks(ref_files?, None, &opts.merge);
    let mut port_files = port_files?;
    for f in &mut port_files {
        rename_records(&mut f.records, &renamer);
    }
    let shapes = (port_files.len() > 1).then(|| ShapeIndex::from_records(&ref_merged.records));
    let port_merged = merge_ranks(port_files, shapes.as_ref(), &opts.merge);
    let mut diags = Collector::default();
    diags.extend(prefixed("reference", ref_merged.diagnostics));
    diags.extend(prefixed("port", port_merged.diagnostics));
    let merged_sides = reference.len() > 1 || port.len() > 1;
    let mut report = compare_records(&ref_merged.records, &port_merged.records, opts, diags)?;
    if merged_sides {
        // Merged stats are exact up to float rounding, so bit-identity is
        // not expected of them and its absence says nothing about inputs.
        for d in &mut report.diagnostics {
            if d.code == "no_exact_row" {
                d.message = "no compared row matches bit for bit; expected when a side is merged from rank shards (merged stats are exact only up to rounding)".to_string();
            }
        }
    }
    Ok(report)
}

fn prefixed(side: &str, diags: Vec<Diagnostic>) -> Vec<Diagnostic> {
    diags
        .into_iter()
        .map(|d| Diagnostic {
            code: d.code,
            message: format!("{side} merge: {}", d.message),
        })
        .collect()
}

/// Rewrite port module names into reference names, remembering the
/// original in `original_module`.
pub fn rename_records(records: &mut [Record], renamer: &Renamer) {
    if renamer.is_empty() {
        return;
    }
    let mut cache: FastMap<Name, Option<Name>> = fast_map(1024);
    for r in records {
        let new = match cache.get(&r.module) {
            Some(v) => v.clone(),
            None => {
                let renamed = renamer.apply(&r.module);
                let v = (renamed != *r.module).then(|| Name::from(renamed));
                cache.insert(r.module.clone(), v.clone());
                v
            }
        };
        if let Some(new) = new {
            let old = std::mem::replace(&mut r.module, new);
            r.original_module = Some(old);
        }
    }
}

fn port_name(r: &Record) -> &str {
    r.original_module.as_deref().unwrap_or(&r.module)
}

fn stat_json(v: Option<&StatValue>) -> serde_json::Value {
    match v {
        Some(StatValue::Num(x)) => serde_json::json!(x),
        Some(StatValue::Text(s)) => serde_json::Value::String(s.clone()),
        Some(StatValue::Other(o)) => o.clone(),
        None => serde_json::Value::Null,
    }
}

/// The regex for the next, narrower trace: the block (or top-level module)
/// holding `module` and everything under it.
fn drill_regex(module: &str) -> String {
    let scope = match block_of(module) {
        Some(("", idx)) => idx.to_string(),
        Some((prefix, idx)) => format!("{prefix}.{idx}"),
        None => module.to_string(),
    };
    format!("^{}(\\.|$)", regex::escape(&scope))
}

/// Compare already merged (and renamed) records.
pub fn compare_records(
    reference: &[Record],
    port: &[Record],
    opts: &CompareOptions,
    mut diags: Collector,
) -> Result<Report, TraceError> {
    let tols = Tolerances::parse(&opts.tolerances)?;
    let layers = match &opts.layers {
        Some(l) => Some(Regex::new(l).map_err(|e| TraceError::Option {
            option: l.clone(),
            message: e.to_string(),
        })?),
        None => None,
    };
    let keep = |r: &Record| {
        layers.as_ref().is_none_or(|re| re.is_match(&r.module))
            && opts.steps.as_ref().is_none_or(|s| s.contains(&r.step))
    };
    let mut a = align(reference, port, &tols, &keep);
    let unmatched = unmatched_lists(&a.unmatched_ref, &a.unmatched_port, reference, port);
    let steps = StepsExact::of(&a.rows);

    // Comparator checks, before any verdict is read.
    let mut signatures: Vec<Signature> = Vec::new();
    if opts.layers.is_none() {
        signatures.extend(inputs_differ_check(&a));
    }
    if let Some(sig) = layer_shift_check(&a, reference, port, &tols) {
        if sig.untrusted {
            // Not a verdict on the model: no first divergence, no drill-down.
            a.first = None;
            a.first_row = None;
        }
        signatures.push(sig);
    }

    // A signature explains rows that all diverge better than a guess does.
    diagnose_rows(&mut diags, &a, !signatures.is_empty());
    diagnose_coverage(&mut diags, &a, &unmatched, &steps);

    let verdict = Verdict::of(a.rows.len(), &signatures, a.first.is_some());
    // An untrusted comparison is not drilled into.
    let (drill_down, drill_down_reference) =
        match a.first.as_ref().filter(|_| verdict != Verdict::Untrusted) {
            Some(fd) => (
                Some(drill_regex(&fd.port_module)),
                Some(drill_regex(&fd.reference_module)),
            ),
            None => (None, None),
        };
    let mut report = Report {
        verdict,
        diagnostics: lead_diagnostics(diags.finish(), &signatures),
        signatures,
        first_divergence: a.first,
        rows: a.rows,
        unmatched,
        drill_down,
        drill_down_reference,
        exact_steps: steps.exact,
        tolerances: tols
            .stats
            .iter()
            .filter_map(|s| tols.get("", s).map(|t| (s.clone(), t)))
            .collect(),
    };
    // One finding where several exclude each other (`diag::PRECEDENCE`):
    // rows that all diverge already explain a divergence at the first block.
    report.drop_explained();
    Ok(report)
}

/// The rows of the two traces aligned in the reference's execution order,
/// and what the walk noticed on the way.
struct Alignment<'a> {
    rows: Vec<Row>,
    /// (reference record, port record) of each row, for the checks.
    pairs: Vec<(usize, usize)>,
    /// The first reference record the filters keep.
    first_kept: Option<usize>,
    /// Kept records with no counterpart on the other side.
    unmatched_ref: Vec<&'a Record>,
    unmatched_port: Vec<&'a Record>,
    first: Option<FirstDivergence>,
    /// The row of `first` in `rows`.
    first_row: Option<usize>,
    /// Distinct `(reference, port)` dtypes that differ, and in how many rows.
    dtype_pairs: Vec<(String, String)>,
    dtype_rows: usize,
    shape_mismatches: usize,
}

/// Walks the reference in execution order and compares each kept record
/// with its counterpart in the port (same module, tensor, step and
/// occurrence).
fn align<'a>(
    reference: &'a [Record],
    port: &'a [Record],
    tols: &Tolerances,
    keep: &dyn Fn(&Record) -> bool,
) -> Alignment<'a> {
    let port_occ = occurrences(port);
    let port_index: FastMap<(&str, &str, Option<i64>, u32), usize> = port
        .iter()
        .zip(&port_occ)
        .enumerate()
        .map(|(i, (r, n))| ((&*r.module, &*r.tensor, r.step, *n), i))
        .collect();
    let mut port_used = vec![false; port.len()];
    let mut a = Alignment {
        rows: Vec::new(),
        pairs: Vec::new(),
        first_kept: None,
        unmatched_ref: Vec::new(),
        unmatched_port: Vec::new(),
        first: None,
        first_row: None,
        dtype_pairs: Vec::new(),
        dtype_rows: 0,
        shape_mismatches: 0,
    };

    for (i, (r, n)) in reference.iter().zip(occurrences(reference)).enumerate() {
        let key = (&*r.module, &*r.tensor, r.step, n);
        if a.first_kept.is_none() && keep(r) {
            a.first_kept = Some(i);
        }
        let Some(&j) = port_index.get(&key) else {
            if keep(r) {
                a.unmatched_ref.push(r);
            }
            continue;
        };
        port_used[j] = true;
        if !keep(r) {
            continue;
        }
        let p = &port[j];
        let c = compare_pair(i, r, p, tols);
        if !c.shape_ok {
            a.shape_mismatches += 1;
        }
        a.note_dtypes(r, p);
        if c.row.diverged && a.first.is_none() {
            a.first_row = Some(a.rows.len());
            a.first = Some(first_divergence(r, p, &c, tols));
        }
        a.pairs.push((i, j));
        a.rows.push(c.row);
    }

    a.unmatched_port = port
        .iter()
        .zip(&port_used)
        .filter(|(r, used)| !**used && keep(r))
        .map(|(r, _)| r)
        .collect();
    a
}

impl Alignment<'_> {
    fn note_dtypes(&mut self, r: &Record, p: &Record) {
        if let (Some(a), Some(b)) = (&r.dtype, &p.dtype)
            && a != b
        {
            self.dtype_rows += 1;
            if !self.dtype_pairs.contains(&(a.to_string(), b.to_string())) {
                self.dtype_pairs.push((a.to_string(), b.to_string()));
            }
        }
    }
}

/// One aligned pair compared.
struct Compared {
    row: Row,
    /// The shapes agree (or the module's shape is not checked).
    shape_ok: bool,
    /// The stat furthest beyond its tolerance: `(stat, drift, drift / tolerance)`.
    worst: Option<(String, f64, f64)>,
}

/// Compares reference record `r` (at `index`) with its port counterpart `p`.
fn compare_pair(index: usize, r: &Record, p: &Record, tols: &Tolerances) -> Compared {
    let shape_ok = match (&r.shape, &p.shape) {
        (Some(a), Some(b)) => a == b || !tols.shape_checked(&r.module),
        _ => true,
    };
    let s = stat_drifts(r, p, tols);
    let exact = s.exact && s.any_common && r.shape == p.shape;
    let diverged = !shape_ok || s.worst.is_some();
    let exceeded = if !shape_ok {
        vec!["shape".to_string()]
    } else {
        tols.stats
            .iter()
            .filter(|st| {
                matches!((tols.get(&r.module, st), s.drifts.get(st)), (Some(t), Some(d)) if d > t)
            })
            .cloned()
            .collect()
    };
    Compared {
        row: Row {
            index,
            reference_module: r.module.to_string(),
            port_module: port_name(p).to_string(),
            tensor: r.tensor.to_string(),
            step: r.step,
            reference_shape: r.shape.clone(),
            port_shape: p.shape.clone(),
            drift: s.drifts,
            exceeded,
            diverged,
            exact,
        },
        shape_ok,
        worst: s.worst,
    }
}

/// The stats both records have, compared.
struct StatDrifts {
    drifts: crate::report::Drifts,
    /// Every common stat is bit-identical.
    exact: bool,
    /// The records have a stat in common.
    any_common: bool,
    worst: Option<(String, f64, f64)>,
}

fn stat_drifts(r: &Record, p: &Record, tols: &Tolerances) -> StatDrifts {
    let abs_mean = match (r.stat_f64("abs_mean"), p.stat_f64("abs_mean")) {
        (Some(a), Some(b)) => Some(a.abs().max(b.abs())),
        (a, b) => a.or(b),
    };
    let numel = r.element_count().or(p.element_count());
    let mut s = StatDrifts {
        drifts: crate::report::Drifts::default(),
        exact: true,
        any_common: false,
        worst: None,
    };
    for (name, rv) in r.stats.iter() {
        let Some(pv) = p.stat(name) else { continue };
        s.any_common = true;
        match (&rv, &pv) {
            (&StatValue::Num(a), &StatValue::Num(b)) => {
                let same = a == b || (a.is_nan() && b.is_nan());
                s.exact &= same;
                let d = drift(name, a, b, abs_mean, numel);
                s.drifts.insert(name, d);
                if let Some(tol) = tols.get(&r.module, name)
                    && d > tol
                {
                    let ratio = if tol > 0.0 { d / tol } else { f64::INFINITY };
                    if s.worst.as_ref().is_none_or(|w| ratio > w.2) {
                        s.worst = Some((name.to_string(), d, ratio));
                    }
                }
            }
            _ => s.exact &= rv == pv,
        }
    }
    s
}

/// The first divergence at the pair `c` compared: its shape, or its worst
/// stat.
fn first_divergence(r: &Record, p: &Record, c: &Compared, tols: &Tolerances) -> FirstDivergence {
    if !c.shape_ok {
        return FirstDivergence {
            reference_module: r.module.to_string(),
            port_module: port_name(p).to_string(),
            tensor: r.tensor.to_string(),
            step: r.step,
            stat: "shape".to_string(),
            reference: serde_json::json!(r.shape),
            port: serde_json::json!(p.shape),
            drift: None,
            tolerance: None,
        };
    }
    let (stat, d, _) = c.worst.clone().expect("diverged on a stat");
    FirstDivergence {
        reference_module: r.module.to_string(),
        port_module: port_name(p).to_string(),
        tensor: r.tensor.to_string(),
        step: r.step,
        reference: stat_json(r.stat(&stat).as_ref()),
        port: stat_json(p.stat(&stat).as_ref()),
        tolerance: tols.get(&r.module, &stat),
        stat,
        drift: Some(d),
    }
}

/// The steps of the rows in execution order, and those whose rows all
/// match bit for bit.
struct StepsExact {
    order: Vec<Option<i64>>,
    exact: Vec<Option<i64>>,
}

impl StepsExact {
    fn of(rows: &[Row]) -> Self {
        let mut order: Vec<Option<i64>> = Vec::new();
        let mut step_exact: FastMap<Option<i64>, bool> = fast_map(16);
        for row in rows {
            match step_exact.get_mut(&row.step) {
                Some(e) => *e &= row.exact,
                None => {
                    order.push(row.step);
                    step_exact.insert(row.step, row.exact);
                }
            }
        }
        let exact = order.iter().copied().filter(|s| step_exact[s]).collect();
        StepsExact { order, exact }
    }
}

/// `inputs_differ`: the reference's first row, the model's input, diverges
/// (then it is the first divergence). A filtered or block-scoped trace
/// starts inside the model: no such check (the caller runs it only without
/// `--layers`).
fn inputs_differ_check(a: &Alignment<'_>) -> Option<Signature> {
    let (Some(row), Some(fd)) = (a.rows.first(), &a.first) else {
        return None;
    };
    if !row.diverged || Some(row.index) != a.first_kept || block_of(&row.reference_module).is_some()
    {
        return None;
    }
    let what = match fd.drift {
        Some(d) => format!("{} drift {} beyond tolerance", fd.stat, pct(d)),
        None => format!("{} {} vs {}", fd.stat, fd.reference, fd.port),
    };
    let (stat, value, threshold) = (fd.stat.clone(), fd.drift, fd.tolerance);
    Some(signature::inputs_differ(
        InputsDiffer {
            reference: row.reference_module.clone(),
            port: row.port_module.clone(),
            step: row.step,
            stat,
            value,
            threshold,
        },
        &what,
    ))
}

/// `layer_shift`: block outputs match the neighbouring block on the other
/// side while their insides match in place.
fn layer_shift_check(
    a: &Alignment<'_>,
    reference: &[Record],
    port: &[Record],
    tols: &Tolerances,
) -> Option<Signature> {
    let shift_rows: Vec<ShiftRow<'_>> = a
        .rows
        .iter()
        .map(|r| ShiftRow {
            module: &r.reference_module,
            tensor: &r.tensor,
            step: r.step,
            diverged: r.diverged,
        })
        .collect();
    signature::layer_shift::<std::convert::Infallible>(&shift_rows, |p, r| {
        Ok(stats_match(
            &reference[a.pairs[r].0],
            &port[a.pairs[p].1],
            tols,
        ))
    })
    .unwrap_or_else(|never| match never {})
}

/// What the compared rows say about the comparison itself: nothing
/// compared, every row diverging (unless a signature explains it,
/// `inputs_checked`), no row exact, an early first divergence, shapes and
/// dtypes that differ.
fn diagnose_rows(diags: &mut Collector, a: &Alignment<'_>, inputs_checked: bool) {
    let rows = &a.rows;
    let compared = rows.len();
    let diverged_rows = rows.iter().filter(|r| r.diverged).count();
    if compared == 0 {
        diags.push(
            "nothing_compared",
            "no row of the reference has a counterpart in the port: check the rename rules, --layers and --steps",
        );
    }
    if compared >= 2 && diverged_rows == compared && !inputs_checked {
        diags.push(
            "inputs_differ",
            format!(
                "every compared row diverges, the first one ({}) included: the two sides do not start from identical inputs or weights; verify inputs and run a weight diff before reading layers",
                rows[0].reference_module
            ),
        );
    } else if compared > 0 && !rows.iter().any(|r| r.exact) {
        let why = if a.dtype_pairs.is_empty() {
            "with identical dtypes this usually means the inputs are not bit-identical".to_string()
        } else {
            "expected here since the dtypes differ".to_string()
        };
        diags.push(
            "no_exact_row",
            format!("no compared row matches bit for bit; {why}"),
        );
    }
    if let (Some(fd), Some(fi)) = (&a.first, a.first_row)
        && is_early(rows, fd, fi)
    {
        diags.push(
            "early_divergence",
            format!(
                "the first divergence ({}) is at the first block or before it: look at the embedding, adapters, modality dispatch, coordinate embedding and packing before attention or MLP",
                fd.port_module
            ),
        );
    }
    if a.shape_mismatches > 0 {
        diags.push(
            "shape_mismatch",
            format!("{} aligned rows have different shapes", a.shape_mismatches),
        );
    }
    if !a.dtype_pairs.is_empty() {
        let pairs: Vec<String> = a
            .dtype_pairs
            .iter()
            .map(|(r, p)| format!("{r} vs {p}"))
            .collect();
        diags.push(
            "dtype_differs",
            format!(
                "{} rows have different dtypes ({}): expect dtype noise",
                a.dtype_rows,
                pairs.join(", ")
            ),
        );
    }
}

/// Whether the first divergence `fd` (row `fi`) is in the first block of
/// its step or before any block.
fn is_early(rows: &[Row], fd: &FirstDivergence, fi: usize) -> bool {
    let step_rows: Vec<&Row> = rows.iter().filter(|r| r.step == fd.step).collect();
    let first_block = step_rows
        .iter()
        .find_map(|r| block_of(&r.reference_module).map(|b| (b.0.to_string(), b.1.to_string())));
    let pos = step_rows
        .iter()
        .position(|r| std::ptr::eq(*r, &rows[fi]))
        .unwrap_or(0);
    let first_block_pos = step_rows
        .iter()
        .position(|r| block_of(&r.reference_module).is_some());
    match (block_of(&fd.reference_module), &first_block) {
        (Some((p, i)), Some((fp, fi))) => p == fp && i == fi,
        (None, _) => first_block_pos.is_some_and(|b| pos < b),
        _ => false,
    }
}

/// What one side has that the other lacks, and the steps that match bit
/// for bit.
fn diagnose_coverage(
    diags: &mut Collector,
    a: &Alignment<'_>,
    unmatched: &UnmatchedSides,
    steps: &StepsExact,
) {
    if !unmatched.reference.is_empty() {
        diags.push(
            "only_in_reference",
            format!(
                "{} modules are only in the reference (first: {}); add --rename rules or check the trace regex",
                unmatched.reference.len(),
                unmatched.reference[0].module
            ),
        );
    }
    if !unmatched.port.is_empty() {
        diags.push(
            "only_in_port",
            format!(
                "{} modules are only in the port (first: {})",
                unmatched.port.len(),
                unmatched.port[0].module
            ),
        );
    }
    if !steps.exact.is_empty() && steps.order.iter().any(|s| s.is_some()) {
        // Rows without a step are named in words, never as a null step.
        let list: Vec<String> = steps.exact.iter().flatten().map(i64::to_string).collect();
        let mut what = match list.len() {
            0 => String::new(),
            1 => format!("step {}", list[0]),
            _ => format!("steps {}", list.join(", ")),
        };
        if steps.exact.contains(&None) {
            if !what.is_empty() {
                what.push_str(" and ");
            }
            what.push_str("the rows without a step");
        }
        let tail = match a.first.as_ref().map(|fd| fd.step) {
            Some(Some(step)) => format!("; the first divergence is at step {step}"),
            Some(None) => "; the first divergence is in a row without a step".to_string(),
            None => String::new(),
        };
        diags.push("exact_steps", format!("{what} match bit for bit{tail}"));
    }
}

fn pct(d: f64) -> String {
    format!("{:.3}%", d * 100.0)
}

/// Diagnostics in the order a reader needs them: `nothing_compared` first,
/// then one per signature, then the rest.
pub(crate) fn lead_diagnostics(rest: Vec<Diagnostic>, signatures: &[Signature]) -> Vec<Diagnostic> {
    let (mut out, rest): (Vec<Diagnostic>, Vec<Diagnostic>) =
        rest.into_iter().partition(|d| d.code == "nothing_compared");
    out.extend(signatures.iter().map(Signature::diagnostic));
    out.extend(rest);
    out
}

/// Whether the port record `p` matches the reference record `r` within the
/// tolerances of `r`'s module (None: nothing comparable, or other shapes).
fn stats_match(r: &Record, p: &Record, tols: &Tolerances) -> Option<bool> {
    if let (Some(a), Some(b)) = (&r.shape, &p.shape)
        && a != b
    {
        return None;
    }
    let abs_mean = match (r.stat_f64("abs_mean"), p.stat_f64("abs_mean")) {
        (Some(a), Some(b)) => Some(a.abs().max(b.abs())),
        (a, b) => a.or(b),
    };
    let numel = r.element_count().or(p.element_count());
    let mut compared = 0;
    for (name, rv) in r.stats.iter() {
        let (Some(tol), StatValue::Num(a)) = (tols.get(&r.module, name), rv) else {
            continue;
        };
        let Some(b) = p.stat_f64(name) else { continue };
        compared += 1;
        if drift(name, a, b, abs_mean, numel) > tol {
            return Some(false);
        }
    }
    (compared > 0).then_some(true)
}

/// At most this many unmatched modules get nearest-name candidates: the
/// search is quadratic and a wrong rename can unmatch every module.
const NEAREST_LIMIT: usize = 50;

fn unmatched_lists(
    only_ref: &[&Record],
    only_port: &[&Record],
    reference: &[Record],
    port: &[Record],
) -> UnmatchedSides {
    fn unique<'a>(it: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
        let mut seen = std::collections::HashSet::with_hasher(std::hash::BuildHasherDefault::<
            crate::hash::FxHasher,
        >::default());
        it.filter(|m| seen.insert(*m)).collect()
    }
    // Candidate lists only when something is unmatched: they walk every row.
    let port_names = if only_ref.is_empty() {
        Vec::new()
    } else {
        unique(port.iter().map(|r| &*r.module))
    };
    let ref_names = if only_port.is_empty() {
        Vec::new()
    } else {
        unique(reference.iter().map(|r| &*r.module))
    };
    let ref_list = unique(only_ref.iter().map(|r| &*r.module))
        .into_iter()
        .enumerate()
        .map(|(i, m)| Unmatched {
            module: m.to_string(),
            renamed: None,
            nearest: if i < NEAREST_LIMIT {
                nearest(m, &port_names)
            } else {
                Vec::new()
            },
        })
        .collect();
    let mut port_list = Vec::new();
    let mut seen = std::collections::HashSet::with_hasher(std::hash::BuildHasherDefault::<
        crate::hash::FxHasher,
    >::default());
    for r in only_port {
        if !seen.insert(&*r.module) {
            continue;
        }
        let i = port_list.len();
        port_list.push(Unmatched {
            module: port_name(r).to_string(),
            renamed: r.original_module.as_ref().map(|_| r.module.to_string()),
            nearest: if i < NEAREST_LIMIT {
                nearest(&r.module, &ref_names)
            } else {
                Vec::new()
            },
        });
    }
    UnmatchedSides {
        reference: ref_list,
        port: port_list,
    }
}

/// The three names closest to `name`. Distance is an edit distance over
/// the dotted parts, where two parts cost their normalized character edit
/// distance and two different numbers cost more than an insertion, so
/// `blocks.0.norm1` lands next to `transformer.h.0.ln_1`, not `lm_head`.
fn nearest(name: &str, candidates: &[&str]) -> Vec<String> {
    let parts: Vec<&str> = name.split('.').collect();
    let mut scored: Vec<(f64, &str)> = candidates
        .iter()
        .filter(|c| **c != name)
        .map(|c| (path_distance(&parts, &c.split('.').collect::<Vec<_>>()), *c))
        .collect();
    scored.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(b.1)));
    scored
        .into_iter()
        .take(3)
        .map(|(_, c)| c.to_string())
        .collect()
}

fn part_cost(a: &str, b: &str) -> f64 {
    if a == b {
        return 0.0;
    }
    let num = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    if num(a) && num(b) {
        return 2.0;
    }
    levenshtein(a, b) as f64 / a.chars().count().max(b.chars().count()).max(1) as f64
}

fn path_distance(a: &[&str], b: &[&str]) -> f64 {
    let mut prev: Vec<f64> = (0..=b.len()).map(|j| j as f64).collect();
    let mut cur = vec![0.0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i as f64;
        for j in 1..=b.len() {
            cur[j] = (prev[j] + 1.0)
                .min(cur[j - 1] + 1.0)
                .min(prev[j - 1] + part_cost(a[i - 1], b[j - 1]));
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

fn levenshtein(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// A step list as `FASTVIDEO_TRACE_STEPS` and `fvd trace compare --steps`
/// write it: `"0,15,31"`, with `null` (or `none`) for rows without a step.
pub fn parse_steps(list: &str) -> Result<Vec<Option<i64>>, crate::TraceError> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s {
            "null" | "none" => Ok(None),
            n => n
                .parse::<i64>()
                .map(Some)
                .map_err(|_| crate::TraceError::Step(n.to_string())),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_near_zero_uses_the_l1_floor() {
        // sums of ±noise: 0.1 vs -0.1 over 1000 elements of abs_mean 0.5.
        let d = drift("sum", 0.1, -0.1, Some(0.5), Some(1000));
        assert!(d < 1e-3, "{d}");
        assert_eq!(drift("abs_mean", 1.0, 1.0, None, None), 0.0);
        assert!((drift("abs_mean", 1.0, 0.5, None, None) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn tolerance_rules_resolve_last_match_first() {
        let t = Tolerances::parse(&[
            "abs_mean=1e-4".to_string(),
            r"^blocks\.3\.:abs_mean=0.5".to_string(),
            "max=off".to_string(),
        ])
        .unwrap();
        assert_eq!(t.get("blocks.2.x", "abs_mean"), Some(1e-4));
        assert_eq!(t.get("blocks.3.x", "abs_mean"), Some(0.5));
        assert_eq!(t.get("blocks.3.x", "max"), None);
        assert!(Tolerance::parse("abs_mean").is_err());
        assert!(Tolerance::parse("abs_mean=x").is_err());
    }

    #[test]
    fn drill_down_scopes_to_the_block() {
        assert_eq!(drill_regex("blocks.3.norm2"), r"^blocks\.3(\.|$)");
        assert_eq!(drill_regex("tok_embed"), r"^tok_embed(\.|$)");
        assert_eq!(
            block_of("transformer.h.10.attn"),
            Some(("transformer.h", "10"))
        );
    }
}
