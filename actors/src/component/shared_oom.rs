//! The GPU memory a component's runs ask for (issue #44), and what becomes
//! of a run that ran out of it while it shared its GPU.
//!
//! What a run asks for is read from the store when it is queued
//! ([`fvd_store::model::GpuHistory`]), so a restarted orchestrator asks
//! for the same: each recorded run says what the component's later runs
//! ask for (`jobs.next_gpu_mib`), bounded by the GPU it ran on:
//!
//! - a finished run with a measured peak: the peak with headroom
//!   ([`crate::scheduler::learned`]: × 1.25, rounded up to 64 MiB); the
//!   component asks for the most of its last few such runs. Only when the
//!   spec gives no `gpu_memory_mib`: the spec's value always wins, and with
//!   neither the run takes a whole GPU, as before anything was measured.
//! - a run that ran out of memory while it shared its GPU (`shared_oom`):
//!   what it asked for, doubled ([`raised`]); the component asks for at
//!   least the most any such run said, above the spec's value too, and
//!   never less later (a raise is no guess: the run needed more).
//!
//! That run's error may be the other run's doing, so it is no verdict of
//! the code. It is recorded as `shared_oom` (never counted), and the
//! component's next run takes a GPU alone: this process knows it, and a
//! restarted one reads it from the store (the component's latest recorded
//! run is that `shared_oom` one, [`GpuHistory::after_shared_oom`]). The
//! alone run's result is the verdict, and its reason says it ran alone
//! after an out-of-memory error under sharing, so a pass is never made by
//! retrying quietly. An out-of-memory error of a run that
//! had its GPU alone stays what it was (an infrastructure error); a numeric
//! failure of a shared run stays a failure. `gpu_share = false` keeps a
//! run alone whatever it asks for.

use fvd_contracts::verdict::Verdict;
use fvd_spec::Placement;
use fvd_store::model::GpuHistory;

use crate::scheduler::{SharedGpu, ask_mib};

/// An out-of-memory error of a run that shared its GPU: why the run is not
/// the component's verdict, as its record and logs say.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cuda out of memory while sharing gpu {gpu} with another run ({raised}): not a verdict; run {run_no} runs again alone, and later runs ask for {next_mib} mib"
)]
pub struct OomUnderSharing {
    /// The GPU it shared.
    pub gpu: u32,
    /// The run number of the run that ran out of memory.
    pub run_no: u32,
    /// The error line it raised.
    pub raised: String,
    /// What the component's later runs ask for.
    pub next_mib: u64,
}

/// The out-of-memory error under sharing a finished run shows: `shared`
/// is the GPU it shared (none: it had its GPU alone, and its error stays
/// what it is), `oom` the error line it raised, `estimate` what its runs
/// asked for so far. A pass, a skip, a timeout, a tampered judge or an
/// environment failure is what it is, whatever it printed.
pub fn under_sharing(
    v: &Verdict,
    shared: Option<SharedGpu>,
    oom: Option<String>,
    run_no: u32,
    estimate: u64,
) -> Option<OomUnderSharing> {
    let shared = shared?;
    let failed = matches!(
        v,
        Verdict::DebugRed { .. } | Verdict::Error { .. } | Verdict::InfraError { .. }
    );
    if !failed {
        return None;
    }
    Some(OomUnderSharing {
        gpu: shared.gpu,
        run_no,
        raised: oom?,
        next_mib: raised(estimate.max(shared.share_mib), shared.memory_mib),
    })
}

/// An estimate of `mib` doubled, at most the GPU's `memory_mib` (unknown:
/// 0, no bound) and never below what it was.
pub fn raised(mib: u64, memory_mib: u64) -> u64 {
    let doubled = mib.saturating_mul(2);
    let bounded = if memory_mib > 0 {
        doubled.min(memory_mib)
    } else {
        doubled
    };
    bounded.max(mib)
}

/// How the component's runs ask for their GPU: by what its recorded runs
/// say ([`crate::scheduler::ask_mib`]), and alone after an out-of-memory
/// error under sharing.
#[derive(Debug, Default)]
pub struct GpuAsk {
    /// What the latest queued run asked for; `None`: none was queued by
    /// this process.
    mib: Option<u64>,
    /// The error its runs after are queued alone for, until one of them
    /// is recorded.
    alone: Option<OomUnderSharing>,
    /// The run queued alone last.
    alone_job: Option<String>,
    /// The run queued alone because the store said the latest recorded
    /// run was a `shared_oom` one this process did not see (it restarted
    /// since), and that run's number.
    alone_after_restart: Option<(String, u32)>,
}

impl GpuAsk {
    /// The component's runs ran out of memory under sharing: the next is
    /// queued alone (the later ones ask for more: its record says so).
    pub fn ran_out(&mut self, oom: OomUnderSharing) {
        self.alone = Some(oom);
    }

    /// What the latest run asked for, else the `spec`'s.
    pub fn estimate(&self, spec: &Placement) -> u64 {
        self.mib.unwrap_or(spec.gpu_memory_mib)
    }

    /// The placement of run `job_id`, queued with `history`: the spec's,
    /// asking for [`crate::scheduler::ask_mib`], and alone while an error
    /// under sharing waits for its alone run's verdict.
    pub fn placement(&mut self, spec: &Placement, history: &GpuHistory, job_id: &str) -> Placement {
        let mib = ask_mib(spec, history);
        self.mib = Some(mib);
        let mut p = Placement {
            gpu_memory_mib: mib,
            ..spec.clone()
        };
        if self.alone.is_some() {
            p.gpu_share = false;
            self.alone_job = Some(job_id.to_string());
        } else if let Some(run_no) = history.after_shared_oom {
            p.gpu_share = false;
            self.alone_after_restart = Some((job_id.to_string(), run_no));
        }
        p
    }

    /// What the record of run `job_id`'s verdict says of it: that it ran
    /// alone after an out-of-memory error under sharing, when it is that
    /// run (it is then no longer pending).
    pub fn note(&mut self, job_id: &str) -> Option<String> {
        if let Some((_, run_no)) = self.alone_after_restart.take_if(|(j, _)| j == job_id) {
            return Some(format!(
                "ran alone after cuda out of memory while sharing its gpu in run {run_no} (recorded before the orchestrator restarted)"
            ));
        }
        if self.alone_job.as_deref() != Some(job_id) {
            return None;
        }
        self.alone_job = None;
        let oom = self.alone.take()?;
        Some(format!(
            "ran alone after cuda out of memory while sharing gpu {} in run {} ({})",
            oom.gpu, oom.run_no, oom.raised
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::learned;
    use fvd_contracts::verdict::{ErrorKind, FailureInfo};

    const OOM: &str = "torch.OutOfMemoryError: CUDA out of memory.";

    fn shared() -> Option<SharedGpu> {
        Some(SharedGpu {
            gpu: 0,
            memory_mib: 10_000,
            share_mib: 2000,
        })
    }

    fn red() -> Verdict {
        Verdict::DebugRed {
            failures: vec![FailureInfo {
                case: "t::x".into(),
                message: OOM.into(),
            }],
            failed: 1,
            passed: 0,
        }
    }

    #[test]
    fn only_a_failed_run_that_shared_and_raised_an_oom_is_rerun_alone() {
        let infra = Verdict::InfraError {
            cause: format!("{OOM} in t::x"),
        };
        let oom = || Some(OOM.to_string());
        let got = under_sharing(&infra, shared(), oom(), 3, 2000).unwrap();
        assert_eq!((got.gpu, got.run_no, got.next_mib), (0, 3, 4000));
        assert_eq!(
            got.to_string(),
            "cuda out of memory while sharing gpu 0 with another run (torch.OutOfMemoryError: CUDA out of memory.): not a verdict; run 3 runs again alone, and later runs ask for 4000 mib"
        );
        assert!(under_sharing(&red(), shared(), oom(), 1, 2000).is_some());
        let collection = Verdict::Error {
            kind: ErrorKind::Collection,
            detail: OOM.into(),
        };
        assert!(under_sharing(&collection, shared(), oom(), 1, 2000).is_some());
        // Alone: what it is today.
        assert_eq!(under_sharing(&infra, None, oom(), 1, 2000), None);
        // Shared, but the numbers failed: a failure.
        assert_eq!(under_sharing(&red(), shared(), None, 1, 2000), None);
        // A pass, a timeout or an environment failure is never rerun.
        for v in [
            Verdict::NonSkipPass {
                passed: 1,
                xpass_checked: true,
            },
            Verdict::Timeout,
            Verdict::Environment { cause: "x".into() },
        ] {
            assert_eq!(under_sharing(&v, shared(), oom(), 1, 2000), None, "{v:?}");
        }
    }

    #[test]
    fn the_estimate_doubles_up_to_the_gpu_and_never_falls() {
        assert_eq!(raised(2000, 10_000), 4000);
        assert_eq!(raised(6000, 10_000), 10_000);
        assert_eq!(raised(12_000, 10_000), 12_000);
        assert_eq!(raised(2000, 0), 4000);
        // A run leased more than the spec's estimate doubles from its lease.
        let got = under_sharing(&red(), shared(), Some(OOM.into()), 1, 1000).unwrap();
        assert_eq!(got.next_mib, 4000);
    }

    #[test]
    fn a_learned_ask_is_the_peak_with_headroom_rounded_up_and_bounded_by_its_gpu() {
        assert_eq!(learned(1000, 0), 1280, "1250 rounded up to 64");
        assert_eq!(learned(1024, 81_559), 1280);
        assert_eq!(learned(1, 0), 64);
        assert_eq!(learned(0, 0), 0);
        // A run that filled its GPU asks for that GPU, not for more.
        assert_eq!(learned(80_000, 81_559), 81_559);
        assert_eq!(learned(u64::MAX, 81_559), 81_559, "no overflow");
    }

    #[test]
    fn the_spec_wins_then_the_learned_ask_then_a_whole_gpu_and_a_raise_lifts_any() {
        let spec = |mib| Placement {
            gpu_memory_mib: mib,
            gpu_share: true,
            ..Placement::default()
        };
        let h = |learned_mib, raised_mib| GpuHistory {
            learned_mib,
            raised_mib,
            after_shared_oom: None,
        };
        assert_eq!(ask_mib(&spec(0), &h(None, None)), 0, "a whole gpu");
        assert_eq!(ask_mib(&spec(0), &h(Some(1280), None)), 1280);
        assert_eq!(ask_mib(&spec(2000), &h(Some(1280), None)), 2000);
        assert_eq!(ask_mib(&spec(2000), &h(Some(9000), None)), 2000);
        // A raise recorded by a shared_oom run lifts the spec's and the
        // learned ask, and never lowers either.
        assert_eq!(ask_mib(&spec(2000), &h(None, Some(4000))), 4000);
        assert_eq!(ask_mib(&spec(0), &h(Some(1280), Some(2560))), 2560);
        assert_eq!(ask_mib(&spec(0), &h(Some(9000), Some(2560))), 9000);
        assert_eq!(ask_mib(&spec(8000), &h(None, Some(4000))), 8000);
    }

    #[test]
    fn the_runs_after_an_oom_go_alone_until_one_is_recorded_and_ask_what_the_store_says() {
        let spec = Placement {
            gpu_memory_mib: 2000,
            gpu_share: true,
            ..Placement::default()
        };
        let none = GpuHistory::default();
        let mut ask = GpuAsk::default();
        assert_eq!(ask.estimate(&spec), 2000, "nothing queued yet: the spec's");
        assert_eq!(ask.placement(&spec, &none, "j1"), spec);
        assert_eq!(ask.note("j1"), None);
        let oom = under_sharing(&red(), shared(), Some(OOM.into()), 1, 2000).unwrap();
        ask.ran_out(oom);
        // The shared_oom run's record says 4000: the store reads it back.
        let raised = GpuHistory {
            raised_mib: Some(4000),
            ..none
        };
        let alone = ask.placement(&spec, &raised, "j2");
        assert!(!alone.gpu_share);
        assert_eq!(alone.gpu_memory_mib, 4000);
        assert_eq!(ask.estimate(&spec), 4000);
        // The alone run was lost and queued again: still alone.
        assert!(!ask.placement(&spec, &raised, "j3").gpu_share);
        assert_eq!(ask.note("j2"), None, "not the run queued alone last");
        let note = ask.note("j3").unwrap();
        assert_eq!(
            note,
            format!("ran alone after cuda out of memory while sharing gpu 0 in run 1 ({OOM})")
        );
        assert_eq!(ask.note("j3"), None, "said once");
        let later = ask.placement(&spec, &raised, "j4");
        assert!(later.gpu_share, "later runs share again");
        assert_eq!(later.gpu_memory_mib, 4000);
        // A restarted orchestrator (a new GpuAsk) asks for the same.
        let restarted = GpuAsk::default().placement(&spec, &raised, "j5");
        assert_eq!(restarted, later);
    }

    #[test]
    fn a_restarted_orchestrator_runs_the_run_after_a_shared_oom_alone_and_says_why() {
        let spec = Placement {
            gpu_memory_mib: 2000,
            gpu_share: true,
            ..Placement::default()
        };
        // The store: the latest recorded run, run 3, was a shared_oom one.
        let after = GpuHistory {
            raised_mib: Some(4000),
            after_shared_oom: Some(3),
            ..GpuHistory::default()
        };
        let mut ask = GpuAsk::default();
        let alone = ask.placement(&spec, &after, "j4");
        assert!(!alone.gpu_share);
        assert_eq!(alone.gpu_memory_mib, 4000);
        assert_eq!(ask.note("j9"), None, "another run");
        assert_eq!(
            ask.note("j4").as_deref(),
            Some(
                "ran alone after cuda out of memory while sharing its gpu in run 3 (recorded before the orchestrator restarted)"
            )
        );
        assert_eq!(ask.note("j4"), None, "said once");
        // Once a run after it is recorded, the store says no more.
        let later = GpuHistory {
            after_shared_oom: None,
            ..after
        };
        assert!(ask.placement(&spec, &later, "j5").gpu_share);
    }
}
