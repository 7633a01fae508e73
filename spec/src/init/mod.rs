//! `fvd init`: the port spec written from what a FastVideo checkout already
//! records about a family, so a porter starts from the status file, the
//! README and the test files instead of a blank `port.toml`.
//!
//! Pure: [`infer`] takes the texts (and a reader for the repo files they
//! name) and returns the TOML text and a summary; the CLI does the IO.
//!
//! What comes from where:
//! - `[prep]`: `PORT_STATUS.md`'s Summary and header lines, then the
//!   README's two-column field tables and `key: value` lines; Conversion
//!   State (or a conversion section) decides `needs_conversion`; open rows
//!   of Open Questions and Escape Hatches; the matrix gives
//!   `components_seen`; `.gitignore` the ignored reference and weight
//!   folders. A value the contract allows as `unknown` is written so, with
//!   what was searched; a decision nothing records is an explicit
//!   `"<fill in: …>"` that P0 refuses, with a comment saying where it comes
//!   from.
//! - `[[component]]`: one per Component Matrix row (pipeline rows aside)
//!   and per Parity Commands row running pytest on test files, joined by
//!   identity (the normalised label, else the component a test file's name
//!   names). Without a status file, the README's component/test tables and
//!   the test files' names (`test_<family>_<component>[_parity].py`).
//! - Every test file of the family ends in a component or in the closing
//!   comment with the reason it is not a parity test.

mod command;
mod markdown;
mod prep;
mod pyfile;
mod render;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use fvd_contracts::port_status::{PortStatus, import};

use crate::SpecError;
use command::{Parsed, Pytest};
use markdown::{Label, MdTable, ident, py_paths, strip_md};
use render::type_of;

/// What the CLI read from the checkout.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The family: `tests/local_tests/<family>`.
    pub family: &'a str,
    /// The name of the checkout's folder (`FastVideo`). An absolute path
    /// through a folder of that name (or `FastVideo`, `fastvideo-…`) is read
    /// as a path of the porter's checkout.
    pub repo_name: &'a str,
    /// `tests/local_tests/<family>/PORT_STATUS.md`, when present.
    pub status: Option<&'a str>,
    /// `tests/local_tests/<family>/README.md`, when present.
    pub readme: Option<&'a str>,
    /// The checkout's `.gitignore`, when present.
    pub gitignore: Option<&'a str>,
    /// Repo-relative paths of the family folder's `test_*.py` files.
    pub tests: &'a [String],
}

/// The spec text and what the CLI reports about it.
#[derive(Debug, Clone)]
pub struct Inferred {
    pub toml: String,
    pub summary: Summary,
}

/// What `fvd init` prints after writing the spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Each component's name and test files.
    pub components: Vec<(String, Vec<String>)>,
    /// Values left as `"<fill in: …>"`, with their line in the spec.
    pub placeholders: Vec<Placeholder>,
    /// Test files no component runs, with the reason.
    pub unused_tests: Vec<Unused>,
    /// Rows and commands that are not components, with the reason.
    pub unused_rows: Vec<Unused>,
    /// The pipeline's and quality's tests it wired (`pipeline parity: …`).
    pub later: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder {
    /// 1-based line in the spec.
    pub line: usize,
    /// `prep.official_env_status`, `component vae: coverage_scope`.
    pub field: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unused {
    pub what: String,
    pub reason: String,
}

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("family {0:?} is not a lowercase identifier ([a-z0-9_])")]
    Family(String),
    /// A bug of init: what it writes must always parse.
    #[error("the spec fvd init built does not parse: {0}")]
    Spec(#[from] SpecError),
}

/// Component types of the `component_context` contract.
const TYPES: &[&str] = &[
    "dit",
    "vae",
    "encoder",
    "scheduler",
    "conditioner",
    "upsampler",
    "vocoder",
    "generic",
];

/// Refuses a family that is not a lowercase identifier (`[a-z0-9_]`).
pub fn check_family(family: &str) -> Result<(), InitError> {
    if family.is_empty() || ident(family) != family {
        return Err(InitError::Family(family.to_string()));
    }
    Ok(())
}

/// Builds the spec of `input.family`. `read` returns the text of a
/// repo-relative file, `None` when it is not in the checkout.
pub fn infer(
    input: &Input<'_>,
    read: &dyn Fn(&str) -> Option<String>,
) -> Result<Inferred, InitError> {
    let family = input.family;
    check_family(family)?;
    let status = input.status.map(|t| import(t).0);
    let cx = Cx {
        input,
        read,
        dir: format!("tests/local_tests/{family}"),
        status: status.as_ref(),
    };
    let mut plan = cx.components();
    let prep = cx.prep(&plan);
    let mut toml = cx.render(&prep, &plan);
    let later = cx.later_phases(&mut plan.unused_tests);
    toml.text.push_str(&later.toml);
    let spec_path = format!("{}/port.toml", cx.dir);
    crate::parse(Path::new(&spec_path), &toml.text)?;
    let summary = Summary {
        components: plan
            .cands
            .iter()
            .map(|c| (c.name.clone(), c.tests.clone()))
            .collect(),
        placeholders: toml.placeholders,
        unused_tests: plan.unused_tests.clone(),
        unused_rows: plan.unused_rows.iter().map(|(u, _)| u.clone()).collect(),
        later: later.lines,
    };
    Ok(Inferred {
        toml: toml.text,
        summary,
    })
}

/// The `[pipeline]` and `[quality]` tables `init` wrote, and their lines
/// for the summary.
struct Later {
    toml: String,
    lines: Vec<String>,
}

impl Cx<'_> {
    /// The family's pipeline smoke and parity tests
    /// (`test_<family>_pipeline_smoke.py`, `…_pipeline_parity.py`, among
    /// the test files no component took) and its quality regression test
    /// (`fastvideo/tests/ssim/test_<family>_similarity.py`, where FastVideo
    /// keeps them): wired as `[pipeline]` and `[quality]`, and no longer
    /// listed as unused.
    fn later_phases(&self, unused: &mut Vec<Unused>) -> Later {
        let family = self.input.family;
        // `test_F_pipeline_parity.py`, or a variant's
        // (`test_F_causal_fast_pipeline_parity.py`): the family's own name
        // first, else the first variant.
        let mut take = |suffix: &str| -> Option<String> {
            let exact = format!("test_{family}_{suffix}");
            let named = |u: &Unused, exact_only: bool| {
                let n = pyfile::file_name(&u.what);
                n == exact
                    || (!exact_only
                        && n.starts_with(&format!("test_{family}_"))
                        && n.ends_with(&format!("_{suffix}")))
            };
            let i = unused
                .iter()
                .position(|u| named(u, true))
                .or_else(|| unused.iter().position(|u| named(u, false)))?;
            Some(unused.remove(i).what)
        };
        let smoke = take("pipeline_smoke.py");
        let parity = take("pipeline_parity.py");
        // where FastVideo keeps it, or where a status row names it
        let ssim = format!("fastvideo/tests/ssim/test_{family}_similarity.py");
        let quality = take("similarity.py").or_else(|| (self.read)(&ssim).map(|_| ssim));
        let example = self.example(&[&smoke, &parity]);
        let quoted = |s: &str| toml::Value::String(s.to_string()).to_string();
        let mut toml = String::new();
        let mut lines = Vec::new();
        if smoke.is_some() || parity.is_some() || example.is_some() {
            toml.push_str(
                "\n# P7 runs these once every component passes (docs/spec.md).\n[pipeline]\n",
            );
            for (key, t) in [("smoke_test", &smoke), ("parity_test", &parity)] {
                if let Some(t) = t {
                    toml.push_str(&format!("{key} = {}\n", quoted(t)));
                    lines.push(format!("pipeline {}: {t}", key.trim_end_matches("_test")));
                }
            }
            if let Some((path, from)) = &example {
                toml.push_str(&format!(
                    "# P9's last step, read, not run yet: {from}\nexample = [\"python\", {}]\n",
                    quoted(path)
                ));
                lines.push(format!("pipeline example: python {path}"));
            }
        }
        if let Some(q) = &quality {
            toml.push_str(&format!(
                "\n# P10's quality regression: read, not run yet.\n[quality]\ntests = [{}]\n",
                quoted(q)
            ));
            lines.push(format!("quality: {q}"));
        }
        Later { toml, lines }
    }
}

impl Cx<'_> {
    /// The family's basic example (P9's last step) and where it was found:
    /// `examples/inference/basic/basic_<family>.py`, a variant's
    /// (`basic_<family>_dev.py` beside `test_<family>_dev_pipeline_parity.py`),
    /// or one the status file or README names, when the checkout has it.
    fn example(&self, pipeline_tests: &[&Option<String>]) -> Option<(String, String)> {
        const DIR: &str = "examples/inference/basic";
        let family = self.input.family;
        let mut tries = vec![(
            format!("{DIR}/basic_{family}.py"),
            "the family's example, where FastVideo keeps it".to_string(),
        )];
        for t in pipeline_tests.iter().copied().flatten() {
            let name = pyfile::file_name(t);
            let variant = name
                .strip_prefix(&format!("test_{family}_"))
                .and_then(|r| r.split_once("_pipeline_"))
                .map(|(v, _)| v)
                .filter(|v| !v.is_empty());
            if let Some(v) = variant {
                tries.push((
                    format!("{DIR}/basic_{family}_{v}.py"),
                    format!("the example of the variant {name} tests"),
                ));
            }
        }
        for (file, text) in self.all_texts() {
            for w in text.split(|c: char| c.is_whitespace() || matches!(c, '`' | '(' | ')' | '"')) {
                let named = pyfile::file_name(w).starts_with(&format!("basic_{family}"));
                if w.starts_with("examples/") && w.ends_with(".py") && named {
                    tries.push((w.to_string(), format!("the example {file} runs")));
                }
            }
        }
        tries.into_iter().find(|(p, _)| self.text(p).is_some())
    }
}

struct Cx<'a> {
    input: &'a Input<'a>,
    read: &'a dyn Fn(&str) -> Option<String>,
    /// `tests/local_tests/<family>`.
    dir: String,
    status: Option<&'a PortStatus>,
}

/// A component in the making.
#[derive(Debug, Clone)]
struct Cand {
    name: String,
    /// Every label a row gave it (matrix, Parity Commands, README).
    labels: Vec<Label>,
    /// The matrix Type cell, markdown stripped.
    type_cell: Option<String>,
    /// Repo-relative test files.
    tests: Vec<String>,
    /// Where it was found (`Component Matrix row `vae``).
    from: Vec<String>,
    /// The first pytest command that runs it.
    cmd: Option<Pytest>,
    notes: Vec<String>,
}

impl Cand {
    fn new(label: Label, from: String) -> Self {
        Cand {
            name: label.name(),
            labels: vec![label],
            type_cell: None,
            tests: Vec::new(),
            from: vec![from],
            cmd: None,
            notes: Vec::new(),
        }
    }

    fn add_tests(&mut self, tests: impl IntoIterator<Item = String>) {
        for t in tests {
            if !self.tests.contains(&t) {
                self.tests.push(t);
            }
        }
    }

    fn absorb(&mut self, other: Cand) {
        for l in other.labels {
            if !self.labels.contains(&l) {
                self.labels.push(l);
            }
        }
        if self.type_cell.is_none() {
            self.type_cell = other.type_cell;
        }
        self.add_tests(other.tests);
        self.from.extend(other.from);
        if self.cmd.is_none() {
            self.cmd = other.cmd;
        }
        self.notes.extend(other.notes);
    }
}

/// The components and everything that did not become one.
#[derive(Debug, Default)]
struct Plan {
    cands: Vec<Cand>,
    /// Matrix / README rows and commands that are not components, each
    /// with the command it ran, if any.
    unused_rows: Vec<(Unused, Option<String>)>,
    unused_tests: Vec<Unused>,
    /// The labels of the status file's component table, pipeline rows
    /// included (`components_seen`).
    matrix_labels: Vec<String>,
}

/// Whether a row is the pipeline rather than a component: its Type (or,
/// without one, its name) says `pipeline`.
fn is_pipeline_type(c: &Cand) -> bool {
    let t = c
        .type_cell
        .as_deref()
        .map(|t| ident(&Label::new(t).base))
        .unwrap_or_default();
    t == "pipeline" || (t.is_empty() && c.name == "pipeline")
}

impl Cx<'_> {
    fn text(&self, path: &str) -> Option<String> {
        (self.read)(path)
    }

    /// The tests a component runs: its files, each narrowed to the node ids
    /// its command selects (`file.py::test_x[fp32]`), so components sharing
    /// a file run only their own tests.
    fn selection(&self, c: &Cand) -> Vec<String> {
        let mut out = Vec::new();
        for t in &c.tests {
            let ids: Vec<String> = c
                .cmd
                .iter()
                .flat_map(|p| p.node_ids.iter())
                .filter_map(|id| {
                    let (f, rest) = id.split_once("::")?;
                    (self.resolve(f, "").0 == *t).then(|| format!("{t}::{rest}"))
                })
                .collect();
            if ids.is_empty() {
                out.push(t.clone());
            } else {
                out.extend(ids);
            }
        }
        out
    }

    /// A path as a row writes it, made repo-relative. A bare file name is
    /// in the family folder; `./x` and `../x` are relative to `base`.
    fn resolve(&self, raw: &str, base: &str) -> (String, Option<String>) {
        let raw = raw.trim().trim_matches('`');
        if raw.starts_with('/') {
            return match checkout_rel(raw, self.input.repo_name) {
                Some(rel) => (
                    rel,
                    Some(format!("{raw} is a path of the porter's checkout")),
                ),
                None => (
                    raw.to_string(),
                    Some(format!("{raw} is outside the checkout")),
                ),
            };
        }
        let joined = if !raw.contains('/') {
            format!("{}/{raw}", self.dir)
        } else if raw.starts_with("./") || raw.starts_with("../") {
            if base.is_empty() {
                raw.to_string()
            } else {
                format!("{base}/{raw}")
            }
        } else {
            raw.to_string()
        };
        (normalise_path(&joined), None)
    }

    /// Every component, from the status file or (without one) the README
    /// and the test files' names.
    fn components(&self) -> Plan {
        let mut plan = Plan::default();
        let mut claimed_elsewhere: BTreeMap<String, String> = BTreeMap::new();
        if let Some(st) = self.status {
            self.rows_of_matrix(st, &mut plan);
            self.rows_of_parity_commands(st, &mut plan, &mut claimed_elsewhere);
        } else if let Some(readme) = self.input.readme {
            self.rows_of_readme(readme, &mut plan, &mut claimed_elsewhere, true);
        }
        // rows still without a test: the README's test tables, then the
        // file names of the family folder
        if self.status.is_some()
            && let Some(readme) = self.input.readme
        {
            self.rows_of_readme(readme, &mut plan, &mut claimed_elsewhere, false);
        }
        // the README's pytest commands, with the variables that gate them,
        // for tests anywhere in the checkout
        if let Some(readme) = self.input.readme {
            self.readme_commands(readme, &mut plan, &mut claimed_elsewhere);
            readme_variables(readme, &mut plan);
        }
        for c in plan.cands.iter_mut().filter(|c| c.tests.is_empty()) {
            let by_name: Vec<String> = self
                .input
                .tests
                .iter()
                .filter(|t| {
                    pyfile::component_of_file(self.input.family, t).as_deref() == Some(&c.name)
                })
                .cloned()
                .collect();
            if !by_name.is_empty() {
                c.from.push("test file named after it".into());
                c.add_tests(by_name);
            }
        }
        self.leftovers(&mut plan, &claimed_elsewhere);
        // rows that select the very same tests are one component: it runs
        // them once, and its aliases name every row
        let mut merged: Vec<Cand> = Vec::new();
        for c in std::mem::take(&mut plan.cands) {
            // the same tests under the same variables (gates differ: two runs)
            let key = |c: &Cand| {
                (
                    self.selection(c),
                    c.cmd
                        .as_ref()
                        .map(|p| p.assignments.clone())
                        .unwrap_or_default(),
                )
            };
            let sel = key(&c);
            match merged
                .iter_mut()
                .find(|m| !sel.0.is_empty() && key(m) == sel)
            {
                Some(m) => {
                    m.notes.push(format!(
                        "{} selects the same tests; one component runs them once",
                        c.from.join("; ")
                    ));
                    let keep = m.cmd.clone();
                    m.absorb(c);
                    m.cmd = keep;
                }
                None => merged.push(c),
            }
        }
        plan.cands = merged;
        // names the spec accepts: non-empty and unique
        let mut seen = BTreeSet::new();
        for (i, c) in plan.cands.iter_mut().enumerate() {
            if c.name.is_empty() {
                c.name = format!("component_{}", i + 1);
            }
            let base = c.name.clone();
            let mut n = 2;
            while !seen.insert(c.name.clone()) {
                c.name = format!("{base}_{n}");
                n += 1;
            }
        }
        plan
    }

    fn rows_of_matrix(&self, st: &PortStatus, plan: &mut Plan) {
        let matrix = &st.component_matrix.table;
        let table = if !matrix.rows.is_empty() {
            Some(MdTable {
                heading: "Component Matrix".into(),
                header: matrix.header.clone(),
                rows: matrix.rows.clone(),
            })
        } else {
            // a status file with its own component table (`## Component
            // Status`) instead of the contract's matrix
            markdown::tables(self.input.status.unwrap_or_default())
                .into_iter()
                .find(|t| {
                    !t.heading.eq_ignore_ascii_case("issues and blockers")
                        && t.column_where(|h| h == "component").is_some()
                        && (t.column_where(|h| h == "type").is_some()
                            || t.column_where(|h| h.contains("test")).is_some())
                })
        };
        let Some(table) = table else { return };
        let Some(col) = table.column_where(|h| h == "component") else {
            return;
        };
        let type_col = table.column_where(|h| h == "type");
        let test_col = table.column_where(|h| h.contains("test"));
        let mut rows = Vec::new();
        for i in 0..table.rows.len() {
            let label = Label::new(table.cell(i, col));
            if label.text.is_empty() {
                continue;
            }
            plan.matrix_labels.push(label.text.clone());
            let mut c = Cand::new(
                label.clone(),
                format!("{} row `{}`", table.heading, label.text),
            );
            c.type_cell = type_col.map(|t| strip_md(table.cell(i, t)));
            if let Some(t) = test_col {
                let files = py_paths(table.cell(i, t))
                    .iter()
                    .map(|p| self.resolve(p, "").0)
                    .collect::<Vec<_>>();
                c.add_tests(files);
            }
            if is_pipeline_type(&c) {
                plan.unused_rows.push((
                    Unused {
                        what: format!("{} row `{}`", table.heading, label.text),
                        reason: "type pipeline: the pipeline is P7's ([pipeline], its smoke and parity tests), not a component".into(),
                    },
                    None,
                ));
                continue;
            }
            rows.push(c);
        }
        plan.cands.extend(disambiguate(rows));
    }

    fn rows_of_parity_commands(
        &self,
        st: &PortStatus,
        plan: &mut Plan,
        claimed_elsewhere: &mut BTreeMap<String, String>,
    ) {
        let t = &st.parity_commands.table;
        let (Some(scope_col), Some(cmd_col)) = (t.column("Scope"), t.column("Command")) else {
            return;
        };
        for row in &t.rows {
            let cell = |c: usize| row.get(c).map_or("", String::as_str);
            let scope = Label::new(cell(scope_col));
            let what = format!("Parity Commands row `{}`", scope.text);
            for line in command_texts(cell(cmd_col)) {
                let Some(p) = pytest_on_files(&line, &what, plan) else {
                    continue;
                };
                self.parity_command(&scope, &what, line, p, plan, claimed_elsewhere);
            }
        }
    }

    /// Adds the pytest command `line` (parsed as `p`) of the Parity
    /// Commands row `what`, whose scope is `scope`, to `plan`: joined to
    /// the component it names or whose test files it runs, else a component
    /// of its own, else a row that is not a component (its test files,
    /// when none is a parity test, then `claimed_elsewhere`).
    fn parity_command(
        &self,
        scope: &Label,
        what: &str,
        line: String,
        p: Pytest,
        plan: &mut Plan,
        claimed_elsewhere: &mut BTreeMap<String, String>,
    ) {
        let mut notes = Vec::new();
        let files: Vec<String> = p
            .files
            .iter()
            .map(|f| {
                let (rel, note) = self.resolve(f, "");
                notes.extend(note);
                rel
            })
            .collect();
        // a scope that is the template's generic word (`component`)
        // names no component: the row joins by its test files only
        let generic = matches!(
            scope.name().as_str(),
            "component" | "components" | "scope" | "all" | "test" | "tests"
        );
        let joined = self.joined(plan, scope, generic, &files);
        let mut c = Cand::new(scope.clone(), what.to_string());
        if generic {
            // not a label of the component it joins, nor a name: a
            // row of its own is named by its test file
            let by_file = files
                .iter()
                .find_map(|f| pyfile::component_of_file(self.input.family, f))
                .unwrap_or_default();
            c.labels = if by_file.is_empty() {
                Vec::new()
            } else {
                vec![Label::new(&by_file)]
            };
            c.name = by_file;
        }
        c.add_tests(files.clone());
        c.cmd = Some(p);
        c.notes = notes;
        match joined {
            Some(i) => {
                let target = &mut plan.cands[i];
                if target.cmd.is_some() && target.cmd != c.cmd {
                    target.notes.push(format!(
                        "{what} runs it too; its files are added, the first row's command is kept"
                    ));
                    c.cmd = None;
                }
                target.absorb(c);
            }
            None => match self.not_a_component(&c, scope, what, &files, claimed_elsewhere) {
                Some(reason) => plan.unused_rows.push((
                    Unused {
                        what: what.to_string(),
                        reason,
                    },
                    Some(line),
                )),
                None => plan.cands.push(c),
            },
        }
    }

    /// The index in `plan` of the component a Parity Commands row joins:
    /// the one its scope names (unless `generic`), else the first whose
    /// name a test file of the row names.
    fn joined(&self, plan: &Plan, scope: &Label, generic: bool, files: &[String]) -> Option<usize> {
        let name = if generic { String::new() } else { scope.name() };
        let identity = if generic {
            String::new()
        } else {
            scope.identity()
        };
        plan.cands
            .iter()
            .position(|c| {
                (!name.is_empty() && c.name == name)
                    || (!identity.is_empty() && c.labels.iter().any(|l| l.identity() == identity))
            })
            .or_else(|| {
                plan.cands.iter().position(|c| {
                    files.iter().any(|f| {
                        pyfile::component_of_file(self.input.family, f).as_deref()
                            == Some(c.name.as_str())
                    })
                })
            })
    }

    /// Why the Parity Commands row `what`, which joins no component, is no
    /// component `c` of its own: none of its test `files` is a parity test
    /// (each then goes into `claimed_elsewhere`, with why), or its scope
    /// names no component or the pipeline; `None` when it is one.
    fn not_a_component(
        &self,
        c: &Cand,
        scope: &Label,
        what: &str,
        files: &[String],
        claimed_elsewhere: &mut BTreeMap<String, String>,
    ) -> Option<String> {
        let reasons: Vec<Option<&str>> = files
            .iter()
            .map(|f| pyfile::not_parity(f, self.text(f).as_deref()))
            .collect();
        if type_of(&scope.text).is_none() && reasons.iter().all(Option::is_some) {
            let why = files
                .iter()
                .zip(&reasons)
                .map(|(f, r)| {
                    let r = r.unwrap_or_default();
                    claimed_elsewhere
                        .entry(f.clone())
                        .or_insert_with(|| format!("{r} ({what})"));
                    format!("{}: {r}", pyfile::file_name(f))
                })
                .collect::<Vec<_>>()
                .join("; ");
            Some(format!("not a component parity test ({why})"))
        } else if c.name.is_empty() || c.name == "pipeline" {
            Some(if c.name.is_empty() {
                "its scope names no component".into()
            } else {
                "the pipeline: the pipeline is P7's ([pipeline], its smoke and parity tests), not a component"
                    .into()
            })
        } else {
            None
        }
    }

    /// README tables with a Component and a Test column. `primary`: they
    /// make components (no status file); otherwise they only give test files
    /// to components that have none.
    fn rows_of_readme(
        &self,
        readme: &str,
        plan: &mut Plan,
        claimed_elsewhere: &mut BTreeMap<String, String>,
        primary: bool,
    ) {
        let mut rows = Vec::new();
        for t in markdown::tables(readme) {
            let (Some(col), Some(test_col)) = (
                t.column_where(|h| h == "component"),
                t.column_where(|h| h.contains("test")),
            ) else {
                continue;
            };
            for i in 0..t.rows.len() {
                let label = Label::new(t.cell(i, col));
                let files: Vec<String> = py_paths(t.cell(i, test_col))
                    .iter()
                    .map(|p| self.resolve(p, &self.dir).0)
                    .fold(Vec::new(), |mut acc, f| {
                        if !acc.contains(&f) {
                            acc.push(f);
                        }
                        acc
                    });
                if label.text.is_empty() || files.is_empty() {
                    continue;
                }
                let what = format!("README.md `{}` row `{}`", t.heading, label.text);
                if !primary {
                    if let Some(c) = plan
                        .cands
                        .iter_mut()
                        .find(|c| c.tests.is_empty() && c.name == label.name())
                    {
                        c.from.push(what);
                        c.add_tests(files);
                    }
                    continue;
                }
                let reasons: Vec<Option<&str>> = files
                    .iter()
                    .map(|f| pyfile::not_parity(f, self.text(f).as_deref()))
                    .collect();
                let pipeline = label.name() == "pipeline";
                if pipeline
                    || (type_of(&label.text).is_none() && reasons.iter().all(Option::is_some))
                {
                    for (f, r) in files.iter().zip(&reasons) {
                        let r =
                            r.unwrap_or("pipeline test (pipeline phases are not component parity)");
                        claimed_elsewhere
                            .entry(f.clone())
                            .or_insert_with(|| format!("{r} ({what})"));
                    }
                    plan.unused_rows.push((
                        Unused {
                            what,
                            reason: "not a component parity test".into(),
                        },
                        None,
                    ));
                    continue;
                }
                let mut c = Cand::new(label, what);
                c.add_tests(files);
                rows.push(c);
            }
        }
        if primary {
            plan.cands.extend(disambiguate(rows));
        }
    }

    /// The pytest commands of the README's fenced blocks: each parity test
    /// they run (anywhere in the checkout) goes to the component without a
    /// test whose words it shares most (name, labels, type; the test's file
    /// name and the values of the command's variables), best matches first,
    /// or becomes a component named by the file (`test_<family>_<x>_parity.py`);
    /// the command's variables come with it, as the gates that make the
    /// test run instead of skip.
    fn readme_commands(
        &self,
        readme: &str,
        plan: &mut Plan,
        claimed_elsewhere: &mut BTreeMap<String, String>,
    ) {
        let runs = self.readme_runs(readme, claimed_elsewhere);
        if runs.is_empty() {
            return;
        }
        // every (score, component, run), best first
        let cand_words = cand_words(plan);
        let mut pairs: Vec<(usize, usize, usize)> = Vec::new();
        for (ci, c) in plan.cands.iter().enumerate() {
            if !c.tests.is_empty() {
                continue;
            }
            for (ri, (rel, _, words)) in runs.iter().enumerate() {
                let named = pyfile::component_of_file(self.input.family, rel).as_deref()
                    == Some(c.name.as_str());
                let shared = words.intersection(&cand_words[ci]).count();
                let score = if named { 100 } else { shared };
                if score > 0 {
                    pairs.push((score, ci, ri));
                }
            }
        }
        pairs.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        let mut cand_done = BTreeSet::new();
        let mut run_done = BTreeSet::new();
        for &(score, ci, ri) in &pairs {
            if cand_done.contains(&ci) || run_done.contains(&ri) {
                continue;
            }
            // a tie for this component between runs of different files is
            // not a match anyone can check: left for the porter
            let tie = pairs.iter().any(|&(s, c, r)| {
                s == score
                    && c == ci
                    && r != ri
                    && !run_done.contains(&r)
                    && runs[r].0 != runs[ri].0
            });
            cand_done.insert(ci);
            if tie {
                plan.cands[ci].notes.push(format!(
                    "README.md runs several tests that fit it equally ({score} shared word(s)); pick its parity test"
                ));
                continue;
            }
            run_done.insert(ri);
            let (rel, p, _) = &runs[ri];
            let c = &mut plan.cands[ci];
            c.from.push(format!(
                "README.md command running {} (shares {score} word(s) with it)",
                pyfile::file_name(rel)
            ));
            c.add_tests([rel.clone()]);
            c.cmd = Some(p.clone());
        }
        // parity tests no component took: components of their own, named by
        // their file
        let taken: BTreeSet<String> = plan.cands.iter().flat_map(|c| c.tests.clone()).collect();
        for (ri, (rel, p, _)) in runs.iter().enumerate() {
            if run_done.contains(&ri) || taken.contains(rel) {
                continue;
            }
            let Some(name) = pyfile::component_of_file(self.input.family, rel) else {
                continue;
            };
            if !pyfile::file_name(rel).ends_with("_parity.py") {
                continue;
            }
            let mut c = Cand::new(
                Label::new(&name),
                format!("README.md command running {}", pyfile::file_name(rel)),
            );
            c.add_tests([rel.clone()]);
            c.cmd = Some(p.clone());
            plan.cands.push(c);
        }
    }

    /// The parity tests the README's fenced pytest commands run, each with
    /// the command (narrowed to that file) and its words (the file's name
    /// and the values of the command's variables); the other test files
    /// they run go into `claimed_elsewhere`, with why.
    fn readme_runs(
        &self,
        readme: &str,
        claimed_elsewhere: &mut BTreeMap<String, String>,
    ) -> Vec<(String, Pytest, BTreeSet<String>)> {
        // (file, the command that runs it, its words)
        let mut runs: Vec<(String, Pytest, BTreeSet<String>)> = Vec::new();
        for line in command::fenced_commands(readme) {
            let Parsed::Pytest(p) = command::parse(&line) else {
                continue;
            };
            for f in &p.files {
                let (rel, _) = self.resolve(f, "");
                if self.text(&rel).is_none() {
                    continue;
                }
                if let Some(r) = pyfile::not_parity(&rel, self.text(&rel).as_deref()) {
                    claimed_elsewhere
                        .entry(rel.clone())
                        .or_insert_with(|| format!("{r} (README.md command)"));
                    continue;
                }
                let mut words = words_of(&strip_family(pyfile::file_name(&rel), self.input.family));
                for (_, v) in &p.assignments {
                    words.extend(words_of(v));
                }
                let mut one = p.clone();
                one.files = vec![f.clone()];
                one.node_ids.retain(|id| id.starts_with(&format!("{f}::")));
                runs.push((rel, one, words));
            }
        }
        runs
    }

    /// Test files of the family that no row named: a component when the
    /// name says so, else listed with the reason.
    fn leftovers(&self, plan: &mut Plan, claimed_elsewhere: &BTreeMap<String, String>) {
        let used: BTreeSet<String> = plan.cands.iter().flat_map(|c| c.tests.clone()).collect();
        let mut listed: BTreeSet<String> = BTreeSet::new();
        for t in self.input.tests {
            if used.contains(t) {
                continue;
            }
            let text = self.text(t);
            if let Some(r) = claimed_elsewhere.get(t) {
                plan.unused_tests.push(Unused {
                    what: t.clone(),
                    reason: r.clone(),
                });
                listed.insert(t.clone());
                continue;
            }
            let reason = pyfile::not_parity(t, text.as_deref());
            let named = pyfile::component_of_file(self.input.family, t);
            let parity_named = pyfile::file_name(t).ends_with("_parity.py");
            match (reason, named) {
                (None, Some(name)) if self.status.is_none() || parity_named => {
                    match plan.cands.iter_mut().find(|c| c.name == name) {
                        Some(c) if self.status.is_none() => {
                            c.from.push(format!("test file {}", pyfile::file_name(t)));
                            c.add_tests([t.clone()]);
                        }
                        Some(_) => {
                            plan.unused_tests.push(Unused {
                                what: t.clone(),
                                reason: format!(
                                    "named like a parity test of `{name}`, which PORT_STATUS.md runs with other files"
                                ),
                            });
                        }
                        None => {
                            let mut c = Cand::new(
                                Label::new(&name),
                                format!("the name of {}", pyfile::file_name(t)),
                            );
                            if self.status.is_some() {
                                c.notes
                                    .push("PORT_STATUS.md does not name this test file".into());
                            }
                            c.add_tests([t.clone()]);
                            plan.cands.push(c);
                        }
                    }
                }
                (Some(r), _) => plan.unused_tests.push(Unused {
                    what: t.clone(),
                    reason: r.into(),
                }),
                (None, None) => plan.unused_tests.push(Unused {
                    what: t.clone(),
                    reason: format!(
                        "its name (test_{}.py or other) names no component and no row names it",
                        self.input.family
                    ),
                }),
                (None, Some(_)) => plan.unused_tests.push(Unused {
                    what: t.clone(),
                    reason: "PORT_STATUS.md names it nowhere and its name does not end in _parity"
                        .into(),
                }),
            }
            listed.insert(t.clone());
        }
        // test files outside the family folder that rows named
        for (t, r) in claimed_elsewhere {
            if !listed.contains(t) && !used.contains(t) {
                plan.unused_tests.push(Unused {
                    what: t.clone(),
                    reason: r.clone(),
                });
            }
        }
    }
}

/// The lowercase words of a name, label or value (`Qwen3-VL text` gives
/// `qwen3`, `vl`, `text`), without those every test file shares.
/// The variables (`FASTVIDEO_ATTENTION_BACKEND=TORCH_SDPA`) of a README
/// fenced pytest command that runs exactly a component's tests, for a
/// component whose own command sets none: they are how the README runs
/// it, so they become its `set_env`.
fn readme_variables(readme: &str, plan: &mut Plan) {
    for line in command::fenced_commands(readme) {
        let Parsed::Pytest(p) = command::parse(&line) else {
            continue;
        };
        if p.assignments.is_empty() || p.files.is_empty() {
            continue;
        }
        let files: BTreeSet<String> = p.files.iter().map(|f| normalise_path(f)).collect();
        let runs = |c: &Cand| c.tests.iter().cloned().collect::<BTreeSet<_>>() == files;
        for c in plan.cands.iter_mut().filter(|c| runs(c)) {
            match &mut c.cmd {
                Some(cmd) if cmd.assignments.is_empty() => {
                    cmd.assignments = p.assignments.clone();
                    c.notes
                        .push("README.md runs it with these variables".into());
                }
                Some(_) => {}
                None => {
                    c.cmd = Some(p.clone());
                    c.from.push("README.md command running its tests".into());
                }
            }
        }
    }
}

fn words_of(s: &str) -> BTreeSet<String> {
    s.to_ascii_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| {
            w.len() > 1 && !matches!(*w, "test" | "tests" | "parity" | "py" | "the" | "and")
        })
        .map(str::to_owned)
        .collect()
}

/// A test file's name without `test_<family>_`.
fn strip_family(file: &str, family: &str) -> String {
    let stem = file.strip_suffix(".py").unwrap_or(file);
    let stem = stem.strip_prefix("test_").unwrap_or(stem);
    stem.strip_prefix(family)
        .map(|r| r.trim_start_matches('_'))
        .unwrap_or(stem)
        .to_string()
}

/// Rows whose names collide are one component, unless the first words of
/// their parenthesised qualifiers differ (`vae (video)`, `vae (audio)`):
/// then the first keeps the name and the others become `<word>_<name>`.
fn disambiguate(rows: Vec<Cand>) -> Vec<Cand> {
    let mut words_of: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &rows {
        let w = r.labels[0].qualifier_word();
        let ws = words_of.entry(r.name.clone()).or_default();
        if !ws.contains(&w) {
            ws.push(w);
        }
    }
    let mut out: Vec<Cand> = Vec::new();
    for mut r in rows {
        let ws = &words_of[&r.name];
        let w = r.labels[0].qualifier_word();
        if ws.len() > 1 && ws.first() != Some(&w) {
            r.name = ident(&format!("{w}_{}", r.name));
        }
        match out.iter_mut().find(|o| o.name == r.name) {
            Some(o) => o.absorb(r),
            None => out.push(r),
        }
    }
    out
}

/// The words of each component of `plan`, in order: its name's, its
/// labels' and its type's.
fn cand_words(plan: &Plan) -> Vec<BTreeSet<String>> {
    plan.cands
        .iter()
        .map(|c| {
            let mut w = words_of(&c.name);
            for l in &c.labels {
                w.extend(words_of(&l.text));
            }
            if let Some(t) = c.type_cell.as_deref().and_then(type_of) {
                w.insert(t.to_string());
            }
            w
        })
        .collect()
}

/// The pytest command `line` of the Parity Commands row `what` when it runs
/// named test files; else `None`, with the row listed in `plan` as not a
/// component and why.
fn pytest_on_files(line: &str, what: &str, plan: &mut Plan) -> Option<Pytest> {
    let reason = match command::parse(line) {
        Parsed::Pytest(p) if !p.files.is_empty() => return Some(p),
        Parsed::Pytest(_) => "runs pytest on a folder, not on named test files",
        Parsed::Other => "does not run pytest on test files",
    };
    plan.unused_rows.push((
        Unused {
            what: what.to_string(),
            reason: reason.into(),
        },
        Some(line.to_string()),
    ));
    None
}

/// The commands of a Command cell: each backticked span, or the whole cell.
fn command_texts(cell: &str) -> Vec<String> {
    if cell.contains('`') {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    } else {
        let s = cell.trim();
        if s.is_empty() {
            Vec::new()
        } else {
            vec![s.to_string()]
        }
    }
}

/// `a/./b/../c` → `a/c`; no leading `./`.
fn normalise_path(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|l| *l != "..") {
                    parts.pop();
                } else {
                    parts.push("..");
                }
            }
            s => parts.push(s),
        }
    }
    parts.join("/")
}

/// The part of an absolute path below the porter's checkout: after the
/// first folder named like a checkout (`repo_name`, `FastVideo`,
/// `fastvideo-…`); `None` when no folder is.
fn below_checkout(path: &str, repo_name: &str) -> Option<String> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let at = parts.iter().position(|p| {
        (!repo_name.is_empty() && *p == repo_name)
            || p.eq_ignore_ascii_case("fastvideo")
            || p.to_ascii_lowercase().starts_with("fastvideo-")
    })?;
    Some(parts[at + 1..].join("/"))
}

/// A test file's absolute path made repo-relative: below the checkout's
/// folder, else from `tests/local_tests/` on.
fn checkout_rel(path: &str, repo_name: &str) -> Option<String> {
    below_checkout(path, repo_name).or_else(|| {
        path.find("/tests/local_tests/")
            .map(|i| path[i + 1..].to_string())
    })
}

#[cfg(test)]
mod tests;
