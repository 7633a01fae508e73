//! Dump comparator on generated safetensors files: every supported dtype,
//! tensors spanning several chunks and threads (checked against a direct
//! f64 computation), the `__metadata__` execution order, per-token cosine.

use std::collections::HashMap;
use std::path::Path;

use fvd_trace::dumps::{DumpOptions, ORDER_METADATA_KEY, compare_dumps};
use safetensors::tensor::{Dtype, TensorView};

fn bytes(dtype: Dtype, v: &[f64]) -> Vec<u8> {
    match dtype {
        Dtype::F32 => v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect(),
        Dtype::F64 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::F16 => v
            .iter()
            .flat_map(|x| half::f16::from_f64(*x).to_le_bytes())
            .collect(),
        Dtype::BF16 => v
            .iter()
            .flat_map(|x| half::bf16::from_f64(*x).to_le_bytes())
            .collect(),
        _ => unreachable!(),
    }
}

/// What the comparator should see: the values after rounding to `dtype`.
fn rounded(dtype: Dtype, v: &[f64]) -> Vec<f64> {
    match dtype {
        Dtype::F32 => v.iter().map(|x| *x as f32 as f64).collect(),
        Dtype::F64 => v.to_vec(),
        Dtype::F16 => v.iter().map(|x| half::f16::from_f64(*x).to_f64()).collect(),
        Dtype::BF16 => v
            .iter()
            .map(|x| half::bf16::from_f64(*x).to_f64())
            .collect(),
        _ => unreachable!(),
    }
}

fn write(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<f64>)], order: Option<&[&str]>) {
    let data: Vec<(String, Vec<u8>, Dtype, Vec<usize>)> = tensors
        .iter()
        .map(|(k, d, s, v)| (k.to_string(), bytes(*d, v), *d, s.clone()))
        .collect();
    let views: Vec<(String, TensorView<'_>)> = data
        .iter()
        .map(|(k, b, d, s)| (k.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let meta = order.map(|o| {
        HashMap::from([(
            ORDER_METADATA_KEY.to_string(),
            serde_json::to_string(o).unwrap(),
        )])
    });
    safetensors::serialize_to_file(views, meta, path).unwrap();
}

/// Deterministic pseudo-random values (no rand dependency needed).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0
        })
        .collect()
}

#[test]
fn metrics_match_a_direct_computation_for_every_dtype() {
    let tmp = tempfile::tempdir().unwrap();
    // 3 × 200_000 elements: several chunks per thread.
    let shape = vec![3usize, 1000, 200];
    let n: usize = shape.iter().product();
    let x = values(n, 1);
    let mut y: Vec<f64> = x.iter().map(|v| v * 1.01 + 0.001).collect();
    y[123_457] += 3.0;
    for dtype in [Dtype::F32, Dtype::F16, Dtype::BF16, Dtype::F64] {
        let (a, b) = (
            tmp.path().join("a.safetensors"),
            tmp.path().join("b.safetensors"),
        );
        write(&a, &[("embed:out", dtype, shape.clone(), x.clone())], None);
        write(
            &b,
            &[("embed:out", Dtype::F32, shape.clone(), y.clone())],
            None,
        );
        let r = compare_dumps(
            &a,
            &b,
            &DumpOptions {
                token_dim: Some(1),
                ..DumpOptions::default()
            },
        )
        .unwrap();
        let m = r.tensors[0].metrics.as_ref().unwrap();
        let xs = rounded(dtype, &x);
        let ys = rounded(Dtype::F32, &y);
        let sxy: f64 = xs.iter().zip(&ys).map(|(a, b)| a * b).sum();
        let sxx: f64 = xs.iter().map(|a| a * a).sum();
        let syy: f64 = ys.iter().map(|a| a * a).sum();
        let cos = sxy / (sxx.sqrt() * syy.sqrt());
        let rel = 1.0 - 2.0 * sxy / (sxx + syy);
        let mad: f64 = xs.iter().zip(&ys).map(|(a, b)| (a - b).abs()).sum::<f64>() / n as f64;
        assert!(
            (m.cosine - cos).abs() < 1e-12,
            "{dtype:?}: {} vs {cos}",
            m.cosine
        );
        assert!((m.rel_diff - rel).abs() < 1e-12, "{dtype:?}");
        assert!((m.mean_abs_diff - mad).abs() < 1e-12, "{dtype:?}");
        // 123_457 = 0 * 200_000 + 617 * 200 + 57
        assert_eq!(m.max_abs_diff_at, vec![0, 617, 57], "{dtype:?}");
        assert_eq!(m.reference_value, xs[123_457]);
        assert_eq!(m.port_value, ys[123_457]);
        assert!(!m.identical);
        // Per-token cosine along dim 1: token 617 holds the spike.
        assert_eq!(m.token_cosine_min_at, Some(617), "{dtype:?}");
        assert_eq!(m.token_cosine.as_ref().unwrap().len(), 1000);
    }
}

#[test]
fn metadata_order_is_the_execution_order_and_rel_diff_sees_scale() {
    let tmp = tempfile::tempdir().unwrap();
    let x = values(4096, 7);
    // layers.10 runs before layers.2 here: a name sort would get it wrong.
    let order = ["layers.10:out", "layers.2:out@0"];
    let (a, b) = (
        tmp.path().join("a.safetensors"),
        tmp.path().join("b.safetensors"),
    );
    write(
        &a,
        &[
            ("layers.2:out@0", Dtype::F32, vec![4096], x.clone()),
            ("layers.10:out", Dtype::F32, vec![4096], x.clone()),
        ],
        Some(&order),
    );
    let scaled: Vec<f64> = x.iter().map(|v| v * 1.2).collect();
    write(
        &b,
        &[
            ("layers.2:out@0", Dtype::F32, vec![4096], scaled.clone()),
            ("layers.10:out", Dtype::F32, vec![4096], scaled),
        ],
        None,
    );
    let r = compare_dumps(&a, &b, &DumpOptions::default()).unwrap();
    assert_eq!(r.order_source, "metadata");
    let fd = r.first_divergence.unwrap();
    assert_eq!(fd.reference_module, "layers.10");
    // A pure rescale: cosine 1, rel_diff 1 − 2·1.2/(1 + 1.44) ≈ 0.0164.
    let m = r.tensors[0].metrics.as_ref().unwrap();
    assert!(m.cosine > 0.999_999);
    assert_eq!(fd.stat, "rel_diff");
    assert!((m.rel_diff - (1.0 - 2.4 / 2.44)).abs() < 1e-6);
    assert!(r.diagnostics.iter().any(|d| d.code == "scale_error"));
    assert_eq!(r.tensors[1].step, Some(0));
}

#[test]
fn broken_header_is_an_error_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("broken.safetensors");
    std::fs::write(&a, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ").unwrap();
    let err = compare_dumps(&a, &a, &DumpOptions::default()).unwrap_err();
    assert!(err.to_string().contains("broken.safetensors"), "{err}");
}
