//! The worker's side of the `Connect` stream: dial the orchestrator,
//! register, heartbeat, run assigned jobs, and reconnect with backoff when
//! the orchestrator goes away.
//!
//! Wire (prost) types are converted here, at the edge, to the exec module's
//! own types.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fvd_proto::auth::{ClientAuth, Token};
use fvd_proto::v1 as pb;
use fvd_proto::v1::worker_service_client::WorkerServiceClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::code::{self, Chunk, CodeCache, JobCode, Provide};
use crate::exec::{self, JobEvent, JobSpec, JunitFile, OutputStream};
use crate::gpu::GpuInfo;
use crate::health::{Link, LinkReporter};
pub(crate) use crate::wire::msg;
use crate::wire::{self, Assignment, Finished, JunitStatus};

/// How a worker presents itself and where it runs jobs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// `http://HOST:PORT` of the orchestrator.
    pub orchestrator: String,
    pub worker_id: String,
    pub host: String,
    /// Scratch space: one folder per job for its JUnit file and plugin.
    pub workspace: PathBuf,
    pub gpus: Vec<GpuInfo>,
    pub cpu_slots: u32,
    pub labels: HashMap<String, String>,
    /// Between SIGTERM and SIGKILL when a job is stopped.
    pub grace: Duration,
    /// Longest wait between two connection attempts.
    pub max_backoff: Duration,
    /// Bearer token presented on every call, when the orchestrator wants one.
    pub token: Option<Token>,
    /// CA certificate (PEM) for an `https://` orchestrator.
    pub tls_ca: Option<Vec<u8>>,
    /// Paths this worker has for jobs whose spec lists them in
    /// `worker_paths` (`--provide PATH=DIR`), registered with the
    /// orchestrator and linked into the checkouts of code by commit.
    pub provides: Vec<Provide>,
    /// Cap of the checkouts' total size in `WORKSPACE/code`
    /// (`--code-cache-mib`); least recently used ones go first.
    pub code_cache_bytes: u64,
    /// The jail jobs, preflights and zygotes start in (`--job-sandbox`).
    pub jail: fvd_sandbox::Jail,
    /// Most bytes of a run's output sent to the orchestrator, head and
    /// tail kept (`--max-output-mib`, [`exec::DEFAULT_MAX_OUTPUT_BYTES`]).
    pub max_output_bytes: u64,
    /// The CUDA MPS daemon GPU jobs connect to (`--mps`); none by default.
    pub mps: Option<crate::mps::Mps>,
}

impl WorkerConfig {
    /// What every job of this worker may see of it: the allow-listed
    /// variables of its environment, and its token among the secrets to
    /// redact.
    fn job_sandbox(&self) -> exec::JobSandbox {
        let mut secrets = fvd_contracts::redactor::Redactor::default();
        if let Some(t) = &self.token {
            secrets.add(TOKEN_NAME, t.value().as_bytes());
        }
        exec::JobSandbox {
            base_env: fvd_sandbox::env::inherited(),
            secrets,
            jail: self.jail.clone(),
            mps: self.mps.clone(),
        }
    }

    /// The secrets this worker redacts from what any job sends back.
    pub(crate) fn job_secrets(&self) -> fvd_contracts::redactor::Redactor {
        self.job_sandbox().secrets
    }

    /// Whether `value` is this worker's credential (a spec naming the
    /// variable that holds it gets nothing).
    fn is_credential(&self, value: &str) -> bool {
        self.token.as_ref().is_some_and(|t| t.verify(value))
    }
}

/// How the worker's token is named where it is redacted.
pub const TOKEN_NAME: &str = "fvd-token";

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Endpoint(#[from] fvd_proto::transport::EndpointError),
    #[error("orchestrator {url} refused the registration: {status}")]
    Refused { url: String, status: tonic::Status },
    #[error(transparent)]
    Code(#[from] code::CodeError),
}

/// How long a worker whose id is taken keeps trying before it gives up:
/// longer than the orchestrator's default lease TTL (5 s), after which a
/// worker that died unnoticed is no longer alive to it.
const ID_TAKEN_WAIT: Duration = Duration::from_secs(10);

/// Jobs running on this worker: their lease and how to cancel them.
type Running = Arc<Mutex<HashMap<String, (u64, CancellationToken)>>>;

/// Outcome of each port's preflight on this worker, by (port, argv): run
/// once, by the first job that needs it; jobs that arrive meanwhile wait
/// for the same run. Lives as long as the worker process: a restarted
/// worker (perhaps with its environment fixed) checks again.
type Preflights =
    Arc<Mutex<HashMap<(String, Vec<String>), Arc<tokio::sync::OnceCell<Result<(), String>>>>>>;

/// Where jobs send their messages: the stream of the current session, or,
/// while there is none (the orchestrator restarting, a partition), a
/// buffer sent first on the next one. A job outlives the session that
/// assigned it, so an orchestrator that restarted can adopt it: its start,
/// output and result reach the new process. Output buffered meanwhile is
/// capped ([`OUTBOX_LOG_BYTES`]); starts and results are always kept.
#[derive(Clone, Default)]
pub(crate) struct Outbox(Arc<tokio::sync::Mutex<OutboxState>>);

#[derive(Default)]
struct OutboxState {
    tx: Option<mpsc::Sender<pb::WorkerMsg>>,
    pending: std::collections::VecDeque<pb::WorkerMsg>,
    log_bytes: usize,
    dropped: u64,
}

/// Most bytes of job output buffered while no session is up.
const OUTBOX_LOG_BYTES: usize = 8 * 1024 * 1024;

impl Outbox {
    pub(crate) async fn send(&self, m: pb::WorkerMsg) {
        let mut st = self.0.lock().await;
        let m = match &st.tx {
            Some(tx) => match tx.send(m).await {
                Ok(()) => return,
                Err(mpsc::error::SendError(m)) => {
                    st.tx = None;
                    m
                }
            },
            None => m,
        };
        if let Some(pb::worker_msg::Msg::JobLog(l)) = &m.msg {
            if st.log_bytes + l.data.len() > OUTBOX_LOG_BYTES {
                st.dropped += l.data.len() as u64;
                return;
            }
            st.log_bytes += l.data.len();
        }
        st.pending.push_back(m);
    }

    /// A session is up: what was buffered goes first, in order.
    async fn attach(&self, tx: mpsc::Sender<pb::WorkerMsg>) {
        let mut st = self.0.lock().await;
        if st.dropped > 0 {
            tracing::warn!(
                bytes = st.dropped,
                "job output produced while the orchestrator was unreachable was over the buffer and is lost"
            );
        }
        while let Some(m) = st.pending.pop_front() {
            if let Err(mpsc::error::SendError(m)) = tx.send(m).await {
                st.pending.push_front(m);
                return;
            }
        }
        st.log_bytes = 0;
        st.dropped = 0;
        st.tx = Some(tx);
    }

    async fn detach(&self) {
        self.0.lock().await.tx = None;
    }

    /// Jobs whose end waits here for a session: a registration lists them
    /// with the running ones, so a job that ended while the orchestrator
    /// was away is adopted by its result rather than run again.
    async fn ended_unsent(&self) -> Vec<pb::RunningJob> {
        let st = self.0.lock().await;
        st.pending
            .iter()
            .filter_map(|m| match &m.msg {
                Some(pb::worker_msg::Msg::JobFinished(f)) => Some(pb::RunningJob {
                    job_id: f.job_id.clone(),
                    lease_epoch: f.lease_epoch,
                }),
                _ => None,
            })
            .collect()
    }
}

/// Code fetches waiting for their `CodeChunk`s, by request id.
type Fetches = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<Chunk>>>>;

/// What a session hands every job: its code cache and open fetches.
#[derive(Clone)]
pub(crate) struct CodeLink {
    pub(crate) cache: Arc<CodeCache>,
    fetches: Fetches,
    /// Where agent attempts' tunnels dial (a channel of their own).
    pub(crate) endpoint: tonic::transport::Endpoint,
}

/// Serves the orchestrator until `shutdown` is cancelled or, once `drain`
/// is cancelled, until the jobs it runs have finished and been reported (no
/// new job is taken meanwhile); reconnects with exponential backoff (100 ms
/// doubling up to `max_backoff`).
///
/// On `shutdown` (SIGTERM: a preemption, the end of an allocation, a pod
/// deleted) the worker stops: it takes no new job, ends the running ones
/// and hands them back: their results are not sent (a run cut short is no
/// verdict), and closing the stream makes the orchestrator queue them again
/// at once, before the lease would expire.
pub async fn run(
    config: WorkerConfig,
    shutdown: CancellationToken,
    drain: CancellationToken,
) -> Result<(), ClientError> {
    run_reporting(config, shutdown, drain, LinkReporter::default()).await
}

/// [`run`], telling `link` how the connection stands (for the health
/// service, [`crate::health`]).
pub async fn run_reporting(
    config: WorkerConfig,
    shutdown: CancellationToken,
    drain: CancellationToken,
    link: LinkReporter,
) -> Result<(), ClientError> {
    let served = serve(config, shutdown, drain, link).await;
    // The warm runner's zygotes end with the worker (they also end by
    // themselves when its process is gone).
    crate::zygote::shutdown();
    served
}

async fn serve(
    config: WorkerConfig,
    shutdown: CancellationToken,
    drain: CancellationToken,
    link: LinkReporter,
) -> Result<(), ClientError> {
    let endpoint = fvd_proto::transport::endpoint(&config.orchestrator, config.tls_ca.as_deref())?;
    // Before any job: what earlier workers of this workspace left running
    // (their reaper gone with them) is ended, and this worker's own jobs
    // get a reaper that outlives it.
    let ws = config.workspace.clone();
    if let Ok(swept) = fvd_telemetry::spawn_blocking(move || crate::leftovers::sweep(&ws)).await
        && !swept.is_empty()
    {
        tracing::warn!(workspace = %config.workspace.display(), ended = ?swept, "ended processes an earlier worker of this workspace left running");
    }
    let _reaper = match crate::leftovers::Reaper::start(&crate::leftovers::marker(
        &config.workspace,
    )) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the reaper of this worker's jobs: if this worker is killed, its jobs are ended only when a worker starts on this workspace again");
            None
        }
    };
    let running: Running = Arc::default();
    let outbox = Outbox::default();
    let preflights: Preflights = Arc::default();
    let code = CodeLink {
        cache: CodeCache::open(
            &config.workspace,
            config.code_cache_bytes,
            config.provides.clone(),
        )
        .await?,
        fetches: Arc::default(),
        endpoint: endpoint.clone(),
    };
    let mut backoff = Duration::from_millis(100);
    // When the orchestrator first said this worker's id is taken.
    let mut taken_since: Option<Instant> = None;
    loop {
        if shutdown.is_cancelled() {
            link.set(Link::Stopping);
            end_jobs(&config, &running).await;
            return Ok(());
        }
        let started = Instant::now();
        let outcome = session(
            &config,
            endpoint.clone(),
            &running,
            &outbox,
            &preflights,
            &code,
            &shutdown,
            &drain,
            &link,
        )
        .await;
        // Fetches of the lost stream get no more chunks: they fail now.
        code.fetches.lock().expect("fetches lock").clear();
        link.set(if shutdown.is_cancelled() {
            Link::Stopping
        } else if drain.is_cancelled() {
            Link::Draining
        } else {
            Link::Connecting
        });
        match outcome {
            Ok(()) => return Ok(()),
            // Its id is held by a live worker: perhaps this worker's own
            // previous process, killed a moment ago and not yet seen gone
            // by the orchestrator (its lease expires within its TTL).
            Err(Session::Refused(status))
                if status.code() == tonic::Code::AlreadyExists
                    && taken_since.get_or_insert_with(Instant::now).elapsed() < ID_TAKEN_WAIT =>
            {
                tracing::warn!(worker = %config.worker_id, why = %status.message(), "worker id taken; trying again in case it is this worker's previous process");
            }
            Err(Session::Refused(status)) => {
                return Err(ClientError::Refused {
                    url: config.orchestrator.clone(),
                    status,
                });
            }
            Err(Session::Lost(why)) => {
                tracing::warn!(orchestrator = %config.orchestrator, %why, "connection lost; reconnecting");
            }
        }
        // A session that lived a while resets the backoff.
        if started.elapsed() > Duration::from_secs(10) {
            backoff = Duration::from_millis(100);
            taken_since = None;
        }
        tokio::select! {
            _ = shutdown.cancelled() => {
                link.set(Link::Stopping);
                // Jobs that outlived the lost connection: their leases
                // expire at the orchestrator, which queues them again.
                end_jobs(&config, &running).await;
                return Ok(());
            }
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(config.max_backoff);
    }
}

enum Session {
    Refused(tonic::Status),
    Lost(String),
}

#[allow(clippy::too_many_arguments)]
async fn session(
    config: &WorkerConfig,
    endpoint: tonic::transport::Endpoint,
    running: &Running,
    outbox: &Outbox,
    preflights: &Preflights,
    code: &CodeLink,
    shutdown: &CancellationToken,
    drain: &CancellationToken,
    link: &LinkReporter,
) -> Result<(), Session> {
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| Session::Lost(format!("connect: {e}")))?;
    let mut client =
        WorkerServiceClient::with_interceptor(channel, ClientAuth::new(config.token.clone()));
    let (tx, rx) = mpsc::channel::<pb::WorkerMsg>(256);
    let mut reg = register(config, running);
    reg.running.extend(outbox.ended_unsent().await);
    tx.send(msg(pb::worker_msg::Msg::Register(reg)))
        .await
        .map_err(|_| Session::Lost("stream closed".into()))?;
    let mut inbound = match client.connect(ReceiverStream::new(rx)).await {
        Ok(r) => r.into_inner(),
        Err(status) if refused(&status) => return Err(Session::Refused(status)),
        // A reset connection, a proxy's error, an orchestrator restarting:
        // tried again with backoff.
        Err(status) => return Err(Session::Lost(status.to_string())),
    };
    // Registered: what the jobs said meanwhile goes first.
    outbox.attach(tx.clone()).await;
    let served = serve_session(
        config,
        &tx,
        &mut inbound,
        running,
        outbox,
        preflights,
        code,
        shutdown,
        drain,
        link,
    )
    .await;
    outbox.detach().await;
    served?;
    // Drained or stopped. Close our side and wait (bounded) for the
    // orchestrator to close its side: it reads our last results before it
    // sees the end, so none is lost to the disconnect, and it queues again
    // the jobs handed back.
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(_)) = inbound.message().await {}
    })
    .await;
    Ok(())
}

/// One registered session, until it is lost (`Err`) or the worker has
/// drained or stopped (`Ok`).
#[allow(clippy::too_many_arguments)]
async fn serve_session(
    config: &WorkerConfig,
    tx: &mpsc::Sender<pb::WorkerMsg>,
    inbound: &mut tonic::Streaming<pb::OrchestratorMsg>,
    running: &Running,
    outbox: &Outbox,
    preflights: &Preflights,
    code: &CodeLink,
    shutdown: &CancellationToken,
    drain: &CancellationToken,
    link: &LinkReporter,
) -> Result<(), Session> {
    let mut heartbeat = tokio::time::interval(Duration::from_secs(1));
    let mut drain_sent = false;
    loop {
        tokio::select! {
            _ = drain.cancelled(), if !drain_sent => {
                drain_sent = true;
                link.set(Link::Draining);
                tracing::info!(worker = %config.worker_id, "draining: no new jobs; leaving once the running ones finish");
                if tx.send(msg(pb::worker_msg::Msg::Drain(pb::Drain {}))).await.is_err() {
                    return Err(Session::Lost("stream closed".into()));
                }
            }
            _ = shutdown.cancelled() => {
                link.set(Link::Stopping);
                // No new job meanwhile (best effort: the stream may be gone).
                if !drain_sent {
                    let _ = tx.send(msg(pb::worker_msg::Msg::Drain(pb::Drain {}))).await;
                }
                // Ended before the stream closes: the orchestrator may place
                // them elsewhere at once.
                let jobs = end_jobs(config, running).await;
                if !jobs.is_empty() {
                    tracing::info!(worker = %config.worker_id, ?jobs, "stopping: ended the running jobs and handed them back to the orchestrator, which queues them again");
                }
                break;
            }
            _ = heartbeat.tick() => {
                if drain_sent && running.lock().expect("running lock").is_empty() {
                    break;
                }
                let jobs = running
                    .lock()
                    .expect("running lock")
                    .iter()
                    .map(|(id, (epoch, _))| pb::RunningJob { job_id: id.clone(), lease_epoch: *epoch })
                    .collect();
                if tx.send(msg(pb::worker_msg::Msg::Heartbeat(pb::Heartbeat { running: jobs }))).await.is_err() {
                    return Err(Session::Lost("stream closed".into()));
                }
            }
            next = inbound.message() => {
                match next {
                    Ok(Some(m)) => {
                        if matches!(m.msg, Some(pb::orchestrator_msg::Msg::Registered(_))) && !drain.is_cancelled() {
                            link.set(Link::Registered);
                        }
                        handle(config, m, outbox, running, preflights, code, shutdown)
                    }
                    Ok(None) => return Err(Session::Lost("orchestrator closed the stream".into())),
                    Err(status) => return Err(Session::Lost(status.to_string())),
                }
            }
        }
    }
    Ok(())
}

/// Whether the orchestrator refused this worker for good: a token it does
/// not take, or its worker id held by another live worker. Every other
/// status (a TCP reset during the registration, `Unknown`, `Internal`,
/// `Unavailable`) is a transport error, retried with backoff: one reset
/// used to make a worker exit 2.
fn refused(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied | tonic::Code::AlreadyExists
    )
}

fn register(config: &WorkerConfig, running: &Running) -> pb::Register {
    pb::Register {
        incarnation: crate::leftovers::incarnation(),
        running: running
            .lock()
            .expect("running lock")
            .iter()
            .map(|(id, (epoch, _))| pb::RunningJob {
                job_id: id.clone(),
                lease_epoch: *epoch,
            })
            .collect(),
        worker_id: config.worker_id.clone(),
        host: config.host.clone(),
        gpus: config
            .gpus
            .iter()
            .map(|g| pb::Gpu {
                index: g.index,
                uuid: g.uuid.clone(),
                name: g.name.clone(),
                memory_mib: g.memory_mib.unwrap_or(0),
            })
            .collect(),
        cpu_slots: config.cpu_slots,
        labels: config.labels.clone(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        provides: config.provides.iter().map(|p| p.path.clone()).collect(),
    }
}

fn handle(
    config: &WorkerConfig,
    m: pb::OrchestratorMsg,
    tx: &Outbox,
    running: &Running,
    preflights: &Preflights,
    code: &CodeLink,
    stopping: &CancellationToken,
) {
    match m.msg {
        Some(pb::orchestrator_msg::Msg::Registered(r)) => {
            tracing::info!(worker = %config.worker_id, lease_ttl_ms = r.lease_ttl_ms, "registered");
        }
        Some(pb::orchestrator_msg::Msg::CodeChunk(c)) => {
            let mut fetches = code.fetches.lock().expect("fetches lock");
            let done = c.last || !c.error.is_empty();
            if let Some(to) = fetches.get(&c.request_id) {
                let _ = to.send(Chunk {
                    data: c.data,
                    last: c.last,
                    error: c.error,
                });
            }
            if done {
                fetches.remove(&c.request_id);
            }
        }
        Some(pb::orchestrator_msg::Msg::AssignJob(a)) => {
            start_job(
                config,
                wire::assignment(a),
                tx,
                running,
                preflights,
                code,
                stopping,
            );
        }
        Some(pb::orchestrator_msg::Msg::CancelJob(c)) => {
            let guard = running.lock().expect("running lock");
            match guard.get(&c.job_id) {
                Some((epoch, cancel)) if *epoch == c.lease_epoch => {
                    tracing::info!(job = %c.job_id, reason = %c.reason, "cancelling job");
                    cancel.cancel();
                }
                _ => {
                    tracing::warn!(job = %c.job_id, "cancel for a job not running here under that lease")
                }
            }
        }
        None => {}
    }
}

/// Starts an assigned job in a task of its own, under its `job.run` span:
/// an agent attempt, or a run of a test on its code (placed here first,
/// its port's preflight run once), whose result goes back unless the
/// worker's stop cut it short.
fn start_job(
    config: &WorkerConfig,
    mut a: Assignment,
    tx: &Outbox,
    running: &Running,
    preflights: &Preflights,
    code: &CodeLink,
    stopping: &CancellationToken,
) {
    let cancel = CancellationToken::new();
    running
        .lock()
        .expect("running lock")
        .insert(a.job_id.clone(), (a.lease_epoch, cancel.clone()));
    let config = config.clone();
    let tx = tx.clone();
    let running = running.clone();
    let stopping = stopping.clone();
    let code = code.clone();
    let preflight = (!a.preflight.is_empty()).then(|| {
        preflights
            .lock()
            .expect("preflights lock")
            .entry((a.preflight_key.clone(), a.preflight.clone()))
            .or_default()
            .clone()
    });
    // The worker's side of the job, a child of the orchestrator's
    // `job` span whose context came with the assignment.
    let span = tracing::info_span!(
        parent: None,
        "job.run",
        otel.kind = "consumer",
        "fvd.family" = %a.family,
        "fvd.component" = %a.component,
        "fvd.job_id" = %a.job_id,
        "fvd.lease_epoch" = a.lease_epoch as i64,
        "fvd.worker_id" = %config.worker_id,
        "fvd.gpus" = a.gpus.len() as i64,
        "fvd.gpu_uuids" = %gpu_uuids(&config, &a.gpus),
        "fvd.exit_code" = tracing::field::Empty,
        "fvd.duration_ms" = tracing::field::Empty,
        "fvd.run.peak_gpu_mib" = tracing::field::Empty,
    );
    fvd_telemetry::set_parent(&span, &a.traceparent);
    let _entered = span.enter();
    fvd_telemetry::spawn(async move {
        let job_id = a.job_id.clone();
        if a.agent.is_some() {
            // An agent attempt: its own checkout, its commit back.
            let finished = crate::attempt::run(&config, a, &tx, &code, cancel).await;
            running.lock().expect("running lock").remove(&job_id);
            if handed_back(&finished, &stopping).await {
                tracing::info!(job = %job_id, "agent attempt cut short by the worker's stop: no result sent");
                return;
            }
            tx.send(wire::finished_msg(finished)).await;
            return;
        }
        // The job's code: its checkout if this worker sees it at
        // the job's commit, else a checkout of its own (held until
        // the job ends).
        let placed = place(&code, &a, &tx, &cancel).await;
        let _checkout = match placed {
            Ok(p) => {
                a.cwd = p.cwd.to_string_lossy().into_owned();
                p.checkout
            }
            Err(why) => {
                tracing::warn!(job = %job_id, %why, "the job's code is not available here");
                running.lock().expect("running lock").remove(&job_id);
                let finished = Finished::refused(&a, why);
                if !handed_back(&finished, &stopping).await {
                    tx.send(wire::finished_msg(finished)).await;
                }
                return;
            }
        };
        let finished = match preflight {
            Some(cell) => {
                let outcome = cell
                    .get_or_init(|| preflight_check(&config, &a))
                    .await
                    .clone();
                match outcome {
                    Ok(()) => run_assigned(&config, a, &tx, cancel, None).await,
                    Err(why) => Finished {
                        preflight_error: why,
                        ..Finished::refused(&a, String::new())
                    },
                }
            }
            None => run_assigned(&config, a, &tx, cancel, None).await,
        };
        fvd_telemetry::spans::job_ended(
            &tracing::Span::current(),
            &fvd_telemetry::spans::JobEnd {
                exit_code: finished.exit_code,
                signal: finished.signal,
                timed_out: finished.timed_out,
                cancelled: finished.cancelled,
                error: if finished.spawn_error.is_empty() {
                    &finished.preflight_error
                } else {
                    &finished.spawn_error
                },
            },
        );
        running.lock().expect("running lock").remove(&job_id);
        if handed_back(&finished, &stopping).await {
            tracing::info!(job = %job_id, "job cut short by the worker's stop: no result sent; the orchestrator queues it again");
            return;
        }
        tx.send(wire::finished_msg(finished)).await;
    });
}

/// Where the job runs (see [`crate::code`]); fetches the commit over the
/// stream when the worker lacks it.
/// A pending code fetch: the stream of its pack's chunks.
type Fetching<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<mpsc::UnboundedReceiver<Chunk>, String>>
            + Send
            + 'a,
    >,
>;

/// Asks the orchestrator for the assignment's commit over the stream,
/// given the commits the clone holds.
pub(crate) fn code_fetch<'a>(
    code: &'a CodeLink,
    a: &'a Assignment,
    tx: &'a Outbox,
) -> impl FnMut(Vec<String>) -> Fetching<'a> + 'a {
    move |have: Vec<String>| {
        Box::pin(async move {
            let id = NEXT_FETCH.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (to, from) = mpsc::unbounded_channel();
            code.fetches.lock().expect("fetches lock").insert(id, to);
            let ask = pb::FetchCode {
                request_id: id,
                job_id: a.job_id.clone(),
                commit: a.commit.clone(),
                have,
            };
            tx.send(msg(pb::worker_msg::Msg::FetchCode(ask))).await;
            Ok::<_, String>(from)
        })
    }
}

/// What the worker does about the code of an assignment.
pub(crate) fn job_code(a: &Assignment) -> JobCode {
    JobCode {
        job_id: a.job_id.clone(),
        cwd: a.cwd.clone(),
        commit: a.commit.clone(),
        prefix: a.code_prefix.clone(),
        worker_paths: a.worker_paths.clone(),
        fvd_writes: a.fvd_writes.clone(),
    }
}

async fn place(
    code: &CodeLink,
    a: &Assignment,
    tx: &Outbox,
    cancel: &CancellationToken,
) -> Result<code::Placed, String> {
    let job = job_code(a);
    let fetch = code_fetch(code, a, tx);
    let placed = code.cache.place(&job, fetch, cancel).await?;
    tracing::info!(job = %a.job_id, mode = ?placed.mode, cwd = %placed.cwd.display(), "the job's code is placed");
    Ok(placed)
}

/// Request ids of code fetches, unique in this process.
static NEXT_FETCH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Cancels every running job and waits (bounded) until their process groups
/// are gone: no test outlives a worker that was stopped. Returns their ids.
async fn end_jobs(config: &WorkerConfig, running: &Running) -> Vec<String> {
    let jobs: Vec<String> = {
        let running = running.lock().expect("running lock");
        for (_, (_, cancel)) in running.iter() {
            cancel.cancel();
        }
        running.keys().cloned().collect()
    };
    let deadline = Instant::now() + config.grace + Duration::from_secs(5);
    while !running.lock().expect("running lock").is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    jobs
}

/// Slurm (and a container runtime at the end of its grace period) signals
/// every process of a job at once: a test may die of the same SIGTERM a
/// moment before this worker hears of its own stop. A run that ended
/// without a result of its own waits this long for that stop.
const STOP_SETTLE: Duration = Duration::from_secs(1);

/// Whether a job's result is withheld because the worker is stopping: a
/// run cut short (cancelled, signalled, no report) while it stops is no
/// verdict and goes back to the queue; a run that finished by itself (its
/// exit code and report, or its timeout) is sent as usual.
async fn handed_back(f: &Finished, stopping: &CancellationToken) -> bool {
    let finished_by_itself = f.timed_out
        || (f.exit_code.is_some()
            && !f.cancelled
            && f.junit_error.is_empty()
            && f.spawn_error.is_empty()
            && f.preflight_error.is_empty());
    if finished_by_itself {
        return false;
    }
    if stopping.is_cancelled() {
        return true;
    }
    // Killed by a signal, or ended without its report (a launcher that
    // turns SIGTERM into an exit code): perhaps the stop's signal.
    let cut_short = !f.cancelled && (f.signal.is_some() || !f.junit_error.is_empty());
    cut_short
        && tokio::time::timeout(STOP_SETTLE, stopping.cancelled())
            .await
            .is_ok()
}

/// Longest a preflight may take.
const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs an assignment's preflight in its working directory and in the
/// worker's jail, with the job's environment (the worker's allow-listed
/// variables, the assignment's literal ones and those it passes by name):
/// `Err` with one line saying why when it does not start, exits non-zero
/// or outlives its timeout. The line is redacted like a job's output.
async fn preflight_check(config: &WorkerConfig, a: &Assignment) -> Result<(), String> {
    let shown = a.preflight.join(" ");
    let sandbox = config.job_sandbox();
    let mut env: std::collections::BTreeMap<String, String> =
        sandbox.base_env.iter().cloned().collect();
    env.extend(
        a.env
            .iter()
            .map(|(k, v)| (k.clone(), v.replace(REPO_DIR, &a.cwd))),
    );
    let mut secrets = sandbox.secrets.clone();
    for name in &a.secret_env {
        if let Ok(v) = std::env::var(name)
            && !config.is_credential(&v)
        {
            secrets.add(name, v.as_bytes());
            env.insert(name.clone(), v);
        }
    }
    let found = fvd_sandbox::jail::resolve(
        &a.preflight[0],
        env.get("PATH").map(String::as_str),
        std::path::Path::new(&a.cwd),
    );
    if found.is_none() {
        return Err(format!(
            "preflight `{shown}` could not start: {} not found",
            a.preflight[0]
        ));
    }
    let jail = sandbox
        .jail
        .read_only(&fvd_git::git_paths(Path::new(&a.cwd)));
    let mut cmd = tokio::process::Command::from(jail.command(&a.preflight));
    cmd.current_dir(&a.cwd)
        .env_clear()
        .envs(&env)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .process_group(0);
    let out = match tokio::time::timeout(PREFLIGHT_TIMEOUT, cmd.output()).await {
        Err(_) => {
            return Err(format!(
                "preflight `{shown}` did not finish in {} s",
                PREFLIGHT_TIMEOUT.as_secs()
            ));
        }
        Ok(Err(e)) => return Err(format!("preflight `{shown}` could not start: {e}")),
        Ok(Ok(out)) => out,
    };
    if out.status.success() {
        tracing::info!(port = %a.preflight_key, preflight = %shown, "preflight passed");
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stdout));
    let text = secrets.text(&text);
    let last = text
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("no output");
    let code = out
        .status
        .code()
        .map_or("a signal".to_string(), |c| format!("exit {c}"));
    let why = format!("preflight `{shown}` failed ({code}): {last}");
    tracing::warn!(port = %a.preflight_key, %why, "preflight failed: this worker takes no job of the port");
    Err(why)
}

/// Placeholder for the collected folder in an assignment's literal env.
pub const COLLECT_DIR: &str = "{collect_dir}";
/// Placeholder for the job's checkout (its working directory) in an
/// assignment's argv and literal env (`PYTHONPATH = "{repo}"`).
pub const REPO_DIR: &str = "{repo}";

/// What an agent attempt's run adds to a job's: its stdin, and its stdout
/// kept (the last [`AGENT_STDOUT_BYTES`], redacted) for its result.
#[derive(Debug, Default)]
pub(crate) struct AgentIo {
    pub stdin: Option<Vec<u8>>,
    pub stdout: Arc<Mutex<Vec<u8>>>,
    /// Read-only to the agent, but for `writable` (issue #39: it writes its
    /// checkout and its own files, not the worker's workspace).
    pub read_only: Vec<PathBuf>,
    pub writable: Vec<PathBuf>,
}

/// Most bytes of an agent's stdout kept for its result (the last ones: a
/// CLI's final JSON event is its last line).
pub(crate) const AGENT_STDOUT_BYTES: usize = 4 * 1024 * 1024;

/// Runs one assignment to its end and builds the `JobFinished` report.
pub(crate) async fn run_assigned(
    config: &WorkerConfig,
    a: Assignment,
    tx: &Outbox,
    cancel: CancellationToken,
    agent_io: Option<&AgentIo>,
) -> Finished {
    let mut finished = Finished {
        job_id: a.job_id.clone(),
        lease_epoch: a.lease_epoch,
        ..Default::default()
    };
    let env = job_env(config, &a);
    let argv = a.argv.iter().map(|x| x.replace(REPO_DIR, &a.cwd)).collect();
    // The git folders around the job's folder are read-only to it (issue
    // #38): nothing it writes there can change what fvd's own git does
    // later. A warm run's zygote serves every checkout of a repository, so
    // its jail protects the repository's folders only; a checkout's `.git`
    // file is then never followed by the worker ([`crate::code`]).
    let git_paths = fvd_git::git_paths(Path::new(&a.cwd));
    let repo_dirs: Vec<PathBuf> = git_paths.iter().filter(|p| p.is_dir()).cloned().collect();
    let scratch = match scratch_dir(&config.workspace, &a.job_id, a.lease_epoch) {
        Ok(s) => s,
        Err(e) => {
            finished.spawn_error = format!("job id refused: {e}");
            return finished;
        }
    };
    if let Err(e) = tokio::fs::create_dir_all(&scratch).await {
        finished.spawn_error = format!("cannot prepare {}: {e}", scratch.display());
        return finished;
    }
    let mut sandbox = config.job_sandbox();
    sandbox.jail = sandbox.jail.read_only(&git_paths);
    if let Some(io) = agent_io {
        sandbox.jail = sandbox.jail.read_only(&io.read_only).writable(&io.writable);
    } else if !a.warm {
        // A test writes its checkout, its own scratch folder and the
        // worker's HOME and TMPDIR when they are in the workspace; the rest
        // of the workspace (other jobs' folders, the code store, the
        // worker's files) is read-only to it (issue #39).
        sandbox.jail = sandbox
            .jail
            .read_only(std::slice::from_ref(&config.workspace))
            .writable(&test_writable(
                &config.workspace,
                &scratch,
                Path::new(&a.cwd),
            ));
    }
    let mut spec = JobSpec {
        job_id: a.job_id.clone(),
        argv,
        env,
        secret_env_names: a.secret_env,
        sandbox,
        cwd: PathBuf::from(&a.cwd),
        gpus: a.gpus,
        timeout: Duration::from_millis(a.timeout_ms),
        grace: config.grace,
        junit: None,
        warm: None,
        stdin: agent_io.and_then(|io| io.stdin.clone()),
    };
    if a.warm {
        // The zygote's jail serves every checkout; each test it forks gets
        // the cold test's write rules in a Landlock domain of its own.
        let writable = test_writable(&config.workspace, &scratch, Path::new(&a.cwd));
        spec.warm = Some(crate::zygote::WarmSpec {
            preload: a.preload.clone(),
            unkeyed_paths: vec![scratch.clone()],
            dir: config.workspace.join("zygotes"),
            jail: config.jail.read_only(&repo_dirs),
            write_beneath: warm_write_rules(&config.workspace, &writable),
        });
    }
    if a.collect_junit
        && let Err(e) = exec::prepare_pytest(&mut spec, &scratch).await
    {
        finished.spawn_error = format!("cannot prepare {}: {e}", scratch.display());
        return finished;
    }
    // A folder of this worker's own for the job's files (a traced rerun's
    // rank files): empty at the start, read back and sent after the run.
    let collect_dir = match collect_dir(&mut spec, &a.collect_env, &scratch).await {
        Ok(d) => d,
        Err(why) => {
            finished.spawn_error = why;
            return finished;
        }
    };
    let secrets = exec::redactor(&spec);
    let (etx, erx) = mpsc::channel::<JobEvent>(64);
    let forward = forward_events(tx, &a.job_id, a.lease_epoch, agent_io, erx);
    let (gpus, warm) = (spec.gpus.len(), spec.warm.is_some());
    let outcome = exec::run_job_capped(spec, etx, cancel, config.max_output_bytes).await;
    // Every log chunk leaves before the result does.
    let _ = forward.await;
    record_outcome(&mut finished, outcome, warm, gpus);
    if let Some(dir) = &collect_dir {
        collect_and_compare(&mut finished, dir, a.compare, secrets).await;
    }
    if a.collect_junit || collect_dir.is_some() {
        // The scratch folder only held the plugin, the report and the
        // collected files, all read.
        let _ = tokio::fs::remove_dir_all(&scratch).await;
    }
    finished
}

/// The job's environment: its literal variables (`{repo}` filled in), the
/// trace context, the secrets its spec names read here (never the worker's
/// own credential) and the marker that finds its processes.
fn job_env(config: &WorkerConfig, a: &Assignment) -> Vec<(String, String)> {
    // Secret values are read here, on the worker, and nowhere else.
    let mut env: Vec<(String, String)> =
        a.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    // The test process joins the port's trace under this worker's span; if
    // this worker does not export, the orchestrator's context still joins.
    let traceparent = fvd_telemetry::current_traceparent()
        .or_else(|| (!a.traceparent.is_empty()).then(|| a.traceparent.clone()));
    if let Some(tp) = traceparent {
        env.push((fvd_telemetry::TRACEPARENT.to_string(), tp));
    }
    // `{repo}` in the argv or a literal value is the checkout the job
    // tests (its working directory here), which only this worker knows.
    for (_, value) in env.iter_mut() {
        *value = value.replace(REPO_DIR, &a.cwd);
    }
    let mut withheld = Vec::new();
    for name in &a.secret_env {
        if let Ok(v) = std::env::var(name) {
            // A spec may name any variable; it never gets the worker's own
            // credential (`--token-env FVD_TOKEN`, `env = ["FVD_TOKEN"]`).
            if config.is_credential(&v) {
                withheld.push(name.clone());
                continue;
            }
            env.push((name.clone(), v));
        }
    }
    if !withheld.is_empty() {
        tracing::warn!(job = %a.job_id, variables = ?withheld, "the spec names the worker's own credential: not passed to the test");
    }
    // Finds the job's processes if this worker dies ([`crate::leftovers`]).
    env.push((
        crate::leftovers::WORKER_ENV.to_string(),
        crate::leftovers::marker(&config.workspace),
    ));
    // Under MPS, a run sharing its GPU is capped at its share (after the
    // spec's own variables: the spec cannot lift it).
    if let Some(mps) = &config.mps {
        env.extend(mps.memory_limit(a.shared_mib()));
    }
    // A run sharing its GPU gets its part of the host's cores, unless the
    // spec or this worker's own environment sets the count.
    let set = |name: &str| env.iter().any(|(k, _)| k == name) || std::env::var_os(name).is_some();
    if a.shared_mib().is_some() && !set(crate::gpu::THREADS_VAR) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let n = crate::gpu::shared_run_threads(cores, config.gpus.len(), a.share_cap).to_string();
        env.push((crate::gpu::THREADS_VAR.to_string(), n.clone()));
        env.push((crate::gpu::THREADS_SET_BY_FVD.to_string(), n));
    }
    env
}

/// The folder a job's files are gathered in, named to it by `var` (and
/// in literal values naming `{collect_dir}`); `None` when it gathers none.
async fn collect_dir(
    spec: &mut JobSpec,
    var: &str,
    scratch: &Path,
) -> Result<Option<PathBuf>, String> {
    if var.is_empty() {
        return Ok(None);
    }
    let dir = std::path::absolute(scratch.join("collect")).unwrap_or(scratch.join("collect"));
    let _ = tokio::fs::remove_dir_all(&dir).await;
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| format!("cannot prepare {}: {e}", dir.display()))?;
    let path = dir.to_string_lossy().into_owned();
    // Literal values may name the folder (`FASTVIDEO_TRACE_OUTPUT`
    // = `{collect_dir}/port_rank<rank>.jsonl`); only this worker knows it.
    for (name, value) in spec.env.iter_mut() {
        if !spec.secret_env_names.contains(name) {
            *value = value.replace(COLLECT_DIR, &path);
        }
    }
    spec.env.push((var.to_string(), path));
    Ok(Some(dir))
}

/// Sends a run's events to the orchestrator as they come (an agent's
/// stdout also kept, its tail, for its result).
fn forward_events(
    tx: &Outbox,
    job_id: &str,
    epoch: u64,
    agent_io: Option<&AgentIo>,
    mut erx: mpsc::Receiver<JobEvent>,
) -> tokio::task::JoinHandle<()> {
    let tx = tx.clone();
    let job_id = job_id.to_string();
    let kept = agent_io.map(|io| io.stdout.clone());
    fvd_telemetry::spawn(async move {
        while let Some(ev) = erx.recv().await {
            if let (
                Some(kept),
                JobEvent::Output {
                    stream: OutputStream::Stdout,
                    data,
                    ..
                },
            ) = (&kept, &ev)
            {
                let mut k = kept.lock().expect("agent stdout lock");
                k.extend_from_slice(data);
                if k.len() > AGENT_STDOUT_BYTES {
                    let over = k.len() - AGENT_STDOUT_BYTES;
                    k.drain(..over);
                }
            }
            if let Some(m) = wire::event_msg(&job_id, epoch, ev) {
                tx.send(m).await;
            }
        }
    })
}

/// How the run ended, into its result, its metrics and its span.
fn record_outcome(
    finished: &mut Finished,
    outcome: Result<exec::JobOutcome, exec::ExecError>,
    warm: bool,
    gpus: usize,
) {
    match outcome {
        Err(e) => {
            fvd_telemetry::metrics::worker_job("spawn_error", warm, 0, Duration::ZERO);
            finished.spawn_error = e.to_string();
        }
        Ok(o) => {
            let end = if o.cancelled {
                "cancelled"
            } else if o.timed_out {
                "timed_out"
            } else if o.exit_code == Some(0) {
                "exit_0"
            } else {
                "failed"
            };
            fvd_telemetry::metrics::worker_job(end, warm, gpus, o.duration);
            let span = tracing::Span::current();
            if let Some(code) = o.exit_code {
                span.record("fvd.exit_code", code);
            }
            span.record("fvd.duration_ms", o.duration.as_millis() as i64);
            if let Some(mib) = o.peak_gpu_mib {
                span.record(
                    "fvd.run.peak_gpu_mib",
                    i64::try_from(mib).unwrap_or(i64::MAX),
                );
            }
            finished.exit_code = o.exit_code;
            finished.signal = o.signal;
            finished.timed_out = o.timed_out;
            finished.cancelled = o.cancelled;
            finished.duration_ms = o.duration.as_millis() as u64;
            finished.output_tail = o.output_tail;
            finished.survivors = o.survivors.iter().map(|p| p.pid as u32).collect();
            finished.peak_gpu_mib = o.peak_gpu_mib;
            let status = match o.junit {
                JunitFile::Read(xml) => {
                    finished.junit_xml = xml;
                    JunitStatus::Read
                }
                JunitFile::NotRequested => JunitStatus::NotRequested,
                JunitFile::Missing(p) => {
                    finished.junit_error = format!("junit file {} was not written", p.display());
                    JunitStatus::Missing
                }
                JunitFile::Unreadable { path, error } => {
                    finished.junit_error =
                        format!("junit file {} is unreadable: {error}", path.display());
                    JunitStatus::Unreadable
                }
            };
            finished.junit_status = status;
        }
    }
}

/// The collected folder into the result: its size, the comparison of its
/// trace files when the assignment asks for one (run here, where the files
/// lie, so a trace of any size sends back only its report), and its files
/// when they fit beside that report.
async fn collect_and_compare(
    finished: &mut Finished,
    dir: &std::path::Path,
    compare: Option<fvd_trace::FolderSpec>,
    secrets: fvd_contracts::redactor::Redactor,
) {
    let secrets = std::sync::Arc::new(secrets);
    let at = dir.to_path_buf();
    if let Ok(Ok((bytes, files))) =
        fvd_telemetry::spawn_blocking(move || crate::collect::size(&at)).await
    {
        finished.collected_bytes = bytes;
        finished.collected_files = files as u32;
    }
    let mut budget = crate::collect::MAX_COLLECT_BYTES;
    if let Some(spec) = compare {
        let (at, s) = (dir.to_path_buf(), secrets.clone());
        let started = std::time::Instant::now();
        let compared =
            fvd_telemetry::spawn_blocking(move || crate::collect::compare(&at, &spec, &s)).await;
        finished.compare_ms = started.elapsed().as_millis() as u64;
        match compared {
            Ok(Ok(json)) => {
                budget = budget.saturating_sub(json.len() as u64);
                finished.trace_report = json;
            }
            Ok(Err(e)) => finished.trace_error = e,
            Err(e) => finished.trace_error = format!("comparing the trace files failed: {e}"),
        }
    }
    let dir = dir.to_path_buf();
    let read =
        fvd_telemetry::spawn_blocking(move || crate::collect::collect(&dir, budget, &secrets))
            .await;
    match read {
        Ok(Ok(files)) => finished.files = files,
        Ok(Err(e)) => finished.files_error = e.to_string(),
        Err(e) => finished.files_error = format!("collecting files failed: {e}"),
    }
}

/// The UUIDs of the leased host GPUs, comma-separated (span attribute).
fn gpu_uuids(config: &WorkerConfig, leased: &[u32]) -> String {
    config
        .gpus
        .iter()
        .filter(|g| leased.contains(&g.index))
        .map(|g| g.uuid.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// What a cold test may write of the worker's `workspace`: its `scratch`
/// folder, its checkout (`cwd`), and the worker's HOME and TMPDIR when
/// they lie in the workspace.
fn test_writable(workspace: &Path, scratch: &Path, cwd: &Path) -> Vec<PathBuf> {
    let mut out = vec![scratch.to_path_buf(), cwd.to_path_buf()];
    let workspace = std::path::absolute(workspace).unwrap_or_else(|_| workspace.to_path_buf());
    for var in ["HOME", "TMPDIR"] {
        if let Some(p) = std::env::var_os(var).map(PathBuf::from)
            && p.starts_with(&workspace)
        {
            out.push(p);
        }
    }
    out
}

/// A warm test's write rules (issue #39): everything outside the worker's
/// `workspace`, and below it only `writable` (from [`test_writable`]), as
/// paths with whether each is a folder. `None` when Landlock cannot keep
/// the workspace read-only (it lies below `/tmp` or another folder jobs
/// create files in directly: `fvd_sandbox::launch::landlock_read_only`).
fn warm_write_rules(workspace: &Path, writable: &[PathBuf]) -> Option<Vec<(PathBuf, bool)>> {
    use fvd_sandbox::launch::{busy_folders, complement, landlock_read_only};
    let real = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let read_only = landlock_read_only(&[real(workspace)], &busy_folders());
    if read_only.is_empty() {
        return None;
    }
    let mut outside = Vec::new();
    complement(Path::new("/"), &read_only, &mut outside);
    let mut rules: Vec<(PathBuf, bool)> = outside
        .into_iter()
        .map(|p| {
            let folder = p.is_dir();
            (p, folder)
        })
        .collect();
    rules.extend(
        writable
            .iter()
            .map(|w| real(w))
            .filter(|w| w.is_dir())
            .map(|w| (w, true)),
    );
    Some(rules)
}

/// The job's own scratch folder, `WORKSPACE/jobs/<job id>.e<lease epoch>`:
/// removed whole after the run, so a job id (from the wire) of `..` or `.`
/// must never make it the workspace or its `jobs` folder. The epoch keeps
/// a cancelled lease's cleanup off the folder of the same job's next lease,
/// which may start before it ends (a worker lost and back).
pub(crate) fn scratch_dir(
    workspace: &std::path::Path,
    job_id: &str,
    epoch: u64,
) -> Result<PathBuf, fvd_paths::PathError> {
    fvd_paths::join_under_no_links(
        &workspace.join("jobs"),
        format!("{}.e{epoch}", sanitize(job_id)),
    )
}

fn sanitize(job_id: &str) -> String {
    job_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn only_a_refused_token_or_a_taken_id_stops_a_worker() {
        use tonic::Code;
        for code in [
            Code::Unauthenticated,
            Code::PermissionDenied,
            Code::AlreadyExists,
        ] {
            assert!(refused(&tonic::Status::new(code, "no")), "{code:?}");
        }
        for code in [
            Code::Unavailable,
            Code::Unknown,
            Code::Internal,
            Code::Cancelled,
            Code::DeadlineExceeded,
            Code::ResourceExhausted,
            Code::InvalidArgument,
        ] {
            assert!(!refused(&tonic::Status::new(code, "reset")), "{code:?}");
        }
    }

    #[test]
    fn a_job_scratch_folder_stays_under_jobs() {
        let ws = Path::new("/w");
        assert_eq!(
            scratch_dir(ws, "tinyport.refiner#trace.2", 3).unwrap(),
            Path::new("/w/jobs/tinyport.refiner_trace.2.e3")
        );
        assert_eq!(
            scratch_dir(ws, "../../etc", 1).unwrap(),
            Path::new("/w/jobs/.._.._etc.e1")
        );
        // Never the workspace or `jobs` itself, which the run's end removes.
        for bad in ["..", ".", ""] {
            let d = scratch_dir(ws, bad, 1).unwrap();
            assert_eq!(d.parent(), Some(Path::new("/w/jobs")), "{bad:?}");
        }
        // Two leases of one job, two folders.
        assert_ne!(scratch_dir(ws, "a.b.1", 1), scratch_dir(ws, "a.b.1", 2));
    }
}
