//! `OrchestratorActor`: one per process. It starts ports (one gate actor
//! each), resumes them from the store after a restart, and supervises them:
//! a gate actor that fails is restarted from the store, not lost.

use std::collections::HashMap;
use std::path::Path;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::broadcast;

use crate::gate::{ASK_USER, GateActor, GateArgs, GateMsg, RUNNING};
use crate::model::{PortEvent, PortRow};
use crate::scheduler::SchedulerMsg;
use crate::spec;
use crate::store::{EscapeRow, Store, StoreError};

#[derive(Debug)]
pub struct OrchestratorActor;

#[derive(Debug)]
pub struct OrchestratorArgs {
    pub store: Store,
    pub scheduler: ActorRef<SchedulerMsg>,
    pub events: broadcast::Sender<PortEvent>,
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
    /// W3C `traceparent` of the submitter's span (gRPC metadata), so the
    /// port's trace joins the caller's (e.g. an agent's).
    pub traceparent: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    pub family: String,
    pub resumed: bool,
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
    #[error("port {0} is running; cancel it before asking for a rerun")]
    Busy(String),
    #[error("port {family} is not running here (state {state}); nothing to cancel")]
    NotRunning { family: String, state: String },
    #[error("port {family} has no escape hatch {id}")]
    UnknownEscape { family: String, id: String },
    /// The answer does not fit the hatch (an option out of range, an empty
    /// or secret-looking text, a hatch already answered).
    #[error("{0}")]
    InvalidAnswer(String),
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
        reply: RpcReplyPort<Result<EscapeRow, PortError>>,
    },
}

#[derive(Debug)]
pub struct OrchestratorState {
    args: OrchestratorArgs,
    /// Gate actor of each port that is running, by family.
    ports: HashMap<String, ActorRef<GateMsg>>,
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
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        st: &mut OrchestratorState,
    ) -> Result<(), ActorProcessingErr> {
        // Ports that were running when the process died resume now; so do
        // ports paused on questions, whose answers may come to this process.
        for port in st.args.store.ports().await? {
            if port.state == RUNNING || port.state == ASK_USER {
                tracing::info!(family = %port.family, "resuming port from the store");
                if let Err(e) = start_gate(&myself, st, &port, None).await {
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
                reply,
            } => {
                let r = answer(&myself, st, &family, &id, choice).await;
                let _ = reply.send(r);
            }
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
                st.ports.retain(|_, g| g.get_id() != who.get_id());
            }
            SupervisionEvent::ActorFailed(who, err) => {
                let family = st
                    .ports
                    .iter()
                    .find(|(_, g)| g.get_id() == who.get_id())
                    .map(|(f, _)| f.clone());
                if let Some(family) = family {
                    st.ports.remove(&family);
                    tracing::error!(%family, %err, "gate actor failed; restarting the port from the store");
                    if let Some(port) = st.args.store.port(&family).await? {
                        start_gate(&myself, st, &port, None).await?;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

async fn submit(
    myself: &ActorRef<OrchestratorMsg>,
    st: &mut OrchestratorState,
    sub: Submission,
) -> Result<Submitted, PortError> {
    let spec = spec::parse(Path::new(&sub.spec_path), &sub.spec_toml)
        .map_err(|e| PortError::InvalidSpec(e.to_string()))?;
    if spec.family != sub.family {
        return Err(PortError::FamilyMismatch {
            spec: spec.family,
            submitted: sub.family,
        });
    }
    if let Some(gate) = st.ports.get(&sub.family).cloned() {
        if !sub.rerun {
            return Ok(Submitted {
                family: sub.family,
                resumed: true,
            });
        }
        // A port whose components are all final or waiting for an answer
        // runs nothing (paused, or just resumed into its pause): a rerun
        // may replace it. One that runs must be cancelled first.
        let paused = st
            .args
            .store
            .components(&sub.family)
            .await
            .map_err(|e| PortError::Internal(e.to_string()))?
            .iter()
            .all(|c| c.is_final() || c.status == ASK_USER);
        if !paused {
            return Err(PortError::Busy(sub.family));
        }
        gate.stop_children(Some("port rerun".into()));
        gate.stop_and_wait(
            Some("port rerun".into()),
            Some(std::time::Duration::from_secs(10)),
        )
        .await
        .map_err(|e| PortError::Internal(format!("the paused port did not stop: {e}")))?;
        st.ports.remove(&sub.family);
    }
    let names: Vec<String> = spec.components.iter().map(|c| c.name.clone()).collect();
    let row = PortRow {
        family: sub.family.clone(),
        repo: sub.repo.clone(),
        spec_path: sub.spec_path.clone(),
        spec_toml: sub.spec_toml.clone(),
        state: RUNNING.into(),
        phase: "P0".into(),
        port_status_path: String::new(),
    };
    let internal = |e: crate::store::StoreError| PortError::Internal(e.to_string());
    let created = st
        .args
        .store
        .create_port(&row, &names)
        .await
        .map_err(internal)?;
    if !created {
        st.args
            .store
            .update_port_spec(
                &sub.family,
                &sub.repo,
                &sub.spec_path,
                &sub.spec_toml,
                &names,
            )
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
    start_gate(myself, st, &row, sub.traceparent)
        .await
        .map_err(|e| PortError::Internal(e.to_string()))?;
    Ok(Submitted {
        family: sub.family,
        resumed: !created,
    })
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
        .set_port_state(family, RUNNING, &port.phase)
        .await
        .map_err(internal)?;
    match st.ports.get(family) {
        Some(gate) => gate
            .cast(GateMsg::Answered {
                component: row.component.clone(),
                id: id.to_string(),
            })
            .map_err(|e| PortError::Internal(e.to_string()))?,
        None => start_gate(myself, st, &port, None)
            .await
            .map_err(|e| PortError::Internal(e.to_string()))?,
    }
    crate::port_status::write(&st.args.store, family)
        .await
        .map_err(|e| PortError::Internal(e.to_string()))?;
    Ok(row)
}

async fn start_gate(
    myself: &ActorRef<OrchestratorMsg>,
    st: &mut OrchestratorState,
    port: &PortRow,
    traceparent: Option<String>,
) -> Result<(), ActorProcessingErr> {
    let spec = spec::parse(Path::new(&port.spec_path), &port.spec_toml)?;
    // Runs that were in flight when the last gate of this port died are
    // rerun once under a new run number; recorded verdicts stay.
    for c in st.args.store.abandon_unfinished(&port.family).await? {
        tracing::info!(family = %port.family, component = %c, "rerunning a run that was in flight");
    }
    st.args
        .store
        .set_port_state(&port.family, RUNNING, &port.phase)
        .await?;
    let args = GateArgs {
        traceparent,
        family: port.family.clone(),
        spec,
        repo: port.repo.clone(),
        store: st.args.store.clone(),
        scheduler: st.args.scheduler.clone(),
        events: st.args.events.clone(),
    };
    let (gate, _) = Actor::spawn_linked(None, GateActor, args, myself.get_cell()).await?;
    st.ports.insert(port.family.clone(), gate);
    Ok(())
}
