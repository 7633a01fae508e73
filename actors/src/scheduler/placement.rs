//! Placement: which queued jobs go to which workers, decided as a pure
//! function of the fleet's free capacity, the queue and the policy.
//!
//! [`place`] takes a [`Fleet`] (what is free where, and taking it), the
//! [`FairQueue`], the jobs' shapes ([`Jobs`]), the gang [`Reservations`]
//! and a [`Policy`], and returns the round's [`Lease`]s (job, worker,
//! GPUs). It does no IO, reads no clock, sends no message and knows no
//! actor: the scheduler numbers the leases, commits and sends them. The
//! policies are values:
//!
//! - [`Policy::Fifo`]: within a port's look-ahead, the first job that fits.
//! - [`Policy::WidestFirst`]: the first job that fits, unless a wider one
//!   behind it fits too (widest first), so a gang is placed while GPUs are
//!   free together; the first job counts each time it is passed over.
//! - [`Policy::ExpectedDuration`] (the default): the look-ahead ordered by
//!   expected GPU-time, width × expected seconds, longest first. A job's
//!   expected seconds are its component's recent runs (the median of the
//!   last few, read by the store when it was queued), else its spec's
//!   `expected_s`, else unknown, counted as the median of the known ones
//!   in the look-ahead (all unknown: equal, so the widest goes first).
//!   The oldest job counts each time another is taken before it and goes
//!   first once passed over [`MAX_BYPASS`] times. A gang (two GPUs or
//!   more) that is its port's first choice and fits nowhere gets a
//!   reservation on the worker closest to holding it: no other GPU job goes
//!   there unless the gang's GPUs stay free beside it, so the gang is not
//!   starved while GPUs free up one at a time.
//!
//! Between ports: priority levels from the highest, ports of a level in
//! turn (round robin), whatever the policy.
//!
//! Cost: a round asks the fleet at most once per job it looks at, and
//! remembers the shapes that found no room ([`Misses`]; capacity and
//! reservations only shrink within a round); a queue of one width without
//! estimates asks exactly what FIFO asks, under every policy.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use fvd_spec::Placement;

/// How the scheduler orders a port's queued jobs (see the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Policy {
    Fifo,
    WidestFirst,
    #[default]
    ExpectedDuration,
}

impl Policy {
    /// Every policy, by its name.
    pub const ALL: [Policy; 3] = [Policy::Fifo, Policy::WidestFirst, Policy::ExpectedDuration];

    /// Its name on the command line (`fvd orchestrator serve --placement`).
    pub fn name(self) -> &'static str {
        match self {
            Policy::Fifo => "fifo",
            Policy::WidestFirst => "widest",
            Policy::ExpectedDuration => "duration",
        }
    }

    /// Whether a gang that fits nowhere reserves a worker.
    fn reserves(self) -> bool {
        self == Policy::ExpectedDuration
    }
}

impl std::str::FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown placement policy {s:?}: one of fifo, widest, duration"))
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How often a job may be passed over before it is taken first: packing
/// wide or long jobs early must not starve small ones.
pub const MAX_BYPASS: u32 = 8;

/// How far into one port's queue placement looks for a job that fits
/// when the first one does not (a 2-GPU job waiting must not block the
/// 1-GPU jobs behind it forever, nor cost a scan of a huge queue).
pub const LOOKAHEAD: usize = 64;

/// A queued job as placement sees it.
#[derive(Debug, Clone, Copy)]
pub struct Job<'a> {
    pub id: &'a str,
    pub family: &'a str,
    /// GPUs, all on one worker; 0 for a CPU slot.
    pub need: u32,
    pub placement: &'a Placement,
    /// Workers it must not go to.
    pub exclude: &'a BTreeMap<String, String>,
}

/// The queued jobs' shapes, by id: `None` for a job that is no longer
/// queued (leased, or gone).
pub trait Jobs {
    fn job(&self, id: &str) -> Option<Job<'_>>;
}

/// The fleet's free capacity, which a round takes from.
pub trait Fleet {
    /// No worker has a free slot.
    fn is_full(&self) -> bool;
    /// The worker to lease `job` to now (among those `accept` takes), or
    /// `None` when none has room.
    fn pick(&mut self, job: &Job<'_>, accept: &dyn Fn(&str) -> bool) -> Option<String>;
    /// The worker closest to holding `job` (the most free GPUs among those
    /// `accept` takes that could ever hold it), for a reservation.
    fn nearest(&mut self, job: &Job<'_>, accept: &dyn Fn(&str) -> bool) -> Option<String>;
    /// Free GPUs of `worker` that `job` could use; `None` for a worker that
    /// left or drains.
    fn free_gpus(&self, worker: &str, job: &Job<'_>) -> Option<u32>;
    /// Takes `job`'s slots on `worker` (which [`Fleet::pick`] chose): its
    /// GPUs, or none for a CPU slot, and the MiB it holds of a shared GPU
    /// (0 for GPUs held alone).
    fn take(&mut self, worker: &str, job: &Job<'_>) -> (Vec<u32>, u64);
}

/// A lease decided by [`place`]: not numbered, committed or sent yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub job_id: String,
    pub worker_id: String,
    pub gpus: Vec<u32>,
    /// MiB of its one GPU it shares; 0 for GPUs held alone.
    pub share_mib: u64,
}

/// What one round decided.
#[derive(Debug, Default)]
pub struct Round {
    pub leases: Vec<Lease>,
    /// The round stopped at [`Limits::leases`] with work left.
    pub more: bool,
}

/// Bounds of one round.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most leases one round decides (one transaction).
    pub leases: usize,
    /// Most placement questions that find no room; past it the round ends
    /// (the next event starts another).
    pub misses: usize,
}

/// One gang's hold on a worker.
#[derive(Debug, Clone)]
struct Reservation {
    job: String,
    family: String,
    /// The worker's free GPUs beyond the gang's need (negative while the
    /// gang does not fit): what another GPU job may take there.
    slack: i64,
}

/// Workers held for gangs that fit nowhere yet (at most one per port),
/// kept between rounds; [`place`] drops those whose gang left the queue or
/// whose worker left.
#[derive(Debug, Default)]
pub struct Reservations {
    by_worker: HashMap<String, Reservation>,
    by_family: HashMap<String, String>,
}

impl Reservations {
    /// The worker held for `job`, if any.
    pub fn of_job(&self, job: &str) -> Option<&str> {
        self.by_worker
            .iter()
            .find(|(_, r)| r.job == job)
            .map(|(w, _)| w.as_str())
    }

    /// How many workers are held.
    pub fn len(&self) -> usize {
        self.by_worker.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_worker.is_empty()
    }

    fn holds(&self, job: &str, family: &str) -> bool {
        self.by_family
            .get(family)
            .and_then(|w| self.by_worker.get(w))
            .is_some_and(|r| r.job == job)
    }

    /// Whether `job` (needing `need` GPUs) may go to `worker`.
    fn allows(&self, worker: &str, job: &str, need: u32) -> bool {
        match self.by_worker.get(worker) {
            None => true,
            Some(r) => r.job == job || need == 0 || r.slack >= need as i64,
        }
    }

    fn reserve(&mut self, worker: String, job: &Job<'_>, free: u32) {
        tracing::debug!(worker = %worker, job = %job.id, need = job.need, "gang reserves a worker");
        self.by_family
            .insert(job.family.to_string(), worker.clone());
        self.by_worker.insert(
            worker,
            Reservation {
                job: job.id.to_string(),
                family: job.family.to_string(),
                slack: free as i64 - job.need as i64,
            },
        );
    }

    /// `job` took `need` GPUs of `worker`: its own reservation ends; on
    /// another's worker it used that slack.
    fn placed(&mut self, job: &Job<'_>, worker: &str) {
        if self.holds(job.id, job.family)
            && let Some(w) = self.by_family.remove(job.family)
        {
            self.by_worker.remove(&w);
            return;
        }
        if let Some(r) = self.by_worker.get_mut(worker) {
            r.slack -= job.need as i64;
        }
    }

    /// Drops reservations whose gang is no longer queued or whose worker
    /// left, and counts the others' slack from the fleet as it is now.
    fn refresh(&mut self, fleet: &impl Fleet, jobs: &impl Jobs) {
        let mut gone = Vec::new();
        for (w, r) in self.by_worker.iter_mut() {
            let free = jobs
                .job(&r.job)
                .and_then(|j| fleet.free_gpus(w, &j).map(|f| (j, f)));
            match free {
                Some((j, f)) => r.slack = f as i64 - j.need as i64,
                None => gone.push((w.clone(), r.family.clone())),
            }
        }
        for (w, family) in gone {
            self.by_worker.remove(&w);
            self.by_family.remove(&family);
        }
    }
}

/// A constrained job's GPUs, GPU memory, whether it may share a GPU,
/// labels and paths.
type Shape<'a> = (
    u32,
    u64,
    bool,
    &'a BTreeMap<String, String>,
    &'a Vec<String>,
);

/// What found no room in this round. Capacity only shrinks within a
/// round, so a job of the same shape need not ask again: a job without
/// constraint that found no `n` free GPUs tells that none of `n` or more
/// will, a constrained one tells its shape, a job with exclusions only
/// itself. (A gang holding a reservation always asks: only it may use its
/// worker.)
#[derive(Default)]
struct Misses<'a> {
    count: usize,
    /// Fewest GPUs an unconstrained job asked for in vain.
    gpus_from: Option<u32>,
    /// An unconstrained job found no free CPU slot.
    cpu: bool,
    shapes: HashSet<Shape<'a>>,
    jobs: HashSet<&'a str>,
}

impl<'a> Misses<'a> {
    fn known(&self, job: &Job<'_>) -> bool {
        let p = job.placement;
        if !job.exclude.is_empty() {
            self.jobs.contains(job.id)
        } else if !p.is_constrained() {
            if job.need == 0 {
                self.cpu
            } else {
                self.gpus_from.is_some_and(|n| job.need >= n)
            }
        } else {
            self.shapes.contains(&(
                job.need,
                p.gpu_memory_mib,
                p.gpu_share,
                &p.labels,
                &p.worker_paths,
            ))
        }
    }

    fn add(&mut self, job: &Job<'a>) {
        self.count += 1;
        let p = job.placement;
        if !job.exclude.is_empty() {
            self.jobs.insert(job.id);
        } else if !p.is_constrained() {
            if job.need == 0 {
                self.cpu = true;
            } else {
                self.gpus_from = Some(self.gpus_from.map_or(job.need, |n| n.min(job.need)));
            }
        } else {
            self.shapes.insert((
                job.need,
                p.gpu_memory_mib,
                p.gpu_share,
                &p.labels,
                &p.worker_paths,
            ));
        }
    }
}

/// One round: leases queued jobs to workers with room for them, in the
/// order `policy` gives, until the queue or the fleet runs out or a
/// bound of `limits` is reached. Pure: everything it reads and changes is
/// in its arguments.
pub fn place<'j, F: Fleet, J: Jobs>(
    fleet: &mut F,
    queue: &mut FairQueue,
    jobs: &'j J,
    reserved: &mut Reservations,
    policy: Policy,
    limits: Limits,
) -> Round {
    if !reserved.is_empty() {
        reserved.refresh(fleet, jobs);
    }
    let mut round = Round::default();
    let mut misses: Misses<'j> = Misses::default();
    loop {
        if queue.is_empty() || fleet.is_full() || misses.count >= limits.misses {
            break;
        }
        if round.leases.len() >= limits.leases {
            round.more = true;
            break;
        }
        let mut pick: Option<String> = None;
        let taken = queue.take(policy, |id, first| {
            let Some(job) = jobs.job(id) else {
                return false;
            };
            let holder = reserved.holds(job.id, job.family);
            if misses.count >= limits.misses || (!holder && misses.known(&job)) {
                return false;
            }
            let found = {
                let reserved = &*reserved;
                let accept =
                    |w: &str| !job.exclude.contains_key(w) && reserved.allows(w, job.id, job.need);
                fleet.pick(&job, &accept)
            };
            if found.is_some() {
                pick = found;
                return true;
            }
            misses.add(&job);
            if first
                && policy.reserves()
                && job.need >= 2
                && !reserved.by_family.contains_key(job.family)
            {
                let at = {
                    let reserved = &*reserved;
                    let accept = |w: &str| {
                        !job.exclude.contains_key(w) && !reserved.by_worker.contains_key(w)
                    };
                    fleet.nearest(&job, &accept)
                };
                if let Some(w) = at {
                    let free = fleet.free_gpus(&w, &job).unwrap_or(0);
                    reserved.reserve(w, &job, free);
                }
            }
            false
        });
        let Some(id) = taken else {
            break;
        };
        let worker = pick.expect("take returns the job it found a worker for");
        let job = jobs.job(&id).expect("a job taken is queued");
        let (gpus, share_mib) = fleet.take(&worker, &job);
        reserved.placed(&job, &worker);
        round.leases.push(Lease {
            job_id: id,
            worker_id: worker,
            gpus,
            share_mib,
        });
    }
    round
}

/// Queued job ids per port (family). Ports of the highest priority are
/// served first; ports of equal priority take turns (round robin), and
/// within a port the [`Policy`] orders its look-ahead, so one port with
/// many components cannot starve another of its rank.
#[derive(Debug, Default)]
pub struct FairQueue {
    by_family: HashMap<String, FamilyQueue>,
    /// Priority of each family with queued jobs.
    priority: HashMap<String, i32>,
    /// Families with queued jobs per priority level: the levels are read
    /// from here, highest first, not collected and sorted per take.
    levels: BTreeMap<i32, usize>,
    /// Families with queued jobs, in serving order.
    turn: VecDeque<String>,
    len: usize,
    /// How often a queued job was passed over (see [`FairQueue::take`]);
    /// absent is never.
    bypassed: HashMap<String, u32>,
    /// Families whose jobs are not taken for now ([`FairQueue::hold`]):
    /// a port whose components are still queueing their first runs.
    held: HashSet<String>,
}

/// One queued job: its id, GPUs and expected duration.
#[derive(Debug)]
struct Queued {
    id: String,
    gpus: u32,
    expected_ms: Option<u64>,
}

/// One family's queued jobs.
#[derive(Debug, Default)]
struct FamilyQueue {
    /// First in first out.
    jobs: VecDeque<Queued>,
    /// Queued jobs per GPU count: a take looks past the first job that
    /// fits only when the family has jobs of more than one width (or
    /// estimates, under [`Policy::ExpectedDuration`]).
    widths: BTreeMap<u32, usize>,
    /// Queued jobs with an expected duration.
    estimated: usize,
}

/// One fewer of `key` in `counts`; a count that reaches zero leaves, so the
/// keys present are those counted at least once.
pub(super) fn count_down<K: Ord>(counts: &mut BTreeMap<K, usize>, key: &K) {
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(key);
        }
    }
}

impl FamilyQueue {
    fn widest(&self) -> u32 {
        self.widths.keys().next_back().copied().unwrap_or(0)
    }

    fn add(&mut self, q: &Queued) {
        *self.widths.entry(q.gpus).or_default() += 1;
        self.estimated += usize::from(q.expected_ms.is_some());
    }

    fn forget(&mut self, q: &Queued) {
        count_down(&mut self.widths, &q.gpus);
        self.estimated -= usize::from(q.expected_ms.is_some());
    }

    /// Whether every job orders the same under expected duration: one
    /// width and no estimate, so the order is the queue's.
    fn uniform(&self) -> bool {
        self.estimated == 0 && self.widths.len() <= 1
    }
}

/// Expected GPU-time keys of a look-ahead, in queue order: width (at
/// least 1, a CPU slot counting as one) × expected milliseconds, an
/// unknown duration counted as the median of the known ones (all unknown:
/// 1, so the widest goes first).
fn gpu_time_keys(window: &[&Queued]) -> Vec<u64> {
    let mut known: Vec<u64> = window.iter().filter_map(|q| q.expected_ms).collect();
    known.sort_unstable();
    let unknown = match known.len() {
        0 => 1,
        n if n % 2 == 1 => known[n / 2],
        n => known[n / 2 - 1] / 2 + known[n / 2] / 2,
    };
    window
        .iter()
        .map(|q| u64::from(q.gpus.max(1)).saturating_mul(q.expected_ms.unwrap_or(unknown).max(1)))
        .collect()
}

impl FairQueue {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues job `id` needing `gpus` GPUs, expected to take `expected_ms`,
    /// at the back of its family.
    pub fn push_back(
        &mut self,
        family: &str,
        priority: i32,
        id: String,
        gpus: u32,
        expected_ms: Option<u64>,
    ) {
        let q = self.queue_of(family, priority);
        let job = Queued {
            id,
            gpus,
            expected_ms,
        };
        q.add(&job);
        q.jobs.push_back(job);
        self.len += 1;
    }

    /// Queues a job at the front of its family (a run given back).
    pub fn push_front(
        &mut self,
        family: &str,
        priority: i32,
        id: String,
        gpus: u32,
        expected_ms: Option<u64>,
    ) {
        let q = self.queue_of(family, priority);
        let job = Queued {
            id,
            gpus,
            expected_ms,
        };
        q.add(&job);
        q.jobs.push_front(job);
        self.len += 1;
    }

    fn queue_of(&mut self, family: &str, priority: i32) -> &mut FamilyQueue {
        if !self.by_family.contains_key(family) {
            self.turn.push_back(family.to_string());
        }
        match self.priority.insert(family.to_string(), priority) {
            Some(old) if old == priority => {}
            old => {
                if let Some(old) = old {
                    count_down(&mut self.levels, &old);
                }
                *self.levels.entry(priority).or_default() += 1;
            }
        }
        self.by_family.entry(family.to_string()).or_default()
    }

    fn drop_family(&mut self, family: &str) {
        self.by_family.remove(family);
        if let Some(level) = self.priority.remove(family) {
            count_down(&mut self.levels, &level);
        }
        self.turn.retain(|f| f != family);
    }

    /// Takes `id` out of its family's queue, looking from the back (the
    /// job removed is one that was just queued).
    pub fn remove(&mut self, family: &str, id: &str) {
        self.bypassed.remove(id);
        if let Some(q) = self.by_family.get_mut(family) {
            if let Some(i) = q.jobs.iter().rposition(|x| x.id == id)
                && let Some(job) = q.jobs.remove(i)
            {
                q.forget(&job);
                self.len -= 1;
            }
            if q.jobs.is_empty() {
                self.drop_family(family);
            }
        }
    }

    /// No job of `family` is taken until [`FairQueue::release`]: its
    /// jobs queue, and the policy orders all of them once released.
    pub fn hold(&mut self, family: &str) {
        self.held.insert(family.to_string());
    }

    /// Jobs of `family` are taken again; whether it was held.
    pub fn release(&mut self, family: &str) -> bool {
        self.held.remove(family)
    }

    /// Takes every job of `family` out.
    pub fn remove_family(&mut self, family: &str) {
        if let Some(q) = self.by_family.get(family) {
            self.len -= q.jobs.len();
            for job in &q.jobs {
                self.bypassed.remove(&job.id);
            }
            self.drop_family(family);
        }
    }

    /// Takes the next job for which `fits` holds: priority levels from the
    /// highest, families of a level in turn; the served family moves to
    /// the back of the turn. Within a family's first [`LOOKAHEAD`] jobs,
    /// `policy` decides the order in which `fits` is asked (see the module
    /// doc); `fits`'s second argument is true for the first job asked of
    /// a family in this take (its first choice).
    ///
    /// `fits` is called in order and the job returned is the one of its
    /// last `true` (a caller may remember what that call found); in a
    /// queue of one width without estimates it is called exactly as under
    /// [`Policy::Fifo`].
    pub fn take(
        &mut self,
        policy: Policy,
        mut fits: impl FnMut(&str, bool) -> bool,
    ) -> Option<String> {
        let mut level = self.levels.keys().next_back().copied();
        while let Some(l) = level {
            for pos in 0..self.turn.len() {
                let family = &self.turn[pos];
                if self.priority[family] != l || self.held.contains(family) {
                    continue;
                }
                let q = self
                    .by_family
                    .get_mut(family)
                    .expect("family in turn has a queue");
                let chosen = match policy {
                    Policy::Fifo => fifo(q, &mut fits),
                    Policy::WidestFirst => widest_first(q, &mut self.bypassed, &mut fits),
                    Policy::ExpectedDuration if q.uniform() => fifo(q, &mut fits),
                    Policy::ExpectedDuration => longest_first(q, &mut self.bypassed, &mut fits),
                };
                let Some(i) = chosen else {
                    continue;
                };
                let job = q.jobs.remove(i).expect("position is in the queue");
                q.forget(&job);
                let emptied = q.jobs.is_empty();
                self.bypassed.remove(&job.id);
                self.len -= 1;
                let family = self.turn.remove(pos).expect("position is in the turn");
                if emptied {
                    self.drop_family(&family);
                } else {
                    self.turn.push_back(family);
                }
                return Some(job.id);
            }
            level = self.levels.range(..l).next_back().map(|(k, _)| *k);
        }
        None
    }
}

/// The first job of the look-ahead that fits.
fn fifo(q: &FamilyQueue, fits: &mut impl FnMut(&str, bool) -> bool) -> Option<usize> {
    q.jobs
        .iter()
        .take(LOOKAHEAD)
        .enumerate()
        .position(|(i, j)| fits(&j.id, i == 0))
}

/// The first job that fits, unless a wider one behind it fits too
/// (widest first); the first job counts each time it is passed over, and
/// one passed over [`MAX_BYPASS`] times is taken before any wider one. A
/// family with no job wider than that first one is not looked through
/// again.
fn widest_first(
    q: &FamilyQueue,
    bypassed: &mut HashMap<String, u32>,
    fits: &mut impl FnMut(&str, bool) -> bool,
) -> Option<usize> {
    let first = fifo(q, fits)?;
    let w0 = q.jobs[first].gpus;
    let starved = bypassed
        .get(&q.jobs[first].id)
        .is_some_and(|&n| n >= MAX_BYPASS);
    if starved || q.widest() <= w0 {
        return Some(first);
    }
    let mut wider: Vec<(u32, usize)> = q
        .jobs
        .iter()
        .enumerate()
        .take(LOOKAHEAD)
        .skip(first + 1)
        .filter_map(|(j, x)| (x.gpus > w0).then_some((x.gpus, j)))
        .collect();
    wider.sort_unstable_by_key(|&(w, j)| (std::cmp::Reverse(w), j));
    match wider.iter().find(|&&(_, j)| fits(&q.jobs[j].id, false)) {
        Some(&(_, j)) => {
            *bypassed.entry(q.jobs[first].id.clone()).or_default() += 1;
            Some(j)
        }
        None => Some(first),
    }
}

/// The look-ahead by expected GPU-time, longest first (ties in queue
/// order), the oldest job first once it was passed over [`MAX_BYPASS`]
/// times; the first that fits. The oldest job counts each time another is
/// taken before it.
fn longest_first(
    q: &FamilyQueue,
    bypassed: &mut HashMap<String, u32>,
    fits: &mut impl FnMut(&str, bool) -> bool,
) -> Option<usize> {
    let window: Vec<&Queued> = q.jobs.iter().take(LOOKAHEAD).collect();
    let keys = gpu_time_keys(&window);
    let mut order: Vec<usize> = (0..window.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(keys[i]), i));
    if bypassed
        .get(&window[0].id)
        .is_some_and(|&n| n >= MAX_BYPASS)
        && let Some(at) = order.iter().position(|&i| i == 0)
    {
        order.remove(at);
        order.insert(0, 0);
    }
    let chosen = order
        .iter()
        .enumerate()
        .find(|&(k, &i)| fits(&window[i].id, k == 0))
        .map(|(_, &i)| i)?;
    if chosen != 0 {
        *bypassed.entry(window[0].id.clone()).or_default() += 1;
    }
    Some(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_queued_again_at_a_higher_priority_is_served_at_that_level() {
        for policy in Policy::ALL {
            let mut q = FairQueue::default();
            q.push_back("a", 0, "a1".into(), 1, None);
            q.push_back("b", 1, "b1".into(), 1, None);
            q.push_back("b", 1, "b2".into(), 1, None);
            // `a` moves up past `b`; level 0 has no family left.
            q.push_back("a", 5, "a2".into(), 1, None);
            assert_eq!(q.take(policy, |_, _| true).as_deref(), Some("a1"));
            assert_eq!(q.take(policy, |_, _| true).as_deref(), Some("a2"));
            assert_eq!(q.take(policy, |_, _| true).as_deref(), Some("b1"));
            q.remove("b", "b2");
            assert!(q.is_empty());
            assert_eq!(q.take(policy, |_, _| true), None);
            assert!(q.levels.is_empty(), "no level outlives its families");
            q.push_back("c", -3, "c1".into(), 1, None);
            assert_eq!(q.take(policy, |_, _| true).as_deref(), Some("c1"));
        }
    }

    /// The job taken (every job fits) and the jobs asked about, in order.
    fn take_asking(q: &mut FairQueue, policy: Policy) -> (Option<String>, Vec<String>) {
        let mut asked = Vec::new();
        let got = q.take(policy, |id, _| {
            asked.push(id.to_string());
            true
        });
        (got, asked)
    }

    #[test]
    fn widest_first_takes_a_wider_job_behind_the_first_only_while_one_is_queued() {
        let p = Policy::WidestFirst;
        let mut q = FairQueue::default();
        q.push_back("a", 0, "one".into(), 1, None);
        q.push_back("a", 0, "eight".into(), 8, None);
        q.push_back("a", 0, "two".into(), 2, None);
        let (got, asked) = take_asking(&mut q, p);
        assert_eq!(got.as_deref(), Some("eight"));
        assert_eq!(asked, ["one", "eight"]);
        let (got, asked) = take_asking(&mut q, p);
        assert_eq!(got.as_deref(), Some("two"));
        assert_eq!(asked, ["one", "two"]);
        // Only jobs of one GPU are left: nothing wider to look for.
        q.push_back("a", 0, "one-more".into(), 1, None);
        let (got, asked) = take_asking(&mut q, p);
        assert_eq!(got.as_deref(), Some("one"));
        assert_eq!(asked, ["one"]);
        q.remove("a", "one-more");
        assert!(q.by_family.is_empty());
    }

    #[test]
    fn fifo_takes_the_first_job_that_fits_whatever_its_width() {
        let mut q = FairQueue::default();
        q.push_back("a", 0, "one".into(), 1, Some(1_000));
        q.push_back("a", 0, "eight".into(), 8, Some(90_000));
        let (got, asked) = take_asking(&mut q, Policy::Fifo);
        assert_eq!(got.as_deref(), Some("one"));
        assert_eq!(asked, ["one"]);
        let got = q.take(Policy::Fifo, |id, _| id != "eight");
        assert_eq!(got, None, "nothing behind the job that does not fit");
    }

    #[test]
    fn expected_duration_orders_by_width_times_time_and_unknown_is_the_median() {
        let p = Policy::ExpectedDuration;
        let mut q = FairQueue::default();
        // GPU-seconds: short 1 × 5, long 1 × 40, gang 2 × 30, unknown 1 ×
        // median(5, 30, 40, 100) = 35, cpu (a slot counts as one) 1 × 100.
        q.push_back("a", 0, "short".into(), 1, Some(5_000));
        q.push_back("a", 0, "long".into(), 1, Some(40_000));
        q.push_back("a", 0, "gang".into(), 2, Some(30_000));
        q.push_back("a", 0, "unknown".into(), 1, None);
        q.push_back("a", 0, "cpu".into(), 0, Some(100_000));
        let window: Vec<&Queued> = q.by_family["a"].jobs.iter().collect();
        assert_eq!(
            gpu_time_keys(&window),
            [5_000, 40_000, 60_000, 35_000, 100_000]
        );
        let mut order = Vec::new();
        while let Some(id) = q.take(p, |_, _| true) {
            order.push(id);
        }
        // Once cpu, gang and long left, the unknown job counts as short's 5 s
        // and queue order breaks the tie.
        assert_eq!(order, ["cpu", "gang", "long", "short", "unknown"]);

        // All unknown: the widest first, then queue order.
        let mut q = FairQueue::default();
        for (id, gpus) in [("s1", 1), ("s2", 1), ("g", 2)] {
            q.push_back("a", 0, id.into(), gpus, None);
        }
        let (got, asked) = take_asking(&mut q, p);
        assert_eq!((got.as_deref(), asked.len()), (Some("g"), 1));
        assert_eq!(q.take(p, |_, _| true).as_deref(), Some("s1"));
    }

    /// A port's first runs arrive one by one: held until the last is
    /// queued, the long gang queued last still goes first.
    #[test]
    fn a_held_family_is_not_taken_and_once_released_its_longest_job_goes_first() {
        let p = Policy::ExpectedDuration;
        let mut q = FairQueue::default();
        q.hold("a");
        q.push_back("a", 0, "s1".into(), 1, Some(15_000));
        assert_eq!(q.take(p, |_, _| true), None, "held");
        q.push_back("b", 0, "other".into(), 1, None);
        assert_eq!(
            q.take(p, |_, _| true).as_deref(),
            Some("other"),
            "another port is served meanwhile"
        );
        q.push_back("a", 0, "s2".into(), 1, Some(15_000));
        q.push_back("a", 0, "gang".into(), 2, Some(26_000));
        assert!(q.release("a"));
        assert!(!q.release("a"), "released once");
        assert_eq!(q.take(p, |_, _| true).as_deref(), Some("gang"));
        assert_eq!(q.take(p, |_, _| true).as_deref(), Some("s1"));
    }

    #[test]
    fn expected_duration_asks_what_fifo_asks_in_a_queue_of_one_width_without_estimates() {
        let mut a = FairQueue::default();
        let mut b = FairQueue::default();
        for i in 0..100 {
            a.push_back(&format!("f{}", i % 3), 0, format!("j{i}"), 1, None);
            b.push_back(&format!("f{}", i % 3), 0, format!("j{i}"), 1, None);
        }
        let mut asked_a = Vec::new();
        let mut asked_b = Vec::new();
        // Every third job does not fit.
        let fits = |id: &str| !id.ends_with('3');
        loop {
            let x = a.take(Policy::ExpectedDuration, |id, _| {
                asked_a.push(id.to_string());
                fits(id)
            });
            let y = b.take(Policy::Fifo, |id, _| {
                asked_b.push(id.to_string());
                fits(id)
            });
            assert_eq!(x, y);
            if x.is_none() {
                break;
            }
        }
        assert_eq!(asked_a, asked_b);
    }

    #[test]
    fn a_job_passed_over_max_bypass_times_goes_first() {
        let p = Policy::ExpectedDuration;
        let mut q = FairQueue::default();
        q.push_back("a", 0, "small".into(), 1, Some(1_000));
        for i in 0..20 {
            q.push_back("a", 0, format!("big{i}"), 1, Some(60_000));
        }
        let mut order = Vec::new();
        for _ in 0..(MAX_BYPASS + 1) {
            order.push(q.take(p, |_, _| true).unwrap());
        }
        assert!(
            order[..MAX_BYPASS as usize]
                .iter()
                .all(|j| j.starts_with("big"))
        );
        assert_eq!(order[MAX_BYPASS as usize], "small", "{order:?}");
        assert!(
            !q.bypassed.contains_key("small"),
            "a job taken is forgotten"
        );
        // The next oldest counts from zero.
        assert_eq!(q.take(p, |_, _| true).as_deref(), Some("big8"));
        assert_eq!(q.bypassed.get("big9"), None);
    }

    /// A fleet of workers with some GPUs each: the most free first, ties by
    /// id, as the scheduler's capacity index picks.
    #[derive(Debug, Default)]
    struct Gpus {
        total: BTreeMap<String, u32>,
        free: BTreeMap<String, u32>,
    }

    impl Gpus {
        fn with(workers: &[(&str, u32)]) -> Self {
            let mut g = Gpus::default();
            for (w, n) in workers {
                g.total.insert(w.to_string(), *n);
                g.free.insert(w.to_string(), *n);
            }
            g
        }

        fn best(&self, accept: &dyn Fn(&str) -> bool, at_least: u32, could: u32) -> Option<String> {
            self.free
                .iter()
                .filter(|(w, f)| **f >= at_least && self.total[*w] >= could && accept(w))
                .max_by_key(|(w, f)| (**f, std::cmp::Reverse(w.to_string())))
                .map(|(w, _)| w.clone())
        }

        fn release(&mut self, w: &str, n: u32) {
            *self.free.get_mut(w).unwrap() += n;
        }
    }

    impl Fleet for Gpus {
        fn is_full(&self) -> bool {
            self.free.values().all(|f| *f == 0)
        }
        fn pick(&mut self, job: &Job<'_>, accept: &dyn Fn(&str) -> bool) -> Option<String> {
            self.best(accept, job.need.max(1), job.need)
        }
        fn nearest(&mut self, job: &Job<'_>, accept: &dyn Fn(&str) -> bool) -> Option<String> {
            self.best(accept, 0, job.need)
        }
        fn free_gpus(&self, worker: &str, _: &Job<'_>) -> Option<u32> {
            self.free.get(worker).copied()
        }
        fn take(&mut self, worker: &str, job: &Job<'_>) -> (Vec<u32>, u64) {
            let f = self.free.get_mut(worker).unwrap();
            *f -= job.need;
            ((0..job.need).collect(), 0)
        }
    }

    /// Queued jobs: (id, GPUs).
    struct Table(BTreeMap<String, u32>, Placement, BTreeMap<String, String>);

    impl Jobs for Table {
        fn job(&self, id: &str) -> Option<Job<'_>> {
            self.0.get_key_value(id).map(|(id, need)| Job {
                id,
                family: "a",
                need: *need,
                placement: &self.1,
                exclude: &self.2,
            })
        }
    }

    const LIMITS: Limits = Limits {
        leases: 4096,
        misses: 1024,
    };

    fn leased(round: &Round) -> Vec<(&str, &str)> {
        round
            .leases
            .iter()
            .map(|l| (l.job_id.as_str(), l.worker_id.as_str()))
            .collect()
    }

    #[test]
    fn the_long_gang_is_placed_first_and_singles_pack_around_it() {
        let mut fleet = Gpus::with(&[("w", 4)]);
        let mut q = FairQueue::default();
        let mut jobs = Table(BTreeMap::new(), Placement::default(), BTreeMap::new());
        for i in 0..8 {
            q.push_back("a", 0, format!("s{i}"), 1, Some(10_000 + i * 100));
            jobs.0.insert(format!("s{i}"), 1);
        }
        q.push_back("a", 0, "tp".into(), 2, Some(30_000));
        jobs.0.insert("tp".into(), 2);
        let mut r = Reservations::default();
        let round = place(
            &mut fleet,
            &mut q,
            &jobs,
            &mut r,
            Policy::ExpectedDuration,
            LIMITS,
        );
        assert_eq!(leased(&round), [("tp", "w"), ("s7", "w"), ("s6", "w")]);
        // FIFO on the same queue: four singles, the gang last.
        let mut fleet = Gpus::with(&[("w", 4)]);
        let mut q = FairQueue::default();
        for i in 0..8 {
            q.push_back("a", 0, format!("s{i}"), 1, Some(10_000));
        }
        q.push_back("a", 0, "tp".into(), 2, Some(30_000));
        let round = place(&mut fleet, &mut q, &jobs, &mut r, Policy::Fifo, LIMITS);
        assert_eq!(
            leased(&round),
            [("s0", "w"), ("s1", "w"), ("s2", "w"), ("s3", "w")]
        );
    }

    #[test]
    fn a_gang_holds_a_reservation_while_gpus_free_up_one_at_a_time() {
        // Four singles hold the worker's GPUs; the gang is queued behind
        // four more singles. As the GPUs free up one at a time, a single
        // would take each one under FIFO; the gang reserves the worker and
        // gets two together.
        let p = Policy::ExpectedDuration;
        let mut fleet = Gpus::with(&[("w", 4)]);
        let mut jobs = Table(BTreeMap::new(), Placement::default(), BTreeMap::new());
        let mut q = FairQueue::default();
        for i in 0..4 {
            q.push_back("a", 0, format!("s{i}"), 1, None);
            jobs.0.insert(format!("s{i}"), 1);
        }
        let mut r = Reservations::default();
        let round = place(&mut fleet, &mut q, &jobs, &mut r, p, LIMITS);
        assert_eq!(round.leases.len(), 4);
        for i in 0..4 {
            jobs.0.remove(&format!("s{i}"));
        }
        q.push_back("a", 0, "gang".into(), 2, Some(50_000));
        jobs.0.insert("gang".into(), 2);
        for i in 4..8 {
            q.push_back("a", 0, format!("s{i}"), 1, Some(10_000));
            jobs.0.insert(format!("s{i}"), 1);
        }
        // Nothing is free: no reservation yet (no worker is in reach).
        let round = place(&mut fleet, &mut q, &jobs, &mut r, p, LIMITS);
        assert!(round.leases.is_empty());
        // One GPU frees: the gang is the first choice, fits nowhere and
        // reserves the worker; no single takes that GPU.
        fleet.release("w", 1);
        let round = place(&mut fleet, &mut q, &jobs, &mut r, p, LIMITS);
        assert!(round.leases.is_empty(), "{:?}", round.leases);
        assert_eq!(r.of_job("gang"), Some("w"));
        // A second GPU frees: the gang goes.
        fleet.release("w", 1);
        let round = place(&mut fleet, &mut q, &jobs, &mut r, p, LIMITS);
        assert_eq!(leased(&round), [("gang", "w")]);
        assert!(r.is_empty(), "the reservation ends with the gang placed");
        // Under FIFO the same frees go to singles, one each.
        let mut fleet = Gpus::with(&[("w", 4)]);
        fleet.free.insert("w".into(), 1);
        let mut q = FairQueue::default();
        for i in 4..8 {
            q.push_back("a", 0, format!("s{i}"), 1, None);
        }
        q.push_back("a", 0, "gang".into(), 2, None);
        let round = place(&mut fleet, &mut q, &jobs, &mut r, Policy::Fifo, LIMITS);
        assert_eq!(leased(&round), [("s4", "w")]);
        assert!(r.is_empty());
    }

    #[test]
    fn a_reserved_worker_takes_other_jobs_only_beside_the_gangs_gpus() {
        let p = Policy::ExpectedDuration;
        // Two 8-GPU workers, 3 and 2 GPUs free; a 4-GPU gang fits on
        // neither and reserves the one with 3 free. A single may still go
        // there only while 4 stay free: it goes to the other worker.
        let mut fleet = Gpus::with(&[("a", 8), ("b", 8)]);
        fleet.free.insert("a".into(), 3);
        fleet.free.insert("b".into(), 2);
        let mut jobs = Table(BTreeMap::new(), Placement::default(), BTreeMap::new());
        let mut q = FairQueue::default();
        q.push_back("a", 0, "gang".into(), 4, Some(100_000));
        jobs.0.insert("gang".into(), 4);
        q.push_back("a", 0, "s".into(), 1, Some(1_000));
        jobs.0.insert("s".into(), 1);
        let mut r = Reservations::default();
        let round = place(&mut fleet, &mut q, &jobs, &mut r, p, LIMITS);
        assert_eq!(r.of_job("gang"), Some("a"));
        assert_eq!(leased(&round), [("s", "b")]);
        // The gang left the queue (cancelled): its reservation goes.
        q.remove("a", "gang");
        jobs.0.remove("gang");
        let _ = place(&mut fleet, &mut q, &jobs, &mut r, p, LIMITS);
        assert!(r.is_empty());
    }

    #[test]
    fn policies_parse_from_their_names() {
        for p in Policy::ALL {
            assert_eq!(p.name().parse::<Policy>(), Ok(p));
        }
        let err = "lifo".parse::<Policy>().unwrap_err();
        assert!(
            err.contains("\"lifo\"") && err.contains("duration"),
            "{err}"
        );
    }
}
