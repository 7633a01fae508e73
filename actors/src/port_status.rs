//! Writes `tests/local_tests/<family>/PORT_STATUS.md` from the store,
//! rendered through the `contracts` crate.
//!
//! An existing file is imported and updated in place, so what people and
//! agents wrote there (questions, decisions, notes, sections fvd does not
//! know) is kept; fvd owns only its components' matrix cells, their parity
//! command rows, the current phase, the issue rows it adds for blocked
//! components, and the escape-hatch rows of the questions agents asked.

use std::path::{Path, PathBuf};

use fvd_contracts::ids::IdKind;
use fvd_contracts::phase::Phase;
use fvd_contracts::port_status::{
    self, ComponentRow as MatrixRow, ESCAPE_COLUMNS, IssueRow, ParityCommandRow, PhaseStatus,
    PortStatus, plain,
};

use crate::model::{ComponentRow, GateEventRow, JobRecord, PortRow};
use crate::spec::{self, PortSpec};
use crate::store::{EscapeRow, Store, StoreError, now_ms};

#[derive(Debug, thiserror::Error)]
pub enum PortStatusError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no port of family {0}")]
    UnknownFamily(String),
    #[error("stored spec of {family} no longer parses: {message}")]
    Spec { family: String, message: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("PORT_STATUS.md of {family}: {source}")]
    Path {
        family: String,
        source: fvd_paths::PathError,
    },
}

/// The stored port and its spec.
async fn port_and_spec(
    store: &Store,
    family: &str,
) -> Result<(PortRow, PortSpec), PortStatusError> {
    let port = store
        .port(family)
        .await?
        .ok_or_else(|| PortStatusError::UnknownFamily(family.to_string()))?;
    let spec = spec::parse(Path::new(&port.spec_path), &port.spec_toml).map_err(|e| {
        PortStatusError::Spec {
            family: family.to_string(),
            message: e.to_string(),
        }
    })?;
    Ok((port, spec))
}

/// Renders the port's state and writes it into its repository. Returns the
/// path written.
pub async fn write(store: &Store, family: &str) -> Result<PathBuf, PortStatusError> {
    let (port, spec) = port_and_spec(store, family).await?;
    let components = store.components(family).await?;
    let gate = store.gate_events(family).await?;
    let mut runs = Vec::new();
    for c in &components {
        runs.push(store.jobs_of(family, &c.name).await?);
    }
    let escapes = store.escapes(family).await?;
    let path = file_path(&port, &spec)?;
    let existing = std::fs::read_to_string(&path).ok();
    let text = render(
        existing.as_deref(),
        &port,
        &spec,
        &components,
        &runs,
        &gate,
        &escapes,
        &today(),
    );
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| PortStatusError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    // Written beside and renamed over, so a crash never leaves half a file.
    // A link left where the temporary file goes is removed, not followed.
    let tmp = path.with_extension("md.fvd-tmp");
    let _ = std::fs::remove_file(&tmp);
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|source| PortStatusError::Write {
            path: path.clone(),
            source,
        })?;
    store
        .set_port_status_path(family, &path.display().to_string())
        .await?;
    Ok(path)
}

/// Where the port's `PORT_STATUS.md` lives: `prep.port_state_file`, or the
/// convention when it is absent or a template placeholder (`<family>`).
/// Either is refused if it would leave the repository or pass through a
/// link (a cloned repository may carry one pointing anywhere).
fn file_path(port: &PortRow, spec: &PortSpec) -> Result<PathBuf, PortStatusError> {
    let rel = spec
        .prep
        .get("port_state_file")
        .filter(|p| !p.contains('<'))
        .cloned()
        .unwrap_or_else(|| format!("tests/local_tests/{}/PORT_STATUS.md", port.family));
    fvd_paths::join_under_no_links(Path::new(&port.repo), rel).map_err(|source| {
        PortStatusError::Path {
            family: port.family.clone(),
            source,
        }
    })
}

/// The highest `E###` number the port's `PORT_STATUS.md` already uses
/// (rows people wrote included), so an id fvd gives never collides.
pub async fn escape_floor(store: &Store, family: &str) -> Result<u32, PortStatusError> {
    let (port, spec) = port_and_spec(store, family).await?;
    Ok(std::fs::read_to_string(file_path(&port, &spec)?)
        .map(|text| {
            port_status::import(&text)
                .0
                .ids(IdKind::EscapeHatch)
                .into_iter()
                .map(|id| id.number)
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0))
}

/// The contract's `status` for a stored port state.
fn phase_status(state: &str) -> PhaseStatus {
    match state {
        "blocked" | "cancelled" => PhaseStatus::Blocked,
        "complete" => PhaseStatus::Complete,
        _ => PhaseStatus::InProgress,
    }
}

/// The new file text: `existing` updated, or a fresh file.
#[allow(clippy::too_many_arguments)]
pub fn render(
    existing: Option<&str>,
    port: &PortRow,
    spec: &PortSpec,
    components: &[ComponentRow],
    runs: &[Vec<JobRecord>],
    gate: &[GateEventRow],
    escapes: &[EscapeRow],
    date: &str,
) -> String {
    let mut ps = match existing {
        Some(text) => port_status::import(text).0,
        None => PortStatus::new(&display_name(&port.family), &port.family),
    };
    for key in [
        "model_family",
        "workload_types",
        "official_ref",
        "official_ref_dir",
        "hf_weights_path",
        "local_weights_dir",
        "source_layout",
        "local_tests_readme",
    ] {
        if let Some(v) = spec.prep.get(key)
            && ps.summary.get_plain(key).is_none_or(|s| s.is_empty())
        {
            ps.summary.set(key, format!("`{v}`"));
        }
    }
    let phase = port
        .phase
        .parse::<Phase>()
        .unwrap_or(Phase::ComponentParityDebug);
    let owner = if phase == Phase::ComponentParityDebug {
        "orchestrator"
    } else if phase >= Phase::PipelineStagesAndVariants {
        "pipeline"
    } else {
        "orchestrator"
    };
    ps.set_phase(phase, phase_status(&port.state), owner, date);

    for (c, spec_c) in components.iter().filter_map(|c| {
        spec.components
            .iter()
            .find(|s| s.name == c.name)
            .map(|s| (c, s))
    }) {
        // The matrix: fvd fills Type and Parity for its components and
        // leaves every other cell as people wrote it.
        let t = &mut ps.component_matrix.table;
        let row =
            (0..t.rows.len()).find(|&i| t.cell(i, "Component").is_some_and(|v| plain(v) == c.name));
        let parity = parity_cell(c);
        match row {
            Some(i) => {
                if let Some(col) = t.column("Parity") {
                    t.rows[i][col] = format!("`{parity}`");
                }
            }
            None => {
                ps.push_component(MatrixRow {
                    component: format!("`{}`", c.name),
                    component_type: format!("`{}`", spec_c.component_type),
                    reuse_port: "`unknown`".into(),
                    official_definition: "`unknown`".into(),
                    official_instantiation: "`unknown`".into(),
                    fastvideo_target: "`unknown`".into(),
                    prototype: "`not_started`".into(),
                    conversion: "`not_started`".into(),
                    parity: format!("`{parity}`"),
                    open_issues: "none".into(),
                });
            }
        }
    }

    // Parity Commands: one row per component, the latest recorded run.
    for (c, jobs) in components.iter().zip(runs) {
        let Some(spec_c) = spec.components.iter().find(|s| s.name == c.name) else {
            continue;
        };
        let command = format!("`{}`", display_command(&spec_c.argv()));
        let last = jobs.iter().rev().find(|j| j.state == "finished");
        let (result, notes) = match last {
            Some(j) => (
                format!("`{}`", j.verdict),
                format!(
                    "run {} of {}; {}",
                    j.run_no,
                    jobs.len(),
                    one_line(&j.reason)
                ),
            ),
            None => ("`not_run`".to_string(), String::new()),
        };
        let t = &mut ps.parity_commands.table;
        let scope = format!("component:{}", c.name);
        let existing = (0..t.rows.len()).find(|&i| {
            t.cell(i, "Scope").is_some_and(|v| plain(v) == scope)
                || t.cell(i, "Command")
                    .is_some_and(|v| plain(v).contains(&spec_c.parity_test))
        });
        let row = ParityCommandRow {
            scope,
            command,
            last_result: result,
            notes,
        };
        match existing {
            Some(i) => {
                for (col, v) in row.cells() {
                    if let Some(ci) = t.column(col) {
                        t.rows[i][ci] = v;
                    }
                }
            }
            None => {
                ps.push_parity_command(row);
            }
        }
    }

    // Issues: one open row per gate refusal and per blocked component,
    // each added once.
    let mut issues: Vec<(String, String, String, String)> = gate
        .iter()
        .filter(|e| e.outcome == "refused")
        .map(|e| {
            (
                e.phase.clone(),
                "all".to_string(),
                format!("gate refused {}", e.phase),
                e.conditions.join("; "),
            )
        })
        .collect();
    issues.extend(
        components
            .iter()
            .filter(|c| c.status == "blocked")
            .map(|c| {
                (
                    Phase::ComponentParityDebug.id(),
                    format!("`{}`", c.name),
                    format!("component {} is blocked", c.name),
                    c.reason.clone(),
                )
            }),
    );
    for (phase, component, issue, evidence) in issues {
        let t = &ps.issues_and_blockers.table;
        // An open row about the same component (written by fvd or by a
        // person) already tracks it.
        let known = (0..t.rows.len()).any(|i| {
            t.cell(i, "Issue").is_some_and(|v| plain(v) == issue)
                || (component != "all"
                    && t.cell(i, "Component")
                        .is_some_and(|v| plain(v) == plain(&component))
                    && t.cell(i, "Status").is_some_and(|v| plain(v) == "open"))
        });
        if known {
            continue;
        }
        let id = ps.next_id(IdKind::Issue);
        ps.push_issue(IssueRow {
            id: id.to_string(),
            phase,
            owner: if component == "all" {
                "orchestrator".to_string()
            } else {
                format!("component:{}", plain(&component))
            },
            component,
            severity: "blocker".into(),
            issue,
            evidence: one_line(&evidence),
            status: "open".into(),
            resolution: String::new(),
        });
    }

    // Escape hatches: one row per question an agent asked, by the id fvd
    // gave it; its status follows the answer.
    for e in escapes {
        let status = match e.status.as_str() {
            "open" => "open",
            _ => "resolved",
        };
        let resolution = match (e.status.as_str(), e.resolved_attempt) {
            ("open", _) => format!("waiting: fvd answer {} {} --option N", e.family, e.id),
            ("withdrawn", _) => "withdrawn: the port was rerun (fvd submit --rerun)".to_string(),
            (_, Some(a)) => one_line(&format!("answered: {}; given to attempt {a}", e.answer)),
            _ => one_line(&format!("answered: {}", e.answer)),
        };
        let cells = [
            e.id.clone(),
            e.phase.clone(),
            format!("`{}`", e.decision_type),
            one_line(&format!("{} (component `{}`)", e.question, e.component)),
            one_line(&e.recommended),
            format!("`{status}`"),
            resolution,
        ];
        let t = &mut ps.escape_hatches.table;
        let row = (0..t.rows.len()).find(|&i| t.cell(i, "ID").is_some_and(|v| plain(v) == e.id));
        match row {
            Some(i) => {
                for (col, v) in ESCAPE_COLUMNS.iter().zip(cells) {
                    if let Some(ci) = t.column(col) {
                        t.rows[i][ci] = v;
                    }
                }
            }
            None => {
                let row = t
                    .header
                    .iter()
                    .map(|h| {
                        ESCAPE_COLUMNS
                            .iter()
                            .position(|c| c == h)
                            .map(|k| cells[k].clone())
                            .unwrap_or_default()
                    })
                    .collect();
                t.rows.push(row);
            }
        }
    }
    ps.render()
}

/// The Parity cell: the contract status of the component.
fn parity_cell(c: &ComponentRow) -> String {
    match c.status.as_str() {
        "non_skip_pass" => "non_skip_pass".into(),
        "blocked" => match c.verdict.as_str() {
            "scaffold_skip" => "scaffold_skip".into(),
            "debug_red" => "debug_red".into(),
            _ => "blocked".into(),
        },
        "pending" => "not_started".into(),
        _ => "in_progress".into(),
    }
}

fn display_command(argv: &[String]) -> String {
    argv.iter()
        .filter(|a| !a.contains("{junitxml}"))
        .map(|a| {
            if a.contains(' ') {
                format!("'{a}'")
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Table cells hold one line and no pipe.
fn one_line(s: &str) -> String {
    let mut out: String = s
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|");
    if out.chars().count() > 240 {
        out = out.chars().take(239).collect::<String>() + "…";
    }
    out
}

fn display_name(family: &str) -> String {
    family
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Today's date (UTC) as YYYY-MM-DD, from the civil-from-days algorithm.
fn today() -> String {
    let days = now_ms().div_euclid(86_400_000);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> PortSpec {
        spec::parse(
            Path::new("port.toml"),
            r#"
[prep]
model_family = "tiny_port"
needs_conversion = "no"

[[component]]
name = "embed"
type = "generic"
parity_test = "tests/local_tests/generic/test_tiny_port_embed_parity.py"
coverage_scope = "both"

[[component]]
name = "vae"
type = "vae"
parity_test = "tests/local_tests/vae/test_tiny_port_vae_parity.py"
coverage_scope = "both"
"#,
        )
        .unwrap()
    }

    fn port() -> PortRow {
        PortRow {
            family: "tiny_port".into(),
            state: "blocked".into(),
            phase: "P7".into(),
            ..PortRow::default()
        }
    }

    fn rows() -> (Vec<ComponentRow>, Vec<Vec<JobRecord>>) {
        let c = vec![
            ComponentRow {
                name: "embed".into(),
                status: "non_skip_pass".into(),
                verdict: "non_skip_pass".into(),
                reason: "3 passed".into(),
                runs: 1,
                worker_id: "w".into(),
            },
            ComponentRow {
                name: "vae".into(),
                status: "blocked".into(),
                verdict: "scaffold_skip".into(),
                reason: "scaffold_skip: could not import 'private_ops'".into(),
                runs: 1,
                worker_id: "w".into(),
            },
        ];
        let job = |component: &str, verdict: &str| JobRecord {
            component: component.into(),
            run_no: 1,
            state: "finished".into(),
            verdict: verdict.into(),
            ..JobRecord::default()
        };
        (
            c,
            vec![
                vec![job("embed", "non_skip_pass")],
                vec![job("vae", "scaffold_skip")],
            ],
        )
    }

    #[test]
    fn fresh_file_follows_the_contract_and_imports_clean_of_matrix_findings() {
        let (c, r) = rows();
        let text = render(None, &port(), &spec(), &c, &r, &[], &[], "2026-11-26");
        assert!(text.starts_with("# Tiny Port Port Status"), "{text}");
        let (ps, _findings) = port_status::import(&text);
        let comps = ps.components();
        assert_eq!(comps.len(), 2);
        assert_eq!(comps[0].parity.as_deref(), Some("`non_skip_pass`"));
        assert_eq!(comps[1].parity.as_deref(), Some("`scaffold_skip`"));
        assert_eq!(
            ps.phase_text().as_deref(),
            Some(Phase::PipelineStagesAndVariants.slug().as_str())
        );
        assert!(
            text.contains("| I001 |"),
            "a blocked component gets an issue row: {text}"
        );
        assert!(text.contains("component:vae"));
    }

    #[test]
    fn rerender_keeps_people_rows_and_adds_no_duplicate_issue() {
        let (c, r) = rows();
        let first = render(None, &port(), &spec(), &c, &r, &[], &[], "2026-11-26");
        let edited = first.replace(
            "## Decisions",
            "## Decisions\n\n| Date | Decision | Rationale | Impact |\n|---|---|---|---|\n| 2026-11-01 | keep fp32 | tolerance | vae |",
        );
        let second = render(
            Some(&edited),
            &port(),
            &spec(),
            &c,
            &r,
            &[],
            &[],
            "2026-11-27",
        );
        assert!(
            second.contains("| 2026-11-01 | keep fp32 | tolerance | vae |"),
            "{second}"
        );
        assert_eq!(
            second.matches("component vae is blocked").count(),
            1,
            "{second}"
        );
        assert_eq!(second.matches("component:embed").count(), 1, "{second}");
    }

    #[test]
    fn escape_rows_follow_the_answer_and_keep_people_rows() {
        let (c, r) = rows();
        let mut e = EscapeRow {
            family: "tiny_port".into(),
            id: "E002".into(),
            component: "vae".into(),
            attempt: 1,
            phase: "P6".into(),
            decision_type: "ambiguity".into(),
            question: "which shift?".into(),
            recommended: "3.0".into(),
            options: vec!["3.0".into(), "1.0".into()],
            safe_default: "3.0".into(),
            status: "open".into(),
            ..EscapeRow::default()
        };
        let people = "| E001 | P1 | `scope` | skip audio? | yes | `resolved` | skipped |";
        let first = render(None, &port(), &spec(), &c, &r, &[], std::slice::from_ref(&e), "2026-11-26")
            .replace(
                "| ID | Phase | Decision Type | Question | Recommended Option | Status | Resolution |\n|---|---|---|---|---|---|---|",
                &format!("| ID | Phase | Decision Type | Question | Recommended Option | Status | Resolution |\n|---|---|---|---|---|---|---|\n{people}"),
            );
        assert!(first.contains(people), "{first}");
        assert!(
            first.contains("| E002 | P6 | `ambiguity` | which shift? (component `vae`) | 3.0 | `open` | waiting: fvd answer tiny_port E002 --option N |"),
            "{first}"
        );
        e.status = "resolved".into();
        e.answer = "3.0".into();
        e.resolved_attempt = Some(2);
        let second = render(
            Some(&first),
            &port(),
            &spec(),
            &c,
            &r,
            &[],
            &[e],
            "2026-11-27",
        );
        assert!(second.contains(people), "{second}");
        assert_eq!(second.matches("| E002 |").count(), 1, "{second}");
        assert!(
            second.contains("| `resolved` | answered: 3.0; given to attempt 2 |"),
            "{second}"
        );
        let (status, findings) = port_status::import(&second);
        assert_eq!(status.ids(IdKind::EscapeHatch).len(), 2);
        assert!(
            findings.iter().all(|f| !f.field.contains("Escape")),
            "{findings:?}"
        );
    }

    #[test]
    fn the_status_file_stays_inside_the_repository() {
        let dir = tempfile::tempdir().unwrap();
        let port = PortRow {
            repo: dir.path().display().to_string(),
            ..port()
        };
        let with = |file: &str| {
            let mut s = spec();
            s.prep.insert("port_state_file".into(), file.into());
            file_path(&port, &s)
        };
        assert_eq!(
            file_path(&port, &spec()).unwrap(),
            dir.path()
                .join("tests/local_tests/tiny_port/PORT_STATUS.md")
        );
        assert_eq!(
            with("tests/local_tests/<family>/PORT_STATUS.md").unwrap(),
            dir.path()
                .join("tests/local_tests/tiny_port/PORT_STATUS.md")
        );
        for bad in ["../../outside.md", "/tmp/outside.md"] {
            let err = with(bad).unwrap_err().to_string();
            assert!(err.contains("must stay inside"), "{bad}: {err}");
        }
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("docs")).unwrap();
        let err = with("docs/PORT_STATUS.md").unwrap_err().to_string();
        assert!(err.contains("docs is a symbolic link"), "{err}");
    }

    #[test]
    fn today_is_a_date() {
        let d = today();
        assert_eq!(d.len(), 10);
        assert!(d.starts_with("20"), "{d}");
    }
}
