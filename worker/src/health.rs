//! The worker's health over the standard gRPC health service
//! (`grpc.health.v1.Health`), for `fvd worker --health-listen ADDR`.
//!
//! The worker is a client (it dials the orchestrator), so this is a tiny
//! server of its own, plaintext and without a token: Kubernetes' `grpc`
//! probes speak neither TLS nor bearer tokens, and the answers say only
//! up or down. Two names answer:
//!
//! - `""` (the worker as a whole, for readiness): `SERVING` while it is
//!   connected and registered; `NOT_SERVING` while it connects or
//!   reconnects, drains or stops.
//! - [`LIVENESS`]: `SERVING` until the worker stops. A worker waiting for
//!   its orchestrator or finishing its jobs before it leaves is alive; only
//!   one that no longer answers at all (or is stopping) is not.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// The health name a liveness probe asks for.
pub const LIVENESS: &str = "liveness";

/// Where the worker's connection to its orchestrator stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Dialling, or waiting to dial again after a lost connection.
    Connecting,
    /// Connected and registered: jobs may come.
    Registered,
    /// Told to drain: no new jobs; it leaves once the running ones are
    /// reported.
    Draining,
    /// Stopping (SIGTERM): handing its jobs back and leaving.
    Stopping,
}

impl Link {
    /// The status of `""` (readiness) and of [`LIVENESS`].
    pub fn statuses(self) -> (ServingStatus, ServingStatus) {
        use ServingStatus::{NotServing, Serving};
        match self {
            Link::Registered => (Serving, Serving),
            Link::Connecting | Link::Draining => (NotServing, Serving),
            Link::Stopping => (NotServing, NotServing),
        }
    }
}

/// The worker's side: the client sets its [`Link`] here as it changes.
/// Cloning shares the state; a reporter nobody serves costs one channel.
#[derive(Debug, Clone)]
pub struct LinkReporter {
    tx: std::sync::Arc<watch::Sender<Link>>,
}

impl Default for LinkReporter {
    fn default() -> Self {
        Self {
            tx: std::sync::Arc::new(watch::channel(Link::Connecting).0),
        }
    }
}

impl LinkReporter {
    pub fn set(&self, link: Link) {
        self.tx.send_if_modified(|cur| {
            let changed = *cur != link;
            if changed {
                tracing::debug!(from = ?*cur, to = ?link, "worker link");
            }
            *cur = link;
            changed
        });
    }

    pub fn get(&self) -> Link {
        *self.tx.borrow()
    }

    fn subscribe(&self) -> watch::Receiver<Link> {
        self.tx.subscribe()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("cannot listen for health checks on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

/// A bound health listener, serving once [`HealthListener::serve`] runs.
#[derive(Debug)]
pub struct HealthListener {
    listener: TcpListener,
    pub addr: SocketAddr,
}

impl HealthListener {
    /// Binds `addr` (`HOST:PORT`; port 0 picks a free one).
    pub async fn bind(addr: &str) -> Result<Self, HealthError> {
        let bind_err = |source| HealthError::Bind {
            addr: addr.to_string(),
            source,
        };
        let listener = TcpListener::bind(addr).await.map_err(bind_err)?;
        let addr = listener.local_addr().map_err(bind_err)?;
        Ok(Self { listener, addr })
    }

    /// Answers health checks from `link` until `stop` is cancelled.
    pub async fn serve(
        self,
        link: LinkReporter,
        stop: CancellationToken,
    ) -> Result<(), tonic::transport::Error> {
        let reporter = HealthReporter::new();
        let mut rx = link.subscribe();
        let first = *rx.borrow_and_update();
        publish(&reporter, first).await;
        let follow = {
            let reporter = reporter.clone();
            async move {
                while rx.changed().await.is_ok() {
                    let now = *rx.borrow_and_update();
                    publish(&reporter, now).await;
                }
            }
        };
        let service = tonic_health::pb::health_server::HealthServer::new(
            tonic_health::server::HealthService::from_health_reporter(reporter),
        );
        let server = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(
                TcpListenerStream::new(self.listener),
                stop.cancelled_owned(),
            );
        tokio::select! {
            r = server => r,
            // The reporter lives as long as the worker: never ends first.
            _ = follow => Ok(()),
        }
    }
}

async fn publish(reporter: &HealthReporter, link: Link) {
    let (ready, live) = link.statuses();
    reporter.set_service_status("", ready).await;
    reporter.set_service_status(LIVENESS, live).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus as Wire;
    use tonic_health::pb::health_client::HealthClient;

    async fn check(client: &mut HealthClient<tonic::transport::Channel>, name: &str) -> Wire {
        let r = client
            .check(HealthCheckRequest {
                service: name.into(),
            })
            .await
            .expect("check answers")
            .into_inner();
        Wire::try_from(r.status).expect("a known status")
    }

    /// Polls until `name` reports `want` (statuses follow the link through
    /// a task), or fails after a deadline.
    async fn eventually(
        client: &mut HealthClient<tonic::transport::Channel>,
        name: &str,
        want: Wire,
    ) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let got = check(client, name).await;
            if got == want {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name:?} stayed {got:?}, expected {want:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn readiness_follows_the_link_and_liveness_holds_until_stopping() {
        let link = LinkReporter::default();
        let listener = HealthListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.addr);
        let stop = CancellationToken::new();
        let served = fvd_telemetry::spawn(listener.serve(link.clone(), stop.clone()));
        let channel = tonic::transport::Endpoint::from_shared(url)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = HealthClient::new(channel);

        eventually(&mut client, "", Wire::NotServing).await;
        eventually(&mut client, LIVENESS, Wire::Serving).await;
        link.set(Link::Registered);
        eventually(&mut client, "", Wire::Serving).await;
        link.set(Link::Connecting);
        eventually(&mut client, "", Wire::NotServing).await;
        eventually(&mut client, LIVENESS, Wire::Serving).await;
        link.set(Link::Registered);
        eventually(&mut client, "", Wire::Serving).await;
        link.set(Link::Draining);
        eventually(&mut client, "", Wire::NotServing).await;
        eventually(&mut client, LIVENESS, Wire::Serving).await;
        link.set(Link::Stopping);
        eventually(&mut client, LIVENESS, Wire::NotServing).await;
        let unknown = client
            .check(HealthCheckRequest {
                service: "fvd.v1.Nothing".into(),
            })
            .await
            .expect_err("an unknown name is refused");
        assert_eq!(unknown.code(), tonic::Code::NotFound);

        stop.cancel();
        served.await.unwrap().unwrap();
    }

    #[test]
    fn statuses_of_every_link() {
        use ServingStatus::{NotServing, Serving};
        assert_eq!(Link::Registered.statuses(), (Serving, Serving));
        assert_eq!(Link::Connecting.statuses(), (NotServing, Serving));
        assert_eq!(Link::Draining.statuses(), (NotServing, Serving));
        assert_eq!(Link::Stopping.statuses(), (NotServing, NotServing));
    }

    #[tokio::test]
    async fn a_busy_address_names_itself() {
        let first = HealthListener::bind("127.0.0.1:0").await.unwrap();
        let taken = first.addr.to_string();
        let err = HealthListener::bind(&taken).await.unwrap_err();
        assert!(err.to_string().contains(&taken), "{err}");
    }
}
