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
//! - No request is served under a `Host` name that is not the dashboard's
//!   own ([`guard`]): a DNS-rebinding page can neither read nor post.
//! - Read-only unless an orchestrator runs in this process; then an answer
//!   is accepted only with a porter or admin credential of the
//!   orchestrator's (form field or `Authorization`; any caller when it
//!   checks none), whose porter owns the port, from an `Origin` on the
//!   dashboard's host list, and goes through `OrchestratorMsg::Answer` like
//!   `fvd answer`, with the credential's name. A viewer credential shows
//!   pages only (`--dashboard-require-viewer` makes one necessary for them).
//! - No more connections and live streams than [`guard::Limits`] allow, so
//!   the dashboard cannot take the descriptors gRPC needs.
//! - No secret reaches a page: the pages show what the store holds
//!   (reasons and output are redacted by the worker before they are sent),
//!   never a job's environment, and a token typed into a form is never
//!   echoed back, stored or logged (a session keeps the credential's name).

pub mod guard;
mod html;
mod live;
mod routes;
pub mod views;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fvd_actors::orchestrator::OrchestratorMsg;
use fvd_actors::scheduler::SchedulerMsg;
use fvd_proto::auth::Credentials;
use fvd_store::Store;
use fvd_store::messages::PortEvent;
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
    /// The orchestrator's credentials (open for a read-only dashboard).
    credentials: Credentials,
    changes: broadcast::Sender<Change>,
    /// One line for the header: where the data comes from.
    mode: String,
    /// Set by [`serve`] for the address it listens on.
    shield: Arc<guard::Shield>,
}

impl Dashboard {
    /// Beside the orchestrator of this process: fed by its event channel,
    /// answers go to its actor, its credentials guard them (and the pages,
    /// when a viewer is required).
    pub fn live(server: &crate::Server) -> Self {
        let changes = live::forward(server.events.subscribe());
        Dashboard {
            store: server.store.clone(),
            orchestrator: Some(server.orchestrator.clone()),
            scheduler: Some(server.scheduler.clone()),
            credentials: server.credentials.clone(),
            changes,
            mode: format!("orchestrator {}", server.url()),
            shield: unbound_shield(),
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
            credentials: Credentials::open(),
            changes,
            mode: format!("read-only · {label}"),
            shield: unbound_shield(),
        }
    }

    /// The change feed the pages follow (tests and benchmarks watch it).
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// What the page offers the browser that sent `headers`: no form
    /// without an orchestrator; a form without a token field for an open
    /// orchestrator or a browser signed in as a porter or admin (its
    /// session answers, issue #43); else one that asks for the token.
    fn access(&self, headers: &axum::http::HeaderMap) -> html::Access {
        match self.orchestrator {
            None => html::Access::ReadOnly,
            Some(_) => html::Access::Answer {
                token: !self.credentials.is_open()
                    && !routes::session_of(self, headers).is_some_and(|w| w.role().changes()),
            },
        }
    }
}

/// A running dashboard.
#[derive(Debug)]
pub struct DashboardServer {
    pub addr: SocketAddr,
    pub task: JoinHandle<std::io::Result<()>>,
    /// Its guard: allowed hosts, caps, open connections and streams.
    pub shield: Arc<guard::Shield>,
}

impl DashboardServer {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// A shield that accepts no host: replaced by [`serve`] before any
/// request is routed.
fn unbound_shield() -> Arc<guard::Shield> {
    Arc::new(guard::Shield::new(
        SocketAddr::from(([0, 0, 0, 0], 0)),
        &guard::Options::default(),
    ))
}

/// Serves `dashboard` on `listener` under `options` (hosts, readers,
/// caps) until the task is aborted. A required viewer needs credentials.
pub fn serve(
    listener: TcpListener,
    mut dashboard: Dashboard,
    options: guard::Options,
) -> std::io::Result<DashboardServer> {
    let addr = listener.local_addr()?;
    if options.require_viewer && dashboard.credentials.is_open() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a required viewer credential needs the orchestrator to have credentials (--auth or --token-file)",
        ));
    }
    let shield = Arc::new(guard::Shield::new(addr, &options));
    dashboard.shield = shield.clone();
    let app = routes::router(dashboard).into_make_service_with_connect_info::<guard::ClientAddr>();
    let listener = guard::GuardedListener::new(listener, shield.clone());
    let task = fvd_telemetry::spawn(async move { axum::serve(listener, app).await });
    let l = &shield.limits;
    tracing::info!(
        %addr,
        hosts = %shield.hosts().join(","),
        max_connections = l.max_connections,
        max_connections_per_client = l.max_connections_per_client,
        max_streams = l.max_streams,
        max_streams_per_client = l.max_streams_per_client,
        idle_s = l.idle.as_secs_f64(),
        "dashboard listening"
    );
    Ok(DashboardServer { addr, task, shield })
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
