//! What each page shows, gathered through [`crate::query`] (the one read
//! side: the dashboard never reads the store itself) into plain
//! serialisable values. The HTML pages render these values and the JSON
//! twins return them as they are, so a page and its twin never disagree.
//! Port data comes from [`query::snapshot`]; only what the snapshot leaves
//! out (times, leased GPUs, runs) is read beside it.

use std::collections::BTreeMap;

use fvd_actors::scheduler::SchedulerMsg;
use fvd_contracts::Phase;
use fvd_store::traces::TraceInvestigation;
use fvd_store::usage::UsageTotals;
use fvd_store::{AttemptRow, Store, StoreError};
use serde::Serialize;

use crate::query::{self, PortSnapshot};

/// How much of a run's output a page carries; `fvd logs` has the rest.
pub const LOG_PAGE_BYTES: usize = 512 * 1024;

#[derive(Debug, Clone, Serialize)]
pub struct IndexView {
    pub ports: Vec<PortSummary>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PortSummary {
    pub family: String,
    pub phase: String,
    pub state: String,
    /// Components per status (`non_skip_pass`, `blocked`, `running`, …).
    pub counts: BTreeMap<String, usize>,
    pub components: usize,
    pub open_questions: usize,
    pub created_ms: i64,
    pub updated_ms: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PortView {
    pub family: String,
    pub state: String,
    pub phase: String,
    pub repo: String,
    pub port_status_path: String,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// P0..P11, each with its latest gate outcome.
    pub phases: Vec<PhaseView>,
    /// The gate's refusals and pending decisions with their reasons,
    /// newest first.
    pub refusals: Vec<GateView>,
    pub components: Vec<ComponentView>,
    pub questions: Vec<QuestionView>,
    /// What the port's agents spent on their model APIs (every attempt).
    pub agent_spend: Option<SpendView>,
    /// Every run of every submit, on lanes per worker and GPU.
    pub timeline: TimelineView,
    /// GPUs × hours over every run (a running one up to now).
    pub gpu_hours: f64,
    /// From the port's first submit to its last change, or to now while it
    /// runs.
    pub elapsed_ms: i64,
    /// The port's trace in the tracing UI (`FVD_TRACE_URL_TEMPLATE` with
    /// `{trace_id}`), when both are known.
    pub trace_url: Option<String>,
    /// Job ids of its runs the store gives to a worker that is gone: cut
    /// short, nothing runs them.
    pub interrupted: Vec<String>,
}

/// Runs on a time axis: one lane per worker and GPU (or the worker's CPU
/// slots), each run a bar from its process start to its end (or now).
#[derive(Debug, Clone, Default, Serialize)]
pub struct TimelineView {
    pub t0_ms: i64,
    pub t1_ms: i64,
    pub lanes: Vec<LaneView>,
    /// Runs that started on a worker, lost it and wait in the queue again:
    /// the store no longer names that worker, so they are on no lane.
    pub requeued: Vec<BarView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LaneView {
    /// `worker · GPU n` or `worker · CPU`.
    pub label: String,
    pub bars: Vec<BarView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BarView {
    pub family: String,
    pub component: String,
    pub run_no: u32,
    pub job_id: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub running: bool,
    /// The run's verdict, or its state while it has none.
    pub outcome: String,
}

/// Milliseconds since the epoch, now.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The runs that started, on lanes; `now` ends the running ones.
pub fn timeline(runs: &[fvd_store::dashboard::RunRow], now: i64) -> TimelineView {
    let mut lanes: BTreeMap<(String, u32, u32, u32), LaneView> = BTreeMap::new();
    let mut cpu_runs: Vec<(String, BarView)> = Vec::new();
    let mut gpu_runs: Vec<((String, u32), BarView)> = Vec::new();
    let mut requeued: Vec<BarView> = Vec::new();
    let (mut t0, mut t1) = (i64::MAX, i64::MIN);
    for r in runs {
        let Some(start) = r.spawned_ms.or(r.started_ms) else {
            continue;
        };
        let running = r.finished_ms.is_none() && r.state.is_unfinished();
        // The process's own time when the worker measured it (the result
        // reaches the store a moment after the process ended).
        let end = match (r.duration_ms, r.finished_ms) {
            (Some(d), _) if !running => start.saturating_add(d as i64),
            (_, Some(f)) => f,
            _ if running => now,
            _ => start,
        }
        .max(start);
        let outcome = if r.verdict.is_empty() {
            r.state.to_string()
        } else {
            r.verdict.to_string()
        };
        let bar = BarView {
            family: r.family.clone(),
            component: r.component.clone(),
            run_no: r.run_no,
            job_id: r.job_id.clone(),
            start_ms: start,
            end_ms: end,
            running,
            outcome,
        };
        // A lane is a worker's: a run whose worker the store dropped
        // (queued again after losing it) is listed apart, never on a lane
        // without a name.
        if r.worker_id.is_empty() {
            requeued.push(BarView {
                end_ms: start,
                running: false,
                ..bar
            });
            continue;
        }
        t0 = t0.min(start);
        t1 = t1.max(end);
        // A GPU run is on the lane of each GPU it held; CPU runs go on
        // their worker's CPU lanes below (sorted after the GPUs).
        if r.gpus.is_empty() {
            cpu_runs.push((r.worker_id.clone(), bar));
            continue;
        }
        for gpu in &r.gpus {
            gpu_runs.push(((r.worker_id.clone(), *gpu), bar.clone()));
        }
    }
    // Runs that share a GPU (issue #44) each get a lane inside it, the
    // first free at their start, so no bar hides another.
    for (slot, (worker, gpu), bar) in first_free(gpu_runs) {
        let label = match slot {
            0 => format!("{worker} · GPU {gpu}"),
            n => format!("{worker} · GPU {gpu} · {}", n + 1),
        };
        lanes
            .entry((worker, 0, gpu, slot))
            .or_insert_with(|| LaneView {
                label,
                bars: Vec::new(),
            })
            .bars
            .push(bar);
    }
    // A worker's CPU runs overlap (it has several slots): likewise.
    for (slot, worker, bar) in first_free(cpu_runs) {
        lanes
            .entry((worker.clone(), 1, slot, 0))
            .or_insert_with(|| LaneView {
                label: format!("{worker} · CPU {}", slot + 1),
                bars: Vec::new(),
            })
            .bars
            .push(bar);
    }
    if lanes.is_empty() {
        return TimelineView {
            requeued,
            ..TimelineView::default()
        };
    }
    TimelineView {
        t0_ms: t0,
        t1_ms: t1.max(t0 + 1),
        lanes: lanes.into_values().collect(),
        requeued,
    }
}

/// Each bar of `runs` with the lane it takes within its key (a worker's CPU,
/// a worker's GPU): the first lane free at its start, in start order, so
/// bars of one lane never overlap.
fn first_free<K: Ord + Clone>(mut runs: Vec<(K, BarView)>) -> Vec<(u32, K, BarView)> {
    runs.sort_by(|a, b| (&a.0, a.1.start_ms).cmp(&(&b.0, b.1.start_ms)));
    let mut free_at: BTreeMap<K, Vec<i64>> = BTreeMap::new();
    let mut out = Vec::with_capacity(runs.len());
    for (key, bar) in runs {
        let slots = free_at.entry(key.clone()).or_default();
        let slot = match slots.iter().position(|end| *end <= bar.start_ms) {
            Some(i) => i,
            None => {
                slots.push(i64::MIN);
                slots.len() - 1
            }
        };
        slots[slot] = bar.end_ms;
        out.push((slot as u32, key, bar));
    }
    out
}

impl TimelineView {
    /// Ends the bars of the runs in `cut` (job id → when their worker was
    /// last seen): their worker is gone, so they do not run up to now but
    /// read `interrupted`, whatever the store says.
    pub fn interrupt(&mut self, cut: &BTreeMap<String, i64>) {
        for bar in self.lanes.iter_mut().flat_map(|l| l.bars.iter_mut()) {
            if let Some(seen) = cut.get(&bar.job_id) {
                bar.running = false;
                bar.outcome = "interrupted".to_string();
                bar.end_ms = (*seen).clamp(bar.start_ms, bar.end_ms);
            }
        }
        // The axis ends with the last bar, no longer at now.
        if let Some(end) = self
            .lanes
            .iter()
            .flat_map(|l| &l.bars)
            .map(|b| b.end_ms)
            .max()
        {
            self.t1_ms = end.max(self.t0_ms + 1);
        }
    }
}

/// GPU-hours of `runs` (GPUs needed × the run's time; a running one up to
/// `now`).
fn gpu_hours<'a>(runs: impl Iterator<Item = &'a fvd_store::dashboard::RunRow>, now: i64) -> f64 {
    runs.map(|r| {
        let Some(start) = r.spawned_ms.or(r.started_ms) else {
            return 0.0;
        };
        let end = r
            .finished_ms
            .unwrap_or(if r.state.is_unfinished() { now } else { start });
        f64::from(r.gpus_needed) * (end - start).max(0) as f64 / 3_600_000.0
    })
    .sum()
}

/// The URL of the trace `traceparent` names, by `FVD_TRACE_URL_TEMPLATE`
/// (read once; e.g. `http://jaeger:16686/trace/{trace_id}`).
pub fn trace_url(traceparent: Option<&str>) -> Option<String> {
    static TEMPLATE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let template = TEMPLATE.get_or_init(|| std::env::var("FVD_TRACE_URL_TEMPLATE").ok());
    trace_url_of(template.as_deref(), traceparent)
}

/// `template` with `{trace_id}` replaced by the trace id of `traceparent`
/// (`00-<32 hex>-<16 hex>-<2 hex>`); `None` unless both are well formed.
fn trace_url_of(template: Option<&str>, traceparent: Option<&str>) -> Option<String> {
    let template = template.filter(|t| t.contains("{trace_id}"))?;
    let trace_id = traceparent?.split('-').nth(1)?;
    (trace_id.len() == 32
        && trace_id.bytes().all(|b| b.is_ascii_hexdigit())
        && trace_id.bytes().any(|b| b != b'0'))
    .then(|| template.replace("{trace_id}", trace_id))
}

/// Model usage summed over agent attempts.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct SpendView {
    pub attempts: u32,
    pub tokens: u64,
    pub cost_usd: f64,
    pub unpriced_tokens: u64,
}

impl SpendView {
    fn of(a: &UsageTotals) -> Self {
        SpendView {
            attempts: a.attempts,
            tokens: a.input_tokens + a.output_tokens + a.cache_read_tokens + a.cache_write_tokens,
            cost_usd: a.cost_usd,
            unpriced_tokens: a.unpriced_tokens,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PhaseView {
    pub id: String,
    pub name: String,
    /// `entered`, `passed`, `refused`, `pending`, or empty when the gate
    /// never decided it.
    pub outcome: String,
    pub at_ms: i64,
    pub current: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct GateView {
    pub phase: String,
    pub outcome: String,
    pub conditions: Vec<String>,
    pub at_ms: i64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ComponentView {
    pub name: String,
    pub status: String,
    pub reason: String,
    pub runs: u32,
    pub worker_id: String,
    pub gpus_needed: u32,
    /// Host GPU indices of the latest run's lease.
    pub gpus: Vec<u32>,
    pub updated_ms: i64,
    /// Latest run: its number and state (`running`, `finished`, …).
    pub run_no: u32,
    pub job_state: String,
    /// What its agent attempts spent on their model API.
    pub agent_spend: Option<SpendView>,
    /// GPUs × hours over all its runs.
    pub gpu_hours: f64,
    /// Its latest run's time: running, up to now; else its duration.
    pub elapsed_ms: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct QuestionView {
    pub id: String,
    pub component: String,
    pub decision_type: String,
    pub question: String,
    pub recommended: String,
    pub options: Vec<String>,
    pub status: String,
    pub answer: String,
    /// The credential that answered; empty when none was checked.
    pub answered_by: String,
    pub attempt: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct ComponentPage {
    pub family: String,
    pub port_state: String,
    pub component: ComponentView,
    pub runs: Vec<RunView>,
    pub log: Option<LogView>,
    pub worktree: Option<WorktreeView>,
    pub attempts: Vec<AttemptRow>,
    pub trace: Option<TraceInvestigation>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunView {
    pub run_no: u32,
    pub job_id: String,
    pub state: String,
    pub verdict: String,
    pub reason: String,
    pub worker_id: String,
    pub exit_code: Option<i32>,
    pub duration_ms: Option<u64>,
    pub queued_ms: i64,
    pub started_ms: Option<i64>,
    pub finished_ms: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LogView {
    pub run_no: u32,
    pub job_id: String,
    /// The run is still going: the page follows its output.
    pub following: bool,
    /// Sequence number of the last chunk in `text` (the page follows from
    /// the next one); `None` when nothing is stored yet.
    pub last_seq: Option<u64>,
    /// Earlier output was left out to keep the page small.
    pub cut: bool,
    /// The number of `text`'s first line in the run's whole output (1
    /// unless `cut`): the page anchors each line as `#L<number>`.
    pub first_line: usize,
    pub text: String,
}

/// A search of one run's output: the lines that hold the text, each with
/// a few lines around it, numbered as in the whole output.
#[derive(Debug, Clone, Serialize)]
pub struct SearchView {
    pub family: String,
    pub component: String,
    pub run_no: u32,
    pub job_id: String,
    /// What was searched for (any case); empty: nothing yet.
    pub query: String,
    /// Lines that hold it.
    pub matches: usize,
    /// Hits with their context, overlapping ones merged; the first
    /// [`SEARCH_HITS`] hits only.
    pub blocks: Vec<Vec<SearchLine>>,
    /// The first line the component's page carries (it keeps the last
    /// [`LOG_PAGE_BYTES`]); a line before it is linked in the text.
    pub page_first_line: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct SearchLine {
    /// 1-based, in the run's whole output.
    pub number: usize,
    pub text: String,
    /// It holds what was searched for (else it is context).
    pub hit: bool,
}

/// Hits a search page shows at most.
pub const SEARCH_HITS: usize = 200;
/// Lines of context before and after each hit.
pub const SEARCH_CONTEXT: usize = 2;

#[derive(Debug, Clone, Serialize)]
pub struct WorktreeView {
    pub path: String,
    pub branch: String,
    pub base_commit: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkersView {
    /// The workers that run now: live from the scheduler of this process,
    /// else the stored workers whose process still runs on this host.
    pub fleet: query::Fleet,
    /// The workers that registered once and are gone, latest first.
    pub gone: Vec<query::GoneWorker>,
    /// Runs the store gives to a gone worker: cut short, held by no one.
    pub interrupted: Vec<query::Interrupted>,
    /// Every port's runs of the last [`FLEET_TIMELINE_MS`] (and those still
    /// running), on lanes per worker and GPU.
    pub timeline: TimelineView,
}

/// How far back the fleet's timeline reaches.
pub const FLEET_TIMELINE_MS: i64 = 3_600_000;

/// The index: every port with its counts.
pub async fn index(store: &Store) -> Result<IndexView, StoreError> {
    let times = query::port_times(store).await?;
    let mut ports = Vec::new();
    for family in times.keys() {
        let Some(snap) = query::snapshot(store, family).await? else {
            continue;
        };
        let mut counts = BTreeMap::new();
        for c in &snap.components {
            *counts.entry(c.status.as_str().to_string()).or_insert(0) += 1;
        }
        let t = times.get(&snap.family).cloned().unwrap_or_default();
        ports.push(PortSummary {
            components: snap.components.len(),
            open_questions: snap.open_questions().count(),
            family: snap.family,
            phase: snap.phase,
            state: snap.state.as_str().to_string(),
            counts,
            created_ms: t.created_ms,
            updated_ms: t.updated_ms,
        });
    }
    Ok(IndexView { ports })
}

fn phases(snap: &PortSnapshot) -> Vec<PhaseView> {
    (0..=11u8)
        .filter_map(Phase::from_number)
        .map(|ph| {
            let id = ph.id();
            let last = snap.gate_events.iter().rev().find(|g| g.phase == id);
            PhaseView {
                current: snap.phase == id,
                name: ph.name().to_string(),
                outcome: last
                    .map(|g| g.outcome.as_str().to_string())
                    .unwrap_or_default(),
                at_ms: last.map_or(0, |g| g.at_ms),
                id,
            }
        })
        .collect()
}

/// One port's page; `None` when there is no such port. A run the store
/// gives to a worker that is gone (`scheduler` says which run, else the
/// workers' processes) reads interrupted.
pub async fn port(
    store: &Store,
    scheduler: Option<&ractor::ActorRef<SchedulerMsg>>,
    family: &str,
) -> Result<Option<PortView>, StoreError> {
    let Some(snap) = query::snapshot(store, family).await? else {
        return Ok(None);
    };
    let cut = query::interrupted_runs(store, scheduler).await?;
    let times = query::port_times(store).await?;
    let mut ctimes = query::component_times(store, family).await?;
    let t = times.get(family).cloned().unwrap_or_default();
    let now = now_ms();
    let runs = match query::runs(store, family, None).await {
        Ok(r) => r,
        Err(query::QueryError::Store(e)) => return Err(e),
        Err(_) => Vec::new(),
    };
    let mut components: Vec<ComponentView> = snap
        .components
        .iter()
        .map(|c| {
            let ct = ctimes.remove(&c.name).unwrap_or_default();
            let mine = || runs.iter().filter(|r| r.component == c.name);
            let elapsed_ms = mine()
                .filter_map(|r| {
                    let start = r.spawned_ms.or(r.started_ms)?;
                    Some(r.finished_ms.unwrap_or(now) - start)
                })
                .next_back();
            ComponentView {
                gpu_hours: gpu_hours(mine(), now),
                elapsed_ms,
                name: c.name.clone(),
                status: c.status.as_str().to_string(),
                reason: c.reason.clone(),
                runs: c.runs,
                worker_id: c.worker_id.clone(),
                gpus_needed: ct.gpus_needed,
                gpus: ct.gpus,
                updated_ms: ct.updated_ms,
                run_no: ct.run_no,
                job_state: ct.job_state.map(|s| s.to_string()).unwrap_or_default(),
                agent_spend: c.agent_spend.as_ref().map(SpendView::of),
            }
        })
        .collect();
    interrupt_components(&mut components, &runs, &cut);
    let mut timeline = timeline(&runs, now);
    timeline.interrupt(&cut);
    let refusals = snap
        .current_gate()
        .iter()
        .rev()
        .filter(|g| {
            matches!(
                g.outcome,
                fvd_store::states::GateOutcome::Refused | fvd_store::states::GateOutcome::Pending
            )
        })
        .map(|g| GateView {
            phase: g.phase.clone(),
            outcome: g.outcome.as_str().to_string(),
            conditions: g.conditions.clone(),
            at_ms: g.at_ms,
        })
        .collect();
    let questions = snap
        .escapes
        .iter()
        .map(|e| QuestionView {
            id: e.id.clone(),
            component: e.component.clone(),
            decision_type: e.decision_type.clone(),
            question: e.question.clone(),
            recommended: e.recommended.clone(),
            options: e.options.clone(),
            status: e.status.as_str().to_string(),
            answer: e.answer.clone(),
            answered_by: e.answered_by.clone(),
            attempt: e.attempt,
        })
        .collect();
    Ok(Some(PortView {
        phases: phases(&snap),
        family: snap.family,
        state: snap.state.as_str().to_string(),
        phase: snap.phase,
        repo: snap.repo,
        port_status_path: snap.port_status_path,
        created_ms: t.created_ms,
        updated_ms: t.updated_ms,
        refusals,
        components,
        questions,
        agent_spend: snap.agent_spend.as_ref().map(SpendView::of),
        gpu_hours: gpu_hours(runs.iter(), now),
        elapsed_ms: if snap.state == fvd_store::model::PortState::Running {
            now - t.created_ms
        } else {
            t.updated_ms - t.created_ms
        }
        .max(0),
        timeline,
        interrupted: runs
            .iter()
            .filter(|r| cut.contains_key(&r.job_id))
            .map(|r| r.job_id.clone())
            .collect(),
        trace_url: trace_url(query::port_traceparent(store, family).await?.as_deref()),
    }))
}

/// A component whose latest run is in `cut` (its worker is gone) reads
/// interrupted, whatever the store says, and its time ends with its
/// worker.
fn interrupt_components(
    components: &mut [ComponentView],
    runs: &[fvd_store::dashboard::RunRow],
    cut: &BTreeMap<String, i64>,
) {
    for c in components {
        let Some(r) = runs.iter().rev().find(|r| r.component == c.name) else {
            continue;
        };
        let Some(seen) = cut.get(&r.job_id) else {
            continue;
        };
        c.status = "interrupted".to_string();
        c.job_state = "interrupted".to_string();
        c.reason = format!(
            "interrupted: run {} was on worker {}, which is gone; the port runs it again when it resumes",
            r.run_no, r.worker_id
        );
        if let Some(start) = r.spawned_ms.or(r.started_ms) {
            c.elapsed_ms = Some((seen - start).max(0));
        }
    }
}

/// Keeps the last `max` bytes of `text`, cut at a line start when one is
/// near; returns whether anything was cut.
fn tail(text: String, max: usize) -> (String, bool) {
    let start = tail_start(&text, max);
    if start == 0 {
        return (text, false);
    }
    (text[start..].to_string(), true)
}

/// Where [`tail`] cuts `text`: 0 when it keeps all of it.
fn tail_start(text: &str, max: usize) -> usize {
    if text.len() <= max {
        return 0;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    if let Some(nl) = text[start..].find('\n') {
        start += nl + 1;
    }
    start
}

/// The number of the line of `text` that byte `at` is on (1-based).
fn line_at(text: &str, at: usize) -> usize {
    1 + text.as_bytes()[..at]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
}

/// The lines of `text` (numbered as in `log.txt?q=`) that hold `needle`
/// in any case, the first [`SEARCH_HITS`] with [`SEARCH_CONTEXT`] lines
/// each side, overlapping blocks merged; and how many lines hold it.
fn hits(text: &str, needle: &str) -> (usize, Vec<Vec<SearchLine>>) {
    let needle = needle.to_lowercase();
    let lines: Vec<&str> = text.lines().collect();
    let found: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| !needle.is_empty() && l.to_lowercase().contains(&needle))
        .map(|(i, _)| i)
        .collect();
    let mut blocks: Vec<Vec<SearchLine>> = Vec::new();
    let mut next = 0; // the first line no block holds yet
    for &i in found.iter().take(SEARCH_HITS) {
        let from = i.saturating_sub(SEARCH_CONTEXT).max(next);
        let to = (i + SEARCH_CONTEXT + 1).min(lines.len());
        let line = |n: usize| SearchLine {
            number: n + 1,
            text: lines[n].to_string(),
            hit: found.binary_search(&n).is_ok(),
        };
        match blocks.last_mut() {
            // Touching the previous block: it grows.
            Some(b) if from == next && next > 0 => b.extend((from..to).map(line)),
            _ => blocks.push((from..to).map(line).collect()),
        }
        next = to;
    }
    (found.len(), blocks)
}

/// Searches run `run` of a component (its latest that started when
/// `None`) for `q`; `None` when there is no such run.
pub async fn search(
    store: &Store,
    family: &str,
    name: &str,
    run: Option<u32>,
    q: &str,
) -> Result<Option<SearchView>, query::QueryError> {
    let jobs = query::runs(store, family, Some(name)).await?;
    let Some(job) = query::pick_run(&jobs, run) else {
        return Ok(None);
    };
    let chunks = query::output(store, &job.job_id, None).await?;
    let bytes: Vec<u8> = chunks.into_iter().flat_map(|(_, _, d)| d).collect();
    let text = String::from_utf8_lossy(&bytes);
    let query = q.trim().to_string();
    let (matches, blocks) = hits(&text, &query);
    Ok(Some(SearchView {
        family: family.to_string(),
        component: name.to_string(),
        run_no: job.run_no,
        job_id: job.job_id,
        query,
        matches,
        blocks,
        page_first_line: line_at(&text, tail_start(&text, LOG_PAGE_BYTES)),
    }))
}

/// One component's page: runs, the output of run `run` (the latest when
/// `None`), the attempt ledger and the latest trace investigation. `None`
/// when the port or the component does not exist.
pub async fn component(
    store: &Store,
    scheduler: Option<&ractor::ActorRef<SchedulerMsg>>,
    family: &str,
    name: &str,
    run: Option<u32>,
) -> Result<Option<ComponentPage>, StoreError> {
    let Some(port) = port(store, scheduler, family).await? else {
        return Ok(None);
    };
    let Some(component) = port.components.into_iter().find(|c| c.name == name) else {
        return Ok(None);
    };
    let jobs = match query::runs(store, family, Some(name)).await {
        Ok(j) => j,
        Err(query::QueryError::Store(e)) => return Err(e),
        Err(_) => return Ok(None),
    };
    let chosen = match run {
        Some(n) => jobs.iter().find(|j| j.run_no == n),
        None => jobs.last(),
    };
    let log = match chosen {
        Some(j) => {
            let chunks = query::output(store, &j.job_id, None).await?;
            let last_seq = chunks.last().map(|(seq, _, _)| *seq);
            let bytes: Vec<u8> = chunks.into_iter().flat_map(|(_, _, d)| d).collect();
            let whole = String::from_utf8_lossy(&bytes).into_owned();
            let first_line = line_at(&whole, tail_start(&whole, LOG_PAGE_BYTES));
            let (text, cut) = tail(whole, LOG_PAGE_BYTES);
            Some(LogView {
                run_no: j.run_no,
                job_id: j.job_id.clone(),
                following: j.state.is_unfinished() && !port.interrupted.contains(&j.job_id),
                last_seq,
                cut,
                first_line,
                text,
            })
        }
        None => None,
    };
    let runs = jobs
        .iter()
        .map(|j| RunView {
            run_no: j.run_no,
            job_id: j.job_id.clone(),
            state: if port.interrupted.contains(&j.job_id) {
                "interrupted".to_string()
            } else {
                j.state.to_string()
            },
            verdict: j.verdict.to_string(),
            reason: j.reason.clone(),
            worker_id: j.worker_id.clone(),
            exit_code: j.exit_code,
            duration_ms: j.duration_ms,
            queued_ms: j.queued_ms,
            started_ms: j.started_ms,
            finished_ms: j.finished_ms,
        })
        .collect();
    let (worktree, attempts) = match query::attempts(store, family, name).await {
        Ok(a) => a,
        Err(query::QueryError::Store(e)) => return Err(e),
        Err(_) => return Ok(None),
    };
    let worktree = worktree.map(|w| WorktreeView {
        path: w.path.display().to_string(),
        branch: w.branch,
        base_commit: w.base_commit,
    });
    Ok(Some(ComponentPage {
        family: family.to_string(),
        port_state: port.state,
        component,
        runs,
        log,
        worktree,
        attempts,
        trace: query::latest_trace(store, family, name).await?,
    }))
}

/// The fleet: live from the scheduler when one runs in this process, and
/// the stored tables in any case.
pub async fn workers(
    store: &Store,
    scheduler: Option<&ractor::ActorRef<SchedulerMsg>>,
) -> Result<WorkersView, StoreError> {
    let now = now_ms();
    let runs = query::fleet_runs(store, now - FLEET_TIMELINE_MS).await?;
    let roster = query::roster(store, scheduler).await?;
    let mut timeline = timeline(&runs, now);
    timeline.interrupt(&roster.cut());
    Ok(WorkersView {
        fleet: roster.fleet,
        gone: roster.gone,
        interrupted: roster.interrupted,
        timeline,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_link_needs_a_template_and_a_well_formed_traceparent() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let t = Some("http://jaeger:16686/trace/{trace_id}");
        assert_eq!(
            trace_url_of(t, Some(tp)).as_deref(),
            Some("http://jaeger:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(trace_url_of(None, Some(tp)), None);
        assert_eq!(
            trace_url_of(Some("http://x/"), Some(tp)),
            None,
            "no {{trace_id}}"
        );
        assert_eq!(trace_url_of(t, None), None);
        assert_eq!(trace_url_of(t, Some("00-zz-00f067aa0ba902b7-01")), None);
        let zero = format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32));
        assert_eq!(
            trace_url_of(t, Some(&zero)),
            None,
            "the invalid all-zero id"
        );
    }

    /// Two concurrent CPU runs of a worker get a lane each, a GPU run is on
    /// each GPU it held, runs sharing a GPU get a lane each inside it, and a
    /// running run ends now.
    #[test]
    fn the_timeline_puts_overlapping_runs_on_lanes_of_their_own() {
        use fvd_store::dashboard::RunRow;
        let run = |c: &str, gpus: Vec<u32>, start: i64, dur: Option<u64>| RunRow {
            job_id: format!("p.{c}.1"),
            family: "p".into(),
            component: c.into(),
            run_no: 1,
            state: if dur.is_some() {
                fvd_store::model::JobState::Finished
            } else {
                fvd_store::model::JobState::Running
            },
            worker_id: "w".into(),
            gpus_needed: gpus.len() as u32,
            gpus,
            spawned_ms: Some(start),
            duration_ms: dur,
            finished_ms: dur.map(|d| start + d as i64 + 5),
            ..RunRow::default()
        };
        let t = timeline(
            &[
                run("a", vec![], 0, Some(100)),
                run("b", vec![], 50, Some(100)),
                run("c", vec![], 100, Some(10)),
                run("gang", vec![0, 1], 0, None),
                run("shared", vec![1], 20, Some(30)),
                run("after", vec![1], 60, Some(10)),
            ],
            500,
        );
        let lanes: Vec<(&str, Vec<&str>)> = t
            .lanes
            .iter()
            .map(|l| {
                (
                    l.label.as_str(),
                    l.bars.iter().map(|b| b.component.as_str()).collect(),
                )
            })
            .collect();
        assert_eq!(
            lanes,
            [
                ("w · GPU 0", vec!["gang"]),
                ("w · GPU 1", vec!["gang"]),
                ("w · GPU 1 · 2", vec!["shared", "after"]),
                ("w · CPU 1", vec!["a", "c"]),
                ("w · CPU 2", vec!["b"]),
            ]
        );
        assert_eq!((t.t0_ms, t.t1_ms), (0, 500), "the running gang ends now");
        assert!(t.lanes[0].bars[0].running);
        assert_eq!(t.lanes[3].bars[0].end_ms, 100, "the worker's own duration");
    }

    /// Issue #43: a lane is a worker's. A run whose worker the store no
    /// longer names (queued again after losing it) is on no lane but
    /// listed apart; a run of a gone worker reads interrupted.
    #[test]
    fn every_lane_names_its_worker() {
        use fvd_store::dashboard::RunRow;
        let run = |c: &str, worker: &str, state| RunRow {
            job_id: format!("p.{c}.1"),
            family: "p".into(),
            component: c.into(),
            run_no: 1,
            state,
            worker_id: worker.into(),
            spawned_ms: Some(10),
            ..RunRow::default()
        };
        use fvd_store::model::JobState;
        let mut t = timeline(
            &[
                run("lost", "", JobState::Queued),
                run("cut", "w-1", JobState::Running),
            ],
            500,
        );
        let labels: Vec<&str> = t.lanes.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(labels, ["w-1 · CPU 1"]);
        assert_eq!(t.requeued.len(), 1);
        assert_eq!(
            (t.requeued[0].component.as_str(), t.requeued[0].running),
            ("lost", false)
        );
        assert!(t.lanes[0].bars[0].running);
        t.interrupt(&BTreeMap::from([("p.cut.1".to_string(), 40)]));
        let b = &t.lanes[0].bars[0];
        assert_eq!(
            (b.outcome.as_str(), b.running, b.end_ms),
            ("interrupted", false, 40)
        );
    }

    /// A search's hits come with the lines around them, numbered as in
    /// the whole output; blocks that touch merge.
    #[test]
    fn a_search_shows_each_hit_among_its_lines() {
        let text: String = (1..=20)
            .map(|i| {
                format!(
                    "line {i}{}\n",
                    if [5, 7, 18].contains(&i) {
                        " NEEDLE"
                    } else {
                        ""
                    }
                )
            })
            .collect();
        let (n, blocks) = hits(&text, "needle");
        assert_eq!(n, 3);
        let numbers: Vec<Vec<(usize, bool)>> = blocks
            .iter()
            .map(|b| b.iter().map(|l| (l.number, l.hit)).collect())
            .collect();
        assert_eq!(
            numbers,
            [
                vec![
                    (3, false),
                    (4, false),
                    (5, true),
                    (6, false),
                    (7, true),
                    (8, false),
                    (9, false)
                ],
                vec![
                    (16, false),
                    (17, false),
                    (18, true),
                    (19, false),
                    (20, false)
                ],
            ]
        );
        assert_eq!(hits(&text, "").0, 0);
        assert_eq!(line_at("a\nb\nc", 4), 3);
        assert_eq!(line_at("a\nb", 0), 1);
    }

    #[test]
    fn a_long_log_keeps_its_tail_from_a_line_start() {
        let text = "first line\nsecond line\nthird\n".to_string();
        assert_eq!(tail(text.clone(), 100), (text, false));
        let (t, cut) = tail("aaaa\nbbbb\ncccc\n".to_string(), 7);
        assert!(cut);
        assert_eq!(t, "cccc\n");
        // A cut inside a multi-byte character moves to the next boundary.
        let (t, cut) = tail("ééé\nxy".to_string(), 5);
        assert!(cut);
        assert_eq!(t, "xy");
    }
}
