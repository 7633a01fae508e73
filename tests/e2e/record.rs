//! The porter's record under real verdicts (issue #28): the real `fvd`
//! binary and real pytest on copies of status files in every shape the
//! FastVideo ports use (`tests/fixtures/status_shapes/`, written for fvd),
//! with small CPU tests that pass, fail, skip and hit every environment
//! signature. It shows that no character a person wrote is lost after a
//! pass, a red run, a red-then-green round trip, a resubmit and `--rerun`;
//! that a file outside the contract's shape gets one fvd section at most
//! and no contract table beside its own; that a red run against a person's
//! PASS is a regression in every shape; that a new commit reruns the red
//! component, which passes without `--rerun`; and that a broken environment
//! is never a verdict and never reaches the file.

use std::path::Path;
use std::process::Output;

use fvd_contracts::coauthor::{human_part, is_placeholder};
use fvd_contracts::status_doc::cells;
use fvd_contracts::status_guard::owned_changes;

use crate::agent::git;
use crate::support::{fixtures, fvd};

const FAMILY: &str = "widget";
const STATUS: &str = "tests/local_tests/widget/PORT_STATUS.md";

/// The vae's code: wrong first, fixed by the porter's commit.
const VAE_RED: &str = "def scale(x):\n    return x / 3.0\n";
const VAE_FIXED: &str = "def scale(x):\n    return x / 2.0\n";

/// A spec component: its name, aliases (the labels the shape uses), the
/// body of its test and the code it names.
pub(crate) struct Part {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub body: &'static str,
    pub paths: &'static [&'static str],
}

/// transformer passes, vae is red (the file records its pass), text
/// encoder skips, scheduler passes.
pub(crate) fn parts(aliases: [&'static [&'static str]; 4]) -> Vec<Part> {
    vec![
        Part {
            name: "transformer",
            aliases: aliases[0],
            body: "from pkg.other import one\n    assert one() == 1",
            paths: &["pkg/other.py"],
        },
        Part {
            name: "vae",
            aliases: aliases[1],
            body: "from pkg.vae import scale\n    got = scale(2.0)\n    assert abs(got - 1.0) < 1e-6, f'decode max abs diff {abs(got - 1.0):.3f}'",
            paths: &["pkg/vae.py"],
        },
        Part {
            name: "text_encoder",
            aliases: aliases[2],
            body: "pytest.skip('the reference tokenizer is not staged')",
            paths: &["pkg/other.py"],
        },
        Part {
            name: "scheduler",
            aliases: aliases[3],
            body: "from pkg.other import one\n    assert one() + one() == 2",
            paths: &["pkg/other.py"],
        },
    ]
}

/// A git repository with the port, its tests, its code and `status` as
/// the porter's `PORT_STATUS.md`, committed.
pub(crate) fn repo(status: &str, parts: &[Part]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let tests = root.join("tests/local_tests/widget");
    std::fs::create_dir_all(&tests).unwrap();
    std::fs::create_dir_all(root.join("pkg")).unwrap();
    std::fs::write(root.join("pkg/__init__.py"), "").unwrap();
    std::fs::write(root.join("pkg/vae.py"), VAE_RED).unwrap();
    std::fs::write(root.join("pkg/other.py"), "def one():\n    return 1\n").unwrap();
    let mut spec = String::from(
        r#"[prep]
model_family = "widget"
workload_types = "T2V"
official_ref = "https://example.org/widget"
official_ref_dir = "official"
official_ref_commit = "unknown"
hf_weights_path = "example/widget-2b"
hf_revision = "default"
local_weights_dir = "official_weights/widget"
source_layout = "raw_official"
model_index_class = "none"
components_seen = "transformer, vae, text_encoder, scheduler"
needs_conversion = "no"
hf_token_env = "HF_TOKEN"
dependency_changes = "none"
official_env_status = "imports_ok"
local_tests_readme = "tests/local_tests/widget/README.md"
port_state_file = "tests/local_tests/widget/PORT_STATUS.md"
gitignore_entries_added = "none"
next_step = "add-model"
open_questions = "none"
escape_hatch = "none"

[defaults]
timeout_s = 60
set_env = { PYTHONPATH = "{repo}" }
"#,
    );
    for p in parts {
        let test = format!("tests/local_tests/widget/test_widget_{}_parity.py", p.name);
        let quoted = |v: &[&str]| {
            v.iter()
                .map(|a| format!("{a:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        spec.push_str(&format!(
            "\n[[component]]\nname = \"{}\"\ntype = \"generic\"\nparity_test = \"{test}\"\ncoverage_scope = \"both\"\naliases = [{}]\npaths = [{}]\n",
            p.name,
            quoted(p.aliases),
            quoted(p.paths)
        ));
        std::fs::write(
            root.join(&test),
            format!(
                "import os, pytest\n\n\ndef test_parity():\n    {}\n",
                p.body
            ),
        )
        .unwrap();
    }
    std::fs::write(tests.join("port.toml"), spec).unwrap();
    std::fs::write(tests.join("README.md"), "# widget\n").unwrap();
    std::fs::write(root.join(STATUS), status).unwrap();
    std::fs::write(root.join(".gitignore"), ".fvd/\n__pycache__/\n").unwrap();
    git(root, &["init", "-q"]);
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "the porter's state"]);
    dir
}

fn submit(repo: &Path, extra: &[&str]) -> Output {
    fvd()
        .args(["submit", "--family", FAMILY, "--wait", "--repo"])
        .arg(repo)
        .args(extra)
        .output()
        .unwrap()
}

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A component's status, from `fvd status --json`.
fn component_status(repo: &Path, name: &str) -> String {
    let o = fvd()
        .args(["status", FAMILY, "--json", "--repo"])
        .arg(repo)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    v["components"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name)
        .and_then(|c| c["status"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn read(repo: &Path) -> String {
    std::fs::read_to_string(repo.join(STATUS)).unwrap()
}

/// Whether a line is one fvd adds: an issue or command row carrying its
/// evidence, its bullets, its superseded line, its section's lines.
fn fvd_line(l: &str) -> bool {
    l.contains("[fvd ")
        || l.starts_with("- fvd ")
        || l.starts_with("fvd ")
        || l.starts_with("<!-- fvd")
        || l.starts_with("## fvd evidence")
        || l.starts_with("| `")
        || l.starts_with("| Component | Recorded in this file |")
        || l.starts_with("|---|---|---|---|---|")
        || l.starts_with("- regression: ")
        || l.trim().is_empty()
}

/// What Current Phase may do between two texts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Any owned field may change (a regression moved it back).
    Moves,
    /// Byte for byte as before.
    Same,
    /// A file at P6 becomes `blocked` (a component only skips), nothing else.
    BlockedAtP6,
}

/// `after` is `before` with only fvd's evidence added: no line of
/// `before` gone, every changed cell keeps the person's words (or held a
/// placeholder), every added line is fvd's. With `phase` false, Current
/// Phase is byte for byte the same.
fn assert_only_evidence(before: &str, after: &str, phase: Phase) {
    let changes = owned_changes(before, after).unwrap_or_else(|e| panic!("{e}\n{after}"));
    assert!(changes.removed.is_empty(), "{changes:?}");
    for (line, old, new) in &changes.changed {
        if old.starts_with("- ") {
            let blocked_at_p6 = phase == Phase::BlockedAtP6
                && (new.starts_with("- status: `blocked`") || new.starts_with("- last_updated: "));
            assert!(
                phase == Phase::Moves || blocked_at_p6,
                "line {line}: Current Phase changed: {old} -> {new}"
            );
            continue;
        }
        let (a, b) = (cells(old), cells(new));
        // a short row may gain the cells up to fvd's
        assert!(b.len() >= a.len(), "{old}\n{new}");
        for (k, x) in a.iter().enumerate() {
            let y = b.get(k).copied().unwrap_or("");
            let kept = human_part(y) == x.trim();
            let ids_only = x.trim() == "none" || x.trim().starts_with('I');
            assert!(
                kept || is_placeholder(x) || ids_only,
                "line {line}: a person's cell lost words: `{}` became `{}`",
                x.trim(),
                y.trim()
            );
        }
    }
    for l in &changes.added {
        assert!(fvd_line(l), "a line fvd added is not fvd's: {l:?}\n{after}");
    }
    // nothing of the person's text is lost: every line of theirs is there
    for l in before.lines().filter(|l| !l.trim().is_empty()) {
        let kept =
            after.lines().any(|a| a == l) || changes.changed.iter().any(|(_, old, _)| old == l);
        assert!(kept, "lost: {l:?}\n{after}");
    }
}

/// One shape through red, green by a new commit, resubmit and `--rerun`;
/// the file after the red run and after the pass.
fn round_trip(
    shape: &str,
    aliases: [&'static [&'static str]; 4],
    contract: bool,
) -> (String, String) {
    let original = std::fs::read_to_string(fixtures().join("status_shapes").join(shape)).unwrap();
    let dir = repo(&original, &parts(aliases));
    let root = dir.path();

    // 1. red (vae regressed), pass, skip
    let first = submit(root, &[]);
    assert_eq!(first.status.code(), Some(1), "{shape}: {}", out(&first));
    let red = read(root);
    assert_only_evidence(&original, &red, Phase::Moves);
    // the regression is recognised against the person's pass
    assert!(
        red.contains("debug_red (regression)") || red.contains("`debug_red` (regression)"),
        "{shape}: no regression recognised:\n{red}\n{}",
        out(&first)
    );
    let sections = red
        .lines()
        .filter(|l| l.starts_with("## fvd evidence"))
        .count();
    assert!(sections <= 1, "{red}");
    if !contract {
        for table in [
            "## Component Matrix",
            "## Parity Commands",
            "## Issues And Blockers",
        ] {
            assert_eq!(
                red.matches(table).count(),
                original.matches(table).count(),
                "{shape}: fvd added {table}:\n{red}"
            );
        }
        assert!(!red.contains("`unknown`"), "{shape}:\n{red}");
    }
    assert!(
        !red.contains("{repo}"),
        "{shape}: a placeholder written:\n{red}"
    );
    // a second identical state writes nothing
    let again = submit(root, &[]);
    assert_eq!(again.status.code(), Some(1), "{}", out(&again));
    assert_eq!(read(root), red, "{shape}: a resubmit changed the file");

    // 2. the porter fixes the vae and commits: it reruns without --rerun
    std::fs::write(root.join("pkg/vae.py"), VAE_FIXED).unwrap();
    git(root, &["commit", "-qm", "fix the vae scale", "pkg/vae.py"]);
    let fixed = submit(root, &[]);
    let text = out(&fixed);
    assert!(
        text.contains("rerun vae (pkg/vae.py changed)") && text.contains("keep their verdicts"),
        "{shape}: {text}"
    );
    // A new commit is not a spec change (issue #41).
    assert!(
        text.contains("commit changed: ") && !text.contains("spec changed: commit"),
        "{shape}: {text}"
    );
    let green = read(root);
    assert_eq!(component_status(root, "vae"), "non_skip_pass", "{text}");
    let settled = if original.contains("- phase: `phase_6_component_parity_debug`") {
        Phase::BlockedAtP6
    } else {
        Phase::Same
    };
    assert_only_evidence(&original, &green, settled);
    assert!(!green.contains("(regression)]"), "{shape}:\n{green}");
    assert!(!green.contains("moved back"), "{shape}:\n{green}");
    assert!(!green.contains("superseded"), "{shape}:\n{green}");

    // 3. resubmit and --rerun: the same evidence changes nothing
    let resubmit = submit(root, &[]);
    assert_eq!(read(root), green, "{shape}: {}", out(&resubmit));
    // and nothing stale is said about the vae's old red (issue #41)
    for o in [&fixed, &resubmit] {
        assert!(!says_blocked(&out(o), "vae"), "{shape}: {}", out(o));
    }
    let rerun = submit(root, &["--rerun"]);
    assert_eq!(read(root), green, "{shape}: {}", out(&rerun));
    (red, green)
}

/// The byte offsets of the pipes of each row of the table under `heading`.
fn pipe_columns(text: &str, heading: &str) -> Vec<(String, Vec<usize>)> {
    text.lines()
        .skip_while(|l| *l != heading)
        .skip(1)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let pipes = l.match_indices('|').map(|(i, _)| i).collect();
            (l.to_string(), pipes)
        })
        .collect()
}

#[test]
fn the_contract_shape_round_trips() {
    round_trip("contract.md", [&[], &[], &[], &[]], true);
}

#[test]
fn a_prose_phase_with_semicolons_round_trips() {
    round_trip(
        "prose_phase.md",
        [&[], &[], &["Production text encoder"], &[]],
        true,
    );
}

#[test]
fn a_component_status_table_round_trips() {
    round_trip("component_status.md", [&[], &[], &[], &[]], false);
}

#[test]
fn a_coverage_table_round_trips() {
    round_trip(
        "coverage.md",
        [
            &["Whirl DiT"],
            &["Video VAE"],
            &["Qwen text encoder"],
            &["Video/audio schedulers"],
        ],
        false,
    );
}

#[test]
fn a_native_components_table_round_trips() {
    round_trip(
        "native_components.md",
        [
            &["Chirp transformer"],
            &["44.1 kHz VAE"],
            &["CLAP text encoder"],
            &["Euler flow schedule"],
        ],
        false,
    );
}

/// The same shape without a hand-written alias (issue #41 item 5): each
/// prose label names its component by words (`Chirp transformer`, `CLAP
/// text encoder`), so the vae's recorded `exact` pass is its regression.
#[test]
fn a_native_components_table_round_trips_without_aliases() {
    round_trip("native_components.md", [&[], &[], &[], &[]], false);
}

/// Labels that name no component (`48 kHz codec`, `DFN text/vision`),
/// whose FastVideo implementation cell names its code file
/// (`…/audio/warble_vae.py`): the vae's recorded `exact` is still its
/// pass, and its red run a regression, with no alias (issue #41 item 5).
#[test]
fn rows_found_by_their_implementation_files_round_trip_without_aliases() {
    round_trip("implementation_paths.md", [&[], &[], &[], &[]], false);
}

/// A padded matrix whose Parity says `exact generated parity` (a pass the
/// vae's red run regresses) and that lacks the text encoder: the rows fvd
/// appends keep the table's column widths (issue #41 item 5).
#[test]
fn an_exact_parity_in_a_padded_matrix_round_trips_and_appended_rows_keep_its_widths() {
    let (red, green) = round_trip("exact_matrix.md", [&[], &[], &[], &[]], true);
    for text in [&red, &green] {
        for table in ["## Component Matrix", "## Parity Commands"] {
            let rows = pipe_columns(text, table);
            let text_encoder = rows.iter().find(|(l, _)| l.contains("text_encoder"));
            let (row, pipes) = text_encoder.unwrap_or_else(|| panic!("{table}: no row:\n{text}"));
            // the appended row's pipes stand under the header's wherever
            // the cells before them fit their columns
            let header = &rows[0].1;
            let cells: Vec<&str> = row.split('|').skip(1).collect();
            let mut lined_up = 0;
            for k in 0..header.len() - 1 {
                let fits = cells[k].trim().chars().count() + 2 < header[k + 1] - header[k];
                if pipes[k] == header[k] && fits {
                    assert_eq!(pipes[k + 1], header[k + 1], "{table}: {row}\n{}", rows[0].0);
                    lined_up += 1;
                }
            }
            assert!(lined_up >= 1, "{table}: {row}\n{}", rows[0].0);
        }
    }
}

#[test]
fn a_padded_matrix_with_a_validation_table_round_trips() {
    round_trip(
        "padded_validation.md",
        [
            &["Dense DiT"],
            &["Wan VAE"],
            &["Qwen3-VL text"],
            &["Flow-UniPC"],
        ],
        true,
    );
}

#[test]
fn rows_without_pipes_with_tabs_and_twice_round_trip() {
    round_trip("loose_rows.md", [&[], &[], &[], &[]], true);
}

/// One test per recognised environment signature, each failing the way a
/// broken machine makes it fail (real where a CPU machine can: a CUDA
/// runtime that is not there, an installed package without the name, git
/// outside a repository, a working directory removed under the shell).
const BROKEN: &[(&str, &str)] = &[
    ("missing_module", "import fvd_e2e_not_installed_pkg"),
    (
        "cuda_runtime",
        "import ctypes\n    ctypes.CDLL('libcudart.so.99')",
    ),
    (
        "undefined_symbol",
        "raise ImportError('/opt/venv/lib/python3.12/site-packages/ext/_C.so: undefined symbol: _ZN3c104cuda9SetDeviceEi')",
    ),
    (
        "glibc",
        "raise OSError(\"/lib64/libc.so.6: version `GLIBC_2.99' not found (required by /opt/venv/lib/libx.so)\")",
    ),
    ("installed_mismatch", "from pytest import fvd_not_a_name"),
    (
        "driver",
        "raise RuntimeError('The NVIDIA driver on your system is too old (found version 11040).')",
    ),
    (
        "not_git",
        "import subprocess, tempfile\n    r = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=tempfile.mkdtemp(), capture_output=True, text=True)\n    assert r.returncode == 0, r.stderr",
    ),
    (
        "dubious",
        "raise RuntimeError(\"fatal: detected dubious ownership in repository at '/srv/FastVideo'\")",
    ),
    (
        "missing_cwd",
        "import subprocess, tempfile\n    here = os.getcwd()\n    d = tempfile.mkdtemp()\n    os.chdir(d)\n    os.rmdir(d)\n    r = subprocess.run(['bash', '-c', 'true'], capture_output=True, text=True)\n    os.chdir(here)\n    assert not r.stderr, r.stderr",
    ),
];

#[test]
fn every_environment_signature_is_an_environment_never_a_verdict() {
    let original = std::fs::read_to_string(fixtures().join("status_shapes/contract.md")).unwrap();
    let parts: Vec<Part> = BROKEN
        .iter()
        .map(|(name, body)| Part {
            name,
            aliases: &[],
            body,
            paths: &[],
        })
        .collect();
    let dir = repo(&original, &parts);
    let root = dir.path();
    let first = submit(root, &[]);
    let text = out(&first);
    assert_eq!(first.status.code(), Some(4), "{text}");
    // never written into the porter's file
    assert_eq!(read(root), original, "{text}");
    // never a verdict, never a counted run
    let o = fvd()
        .args(["status", FAMILY, "--json", "--repo"])
        .arg(root)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for c in v["components"].as_array().unwrap() {
        assert_eq!(c["status"], "environment", "{c}");
        assert_eq!(c["runs"], 0, "{c}");
    }
    // each cause named once, grouped by worker
    for cause in [
        "No module named 'fvd_e2e_not_installed_pkg'",
        "shared library missing: libcudart.so.99",
        "undefined symbol: _ZN3c104cuda9SetDeviceEi",
        "system library too old: GLIBC_2.99 not found",
        "installed package mismatch: cannot import name 'fvd_not_a_name' from 'pytest'",
        "no usable CUDA driver: The NVIDIA driver on your system is too old",
        "git: the folder is not a git repository",
        "git: dubious ownership of the checkout",
        "working directory missing",
    ] {
        assert!(text.contains(cause), "{cause}:\n{text}");
    }
    assert!(text.contains("could not run on worker"), "{text}");
    // a resubmit on the same machine: still the environment, still nothing written
    let again = submit(root, &[]);
    assert_eq!(again.status.code(), Some(4), "{}", out(&again));
    assert_eq!(read(root), original);
}

#[test]
fn a_status_file_that_cannot_be_written_fails_the_submit_with_7() {
    let original = std::fs::read_to_string(fixtures().join("status_shapes/contract.md")).unwrap();
    let dir = repo(&original, &parts([&[], &[], &[], &[]]));
    let root = dir.path();
    // A root process can write anywhere: the write fails at fvd's own
    // fault point, as a full or failing disk would make it fail.
    let first = fvd()
        .args(["submit", "--family", FAMILY, "--wait", "--repo"])
        .arg(root)
        .env("FVD_FAIL_AT", "status-write")
        .output()
        .unwrap();
    let text = out(&first);
    assert_eq!(first.status.code(), Some(7), "{text}");
    assert!(
        text.contains("PORT_STATUS.md was not written") && text.contains("cannot write"),
        "{text}"
    );
    assert_eq!(read(root), original);
    // once fvd can write it, the next submit does, and says nothing of it
    let again = submit(root, &["--rerun"]);
    assert_eq!(again.status.code(), Some(1), "{}", out(&again));
    assert!(!out(&again).contains("was not written"), "{}", out(&again));
    assert_ne!(read(root), original);
    let folder = root.join(STATUS);
    let left: Vec<_> = std::fs::read_dir(folder.parent().unwrap())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".fvd-tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

/// A red test whose source holds every environment signature, in
/// comments, in a branch it does not take and in a message it builds and
/// checks (FastVideo's `test_attn_qat_train_kernel.py` pattern with the
/// code under test regressed), is the component's failure (issue #41):
/// exit 1, each blocked with its own assertion, each run counted.
#[test]
fn signatures_in_a_red_test_s_source_are_the_component_s_failure() {
    let original = std::fs::read_to_string(fixtures().join("status_shapes/contract.md")).unwrap();
    let examples: Vec<&str> = fvd_contracts::verdict::ENVIRONMENT_SIGNATURES
        .iter()
        .map(|s| s.example)
        .collect();
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let comments = leak(format!(
        "{}\n    assert 1.0 == 1.25, 'max drift 0.25'",
        examples
            .iter()
            .map(|e| format!("# if this fails with {e}, load the module first"))
            .collect::<Vec<_>>()
            .join("\n    ")
    ));
    let branch = leak(format!(
        "if os.environ.get('FVD_E2E_NEVER_SET'):\n{}\n    assert 1.0 == 1.25, 'max drift 0.25'",
        examples
            .iter()
            .map(|e| format!("        raise RuntimeError({e:?})"))
            .collect::<Vec<_>>()
            .join("\n")
    ));
    let parts = vec![
        Part {
            name: "comments",
            aliases: &[],
            body: comments,
            paths: &[],
        },
        Part {
            name: "branch",
            aliases: &[],
            body: branch,
            paths: &[],
        },
        Part {
            name: "mocked",
            aliases: &[],
            body: "missing = ImportError(\"No module named 'fastvideo_kernel'\")\n    with pytest.raises(ImportError, match=\"requires FastVideo's fastvideo-kernel\"):\n        raise missing",
            paths: &[],
        },
    ];
    let dir = repo(&original, &parts);
    let root = dir.path();
    let first = submit(root, &[]);
    let text = out(&first);
    assert_eq!(first.status.code(), Some(1), "{text}");
    let o = fvd()
        .args(["status", FAMILY, "--json", "--repo"])
        .arg(root)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for c in v["components"].as_array().unwrap() {
        assert_eq!(c["status"], "blocked", "{c}\n{text}");
        assert_eq!(c["runs"], 1, "{c}");
        let reason = c["reason"].as_str().unwrap();
        assert!(reason.starts_with("debug_red: "), "{c}");
        assert!(!reason.contains("environment"), "{c}");
    }
    assert!(!text.contains("could not run on worker"), "{text}");
}

/// A regression, then the porter's fix whose run fails on the environment,
/// then the pass (issue #41): the environment failure changes nothing in
/// `PORT_STATUS.md`, and the pass gives Current Phase back to the porter's
/// bytes.
#[test]
fn an_environment_failure_during_a_regression_changes_nothing() {
    environment_failure_during_a_regression("contract.md");
}

/// The same in a file without Current Phase, where fvd's section carries
/// the regression's line: the environment failure keeps it (it dropped
/// it, as if the component had passed: FastVideo's flux, minimax_h3 and
/// mmaudio).
#[test]
fn an_environment_failure_during_a_regression_keeps_fvds_section() {
    environment_failure_during_a_regression("native_components.md");
}

fn environment_failure_during_a_regression(shape: &str) {
    let original = std::fs::read_to_string(fixtures().join("status_shapes").join(shape)).unwrap();
    let dir = repo(&original, &parts([&[], &[], &[], &[]]));
    let root = dir.path();
    let first = submit(root, &[]);
    assert_eq!(first.status.code(), Some(1), "{}", out(&first));
    let red = read(root);
    assert!(red.contains("(regression)"), "{red}");
    // The fix needs a package this machine does not have.
    std::fs::write(
        root.join("pkg/vae.py"),
        format!("import fvd_e2e_not_installed_pkg\n{VAE_FIXED}"),
    )
    .unwrap();
    git(root, &["commit", "-qm", "fix the vae scale", "pkg/vae.py"]);
    let env = submit(root, &[]);
    assert_eq!(env.status.code(), Some(4), "{}", out(&env));
    assert_eq!(read(root), red, "an environment failure changed the file");
    // The package is not needed after all.
    std::fs::write(root.join("pkg/vae.py"), VAE_FIXED).unwrap();
    git(root, &["commit", "-qm", "drop the import", "pkg/vae.py"]);
    let green = submit(root, &[]);
    assert_eq!(
        component_status(root, "vae"),
        "non_skip_pass",
        "{}",
        out(&green)
    );
    let after = read(root);
    let phase = |t: &str| -> String {
        t.split("## Current Phase")
            .nth(1)
            .and_then(|r| r.split("\n## ").next())
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(phase(&after), phase(&original), "{after}");
    assert_only_evidence(&original, &after, Phase::Same);
}

/// The section of `text` under `## NAME`, up to the next section.
fn section(text: &str, name: &str) -> String {
    text.split(&format!("## {name}\n"))
        .nth(1)
        .and_then(|r| r.split("\n## ").next())
        .unwrap_or_default()
        .to_string()
}

/// What a person writes into lines fvd wrote during a regression (the
/// Resolution of fvd's open regression row, the owner fvd set) is theirs
/// when the component passes again (issue #41).
#[test]
fn a_person_s_words_in_fvd_s_lines_are_kept_through_the_pass() {
    let original = std::fs::read_to_string(fixtures().join("status_shapes/contract.md")).unwrap();
    let dir = repo(&original, &parts([&[], &[], &[], &[]]));
    let root = dir.path();
    let first = submit(root, &[]);
    assert_eq!(first.status.code(), Some(1), "{}", out(&first));
    let red = read(root);
    let row = red
        .lines()
        .find(|l| l.starts_with("| I002 |") && l.contains("regression"))
        .unwrap_or_else(|| panic!("fvd's regression row:\n{red}"))
        .to_string();
    assert!(row.ends_with("| open |  |"), "{row}");
    let note = "alice: the scale constant, see PR 12";
    let edited = red
        .replace(
            &row,
            &row.replace("| open |  |", &format!("| open | {note} |")),
        )
        .replace("- owner: `component:vae`", "- owner: `alice`");
    assert_ne!(edited, red);
    std::fs::write(root.join(STATUS), &edited).unwrap();
    std::fs::write(root.join("pkg/vae.py"), VAE_FIXED).unwrap();
    git(root, &["commit", "-qm", "fix the vae scale", "pkg/vae.py"]);
    let green = submit(root, &[]);
    assert_eq!(
        component_status(root, "vae"),
        "non_skip_pass",
        "{}",
        out(&green)
    );
    let after = read(root);
    let row = after
        .lines()
        .find(|l| l.starts_with("| I002 |"))
        .unwrap()
        .to_string();
    assert!(row.contains("| resolved |"), "{row}");
    assert!(
        row.contains(note),
        "the person's resolution was dropped: {row}"
    );
    assert!(row.contains("passed in fvd run"), "{row}");
    let phase = section(&after, "Current Phase");
    assert!(phase.contains("- owner: `alice`"), "{phase}");
    // fvd's own values went back to the porter's
    assert!(phase.contains("phase_11_post_parity_handoff"), "{phase}");
    assert!(!phase.contains("moved back"), "{phase}");
}

/// An all-pass run on a file at P6 moves it on to P7 and keeps the
/// porter's values it replaced (their status note, owner and date) in one
/// bullet; a regression after it brings the porter's values back, and the
/// pass after that moves on again with them kept (issue #41).
#[test]
fn moving_forward_keeps_the_porter_s_phase_values() {
    let original = std::fs::read_to_string(fixtures().join("status_shapes/contract.md"))
        .unwrap()
        .replace(
            "- phase: `phase_11_post_parity_handoff`\n- status: `complete`\n- owner: `orchestrator`\n- last_updated: `2026-06-02`",
            "- phase: `phase_6_component_parity_debug`\n- status: in_progress; waiting on vae review\n- owner: alice\n- last_updated: 2026-07-01",
        );
    assert!(original.contains("waiting on vae review"));
    let pass = |name: &'static str| Part {
        name,
        aliases: &[],
        body: "assert True",
        paths: &[],
    };
    let parts = vec![
        pass("transformer"),
        Part {
            name: "vae",
            aliases: &[],
            body: "assert os.environ.get('WIDGET_VAE', '1') == '1' and open(os.path.join(os.path.dirname(__file__), 'vae_state.txt')).read().strip() == 'ok'",
            paths: &[],
        },
        pass("text_encoder"),
        pass("scheduler"),
    ];
    let dir = repo(&original, &parts);
    let root = dir.path();
    let state = root.join("tests/local_tests/widget/vae_state.txt");
    std::fs::write(&state, "ok\n").unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-qm", "vae state"]);
    let porter = [
        "\"in_progress; waiting on vae review\"",
        "\"alice\"",
        "\"2026-07-01\"",
    ];
    let first = submit(root, &[]);
    assert_eq!(first.status.code(), Some(0), "{}", out(&first));
    let green = read(root);
    let phase = section(&green, "Current Phase");
    assert!(
        phase.contains("phase_7_pipeline_stages_variants"),
        "{phase}"
    );
    assert!(phase.contains("moved forward from phase:"), "{phase}");
    for v in porter {
        assert!(phase.contains(v), "{v} lost:\n{phase}");
    }
    // A regression: the porter's values come back into the record.
    std::fs::write(&state, "broken\n").unwrap();
    git(root, &["commit", "-qm", "break the vae", "-a"]);
    let red = submit(root, &["--rerun"]);
    assert_eq!(red.status.code(), Some(1), "{}", out(&red));
    let phase = section(&read(root), "Current Phase");
    assert!(phase.contains("- status: `blocked`"), "{phase}");
    assert!(!phase.contains("moved forward"), "{phase}");
    for v in porter {
        assert!(phase.contains(v), "{v} lost:\n{phase}");
    }
    // Passing again: forward once more, the porter's values kept.
    std::fs::write(&state, "ok\n").unwrap();
    git(root, &["commit", "-qm", "fix the vae", "-a"]);
    let again = submit(root, &["--rerun"]);
    assert_eq!(again.status.code(), Some(0), "{}", out(&again));
    let after = read(root);
    let phase = section(&after, "Current Phase");
    assert!(
        phase.contains("phase_7_pipeline_stages_variants"),
        "{phase}"
    );
    assert!(!phase.contains("moved back"), "{phase}");
    for v in porter {
        assert!(phase.contains(v), "{v} lost:\n{phase}");
    }
    // and a resubmit of the same state writes nothing
    let same = submit(root, &[]);
    assert_eq!(read(root), after, "{}", out(&same));
    // nor says anything stale about the regression (issue #41)
    for o in [&again, &same] {
        assert!(!says_blocked(&out(o), "vae"), "{}", out(o));
    }
    let status = fvd()
        .args(["status", FAMILY, "--repo"])
        .arg(root)
        .output()
        .unwrap();
    assert!(!says_blocked(&out(&status), "vae"), "{}", out(&status));
}

/// Whether a gate refusal in `text` names `component` as blocked, alone
/// (`component vae is blocked (…)`) or in a list (`components a, vae are
/// blocked (…)`).
fn says_blocked(text: &str, component: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim_start().trim_start_matches("- ");
        (l.starts_with(&format!("component {component} is blocked"))
            || l.starts_with("components ") && l.contains(" are blocked"))
            && l.split([' ', ',']).any(|w| w == component)
    })
}

/// The run number after an environment failure (issue #41 item 5): the
/// console, `PORT_STATUS.md` and `fvd logs` name one run, the store's (the
/// failed environment's run counts no verdict but keeps its number).
#[test]
fn the_console_the_file_and_logs_name_the_same_run() {
    let original = std::fs::read_to_string(fixtures().join("status_shapes/contract.md")).unwrap();
    let dir = repo(&original, &parts([&[], &[], &[], &[]]));
    let root = dir.path();
    let first = submit(root, &[]);
    assert_eq!(first.status.code(), Some(1), "{}", out(&first));
    std::fs::write(
        root.join("pkg/vae.py"),
        format!("import fvd_e2e_not_installed_pkg\n{VAE_FIXED}"),
    )
    .unwrap();
    git(root, &["commit", "-qm", "fix the vae scale", "pkg/vae.py"]);
    let env = submit(root, &[]);
    assert_eq!(env.status.code(), Some(4), "{}", out(&env));
    std::fs::write(root.join("pkg/vae.py"), VAE_FIXED).unwrap();
    git(root, &["commit", "-qm", "drop the import", "pkg/vae.py"]);
    let green = submit(root, &[]);
    let text = out(&green);
    // the console: the vae's last line names its run
    let said = text
        .lines()
        .filter(|l| l.trim_start().starts_with("vae ") && l.contains("non_skip_pass"))
        .filter_map(|l| l.split("  run ").nth(1))
        .filter_map(|r| r.split_whitespace().next())
        .next_back()
        .unwrap_or_else(|| panic!("no run on the vae's line:\n{text}"))
        .to_string();
    // the file: the vae's evidence
    let file = read(root);
    let row = file
        .lines()
        .find(|l| l.starts_with("| vae |") && l.contains("[fvd "))
        .unwrap_or_else(|| panic!("{file}"));
    let written = row
        .split(" run ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_default();
    // fvd logs: the run it shows
    let logs = fvd()
        .args(["logs", FAMILY, "vae", "--json", "--repo"])
        .arg(root)
        .output()
        .unwrap();
    let first_line = String::from_utf8_lossy(&logs.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    let v: serde_json::Value = serde_json::from_str(&first_line).unwrap_or_default();
    let shown = v["run"]["run_no"].to_string();
    assert_eq!(said, written, "console vs file:\n{text}\n{row}");
    assert_eq!(written, shown, "file vs logs:\n{row}\n{first_line}");
}
