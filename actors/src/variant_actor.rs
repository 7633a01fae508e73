//! `VariantActor`: one per port (spawned by the gate when some component
//! declares `[[component.variant]]`s), of the diagnoser shape
//! ([`crate::diagnosis`]). When such a component's run is `debug_red`, its
//! route ([`crate::red_run`]) brings the classified run here (after the
//! trace actor, when it is traced) before the component blocks or starts an
//! agent attempt. The actor
//! queues the parity test once per variant, all at once, each with the
//! variant's environment overrides: the scheduler places them on whatever
//! slots or GPUs are free, side by side. Each run's verdict, and for a
//! traced component its first divergence, fills a row of the red run's
//! table next to the baseline (the red run itself); once every row is in,
//! the red run goes on with the table's note ([`RedRun::variant_note`]):
//! the variants that pass or move the first divergence, by name and
//! overrides ("passes with EPS_FIX=1"). While they run, the actor tells the
//! component, which writes its row.
//!
//! Variant runs are jobs of the component name `<name>#variant`, which no
//! component can have (names are identifiers): like traced reruns, they go
//! through the scheduler with leases, fencing and logs, but never count as
//! the component's runs and never change its verdict.
//!
//! A traced component's variants are traced too, in one run each: the
//! regex is the union of every scope the red run's investigation traced
//! (the blocks, then the first divergent block's insides), so a variant that
//! keeps the bug names the same leaf, one that moves it names the block or
//! leaf where it now lies, and the comparison runs on the worker, where the
//! files are (see the trace actor).
//!
//! The actor never fails on a table's error: a row that could not run
//! (unplaced, lost worker, a spawn error) says so, and the component gets
//! its answer. A failed actor would leave components waiting for good.

use std::collections::HashMap;
use std::path::PathBuf;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::field::Empty;

use crate::diagnosis::{self, DiagnosisArgs, DiagnosisMsg, Rerun};
use crate::red_run::{self, RedRun};
use crate::run_env;
use crate::scheduler::JobEvent;
use crate::trace_actor;
use crate::variant_table::{finding, table_note};
use fvd_contracts::verdict::Verdict;
use fvd_spec::ComponentSpec;
use fvd_store::messages::JobReport;
use fvd_store::model::{ComponentStatus, RecordedVerdict};
use fvd_store::states::{VariantFinding, VariantState as RowState};
use fvd_store::variants::{BASELINE, VariantRow};

/// Suffix of the component name variant runs are recorded under.
pub const VARIANT_JOB_SUFFIX: &str = "#variant";
/// Variable naming the variant a run tests (the test may read it).
pub const VARIANT_ENV: &str = "FVD_VARIANT";
#[derive(Debug)]
pub struct VariantActor;

#[derive(Debug)]
pub struct VariantState {
    args: DiagnosisArgs,
    /// Where traced variants' files go: beside the database.
    root: PathBuf,
    /// Tables being filled, by the red run's job id.
    tables: HashMap<String, Table>,
    /// Variant runs in flight: job id → (red run, row index).
    running: HashMap<String, (String, usize)>,
}

/// One red run's table while its variants run.
#[derive(Debug)]
struct Table {
    /// The red run, passed on once every row is in.
    run: Box<RedRun>,
    cwd: String,
    /// The union of the scopes the red run's investigation traced (port
    /// side, reference side): every variant is traced over it.
    scope: Option<(String, String)>,
    /// The red run's deepest first divergence, when it was traced.
    first: Option<fvd_trace::FirstDivergence>,
    rows: Vec<VariantRow>,
    pending: usize,
}

/// `(?:a)|(?:b)` of the distinct regexes, or the one regex alone.
fn union(regexes: &[String]) -> String {
    let mut distinct: Vec<&String> = Vec::new();
    for r in regexes {
        if !distinct.contains(&r) {
            distinct.push(r);
        }
    }
    match distinct.as_slice() {
        [one] => (*one).clone(),
        many => many
            .iter()
            .map(|r| format!("(?:{r})"))
            .collect::<Vec<_>>()
            .join("|"),
    }
}

impl Actor for VariantActor {
    type Msg = DiagnosisMsg;
    type State = VariantState;
    type Arguments = DiagnosisArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: DiagnosisArgs,
    ) -> Result<VariantState, ActorProcessingErr> {
        Ok(VariantState {
            root: diagnosis::files_root(&args.store),
            args,
            tables: HashMap::new(),
            running: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: DiagnosisMsg,
        st: &mut VariantState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            DiagnosisMsg::InFlight(reply) => {
                let names = st
                    .tables
                    .values()
                    .map(|t| t.run.spec.name.clone())
                    .collect();
                let _ = reply.send(names);
            }
            DiagnosisMsg::Diagnose(run) => start(&myself, st, run).await,
            DiagnosisMsg::Job(ev) => job_progress(st, ev).await,
        }
        Ok(())
    }
}

/// The red run's traced scope and deepest first divergence, from its
/// investigation (none when the run was not investigated).
async fn baseline_trace(
    st: &VariantState,
    spec: &ComponentSpec,
    red_job: &str,
) -> (Option<(String, String)>, Option<fvd_trace::FirstDivergence>) {
    if spec.trace.is_none() {
        return (None, None);
    }
    let inv = match st
        .args
        .store
        .latest_trace(&st.args.family, &spec.name)
        .await
    {
        Ok(Some(inv)) if inv.job_id == red_job && !inv.steps.is_empty() => inv,
        _ => return (None, None),
    };
    let layers: Vec<String> = inv.steps.iter().map(|s| s.layers.clone()).collect();
    let reference: Vec<String> = inv
        .steps
        .iter()
        .map(|s| s.reference_layers.clone())
        .collect();
    let first = inv
        .steps
        .iter()
        .rev()
        .filter_map(|s| s.report.as_ref()?.get("first_divergence").cloned())
        .find_map(|v| serde_json::from_value::<fvd_trace::FirstDivergence>(v).ok());
    (Some((union(&layers), union(&reference))), first)
}

async fn start(myself: &ActorRef<DiagnosisMsg>, st: &mut VariantState, mut run: Box<RedRun>) {
    let (family, name) = (st.args.family.clone(), run.spec.name.clone());
    let red_job = run.report.job_id.clone();
    // The variants test the red run's code: its folder and commit.
    let code = st.args.code_of(&red_job).await;
    let (scope, first) = baseline_trace(st, &run.spec, &red_job).await;
    let mut rows = vec![VariantRow {
        red_job_id: red_job.clone(),
        name: BASELINE.to_string(),
        job_id: red_job.clone(),
        state: RowState::Done,
        verdict: run.recorded(),
        reason: run.verdict.reason(),
        first_divergence: first
            .as_ref()
            .map(|f| f.port_module.clone())
            .unwrap_or_default(),
        stat: first.as_ref().map(|f| f.stat.clone()).unwrap_or_default(),
        drift: first.as_ref().and_then(|f| f.drift),
        finding: VariantFinding::Baseline,
        ..VariantRow::default()
    }];
    // Every run is recorded before any is queued: the table exists whole
    // from the start.
    let mut queued = Vec::new();
    let variants = run.spec.variants.clone();
    for v in &variants {
        match st
            .args
            .queue_rerun(&run.spec, VARIANT_JOB_SUFFIX, &code)
            .await
        {
            Ok(record) => {
                rows.push(VariantRow {
                    red_job_id: red_job.clone(),
                    name: v.name.clone(),
                    env: v.env_words(),
                    job_id: record.job_id.clone(),
                    state: RowState::Running,
                    ..VariantRow::default()
                });
                queued.push((v.clone(), record));
            }
            Err(e) => {
                tracing::error!(%family, component = %name, error = %e, "cannot queue a variant run");
                run.variant_note = format!("variants not run: {e}");
                return red_run::hand_on(run);
            }
        }
    }
    if let Err(e) = st.args.store.start_variants(&family, &name, &rows).await {
        tracing::error!(%family, component = %name, error = %e, "cannot record a variant table");
        run.variant_note = format!("variants not run: {e}");
        return red_run::hand_on(run);
    }
    let mut table = Table {
        run,
        cwd: code.cwd,
        scope,
        first,
        pending: queued.len(),
        rows,
    };
    for (i, (v, record)) in queued.into_iter().enumerate() {
        let job_id = record.job_id.clone();
        let spec = &table.run.spec;
        let mut env = spec.set_env.clone();
        env.extend(v.env.clone());
        let mut env = crate::run_env::run_env(env, &family, &name, record.run_no);
        env.insert(VARIANT_ENV.to_string(), v.name.clone());
        let traced = match (&table.scope, &spec.trace) {
            (Some((layers, reference)), Some(t)) => {
                env.extend(run_env::traced_env(t, layers, reference));
                Some(t)
            }
            _ => None,
        };
        let span = tracing::info_span!(
            parent: &table.run.span,
            "attempt",
            "fvd.family" = %family,
            "fvd.component" = %name,
            "fvd.attempt" = i64::from(record.run_no),
            "fvd.job_id" = %record.job_id,
            "fvd.variant" = %v.name,
            "fvd.verdict" = Empty,
            "fvd.reason" = Empty,
        );
        if let Err(e) = st.args.enqueue(myself, spec, record, env, span, traced) {
            let row = &mut table.rows[i + 1];
            row.verdict = RecordedVerdict::Error(None);
            row.reason = format!("not queued: the scheduler is down: {e}");
            row.finding = VariantFinding::Other;
            let _ = st.args.store.finish_variant(&family, &name, row).await;
            table.pending -= 1;
        } else {
            st.running.insert(job_id, (red_job.clone(), i + 1));
        }
    }
    tracing::info!(%family, component = %name, variants = table.rows.len() - 1, "variant runs queued");
    progress(&table);
    if table.pending == 0 {
        conclude(table);
    } else {
        st.tables.insert(red_job, table);
    }
}

async fn job_progress(st: &mut VariantState, ev: JobEvent) {
    match diagnosis::rerun_event(ev, "variant run") {
        Some(Rerun::Finished { report, worker_id }) => {
            let Some((red, idx)) = st.running.remove(&report.job_id) else {
                return;
            };
            finished(st, red, idx, *report, &worker_id).await;
        }
        Some(Rerun::Lost { job_id, worker_id }) => {
            if let Some((red, idx)) = st.running.remove(&job_id) {
                let why = format!("worker {worker_id} lost on every retry");
                fill(
                    st,
                    &red,
                    idx,
                    RecordedVerdict::InfraError,
                    &why,
                    None,
                    String::new(),
                )
                .await;
            }
        }
        Some(Rerun::Unplaceable { job_id, reason }) => {
            if let Some((red, idx)) = st.running.remove(&job_id) {
                let _ = st.args.store.unplace_job(&job_id).await;
                let why = format!("unplaced: {reason}");
                fill(
                    st,
                    &red,
                    idx,
                    RecordedVerdict::Unplaced,
                    &why,
                    None,
                    String::new(),
                )
                .await;
            }
        }
        None => {}
    }
}

/// A variant run ended: its verdict, and for a traced component its first
/// divergence, into its row.
async fn finished(
    st: &mut VariantState,
    red: String,
    idx: usize,
    report: JobReport,
    worker_id: &str,
) {
    let Some(table) = st.tables.get(&red) else {
        return;
    };
    let (spec, cwd) = (table.run.spec.clone(), table.cwd.clone());
    // The variant run's own verdict: a row of the table, never the
    // component's.
    let v = red_run::classify(&cwd, &spec, &report);
    // An environment failure is not retried elsewhere: the variant's own
    // overrides may be what the environment lacks (an attention backend
    // not installed).
    let (verdict, reason) = match &v {
        Verdict::Environment { cause } => (RecordedVerdict::Environment, cause.clone()),
        other => (RecordedVerdict::from(other), other.reason()),
    };
    let result = red_run::job_result(verdict, reason.clone(), &report);
    let recorded = if verdict == RecordedVerdict::Environment {
        st.args
            .store
            .finish_job_environment(&report.job_id, report.lease_epoch, &result)
            .await
    } else {
        st.args
            .store
            .finish_job(&report.job_id, report.lease_epoch, &result)
            .await
    };
    match recorded {
        Ok(true) => {}
        Ok(false) => {
            // A stale result: the run goes on under its live lease.
            tracing::warn!(job = %report.job_id, %worker_id, "stale result of a variant run rejected");
            st.running.insert(report.job_id.clone(), (red, idx));
            return;
        }
        Err(e) => tracing::error!(job = %report.job_id, error = %e, "cannot record a variant run"),
    }
    let mut compared = None;
    let mut trace_error = String::new();
    if table.scope.is_some()
        && let Some(t) = &spec.trace
    {
        let run = report.job_id.rsplit('.').next().unwrap_or("0");
        match trace_actor::run_dir(
            &st.root,
            &st.args.family,
            &spec.name,
            &format!("variant.{run}"),
        ) {
            Ok(dir) => match trace_actor::gather_and_compare(t, &dir, &report, worker_id).await {
                Ok((rep, _)) => {
                    match rep.assess() {
                        fvd_trace::Verdict::NothingCompared => {
                            trace_error = "nothing compared".into()
                        }
                        fvd_trace::Verdict::Untrusted => {
                            trace_error = format!(
                                "comparison untrusted: {}",
                                trace_actor::stop_detail(&rep, trace_actor::Outcome::Untrusted)
                            )
                        }
                        _ => {}
                    }
                    compared = Some(rep);
                }
                Err(e) => trace_error = e,
            },
            Err(e) => trace_error = format!("cannot place the run's files: {e}"),
        }
    }
    let fd = compared
        .as_ref()
        .filter(|_| trace_error.is_empty())
        .and_then(|r| r.first_divergence.clone());
    fill(st, &red, idx, verdict, &reason, fd, trace_error).await;
}

/// Fills row `idx` of `red`'s table and concludes the table once full.
async fn fill(
    st: &mut VariantState,
    red: &str,
    idx: usize,
    verdict: RecordedVerdict,
    reason: &str,
    fd: Option<fvd_trace::FirstDivergence>,
    trace_error: String,
) {
    let Some(table) = st.tables.get_mut(red) else {
        return;
    };
    let found = finding(verdict, fd.as_ref(), table.first.as_ref());
    let Some(row) = table.rows.get_mut(idx) else {
        return;
    };
    row.state = RowState::Done;
    row.verdict = verdict;
    row.reason = reason.to_string();
    row.first_divergence = fd
        .as_ref()
        .map(|f| f.port_module.clone())
        .unwrap_or_default();
    row.stat = fd.as_ref().map(|f| f.stat.clone()).unwrap_or_default();
    row.drift = fd.as_ref().and_then(|f| f.drift);
    row.finding = found;
    row.trace_error = trace_error;
    let row = row.clone();
    if let Err(e) = st
        .args
        .store
        .finish_variant(&st.args.family, &table.run.spec.name, &row)
        .await
    {
        tracing::error!(component = %table.run.spec.name, error = %e, "cannot record a variant's row");
    }
    tracing::info!(component = %table.run.spec.name, variant = %row.name, %verdict, finding = %found, "variant run ended");
    table.pending = table.pending.saturating_sub(1);
    if table.pending == 0
        && let Some(t) = st.tables.remove(red)
    {
        conclude(t);
    }
}

/// Shows the variant runs on the component's row while they run.
fn progress(t: &Table) {
    let names: Vec<&str> = t.rows.iter().skip(1).map(|r| r.name.as_str()).collect();
    let reason = format!(
        "{} variant run(s) at once: {}",
        names.len(),
        names.join(", ")
    );
    t.run.progress(ComponentStatus::Variants, reason);
}

/// Passes the red run on with the table's note.
fn conclude(t: Table) {
    let note = table_note(&t.rows);
    tracing::info!(component = %t.run.spec.name, %note, "variant table complete");
    let mut run = t.run;
    run.variant_note = note;
    red_run::hand_on(run);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traced_variant_covers_every_scope_the_investigation_traced() {
        assert_eq!(union(&[r"^b\.\d+$".into()]), r"^b\.\d+$");
        let u = union(&[
            r"^b\.\d+$".into(),
            r"^b\.2(\.|$)".into(),
            r"^b\.2(\.|$)".into(),
        ]);
        assert_eq!(u, r"(?:^b\.\d+$)|(?:^b\.2(\.|$))");
        let re = regex::Regex::new(&u).unwrap();
        for (name, hit) in [("b.0", true), ("b.2.norm", true), ("b.1.norm", false)] {
            assert_eq!(re.is_match(name), hit, "{name}");
        }
    }
}
