//! Writes `tests/local_tests/<family>/PORT_STATUS.md` from the store.
//!
//! The file is the porter's: fvd co-authors it through
//! [`fvd_contracts::coauthor`], which changes only the cells fvd owns
//! (a tested component's Parity and Last Result, its evidence segment at the
//! end of the Notes, the issue rows it created and their ids in Open
//! Issues, the escape-hatch rows of its `E###` ids, Current Phase as the
//! contract's rules allow) and leaves every other byte as written. Before a
//! patched file is written, [`fvd_contracts::status_guard`] checks that
//! nothing else changed; a patch that fails the check is refused, not
//! written. A port whose gate refused it before any component ran (P0, P2)
//! writes nothing; a missing file is created only when there is evidence
//! to record.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fvd_contracts::coauthor::{self, BackToP6, ComponentInput, GateInput, Input, Run, Standing};
use fvd_contracts::ids::IdKind;
use fvd_contracts::phase::Phase;
use fvd_contracts::port_status::{
    self, CONVERSION_STATE_KEYS, EscapeHatchRow, PhaseStatus, PortStatus, SUMMARY_KEYS,
};
use fvd_contracts::status_guard;

use fvd_spec::{self, ComponentSpec, PortSpec};
use fvd_store::model::{
    ComponentRow, ComponentStatus, GateEventRow, JobRecord, JobState, PortRow, PortState,
    RecordedVerdict,
};
use fvd_store::states::{EscapeAbout, EscapeStatus, GateOutcome};
use fvd_store::{EscapeRow, Store, StoreError, now_ms};

#[derive(Debug, thiserror::Error)]
pub enum PortStatusError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no port of family {0}")]
    UnknownFamily(String),
    #[error("stored spec of {family} no longer parses: {message}")]
    Spec { family: String, message: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The patch would have changed what fvd does not own: nothing written.
    #[error("{path}: refused to write: {message}")]
    Guard { path: PathBuf, message: String },
    /// The file changed under every plan: nothing was written over it.
    #[error("{path} changed while fvd wrote it, {tries} times in a row; nothing written over it")]
    KeptChanging { path: PathBuf, tries: usize },
    #[error("PORT_STATUS.md of {family}: {source}")]
    Path {
        family: String,
        source: fvd_paths::PathError,
    },
}

/// What [`write()`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// No file was there; fvd wrote one.
    Created(PathBuf),
    /// fvd patched the cells it owns.
    Updated(PathBuf),
    /// The file already says what fvd would write (or nothing tested): untouched.
    Unchanged(PathBuf),
    /// Nothing to write (a gate refusal, no evidence and no file): no file touched.
    Skipped(String),
}

impl std::fmt::Display for Written {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Written::Created(p) => write!(f, "created {}", p.display()),
            Written::Updated(p) => write!(f, "updated {}", p.display()),
            Written::Unchanged(p) => write!(f, "left {} unchanged", p.display()),
            Written::Skipped(why) => write!(f, "wrote no PORT_STATUS.md: {why}"),
        }
    }
}

/// The stored port and its spec.
async fn port_and_spec(
    store: &Store,
    family: &str,
) -> Result<(PortRow, PortSpec), PortStatusError> {
    let port = store
        .port(family)
        .await?
        .ok_or_else(|| PortStatusError::UnknownFamily(family.to_string()))?;
    let spec = fvd_spec::parse(Path::new(&port.spec_path), &port.spec_toml).map_err(|e| {
        PortStatusError::Spec {
            family: family.to_string(),
            message: e.to_string(),
        }
    })?;
    Ok((port, spec))
}

/// What fvd would do to a port's status file now: the file's path, its
/// text (`None` when absent) and the text fvd would leave there (`None`
/// when it would write nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub path: PathBuf,
    pub before: Option<String>,
    pub after: Option<String>,
    /// Why `after` is `None`.
    pub skipped: Option<String>,
}

/// Plans the write of `family`'s status file from the store. `current`
/// (a checkout and its spec as they are now, for `fvd submit --dry-run`)
/// replaces the stored repository and spec when given.
pub async fn plan(
    store: &Store,
    family: &str,
    current: Option<(&Path, &PortSpec)>,
) -> Result<Plan, PortStatusError> {
    let (port, stored) = port_and_spec(store, family).await?;
    let (repo, spec) = current.unwrap_or((Path::new(&port.repo), &stored));
    let components = store.components(family).await?;
    let mut runs = Vec::new();
    for c in &components {
        runs.push(store.jobs_of(family, &c.name).await?);
    }
    let escapes = store.escapes(family).await?;
    let events = store.gate_events(family).await?;
    let by = store
        .port_origin(family)
        .await?
        .map(|o| o.submitted_by)
        .unwrap_or_default();
    // Each component's variant table, when it belongs to its final run.
    let tables = store.variant_tables(family).await?;
    let mut variants = BTreeMap::new();
    for (c, jobs) in components.iter().zip(&runs) {
        let last = jobs.iter().rev().find(|j| j.state == JobState::Finished);
        if let (Some(last), Some(t)) = (last, tables.get(&c.name))
            && t.first().is_some_and(|r| r.red_job_id == last.job_id)
        {
            variants.insert(c.name.clone(), crate::variant_table::evidence_text(t));
        }
    }
    // The GPU model each worker announced, for the evidence's "on what".
    let gpus: BTreeMap<String, String> = store
        .stored_workers()
        .await?
        .into_iter()
        .filter_map(|w| {
            let first = w.gpus.first()?.name.clone();
            Some((w.worker_id, first))
        })
        .collect();
    let path = file_path(repo, spec)?;
    let before = match std::fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(PortStatusError::Read { path, source }),
    };
    let (after, skipped) = match next_text_by(
        before.as_deref(),
        &port,
        spec,
        &components,
        &runs,
        &escapes,
        &variants,
        &gpus,
        &today(),
        &by,
        &events,
    ) {
        Next::Text(t) => (Some(t), None),
        Next::Nothing(why) => (None, Some(why)),
    };
    Ok(Plan {
        path,
        before,
        after,
        skipped,
    })
}

/// Co-authors the port's status file from the store and says what it did.
/// A failure is also recorded in the store (and cleared by the next write
/// that succeeds), so `fvd submit` can say the file is stale and exit 7.
///
/// Every writer of a port's file comes through here (the gate, its
/// components, the orchestrator): the writes of one family are serialised
/// ([`family_lock`]), each goes through a temporary file of its own, and
/// each renames only over the text it planned from (see [`write_file`]).
pub async fn write(store: &Store, family: &str) -> Result<Written, PortStatusError> {
    write_watched(store, family, &|_| {}).await
}

/// [`write`], calling `before_rename` with the file's path after the new
/// text is on disk beside it and before fvd checks the file and renames
/// (where a person's save lands in the race the tests stage).
async fn write_watched(
    store: &Store,
    family: &str,
    before_rename: &(dyn Fn(&Path) + Sync),
) -> Result<Written, PortStatusError> {
    let result = write_file(store, family, before_rename).await;
    let error = match &result {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    };
    // a store that cannot take this either has failed the port already
    if let Err(e) = store.set_status_write_error(family, &error).await {
        tracing::warn!(%family, error = %e, "could not record the outcome of writing PORT_STATUS.md");
    }
    result
}

/// How many times a write plans again because the file changed under it
/// before it gives up (an error: nothing is written over the change).
const MAX_REPLANS: usize = 8;

/// The one lock of each family's status file: held from a write's plan to
/// its rename, so two writers of this process never interleave.
fn family_lock(family: &str) -> std::sync::Arc<tokio::sync::Mutex<()>> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    static LOCKS: OnceLock<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>> = OnceLock::new();
    let mut locks = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    locks.entry(family.to_string()).or_default().clone()
}

/// A file's text as a content hash (`None`: no file), to tell whether the
/// file on disk is still the one a plan was made from.
fn content_hash(text: Option<&str>) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    text.map(|t| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        t.hash(&mut h);
        h.finish()
    })
}

fn read_current(path: &Path) -> Result<Option<String>, PortStatusError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(PortStatusError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Plans, checks and writes under the family's lock. The new text goes to
/// a temporary file unique to this write; just before the rename the file
/// on disk is read again, and only when its content hash is still that of
/// the text the plan was made from is the temporary file renamed over it.
/// Otherwise someone changed it meanwhile (a person saving, an fvd of
/// another process): the temporary file is removed and the write plans
/// again on the new text, so their change is kept and fvd's cells are
/// written into it. A file that keeps changing is an error, never
/// overwritten.
async fn write_file(
    store: &Store,
    family: &str,
    before_rename: &(dyn Fn(&Path) + Sync),
) -> Result<Written, PortStatusError> {
    let lock = family_lock(family);
    let _held = lock.lock().await;
    for _ in 0..MAX_REPLANS {
        let plan = plan(store, family, None).await?;
        let path = plan.path.clone();
        let Some(after) = plan.after else {
            return Ok(Written::Skipped(plan.skipped.unwrap_or_default()));
        };
        let planned_from = content_hash(plan.before.as_deref());
        let written = match &plan.before {
            Some(before) if *before == after => Written::Unchanged(path.clone()),
            Some(before) => {
                // The last line of defence: a patch that touches what fvd
                // does not own is a bug, and the porter's file must not pay
                // for it.
                status_guard::owned_changes(before, &after).map_err(|message| {
                    PortStatusError::Guard {
                        path: path.clone(),
                        message,
                    }
                })?;
                Written::Updated(path.clone())
            }
            None => Written::Created(path.clone()),
        };
        if !matches!(written, Written::Unchanged(_)) {
            if matches!(written, Written::Created(_))
                && let Some(dir) = path.parent()
            {
                std::fs::create_dir_all(dir).map_err(|source| PortStatusError::Write {
                    path: dir.to_path_buf(),
                    source,
                })?;
            }
            let tmp = TempText::write(&path, &after)?;
            before_rename(&path);
            if content_hash(read_current(&path)?.as_deref()) != planned_from {
                tracing::info!(%family, path = %path.display(), "PORT_STATUS.md changed while fvd wrote it; planning again on its new text");
                drop(tmp);
                continue;
            }
            tmp.rename_over(&path)?;
        }
        store
            .set_port_status_path(family, &path.display().to_string())
            .await?;
        return Ok(written);
    }
    let (port, spec) = port_and_spec(store, family).await?;
    Err(PortStatusError::KeptChanging {
        path: file_path(Path::new(&port.repo), &spec)?,
        tries: MAX_REPLANS,
    })
}

/// The new text of a status file, written and synced beside it under a
/// name of its own (`PORT_STATUS.md.fvd-tmp-PID-N`, created new: a link or
/// file already there is never followed or reused), and removed unless it
/// was renamed over the file.
struct TempText {
    path: PathBuf,
    renamed: bool,
}

impl TempText {
    fn write(target: &Path, text: &str) -> Result<Self, PortStatusError> {
        use std::io::Write as _;
        use std::sync::atomic::{AtomicU64, Ordering};
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let err = |source| PortStatusError::Write {
            path: target.to_path_buf(),
            source,
        };
        if fvd_store::chaos::fail_point("status-write") {
            return Err(err(std::io::Error::other(format!(
                "{}=status-write",
                fvd_store::chaos::FAIL_AT_ENV
            ))));
        }
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        loop {
            let seq = SEQ.fetch_add(1, Ordering::Relaxed);
            let path =
                target.with_file_name(format!("{name}.fvd-tmp-{}-{seq}", std::process::id()));
            let mut f = match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(err(e)),
            };
            let tmp = TempText {
                path,
                renamed: false,
            };
            f.write_all(text.as_bytes()).map_err(err)?;
            f.sync_all().map_err(err)?;
            return Ok(tmp);
        }
    }

    /// Renamed over `target` and the folder synced, so neither a crash
    /// nor a power cut leaves half a file or loses the rename.
    fn rename_over(mut self, target: &Path) -> Result<(), PortStatusError> {
        let err = |source| PortStatusError::Write {
            path: target.to_path_buf(),
            source,
        };
        std::fs::rename(&self.path, target).map_err(err)?;
        self.renamed = true;
        if let Some(dir) = target.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(err)?;
        }
        Ok(())
    }
}

impl Drop for TempText {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Where the port's `PORT_STATUS.md` lives: `prep.port_state_file`, or the
/// convention when it is absent or a template placeholder (`<family>`).
/// Either is refused if it would leave the repository or pass through a
/// link (a cloned repository may carry one pointing anywhere).
pub fn file_path(repo: &Path, spec: &PortSpec) -> Result<PathBuf, PortStatusError> {
    let rel = spec
        .prep
        .get("port_state_file")
        .filter(|p| !p.contains('<'))
        .cloned()
        .unwrap_or_else(|| format!("tests/local_tests/{}/PORT_STATUS.md", spec.family));
    fvd_paths::join_under_no_links(repo, rel).map_err(|source| PortStatusError::Path {
        family: spec.family.clone(),
        source,
    })
}

/// The highest `E###` number the port's `PORT_STATUS.md` already uses
/// (rows people wrote included), so an id fvd gives never collides.
pub async fn escape_floor(store: &Store, family: &str) -> Result<u32, PortStatusError> {
    let (port, spec) = port_and_spec(store, family).await?;
    Ok(
        std::fs::read_to_string(file_path(Path::new(&port.repo), &spec)?)
            .map(|text| {
                port_status::import(&text)
                    .0
                    .ids(IdKind::EscapeHatch)
                    .into_iter()
                    .map(|id| id.number)
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0),
    )
}

/// What the status file should become.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// This text (possibly the same as now).
    Text(String),
    /// No file is written, and why.
    Nothing(String),
}

/// The component as the co-author sees it: its identity from the spec and
/// its final run from the store (none while it has no final verdict).
/// `gpus` maps a worker to the GPU model it announced: a run that leased
/// GPUs names it, one that leased none says `cpu`.
pub fn component_input(
    family: &str,
    spec: &ComponentSpec,
    row: Option<&ComponentRow>,
    jobs: &[JobRecord],
    gpus: &BTreeMap<String, String>,
) -> ComponentInput {
    let last = jobs.iter().rev().find(|j| j.state == JobState::Finished);
    // A last run that did not test the code (its environment failed, it was
    // cancelled) leaves the component where its last run that did left
    // it: the file then says what it said, fvd's lines included.
    let tested = jobs
        .iter()
        .rev()
        .find(|j| j.state == JobState::Finished && coauthor::tests_the_code(j.verdict));
    if let (Some(c), Some(j)) = (row, tested)
        && !coauthor::tests_the_code(c.verdict)
        && c.verdict != RecordedVerdict::None
    {
        let stood = ComponentRow {
            status: if j.verdict == RecordedVerdict::NonSkipPass {
                ComponentStatus::NonSkipPass
            } else {
                ComponentStatus::Blocked
            },
            verdict: j.verdict,
            // as the component actor words it: a pass's reason bare, a
            // block's after its verdict
            reason: if j.verdict == RecordedVerdict::NonSkipPass
                || j.reason.starts_with(&format!("{}:", j.verdict))
            {
                j.reason.clone()
            } else {
                format!("{}: {}", j.verdict, j.reason)
            },
            runs: j.run_no,
            worker_id: j.worker_id.clone(),
            ..c.clone()
        };
        return component_input(
            family,
            spec,
            Some(&stood),
            &jobs[..=position(jobs, j)],
            gpus,
        );
    }
    let run = row.filter(|c| c.is_final()).map(|c| {
        let mut reason = c.reason.clone();
        // an agent's runs test its worktree's branch, not the checkout
        if last.is_some_and(|j| j.cwd.contains("/.fvd/worktrees/")) {
            reason.push_str(&format!(" (on branch fvd/{family}/{})", c.name));
        }
        Run {
            verdict: c.verdict,
            reason,
            run_no: last.map_or(c.runs, |j| j.run_no),
            worker: c.worker_id.clone(),
            gpu: match last {
                Some(j) if j.gpus_needed == 0 => "cpu".to_string(),
                Some(j) => gpus.get(&j.worker_id).cloned().unwrap_or_default(),
                None => String::new(),
            },
            variants: String::new(),
            by: String::new(),
        }
    });
    ComponentInput {
        name: spec.name.clone(),
        stage: match spec.stage {
            fvd_spec::Stage::Component => coauthor::Stage::Component,
            fvd_spec::Stage::Pipeline => coauthor::Stage::Pipeline,
            fvd_spec::Stage::Example => coauthor::Stage::Example,
            fvd_spec::Stage::Quality => coauthor::Stage::Quality,
        },
        aliases: spec.aliases.clone(),
        component_type: spec.component_type.clone(),
        parity_tests: spec.parity_tests.clone(),
        command: display_command(spec),
        run,
    }
}

/// Where `j` is among `jobs`.
fn position(jobs: &[JobRecord], j: &JobRecord) -> usize {
    jobs.iter()
        .position(|k| std::ptr::eq(k, j))
        .unwrap_or(jobs.len() - 1)
}

/// ` by NAME` when a credential answered, else nothing.
fn answerer(e: &EscapeRow) -> String {
    if e.answered_by.is_empty() {
        String::new()
    } else {
        format!(" by {}", e.answered_by)
    }
}

/// The escape-hatch row of a question an agent asked; its status follows the answer.
fn escape_row(e: &EscapeRow) -> EscapeHatchRow {
    // The file's Status column knows two words: open, and resolved for
    // every way a question stopped waiting.
    let status = match e.status {
        EscapeStatus::Open => EscapeStatus::Open,
        EscapeStatus::Answered | EscapeStatus::Resolved | EscapeStatus::Withdrawn => {
            EscapeStatus::Resolved
        }
    };
    let branch = fvd_workspace::worktree::branch(&e.family, &e.component);
    let resolution = match (e.status, e.resolved_attempt) {
        // A judge change (issue #39): who kept or dropped it, and where.
        (EscapeStatus::Resolved, _) if e.about == EscapeAbout::Judge => {
            let by = crate::judge_question::approver(e);
            if e.judge_commit.is_empty() {
                coauthor::one_line(&format!(
                    "rejected by {by}: the judge change of attempt {} was dropped from branch `{branch}`; the agent was told ({})",
                    e.attempt, e.answer
                ))
            } else {
                coauthor::one_line(&format!(
                    "approved by {by}: the judge change of attempt {} is commit `{}` on branch `{branch}`, authored by {by}; the verdict was rerun with it ({})",
                    e.attempt,
                    &e.judge_commit[..e.judge_commit.len().min(12)],
                    e.answer
                ))
            }
        }
        (EscapeStatus::Open, _) => {
            format!("waiting: fvd answer {} {} --option N", e.family, e.id)
        }
        (EscapeStatus::Withdrawn, _) => {
            "withdrawn: the port was rerun (fvd submit --rerun)".to_string()
        }
        (_, Some(a)) => coauthor::one_line(&format!(
            "answered{}: {}; given to attempt {a}",
            answerer(e),
            e.answer
        )),
        _ => coauthor::one_line(&format!("answered{}: {}", answerer(e), e.answer)),
    };
    EscapeHatchRow {
        id: e.id.clone(),
        phase: e.phase.clone(),
        decision_type: format!("`{}`", e.decision_type),
        question: coauthor::one_line(&format!("{} (component `{}`)", e.question, e.component)),
        recommended_option: coauthor::one_line(&e.recommended),
        status: format!("`{status}`"),
        resolution,
    }
}

/// The new file text from the store's rows: `existing` patched, a created
/// file, or nothing.
#[allow(clippy::too_many_arguments)]
pub fn next_text(
    existing: Option<&str>,
    port: &PortRow,
    spec: &PortSpec,
    components: &[ComponentRow],
    runs: &[Vec<JobRecord>],
    escapes: &[EscapeRow],
    variants: &BTreeMap<String, String>,
    gpus: &BTreeMap<String, String>,
    date: &str,
) -> Next {
    next_text_by(
        existing,
        port,
        spec,
        components,
        runs,
        escapes,
        variants,
        gpus,
        date,
        "",
        &[],
    )
}

/// [`next_text`] for a port `by` submitted (a credential's name, in each
/// evidence segment: `run N on W for NAME`), with the gate's decisions
/// `events` (where the port is after P6, and why).
#[allow(clippy::too_many_arguments)]
pub fn next_text_by(
    existing: Option<&str>,
    port: &PortRow,
    spec: &PortSpec,
    components: &[ComponentRow],
    runs: &[Vec<JobRecord>],
    escapes: &[EscapeRow],
    variants: &BTreeMap<String, String>,
    gpus: &BTreeMap<String, String>,
    date: &str,
    by: &str,
    events: &[GateEventRow],
) -> Next {
    // A gate refusal before any component ran says nothing about the code.
    let refused_before_runs = matches!(
        port.phase.parse(),
        Ok(Phase::ScopeAndHandoffGate | Phase::EarlyParityScaffolding)
    );
    if port.state == PortState::Blocked && refused_before_runs {
        return Next::Nothing(format!("the gate refused {}; nothing ran", port.phase));
    }
    let input = Input {
        date: date.to_string(),
        components: spec
            .components
            .iter()
            .map(|s| {
                let k = components.iter().position(|c| c.name == s.name);
                let jobs = k.and_then(|k| runs.get(k)).map_or(&[][..], Vec::as_slice);
                let mut input =
                    component_input(&port.family, s, k.map(|k| &components[k]), jobs, gpus);
                if let (Some(run), Some(v)) = (input.run.as_mut(), variants.get(&s.name)) {
                    run.variants = v.clone();
                }
                if let Some(run) = input.run.as_mut() {
                    run.by = by.to_string();
                }
                input
            })
            .collect(),
        escapes: escapes.iter().map(escape_row).collect(),
        gate: gate_input(port, events, escapes),
    };
    match existing {
        Some(text) => Next::Text(coauthor::patch(text, &input)),
        None => {
            let tested = input.components.iter().any(|c| {
                c.run
                    .as_ref()
                    .is_some_and(|r| coauthor::tests_the_code(r.verdict))
            });
            if !tested && input.escapes.is_empty() {
                return Next::Nothing("no run tested the code yet".into());
            }
            Next::Text(coauthor::create(&skeleton(port, spec, date), &input))
        }
    }
}

/// Where the gate has the port: the store's phase and state, the latest
/// time a red pipeline sent it back to P6 for a component (P6's latest
/// `reopened` whose conditions name the component and the module; fixed
/// once P7 passed after it), and the escape hatch a deferred P10 names.
pub fn gate_input(port: &PortRow, events: &[GateEventRow], escapes: &[EscapeRow]) -> GateInput {
    let standing = match port.state {
        PortState::Running => Standing::Running,
        PortState::AskUser => Standing::AskUser,
        PortState::Environment => Standing::Environment,
        PortState::Waiting => Standing::Waiting,
        PortState::Blocked => Standing::Blocked,
        _ => Standing::Ended,
    };
    let p6 = Phase::ComponentParityDebug.id();
    let p7 = Phase::PipelineStagesAndVariants.id();
    let back_to_p6 = events
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, e)| e.outcome == GateOutcome::Reopened && e.phase == p6)
        .find_map(|(k, e)| {
            let (component, reason) = e
                .conditions
                .iter()
                .find_map(|c| crate::pipeline_words::moved_back(c))?;
            let fixed = events[k + 1..]
                .iter()
                .any(|l| l.phase == p7 && l.outcome == GateOutcome::Passed);
            Some(BackToP6 {
                component,
                reason,
                fixed,
            })
        });
    let p10 = Phase::QualityRegression.id();
    let quality_deferred = events
        .iter()
        .rev()
        .find(|e| e.phase == p10)
        .filter(|e| e.outcome == GateOutcome::Pending)
        .and_then(|e| {
            escapes
                .iter()
                .rev()
                .filter(|x| x.phase == p10)
                .find(|x| e.conditions.iter().any(|c| names_id(c, &x.id)))
                .map(|x| x.id.clone())
        });
    GateInput {
        phase: port.phase.parse().ok(),
        standing,
        back_to_p6,
        quality_deferred,
    }
}

/// Whether `text` names the id `id` as a whole word.
fn names_id(text: &str, id: &str) -> bool {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| w == id)
}

/// A new file: the contract's sections with what the spec knows.
fn skeleton(port: &PortRow, spec: &PortSpec, date: &str) -> PortStatus {
    let mut s = PortStatus::new(&display_name(&port.family), &port.family);
    for key in SUMMARY_KEYS {
        let v = spec.prep.get(key).map_or("unknown", String::as_str);
        s.summary.set(key, format!("`{}`", coauthor::one_line(v)));
    }
    let converts = spec.prep.get("needs_conversion").map(String::as_str) != Some("no");
    for key in CONVERSION_STATE_KEYS {
        let v = match key {
            "source_layout" => spec
                .prep
                .get("source_layout")
                .map_or("unknown".to_string(), |v| coauthor::one_line(v)),
            "strict_load_status" if converts => "not_run".into(),
            "strict_load_status" => "not_required".into(),
            _ if converts => "unknown".into(),
            _ => "none".into(),
        };
        s.conversion_state.set(key, format!("`{v}`"));
    }
    s.set_phase(
        Phase::ComponentParityDebug,
        PhaseStatus::InProgress,
        "orchestrator",
        date,
    );
    s
}

/// The command as a person would type it from the repository's root: the
/// literal environment (`{repo}`, the checkout a run tests, as `.`), then
/// the argv without the JUnit report fvd adds.
pub fn display_command(spec: &ComponentSpec) -> String {
    let env = spec
        .set_env
        .iter()
        .map(|(k, v)| format!("{k}={}", expand_repo(v)));
    let argv = spec
        .argv()
        .into_iter()
        .filter(|a| !a.contains("{junitxml}"))
        .map(|a| if a.contains(' ') { format!("'{a}'") } else { a });
    env.chain(argv).collect::<Vec<_>>().join(" ")
}

/// `{repo}` as a person at the repository's root types it: `.`
/// (`{repo}/src` is `./src`).
fn expand_repo(v: &str) -> String {
    v.replace("{repo}", ".")
}

fn display_name(family: &str) -> String {
    family
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Today's date (UTC) as YYYY-MM-DD, from the civil-from-days algorithm.
fn today() -> String {
    let days = now_ms().div_euclid(86_400_000);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use fvd_contracts::status_guard::owned_changes;

    /// A finished port's status file in the project's own words (shared
    /// with the contracts crate's tests).
    const FINISHED: &str = include_str!("../../contracts/src/tests/status_files/finished.md");
    const DATE: &str = "2026-11-26";

    const SPEC: &str = r#"
[prep]
model_family = "widget_world"
workload_types = "T2V"
official_ref = "https://example.org/widget-world"
official_ref_dir = "WidgetWorld/"
hf_weights_path = "none"
local_weights_dir = "official_weights/widget_world"
source_layout = "raw_official"
local_tests_readme = "tests/local_tests/widget_world/README.md"
needs_conversion = "no"

[[component]]
name = "transformer"
type = "dit"
parity_test = "tests/local_tests/widget_world/test_widget_transformer_parity.py"
coverage_scope = "both"

[[component]]
name = "vae"
type = "vae"
parity_test = "tests/local_tests/widget_world/test_widget_vae_parity.py"
coverage_scope = "both"

[[component]]
name = "text_encoder"
type = "encoder"
parity_test = "tests/local_tests/widget_world/test_widget_text_encoder_parity.py"
coverage_scope = "both"

[[component]]
name = "stack"
type = "dit"
aliases = ["ar stack", "ar_stack"]
parity_test = ["tests/local_tests/widget_world/test_widget_ar_conversion.py", "tests/local_tests/widget_world/test_widget_ar_parity.py"]
coverage_scope = "both"
set_env = { PYTHONPATH = "{repo}" }
"#;

    fn spec() -> PortSpec {
        fvd_spec::parse(Path::new("port.toml"), SPEC).unwrap()
    }

    fn port(state: &str, phase: &str) -> PortRow {
        PortRow {
            family: "widget_world".into(),
            state: state.parse().unwrap(),
            phase: phase.into(),
            ..PortRow::default()
        }
    }

    /// Component rows as the store holds them; `(name, status, verdict, reason)`.
    fn rows(r: &[(&str, &str, &str, &str)]) -> (Vec<ComponentRow>, Vec<Vec<JobRecord>>) {
        let c: Vec<ComponentRow> = r
            .iter()
            .map(|(name, status, verdict, reason)| ComponentRow {
                name: (*name).into(),
                status: status.parse().unwrap(),
                verdict: verdict.parse().unwrap(),
                reason: (*reason).into(),
                runs: 1,
                last_run: 1,
                worker_id: "w1".into(),
            })
            .collect();
        let jobs = c
            .iter()
            .map(|c| {
                vec![JobRecord {
                    component: c.name.clone(),
                    run_no: 1,
                    state: JobState::Finished,
                    verdict: c.verdict,
                    ..JobRecord::default()
                }]
            })
            .collect();
        (c, jobs)
    }

    fn next(existing: Option<&str>, port: &PortRow, r: &[(&str, &str, &str, &str)]) -> Next {
        let (c, j) = rows(r);
        next_text(
            existing,
            port,
            &spec(),
            &c,
            &j,
            &[],
            &BTreeMap::new(),
            &BTreeMap::new(),
            DATE,
        )
    }

    fn text(n: Next) -> String {
        match n {
            Next::Text(t) => t,
            Next::Nothing(why) => panic!("nothing written: {why}"),
        }
    }

    #[test]
    fn nothing_that_did_not_test_the_code_changes_the_file() {
        let blocked = port("blocked", "P7");
        for r in [
            // an environment failure, a cancel, a lost worker, a refused cleanup
            (
                "vae",
                "blocked",
                "environment",
                "environment: No module named 'torch'",
            ),
            (
                "vae",
                "blocked",
                "cancelled",
                "cancelled: the port was cancelled",
            ),
            (
                "vae",
                "blocked",
                "error",
                "error: error:cancelled: run cancelled before it finished",
            ),
            (
                "vae",
                "blocked",
                "infra_error",
                "infra_error: worker w1 lost on every retry",
            ),
            (
                "vae",
                "blocked",
                "cleanup_refused",
                "cleanup gate: untracked x",
            ),
            // not final yet
            ("vae", "running", "", ""),
            ("vae", "ask_user", "debug_red", "debug_red: t: off"),
            ("vae", "pending", "", ""),
        ] {
            assert_eq!(
                text(next(Some(FINISHED), &blocked, &[r])),
                FINISHED,
                "{r:?}"
            );
        }
        // a P0 or P2 refusal writes nothing, and never creates the file,
        // even with verdicts of an earlier run in the store
        let earlier = [("vae", "blocked", "debug_red", "debug_red: t: off")];
        for phase in ["P0", "P2"] {
            let refused = port("blocked", phase);
            assert!(matches!(
                next(Some(FINISHED), &refused, &earlier),
                Next::Nothing(_)
            ));
            assert!(matches!(next(None, &refused, &earlier), Next::Nothing(_)));
        }
        // nothing tested and no file: none is created
        let env = [("vae", "blocked", "environment", "environment: no torch")];
        assert!(matches!(next(None, &blocked, &env), Next::Nothing(_)));
    }

    #[test]
    fn a_regression_from_the_store_rows_is_recorded_once() {
        let r = [
            ("transformer", "non_skip_pass", "non_skip_pass", "2 passed"),
            (
                "vae",
                "blocked",
                "debug_red",
                "debug_red: test_decode: max abs diff 0.41 > 0.01",
            ),
            ("stack", "non_skip_pass", "non_skip_pass", "7 passed"),
        ];
        let after = text(next(Some(FINISHED), &port("blocked", "P7"), &r));
        let changes = owned_changes(FINISHED, &after).unwrap();
        assert!(
            after.contains(
                "| encode_decode_parity_pass [fvd 2026-11-26 run 1 on w1 (cpu): debug_red (regression)] | I003 |"
            ),
            "{after}"
        );
        assert!(
            after.contains("- status: `blocked`\n- owner: `component:vae`"),
            "{after}"
        );
        assert!(after.contains("the final handoff above is superseded: `vae` regressed (I003)"));
        assert_eq!(changes.added.len(), 3, "{changes:?}");
        // the two-file command row is found by the alias; the command with
        // its literal environment differs from the human's, so it is noted
        let stack = after
            .lines()
            .find(|l| l.starts_with("| ar stack |"))
            .unwrap();
        assert!(stack.ends_with("[fvd 2026-11-26 run 1 on w1 (cpu): non_skip_pass — 7 passed; command `PYTHONPATH=. python3 -m pytest tests/local_tests/widget_world/test_widget_ar_conversion.py tests/local_tests/widget_world/test_widget_ar_parity.py -q -p no:cacheprovider`] |"), "{stack}");
        // the same rows again: byte-identical
        assert_eq!(text(next(Some(&after), &port("blocked", "P7"), &r)), after);
    }

    #[test]
    fn a_created_file_follows_the_contract_with_no_finding() {
        let r = [
            ("transformer", "non_skip_pass", "non_skip_pass", "3 passed"),
            (
                "vae",
                "blocked",
                "scaffold_skip",
                "scaffold_skip: skipped: could not import 'private_ops'",
            ),
            (
                "text_encoder",
                "blocked",
                "environment",
                "environment: no torch",
            ),
        ];
        let t = text(next(None, &port("blocked", "P7"), &r));
        assert!(t.starts_with("# Widget World Port Status"), "{t}");
        let (ps, findings) = port_status::import(&t);
        assert!(findings.is_empty(), "{findings:?}\n{t}");
        let comps = ps.components();
        assert_eq!(comps.len(), 4, "every spec component is listed: {t}");
        assert_eq!(comps[0].parity.as_deref(), Some("`non_skip_pass`"));
        assert_eq!(comps[1].parity.as_deref(), Some("`scaffold_skip`"));
        assert_eq!(comps[2].parity.as_deref(), Some("`not_started`"));
        assert_eq!(
            ps.phase_text().as_deref(),
            Some(Phase::ComponentParityDebug.slug().as_str())
        );
        assert_eq!(ps.phase_status(), Some(PhaseStatus::Blocked));
        assert!(t.contains("| I001 | P6 | vae | blocker |"), "{t}");
        assert!(t.contains("- conversion_script: `none`"), "{t}");
        // written again from the same rows: unchanged
        assert_eq!(text(next(Some(&t), &port("blocked", "P7"), &r)), t);
    }

    #[test]
    fn escape_rows_follow_the_answer_and_keep_people_rows() {
        let r = [("transformer", "non_skip_pass", "non_skip_pass", "3 passed")];
        let (c, j) = rows(&r);
        let mut e = EscapeRow {
            family: "widget_world".into(),
            id: "E002".into(),
            component: "vae".into(),
            attempt: 1,
            phase: "P6".into(),
            decision_type: "ambiguity".into(),
            question: "which shift?".into(),
            recommended: "3.0".into(),
            options: vec!["3.0".into(), "1.0".into()],
            safe_default: "3.0".into(),
            status: EscapeStatus::Open,
            ..EscapeRow::default()
        };
        let people = "| E001 | P1 | `scope` | skip audio? | yes | `resolved` | skipped |";
        let with_people = FINISHED.replace(
            "| ID | Phase | Decision Type | Question | Recommended Option | Status | Resolution |\n|---|---|---|---|---|---|---|",
            &format!("| ID | Phase | Decision Type | Question | Recommended Option | Status | Resolution |\n|---|---|---|---|---|---|---|\n{people}"),
        );
        let first = match next_text(
            Some(&with_people),
            &port("ask_user", "P6"),
            &spec(),
            &c,
            &j,
            std::slice::from_ref(&e),
            &BTreeMap::new(),
            &BTreeMap::new(),
            DATE,
        ) {
            Next::Text(t) => t,
            Next::Nothing(w) => panic!("{w}"),
        };
        owned_changes(&with_people, &first).unwrap();
        assert!(first.contains(&format!("{people}\n| E002 | P6 | `ambiguity` | which shift? (component `vae`) | 3.0 | `open` | waiting: fvd answer widget_world E002 --option N |")), "{first}");
        e.status = EscapeStatus::Resolved;
        e.answer = "3.0".into();
        e.resolved_attempt = Some(2);
        let second = match next_text(
            Some(&first),
            &port("ask_user", "P6"),
            &spec(),
            &c,
            &j,
            &[e],
            &BTreeMap::new(),
            &BTreeMap::new(),
            DATE,
        ) {
            Next::Text(t) => t,
            Next::Nothing(w) => panic!("{w}"),
        };
        let changes = owned_changes(&first, &second).unwrap();
        assert_eq!(changes.changed.len(), 1, "{changes:?}");
        assert!(second.contains(people), "{second}");
        assert!(
            second.contains("| `resolved` | answered: 3.0; given to attempt 2 |"),
            "{second}"
        );
        let (status, findings) = port_status::import(&second);
        assert_eq!(status.ids(IdKind::EscapeHatch).len(), 2);
        assert!(
            findings.iter().all(|f| !f.field.contains("Escape")),
            "{findings:?}"
        );
    }

    #[tokio::test]
    async fn write_through_the_store_says_what_it_did() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        let file = repo.join("tests/local_tests/widget_world/PORT_STATUS.md");
        let store = Store::open_path(&repo.join("state.db")).await.unwrap();
        let names: Vec<String> = spec().components.iter().map(|c| c.name.clone()).collect();
        let row = PortRow {
            family: "widget_world".into(),
            repo: repo.display().to_string(),
            spec_path: "port.toml".into(),
            spec_toml: SPEC.into(),
            state: PortState::Blocked,
            phase: "P0".into(),
            port_status_path: String::new(),
            commit: String::new(),
        };
        store.create_port(&row, &names).await.unwrap();
        // a P0 refusal: no file is created
        let w = write(&store, "widget_world").await.unwrap();
        assert!(matches!(w, Written::Skipped(_)), "{w}");
        assert!(!file.exists());

        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, FINISHED).unwrap();
        store
            .set_port_state("widget_world", PortState::Blocked, "P7")
            .await
            .unwrap();
        store
            .set_component(
                "widget_world",
                "vae",
                ComponentStatus::Blocked,
                RecordedVerdict::Environment,
                "environment: no torch",
                "w1",
            )
            .await
            .unwrap();
        let w = write(&store, "widget_world").await.unwrap();
        assert_eq!(w, Written::Unchanged(file.clone()));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), FINISHED);
        assert!(w.to_string().contains("unchanged"), "{w}");

        store
            .set_component(
                "widget_world",
                "vae",
                ComponentStatus::Blocked,
                RecordedVerdict::DebugRed,
                "debug_red: t: off by 0.4",
                "w1",
            )
            .await
            .unwrap();
        assert_eq!(
            write(&store, "widget_world").await.unwrap(),
            Written::Updated(file.clone())
        );
        let once = std::fs::read_to_string(&file).unwrap();
        owned_changes(FINISHED, &once).unwrap();
        assert_eq!(
            write(&store, "widget_world").await.unwrap(),
            Written::Unchanged(file.clone())
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), once);
        let port = store.port("widget_world").await.unwrap().unwrap();
        assert_eq!(port.port_status_path, file.display().to_string());
    }

    #[test]
    fn the_status_file_stays_inside_the_repository() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        let family = spec().family;
        let with = |file: &str| {
            let mut s = spec();
            s.prep.insert("port_state_file".into(), file.into());
            file_path(repo, &s)
        };
        assert_eq!(
            file_path(repo, &spec()).unwrap(),
            repo.join(format!("tests/local_tests/{family}/PORT_STATUS.md"))
        );
        assert_eq!(
            with("tests/local_tests/<family>/PORT_STATUS.md").unwrap(),
            repo.join(format!("tests/local_tests/{family}/PORT_STATUS.md"))
        );
        for bad in ["../../outside.md", "/tmp/outside.md"] {
            let err = with(bad).unwrap_err().to_string();
            assert!(err.contains("must stay inside"), "{bad}: {err}");
        }
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("docs")).unwrap();
        let err = with("docs/PORT_STATUS.md").unwrap_err().to_string();
        assert!(err.contains("docs is a symbolic link"), "{err}");
    }

    /// The temporary files next to `file`.
    fn temporaries(file: &Path) -> Vec<String> {
        std::fs::read_dir(file.parent().unwrap())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".fvd-tmp"))
            .collect()
    }

    #[test]
    fn each_write_has_its_own_temporary_file_and_leaves_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("PORT_STATUS.md");
        std::fs::write(&path, "old\n").unwrap();
        let (a, b) = (
            TempText::write(&path, "a\n").unwrap(),
            TempText::write(&path, "b\n").unwrap(),
        );
        assert_ne!(a.path, b.path, "two writes, two files");
        assert_eq!(temporaries(&path).len(), 2);
        drop(a);
        b.rename_over(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "b\n");
        assert!(temporaries(&path).is_empty(), "{:?}", temporaries(&path));
        // a name already taken (a link planted there) is skipped, never
        // followed
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "theirs\n").unwrap();
        let next = format!(
            "PORT_STATUS.md.fvd-tmp-{}-{}",
            std::process::id(),
            TempText::write(&path, "x\n")
                .map(|t| {
                    let n: u64 = t
                        .path
                        .to_string_lossy()
                        .rsplit('-')
                        .next()
                        .unwrap()
                        .parse()
                        .unwrap();
                    n + 1
                })
                .unwrap()
        );
        std::os::unix::fs::symlink(&outside, dir.path().join(&next)).unwrap();
        TempText::write(&path, "newer\n")
            .unwrap()
            .rename_over(&path)
            .unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "theirs\n");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "newer\n");
        // a folder that is not there: an error naming the file
        let gone = dir.path().join("gone/PORT_STATUS.md");
        let err = TempText::write(&gone, "x\n").err().unwrap().to_string();
        assert!(
            err.contains("cannot write") && err.contains("PORT_STATUS.md"),
            "{err}"
        );
    }

    /// A port whose file records the finished port, and the store behind it.
    async fn finished_port(repo: &Path) -> (Store, PathBuf) {
        let file = repo.join("tests/local_tests/widget_world/PORT_STATUS.md");
        let store = Store::open_path(&repo.join("state.db")).await.unwrap();
        let names: Vec<String> = spec().components.iter().map(|c| c.name.clone()).collect();
        let row = PortRow {
            family: "widget_world".into(),
            repo: repo.display().to_string(),
            spec_path: "port.toml".into(),
            spec_toml: SPEC.into(),
            state: PortState::Blocked,
            phase: "P7".into(),
            port_status_path: String::new(),
            commit: String::new(),
        };
        store.create_port(&row, &names).await.unwrap();
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, FINISHED).unwrap();
        (store, file)
    }

    /// Two writers of one port's file at once, and a person who saves the
    /// file after the first planned its write and before it renamed: the
    /// person's line stays, both writers' evidence is there, only fvd's
    /// cells changed, and no temporary file is left.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_writers_and_a_person_s_save_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (store, file) = finished_port(dir.path()).await;
        let family = "widget_world";
        store
            .set_component(
                family,
                "vae",
                ComponentStatus::Blocked,
                RecordedVerdict::DebugRed,
                "debug_red: t::vae: off by 0.4",
                "w1",
            )
            .await
            .unwrap();
        const NOTE: &str = "- 2026-11-27: a porter's note, saved while fvd wrote";
        let human = FINISHED.to_string() + NOTE + "\n";
        let saves = std::sync::atomic::AtomicU32::new(0);
        let calls = std::sync::atomic::AtomicU32::new(0);
        let person = |path: &Path| {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // The person saves once, in the middle of fvd's first write.
            if saves.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                let mut text = std::fs::read_to_string(path).unwrap();
                text.push_str(NOTE);
                text.push('\n');
                std::fs::write(path, text).unwrap();
            }
        };
        let other = async {
            // The second writer's news: the transformer went red too.
            store
                .set_component(
                    family,
                    "transformer",
                    ComponentStatus::Blocked,
                    RecordedVerdict::DebugRed,
                    "debug_red: t::transformer: off by 0.2",
                    "w2",
                )
                .await
                .unwrap();
            write(&store, family).await
        };
        let (first, second) = tokio::join!(write_watched(&store, family, &person), other);
        let (first, second) = (first.unwrap(), second.unwrap());
        assert!(
            matches!(first, Written::Updated(_)) && !matches!(second, Written::Skipped(_)),
            "{first} / {second}"
        );
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains(NOTE), "the person's save was lost:\n{text}");
        assert!(
            text.contains("t::vae: off by 0.4") && text.contains("t::transformer: off by 0.2"),
            "a writer's evidence was lost:\n{text}"
        );
        // Every change but the person's line is a cell fvd owns.
        owned_changes(&human, &text).unwrap();
        assert!(
            calls.load(std::sync::atomic::Ordering::SeqCst) >= 2,
            "the write whose file changed planned again"
        );
        assert!(temporaries(&file).is_empty(), "{:?}", temporaries(&file));
        assert_eq!(store.status_write_error(family).await.unwrap(), "");
        // Written again with nothing new: not a byte changes.
        assert_eq!(
            write(&store, family).await.unwrap(),
            Written::Unchanged(file.clone())
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    }

    /// A file that changes under every plan is never written over: the
    /// write gives up with an error that names it, and keeps it in the
    /// store.
    #[tokio::test]
    async fn a_file_that_keeps_changing_is_not_written_over() {
        let dir = tempfile::tempdir().unwrap();
        let (store, file) = finished_port(dir.path()).await;
        store
            .set_component(
                "widget_world",
                "vae",
                ComponentStatus::Blocked,
                RecordedVerdict::DebugRed,
                "debug_red: t::vae: off by 0.4",
                "w1",
            )
            .await
            .unwrap();
        let n = std::sync::atomic::AtomicU32::new(0);
        let busy = |path: &Path| {
            let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let text = std::fs::read_to_string(path).unwrap();
            std::fs::write(path, format!("{text}- save {i}\n")).unwrap();
        };
        let err = write_watched(&store, "widget_world", &busy)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("PORT_STATUS.md changed while fvd wrote it"),
            "{err}"
        );
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!text.contains("off by 0.4"), "fvd wrote over a change");
        assert!(
            text.ends_with(&format!("- save {}\n", MAX_REPLANS - 1)),
            "{text}"
        );
        assert!(temporaries(&file).is_empty());
        assert!(
            store
                .status_write_error("widget_world")
                .await
                .unwrap()
                .contains("changed while fvd wrote it")
        );
    }

    /// The gate's decisions as the co-author reads them: where the port is,
    /// the component a red pipeline sent it back to (fixed once P7 passed
    /// after), and the escape hatch a deferred P10 names.
    #[test]
    fn the_gate_s_decisions_say_where_the_port_is_and_why() {
        let ev = |phase: &str, outcome: GateOutcome, why: &str| GateEventRow {
            phase: phase.into(),
            outcome,
            conditions: vec![why.into()],
            at_ms: 0,
        };
        let mut events = vec![
            ev("P6", GateOutcome::Passed, ""),
            ev("P7", GateOutcome::Entered, ""),
            ev(
                "P7",
                GateOutcome::Refused,
                "pipeline_parity is debug_red; its first divergence, vae.decoder.up.0, is in component vae's modules: back to P6 for vae",
            ),
            ev(
                "P6",
                GateOutcome::Reopened,
                "component vae: the pipeline parity test diverges first at vae.decoder.up.0, one of its modules, although its own parity test passes",
            ),
        ];
        let g = gate_input(&port("running", "P6"), &events, &[]);
        assert_eq!(g.phase, Some(Phase::ComponentParityDebug));
        assert_eq!(g.standing, Standing::Running);
        assert_eq!(
            g.back_to_p6,
            Some(BackToP6 {
                component: "vae".into(),
                reason: coauthor::BackReason::Diverged {
                    module: "vae.decoder.up.0".into()
                },
                fixed: false,
            })
        );
        // a conversion retry reopens P5, not a pipeline's move back
        assert!(
            gate_input(&port("running", "P6"), &events[..3], &[])
                .back_to_p6
                .is_none()
        );
        events.push(ev("P6", GateOutcome::Passed, ""));
        events.push(ev("P7", GateOutcome::Passed, ""));
        events.push(ev(
            "P10",
            GateOutcome::Pending,
            "quality_x_similarity (t.py) skipped (no refs); quality regression deferred by ana in answer to E002",
        ));
        let hatch = |id: &str| EscapeRow {
            id: id.into(),
            phase: "P10".into(),
            ..EscapeRow::default()
        };
        let g = gate_input(
            &port("waiting", "P11"),
            &events,
            &[hatch("E001"), hatch("E002")],
        );
        assert_eq!(g.phase, Some(Phase::PostParityReviewAndHandoff));
        assert_eq!(g.standing, Standing::Waiting);
        assert!(g.back_to_p6.is_some_and(|b| b.fixed));
        assert_eq!(g.quality_deferred.as_deref(), Some("E002"));
    }

    #[test]
    fn today_is_a_date() {
        let d = today();
        assert_eq!(d.len(), 10);
        assert!(d.starts_with("20"), "{d}");
    }
}
