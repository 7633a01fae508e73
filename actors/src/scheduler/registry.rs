//! The fleet's registry as the scheduler keeps it: a worker that connects
//! (or connects again) is registered with its GPUs and labels, the runs it
//! says it still runs are matched against their leases, and its free slots
//! are what placement sees.

use super::*;

/// A worker registered: recorded, its slots offered, and the jobs that
/// excluded it (after an environment failure) may take it again. A second
/// process under the id of a live worker is refused (`Err`). The runs it
/// says it runs are kept where it still holds their lease (the same
/// process reconnecting), or held for adoption after a restart of this
/// orchestrator; any other is cancelled on it.
pub(super) async fn worker_connected(
    st: &mut SchedulerState,
    r: Registration,
) -> Result<Result<(), String>, ActorProcessingErr> {
    let Registration {
        info,
        tx,
        conn,
        incarnation,
        running,
    } = r;
    let id = info.worker_id.clone();
    let now = st.clock.now_ms();
    let mut kept: Vec<(String, Vec<u32>, u64)> = Vec::new();
    if let Some(old) = st.workers.get_mut(&id) {
        let same = !incarnation.is_empty() && old.incarnation == incarnation;
        let alive =
            !old.tx.is_closed() && now - old.last_seen_ms <= st.config.lease_ttl.as_millis() as i64;
        if !same && alive && !incarnation.is_empty() {
            return Ok(Err(format!(
                "worker id {id} is in use by a live worker on host {} (another process); choose another --worker-id, or stop that worker first",
                old.info.host
            )));
        }
        if same {
            // The same process on a new stream: what it still runs under
            // its lease goes on; the rest goes back to the queue below.
            for (job, epoch) in &running {
                let lease = st
                    .jobs
                    .get(job)
                    .and_then(|e| e.lease.as_ref())
                    .filter(|l| l.is(&id, *epoch) && l.sent);
                if let Some(l) = lease
                    && old.leases.remove(job)
                {
                    kept.push((job.clone(), l.gpus.clone(), l.share_mib));
                }
            }
            if !kept.is_empty() {
                tracing::info!(worker = %id, jobs = ?kept.iter().map(|k| &k.0).collect::<Vec<_>>(), "worker reconnected; its runs go on");
            }
        }
        // Another process of a worker gone, or the rest of this one's.
        lose_worker(st, &id).await?;
    }
    let gpus_json = serde_json::to_string(&info.gpus)?;
    st.store
        .upsert_worker(&info.worker_id, &info.host, &gpus_json, info.cpu_slots)
        .await?;
    tracing::info!(worker = %info.worker_id, gpus = info.gpus.len(), cpu_slots = info.cpu_slots, "worker registered");
    let mut slot = WorkerSlot {
        free_gpus: info.gpus.iter().map(|g| g.index).collect(),
        uses: GpuUses::default(),
        share_room: 0,
        free_cpu: info.cpu_slots,
        last_seen_ms: now,
        draining: false,
        conn,
        tx: tx.clone(),
        class: st.capacity.add(&info),
        free: None,
        leases: BTreeSet::new(),
        key: Arc::from(info.worker_id.as_str()),
        incarnation,
        info,
    };
    for (job, gpus, share_mib) in &kept {
        take_slots(&mut slot, gpus, *share_mib);
        slot.leases.insert(job.clone());
    }
    slot.refile(&mut st.capacity);
    st.last_seen.insert((now, slot.key.clone()));
    st.workers.insert(id.clone(), slot);
    for job in st.excluded_by.remove(&id).unwrap_or_default() {
        if let Some(e) = st.jobs.get_mut(&job) {
            e.job.exclude.remove(&id);
        }
    }
    report_held(st, &id, &kept, running).await;
    let count = st.workers.len();
    for (_, reply) in st.ready_waiters.extract_if(.., |(want, _)| *want <= count) {
        let _ = reply.send(());
    }
    // Only a job that waits can change its mind; sorted so the components
    // hear in a stable order.
    let mut waiting: Vec<String> = st.waiting.iter().cloned().collect();
    waiting.sort();
    check_placeable(st, &waiting);
    Ok(Ok(()))
}

/// Marks a leased run's slots on `w` taken: `share_mib` of each GPU where
/// it shares them, or the GPUs alone for 0.
pub(super) fn take_slots(w: &mut WorkerSlot, gpus: &[u32], share_mib: u64) {
    if gpus.is_empty() {
        w.free_cpu = w.free_cpu.saturating_sub(1);
    } else {
        for g in gpus {
            w.free_gpus.remove(g);
            w.uses.take(*g, share_mib);
        }
    }
}
