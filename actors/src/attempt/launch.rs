//! How an attempt's agent runs: its environment, its tools (`fvd mcp`),
//! its model proxy when the agent has a model API (the key stays in fvd,
//! the usage is metered into the ledger), and where it runs: on this host
//! in the component's worktree, jailed, or as a fleet job on a worker,
//! which sends back its commit.

use std::path::{Path, PathBuf};

use fvd_store::AttemptRow;
use fvd_store::now_ms;
use fvd_telemetry::{metrics, spans};
use fvd_workspace::agent;
use fvd_workspace::worktree;
use ractor::ActorProcessingErr;
use tracing::Span;

use super::budget::{Spent, allowance};
use super::packet::AttemptFiles;
use super::{AttemptCtx, AttemptTurn};

/// What one run of the agent came to.
pub(super) struct AgentRan {
    /// Time spent opening the ledger row, starting the proxy, and in
    /// `run_agent` as a whole.
    pub(super) ledger_ms: u64,
    pub(super) proxy_ms: u64,
    pub(super) run_ms: u64,
    pub(super) exit: agent::AgentExit,
    pub(super) handoff: agent::HandoffRead,
    /// A cause outside the agent ended it (its model API refused the key
    /// or kept failing): nothing is committed or counted.
    pub(super) environment: Option<fvd_workspace::session::Environment>,
    pub(super) head_before: String,
    /// The commit a worker made of the attempt, when it ran on the fleet.
    pub(super) fleet: Option<FleetCommit>,
    /// The question the agent asked through its `ask_user` tool.
    pub(super) asked: Option<agent::AskedQuestion>,
    /// The try it was to adopt runs on no worker (why): nothing ran.
    pub(super) not_adopted: Option<String>,
}

/// An attempt's commit as a worker sent it back.
pub(super) struct FleetCommit {
    pub(super) sha: String,
    pub(super) pack: Vec<u8>,
    pub(super) worker_id: String,
    /// Why the orchestrator's edge refused it (its pack was over the
    /// limit): then there is no commit to take in.
    pub(super) refused: Option<String>,
}

/// Where an attempt's agent runs on the fleet: its worker fills these in.
pub(super) const WORKDIR: &str = "{workdir}";
const PROMPT_FILE: &str = "{prompt_file}";
pub(super) const HANDOFF_FILE: &str = "{handoff_file}";
const ATTEMPT_DIR: &str = "{attempt_dir}";
const PROXY_URL: &str = "{proxy_url}";
const TOOLS_ADDR: &str = "{tools_addr}";
const FVD_PROGRAM: &str = "{fvd}";

/// How one agent run is started, wherever it runs.
struct AgentLaunch<'a> {
    argv: Vec<String>,
    extra: Vec<(String, String)>,
    stdin: Option<Vec<u8>>,
    /// A preset's configuration files, relative to the attempt's folder
    /// (written there by the launch on this host; carried to a worker).
    files: Vec<(String, String)>,
    /// The attempt's model proxy, which a worker reaches by its tunnel.
    proxy: Option<std::net::SocketAddr>,
    /// The attempt's tools (`fvd mcp`), likewise.
    tools: Option<std::net::SocketAddr>,
    /// Digests of the tokens the agent is given for them (stored with the
    /// try's fleet job, for a restarted orchestrator to admit them).
    proxy_token: String,
    tools_token: String,
    /// The try to adopt instead of queuing a new one.
    adopt: Option<&'a fvd_store::FleetTry>,
    span: &'a Span,
}

/// What one agent run gave, wherever it ran.
struct AgentRun {
    exit: agent::AgentExit,
    /// The handoff file's text, not yet redacted here.
    handoff_text: Option<String>,
    fleet: Option<FleetCommit>,
    /// It could not run for a cause outside the agent (fleet only).
    environment: Option<String>,
    /// The try to adopt runs on no worker (why).
    not_adopted: Option<String>,
}

/// Opens the attempt's ledger row, runs the agent in the worktree's port
/// folder under its own span (behind the model proxy when the agent has a
/// model API), and reads the handoff it returned.
pub(super) async fn run_agent(
    cx: &AttemptCtx,
    turn: &AttemptTurn,
    files: &AttemptFiles,
) -> Result<AgentRan, ActorProcessingErr> {
    let clock = std::time::Instant::now();
    // git works on the whole worktree; the agent in the port's folder of it.
    let head_before = worktree::head(&cx.lp.worktree.path)
        .await
        .map_err(|e| e.to_string())?;
    let cookie = open_ledger(cx, turn, &head_before).await?;
    let ledger_ms = clock.elapsed().as_millis() as u64;
    let (argv, mut extra, span) = agent_command(cx, turn, files, cookie);
    // fvd's tools for the agent (`fvd mcp`), for as long as it runs; an
    // adopted try's admit the token its agent holds.
    let tools_token = turn
        .adopting
        .as_ref()
        .and_then(|t| fvd_workspace::session::AttemptToken::from_digest_hex(&t.tools_token_sha256));
    let tools = start_tools(
        cx,
        turn.attempt,
        &head_before,
        &span,
        &turn.used,
        tools_token,
    )
    .await;
    let mcp = tools.as_ref().map(|t| tools_mcp(cx, t, &head_before));
    if let (Some(m), Some(t)) = (&mcp, &tools) {
        extra.extend(m.env.iter().cloned());
        // The token only in the agent's environment, never in a file or an
        // argument a job could read: `fvd mcp` takes it from there
        // (issue #38).
        if let Some(v) = t.token.value() {
            extra.push(("FVD_TOOLS_TOKEN".into(), v.to_string()));
        }
    }
    let call = AgentCall {
        attempt: turn.attempt,
        argv,
        extra,
        files,
        used: &turn.used,
        span,
        head_before,
        clock,
        ledger_ms,
        mcp,
        tools: tools.as_ref().map(|t| t.addr),
        tools_token: tools
            .as_ref()
            .map(|t| t.token.digest_hex())
            .unwrap_or_default(),
        adopting: turn.adopting.as_ref(),
    };
    let mut ran = match &cx.lp.agent.model {
        Some(model) => proxied_agent(cx, call, model).await?,
        None => plain_agent(cx, call).await?,
    };
    ran.asked = tools.as_ref().and_then(|t| t.asked());
    Ok(ran)
}

/// Opens the attempt's ledger row before its agent exists (a crash from
/// here on finds it); an adopted try goes on under the row its process
/// opened. The cookie that marks the agent's processes.
async fn open_ledger(
    cx: &AttemptCtx,
    turn: &AttemptTurn,
    head_before: &str,
) -> Result<String, ActorProcessingErr> {
    let started_ms = now_ms();
    let cookie = format!(
        "{}/{}/{}/{started_ms}",
        cx.family, cx.spec.name, turn.attempt
    );
    if turn.adopting.is_none() {
        cx.store
            .begin_attempt(&AttemptRow {
                family: cx.family.clone(),
                component: cx.spec.name.clone(),
                attempt: turn.attempt,
                job_before: turn.job_id.to_string(),
                verdict_before: turn.result.verdict,
                reason_before: turn.result.reason.clone(),
                started_ms,
                head_before: head_before.to_string(),
                cookie: cookie.clone(),
                kind: turn.kind,
                ..AttemptRow::default()
            })
            .await?;
    }
    Ok(cookie)
}

/// The agent's command line and fvd's variables for it (on the fleet,
/// with the paths its worker fills in), and its `agent` span.
fn agent_command(
    cx: &AttemptCtx,
    turn: &AttemptTurn,
    files: &AttemptFiles,
    cookie: String,
) -> (Vec<String>, Vec<(String, String)>, Span) {
    let (family, spec, a) = (&cx.family, &cx.spec, &cx.lp.agent);
    let attempt = turn.attempt;
    let wt = cx.lp.worktree.workdir().to_string_lossy().into_owned();
    let fleet = cx.fleet().is_some();
    let (prompt, handoff) = if fleet {
        (PROMPT_FILE, HANDOFF_FILE)
    } else {
        (files.prompt.as_str(), files.handoff.as_str())
    };
    let argv = a.argv(&fvd_spec::AgentVars {
        prompt_file: prompt,
        handoff_file: handoff,
        worktree: if fleet { WORKDIR } else { &wt },
        family,
        component: &spec.name,
        attempt,
    });
    let program = match a.preset {
        Some(p) => p.program().to_string(),
        None => argv[0].clone(),
    };
    let span = spans::agent_run(&cx.span, family, &spec.name, attempt, &program);
    let mut extra = vec![
        ("FVD_FAMILY".to_string(), family.clone()),
        ("FVD_COMPONENT".to_string(), spec.name.clone()),
        ("FVD_ATTEMPT".to_string(), attempt.to_string()),
        ("FVD_PROMPT_FILE".to_string(), prompt.to_string()),
        ("FVD_HANDOFF_FILE".to_string(), handoff.to_string()),
        (agent::COOKIE_ENV.to_string(), cookie),
    ];
    if let Some(tp) = fvd_telemetry::traceparent(&span) {
        extra.push((fvd_telemetry::TRACEPARENT.to_string(), tp));
    }
    (argv, extra, span)
}

/// Runs an agent without a model API of fvd's (its own command, its own
/// key if any): no proxy, no metering.
async fn plain_agent(cx: &AttemptCtx, r: AgentCall<'_>) -> Result<AgentRan, ActorProcessingErr> {
    let (spec, a) = (&cx.spec, &cx.lp.agent);
    let AgentRun {
        exit,
        handoff_text,
        fleet,
        environment,
        not_adopted,
    } = run_where(
        cx,
        r.attempt,
        r.files,
        &r.head_before,
        AgentLaunch {
            argv: r.argv,
            extra: r.extra,
            stdin: None,
            files: Vec::new(),
            proxy: None,
            tools: r.tools,
            proxy_token: String::new(),
            tools_token: r.tools_token,
            adopt: r.adopting,
            span: &r.span,
        },
        std::future::pending(),
    )
    .await?;
    // The handoff is stored and may reach PORT_STATUS.md: redacted like
    // the agent's output.
    let handoff_text = handoff_text.map(|t| cx.agents.redactor(&a.env).text(&t));
    let mut handoff = agent::read_handoff_for(spec, None, handoff_text.as_deref(), &exit.stdout);
    if let Some(e) = &exit.spawn_error {
        handoff.summary = e.clone();
    }
    let outcome = agent::exit_text(exit.exit_code, exit.signal, exit.timed_out);
    r.span.record("fvd.outcome", outcome.as_str());
    if let Some(c) = exit.exit_code {
        r.span.record("fvd.exit_code", c);
    }
    Ok(AgentRan {
        ledger_ms: r.ledger_ms,
        proxy_ms: 0,
        run_ms: r.clock.elapsed().as_millis() as u64,
        exit,
        handoff,
        environment: environment.map(fvd_workspace::session::Environment),
        head_before: r.head_before,
        fleet,
        asked: None,
        not_adopted,
    })
}

/// The parts of one agent run, once its ledger row, command and tools are
/// ready.
struct AgentCall<'a> {
    attempt: u32,
    argv: Vec<String>,
    extra: Vec<(String, String)>,
    files: &'a AttemptFiles,
    used: &'a Spent,
    span: Span,
    head_before: String,
    /// Started with the attempt's ledger row.
    clock: std::time::Instant,
    ledger_ms: u64,
    mcp: Option<fvd_workspace::preset::Mcp>,
    tools: Option<std::net::SocketAddr>,
    /// The digest of the tools' token.
    tools_token: String,
    adopting: Option<&'a fvd_store::FleetTry>,
}

/// Runs the agent behind its own model proxy: the key stays in fvd, the
/// usage is written to the ledger as it is metered, and the agent is ended
/// the moment the proxy trips (a budget spent, a refused key).
async fn proxied_agent(
    cx: &AttemptCtx,
    r: AgentCall<'_>,
    model: &fvd_spec::agent_model::ModelSpec,
) -> Result<AgentRan, ActorProcessingErr> {
    let (family, spec) = (&cx.family, &cx.spec);
    let AgentCall {
        attempt,
        argv,
        mut extra,
        files,
        used,
        span,
        head_before,
        clock,
        ledger_ms,
        mcp,
        tools,
        tools_token,
        adopting,
    } = r;
    // A try after a crash (or an adopted one) adds to what the tries
    // before it spent, and may spend only what the attempt has left.
    let before = cx
        .store
        .usage_of(family, &spec.name)
        .await?
        .remove(&attempt);
    let before = before.unwrap_or_default();
    let started = std::time::Instant::now();
    let session = start_session(cx, attempt, model, used, &before, adopting).await;
    let proxy_ms = started.elapsed().as_millis() as u64;
    // An attempt that ends before any work: nothing to read or take in.
    let ended = |exit, environment, not_adopted| AgentRan {
        ledger_ms,
        proxy_ms,
        run_ms: clock.elapsed().as_millis() as u64,
        exit,
        handoff: agent::read_handoff_for(spec, None, None, ""),
        environment,
        head_before: head_before.clone(),
        fleet: None,
        asked: None,
        not_adopted,
    };
    let sess = match session {
        Ok(s) => std::sync::Arc::new(s),
        Err(env) => {
            span.record("fvd.outcome", "environment");
            return Ok(ended(agent::AgentExit::default(), Some(env), None));
        }
    };
    let (argv, stdin, launch_files) =
        proxied_command(cx, &sess, files, argv, &mut extra, mcp.as_ref())?;
    tracing::debug!(%family, component = %spec.name, attempt, proxy_ms, "agent attempt: model proxy started");
    let writer = usage_writer(cx, &sess, attempt, &before);
    let program = argv[0].clone();
    let ran = run_where(
        cx,
        attempt,
        files,
        &head_before,
        AgentLaunch {
            argv,
            extra,
            stdin,
            files: launch_files,
            proxy: Some(sess.proxy().addr()),
            tools,
            proxy_token: sess.proxy().token_digest(),
            tools_token,
            adopt: adopting,
            span: &span,
        },
        sess.stopped(),
    )
    .await;
    writer.abort();
    let _ = writer.await;
    let AgentRun {
        exit,
        handoff_text,
        fleet,
        environment,
        not_adopted,
    } = ran?;
    if not_adopted.is_some() {
        return Ok(ended(exit, None, not_adopted));
    }
    if let Some(why) = environment {
        span.record("fvd.outcome", "environment");
        return Ok(ended(
            exit,
            Some(fvd_workspace::session::Environment(why)),
            None,
        ));
    }
    let (handoff, environment) = metered_end(
        cx,
        Metered {
            attempt,
            model,
            span: &span,
            program: &program,
            sess: &sess,
            before: &before,
        },
        &exit,
        handoff_text,
    )
    .await?;
    Ok(AgentRan {
        handoff,
        environment,
        fleet,
        ..ended(exit, None, None)
    })
}

/// Starts the attempt's model proxy with what it may spend (`used` by the
/// component, `before` by its earlier tries); an adopted try's proxy admits
/// the token its agent holds.
async fn start_session(
    cx: &AttemptCtx,
    attempt: u32,
    model: &fvd_spec::agent_model::ModelSpec,
    used: &Spent,
    before: &fvd_store::usage::AttemptUsage,
    adopting: Option<&fvd_store::FleetTry>,
) -> Result<fvd_workspace::session::Session, fvd_workspace::session::Environment> {
    use fvd_workspace::session::{self, Session};
    let this_attempt = fvd_store::usage::Spend {
        tokens: before.total_tokens(),
        usd: before.cost_usd.unwrap_or(0.0),
    };
    let token = adopting
        .and_then(|t| fvd_workspace::session::AttemptToken::from_digest_hex(&t.proxy_token_sha256));
    Session::start(
        &cx.lp.agent,
        model,
        allowance(&model.budget, used, this_attempt),
        format!("{}/{}/{attempt}", cx.family, cx.spec.name),
        session::default_retry(),
        token,
    )
    .await
}

/// The command of an agent behind the proxy `sess`: a preset's CLI with
/// its configuration (written into the attempt's folder here, carried to a
/// worker on the fleet, where the worker's end of the tunnel is the
/// proxy), or a raw command with the proxy's variables. Its argv, stdin
/// and the preset's files.
fn proxied_command(
    cx: &AttemptCtx,
    sess: &fvd_workspace::session::Session,
    files: &AttemptFiles,
    argv: Vec<String>,
    extra: &mut Vec<(String, String)>,
    mcp: Option<&fvd_workspace::preset::Mcp>,
) -> Result<ProxiedCommand, ActorProcessingErr> {
    use fvd_workspace::session;
    let a = &cx.lp.agent;
    let fleet = cx.fleet().is_some();
    // A worker reaches the proxy by its own loopback end of a tunnel.
    let on_worker = |v: String| {
        if fleet {
            v.replace(&sess.proxy().origin(), PROXY_URL)
        } else {
            v
        }
    };
    let packet = || {
        std::fs::read_to_string(&files.prompt)
            .map_err(|e| format!("cannot read {}: {e}", files.prompt))
    };
    Ok(match a.preset {
        Some(p) if fleet => {
            let base_url = on_worker(sess.proxy().base_url());
            // Workers start jobs in their jail by default.
            let plan = session::plan(
                sess,
                a,
                p,
                &packet()?,
                session::Place {
                    dir: Path::new(ATTEMPT_DIR),
                    jailed: true,
                    mcp,
                },
                &base_url,
            );
            extra.extend(plan.launch.env);
            (plan.launch.argv, Some(plan.launch.stdin), plan.files)
        }
        Some(p) => {
            let jailed = cx.agents.jail.mechanism().is_some();
            let mut l = session::launch(
                sess,
                a,
                p,
                &packet()?,
                session::Place {
                    dir: &files.dir,
                    jailed,
                    mcp,
                },
            )
            .map_err(|e| format!("cannot write the {} configuration: {e}", p.name()))?;
            // Found as `fvd agents check` finds it: FVD_AGENT_CLI_DIR, then PATH.
            if let Some(found) =
                fvd_workspace::preset::find_program(p, std::env::var_os("PATH").as_deref())
            {
                l.argv[0] = found.display().to_string();
            }
            extra.extend(l.env);
            (l.argv, Some(l.stdin), Vec::new())
        }
        None => {
            extra.extend(sess.raw_env().into_iter().map(|(k, v)| (k, on_worker(v))));
            (argv, None, Vec::new())
        }
    })
}

/// A proxied agent's argv, stdin and configuration files.
type ProxiedCommand = (Vec<String>, Option<Vec<u8>>, Vec<(String, String)>);

/// Writes the proxy's meter into the ledger as it moves, while the agent
/// runs (`before`: what the attempt's earlier tries used).
fn usage_writer(
    cx: &AttemptCtx,
    sess: &std::sync::Arc<fvd_workspace::session::Session>,
    attempt: u32,
    before: &fvd_store::usage::AttemptUsage,
) -> tokio::task::JoinHandle<()> {
    let (s, store) = (sess.clone(), cx.store.clone());
    let (f, c, b) = (cx.family.clone(), cx.spec.name.clone(), before.clone());
    fvd_telemetry::spawn(async move {
        let mut updates = s.proxy().usage_updates();
        while updates.changed().await.is_ok() {
            let mut u = s.usage_now();
            u.add_counts(&b);
            if let Err(e) = store.record_usage(&f, &c, attempt, &u).await {
                tracing::warn!(error = %e, "agent usage could not be written");
            }
        }
    })
}

/// What a proxied run's end is read with.
struct Metered<'a> {
    attempt: u32,
    model: &'a fvd_spec::agent_model::ModelSpec,
    span: &'a Span,
    program: &'a str,
    sess: &'a fvd_workspace::session::Session,
    before: &'a fvd_store::usage::AttemptUsage,
}

/// A proxied agent ended: its handoff (from the CLI's report, the handoff
/// file or its output, redacted), its usage recorded with its span and
/// metrics, and whether the proxy saw its environment end it.
async fn metered_end(
    cx: &AttemptCtx,
    m: Metered<'_>,
    exit: &agent::AgentExit,
    handoff_text: Option<String>,
) -> Result<
    (
        agent::HandoffRead,
        Option<fvd_workspace::session::Environment>,
    ),
    ActorProcessingErr,
> {
    let (family, spec, a) = (&cx.family, &cx.spec, &cx.lp.agent);
    let Metered {
        attempt,
        model,
        span,
        program,
        sess,
        before,
    } = m;
    let report = a
        .preset
        .map(|p| fvd_workspace::preset::report(p, &exit.stdout));
    // The agent never held the key; its handoff is redacted of it anyway,
    // with the values of the variables its spec passes.
    let mut names = a.env.clone();
    names.push(model.key_env.clone());
    let handoff_text = handoff_text.map(|t| cx.agents.redactor(&names).text(&t));
    let final_text = report
        .as_ref()
        .and_then(|r| r.result.clone())
        .unwrap_or_else(|| exit.stdout.clone());
    let mut handoff = agent::read_handoff_for(
        spec,
        report
            .as_ref()
            .and_then(|r| r.structured_handoff.as_deref()),
        handoff_text.as_deref(),
        &final_text,
    );
    if let Some(e) = &exit.spawn_error {
        handoff.summary = format!("{e} (is {program} installed and on PATH?)");
    }
    let (mut usage, environment) = sess.finish(exit, report.as_ref(), &handoff);
    usage.add_counts(before);
    cx.store
        .record_usage(family, &spec.name, attempt, &usage)
        .await?;
    let outcome = agent::exit_text(exit.exit_code, exit.signal, exit.timed_out);
    span.record("fvd.outcome", usage.outcome.as_str());
    if let Some(c) = exit.exit_code {
        span.record("fvd.exit_code", c);
    }
    spans::agent_usage(
        span,
        &spans::AgentUsage {
            provider: provider_name(model.api),
            model: &usage.model,
            input_tokens: usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens,
            output_tokens: usage.output_tokens,
            cost_usd: usage.cost_usd,
            requests: usage.requests,
        },
    );
    metrics::agent_usage(
        family,
        &spec.name,
        &usage.model,
        [
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
            ("cache_read", usage.cache_read_tokens),
            ("cache_write", usage.cache_write_tokens),
        ],
        usage.cost_usd.unwrap_or(0.0) - before.cost_usd.unwrap_or(0.0),
    );
    tracing::info!(%family, component = %spec.name, attempt, %outcome, model_outcome = %usage.outcome, requests = usage.requests, cost_usd = ?usage.cost_usd, "agent attempt ended");
    Ok((handoff, environment))
}

/// Starts the attempt's tools (`attempt_tools`), their `run_parity` held
/// to what the GPU-second budget has left after `used`; `None`, with a
/// warning, when they cannot listen (the agent runs without them).
async fn start_tools(
    cx: &AttemptCtx,
    attempt: u32,
    head_before: &str,
    span: &Span,
    used: &Spent,
    token: Option<fvd_workspace::session::AttemptToken>,
) -> Option<super::tools::ToolsServer> {
    let spec = &cx.spec;
    let (a, lp) = (&cx.lp.agent, &cx.lp);
    let gpu_left_ms = a
        .max_gpu_s
        .map(|max| max.saturating_mul(1000).saturating_sub(used.gpu_ms));
    let ctx = super::tools::ToolsContext {
        family: cx.family.clone(),
        component: spec.name.clone(),
        attempt,
        spec: spec.clone(),
        repo: cx.repo.clone(),
        code_prefix: lp.worktree.prefix.clone(),
        base: head_before.to_string(),
        fvd_writes: cx.code.fvd_writes.clone(),
        store: cx.store.clone(),
        scheduler: cx.scheduler.clone(),
        registry: cx.agents.registry.clone(),
        span: span.clone(),
        secrets: cx.agents.redactor(&a.env),
        asked: Default::default(),
        limits: cx.agents.limits,
        gpu_budget: super::tools::GpuBudget::new(gpu_left_ms),
    };
    match super::tools::start(ctx, token).await {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(error = %e, "the attempt's tools cannot listen; the agent runs without them");
            None
        }
    }
}

/// How the agent's CLI starts `fvd mcp` for this attempt: the variables
/// that scope it (the tools' address, the attempt's base; not the token,
/// which `fvd mcp` finds in the agent's environment), with the address and
/// the program left for a worker to fill in.
fn tools_mcp(
    cx: &AttemptCtx,
    tools: &super::tools::ToolsServer,
    head_before: &str,
) -> fvd_workspace::preset::Mcp {
    let fleet = cx.fleet().is_some();
    let program = if fleet {
        FVD_PROGRAM.to_string()
    } else {
        std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "fvd".into())
    };
    let addr = if fleet {
        TOOLS_ADDR.to_string()
    } else {
        tools.addr.to_string()
    };
    fvd_workspace::preset::Mcp {
        program: program.clone(),
        env: vec![
            ("FVD_TOOLS_ADDR".into(), addr),
            ("FVD_ATTEMPT_BASE".into(), head_before.to_string()),
            ("FVD_BIN".into(), program),
        ],
    }
}

/// Runs the attempt's agent: on this host in the component's worktree, or
/// (`--agents fleet`) as a fleet job on a worker, which sends back its
/// commit. `stop` ends it early (its model proxy tripped).
async fn run_where(
    cx: &AttemptCtx,
    attempt: u32,
    files: &AttemptFiles,
    head_before: &str,
    launch: AgentLaunch<'_>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<AgentRun, ActorProcessingErr> {
    match cx.fleet() {
        None => Ok(on_host(cx, files, launch, stop).await),
        Some(attempts) => on_fleet(cx, attempts, attempt, files, head_before, launch, stop).await,
    }
}

/// Runs the agent on this host, jailed, in the component's worktree.
async fn on_host(
    cx: &AttemptCtx,
    files: &AttemptFiles,
    launch: AgentLaunch<'_>,
    stop: impl std::future::Future<Output = ()>,
) -> AgentRun {
    let (a, lp) = (&cx.lp.agent, &cx.lp);
    // The agent writes its worktree and its attempt's files, nothing
    // else of the repository: not the main checkout, not `.fvd/` (the
    // state database, other components' worktrees) (issue #39).
    let repo = Path::new(&cx.repo);
    let depth = cx.code.prefix.split('/').filter(|c| !c.is_empty()).count();
    let top = repo.ancestors().nth(depth).unwrap_or(repo);
    let mut policy = cx.agents.clone();
    policy.jail = policy
        .jail
        .read_only(&[top.to_path_buf(), repo.to_path_buf()])
        .writable(&[lp.worktree.path.clone(), files.dir.clone()]);
    let exit = agent::run_with(
        &launch.argv,
        agent::RunAgent {
            cwd: &lp.worktree.workdir(),
            env_names: &a.env,
            extra: &launch.extra,
            timeout: a.timeout,
            log_dir: &files.dir,
            policy: &policy,
        },
        launch.stdin,
        stop,
    )
    .await;
    AgentRun {
        exit,
        handoff_text: std::fs::read_to_string(&files.handoff).ok(),
        fleet: None,
        environment: None,
        not_adopted: None,
    }
}

/// Runs the agent as a fleet job on a worker that has its CLI: the worker
/// sends back its commit as a pack, which the attempt takes in.
async fn on_fleet(
    cx: &AttemptCtx,
    attempts: &agent::FleetAttempts,
    attempt: u32,
    files: &AttemptFiles,
    head_before: &str,
    launch: AgentLaunch<'_>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<AgentRun, ActorProcessingErr> {
    let (family, spec) = (&cx.family, &cx.spec);
    let (a, lp) = (&cx.lp.agent, &cx.lp);
    let packet = std::fs::read_to_string(&files.prompt)
        .map_err(|e| format!("cannot read {}: {e}", files.prompt))?;
    let mut placement = spec.placement.clone();
    if let Some(p) = a.preset {
        // Only a worker that has the CLI takes the attempt.
        placement
            .labels
            .insert(format!("{}{}", AGENT_LABEL_PREFIX, p.name()), "yes".into());
    }
    let job_id = match launch.adopt {
        Some(t) => t.job_id.clone(),
        None => {
            let job_id = format!("{family}/{}/agent-{attempt}-{}", spec.name, now_ms());
            // Kept with the attempt before it is queued: its lease is then
            // written with it, and a restarted orchestrator adopts it.
            cx.store
                .set_fleet_try(
                    family,
                    &spec.name,
                    attempt,
                    &fvd_store::FleetTry {
                        job_id: job_id.clone(),
                        proxy_token_sha256: launch.proxy_token.clone(),
                        tools_token_sha256: launch.tools_token.clone(),
                    },
                )
                .await?;
            job_id
        }
    };
    let job = super::fleet::FleetAttemptJob {
        job_id,
        family: family.clone(),
        component: spec.name.clone(),
        attempt,
        argv: launch.argv,
        env: launch.extra.into_iter().collect(),
        secret_env: a.env.clone(),
        placement,
        gpus: a.gpus(spec.gpus),
        timeout_ms: u64::try_from(a.timeout.as_millis()).unwrap_or(u64::MAX),
        base: head_before.to_string(),
        code_prefix: lp.worktree.prefix.clone(),
        repo: PathBuf::from(&cx.repo),
        proxy: launch.proxy,
        tools: launch.tools,
        agent: fvd_store::messages::AgentJob {
            packet,
            packet_on_stdin: launch.stdin.is_some(),
            files: launch.files,
            proxied: launch.proxy.is_some(),
            tools: launch.tools.is_some(),
            commit_message: format!("fvd: {} attempt {attempt}", spec.name),
        },
        span: launch.span.clone(),
        adopt: launch.adopt.is_some(),
    };
    let (end, stopped) = super::fleet::run(&cx.scheduler, attempts, job, stop).await?;
    let (report, worker_id) = match end {
        super::fleet::FleetEnd::Finished { report, worker_id } => (report, worker_id),
        super::fleet::FleetEnd::Lost(why) => {
            return Ok(AgentRun {
                exit: agent::AgentExit {
                    stopped,
                    ..Default::default()
                },
                handoff_text: None,
                fleet: None,
                environment: Some(format!("the attempt ran on no worker: {why}")),
                not_adopted: None,
            });
        }
        super::fleet::FleetEnd::NotAdopted(why) => {
            return Ok(AgentRun {
                exit: agent::AgentExit::default(),
                handoff_text: None,
                fleet: None,
                environment: None,
                not_adopted: Some(why),
            });
        }
    };
    let exit = super::fleet::exit_of(&report, stopped);
    // The record of the run, as a host run leaves it beside the packet.
    let _ = std::fs::write(files.dir.join("agent.stdout"), &exit.stdout);
    let _ = std::fs::write(files.dir.join("worker"), &worker_id);
    match super::fleet::outcome_of(&report) {
        Ok(out) => Ok(AgentRun {
            handoff_text: (!out.handoff.is_empty()).then(|| out.handoff.clone()),
            fleet: Some(FleetCommit {
                sha: out.commit.clone(),
                pack: out.pack.clone(),
                worker_id,
                refused: (!out.refused.is_empty()).then(|| out.refused.clone()),
            }),
            exit,
            environment: None,
            not_adopted: None,
        }),
        Err(why) => Ok(AgentRun {
            exit,
            handoff_text: None,
            fleet: None,
            environment: Some(format!("worker {worker_id}: {why}")),
            not_adopted: None,
        }),
    }
}

/// The label a worker carries for each agent CLI it has
/// (`fvd.agent.claude-code = "yes"`): an attempt of a preset goes only to
/// a worker that has its CLI.
pub const AGENT_LABEL_PREFIX: &str = "fvd.agent.";

/// The GenAI semantic conventions' provider name of an API.
fn provider_name(api: fvd_spec::agent_model::ModelApi) -> &'static str {
    use fvd_spec::agent_model::ModelApi;
    match api {
        ModelApi::Anthropic => "anthropic",
        ModelApi::OpenAiChat | ModelApi::OpenAiResponses => "openai",
        ModelApi::Gemini => "gcp.gemini",
    }
}
