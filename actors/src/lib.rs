//! The orchestrator's actors and the durable store they commit to.
//!
//! * [`orchestrator::OrchestratorActor`]: one per process; starts, resumes
//!   and supervises ports.
//! * [`gate::GateActor`]: one per port; the phase state machine P0–P11.
//! * [`component::ComponentSubagentActor`]: one per component; loops its
//!   parity test through the scheduler and records verdicts.
//! * [`scheduler::SchedulerActor`]: workers, slots, queue and leases.
//! * [`trace_actor::TraceActor`]: one per port; drills a red component
//!   down with traced reruns to its first divergent module.
//! * [`agent`] and [`worktree`]: the agent loop's adapter (packet, agent
//!   subprocess, handoff) and the components' git worktrees.
//!
//! Persistence lives here, beside the actors, because each state change is
//! committed by the actor that decides it, before it acts on it; the gRPC
//! edge never writes to the database itself.

pub mod agent;
pub mod cleanup;
pub mod clock;
pub mod component;
pub mod gate;
pub mod init;
pub mod model;
pub mod orchestrator;
pub mod port_status;
pub mod run_verdict;
pub mod scheduler;
pub mod spec;
pub mod store;
pub mod trace_actor;
pub mod trace_spec;
pub mod worktree;
