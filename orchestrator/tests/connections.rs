//! The gRPC listener's caps (issue #38: 22,000 idle connections were held):
//! a connection over `max_connections` is closed at once, one that sends
//! nothing is closed after `idle`, and the server keeps answering.

mod support;

use std::time::Duration;

use support::Harness;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Whether the server closes `s` within `within` (EOF or a reset), reading
/// and dropping whatever it sends first (its HTTP/2 settings).
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut sink = Vec::new();
    tokio::time::timeout(within, s.read_to_end(&mut sink))
        .await
        .is_ok()
}

fn limits(max: usize, idle: Duration) -> fvd_orchestrator::dashboard::guard::Limits {
    let mut l = fvd_orchestrator::grpc_limits(1024);
    l.max_connections = max;
    l.max_connections_per_client = max;
    l.idle = idle;
    l
}

#[tokio::test]
async fn a_connection_over_the_cap_is_closed_at_once_and_the_server_still_answers() {
    // The harness's own channel holds one of the three.
    let h = Harness::start_config(None, |c| {
        c.grpc_limits = limits(3, Duration::from_secs(600));
    })
    .await;
    let addr = h.server.addr;
    let mut a = TcpStream::connect(addr).await.unwrap();
    let mut b = TcpStream::connect(addr).await.unwrap();
    // Give the server time to take both (it accepts in order).
    assert!(!closed_within(&mut a, Duration::from_millis(300)).await);
    assert!(!closed_within(&mut b, Duration::from_millis(300)).await);
    let mut c = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed_within(&mut c, Duration::from_secs(10)).await,
        "a fourth connection was kept"
    );
    // One gone, one more is taken again.
    drop(a);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut d = TcpStream::connect(addr).await.unwrap();
        if !closed_within(&mut d, Duration::from_millis(300)).await {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot of a closed connection never came back"
        );
    }
    drop(b);
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_idle_time() {
    let h = Harness::start_config(None, |c| {
        c.grpc_limits = limits(64, Duration::from_millis(500));
    })
    .await;
    let mut idle = TcpStream::connect(h.server.addr).await.unwrap();
    assert!(
        closed_within(&mut idle, Duration::from_secs(15)).await,
        "an idle connection was held"
    );
    // A real client gets through, on a fresh connection.
    let channel = fvd_proto::transport::endpoint(&h.server.url(), None)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("a health check after the idle one was closed");
}
