//! The scheduler's index of free capacity, so that placing a job costs the
//! same on a fleet of ten workers and of ten thousand.
//!
//! Workers with the same static shape (labels, provided paths, GPU
//! memories) form a class. Every worker with room is in two pools, the
//! whole fleet's and its class's; a pool keeps its workers in buckets keyed
//! by (free GPUs, has a free CPU slot), each bucket ordered by room (free
//! GPUs + free CPU slots) then id. A job with no constraint asks the fleet's
//! pool, a constrained one the pools of the classes that match it: per
//! pool at most one look per bucket (the number of buckets is bounded by
//! the GPUs of one worker, not by the fleet), skipping only the workers the
//! job excludes. The one case that looks further is a class whose GPUs
//! differ in memory and a job asking for more than the smallest: its
//! workers are tried one by one (bounded by the class, not the fleet).
//!
//! A worker with a shared GPU that has room for one more sharing run is
//! also in its class's share pool, by the most memory such a GPU has left:
//! a sharing run first takes the tightest fit there (packing), one look
//! per class plus the workers it excludes, and only then a free GPU.
//!
//! Static questions (can any registered worker ever hold this job, which
//! paths does no worker provide) are answered from the classes and a few
//! counters, never from the workers one by one.

use std::cmp::Reverse;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use fvd_spec::Placement;
use fvd_store::messages::WorkerInfo;

use super::gpus::{Sharing, share_of};

/// Index of a class in [`Capacity::classes`].
pub(super) type ClassId = usize;

/// Where a worker with room sits in its pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Free {
    gpus: u32,
    cpu: bool,
    room: u32,
}

impl Free {
    /// The key of a worker with these free slots, `None` with no room at
    /// all (or draining): such a worker is in no pool.
    pub(super) fn of(free_gpus: usize, free_cpu: u32, draining: bool) -> Option<Free> {
        if draining || (free_gpus == 0 && free_cpu == 0) {
            return None;
        }
        Some(Free {
            gpus: free_gpus as u32,
            cpu: free_cpu > 0,
            room: free_gpus as u32 + free_cpu,
        })
    }
}

/// Workers of one bucket, by room then id (the smallest id last among
/// equals, so the best is the last). The id is shared with the worker's
/// slot: filing a worker allocates nothing.
type Bucket = BTreeSet<(u32, Reverse<Arc<str>>)>;

/// Workers with room, by (free GPUs, free CPU slot).
#[derive(Debug, Default)]
struct Pool {
    buckets: BTreeMap<(u32, bool), Bucket>,
}

impl Pool {
    fn insert(&mut self, f: Free, id: &Arc<str>) {
        self.buckets
            .entry((f.gpus, f.cpu))
            .or_default()
            .insert((f.room, Reverse(id.clone())));
    }

    fn remove(&mut self, f: Free, id: &Arc<str>) {
        if let Some(b) = self.buckets.get_mut(&(f.gpus, f.cpu)) {
            b.remove(&(f.room, Reverse(id.clone())));
            if b.is_empty() {
                self.buckets.remove(&(f.gpus, f.cpu));
            }
        }
    }

    /// The worker with the most room among those with room for `need`
    /// GPUs (a CPU slot for 0) that `accept` takes; ties go to the
    /// smallest id. One look per bucket, plus the workers `accept` refuses.
    fn best<'a>(&'a self, need: u32, accept: &dyn Fn(&str) -> bool) -> Option<(u32, &'a str)> {
        let mut best: Option<(u32, &'a str)> = None;
        for (&(_, cpu), set) in self.buckets.range((need, false)..) {
            if need == 0 && !cpu {
                continue;
            }
            let Some((room, Reverse(id))) = set.iter().rev().find(|(_, Reverse(id))| accept(id))
            else {
                continue;
            };
            if best.is_none_or(|(r, b)| (*room, Reverse(&**id)) > (r, Reverse(b))) {
                best = Some((*room, &**id));
            }
        }
        best
    }
}

/// Workers of one static shape.
#[derive(Debug)]
struct Class {
    /// One member's registration (labels, provides and GPUs are the
    /// class's), for the questions about what the fleet could ever hold.
    info: WorkerInfo,
    /// GPU memories, smallest first.
    memories: Vec<u64>,
    /// Registered members, draining ones included.
    members: usize,
    pool: Pool,
    /// Members with a shared GPU that takes one more sharing run, by the
    /// most MiB such a GPU has left, then id.
    share: BTreeSet<(u64, Arc<str>)>,
}

impl Class {
    /// GPUs of a member with at least `mib` each.
    fn usable(&self, mib: u64) -> usize {
        self.memories.len() - self.memories.partition_point(|m| *m < mib)
    }

    /// Whether a member could ever hold a job needing `need` GPUs of
    /// `mib`: the class matches its labels and paths (checked by the
    /// caller) and has the GPUs.
    fn could_hold(&self, need: u32, mib: u64) -> bool {
        self.members > 0 && (need == 0 || self.usable(mib) >= need as usize)
    }
}

type ClassKey = (BTreeMap<String, String>, Vec<String>, Vec<u64>);

/// A placement's labels and paths, and the classes that match them.
type Matching = (BTreeMap<String, String>, Vec<String>, Vec<ClassId>);

/// The free-capacity index and the fleet's static shape.
#[derive(Debug, Default)]
pub(super) struct Capacity {
    all: Pool,
    classes: Vec<Class>,
    class_of: HashMap<ClassKey, ClassId>,
    /// Classes matching a placement's labels and paths, by a hash of
    /// them (with the key, so a collision is told apart); cleared when a
    /// class is added.
    matching: HashMap<u64, Vec<Matching>>,
    /// Registered workers per provided path.
    provided: HashMap<String, usize>,
    /// Registered workers per GPU count.
    gpu_counts: BTreeMap<usize, usize>,
    /// Registered workers.
    registered: usize,
    /// How GPUs are shared.
    pub(super) sharing: Sharing,
    /// Workers in a share pool.
    sharers: usize,
    /// The smallest id, to start a share pool's range at a room.
    no_id: Arc<str>,
}

/// Whether `w` carries every label the job asks for and provides every
/// path it needs (`worker_paths`, `fvd worker --provide`).
pub(super) fn labels_match(w: &WorkerInfo, p: &Placement) -> bool {
    p.labels.iter().all(|(k, v)| w.labels.get(k) == Some(v))
        && p.worker_paths.iter().all(|x| w.provides.contains(x))
}

impl Capacity {
    /// An empty index whose GPUs are shared as `sharing` says.
    pub(super) fn new(sharing: Sharing) -> Self {
        Self {
            sharing,
            ..Self::default()
        }
    }

    /// A worker registered (without room yet: see [`Capacity::set`]).
    pub(super) fn add(&mut self, info: &WorkerInfo) -> ClassId {
        let mut provides = info.provides.clone();
        provides.sort();
        provides.dedup();
        let mut memories: Vec<u64> = info.gpus.iter().map(|g| g.memory_mib).collect();
        memories.sort_unstable();
        let key = (info.labels.clone(), provides, memories.clone());
        let id = match self.class_of.get(&key) {
            Some(id) => *id,
            None => {
                let id = self.classes.len();
                self.classes.push(Class {
                    info: info.clone(),
                    memories,
                    members: 0,
                    pool: Pool::default(),
                    share: BTreeSet::new(),
                });
                self.class_of.insert(key, id);
                self.matching.clear();
                id
            }
        };
        self.classes[id].members += 1;
        for p in &self.classes[id].info.provides {
            *self.provided.entry(p.clone()).or_default() += 1;
        }
        *self.gpu_counts.entry(info.gpus.len()).or_default() += 1;
        self.registered += 1;
        id
    }

    /// A worker left (its room, if any, already taken out with
    /// [`Capacity::set`]).
    pub(super) fn remove(&mut self, class: ClassId) {
        let c = &mut self.classes[class];
        c.members -= 1;
        for p in &c.info.provides {
            if let Some(n) = self.provided.get_mut(p) {
                *n -= 1;
                if *n == 0 {
                    self.provided.remove(p);
                }
            }
        }
        super::placement::count_down(&mut self.gpu_counts, &c.info.gpus.len());
        self.registered -= 1;
    }

    /// Moves a worker of `class` from `old` to `new` free slots.
    pub(super) fn set(
        &mut self,
        id: &Arc<str>,
        class: ClassId,
        old: Option<Free>,
        new: Option<Free>,
    ) {
        if old == new {
            return;
        }
        let pool = &mut self.classes[class].pool;
        if let Some(f) = old {
            self.all.remove(f, id);
            pool.remove(f, id);
        }
        if let Some(f) = new {
            self.all.insert(f, id);
            pool.insert(f, id);
        }
    }

    /// Moves a worker of `class` from `old` to `new` MiB of room on a
    /// shared GPU (0: in no share pool).
    pub(super) fn set_share(&mut self, id: &Arc<str>, class: ClassId, old: u64, new: u64) {
        if old == new {
            return;
        }
        let share = &mut self.classes[class].share;
        if old > 0 {
            share.remove(&(old, id.clone()));
            self.sharers -= 1;
        }
        if new > 0 {
            share.insert((new, id.clone()));
            self.sharers += 1;
        }
    }

    /// No worker has a free slot nor room on a shared GPU.
    pub(super) fn is_full(&self) -> bool {
        self.all.buckets.is_empty() && self.sharers == 0
    }

    /// The worker whose shared GPU holds `mib` more with the least room
    /// to spare among classes `ids` (ties to the smallest id), that
    /// `accept` takes.
    fn tightest(&self, ids: &[ClassId], mib: u64, accept: &dyn Fn(&str) -> bool) -> Option<String> {
        let mut best: Option<(u64, &str)> = None;
        for cid in ids {
            let from = (mib, self.no_id.clone());
            let found = self.classes[*cid]
                .share
                .range(from..)
                .find(|(_, id)| accept(id));
            if let Some((room, id)) = found
                && best.is_none_or(|(r, b)| (*room, &**id) < (r, b))
            {
                best = Some((*room, &**id));
            }
        }
        best.map(|(_, id)| id.to_string())
    }

    /// Classes whose labels and paths `p` matches (cached per placement).
    fn matching(&mut self, p: &Placement) -> &[ClassId] {
        let mut h = DefaultHasher::new();
        p.labels.hash(&mut h);
        p.worker_paths.hash(&mut h);
        let list = self.matching.entry(h.finish()).or_default();
        let at = match list
            .iter()
            .position(|(l, w, _)| *l == p.labels && *w == p.worker_paths)
        {
            Some(at) => at,
            None => {
                let ids = self
                    .classes
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| labels_match(&c.info, p))
                    .map(|(i, _)| i)
                    .collect();
                list.push((p.labels.clone(), p.worker_paths.clone(), ids));
                list.len() - 1
            }
        };
        &list[at].2
    }

    /// The worker to lease a job needing `need` GPUs with placement `p`
    /// to, or `None` when none has room. `excluded` tells the workers the
    /// job must not go to; `usable_free` counts a worker's free GPUs with
    /// at least `p.gpu_memory_mib` (asked only of a class whose GPUs differ
    /// in memory).
    pub(super) fn pick(
        &mut self,
        need: u32,
        p: &Placement,
        excluded: &dyn Fn(&str) -> bool,
        usable_free: &dyn Fn(&str) -> usize,
    ) -> Option<String> {
        let accept = |id: &str| !excluded(id);
        if !p.is_constrained() {
            return self.all.best(need, &accept).map(|(_, id)| id.to_string());
        }
        let mib = p.gpu_memory_mib;
        let ids = self.matching(p).to_vec();
        if let Some(share) = share_of(need, p)
            && self.sharers > 0
            && let Some(id) = self.tightest(&ids, share, &accept)
        {
            return Some(id);
        }
        let mut best: Option<(u32, &str)> = None;
        for cid in ids {
            let c = &self.classes[cid];
            if c.pool.buckets.is_empty() || !c.could_hold(need, mib) {
                continue;
            }
            let found = if need == 0 || c.usable(mib) == c.memories.len() {
                c.pool.best(need, &accept)
            } else {
                let mixed = |id: &str| !excluded(id) && usable_free(id) >= need as usize;
                c.pool.best(need, &mixed)
            };
            if let Some((room, id)) = found
                && best.is_none_or(|(r, b)| (room, Reverse(id)) > (r, Reverse(b)))
            {
                best = Some((room, id));
            }
        }
        best.map(|(_, id)| id.to_string())
    }

    /// The worker closest to holding a job needing `need` GPUs with
    /// placement `p`, for a gang's reservation: among the workers with room
    /// that `accept` takes, in the classes that could ever hold the job,
    /// the one with the most free GPUs it could use (`usable_free`; ties to
    /// the smallest id). One look per class and bucket, from the most free
    /// GPUs down, plus the workers `accept` refuses.
    pub(super) fn nearest(
        &mut self,
        need: u32,
        p: &Placement,
        accept: &dyn Fn(&str) -> bool,
        usable_free: &dyn Fn(&str) -> usize,
    ) -> Option<String> {
        let mib = p.gpu_memory_mib;
        let ids: Vec<ClassId> = if p.is_constrained() {
            self.matching(p).to_vec()
        } else {
            (0..self.classes.len()).collect()
        };
        let mut best: Option<(usize, &str)> = None;
        for cid in ids {
            let c = &self.classes[cid];
            if c.pool.buckets.is_empty() || !c.could_hold(need, mib) {
                continue;
            }
            let found = c.pool.buckets.values().rev().find_map(|set| {
                set.iter()
                    .rev()
                    .find(|(_, Reverse(id))| accept(id))
                    .map(|(_, Reverse(id))| &**id)
            });
            if let Some(id) = found {
                let free = usable_free(id);
                if best.is_none_or(|(f, b)| (free, Reverse(id)) > (f, Reverse(b))) {
                    best = Some((free, id));
                }
            }
        }
        best.map(|(_, id)| id.to_string())
    }

    /// Registered workers (draining ones included) that could ever hold a
    /// job needing `need` GPUs with placement `p`, as the classes they are
    /// in; `None` for every registered worker (a job without constraint
    /// that any worker can hold: the common case, answered without
    /// looking at classes).
    pub(super) fn could_hold(&mut self, need: u32, p: &Placement) -> Option<Vec<ClassId>> {
        if !p.is_constrained() {
            let most = self.gpu_counts.keys().next_back().copied().unwrap_or(0);
            if self.registered > 0 && (need == 0 || most >= need as usize) {
                return None;
            }
        }
        let mib = p.gpu_memory_mib;
        let ids = self.matching(p).to_vec();
        Some(
            ids.into_iter()
                .filter(|c| self.classes[*c].could_hold(need, mib))
                .collect(),
        )
    }

    /// Whether class `c` is among `holders` ([`Capacity::could_hold`]).
    pub(super) fn holds(holders: &Option<Vec<ClassId>>, c: ClassId) -> bool {
        holders.as_ref().is_none_or(|h| h.contains(&c))
    }

    /// How many registered workers are in `holders`.
    pub(super) fn members(&self, holders: &Option<Vec<ClassId>>) -> usize {
        match holders {
            None => self.registered,
            Some(h) => h.iter().map(|c| self.classes[*c].members).sum(),
        }
    }

    /// The job's worker paths that no registered worker provides.
    pub(super) fn unprovided<'a>(&self, p: &'a Placement) -> Vec<&'a str> {
        p.worker_paths
            .iter()
            .filter(|x| !self.provided.contains_key(*x))
            .map(String::as_str)
            .collect()
    }

    /// One registration per shape of registered worker: what the fleet
    /// could ever hold, for the reasons told when it cannot.
    pub(super) fn shapes(&self) -> impl Iterator<Item = &WorkerInfo> {
        self.classes
            .iter()
            .filter(|c| c.members > 0)
            .map(|c| &c.info)
    }
}
