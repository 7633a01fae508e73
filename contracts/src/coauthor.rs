//! fvd as co-author of a `PORT_STATUS.md` the porter keeps.
//!
//! The file is the porter's log of weeks of evidence. fvd changes only what
//! it owns and leaves every other byte as written ([`crate::status_doc`]):
//!
//! - for a component whose run *tested* the code ([`Outcome::tests_the_code`]):
//!   the Parity cell of its Component Matrix row, the Last Result cell of
//!   its Parity Commands row and one evidence segment at the end of that
//!   row's Notes cell (`[fvd DATE run N on W: VERDICT — REASON]`), replaced
//!   only by fvd's next segment and only when the evidence changed;
//! - the matrix Open Issues cell, only to add or remove the ids of issue
//!   rows fvd created; those rows' Status and Resolution;
//! - the Escape Hatches rows of the `E###` ids fvd gave;
//! - Current Phase: forward moves, `blocked` at P6, and the move back on a
//!   regression (with a bullet saying why, and a line after the final
//!   handoff block saying it is superseded), undone when the regression
//!   passes again.
//!
//! A run that did not test the code (an environment failure, a cancel, an
//! infrastructure error, no run) changes nothing. Rows fvd does not find are
//! added; nothing is deleted, reordered or renamed.

use crate::ids::{IdKind, StableId};
use crate::phase::Phase;
use crate::port_status::{EscapeHatchRow, PortStatus, SectionId, plain};
use crate::status_doc::{Section, StatusDoc, TableAt, is_fence};
use crate::status_match::{self, Identity};

/// What a run says about the code, for the status file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    /// A numeric failure (`debug_red`).
    Red,
    /// Only skips (`scaffold_skip`).
    Skip,
    /// The test errored before a verdict (collection, setup, crash).
    Error,
    Timeout,
    /// The run says nothing about the code.
    Untested,
}

impl Outcome {
    /// The one list of which recorded verdicts tested the code. Everything
    /// not named as testing here (`environment`, `cancelled`,
    /// `infra_error`, `cleanup_refused`, an empty verdict, fvd's own
    /// failures to start a run, verdicts added later) does not.
    /// `reason` is the component's recorded reason: an `error` verdict
    /// tests only when it carries a classified `error:<kind>` other than
    /// `cancelled`.
    pub fn of(verdict: &str, reason: &str) -> Outcome {
        match verdict {
            "non_skip_pass" => Outcome::Pass,
            "debug_red" => Outcome::Red,
            "scaffold_skip" => Outcome::Skip,
            "timeout" => Outcome::Timeout,
            "error" => {
                let detail = reason.trim_start();
                let detail = detail.strip_prefix("error: ").unwrap_or(detail);
                match detail.strip_prefix("error:") {
                    Some(kind) if !kind.starts_with("cancelled") => Outcome::Error,
                    _ => Outcome::Untested,
                }
            }
            // Named so that a reader sees they were decided, not forgotten.
            "environment" | "cancelled" | "infra_error" | "cleanup_refused" => Outcome::Untested,
            _ => Outcome::Untested,
        }
    }

    pub fn tests_the_code(self) -> bool {
        self != Outcome::Untested
    }

    /// The Parity cell of a component whose file records no pass.
    fn parity_cell(self, verdict: &str) -> String {
        match self {
            Outcome::Pass => "`non_skip_pass`".into(),
            Outcome::Red => "`debug_red`".into(),
            Outcome::Skip => "`scaffold_skip`".into(),
            Outcome::Error | Outcome::Timeout => "`blocked`".into(),
            Outcome::Untested => format!("`{verdict}`"),
        }
    }
}

/// Whether a recorded verdict (and the component's reason) tested the code.
pub fn tests_the_code(verdict: &str, reason: &str) -> bool {
    Outcome::of(verdict, reason).tests_the_code()
}

/// Whether a Parity or Last Result cell records a pass: `non_skip_pass`,
/// `pass`, `*_pass`, `PASS (A40, …)`, `N passed`, `N_passed_0_skipped`;
/// not `N_passed_M_skipped` with M > 0, nor anything that names a failure,
/// a red run, a skip, an error or a block.
pub fn reads_as_pass(cell: &str) -> bool {
    let t = cell
        .to_lowercase()
        .replace("non_skip", "nonskip")
        .replace("non-skip", "nonskip");
    let tokens: Vec<&str> = t
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let mut pass = false;
    for (i, w) in tokens.iter().enumerate() {
        let counted_zero = i > 0 && tokens[i - 1] == "0";
        match *w {
            "pass" | "passed" | "passes" | "passing" | "nonskip" => pass = true,
            "fail" | "failed" | "fails" | "failing" | "failure" | "failures" | "skip"
            | "skipped" | "skips" | "error" | "errors" | "errored" | "xfail" | "xfailed"
            | "xpass"
                if !counted_zero =>
            {
                return false;
            }
            "red" | "blocked" | "blocker" | "scaffold" | "regression" | "pending" | "todo"
            | "not" | "unknown" => return false,
            _ => {}
        }
    }
    pass
}

/// The run fvd recorded for a component.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Run {
    /// `non_skip_pass`, `debug_red`, … as stored.
    pub verdict: String,
    /// The component's one-line reason as stored.
    pub reason: String,
    pub run_no: u32,
    /// The worker it ran on; empty when unknown.
    pub worker: String,
    /// The run's hypothesis variants in one line (`eps_fix passes, fp32
    /// same`); empty when it had none.
    pub variants: String,
    /// Who submitted the port (a credential's name, `… on W for NAME`);
    /// empty when no credential was checked.
    pub by: String,
}

/// A spec component and what fvd recorded for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComponentInput {
    pub name: String,
    pub aliases: Vec<String>,
    pub component_type: String,
    pub parity_tests: Vec<String>,
    /// The command as fvd shows it (no `--junitxml`).
    pub command: String,
    /// The final run; `None` while it has none (pending, running, waiting
    /// for an answer).
    pub run: Option<Run>,
}

impl ComponentInput {
    fn identity(&self) -> Identity<'_> {
        Identity {
            name: &self.name,
            aliases: &self.aliases,
            parity_tests: &self.parity_tests,
        }
    }

    fn outcome(&self) -> Outcome {
        self.run
            .as_ref()
            .map_or(Outcome::Untested, |r| Outcome::of(&r.verdict, &r.reason))
    }
}

/// Everything fvd writes into a status file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Input {
    /// Today, `YYYY-MM-DD`.
    pub date: String,
    pub components: Vec<ComponentInput>,
    /// The escape-hatch rows of the questions agents asked, by fvd's ids.
    pub escapes: Vec<EscapeHatchRow>,
}

/// The rows a component matches, as `fvd submit --dry-run` prints them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowMatch {
    /// 1-based line and Component cell of its matrix row.
    pub matrix: Option<(usize, String)>,
    /// 1-based line and Scope cell of its Parity Commands row.
    pub parity: Option<(usize, String)>,
}

/// Which rows of `text` each component matches.
pub fn row_matches(text: &str, components: &[ComponentInput]) -> Vec<RowMatch> {
    let doc = StatusDoc::parse(text);
    let m = match_rows(&doc, components);
    let at = |t: &Option<TableAt>, row: Option<usize>, col: &str| {
        let t = t.as_ref()?;
        let line = t.rows.start + row?;
        let label = t
            .column(col)
            .and_then(|c| doc.cell(line, c))
            .unwrap_or_default();
        Some((line + 1, label))
    };
    let mt = doc.table(SectionId::ComponentMatrix);
    let pt = doc.table(SectionId::ParityCommands);
    m.iter()
        .map(|(mr, pr)| RowMatch {
            matrix: at(&mt, *mr, "Component"),
            parity: at(&pt, *pr, "Scope"),
        })
        .collect()
}

/// Matrix and Parity Commands row indices (within their tables) per component.
fn match_rows(
    doc: &StatusDoc,
    components: &[ComponentInput],
) -> Vec<(Option<usize>, Option<usize>)> {
    let ids: Vec<Identity<'_>> = components.iter().map(ComponentInput::identity).collect();
    let matrix = doc.table(SectionId::ComponentMatrix);
    let m = match &matrix {
        Some(t) => {
            let col = t.column("Component").unwrap_or(0);
            let labels: Vec<String> = t
                .rows
                .clone()
                .map(|l| doc.cell(l, col).unwrap_or_default())
                .collect();
            status_match::assign(ids.len(), labels.len(), |c, r| {
                status_match::match_label(&labels[r], &ids[c])
            })
        }
        None => vec![None; ids.len()],
    };
    let commands = doc.table(SectionId::ParityCommands);
    let p = match &commands {
        Some(t) => {
            let scope = t.column("Scope");
            let cmd = t.column("Command");
            let rows: Vec<(String, String)> = t
                .rows
                .clone()
                .map(|l| {
                    (
                        scope.and_then(|c| doc.cell(l, c)).unwrap_or_default(),
                        cmd.and_then(|c| doc.cell(l, c)).unwrap_or_default(),
                    )
                })
                .collect();
            status_match::assign(ids.len(), rows.len(), |c, r| {
                status_match::match_command_row(&rows[r].0, &rows[r].1, &ids[c])
            })
        }
        None => vec![None; ids.len()],
    };
    m.into_iter().zip(p).collect()
}

/// A new status file: the contract skeleton (`status` with its summary,
/// phase and conversion state filled in) with a row for every component.
pub fn create(status: &PortStatus, input: &Input) -> String {
    Patcher::new(&status.render(), input, true).run()
}

/// `existing` with fvd's evidence written into the cells it owns; every
/// other byte as it was. Unchanged when nothing tested the code, when the
/// evidence is what the file already says, or when there is nothing to say.
pub fn patch(existing: &str, input: &Input) -> String {
    Patcher::new(existing, input, false).run()
}

/// Table cells hold one line and no unescaped pipe; long text is cut.
pub fn one_line(s: &str) -> String {
    let mut out: String = s
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|");
    if out.chars().count() > 240 {
        out = out.chars().take(239).collect::<String>() + "…";
    }
    out
}

const MARK: &str = "[fvd ";
const REGRESSED: &str = "`debug_red` (regression; recorded ";
const COMMAND_TAG: &str = "; command `";
const VARIANTS_TAG: &str = "; variants: ";
const MOVED_BACK: &str = "moved back from phase: ";
const SUPERSEDED: &str = "the final handoff above is superseded";

/// One piece of fvd evidence, as written into a Notes or Evidence cell.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Segment {
    outcome: String,
    regression: bool,
    reason: String,
}

/// Where fvd's segment starts in a cell: its last `[fvd YYYY-` marker.
fn segment_start(cell: &str) -> Option<usize> {
    cell.match_indices(MARK)
        .map(|(i, _)| i)
        .filter(|&i| {
            cell[i + MARK.len()..]
                .chars()
                .take(4)
                .filter(char::is_ascii_digit)
                .count()
                == 4
        })
        .last()
}

/// The part of a segment that is evidence (after `…on W: `): what a later
/// write compares to decide whether the evidence changed.
fn segment_key(segment: &str) -> &str {
    segment.split_once(": ").map_or(segment, |(_, k)| k)
}

fn parse_segment(cell: &str) -> Option<Segment> {
    let s = &cell[segment_start(cell)?..];
    let body = segment_key(s).trim_end().strip_suffix(']')?;
    let body = match body.rfind(COMMAND_TAG) {
        Some(i) => &body[..i],
        None => body,
    };
    let body = match body.rfind(VARIANTS_TAG) {
        Some(i) => &body[..i],
        None => body,
    };
    let (outcome, reason) = body.split_once(" — ").unwrap_or((body, ""));
    let (outcome, regression) = match outcome.strip_suffix(" (regression)") {
        Some(o) => (o, true),
        None => (outcome, false),
    };
    Some(Segment {
        outcome: outcome.trim().to_owned(),
        regression,
        reason: reason.trim().to_owned(),
    })
}

/// The recorded value a regression cell keeps: `` `debug_red` (regression;
/// recorded X) `` gives `X`.
fn regressed_from(cell: &str) -> Option<&str> {
    cell.trim().strip_prefix(REGRESSED)?.strip_suffix(')')
}

/// The cause of an issue: the component, the verdict and the reason with
/// digits folded, so one failing assertion is one cause.
fn cause(component: &str, outcome: &str, reason: &str) -> String {
    let mut folded = String::new();
    for c in reason.to_lowercase().chars() {
        if c.is_ascii_digit() {
            if !folded.ends_with('#') {
                folded.push('#');
            }
        } else {
            folded.push(c);
        }
    }
    let reason = folded;
    format!(
        "{}\u{1f}{outcome}\u{1f}{}",
        status_match::normalise_label(component),
        reason.split_whitespace().collect::<Vec<_>>().join(" ")
    )
}

/// What fvd writes into a Parity or Last Result cell holding `old` after a
/// run with `outcome` (`recorded`: the file records a pass): `None` leaves
/// the cell as it is, an empty text asks for the outcome's own cell.
fn owned_cell(outcome: Outcome, recorded: bool, old: &str) -> Option<String> {
    match outcome {
        Outcome::Pass => Some(match regressed_from(old) {
            Some(orig) => orig.to_owned(),
            None if reads_as_pass(old) => old.to_owned(),
            None => "`non_skip_pass`".to_owned(),
        }),
        Outcome::Red if recorded => Some(if regressed_from(old).is_some() {
            old.to_owned()
        } else if reads_as_pass(old) {
            format!("{REGRESSED}{old})")
        } else {
            "`debug_red`".to_owned()
        }),
        // a recorded pass stays; only the evidence says what fvd saw
        _ if recorded => None,
        _ => Some(String::new()),
    }
}

/// An issue row fvd created (its Evidence starts with fvd's marker).
#[derive(Debug, Clone)]
struct FvdIssue {
    row: usize,
    id: String,
    component: String,
    open: bool,
    regression: bool,
    cause: String,
}

struct Patcher<'a> {
    doc: StatusDoc,
    input: &'a Input,
    /// A created file lists every component, tested or not.
    created: bool,
    /// (component, issue id) of regressions found by this write.
    regressions: Vec<(String, String)>,
    /// Whether this write resolved a regression row.
    recovered: bool,
}

impl<'a> Patcher<'a> {
    fn new(text: &str, input: &'a Input, created: bool) -> Self {
        Self {
            doc: StatusDoc::parse(text),
            input,
            created,
            regressions: Vec::new(),
            recovered: false,
        }
    }

    fn run(mut self) -> String {
        let matches = match_rows(&self.doc, &self.input.components);
        // What the file records before fvd writes anything, per component:
        // (records a pass, shows a regression fvd wrote).
        let recorded: Vec<(bool, bool)> = self
            .input
            .components
            .iter()
            .zip(&matches)
            .map(|(_, (m, p))| self.recorded(*m, *p))
            .collect();
        let mut tested_any = false;
        for (k, c) in self.input.components.iter().enumerate() {
            let outcome = c.outcome();
            if outcome.tests_the_code() {
                tested_any = true;
                self.component(c, outcome, matches[k], recorded[k]);
            } else if self.created {
                self.listed(c, matches[k]);
            }
        }
        self.phase(tested_any, &recorded);
        self.escapes();
        self.doc.render()
    }

    fn matrix(&self) -> Option<TableAt> {
        self.doc.table(SectionId::ComponentMatrix)
    }

    fn commands(&self) -> Option<TableAt> {
        self.doc.table(SectionId::ParityCommands)
    }

    fn cell_of(&self, t: &Option<TableAt>, row: Option<usize>, col: &str) -> Option<String> {
        let t = t.as_ref()?;
        self.doc.cell(t.rows.start + row?, t.column(col)?)
    }

    fn recorded(&self, m: Option<usize>, p: Option<usize>) -> (bool, bool) {
        let parity = self
            .cell_of(&self.matrix(), m, "Parity")
            .unwrap_or_default();
        let last = self
            .cell_of(&self.commands(), p, "Last Result")
            .unwrap_or_default();
        let regressed = regressed_from(&parity).is_some() || regressed_from(&last).is_some();
        let pass = regressed || reads_as_pass(&parity) || reads_as_pass(&last);
        (pass, regressed)
    }

    /// Sets cell `col` of row `row` of the table of `id`, when both exist.
    fn set(&mut self, id: SectionId, row: usize, col: &str, text: &str) {
        if let Some(t) = self.doc.table(id)
            && let Some(c) = t.column(col)
            && t.rows.start + row < t.rows.end
        {
            self.doc.set_cell(t.rows.start + row, c, text);
        }
    }

    fn get(&self, id: SectionId, row: usize, col: &str) -> Option<String> {
        let t = self.doc.table(id)?;
        (t.rows.start + row < t.rows.end)
            .then(|| self.doc.cell(t.rows.start + row, t.column(col)?))
            .flatten()
    }

    /// A tested component: its cells, its issues and its evidence.
    fn component(
        &mut self,
        c: &ComponentInput,
        outcome: Outcome,
        (m, p): (Option<usize>, Option<usize>),
        (recorded, _): (bool, bool),
    ) {
        let Some(run) = c.run.as_ref() else {
            return;
        };
        let verdict = run.verdict.as_str();
        let old_parity = m.and_then(|r| self.get(SectionId::ComponentMatrix, r, "Parity"));
        let old_last = p.and_then(|r| self.get(SectionId::ParityCommands, r, "Last Result"));
        let regression = outcome == Outcome::Red && recorded;
        // The owned cells.
        let owned = |old: Option<&str>| owned_cell(outcome, recorded, old.unwrap_or_default());
        let parity = owned(old_parity.as_deref()).map(|v| {
            if v.is_empty() {
                outcome.parity_cell(verdict)
            } else {
                v
            }
        });
        let last = owned(old_last.as_deref()).map(|v| {
            if v.is_empty() {
                format!("`{verdict}`")
            } else {
                v
            }
        });

        // Issues first: the matrix row lists their ids.
        let reason = evidence_reason(run);
        let segment = self.segment(run, regression, &reason, None);
        let mine: Vec<FvdIssue> = self
            .fvd_issues()
            .into_iter()
            .filter(|i| i.component == status_match::normalise_label(&c.name))
            .collect();
        match outcome {
            Outcome::Pass => self.resolve_passed(run, &mine),
            Outcome::Red if recorded && !mine.iter().any(|i| i.open && i.regression) => {
                let old = [old_parity.as_deref(), old_last.as_deref()];
                self.add_regression(c, old, &segment);
            }
            _ if recorded => {}
            _ => self.add_blocker(c, run, outcome, &reason, &segment, &mine),
        }

        self.matrix_row(c, m, parity, outcome.parity_cell(verdict));
        self.command_row(c, run, p, last, regression, &reason);
    }

    /// A pass resolves fvd's open issues about the component.
    fn resolve_passed(&mut self, run: &Run, mine: &[FvdIssue]) {
        let why = format!("passed in fvd run {} on {}", run.run_no, self.input.date);
        for i in mine.iter().filter(|i| i.open) {
            self.resolve(i.row, &why);
            self.recovered |= i.regression;
        }
    }

    /// A red run where the file records a pass (`old`: the Parity and Last
    /// Result cells): a regression issue, once.
    fn add_regression(&mut self, c: &ComponentInput, old: [Option<&str>; 2], segment: &str) {
        let was = old
            .into_iter()
            .flatten()
            .map(|o| regressed_from(o).unwrap_or(o))
            .find(|o| reads_as_pass(o))
            .unwrap_or("a pass")
            .to_owned();
        let issue = format!(
            "regression: `debug_red` where this file records {}",
            one_line(&was)
        );
        if let Some(id) = self.add_issue(c, "high", &issue, segment) {
            self.regressions.push((c.name.clone(), id));
        }
    }

    /// A run that tested the code without a pass: one blocker issue per
    /// cause (an open one with the same cause is kept, none is added while
    /// people keep an open row about the component), and fvd's older
    /// causes for the component are superseded.
    fn add_blocker(
        &mut self,
        c: &ComponentInput,
        run: &Run,
        outcome: Outcome,
        reason: &str,
        segment: &str,
        mine: &[FvdIssue],
    ) {
        let verdict = run.verdict.as_str();
        let key = cause(&c.name, verdict, reason);
        let same = mine
            .iter()
            .find(|i| i.open && !i.regression && i.cause == key)
            .map(|i| i.id.clone());
        let id = match same {
            Some(id) => Some(id),
            // an open row people keep about this component tracks it
            None if !self.people_open(c).is_empty() => None,
            None => {
                let what = match outcome {
                    Outcome::Red => "the parity test fails numerically",
                    Outcome::Skip => "the parity test only skips",
                    Outcome::Timeout => "the parity test runs past its timeout",
                    _ => "the parity test errors before a verdict",
                };
                self.add_issue(c, "blocker", &format!("`{verdict}`: {what}"), segment)
            }
        };
        if let Some(id) = id {
            // fvd's older causes for this component are superseded
            let why = format!(
                "superseded by {id} (fvd run {} on {})",
                run.run_no, self.input.date
            );
            for i in mine
                .iter()
                .filter(|i| i.open && !i.regression && i.id != id)
            {
                self.resolve(i.row, &why);
            }
        }
    }

    /// The matrix row (`m`, or a new one): its Parity cell when fvd owns it
    /// (`parity`; `fallback` in a row fvd adds), and its Open Issues listing
    /// fvd's open rows about the component and none of fvd's resolved ones.
    fn matrix_row(
        &mut self,
        c: &ComponentInput,
        m: Option<usize>,
        parity: Option<String>,
        fallback: String,
    ) {
        let name = status_match::normalise_label(&c.name);
        let (open_ids, closed_ids): (Vec<FvdIssue>, Vec<FvdIssue>) = self
            .fvd_issues()
            .into_iter()
            .filter(|i| i.component == name)
            .partition(|i| i.open);
        let ids = |v: Vec<FvdIssue>| v.into_iter().map(|i| i.id).collect::<Vec<_>>();
        let (opened, closed) = (ids(open_ids), ids(closed_ids));
        match m {
            Some(r) => {
                if let Some(v) = &parity {
                    self.set(SectionId::ComponentMatrix, r, "Parity", v);
                }
                self.sync_open_issues(r, &opened, &closed);
            }
            None => {
                let parity = parity.unwrap_or(fallback);
                // a row fvd adds lists every open issue about the component
                let mut opened = opened.clone();
                opened.extend(self.people_open(c));
                let open = if opened.is_empty() {
                    "none".to_owned()
                } else {
                    opened.join(", ")
                };
                self.add_matrix_row(c, &parity, &open);
            }
        }
    }

    /// The Parity Commands row (`p`, or a new one): its Last Result when fvd
    /// owns it, and fvd's evidence segment at the end of its Notes.
    fn command_row(
        &mut self,
        c: &ComponentInput,
        run: &Run,
        p: Option<usize>,
        last: Option<String>,
        regression: bool,
        reason: &str,
    ) {
        match p {
            Some(r) => {
                if let Some(v) = &last {
                    self.set(SectionId::ParityCommands, r, "Last Result", v);
                }
                let command = self
                    .get(SectionId::ParityCommands, r, "Command")
                    .unwrap_or_default();
                let ran = (!same_command(&command, &c.command)).then_some(c.command.as_str());
                let segment = self.segment(run, regression, reason, ran);
                let notes = self.get(SectionId::ParityCommands, r, "Notes");
                let scope = self
                    .get(SectionId::ParityCommands, r, "Scope")
                    .unwrap_or_default();
                if let Some(notes) = notes {
                    // a row an older fvd wrote (`component:X`, `run N of M; …`)
                    // holds no human note
                    let legacy = plain(&scope).starts_with("component:") && is_legacy_note(&notes);
                    let new = with_segment(if legacy { "" } else { &notes }, &segment);
                    self.set(SectionId::ParityCommands, r, "Notes", &new);
                }
            }
            None => {
                let last = last.unwrap_or_else(|| format!("`{}`", run.verdict));
                // the command goes into the segment only where no Command
                // cell holds it
                let has_command = self
                    .commands()
                    .is_none_or(|t| t.column("Command").is_some());
                let ran = (!has_command).then_some(c.command.as_str());
                let segment = self.segment(run, regression, reason, ran);
                self.add_command_row(c, &last, &segment);
            }
        }
    }

    /// A component of a created file that did not test: listed, nothing more.
    fn listed(&mut self, c: &ComponentInput, (m, p): (Option<usize>, Option<usize>)) {
        if m.is_none() {
            self.add_matrix_row(c, "`not_started`", "none");
        }
        if p.is_none() {
            self.add_command_row(c, "`not_run`", "");
        }
    }

    fn segment(&self, run: &Run, regression: bool, reason: &str, command: Option<&str>) -> String {
        let mut s = format!("{MARK}{} run {}", self.input.date, run.run_no);
        if !run.worker.is_empty() {
            s.push_str(&format!(" on {}", one_line(&run.worker)));
        }
        if !run.by.is_empty() {
            s.push_str(&format!(" for {}", one_line(&run.by)));
        }
        s.push_str(&format!(": {}", run.verdict));
        if regression {
            s.push_str(" (regression)");
        }
        if !reason.is_empty() {
            s.push_str(&format!(" — {reason}"));
        }
        if !run.variants.is_empty() {
            s.push_str(&format!("{VARIANTS_TAG}{}", one_line(&run.variants)));
        }
        if let Some(cmd) = command {
            s.push_str(&format!(
                "{COMMAND_TAG}{}`",
                one_line(cmd).replace('`', "'")
            ));
        }
        s.push(']');
        s
    }

    fn fvd_issues(&self) -> Vec<FvdIssue> {
        let Some(t) = self.doc.table(SectionId::IssuesAndBlockers) else {
            return Vec::new();
        };
        let col = |n: &str| t.column(n);
        let (Some(ev), Some(id), Some(comp)) = (col("Evidence"), col("ID"), col("Component"))
        else {
            return Vec::new();
        };
        let status = col("Status");
        t.rows
            .clone()
            .enumerate()
            .filter_map(|(k, line)| {
                let evidence = self.doc.cell(line, ev)?;
                let issue = t.column("Issue").and_then(|c| self.doc.cell(line, c));
                let component = status_match::normalise_label(&self.doc.cell(line, comp)?);
                let seg = if evidence.starts_with(MARK) {
                    parse_segment(&evidence)?
                } else if is_legacy_issue(issue.as_deref().unwrap_or_default()) {
                    // an older fvd's row: `component X is blocked`, the
                    // evidence `verdict: reason`
                    let (outcome, reason) = evidence.split_once(':')?;
                    Segment {
                        outcome: outcome.trim().to_owned(),
                        regression: false,
                        reason: reason.trim().to_owned(),
                    }
                } else {
                    return None;
                };
                let open = status
                    .and_then(|s| self.doc.cell(line, s))
                    .is_none_or(|s| plain(&s).eq_ignore_ascii_case("open"));
                Some(FvdIssue {
                    row: k,
                    id: plain(&self.doc.cell(line, id)?),
                    cause: cause(&component, &seg.outcome, &seg.reason),
                    component,
                    open,
                    regression: seg.regression,
                })
            })
            .collect()
    }

    /// The ids of open issue rows fvd did not write that name this component.
    fn people_open(&self, c: &ComponentInput) -> Vec<String> {
        let Some(t) = self.doc.table(SectionId::IssuesAndBlockers) else {
            return Vec::new();
        };
        let fvd: Vec<usize> = self.fvd_issues().iter().map(|i| i.row).collect();
        let (Some(comp), Some(id)) = (t.column("Component"), t.column("ID")) else {
            return Vec::new();
        };
        let status = t.column("Status");
        t.rows
            .clone()
            .enumerate()
            .filter(|(k, line)| {
                !fvd.contains(k)
                    && self
                        .doc
                        .cell(*line, comp)
                        .is_some_and(|v| status_match::match_label(&v, &c.identity()).is_some())
                    && status
                        .and_then(|s| self.doc.cell(*line, s))
                        .is_some_and(|s| plain(&s).eq_ignore_ascii_case("open"))
            })
            .filter_map(|(_, line)| self.doc.cell(line, id).map(|v| plain(&v)))
            .collect()
    }

    fn resolve(&mut self, row: usize, why: &str) {
        self.set(SectionId::IssuesAndBlockers, row, "Status", "resolved");
        self.set(
            SectionId::IssuesAndBlockers,
            row,
            "Resolution",
            &one_line(why),
        );
    }

    fn add_issue(
        &mut self,
        c: &ComponentInput,
        severity: &str,
        issue: &str,
        evidence: &str,
    ) -> Option<String> {
        let t = self.ensure_table(SectionId::IssuesAndBlockers)?;
        let next = (t.rows.clone())
            .filter_map(|l| {
                self.doc
                    .cell(l, t.column("ID")?)
                    .and_then(|v| plain(&v).parse::<StableId>().ok())
            })
            .filter(|id| id.kind == IdKind::Issue)
            .max()
            .map_or(StableId::new(IdKind::Issue, 1), StableId::next)
            .to_string();
        let cells = [
            ("ID", next.clone()),
            ("Phase", Phase::ComponentParityDebug.id()),
            ("Component", c.name.clone()),
            ("Severity", severity.to_owned()),
            ("Issue", one_line(issue)),
            ("Evidence", evidence.to_owned()),
            ("Owner", format!("component:{}", c.name)),
            ("Status", "open".to_owned()),
            ("Resolution", String::new()),
        ];
        self.append_row(SectionId::IssuesAndBlockers, &cells);
        Some(next)
    }

    fn add_matrix_row(&mut self, c: &ComponentInput, parity: &str, open: &str) {
        let unknown = || "`unknown`".to_owned();
        let cells = [
            ("Component", format!("`{}`", c.name)),
            ("Type", format!("`{}`", c.component_type)),
            ("Reuse/Port", unknown()),
            ("Official Definition", unknown()),
            ("Official Instantiation", unknown()),
            ("FastVideo Target", unknown()),
            ("Prototype", unknown()),
            ("Conversion", unknown()),
            ("Parity", parity.to_owned()),
            ("Open Issues", open.to_owned()),
        ];
        self.append_row(SectionId::ComponentMatrix, &cells);
    }

    fn add_command_row(&mut self, c: &ComponentInput, last: &str, notes: &str) {
        let cells = [
            ("Scope", c.name.clone()),
            (
                "Command",
                format!("`{}`", one_line(&c.command).replace('`', "'")),
            ),
            ("Last Result", last.to_owned()),
            ("Notes", notes.to_owned()),
        ];
        self.append_row(SectionId::ParityCommands, &cells);
    }

    /// Appends a row to the table of `id`, its cells placed by column name.
    fn append_row(&mut self, id: SectionId, cells: &[(&str, String)]) {
        let Some(t) = self.ensure_table(id) else {
            return;
        };
        let mut row = vec![String::new(); t.header.len()];
        for (name, value) in cells {
            if let Some(i) = t.column(name) {
                row[i] = value.clone();
            }
        }
        let line = format!(
            "|{}",
            row.iter()
                .map(|c| if c.is_empty() {
                    "  |".to_owned()
                } else {
                    format!(" {c} |")
                })
                .collect::<String>()
        );
        self.doc.insert(t.append_at(), vec![line]);
    }

    /// The table of a contract section, added when the file has none: the
    /// section goes before the next contract section the file has (in
    /// contract order), else at the end; a section without a table gets
    /// one after its last line.
    fn ensure_table(&mut self, id: SectionId) -> Option<TableAt> {
        if let Some(t) = self.doc.table(id) {
            // a table without the columns that find fvd's rows again gets
            // none: a row fvd cannot find would be added on every write
            let keys: &[&str] = match id {
                SectionId::ComponentMatrix => &["Component"],
                SectionId::ParityCommands => &["Scope"],
                SectionId::IssuesAndBlockers => &["ID", "Component", "Evidence"],
                _ => &["ID"],
            };
            return keys.iter().all(|k| t.column(k).is_some()).then_some(t);
        }
        let header = format!("| {} |", id.columns().join(" | "));
        let sep = format!("|{}", "---|".repeat(id.columns().len()));
        match self.doc.section(id) {
            Some(s) => {
                let at = self.close_fence_at(self.doc.last_content_line(&s) + 1);
                self.doc.insert(at, vec![String::new(), header, sep]);
            }
            None => self.add_section(id, vec![header, sep]),
        }
        self.doc.table(id)
    }

    fn add_section(&mut self, id: SectionId, body: Vec<String>) {
        let later = SectionId::ALL.iter().skip_while(|s| **s != id).skip(1);
        let sections = self.doc.sections();
        let before = later
            .filter_map(|l| sections.iter().find(|s| s.id == Some(*l)))
            .map(|s| s.heading)
            .min();
        let mut lines = vec![format!("## {}", id.heading()), String::new()];
        lines.extend(body);
        match before {
            Some(at) => {
                lines.push(String::new());
                self.doc.insert(at, lines);
            }
            None => {
                let n = self.close_fence_at(self.doc.lines().len());
                if self
                    .doc
                    .line(n.wrapping_sub(1))
                    .is_some_and(|l| !l.trim().is_empty())
                {
                    lines.insert(0, String::new());
                }
                self.doc.insert(n, lines);
            }
        }
    }

    /// Where lines inserted at `at` are outside any fence: a fence the
    /// file leaves open there is closed first (it ran to the end anyway).
    fn close_fence_at(&mut self, at: usize) -> usize {
        let open = self.doc.lines()[..at.min(self.doc.lines().len())]
            .iter()
            .filter(|l| is_fence(l))
            .count()
            % 2
            == 1;
        if open {
            self.doc.insert(at, vec!["```".to_owned()]);
            at + 1
        } else {
            at
        }
    }

    /// Adds the ids fvd opened to a matrix row's Open Issues cell and
    /// removes those it closed; other ids and text stay as written.
    fn sync_open_issues(&mut self, row: usize, add: &[String], remove: &[String]) {
        let Some(old) = self.get(SectionId::ComponentMatrix, row, "Open Issues") else {
            return;
        };
        let mut cell = old.clone();
        for id in remove {
            cell = remove_id(&cell, id);
        }
        for id in add {
            if !has_id(&cell, id) {
                cell = if is_none(&cell) {
                    id.clone()
                } else {
                    format!("{cell}, {id}")
                };
            }
        }
        if cell.trim().is_empty() {
            cell = "none".into();
        }
        if cell != old {
            self.set(SectionId::ComponentMatrix, row, "Open Issues", &cell);
        }
    }

    /// Current Phase: back to P6 on a regression, restored when it passes
    /// again, otherwise only forward.
    fn phase(&mut self, tested_any: bool, recorded: &[(bool, bool)]) {
        let date = self.input.date.clone();
        if !self.regressions.is_empty() {
            self.move_back(&date);
            return;
        }
        if self.recovered {
            self.restore();
        }
        if !tested_any {
            return;
        }
        let Some(s) = self.doc.section(SectionId::CurrentPhase) else {
            return;
        };
        let fields = self.doc.fields(&s);
        let value = |k: &str| fields.iter().find(|f| f.1 == k).map(|f| plain(&f.2));
        let Some(phase_text) = value("phase") else {
            return;
        };
        let recorded_phase = phase_text.parse::<Phase>().ok();
        if recorded_phase.is_none() && !phase_text.is_empty() {
            // a phase fvd cannot place: it does not move it
            return;
        }
        // Where the components stand, with this write's evidence.
        let mut blocked = false;
        let mut all_pass = true;
        for (c, (rec, regressed)) in self.input.components.iter().zip(recorded) {
            let o = c.outcome();
            let (pass, block) = match o {
                Outcome::Pass => (true, false),
                Outcome::Red if *rec => (false, true),
                _ if o.tests_the_code() => (*rec && !regressed, !*rec || *regressed),
                _ => (*rec && !regressed, *regressed),
            };
            blocked |= block;
            all_pass &= pass;
        }
        let p6 = Phase::ComponentParityDebug;
        let status = value("status").unwrap_or_default();
        let mut changes: Vec<(&str, String)> = Vec::new();
        let before_p6 = recorded_phase.is_none_or(|p| p < p6);
        if all_pass && recorded_phase.is_none_or(|p| p <= p6) {
            changes.push((
                "phase",
                format!("`{}`", Phase::PipelineStagesAndVariants.slug()),
            ));
            changes.push(("status", "`in_progress`".into()));
            changes.push(("owner", "`pipeline`".into()));
        } else if before_p6 {
            changes.push(("phase", format!("`{}`", p6.slug())));
            let st = if blocked { "blocked" } else { "in_progress" };
            changes.push(("status", format!("`{st}`")));
            changes.push(("owner", "`orchestrator`".into()));
        } else if recorded_phase == Some(p6) && blocked && status != "blocked" {
            changes.push(("status", "`blocked`".into()));
        }
        let mut changed = false;
        for (k, v) in changes {
            changed |= self.set_phase_field(k, &v);
        }
        if changed {
            self.set_phase_field("last_updated", &format!("`{date}`"));
        }
    }

    /// Sets a Current Phase field, adding its line after the last field
    /// when the section lacks it. Returns whether the file changed.
    fn set_phase_field(&mut self, key: &str, value: &str) -> bool {
        let Some(s) = self.doc.section(SectionId::CurrentPhase) else {
            return false;
        };
        let fields = self.doc.fields(&s);
        match fields.iter().find(|f| f.1 == key) {
            Some((line, _, _)) => self.doc.set_field(*line, value),
            None => {
                let at = fields.last().map_or(s.heading + 1, |f| f.0 + 1);
                self.doc.insert(at, vec![format!("- {key}: {value}")]);
                true
            }
        }
    }

    fn move_back(&mut self, date: &str) {
        let (first, _) = self.regressions[0].clone();
        let what = self
            .regressions
            .iter()
            .map(|(c, id)| format!("`{c}` regressed ({id})"))
            .collect::<Vec<_>>()
            .join(", ");
        let p6 = Phase::ComponentParityDebug;
        let section = match self.doc.section(SectionId::CurrentPhase) {
            Some(s) => s,
            None => {
                self.add_section(
                    SectionId::CurrentPhase,
                    ["phase", "status", "owner", "last_updated"]
                        .iter()
                        .map(|k| format!("- {k}:"))
                        .collect(),
                );
                match self.doc.section(SectionId::CurrentPhase) {
                    Some(s) => s,
                    None => return,
                }
            }
        };
        let fields = self.doc.fields(&section);
        let raw = |k: &str| {
            fields
                .iter()
                .find(|f| f.1 == k)
                .map(|f| f.2.clone())
                .unwrap_or_default()
        };
        let (phase, status, owner, updated) = (
            raw("phase"),
            raw("status"),
            raw("owner"),
            raw("last_updated"),
        );
        let recorded = plain(&phase).parse::<Phase>().ok();
        let back = !plain(&phase).is_empty() && recorded.is_none_or(|p| p > p6);
        // the bullet keeps what fvd replaced, so a later pass restores it
        let bullet = format!(
            "- fvd {date}: {MOVED_BACK}{phase}; status: {status}; owner: {owner}; last_updated: {updated} — {what}"
        );
        let mut changed = false;
        changed |= self.set_phase_field("phase", &format!("`{}`", p6.slug()));
        changed |= self.set_phase_field("status", "`blocked`");
        changed |= self.set_phase_field("owner", &format!("`component:{first}`"));
        if changed {
            self.set_phase_field("last_updated", &format!("`{date}`"));
        }
        if back && changed {
            if let Some(s) = self.doc.section(SectionId::CurrentPhase) {
                let at = self.doc.last_content_line(&s) + 1;
                self.doc.insert(at, vec![bullet]);
            }
            self.supersede_final_handoff(date, &what);
        }
    }

    /// One line after the final handoff block saying a regression
    /// superseded it; the block itself is never edited.
    fn supersede_final_handoff(&mut self, date: &str, what: &str) {
        if self.doc.lines().iter().any(|l| is_superseded_line(l)) {
            return;
        }
        let fenced = self.doc.fenced();
        let lines = self.doc.lines();
        // a fenced block that is a final_handoff, wherever it sits
        let mut block_end = None;
        let mut i = 0;
        while i < lines.len() {
            if is_fence(&lines[i]) {
                let close = (i + 1..lines.len()).find(|&j| is_fence(&lines[j]));
                let first = (i + 1..close.unwrap_or(lines.len()))
                    .map(|j| lines[j].trim())
                    .find(|l| !l.is_empty());
                if first.is_some_and(|l| l.starts_with("final_handoff:")) {
                    block_end = close;
                    break;
                }
                i = close.map_or(lines.len(), |c| c + 1);
            } else {
                i += 1;
            }
        }
        let at = match block_end {
            Some(e) => Some(e + 1),
            None => self.doc.section_titled("Final Handoff").map(|s: Section| {
                let body_fence = (s.heading + 1..s.end)
                    .rev()
                    .find(|&j| fenced[j] && is_fence(&lines[j]));
                body_fence.unwrap_or_else(|| self.doc.last_content_line(&s)) + 1
            }),
        };
        if let Some(at) = at {
            let line = format!("fvd {date}: {SUPERSEDED}: {what}; see Current Phase.");
            self.doc.insert(at, vec![line]);
        }
    }

    /// Undoes fvd's move back once no regression it recorded is open, if
    /// Current Phase still reads what fvd set.
    fn restore(&mut self) {
        if self.fvd_issues().iter().any(|i| i.open && i.regression) {
            return;
        }
        let Some(s) = self.doc.section(SectionId::CurrentPhase) else {
            return;
        };
        let Some(bullet_line) = (s.heading + 1..s.end).find(|&i| {
            self.doc
                .line(i)
                .is_some_and(|l| l.starts_with("- fvd ") && l.contains(MOVED_BACK))
        }) else {
            return;
        };
        let fields = self.doc.fields(&s);
        let value = |k: &str| fields.iter().find(|f| f.1 == k).map(|f| plain(&f.2));
        let p6 = Phase::ComponentParityDebug;
        if value("phase").as_deref() != Some(p6.slug().as_str())
            || value("status").as_deref() != Some("blocked")
        {
            return;
        }
        let bullet = self.doc.line(bullet_line).unwrap_or_default().to_owned();
        let Some(rest) = bullet.split_once(MOVED_BACK).map(|(_, r)| r) else {
            return;
        };
        let rest = rest.rsplit_once(" — ").map_or(rest, |(a, _)| a);
        let mut old: Vec<(&str, &str)> = Vec::new();
        let mut parts = rest.splitn(4, "; ");
        let first = parts.next().unwrap_or_default();
        old.push(("phase", first));
        for p in parts {
            if let Some((k, v)) = p
                .split_once(": ")
                .or_else(|| p.strip_suffix(':').map(|k| (k, "")))
            {
                old.push((k.trim(), v.trim()));
            }
        }
        for (k, v) in old {
            if let Some((line, _, _)) = self.doc.fields(&s).into_iter().find(|f| f.1 == k) {
                self.doc.set_field(line, v);
            }
        }
        self.doc.remove(bullet_line);
        if let Some(i) = self.doc.lines().iter().position(|l| is_superseded_line(l)) {
            self.doc.remove(i);
        }
    }

    /// Escape-hatch rows by fvd's ids: cells set in place, a row added when
    /// the id has none.
    fn escapes(&mut self) {
        for e in &self.input.escapes {
            let cells = e.cells();
            let row = self.doc.table(SectionId::EscapeHatches).and_then(|t| {
                let c = t.column("ID")?;
                t.rows
                    .clone()
                    .position(|l| self.doc.cell(l, c).is_some_and(|v| plain(&v) == e.id))
            });
            match row {
                Some(r) => {
                    for (col, v) in cells.iter().filter(|(c, _)| *c != "ID") {
                        self.set(SectionId::EscapeHatches, r, col, v);
                    }
                }
                None => self.append_row(SectionId::EscapeHatches, &cells),
            }
        }
    }
}

/// The reason fvd records: the component's reason without the verdict it
/// starts with, on one line.
fn evidence_reason(run: &Run) -> String {
    let r = run.reason.trim();
    let r = r
        .strip_prefix(&format!("{}:", run.verdict))
        .map_or(r, str::trim_start);
    one_line(r)
}

/// A Notes cell with fvd's segment at its end: the human text before fvd's
/// marker is kept as written; the cell is left alone when its segment
/// already carries the same evidence.
fn with_segment(notes: &str, segment: &str) -> String {
    match segment_start(notes) {
        Some(i) if segment_key(&notes[i..]) == segment_key(segment) => notes.to_owned(),
        Some(i) => {
            let human = notes[..i].trim_end();
            if human.is_empty() {
                segment.to_owned()
            } else {
                format!("{human} {segment}")
            }
        }
        None if notes.trim().is_empty() => segment.to_owned(),
        None => format!("{} {segment}", notes.trim_end()),
    }
}

/// The Issue cell of a row an fvd before co-authoring added for a blocked
/// component.
fn is_legacy_issue(issue: &str) -> bool {
    crate::status_guard::is_legacy_fvd_issue(issue)
}

/// The Notes an fvd before co-authoring wrote: `run N of M; reason`.
fn is_legacy_note(notes: &str) -> bool {
    let mut w = notes.split_whitespace();
    w.next() == Some("run")
        && w.next().is_some_and(|n| n.parse::<u32>().is_ok())
        && w.next() == Some("of")
        && w.next()
            .is_some_and(|n| n.trim_end_matches(';').parse::<u32>().is_ok())
}

fn same_command(cell: &str, command: &str) -> bool {
    let norm = |s: &str| {
        s.replace('`', "")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    norm(cell) == norm(command)
}

fn is_none(cell: &str) -> bool {
    matches!(
        plain(cell).to_lowercase().as_str(),
        "" | "none" | "-" | "n/a" | "—"
    )
}

fn id_positions(cell: &str, id: &str) -> Vec<usize> {
    cell.match_indices(id)
        .map(|(i, _)| i)
        .filter(|&i| {
            let before = cell[..i].chars().next_back();
            let after = cell[i + id.len()..].chars().next();
            before.is_none_or(|c| !c.is_ascii_alphanumeric())
                && after.is_none_or(|c| !c.is_ascii_alphanumeric())
        })
        .collect()
}

fn has_id(cell: &str, id: &str) -> bool {
    !id_positions(cell, id).is_empty()
}

/// `cell` without `id` and one separator next to it.
fn remove_id(cell: &str, id: &str) -> String {
    let Some(&i) = id_positions(cell, id).first() else {
        return cell.to_owned();
    };
    let after = &cell[i + id.len()..];
    let sep = |s: &str| s.len() - s.trim_start_matches([',', ';', ' ']).len();
    let n = sep(after);
    if n > 0 {
        format!("{}{}", &cell[..i], &after[n..])
    } else {
        let head = cell[..i].trim_end_matches([',', ';', ' ']);
        format!("{head}{after}")
    }
    .trim()
    .to_owned()
}

fn is_superseded_line(l: &str) -> bool {
    l.starts_with("fvd ") && l.contains(SUPERSEDED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_ids_come_and_go_without_touching_the_rest() {
        assert_eq!(remove_id("Q003, I004", "I004"), "Q003");
        assert_eq!(remove_id("I004, Q003", "I004"), "Q003");
        assert_eq!(
            remove_id("I004; Q003 (see notes)", "I004"),
            "Q003 (see notes)"
        );
        assert_eq!(remove_id("I0041", "I004"), "I0041");
        assert_eq!(remove_id("I004", "I004"), "");
        assert!(has_id("Q003, I004", "I004") && !has_id("I0040", "I004"));
        assert!(is_none("`none`") && is_none("") && !is_none("Q003"));
    }

    #[test]
    fn segments_read_back_and_replace_only_themselves() {
        let seg = "[fvd 2026-11-26 run 2 on w1: debug_red (regression) — t::x: a \\| b; command `pytest t.py`]";
        let s = parse_segment(&format!("human [fvd 2020] note {seg}")).unwrap();
        assert_eq!(s.outcome, "debug_red");
        assert!(s.regression);
        assert_eq!(s.reason, "t::x: a \\| b");
        let notes = format!("2026-01-01: agrees. {seg}");
        let newer = "[fvd 2026-11-27 run 3 on w2: non_skip_pass — 1 passed]";
        assert_eq!(
            with_segment(&notes, newer),
            format!("2026-01-01: agrees. {newer}")
        );
        // the same evidence on another day and run: untouched
        let same = seg.replace("2026-11-26 run 2 on w1", "2026-12-01 run 9 on w3");
        assert_eq!(with_segment(&notes, &same), notes);
        assert_eq!(with_segment("", newer), newer);
        assert_eq!(
            regressed_from("`debug_red` (regression; recorded a (b))"),
            Some("a (b)")
        );
        assert!(is_legacy_note("run 1 of 2; 3 passed") && !is_legacy_note("run the tests"));
    }
}
