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
    agent_cost: Counter<f64>,
    agent_tokens: Counter<u64>,
    worker_gpu_busy: Counter<f64>,
    worker_jobs: Counter<u64>,
    worker_zygote: Counter<u64>,
}

static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();

/// Bucket bounds of `fvd.job.queue_wait`, in seconds like its samples: from
/// a lease taken at once (milliseconds) to a GPU queue of hours. The SDK's
/// default bounds (0, 5, …, 10000) are milliseconds' and would put nearly
/// every wait in one bucket.
pub const QUEUE_WAIT_BOUNDS_S: &[f64] = &[
    0.0, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0,
];

/// Creates the instruments on the global meter provider.
pub(crate) fn install() {
    let meter = opentelemetry::global::meter("fvd");
    let _ = INSTRUMENTS.set(Instruments {
        queued: meter
            .u64_gauge("fvd.jobs.queued")
            .with_unit("{job}")
            .with_description("jobs waiting for a worker slot")
            .build(),
        running: meter
            .u64_gauge("fvd.jobs.running")
            .with_unit("{job}")
            .with_description("jobs leased to a worker")
            .build(),
        queue_wait: meter
            .f64_histogram("fvd.job.queue_wait")
            .with_unit("s")
            .with_description("time from queueing a job to leasing it")
            .with_boundaries(QUEUE_WAIT_BOUNDS_S.to_vec())
            .build(),
        gpu_seconds: meter
            .f64_counter("fvd.gpu.time")
            .with_unit("s")
            .with_description("leased GPUs times run time, by port and component")
            .build(),
        attempts: meter
            .u64_counter("fvd.attempts")
            .with_unit("{run}")
            .with_description("runs of a component's parity test")
            .build(),
        verdicts: meter
            .u64_counter("fvd.verdicts")
            .with_unit("{verdict}")
            .with_description("classified verdicts of parity-test runs")
            .build(),
        agent_cost: meter
            .f64_counter("fvd.agent.cost")
            .with_unit("USD")
            .with_description("what agent attempts spent on their model APIs, as fvd's proxy metered and priced it")
            .build(),
        agent_tokens: meter
            .u64_counter("fvd.agent.tokens")
            .with_unit("{token}")
            .with_description("model tokens of agent attempts, by gen_ai.token.type")
            .build(),
        worker_gpu_busy: meter
            .f64_counter("fvd.worker.gpu.busy")
            .with_unit("s")
            .with_description("GPU time this worker's jobs held: GPUs times the process's run time")
            .build(),
        worker_jobs: meter
            .u64_counter("fvd.worker.jobs")
            .with_unit("{job}")
            .with_description("jobs this worker ran, by fvd.job.end and fvd.runner (the runner the spec asked for; a warm run that fell back to cold also counts in fvd.worker.zygote as fallback)")
            .build(),
        worker_zygote: meter
            .u64_counter("fvd.worker.zygote")
            .with_unit("{job}")
            .with_description("warm runs by fvd.zygote.result: hit (a zygote was ready), miss (one started for it), fallback (ran cold)")
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
            &[KeyValue::new("fvd.family", family.to_string())],
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

/// A job this worker ran ended: `end` is how (`exit_0`, `failed`,
/// `timed_out`, `cancelled`, `spawn_error`), `warm` whether a zygote forked
/// it; `gpus` × `run` is its GPU busy time.
pub fn worker_job(end: &'static str, warm: bool, gpus: usize, run: Duration) {
    if let Some(i) = INSTRUMENTS.get() {
        i.worker_jobs.add(
            1,
            &[
                KeyValue::new("fvd.job.end", end),
                KeyValue::new("fvd.runner", if warm { "warm" } else { "cold" }),
            ],
        );
        if gpus > 0 {
            i.worker_gpu_busy.add(gpus as f64 * run.as_secs_f64(), &[]);
        }
    }
}

/// How a warm run got its process: `hit`, `miss` or `fallback`.
pub fn zygote(result: &'static str) {
    if let Some(i) = INSTRUMENTS.get() {
        i.worker_zygote
            .add(1, &[KeyValue::new("fvd.zygote.result", result)]);
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
        l.push(KeyValue::new("fvd.verdict", verdict.to_string()));
        i.verdicts.add(1, &l);
    }
}

/// What one agent attempt spent: tokens by type (`input`, `output`,
/// `cache_read`, `cache_write`) and USD.
pub fn agent_usage(
    family: &str,
    component: &str,
    model: &str,
    tokens: [(&str, u64); 4],
    cost_usd: f64,
) {
    if let Some(i) = INSTRUMENTS.get() {
        let mut l = labels(family, component).to_vec();
        l.push(KeyValue::new("gen_ai.request.model", model.to_string()));
        if cost_usd > 0.0 {
            i.agent_cost.add(cost_usd, &l);
        }
        for (kind, n) in tokens {
            if n > 0 {
                let mut l = l.clone();
                l.push(KeyValue::new("gen_ai.token.type", kind.to_string()));
                i.agent_tokens.add(n, &l);
            }
        }
    }
}

fn labels(family: &str, component: &str) -> [KeyValue; 2] {
    [
        KeyValue::new("fvd.family", family.to_string()),
        KeyValue::new("fvd.component", component.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_wait_bounds_are_seconds_from_milliseconds_to_a_day() {
        let b = QUEUE_WAIT_BOUNDS_S;
        assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
        // A lease taken at once and one after seconds are told apart, and
        // so are an hour's and a day's queue.
        assert!(b.iter().any(|x| *x > 0.0 && *x <= 0.01));
        assert!(b.iter().any(|x| (1.0..=5.0).contains(x)));
        assert!(b.iter().any(|x| *x >= 3600.0 && *x < 86400.0));
    }
}
