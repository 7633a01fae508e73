//! fvd as co-author of a `PORT_STATUS.md` the porter keeps.
//!
//! The file is the porter's log of weeks of evidence. fvd never deletes a
//! word a person wrote: its result goes *beside* a person's cell, never
//! over it ([`crate::status_doc`] edits one cell or line and keeps every
//! other byte). What fvd writes:
//!
//! - for a component whose run *tested* the code ([`Outcome::tests_the_code`]),
//!   in its Component Matrix row's Parity cell and its Parity Commands
//!   row's Last Result cell: fvd's verdict word when the cell only holds a
//!   placeholder (empty, `pending`, `unknown`, `TBD`, or one of fvd's own
//!   non-pass words such as `` `debug_red` ``), else the person's words
//!   followed by one short evidence segment (`[fvd DATE run N on W (GPU):
//!   VERDICT]`); and one full segment at the end of that row's Notes
//!   (`[fvd DATE run N on W (GPU): VERDICT — REASON]`). A segment is
//!   replaced only by fvd's next one, and only when the evidence changed;
//!   a Last Result that agrees with a recorded pass gets none;
//! - the matrix Open Issues cell, only to add or remove the ids of issue
//!   rows fvd created; those rows' Status and Resolution;
//! - the Escape Hatches rows of the `E###` ids fvd gave;
//! - Current Phase: forward moves, `blocked` at P6, and the move back on a
//!   regression, with a bullet that records every value it replaced (so
//!   it can always be restored) and a line after the final handoff block
//!   saying it is superseded; undone when the regression passes again;
//! - where a file has no owned place for something (a component found only
//!   in the porter's own tables, a file without the contract's tables, no
//!   Issues table, no Current Phase, no Escape Hatches), one section of its
//!   own, `## fvd evidence`, bounded by marker lines and replaced as a whole
//!   on each write; never a second table that contradicts one that exists.
//!
//! A person's pass is read in every shape the file uses
//! ([`crate::status_read`]): a red run against it is a regression there
//! too. A run that did not test the code (an environment failure, a
//! cancel, an infrastructure error, no run) changes nothing.

use crate::ids::{IdKind, StableId};
use crate::phase::Phase;
use crate::port_status::{EscapeHatchRow, PortStatus, SectionId, plain};
use crate::recorded::RecordedVerdict;
use crate::status_doc::{Section, StatusDoc, TableAt, is_fence};
use crate::status_match::{self, Identity};
use crate::status_read::{
    self, FVD_SECTION_BEGIN, FVD_SECTION_END, FVD_SECTION_TITLE, Found, Kind, Recorded,
};
use crate::verdict::ErrorKind;

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
    /// The one list of which recorded verdicts tested the code. It is a
    /// match over every [`RecordedVerdict`], so a verdict added later does
    /// not compile until it is decided here. `environment`, `cancelled`,
    /// `infra_error`, `cleanup_refused`, `unplaced`, `stopped` and no verdict did not
    /// test it; an `error` did when its kind is a classified run's, other
    /// than `cancelled` (an error without a kind is fvd's own failure to
    /// run or record it).
    pub fn of(verdict: RecordedVerdict) -> Outcome {
        match verdict {
            RecordedVerdict::NonSkipPass => Outcome::Pass,
            RecordedVerdict::DebugRed => Outcome::Red,
            RecordedVerdict::ScaffoldSkip => Outcome::Skip,
            RecordedVerdict::Timeout => Outcome::Timeout,
            // It ran the code, but what it says cannot be believed: a
            // person's cell reads `blocked`.
            RecordedVerdict::Tampered => Outcome::Error,
            RecordedVerdict::Error(Some(kind)) => match kind {
                ErrorKind::Cancelled => Outcome::Untested,
                ErrorKind::NoTests
                | ErrorKind::Collection
                | ErrorKind::Setup
                | ErrorKind::Teardown
                | ErrorKind::JunitMissing
                | ErrorKind::JunitUnreadable
                | ErrorKind::JunitInvalid
                | ErrorKind::Crashed
                | ErrorKind::ExitMismatch
                | ErrorKind::Pytest => Outcome::Error,
            },
            RecordedVerdict::Error(None)
            | RecordedVerdict::Environment
            | RecordedVerdict::Cancelled
            | RecordedVerdict::InfraError
            | RecordedVerdict::CleanupRefused
            | RecordedVerdict::Unplaced
            | RecordedVerdict::Stopped
            | RecordedVerdict::None => Outcome::Untested,
        }
    }

    pub fn tests_the_code(self) -> bool {
        self != Outcome::Untested
    }

    /// fvd's word for a cell that holds no person's words.
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

/// Whether a recorded verdict tested the code.
pub fn tests_the_code(verdict: RecordedVerdict) -> bool {
    Outcome::of(verdict).tests_the_code()
}

/// The words of a cell, with `non-skip` kept as one.
fn tokens(cell: &str) -> Vec<String> {
    cell.to_lowercase()
        .replace("non_skip", "nonskip")
        .replace("non-skip", "nonskip")
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Whether the words say something failed, skipped, is blocked or not
/// done; a count of none (`0 skipped`, `no skips`) says nothing failed.
fn negative(tokens: &[String]) -> bool {
    tokens.iter().enumerate().any(|(i, w)| {
        let none_counted = i > 0 && matches!(tokens[i - 1].as_str(), "0" | "no" | "zero");
        match w.as_str() {
            "fail" | "failed" | "fails" | "failing" | "failure" | "failures" | "skip"
            | "skipped" | "skips" | "error" | "errors" | "errored" | "xfail" | "xfailed"
            | "xpass" => !none_counted,
            "red" | "blocked" | "blocker" | "scaffold" | "regression" | "pending" | "todo"
            | "not" | "unknown" | "incomplete" | "no" | "tbd" => {
                // `no` only negates on its own (`No`), not in `no skips`
                w != "no" || tokens.len() == 1
            }
            _ => false,
        }
    })
}

/// Whether a Parity or Last Result cell records a pass: `non_skip_pass`,
/// `pass`, `*_pass`, `PASS (A40, …)`, `N passed`, `N_passed_0_skipped`,
/// `5 PASSED, no skips, GB200`; not `N_passed_M_skipped` with M > 0, nor
/// anything that names a failure, a red run, a skip, an error or a block.
pub fn reads_as_pass(cell: &str) -> bool {
    let t = tokens(cell);
    !negative(&t)
        && t.iter().any(|w| {
            matches!(
                w.as_str(),
                "pass" | "passed" | "passes" | "passing" | "nonskip"
            )
        })
}

/// Whether a Status, State or Result cell says done in other words:
/// `complete`, `exact`, `bit-exact`, `identical`, `matches`.
pub fn reads_as_affirmative(cell: &str) -> bool {
    let t = tokens(cell);
    !negative(&t)
        && t.iter().any(|w| {
            matches!(
                w.as_str(),
                "complete" | "completed" | "done" | "exact" | "identical" | "matches" | "yes"
            )
        })
}

/// Whether a cell says the port's output equals the reference's: `exact`,
/// `bit-exact`, `identical` (`exact generated parity`), nothing negative.
pub fn reads_as_exact(cell: &str) -> bool {
    let t = tokens(cell);
    !negative(&t)
        && t.iter()
            .any(|w| matches!(w.as_str(), "exact" | "identical"))
}

/// A table row of `cells` (`| a | b |`). In a padded table (a header or
/// separator cell wider than its text and one blank each side) each cell
/// is padded so that its closing pipe stands under the header's; a cell
/// wider than its column pushes the rest on, and the next one that fits
/// lines up again. Widths are counted in characters.
pub fn aligned_row(header: &str, separator: &str, cells: &[String]) -> String {
    let padded = [header, separator].iter().any(|l| {
        l.trim_start().starts_with('|')
            && crate::status_doc::cells(l)
                .iter()
                .any(|c| c.chars().count() > c.trim().chars().count() + 2)
    });
    let pipes: Vec<usize> = if padded && header.starts_with('|') {
        header
            .chars()
            .enumerate()
            .filter(|(_, c)| *c == '|')
            .map(|(i, _)| i)
            .collect()
    } else {
        Vec::new()
    };
    let mut line = String::from("|");
    let mut width = 1;
    for (k, c) in cells.iter().enumerate() {
        let cell = if c.is_empty() {
            "  ".to_owned()
        } else {
            format!(" {c} ")
        };
        width += cell.chars().count();
        line.push_str(&cell);
        if let Some(&at) = pipes.get(k + 1)
            && at > width
        {
            line.push_str(&" ".repeat(at - width));
            width = at;
        }
        line.push('|');
        width += 1;
    }
    line
}

/// The run fvd recorded for a component.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Run {
    /// `non_skip_pass`, `debug_red`, … as stored, an error with its kind.
    pub verdict: RecordedVerdict,
    /// The component's one-line reason as stored.
    pub reason: String,
    pub run_no: u32,
    /// The worker it ran on; empty when unknown.
    pub worker: String,
    /// The GPU model the run used (`NVIDIA H100 80GB HBM3`), `cpu` for a
    /// run without one; empty when unknown.
    pub gpu: String,
    /// The run's hypothesis variants in one line (`eps_fix passes, fp32
    /// same`); empty when it had none.
    pub variants: String,
    /// Who submitted the port (a credential's name, `… on W for NAME`);
    /// empty when no credential was checked.
    pub by: String,
}

/// What a spec entry is to the workflow: a component, or a step of a
/// later phase that runs like one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Stage {
    /// A P6 parity component: a row of the Component Matrix.
    #[default]
    Component,
    /// A P7 step: the pipeline smoke or parity test.
    Pipeline,
    /// P9's basic example, judged by its exit status.
    Example,
    /// A P10 quality regression test.
    Quality,
}

impl Stage {
    /// Whether it is a component (and so has a Component Matrix row).
    pub fn is_component(self) -> bool {
        self == Stage::Component
    }

    /// The Parity Commands Scope of a row fvd adds for it; a component's
    /// is its name.
    fn scope(self, name: &str) -> String {
        match self {
            Stage::Component => name.to_owned(),
            Stage::Pipeline | Stage::Example => "pipeline".to_owned(),
            Stage::Quality => "quality".to_owned(),
        }
    }

    /// The phase its issues belong to.
    fn phase(self) -> Phase {
        match self {
            Stage::Component => Phase::ComponentParityDebug,
            Stage::Pipeline => Phase::PipelineStagesAndVariants,
            Stage::Example => Phase::ParityActivationAndLocalVerification,
            Stage::Quality => Phase::QualityRegression,
        }
    }

    /// The owner of its issues.
    fn owner(self, name: &str) -> String {
        match self {
            Stage::Component => format!("component:{name}"),
            _ => "pipeline".to_owned(),
        }
    }
}

/// A spec component and what fvd recorded for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComponentInput {
    pub name: String,
    /// A component, or a later phase's step (never a matrix row).
    pub stage: Stage,
    pub aliases: Vec<String>,
    pub component_type: String,
    pub parity_tests: Vec<String>,
    /// The command as fvd shows it (no `--junitxml`, placeholders expanded).
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
            .map_or(Outcome::Untested, |r| Outcome::of(r.verdict))
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
    /// Where the gate has the port.
    pub gate: GateInput,
}

/// How the port stands, as the store records it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Standing {
    /// The gate drives it.
    #[default]
    Running,
    /// It waits for a person's answer to an escape hatch.
    AskUser,
    /// It waits for a worker whose environment can run it.
    Environment,
    /// It waits on a person's work (P8's acceptance, P11's review).
    Waiting,
    /// The gate refused its phase.
    Blocked,
    /// Cancelled or otherwise ended: Current Phase is not moved for it.
    Ended,
}

/// Where the gate has the port, from the store's decisions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GateInput {
    /// The phase the port is at; `None` when not known (Current Phase then
    /// moves only as far as the components say).
    pub phase: Option<Phase>,
    pub standing: Standing,
    /// The latest time a red pipeline parity test sent the port back to P6.
    pub back_to_p6: Option<BackToP6>,
    /// The escape hatch in answer to which a person deferred quality
    /// regression (P10 pending).
    pub quality_deferred: Option<String>,
}

/// A red pipeline step sent back to a component: P7 refused, P6 reopened
/// for the component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackToP6 {
    pub component: String,
    pub reason: BackReason,
    /// P7 passed since.
    pub fixed: bool,
}

/// Why the pipeline sent the port back to P6 for a component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackReason {
    /// The pipeline parity test's first divergent module is one of the
    /// component's.
    Diverged { module: String },
    /// The pipeline's agent returned `return_to_phase_6` naming the
    /// component, with this evidence.
    AgentReturned { evidence: String },
}

/// The rows a component matches, as `fvd submit --dry-run` prints them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowMatch {
    /// 1-based line and Component cell of its matrix row.
    pub matrix: Option<(usize, String)>,
    /// 1-based line and Scope cell of its Parity Commands row.
    pub parity: Option<(usize, String)>,
    /// 1-based line and `Table title: label` of its rows in the porter's
    /// own tables (read for a recorded pass, never written).
    pub other: Vec<(usize, String)>,
    /// The pass the file records for it (the words, and where), if any.
    pub recorded_pass: Option<(String, String)>,
    /// fvd's evidence about it goes into fvd's own section (it has no
    /// matrix or Parity Commands row, and the file either has none of
    /// those tables or keeps the component in a table of its own).
    pub section: bool,
}

/// The contract tables fvd writes into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Places {
    matrix: bool,
    commands: bool,
}

/// Which rows of `text` each component matches.
pub fn row_matches(text: &str, components: &[ComponentInput]) -> Vec<RowMatch> {
    let doc = StatusDoc::parse(text);
    let tables = status_read::tables(&doc);
    let ids: Vec<Identity<'_>> = components.iter().map(ComponentInput::identity).collect();
    let found = status_read::find(&doc, &tables, &ids);
    let places = places(&tables);
    found
        .iter()
        .zip(&ids)
        .zip(components)
        .map(|((f, who), c)| {
            let at = |kind: Kind, line: Option<usize>| {
                let t = tables.iter().find(|t| t.kind == kind)?;
                let line = line?;
                Some((line + 1, doc.cell(line, t.label).unwrap_or_default()))
            };
            let rec = status_read::recorded(&doc, &tables, f, who, &|c| human_part(c));
            RowMatch {
                matrix: at(Kind::Matrix, f.matrix.filter(|_| c.stage.is_component())),
                parity: at(Kind::Commands, f.commands),
                other: f
                    .person
                    .iter()
                    .map(|(k, line)| {
                        let t = &tables[*k];
                        (
                            line + 1,
                            format!(
                                "{}: {}",
                                t.title,
                                doc.cell(*line, t.label).unwrap_or_default()
                            ),
                        )
                    })
                    .collect(),
                recorded_pass: rec.pass,
                section: in_section(f, places, c.stage) || shares_a_row(&doc, &tables, f, c),
            }
        })
        .collect()
}

fn places(tables: &[status_read::Table]) -> Places {
    Places {
        matrix: tables.iter().any(|t| t.kind == Kind::Matrix),
        commands: tables.iter().any(|t| t.kind == Kind::Commands),
    }
}

/// Whether `c` is a step without a Parity Commands row of its own whose
/// test file a row of another step's runs too (one porter's row for the
/// pipeline's smoke and parity tests): its evidence goes to fvd's section.
fn shares_a_row(
    doc: &StatusDoc,
    tables: &[status_read::Table],
    f: &Found,
    c: &ComponentInput,
) -> bool {
    let Some(t) = tables.iter().find(|t| t.kind == Kind::Commands) else {
        return false;
    };
    let Some(col) = t.command else {
        return false;
    };
    f.commands.is_none()
        && !c.stage.is_component()
        && t.at.rows.clone().any(|line| {
            doc.cell(line, col).is_some_and(|cmd| {
                c.parity_tests
                    .iter()
                    .any(|test| status_match::command_runs(&cmd, test))
            })
        })
}

/// Whether a component's evidence goes to fvd's section: no row of its own
/// in the contract's tables, and either the file keeps it in a table of
/// the porter's shape or has no contract table to add a row to (a step's
/// only table is Parity Commands: it never has a matrix row).
fn in_section(f: &Found, p: Places, stage: Stage) -> bool {
    let matrix = p.matrix && stage.is_component();
    (f.matrix.is_none() || !stage.is_component())
        && f.commands.is_none()
        && (!f.person.is_empty() || !(matrix || p.commands))
}

/// A new status file: the contract skeleton (`status` with its summary,
/// phase and conversion state filled in) with a row for every component.
pub fn create(status: &PortStatus, input: &Input) -> String {
    Patcher::new(&status.render(), input, true).run()
}

/// `existing` with fvd's evidence written where it may write; every other
/// byte as it was. Unchanged when nothing tested the code, when the
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
/// How an fvd before issue #28 wrote a regression over the person's cell;
/// read back so that the person's value returns.
const REGRESSED: &str = "`debug_red` (regression; recorded ";
const COMMAND_TAG: &str = "; command `";
const VARIANTS_TAG: &str = "; variants: ";
const MOVED_BACK: &str = "moved back from phase: ";
/// The bullet that keeps the porter's Current Phase values fvd replaced
/// when every component passed (issue #41).
const MOVED_FORWARD: &str = "moved forward from phase: ";
const SUPERSEDED: &str = "the final handoff above is superseded";
/// Written in a moved-back record for a Current Phase field the section
/// did not have: restoring removes the line fvd added.
const ABSENT: &str = "(absent)";
/// The Current Phase fields fvd may set, in the order it records them.
const PHASE_KEYS: [&str; 4] = ["phase", "status", "owner", "last_updated"];

/// One piece of fvd evidence, as written into a Notes or Evidence cell.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Segment {
    outcome: String,
    regression: bool,
    reason: String,
}

/// Where fvd's segment starts in a cell: its last `[fvd YYYY-` marker,
/// when the segment runs to the end of the cell.
fn segment_start(cell: &str) -> Option<usize> {
    let cell_end = cell.trim_end();
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
        .filter(|_| cell_end.ends_with(']'))
}

/// fvd's segment at the end of a cell, if it has one.
fn segment_of(cell: &str) -> Option<&str> {
    segment_start(cell).map(|i| cell[i..].trim_end())
}

/// The words a person wrote in a cell: the cell without fvd's segment at
/// its end; for a cell an older fvd wrote as `` `debug_red` (regression;
/// recorded X) ``, the person's `X`.
pub fn human_part(cell: &str) -> String {
    let t = cell.trim();
    if let Some(orig) = regressed_from(t) {
        return orig.to_owned();
    }
    match segment_start(t) {
        Some(i) => t[..i].trim_end().to_owned(),
        None => t.to_owned(),
    }
}

/// Whether a cell's person words are only a placeholder fvd may replace:
/// empty, `pending`, `unknown`, `TBD`, `TODO`, `not_run`, `not_started`,
/// `n/a`, a dash, or one of fvd's own non-pass words (`` `debug_red` ``,
/// `` `scaffold_skip` ``, `` `blocked` ``).
pub fn is_placeholder(human: &str) -> bool {
    let bare = human.trim();
    if matches!(
        bare,
        "`debug_red`" | "`scaffold_skip`" | "`blocked`" | "`error`" | "`timeout`"
    ) {
        return true;
    }
    matches!(
        plain(bare).to_lowercase().as_str(),
        "" | "pending"
            | "unknown"
            | "tbd"
            | "todo"
            | "not_run"
            | "not run"
            | "not_started"
            | "not started"
            | "n/a"
            | "-"
            | "—"
            | "?"
    )
}

/// The part of a segment that is evidence (after `…on W (GPU): `): what a
/// later write compares to decide whether the evidence changed.
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

/// The recorded value a regression cell of an older fvd keeps: ``
/// `debug_red` (regression; recorded X) `` gives `X`.
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
/// run with `outcome`: its word over a placeholder; else the person's words
/// and `segment` beside them (none when the person's words are fvd's own
/// word, or when `quiet_when_agreeing` and the run passes where the cell
/// records a pass).
fn result_cell(
    old: &str,
    outcome: Outcome,
    verdict: &str,
    segment: &str,
    quiet_when_agreeing: bool,
) -> String {
    let human = human_part(old);
    let word = outcome.parity_cell(verdict);
    if is_placeholder(&human) {
        return word;
    }
    if plain(&human) == plain(&word)
        || (quiet_when_agreeing && outcome == Outcome::Pass && reads_as_pass(&human))
    {
        return human;
    }
    let base = match segment_of(old.trim()) {
        Some(s) => format!("{human} {s}"),
        None => human,
    };
    with_segment(&base, segment)
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

/// One row of fvd's section.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SectionRow {
    component: String,
    recorded: String,
    verdict: String,
    run: String,
    evidence: String,
}

impl SectionRow {
    fn cells(&self) -> [String; 5] {
        [
            format!("`{}`", self.component),
            self.recorded.clone(),
            self.verdict.clone(),
            self.run.clone(),
            self.evidence.clone(),
        ]
    }

    fn line(&self) -> String {
        format!("| {} |", self.cells().join(" | "))
    }
}

const SECTION_HEADER: &str = "| Component | Recorded in this file | fvd verdict | Run | Evidence |";
const SECTION_SEPARATOR: &str = "|---|---|---|---|---|";

/// P11's pre-handoff checklist: what fvd's records show ticked, the rest
/// left to a person.
fn checklist(input: &Input) -> Vec<String> {
    let item = |done: bool, text: String| format!("- [{}] {text}", if done { 'x' } else { ' ' });
    let of = |stage: Stage| -> Vec<&ComponentInput> {
        input
            .components
            .iter()
            .filter(|c| c.stage == stage)
            .collect()
    };
    let names = |v: &[&ComponentInput]| {
        v.iter()
            .map(|c| format!("`{}`", one_line(&c.name)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let passed = |c: &&ComponentInput| c.outcome() == Outcome::Pass;
    let mut out = vec![
        "- P11 pre-handoff checklist (ticked from fvd's records; the rest is a person's):"
            .to_owned(),
    ];
    let comps = of(Stage::Component);
    let red: Vec<&ComponentInput> = comps.iter().copied().filter(|c| !passed(c)).collect();
    out.push(if red.is_empty() {
        item(
            true,
            format!(
                "every required component has a non-skip parity pass ({})",
                names(&comps)
            ),
        )
    } else {
        item(
            false,
            format!(
                "every required component has a non-skip parity pass (not yet: {})",
                names(&red)
            ),
        )
    });
    let steps = of(Stage::Pipeline);
    for step in &steps {
        out.push(item(
            passed(step),
            format!(
                "pipeline step `{}` has a non-skip pass",
                one_line(&step.name)
            ),
        ));
    }
    if steps.is_empty() {
        out.push(item(
            false,
            "pipeline smoke and parity: a person's (the spec declares no pipeline test)".into(),
        ));
    }
    let example = of(Stage::Example);
    out.push(match example.first() {
        Some(e) => item(
            passed(e),
            "the basic example ran to exit status 0 (whether its output is sound is a person's)"
                .into(),
        ),
        None => item(
            false,
            "the basic example: a person's (the spec declares none)".into(),
        ),
    });
    let quality = of(Stage::Quality);
    out.push(match &input.gate.quality_deferred {
        _ if !quality.is_empty() && quality.iter().all(passed) => item(
            true,
            format!("quality regression passed ({})", names(&quality)),
        ),
        Some(id) => item(
            false,
            format!("quality regression deferred in answer to {}", one_line(id)),
        ),
        None if quality.is_empty() => item(
            false,
            "quality regression: a person's (the spec declares no quality test)".into(),
        ),
        None => item(
            false,
            format!("quality regression has no pass yet ({})", names(&quality)),
        ),
    });
    let open: Vec<&str> = input
        .escapes
        .iter()
        .filter(|e| plain(&e.status) == "open")
        .map(|e| e.id.as_str())
        .collect();
    out.push(if open.is_empty() {
        item(true, "every escape hatch fvd raised is answered".into())
    } else {
        item(
            false,
            format!("every escape hatch answered (open: {})", open.join(", ")),
        )
    });
    for person in [
        "the prep handoff is complete, and no token value is committed",
        "the converted weights (if any) load strictly with the real checkpoint",
        "the local tests README lists every parity test, its command and status",
        "every open question and issue in this file is resolved or named a blocker",
        "production code imports no diffusers or transformers model classes",
        "comments explain why; examples carry a user-story docstring",
        "the hot-path review of the sampling loop is done",
    ] {
        out.push(item(false, format!("a person's: {person}")));
    }
    out
}

/// The lines of fvd's section in a doc: heading to end marker.
fn fvd_section_range(doc: &StatusDoc) -> Option<std::ops::Range<usize>> {
    let lines = doc.lines();
    let begin = (1..lines.len()).find(|&i| {
        doc.line(i) == Some(FVD_SECTION_BEGIN)
            && doc
                .line(i - 1)
                .and_then(|h| h.strip_prefix("## "))
                .is_some_and(|t| t.trim().eq_ignore_ascii_case(FVD_SECTION_TITLE))
    })?;
    let end = (begin..lines.len()).find(|&i| doc.line(i) == Some(FVD_SECTION_END))?;
    Some(begin - 1..end + 1)
}

struct Patcher<'a> {
    doc: StatusDoc,
    input: &'a Input,
    /// A created file lists every component, tested or not.
    created: bool,
    /// (component, where it is recorded: an issue id or fvd's section) of
    /// regressions found by this write.
    regressions: Vec<(String, String)>,
    /// Whether a component of this write regressed (new or known).
    regressed_now: bool,
    /// Whether this write resolved a regression row.
    recovered: bool,
    /// Rows this write puts into fvd's section, by component.
    section_rows: Vec<SectionRow>,
    /// Lines (bullets) this write puts into fvd's section.
    section_notes: Vec<String>,
}

/// Where a component's rows sit, as offsets in their tables (line numbers
/// move as rows are added above them; offsets are found again on use).
#[derive(Debug, Clone, Default)]
struct Rows {
    matrix: Option<usize>,
    commands: Option<usize>,
    /// The file keeps the component in a table of the porter's shape.
    person: bool,
    /// A step without a Parity Commands row of its own whose test file a
    /// row of another step's runs too (one porter's row for smoke and
    /// parity): its evidence goes to fvd's section, not a row beside it.
    shared: bool,
}

impl<'a> Patcher<'a> {
    fn new(text: &str, input: &'a Input, created: bool) -> Self {
        Self {
            doc: StatusDoc::parse(text),
            input,
            created,
            regressions: Vec::new(),
            regressed_now: false,
            recovered: false,
            section_rows: Vec::new(),
            section_notes: Vec::new(),
        }
    }

    fn run(mut self) -> String {
        let tables = status_read::tables(&self.doc);
        let ids: Vec<Identity<'_>> = self
            .input
            .components
            .iter()
            .map(ComponentInput::identity)
            .collect();
        let found = status_read::find(&self.doc, &tables, &ids);
        // What the file records before fvd writes anything.
        let recorded: Vec<Recorded> = ids
            .iter()
            .zip(&found)
            .map(|(who, f)| status_read::recorded(&self.doc, &tables, f, who, &|c| human_part(c)))
            .collect();
        let places = places(&tables);
        let offset = |kind: Kind, line: Option<usize>| {
            let t = tables.iter().find(|t| t.kind == kind)?;
            Some(line? - t.at.rows.start)
        };
        let rows: Vec<Rows> = found
            .iter()
            .zip(&self.input.components)
            .map(|(f, c)| Rows {
                // a step is never a component's matrix row
                matrix: offset(Kind::Matrix, f.matrix).filter(|_| c.stage.is_component()),
                commands: offset(Kind::Commands, f.commands),
                person: !f.person.is_empty(),
                shared: shares_a_row(&self.doc, &tables, f, c),
            })
            .collect();
        let mut tested_any = false;
        for (k, c) in self.input.components.iter().enumerate() {
            let outcome = c.outcome();
            if outcome.tests_the_code() {
                tested_any = true;
                self.component(c, outcome, &rows[k], &recorded[k], places);
            } else if self.created {
                self.listed(c, &rows[k]);
            }
        }
        self.phase(tested_any, &recorded);
        self.escapes();
        self.gate_notes();
        if tested_any || !self.input.escapes.is_empty() || !self.section_notes.is_empty() {
            self.write_section();
        }
        self.doc.render()
    }

    /// fvd's lines about the gate's later phases: why the pipeline sent the
    /// port back to P6, what a waiting port waits for, and at P11 the
    /// pre-handoff checklist.
    fn gate_notes(&mut self) {
        let g = &self.input.gate;
        if let Some(b) = &g.back_to_p6 {
            let mut line = match &b.reason {
                BackReason::Diverged { module } => format!(
                    "- back to P6: the pipeline parity test diverged first at `{}`, in component `{}`'s modules, and the port went back to P6 for it",
                    one_line(module),
                    one_line(&b.component)
                ),
                BackReason::AgentReturned { evidence } => format!(
                    "- back to P6: the pipeline's agent returned to phase 6 for component `{}` ({}), and the port went back to P6 for it",
                    one_line(&b.component),
                    one_line(evidence)
                ),
            };
            line.push_str(if b.fixed {
                "; fixed: the latest P7 passed."
            } else {
                "."
            });
            self.section_notes.push(line);
        }
        let Some(phase) = g.phase else {
            return;
        };
        let waits = match g.standing {
            Standing::Waiting if phase == Phase::PostParityReviewAndHandoff => {
                "waits for a person's review".to_owned()
            }
            Standing::Waiting => "waits on a person's work".to_owned(),
            Standing::AskUser => {
                let open: Vec<&str> = self
                    .input
                    .escapes
                    .iter()
                    .filter(|e| plain(&e.status) == "open")
                    .map(|e| e.id.as_str())
                    .collect();
                format!("waits for a person's answer ({})", open.join(", "))
            }
            _ => String::new(),
        };
        if !waits.is_empty() && phase > Phase::ComponentParityDebug {
            self.section_notes.push(format!(
                "- the port is at {} ({}) and {waits}.",
                phase.id(),
                phase.name()
            ));
        }
        if phase == Phase::PostParityReviewAndHandoff {
            self.section_notes.extend(checklist(self.input));
        }
    }

    fn commands(&self) -> Option<TableAt> {
        self.doc.table(SectionId::ParityCommands)
    }

    /// The Issues And Blockers table, when it has the columns that find
    /// fvd's rows again.
    fn issues(&self) -> Option<TableAt> {
        self.doc.table(SectionId::IssuesAndBlockers).filter(|t| {
            ["ID", "Component", "Evidence"]
                .iter()
                .all(|c| t.column(c).is_some())
        })
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
        rows: &Rows,
        rec: &Recorded,
        places: Places,
    ) {
        let Some(run) = c.run.as_ref() else {
            return;
        };
        let verdict = run.verdict.as_str();
        let recorded = rec.records_pass();
        let regression = outcome == Outcome::Red && recorded;
        // a step's red moves no component back: the gate decides its phase
        self.regressed_now |= regression && c.stage.is_component();
        let reason = evidence_reason(run);
        let short = self.short_segment(run, regression);
        let segment = self.segment(run, regression, &reason, None);
        let has_issues = self.issues().is_some() || self.created;

        // Issues first: the matrix row lists their ids.
        let mine: Vec<FvdIssue> = self
            .fvd_issues()
            .into_iter()
            .filter(|i| i.component == status_match::normalise_label(&c.name))
            .collect();
        if has_issues {
            match outcome {
                Outcome::Pass => self.resolve_passed(run, &mine),
                Outcome::Red if recorded && !mine.iter().any(|i| i.open && i.regression) => {
                    self.add_regression(c, rec, &segment);
                }
                _ if recorded => {}
                _ => self.add_blocker(c, run, outcome, &reason, &segment, &mine),
            }
        } else if regression && c.stage.is_component() {
            self.regressions
                .push((c.name.clone(), format!("see `## {FVD_SECTION_TITLE}`")));
        }

        let owned = rows.matrix.is_some() || rows.commands.is_some();
        // a pass that agrees with the person's is said once, in Notes,
        // where the row has them
        let noted =
            rows.commands.is_some() && self.commands().is_some_and(|t| t.column("Notes").is_some());
        if let Some(r) = rows.matrix {
            if let Some(old) = self.get(SectionId::ComponentMatrix, r, "Parity") {
                let new = result_cell(&old, outcome, verdict, &short, noted);
                self.set(SectionId::ComponentMatrix, r, "Parity", &new);
            }
            if has_issues {
                self.sync_matrix_issues(c, r);
            }
        }
        if let Some(r) = rows.commands {
            self.command_row(c, run, r, outcome, regression, &reason, &short);
        }
        let unfound = !owned && !rows.person && !rows.shared;
        // a step has no matrix row to add
        let matrix = places.matrix && c.stage.is_component();
        if unfound && (self.created || matrix || places.commands) {
            // a component the file does not know: a row in each contract
            // table the file has (a step only in Parity Commands)
            if c.stage.is_component() && (self.created || places.matrix) {
                self.new_matrix_row(c, outcome.parity_cell(verdict));
            }
            if self.created || places.commands {
                let has_command = self
                    .commands()
                    .is_none_or(|t| t.column("Command").is_some());
                let ran = (!has_command).then_some(c.command.as_str());
                let segment = self.segment(run, regression, &reason, ran);
                // the word an existing row's placeholder gets, so a second
                // write of the same evidence changes nothing
                self.add_command_row(c, &outcome.parity_cell(verdict), &segment);
            }
        } else if !owned || (!has_issues && outcome != Outcome::Pass) {
            // no owned cell, or no Issues table for what went wrong
            self.section_row(c, run, outcome, regression, rec, &reason);
        }
    }

    /// The Parity Commands row: Last Result beside the person's words, and
    /// fvd's full evidence at the end of Notes (in Last Result when the
    /// table has no Notes).
    #[allow(clippy::too_many_arguments)]
    fn command_row(
        &mut self,
        c: &ComponentInput,
        run: &Run,
        r: usize,
        outcome: Outcome,
        regression: bool,
        reason: &str,
        short: &str,
    ) {
        let verdict = run.verdict.as_str();
        let command = self
            .get(SectionId::ParityCommands, r, "Command")
            .unwrap_or_default();
        let ran = (!same_command(&command, &c.command)).then_some(c.command.as_str());
        let segment = self.segment(run, regression, reason, ran);
        let notes = self.get(SectionId::ParityCommands, r, "Notes");
        let has_notes = self.commands().is_some_and(|t| t.column("Notes").is_some());
        if let Some(old) = self.get(SectionId::ParityCommands, r, "Last Result") {
            let new = if has_notes {
                result_cell(&old, outcome, verdict, short, true)
            } else {
                result_cell(&old, outcome, verdict, &segment, false)
            };
            self.set(SectionId::ParityCommands, r, "Last Result", &new);
        }
        if has_notes {
            let scope = self
                .get(SectionId::ParityCommands, r, "Scope")
                .unwrap_or_default();
            let notes = notes.unwrap_or_default();
            // a row an older fvd wrote (`component:X`, `run N of M; …`)
            // holds no human note
            let legacy = plain(&scope).starts_with("component:") && is_legacy_note(&notes);
            let new = with_segment(if legacy { "" } else { &notes }, &segment);
            self.set(SectionId::ParityCommands, r, "Notes", &new);
        }
    }

    /// A row of fvd's section about a component.
    fn section_row(
        &mut self,
        c: &ComponentInput,
        run: &Run,
        outcome: Outcome,
        regression: bool,
        rec: &Recorded,
        reason: &str,
    ) {
        let mut verdict = format!("`{}`", run.verdict);
        if regression {
            verdict.push_str(" (regression)");
        } else if outcome == Outcome::Pass
            && let Some(b) = &rec.blocker
        {
            verdict.push_str(&format!(" (passes; Known Blockers lists: {})", one_line(b)));
        }
        let recorded = match &rec.pass {
            Some((words, at)) => format!("{at}: {words}"),
            None => "no pass recorded".to_owned(),
        };
        let mut evidence = reason.to_owned();
        if !run.variants.is_empty() {
            evidence.push_str(&format!("{VARIANTS_TAG}{}", one_line(&run.variants)));
        }
        let ran = one_line(&c.command).replace('`', "'");
        evidence = if evidence.is_empty() {
            format!("command `{ran}`")
        } else {
            format!("{evidence}{COMMAND_TAG}{ran}`")
        };
        self.section_rows.push(SectionRow {
            component: one_line(&c.name),
            recorded: one_line(&recorded),
            verdict,
            run: self.run_head(run),
            evidence,
        });
    }

    /// A pass resolves fvd's open issues about the component.
    fn resolve_passed(&mut self, run: &Run, mine: &[FvdIssue]) {
        let why = format!("passed in fvd run {} on {}", run.run_no, self.input.date);
        for i in mine.iter().filter(|i| i.open) {
            self.resolve(i.row, &why);
            self.recovered |= i.regression;
        }
    }

    /// A red run where the file records a pass: a regression issue, once.
    fn add_regression(&mut self, c: &ComponentInput, rec: &Recorded, segment: &str) {
        let was = rec
            .pass
            .as_ref()
            .map_or("a pass".to_owned(), |(w, at)| format!("{w} ({at})"));
        let issue = format!(
            "regression: `debug_red` where this file records {}",
            one_line(&was)
        );
        if let Some(id) = self.add_issue(c, "high", &issue, segment)
            && c.stage.is_component()
        {
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

    /// fvd's open issue ids about the component, and its resolved ones.
    fn issue_ids(&self, c: &ComponentInput) -> (Vec<String>, Vec<String>) {
        let name = status_match::normalise_label(&c.name);
        let (open, closed): (Vec<FvdIssue>, Vec<FvdIssue>) = self
            .fvd_issues()
            .into_iter()
            .filter(|i| i.component == name)
            .partition(|i| i.open);
        let ids = |v: Vec<FvdIssue>| v.into_iter().map(|i| i.id).collect::<Vec<_>>();
        (ids(open), ids(closed))
    }

    /// A matrix row's Open Issues lists fvd's open rows about the
    /// component and none of fvd's resolved ones.
    fn sync_matrix_issues(&mut self, c: &ComponentInput, r: usize) {
        let (opened, closed) = self.issue_ids(c);
        self.sync_open_issues(r, &opened, &closed);
    }

    /// A matrix row for a component the file does not list.
    fn new_matrix_row(&mut self, c: &ComponentInput, parity: String) {
        // a row fvd adds lists every open issue about the component
        let (mut opened, _) = self.issue_ids(c);
        opened.extend(self.people_open(c));
        let open = if opened.is_empty() {
            "none".to_owned()
        } else {
            opened.join(", ")
        };
        self.add_matrix_row(c, &parity, &open);
    }

    /// A component of a created file that did not test: listed, nothing more.
    fn listed(&mut self, c: &ComponentInput, rows: &Rows) {
        if rows.matrix.is_none() && c.stage.is_component() {
            self.add_matrix_row(c, "`not_started`", "none");
        }
        if rows.commands.is_none() && !rows.shared {
            self.add_command_row(c, "`not_run`", "");
        }
    }

    /// `YYYY-MM-DD run N on W (GPU)`.
    fn run_head(&self, run: &Run) -> String {
        let mut s = format!("{} run {}", self.input.date, run.run_no);
        if !run.worker.is_empty() {
            s.push_str(&format!(" on {}", one_line(&run.worker)));
        }
        if !run.gpu.is_empty() {
            s.push_str(&format!(" ({})", one_line(&run.gpu).replace(':', " ")));
        }
        if !run.by.is_empty() {
            s.push_str(&format!(" for {}", one_line(&run.by)));
        }
        s
    }

    /// The short segment beside a person's result: date, run, machine,
    /// GPU and verdict.
    fn short_segment(&self, run: &Run, regression: bool) -> String {
        let mut s = format!("{MARK}{}: {}", self.run_head(run), run.verdict);
        if regression {
            s.push_str(" (regression)");
        }
        s.push(']');
        s
    }

    fn segment(&self, run: &Run, regression: bool, reason: &str, command: Option<&str>) -> String {
        let mut s = format!("{MARK}{}: {}", self.run_head(run), run.verdict);
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
        let Some(t) = self.issues() else {
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
        let Some(t) = self.issues() else {
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

    /// Resolves fvd's issue row `row` with `why`. fvd opens its rows with
    /// an empty Resolution: what a person wrote there since is kept, fvd's
    /// words after it (issue #41).
    fn resolve(&mut self, row: usize, why: &str) {
        self.set(SectionId::IssuesAndBlockers, row, "Status", "resolved");
        let theirs = self
            .get(SectionId::IssuesAndBlockers, row, "Resolution")
            .map(|t| t.trim().to_owned())
            .unwrap_or_default();
        let text = if theirs.is_empty() {
            one_line(why)
        } else {
            one_line(&format!("{theirs}; fvd: {why}"))
        };
        self.set(SectionId::IssuesAndBlockers, row, "Resolution", &text);
    }

    fn add_issue(
        &mut self,
        c: &ComponentInput,
        severity: &str,
        issue: &str,
        evidence: &str,
    ) -> Option<String> {
        let t = if self.created {
            self.ensure_table(SectionId::IssuesAndBlockers)?
        } else {
            self.issues()?
        };
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
            ("Phase", c.stage.phase().id()),
            ("Component", c.name.clone()),
            ("Severity", severity.to_owned()),
            ("Issue", one_line(issue)),
            ("Evidence", evidence.to_owned()),
            ("Owner", c.stage.owner(&c.name)),
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
            ("Scope", c.stage.scope(&c.name)),
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
    /// A file fvd did not create gets no new table.
    fn append_row(&mut self, id: SectionId, cells: &[(&str, String)]) {
        let t = if self.created {
            self.ensure_table(id)
        } else {
            self.doc.table(id)
        };
        let Some(t) = t else {
            return;
        };
        let mut row = vec![String::new(); t.header.len()];
        for (name, value) in cells {
            if let Some(i) = t.column(name) {
                row[i] = value.clone();
            }
        }
        let header = self.doc.line(t.header_line).unwrap_or_default();
        let separator = self.doc.line(t.header_line + 1).unwrap_or_default();
        let line = aligned_row(header, separator, &row);
        self.doc.insert(t.append_at(), vec![line]);
    }

    /// The table of a contract section of a file fvd creates, added when
    /// the skeleton lacks it.
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
    /// again, otherwise only forward. A file without Current Phase gets a
    /// line in fvd's section instead.
    fn phase(&mut self, tested_any: bool, recorded: &[Recorded]) {
        let date = self.input.date.clone();
        let has_phase = self.doc.section(SectionId::CurrentPhase).is_some();
        if !has_phase && !self.created {
            if self.regressed_now {
                let names: Vec<String> = self
                    .input
                    .components
                    .iter()
                    .zip(recorded)
                    .filter(|(c, r)| {
                        c.stage.is_component() && c.outcome() == Outcome::Red && r.records_pass()
                    })
                    .map(|(c, _)| format!("`{}`", c.name))
                    .collect();
                self.section_notes.push(format!(
                    "- regression: {} fail(s) where this file records a pass; fvd treats the port as back in phase 6 (`{}`) until it passes again (this file has no Current Phase for fvd to move).",
                    names.join(", "),
                    Phase::ComponentParityDebug.slug()
                ));
            }
            return;
        }
        if !self.regressions.is_empty() {
            self.move_back(&date);
            return;
        }
        if (self.recovered || !self.regressed_now) && tested_any {
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
        // Where the components stand, with this write's evidence. One
        // without a verdict now (waiting for an environment, say) stands
        // where fvd's open issue about it leaves it: still failing (issue
        // #41: an environment failure during a regression moved the port
        // on to P7).
        let open_fvd: Vec<String> = self
            .fvd_issues()
            .into_iter()
            .filter(|i| i.open)
            .map(|i| i.component)
            .collect();
        let mut blocked = false;
        let mut all_pass = true;
        let components = self.input.components.iter().zip(recorded);
        for (c, rec) in components.filter(|(c, _)| c.stage.is_component()) {
            let o = c.outcome();
            let rec_pass = rec.records_pass();
            let still_failing = open_fvd.contains(&status_match::normalise_label(&c.name));
            let (pass, block) = match o {
                Outcome::Pass => (true, false),
                Outcome::Red if rec_pass => (false, true),
                _ if o.tests_the_code() => (rec_pass, !rec_pass),
                _ if still_failing => (false, true),
                _ => (rec_pass, false),
            };
            blocked |= block;
            all_pass &= pass;
        }
        let p6 = Phase::ComponentParityDebug;
        let status = value("status").unwrap_or_default();
        let mut changes: Vec<(&str, String)> = Vec::new();
        let before_p6 = recorded_phase.is_none_or(|p| p < p6);
        // fvd moved the phase on before (its bullet keeps the porter's values)
        let fvd_moved = self.forward_bullet().is_some();
        let gate = self
            .gate_target()
            .filter(|_| all_pass && (recorded_phase.is_none_or(|p| p <= p6) || fvd_moved));
        if let Some((phase, st, owner)) = gate {
            // where the gate has the port, past P6 (or back at P6 for a
            // component the pipeline traced to)
            if phase > p6 {
                self.record_forward(&date);
            }
            changes.push(("phase", format!("`{}`", phase.slug())));
            changes.push(("status", format!("`{st}`")));
            changes.push(("owner", format!("`{owner}`")));
        } else if all_pass && recorded_phase.is_none_or(|p| p <= p6) {
            self.record_forward(&date);
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

    /// The phase, status and owner the gate's decisions give the port: a
    /// phase after P6, or P6 while a component the pipeline traced to is
    /// reopened there; `None` otherwise (Current Phase then moves as the
    /// components say). Status is the contract's word: `in_progress` while
    /// the gate drives it or a person reviews it at P11, `blocked` while it
    /// waits for an answer, a worker or a refusal to be fixed.
    fn gate_target(&self) -> Option<(Phase, &'static str, String)> {
        let g = &self.input.gate;
        let p6 = Phase::ComponentParityDebug;
        let phase = g.phase.filter(|p| *p >= p6)?;
        let reopened = g.back_to_p6.as_ref().filter(|b| !b.fixed);
        if phase == p6 && reopened.is_none() {
            return None;
        }
        let status = match g.standing {
            Standing::Running => "in_progress",
            Standing::Waiting if phase == Phase::PostParityReviewAndHandoff => "in_progress",
            Standing::AskUser | Standing::Environment | Standing::Waiting | Standing::Blocked => {
                "blocked"
            }
            Standing::Ended => return None,
        };
        let owner = match phase {
            Phase::ComponentParityDebug => reopened.map_or("orchestrator".to_owned(), |b| {
                format!("component:{}", b.component)
            }),
            Phase::PipelineStagesAndVariants | Phase::PipelineConfigPresetsRegistryExamples => {
                "pipeline".to_owned()
            }
            _ => "orchestrator".to_owned(),
        };
        Some((phase, status, owner))
    }

    /// Before every component's pass moves Current Phase on to P7: one
    /// bullet with the values fvd replaces (the porter's status note and
    /// owner among them), as a moved-back bullet keeps them; a move back
    /// later restores them (issue #41). A file fvd created has only fvd's
    /// values, and one bullet is enough.
    fn record_forward(&mut self, date: &str) {
        let Some(s) = self.doc.section(SectionId::CurrentPhase) else {
            return;
        };
        if self.created || self.forward_bullet().is_some() {
            return;
        }
        let fields = self.doc.fields(&s);
        let record = PHASE_KEYS
            .iter()
            .map(|k| match fields.iter().find(|f| f.1 == *k) {
                Some(f) => format!("{k}: {}", quote(&f.2)),
                None => format!("{k}: {ABSENT}"),
            })
            .collect::<Vec<_>>()
            .join("; ");
        let bullet = format!(
            "- fvd {date}: {MOVED_FORWARD}{} — every component passes",
            &record["phase: ".len()..]
        );
        let at = self.doc.last_content_line(&s) + 1;
        self.doc.insert(at, vec![bullet]);
    }

    /// The line of fvd's moved-forward bullet in Current Phase.
    fn forward_bullet(&self) -> Option<usize> {
        let s = self.doc.section(SectionId::CurrentPhase)?;
        (s.heading + 1..s.end).find(|&i| {
            self.doc
                .line(i)
                .is_some_and(|l| l.starts_with("- fvd ") && l.contains(MOVED_FORWARD))
        })
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

    /// Moves Current Phase back to P6 (blocked) and records, in one bullet,
    /// every value it replaced: each as a quoted string (or `(absent)`), so
    /// that values holding `;`, quotes or backticks come back exactly.
    fn move_back(&mut self, date: &str) {
        let (first, _) = self.regressions[0].clone();
        let what = self
            .regressions
            .iter()
            .map(|(c, id)| format!("`{c}` regressed ({id})"))
            .collect::<Vec<_>>()
            .join(", ");
        let p6 = Phase::ComponentParityDebug;
        if self.doc.section(SectionId::CurrentPhase).is_none() {
            // only a file fvd creates gets the section
            self.add_section(
                SectionId::CurrentPhase,
                PHASE_KEYS.iter().map(|k| format!("- {k}:")).collect(),
            );
        }
        let Some(section) = self.doc.section(SectionId::CurrentPhase) else {
            return;
        };
        let fields = self.doc.fields(&section);
        let mut old: Vec<(&str, Option<String>)> = PHASE_KEYS
            .iter()
            .map(|k| (*k, fields.iter().find(|f| f.1 == *k).map(|f| f.2.clone())))
            .collect();
        // After fvd moved the port forward, the values to come back on a
        // pass are the porter's it kept then, not fvd's P7 ones.
        let forward = self.forward_bullet();
        if let Some(kept) = forward
            .and_then(|i| self.doc.line(i).map(str::to_owned))
            .and_then(|l| parse_moved_forward(&l))
        {
            for (k, v) in old.iter_mut() {
                if let Some((_, kv)) = kept.iter().find(|(kk, _)| kk == k) {
                    *v = kv.clone();
                }
            }
        }
        let phase_was = old[0].1.clone().unwrap_or_default();
        let recorded = plain(&phase_was).parse::<Phase>().ok();
        if let Some(i) = forward {
            self.doc.remove(i);
        }
        let mut changed = forward.is_some();
        changed |= self.set_phase_field("phase", &format!("`{}`", p6.slug()));
        changed |= self.set_phase_field("status", "`blocked`");
        changed |= self.set_phase_field("owner", &format!("`component:{first}`"));
        if changed {
            self.set_phase_field("last_updated", &format!("`{date}`"));
            // the bullet keeps what fvd replaced, so a later pass restores it
            let record = old
                .iter()
                .map(|(k, v)| match v {
                    Some(v) => format!("{k}: {}", quote(v)),
                    None => format!("{k}: {ABSENT}"),
                })
                .collect::<Vec<_>>()
                .join("; ");
            let bullet = format!("- fvd {date}: moved back from {record} — {what}");
            if let Some(s) = self.doc.section(SectionId::CurrentPhase) {
                let at = self.doc.last_content_line(&s) + 1;
                self.doc.insert(at, vec![bullet]);
            }
            if recorded.is_none_or(|p| p > p6) && !plain(&phase_was).is_empty() {
                self.supersede_final_handoff(date, &what);
            }
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
    /// Current Phase still reads what fvd set: every field the bullet
    /// records gets its value back, a field that was absent goes again.
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
        let Some(old) = parse_moved_back(&bullet) else {
            return;
        };
        // What fvd set when it moved back; a field a person changed since
        // is theirs and stays (issue #41).
        let moved_on = bullet
            .strip_prefix("- fvd ")
            .and_then(|r| r.split_once(':'))
            .map(|(d, _)| d.trim().to_owned())
            .unwrap_or_default();
        let fvd_set = |k: &str, v: &str| match k {
            "owner" => v.starts_with("component:"),
            "last_updated" => v == moved_on,
            _ => true,
        };
        // lines fvd added are taken away last, bottom up, so indices hold
        let mut gone: Vec<usize> = vec![bullet_line];
        for (k, v) in old {
            let Some((line, _, now)) = self.doc.fields(&s).into_iter().find(|f| f.1 == k) else {
                continue;
            };
            if !fvd_set(&k, &plain(&now)) {
                continue;
            }
            match v {
                Some(v) => {
                    self.doc.set_field(line, &v);
                }
                None => gone.push(line),
            }
        }
        gone.sort_unstable();
        for line in gone.into_iter().rev() {
            self.doc.remove(line);
        }
        if let Some(i) = self.doc.lines().iter().position(|l| is_superseded_line(l)) {
            self.doc.remove(i);
        }
    }

    /// Escape-hatch rows by fvd's ids: cells set in place, a row added when
    /// the id has none; a file without the table gets them in fvd's section.
    fn escapes(&mut self) {
        let has_table = self.created
            || self
                .doc
                .table(SectionId::EscapeHatches)
                .is_some_and(|t| t.column("ID").is_some());
        for e in &self.input.escapes {
            if !has_table {
                self.section_notes.push(format!(
                    "- question {} ({}, {}): {} — recommended: {}; {}",
                    e.id,
                    plain(&e.status),
                    e.phase,
                    e.question,
                    e.recommended_option,
                    e.resolution
                ));
                continue;
            }
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

    /// fvd's section, rebuilt: a row per component that has something to
    /// say there (a row the section already holds with the same evidence
    /// is kept as written, so a second identical run changes nothing; rows
    /// of components that did not test this time stay), then the notes.
    /// Removed when it has nothing left to say.
    fn write_section(&mut self) {
        let range = fvd_section_range(&self.doc);
        // the old rows, by component
        let old_rows: Vec<(String, String)> = range
            .clone()
            .map(|r| {
                r.filter_map(|i| self.doc.line(i))
                    .filter(|l| l.starts_with("| `"))
                    .map(|l| {
                        let name = crate::status_doc::cells(l)
                            .first()
                            .map(|c| plain(c))
                            .unwrap_or_default();
                        (name, l.to_owned())
                    })
                    .collect()
            })
            .unwrap_or_default();
        let same_evidence = |old: &str, new: &SectionRow| {
            let c = crate::status_doc::cells(old);
            let cells: Vec<&str> = c.iter().map(|s| s.trim()).collect();
            let n = new.cells();
            cells.len() == 5 && cells[1] == n[1] && cells[2] == n[2] && cells[4] == n[4]
        };
        let mut lines: Vec<String> = Vec::new();
        for c in &self.input.components {
            let name = one_line(&c.name);
            let old = old_rows.iter().find(|(n, _)| *n == name).map(|(_, l)| l);
            match self.section_rows.iter().find(|r| r.component == name) {
                Some(new) => match old {
                    Some(o) if same_evidence(o, new) => lines.push(o.clone()),
                    _ => lines.push(new.line()),
                },
                None if !c.outcome().tests_the_code() => {
                    if let Some(o) = old {
                        lines.push(o.clone());
                    }
                }
                None => {}
            }
        }
        let mut body = Vec::new();
        if !lines.is_empty() {
            body.push(String::new());
            body.push(SECTION_HEADER.to_owned());
            body.push(SECTION_SEPARATOR.to_owned());
            body.extend(lines);
        }
        if !self.section_notes.is_empty() {
            body.push(String::new());
            body.extend(self.section_notes.iter().cloned());
        }
        if body.is_empty() {
            if let Some(r) = range {
                for i in r.rev() {
                    self.doc.remove(i);
                }
                // the blank line fvd put before its section
                let n = self.doc.lines().len();
                if n > 0 && self.doc.line(n - 1).is_some_and(|l| l.trim().is_empty()) {
                    self.doc.remove(n - 1);
                }
            }
            return;
        }
        let mut section = vec![
            format!("## {FVD_SECTION_TITLE}"),
            FVD_SECTION_BEGIN.to_owned(),
        ];
        section.extend(body);
        section.push(FVD_SECTION_END.to_owned());
        match range {
            Some(r) => {
                let at = r.start;
                let same = r.len() == section.len()
                    && r.clone()
                        .zip(&section)
                        .all(|(i, l)| self.doc.line(i) == Some(l.as_str()));
                if same {
                    return;
                }
                for i in r.rev() {
                    self.doc.remove(i);
                }
                self.doc.insert(at, section);
            }
            None => {
                let n = self.close_fence_at(self.doc.lines().len());
                if self
                    .doc
                    .line(n.wrapping_sub(1))
                    .is_some_and(|l| !l.trim().is_empty())
                {
                    section.insert(0, String::new());
                }
                self.doc.insert(n, section);
            }
        }
    }
}

/// A value as the moved-back record keeps it: in double quotes, with `\`
/// and `"` escaped.
fn quote(v: &str) -> String {
    format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Reads a quoted value at the start of `s`: the value and the rest.
fn unquote(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.strip_prefix('"')?.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?.1),
            '"' => return Some((out, &s[i + 2..])),
            c => out.push(c),
        }
    }
    None
}

/// The fields a moved-back bullet recorded: each key with its old value,
/// `None` for a field the section did not have. Reads the quoted record,
/// and the unquoted one an older fvd wrote (`phase: X; status: Y; …`).
pub fn parse_moved_back(bullet: &str) -> Option<Vec<(String, Option<String>)>> {
    parse_moved(bullet, MOVED_BACK)
}

/// The values a moved-forward bullet keeps (see [`parse_moved_back`]).
pub fn parse_moved_forward(bullet: &str) -> Option<Vec<(String, Option<String>)>> {
    parse_moved(bullet, MOVED_FORWARD)
}

fn parse_moved(bullet: &str, marker: &str) -> Option<Vec<(String, Option<String>)>> {
    let rest = bullet.split_once(marker)?.1;
    let mut out = Vec::new();
    if rest.trim_start().starts_with('"') || rest.trim_start().starts_with(ABSENT) {
        let mut key = "phase".to_owned();
        let mut s = rest.trim_start();
        loop {
            let (value, after) = if let Some(after) = s.strip_prefix(ABSENT) {
                (None, after)
            } else {
                let (v, after) = unquote(s)?;
                (Some(v), after)
            };
            out.push((key.clone(), value));
            let Some(next) = after.strip_prefix("; ") else {
                break;
            };
            let (k, v) = next.split_once(": ")?;
            key = k.trim().to_owned();
            s = v;
        }
        return Some(out);
    }
    // an older fvd's record: unquoted, `; ` between fields
    let rest = rest.rsplit_once(" — ").map_or(rest, |(a, _)| a);
    let mut parts = rest.splitn(4, "; ");
    out.push((
        "phase".to_owned(),
        Some(parts.next().unwrap_or_default().to_owned()),
    ));
    for p in parts {
        if let Some((k, v)) = p
            .split_once(": ")
            .or_else(|| p.strip_suffix(':').map(|k| (k, "")))
        {
            out.push((k.trim().to_owned(), Some(v.trim().to_owned())));
        }
    }
    Some(out)
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
    fn appended_rows_keep_a_padded_tables_columns() {
        let cells = |v: &[&str]| v.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        // a compact table stays compact
        assert_eq!(
            aligned_row("| A | B |", "|---|---|", &cells(&["xyz", ""])),
            "| xyz |  |"
        );
        let header = "| Name      | Result | Notes |";
        let sep = "| --------- | ------ | ----- |";
        assert_eq!(
            aligned_row(header, sep, &cells(&["vae", "pass", "ok"])),
            "| vae       | pass   | ok    |"
        );
        // a wider cell pushes on; the next that fits lines up again
        assert_eq!(
            aligned_row(header, sep, &cells(&["text_encoder", "x", "ok"])),
            "| text_encoder | x   | ok    |"
        );
        assert_eq!(
            aligned_row(header, sep, &cells(&["é", "", "long notes here"])),
            "| é         |        | long notes here |"
        );
    }

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

    #[test]
    fn a_person_s_words_are_kept_beside_fvd_s_and_placeholders_are_replaced() {
        let seg = "[fvd 2026-11-26 run 2 on w1 (cpu): debug_red (regression)]";
        let person = "5 PASSED, no skips, GB200, 2026-07-15";
        let red = result_cell(person, Outcome::Red, "debug_red", seg, false);
        assert_eq!(red, format!("{person} {seg}"));
        assert_eq!(human_part(&red), person);
        // green again: the person's words alone where a pass agrees
        let pass = "[fvd 2026-11-27 run 3 on w1 (cpu): non_skip_pass]";
        assert_eq!(
            result_cell(&red, Outcome::Pass, "non_skip_pass", pass, true),
            person
        );
        assert_eq!(
            result_cell(&red, Outcome::Pass, "non_skip_pass", pass, false),
            format!("{person} {pass}")
        );
        for placeholder in ["", "pending", "`unknown`", "TBD", "`debug_red`", "n/a"] {
            assert_eq!(
                result_cell(placeholder, Outcome::Pass, "non_skip_pass", pass, false),
                "`non_skip_pass`",
                "{placeholder:?}"
            );
        }
        // fvd's own pass word is a person's record too: kept, the red beside it
        assert_eq!(
            result_cell("`non_skip_pass`", Outcome::Red, "debug_red", seg, false),
            format!("`non_skip_pass` {seg}")
        );
        // an older fvd's regression cell gives the person's value back
        assert_eq!(
            human_part("`debug_red` (regression; recorded encode_pass)"),
            "encode_pass"
        );
    }

    #[test]
    fn the_moved_back_record_round_trips_any_value() {
        for v in [
            "Phase 11 (post-parity review and handoff); quality reference published",
            "`a \"quoted\" \\ value`; — with a dash",
            "",
        ] {
            let q = quote(v);
            let (back, rest) = unquote(&q).unwrap();
            assert_eq!(back, v);
            assert_eq!(rest, "");
        }
        let bullet = format!(
            "- fvd 2026-11-26: moved back from phase: {}; status: {}; owner: {ABSENT}; last_updated: {} — `vae` regressed (I013)",
            quote("Phase 11 (x); y"),
            quote("external_ci_gate"),
            quote("2026-07-15")
        );
        assert_eq!(
            parse_moved_back(&bullet).unwrap(),
            vec![
                ("phase".to_owned(), Some("Phase 11 (x); y".to_owned())),
                ("status".to_owned(), Some("external_ci_gate".to_owned())),
                ("owner".to_owned(), None),
                ("last_updated".to_owned(), Some("2026-07-15".to_owned())),
            ]
        );
        // an older fvd's record still reads
        let old = "- fvd 2026-11-26: moved back from phase: `p`; status: `s`; owner: `o`; last_updated: `d` — x";
        assert_eq!(parse_moved_back(old).unwrap().len(), 4);
    }
}
