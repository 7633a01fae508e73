//! `fvd submit --dry-run`: what a submit would do, with nothing started or
//! written. It validates the spec, evaluates the gate's P0 and P2
//! conditions, shows each component's command and the `PORT_STATUS.md`
//! rows it matches, and prints the diff fvd would write into that file now
//! from the state recorded in `REPO/.fvd/state.db` (read from a copy, so
//! not even SQLite's journal files appear in the repository).

use super::exit::Exit;
use std::path::{Path, PathBuf};

use anyhow::Context;
use fvd_actors::port_status::{self, Plan};
use fvd_contracts::coauthor;
use fvd_spec::preconditions::{prep_conditions, scaffold_conditions};
use fvd_spec::{self, PortSpec};
use fvd_store::Store;

use super::port::{SubmitArgs, state_db};
use super::server::runtime;

/// Exit codes: 0 the gate would let the port start, 1 it would refuse it,
/// 2 the spec or the repository is unusable.
pub fn run(args: &SubmitArgs) -> anyhow::Result<Exit> {
    let Some((repo, spec_path, spec)) = super::port::checked_spec(args) else {
        return Ok(Exit::Usage);
    };
    println!(
        "dry run of port {}: nothing is started or written",
        spec.family
    );
    println!(
        "spec {}: valid, {} component(s)",
        spec_path.display(),
        spec.components.len()
    );

    let mut refused = print_gate(&spec, &repo);
    print_after_parity(&spec, &repo);
    refused |= print_snapshot_preview(args, &repo, &spec)?;
    let shown = print_row_matches(&repo, &spec)?;
    print_recorded_diff(args, &repo, &spec, &shown)?;
    Ok(Exit::success_if(!refused))
}

/// Prints the gate's plan up to component parity: P0's and P2's
/// conditions, what it records for P1 and P3 to P5, and P6's components;
/// true when it would refuse.
fn print_gate(spec: &PortSpec, repo: &Path) -> bool {
    let mut refused = false;
    for (phase, conditions) in [
        ("P0", prep_conditions(spec, repo)),
        ("P2", scaffold_conditions(spec, repo)),
    ] {
        if phase == "P2" {
            println!("gate P1: pending: the study of the reference is not driven by fvd");
        }
        if conditions.is_empty() {
            println!("gate {phase}: passes");
        } else {
            refused = true;
            println!("gate {phase}: would refuse");
            for c in conditions {
                println!("  - {c}");
            }
        }
    }
    println!("gate P3: pending: no reuse decision is recorded; every component runs");
    println!("gate P4: pending: prototypes are not driven by fvd");
    match spec.prep.get("needs_conversion").map(String::as_str) {
        Some("no") => println!("gate P5: passes (needs_conversion: no)"),
        other => println!(
            "gate P5: pending: needs_conversion: {}; conversion is not driven by fvd",
            other.unwrap_or("missing")
        ),
    }
    let names: Vec<&str> = spec.parity_components().map(|c| c.name.as_str()).collect();
    println!(
        "gate P6: runs the parity tests of {} component(s): {}",
        names.len(),
        names.join(", ")
    );
    refused
}

/// Prints the plan past component parity (P7–P11) as the gate would
/// record it, and which declared pipeline or quality test the checkout
/// lacks.
fn print_after_parity(spec: &PortSpec, repo: &Path) {
    println!("after component parity (P6):");
    let steps: Vec<String> = spec
        .pipeline_steps()
        .map(|c| format!("{} ({})", c.name, c.parity_tests.join(" ")))
        .collect();
    if !steps.is_empty() {
        println!(
            "  gate P7: runs {}, each as a component (a red step stops the next)",
            steps.join(", then ")
        );
    }
    let driven = !steps.is_empty();
    for (phase, why) in fvd_actors::gate::after_parity(spec) {
        let n = phase.number();
        if driven && (n == 9 || (n == 10 && spec.quality.is_some())) {
            continue;
        }
        println!("  gate {}: pending: {why}", phase.id());
        if driven && n == 8 {
            print_verification(spec);
        }
    }
    let declared = spec
        .pipeline
        .iter()
        .flat_map(|p| [p.smoke_test.as_ref(), p.parity_test.as_ref()])
        .flatten()
        .chain(spec.quality.iter().flat_map(|q| q.tests.iter()));
    for t in declared {
        if !repo.join(t).is_file() {
            println!("  note: {t} is not in the checkout");
        }
    }
}

/// P9 and P10 as the gate runs them once P7 passes.
fn print_verification(spec: &PortSpec) {
    let components: Vec<&str> = spec.parity_components().map(|c| c.name.as_str()).collect();
    let steps: Vec<&str> = spec.pipeline_steps().map(|c| c.name.as_str()).collect();
    let conversion = match spec.prep.get("needs_conversion").map(String::as_str) {
        Some("no") => "no conversion (needs_conversion: no)".to_string(),
        other => format!(
            "the conversion first (needs_conversion: {}; fvd does not run it: P9 waits for it)",
            other.unwrap_or("missing")
        ),
    };
    let example = match spec.example_step() {
        Some(e) => format!("the example `{}` (its exit status)", e.argv().join(" ")),
        None => "no example declared ([pipeline] example): P9 waits there".into(),
    };
    println!(
        "  gate P9: at the commit P7 passes at, in order: {conversion}; {} (a pass of another commit runs again); {} (P7's runs); {example}; a failure stops it",
        components.join(", "),
        steps.join(", ")
    );
    let quality: Vec<String> = spec
        .quality_steps()
        .map(|c| format!("{} ({})", c.name, c.parity_tests.join(" ")))
        .collect();
    if !quality.is_empty() {
        println!(
            "  gate P10: runs {}; a skipped one (references not seeded) asks a person: seed and rerun, or defer",
            quality.join(", then ")
        );
    }
}

/// Prints what the snapshot would hold, and what submit would refuse; true
/// when it would refuse.
fn print_snapshot_preview(args: &SubmitArgs, repo: &Path, spec: &PortSpec) -> anyhow::Result<bool> {
    let mut refused = false;
    let fvd_writes: Vec<String> = spec
        .prep
        .get("port_state_file")
        .into_iter()
        .cloned()
        .collect();
    let rt = runtime()?;
    match rt.block_on(fvd_workspace::commit::preview(repo, &fvd_writes)) {
        Ok(None) => println!(
            "snapshot: none ({} is not in a git work tree; jobs run in the folder)",
            repo.display()
        ),
        Ok(Some(view)) if view.files == 0 && view.refusals.is_empty() => {
            println!("snapshot: none; the port runs HEAD as it is")
        }
        Ok(Some(view)) => {
            if view.files > 0 {
                println!(
                    "snapshot: {} file(s) differ from HEAD, {}; submit commits them on top of HEAD under refs/fvd/snapshots/{}/ (largest: {})",
                    view.files,
                    super::port::human_bytes(view.bytes),
                    spec.family,
                    view.largest
                        .iter()
                        .map(|(p, b)| format!("{p} {}", super::port::human_bytes(*b)))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            if view.bytes > args.snapshot_warn_mib.saturating_mul(1024 * 1024) {
                println!("warning: {}", super::port::snapshot_warning(&view));
            }
            for r in &view.refusals {
                refused = true;
                println!("submit would refuse: {r}");
            }
        }
        Err(e) => {
            refused = true;
            println!("submit would refuse: {e}");
        }
    }
    Ok(refused)
}

/// Prints each component's command and the `PORT_STATUS.md` rows it
/// matches; returns that file's path as shown (relative to the repository).
fn print_row_matches(repo: &Path, spec: &PortSpec) -> anyhow::Result<PathBuf> {
    let path = port_status::file_path(repo, spec)?;
    let shown = path.strip_prefix(repo).unwrap_or(&path).to_path_buf();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    match &text {
        Some(_) => println!("{}: rows each component matches", shown.display()),
        None => println!(
            "{}: no such file; fvd creates it once a run tests the code",
            shown.display()
        ),
    }
    let inputs: Vec<coauthor::ComponentInput> = spec
        .components
        .iter()
        .map(|c| port_status::component_input(&spec.family, c, None, &[], &Default::default()))
        .collect();
    let matches = coauthor::row_matches(text.as_deref().unwrap_or_default(), &inputs);
    for (c, m) in inputs.iter().zip(&matches) {
        println!("  {}: {}", c.name, c.command);
        let show = |what: &str, row: &Option<(usize, String)>| match row {
            Some((line, label)) => println!("      {what}: line {line}: {label}"),
            None => println!("      {what}: new row"),
        };
        // a step of P7, P9 or P10 is no component: it has no matrix row
        match c.stage {
            coauthor::Stage::Component => show("Component Matrix", &m.matrix),
            _ => println!("      Component Matrix: none (a step past P6, not a component)"),
        }
        show("Parity Commands", &m.parity);
        if m.section {
            println!("      fvd's section: its evidence");
        }
    }
    Ok(shown)
}

/// Prints the diff fvd would write into `shown` now from the recorded state.
fn print_recorded_diff(
    args: &SubmitArgs,
    repo: &Path,
    spec: &PortSpec,
    shown: &Path,
) -> anyhow::Result<()> {
    if let Some(url) = &args.target.orchestrator {
        println!(
            "note: the state of a port on {url} is not read; the diff below comes from {}",
            state_db(repo).display()
        );
    }
    let plan = recorded_plan(repo, spec)?;
    match plan {
        None => println!(
            "no state recorded for {} in {}: fvd would write nothing now",
            spec.family,
            state_db(repo).display()
        ),
        Some(Plan {
            after: None,
            skipped,
            ..
        }) => println!(
            "fvd would write nothing now: {}",
            skipped.unwrap_or_default()
        ),
        Some(Plan {
            before,
            after: Some(after),
            ..
        }) => {
            let before = before.unwrap_or_default();
            if before == after {
                println!(
                    "{}: fvd would leave it unchanged (from the recorded state)",
                    shown.display()
                );
            } else {
                println!(
                    "{}: what fvd would write now (from the recorded state):",
                    shown.display()
                );
                let name = shown.display().to_string();
                print!(
                    "{}",
                    similar::TextDiff::from_lines(&before, &after)
                        .unified_diff()
                        .context_radius(2)
                        .header(&format!("a/{name}"), &format!("b/{name}"))
                );
            }
        }
    }
    Ok(())
}

/// The write fvd would make from the recorded state, read from a copy of
/// the database in a temporary folder; `None` when nothing is recorded.
fn recorded_plan(repo: &Path, spec: &PortSpec) -> anyhow::Result<Option<Plan>> {
    let db = state_db(repo);
    if !db.is_file() {
        return Ok(None);
    }
    let copy = TempDir::new()?;
    for suffix in ["", "-wal"] {
        let from = PathBuf::from(format!("{}{suffix}", db.display()));
        if from.is_file() {
            let to = copy.0.join(format!("state.db{suffix}"));
            std::fs::copy(&from, &to)
                .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
        }
    }
    let rt = runtime()?;
    rt.block_on(async {
        let store = Store::open_path(&copy.0.join("state.db")).await?;
        if store.port(&spec.family).await?.is_none() {
            return Ok(None);
        }
        Ok(Some(
            port_status::plan(&store, &spec.family, Some((repo, spec))).await?,
        ))
    })
}

/// A folder of the system's temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!("fvd-dry-run-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
