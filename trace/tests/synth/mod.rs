//! A small deterministic Llama-like model that writes its activations as a
//! reference dump and a port dump (safetensors, with the execution order in
//! `__metadata__["fvd_order"]`) and as JSONL stat traces, for the
//! comparator-check tests: one case per false-cliff signature and a clean
//! case. Shared by `trace/tests/signatures.rs` and the e2e tests through
//! `#[path]`, so it uses nothing beyond std and serde_json.
//!
//! The model: token embedding, `LAYERS` pre-norm blocks (RMS norm, single
//! head causal attention with rotary positions, RMS norm, SwiGLU MLP, two
//! residual adds), final norm; `TOKENS` tokens of `DIMS` dims, dumped with
//! shape `[1, TOKENS, DIMS]` (so the token dim is 1 and the channel dim 2).
//! Every port computes with bf16 rounding after each module and dumps
//! bf16: the dtype-level noise each case must see through.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub const TOKENS: usize = 64;
pub const DIMS: usize = 32;
pub const FFN: usize = 64;
pub const LAYERS: usize = 4;
const VOCAB: usize = 97;
/// Tokens from here on are padding in [`Case::Padding`].
pub const PAD_FROM: usize = 48;
/// The channels [`Case::Channels`] breaks.
pub const BROKEN_CHANNELS: [usize; 3] = [3, 17, 29];

/// One generated comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// A faithful port: only bf16 noise.
    Clean,
    /// The reference dumper writes `hidden_states[N]` (block N's input) as
    /// block N's output: its labels run one block ahead of the port's.
    ReferenceShifted,
    /// The port dumper has the same bug: its labels run one block ahead.
    PortShifted,
    /// The port zeroes the attention output of the padded positions
    /// `PAD_FROM..TOKENS`.
    Padding,
    /// The port ignores the configured rotary base: token 0 (rotation 0)
    /// is right, every later token is not.
    Positions,
    /// The port's embedding table comes from another checkpoint.
    Embedding,
    /// The port's MLP down-projection scales [`BROKEN_CHANNELS`] by 1.25.
    Channels,
}

/// The files of one case.
#[derive(Debug, Clone)]
pub struct Pair {
    pub reference: PathBuf,
    pub port: PathBuf,
    pub reference_trace: PathBuf,
    pub port_trace: PathBuf,
}

#[derive(Debug, Clone)]
struct Variant {
    rope_base: f64,
    zero_attn_from: Option<usize>,
    embed_seed: u64,
    scale_channels: Vec<usize>,
    bf16: bool,
    /// Block `N`'s output is written under label `N + shift` (label 0 holds
    /// the embedding output when `shift` is 1).
    shift: usize,
}

impl Variant {
    fn reference() -> Self {
        Variant {
            rope_base: 10_000.0,
            zero_attn_from: None,
            embed_seed: 11,
            scale_channels: Vec::new(),
            bf16: false,
            shift: 0,
        }
    }

    fn port() -> Self {
        Variant {
            bf16: true,
            ..Variant::reference()
        }
    }
}

/// splitmix64: deterministic values without a rand dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-a, a).
    fn uniform(&mut self, a: f64) -> f64 {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * a
    }

    fn matrix(&mut self, rows: usize, cols: usize, gain: f64) -> Vec<f64> {
        let a = gain / (rows as f64).sqrt();
        (0..rows * cols).map(|_| self.uniform(a)).collect()
    }
}

struct Block {
    g1: Vec<f64>,
    wq: Vec<f64>,
    wk: Vec<f64>,
    wv: Vec<f64>,
    wo: Vec<f64>,
    g2: Vec<f64>,
    w1: Vec<f64>,
    w3: Vec<f64>,
    w2: Vec<f64>,
}

struct Model {
    ids: Vec<usize>,
    blocks: Vec<Block>,
    g_final: Vec<f64>,
}

impl Model {
    fn new() -> Self {
        let mut r = Rng(7);
        let ids = (0..TOKENS)
            .map(|_| (r.next() % VOCAB as u64) as usize)
            .collect();
        let norm = |r: &mut Rng| (0..DIMS).map(|_| 1.0 + r.uniform(0.1)).collect();
        let blocks = (0..LAYERS)
            .map(|_| Block {
                g1: norm(&mut r),
                // A gain of 3 on q and k makes the attention sharp (scores
                // of a few units), so position errors show on every token.
                wq: r.matrix(DIMS, DIMS, 3.0),
                wk: r.matrix(DIMS, DIMS, 3.0),
                wv: r.matrix(DIMS, DIMS, 1.0),
                wo: r.matrix(DIMS, DIMS, 1.0),
                g2: norm(&mut r),
                w1: r.matrix(DIMS, FFN, 1.0),
                w3: r.matrix(DIMS, FFN, 1.0),
                w2: r.matrix(FFN, DIMS, 1.0),
            })
            .collect();
        let g_final = norm(&mut r);
        Model {
            ids,
            blocks,
            g_final,
        }
    }
}

/// Round to the nearest bf16 (ties to even), kept as f64.
pub fn bf16(x: f64) -> f64 {
    let bits = (x as f32).to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
    f32::from_bits(rounded) as f64
}

fn matmul(x: &[f64], w: &[f64], rows: usize, inner: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        for k in 0..inner {
            let a = x[r * inner + k];
            for c in 0..cols {
                out[r * cols + c] += a * w[k * cols + c];
            }
        }
    }
    out
}

fn rms_norm(x: &[f64], g: &[f64]) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for t in 0..TOKENS {
        let row = &x[t * DIMS..(t + 1) * DIMS];
        let ms = row.iter().map(|v| v * v).sum::<f64>() / DIMS as f64;
        let s = 1.0 / (ms + 1e-6).sqrt();
        for d in 0..DIMS {
            out[t * DIMS + d] = row[d] * s * g[d];
        }
    }
    out
}

/// Rotary positions on dim pairs (2i, 2i+1).
fn rope(x: &mut [f64], base: f64) {
    for t in 0..TOKENS {
        for i in 0..DIMS / 2 {
            let theta = base.powf(-2.0 * i as f64 / DIMS as f64);
            let (s, c) = (t as f64 * theta).sin_cos();
            let (a, b) = (x[t * DIMS + 2 * i], x[t * DIMS + 2 * i + 1]);
            x[t * DIMS + 2 * i] = a * c - b * s;
            x[t * DIMS + 2 * i + 1] = a * s + b * c;
        }
    }
}

fn attention(ln: &[f64], b: &Block, v: &Variant) -> Vec<f64> {
    let mut q = matmul(ln, &b.wq, TOKENS, DIMS, DIMS);
    let mut k = matmul(ln, &b.wk, TOKENS, DIMS, DIMS);
    let val = matmul(ln, &b.wv, TOKENS, DIMS, DIMS);
    rope(&mut q, v.rope_base);
    rope(&mut k, v.rope_base);
    let mut mixed = vec![0.0; TOKENS * DIMS];
    for t in 0..TOKENS {
        let scores: Vec<f64> = (0..=t)
            .map(|s| {
                (0..DIMS)
                    .map(|d| q[t * DIMS + d] * k[s * DIMS + d])
                    .sum::<f64>()
                    / (DIMS as f64).sqrt()
            })
            .collect();
        let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
        let z: f64 = e.iter().sum();
        for (s, p) in e.iter().enumerate() {
            for d in 0..DIMS {
                mixed[t * DIMS + d] += p / z * val[s * DIMS + d];
            }
        }
    }
    let mut out = matmul(&mixed, &b.wo, TOKENS, DIMS, DIMS);
    if let Some(from) = v.zero_attn_from {
        for x in &mut out[from * DIMS..] {
            *x = 0.0;
        }
    }
    out
}

fn mlp(ln: &[f64], b: &Block, v: &Variant) -> Vec<f64> {
    let gate = matmul(ln, &b.w1, TOKENS, DIMS, FFN);
    let up = matmul(ln, &b.w3, TOKENS, DIMS, FFN);
    let act: Vec<f64> = gate
        .iter()
        .zip(&up)
        .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
        .collect();
    let mut out = matmul(&act, &b.w2, TOKENS, FFN, DIMS);
    for t in 0..TOKENS {
        for &c in &v.scale_channels {
            out[t * DIMS + c] *= 1.25;
        }
    }
    out
}

/// The activations of one run, in execution order: `(key, values)`.
fn forward(m: &Model, v: &Variant) -> Activations {
    let round = |mut x: Vec<f64>| {
        if v.bf16 {
            x.iter_mut().for_each(|e| *e = bf16(*e));
        }
        x
    };
    let add = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x + y).collect::<Vec<_>>();
    let mut er = Rng(v.embed_seed);
    let table: Vec<f64> = (0..VOCAB * DIMS).map(|_| er.uniform(1.0)).collect();
    let embed: Vec<f64> = m
        .ids
        .iter()
        .flat_map(|&id| table[id * DIMS..(id + 1) * DIMS].to_vec())
        .collect();
    let mut x = round(embed);
    let mut out = vec![("model.embed_tokens:out".to_string(), x.clone())];
    // What the dumper sees of each block's output: the hidden states,
    // index 0 being the embedding output.
    let mut hidden = vec![x.clone()];
    for (n, b) in m.blocks.iter().enumerate() {
        let p = format!("model.layers.{n}");
        let ln1 = round(rms_norm(&x, &b.g1));
        let attn = round(attention(&ln1, b, v));
        let h = round(add(&x, &attn));
        let ln2 = round(rms_norm(&h, &b.g2));
        let ff = round(mlp(&ln2, b, v));
        x = round(add(&h, &ff));
        hidden.push(x.clone());
        out.push((format!("{p}.input_layernorm:out"), ln1));
        out.push((format!("{p}.self_attn:out"), attn));
        out.push((format!("{p}.post_attention_layernorm:out"), ln2));
        out.push((format!("{p}.mlp:out"), ff));
        // A shifted dumper labels hidden_states[n + 1 - shift] as block n.
        out.push((format!("{p}:out"), hidden[n + 1 - v.shift].clone()));
    }
    out.push((
        "model.norm:out".to_string(),
        round(rms_norm(&x, &m.g_final)),
    ));
    out
}

fn encode(values: &[f64], bf: bool) -> Vec<u8> {
    if bf {
        values
            .iter()
            .flat_map(|x| (((bf16(*x) as f32).to_bits() >> 16) as u16).to_le_bytes())
            .collect()
    } else {
        values
            .iter()
            .flat_map(|x| (*x as f32).to_le_bytes())
            .collect()
    }
}

/// Write `tensors` as a safetensors file with the execution order in its
/// metadata; `bf` stores BF16, else F32. Every tensor is `[1, TOKENS, DIMS]`.
pub fn write_safetensors(path: &Path, tensors: &[(String, Vec<f64>)], bf: bool) {
    let mut header = serde_json::Map::new();
    let order: Vec<&str> = tensors.iter().map(|(k, _)| k.as_str()).collect();
    header.insert(
        "__metadata__".into(),
        serde_json::json!({ "fvd_order": serde_json::to_string(&order).unwrap() }),
    );
    let mut data = Vec::new();
    for (key, values) in tensors {
        let bytes = encode(values, bf);
        let start = data.len();
        data.extend_from_slice(&bytes);
        header.insert(
            key.clone(),
            serde_json::json!({
                "dtype": if bf { "BF16" } else { "F32" },
                "shape": [1, TOKENS, values.len() / TOKENS],
                "data_offsets": [start, data.len()],
            }),
        );
    }
    let mut h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut file = (h.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&h);
    file.extend_from_slice(&data);
    std::fs::write(path, file).unwrap();
}

/// The JSONL stat trace of the same activations, as FastVideo's writer
/// would record it.
pub fn write_trace(path: &Path, tensors: &[(String, Vec<f64>)], bf: bool) {
    let mut text = String::new();
    for (key, x) in tensors {
        let (module, tensor) = key.split_once(':').unwrap();
        let n = x.len() as f64;
        let sum: f64 = x.iter().sum();
        let mean = sum / n;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1.0);
        let rec = serde_json::json!({
            "module": module,
            "tensor": tensor,
            "step": null,
            "abs_mean": x.iter().map(|v| v.abs()).sum::<f64>() / n,
            "sum": sum,
            "min": x.iter().copied().fold(f64::INFINITY, f64::min),
            "max": x.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            "mean": mean,
            "std": var.sqrt(),
            "shape": [1, TOKENS, x.len() / TOKENS],
            "dtype": if bf { "torch.bfloat16" } else { "torch.float32" },
        });
        text.push_str(&rec.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

/// One run's activations: `(key, values)` in execution order.
pub type Activations = Vec<(String, Vec<f64>)>;

/// The reference's and the port's activations of `case`.
pub fn activations(case: Case) -> (Activations, Activations) {
    let m = Model::new();
    let mut reference = Variant::reference();
    let mut port = Variant::port();
    match case {
        Case::Clean => {}
        Case::ReferenceShifted => reference.shift = 1,
        Case::PortShifted => port.shift = 1,
        Case::Padding => port.zero_attn_from = Some(PAD_FROM),
        Case::Positions => port.rope_base = 500_000.0,
        Case::Embedding => port.embed_seed = 12,
        Case::Channels => port.scale_channels = BROKEN_CHANNELS.to_vec(),
    }
    (forward(&m, &reference), forward(&m, &port))
}

/// Writes `case` into `dir`: `reference.safetensors` (F32),
/// `port.safetensors` (BF16) and their JSONL stat traces.
pub fn write_case(dir: &Path, case: Case) -> Pair {
    let (r, p) = activations(case);
    let pair = Pair {
        reference: dir.join("reference.safetensors"),
        port: dir.join("port.safetensors"),
        reference_trace: dir.join("reference.jsonl"),
        port_trace: dir.join("port.jsonl"),
    };
    write_safetensors(&pair.reference, &r, false);
    write_safetensors(&pair.port, &p, true);
    write_trace(&pair.reference_trace, &r, false);
    write_trace(&pair.port_trace, &p, true);
    pair
}
