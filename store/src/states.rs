//! The states a port, a component and a job can be in, and every other
//! outcome the store records (gate decisions, attempt and escape-hatch
//! states, trace and variant steps), with their one mapping to the text
//! the database (and the wire) holds. Verdicts are
//! [`RecordedVerdict`]s, an error's kind in a column of its own.
//!
//! Every query of the store binds and reads these through [`as_str`] and
//! [`FromStr`](std::str::FromStr); no other code spells the text. A value the database holds
//! that none of these knows is an error naming the column and the value
//! ([`crate::StoreError::State`]), never a panic.
//!
//! [`as_str`]: PortState::as_str

use fvd_contracts::recorded_enum as stored_enum;

pub use fvd_contracts::recorded::{RecordedVerdict, UnknownState};
pub use fvd_contracts::verdict::ErrorKind;

stored_enum! {
    /// Where a port stands (`ports.state`). The phase it stands at is
    /// `ports.phase` (`P0`..`P11`).
    pub enum PortState ("port state") {
        /// The gate drives it: phases are decided, components run. A port
        /// is submitted, resumed and answered into this state.
        #[default]
        Running = "running",
        /// Paused: every component is final or waits for an answer to an
        /// escape hatch (`fvd answer`), and at least one waits; none waits
        /// for an environment. The actors stay; an answer resumes it.
        AskUser = "ask_user",
        /// Paused: every component is final or waits (for an answer or a
        /// worker), and at least one waits for a worker whose environment
        /// can run it. A worker that can resumes it.
        Environment = "environment",
        /// Every component passed P6; P7–P11 are recorded `pending`: the
        /// port waits on work fvd does not drive.
        Waiting = "waiting",
        /// The gate refused the phase in `ports.phase` (P0 or P2 before any
        /// component ran; P7 when a component ended without a pass).
        Blocked = "blocked",
        /// `fvd cancel`: its components without a final verdict ended
        /// `blocked` with verdict `cancelled`.
        Cancelled = "cancelled",
    }
}

impl PortState {
    /// Paused until something outside fvd comes: an answer or an
    /// environment.
    pub fn is_paused(self) -> bool {
        matches!(self, PortState::AskUser | PortState::Environment)
    }

    /// The gate still has work: running or paused. A fleet orchestrator
    /// that starts resumes such ports.
    pub fn is_unfinished(self) -> bool {
        self == PortState::Running || self.is_paused()
    }
}

stored_enum! {
    /// Where a component of a port stands in phase 6 (`components.status`).
    /// Its `verdict` and `reason` columns say what its latest run found.
    pub enum ComponentStatus ("component status") {
        /// No run queued yet: new, started over (`--rerun`) or planned
        /// again by a resubmitted spec.
        #[default]
        Pending = "pending",
        /// A run waits for a worker slot: the first, a retry after an
        /// infrastructure error, or one requeued from a lost worker. The
        /// reason may say why it waits.
        Queued = "queued",
        /// Its run holds a lease on the worker in `worker_id`.
        Running = "running",
        /// A run passed and another is about to be queued to confirm the
        /// pass holds `confirm_runs` times in a row.
        Confirming = "confirming",
        /// The trace actor drills a red run down (traced reruns); the
        /// reason names the step.
        Tracing = "tracing",
        /// A red run's test runs under each hypothesis variant at once; the
        /// reason says how many.
        Variants = "variants",
        /// The coding agent works on an attempt after a red run or a pass
        /// the cleanup gate refused.
        Agent = "agent",
        /// The agent asked a person (an escape hatch): it waits for
        /// `fvd answer`; the rest of the port goes on.
        AskUser = "ask_user",
        /// No worker whose environment works can take its run: it waits
        /// for one. Nothing is counted against it.
        Environment = "environment",
        /// Final: a `non_skip_pass` that held and cleared the cleanup gate.
        NonSkipPass = "non_skip_pass",
        /// Final: ended without a pass; `verdict` and `reason` say why (a
        /// red run without an agent, a spent budget, a cancel, a run no
        /// worker can hold, infrastructure lost on every retry, …).
        Blocked = "blocked",
    }
}

impl ComponentStatus {
    /// An end state of phase 6.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            ComponentStatus::NonSkipPass | ComponentStatus::Blocked
        )
    }

    /// Waits for something outside fvd: an answer or an environment.
    pub fn is_paused(self) -> bool {
        matches!(
            self,
            ComponentStatus::AskUser | ComponentStatus::Environment
        )
    }
}

stored_enum! {
    /// Where one run of a parity test (a job) stands (`jobs.state`).
    pub enum JobState ("job state") {
        /// Recorded and waiting for a lease (also after a lost worker's
        /// run was put back).
        #[default]
        Queued = "queued",
        /// Leased to `worker_id` under `lease_epoch`; only a result under
        /// that epoch finishes it.
        Running = "running",
        /// Its result is recorded: `verdict`, `reason` and the evidence.
        Finished = "finished",
        /// Ended on its worker's environment, not on the code: no verdict,
        /// not a run of the component; the evidence is kept for `fvd logs`.
        Environment = "environment",
        /// Ran out of GPU memory while its GPU was shared with another
        /// run: no verdict, not a run of the component; it runs again
        /// alone, and the evidence is kept for `fvd logs`.
        SharedOom = "shared_oom",
        /// No worker can ever hold it (embedded mode's machine lacks what
        /// it needs): it never started.
        Unplaced = "unplaced",
        /// It was queued or running when its port was cancelled or its
        /// gate started again; a resumed port runs it again under a new
        /// run number.
        Abandoned = "abandoned",
    }
}

impl JobState {
    /// Queued or running: a result may still come.
    pub fn is_unfinished(self) -> bool {
        matches!(self, JobState::Queued | JobState::Running)
    }
}

stored_enum! {
    /// One decision the gate recorded about a phase (`gate_events.outcome`).
    pub enum GateOutcome ("gate outcome") {
        /// The phase began.
        #[default]
        Entered = "entered",
        Passed = "passed",
        /// Its conditions were not met; they are recorded with it.
        Refused = "refused",
        /// A phase fvd does not drive: it waits on people, with the reason.
        Pending = "pending",
        /// A decided phase is open again: a component asked for a
        /// conversion retry (P5).
        Reopened = "reopened",
    }
}

stored_enum! {
    /// Where an agent attempt of the ledger stands (`agent_attempts.state`).
    pub enum AttemptState ("attempt state") {
        /// Opened just before the agent started, until its work is
        /// committed and recorded: a restart that finds it runs it again.
        #[default]
        Running = "running",
        /// Its work is committed and in the ledger.
        Recorded = "recorded",
        /// Its model API's environment ended it (a refused key, an API that
        /// kept failing): not counted, run again under its number.
        Environment = "environment",
    }
}

stored_enum! {
    /// Why an agent turn ran (`agent_attempts.kind`).
    pub enum AttemptKind ("attempt kind") {
        /// After a red run.
        #[default]
        Fix = "fix",
        /// After a pass the cleanup gate refused.
        Cleanup = "cleanup",
    }
}

stored_enum! {
    /// What became of the handoff an agent returned
    /// (`agent_attempts.handoff_status`).
    pub enum HandoffStatus ("handoff status") {
        /// Not read yet: the attempt is running.
        #[default]
        Pending = "",
        Valid = "valid",
        /// Read, with findings (in the summary).
        Invalid = "invalid",
        Missing = "missing",
    }
}

stored_enum! {
    /// Where an escape hatch stands (`escape_hatches.status`).
    pub enum EscapeStatus ("escape hatch status") {
        /// Waits for `fvd answer`.
        #[default]
        Open = "open",
        /// Answered; no attempt was given the answer yet.
        Answered = "answered",
        /// An attempt was given the answer.
        Resolved = "resolved",
        /// The port was rerun before the answer reached an attempt.
        Withdrawn = "withdrawn",
    }
}

stored_enum! {
    /// What an escape hatch asks about (`escape_hatches.about`).
    pub enum EscapeAbout ("escape hatch subject") {
        /// A decision the agent asked a person for.
        #[default]
        Agent = "agent",
        /// The judge change of an attempt (issue #39): approve it, or drop
        /// it from the branch.
        Judge = "judge",
    }
}

stored_enum! {
    /// Where a trace investigation stands (`trace_investigations.state`).
    pub enum TraceState ("trace state") {
        #[default]
        Running = "running",
        Done = "done",
    }
}

stored_enum! {
    /// How a trace investigation ended (`trace_investigations.outcome`).
    pub enum TraceOutcome ("trace outcome") {
        /// Still running.
        #[default]
        None = "",
        /// The first divergent module has nothing narrower to trace.
        Leaf = "leaf",
        /// `depth` traced runs were spent before a leaf.
        Depth = "depth",
        NoDivergence = "no_divergence",
        /// A step failed or compared nothing.
        Error = "error",
        /// A comparator check says the comparison is not a verdict on the port.
        Untrusted = "untrusted",
        /// The process investigating it stopped.
        Abandoned = "abandoned",
    }
}

stored_enum! {
    /// Where one row of a variant table stands (`variant_runs.state`).
    pub enum VariantState ("variant state") {
        #[default]
        Running = "running",
        Done = "done",
        /// The process filling the table stopped.
        Abandoned = "abandoned",
    }
}

stored_enum! {
    /// What a variant row says next to the baseline (`variant_runs.finding`).
    pub enum VariantFinding ("variant finding") {
        /// Not in yet.
        #[default]
        None = "",
        /// The red run itself.
        Baseline = "baseline",
        Passes = "passes",
        /// Still red, with its first divergence elsewhere.
        Moves = "moves",
        /// Still red at the same first divergence.
        Same = "same",
        /// Red, untraced.
        Red = "red",
        /// Ended otherwise (timeout, error, environment, unplaced, …).
        Other = "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::fmt;
    use std::str::FromStr;

    fn round_trips<T>(all: &[T])
    where
        T: Copy + PartialEq + fmt::Debug + fmt::Display + FromStr<Err = UnknownState>,
    {
        let mut seen = std::collections::BTreeSet::new();
        for v in all {
            let text = v.to_string();
            assert!(seen.insert(text.clone()), "{text} names two variants");
            assert_eq!(text.parse::<T>(), Ok(*v));
        }
    }

    #[test]
    fn every_state_reads_back_as_itself() {
        round_trips(PortState::ALL);
        round_trips(ComponentStatus::ALL);
        round_trips(JobState::ALL);
        round_trips(GateOutcome::ALL);
        round_trips(AttemptState::ALL);
        round_trips(AttemptKind::ALL);
        round_trips(HandoffStatus::ALL);
        round_trips(EscapeStatus::ALL);
        round_trips(EscapeAbout::ALL);
        round_trips(TraceState::ALL);
        round_trips(TraceOutcome::ALL);
        round_trips(VariantState::ALL);
        round_trips(VariantFinding::ALL);
    }

    #[test]
    fn an_unknown_text_is_named() {
        let e = "in_progress".parse::<PortState>().unwrap_err();
        assert_eq!(e.to_string(), "unknown port state \"in_progress\"");
        assert!("Running".parse::<JobState>().is_err(), "case matters");
    }

    #[test]
    fn the_wire_and_database_texts_stay_as_they_were() {
        let texts = |v: &[&str]| v.join(" ");
        assert_eq!(
            texts(
                &PortState::ALL
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
            ),
            "running ask_user environment waiting blocked cancelled"
        );
        assert_eq!(
            texts(
                &ComponentStatus::ALL
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
            ),
            "pending queued running confirming tracing variants agent ask_user environment non_skip_pass blocked"
        );
        assert_eq!(
            texts(&JobState::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>()),
            "queued running finished environment shared_oom unplaced abandoned"
        );
    }

    #[test]
    fn final_paused_and_unfinished() {
        let finals: Vec<_> = ComponentStatus::ALL
            .iter()
            .filter(|s| s.is_final())
            .collect();
        assert_eq!(
            finals,
            [&ComponentStatus::NonSkipPass, &ComponentStatus::Blocked]
        );
        assert!(PortState::Environment.is_unfinished() && !PortState::Waiting.is_unfinished());
        assert!(JobState::Running.is_unfinished() && !JobState::Unplaced.is_unfinished());
    }
}
