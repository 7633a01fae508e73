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
struct Got {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    attrs: HashMap<String, String>,
    events: Vec<String>,
}

#[derive(Debug, Default)]
struct Received {
    spans: Vec<Got>,
    metric_names: Vec<String>,
    /// Latest value of each counter point: (metric, sorted attributes).
    sums: HashMap<(String, Vec<(String, String)>), f64>,
    /// Every request as its protobuf bytes, to search for secrets.
    bytes: Vec<Vec<u8>>,
}

#[derive(Debug, Clone, Default)]
struct Sink {
    received: Arc<Mutex<Received>>,
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
        let req = request.into_inner();
        let mut r = self.received.lock().unwrap();
        r.bytes.push(req.encode_to_vec());
        for rm in &req.resource_metrics {
            for sm in &rm.scope_metrics {
                for m in &sm.metrics {
                    r.metric_names.push(m.name.clone());
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

/// A receiver on its own runtime, counting every TCP connection it accepts.
struct Receiver {
    addr: SocketAddr,
    sink: Sink,
    connections: Arc<AtomicUsize>,
    _runtime: tokio::runtime::Runtime,
}

impl Receiver {
    fn start(bind: &str) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind(bind))?;
        let addr = listener.local_addr()?;
        let sink = Sink::default();
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

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn spans(&self) -> Vec<Got> {
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
        let mut child = cmd
            .args(["orchestrator", "serve", "--listen", "127.0.0.1:0", "--db"])
            .arg(format!("sqlite://{}", db.display()))
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

fn submit(url: &str, family: &str, repo: &Path, env: &[(&str, &str)]) -> Option<i32> {
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
            "--repo",
        ])
        .arg(repo)
        .output()
        .unwrap();
    eprintln!(
        "submit stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.status.code()
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
    let sb = Sandbox::new();
    let seen = sb.repo().join("traceparent.txt");
    sb.port(
        "otelport",
        &[
            TestComponent::new("joined", &write_traceparent(&seen)),
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
    assert_eq!(
        submit(&fleet.url, "otelport", sb.repo(), &submit_env),
        Some(1)
    );
    fleet.stop();

    let spans = wait_for("the port span", Duration::from_secs(20), || {
        let s = receiver.spans();
        s.iter().any(|g| g.name == "port").then_some(s)
    });

    // One trace for the port, and everything of the port is in it.
    let port = one(&spans, "port span", |s| s.name == "port");
    assert_eq!(attr(port, "family"), "otelport");
    assert_eq!(port.service, "fvd-orchestrator");
    // The port continues the caller's trace: caller → submit (CLI) → port.
    let cli = one(&spans, "submit span", |s| s.name == "submit");
    assert_eq!(cli.service, "fvd");
    assert_eq!((cli.trace_id.as_str(), cli.parent.as_str()), caller);
    assert_eq!(port.trace_id, caller.0);
    assert_eq!(port.parent, cli.span_id);
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
        s.name == "phase" && s.attrs.get("phase").map(String::as_str) == Some("P6")
    });
    assert_eq!(p6.parent, port.span_id);
    assert_eq!(attr(p6, "outcome"), "passed");
    for (component, verdict) in [("joined", "non_skip_pass"), ("leaky", "debug_red")] {
        let c = one(&spans, "component span", |s| {
            s.name == "component" && s.attrs.get("component").map(String::as_str) == Some(component)
        });
        assert_eq!(c.parent, p6.span_id, "{component}");
        assert_eq!(attr(c, "verdict"), verdict, "{component}");
        let a = one(&spans, "attempt span", |s| {
            s.name == "attempt" && s.parent == c.span_id
        });
        assert_eq!(attr(a, "attempt"), "1");
        assert_eq!(attr(a, "verdict"), verdict);
        let job = one(&spans, "job span", |s| {
            s.name == "job" && s.parent == a.span_id
        });
        assert_eq!(job.service, "fvd-orchestrator");
        assert_eq!(attr(job, "worker_id"), "w1");
        assert_eq!(attr(job, "family"), "otelport");
        assert!(attr(job, "queue_wait_ms").parse::<i64>().unwrap() >= 0);
        assert_eq!(attr(job, "gpu_seconds"), "0");
        // The link that crosses processes: the worker's span is a child of
        // the orchestrator's job span.
        let run = one(&spans, "job.run span", |s| {
            s.name == "job.run" && s.parent == job.span_id
        });
        assert_eq!(run.service, "fvd-worker");
        assert_eq!(attr(run, "worker_id"), "w1");
        assert_eq!(attr(run, "job_id"), attr(job, "job_id"));
        if component == "joined" {
            // And into pytest: TRACEPARENT names the worker's span.
            let tp = std::fs::read_to_string(&seen).expect("the test wrote its TRACEPARENT");
            assert_eq!(tp, format!("00-{trace}-{}-01", run.span_id));
        }
    }
    // The gate refuses P7 (a component is blocked): a span event says so.
    let p7 = one(&spans, "P7 span", |s| {
        s.name == "phase" && s.attrs.get("phase").map(String::as_str) == Some("P7")
    });
    assert_eq!(attr(p7, "outcome"), "refused");
    assert!(
        p7.events.iter().any(|e| e == "gate refused a transition"),
        "{p7:?}"
    );

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
    // Counters carry port, component and verdict as attributes.
    let sums = receiver.sink.received.lock().unwrap().sums.clone();
    let key = |metric: &str, extra: &[(&str, &str)]| {
        let mut a: Vec<(String, String)> = [("family", "otelport"), ("component", "leaky")]
            .iter()
            .chain(extra)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        a.sort();
        (metric.to_string(), a)
    };
    assert_eq!(
        sums.get(&key("fvd.verdicts", &[("verdict", "debug_red")])),
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
            s.name == "component" && s.attrs.get("component").map(String::as_str) == Some("leaky")
        })
        .unwrap();
    assert!(
        attr(leaky, "reason").contains(&format!("[redacted:{TOKEN_ENV}]")),
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
    let sb = Sandbox::new();
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
    assert_eq!(submit(&fleet.url, "quiet", sb.repo(), &[]), Some(0));
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
    assert_eq!(attr(cmp, "family"), "tinylm");
    assert_eq!(attr(cmp, "component"), "transformer");
    assert_eq!(attr(cmp, "diverged"), "true");
    assert_eq!(
        attr(cmp, "first_divergent_module"),
        report["first_divergence"]["reference_module"]
            .as_str()
            .unwrap()
    );
    assert_eq!(
        attr(cmp, "first_divergent_stat"),
        report["first_divergence"]["stat"].as_str().unwrap()
    );
    assert_eq!(
        attr(cmp, "compared_rows"),
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
    assert_eq!(attr(port, "state"), "blocked");
    assert_eq!(attr(port, "phase"), "P0");
    assert!(port.events.iter().any(|e| e == "escape hatch"), "{port:?}");
    let p0 = one(&spans, "P0 span", |s| {
        s.name == "phase" && s.parent == port.span_id
    });
    assert_eq!(attr(p0, "outcome"), "refused");
    assert!(
        p0.events.iter().any(|e| e == "gate refused a transition"),
        "{p0:?}"
    );
    assert!(
        !spans.iter().any(|s| s.name == "component"),
        "nothing is dispatched after a P0 refusal"
    );
}
