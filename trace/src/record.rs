//! Reader for FastVideo-shaped activation-trace JSONL.
//!
//! One JSON object per line: `module`, `tensor`, `step` (an integer or null),
//! any of the stats (`abs_mean`, `sum`, `min`, `max`, `mean`, `std`, or ones
//! this crate does not know, which are kept as they are), `shape`, `dtype`,
//! and the optional sharding fields `rank`, `world_size`, `numel`. A stat may
//! be an `"<error: ...>"` string when the writer's reduction failed.
//!
//! Python's `json` module writes `NaN` and `Infinity` as bare tokens, which
//! are not JSON; the reader accepts them (a `0-dim` tensor's `std` is NaN in
//! FastVideo's writer) rather than rejecting a whole real trace.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use crate::error::TraceError;

/// The value of one stat in one record.
#[derive(Debug, Clone, PartialEq)]
pub enum StatValue {
    /// A number (NaN and infinities included).
    Num(f64),
    /// A string the writer put instead of a number, usually `"<error: ...>"`.
    Text(String),
    /// Anything else (a list, an object, null): kept verbatim, never compared.
    Other(serde_json::Value),
}

impl StatValue {
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            StatValue::Num(v) => Some(*v),
            _ => None,
        }
    }

    fn to_json(&self) -> serde_json::Value {
        match self {
            StatValue::Num(v) if v.is_finite() => serde_json::json!(v),
            // JSON has no NaN: write the token Python's reader understands
            // back as a string, which this reader maps to a number again.
            StatValue::Num(v) => serde_json::Value::String(nonfinite_name(*v).to_string()),
            StatValue::Text(s) => serde_json::Value::String(s.clone()),
            StatValue::Other(v) => v.clone(),
        }
    }
}

fn nonfinite_name(v: f64) -> &'static str {
    if v.is_nan() {
        "NaN"
    } else if v > 0.0 {
        "Infinity"
    } else {
        "-Infinity"
    }
}

fn stat_from_json(v: serde_json::Value) -> StatValue {
    match v {
        serde_json::Value::Number(n) => StatValue::Num(n.as_f64().unwrap_or(f64::NAN)),
        serde_json::Value::String(s) => match s.as_str() {
            "NaN" | "nan" => StatValue::Num(f64::NAN),
            "Infinity" | "inf" => StatValue::Num(f64::INFINITY),
            "-Infinity" | "-inf" => StatValue::Num(f64::NEG_INFINITY),
            _ => StatValue::Text(s),
        },
        other => StatValue::Other(other),
    }
}

/// Interned text (module, tensor and dtype names repeat on every step, so
/// one allocation per distinct name instead of one per record).
pub type Name = std::sync::Arc<str>;

/// The stat names FastVideo's writer knows, in its order.
pub const KNOWN_STATS: [&str; 6] = ["abs_mean", "sum", "min", "max", "mean", "std"];

fn known_index(name: &str) -> Option<usize> {
    KNOWN_STATS.iter().position(|k| *k == name)
}

/// The stats of one record. Numeric values of the known stats live in a
/// fixed array (a large trace holds millions of records, and a vector of
/// named values per record costs several times the memory); error strings,
/// unknown stats and non-numbers are kept, in file order, in `extra`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Stats {
    known: [f64; 6],
    mask: u8,
    extra: Vec<(String, StatValue)>,
}

impl Stats {
    pub fn get(&self, name: &str) -> Option<StatValue> {
        if let Some(i) = known_index(name)
            && self.mask & (1 << i) != 0
        {
            return Some(StatValue::Num(self.known[i]));
        }
        self.extra
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }

    pub fn get_f64(&self, name: &str) -> Option<f64> {
        match known_index(name) {
            Some(i) if self.mask & (1 << i) != 0 => Some(self.known[i]),
            _ => self
                .extra
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| v.as_f64()),
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        known_index(name).is_some_and(|i| self.mask & (1 << i) != 0)
            || self.extra.iter().any(|(k, _)| k == name)
    }

    pub fn set(&mut self, name: &str, value: StatValue) {
        self.remove(name);
        match (known_index(name), value) {
            (Some(i), StatValue::Num(v)) => {
                self.known[i] = v;
                self.mask |= 1 << i;
            }
            (_, value) => self.extra.push((name.to_string(), value)),
        }
    }

    pub fn remove(&mut self, name: &str) {
        if let Some(i) = known_index(name) {
            self.mask &= !(1 << i);
        }
        self.extra.retain(|(k, _)| k != name);
    }

    pub fn len(&self) -> usize {
        self.mask.count_ones() as usize + self.extra.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every stat: the known numeric ones in FastVideo's order, then the rest.
    pub fn iter(&self) -> impl Iterator<Item = (&str, StatValue)> + '_ {
        KNOWN_STATS
            .iter()
            .enumerate()
            .filter(|(i, _)| self.mask & (1 << i) != 0)
            .map(|(i, k)| (*k, StatValue::Num(self.known[i])))
            .chain(self.extra.iter().map(|(k, v)| (k.as_str(), v.clone())))
    }

    pub fn names(&self) -> Vec<String> {
        self.iter().map(|(k, _)| k.to_string()).collect()
    }
}

/// One line of a trace: the stats of one output tensor of one module call.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Record {
    pub module: Name,
    pub tensor: Name,
    pub step: Option<i64>,
    pub shape: Option<Vec<u64>>,
    pub dtype: Option<Name>,
    pub rank: Option<u32>,
    pub world_size: Option<u32>,
    pub numel: Option<u64>,
    pub stats: Stats,
    /// The module's own name when `module` was rewritten by rename rules
    /// (never written out: a merged port trace keeps the port's names).
    pub original_module: Option<Name>,
}

impl Record {
    pub fn stat(&self, name: &str) -> Option<StatValue> {
        self.stats.get(name)
    }

    pub fn stat_f64(&self, name: &str) -> Option<f64> {
        self.stats.get_f64(name)
    }

    pub fn set_stat(&mut self, name: &str, value: StatValue) {
        self.stats.set(name, value);
    }

    /// Element count: the explicit `numel`, else the product of the shape.
    pub fn element_count(&self) -> Option<u64> {
        self.numel
            .or_else(|| self.shape.as_ref().map(|s| s.iter().product()))
    }
}

impl Serialize for Record {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("module", &*self.module)?;
        map.serialize_entry("tensor", &*self.tensor)?;
        map.serialize_entry("step", &self.step)?;
        for (k, v) in self.stats.iter() {
            map.serialize_entry(k, &v.to_json())?;
        }
        if let Some(shape) = &self.shape {
            map.serialize_entry("shape", shape)?;
        }
        if let Some(dtype) = &self.dtype {
            map.serialize_entry("dtype", &**dtype)?;
        }
        if let Some(rank) = self.rank {
            map.serialize_entry("rank", &rank)?;
        }
        if let Some(ws) = self.world_size {
            map.serialize_entry("world_size", &ws)?;
        }
        if let Some(numel) = self.numel {
            map.serialize_entry("numel", &numel)?;
        }
        map.end()
    }
}

/// A record as parsed, before its names are interned.
pub(crate) struct RawRecord<'a> {
    pub(crate) module: std::borrow::Cow<'a, str>,
    pub(crate) tensor: Option<std::borrow::Cow<'a, str>>,
    pub(crate) dtype: Option<std::borrow::Cow<'a, str>>,
    pub(crate) rec: Record,
}

impl<'de> Deserialize<'de> for RawRecord<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(RecordVisitor)
    }
}

struct RecordVisitor;

impl<'de> Visitor<'de> for RecordVisitor {
    type Value = RawRecord<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a trace record object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawRecord<'de>, A::Error> {
        use std::borrow::Cow;
        let mut rec = Record::default();
        let mut module: Option<Cow<'de, str>> = None;
        let mut tensor = None;
        let mut dtype = None;
        // Keys and names are borrowed from the line when they have no
        // escapes, which is nearly always: no allocation per key.
        while let Some(key) = map.next_key::<BorrowedStr<'de>>()? {
            match key.0.as_ref() {
                "module" => module = Some(map.next_value::<BorrowedStr<'de>>()?.0),
                "tensor" => tensor = Some(map.next_value::<BorrowedStr<'de>>()?.0),
                "step" => rec.step = map.next_value::<Option<i64>>()?,
                "shape" => rec.shape = map.next_value::<Option<Vec<u64>>>()?,
                "dtype" => dtype = map.next_value::<Option<BorrowedStr<'de>>>()?.map(|d| d.0),
                "rank" => rec.rank = map.next_value::<Option<u32>>()?,
                "world_size" => rec.world_size = map.next_value::<Option<u32>>()?,
                "numel" => rec.numel = map.next_value::<Option<u64>>()?,
                name => {
                    let v = map.next_value::<StatJson>()?;
                    rec.stats.set(name, v.0);
                }
            }
        }
        let module = module.ok_or_else(|| de::Error::missing_field("module"))?;
        Ok(RawRecord {
            module,
            tensor,
            dtype,
            rec,
        })
    }
}

/// A string borrowed from the input when possible.
struct BorrowedStr<'a>(std::borrow::Cow<'a, str>);

impl<'de> Deserialize<'de> for BorrowedStr<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = BorrowedStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(BorrowedStr(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(BorrowedStr(std::borrow::Cow::Owned(v.to_string())))
            }
        }
        deserializer.deserialize_str(V)
    }
}

/// Interns names while a trace is read.
#[derive(Debug, Default)]
pub struct Interner {
    names: crate::hash::FastMap<Box<str>, Name>,
    /// The last few names handed out: tensor and dtype names repeat from
    /// one record to the next, and a string compare is cheaper than a hash.
    recent: [Option<Name>; 2],
}

impl Interner {
    pub fn intern(&mut self, s: &str) -> Name {
        for n in self.recent.iter().flatten() {
            if &**n == s {
                return n.clone();
            }
        }
        let n = self.intern_hashed(s);
        self.recent.rotate_right(1);
        self.recent[0] = Some(n.clone());
        n
    }

    fn intern_hashed(&mut self, s: &str) -> Name {
        if let Some(n) = self.names.get(s) {
            return n.clone();
        }
        let n: Name = Name::from(s);
        self.names.insert(s.into(), n.clone());
        n
    }
}

impl RawRecord<'_> {
    pub(crate) fn finish(self, interner: &mut Interner) -> Record {
        let mut rec = self.rec;
        // Module names change on every record: straight to the hash map.
        rec.module = interner.intern_hashed(&self.module);
        rec.tensor = interner.intern(self.tensor.as_deref().unwrap_or("out"));
        rec.dtype = self.dtype.map(|d| interner.intern(&d));
        rec
    }
}

/// A stat value deserialized without going through `serde_json::Value` for
/// the common numeric case (the hot path when reading big traces).
struct StatJson(StatValue);

impl<'de> Deserialize<'de> for StatJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StatJson;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a stat value")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<StatJson, E> {
                Ok(StatJson(StatValue::Num(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<StatJson, E> {
                Ok(StatJson(StatValue::Num(v as f64)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<StatJson, E> {
                Ok(StatJson(StatValue::Num(v as f64)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StatJson, E> {
                Ok(StatJson(stat_from_json(serde_json::Value::String(
                    v.to_string(),
                ))))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<StatJson, E> {
                Ok(StatJson(StatValue::Other(serde_json::Value::Bool(v))))
            }
            fn visit_unit<E: de::Error>(self) -> Result<StatJson, E> {
                Ok(StatJson(StatValue::Other(serde_json::Value::Null)))
            }
            fn visit_none<E: de::Error>(self) -> Result<StatJson, E> {
                Ok(StatJson(StatValue::Other(serde_json::Value::Null)))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<StatJson, A::Error> {
                let v = serde_json::Value::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
                Ok(StatJson(StatValue::Other(v)))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StatJson, A::Error> {
                let v = serde_json::Value::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(StatJson(StatValue::Other(v)))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// Python's `json.dumps` writes `NaN`, `Infinity` and `-Infinity` as bare
/// tokens. Quote them (outside strings only) so serde_json accepts the line
/// and `stat_from_json` turns them back into numbers.
fn quote_nonfinite(line: &str) -> String {
    let bytes = line.as_bytes();
    let mut out = String::with_capacity(line.len() + 16);
    let mut i = 0;
    let mut in_str = false;
    while i < bytes.len() {
        let c = bytes[i];
        if in_str {
            out.push(c as char);
            if c == b'\\' && i + 1 < bytes.len() {
                out.push(bytes[i + 1] as char);
                i += 2;
                continue;
            }
            if c == b'"' {
                in_str = false;
            }
            i += 1;
            continue;
        }
        if c == b'"' {
            in_str = true;
            out.push('"');
            i += 1;
            continue;
        }
        let rest = &line[i..];
        let token = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|t| rest.starts_with(t));
        if let Some(t) = token {
            out.push('"');
            out.push_str(t);
            out.push('"');
            i += t.len();
            continue;
        }
        // Copy the rest of a multi-byte char untouched: only ASCII matters here.
        let ch = rest.chars().next().unwrap_or('\0');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// Parse one JSONL line; `None` for a blank line.
pub fn parse_line(line: &str) -> Result<Option<Record>, String> {
    parse_line_with(line, &mut Interner::default())
}

/// What the fast path and serde_json each make of one trimmed line (`None`:
/// the fast path deferred, or serde refused). The fast path must agree
/// with serde whenever it answers; the fuzzer checks that on mutated lines.
#[doc(hidden)]
pub fn parse_line_both_ways(line: &str) -> (Option<Record>, Option<Record>) {
    let line = line.trim();
    let fast = crate::fastparse::parse(line).map(|r| r.finish(&mut Interner::default()));
    let serde = serde_json::from_str::<RawRecord<'_>>(line)
        .ok()
        .map(|r| r.finish(&mut Interner::default()));
    (fast, serde)
}

fn parse_line_with(line: &str, interner: &mut Interner) -> Result<Option<Record>, String> {
    let trimmed = line.trim();
    if trimmed.is_empty() {
        return Ok(None);
    }
    if let Some(r) = crate::fastparse::parse(trimmed) {
        return Ok(Some(r.finish(interner)));
    }
    match serde_json::from_str::<RawRecord<'_>>(trimmed) {
        Ok(r) => Ok(Some(r.finish(interner))),
        Err(first) => {
            if trimmed.contains("NaN") || trimmed.contains("Infinity") {
                let quoted = quote_nonfinite(trimmed);
                serde_json::from_str::<RawRecord<'_>>(&quoted)
                    .map(|r| Some(r.finish(interner)))
                    .map_err(|e| e.to_string())
            } else {
                Err(first.to_string())
            }
        }
    }
}

/// The records of one trace file, with the rank it belongs to.
#[derive(Debug, Clone)]
pub struct TraceFile {
    pub path: PathBuf,
    /// Rank from the records, else from the file name, else the file's
    /// position among the files of its side.
    pub rank: u32,
    pub records: Vec<Record>,
}

/// Parse a whole trace text; `path` only labels errors.
pub fn parse_trace(path: &Path, text: &str) -> Result<Vec<Record>, TraceError> {
    let mut records = Vec::with_capacity(text.len() / 256 + 1);
    let mut interner = Interner::default();
    for (i, line) in text.lines().enumerate() {
        match parse_line_with(line, &mut interner) {
            Ok(Some(r)) => records.push(r),
            Ok(None) => {}
            Err(message) => {
                return Err(TraceError::Malformed {
                    path: path.to_path_buf(),
                    line: i + 1,
                    message,
                });
            }
        }
    }
    Ok(records)
}

/// Read one trace file.
pub fn read_trace(path: &Path) -> Result<Vec<Record>, TraceError> {
    // Mapped rather than read: a multi-rank trace is gigabytes, and copying
    // it into the heap cost as much kernel time as parsing it.
    let file = std::fs::File::open(path).map_err(|e| TraceError::io(path, e))?;
    let len = file.metadata().map_err(|e| TraceError::io(path, e))?.len() as usize;
    if len == 0 {
        return Ok(Vec::new());
    }
    let map = crate::dumps::map_window(&file, 0, len).map_err(|e| TraceError::io(path, e))?;
    let text = std::str::from_utf8(&map).map_err(|e| TraceError::Malformed {
        path: path.to_path_buf(),
        line: 1 + map[..e.valid_up_to()]
            .iter()
            .filter(|b| **b == b'\n')
            .count(),
        message: "not UTF-8 text".to_string(),
    })?;
    parse_trace(path, text)
}

/// The rank encoded in a file name: `rank0`, `rank_1`, `rank-2`, `RANK3`.
pub fn rank_from_name(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_string_lossy().to_lowercase();
    let at = name.rfind("rank")?;
    let rest = name[at + 4..].trim_start_matches(['_', '-']);
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// Read the files of one side (the ranks of one run), in parallel since a
/// multi-rank trace is many large files. Ranks come from the records, else
/// the file names, else the order the files were given in.
pub fn read_side(paths: &[PathBuf]) -> Result<Vec<TraceFile>, TraceError> {
    let results: Vec<Result<Vec<Record>, TraceError>> = if paths.len() <= 1 {
        paths.iter().map(|p| read_trace(p)).collect()
    } else {
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(paths.len());
        let mut slots: Vec<Option<Result<Vec<Record>, TraceError>>> =
            (0..paths.len()).map(|_| None).collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let out = std::sync::Mutex::new(&mut slots);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= paths.len() {
                            break;
                        }
                        let r = read_trace(&paths[i]);
                        out.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(r);
                    }
                });
            }
        });
        slots
            .into_iter()
            .map(|s| s.unwrap_or_else(|| Ok(Vec::new())))
            .collect()
    };
    let mut files = Vec::with_capacity(paths.len());
    for (i, (path, res)) in paths.iter().zip(results).enumerate() {
        let records = res?;
        let rank = records
            .iter()
            .find_map(|r| r.rank)
            .or_else(|| rank_from_name(path))
            .unwrap_or(i as u32);
        files.push(TraceFile {
            path: path.clone(),
            rank,
            records,
        });
    }
    files.sort_by_key(|f| f.rank);
    Ok(files)
}

/// Write records as JSONL.
pub fn write_trace(path: &Path, records: &[Record]) -> Result<(), TraceError> {
    use std::io::Write;
    let file = std::fs::File::create(path).map_err(|e| TraceError::io(path, e))?;
    let mut w = std::io::BufWriter::new(file);
    for r in records {
        serde_json::to_writer(&mut w, r).map_err(|e| TraceError::io(path, e.into()))?;
        w.write_all(b"\n").map_err(|e| TraceError::io(path, e))?;
    }
    w.flush().map_err(|e| TraceError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fastvideo_shape_with_errors_nulls_and_unknown_stats() {
        let line = r#"{"module": "block.layers.0", "tensor": "out", "step": null, "abs_mean": 1.5, "sum": "<error: boom>", "kurtosis": 3, "std": NaN, "shape": [1, 4], "dtype": "torch.bfloat16"}"#;
        let r = parse_line(line).unwrap().unwrap();
        assert_eq!(&*r.module, "block.layers.0");
        assert_eq!(r.step, None);
        assert_eq!(r.stat_f64("abs_mean"), Some(1.5));
        assert_eq!(
            r.stat("sum"),
            Some(StatValue::Text("<error: boom>".to_string()))
        );
        assert_eq!(r.stat_f64("kurtosis"), Some(3.0));
        assert!(r.stat_f64("std").unwrap().is_nan());
        assert_eq!(r.element_count(), Some(4));
    }

    #[test]
    fn malformed_line_names_file_and_line() {
        let err = parse_trace(
            Path::new("x/rank1.jsonl"),
            "{\"module\": \"a\", \"tensor\": \"out\"}\n{oops\n",
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("x/rank1.jsonl:2: malformed"), "{msg}");
    }

    #[test]
    fn rank_from_file_names() {
        assert_eq!(rank_from_name(Path::new("a/trace_rank0.jsonl")), Some(0));
        assert_eq!(rank_from_name(Path::new("t_rank_1.jsonl")), Some(1));
        assert_eq!(rank_from_name(Path::new("t-rank-12.jsonl")), Some(12));
        assert_eq!(rank_from_name(Path::new("trace.jsonl")), None);
    }

    #[test]
    fn round_trips_through_serialize() {
        let line = r#"{"module":"m","tensor":"out","step":3,"abs_mean":0.25,"max":1.0,"shape":[2,2],"numel":4}"#;
        let r = parse_line(line).unwrap().unwrap();
        let back = serde_json::to_string(&r).unwrap();
        assert_eq!(parse_line(&back).unwrap().unwrap(), r);
    }
}
