//! Full-tensor dump comparator.
//!
//! Inputs are safetensors files (keys `module:tensor`, optionally `@step`)
//! or folders of `.npy` files named the same way. The port side's module
//! part goes through the same rename rules as trace comparison. Per tensor,
//! in float64: cosine, `rel_diff = 1 − 2Σxy / Σ(x² + y²)`, max |Δ| with its
//! coordinate and the two values there, mean |Δ|, and, with a token dim,
//! the cosine of every token.
//!
//! A tensor diverges when its cosine drops below [`DEFAULT_MIN_COSINE`] *or*
//! its rel_diff rises above [`DEFAULT_MAX_REL_DIFF`]: cosine alone is blind
//! to scale (a wrong norm epsilon rescales the output and keeps cosine at
//! 0.998), rel_diff is not, because it compares magnitudes too.
//!
//! Safetensors headers are JSON objects whose key order writers do not keep,
//! so the execution order comes from `--order TRACE.jsonl`, else from the
//! [`ORDER_METADATA_KEY`] entry of the reference's `__metadata__` (a JSON
//! list of keys, written by the `fvd_trace` Python package), else from a
//! numeric-aware sort of the keys, with a diagnostic saying so.
//!
//! Comparator checks ([`crate::signature`]) run before the first divergence
//! is read: `inputs_differ` (the first tensor in execution order differs
//! beyond dtype rounding), `layer_shift` (block outputs match the
//! neighbouring block of the other side, insides match in place: probed
//! with at most [`crate::signature::SHIFT_PROBES`] extra tensor passes per
//! direction; the first divergence is then not named), and on the first
//! divergent tensor, from one more streaming pass that sums per token
//! (`--token-dim`) and per channel (`--channel-dim`, default the last dim):
//! `token_subset`, `token_zero` and `channels`. No common tensor is verdict
//! `nothing_compared`, never a success.
//!
//! Memory stays bounded whatever the file size: tensors are read through
//! small memory-mapped windows that are unmapped after use (a mapping of the
//! whole file would count every touched page in the process's resident set),
//! decoded chunk by chunk into fixed buffers. The two cores are used by
//! splitting each tensor's element range between threads.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::diag::{Collector, Diagnostic};
use crate::error::TraceError;
use crate::record::read_trace;
use crate::rename::Renamer;
use crate::report::{FirstDivergence, Unmatched, UnmatchedSides, Verdict};
use crate::signature::{self, InputsDiffer, ShiftRow, Signature, Sums, block_of};

/// Default cosine threshold.
pub const DEFAULT_MIN_COSINE: f64 = 0.99;
/// Default rel_diff threshold: about a 4.5% RMS error; bf16 noise is ~1e-5.
pub const DEFAULT_MAX_REL_DIFF: f64 = 1e-3;
/// `__metadata__` key holding the execution order (a JSON list of keys).
pub const ORDER_METADATA_KEY: &str = "fvd_order";
/// Elements mapped per window (per thread): 4 MiB of f32 per side.
const CHUNK: usize = 1 << 20;
/// Elements decoded to f64 at a time: small enough that both decode
/// buffers stay in L1/L2 cache between the decode and the accumulate.
const BLOCK: usize = 4096;
/// Per-token cosines are listed in the report up to this many tokens.
const TOKEN_LIST_LIMIT: usize = 4096;
/// Per-slice sums of the first divergent tensor are kept for at most this
/// many tokens or channels (24 bytes each per thread).
const SLICE_LIMIT: usize = 1 << 22;

/// Options of [`compare_dumps`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct DumpOptions {
    pub rename: Vec<String>,
    pub order: Option<PathBuf>,
    pub token_dim: Option<usize>,
    /// Dim of the per-channel slices of the first divergent tensor; the
    /// last dim when absent.
    pub channel_dim: Option<usize>,
    pub min_cosine: f64,
    pub max_rel_diff: f64,
}

impl Default for DumpOptions {
    fn default() -> Self {
        DumpOptions {
            rename: Vec::new(),
            order: None,
            token_dim: None,
            channel_dim: None,
            min_cosine: DEFAULT_MIN_COSINE,
            max_rel_diff: DEFAULT_MAX_REL_DIFF,
        }
    }
}

/// Element types the comparator reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DType {
    F16,
    BF16,
    F32,
    F64,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 => 4,
            DType::F64 => 8,
        }
    }
}

/// Where one tensor's bytes are.
#[derive(Debug, Clone)]
pub struct TensorRef {
    pub key: String,
    pub module: String,
    pub tensor: String,
    pub step: Option<i64>,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub path: PathBuf,
    pub offset: u64,
}

impl TensorRef {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The tensors of one dump and the order its writer recorded, if any.
#[derive(Debug, Clone)]
pub struct DumpSource {
    pub tensors: Vec<TensorRef>,
    pub order: Option<Vec<String>>,
}

/// Split `module:tensor@step` into its parts.
pub fn parse_key(key: &str) -> (String, String, Option<i64>) {
    let (body, step) = match key.rsplit_once('@') {
        Some((b, s)) if s.parse::<i64>().is_ok() => (b, s.parse().ok()),
        _ => (key, None),
    };
    match body.split_once(':') {
        Some((m, t)) => (m.to_string(), t.to_string(), step),
        None => (body.to_string(), "out".to_string(), step),
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TraceError + '_ {
    move |e| TraceError::io(path, e)
}

/// Open a dump: a safetensors file or a folder of `.npy` files.
pub fn open_dump(path: &Path) -> Result<DumpSource, TraceError> {
    if path.is_dir() {
        open_npy_dir(path)
    } else {
        open_safetensors(path)
    }
}

fn open_safetensors(path: &Path) -> Result<DumpSource, TraceError> {
    use std::io::Read;
    let mut f = File::open(path).map_err(io(path))?;
    let file_len = f.metadata().map_err(io(path))?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n)
        .map_err(|_| TraceError::dump(path, "not a safetensors file: shorter than its header"))?;
    let n = u64::from_le_bytes(n);
    if n > MAX_SAFETENSORS_HEADER || 8 + n > file_len {
        return Err(TraceError::dump(
            path,
            "not a safetensors file: bad header length",
        ));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(io(path))?;
    parse_safetensors_header(path, &header, file_len)
}

/// Largest safetensors header read (its JSON), well above any real dump's.
const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

/// The tensors a safetensors header lists. `header` is its JSON (after
/// the 8-byte length), `file_len` the whole file's size; `path` names the
/// file in errors and in the tensors. No tensor may run past the file, and
/// no key may appear twice (JSON allows it; readers disagree on which one
/// counts, so the two sides of a comparison could read different tensors).
pub fn parse_safetensors_header(
    path: &Path,
    header: &[u8],
    file_len: u64,
) -> Result<DumpSource, TraceError> {
    let data_start = 8 + header.len() as u64;
    let header: Header = serde_json::from_slice(header)
        .map_err(|e| TraceError::dump(path, format!("bad safetensors header: {e}")))?;
    let mut tensors = Vec::new();
    let mut order = None;
    for (key, v) in &header.0 {
        if key == "__metadata__" {
            if let Some(s) = v.get(ORDER_METADATA_KEY).and_then(|s| s.as_str()) {
                let list: Vec<String> = serde_json::from_str(s).map_err(|e| {
                    TraceError::dump(
                        path,
                        format!(
                            "__metadata__.{ORDER_METADATA_KEY} is not a JSON list of keys: {e}"
                        ),
                    )
                })?;
                order = Some(list);
            }
            continue;
        }
        let bad = |m: &str| TraceError::dump(path, format!("tensor {key:?}: {m}"));
        let dtype = match v.get("dtype").and_then(|d| d.as_str()) {
            Some("F32") => DType::F32,
            Some("F16") => DType::F16,
            Some("BF16") => DType::BF16,
            Some("F64") => DType::F64,
            Some(other) => return Err(bad(&format!("unsupported dtype {other}"))),
            None => return Err(bad("no dtype")),
        };
        let shape: Vec<usize> = v
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("no shape"))?
            .iter()
            .map(|d| {
                d.as_u64()
                    .and_then(|d| usize::try_from(d).ok())
                    .ok_or_else(|| bad("bad shape"))
            })
            .collect::<Result<_, _>>()?;
        let offs = v
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("no data_offsets"))?;
        let (s, e) = match (
            offs.first().and_then(|x| x.as_u64()),
            offs.get(1).and_then(|x| x.as_u64()),
        ) {
            (Some(s), Some(e)) if e >= s => (s, e),
            _ => return Err(bad("bad data_offsets")),
        };
        // Checked: a forged shape or offset must not overflow into a
        // size that looks right.
        let bytes = byte_len(&shape, dtype);
        if bytes != Some(e - s) || data_start.checked_add(e).is_none_or(|end| end > file_len) {
            return Err(bad(
                "data_offsets do not match the shape or run past the end of the file",
            ));
        }
        let (module, tensor, step) = parse_key(key);
        tensors.push(TensorRef {
            key: key.clone(),
            module,
            tensor,
            step,
            dtype,
            shape,
            path: path.to_path_buf(),
            offset: data_start + s,
        });
    }
    Ok(DumpSource { tensors, order })
}

/// Bytes of a tensor of `shape` and `dtype`; `None` when that overflows.
fn byte_len(shape: &[usize], dtype: DType) -> Option<u64> {
    shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d as u64))
}

/// A safetensors header's entries in key order (as `serde_json::Map`
/// keeps them), refused when a key appears twice.
struct Header(std::collections::BTreeMap<String, serde_json::Value>);

impl<'de> Deserialize<'de> for Header {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = std::collections::BTreeMap<String, serde_json::Value>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = std::collections::BTreeMap::new();
                while let Some(key) = m.next_key::<String>()? {
                    if out.contains_key(&key) {
                        return Err(serde::de::Error::custom(format!(
                            "key {key:?} appears more than once"
                        )));
                    }
                    let value = m.next_value()?;
                    out.insert(key, value);
                }
                Ok(out)
            }
        }
        Ok(Header(d.deserialize_map(Entries)?))
    }
}

fn open_npy_dir(dir: &Path) -> Result<DumpSource, TraceError> {
    let mut tensors = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let path = entry.map_err(io(dir))?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("npy") {
            continue;
        }
        let key = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (dtype, shape, offset) = read_npy_header(&path)?;
        let (module, tensor, step) = parse_key(&key);
        tensors.push(TensorRef {
            key,
            module,
            tensor,
            step,
            dtype,
            shape,
            path,
            offset,
        });
    }
    let order = match std::fs::read_to_string(dir.join(format!("{ORDER_METADATA_KEY}.json"))) {
        Ok(s) => Some(serde_json::from_str(&s).map_err(|e| {
            TraceError::dump(
                dir.join(format!("{ORDER_METADATA_KEY}.json")),
                e.to_string(),
            )
        })?),
        Err(_) => None,
    };
    Ok(DumpSource { tensors, order })
}

/// Parse a `.npy` header: dtype, shape, and the offset of the data.
pub fn read_npy_header(path: &Path) -> Result<(DType, Vec<usize>, u64), TraceError> {
    use std::io::Read;
    let f = File::open(path).map_err(io(path))?;
    let file_len = f.metadata().map_err(io(path))?.len();
    // The preamble, then exactly the header it announces: never a buffer
    // sized by a length field the file could not back.
    let mut head = Vec::with_capacity(12);
    (&f).take(12).read_to_end(&mut head).map_err(io(path))?;
    let (start, hlen) = npy_extent(path, &head)?;
    let end = start + hlen as u64;
    if end > file_len {
        return Err(TraceError::dump(
            path,
            "npy header runs past the end of the file",
        ));
    }
    // The preamble read may already hold the start of the header.
    let more = end.saturating_sub(head.len() as u64);
    (&f).take(more).read_to_end(&mut head).map_err(io(path))?;
    parse_npy_header(path, &head, file_len)
}

/// Where a `.npy` header starts and how long it is, from the preamble.
fn npy_extent(path: &Path, head: &[u8]) -> Result<(u64, usize), TraceError> {
    if head.len() < 10 {
        return Err(TraceError::dump(path, "not a .npy file"));
    }
    if &head[..6] != b"\x93NUMPY" {
        return Err(TraceError::dump(path, "not a .npy file: bad magic"));
    }
    if head[6] == 1 {
        return Ok((10, u16::from_le_bytes([head[8], head[9]]) as usize));
    }
    match head.get(10..12) {
        Some(more) => Ok((
            12,
            u32::from_le_bytes([head[8], head[9], more[0], more[1]]) as usize,
        )),
        None => Err(TraceError::dump(path, "not a .npy file")),
    }
}

/// Parse a `.npy` header from the file's first bytes (`head`: preamble and
/// header) and the file's size: dtype, shape, and the offset of the data,
/// which must fit in the file.
pub fn parse_npy_header(
    path: &Path,
    head: &[u8],
    file_len: u64,
) -> Result<(DType, Vec<usize>, u64), TraceError> {
    let (start, hlen) = npy_extent(path, head)?;
    let h = head
        .get(start as usize..start as usize + hlen)
        .ok_or_else(|| TraceError::dump(path, "npy header runs past the end of the file"))?;
    let h = String::from_utf8_lossy(h);
    let field = |name: &str| -> Option<String> {
        let at = h.find(&format!("'{name}'"))?;
        let rest = h[at + name.len() + 2..]
            .trim_start()
            .strip_prefix(':')?
            .trim_start();
        Some(rest.to_string())
    };
    let descr = field("descr").ok_or_else(|| TraceError::dump(path, "npy header has no descr"))?;
    let descr = descr.trim_start_matches('\'');
    let descr = &descr[..descr.find('\'').unwrap_or(descr.len())];
    let dtype = match descr {
        "<f4" | "f4" => DType::F32,
        "<f8" | "f8" => DType::F64,
        "<f2" | "f2" => DType::F16,
        // numpy has no bfloat16; ml_dtypes writes it as a 2-byte void.
        "<V2" | "|V2" | "bfloat16" => DType::BF16,
        other => {
            return Err(TraceError::dump(
                path,
                format!(
                    "unsupported npy dtype {} (little-endian f2, f4, f8 or bf16 only)",
                    other.chars().take(32).collect::<String>()
                ),
            ));
        }
    };
    if field("fortran_order").is_some_and(|v| v.starts_with("True")) {
        return Err(TraceError::dump(
            path,
            "fortran-order npy arrays are not supported",
        ));
    }
    let shape_txt =
        field("shape").ok_or_else(|| TraceError::dump(path, "npy header has no shape"))?;
    let inner = shape_txt
        .trim_start_matches('(')
        .split(')')
        .next()
        .unwrap_or("");
    let shape: Vec<usize> = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|_| TraceError::dump(path, "bad npy shape"))?;
    let offset = start + hlen as u64;
    // The data is mapped later: a shape the file cannot back would fault
    // (SIGBUS) on the first page past its end instead of failing here.
    if byte_len(&shape, dtype)
        .and_then(|b| b.checked_add(offset))
        .is_none_or(|end| end > file_len)
    {
        return Err(TraceError::dump(
            path,
            "npy shape runs past the end of the file",
        ));
    }
    Ok((dtype, shape, offset))
}

/// Map `len` bytes of `file` at `offset`, read-only, faulted in at once
/// (`populate`: one call instead of a page fault per 4 KiB page).
#[allow(unsafe_code)]
pub(crate) fn map_window(file: &File, offset: u64, len: usize) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the mapping is read-only and lives only while one chunk (or
    // one trace file) is read. Dumps and traces are finished files nobody
    // writes while fvd reads them; were one truncated meanwhile, the process
    // could fault, which is the documented risk of every mmap-based reader.
    unsafe {
        memmap2::MmapOptions::new()
            .offset(offset)
            .len(len)
            .populate()
            .map(file)
    }
}

/// Metrics of one pair of tensors.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub cosine: f64,
    pub rel_diff: f64,
    pub max_abs_diff: f64,
    pub max_abs_diff_at: Vec<usize>,
    pub reference_value: f64,
    pub port_value: f64,
    pub mean_abs_diff: f64,
    pub reference_norm: f64,
    pub port_norm: f64,
    pub identical: bool,
    pub token_cosine_min: Option<f64>,
    pub token_cosine_min_at: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub token_cosine: Option<Vec<f64>>,
}

#[derive(Debug, Clone, Default)]
struct Acc {
    sxy: f64,
    sxx: f64,
    syy: f64,
    sad: f64,
    max_ad: f64,
    max_idx: usize,
    max_x: f64,
    max_y: f64,
    identical: bool,
    tok: Vec<[f64; 3]>,
}

impl Acc {
    fn new(tokens: usize) -> Self {
        Acc {
            max_ad: -1.0,
            identical: true,
            tok: vec![[0.0; 3]; tokens],
            ..Default::default()
        }
    }

    fn combine(&mut self, o: Acc) {
        self.sxy += o.sxy;
        self.sxx += o.sxx;
        self.syy += o.syy;
        self.sad += o.sad;
        if o.max_ad > self.max_ad {
            self.max_ad = o.max_ad;
            self.max_idx = o.max_idx;
            self.max_x = o.max_x;
            self.max_y = o.max_y;
        }
        self.identical &= o.identical;
        for (a, b) in self.tok.iter_mut().zip(o.tok) {
            a[0] += b[0];
            a[1] += b[1];
            a[2] += b[2];
        }
    }
}

fn decode(dtype: DType, bytes: &[u8], out: &mut [f64]) {
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64;
            }
        }
        DType::F64 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(8)) {
                *o = f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f64();
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                // bf16 is the top half of an f32.
                *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16) as f64;
            }
        }
    }
}

/// Sums of one chunk, written with independent lanes so the compiler can
/// vectorize; the max |Δ| position is found in a second pass only for the
/// rare chunk that raises the running max.
fn accumulate(xs: &[f64], ys: &[f64], base: usize, acc: &mut Acc) {
    const L: usize = 4;
    let mut sxy = [0.0; L];
    let mut sxx = [0.0; L];
    let mut syy = [0.0; L];
    let mut sad = [0.0; L];
    let mut mad = [0.0f64; L];
    let xc = xs.chunks_exact(L);
    let yc = ys.chunks_exact(L);
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (x, y) in xc.zip(yc) {
        for l in 0..L {
            let d = (x[l] - y[l]).abs();
            sxy[l] += x[l] * y[l];
            sxx[l] += x[l] * x[l];
            syy[l] += y[l] * y[l];
            sad[l] += d;
            // A compare-select (not f64::max, whose NaN rules cost extra
            // instructions) keeps the loop vectorizable; NaN shows in the sums.
            mad[l] = if d > mad[l] { d } else { mad[l] };
        }
    }
    for (x, y) in xr.iter().zip(yr) {
        let d = (x - y).abs();
        sxy[0] += x * y;
        sxx[0] += x * x;
        syy[0] += y * y;
        sad[0] += d;
        mad[0] = if d > mad[0] { d } else { mad[0] };
    }
    acc.sxy += sxy.iter().sum::<f64>();
    acc.sxx += sxx.iter().sum::<f64>();
    acc.syy += syy.iter().sum::<f64>();
    let block_sad = sad.iter().sum::<f64>();
    acc.sad += block_sad;
    // Σ|Δ| = 0 means every pair is equal (+0 and −0 count as equal; a NaN
    // makes the sum NaN, which is not identical).
    acc.identical &= block_sad == 0.0;
    let chunk_max = mad.iter().copied().fold(0.0, f64::max);
    if (chunk_max > acc.max_ad || acc.max_ad < 0.0)
        && let Some(i) = xs
            .iter()
            .zip(ys)
            .position(|(x, y)| (x - y).abs() == chunk_max)
    {
        acc.max_ad = chunk_max;
        acc.max_idx = base + i;
        acc.max_x = xs[i];
        acc.max_y = ys[i];
    }
    // NaN never raises the max; make sure a NaN still shows as a mismatch.
    if acc.max_ad < 0.0 && !xs.is_empty() {
        acc.max_ad = f64::NAN;
        acc.max_idx = base;
        acc.max_x = xs[0];
        acc.max_y = ys[0];
    }
}

fn accumulate_tokens(xs: &[f64], ys: &[f64], base: usize, inner: usize, acc: &mut Acc) {
    let t = acc.tok.len();
    let mut i = 0;
    while i < xs.len() {
        let pos = base + i;
        let token = (pos / inner) % t;
        let end = (i + inner - pos % inner).min(xs.len());
        let slot = &mut acc.tok[token];
        for (x, y) in xs[i..end].iter().zip(&ys[i..end]) {
            slot[0] += x * y;
            slot[1] += x * x;
            slot[2] += y * y;
        }
        i = end;
    }
}

fn scan_range(
    a: &TensorRef,
    b: &TensorRef,
    range: std::ops::Range<usize>,
    tokens: Option<(usize, usize)>,
) -> Result<Acc, TraceError> {
    let fa = File::open(&a.path).map_err(io(&a.path))?;
    let fb = File::open(&b.path).map_err(io(&b.path))?;
    let mut acc = Acc::new(tokens.map_or(0, |t| t.0));
    let mut xs = [0.0f64; BLOCK];
    let mut ys = [0.0f64; BLOCK];
    let (sa, sb) = (a.dtype.size(), b.dtype.size());
    let mut start = range.start;
    while start < range.end {
        let len = CHUNK.min(range.end - start);
        let ma = map_window(&fa, a.offset + (start * sa) as u64, len * sa).map_err(io(&a.path))?;
        let mb = map_window(&fb, b.offset + (start * sb) as u64, len * sb).map_err(io(&b.path))?;
        let mut i = 0;
        while i < len {
            let n = BLOCK.min(len - i);
            decode(a.dtype, &ma[i * sa..(i + n) * sa], &mut xs[..n]);
            decode(b.dtype, &mb[i * sb..(i + n) * sb], &mut ys[..n]);
            accumulate(&xs[..n], &ys[..n], start + i, &mut acc);
            if let Some((_, inner)) = tokens {
                accumulate_tokens(&xs[..n], &ys[..n], start + i, inner, &mut acc);
            }
            i += n;
        }
        // Dropping the windows unmaps them, so resident memory stays at
        // two windows per thread whatever the file size.
        drop((ma, mb));
        start += len;
    }
    Ok(acc)
}

fn cosine(sxy: f64, sxx: f64, syy: f64) -> f64 {
    if sxx == 0.0 && syy == 0.0 {
        1.0
    } else if sxx == 0.0 || syy == 0.0 {
        0.0
    } else {
        sxy / (sxx.sqrt() * syy.sqrt())
    }
}

fn unravel(mut idx: usize, shape: &[usize]) -> Vec<usize> {
    let mut out = vec![0; shape.len()];
    for (o, &d) in out.iter_mut().zip(shape).rev() {
        if d > 0 {
            *o = idx % d;
            idx /= d;
        }
    }
    out
}

/// Compare two tensors of the same shape, streaming.
pub fn tensor_metrics(
    a: &TensorRef,
    b: &TensorRef,
    token_dim: Option<usize>,
    threads: usize,
) -> Result<Metrics, TraceError> {
    metrics_and_tokens(a, b, token_dim, threads).map(|(m, _)| m)
}

/// [`tensor_metrics`] and the per-token sums behind its token cosines
/// (empty without a token dim).
fn metrics_and_tokens(
    a: &TensorRef,
    b: &TensorRef,
    token_dim: Option<usize>,
    threads: usize,
) -> Result<(Metrics, Vec<Sums>), TraceError> {
    let n = a.numel();
    let tokens = token_dim.filter(|&d| d < a.shape.len()).map(|d| {
        (
            a.shape[d],
            a.shape[d + 1..].iter().product::<usize>().max(1),
        )
    });
    let threads = threads.clamp(1, n.div_ceil(CHUNK).max(1));
    let per = n.div_ceil(threads);
    let parts: Vec<std::ops::Range<usize>> = (0..threads)
        .map(|t| (t * per).min(n)..((t + 1) * per).min(n))
        .collect();
    let results: Vec<Result<Acc, TraceError>> = if parts.len() == 1 {
        vec![scan_range(a, b, parts[0].clone(), tokens)]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = parts
                .iter()
                .map(|r| {
                    let r = r.clone();
                    s.spawn(move || scan_range(a, b, r, tokens))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("dump scan thread panicked"))
                .collect()
        })
    };
    let mut acc = Acc::new(tokens.map_or(0, |t| t.0));
    acc.max_ad = -1.0;
    for r in results {
        acc.combine(r?);
    }
    let denom = acc.sxx + acc.syy;
    let rel_diff = if denom == 0.0 {
        0.0
    } else {
        1.0 - 2.0 * acc.sxy / denom
    };
    let (token_cosine_min, token_cosine_min_at, token_cosine) = if tokens.is_some() {
        let cos: Vec<f64> = acc.tok.iter().map(|t| cosine(t[0], t[1], t[2])).collect();
        let (at, min) = cos
            .iter()
            .enumerate()
            .fold((0, f64::INFINITY), |(bi, bv), (i, &v)| {
                if v < bv || v.is_nan() && !bv.is_nan() {
                    (i, v)
                } else {
                    (bi, bv)
                }
            });
        let list = (cos.len() <= TOKEN_LIST_LIMIT).then_some(cos);
        (Some(min), Some(at), list)
    } else {
        (None, None, None)
    };
    let token_sums = std::mem::take(&mut acc.tok);
    let m = Metrics {
        cosine: cosine(acc.sxy, acc.sxx, acc.syy),
        rel_diff,
        max_abs_diff: acc.max_ad.max(0.0),
        max_abs_diff_at: unravel(acc.max_idx, &a.shape),
        reference_value: acc.max_x,
        port_value: acc.max_y,
        mean_abs_diff: if n == 0 { 0.0 } else { acc.sad / n as f64 },
        reference_norm: acc.sxx.sqrt(),
        port_norm: acc.syy.sqrt(),
        identical: acc.identical,
        token_cosine_min,
        token_cosine_min_at,
        token_cosine,
    };
    Ok((m, token_sums))
}

/// `(count, inner)` of `dim` in `shape`: slice index of element `pos` is
/// `(pos / inner) % count`.
fn slicing(shape: &[usize], dim: usize) -> Option<(usize, usize)> {
    let count = *shape.get(dim)?;
    let inner = shape[dim + 1..].iter().product::<usize>().max(1);
    (2..=SLICE_LIMIT).contains(&count).then_some((count, inner))
}

/// Σxy, Σx², Σy² per slice of `dim` (`(count, inner)` from [`slicing`]) of
/// two tensors of one shape, streaming as [`tensor_metrics`] does.
pub fn slice_sums(
    a: &TensorRef,
    b: &TensorRef,
    (count, inner): (usize, usize),
    threads: usize,
) -> Result<Vec<Sums>, TraceError> {
    let n = a.numel();
    let threads = threads.clamp(1, n.div_ceil(CHUNK).max(1));
    let per = n.div_ceil(threads);
    let scan = |range: std::ops::Range<usize>| -> Result<SliceAcc, TraceError> {
        let mut acc = SliceAcc::new(count);
        walk(a, b, range, |xs, ys, base| {
            add_slices(xs, ys, base, inner, &mut acc)
        })?;
        Ok(acc)
    };
    let parts: Vec<std::ops::Range<usize>> = (0..threads)
        .map(|t| (t * per).min(n)..((t + 1) * per).min(n))
        .collect();
    let results: Vec<Result<SliceAcc, TraceError>> = std::thread::scope(|s| {
        let handles: Vec<_> = parts
            .iter()
            .map(|r| {
                let r = r.clone();
                s.spawn(move || scan(r))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("dump slice thread panicked"))
            .collect()
    });
    let mut sums = vec![[0.0; 3]; count];
    for r in results {
        let r = r?;
        for (i, s) in sums.iter_mut().enumerate() {
            s[0] += r.xy[i];
            s[1] += r.xx[i];
            s[2] += r.yy[i];
        }
    }
    Ok(sums)
}

/// Per-slice sums as three arrays, so that consecutive channels are
/// consecutive memory and the inner loops vectorize.
#[derive(Debug)]
struct SliceAcc {
    xy: Vec<f64>,
    xx: Vec<f64>,
    yy: Vec<f64>,
}

impl SliceAcc {
    fn new(count: usize) -> Self {
        SliceAcc {
            xy: vec![0.0; count],
            xx: vec![0.0; count],
            yy: vec![0.0; count],
        }
    }
}

/// Adds a decoded block (first element index `base`) to its slices: with
/// `inner == 1` (the last dim) element `i` belongs to slice `(base + i) %
/// count`, walked as contiguous segments; otherwise each run of `inner`
/// elements belongs to one slice and is summed in independent lanes.
fn add_slices(xs: &[f64], ys: &[f64], base: usize, inner: usize, acc: &mut SliceAcc) {
    let count = acc.xy.len();
    if inner == 1 {
        let (mut i, mut c) = (0, base % count);
        while i < xs.len() {
            let len = (count - c).min(xs.len() - i);
            let (x, y) = (&xs[i..i + len], &ys[i..i + len]);
            let (xy, xx, yy) = (
                &mut acc.xy[c..c + len],
                &mut acc.xx[c..c + len],
                &mut acc.yy[c..c + len],
            );
            for k in 0..len {
                xy[k] += x[k] * y[k];
                xx[k] += x[k] * x[k];
                yy[k] += y[k] * y[k];
            }
            i += len;
            c = 0;
        }
        return;
    }
    const L: usize = 4;
    let mut i = 0;
    while i < xs.len() {
        let pos = base + i;
        let end = (i + inner - pos % inner).min(xs.len());
        let (mut sxy, mut sxx, mut syy) = ([0.0; L], [0.0; L], [0.0; L]);
        let (xc, yc) = (xs[i..end].chunks_exact(L), ys[i..end].chunks_exact(L));
        let (xr, yr) = (xc.remainder(), yc.remainder());
        for (x, y) in xc.zip(yc) {
            for l in 0..L {
                sxy[l] += x[l] * y[l];
                sxx[l] += x[l] * x[l];
                syy[l] += y[l] * y[l];
            }
        }
        for (x, y) in xr.iter().zip(yr) {
            sxy[0] += x * y;
            sxx[0] += x * x;
            syy[0] += y * y;
        }
        let slot = (pos / inner) % count;
        acc.xy[slot] += sxy.iter().sum::<f64>();
        acc.xx[slot] += sxx.iter().sum::<f64>();
        acc.yy[slot] += syy.iter().sum::<f64>();
        i = end;
    }
}

/// Streams the element range `range` of two tensors through `f` in decoded
/// blocks (`f(xs, ys, first element index)`), one mapped window at a time.
fn walk(
    a: &TensorRef,
    b: &TensorRef,
    range: std::ops::Range<usize>,
    mut f: impl FnMut(&[f64], &[f64], usize),
) -> Result<(), TraceError> {
    walk_while(a, b, range, |xs, ys, base| {
        f(xs, ys, base);
        true
    })
}

/// [`walk`] that stops when `f` returns false.
fn walk_while(
    a: &TensorRef,
    b: &TensorRef,
    range: std::ops::Range<usize>,
    mut f: impl FnMut(&[f64], &[f64], usize) -> bool,
) -> Result<(), TraceError> {
    let fa = File::open(&a.path).map_err(io(&a.path))?;
    let fb = File::open(&b.path).map_err(io(&b.path))?;
    let mut xs = [0.0f64; BLOCK];
    let mut ys = [0.0f64; BLOCK];
    let (sa, sb) = (a.dtype.size(), b.dtype.size());
    let mut start = range.start;
    while start < range.end {
        let len = CHUNK.min(range.end - start);
        let ma = map_window(&fa, a.offset + (start * sa) as u64, len * sa).map_err(io(&a.path))?;
        let mb = map_window(&fb, b.offset + (start * sb) as u64, len * sb).map_err(io(&b.path))?;
        let mut i = 0;
        while i < len {
            let n = BLOCK.min(len - i);
            decode(a.dtype, &ma[i * sa..(i + n) * sa], &mut xs[..n]);
            decode(b.dtype, &mb[i * sb..(i + n) * sb], &mut ys[..n]);
            if !f(&xs[..n], &ys[..n], start + i) {
                return Ok(());
            }
            i += n;
        }
        drop((ma, mb));
        start += len;
    }
    Ok(())
}

/// Whether port tensor `b` matches reference tensor `a` (another block's)
/// within the thresholds. `energy` is Σx² + Σy², known from both tensors'
/// own comparisons: a match needs Σ(x−y)² ≤ max_rel_diff × energy, so the
/// scan stops as soon as the running error passes that budget, which for a
/// pair that does not match is within its first blocks.
fn cross_match(
    a: &TensorRef,
    b: &TensorRef,
    energy: f64,
    opts: &DumpOptions,
) -> Result<bool, TraceError> {
    let budget = opts.max_rel_diff * energy;
    let (mut err, mut s) = (0.0f64, [0.0f64; 3]);
    let mut over = false;
    walk_while(a, b, 0..a.numel(), |xs, ys, _| {
        for (x, y) in xs.iter().zip(ys) {
            err += (x - y) * (x - y);
            s[0] += x * y;
            s[1] += x * x;
            s[2] += y * y;
        }
        over = err.is_nan() || err > budget;
        !over
    })?;
    Ok(!over
        && signature::rel_diff(s) <= opts.max_rel_diff
        && signature::cosine(s) >= opts.min_cosine)
}

/// token_zero / token_subset (from the per-token sums of the main pass) and
/// channels (one more streaming pass) of the first divergent tensor.
fn slice_signatures(
    ta: &TensorRef,
    tb: &TensorRef,
    token_sums: &[Sums],
    opts: &DumpOptions,
    threads: usize,
) -> Result<Vec<Signature>, TraceError> {
    let nd = ta.shape.len();
    let token_dim = opts.token_dim.filter(|&d| d < nd);
    let mut out = Vec::new();
    if let Some(d) = token_dim {
        out.extend(signature::token_signature(
            &ta.key,
            d,
            token_sums,
            opts.min_cosine,
            opts.max_rel_diff,
        ));
    }
    let channel_dim = opts
        .channel_dim
        .or(nd.checked_sub(1))
        .filter(|&d| d < nd && Some(d) != token_dim);
    if let Some(d) = channel_dim
        && let Some(channels) = slicing(&ta.shape, d)
    {
        let sums = slice_sums(ta, tb, channels, threads)?;
        out.extend(signature::channel_signature(
            &ta.key,
            d,
            &sums,
            opts.min_cosine,
            opts.max_rel_diff,
        ));
    }
    Ok(out)
}

/// One compared pair of tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorResult {
    pub reference_key: String,
    pub port_key: String,
    pub module: String,
    pub port_module: String,
    pub tensor: String,
    pub step: Option<i64>,
    pub shape: Vec<usize>,
    pub port_shape: Vec<usize>,
    /// None when the shapes differ.
    pub metrics: Option<Metrics>,
    pub diverged: bool,
}

/// Everything the dump comparator found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DumpReport {
    /// What the comparison concludes (only `match` is a success).
    #[serde(default)]
    pub verdict: Verdict,
    /// Comparator checks that fired; each is also the first of the
    /// `diagnostics` with its kind as code.
    #[serde(default)]
    pub signatures: Vec<Signature>,
    /// First tensor in execution order beyond the thresholds. `stat` is the
    /// failing metric (`rel_diff`, `cosine` or `shape`), `drift` its value
    /// (rel_diff, or 1 − cosine), and `reference`/`port` the two tensors'
    /// L2 norms, which make a scale error visible at a glance.
    pub first_divergence: Option<FirstDivergence>,
    pub tensors: Vec<TensorResult>,
    pub diagnostics: Vec<Diagnostic>,
    pub unmatched: UnmatchedSides,
    /// Where the execution order came from: `order_file`, `metadata`, `sorted`.
    pub order_source: String,
}

impl DumpReport {
    pub fn render_text(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        if self.verdict == Verdict::NothingCompared {
            let why = self
                .diagnostics
                .iter()
                .find(|d| d.code == "nothing_compared")
                .map_or("no tensor has a counterpart on the other side", |d| {
                    d.message.as_str()
                });
            let _ = writeln!(s, "nothing compared: {why}");
            for d in &self.diagnostics {
                if d.code != "nothing_compared" {
                    let _ = writeln!(s, "  [{}] {}", d.code, d.message);
                }
            }
            return s;
        }
        let _ = writeln!(
            s,
            "  {:<6} {:<44} {:>10} {:>10} {:>10} {:>10}",
            "", "tensor", "cosine", "rel_diff", "max|d|", "mean|d|"
        );
        for t in &self.tensors {
            let mark = if t.diverged { "DIVERG" } else { "ok" };
            match &t.metrics {
                Some(m) => {
                    let _ = writeln!(
                        s,
                        "  {:<6} {:<44} {:>10.6} {:>10.3e} {:>10.3e} {:>10.3e}",
                        mark, t.port_key, m.cosine, m.rel_diff, m.max_abs_diff, m.mean_abs_diff
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "  {:<6} {:<44} shape {:?} vs {:?}",
                        mark, t.port_key, t.shape, t.port_shape
                    );
                }
            }
        }
        s.push('\n');
        s.push_str(&signature::render(&self.signatures));
        match (&self.first_divergence, self.verdict) {
            (fd, Verdict::Untrusted) => {
                let _ = writeln!(
                    s,
                    "{}",
                    crate::report::untrusted_line(&self.signatures, fd.as_ref(), "tensors")
                );
            }
            (Some(fd), _) => {
                let _ = writeln!(
                    s,
                    "first divergence: {} (reference {}) {}: {} = {}",
                    fd.port_module,
                    fd.reference_module,
                    fd.tensor,
                    fd.stat,
                    fd.drift.map_or("-".to_string(), |d| format!("{d:.4e}"))
                );
            }
            (None, _) => {
                let _ = writeln!(s, "no divergence: {} tensors compared", self.tensors.len());
            }
        }
        for d in &self.diagnostics {
            if !crate::report::shown_above(d, &self.signatures) {
                let _ = writeln!(s, "  [{}] {}", d.code, d.message);
            }
        }
        s
    }
}

/// Numeric-aware ordering: `layers.2` before `layers.10`.
pub fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn parts(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (pa, pb) = (parts(a), parts(b));
    for (x, y) in pa.iter().zip(&pb) {
        let o = match (x.0, y.0) {
            (true, true) => {
                x.1.parse::<u128>()
                    .unwrap_or(0)
                    .cmp(&y.1.parse::<u128>().unwrap_or(0))
                    .then(x.1.cmp(y.1))
            }
            _ => x.1.cmp(y.1),
        };
        if o.is_ne() {
            return o;
        }
    }
    pa.len().cmp(&pb.len())
}

type Ident = (String, String, Option<i64>);

/// The reference's tensors in execution order (from `--order`, the dump's
/// metadata, or a numeric-aware name sort, said in a diagnostic), and where
/// that order came from.
fn execution_order(
    ra: &DumpSource,
    a: &Path,
    opts: &DumpOptions,
    diags: &mut Collector,
) -> Result<(Vec<usize>, String), TraceError> {
    // Execution order of the reference's tensors.
    let by_ident: HashMap<Ident, usize> = ra
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| ((t.module.clone(), t.tensor.clone(), t.step), i))
        .collect();
    let mut order: Vec<usize> = Vec::new();
    let mut placed = vec![false; ra.tensors.len()];
    fn push(i: usize, order: &mut Vec<usize>, placed: &mut [bool]) {
        if !placed[i] {
            placed[i] = true;
            order.push(i);
        }
    }
    let order_source;
    if let Some(path) = &opts.order {
        order_source = "order_file".to_string();
        for r in read_trace(path)? {
            if let Some(&i) = by_ident.get(&(r.module.to_string(), r.tensor.to_string(), r.step)) {
                push(i, &mut order, &mut placed);
            }
        }
    } else if let Some(list) = &ra.order {
        order_source = "metadata".to_string();
        let by_key: HashMap<&str, usize> = ra
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.key.as_str(), i))
            .collect();
        for k in list {
            if let Some(&i) = by_key.get(k.as_str()) {
                push(i, &mut order, &mut placed);
            }
        }
    } else {
        order_source = "sorted".to_string();
        diags.push(
            "order_fallback",
            format!(
                "{} records no execution order (no --order trace, no __metadata__.{ORDER_METADATA_KEY}): tensors are compared in numeric-aware name order, so \"first\" may not be the first to run",
                a.display()
            ),
        );
    }
    let mut rest: Vec<usize> = (0..ra.tensors.len()).filter(|i| !placed[*i]).collect();
    if !rest.is_empty() && order_source != "sorted" {
        diags.push(
            "not_in_order",
            format!(
                "{} tensors of {} are not in the execution order; compared last, in name order",
                rest.len(),
                a.display()
            ),
        );
    }
    rest.sort_by(|&x, &y| natural_cmp(&ra.tensors[x].key, &ra.tensors[y].key));
    for i in rest {
        push(i, &mut order, &mut placed);
    }
    Ok((order, order_source))
}

/// `inputs_differ` when the model's input (the first tensor in execution
/// order, outside every numbered block) is not the same on both sides.
fn inputs_signature(
    ta: &TensorRef,
    tb: &TensorRef,
    metrics: Option<&Metrics>,
    opts: &DumpOptions,
) -> Option<Signature> {
    let (stat, value) = match metrics {
        None => ("shape", None),
        Some(m) => ("rel_diff", Some(m.rel_diff)),
    };
    let off = metrics.is_none_or(|m| {
        !m.identical
            && (m.rel_diff.is_nan()
                || m.rel_diff > signature::INPUT_MAX_REL_DIFF
                || m.cosine.is_nan()
                || m.cosine < opts.min_cosine)
    });
    if off {
        let what = match metrics {
            None => format!("shape {:?} vs {:?}", ta.shape, tb.shape),
            Some(m) => format!(
                "rel_diff {:.3e} (cosine {:.6}) where dtype rounding stays below {:.0e}",
                m.rel_diff,
                m.cosine,
                signature::INPUT_MAX_REL_DIFF
            ),
        };
        return Some(signature::inputs_differ(
            InputsDiffer {
                reference: ta.key.clone(),
                port: tb.key.clone(),
                step: ta.step,
                stat: stat.to_string(),
                value: value.filter(|v| v.is_finite()),
                threshold: metrics.map(|_| signature::INPUT_MAX_REL_DIFF),
            },
            &what,
        ));
    }
    None
}

/// One pair of same-named tensors compared.
struct Pair {
    /// None when the shapes differ.
    metrics: Option<Metrics>,
    diverged: bool,
    /// The divergence as the report names it.
    divergence: Option<FirstDivergence>,
    /// Per-token sums (`--token-dim`) for the slices; none when the shapes
    /// differ.
    token_sums: Option<Vec<Sums>>,
}

/// Compares one pair of same-named tensors.
fn compare_pair(
    ta: &TensorRef,
    tb: &TensorRef,
    opts: &DumpOptions,
    threads: usize,
) -> Result<Pair, TraceError> {
    let pair = if ta.shape != tb.shape {
        let fd = FirstDivergence {
            reference_module: ta.module.clone(),
            port_module: tb.module.clone(),
            tensor: ta.tensor.clone(),
            step: ta.step,
            stat: "shape".to_string(),
            reference: serde_json::json!(ta.shape),
            port: serde_json::json!(tb.shape),
            drift: None,
            tolerance: None,
        };
        Pair {
            metrics: None,
            diverged: true,
            divergence: Some(fd),
            token_sums: None,
        }
    } else {
        let (m, tok) = metrics_and_tokens(ta, tb, opts.token_dim, threads)?;
        // NaN metrics must count as diverged, hence the explicit NaN checks.
        let rel_bad = m.rel_diff.is_nan() || m.rel_diff > opts.max_rel_diff;
        let cos_bad = m.cosine.is_nan() || m.cosine < opts.min_cosine;
        let fd = (rel_bad || cos_bad).then(|| {
            let (stat, drift, tol) = if rel_bad {
                ("rel_diff", m.rel_diff, opts.max_rel_diff)
            } else {
                ("cosine", 1.0 - m.cosine, 1.0 - opts.min_cosine)
            };
            FirstDivergence {
                reference_module: ta.module.clone(),
                port_module: tb.module.clone(),
                tensor: ta.tensor.clone(),
                step: ta.step,
                stat: stat.to_string(),
                reference: serde_json::json!(m.reference_norm),
                port: serde_json::json!(m.port_norm),
                drift: Some(drift),
                tolerance: Some(tol),
            }
        });
        Pair {
            metrics: Some(m),
            diverged: rel_bad || cos_bad,
            divergence: fd,
            token_sums: Some(tok),
        }
    };
    Ok(pair)
}

/// Compare two dumps in execution order.
pub fn compare_dumps(a: &Path, b: &Path, opts: &DumpOptions) -> Result<DumpReport, TraceError> {
    let renamer = Renamer::parse(&opts.rename)?;
    let ra = open_dump(a)?;
    let rb = open_dump(b)?;
    let mut diags = Collector::default();

    let (order, order_source) = execution_order(&ra, a, opts, &mut diags)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let Walk {
        tensors,
        pairs,
        mut first_at,
        mut first,
        token_sums,
        mut signatures,
        unmatched_ref,
        port_used,
        scale_error,
    } = walk_in_order(&ra, &rb, &order, &order_source, &renamer, opts, threads)?;
    if let Some(what) = scale_error {
        diags.push("scale_error", what);
    }
    if let Some(sig) = shift_signature(&ra, &rb, &tensors, &pairs, opts)? {
        if sig.untrusted {
            first = None;
            first_at = None;
        }
        signatures.push(sig);
    }
    // Per-token and per-channel slices of the first divergent tensor.
    if let Some(at) = first_at
        && tensors[at].metrics.is_some()
    {
        let (ta, tb) = (&ra.tensors[pairs[at].0], &rb.tensors[pairs[at].1]);
        signatures.extend(slice_signatures(ta, tb, &token_sums, opts, threads)?);
    }
    if tensors.is_empty() {
        diags.push(
            "nothing_compared",
            format!(
                "no tensor of {} has a counterpart in {}: check the rename rules and the keys (module:tensor[@step]) of both dumps",
                a.display(),
                b.display()
            ),
        );
    }

    let unmatched_port = unmatched_port(&rb, &port_used, &renamer);
    if !unmatched_ref.is_empty() {
        diags.push(
            "only_in_reference",
            format!(
                "{} tensors are only in {}",
                unmatched_ref.len(),
                a.display()
            ),
        );
    }
    if !unmatched_port.is_empty() {
        diags.push(
            "only_in_port",
            format!(
                "{} tensors are only in {}",
                unmatched_port.len(),
                b.display()
            ),
        );
    }
    let verdict = Verdict::of(tensors.len(), &signatures, first.is_some());
    Ok(DumpReport {
        verdict,
        diagnostics: crate::compare::lead_diagnostics(diags.finish(), &signatures),
        signatures,
        first_divergence: first,
        tensors,
        unmatched: UnmatchedSides {
            reference: unmatched_ref,
            port: unmatched_port,
        },
        order_source,
    })
}

/// What the walk over the reference's tensors in execution order found.
struct Walk {
    /// One result per compared pair, in execution order.
    tensors: Vec<TensorResult>,
    /// (reference tensor, port tensor) of each compared pair, for the checks.
    pairs: Vec<(usize, usize)>,
    /// Where in `tensors` the first divergent pair is.
    first_at: Option<usize>,
    /// The first divergence as the report names it.
    first: Option<FirstDivergence>,
    /// Per-token sums of the latest tensor while no divergence is found: at
    /// the end, those of the first divergent tensor.
    token_sums: Vec<Sums>,
    /// The model inputs' signature, when they differ.
    signatures: Vec<Signature>,
    /// Reference tensors with no port tensor of the same name.
    unmatched_ref: Vec<Unmatched>,
    /// Which port tensors were compared, by index.
    port_used: Vec<bool>,
    /// The scale_error diagnostic's text, when the first divergence keeps its
    /// cosine but not its magnitude.
    scale_error: Option<String>,
}

/// Compares each reference tensor, in execution order, with the port tensor
/// of the same name (port names renamed to reference names).
fn walk_in_order(
    ra: &DumpSource,
    rb: &DumpSource,
    order: &[usize],
    order_source: &str,
    renamer: &Renamer,
    opts: &DumpOptions,
    threads: usize,
) -> Result<Walk, TraceError> {
    // Port tensors under reference names.
    let mut port_by_ident: HashMap<Ident, usize> = HashMap::new();
    for (i, t) in rb.tensors.iter().enumerate() {
        port_by_ident.insert((renamer.apply(&t.module), t.tensor.clone(), t.step), i);
    }
    let mut w = Walk {
        tensors: Vec::new(),
        pairs: Vec::new(),
        first_at: None,
        first: None,
        token_sums: Vec::new(),
        signatures: Vec::new(),
        unmatched_ref: Vec::new(),
        port_used: vec![false; rb.tensors.len()],
        scale_error: None,
    };
    for &i in order {
        let ta = &ra.tensors[i];
        let Some(&j) = port_by_ident.get(&(ta.module.clone(), ta.tensor.clone(), ta.step)) else {
            w.unmatched_ref.push(Unmatched {
                module: ta.key.clone(),
                renamed: None,
                nearest: Vec::new(),
            });
            continue;
        };
        w.port_used[j] = true;
        let tb = &rb.tensors[j];
        let Pair {
            metrics,
            diverged,
            divergence: fd,
            token_sums: tok,
        } = compare_pair(ta, tb, opts, threads)?;
        if w.first.is_none()
            && let Some(tok) = tok
        {
            w.token_sums = tok;
        }
        // The first tensor in execution order is the model's input; a name
        // sort does not know which one that is, and a block's tensor is not.
        if i == order[0]
            && order_source != "sorted"
            && block_of(&ta.module).is_none()
            && let Some(sig) = inputs_signature(ta, tb, metrics.as_ref(), opts)
        {
            w.signatures.push(sig);
        }
        if w.first.is_none()
            && let Some(fd) = fd
        {
            if let Some(m) = &metrics
                && fd.stat == "rel_diff"
                && m.cosine >= opts.min_cosine
            {
                w.scale_error = Some(format!(
                    "{} keeps cosine {:.4} but rel_diff is {:.3e} (norms {:.4e} vs {:.4e}): a magnitude error that cosine alone does not see",
                    tb.key, m.cosine, m.rel_diff, m.reference_norm, m.port_norm
                ));
            }
            w.first = Some(fd);
            w.first_at = Some(w.tensors.len());
        }
        w.pairs.push((i, j));
        w.tensors.push(TensorResult {
            reference_key: ta.key.clone(),
            port_key: tb.key.clone(),
            module: ta.module.clone(),
            port_module: tb.module.clone(),
            tensor: ta.tensor.clone(),
            step: ta.step,
            shape: ta.shape.clone(),
            port_shape: tb.shape.clone(),
            metrics,
            diverged,
        });
    }
    Ok(w)
}

/// The layer_shift signature of the compared pairs: block outputs matching
/// their neighbour across the two sides.
fn shift_signature(
    ra: &DumpSource,
    rb: &DumpSource,
    tensors: &[TensorResult],
    pairs: &[(usize, usize)],
    opts: &DumpOptions,
) -> Result<Option<Signature>, TraceError> {
    let shift_rows: Vec<ShiftRow<'_>> = tensors
        .iter()
        .map(|t: &TensorResult| ShiftRow {
            module: &t.module,
            tensor: &t.tensor,
            step: t.step,
            diverged: t.diverged,
        })
        .collect();
    let norms = |t: &TensorResult| t.metrics.as_ref().map(|m| (m.reference_norm, m.port_norm));
    signature::layer_shift(&shift_rows, |p, r| {
        let (tp, tr) = (&rb.tensors[pairs[p].1], &ra.tensors[pairs[r].0]);
        let (Some((_, np)), Some((nr, _))) = (norms(&tensors[p]), norms(&tensors[r])) else {
            return Ok(None);
        };
        if tp.shape != tr.shape {
            return Ok(None);
        }
        cross_match(tr, tp, nr * nr + np * np, opts).map(Some)
    })
}

/// The port tensors no reference tensor was compared with, each with its
/// renamed module when the rename rules change it.
fn unmatched_port(rb: &DumpSource, port_used: &[bool], renamer: &Renamer) -> Vec<Unmatched> {
    rb.tensors
        .iter()
        .zip(port_used)
        .filter(|(_, u)| !**u)
        .map(|(t, _)| Unmatched {
            module: t.key.clone(),
            renamed: Some(renamer.apply(&t.module)).filter(|r| *r != t.module),
            nearest: Vec::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn safetensors(header: &str, data: usize) -> Vec<u8> {
        let mut f = (header.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(header.as_bytes());
        f.resize(f.len() + data, 0);
        f
    }

    fn open(bytes: &[u8]) -> Result<DumpSource, TraceError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.safetensors");
        std::fs::write(&path, bytes).unwrap();
        open_safetensors(&path)
    }

    #[test]
    fn a_safetensors_header_with_a_key_twice_is_an_error() {
        let one = r#"{"a:out":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        assert_eq!(open(&safetensors(one, 8)).unwrap().tensors.len(), 1);
        let twice = r#"{"a:out":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a:out":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
        let err = open(&safetensors(twice, 12)).unwrap_err().to_string();
        assert!(
            err.contains("bad safetensors header: key \"a:out\" appears more than once"),
            "{err}"
        );
    }

    #[test]
    fn forged_safetensors_sizes_are_errors_not_overflows() {
        for header in [
            // 2^62 * 2^2 * 4 bytes wraps to 0 in u64 arithmetic.
            r#"{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551611,18446744073709551615]}}"#,
        ] {
            let err = parse_safetensors_header(Path::new("d"), header.as_bytes(), 1 << 20)
                .unwrap_err()
                .to_string();
            assert!(err.contains("data_offsets do not match"), "{err}");
        }
    }

    fn npy(header: &str, data: usize) -> Vec<u8> {
        let mut f = b"\x93NUMPY\x01\x00".to_vec();
        f.extend_from_slice(&(header.len() as u16).to_le_bytes());
        f.extend_from_slice(header.as_bytes());
        f.resize(f.len() + data, 0);
        f
    }

    #[test]
    fn an_npy_shape_the_file_cannot_back_is_an_error() {
        let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";
        let ok = npy(h, 24);
        assert_eq!(
            parse_npy_header(Path::new("x.npy"), &ok, ok.len() as u64).unwrap(),
            (DType::F32, vec![2, 3], 10 + h.len() as u64)
        );
        // Mapped later, the missing bytes would be a SIGBUS, not an error.
        let short = npy(h, 20);
        let err = parse_npy_header(Path::new("x.npy"), &short, short.len() as u64)
            .unwrap_err()
            .to_string();
        assert!(err.contains("shape runs past the end of the file"), "{err}");
    }

    #[test]
    fn an_npy_file_is_read_through_its_header() {
        let dir = tempfile::tempdir().unwrap();
        let h = "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }\n";
        for (name, bytes) in [("v1.npy", npy(h, 24)), ("tiny_header.npy", npy("", 0))] {
            std::fs::write(dir.path().join(name), &bytes).unwrap();
        }
        assert_eq!(
            read_npy_header(&dir.path().join("v1.npy")).unwrap(),
            (DType::F64, vec![3], 10 + h.len() as u64)
        );
        let err = read_npy_header(&dir.path().join("tiny_header.npy"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("npy header has no descr"), "{err}");
    }

    #[test]
    fn an_npy_header_length_the_file_cannot_back_is_refused_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.npy");
        // Version 2: a 4-byte header length of 4 GiB in a 12-byte file.
        std::fs::write(&path, b"\x93NUMPY\x02\x00\xff\xff\xff\xff").unwrap();
        let err = read_npy_header(&path).unwrap_err().to_string();
        assert!(
            err.contains("npy header runs past the end of the file"),
            "{err}"
        );
    }

    #[test]
    fn keys_and_natural_order() {
        assert_eq!(
            parse_key("blocks.3.norm2:out@7"),
            ("blocks.3.norm2".into(), "out".into(), Some(7))
        );
        assert_eq!(parse_key("a:out[0]"), ("a".into(), "out[0]".into(), None));
        let mut v = vec!["layers.10", "layers.2", "layers.1.attn"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["layers.1.attn", "layers.2", "layers.10"]);
    }

    #[test]
    fn slices_add_up_like_a_direct_sum_from_any_offset() {
        // Shape [3, 5, 4]: slices of dim 1 (inner 4) and dim 2 (inner 1).
        let n = 60;
        let xs: Vec<f64> = (0..n).map(|i| (i as f64 * 0.37).sin()).collect();
        let ys: Vec<f64> = (0..n).map(|i| (i as f64 * 0.11).cos()).collect();
        for (count, inner) in [(5usize, 4usize), (4, 1)] {
            let mut want = vec![[0.0; 3]; count];
            for i in 0..n {
                let s = &mut want[(i / inner) % count];
                s[0] += xs[i] * ys[i];
                s[1] += xs[i] * xs[i];
                s[2] += ys[i] * ys[i];
            }
            // Blocks that start and end mid-slice.
            let mut acc = SliceAcc::new(count);
            for (lo, hi) in [(0, 7), (7, 33), (33, 60)] {
                add_slices(&xs[lo..hi], &ys[lo..hi], lo, inner, &mut acc);
            }
            let got: Vec<Sums> = (0..count)
                .map(|i| [acc.xy[i], acc.xx[i], acc.yy[i]])
                .collect();
            for (g, w) in got.iter().zip(&want) {
                for k in 0..3 {
                    assert!(
                        (g[k] - w[k]).abs() < 1e-12,
                        "{count}x{inner}: {g:?} vs {w:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn unravel_is_row_major() {
        assert_eq!(unravel(5, &[2, 3]), vec![1, 2]);
        assert_eq!(unravel(0, &[]), Vec::<usize>::new());
    }
}
