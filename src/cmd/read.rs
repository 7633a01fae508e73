//! The read commands: `fvd status`, `logs`, `attempts`, `workers` and
//! `queue`. Each opens one [`Source`] (an orchestrator or the embedded
//! state) and renders the domain views it returns; none of them writes.

use std::io::Write;

use clap::Args;
use fvd_orchestrator::query::{Fleet, Queue};
use fvd_store::EscapeRow;
use fvd_store::dashboard::RunRow;
use fvd_store::model::JobState;
use fvd_store::states::{AttemptState, EscapeAbout, EscapeStatus};

use super::exit::Exit;
use super::render::{self, Shown, run_exit, say};
use super::server::runtime;
use super::source::{Source, Target};

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// One family, or every port when absent.
    pub family: Option<String>,
    /// Print the ports as JSON (one object for one family, else a list).
    #[arg(long)]
    pub json: bool,
    /// Exit non-zero unless every port shown is running or passed, as
    /// `git diff --exit-code` does: 1 blocked, failed or cancelled, 3
    /// waiting for an answer, 4 waiting for an environment (the worst
    /// first, in that order).
    #[arg(long)]
    pub exit_status: bool,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The port's family.
    pub family: String,
    /// The component whose run to show.
    pub component: String,
    /// Run number (1-based); without it the latest run that started.
    #[arg(long, value_name = "N")]
    pub run: Option<u32>,
    /// Keep streaming until the run ends, then exit with what it found: 0
    /// a pass, 1 a red, skipped or cut-off run, 4 a run that failed on its
    /// environment.
    #[arg(long)]
    pub follow: bool,
    /// Print one JSON object per line: the run first (`"run"`), then each
    /// chunk of output (`"stream"`: stdout or stderr, `"text"`), then the
    /// run again as it ended (`"end"`).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Debug, Args)]
pub struct AttemptsArgs {
    /// The port's family.
    pub family: String,
    /// The component whose agent attempts to show.
    pub component: String,
    /// Every recorded field, diffs and handoff blocks included.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Debug, Args)]
pub struct WorkersArgs {
    /// Print the fleet as one JSON object.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Debug, Args)]
pub struct QueueArgs {
    /// One port's queue, or every port's when absent.
    pub family: Option<String>,
    /// Print the queue as one JSON object.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

/// The families an embedded state records as running while no fvd process
/// runs them (an interrupted `fvd submit`); none for an orchestrator.
fn interrupted(source: &Source, ports: &[fvd_orchestrator::query::PortSnapshot]) -> Vec<bool> {
    ports
        .iter()
        .map(|p| match source.local_repo() {
            Some(repo) => {
                p.state == fvd_store::model::PortState::Running
                    && super::embedded::live(repo, &p.family).is_none()
            }
            None => false,
        })
        .collect()
}

/// Why a family has no port in the embedded state, when it never had a
/// spec: its `port.toml` (named) does not exist, and `fvd init` writes it.
/// `None` for a fleet, or where the spec exists (the error said enough).
fn never_initialised(target: &Target, family: &str) -> Option<String> {
    if target.orchestrator.is_some() {
        return None;
    }
    let repo = target.repo_of(Some(family));
    let dir = repo.join("tests/local_tests").join(family);
    let spec = dir.join("port.toml");
    if spec.is_file() {
        return None;
    }
    let init = target.hint(&repo, &["init", "--family", family]);
    let submit = target.hint(&repo, &["submit", "--family", family]);
    Some(if dir.is_dir() {
        format!(
            "no port of family {family}: {} does not exist; `{init}` writes it, then `{submit}` starts the port",
            spec.display()
        )
    } else {
        format!(
            "no port of family {family}: {} does not exist (no folder {}); a new port starts with `{init}` once that folder holds PORT_STATUS.md or its parity tests",
            spec.display(),
            dir.display()
        )
    })
}

/// `r`, or for a family that was never initialised, the error that names
/// its missing `port.toml` and `fvd init`.
fn or_uninitialised<T>(
    r: anyhow::Result<T>,
    target: &Target,
    family: Option<&str>,
) -> anyhow::Result<T> {
    match (r, family) {
        (Err(e), Some(f)) => match never_initialised(target, f) {
            Some(why) => Err(anyhow::anyhow!(why)),
            None => Err(e),
        },
        (r, _) => r,
    }
}

pub fn status(args: StatusArgs) -> anyhow::Result<Exit> {
    let family = args.family.clone();
    let target = args.target.clone();
    or_uninitialised(status_of(args), &target, family.as_deref())
}

fn status_of(args: StatusArgs) -> anyhow::Result<Exit> {
    runtime()?.block_on(async move {
        let mut source = Source::open(&args.target, args.family.as_deref()).await?;
        let ports = source.status(args.family.as_deref()).await?;
        let stopped = interrupted(&source, &ports);
        let shown: Vec<Shown<'_>> = ports
            .iter()
            .zip(&stopped)
            .map(|(snap, i)| Shown {
                snap,
                interrupted: *i,
            })
            .collect();
        if args.json {
            let v: Vec<serde_json::Value> = shown
                .iter()
                .map(|s| render::snapshot_json(*s, &args.target))
                .collect();
            let out = if args.family.is_some() && v.len() == 1 {
                v.into_iter().next().expect("one port")
            } else {
                serde_json::Value::Array(v)
            };
            println!("{}", serde_json::to_string_pretty(&out)?);
        } else {
            for s in &shown {
                render::print_snapshot(*s, &args.target);
            }
        }
        Ok(if args.exit_status {
            render::exit_status(&ports)
        } else {
            Exit::Success
        })
    })
}

fn run_json(r: &RunRow) -> serde_json::Value {
    serde_json::json!({
        "job_id": r.job_id,
        "family": r.family,
        "component": r.component,
        "run_no": r.run_no,
        "state": r.state.as_str(),
        "worker_id": r.worker_id,
        "gpus": r.gpus,
        "verdict": r.verdict,
        "reason": r.reason,
        "exit_code": r.exit_code,
        "duration_ms": r.duration_ms,
        "queued_ms": r.queued_ms,
        "started_ms": r.started_ms,
        "finished_ms": r.finished_ms,
        "commit": r.commit,
        "peak_gpu_mib": r.peak_gpu_mib,
    })
}

pub fn logs(args: LogsArgs) -> anyhow::Result<Exit> {
    runtime()?.block_on(async move {
        let opened = async {
            let mut source = Source::open(&args.target, Some(&args.family)).await?;
            let runs = source.runs(&args.family, Some(&args.component)).await?;
            anyhow::Ok((source, runs))
        };
        let (mut source, runs) = or_uninitialised(opened.await, &args.target, Some(&args.family))?;
        let repo = args.target.repo_of(Some(&args.family));
        let Some(run) = fvd_orchestrator::query::pick_run(&runs, args.run) else {
            anyhow::bail!(
                "no run {} of component {} in port {}",
                args.run.map_or("at all".to_string(), |n| n.to_string()),
                args.component,
                args.family
            );
        };
        if args.run.is_none()
            && let Some(latest) = runs.last()
            && latest.run_no != run.run_no
        {
            eprintln!(
                "fvd: run {} is {}; showing run {}",
                latest.run_no, latest.state, run.run_no
            );
        }
        let mut out = std::io::stdout().lock();
        if args.json {
            writeln!(out, "{}", serde_json::json!({ "run": run_json(&run) }))?;
        }
        let mut chunks = source.output(&run, args.follow).await?;
        let mut wrote = 0;
        while let Some(chunk) = chunks.recv().await {
            let (stream, data) = chunk?;
            wrote += data.len();
            if args.json {
                let v = serde_json::json!({
                    "stream": if stream == 2 { "stderr" } else { "stdout" },
                    "text": String::from_utf8_lossy(&data),
                });
                writeln!(out, "{v}")?;
            } else {
                out.write_all(&data)?;
            }
            out.flush()?;
        }
        // What the run came to, now that its output is all out.
        let ended = source
            .runs(&args.family, Some(&args.component))
            .await?
            .into_iter()
            .find(|r| r.job_id == run.job_id)
            .unwrap_or(run);
        if args.json {
            writeln!(out, "{}", serde_json::json!({ "end": run_json(&ended) }))?;
        }
        out.flush()?;
        if wrote == 0 && !args.json {
            eprintln!("fvd: {}", no_output(&args.target, &repo, &ended, &runs));
        }
        if !args.follow {
            return Ok(Exit::Success);
        }
        // Followed to its end: the run's own outcome.
        Ok(run_exit(&ended).unwrap_or(Exit::Success))
    })
}

/// Why run `job` of a component printed nothing, and which run has output.
fn no_output(target: &Target, repo: &std::path::Path, job: &RunRow, runs: &[RunRow]) -> String {
    let why = match job.state {
        JobState::Environment => format!(
            "it failed on its environment{}: {}",
            if job.worker_id.is_empty() {
                String::new()
            } else {
                format!(" on worker {}", job.worker_id)
            },
            job.reason
        ),
        JobState::SharedOom => format!(
            "it ran out of GPU memory beside another run and ran again alone: {}",
            job.reason
        ),
        JobState::Queued => "it has not started".to_string(),
        JobState::Running => format!(
            "it has printed nothing yet (`{}` follows it)",
            target.hint(
                repo,
                &[
                    "logs",
                    &job.family,
                    &job.component,
                    "--run",
                    &job.run_no.to_string(),
                    "--follow"
                ]
            )
        ),
        JobState::Unplaced => format!("no worker could take it: {}", job.reason),
        JobState::Abandoned => "it was in flight when its port stopped".to_string(),
        JobState::Finished => "it printed nothing".to_string(),
    };
    let with_output = runs
        .iter()
        .rev()
        .find(|r| r.job_id != job.job_id && r.has_output);
    let other = match with_output {
        Some(r) => format!(
            "; run {} has output: `{}`",
            r.run_no,
            target.hint(
                repo,
                &[
                    "logs",
                    &r.family,
                    &r.component,
                    "--run",
                    &r.run_no.to_string()
                ]
            )
        ),
        None => String::new(),
    };
    format!(
        "run {} of {} {} has no output: {why}{other}",
        job.run_no, job.family, job.component
    )
}

/// `fvd attempts`: the agent-attempt ledger of a component.
pub fn attempts(args: AttemptsArgs) -> anyhow::Result<Exit> {
    runtime()?.block_on(async move {
        let opened = async {
            let mut source = Source::open(&args.target, Some(&args.family)).await?;
            let ledger = source.attempts(&args.family, &args.component).await?;
            anyhow::Ok((source, ledger))
        };
        let (mut source, (worktree, ledger)) =
            or_uninitialised(opened.await, &args.target, Some(&args.family))?;
        // The judge questions of the component: each attempt that changed
        // its judge shows what a person made of the change.
        let judged: Vec<EscapeRow> = source
            .status(Some(&args.family))
            .await?
            .into_iter()
            .flat_map(|p| p.escapes)
            .filter(|e| e.component == args.component && e.about == EscapeAbout::Judge)
            .collect();
        let mut out = std::io::stdout().lock();
        if args.json {
            let v = serde_json::json!({
                "family": args.family,
                "component": args.component,
                "worktree": worktree.as_ref().map(|w| serde_json::json!({
                    "path": w.path,
                    "branch": w.branch,
                    "base_commit": w.base_commit,
                })),
                "attempts": ledger,
                "judge_questions": judged,
            });
            writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
            return Ok(Exit::Success);
        }
        match &worktree {
            Some(w) => writeln!(
                out,
                "{} / {}: {} attempt(s) on branch {} from {} ({})",
                args.family,
                args.component,
                ledger.len(),
                w.branch,
                &w.base_commit[..w.base_commit.len().min(12)],
                w.path.display()
            )?,
            None => writeln!(
                out,
                "{} / {}: no agent worktree (the component has no [agent], or it never started)",
                args.family, args.component
            )?,
        }
        for a in &ledger {
            write_attempt(&mut out, a, &judged)?;
        }
        let used: Vec<_> = ledger.iter().filter_map(|a| a.usage.as_ref()).collect();
        if !used.is_empty() {
            let tokens: u64 = used.iter().map(|u| u.total_tokens()).sum();
            let usd: f64 = used.iter().filter_map(|u| u.cost_usd).sum();
            writeln!(
                out,
                "total: {tokens} tokens, ${usd:.4} over {} attempt(s)",
                used.len()
            )?;
        }
        Ok(Exit::Success)
    })
}

/// One attempt of the ledger as `fvd attempts` lists it: its commit, the
/// agent's exit and the verdicts, the handoff, the model's use, notes, a
/// judge change and what a person made of it (`judged`), the diff stat.
fn write_attempt(
    out: &mut impl Write,
    a: &fvd_store::AttemptRow,
    judged: &[EscapeRow],
) -> std::io::Result<()> {
    writeln!(
        out,
        "attempt {}  commit {}  agent {} in {:.1}s  verdict {} -> {}",
        a.attempt,
        &a.commit_sha[..a.commit_sha.len().min(12)],
        fvd_workspace::agent::exit_text(a.exit_code, a.signal, a.timed_out),
        a.duration_ms as f64 / 1000.0,
        a.verdict_before,
        if a.state == AttemptState::Running {
            "(agent running or cut off)"
        } else if a.handoff_summary.contains("next_step=ask_user") {
            "(asked the user)"
        } else if a.verdict_after.is_none() {
            "(not run yet)"
        } else {
            a.verdict_after.as_str()
        },
    )?;
    writeln!(out, "  handoff {}: {}", a.handoff_status, a.handoff_summary)?;
    if let Some(u) = &a.usage {
        writeln!(out, "  model: {}", render::usage_line(u))?;
        for d in &u.permission_denials {
            writeln!(out, "  permission denied: {d}")?;
        }
    }
    if a.state == AttemptState::Environment {
        writeln!(
            out,
            "  ended by its environment (not counted; runs again when the port resumes)"
        )?;
    }
    let mut notes = vec![format!("{} turn", a.kind)];
    if a.gpu_ms_after > 0 {
        notes.push(format!(
            "{:.1} GPU-s in its run",
            a.gpu_ms_after as f64 / 1000.0
        ));
    }
    if a.tries > 1 {
        notes.push(format!("run {} times (cut off by a restart)", a.tries));
    }
    if !a.worker_id.is_empty() {
        notes.push(format!("ran on worker {}", a.worker_id));
    }
    writeln!(out, "  {}", notes.join("; "))?;
    if !a.judge_changed.is_empty() {
        writeln!(
            out,
            "  changed the judge, not counted (its run used the port's own): {}",
            a.judge_changed.join(", ")
        )?;
        let decided = judged
            .iter()
            .rev()
            .find(|e| e.attempt == a.attempt && e.status != EscapeStatus::Withdrawn);
        writeln!(out, "  judge change: {}", render::judge_decision(decided))?;
    }
    if a.diff_stat.is_empty() {
        writeln!(out, "  no changes")?;
    }
    for line in a.diff_stat.lines() {
        writeln!(out, "  {line}")?;
    }
    Ok(())
}

/// GPU indices as `0,1` (`-` for none).
fn indices(g: &[u32]) -> String {
    if g.is_empty() {
        "-".into()
    } else {
        g.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
    }
}

/// `fvd workers`: the fleet, one worker a line with its leases below it.
pub fn workers(args: WorkersArgs) -> anyhow::Result<Exit> {
    runtime()?.block_on(async move {
        let mut source = Source::open(&args.target, None).await?;
        let fleet = source.fleet().await?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&fleet)?);
            return Ok(Exit::Success);
        }
        print_fleet(&fleet);
        Ok(Exit::Success)
    })
}

fn print_fleet(fleet: &Fleet) {
    if !fleet.live {
        say(format_args!(
            "workers of this state whose process still runs (no orchestrator answered: free slots unknown; ended ones are on the dashboard's /workers)"
        ));
    }
    if fleet.workers.is_empty() {
        say(format_args!("no worker is connected"));
    }
    for w in &fleet.workers {
        let gpus = if w.gpus.is_empty() {
            "no GPU".to_string()
        } else {
            let names: Vec<String> = w
                .gpus
                .iter()
                .map(|g| format!("{} {} ({} MiB)", g.index, g.name, g.memory_mib))
                .collect();
            names.join(", ")
        };
        let free = match (&w.free_gpus, w.free_cpu) {
            (Some(g), Some(c)) => {
                format!("; free: GPUs {}, CPU slots {c}/{}", indices(g), w.cpu_slots)
            }
            _ => format!("; CPU slots {}", w.cpu_slots),
        };
        let mut extra = String::new();
        if !w.labels.is_empty() {
            let l: Vec<String> = w.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            extra.push_str(&format!("; labels {}", l.join(",")));
        }
        if !w.provides.is_empty() {
            extra.push_str(&format!("; provides {}", w.provides.join(", ")));
        }
        if w.draining {
            extra.push_str("; draining");
        }
        say(format_args!(
            "{} on {}: {gpus}{free}{extra}",
            w.worker_id,
            if w.host.is_empty() { "?" } else { &w.host }
        ));
        for line in gpu_use(w) {
            say(format_args!("{line}"));
        }
        for j in &w.jobs {
            say(format_args!(
                "  {} run {} of {} {} (epoch {}, GPUs {})",
                j.job_id,
                j.run_no,
                j.family,
                j.component,
                j.lease_epoch,
                indices(&j.gpus)
            ));
        }
    }
}

/// One line per GPU of `w` with runs on it ([`fvd_orchestrator::query::GpuUse`]).
fn gpu_use(w: &fvd_orchestrator::query::Worker) -> Vec<String> {
    w.gpu_use().iter().map(|u| format!("  {u}")).collect()
}

/// `fvd queue`: the runs waiting for a lease and why.
pub fn queue(args: QueueArgs) -> anyhow::Result<Exit> {
    runtime()?.block_on(async move {
        let mut source = Source::open(&args.target, args.family.as_deref()).await?;
        let queue = source.queue(args.family.as_deref()).await?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&queue)?);
            return Ok(Exit::Success);
        }
        print_queue(&queue);
        Ok(Exit::Success)
    })
}

fn print_queue(q: &Queue) {
    if q.jobs.is_empty() {
        say(format_args!("no run is waiting for a worker"));
        return;
    }
    if q.workers == Some(0) {
        say(format_args!(
            "no worker is connected: every run below waits for one"
        ));
    }
    for j in &q.jobs {
        let why = if j.waiting.is_empty() {
            String::new()
        } else {
            format!("; {}", j.waiting)
        };
        say(format_args!(
            "{} run {} of {} {}: needs {}{why}",
            j.job_id,
            j.run_no,
            j.family,
            j.component,
            j.needs.describe()
        ));
    }
}
