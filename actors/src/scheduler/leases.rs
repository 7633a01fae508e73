//! A run's way through the scheduler after it is queued: leased, started,
//! finished, held for its worker across an orchestrator restart (and
//! adopted or not), cancelled, expired, or lost with its worker.

use super::*;

/// A run an earlier orchestrator process leased, still `running` in the
/// store: its worker may still run it.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) family: String,
    pub(super) worker_id: String,
    pub(super) epoch: u64,
    pub(super) gpus: Vec<u32>,
    /// Its worker registered and said it runs it: its slots are taken.
    pub(super) reported: bool,
    /// The component that asked to adopt it, waiting for the answer.
    pub(super) waiter: Option<Box<QueuedJob>>,
    /// Its report, when the run ended before its component asked.
    pub(super) early: Option<JobReport>,
}

/// The runs worker `id` says it runs as it registers, besides those it
/// `kept`: a run held for adoption under this worker and epoch takes its
/// slots (and is adopted at once if its component asked); any other is an
/// orphan and is cancelled. A held run of this worker that it does not
/// report runs nowhere.
pub(super) async fn report_held(
    st: &mut SchedulerState,
    id: &str,
    kept: &[(String, Vec<u32>, u64)],
    running: Vec<(String, u64)>,
) {
    let reported: HashSet<&str> = running.iter().map(|(j, _)| j.as_str()).collect();
    let gone: Vec<String> = st
        .held
        .iter()
        .filter(|(j, h)| h.worker_id == id && !h.reported && !reported.contains(j.as_str()))
        .map(|(j, _)| j.clone())
        .collect();
    for job in gone {
        if let Some(h) = st.held.remove(&job) {
            let why = format!("worker {id} came back without it");
            if h.waiter.is_none() {
                st.not_held.insert(job.clone(), why.clone());
            }
            not_adopted(&job, h.waiter, &why);
        }
    }
    let Some(tx) = st.workers.get(id).map(|w| w.tx.clone()) else {
        return;
    };
    for (job, epoch) in running {
        if kept.iter().any(|(k, _, _)| *k == job) {
            continue;
        }
        let held = st
            .held
            .get(&job)
            .is_some_and(|h| h.worker_id == id && h.epoch == epoch && !h.reported);
        if held {
            let h = st.held.get_mut(&job).expect("held");
            h.reported = true;
            let gpus = h.gpus.clone();
            let waiter = h.waiter.take();
            if let Some(w) = st.workers.get_mut(id) {
                // Counted alone: what it shared is not stored, and a GPU
                // held alone takes no new run until every run on it ends.
                take_slots(w, &gpus, 0);
                w.refile(&mut st.capacity);
            }
            tracing::info!(worker = %id, %job, epoch, "a run in flight before this start still runs on its worker");
            if let Some(waiter) = waiter {
                install(st, job, waiter);
            }
            continue;
        }
        let leased_here = st
            .jobs
            .get(&job)
            .and_then(|e| e.lease.as_ref())
            .is_some_and(|l| l.is(id, epoch));
        if !leased_here {
            tracing::warn!(worker = %id, %job, epoch, "worker runs a job under a lease it does not hold; cancelling it");
            let _ = tx
                .send(ToWorker::Cancel {
                    job_id: job,
                    lease_epoch: epoch,
                    reason: "orphaned: no lease of this orchestrator".into(),
                })
                .await;
        }
    }
}

/// Whether `worker_id` runs the held run `job_id` under `epoch` (reported,
/// not yet adopted).
pub(super) fn held_by(st: &SchedulerState, worker_id: &str, job_id: &str, epoch: u64) -> bool {
    st.held
        .get(job_id)
        .is_some_and(|h| h.reported && h.worker_id == worker_id && h.epoch == epoch)
}

pub(super) fn not_adopted(job_id: &str, waiter: Option<Box<QueuedJob>>, reason: &str) {
    if let Some(w) = waiter {
        let _ = w.notify.send_message(JobEvent::NotAdopted {
            job_id: job_id.to_string(),
            reason: reason.to_string(),
        });
    }
}

/// A component asks for its run in flight (see [`SchedulerMsg::Adopt`]).
pub(super) async fn adopt(st: &mut SchedulerState, job: Box<QueuedJob>) {
    let id = job.record.job_id.clone();
    if let Some(e) = st.jobs.get_mut(&id) {
        // Still here (its component was restarted in this process): the
        // new component hears its events from now on.
        e.job.notify = job.notify;
        e.job.span = job.span;
        if let Some(l) = e.lease.as_ref().filter(|l| l.sent) {
            let _ = e.job.notify.send_message(JobEvent::Leased {
                job_id: id,
                worker_id: l.worker_id.clone(),
                epoch: l.epoch,
            });
        }
        return;
    }
    match st.held.remove(&id) {
        None => {
            let why = st.not_held.remove(&id);
            not_adopted(
                &id,
                Some(job),
                why.as_deref().unwrap_or("no worker holds it"),
            )
        }
        Some(h) if h.reported => {
            st.held.insert(id.clone(), h);
            install(st, id, job);
        }
        Some(mut h) => {
            // Its worker has not come back yet: answered when it does, or
            // when the grace ends.
            h.waiter = Some(job);
            st.held.insert(id, h);
        }
    }
}

/// A held run its worker reported and its component asked for: it goes on
/// under its lease as if leased by this process; a report that came first
/// is delivered now.
pub(super) fn install(st: &mut SchedulerState, id: String, job: Box<QueuedJob>) {
    let Some(h) = st.held.remove(&id) else {
        return;
    };
    let span = tracing::info_span!(
        parent: &job.span,
        "job",
        "fvd.job_id" = %id,
        "fvd.worker_id" = %h.worker_id,
        "fvd.lease_epoch" = h.epoch as i64,
        "fvd.adopted" = true,
        "fvd.gpu_seconds" = tracing::field::Empty,
        "fvd.duration_ms" = tracing::field::Empty,
        "fvd.run.peak_gpu_mib" = tracing::field::Empty,
    );
    tracing::info!(job = %id, worker = %h.worker_id, epoch = h.epoch, "adopted a run in flight: same job, same epoch");
    let _ = job.notify.send_message(JobEvent::Leased {
        job_id: id.clone(),
        worker_id: h.worker_id.clone(),
        epoch: h.epoch,
    });
    st.jobs.insert(
        id.clone(),
        Box::new(Entry {
            job,
            lease: Some(Lease {
                worker_id: h.worker_id.clone(),
                epoch: h.epoch,
                gpus: h.gpus,
                share_mib: 0,
                beside: false,
                sent: true,
                span,
                output_bytes: 0,
                output_capped: false,
            }),
            infra_retries: 0,
            unplaceable: None,
        }),
    );
    st.leased += 1;
    if let Some(w) = st.workers.get_mut(&h.worker_id) {
        w.leases.insert(id);
    }
    if let Some(report) = h.early {
        finished(st, h.worker_id, report);
    }
}

/// The grace is over: held runs no worker reported are run again; those a
/// worker runs but no component asked for (a port cancelled or not
/// resumed here) are cancelled on it.
pub(super) async fn expire_held(st: &mut SchedulerState, now: i64) {
    if st.held.is_empty() || now < st.adopt_until_ms {
        return;
    }
    for (job, h) in std::mem::take(&mut st.held) {
        if !h.reported {
            not_adopted(
                &job,
                h.waiter,
                &format!("worker {} did not come back in time", h.worker_id),
            );
            continue;
        }
        tracing::info!(%job, worker = %h.worker_id, "no component adopted a run still in flight; cancelling it");
        if let Some(w) = st.workers.get_mut(&h.worker_id) {
            w.give_back(&h.gpus, 0);
            w.refile(&mut st.capacity);
            let _ =
                w.tx.send(ToWorker::Cancel {
                    job_id: job,
                    lease_epoch: h.epoch,
                    reason: "no component adopted it".into(),
                })
                .await;
        }
    }
}

/// A worker is alive. A worker that came back may still run jobs whose
/// lease moved elsewhere while it was gone: those orphans are cancelled.
pub(super) async fn heartbeat(
    st: &mut SchedulerState,
    worker_id: &str,
    running: Vec<(String, u64)>,
) {
    let now = st.clock.now_ms();
    let Some(w) = st.workers.get_mut(worker_id) else {
        return;
    };
    if w.last_seen_ms != now {
        let key = w.key.clone();
        st.last_seen.remove(&(w.last_seen_ms, key.clone()));
        st.last_seen.insert((now, key));
        w.last_seen_ms = now;
    }
    let tx = w.tx.clone();
    for (job_id, epoch) in running {
        let held = st
            .jobs
            .get(&job_id)
            .and_then(|e| e.lease.as_ref())
            .is_some_and(|l| l.is(worker_id, epoch))
            || held_by(st, worker_id, &job_id, epoch);
        if !held {
            tracing::warn!(worker = %worker_id, job = %job_id, epoch, "worker runs a job under a lease it no longer holds; cancelling it");
            let _ = tx
                .send(ToWorker::Cancel {
                    job_id,
                    lease_epoch: epoch,
                    reason: "orphaned: the lease moved to another worker".into(),
                })
                .await;
        }
    }
}

/// A job joins its port's queue.
pub(super) fn enqueue(st: &mut SchedulerState, job: Box<QueuedJob>) {
    let id = job.record.job_id.clone();
    st.queue.push_back(
        &job.record.family,
        job.placement.priority,
        id.clone(),
        job.record.gpus_needed,
        job.expected_ms(),
    );
    for w in job.exclude.keys() {
        st.excluded_by
            .entry(w.clone())
            .or_default()
            .push(id.clone());
    }
    st.jobs.insert(
        id.clone(),
        Box::new(Entry {
            job,
            lease: None,
            infra_retries: 0,
            unplaceable: None,
        }),
    );
    check_placeable(st, &[id]);
}

/// The family's jobs are placed again; whether it was held.
pub(super) fn release_family(st: &mut SchedulerState, family: &str) -> bool {
    st.holds.remove(family);
    st.queue.release(family)
}

/// Holds past their time end: a component that never said it started
/// delays its port's first placement by at most the hold's length.
pub(super) fn expire_holds(st: &mut SchedulerState, now: i64) {
    if st.holds.is_empty() {
        return;
    }
    let over: Vec<String> = st
        .holds
        .iter()
        .filter(|(_, until)| **until <= now)
        .map(|(f, _)| f.clone())
        .collect();
    for family in over {
        tracing::debug!(%family, "hold on the port's first placement expired");
        release_family(st, &family);
    }
}

/// A job left the scheduler (finished, cancelled, given up or refused):
/// the indexes that name it forget it.
pub(super) fn forget(st: &mut SchedulerState, id: &str, entry: &Entry) {
    st.waiting.remove(id);
    for w in entry.job.exclude.keys() {
        if let Some(jobs) = st.excluded_by.get_mut(w) {
            jobs.retain(|j| j != id);
            if jobs.is_empty() {
                st.excluded_by.remove(w);
            }
        }
    }
}

/// A leased job's process started: its spawn time is stored and its
/// owner told.
pub(super) fn started(
    st: &mut SchedulerState,
    worker_id: String,
    job_id: String,
    epoch: u64,
    at_ms: i64,
) {
    if held_by(st, &worker_id, &job_id, epoch) {
        return;
    }
    if leased(st, &worker_id, &job_id, epoch).is_some() {
        let _ = st.writer.send(Write::Spawned {
            job_id: job_id.clone(),
            at_ms,
        });
    }
    if let Some(e) = leased(st, &worker_id, &job_id, epoch) {
        let _ = e
            .job
            .notify
            .send_message(JobEvent::Started { job_id, worker_id });
    }
}

/// A leased job ended: its slots are freed and the report goes to its
/// owner (behind the job's output, through the writer). False for a stale
/// report, which changes nothing.
pub(super) fn finished(st: &mut SchedulerState, worker_id: String, mut report: JobReport) -> bool {
    if held_by(st, &worker_id, &report.job_id, report.lease_epoch) {
        // Delivered once its component adopts it.
        if let Some(h) = st.held.get_mut(&report.job_id) {
            h.early = Some(report);
        }
        return false;
    }
    if leased(st, &worker_id, &report.job_id, report.lease_epoch).is_none() {
        return false;
    }
    let Some(entry) = st.jobs.remove(&report.job_id) else {
        return false;
    };
    if let Some(lease) = &entry.lease {
        let gpu_seconds = lease.gpus.len() as f64 * report.duration_ms as f64 / 1000.0;
        lease.span.record("fvd.gpu_seconds", gpu_seconds);
        lease
            .span
            .record("fvd.duration_ms", report.duration_ms as i64);
        if let Some(peak) = report.peak_gpu_mib {
            lease.span.record("fvd.run.peak_gpu_mib", peak as i64);
        }
        report.gpu_memory_mib = lease_gpu_mib(st, lease);
        fvd_telemetry::spans::job_ended(&lease.span, &job_end(&report));
        let r = &entry.job.record;
        fvd_telemetry::metrics::gpu_seconds(&r.family, &r.component, gpu_seconds);
    }
    let shared = entry.lease.as_ref().and_then(|l| shared_gpu(st, l));
    release(st, &report.job_id, &entry);
    forget(st, &report.job_id, &entry);
    let _ = st.writer.send(Write::Notify(
        entry.job.notify.clone(),
        Box::new(JobEvent::Finished {
            report,
            worker_id,
            shared,
        }),
    ));
    true
}

/// The memory of the smallest GPU `lease` holds, as its worker registered
/// it: what bounds what the run's component later asks for (0: unknown).
fn lease_gpu_mib(st: &SchedulerState, lease: &Lease) -> u64 {
    let Some(w) = st.workers.get(&lease.worker_id) else {
        return 0;
    };
    w.info
        .gpus
        .iter()
        .filter(|g| lease.gpus.contains(&g.index))
        .map(|g| g.memory_mib)
        .min()
        .unwrap_or(0)
}

/// The GPU `lease` shared with another run, if another lease was on it
/// while it ran.
fn shared_gpu(st: &SchedulerState, lease: &Lease) -> Option<SharedGpu> {
    let gpu = *lease.gpus.first().filter(|_| lease.beside)?;
    let memory_mib = st
        .workers
        .get(&lease.worker_id)
        .and_then(|w| w.info.gpus.iter().find(|g| g.index == gpu))
        .map_or(0, |g| g.memory_mib);
    Some(SharedGpu {
        gpu,
        memory_mib,
        share_mib: lease.share_mib,
    })
}

/// Every queued or running job of `family` is dropped; running ones are
/// cancelled on their workers.
pub(super) async fn cancel_family(st: &mut SchedulerState, family: &str) {
    let held: Vec<String> = st
        .held
        .iter()
        .filter(|(_, h)| h.family == family)
        .map(|(j, _)| j.clone())
        .collect();
    for job in held {
        let Some(h) = st.held.remove(&job) else {
            continue;
        };
        if h.reported
            && let Some(w) = st.workers.get_mut(&h.worker_id)
        {
            w.give_back(&h.gpus, 0);
            w.refile(&mut st.capacity);
            let _ =
                w.tx.send(ToWorker::Cancel {
                    job_id: job,
                    lease_epoch: h.epoch,
                    reason: "port cancelled".into(),
                })
                .await;
        }
    }
    let ids: Vec<String> = st
        .jobs
        .iter()
        .filter(|(_, e)| e.job.record.family == family)
        .map(|(id, _)| id.clone())
        .collect();
    st.queue.remove_family(family);
    // A lease still on its way to the database lands before the port's
    // cancellation is written after this, not over it.
    if ids
        .iter()
        .any(|id| st.jobs[id].lease.as_ref().is_some_and(|l| !l.sent))
    {
        written(st).await;
    }
    for id in ids {
        if let Some(entry) = st.jobs.remove(&id) {
            if let Some(lease) = entry.lease.as_ref().filter(|l| l.sent)
                && let Some(w) = st.workers.get(&lease.worker_id)
            {
                let _ =
                    w.tx.send(ToWorker::Cancel {
                        job_id: id.clone(),
                        lease_epoch: lease.epoch,
                        reason: "port cancelled".into(),
                    })
                    .await;
            }
            release(st, &id, &entry);
            forget(st, &id, &entry);
        }
    }
}

/// One queued or running job is dropped; a running one is cancelled on its
/// worker.
pub(super) async fn cancel_job(st: &mut SchedulerState, job_id: &str, reason: &str) {
    let Some(entry) = st.jobs.remove(job_id) else {
        return;
    };
    st.queue.remove(&entry.job.record.family, job_id);
    if let Some(lease) = entry.lease.as_ref().filter(|l| l.sent)
        && let Some(w) = st.workers.get(&lease.worker_id)
    {
        let _ =
            w.tx.send(ToWorker::Cancel {
                job_id: job_id.to_string(),
                lease_epoch: lease.epoch,
                reason: reason.to_string(),
            })
            .await;
    }
    release(st, job_id, &entry);
    forget(st, job_id, &entry);
}

/// Workers that missed their heartbeats for the lease TTL as of `now` are
/// lost: their leases expire. Only the silent ones are looked at.
pub(super) async fn expire_leases(
    st: &mut SchedulerState,
    now: i64,
) -> Result<(), ActorProcessingErr> {
    let ttl = st.config.lease_ttl.as_millis() as i64;
    let lost: Vec<String> = st
        .last_seen
        .iter()
        .take_while(|(seen, _)| now - seen > ttl)
        .map(|(_, id)| id.to_string())
        .collect();
    for id in lost {
        tracing::warn!(worker = %id, "worker missed its heartbeats; its leases expire");
        lose_worker(st, &id).await?;
    }
    Ok(())
}

/// The entry of a job when `worker_id` holds its lease under `epoch`;
/// otherwise the message is stale and is logged and ignored.
pub(super) fn leased<'a>(
    st: &'a mut SchedulerState,
    worker_id: &str,
    job_id: &str,
    epoch: u64,
) -> Option<&'a mut Entry> {
    let ok = st
        .jobs
        .get(job_id)
        .and_then(|e| e.lease.as_ref())
        .is_some_and(|l| l.is(worker_id, epoch));
    if !ok {
        tracing::warn!(worker = %worker_id, job = %job_id, epoch, "rejected a message with a stale or unknown lease");
        return None;
    }
    st.jobs.get_mut(job_id).map(|e| &mut **e)
}

/// A lease ends: its slots go back to the worker (unless it drains).
pub(super) fn release(st: &mut SchedulerState, job_id: &str, entry: &Entry) {
    let Some(lease) = &entry.lease else {
        return;
    };
    st.leased -= 1;
    let Some(w) = st.workers.get_mut(&lease.worker_id) else {
        return;
    };
    w.leases.remove(job_id);
    w.give_back(&lease.gpus, lease.share_mib);
    w.refile(&mut st.capacity);
}

/// Drops a worker and puts its leased jobs back at the front of the queue,
/// or ends them as `infra_error` once they were retried enough.
pub(super) async fn lose_worker(
    st: &mut SchedulerState,
    worker_id: &str,
) -> Result<(), ActorProcessingErr> {
    let Some(mut w) = st.workers.remove(worker_id) else {
        return Ok(());
    };
    // Held runs it reported wait for it to come back (until the grace
    // ends), their slots gone with it.
    for h in st.held.values_mut().filter(|h| h.worker_id == worker_id) {
        h.reported = false;
    }
    st.capacity.set(&w.key, w.class, w.free, None);
    st.capacity.set_share(&w.key, w.class, w.share_room, 0);
    st.capacity.remove(w.class);
    st.last_seen.remove(&(w.last_seen_ms, w.key.clone()));
    let lost: Vec<String> = std::mem::take(&mut w.leases).into_iter().collect();
    if !lost.is_empty() {
        tracing::warn!(worker = %worker_id, jobs = ?lost, "worker lost while running jobs; they go back to the queue");
        // A lease still on its way to the database lands before the
        // requeue below, not after it.
        written(st).await;
    }
    for id in lost.into_iter().rev() {
        let Some(entry) = st.jobs.get_mut(&id) else {
            continue;
        };
        if entry.lease.take().is_some() {
            st.leased -= 1;
        }
        entry.infra_retries += 1;
        if entry.infra_retries > MAX_INFRA_RETRIES {
            let entry = st.jobs.remove(&id).expect("entry exists");
            forget(st, &id, &entry);
            let _ = entry.job.notify.send_message(JobEvent::WorkerLost {
                job_id: id,
                worker_id: worker_id.to_string(),
                give_up: true,
            });
            continue;
        }
        st.store
            .requeue_job(
                &id,
                &format!("worker {worker_id} lost; retrying on another slot"),
            )
            .await?;
        let _ = entry.job.notify.send_message(JobEvent::WorkerLost {
            job_id: id.clone(),
            worker_id: worker_id.to_string(),
            give_up: false,
        });
        let family = entry.job.record.family.clone();
        let priority = entry.job.placement.priority;
        let gpus = entry.job.record.gpus_needed;
        let expected = entry.job.expected_ms();
        st.queue.push_front(&family, priority, id, gpus, expected);
    }
    Ok(())
}
