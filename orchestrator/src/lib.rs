//! The fvd server: opens the store, spawns the actors, and serves the
//! worker and port gRPC services on one listener. Embedded mode and
//! `fvd orchestrator serve` both start it through [`start`]; the only
//! difference is who owns the process.
//!
//! The listener also serves the standard gRPC health service
//! (`grpc.health.v1.Health`, no token needed): `SERVING` for the server
//! (`""`) and both fvd services once the store is open and the actors are
//! up; `NOT_SERVING` once an actor has stopped or the server shuts down.

pub mod code;
pub mod dashboard;
pub mod embedded;
pub mod port_api;
pub mod query;
pub mod wire;
pub mod worker_api;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fvd_actors::orchestrator::{OrchestratorActor, OrchestratorArgs, OrchestratorMsg};
use fvd_actors::scheduler::{SchedulerActor, SchedulerArgs, SchedulerConfig, SchedulerMsg};
use fvd_proto::auth::{Credentials, Need, ServerAuth};
use fvd_proto::v1::port_service_server::PortServiceServer;
use fvd_proto::v1::worker_service_server::WorkerServiceServer;
use fvd_store::clock::{Clock, SystemClock};
use fvd_store::messages::PortEvent;
use fvd_store::{Store, StoreError};
use ractor::{Actor, ActorRef};
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::server::NamedService;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// A server certificate chain and its private key, both PEM.
#[derive(Clone)]
pub struct TlsIdentity {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsIdentity {
    // The key is a secret: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsIdentity(<redacted>)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot start the {actor} actor: {message}")]
    Actor {
        actor: &'static str,
        message: String,
    },
    #[error("cannot read the listener address: {0}")]
    Listener(std::io::Error),
    #[error("tls certificate or key refused: {0}")]
    Tls(tonic::transport::Error),
}

/// Knobs of a server; defaults suit production.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub scheduler: SchedulerConfig,
    /// When set (and `credentials` is not), every call must carry this
    /// bearer token: one admin credential named `admin`.
    pub token: Option<fvd_proto::auth::Token>,
    /// Named credentials with roles (`--auth`, with `--token-file`'s token
    /// among them when both are given); replaces `token` when set. Calls
    /// are checked against them as they are at the time of the call, so a
    /// reload revokes at once.
    pub credentials: Option<Credentials>,
    /// When set, the listener speaks TLS with this certificate and key
    /// (PEM), and clients dial `https://`.
    pub tls: Option<TlsIdentity>,
    pub heartbeat_interval: Duration,
    pub clock: Arc<dyn Clock>,
    /// Resume the ports the store says were running when the process
    /// started (a fleet orchestrator). Embedded mode runs only the port it
    /// was started for, so it does not.
    pub resume_on_start: bool,
    /// No pack of a commit's code larger than this goes to a worker.
    pub max_code_bytes: u64,
    /// The store lives inside the one checkout it serves (embedded mode),
    /// so a port submitted from a new path is that checkout, moved. A fleet
    /// orchestrator refuses a port's family from another checkout.
    pub checkout_owns_store: bool,
    /// Writes that fail on the disk wait and run again under this backoff
    /// (`None`: they fail, and the actor that asked fails with them).
    pub write_retry: Option<fvd_store::faults::Backoff>,
    /// Which spec-given agent commands run on this host, jailed how
    /// (default: none; `fvd orchestrator serve --allow-agent-commands`).
    pub agents: fvd_workspace::agent::AgentPolicy,
    /// Caps on the gRPC listener's connections, and how long one may stay
    /// idle (default: from the process's descriptor limit, 60 s).
    pub grpc_limits: dashboard::guard::Limits,
}

/// The gRPC listener's connections under `limits` (issue #38): one over
/// the cap is accepted and closed at once; one with no byte either way for
/// `limits.idle` is closed (live clients ping both ways every
/// [`fvd_proto::transport::KEEPALIVE_INTERVAL`], so only a dead or idle one
/// is). The guard is the dashboard's, its connection part only.
pub fn grpc_connections(
    listener: TcpListener,
    limits: dashboard::guard::Limits,
) -> dashboard::guard::Incoming {
    let shield = Arc::new(dashboard::guard::Shield::connections_only(limits));
    dashboard::guard::GuardedListener::new(listener, shield).into_stream()
}

/// The gRPC listener's caps for a process that may open `fds`
/// descriptors: half of them for connections (64 to 4,096), with no cap
/// per client (workers behind one address, or all on one host) and a
/// minute's idle.
pub fn grpc_limits(fds: u64) -> dashboard::guard::Limits {
    let max_connections = (fds / 2).clamp(64, 4096) as usize;
    dashboard::guard::Limits {
        max_connections,
        max_connections_per_client: max_connections,
        max_streams: 0,
        max_streams_per_client: 0,
        idle: Duration::from_secs(60),
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            scheduler: SchedulerConfig::default(),
            token: None,
            credentials: None,
            tls: None,
            heartbeat_interval: Duration::from_secs(1),
            clock: Arc::new(SystemClock),
            resume_on_start: true,
            max_code_bytes: code::DEFAULT_MAX_PACK_BYTES,
            checkout_owns_store: false,
            write_retry: Some(fvd_store::faults::Backoff::default()),
            agents: fvd_workspace::agent::AgentPolicy::default(),
            grpc_limits: grpc_limits(dashboard::guard::fd_limit().unwrap_or(1024)),
        }
    }
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    pub addr: SocketAddr,
    pub store: Store,
    pub scheduler: ActorRef<SchedulerMsg>,
    pub orchestrator: ActorRef<OrchestratorMsg>,
    pub events: broadcast::Sender<PortEvent>,
    /// What every call is checked against (reload it to revoke).
    pub credentials: Credentials,
    /// The statuses the health service reports.
    pub health: Health,
    tls: bool,
    serve: JoinHandle<Result<(), tonic::transport::Error>>,
}

/// The health the orchestrator reports over `grpc.health.v1`: the server
/// as a whole (`""`) and each fvd service by its full name.
#[derive(Debug, Clone)]
pub struct Health {
    reporter: HealthReporter,
    /// Set by [`Server::begin_shutdown`]: the actors stop because they were
    /// told to, not because one failed.
    stopping: Arc<std::sync::atomic::AtomicBool>,
}

/// The names `grpc.health.v1.Health/Check` answers for.
pub const HEALTH_SERVICES: [&str; 3] = [
    "",
    <WorkerServiceServer<worker_api::WorkerApi> as NamedService>::NAME,
    <PortServiceServer<port_api::PortApi> as NamedService>::NAME,
];

impl Health {
    fn new() -> Self {
        Self {
            reporter: HealthReporter::new(),
            stopping: Arc::default(),
        }
    }

    /// Sets every name of [`HEALTH_SERVICES`] to `serving` or not.
    pub async fn set(&self, serving: bool) {
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for name in HEALTH_SERVICES {
            self.reporter.set_service_status(name, status).await;
        }
    }

    /// A `grpc.health.v1.Health` service answering from these statuses,
    /// for a listener of its own (`--health-listen`): Kubernetes' `grpc`
    /// probes speak plaintext and send no token.
    pub fn service(
        &self,
    ) -> tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService> {
        tonic_health::pb::health_server::HealthServer::new(
            tonic_health::server::HealthService::from_health_reporter(self.reporter.clone()),
        )
    }

    /// Serves the health service alone on `listener` (plaintext) until the
    /// task is aborted.
    pub fn serve_on(
        &self,
        listener: TcpListener,
    ) -> JoinHandle<Result<(), tonic::transport::Error>> {
        fvd_telemetry::spawn(
            tonic::transport::Server::builder()
                .add_service(self.service())
                .serve_with_incoming(TcpListenerStream::new(listener)),
        )
    }
}

impl Server {
    /// `http://ADDR` (`https://` with TLS) for clients and workers.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The first step of a shutdown: health turns `NOT_SERVING` and the
    /// actors stop, while the listener still answers (a probe or a load
    /// balancer sees the server leave before its port closes).
    pub async fn begin_shutdown(&self) {
        self.health
            .stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.health.set(false).await;
        self.orchestrator.stop(None);
        self.scheduler.stop(None);
    }

    /// Stops serving and stops the actors.
    pub async fn shutdown(self) {
        self.begin_shutdown().await;
        self.serve.abort();
        self.orchestrator.stop(None);
        self.scheduler.stop(None);
    }

    /// Waits until the server task ends (it ends only on error or abort).
    pub async fn wait(&mut self) -> Result<(), String> {
        match (&mut self.serve).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// While the store cannot write, every running port is paused: its
/// snapshot says so ([`query::snapshot`]), and watchers are told it ended
/// for now when the fault begins, so `fvd submit --wait` exits 4 with the
/// reason instead of waiting on a port that cannot move. The actors wait in
/// their writes ([`fvd_store::Store::with_write_retry`]) and the port goes
/// on by itself once a write succeeds.
fn pause_on_write_faults(store: &Store, events: &broadcast::Sender<PortEvent>) {
    let (store, events) = (store.clone(), events.clone());
    let mut faults = store.watch_write_faults();
    fvd_telemetry::spawn(async move {
        while faults.changed().await.is_ok() {
            if faults.borrow_and_update().is_none() {
                continue;
            }
            let ports = match store.ports().await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list the ports to pause");
                    continue;
                }
            };
            for p in ports
                .into_iter()
                .filter(|p| p.state == fvd_store::model::PortState::Running)
            {
                tracing::info!(family = %p.family, "port paused until the database takes writes again");
                let _ = events.send(PortEvent::Finished { family: p.family });
            }
        }
    });
}

/// Starts the scheduler actor on `store`.
async fn spawn_scheduler(
    store: &Store,
    config: &ServerConfig,
) -> Result<(ActorRef<SchedulerMsg>, JoinHandle<()>), ServerError> {
    Actor::spawn(
        None,
        SchedulerActor,
        SchedulerArgs {
            store: store.clone(),
            clock: config.clock.clone(),
            config: config.scheduler.clone(),
        },
    )
    .await
    .map_err(|e| ServerError::Actor {
        actor: "scheduler",
        message: e.to_string(),
    })
}

/// Starts the orchestrator actor, which hands jobs to `scheduler` and tells
/// `events` what its ports do.
async fn spawn_orchestrator(
    store: &Store,
    scheduler: &ActorRef<SchedulerMsg>,
    events: &broadcast::Sender<PortEvent>,
    config: &ServerConfig,
) -> Result<(ActorRef<OrchestratorMsg>, JoinHandle<()>), ServerError> {
    Actor::spawn(
        None,
        OrchestratorActor,
        OrchestratorArgs {
            store: store.clone(),
            scheduler: scheduler.clone(),
            events: events.clone(),
            resume_on_start: config.resume_on_start,
            checkout_owns_store: config.checkout_owns_store,
            agents: config.agents.clone(),
        },
    )
    .await
    .map_err(|e| ServerError::Actor {
        actor: "orchestrator",
        message: e.to_string(),
    })
}

/// Sets `health` to NOT_SERVING as soon as either actor stops (a crash the
/// supervisor did not absorb, or a shutdown).
fn not_serving_once_an_actor_stops(
    health: &Health,
    scheduler_done: JoinHandle<()>,
    orchestrator_done: JoinHandle<()>,
) {
    let health = health.clone();
    fvd_telemetry::spawn(async move {
        tokio::select! {
            _ = scheduler_done => {}
            _ = orchestrator_done => {}
        }
        if health.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            tracing::debug!("the orchestrator's actors stopped for the shutdown");
        } else {
            tracing::warn!("an orchestrator actor stopped: health is NOT_SERVING");
        }
        health.set(false).await;
    });
}

/// The gRPC server, before its services: keepalives on, and TLS when
/// `config` has a certificate.
fn grpc_builder(config: &ServerConfig) -> Result<tonic::transport::Server, ServerError> {
    // Both sides ping (fvd_proto::transport): a stalled link ends, and the
    // worker's stream with it, within a minute (issue #38).
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(fvd_proto::transport::KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(fvd_proto::transport::KEEPALIVE_TIMEOUT))
        .tcp_keepalive(Some(fvd_proto::transport::TCP_KEEPALIVE));
    if let Some(tls) = &config.tls {
        let identity = tonic::transport::Identity::from_pem(&tls.cert_pem, &tls.key_pem);
        builder = builder
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .map_err(ServerError::Tls)?;
    }
    Ok(builder)
}

/// Starts the actors and serves both services on `listener`.
pub async fn start(
    listener: TcpListener,
    store: Store,
    config: ServerConfig,
) -> Result<Server, ServerError> {
    let addr = listener.local_addr().map_err(ServerError::Listener)?;
    let credentials = config
        .credentials
        .clone()
        .unwrap_or_else(|| Credentials::single(config.token.as_ref()));
    let store = match config.write_retry {
        Some(b) => store.with_write_retry(b),
        None => store,
    };
    let (events, _) = broadcast::channel(1024);
    pause_on_write_faults(&store, &events);
    let (scheduler, scheduler_done) = spawn_scheduler(&store, &config).await?;
    let (orchestrator, orchestrator_done) =
        spawn_orchestrator(&store, &scheduler, &events, &config).await?;
    let workers = worker_api::WorkerApi {
        scheduler: scheduler.clone(),
        heartbeat_interval: config.heartbeat_interval,
        lease_ttl: config.scheduler.lease_ttl,
        store: store.clone(),
        max_code_bytes: config.max_code_bytes,
        heartbeats: Default::default(),
        credentials: credentials.clone(),
        secrets: Arc::new(worker_api::own_secrets(&config)),
        fleet: config.agents.registry.clone(),
        registered: Default::default(),
        attempt_limits: config.agents.limits,
    };
    let ports = port_api::PortApi {
        store: store.clone(),
        orchestrator: orchestrator.clone(),
        scheduler: scheduler.clone(),
        events: events.clone(),
        credentials: credentials.clone(),
    };
    // The store is open and both actors are up: serving, until one of them
    // stops (a crash the supervisor did not absorb, or a shutdown).
    let health = Health::new();
    health.set(true).await;
    not_serving_once_an_actor_stops(&health, scheduler_done, orchestrator_done);
    let mut builder = grpc_builder(&config)?;
    let serve = fvd_telemetry::spawn(
        builder
            .add_service(WorkerServiceServer::with_interceptor(
                workers,
                ServerAuth::new(credentials.clone(), Need::Connect),
            ))
            .add_service(PortServiceServer::with_interceptor(
                ports,
                ServerAuth::new(credentials.clone(), Need::Read),
            ))
            // No token: probes carry none, and it tells only up or down.
            .add_service(health.service())
            .serve_with_incoming(grpc_connections(listener, config.grpc_limits.clone())),
    );
    tracing::info!(%addr, "orchestrator listening");
    Ok(Server {
        addr,
        tls: config.tls.is_some(),
        store,
        scheduler,
        orchestrator,
        events,
        credentials,
        health,
        serve,
    })
}
