//! Property: merging the stats of the shards of a random split of a random
//! tensor (along any dim, even or uneven) gives the stats of the whole
//! tensor, to 1e-9 relative in f64, for every mergeable stat, and the
//! merged shape is the whole shape.

use fvd_trace::merge::{MergeOptions, ShapeIndex, merge_ranks};
use fvd_trace::record::{Record, StatValue, TraceFile};
use proptest::prelude::*;

/// Row-major slice of `data` (shape `shape`) for indices `lo..hi` along `dim`.
fn slice(data: &[f64], shape: &[usize], dim: usize, lo: usize, hi: usize) -> Vec<f64> {
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let mut out = Vec::new();
    for o in 0..outer {
        let base = o * shape[dim] * inner;
        out.extend_from_slice(&data[base + lo * inner..base + hi * inner]);
    }
    out
}

/// Stats the way FastVideo's writer computes them (sample std).
fn stats(x: &[f64]) -> Vec<(&'static str, f64)> {
    let n = x.len() as f64;
    let sum: f64 = x.iter().sum();
    let mean = sum / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1.0);
    vec![
        ("abs_mean", x.iter().map(|v| v.abs()).sum::<f64>() / n),
        ("sum", sum),
        ("min", x.iter().copied().fold(f64::INFINITY, f64::min)),
        ("max", x.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
        ("mean", mean),
        ("std", var.sqrt()),
    ]
}

fn record(x: &[f64], shape: &[usize], with_numel: bool) -> Record {
    let mut r = Record {
        module: "m".into(),
        tensor: "out".into(),
        step: Some(0),
        shape: Some(shape.iter().map(|&d| d as u64).collect()),
        numel: with_numel.then_some(x.len() as u64),
        ..Default::default()
    };
    for (k, v) in stats(x) {
        r.set_stat(k, StatValue::Num(v));
    }
    r
}

fn case() -> impl Strategy<Value = (Vec<usize>, usize, Vec<usize>, Vec<f64>, bool)> {
    (1usize..=3)
        .prop_flat_map(|nd| (prop::collection::vec(1usize..=6, nd), 0..nd))
        .prop_flat_map(|(shape, dim)| {
            let len = shape[dim];
            let numel: usize = shape.iter().product();
            (
                Just(shape),
                Just(dim),
                // Cut points inside the sharded dim (deduplicated later).
                prop::collection::vec(1..len.max(2), 0..4),
                prop::collection::vec(-50.0f64..50.0, numel),
                any::<bool>(),
            )
        })
        .prop_filter("a sample std needs two elements", |(shape, ..)| {
            shape.iter().product::<usize>() >= 2
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn merged_shard_stats_equal_whole_tensor_stats(
        (shape, dim, mut cuts, data, even) in case()
    ) {
        let len = shape[dim];
        // Even splits exercise the sequence-parallel path (equal shard
        // shapes, dim taken from the reference); uneven ones the path where
        // shard shapes differ.
        let bounds: Vec<usize> = if even {
            let k = (2..=len).rev().find(|k| len % k == 0).unwrap_or(1);
            (0..=k).map(|i| i * len / k).collect()
        } else {
            cuts.retain(|c| *c < len);
            cuts.sort();
            cuts.dedup();
            let mut b = vec![0];
            b.extend(cuts);
            b.push(len);
            b
        };
        let files: Vec<TraceFile> = bounds
            .windows(2)
            .enumerate()
            .map(|(rank, w)| {
                let mut s = shape.clone();
                s[dim] = w[1] - w[0];
                let part = slice(&data, &shape, dim, w[0], w[1]);
                TraceFile {
                    path: format!("rank{rank}.jsonl").into(),
                    rank: rank as u32,
                    // Half the cases carry `numel`, half rely on the shape.
                    records: vec![record(&part, &s, rank % 2 == 0)],
                }
            })
            .collect();
        let whole = record(&data, &shape, false);
        let reference = ShapeIndex::from_records(std::slice::from_ref(&whole));
        let merged = merge_ranks(files, Some(&reference), &MergeOptions::default());
        prop_assert_eq!(merged.records.len(), 1);
        let m = &merged.records[0];
        prop_assert_eq!(&m.shape, &whole.shape, "diagnostics: {:?}", merged.diagnostics);
        let abs_mean = whole.stat_f64("abs_mean").unwrap();
        let n = data.len() as f64;
        for (k, want) in stats(&data) {
            let got = m.stat_f64(k);
            prop_assert!(got.is_some(), "{} dropped: {:?}", k, merged.diagnostics);
            let got = got.unwrap();
            // sum and mean can sit at zero; measure them against the data's
            // scale (L1 mass and mean |x|), everything else plainly relative.
            let floor = match k { "sum" => abs_mean * n, "mean" => abs_mean, _ => 0.0 };
            let rel = (got - want).abs() / want.abs().max(got.abs()).max(floor).max(f64::MIN_POSITIVE);
            prop_assert!(rel <= 1e-9, "{}: merged {} whole {} rel {}", k, got, want, rel);
        }
    }
}
