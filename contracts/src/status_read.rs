//! What a `PORT_STATUS.md` records about each spec component, in the shapes
//! people actually write.
//!
//! The contract's Component Matrix (Parity) and Parity Commands (Last
//! Result) are two of them. Files that follow the contract loosely keep
//! their evidence elsewhere: a "Component Status" table with a Status
//! column (`PASS (A40, 2026-05-11)`), a "Coverage" table with a State
//! column (`complete`), a results table whose column asks "Successful?"
//! (`Yes: 2 tests`), a "Known Blockers" section that names components.
//! [`tables`] finds every table with a label column and a result (or
//! command) column, [`find`] pairs components with their rows in each, and
//! [`recorded`] says what the file records for a component: a pass (and in
//! which words) or a blocker a person listed. A red run against such a
//! pass is a regression whatever the shape.
//!
//! Reading only: what fvd may write where is [`crate::coauthor`]'s.

use crate::port_status::SectionId;
use crate::status_doc::{Section, StatusDoc, TableAt};
use crate::status_match::{self, Identity, Match};

/// The heading of the one section fvd writes in a file that has no place
/// for what it has to say (see [`crate::coauthor`]).
pub const FVD_SECTION_TITLE: &str = "fvd evidence";
/// The line right after that heading; with [`FVD_SECTION_END`] it bounds
/// the section, which fvd replaces as a whole.
pub const FVD_SECTION_BEGIN: &str = "<!-- fvd: this section is written by fvd and replaced as a whole on every write; edit outside it -->";
/// The last line of fvd's section.
pub const FVD_SECTION_END: &str = "<!-- fvd: end -->";

/// What kind of table a row sits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The contract's Component Matrix (fvd owns its Parity cells).
    Matrix,
    /// The contract's Parity Commands (fvd owns Last Result and the end of Notes).
    Commands,
    /// A table of the porter's own shape: read, never written.
    Person,
}

/// A table that says something about components.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub kind: Kind,
    /// The section title, and the `###` subsection's when the table sits
    /// under one (`Validation Results / Numerical parity`).
    pub title: String,
    pub at: TableAt,
    /// The column that names the component.
    pub label: usize,
    /// The column that records a result, if any.
    pub result: Option<usize>,
    /// The column that holds a command or a test file, if any.
    pub command: Option<usize>,
}

impl Table {
    /// The header of the result column (`Status`, `Successful?`).
    pub fn result_header(&self) -> &str {
        self.result
            .and_then(|c| self.at.header.get(c))
            .map_or("", String::as_str)
    }
}

/// Headers of columns that name a component, best first.
const LABELS: &[&str] = &[
    "component",
    "scope",
    "what was tested",
    "what was run",
    "test",
    "item",
    "area",
];
/// Headers of columns that record a result, best first.
const RESULTS: &[&str] = &[
    "parity",
    "last result",
    "status",
    "state",
    "result",
    "real-weight result",
    "successful",
    "current result",
];
/// Headers of columns that hold a command or a test file.
const COMMANDS: &[&str] = &["command", "parity test", "parity command", "test file"];

/// Sections whose tables are not about component results.
const NOT_RESULTS: &[SectionId] = &[
    SectionId::OpenQuestions,
    SectionId::IssuesAndBlockers,
    SectionId::EscapeHatches,
    SectionId::Decisions,
    SectionId::Summary,
    SectionId::CurrentPhase,
    SectionId::ConversionState,
];

fn header_is(h: &str, name: &str) -> bool {
    h.trim()
        .trim_end_matches('?')
        .trim()
        .eq_ignore_ascii_case(name)
}

fn column_of(header: &[String], names: &[&str]) -> Option<usize> {
    names
        .iter()
        .find_map(|n| header.iter().position(|h| header_is(h, n)))
}

/// Whether a section is fvd's own.
pub fn is_fvd_section(s: &Section) -> bool {
    s.title.eq_ignore_ascii_case(FVD_SECTION_TITLE)
}

/// Every table of `doc` that names components and records results or
/// commands, in file order; fvd's own section excepted.
pub fn tables(doc: &StatusDoc) -> Vec<Table> {
    let mut out = Vec::new();
    for s in doc.sections() {
        if is_fvd_section(&s) {
            continue;
        }
        if s.id.is_some_and(|id| NOT_RESULTS.contains(&id)) {
            continue;
        }
        for (k, at) in doc.tables_in(&s).into_iter().enumerate() {
            let first = k == 0;
            let kind = match s.id {
                Some(SectionId::ComponentMatrix)
                    if first && column_of(&at.header, &["component"]).is_some() =>
                {
                    Kind::Matrix
                }
                Some(SectionId::ParityCommands)
                    if first && column_of(&at.header, &["scope"]).is_some() =>
                {
                    Kind::Commands
                }
                _ => Kind::Person,
            };
            let (label, result, command) = match kind {
                Kind::Matrix => (
                    column_of(&at.header, &["component"]),
                    column_of(&at.header, &["parity"]),
                    None,
                ),
                Kind::Commands => (
                    column_of(&at.header, &["scope"]),
                    column_of(&at.header, &["last result"]),
                    column_of(&at.header, &["command"]),
                ),
                Kind::Person => (
                    column_of(&at.header, LABELS),
                    column_of(&at.header, RESULTS),
                    column_of(&at.header, COMMANDS),
                ),
            };
            let Some(label) = label else { continue };
            if kind == Kind::Person && result.is_none() && command.is_none() {
                continue;
            }
            let sub = (s.heading + 1..at.header_line)
                .rev()
                .filter_map(|i| doc.line(i))
                .find_map(|l| l.strip_prefix("### "))
                .map(|t| t.trim().to_owned());
            let title = match sub {
                Some(t) => format!("{} / {t}", s.title),
                None => s.title.clone(),
            };
            out.push(Table {
                kind,
                title,
                at,
                label,
                result,
                command,
            });
        }
    }
    out
}

/// Where a component's rows are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    /// The line of its Component Matrix row.
    pub matrix: Option<usize>,
    /// The line of its Parity Commands row.
    pub commands: Option<usize>,
    /// (index into the tables, line) of its rows in the porter's own tables.
    pub person: Vec<(usize, usize)>,
}

impl Found {
    /// Whether the file has a row about the component anywhere.
    pub fn anywhere(&self) -> bool {
        self.matrix.is_some() || self.commands.is_some() || !self.person.is_empty()
    }
}

/// How a row of `t` matches a component: by its label, else (where the
/// table has one) by a command or test file that runs the component's test.
fn row_match(doc: &StatusDoc, t: &Table, line: usize, who: &Identity<'_>) -> Option<Match> {
    let label = doc.cell(line, t.label).unwrap_or_default();
    let command = t
        .command
        .and_then(|c| doc.cell(line, c))
        .unwrap_or_default();
    let by_name = match t.kind {
        Kind::Matrix => status_match::match_label(&label, who),
        _ => status_match::match_command_row(&label, &command, who),
    };
    by_name.or_else(|| {
        // the code files the row's other cells name (its FastVideo
        // implementation), its result aside
        let l = doc.line(line)?;
        let others = crate::status_doc::cells(l)
            .into_iter()
            .enumerate()
            .filter(|(k, _)| *k != t.label && Some(*k) != t.result)
            .map(|(_, c)| c);
        status_match::match_paths(others, who)
    })
}

/// Each component's rows in `tables`: one per table at most, each row for
/// one component at most, better matches first (see
/// [`status_match::assign`]).
pub fn find(doc: &StatusDoc, tables: &[Table], who: &[Identity<'_>]) -> Vec<Found> {
    let mut out = vec![Found::default(); who.len()];
    for (k, t) in tables.iter().enumerate() {
        let lines: Vec<usize> = t.at.rows.clone().collect();
        let got = status_match::assign(who.len(), lines.len(), |c, r| {
            row_match(doc, t, lines[r], &who[c])
        });
        for (c, r) in got.into_iter().enumerate() {
            let Some(r) = r else { continue };
            let line = lines[r];
            match t.kind {
                Kind::Matrix if out[c].matrix.is_none() => out[c].matrix = Some(line),
                Kind::Commands if out[c].commands.is_none() => out[c].commands = Some(line),
                Kind::Person => out[c].person.push((k, line)),
                _ => {}
            }
        }
    }
    out
}

/// What a file records about one component.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorded {
    /// The person's words that record a pass, and where (`Component
    /// Status: AutoencoderKL`), when a row does.
    pub pass: Option<(String, String)>,
    /// A Known Blockers item that names the component.
    pub blocker: Option<String>,
}

impl Recorded {
    /// A pass the file records and no blocker it lists.
    pub fn records_pass(&self) -> bool {
        self.pass.is_some() && self.blocker.is_none()
    }
}

/// What the rows `found` (and the Known Blockers section) record for `who`.
/// `human` maps a result cell to the words a person wrote in it (fvd's
/// evidence taken out).
pub fn recorded(
    doc: &StatusDoc,
    tables: &[Table],
    found: &Found,
    who: &Identity<'_>,
    human: &dyn Fn(&str) -> String,
) -> Recorded {
    let mut rows: Vec<(&Table, usize)> = Vec::new();
    for (k, t) in tables.iter().enumerate() {
        let line = match t.kind {
            Kind::Matrix => found.matrix,
            Kind::Commands => found.commands,
            Kind::Person => found.person.iter().find(|p| p.0 == k).map(|p| p.1),
        };
        if let Some(line) = line {
            rows.push((t, line));
        }
    }
    let pass = rows.iter().find_map(|(t, line)| {
        let cell = human(&doc.cell(*line, t.result?)?);
        reads_as_pass_in(t.result_header(), &cell).then(|| {
            let label = doc.cell(*line, t.label).unwrap_or_default();
            (cell, format!("{}: {}", t.title, label))
        })
    });
    Recorded {
        pass,
        blocker: known_blockers(doc).into_iter().find(|b| mentions(b, who)),
    }
}

/// The items of a "Known Blockers" section (also "Blockers", "Open
/// Blockers"), one per bullet, numbered item or paragraph line; none when
/// it says "None".
pub fn known_blockers(doc: &StatusDoc) -> Vec<String> {
    let Some(s) = doc.sections().into_iter().find(|s| {
        let t = s.title.to_lowercase();
        matches!(
            t.as_str(),
            "known blockers" | "blockers" | "open blockers" | "current blockers"
        )
    }) else {
        return Vec::new();
    };
    let fenced = doc.fenced();
    let items: Vec<String> = (s.heading + 1..s.end)
        .filter(|&i| !fenced[i])
        .filter_map(|i| doc.line(i))
        .map(|l| {
            l.trim()
                .trim_start_matches(['-', '*'])
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .trim_start_matches(['.', ')'])
                .trim()
                .to_owned()
        })
        .filter(|l| !l.is_empty())
        .collect();
    match items.first() {
        Some(f) if f.to_lowercase().starts_with("none") => Vec::new(),
        _ => items,
    }
}

/// Whether `text` names the component (its name or an alias, as a word).
fn mentions(text: &str, who: &Identity<'_>) -> bool {
    let words = format!(
        "_{}_",
        status_match::normalise_label(text)
            .replace(|c: char| !c.is_ascii_alphanumeric() && c != '_', "_",)
    );
    std::iter::once(who.name)
        .chain(who.aliases.iter().map(String::as_str))
        .map(status_match::normalise_label)
        .filter(|n| !n.is_empty())
        .any(|n| words.contains(&format!("_{n}_")))
}

/// Whether a cell records a pass, read by its column: `Successful?` wants a
/// yes; a Status, State or Result column also takes `complete` and
/// `exact` (`exact`, `bit-exact`, `complete`); Parity and Last Result read
/// as [`crate::coauthor::reads_as_pass`] or say the result is exact
/// (`exact generated parity`, `bit-identical`).
pub fn reads_as_pass_in(header: &str, cell: &str) -> bool {
    let h = header.trim().trim_end_matches('?').trim().to_lowercase();
    let t = cell.trim().trim_matches('`').to_lowercase();
    if h == "successful" {
        return t.starts_with("yes");
    }
    let strict = matches!(h.as_str(), "parity" | "last result" | "");
    crate::coauthor::reads_as_pass(cell)
        || (!strict && crate::coauthor::reads_as_affirmative(cell))
        || crate::coauthor::reads_as_exact(cell)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FREEFORM: &str = "# T\n\n## Component Status\n\nComponent | Parity test | Status | Notes\n---|---|---|---\nGadgetDiT | t/test_dit.py | PASS (H100, 2026-04-01) | bf16\nGadgetVAE\t| t/test_vae.py | PASS (H100, 2026-04-01) | loader\n\n## Coverage\n\n| Scope | Evidence | State |\n|---|---|---|\n| Audio VAE | exact encode | complete |\n\n## Validation\n\n### Numerical parity\n\n| What was tested | Successful? | Evidence |\n|---|---|---|\n| Scheduler | Yes: 2 tests | slurm 1 |\n\n## Known Blockers\n\n- GadgetVAE decode drifts on bf16\n";

    fn who<'a>(name: &'a str, aliases: &'a [String], tests: &'a [String]) -> Identity<'a> {
        Identity {
            name,
            aliases,
            parity_tests: tests,
        }
    }

    #[test]
    fn every_shape_of_result_table_is_read() {
        let doc = StatusDoc::parse(FREEFORM);
        let t = tables(&doc);
        let titles: Vec<&str> = t.iter().map(|t| t.title.as_str()).collect();
        assert_eq!(
            titles,
            [
                "Component Status",
                "Coverage",
                "Validation / Numerical parity"
            ]
        );
        assert!(t.iter().all(|t| t.kind == Kind::Person));
        let dit_tests = vec!["t/test_dit.py".to_string()];
        let vae_alias = vec!["GadgetVAE".to_string()];
        let audio = vec!["audio vae".to_string()];
        let none: Vec<String> = vec![];
        let ids = [
            who("dit", &none, &dit_tests),
            who("vae", &vae_alias, &none),
            who("audio_vae", &audio, &none),
            who("scheduler", &none, &none),
            who("camera", &none, &none),
        ];
        let found = find(&doc, &t, &ids);
        let plain = |c: &str| c.to_owned();
        let rec: Vec<Recorded> = ids
            .iter()
            .zip(&found)
            .map(|(w, f)| recorded(&doc, &t, f, w, &plain))
            .collect();
        // by its test file
        assert_eq!(
            rec[0].pass,
            Some((
                "PASS (H100, 2026-04-01)".to_string(),
                "Component Status: GadgetDiT".to_string()
            ))
        );
        assert!(rec[0].records_pass());
        // by its alias, a tab after the label; but a person lists a blocker
        assert!(rec[1].pass.is_some());
        assert!(rec[1].blocker.is_some() && !rec[1].records_pass());
        // `complete` in a State column, `Yes` in Successful?
        assert!(rec[2].records_pass(), "{:?}", rec[2]);
        assert!(rec[3].records_pass(), "{:?}", rec[3]);
        assert_eq!(rec[4], Recorded::default());
        assert!(!found[4].anywhere());
    }

    #[test]
    fn known_blockers_that_say_none_list_nothing() {
        let doc = StatusDoc::parse("## Known Blockers\n\nNone. (Both prior blockers resolved.)\n");
        assert!(known_blockers(&doc).is_empty());
        let doc = StatusDoc::parse("## Known Blockers\n\n1. vae decode drifts\n2. camera poses\n");
        assert_eq!(known_blockers(&doc), ["vae decode drifts", "camera poses"]);
    }

    #[test]
    fn result_columns_read_in_their_own_words() {
        for (h, c, pass) in [
            ("Successful?", "Yes: 2 tests", true),
            ("Successful?", "No", false),
            ("State", "complete", true),
            ("Real-weight result", "exact", true),
            ("Status", "PASS (A40, 2026-05-11)", true),
            ("Status", "pending", false),
            // an exact result is a pass in any column (issue #41)
            ("Parity", "exact generated parity", true),
            ("Parity", "bit-exact", true),
            ("Parity", "not exact yet", false),
            ("Parity", "covered by pipeline smoke", false),
            ("Last Result", "complete", false),
            ("Last Result", "5 PASSED, no skips, GB200, 2026-07-15", true),
            (
                "Last Result",
                "L40S REFERENCE UPLOADED; END-TO-END SSIM CI PENDING",
                false,
            ),
            ("State", "incomplete", false),
        ] {
            assert_eq!(reads_as_pass_in(h, c), pass, "{h}: {c}");
        }
    }
}
