//! What stands between the network and the dashboard's pages (issue #27,
//! item 8): which `Host` names it answers to, who may read it, and how
//! much of the process's file descriptors and tasks it may take.
//!
//! - **Hosts.** Every request's `Host` must be one of the allowed names
//!   (the listen address, `localhost`, `127.0.0.1` and `[::1]` with its
//!   port, and those the operator adds); a page a DNS-rebinding site loads
//!   under its own name is refused (421). A cross-site post is refused when
//!   its `Origin` is not `http(s)://` one of those names: `Origin` is
//!   compared with the list, never with `Host` (which the rebinding page
//!   controls).
//! - **Readers.** With `require_viewer`, every page, twin and stream needs
//!   a credential that reads (viewer, porter, admin): `Authorization:
//!   Bearer` for scripts, or a session cookie that `POST /login` sets for a
//!   browser. A session holds the credential's name and hash, never the
//!   token, and is checked against the live credentials on every request,
//!   so a revoked token's sessions end with it.
//! - **Connections.** The listener holds at most `max_connections`
//!   connections (and `max_connections_per_client` from one address):
//!   one more is accepted and closed at once, so its descriptor is back
//!   before the next accept. A connection with no byte read or written for
//!   `idle` is closed (a client that stops reading a stream, a connection
//!   left open). Live streams (server-sent events) are capped in total and
//!   per client below that (429), so they cannot take every connection.
//!
//! The defaults follow the process's descriptor limit: a quarter of it for
//! connections, a quarter of those for streams; the rest stays for gRPC,
//! the database and workers' code fetches.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use fvd_proto::auth::{Credentials, Principal};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// Caps on what the dashboard may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub max_connections_per_client: usize,
    pub max_streams: usize,
    pub max_streams_per_client: usize,
    /// A connection idle this long (no byte either way) is closed.
    pub idle: Duration,
}

impl Limits {
    /// Caps for a process that may open `fds` descriptors: a quarter of
    /// them for connections (16 to 1,024), a quarter of those for streams
    /// (at least 4); per client 32 connections and 8 streams, or fewer.
    pub fn for_fd_limit(fds: u64) -> Self {
        let max_connections = (fds / 4).clamp(16, 1024) as usize;
        let max_streams = (max_connections / 4).max(4);
        Limits {
            max_connections,
            max_connections_per_client: max_connections.min(32),
            max_streams,
            max_streams_per_client: max_streams.min(8),
            idle: Duration::from_secs(60),
        }
    }

    /// [`Limits::for_fd_limit`] of this process's soft limit.
    pub fn for_this_process() -> Self {
        Self::for_fd_limit(fd_limit().unwrap_or(1024))
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self::for_this_process()
    }
}

/// The soft limit of open files of this process (`/proc/self/limits`).
pub fn fd_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line.split_whitespace().nth(3)?;
    if soft == "unlimited" {
        return Some(u64::MAX);
    }
    soft.parse().ok()
}

/// Who may reach the pages, and with what.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `Host` names to accept besides the defaults (`NAME` or `NAME:PORT`;
    /// a name without a port is accepted with the listen port and bare).
    pub hosts: Vec<String>,
    /// Every GET needs a credential that reads.
    pub require_viewer: bool,
    /// `None`: from the process's descriptor limit.
    pub limits: Option<Limits>,
}

/// The live state of the guard: allowed hosts, counts, sessions.
#[derive(Debug)]
pub struct Shield {
    /// Which listener it guards, in its log lines (`dashboard`, `grpc`).
    label: &'static str,
    hosts: Vec<String>,
    pub(super) require_viewer: bool,
    pub(super) limits: Limits,
    counts: Mutex<Counts>,
    sessions: Mutex<HashMap<String, Session>>,
}

#[derive(Debug, Default)]
struct Counts {
    connections: usize,
    streams: usize,
    per_client: HashMap<IpAddr, (usize, usize)>,
    /// When a refusal was last logged (one line per 10 s at most).
    last_warned: Option<Instant>,
}

#[derive(Debug, Clone)]
struct Session {
    who: Principal,
    expires: Instant,
}

/// How long a browser session lasts.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at most; the oldest go first.
const MAX_SESSIONS: usize = 1024;
/// The session cookie's name.
pub const SESSION_COOKIE: &str = "fvd_session";

impl Shield {
    /// The guard of a dashboard listening on `addr`.
    pub fn new(addr: SocketAddr, options: &Options) -> Self {
        let port = addr.port();
        let mut hosts = vec![
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
        ];
        if !addr.ip().is_unspecified() {
            hosts.push(match addr {
                SocketAddr::V4(a) => format!("{}:{port}", a.ip()),
                SocketAddr::V6(a) => format!("[{}]:{port}", a.ip()),
            });
        }
        for h in &options.hosts {
            let h = h.trim().to_ascii_lowercase();
            if h.is_empty() {
                continue;
            }
            let has_port = h.rsplit_once(':').is_some_and(|(_, p)| {
                !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(']')
            });
            if has_port {
                hosts.push(h);
            } else {
                hosts.push(format!("{h}:{port}"));
                hosts.push(h);
            }
        }
        hosts.sort();
        hosts.dedup();
        Shield {
            label: "dashboard",
            hosts,
            require_viewer: options.require_viewer,
            limits: options.limits.clone().unwrap_or_default(),
            counts: Mutex::default(),
            sessions: Mutex::default(),
        }
    }

    /// The connection caps and idle timeout of `limits` alone, for the
    /// gRPC listener (issue #38: 22,000 idle connections were held): it
    /// has no hosts, sessions or streams of its own to guard.
    pub fn connections_only(limits: Limits) -> Self {
        Shield {
            label: "grpc",
            hosts: Vec::new(),
            require_viewer: false,
            limits,
            counts: Mutex::default(),
            sessions: Mutex::default(),
        }
    }

    /// How often a live stream sends a comment when nothing changed: well
    /// within the idle timeout (at most 15 s), so an open page is never
    /// idle while a stalled reader still is.
    pub fn keep_alive(&self) -> Duration {
        (self.limits.idle / 3).clamp(Duration::from_millis(50), Duration::from_secs(15))
    }

    /// The names `Host` may carry.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// Whether a request's `Host` is one of ours.
    pub fn host_allowed(&self, host: Option<&str>) -> bool {
        host.map(str::to_ascii_lowercase)
            .is_some_and(|h| self.hosts.contains(&h))
    }

    /// Whether an `Origin` (absent for scripts, which prove themselves
    /// with a token) names one of our hosts.
    pub fn origin_allowed(&self, origin: Option<&str>) -> bool {
        let Some(origin) = origin else {
            return true;
        };
        let origin = origin.to_ascii_lowercase();
        let Some(host) = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
        else {
            return false;
        };
        self.hosts.iter().any(|a| a == host)
    }

    fn warn(&self, counts: &mut Counts, what: &str) {
        let now = Instant::now();
        if counts
            .last_warned
            .is_none_or(|t| now.duration_since(t) > Duration::from_secs(10))
        {
            counts.last_warned = Some(now);
            tracing::warn!(
                "{}: {what} (connections {}, streams {}); refusing more",
                self.label,
                counts.connections,
                counts.streams
            );
        }
    }

    /// A connection slot for a client at `ip`, or `None` when a cap is
    /// reached.
    fn connection(self: &Arc<Self>, ip: IpAddr) -> Option<ConnSlot> {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let mine = c.per_client.get(&ip).map_or(0, |x| x.0);
        if c.connections >= self.limits.max_connections {
            self.warn(&mut c, "at the connection cap");
            return None;
        }
        if mine >= self.limits.max_connections_per_client {
            self.warn(&mut c, &format!("{ip} is at the per-client connection cap"));
            return None;
        }
        c.connections += 1;
        c.per_client.entry(ip).or_default().0 += 1;
        Some(ConnSlot {
            shield: self.clone(),
            ip,
        })
    }

    /// A live-stream slot for a client at `ip`, or why not.
    pub fn stream(self: &Arc<Self>, ip: IpAddr) -> Result<StreamSlot, String> {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let mine = c.per_client.get(&ip).map_or(0, |x| x.1);
        if c.streams >= self.limits.max_streams {
            self.warn(&mut c, "at the live-stream cap");
            return Err(format!(
                "the dashboard serves {} live streams at most; close a page or try again later",
                self.limits.max_streams
            ));
        }
        if mine >= self.limits.max_streams_per_client {
            self.warn(
                &mut c,
                &format!("{ip} is at the per-client live-stream cap"),
            );
            return Err(format!(
                "{} live streams from one client at most; close a page",
                self.limits.max_streams_per_client
            ));
        }
        c.streams += 1;
        c.per_client.entry(ip).or_default().1 += 1;
        Ok(StreamSlot {
            shield: self.clone(),
            ip,
        })
    }

    /// Open connections and streams now.
    pub fn load(&self) -> (usize, usize) {
        let c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        (c.connections, c.streams)
    }

    fn release(&self, ip: IpAddr, conn: bool) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if conn {
            c.connections = c.connections.saturating_sub(1);
        } else {
            c.streams = c.streams.saturating_sub(1);
        }
        if let Some(e) = c.per_client.get_mut(&ip) {
            if conn {
                e.0 = e.0.saturating_sub(1);
            } else {
                e.1 = e.1.saturating_sub(1);
            }
            if *e == (0, 0) {
                c.per_client.remove(&ip);
            }
        }
    }

    /// A new browser session for `who`; returns its id (the cookie).
    pub fn open_session(&self, who: Principal) -> String {
        let id = fvd_proto::auth::Token::random().value().to_string();
        let now = Instant::now();
        let mut s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        s.retain(|_, v| v.expires > now);
        if s.len() >= MAX_SESSIONS
            && let Some(oldest) = s
                .iter()
                .min_by_key(|(_, v)| v.expires)
                .map(|(k, _)| k.clone())
        {
            s.remove(&oldest);
        }
        s.insert(
            id.clone(),
            Session {
                who,
                expires: now + SESSION_TTL,
            },
        );
        id
    }

    /// Who the session `id` is, while its credential holds.
    pub fn session(&self, id: &str, credentials: &Credentials) -> Option<Principal> {
        let mut s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let who = s.get(id).filter(|v| v.expires > now).map(|v| v.who.clone());
        match who {
            Some(w) if credentials.holds(&w) => Some(w),
            _ => {
                s.remove(id);
                None
            }
        }
    }
}

/// A connection's place under the caps; given back when it closes.
#[derive(Debug)]
struct ConnSlot {
    shield: Arc<Shield>,
    ip: IpAddr,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.shield.release(self.ip, true);
    }
}

/// A live stream's place under the caps; held by the stream's task.
#[derive(Debug)]
pub struct StreamSlot {
    shield: Arc<Shield>,
    ip: IpAddr,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.shield.release(self.ip, false);
    }
}

/// The dashboard's listener: accepts a connection only under the caps.
#[derive(Debug)]
pub struct GuardedListener {
    inner: TcpListener,
    shield: Arc<Shield>,
}

impl GuardedListener {
    pub fn new(inner: TcpListener, shield: Arc<Shield>) -> Self {
        Self { inner, shield }
    }
}

impl axum::serve::Listener for GuardedListener {
    type Io = GuardedIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, addr) = match self.inner.accept().await {
                Ok(x) => x,
                Err(e) => {
                    // Out of descriptors or memory: wait a moment rather
                    // than spin; the caps make this rare.
                    tracing::warn!(error = %e, "dashboard: cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Over a cap: closed at once, its descriptor back.
            let Some(slot) = self.shield.connection(addr.ip()) else {
                drop(stream);
                continue;
            };
            let idle = self.shield.limits.idle;
            return (
                GuardedIo {
                    stream,
                    _slot: slot,
                    idle,
                    deadline: Box::pin(tokio::time::sleep(idle)),
                },
                addr,
            );
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

impl GuardedListener {
    /// Its connections as a stream, for `tonic`'s `serve_with_incoming`;
    /// the listener closes when the stream is dropped.
    pub fn into_stream(self) -> Incoming {
        Incoming {
            next: Box::pin(next_connection(self)),
        }
    }
}

async fn next_connection(mut l: GuardedListener) -> (GuardedListener, GuardedIo) {
    let (io, _) = axum::serve::Listener::accept(&mut l).await;
    (l, io)
}

type Accepting = Pin<Box<dyn std::future::Future<Output = (GuardedListener, GuardedIo)> + Send>>;

/// A [`GuardedListener`]'s connections, one at a time.
pub struct Incoming {
    next: Accepting,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Incoming")
    }
}

impl tokio_stream::Stream for Incoming {
    type Item = io::Result<GuardedIo>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.next.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready((l, io)) => {
                self.next = Box::pin(next_connection(l));
                Poll::Ready(Some(Ok(io)))
            }
        }
    }
}

impl tonic::transport::server::Connected for GuardedIo {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

/// The client address of a request (its connection's peer).
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub SocketAddr);

impl Connected<IncomingStream<'_, GuardedListener>> for ClientAddr {
    fn connect_info(stream: IncomingStream<'_, GuardedListener>) -> Self {
        ClientAddr(*stream.remote_addr())
    }
}

/// A connection that closes itself after `idle` without progress either
/// way, and gives its slot back when dropped.
#[derive(Debug)]
pub struct GuardedIo {
    stream: TcpStream,
    _slot: ConnSlot,
    idle: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl GuardedIo {
    fn progressed(&mut self) {
        let at = tokio::time::Instant::now() + self.idle;
        self.deadline.as_mut().reset(at);
    }

    /// Pending, or an error once the connection has been idle too long.
    fn idle_check<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection idle",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for GuardedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.progressed();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.idle_check(cx),
        }
    }
}

impl AsyncWrite for GuardedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    this.progressed();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.idle_check(cx),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_write_vectored(cx, bufs) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    this.progressed();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.idle_check(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shield(hosts: &[&str]) -> Arc<Shield> {
        Arc::new(Shield::new(
            "127.0.0.1:7080".parse().unwrap(),
            &Options {
                hosts: hosts.iter().map(|h| h.to_string()).collect(),
                require_viewer: false,
                limits: Some(Limits {
                    max_connections: 3,
                    max_connections_per_client: 2,
                    max_streams: 2,
                    max_streams_per_client: 1,
                    idle: Duration::from_secs(60),
                }),
            },
        ))
    }

    #[test]
    fn only_our_names_are_hosts_and_origins() {
        let s = shield(&["Dash.Example.org", "proxy.example.org:443"]);
        for ok in [
            "127.0.0.1:7080",
            "localhost:7080",
            "[::1]:7080",
            "dash.example.org:7080",
            "dash.example.org",
            "proxy.example.org:443",
        ] {
            assert!(s.host_allowed(Some(ok)), "{ok}");
        }
        for bad in ["evil.example:7080", "127.0.0.1:7081", "localhost", ""] {
            assert!(!s.host_allowed(Some(bad)), "{bad}");
        }
        assert!(!s.host_allowed(None));
        // A rebinding page's Origin is its own name, whatever Host says.
        assert!(!s.origin_allowed(Some("http://evil.example:7080")));
        assert!(!s.origin_allowed(Some("null")));
        assert!(s.origin_allowed(Some("http://127.0.0.1:7080")));
        assert!(s.origin_allowed(Some("https://proxy.example.org:443")));
        assert!(s.origin_allowed(None));
    }

    #[test]
    fn caps_hold_per_client_and_in_total_and_slots_come_back() {
        let s = shield(&[]);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let c1 = s.connection(a).unwrap();
        let _c2 = s.connection(a).unwrap();
        assert!(s.connection(a).is_none(), "per client");
        let _c3 = s.connection(b).unwrap();
        assert!(s.connection(b).is_none(), "in total");
        drop(c1);
        assert!(s.connection(b).is_some());
        let s1 = s.stream(a).unwrap();
        assert!(s.stream(a).unwrap_err().contains("from one client"));
        let _s2 = s.stream(b).unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        assert!(s.stream(c).unwrap_err().contains("at most"));
        drop(s1);
        assert!(s.stream(c).is_ok());
        assert_eq!(s.load().1, 1);
    }

    #[test]
    fn limits_follow_the_descriptor_limit() {
        let l = Limits::for_fd_limit(1024);
        assert_eq!((l.max_connections, l.max_streams), (256, 64));
        assert_eq!(
            (l.max_connections_per_client, l.max_streams_per_client),
            (32, 8)
        );
        let l = Limits::for_fd_limit(64);
        assert_eq!((l.max_connections, l.max_streams), (16, 4));
        assert!(fd_limit().is_some());
    }
}
