//! `fvd gc`: removes the agent worktrees (`REPO/.fvd/worktrees/F/C`) and
//! branches (`fvd/F/C`) that no port needs any more, by the rules of
//! [`fvd_workspace::gc`], reading the ports from the embedded state or
//! from `--orchestrator`.

use std::collections::HashMap;

use anyhow::Context as _;
use clap::Args;
use fvd_store::model::{ComponentStatus, PortState};
use fvd_workspace::gc::{self, Fact, Fate};

use super::exit::Exit;
use super::render::say;
use super::server::runtime;
use super::source::{Source, Target};

#[derive(Debug, Args)]
pub struct GcArgs {
    /// Say what would be removed and how much it frees; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// After the rules, remove worktrees of finished components (largest
    /// first, their branches kept) until the worktrees that stay take at
    /// most this many GiB together.
    #[arg(long, value_name = "GIB", value_parser = non_negative)]
    pub max_worktrees_gib: Option<f64>,
    /// Print one JSON object per worktree or branch instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a non-negative number of GiB")),
    }
}

/// What the state says of each port: whether it runs (or waits on an
/// answer or an environment), and each component's finality.
type Ports = HashMap<String, (bool, HashMap<String, bool>)>;

fn fact_of(ports: &Ports, family: &str, component: &str) -> Fact {
    match ports.get(family) {
        None => Fact::NoPort,
        Some((true, _)) => Fact::Running,
        Some((false, comps)) => match comps.get(component) {
            None => Fact::NoComponent,
            Some(finished) => Fact::Stopped {
                finished: *finished,
            },
        },
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

pub fn run(args: GcArgs) -> anyhow::Result<Exit> {
    runtime()?.block_on(async move {
        let t = &args.target;
        let mut source = Source::open(t, None).await?;
        let repo = match source.local_repo() {
            Some(r) => r.to_path_buf(),
            None => t
                .repo
                .canonicalize()
                .with_context(|| format!("repository {}", t.repo.display()))?,
        };
        let ports: Ports = source
            .status(None)
            .await?
            .into_iter()
            .map(|p| {
                let running = matches!(
                    p.state,
                    PortState::Running | PortState::AskUser | PortState::Environment
                );
                let comps = p
                    .components
                    .iter()
                    .map(|c| {
                        let finished = matches!(
                            c.status,
                            ComponentStatus::NonSkipPass | ComponentStatus::Blocked
                        );
                        (c.name.clone(), finished)
                    })
                    .collect();
                (p.family, (running, comps))
            })
            .collect();
        let candidates = gc::inventory(&repo).await?;
        let max = args
            .max_worktrees_gib
            .map(|g| (g * 1024.0 * 1024.0 * 1024.0) as u64);
        let fates = gc::plan(&candidates, |f, c| fact_of(&ports, f, c), max);
        let (mut freed, mut worktrees, mut branches, mut kept) = (0u64, 0, 0, 0);
        for (c, fate) in candidates.iter().zip(&fates) {
            let name = format!("{}/{}", c.family, c.component);
            let head = c.branch.as_ref().map(|(_, sha)| sha.as_str());
            match fate {
                Fate::Keep(why) => {
                    kept += 1;
                    if args.json {
                        println!(
                            "{}",
                            serde_json::json!({"component": name, "action": "keep", "why": why.to_string(), "bytes": c.bytes, "head": head})
                        );
                    } else {
                        say(format_args!("kept {name}: {why}"));
                    }
                }
                Fate::Remove { why, branch } => {
                    let branch = *branch && c.branch.is_some();
                    if !args.dry_run {
                        freed += gc::apply(&repo, c, branch).await?;
                    } else {
                        freed += c.worktree.as_ref().map_or(0, |_| c.bytes);
                    }
                    worktrees += usize::from(c.worktree.is_some());
                    branches += usize::from(branch);
                    let what = match (c.worktree.is_some(), branch) {
                        (true, true) => "worktree and branch",
                        (true, false) => "worktree (branch kept)",
                        (false, _) => "branch",
                    };
                    if args.json {
                        println!(
                            "{}",
                            serde_json::json!({"component": name, "action": if args.dry_run { "would_remove" } else { "removed" }, "what": what, "why": why.to_string(), "bytes": c.bytes, "head": head})
                        );
                    } else {
                        let verb = if args.dry_run { "would remove" } else { "removed" };
                        let was = match (branch, head) {
                            (true, Some(sha)) => format!(" (fvd/{name} was {sha})"),
                            _ => String::new(),
                        };
                        say(format_args!(
                            "{verb} {name}'s {what}: {why}; {}{was}",
                            mib(c.bytes)
                        ));
                    }
                }
            }
        }
        if !args.json {
            say(format_args!(
                "{} {} worktree(s) and {} branch(es), {}; {} kept",
                if args.dry_run { "would free" } else { "freed" },
                worktrees,
                branches,
                mib(freed),
                kept
            ));
        }
        Ok(Exit::Success)
    })
}
