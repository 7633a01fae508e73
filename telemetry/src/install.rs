//! Installing the subscriber and, when configured, the OTLP exporters; and
//! flushing them on the way out.
//!
//! The exporters run on a small runtime of their own: the tonic channel
//! must be created inside a tokio runtime, and the batch span processor
//! exports from its own thread with blocking calls, which must never run
//! on (or outlive) the command's runtime. `Telemetry` owns both and flushes
//! on drop, after the command's runtime is gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{MetricExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

use crate::config::{ExportConfig, ExportDecision};

/// How long the whole flush on the way out (spans, metrics, the exporters'
/// runtime) may delay the exit: a collector that accepts connections but
/// never answers must not hold every command for the exporters' own
/// timeouts (5 s per signal, 10 s per export).
pub const EXIT_FLUSH: Duration = Duration::from_secs(2);

/// The crates whose spans and events are exported. Dependencies (tonic, h2,
/// hyper, the exporter itself) are left out: their spans are noise, and the
/// exporter's own would feed back into the exporter.
const EXPORTED_TARGETS: &[&str] = &[
    "fvd",
    "fvd_actors",
    "fvd_orchestrator",
    "fvd_worker",
    "fvd_telemetry",
    "fvd_trace",
];

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("otlp export is misconfigured: {0}")]
    Unsupported(String),
    #[error("cannot start the telemetry runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot build the otlp {signal} exporter: {message}")]
    Exporter {
        signal: &'static str,
        message: String,
    },
}

/// The installed telemetry of this process. Dropping it flushes and shuts
/// down the exporters (a no-op when export is off).
#[derive(Debug)]
pub struct Telemetry {
    export: Option<Export>,
}

#[derive(Debug)]
struct Export {
    tracer: SdkTracerProvider,
    meter: Option<SdkMeterProvider>,
    /// Hosts the exporters' gRPC channels; dropped last.
    runtime: Option<tokio::runtime::Runtime>,
    /// Set once a warning about exporting spans was printed.
    warned: Arc<AtomicBool>,
}

impl Telemetry {
    /// Whether spans and metrics leave this process.
    pub fn exporting(&self) -> bool {
        self.export.is_some()
    }

    /// Exports whatever is buffered and stops the exporters, giving up after
    /// [`EXIT_FLUSH`] in all. Blocking: call it outside async code (or from
    /// `spawn_blocking`).
    pub fn shutdown(&mut self) {
        if let Some(export) = self.export.take() {
            flush_bounded(export, EXIT_FLUSH);
        }
    }
}

/// Flushes and stops `export` on a thread of its own and waits for it at
/// most `limit`: the meter provider ignores its timeout, and an export in
/// flight to a collector that never answers holds the span processor until
/// the exporter's own timeout. What is not out by then is dropped (the
/// thread dies with the process), with one warning.
fn flush_bounded(export: Export, limit: Duration) {
    let started = Instant::now();
    let warned = export.warned.clone();
    let (done, finished) = std::sync::mpsc::channel();
    let flush = std::thread::Builder::new()
        .name("fvd-otlp-flush".into())
        .spawn(move || {
            let _ = done.send(flush(export, started + limit));
        });
    if flush.is_err() {
        warn_once(&warned, "could not start the thread that flushes spans");
        return;
    }
    match finished.recv_timeout(limit) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn_once(&warned, &format!("could not flush spans and metrics: {e}")),
        Err(_) => warn_once(
            &warned,
            &format!(
                "could not flush spans and metrics within {} s; the collector does not answer, so what was buffered is dropped",
                limit.as_secs()
            ),
        ),
    }
}

/// Shuts the exporters down within what is left until `deadline`.
fn flush(mut export: Export, deadline: Instant) -> Result<(), String> {
    let left = || deadline.saturating_duration_since(Instant::now());
    let mut failed = Vec::new();
    if let Err(e) = export.tracer.shutdown_with_timeout(left()) {
        failed.push(format!("spans: {e}"));
    }
    if let Some(meter) = &export.meter
        && let Err(e) = meter.shutdown_with_timeout(left())
    {
        failed.push(format!("metrics: {e}"));
    }
    if let Some(rt) = export.runtime.take() {
        rt.shutdown_timeout(left());
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// Prints `what` as a warning unless a warning about exporting spans was
/// printed already: a collector that is down fails every batch, and one
/// line says so.
fn warn_once(warned: &AtomicBool, what: &str) {
    if !warned.swap(true, Ordering::SeqCst) {
        eprintln!("fvd: warning: {what}");
    }
}

/// The span exporter, reporting its first failure (and only that one).
#[derive(Debug)]
struct WarnOnce<E> {
    inner: E,
    warned: Arc<AtomicBool>,
}

impl<E: SpanExporter> SpanExporter for WarnOnce<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let result = self.inner.export(batch).await;
        if let Err(e) = &result {
            warn_once(
                &self.warned,
                &format!(
                    "could not export spans to the collector: {e}; later failures are not reported"
                ),
            );
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One human-readable line per event (`TIME LEVEL target: message
    /// key=value…`), coloured only when asked.
    #[default]
    Text,
    /// One JSON object per line and event: `timestamp`, `level`, `target`,
    /// `message` and the event's fields at the top level, and the current
    /// span (`span`) with its fields. Never coloured.
    Json,
}

/// How the process logs: the variable holding the filter, the filter when
/// that variable sets none (`off` keeps a command's output free of log
/// lines), the line format, and whether text lines may carry colour codes
/// (never when stderr is not a terminal, or `NO_COLOR`).
#[derive(Debug, Clone, Copy)]
pub struct LogConfig<'a> {
    pub env: &'a str,
    pub default_filter: &'a str,
    pub format: LogFormat,
    pub ansi: bool,
}

/// Installs the global subscriber: stderr logs filtered by the environment
/// variable `log_env` (default `warn`), plus OTLP export when `flag` or the
/// `OTEL_*` variables configure it. `default_service` names the process
/// (`service.name`) unless `OTEL_SERVICE_NAME` does.
pub fn init(
    flag: Option<&str>,
    default_service: &str,
    log_env: &str,
) -> Result<Telemetry, TelemetryError> {
    use std::io::IsTerminal;
    init_with(
        flag,
        default_service,
        LogConfig {
            env: log_env,
            default_filter: "warn",
            format: LogFormat::Text,
            ansi: std::io::stderr().is_terminal(),
        },
    )
}

/// [`init`] with every choice about the log lines made by the caller.
pub fn init_with(
    flag: Option<&str>,
    default_service: &str,
    log: LogConfig<'_>,
) -> Result<Telemetry, TelemetryError> {
    let filter =
        EnvFilter::try_from_env(log.env).unwrap_or_else(|_| EnvFilter::new(log.default_filter));
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs: Box<dyn Layer<Registry> + Send + Sync> = match log.format {
        LogFormat::Text => lines.with_ansi(log.ansi).with_filter(filter).boxed(),
        LogFormat::Json => lines
            .json()
            .with_ansi(false)
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_filter(filter)
            .boxed(),
    };
    let registry = tracing_subscriber::registry().with(logs);
    let config = match ExportDecision::resolve(flag, default_service, |k| std::env::var(k).ok()) {
        ExportDecision::Off => {
            registry.init();
            return Ok(Telemetry { export: None });
        }
        ExportDecision::Unsupported(why) => return Err(TelemetryError::Unsupported(why)),
        ExportDecision::Export(c) => c,
    };
    let export = build(&config)?;
    let tracer = export.tracer.tracer("fvd");
    let targets = EXPORTED_TARGETS.iter().fold(Targets::new(), |t, name| {
        t.with_target(*name, LevelFilter::INFO)
    });
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        // No Rust module path on every span: attributes are fvd's own
        // (`fvd.*`) or the conventions'.
        .with_target(false)
        // Busy/idle times would need every enter and exit timed; the
        // spans' own start and end say what is needed.
        .with_tracked_inactivity(false)
        .with_filter(targets);
    registry.with(otel).init();
    if let Some(meter) = &export.meter {
        opentelemetry::global::set_meter_provider(meter.clone());
        crate::metrics::install();
    }
    tracing::debug!(endpoint = ?config.endpoint, "otlp export on");
    Ok(Telemetry {
        export: Some(export),
    })
}

fn build(config: &ExportConfig) -> Result<Export, TelemetryError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("fvd-otlp")
        .enable_all()
        .build()
        .map_err(TelemetryError::Runtime)?;
    // The tonic channels spawn their workers on the runtime they are built in.
    let _inside = runtime.enter();
    let resource = resource(&config.default_service);
    let mut spans = opentelemetry_otlp::SpanExporter::builder().with_tonic();
    if let Some(endpoint) = &config.endpoint {
        spans = spans.with_endpoint(endpoint.clone());
    }
    let spans = spans.build().map_err(|e| TelemetryError::Exporter {
        signal: "trace",
        message: e.to_string(),
    })?;
    let warned = Arc::new(AtomicBool::new(false));
    let spans = WarnOnce {
        inner: spans,
        warned: warned.clone(),
    };
    // The sampler comes from OTEL_TRACES_SAMPLER and the batch delays from
    // OTEL_BSP_*: the SDK reads both when the builder is made.
    let tracer = SdkTracerProvider::builder()
        .with_batch_exporter(spans)
        .with_resource(resource.clone())
        .build();
    let meter = if config.metrics {
        let mut metrics = MetricExporter::builder().with_tonic();
        if let Some(endpoint) = &config.endpoint {
            metrics = metrics.with_endpoint(endpoint.clone());
        }
        let metrics = metrics.build().map_err(|e| TelemetryError::Exporter {
            signal: "metrics",
            message: e.to_string(),
        })?;
        Some(
            SdkMeterProvider::builder()
                .with_periodic_exporter(metrics)
                .with_resource(resource)
                .build(),
        )
    } else {
        None
    };
    drop(_inside);
    Ok(Export {
        tracer,
        meter,
        runtime: Some(runtime),
        warned,
    })
}

/// `service.name` from `OTEL_SERVICE_NAME` when set (the SDK's detector reads
/// it), otherwise the process's role.
fn resource(default_service: &str) -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty());
    let mut builder = Resource::builder();
    if !named {
        builder = builder.with_service_name(default_service.to_string());
    }
    // Each process its own instance, so the metrics of short-lived CLI
    // processes (and of several workers on one host) never collide; one
    // given in OTEL_RESOURCE_ATTRIBUTES wins.
    let given = std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| {
        v.split(',')
            .any(|kv| kv.trim_start().starts_with("service.instance.id="))
    });
    if !given {
        builder = builder.with_attribute(opentelemetry::KeyValue::new(
            "service.instance.id",
            instance_id(),
        ));
    }
    // fvd's crates share one version: this one's is the binary's.
    builder = builder.with_attribute(opentelemetry::KeyValue::new(
        "service.version",
        env!("CARGO_PKG_VERSION"),
    ));
    if let Some(host) = host_name() {
        builder = builder.with_attribute(opentelemetry::KeyValue::new("host.name", host));
    }
    builder.build()
}

/// The kernel's host name, if it has one.
fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// This process's `service.instance.id`: host, pid and start time, unique
/// on a host and across restarts.
fn instance_id() -> String {
    let host = host_name().unwrap_or_default();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{host}-{}-{nanos:x}", std::process::id())
}

/// One log event as the JSON format writes it (`timestamp`, `level`,
/// `message`, `target` `fvd`), for a line a process writes to stderr
/// itself (a warning for a person, its last error): under `--log-format
/// json` every stderr line then parses, whatever the filter lets through.
pub fn json_event(level: &str, message: &str) -> String {
    serde_json::json!({
        "timestamp": rfc3339_now(),
        "level": level,
        "message": message,
        "target": "fvd",
    })
    .to_string()
}

/// Now in UTC, `2026-12-03T13:40:00.123456Z`.
fn rfc3339_now() -> String {
    rfc3339(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

/// `d` after the Unix epoch, in UTC.
fn rfc3339(d: std::time::Duration) -> String {
    let (year, month, day, h, m, s) = civil_utc(d.as_secs() as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{:06}Z",
        d.subsec_micros()
    )
}

/// Seconds after the Unix epoch as a UTC civil date and time: (year,
/// month, day, hour, minute, second), by Howard Hinnant's algorithm. The
/// one calendar fvd's readers print times with.
pub fn civil_utc(secs: i64) -> (i64, i64, i64, i64, i64, i64) {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day, rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod json_event_tests {
    #[test]
    fn a_json_event_is_one_object_with_a_utc_timestamp() {
        let line = super::json_event("WARN", "the token file is \"readable\"");
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "WARN");
        assert_eq!(v["message"], "the token file is \"readable\"");
        let ts = v["timestamp"].as_str().unwrap();
        assert_eq!(ts.len(), 27, "{ts}");
        assert!(
            ts.starts_with("20") && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
            "{ts}"
        );
        let at = |s: f64| super::rfc3339(std::time::Duration::from_secs_f64(s));
        assert_eq!(at(1_796_300_400.25), "2026-12-03T12:20:00.250000Z");
        assert_eq!(at(951_782_400.0), "2000-02-29T00:00:00.000000Z");
        assert_eq!(at(0.0), "1970-01-01T00:00:00.000000Z");
    }
}
