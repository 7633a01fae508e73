//! The text-block form the contracts are written in: `key: value` lines,
//! nested maps by indentation and lists of `- item` (scalars or maps).
//!
//! This is deliberately not YAML: handoff blocks are pasted by agents into
//! chat and markdown, values are free text (colons, pipes, quotes, `#`) and
//! a strict YAML reader would reject or reinterpret most real blocks. The
//! parser keeps going after a bad line so one check reports every problem.

use std::collections::HashSet;

use crate::findings::Finding;

/// A node of a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// Everything after `key: ` on one line, trimmed; empty for a bare `key:`.
    Scalar(String),
    /// `- item` lines under a key.
    List(Vec<Item>),
    /// Indented `key: value` lines under a key.
    Map(Map),
}

/// One `- ` item of a list with the line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub line: usize,
    pub value: Value,
}

/// One `key: value` entry with the line of its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub line: usize,
    pub value: Value,
}

/// Ordered entries of one indentation level.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Map {
    pub entries: Vec<Entry>,
}

impl Map {
    /// The entry for `key`, the first when a key is (wrongly) repeated.
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.key == key)
    }

    /// The line of `key`, `0` when absent.
    pub fn line_of(&self, key: &str) -> usize {
        self.get(key).map_or(0, |e| e.line)
    }

    /// Appends an entry for rendering; lines are assigned by `parse`.
    pub fn push(&mut self, key: impl Into<String>, value: Value) {
        self.entries.push(Entry {
            key: key.into(),
            line: 0,
            value,
        });
    }

    /// The scalar under `key`, if that is what it holds.
    pub fn scalar(&self, key: &str) -> Option<&str> {
        match self.get(key).map(|e| &e.value) {
            Some(Value::Scalar(s)) => Some(s),
            _ => None,
        }
    }
}

/// A block parsed with the findings of lines that did not fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub map: Map,
    pub findings: Vec<Finding>,
}

#[derive(Debug, Clone)]
struct Line {
    no: usize,
    indent: usize,
    text: String,
}

/// `key: value` or `key:` with an identifier key; values may hold anything.
pub(crate) fn split_key(text: &str) -> Option<(&str, &str)> {
    let colon = text.find(':')?;
    let key = &text[..colon];
    let rest = &text[colon + 1..];
    let ident = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ident && (rest.is_empty() || rest.starts_with([' ', '\t'])) {
        Some((key, rest.trim()))
    } else {
        None
    }
}

fn list_marker(text: &str) -> Option<&str> {
    if text == "-" {
        Some("")
    } else {
        text.strip_prefix("- ")
    }
}

/// Parses a block. `first_line` is the file line number of the first line of
/// `text`, so findings point into the file the block came from.
pub fn parse(text: &str, first_line: usize) -> Parsed {
    let mut lines: Vec<Line> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let expanded = raw.replace('\t', "    ");
        let trimmed = expanded.trim_end();
        if trimmed.trim().is_empty() {
            continue;
        }
        let indent = trimmed.len() - trimmed.trim_start().len();
        lines.push(Line {
            no: first_line + i,
            indent,
            text: trimmed.trim_start().to_owned(),
        });
    }
    let mut p = Parser {
        lines,
        pos: 0,
        findings: Vec::new(),
    };
    let mut map = Map::default();
    // Keys seen, so a block of many keys is not quadratic to check.
    let mut seen = HashSet::new();
    while p.pos < p.lines.len() {
        let indent = p.lines[p.pos].indent;
        let part = p.map(indent);
        for e in part.entries {
            if !seen.insert(e.key.clone()) {
                p.findings.push(Finding::new(
                    e.line,
                    e.key.clone(),
                    "field appears more than once",
                ));
            }
            map.entries.push(e);
        }
        if p.pos < p.lines.len() {
            // a line the map could not take at this level: report, move on
            let l = &p.lines[p.pos];
            p.findings.push(Finding::new(
                l.no,
                "block",
                "unexpected line; expected `key: value` at the top level",
            ));
            p.pos += 1;
        }
    }
    Parsed {
        map,
        findings: p.findings,
    }
}

struct Parser {
    lines: Vec<Line>,
    pos: usize,
    findings: Vec<Finding>,
}

impl Parser {
    fn map(&mut self, indent: usize) -> Map {
        let mut map = Map::default();
        let mut seen = HashSet::new();
        while let Some(line) = self.lines.get(self.pos) {
            if line.indent < indent {
                break;
            }
            if line.indent > indent {
                self.findings.push(Finding::new(
                    line.no,
                    map.entries.last().map_or("block", |e| e.key.as_str()),
                    "unexpected indentation",
                ));
                self.pos += 1;
                continue;
            }
            if list_marker(&line.text).is_some() {
                // a list where a key belongs ends this map; the caller reports it
                if map.entries.is_empty() {
                    self.findings.push(Finding::new(
                        line.no,
                        "block",
                        "list item without a key above it",
                    ));
                    self.pos += 1;
                    continue;
                }
                break;
            }
            let Some((key, value)) = split_key(&line.text) else {
                self.findings.push(Finding::new(
                    line.no,
                    map.entries.last().map_or("block", |e| e.key.as_str()),
                    "expected `key: value`",
                ));
                self.pos += 1;
                continue;
            };
            let (key, value, no) = (key.to_owned(), value.to_owned(), line.no);
            self.pos += 1;
            if !seen.insert(key.clone()) {
                self.findings.push(Finding::new(
                    no,
                    key.clone(),
                    "field appears more than once",
                ));
            }
            let value = if value.is_empty() {
                self.children(indent)
            } else {
                Value::Scalar(value)
            };
            map.entries.push(Entry {
                key,
                line: no,
                value,
            });
        }
        map
    }

    /// What hangs under a bare `key:` at `indent`: a deeper map, a list
    /// (deeper or, as YAML allows, at the key's own indentation) or nothing.
    fn children(&mut self, indent: usize) -> Value {
        let Some(next) = self.lines.get(self.pos) else {
            return Value::Scalar(String::new());
        };
        let is_item = list_marker(&next.text).is_some();
        if next.indent > indent {
            let child = next.indent;
            if is_item {
                Value::List(self.list(child))
            } else {
                Value::Map(self.map(child))
            }
        } else if next.indent == indent && is_item {
            Value::List(self.list(indent))
        } else {
            Value::Scalar(String::new())
        }
    }

    fn list(&mut self, indent: usize) -> Vec<Item> {
        let mut items = Vec::new();
        while let Some(line) = self.lines.get(self.pos) {
            if line.indent != indent {
                break;
            }
            let Some(rest) = list_marker(&line.text) else {
                break;
            };
            let (no, rest) = (line.no, rest.trim().to_owned());
            if split_key(&rest).is_some() {
                // `- key: v` opens a map whose later keys sit under `key`
                self.lines[self.pos].indent = indent + 2;
                self.lines[self.pos].text = rest;
                let map = self.map(indent + 2);
                items.push(Item {
                    line: no,
                    value: Value::Map(map),
                });
            } else {
                self.pos += 1;
                items.push(Item {
                    line: no,
                    value: Value::Scalar(rest),
                });
            }
        }
        items
    }
}

/// Renders a map with two spaces per level, as the contracts do.
pub fn render(map: &Map) -> String {
    let mut out = String::new();
    render_map(map, 0, &mut out);
    out
}

fn pad(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

fn render_map(map: &Map, indent: usize, out: &mut String) {
    for e in &map.entries {
        pad(out, indent);
        out.push_str(&e.key);
        out.push(':');
        render_value(&e.value, indent, out);
    }
}

fn render_value(v: &Value, indent: usize, out: &mut String) {
    match v {
        Value::Scalar(s) if s.is_empty() => out.push('\n'),
        Value::Scalar(s) => {
            out.push(' ');
            out.push_str(s);
            out.push('\n');
        }
        Value::Map(m) if m.entries.is_empty() => out.push('\n'),
        Value::Map(m) => {
            out.push('\n');
            render_map(m, indent + 2, out);
        }
        Value::List(items) => {
            out.push('\n');
            for item in items {
                pad(out, indent + 2);
                out.push('-');
                match &item.value {
                    Value::Map(m) if !m.entries.is_empty() => {
                        out.push(' ');
                        let mut inner = String::new();
                        render_map(m, indent + 4, &mut inner);
                        // the first key shares the dash's line
                        out.push_str(inner.trim_start());
                    }
                    Value::Scalar(s) if !s.is_empty() => {
                        out.push(' ');
                        out.push_str(s);
                        out.push('\n');
                    }
                    _ => out.push('\n'),
                }
            }
        }
    }
}

/// A fenced code block cut out of a markdown file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fenced<'a> {
    /// The info string after the opening fence (`text`, `yaml`, empty).
    pub info: &'a str,
    /// The lines between the fences.
    pub body: String,
    /// The file line number of the body's first line.
    pub first_line: usize,
}

/// Every fenced block of a markdown text, in order. An unclosed fence runs to
/// the end of the text, as markdown renders it.
pub fn fenced_blocks(text: &str) -> Vec<Fenced<'_>> {
    let mut out = Vec::new();
    let mut open: Option<(&str, &str, usize, Vec<&str>)> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        match &mut open {
            None => {
                if let Some(info) = t.strip_prefix("```") {
                    open = Some(("```", info.trim(), i + 2, Vec::new()));
                } else if let Some(info) = t.strip_prefix("~~~") {
                    open = Some(("~~~", info.trim(), i + 2, Vec::new()));
                }
            }
            Some((fence, info, first, body)) => {
                if t.starts_with(*fence) && t.trim_start_matches(['`', '~']).trim().is_empty() {
                    out.push(Fenced {
                        info,
                        body: body.join("\n"),
                        first_line: *first,
                    });
                    open = None;
                } else {
                    body.push(line);
                }
            }
        }
    }
    if let Some((_, info, first, body)) = open {
        out.push(Fenced {
            info,
            body: body.join("\n"),
            first_line: first,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nested_maps_and_lists() {
        let text =
            "a: 1\nb:\n  c: x: y\n  d:\n    - p\n    - path: q\n      symbols: S\ne: https://x/y\n";
        let p = parse(text, 1);
        assert!(p.findings.is_empty(), "{:?}", p.findings);
        assert_eq!(p.map.scalar("a"), Some("1"));
        assert_eq!(p.map.scalar("e"), Some("https://x/y"));
        let Some(Value::Map(b)) = p.map.get("b").map(|e| &e.value) else {
            panic!("b is not a map")
        };
        assert_eq!(b.scalar("c"), Some("x: y"));
        let Some(Value::List(items)) = b.get("d").map(|e| &e.value) else {
            panic!("d is not a list")
        };
        assert_eq!(items.len(), 2);
        assert_eq!(items[1].line, 6);
        let Value::Map(m) = &items[1].value else {
            panic!("item is not a map")
        };
        assert_eq!(m.scalar("symbols"), Some("S"));
        assert_eq!(m.line_of("symbols"), 7);
        assert_eq!(parse(&render(&p.map), 1).map, strip_lines(&p.map));
    }

    fn strip_lines(m: &Map) -> Map {
        // render then parse renumbers lines; compare against a re-parse instead
        parse(&render(m), 1).map
    }

    #[test]
    fn lists_may_sit_at_the_key_indentation() {
        let p = parse("files:\n- a\n- b\nnext: x\n", 1);
        assert!(p.findings.is_empty());
        assert!(matches!(&p.map.get("files").unwrap().value, Value::List(v) if v.len() == 2));
        assert_eq!(p.map.scalar("next"), Some("x"));
    }

    #[test]
    fn bad_lines_become_findings_not_panics() {
        let p = parse("a: 1\nnot a key line\n   deeper: 2\n- orphan\na: 3\n", 10);
        let lines: Vec<usize> = p.findings.iter().map(|f| f.line).collect();
        assert_eq!(lines, vec![11, 12, 13, 14]);
        let dup = parse("a: 1\na: 2\n", 1);
        assert_eq!(dup.findings[0].message, "field appears more than once");
    }

    #[test]
    fn finds_fenced_blocks_with_their_line() {
        let md = "# T\n\n```text\na: 1\n```\nx\n```\nb: 2\n";
        let f = fenced_blocks(md);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].info, "text");
        assert_eq!(f[0].first_line, 4);
        assert_eq!(f[0].body, "a: 1");
        assert_eq!(f[1].body, "b: 2");
    }
}
