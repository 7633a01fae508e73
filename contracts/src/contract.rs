//! The [`Contract`] trait every handoff type implements: parse, render and
//! check its text block, plus the rules shared by several contracts.

use crate::block::{self, Map, Value};
use crate::escape_hatch::EscapeHatch;
use crate::fields::{BlockStruct, Ctx, Slot};
use crate::findings::{ContractError, Finding};
use crate::ids;
use crate::kind::ContractKind;
use crate::secrets;

/// The result of checking a block: the typed value when it could be read
/// and every finding (structure, rules, placeholders, secrets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked<T> {
    pub value: Option<T>,
    pub findings: Vec<Finding>,
}

impl<T> Checked<T> {
    pub fn is_valid(&self) -> bool {
        self.value.is_some() && self.findings.is_empty()
    }
}

/// A handoff contract of the add-model workflow.
pub trait Contract: BlockStruct {
    /// Which contract this is.
    const KIND: ContractKind;
    /// The key the block is nested under (`escape_hatch:`), if any.
    const ROOT: Option<&'static str>;

    /// Contract rules beyond field shapes; `map` is the block's own map
    /// (inside the root key) so findings can carry lines.
    fn rules(&self, _map: &Map, _findings: &mut Vec<Finding>) {}

    /// Reads a bare block; structural problems become an error.
    fn parse(text: &str) -> Result<Self, ContractError> {
        let checked = read::<Self>(text, 1);
        let structural = checked.findings;
        match checked.value {
            Some(v) if structural.is_empty() => Ok(v),
            _ => Err(ContractError::Invalid {
                kind: Self::KIND.as_str(),
                findings: structural,
            }),
        }
    }

    /// Writes the block in contract field order.
    fn render(&self) -> String {
        let inner = self.to_map();
        match Self::ROOT {
            Some(root) => {
                let mut m = Map::default();
                m.push(root, Value::Map(inner));
                block::render(&m)
            }
            None => block::render(&inner),
        }
    }

    /// Reads and validates a block whose first line is line `first_line` of
    /// its file: structure, contract rules, template placeholders, secrets.
    fn check(text: &str, first_line: usize) -> Checked<Self> {
        let mut checked = read::<Self>(text, first_line);
        let parsed = block::parse(text, first_line);
        let inner = inner_map::<Self>(&parsed.map);
        match &checked.value {
            Some(v) => v.rules(&inner, &mut checked.findings),
            // the most consequential rule still applies to a block that
            // did not read: a pause without a hatch leaves the user unasked
            None => raw_ask_user_rule(&inner, &mut checked.findings),
        }
        checked.findings.extend(placeholders(&parsed.map, ""));
        checked
            .findings
            .extend(secrets::scan_text(text, first_line));
        secrets::redact_findings(&mut checked.findings);
        checked.findings.sort();
        checked.findings.dedup();
        checked
    }

    /// Validates a value built in code by rendering and checking it.
    fn validate(&self) -> Vec<Finding> {
        Self::check(&self.render(), 1).findings
    }
}

fn inner_map<T: Contract>(map: &Map) -> Map {
    match T::ROOT {
        Some(root) => match map.get(root).map(|e| &e.value) {
            Some(Value::Map(m)) => m.clone(),
            _ => Map::default(),
        },
        None => map.clone(),
    }
}

/// Structure only: block syntax and typed fields.
fn read<T: Contract>(text: &str, first_line: usize) -> Checked<T> {
    let parsed = block::parse(text, first_line);
    let mut cx = Ctx::default();
    cx.findings = parsed.findings;
    let value = match T::ROOT {
        Some(root) => {
            let v = cx.field::<RootOf<T>>(&parsed.map, root, first_line);
            cx.unknown_keys(&parsed.map, &[root]);
            v.map(|r| r.0)
        }
        None => T::from_map(&parsed.map, first_line, &mut cx),
    };
    let mut findings = cx.findings;
    // keys come from the input; a token pasted as a key must not reach an error
    secrets::redact_findings(&mut findings);
    Checked { value, findings }
}

/// Adapter so a rooted contract reads through the same field machinery.
struct RootOf<T>(T);

impl<T: BlockStruct> crate::fields::BlockValue for RootOf<T> {
    fn from_value(v: &Value, line: usize, cx: &mut Ctx) -> Option<Self> {
        match v {
            Value::Map(m) => T::from_map(m, line, cx).map(RootOf),
            _ => {
                cx.report(line, "expected a nested block of fields");
                None
            }
        }
    }
    fn to_value(&self) -> Value {
        Value::Map(self.0.to_map())
    }
}

/// `<snake_case>`-style values copied from a template instead of filled in.
pub fn is_placeholder(value: &str) -> bool {
    let v = value.trim().trim_matches('`').trim();
    v.len() >= 3 && v.starts_with('<') && v.ends_with('>') && !v[1..].contains('<')
}

/// Findings for every placeholder value in a block, at any depth.
pub fn placeholders(map: &Map, prefix: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    for e in &map.entries {
        let field = if prefix.is_empty() {
            e.key.clone()
        } else {
            format!("{prefix}.{}", e.key)
        };
        collect_placeholders(&e.value, e.line, &field, &mut out);
    }
    out
}

fn collect_placeholders(v: &Value, line: usize, field: &str, out: &mut Vec<Finding>) {
    match v {
        Value::Scalar(s) => {
            if is_placeholder(s) {
                out.push(Finding::new(
                    line,
                    field,
                    "placeholder copied from the template; fill in the value or write unknown plus the search performed",
                ));
            }
        }
        Value::Map(m) => out.extend(placeholders(m, field)),
        Value::List(items) => {
            for (i, item) in items.iter().enumerate() {
                collect_placeholders(&item.value, item.line, &format!("{field}[{i}]"), out);
            }
        }
    }
}

/// The shared `ask_user` rule: `next_step: ask_user` needs an `escape_hatch`
/// block (not `none`) asking for input and citing its `E###` status row.
pub fn ask_user_rule(
    asks_user: bool,
    escape: &Slot<EscapeHatch>,
    map: &Map,
    findings: &mut Vec<Finding>,
) {
    let line = map.line_of("escape_hatch").max(map.line_of("next_step"));
    match escape {
        Slot::Block(hatch) => {
            if asks_user {
                hatch.ask_rules(nested(map, "escape_hatch"), findings, "escape_hatch.");
            }
        }
        Slot::None if asks_user => findings.push(Finding::new(
            line,
            "escape_hatch",
            "next_step ask_user requires an escape_hatch block, not none",
        )),
        Slot::Text(_) => findings.push(Finding::new(
            line,
            "escape_hatch",
            "expected none or an escape_hatch block",
        )),
        Slot::None => {}
    }
}

/// `ask_user` without an `escape_hatch` block, read from the raw block.
fn raw_ask_user_rule(map: &Map, findings: &mut Vec<Finding>) {
    if map.scalar("next_step") != Some("ask_user") {
        return;
    }
    let has_block = matches!(
        map.get("escape_hatch").map(|e| &e.value),
        Some(Value::Map(m)) if !m.entries.is_empty()
    );
    if !has_block {
        findings.push(Finding::new(
            map.line_of("escape_hatch").max(map.line_of("next_step")),
            "escape_hatch",
            "next_step ask_user requires an escape_hatch block, not none",
        ));
    }
}

/// The nested map under `key`, empty when absent.
pub fn nested<'a>(map: &'a Map, key: &str) -> &'a Map {
    static EMPTY: Map = Map {
        entries: Vec::new(),
    };
    match map.get(key).map(|e| &e.value) {
        Some(Value::Map(m)) => m,
        _ => &EMPTY,
    }
}

/// Whether `text` cites a stable escape-hatch id (`E001`).
pub fn cites_escape_id(text: &str) -> bool {
    ids::find_ids(text)
        .iter()
        .any(|id| id.kind == ids::IdKind::EscapeHatch)
}
