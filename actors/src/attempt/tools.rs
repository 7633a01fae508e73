//! fvd as the agent's tools (issue #32): while an attempt's agent runs, its
//! attempt actor serves the attempt's tools on a loopback port with a token
//! of the attempt's own; `fvd mcp`, the stdio MCP server the presets configure,
//! calls them. On the fleet the worker tunnels the agent's connections here
//! as it does the model proxy's, so the tools, like the key, stay on the
//! orchestrator.
//!
//! The wire is one JSON line per connection, answered by one JSON line:
//! `{"token", "tool", "arguments", "pack_len"}` followed by `pack_len`
//! bytes of a git pack (`run_parity`'s snapshot, thin against the
//! attempt's base), and `{"text", "is_error"}` back.
//!
//! Tools served here:
//! - `run_parity`: the component's parity test on the fleet at a commit the
//!   agent's `fvd mcp` made of its work tree (pack included): the verdict
//!   as fvd classifies it, the failing assertion and the output's tail. The
//!   run has no row in `jobs` and is never a verdict of the component; its
//!   GPU time counts against the component's GPU-second budget. The most it
//!   can use (its timeout × its GPUs) is reserved from what the budget has
//!   left when the run is placed, and what it did not use is given back when
//!   it ends: a call the budget cannot cover is refused at once, with the
//!   numbers ([`GpuBudget`]). At most
//!   [`MAX_PARITY_IN_FLIGHT`] calls of an attempt are in flight at once;
//!   one over is refused at once. Each run's job id names the attempt, the
//!   process and a per-process counter, so no two runs share one.
//! - `trace`: the latest drill-down report of the component.
//! - `attempts`: the ledger.
//! - `ask_user`: the escape hatch as a tool call: the question becomes the
//!   attempt's escape hatch when the agent ends (its handoff need not
//!   carry one), and the component waits for a person's answer.
//! - `record`: a tool `fvd mcp` ran itself (`compare_dumps`), recorded.
//!
//! Every call is a `tool_call` span under the attempt's agent span and a
//! row of `attempt_tool_calls`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use fvd_contracts::redactor::Redactor;
use fvd_spec::ComponentSpec;
use fvd_store::{Store, ToolCallRow, now_ms};
use fvd_workspace::agent::{AskedQuestion, FleetAttempt, FleetAttempts};
use fvd_workspace::session::AttemptToken;
use ractor::ActorRef;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tracing::Span;

use crate::scheduler::{QueuedJob, QueuedRun, SchedulerMsg};

/// Longest request line.
const MAX_LINE: u64 = 1024 * 1024;
/// Most bytes of a run's output given back.
const TAIL_BYTES: usize = 4000;
/// Most `run_parity` calls of one attempt in flight at once; a call over
/// it is answered at once with an error, not queued.
pub const MAX_PARITY_IN_FLIGHT: usize = 2;

/// What the attempt's tools work on.
#[derive(Debug)]
pub struct ToolsContext {
    pub family: String,
    pub component: String,
    pub attempt: u32,
    pub spec: ComponentSpec,
    /// The port's repository (packs are indexed there) and the port
    /// folder's place in it.
    pub repo: String,
    pub code_prefix: String,
    /// The attempt's base: a snapshot must descend from it.
    pub base: String,
    pub fvd_writes: Vec<String>,
    pub store: Store,
    pub scheduler: ActorRef<SchedulerMsg>,
    /// Where a run's commit is registered for the worker that runs it (the
    /// run has no row in `jobs`).
    pub registry: FleetAttempts,
    /// The agent's span: each call is a child.
    pub span: Span,
    /// Redacted from what is stored of a call.
    pub secrets: Redactor,
    /// The question the agent asked (`ask_user`), at most one.
    pub asked: Arc<Mutex<Option<AskedQuestion>>>,
    /// What a `run_parity` snapshot may bring: its pack, and the files it
    /// adds or changes over the base (as an attempt's commit).
    pub limits: fvd_workspace::attempt_caps::AttemptLimits,
    /// What the component's GPU-second budget has left for this attempt's
    /// `run_parity` calls.
    pub gpu_budget: GpuBudget,
}

/// The GPU-milliseconds an attempt's `run_parity` calls may still use
/// (`None` inside: the component has no `max_gpu_s`). A call reserves the
/// most its run can use before the run is queued and settles to what it
/// used when the run ends; a reservation dropped unsettled (a call whose
/// connection went away) gives all of it back.
#[derive(Debug, Clone, Default)]
pub struct GpuBudget(Option<Arc<Mutex<u64>>>);

impl GpuBudget {
    /// A budget with `left_ms` GPU-milliseconds; `None`: no limit.
    pub fn new(left_ms: Option<u64>) -> Self {
        GpuBudget(left_ms.map(|l| Arc::new(Mutex::new(l))))
    }

    /// Reserves `need_ms`, or says how much is left when that is less.
    fn reserve(&self, need_ms: u64) -> Result<GpuReservation, u64> {
        let Some(left) = &self.0 else {
            return Ok(GpuReservation(None));
        };
        let mut l = left.lock().expect("gpu budget lock");
        if *l < need_ms {
            return Err(*l);
        }
        *l -= need_ms;
        Ok(GpuReservation(Some((left.clone(), need_ms))))
    }

    /// What is left now (`None`: no limit).
    pub fn left_ms(&self) -> Option<u64> {
        self.0.as_ref().map(|l| *l.lock().expect("gpu budget lock"))
    }
}

/// GPU-milliseconds taken from a [`GpuBudget`], given back on drop.
struct GpuReservation(Option<(Arc<Mutex<u64>>, u64)>);

impl GpuReservation {
    /// The run used `used_ms`: what it did not use goes back.
    fn settle(mut self, used_ms: u64) {
        if let Some((left, held)) = self.0.take() {
            *left.lock().expect("gpu budget lock") += held.saturating_sub(used_ms);
        }
    }
}

impl Drop for GpuReservation {
    fn drop(&mut self) {
        if let Some((left, held)) = self.0.take() {
            *left.lock().expect("gpu budget lock") += held;
        }
    }
}

/// The running tools of one attempt; they stop when it is dropped.
#[derive(Debug)]
pub struct ToolsServer {
    pub addr: SocketAddr,
    /// What the agent sends with each call; its value is known only to
    /// the tools that made it (see [`fvd_workspace::session::AttemptToken`]).
    pub token: AttemptToken,
    task: tokio::task::JoinHandle<()>,
    asked: Arc<Mutex<Option<AskedQuestion>>>,
}

impl ToolsServer {
    /// The question the agent asked through `ask_user`, if it did.
    pub fn asked(&self) -> Option<AskedQuestion> {
        self.asked.lock().expect("asked lock").clone()
    }
}

impl Drop for ToolsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the attempt's tools on a loopback port, admitting `token` (the
/// token of an attempt whose agent holds it already, adopted after a
/// restart of the orchestrator) or a fresh one.
pub async fn start(ctx: ToolsContext, token: Option<AttemptToken>) -> std::io::Result<ToolsServer> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let token = match token {
        Some(t) => t,
        None => AttemptToken::fresh()?,
    };
    let asked = ctx.asked.clone();
    let (ctx, secret) = (Arc::new(ctx), Arc::new(token.clone()));
    let task = fvd_telemetry::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                // Out of descriptors, say: not a busy loop meanwhile.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            let (ctx, secret) = (ctx.clone(), secret.clone());
            fvd_telemetry::spawn(async move {
                if let Err(e) = serve(&ctx, &secret, sock).await {
                    tracing::debug!(error = %e, "an agent's tool connection failed");
                }
            });
        }
    });
    Ok(ToolsServer {
        addr,
        token,
        task,
        asked,
    })
}

fn random_token() -> std::io::Result<String> {
    let mut b = [0u8; 24];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

async fn serve(
    ctx: &ToolsContext,
    token: &AttemptToken,
    sock: tokio::net::TcpStream,
) -> std::io::Result<()> {
    let (rd, mut wr) = sock.into_split();
    let mut rd = tokio::io::BufReader::new(rd);
    let mut line = String::new();
    (&mut rd).take(MAX_LINE).read_line(&mut line).await?;
    let answer = match serde_json::from_str::<Value>(&line) {
        Err(e) => error(format!("the request is not JSON: {e}")),
        Ok(req)
            if !req["token"]
                .as_str()
                .is_some_and(|t| token.admits(t.as_bytes())) =>
        {
            error("refused: not this attempt's token".into())
        }
        Ok(req) => {
            let len = req["pack_len"].as_u64().unwrap_or(0);
            if let Some(why) = ctx.limits.pack_refusal(len) {
                error(why)
            } else {
                // Grown as the bytes come, not allocated at the length
                // the request claims.
                let mut pack = Vec::new();
                (&mut rd).take(len).read_to_end(&mut pack).await?;
                if (pack.len() as u64) < len {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                let tool = req["tool"].as_str().unwrap_or_default().to_string();
                call(ctx, &tool, &req["arguments"], &pack).await
            }
        }
    };
    let mut out = answer.to_string();
    out.push('\n');
    wr.write_all(out.as_bytes()).await?;
    wr.shutdown().await
}

fn error(text: String) -> Value {
    json!({"text": text, "is_error": true})
}

/// What a tool call came to.
struct Called {
    text: String,
    is_error: bool,
    /// One line for the record.
    detail: String,
    gpu_ms: u64,
}

impl Called {
    fn failed(why: String) -> Self {
        Called {
            detail: why.clone(),
            text: why,
            is_error: true,
            gpu_ms: 0,
        }
    }
}

/// Runs one tool, under its span, and records it on the attempt.
async fn call(ctx: &ToolsContext, tool: &str, args: &Value, pack: &[u8]) -> Value {
    let span = tracing::info_span!(
        parent: &ctx.span,
        "tool_call",
        "fvd.family" = %ctx.family,
        "fvd.component" = %ctx.component,
        "fvd.attempt" = i64::from(ctx.attempt),
        "fvd.tool" = %tool,
        "fvd.outcome" = tracing::field::Empty,
    );
    let started = Instant::now();
    let (recorded_tool, called) = match tool {
        "run_parity" => (tool.to_string(), run_parity(ctx, args, pack).await),
        "attempts" => (tool.to_string(), attempts(ctx).await),
        "trace" => (tool.to_string(), trace(ctx).await),
        "ask_user" => (tool.to_string(), ask_user(ctx, args)),
        // A tool `fvd mcp` ran itself: only recorded here.
        "record" => (
            args["tool"].as_str().unwrap_or("unknown").to_string(),
            Called {
                text: "recorded".into(),
                is_error: false,
                detail: args["detail"].as_str().unwrap_or_default().to_string(),
                gpu_ms: 0,
            },
        ),
        other => (
            other.to_string(),
            Called::failed(format!("no tool {other:?}")),
        ),
    };
    let outcome = if called.is_error { "error" } else { "ok" };
    span.record("fvd.outcome", outcome);
    let shown_args = if tool == "record" {
        &args["arguments"]
    } else {
        args
    };
    let row = ToolCallRow {
        family: ctx.family.clone(),
        component: ctx.component.clone(),
        attempt: ctx.attempt,
        tool: recorded_tool,
        arguments: ctx.secrets.text(&shown_args.to_string()),
        outcome: outcome.into(),
        detail: ctx.secrets.text(first_line(&called.detail)),
        duration_ms: started.elapsed().as_millis() as u64,
        gpu_ms: called.gpu_ms,
        at_ms: now_ms(),
        ..ToolCallRow::default()
    };
    if let Err(e) = ctx.store.record_tool_call(&row).await {
        tracing::warn!(error = %e, "an agent's tool call could not be recorded");
    }
    tracing::info!(family = %ctx.family, component = %ctx.component, attempt = ctx.attempt, tool = %row.tool, outcome, "agent tool call");
    json!({"text": ctx.secrets.text(&called.text), "is_error": called.is_error})
}

fn first_line(s: &str) -> &str {
    let l = s.lines().next().unwrap_or_default();
    &l[..l.len().min(300).min(l.floor_char_boundary(300))]
}

/// Takes the snapshot's pack in, measured from a quarantine first: a
/// snapshot over the limits, or not of this attempt, is the call's error,
/// with its numbers (issue #38).
async fn take_in_snapshot(ctx: &ToolsContext, commit: &str, pack: &[u8]) -> Result<(), String> {
    use fvd_workspace::attempt_caps::TakeInError;
    fvd_workspace::attempt_caps::take_in(Path::new(&ctx.repo), &ctx.base, commit, pack, &ctx.limits)
        .await
        .map(|_| ())
        .map_err(|e| match e {
            TakeInError::OverLimit(why) => why.replacen("attempt's commit", "snapshot", 1),
            TakeInError::NotAnAttempt(why) => {
                format!("commit {commit} is not a snapshot of this attempt's work tree: {why}")
            }
            other => format!("the snapshot's objects could not be taken in: {other}"),
        })
}

/// The parity test at the agent's snapshot, on the fleet.
async fn run_parity(ctx: &ToolsContext, args: &Value, pack: &[u8]) -> Called {
    let Some(commit) = args["commit"].as_str().filter(|c| fvd_git_sha(c)) else {
        return Called::failed("run_parity needs the snapshot's commit (a full sha)".into());
    };
    if ctx
        .spec
        .agent
        .as_ref()
        .is_some_and(|a| a.gpus(ctx.spec.gpus) > 0)
    {
        return Called::failed(
            "this attempt holds the component's GPUs ([agent] gpus = \"component\"): run the parity test yourself in your work tree".into(),
        );
    }
    let Some(_slot) = ParitySlot::take(ctx) else {
        return Called::failed(format!(
            "run_parity refused: {MAX_PARITY_IN_FLIGHT} runs of this attempt are already in flight (at most {MAX_PARITY_IN_FLIGHT} at once); wait for one to end"
        ));
    };
    if let Err(why) = take_in_snapshot(ctx, commit, pack).await {
        return Called::failed(why);
    }
    let spec = &ctx.spec;
    let need_ms = spec.timeout_ms().saturating_mul(u64::from(spec.gpus));
    let reservation = match ctx.gpu_budget.reserve(need_ms) {
        Ok(r) => r,
        Err(left_ms) => {
            return Called::failed(format!(
                "run_parity refused: a run may use up to {:.1} GPU-seconds (its timeout × {} GPU{}) and the component's GPU budget has {:.1} left",
                need_ms as f64 / 1000.0,
                spec.gpus,
                if spec.gpus == 1 { "" } else { "s" },
                left_ms as f64 / 1000.0
            ));
        }
    };
    let job_id = parity_job_id(ctx);
    let registry = ctx.registry.clone();
    let _open = registry.open(
        &job_id,
        FleetAttempt {
            repo: PathBuf::from(&ctx.repo),
            commit: commit.to_string(),
            proxy: None,
            tools: None,
            lease: None,
        },
    );
    let env = crate::run_env::run_env(spec.set_env.clone(), &ctx.family, &spec.name, 0);
    let record = QueuedRun {
        job_id: job_id.clone(),
        family: ctx.family.clone(),
        component: ctx.component.clone(),
        run_no: 0,
        argv: spec.argv(),
        cwd: ctx.repo.clone(),
        gpus_needed: spec.gpus,
        timeout_ms: spec.timeout_ms(),
        queued_ms: now_ms(),
        commit: commit.to_string(),
        code_prefix: ctx.code_prefix.clone(),
        expected_ms: None,
    };
    let job = |notify| QueuedJob {
        record,
        env: env.clone(),
        secret_env: spec.env.clone(),
        notify,
        placement: spec.placement.clone(),
        span: Span::current(),
        collect_env: None,
        exclude: BTreeMap::new(),
        preflight: spec.preflight.clone(),
        compare: None,
        fvd_writes: ctx.fvd_writes.clone(),
        warm: spec.runner.warm_preload(),
        agent: None,
    };
    let end = super::fleet::run_queued(
        &ctx.scheduler,
        &registry,
        &job_id,
        super::fleet::Queue::New,
        job,
        std::future::pending(),
    )
    .await;
    let (report, worker) = match end {
        Ok((super::fleet::FleetEnd::Finished { report, worker_id }, _)) => (report, worker_id),
        Ok((super::fleet::FleetEnd::Lost(why) | super::fleet::FleetEnd::NotAdopted(why), _)) => {
            return Called::failed(format!("the run ran on no worker: {why}"));
        }
        Err(e) => return Called::failed(format!("the run could not be queued: {e}")),
    };
    let verdict = crate::red_run::classify(&ctx.repo, spec, &report);
    let gpu_ms = report.duration_ms * u64::from(spec.gpus);
    reservation.settle(gpu_ms);
    let tail = fvd_workspace::agent::tail(&report.output_tail, TAIL_BYTES);
    let status = verdict.status();
    Called {
        text: format!(
            "verdict: {status}\n{verdict}\nworker: {worker}; {:.1} s\n(this run is yours: fvd still confirms a pass with its own run)\n\noutput (last {TAIL_BYTES} bytes):\n{tail}",
            report.duration_ms as f64 / 1000.0
        ),
        is_error: false,
        detail: format!("{status}: {verdict}"),
        gpu_ms,
    }
}

/// The `run_parity` calls in flight, by attempt (`family/component/N`).
static PARITY_IN_FLIGHT: std::sync::LazyLock<Mutex<std::collections::HashMap<String, usize>>> =
    std::sync::LazyLock::new(Default::default);

/// One of an attempt's [`MAX_PARITY_IN_FLIGHT`] places, given back when
/// the call ends (or is dropped, its connection gone).
struct ParitySlot(String);

impl ParitySlot {
    fn take(ctx: &ToolsContext) -> Option<Self> {
        let key = format!("{}/{}/{}", ctx.family, ctx.component, ctx.attempt);
        let mut in_flight = PARITY_IN_FLIGHT.lock().expect("run_parity slots lock");
        let n = in_flight.entry(key.clone()).or_default();
        if *n >= MAX_PARITY_IN_FLIGHT {
            return None;
        }
        *n += 1;
        Some(ParitySlot(key))
    }
}

impl Drop for ParitySlot {
    fn drop(&mut self) {
        let mut in_flight = PARITY_IN_FLIGHT.lock().expect("run_parity slots lock");
        if let Some(n) = in_flight.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&self.0);
            }
        }
    }
}

/// A `run_parity` job's id, never another's: the attempt, this process (a
/// random tag, so a run an earlier process left on a worker is never taken
/// for one of this process's) and a counter of this process's calls.
fn parity_job_id(ctx: &ToolsContext) -> String {
    static PROCESS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        random_token().map_or_else(
            |_| format!("{}-{}", std::process::id(), now_ms()),
            |t| t[..12].to_string(),
        )
    });
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "{}/{}/tool-{}-{}-{seq}",
        ctx.family,
        ctx.component,
        ctx.attempt,
        PROCESS.as_str()
    )
}

fn fvd_git_sha(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

async fn attempts(ctx: &ToolsContext) -> Called {
    match ctx.store.attempts(&ctx.family, &ctx.component).await {
        Err(e) => Called::failed(format!("the ledger could not be read: {e}")),
        Ok(rows) if rows.is_empty() => Called {
            text: "no attempt yet".into(),
            is_error: false,
            detail: "0 attempts".into(),
            gpu_ms: 0,
        },
        Ok(rows) => {
            let mut text = String::new();
            for r in &rows {
                text.push_str(&format!(
                    "attempt {} ({}, {}): {} -> {}; {}; handoff {}: {}\n",
                    r.attempt,
                    r.kind.as_str(),
                    r.state.as_str(),
                    r.verdict_before.as_str(),
                    if r.verdict_after.as_str().is_empty() {
                        "not run yet"
                    } else {
                        r.verdict_after.as_str()
                    },
                    if r.diff_stat.is_empty() {
                        "no change"
                    } else {
                        r.diff_stat.lines().last().unwrap_or_default().trim()
                    },
                    r.handoff_status.as_str(),
                    r.handoff_summary
                ));
            }
            Called {
                detail: format!("{} attempts", rows.len()),
                text,
                is_error: false,
                gpu_ms: 0,
            }
        }
    }
}

async fn trace(ctx: &ToolsContext) -> Called {
    match ctx
        .store
        .latest_trace_summary(&ctx.family, &ctx.component)
        .await
    {
        Err(e) => Called::failed(format!("the drill-down report could not be read: {e}")),
        Ok(None) => Called {
            text: "no drill-down report for this component (its red runs were not traced)".into(),
            is_error: false,
            detail: "none".into(),
            gpu_ms: 0,
        },
        Ok(Some(t)) => Called {
            detail: first_line(&t).to_string(),
            text: t,
            is_error: false,
            gpu_ms: 0,
        },
    }
}

/// The decision types an escape hatch takes.
const DECISION_TYPES: &[&str] = &[
    "scope",
    "dependency",
    "auth",
    "cost",
    "destructive",
    "ambiguity",
    "blocker",
];

/// Keeps the agent's question for when it ends.
fn ask_user(ctx: &ToolsContext, args: &Value) -> Called {
    let text = |k: &str| {
        args[k]
            .as_str()
            .map(str::trim)
            .unwrap_or_default()
            .to_string()
    };
    let question = text("question");
    if question.is_empty() {
        return Called::failed("ask_user needs a `question`".into());
    }
    let options: Vec<String> = args["options"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|o| o.as_str().map(|s| s.trim().to_string()))
                .filter(|o| !o.is_empty())
                .collect()
        })
        .unwrap_or_default();
    if !(2..=4).contains(&options.len()) {
        return Called::failed(format!(
            "ask_user needs 2 to 4 `options` (the recommended one among them); got {}",
            options.len()
        ));
    }
    let recommended = match text("recommended_option") {
        r if r.is_empty() => options[0].clone(),
        r => r,
    };
    if !options.contains(&recommended) {
        return Called::failed(format!(
            "`recommended_option` {recommended:?} is not one of the `options`"
        ));
    }
    let decision_type = match text("decision_type") {
        d if d.is_empty() => "ambiguity".to_string(),
        d => d,
    };
    if !DECISION_TYPES.contains(&decision_type.as_str()) {
        return Called::failed(format!(
            "`decision_type` {decision_type:?} is not one of {}",
            DECISION_TYPES.join(", ")
        ));
    }
    let safe_default = match text("safe_default") {
        d if d.is_empty() => "none".to_string(),
        d => d,
    };
    let mut asked = ctx.asked.lock().expect("asked lock");
    if asked.is_some() {
        return Called::failed(
            "this attempt already asked its question: end your turn; the answer comes with your next attempt".into(),
        );
    }
    *asked = Some(AskedQuestion {
        decision_type,
        question: question.clone(),
        recommended_option: recommended,
        options,
        safe_default,
    });
    Called {
        text: "Your question is recorded as this attempt's escape hatch. End your turn now: the component waits for a person's answer (fvd answer), and your next attempt's packet carries it.".into(),
        is_error: false,
        detail: question,
        gpu_ms: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::JobEvent;
    use ractor::{Actor, ActorProcessingErr, DerivedActorRef};
    use std::time::Duration;

    /// The jobs a [`HoldingScheduler`] was given: id and whom to tell.
    type Held = Arc<Mutex<Vec<(String, DerivedActorRef<JobEvent>)>>>;

    /// A scheduler that holds every job it is given until the test ends it.
    struct HoldingScheduler;

    impl Actor for HoldingScheduler {
        type Msg = SchedulerMsg;
        type State = Held;
        type Arguments = Held;

        async fn pre_start(
            &self,
            _myself: ActorRef<SchedulerMsg>,
            held: Held,
        ) -> Result<Held, ActorProcessingErr> {
            Ok(held)
        }

        async fn handle(
            &self,
            _myself: ActorRef<SchedulerMsg>,
            msg: SchedulerMsg,
            held: &mut Held,
        ) -> Result<(), ActorProcessingErr> {
            if let SchedulerMsg::Enqueue(job) = msg {
                held.lock()
                    .unwrap()
                    .push((job.record.job_id.clone(), job.notify.clone()));
            }
            Ok(())
        }
    }

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = fvd_git::blocking_command(dir).args(args).output().unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    fn held_ids(held: &Held) -> Vec<String> {
        held.lock()
            .unwrap()
            .iter()
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Ends every held job as unplaceable (its call answers "ran on no
    /// worker") and forgets it.
    fn end_held(held: &Held) {
        for (job_id, notify) in held.lock().unwrap().drain(..) {
            notify
                .send_message(JobEvent::Unplaceable {
                    job_id,
                    reason: "ended by the test".into(),
                })
                .unwrap();
        }
    }

    /// Polls `done` until it holds or the deadline passes.
    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Attempt `attempt`'s tools (each test its own: the in-flight cap is
    /// per attempt and process-wide) over a repository with one empty
    /// commit (the base), a component of `spec_extra` lines, and a
    /// scheduler that holds every job it is given; the folder, the tools
    /// and the base.
    async fn tools_over(
        attempt: u32,
        spec_extra: &str,
        gpu_budget: GpuBudget,
        held: &Held,
    ) -> (tempfile::TempDir, Arc<ToolsContext>, String) {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        git(&repo, &["init", "-q"]);
        git(
            &repo,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                "base",
            ],
        );
        let base = git(&repo, &["rev-parse", "HEAD"]);
        let spec = fvd_spec::parse(
            Path::new("p.toml"),
            &format!("[prep]\nmodel_family = \"fam\"\n\n[[component]]\nname = \"a\"\ntype = \"generic\"\nparity_test = \"t/x.py\"\ncoverage_scope = \"both\"\n{spec_extra}"),
        )
        .unwrap()
        .components
        .remove(0);
        let (scheduler, _handle) = Actor::spawn(None, HoldingScheduler, held.clone())
            .await
            .unwrap();
        let ctx = Arc::new(ToolsContext {
            family: "fam".into(),
            component: "a".into(),
            attempt,
            spec,
            repo: repo.display().to_string(),
            code_prefix: String::new(),
            base: base.clone(),
            fvd_writes: Vec::new(),
            store: Store::open_path(&dir.path().join("fvd.db")).await.unwrap(),
            scheduler,
            registry: FleetAttempts::default(),
            span: Span::none(),
            secrets: Redactor::default(),
            asked: Default::default(),
            limits: Default::default(),
            gpu_budget,
        });
        (dir, ctx, base)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_parity_call_reserves_its_gpu_time_when_placed_and_gets_back_what_it_did_not_use()
    {
        let held = Held::default();
        // A 10 s timeout on one GPU; 15 GPU-seconds left.
        let budget = GpuBudget::new(Some(15_000));
        let (_dir, ctx, base) =
            tools_over(4, "gpus = 1\ntimeout_s = 10\n", budget.clone(), &held).await;
        let spawn_call = || {
            let (ctx, args) = (ctx.clone(), json!({ "commit": base }));
            fvd_telemetry::spawn(async move { call(&ctx, "run_parity", &args, &[]).await })
        };
        let first = spawn_call();
        until("the first run queued", || {
            assert!(!first.is_finished(), "the first call ended without a run");
            held.lock().unwrap().len() == 1
        })
        .await;
        assert_eq!(budget.left_ms(), Some(5_000), "reserved when placed");
        // A second run could use 10 more GPU-seconds: refused at once, with
        // the numbers, and nothing queued.
        let answer = spawn_call().await.unwrap();
        let text = answer["text"].as_str().unwrap();
        assert_eq!(
            text,
            "run_parity refused: a run may use up to 10.0 GPU-seconds (its timeout × 1 GPU) and the component's GPU budget has 5.0 left"
        );
        assert_eq!(held.lock().unwrap().len(), 1);
        // The first run ends having used nothing: all of it comes back, and
        // the next call is placed.
        end_held(&held);
        first.await.unwrap();
        assert_eq!(budget.left_ms(), Some(15_000));
        let next = spawn_call();
        until("the next run queued", || held.lock().unwrap().len() == 1).await;
        end_held(&held);
        next.await.unwrap();
        // No budget, no limit.
        assert_eq!(GpuBudget::new(None).reserve(u64::MAX).map(|_| ()), Ok(()));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_run_parity_calls_get_distinct_ids_and_over_the_cap_are_refused_at_once() {
        let held = Held::default();
        let (_dir, ctx, base) = tools_over(3, "", GpuBudget::default(), &held).await;
        let spawn_call = || {
            let (ctx, args) = (ctx.clone(), json!({ "commit": base }));
            fvd_telemetry::spawn(async move { call(&ctx, "run_parity", &args, &[]).await })
        };
        let refusal = format!("at most {MAX_PARITY_IN_FLIGHT} at once");

        // 20 at once: the cap's worth are queued, the rest answered at once.
        let calls: Vec<_> = (0..20).map(|_| spawn_call()).collect();
        until("every call queued or answered", || {
            calls.iter().filter(|c| c.is_finished()).count() + held.lock().unwrap().len() >= 20
        })
        .await;
        let first = held_ids(&held);
        let mut ids = first.clone();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), first.len(), "job ids collide: {first:?}");
        assert_eq!(first.len(), MAX_PARITY_IN_FLIGHT, "queued: {first:?}");
        let (done, running): (Vec<_>, Vec<_>) = calls.into_iter().partition(|c| c.is_finished());
        assert_eq!(done.len(), 20 - MAX_PARITY_IN_FLIGHT);
        for c in done {
            let answer = c.await.unwrap();
            assert_eq!(answer["is_error"], true, "{answer}");
            let text = answer["text"].as_str().unwrap();
            assert!(text.contains(&refusal), "{text}");
        }

        // Each ended run frees its place: nine more rounds at the cap, every
        // call answered, no id seen twice.
        let mut seen = first;
        let mut running = running;
        for round in 0..9 {
            end_held(&held);
            for c in running.drain(..) {
                let answer = tokio::time::timeout(Duration::from_secs(30), c)
                    .await
                    .unwrap_or_else(|_| panic!("round {round}: a run_parity call hangs"))
                    .unwrap();
                let text = answer["text"].as_str().unwrap();
                assert!(text.contains("ran on no worker"), "{text}");
            }
            running = (0..MAX_PARITY_IN_FLIGHT).map(|_| spawn_call()).collect();
            until("the round's runs queued", || {
                held.lock().unwrap().len() == MAX_PARITY_IN_FLIGHT
            })
            .await;
            seen.extend(held_ids(&held));
        }
        end_held(&held);
        for c in running {
            tokio::time::timeout(Duration::from_secs(30), c)
                .await
                .expect("a run_parity call hangs")
                .unwrap();
        }
        let mut ids = seen.clone();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 20, "job ids collide: {seen:?}");
        assert!(
            seen.iter().all(|id| id.starts_with("fam/a/tool-3-")),
            "{seen:?}"
        );
    }
}
