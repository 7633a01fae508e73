//! The orchestrator's actors.
//!
//! * [`orchestrator::OrchestratorActor`]: one per process; starts, resumes
//!   and supervises ports.
//! * [`gate::GateActor`]: one per port; the phase state machine P0–P11.
//! * [`component::ComponentSubagentActor`]: one per component; loops its
//!   parity test through the scheduler and records verdicts.
//! * [`scheduler::SchedulerActor`]: workers, slots, queue and leases. It
//!   knows no component: it reports [`scheduler::JobEvent`]s to whoever
//!   queued a job.
//! * [`trace_actor::TraceActor`]: one per port; drills a red component
//!   down with traced reruns to its first divergent module.
//! * [`variant_actor::VariantActor`]: one per port; runs a red component's
//!   test under each of its hypothesis variants at once and tables them.
//! * [`run_verdict`]: the verdict of a finished job (or that its
//!   environment failed it); [`port_status`]: the port's `PORT_STATUS.md`
//!   from the store, through the contracts' co-author.
//!
//! Each actor commits its state changes to `fvd_store` itself, before it
//! acts on them; the gRPC edge never writes to the database. The spec
//! (`fvd_spec`) and the agent's workspace (`fvd_workspace`) are crates of
//! their own, without actors.

pub mod component;
pub mod fvd_dir;
pub mod gate;
pub mod orchestrator;
pub mod port_status;
pub mod restarts;
pub mod run_verdict;
pub mod scheduler;
pub mod trace_actor;
pub mod variant_actor;
