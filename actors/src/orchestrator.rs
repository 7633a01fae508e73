//! `OrchestratorActor`: one per process. It starts ports (one gate actor
//! each), resumes them from the store after a restart, and supervises them:
//! a gate actor that fails is restarted from the store, not lost.

use std::collections::HashMap;
use std::path::Path;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::broadcast;

use crate::gate::{GateActor, GateArgs, GateMsg};
use crate::scheduler::SchedulerMsg;
use fvd_store::model::{PortCode, PortEvent, PortRow, PortState};
use fvd_store::{EscapeRow, Store, StoreError};

#[derive(Debug)]
pub struct OrchestratorActor;

#[derive(Debug)]
pub struct OrchestratorArgs {
    pub store: Store,
    pub scheduler: ActorRef<SchedulerMsg>,
    pub events: broadcast::Sender<PortEvent>,
    /// Resume ports left running, paused or waiting by an earlier process
    /// (a fleet orchestrator); embedded mode resumes only what is submitted.
    pub resume_on_start: bool,
    /// Which agent commands run here, jailed how.
    pub agents: fvd_workspace::agent::AgentPolicy,
}

/// A port submission as the edge received it.
#[derive(Debug, Clone)]
pub struct Submission {
    pub family: String,
    pub repo: String,
    pub spec_path: String,
    pub spec_toml: String,
    /// Run every component again instead of resuming.
    pub rerun: bool,
    /// The commit the port runs (full hex sha in `repo`'s repository);
    /// empty when `repo` is not in git.
    pub commit: String,
    /// W3C `traceparent` of the submitter's span (gRPC metadata), so the
    /// port's trace joins the caller's (e.g. an agent's).
    pub traceparent: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    pub family: String,
    pub resumed: bool,
    /// Every component was started over.
    pub rerun: bool,
    /// What the resubmitted spec changed, one line each.
    pub changes: Vec<String>,
    /// The commit the port is pinned to.
    pub commit: String,
}

/// Why a submission or cancellation was refused; crosses the wire as a
/// gRPC status.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PortError {
    #[error("{0}")]
    InvalidSpec(String),
    #[error("spec family {spec} does not match submitted family {submitted}")]
    FamilyMismatch { spec: String, submitted: String },
    #[error("no port of family {0}")]
    UnknownFamily(String),
    #[error("commit {commit} is not in the repository of {repo} as the orchestrator sees it")]
    UnknownCommit { commit: String, repo: String },
    #[error(
        "port {0} is running here for an earlier submission; cancel it (fvd cancel {0}) or wait for it before {1}"
    )]
    Busy(String, &'static str),
    #[error("port {family} is not running here (state {state}); nothing to cancel")]
    NotRunning { family: String, state: PortState },
    #[error("port {family} has no escape hatch {id}")]
    UnknownEscape { family: String, id: String },
    /// The answer does not fit the hatch (an option out of range, an empty
    /// or secret-looking text, a hatch already answered).
    #[error("{0}")]
    InvalidAnswer(String),
    /// The spec's agent command may not run on this orchestrator.
    #[error("{path}: {why}")]
    AgentRefused { path: String, why: String },
    #[error("internal: {0}")]
    Internal(String),
}

/// How a person answers an escape hatch.
#[derive(Debug, Clone, PartialEq)]
pub enum AnswerChoice {
    /// 1-based index into the hatch's options.
    Option(u32),
    Text(String),
}

#[derive(Debug)]
pub enum OrchestratorMsg {
    Submit(Submission, RpcReplyPort<Result<Submitted, PortError>>),
    Cancel(String, RpcReplyPort<Result<(), PortError>>),
    Answer {
        family: String,
        id: String,
        choice: AnswerChoice,
        /// W3C `traceparent` of the answering call, when it sent one.
        traceparent: Option<String>,
        reply: RpcReplyPort<Result<EscapeRow, PortError>>,
    },
    /// Start a failed port's gate again from the store (sent by the
    /// orchestrator itself, after a backoff).
    RestartGate(String),
}

#[derive(Debug)]
pub struct OrchestratorState {
    args: OrchestratorArgs,
    /// Gate actor of each port that is running, by family.
    ports: HashMap<String, ActorRef<GateMsg>>,
    /// Ports a submission in this process started (not resumed at start-up
    /// from an earlier process): a rerun of one of these is refused while
    /// it runs, since its submitter is alive.
    submitted: std::collections::HashSet<String>,
    /// Failed gates, restarted under backoff.
    restarts: crate::restarts::Restarts,
}

impl Actor for OrchestratorActor {
    type Msg = OrchestratorMsg;
    type State = OrchestratorState;
    type Arguments = OrchestratorArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: OrchestratorArgs,
    ) -> Result<OrchestratorState, ActorProcessingErr> {
        Ok(OrchestratorState {
            args,
            ports: HashMap::new(),
            submitted: Default::default(),
            restarts: Default::default(),
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        st: &mut OrchestratorState,
    ) -> Result<(), ActorProcessingErr> {
        // Ports that were running when the process died resume now; so do
        // ports paused on questions, whose answers may come to this process,
        // and ports waiting for an environment, which a worker of this
        // process may have.
        if !st.args.resume_on_start {
            return Ok(());
        }
        for port in st.args.store.ports().await? {
            if port.state.is_unfinished() {
                tracing::info!(family = %port.family, "resuming port from the store");
                if let Err(e) = start_gate(&myself, st, &port, None, false).await {
                    tracing::error!(family = %port.family, error = %e, "could not resume port");
                }
            }
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: OrchestratorMsg,
        st: &mut OrchestratorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            OrchestratorMsg::Submit(sub, reply) => {
                let r = submit(&myself, st, sub).await;
                let _ = reply.send(r);
            }
            OrchestratorMsg::Cancel(family, reply) => {
                let r = match st.ports.get(&family) {
                    Some(gate) => gate
                        .cast(GateMsg::Cancel)
                        .map_err(|e| PortError::Internal(e.to_string())),
                    None => match st.args.store.port(&family).await {
                        Ok(Some(p)) => Err(PortError::NotRunning {
                            family,
                            state: p.state,
                        }),
                        Ok(None) => Err(PortError::UnknownFamily(family)),
                        Err(e) => Err(PortError::Internal(e.to_string())),
                    },
                };
                let _ = reply.send(r);
            }
            OrchestratorMsg::Answer {
                family,
                id,
                choice,
                traceparent,
                reply,
            } => {
                let r = answer(&myself, st, &family, &id, choice, traceparent).await;
                let _ = reply.send(r);
            }
            OrchestratorMsg::RestartGate(family) => restart_gate(&myself, st, &family).await?,
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        evt: SupervisionEvent,
        st: &mut OrchestratorState,
    ) -> Result<(), ActorProcessingErr> {
        match evt {
            SupervisionEvent::ActorTerminated(who, _, _) => {
                let ended: Vec<String> = st
                    .ports
                    .iter()
                    .filter(|(_, g)| g.get_id() == who.get_id())
                    .map(|(f, _)| f.clone())
                    .collect();
                for f in ended {
                    st.ports.remove(&f);
                    st.submitted.remove(&f);
                }
            }
            SupervisionEvent::ActorFailed(who, err) => {
                let family = st
                    .ports
                    .iter()
                    .find(|(_, g)| g.get_id() == who.get_id())
                    .map(|(f, _)| f.clone());
                if let Some(family) = family {
                    st.ports.remove(&family);
                    // Restarted from the store; one that fails again at
                    // once waits longer each time, logged once.
                    let r = st.restarts.failed(&family, std::time::Instant::now());
                    if r.first {
                        tracing::error!(%family, %err, "gate actor failed; restarting the port from the store");
                    } else {
                        tracing::debug!(%family, %err, failures = r.count, after_ms = r.after.as_millis() as u64, "gate actor failed again; restarting it later");
                    }
                    if r.after.is_zero() {
                        restart_gate(&myself, st, &family).await?;
                    } else {
                        myself.send_after(r.after, move || OrchestratorMsg::RestartGate(family));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Starts a failed port's gate again from the store (unless a submission
/// started it meanwhile).
async fn restart_gate(
    myself: &ActorRef<OrchestratorMsg>,
    st: &mut OrchestratorState,
    family: &str,
) -> Result<(), ActorProcessingErr> {
    if st.ports.contains_key(family) {
        return Ok(());
    }
    if let Some(port) = st.args.store.port(family).await? {
        start_gate(myself, st, &port, None, false).await?;
    }
    Ok(())
}

async fn submit(
    myself: &ActorRef<OrchestratorMsg>,
    st: &mut OrchestratorState,
    sub: Submission,
) -> Result<Submitted, PortError> {
    let spec = fvd_spec::parse(Path::new(&sub.spec_path), &sub.spec_toml)
        .map_err(|e| PortError::InvalidSpec(e.to_string()))?;
    if spec.family != sub.family {
        return Err(PortError::FamilyMismatch {
            spec: spec.family,
            submitted: sub.family,
        });
    }
    // Refused before anything is stored: a component would only block on
    // it later (`component.rs` checks again for ports resumed from the
    // store).
    if let Some(why) = spec
        .components
        .iter()
        .filter_map(|c| c.agent.as_ref())
        .find_map(|a| st.args.agents.admits(a).err())
    {
        return Err(PortError::AgentRefused {
            path: sub.spec_path,
            why,
        });
    }
    // No commit (not a git repository), or a full sha the repository has.
    let known_commit = sub.commit.is_empty()
        || (fvd_workspace::commit::is_full_sha(&sub.commit)
            && fvd_workspace::commit::has_commit(Path::new(&sub.repo), &sub.commit).await);
    if !known_commit {
        return Err(PortError::UnknownCommit {
            commit: sub.commit,
            repo: sub.repo,
        });
    }
    let internal = |e: fvd_store::StoreError| PortError::Internal(e.to_string());
    let known = st.args.store.port(&sub.family).await.map_err(internal)?;
    // Runs from now on test the new commit; recorded verdicts stay.
    let recommit = known.as_ref().is_some_and(|p| p.commit != sub.commit);
    let rows = st
        .args
        .store
        .components(&sub.family)
        .await
        .map_err(internal)?;
    let plan = known
        .as_ref()
        .map(|p| replan(p, &spec, &rows))
        .unwrap_or_default();
    if let Some(gate) = st.ports.get(&sub.family).cloned() {
        if !sub.rerun && plan.is_empty() && !recommit {
            return Ok(Submitted {
                family: sub.family,
                resumed: true,
                rerun: false,
                changes: Vec::new(),
                commit: sub.commit,
            });
        }
        // A port whose components are all final or waiting (for an answer
        // or an environment) runs nothing, and one resumed at start-up has
        // no submitter waiting on it: either may be replaced by a rerun or
        // a changed spec. One that a submission here is running must be
        // cancelled first.
        let paused = rows.iter().all(|c| c.is_final() || c.status.is_paused());
        if !paused && st.submitted.contains(&sub.family) {
            let what = if sub.rerun {
                "asking for a rerun"
            } else if plan.is_empty() {
                "submitting another commit"
            } else {
                "submitting a changed spec"
            };
            return Err(PortError::Busy(sub.family, what));
        }
        // Its queued or running jobs go with it; the restarted port queues
        // what it still needs.
        st.args
            .scheduler
            .cast(SchedulerMsg::CancelFamily {
                family: sub.family.clone(),
            })
            .map_err(|e| PortError::Internal(e.to_string()))?;
        gate.stop_children(Some("port restarted".into()));
        gate.stop_and_wait(
            Some("port restarted".into()),
            Some(std::time::Duration::from_secs(10)),
        )
        .await
        .map_err(|e| PortError::Internal(format!("the running port did not stop: {e}")))?;
        st.ports.remove(&sub.family);
        st.submitted.remove(&sub.family);
    }
    let names: Vec<String> = spec.components.iter().map(|c| c.name.clone()).collect();
    let row = PortRow {
        family: sub.family.clone(),
        repo: sub.repo.clone(),
        spec_path: sub.spec_path.clone(),
        spec_toml: sub.spec_toml.clone(),
        state: PortState::Running,
        phase: "P0".into(),
        port_status_path: String::new(),
        commit: sub.commit.clone(),
    };
    let created = st
        .args
        .store
        .create_port(&row, &names)
        .await
        .map_err(internal)?;
    if !created {
        let again: Vec<String> = plan.iter().map(|c| c.component.clone()).collect();
        st.args
            .store
            .update_port_spec(&row, &names, &again)
            .await
            .map_err(internal)?;
        if sub.rerun {
            st.args
                .store
                .reset_components(&sub.family)
                .await
                .map_err(internal)?;
        }
    }
    // A new port, or a rerun, starts the port's trace anew.
    let fresh = created || sub.rerun;
    start_gate(myself, st, &row, sub.traceparent, fresh)
        .await
        .map_err(|e| PortError::Internal(e.to_string()))?;
    st.submitted.insert(sub.family.clone());
    let mut changes: Vec<String> = plan.into_iter().map(|c| c.to_string()).collect();
    if let Some(old) = known.filter(|_| recommit) {
        changes.push(format!(
            "commit {} -> {}: runs from now on test it; recorded verdicts stay",
            short(&old.commit),
            short(&sub.commit)
        ));
    }
    Ok(Submitted {
        family: sub.family,
        resumed: !created,
        rerun: sub.rerun && !created,
        changes,
        commit: sub.commit,
    })
}

/// A commit as people read it: its first 12 hex digits, or `none`.
fn short(sha: &str) -> &str {
    match sha {
        "" => "none",
        s => &s[..s.len().min(12)],
    }
}

/// One component a resubmitted spec plans again, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Replan {
    pub component: String,
    pub why: String,
}

impl std::fmt::Display for Replan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "component {}: {}", self.component, self.why)
    }
}

/// What a resubmission changes against the stored port: components the new
/// spec adds, drops or runs differently (their recorded verdict no longer
/// answers the new question), and components whose record holds no verdict
/// of their code (cancelled, or never placed). Unchanged components keep
/// their verdicts.
pub fn replan(
    port: &PortRow,
    new: &fvd_spec::PortSpec,
    rows: &[fvd_store::model::ComponentRow],
) -> Vec<Replan> {
    let old = fvd_spec::parse(Path::new(&port.spec_path), &port.spec_toml).ok();
    let mut out = Vec::new();
    for c in &new.components {
        let before = old
            .as_ref()
            .and_then(|o| o.components.iter().find(|x| x.name == c.name));
        let row = rows.iter().find(|r| r.name == c.name);
        let why = match before {
            None if old.is_some() => Some("new in the spec; it runs".to_string()),
            None => Some("the stored spec no longer parses; it runs again".to_string()),
            Some(b) if !b.same_run(c) => Some(format!("{}; it runs again", spec_diff(b, c))),
            Some(_) => match row {
                Some(r) if r.is_final() && NO_VERDICT.contains(&r.verdict.as_str()) => {
                    Some(format!("its last run was {}; it runs again", r.verdict))
                }
                _ => None,
            },
        };
        if let Some(why) = why {
            out.push(Replan {
                component: c.name.clone(),
                why,
            });
        }
    }
    if let Some(o) = &old {
        for c in &o.components {
            if !new.components.iter().any(|x| x.name == c.name) {
                out.push(Replan {
                    component: c.name.clone(),
                    why: "no longer in the spec; dropped (its runs stay as history)".into(),
                });
            }
        }
    }
    out
}

/// Final component verdicts that say nothing about the code: a resubmit
/// runs such a component again.
pub const NO_VERDICT: &[&str] = &["cancelled", "unplaced"];

/// The first differences between two specs of one component, for people.
fn spec_diff(a: &fvd_spec::ComponentSpec, b: &fvd_spec::ComponentSpec) -> String {
    let mut d = Vec::new();
    if a.gpus != b.gpus {
        d.push(format!("gpus {} -> {}", a.gpus, b.gpus));
    }
    if a.argv() != b.argv() {
        d.push("command or test files changed".to_string());
    }
    if a.set_env != b.set_env || a.env != b.env {
        d.push("environment changed".to_string());
    }
    if a.timeout != b.timeout {
        d.push(format!(
            "timeout {} s -> {} s",
            a.timeout.as_secs(),
            b.timeout.as_secs()
        ));
    }
    if a.placement != b.placement {
        d.push("placement (memory, labels, worker paths or priority) changed".to_string());
    }
    if d.is_empty() {
        d.push("its spec changed".to_string());
    }
    d.join(", ")
}

/// Records the answer to escape hatch `id` and wakes the component that
/// asked: through the port's gate when it runs here, else by resuming the
/// port from the store (embedded mode, a paused port after a restart).
async fn answer(
    myself: &ActorRef<OrchestratorMsg>,
    st: &mut OrchestratorState,
    family: &str,
    id: &str,
    choice: AnswerChoice,
    traceparent: Option<String>,
) -> Result<EscapeRow, PortError> {
    let internal = |e: StoreError| PortError::Internal(e.to_string());
    let port = st
        .args
        .store
        .port(family)
        .await
        .map_err(internal)?
        .ok_or_else(|| PortError::UnknownFamily(family.to_string()))?;
    let hatch = st
        .args
        .store
        .escapes(family)
        .await
        .map_err(internal)?
        .into_iter()
        .find(|e| e.id == id)
        .ok_or_else(|| PortError::UnknownEscape {
            family: family.to_string(),
            id: id.to_string(),
        })?;
    let text = match choice {
        AnswerChoice::Option(n) => {
            let Some(o) = (n as usize)
                .checked_sub(1)
                .and_then(|i| hatch.options.get(i))
            else {
                return Err(PortError::InvalidAnswer(format!(
                    "escape hatch {id} has options 1 to {}; --option {n} is none of them",
                    hatch.options.len()
                )));
            };
            format!("option {n}: {o}")
        }
        AnswerChoice::Text(t) => {
            let t = t.trim().to_string();
            if t.is_empty() {
                return Err(PortError::InvalidAnswer(format!(
                    "the answer to {id} is empty"
                )));
            }
            // The answer goes into the store, PORT_STATUS.md and a packet:
            // a token value must reach none of them.
            if !fvd_contracts::secrets::scan_text(&t, 1).is_empty() {
                return Err(PortError::InvalidAnswer(format!(
                    "the answer to {id} holds a token-looking value; name the environment variable instead"
                )));
            }
            t
        }
    };
    let row = st
        .args
        .store
        .answer_escape(family, id, &text)
        .await
        .map_err(|e| match e {
            e @ StoreError::EscapeNotOpen { .. } => PortError::InvalidAnswer(e.to_string()),
            e => internal(e),
        })?;
    // Running before the reply: a watch that starts right after the answer
    // must not see the pause and end at once.
    st.args
        .store
        .set_port_state(family, PortState::Running, &port.phase)
        .await
        .map_err(internal)?;
    match st.ports.get(family) {
        Some(gate) => gate
            .cast(GateMsg::Answered {
                component: row.component.clone(),
                id: id.to_string(),
            })
            .map_err(|e| PortError::Internal(e.to_string()))?,
        None => start_gate(myself, st, &port, traceparent, false)
            .await
            .map_err(|e| PortError::Internal(e.to_string()))?,
    }
    crate::port_status::write(&st.args.store, family)
        .await
        .map_err(|e| PortError::Internal(e.to_string()))?;
    Ok(row)
}

/// The code of a port's runs: its pinned commit, where its folder sits in
/// the repository, and the status file fvd writes into the checkout.
async fn port_code(port: &PortRow, spec: &fvd_spec::PortSpec) -> PortCode {
    let prefix = if port.commit.is_empty() {
        String::new()
    } else {
        fvd_workspace::commit::prefix(Path::new(&port.repo))
            .await
            .unwrap_or_default()
    };
    PortCode {
        commit: port.commit.clone(),
        prefix,
        fvd_writes: spec
            .prep
            .get("port_state_file")
            .into_iter()
            .cloned()
            .collect(),
    }
}

async fn start_gate(
    myself: &ActorRef<OrchestratorMsg>,
    st: &mut OrchestratorState,
    port: &PortRow,
    traceparent: Option<String>,
    fresh: bool,
) -> Result<(), ActorProcessingErr> {
    let spec = fvd_spec::parse(Path::new(&port.spec_path), &port.spec_toml)?;
    // One trace per port: this run continues the trace its first run
    // stored (a resume may be in another process), or starts it.
    let stored = st.args.store.port_traceparent(&port.family).await?;
    let trace =
        fvd_telemetry::Continuation::decide(stored.as_deref(), traceparent.as_deref(), fresh);
    // Runs that were in flight when the last gate of this port died are
    // rerun once under a new run number; recorded verdicts stay.
    for c in st.args.store.abandon_unfinished(&port.family).await? {
        tracing::info!(family = %port.family, component = %c, "rerunning a run that was in flight");
    }
    st.args
        .store
        .set_port_state(&port.family, PortState::Running, &port.phase)
        .await?;
    let code = port_code(port, &spec).await;
    let args = GateArgs {
        trace,
        family: port.family.clone(),
        spec,
        repo: port.repo.clone(),
        code,
        store: st.args.store.clone(),
        scheduler: st.args.scheduler.clone(),
        events: st.args.events.clone(),
        agents: st.args.agents.clone(),
    };
    let (gate, _) = Actor::spawn_linked(None, GateActor, args, myself.get_cell()).await?;
    st.ports.insert(port.family.clone(), gate);
    Ok(())
}
