//! Scheduler throughput over real gRPC on loopback.
//!
//! Boots the orchestrator server (real tonic listener, real SQLite with
//! `synchronous=FULL`) in this process and W simulated workers of G GPUs in
//! a child process of this binary (`--sim`): they connect over the real
//! `Connect` protocol, heartbeat every second and answer every assignment at
//! once with started + finished (zero-length jobs). J jobs are enqueued
//! straight into the scheduler actor (their rows inserted in batches first,
//! as a port's components would), and it measures:
//!
//! * dispatches per second: J / (last result received − first enqueue);
//! * queue wait under that backlog: enqueue → the simulated worker
//!   receiving the `AssignJob`, p50 and p99 (most jobs wait for a slot);
//! * assignment latency of a job that has a free slot: once the backlog is
//!   done, probe jobs are enqueued at a steady 2,000 per second on the idle
//!   fleet (heartbeats still flowing), enqueue → `AssignJob`, p50 and p99;
//!   20,000 of them (`--probes N`), ten seconds: over two seconds the p99
//!   was the 40 slowest probes, and one stall of the machine decided it;
//! * CPU over the backlog by thread name (from `/proc/self/task`): the
//!   runtime's pool, SQLite's threads and the driver, each as a share of
//!   one core, with its busiest thread: what was busy while the rate was
//!   measured;
//! * peak RSS (`VmHWM`) of the orchestrator's process, and separately of the
//!   simulated workers' process, and the size of the database (with its
//!   WAL).
//!
//! Both processes share the machine's cores, as they would share nothing
//! on a real fleet; the two timestamps of a latency are taken from the same
//! system clock. The orchestrator's process also runs this driver, which
//! keeps 16 bytes per job (its enqueue and arrival times): each job's
//! record is rebuilt from its number when it is enqueued, not kept.
//!
//! What it does not include: classifying results and recording verdicts
//! (component actors), which a real port adds per job.
//!
//! Run one configuration:
//! `cargo bench -p fvd-orchestrator --bench scheduler -- [WORKERS] [GPUS] [JOBS] [--mix] [--deadline-s N] [--probes N]`
//! (defaults 1000 8 100000). `--mix`: jobs of 1, 2 and 8 GPUs (6:3:1), a
//! quarter of them asking for label `zone=a`, a quarter `zone=b`, the
//! workers labelled `zone=a` and `zone=b` in turn. `--deadline-s`: stop
//! after N seconds and report the rate so far (default 1800).
//!
//! The sweep: `cargo bench -p fvd-orchestrator --bench scheduler -- --sweep
//! [--sizes 1000,5000,10000] [--reps 2] [--deadline-s N] [--probes N]` runs each size ×
//! 8 GPUs with jobs = 5 × slots, one-GPU and mixed, each in its own process
//! (so each peak RSS is its own), `--reps` times, and prints a table.
//! `bench/scheduler_vs_ray.sh` runs one configuration beside Ray.

#[path = "../tests/support/sim_worker.rs"]
mod sim_worker;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fvd_actors::scheduler::{JobEvent, QueuedJob, SchedulerMsg};
use fvd_proto::v1 as pb;
use fvd_spec::Placement;
use fvd_store::Store;
use fvd_store::model::{JobRecord, JobState};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use sim_worker::SimWorker;
use tokio::sync::mpsc;
use tonic::transport::Channel;

/// Counts finished jobs and when the last one came in.
struct Sink;

#[derive(Default)]
struct Finishes {
    count: AtomicUsize,
    last: Mutex<Option<Instant>>,
}

impl Actor for Sink {
    type Msg = JobEvent;
    type State = Arc<Finishes>;
    type Arguments = Arc<Finishes>;

    async fn pre_start(
        &self,
        _me: ActorRef<Self::Msg>,
        f: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(f)
    }

    async fn handle(
        &self,
        _me: ActorRef<Self::Msg>,
        msg: JobEvent,
        f: &mut Arc<Finishes>,
    ) -> Result<(), ActorProcessingErr> {
        if let JobEvent::Finished { .. } = msg {
            *f.last.lock().expect("not poisoned") = Some(Instant::now());
            f.count.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// Nanoseconds since the Unix epoch: the clock both processes read.
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as u64
}

/// One simulated worker (the tests' [`SimWorker`]): registers, heartbeats
/// every second, and answers each assignment with started + finished at
/// once, after telling `assigned` the job's number (its component is
/// `c<number>`) and when the assignment arrived.
async fn sim_worker(
    channel: Channel,
    reg: pb::Register,
    assigned: mpsc::UnboundedSender<(u64, u64)>,
    registered: Arc<AtomicUsize>,
) {
    let mut w = SimWorker::connect(channel, None, reg)
        .await
        .expect("connect");
    registered.fetch_add(1, Ordering::SeqCst);
    let _heartbeat = w.heartbeat_every(Duration::from_millis(1000));
    while let Some(a) = w.next_assign().await {
        let at = now_ns();
        let n = a
            .component
            .strip_prefix('c')
            .and_then(|n| n.parse().ok())
            .expect("bench components are c<number>");
        let _ = assigned.send((n, at));
        let done = pb::JobFinished {
            exit_code: Some(0),
            ..Default::default()
        };
        w.run(&a, done).await;
    }
}

/// Positional argument `i` (flags and their values skipped).
fn arg(i: usize, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    let mut pos = Vec::new();
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
        } else if a.starts_with("--") {
            skip = matches!(
                a.as_str(),
                "--deadline-s" | "--sizes" | "--reps" | "--sim" | "--probes"
            );
        } else {
            pos.push(a);
        }
    }
    pos.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
}

fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

fn option(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[derive(Debug, Clone)]
struct Config {
    workers: usize,
    gpus: u32,
    jobs: usize,
    mix: bool,
    deadline: Duration,
    /// Jobs enqueued at 2,000 a second on the idle fleet after the backlog.
    probes: usize,
}

fn main() {
    let deadline = Duration::from_secs(
        option("--deadline-s")
            .and_then(|s| s.parse().ok())
            .unwrap_or(1800),
    );
    if flag("--sweep") {
        sweep(deadline);
        return;
    }
    let cfg = Config {
        workers: arg(1, 1000),
        gpus: arg(2, 8) as u32,
        jobs: arg(3, 100_000),
        mix: flag("--mix"),
        deadline,
        probes: option("--probes")
            .map(|s| s.parse().expect("--probes: a number"))
            .unwrap_or(20_000),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if let Some(url) = option("--sim") {
        rt.block_on(simulate(url, cfg));
    } else {
        rt.block_on(run(cfg));
    }
    // Whatever is still queued (a run stopped at its deadline) is not
    // waited for.
    std::process::exit(0);
}

/// Each configuration in a child process of this binary, so that each
/// peak RSS is its own; prints a markdown table of the `RESULT` lines.
fn sweep(deadline: Duration) {
    let sizes: Vec<usize> = option("--sizes")
        .unwrap_or_else(|| "1000,5000,10000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("--sizes: comma-separated numbers"))
        .collect();
    let reps: usize = option("--reps").and_then(|s| s.parse().ok()).unwrap_or(2);
    let exe = std::env::current_exe().expect("own path");
    println!(
        "| workers × GPUs | jobs | run | dispatches/s | queue wait p50 / p99 | free-slot assignment p50 / p99 | orchestrator peak RSS | workers' process | database |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for mix in [false, true] {
        for &w in &sizes {
            let jobs = 5 * w * 8;
            for rep in 1..=reps {
                let mut cmd = std::process::Command::new(&exe);
                cmd.args([
                    w.to_string(),
                    "8".into(),
                    jobs.to_string(),
                    "--deadline-s".into(),
                    deadline.as_secs().to_string(),
                ]);
                if mix {
                    cmd.arg("--mix");
                }
                if let Some(n) = option("--probes") {
                    cmd.args(["--probes".into(), n]);
                }
                let out = cmd.output().expect("run a configuration");
                let text = String::from_utf8_lossy(&out.stdout);
                let r: HashMap<&str, &str> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("RESULT "))
                    .filter_map(|l| l.split_once(' '))
                    .collect();
                let get = |k: &str| r.get(k).copied().unwrap_or("?");
                let stopped = if get("stopped") == "1" {
                    format!(
                        " (stopped at {} s, {} done)",
                        deadline.as_secs(),
                        get("done")
                    )
                } else {
                    String::new()
                };
                println!(
                    "| {w} × 8{} | {jobs} | {rep} | {}{stopped} | {} / {} ms | {} / {} ms | {} MB | {} MB | {} MB |",
                    if mix { " mixed" } else { "" },
                    get("fvd_dispatches_per_s"),
                    get("queue_wait_p50_ms"),
                    get("queue_wait_p99_ms"),
                    get("assign_p50_ms"),
                    get("assign_p99_ms"),
                    get("peak_rss_mb"),
                    get("workers_rss_mb"),
                    get("db_mb"),
                );
                if !out.status.success() {
                    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
                }
            }
        }
    }
}

/// Job `i`'s GPUs and placement.
fn job_shape(i: usize, mix: bool) -> (u32, Placement) {
    if !mix {
        return (1, Placement::default());
    }
    let need = [1, 1, 1, 1, 1, 1, 2, 2, 2, 8][i % 10];
    let labels = match (i / 10) % 4 {
        0 => [("zone".to_string(), "a".to_string())].into(),
        1 => [("zone".to_string(), "b".to_string())].into(),
        _ => BTreeMap::new(),
    };
    (
        need,
        Placement {
            labels,
            ..Placement::default()
        },
    )
}

/// Job `i`'s row before it is queued.
fn job_row(i: usize, mix: bool) -> JobRecord {
    JobRecord {
        family: format!("port{}", i % 5),
        component: format!("c{i}"),
        argv: vec!["true".into()],
        cwd: "/".into(),
        gpus_needed: job_shape(i, mix).0,
        timeout_ms: 60_000,
        ..JobRecord::default()
    }
}

/// Job `i` as `Store::queue_jobs` returned it (its first run, queued at
/// `queued_ms`): rebuilt when it is enqueued instead of kept from the
/// insert, so the driver holds no record per job.
fn queued_record(i: usize, mix: bool, queued_ms: i64) -> JobRecord {
    let row = job_row(i, mix);
    JobRecord {
        job_id: format!("{}.{}.1", row.family, row.component),
        run_no: 1,
        state: JobState::Queued,
        queued_ms,
        ..row
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p) as usize]
}

/// Peak resident set of this process (`VmHWM`), in MB.
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// The simulated workers' process: connects `workers` workers to `url`,
/// prints `ready` once all are registered, then `a <job number> <arrival
/// ns>` per assignment; when its stdin closes it prints `rss <peak MB>` and
/// ends.
async fn simulate(url: String, cfg: Config) {
    let Config {
        workers, gpus, mix, ..
    } = cfg;
    // Streams share a few HTTP/2 connections, as many pods behind one
    // node would not; it keeps the file descriptors of one process in bounds.
    let conns = workers.div_ceil(50).max(1);
    let mut channels = Vec::new();
    for _ in 0..conns {
        channels.push(
            Channel::from_shared(url.clone())
                .expect("url")
                .connect()
                .await
                .expect("channel"),
        );
    }
    let (atx, mut arx) = mpsc::unbounded_channel::<(u64, u64)>();
    let registered = Arc::new(AtomicUsize::new(0));
    for w in 0..workers {
        let id = format!("sim{w:05}");
        let mut reg = sim_worker::register(&id, gpus, 1);
        if mix {
            let zone = if w % 2 == 0 { "a" } else { "b" };
            reg.labels.insert("zone".into(), zone.into());
        }
        fvd_telemetry::spawn(sim_worker(
            channels[w % conns].clone(),
            reg,
            atx.clone(),
            registered.clone(),
        ));
    }
    drop(atx);
    let t = Instant::now();
    while registered.load(Ordering::SeqCst) < workers {
        assert!(
            t.elapsed() < Duration::from_secs(600),
            "workers did not register"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut out = std::io::BufWriter::new(std::io::stdout());
    writeln!(out, "ready").expect("stdout");
    out.flush().expect("stdout");
    // The parent closes our stdin when it has what it measures.
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        let _ = done_tx.send(());
    });
    let mut batch = Vec::new();
    loop {
        tokio::select! {
            n = arx.recv_many(&mut batch, 4096) => {
                if n == 0 {
                    break;
                }
                for (job, at) in batch.drain(..) {
                    writeln!(out, "a {job} {at}").expect("stdout");
                }
                out.flush().expect("stdout");
            }
            _ = &mut done_rx => break,
        }
    }
    writeln!(out, "rss {:.0}", peak_rss_mb()).expect("stdout");
    out.flush().expect("stdout");
}

/// The workers' process and what it reports.
struct Fleet {
    child: std::process::Child,
    /// Per job number, when its assignment arrived (ns; 0: not yet).
    arrived: Arc<Vec<AtomicU64>>,
    /// Its peak RSS, once it said.
    rss: Arc<Mutex<Option<String>>>,
    reader: std::thread::JoinHandle<()>,
}

/// Starts the simulated workers' process and waits until every worker is
/// registered with the scheduler.
async fn start_fleet(
    cfg: &Config,
    url: &str,
    jobs: usize,
    server: &fvd_orchestrator::Server,
) -> Fleet {
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("own path"));
    cmd.args([
        cfg.workers.to_string(),
        cfg.gpus.to_string(),
        "0".into(),
        "--sim".into(),
        url.to_string(),
    ]);
    if cfg.mix {
        cmd.arg("--mix");
    }
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the simulated workers");
    let stdout = child.stdout.take().expect("piped");
    let arrived: Arc<Vec<AtomicU64>> = Arc::new((0..jobs).map(|_| AtomicU64::new(0)).collect());
    let rss = Arc::new(Mutex::new(None));
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
    let reader = {
        let arrived = arrived.clone();
        let rss = rss.clone();
        std::thread::spawn(move || {
            let mut ready = Some(ready_tx);
            for line in std::io::BufReader::new(stdout).lines() {
                let line = line.expect("the workers' output");
                let mut f = line.split(' ');
                match f.next() {
                    Some("ready") => {
                        if let Some(r) = ready.take() {
                            let _ = r.send(());
                        }
                    }
                    Some("a") => {
                        let job: usize = f.next().and_then(|n| n.parse().ok()).expect("job");
                        let at: u64 = f.next().and_then(|n| n.parse().ok()).expect("time");
                        arrived[job].store(at, Ordering::Relaxed);
                    }
                    Some("rss") => {
                        *rss.lock().expect("not poisoned") = f.next().map(str::to_string)
                    }
                    _ => panic!("unexpected line from the workers: {line}"),
                }
            }
        })
    };
    ready_rx
        .await
        .expect("the workers' process registered them all");
    // The scheduler has taken every registration in before timing starts.
    let registered = server
        .scheduler
        .call(
            |reply| SchedulerMsg::WhenWorkers {
                workers: cfg.workers,
                reply,
            },
            Some(Duration::from_secs(600)),
        )
        .await
        .expect("the scheduler answers");
    assert!(
        matches!(registered, ractor::rpc::CallResult::Success(())),
        "the scheduler did not see every worker register"
    );
    Fleet {
        child,
        arrived,
        rss,
        reader,
    }
}

/// Milliseconds from each enqueue to its arrival, sorted (jobs that did not
/// arrive left out).
fn waits(enqueued: &[(usize, u64)], arrived: &[AtomicU64]) -> Vec<f64> {
    let mut w: Vec<f64> = enqueued
        .iter()
        .filter_map(|&(i, at)| {
            let got = arrived[i].load(Ordering::Relaxed);
            (got != 0).then(|| got.saturating_sub(at) as f64 / 1e6)
        })
        .collect();
    w.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    w
}

/// What the backlog phase measured.
struct Backlog {
    /// Jobs finished, at most the backlog's.
    done: usize,
    /// Seconds from the first enqueue to the last finish (or the deadline).
    secs: f64,
    /// Whether the deadline came first.
    stopped: bool,
    /// Milliseconds from each job's enqueue to its arrival, sorted.
    wait: Vec<f64>,
    /// CPU seconds this process's threads spent over the backlog, by
    /// thread name, busiest first ([`cpu_between`]).
    cpu: Vec<ThreadCpu>,
}

/// CPU seconds (user + system) of each live thread of this process, by
/// thread id: its name and its time so far.
fn thread_cpu() -> HashMap<u64, (String, f64)> {
    // USER_HZ: 100 on every Linux architecture we build for.
    const TICKS: f64 = 100.0;
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in dir.flatten() {
        let Ok(tid) = t.file_name().to_string_lossy().parse::<u64>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        // The name is in parentheses and may hold spaces: fields after
        // the last ')' are state, ppid, ...; utime and stime are the
        // 12th and 13th of them.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let name = head.split_once('(').map_or("", |(_, n)| n).to_string();
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
        out.insert(tid, (name, (ticks(11) + ticks(12)) / TICKS));
    }
    out
}

/// What the threads of one name spent over a window.
#[derive(Default)]
struct ThreadCpu {
    name: String,
    threads: usize,
    /// CPU seconds of them all.
    secs: f64,
    /// CPU seconds of the busiest one.
    max: f64,
}

/// What each thread name spent between two [`thread_cpu`] readings,
/// busiest first. Digits ending a name are dropped so a pool's threads
/// add up under one name.
fn cpu_between(
    before: &HashMap<u64, (String, f64)>,
    after: &HashMap<u64, (String, f64)>,
) -> Vec<ThreadCpu> {
    let mut by: BTreeMap<String, ThreadCpu> = BTreeMap::new();
    for (tid, (name, secs)) in after {
        let spent = secs - before.get(tid).map_or(0.0, |(_, s)| *s);
        let key = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '-');
        let e = by.entry(key.to_string()).or_insert_with(|| ThreadCpu {
            name: key.to_string(),
            ..ThreadCpu::default()
        });
        e.threads += 1;
        e.secs += spent;
        e.max = e.max.max(spent);
    }
    let mut v: Vec<_> = by.into_values().collect();
    v.sort_by(|a, b| b.secs.total_cmp(&a.secs));
    v
}

/// Stores `total` job rows in batches of 10,000, as ports' components
/// would have queued them, checking each stored row; keeps only each
/// batch's queue time.
async fn queue_rows(store: &Store, total: usize, mix: bool) -> Vec<i64> {
    let mut queued_ms = Vec::new();
    for start in (0..total).step_by(10_000) {
        let end = (start + 10_000).min(total);
        let batch: Vec<JobRecord> = (start..end).map(|i| job_row(i, mix)).collect();
        let stored = store.queue_jobs(&batch).await.expect("queue rows");
        for (i, r) in (start..end).zip(&stored) {
            assert_eq!(
                r,
                &queued_record(i, mix, r.queued_ms),
                "job {i}'s stored row"
            );
        }
        queued_ms.push(stored[0].queued_ms);
    }
    queued_ms
}

/// The scheduler's `Enqueue` for job `i`, its finish told to `sink`.
fn enqueue(i: usize, mix: bool, queued_ms: &[i64], sink: &ActorRef<JobEvent>) -> SchedulerMsg {
    SchedulerMsg::Enqueue(Box::new(QueuedJob {
        record: queued_record(i, mix, queued_ms[i / 10_000]).into(),
        env: BTreeMap::new(),
        secret_env: Vec::new(),
        notify: sink.get_derived(),
        collect_env: None,
        compare: None,
        exclude: Default::default(),
        preflight: Vec::new(),
        fvd_writes: Vec::new(),
        warm: None,
        agent: None,
        placement: job_shape(i, mix).1,
        span: tracing::Span::none(),
    }))
}

/// Phase 1: the backlog of `jobs`, all at once, until every one finished
/// or `deadline` passed; then each finished job's arrival is waited for.
async fn run_backlog(
    server: &fvd_orchestrator::Server,
    finishes: &Finishes,
    arrived: &[AtomicU64],
    jobs: usize,
    deadline: Duration,
    queued: impl Fn(usize) -> SchedulerMsg,
) -> Backlog {
    let mut enqueued: Vec<(usize, u64)> = Vec::with_capacity(jobs);
    let cpu_before = thread_cpu();
    let start = Instant::now();
    for i in 0..jobs {
        enqueued.push((i, now_ns()));
        server.scheduler.cast(queued(i)).expect("enqueue");
    }
    let mut stopped = false;
    while finishes.count.load(Ordering::SeqCst) < jobs {
        if start.elapsed() > deadline {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let done = finishes.count.load(Ordering::SeqCst).min(jobs);
    let end = if stopped {
        Instant::now()
    } else {
        finishes
            .last
            .lock()
            .expect("not poisoned")
            .unwrap_or_else(Instant::now)
    };
    let secs = end.duration_since(start).as_secs_f64();
    let cpu = cpu_between(&cpu_before, &thread_cpu());
    // A job's arrival is reported before its result, so every finished
    // job's arrival is in (or on its way through the pipe: waited for).
    let t = Instant::now();
    while enqueued
        .iter()
        .filter(|&&(i, _)| arrived[i].load(Ordering::Relaxed) != 0)
        .count()
        < done
        && t.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let wait = waits(&enqueued, arrived);
    Backlog {
        done,
        secs,
        stopped,
        wait,
        cpu,
    }
}

/// Phase 2: `probes` jobs on the idle fleet, 2 every millisecond; the
/// milliseconds each waited for its worker, sorted.
async fn run_probes(
    server: &fvd_orchestrator::Server,
    finishes: &Finishes,
    arrived: &[AtomicU64],
    jobs: usize,
    probes: usize,
    queued: impl Fn(usize) -> SchedulerMsg,
) -> Vec<f64> {
    let mut sent: Vec<(usize, u64)> = Vec::with_capacity(probes);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut it = jobs..jobs + probes;
    'probes: loop {
        tick.tick().await;
        for _ in 0..2 {
            let Some(i) = it.next() else {
                break 'probes;
            };
            sent.push((i, now_ns()));
            server.scheduler.cast(queued(i)).expect("enqueue");
        }
    }
    let t = Instant::now();
    while (finishes.count.load(Ordering::SeqCst) < jobs + probes
        || sent
            .iter()
            .any(|&(i, _)| arrived[i].load(Ordering::Relaxed) == 0))
        && t.elapsed() < Duration::from_secs(120)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    waits(&sent, arrived)
}

/// Tells the workers' process to stop and waits for it; its own peak RSS
/// in MB, as it reported it ("?" when it did not).
fn stop_fleet(mut fleet: Fleet) -> String {
    // The workers' process reports its own peak once told to stop.
    drop(fleet.child.stdin.take());
    let _ = fleet.child.wait();
    let _ = fleet.reader.join();
    fleet
        .rss
        .lock()
        .expect("not poisoned")
        .clone()
        .unwrap_or_else(|| "?".into())
}

/// Prints what one run measured: the summary for people, then the
/// `RESULT` lines for scripts.
fn report(
    cfg: &Config,
    registration: Duration,
    backlog: &Backlog,
    lat: &[f64],
    rss: f64,
    workers_rss: &str,
    db_bytes: u64,
) {
    let Config {
        workers,
        gpus,
        jobs,
        mix,
        deadline,
        ..
    } = cfg.clone();
    let Backlog {
        done,
        secs,
        stopped,
        ref wait,
        ref cpu,
    } = *backlog;
    let rate = done as f64 / secs;
    println!(
        "fvd scheduler: {workers} workers x {gpus} GPUs, {jobs} zero-length {} jobs over loopback gRPC (registration {:.1} s)",
        if mix { "1/2/8-GPU labelled" } else { "1-GPU" },
        registration.as_secs_f64()
    );
    if stopped {
        println!("  stopped at the {} s deadline", deadline.as_secs());
    }
    println!("  {done} jobs in {secs:.2} s, {rate:.0} dispatches/s");
    // Which threads of the orchestrator's process were busy: a pool at
    // cores x 100% or one thread near 100% bounds the rate. The scheduler
    // actor is a task that moves between the runtime's threads: its time
    // is in the pool's total, never in one thread's.
    let pct = |s: f64| 100.0 * s / secs;
    let busy: Vec<&ThreadCpu> = cpu.iter().filter(|t| t.secs >= 0.01 * secs).collect();
    let said: Vec<String> = busy
        .iter()
        .map(|t| {
            format!(
                "{} x{} {:.0}% (busiest {:.0}%)",
                t.name,
                t.threads,
                pct(t.secs),
                pct(t.max)
            )
        })
        .collect();
    println!("  CPU over the backlog, by thread: {}", said.join(", "));
    for t in busy {
        println!(
            "RESULT cpu_pct_{} {:.0} {:.0}",
            t.name,
            pct(t.secs),
            pct(t.max)
        );
    }
    println!(
        "  queue wait under the backlog (enqueue -> worker receives AssignJob): p50 {:.1} ms, p99 {:.1} ms",
        percentile(wait, 0.5),
        percentile(wait, 0.99)
    );
    println!(
        "  assignment latency with a free slot ({} probes at 2,000/s): p50 {:.2} ms, p99 {:.2} ms",
        lat.len(),
        percentile(lat, 0.5),
        percentile(lat, 0.99)
    );
    println!(
        "  peak RSS: orchestrator {rss:.0} MB, simulated workers {workers_rss} MB; database {:.0} MB",
        db_bytes as f64 / 1e6
    );
    println!("RESULT fvd_dispatches_per_s {rate:.1}");
    println!("RESULT done {done}");
    println!("RESULT stopped {}", u8::from(stopped));
    println!("RESULT queue_wait_p50_ms {:.0}", percentile(wait, 0.5));
    println!("RESULT queue_wait_p99_ms {:.0}", percentile(wait, 0.99));
    println!("RESULT assign_p50_ms {:.2}", percentile(lat, 0.5));
    println!("RESULT assign_p99_ms {:.2}", percentile(lat, 0.99));
    println!("RESULT peak_rss_mb {rss:.0}");
    println!("RESULT workers_rss_mb {workers_rss}");
    println!("RESULT db_mb {:.0}", db_bytes as f64 / 1e6);
}

/// One run: a server and its simulated fleet, the backlog, then the
/// probes when the backlog finished in time; reports what it measured.
async fn run(cfg: Config) {
    let Config {
        jobs,
        mix,
        deadline,
        probes,
        ..
    } = cfg.clone();
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("bench.db");
    let store = Store::open_path(&db).await.expect("store");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let server = fvd_orchestrator::start(listener, store.clone(), Default::default())
        .await
        .expect("server");
    let t = Instant::now();
    let fleet = start_fleet(&cfg, &server.url(), jobs + probes, &server).await;
    let registration = t.elapsed();

    let finishes = Arc::new(Finishes::default());
    let (sink, _) = Actor::spawn(None, Sink, finishes.clone())
        .await
        .expect("sink");

    // Rows first, in batches, as ports' components would have queued them;
    // only each batch's queue time is kept.
    let queued_ms = queue_rows(&store, jobs + probes, mix).await;
    let queued = |i: usize| enqueue(i, mix, &queued_ms, &sink);

    let backlog = run_backlog(&server, &finishes, &fleet.arrived, jobs, deadline, queued).await;
    let mut lat = Vec::new();
    if !backlog.stopped {
        lat = run_probes(&server, &finishes, &fleet.arrived, jobs, probes, queued).await;
    }

    let db_bytes: u64 = ["bench.db", "bench.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(dir.path().join(f)).ok())
        .map(|m| m.len())
        .sum();
    let rss = peak_rss_mb();
    let workers_rss = stop_fleet(fleet);
    report(
        &cfg,
        registration,
        &backlog,
        &lat,
        rss,
        &workers_rss,
        db_bytes,
    );
    if !backlog.stopped {
        server.shutdown().await;
    }
}
