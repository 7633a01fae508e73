//! `SchedulerMsg::Fleet`: a read-only picture of the live fleet for the
//! dashboard's `/workers` page: each registered worker with its GPUs, free
//! slots, draining flag and the leases it holds, and the queue per port.
//! A child module so it reads the scheduler's state without widening it.

use std::collections::{BTreeMap, HashMap};

use super::SchedulerState;
use fvd_store::messages::GpuInfo;

/// The fleet as the scheduler knows it at one moment.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct FleetView {
    /// Scheduler clock, milliseconds since the epoch.
    pub now_ms: i64,
    pub workers: Vec<FleetWorker>,
    /// Jobs waiting for a lease, per family.
    pub queued: BTreeMap<String, usize>,
}

/// One registered worker.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct FleetWorker {
    pub worker_id: String,
    pub host: String,
    pub gpus: Vec<GpuInfo>,
    pub free_gpus: Vec<u32>,
    pub cpu_slots: u32,
    pub free_cpu: u32,
    pub labels: BTreeMap<String, String>,
    /// Port-relative paths it provides (`fvd worker --provide`).
    pub provides: Vec<String>,
    pub last_seen_ms: i64,
    pub draining: bool,
    /// The leases it holds, by job id.
    pub jobs: Vec<FleetJob>,
}

/// A job holding a lease on a worker.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct FleetJob {
    pub job_id: String,
    pub family: String,
    pub component: String,
    pub run_no: u32,
    pub lease_epoch: u64,
    pub gpus: Vec<u32>,
    /// MiB it holds of its one shared GPU; 0 for GPUs held alone.
    pub share_mib: u64,
}

pub(super) fn view(st: &SchedulerState) -> FleetView {
    let mut workers: Vec<FleetWorker> = st
        .workers
        .iter()
        .map(|(id, w)| FleetWorker {
            worker_id: id.clone(),
            host: w.info.host.clone(),
            gpus: w.info.gpus.clone(),
            free_gpus: w.free_gpus.iter().copied().collect(),
            cpu_slots: w.info.cpu_slots,
            free_cpu: w.free_cpu,
            labels: w.info.labels.clone(),
            provides: w.info.provides.clone(),
            last_seen_ms: w.last_seen_ms,
            draining: w.draining,
            jobs: Vec::new(),
        })
        .collect();
    workers.sort_by(|a, b| a.worker_id.cmp(&b.worker_id));
    let at: HashMap<&str, usize> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| (w.worker_id.as_str(), i))
        .collect();
    let mut jobs: Vec<(usize, FleetJob)> = Vec::new();
    let mut queued = BTreeMap::new();
    for (job_id, e) in &st.jobs {
        match &e.lease {
            Some(lease) => {
                if let Some(i) = at.get(lease.worker_id.as_str()) {
                    jobs.push((
                        *i,
                        FleetJob {
                            job_id: job_id.clone(),
                            family: e.job.record.family.clone(),
                            component: e.job.record.component.clone(),
                            run_no: e.job.record.run_no,
                            lease_epoch: lease.epoch,
                            gpus: lease.gpus.clone(),
                            share_mib: lease.share_mib,
                        },
                    ));
                }
            }
            None => *queued.entry(e.job.record.family.clone()).or_insert(0) += 1,
        }
    }
    for (i, j) in jobs {
        workers[i].jobs.push(j);
    }
    for w in &mut workers {
        w.jobs.sort_by(|a, b| a.job_id.cmp(&b.job_id));
    }
    FleetView {
        now_ms: st.clock.now_ms(),
        workers,
        queued,
    }
}
