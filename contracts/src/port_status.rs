//! `PORT_STATUS.md`: the per-port state file of the `port_state` contract.
//!
//! Real status files follow the contract loosely: other section names,
//! extra columns, padded tables, prose, fenced handoff blocks, tables in odd
//! places. [`import`] therefore reads what it recognises into typed sections
//! and keeps everything else verbatim, anchored after the known section it
//! followed, so [`PortStatus::render`] writes it back in place. What the
//! contract requires but the file lacks is reported as findings, never as an
//! error: a status file is a log people keep writing to, and refusing to read
//! one would lose the state it records.
//!
//! Building a fresh status file for a port, as the orchestrator does:
//!
//! ```
//! use fvd_contracts::phase::Phase;
//! use fvd_contracts::port_status::{ComponentRow, PhaseStatus, PortStatus, import};
//!
//! let mut status = PortStatus::new("Wan22 Mini", "wan22_mini");
//! status.set_phase(Phase::NativeComponentPrototype, PhaseStatus::InProgress, "orchestrator", "2026-11-26");
//! status.push_component(ComponentRow {
//!     component: "vae".into(),
//!     parity: "`scaffold_skip`".into(),
//!     ..ComponentRow::default()
//! });
//! status.handoff_notes.push_bullet("vae prototype key dumps pending");
//! let text = status.render();
//!
//! let (back, findings) = import(&text);
//! assert_eq!(back.phase(), Some(Phase::NativeComponentPrototype));
//! assert_eq!(back.component_rows()[0].parity_plain(), "scaffold_skip");
//! // the summary values are still empty, and the check says so
//! assert!(findings.iter().any(|f| f.field == "official_ref" && f.message == "missing value"));
//! ```

use serde::Serialize;

use crate::block::split_key;
use crate::common::ParityState;
use crate::contract::is_placeholder;
use crate::fields::wire_enum;
use crate::findings::Finding;
use crate::ids::{IdKind, StableId};
use crate::phase::Phase;
use crate::secrets;

/// The sections the contract requires, in contract order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SectionId {
    Summary,
    CurrentPhase,
    ComponentMatrix,
    ConversionState,
    ParityCommands,
    OpenQuestions,
    IssuesAndBlockers,
    EscapeHatches,
    Decisions,
    HandoffNotes,
}

impl SectionId {
    pub const ALL: [SectionId; 10] = [
        SectionId::Summary,
        SectionId::CurrentPhase,
        SectionId::ComponentMatrix,
        SectionId::ConversionState,
        SectionId::ParityCommands,
        SectionId::OpenQuestions,
        SectionId::IssuesAndBlockers,
        SectionId::EscapeHatches,
        SectionId::Decisions,
        SectionId::HandoffNotes,
    ];

    /// The heading text after `## `.
    pub fn heading(self) -> &'static str {
        match self {
            SectionId::Summary => "Summary",
            SectionId::CurrentPhase => "Current Phase",
            SectionId::ComponentMatrix => "Component Matrix",
            SectionId::ConversionState => "Conversion State",
            SectionId::ParityCommands => "Parity Commands",
            SectionId::OpenQuestions => "Open Questions",
            SectionId::IssuesAndBlockers => "Issues And Blockers",
            SectionId::EscapeHatches => "Escape Hatches",
            SectionId::Decisions => "Decisions",
            SectionId::HandoffNotes => "Handoff Notes",
        }
    }

    /// The section a `## ` heading names (case-insensitive), if any.
    pub fn from_heading(text: &str) -> Option<SectionId> {
        let t = text.trim().trim_end_matches('#').trim();
        SectionId::ALL
            .into_iter()
            .find(|s| s.heading().eq_ignore_ascii_case(t))
    }

    /// Required bullet keys of a field section; empty for table sections.
    pub fn required_keys(self) -> &'static [&'static str] {
        match self {
            SectionId::Summary => &SUMMARY_KEYS,
            SectionId::CurrentPhase => &CURRENT_PHASE_KEYS,
            SectionId::ConversionState => &CONVERSION_STATE_KEYS,
            _ => &[],
        }
    }

    /// Required columns of a table section; empty for field sections.
    pub fn columns(self) -> &'static [&'static str] {
        match self {
            SectionId::ComponentMatrix => &MATRIX_COLUMNS,
            SectionId::ParityCommands => &PARITY_COMMAND_COLUMNS,
            SectionId::OpenQuestions => &QUESTION_COLUMNS,
            SectionId::IssuesAndBlockers => &ISSUE_COLUMNS,
            SectionId::EscapeHatches => &ESCAPE_COLUMNS,
            SectionId::Decisions => &DECISION_COLUMNS,
            _ => &[],
        }
    }

    /// The id letter rows of this table carry, if its rows have stable ids.
    pub fn id_kind(self) -> Option<IdKind> {
        match self {
            SectionId::OpenQuestions => Some(IdKind::Question),
            SectionId::IssuesAndBlockers => Some(IdKind::Issue),
            SectionId::EscapeHatches => Some(IdKind::EscapeHatch),
            _ => None,
        }
    }
}

/// Required keys of `## Summary`.
pub const SUMMARY_KEYS: [&str; 8] = [
    "model_family",
    "workload_types",
    "official_ref",
    "official_ref_dir",
    "hf_weights_path",
    "local_weights_dir",
    "source_layout",
    "local_tests_readme",
];
/// Required keys of `## Current Phase`.
pub const CURRENT_PHASE_KEYS: [&str; 4] = ["phase", "status", "owner", "last_updated"];
/// Required keys of `## Conversion State`.
pub const CONVERSION_STATE_KEYS: [&str; 6] = [
    "conversion_script",
    "converted_weights_dir",
    "source_layout",
    "strict_load_status",
    "passthrough_components",
    "retry_history",
];
/// Columns of `## Component Matrix`.
pub const MATRIX_COLUMNS: [&str; 10] = [
    "Component",
    "Type",
    "Reuse/Port",
    "Official Definition",
    "Official Instantiation",
    "FastVideo Target",
    "Prototype",
    "Conversion",
    "Parity",
    "Open Issues",
];
/// Columns of `## Parity Commands`.
pub const PARITY_COMMAND_COLUMNS: [&str; 4] = ["Scope", "Command", "Last Result", "Notes"];
/// Columns of `## Open Questions`.
pub const QUESTION_COLUMNS: [&str; 6] = [
    "ID",
    "Question",
    "Owner",
    "Needed By Phase",
    "Status",
    "Resolution",
];
/// Columns of `## Issues And Blockers`.
pub const ISSUE_COLUMNS: [&str; 9] = [
    "ID",
    "Phase",
    "Component",
    "Severity",
    "Issue",
    "Evidence",
    "Owner",
    "Status",
    "Resolution",
];
/// Columns of `## Escape Hatches`.
pub const ESCAPE_COLUMNS: [&str; 7] = [
    "ID",
    "Phase",
    "Decision Type",
    "Question",
    "Recommended Option",
    "Status",
    "Resolution",
];
/// Columns of `## Decisions`.
pub const DECISION_COLUMNS: [&str; 4] = ["Date", "Decision", "Rationale", "Impact"];

wire_enum! {
    /// `status` of the current phase.
    pub enum PhaseStatus {
        NotStarted = "not_started",
        InProgress = "in_progress",
        Blocked = "blocked",
        Complete = "complete",
    }
}

/// Strips the backticks status files wrap values in (`` `raw_official` ``).
pub fn plain(value: &str) -> String {
    let v = value.trim();
    if v.len() >= 2 && v.starts_with('`') && v.ends_with('`') && !v[1..v.len() - 1].contains('`') {
        v[1..v.len() - 1].trim().to_owned()
    } else {
        v.to_owned()
    }
}

/// One line of a bullet section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldLine {
    /// `- key: value`, the value as written (backticks kept).
    Field { key: String, value: String },
    /// `- text` without a key.
    Bullet(String),
    /// Anything else (prose, continuation lines, blank lines), kept verbatim.
    Verbatim(String),
}

/// A section of `- key: value` bullets (Summary, Current Phase, Conversion
/// State) or plain bullets (Handoff Notes), in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldList {
    pub lines: Vec<FieldLine>,
}

impl FieldList {
    /// A list of the given keys with empty values, as a fresh file has them.
    pub fn with_keys(keys: &[&str]) -> Self {
        Self {
            lines: keys
                .iter()
                .map(|k| FieldLine::Field {
                    key: (*k).to_owned(),
                    value: String::new(),
                })
                .collect(),
        }
    }

    /// The value of `key` as written.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.lines.iter().find_map(|l| match l {
            FieldLine::Field { key: k, value } if k == key => Some(value.as_str()),
            _ => None,
        })
    }

    /// The value of `key` with backticks stripped; `None` when absent or empty.
    pub fn get_plain(&self, key: &str) -> Option<String> {
        self.get(key).map(plain).filter(|v| !v.is_empty())
    }

    /// Sets `key`, replacing its value in place or appending after the last field.
    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        let value = value.into();
        for l in &mut self.lines {
            if let FieldLine::Field { key: k, value: v } = l
                && k == key
            {
                *v = value;
                return;
            }
        }
        let at = self
            .lines
            .iter()
            .rposition(|l| !matches!(l, FieldLine::Verbatim(_)))
            .map_or(0, |i| i + 1);
        self.lines.insert(
            at,
            FieldLine::Field {
                key: key.to_owned(),
                value,
            },
        );
    }

    /// Appends a plain bullet (a handoff note).
    pub fn push_bullet(&mut self, text: impl Into<String>) {
        self.lines.push(FieldLine::Bullet(text.into()));
    }

    /// The plain bullets, in order.
    pub fn bullets(&self) -> impl Iterator<Item = &str> {
        self.lines.iter().filter_map(|l| match l {
            FieldLine::Bullet(b) => Some(b.as_str()),
            _ => None,
        })
    }

    fn render(&self, out: &mut Vec<String>) {
        for l in &self.lines {
            out.push(match l {
                FieldLine::Field { key, value } if value.is_empty() => format!("- {key}:"),
                FieldLine::Field { key, value } => format!("- {key}: {value}"),
                FieldLine::Bullet(b) => format!("- {b}"),
                FieldLine::Verbatim(v) => v.clone(),
            });
        }
    }
}

/// A markdown table: header and rows, cells as written (backticks kept).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these columns.
    pub fn new(columns: &[&str]) -> Self {
        Self {
            header: columns.iter().map(|c| (*c).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// The index of a column, matched case-insensitively.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.header
            .iter()
            .position(|h| h.trim().eq_ignore_ascii_case(name))
    }

    /// A cell of `row` by column name, as written.
    pub fn cell(&self, row: usize, column: &str) -> Option<&str> {
        let c = self.column(column)?;
        self.rows.get(row)?.get(c).map(String::as_str)
    }

    /// A cell with backticks stripped.
    pub fn cell_plain(&self, row: usize, column: &str) -> Option<String> {
        self.cell(row, column).map(plain)
    }

    /// Appends a row given as `(column, value)` pairs; columns the table
    /// lacks are ignored and missing ones stay empty, so rows built from the
    /// contract's columns fit tables with extra or fewer columns.
    pub fn push_named(&mut self, cells: &[(&str, String)]) {
        let mut row = vec![String::new(); self.header.len()];
        for (name, value) in cells {
            if let Some(i) = self.column(name) {
                row[i] = value.clone();
            }
        }
        self.rows.push(row);
    }

    fn render(&self, out: &mut Vec<String>) {
        out.push(render_row(&self.header));
        out.push(format!("|{}", "---|".repeat(self.header.len().max(1))));
        for r in &self.rows {
            out.push(render_row(r));
        }
    }
}

fn render_row(cells: &[String]) -> String {
    let mut s = String::from("|");
    for c in cells {
        s.push(' ');
        s.push_str(&escape_cell(c));
        s.push_str(" |");
    }
    s
}

fn escape_cell(c: &str) -> String {
    c.replace(['\n', '\r'], " ").replace('|', "\\|")
}

/// Splits a table line into trimmed cells on unescaped pipes; an escaped
/// pipe (`\|`) is cell text and reads as `|`, so render can escape it back.
pub fn split_row(line: &str) -> Vec<String> {
    let t = line.trim();
    let t = t.strip_prefix('|').unwrap_or(t);
    let mut cells = Vec::new();
    let mut cur = String::new();
    for ch in t.chars() {
        if ch == '|' {
            if cur.ends_with('\\') {
                cur.pop();
                cur.push('|');
            } else {
                cells.push(cur.trim().to_owned());
                cur.clear();
            }
        } else {
            cur.push(ch);
        }
    }
    if !cur.trim().is_empty() {
        cells.push(cur.trim().to_owned());
    }
    cells
}

fn is_separator(line: &str) -> bool {
    let cells = split_row(line);
    !cells.is_empty()
        && cells.iter().all(|c| {
            let c = c.trim_matches(':');
            !c.is_empty() && c.chars().all(|ch| ch == '-')
        })
}

/// A table section: the table plus whatever prose stood before and after it
/// (a second table, a note), kept verbatim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableSection {
    pub before: Vec<String>,
    pub table: Table,
    pub after: Vec<String>,
}

impl TableSection {
    /// An empty section with the contract's columns.
    pub fn new(columns: &[&str]) -> Self {
        Self {
            table: Table::new(columns),
            ..Self::default()
        }
    }

    fn render(&self, out: &mut Vec<String>) {
        if !self.before.is_empty() {
            // A fence the lines before the table leave open is closed
            // before the table, not after it (found by fvd-fuzz: the table
            // then read back as fenced and moved the closing fence).
            let start = out.len();
            out.extend(self.before.iter().cloned());
            balance_fences(out, start);
            out.push(String::new());
        }
        self.table.render(out);
        if !self.after.is_empty() {
            out.push(String::new());
            out.extend(self.after.iter().cloned());
        }
    }
}

/// A section the contract does not define, kept verbatim (heading included)
/// and re-rendered after the known section it followed (`None`: before all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraSection {
    pub after: Option<SectionId>,
    pub lines: Vec<String>,
}

/// A typed `PORT_STATUS.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortStatus {
    /// The title after `# ` (`DreamX World Port Status`); empty for none.
    pub title: String,
    /// Lines between the title and the first section, verbatim.
    pub preamble: Vec<String>,
    pub summary: FieldList,
    pub current_phase: FieldList,
    pub component_matrix: TableSection,
    pub conversion_state: FieldList,
    pub parity_commands: TableSection,
    pub open_questions: TableSection,
    pub issues_and_blockers: TableSection,
    pub escape_hatches: TableSection,
    pub decisions: TableSection,
    pub handoff_notes: FieldList,
    pub extra_sections: Vec<ExtraSection>,
}

impl Default for PortStatus {
    /// The contract's skeleton: every section, every key, empty values.
    fn default() -> Self {
        Self {
            title: String::new(),
            preamble: Vec::new(),
            summary: FieldList::with_keys(&SUMMARY_KEYS),
            current_phase: FieldList::with_keys(&CURRENT_PHASE_KEYS),
            component_matrix: TableSection::new(&MATRIX_COLUMNS),
            conversion_state: FieldList::with_keys(&CONVERSION_STATE_KEYS),
            parity_commands: TableSection::new(&PARITY_COMMAND_COLUMNS),
            open_questions: TableSection::new(&QUESTION_COLUMNS),
            issues_and_blockers: TableSection::new(&ISSUE_COLUMNS),
            escape_hatches: TableSection::new(&ESCAPE_COLUMNS),
            decisions: TableSection::new(&DECISION_COLUMNS),
            handoff_notes: FieldList::default(),
            extra_sections: Vec::new(),
        }
    }
}

/// Name and parity of one component row, as `fvd contracts check` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComponentSummary {
    /// The Component cell, backticks stripped.
    pub name: String,
    /// The Parity cell as written; `None` when the table has no Parity column.
    pub parity: Option<String>,
    /// The Parity cell read as a contract status, when it is one.
    pub parity_status: Option<ParityState>,
}

macro_rules! row_struct {
    ($(#[$m:meta])* $name:ident, $section:ident, $sid:ident { $( $field:ident => $col:literal ),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct $name { $( pub $field: String, )+ }

        impl $name {
            /// The row as `(column, value)` pairs for [`Table::push_named`].
            pub fn cells(&self) -> Vec<(&'static str, String)> {
                vec![$( ($col, self.$field.clone()) ),+]
            }

            /// Reads row `i` of `table` by column name; absent columns read empty.
            pub fn from_row(table: &Table, i: usize) -> Self {
                Self { $( $field: table.cell(i, $col).unwrap_or_default().to_owned(), )+ }
            }
        }

        impl PortStatus {
            /// Appends a row to the section, mapping by column name.
            pub fn $section(&mut self, row: $name) -> &mut Self {
                let cells = row.cells();
                if let Some(section) = self.table_mut(SectionId::$sid) {
                    section.table.push_named(&cells);
                }
                self
            }
        }
    };
}

row_struct! {
    /// A Component Matrix row.
    ComponentRow, push_component, ComponentMatrix {
        component => "Component",
        component_type => "Type",
        reuse_port => "Reuse/Port",
        official_definition => "Official Definition",
        official_instantiation => "Official Instantiation",
        fastvideo_target => "FastVideo Target",
        prototype => "Prototype",
        conversion => "Conversion",
        parity => "Parity",
        open_issues => "Open Issues",
    }
}

row_struct! {
    /// A Parity Commands row.
    ParityCommandRow, push_parity_command, ParityCommands {
        scope => "Scope",
        command => "Command",
        last_result => "Last Result",
        notes => "Notes",
    }
}

row_struct! {
    /// An Open Questions row (`Q###`).
    QuestionRow, push_question, OpenQuestions {
        id => "ID",
        question => "Question",
        owner => "Owner",
        needed_by_phase => "Needed By Phase",
        status => "Status",
        resolution => "Resolution",
    }
}

row_struct! {
    /// An Issues And Blockers row (`I###`).
    IssueRow, push_issue, IssuesAndBlockers {
        id => "ID",
        phase => "Phase",
        component => "Component",
        severity => "Severity",
        issue => "Issue",
        evidence => "Evidence",
        owner => "Owner",
        status => "Status",
        resolution => "Resolution",
    }
}

row_struct! {
    /// An Escape Hatches row (`E###`).
    EscapeHatchRow, push_escape_hatch, EscapeHatches {
        id => "ID",
        phase => "Phase",
        decision_type => "Decision Type",
        question => "Question",
        recommended_option => "Recommended Option",
        status => "Status",
        resolution => "Resolution",
    }
}

row_struct! {
    /// A Decisions row.
    DecisionRow, push_decision, Decisions {
        date => "Date",
        decision => "Decision",
        rationale => "Rationale",
        impact => "Impact",
    }
}

impl ComponentRow {
    /// The Parity cell without backticks.
    pub fn parity_plain(&self) -> String {
        plain(&self.parity)
    }

    /// The Parity cell as a contract status, when it is one.
    pub fn parity_status(&self) -> Option<ParityState> {
        self.parity_plain().parse().ok()
    }
}

impl PortStatus {
    /// A fresh status file for a port: the contract skeleton with the title
    /// (`<Display Name> Port Status`) and `model_family` filled in.
    pub fn new(display_name: &str, model_family: &str) -> Self {
        let mut s = Self {
            title: format!("{display_name} Port Status"),
            ..Self::default()
        };
        s.summary.set("model_family", format!("`{model_family}`"));
        s
    }

    /// The table section `id`; `None` for the bullet sections.
    pub fn table_mut(&mut self, id: SectionId) -> Option<&mut TableSection> {
        Some(match id {
            SectionId::ComponentMatrix => &mut self.component_matrix,
            SectionId::ParityCommands => &mut self.parity_commands,
            SectionId::OpenQuestions => &mut self.open_questions,
            SectionId::IssuesAndBlockers => &mut self.issues_and_blockers,
            SectionId::EscapeHatches => &mut self.escape_hatches,
            SectionId::Decisions => &mut self.decisions,
            SectionId::Summary
            | SectionId::CurrentPhase
            | SectionId::ConversionState
            | SectionId::HandoffNotes => return None,
        })
    }

    /// `model_family` from the Summary, or a `Model family:` preamble line.
    pub fn model_family(&self) -> Option<String> {
        self.summary.get_plain("model_family").or_else(|| {
            self.preamble.iter().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                let k = k.trim().trim_start_matches("- ").to_ascii_lowercase();
                (k == "model family" || k == "model_family")
                    .then(|| plain(v))
                    .filter(|v| !v.is_empty())
            })
        })
    }

    /// `phase` of the Current Phase block as written, backticks stripped.
    pub fn phase_text(&self) -> Option<String> {
        self.current_phase.get_plain("phase")
    }

    /// The current phase, when it names one of P0..P11.
    pub fn phase(&self) -> Option<Phase> {
        self.phase_text()?.parse().ok()
    }

    /// `status` of the Current Phase block, when it is a contract value.
    pub fn phase_status(&self) -> Option<PhaseStatus> {
        self.current_phase.get_plain("status")?.parse().ok()
    }

    /// Sets the Current Phase block.
    pub fn set_phase(&mut self, phase: Phase, status: PhaseStatus, owner: &str, date: &str) {
        self.current_phase
            .set("phase", format!("`{}`", phase.slug()));
        self.current_phase.set("status", format!("`{status}`"));
        self.current_phase.set("owner", format!("`{owner}`"));
        self.current_phase.set("last_updated", format!("`{date}`"));
    }

    /// The Component Matrix rows.
    pub fn component_rows(&self) -> Vec<ComponentRow> {
        let t = &self.component_matrix.table;
        (0..t.rows.len())
            .map(|i| ComponentRow::from_row(t, i))
            .collect()
    }

    /// Name and parity of every Component Matrix row.
    pub fn components(&self) -> Vec<ComponentSummary> {
        let t = &self.component_matrix.table;
        let has_parity = t.column("Parity").is_some();
        (0..t.rows.len())
            .map(|i| {
                let parity = if has_parity {
                    Some(t.cell(i, "Parity").unwrap_or_default().to_owned())
                } else {
                    None
                };
                ComponentSummary {
                    name: t.cell_plain(i, "Component").unwrap_or_default(),
                    parity_status: parity.as_deref().and_then(|p| plain(p).parse().ok()),
                    parity,
                }
            })
            .collect()
    }

    /// The well-formed ids of a kind in its table, in row order.
    pub fn ids(&self, kind: IdKind) -> Vec<StableId> {
        let section = match kind {
            IdKind::Question => &self.open_questions,
            IdKind::Issue => &self.issues_and_blockers,
            IdKind::EscapeHatch => &self.escape_hatches,
        };
        let t = &section.table;
        (0..t.rows.len())
            .filter_map(|i| t.cell(i, "ID")?.parse::<StableId>().ok())
            .filter(|id| id.kind == kind)
            .collect()
    }

    /// The cross-file half of the `ask_user` rule: every `E###` the hatch
    /// cites must be a row of this file's Escape Hatches table.
    pub fn check_escape_hatch(&self, hatch: &crate::escape_hatch::EscapeHatch) -> Vec<Finding> {
        let rows = self.ids(IdKind::EscapeHatch);
        let cited = hatch.cited_escape_ids();
        let mut out: Vec<Finding> = cited
            .iter()
            .filter(|id| !rows.contains(id))
            .map(|id| {
                Finding::new(
                    0,
                    "escape_hatch.state_snapshot.evidence",
                    format!("cites {id}, which has no row in the Escape Hatches table"),
                )
            })
            .collect();
        if cited.is_empty() {
            out.push(Finding::new(
                0,
                "escape_hatch.state_snapshot.evidence",
                "must cite the E### escape-hatch row recorded in PORT_STATUS.md",
            ));
        }
        out
    }

    /// The next free id of a kind: one past the highest in its table.
    pub fn next_id(&self, kind: IdKind) -> StableId {
        self.ids(kind)
            .into_iter()
            .max()
            .map_or(StableId::new(kind, 1), StableId::next)
    }

    /// Checks a status built in code the same way an imported file is checked.
    pub fn validate(&self) -> Vec<Finding> {
        import(&self.render()).1
    }

    /// Writes the file: title, preamble, the contract's sections in contract
    /// order, each followed by the unknown sections that followed it.
    pub fn render(&self) -> String {
        let mut out: Vec<String> = Vec::new();
        if !self.title.is_empty() {
            out.push(format!("# {}", self.title));
            out.push(String::new());
        }
        if !self.preamble.is_empty() {
            let start = out.len();
            out.extend(self.preamble.iter().cloned());
            balance_fences(&mut out, start);
            out.push(String::new());
        }
        self.render_extras(None, &mut out);
        for id in SectionId::ALL {
            out.push(format!("## {}", id.heading()));
            out.push(String::new());
            let before = out.len();
            match id {
                SectionId::Summary => self.summary.render(&mut out),
                SectionId::CurrentPhase => self.current_phase.render(&mut out),
                SectionId::ConversionState => self.conversion_state.render(&mut out),
                SectionId::HandoffNotes => self.handoff_notes.render(&mut out),
                SectionId::ComponentMatrix => self.component_matrix.render(&mut out),
                SectionId::ParityCommands => self.parity_commands.render(&mut out),
                SectionId::OpenQuestions => self.open_questions.render(&mut out),
                SectionId::IssuesAndBlockers => self.issues_and_blockers.render(&mut out),
                SectionId::EscapeHatches => self.escape_hatches.render(&mut out),
                SectionId::Decisions => self.decisions.render(&mut out),
            }
            if out.len() > before {
                balance_fences(&mut out, before);
                out.push(String::new());
            }
            self.render_extras(Some(id), &mut out);
        }
        while out.last().is_some_and(String::is_empty) {
            out.pop();
        }
        let mut s = out.join("\n");
        s.push('\n');
        s
    }

    fn render_extras(&self, after: Option<SectionId>, out: &mut Vec<String>) {
        for x in self.extra_sections.iter().filter(|x| x.after == after) {
            let start = out.len();
            if let Some((heading, body)) = x.lines.split_first() {
                out.push(heading.clone());
                // the importer trims blank edges; a blank after the heading
                // is layout, as in the known sections
                if !body.is_empty() {
                    out.push(String::new());
                }
                out.extend(body.iter().cloned());
            }
            balance_fences(out, start);
            out.push(String::new());
        }
    }
}

/// `## Heading` (or a bare `##`): the level that splits a status file.
fn is_section_heading(line: &str) -> bool {
    let t = line.trim_end();
    t == "##" || t.starts_with("## ")
}

/// Whether a line opens or closes a fenced block, as the importer sees it.
fn is_fence(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("```") || t.starts_with("~~~")
}

/// Closes a fence left open by verbatim lines from `start` on, so headings
/// rendered after them are still headings when the file is read back.
fn balance_fences(out: &mut Vec<String>, start: usize) {
    if out[start..].iter().filter(|l| is_fence(l)).count() % 2 == 1 {
        out.push("```".to_owned());
    }
}

/// A line of the file with its 1-based number.
type Numbered = (usize, String);

struct RawSection {
    heading_line: usize,
    heading: String,
    body: Vec<Numbered>,
}

fn trim_blank(lines: &[Numbered]) -> &[Numbered] {
    let start = lines.iter().position(|(_, l)| !l.trim().is_empty());
    let Some(start) = start else {
        return &[];
    };
    let end = lines
        .iter()
        .rposition(|(_, l)| !l.trim().is_empty())
        .map_or(start, |e| e + 1);
    &lines[start..end]
}

/// Reads a status file. Never fails: what does not fit is kept verbatim and
/// what is missing is reported.
pub fn import(text: &str) -> (PortStatus, Vec<Finding>) {
    let mut findings = secrets::scan_text(text, 1);
    let mut status = PortStatus {
        title: String::new(),
        preamble: Vec::new(),
        summary: FieldList::default(),
        current_phase: FieldList::default(),
        component_matrix: TableSection::default(),
        conversion_state: FieldList::default(),
        parity_commands: TableSection::default(),
        open_questions: TableSection::default(),
        issues_and_blockers: TableSection::default(),
        escape_hatches: TableSection::default(),
        decisions: TableSection::default(),
        handoff_notes: FieldList::default(),
        extra_sections: Vec::new(),
    };

    // split into the head (before the first `## `) and sections, ignoring
    // headings inside fenced blocks
    let mut head: Vec<Numbered> = Vec::new();
    let mut sections: Vec<RawSection> = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        let no = i + 1;
        if is_fence(line) {
            fenced = !fenced;
        }
        if !fenced && is_section_heading(line) {
            sections.push(RawSection {
                heading_line: no,
                heading: line.trim_end().to_owned(),
                body: Vec::new(),
            });
            continue;
        }
        let entry = (no, line.trim_end().to_owned());
        match sections.last_mut() {
            Some(s) => s.body.push(entry),
            None => head.push(entry),
        }
    }

    let mut title_line = None;
    for (no, l) in trim_blank(&head) {
        if title_line.is_none() && status.preamble.is_empty() && l.starts_with("# ") {
            status.title = l[2..].trim().to_owned();
            title_line = Some(*no);
        } else {
            status.preamble.push(l.clone());
        }
    }
    if title_line.is_none() {
        findings.push(Finding::new(
            1,
            "title",
            "missing `# <Model Family> Port Status` title",
        ));
    }
    // keep the preamble's inner blank lines but not its edges
    while status.preamble.last().is_some_and(|l| l.trim().is_empty()) {
        status.preamble.pop();
    }
    let lead = status
        .preamble
        .iter()
        .take_while(|l| l.trim().is_empty())
        .count();
    status.preamble.drain(..lead);

    let mut seen: Vec<SectionId> = Vec::new();
    let mut last_known: Option<SectionId> = None;
    for raw in sections {
        let id = SectionId::from_heading(raw.heading.get(2..).unwrap_or_default());
        match id {
            Some(id) if !seen.contains(&id) => {
                seen.push(id);
                last_known = Some(id);
                let body = trim_blank(&raw.body);
                read_section(&mut status, id, raw.heading_line, body, &mut findings);
            }
            _ => {
                if let Some(id) = id {
                    findings.push(Finding::new(
                        raw.heading_line,
                        id.heading(),
                        "section appears more than once; the later one is kept verbatim",
                    ));
                }
                let mut lines = vec![raw.heading];
                lines.extend(trim_blank(&raw.body).iter().map(|(_, l)| l.clone()));
                // a repeated known section stays right after the first one, so
                // a re-import still meets the first one first
                status.extra_sections.push(ExtraSection {
                    after: id.or(last_known),
                    lines,
                });
            }
        }
    }

    for id in SectionId::ALL {
        if !seen.contains(&id) {
            findings.push(Finding::new(
                0,
                id.heading(),
                format!("missing required section `## {}`", id.heading()),
            ));
            // a status built from this import renders the section the
            // contract requires, empty, instead of dropping it
            fill_missing(&mut status, id);
        }
    }
    // by line, keeping contract order among the whole-file findings
    secrets::redact_findings(&mut findings);
    findings.sort_by_key(|f| f.line);
    findings.dedup();
    (status, findings)
}

fn fill_missing(status: &mut PortStatus, id: SectionId) {
    match id {
        SectionId::Summary => status.summary = FieldList::with_keys(&SUMMARY_KEYS),
        SectionId::CurrentPhase => status.current_phase = FieldList::with_keys(&CURRENT_PHASE_KEYS),
        SectionId::ConversionState => {
            status.conversion_state = FieldList::with_keys(&CONVERSION_STATE_KEYS);
        }
        SectionId::HandoffNotes => status.handoff_notes = FieldList::default(),
        table => {
            if let Some(t) = status.table_mut(table) {
                *t = TableSection::new(table.columns());
            }
        }
    }
}

fn read_section(
    status: &mut PortStatus,
    id: SectionId,
    heading_line: usize,
    body: &[Numbered],
    findings: &mut Vec<Finding>,
) {
    match id {
        SectionId::Summary
        | SectionId::CurrentPhase
        | SectionId::ConversionState
        | SectionId::HandoffNotes => {
            let list = read_fields(body, findings, id);
            check_fields(&list, id, heading_line, findings);
            match id {
                SectionId::Summary => status.summary = list,
                SectionId::CurrentPhase => status.current_phase = list,
                SectionId::ConversionState => status.conversion_state = list,
                _ => status.handoff_notes = list,
            }
        }
        table => {
            let section = read_table_section(body, id, heading_line, findings);
            if let Some(t) = status.table_mut(table) {
                *t = section;
            }
        }
    }
}

fn read_fields(body: &[Numbered], findings: &mut Vec<Finding>, id: SectionId) -> FieldList {
    let mut list = FieldList::default();
    for (no, l) in body {
        let line = match l.strip_prefix("- ") {
            Some(rest) => match split_key(rest.trim()) {
                Some((key, value)) if id != SectionId::HandoffNotes => FieldLine::Field {
                    key: key.to_owned(),
                    value: value.to_owned(),
                },
                _ => FieldLine::Bullet(rest.trim().to_owned()),
            },
            None => FieldLine::Verbatim(l.clone()),
        };
        let value = match &line {
            FieldLine::Field { value, .. } => Some(value.as_str()),
            FieldLine::Bullet(b) => Some(b.as_str()),
            FieldLine::Verbatim(_) => None,
        };
        if value.is_some_and(is_placeholder) {
            let field = match &line {
                FieldLine::Field { key, .. } => key.clone(),
                _ => id.heading().to_owned(),
            };
            findings.push(Finding::new(
                *no,
                field,
                "placeholder copied from the template; fill in the value",
            ));
        }
        list.lines.push(line);
    }
    list
}

fn check_fields(list: &FieldList, id: SectionId, heading_line: usize, findings: &mut Vec<Finding>) {
    for key in id.required_keys() {
        match list.get(key) {
            None => findings.push(Finding::new(heading_line, *key, "missing required field")),
            Some(v) if plain(v).is_empty() => {
                findings.push(Finding::new(heading_line, *key, "missing value"));
            }
            Some(_) => {}
        }
    }
    if id == SectionId::CurrentPhase {
        if let Some(s) = list.get_plain("status")
            && s.parse::<PhaseStatus>().is_err()
        {
            findings.push(Finding::new(
                heading_line,
                "status",
                format!("invalid value; expected one of {}", PhaseStatus::expected()),
            ));
        }
        if let Some(o) = list.get_plain("owner")
            && !valid_owner(&o)
        {
            findings.push(Finding::new(
                heading_line,
                "owner",
                "invalid value; expected one of orchestrator | prep | parity | conversion | component:<name> | pipeline",
            ));
        }
    }
}

fn valid_owner(owner: &str) -> bool {
    matches!(
        owner,
        "orchestrator" | "prep" | "parity" | "conversion" | "pipeline"
    ) || owner
        .strip_prefix("component:")
        .is_some_and(|n| !n.trim().is_empty())
}

fn read_table_section(
    body: &[Numbered],
    id: SectionId,
    heading_line: usize,
    findings: &mut Vec<Finding>,
) -> TableSection {
    // A table inside a code fence is an example, not the section's table
    // (found by fvd-fuzz: read as the table, it left the fence around it).
    let mut fenced = false;
    let start = (0..body.len()).find(|&i| {
        if is_fence(&body[i].1) {
            fenced = !fenced;
        }
        !fenced
            && body[i].1.trim_start().starts_with('|')
            && body.get(i + 1).is_some_and(|(_, l)| is_separator(l))
    });
    let Some(start) = start else {
        findings.push(Finding::new(
            heading_line,
            id.heading(),
            format!("missing table with columns: {}", id.columns().join(" | ")),
        ));
        return TableSection {
            before: body.iter().map(|(_, l)| l.clone()).collect(),
            table: Table::new(id.columns()),
            after: Vec::new(),
        };
    };
    let header_line = body[start].0;
    let header = split_row(&body[start].1);
    let mut end = start + 2;
    let mut rows = Vec::new();
    let mut row_lines = Vec::new();
    while let Some((no, l)) = body.get(end) {
        if !l.trim_start().starts_with('|') {
            break;
        }
        rows.push(split_row(l));
        row_lines.push(*no);
        end += 1;
    }
    let table = Table { header, rows };
    let before = trim_blank(&body[..start])
        .iter()
        .map(|(_, l)| l.clone())
        .collect();
    let after = trim_blank(&body[end..])
        .iter()
        .map(|(_, l)| l.clone())
        .collect();

    for col in id.columns() {
        if table.column(col).is_none() {
            findings.push(Finding::new(
                header_line,
                id.heading(),
                format!("missing column `{col}`"),
            ));
        }
    }
    for (i, row) in table.rows.iter().enumerate() {
        for cell in row {
            if is_placeholder(cell) {
                findings.push(Finding::new(
                    row_lines[i],
                    id.heading(),
                    "placeholder copied from the template; fill in the value",
                ));
                break;
            }
        }
    }
    if let Some(kind) = id.id_kind() {
        let mut ids: Vec<StableId> = Vec::new();
        for (i, _) in table.rows.iter().enumerate() {
            let cell = table.cell(i, "ID").unwrap_or_default();
            match cell.parse::<StableId>() {
                Ok(sid) if sid.kind == kind => {
                    if ids.contains(&sid) {
                        findings.push(Finding::new(
                            row_lines[i],
                            "ID",
                            format!("{sid} is used by more than one row; ids are stable and never reused"),
                        ));
                    }
                    ids.push(sid);
                }
                _ => findings.push(Finding::new(
                    row_lines[i],
                    "ID",
                    format!(
                        "invalid id in {}; expected {}### (three or more digits)",
                        id.heading(),
                        kind.prefix()
                    ),
                )),
            }
        }
    }
    TableSection {
        before,
        table,
        after,
    }
}
