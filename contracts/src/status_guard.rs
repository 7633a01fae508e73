//! The check that a patched `PORT_STATUS.md` changed only what fvd owns.
//!
//! [`owned_changes`] lines up the file before and after: every line of the
//! old file must still be there, in order, byte for byte, except
//!
//! - table rows whose changed cells are cells fvd owns, every other cell
//!   keeping its bytes: the matrix's Parity and Parity Commands' Last
//!   Result, where the person's words stay (only fvd's segment after them
//!   comes and goes) unless they were a placeholder; the matrix's Open
//!   Issues, where only issue ids come and go; Parity Commands' Notes,
//!   where the text before fvd's marker stays; Status and Resolution of
//!   issue rows whose Evidence starts with fvd's marker; escape-hatch rows
//!   but their ID;
//! - the `phase`, `status`, `owner` and `last_updated` lines of Current
//!   Phase (one fvd added, as its moved-back record says, may go again);
//! - lines fvd added itself earlier (its "moved back" and "moved forward"
//!   bullets, its "superseded" line, its own `## fvd evidence` section),
//!   which it may take away or replace.
//!
//! Lines may be added anywhere. The co-author runs this on its own output
//! before writing, and the tests run it on theirs.

use crate::coauthor::{human_part, is_placeholder, parse_moved_back};
use crate::port_status::{SectionId, plain};
use crate::status_doc::{StatusDoc, cells};
use crate::status_read::{FVD_SECTION_BEGIN, FVD_SECTION_END, FVD_SECTION_TITLE};

/// What changed, when only owned things did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// (1-based old line, old text, new text) of rows and fields changed in place.
    pub changed: Vec<(usize, String, String)>,
    /// Lines added, in order.
    pub added: Vec<String>,
    /// fvd's own earlier lines taken away.
    pub removed: Vec<String>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.added.is_empty() && self.removed.is_empty()
    }
}

/// Whether a line is one fvd added outside tables and may remove again.
pub fn is_fvd_line(line: &str) -> bool {
    let l = line.trim_end_matches('\r');
    (l.starts_with("- fvd ")
        && (l.contains("moved back from phase: ") || l.contains("moved forward from phase: ")))
        || (l.starts_with("fvd ") && l.contains("the final handoff above is superseded"))
}

/// The Issue cell of the rows an fvd before co-authoring added for a
/// blocked component (`component X is blocked`): fvd's rows too.
pub fn is_legacy_fvd_issue(issue: &str) -> bool {
    plain(issue)
        .strip_prefix("component ")
        .and_then(|r| r.strip_suffix(" is blocked"))
        .is_some_and(|name| !name.is_empty() && !name.contains(' '))
}

/// Checks that `after` differs from `before` only in what fvd owns, and
/// says what changed; the error names the first line that broke the rule.
pub fn owned_changes(before: &str, after: &str) -> Result<Changes, String> {
    let old_doc = StatusDoc::parse(before);
    let old = old_doc.lines();
    let new_doc = StatusDoc::parse(after);
    let new = new_doc.lines();
    let context = line_context(&old_doc);
    let section = fvd_section_lines(&old_doc);
    let absent = absent_phase_keys(&old_doc);
    let mut out = Changes::default();
    let (mut i, mut j) = (0, 0);
    while i < old.len() {
        if j < new.len() && new[j] == old[i] {
            i += 1;
            j += 1;
            continue;
        }
        let removable = is_fvd_line(&old[i])
            || section.contains(&i)
            || (context[i].section == Some(SectionId::CurrentPhase)
                && phase_key(&old[i]).is_some_and(|k| absent.contains(&k)));
        if removable && !new[j.min(new.len())..].contains(&old[i]) {
            out.removed.push(old[i].clone());
            i += 1;
            continue;
        }
        let Some(line) = new.get(j) else {
            return Err(format!("line {} was deleted: {}", i + 1, old[i].trim_end()));
        };
        match owned_edit(&context[i], &old[i], line) {
            Ok(true) => {
                out.changed.push((i + 1, old[i].clone(), line.clone()));
                i += 1;
                j += 1;
            }
            Ok(false) => {
                // not this line changed: a line was added before it
                out.added.push(line.clone());
                j += 1;
            }
            Err(e) => {
                // the same row changed where fvd owns nothing, unless the
                // old line is still to come further down
                if new[j..].contains(&old[i]) {
                    out.added.push(line.clone());
                    j += 1;
                } else {
                    return Err(format!("line {}: {e}", i + 1));
                }
            }
        }
    }
    out.added.extend(new[j.min(new.len())..].iter().cloned());
    Ok(out)
}

/// The lines of fvd's own section (heading to end marker, and the blank
/// line before it), which fvd replaces as a whole.
fn fvd_section_lines(doc: &StatusDoc) -> std::collections::HashSet<usize> {
    let mut out = std::collections::HashSet::new();
    let n = doc.lines().len();
    let mut i = 1;
    while i < n {
        let heading = doc
            .line(i - 1)
            .and_then(|h| h.strip_prefix("## "))
            .is_some_and(|t| t.trim().eq_ignore_ascii_case(FVD_SECTION_TITLE));
        if heading
            && doc.line(i) == Some(FVD_SECTION_BEGIN)
            && let Some(end) = (i..n).find(|&k| doc.line(k) == Some(FVD_SECTION_END))
        {
            out.extend(i - 1..=end);
            // the blank line fvd put before it
            if i >= 2 && doc.line(i - 2).is_some_and(|l| l.trim().is_empty()) {
                out.insert(i - 2);
            }
            i = end + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// The key of a `- key: value` line.
fn phase_key(line: &str) -> Option<String> {
    line.strip_prefix("- ")
        .and_then(|r| r.split_once(':'))
        .map(|(k, _)| k.trim().to_owned())
}

/// Current Phase keys that fvd's moved-back record says were absent: fvd
/// added their lines, and may take them away when it restores.
fn absent_phase_keys(doc: &StatusDoc) -> Vec<String> {
    doc.lines()
        .iter()
        .filter(|l| is_fvd_line(l))
        .filter_map(|l| parse_moved_back(l.trim_end_matches('\r')))
        .flatten()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| k)
        .collect()
}

/// Where an old line sits: its section, and the header of its table when
/// it is a table body row.
#[derive(Debug, Clone, Default)]
struct Context {
    section: Option<SectionId>,
    header: Option<Vec<String>>,
}

fn line_context(doc: &StatusDoc) -> Vec<Context> {
    let mut out = vec![Context::default(); doc.lines().len()];
    for s in doc.sections() {
        for c in out.iter_mut().take(s.end).skip(s.heading) {
            c.section = s.id;
        }
        if let Some(t) = doc.table_in(&s) {
            for c in out.iter_mut().take(t.rows.end).skip(t.rows.start) {
                c.header = Some(t.header.clone());
            }
        }
    }
    out
}

/// `Ok(true)`: `new` is `old` with only owned parts changed; `Ok(false)`:
/// `new` is not an edit of `old` at all (another row, another key);
/// `Err`: it is an edit of `old` that touches what fvd does not own.
fn owned_edit(ctx: &Context, old: &str, new: &str) -> Result<bool, String> {
    if ctx.section == Some(SectionId::CurrentPhase) {
        let key = |l: &str| {
            l.strip_prefix("- ")
                .and_then(|r| r.split_once(':'))
                .map(|(k, _)| k.trim().to_owned())
        };
        return Ok(match (key(old), key(new)) {
            (Some(a), Some(b)) if a == b => {
                if matches!(a.as_str(), "phase" | "status" | "owner" | "last_updated") {
                    true
                } else {
                    return Err(format!("field `{a}` of Current Phase changed"));
                }
            }
            _ => false,
        });
    }
    let (Some(section), Some(header)) = (ctx.section, &ctx.header) else {
        return Ok(false);
    };
    // a table row: a line with a pipe (the leading one is optional)
    if cells(new).len() < 2 {
        return Ok(false);
    }
    let (a, b) = (cells(old), cells(new));
    let first = |c: &[&str]| c.first().map(|s| s.trim().to_owned());
    // a row is the same row when its first cell (a label, an id) is
    if first(&a) != first(&b) {
        return Ok(false);
    }
    let col = |name: &str| header.iter().position(|h| h.eq_ignore_ascii_case(name));
    for k in 0..a.len().max(b.len()) {
        let (x, y) = (
            a.get(k).copied().unwrap_or(""),
            b.get(k).copied().unwrap_or(""),
        );
        if x == y || (x.trim().is_empty() && y.trim().is_empty() && k >= a.len()) {
            continue;
        }
        let name = header.get(k).map_or("(extra)", String::as_str);
        // a result cell: the person's words stay, or were a placeholder
        let beside = || {
            let (hx, hy) = (human_part(x), human_part(y));
            hx == hy || is_placeholder(&hx)
        };
        let owned = match section {
            SectionId::ComponentMatrix if Some(k) == col("Parity") => beside(),
            SectionId::ComponentMatrix if Some(k) == col("Open Issues") => {
                without_ids(x) == without_ids(y)
            }
            SectionId::ParityCommands if Some(k) == col("Last Result") => beside(),
            SectionId::ParityCommands if Some(k) == col("Notes") => {
                let human = human_notes(x);
                let scope = col("Scope").and_then(|s| a.get(s)).map(|s| plain(s));
                y.trim().starts_with(human) || scope.is_some_and(|s| s.starts_with("component:"))
            }
            SectionId::IssuesAndBlockers
                if Some(k) == col("Status") || Some(k) == col("Resolution") =>
            {
                col("Evidence")
                    .and_then(|e| a.get(e))
                    .is_some_and(|e| e.trim().starts_with("[fvd "))
                    || col("Issue")
                        .and_then(|i| a.get(i))
                        .is_some_and(|i| is_legacy_fvd_issue(i))
            }
            SectionId::EscapeHatches => Some(k) != col("ID"),
            _ => false,
        };
        if !owned {
            return Err(format!(
                "cell `{name}` of a {} row changed: `{}` became `{}`",
                section.heading(),
                x.trim(),
                y.trim()
            ));
        }
    }
    Ok(true)
}

/// The Notes text before fvd's segment.
fn human_notes(cell: &str) -> &str {
    let t = cell.trim();
    match t.rfind("[fvd ") {
        Some(i) => t[..i].trim_end(),
        None => t,
    }
}

/// An Open Issues cell with issue ids, `none` and separators taken out.
fn without_ids(cell: &str) -> String {
    cell.split(|c: char| c == ',' || c == ';' || c.is_whitespace())
        .map(|w| w.trim_matches('`'))
        .filter(|w| {
            let id =
                w.len() >= 4 && w.starts_with('I') && w[1..].chars().all(|c| c.is_ascii_digit());
            !(w.is_empty() || w.eq_ignore_ascii_case("none") || id)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "# T\n\n## Current Phase\n\n- phase: `phase_11_post_parity_handoff`\n- status: `complete`\n- owner: `orchestrator`\n- last_updated: `2026-01-02`\n\n## Component Matrix\n\n| Component | Type | Parity | Open Issues |\n|---|---|---|---|\n| vae | vae | encode_pass | Q001 |\n\n## Parity Commands\n\n| Scope | Command | Last Result | Notes |\n|---|---|---|---|\n| vae | `pytest t.py` | encode_pass | 2026-01-01: agrees. |\n\n## Decisions\n\n| Date | Decision | Rationale | Impact |\n|---|---|---|---|\n| 2026-01-01 | fp32 | noise | vae |\n";

    #[test]
    fn owned_cells_and_added_lines_pass() {
        let after = BEFORE
            .replace(
                "| encode_pass | Q001 |",
                "| encode_pass [fvd 2026-02-01 run 1: debug_red (regression)] | Q001, I001 |",
            )
            .replace(
                "| encode_pass | 2026-01-01: agrees. |",
                "| encode_pass [fvd 2026-02-01 run 1: debug_red (regression)] | 2026-01-01: agrees. [fvd 2026-02-01 run 1: debug_red — off] |",
            )
            .replace("`complete`", "`blocked`")
            .replace(
                "| 2026-01-01 | fp32 | noise | vae |\n",
                "| 2026-01-01 | fp32 | noise | vae |\n| added | row | by | fvd |\n",
            );
        let c = owned_changes(BEFORE, &after).unwrap();
        assert_eq!(c.changed.len(), 3, "{c:?}");
        assert_eq!(c.added, ["| added | row | by | fvd |"]);
        assert!(owned_changes(BEFORE, BEFORE).unwrap().is_empty());
    }

    #[test]
    fn every_kind_of_foreign_change_is_named() {
        for (what, after) in [
            (
                "deleted",
                BEFORE.replace("| 2026-01-01 | fp32 | noise | vae |\n", ""),
            ),
            (
                "Type",
                BEFORE.replace("| vae | vae | encode_pass", "| vae | VAE | encode_pass"),
            ),
            ("Open Issues", BEFORE.replace("| Q001 |", "| none |")),
            // a person's result is never written over, only beside
            (
                "Parity",
                BEFORE.replace("| encode_pass | Q001 |", "| `debug_red` | Q001 |"),
            ),
            (
                "Last Result",
                BEFORE.replace(
                    "| encode_pass | 2026-01-01",
                    "| encode [fvd 2026-02-01 run 1: x] | 2026-01-01",
                ),
            ),
            (
                "Notes",
                BEFORE.replace("2026-01-01: agrees.", "[fvd 2026-02-01 run 1: x]"),
            ),
            ("Decision", BEFORE.replace("| fp32 |", "| bf16 |")),
            ("deleted", BEFORE.replace("## Decisions", "## Choices")),
            ("deleted", BEFORE.replace("- owner: `orchestrator`\n", "")),
        ] {
            let err = owned_changes(BEFORE, &after).unwrap_err();
            assert!(err.contains(what), "{what}: {err}");
        }
        // a reordered row is a deleted one
        let swapped = BEFORE.replace(
            "| 2026-01-01 | fp32 | noise | vae |\n",
            "| 2026-01-03 | b | c | d |\n| 2026-01-01 | fp32 | noise | vae |\n",
        );
        let back = swapped.replace(
            "| 2026-01-03 | b | c | d |\n| 2026-01-01 | fp32 | noise | vae |\n",
            "| 2026-01-01 | fp32 | noise | vae |\n| 2026-01-03 | b | c | d |\n",
        );
        assert!(owned_changes(&swapped, &back).is_err());
    }

    #[test]
    fn fvd_replaces_its_own_section_and_placeholders_only() {
        let section = "\n## fvd evidence\n<!-- fvd: this section is written by fvd and replaced as a whole on every write; edit outside it -->\n\n| a | b |\n|---|---|\n| `x` | y |\n<!-- fvd: end -->\n";
        let with = format!("{BEFORE}{section}");
        let replaced = with.replace("| `x` | y |", "| `x` | z |\n| `w` | v |");
        assert!(owned_changes(&with, &replaced).is_ok());
        assert!(
            owned_changes(&with, BEFORE).is_ok(),
            "fvd may drop its section"
        );
        let pending = BEFORE.replace("| encode_pass | Q001 |", "| pending | Q001 |");
        let filled = pending.replace("| pending | Q001 |", "| `non_skip_pass` | Q001 |");
        assert!(owned_changes(&pending, &filled).is_ok());
    }

    #[test]
    fn fvd_may_take_back_its_own_lines() {
        let with = BEFORE.replace(
            "- last_updated: `2026-01-02`\n",
            "- last_updated: `2026-01-02`\n- fvd 2026-02-01: moved back from phase: `p`; status: `s`; owner: `o`; last_updated: `d` — x\n",
        );
        let c = owned_changes(&with, BEFORE).unwrap();
        assert_eq!(c.removed.len(), 1);
        assert!(owned_changes(BEFORE, &BEFORE.replace("# T\n", "")).is_err());
    }
}
