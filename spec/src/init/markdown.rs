//! Reading the loose markdown of READMEs and status files: tables anywhere
//! in a file, `key: value` lines, and component labels.
//!
//! A label is normalised the way `PORT_STATUS.md` rows are joined: markdown
//! stripped, the text before ` (` kept, lowercased, spaces to `_`. A
//! component *name* is that identity reduced to `[a-z0-9_]` and cut at the
//! first `/` (`text_encoder/tokenizer` is the component `text_encoder`).
//! This is init's own copy: the status writer's matching function lives in
//! `fvd-contracts` and may be merged with it.

/// A table found in a markdown file, with the heading it stands under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MdTable {
    /// Text of the nearest heading above the table (`Reference Assets`).
    pub heading: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl MdTable {
    /// Index of the first column whose header satisfies `f` (lowercased,
    /// markdown stripped).
    pub fn column_where(&self, f: impl Fn(&str) -> bool) -> Option<usize> {
        self.header
            .iter()
            .position(|h| f(&strip_md(h).to_ascii_lowercase()))
    }

    /// A cell, empty when the row is short.
    pub fn cell(&self, row: usize, col: usize) -> &str {
        self.rows
            .get(row)
            .and_then(|r| r.get(col))
            .map_or("", String::as_str)
    }
}

/// Every table of `text` outside fenced blocks, in file order.
pub(crate) fn tables(text: &str) -> Vec<MdTable> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut heading = String::new();
    let mut fenced = false;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if line.starts_with("```") || line.starts_with("~~~") {
            fenced = !fenced;
            i += 1;
            continue;
        }
        if fenced {
            i += 1;
            continue;
        }
        if line.starts_with('#') {
            heading = line.trim_start_matches('#').trim().to_string();
            i += 1;
            continue;
        }
        let next = lines.get(i + 1).map_or("", |l| l.trim());
        if line.starts_with('|') && is_separator(next) {
            let header = split_row(line);
            let mut rows = Vec::new();
            let mut j = i + 2;
            while j < lines.len() && lines[j].trim().starts_with('|') {
                rows.push(split_row(lines[j]));
                j += 1;
            }
            out.push(MdTable {
                heading: heading.clone(),
                header,
                rows,
            });
            i = j;
            continue;
        }
        i += 1;
    }
    out
}

/// Cells of a table line, trimmed; `\|` is a pipe inside a cell.
pub(crate) fn split_row(line: &str) -> Vec<String> {
    let t = line.trim();
    let t = t.strip_prefix('|').unwrap_or(t);
    let t = t.strip_suffix('|').unwrap_or(t);
    let mut cells = Vec::new();
    let mut cur = String::new();
    let mut chars = t.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cur.push('|');
                chars.next();
            }
            '|' => cells.push(std::mem::take(&mut cur).trim().to_string()),
            _ => cur.push(c),
        }
    }
    cells.push(cur.trim().to_string());
    cells
}

fn is_separator(line: &str) -> bool {
    line.starts_with('|')
        && split_row(line).iter().all(|c| {
            let c = c.trim_matches(':');
            !c.is_empty() && c.chars().all(|ch| ch == '-')
        })
}

/// Markdown removed from a short text: links become their text, backticks
/// and emphasis markers go, whitespace is collapsed.
pub(crate) fn strip_md(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    // [text](target) → text
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|c| open + c) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|e| close + e) else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    let out = out.replace('`', "").replace("**", "");
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A component label as a table row writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Label {
    /// The label, markdown stripped (`text_encoder/tokenizer`,
    /// `Transformer (SomeClass)`).
    pub text: String,
    /// The text before ` (`.
    pub base: String,
    /// What the parentheses say, if anything (`audio`, `Gemma, full parity`).
    pub qualifier: Option<String>,
}

impl Label {
    pub fn new(cell: &str) -> Self {
        let text = strip_md(cell);
        let (base, qualifier) = match text.find(" (") {
            Some(i) => {
                let q = text[i + 2..].trim_end_matches(')').trim().to_string();
                (text[..i].trim().to_string(), (!q.is_empty()).then_some(q))
            }
            None => (text.clone(), None),
        };
        Label {
            text,
            base,
            qualifier,
        }
    }

    /// The row identity: lowercased, spaces to `_`, `/` kept.
    pub fn identity(&self) -> String {
        self.base
            .to_lowercase()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join("_")
    }

    /// The component name: the identity up to its first `/`, reduced to
    /// `[a-z0-9_]` (empty when nothing is left).
    pub fn name(&self) -> String {
        let id = self.identity();
        ident(id.split('/').next().unwrap_or_default())
    }

    /// The first word of the qualifier, lowercased (`audio` of `(audio
    /// modality)`); empty without one.
    pub fn qualifier_word(&self) -> String {
        self.qualifier
            .as_deref()
            .and_then(|q| {
                q.split(|c: char| !c.is_ascii_alphanumeric())
                    .find(|w| !w.is_empty())
            })
            .map(ident)
            .unwrap_or_default()
    }
}

/// `s` reduced to a component or family identifier: lowercase ASCII
/// letters, digits and single underscores, none at either end.
pub(crate) fn ident(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('_') {
            out.push('_');
        }
    }
    while out.ends_with('_') {
        out.pop();
    }
    out
}

/// The words of a `key` for matching against known keys: lowercase,
/// markdown stripped, anything but letters and digits a single space.
pub(crate) fn key_words(key: &str) -> String {
    strip_md(key)
        .to_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether a value is a template gap rather than a value: empty,
/// `<TODO>`, `<TODO: a | b>`, `<TODO> (see …)`, `TODO`, `TBD`.
pub(crate) fn is_gap(value: &str) -> bool {
    let v = strip_md(value);
    let v = v.trim();
    let first = v
        .split(|c: char| !c.is_ascii_alphanumeric())
        .find(|w| !w.is_empty())
        .unwrap_or_default();
    v.is_empty()
        || (v.starts_with('<') && v.contains('>'))
        || first.eq_ignore_ascii_case("todo")
        || first.eq_ignore_ascii_case("tbd")
}

/// Every `*.py` path mentioned in a cell (`a.py; b.py`, markdown links).
pub(crate) fn py_paths(cell: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for word in cell.split(|c: char| {
        c.is_whitespace() || matches!(c, '`' | ';' | ',' | '(' | ')' | '[' | ']' | '"' | '\'')
    }) {
        let w = word.trim_end_matches(['.', ':']);
        let w = w.split("::").next().unwrap_or(w);
        if w.ends_with(".py")
            && w.len() > 3
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
            && !out.iter().any(|o| o == w)
        {
            out.push(w.to_string());
        }
    }
    out
}

/// One line, no longer than `max` characters (an ellipsis marks a cut).
pub(crate) fn one_line(s: &str, max: usize) -> String {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if s.chars().count() <= max {
        s
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_found_under_their_heading_and_not_in_fences() {
        let text = "# T\n\n## Assets\n\n| Field | Value |\n|---|---|\n| HF weights | `org/model` |\n| x \\| y | z |\n\n```\n| a | b |\n|---|---|\n| 1 | 2 |\n```\n## Tests\n| Component | Test |\n| --- | :---: |\n| vae | [`test_v.py`](./test_v.py) |\n";
        let t = tables(text);
        assert_eq!(t.len(), 2, "{t:?}");
        assert_eq!(t[0].heading, "Assets");
        assert_eq!(t[0].rows[0], ["HF weights", "`org/model`"]);
        assert_eq!(t[0].rows[1][0], "x | y");
        assert_eq!(t[1].heading, "Tests");
        assert_eq!(py_paths(t[1].cell(0, 1)), ["test_v.py", "./test_v.py"]);
    }

    #[test]
    fn labels_normalise_to_identities_and_names() {
        let l = Label::new("`text_encoder/tokenizer`");
        assert_eq!(
            (l.identity().as_str(), l.name().as_str()),
            ("text_encoder/tokenizer", "text_encoder")
        );
        let l = Label::new("Transformer (`SomeClass`)");
        assert_eq!(l.name(), "transformer");
        assert_eq!(l.qualifier.as_deref(), Some("SomeClass"));
        assert_eq!(l.qualifier_word(), "someclass");
        let l = Label::new("**Camera utility**");
        assert_eq!(
            (l.identity(), l.name()),
            ("camera_utility".into(), "camera_utility".into())
        );
        let l = Label::new("`vae` (audio, vocoder)");
        assert_eq!(
            (l.name(), l.qualifier_word()),
            ("vae".into(), "audio".into())
        );
        assert_eq!(Label::new("Q-Former v2.1").name(), "q_former_v2_1");
        assert_eq!(Label::new("  ").name(), "");
    }

    #[test]
    fn gaps_and_paths() {
        assert!(is_gap("`<TODO: diffusers / raw_official>`"));
        assert!(is_gap(" "));
        assert!(is_gap("`<TODO>` (env: `SOME_PATH`)"));
        assert!(is_gap("TODO: ask the author"));
        assert!(!is_gap("`default`"));
        assert_eq!(
            py_paths("`a/test_x.py`; `b/test_y.py::test_one`, see test_x.py."),
            ["a/test_x.py", "b/test_y.py", "test_x.py"]
        );
        assert_eq!(strip_md("[**a** `b`](c)  d"), "a b d");
        assert_eq!(one_line("a\n b  c", 4), "a b…");
    }
}
