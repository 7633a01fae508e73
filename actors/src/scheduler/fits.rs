//! Whether a queued run could ever fit the fleet, beside the placement
//! that finds it a place now (`placement.rs`): a run that no registered
//! worker could take (too many GPUs, a label nobody carries, weights no
//! worker provides) is said to wait, with why, instead of waiting silently.

use super::*;

/// "path a" or "paths a, b".
pub(super) fn paths_phrase(paths: &[&str]) -> String {
    match paths {
        [one] => format!("path {one}"),
        many => format!("paths {}", many.join(", ")),
    }
}

/// GPUs of a worker the job may use: those in `free` (or all of them, to
/// ask whether it could ever fit) with at least the memory it asks for.
pub(super) fn usable_gpus(w: &WorkerInfo, free: Option<&BTreeSet<u32>>, p: &Placement) -> Vec<u32> {
    w.gpus
        .iter()
        .filter(|g| g.memory_mib >= p.gpu_memory_mib)
        .filter(|g| free.is_none_or(|f| f.contains(&g.index)))
        .map(|g| g.index)
        .collect()
}

/// Tells the components of queued jobs that need more GPUs than any
/// registered worker has (a gang job is never split), and again once such a
/// worker arrives; without it a 2-GPU component among 1-GPU workers would
/// wait in silence. Answered from the capacity index's shapes of worker,
/// not by looking at each worker.
pub(super) fn check_placeable(st: &mut SchedulerState, ids: &[String]) {
    if st.workers.is_empty() {
        // Workers may simply not have registered yet (embedded start-up):
        // the first one to register checks these jobs.
        st.waiting.extend(ids.iter().cloned());
        return;
    }
    for id in ids {
        let Some(e) = st.jobs.get(id).filter(|e| e.lease.is_none()) else {
            st.waiting.remove(id);
            continue;
        };
        let need = e.job.record.gpus_needed;
        let p = &e.job.placement;
        let holders = st.capacity.could_hold(need, p);
        let fitting = st.capacity.members(&holders);
        let reason = if fitting == 0 {
            let mut want = format!(
                "{need} GPU{} on one worker",
                if need == 1 { "" } else { "s" }
            );
            if p.gpu_memory_mib > 0 {
                want.push_str(&format!(" with at least {} MiB each", p.gpu_memory_mib));
            }
            if !p.labels.is_empty() {
                let labels: Vec<String> =
                    p.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                want.push_str(&format!(" labelled {}", labels.join(",")));
            }
            if !p.worker_paths.is_empty() {
                let paths: Vec<&str> = p.worker_paths.iter().map(String::as_str).collect();
                want.push_str(&format!(" providing worker {}", paths_phrase(&paths)));
            }
            if st.config.fixed_fleet {
                let why = never_fits(st.capacity.shapes(), need as usize, p);
                let e = st.jobs.remove(id).expect("checked above");
                st.queue.remove(&e.job.record.family, id);
                forget(st, id, &e);
                let _ = e.job.notify.send_message(JobEvent::Unplaceable {
                    job_id: id.clone(),
                    reason: why,
                });
                continue;
            }
            let missing = st.capacity.unprovided(p);
            Some(if missing.is_empty() {
                format!("waiting: needs {want}; no registered worker has that")
            } else {
                format!(
                    "waiting: needs worker {}; no registered worker provides {} (fvd worker --provide PATH=DIR)",
                    paths_phrase(&missing),
                    if missing.len() == 1 { "it" } else { "them" }
                )
            })
        } else {
            // Excluded workers that could hold the job: when they are all
            // of those, the job waits on its environment.
            let mut why: Vec<String> = e
                .job
                .exclude
                .iter()
                .filter(|(w, _)| {
                    st.workers
                        .get(*w)
                        .is_some_and(|w| Capacity::holds(&holders, w.class))
                })
                .map(|(w, reason)| format!("worker {w}: {reason}"))
                .collect();
            if why.len() == fitting {
                why.sort();
                Some(why.join("; "))
            } else {
                None
            }
        };
        let environment = fitting > 0 && reason.is_some();
        if reason.is_some() {
            st.waiting.insert(id.clone());
        } else {
            st.waiting.remove(id);
        }
        let e = st.jobs.get_mut(id).expect("checked above");
        if reason != e.unplaceable {
            e.unplaceable = reason.clone();
            let _ = e.job.notify.send_message(JobEvent::Waiting {
                job_id: id.clone(),
                reason: reason.unwrap_or_default(),
                environment,
            });
        }
    }
}

/// Why no worker of a fixed fleet (embedded mode's machine) can ever hold a
/// job, and what to do about it. `workers`: one registration per shape.
pub(super) fn never_fits<'a>(
    workers: impl Iterator<Item = &'a WorkerInfo>,
    need: usize,
    p: &Placement,
) -> String {
    let workers: Vec<&WorkerInfo> = workers.collect();
    let gpus = workers.iter().map(|w| w.gpus.len()).max().unwrap_or(0);
    let unprovided: Vec<&str> = p
        .worker_paths
        .iter()
        .filter(|x| !workers.iter().any(|w| w.provides.contains(x)))
        .map(String::as_str)
        .collect();
    if !unprovided.is_empty() {
        return format!(
            "needs worker {}; this machine's checkout does not have {}: put {} there (git-ignored), or run it on a fleet whose workers provide {} (fvd worker --provide PATH=DIR)",
            paths_phrase(&unprovided),
            if unprovided.len() == 1 { "it" } else { "them" },
            if unprovided.len() == 1 { "it" } else { "them" },
            if unprovided.len() == 1 { "it" } else { "them" },
        );
    }
    let labelled = workers.iter().any(|w| labels_match(w, p));
    if !labelled {
        let labels: Vec<String> = p.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        return format!(
            "needs a worker labelled {}; this machine has no such label: run it on a fleet or drop the labels",
            labels.join(",")
        );
    }
    let big = workers
        .iter()
        .map(|w| usable_gpus(w, None, p).len())
        .max()
        .unwrap_or(0);
    if gpus >= need && big < need {
        let most = workers
            .iter()
            .flat_map(|w| w.gpus.iter().map(|g| g.memory_mib))
            .max()
            .unwrap_or(0);
        return format!(
            "needs {need} GPU{} with at least {} MiB each; this machine's have at most {most} MiB: run it on a fleet or lower gpu_memory_mib",
            if need == 1 { "" } else { "s" },
            p.gpu_memory_mib
        );
    }
    let has = match gpus {
        0 => "none".to_string(),
        n => n.to_string(),
    };
    format!(
        "needs {need} GPU{}; this machine has {has}: run it on a fleet or set gpus = {}",
        if need == 1 { "" } else { "s" },
        gpus.min(need)
    )
}
