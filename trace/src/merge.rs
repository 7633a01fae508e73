//! Merge the per-rank traces of one run into the trace of the whole tensor.
//!
//! Rows of different ranks are matched by `(module, tensor, step, n)` where
//! `n` counts earlier calls of the same module/tensor/step on that rank. A
//! matched group is either *replicated* (every rank wrote the same stats,
//! within [`MergeOptions::replicated_rel_tol`]) and taken once, or *sharded*
//! and merged exactly:
//!
//! * `sum` adds, `min`/`max` combine;
//! * `abs_mean` and `mean` are weighted by element count (`numel`, else the
//!   product of the shape);
//! * `std` is pooled exactly from each shard's count, mean (`mean`, else
//!   `sum / count`) and std. FastVideo's writer calls torch's `.std()`,
//!   whose default is the unbiased (sample, Bessel-corrected) estimator, and
//!   the fixture traces confirm it; [`MergeOptions::std_correction`] is
//!   therefore 1 by default (0 gives population std);
//! * `shape` is concatenated on the sharded dim: the one dim where shard
//!   shapes differ, or, when every shard has the same shape (sequence
//!   parallel), the one dim where `world_size × shard = full` in the
//!   reference's shape. With no reference, or no single such dim, the merged
//!   row has no shape and a diagnostic says why: the dim is never guessed.
//!
//! A stat that cannot be merged (an unknown stat, a weighted stat without
//! element counts, an `<error: …>` string on one rank) is dropped with a
//! diagnostic, never approximated.

use crate::diag::{Collector, Diagnostic};
use crate::hash::{FastMap, fast_map};
use crate::record::{Name, Record, StatValue, TraceFile};

/// Knobs of the merge.
#[derive(Debug, Clone)]
pub struct MergeOptions {
    /// Relative tolerance under which rows of different ranks count as the
    /// same (replicated) row.
    pub replicated_rel_tol: f64,
    /// Bessel correction of the `std` stat: 1 (sample std, torch's default
    /// and FastVideo's writer) or 0 (population std).
    pub std_correction: f64,
}

impl Default for MergeOptions {
    fn default() -> Self {
        MergeOptions {
            replicated_rel_tol: 1e-6,
            std_correction: 1.0,
        }
    }
}

/// Row identity inside one trace: module, tensor, step and call count.
pub type RowKey<'a> = (&'a str, &'a str, Option<i64>, u32);

/// Call counts of one rank's rows and where each row key sits.
type RankIndex<'a> = (Vec<u32>, FastMap<RowKey<'a>, usize>);

/// For each record, how many earlier records had the same module, tensor
/// and step (a module called twice in one step gives two rows).
pub fn occurrences(records: &[Record]) -> Vec<u32> {
    let mut seen: FastMap<(&str, &str, Option<i64>), u32> = fast_map(records.len());
    records
        .iter()
        .map(|r| {
            let c = seen.entry((&*r.module, &*r.tensor, r.step)).or_insert(0);
            let n = *c;
            *c += 1;
            n
        })
        .collect()
}

/// Full shapes of the reference, looked up by the (already renamed) key of
/// a port row; falls back to the first shape seen for the module/tensor.
#[derive(Debug, Default)]
pub struct ShapeIndex {
    exact: FastMap<(Name, Name, Option<i64>, u32), Vec<u64>>,
    loose: FastMap<(Name, Name), Vec<u64>>,
}

impl ShapeIndex {
    pub fn from_records(records: &[Record]) -> Self {
        let mut idx = ShapeIndex::default();
        for (r, n) in records.iter().zip(occurrences(records)) {
            if let Some(shape) = &r.shape {
                idx.exact.insert(
                    (r.module.clone(), r.tensor.clone(), r.step, n),
                    shape.clone(),
                );
                idx.loose
                    .entry((r.module.clone(), r.tensor.clone()))
                    .or_insert_with(|| shape.clone());
            }
        }
        idx
    }

    pub fn get(&self, module: &Name, tensor: &Name, step: Option<i64>, n: u32) -> Option<&[u64]> {
        // Cloning the names only bumps reference counts.
        self.exact
            .get(&(module.clone(), tensor.clone(), step, n))
            .or_else(|| self.loose.get(&(module.clone(), tensor.clone())))
            .map(Vec::as_slice)
    }
}

/// A merged trace and what the merge had to say about it.
#[derive(Debug, Clone)]
pub struct Merged {
    pub records: Vec<Record>,
    pub diagnostics: Vec<Diagnostic>,
}

/// Merge the files of one run (one per rank, sorted by rank).
pub fn merge_ranks(
    mut files: Vec<TraceFile>,
    reference: Option<&ShapeIndex>,
    opts: &MergeOptions,
) -> Merged {
    let mut diags = Collector::default();
    if files.is_empty() {
        return Merged {
            records: Vec::new(),
            diagnostics: Vec::new(),
        };
    }
    if files.len() == 1 {
        let f = files.pop().expect("one file");
        return Merged {
            records: f.records,
            diagnostics: Vec::new(),
        };
    }
    let world = files.len();
    // Ranks of one run nearly always write the same rows in the same order,
    // so row i of rank r is tried first; a rank falls back to a keyed index
    // (built then, once) from its first row that does not line up. While
    // every earlier row lined up, the call counts line up too.
    let occ0 = occurrences(&files[0].records);
    let mut aligned = vec![true; world];
    let mut index: Vec<Option<RankIndex<'_>>> = (0..world).map(|_| None).collect();
    let mut used: Vec<Vec<bool>> = files.iter().map(|f| vec![false; f.records.len()]).collect();
    let mut out = Vec::with_capacity(files[0].records.len());
    let mut group: Vec<&Record> = Vec::with_capacity(world);

    for (i, (rec, n)) in files[0].records.iter().zip(&occ0).enumerate() {
        used[0][i] = true;
        let key = (&*rec.module, &*rec.tensor, rec.step, *n);
        group.clear();
        group.push(rec);
        for r in 1..world {
            let recs = &files[r].records;
            if aligned[r] {
                if let Some(other) = recs.get(i)
                    && other.step == rec.step
                    && other.module == rec.module
                    && other.tensor == rec.tensor
                {
                    used[r][i] = true;
                    group.push(other);
                    continue;
                }
                aligned[r] = false;
            }
            let (_, map) = index[r].get_or_insert_with(|| rank_index(recs));
            if let Some(&j) = map.get(&key) {
                used[r][j] = true;
                group.push(&recs[j]);
            }
        }
        if group.len() < world {
            diags.push(
                "partial_ranks",
                format!(
                    "{} is on {} of {} ranks; merged from those",
                    label(rec),
                    group.len(),
                    world
                ),
            );
        }
        let ref_shape = reference.and_then(|r| r.get(&rec.module, &rec.tensor, rec.step, *n));
        out.push(merge_group(&group, ref_shape, opts, &mut diags));
    }
    // Rows rank 0 never wrote: keep them (merged across the ranks that have
    // them) after rank 0's rows, in rank order.
    out.extend(merge_leftovers(
        &files, &mut index, &mut used, reference, opts, &mut diags,
    ));
    drop(index);
    Merged {
        records: out,
        diagnostics: diags.finish(),
    }
}

/// A rank's rows keyed by (module, tensor, step, call count), with the call
/// counts of its rows.
fn rank_index(records: &[Record]) -> RankIndex<'_> {
    let occ = occurrences(records);
    let mut map = fast_map(records.len());
    for (i, (r, n)) in records.iter().zip(&occ).enumerate() {
        map.insert((&*r.module, &*r.tensor, r.step, *n), i);
    }
    (occ, map)
}

/// The rows rank 0 never wrote, each merged across the later ranks that
/// have it, in rank order; `used` marks the rows taken.
fn merge_leftovers<'a>(
    files: &'a [TraceFile],
    index: &mut [Option<RankIndex<'a>>],
    used: &mut [Vec<bool>],
    reference: Option<&ShapeIndex>,
    opts: &MergeOptions,
    diags: &mut Collector,
) -> Vec<Record> {
    let world = files.len();
    let mut out = Vec::new();
    for r in 1..world {
        if used[r].iter().all(|u| *u) {
            continue;
        }
        for (s, slot) in index.iter_mut().enumerate().skip(r) {
            if slot.is_none() {
                *slot = Some(rank_index(&files[s].records));
            }
        }
        for (i, rec) in files[r].records.iter().enumerate() {
            if used[r][i] {
                continue;
            }
            used[r][i] = true;
            let n = index[r].as_ref().map_or(0, |x| x.0[i]);
            let key = (&*rec.module, &*rec.tensor, rec.step, n);
            let mut group = vec![rec];
            for (s, idx) in index.iter().enumerate().skip(r + 1) {
                if let Some((_, map)) = idx
                    && let Some(&j) = map.get(&key)
                    && !used[s][j]
                {
                    used[s][j] = true;
                    group.push(&files[s].records[j]);
                }
            }
            diags.push(
                "partial_ranks",
                format!("{} is missing on rank {}", label(rec), files[0].rank),
            );
            let ref_shape = reference.and_then(|x| x.get(&rec.module, &rec.tensor, rec.step, n));
            out.push(merge_group(&group, ref_shape, opts, diags));
        }
    }
    out
}

fn same_value(a: &StatValue, b: &StatValue, tol: f64) -> bool {
    match (a, b) {
        (StatValue::Num(x), StatValue::Num(y)) => {
            (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= tol * x.abs().max(y.abs())
        }
        _ => a == b,
    }
}

fn replicated(group: &[&Record], tol: f64) -> bool {
    let first = group[0];
    group[1..].iter().all(|r| {
        r.shape == first.shape
            && r.stats.len() == first.stats.len()
            && first.stats.iter().all(|(k, v)| match r.stat(k) {
                Some(w) => same_value(&v, &w, tol),
                None => false,
            })
    })
}

fn label(r: &Record) -> String {
    match r.step {
        Some(s) => format!("{} {} step {}", r.module, r.tensor, s),
        None => format!("{} {}", r.module, r.tensor),
    }
}

/// Merge one group of rows (one per rank, rank order).
pub fn merge_group(
    group: &[&Record],
    ref_shape: Option<&[u64]>,
    opts: &MergeOptions,
    diags: &mut Collector,
) -> Record {
    let first = group[0];
    let mut base = first.clone();
    base.rank = None;
    if group.len() == 1 || replicated(group, opts.replicated_rel_tol) {
        return base;
    }

    // Shape and sharded dim.
    base.shape = match merged_shape(group, ref_shape, diags) {
        ShapeMerge::Disagree => return base,
        ShapeMerge::Shape(shape) => shape,
    };

    let counts: Option<Vec<u64>> = group.iter().map(|r| r.element_count()).collect();
    let total: Option<u64> = counts.as_ref().map(|c| c.iter().sum());
    base.numel = total;
    if let Some(dt) = &first.dtype
        && group.iter().any(|r| r.dtype.as_ref() != Some(dt))
    {
        diags.push(
            "dtype_differs_across_ranks",
            format!("{}: ranks report different dtypes", label(first)),
        );
    }

    base.stats = merged_stats(group, counts.as_deref(), opts, diags);
    base
}

/// What the shards' shapes say about a group's merged row.
enum ShapeMerge {
    /// The ranks have the full shape yet different stats: the first row is
    /// kept as it is.
    Disagree,
    /// The merged shape, when the sharded dim can be told.
    Shape(Option<Vec<u64>>),
}

/// The merged shape of a group whose rows differ: the shards' shapes joined
/// along the one dim they are split on.
fn merged_shape(group: &[&Record], ref_shape: Option<&[u64]>, diags: &mut Collector) -> ShapeMerge {
    let first = group[0];
    let shapes: Option<Vec<&Vec<u64>>> = group.iter().map(|r| r.shape.as_ref()).collect();
    let Some(shapes) = shapes else {
        return ShapeMerge::Shape(None);
    };
    let s0 = shapes[0];
    if shapes.iter().all(|s| *s == s0) {
        return equal_shards_shape(first, s0, group.len() as u64, ref_shape, diags);
    }
    let nd = s0.len();
    let diff: Vec<usize> = if shapes.iter().all(|s| s.len() == nd) {
        (0..nd)
            .filter(|&d| shapes.iter().any(|s| s[d] != s0[d]))
            .collect()
    } else {
        Vec::new()
    };
    if diff.len() == 1 {
        let d = diff[0];
        let mut s = s0.clone();
        s[d] = shapes.iter().map(|s| s[d]).sum();
        ShapeMerge::Shape(Some(s))
    } else {
        diags.push(
            "shard_dim_unknown",
            format!(
                "{}: shard shapes {:?} differ in more than one dim; merged shape left out",
                label(first),
                shapes
            ),
        );
        ShapeMerge::Shape(None)
    }
}

/// The merged shape of `k` shards that all have shape `s0`: the reference
/// shape tells which dim they are split on.
fn equal_shards_shape(
    first: &Record,
    s0: &[u64],
    k: u64,
    ref_shape: Option<&[u64]>,
    diags: &mut Collector,
) -> ShapeMerge {
    match ref_shape {
        Some(full) if full == s0 => {
            // Same shape as the full tensor yet different stats: the
            // ranks disagree on a row that should be replicated.
            diags.push(
                "ranks_disagree",
                format!(
                    "{}: ranks have the full shape {:?} but different stats; rank {} taken",
                    label(first),
                    s0,
                    first.rank.unwrap_or(0)
                ),
            );
            ShapeMerge::Disagree
        }
        Some(full) => {
            let dims: Vec<usize> = (0..s0.len())
                .filter(|&d| full.len() == s0.len() && full[d] == k * s0[d])
                .collect();
            let others_equal = |d: usize| (0..s0.len()).all(|e| e == d || full.get(e) == s0.get(e));
            let fits: Vec<usize> = dims.into_iter().filter(|&d| others_equal(d)).collect();
            if fits.len() == 1 {
                let mut s = s0.to_vec();
                s[fits[0]] *= k;
                ShapeMerge::Shape(Some(s))
            } else {
                diags.push(
                    "shard_dim_unknown",
                    format!(
                        "{}: no single dim of the reference shape {:?} is {} x the shard shape {:?}; merged shape left out",
                        label(first),
                        full,
                        k,
                        s0
                    ),
                );
                ShapeMerge::Shape(None)
            }
        }
        None => {
            diags.push(
                "shard_dim_unknown",
                format!(
                    "{}: equal shard shapes {:?} and no reference shape; merged shape left out (pass --reference)",
                    label(first),
                    s0
                ),
            );
            ShapeMerge::Shape(None)
        }
    }
}

/// The stats of a group's merged row: each of rank 0's stats merged exactly
/// across the shards (`counts`: their element counts), or dropped with a
/// diagnostic when it cannot be.
fn merged_stats(
    group: &[&Record],
    counts: Option<&[u64]>,
    opts: &MergeOptions,
    diags: &mut Collector,
) -> crate::record::Stats {
    let first = group[0];
    let names: Vec<String> = first.stats.names();
    let mut stats = crate::record::Stats::default();
    for name in names {
        let vals: Vec<Option<StatValue>> = group.iter().map(|r| r.stat(&name)).collect();
        if vals.iter().any(Option::is_none) {
            diags.push(
                "stat_not_mergeable",
                format!("{}: {name} is missing on some ranks; dropped", label(first)),
            );
            continue;
        }
        let vals: Vec<StatValue> = vals.into_iter().flatten().collect();
        if let Some(err) = vals.iter().find(|v| matches!(v, StatValue::Text(_))) {
            diags.push(
                "stat_error",
                format!(
                    "{}: {name} is an error string on a rank; kept as the error",
                    label(first)
                ),
            );
            stats.set(&name, err.clone());
            continue;
        }
        let nums: Option<Vec<f64>> = vals.iter().map(|v| v.as_f64()).collect();
        let Some(nums) = nums else {
            diags.push(
                "stat_not_mergeable",
                format!("{}: {name} is not a number; dropped", label(first)),
            );
            continue;
        };
        let merged = match name.as_str() {
            "sum" => Some(nums.iter().sum()),
            "min" => Some(nums.iter().copied().fold(f64::INFINITY, f64::min)),
            "max" => Some(nums.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
            "abs_mean" | "mean" => counts.map(|c| weighted_mean(&nums, c)),
            "std" => counts.and_then(|c| pooled_std(group, &nums, c, opts.std_correction)),
            _ => None,
        };
        match merged {
            Some(v) => stats.set(&name, StatValue::Num(v)),
            None => diags.push(
                "stat_not_mergeable",
                format!(
                    "{}: {name} cannot be merged exactly across shards (unknown stat, or no element counts or means); dropped",
                    label(first)
                ),
            ),
        }
    }
    stats
}

fn weighted_mean(values: &[f64], counts: &[u64]) -> f64 {
    let n: f64 = counts.iter().map(|&c| c as f64).sum();
    values
        .iter()
        .zip(counts)
        .map(|(v, &c)| v * c as f64)
        .sum::<f64>()
        / n
}

/// Exact pooled std: `M2 = Σ s_i²(n_i − c) + Σ n_i (m_i − m)²`,
/// `std = sqrt(M2 / (N − c))` with `c` the Bessel correction.
fn pooled_std(group: &[&Record], stds: &[f64], counts: &[u64], c: f64) -> Option<f64> {
    let means: Option<Vec<f64>> = group
        .iter()
        .zip(counts)
        .map(|(r, &n)| {
            r.stat_f64("mean")
                .or_else(|| r.stat_f64("sum").map(|s| s / n as f64))
        })
        .collect();
    let means = means?;
    let n_total: f64 = counts.iter().map(|&n| n as f64).sum();
    let mean = weighted_mean(&means, counts);
    let mut m2 = 0.0;
    for ((s, m), &n) in stds.iter().zip(&means).zip(counts) {
        let n = n as f64;
        let within = n - c;
        // A one-element shard has a NaN sample std and no spread to add.
        if within > 0.0 {
            m2 += s * s * within;
        }
        m2 += n * (m - mean) * (m - mean);
    }
    let denom = n_total - c;
    if denom <= 0.0 {
        return None;
    }
    Some((m2 / denom).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::parse_line;

    fn rec(line: &str) -> Record {
        parse_line(line).unwrap().unwrap()
    }

    fn file(rank: u32, lines: &[&str]) -> TraceFile {
        TraceFile {
            path: format!("rank{rank}.jsonl").into(),
            rank,
            records: lines.iter().map(|l| rec(l)).collect(),
        }
    }

    #[test]
    fn replicated_rows_are_taken_once_and_uneven_shards_concatenate() {
        let a = file(
            0,
            &[
                r#"{"module":"m","tensor":"out","step":null,"sum":1.0,"max":2.0,"shape":[2,3]}"#,
                r#"{"module":"p","tensor":"out","step":null,"sum":3.0,"max":1.0,"min":-1.0,"shape":[2,1]}"#,
            ],
        );
        let b = file(
            1,
            &[
                r#"{"module":"m","tensor":"out","step":null,"sum":1.0,"max":2.0,"shape":[2,3]}"#,
                r#"{"module":"p","tensor":"out","step":null,"sum":-1.0,"max":4.0,"min":0.5,"shape":[2,2]}"#,
            ],
        );
        let m = merge_ranks(vec![a, b], None, &MergeOptions::default());
        assert_eq!(m.records.len(), 2);
        assert_eq!(m.records[0].stat_f64("sum"), Some(1.0));
        assert_eq!(m.records[1].shape, Some(vec![2, 3]));
        assert_eq!(m.records[1].stat_f64("sum"), Some(2.0));
        assert_eq!(m.records[1].stat_f64("max"), Some(4.0));
        assert_eq!(m.records[1].stat_f64("min"), Some(-1.0));
        assert!(m.diagnostics.is_empty(), "{:?}", m.diagnostics);
    }

    #[test]
    fn equal_shards_without_reference_leave_shape_out_with_a_diagnostic() {
        let a = file(
            0,
            &[r#"{"module":"m","tensor":"out","step":0,"sum":1.0,"shape":[1,4]}"#],
        );
        let b = file(
            1,
            &[r#"{"module":"m","tensor":"out","step":0,"sum":2.0,"shape":[1,4]}"#],
        );
        let m = merge_ranks(vec![a.clone(), b.clone()], None, &MergeOptions::default());
        assert_eq!(m.records[0].shape, None);
        assert_eq!(m.records[0].stat_f64("sum"), Some(3.0));
        assert_eq!(m.diagnostics[0].code, "shard_dim_unknown");

        let reference = ShapeIndex::from_records(&[rec(
            r#"{"module":"m","tensor":"out","step":0,"shape":[1,8]}"#,
        )]);
        let m = merge_ranks(vec![a, b], Some(&reference), &MergeOptions::default());
        assert_eq!(m.records[0].shape, Some(vec![1, 8]));
        assert!(m.diagnostics.is_empty());
    }

    #[test]
    fn ranks_in_a_different_order_or_with_extra_rows_still_match() {
        let a = file(
            0,
            &[
                r#"{"module":"m","tensor":"out","step":0,"sum":1.0,"shape":[2]}"#,
                r#"{"module":"m","tensor":"out","step":0,"sum":5.0,"shape":[2]}"#,
                r#"{"module":"p","tensor":"out","step":0,"sum":1.0,"shape":[2]}"#,
            ],
        );
        let b = file(
            1,
            &[
                r#"{"module":"p","tensor":"out","step":0,"sum":2.0,"shape":[3]}"#,
                r#"{"module":"m","tensor":"out","step":0,"sum":2.0,"shape":[3]}"#,
                r#"{"module":"m","tensor":"out","step":0,"sum":7.0,"shape":[3]}"#,
                r#"{"module":"q","tensor":"out","step":0,"sum":9.0,"shape":[1]}"#,
            ],
        );
        let m = merge_ranks(vec![a, b], None, &MergeOptions::default());
        let sums: Vec<(String, f64)> = m
            .records
            .iter()
            .map(|r| (r.module.to_string(), r.stat_f64("sum").unwrap()))
            .collect();
        // The second call of m pairs with the second call of m on rank 1.
        assert_eq!(
            sums,
            vec![
                ("m".to_string(), 3.0),
                ("m".to_string(), 12.0),
                ("p".to_string(), 3.0),
                ("q".to_string(), 9.0)
            ]
        );
        assert!(m.diagnostics.iter().any(|d| d.code == "partial_ranks"));
    }

    #[test]
    fn unknown_stat_is_dropped_with_a_diagnostic() {
        let a = file(
            0,
            &[r#"{"module":"m","tensor":"out","step":0,"kurt":1.0,"sum":1,"shape":[2]}"#],
        );
        let b = file(
            1,
            &[r#"{"module":"m","tensor":"out","step":0,"kurt":2.0,"sum":1,"shape":[3]}"#],
        );
        let m = merge_ranks(vec![a, b], None, &MergeOptions::default());
        assert_eq!(m.records[0].stat("kurt"), None);
        assert_eq!(m.records[0].stat_f64("sum"), Some(2.0));
        assert!(m.diagnostics.iter().any(|d| d.code == "stat_not_mergeable"));
    }
}
