//! GPUs shared by runs. A single-GPU run with a known memory need
//! (`gpu_memory_mib` > 0) that may share (`gpu_share`, the default) is
//! counted on its GPU by that memory: runs share a GPU while their memory
//! stays within the GPU's memory less a headroom and their number within a
//! cap. Every other GPU run (no known need, `gpu_share = false`, a gang)
//! holds its GPUs alone, and a GPU holding such a run takes nothing else.
//!
//! A worker's GPUs with nothing on them are its free GPUs (what whole-GPU
//! runs take); [`GpuUses`] keeps the others, with the runs and memory on
//! each, so the same GPU index may be in several leases at once.

use std::collections::BTreeMap;

use fvd_spec::Placement;
use fvd_store::messages::WorkerInfo;

/// Most runs on one shared GPU by default (`fvd orchestrator serve
/// --gpu-share-cap`).
pub const DEFAULT_GPU_SHARE_CAP: u32 = 4;

/// Part of a shared GPU's memory (percent) that no run's memory is counted
/// against by default: what the runs' own estimates leave out (CUDA
/// contexts, allocator caches).
pub const DEFAULT_GPU_HEADROOM_PCT: u32 = 10;

/// The headroom a learned ask adds to a measured peak: × 5 / 4.
pub const LEARNED_HEADROOM: (u64, u64) = (5, 4);

/// A learned ask is rounded up to a multiple of this.
pub const LEARNED_ROUND_MIB: u64 = 64;

/// What a run that peaked at `peak_mib` says its component's later runs
/// ask for (issue #44): the peak with [`LEARNED_HEADROOM`], rounded up to
/// [`LEARNED_ROUND_MIB`], at most the `memory_mib` of the GPU it ran on
/// (0: unknown, no bound), so a run that filled its GPU asks for that GPU,
/// not for one no worker has.
pub fn learned(peak_mib: u64, memory_mib: u64) -> u64 {
    let (num, den) = LEARNED_HEADROOM;
    let with_headroom = peak_mib.saturating_mul(num).div_ceil(den);
    let rounded = with_headroom
        .div_ceil(LEARNED_ROUND_MIB)
        .saturating_mul(LEARNED_ROUND_MIB);
    if memory_mib > 0 {
        rounded.min(memory_mib)
    } else {
        rounded
    }
}

/// The memory a run asks for, of the `spec`'s and what the component's
/// recorded runs say: the spec's value when it gives one, else the learned
/// ask, else 0 (a whole GPU); at least the raise after an out-of-memory
/// error under sharing.
pub fn ask_mib(spec: &Placement, history: &fvd_store::model::GpuHistory) -> u64 {
    let base = if spec.gpu_memory_mib > 0 {
        spec.gpu_memory_mib
    } else {
        history.learned_mib.unwrap_or(0)
    };
    history.raised_mib.map_or(base, |r| r.max(base))
}

/// How GPUs are shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sharing {
    /// Most runs on one GPU; 1 shares nothing.
    pub cap: u32,
    /// Percent of each GPU's memory kept free of leased memory.
    pub headroom_pct: u32,
}

impl Default for Sharing {
    fn default() -> Self {
        Self {
            cap: DEFAULT_GPU_SHARE_CAP,
            headroom_pct: DEFAULT_GPU_HEADROOM_PCT,
        }
    }
}

impl Sharing {
    /// MiB of a GPU of `memory_mib` that the runs sharing it may lease
    /// together.
    pub fn budget(self, memory_mib: u64) -> u64 {
        memory_mib - memory_mib * u64::from(self.headroom_pct.min(100)) / 100
    }

    /// Whether a run of `mib` may share a GPU of `memory_mib` at all (else
    /// it takes the GPU alone).
    pub fn shares(self, mib: u64, memory_mib: u64) -> bool {
        self.cap > 1 && mib <= self.budget(memory_mib)
    }
}

/// The MiB a job needing `need` GPUs with placement `p` asks for on a
/// shared GPU; `None` for a job that takes whole GPUs.
pub fn share_of(need: u32, p: &Placement) -> Option<u64> {
    (need == 1 && p.gpu_share && p.gpu_memory_mib > 0).then_some(p.gpu_memory_mib)
}

/// The GPU a finished run shared with another run: some other lease was on
/// it at some time while this run held its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedGpu {
    /// Its index on the worker.
    pub gpu: u32,
    /// The GPU's memory.
    pub memory_mib: u64,
    /// The MiB the run was leased of it.
    pub share_mib: u64,
}

/// The runs on one GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuUse {
    /// Runs leased on it.
    pub runs: u32,
    /// Memory the sharing ones asked for.
    pub mib: u64,
    /// A run holds it alone: it takes no other.
    pub alone: bool,
}

/// The GPUs of one worker that hold at least one run, by index.
#[derive(Debug, Default)]
pub(super) struct GpuUses(BTreeMap<u32, GpuUse>);

fn memory_of(info: &WorkerInfo, gpu: u32) -> u64 {
    info.gpus
        .iter()
        .find(|g| g.index == gpu)
        .map_or(0, |g| g.memory_mib)
}

impl GpuUses {
    /// A run takes `gpu`: sharing `share_mib` of it, or alone for 0.
    pub(super) fn take(&mut self, gpu: u32, share_mib: u64) {
        let u = self.0.entry(gpu).or_default();
        u.runs += 1;
        u.mib += share_mib;
        u.alone |= share_mib == 0;
    }

    /// A run taken with [`GpuUses::take`] ends; true when `gpu` holds
    /// nothing any more (it is free again).
    pub(super) fn give_back(&mut self, gpu: u32, share_mib: u64) -> bool {
        let Some(u) = self.0.get_mut(&gpu) else {
            return true;
        };
        u.runs = u.runs.saturating_sub(1);
        u.mib = u.mib.saturating_sub(share_mib);
        if u.runs == 0 {
            self.0.remove(&gpu);
            return true;
        }
        false
    }

    /// MiB left for one more sharing run on each shared GPU with room.
    fn rooms<'a>(
        &'a self,
        info: &'a WorkerInfo,
        s: Sharing,
    ) -> impl Iterator<Item = (u32, u64)> + 'a {
        self.0
            .iter()
            .filter(move |(_, u)| !u.alone && u.runs < s.cap)
            .map(move |(g, u)| (*g, s.budget(memory_of(info, *g)).saturating_sub(u.mib)))
            .filter(|(_, room)| *room > 0)
    }

    /// The most MiB one more sharing run could get on a GPU already shared
    /// (0: none has room): where the worker sits among those that can
    /// take a sharing run without a free GPU.
    pub(super) fn room(&self, info: &WorkerInfo, s: Sharing) -> u64 {
        self.rooms(info, s).map(|(_, r)| r).max().unwrap_or(0)
    }

    /// The shared GPU with the least room that still holds `mib` more
    /// (packing), if any.
    pub(super) fn best_fit(&self, info: &WorkerInfo, s: Sharing, mib: u64) -> Option<u32> {
        self.rooms(info, s)
            .filter(|(_, r)| *r >= mib)
            .min_by_key(|(g, r)| (*r, *g))
            .map(|(g, _)| g)
    }

    /// What is on `gpu` (nothing: the default).
    pub(super) fn on(&self, gpu: u32) -> GpuUse {
        self.0.get(&gpu).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fvd_store::messages::GpuInfo;

    fn info(mibs: &[u64]) -> WorkerInfo {
        WorkerInfo {
            gpus: mibs
                .iter()
                .enumerate()
                .map(|(i, m)| GpuInfo {
                    index: i as u32,
                    uuid: String::new(),
                    name: String::new(),
                    memory_mib: *m,
                })
                .collect(),
            worker_id: "w".into(),
            host: String::new(),
            cpu_slots: 0,
            labels: Default::default(),
            provides: Vec::new(),
        }
    }

    #[test]
    fn the_budget_keeps_the_headroom_and_a_cap_of_one_shares_nothing() {
        let s = Sharing::default();
        assert_eq!(s.budget(10_000), 9_000);
        assert!(s.shares(9_000, 10_000));
        assert!(!s.shares(9_001, 10_000), "past the headroom: alone");
        let one = Sharing { cap: 1, ..s };
        assert!(!one.shares(1, 10_000));
    }

    #[test]
    fn only_single_gpu_runs_with_a_known_need_that_may_share_share() {
        let p = Placement {
            gpu_memory_mib: 1000,
            gpu_share: true,
            ..Placement::default()
        };
        assert_eq!(share_of(1, &p), Some(1000));
        assert_eq!(share_of(2, &p), None, "a gang takes whole GPUs");
        assert_eq!(share_of(0, &p), None);
        let alone = Placement {
            gpu_share: false,
            ..p.clone()
        };
        assert_eq!(share_of(1, &alone), None);
        let unknown = Placement {
            gpu_memory_mib: 0,
            ..p
        };
        assert_eq!(share_of(1, &unknown), None);
    }

    #[test]
    fn a_shared_gpu_counts_its_runs_and_memory_and_a_lone_run_takes_it_whole() {
        let w = info(&[10_000, 10_000]);
        let s = Sharing::default();
        let mut u = GpuUses::default();
        u.take(0, 4000);
        assert_eq!(u.room(&w, s), 5000);
        u.take(0, 4000);
        assert_eq!(u.room(&w, s), 1000);
        assert_eq!(u.best_fit(&w, s, 1000), Some(0));
        assert_eq!(u.best_fit(&w, s, 1001), None);
        u.take(1, 0);
        assert_eq!(u.best_fit(&w, s, 1), Some(0), "a lone run's GPU takes none");
        assert!(!u.give_back(0, 4000));
        assert!(u.give_back(0, 4000), "the last run frees it");
        assert_eq!(u.on(0), GpuUse::default());
        // Two runs adopted after a restart, counted alone, on one index.
        u.take(0, 0);
        u.take(0, 0);
        assert!(!u.give_back(0, 0));
        assert!(u.give_back(0, 0));
    }
}
