//! A fast path for the common shape of a trace line: one flat JSON object
//! of plain strings (no escapes), integers, numbers, `null` and integer
//! arrays. It returns `None` on anything else (escapes, nested values,
//! `NaN`, stat strings, malformed input), and the caller then parses the
//! line with serde_json, which also produces the error messages; so the fast
//! path only ever decides lines it fully understands, and they parse to what
//! serde would give. Parsing is most of the time of a large merge+compare,
//! and the generic deserializer spends much of it in dispatch.

use std::borrow::Cow;

use crate::record::{RawRecord, Record, StatValue};

struct Cursor<'a> {
    s: &'a str,
    b: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        self.ws();
        (self.b.get(self.i) == Some(&c)).then(|| self.i += 1)
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    /// A string without escapes or control characters.
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.i;
        while let Some(&c) = self.b.get(self.i) {
            match c {
                b'"' => {
                    self.i += 1;
                    return Some(&self.s[start..self.i - 1]);
                }
                b'\\' | 0..=0x1f => return None,
                _ => self.i += 1,
            }
        }
        None
    }

    /// The text of a JSON number, checked against JSON's grammar (Rust's
    /// float parser accepts more, such as `+1` or `.5`).
    fn number(&mut self) -> Option<&'a str> {
        self.ws();
        let b = self.b;
        let start = self.i;
        let mut i = start;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        let digits = |i: &mut usize| {
            let s = *i;
            while *i < b.len() && b[*i].is_ascii_digit() {
                *i += 1;
            }
            *i > s
        };
        let int_start = i;
        if !digits(&mut i) {
            return None;
        }
        if b[int_start] == b'0' && i - int_start > 1 {
            return None;
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            if !digits(&mut i) {
                return None;
            }
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            i += 1;
            if matches!(b.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            if !digits(&mut i) {
                return None;
            }
        }
        self.i = i;
        Some(&self.s[start..i])
    }

    fn null(&mut self) -> bool {
        self.ws();
        if self.b[self.i..].starts_with(b"null") {
            self.i += 4;
            true
        } else {
            false
        }
    }

    fn int<T: std::str::FromStr>(&mut self) -> Option<T> {
        let t = self.number()?;
        // serde_json reads `-0` as the float -0.0, which no integer field takes.
        if t.bytes().any(|c| matches!(c, b'.' | b'e' | b'E')) || t == "-0" {
            return None;
        }
        t.parse().ok()
    }

    fn opt_int<T: std::str::FromStr>(&mut self) -> Option<Option<T>> {
        if self.null() {
            Some(None)
        } else {
            self.int().map(Some)
        }
    }

    fn opt_string(&mut self) -> Option<Option<&'a str>> {
        if self.null() {
            Some(None)
        } else {
            self.string().map(Some)
        }
    }

    fn shape(&mut self) -> Option<Option<Vec<u64>>> {
        if self.null() {
            return Some(None);
        }
        self.eat(b'[')?;
        let mut v = Vec::with_capacity(4);
        if self.peek()? == b']' {
            self.i += 1;
            return Some(Some(v));
        }
        loop {
            v.push(self.int::<u64>()?);
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(Some(v));
                }
                _ => return None,
            }
        }
    }
}

/// Parse a trimmed, non-empty line, or `None` to defer to serde_json.
pub(crate) fn parse(line: &str) -> Option<RawRecord<'_>> {
    let mut c = Cursor {
        s: line,
        b: line.as_bytes(),
        i: 0,
    };
    c.eat(b'{')?;
    let mut rec = Record::default();
    let mut module = None;
    let mut tensor = None;
    let mut dtype = None;
    if c.peek()? == b'}' {
        return None; // no module: let serde report it
    }
    loop {
        let key = c.string()?;
        c.eat(b':')?;
        match key {
            "module" => module = Some(c.string()?),
            "tensor" => tensor = Some(c.string()?),
            "dtype" => dtype = c.opt_string()?,
            "step" => rec.step = c.opt_int()?,
            "shape" => rec.shape = c.shape()?,
            "rank" => rec.rank = c.opt_int()?,
            "world_size" => rec.world_size = c.opt_int()?,
            "numel" => rec.numel = c.opt_int()?,
            name => {
                // Out of f64's range (`1e309`) serde refuses the line; so
                // must this path, or the two would read it differently.
                let v: f64 = c.number()?.parse().ok().filter(|v: &f64| v.is_finite())?;
                rec.stats.set(name, StatValue::Num(v));
            }
        }
        match c.peek()? {
            b',' => c.i += 1,
            b'}' => {
                c.i += 1;
                break;
            }
            _ => return None,
        }
    }
    c.ws();
    if c.i != line.len() {
        return None;
    }
    Some(RawRecord {
        module: Cow::Borrowed(module?),
        tensor: tensor.map(Cow::Borrowed),
        dtype: dtype.map(Cow::Borrowed),
        rec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serde(line: &str) -> Option<Record> {
        serde_json::from_str::<RawRecord<'_>>(line)
            .ok()
            .map(|r| r.finish(&mut Default::default()))
    }

    fn fast(line: &str) -> Option<Record> {
        parse(line).map(|r| r.finish(&mut Default::default()))
    }

    #[test]
    fn agrees_with_serde_or_defers() {
        let lines = [
            r#"{"module": "a.b", "tensor": "out[0]", "step": null, "abs_mean": 0.015666803345, "sum": -1.5e-3, "min": -3, "max": 1E2, "shape": [1, 64, 192], "dtype": "torch.bfloat16"}"#,
            r#"{"module":"m","tensor":"out","step":7,"kurt":2,"shape":[],"rank":1,"world_size":2,"numel":0}"#,
            r#"{"module":"m","step":-3,"mean":-0.0}"#,
            r#"  {"module":"m","shape":null,"dtype":null}  "#,
        ];
        for l in lines {
            let f = fast(l.trim());
            assert!(f.is_some(), "fast path should take {l}");
            assert_eq!(f, serde(l.trim()), "{l}");
        }
        // Deferred: escapes, error strings, NaN, bad numbers, floats as steps,
        // nested values, trailing junk, missing module.
        for l in [
            r#"{"module":"a\"b"}"#,
            r#"{"module":"m","sum":"<error: x>"}"#,
            r#"{"module":"m","std":NaN}"#,
            r#"{"module":"m","sum":+1}"#,
            r#"{"module":"m","sum":.5}"#,
            r#"{"module":"m","sum":01}"#,
            r#"{"module":"m","step":1.0}"#,
            r#"{"module":"m","x":{"a":1}}"#,
            r#"{"module":"m"} x"#,
            r#"{"tensor":"out"}"#,
            r#"{}"#,
            r#"{"module":"m","shape":[1,-2]}"#,
            // found by fvd-fuzz (trace_jsonl): serde refuses it, the fast
            // path read it as infinity
            r#"{"module":"m","sum":1e309}"#,
            r#"{"module":"m","step":-0}"#,
        ] {
            assert!(parse(l).is_none(), "fast path must defer {l}");
        }
    }

    #[test]
    fn every_fixture_line_parses_the_same_both_ways() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/traces");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).expect("the repository's trace fixtures") {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("jsonl") {
                continue;
            }
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let f = fast(line.trim());
                assert!(f.is_some(), "{}: fast path deferred {line}", path.display());
                assert_eq!(f, serde(line.trim()), "{}: {line}", path.display());
                n += 1;
            }
        }
        // 7 single-step traces of 32 rows and 2 three-step ones
        assert_eq!(n, 7 * 32 + 2 * 3 * 32, "fixture lines read");
    }
}
