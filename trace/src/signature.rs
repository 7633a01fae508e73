//! Comparator checks: the false-cliff signatures of the parity-debug
//! protocol (check the comparator before bisecting the model; slice the
//! cosine per token and per dimension when the global number is ambiguous).
//!
//! A signature is a pattern in a comparison that says either that the
//! comparison itself cannot be read as a verdict on the port (`untrusted`:
//! a dumper's block index is off by one, the inputs differ), or where the
//! error lives (a subset of tokens, every token but the first, a few
//! channels). Each carries its kind, structured evidence, a sentence and
//! what to check. [`compare`](fn@crate::compare) and [`crate::dumps::compare_dumps`] put
//! them in their reports (`signatures`, and as diagnostics of the same
//! code, first), and render them before the first-divergence verdict.
//!
//! Thresholds (each documented where it is defined):
//! - a token or channel slice diverges under the tensor's own thresholds
//!   (cosine below `min_cosine` or rel_diff above `max_rel_diff`);
//! - [`INPUT_MAX_REL_DIFF`]: how close the first tensor must be;
//! - [`TOKEN_ZERO_SHARE`], [`CHANNEL_ERROR_SHARE`], [`MAX_CHANNELS`];
//! - [`SHIFT_SHARE`], [`INSIDES_SHARE`], [`SHIFT_PROBES`] for layer shifts.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// The first tensor of a dump (the model's input: embedding output, prompt
/// tokens, latents) must match up to dtype rounding: rel_diff at most this
/// (1e-4 is a 1.4% RMS error; bf16 rounding is ~1e-6, one changed token of
/// 4096 already ~2e-4). Stat traces use their tolerances instead: the first
/// row must not diverge.
pub const INPUT_MAX_REL_DIFF: f64 = 1e-4;
/// token_zero: token 0 matches and at least this share of the later tokens
/// diverges.
pub const TOKEN_ZERO_SHARE: f64 = 0.95;
/// channels: the named channels carry at least this share of the error
/// energy Σ(x−y)²…
pub const CHANNEL_ERROR_SHARE: f64 = 0.9;
/// …and are at most this many, and at most a quarter of the channels.
pub const MAX_CHANNELS: usize = 8;
/// layer_shift: at least this share of the probed block outputs that
/// diverge in place match the neighbouring block on the other side (and at
/// least two of them, or every one when fewer are probed)…
pub const SHIFT_SHARE: f64 = 0.75;
/// …while at least this share of their sub-module rows match in place.
pub const INSIDES_SHARE: f64 = 0.9;
/// layer_shift: block outputs probed per direction. For dumps every probe
/// is one more streaming pass over two tensors, so this bounds the cost.
pub const SHIFT_PROBES: usize = 8;

/// One comparator check that fired.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Signature {
    /// `kind` and `evidence` in JSON.
    #[serde(flatten)]
    pub evidence: Evidence,
    /// The comparison cannot be read as a verdict on the port until this is
    /// fixed: the report's verdict is `untrusted`.
    pub untrusted: bool,
    /// What was seen, for people.
    pub message: String,
    /// What to check.
    pub check: String,
}

impl Signature {
    /// The stable, machine-readable kind (`layer_shift`, …).
    pub fn kind(&self) -> &'static str {
        match self.evidence {
            Evidence::LayerShift(_) => "layer_shift",
            Evidence::InputsDiffer(_) => "inputs_differ",
            Evidence::TokenSubset(_) => "token_subset",
            Evidence::TokenZero(_) => "token_zero",
            Evidence::Channels(_) => "channels",
        }
    }

    /// The diagnostic mirroring this signature (`{code: kind, message}`).
    pub fn diagnostic(&self) -> crate::Diagnostic {
        crate::Diagnostic::new(self.kind(), self.message.clone())
    }

    /// One line: kind, message, what to check.
    pub fn line(&self) -> String {
        format!("{}: {}; check: {}", self.kind(), self.message, self.check)
    }
}

/// The evidence of each kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "evidence", rename_all = "snake_case")]
pub enum Evidence {
    LayerShift(LayerShift),
    InputsDiffer(InputsDiffer),
    TokenSubset(TokenSubset),
    TokenZero(TokenZero),
    Channels(Channels),
}

/// Outputs of repeated blocks match the neighbouring block's output on the
/// other side while their insides match in place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerShift {
    /// The repeated blocks' path (`model.layers`).
    pub prefix: String,
    pub tensor: String,
    pub step: Option<i64>,
    /// Reference index minus port index of the same output: `1` when the
    /// reference labels each block output one block later than the port.
    pub offset: i64,
    /// `reference_ahead` (offset 1) or `reference_behind` (offset −1).
    pub direction: String,
    /// `[port block, reference block]` pairs that match across the shift.
    pub pairs: Vec<[u64; 2]>,
    /// Block outputs that diverge in place and were probed across the shift.
    pub probed: usize,
    /// Sub-module rows of the probed blocks compared in place, and how many
    /// of them match. Zero compared: the insides were not traced, and a
    /// shifted port (a skipped layer, weights loaded one layer off) looks
    /// the same; the signature is then not `untrusted`.
    pub insides_compared: usize,
    pub insides_matching: usize,
}

/// The first row in execution order (the model's input) differs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputsDiffer {
    /// Reference module (and `:tensor`) of that row.
    pub reference: String,
    pub port: String,
    pub step: Option<i64>,
    /// `rel_diff` (dumps), the stat that exceeded its tolerance (traces), or
    /// `shape`.
    pub stat: String,
    /// Its value (rel_diff or relative drift; null for a shape).
    pub value: Option<f64>,
    /// The threshold it crossed.
    pub threshold: Option<f64>,
}

/// Divergence confined to some token positions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenSubset {
    /// Reference key of the tensor (the first divergence).
    pub tensor: String,
    pub token_dim: usize,
    pub tokens: usize,
    /// Diverging positions as inclusive `[first, last]` ranges.
    pub ranges: Vec<[usize; 2]>,
    /// Distance between the starts of equally spaced ranges (padding per
    /// frame or per sequence), when there are several.
    pub period: Option<usize>,
    pub diverging: usize,
    /// Lowest cosine among the diverging positions.
    pub min_cosine: f64,
    /// Highest rel_diff among the matching positions.
    pub matching_max_rel_diff: f64,
}

/// Token 0 matches, every later token diverges.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenZero {
    pub tensor: String,
    pub token_dim: usize,
    pub tokens: usize,
    pub token0_cosine: f64,
    pub token0_rel_diff: f64,
    /// How many of tokens `1..tokens` diverge.
    pub later_diverging: usize,
    pub later_min_cosine: f64,
}

/// A few channels carry the error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Channels {
    pub tensor: String,
    pub channel_dim: usize,
    /// Size of the channel dim.
    pub size: usize,
    /// The channels carrying the error, ascending.
    pub channels: Vec<usize>,
    /// Their rel_diffs and cosines, in the same order (a channel scaled by
    /// a wrong factor keeps cosine 1; its rel_diff shows it).
    pub rel_diffs: Vec<f64>,
    pub cosines: Vec<f64>,
    /// Share of the error energy Σ(x−y)² they carry.
    pub error_share: f64,
    /// The tensor without them.
    pub rest_cosine: f64,
    pub rest_rel_diff: f64,
}

/// Σxy, Σx², Σy² of one slice.
pub type Sums = [f64; 3];

pub(crate) fn cosine(s: Sums) -> f64 {
    let [sxy, sxx, syy] = s;
    if sxx == 0.0 && syy == 0.0 {
        1.0
    } else if sxx == 0.0 || syy == 0.0 {
        0.0
    } else {
        sxy / (sxx.sqrt() * syy.sqrt())
    }
}

pub(crate) fn rel_diff(s: Sums) -> f64 {
    let [sxy, sxx, syy] = s;
    let denom = sxx + syy;
    if denom == 0.0 {
        0.0
    } else {
        1.0 - 2.0 * sxy / denom
    }
}

/// Σ(x−y)², never negative (it is computed from the three sums).
fn error(s: Sums) -> f64 {
    (s[1] + s[2] - 2.0 * s[0]).max(0.0)
}

fn diverges(s: Sums, min_cosine: f64, max_rel_diff: f64) -> bool {
    let (c, r) = (cosine(s), rel_diff(s));
    c.is_nan() || r.is_nan() || c < min_cosine || r > max_rel_diff
}

fn finite(x: f64) -> f64 {
    if x.is_finite() { x } else { 0.0 }
}

/// `48–63` or `5`.
fn range_text(r: [usize; 2]) -> String {
    if r[0] == r[1] {
        r[0].to_string()
    } else {
        format!("{}–{}", r[0], r[1])
    }
}

/// Maximal runs of consecutive positions in a sorted list.
fn runs(positions: &[usize]) -> Vec<[usize; 2]> {
    let mut out: Vec<[usize; 2]> = Vec::new();
    for &p in positions {
        match out.last_mut() {
            Some(r) if r[1] + 1 == p => r[1] = p,
            _ => out.push([p, p]),
        }
    }
    out
}

/// The period of equally spaced runs of equal length (the last may be cut
/// by the end of the tensor), if `runs` are such.
fn period(runs: &[[usize; 2]], tokens: usize) -> Option<usize> {
    if runs.len() < 2 {
        return None;
    }
    let p = runs[1][0] - runs[0][0];
    let len = runs[0][1] - runs[0][0];
    let last = runs.len() - 1;
    let regular = runs.iter().enumerate().all(|(i, r)| {
        r[0] == runs[0][0] + i * p && (r[1] - r[0] == len || (i == last && r[1] == tokens - 1))
    });
    // No run may be missing before the first or after the last one.
    let complete = runs[0][0] < p && runs[last][0] + p >= tokens;
    (regular && complete).then_some(p)
}

/// token_zero or token_subset from the per-token sums of the first
/// divergent tensor (`key`): the diverging positions must be every token
/// but 0 (at least [`TOKEN_ZERO_SHARE`] of them), or one contiguous range,
/// or equally spaced ranges of one length, and the rest must match.
pub fn token_signature(
    key: &str,
    token_dim: usize,
    sums: &[Sums],
    min_cosine: f64,
    max_rel_diff: f64,
) -> Option<Signature> {
    let t = sums.len();
    if t < 2 {
        return None;
    }
    let bad: Vec<usize> = (0..t)
        .filter(|&i| diverges(sums[i], min_cosine, max_rel_diff))
        .collect();
    if bad.is_empty() || bad.len() == t {
        return None;
    }
    let min_cos = |idx: &mut dyn Iterator<Item = usize>| {
        finite(idx.map(|i| cosine(sums[i])).fold(f64::INFINITY, f64::min))
    };
    if t >= 4 && bad[0] != 0 && bad.len() as f64 >= TOKEN_ZERO_SHARE * (t - 1) as f64 {
        let ev = TokenZero {
            tensor: key.to_string(),
            token_dim,
            tokens: t,
            token0_cosine: finite(cosine(sums[0])),
            token0_rel_diff: finite(rel_diff(sums[0])),
            later_diverging: bad.len(),
            later_min_cosine: min_cos(&mut bad.iter().copied()),
        };
        let message = format!(
            "{key}: token 0 matches (cosine {:.6}) and {} of the {} later tokens diverge (lowest cosine {:.4}): only the first position is right",
            ev.token0_cosine,
            ev.later_diverging,
            t - 1,
            ev.later_min_cosine
        );
        return Some(Signature {
            evidence: Evidence::TokenZero(ev),
            untrusted: false,
            message,
            check: "what differs once a token sees others or its position: the causal mask, position ids and rotary embeddings (base, offset, interleaving), the KV cache".to_string(),
        });
    }
    let rs = runs(&bad);
    let per = period(&rs, t);
    if rs.len() > 1 && per.is_none() {
        return None;
    }
    let good_max_rel = finite(
        (0..t)
            .filter(|i| bad.binary_search(i).is_err())
            .map(|i| rel_diff(sums[i]))
            .fold(0.0, f64::max),
    );
    let ev = TokenSubset {
        tensor: key.to_string(),
        token_dim,
        tokens: t,
        ranges: rs.clone(),
        period: per,
        diverging: bad.len(),
        min_cosine: min_cos(&mut bad.iter().copied()),
        matching_max_rel_diff: good_max_rel,
    };
    let place = match per {
        None => format!("tokens {} of {t}", range_text(rs[0])),
        Some(p) => format!(
            "tokens {} of every {p} ({} runs, {} of {t} tokens)",
            range_text([rs[0][0] % p, rs[0][1] % p]),
            rs.len(),
            bad.len()
        ),
    };
    let message = format!(
        "{key}: the divergence is confined to {place} (lowest cosine {:.4}); every other token matches (rel_diff at most {:.1e})",
        ev.min_cosine, ev.matching_max_rel_diff
    );
    Some(Signature {
        evidence: Evidence::TokenSubset(ev),
        untrusted: false,
        message,
        check: "padding and masks of those positions on both sides (attention or key-padding mask, padded tokens, sequence or frame boundaries); if both sides drop those positions later, the difference may not matter".to_string(),
    })
}

/// channels from the per-channel sums of the first divergent tensor: at
/// most [`MAX_CHANNELS`] channels (and a quarter of them) carry
/// [`CHANNEL_ERROR_SHARE`] of the error, and the tensor without them
/// matches.
pub fn channel_signature(
    key: &str,
    channel_dim: usize,
    sums: &[Sums],
    min_cosine: f64,
    max_rel_diff: f64,
) -> Option<Signature> {
    let c = sums.len();
    if c < 4 {
        return None;
    }
    let total: f64 = sums.iter().map(|s| error(*s)).sum();
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    let mut by_error: Vec<usize> = (0..c).collect();
    by_error.sort_by(|&a, &b| error(sums[b]).total_cmp(&error(sums[a])).then(a.cmp(&b)));
    let limit = MAX_CHANNELS.min(c / 4);
    let mut carried = 0.0;
    let mut k = 0;
    while k < limit && carried < CHANNEL_ERROR_SHARE * total {
        carried += error(sums[by_error[k]]);
        k += 1;
    }
    if carried < CHANNEL_ERROR_SHARE * total {
        return None;
    }
    let mut chosen = by_error[..k].to_vec();
    chosen.sort_unstable();
    let mut rest = [0.0; 3];
    for (i, s) in sums.iter().enumerate() {
        if !chosen.contains(&i) {
            for j in 0..3 {
                rest[j] += s[j];
            }
        }
    }
    if diverges(rest, min_cosine, max_rel_diff) {
        return None;
    }
    let ev = Channels {
        tensor: key.to_string(),
        channel_dim,
        size: c,
        channels: chosen.clone(),
        rel_diffs: chosen.iter().map(|&i| finite(rel_diff(sums[i]))).collect(),
        cosines: chosen.iter().map(|&i| finite(cosine(sums[i]))).collect(),
        error_share: carried / total,
        rest_cosine: finite(cosine(rest)),
        rest_rel_diff: finite(rel_diff(rest)),
    };
    let list: Vec<String> = ev.channels.iter().map(|c| c.to_string()).collect();
    let rel: Vec<String> = ev.rel_diffs.iter().map(|r| format!("{r:.1e}")).collect();
    let cos: Vec<String> = ev.cosines.iter().map(|c| format!("{c:.4}")).collect();
    let message = format!(
        "{key}: channel{} {} of {c} (dim {channel_dim}) carry {:.1}% of the error (rel_diff {}; cosine {}); without them the tensor matches (cosine {:.6}, rel_diff {:.1e})",
        if k == 1 { "" } else { "s" },
        list.join(", "),
        ev.error_share * 100.0,
        rel.join(", "),
        cos.join(", "),
        ev.rest_cosine,
        ev.rest_rel_diff
    );
    Some(Signature {
        evidence: Evidence::Channels(ev),
        untrusted: false,
        message,
        check: "the weights that write those channels (rows or columns a conversion permuted, scaled or dropped), per-channel scales and norms, head or channel order (interleaved vs split)".to_string(),
    })
}

/// The number that names a block in a module path (`blocks.3.attn` → 3),
/// with the path before it.
pub(crate) fn block_of(module: &str) -> Option<(&str, &str)> {
    let mut start = 0;
    for part in module.split('.') {
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            let prefix = module[..start].trim_end_matches('.');
            return Some((prefix, part));
        }
        start += part.len() + 1;
    }
    None
}

/// `(prefix, index)` when `module` is a block's own output (`model.layers.3`).
fn block_output(module: &str) -> Option<(&str, u64)> {
    let (prefix, idx) = block_of(module)?;
    let whole = if prefix.is_empty() {
        idx.len() == module.len()
    } else {
        module.len() == prefix.len() + 1 + idx.len()
    };
    whole
        .then(|| idx.parse().ok())
        .flatten()
        .map(|i| (prefix, i))
}

/// One aligned row, as the layer-shift check sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShiftRow<'a> {
    pub module: &'a str,
    pub tensor: &'a str,
    pub step: Option<i64>,
    pub diverged: bool,
}

/// layer_shift over aligned rows (reference names). `cross(port_row,
/// reference_row)` says whether the port side of one row matches the
/// reference side of another (`None`: not comparable, e.g. shapes differ).
pub(crate) fn layer_shift<E>(
    rows: &[ShiftRow<'_>],
    mut cross: impl FnMut(usize, usize) -> Result<Option<bool>, E>,
) -> Result<Option<Signature>, E> {
    // Block outputs grouped by (prefix, tensor, step): index -> row.
    let mut groups: BTreeMap<(&str, &str, Option<i64>), BTreeMap<u64, usize>> = BTreeMap::new();
    for (i, r) in rows.iter().enumerate() {
        if let Some((prefix, idx)) = block_output(r.module) {
            groups
                .entry((prefix, r.tensor, r.step))
                .or_default()
                .entry(idx)
                .or_insert(i);
        }
    }
    let mut best: Option<(usize, Signature)> = None;
    for ((prefix, tensor, step), blocks) in &groups {
        if blocks.len() < 2 {
            continue;
        }
        for offset in [1i64, -1] {
            let mut probed = 0usize;
            let mut pairs: Vec<[u64; 2]> = Vec::new();
            let mut probed_blocks: Vec<u64> = Vec::new();
            for (&idx, &row) in blocks {
                if !rows[row].diverged || probed >= SHIFT_PROBES {
                    continue;
                }
                let Some(other) = idx.checked_add_signed(offset) else {
                    continue;
                };
                let Some(&other_row) = blocks.get(&other) else {
                    continue;
                };
                let Some(m) = cross(row, other_row)? else {
                    continue;
                };
                probed += 1;
                probed_blocks.push(idx);
                if m {
                    pairs.push([idx, other]);
                }
            }
            let matched = pairs.len();
            if matched == 0
                || matched < probed.min(2)
                || (matched as f64) < SHIFT_SHARE * probed as f64
            {
                continue;
            }
            // The insides of the probed blocks, in place.
            let heads: Vec<String> = probed_blocks
                .iter()
                .map(|b| {
                    if prefix.is_empty() {
                        format!("{b}.")
                    } else {
                        format!("{prefix}.{b}.")
                    }
                })
                .collect();
            let (mut compared, mut matching) = (0usize, 0usize);
            for r in rows.iter().filter(|r| r.step == *step) {
                if heads.iter().any(|h| r.module.starts_with(h.as_str())) {
                    compared += 1;
                    matching += usize::from(!r.diverged);
                }
            }
            if compared > 0 && (matching as f64) < INSIDES_SHARE * compared as f64 {
                continue;
            }
            if best.as_ref().is_some_and(|(m, _)| *m >= matched) {
                continue;
            }
            best = Some((
                matched,
                shift_signature(
                    prefix, tensor, *step, offset, pairs, probed, compared, matching,
                ),
            ));
        }
    }
    Ok(best.map(|(_, s)| s))
}

#[allow(clippy::too_many_arguments)]
fn shift_signature(
    prefix: &str,
    tensor: &str,
    step: Option<i64>,
    offset: i64,
    pairs: Vec<[u64; 2]>,
    probed: usize,
    compared: usize,
    matching: usize,
) -> Signature {
    let name = |i: &str| {
        if prefix.is_empty() {
            format!("{i}:{tensor}")
        } else {
            format!("{prefix}.{i}:{tensor}")
        }
    };
    let sign = if offset > 0 { "+" } else { "−" };
    let ns: Vec<String> = pairs.iter().map(|p| p[0].to_string()).collect();
    let mut message = format!(
        "port {} matches reference {} for N = {} ({} of {} block outputs that diverge in place)",
        name("N"),
        name(&format!("N{sign}1")),
        ns.join(", "),
        pairs.len(),
        probed
    );
    let direction = if offset > 0 {
        "reference_ahead"
    } else {
        "reference_behind"
    };
    let which = if offset > 0 {
        "the reference labels each block output one block later than the port (or the port one earlier)"
    } else {
        "the port labels each block output one block later than the reference (or the reference one earlier)"
    };
    let untrusted = compared > 0;
    let check = if untrusted {
        let _ = write!(
            message,
            ", while their insides match in place ({matching} of {compared} sub-module rows): a dumper's block index is off by one; {which}"
        );
        "the dumpers' indexing of block outputs (hidden_states[0] is the embedding output, hidden_states[i + 1] block i's output), then dump again; the model is not shown to diverge".to_string()
    } else {
        let _ = write!(
            message,
            "; their insides were not traced: {which}, or the port's blocks are shifted (a skipped layer, weights loaded one layer off)"
        );
        "trace the blocks' sub-modules too: insides that match in place mean a dumper's indexing is off; insides shifted too mean the port's layers are".to_string()
    };
    Signature {
        evidence: Evidence::LayerShift(LayerShift {
            prefix: prefix.to_string(),
            tensor: tensor.to_string(),
            step,
            offset,
            direction: direction.to_string(),
            pairs,
            probed,
            insides_compared: compared,
            insides_matching: matching,
        }),
        untrusted,
        message,
        check,
    }
}

/// The check's sentence for a first row that differs.
pub(crate) fn inputs_differ(ev: InputsDiffer, what: &str) -> Signature {
    let port = if ev.port == ev.reference {
        String::new()
    } else {
        format!(" (port {})", ev.port)
    };
    let message = format!(
        "the first row in execution order, {}{port}, differs: {what}; the two runs do not start from the same inputs, so nothing after it can be read",
        ev.reference
    );
    Signature {
        evidence: Evidence::InputsDiffer(ev),
        untrusted: true,
        message,
        check: "validate the dumpers first: the same prompt tokens, latents, seeds and embedding weights on both sides (the first row must match up to dtype rounding)".to_string(),
    }
}

/// Text block of signatures for the reports, before their verdict line.
pub(crate) fn render(signatures: &[Signature]) -> String {
    let mut s = String::new();
    if signatures.is_empty() {
        return s;
    }
    let _ = writeln!(s, "comparator checks:");
    for sig in signatures {
        let tag = if sig.untrusted { " (untrusted)" } else { "" };
        let _ = writeln!(s, "  [{}]{tag} {}", sig.kind(), sig.message);
        let _ = writeln!(s, "    check: {}", sig.check);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per-slice sums of a slice whose port side is `x * (1 + e)`.
    fn slice(e: f64) -> Sums {
        // x of unit energy; y = (1 + e) x.
        [1.0 + e, 1.0, (1.0 + e) * (1.0 + e)]
    }

    fn off(s: Sums) -> Sums {
        // Orthogonal: cosine 0.
        [0.0, s[1], s[2]]
    }

    #[test]
    fn a_contiguous_tail_of_tokens_is_a_subset() {
        let sums: Vec<Sums> = (0..64)
            .map(|t| {
                if t >= 48 {
                    off(slice(0.0))
                } else {
                    slice(1e-4)
                }
            })
            .collect();
        let s = token_signature("a:out", 1, &sums, 0.99, 1e-3).unwrap();
        let Evidence::TokenSubset(ev) = &s.evidence else {
            panic!("{s:?}")
        };
        assert_eq!(ev.ranges, vec![[48, 63]]);
        assert_eq!((ev.period, ev.diverging, ev.tokens), (None, 16, 64));
        assert!(s.message.contains("tokens 48–63 of 64"), "{}", s.message);
        assert!(!s.untrusted);
    }

    #[test]
    fn periodic_runs_are_a_subset_with_a_period_and_scattered_ones_are_not() {
        // The last 4 tokens of every 16 (padding per frame).
        let sums: Vec<Sums> = (0..64)
            .map(|t| {
                if t % 16 >= 12 {
                    off(slice(0.0))
                } else {
                    slice(0.0)
                }
            })
            .collect();
        let s = token_signature("a:out", 1, &sums, 0.99, 1e-3).unwrap();
        let Evidence::TokenSubset(ev) = &s.evidence else {
            panic!("{s:?}")
        };
        assert_eq!(ev.period, Some(16));
        assert_eq!(ev.ranges.len(), 4);
        assert!(
            s.message.contains("tokens 12–15 of every 16"),
            "{}",
            s.message
        );
        // Runs of different lengths or spacing: no signature.
        let bad = [3usize, 9, 10, 30, 31, 32, 33];
        let sums: Vec<Sums> = (0..64)
            .map(|t| {
                if bad.contains(&t) {
                    off(slice(0.0))
                } else {
                    slice(0.0)
                }
            })
            .collect();
        assert!(token_signature("a:out", 1, &sums, 0.99, 1e-3).is_none());
        // Every token diverging, or none: no signature.
        let all = vec![off(slice(0.0)); 8];
        assert!(token_signature("a:out", 1, &all, 0.99, 1e-3).is_none());
        let none = vec![slice(0.0); 8];
        assert!(token_signature("a:out", 1, &none, 0.99, 1e-3).is_none());
    }

    #[test]
    fn token_zero_alone_matching_is_its_own_signature() {
        let sums: Vec<Sums> = (0..64)
            .map(|t| if t == 0 { slice(0.0) } else { slice(0.2) })
            .collect();
        let s = token_signature("a:out", 0, &sums, 0.99, 1e-3).unwrap();
        let Evidence::TokenZero(ev) = &s.evidence else {
            panic!("{s:?}")
        };
        assert_eq!((ev.later_diverging, ev.tokens), (63, 64));
        assert_eq!(ev.token0_rel_diff, 0.0);
    }

    #[test]
    fn a_few_channels_carrying_the_error_are_named() {
        let sums: Vec<Sums> = (0..32)
            .map(|c| {
                if [3, 17, 29].contains(&c) {
                    slice(0.25)
                } else {
                    slice(1e-5)
                }
            })
            .collect();
        let s = channel_signature("a:out", 2, &sums, 0.99, 1e-3).unwrap();
        let Evidence::Channels(ev) = &s.evidence else {
            panic!("{s:?}")
        };
        assert_eq!(ev.channels, [3, 17, 29]);
        assert!(ev.rel_diffs.iter().all(|r| *r > 1e-2), "{ev:?}");
        assert!(ev.error_share > 0.99 && ev.rest_rel_diff < 1e-6, "{ev:?}");
        // Spread over every channel: no signature.
        let sums: Vec<Sums> = (0..32).map(|_| slice(0.1)).collect();
        assert!(channel_signature("a:out", 2, &sums, 0.99, 1e-3).is_none());
    }

    fn row(module: &str, diverged: bool) -> ShiftRow<'_> {
        ShiftRow {
            module,
            tensor: "out",
            step: None,
            diverged,
        }
    }

    #[test]
    fn block_outputs_matching_their_neighbour_are_a_layer_shift() {
        let names: Vec<String> = (0..4)
            .flat_map(|n| [format!("m.layers.{n}.attn"), format!("m.layers.{n}")])
            .collect();
        let rows: Vec<ShiftRow<'_>> = names.iter().map(|n| row(n, !n.ends_with("attn"))).collect();
        // Port block N equals reference block N + 1.
        let idx = |r: usize| names[r].rsplit('.').next().unwrap().parse::<i64>().unwrap();
        let s = layer_shift::<()>(&rows, |p, r| Ok(Some(idx(r) == idx(p) + 1)))
            .unwrap()
            .unwrap();
        let Evidence::LayerShift(ev) = &s.evidence else {
            panic!("{s:?}")
        };
        assert_eq!((ev.offset, ev.direction.as_str()), (1, "reference_ahead"));
        assert_eq!(ev.pairs, vec![[0, 1], [1, 2], [2, 3]]);
        assert_eq!((ev.insides_compared, ev.insides_matching), (3, 3));
        assert!(s.untrusted);
        // Insides that diverge too: not a dumper's shift.
        let rows: Vec<ShiftRow<'_>> = names.iter().map(|n| row(n, true)).collect();
        assert!(
            layer_shift::<()>(&rows, |p, r| Ok(Some(idx(r) == idx(p) + 1)))
                .unwrap()
                .is_none()
        );
        // No neighbour matching: nothing.
        let rows: Vec<ShiftRow<'_>> = names.iter().map(|n| row(n, !n.ends_with("attn"))).collect();
        assert!(
            layer_shift::<()>(&rows, |_, _| Ok(Some(false)))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn signatures_round_trip_through_json_with_kind_and_evidence() {
        let s = inputs_differ(
            InputsDiffer {
                reference: "embed:out".into(),
                port: "embed:out".into(),
                step: None,
                stat: "rel_diff".into(),
                value: Some(0.5),
                threshold: Some(INPUT_MAX_REL_DIFF),
            },
            "rel_diff 0.5",
        );
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["kind"], "inputs_differ");
        assert_eq!(v["evidence"]["stat"], "rel_diff");
        assert_eq!(v["untrusted"], true);
        let back: Signature = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
    }
}
