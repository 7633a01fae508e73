//! The port loop's metrics: jobs queued and running, queue wait,
//! GPU-seconds by port and component, attempts and verdict counts.
//!
//! The instruments exist only once [`crate::init`] installed a meter
//! provider; until then every function here is one atomic load and a
//! branch, so the scheduler can call them on every message.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Gauge, Histogram};

#[derive(Debug)]
struct Instruments {
    queued: Gauge<u64>,
    running: Gauge<u64>,
    queue_wait: Histogram<f64>,
    gpu_seconds: Counter<f64>,
    attempts: Counter<u64>,
    verdicts: Counter<u64>,
}

static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();

/// Creates the instruments on the global meter provider.
pub(crate) fn install() {
    let meter = opentelemetry::global::meter("fvd");
    let _ = INSTRUMENTS.set(Instruments {
        queued: meter
            .u64_gauge("fvd.jobs.queued")
            .with_description("jobs waiting for a worker slot")
            .build(),
        running: meter
            .u64_gauge("fvd.jobs.running")
            .with_description("jobs leased to a worker")
            .build(),
        queue_wait: meter
            .f64_histogram("fvd.job.queue_wait")
            .with_unit("s")
            .with_description("time from queueing a job to leasing it")
            .build(),
        gpu_seconds: meter
            .f64_counter("fvd.gpu.time")
            .with_unit("s")
            .with_description("leased GPUs times run time, by port and component")
            .build(),
        attempts: meter
            .u64_counter("fvd.attempts")
            .with_description("runs of a component's parity test")
            .build(),
        verdicts: meter
            .u64_counter("fvd.verdicts")
            .with_description("classified verdicts of parity-test runs")
            .build(),
    });
}

/// Whether metrics are exported (so callers can skip computing inputs).
pub fn enabled() -> bool {
    INSTRUMENTS.get().is_some()
}

/// The scheduler's queue length and the number of leased jobs.
pub fn jobs(queued: usize, running: usize) {
    if let Some(i) = INSTRUMENTS.get() {
        i.queued.record(queued as u64, &[]);
        i.running.record(running as u64, &[]);
    }
}

/// How long a job waited between queueing and its lease.
pub fn queue_wait(family: &str, wait: Duration) {
    if let Some(i) = INSTRUMENTS.get() {
        i.queue_wait.record(
            wait.as_secs_f64(),
            &[KeyValue::new("family", family.to_string())],
        );
    }
}

/// GPU time a finished job used: leased GPUs × run time.
pub fn gpu_seconds(family: &str, component: &str, seconds: f64) {
    if let Some(i) = INSTRUMENTS.get()
        && seconds > 0.0
    {
        i.gpu_seconds.add(seconds, &labels(family, component));
    }
}

/// A component queued a run of its parity test.
pub fn attempt(family: &str, component: &str) {
    if let Some(i) = INSTRUMENTS.get() {
        i.attempts.add(1, &labels(family, component));
    }
}

/// A run was classified.
pub fn verdict(family: &str, component: &str, verdict: &str) {
    if let Some(i) = INSTRUMENTS.get() {
        let mut l = labels(family, component).to_vec();
        l.push(KeyValue::new("verdict", verdict.to_string()));
        i.verdicts.add(1, &l);
    }
}

fn labels(family: &str, component: &str) -> [KeyValue; 2] {
    [
        KeyValue::new("family", family.to_string()),
        KeyValue::new("component", component.to_string()),
    ]
}
