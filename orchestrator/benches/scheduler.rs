//! Scheduler throughput over real gRPC on loopback.
//!
//! Boots the orchestrator server (real tonic listener, real SQLite with
//! `synchronous=FULL`), connects W simulated workers of G GPUs each over the
//! real `Connect` protocol (they answer every assignment at once with
//! started + finished: zero-length jobs), enqueues J one-GPU jobs straight
//! into the scheduler actor (the jobs' rows are inserted in batches first, as
//! a port's components would), and measures:
//!
//! * dispatches per second: J / (last result received − first enqueue);
//! * assignment latency: enqueue → the simulated worker receiving the
//!   `AssignJob`, p50 and p99.
//!
//! What it does not include: classifying results and recording verdicts
//! (component actors), which a real port adds per job.
//!
//! Run: `cargo bench -p fvd-orchestrator --bench scheduler -- [WORKERS] [GPUS] [JOBS]`
//! (defaults 1000 8 100000). `bench/scheduler_vs_ray.sh` runs it beside Ray.

#[path = "../tests/support/sim_worker.rs"]
mod sim_worker;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fvd_actors::scheduler::{JobEvent, QueuedJob, SchedulerMsg};
use fvd_proto::v1 as pb;
use fvd_spec::Placement;
use fvd_store::Store;
use fvd_store::model::JobRecord;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use sim_worker::SimWorker;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;

/// Counts finished jobs and fires when all are in.
struct Sink;

struct SinkState {
    want: usize,
    seen: usize,
    done: Option<oneshot::Sender<Instant>>,
}

impl Actor for Sink {
    type Msg = JobEvent;
    type State = SinkState;
    type Arguments = (usize, oneshot::Sender<Instant>);

    async fn pre_start(
        &self,
        _me: ActorRef<Self::Msg>,
        (want, done): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(SinkState {
            want,
            seen: 0,
            done: Some(done),
        })
    }

    async fn handle(
        &self,
        _me: ActorRef<Self::Msg>,
        msg: JobEvent,
        st: &mut SinkState,
    ) -> Result<(), ActorProcessingErr> {
        if let JobEvent::Finished { .. } = msg {
            st.seen += 1;
            if st.seen == st.want
                && let Some(tx) = st.done.take()
            {
                let _ = tx.send(Instant::now());
            }
        }
        Ok(())
    }
}

/// One simulated worker (the tests' [`SimWorker`]): registers, heartbeats
/// every second, and answers each assignment with started + finished at
/// once.
async fn sim_worker(
    channel: Channel,
    id: String,
    gpus: u32,
    assigned: mpsc::UnboundedSender<(String, Instant)>,
    registered: Arc<AtomicUsize>,
) {
    let mut w = SimWorker::connect(channel, None, sim_worker::register(&id, gpus, 1))
        .await
        .expect("connect");
    registered.fetch_add(1, Ordering::SeqCst);
    let _heartbeat = w.heartbeat_every(Duration::from_millis(1000));
    while let Some(a) = w.next_assign().await {
        let _ = assigned.send((a.job_id.clone(), Instant::now()));
        let done = pb::JobFinished {
            exit_code: Some(0),
            ..Default::default()
        };
        w.run(&a, done).await;
    }
}

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .filter(|a| !a.starts_with('-'))
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let workers = arg(1, 1000);
    let gpus = arg(2, 8) as u32;
    let jobs = arg(3, 100_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(workers, gpus, jobs));
}

async fn run(workers: usize, gpus: u32, jobs: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_path(&dir.path().join("bench.db"))
        .await
        .expect("store");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let server = fvd_orchestrator::start(listener, store.clone(), Default::default())
        .await
        .expect("server");

    // Streams share a few HTTP/2 connections, as many pods behind one
    // node would not; it keeps the file descriptors of one process in bounds.
    let conns = workers.div_ceil(50).max(1);
    let mut channels = Vec::new();
    for _ in 0..conns {
        channels.push(
            Channel::from_shared(server.url())
                .expect("url")
                .connect()
                .await
                .expect("channel"),
        );
    }
    let (atx, mut arx) = mpsc::unbounded_channel();
    let registered = Arc::new(AtomicUsize::new(0));
    for w in 0..workers {
        fvd_telemetry::spawn(sim_worker(
            channels[w % conns].clone(),
            format!("sim{w:04}"),
            gpus,
            atx.clone(),
            registered.clone(),
        ));
    }
    drop(atx);
    let t = Instant::now();
    while registered.load(Ordering::SeqCst) < workers {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "workers did not register"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let the scheduler take in every registration before timing starts.
    let _ = ractor::call_t!(server.scheduler, SchedulerMsg::Counts, 60_000);

    let (done_tx, done_rx) = oneshot::channel();
    let (sink, _) = Actor::spawn(None, Sink, (jobs, done_tx))
        .await
        .expect("sink");

    // Rows first, in batches, as ports' components would have queued them.
    let mut records = Vec::with_capacity(jobs);
    for chunk in (0..jobs).collect::<Vec<_>>().chunks(10_000) {
        let batch: Vec<JobRecord> = chunk
            .iter()
            .map(|i| JobRecord {
                family: format!("port{}", i % 5),
                component: format!("c{i}"),
                argv: vec!["true".into()],
                cwd: "/".into(),
                gpus_needed: 1,
                timeout_ms: 60_000,
                ..JobRecord::default()
            })
            .collect();
        records.extend(store.queue_jobs(&batch).await.expect("queue rows"));
    }

    let mut enqueued: HashMap<String, Instant> = HashMap::with_capacity(jobs);
    let start = Instant::now();
    for r in records {
        enqueued.insert(r.job_id.clone(), Instant::now());
        server
            .scheduler
            .cast(SchedulerMsg::Enqueue(Box::new(QueuedJob {
                record: r,
                env: BTreeMap::new(),
                secret_env: Vec::new(),
                notify: sink.get_derived(),
                collect_env: None,
                compare: None,
                exclude: Default::default(),
                preflight: Vec::new(),
                warm: None,
                fvd_writes: Vec::new(),
                placement: Placement::default(),
                span: tracing::Span::none(),
            })))
            .expect("enqueue");
    }
    let end = tokio::time::timeout(Duration::from_secs(1800), done_rx)
        .await
        .expect("all jobs finish within 30 minutes")
        .expect("sink alive");
    let mut lat: Vec<f64> = Vec::with_capacity(jobs);
    while let Ok((id, at)) = arx.try_recv() {
        if let Some(q) = enqueued.get(&id) {
            lat.push(at.duration_since(*q).as_secs_f64() * 1000.0);
        }
    }
    lat.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let pct = |p: f64| lat[((lat.len() as f64 - 1.0) * p) as usize];
    let secs = end.duration_since(start).as_secs_f64();
    println!(
        "fvd scheduler: {workers} workers x {gpus} GPUs, {jobs} zero-length 1-GPU jobs over loopback gRPC"
    );
    println!("  wall {secs:.2} s, {:.0} dispatches/s", jobs as f64 / secs);
    println!(
        "  assignment latency (enqueue -> worker receives AssignJob): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        pct(0.5),
        pct(0.99),
        lat[lat.len() - 1]
    );
    println!("RESULT fvd_dispatches_per_s {:.1}", jobs as f64 / secs);
    server.shutdown().await;
}
