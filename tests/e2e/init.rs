//! `fvd init` end to end: the real binary in a git checkout laid out like
//! FastVideo (a family folder with its status file, README and tests, a
//! pipeline test elsewhere), the file it writes, and the refusal to
//! overwrite it without `--force`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::fvd;

const STATUS: &str = "# Wren Port Status

## Summary

- model_family: `wren`
- workload_types: `T2V`
- official_ref: `https://example.org/wren/wren-ref`
- official_ref_dir: `WrenRef/`
- hf_weights_path: `example/Wren-1B`
- local_weights_dir: `official_weights/wren`
- source_layout: `diffusers`
- local_tests_readme: `tests/local_tests/wren/README.md`

## Component Matrix

| Component | Type | Reuse/Port | Official Definition | Official Instantiation | FastVideo Target | Prototype | Conversion | Parity | Open Issues |
|---|---|---|---|---|---|---|---|---|---|
| Transformer (`WrenDiT`) | dit | ported | `WrenRef/dit.py` | `WrenRef/run.py` | `fastvideo/models/dits/wren.py` | pass | not_required | debug_red | none |
| text_encoder/tokenizer | encoder | reused | `WrenRef/te.py` | `WrenRef/run.py` | `fastvideo/models/encoders/t5.py` | pass | not_required | non_skip_pass | none |
| pipeline | pipeline | ported | `WrenRef/pipe.py` | `WrenRef/run.py` | `fastvideo/pipelines/basic/wren/` | pass | | not_started | none |

## Conversion State

- conversion_script: not required
- converted_weights_dir: none
- source_layout: `diffusers`
- strict_load_status: `pass`
- passthrough_components: `all`
- retry_history: `none`

## Parity Commands

| Scope | Command | Last Result | Notes |
|---|---|---|---|
| transformer | `PYTHONPATH=/work/FastVideo python -m pytest tests/local_tests/wren/test_wren_transformer_parity.py tests/local_tests/wren/test_wren_attention_parity.py -q -rs` | 1_failed | block drift |
| text_encoder | `python -m pytest tests/local_tests/wren/test_wren_text_encoder_parity.py` | non_skip_pass | |
| pipeline_smoke | `python -m pytest tests/local_tests/pipelines/test_wren_pipeline_smoke.py -q` | pass | |
| demo | `python /tmp/wren_demo.py` | generated | |

## Open Questions

| ID | Question | Owner | Needed By Phase | Status | Resolution |
|---|---|---|---|---|---|

## Escape Hatches

| ID | Phase | Decision Type | Question | Recommended Option | Status | Resolution |
|---|---|---|---|---|---|---|
";

/// No environment status yet: official_env_status is a decision to make.
const README: &str = "# Wren Local Tests

| Field | Value |
|---|---|
| Official commit/version | `9a8b7c6d` |
| HF revision | default |

The gated base model needs `HF_TOKEN` (its name only).
";

const LOADER_TEST: &str = "from fastvideo.models.loader.component_loader import TransformerLoader\n\n\ndef test_it():\n    TransformerLoader().load(p, a)\n";
const DIRECT_TEST: &str = "from fastvideo.models.dits.wren import WrenAttention\n\n\ndef test_it():\n    WrenAttention(4)\n";
const PLAIN_TEST: &str = "def test_it():\n    assert True\n";

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=fvd-test",
            "-c",
            "user.email=fvd-test@localhost",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A committed checkout named `FastVideo` inside a temp folder.
fn checkout(tmp: &Path) -> PathBuf {
    let repo = tmp.join("FastVideo");
    let fam = repo.join("tests/local_tests/wren");
    std::fs::create_dir_all(&fam).unwrap();
    std::fs::create_dir_all(repo.join("tests/local_tests/pipelines")).unwrap();
    for (path, text) in [
        ("tests/local_tests/wren/PORT_STATUS.md", STATUS),
        ("tests/local_tests/wren/README.md", README),
        ("tests/local_tests/wren/__init__.py", ""),
        (
            "tests/local_tests/wren/test_wren_transformer_parity.py",
            LOADER_TEST,
        ),
        (
            "tests/local_tests/wren/test_wren_attention_parity.py",
            DIRECT_TEST,
        ),
        (
            "tests/local_tests/wren/test_wren_text_encoder_parity.py",
            LOADER_TEST,
        ),
        ("tests/local_tests/wren/test_wren_registry.py", PLAIN_TEST),
        (
            "tests/local_tests/pipelines/test_wren_pipeline_smoke.py",
            PLAIN_TEST,
        ),
        (".gitignore", "WrenRef/\nofficial_weights/\n"),
    ] {
        std::fs::write(repo.join(path), text).unwrap();
    }
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "wren port folder"]);
    repo
}

fn init(repo: &Path, extra: &[&str]) -> Output {
    fvd()
        .args(["init", "--family", "wren", "--repo"])
        .arg(repo)
        .args(extra)
        .output()
        .expect("run fvd init")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn init_writes_the_spec_refuses_to_overwrite_and_force_rewrites() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = checkout(tmp.path());
    let spec_path = repo.join("tests/local_tests/wren/port.toml");

    let out = init(&repo, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let shown = spec_path.display().to_string();
    assert!(stdout.starts_with(&format!("wrote {shown}\n")), "{stdout}");
    let written = std::fs::read_to_string(&spec_path).expect("port.toml written");

    // it parses, with the components the status names
    let spec = fvd_spec::parse(&spec_path, &written).expect("the spec parses");
    let names: Vec<&str> = spec.parity_components().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["transformer", "text_encoder"]);
    // the family's pipeline smoke test is P7's
    let steps: Vec<&str> = spec.pipeline_steps().map(|c| c.name.as_str()).collect();
    assert_eq!(steps, ["pipeline_smoke"]);
    assert!(
        stdout.contains("pipeline and quality (1):\n  pipeline smoke: "),
        "{stdout}"
    );
    let t = &spec.components[0];
    assert_eq!(t.parity_tests.len(), 2);
    assert_eq!(t.coverage_scope, "both");
    assert_eq!(
        t.set_env.get("PYTHONPATH").map(String::as_str),
        Some("{repo}")
    );
    assert_eq!(spec.components[1].aliases, ["text_encoder/tokenizer"]);
    assert_eq!(
        spec.prep.get("needs_conversion").map(String::as_str),
        Some("no")
    );
    assert_eq!(
        spec.prep.get("hf_token_env").map(String::as_str),
        Some("HF_TOKEN")
    );

    // the summary names each placeholder by file:line, and the file agrees
    assert!(stdout.contains("components (2):"), "{stdout}");
    assert!(stdout.contains("placeholders left (3):"), "{stdout}");
    for field in [
        "prep.dependency_changes",
        "prep.official_env_status",
        "prep.next_step",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.ends_with(&format!(": {field}")))
            .unwrap_or_else(|| panic!("{field} not reported: {stdout}"));
        let no: usize = line
            .trim()
            .strip_prefix(&format!("{shown}:"))
            .and_then(|r| r.split(':').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no file:line in {line}"));
        let key = field.trim_start_matches("prep.");
        let at = written.lines().nth(no - 1).unwrap_or_default();
        assert!(
            at.starts_with(&format!("{key} = \"<fill in: ")),
            "line {no}: {at}"
        );
    }
    // the test files no component runs, each with its reason
    assert!(stdout.contains("test files not used (1):"), "{stdout}");
    assert!(
        stdout.contains("tests/local_tests/wren/test_wren_registry.py: registry check"),
        "{stdout}"
    );
    assert!(
        stdout
            .contains("  pipeline smoke: tests/local_tests/pipelines/test_wren_pipeline_smoke.py"),
        "{stdout}"
    );
    assert!(written.contains("#   Parity Commands row `demo`: does not run pytest on test files: python /tmp/wren_demo.py"));

    // a second init is refused and leaves the file alone
    std::fs::write(&spec_path, format!("{written}# edited by hand\n")).unwrap();
    let again = init(&repo, &[]);
    let stderr = text(&again.stderr);
    assert_eq!(again.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{shown} already exists; pass --force to rewrite it"
        )),
        "{stderr}"
    );
    assert!(
        std::fs::read_to_string(&spec_path)
            .unwrap()
            .ends_with("# edited by hand\n")
    );

    // --force writes it again from the checkout
    let forced = init(&repo, &["--force"]);
    assert_eq!(forced.status.code(), Some(0), "{}", text(&forced.stderr));
    assert_eq!(std::fs::read_to_string(&spec_path).unwrap(), written);
}

#[test]
fn init_refuses_a_missing_family_folder_and_a_bad_family_name() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = checkout(tmp.path());
    let out = fvd()
        .args(["init", "--family", "heron", "--repo"])
        .arg(&repo)
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}: no such family folder",
            repo.join("tests/local_tests/heron").display()
        )),
        "{stderr}"
    );
    let out = fvd()
        .args(["init", "--family", "Wren", "--repo"])
        .arg(&repo)
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("family \"Wren\" is not a lowercase identifier"),
        "{stderr}"
    );
    assert!(!repo.join("tests/local_tests/wren/port.toml").exists());
}

/// A family that was never initialised (issue #41): `submit` names what is
/// missing and the command that writes it, not a raw `No such file or
/// directory`; a family that has no folder at all is named as such.
#[test]
fn submit_of_a_family_without_a_spec_says_how_to_write_one() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = checkout(tmp.path());
    let out = fvd()
        .args(["submit", "--family", "wren", "--repo"])
        .arg(&repo)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("family wren has no spec:")
            && err.contains("tests/local_tests/wren/port.toml does not exist")
            && err.contains("`fvd init --family wren`"),
        "{err}"
    );
    assert!(!err.contains("os error"), "{err}");
    let out = fvd()
        .args(["submit", "--family", "nope", "--repo"])
        .arg(&repo)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no family nope in") && err.contains("tests/local_tests/nope does not exist"),
        "{err}"
    );
}

/// A never-initialised family in every reader (issue #41 item 5): `status`,
/// `logs` and `attempts` name its missing `port.toml` and `fvd init`, with
/// or without an embedded state, and a `--repo` that is a mistyped family
/// folder is no raw `No such file or directory` for `submit` either.
#[test]
fn readers_of_a_never_initialised_family_name_its_spec_and_init() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = checkout(tmp.path());
    let run = |args: &[&str]| {
        let out = fvd().args(args).arg("--repo").arg(&repo).output().unwrap();
        (out.status.code(), text(&out.stderr))
    };
    let readers: [&[&str]; 4] = [
        &["status", "wren"],
        &["logs", "wren", "transformer"],
        &["attempts", "wren", "transformer"],
        &["status", "wern"],
    ];
    // no embedded state yet, then one another family's submit left
    for round in 0..2 {
        for args in readers {
            let (code, err) = run(args);
            let family = args[1];
            assert_ne!(code, Some(0), "{args:?}: {err}");
            assert!(
                err.contains(&format!(
                    "tests/local_tests/{family}/port.toml does not exist"
                )) && err.contains(&format!("fvd init --family {family}")),
                "round {round}, {args:?}: {err}"
            );
            assert!(!err.contains("os error"), "{args:?}: {err}");
        }
        if round == 0 {
            std::fs::create_dir_all(repo.join(".fvd")).unwrap();
            let db = repo.join(".fvd/state.db");
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(fvd_store::Store::open_path(&db)).unwrap();
        }
    }
    // a mistyped family folder as --repo
    let out = fvd()
        .args(["submit", "--family", "wern", "--repo"])
        .arg(repo.join("tests/local_tests/wern"))
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        !err.contains("os error") && err.contains("fvd init --family wern"),
        "{err}"
    );
}

/// Issue #43: `fvd init` on the example port finds all seven components,
/// `time_shift` too (named by no status row, its test filed by kind beside
/// the family's folder), and takes a type from a test's kind folder.
#[test]
fn init_on_the_example_finds_every_component_filed_by_kind() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tinyport");
    crate::port::copy_tree(&example, &repo);
    let out = fvd()
        .args(["init", "--family", "tinyport", "--force", "--repo"])
        .arg(&repo)
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("components (7):"), "{stdout}");
    let path = repo.join("tests/local_tests/tinyport/port.toml");
    let spec = fvd_spec::parse(&path, &std::fs::read_to_string(&path).unwrap()).unwrap();
    let types: Vec<(&str, &str)> = spec
        .components
        .iter()
        .map(|c| (c.name.as_str(), c.component_type.as_str()))
        .collect();
    assert!(types.contains(&("time_shift", "generic")), "{types:?}");
    assert!(types.contains(&("refiner", "dit")), "{types:?}");
    assert!(stdout.contains("test files not used (0):"), "{stdout}");
}
