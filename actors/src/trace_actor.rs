//! `TraceActor`: one per port (spawned by the gate when some component has
//! a `[component.trace]` table), of the diagnoser shape ([`crate::diagnosis`]).
//! When such a component's run is `debug_red`, its route
//! ([`crate::red_run`]) brings the classified run here first, before its
//! variants and before the component blocks or starts an agent attempt. The
//! actor reruns the parity test with activation
//! tracing on (`FASTVIDEO_TRACE_*`, the spec's layer regex), gets the rank
//! files back from the worker over the job stream, merges and compares
//! them with [`fvd_trace::compare()`], and reruns with the narrowed regex of
//! the first divergent block ([`fvd_trace::Report::drill_down`]) until the
//! first divergent leaf module is known or the spec's `depth` is spent.
//! Every step's report is stored with the investigation; the red run goes
//! on with a one-line summary ([`RedRun::trace_summary`]), which the
//! component puts in its verdict. While it runs, the actor tells the
//! component which step runs; the component writes its row.
//!
//! Traced reruns are jobs of the component name `<name>#trace`: they go
//! through the scheduler (leases, fencing, logs) like any run, but never
//! count as the component's runs and never change its verdict, because
//! theirs is a diagnosis, not a parity verdict.
//!
//! A step whose comparison is not a verdict on the port ends the
//! investigation instead of drilling into it: nothing compared (no module
//! in common, an empty trace) is outcome `error` with reason
//! `nothing_compared`, never "no divergence"; a comparator check that
//! distrusts the comparison ([`fvd_trace::Signature`]: a dumper's layer
//! shift, inputs that differ) is outcome `untrusted` with the check's
//! evidence and what to check. Other checks ride along in the summary, so
//! they reach the blocked reason and the agent's packet.
//!
//! The actor never fails on an investigation's error (a missing file, a
//! malformed trace, a lost worker): the investigation ends with outcome
//! `error` and the red run goes on with that as the summary. A failed
//! actor would leave components waiting for an answer that never comes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use fvd_telemetry::spans;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Span;

use crate::diagnosis::{self, DiagnosisArgs, DiagnosisMsg, Rerun, RunCode};
use crate::red_run::{self, RedRun};
use crate::scheduler::JobEvent;
use fvd_spec::trace_spec::TraceSpec;
use fvd_store::messages::{CollectedFile, JobReport};
use fvd_store::model::ComponentStatus;
use fvd_store::traces::StepTransport;

/// Suffix of the component name traced reruns are recorded under.
pub const TRACE_JOB_SUFFIX: &str = "#trace";
/// A stored report over this size keeps only the rows around the first
/// divergence (a whole-model trace can hold hundreds of thousands of rows).
pub const MAX_STORED_REPORT_BYTES: usize = 2 * 1024 * 1024;

#[derive(Debug)]
pub struct TraceActor;

#[derive(Debug)]
pub struct TraceState {
    args: DiagnosisArgs,
    /// Where gathered files are written: beside the database.
    root: PathBuf,
    /// Investigations in flight, by the job id of their current rerun.
    running: HashMap<String, Inquiry>,
}

/// One investigation in flight.
#[derive(Debug)]
struct Inquiry {
    id: i64,
    /// The red run under investigation, passed on at its end.
    run: Box<RedRun>,
    trace: TraceSpec,
    /// The red run's code: reruns test the same.
    code: RunCode,
    span: Span,
    step: u32,
    /// Port-side regexes traced so far, in order: the drill path.
    tried: Vec<String>,
    reference_layers: String,
    /// The deepest first divergence seen so far.
    last: Option<fvd_trace::FirstDivergence>,
    /// Comparator checks of the latest step that did not stop it, one line
    /// each, for the summary.
    checks: Vec<String>,
    /// A layer shift seen on block outputs whose insides were not traced:
    /// a narrower step that finds the insides matching confirms it.
    shift_hint: Option<fvd_trace::Signature>,
}

/// How an investigation ended: the store's [`fvd_store::states::TraceOutcome`] (never `None`
/// or `Abandoned` here: those are the store's own).
pub use fvd_store::states::TraceOutcome as Outcome;

/// What to do after a step's comparison.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Trace again with these (port, reference) regexes.
    Narrow(String, String),
    Stop(Outcome),
}

/// The drill-down rule: stop on a comparison of nothing (an error) or an
/// untrusted one; narrow while the report offers a regex not traced yet and
/// steps remain; a regex already traced means the first divergence is a
/// leaf of the traced scope.
pub fn next_step(report: &fvd_trace::Report, tried: &[String], depth: u32) -> Next {
    match report.assess() {
        fvd_trace::Verdict::NothingCompared => return Next::Stop(Outcome::Error),
        fvd_trace::Verdict::Untrusted => return Next::Stop(Outcome::Untrusted),
        _ => {}
    }
    if report.first_divergence.is_none() {
        return Next::Stop(Outcome::NoDivergence);
    }
    match report.drill_down() {
        Some(next) if !tried.iter().any(|t| t == next) => {
            if tried.len() as u32 >= depth {
                Next::Stop(Outcome::Depth)
            } else {
                let reference = report
                    .drill_down_reference
                    .clone()
                    .unwrap_or_else(|| next.to_string());
                Next::Narrow(next.to_string(), reference)
            }
        }
        _ => Next::Stop(Outcome::Leaf),
    }
}

/// The component's one-line summary of an investigation.
pub fn summary(
    outcome: Outcome,
    last: Option<&fvd_trace::FirstDivergence>,
    tried: &[String],
    detail: &str,
) -> String {
    let steps = tried.len();
    let path = tried.join(" -> ");
    match (outcome, last) {
        (Outcome::Error, _) => format!("trace step {steps} failed: {detail}"),
        (Outcome::Untrusted, _) => {
            format!("trace step {steps}: comparison untrusted, no verdict on the port: {detail}")
        }
        (Outcome::NoDivergence, None) => {
            format!("trace found no divergence with layers {path} ({detail})")
        }
        (Outcome::NoDivergence, Some(fd)) => format!(
            "trace step {steps} found no divergence with layers {} although step {} saw {} ({})",
            tried.last().map(String::as_str).unwrap_or_default(),
            steps.saturating_sub(1),
            fd.port_module,
            divergence_text(fd)
        ),
        (o, Some(fd)) => {
            let how = if o == Outcome::Leaf {
                format!("leaf after {steps} trace steps")
            } else {
                format!("trace depth {steps} spent before a leaf")
            };
            let mut at = String::new();
            if fd.tensor != "out" {
                at.push_str(&format!(", tensor {}", fd.tensor));
            }
            if let Some(step) = fd.step {
                at.push_str(&format!(", step {step}"));
            }
            format!(
                "first divergence: {} {} (reference {}{at}; {how})",
                fd.port_module,
                divergence_text(fd),
                fd.reference_module,
            )
        }
        (_, None) => format!("trace ended without a divergence ({detail})"),
    }
}

/// Why a step stopped the investigation, for the summary: the
/// nothing-compared reason, the distrusting checks, or the rows compared.
pub fn stop_detail(report: &fvd_trace::Report, outcome: Outcome) -> String {
    match outcome {
        Outcome::Error => {
            let why = report
                .diagnostics
                .iter()
                .find(|d| d.code == "nothing_compared")
                .map_or("no row has a counterpart on the other side", |d| {
                    d.message.as_str()
                });
            format!("nothing_compared: {why}")
        }
        Outcome::Untrusted => report
            .signatures
            .iter()
            .filter(|s| s.untrusted)
            .map(fvd_trace::Signature::line)
            .collect::<Vec<_>>()
            .join("; "),
        _ => format!("{} rows compared", report.rows.len()),
    }
}

/// A layer-shift candidate (block outputs matching their neighbour, insides
/// not traced then) confirmed by a narrower step: its first divergence is a
/// block output of the candidate whose sub-modules all match in place.
pub fn confirmed_shift(hint: &fvd_trace::Signature, report: &fvd_trace::Report) -> Option<String> {
    let fvd_trace::Evidence::LayerShift(ev) = &hint.evidence else {
        return None;
    };
    let fd = report.first_divergence.as_ref()?;
    let block = fd
        .reference_module
        .strip_prefix(ev.prefix.as_str())
        .map(|r| r.strip_prefix('.').unwrap_or(r))
        .filter(|_| !ev.prefix.is_empty())
        .unwrap_or(&fd.reference_module);
    let n: u64 = block.parse().ok()?;
    if !ev.pairs.iter().any(|p| p[0] == n) {
        return None;
    }
    let inside = format!("{}.", fd.reference_module);
    let insides: Vec<&fvd_trace::Row> = report
        .rows
        .iter()
        .filter(|r| r.reference_module.starts_with(&inside) && r.step == fd.step)
        .collect();
    if insides.is_empty() || insides.iter().any(|r| r.diverged) {
        return None;
    }
    Some(format!(
        "layer_shift: {}; the next step traced the insides of {}: all {} match in place while its output diverges, so a dumper's block index is off by one; check: the dumpers' indexing of block outputs (hidden_states[0] is the embedding output, hidden_states[i + 1] block i's output), then trace again",
        hint.message,
        fd.port_module,
        insides.len()
    ))
}

fn divergence_text(fd: &fvd_trace::FirstDivergence) -> String {
    match fd.drift {
        Some(d) => format!("{} drift {d:.3}", fd.stat),
        None => format!("{} {} vs {}", fd.stat, fd.reference, fd.port),
    }
}

impl Actor for TraceActor {
    type Msg = DiagnosisMsg;
    type State = TraceState;
    type Arguments = DiagnosisArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: DiagnosisArgs,
    ) -> Result<TraceState, ActorProcessingErr> {
        Ok(TraceState {
            root: diagnosis::files_root(&args.store),
            args,
            running: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: DiagnosisMsg,
        st: &mut TraceState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            DiagnosisMsg::InFlight(reply) => {
                let names = st
                    .running
                    .values()
                    .map(|i| i.run.spec.name.clone())
                    .collect();
                let _ = reply.send(names);
            }
            DiagnosisMsg::Diagnose(run) => investigate(&myself, st, run).await,
            DiagnosisMsg::Job(m) => job_progress(&myself, st, m).await,
        }
        Ok(())
    }
}

/// Starts the investigation of a red run: its first traced rerun, over the
/// spec's layers.
async fn investigate(myself: &ActorRef<DiagnosisMsg>, st: &mut TraceState, mut run: Box<RedRun>) {
    let (family, name) = (st.args.family.clone(), run.spec.name.clone());
    let Some(trace) = run.spec.trace.clone() else {
        // Only a component with a trace table routes its runs here.
        return red_run::hand_on(run);
    };
    let code = st.args.code_of(&run.report.job_id).await;
    let span = spans::trace_comparison(&run.span, &family, &name);
    let id = match st
        .args
        .store
        .start_trace(&family, &name, &run.report.job_id)
        .await
    {
        Ok(id) => id,
        Err(e) => {
            tracing::error!(%family, component = %name, error = %e, "cannot record a trace investigation");
            run.trace_summary = format!("trace not started: {e}");
            return red_run::hand_on(run);
        }
    };
    let inquiry = Inquiry {
        id,
        reference_layers: trace.reference_layers.clone(),
        tried: Vec::new(),
        code,
        run,
        span,
        step: 0,
        last: None,
        checks: Vec::new(),
        shift_hint: None,
        trace: trace.clone(),
    };
    launch(myself, st, inquiry, trace.layers.clone()).await;
}

async fn job_progress(myself: &ActorRef<DiagnosisMsg>, st: &mut TraceState, m: JobEvent) {
    match diagnosis::rerun_event(m, "traced rerun") {
        Some(Rerun::Finished { report, worker_id }) => {
            let Some(inq) = st.running.remove(&report.job_id) else {
                return;
            };
            step_finished(myself, st, inq, *report, &worker_id).await;
        }
        Some(Rerun::Lost { job_id, worker_id }) => {
            if let Some(inq) = st.running.remove(&job_id) {
                let e = format!("worker {worker_id} lost on every retry of {job_id}");
                conclude(st, inq, Outcome::Error, &e).await;
            }
        }
        // No worker can ever take the rerun (a fixed fleet): the
        // investigation ends with why, and hands the red run back, rather
        // than leave its component waiting.
        Some(Rerun::Unplaceable { job_id, reason }) => {
            if let Some(inq) = st.running.remove(&job_id) {
                let _ = st.args.store.unplace_job(&job_id).await;
                let e = format!("traced rerun {job_id} cannot be placed: {reason}");
                conclude(st, inq, Outcome::Error, &e).await;
            }
        }
        None => {}
    }
}

/// Queues the next traced rerun of `inq` with port-side regex `layers`;
/// an error ends the investigation.
async fn launch(
    myself: &ActorRef<DiagnosisMsg>,
    st: &mut TraceState,
    mut inq: Inquiry,
    layers: String,
) {
    inq.step += 1;
    inq.tried.push(layers);
    match enqueue(myself, st, &inq).await {
        Ok(job_id) => {
            progress(&inq);
            st.running.insert(job_id, inq);
        }
        Err(e) => conclude(st, inq, Outcome::Error, &e).await,
    }
}

async fn enqueue(
    myself: &ActorRef<DiagnosisMsg>,
    st: &TraceState,
    inq: &Inquiry,
) -> Result<String, String> {
    let spec = &inq.run.spec;
    let t = &inq.trace;
    let layers = inq.tried.last().cloned().unwrap_or_default();
    let record = st
        .args
        .queue_rerun(spec, TRACE_JOB_SUFFIX, &inq.code)
        .await
        .map_err(|e| format!("cannot queue the traced rerun: {e}"))?;
    st.args
        .store
        .add_trace_step(
            inq.id,
            inq.step,
            &layers,
            &inq.reference_layers,
            &record.job_id,
        )
        .await
        .map_err(|e| format!("cannot record trace step {}: {e}", inq.step))?;
    // The traced rerun runs as the component's own runs do, plus the
    // trace variables.
    let mut env = crate::run_env::run_env(
        spec.set_env.clone(),
        &st.args.family,
        &spec.name,
        record.run_no,
    );
    env.insert("FVD_TRACE_STEP".to_string(), inq.step.to_string());
    env.extend(crate::run_env::traced_env(
        t,
        &layers,
        &inq.reference_layers,
    ));
    let span = spans::trace_step(
        &inq.span,
        &st.args.family,
        &spec.name,
        inq.step,
        record.run_no,
        &record.job_id,
    );
    let job_id = record.job_id.clone();
    st.args
        .enqueue(myself, spec, record, env, span, Some(t))
        .map_err(|e| format!("scheduler is down: {e}"))?;
    Ok(job_id)
}

/// Shows the investigation on the component's row while it runs.
fn progress(inq: &Inquiry) {
    let reason = format!(
        "trace step {} of at most {}: FASTVIDEO_TRACE_LAYERS={}",
        inq.step,
        inq.trace.depth,
        inq.tried.last().map(String::as_str).unwrap_or_default()
    );
    inq.run.progress(ComponentStatus::Tracing, reason);
}

/// What follows a step's report: narrow the trace to the divergent
/// module, or stop with an outcome and its detail (a leaf the previous
/// step's layer shift explains is untrusted, not a finding).
fn what_next(inq: &Inquiry, rep: &fvd_trace::Report) -> (Next, String) {
    let mut next = next_step(rep, &inq.tried, inq.trace.depth);
    let mut detail = stop_detail(
        rep,
        match next {
            Next::Stop(o) => o,
            Next::Narrow(..) => Outcome::Leaf,
        },
    );
    if next == Next::Stop(Outcome::Leaf)
        && let Some(confirmed) = inq
            .shift_hint
            .as_ref()
            .and_then(|h| confirmed_shift(h, rep))
    {
        next = Next::Stop(Outcome::Untrusted);
        detail = confirmed;
    }
    (next, detail)
}

/// What the investigation keeps from a step for the next one: its first
/// divergence, its trusted checks, and a layer shift it saw.
fn learn(inq: &mut Inquiry, rep: &fvd_trace::Report) {
    if let Some(fd) = &rep.first_divergence {
        inq.last = Some(fd.clone());
    }
    inq.checks = rep
        .signatures
        .iter()
        .filter(|s| !s.untrusted)
        .map(fvd_trace::Signature::line)
        .collect();
    if let Some(hint) = rep
        .signatures
        .iter()
        .find(|s| s.kind() == "layer_shift" && !s.untrusted)
    {
        inq.shift_hint = Some(hint.clone());
    }
}

async fn step_finished(
    myself: &ActorRef<DiagnosisMsg>,
    st: &mut TraceState,
    mut inq: Inquiry,
    report: JobReport,
    worker_id: &str,
) {
    // The rerun's own verdict, a diagnosis: never the component's.
    let v = red_run::classify(&inq.code.cwd, &inq.run.spec, &report);
    let result = red_run::job_result((&v).into(), v.reason(), &report);
    match st
        .args
        .store
        .finish_job(&report.job_id, report.lease_epoch, &result)
        .await
    {
        Ok(true) => {}
        Ok(false) => {
            // A stale result: the rerun goes on under its live lease.
            tracing::warn!(job = %report.job_id, %worker_id, "stale result of a traced rerun rejected");
            st.running.insert(report.job_id.clone(), inq);
            return;
        }
        Err(e) => {
            let e = format!("cannot record the traced rerun {}: {e}", report.job_id);
            return conclude(st, inq, Outcome::Error, &e).await;
        }
    }
    let run = report.job_id.rsplit('.').next().unwrap_or("0").to_string();
    let dir = match run_dir(&st.root, &st.args.family, &inq.run.spec.name, &run) {
        Ok(d) => d,
        Err(e) => {
            let e = format!("cannot place the traced rerun's files: {e}");
            return conclude(st, inq, Outcome::Error, &e).await;
        }
    };
    let compared = gather_and_compare(&inq.trace, &dir, &report, worker_id).await;
    let dir_s = dir.to_string_lossy().into_owned();
    let mut rep = match compared {
        Ok((r, transport)) => {
            if let Err(e) = st
                .args
                .store
                .set_trace_step_transport(inq.id, inq.step, &transport)
                .await
            {
                tracing::warn!(error = %e, "cannot record how a trace step was compared");
            }
            r
        }
        Err(e) => {
            let _ = st
                .args
                .store
                .finish_trace_step(inq.id, inq.step, &dir_s, "", "", &e)
                .await;
            return conclude(st, inq, Outcome::Error, &e).await;
        }
    };
    if let Some(fd) = inq.last.as_ref().filter(|_| inq.step > 1) {
        rep.diagnostics.push(narrowed_scope(&inq.tried, fd));
        // A narrowed trace starts inside the model: its first row is no input.
        rep.drop_signatures("inputs_differ");
    }
    let (next, detail) = what_next(&inq, &rep);
    let first = rep
        .first_divergence
        .as_ref()
        .map(|f| f.port_module.clone())
        .unwrap_or_default();
    let json = stored_json(&rep);
    // A step that ends in error says so on its row too (`fvd trace show`).
    let error = if next == Next::Stop(Outcome::Error) {
        detail.as_str()
    } else {
        ""
    };
    if let Err(e) = st
        .args
        .store
        .finish_trace_step(inq.id, inq.step, &dir_s, &first, &json, error)
        .await
    {
        let e = format!("cannot store the report of trace step {}: {e}", inq.step);
        return conclude(st, inq, Outcome::Error, &e).await;
    }
    spans::first_divergence(
        &inq.span,
        rep.rows.len() as u64,
        rep.first_divergence.as_ref().map(|f| spans::Divergence {
            port_module: &f.port_module,
            reference_module: &f.reference_module,
            stat: &f.stat,
        }),
    );
    learn(&mut inq, &rep);
    match next {
        Next::Narrow(port, reference) => {
            inq.reference_layers = reference;
            launch(myself, st, inq, port).await;
        }
        Next::Stop(o) => conclude(st, inq, o, &detail).await,
    }
}

/// A narrowed trace starts inside the model, so whole-trace diagnostics
/// (every row diverges, divergence at the first traced module) describe the
/// scope, not the model's inputs; the report says so next to them.
fn narrowed_scope(
    tried: &[String],
    previous: &fvd_trace::FirstDivergence,
) -> fvd_trace::Diagnostic {
    fvd_trace::Diagnostic::new(
        "narrowed_scope",
        format!(
            "this trace covers only {} (the previous step's first divergence was {}, every module before it matched): where its rows start to diverge is this scope's start, not the model's inputs",
            tried.last().map(String::as_str).unwrap_or_default(),
            previous.port_module
        ),
    )
}

/// The comparison of a traced rerun: the worker's report, when it compared
/// the files where they lie (the files that came along are kept under
/// `dir`); else the files it sent back, written under `dir` and compared
/// here.
pub async fn gather_and_compare(
    trace: &TraceSpec,
    dir: &Path,
    report: &JobReport,
    worker_id: &str,
) -> Result<(fvd_trace::Report, StepTransport), String> {
    if !report.spawn_error.is_empty() {
        return Err(format!(
            "the traced rerun did not start: {}",
            report.spawn_error
        ));
    }
    let mut transport = StepTransport {
        compared_on: format!("worker {worker_id}"),
        files_bytes: report.collected_bytes,
        files: report.collected_files,
        wire_bytes: report.wire_bytes,
        compare_ms: report.compare_ms,
    };
    if !report.trace_error.is_empty() {
        return Err(report.trace_error.clone());
    }
    let (trace, dir, files) = (trace.clone(), dir.to_path_buf(), report.files.clone());
    if let Some(json) = &report.trace_report {
        let mut rep: fvd_trace::Report = serde_json::from_str(json)
            .map_err(|e| format!("the worker's trace report is malformed: {e}"))?;
        if files.is_empty() && report.collected_bytes > 0 {
            rep.diagnostics.push(fvd_trace::Diagnostic::new(
                "files_on_worker",
                format!(
                    "worker {worker_id} compared the {} bytes of {} trace file(s) where they lie and sent back this report only ({} bytes on the wire)",
                    report.collected_bytes, report.collected_files, report.wire_bytes
                ),
            ));
        }
        fvd_telemetry::spawn_blocking(move || write_files(&dir, &files))
            .await
            .map_err(|e| format!("writing the trace files panicked: {e}"))??;
        return Ok((rep, transport));
    }
    if !report.files_error.is_empty() {
        return Err(format!("no trace files came back: {}", report.files_error));
    }
    transport.compared_on = "orchestrator".to_string();
    let started = std::time::Instant::now();
    let rep = fvd_telemetry::spawn_blocking(move || {
        let written = write_files(&dir, &files)?;
        fvd_trace::compare_folder(&dir, &written, &trace.folder_spec())
    })
    .await
    .map_err(|e| format!("trace comparison panicked: {e}"))??;
    transport.compare_ms = started.elapsed().as_millis() as u64;
    Ok((rep, transport))
}

/// The folder of one traced rerun's files:
/// `<root>/<family>/<component>/<run>`. Family and component names are
/// identifiers (the spec refuses others) and `run` is fvd's own number; the
/// join still refuses any part that would leave `root` or pass through a
/// link, whatever stored spec or job id it came from.
pub fn run_dir(
    root: &Path,
    family: &str,
    component: &str,
    run: &str,
) -> Result<PathBuf, fvd_paths::PathError> {
    fvd_paths::join_under_no_links(root, Path::new(family).join(component).join(run))
}

/// Writes collected files under `dir` (emptied first) and returns their
/// relative paths. Paths that would leave `dir` are refused: they come
/// from another machine.
pub fn write_files(dir: &Path, files: &[CollectedFile]) -> Result<Vec<String>, String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let target = fvd_paths::join_under(dir, &f.path)
            .map_err(|e| format!("collected file refused: {e}"))?;
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        std::fs::write(&target, &f.data)
            .map_err(|e| format!("cannot write {}: {e}", target.display()))?;
        out.push(f.path.clone());
    }
    out.sort();
    Ok(out)
}

/// The report as stored: whole, unless it is too big, then only the rows
/// around the first divergence, with a diagnostic saying so.
pub fn stored_json(rep: &fvd_trace::Report) -> String {
    fvd_trace::trimmed_json(rep, MAX_STORED_REPORT_BYTES)
}

/// Ends an investigation: records it and passes the red run on.
async fn conclude(st: &mut TraceState, inq: Inquiry, outcome: Outcome, detail: &str) {
    let mut text = summary(outcome, inq.last.as_ref(), &inq.tried, detail);
    // Checks that localize the error (or hint at a dumper) ride along.
    if outcome != Outcome::Error && outcome != Outcome::Untrusted && !inq.checks.is_empty() {
        text.push_str(&format!("; comparator checks: {}", inq.checks.join("; ")));
    }
    if let Err(e) = st.args.store.finish_trace(inq.id, outcome, &text).await {
        tracing::error!(family = %st.args.family, component = %inq.run.spec.name, error = %e, "cannot record the end of a trace investigation");
    }
    tracing::info!(family = %st.args.family, component = %inq.run.spec.name, outcome = outcome.as_str(), summary = %text, "trace investigation ended");
    let mut run = inq.run;
    run.trace_summary = text;
    red_run::hand_on(run);
}

#[cfg(test)]
mod tests {
    use super::*;
    use fvd_trace::{FirstDivergence, Report};

    fn report(first: Option<&str>, drill: Option<&str>) -> Report {
        Report {
            verdict: Default::default(),
            signatures: Vec::new(),
            first_divergence: first.map(|m| FirstDivergence {
                reference_module: m.replace("blocks", "layers"),
                port_module: m.to_string(),
                tensor: "out".into(),
                step: Some(0),
                stat: "abs_mean".into(),
                reference: serde_json::json!(1.0),
                port: serde_json::json!(1.4),
                drift: Some(0.2857),
                tolerance: Some(0.005),
            }),
            rows: Vec::new(),
            diagnostics: Vec::new(),
            unmatched: Default::default(),
            drill_down: drill.map(str::to_string),
            drill_down_reference: drill.map(|d| d.replace("blocks", "layers")),
            exact_steps: Vec::new(),
            tolerances: Default::default(),
        }
    }

    #[test]
    fn narrows_to_the_block_then_stops_at_the_leaf() {
        let block = r"^blocks\.2(\.|$)";
        let tried = vec![r"^blocks\.\d+$".to_string()];
        assert_eq!(
            next_step(&report(Some("blocks.2"), Some(block)), &tried, 3),
            Next::Narrow(block.into(), block.replace("blocks", "layers"))
        );
        let tried = vec![tried[0].clone(), block.to_string()];
        assert_eq!(
            next_step(&report(Some("blocks.2.norm"), Some(block)), &tried, 3),
            Next::Stop(Outcome::Leaf)
        );
        assert_eq!(
            next_step(&report(None, None), &tried, 3),
            Next::Stop(Outcome::NoDivergence)
        );
    }

    #[test]
    fn depth_stops_before_a_leaf_is_known() {
        let tried = vec![r"^blocks\.\d+$".to_string()];
        assert_eq!(
            next_step(
                &report(Some("blocks.2"), Some(r"^blocks\.2(\.|$)")),
                &tried,
                1
            ),
            Next::Stop(Outcome::Depth)
        );
    }

    #[test]
    fn summaries_name_the_module_the_stat_and_the_path() {
        let fd = report(Some("blocks.2.norm"), None)
            .first_divergence
            .unwrap();
        let tried = vec!["^a$".to_string(), "^b$".to_string()];
        let s = summary(Outcome::Leaf, Some(&fd), &tried, "");
        assert_eq!(
            s,
            "first divergence: blocks.2.norm abs_mean drift 0.286 (reference layers.2.norm, step 0; leaf after 2 trace steps)"
        );
        assert!(
            summary(Outcome::Depth, Some(&fd), &tried, "")
                .ends_with("; trace depth 2 spent before a leaf)")
        );
        assert_eq!(
            summary(Outcome::Error, None, &tried, "boom"),
            "trace step 2 failed: boom"
        );
    }

    #[test]
    fn collected_paths_cannot_leave_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let f = |p: &str| CollectedFile {
            path: p.into(),
            data: b"{}".to_vec(),
        };
        let got = write_files(dir.path(), &[f("b/x.jsonl"), f("a.jsonl")]).unwrap();
        assert_eq!(got, ["a.jsonl", "b/x.jsonl"]);
        assert!(dir.path().join("b/x.jsonl").is_file());
        for bad in ["../x", "/etc/x", "a/../../x", "", "."] {
            let err = write_files(dir.path(), &[f(bad)]).unwrap_err();
            assert!(err.contains("collected file refused"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_run_folder_stays_under_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(
            run_dir(root, "tinyport", "refiner", "2").unwrap(),
            root.join("tinyport/refiner/2")
        );
        // Names no spec accepts, from a stored spec or a forged job id.
        for (family, component, run) in [
            ("p", "../../../../tmp/x/esc", "1"),
            ("p", "/tmp/x", "1"),
            ("..", "c", "1"),
            ("p", "c", ".."),
            ("p", "a/../..", "1"),
        ] {
            let err = run_dir(root, family, component, run)
                .unwrap_err()
                .to_string();
            assert!(err.contains("must stay inside"), "{component}: {err}");
        }
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.join("p")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("p/c")).unwrap();
        let err = run_dir(root, "p", "c", "1").unwrap_err().to_string();
        assert!(err.contains("p/c is a symbolic link"), "{err}");
    }

    #[test]
    fn oversized_reports_keep_the_rows_around_the_divergence() {
        let mut r = report(Some("m.500"), None);
        r.rows = (0..40_000)
            .map(|i| fvd_trace::Row {
                index: i,
                reference_module: format!("m.{i}"),
                port_module: format!("m.{i}"),
                tensor: "out".into(),
                step: Some(0),
                reference_shape: Some(vec![1, 2, 3]),
                port_shape: Some(vec![1, 2, 3]),
                drift: Default::default(),
                exceeded: Vec::new(),
                diverged: i == 500,
                exact: false,
            })
            .collect();
        let json = stored_json(&r);
        assert!(json.len() < MAX_STORED_REPORT_BYTES);
        let back: Report = serde_json::from_str(&json).unwrap();
        assert_eq!(
            back.rows.len(),
            2 * fvd_trace::folder::TRIM_CONTEXT_ROWS + 1
        );
        assert!(back.rows.iter().any(|row| row.diverged));
        assert_eq!(back.diagnostics.last().unwrap().code, "rows_trimmed");
    }
}
