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
//! * [`red_run`]: a component's finished run, classified once, and where
//!   it goes: recorded, retried elsewhere, or (a red run) through the
//!   port's diagnosers first, then an agent turn or the end. The run
//!   answers its component through a derived ref ([`red_run::Diagnosis`]):
//!   no diagnoser knows the component's message type.
//! * [`diagnosis`]: the shape the two diagnosers share (arguments, one
//!   message enum, spawn, reruns):
//!   [`trace_actor::TraceActor`], one per port, drills a red component down
//!   with traced reruns to its first divergent module;
//!   [`variant_actor::VariantActor`], one per port, runs a red component's
//!   test under each of its hypothesis variants at once and tables them
//!   ([`variant_table`]: the table as text).
//! * [`attempt`]: one actor per running coding-agent attempt, spawned by
//!   its component and linked to it; it answers with one
//!   [`attempt::AttemptDone`].
//! * [`run_env`]: the variables a run gets (every run's, a traced rerun's).
//! * [`judge_question`]: the question an attempt's judge change becomes
//!   (text only; the component asks and acts on the answer);
//!   [`pipeline_words`]: the gate's condition when the pipeline sends a
//!   component back to P6 (text only; `PORT_STATUS.md` reads it back).
//! * [`run_verdict`]: the verdict of a finished job (or that its
//!   environment failed it); [`port_status`]: the port's `PORT_STATUS.md`
//!   from the store, through the contracts' co-author.
//!
//! Each actor commits its state changes to `fvd_store` itself, before it
//! acts on them; the gRPC edge never writes to the database. The spec
//! (`fvd_spec`) and the agent's workspace (`fvd_workspace`) are crates of
//! their own, without actors.

pub mod attempt;
pub mod component;
pub mod diagnosis;
pub mod fvd_dir;
pub mod gate;
pub mod judge_question;
pub mod orchestrator;
pub mod pipeline_words;
pub mod port_status;
pub mod red_run;
pub mod restarts;
pub mod run_env;
pub mod run_verdict;
pub mod scheduler;
pub mod trace_actor;
pub mod variant_actor;
pub mod variant_table;
