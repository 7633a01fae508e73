//! `OrchestratorActor`: one per process. It starts ports (one gate actor
//! each), resumes them from the store after a restart, and supervises them:
//! a gate actor that fails is restarted from the store, not lost.
//!
//! It also decides who may change a port (issue #30). A port belongs to the
//! checkout it was first submitted from (its repository's identity and
//! path) and to the credential that submitted it:
//! - a submit of the same family from another checkout is refused, naming
//!   both (an embedded store follows its checkout when it moves: it lives
//!   inside it);
//! - a submit, answer, cancel or reset by a credential other than the
//!   port's owner is refused unless the caller is an admin;
//! - each accepted one is logged with the caller's name, in the
//!   transaction that makes the change where there is one.

use std::collections::HashMap;
use std::path::Path;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::broadcast;

use crate::gate::{GateActor, GateArgs, GateMsg};
use crate::scheduler::SchedulerMsg;
use fvd_store::messages::PortEvent;
use fvd_store::model::{PortCode, PortRow, PortState, RecordedVerdict};
use fvd_store::team::{Action, PortOrigin};
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
    /// The store lives inside the one checkout it serves (embedded mode):
    /// a port submitted from a new path is that checkout moved, and follows
    /// it. A fleet orchestrator refuses a submit from another checkout.
    pub checkout_owns_store: bool,
    /// Which agent commands run here, jailed how.
    pub agents: fvd_workspace::agent::AgentPolicy,
}

/// Who asks for a change: the name of the caller's credential, and whether
/// it may change every port (`admin`) or only its own (`porter`). The edge
/// refuses callers who may change nothing before a message is sent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Caller {
    /// Empty on a server that checks no credential.
    pub name: String,
    pub admin: bool,
}

impl Caller {
    /// The caller of a server that checks no credential: may do anything,
    /// named nobody.
    pub fn anonymous() -> Self {
        Caller {
            name: String::new(),
            admin: true,
        }
    }

    fn describe(&self) -> String {
        match (self.name.as_str(), self.admin) {
            ("", _) => "anonymous".to_string(),
            (n, true) => format!("{n} (admin)"),
            (n, false) => format!("{n} (porter)"),
        }
    }

    /// Whether this caller may change a port owned by `owner`.
    fn may_change(&self, owner: &str) -> bool {
        self.admin || (!owner.is_empty() && owner == self.name)
    }
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
    /// Who submits.
    pub caller: Caller,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    pub family: String,
    pub resumed: bool,
    /// Every component was started over.
    pub rerun: bool,
    /// What the resubmitted spec changed, one line each.
    pub changes: Vec<String>,
    /// The commit changed since the last submit (`OLD -> NEW: what
    /// reruns`): not a spec change.
    pub commit_change: Option<String>,
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
    /// The family's port belongs to another checkout: its repository,
    /// status file and verdicts never move to this one.
    #[error(
        "port {family} belongs to {port_repo} ({port_identity}); this submit comes from {repo} ({identity}), another checkout: a port's repository, status file and verdicts never move. Submit from {port_repo}, or reset the port there first (fvd reset {family} --orchestrator URL){owner}"
    )]
    OtherCheckout {
        family: String,
        port_repo: String,
        port_identity: String,
        repo: String,
        identity: String,
        /// ` (its owner: alice)`, or empty.
        owner: String,
    },
    /// The caller may change only its own ports, and this one is not.
    #[error("{caller} may not {what} port {family}: {why}")]
    NotYours {
        family: String,
        caller: String,
        what: &'static str,
        why: String,
    },
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
    Cancel {
        family: String,
        caller: Caller,
        reply: RpcReplyPort<Result<(), PortError>>,
    },
    Answer {
        family: String,
        id: String,
        choice: AnswerChoice,
        /// W3C `traceparent` of the answering call, when it sent one.
        traceparent: Option<String>,
        caller: Caller,
        reply: RpcReplyPort<Result<EscapeRow, PortError>>,
    },
    /// Forget a port that does not run here: its state goes, its log of
    /// actions stays (`fvd reset --orchestrator`).
    Reset {
        family: String,
        caller: Caller,
        reply: RpcReplyPort<Result<(), PortError>>,
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
            OrchestratorMsg::Cancel {
                family,
                caller,
                reply,
            } => {
                let r = cancel(st, family, &caller).await;
                let _ = reply.send(r);
            }
            OrchestratorMsg::Answer {
                family,
                id,
                choice,
                traceparent,
                caller,
                reply,
            } => {
                let r = answer(&myself, st, &family, &id, choice, traceparent, &caller).await;
                let _ = reply.send(r);
            }
            OrchestratorMsg::Reset {
                family,
                caller,
                reply,
            } => {
                let r = reset(st, &family, &caller).await;
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
    let spec = admit(st, &sub).await?;
    let internal = |e: fvd_store::StoreError| PortError::Internal(e.to_string());
    let known = st.args.store.port(&sub.family).await.map_err(internal)?;
    let identity = fvd_workspace::identity::repo_identity(Path::new(&sub.repo)).await;
    claim_checkout(st, &sub, known.as_ref(), &identity).await?;
    let action = if sub.rerun {
        Action::Rerun
    } else {
        Action::Submit
    };
    // Runs from now on test the new commit; a verdict of another tree may not hold.
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
    // A verdict belongs to a commit: at another one, components whose last
    // verdict was produced at a tree not equivalent for them run again.
    let stale = match known.as_ref().filter(|_| recommit) {
        Some(_) => {
            let planned: Vec<&str> = plan.iter().map(|p| p.component.as_str()).collect();
            stale_verdicts(&st.args.store, &sub, &spec, &rows, &planned)
                .await
                .map_err(internal)?
        }
        None => Stale::default(),
    };
    if st.ports.contains_key(&sub.family) {
        if !sub.rerun && plan.is_empty() && !recommit {
            st.args
                .store
                .record_action(&sub.family, action, &sub.caller.name, &sub.commit)
                .await
                .map_err(internal)?;
            return Ok(Submitted {
                family: sub.family,
                resumed: true,
                rerun: false,
                changes: Vec::new(),
                commit_change: None,
                commit: sub.commit,
            });
        }
        stop_running(st, &sub, &rows, plan.is_empty()).await?;
    }
    let mut again: Vec<String> = plan.iter().map(|c| c.component.clone()).collect();
    again.extend(stale.rerun.iter().map(|(c, _)| c.clone()));
    let (row, names, created) = store_port(st, &sub, &spec, identity, action, &again).await?;
    // A new port, or a rerun, starts the port's trace anew.
    let fresh = created || sub.rerun;
    start_gate(myself, st, &row, sub.traceparent.clone(), fresh)
        .await
        .map_err(|e| PortError::Internal(e.to_string()))?;
    st.submitted.insert(sub.family.clone());
    // snapshots no recorded verdict and no run in flight names go
    if !sub.commit.is_empty()
        && let Err(e) = prune_snapshots(&st.args.store, &sub, &names).await
    {
        tracing::warn!(family = %sub.family, error = %e, "could not prune snapshot refs");
    }
    let changes: Vec<String> = plan.into_iter().map(|c| c.to_string()).collect();
    let commit_change = known.filter(|_| recommit).map(|old| {
        format!(
            "{} -> {}: {}",
            short(&old.commit),
            short(&sub.commit),
            stale.line()
        )
    });
    Ok(Submitted {
        family: sub.family,
        resumed: !created,
        rerun: sub.rerun && !created,
        changes,
        commit_change,
        commit: sub.commit,
    })
}

/// The submission's spec, if this orchestrator takes it: it parses, names
/// the submitted family, its agents may run here, and its commit is one
/// the repository has (or there is none: not a git repository). Refused
/// before anything is stored: a component would only block on it later
/// (`component.rs` checks again for ports resumed from the store).
async fn admit(st: &OrchestratorState, sub: &Submission) -> Result<fvd_spec::PortSpec, PortError> {
    let spec = fvd_spec::parse(Path::new(&sub.spec_path), &sub.spec_toml)
        .map_err(|e| PortError::InvalidSpec(e.to_string()))?;
    if spec.family != sub.family {
        return Err(PortError::FamilyMismatch {
            spec: spec.family,
            submitted: sub.family.clone(),
        });
    }
    if let Some(why) = spec
        .components
        .iter()
        .filter_map(|c| c.agent.as_ref())
        .find_map(|a| st.args.agents.admits(a).err())
    {
        return Err(PortError::AgentRefused {
            path: sub.spec_path.clone(),
            why,
        });
    }
    let known_commit = sub.commit.is_empty()
        || (fvd_workspace::commit::is_full_sha(&sub.commit)
            && fvd_workspace::commit::has_commit(Path::new(&sub.repo), &sub.commit).await);
    if !known_commit {
        return Err(PortError::UnknownCommit {
            commit: sub.commit.clone(),
            repo: sub.repo.clone(),
        });
    }
    Ok(spec)
}

/// Whether the submission's checkout (and caller) may take the port:
/// a port of another checkout is refused unless the checkout owns the
/// store (embedded: the state moved with it, and is adopted); the port's
/// owner must be the caller; a new port checks who owns the checkout.
async fn claim_checkout(
    st: &OrchestratorState,
    sub: &Submission,
    known: Option<&PortRow>,
    identity: &str,
) -> Result<(), PortError> {
    let internal = |e: fvd_store::StoreError| PortError::Internal(e.to_string());
    if let Some(port) = known {
        let origin = st
            .args
            .store
            .port_origin(&sub.family)
            .await
            .map_err(internal)?
            .unwrap_or_default();
        let same_checkout = port.repo == sub.repo
            && (origin.repo_identity.is_empty() || origin.repo_identity == identity);
        if !same_checkout && !st.args.checkout_owns_store {
            return Err(PortError::OtherCheckout {
                family: sub.family.clone(),
                port_repo: port.repo.clone(),
                port_identity: if origin.repo_identity.is_empty() {
                    "identity not recorded".into()
                } else {
                    origin.repo_identity
                },
                repo: sub.repo.clone(),
                identity: identity.to_string(),
                owner: if origin.owner.is_empty() {
                    String::new()
                } else {
                    format!(" (its owner: {})", origin.owner)
                },
            });
        }
        check_owner(&sub.caller, &sub.family, &origin.owner, "submit")?;
        if !same_checkout {
            // Embedded: the checkout moved, and its state with it.
            st.args
                .store
                .adopt_checkout(&sub.family, &sub.repo, identity)
                .await
                .map_err(internal)?;
        } else if origin.repo_identity.is_empty() {
            st.args
                .store
                .record_repo_identity(&sub.family, identity)
                .await
                .map_err(internal)?;
        }
    }
    if known.is_none() && !st.args.checkout_owns_store {
        check_checkout_owner(st, sub).await?;
    }
    Ok(())
}

/// Stops the port's running gate (its queued and running jobs go with it)
/// before a rerun, a changed spec or another commit replaces it. A port
/// whose components are all final or waiting (for an answer or an
/// environment) runs nothing, and one resumed at start-up has no submitter
/// waiting on it: either may be replaced; one that a submission here is
/// running must be cancelled first.
async fn stop_running(
    st: &mut OrchestratorState,
    sub: &Submission,
    rows: &[fvd_store::model::ComponentRow],
    same_plan: bool,
) -> Result<(), PortError> {
    let Some(gate) = st.ports.get(&sub.family).cloned() else {
        return Ok(());
    };
    let paused = rows.iter().all(|c| c.is_final() || c.status.is_paused());
    if !paused && st.submitted.contains(&sub.family) {
        let what = if sub.rerun {
            "asking for a rerun"
        } else if same_plan {
            "submitting another commit"
        } else {
            "submitting a changed spec"
        };
        return Err(PortError::Busy(sub.family.clone(), what));
    }
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
    Ok(())
}

/// Stores the port as submitted: created with its components, or (known
/// already) its spec updated, `again` set to run again and, on a rerun,
/// its components reset. Its row, its component names, and whether it was
/// created.
async fn store_port(
    st: &OrchestratorState,
    sub: &Submission,
    spec: &fvd_spec::PortSpec,
    identity: String,
    action: Action,
    again: &[String],
) -> Result<(PortRow, Vec<String>, bool), PortError> {
    let internal = |e: fvd_store::StoreError| PortError::Internal(e.to_string());
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
    let origin = PortOrigin {
        repo_identity: identity,
        owner: sub.caller.name.clone(),
        submitted_by: sub.caller.name.clone(),
    };
    let created = st
        .args
        .store
        .create_port_from(&row, &names, &origin, action)
        .await
        .map_err(internal)?;
    if !created {
        st.args
            .store
            .record_action(&sub.family, action, &sub.caller.name, &sub.commit)
            .await
            .map_err(internal)?;
        st.args
            .store
            .update_port_spec(&row, &names, again)
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
    Ok((row, names, created))
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
            Some(_) => {
                match row {
                    Some(r) if r.is_final() && NO_VERDICT.contains(&r.verdict) => {
                        Some(format!("its last run was {}; it runs again", r.verdict))
                    }
                    // a verdict an older fvd recorded for what is now known to
                    // be a broken environment says nothing about the code
                    Some(r) if r.is_final() && !r.verdict.is_pass() => {
                        let in_repo = crate::run_verdict::repo_modules(&port.repo, c);
                        fvd_contracts::verdict::environment_signature(&r.reason, &in_repo).map(
                        |(_, cause)| {
                            format!("its last run failed on its environment ({cause}); it runs again")
                        },
                    )
                    }
                    _ => None,
                }
            }
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

/// What a submit at another commit does with the recorded verdicts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stale {
    /// Components that run again, each with why.
    pub rerun: Vec<(String, String)>,
    /// Components whose verdict holds at the new commit.
    pub kept: Vec<String>,
}

impl Stale {
    /// One line for people: what reruns and why, what keeps its verdict.
    pub fn line(&self) -> String {
        let mut parts = Vec::new();
        if !self.rerun.is_empty() {
            // grouped by reason, in the spec's order
            let mut by_why: Vec<(&str, Vec<&str>)> = Vec::new();
            for (c, why) in &self.rerun {
                match by_why.iter_mut().find(|(w, _)| *w == why.as_str()) {
                    Some((_, cs)) => cs.push(c),
                    None => by_why.push((why, vec![c])),
                }
            }
            let said: Vec<String> = by_why
                .into_iter()
                .map(|(why, cs)| format!("{} ({why})", cs.join(", ")))
                .collect();
            parts.push(format!("rerun {}", said.join("; ")));
        }
        if !self.kept.is_empty() {
            parts.push(format!(
                "{} keep their verdicts (none of their files changed)",
                self.kept.join(", ")
            ));
        }
        if parts.is_empty() {
            "no recorded verdict to check".to_string()
        } else {
            parts.join("; ")
        }
    }
}

/// Which final components' verdicts were produced at a tree that is not
/// equivalent to the submitted commit for them. Equivalent: the same
/// files under the component's test files, the `conftest.py` files above
/// them and the `paths` it names; a component that names no paths is
/// equivalent only when no file changed at all (fvd's own status file
/// aside); a comparison that fails is not equivalent (when unsure, rerun).
async fn stale_verdicts(
    store: &Store,
    sub: &Submission,
    spec: &fvd_spec::PortSpec,
    rows: &[fvd_store::model::ComponentRow],
    planned: &[&str],
) -> Result<Stale, StoreError> {
    let repo = Path::new(&sub.repo);
    let mut out = Stale::default();
    if sub.commit.is_empty() {
        return Ok(out);
    }
    let prefix = fvd_workspace::commit::prefix(repo)
        .await
        .unwrap_or_default();
    let status_file = crate::port_status::file_path(repo, spec)
        .ok()
        .and_then(|p| p.strip_prefix(repo).ok().map(Path::to_path_buf))
        .map(|p| format!("{prefix}{}", p.display()));
    let mut diffs: HashMap<String, Result<Vec<String>, String>> = HashMap::new();
    for c in &spec.components {
        if planned.contains(&c.name.as_str()) {
            continue;
        }
        let Some(row) = rows.iter().find(|r| r.name == c.name && r.is_final()) else {
            continue;
        };
        if NO_VERDICT.contains(&row.verdict) {
            continue;
        }
        let jobs = store.jobs_of(&spec.family, &c.name).await?;
        let Some(last) = jobs
            .iter()
            .rev()
            .find(|j| j.state == fvd_store::model::JobState::Finished)
        else {
            continue;
        };
        if last.commit.is_empty() || last.commit == sub.commit {
            if last.commit == sub.commit {
                out.kept.push(c.name.clone());
            }
            continue;
        }
        if !diffs.contains_key(&last.commit) {
            let d = fvd_workspace::commit::changed_files(repo, &last.commit, &sub.commit)
                .await
                .map_err(|e| e.to_string());
            diffs.insert(last.commit.clone(), d);
        }
        let why = match &diffs[&last.commit] {
            Err(e) => Some(format!("cannot compare its verdict's commit: {e}")),
            Ok(files) => {
                let files: Vec<&String> = files
                    .iter()
                    .filter(|f| Some(f.as_str()) != status_file.as_deref())
                    .collect();
                if c.paths.is_empty() {
                    (!files.is_empty())
                        .then(|| format!("{} file(s) changed and it names no paths", files.len()))
                } else {
                    let watched = watched_paths(&prefix, c);
                    files
                        .iter()
                        .find(|f| watched.iter().any(|w| under(f, w)))
                        .map(|f| format!("{f} changed"))
                }
            }
        };
        match why {
            Some(why) => out.rerun.push((c.name.clone(), why)),
            None => out.kept.push(c.name.clone()),
        }
    }
    Ok(out)
}

/// What a component's verdict depends on, from the top of the repository:
/// its test files, every `conftest.py` from their folders up to the port
/// folder, and the paths it names.
fn watched_paths(prefix: &str, c: &fvd_spec::ComponentSpec) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for t in &c.parity_tests {
        let file = t.split("::").next().unwrap_or(t).trim_start_matches("./");
        out.push(format!("{prefix}{file}"));
        let mut dir = Path::new(file).parent();
        while let Some(d) = dir {
            let conftest = d.join("conftest.py");
            out.push(format!("{prefix}{}", conftest.display()));
            dir = d.parent();
        }
    }
    out.extend(c.paths.iter().map(|p| format!("{prefix}{p}")));
    out.sort();
    out.dedup();
    out
}

/// Whether `file` is `path` or inside the folder `path`.
fn under(file: &str, path: &str) -> bool {
    let path = path.trim_end_matches('/');
    file == path || file.strip_prefix(path).is_some_and(|r| r.starts_with('/'))
}

/// Deletes the port's snapshot refs (`refs/fvd/snapshots/<family>/*`) that
/// neither the submitted commit, a component's recorded verdict (its last
/// finished run) nor a run still queued or running names.
async fn prune_snapshots(store: &Store, sub: &Submission, names: &[String]) -> Result<(), String> {
    use fvd_store::model::JobState;
    let mut keep = vec![sub.commit.clone()];
    for name in names {
        let jobs = store
            .jobs_of(&sub.family, name)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(j) = jobs.iter().rev().find(|j| j.state == JobState::Finished) {
            keep.push(j.commit.clone());
        }
        keep.extend(
            jobs.iter()
                .filter(|j| matches!(j.state, JobState::Queued | JobState::Running))
                .map(|j| j.commit.clone()),
        );
    }
    let gone = fvd_workspace::commit::prune_snapshots(Path::new(&sub.repo), &sub.family, &keep)
        .await
        .map_err(|e| e.to_string())?;
    if gone > 0 {
        tracing::info!(family = %sub.family, gone, "pruned snapshot refs no verdict names");
    }
    Ok(())
}

/// Final component verdicts that say nothing about the code: a resubmit
/// runs such a component again.
pub const NO_VERDICT: &[RecordedVerdict] = &[RecordedVerdict::Cancelled, RecordedVerdict::Unplaced];

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
#[allow(clippy::too_many_arguments)]
async fn answer(
    myself: &ActorRef<OrchestratorMsg>,
    st: &mut OrchestratorState,
    family: &str,
    id: &str,
    choice: AnswerChoice,
    traceparent: Option<String>,
    caller: &Caller,
) -> Result<EscapeRow, PortError> {
    let internal = |e: StoreError| PortError::Internal(e.to_string());
    let port = st
        .args
        .store
        .port(family)
        .await
        .map_err(internal)?
        .ok_or_else(|| PortError::UnknownFamily(family.to_string()))?;
    let owner = owner_of(st, family).await?;
    check_owner(caller, family, &owner, "answer")?;
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
    // A judge change is kept or dropped: no third reading.
    if hatch.about == fvd_store::states::EscapeAbout::Judge
        && crate::judge_question::answer(&text).is_none()
    {
        return Err(PortError::InvalidAnswer(crate::judge_question::refusal(id)));
    }
    let row = st
        .args
        .store
        .answer_escape_by(family, id, &text, &caller.name)
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

/// The credential that owns `family` ("" when none was checked or the port
/// is older than owners).
async fn owner_of(st: &OrchestratorState, family: &str) -> Result<String, PortError> {
    Ok(st
        .args
        .store
        .port_origin(family)
        .await
        .map_err(|e| PortError::Internal(e.to_string()))?
        .map(|o| o.owner)
        .unwrap_or_default())
}

/// Refuses a new port in a checkout that holds another person's port
/// (issue #38): opening one makes branches and worktrees there, writes its
/// `PORT_STATUS.md` and runs the submitter's tests and agents in it. Only
/// the owner of the checkout's ports, or an admin, may.
async fn check_checkout_owner(st: &OrchestratorState, sub: &Submission) -> Result<(), PortError> {
    if sub.caller.admin {
        return Ok(());
    }
    let internal = |e: fvd_store::StoreError| PortError::Internal(e.to_string());
    for port in st.args.store.ports().await.map_err(internal)? {
        if port.repo != sub.repo {
            continue;
        }
        let owner = st
            .args
            .store
            .port_origin(&port.family)
            .await
            .map_err(internal)?
            .map(|o| o.owner)
            .unwrap_or_default();
        if !sub.caller.may_change(&owner) {
            let whose = if owner.is_empty() {
                "submitted without a credential".to_string()
            } else {
                format!("{owner}'s")
            };
            return Err(PortError::NotYours {
                family: sub.family.clone(),
                caller: sub.caller.describe(),
                what: "open",
                why: format!(
                    "its checkout {} holds port {} ({whose}); only {} may open a port there",
                    sub.repo,
                    port.family,
                    if owner.is_empty() {
                        "an admin".to_string()
                    } else {
                        format!("{owner} or an admin")
                    },
                ),
            });
        }
    }
    Ok(())
}

/// Refuses `caller` doing `what` to a port owned by `owner`, unless it is
/// the owner or an admin.
fn check_owner(
    caller: &Caller,
    family: &str,
    owner: &str,
    what: &'static str,
) -> Result<(), PortError> {
    if caller.may_change(owner) {
        return Ok(());
    }
    let why = if owner.is_empty() {
        "it was submitted without a credential, so only an admin may".to_string()
    } else {
        format!("it is {owner}'s; only {owner} or an admin may")
    };
    Err(PortError::NotYours {
        family: family.to_string(),
        caller: caller.describe(),
        what,
        why,
    })
}

/// Cancels the port running here, if `caller` may.
async fn cancel(
    st: &mut OrchestratorState,
    family: String,
    caller: &Caller,
) -> Result<(), PortError> {
    let internal = |e: StoreError| PortError::Internal(e.to_string());
    let Some(port) = st.args.store.port(&family).await.map_err(internal)? else {
        return Err(PortError::UnknownFamily(family));
    };
    let owner = owner_of(st, &family).await?;
    check_owner(caller, &family, &owner, "cancel")?;
    match st.ports.get(&family) {
        Some(gate) => gate
            .cast(GateMsg::Cancel)
            .map_err(|e| PortError::Internal(e.to_string()))?,
        // No gate runs it here (an embedded port whose process is gone, a
        // port that ended): cancelled in place, its components without a
        // final verdict with it. The CLI's embedded cancel comes this way
        // too, so no cancel writes the store behind the actors.
        None if port.state != PortState::Cancelled => {
            let stopped = st.args.store.cancel_port(&family).await.map_err(internal)?;
            tracing::info!(%family, was = %port.state, ?stopped, "port cancelled in place: no gate ran it");
        }
        None => {
            return Err(PortError::NotRunning {
                family,
                state: port.state,
            });
        }
    }
    st.args
        .store
        .record_action(&family, Action::Cancel, &caller.name, "")
        .await
        .map_err(internal)
}

/// Forgets a port that does not run here (`fvd reset --orchestrator`):
/// the next submit, from any checkout, starts it over. Its log stays.
async fn reset(st: &mut OrchestratorState, family: &str, caller: &Caller) -> Result<(), PortError> {
    let internal = |e: StoreError| PortError::Internal(e.to_string());
    if st
        .args
        .store
        .port(family)
        .await
        .map_err(internal)?
        .is_none()
    {
        return Err(PortError::UnknownFamily(family.to_string()));
    }
    let owner = owner_of(st, family).await?;
    check_owner(caller, family, &owner, "reset")?;
    if st.ports.contains_key(family) {
        return Err(PortError::Busy(family.to_string(), "resetting it"));
    }
    st.args
        .store
        .record_action(family, Action::Reset, &caller.name, "")
        .await
        .map_err(internal)?;
    st.args.store.delete_port(family).await.map_err(internal)?;
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn component(tests: &[&str], paths: &[&str]) -> fvd_spec::ComponentSpec {
        let mut spec = fvd_spec::parse(
            Path::new("p.toml"),
            "[prep]\nmodel_family = \"fam\"\n\n[[component]]\nname = \"a\"\ntype = \"generic\"\nparity_test = \"t/x.py\"\ncoverage_scope = \"both\"\n",
        )
        .unwrap()
        .components
        .remove(0);
        spec.parity_tests = tests.iter().map(|t| t.to_string()).collect();
        spec.paths = paths.iter().map(|t| t.to_string()).collect();
        spec
    }

    #[test]
    fn a_verdict_depends_on_its_tests_their_conftests_and_its_paths() {
        let c = component(
            &["tests/local_tests/fam/test_a.py::test_one[fp32]"],
            &["pkg/models/a.py", "pkg/layers"],
        );
        let w = watched_paths("sub/", &c);
        for want in [
            "sub/tests/local_tests/fam/test_a.py",
            "sub/tests/local_tests/fam/conftest.py",
            "sub/tests/conftest.py",
            "sub/conftest.py",
            "sub/pkg/models/a.py",
            "sub/pkg/layers",
        ] {
            assert!(w.iter().any(|p| p == want), "{want}: {w:?}");
        }
        assert!(under("sub/pkg/layers/norm.py", "sub/pkg/layers"));
        assert!(!under("sub/pkg/layers2/norm.py", "sub/pkg/layers"));
        assert!(under("sub/pkg/models/a.py", "sub/pkg/models/a.py"));
    }

    #[test]
    fn what_reruns_is_said_in_one_line_grouped_by_why() {
        let s = Stale {
            rerun: vec![
                ("vae".into(), "pkg/vae.py changed".into()),
                (
                    "dit".into(),
                    "3 file(s) changed and it names no paths".into(),
                ),
                (
                    "text".into(),
                    "3 file(s) changed and it names no paths".into(),
                ),
            ],
            kept: vec!["scheduler".into()],
        };
        let line = s.line();
        assert_eq!(
            line,
            "rerun vae (pkg/vae.py changed); dit, text (3 file(s) changed and it names no paths); scheduler keep their verdicts (none of their files changed)"
        );
        assert!(!line.contains('\n'));
        assert_eq!(Stale::default().line(), "no recorded verdict to check");
    }
}
