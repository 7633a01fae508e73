//! The web dashboard: server-rendered pages of the ports and the fleet,
//! each with a JSON twin under `/api`, kept live over server-sent events.
//!
//! Two ways to run it, one router: beside a live orchestrator
//! ([`Dashboard::live`], `fvd orchestrator serve --dashboard ADDR`), fed by
//! the same [`PortEvent`] channel as the gRPC `Watch` and able to pass an
//! answer to the orchestrator actor; or over a state database another
//! process writes ([`Dashboard::read_only`], `fvd dashboard --repo DIR`),
//! opened read-only and polled for changes, with no form at all.
//!
//! Invariants:
//! - Read-only unless an orchestrator runs in this process; then an answer
//!   is accepted only with the orchestrator's bearer token when it has one
//!   (compared in constant time), from the page's own origin, and goes
//!   through `OrchestratorMsg::Answer` like `fvd answer`.
//! - No secret reaches a page: the pages show what the store holds
//!   (reasons and output are redacted by the worker before they are sent),
//!   never a job's environment, and a token typed into the form is never
//!   echoed back.

mod html;
mod live;
mod routes;
pub mod views;

use std::net::SocketAddr;
use std::time::Duration;

use fvd_actors::orchestrator::OrchestratorMsg;
use fvd_actors::scheduler::SchedulerMsg;
use fvd_proto::auth::Token;
use fvd_store::Store;
use fvd_store::model::PortEvent;
use ractor::ActorRef;
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

pub use live::Change;

/// What a dashboard serves from; cheap to clone (one per request).
#[derive(Debug, Clone)]
pub struct Dashboard {
    store: Store,
    orchestrator: Option<ActorRef<OrchestratorMsg>>,
    scheduler: Option<ActorRef<SchedulerMsg>>,
    token: Option<Token>,
    changes: broadcast::Sender<Change>,
    /// One line for the header: where the data comes from.
    mode: String,
}

impl Dashboard {
    /// Beside the orchestrator of this process: fed by its event channel,
    /// answers go to its actor, `token` (the orchestrator's) guards them.
    pub fn live(server: &crate::Server, token: Option<Token>) -> Self {
        let changes = live::forward(server.events.subscribe());
        Dashboard {
            store: server.store.clone(),
            orchestrator: Some(server.orchestrator.clone()),
            scheduler: Some(server.scheduler.clone()),
            token,
            changes,
            mode: format!("orchestrator {}", server.url()),
        }
    }

    /// Over a store another process writes: polled every `poll` for
    /// changes, no answers.
    pub fn read_only(store: Store, label: &str, poll: Duration) -> Self {
        let changes = live::poll(store.clone(), poll);
        Dashboard {
            store,
            orchestrator: None,
            scheduler: None,
            token: None,
            changes,
            mode: format!("read-only · {label}"),
        }
    }

    /// The change feed the pages follow (tests and benchmarks watch it).
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    fn access(&self) -> html::Access {
        match self.orchestrator {
            None => html::Access::ReadOnly,
            Some(_) => html::Access::Answer {
                token: self.token.is_some(),
            },
        }
    }
}

/// A running dashboard.
#[derive(Debug)]
pub struct DashboardServer {
    pub addr: SocketAddr,
    pub task: JoinHandle<std::io::Result<()>>,
}

impl DashboardServer {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Serves `dashboard` on `listener` until the task is aborted.
pub fn serve(listener: TcpListener, dashboard: Dashboard) -> std::io::Result<DashboardServer> {
    let addr = listener.local_addr()?;
    let app = routes::router(dashboard);
    let task = fvd_telemetry::spawn(async move { axum::serve(listener, app).await });
    tracing::info!(%addr, "dashboard listening");
    Ok(DashboardServer { addr, task })
}

/// Whether a dashboard on `addr` is reachable only from this host.
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

impl From<&PortEvent> for Change {
    fn from(ev: &PortEvent) -> Self {
        Change {
            family: Some(ev.family().to_string()),
            at_us: live::now_us(),
        }
    }
}
