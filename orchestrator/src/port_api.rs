//! `PortService`: the gRPC edge for the CLI. Submissions and cancellations
//! go to the orchestrator actor; reads come from the store; watches come
//! from the port event channel.
//!
//! Every call arrives with the caller's [`Principal`] (the interceptor put
//! it there, having refused callers that may not read). A call that changes
//! a port (submit, answer, cancel, reset) is refused here unless the role
//! may change ports, and the orchestrator actor refuses a porter acting on
//! another's port; each runs in a span carrying `enduser.id` (the
//! credential's name) and `enduser.role`. A stream (watch, logs) ends with
//! `PERMISSION_DENIED` once its caller's credential is revoked.

use std::pin::Pin;
use std::time::Duration;

use fvd_actors::orchestrator::{AnswerChoice, Caller, OrchestratorMsg, PortError, Submission};
use fvd_proto::auth::{Credentials, Principal};
use tracing::Instrument;

use crate::query::{self, QueryError};
use crate::wire;
use fvd_actors::scheduler::SchedulerMsg;
use fvd_proto::v1 as pb;
use fvd_store::messages::PortEvent;
use fvd_store::model::PortState;
use fvd_store::{Store, StoreError};
use ractor::ActorRef;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// How long a CLI call waits for the orchestrator actor to answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct PortApi {
    pub store: Store,
    pub orchestrator: ActorRef<OrchestratorMsg>,
    /// Answers `Workers` and `Queue` with the live fleet.
    pub scheduler: ActorRef<SchedulerMsg>,
    pub events: broadcast::Sender<PortEvent>,
    /// What the interceptor checked the caller against: streams end when
    /// their caller's credential is revoked.
    pub credentials: Credentials,
}

/// The caller the interceptor resolved (a server without credentials sets
/// [`Principal::anonymous`]); a request that bypassed it is refused.
fn principal<T>(request: &Request<T>) -> Result<Principal, Status> {
    request
        .extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("no credential was checked for this call"))
}

/// The caller of a change, refused unless its role changes ports.
fn changer<T>(request: &Request<T>, what: &str) -> Result<(Principal, Caller), Status> {
    let who = principal(request)?;
    if !who.role().changes() {
        return Err(Status::permission_denied(format!(
            "credential {} may not {what}: that needs a porter or admin credential",
            who.describe()
        )));
    }
    let caller = Caller {
        name: who.name().to_string(),
        admin: who.role() == fvd_proto::credentials::Role::Admin,
    };
    Ok((who, caller))
}

/// The name an answering command gave, as a record keeps it: one line of
/// at most 64 printable characters, and none that looks like a token.
fn said_by(name: &str) -> String {
    let name: String = name.chars().filter(|c| !c.is_control()).take(64).collect();
    let name = name.trim();
    if fvd_contracts::secrets::scan_text(name, 1).is_empty() {
        name.to_string()
    } else {
        String::new()
    }
}

/// The span of a call that changes a port: who made it, as OpenTelemetry's
/// `enduser.*` attributes; its place in a trace is the caller's to set.
fn change_span(method: &str, family: &str, who: &Principal) -> tracing::Span {
    let span = tracing::info_span!(
        "PortService",
        otel.name = %format!("fvd.v1.PortService/{method}"),
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = "fvd.v1.PortService",
        rpc.method = method,
        "fvd.family" = %family,
        enduser.id = %who.name(),
        enduser.role = %who.role(),
    );
    span
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn port_status(e: PortError) -> Status {
    match e {
        PortError::InvalidSpec(m) => Status::invalid_argument(m),
        e @ (PortError::FamilyMismatch { .. } | PortError::UnknownCommit { .. }) => {
            Status::invalid_argument(e.to_string())
        }
        PortError::UnknownFamily(f) => Status::not_found(format!("no port of family {f}")),
        e @ (PortError::Busy(..) | PortError::NotRunning { .. }) => {
            Status::failed_precondition(e.to_string())
        }
        e @ PortError::UnknownEscape { .. } => Status::not_found(e.to_string()),
        e @ PortError::OtherCheckout { .. } => Status::failed_precondition(e.to_string()),
        e @ PortError::NotYours { .. } => Status::permission_denied(e.to_string()),
        PortError::InvalidAnswer(m) => Status::invalid_argument(m),
        // The spec asks for what this host does not run: an input the
        // server refuses (exit 2), not a credential or a role (exit 6,
        // which PERMISSION_DENIED means to the CLI).
        e @ PortError::AgentRefused { .. } => Status::failed_precondition(e.to_string()),
        PortError::Internal(m) => Status::internal(m),
    }
}

fn store_status(e: StoreError) -> Status {
    Status::internal(e.to_string())
}

fn query_status(e: QueryError) -> Status {
    if e.is_not_found() {
        Status::not_found(e.to_string())
    } else {
        Status::internal(e.to_string())
    }
}

/// Asks the orchestrator actor; refused at once while the store cannot
/// write (the request could not be recorded, and would only wait), as a
/// pause ([`fvd_proto::paused`]: the client exits 4, not "unreachable").
async fn call<T>(
    store: &Store,
    orch: &ActorRef<OrchestratorMsg>,
    f: impl FnOnce(ractor::RpcReplyPort<Result<T, PortError>>) -> OrchestratorMsg,
) -> Result<T, Status>
where
    T: Send + 'static,
{
    let paused = |fault: fvd_store::faults::WriteFault| {
        fvd_proto::paused::paused(format!(
            "the orchestrator cannot write its database {} ({}); try again once it can",
            store.db_name(),
            fault.error
        ))
    };
    let mut faults = store.watch_write_faults();
    if let Some(fault) = faults.borrow_and_update().clone() {
        return Err(paused(fault));
    }
    // The actor may be inside a write the full disk holds (the store
    // retries it in place): a fault that starts while this request waits
    // answers it as the pause it is, not as a timeout 30 s later.
    let fault_starts = async {
        loop {
            if faults.changed().await.is_err() {
                return std::future::pending().await;
            }
            if let Some(fault) = faults.borrow_and_update().clone() {
                return fault;
            }
        }
    };
    let answer = tokio::select! {
        answer = orch.call(f, Some(CALL_TIMEOUT)) => answer,
        fault = fault_starts => return Err(paused(fault)),
    };
    match answer {
        Ok(ractor::rpc::CallResult::Success(r)) => r.map_err(port_status),
        Ok(ractor::rpc::CallResult::Timeout) => Err(Status::deadline_exceeded(
            "orchestrator did not answer in time",
        )),
        Ok(ractor::rpc::CallResult::SenderError) | Err(_) => {
            Err(Status::unavailable("orchestrator actor is down"))
        }
    }
}

/// The W3C `traceparent` a call carried as gRPC metadata, if any.
fn traceparent<T>(request: &Request<T>) -> Option<String> {
    request
        .metadata()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Ends a stream's task once `who`'s credential is revoked (a reload of
/// the credentials), telling the client why; the task also ends this
/// watcher when it ends by itself.
fn end_when_revoked<T: Send + 'static>(
    credentials: &Credentials,
    who: Principal,
    stream: tokio::task::JoinHandle<()>,
    tx: mpsc::Sender<Result<T, Status>>,
) {
    if credentials.is_open() {
        return;
    }
    let credentials = credentials.clone();
    fvd_telemetry::spawn(async move {
        let abort = stream.abort_handle();
        tokio::select! {
            _ = stream => {}
            _ = tx.closed() => abort.abort(),
            () = credentials.revoked(&who) => {
                abort.abort();
                tracing::info!(credential = %who.name(), "a stream's credential was revoked; ending it");
                let _ = tx
                    .send(Err(Status::permission_denied(format!(
                        "credential {} was revoked",
                        who.describe()
                    ))))
                    .await;
            }
        }
    });
}

#[tonic::async_trait]
impl pb::port_service_server::PortService for PortApi {
    async fn submit(
        &self,
        request: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::SubmitResponse>, Status> {
        // The caller's trace context, when it sent one: the port's trace
        // continues it.
        let traceparent = traceparent(&request);
        let (who, caller) = changer(&request, "submit")?;
        let r = request.into_inner();
        if r.family.is_empty() {
            return Err(Status::invalid_argument("family is empty"));
        }
        // The Submit span belongs to the port's trace as an Answer's does:
        // a resume continues the stored trace (linking a caller of another
        // trace), a new port or a rerun starts under the caller. A caller
        // that sends no context (a CLI that does not export) thus never
        // leaves the span alone in a trace of its own, and the run hangs
        // under it in every case.
        let span = change_span("Submit", &r.family, &who);
        let stored = query::port_traceparent(&self.store, &r.family)
            .await
            .ok()
            .flatten();
        fvd_telemetry::Continuation::decide(stored.as_deref(), traceparent.as_deref(), r.rerun)
            .apply(&span);
        let traceparent = fvd_telemetry::traceparent(&span).or(traceparent);
        let sub = Submission {
            family: r.family,
            repo: r.repo,
            spec_path: r.spec_path,
            spec_toml: r.spec_toml,
            rerun: r.rerun,
            commit: r.commit,
            traceparent,
            caller,
        };
        let done = call(&self.store, &self.orchestrator, |reply| {
            OrchestratorMsg::Submit(sub, reply)
        })
        .instrument(span)
        .await?;
        Ok(Response::new(pb::SubmitResponse {
            family: done.family,
            resumed: done.resumed,
            rerun: done.rerun,
            changes: done.changes,
            commit_change: done.commit_change.unwrap_or_default(),
            commit: done.commit,
        }))
    }

    async fn status(
        &self,
        request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let family = request.into_inner().family;
        let ports = query::status(&self.store, (!family.is_empty()).then_some(family.as_str()))
            .await
            .map_err(query_status)?;
        Ok(Response::new(pb::StatusResponse {
            ports: ports.into_iter().map(wire::to_snapshot).collect(),
        }))
    }

    type WatchStream = BoxStream<pb::PortEvent>;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let who = principal(&request)?;
        let family = request.into_inner().family;
        // Subscribe before reading the state, so nothing falls in between.
        let mut rx = self.events.subscribe();
        let snap = query::snapshot(&self.store, &family)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("no port of family {family}")))?;
        let (tx, out) = mpsc::channel(64);
        let store = self.store.clone();
        let watching = tx.clone();
        let stream = fvd_telemetry::spawn(async move {
            let send = |e: wire::WatchEvent| Ok(wire::to_event(&family, e));
            if snap.state != PortState::Running {
                let _ = tx.send(send(wire::WatchEvent::Finished(snap))).await;
                return;
            }
            // What happened before the watch began, then the live events.
            // An event recorded between the subscription and the snapshot
            // is in both: it is sent once.
            let seen: std::collections::HashSet<(String, String, i64)> = snap
                .gate_events
                .iter()
                .map(|g| (g.phase.clone(), g.outcome.as_str().to_string(), g.at_ms))
                .collect();
            for g in snap.gate_events.iter().cloned() {
                if tx.send(send(wire::WatchEvent::Gate(g))).await.is_err() {
                    return;
                }
            }
            for c in snap.components.iter().cloned() {
                if tx.send(send(wire::WatchEvent::Component(c))).await.is_err() {
                    return;
                }
            }
            loop {
                let ev = match rx.recv().await {
                    Ok(ev) => ev,
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(
                            missed = n,
                            "watcher lagged; it will see the final snapshot"
                        );
                        continue;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                if ev.family() != family {
                    continue;
                }
                let event = match ev {
                    PortEvent::Component { component, .. } => {
                        wire::WatchEvent::Component(component.into())
                    }
                    PortEvent::Gate { event, .. } => {
                        if seen.contains(&(
                            event.phase.clone(),
                            event.outcome.as_str().to_string(),
                            event.at_ms,
                        )) {
                            continue;
                        }
                        wire::WatchEvent::Gate(event)
                    }
                    PortEvent::Finished { .. } => {
                        let snap = match query::snapshot(&store, &family).await {
                            Ok(Some(s)) => s,
                            Ok(None) => {
                                let _ = tx
                                    .send(Err(Status::not_found(format!(
                                        "port {family} ended and is no longer recorded"
                                    ))))
                                    .await;
                                return;
                            }
                            Err(e) => {
                                let _ = tx
                                    .send(Err(Status::unavailable(format!(
                                        "port {family} ended but its record could not be read: {e}"
                                    ))))
                                    .await;
                                return;
                            }
                        };
                        let _ = tx.send(send(wire::WatchEvent::Finished(snap))).await;
                        return;
                    }
                };
                if tx.send(send(event)).await.is_err() {
                    return;
                }
            }
        });
        end_when_revoked(&self.credentials, who, stream, watching);
        Ok(Response::new(Box::pin(ReceiverStream::new(out))))
    }

    async fn answer(
        &self,
        request: Request<pb::AnswerRequest>,
    ) -> Result<Response<pb::AnswerResponse>, Status> {
        let traceparent = traceparent(&request);
        let (who, mut caller) = changer(&request, "answer")?;
        let r = request.into_inner();
        // A server that checks no credential (embedded mode, a lone
        // server) knows nobody: the answering command's person is recorded,
        // so an approved judge change names who approved it.
        if who.name().is_empty() {
            caller.name = said_by(&r.said_by);
        }
        // An answer resumes the port: its span belongs to the port's trace
        // (linking the caller's, when that is another), and the resumed
        // run hangs under it, wherever the answer came from.
        let span = change_span("Answer", &r.family, &who);
        let stored = query::port_traceparent(&self.store, &r.family)
            .await
            .ok()
            .flatten();
        fvd_telemetry::Continuation::decide(stored.as_deref(), traceparent.as_deref(), false)
            .apply(&span);
        let traceparent = fvd_telemetry::traceparent(&span).or(traceparent);
        let choice = match r.choice {
            Some(pb::answer_request::Choice::Option(n)) => AnswerChoice::Option(n),
            Some(pb::answer_request::Choice::Text(t)) => AnswerChoice::Text(t),
            None => {
                return Err(Status::invalid_argument(
                    "an answer needs an option or a text",
                ));
            }
        };
        let row = call(&self.store, &self.orchestrator, |reply| {
            OrchestratorMsg::Answer {
                family: r.family,
                id: r.id,
                choice,
                traceparent,
                caller,
                reply,
            }
        })
        .instrument(span)
        .await?;
        Ok(Response::new(pb::AnswerResponse {
            escape: Some(wire::to_escape(row)),
        }))
    }

    type LogsStream = BoxStream<pb::LogChunk>;

    async fn logs(
        &self,
        request: Request<pb::LogsRequest>,
    ) -> Result<Response<Self::LogsStream>, Status> {
        let who = principal(&request)?;
        let r = request.into_inner();
        let job = query::run_of(
            &self.store,
            &r.family,
            &r.component,
            (r.run != 0).then_some(r.run),
        )
        .await
        .map_err(query_status)?;
        let mut chunks = query::log_pump(self.store.clone(), job.job_id, r.follow);
        let (tx, out) = mpsc::channel(64);
        let following = tx.clone();
        let stream = fvd_telemetry::spawn(async move {
            while let Some(c) = chunks.recv().await {
                let wire = c
                    .map(|(stream, data)| pb::LogChunk { stream, data })
                    .map_err(store_status);
                if tx.send(wire).await.is_err() {
                    return;
                }
            }
        });
        end_when_revoked(&self.credentials, who, stream, following);
        Ok(Response::new(Box::pin(ReceiverStream::new(out))))
    }

    async fn trace_report(
        &self,
        request: Request<pb::TraceReportRequest>,
    ) -> Result<Response<pb::TraceReportResponse>, Status> {
        let r = request.into_inner();
        let inv = query::trace_report(&self.store, &r.family, &r.component)
            .await
            .map_err(query_status)?;
        Ok(Response::new(
            wire::to_investigation(&inv).map_err(Status::internal)?,
        ))
    }

    async fn attempts(
        &self,
        request: Request<pb::AttemptsRequest>,
    ) -> Result<Response<pb::AttemptsResponse>, Status> {
        let r = request.into_inner();
        let (worktree, ledger) = query::attempts(&self.store, &r.family, &r.component)
            .await
            .map_err(query_status)?;
        Ok(Response::new(pb::AttemptsResponse {
            worktree: worktree.map(wire::to_worktree),
            attempts: ledger.into_iter().map(wire::to_attempt).collect(),
        }))
    }

    async fn cancel(
        &self,
        request: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        let (who, caller) = changer(&request, "cancel")?;
        let family = request.into_inner().family;
        let span = change_span("Cancel", &family, &who);
        call(&self.store, &self.orchestrator, |reply| {
            OrchestratorMsg::Cancel {
                family,
                caller,
                reply,
            }
        })
        .instrument(span)
        .await?;
        Ok(Response::new(pb::CancelResponse { cancelled: true }))
    }

    async fn reset(
        &self,
        request: Request<pb::ResetRequest>,
    ) -> Result<Response<pb::ResetResponse>, Status> {
        let (who, caller) = changer(&request, "reset")?;
        let family = request.into_inner().family;
        let span = change_span("Reset", &family, &who);
        call(&self.store, &self.orchestrator, |reply| {
            OrchestratorMsg::Reset {
                family,
                caller,
                reply,
            }
        })
        .instrument(span)
        .await?;
        Ok(Response::new(pb::ResetResponse {}))
    }

    async fn runs(
        &self,
        request: Request<pb::RunsRequest>,
    ) -> Result<Response<pb::RunsResponse>, Status> {
        let r = request.into_inner();
        let component = (!r.component.is_empty()).then_some(r.component.as_str());
        let runs = query::runs(&self.store, &r.family, component)
            .await
            .map_err(query_status)?;
        Ok(Response::new(pb::RunsResponse {
            runs: runs.into_iter().map(wire::to_run).collect(),
        }))
    }

    async fn workers(
        &self,
        _request: Request<pb::WorkersRequest>,
    ) -> Result<Response<pb::WorkersResponse>, Status> {
        let fleet = query::fleet(&self.store, Some(&self.scheduler))
            .await
            .map_err(store_status)?;
        Ok(Response::new(wire::to_fleet(fleet)))
    }

    async fn queue(
        &self,
        request: Request<pb::QueueRequest>,
    ) -> Result<Response<pb::QueueResponse>, Status> {
        let family = request.into_inner().family;
        let queue = query::queue(
            &self.store,
            Some(&self.scheduler),
            (!family.is_empty()).then_some(family.as_str()),
        )
        .await
        .map_err(query_status)?;
        Ok(Response::new(wire::to_queue(queue)))
    }
}
