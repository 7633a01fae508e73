//! The routes: pages, their JSON twins, their event streams, a run's
//! output as it grows and searched, the drift plots, the answer form and
//! the login of a viewer; every request first passes [`guard_request`]
//! (its `Host`, and a reader's credential when one is required).

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Form, Json, Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use fvd_actors::orchestrator::{AnswerChoice, Caller, OrchestratorMsg, PortError};
use fvd_proto::auth::{Principal, Refusal};
use fvd_store::StoreError;
use maud::Markup;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::guard::{ClientAddr, SESSION_COOKIE, StreamSlot};
use super::html::{self, seg};
use super::{Dashboard, live, views};

const CSS: &str = include_str!("assets/dashboard.css");
const JS: &str = include_str!("assets/dashboard.js");

/// How often a page re-renders without an event (workers join and leave
/// without a port event; the index shows new ports).
const FLEET_TICK: Duration = Duration::from_secs(1);
const PORT_TICK: Duration = Duration::from_secs(3);
/// How long an answer waits for the orchestrator actor.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

pub fn router(dash: Dashboard) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/api/ports", get(api_index))
        .route("/events", get(index_events))
        .route("/ports/{family}", get(port))
        .route("/api/ports/{family}", get(api_port))
        .route("/ports/{family}/events", get(port_events))
        .route("/ports/{family}/answer", post(answer_form))
        .route("/api/ports/{family}/answer", post(answer_json))
        .route("/ports/{family}/components/{component}", get(component))
        .route(
            "/api/ports/{family}/components/{component}",
            get(api_component),
        )
        .route(
            "/ports/{family}/components/{component}/events",
            get(component_events),
        )
        .route(
            "/ports/{family}/components/{component}/log",
            get(log_follow),
        )
        .route(
            "/ports/{family}/components/{component}/trace/{step}/plot.svg",
            get(plot),
        )
        .route(
            "/ports/{family}/components/{component}/log.txt",
            get(log_text),
        )
        .route("/ports/{family}/components/{component}/search", get(search))
        .route(
            "/api/ports/{family}/components/{component}/search",
            get(api_search),
        )
        .route("/workers", get(workers))
        .route("/api/workers", get(api_workers))
        .route("/workers/events", get(workers_events))
        .route("/assets/dashboard.css", get(css))
        .route("/assets/dashboard.js", get(js))
        .route("/login", get(login_page).post(login))
        .layer(axum::middleware::from_fn_with_state(
            dash.clone(),
            guard_request,
        ))
        .with_state(dash)
}

/// A header's value as text.
fn header_str<'a>(headers: &'a HeaderMap, name: &header::HeaderName) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The value of cookie `name`.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(name)?.strip_prefix('='))
}

/// Who reads: a bearer token, else the browser's session.
fn reader(d: &Dashboard, headers: &HeaderMap) -> Result<Principal, Refusal> {
    if let Some(token) = bearer(headers) {
        return d.credentials.resolve(&token);
    }
    session_of(d, headers).ok_or(Refusal::Missing)
}

/// The credential the browser's session cookie stands for, if it has a
/// live one.
pub(super) fn session_of(d: &Dashboard, headers: &HeaderMap) -> Option<Principal> {
    cookie(headers, SESSION_COOKIE).and_then(|id| d.shield.session(id, &d.credentials))
}

/// First for every request: a `Host` the dashboard answers to (else 421:
/// a DNS-rebinding page names its own host), then, when a viewer is
/// required, a credential that reads for every GET but the login page and
/// the assets.
async fn guard_request(State(d): State<Dashboard>, req: Request, next: Next) -> Response {
    let host = header_str(req.headers(), &header::HOST);
    if !d.shield.host_allowed(host) {
        return (
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "this dashboard answers to {} only; add a name with --dashboard-host",
                d.shield.hosts().join(", ")
            ),
        )
            .into_response();
    }
    let path = req.uri().path();
    let open_path = path == "/login" || path.starts_with("/assets/");
    let reads = matches!(*req.method(), Method::GET | Method::HEAD);
    if d.shield.require_viewer && reads && !open_path {
        match reader(&d, req.headers()) {
            Ok(who) if who.role().reads() => {}
            refused => {
                let why = match refused {
                    Ok(who) => format!(
                        "credential {} may not read the dashboard: that needs a viewer, porter or admin credential",
                        who.describe()
                    ),
                    Err(Refusal::Missing) => "sign in with a viewer, porter or admin token".into(),
                    Err(Refusal::Unknown) => {
                        "token not known to this orchestrator (wrong, or revoked)".into()
                    }
                };
                let api = path.starts_with("/api/")
                    || path.ends_with("/events")
                    || path.ends_with("/log");
                if api || wants_json(req.headers()) {
                    return (
                        StatusCode::UNAUTHORIZED,
                        Json(serde_json::json!({ "error": why })),
                    )
                        .into_response();
                }
                let next = req
                    .uri()
                    .path_and_query()
                    .map_or("/".to_string(), |p| p.to_string());
                return (
                    StatusCode::UNAUTHORIZED,
                    html::login_page(&next, &why, &d.mode),
                )
                    .into_response();
            }
        }
    }
    next.run(req).await
}

#[derive(Debug, Deserialize)]
struct LoginQuery {
    next: Option<String>,
}

/// Where a login may send the browser: a path of this dashboard only,
/// else `/`. It starts with one `/` (not `//` or `/\`, which name another
/// host), it holds no whitespace, and neither it nor its percent-decoding
/// holds a backslash or a control character: browsers drop tabs and
/// newlines from a `Location`, so `/%09/evil.example` (decoded by the form
/// to `/\t/…`) would read as `//evil.example`.
fn local_path(next: Option<&str>) -> String {
    let same_site = |p: &str| {
        p.starts_with('/')
            && !p.starts_with("//")
            && !p.starts_with("/\\")
            && !p.chars().any(|c| c == '\\' || c.is_control())
    };
    match next {
        Some(p)
            if same_site(p)
                && !p.chars().any(char::is_whitespace)
                && same_site(&percent_decoded(p)) =>
        {
            p.to_string()
        }
        _ => "/".to_string(),
    }
}

/// `s` with each `%XX` replaced by its byte (lossily, as UTF-8); a `%`
/// without two hex digits stays as it is.
fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |j: usize| b.get(j).and_then(|c| (*c as char).to_digit(16));
        match (b[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn login_page(State(d): State<Dashboard>, Query(q): Query<LoginQuery>) -> Response {
    html::login_page(&local_path(q.next.as_deref()), "", &d.mode).into_response()
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    token: String,
    #[serde(default)]
    next: Option<String>,
}

/// A browser signs in with a token that reads: it gets a session cookie
/// (the token itself is kept nowhere).
async fn login(
    State(d): State<Dashboard>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    let next = local_path(f.next.as_deref());
    if !d
        .shield
        .origin_allowed(header_str(&headers, &header::ORIGIN))
    {
        return (
            StatusCode::FORBIDDEN,
            html::login_page(
                &next,
                "sign-in refused: posted from another origin",
                &d.mode,
            ),
        )
            .into_response();
    }
    if d.credentials.is_open() {
        return Redirect::to(&next).into_response();
    }
    let why = match d.credentials.resolve(&f.token) {
        Ok(who) if who.role().reads() => {
            tracing::info!(credential = %who.name(), "dashboard sign-in");
            let id = d.shield.open_session(who);
            let cookie =
                format!("{SESSION_COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age=43200");
            return ([(header::SET_COOKIE, cookie)], Redirect::to(&next)).into_response();
        }
        Ok(who) => format!(
            "credential {} may not read the dashboard: that needs a viewer, porter or admin credential",
            who.describe()
        ),
        Err(_) => "token not known to this orchestrator (wrong, or revoked)".to_string(),
    };
    (
        StatusCode::UNAUTHORIZED,
        html::login_page(&next, &why, &d.mode),
    )
        .into_response()
}

/// A live stream's slot for the client, or the 429 that says why not.
fn stream_slot(d: &Dashboard, client: ClientAddr) -> Result<StreamSlot, Response> {
    d.shield
        .stream(client.0.ip())
        .map_err(|why| (StatusCode::TOO_MANY_REQUESTS, why).into_response())
}

/// An error as the page or twin that hit it shows it.
struct Failure {
    code: StatusCode,
    message: String,
}

impl Failure {
    fn new(code: StatusCode, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
    }
}

impl From<crate::query::QueryError> for Failure {
    fn from(e: crate::query::QueryError) -> Self {
        let code = if e.is_not_found() {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        Failure::new(code, e.to_string())
    }
}

fn no_port(family: &str) -> Failure {
    Failure::new(StatusCode::NOT_FOUND, format!("no port of family {family}"))
}

fn page(dash: &Dashboard, r: Result<Markup, Failure>) -> Response {
    match r {
        Ok(m) => m.into_response(),
        Err(f) => (
            f.code,
            html::error_page(f.code.as_str(), &f.message, "/", &dash.mode),
        )
            .into_response(),
    }
}

fn json<T: serde::Serialize>(r: Result<T, Failure>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(f) => (f.code, Json(serde_json::json!({ "error": f.message }))).into_response(),
    }
}

// ----- pages and twins --------------------------------------------------------

async fn index(State(d): State<Dashboard>) -> Response {
    let r = views::index(&d.store).await.map_err(Failure::from);
    page(&d, r.map(|v| html::index_page(&v, &d.mode)))
}

async fn api_index(State(d): State<Dashboard>) -> Response {
    json(views::index(&d.store).await.map_err(Failure::from))
}

async fn index_events(
    State(d): State<Dashboard>,
    ConnectInfo(client): ConnectInfo<ClientAddr>,
) -> Response {
    let slot = match stream_slot(&d, client) {
        Ok(s) => s,
        Err(r) => return r,
    };
    live::sections(d, slot, None, FLEET_TICK, |d| async move {
        views::index(&d.store)
            .await
            .ok()
            .map(|v| html::index_sections(&v))
    })
    .into_response()
}

async fn port_view(d: &Dashboard, family: &str) -> Result<views::PortView, Failure> {
    views::port(&d.store, d.scheduler.as_ref(), family)
        .await?
        .ok_or_else(|| no_port(family))
}

async fn port(
    State(d): State<Dashboard>,
    Path(family): Path<String>,
    headers: HeaderMap,
) -> Response {
    let r = port_view(&d, &family).await;
    let access = d.access(&headers);
    page(&d, r.map(|v| html::port_page(&v, access, &d.mode)))
}

async fn api_port(State(d): State<Dashboard>, Path(family): Path<String>) -> Response {
    json(port_view(&d, &family).await)
}

async fn port_events(
    State(d): State<Dashboard>,
    ConnectInfo(client): ConnectInfo<ClientAddr>,
    Path(family): Path<String>,
    headers: HeaderMap,
) -> Response {
    // The page's form as it was first rendered for this browser.
    let access = d.access(&headers);
    let slot = match stream_slot(&d, client) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let f = family.clone();
    live::sections(d, slot, Some(family), PORT_TICK, move |d| {
        let f = f.clone();
        async move {
            views::port(&d.store, d.scheduler.as_ref(), &f)
                .await
                .ok()
                .flatten()
                .map(|v| html::port_sections(&v, access))
        }
    })
    .into_response()
}

#[derive(Debug, Deserialize)]
struct RunQuery {
    run: Option<u32>,
}

async fn component_view(
    d: &Dashboard,
    family: &str,
    name: &str,
    run: Option<u32>,
) -> Result<views::ComponentPage, Failure> {
    views::component(&d.store, d.scheduler.as_ref(), family, name, run)
        .await?
        .ok_or_else(|| {
            Failure::new(
                StatusCode::NOT_FOUND,
                format!("port {family} has no component {name}"),
            )
        })
}

async fn component(
    State(d): State<Dashboard>,
    Path((family, name)): Path<(String, String)>,
    Query(q): Query<RunQuery>,
) -> Response {
    let r = component_view(&d, &family, &name, q.run).await;
    page(&d, r.map(|v| html::component_page(&v, &d.mode)))
}

async fn api_component(
    State(d): State<Dashboard>,
    Path((family, name)): Path<(String, String)>,
    Query(q): Query<RunQuery>,
) -> Response {
    json(component_view(&d, &family, &name, q.run).await)
}

async fn component_events(
    State(d): State<Dashboard>,
    ConnectInfo(client): ConnectInfo<ClientAddr>,
    Path((family, name)): Path<(String, String)>,
) -> Response {
    let slot = match stream_slot(&d, client) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let f = family.clone();
    live::sections(d, slot, Some(family), PORT_TICK, move |d| {
        let (f, n) = (f.clone(), name.clone());
        async move {
            views::component(&d.store, d.scheduler.as_ref(), &f, &n, None)
                .await
                .ok()
                .flatten()
                .map(|v| html::component_sections(&v))
        }
    })
    .into_response()
}

async fn workers(State(d): State<Dashboard>) -> Response {
    let r = views::workers(&d.store, d.scheduler.as_ref()).await;
    page(
        &d,
        r.map_err(Failure::from)
            .map(|v| html::workers_page(&v, &d.mode)),
    )
}

async fn api_workers(State(d): State<Dashboard>) -> Response {
    json(
        views::workers(&d.store, d.scheduler.as_ref())
            .await
            .map_err(Failure::from),
    )
}

async fn workers_events(
    State(d): State<Dashboard>,
    ConnectInfo(client): ConnectInfo<ClientAddr>,
) -> Response {
    let slot = match stream_slot(&d, client) {
        Ok(s) => s,
        Err(r) => return r,
    };
    live::sections(d, slot, None, FLEET_TICK, |d| async move {
        views::workers(&d.store, d.scheduler.as_ref())
            .await
            .ok()
            .map(|v| html::workers_sections(&v))
    })
    .into_response()
}

// ----- a run's output, followed -------------------------------------------------

#[derive(Debug, Deserialize)]
struct LogQuery {
    run: u32,
    after: Option<u64>,
}

/// Server-sent `log` events with the run's output after chunk `after`,
/// then `end` when the run has ended.
async fn log_follow(
    State(d): State<Dashboard>,
    ConnectInfo(client): ConnectInfo<ClientAddr>,
    Path((family, name)): Path<(String, String)>,
    Query(q): Query<LogQuery>,
) -> Response {
    let slot = match stream_slot(&d, client) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let jobs = match crate::query::runs(&d.store, &family, Some(&name)).await {
        Ok(j) => j,
        Err(e) => return json::<()>(Err(e.into())),
    };
    let Some(job) = jobs.into_iter().find(|j| j.run_no == q.run) else {
        return json::<()>(Err(Failure::new(
            StatusCode::NOT_FOUND,
            format!("no run {} of component {name} in port {family}", q.run),
        )));
    };
    let mut chunks = crate::query::log_pump_after(d.store.clone(), job.job_id, true, q.after);
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(16);
    fvd_telemetry::spawn(async move {
        // The stream's place under the caps, given back when it ends.
        let _slot = slot;
        while let Some(c) = chunks.recv().await {
            let ev = match c {
                Ok((_, data)) => Event::default().event("log").data(
                    serde_json::to_string(&String::from_utf8_lossy(&data)).unwrap_or_default(),
                ),
                Err(e) => Event::default().event("error").data(e.to_string()),
            };
            if tx.send(Ok(ev)).await.is_err() {
                return;
            }
        }
        let _ = tx.send(Ok(Event::default().event("end").data(""))).await;
    });
    Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(d.shield.keep_alive()))
        .into_response()
}

#[derive(Debug, Deserialize)]
struct SearchQuery {
    /// The run (its latest that started when absent).
    run: Option<u32>,
    #[serde(default)]
    q: Option<String>,
}

async fn search_view(
    d: &Dashboard,
    family: &str,
    name: &str,
    q: &SearchQuery,
) -> Result<views::SearchView, Failure> {
    let text = q.q.as_deref().unwrap_or_default();
    views::search(&d.store, family, name, q.run, text)
        .await?
        .ok_or_else(|| {
            let run = q.run.map_or("at all".to_string(), |n| n.to_string());
            Failure::new(
                StatusCode::NOT_FOUND,
                format!("no run {run} of component {name} in port {family}"),
            )
        })
}

/// A search of a run's output as a page of the dashboard: the hits with
/// the lines around them, each linked to its place in the run's output.
async fn search(
    State(d): State<Dashboard>,
    Path((family, name)): Path<(String, String)>,
    Query(q): Query<SearchQuery>,
) -> Response {
    let r = search_view(&d, &family, &name, &q).await;
    page(&d, r.map(|v| html::search_page(&v, &d.mode)))
}

async fn api_search(
    State(d): State<Dashboard>,
    Path((family, name)): Path<(String, String)>,
    Query(q): Query<SearchQuery>,
) -> Response {
    json(search_view(&d, &family, &name, &q).await)
}

#[derive(Debug, Deserialize)]
struct LogTextQuery {
    run: u32,
    /// Only the lines holding this text (any case), numbered.
    q: Option<String>,
    /// Sent as a file to save (`Content-Disposition: attachment`).
    #[serde(default)]
    download: Option<String>,
}

/// A run's whole output as text (stdout and stderr as they came), or the
/// lines of it that hold `q`, each after its line number.
async fn log_text(
    State(d): State<Dashboard>,
    Path((family, name)): Path<(String, String)>,
    Query(q): Query<LogTextQuery>,
) -> Response {
    let jobs = match crate::query::runs(&d.store, &family, Some(&name)).await {
        Ok(j) => j,
        Err(e) => return json::<()>(Err(e.into())),
    };
    let Some(job) = jobs.into_iter().find(|j| j.run_no == q.run) else {
        return (
            StatusCode::NOT_FOUND,
            format!("no run {} of component {name} in port {family}", q.run),
        )
            .into_response();
    };
    let chunks = match crate::query::output(&d.store, &job.job_id, None).await {
        Ok(c) => c,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let bytes: Vec<u8> = chunks.into_iter().flat_map(|(_, _, data)| data).collect();
    let text = String::from_utf8_lossy(&bytes);
    let body = match q.q.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        None => text.into_owned(),
        Some(needle) => {
            let needle = needle.to_lowercase();
            text.lines()
                .enumerate()
                .filter(|(_, l)| l.to_lowercase().contains(&needle))
                .map(|(i, l)| format!("{}: {l}\n", i + 1))
                .collect()
        }
    };
    let mut headers = vec![(
        header::CONTENT_TYPE,
        "text/plain; charset=utf-8".to_string(),
    )];
    if q.download.is_some() {
        let file: String = format!("{family}-{name}-run{}.log", q.run)
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        headers.push((
            header::CONTENT_DISPOSITION,
            format!("attachment; filename=\"{file}\""),
        ));
    }
    let mut r = body.into_response();
    for (k, v) in headers {
        if let Ok(v) = header::HeaderValue::from_str(&v) {
            r.headers_mut().insert(k, v);
        }
    }
    r
}

// ----- drift plots ----------------------------------------------------------------

async fn plot(
    State(d): State<Dashboard>,
    Path((family, name, step)): Path<(String, String, u32)>,
) -> Response {
    let not_found = |m: String| (StatusCode::NOT_FOUND, m).into_response();
    let inv = match crate::query::latest_trace(&d.store, &family, &name).await {
        Ok(Some(i)) => i,
        Ok(None) => return not_found(format!("component {name} of port {family} was not traced")),
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let Some(report) = inv
        .steps
        .into_iter()
        .find(|s| s.step == step)
        .and_then(|s| s.report)
    else {
        return not_found(format!("step {step} of {family}/{name} has no report"));
    };
    match serde_json::from_value::<fvd_trace::Report>(report) {
        Ok(r) => (
            [(header::CONTENT_TYPE, "image/svg+xml")],
            fvd_trace::plot::render_svg(&r),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("step {step} of {family}/{name} holds a malformed report: {e}"),
        )
            .into_response(),
    }
}

// ----- answers ----------------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct AnswerForm {
    id: String,
    #[serde(default)]
    option: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    token: Option<String>,
}

/// The bearer token of `Authorization`, if any.
fn bearer(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    v.strip_prefix("Bearer ").map(str::to_string)
}

fn choice(option: Option<&str>, text: Option<&str>) -> Result<AnswerChoice, Failure> {
    let option = option.map(str::trim).filter(|s| !s.is_empty());
    let text = text.map(str::trim).filter(|s| !s.is_empty());
    match option.map(str::parse::<u32>) {
        Some(Ok(n)) if n > 0 => Ok(AnswerChoice::Option(n)),
        Some(Err(_)) => Err(Failure::new(
            StatusCode::BAD_REQUEST,
            "option is not a number",
        )),
        _ => match text {
            Some(t) => Ok(AnswerChoice::Text(t.to_string())),
            None => Err(Failure::new(
                StatusCode::BAD_REQUEST,
                "an answer needs an option or a text",
            )),
        },
    }
}

/// Checks the caller and passes the answer to the orchestrator actor, as
/// `fvd answer` does over gRPC.
async fn answer(
    d: &Dashboard,
    headers: &HeaderMap,
    family: String,
    id: String,
    choice: Result<AnswerChoice, Failure>,
    token: Option<String>,
) -> Result<serde_json::Value, Failure> {
    let Some(orch) = &d.orchestrator else {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            format!(
                "this dashboard is read-only: answer with fvd answer {family} {id} --option N --repo DIR"
            ),
        ));
    };
    // A rebinding page posts with its own name as Origin: compared with
    // the dashboard's host list, never with Host.
    if !d
        .shield
        .origin_allowed(header_str(headers, &header::ORIGIN))
    {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "answer refused: posted from another origin",
        ));
    }
    let token = token
        .filter(|t| !t.trim().is_empty())
        .or_else(|| bearer(headers));
    // A browser signed in answers as its session's credential: the post
    // came from this dashboard's own origin (checked above) and the
    // cookie is SameSite=Strict.
    let who = match token {
        _ if d.credentials.is_open() => Principal::anonymous(),
        None => match session_of(d, headers) {
            Some(who) => who,
            None => {
                return Err(Failure::new(
                    StatusCode::UNAUTHORIZED,
                    "answering needs a porter or admin token (or a browser signed in as one)",
                ));
            }
        },
        Some(t) => d.credentials.resolve(&t).map_err(|_| {
            Failure::new(
                StatusCode::UNAUTHORIZED,
                "token not known to this orchestrator (wrong, or revoked)",
            )
        })?,
    };
    if !who.role().changes() {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            format!(
                "credential {} may not answer: that needs a porter or admin credential",
                who.describe()
            ),
        ));
    }
    let caller = Caller {
        name: who.name().to_string(),
        admin: who.role() == fvd_proto::credentials::Role::Admin,
    };
    let choice = choice?;
    let r = orch
        .call(
            |reply| OrchestratorMsg::Answer {
                family,
                id,
                choice,
                traceparent: None,
                caller,
                reply,
            },
            Some(ANSWER_TIMEOUT),
        )
        .await;
    let row = match r {
        Ok(ractor::rpc::CallResult::Success(r)) => r.map_err(|e| {
            let code = match &e {
                PortError::UnknownFamily(_) | PortError::UnknownEscape { .. } => {
                    StatusCode::NOT_FOUND
                }
                PortError::InvalidAnswer(_) => StatusCode::BAD_REQUEST,
                PortError::NotYours { .. } => StatusCode::FORBIDDEN,
                PortError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
                _ => StatusCode::CONFLICT,
            };
            Failure::new(code, e.to_string())
        })?,
        Ok(ractor::rpc::CallResult::Timeout) => {
            return Err(Failure::new(
                StatusCode::GATEWAY_TIMEOUT,
                "orchestrator did not answer in time",
            ));
        }
        _ => {
            return Err(Failure::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "orchestrator actor is down",
            ));
        }
    };
    Ok(serde_json::json!({ "escape": row }))
}

fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("application/json"))
}

/// The page's form: JSON for the page's script, a redirect back to the
/// port (or an error page) for a browser without it.
async fn answer_form(
    State(d): State<Dashboard>,
    Path(family): Path<String>,
    headers: HeaderMap,
    Form(f): Form<AnswerForm>,
) -> Response {
    let c = choice(f.option.as_deref(), f.text.as_deref());
    let r = answer(&d, &headers, family.clone(), f.id, c, f.token).await;
    if wants_json(&headers) {
        return json(r);
    }
    let back = format!("/ports/{}", seg(&family));
    match r {
        Ok(_) => Redirect::to(&format!("{back}#questions")).into_response(),
        Err(e) => (
            e.code,
            html::error_page("answer refused", &e.message, &back, &d.mode),
        )
            .into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct AnswerBody {
    id: String,
    #[serde(default)]
    option: Option<u32>,
    #[serde(default)]
    text: Option<String>,
}

/// For scripts: `{"id": "E001", "option": 1}` with `Authorization: Bearer`.
async fn answer_json(
    State(d): State<Dashboard>,
    Path(family): Path<String>,
    headers: HeaderMap,
    Json(b): Json<AnswerBody>,
) -> Response {
    let opt = b.option.map(|n| n.to_string());
    let c = choice(opt.as_deref(), b.text.as_deref());
    json(answer(&d, &headers, family, b.id, c, None).await)
}

// ----- assets ---------------------------------------------------------------------

async fn css() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS)
}

async fn js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        JS,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_choice_is_an_option_or_a_text() {
        assert!(matches!(
            choice(Some("2"), None),
            Ok(AnswerChoice::Option(2))
        ));
        // The "other" radio (0) takes the text.
        assert!(matches!(
            choice(Some("0"), Some(" use the preset ")),
            Ok(AnswerChoice::Text(t)) if t == "use the preset"
        ));
        assert_eq!(
            choice(Some("x"), None).err().map(|f| f.code),
            Some(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            choice(Some("0"), Some("  ")).err().map(|f| f.code),
            Some(StatusCode::BAD_REQUEST)
        );
    }

    #[test]
    fn cookies_and_next_paths_are_read_strictly() {
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, "a=1; fvd_session=abc; b=2".parse().unwrap());
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie(&h, "fvd"), None);
        assert_eq!(local_path(Some("/ports/x?y=1")), "/ports/x?y=1");
        assert_eq!(local_path(Some("/ok/path?x=1")), "/ok/path?x=1");
        assert_eq!(local_path(Some("/ports/a%2Db")), "/ports/a%2Db");
        assert_eq!(local_path(None), "/");
        for bad in ["//evil.example/", "https://evil.example/", "\\\\evil"] {
            assert_eq!(local_path(Some(bad)), "/", "{bad}");
        }
    }

    /// Issue #38: `next=/%09/evil.example` signed in to another site (the
    /// browser drops the tab, leaving `//evil.example`).
    #[test]
    fn a_sign_in_goes_back_to_a_same_site_path_only() {
        for bad in [
            // As the form decodes it, and as it would be if decoded once more.
            "/\t/evil.example",
            "/%09/evil.example",
            "/%0a/evil.example",
            "/%0D%0A/evil.example",
            "/%5Cevil.example",
            "/%2F/evil.example",
            "/\n/evil.example",
            "/ /evil.example",
            "//evil",
            "/\\evil",
            "https://evil",
            "evil.example",
            "",
        ] {
            assert_eq!(local_path(Some(bad)), "/", "{bad:?}");
        }
        for good in ["/", "/ok/path?x=1", "/ports/x/components/y", "/ports/a%20b"] {
            assert_eq!(local_path(Some(good)), good);
        }
        assert_eq!(percent_decoded("/a%2fb%zz%4"), "/a/b%zz%4");
    }
}
