//! OpenTelemetry end to end: a fleet of real `fvd orchestrator serve` and
//! `fvd worker` processes exports to an OTLP/gRPC receiver started here,
//! and the test checks the span tree of the port (one trace, links that
//! cross from the orchestrator to the worker and into pytest), that no
//! secret value leaves in any span or metric, and that nothing is exported
//! or dialled when no endpoint is configured.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use opentelemetry_proto::tonic::trace::v1::status;
use prost::Message;

use crate::support::{Sandbox, TestComponent, fvd, wait_for};

/// The secret's name appears in the spec; its value only in the worker's
/// environment. It must never reach the receiver.
const TOKEN_ENV: &str = "FVD_E2E_OTEL_TOKEN";
const TOKEN_VALUE: &str = "fvdsecret_9f8e7d6c5b4a39281706";

// ---------------------------------------------------------------------------
// The receiver: the collector's TraceService and MetricsService, in memory.

/// One exported span, flattened with its resource's `service.name`.
#[derive(Debug, Clone)]
pub(crate) struct Got {
    service: String,
    pub(crate) name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    attrs: HashMap<String, String>,
    events: Vec<String>,
    /// Each event's name and attributes.
    event_attrs: Vec<(String, HashMap<String, String>)>,
    /// The span status: `STATUS_CODE_*` name and message.
    status: (String, String),
    /// (trace id, span id) of each link.
    links: Vec<(String, String)>,
    /// The span's kind (`SPAN_KIND_SERVER`, …).
    kind: String,
    /// Its resource's `service.instance.id`.
    instance: String,
    /// The attributes sent as integers (OTLP `intValue`).
    ints: std::collections::HashSet<String>,
    /// Its resource's attributes.
    resource: HashMap<String, String>,
}

impl Got {
    fn is_error(&self) -> bool {
        self.status.0 == "STATUS_CODE_ERROR"
    }
}

#[derive(Debug, Default)]
struct Received {
    spans: Vec<Got>,
    metric_names: Vec<String>,
    /// Each metric's unit, by name.
    units: HashMap<String, String>,
    /// Latest value of each counter point: (metric, sorted attributes).
    sums: HashMap<(String, Vec<(String, String)>), f64>,
    /// Bucket bounds of each histogram point, by metric.
    bounds: HashMap<String, Vec<f64>>,
    /// Every request as its protobuf bytes, to search for secrets.
    bytes: Vec<Vec<u8>>,
    /// Span export calls, answered or not.
    trace_calls: usize,
}

/// How the receiver answers span exports.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
enum Mode {
    #[default]
    Answer,
    /// Accepts the call and never answers it.
    Hang,
    /// Fails every call (`UNAVAILABLE`).
    Refuse,
}

#[derive(Debug, Clone, Default)]
struct Sink {
    received: Arc<Mutex<Received>>,
    mode: Mode,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn value(kv: &KeyValue) -> String {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.received.lock().unwrap().trace_calls += 1;
        match self.mode {
            Mode::Answer => {}
            Mode::Hang => std::future::pending::<()>().await,
            Mode::Refuse => return Err(tonic::Status::unavailable("the test refuses spans")),
        }
        let req = request.into_inner();
        let mut r = self.received.lock().unwrap();
        r.bytes.push(req.encode_to_vec());
        for rs in &req.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|res| &res.attributes)
                .find(|kv| kv.key == "service.name")
                .map(value)
                .unwrap_or_default();
            let instance = rs
                .resource
                .iter()
                .flat_map(|res| &res.attributes)
                .find(|kv| kv.key == "service.instance.id")
                .map(value)
                .unwrap_or_default();
            for ss in &rs.scope_spans {
                for s in &ss.spans {
                    r.spans.push(Got {
                        service: service.clone(),
                        name: s.name.clone(),
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent: hex(&s.parent_span_id),
                        attrs: s
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), value(kv)))
                            .collect(),
                        events: s.events.iter().map(|e| e.name.clone()).collect(),
                        event_attrs: s
                            .events
                            .iter()
                            .map(|e| {
                                let a = e
                                    .attributes
                                    .iter()
                                    .map(|kv| (kv.key.clone(), value(kv)))
                                    .collect();
                                (e.name.clone(), a)
                            })
                            .collect(),
                        status: s
                            .status
                            .as_ref()
                            .map(|st| {
                                let code = status::StatusCode::try_from(st.code)
                                    .map_or("?", |c| c.as_str_name());
                                (code.to_string(), st.message.clone())
                            })
                            .unwrap_or_else(|| ("STATUS_CODE_UNSET".into(), String::new())),
                        links: s
                            .links
                            .iter()
                            .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                            .collect(),
                        kind: opentelemetry_proto::tonic::trace::v1::span::SpanKind::try_from(
                            s.kind,
                        )
                        .map_or("?", |k| k.as_str_name())
                        .to_string(),
                        instance: instance.clone(),
                        ints: s
                            .attributes
                            .iter()
                            .filter(|kv| {
                                matches!(
                                    kv.value.as_ref().and_then(|v| v.value.as_ref()),
                                    Some(any_value::Value::IntValue(_))
                                )
                            })
                            .map(|kv| kv.key.clone())
                            .collect(),
                        resource: rs
                            .resource
                            .iter()
                            .flat_map(|res| &res.attributes)
                            .map(|kv| (kv.key.clone(), value(kv)))
                            .collect(),
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        if self.mode == Mode::Hang {
            std::future::pending::<()>().await;
        }
        let req = request.into_inner();
        let mut r = self.received.lock().unwrap();
        r.bytes.push(req.encode_to_vec());
        for rm in &req.resource_metrics {
            for sm in &rm.scope_metrics {
                for m in &sm.metrics {
                    r.metric_names.push(m.name.clone());
                    r.units.insert(m.name.clone(), m.unit.clone());
                    if let Some(metric::Data::Histogram(h)) = &m.data {
                        for p in &h.data_points {
                            r.bounds.insert(m.name.clone(), p.explicit_bounds.clone());
                        }
                    }
                    let Some(metric::Data::Sum(sum)) = &m.data else {
                        continue;
                    };
                    for p in &sum.data_points {
                        let mut attrs: Vec<(String, String)> = p
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), value(kv)))
                            .collect();
                        attrs.sort();
                        let v = match p.value {
                            Some(number_data_point::Value::AsInt(i)) => i as f64,
                            Some(number_data_point::Value::AsDouble(d)) => d,
                            None => continue,
                        };
                        // Cumulative: the latest export holds the total.
                        r.sums.insert((m.name.clone(), attrs), v);
                    }
                }
            }
        }
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// A receiver on its own runtime, counting every TCP connection it accepts
/// (also used by `containment.rs`).
pub(crate) struct Receiver {
    addr: SocketAddr,
    sink: Sink,
    connections: Arc<AtomicUsize>,
    _runtime: tokio::runtime::Runtime,
}

impl Receiver {
    pub(crate) fn start(bind: &str) -> std::io::Result<Self> {
        Self::start_with(bind, Mode::Answer)
    }

    fn start_with(bind: &str, mode: Mode) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind(bind))?;
        let addr = listener.local_addr()?;
        let sink = Sink {
            mode,
            ..Sink::default()
        };
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        let incoming = async_stream(listener, counted);
        let server = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(sink.clone()))
            .add_service(MetricsServiceServer::new(sink.clone()))
            .serve_with_incoming(incoming);
        runtime.spawn(server);
        Ok(Self {
            addr,
            sink,
            connections,
            _runtime: runtime,
        })
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn spans(&self) -> Vec<Got> {
        self.sink.received.lock().unwrap().spans.clone()
    }
}

/// The listener's connections as a stream, counting each one accepted.
fn async_stream(
    listener: tokio::net::TcpListener,
    counted: Arc<AtomicUsize>,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(move |c| {
        counted.fetch_add(1, Ordering::SeqCst);
        c
    })
}

// ---------------------------------------------------------------------------
// The fleet: processes started with a controlled environment, stopped with
// SIGTERM (as an operator would) so they flush what they buffered.

struct Fleet {
    children: Vec<Child>,
    url: String,
}

impl Fleet {
    /// `fvd orchestrator serve` with `args` and `env`; nothing inherited
    /// from the test's own OTEL_* or TRACEPARENT.
    fn serve(sb: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> Self {
        let db = sb.repo().join("orchestrator.db");
        let mut cmd = fvd();
        clean_env(&mut cmd);
        // The sandbox's credentials (`--auth`) when it has them.
        let auth: Vec<String> = sb
            .auth
            .as_ref()
            .map(|a| vec!["--auth".into(), a.file.display().to_string()])
            .unwrap_or_default();
        let mut child = cmd
            .args(["orchestrator", "serve", "--listen", "127.0.0.1:0", "--db"])
            .arg(format!("sqlite://{}", db.display()))
            .args(auth)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn orchestrator");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("orchestrator prints its address");
        let url = line.trim().rsplit(' ').next().unwrap().to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "first line {line:?}");
        Self {
            children: vec![child],
            url,
        }
    }

    fn worker(&mut self, sb: &Sandbox, id: &str, env: &[(&str, &str)]) -> u32 {
        let mut cmd = fvd();
        clean_env(&mut cmd);
        let child = cmd
            .args(["worker", "--orchestrator", &self.url, "--gpus", "none"])
            .args(["--worker-id", id, "--cpu-slots", "2", "--workspace"])
            .arg(sb.repo().join(format!("ws-{id}")))
            .args(sb.token_args("fleet"))
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn worker");
        let pid = child.id();
        self.children.push(child);
        pid
    }

    fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// SIGTERMs workers, then the orchestrator, and waits for each to exit
    /// (each flushes its spans on the way out).
    fn stop(&mut self) {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        for c in self.children.iter_mut().rev() {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
            let status = wait_for(
                "a process to exit on SIGTERM",
                Duration::from_secs(20),
                || c.try_wait().expect("try_wait"),
            );
            assert!(status.success(), "exit after SIGTERM: {status:?}");
        }
        self.children.clear();
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn clean_env(cmd: &mut std::process::Command) {
    for (k, _) in std::env::vars() {
        if k.starts_with("OTEL_") || k == "TRACEPARENT" || k == TOKEN_ENV {
            cmd.env_remove(k);
        }
    }
    cmd.env("FVD_LOG", "warn");
}

/// Adds the secret's name to every component of the sandbox's spec.
fn name_secret_in_spec(sb: &Sandbox, family: &str) {
    let path = sb
        .repo()
        .join(format!("tests/local_tests/{family}/port.toml"));
    let spec = std::fs::read_to_string(&path).unwrap();
    let spec = spec.replacen(
        "[defaults]\n",
        &format!("[defaults]\nenv = [\"{TOKEN_ENV}\"]\n"),
        1,
    );
    std::fs::write(&path, spec).unwrap();
}

/// A test body that writes the `TRACEPARENT` it sees (or `absent`) to `file`.
fn write_traceparent(file: &Path) -> String {
    format!(
        "with open({:?}, 'w') as f:\n    f.write(os.environ.get('TRACEPARENT', 'absent'))",
        file.display().to_string()
    )
}

/// `fvd submit --wait` of the sandbox's repository, as its porter when it
/// has credentials.
fn submit(url: &str, family: &str, sb: &Sandbox, env: &[(&str, &str)]) -> Option<i32> {
    let mut cmd = fvd();
    clean_env(&mut cmd);
    let out = cmd
        .envs(env.iter().copied())
        .args([
            "submit",
            "--family",
            family,
            "--wait",
            "--orchestrator",
            url,
        ])
        .args(sb.token_args("porter"))
        .arg("--repo")
        .arg(sb.repo())
        .output()
        .unwrap();
    eprintln!(
        "submit stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.status.code()
}

/// Among `spans` (one submit's), the run hangs under the orchestrator's
/// side of the Submit call, which hangs under the CLI's side of it, under
/// the command span `cli`.
fn submitted_under(spans: &[Got], cli: &Got) {
    let port = one(spans, "port span", |s| s.name == "port");
    let served = one(spans, "the Submit call's server span", |s| {
        s.name == "fvd.v1.PortService/Submit" && s.kind == "SPAN_KIND_SERVER"
    });
    let call = one(spans, "the Submit call's client span", |s| {
        s.name == "fvd.v1.PortService/Submit" && s.kind == "SPAN_KIND_CLIENT"
    });
    assert_eq!(
        [&port.parent, &served.parent, &call.parent],
        [&served.span_id, &call.span_id, &cli.span_id]
    );
}

fn one<'a>(spans: &'a [Got], what: &str, f: impl Fn(&Got) -> bool) -> &'a Got {
    let found: Vec<&Got> = spans.iter().filter(|s| f(s)).collect();
    assert_eq!(found.len(), 1, "expected one {what}, got {found:#?}");
    found[0]
}

fn attr<'a>(s: &'a Got, key: &str) -> &'a str {
    s.attrs
        .get(key)
        .map(String::as_str)
        .unwrap_or_else(|| panic!("span {} has no attribute {key}: {:?}", s.name, s.attrs))
}

#[test]
fn one_trace_per_port_joins_orchestrator_worker_and_pytest() {
    let receiver = Receiver::start("127.0.0.1:0").expect("receiver");
    // A team's fleet: named credentials, the submit by a porter.
    let sb = Sandbox::new().with_auth();
    let seen = sb.repo().join("traceparent.txt");
    sb.port(
        "otelport",
        &[
            // Uses CUDA (a stand-in torch): its job span carries its peak.
            TestComponent::new(
                "joined",
                &(crate::fleet::uses_cuda(3000) + &write_traceparent(&seen)),
            ),
            // Fails with the secret in its assertion: the worker redacts it
            // from the report, so the verdict's reason may be exported.
            TestComponent::new("leaky", &format!("assert False, os.environ['{TOKEN_ENV}']")),
        ],
    );
    name_secret_in_spec(&sb, "otelport");
    let endpoint = receiver.endpoint();
    // Short export delays so spans leave during the run, not only at exit.
    let quick = [
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
    ];
    // The orchestrator is configured by flag, the worker by the standard
    // variable; only the worker holds the secret.
    let mut fleet = Fleet::serve(&sb, &["--otlp-endpoint", &endpoint], &quick);
    let mut worker_env = quick.to_vec();
    worker_env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint));
    worker_env.push((TOKEN_ENV, TOKEN_VALUE));
    fleet.worker(&sb, "w1", &worker_env);

    // Submitted from inside a caller's trace (an agent's, say): the CLI's
    // span continues it, and the context crosses to the orchestrator as
    // gRPC metadata. One component passes, one is blocked: exit code 1.
    let caller = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let caller_tp = format!("00-{}-{}-01", caller.0, caller.1);
    let mut submit_env = quick.to_vec();
    submit_env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint));
    submit_env.push(("TRACEPARENT", &caller_tp));
    assert_eq!(submit(&fleet.url, "otelport", &sb, &submit_env), Some(1));
    fleet.stop();

    let spans = wait_for("the port span", Duration::from_secs(20), || {
        let s = receiver.spans();
        s.iter().any(|g| g.name == "port").then_some(s)
    });

    // One trace for the port, and everything of the port is in it.
    let port = one(&spans, "port span", |s| s.name == "port");
    assert_eq!(attr(port, "fvd.family"), "otelport");
    assert_eq!(port.service, "fvd-orchestrator");
    // The port continues the caller's trace: caller → submit (the CLI's
    // command) → its Submit call (client) → the orchestrator's side of it
    // (server) → port.
    let cli = one(&spans, "submit span", |s| s.name == "submit");
    assert_eq!(cli.service, "fvd");
    assert_eq!(cli.kind, "SPAN_KIND_INTERNAL");
    assert_eq!((cli.trace_id.as_str(), cli.parent.as_str()), caller);
    let call = one(&spans, "Submit call's client span", |s| {
        s.name == "fvd.v1.PortService/Submit" && s.kind == "SPAN_KIND_CLIENT"
    });
    assert_eq!(call.service, "fvd");
    assert_eq!(call.parent, cli.span_id);
    assert_eq!(attr(call, "rpc.system"), "grpc");
    // The orchestrator's side of the call says who made it.
    let rpc = one(&spans, "Submit call span", |s| {
        s.name == "fvd.v1.PortService/Submit" && s.kind == "SPAN_KIND_SERVER"
    });
    assert_eq!(rpc.service, "fvd-orchestrator");
    assert_eq!(
        (rpc.trace_id.as_str(), rpc.parent.as_str()),
        (caller.0, call.span_id.as_str())
    );
    assert_eq!(port.trace_id, caller.0);
    assert_eq!(port.parent, rpc.span_id);
    assert_eq!(attr(rpc, "enduser.id"), "porter");
    assert_eq!(attr(rpc, "enduser.role"), "porter");
    assert_eq!(attr(rpc, "rpc.method"), "Submit");
    let trace = port.trace_id.clone();
    for s in spans
        .iter()
        .filter(|s| ["phase", "component", "attempt", "job", "job.run"].contains(&s.name.as_str()))
    {
        assert_eq!(
            s.trace_id, trace,
            "{} is outside the port's trace: {s:?}",
            s.name
        );
    }

    // port → phase P6 → component → attempt → job (orchestrator) → job.run (worker).
    let p6 = one(&spans, "P6 span", |s| {
        s.name == "phase" && s.attrs.get("fvd.phase").map(String::as_str) == Some("P6")
    });
    assert_eq!(p6.parent, port.span_id);
    assert_eq!(attr(p6, "fvd.outcome"), "passed");
    for (component, verdict) in [("joined", "non_skip_pass"), ("leaky", "debug_red")] {
        let c = one(&spans, "component span", |s| {
            s.name == "component"
                && s.attrs.get("fvd.component").map(String::as_str) == Some(component)
        });
        assert_eq!(c.parent, p6.span_id, "{component}");
        assert_eq!(attr(c, "fvd.verdict"), verdict, "{component}");
        let a = one(&spans, "attempt span", |s| {
            s.name == "attempt" && s.parent == c.span_id
        });
        assert_eq!(attr(a, "fvd.attempt"), "1");
        assert_eq!(attr(a, "fvd.verdict"), verdict);
        let job = one(&spans, "job span", |s| {
            s.name == "job" && s.parent == a.span_id
        });
        assert_eq!(job.service, "fvd-orchestrator");
        assert_eq!(attr(job, "fvd.worker_id"), "w1");
        assert_eq!(attr(job, "fvd.family"), "otelport");
        assert!(attr(job, "fvd.queue_wait_ms").parse::<i64>().unwrap() >= 0);
        assert_eq!(attr(job, "fvd.gpu_seconds"), "0");
        // Numbers are sent as numbers (issue #43), never as their text.
        for (s, key) in [
            (a, "fvd.attempt"),
            (job, "fvd.attempt"),
            (job, "fvd.lease_epoch"),
            (job, "fvd.gpus"),
            (job, "fvd.duration_ms"),
            (job, "fvd.queue_wait_ms"),
        ] {
            assert!(
                s.ints.contains(key),
                "{}'s {key} is not an integer: {:?}",
                s.name,
                s.attrs.get(key)
            );
        }
        for key in ["service.version", "host.name"] {
            assert!(
                job.resource.get(key).is_some_and(|v| !v.is_empty()),
                "no {key} in {:?}",
                job.resource
            );
        }
        // The link that crosses processes: the worker's span is a child of
        // the orchestrator's job span.
        let run = one(&spans, "job.run span", |s| {
            s.name == "job.run" && s.parent == job.span_id
        });
        assert_eq!(run.service, "fvd-worker");
        assert_eq!(attr(run, "fvd.worker_id"), "w1");
        assert_eq!(attr(run, "fvd.job_id"), attr(job, "fvd.job_id"));
        assert_eq!(attr(run, "fvd.family"), "otelport");
        assert_eq!(attr(run, "fvd.component"), component);
        // Every attribute is fvd's own, in its namespace, or a standard
        // one.
        for s in [c, a, job, run] {
            for k in s.attrs.keys() {
                assert!(
                    k.starts_with("fvd.")
                        || ["error.type", "cicd.pipeline.name"].contains(&k.as_str())
                        || ["enduser.", "rpc.", "gen_ai.", "otel."]
                            .iter()
                            .any(|p| k.starts_with(p)),
                    "{k} of {} is outside the fvd. namespace: {s:?}",
                    s.name
                );
            }
        }
        // The worker takes its job from its stream: a consumer's span.
        assert_eq!(run.kind, "SPAN_KIND_CONSUMER", "{run:?}");
        // Span status: a red run's spans are errors with a message and a
        // low-cardinality error.type; a pass's are not.
        for s in [c, a, job, run] {
            if verdict == "debug_red" {
                assert!(s.is_error(), "{} of {component}: {s:?}", s.name);
                assert!(!s.status.1.is_empty(), "{} has no message: {s:?}", s.name);
                let want = if s.name == "job.run" || s.name == "job" {
                    "exit_code"
                } else {
                    "debug_red"
                };
                assert_eq!(attr(s, "error.type"), want, "{s:?}");
            } else {
                assert!(!s.is_error(), "{} of {component}: {s:?}", s.name);
            }
        }
        // The run's measured peak GPU memory is an integer attribute of
        // its job span and of the worker's; a run that used no CUDA has
        // none (unknown).
        for s in [job, run] {
            if component == "joined" {
                assert_eq!(attr(s, "fvd.run.peak_gpu_mib"), "3512", "{s:?}");
                assert!(s.ints.contains("fvd.run.peak_gpu_mib"), "{s:?}");
            } else {
                assert!(!s.attrs.contains_key("fvd.run.peak_gpu_mib"), "{s:?}");
            }
        }
        if component == "joined" {
            // And into pytest: TRACEPARENT names the worker's span.
            let tp = std::fs::read_to_string(&seen).expect("the test wrote its TRACEPARENT");
            assert_eq!(tp, format!("00-{trace}-{}-01", run.span_id));
        }
    }
    // The gate refuses P7 (a component is blocked): a span event says so.
    let p7 = one(&spans, "P7 span", |s| {
        s.name == "phase" && s.attrs.get("fvd.phase").map(String::as_str) == Some("P7")
    });
    assert_eq!(attr(p7, "fvd.outcome"), "refused");
    assert!(
        p7.events.iter().any(|e| e == "gate refused a transition"),
        "{p7:?}"
    );
    // The refusal and the port it blocks are errors; P6, which passed, is not.
    assert!(p7.is_error() && p7.status.1.contains("leaky"), "{p7:?}");
    assert!(!p6.is_error(), "{p6:?}");
    assert_eq!(attr(port, "fvd.state"), "blocked");
    assert!(port.is_error() && port.status.1.contains("P7"), "{port:?}");

    // Metrics arrived through the same collector.
    let names = wait_for("metrics", Duration::from_secs(10), || {
        let n = receiver.sink.received.lock().unwrap().metric_names.clone();
        n.iter().any(|m| m == "fvd.verdicts").then_some(n)
    });
    for m in [
        "fvd.attempts",
        "fvd.verdicts",
        "fvd.job.queue_wait",
        "fvd.jobs.queued",
        "fvd.jobs.running",
    ] {
        assert!(names.iter().any(|n| n == m), "{m} missing from {names:?}");
    }
    // Every one of fvd's metrics says its unit (issue #43).
    let units = receiver.sink.received.lock().unwrap().units.clone();
    for (name, unit) in &units {
        assert!(!unit.is_empty(), "{name} has no unit: {units:?}");
    }
    // The worker exports its own: the jobs it ran.
    wait_for("the worker's metrics", Duration::from_secs(10), || {
        let n = receiver.sink.received.lock().unwrap().metric_names.clone();
        n.iter().any(|m| m == "fvd.worker.jobs").then_some(())
    });
    // Each process is an instance of its own: the orchestrator's and the
    // worker's spans carry different service.instance.id.
    let instances: std::collections::BTreeSet<(&str, &str)> = spans
        .iter()
        .map(|s| (s.service.as_str(), s.instance.as_str()))
        .collect();
    assert!(
        instances.iter().all(|(_, i)| !i.is_empty()),
        "{instances:?}"
    );
    let orch: Vec<_> = instances
        .iter()
        .filter(|(s, _)| *s == "fvd-orchestrator")
        .collect();
    let work: Vec<_> = instances
        .iter()
        .filter(|(s, _)| *s == "fvd-worker")
        .collect();
    assert!(
        orch.len() == 1 && work.len() == 1 && orch[0].1 != work[0].1,
        "{instances:?}"
    );
    // The queue wait is in seconds, and so are its buckets: a wait of a
    // few milliseconds and one of an hour fall in different buckets.
    let bounds = receiver.sink.received.lock().unwrap().bounds["fvd.job.queue_wait"].clone();
    assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{bounds:?}");
    assert!(bounds.iter().any(|b| *b > 0.0 && *b <= 0.01), "{bounds:?}");
    assert!(bounds.iter().any(|b| *b >= 3600.0), "{bounds:?}");
    // Counters carry port, component and verdict as attributes.
    let sums = receiver.sink.received.lock().unwrap().sums.clone();
    let key = |metric: &str, extra: &[(&str, &str)]| {
        let mut a: Vec<(String, String)> = [("fvd.family", "otelport"), ("fvd.component", "leaky")]
            .iter()
            .chain(extra)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        a.sort();
        (metric.to_string(), a)
    };
    assert_eq!(
        sums.get(&key("fvd.verdicts", &[("fvd.verdict", "debug_red")])),
        Some(&1.0),
        "{sums:?}"
    );
    assert_eq!(sums.get(&key("fvd.attempts", &[])), Some(&1.0), "{sums:?}");

    // No byte of anything received holds the secret's value.
    let r = receiver.sink.received.lock().unwrap();
    assert!(!r.bytes.is_empty());
    let needle = TOKEN_VALUE.as_bytes();
    for (i, b) in r.bytes.iter().enumerate() {
        assert!(
            !b.windows(needle.len()).any(|w| w == needle),
            "request {i} carries the secret value"
        );
    }
    // The verdict's reason went out, redacted.
    let leaky = spans
        .iter()
        .find(|s| {
            s.name == "component"
                && s.attrs.get("fvd.component").map(String::as_str) == Some("leaky")
        })
        .unwrap();
    assert!(
        attr(leaky, "fvd.reason").contains(&format!("[redacted:{TOKEN_ENV}]")),
        "{leaky:?}"
    );
}

/// The remote ports of the established TCP connections of process `pid`.
fn remote_ports(pid: u32) -> Vec<u16> {
    let mut inodes = Vec::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(target) = std::fs::read_link(fd.path()) {
            let t = target.to_string_lossy().to_string();
            if let Some(inode) = t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                inodes.push(inode.to_string());
            }
        }
    }
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // Columns: sl local remote state ... inode (10th).
            if cols.len() > 9 && cols[3] == "01" && inodes.iter().any(|i| i == cols[9]) {
                let port = cols[2].rsplit(':').next().unwrap();
                ports.push(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports
}

#[test]
fn without_an_endpoint_nothing_is_exported_or_dialled() {
    // A trap where an SDK default would send (localhost:4317), when this
    // machine lets the test take it; otherwise any free port.
    let trap = Receiver::start("127.0.0.1:4317")
        .or_else(|_| Receiver::start("127.0.0.1:0"))
        .expect("receiver");
    let sb = Sandbox::new().with_auth();
    let seen = sb.repo().join("traceparent.txt");
    sb.port(
        "quiet",
        &[TestComponent::new("solo", &write_traceparent(&seen))],
    );
    // Variables that only tune an exporter must not start one.
    let tuning = [
        ("OTEL_SERVICE_NAME", "should-not-export"),
        ("OTEL_TRACES_SAMPLER", "always_on"),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "100"),
    ];
    let mut fleet = Fleet::serve(&sb, &[], &tuning);
    let worker_pid = fleet.worker(&sb, "w1", &tuning);
    assert_eq!(submit(&fleet.url, "quiet", &sb, &[]), Some(0));
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "absent");

    // The worker's only connection is to the orchestrator; the
    // orchestrator's connections are all to its own listener's clients.
    let orchestrator_port: u16 = fleet.url.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(remote_ports(worker_pid), vec![orchestrator_port]);
    let pids = fleet.pids();
    for port in remote_ports(pids[0]) {
        assert_ne!(port, trap.addr.port(), "the orchestrator dialled the trap");
    }
    fleet.stop();
    assert_eq!(trap.connections.load(Ordering::SeqCst), 0);
    assert!(trap.spans().is_empty());
}

#[test]
fn embedded_mode_exports_the_same_tree_from_one_process() {
    let receiver = Receiver::start("127.0.0.1:0").expect("receiver");
    let sb = Sandbox::new();
    let seen = sb.repo().join("traceparent.txt");
    sb.port(
        "embedded",
        &[TestComponent::new("solo", &write_traceparent(&seen))],
    );
    let mut cmd = fvd();
    clean_env(&mut cmd);
    // The flag is global: it may come before the subcommand.
    let out = cmd
        .args(["--otlp-endpoint", &receiver.endpoint()])
        .args(["submit", "--family", "embedded", "--gpus", "none", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The process flushed before it exited: no waiting needed.
    let spans = receiver.spans();
    let port = one(&spans, "port span", |s| s.name == "port");
    let job = one(&spans, "job span", |s| s.name == "job");
    let run = one(&spans, "job.run span", |s| s.name == "job.run");
    assert!(spans.iter().all(|s| s.service == "fvd"), "{spans:#?}");
    assert!(
        spans.iter().all(|s| s.trace_id == port.trace_id),
        "{spans:#?}"
    );
    assert_eq!(run.parent, job.span_id);
    let tp = std::fs::read_to_string(&seen).unwrap();
    assert_eq!(tp, format!("00-{}-{}-01", port.trace_id, run.span_id));
}

#[test]
fn a_trace_comparison_joins_its_caller_s_trace_with_the_first_divergent_module() {
    let receiver = Receiver::start("127.0.0.1:0").expect("receiver");
    let cases = crate::trace::own();
    let caller = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let mut cmd = fvd();
    clean_env(&mut cmd);
    cmd.args(["trace", "compare", "--json", "--reference"])
        .arg(cases.dir.join("official.jsonl"))
        .arg("--port")
        .arg(cases.dir.join("port_bug.jsonl"));
    for r in cases.renames {
        cmd.args(["--rename", r]);
    }
    // As a worker starts a test or agent process.
    let out = cmd
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
        .env("TRACEPARENT", format!("00-{}-{}-01", caller.0, caller.1))
        .env("FVD_FAMILY", "tinylm")
        .env("FVD_COMPONENT", "transformer")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "the bug case diverges");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let spans = receiver.spans();
    let cmp = one(&spans, "trace_comparison span", |s| {
        s.name == "trace_comparison"
    });
    assert_eq!((cmp.trace_id.as_str(), cmp.parent.as_str()), caller);
    assert_eq!(attr(cmp, "fvd.family"), "tinylm");
    assert_eq!(attr(cmp, "fvd.component"), "transformer");
    assert_eq!(attr(cmp, "fvd.diverged"), "true");
    // Named on the port's side, as a blocked reason names it; the
    // reference's name beside it.
    assert_eq!(
        attr(cmp, "fvd.first_divergent_module"),
        report["first_divergence"]["port_module"].as_str().unwrap()
    );
    assert_eq!(attr(cmp, "fvd.first_divergent_module"), cases.bug_port);
    assert_eq!(
        attr(cmp, "fvd.first_divergent_reference_module"),
        report["first_divergence"]["reference_module"]
            .as_str()
            .unwrap()
    );
    assert_eq!(
        attr(cmp, "fvd.first_divergent_stat"),
        report["first_divergence"]["stat"].as_str().unwrap()
    );
    assert_eq!(
        attr(cmp, "fvd.compared_rows"),
        report["rows"].as_array().unwrap().len().to_string()
    );
}

#[test]
fn a_prep_handoff_that_asks_the_user_is_an_escape_hatch_and_a_p0_refusal() {
    let receiver = Receiver::start("127.0.0.1:0").expect("receiver");
    let sb = Sandbox::new();
    sb.port("asking", &[TestComponent::new("solo", "pass")]);
    let spec = sb.repo().join("tests/local_tests/asking/port.toml");
    let text = std::fs::read_to_string(&spec).unwrap();
    std::fs::write(
        &spec,
        text.replace("next_step = \"add-model\"", "next_step = \"ask_user\""),
    )
    .unwrap();
    let mut cmd = fvd();
    clean_env(&mut cmd);
    let out = cmd
        .args(["--otlp-endpoint", &receiver.endpoint()])
        .args(["submit", "--family", "asking", "--gpus", "none", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spans = receiver.spans();
    let port = one(&spans, "port span", |s| s.name == "port");
    assert_eq!(attr(port, "fvd.state"), "blocked");
    assert_eq!(attr(port, "fvd.phase"), "P0");
    assert!(port.events.iter().any(|e| e == "escape hatch"), "{port:?}");
    let p0 = one(&spans, "P0 span", |s| {
        s.name == "phase" && s.parent == port.span_id
    });
    assert_eq!(attr(p0, "fvd.outcome"), "refused");
    assert!(
        p0.events.iter().any(|e| e == "gate refused a transition"),
        "{p0:?}"
    );
    assert!(
        !spans.iter().any(|s| s.name == "component"),
        "nothing is dispatched after a P0 refusal"
    );
}

// ---------------------------------------------------------------------------
// One port, one trace: across processes, pauses and answers.

/// `fvd` with a clean environment, exporting to `receiver` through the
/// standard variable.
fn exporting(receiver: &Receiver) -> std::process::Command {
    let mut cmd = fvd();
    clean_env(&mut cmd);
    cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint());
    cmd
}

/// Runs `cmd`: its exit code, and its stdout and stderr for messages.
fn run(cmd: &mut std::process::Command) -> (Option<i32>, String, String) {
    let out = cmd.output().expect("run fvd");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn component_span<'a>(spans: &'a [Got], name: &str) -> &'a Got {
    one(spans, &format!("component span of {name}"), |s| {
        s.name == "component" && s.attrs.get("fvd.component").map(String::as_str) == Some(name)
    })
}

/// The example port without `timestep_embed`, whose agent needs three runs
/// (tested in `agent`); the rest pauses on `time_shift`'s question.
fn without_timestep_embed(spec: String) -> String {
    let start = spec
        .find("# Red on purpose (the port concatenates")
        .expect("timestep_embed's block in port.toml");
    let end = spec
        .find("# Red on purpose (the port's checkpoint")
        .expect("refiner's block in port.toml");
    format!("{}{}", &spec[..start], &spec[end..])
}

#[test]
fn one_port_is_one_trace_across_submit_answer_and_resume() {
    let receiver = Receiver::start("127.0.0.1:0").expect("receiver");
    let sb = Sandbox::new();
    crate::agent::example_repo(&sb, without_timestep_embed);
    let repo = sb.repo().to_str().unwrap().to_string();
    let submit = ["submit", "--family", "tinyport", "--wait", "--repo", &repo];

    // 1. The submit pauses on time_shift's question (exit 3).
    let (code, _, err) = run(exporting(&receiver).args(submit));
    assert_eq!(code, Some(3), "{err}");
    let first = receiver.spans();
    let port = one(&first, "port span", |s| s.name == "port").clone();
    let trace = port.trace_id.clone();
    for s in &first {
        assert_eq!(s.trace_id, trace, "{s:?}");
    }
    // A paused embedded port says where it stands.
    assert_eq!(attr(&port, "fvd.state"), "ask_user");
    assert_eq!(attr(&port, "fvd.phase"), "P6");
    assert!(port.events.iter().any(|e| e == "port paused"), "{port:?}");

    // Statuses: a blocked component and its red attempt are errors with a
    // message; a pass is not.
    let red = component_span(&first, "decoder_norm");
    assert!(red.is_error(), "{red:?}");
    assert!(red.status.1.starts_with("debug_red"), "{red:?}");
    let red_attempt = one(&first, "decoder_norm's attempt", |s| {
        s.name == "attempt" && s.parent == red.span_id
    });
    assert!(red_attempt.is_error() && !red_attempt.status.1.is_empty());
    let pass = component_span(&first, "embed");
    assert!(!pass.is_error(), "{pass:?}");
    let pass_attempt = one(&first, "embed's attempt", |s| {
        s.name == "attempt" && s.parent == pass.span_id
    });
    assert!(!pass_attempt.is_error(), "{pass_attempt:?}");

    // The refiner's drill-down: its traced reruns are trace steps, not
    // attempts; its one attempt is the red run.
    let refiner = component_span(&first, "refiner");
    let attempts: Vec<&Got> = first
        .iter()
        .filter(|s| {
            s.name == "attempt"
                && s.attrs.get("fvd.component").map(String::as_str) == Some("refiner")
        })
        .collect();
    assert_eq!(attempts.len(), 1, "{attempts:#?}");
    assert_eq!(attr(attempts[0], "fvd.attempt"), "1");
    assert_eq!(attempts[0].parent, refiner.span_id);
    let mut steps: Vec<String> = first
        .iter()
        .filter(|s| s.name == "trace_step")
        .map(|s| {
            assert_eq!(attr(s, "fvd.component"), "refiner");
            attr(s, "fvd.step").to_string()
        })
        .collect();
    steps.sort();
    assert_eq!(steps, ["1", "2"]);
    let cmp = one(&first, "trace_comparison span", |s| {
        s.name == "trace_comparison"
    });
    assert_eq!(attr(cmp, "fvd.first_divergent_module"), "blocks.2.norm");
    assert_eq!(
        attr(cmp, "fvd.first_divergent_reference_module"),
        "layers.2.ln"
    );
    assert!(
        refiner.status.1.contains("blocks.2.norm"),
        "the blocked reason names the same module: {refiner:?}"
    );

    // 2. `fvd answer` resumes the port in a new process: its own span and
    // the resumed port continue the port's trace.
    let (code, _, err) = run(exporting(&receiver).args([
        "answer", "tinyport", "E001", "--option", "1", "--repo", &repo,
    ]));
    assert_eq!(code, Some(1), "{err}");
    let all = receiver.spans();
    let second = &all[first.len()..];
    let answer = one(second, "answer span", |s| s.name == "answer");
    assert_eq!(answer.service, "fvd");
    assert_eq!(attr(answer, "fvd.family"), "tinyport");
    assert_eq!(
        (answer.trace_id.as_str(), answer.parent.as_str()),
        (trace.as_str(), port.span_id.as_str())
    );
    // The orchestrator's side of the call, a server span under the CLI's,
    // and the resumed port under it.
    let call = one(second, "the Answer call's client span", |s| {
        s.name == "fvd.v1.PortService/Answer" && s.kind == "SPAN_KIND_CLIENT"
    });
    assert_eq!(call.parent, answer.span_id);
    let served = one(second, "the Answer call's server span", |s| {
        s.name == "fvd.v1.PortService/Answer" && s.kind == "SPAN_KIND_SERVER"
    });
    assert_eq!(served.parent, call.span_id);
    assert_eq!(answer.kind, "SPAN_KIND_INTERNAL");
    let resumed = one(second, "resumed port span", |s| s.name == "port");
    assert_eq!(resumed.parent, served.span_id);
    for s in second {
        assert_eq!(s.trace_id, trace, "{s:?}");
    }
    assert!(
        second.iter().any(|s| s.name == "attempt"
            && s.attrs.get("fvd.component").map(String::as_str) == Some("time_shift")),
        "time_shift ran again after the answer"
    );

    // 3. A resubmit resumes it again, in the same trace.
    let (code, _, err) = run(exporting(&receiver).args(submit));
    assert_eq!(code, Some(1), "{err}");
    let all = receiver.spans();
    let third = &all[first.len() + second.len()..];
    let cli = one(third, "submit span", |s| s.name == "submit");
    assert_eq!(
        (cli.trace_id.as_str(), cli.parent.as_str()),
        (trace.as_str(), port.span_id.as_str())
    );
    submitted_under(third, cli);
    for s in third {
        assert_eq!(s.trace_id, trace, "{s:?}");
    }
}

#[test]
fn a_caller_s_decision_not_to_sample_is_honoured() {
    let receiver = Receiver::start("127.0.0.1:0").expect("receiver");
    let sb = Sandbox::new();
    let seen = sb.repo().join("traceparent.txt");
    sb.port(
        "unsampled",
        &[TestComponent::new("solo", &write_traceparent(&seen))],
    );
    let caller = "5bf92f3577b34da6a3ce929d0e0e4737";
    let unsampled = format!("00-{caller}-10f067aa0ba902b7-00");
    let submit = |traceparent: Option<&str>, rerun: bool| {
        let mut cmd = exporting(&receiver);
        if let Some(tp) = traceparent {
            cmd.env("TRACEPARENT", tp);
        }
        cmd.args([
            "submit",
            "--family",
            "unsampled",
            "--gpus",
            "none",
            "--repo",
        ])
        .arg(sb.repo());
        if rerun {
            cmd.arg("--rerun");
        }
        let (code, _, err) = run(&mut cmd);
        assert_eq!(code, Some(0), "{err}");
    };
    submit(Some(&unsampled), false);
    assert_eq!(receiver.spans().len(), 0, "{:#?}", receiver.spans());
    // The decision travels on: the test process joins the caller's trace,
    // not sampled either.
    let tp = std::fs::read_to_string(&seen).unwrap();
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!(parts.len(), 4, "{tp}");
    assert_eq!((parts[1], parts[3]), (caller, "00"), "{tp}");

    // Resumed without a caller, the port is traced; resumed again by a
    // caller who does not sample, nothing of that run is exported, although
    // the port's trace is stored and sampled; nor of a rerun.
    submit(None, false);
    let first = receiver.spans();
    let port = one(&first, "port span", |s| s.name == "port").clone();
    assert_ne!(port.trace_id, caller);
    // A rerun starts the port over in a new trace, linked to the old one.
    submit(None, true);
    let traced = receiver.spans();
    let rerun = &traced[first.len()..];
    let cli = one(rerun, "rerun's submit span", |s| s.name == "submit");
    assert_ne!(cli.trace_id, port.trace_id);
    assert_eq!(cli.links, [(port.trace_id.clone(), port.span_id.clone())]);
    submitted_under(rerun, cli);
    submit(Some(&unsampled), false);
    submit(Some(&unsampled), true);
    let after = receiver.spans();
    assert_eq!(after.len(), traced.len(), "{:#?}", &after[traced.len()..]);
    let tp = std::fs::read_to_string(&seen).unwrap();
    assert_eq!(tp.split('-').nth(1), Some(caller), "{tp}");
}

#[test]
fn an_environment_failure_is_in_the_trace_and_pauses_the_port_there() {
    let receiver = Receiver::start("127.0.0.1:0").expect("receiver");
    let sb = Sandbox::new();
    let missing = "fvd_e2e_otel_not_installed";
    sb.port(
        "envport",
        &[
            // Prints the secret first: the cause must not carry it.
            TestComponent::new(
                "needs_pkg",
                &format!("print(os.environ['{TOKEN_ENV}'])\nimport {missing}"),
            ),
            TestComponent::new("fine", "pass"),
        ],
    );
    name_secret_in_spec(&sb, "envport");
    let (code, _, err) = run(exporting(&receiver)
        .env(TOKEN_ENV, TOKEN_VALUE)
        .args(["submit", "--family", "envport", "--gpus", "none", "--repo"])
        .arg(sb.repo()));
    assert_eq!(code, Some(4), "paused for an environment: {err}");
    let spans = receiver.spans();
    let port = one(&spans, "port span", |s| s.name == "port");
    assert_eq!(attr(port, "fvd.state"), "environment");
    assert_eq!(attr(port, "fvd.phase"), "P6");
    let waits = port
        .event_attrs
        .iter()
        .find(|(n, _)| n == "waits for an environment")
        .unwrap_or_else(|| panic!("no environment wait on the port: {port:?}"));
    assert_eq!(
        waits.1.get("fvd.component").map(String::as_str),
        Some("needs_pkg")
    );
    // The run that hit the environment: its attempt says why, by cause.
    let c = component_span(&spans, "needs_pkg");
    let failure = spans
        .iter()
        .filter(|s| s.name == "attempt" && s.parent == c.span_id)
        .flat_map(|s| &s.event_attrs)
        .find(|(n, _)| n == "environment failure")
        .unwrap_or_else(|| panic!("no environment failure event: {spans:#?}"));
    assert!(failure.1["fvd.cause"].contains(missing), "{failure:?}");
    assert!(
        failure
            .1
            .get("fvd.worker_id")
            .is_some_and(|w| !w.is_empty()),
        "{failure:?}"
    );
    let r = receiver.sink.received.lock().unwrap();
    let needle = TOKEN_VALUE.as_bytes();
    assert!(
        r.bytes
            .iter()
            .all(|b| !b.windows(needle.len()).any(|w| w == needle)),
        "a request carries the secret value"
    );
}

// ---------------------------------------------------------------------------
// A collector that misbehaves costs little and is reported once.

/// `fvd trace compare` of the bug case: quick, and it records a span.
fn compare(cmd: &mut std::process::Command) -> &mut std::process::Command {
    let cases = crate::trace::own();
    cmd.args(["trace", "compare", "--reference"])
        .arg(cases.dir.join("official.jsonl"))
        .arg("--port")
        .arg(cases.dir.join("port_bug.jsonl"));
    for r in cases.renames {
        cmd.args(["--rename", r]);
    }
    cmd
}

fn span_warnings(stderr: &str) -> usize {
    stderr
        .lines()
        .filter(|l| l.contains("warning") && l.contains("span"))
        .count()
}

#[test]
fn a_collector_that_never_answers_delays_the_exit_by_two_seconds_at_most() {
    let receiver = Receiver::start_with("127.0.0.1:0", Mode::Hang).expect("receiver");
    let started = std::time::Instant::now();
    let (code, _, err) = run(compare(&mut exporting(&receiver)));
    let took = started.elapsed();
    assert_eq!(code, Some(1), "the bug case diverges: {err}");
    assert!(
        receiver.sink.received.lock().unwrap().trace_calls >= 1,
        "the spans were offered to the collector"
    );
    // The flush is bounded at 2 s; the command itself takes well under one.
    assert!(took < Duration::from_secs(4), "exit took {took:?}: {err}");
    assert_eq!(span_warnings(&err), 1, "{err}");
}

#[test]
fn a_collector_that_fails_every_export_is_reported_once() {
    let receiver = Receiver::start_with("127.0.0.1:0", Mode::Refuse).expect("receiver");
    let sb = Sandbox::new();
    let parts: Vec<TestComponent> = (0..3)
        .map(|i| TestComponent::new(&format!("c{i}"), "time.sleep(0.3)"))
        .collect();
    sb.port("refused", &parts);
    let (code, _, err) = run(exporting(&receiver)
        .env("OTEL_BSP_SCHEDULE_DELAY", "20")
        .args(["submit", "--family", "refused", "--gpus", "none", "--repo"])
        .arg(sb.repo()));
    assert_eq!(code, Some(0), "{err}");
    let calls = receiver.sink.received.lock().unwrap().trace_calls;
    assert!(calls >= 2, "several batches failed, not {calls}");
    assert_eq!(span_warnings(&err), 1, "{err}");
}

#[test]
fn a_traces_protocol_fvd_cannot_speak_is_refused_naming_its_variable() {
    let mut cmd = fvd();
    clean_env(&mut cmd);
    let (code, _, err) = run(compare(
        cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
            .env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
    ));
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL is http/protobuf"),
        "{err}"
    );
}

#[test]
fn a_fleet_resume_continues_the_port_s_trace_and_links_its_caller() {
    let receiver = Receiver::start("127.0.0.1:0").expect("receiver");
    let sb = Sandbox::new().with_auth();
    sb.port("resumed", &[TestComponent::new("solo", "pass")]);
    let endpoint = receiver.endpoint();
    let quick = [("OTEL_BSP_SCHEDULE_DELAY", "50")];
    let mut fleet = Fleet::serve(&sb, &["--otlp-endpoint", &endpoint], &quick);
    fleet.worker(&sb, "w1", &[]);
    let mut env = quick.to_vec();
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint));
    assert_eq!(submit(&fleet.url, "resumed", &sb, &env), Some(0));
    let first = wait_for("the first port span", Duration::from_secs(20), || {
        let s = receiver.spans();
        s.iter().find(|g| g.name == "port").cloned()
    });
    // Resubmitted from another trace (an agent's): the orchestrator's
    // Submit span continues the port's trace and links the caller's call,
    // which could not know the port's context; the new run hangs under it.
    let caller = "6bf92f3577b34da6a3ce929d0e0e4738";
    let tp = format!("00-{caller}-20f067aa0ba902b7-01");
    env.push(("TRACEPARENT", &tp));
    assert_eq!(submit(&fleet.url, "resumed", &sb, &env), Some(0));
    fleet.stop();
    let spans = receiver.spans();
    let cli = one(&spans, "second submit span", |s| {
        s.name == "submit" && s.trace_id == caller
    });
    // The CLI's call is a client span under its command, with the RPC
    // conventions' attributes.
    let call = one(&spans, "second Submit call", |s| {
        s.name == "fvd.v1.PortService/Submit" && s.trace_id == caller
    });
    assert_eq!(call.parent, cli.span_id);
    assert_eq!(call.kind, "SPAN_KIND_CLIENT");
    for (key, want) in [
        ("rpc.system", "grpc"),
        ("rpc.service", "fvd.v1.PortService"),
        ("rpc.method", "Submit"),
        ("server.address", "127.0.0.1"),
        ("rpc.grpc.status_code", "0"),
    ] {
        assert_eq!(attr(call, key), want, "{call:?}");
    }
    let port: u16 = fleet.url.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(attr(call, "server.port"), port.to_string());
    let served = one(&spans, "second Submit served", |s| {
        s.name == "fvd.v1.PortService/Submit"
            && s.kind == "SPAN_KIND_SERVER"
            && s.links.iter().any(|(t, _)| t == caller)
    });
    assert_eq!(
        (served.trace_id.as_str(), served.parent.as_str()),
        (first.trace_id.as_str(), first.span_id.as_str())
    );
    assert_eq!(
        served.links,
        [(call.trace_id.clone(), call.span_id.clone())]
    );
    let again = one(&spans, "resumed port span", |s| {
        s.name == "port" && s.span_id != first.span_id
    });
    assert_eq!(
        (again.trace_id.as_str(), again.parent.as_str()),
        (first.trace_id.as_str(), served.span_id.as_str())
    );
}

/// A CLI that does not export sends no trace context: the orchestrator's
/// Submit span is still part of the port's trace, with the run under it,
/// on the first submit and on a resume, never a trace of one span.
#[test]
fn a_submit_from_a_cli_that_does_not_export_is_in_the_port_s_trace() {
    let receiver = Receiver::start("127.0.0.1:0").expect("receiver");
    let sb = Sandbox::new().with_auth();
    sb.port("quietcli", &[TestComponent::new("solo", "pass")]);
    let endpoint = receiver.endpoint();
    let quick = [("OTEL_BSP_SCHEDULE_DELAY", "50")];
    let mut fleet = Fleet::serve(&sb, &["--otlp-endpoint", &endpoint], &quick);
    fleet.worker(&sb, "w1", &[]);
    assert_eq!(submit(&fleet.url, "quietcli", &sb, &[]), Some(0));
    let first_port = wait_for("the first port span", Duration::from_secs(20), || {
        receiver.spans().into_iter().find(|g| g.name == "port")
    });
    assert_eq!(submit(&fleet.url, "quietcli", &sb, &[]), Some(0));
    wait_for("two port spans", Duration::from_secs(20), || {
        (receiver.spans().iter().filter(|g| g.name == "port").count() == 2).then_some(())
    });
    fleet.stop();
    let spans = receiver.spans();
    let served: Vec<&Got> = spans
        .iter()
        .filter(|s| s.name == "fvd.v1.PortService/Submit" && s.kind == "SPAN_KIND_SERVER")
        .collect();
    assert_eq!(served.len(), 2, "{served:#?}");
    for s in &served {
        assert_eq!(s.trace_id, first_port.trace_id, "{s:?}");
        assert!(
            spans.iter().any(|c| c.parent == s.span_id),
            "the Submit span has no child: {s:?}"
        );
    }
    assert!(
        spans.iter().all(|s| s.name != "submit"),
        "the CLI exported nothing"
    );
    for port in spans.iter().filter(|s| s.name == "port") {
        assert!(
            served.iter().any(|s| s.span_id == port.parent),
            "a run not under its Submit: {port:?}"
        );
    }
}

/// `fvd answer --orchestrator` from a shell with no trace of the port: the
/// orchestrator's Answer span (a server span) joins the port's trace and
/// links the caller's.
#[test]
fn a_fleet_answer_joins_its_port_s_trace() {
    let receiver = Receiver::start("127.0.0.1:0").expect("receiver");
    let sb = Sandbox::new().with_auth();
    crate::agent::example_repo(&sb, without_timestep_embed);
    let endpoint = receiver.endpoint();
    let quick = [("OTEL_BSP_SCHEDULE_DELAY", "50")];
    let mut fleet = Fleet::serve(
        &sb,
        &["--otlp-endpoint", &endpoint, "--allow-agent-commands"],
        &quick,
    );
    fleet.worker(&sb, "w1", &[]);
    let mut env = quick.to_vec();
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint));
    assert_eq!(
        submit(&fleet.url, "tinyport", &sb, &env),
        Some(3),
        "paused on time_shift's question"
    );
    // The paused port's own span is still open (its actors wait for the
    // answer); a finished component's span names its trace.
    let port = wait_for(
        "a component span of the port",
        Duration::from_secs(20),
        || {
            receiver.spans().into_iter().find(|g| {
                g.name == "component"
                    && g.attrs.get("fvd.family").map(String::as_str) == Some("tinyport")
            })
        },
    );
    let mut cmd = fvd();
    clean_env(&mut cmd);
    let out = cmd
        .envs(env.iter().copied())
        .args([
            "answer",
            "tinyport",
            "E001",
            "--option",
            "1",
            "--orchestrator",
            &fleet.url,
        ])
        .args(sb.token_args("porter"))
        .arg("--repo")
        .arg(sb.repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let served = wait_for("the Answer call's span", Duration::from_secs(20), || {
        receiver
            .spans()
            .into_iter()
            .find(|g| g.name == "fvd.v1.PortService/Answer" && g.kind == "SPAN_KIND_SERVER")
    });
    fleet.stop();
    let spans = receiver.spans();
    let cli = one(&spans, "the CLI's Answer call", |s| {
        s.name == "fvd.v1.PortService/Answer" && s.kind == "SPAN_KIND_CLIENT"
    });
    assert_ne!(
        cli.trace_id, port.trace_id,
        "the CLI could not know the port's trace"
    );
    assert_eq!(served.trace_id, port.trace_id, "{served:?}");
    assert_eq!(served.kind, "SPAN_KIND_SERVER");
    assert_eq!(served.links, [(cli.trace_id.clone(), cli.span_id.clone())]);
}

// ---------------------------------------------------------------------------
// Agents behind fvd's model proxy (issue 29).

#[test]
fn an_agent_behind_the_model_proxy_is_a_gen_ai_span_with_its_cost_and_no_key() {
    let receiver = Receiver::start("127.0.0.1:0").expect("receiver");
    let sb = Sandbox::new();
    let key = "sk-fvdtest-otel-00112233445566778899aabbcc";
    let server = crate::agent_model::proxied_port(&sb, key, 2, "max_attempts = 1");
    let (code, out, err) = run(exporting(&receiver)
        .args(["submit", "--family", "tinyport", "--wait", "--repo"])
        .arg(sb.repo())
        .env("OPENAI_API_KEY", key)
        .env(
            "OPENAI_BASE_URL",
            format!("http://127.0.0.1:{}/v1", server.port),
        ));
    assert!(code.is_some(), "{out}\n{err}");
    let spans = receiver.spans();
    let a = one(&spans, "agent_run span", |s| s.name == "agent_run");
    assert_eq!(attr(a, "gen_ai.operation.name"), "invoke_agent");
    assert_eq!(attr(a, "gen_ai.system"), "openai");
    assert_eq!(attr(a, "gen_ai.request.model"), "gpt-5");
    // Two replies of 1,000 + 200 cached input and 50 output tokens.
    assert_eq!(attr(a, "gen_ai.usage.input_tokens"), "2400");
    assert_eq!(attr(a, "gen_ai.usage.output_tokens"), "100");
    for key in [
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "fvd.agent.requests",
        "fvd.attempt",
    ] {
        assert!(
            a.ints.contains(key),
            "{key} is not an integer: {:?}",
            a.attrs.get(key)
        );
    }
    let cost: f64 = attr(a, "fvd.agent.cost_usd").parse().unwrap();
    assert!(
        (cost - 2.0 * crate::agent_model::REPLY_USD).abs() < 1e-9,
        "{cost}"
    );
    let r = receiver.sink.received.lock().unwrap();
    let usd: f64 = r
        .sums
        .iter()
        .filter(|((name, _), _)| name == "fvd.agent.cost")
        .map(|(_, v)| *v)
        .sum();
    assert!((usd - cost).abs() < 1e-9, "{usd} {:?}", r.metric_names);
    assert!(r.metric_names.iter().any(|m| m == "fvd.agent.tokens"));
    // No byte of the key left in a span or a metric.
    for b in &r.bytes {
        assert!(!b.windows(key.len()).any(|w| w == key.as_bytes()));
    }
    assert!(!out.contains(key) && !err.contains(key));
}
