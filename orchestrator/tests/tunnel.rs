//! `WorkerService.Tunnel` against the lease (issue #38): a tunnel to an
//! agent attempt's model proxy is opened only with the credential of the
//! worker that holds the attempt's lease, whatever worker id its first
//! frame names, and only under that lease's epoch.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fvd_proto::auth::{ClientAuth, Credentials, Token};
use fvd_proto::credentials::{self, Role};
use fvd_proto::v1 as pb;
use fvd_proto::v1::worker_service_client::WorkerServiceClient;
use fvd_workspace::agent::FleetAttempt;
use support::{Harness, SimWorker, sim_worker::register};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

const JOB: &str = "fam/a/agent-1";

/// A stand-in for the attempt's model proxy: echoes what it reads, and
/// counts the connections it took.
async fn echo_proxy() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    fvd_telemetry::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            fvd_telemetry::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = sock.read(&mut buf).await {
                    if n == 0 || sock.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

/// Opens a tunnel with `token`'s credential, its first frame naming
/// `worker` and carrying `hello`; what comes back, or the refusal.
async fn tunnel(
    h: &Harness,
    token: &Token,
    worker: &str,
    epoch: u64,
    hello: &[u8],
) -> Result<Vec<u8>, tonic::Status> {
    let mut client = WorkerServiceClient::with_interceptor(
        h.channel.clone(),
        ClientAuth::new(Some(token.clone())),
    );
    let (tx, rx) = mpsc::channel(4);
    tx.send(pb::TunnelFrame {
        job_id: JOB.into(),
        lease_epoch: epoch,
        worker_id: worker.into(),
        target: "model".into(),
        data: hello.to_vec(),
    })
    .await
    .expect("first frame");
    let mut back = client.tunnel(ReceiverStream::new(rx)).await?.into_inner();
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while got.len() < hello.len() {
        match tokio::time::timeout_at(deadline, back.message()).await {
            Ok(Ok(Some(f))) => got.extend_from_slice(&f.data),
            Ok(other) => panic!("the tunnel ended after {got:?}: {other:?}"),
            Err(_) => panic!("the tunnel gave back {got:?} by the deadline"),
        }
    }
    drop(tx);
    Ok(got)
}

#[tokio::test]
async fn another_workers_credential_cannot_open_a_tunnel_to_w1s_attempt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("credentials");
    let w1 = credentials::add(&file, "w1", Role::Worker).expect("w1's credential");
    let w2 = credentials::add(&file, "w2", Role::Worker).expect("w2's credential");
    let creds = Credentials::load(Some(&file), None).expect("credentials");
    let registry = fvd_workspace::agent::FleetAttempts::default();
    let h = Harness::start_config(None, |c| {
        c.credentials = Some(creds);
        c.agents.registry = registry.clone();
    })
    .await;

    let _w1 = SimWorker::connect(h.channel.clone(), Some(w1.clone()), register("w1", 0, 1))
        .await
        .expect("w1 registers");
    let _w2 = SimWorker::connect(h.channel.clone(), Some(w2.clone()), register("w2", 0, 1))
        .await
        .expect("w2 registers");

    // An agent attempt leased to w1, its model proxy here.
    let (proxy, accepted) = echo_proxy().await;
    let _open = registry.open(
        JOB,
        FleetAttempt {
            repo: h.repo(),
            commit: String::new(),
            proxy: Some(proxy),
            tools: None,
            lease: None,
        },
    );
    registry.leased(JOB, "w1", 4);

    // w2's credential, the frame claiming to be w1 (what the red team did),
    // or saying w2: refused, naming the job, before the proxy is dialled.
    for claimed in ["w1", "w2", ""] {
        let e = tunnel(&h, &w2, claimed, 4, b"from w2")
            .await
            .expect_err("w2's credential opened a tunnel to w1's attempt");
        assert_eq!(e.code(), Code::PermissionDenied, "{claimed:?}: {e:?}");
        assert!(e.message().contains(JOB), "{e:?}");
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "a refused tunnel reached the proxy"
    );

    // w1's own credential with an earlier lease's epoch (the job placed
    // again on the same worker, an old agent still running): refused too.
    let e = tunnel(&h, &w1, "w1", 3, b"old lease")
        .await
        .expect_err("a tunnel of an earlier lease");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("epoch 4"), "{e:?}");
    assert_eq!(accepted.load(Ordering::SeqCst), 0);

    // w1's own credential: the bytes go through, both ways.
    let back = tunnel(&h, &w1, "w1", 4, b"from w1")
        .await
        .expect("w1's tunnel");
    assert_eq!(back, b"from w1");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    // w1's credential naming w2 in the frame: the frame must agree with
    // the lease too.
    let e = tunnel(&h, &w1, "w2", 4, b"x")
        .await
        .expect_err("a frame naming w2");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
}
