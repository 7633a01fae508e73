//! A run that ran out of GPU memory while it shared its GPU with another
//! run (issue #44): its error may be the other run's doing, so it is no
//! verdict of the code. It is recorded as `shared_oom` (never counted),
//! the component's next run takes a GPU alone, and its later runs ask for
//! more memory. The alone run's result is the verdict, and its reason says
//! it ran alone after an out-of-memory error under sharing, so a pass is
//! never made by retrying quietly. An out-of-memory error of a run that
//! had its GPU alone stays what it was (an infrastructure error); a
//! numeric failure of a shared run stays a failure.

use fvd_contracts::verdict::Verdict;
use fvd_spec::Placement;

use crate::scheduler::SharedGpu;

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

/// How the component's runs ask for their GPU after out-of-memory errors
/// under sharing.
#[derive(Debug, Default)]
pub struct GpuAsk {
    /// The raised memory estimate; `None`: the spec's.
    mib: Option<u64>,
    /// The error its runs after are queued alone for, until one of them
    /// is recorded.
    alone: Option<OomUnderSharing>,
    /// The run queued alone last.
    alone_job: Option<String>,
}

impl GpuAsk {
    /// The component's runs ran out of memory under sharing: the next is
    /// queued alone, and the later ones ask for more.
    pub fn ran_out(&mut self, oom: OomUnderSharing) {
        self.mib = Some(oom.next_mib);
        self.alone = Some(oom);
    }

    /// What the runs asked for so far, of `spec`'s.
    pub fn estimate(&self, spec: &Placement) -> u64 {
        self.mib.unwrap_or(spec.gpu_memory_mib)
    }

    /// The placement of run `job_id`: the spec's, with the raised
    /// estimate, and alone while an error under sharing waits for its
    /// alone run's verdict.
    pub fn placement(&mut self, spec: &Placement, job_id: &str) -> Placement {
        let mut p = Placement {
            gpu_memory_mib: self.estimate(spec),
            ..spec.clone()
        };
        if self.alone.is_some() {
            p.gpu_share = false;
            self.alone_job = Some(job_id.to_string());
        }
        p
    }

    /// What the record of run `job_id`'s verdict says of it: that it ran
    /// alone after an out-of-memory error under sharing, when it is that
    /// run (it is then no longer pending).
    pub fn note(&mut self, job_id: &str) -> Option<String> {
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
    fn the_runs_after_an_oom_go_alone_until_one_is_recorded_then_ask_for_more() {
        let spec = Placement {
            gpu_memory_mib: 2000,
            gpu_share: true,
            ..Placement::default()
        };
        let mut ask = GpuAsk::default();
        assert_eq!(ask.placement(&spec, "j1"), spec);
        assert_eq!(ask.note("j1"), None);
        let oom = under_sharing(&red(), shared(), Some(OOM.into()), 1, 2000).unwrap();
        ask.ran_out(oom);
        let alone = ask.placement(&spec, "j2");
        assert!(!alone.gpu_share);
        assert_eq!(alone.gpu_memory_mib, 4000);
        // The alone run was lost and queued again: still alone.
        assert!(!ask.placement(&spec, "j3").gpu_share);
        assert_eq!(ask.note("j2"), None, "not the run queued alone last");
        let note = ask.note("j3").unwrap();
        assert_eq!(
            note,
            format!("ran alone after cuda out of memory while sharing gpu 0 in run 1 ({OOM})")
        );
        assert_eq!(ask.note("j3"), None, "said once");
        let later = ask.placement(&spec, "j4");
        assert!(later.gpu_share, "later runs share again");
        assert_eq!(later.gpu_memory_mib, 4000);
        assert_eq!(ask.estimate(&spec), 4000);
    }
}
