//! A finished run of a component, classified once, and where it goes next.
//!
//! The component actor hands every finished run of its own to [`classify`]
//! and [`decide`], once: an environment failure is no verdict (the run goes
//! to another worker); a `debug_red` run of a component with a trace table
//! or variants is a [`RedRun`] with a route through the port's diagnosers
//! (the trace actor, then the variant actor), each of which adds its note
//! and passes it on with [`hand_on`], the last one back to the component
//! ([`Diagnosis::Done`]); every other run, and a red run
//! back from its route, is recorded, and [`after_verdict`] says what follows
//! (another run, an agent turn, a pass to confirm, or the end).
//!
//! The diagnosers never classify the red run again: they get its [`Verdict`]
//! with it. Their own reruns (traced reruns, variant runs) are classified
//! where they end, as diagnoses that never become the component's verdict.

use std::collections::VecDeque;

use fvd_contracts::verdict::Verdict;
use fvd_spec::ComponentSpec;
use fvd_store::messages::JobReport;
use fvd_store::model::{ComponentStatus, JobResult, RecordedVerdict};
use ractor::{ActorStatus, DerivedActorRef, MessagingErr};
use tracing::Span;

use crate::run_verdict;

/// How many infra errors reported by workers (CUDA init, lost GPU) a
/// component tolerates before it is blocked on infrastructure.
pub const MAX_INFRA_VERDICTS: u32 = 3;

/// The port's diagnosing actors a red run may visit, as the gate spawned
/// them: each takes a red run ([`crate::diagnosis`]).
#[derive(Debug, Clone, Default)]
pub struct Diagnosers {
    /// The trace actor, when some component has `[component.trace]`.
    pub trace: Option<DerivedActorRef<Box<RedRun>>>,
    /// The variant actor, when some component has variants.
    pub variants: Option<DerivedActorRef<Box<RedRun>>>,
}

/// What a red run's component hears from its route: what a diagnosing
/// actor does with the run now (the component writes it on its row while
/// the run is still its run in flight), and the run back at its end.
#[derive(Debug)]
pub enum Diagnosis {
    Progress {
        job_id: String,
        status: ComponentStatus,
        verdict: RecordedVerdict,
        reason: String,
    },
    /// The run back from its route, with the notes the diagnosers added:
    /// it is recorded as it is, never classified again.
    Done(Box<RedRun>),
}

/// A red run on its way through the diagnosers, classified once.
#[derive(Debug)]
pub struct RedRun {
    pub spec: ComponentSpec,
    /// The run's report and worker, handed back untouched: the component
    /// records the run as it would have without a diagnosis.
    pub report: JobReport,
    pub worker_id: String,
    /// Its verdict, as the component classified it.
    pub verdict: Verdict,
    /// The component the run belongs to: it writes what the diagnosers
    /// show on its row, and gets the run back at the end of its route.
    pub component: DerivedActorRef<Diagnosis>,
    /// The component's span: the diagnosers' spans hang under it.
    pub span: Span,
    /// The diagnosers still to see the run, in order.
    pub route: VecDeque<DerivedActorRef<Box<RedRun>>>,
    /// The trace investigation's one-line summary, once traced.
    pub trace_summary: String,
    /// The variant table's note, once its variants ran.
    pub variant_note: String,
}

impl RedRun {
    /// The run's verdict as recorded.
    pub fn recorded(&self) -> RecordedVerdict {
        (&self.verdict).into()
    }

    /// The note a blocked reason gets, put before the failing assertion so
    /// a cut-off evidence cell still names it: the variant table's note,
    /// then the investigation's summary.
    pub fn note(&self) -> String {
        let mut s = String::new();
        if !self.variant_note.is_empty() {
            s.push_str(&format!("{}; ", self.variant_note));
        }
        if !self.trace_summary.is_empty() {
            let mut t: String = self.trace_summary.chars().take(TRACE_NOTE_CHARS).collect();
            if self.trace_summary.chars().count() > TRACE_NOTE_CHARS {
                t.push('…');
            }
            s.push_str(&format!("{t}; "));
        }
        s
    }

    /// Shows what a diagnosing actor does with this run on its component's
    /// row: the component writes it (status `status`, the run's verdict,
    /// `reason`).
    pub fn progress(&self, status: ComponentStatus, reason: String) {
        let _ = self.component.send_message(Diagnosis::Progress {
            job_id: self.report.job_id.clone(),
            status,
            verdict: self.recorded(),
            reason,
        });
    }
}

/// Longest trace summary a blocked reason gets: PORT_STATUS.md cuts
/// evidence at 240 characters, and the failing assertion must still show
/// after the note.
pub const TRACE_NOTE_CHARS: usize = 150;

/// The verdict of a finished run of `spec` in the checkout at `repo`: the
/// one classification of the component's run.
pub fn classify(repo: &str, spec: &ComponentSpec, report: &JobReport) -> Verdict {
    let in_repo = run_verdict::repo_modules(repo, spec);
    match spec.stage {
        fvd_spec::Stage::Example => {
            run_verdict::classify_exit(report, &in_repo, &spec.argv().join(" "))
        }
        _ => run_verdict::classify(report, &in_repo),
    }
}

/// What a classified run leads to before anything is recorded.
#[derive(Debug)]
pub enum Decision {
    /// Its environment failed it, not the code: no verdict, no run, no
    /// agent, no trace; it goes to another worker.
    Environment(String),
    /// A red run to diagnose first: the diagnosers to visit, in order.
    Diagnose(VecDeque<DerivedActorRef<Box<RedRun>>>),
    /// A verdict to record now.
    Record,
}

/// Decides what a classified run of `spec` leads to: a `debug_red` run is
/// traced when the component has a trace table, then gets its variants
/// when it has some (each only where the port has the diagnoser).
pub fn decide(v: &Verdict, spec: &ComponentSpec, diagnosers: &Diagnosers) -> Decision {
    if let Verdict::Environment { cause } = v {
        return Decision::Environment(cause.clone());
    }
    if RecordedVerdict::from(v) != RecordedVerdict::DebugRed {
        return Decision::Record;
    }
    let route: VecDeque<DerivedActorRef<Box<RedRun>>> = [
        diagnosers.trace.as_ref().filter(|_| spec.trace.is_some()),
        diagnosers
            .variants
            .as_ref()
            .filter(|_| !spec.variants.is_empty()),
    ]
    .into_iter()
    .flatten()
    .cloned()
    .collect();
    if route.is_empty() {
        Decision::Record
    } else {
        Decision::Diagnose(route)
    }
}

/// What follows a recorded verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterVerdict {
    /// An infrastructure error under [`MAX_INFRA_VERDICTS`]: the run goes
    /// to another slot.
    Retry,
    /// A pass: confirmed by more runs, then through the cleanup gate.
    Pass,
    /// Not a pass, not infrastructure, and the component has an agent: an
    /// agent turn from this run.
    Agent,
    /// The component ends blocked with the verdict.
    Block,
}

/// What follows verdict `v` of a component that had `infra_verdicts`
/// infrastructure errors so far and has an agent or not.
pub fn after_verdict(v: &Verdict, infra_verdicts: u32, agent: bool) -> AfterVerdict {
    if v.is_infra() && infra_verdicts < MAX_INFRA_VERDICTS {
        AfterVerdict::Retry
    } else if !v.is_pass() && !v.is_infra() && agent {
        AfterVerdict::Agent
    } else if v.is_pass() {
        AfterVerdict::Pass
    } else {
        AfterVerdict::Block
    }
}

/// A run's result as the store records it: `verdict` and `reason` with
/// what its report says of the process, its peak GPU memory and what that
/// peak says later runs ask for
/// ([`crate::scheduler::learned`]).
pub fn job_result(verdict: RecordedVerdict, reason: String, report: &JobReport) -> JobResult {
    JobResult {
        verdict,
        reason,
        exit_code: report.exit_code,
        signal: report.signal,
        duration_ms: report.duration_ms,
        junit_xml: report.junit_xml.clone().unwrap_or_default(),
        output_tail: report.output_tail.clone(),
        peak_gpu_mib: report.peak_gpu_mib,
        next_gpu_mib: report
            .peak_gpu_mib
            .map(|p| crate::scheduler::learned(p, report.gpu_memory_mib)),
    }
}

/// Passes a red run to the next diagnoser of its route, or back to its
/// component when none is left. A diagnoser that is gone is skipped: the run
/// is then recorded without its note, never left waiting. A component that
/// is gone (restarted, its port stopped) waits for nothing: the run stops.
pub fn hand_on(mut run: Box<RedRun>) {
    while let Some(next) = run.route.pop_front() {
        if matches!(
            run.component.get_status(),
            ActorStatus::Stopping | ActorStatus::Stopped
        ) {
            return;
        }
        match next.send_message(run) {
            Ok(()) => return,
            Err(MessagingErr::SendErr(back)) => run = back,
            Err(_) => return,
        }
    }
    let component = run.component.clone();
    let _ = component.send_message(Diagnosis::Done(run));
}

#[cfg(test)]
mod tests {
    use super::*;
    use fvd_contracts::verdict::Verdict;

    #[test]
    fn what_follows_a_verdict() {
        let pass = Verdict::NonSkipPass {
            passed: 1,
            xpass_checked: true,
        };
        let infra = Verdict::InfraError {
            cause: "cuda".into(),
        };
        let red = Verdict::DebugRed {
            failures: Vec::new(),
            failed: 1,
            passed: 0,
        };
        assert_eq!(after_verdict(&pass, 0, true), AfterVerdict::Pass);
        assert_eq!(after_verdict(&infra, 0, true), AfterVerdict::Retry);
        assert_eq!(
            after_verdict(&infra, MAX_INFRA_VERDICTS, true),
            AfterVerdict::Block
        );
        assert_eq!(after_verdict(&red, 0, true), AfterVerdict::Agent);
        assert_eq!(after_verdict(&red, 0, false), AfterVerdict::Block);
        assert_eq!(
            after_verdict(&Verdict::Timeout, 0, false),
            AfterVerdict::Block
        );
    }

    #[tokio::test]
    async fn a_blocked_reason_gets_the_variant_note_then_the_cut_trace_summary() {
        let (me, _) = ractor::Actor::spawn(None, Idle, ()).await.unwrap();
        let mut run = RedRun {
            spec: fvd_spec::parse(
                std::path::Path::new("p.toml"),
                "[prep]\nmodel_family = \"fam\"\n\n[[component]]\nname = \"a\"\ntype = \"generic\"\nparity_test = \"t.py\"\ncoverage_scope = \"both\"\n",
            )
            .unwrap()
            .components
            .remove(0),
            report: JobReport::default(),
            worker_id: String::new(),
            verdict: Verdict::Timeout,
            component: me.get_derived(),
            span: Span::none(),
            route: VecDeque::new(),
            trace_summary: String::new(),
            variant_note: String::new(),
        };
        assert_eq!(run.note(), "");
        run.trace_summary = "x".into();
        assert_eq!(run.note(), "x; ");
        run.variant_note = "passes with A=1 (variant a)".into();
        assert_eq!(run.note(), "passes with A=1 (variant a); x; ");
        run.variant_note.clear();
        run.trace_summary = "y".repeat(400);
        assert_eq!(run.note().chars().count(), TRACE_NOTE_CHARS + 3);
        me.stop(None);
    }

    /// A component that reads nothing.
    struct Idle;

    impl ractor::Actor for Idle {
        type Msg = Diagnosis;
        type State = ();
        type Arguments = ();

        async fn pre_start(
            &self,
            _me: ractor::ActorRef<Diagnosis>,
            _: (),
        ) -> Result<(), ractor::ActorProcessingErr> {
            Ok(())
        }
    }
}
