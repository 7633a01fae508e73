//! Redaction by value: every secret value fvd knows (its bearer token, the
//! values of the variables a spec passes to tests or agents by name, later
//! the model-API proxy's keys) is replaced wherever fvd would store, log,
//! send or show bytes that may hold it, in each spelling a program commonly
//! prints a secret in.
//!
//! [`crate::secrets`] finds values that *look* like secrets; this module
//! replaces values fvd *knows* are secrets, whatever they look like.
//!
//! The spellings of a value `v` named `N`, each replaced by `[redacted:N]`:
//!
//! - `v` itself;
//! - base64, standard and URL-safe alphabets, with or without padding, of
//!   `v` alone or inside a longer encoded blob (`Basic base64(user:v)`).
//!   Inside a blob the characters of `v` depend on where it starts modulo
//!   3, so each of the three alignments is a spelling: its *core*, the
//!   characters that depend on bytes of `v` alone, is what is replaced (one
//!   to three characters at each end, mixed with the neighbouring bytes,
//!   stay; they carry at most a few bits of `v`);
//! - percent-encoded (every byte but `A-Za-z0-9-._~` as `%XX`, upper- and
//!   lower-case hex), and the form encoding of it (space as `+`);
//! - XML-escaped (`&amp;` `&lt;` `&gt;` `&quot;` `&apos;`, as a JUnit
//!   report holds it);
//! - hex, two digits a byte with no separator, lower- and upper-case
//!   (`binascii.hexlify`, `bytes.hex()`); hex is byte-aligned, so `v`
//!   inside a longer hex dump is found too;
//! - `\uXXXX`-escaped, lower- and upper-case hex digits: every character
//!   escaped, and the JSON `ensure_ascii` form (`json.dumps(s)`: only
//!   quotes, backslashes, control and non-ASCII characters escaped), over
//!   the UTF-16 units of `v` when it is UTF-8 and over its bytes read as
//!   Latin-1.
//!
//! Not caught, and not meant to be: a secret compressed before it is
//! encoded (gzip+base64), reversed, split into pieces with other bytes
//! between them (or across separate writes with other output between),
//! hex with separators (`xxd`, `od`, `a1:b2:…`), mixed-case escapes, or
//! under any cipher or hash. Redaction by value stops accidents and
//! common encodings, not a program that means to exfiltrate; the jail is
//! what keeps a secret from such a program.
//!
//! Values shorter than [`MIN_SECRET_LEN`] are not redacted (replacing every
//! `abc` would destroy the output and protects nothing); an encoded core
//! shorter than [`MIN_ENCODED_LEN`] is not a spelling (it would match
//! unrelated text).

/// Secrets shorter than this are not redacted.
pub const MIN_SECRET_LEN: usize = 4;

/// An encoded spelling shorter than this is not searched for.
pub const MIN_ENCODED_LEN: usize = 6;

/// Replaces known secret values in bytes and text. Cheap to clone; build it
/// once per job (or per process) and use [`Redactor::stream`] for output
/// that arrives in chunks.
#[derive(Clone, Default)]
pub struct Redactor {
    /// (spelling, replacement), longest spelling first, so a secret that
    /// contains another is replaced whole.
    patterns: Vec<(Vec<u8>, Vec<u8>)>,
    /// Indices into `patterns` by first byte.
    by_first: Vec<Vec<usize>>,
    longest: usize,
}

impl PartialEq for Redactor {
    fn eq(&self, other: &Self) -> bool {
        self.patterns == other.patterns
    }
}

impl Eq for Redactor {}

impl std::fmt::Debug for Redactor {
    // Never the values: a Redactor is logged with the config it is part of.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("spellings", &self.patterns.len())
            .finish()
    }
}

impl Redactor {
    /// A redactor of the `(name, value)` pairs; `name` is what the
    /// replacement says (`[redacted:NAME]`).
    pub fn new<N, V>(secrets: impl IntoIterator<Item = (N, V)>) -> Self
    where
        N: AsRef<str>,
        V: AsRef<[u8]>,
    {
        let mut r = Redactor::default();
        for (name, value) in secrets {
            r.add(name.as_ref(), value.as_ref());
        }
        r
    }

    /// Adds one secret (ignored when shorter than [`MIN_SECRET_LEN`]).
    pub fn add(&mut self, name: &str, value: &[u8]) {
        if value.len() < MIN_SECRET_LEN {
            return;
        }
        let repl = format!("[redacted:{name}]").into_bytes();
        for s in spellings(value) {
            if !self.patterns.iter().any(|(p, _)| *p == s) {
                self.patterns.push((s, repl.clone()));
            }
        }
        self.patterns
            .sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        self.by_first = vec![Vec::new(); 256];
        for (i, (p, _)) in self.patterns.iter().enumerate() {
            self.by_first[p[0] as usize].push(i);
        }
        self.longest = self.patterns.first().map_or(0, |(p, _)| p.len());
    }

    /// Adds every secret of `other`.
    pub fn extend(&mut self, other: &Redactor) {
        for (p, r) in &other.patterns {
            if !self.patterns.iter().any(|(q, _)| q == p) {
                self.patterns.push((p.clone(), r.clone()));
            }
        }
        self.patterns
            .sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        self.by_first = vec![Vec::new(); 256];
        for (i, (p, _)) in self.patterns.iter().enumerate() {
            self.by_first[p[0] as usize].push(i);
        }
        self.longest = self.patterns.first().map_or(0, |(p, _)| p.len());
    }

    /// Whether there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// `data` with every spelling of every secret replaced.
    pub fn bytes(&self, data: &[u8]) -> Vec<u8> {
        let mut s = self.stream();
        let mut out = s.push(data);
        out.extend(s.finish());
        out
    }

    /// `text` with every spelling of every secret replaced.
    pub fn text(&self, text: &str) -> String {
        if self.is_empty() {
            return text.to_owned();
        }
        String::from_utf8_lossy(&self.bytes(text.as_bytes())).into_owned()
    }

    /// Whether `data` holds a spelling of a secret.
    pub fn finds(&self, data: &[u8]) -> bool {
        (0..data.len()).any(|i| self.match_at(&data[i..]).is_some())
    }

    /// A streaming redactor for output that arrives in chunks: a spelling
    /// split across two chunks is still replaced.
    pub fn stream(&self) -> RedactStream {
        RedactStream {
            redactor: self.clone(),
            pending: Vec::new(),
        }
    }

    /// The pattern that starts `rest`, if one does.
    fn match_at(&self, rest: &[u8]) -> Option<usize> {
        let first = *rest.first()?;
        self.by_first[first as usize]
            .iter()
            .copied()
            .find(|&i| rest.starts_with(&self.patterns[i].0))
    }

    /// Whether `rest` (shorter than the longest pattern) could be the start
    /// of a pattern, so more bytes must be seen before deciding.
    fn could_start(&self, rest: &[u8]) -> bool {
        let Some(&first) = rest.first() else {
            return false;
        };
        self.by_first[first as usize].iter().any(|&i| {
            let p = &self.patterns[i].0;
            rest.len() < p.len() && p.starts_with(rest)
        })
    }
}

/// The streaming side of a [`Redactor`]: bytes that could be the start of
/// a secret split across chunks are held back until the next chunk (or
/// [`RedactStream::finish`]) decides.
#[derive(Debug)]
pub struct RedactStream {
    redactor: Redactor,
    pending: Vec<u8>,
}

impl RedactStream {
    /// The redacted bytes that can be released after `data`.
    pub fn push(&mut self, data: &[u8]) -> Vec<u8> {
        let r = &self.redactor;
        if r.is_empty() {
            return data.to_vec();
        }
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(data);
        let mut out = Vec::with_capacity(buf.len());
        let mut i = 0;
        while i < buf.len() {
            let rest = &buf[i..];
            if let Some(p) = r.match_at(rest) {
                out.extend_from_slice(&r.patterns[p].1);
                i += r.patterns[p].0.len();
                continue;
            }
            if rest.len() < r.longest && r.could_start(rest) {
                self.pending = rest.to_vec();
                return out;
            }
            out.push(buf[i]);
            i += 1;
        }
        out
    }

    /// What was held back, once no more bytes come.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.pending)
    }
}

/// Every spelling of `v` this module replaces (see the module doc).
pub fn spellings(v: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![v.to_vec()];
    for alphabet in [STD, URL_SAFE] {
        for align in 0..3 {
            let core = base64_core(v, align, alphabet);
            if core.len() >= MIN_ENCODED_LEN {
                out.push(core);
            }
        }
    }
    for form in [Percent::Upper, Percent::Lower, Percent::FormUpper] {
        out.push(percent(v, form));
    }
    out.push(xml_escaped(v));
    out.push(hex(v, LOWER_HEX));
    out.push(hex(v, UPPER_HEX));
    // `\uXXXX` escapes, over the characters of `v` when it is UTF-8 (as
    // a JSON encoder sees a string, UTF-16 units, surrogate pairs above
    // U+FFFF) and over its bytes read as Latin-1 (as a program that
    // decoded bytes with `latin-1` prints them): every character escaped,
    // and the JSON `ensure_ascii` form (only what JSON must escape and
    // what is not ASCII), with lower- and upper-case hex digits.
    let mut views: Vec<Vec<u16>> = Vec::with_capacity(2);
    if let Ok(text) = std::str::from_utf8(v) {
        views.push(text.encode_utf16().collect());
    }
    views.push(v.iter().map(|&b| u16::from(b)).collect());
    for units in &views {
        for digits in [LOWER_HEX, UPPER_HEX] {
            out.push(u_escaped(units, digits, true));
            out.push(u_escaped(units, digits, false));
        }
    }
    let mut unique: Vec<Vec<u8>> = Vec::with_capacity(out.len());
    for s in out {
        if !s.is_empty() && !unique.contains(&s) {
            unique.push(s);
        }
    }
    unique
}

const STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL_SAFE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Base64 of `data`, without padding.
pub fn base64(data: &[u8], alphabet: &[u8; 64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for k in 0..chars {
            out.push(alphabet[((n >> (18 - 6 * k)) & 63) as usize]);
        }
    }
    out
}

/// The characters of the base64 of `v` that depend on `v`'s bytes alone,
/// when `v` starts `align` bytes (0–2) into a 3-byte group of a longer
/// encoded blob.
fn base64_core(v: &[u8], align: usize, alphabet: &[u8; 64]) -> Vec<u8> {
    let mut padded = vec![0u8; align];
    padded.extend_from_slice(v);
    let enc = base64(&padded, alphabet);
    // Characters before the first one made of v's bits only.
    let skip = match align {
        0 => 0,
        1 => 2,
        _ => 3,
    };
    // Characters of the last, partial group that take bits of the byte
    // after v are not v's alone.
    let total = padded.len();
    let end = (total / 3) * 4
        + match total % 3 {
            0 => 0,
            1 => 1,
            _ => 2,
        };
    enc.get(skip..end.min(enc.len()))
        .unwrap_or_default()
        .to_vec()
}

#[derive(Clone, Copy)]
enum Percent {
    Upper,
    Lower,
    /// `application/x-www-form-urlencoded`: space as `+`, upper-case hex.
    FormUpper,
}

fn percent(v: &[u8], form: Percent) -> Vec<u8> {
    let hex: &[u8; 16] = match form {
        Percent::Lower => b"0123456789abcdef",
        _ => b"0123456789ABCDEF",
    };
    let mut out = Vec::with_capacity(v.len());
    for &b in v {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else if b == b' ' && matches!(form, Percent::FormUpper) {
            out.push(b'+');
        } else {
            out.extend_from_slice(&[b'%', hex[(b >> 4) as usize], hex[(b & 15) as usize]]);
        }
    }
    out
}

const LOWER_HEX: &[u8; 16] = b"0123456789abcdef";
const UPPER_HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Two hex digits per byte, no separators (`binascii.hexlify`,
/// `bytes.hex()`, `xxd -p` of a value shorter than its 30-byte lines).
fn hex(v: &[u8], digits: &[u8; 16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 2);
    for &b in v {
        out.extend_from_slice(&[digits[(b >> 4) as usize], digits[(b & 15) as usize]]);
    }
    out
}

/// `units` as the body of a JSON string: with `all`, every unit as
/// `\uXXXX`; without, as `json.dumps(s, ensure_ascii=True)` writes it
/// (`\"`, `\\`, the short escapes of `\b\f\n\r\t`, any other control
/// character or non-ASCII unit as `\uXXXX`, the rest as itself).
fn u_escaped(units: &[u16], digits: &[u8; 16], all: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(units.len() * 6);
    for &u in units {
        if !all {
            let short: Option<&[u8]> = match u {
                0x22 => Some(b"\\\""),
                0x5c => Some(b"\\\\"),
                0x08 => Some(b"\\b"),
                0x0c => Some(b"\\f"),
                0x0a => Some(b"\\n"),
                0x0d => Some(b"\\r"),
                0x09 => Some(b"\\t"),
                0x20..=0x7e => {
                    out.push(u as u8);
                    continue;
                }
                _ => None,
            };
            if let Some(short) = short {
                out.extend_from_slice(short);
                continue;
            }
        }
        out.extend_from_slice(b"\\u");
        for shift in [12, 8, 4, 0] {
            out.push(digits[usize::from((u >> shift) & 15)]);
        }
    }
    out
}

fn xml_escaped(v: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len());
    for &b in v {
        match b {
            b'&' => out.extend_from_slice(b"&amp;"),
            b'<' => out.extend_from_slice(b"&lt;"),
            b'>' => out.extend_from_slice(b"&gt;"),
            b'"' => out.extend_from_slice(b"&quot;"),
            b'\'' => out.extend_from_slice(b"&apos;"),
            _ => out.push(b),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "s3cr3t-T0ken/with+odd=chars&more";

    fn padded_b64(data: &[u8], alphabet: &[u8; 64]) -> String {
        let mut s = String::from_utf8(base64(data, alphabet)).unwrap();
        while !s.len().is_multiple_of(4) {
            s.push('=');
        }
        s
    }

    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(padded_b64(plain.as_bytes(), STD), enc, "{plain:?}");
        }
        assert_eq!(base64(&[0xfb, 0xff], URL_SAFE), b"-_8");
        assert_eq!(base64(&[0xfb, 0xff], STD), b"+/8");
    }

    #[test]
    fn every_spelling_is_replaced() {
        let r = Redactor::new([("FVD_TOKEN", TOKEN)]);
        let t = TOKEN.as_bytes();
        let mut spelled = vec![
            TOKEN.to_string(),
            padded_b64(t, STD),
            padded_b64(t, URL_SAFE),
            String::from_utf8(base64(t, STD)).unwrap(),
            String::from_utf8(base64(t, URL_SAFE)).unwrap(),
            "s3cr3t-T0ken%2Fwith%2Bodd%3Dchars%26more".into(),
            "s3cr3t-T0ken%2fwith%2bodd%3dchars%26more".into(),
            "s3cr3t-T0ken/with+odd=chars&amp;more".into(),
        ];
        // Inside a longer blob, at each of the three alignments: an HTTP
        // basic credential, say.
        for prefix in ["", "u:", "us:", "use:", "user:"] {
            let blob = format!("{prefix}{TOKEN}@host");
            spelled.push(padded_b64(blob.as_bytes(), STD));
            spelled.push(padded_b64(blob.as_bytes(), URL_SAFE));
        }
        for s in spelled {
            let line = format!("before {s} after");
            let out = r.text(&line);
            assert!(out.contains("[redacted:FVD_TOKEN]"), "{s} -> {out}");
            assert!(!out.contains(&s), "{s} -> {out}");
            // What is left of an encoded blob around the secret is a few
            // characters, never enough to decode the secret.
            assert!(out.len() < line.len(), "{out}");
        }
    }

    #[test]
    fn a_spelling_split_across_chunks_is_still_replaced() {
        let r = Redactor::new([("TOK", "hf_secretvalue"), ("SHORT", "abc")]);
        let text = b"a hf_secretvalue b hf_secr c hf_secretvaluehf_secretvalue";
        let want = b"a [redacted:TOK] b hf_secr c [redacted:TOK][redacted:TOK]";
        for cut in 0..=text.len() {
            for cut2 in cut..=text.len() {
                let mut s = r.stream();
                let mut out = s.push(&text[..cut]);
                out.extend(s.push(&text[cut..cut2]));
                out.extend(s.push(&text[cut2..]));
                out.extend(s.finish());
                assert_eq!(out, want.to_vec(), "split at {cut},{cut2}");
            }
        }
        let b64 = padded_b64(b"hf_secretvalue", STD);
        let text = format!("x{b64}y");
        for cut in 0..=text.len() {
            let mut s = r.stream();
            let mut out = s.push(&text.as_bytes()[..cut]);
            out.extend(s.push(&text.as_bytes()[cut..]));
            out.extend(s.finish());
            let out = String::from_utf8(out).unwrap();
            assert!(
                out.contains("[redacted:TOK]") && !out.contains(&b64),
                "{out}"
            );
        }
    }

    /// Each of `spelled` inside a line, redacted as text and as bytes:
    /// replaced by `[redacted:NAME]`, no trace of it left.
    fn assert_replaced(r: &Redactor, name: &str, spelled: &[&str]) {
        let want = format!("[redacted:{name}]");
        for s in spelled {
            let line = format!("before {s} after");
            let out = r.text(&line);
            assert_eq!(out, format!("before {want} after"), "{s}");
            let out = r.bytes(format!("{{\"k\": \"{s}\"}}\n").as_bytes());
            assert_eq!(out, format!("{{\"k\": \"{want}\"}}\n").into_bytes(), "{s}");
        }
    }

    #[test]
    fn hex_spellings_are_replaced_in_both_cases() {
        let r = Redactor::new([("FVD_TOKEN", TOKEN)]);
        // binascii.hexlify(TOKEN), and .upper() of it.
        assert_replaced(
            &r,
            "FVD_TOKEN",
            &[
                "7333637233742d54306b656e2f776974682b6f64643d6368617273266d6f7265",
                "7333637233742D54306B656E2F776974682B6F64643D6368617273266D6F7265",
            ],
        );
        // Inside a longer dump: hexlify(b"user:" + TOKEN + b"@host").
        let out = r.text(
            "757365723a7333637233742d54306b656e2f776974682b6f64643d6368617273266d6f726540686f7374",
        );
        assert_eq!(out, "757365723a[redacted:FVD_TOKEN]40686f7374");
    }

    #[test]
    fn u_escaped_spellings_are_replaced() {
        let r = Redactor::new([("FVD_TOKEN", TOKEN)]);
        // Every character as \u00XX, lower- and upper-case digits.
        let all_lower = "\\u0073\\u0033\\u0063\\u0072\\u0033\\u0074\\u002d\\u0054\\u0030\\u006b\\u0065\\u006e\\u002f\\u0077\\u0069\\u0074\\u0068\\u002b\\u006f\\u0064\\u0064\\u003d\\u0063\\u0068\\u0061\\u0072\\u0073\\u0026\\u006d\\u006f\\u0072\\u0065";
        let all_upper = all_lower
            .replace("\\u002d", "\\u002D")
            .replace("\\u006b", "\\u006B")
            .replace("\\u006e", "\\u006E")
            .replace("\\u002f", "\\u002F")
            .replace("\\u002b", "\\u002B")
            .replace("\\u006f", "\\u006F")
            .replace("\\u003d", "\\u003D")
            .replace("\\u006d", "\\u006D");
        assert_replaced(&r, "FVD_TOKEN", &[all_lower, &all_upper]);

        // A non-ASCII secret, as json.dumps(s) (ensure_ascii) writes it:
        // UTF-16 units, a surrogate pair for the key, `"` as `\"`.
        let secret = "p\u{e4}ssw\u{f6}rd-\u{1f511}-tok\"q";
        let r = Redactor::new([("PW", secret)]);
        assert_replaced(
            &r,
            "PW",
            &[
                "p\\u00e4ssw\\u00f6rd-\\ud83d\\udd11-tok\\\"q",
                "p\\u00E4ssw\\u00F6rd-\\uD83D\\uDD11-tok\\\"q",
                "\\u0070\\u00E4\\u0073\\u0073\\u0077\\u00F6\\u0072\\u0064\\u002D\\uD83D\\uDD11\\u002D\\u0074\\u006F\\u006B\\u0022\\u0071",
                // Its UTF-8 bytes decoded as Latin-1, then json.dumps.
                "p\\u00c3\\u00a4ssw\\u00c3\\u00b6rd-\\u00f0\\u009f\\u0094\\u0091-tok\\\"q",
            ],
        );

        // Bytes that are not UTF-8: each byte a character.
        let r = Redactor::new([("RAW", b"\xffsecret\x01")]);
        assert_replaced(&r, "RAW", &["\\u00ffsecret\\u0001", "\\u00FFsecret\\u0001"]);
    }

    #[test]
    fn the_long_spellings_split_across_chunks_are_still_replaced() {
        // The fully \u-escaped spelling is six times the secret: the
        // stream must hold back that much, and release what cannot start
        // one.
        let r = Redactor::new([("TOK", "hf_secretvalue")]);
        let hex = "68665f73656372657476616c7565";
        let uesc = "\\u0068\\u0066\\u005f\\u0073\\u0065\\u0063\\u0072\\u0065\\u0074\\u0076\\u0061\\u006c\\u0075\\u0065";
        let text = format!("a {hex} b \\u0068\\u0066 c {uesc}{} d", hex.to_uppercase());
        let want = "a [redacted:TOK] b \\u0068\\u0066 c [redacted:TOK][redacted:TOK] d";
        assert_eq!(r.text(&text), want);
        let text = text.as_bytes();
        for cut in 0..=text.len() {
            for cut2 in (cut..=text.len()).step_by(7) {
                let mut s = r.stream();
                let mut out = s.push(&text[..cut]);
                out.extend(s.push(&text[cut..cut2]));
                out.extend(s.push(&text[cut2..]));
                out.extend(s.finish());
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    want,
                    "split at {cut},{cut2}"
                );
            }
        }
        // What cannot start a spelling is released at once, not held back
        // to the length of the longest one.
        let mut s = r.stream();
        assert_eq!(s.push(b"plain output\n"), b"plain output\n".to_vec());
        assert_eq!(s.push(b"x \\u0068"), b"x ".to_vec());
        assert_eq!(s.push(b"\\u0069"), b"\\u0068\\u0069".to_vec());
    }

    #[test]
    fn what_the_module_doc_says_is_not_caught_is_not_caught() {
        // Kept in step with the module doc and docs/fleet.md: if one of these
        // starts being caught, say so there.
        let r = Redactor::new([("FVD_TOKEN", TOKEN)]);
        let reversed: String = TOKEN.chars().rev().collect();
        let split = format!("{} and then {}", &TOKEN[..10], &TOKEN[10..]);
        let colon_hex = TOKEN
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":");
        for s in [reversed, split, colon_hex] {
            assert_eq!(r.text(&s), s);
        }
        let mut st = r.stream();
        let mut out = st.push(&TOKEN.as_bytes()[..10]);
        out.extend(st.push(b"\nother output\n"));
        out.extend(st.push(&TOKEN.as_bytes()[10..]));
        out.extend(st.finish());
        assert!(!out.windows(9).any(|w| w == b"[redacted"));
    }

    #[test]
    fn short_values_and_an_empty_redactor_change_nothing() {
        let r = Redactor::new([("SHORT", "abc")]);
        assert!(r.is_empty());
        assert_eq!(r.text("abc abc"), "abc abc");
        let r = Redactor::default();
        assert_eq!(r.bytes(b"\xff\x00x"), b"\xff\x00x".to_vec());
    }

    #[test]
    fn the_longest_secret_wins_and_debug_shows_no_value() {
        let r = Redactor::new([("A", "tokenvalue"), ("B", "tokenvalue-extended")]);
        assert_eq!(r.text("tokenvalue-extended"), "[redacted:B]");
        assert_eq!(r.text("tokenvalue"), "[redacted:A]");
        assert!(!format!("{r:?}").contains("tokenvalue"));
        assert!(r.finds(b"xx tokenvalue"));
        assert!(!r.finds(b"xx tokenvalu"));
    }
}
