//! The scheduler's batching writer: writes that need no answer before the
//! scheduler moves on (log chunks, spawn times, a round's leases, the
//! notices that must follow them) go to one task that commits them in
//! batches, in order, so a busy fleet costs one transaction per batch, not
//! one per message.

use super::*;

/// Writes that need no answer before the scheduler moves on: the lease was
/// checked before they were queued, and losing the last few on a crash only
/// loses output of a run that will be rerun anyway.
#[derive(Debug)]
pub(super) enum Write {
    Log(LogChunk),
    Spawned {
        job_id: String,
        at_ms: i64,
    },
    /// Delivered once everything queued before it is committed: a
    /// component learns that its run finished only after the run's output
    /// is stored, so `logs --follow` never stops short of the last chunk.
    Notify(DerivedActorRef<JobEvent>, Box<JobEvent>),
    /// A dispatch round's leases: committed (with any other rounds queued
    /// meanwhile, in one transaction), then handed back to the scheduler
    /// as [`SchedulerMsg::Committed`], which sends their assignments.
    Leases(Vec<Planned>),
    /// Answered once everything queued before it is committed.
    Barrier(tokio::sync::oneshot::Sender<()>),
}

/// Lease epochs reserved per synced commit ([`Store::reserve_epochs`]): a
/// lease commits without an fsync of its own once its epoch is in a
/// reserved block. A restart skips what is left of the last block.
pub const EPOCH_BLOCK: u64 = 65_536;

/// Batches queued writes: one relaxed window (no fsync) for everything that
/// arrived while the previous batch was being written. Leases go first and
/// back to `scheduler` once committed; a lease commit that fails stops the
/// scheduler ([`SchedulerMsg::CommitFailed`]), as it did when the scheduler
/// committed them itself. `reserved` is the end of the epochs reserved so
/// far: a batch with a lease above it reserves the next block first (one
/// synced commit), and an idle writer reserves the next block ahead once
/// half of the current one is used, so a lease rarely waits for an fsync.
pub(super) fn spawn_writer(
    store: Store,
    scheduler: ActorRef<SchedulerMsg>,
    mut reserved: u64,
) -> mpsc::UnboundedSender<Write> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Write>();
    fvd_telemetry::spawn(async move {
        let mut batch = Vec::new();
        let mut top = 0;
        while rx.recv_many(&mut batch, 512).await > 0 {
            let mut logs = Vec::new();
            let mut spawned = Vec::new();
            let mut notify = Vec::new();
            let mut leases = Vec::new();
            let mut barriers = Vec::new();
            for w in batch.drain(..) {
                match w {
                    Write::Log(c) => logs.push(c),
                    Write::Spawned { job_id, at_ms } => spawned.push((job_id, at_ms)),
                    Write::Notify(to, msg) => notify.push((to, msg)),
                    Write::Leases(planned) => leases.extend(planned),
                    Write::Barrier(done) => barriers.push(done),
                }
            }
            top = leases.iter().map(|p| p.epoch).fold(top, u64::max);
            let mut failed = None;
            if top > reserved {
                let through = top.saturating_add(EPOCH_BLOCK);
                match store.reserve_epochs(through).await {
                    Ok(()) => reserved = through,
                    Err(e) => failed = Some(format!("could not reserve lease epochs: {e}")),
                }
            }
            let rows: Vec<(&str, &str, u64, &[u32])> = leases
                .iter()
                .map(|p| {
                    (
                        p.job_id.as_str(),
                        p.worker_id.as_str(),
                        p.epoch,
                        p.gpus.as_slice(),
                    )
                })
                .collect();
            let rows = if failed.is_some() { &[][..] } else { &rows[..] };
            match store.record_round(rows, &logs, &spawned).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!(error = %e, chunks = logs.len(), "could not store job output")
                }
                Err(e) => failed = failed.or(Some(e.to_string())),
            }
            if !leases.is_empty() {
                let msg = match failed {
                    None => SchedulerMsg::Committed(leases),
                    Some(e) => SchedulerMsg::CommitFailed(e),
                };
                let _ = scheduler.cast(msg);
            }
            for (to, msg) in notify {
                let _ = to.send_message(*msg);
            }
            for done in barriers {
                let _ = done.send(());
            }
            // Ahead of need, while nothing waits: the lease path keeps off
            // the fsync of the next reservation.
            if reserved.saturating_sub(top) < EPOCH_BLOCK / 2 && rx.is_empty() {
                let through = reserved.saturating_add(EPOCH_BLOCK);
                match store.reserve_epochs(through).await {
                    Ok(()) => reserved = through,
                    Err(e) => {
                        tracing::warn!(error = %e, "could not reserve lease epochs ahead; the next lease will")
                    }
                }
            }
        }
    });
    tx
}

/// Waits until every write queued so far is committed.
pub(super) async fn written(st: &SchedulerState) {
    let (done, wait) = tokio::sync::oneshot::channel();
    if st.writer.send(Write::Barrier(done)).is_ok() {
        let _ = wait.await;
    }
}
