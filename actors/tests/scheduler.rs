//! The scheduler actor against simulated workers (channels standing in for
//! their streams) and a manual clock: lease expiry without sleeping,
//! fencing of stale results, orphan cancellation, fairness between ports,
//! gang placement, and a long randomized run that checks no GPU is ever
//! leased twice at once.

mod common;
use common::Sink;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use fvd_actors::scheduler::{
    HeartbeatBatch, JobEvent, Policy, QueuedJob, SchedulerActor, SchedulerArgs, SchedulerConfig,
    SchedulerMsg, SharedGpu,
};
use fvd_spec::Placement;
use fvd_store::Store;
use fvd_store::clock::ManualClock;
use fvd_store::messages::{Assignment, GpuInfo, JobReport, ToWorker, WorkerInfo};
use fvd_store::model::{JobRecord, JobResult, JobState, PortRow};
use ractor::{Actor, ActorRef};
use tokio::sync::mpsc;

struct Harness {
    _dir: tempfile::TempDir,
    store: Store,
    clock: Arc<ManualClock>,
    sched: ActorRef<SchedulerMsg>,
    sink: ActorRef<JobEvent>,
    events: mpsc::UnboundedReceiver<JobEvent>,
    conn: u64,
}

impl Harness {
    async fn new() -> Self {
        Self::with_policy(Policy::default()).await
    }

    /// A scheduler placing under `placement`.
    async fn with_policy(placement: Policy) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_path(&dir.path().join("s.db")).await.unwrap();
        let clock = Arc::new(ManualClock::default());
        let (sched, _) = Actor::spawn(
            None,
            SchedulerActor,
            SchedulerArgs {
                store: store.clone(),
                clock: clock.clone(),
                config: SchedulerConfig {
                    lease_ttl: Duration::from_secs(5),
                    // Ticks are sent by the tests after moving the clock.
                    tick: Duration::from_secs(3600),
                    fixed_fleet: false,
                    placement,
                    ..SchedulerConfig::default()
                },
            },
        )
        .await
        .unwrap();
        let (tx, events) = mpsc::unbounded_channel();
        let (sink, _) = Actor::spawn(None, Sink::new(), tx).await.unwrap();
        Self {
            _dir: dir,
            store,
            clock,
            sched,
            sink,
            events,
            conn: 0,
        }
    }

    /// Registers a simulated worker with `gpus` GPUs and `cpu` CPU slots.
    fn worker(&mut self, id: &str, gpus: u32, cpu: u32) -> mpsc::Receiver<ToWorker> {
        self.worker_with(id, gpus, cpu, 80_000, &[])
    }

    /// A simulated worker with GPUs of `memory_mib` and `labels`.
    fn worker_with(
        &mut self,
        id: &str,
        gpus: u32,
        cpu: u32,
        memory_mib: u64,
        labels: &[(&str, &str)],
    ) -> mpsc::Receiver<ToWorker> {
        self.worker_providing(id, gpus, cpu, memory_mib, labels, &[])
    }

    /// A simulated worker that also provides `paths` (`--provide`).
    fn worker_providing(
        &mut self,
        id: &str,
        gpus: u32,
        cpu: u32,
        memory_mib: u64,
        labels: &[(&str, &str)],
        paths: &[&str],
    ) -> mpsc::Receiver<ToWorker> {
        let (tx, rx) = mpsc::channel(1024);
        self.conn += 1;
        let info = WorkerInfo {
            worker_id: id.into(),
            host: "sim".into(),
            gpus: (0..gpus)
                .map(|i| GpuInfo {
                    index: i,
                    uuid: format!("GPU-{id}-{i}"),
                    name: "sim".into(),
                    memory_mib,
                })
                .collect(),
            cpu_slots: cpu,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            provides: paths.iter().map(|p| p.to_string()).collect(),
        };
        self.sched
            .cast(SchedulerMsg::WorkerConnected {
                info: Box::new(info),
                tx,
                conn: self.conn,
            })
            .unwrap();
        rx
    }

    async fn port(&self, family: &str, components: &[&str]) {
        let row = PortRow {
            family: family.into(),
            repo: "/".into(),
            spec_path: "p".into(),
            spec_toml: String::new(),
            state: fvd_store::model::PortState::Running,
            phase: "P6".into(),
            port_status_path: String::new(),
            commit: String::new(),
        };
        let names: Vec<String> = components.iter().map(|c| c.to_string()).collect();
        self.store.create_port(&row, &names).await.unwrap();
    }

    async fn enqueue(&self, family: &str, component: &str, gpus: u32) -> String {
        self.enqueue_with(family, component, gpus, Placement::default())
            .await
    }

    async fn enqueue_with(
        &self,
        family: &str,
        component: &str,
        gpus: u32,
        placement: Placement,
    ) -> String {
        let rec = self
            .store
            .queue_job(&JobRecord {
                family: family.into(),
                component: component.into(),
                argv: vec!["true".into()],
                cwd: "/".into(),
                gpus_needed: gpus,
                timeout_ms: 1000,
                ..JobRecord::default()
            })
            .await
            .unwrap();
        let id = rec.job_id.clone();
        self.sched
            .cast(SchedulerMsg::Enqueue(Box::new(QueuedJob {
                record: rec.into(),
                env: BTreeMap::new(),
                secret_env: Vec::new(),
                notify: self.sink.get_derived(),
                collect_env: None,
                compare: None,
                exclude: Default::default(),
                preflight: Vec::new(),
                warm: None,
                agent: None,
                fvd_writes: Vec::new(),
                placement,
                span: tracing::Span::none(),
            })))
            .unwrap();
        id
    }

    /// Queues many jobs at once (one transaction for their rows):
    /// `(component, gpus, placement, exclude)` each; returns their ids.
    async fn enqueue_many(
        &self,
        family: &str,
        jobs: Vec<(String, u32, Placement, BTreeMap<String, String>)>,
    ) -> Vec<String> {
        let records: Vec<JobRecord> = jobs
            .iter()
            .map(|(component, gpus, _, _)| JobRecord {
                family: family.into(),
                component: component.clone(),
                argv: vec!["true".into()],
                cwd: "/".into(),
                gpus_needed: *gpus,
                timeout_ms: 1000,
                ..JobRecord::default()
            })
            .collect();
        let records = self.store.queue_jobs(&records).await.unwrap();
        let mut ids = Vec::new();
        for (rec, (_, _, placement, exclude)) in records.into_iter().zip(jobs) {
            ids.push(rec.job_id.clone());
            self.sched
                .cast(SchedulerMsg::Enqueue(Box::new(QueuedJob {
                    record: rec.into(),
                    env: BTreeMap::new(),
                    secret_env: Vec::new(),
                    notify: self.sink.get_derived(),
                    collect_env: None,
                    compare: None,
                    exclude,
                    preflight: Vec::new(),
                    fvd_writes: Vec::new(),
                    warm: None,
                    agent: None,
                    placement,
                    span: tracing::Span::none(),
                })))
                .unwrap();
        }
        ids
    }

    /// The bound of one `Counts` call: generous, since a loaded 2-core
    /// machine (CI beside other builds) once took over 5 s to answer the
    /// large fleet's round; a scheduler that never answers still fails.
    const COUNTS_MS: u64 = 30_000;

    /// Waits (bounded) for the scheduler to have processed every message
    /// sent so far and the dispatch round they caused: the first `Counts`
    /// is answered after the messages, the second after the `Dispatch` the
    /// scheduler queued for itself behind them. Leases that round decided
    /// may still be on their way to the database.
    async fn dispatched(&self) -> (usize, usize, usize) {
        ractor::call_t!(self.sched, SchedulerMsg::Counts, Self::COUNTS_MS).unwrap();
        ractor::call_t!(self.sched, SchedulerMsg::Counts, Self::COUNTS_MS).unwrap()
    }

    /// [`Harness::dispatched`], and then the leases decided so far are
    /// committed and their assignments out.
    async fn settle(&self) -> (usize, usize, usize) {
        self.dispatched().await;
        ractor::call_t!(self.sched, SchedulerMsg::Settle, 5000).unwrap();
        ractor::call_t!(self.sched, SchedulerMsg::Counts, Self::COUNTS_MS).unwrap()
    }

    fn finished(&self, worker: &str, job_id: &str, epoch: u64) {
        self.sched
            .cast(SchedulerMsg::Finished {
                worker_id: worker.into(),
                report: Box::new(JobReport {
                    job_id: job_id.into(),
                    lease_epoch: epoch,
                    exit_code: Some(0),
                    ..JobReport::default()
                }),
            })
            .unwrap();
    }
}

async fn next_assign(rx: &mut mpsc::Receiver<ToWorker>) -> (String, u64, Vec<u32>) {
    match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
        Ok(Some(ToWorker::Assign(a))) => (a.job_id, a.lease_epoch, a.gpus),
        other => panic!("expected an assignment, got {other:?}"),
    }
}

/// Registers one worker with a single CPU slot and finishes each job it is
/// given: the order of the `n` assignments is the scheduler's serving order.
async fn serving_order(h: &mut Harness, n: usize) -> Vec<String> {
    let mut w = h.worker("w", 0, 1);
    let mut order = Vec::new();
    for _ in 0..n {
        let (id, epoch, _) = next_assign(&mut w).await;
        order.push(id.clone());
        h.finished("w", &id, epoch);
    }
    order
}

/// The next waiting reason the scheduler sends for `job` (bounded wait).
async fn waiting_reason(events: &mut mpsc::UnboundedReceiver<JobEvent>, job: &str) -> String {
    loop {
        match tokio::time::timeout(Duration::from_secs(5), events.recv()).await {
            Ok(Some(JobEvent::Waiting { job_id, reason, .. })) if job_id == job => {
                return reason;
            }
            Ok(Some(_)) => continue,
            other => panic!("expected a waiting reason for {job}, got {other:?}"),
        }
    }
}

fn drain_finished(events: &mut mpsc::UnboundedReceiver<JobEvent>) -> Vec<String> {
    let mut done = Vec::new();
    while let Ok(m) = events.try_recv() {
        if let JobEvent::Finished { report, .. } = m {
            done.push(report.job_id);
        }
    }
    done
}

#[tokio::test]
async fn a_silent_worker_loses_its_lease_after_the_ttl_and_its_late_result_is_fenced() {
    let mut h = Harness::new().await;
    h.port("p", &["a"]).await;
    let mut w1 = h.worker("w1", 1, 1);
    let job = h.enqueue("p", "a", 1).await;
    let (id, e1, _) = next_assign(&mut w1).await;
    assert_eq!(id, job);

    // A second worker keeps heartbeating; w1 falls silent.
    let mut w2 = h.worker("w2", 1, 1);
    h.clock.advance_ms(4_000);
    h.sched
        .cast(SchedulerMsg::Heartbeat {
            worker_id: "w2".into(),
            running: vec![],
        })
        .unwrap();
    h.sched.cast(SchedulerMsg::Tick).unwrap();
    h.settle().await;
    assert!(w2.try_recv().is_err(), "within the ttl nothing moves");

    h.clock.advance_ms(2_000); // w1 silent for 6 s > 5 s
    h.sched
        .cast(SchedulerMsg::Heartbeat {
            worker_id: "w2".into(),
            running: vec![],
        })
        .unwrap();
    h.sched.cast(SchedulerMsg::Tick).unwrap();
    let (id2, e2, _) = next_assign(&mut w2).await;
    assert_eq!(id2, job, "the job moved to the live worker");
    assert!(e2 > e1, "a new lease has a newer epoch");

    // The partitioned worker's late result carries the old epoch: fenced.
    h.finished("w1", &job, e1);
    h.settle().await;
    assert!(
        drain_finished(&mut h.events).is_empty(),
        "a stale result must not reach the component"
    );
    // The live lease's result goes through, once.
    h.finished("w2", &job, e2);
    h.finished("w2", &job, e2);
    h.settle().await;
    assert_eq!(drain_finished(&mut h.events), vec![job]);
}

/// A tick that waited in the mailbox behind the scheduler's backlog judges
/// silence as of when it was sent: heartbeats queued behind the same
/// backlog are not taken for a dead fleet.
#[tokio::test]
async fn a_tick_judges_silence_as_of_when_it_was_sent() {
    let mut h = Harness::new().await;
    h.port("p", &["a"]).await;
    let _w1 = h.worker("w1", 1, 1);
    h.enqueue("p", "a", 1).await;
    h.settle().await;
    h.clock.advance_ms(6_000);
    // Sent at 4 s, handled at 6 s: w1 was silent for 4 s when it was sent.
    h.sched
        .cast(SchedulerMsg::TickSent { sent_ms: 4_000 })
        .unwrap();
    assert_eq!(h.settle().await, (1, 0, 1), "w1 keeps its lease");
    h.sched
        .cast(SchedulerMsg::TickSent { sent_ms: 6_000 })
        .unwrap();
    assert_eq!(
        h.settle().await,
        (0, 1, 0),
        "silent for 6 s: its lease expires"
    );
}

#[tokio::test]
async fn a_worker_that_comes_back_is_told_to_kill_its_orphaned_job() {
    let mut h = Harness::new().await;
    h.port("p", &["a"]).await;
    let mut w1 = h.worker("w1", 0, 1);
    let job = h.enqueue("p", "a", 0).await;
    let (_, e1, _) = next_assign(&mut w1).await;
    // w1's stream drops (conn 1); the job moves to w2.
    h.sched
        .cast(SchedulerMsg::WorkerDisconnected {
            worker_id: "w1".into(),
            conn: 1,
        })
        .unwrap();
    let mut w2 = h.worker("w2", 0, 1);
    let (_, e2, _) = next_assign(&mut w2).await;
    assert!(e2 > e1);
    // w1 reconnects and reports it still runs the job under e1.
    let mut w1 = h.worker("w1", 0, 1);
    h.sched
        .cast(SchedulerMsg::Heartbeat {
            worker_id: "w1".into(),
            running: vec![(job.clone(), e1)],
        })
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(5), w1.recv()).await {
        Ok(Some(ToWorker::Cancel {
            job_id,
            lease_epoch,
            ..
        })) => {
            assert_eq!((job_id, lease_epoch), (job, e1));
        }
        other => panic!("expected a cancel, got {other:?}"),
    }
}

/// The database's write lock, held from a connection of its own: the
/// scheduler's writer cannot commit a lease until it is released.
struct WriteLock(sqlx::SqliteConnection);

impl WriteLock {
    async fn take(h: &Harness) -> Self {
        use sqlx::Connection;
        let url = format!("sqlite://{}", h._dir.path().join("s.db").display());
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .unwrap();
        Self(conn)
    }

    async fn release(mut self) {
        sqlx::query("COMMIT").execute(&mut self.0).await.unwrap();
    }
}

/// Worker `w1` (one GPU) runs job `a`, and job `b` waits for it; with the
/// write lock taken, `a` finishes and `b` is leased to `w1` in memory while
/// its lease cannot reach the database. Returns `b`'s id and the lock.
async fn lease_in_flight(h: &mut Harness) -> (mpsc::Receiver<ToWorker>, String, WriteLock) {
    h.port("p", &["a", "b"]).await;
    let mut w1 = h.worker("w1", 1, 1);
    let a = h.enqueue("p", "a", 1).await;
    let (id, epoch, _) = next_assign(&mut w1).await;
    assert_eq!(id, a);
    let b = h.enqueue("p", "b", 1).await;
    assert_eq!(h.settle().await, (1, 1, 1), "b waits for w1's GPU");
    let lock = WriteLock::take(h).await;
    h.finished("w1", &a, epoch);
    assert_eq!(
        h.dispatched().await,
        (1, 0, 1),
        "b holds w1's GPU in memory"
    );
    assert!(
        w1.try_recv().is_err(),
        "no assignment leaves before its lease is committed"
    );
    (w1, b, lock)
}

#[tokio::test]
async fn an_assignment_leaves_once_its_lease_is_committed() {
    let mut h = Harness::new().await;
    let (mut w1, b, lock) = lease_in_flight(&mut h).await;
    lock.release().await;
    let (id, epoch, _) = next_assign(&mut w1).await;
    assert_eq!(id, b);
    let row = h.store.job(&b).await.unwrap().unwrap();
    assert_eq!(row.state, JobState::Running);
    assert_eq!((row.worker_id.as_str(), row.lease_epoch), ("w1", epoch));
}

#[tokio::test]
async fn a_worker_lost_while_its_lease_is_in_flight_never_gets_the_job() {
    let mut h = Harness::new().await;
    let (mut w1, b, lock) = lease_in_flight(&mut h).await;
    h.sched
        .cast(SchedulerMsg::WorkerDisconnected {
            worker_id: "w1".into(),
            conn: 1,
        })
        .unwrap();
    lock.release().await;
    assert_eq!(h.settle().await, (0, 1, 0), "b is queued again");
    assert!(
        w1.try_recv().is_err(),
        "the lost worker is not sent the lease that was committed after it left"
    );
    // The requeue landed after the lease, not under it.
    let row = h.store.job(&b).await.unwrap().unwrap();
    assert_eq!(row.state, JobState::Queued);
    let mut w2 = h.worker("w2", 1, 1);
    let (id, _, _) = next_assign(&mut w2).await;
    assert_eq!(id, b, "the job goes to the next worker");
}

#[tokio::test]
async fn a_port_cancelled_while_a_lease_is_in_flight_sends_its_worker_nothing() {
    let mut h = Harness::new().await;
    let (mut w1, _, lock) = lease_in_flight(&mut h).await;
    h.sched
        .cast(SchedulerMsg::CancelFamily { family: "p".into() })
        .unwrap();
    lock.release().await;
    assert_eq!(h.settle().await, (1, 0, 0), "w1's GPU is free again");
    assert!(
        w1.try_recv().is_err(),
        "neither an assignment nor a cancel for a job the worker never had"
    );
}

#[tokio::test]
async fn each_heartbeat_of_a_batch_keeps_its_worker_and_cancels_its_orphans() {
    let mut h = Harness::new().await;
    let _w1 = h.worker("w1", 0, 1);
    let mut w2 = h.worker("w2", 0, 1);
    h.settle().await;
    h.clock.advance_ms(4_000);
    let batch = Arc::new(HeartbeatBatch::default());
    batch.add(&h.sched, "w1".into(), vec![]).unwrap();
    batch
        .add(&h.sched, "w2".into(), vec![("gone.job.1".into(), 7)])
        .unwrap();
    // Silent for 6 s since registering, 2 s since the batch: both stay.
    h.clock.advance_ms(2_000);
    h.sched.cast(SchedulerMsg::Tick).unwrap();
    assert_eq!(h.settle().await.0, 2, "both workers beat in the batch");
    match w2.try_recv() {
        Ok(ToWorker::Cancel {
            job_id,
            lease_epoch,
            ..
        }) => assert_eq!((job_id.as_str(), lease_epoch), ("gone.job.1", 7)),
        other => panic!("expected w2's orphan cancelled, got {other:?}"),
    }
}

#[tokio::test]
async fn ports_are_served_round_robin() {
    let mut h = Harness::new().await;
    h.port("big", &["a", "b", "c", "d"]).await;
    h.port("small", &["x"]).await;
    for c in ["a", "b", "c", "d"] {
        h.enqueue("big", c, 0).await;
    }
    h.enqueue("small", "x", 0).await;
    h.settle().await;
    // One slot: the order of assignments is the serving order.
    let order = serving_order(&mut h, 3).await;
    assert_eq!(order[0], "big.a.1");
    assert_eq!(
        order[1], "small.x.1",
        "the small port is not starved behind the big one: {order:?}"
    );
    assert_eq!(order[2], "big.b.1");
}

#[tokio::test]
async fn a_multi_gpu_job_lands_on_one_worker_or_waits() {
    let mut h = Harness::new().await;
    h.port("p", &["tp", "one"]).await;
    let mut w1 = h.worker("w1", 1, 1);
    let mut w2 = h.worker("w2", 1, 1);
    let tp = h.enqueue("p", "tp", 2).await;
    let one = h.enqueue("p", "one", 1).await;
    h.settle().await;
    // Two single-GPU workers: the 2-GPU job waits, and its component is
    // told why; the 1-GPU job runs.
    let got = match (w1.try_recv(), w2.try_recv()) {
        (Ok(ToWorker::Assign(a)), Err(_)) | (Err(_), Ok(ToWorker::Assign(a))) => a,
        other => panic!("expected exactly one assignment, got {other:?}"),
    };
    assert_eq!(got.job_id, one);
    let waiting = waiting_reason(&mut h.events, &tp).await;
    assert_eq!(
        waiting,
        "waiting: needs 2 GPUs on one worker; no registered worker has that"
    );
    // A worker with two GPUs arrives: the gang job goes there, whole.
    let mut w3 = h.worker("w3", 2, 1);
    let (id, _, gpus) = next_assign(&mut w3).await;
    assert_eq!(id, tp);
    assert_eq!(gpus.len(), 2);
}

/// A small deterministic generator, so a failure reproduces.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// What the randomized runs have seen: which job holds each GPU, the jobs
/// running (worker, job id, epoch, GPUs) and those finished.
#[derive(Default)]
struct Ledger {
    held: HashMap<(String, u32), String>,
    running: Vec<(String, String, u64, Vec<u32>)>,
    finished: BTreeSet<String>,
}

impl Ledger {
    /// `wid` runs `a`: none of its GPUs may be held already.
    fn hold(&mut self, wid: &str, a: Assignment) {
        for g in &a.gpus {
            let prev = self.held.insert((wid.to_string(), *g), a.job_id.clone());
            assert!(
                prev.is_none(),
                "gpu {g} of {wid} leased to {} while {prev:?} held it",
                a.job_id
            );
        }
        self.running
            .push((wid.to_string(), a.job_id, a.lease_epoch, a.gpus));
    }

    /// Finishes a random half of the running jobs, freeing their GPUs; no
    /// job finishes twice.
    fn finish_some(&mut self, h: &Harness, rng: &mut Lcg) {
        assert!(
            !self.running.is_empty(),
            "jobs remain but nothing runs: the scheduler stalled"
        );
        let mut keep = Vec::new();
        for r in self.running.drain(..) {
            if rng.next().is_multiple_of(2) {
                for g in &r.3 {
                    self.held.remove(&(r.0.clone(), *g));
                }
                h.finished(&r.0, &r.1, r.2);
                assert!(self.finished.insert(r.1.clone()), "{} finished twice", r.1);
            } else {
                keep.push(r);
            }
        }
        self.running = keep;
    }
}

#[tokio::test]
async fn no_gpu_is_ever_leased_twice_over_a_long_randomized_run() {
    let mut h = Harness::new().await;
    let mut rng = Lcg(42);
    let workers: Vec<(String, u32)> = (0..6).map(|i| (format!("w{i}"), 1 + (i % 4))).collect();
    let mut rxs: HashMap<String, mpsc::Receiver<ToWorker>> = HashMap::new();
    for (id, gpus) in &workers {
        rxs.insert(id.clone(), h.worker(id, *gpus, 1));
    }
    let comps: Vec<String> = (0..12).map(|i| format!("c{i}")).collect();
    let comp_refs: Vec<&str> = comps.iter().map(String::as_str).collect();
    h.port("r", &comp_refs).await;
    let total = 300;
    for i in 0..total {
        let need = (rng.next() % 4) as u32; // 0..=3 GPUs
        h.enqueue("r", &comps[i % comps.len()], need).await;
    }
    let mut seen = Ledger::default();
    while seen.finished.len() < total {
        h.settle().await;
        for (wid, rx) in rxs.iter_mut() {
            while let Ok(m) = rx.try_recv() {
                if let ToWorker::Assign(a) = m {
                    seen.hold(wid, *a);
                }
            }
        }
        seen.finish_some(&h, &mut rng);
    }
    h.settle().await;
    assert_eq!(drain_finished(&mut h.events).len(), total);
}

#[tokio::test]
async fn a_higher_priority_port_is_served_first() {
    let mut h = Harness::new().await;
    h.port("low", &["a", "b"]).await;
    h.port("high", &["x", "y"]).await;
    let high = Placement {
        priority: 5,
        ..Placement::default()
    };
    h.enqueue("low", "a", 0).await;
    h.enqueue("low", "b", 0).await;
    h.enqueue_with("high", "x", 0, high.clone()).await;
    h.enqueue_with("high", "y", 0, high).await;
    h.settle().await;
    let order = serving_order(&mut h, 4).await;
    assert_eq!(order, ["high.x.1", "high.y.1", "low.a.1", "low.b.1"]);
}

#[tokio::test]
async fn labels_and_gpu_memory_choose_the_worker_or_say_why_none_fits() {
    let mut h = Harness::new().await;
    h.port("p", &["big", "tagged", "huge"]).await;
    let mut small = h.worker_with("small", 2, 1, 24_000, &[]);
    let mut large = h.worker_with("large", 2, 1, 80_000, &[("site", "a")]);
    let big = h
        .enqueue_with(
            "p",
            "big",
            1,
            Placement {
                gpu_memory_mib: 40_000,
                ..Placement::default()
            },
        )
        .await;
    let (id, _, _) = next_assign(&mut large).await;
    assert_eq!(id, big, "only the large worker's GPUs have the memory");
    let tagged = h
        .enqueue_with(
            "p",
            "tagged",
            1,
            Placement {
                labels: [("site".to_string(), "a".to_string())].into(),
                ..Placement::default()
            },
        )
        .await;
    let (id, _, _) = next_assign(&mut large).await;
    assert_eq!(id, tagged, "only the large worker carries site=a");
    assert!(
        small.try_recv().is_err(),
        "nothing went to the small worker"
    );
    let huge = h
        .enqueue_with(
            "p",
            "huge",
            1,
            Placement {
                gpu_memory_mib: 160_000,
                ..Placement::default()
            },
        )
        .await;
    let reason = waiting_reason(&mut h.events, &huge).await;
    assert_eq!(
        reason,
        "waiting: needs 1 GPU on one worker with at least 160000 MiB each; no registered worker has that"
    );
}

#[tokio::test]
async fn worker_paths_choose_the_worker_that_provides_them_or_say_none_does() {
    let mut h = Harness::new().await;
    h.port("p", &["weighted", "other"]).await;
    let mut plain = h.worker("plain", 0, 2);
    let mut holder = h.worker_providing("holder", 0, 2, 0, &[], &["official_weights/tiny"]);
    let needs = |paths: &[&str]| Placement {
        worker_paths: paths.iter().map(|p| p.to_string()).collect(),
        ..Placement::default()
    };
    let weighted = h
        .enqueue_with("p", "weighted", 0, needs(&["official_weights/tiny"]))
        .await;
    let (id, _, _) = next_assign(&mut holder).await;
    assert_eq!(id, weighted, "only the worker providing the path takes it");
    assert!(
        plain.try_recv().is_err(),
        "nothing went to the plain worker"
    );
    let other = h
        .enqueue_with("p", "other", 0, needs(&["official_weights/tiny", "data/x"]))
        .await;
    let reason = waiting_reason(&mut h.events, &other).await;
    assert_eq!(
        reason,
        "waiting: needs worker path data/x; no registered worker provides it (fvd worker --provide PATH=DIR)"
    );
}

#[tokio::test]
async fn the_widest_waiting_gang_is_placed_first_on_free_gpus() {
    // Eight 1-GPU components and one 2-GPU component of one port on a
    // 4-GPU worker: in queue order the 2-GPU job would run last, alone, on
    // two of four GPUs; packed, it starts in the first wave.
    let mut h = Harness::new().await;
    let names: Vec<String> = (0..8).map(|i| format!("one{i}")).collect();
    let mut all: Vec<&str> = names.iter().map(String::as_str).collect();
    all.push("two");
    h.port("p", &all).await;
    for n in &names {
        h.enqueue("p", n, 1).await;
    }
    let two = h.enqueue("p", "two", 2).await;
    h.settle().await;
    let mut w = h.worker("w", 4, 0);
    let mut first_wave = Vec::new();
    for _ in 0..3 {
        first_wave.push(next_assign(&mut w).await);
    }
    h.settle().await;
    assert!(w.try_recv().is_err(), "four GPUs hold three jobs here");
    assert_eq!(first_wave[0].0, two, "{first_wave:?}");
    assert_eq!(first_wave[0].2.len(), 2);
    assert_eq!(first_wave[1].0, "p.one0.1");
    assert_eq!(first_wave[2].0, "p.one1.1");
}

/// The rerun of issue #33 on a CPU: seven 1-GPU components of 10 s, a
/// 2-GPU one of 10 s and a 1-GPU one of 60 s, queued in that order, on one
/// 4-GPU worker. Returns the first wave of the first run and of the rerun
/// (the jobs leased while all four GPUs are free, by component), each
/// run's jobs all queued before its worker registers. The first run's
/// durations are recorded in the store as a component records them; the
/// rerun's estimates come from there.
async fn first_waves(placement: Policy) -> (Vec<String>, Vec<String>) {
    let mut h = Harness::with_policy(placement).await;
    let mut jobs: Vec<(String, u32, u64)> = (0..7).map(|i| (format!("s{i}"), 1, 10_000)).collect();
    jobs.push(("tp".into(), 2, 10_000));
    jobs.push(("long".into(), 1, 60_000));
    let names: Vec<&str> = jobs.iter().map(|(n, _, _)| n.as_str()).collect();
    h.port("p", &names).await;
    let batch = || {
        jobs.iter()
            .map(|(n, g, _)| (n.clone(), *g, Placement::default(), BTreeMap::new()))
            .collect::<Vec<_>>()
    };
    let took = |id: &str| -> u64 {
        jobs.iter()
            .find(|(n, _, _)| id.starts_with(&format!("p.{n}.")))
            .map(|j| j.2)
            .unwrap()
    };
    let component = |id: &str| id.split('.').nth(1).unwrap().to_string();
    let mut waves = Vec::new();
    for run in ["w1", "w2"] {
        let queued = h.enqueue_many("p", batch()).await;
        h.settle().await;
        let mut w = h.worker(run, 4, 0);
        h.settle().await;
        let mut wave = Vec::new();
        while let Ok(ToWorker::Assign(a)) = w.try_recv() {
            wave.push((a.job_id, a.lease_epoch));
        }
        waves.push(wave.iter().map(|(id, _)| component(id)).collect::<Vec<_>>());
        // Run every job to its end, as its component would record it.
        let mut left = queued.len();
        let mut running = wave;
        while left > 0 {
            for (id, epoch) in running.drain(..) {
                let result = JobResult {
                    verdict: fvd_store::model::RecordedVerdict::NonSkipPass,
                    duration_ms: took(&id),
                    ..JobResult::default()
                };
                assert!(h.store.finish_job(&id, epoch, &result).await.unwrap());
                h.finished(run, &id, epoch);
                left -= 1;
            }
            if left > 0 {
                let (id, epoch, _) = next_assign(&mut w).await;
                running.push((id, epoch));
            }
        }
        h.settle().await;
        // This worker takes no more: the next run waits for the next one.
        h.sched
            .cast(SchedulerMsg::Drain {
                worker_id: run.into(),
            })
            .unwrap();
    }
    let rerun = waves.pop().unwrap();
    (waves.pop().unwrap(), rerun)
}

#[tokio::test]
async fn a_rerun_places_the_long_job_first() {
    // First run: nothing known, every job counts the same time, so the
    // 2-GPU job goes first and the long one waits its turn.
    let (first, rerun) = first_waves(Policy::ExpectedDuration).await;
    assert_eq!(first, ["tp", "s0", "s1"]);
    // Rerun: the store says long takes 60 s (60 GPU-s), tp 10 s on two
    // GPUs (20 GPU-s), the others 10: longest first, though long is
    // queued last and needs one GPU like most.
    assert_eq!(rerun, ["long", "tp", "s0"]);
    // The same rerun under FIFO: the first four queued, tp and long later.
    let (first, rerun) = first_waves(Policy::Fifo).await;
    assert_eq!(first, ["s0", "s1", "s2", "s3"]);
    assert_eq!(rerun, first);
}

#[tokio::test]
async fn a_small_job_is_passed_over_for_wider_ones_a_bounded_number_of_times() {
    let mut h = Harness::new().await;
    let names: Vec<String> = (0..12).map(|i| format!("wide{i}")).collect();
    let mut all: Vec<&str> = vec!["small"];
    all.extend(names.iter().map(String::as_str));
    h.port("p", &all).await;
    let small = h.enqueue("p", "small", 1).await;
    for n in &names {
        h.enqueue("p", n, 2).await;
    }
    h.settle().await;
    // Two GPUs: each wide job takes both, so while wide ones wait the
    // small one fits every time and is passed over.
    let mut w = h.worker("w", 2, 0);
    let mut order = Vec::new();
    while !order.contains(&small) {
        let (id, epoch, _) = next_assign(&mut w).await;
        order.push(id.clone());
        if id == small {
            break;
        }
        h.finished("w", &id, epoch);
        assert!(order.len() <= 12, "the small job starves: {order:?}");
    }
    assert_eq!(
        order.len(),
        fvd_actors::scheduler::MAX_BYPASS as usize + 1,
        "{order:?}"
    );
}

/// The randomized run on a large fleet: 2,000 workers of 1, 2, 4 or 8 GPUs
/// (every fifth labelled `pool=big` with 80 GiB GPUs, the others 24 GiB),
/// jobs of 0, 1, 2 and 8 GPUs, some asking for the label or for 40 GiB,
/// some excluding workers; midway workers drop and come back and others
/// drain. No GPU is leased twice, every lease honours the job's
/// constraints, nothing goes to a draining worker, and every job finishes
/// once.
#[tokio::test]
async fn no_gpu_is_ever_leased_twice_on_a_large_fleet_of_mixed_gangs() {
    let mut h = Harness::new().await;
    let mut rng = Lcg(7);
    let n_workers = 2000;
    // id -> (labelled big, GPU memory)
    let mut shape: HashMap<String, (bool, u64)> = HashMap::new();
    let mut conn: HashMap<String, u64> = HashMap::new();
    let mut rxs: BTreeMap<String, mpsc::Receiver<ToWorker>> = BTreeMap::new();
    for i in 0..n_workers {
        let id = format!("w{i:04}");
        let gpus = [1, 2, 4, 8][i % 4];
        let big = i % 5 == 0;
        let memory = if big { 80_000 } else { 24_000 };
        let labels: &[(&str, &str)] = if big { &[("pool", "big")] } else { &[] };
        rxs.insert(id.clone(), h.worker_with(&id, gpus, 1, memory, labels));
        shape.insert(id.clone(), (big, memory));
        conn.insert(id, h.conn);
    }
    let comps: Vec<String> = (0..40).map(|i| format!("c{i}")).collect();
    let comp_refs: Vec<&str> = comps.iter().map(String::as_str).collect();
    h.port("r", &comp_refs).await;
    let total = 12_000;
    let mut jobs = Vec::new();
    for i in 0..total {
        let need = [0, 1, 1, 1, 2, 2, 8][(rng.next() % 7) as usize];
        let placement = match rng.next() % 8 {
            0 => Placement {
                labels: [("pool".to_string(), "big".to_string())].into(),
                ..Placement::default()
            },
            1 => Placement {
                gpu_memory_mib: 40_000,
                ..Placement::default()
            },
            _ => Placement::default(),
        };
        // Some jobs exclude a few workers (of those that never reconnect).
        let exclude: BTreeMap<String, String> = if rng.next().is_multiple_of(10) {
            (0..3)
                .map(|_| {
                    (
                        format!("w{:04}", 1000 + rng.next() % 1000),
                        "environment".into(),
                    )
                })
                .collect()
        } else {
            BTreeMap::new()
        };
        jobs.push((comps[i % comps.len()].clone(), need, placement, exclude));
    }
    let wants: Vec<(u32, Placement, BTreeMap<String, String>)> = jobs
        .iter()
        .map(|(_, n, p, x)| (*n, p.clone(), x.clone()))
        .collect();
    let ids = h.enqueue_many("r", jobs).await;
    let want: HashMap<String, (u32, Placement, BTreeMap<String, String>)> =
        ids.into_iter().zip(wants).collect();

    let mut seen = Ledger::default();
    let mut draining: BTreeSet<String> = BTreeSet::new();
    let mut round = 0;
    while seen.finished.len() < total {
        round += 1;
        h.settle().await;
        let mut fresh = Vec::new();
        for (wid, rx) in rxs.iter_mut() {
            while let Ok(m) = rx.try_recv() {
                if let ToWorker::Assign(a) = m {
                    fresh.push((wid.clone(), a));
                }
            }
        }
        for (wid, a) in fresh {
            let (need, p, exclude) = &want[&a.job_id];
            let (big, memory) = shape[&wid];
            assert_eq!(a.gpus.len() as u32, *need, "{} got {:?}", a.job_id, a.gpus);
            assert!(
                !draining.contains(&wid),
                "{} went to draining {wid}",
                a.job_id
            );
            assert!(
                !exclude.contains_key(&wid),
                "{} went to excluded {wid}",
                a.job_id
            );
            if *need > 0 {
                assert!(memory >= p.gpu_memory_mib, "{} on {wid}", a.job_id);
            }
            assert!(
                p.labels.is_empty() || big,
                "{} on unlabelled {wid}",
                a.job_id
            );
            seen.hold(&wid, *a);
        }
        if round == 3 {
            // Twenty workers drop (their jobs go back to the queue) and
            // come back; ten others drain.
            for i in (1..=20).map(|k| k * 7) {
                let wid = format!("w{i:04}");
                h.sched
                    .cast(SchedulerMsg::WorkerDisconnected {
                        worker_id: wid.clone(),
                        conn: conn[&wid],
                    })
                    .unwrap();
                seen.held.retain(|(w, _), _| *w != wid);
                seen.running.retain(|r| r.0 != wid);
                let (big, memory) = shape[&wid];
                let gpus = [1, 2, 4, 8][i % 4];
                let labels: &[(&str, &str)] = if big { &[("pool", "big")] } else { &[] };
                rxs.insert(wid.clone(), h.worker_with(&wid, gpus, 1, memory, labels));
                conn.insert(wid, h.conn);
            }
            for i in (1..=10).map(|k| k * 11 + 500) {
                let wid = format!("w{i:04}");
                h.sched
                    .cast(SchedulerMsg::Drain {
                        worker_id: wid.clone(),
                    })
                    .unwrap();
                draining.insert(wid);
            }
            continue;
        }
        seen.finish_some(&h, &mut rng);
    }
    h.settle().await;
    let done = drain_finished(&mut h.events);
    assert_eq!(done.len(), total);
    assert_eq!(done.iter().collect::<BTreeSet<_>>().len(), total);
}

/// A single-GPU run of `mib` that may share its GPU (or not).
fn shared(mib: u64, share: bool) -> Placement {
    Placement {
        gpu_memory_mib: mib,
        gpu_share: share,
        ..Placement::default()
    }
}

/// The next `n` assignments of `rx`: job id → GPUs.
async fn assigns(rx: &mut mpsc::Receiver<ToWorker>, n: usize) -> BTreeMap<String, Vec<u32>> {
    let mut got = BTreeMap::new();
    for _ in 0..n {
        let (id, _, gpus) = next_assign(rx).await;
        got.insert(id, gpus);
    }
    got
}

#[tokio::test]
async fn sharing_runs_pack_onto_one_gpu_by_memory_and_keep_the_headroom() {
    let mut h = Harness::new().await;
    h.port("p", &["a", "b", "c", "d"]).await;
    let mut w = h.worker_with("w", 2, 1, 10_000, &[]);
    let mut ids = Vec::new();
    for c in ["a", "b", "c"] {
        ids.push(h.enqueue_with("p", c, 1, shared(3000, true)).await);
    }
    // 1000 MiB more would fit the card's 10000 but not its 9000 past the
    // default 10% headroom: it opens the second GPU.
    ids.push(h.enqueue_with("p", "d", 1, shared(1000, true)).await);
    let got = assigns(&mut w, 4).await;
    for id in &ids[..3] {
        assert_eq!(got[id], vec![0], "the three 3000 MiB runs share GPU 0");
    }
    assert_eq!(
        got[&ids[3]],
        vec![1],
        "the headroom keeps GPU 0 at 9000 MiB"
    );
}

#[tokio::test]
async fn a_shared_gpu_takes_at_most_the_cap_of_runs() {
    let mut h = Harness::new().await;
    h.port("p", &["a", "b", "c", "d", "e"]).await;
    let mut w = h.worker_with("w", 1, 1, 80_000, &[]);
    let mut ids = Vec::new();
    for c in ["a", "b", "c", "d", "e"] {
        ids.push(h.enqueue_with("p", c, 1, shared(1000, true)).await);
    }
    let mut epochs = BTreeMap::new();
    for _ in 0..4 {
        let (id, epoch, gpus) = next_assign(&mut w).await;
        assert_eq!(gpus, vec![0]);
        epochs.insert(id, epoch);
    }
    h.settle().await;
    assert!(w.try_recv().is_err(), "a fifth run waits: the cap is 4");
    assert!(!epochs.contains_key(&ids[4]));
    let (first, epoch) = epochs.iter().next().unwrap();
    h.finished("w", first, *epoch);
    let (id, _, gpus) = next_assign(&mut w).await;
    assert_eq!((id, gpus), (ids[4].clone(), vec![0]));
}

#[tokio::test]
async fn a_gang_gets_whole_gpus_never_beside_a_shared_run() {
    let mut h = Harness::new().await;
    h.port("p", &["small", "gang"]).await;
    let mut w = h.worker_with("w", 2, 1, 80_000, &[]);
    let small = h.enqueue_with("p", "small", 1, shared(1000, true)).await;
    let (id, epoch, gpus) = next_assign(&mut w).await;
    assert_eq!((id.as_str(), gpus), (small.as_str(), vec![0]));
    let gang = h.enqueue_with("p", "gang", 2, shared(1000, true)).await;
    h.settle().await;
    assert!(w.try_recv().is_err(), "GPU 0 is shared: the gang waits");
    h.finished("w", &small, epoch);
    let (id, _, gpus) = next_assign(&mut w).await;
    assert_eq!((id, gpus), (gang, vec![0, 1]));
}

#[tokio::test]
async fn a_run_that_must_be_alone_or_has_no_known_need_holds_its_gpu_alone() {
    let mut h = Harness::new().await;
    h.port("p", &["alone", "s1", "s2", "unknown"]).await;
    let mut w = h.worker_with("w", 1, 1, 80_000, &[]);
    let alone = h.enqueue_with("p", "alone", 1, shared(1000, false)).await;
    let (id, epoch, _) = next_assign(&mut w).await;
    assert_eq!(id, alone);
    let s1 = h.enqueue_with("p", "s1", 1, shared(1000, true)).await;
    h.settle().await;
    assert!(
        w.try_recv().is_err(),
        "nothing goes beside gpu_share = false"
    );
    h.finished("w", &alone, epoch);
    let (id, _, gpus) = next_assign(&mut w).await;
    assert_eq!((id.as_str(), gpus), (s1.as_str(), vec![0]));
    // A run without a known need waits for the GPU to be empty, while
    // another sharing run packs beside the first.
    let unknown = h.enqueue("p", "unknown", 1).await;
    let s2 = h.enqueue_with("p", "s2", 1, shared(1000, true)).await;
    let (id, _, gpus) = next_assign(&mut w).await;
    assert_eq!((id.as_str(), gpus), (s2.as_str(), vec![0]));
    h.settle().await;
    assert!(
        w.try_recv().is_err(),
        "a whole-GPU run never goes beside a shared one"
    );
    let _ = unknown;
}

/// The `shared` of each finished job's report, by job id, once `n` are in
/// (bounded wait).
async fn finished_shared(h: &mut Harness, n: usize) -> BTreeMap<String, Option<SharedGpu>> {
    finished_reports(h, n)
        .await
        .into_iter()
        .map(|(id, (_, shared))| (id, shared))
        .collect()
}

/// Each finished job's report and `shared`, by job id, once `n` are in
/// (bounded wait).
async fn finished_reports(
    h: &mut Harness,
    n: usize,
) -> BTreeMap<String, (JobReport, Option<SharedGpu>)> {
    let mut got = BTreeMap::new();
    while got.len() < n {
        match tokio::time::timeout(Duration::from_secs(5), h.events.recv()).await {
            Ok(Some(JobEvent::Finished { report, shared, .. })) => {
                got.insert(report.job_id.clone(), (report, shared));
            }
            Ok(Some(_)) => continue,
            other => panic!("expected {n} finished jobs, got {got:?} then {other:?}"),
        }
    }
    got
}

/// A finished run's report carries the memory of the GPU its lease held
/// (what bounds the ask its measured peak teaches its component, issue
/// #44); a CPU run's is 0, unknown.
#[tokio::test]
async fn a_finished_run_s_report_carries_the_memory_of_its_gpu() {
    let mut h = Harness::new().await;
    h.port("p", &["g", "c"]).await;
    let mut w = h.worker_with("w", 1, 1, 10_000, &[]);
    let g = h.enqueue("p", "g", 1).await;
    let (id, epoch, _) = next_assign(&mut w).await;
    assert_eq!(id, g);
    h.finished("w", &g, epoch);
    let c = h.enqueue("p", "c", 0).await;
    let (id, epoch, _) = next_assign(&mut w).await;
    assert_eq!(id, c);
    h.finished("w", &c, epoch);
    let got = finished_reports(&mut h, 2).await;
    assert_eq!(got[&g].0.gpu_memory_mib, 10_000);
    assert_eq!(got[&c].0.gpu_memory_mib, 0);
}

#[tokio::test]
async fn a_finished_run_says_whether_another_run_shared_its_gpu_while_it_ran() {
    let mut h = Harness::new().await;
    h.port("p", &["a", "b", "c", "d", "e"]).await;
    let mut w = h.worker_with("w", 1, 1, 10_000, &[]);
    // `a` runs alone on the GPU, though it may share: nothing was beside it.
    let a = h.enqueue_with("p", "a", 1, shared(2000, true)).await;
    let (_, ea, _) = next_assign(&mut w).await;
    h.finished("w", &a, ea);
    assert_eq!(finished_shared(&mut h, 1).await[&a], None);
    // `b` and `c` overlap: both shared it, though `b` ends before `d`
    // comes, and `d` then has `c` beside it.
    let b = h.enqueue_with("p", "b", 1, shared(2000, true)).await;
    let c = h.enqueue_with("p", "c", 1, shared(3000, true)).await;
    let mut epochs = BTreeMap::new();
    for _ in 0..2 {
        let (id, epoch, gpus) = next_assign(&mut w).await;
        assert_eq!(gpus, vec![0], "both share GPU 0");
        epochs.insert(id, epoch);
    }
    h.finished("w", &b, epochs[&b]);
    let ended = finished_shared(&mut h, 1).await;
    let gpu = |share_mib| {
        Some(SharedGpu {
            gpu: 0,
            memory_mib: 10_000,
            share_mib,
        })
    };
    assert_eq!(ended[&b], gpu(2000));
    let d = h.enqueue_with("p", "d", 1, shared(1000, true)).await;
    let (_, ed, _) = next_assign(&mut w).await;
    h.finished("w", &c, epochs[&c]);
    h.finished("w", &d, ed);
    let ended = finished_shared(&mut h, 2).await;
    assert_eq!((ended[&c], ended[&d]), (gpu(3000), gpu(1000)));
    // A run that must be alone never shared.
    let e = h.enqueue_with("p", "e", 1, shared(1000, false)).await;
    let (_, ee, _) = next_assign(&mut w).await;
    h.finished("w", &e, ee);
    assert_eq!(finished_shared(&mut h, 1).await[&e], None);
}

/// A run on a GPU in the randomized run: job, MiB, whether it shares.
type OnGpu = (String, u64, bool);

#[tokio::test]
async fn shared_gpus_stay_within_memory_cap_and_alone_over_a_randomized_run() {
    let mut h = Harness::new().await;
    let names: Vec<String> = (0..200).map(|i| format!("c{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    h.port("p", &refs).await;
    let mut rxs: Vec<(String, mpsc::Receiver<ToWorker>)> = (0..3)
        .map(|i| {
            let id = format!("w{i}");
            let rx = h.worker_with(&id, 2, 1, 10_000, &[]);
            (id, rx)
        })
        .collect();
    let mut rng = Lcg(44);
    let mut shape = BTreeMap::new();
    let mut jobs = Vec::new();
    for n in &names {
        let (gpus, p) = match rng.next() % 5 {
            0 => (1, Placement::default()),
            1 => (1, shared(1000 + rng.next() % 6000, false)),
            2 => (2, shared(1000, true)),
            _ => (1, shared(500 + rng.next() % 4000, true)),
        };
        shape.insert(
            n.clone(),
            (
                p.gpu_memory_mib,
                gpus == 1 && p.gpu_share && p.gpu_memory_mib > 0,
            ),
        );
        jobs.push((n.clone(), gpus, p, BTreeMap::new()));
    }
    let ids = h.enqueue_many("p", jobs).await;
    let component: HashMap<String, String> =
        ids.iter().cloned().zip(names.iter().cloned()).collect();
    // (worker, gpu) → the runs on it: (job, mib, shares).
    let mut on: HashMap<(String, u32), Vec<OnGpu>> = HashMap::new();
    let mut running: Vec<(String, String, u64, Vec<u32>)> = Vec::new();
    let mut done = 0;
    while done < ids.len() {
        h.settle().await;
        for (wid, rx) in rxs.iter_mut() {
            while let Ok(ToWorker::Assign(a)) = rx.try_recv() {
                let (mib, shares) = shape[&component[&a.job_id]];
                for g in &a.gpus {
                    let runs = on.entry((wid.clone(), *g)).or_default();
                    runs.push((a.job_id.clone(), mib, shares));
                    let all_share = runs.iter().all(|r| r.2);
                    assert!(
                        runs.len() == 1 || all_share,
                        "{wid} gpu {g}: a lone run beside another: {runs:?}"
                    );
                    assert!(runs.len() <= 4, "{wid} gpu {g}: past the cap: {runs:?}");
                    if runs.len() > 1 {
                        let sum: u64 = runs.iter().map(|r| r.1).sum();
                        assert!(sum <= 9000, "{wid} gpu {g}: {sum} MiB past the headroom");
                    }
                }
                running.push((wid.clone(), a.job_id, a.lease_epoch, a.gpus));
            }
        }
        assert!(!running.is_empty(), "jobs remain but nothing runs");
        let mut keep = Vec::new();
        for r in running.drain(..) {
            if rng.next().is_multiple_of(2) {
                for g in &r.3 {
                    on.get_mut(&(r.0.clone(), *g))
                        .unwrap()
                        .retain(|x| x.0 != r.1);
                }
                h.finished(&r.0, &r.1, r.2);
                done += 1;
            } else {
                keep.push(r);
            }
        }
        running = keep;
    }
}
