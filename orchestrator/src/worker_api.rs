//! `WorkerService`: the gRPC edge for workers. Handlers only convert wire
//! types to domain types and forward them to the scheduler actor; leases,
//! fencing and state live there. What a worker sends of a job's output is
//! redacted here once more, of the orchestrator's own secrets (its token):
//! the worker redacts every secret it knows, streaming, before anything
//! leaves it; this edge catches a worker that did not, chunk by chunk. A worker's `FetchCode` is answered here,
//! beside the stream, by [`crate::code`] (git, never the scheduler).

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fvd_actors::scheduler::{HeartbeatBatch, Registration, SchedulerMsg};
use fvd_proto::v1 as pb;
use fvd_store::Store;
use fvd_store::messages::{
    AgentOutcome, CollectedFile, GpuInfo, JobReport, JunitStatus, LogChunk, ToWorker, WorkerInfo,
};
use ractor::ActorRef;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

/// Longest a registration waits for the scheduler's answer (it may wait on
/// a database that cannot be written: the worker then retries).
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// Connection ids, unique per stream in this process.
static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

#[derive(Debug, Clone)]
pub struct WorkerApi {
    pub scheduler: ActorRef<SchedulerMsg>,
    pub heartbeat_interval: Duration,
    pub lease_ttl: Duration,
    /// Read by `FetchCode`: which job runs which commit of which repository.
    pub store: Store,
    /// No pack larger than this is sent ([`crate::code::DEFAULT_MAX_PACK_BYTES`]).
    pub max_code_bytes: u64,
    /// Every stream's heartbeats go to the scheduler through this batch.
    pub heartbeats: Arc<HeartbeatBatch>,
    /// What the interceptor checked the worker's token against: a worker
    /// whose credential is revoked loses its stream (and is refused when it
    /// dials again).
    pub credentials: fvd_proto::auth::Credentials,
    /// The orchestrator's own secrets, redacted from everything a worker
    /// sends of a job before it is stored.
    pub secrets: Arc<fvd_contracts::redactor::Redactor>,
    /// The row-less jobs workers run for agents (attempts, their tools'
    /// runs): their code and tunnels are served by what is registered here.
    pub fleet: fvd_workspace::agent::FleetAttempts,
    /// The credential each connected worker registered under: a `Tunnel`
    /// is opened only by the credential of the worker holding the lease.
    pub registered: RegisteredWorkers,
    /// Most bytes of one agent attempt's pack the edge keeps
    /// (`max_pack_bytes`): past it the pieces are dropped as they come and
    /// the attempt comes back refused, with no commit.
    pub attempt_limits: fvd_workspace::attempt_caps::AttemptLimits,
}

/// The credential each worker's live `Connect` stream was opened with, by
/// worker id: a worker is who its credential registered, not what a frame
/// says it is.
#[derive(Debug, Clone, Default)]
pub struct RegisteredWorkers(Arc<std::sync::Mutex<ByWorker>>);

/// Worker id to (stream, credential).
type ByWorker = std::collections::HashMap<String, (u64, fvd_proto::auth::Principal)>;

impl RegisteredWorkers {
    fn lock(&self) -> std::sync::MutexGuard<'_, ByWorker> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `worker_id` registered on stream `conn` with `who`'s credential.
    fn registered(&self, worker_id: &str, conn: u64, who: &fvd_proto::auth::Principal) {
        self.lock()
            .insert(worker_id.to_string(), (conn, who.clone()));
    }

    /// Stream `conn` of `worker_id` ended (a newer stream's entry stays).
    fn ended(&self, worker_id: &str, conn: u64) {
        let mut map = self.lock();
        if map.get(worker_id).is_some_and(|(c, _)| *c == conn) {
            map.remove(worker_id);
        }
    }

    /// Whether `worker_id` is connected under `who`'s credential.
    fn is(&self, worker_id: &str, who: &fvd_proto::auth::Principal) -> bool {
        self.lock().get(worker_id).is_some_and(|(_, p)| p == who)
    }
}

/// How the orchestrator's token is named where it is redacted (the same
/// name as a worker's: a fleet shares one token).
pub const TOKEN_NAME: &str = "fvd-token";

/// The orchestrator's own secrets: its token, and the agents' (later the
/// model-API proxy's keys).
pub fn own_secrets(config: &crate::ServerConfig) -> fvd_contracts::redactor::Redactor {
    let mut r = config.agents.secrets.clone();
    if let Some(t) = &config.token {
        r.add(TOKEN_NAME, t.value().as_bytes());
    }
    r
}

/// Boxed: a channel's first block of 32 slots is allocated when it is
/// made, and an inline message would make that 18 KiB per worker stream.
type OutTx = mpsc::Sender<Box<pb::OrchestratorMsg>>;

type OutStream = Pin<Box<dyn Stream<Item = Result<pb::OrchestratorMsg, Status>> + Send>>;

type TunnelOut = Pin<Box<dyn Stream<Item = Result<pb::TunnelFrame, Status>> + Send>>;

/// Bytes read from a tunnelled connection per frame.
const TUNNEL_FRAME_BYTES: usize = 64 * 1024;

#[tonic::async_trait]
impl pb::worker_service_server::WorkerService for WorkerApi {
    type ConnectStream = OutStream;
    type TunnelStream = TunnelOut;

    /// One connection of an agent on a worker to its attempt's model proxy
    /// here: bytes both ways, nothing read or kept. Only the worker that
    /// holds the attempt's lease is connected, and only while it runs: the
    /// call's credential must be the one that worker registered with (the
    /// worker id a frame names is not trusted, only checked to agree).
    async fn tunnel(
        &self,
        request: Request<Streaming<pb::TunnelFrame>>,
    ) -> Result<Response<TunnelOut>, Status> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let who = request
            .extensions()
            .get::<fvd_proto::auth::Principal>()
            .cloned()
            .ok_or_else(|| Status::unauthenticated("no credential was checked for this call"))?;
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the tunnel ended before its first frame"))?;
        let refused = || {
            Status::permission_denied(format!(
                "job {} is no running agent attempt leased to a worker of credential {}",
                first.job_id,
                who.describe()
            ))
        };
        let (leased_to, epoch) = self.fleet.lease_of(&first.job_id).ok_or_else(refused)?;
        if !self.registered.is(&leased_to, &who)
            || (!first.worker_id.is_empty() && first.worker_id != leased_to)
        {
            tracing::warn!(job = %first.job_id, worker = %leased_to, caller = %who.describe(), "refused a tunnel to another worker's agent attempt");
            return Err(refused());
        }
        // A tunnel of an earlier lease of the job (the same worker, say,
        // before the job was placed again) is not this lease's.
        if first.lease_epoch != epoch {
            tracing::warn!(job = %first.job_id, worker = %leased_to, epoch = first.lease_epoch, lease_epoch = epoch, "refused a tunnel of another lease of the agent attempt");
            return Err(Status::permission_denied(format!(
                "job {} is leased under epoch {epoch}, not {}",
                first.job_id, first.lease_epoch
            )));
        }
        let attempt = self
            .fleet
            .held_by(&first.job_id, &leased_to)
            .ok_or_else(refused)?;
        let (target, what) = match first.target.as_str() {
            "" | "model" => (attempt.proxy, "model proxy"),
            "tools" => (attempt.tools, "tools"),
            other => {
                return Err(Status::invalid_argument(format!(
                    "no tunnel target {other:?} (model or tools)"
                )));
            }
        };
        let proxy = target.ok_or_else(|| {
            Status::failed_precondition(format!(
                "the agent attempt of job {} has no {what}",
                first.job_id
            ))
        })?;
        let tcp = tokio::net::TcpStream::connect(proxy)
            .await
            .map_err(|e| Status::unavailable(format!("the attempt's model proxy: {e}")))?;
        let (mut rd, mut wr) = tcp.into_split();
        fvd_telemetry::spawn(async move {
            let mut data = first.data;
            loop {
                if !data.is_empty() && wr.write_all(&data).await.is_err() {
                    return;
                }
                data = match inbound.message().await {
                    Ok(Some(f)) => f.data,
                    _ => break,
                };
            }
            let _ = wr.shutdown().await;
        });
        let (tx, rx) = mpsc::channel::<Result<pb::TunnelFrame, Status>>(8);
        fvd_telemetry::spawn(async move {
            let mut buf = vec![0u8; TUNNEL_FRAME_BYTES];
            loop {
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let frame = pb::TunnelFrame {
                            data: buf[..n].to_vec(),
                            ..Default::default()
                        };
                        if tx.send(Ok(frame)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn connect(
        &self,
        request: Request<Streaming<pb::WorkerMsg>>,
    ) -> Result<Response<OutStream>, Status> {
        let who = request
            .extensions()
            .get::<fvd_proto::auth::Principal>()
            .cloned()
            .ok_or_else(|| Status::unauthenticated("no credential was checked for this call"))?;
        let credentials = self.credentials.clone();
        let mut inbound = request.into_inner();
        let mut reg = first_register(&mut inbound).await?;
        let incarnation = std::mem::take(&mut reg.incarnation);
        let running: Vec<(String, u64)> = std::mem::take(&mut reg.running)
            .into_iter()
            .map(|r| (r.job_id, r.lease_epoch))
            .collect();
        let info = worker_info(reg)?;
        let worker_id = info.worker_id.clone();
        let conn = NEXT_CONN.fetch_add(1, Ordering::Relaxed);

        let (out_tx, out_rx): (OutTx, _) = mpsc::channel(64);
        out_tx
            .send(self.registered_msg())
            .await
            .map_err(|_| Status::cancelled("worker went away"))?;

        let (to_worker, from_scheduler) = mpsc::channel::<ToWorker>(64);
        let registration = Box::new(Registration {
            info,
            tx: to_worker,
            conn,
            incarnation,
            running,
        });
        self.register(registration, &worker_id, conn, &who).await?;

        // Worker → scheduler, until the stream ends.
        let stream = self.worker_stream(worker_id, conn, out_tx);
        fvd_telemetry::spawn(stream.run(inbound, credentials, who));

        Ok(Response::new(Box::pin(Outbound {
            edge: Some(out_rx),
            scheduler: Some(from_scheduler),
            ended: false,
        })))
    }
}

impl WorkerApi {
    /// The edge's first message to a worker: how often to beat, how long a
    /// lease lives.
    fn registered_msg(&self) -> Box<pb::OrchestratorMsg> {
        Box::new(pb::OrchestratorMsg {
            msg: Some(pb::orchestrator_msg::Msg::Registered(pb::Registered {
                heartbeat_interval_ms: self.heartbeat_interval.as_millis() as u64,
                lease_ttl_ms: self.lease_ttl.as_millis() as u64,
            })),
        })
    }

    /// Hands `registration` to the scheduler, which decides before the
    /// stream opens: a second process under a live worker's id is refused,
    /// not left as a silent zombie. Once it is taken, `worker_id` is known
    /// as registered by `who`.
    async fn register(
        &self,
        registration: Box<Registration>,
        worker_id: &str,
        conn: u64,
        who: &fvd_proto::auth::Principal,
    ) -> Result<(), Status> {
        let answer = self
            .scheduler
            .call(
                |reply| SchedulerMsg::Register {
                    registration,
                    reply,
                },
                Some(REGISTER_TIMEOUT),
            )
            .await;
        match answer {
            Ok(ractor::rpc::CallResult::Success(Ok(()))) => {
                self.registered.registered(worker_id, conn, who);
                Ok(())
            }
            Ok(ractor::rpc::CallResult::Success(Err(why))) => {
                tracing::warn!(worker = %worker_id, %why, "refused a registration");
                Err(Status::already_exists(why))
            }
            Ok(ractor::rpc::CallResult::Timeout) => {
                Err(Status::unavailable("the scheduler did not answer in time"))
            }
            _ => Err(Status::unavailable("scheduler is down")),
        }
    }

    /// What the task reading one registered worker's stream holds: its own
    /// copies of what this edge shares, and `code_tx`, where code chunks go.
    fn worker_stream(&self, worker_id: String, conn: u64, code_tx: OutTx) -> WorkerStream {
        let beat_id = Arc::<str>::from(worker_id.as_str());
        WorkerStream {
            worker_id,
            conn,
            scheduler: self.scheduler.clone(),
            heartbeats: self.heartbeats.clone(),
            beat_id,
            store: self.store.clone(),
            max_code_bytes: self.max_code_bytes,
            code_tx,
            secrets: self.secrets.clone(),
            fleet: self.fleet.clone(),
            registered: self.registered.clone(),
            limits: self.attempt_limits,
            packs: Default::default(),
            pack_in: None,
        }
    }
}

/// Reads a stream's first message, which must be the worker's `Register`.
async fn first_register(inbound: &mut Streaming<pb::WorkerMsg>) -> Result<pb::Register, Status> {
    let first = inbound
        .message()
        .await?
        .ok_or_else(|| Status::invalid_argument("stream ended before register"))?;
    let Some(pb::worker_msg::Msg::Register(reg)) = first.msg else {
        return Err(Status::invalid_argument(
            "the first message must be register",
        ));
    };
    Ok(reg)
}

/// One registered worker's stream, as the task reading it holds it: what
/// its messages go to, and the agent attempts' packs still coming in.
struct WorkerStream {
    worker_id: String,
    conn: u64,
    scheduler: ActorRef<SchedulerMsg>,
    heartbeats: Arc<HeartbeatBatch>,
    /// The worker's id, as its heartbeats carry it.
    beat_id: Arc<str>,
    store: Store,
    max_code_bytes: u64,
    /// Where the answers to `FetchCode` go, beside the scheduler's messages.
    code_tx: OutTx,
    secrets: Arc<fvd_contracts::redactor::Redactor>,
    fleet: fvd_workspace::agent::FleetAttempts,
    registered: RegisteredWorkers,
    limits: fvd_workspace::attempt_caps::AttemptLimits,
    /// Agent attempts' packs, by (job, epoch), until their result.
    packs: std::collections::HashMap<(String, u64), Result<Vec<u8>, ()>>,
    /// A finished attempt's pack, until it is put in the scheduler's message.
    pack_in: Option<Vec<u8>>,
}

impl WorkerStream {
    /// Forwards what the worker sends until its stream ends or fails, or
    /// its credential is revoked; then tells the scheduler it is gone.
    async fn run(
        mut self,
        mut inbound: Streaming<pb::WorkerMsg>,
        credentials: fvd_proto::auth::Credentials,
        who: fvd_proto::auth::Principal,
    ) {
        let revoked = credentials.revoked(&who);
        tokio::pin!(revoked);
        loop {
            let next = tokio::select! {
                m = inbound.message() => m,
                () = &mut revoked => {
                    tracing::warn!(worker = %self.worker_id, credential = %who.name(), "the worker's credential was revoked; closing its stream");
                    break;
                }
            };
            match next {
                Ok(Some(m)) => {
                    if self.handle(m).is_break() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    // A worker stopping or dying ends its stream this way; the lost
                    // leases, if any, are reported by the scheduler.
                    tracing::info!(worker = %self.worker_id, %status, "worker stream ended with an error");
                    break;
                }
            }
        }
        self.registered.ended(&self.worker_id, self.conn);
        let _ = self.scheduler.cast(SchedulerMsg::WorkerDisconnected {
            worker_id: self.worker_id,
            conn: self.conn,
        });
    }

    /// One message from the worker; breaks when the scheduler is gone.
    fn handle(&mut self, m: pb::WorkerMsg) -> ControlFlow<()> {
        match m {
            pb::WorkerMsg {
                msg: Some(pb::worker_msg::Msg::FetchCode(f)),
            } => {
                self.fetch_code(f);
                ControlFlow::Continue(())
            }
            pb::WorkerMsg {
                msg: Some(pb::worker_msg::Msg::Heartbeat(h)),
            } => self.heartbeat(h),
            pb::WorkerMsg {
                msg: Some(pb::worker_msg::Msg::AttemptPack(p)),
            } => {
                self.attempt_pack(p);
                ControlFlow::Continue(())
            }
            m => self.forward(m),
        }
    }

    /// Answers a `FetchCode` on a task of its own, beside the stream.
    fn fetch_code(&self, f: pb::FetchCode) {
        fvd_telemetry::spawn(serve_code(
            self.store.clone(),
            self.worker_id.clone(),
            f,
            self.max_code_bytes,
            self.code_tx.clone(),
            self.fleet.clone(),
        ));
    }

    /// Adds a heartbeat to the batch the scheduler reads; breaks when the
    /// scheduler is gone.
    fn heartbeat(&self, h: pb::Heartbeat) -> ControlFlow<()> {
        let running = h
            .running
            .into_iter()
            .map(|r| (r.job_id, r.lease_epoch))
            .collect();
        if self
            .heartbeats
            .add(&self.scheduler, self.beat_id.clone(), running)
            .is_err()
        {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    /// Keeps a piece of an agent attempt's pack; past the limit, the pack
    /// is dropped and the attempt marked to come back refused.
    fn attempt_pack(&mut self, p: pb::AttemptPack) {
        let slot = self
            .packs
            .entry((p.job_id.clone(), p.lease_epoch))
            .or_insert_with(|| Ok(Vec::new()));
        if let Ok(bytes) = slot {
            let len = (bytes.len() + p.data.len()) as u64;
            if self.limits.pack_refusal(len).is_some() {
                tracing::warn!(worker = %self.worker_id, job = %p.job_id, "an agent attempt's pack is over its limit; the attempt comes back refused, without its commit");
                *slot = Err(());
            } else {
                bytes.extend_from_slice(&p.data);
            }
        }
    }

    /// Any other message goes to the scheduler, redacted; a finished agent
    /// attempt takes its pack along, or its refusal when the pack was over
    /// its limit. Breaks when the scheduler is gone.
    fn forward(&mut self, mut m: pb::WorkerMsg) -> ControlFlow<()> {
        let mut refused: Option<String> = None;
        if let Some(pb::worker_msg::Msg::JobFinished(f)) = &mut m.msg
            && let Some(agent) = &mut f.agent
        {
            match self.packs.remove(&(f.job_id.clone(), f.lease_epoch)) {
                Some(Ok(bytes)) => self.pack_in = Some(bytes),
                Some(Err(())) => {
                    refused = self.limits.pack_refusal(u64::MAX);
                    agent.commit.clear();
                }
                None => {}
            }
        }
        if let Some(mut msg) = from_wire(&self.worker_id, m, &self.secrets) {
            if let (SchedulerMsg::Finished { report, .. }, Some(bytes)) =
                (&mut msg, self.pack_in.take())
                && let Some(agent) = &mut report.agent
            {
                agent.pack = bytes;
            }
            if let (SchedulerMsg::Finished { report, .. }, Some(why)) = (&mut msg, refused.take())
                && let Some(agent) = &mut report.agent
            {
                agent.refused = why;
            }
            if self.scheduler.cast(msg).is_err() {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }
}

/// What goes to one worker: the edge's own messages (`Registered` first,
/// code chunks), then the scheduler's, which become wire messages as the
/// stream is read. No task stands between the scheduler and the stream.
///
/// It ends, with `UNAVAILABLE`, as soon as the scheduler lets go of the
/// worker (it missed its heartbeats, say, because the link or this process
/// stalled): the worker then connects and registers again. Ending only
/// once the edge's sender is gone too left such a worker a silent zombie:
/// its heartbeats went on arriving on a stream no registration knew, and
/// the jobs it was to run again waited for a worker forever (issue #38).
struct Outbound {
    edge: Option<mpsc::Receiver<Box<pb::OrchestratorMsg>>>,
    scheduler: Option<mpsc::Receiver<ToWorker>>,
    ended: bool,
}

impl Stream for Outbound {
    type Item = Result<pb::OrchestratorMsg, Status>;

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        if let Some(edge) = &mut this.edge {
            match edge.poll_recv(cx) {
                Poll::Ready(Some(m)) => return Poll::Ready(Some(Ok(*m))),
                Poll::Ready(None) => this.edge = None,
                Poll::Pending => {}
            }
        }
        if let Some(scheduler) = &mut this.scheduler {
            match scheduler.poll_recv(cx) {
                Poll::Ready(Some(m)) => return Poll::Ready(Some(Ok(to_wire(m)))),
                Poll::Ready(None) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(Status::unavailable(
                        "the orchestrator no longer holds this worker's registration (missed heartbeats, or it stops): connect again",
                    ))));
                }
                Poll::Pending => {}
            }
        }
        if this.edge.is_none() && this.scheduler.is_none() {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }
}

/// Answers one `FetchCode` with `CodeChunk`s: the pack's pieces, then one
/// marked `last`, or one carrying the error.
async fn serve_code(
    store: Store,
    worker_id: String,
    f: pb::FetchCode,
    max: u64,
    out: OutTx,
    fleet: fvd_workspace::agent::FleetAttempts,
) {
    let chunk = |data: Vec<u8>, last: bool, error: String| {
        Box::new(pb::OrchestratorMsg {
            msg: Some(pb::orchestrator_msg::Msg::CodeChunk(pb::CodeChunk {
                request_id: f.request_id,
                data,
                last,
                error,
            })),
        })
    };
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(4);
    let serve = async {
        let from = crate::code::Sources {
            store: &store,
            fleet: &fleet,
        };
        let r = crate::code::serve(from, &worker_id, &f.job_id, &f.commit, &f.have, max, &tx).await;
        drop(tx);
        r
    };
    let forward = async {
        while let Some(data) = rx.recv().await {
            if out.send(chunk(data, false, String::new())).await.is_err() {
                return;
            }
        }
    };
    let (served, ()) = tokio::join!(serve, forward);
    let end = match served {
        Ok(_) => chunk(Vec::new(), true, String::new()),
        Err(e) => {
            tracing::warn!(worker = %worker_id, job = %f.job_id, commit = %f.commit, error = %e, "could not serve the code of a commit");
            chunk(Vec::new(), false, e.to_string())
        }
    };
    let _ = out.send(end).await;
}

fn worker_info(reg: pb::Register) -> Result<WorkerInfo, Status> {
    if reg.worker_id.is_empty() {
        return Err(Status::invalid_argument("register.worker_id is empty"));
    }
    Ok(WorkerInfo {
        worker_id: reg.worker_id,
        host: reg.host,
        gpus: reg
            .gpus
            .into_iter()
            .map(|g| GpuInfo {
                index: g.index,
                uuid: g.uuid,
                name: g.name,
                memory_mib: g.memory_mib,
            })
            .collect(),
        cpu_slots: reg.cpu_slots.max(1),
        labels: reg.labels.into_iter().collect::<BTreeMap<_, _>>(),
        provides: reg.provides,
    })
}

fn to_wire(m: ToWorker) -> pb::OrchestratorMsg {
    let msg = match m {
        ToWorker::Assign(a) => {
            let a = *a;
            pb::orchestrator_msg::Msg::AssignJob(pb::AssignJob {
                job_id: a.job_id,
                lease_epoch: a.lease_epoch,
                argv: a.argv,
                env: a.env.into_iter().collect(),
                secret_env: a.secret_env,
                cwd: a.cwd,
                gpus: a.gpus,
                timeout_ms: a.timeout_ms,
                // The example is judged by its exit status: no report is
                // asked of it (no `--junitxml` appended to its command).
                collect_junit: a.component != fvd_contracts::verdict::EXAMPLE_STEP,
                traceparent: a.traceparent.unwrap_or_default(),
                collect_env: a.collect_env.unwrap_or_default(),
                preflight: a.preflight,
                preflight_key: a.preflight_key,
                warm: a.warm.is_some(),
                preload: a.warm.unwrap_or_default(),
                family: a.family,
                component: a.component,
                commit: a.commit,
                code_prefix: a.code_prefix,
                worker_paths: a.worker_paths,
                fvd_writes: a.fvd_writes,
                compare: a.compare.map(|c| pb::TraceCompare {
                    reference: c.reference,
                    port: c.port,
                    rename: c.rename,
                    tol: c.tol,
                    steps: c.steps,
                }),
                agent: a.agent.map(|g| pb::AgentAssignment {
                    packet: g.packet,
                    packet_on_stdin: g.packet_on_stdin,
                    files: g
                        .files
                        .into_iter()
                        .map(|(path, text)| pb::AttemptFile { path, text })
                        .collect(),
                    proxied: g.proxied,
                    commit_message: g.commit_message,
                    tools: g.tools,
                }),
                gpu_memory_mib: a.share_mib,
                gpu_share_cap: a.share_cap,
            })
        }
        ToWorker::Cancel {
            job_id,
            lease_epoch,
            reason,
        } => pb::orchestrator_msg::Msg::CancelJob(pb::CancelJob {
            job_id,
            lease_epoch,
            reason,
        }),
    };
    pb::OrchestratorMsg { msg: Some(msg) }
}

fn from_wire(
    worker_id: &str,
    m: pb::WorkerMsg,
    secrets: &fvd_contracts::redactor::Redactor,
) -> Option<SchedulerMsg> {
    let worker_id = worker_id.to_string();
    let text = |s: String| {
        if secrets.is_empty() {
            s
        } else {
            secrets.text(&s)
        }
    };
    Some(match m.msg? {
        pb::worker_msg::Msg::Register(_) => {
            tracing::warn!(worker = %worker_id, "ignored a second register on one stream");
            return None;
        }
        // Joined to the batch by the stream's reader itself.
        pb::worker_msg::Msg::Heartbeat(_) => return None,
        pb::worker_msg::Msg::Drain(_) => SchedulerMsg::Drain { worker_id },
        // Answered by the stream's reader itself (`serve_code`).
        pb::worker_msg::Msg::FetchCode(_) => return None,
        // Gathered by the stream's reader until the attempt's result.
        pb::worker_msg::Msg::AttemptPack(_) => return None,
        pb::worker_msg::Msg::JobStarted(s) => SchedulerMsg::Started {
            worker_id,
            job_id: s.job_id,
            lease_epoch: s.lease_epoch,
            at_ms: s.started_at_ms,
        },
        pb::worker_msg::Msg::JobLog(l) => SchedulerMsg::Log {
            worker_id,
            lease_epoch: l.lease_epoch,
            chunk: Box::new(LogChunk {
                job_id: l.job_id,
                seq: l.seq,
                stream: l.stream,
                offset: l.offset,
                data: if secrets.is_empty() {
                    l.data
                } else {
                    secrets.bytes(&l.data)
                },
            }),
        },
        pb::worker_msg::Msg::JobFinished(f) => {
            let wire_bytes = prost::Message::encoded_len(&f) as u64;
            let junit_status = junit_status(&f);
            let (mut files, files_error) = checked_files(&worker_id, f.files, f.files_error);
            if !secrets.is_empty() {
                for c in &mut files {
                    c.data = secrets.bytes(&c.data);
                }
            }
            SchedulerMsg::Finished {
                worker_id,
                report: Box::new(JobReport {
                    job_id: f.job_id,
                    lease_epoch: f.lease_epoch,
                    exit_code: f.exit_code,
                    signal: f.signal,
                    timed_out: f.timed_out,
                    cancelled: f.cancelled,
                    duration_ms: f.duration_ms,
                    junit_xml: (junit_status == JunitStatus::Read && !f.junit_xml.is_empty())
                        .then(|| text(f.junit_xml)),
                    junit_status,
                    junit_error: text(f.junit_error),
                    output_tail: text(f.output_tail),
                    survivors: f.survivors,
                    spawn_error: text(f.spawn_error),
                    files,
                    files_error: text(files_error),
                    preflight_error: text(f.preflight_error),
                    trace_report: (f.trace_error.is_empty() && !f.trace_report.is_empty())
                        .then(|| text(f.trace_report)),
                    trace_error: text(f.trace_error),
                    collected_bytes: f.collected_bytes,
                    collected_files: f.collected_files,
                    compare_ms: f.compare_ms,
                    wire_bytes,
                    agent: f.agent.map(|g| AgentOutcome {
                        commit: g.commit,
                        pack: Vec::new(),
                        handoff: text(g.handoff),
                        stdout: text(g.stdout),
                        error: text(g.error),
                        refused: String::new(),
                    }),
                    peak_gpu_mib: f.peak_gpu_mib,
                    gpu_memory_mib: 0,
                }),
            }
        }
    })
}

/// What became of the job's JUnit report. A worker older than
/// `junit_status` sends none: then a report with no error was read (or none
/// was asked for) and one with an error is unreadable; its words are not
/// parsed.
fn junit_status(f: &pb::JobFinished) -> JunitStatus {
    match pb::JunitStatus::try_from(f.junit_status) {
        Ok(pb::JunitStatus::NotRequested) => JunitStatus::NotRequested,
        Ok(pb::JunitStatus::Read) => JunitStatus::Read,
        Ok(pb::JunitStatus::Missing) => JunitStatus::Missing,
        Ok(pb::JunitStatus::Unreadable) => JunitStatus::Unreadable,
        Ok(pb::JunitStatus::Unspecified) | Err(_) => {
            match (f.junit_error.is_empty(), f.junit_xml.is_empty()) {
                (false, _) => JunitStatus::Unreadable,
                (true, false) => JunitStatus::Read,
                (true, true) => JunitStatus::NotRequested,
            }
        }
    }
}

/// The files a worker sent back, kept only if every path stays inside the
/// job's folder (a hostile or broken worker must not name `../x` or `/x`)
/// and they are no more, and no larger in all, than a worker may collect
/// (`fvd_worker::collect`'s limits; a hostile worker once sent 50,000).
/// One bad path or a set over a limit drops them all and says why, so no
/// partial set is compared.
fn checked_files(
    worker_id: &str,
    files: Vec<pb::CollectedFile>,
    files_error: String,
) -> (Vec<CollectedFile>, String) {
    use fvd_worker::collect::{MAX_COLLECT_BYTES, MAX_COLLECT_FILES};
    let bytes: u64 = files.iter().map(|f| f.data.len() as u64).sum();
    if files.len() > MAX_COLLECT_FILES || bytes > MAX_COLLECT_BYTES {
        tracing::warn!(worker = %worker_id, files = files.len(), bytes, "refused the files of a job result: over the limits");
        return (
            Vec::new(),
            format!(
                "worker {worker_id} sent back {} files of {bytes} bytes, over the limits of {MAX_COLLECT_FILES} files and {MAX_COLLECT_BYTES} bytes, so none was kept",
                files.len()
            ),
        );
    }
    let folder = Path::new("<the job's folder>");
    if let Some(e) = files
        .iter()
        .find_map(|c| fvd_paths::join_under(folder, &c.path).err())
    {
        tracing::warn!(worker = %worker_id, error = %e, "refused the files of a job result");
        return (
            Vec::new(),
            format!("worker {worker_id} sent back a file fvd refuses, so none was kept: {e}"),
        );
    }
    let files = files
        .into_iter()
        .map(|c| CollectedFile {
            path: c.path,
            data: c.data,
        })
        .collect();
    (files, files_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(paths: &[&str]) -> pb::WorkerMsg {
        pb::WorkerMsg {
            msg: Some(pb::worker_msg::Msg::JobFinished(pb::JobFinished {
                job_id: "p.c#trace.1".into(),
                lease_epoch: 3,
                files: paths
                    .iter()
                    .map(|p| pb::CollectedFile {
                        path: p.to_string(),
                        data: b"{}".to_vec(),
                    })
                    .collect(),
                ..Default::default()
            })),
        }
    }

    fn report(m: pb::WorkerMsg) -> JobReport {
        match from_wire("w1", m, &fvd_contracts::redactor::Redactor::default()) {
            Some(SchedulerMsg::Finished { report, .. }) => *report,
            other => panic!("not a result: {other:?}"),
        }
    }

    /// A run's peak GPU memory crosses the wire as sent; an older worker's
    /// result, which has no such field, reads as unknown, never 0.
    #[test]
    fn a_run_s_peak_crosses_the_wire_and_an_older_worker_s_is_unknown() {
        let through = |m: pb::WorkerMsg| {
            let bytes = prost::Message::encode_to_vec(&m);
            report(<pb::WorkerMsg as prost::Message>::decode(&bytes[..]).unwrap())
        };
        let mut m = finished(&[]);
        if let Some(pb::worker_msg::Msg::JobFinished(f)) = &mut m.msg {
            f.peak_gpu_mib = Some(3520);
        }
        assert_eq!(through(m).peak_gpu_mib, Some(3520));
        let old = through(finished(&[]));
        assert_eq!(old.peak_gpu_mib, None);
        assert_eq!(old.gpu_memory_mib, 0, "set by the scheduler, not the wire");
    }

    #[test]
    fn the_junit_status_crosses_the_wire_and_an_older_worker_is_understood() {
        let with = |status: pb::JunitStatus, xml: &str, error: &str| {
            let mut m = finished(&[]);
            if let Some(pb::worker_msg::Msg::JobFinished(f)) = &mut m.msg {
                f.junit_status = status.into();
                f.junit_xml = xml.into();
                f.junit_error = error.into();
            }
            let r = report(m);
            (r.junit_status, r.junit_xml)
        };
        let xml = Some("<testsuite/>".to_string());
        assert_eq!(
            with(pb::JunitStatus::Read, "<testsuite/>", ""),
            (JunitStatus::Read, xml.clone())
        );
        assert_eq!(
            with(pb::JunitStatus::Read, "", ""),
            (JunitStatus::Read, None)
        );
        assert_eq!(
            with(pb::JunitStatus::Missing, "", "junit file j was not written"),
            (JunitStatus::Missing, None)
        );
        assert_eq!(
            with(pb::JunitStatus::Unreadable, "", "denied"),
            (JunitStatus::Unreadable, None)
        );
        assert_eq!(
            with(pb::JunitStatus::NotRequested, "", ""),
            (JunitStatus::NotRequested, None)
        );
        // A worker older than the field sends no status.
        let older = pb::JunitStatus::Unspecified;
        assert_eq!(with(older, "<testsuite/>", ""), (JunitStatus::Read, xml));
        assert_eq!(with(older, "", ""), (JunitStatus::NotRequested, None));
        assert_eq!(with(older, "", "denied"), (JunitStatus::Unreadable, None));
    }

    #[test]
    fn a_result_with_too_many_files_or_bytes_keeps_none() {
        let names: Vec<String> = (0..=fvd_worker::collect::MAX_COLLECT_FILES)
            .map(|i| format!("f{i}"))
            .collect();
        let many: Vec<&str> = names.iter().map(String::as_str).collect();
        let r = report(finished(&many));
        assert!(r.files.is_empty());
        assert!(
            r.files_error.contains("over the limits"),
            "{}",
            r.files_error
        );
        let ok = report(finished(&many[1..]));
        assert_eq!(ok.files.len(), fvd_worker::collect::MAX_COLLECT_FILES);
        let big = pb::WorkerMsg {
            msg: Some(pb::worker_msg::Msg::JobFinished(pb::JobFinished {
                job_id: "p.c#trace.1".into(),
                files: vec![pb::CollectedFile {
                    path: "big".into(),
                    data: vec![0; fvd_worker::collect::MAX_COLLECT_BYTES as usize + 1],
                }],
                ..Default::default()
            })),
        };
        let r = report(big);
        assert!(r.files.is_empty() && r.files_error.contains("over the limits"));
    }

    #[test]
    fn a_result_naming_files_outside_its_folder_keeps_none() {
        let ok = report(finished(&["port_rank0.jsonl", "ref/rank0.jsonl"]));
        assert_eq!(ok.files.len(), 2);
        assert_eq!(ok.files_error, "");
        for bad in ["../../../home/u/.bashrc", "/etc/cron.d/x", "a/../../x"] {
            let r = report(finished(&["port_rank0.jsonl", bad]));
            assert!(r.files.is_empty(), "{bad}");
            assert!(
                r.files_error
                    .starts_with("worker w1 sent back a file fvd refuses"),
                "{bad}: {}",
                r.files_error
            );
        }
    }

    /// A worker that did not redact (an older or a hostile one) still gets
    /// no token of the orchestrator's into the store.
    #[test]
    fn the_orchestrators_token_is_redacted_from_what_a_worker_sends() {
        let token = "orchestrator-token-0123456789";
        let secrets = fvd_contracts::redactor::Redactor::new([(TOKEN_NAME, token)]);
        let b64 = "b3JjaGVzdHJhdG9yLXRva2VuLTAxMjM0NTY3ODk=";
        let mut m = finished(&["port_rank0.jsonl"]);
        if let Some(pb::worker_msg::Msg::JobFinished(f)) = &mut m.msg {
            f.output_tail = format!("leak {token} {b64}");
            f.junit_status = pb::JunitStatus::Read.into();
            f.junit_xml = format!("<testsuite><testcase name='{token}'/></testsuite>");
            f.spawn_error = token.into();
            f.files[0].data = token.as_bytes().to_vec();
        }
        let Some(SchedulerMsg::Finished { report, .. }) = from_wire("w1", m, &secrets) else {
            panic!("not a result")
        };
        let all = format!(
            "{} {} {} {}",
            report.output_tail,
            report.junit_xml.clone().unwrap_or_default(),
            report.spawn_error,
            String::from_utf8_lossy(&report.files[0].data)
        );
        assert!(!secrets.finds(all.as_bytes()), "{all}");
        assert_eq!(all.matches("[redacted:fvd-token]").count(), 5, "{all}");
        let log = pb::WorkerMsg {
            msg: Some(pb::worker_msg::Msg::JobLog(pb::JobLog {
                job_id: "j".into(),
                data: format!("x{token}y").into_bytes(),
                ..Default::default()
            })),
        };
        let Some(SchedulerMsg::Log { chunk, .. }) = from_wire("w1", log, &secrets) else {
            panic!("not a log")
        };
        assert_eq!(chunk.data, b"x[redacted:fvd-token]y");
    }
}
