//! A `PORT_STATUS.md` as the lines people wrote, for surgical edits.
//!
//! [`crate::port_status::import`] reads a status file into typed sections;
//! rendering that model back re-flows the whole file. The co-author
//! ([`crate::coauthor`]) must not: every line it does not own stays byte for
//! byte. This view keeps the text as lines (line endings, padding, prose,
//! fences and stray table rows included) and offers only edits that touch
//! what they name: one cell of one table row, one `- key: value` line,
//! inserted lines. Structure (sections, tables) is found again on every
//! query, so an insertion never leaves a stale index behind.

use crate::port_status::SectionId;

/// A section: its `## ` heading line and the lines up to the next heading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// Index of the heading line.
    pub heading: usize,
    /// One past the last line of the section (the next heading or the end).
    pub end: usize,
    /// The heading text after `## `, trimmed.
    pub title: String,
    /// The contract section the heading names, for its first occurrence.
    pub id: Option<SectionId>,
}

/// A markdown table found in a section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableAt {
    /// Index of the header line; the separator is the line after it.
    pub header_line: usize,
    /// Header cells, trimmed.
    pub header: Vec<String>,
    /// Indices of the body rows, in order.
    pub rows: std::ops::Range<usize>,
}

impl TableAt {
    /// The index of a column, matched case-insensitively.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.header
            .iter()
            .position(|h| h.trim().eq_ignore_ascii_case(name))
    }

    /// Where a row appended to this table goes.
    pub fn append_at(&self) -> usize {
        self.rows.end
    }
}

/// The lines of a status file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusDoc {
    lines: Vec<String>,
    final_newline: bool,
}

impl StatusDoc {
    /// Splits on `\n` only: a `\r` stays part of its line and is written back.
    pub fn parse(text: &str) -> Self {
        let mut lines: Vec<String> = text.split('\n').map(str::to_owned).collect();
        // an empty file gets lines ending in a newline
        let final_newline = text.ends_with('\n') || text.is_empty();
        if final_newline {
            lines.pop();
        }
        if text.is_empty() {
            lines.clear();
        }
        Self {
            lines,
            final_newline,
        }
    }

    /// The text again; unchanged lines are the bytes that were read.
    pub fn render(&self) -> String {
        if self.lines.is_empty() {
            return String::new();
        }
        let mut s = self.lines.join("\n");
        if self.final_newline {
            s.push('\n');
        }
        s
    }

    pub fn lines(&self) -> &[String] {
        &self.lines
    }

    pub fn line(&self, i: usize) -> Option<&str> {
        self.lines.get(i).map(|l| l.strip_suffix('\r').unwrap_or(l))
    }

    /// Inserts `new` before line `at` (at the end when `at` is past it).
    pub fn insert(&mut self, at: usize, new: Vec<String>) {
        let at = at.min(self.lines.len());
        let cr = self.uses_crlf();
        let new = new
            .into_iter()
            .map(|l| if cr { format!("{l}\r") } else { l });
        self.lines.splice(at..at, new);
    }

    /// Removes line `at` (fvd removes only lines it added itself).
    pub fn remove(&mut self, at: usize) {
        if at < self.lines.len() {
            self.lines.remove(at);
        }
    }

    fn uses_crlf(&self) -> bool {
        self.lines.first().is_some_and(|l| l.ends_with('\r'))
    }

    /// For each line, whether it is a fence line or inside a fenced block.
    pub fn fenced(&self) -> Vec<bool> {
        let mut out = Vec::with_capacity(self.lines.len());
        let mut open = false;
        for l in &self.lines {
            let fence = is_fence(l);
            out.push(open || fence);
            if fence {
                open = !open;
            }
        }
        out
    }

    /// The `## ` sections outside fenced blocks, in order. A contract
    /// section named twice is that section only the first time.
    pub fn sections(&self) -> Vec<Section> {
        let fenced = self.fenced();
        let heads: Vec<usize> = (0..self.lines.len())
            .filter(|&i| !fenced[i] && is_section_heading(self.line(i).unwrap_or_default()))
            .collect();
        let mut seen = Vec::new();
        heads
            .iter()
            .enumerate()
            .map(|(k, &h)| {
                let title = self.line(h).unwrap_or_default()[2..].trim().to_owned();
                let id = SectionId::from_heading(&title).filter(|id| !seen.contains(id));
                if let Some(id) = id {
                    seen.push(id);
                }
                Section {
                    heading: h,
                    end: heads.get(k + 1).copied().unwrap_or(self.lines.len()),
                    title,
                    id,
                }
            })
            .collect()
    }

    /// The contract section `id`.
    pub fn section(&self, id: SectionId) -> Option<Section> {
        self.sections().into_iter().find(|s| s.id == Some(id))
    }

    /// A section by its title, case-insensitively (`Final Handoff`).
    pub fn section_titled(&self, title: &str) -> Option<Section> {
        self.sections().into_iter().find(|s| {
            s.title
                .trim_end_matches('#')
                .trim()
                .eq_ignore_ascii_case(title)
        })
    }

    /// The first table of a section: a row line followed by a separator,
    /// and the row lines after it.
    pub fn table_in(&self, s: &Section) -> Option<TableAt> {
        self.tables_in(s).into_iter().next()
    }

    /// Every table of a section (those under its `###` subsections too),
    /// in order. A table is a row line (one with an unescaped `|`; the
    /// leading pipe is optional, as in GitHub's markdown) followed by a
    /// separator, and the row lines after it up to the first line without
    /// a pipe.
    pub fn tables_in(&self, s: &Section) -> Vec<TableAt> {
        let fenced = self.fenced();
        let mut out = Vec::new();
        let mut i = s.heading + 1;
        while i < s.end {
            let starts = !fenced[i]
                && is_table_line(self.line(i).unwrap_or_default())
                && i + 1 < s.end
                && !fenced[i + 1]
                && is_separator(self.line(i + 1).unwrap_or_default());
            if !starts {
                i += 1;
                continue;
            }
            let mut end = i + 2;
            while end < s.end && !fenced[end] && is_table_line(self.line(end).unwrap_or_default()) {
                end += 1;
            }
            out.push(TableAt {
                header_line: i,
                header: cells(self.line(i).unwrap_or_default())
                    .into_iter()
                    .map(|c| c.trim().to_owned())
                    .collect(),
                rows: i + 2..end,
            });
            i = end;
        }
        out
    }

    /// The table of the contract section `id`.
    pub fn table(&self, id: SectionId) -> Option<TableAt> {
        self.table_in(&self.section(id)?)
    }

    /// Cell `col` of table row `line`, trimmed, as written (escapes kept);
    /// `None` when the row is shorter.
    pub fn cell(&self, line: usize, col: usize) -> Option<String> {
        let l = self.line(line)?;
        cells(l).get(col).map(|c| c.trim().to_owned())
    }

    /// Sets cell `col` of table row `line` to `text` (one line, pipes
    /// escaped by the caller). Every other byte of the line stays; the
    /// cell keeps its leading blank and, in a padded table, its width.
    /// Returns whether the line changed: a cell that already reads `text`
    /// is left as written.
    pub fn set_cell(&mut self, line: usize, col: usize, text: &str) -> bool {
        let Some(raw) = self.lines.get(line) else {
            return false;
        };
        let (body, cr) = match raw.strip_suffix('\r') {
            Some(b) => (b, "\r"),
            None => (raw.as_str(), ""),
        };
        let spans = cell_spans(body);
        let new = if let Some(&(a, b)) = spans.get(col) {
            let old = &body[a..b];
            if old.trim() == text {
                return false;
            }
            let (lead, pad) = if old.trim().is_empty() {
                // an empty cell: one blank either side
                (" ", 1)
            } else {
                let lead = &old[..old.len() - old.trim_start().len()];
                let trail = old.len() - old.trim_end().len();
                let pad = if trail <= 1 {
                    trail
                } else {
                    // a padded table keeps its column width where it can
                    old.chars()
                        .count()
                        .saturating_sub(lead.chars().count() + text.chars().count())
                        .max(1)
                };
                (lead, pad)
            };
            format!(
                "{}{lead}{text}{}{}",
                &body[..a],
                " ".repeat(pad),
                &body[b..]
            )
        } else {
            // A short row: fill the missing cells up to `col`.
            let mut s = body.to_owned();
            if !s.ends_with('|') || s.ends_with("\\|") {
                s.push('|');
            }
            for _ in spans.len()..col {
                s.push_str("  |");
            }
            s.push_str(&format!(" {text} |"));
            s
        };
        self.lines[line] = format!("{new}{cr}");
        true
    }

    /// `- key: value` lines of a section: (line, key, raw value).
    pub fn fields(&self, s: &Section) -> Vec<(usize, String, String)> {
        (s.heading + 1..s.end)
            .filter_map(|i| {
                let l = self.line(i)?;
                let rest = l.strip_prefix("- ")?;
                let (k, v) = rest.split_once(':')?;
                let k = k.trim();
                (!k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
                    .then(|| (i, k.to_owned(), v.trim().to_owned()))
            })
            .collect()
    }

    /// Sets the value of the `- key: value` line at `line`, keeping the key
    /// as written. Returns whether it changed.
    pub fn set_field(&mut self, line: usize, value: &str) -> bool {
        let Some(l) = self.line(line) else {
            return false;
        };
        let Some((key, old)) = l.split_once(':') else {
            return false;
        };
        if old.trim() == value {
            return false;
        }
        let cr = if self.lines[line].ends_with('\r') {
            "\r"
        } else {
            ""
        };
        self.lines[line] = if value.is_empty() {
            format!("{key}:{cr}")
        } else {
            format!("{key}: {value}{cr}")
        };
        true
    }

    /// The last non-blank line of a section's body (its heading when empty).
    pub fn last_content_line(&self, s: &Section) -> usize {
        (s.heading..s.end)
            .rev()
            .find(|&i| !self.line(i).unwrap_or_default().trim().is_empty())
            .unwrap_or(s.heading)
    }
}

/// Whether a line opens or closes a fenced block.
pub fn is_fence(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("```") || t.starts_with("~~~")
}

fn is_section_heading(line: &str) -> bool {
    let t = line.trim_end();
    t == "##" || t.starts_with("## ")
}

/// A table row: a line with an unescaped pipe (the leading one is
/// optional), not a heading.
fn is_table_line(line: &str) -> bool {
    let t = line.trim();
    !t.is_empty() && !t.starts_with('#') && !pipes(t).is_empty()
}

/// Byte offsets of the unescaped pipes of a line.
fn pipes(line: &str) -> Vec<usize> {
    let bytes = line.as_bytes();
    (0..bytes.len())
        .filter(|&i| bytes[i] == b'|' && (i == 0 || bytes[i - 1] != b'\\'))
        .collect()
}

/// A table separator (`|---|:--:|`).
pub fn is_separator(line: &str) -> bool {
    let c = cells(line);
    !c.is_empty()
        && c.iter().all(|c| {
            let c = c.trim().trim_matches(':');
            !c.is_empty() && c.chars().all(|ch| ch == '-')
        })
}

/// Byte ranges of the cells of a table line, between unescaped pipes. In a
/// row that starts with a pipe, the text before it is not a cell; in one
/// that does not (`a | b | c`), that text is the first cell. The text after
/// the last pipe is a cell when it is not blank (a row without a closing
/// pipe).
fn cell_spans(line: &str) -> Vec<(usize, usize)> {
    let pipes = pipes(line);
    let Some(&first) = pipes.first() else {
        return Vec::new();
    };
    let mut spans: Vec<(usize, usize)> = Vec::new();
    if !line[..first].trim().is_empty() {
        spans.push((0, first));
    }
    spans.extend(pipes.windows(2).map(|w| (w[0] + 1, w[1])));
    if let Some(&last) = pipes.last()
        && !line[last + 1..].trim().is_empty()
    {
        spans.push((last + 1, line.len()));
    }
    spans
}

/// The cells of a table line as written (untrimmed, escapes kept).
pub fn cells(line: &str) -> Vec<&str> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    cell_spans(line)
        .into_iter()
        .map(|(a, b)| &line[a..b])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_gives_back_the_bytes_read() {
        for text in [
            "",
            "# T\n",
            "# T",
            "a\r\nb\r\n",
            "## Summary\n\n- a: 1\n\n\n",
            "| a |\n|---|\n",
        ] {
            assert_eq!(StatusDoc::parse(text).render(), text, "{text:?}");
        }
    }

    #[test]
    fn set_cell_keeps_every_other_byte() {
        let mut d = StatusDoc::parse("| a | b \\| c |   d   |\n");
        assert!(d.set_cell(0, 2, "x"));
        assert_eq!(d.render(), "| a | b \\| c |   x   |\n");
        assert_eq!(d.cell(0, 1).as_deref(), Some("b \\| c"));
        // the same text again changes nothing
        assert!(!d.set_cell(0, 2, "x"));
        let mut d = StatusDoc::parse("| a | b |\n");
        assert!(d.set_cell(0, 1, "longer text"));
        assert_eq!(d.render(), "| a | longer text |\n");
        // a short row is filled up to the cell
        let mut d = StatusDoc::parse("| a |\r\n");
        assert!(d.set_cell(0, 2, "c"));
        assert_eq!(d.render(), "| a |  | c |\r\n");
    }

    #[test]
    fn rows_without_a_leading_pipe_tabs_and_subsection_tables() {
        let d = StatusDoc::parse(
            "## Results\n\nComponent | Status\n---|---\nvae\t| PASS (A40)\n| dit | pending |\n\n### More\n\n| Scope | Result |\n|---|---|\n| x | y |\n",
        );
        let s = d.sections().remove(0);
        let t = d.tables_in(&s);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].header, ["Component", "Status"]);
        assert_eq!(t[0].rows, 4..6);
        assert_eq!(d.cell(4, 0).as_deref(), Some("vae"));
        assert_eq!(d.cell(4, 1).as_deref(), Some("PASS (A40)"));
        assert_eq!(d.cell(5, 1).as_deref(), Some("pending"));
        assert_eq!(t[1].header, ["Scope", "Result"]);
        let mut d = d;
        assert!(d.set_cell(4, 1, "PASS (A40) [fvd x]"));
        assert_eq!(d.line(4), Some("vae\t| PASS (A40) [fvd x]"));
    }

    #[test]
    fn sections_and_tables_ignore_fenced_lines() {
        let d = StatusDoc::parse(
            "# T\n\n## Parity Commands\n\n| Scope | Command |\n|---|---|\n| x | y |\n\n```text\n## Decisions\n```\n| stray | row |\n",
        );
        let s = d.sections();
        assert_eq!(s.len(), 1);
        let t = d.table(SectionId::ParityCommands).unwrap();
        assert_eq!(t.header, ["Scope", "Command"]);
        assert_eq!(t.rows, 6..7);
        assert_eq!(t.column("command"), Some(1));
    }
}
