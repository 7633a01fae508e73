//! The standard gRPC health service (`grpc.health.v1`), in process: the
//! orchestrator's on its own listener and on a plaintext health-only one,
//! and a worker's (`fvd worker --health-listen`) as its connection comes,
//! goes and drains.

use std::time::Duration;

use fvd_proto::auth::Token;
use fvd_store::Store;
use fvd_worker::client::WorkerConfig;
use fvd_worker::health::{HealthListener, LIVENESS, LinkReporter};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

async fn client(addr: std::net::SocketAddr) -> HealthClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

async fn check(client: &mut HealthClient<Channel>, name: &str) -> ServingStatus {
    let r = client
        .check(HealthCheckRequest {
            service: name.into(),
        })
        .await
        .unwrap_or_else(|s| panic!("check {name:?}: {s}"))
        .into_inner();
    ServingStatus::try_from(r.status).unwrap()
}

/// Polls `name` until it reports `want`, failing after a deadline.
async fn eventually(client: &mut HealthClient<Channel>, name: &str, want: ServingStatus) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let got = check(client, name).await;
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name:?} stayed {got:?}, expected {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn orchestrator(dir: &tempfile::TempDir, token: &Token) -> fvd_orchestrator::Server {
    let store = Store::open_path(&dir.path().join("state.db"))
        .await
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    // A token is required for the fvd services, never for health.
    let config = fvd_orchestrator::ServerConfig {
        token: Some(token.clone()),
        ..Default::default()
    };
    fvd_orchestrator::start(listener, store, config)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orchestrator_serves_health_until_it_shuts_down() {
    let dir = tempfile::tempdir().unwrap();
    let token = Token::random();
    let server = orchestrator(&dir, &token).await;
    let side = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let side_addr = side.local_addr().unwrap();
    let side_task = server.health.serve_on(side);
    let mut main = client(server.addr).await;
    let mut plain = client(side_addr).await;
    for name in fvd_orchestrator::HEALTH_SERVICES {
        assert_eq!(
            check(&mut main, name).await,
            ServingStatus::Serving,
            "{name:?}"
        );
        assert_eq!(
            check(&mut plain, name).await,
            ServingStatus::Serving,
            "{name:?}"
        );
    }
    let unknown = main
        .check(HealthCheckRequest {
            service: "fvd.v1.Nothing".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    // Shutting down: NOT_SERVING while both listeners still answer.
    server.begin_shutdown().await;
    for name in fvd_orchestrator::HEALTH_SERVICES {
        assert_eq!(
            check(&mut main, name).await,
            ServingStatus::NotServing,
            "{name:?}"
        );
        assert_eq!(
            check(&mut plain, name).await,
            ServingStatus::NotServing,
            "{name:?}"
        );
    }
    server.shutdown().await;
    side_task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_is_ready_while_registered_and_alive_until_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let token = Token::random();
    let server = orchestrator(&dir, &token).await;
    let addr = server.addr;
    let config = WorkerConfig {
        orchestrator: server.url(),
        worker_id: "w-health".into(),
        host: "localhost".into(),
        workspace: dir.path().join("ws"),
        gpus: Vec::new(),
        cpu_slots: 1,
        labels: Default::default(),
        grace: Duration::from_secs(1),
        max_backoff: Duration::from_millis(200),
        token: Some(token.clone()),
        tls_ca: None,
        provides: Vec::new(),
        code_cache_bytes: fvd_worker::code::DEFAULT_CACHE_BYTES,
        max_output_bytes: fvd_worker::exec::DEFAULT_MAX_OUTPUT_BYTES,
        jail: fvd_sandbox::Jail::off(),
        mps: None,
    };
    let link = LinkReporter::default();
    let listener = HealthListener::bind("127.0.0.1:0").await.unwrap();
    let health_addr = listener.addr;
    let health_stop = CancellationToken::new();
    let health = fvd_telemetry::spawn(listener.serve(link.clone(), health_stop.clone()));
    let mut probe = client(health_addr).await;
    // Not yet dialled: alive, not ready.
    assert_eq!(check(&mut probe, "").await, ServingStatus::NotServing);
    assert_eq!(check(&mut probe, LIVENESS).await, ServingStatus::Serving);

    let shutdown = CancellationToken::new();
    let drain = CancellationToken::new();
    let worker = fvd_telemetry::spawn(fvd_worker::client::run_reporting(
        config,
        shutdown.clone(),
        drain.clone(),
        link.clone(),
    ));
    eventually(&mut probe, "", ServingStatus::Serving).await;

    // The orchestrator goes away: reconnecting is not ready, but alive.
    server.shutdown().await;
    eventually(&mut probe, "", ServingStatus::NotServing).await;
    assert_eq!(check(&mut probe, LIVENESS).await, ServingStatus::Serving);

    // It comes back on the same address: ready again.
    let store = Store::open_path(&dir.path().join("state.db"))
        .await
        .unwrap();
    // The aborted server lets go of its port as its task is dropped.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let listener = loop {
        match TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(e) => {
                assert!(tokio::time::Instant::now() < deadline, "rebind {addr}: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let config = fvd_orchestrator::ServerConfig {
        token: Some(token.clone()),
        ..Default::default()
    };
    let again = fvd_orchestrator::start(listener, store, config)
        .await
        .unwrap();
    eventually(&mut probe, "", ServingStatus::Serving).await;

    // Draining: not ready, still alive; with no job it then leaves.
    drain.cancel();
    eventually(&mut probe, "", ServingStatus::NotServing).await;
    assert_eq!(check(&mut probe, LIVENESS).await, ServingStatus::Serving);
    tokio::time::timeout(Duration::from_secs(20), worker)
        .await
        .expect("a drained worker without jobs leaves")
        .unwrap()
        .unwrap();
    health_stop.cancel();
    health.await.unwrap().unwrap();
    again.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_worker_is_neither_ready_nor_alive() {
    let dir = tempfile::tempdir().unwrap();
    // No orchestrator at all: the worker keeps dialling.
    let config = WorkerConfig {
        orchestrator: "http://127.0.0.1:9".into(),
        worker_id: "w-stop".into(),
        host: "localhost".into(),
        workspace: dir.path().join("ws"),
        gpus: Vec::new(),
        cpu_slots: 1,
        labels: Default::default(),
        grace: Duration::from_secs(1),
        max_backoff: Duration::from_millis(200),
        token: None,
        tls_ca: None,
        provides: Vec::new(),
        code_cache_bytes: fvd_worker::code::DEFAULT_CACHE_BYTES,
        max_output_bytes: fvd_worker::exec::DEFAULT_MAX_OUTPUT_BYTES,
        jail: fvd_sandbox::Jail::off(),
        mps: None,
    };
    let link = LinkReporter::default();
    let listener = HealthListener::bind("127.0.0.1:0").await.unwrap();
    let mut probe = client(listener.addr).await;
    let health_stop = CancellationToken::new();
    let health = fvd_telemetry::spawn(listener.serve(link.clone(), health_stop.clone()));
    let shutdown = CancellationToken::new();
    let worker = fvd_telemetry::spawn(fvd_worker::client::run_reporting(
        config,
        shutdown.clone(),
        CancellationToken::new(),
        link.clone(),
    ));
    eventually(&mut probe, LIVENESS, ServingStatus::Serving).await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(20), worker)
        .await
        .expect("a stopped worker returns")
        .unwrap()
        .unwrap();
    eventually(&mut probe, LIVENESS, ServingStatus::NotServing).await;
    assert_eq!(check(&mut probe, "").await, ServingStatus::NotServing);
    health_stop.cancel();
    health.await.unwrap().unwrap();
}
