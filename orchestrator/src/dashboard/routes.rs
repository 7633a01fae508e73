//! The routes: pages, their JSON twins, their event streams, a run's
//! output as it grows, the drift plots, and the answer form.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::extract::{Form, Json, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use fvd_actors::orchestrator::{AnswerChoice, OrchestratorMsg, PortError};
use fvd_store::StoreError;
use maud::Markup;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

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
        .route("/workers", get(workers))
        .route("/api/workers", get(api_workers))
        .route("/workers/events", get(workers_events))
        .route("/assets/dashboard.css", get(css))
        .route("/assets/dashboard.js", get(js))
        .with_state(dash)
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

async fn index_events(State(d): State<Dashboard>) -> impl IntoResponse {
    live::sections(d, None, FLEET_TICK, |d| async move {
        views::index(&d.store)
            .await
            .ok()
            .map(|v| html::index_sections(&v))
    })
}

async fn port_view(d: &Dashboard, family: &str) -> Result<views::PortView, Failure> {
    views::port(&d.store, family)
        .await?
        .ok_or_else(|| no_port(family))
}

async fn port(State(d): State<Dashboard>, Path(family): Path<String>) -> Response {
    let r = port_view(&d, &family).await;
    page(&d, r.map(|v| html::port_page(&v, d.access(), &d.mode)))
}

async fn api_port(State(d): State<Dashboard>, Path(family): Path<String>) -> Response {
    json(port_view(&d, &family).await)
}

async fn port_events(State(d): State<Dashboard>, Path(family): Path<String>) -> impl IntoResponse {
    let f = family.clone();
    live::sections(d, Some(family), PORT_TICK, move |d| {
        let f = f.clone();
        async move {
            let access = d.access();
            views::port(&d.store, &f)
                .await
                .ok()
                .flatten()
                .map(|v| html::port_sections(&v, access))
        }
    })
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
    views::component(&d.store, family, name, run)
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
    Path((family, name)): Path<(String, String)>,
) -> impl IntoResponse {
    let f = family.clone();
    live::sections(d, Some(family), PORT_TICK, move |d| {
        let (f, n) = (f.clone(), name.clone());
        async move {
            views::component(&d.store, &f, &n, None)
                .await
                .ok()
                .flatten()
                .map(|v| html::component_sections(&v))
        }
    })
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

async fn workers_events(State(d): State<Dashboard>) -> impl IntoResponse {
    live::sections(d, None, FLEET_TICK, |d| async move {
        views::workers(&d.store, d.scheduler.as_ref())
            .await
            .ok()
            .map(|v| html::workers_sections(&v))
    })
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
    Path((family, name)): Path<(String, String)>,
    Query(q): Query<LogQuery>,
) -> Response {
    let jobs = match d.store.jobs_of(&family, &name).await {
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
        .keep_alive(KeepAlive::default())
        .into_response()
}

// ----- drift plots ----------------------------------------------------------------

async fn plot(
    State(d): State<Dashboard>,
    Path((family, name, step)): Path<(String, String, u32)>,
) -> Response {
    let not_found = |m: String| (StatusCode::NOT_FOUND, m).into_response();
    let inv = match d.store.latest_trace(&family, &name).await {
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

/// A cross-site form post carries another site's `Origin`: refused, so a
/// page elsewhere cannot answer through a browser that can reach this one.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    origin
        .split_once("://")
        .is_some_and(|(_, rest)| rest == host)
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
    if !same_origin(headers) {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "answer refused: posted from another origin",
        ));
    }
    if let Some(want) = &d.token {
        let got = token.or_else(|| bearer(headers)).unwrap_or_default();
        if !want.verify(&got) {
            return Err(Failure::new(
                StatusCode::UNAUTHORIZED,
                "missing or wrong orchestrator token",
            ));
        }
    }
    let choice = choice?;
    let r = orch
        .call(
            |reply| OrchestratorMsg::Answer {
                family,
                id,
                choice,
                traceparent: None,
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
    fn another_origin_is_refused() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:7071".parse().unwrap());
        assert!(same_origin(&h));
        h.insert(header::ORIGIN, "http://127.0.0.1:7071".parse().unwrap());
        assert!(same_origin(&h));
        h.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(!same_origin(&h));
    }
}
