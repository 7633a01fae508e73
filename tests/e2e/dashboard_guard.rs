//! The dashboard's guard (issue #27, item 8) against a real `fvd
//! orchestrator serve --dashboard`, from raw sockets:
//!
//! - a DNS-rebinding page (a `Host` and an `Origin` of another name) can
//!   neither read nor answer; a viewer's credential reads but may not
//!   answer, and a worker's may not even read;
//! - 600 connections that ask for live streams, from 40 loopback addresses,
//!   against an orchestrator whose descriptor limit is 256: the dashboard
//!   keeps to its caps (16 streams, 64 connections; the rest refused or
//!   closed at once), its descriptors stay well under the limit, and
//!   `fvd status` over gRPC answers meanwhile; idle connections are closed
//!   and the streams' slots come back. Without the caps, the same load took
//!   every descriptor and `fvd status` hung (1,100 connections against
//!   1,024 in the report).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::dashboard::Kill;
use crate::support::{LOG_FILTER, Sandbox, TestComponent, fvd, wait_for};

/// One HTTP/1.1 request with `host` and extra header lines; the status
/// line and the body (the connection is closed after it).
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    host: &str,
    headers: &str,
    body: &str,
) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Type: application/x-www-form-urlencoded\r\nAccept: application/json\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

/// Runs `fvd status` over gRPC as the viewer; how long it took to answer
/// (panics naming `what` past 30 s, or when it fails).
fn timed_status(sb: &Sandbox, url: &str, what: &str) -> Duration {
    let started = Instant::now();
    let mut status = fvd()
        .args(["status", "guarded", "--orchestrator", url])
        .args(sb.token_args("viewer"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let done = wait_for(what, Duration::from_secs(30), || status.try_wait().unwrap());
    let took = started.elapsed();
    assert!(done.success(), "{what}: {:?}", status.wait_with_output());
    took
}

/// Open file descriptors of process `pid`.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// What became of one connection that asked for a live stream.
#[derive(Debug, PartialEq)]
enum Got {
    Stream,
    TooMany,
    Closed,
    Other(String),
}

#[test]
fn a_rebinding_page_is_refused_and_a_flood_of_streams_leaves_grpc_answering() {
    let mut sb = Sandbox::new().with_auth();
    let auth = sb.auth.clone().unwrap();
    sb.port("guarded", &[TestComponent::new("one", "assert True")]);
    // The orchestrator under a descriptor limit of 256 (soft and hard), as
    // the report's was under 1,024.
    let db = sb.dir.path().join("orchestrator.db");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 256 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_fvd"))
        .args(["orchestrator", "serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(format!("sqlite://{}", db.display()))
        .arg("--auth")
        .arg(&auth.file)
        .args([
            "--dashboard",
            "127.0.0.1:0",
            "--dashboard-idle-timeout",
            "3",
        ])
        .env("FVD_LOG", LOG_FILTER)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(sb.dir.path().join("orchestrator.log")).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || {
        let l = lines.next().expect("a line").expect("stdout");
        l.rsplit(' ').next().unwrap().to_string()
    };
    let (url, dash) = (next(), next());
    std::thread::spawn(move || for _ in lines {});
    let _orch = Kill(child);
    sb.url = Some(url.clone());
    sb.worker("w1", 1);
    let submit = sb.submit_remote("guarded", &["--wait"]);
    assert!(submit.status.success(), "{submit:?}\n{}", sb.logs());
    let addr: SocketAddr = dash.strip_prefix("http://").unwrap().parse().unwrap();
    let host = addr.to_string();
    let bearer = |name: &str| {
        format!(
            "Authorization: Bearer {}\r\n",
            std::fs::read_to_string(auth.token(name)).unwrap().trim()
        )
    };

    // DNS rebinding: the page's own name as Host, then as Origin.
    let evil = format!("evil.example:{}", addr.port());
    let (status, body) = request(addr, "GET", "/api/ports", &evil, "", "");
    assert!(status.contains(" 421 "), "{status} {body}");
    assert!(!body.contains("guarded"), "{body}");
    let (status, _) = request(addr, "GET", "/api/ports", &host, "", "");
    assert!(status.contains(" 200 "), "{status}");
    let (status, _) = request(
        addr,
        "GET",
        "/api/ports",
        &format!("localhost:{}", addr.port()),
        "",
        "",
    );
    assert!(status.contains(" 200 "), "{status}");
    let form = "id=E001&option=1";
    let (status, body) = request(
        addr,
        "POST",
        "/ports/guarded/answer",
        &host,
        &format!("Origin: http://{evil}\r\n{}", bearer("root")),
        form,
    );
    assert!(
        status.contains(" 403 ") && body.contains("another origin"),
        "{status} {body}"
    );
    let (status, body) = request(
        addr,
        "POST",
        "/ports/guarded/answer",
        &host,
        &format!("Origin: http://{host}\r\n{}", bearer("viewer")),
        form,
    );
    assert!(
        status.contains(" 403 ") && body.contains("credential viewer (viewer) may not answer"),
        "{status} {body}"
    );
    let (status, body) = request(
        addr,
        "POST",
        "/ports/guarded/answer",
        &host,
        &format!("Origin: http://{host}\r\n"),
        form,
    );
    assert!(status.contains(" 401 "), "{status} {body}");

    // The flood: 600 connections from 40 addresses, each asking for the
    // index's live stream, all held open.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sse = format!("GET /events HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n");
    // The same call without the flood, for the report beside it.
    let quiet = timed_status(&sb, &url, "fvd status before the flood");
    let before = fds(pid);
    let mut held = rt.block_on(async {
        use tokio::io::AsyncWriteExt;
        let mut held = Vec::new();
        for i in 0..600u32 {
            let ip = Ipv4Addr::new(127, 0, 0, 2 + (i / 15) as u8);
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.bind(SocketAddr::from((ip, 0))).unwrap();
            match tokio::time::timeout(Duration::from_secs(5), sock.connect(addr)).await {
                Ok(Ok(mut s)) => {
                    let _ = s.write_all(sse.as_bytes()).await;
                    held.push(Some(s));
                }
                _ => held.push(None),
            }
        }
        held
    });
    // gRPC answers meanwhile.
    let took = timed_status(&sb, &url, "fvd status under the flood");
    // Every connection is answered, refused or closed; none is left
    // waiting.
    let got: Vec<Got> = rt.block_on(async {
        use tokio::io::AsyncReadExt;
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut got = Vec::new();
        for s in held.iter_mut() {
            let Some(s) = s else {
                got.push(Got::Closed);
                continue;
            };
            let mut buf = [0u8; 512];
            let left = deadline.saturating_duration_since(Instant::now());
            got.push(
                match tokio::time::timeout(left.min(Duration::from_secs(2)), s.read(&mut buf)).await
                {
                    Ok(Ok(0)) | Ok(Err(_)) => Got::Closed,
                    Ok(Ok(n)) => {
                        let head = String::from_utf8_lossy(&buf[..n]).to_string();
                        if head.starts_with("HTTP/1.1 200") {
                            Got::Stream
                        } else if head.starts_with("HTTP/1.1 429") {
                            Got::TooMany
                        } else {
                            Got::Other(head)
                        }
                    }
                    Err(_) => Got::Other("no answer".into()),
                },
            );
        }
        got
    });
    let count = |g: &Got| got.iter().filter(|x| *x == g).count();
    let others: Vec<&Got> = got.iter().filter(|g| matches!(g, Got::Other(_))).collect();
    assert!(
        others.is_empty(),
        "{} unanswered: {:?}",
        others.len(),
        others.first()
    );
    // Limits::for_fd_limit(256): 64 connections, 16 streams.
    assert_eq!(count(&Got::Stream), 16, "streams: {got:?}");
    assert!(count(&Got::TooMany) > 0, "the stream cap answered 429");
    // Most were closed at accept (the connection cap); an idle one's slot
    // may have been reused while the flood went on.
    assert!(count(&Got::Closed) > 300, "{}", count(&Got::Closed));
    let loaded = fds(pid);
    assert!(
        loaded < before + 64 + 16 && loaded < 200,
        "descriptors: {before} before, {loaded} under load"
    );

    eprintln!(
        "dashboard flood: {} streams, {} refused (429), {} closed at once; orchestrator descriptors {before} -> {loaded} (limit 256); fvd status answered in {took:?} (before the flood: {quiet:?})",
        count(&Got::Stream),
        count(&Got::TooMany),
        count(&Got::Closed)
    );

    // Idle connections (the refused ones, kept alive) are closed after the
    // idle timeout; the streams stay, kept alive by their comments.
    let settled = rt.block_on(async {
        use tokio::io::AsyncReadExt;
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut closed_idle = 0;
        let mut streams_alive = 0;
        for (s, g) in held.iter_mut().zip(&got) {
            let Some(s) = s else { continue };
            if *g == Got::Closed {
                continue;
            }
            let mut buf = [0u8; 4096];
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left.min(Duration::from_secs(5)), s.read(&mut buf)).await
                {
                    Ok(Ok(0)) | Ok(Err(_)) => {
                        if *g == Got::TooMany {
                            closed_idle += 1;
                        }
                        break;
                    }
                    Ok(Ok(_)) if *g == Got::Stream => {
                        streams_alive += 1;
                        break;
                    }
                    Ok(Ok(_)) => continue,
                    Err(_) => break,
                }
            }
        }
        (closed_idle, streams_alive)
    });
    assert_eq!(settled.0, count(&Got::TooMany), "idle connections closed");
    assert_eq!(settled.1, 16, "the streams stay alive");

    // Let everything go: the slots come back, a new stream is served.
    drop(held);
    let (status, _) = wait_for(
        "a stream slot to be free again",
        Duration::from_secs(30),
        || {
            let mut s = TcpStream::connect(addr).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            write!(s, "{sse}").ok()?;
            let mut buf = [0u8; 256];
            let n = s.read(&mut buf).ok()?;
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            head.starts_with("HTTP/1.1 200").then_some((head, s))
        },
    );
    assert!(status.contains("text/event-stream"), "{status}");
}
