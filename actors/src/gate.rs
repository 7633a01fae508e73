//! `GateActor`: one per port. It owns the phase state machine P0–P11,
//! evaluates each phase's predicate over recorded state, refuses every
//! transition whose predicate fails (recording the unmet conditions), and at
//! phase 6 dispatches one component actor per component.
//!
//! Phases whose work fvd does not drive yet (study, reuse, prototype,
//! conversion, pipeline) are recorded as `pending` with the reason: they are
//! never silently passed.

use std::path::Path;
use std::sync::Arc;

use fvd_contracts::fields::Slot;
use fvd_contracts::phase::Phase;
use fvd_contracts::prep::PrepNextStep;
use fvd_spec::preconditions::{prep_conditions, scaffold_conditions};
use fvd_telemetry::spans;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::broadcast;
use tracing::Span;
use tracing::field::Empty;

use crate::component::{ComponentArgs, ComponentSubagentActor};

mod verify;
use crate::fvd_dir::FvdDir;
use crate::pipeline_words::Cause;
use crate::scheduler::SchedulerMsg;
use fvd_spec::PortSpec;
use fvd_store::Store;
use fvd_store::messages::PortEvent;
use fvd_store::model::{
    ComponentRow, ComponentStatus, GateEventRow, GateOutcome, PortState, RecordedVerdict,
};

#[derive(Debug)]
pub struct GateActor;

#[derive(Debug)]
pub struct GateArgs {
    /// Where the port's span of this run hangs (the port's stored trace,
    /// the submitter's) and whether it becomes the port's stored context.
    pub trace: fvd_telemetry::Continuation,
    pub family: String,
    pub spec: PortSpec,
    pub repo: String,
    /// The commit the port is pinned to and where its folder sits in it.
    pub code: fvd_store::model::PortCode,
    pub store: Store,
    pub scheduler: ActorRef<SchedulerMsg>,
    pub events: broadcast::Sender<PortEvent>,
    /// Which agent commands run here, jailed how.
    pub agents: fvd_workspace::agent::AgentPolicy,
}

#[derive(Debug)]
pub enum GateMsg {
    /// A component reached `non_skip_pass` or `blocked`.
    ComponentFinal(ComponentRow),
    /// A component's agent asked a person (`ask_user`): the port pauses
    /// once every other component is final.
    ComponentAsks(ComponentRow),
    /// No worker with a working environment can take the component's run:
    /// the port pauses once every other component is final or waiting.
    ComponentWaitsEnv(String),
    /// A component that waited for an environment was placed again.
    EnvironmentFixed(String),
    /// `fvd answer` recorded the answer to escape hatch `id` of `component`.
    Answered { component: String, id: String },
    /// A component's agent returned a conversion retry request.
    ConversionRetry { component: String, request: String },
    /// Stop the port: components end as blocked with reason `cancelled`.
    Cancel,
    /// Check that the port's `REPO/.fvd` is still the folder it was (sent
    /// every second by the gate itself).
    CheckFvd,
    /// Restart the failed component actor of this component from the store
    /// (sent by the gate itself, after a backoff).
    Respawn(String),
    /// A component actor took its first step (queued its run, adopted one
    /// in flight, found its verdict recorded, or blocked): sent after any
    /// run it queued, so the scheduler has it before the port's hold ends.
    ComponentStarted(String),
}

#[derive(Debug)]
pub struct GateState {
    args: GateArgs,
    /// Latest recorded event per phase, to keep resumes from repeating them.
    recorded: Vec<GateEventRow>,
    finals: std::collections::BTreeMap<String, ComponentRow>,
    /// The phase whose components run now: P6 (every parity component),
    /// then P7 (one pipeline step at a time).
    phase: Phase,
    /// The components whose finals that phase waits for.
    wave: std::collections::BTreeSet<String>,
    /// Components waiting in `ask_user` for an answer.
    asking: std::collections::BTreeSet<String>,
    /// Components waiting for a worker with a working environment.
    waiting_env: std::collections::BTreeSet<String>,
    done: bool,
    /// Root of the port's trace; ends when the port finishes.
    span: Span,
    /// The phase span still open (P6 from `entered` until it is decided);
    /// component spans are its children.
    phase_span: Option<(String, Span)>,
    /// The port's diagnosers (trace, variants) its red runs visit.
    diagnosers: crate::red_run::Diagnosers,
    /// The port's `REPO/.fvd`, which must stay the same folder.
    fvd: Arc<FvdDir>,
    /// Failed component actors, restarted under backoff.
    restarts: crate::restarts::Restarts,
    /// Components that have not taken their first step while the
    /// scheduler holds the port's first placement (see
    /// [`SchedulerMsg::HoldFamily`]); `None` once released.
    starting: Option<std::collections::BTreeSet<String>>,
    /// The commit P7's steps run at: the port's, with every agent
    /// component's passing fix in it (`None` before P7).
    pipeline_code: Option<fvd_store::model::PortCode>,
}

/// The longest the port's first placement waits for its components to
/// queue their first runs (a component whose start fails never says it
/// started).
const FIRST_PLACEMENT_HOLD: std::time::Duration = std::time::Duration::from_secs(2);

/// The longest the gate waits for a component's old actor to stop before
/// it starts the component again.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How often the gate checks that the port's `REPO/.fvd` is still there.
const FVD_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// A prep handoff that pauses to ask the user is an escape hatch: the
/// trace says so before P0 decides (only the kind, never the question's
/// text).
fn trace_prep_escape(st: &GateState) {
    let prep = &st.args.spec.prep;
    let asks = prep
        .get("next_step")
        .and_then(|s| s.parse::<PrepNextStep>().ok())
        == Some(PrepNextStep::AskUser);
    // `escape_hatch: none` is the contract's empty slot.
    let hatch = prep
        .get("escape_hatch")
        .is_some_and(|s| !Slot::<String>::is_none_text(s));
    if asks || hatch {
        spans::escape_hatch(
            &st.span,
            &Phase::ScopeAndHandoffGate.id(),
            if asks { "ask_user" } else { "declared" },
        );
    }
}

/// P0 passed: P1 to P5 as fvd can judge them before component work (P2's
/// scaffold checked; the rest recorded pending with why). `false` when P2
/// refused and the port ends.
async fn before_components(st: &mut GateState) -> Result<bool, ActorProcessingErr> {
    record(st, Phase::ScopeAndHandoffGate, GateOutcome::Passed, vec![]).await?;
    record(
        st,
        Phase::ReferenceAndArchitectureStudy,
        GateOutcome::Pending,
        vec!["reference and architecture study is agent work fvd does not drive yet".into()],
    )
    .await?;
    let p2 = scaffold_conditions(&st.args.spec, Path::new(&st.args.repo));
    if !p2.is_empty() {
        refuse(st, Phase::EarlyParityScaffolding, p2).await?;
        return Ok(false);
    }
    record(
        st,
        Phase::EarlyParityScaffolding,
        GateOutcome::Passed,
        vec![],
    )
    .await?;
    record(
        st,
        Phase::ReuseGateAndComponentDispatch,
        GateOutcome::Pending,
        vec!["reuse decisions are not recorded by fvd yet; every component is dispatched".into()],
    )
    .await?;
    record(
        st,
        Phase::NativeComponentPrototype,
        GateOutcome::Pending,
        vec!["prototype key dumps are not driven by fvd yet".into()],
    )
    .await?;
    match st
        .args
        .spec
        .prep
        .get("needs_conversion")
        .map(String::as_str)
    {
        Some("no") => {
            record(
                st,
                Phase::ParamMappingAndWeightConversion,
                GateOutcome::Passed,
                vec!["needs_conversion: no".into()],
            )
            .await?
        }
        other => {
            record(
                st,
                Phase::ParamMappingAndWeightConversion,
                GateOutcome::Pending,
                vec![format!(
                    "needs_conversion: {}; conversion is not driven by fvd yet",
                    other.unwrap_or("missing")
                )],
            )
            .await?
        }
    }
    Ok(true)
}

/// The port's diagnosers, for the components that have a trace table or
/// variants, linked to the gate.
async fn spawn_diagnosers(
    myself: &ActorRef<GateMsg>,
    st: &mut GateState,
) -> Result<(), ActorProcessingErr> {
    if st.args.spec.components.iter().any(|c| c.trace.is_some()) {
        let t = crate::diagnosis::spawn_for_port(
            crate::trace_actor::TraceActor,
            crate::trace_actor::TRACE_JOB_SUFFIX,
            myself.get_cell(),
            diagnoser_args(&st.args),
        );
        st.diagnosers.trace = Some(t.await?.get_derived());
    }
    if st
        .args
        .spec
        .components
        .iter()
        .any(|c| !c.variants.is_empty())
    {
        let v = crate::diagnosis::spawn_for_port(
            crate::variant_actor::VariantActor,
            crate::variant_actor::VARIANT_JOB_SUFFIX,
            myself.get_cell(),
            diagnoser_args(&st.args),
        );
        st.diagnosers.variants = Some(v.await?.get_derived());
    }
    Ok(())
}

/// The port is cancelled: its jobs go, its unfinished components end
/// `blocked` with the reason, and the port is `cancelled` in P6.
async fn cancel(st: &mut GateState) -> Result<(), ActorProcessingErr> {
    stop_port(
        st,
        RecordedVerdict::Cancelled,
        "cancelled: the port was cancelled",
        "the port was cancelled".into(),
        PortState::Cancelled,
    )
    .await
}

/// Stops the port in P6: its jobs cancelled, its unfinished components
/// `blocked` with `verdict` and `reason`, P6 refused with `refused`, and
/// the port left in `state`.
async fn stop_port(
    st: &mut GateState,
    verdict: RecordedVerdict,
    reason: &str,
    refused: String,
    state: PortState,
) -> Result<(), ActorProcessingErr> {
    st.args.scheduler.cast(SchedulerMsg::CancelFamily {
        family: st.args.family.clone(),
    })?;
    for c in &st.args.spec.components {
        if !st.finals.contains_key(&c.name) {
            st.args
                .store
                .set_component(
                    &st.args.family,
                    &c.name,
                    ComponentStatus::Blocked,
                    verdict,
                    reason,
                    "",
                )
                .await?;
        }
    }
    let phase = Phase::ComponentParityDebug;
    record(st, phase, GateOutcome::Refused, vec![refused]).await?;
    st.args
        .store
        .set_port_state(&st.args.family, state, &phase.id())
        .await?;
    Ok(())
}

impl Actor for GateActor {
    type Msg = GateMsg;
    type State = GateState;
    type Arguments = GateArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: GateArgs,
    ) -> Result<GateState, ActorProcessingErr> {
        let recorded = args.store.gate_events(&args.family).await?;
        // One trace per port: this run's span continues the port's stored
        // trace, or starts it (see `GateArgs::trace`).
        let span = tracing::info_span!(
            parent: None,
            "port",
            "fvd.family" = %args.family,
            // A port run is a pipeline run in CI/CD terms.
            "cicd.pipeline.name" = %args.family,
            "fvd.components" = args.spec.components.len() as i64,
            "fvd.state" = Empty,
            "fvd.phase" = Empty,
        );
        args.trace.apply(&span);
        if args.trace.record
            && let Some(tp) =
                fvd_telemetry::traceparent(&span).filter(|t| fvd_telemetry::sampled(t))
        {
            // Later runs of the port (a resume in another process, an
            // answer, a restart) continue this trace.
            args.store.set_port_traceparent(&args.family, &tp).await?;
        }
        let wave = args
            .spec
            .parity_components()
            .map(|c| c.name.clone())
            .collect();
        Ok(GateState {
            restarts: Default::default(),
            fvd: Arc::new(FvdDir::new(Path::new(&args.repo), &args.family)),
            args,
            recorded,
            finals: Default::default(),
            phase: Phase::ComponentParityDebug,
            wave,
            asking: Default::default(),
            waiting_env: Default::default(),
            done: false,
            span,
            phase_span: None,
            diagnosers: Default::default(),
            starting: None,
            pipeline_code: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        st: &mut GateState,
    ) -> Result<(), ActorProcessingErr> {
        myself.send_interval(FVD_CHECK_EVERY, || GateMsg::CheckFvd);
        trace_prep_escape(st);
        // P0–P5: the predicates fvd can evaluate before component work.
        let p0 = prep_conditions(&st.args.spec, Path::new(&st.args.repo));
        if !p0.is_empty() {
            refuse(st, Phase::ScopeAndHandoffGate, p0).await?;
            // Nothing was dispatched: the port ends here.
            return finish(&myself, st).await;
        }
        if !before_components(st).await? {
            return finish(&myself, st).await;
        }
        // The phase is committed before the event that announces it: a
        // reader that sees "P6 entered" sees the port in P6.
        st.args
            .store
            .set_port_state(
                &st.args.family,
                PortState::Running,
                &Phase::ComponentParityDebug.id(),
            )
            .await?;
        record(
            st,
            Phase::ComponentParityDebug,
            GateOutcome::Entered,
            vec![],
        )
        .await?;
        spawn_diagnosers(&myself, st).await?;
        // The components queue their first runs one by one: the port's
        // placement waits until all are queued, so the policy (longest
        // expected GPU-time first, by default) orders all of them instead
        // of the first few to arrive taking the free GPUs.
        let names = st.wave.clone();
        if names.len() > 1 {
            st.args.scheduler.cast(SchedulerMsg::HoldFamily {
                family: st.args.family.clone(),
                for_ms: FIRST_PLACEMENT_HOLD.as_millis() as i64,
            })?;
            st.starting = Some(names);
        }
        let parity: Vec<fvd_spec::ComponentSpec> =
            st.args.spec.parity_components().cloned().collect();
        for c in parity {
            spawn_component(&myself, st, &c).await?;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: GateMsg,
        st: &mut GateState,
    ) -> Result<(), ActorProcessingErr> {
        if st.done {
            return Ok(());
        }
        match msg {
            GateMsg::ComponentFinal(row) => {
                st.asking.remove(&row.name);
                st.waiting_env.remove(&row.name);
                let name = row.name.clone();
                st.finals.insert(name.clone(), row);
                if !st.wave.iter().all(|n| st.finals.contains_key(n)) {
                    pause_if_only_questions_remain(st).await?;
                } else if st.wave.contains(&name) {
                    let ended = match st.phase {
                        Phase::PipelineStagesAndVariants => after_step(&myself, st, &name).await?,
                        Phase::ParityActivationAndLocalVerification => {
                            verify::after_verification(&myself, st, &name).await?
                        }
                        Phase::QualityRegression => {
                            verify::after_quality(&myself, st, &name).await?
                        }
                        _ => after_components(&myself, st).await?,
                    };
                    if ended {
                        finish(&myself, st).await?;
                    }
                }
            }
            GateMsg::ComponentAsks(row) => {
                spans::escape_hatch(&st.span, &Phase::ComponentParityDebug.id(), "ask_user");
                st.asking.insert(row.name);
                pause_if_only_questions_remain(st).await?;
            }
            GateMsg::ComponentWaitsEnv(name) => {
                spans::environment_wait(&st.span, &Phase::ComponentParityDebug.id(), &name);
                st.waiting_env.insert(name);
                pause_if_only_questions_remain(st).await?;
            }
            GateMsg::EnvironmentFixed(name) => {
                if st.waiting_env.remove(&name) {
                    st.args
                        .store
                        .set_port_state(&st.args.family, PortState::Running, &st.phase.id())
                        .await?;
                }
            }
            GateMsg::Answered { component, id } => {
                st.asking.remove(&component);
                st.args
                    .store
                    .set_port_state(&st.args.family, PortState::Running, &st.phase.id())
                    .await?;
                match ractor::registry::where_is(actor_name(&st.args.family, &component)) {
                    Some(cell) => {
                        cell.send_message(crate::component::ComponentMsg::Answered { id })?
                    }
                    None => {
                        tracing::warn!(family = %st.args.family, %component, %id, "answer for a component that is not running here")
                    }
                }
            }
            GateMsg::ConversionRetry { component, request } => {
                record(
                    st,
                    Phase::ParamMappingAndWeightConversion,
                    GateOutcome::Reopened,
                    vec![format!(
                        "component {component} returned a conversion_retry_request: {request}; conversion is not driven by fvd, so the component stays blocked until conversion is redone and the port resubmitted"
                    )],
                )
                .await?;
            }
            GateMsg::Respawn(name) => respawn(&myself, st, &name).await?,
            GateMsg::ComponentStarted(name) => {
                if let Some(starting) = &mut st.starting {
                    starting.remove(&name);
                    if starting.is_empty() {
                        st.starting = None;
                        st.args.scheduler.cast(SchedulerMsg::ReleaseFamily {
                            family: st.args.family.clone(),
                        })?;
                    }
                }
            }
            GateMsg::CheckFvd => {
                if let Err(why) = st.fvd.check() {
                    fvd_vanished(&myself, st, &why).await?;
                }
            }
            GateMsg::Cancel => {
                cancel(st).await?;
                finish(&myself, st).await?;
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        evt: SupervisionEvent,
        st: &mut GateState,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ActorFailed(who, err) = evt {
            // A crashed component actor is restarted from the store: it
            // finds its recorded verdict or queues a fresh run. One that
            // fails again at once waits longer each time, logged once.
            let Some(c) = st
                .args
                .spec
                .components
                .iter()
                .find(|c| who.get_name() == Some(actor_name(&st.args.family, &c.name)))
                .map(|c| c.name.clone())
            else {
                return Ok(());
            };
            let r = st.restarts.failed(&c, std::time::Instant::now());
            if r.first {
                tracing::error!(component = %c, %err, "component actor failed; restarting it from the store");
            } else {
                tracing::debug!(component = %c, %err, failures = r.count, after_ms = r.after.as_millis() as u64, "component actor failed again; restarting it later");
            }
            if r.after.is_zero() {
                respawn(&myself, st, &c).await?;
            } else {
                myself.send_after(r.after, move || GateMsg::Respawn(c));
            }
        }
        Ok(())
    }
}

/// Starts component `name`'s actor again from the store, unless it is final.
async fn respawn(
    myself: &ActorRef<GateMsg>,
    st: &mut GateState,
    name: &str,
) -> Result<(), ActorProcessingErr> {
    if st.finals.contains_key(name) {
        return Ok(());
    }
    let rows = st.args.store.components(&st.args.family).await?;
    let running = rows.iter().any(|r| r.name == name && !r.is_final());
    let Some(c) = st
        .args
        .spec
        .components
        .iter()
        .find(|c| c.name == name)
        .cloned()
    else {
        return Ok(());
    };
    if running {
        spawn_component(myself, st, &c).await?;
    }
    Ok(())
}

/// Component actors are named `family/component`, so a supervision event
/// says which component failed.
fn actor_name(family: &str, component: &str) -> String {
    format!("{family}/{component}")
}

async fn spawn_component(
    myself: &ActorRef<GateMsg>,
    st: &GateState,
    c: &fvd_spec::ComponentSpec,
) -> Result<(), ActorProcessingErr> {
    spawn_reopened(myself, st, c, None).await
}

/// [`spawn_component`], for a passing component the pipeline sent back
/// (`reopen`); a pipeline step runs at the commit that holds the
/// components' fixes.
async fn spawn_reopened(
    myself: &ActorRef<GateMsg>,
    st: &GateState,
    c: &fvd_spec::ComponentSpec,
    reopen: Option<crate::component::Reopen>,
) -> Result<(), ActorProcessingErr> {
    let parent = match &st.phase_span {
        Some((_, span)) => span.clone(),
        None => st.span.clone(),
    };
    // A component's actor stays after its verdict (answers reach it): one
    // that runs again replaces it.
    if let Some(cell) = ractor::registry::where_is(actor_name(&st.args.family, &c.name)) {
        let _ = cell
            .stop_and_wait(Some("it runs again".into()), Some(STOP_WAIT))
            .await;
    }
    // P7's steps and everything after run at the commit that holds the
    // components' fixes, a component P9 runs again included.
    let code = match &st.pipeline_code {
        Some(code)
            if c.stage != fvd_spec::Stage::Component
                || st.phase == Phase::ParityActivationAndLocalVerification =>
        {
            code.clone()
        }
        _ => st.args.code.clone(),
    };
    let args = ComponentArgs {
        span: parent,
        family: st.args.family.clone(),
        spec: c.clone(),
        repo: st.args.repo.clone(),
        code,
        store: st.args.store.clone(),
        scheduler: st.args.scheduler.clone(),
        gate: myself.clone(),
        events: st.args.events.clone(),
        diagnosers: st.diagnosers.clone(),
        agents: st.args.agents.clone(),
        fvd: st.fvd.clone(),
        reopen,
    };
    Actor::spawn_linked(
        Some(actor_name(&st.args.family, &c.name)),
        ComponentSubagentActor,
        args,
        myself.get_cell(),
    )
    .await?;
    Ok(())
}

/// What the port's diagnosers (trace, variants) are spawned with.
fn diagnoser_args(a: &GateArgs) -> crate::diagnosis::DiagnosisArgs {
    crate::diagnosis::DiagnosisArgs {
        family: a.family.clone(),
        code: a.code.clone(),
        store: a.store.clone(),
        scheduler: a.scheduler.clone(),
    }
}

/// P6's end and P7–P11 once every component is final.
/// When every component is final, waiting for an answer or waiting for an
/// environment (and one is waiting), the port pauses: state `ask_user`, or
/// `environment` when a component waits for one (an answer would not get
/// it running), `PORT_STATUS.md` written, and watchers told it ended for
/// now. The actors stay: an answer, or a worker that can run the waiting
/// component, resumes it where it is.
async fn pause_if_only_questions_remain(st: &mut GateState) -> Result<(), ActorProcessingErr> {
    let waiting = st.asking.len() + st.waiting_env.len();
    let finals = st
        .wave
        .iter()
        .filter(|n| st.finals.contains_key(*n))
        .count();
    if waiting == 0 || finals + waiting < st.wave.len() {
        return Ok(());
    }
    if let Err(why) = st.fvd.check() {
        // Nothing of a port whose folder went away is written.
        tracing::warn!(family = %st.args.family, %why, "not pausing: the port stops");
        return Ok(());
    }
    let state = if st.waiting_env.is_empty() {
        PortState::AskUser
    } else {
        PortState::Environment
    };
    st.args
        .store
        .set_port_state(&st.args.family, state, &st.phase.id())
        .await?;
    // An embedded process ends here: its port span says where it stands.
    spans::port_paused(&st.span, &st.phase.id(), state.as_str());
    match crate::port_status::write(&st.args.store, &st.args.family).await {
        Ok(written) => tracing::info!(%written, state = state.as_str(), "port paused"),
        Err(e) => {
            tracing::error!(family = %st.args.family, error = %e, "could not write PORT_STATUS.md")
        }
    }
    let _ = st.args.events.send(PortEvent::Finished {
        family: st.args.family.clone(),
    });
    Ok(())
}

/// P6's end once every component is final: P7 refused while one is not
/// a pass; else the pipeline's first step is started (`Ok(false)`: the
/// port goes on), or, without a `[pipeline]`, P7–P11 recorded pending
/// (`Ok(true)`: the port ends here).
async fn after_components(
    myself: &ActorRef<GateMsg>,
    st: &mut GateState,
) -> Result<bool, ActorProcessingErr> {
    record(
        st,
        Phase::ComponentParityDebug,
        GateOutcome::Passed,
        vec!["every component is non_skip_pass or blocked".into()],
    )
    .await?;
    let unmet: Vec<String> = st
        .args
        .spec
        .parity_components()
        .filter_map(|c| {
            let row = &st.finals[&c.name];
            (row.status != ComponentStatus::NonSkipPass)
                .then(|| format!("component {} is {} ({})", c.name, row.status, row.reason))
        })
        .collect();
    if !unmet.is_empty() {
        refuse(st, Phase::PipelineStagesAndVariants, unmet).await?;
        return Ok(true);
    }
    let first = st.args.spec.pipeline_steps().next().cloned();
    let Some(first) = first else {
        wait_after(st, Phase::PipelineStagesAndVariants).await?;
        return Ok(true);
    };
    match fixes_together(st).await? {
        Ok(code) => st.pipeline_code = Some(code),
        Err(why) => {
            refuse(st, Phase::PipelineStagesAndVariants, vec![why]).await?;
            return Ok(true);
        }
    }
    let steps = st
        .args
        .spec
        .pipeline_steps()
        .map(|c| c.name.clone())
        .collect();
    forget_of_other_code(st, steps).await?;
    // P7: the pipeline's steps, one at a time in P9's order (a red smoke
    // test stops before the parity test), each run as a component is.
    st.args
        .store
        .set_port_state(
            &st.args.family,
            PortState::Running,
            &Phase::PipelineStagesAndVariants.id(),
        )
        .await?;
    record(
        st,
        Phase::PipelineStagesAndVariants,
        GateOutcome::Entered,
        vec![],
    )
    .await?;
    st.phase = Phase::PipelineStagesAndVariants;
    st.wave = [first.name.clone()].into();
    spawn_component(myself, st, &first).await?;
    Ok(false)
}

/// A pipeline step is final: the next one starts after a pass (`Ok(false)`);
/// a step that is not a pass refuses P7 with its verdict, and the last
/// step's pass passes P7 (`Ok(true)` either way: the port ends here).
async fn after_step(
    myself: &ActorRef<GateMsg>,
    st: &mut GateState,
    name: &str,
) -> Result<bool, ActorProcessingErr> {
    let steps: Vec<fvd_spec::ComponentSpec> = st.args.spec.pipeline_steps().cloned().collect();
    let row = &st.finals[name];
    let test = steps
        .iter()
        .find(|c| c.name == name)
        .map(|c| c.parity_tests.join(" "))
        .unwrap_or_default();
    if row.status != ComponentStatus::NonSkipPass {
        let why = format!("{name} ({test}) is {} ({})", row.status, row.reason);
        if let Some((named, evidence)) = returned_to_p6(st, name).await? {
            return match named {
                Ok(owner) => {
                    let cause = Cause::AgentReturned(&evidence);
                    reopen(myself, st, name, why, cause, &owner).await
                }
                Err(whynot) => {
                    let whynot = format!("the pipeline's agent returned to phase 6, but {whynot}");
                    refuse(st, Phase::PipelineStagesAndVariants, vec![why, whynot]).await?;
                    Ok(true)
                }
            };
        }
        let module = match name == fvd_spec::later::PARITY_STEP {
            true => first_divergent_module(st, name).await?,
            false => None,
        };
        let owner = module
            .as_deref()
            .and_then(|m| st.args.spec.owner_of(m))
            .map(|c| c.name.clone());
        match (module, owner) {
            (Some(module), Some(owner)) => {
                let cause = Cause::Divergence(&module);
                return reopen(myself, st, name, why, cause, &owner).await;
            }
            (Some(module), None) => {
                let whose = format!(
                    "its first divergence, {module}, is in no component's modules: the pipeline's own (its inputs, scheduler or glue), or a component's `modules` is missing it"
                );
                refuse(st, Phase::PipelineStagesAndVariants, vec![why, whose]).await?;
            }
            (None, _) => refuse(st, Phase::PipelineStagesAndVariants, vec![why]).await?,
        }
        return Ok(true);
    }
    took_the_agents_fix(st, name).await?;
    if let Some(next) = steps.iter().skip_while(|c| c.name != name).nth(1) {
        st.wave = [next.name.clone()].into();
        spawn_component(myself, st, next).await?;
        return Ok(false);
    }
    let has_parity = steps.iter().any(|c| c.name == fvd_spec::later::PARITY_STEP);
    if !has_parity {
        record(
            st,
            Phase::PipelineStagesAndVariants,
            GateOutcome::Pending,
            vec!["the pipeline smoke test passes; P7 needs a pipeline parity test ([pipeline] parity_test)".into()],
        )
        .await?;
        wait_after(st, Phase::PipelineStagesAndVariants).await?;
        return Ok(true);
    }
    let passed: Vec<String> = steps
        .iter()
        .map(|c| format!("{} non_skip_pass", c.name))
        .collect();
    record(
        st,
        Phase::PipelineStagesAndVariants,
        GateOutcome::Passed,
        vec![passed.join(", ")],
    )
    .await?;
    verify::verification(myself, st).await
}

/// A pipeline step that passed at its agent's commit: the steps after it,
/// P9 and P10 run at that commit (it descends from the one the step ran
/// at, so it holds the components' fixes too).
async fn took_the_agents_fix(st: &mut GateState, name: &str) -> Result<(), ActorProcessingErr> {
    let jobs = st.args.store.jobs_of(&st.args.family, name).await?;
    let passed = jobs
        .iter()
        .rev()
        .find(|j| j.state == fvd_store::model::JobState::Finished)
        .filter(|j| j.verdict.is_pass() && !j.commit.is_empty());
    if let (Some(j), Some(code)) = (passed, st.pipeline_code.as_mut())
        && j.commit != code.commit
    {
        tracing::info!(family = %st.args.family, step = %name, commit = %j.commit, "the pipeline's agent fixed the step: what follows runs at its commit");
        code.commit = j.commit.clone();
    }
    Ok(())
}

/// Sends the port back to P6 for `owner` after pipeline step `step` was
/// red for `cause` (`Ok(false)`: the owner's agent runs; `Ok(true)`: the
/// port ends here, blocked at P6 until the owner's code changes).
async fn reopen(
    myself: &ActorRef<GateMsg>,
    st: &mut GateState,
    step: &str,
    why: String,
    cause: Cause<'_>,
    owner: &str,
) -> Result<bool, ActorProcessingErr> {
    let Some(reopen) = back_to_component(st, step, why, cause, owner).await? else {
        return Ok(true);
    };
    let c = st.args.spec.components.iter().find(|c| c.name == owner);
    let c = c.cloned().ok_or("the owner is a component of the spec")?;
    st.finals.remove(owner);
    st.phase = Phase::ComponentParityDebug;
    st.wave = [owner.to_string()].into();
    spawn_reopened(myself, st, &c, Some(reopen)).await?;
    Ok(false)
}

/// Whether pipeline step `step`'s agent ended its loop with
/// `return_to_phase_6`: then the component its blockers name (`Err`: why
/// none can be chosen) and the blockers, on one line.
async fn returned_to_p6(
    st: &GateState,
    step: &str,
) -> Result<Option<(Result<String, String>, String)>, ActorProcessingErr> {
    use fvd_contracts::Contract;
    use fvd_contracts::pipeline::{PipelineHandoff, PipelineNextStep};
    use fvd_workspace::agent::pipeline;
    let attempts = st.args.store.attempts(&st.args.family, step).await?;
    let Some(last) = attempts.last() else {
        return Ok(None);
    };
    // only an answer to the step's latest run: a return the port already
    // went back for is not read again once the step ran since
    let jobs = st.args.store.jobs_of(&st.args.family, step).await?;
    let latest = jobs
        .iter()
        .rev()
        .find(|j| j.state == fvd_store::model::JobState::Finished);
    if latest.is_none_or(|j| j.job_id != last.job_before) {
        return Ok(None);
    }
    let Ok(h) = PipelineHandoff::parse(&last.handoff_text) else {
        return Ok(None);
    };
    if h.next_step != PipelineNextStep::ReturnToPhase6 {
        return Ok(None);
    }
    let names: Vec<String> = st
        .args
        .spec
        .parity_components()
        .map(|c| c.name.clone())
        .collect();
    let named = pipeline::named_component(&h, &names).map(str::to_string);
    Ok(Some((named, pipeline::blockers(&h))))
}

/// The first divergent module of the pipeline parity test's latest traced
/// investigation (`[pipeline.trace]`), when it found one.
async fn first_divergent_module(
    st: &GateState,
    step: &str,
) -> Result<Option<String>, ActorProcessingErr> {
    let inv = st.args.store.latest_trace(&st.args.family, step).await?;
    Ok(inv.and_then(|i| {
        i.steps
            .iter()
            .rev()
            .map(|s| s.first_module.clone())
            .find(|m| !m.is_empty())
    }))
}

/// A red pipeline parity test whose first divergence lies in `owner`'s
/// modules: the port goes back to P6 for that component, as the workflow
/// asks, rather than patch around it in the pipeline. With an agent, the
/// component is reopened: P7 is recorded refused, then P6 reopened, the
/// port runs at P6 again, and the [`Reopen`](crate::component::Reopen)
/// returned starts its agent from the pipeline's red run. Without one, P6
/// is recorded reopened (before P7's refusal, so the refusal is the port's
/// current reason) and the port is blocked at P6 until the component's
/// code changes; its own parity test still passes, so no verdict of it
/// moves.
async fn back_to_component(
    st: &mut GateState,
    step: &str,
    why: String,
    cause: Cause<'_>,
    owner: &str,
) -> Result<Option<crate::component::Reopen>, ActorProcessingErr> {
    let reopened = crate::pipeline_words::reopened_by_pipeline(owner, cause);
    let whose = crate::pipeline_words::whose(owner, cause);
    let agent = st
        .args
        .spec
        .components
        .iter()
        .any(|c| c.name == owner && c.agent.is_some());
    if agent {
        let red = st
            .args
            .store
            .jobs_of(&st.args.family, step)
            .await?
            .into_iter()
            .rev()
            .find(|j| j.state == fvd_store::model::JobState::Finished);
        let Some(red) = red else {
            return Err("a red pipeline step has a finished run".into());
        };
        let result = fvd_store::model::JobResult {
            verdict: red.verdict,
            reason: crate::pipeline_words::task(owner, cause, &why),
            output_tail: red.output_tail.clone(),
            ..fvd_store::model::JobResult::default()
        };
        record(
            st,
            Phase::PipelineStagesAndVariants,
            GateOutcome::Refused,
            vec![
                why,
                format!("{whose}; its agent gets the pipeline's evidence"),
            ],
        )
        .await?;
        record(
            st,
            Phase::ComponentParityDebug,
            GateOutcome::Reopened,
            vec![reopened],
        )
        .await?;
        st.args
            .store
            .set_port_state(
                &st.args.family,
                PortState::Running,
                &Phase::ComponentParityDebug.id(),
            )
            .await?;
        return Ok(Some(crate::component::Reopen {
            job_id: red.job_id,
            result,
        }));
    }
    record(
        st,
        Phase::ComponentParityDebug,
        GateOutcome::Reopened,
        vec![reopened],
    )
    .await?;
    record(
        st,
        Phase::PipelineStagesAndVariants,
        GateOutcome::Refused,
        vec![why, whose],
    )
    .await?;
    st.args
        .store
        .set_port_state(
            &st.args.family,
            PortState::Blocked,
            &Phase::ComponentParityDebug.id(),
        )
        .await?;
    Ok(None)
}

/// The port's code with every agent component's passing fix in it, and
/// the pipeline agent's: what P7's steps run at. `Err` names fixes that
/// conflict.
async fn fixes_together(
    st: &GateState,
) -> Result<Result<fvd_store::model::PortCode, String>, ActorProcessingErr> {
    let code = st.args.code.clone();
    if code.commit.is_empty() {
        return Ok(Ok(code));
    }
    let mut fixes = Vec::new();
    // the components' fixes, and a fix the pipeline's own agent made
    let steps = st.args.spec.parity_components();
    for c in steps.chain(st.args.spec.pipeline_steps()) {
        if c.agent.is_none() {
            continue;
        }
        let jobs = st.args.store.jobs_of(&st.args.family, &c.name).await?;
        let passed = jobs
            .iter()
            .rev()
            .find(|j| j.state == fvd_store::model::JobState::Finished);
        if let Some(j) = passed.filter(|j| j.verdict.is_pass()) {
            fixes.push(fvd_workspace::together::Fix {
                component: c.name.clone(),
                commit: j.commit.clone(),
            });
        }
    }
    let repo = Path::new(&st.args.repo);
    match fvd_workspace::together::together(repo, &st.args.family, &code.commit, &fixes).await {
        Ok(commit) => {
            if commit != code.commit {
                tracing::info!(family = %st.args.family, %commit, "P7 runs at the commit holding the components' fixes");
            }
            Ok(Ok(fvd_store::model::PortCode { commit, ..code }))
        }
        Err(e) => Ok(Err(e.to_string())),
    }
}

/// A step (of P7, P9 or P10) whose recorded verdict is of other code than
/// the pipeline runs now (a component was fixed since) runs again: its row
/// goes back to pending.
async fn forget_of_other_code(
    st: &mut GateState,
    names: Vec<String>,
) -> Result<(), ActorProcessingErr> {
    let Some(code) = st.pipeline_code.clone() else {
        return Ok(());
    };
    let rows = st.args.store.components(&st.args.family).await?;
    for name in names {
        if !rows.iter().any(|r| r.name == name && r.is_final()) {
            continue;
        }
        let jobs = st.args.store.jobs_of(&st.args.family, &name).await?;
        let last = jobs
            .iter()
            .rev()
            .find(|j| j.state == fvd_store::model::JobState::Finished);
        if last.is_some_and(|j| j.commit != code.commit) {
            tracing::info!(family = %st.args.family, step = %name, "the step's verdict is of other code: it runs again");
            st.args
                .store
                .reset_component(&st.args.family, &name)
                .await?;
            st.finals.remove(&name);
        }
    }
    Ok(())
}

/// Records the phases fvd does not drive, from `from` on, as pending with
/// why, and leaves the port waiting at `from`.
async fn wait_after(st: &mut GateState, from: Phase) -> Result<(), ActorProcessingErr> {
    for (phase, why) in after_parity(&st.args.spec) {
        if phase.number() >= from.number() {
            record(st, phase, GateOutcome::Pending, vec![why]).await?;
        }
    }
    st.args
        .store
        .set_port_state(&st.args.family, PortState::Waiting, &from.id())
        .await?;
    Ok(())
}

/// Why each phase after component parity that fvd does not drive waits,
/// naming the tests the spec declares for it (`[pipeline]`, `[quality]`)
/// where fvd does not run them, rather than read a declared test as a
/// pass. P7 is listed for a spec without pipeline steps; with them, P7
/// runs them.
pub fn after_parity(spec: &fvd_spec::PortSpec) -> Vec<(Phase, String)> {
    let pipeline = spec.pipeline.as_ref();
    let p9 = match pipeline {
        Some(p) => format!(
            "ordered verification at the commit P7 passes at (component parity, then {}) runs once P7 passes",
            p.steps().join(", ")
        ),
        None => "ordered verification needs the pipeline's smoke and parity tests and its example (no [pipeline] in the spec)".into(),
    };
    let p10 = match &spec.quality {
        Some(q) => format!("quality regression {} runs after P9", q.tests.join(", ")),
        None => "no [quality] test in the spec: a video SSIM or an audio metric test, or a person's explicit deferral".into(),
    };
    let mut out = Vec::new();
    if spec.pipeline_steps().next().is_none() {
        out.push((
            Phase::PipelineStagesAndVariants,
            "pipeline definition is not driven by fvd yet (no [pipeline] in the spec)".to_string(),
        ));
    }
    out.extend([
        (
            Phase::PipelineConfigPresetsRegistryExamples,
            "pipeline config, presets and registry are a person's to accept (no pipeline handoff covers them)".into(),
        ),
        (Phase::ParityActivationAndLocalVerification, p9),
        (Phase::QualityRegression, p10),
        (
            Phase::PostParityReviewAndHandoff,
            "post-parity review and handoff need a person".into(),
        ),
    ]);
    out
}

/// The number of a recorded phase id (`P7` → 7).
fn phase_number(id: &str) -> Option<u8> {
    id.strip_prefix('P')?.parse().ok()
}

/// Records a refusal and blocks the port at `phase`.
async fn refuse(
    st: &mut GateState,
    phase: Phase,
    conditions: Vec<String>,
) -> Result<(), ActorProcessingErr> {
    record(st, phase, GateOutcome::Refused, conditions).await?;
    st.args
        .store
        .set_port_state(&st.args.family, PortState::Blocked, &phase.id())
        .await?;
    Ok(())
}

/// The port's `REPO/.fvd` was deleted or replaced while it ran: the port
/// stops with that reason (its runs cancelled, its unfinished components
/// and P6 refused with it, the port blocked) and nothing of it reaches
/// `PORT_STATUS.md`. In embedded mode these writes go to a database that
/// was deleted with the folder: they only tell the watcher in this process.
async fn fvd_vanished(
    myself: &ActorRef<GateMsg>,
    st: &mut GateState,
    why: &str,
) -> Result<(), ActorProcessingErr> {
    let reason = crate::fvd_dir::stop_reason(why);
    tracing::error!(family = %st.args.family, %reason, "the port's .fvd folder went away; the port stops");
    myself.stop_children(Some("the port's .fvd went away".into()));
    stop_port(
        st,
        RecordedVerdict::Stopped,
        &reason,
        reason.clone(),
        PortState::Blocked,
    )
    .await?;
    finish_without_status(myself, st).await
}

async fn finish(myself: &ActorRef<GateMsg>, st: &mut GateState) -> Result<(), ActorProcessingErr> {
    if let Err(why) = st.fvd.check() {
        return fvd_vanished(myself, st, &why).await;
    }
    // A status file that cannot be written is reported, not fatal: the
    // store holds the truth and the next run writes the file again.
    match crate::port_status::write(&st.args.store, &st.args.family).await {
        Ok(written) => tracing::info!(%written, "PORT_STATUS.md"),
        Err(e) => {
            tracing::error!(family = %st.args.family, error = %e, "could not write PORT_STATUS.md")
        }
    }
    finish_without_status(myself, st).await
}

/// The port's end, `PORT_STATUS.md` left to the caller: spans closed,
/// watchers told, actors stopped.
async fn finish_without_status(
    myself: &ActorRef<GateMsg>,
    st: &mut GateState,
) -> Result<(), ActorProcessingErr> {
    st.done = true;
    if let Ok(Some(port)) = st.args.store.port(&st.args.family).await {
        st.span.record("fvd.state", port.state.as_str());
        st.span.record("fvd.phase", port.phase.as_str());
        if port.state == PortState::Blocked {
            spans::failed(&st.span, &format!("blocked at {}", port.phase));
        }
    }
    let _ = st.args.events.send(PortEvent::Finished {
        family: st.args.family.clone(),
    });
    // Closing the spans now exports them now, not when the actor is reaped.
    st.phase_span = None;
    st.span = Span::none();
    // Component actors of a cancelled port may still wait on runs that will
    // never report: they end with the port.
    myself.stop_children(Some("port finished".into()));
    myself.stop(Some("port finished".into()));
    Ok(())
}

/// Records a gate event unless the latest event of that phase already says
/// the same (a resumed port re-evaluates its predicates).
async fn record(
    st: &mut GateState,
    phase: Phase,
    outcome: GateOutcome,
    conditions: Vec<String>,
) -> Result<(), ActorProcessingErr> {
    // A phase decided at once is a short span; one entered stays open (and
    // parents the work inside it) until its decision is recorded.
    let span = match st.phase_span.take() {
        Some((id, span)) if id == phase.id() => span,
        open => {
            st.phase_span = open;
            tracing::info_span!(parent: &st.span, "phase", "fvd.phase" = %phase.id(), "fvd.family" = %st.args.family, "fvd.outcome" = Empty)
        }
    };
    span.record("fvd.outcome", outcome.as_str());
    match outcome {
        GateOutcome::Refused => {
            spans::gate_refused(&span, &phase.id(), &conditions);
            spans::failed(&span, &conditions.join("; "));
        }
        GateOutcome::Passed => spans::succeeded(&span),
        GateOutcome::Entered | GateOutcome::Pending | GateOutcome::Reopened => {}
    }
    if outcome == GateOutcome::Entered {
        st.phase_span = Some((phase.id(), span));
    }
    // The same decision as this phase's last is not recorded again, unless
    // the gate went back behind the phase since (a resume enters P6 again):
    // then the decision is said anew, so the port's current refusal or
    // pending reason is the one after its latest entered phase.
    let same = st
        .recorded
        .iter()
        .rposition(|e| e.phase == phase.id())
        .is_some_and(|i| {
            let e = &st.recorded[i];
            let went_back = st.recorded[i + 1..].iter().any(|later| {
                matches!(later.outcome, GateOutcome::Entered | GateOutcome::Reopened)
                    && phase_number(&later.phase).is_some_and(|n| n < phase.number())
            });
            e.outcome == outcome && e.conditions == conditions && !went_back
        });
    if same {
        return Ok(());
    }
    let ev = st
        .args
        .store
        .record_gate(&st.args.family, &phase.id(), outcome, &conditions)
        .await?;
    st.recorded.push(ev.clone());
    let _ = st.args.events.send(PortEvent::Gate {
        family: st.args.family.clone(),
        event: ev,
    });
    Ok(())
}

#[cfg(test)]
mod tests {

    use super::*;

    const BASE: &str = "[prep]\nmodel_family = \"tiny\"\n\n[[component]]\nname = \"a\"\ntype = \"generic\"\nparity_test = \"t/a.py\"\ncoverage_scope = \"both\"\n";

    fn reasons(extra: &str) -> Vec<(String, String)> {
        let spec =
            fvd_spec::parse(std::path::Path::new("port.toml"), &format!("{BASE}{extra}")).unwrap();
        after_parity(&spec)
            .into_iter()
            .map(|(p, why)| (p.id(), why))
            .collect()
    }

    #[test]
    fn the_phases_after_parity_name_the_declared_tests_and_never_pass() {
        let declared = reasons(
            "\n[pipeline]\nsmoke_test = \"t/smoke.py\"\nparity_test = \"t/parity.py\"\n\n[quality]\ntests = [\"t/ssim.py\"]\n",
        );
        // P7 runs the declared steps: it is not among the pending phases
        let phases: Vec<&str> = declared.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(phases, ["P8", "P9", "P10", "P11"]);
        assert!(
            declared[1].1.contains(
                "(component parity, then smoke test t/smoke.py, parity test t/parity.py)"
            ),
            "{}",
            declared[1].1
        );
        assert!(
            declared[2]
                .1
                .starts_with("quality regression t/ssim.py runs after P9")
        );
        let bare = reasons("");
        let phases: Vec<&str> = bare.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(phases, ["P7", "P8", "P9", "P10", "P11"]);
        assert!(bare[0].1.contains("no [pipeline]"), "{}", bare[0].1);
        assert!(bare[3].1.contains("no [quality]"), "{}", bare[3].1);
    }

    #[test]
    fn recorded_phase_ids_read_back_as_numbers() {
        assert_eq!(phase_number("P7"), Some(7));
        assert_eq!(phase_number("P11"), Some(11));
        assert_eq!(phase_number("7"), None);
    }
}
