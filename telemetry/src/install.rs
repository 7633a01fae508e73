//! Installing the subscriber and, when configured, the OTLP exporters; and
//! flushing them on the way out.
//!
//! The exporters run on a small runtime of their own: the tonic channel
//! must be created inside a tokio runtime, and the batch span processor
//! exports from its own thread with blocking calls, which must never run
//! on (or outlive) the command's runtime. `Telemetry` owns both and flushes
//! on drop, after the command's runtime is gone.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{MetricExporter, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{ExportConfig, ExportDecision};

/// How long the last flush may take on the way out.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

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
}

impl Telemetry {
    /// Whether spans and metrics leave this process.
    pub fn exporting(&self) -> bool {
        self.export.is_some()
    }

    /// Exports whatever is buffered and stops the exporters. Blocking: call
    /// it outside async code (or from `spawn_blocking`).
    pub fn shutdown(&mut self) {
        let Some(mut export) = self.export.take() else {
            return;
        };
        if let Err(e) = export.tracer.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
            eprintln!("fvd: warning: could not flush spans: {e}");
        }
        if let Some(meter) = &export.meter
            && let Err(e) = meter.shutdown_with_timeout(SHUTDOWN_TIMEOUT)
        {
            eprintln!("fvd: warning: could not flush metrics: {e}");
        }
        if let Some(rt) = export.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shutdown();
    }
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
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(EnvFilter::try_from_env(log_env).unwrap_or_else(|_| EnvFilter::new("warn")));
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
    let mut spans = SpanExporter::builder().with_tonic();
    if let Some(endpoint) = &config.endpoint {
        spans = spans.with_endpoint(endpoint.clone());
    }
    let spans = spans.build().map_err(|e| TelemetryError::Exporter {
        signal: "trace",
        message: e.to_string(),
    })?;
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
    })
}

/// `service.name` from `OTEL_SERVICE_NAME` when set (the SDK's detector reads
/// it), otherwise the process's role.
fn resource(default_service: &str) -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty());
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder
            .with_service_name(default_service.to_string())
            .build()
    }
}
