//! `AttemptActor`: one coding-agent attempt of a component, from its packet
//! to its commit. The component spawns it, linked, when a red run (or a
//! pass the cleanup gate refused) leads to an agent turn, and gets one
//! message back, [`AttemptDone`]; meanwhile the component's mailbox stays
//! free, so it answers a cancel at once (the attempt, its child, ends with
//! it).
//!
//! One attempt is: write the packet ([`packet`]), open the ledger row, start
//! the attempt's tools ([`tools`], `fvd mcp`'s server) and, when its agent has
//! a model API, its model proxy; run the agent on this host in the
//! component's worktree or as a fleet job on a worker ([`fleet`]) that sends
//! back its commit; and take the work in: commit it here, or adopt the
//! worker's commit after the pack's limits are checked. The budgets an
//! attempt is held to live in [`budget`].
//!
//! What the attempt leads to (the next run queued, a blocker, a question)
//! is the component's to record: the attempt only reports how it ended
//! ([`AttemptEnd`]). An error fails the actor, and through the link its
//! component, which the gate restarts from the store: the attempt, cut off,
//! runs again under its number.
//!
//! Nothing here knows the component's message type: the answer goes
//! through a [`ractor::DerivedActorRef`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fvd_spec::{AgentSpec, ComponentSpec};
use fvd_store::model::{JobResult, PortCode};
use fvd_store::states::AttemptKind;
use fvd_store::{AttemptRow, EscapeRow, Store, now_ms};
use fvd_workspace::agent;
use fvd_workspace::attempt_caps::TakeInError;
use fvd_workspace::worktree::{self, Worktree};
use ractor::{Actor, ActorProcessingErr, ActorRef, DerivedActorRef};
use tracing::Span;

use crate::scheduler::SchedulerMsg;

pub mod budget;
pub mod fleet;
pub mod launch;
pub mod packet;
pub mod tools;

pub use budget::{Spent, allowance, budget_spent};
pub use launch::AGENT_LABEL_PREFIX;

/// What the agent loop of a component needs besides its spec: made once
/// when the component starts ([`AgentLoop::prepare`]).
#[derive(Debug, Clone)]
pub struct AgentLoop {
    /// The component's `[agent]`.
    pub agent: AgentSpec,
    pub worktree: Worktree,
    /// The port's prep fields, for the packet's `component_context`.
    pub prep: BTreeMap<String, String>,
    /// The component's judge, repository-relative (`fvd_workspace::judge`):
    /// its runs test an attempt with these as the port's commit has them.
    pub judge: Vec<String>,
    /// Where prompts, handoffs and agent output of each attempt are kept.
    pub dir: PathBuf,
    /// A pipeline step's facts of the port (its packet is a
    /// `pipeline_context`); `None` for a component.
    pub pipeline: Option<agent::pipeline::PipelineFacts>,
}

/// Everything an attempt runs with, from its component.
#[derive(Debug, Clone)]
pub struct AttemptCtx {
    pub family: String,
    pub spec: ComponentSpec,
    pub lp: AgentLoop,
    pub store: Store,
    pub scheduler: ActorRef<SchedulerMsg>,
    /// Whether and where its agent may run, jailed how.
    pub agents: agent::AgentPolicy,
    /// The port's repository (the main checkout).
    pub repo: String,
    pub code: PortCode,
    /// The component's span: the attempt's `agent` span hangs under it.
    pub span: Span,
}

impl AttemptCtx {
    /// The fleet's attempt registry when agents run on workers (`--agents
    /// fleet`); `None` when they run on this host.
    fn fleet(&self) -> Option<&agent::FleetAttempts> {
        match self.agents.on {
            agent::AgentsOn::Fleet => Some(&self.agents.registry),
            agent::AgentsOn::Host => None,
        }
    }
}

/// What one agent turn is about: its attempt number, the run it starts
/// from (`kind`: `fix` after a red run, `cleanup` after a refused pass),
/// and what the component knew when it began.
#[derive(Debug, Clone)]
pub struct AttemptTurn {
    pub attempt: u32,
    /// The run it starts from, and its result.
    pub job_id: String,
    pub result: JobResult,
    /// The worker of that run (empty: none).
    pub worker_id: String,
    pub kind: AttemptKind,
    /// The try an earlier process started on a worker, to adopt.
    pub adopting: Option<fvd_store::FleetTry>,
    /// What the component spent before this attempt.
    pub used: Spent,
    /// The recorded attempts, oldest first.
    pub recorded: Vec<AttemptRow>,
    /// The answered questions its packet carries.
    pub answers: Vec<EscapeRow>,
    /// The component's judge questions a person decided.
    pub judge_decisions: Vec<EscapeRow>,
}

/// What an agent left: its commit, how it ended, its handoff, and the
/// worker it ran on (empty: this host).
#[derive(Debug)]
pub struct AgentDone {
    pub commit: worktree::Commit,
    pub exit: agent::AgentExit,
    pub handoff: agent::HandoffRead,
    pub worker_id: String,
    /// Its commit was refused (over a limit on what an attempt brings
    /// back): why, in one line; `commit` is then the base.
    pub refused: Option<String>,
}

impl AgentDone {
    /// The attempt's ledger row as the agent left it.
    pub fn row(&self, family: &str, component: &str, attempt: u32) -> AttemptRow {
        let (commit, exit, handoff) = (&self.commit, &self.exit, &self.handoff);
        AttemptRow {
            worker_id: self.worker_id.clone(),
            family: family.to_string(),
            component: component.to_string(),
            attempt,
            commit_sha: commit.sha.clone(),
            diff_stat: commit.stat.clone(),
            diff: commit.diff.clone(),
            exit_code: exit.exit_code,
            signal: exit.signal,
            timed_out: exit.timed_out,
            duration_ms: exit.duration_ms,
            handoff_status: handoff.status,
            handoff_summary: handoff.summary.clone(),
            handoff_text: handoff.text.clone(),
            finished_ms: now_ms(),
            ..AttemptRow::default()
        }
    }
}

/// How an attempt ended.
#[derive(Debug)]
pub enum AttemptEnd {
    /// The agent ran and its work is in the worktree (or was refused).
    Ran(Box<AgentDone>),
    /// Its work could not be committed (why): the component blocks.
    Uncommitted(String),
    /// A cause outside the agent and the code ended it (its model API
    /// refused the key or kept failing; no worker could run it): the
    /// attempt is closed as `environment`, not counted, and the worktree is
    /// back at its base, unless `reset` says why not.
    Environment {
        why: String,
        reset: Result<(), String>,
    },
    /// The try it was to adopt runs on no worker (why): nothing ran, and
    /// the attempt starts again from its base.
    NotAdopted(String),
}

/// The attempt's one message back to its component.
#[derive(Debug)]
pub struct AttemptDone {
    pub turn: AttemptTurn,
    pub end: AttemptEnd,
}

/// A component's message type that carries [`AttemptDone`].
macro_rules! attempt_done_msg {
    ($msg:ident :: $variant:ident) => {
        impl From<Box<$crate::attempt::AttemptDone>> for $msg {
            fn from(d: Box<$crate::attempt::AttemptDone>) -> Self {
                $msg::$variant(d)
            }
        }

        impl TryFrom<$msg> for Box<$crate::attempt::AttemptDone> {
            type Error = $msg;

            fn try_from(m: $msg) -> Result<Self, $msg> {
                match m {
                    $msg::$variant(d) => Ok(d),
                    other => Err(other),
                }
            }
        }
    };
}
pub(crate) use attempt_done_msg;

#[derive(Debug)]
pub struct AttemptActor;

#[derive(Debug)]
pub struct AttemptArgs {
    pub cx: AttemptCtx,
    pub turn: AttemptTurn,
    pub reply: DerivedActorRef<Box<AttemptDone>>,
}

impl Actor for AttemptActor {
    type Msg = ();
    type State = Option<AttemptArgs>;
    type Arguments = AttemptArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<()>,
        args: AttemptArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(Some(args))
    }

    /// The whole attempt, in the actor's own task: its answer goes back,
    /// and the actor stops.
    async fn post_start(
        &self,
        myself: ActorRef<()>,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(AttemptArgs { cx, turn, reply }) = st.take() else {
            return Ok(());
        };
        let end = run(&cx, &turn).await?;
        reply
            .send_message(Box::new(AttemptDone { turn, end }))
            .map_err(|_| "the attempt's component is gone")?;
        myself.stop(None);
        Ok(())
    }
}

/// Finds or makes the component's worktree and reads the port's prep
/// fields from the stored spec.
impl AgentLoop {
    pub async fn prepare(
        store: &Store,
        spec: &ComponentSpec,
        family: &str,
        repo: &str,
        code: &PortCode,
    ) -> Result<AgentLoop, String> {
        let name = &spec.name;
        let agent = spec
            .agent
            .clone()
            .ok_or_else(|| format!("component {name} has no [agent]"))?;
        let known = store
            .worktree(family, name)
            .await
            .map_err(|e| e.to_string())?;
        let repo = Path::new(repo);
        // A new worktree starts at the commit the port is pinned to.
        let base = Some(code.commit.as_str()).filter(|c| !c.is_empty());
        let clock = std::time::Instant::now();
        let mut wt = worktree::ensure(repo, family, name, known, base)
            .await
            .map_err(|e| e.to_string())?;
        // A pipeline step's agent works on the code P7 runs at now: a
        // worktree left at earlier code (before a component was fixed)
        // starts again from it. A pass of the step's agent is in that code
        // already (the gate merges it with the components' fixes); an
        // attempt that did not pass stays in the ledger.
        if let Some(base) = base.filter(|_| spec.stage == fvd_spec::Stage::Pipeline) {
            let head = worktree::head(&wt.path).await.map_err(|e| e.to_string())?;
            if !fvd_workspace::judge::is_ancestor(&wt.path, base, &head).await {
                tracing::info!(%family, component = %name, from = %head, to = %base, "the pipeline's code moved: the step's worktree starts again from it");
                worktree::reset(&wt.path, base)
                    .await
                    .map_err(|e| e.to_string())?;
                wt.base_commit = base.to_string();
            }
        }
        tracing::info!(%family, component = %name, worktree_ms = clock.elapsed().as_millis() as u64, "agent worktree ready");
        store
            .record_worktree(family, name, &wt)
            .await
            .map_err(|e| e.to_string())?;
        let port = store
            .port(family)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("port {family} has no row in the store"))?;
        let port_spec = fvd_spec::parse(Path::new(&port.spec_path), &port.spec_toml)
            .map_err(|e| e.to_string())?;
        let pipeline = (spec.stage == fvd_spec::Stage::Pipeline)
            .then(|| agent::pipeline::PipelineFacts::of(&port_spec));
        let prep = port_spec.prep;
        let dir = agent_dir(repo, family, name).map_err(|e| e.to_string())?;
        let tests: Vec<String> = spec.test_files().iter().map(|t| t.to_string()).collect();
        let mut more: Vec<String> = ["official_ref_dir", "port_state_file"]
            .iter()
            .filter_map(|k| prep.get(*k).cloned())
            .collect();
        if let Ok(spec) = Path::new(&port.spec_path).strip_prefix(repo) {
            more.push(spec.to_string_lossy().into_owned());
        }
        let judge = fvd_workspace::judge::paths(&code.prefix, &tests, &more);
        Ok(AgentLoop {
            agent,
            worktree: wt,
            prep,
            judge,
            dir,
            pipeline,
        })
    }
}

/// Where a component's packets and handoffs go:
/// `REPO/.fvd/agent/<family>/<component>`, never elsewhere.
fn agent_dir(repo: &Path, family: &str, name: &str) -> Result<PathBuf, fvd_paths::PathError> {
    fvd_paths::join_under_no_links(
        &repo.join(".fvd").join("agent"),
        Path::new(family).join(name),
    )
}

/// One attempt: its packet, its agent, its work taken in.
async fn run(cx: &AttemptCtx, turn: &AttemptTurn) -> Result<AttemptEnd, ActorProcessingErr> {
    let attempt = turn.attempt;
    let clock = std::time::Instant::now();
    let files = packet::write(cx, turn).await?;
    let packet_ms = clock.elapsed().as_millis() as u64;
    let ran = launch::run_agent(cx, turn, &files).await?;
    if let Some(why) = ran.not_adopted {
        return Ok(AttemptEnd::NotAdopted(why));
    }
    let (exit, mut handoff) = (ran.exit, ran.handoff);
    if let Some(env) = ran.environment {
        return environment(cx, turn, &ran.head_before, &env.0).await;
    }
    // A question asked by tool is the attempt's escape hatch, unless its
    // handoff already asks one.
    if let Some(q) = &ran.asked
        && handoff.escape().is_none()
    {
        handoff = packet::question_handoff(cx, &handoff, q, &turn.result).await?;
    }
    let wt = &cx.lp.worktree.path;
    // A worker's commit moves the component's branch to it; a host run's
    // work is committed here.
    // A commit over the limits on what an attempt brings back (issue #38)
    // is refused before anything of it is checked out: the attempt is
    // recorded with the refusal as its outcome, and the worktree stays at
    // its base.
    let limits = cx.agents.limits;
    let (committed, agent_worker) = match &ran.fleet {
        Some(f) => (
            match &f.refused {
                Some(why) => Err(worktree::WorktreeError::TakeIn(TakeInError::OverLimit(
                    why.clone(),
                ))),
                None => worktree::adopt(wt, &ran.head_before, &f.sha, &f.pack, &limits).await,
            },
            f.worker_id.clone(),
        ),
        None => (
            worktree::commit(wt, &format!("fvd: {} attempt {attempt}", cx.spec.name)).await,
            String::new(),
        ),
    };
    let (commit, refused) = match committed {
        Ok(c) => (c, None),
        Err(worktree::WorktreeError::TakeIn(TakeInError::OverLimit(why))) => {
            tracing::warn!(family = %cx.family, component = %cx.spec.name, attempt, worker = %agent_worker, "{why}");
            let base = worktree::Commit {
                sha: ran.head_before.clone(),
                stat: why.clone(),
                diff: String::new(),
            };
            (base, Some(why))
        }
        Err(e) => {
            return Ok(AttemptEnd::Uncommitted(format!(
                "agent attempt {attempt} could not be committed: {e}"
            )));
        }
    };
    let commit_ms = clock.elapsed().as_millis() as u64 - packet_ms - ran.run_ms;
    // fvd's own time around the agent, for `bench/agent_overhead.py`.
    tracing::info!(
        family = %cx.family,
        component = %cx.spec.name,
        attempt,
        packet_ms,
        ledger_ms = ran.ledger_ms,
        proxy_ms = ran.proxy_ms,
        agent_ms = exit.duration_ms,
        commit_ms,
        total_ms = clock.elapsed().as_millis() as u64,
        "agent attempt overhead"
    );
    Ok(AttemptEnd::Ran(Box::new(AgentDone {
        commit,
        exit,
        handoff,
        worker_id: agent_worker,
        refused,
    })))
}

/// The attempt's model API (or the fleet) failed for a reason outside the
/// agent and the code: the attempt is closed as `environment` (not
/// counted, run again under its number when the port resumes) and the
/// worktree is reset to where it began.
async fn environment(
    cx: &AttemptCtx,
    turn: &AttemptTurn,
    head_before: &str,
    why: &str,
) -> Result<AttemptEnd, ActorProcessingErr> {
    let (family, name) = (&cx.family, &cx.spec.name);
    tracing::warn!(%family, component = %name, attempt = turn.attempt, "environment: agent attempt {}: {why}", turn.attempt);
    cx.store
        .attempt_environment(family, name, turn.attempt, why, now_ms())
        .await?;
    let reset = worktree::reset(&cx.lp.worktree.path, head_before)
        .await
        .map_err(|e| e.to_string());
    Ok(AttemptEnd::Environment {
        why: why.to_string(),
        reset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_files_stay_under_the_agent_folder() {
        let repo = Path::new("/r");
        assert_eq!(
            agent_dir(repo, "p", "c").unwrap(),
            Path::new("/r/.fvd/agent/p/c")
        );
        for name in ["../../../etc", "/tmp/x", "a/../.."] {
            assert!(agent_dir(repo, "p", name).is_err(), "{name}");
        }
    }
}
