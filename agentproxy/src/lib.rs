//! The model-API proxy of one agent attempt.
//!
//! The coding agent never holds the model API's key: fvd reads it from the
//! variable the spec names, in its own environment, and starts one proxy
//! per attempt on `127.0.0.1:0`. The agent gets the proxy's base URL and a
//! token made for this attempt; the proxy checks the token, puts the key
//! in its place and forwards the request (streamed or not, Anthropic
//! Messages, OpenAI Chat Completions and Responses, Gemini) to the
//! upstream. It meters every reply's usage, prices it, and once a budget
//! of the attempt is spent it refuses further requests and says so on
//! [`Proxy::trips`], so the caller can end the agent mid-run whatever the
//! CLI's own caps do. A 401 or 403 from the upstream, or a 429 or 5xx that
//! outlasts the retries, trips it too: the cause is outside the agent.
//!
//! Invariants:
//! - No log line, error or `Debug` output holds the key or the token: the
//!   key is a [`Secret`], requests are logged by method, path (without a
//!   `key` query parameter) and status, never by header or body.
//! - No request reaches the upstream without the attempt's token, and none
//!   after a trip.

pub mod hold;
pub mod meter;
pub mod token;
pub mod upstream;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

pub use meter::{Price, PriceTable, Tokens};
pub use token::AttemptToken;
pub use upstream::Upstream;

/// Why a proxy could not start or be configured.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("model API upstream {0}")]
    Upstream(String),
    #[error("cannot listen on 127.0.0.1: {0}")]
    Listen(std::io::Error),
    #[error("cannot make an attempt token: {0}")]
    Token(std::io::Error),
}

/// Where the key goes in a forwarded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `x-api-key` (Anthropic Messages).
    Anthropic,
    /// `Authorization: Bearer` (OpenAI Chat Completions and Responses, and
    /// the OpenAI-compatible APIs).
    OpenAi,
    /// `x-goog-api-key` (Gemini).
    Gemini,
}

/// A credential. Its `Debug` shows only that it is one.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// What an attempt may spend; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    pub usd: Option<f64>,
    pub tokens: Option<u64>,
    /// Turns: requests that offer the model tools (a CLI's side requests,
    /// a title or a summary, offer none). The turn past this many is
    /// refused and trips the proxy ([`Trip::Turns`]).
    pub turns: Option<u32>,
}

/// Retries of a request the upstream answered 408, 429, 5xx (529
/// included) or could not be reached for: `retries` more tries, waiting
/// `base`, then twice as long each time, or the `Retry-After` the upstream
/// asked for, never more than `max_wait`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retry {
    pub retries: u32,
    pub base: Duration,
    pub max_wait: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            retries: 3,
            base: Duration::from_millis(500),
            max_wait: Duration::from_secs(8),
        }
    }
}

/// One attempt's proxy.
#[derive(Debug, Clone)]
pub struct Config {
    pub api: Api,
    pub upstream: Upstream,
    pub key: Secret,
    pub limits: Limits,
    pub prices: PriceTable,
    pub retry: Retry,
    /// Names the attempt in log lines (`family/component/attempt`).
    pub label: String,
}

/// Why the proxy stopped forwarding.
#[derive(Debug, Clone, PartialEq)]
pub enum Trip {
    /// A budget of the attempt is spent (in words: which, how much).
    Budget(String),
    /// The agent asked for a turn past its cap (in words).
    Turns(String),
    /// The upstream refused the key.
    Auth { status: u16 },
    /// The upstream failed a request past its retries (`status` `None`:
    /// it could not be reached).
    Upstream {
        status: Option<u16>,
        message: String,
    },
}

/// What the attempt's requests used so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    pub tokens: Tokens,
    pub cost_usd: f64,
    /// Tokens of a model no price was found for (not in `cost_usd`).
    pub unpriced_tokens: u64,
    /// Requests forwarded (a retried one counts once).
    pub requests: u32,
    /// Of those, the ones that offered the model tools (an agent's turns).
    pub turns: u32,
    /// Extra tries of requests the upstream failed.
    pub retries: u32,
    /// Requests refused here: a wrong token, or after a trip.
    pub refused: u32,
    pub models: BTreeSet<String>,
}

struct Shared {
    cfg: Config,
    token: AttemptToken,
    /// What requests in flight reserved of the limits, and the previous
    /// reply's prompt ([`hold`]).
    held: std::sync::Mutex<(hold::Spent, hold::Prompt)>,
    usage: watch::Sender<Usage>,
    trip: watch::Sender<Option<Trip>>,
}

/// A running proxy; it stops when dropped.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    base_path: String,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("label", &self.cfg.label)
            .finish_non_exhaustive()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Proxy {
    /// Listens on `127.0.0.1:0` with a fresh token.
    pub async fn start(cfg: Config) -> Result<Proxy, ProxyError> {
        let token = AttemptToken::fresh().map_err(ProxyError::Token)?;
        Self::start_with(cfg, token).await
    }

    /// Listens on `127.0.0.1:0`, admitting `token`: the proxy of an
    /// attempt whose agent already holds it (started again after a restart
    /// of the orchestrator, with the token known by its digest).
    pub async fn start_with(cfg: Config, token: AttemptToken) -> Result<Proxy, ProxyError> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(ProxyError::Listen)?;
        let addr = listener.local_addr().map_err(ProxyError::Listen)?;
        let base_path = cfg.upstream.base_path.clone();
        let shared = Arc::new(Shared {
            cfg,
            token,
            held: std::sync::Mutex::new(Default::default()),
            usage: watch::channel(Usage::default()).0,
            trip: watch::channel(None).0,
        });
        let s = shared.clone();
        let accept = fvd_telemetry::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let s = s.clone();
                fvd_telemetry::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(s.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        tracing::debug!(label = %shared.cfg.label, %addr, upstream = %shared.cfg.upstream.url(), "model API proxy listening");
        Ok(Proxy {
            addr,
            base_path,
            shared,
            accept,
        })
    }

    /// The base URL the agent is given: the upstream's base path on the
    /// proxy's address.
    pub fn base_url(&self) -> String {
        format!("http://{}{}", self.addr, self.base_path)
    }

    /// Where it listens.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// The address alone (`http://127.0.0.1:PORT`).
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The attempt's token: what the agent sends instead of the key.
    /// `None` for a proxy started with a token known by its digest only.
    pub fn token(&self) -> Option<&str> {
        self.shared.token.value()
    }

    /// The token's digest, which may be stored (see [`AttemptToken`]).
    pub fn token_digest(&self) -> String {
        self.shared.token.digest_hex()
    }

    pub fn usage(&self) -> Usage {
        self.shared.usage.borrow().clone()
    }

    /// Changes with every metered reply.
    pub fn usage_updates(&self) -> watch::Receiver<Usage> {
        self.shared.usage.subscribe()
    }

    /// `Some` once the proxy stopped forwarding, and why.
    pub fn trips(&self) -> watch::Receiver<Option<Trip>> {
        self.shared.trip.subscribe()
    }

    pub fn tripped(&self) -> Option<Trip> {
        self.shared.trip.borrow().clone()
    }
}

/// A response body: whole, or streamed from the upstream through a channel.
type ProxyBody = Either<Full<Bytes>, ChannelBody>;

#[derive(Debug)]
struct ChannelBody(mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// Largest request body forwarded.
const MAX_REQUEST: usize = 64 << 20;

/// Request headers never forwarded: hop-by-hop ones, the ones fvd sets,
/// and every header that can carry a credential.
const DROPPED: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "accept-encoding",
    "authorization",
    "x-api-key",
    "x-goog-api-key",
    "api-key",
];

async fn handle(s: Arc<Shared>, req: Request<Incoming>) -> Result<Response<ProxyBody>, Infallible> {
    let path = log_path(req.uri());
    let method = req.method().clone();
    if !authorized(&s.token, &req) {
        s.usage.send_modify(|u| u.refused += 1);
        tracing::warn!(label = %s.cfg.label, %method, %path, "model API proxy: a request without the attempt's token was refused");
        return Ok(error(
            s.cfg.api,
            StatusCode::UNAUTHORIZED,
            "fvd proxy: this request does not carry the attempt's token",
        ));
    }
    if let Some(t) = s.trip.borrow().clone() {
        s.usage.send_modify(|u| u.refused += 1);
        let why = match t {
            Trip::Budget(w) => format!("fvd proxy: the agent budget is spent ({w})"),
            Trip::Turns(w) => format!("fvd proxy: the agent's turns are spent ({w})"),
            Trip::Auth { status } => {
                format!("fvd proxy: the upstream refused the key ({status})")
            }
            Trip::Upstream { message, .. } => format!("fvd proxy: the upstream fails: {message}"),
        };
        return Ok(error(s.cfg.api, StatusCode::FORBIDDEN, &why));
    }
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_REQUEST).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Ok(error(
                s.cfg.api,
                StatusCode::PAYLOAD_TOO_LARGE,
                "fvd proxy: the request body is too large or was cut off",
            ));
        }
    };
    let (body, model, turn) = prepare_body(&parts.uri, body);
    if let Some(max) = s.cfg.limits.turns
        && turn
        && s.usage.borrow().turns >= max
    {
        trip(&s, Trip::Turns(format!("{max} of {max} turns")));
        s.usage.send_modify(|u| u.refused += 1);
        return Ok(error(
            s.cfg.api,
            StatusCode::FORBIDDEN,
            &format!("fvd proxy: the agent's turns are spent ({max} turns)"),
        ));
    }
    // The reply bounded by what the limits have left, before it is asked.
    let (body, reserved) = match hold_request(&s, parts.uri.path(), body, &model) {
        Ok(r) => r,
        Err((status, why)) => {
            s.usage.send_modify(|u| u.refused += 1);
            tracing::warn!(label = %s.cfg.label, %method, %path, "model API proxy: {why}");
            return Ok(error(s.cfg.api, status, &format!("fvd proxy: {why}")));
        }
    };
    s.usage.send_modify(|u| {
        u.requests += 1;
        u.turns += u32::from(turn);
    });
    let resp = match forward(&s, &parts, body).await {
        Ok(r) => r,
        Err(message) => {
            tracing::warn!(label = %s.cfg.label, %method, %path, "model API proxy: {message}");
            trip(
                &s,
                Trip::Upstream {
                    status: None,
                    message: message.clone(),
                },
            );
            return Ok(error(
                s.cfg.api,
                StatusCode::BAD_GATEWAY,
                &format!("fvd proxy: {message}"),
            ));
        }
    };
    let status = resp.status();
    tracing::debug!(label = %s.cfg.label, %method, %path, status = status.as_u16(), "model API proxy: forwarded");
    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        trip(
            &s,
            Trip::Auth {
                status: status.as_u16(),
            },
        );
    } else if retryable(status) {
        trip(
            &s,
            Trip::Upstream {
                status: Some(status.as_u16()),
                message: format!(
                    "{} answered {status} past {} retries",
                    s.cfg.upstream.url(),
                    s.cfg.retry.retries
                ),
            },
        );
    }
    Ok(relay(s, resp, model, reserved).await)
}

/// A request's share of the limits, held until its reply is metered (or
/// it fails): given back when dropped.
struct Reserved {
    s: Arc<Shared>,
    share: hold::Spent,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let mut held = self.s.held.lock().unwrap_or_else(|e| e.into_inner());
        held.0.usd = (held.0.usd - self.share.usd).max(0.0);
        held.0.tokens = held.0.tokens.saturating_sub(self.share.tokens);
    }
}

/// [`hold::hold`] under the proxy's lock, so requests at once share what
/// is left rather than each taking all of it: the body to forward, and
/// its share. Refused: 403 (and the proxy trips) when nothing is left, 429
/// when requests in flight hold it.
fn hold_request(
    s: &Arc<Shared>,
    path: &str,
    body: Bytes,
    model: &str,
) -> Result<(Bytes, Reserved), (StatusCode, String)> {
    let price = s.cfg.prices.price(model);
    let mut held = s.held.lock().unwrap_or_else(|e| e.into_inner());
    let (in_flight, prompt) = *held;
    let spent = {
        let u = s.usage.borrow();
        hold::Spent {
            usd: u.cost_usd + in_flight.usd,
            tokens: u.tokens.total() + in_flight.tokens,
        }
    };
    match hold::hold(path, body, price, &s.cfg.limits, spent, prompt) {
        Ok(h) => {
            if let Some((from, to)) = h.clamped {
                tracing::info!(label = %s.cfg.label, from = ?from, to, "model API proxy: the request's output cap is lowered to what the budget has left");
            }
            held.0.usd += h.reserve.usd;
            held.0.tokens += h.reserve.tokens;
            Ok((
                h.body,
                Reserved {
                    s: s.clone(),
                    share: h.reserve,
                },
            ))
        }
        Err(why) if in_flight.tokens > 0 || in_flight.usd > 0.0 => Err((
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "the requests in flight hold what is left of the agent budget; try again once they end ({why})"
            ),
        )),
        Err(why) => {
            drop(held);
            trip(s, Trip::Budget(why.clone()));
            Err((
                StatusCode::FORBIDDEN,
                format!("the agent budget is spent ({why})"),
            ))
        }
    }
}

/// The path and query for log lines, without a `key` parameter's value.
fn log_path(uri: &hyper::Uri) -> String {
    match uri.query() {
        None => uri.path().to_string(),
        Some(q) => format!("{}?{}", uri.path(), strip_key(q)),
    }
}

fn strip_key(query: &str) -> String {
    query
        .split('&')
        .filter(|p| !p.starts_with("key="))
        .collect::<Vec<_>>()
        .join("&")
}

fn authorized(token: &AttemptToken, req: &Request<Incoming>) -> bool {
    let h = req.headers();
    let mut given: Vec<&[u8]> = Vec::new();
    for name in ["x-api-key", "x-goog-api-key", "api-key"] {
        if let Some(v) = h.get(name) {
            given.push(v.as_bytes());
        }
    }
    if let Some(v) = h.get("authorization") {
        let v = v.as_bytes();
        if v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ") {
            given.push(&v[7..]);
        }
    }
    if let Some(q) = req.uri().query() {
        for p in q.split('&') {
            if let Some(k) = p.strip_prefix("key=") {
                given.push(k.as_bytes());
            }
        }
    }
    given.iter().any(|g| token.admits(g))
}

/// The body to forward, the model it asks for and whether it is a turn
/// (it offers tools). A streamed Chat Completions request that does not
/// ask for usage is made to (its last chunk then carries it): an unmetered
/// stream would make budgets blind.
fn prepare_body(uri: &hyper::Uri, body: Bytes) -> (Bytes, String, bool) {
    let path = uri.path();
    // Gemini names the model in the path: /v1beta/models/M:generateContent.
    let from_path = path
        .rsplit('/')
        .next()
        .and_then(|last| last.split_once(':'))
        .map(|(m, _)| m.to_string());
    let Ok(mut v) = serde_json::from_slice::<Value>(&body) else {
        return (body, from_path.unwrap_or_default(), false);
    };
    let turn = v
        .get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    let model = v
        .get("model")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or(from_path)
        .unwrap_or_default();
    let chat_stream = path.ends_with("/chat/completions")
        && v.get("stream").and_then(Value::as_bool) == Some(true)
        && v.pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            != Some(true);
    if chat_stream && let Some(o) = v.as_object_mut() {
        let opts = o
            .entry("stream_options")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(opts) = opts.as_object_mut() {
            opts.insert("include_usage".into(), Value::Bool(true));
            return (
                Bytes::from(serde_json::to_vec(&v).unwrap_or_default()),
                model,
                turn,
            );
        }
    }
    (body, model, turn)
}

fn retryable(s: StatusCode) -> bool {
    matches!(s.as_u16(), 408 | 429 | 500 | 502 | 503 | 504 | 529)
}

/// Sends the request upstream with the key, retrying what may pass later.
async fn forward(
    s: &Shared,
    parts: &hyper::http::request::Parts,
    body: Bytes,
) -> Result<Response<Incoming>, String> {
    let up = &s.cfg.upstream;
    let path_q = match parts.uri.query() {
        Some(q) if !strip_key(q).is_empty() => format!("{}?{}", parts.uri.path(), strip_key(q)),
        _ => parts.uri.path().to_string(),
    };
    let mut tries = 0u32;
    loop {
        let mut b = Request::builder().method(parts.method.clone()).uri(&path_q);
        for (name, value) in &parts.headers {
            if !DROPPED.contains(&name.as_str()) {
                b = b.header(name, value);
            }
        }
        let (kname, kvalue) = key_header(s.cfg.api, &s.cfg.key)?;
        let req = b
            .header("host", up.authority())
            .header("accept-encoding", "identity")
            .header(kname, kvalue)
            .body(Full::new(body.clone()))
            .map_err(|e| format!("cannot build the upstream request: {e}"))?;
        let sent = up.send(req).await;
        let wait = match &sent {
            Ok(r) if retryable(r.status()) => Some(retry_after(r)),
            Ok(_) => None,
            Err(_) => Some(None),
        };
        match wait {
            Some(after) if tries < s.cfg.retry.retries => {
                let backoff = s.cfg.retry.base * 2u32.saturating_pow(tries);
                let wait = after.unwrap_or(backoff).min(s.cfg.retry.max_wait);
                tracing::info!(label = %s.cfg.label, try_ = tries + 1, status = ?sent.as_ref().map(|r| r.status().as_u16()).ok(), wait_ms = wait.as_millis() as u64, "model API proxy: retrying");
                tries += 1;
                s.usage.send_modify(|u| u.retries += 1);
                drop(sent);
                tokio::time::sleep(wait).await;
            }
            _ => return sent,
        }
    }
}

fn retry_after(r: &Response<Incoming>) -> Option<Duration> {
    r.headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

fn key_header(api: Api, key: &Secret) -> Result<(HeaderName, HeaderValue), String> {
    let (name, value) = match api {
        Api::Anthropic => ("x-api-key", key.expose().to_string()),
        Api::OpenAi => ("authorization", format!("Bearer {}", key.expose())),
        Api::Gemini => ("x-goog-api-key", key.expose().to_string()),
    };
    let mut v = HeaderValue::from_str(&value)
        // Not echoed: the value is the key.
        .map_err(|_| "the key holds characters a header cannot carry".to_string())?;
    v.set_sensitive(true);
    Ok((HeaderName::from_static(name), v))
}

/// Hands the upstream's response to the agent while metering it.
async fn relay(
    s: Arc<Shared>,
    resp: Response<Incoming>,
    model: String,
    reserved: Reserved,
) -> Response<ProxyBody> {
    let (parts, body) = resp.into_parts();
    let mut out = Response::builder().status(parts.status);
    for (name, value) in &parts.headers {
        if !matches!(
            name.as_str(),
            "connection" | "keep-alive" | "transfer-encoding" | "content-length"
        ) {
            out = out.header(name, value);
        }
    }
    let sse = parts
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("text/event-stream"));
    if !sse {
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        if parts.status.is_success() {
            let mut r = meter::Reading::default();
            meter::read_body(&bytes, &mut r);
            account(&s, &model, &r);
        }
        drop(reserved);
        return out
            .body(Either::Left(Full::new(bytes)))
            .unwrap_or_else(|_| {
                error(
                    s.cfg.api,
                    StatusCode::BAD_GATEWAY,
                    "fvd proxy: bad response",
                )
            });
    }
    let api = s.cfg.api;
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    fvd_telemetry::spawn(async move {
        let mut body = body;
        let mut reading = meter::Reading::default();
        let mut sse = meter::SseReader::default();
        let mut client = Some(tx);
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { break };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            sse.feed(&data, |v| reading.take(v));
            // A client that went away stops getting bytes; the reply is
            // still read to its end, since it is billed to the end.
            if let Some(c) = &client
                && c.send(data).await.is_err()
            {
                client = None;
            }
        }
        sse.finish(|v| reading.take(v));
        account(&s, &model, &reading);
        drop(reserved);
    });
    out.body(Either::Right(ChannelBody(rx)))
        .unwrap_or_else(|_| error(api, StatusCode::BAD_GATEWAY, "fvd proxy: bad response"))
}

/// Adds one reply's usage and trips the proxy when a limit is reached.
fn account(s: &Shared, asked: &str, r: &meter::Reading) {
    if !r.seen {
        return;
    }
    let model = if asked.is_empty() {
        r.model.clone().unwrap_or_default()
    } else {
        asked.to_string()
    };
    let tokens = r.tokens();
    let price = s.cfg.prices.price(&model);
    // The next request's prompt is estimated at this one's.
    let prompt = Tokens {
        output: 0,
        ..tokens
    };
    s.held.lock().unwrap_or_else(|e| e.into_inner()).1 = hold::Prompt {
        usd: price.map_or(0.0, |p| p.cost(&prompt)),
        tokens: prompt.total(),
    };
    let mut after = Usage::default();
    s.usage.send_modify(|u| {
        u.tokens.add(&tokens);
        match price {
            Some(p) => u.cost_usd += p.cost(&tokens),
            None => u.unpriced_tokens += tokens.total(),
        }
        if !model.is_empty() {
            u.models.insert(model.clone());
        }
        after = u.clone();
    });
    tracing::debug!(label = %s.cfg.label, %model, input = tokens.input, output = tokens.output, cache_read = tokens.cache_read, cache_write = tokens.cache_write, cost_usd = after.cost_usd, "model API proxy: metered");
    let l = s.cfg.limits;
    if let Some(max) = l.usd
        && after.cost_usd >= max
    {
        trip(
            s,
            Trip::Budget(format!("{:.4} of {max} USD", after.cost_usd)),
        );
    } else if let Some(max) = l.tokens
        && after.tokens.total() >= max
    {
        trip(
            s,
            Trip::Budget(format!("{} of {max} tokens", after.tokens.total())),
        );
    }
}

/// Records the first trip; later ones do not replace it.
fn trip(s: &Shared, t: Trip) {
    s.trip.send_if_modified(|cur| {
        if cur.is_some() {
            return false;
        }
        tracing::info!(label = %s.cfg.label, trip = ?t, "model API proxy: stopped forwarding");
        *cur = Some(t);
        true
    });
}

/// An error in the protocol's own shape, so the CLI shows the message.
fn error(api: Api, status: StatusCode, message: &str) -> Response<ProxyBody> {
    let body = match api {
        Api::Anthropic => serde_json::json!({"type": "error", "error": {
            "type": match status.as_u16() {
                401 => "authentication_error",
                403 => "permission_error",
                _ => "api_error",
            },
            "message": message}}),
        Api::OpenAi => {
            serde_json::json!({"error": {"message": message, "type": "fvd_proxy", "code": null}})
        }
        Api::Gemini => serde_json::json!({"error": {"code": status.as_u16(), "message": message,
            "status": "PERMISSION_DENIED"}}),
    };
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Either::Left(Full::new(Bytes::from(body.to_string()))))
        .expect("a static response builds")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_shows_in_debug_output() {
        let s = Secret::new("sk-ant-0123456789".into());
        assert!(!format!("{s:?}").contains("0123456789"));
        let cfg = Config {
            api: Api::Anthropic,
            upstream: Upstream::parse("http://127.0.0.1:1").unwrap(),
            key: s,
            limits: Limits::default(),
            prices: PriceTable::default(),
            retry: Retry::default(),
            label: "p/c/1".into(),
        };
        assert!(!format!("{cfg:?}").contains("0123456789"));
    }

    #[test]
    fn key_parameters_are_cut_from_logged_and_forwarded_queries() {
        assert_eq!(strip_key("alt=sse&key=SECRET"), "alt=sse");
        let uri: hyper::Uri = "/v1beta/models/m:streamGenerateContent?key=SECRET&alt=sse"
            .parse()
            .unwrap();
        assert!(!log_path(&uri).contains("SECRET"));
    }

    #[test]
    fn a_streamed_chat_request_is_made_to_report_usage() {
        let uri: hyper::Uri = "/v1/chat/completions".parse().unwrap();
        let (b, model, turn) = prepare_body(&uri, Bytes::from(r#"{"model":"m1","stream":true}"#));
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!((model.as_str(), turn), ("m1", false));
        let (_, _, turn) = prepare_body(
            &uri,
            Bytes::from(r#"{"model":"m1","tools":[{"type":"function"}]}"#),
        );
        assert!(turn);
        let uri: hyper::Uri = "/v1beta/models/gemini-2.5-pro:generateContent"
            .parse()
            .unwrap();
        let (_, model, _) = prepare_body(&uri, Bytes::from("{}"));
        assert_eq!(model, "gemini-2.5-pro");
    }
}
