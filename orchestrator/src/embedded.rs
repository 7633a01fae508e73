//! Embedded mode: the same orchestrator and one local worker in this
//! process, talking real gRPC over loopback, with a fresh bearer token per
//! run so nothing else on the host can drive the port meanwhile.
//!
//! It differs from a fleet in two settings only (see [`ServerConfig`]): it
//! resumes only the port it was started for, and its fleet is fixed (a job
//! the one worker can never hold is refused at once). [`Embedded::start`]
//! returns once the worker has registered (the scheduler's readiness
//! signal, no polling), so the first runs are dispatched at once.

use std::time::Duration;

use fvd_actors::scheduler::{SchedulerConfig, SchedulerMsg};
use fvd_proto::auth::Token;
use fvd_store::Store;
use fvd_worker::client::WorkerConfig;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{Server, ServerConfig, ServerError};

/// How long start-up waits for the local worker to register.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("cannot listen on loopback: {0}")]
    Listen(std::io::Error),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("the local worker did not register within {} s", READY_TIMEOUT.as_secs())]
    NotReady,
}

/// An orchestrator on loopback over a port's embedded state, with no
/// worker and no port resumed: the way `fvd cancel` and `fvd reset` reach
/// a port no process runs, through the same `PortService` calls and actors
/// as everything else (they never write the store themselves).
#[derive(Debug)]
pub struct Control {
    server: Server,
    token: Token,
}

impl Control {
    pub async fn start(store: Store) -> Result<Self, EmbeddedError> {
        let (server, token) = serve_on_loopback(store, Default::default()).await?;
        Ok(Self { server, token })
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn token(&self) -> &Token {
        &self.token
    }

    pub async fn stop(self) {
        self.server.shutdown().await;
    }
}

/// A running embedded orchestrator and its worker.
#[derive(Debug)]
pub struct Embedded {
    server: Server,
    token: Token,
    shutdown: CancellationToken,
    worker: JoinHandle<Result<(), fvd_worker::client::ClientError>>,
}

impl Embedded {
    /// Starts the server on `127.0.0.1:0` with `store` and `agents`, then
    /// the worker of `worker` (its orchestrator URL and token are set
    /// here), and returns once the worker has registered. The fresh token
    /// joins the secrets agents' output is redacted of.
    pub async fn start(
        store: Store,
        mut worker: WorkerConfig,
        agents: fvd_workspace::agent::AgentPolicy,
    ) -> Result<Self, EmbeddedError> {
        let (server, token) = serve_on_loopback(store, agents).await?;
        worker.orchestrator = server.url();
        worker.token = Some(token.clone());
        let shutdown = CancellationToken::new();
        // Embedded mode never drains: the port's end stops the worker.
        let worker = fvd_telemetry::spawn(fvd_worker::client::run(
            worker,
            shutdown.clone(),
            CancellationToken::new(),
        ));
        let ready = ractor::call_t!(
            server.scheduler,
            |reply| SchedulerMsg::WhenWorkers { workers: 1, reply },
            READY_TIMEOUT.as_millis() as u64
        );
        let embedded = Self {
            server,
            token,
            shutdown,
            worker,
        };
        if ready.is_err() {
            embedded.stop().await;
            return Err(EmbeddedError::NotReady);
        }
        Ok(embedded)
    }

    /// The loopback URL of the orchestrator.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The bearer token every call must carry.
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// Stops the worker (its running jobs are ended first), then the
    /// server and its actors.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.worker.await;
        self.server.shutdown().await;
    }
}

/// Embedded mode's server over `store` on `127.0.0.1:0` with a fresh
/// token, which joins the secrets agents' output is redacted of: no port
/// resumed, a fixed fleet, the checkout owning the store.
async fn serve_on_loopback(
    store: Store,
    mut agents: fvd_workspace::agent::AgentPolicy,
) -> Result<(Server, Token), EmbeddedError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(EmbeddedError::Listen)?;
    let token = Token::random();
    agents
        .secrets
        .add(crate::worker_api::TOKEN_NAME, token.value().as_bytes());
    let config = ServerConfig {
        token: Some(token.clone()),
        // Only the port asked for runs here, on this machine's worker: a
        // job it can never hold is refused at once, not waited for.
        resume_on_start: false,
        // The state is REPO/.fvd: a new path is the same checkout moved.
        checkout_owns_store: true,
        scheduler: SchedulerConfig {
            fixed_fleet: true,
            ..Default::default()
        },
        agents,
        ..Default::default()
    };
    let server = crate::start(listener, store, config).await?;
    Ok((server, token))
}
