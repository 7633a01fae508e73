//! Typed fields of the contract blocks: how each Rust type reads itself out
//! of a [`block::Value`](crate::block::Value) and writes itself back.
//!
//! The contracts share a handful of shapes (free text that may be `unknown`,
//! closed enums spelled as on the wire, lists that may be written inline,
//! `none`-or-block slots), so each shape is implemented once here and the
//! contract structs are declared with the crate-private `block_struct!` macro.

use std::fmt;

use crate::block::{Item, Map, Value};
use crate::findings::Finding;

/// Where a typed read is in the block, and what it found wrong so far.
#[derive(Debug, Default)]
pub struct Ctx {
    pub findings: Vec<Finding>,
    path: Vec<String>,
}

impl Ctx {
    /// The dotted path of the field being read (`escape_hatch.question`).
    pub fn here(&self) -> String {
        self.path.join(".")
    }

    /// Records a finding on the field being read.
    pub fn report(&mut self, line: usize, message: impl Into<String>) {
        let field = self.here();
        self.findings.push(Finding::new(line, field, message));
    }

    /// Reads `key` of `map` as `T`; `parent_line` anchors "missing" findings.
    pub fn field<T: BlockValue>(&mut self, map: &Map, key: &str, parent_line: usize) -> Option<T> {
        self.path.push(key.to_owned());
        let out = match map.get(key) {
            Some(e) => T::from_value(&e.value, e.line, self),
            None => {
                let missing = T::when_missing();
                if missing.is_none() {
                    self.report(parent_line, "missing required field");
                }
                missing
            }
        };
        self.path.pop();
        out
    }

    /// Reports keys of `map` that the contract does not define.
    pub fn unknown_keys(&mut self, map: &Map, known: &[&str]) {
        for e in &map.entries {
            if !known.contains(&e.key.as_str()) {
                self.path.push(e.key.clone());
                self.report(e.line, "unknown field for this contract");
                self.path.pop();
            }
        }
    }

    pub(crate) fn with<R>(&mut self, seg: String, f: impl FnOnce(&mut Self) -> R) -> R {
        self.path.push(seg);
        let r = f(self);
        self.path.pop();
        r
    }
}

/// A type that can be read from and written to a block value.
pub trait BlockValue: Sized {
    /// Reads the value, recording findings in `cx` when it does not fit.
    fn from_value(v: &Value, line: usize, cx: &mut Ctx) -> Option<Self>;
    /// Writes the value back.
    fn to_value(&self) -> Value;
    /// What an absent field means: `None` makes the field required.
    fn when_missing() -> Option<Self> {
        None
    }
}

/// A contract struct: a map of named fields.
pub trait BlockStruct: Sized {
    /// The field names in contract order.
    const FIELDS: &'static [&'static str];
    /// Reads the struct from `map`; `line` is where the map's key stands.
    fn from_map(map: &Map, line: usize, cx: &mut Ctx) -> Option<Self>;
    /// Writes the struct as a map in contract order.
    fn to_map(&self) -> Map;
}

fn scalar<'a>(v: &'a Value, line: usize, cx: &mut Ctx) -> Option<&'a str> {
    match v {
        Value::Scalar(s) if s.is_empty() => {
            cx.report(line, "missing value");
            None
        }
        Value::Scalar(s) => Some(s),
        _ => {
            cx.report(line, "expected a single-line value, found a nested block");
            None
        }
    }
}

impl BlockValue for String {
    fn from_value(v: &Value, line: usize, cx: &mut Ctx) -> Option<Self> {
        scalar(v, line, cx).map(str::to_owned)
    }
    fn to_value(&self) -> Value {
        Value::Scalar(self.clone())
    }
}

/// A value that may be `unknown`, carrying the search already performed, as
/// the contracts require instead of omitting a field.
///
/// Written `unknown` or `unknown (searched: <what was searched>)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Val<T> {
    Known(T),
    Unknown { searched: Option<String> },
}

/// Free text that may be `unknown`: most contract fields.
pub type Text = Val<String>;

impl<T> Val<T> {
    /// `unknown` with the search that failed to find the value.
    pub fn unknown(searched: impl Into<String>) -> Self {
        Val::Unknown {
            searched: Some(searched.into()),
        }
    }

    /// The known value, if any.
    pub fn known(&self) -> Option<&T> {
        match self {
            Val::Known(t) => Some(t),
            Val::Unknown { .. } => None,
        }
    }

    pub fn is_unknown(&self) -> bool {
        matches!(self, Val::Unknown { .. })
    }
}

impl From<&str> for Val<String> {
    fn from(s: &str) -> Self {
        Val::Known(s.to_owned())
    }
}

impl From<String> for Val<String> {
    fn from(s: String) -> Self {
        Val::Known(s)
    }
}

impl<T: fmt::Display> fmt::Display for Val<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Val::Known(t) => t.fmt(f),
            Val::Unknown { searched: None } => f.write_str("unknown"),
            Val::Unknown { searched: Some(s) } => write!(f, "unknown (searched: {s})"),
        }
    }
}

/// Reads `unknown`, `unknown (searched: …)` and looser spellings such as
/// `unknown - grep …` or `unknown; searched …`, keeping the search text.
pub fn parse_unknown(s: &str) -> Option<Option<String>> {
    let rest = s.strip_prefix("unknown")?;
    if rest.is_empty() {
        return Some(None);
    }
    if !rest.starts_with([' ', '(', ';', ':', ',', '-']) {
        return None;
    }
    let rest = rest.trim();
    let inner = match rest.strip_prefix('(').and_then(|r| r.strip_suffix(')')) {
        Some(inner) => inner.trim(),
        None => rest.trim_start_matches([';', ':', ',', '-']).trim(),
    };
    let inner = inner.strip_prefix("searched:").unwrap_or(inner).trim();
    Some(if inner.is_empty() {
        None
    } else {
        Some(inner.to_owned())
    })
}

impl<T: BlockValue> BlockValue for Val<T> {
    fn from_value(v: &Value, line: usize, cx: &mut Ctx) -> Option<Self> {
        if let Value::Scalar(s) = v
            && let Some(searched) = parse_unknown(s)
        {
            return Some(Val::Unknown { searched });
        }
        T::from_value(v, line, cx).map(Val::Known)
    }
    fn to_value(&self) -> Value {
        match self {
            Val::Known(t) => t.to_value(),
            Val::Unknown { searched: None } => Value::Scalar("unknown".to_owned()),
            Val::Unknown { searched: Some(s) } => Value::Scalar(format!("unknown (searched: {s})")),
        }
    }
}

/// Lists: `- item` lines, one item written inline, or nothing for empty.
impl<T: BlockValue> BlockValue for Vec<T> {
    fn from_value(v: &Value, line: usize, cx: &mut Ctx) -> Option<Self> {
        match v {
            Value::Scalar(s) if s.is_empty() => Some(Vec::new()),
            Value::Scalar(_) => T::from_value(v, line, cx).map(|t| vec![t]),
            Value::List(items) => {
                let mut out = Vec::with_capacity(items.len());
                let mut ok = true;
                let base = cx.path.pop().unwrap_or_default();
                for (i, item) in items.iter().enumerate() {
                    let r = cx.with(format!("{base}[{i}]"), |cx| {
                        T::from_value(&item.value, item.line, cx)
                    });
                    match r {
                        Some(t) => out.push(t),
                        None => ok = false,
                    }
                }
                cx.path.push(base);
                ok.then_some(out)
            }
            Value::Map(_) => {
                cx.report(
                    line,
                    "expected a list of `- item` lines, found a nested block",
                );
                None
            }
        }
    }
    fn to_value(&self) -> Value {
        let values: Vec<Value> = self.iter().map(BlockValue::to_value).collect();
        match values.as_slice() {
            [] => Value::Scalar(String::new()),
            [Value::Scalar(s)] => Value::Scalar(s.clone()),
            _ => Value::List(
                values
                    .into_iter()
                    .map(|value| Item { line: 0, value })
                    .collect(),
            ),
        }
    }
}

impl<T: BlockValue> BlockValue for Option<T> {
    fn from_value(v: &Value, line: usize, cx: &mut Ctx) -> Option<Self> {
        T::from_value(v, line, cx).map(Some)
    }
    fn to_value(&self) -> Value {
        self.as_ref()
            .map_or(Value::Scalar(String::new()), BlockValue::to_value)
    }
    fn when_missing() -> Option<Self> {
        Some(None)
    }
}

/// A field that is `none` or a nested block, such as `escape_hatch`. Some
/// contracts also allow a short free-text description there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot<T> {
    None,
    Text(String),
    Block(T),
}

/// The scalar that fills a [`Slot`] with nothing.
pub const SLOT_NONE: &str = "none";

impl<T> Slot<T> {
    /// Whether a scalar is the empty slot's word (`none`).
    pub fn is_none_text(scalar: &str) -> bool {
        scalar.trim() == SLOT_NONE
    }

    /// The nested block, if one was given.
    pub fn block(&self) -> Option<&T> {
        match self {
            Slot::Block(t) => Some(t),
            _ => None,
        }
    }
}

impl<T: BlockStruct> BlockValue for Slot<T> {
    fn from_value(v: &Value, line: usize, cx: &mut Ctx) -> Option<Self> {
        match v {
            Value::Scalar(s) if s == SLOT_NONE => Some(Slot::None),
            Value::Map(m) => T::from_map(m, line, cx).map(Slot::Block),
            _ => scalar(v, line, cx).map(|s| Slot::Text(s.to_owned())),
        }
    }
    fn to_value(&self) -> Value {
        match self {
            Slot::None => Value::Scalar(SLOT_NONE.to_owned()),
            Slot::Text(s) => Value::Scalar(s.clone()),
            Slot::Block(t) => Value::Map(t.to_map()),
        }
    }
}

/// The error of parsing an enum from its wire spelling; the input is not
/// repeated because it may be anything, secrets included.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what}; expected one of {expected}")]
pub struct WireError {
    pub what: &'static str,
    pub expected: String,
}

/// Declares a closed enum with its wire spellings, `FromStr`, `Display`,
/// serde and block support.
macro_rules! wire_enum {
    ($(#[$m:meta])* pub enum $name:ident { $( $(#[$vm:meta])* $variant:ident = $wire:literal ),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $( $(#[$vm])* $variant ),+ }

        impl $name {
            /// Every value, in contract order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The spelling used in contract blocks.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $wire),+ }
            }

            /// The accepted spellings joined as in the contracts (`a | b`).
            pub fn expected() -> String {
                Self::ALL.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(" | ")
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::fields::WireError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s.trim().trim_matches('`') {
                    $($wire => Ok($name::$variant),)+
                    _ => Err($crate::fields::WireError { what: stringify!($name), expected: Self::expected() }),
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl $crate::fields::BlockValue for $name {
            fn from_value(v: &$crate::block::Value, line: usize, cx: &mut $crate::fields::Ctx) -> Option<Self> {
                let s = <String as $crate::fields::BlockValue>::from_value(v, line, cx)?;
                match s.parse() {
                    Ok(x) => Some(x),
                    Err(_) => {
                        cx.report(line, format!("invalid value; expected one of {}", Self::expected()));
                        None
                    }
                }
            }
            fn to_value(&self) -> $crate::block::Value {
                $crate::block::Value::Scalar(self.as_str().to_owned())
            }
        }

        #[cfg(test)]
        impl $crate::fields::sample::Sample for $name {
            fn sample(g: &mut $crate::fields::sample::Gen) -> Self {
                Self::ALL[g.below(Self::ALL.len())]
            }
        }
    };
}

/// Declares a contract struct: public fields in contract order, read from
/// and written to a block map with the field names as keys.
macro_rules! block_struct {
    ($(#[$m:meta])* pub struct $name:ident { $( $(#[$fm:meta])* $field:ident : $ty:ty ),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name { $( $(#[$fm])* pub $field: $ty, )+ }

        impl $crate::fields::BlockStruct for $name {
            const FIELDS: &'static [&'static str] = &[$(stringify!($field)),+];

            fn from_map(map: &$crate::block::Map, line: usize, cx: &mut $crate::fields::Ctx) -> Option<Self> {
                $( let $field = cx.field::<$ty>(map, stringify!($field), line); )+
                cx.unknown_keys(map, Self::FIELDS);
                Some(Self { $( $field: $field? ),+ })
            }

            fn to_map(&self) -> $crate::block::Map {
                let mut m = $crate::block::Map::default();
                $( m.push(stringify!($field), $crate::fields::BlockValue::to_value(&self.$field)); )+
                m
            }
        }

        impl $crate::fields::BlockValue for $name {
            fn from_value(v: &$crate::block::Value, line: usize, cx: &mut $crate::fields::Ctx) -> Option<Self> {
                match v {
                    $crate::block::Value::Map(m) => <Self as $crate::fields::BlockStruct>::from_map(m, line, cx),
                    _ => {
                        cx.report(line, "expected a nested block of fields");
                        None
                    }
                }
            }
            fn to_value(&self) -> $crate::block::Value {
                $crate::block::Value::Map(<Self as $crate::fields::BlockStruct>::to_map(self))
            }
        }

        #[cfg(test)]
        impl $crate::fields::sample::Sample for $name {
            fn sample(g: &mut $crate::fields::sample::Gen) -> Self {
                Self { $( $field: <$ty as $crate::fields::sample::Sample>::sample(g) ),+ }
            }
        }
    };
}

pub(crate) use block_struct;
pub(crate) use wire_enum;

/// Random values for the round-trip property tests: proptest supplies the
/// seed, this generator builds a whole contract from it, which is far less
/// code than one hand-written strategy per struct.
#[cfg(test)]
pub mod sample {
    use super::{Slot, Val};

    #[derive(Debug)]
    pub struct Gen(u64);

    impl Gen {
        pub fn new(seed: u64) -> Self {
            Gen(seed | 1)
        }
        pub fn below(&mut self, n: usize) -> usize {
            // xorshift64*: plenty for picking test values
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n.max(1)
        }
    }

    pub trait Sample {
        fn sample(g: &mut Gen) -> Self;
    }

    // Values chosen to stress the text form: colons, pipes, hashes, quotes,
    // backticks, brackets, unicode, paths and url-like strings.
    const WORDS: &[&str] = &[
        "transformer",
        "tests/local_tests/wan/test_wan_vae_parity.py",
        "https://github.com/org/repo",
        "a | b | c",
        "x=1, y=2",
        "fastvideo/models/dits/foo.py::FooModel",
        "`quoted` value",
        "\"double\" and 'single'",
        "# not a comment",
        "ratio 3:2 kept",
        "ümlaut → arrow",
        "[list, like]",
        "{map: like}",
        "trailing colon:",
        "E001",
        "50%",
        "pytest -q -rs -> 3 passed",
    ];

    impl Sample for String {
        fn sample(g: &mut Gen) -> Self {
            let n = 1 + g.below(3);
            (0..n)
                .map(|_| WORDS[g.below(WORDS.len())])
                .collect::<Vec<_>>()
                .join(" ")
        }
    }

    impl<T: Sample> Sample for Val<T> {
        fn sample(g: &mut Gen) -> Self {
            match g.below(6) {
                0 => Val::Unknown { searched: None },
                1 => Val::Unknown {
                    searched: Some(format!("grep -r {} official/", String::sample(g))),
                },
                _ => Val::Known(T::sample(g)),
            }
        }
    }

    impl<T: Sample> Sample for Vec<T> {
        fn sample(g: &mut Gen) -> Self {
            let n = g.below(4);
            (0..n).map(|_| T::sample(g)).collect()
        }
    }

    impl<T: Sample> Sample for Option<T> {
        fn sample(g: &mut Gen) -> Self {
            (g.below(2) == 0).then(|| T::sample(g))
        }
    }

    impl<T: Sample> Sample for Slot<T> {
        fn sample(g: &mut Gen) -> Self {
            match g.below(3) {
                0 => Slot::None,
                1 => Slot::Text(String::sample(g)),
                _ => Slot::Block(T::sample(g)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keeps_the_search() {
        assert_eq!(parse_unknown("unknown"), Some(None));
        assert_eq!(
            parse_unknown("unknown (searched: grep -r Foo official/)"),
            Some(Some("grep -r Foo official/".to_owned()))
        );
        assert_eq!(
            parse_unknown("unknown - rg FooPipeline"),
            Some(Some("rg FooPipeline".to_owned()))
        );
        assert_eq!(parse_unknown("unknownish"), None);
        assert_eq!(parse_unknown("known"), None);
        let v: Text = Val::unknown("grep -r Foo official/");
        assert_eq!(v.to_string(), "unknown (searched: grep -r Foo official/)");
        let mut cx = Ctx::default();
        let back = Text::from_value(&v.to_value(), 1, &mut cx);
        assert_eq!(back, Some(v));
    }

    #[test]
    fn lists_read_inline_and_dashed() {
        let mut cx = Ctx::default();
        let one = Vec::<String>::from_value(&Value::Scalar("a, b".into()), 1, &mut cx);
        assert_eq!(one, Some(vec!["a, b".to_owned()]));
        let none = Vec::<String>::from_value(&Value::Scalar(String::new()), 1, &mut cx);
        assert_eq!(none, Some(vec![]));
        assert!(cx.findings.is_empty());
    }
}
