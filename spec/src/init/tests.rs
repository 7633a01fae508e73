//! Inputs here are the project's own, shaped like FastVideo port folders:
//! a complete contract status file, a status file of its own shape, and a
//! family with only a README and test files.

use std::collections::BTreeMap;
use std::path::Path;

use fvd_contracts::fields::BlockStruct;
use fvd_contracts::prep::PrepHandoff;

use super::render::{quote, repo_value};
use super::*;
use crate::{ComponentSpec, PortSpec};

const SKYLARK_STATUS: &str = r#"# Skylark Port Status

## Summary

- model_family: `skylark`
- workload_types: `T2V`; `I2V first-frame shim`
- official_ref: `https://example.org/skylark/skylark-ref`
- official_ref_dir: `SkylarkRef/`
- hf_weights_path: `example/Skylark-2B`
- local_weights_dir: `official_weights/skylark`
- source_layout: `raw_official`
- local_tests_readme: `/home/porter/FastVideo/tests/local_tests/skylark/README.md`

## Current Phase

- phase: `phase_6_component_parity`
- status: `in_progress`
- owner: `orchestrator`
- last_updated: `2026-01-05`

## Component Matrix

| Component | Type | Reuse/Port | Official Definition | Official Instantiation | FastVideo Target | Prototype | Conversion | Parity | Open Issues |
|---|---|---|---|---|---|---|---|---|---|
| Transformer (`SkylarkDiT`) | dit | ported | `SkylarkRef/dit.py` | `SkylarkRef/run.py::build` | `fastvideo/models/dits/skylark.py` | pass | key_map_pass | debug_red | none |
| vae | vae | reused | `SkylarkRef/vae.py` | `SkylarkRef/run.py::build` | `fastvideo/models/vaes/wanvae.py` | pass | not_required | non_skip_pass | none |
| text_encoder/tokenizer | encoder | reused | `SkylarkRef/t5.py` | `SkylarkRef/run.py::build` | `fastvideo/models/encoders/t5.py` | pass | not_required | non_skip_pass | none |
| noise_schedule | generic | ported | `SkylarkRef/schedule.py` | `SkylarkRef/run.py::sample` | `fastvideo/models/schedulers/skylark.py` | pass | not_required | scaffold_skip | Q002 |
| pipeline | pipeline | ported | `SkylarkRef/pipeline.py` | `SkylarkRef/run.py::main` | `fastvideo/pipelines/basic/skylark/` | pass | model_index_pass | not_started | none |

## Conversion State

- conversion_script: `scripts/checkpoint_conversion/skylark_to_diffusers.py`
- converted_weights_dir: `converted_weights/skylark`
- source_layout: `raw_official`
- strict_load_status: `pass`
- passthrough_components: `vae and text encoder come from the base model`
- retry_history: `none`

## Parity Commands

| Scope | Command | Last Result | Notes |
|---|---|---|---|
| transformer | `PYTHONPATH=/home/porter/FastVideo ATTN_BACKEND=TORCH_SDPA python -m pytest tests/local_tests/skylark/test_skylark_transformer_parity.py tests/local_tests/skylark/test_skylark_block_parity.py -q -rs` | 3_passed_1_failed | block 7 drifts |
| vae | `python -m pytest tests/local_tests/skylark/test_skylark_vae_parity.py -v -s` | non_skip_pass | encode and decode |
| text_encoder | `pytest tests/local_tests/skylark/test_skylark_text_encoder_parity.py` | non_skip_pass | hidden states match |
| noise_schedule | `SKYLARK_API_TOKEN=abcd1234efgh5678ijkl9012mnop python -m pytest tests/local_tests/skylark/test_skylark_noise_schedule_parity.py tests/local_tests/skylark/test_skylark_schedule_conversion.py -q` | skipped | needs the gated config |
| smoke_video | `PYTHONPATH=/home/porter/FastVideo python /tmp/skylark_smoke.py` | generated | 9 frames |
| remote_ssim | `HF_TOKEN=hf_Zq8mW3xR7tY1uI9oP2aS4dF6gH0jK5lL modal run /tmp/skylark_ssim.py` | pass | on a rented card |
| pipeline_smoke | `python -m pytest tests/local_tests/pipelines/test_skylark_pipeline_smoke.py -q` | pass | two steps |
| suite | `python -m pytest tests/local_tests/skylark/ -q` | 11 passed | everything |

## Open Questions

| ID | Question | Owner | Needed By Phase | Status | Resolution |
|---|---|---|---|---|---|
| Q001 | Is bf16 the dtype the reference runs in? | user | prep | resolved | yes, bf16 |
| Q002 | Does the schedule shift apply at step 0? | component:noise_schedule | Phase 6 | open | |

## Issues And Blockers

| ID | Phase | Component | Severity | Issue | Evidence | Owner | Status | Resolution |
|---|---|---|---|---|---|---|---|---|

## Escape Hatches

| ID | Phase | Decision Type | Question | Recommended Option | Status | Resolution |
|---|---|---|---|---|---|---|

## Decisions

| Date | Decision | Rationale | Impact |
|---|---|---|---|

## Handoff Notes

- block 7 of the transformer drifts after the norm.
"#;

const SKYLARK_README: &str = "# Skylark Local Tests

## Reference Assets

| Field | Value |
|---|---|
| Model family | `skylark` |
| Official commit/version | `4f2c9e1d0b7a` |
| HF revision | `<TODO>` |
| Needs conversion | `yes` |

Gated downloads read the token from `HF_TOKEN`; write its name here, never its value.

## Official Environment Status

```text
dependency_changes: installed no-deps editable
official_env_status: imports_ok
```
";

const TRANSFORMER_TEST: &str = "import torch\nfrom fastvideo.models.loader.component_loader import TransformerLoader\n\n\ndef test_forward():\n    model = TransformerLoader().load(path, args)\n    assert torch.cuda.is_available()\n";
const BLOCK_TEST: &str = "from fastvideo.models.dits.skylark import SkylarkBlock\n\n\ndef test_block():\n    block = SkylarkBlock(cfg)\n";
const VAE_TEST: &str = "from fastvideo.models.vaes.wanvae import AutoencoderKLWan\n\n\ndef test_encode():\n    vae = AutoencoderKLWan(cfg).to('cuda')\n";
const ENCODER_TEST: &str = "from fastvideo.models.loader.component_loader import (\n    TextEncoderLoader,\n)\n\n\ndef test_hidden():\n    enc = TextEncoderLoader().load(p, a)\n";
const SCHEDULE_TEST: &str = "from fastvideo.models.schedulers.skylark import SkylarkSchedule as FVSchedule\n\n\ndef test_steps():\n    s = FVSchedule(shift=3.0)\n";
const EXTRA_TEST: &str = "from fastvideo.models.loader.component_loader import VAELoader\n\n\ndef test_extra():\n    VAELoader().load(p, a)\n";
const PLAIN_TEST: &str = "def test_it():\n    assert True\n";

/// A checkout: repo-relative path → text.
struct Repo {
    files: BTreeMap<String, String>,
}

impl Repo {
    fn new(files: &[(&str, &str)]) -> Self {
        Repo {
            files: files
                .iter()
                .map(|(p, t)| (p.to_string(), t.to_string()))
                .collect(),
        }
    }

    /// The `test_*.py` files of a family folder.
    fn tests_of(&self, family: &str) -> Vec<String> {
        let dir = format!("tests/local_tests/{family}/");
        self.files
            .keys()
            .filter(|p| {
                p.starts_with(&dir)
                    && pyfile::file_name(p).starts_with("test_")
                    && p.ends_with(".py")
            })
            .cloned()
            .collect()
    }

    fn init(&self, family: &str) -> Inferred {
        let dir = format!("tests/local_tests/{family}");
        let tests = self.tests_of(family);
        let input = Input {
            family,
            repo_name: "FastVideo",
            status: self
                .files
                .get(&format!("{dir}/PORT_STATUS.md"))
                .map(String::as_str),
            readme: self
                .files
                .get(&format!("{dir}/README.md"))
                .map(String::as_str),
            gitignore: self.files.get(".gitignore").map(String::as_str),
            tests: &tests,
        };
        infer(&input, &|p: &str| self.files.get(p).cloned()).expect("init infers a spec")
    }
}

fn skylark() -> Repo {
    Repo::new(&[
        ("tests/local_tests/skylark/PORT_STATUS.md", SKYLARK_STATUS),
        ("tests/local_tests/skylark/README.md", SKYLARK_README),
        (
            "tests/local_tests/skylark/test_skylark_transformer_parity.py",
            TRANSFORMER_TEST,
        ),
        (
            "tests/local_tests/skylark/test_skylark_block_parity.py",
            BLOCK_TEST,
        ),
        (
            "tests/local_tests/skylark/test_skylark_vae_parity.py",
            VAE_TEST,
        ),
        (
            "tests/local_tests/skylark/test_skylark_text_encoder_parity.py",
            ENCODER_TEST,
        ),
        (
            "tests/local_tests/skylark/test_skylark_noise_schedule_parity.py",
            SCHEDULE_TEST,
        ),
        (
            "tests/local_tests/skylark/test_skylark_upsampler_parity.py",
            EXTRA_TEST,
        ),
        (
            "tests/local_tests/skylark/test_skylark_conversion.py",
            PLAIN_TEST,
        ),
        (
            "tests/local_tests/skylark/test_skylark_schedule_conversion.py",
            PLAIN_TEST,
        ),
        (
            "tests/local_tests/skylark/test_skylark_registry.py",
            PLAIN_TEST,
        ),
        (
            "tests/local_tests/skylark/test_skylark_helpers.py",
            "X = 1\n",
        ),
        (
            "tests/local_tests/pipelines/test_skylark_pipeline_smoke.py",
            PLAIN_TEST,
        ),
        (
            ".gitignore",
            "# reference and weights\n/SkylarkRef/\nofficial_weights/\n*.pyc\n",
        ),
    ])
}

fn parsed(out: &Inferred) -> PortSpec {
    crate::parse(Path::new("port.toml"), &out.toml).unwrap_or_else(|e| panic!("{e}\n{}", out.toml))
}

fn component<'a>(spec: &'a PortSpec, name: &str) -> &'a ComponentSpec {
    spec.components
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no component {name}"))
}

/// The spec line holding `needle`, 1-based.
fn line_of(toml: &str, needle: &str) -> usize {
    toml.lines()
        .position(|l| l.contains(needle))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("{needle:?} not in\n{toml}"))
}

#[test]
fn a_complete_status_file_gives_a_spec_that_passes_p0() {
    let out = skylark().init("skylark");
    let spec = parsed(&out);
    assert_eq!(out.summary.placeholders, [], "{}", out.toml);
    assert_eq!(
        crate::preconditions::prep_conditions(&spec, Path::new("/r")),
        Vec::<String>::new(),
        "{}",
        out.toml
    );
    let p = |k: &str| spec.prep.get(k).map(String::as_str).unwrap_or_default();
    assert_eq!(p("model_family"), "skylark");
    assert_eq!(p("workload_types"), "T2V; I2V first-frame shim");
    assert_eq!(p("official_ref_dir"), "SkylarkRef/");
    assert_eq!(p("official_ref_commit"), "4f2c9e1d0b7a");
    assert_eq!(p("source_layout"), "raw_official");
    assert_eq!(p("needs_conversion"), "yes");
    assert_eq!(p("hf_token_env"), "HF_TOKEN");
    assert_eq!(p("dependency_changes"), "installed no-deps editable");
    assert_eq!(p("official_env_status"), "imports_ok");
    assert_eq!(p("next_step"), "add-model");
    assert_eq!(
        p("local_tests_readme"),
        "tests/local_tests/skylark/README.md"
    );
    assert_eq!(
        p("port_state_file"),
        "tests/local_tests/skylark/PORT_STATUS.md"
    );
    assert_eq!(
        p("gitignore_entries_added"),
        "/SkylarkRef/, official_weights/"
    );
    assert_eq!(
        p("components_seen"),
        "Transformer (SkylarkDiT), vae, text_encoder/tokenizer, noise_schedule, pipeline"
    );
    assert_eq!(
        p("open_questions"),
        "Q002: Does the schedule shift apply at step 0?"
    );
    assert_eq!(p("escape_hatch"), "none");
    // `unknown` with the search, on the line above
    assert_eq!(p("hf_revision"), "unknown");
    let at = line_of(&out.toml, "hf_revision = ");
    let above = out.toml.lines().nth(at - 2).unwrap_or_default();
    assert!(
        above.starts_with("# unknown; searched") && above.contains("leaves it open"),
        "{above}"
    );
    // every prep field of the contract is written
    for f in <PrepHandoff as BlockStruct>::FIELDS {
        assert!(spec.prep.contains_key(*f), "prep.{f} missing");
    }
}

#[test]
fn components_join_matrix_rows_and_parity_commands() {
    let out = skylark().init("skylark");
    let spec = parsed(&out);
    let names: Vec<&str> = spec.parity_components().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "transformer",
            "vae",
            "text_encoder",
            "noise_schedule",
            "upsampler"
        ]
    );

    // "Transformer (`SkylarkDiT`)" joined by its identity; a row running two
    // files with the checkout's absolute path on PYTHONPATH and its own flags
    let t = component(&spec, "transformer");
    assert_eq!(t.component_type, "dit");
    assert!(t.aliases.is_empty(), "{:?}", t.aliases);
    assert_eq!(
        t.parity_tests,
        [
            "tests/local_tests/skylark/test_skylark_transformer_parity.py",
            "tests/local_tests/skylark/test_skylark_block_parity.py"
        ]
    );
    assert_eq!(
        t.set_env.get("PYTHONPATH").map(String::as_str),
        Some("{repo}")
    );
    assert_eq!(
        t.set_env.get("ATTN_BACKEND").map(String::as_str),
        Some("TORCH_SDPA")
    );
    assert!(
        out.toml
            .contains("# PYTHONPATH was /home/porter/FastVideo (the porter's checkout)"),
        "{}",
        out.toml
    );
    assert_eq!(t.command, ["python", "-m", "pytest", "{test}", "-q", "-rs"]);
    assert_eq!(t.coverage_scope, "both");
    assert_eq!(t.gpus, 1);

    let v = component(&spec, "vae");
    assert_eq!(v.command, ["python", "-m", "pytest", "{test}", "-v", "-s"]);
    assert_eq!(v.coverage_scope, "implementation_subcomponent");
    assert_eq!(v.gpus, 1);

    // the matrix's `text_encoder/tokenizer` and the commands' `text_encoder`
    let e = component(&spec, "text_encoder");
    assert_eq!(e.aliases, ["text_encoder/tokenizer"]);
    assert_eq!(e.component_type, "encoder");
    assert_eq!(e.coverage_scope, "production_loader");
    assert_eq!(e.command, crate::DEFAULT_COMMAND, "no flags: the default");
    assert_eq!(e.gpus, 0);

    // a token-looking value is passed by name, never copied
    let n = component(&spec, "noise_schedule");
    assert_eq!(n.env, ["HF_TOKEN", "SKYLARK_API_TOKEN"]);
    assert!(n.set_env.is_empty());
    assert!(!out.toml.contains("abcd1234efgh5678ijkl9012mnop"));
    assert_eq!(n.component_type, "generic");
    // the conversion check run beside it does not decide the scope
    assert_eq!(n.coverage_scope, "implementation_subcomponent");
    assert!(
        out.toml.contains(
            "test_skylark_schedule_conversion.py is a conversion script test (not counted)"
        ),
        "{}",
        out.toml
    );

    // a parity-named file the status does not name is a component of its own
    let x = component(&spec, "upsampler");
    assert_eq!(
        x.parity_tests,
        ["tests/local_tests/skylark/test_skylark_upsampler_parity.py"]
    );
    assert_eq!(x.component_type, "upsampler");
    assert!(
        out.toml
            .contains("PORT_STATUS.md does not name this test file")
    );
}

#[test]
fn every_test_file_is_used_or_listed_with_its_reason() {
    let repo = skylark();
    let out = repo.init("skylark");
    let spec = parsed(&out);
    let used: Vec<&str> = spec
        .components
        .iter()
        .flat_map(|c| c.parity_tests.iter().map(String::as_str))
        .collect();
    let reason = |file: &str| {
        out.summary
            .unused_tests
            .iter()
            .find(|u| u.what.ends_with(file))
            .map(|u| u.reason.clone())
    };
    for t in repo.tests_of("skylark") {
        let listed = reason(&t).is_some();
        assert!(
            used.contains(&t.as_str()) != listed,
            "{t}: used {} listed {listed}",
            used.contains(&t.as_str())
        );
        if listed {
            assert!(
                out.toml.contains(&format!("#   {t}: ")),
                "{t} not in the closing comment"
            );
        }
    }
    assert_eq!(
        reason("test_skylark_conversion.py").as_deref(),
        Some("conversion script test")
    );
    assert_eq!(
        reason("test_skylark_registry.py").as_deref(),
        Some("registry check")
    );
    assert_eq!(
        reason("test_skylark_helpers.py").as_deref(),
        Some("defines no test function")
    );
    // the family's pipeline smoke test is wired as [pipeline], P7's
    assert_eq!(
        reason("tests/local_tests/pipelines/test_skylark_pipeline_smoke.py"),
        None
    );
    let spec = parsed(&out);
    assert_eq!(
        spec.pipeline.as_ref().and_then(|p| p.smoke_test.as_deref()),
        Some("tests/local_tests/pipelines/test_skylark_pipeline_smoke.py")
    );
    assert!(
        out.summary.later.contains(
            &"pipeline smoke: tests/local_tests/pipelines/test_skylark_pipeline_smoke.py"
                .to_string()
        ),
        "{:?}",
        out.summary.later
    );
    // commands that are not pytest on test files, and the pipeline row
    let rows: Vec<(&str, &str)> = out
        .summary
        .unused_rows
        .iter()
        .map(|u| (u.what.as_str(), u.reason.as_str()))
        .collect();
    for (what, why) in [
        ("Component Matrix row `pipeline`", "type pipeline"),
        (
            "Parity Commands row `smoke_video`",
            "does not run pytest on test files",
        ),
        (
            "Parity Commands row `remote_ssim`",
            "does not run pytest on test files",
        ),
        ("Parity Commands row `suite`", "runs pytest on a folder"),
        (
            "Parity Commands row `pipeline_smoke`",
            "not a component parity test",
        ),
    ] {
        assert!(
            rows.iter().any(|(w, r)| *w == what && r.starts_with(why)),
            "{what}: {rows:?}"
        );
    }
    // a token in a command is never copied; the rest of the row is
    assert!(
        out.toml
            .contains("[redacted] modal run /tmp/skylark_ssim.py"),
        "{}",
        out.toml
    );
    assert!(!out.toml.contains("hf_Zq8mW3"));
}

#[test]
fn placeholders_are_explicit_commented_and_the_only_p0_findings() {
    // the same port before prep wrote down the environment and conversion
    let mut repo = skylark();
    let readme = SKYLARK_README
        .replace("dependency_changes: installed no-deps editable\n", "")
        .replace(
            "official_env_status: imports_ok\n",
            "official_env_status: <TODO>\n",
        )
        .replace("| Needs conversion | `yes` |\n", "")
        .replace("`HF_TOKEN`", "the usual variable");
    let status = SKYLARK_STATUS
        .replace(
            "`scripts/checkpoint_conversion/skylark_to_diffusers.py`",
            "",
        )
        .replace("`converted_weights/skylark`", "`none`");
    repo.files
        .insert("tests/local_tests/skylark/README.md".into(), readme);
    repo.files
        .insert("tests/local_tests/skylark/PORT_STATUS.md".into(), status);
    let out = repo.init("skylark");
    let spec = parsed(&out);
    let fields: Vec<&str> = out
        .summary
        .placeholders
        .iter()
        .map(|p| p.field.as_str())
        .collect();
    assert_eq!(
        fields,
        [
            "prep.needs_conversion",
            "prep.hf_token_env",
            "prep.dependency_changes",
            "prep.official_env_status",
            "prep.next_step",
        ]
    );
    let lines: Vec<String> = out.toml.lines().map(str::to_string).collect();
    for p in &out.summary.placeholders {
        let line = &lines[p.line - 1];
        assert!(line.contains("\"<fill in: "), "{p:?}: {line}");
        assert!(
            lines[p.line - 2].starts_with("# fill in: "),
            "{p:?}: no comment above"
        );
    }
    // P0 refuses each placeholder, and nothing else
    let unmet = crate::preconditions::prep_conditions(&spec, Path::new("/r"));
    assert!(!unmet.is_empty());
    let at: Vec<String> = out
        .summary
        .placeholders
        .iter()
        .map(|p| format!("port.toml:{}:", p.line))
        .collect();
    for u in &unmet {
        assert!(
            at.iter().any(|a| u.starts_with(a.as_str())),
            "not a placeholder: {u}"
        );
    }
    for a in &at {
        assert!(
            unmet.iter().any(|u| u.starts_with(a.as_str())),
            "{a} not refused: {unmet:?}"
        );
    }
}

#[test]
fn open_escape_hatches_leave_the_handoff_undecided() {
    let mut repo = skylark();
    let status = SKYLARK_STATUS.replace(
        "| ID | Phase | Decision Type | Question | Recommended Option | Status | Resolution |\n|---|---|---|---|---|---|---|\n",
        "| ID | Phase | Decision Type | Question | Recommended Option | Status | Resolution |\n|---|---|---|---|---|---|---|\n| E001 | Phase 6 | scope | Keep the 4-step preset? | 1 | open | |\n",
    );
    repo.files
        .insert("tests/local_tests/skylark/PORT_STATUS.md".into(), status);
    let out = repo.init("skylark");
    parsed(&out);
    assert!(
        out.summary
            .placeholders
            .iter()
            .any(|p| p.field == "prep.escape_hatch")
    );
    assert!(
        out.toml.contains("E001: Keep the 4-step preset?"),
        "{}",
        out.toml
    );
}

const HARRIER_README: &str = "# Harrier Local Tests

## Reference Assets

| Field | Value |
|---|---|
| Model family | `harrier` |
| Workload types | `T2V` (with sound) |
| Official reference | `example/Harrier` (local clone) |
| Local reference dir | `Harrier/` |
| Official commit/version | `<TODO>` |
| HF weights | `example/Harrier-Base` |
| Local weights dir | `<TODO>` |
| Source layout | `<TODO: diffusers / raw_official>` |
| Needs conversion | `<TODO>` |

## Tests in this directory

| Component | Test | Concerns | Status |
|---|---|---|---|
| `text encoder` (Qwen) | [`test_harrier_qwen_encoder.py`](./test_harrier_qwen_encoder.py) | encoder and connector | `<TODO>` |
| `text encoder` (Qwen, full) | [`test_harrier_qwen_parity.py`](./test_harrier_qwen_parity.py) | whole encoder | `<TODO>` |
| `transformer/DiT` | [`test_harrier.py`](./test_harrier.py) | video branch | `<TODO>` |
| `transformer/DiT` (audio branch) | [`test_harrier_audio.py`](./test_harrier_audio.py) | sound branch | `<TODO>` |
| `vae` (video) | [`test_harrier_vae.py`](./test_harrier_vae.py) | encode/decode | `<TODO>` |
| `vae` (video, loader path) | [`test_harrier_vae_loader_path.py`](./test_harrier_vae_loader_path.py) | through the loader | `<TODO>` |
| `vae` (audio) | [`test_harrier_audio_vae.py`](./test_harrier_audio_vae.py) | sound codec | `<TODO>` |
| `pipeline` (smoke) | [`test_harrier_pipeline_smoke.py`](./test_harrier_pipeline_smoke.py) | end to end | `<TODO>` |
| `registry` | [`test_harrier_registry.py`](./test_harrier_registry.py) | presets resolve | `<TODO>` |
";

fn harrier() -> Repo {
    let d = "tests/local_tests/harrier";
    let files: Vec<(String, &str)> = vec![
        (format!("{d}/README.md"), HARRIER_README),
        (format!("{d}/test_harrier_qwen_encoder.py"), ENCODER_TEST),
        (format!("{d}/test_harrier_qwen_parity.py"), BLOCK_TEST),
        (format!("{d}/test_harrier.py"), TRANSFORMER_TEST),
        (format!("{d}/test_harrier_audio.py"), TRANSFORMER_TEST),
        (format!("{d}/test_harrier_vae.py"), VAE_TEST),
        (format!("{d}/test_harrier_vae_loader_path.py"), EXTRA_TEST),
        (format!("{d}/test_harrier_audio_vae.py"), PLAIN_TEST),
        (format!("{d}/test_harrier_pipeline_smoke.py"), PLAIN_TEST),
        (format!("{d}/test_harrier_registry.py"), PLAIN_TEST),
        (
            format!("{d}/test_harrier_upsampler_parity.py"),
            SCHEDULE_TEST,
        ),
        (format!("{d}/test_harrier_notes.py"), "NOTES = []\n"),
    ];
    let refs: Vec<(&str, &str)> = files.iter().map(|(p, t)| (p.as_str(), *t)).collect();
    Repo::new(&refs)
}

#[test]
fn a_family_without_a_status_file_reads_the_readme_and_file_names() {
    let out = harrier().init("harrier");
    let spec = parsed(&out);
    let d = "tests/local_tests/harrier";
    let got: Vec<(&str, &str, Vec<String>)> = spec
        .parity_components()
        .map(|c| {
            (
                c.name.as_str(),
                c.component_type.as_str(),
                c.parity_tests
                    .iter()
                    .map(|t| t.trim_start_matches(&format!("{d}/")).to_string())
                    .collect(),
            )
        })
        .collect();
    let want: Vec<(&str, &str, Vec<String>)> = vec![
        (
            "text_encoder",
            "encoder",
            vec![
                "test_harrier_qwen_encoder.py".into(),
                "test_harrier_qwen_parity.py".into(),
            ],
        ),
        ("transformer", "dit", vec!["test_harrier.py".into()]),
        (
            "audio_transformer",
            "dit",
            vec!["test_harrier_audio.py".into()],
        ),
        (
            "vae",
            "vae",
            vec![
                "test_harrier_vae.py".into(),
                "test_harrier_vae_loader_path.py".into(),
            ],
        ),
        ("audio_vae", "vae", vec!["test_harrier_audio_vae.py".into()]),
        (
            "upsampler",
            "upsampler",
            vec!["test_harrier_upsampler_parity.py".into()],
        ),
    ];
    assert_eq!(got, want, "{}", out.toml);
    assert_eq!(component(&spec, "transformer").aliases, ["transformer/DiT"]);
    assert_eq!(component(&spec, "audio_vae").aliases, ["vae (audio)"]);
    // one file through a loader, one building classes: both
    assert_eq!(component(&spec, "text_encoder").coverage_scope, "both");
    assert_eq!(component(&spec, "vae").coverage_scope, "both");
    assert!(
        component(&spec, "audio_vae")
            .coverage_scope
            .starts_with("<fill in:")
    );

    let reason = |f: &str| {
        out.summary
            .unused_tests
            .iter()
            .find(|u| u.what == format!("{d}/{f}"))
            .map(|u| u.reason.as_str())
    };
    // the pipeline smoke test is P7's, not an unused file
    assert_eq!(reason("test_harrier_pipeline_smoke.py"), None);
    assert_eq!(
        spec.pipeline.as_ref().and_then(|p| p.smoke_test.clone()),
        Some(format!("{d}/test_harrier_pipeline_smoke.py"))
    );
    assert_eq!(
        spec.pipeline.as_ref().and_then(|p| p.parity_test.clone()),
        None
    );
    assert!(reason("test_harrier_registry.py").is_some_and(|r| r.starts_with("registry check")));
    assert_eq!(
        reason("test_harrier_notes.py"),
        Some("defines no test function")
    );

    let p = |k: &str| spec.prep.get(k).map(String::as_str).unwrap_or_default();
    assert_eq!(p("workload_types"), "T2V (with sound)");
    assert_eq!(p("official_ref_dir"), "Harrier/");
    assert_eq!(p("official_ref_commit"), "unknown");
    assert_eq!(p("source_layout"), "unknown");
    assert_eq!(
        p("port_state_file"),
        "tests/local_tests/harrier/PORT_STATUS.md"
    );
    assert_eq!(
        p("components_seen"),
        "text_encoder, transformer, audio_transformer, vae, audio_vae, upsampler"
    );
    let fields: Vec<&str> = out
        .summary
        .placeholders
        .iter()
        .map(|p| p.field.as_str())
        .collect();
    for f in [
        "prep.local_weights_dir",
        "prep.needs_conversion",
        "prep.hf_token_env",
        "prep.official_env_status",
        "component audio_vae: coverage_scope",
    ] {
        assert!(fields.contains(&f), "{f} not a placeholder: {fields:?}");
    }
    assert!(
        out.toml
            .contains("it does not exist yet, fvd writes it when the port ends")
    );
}

const KESTREL_STATUS: &str = "# Kestrel Port Status

Model family: kestrel
Official ref: example/Kestrel-1 (Diffusers layout)
Workload: T2I

## Component Status

| Component | Type | Parity test | Status | Notes |
|---|---|---|---|---|
| KestrelTransformer2DModel | DiT (ported) | fastvideo/tests/transformers/test_kestrel.py | PASS | bf16 tail |
| AutoencoderKL | VAE (reused) | tests/local_tests/kestrel/test_kestrel_loaders.py | PASS | loader |
| CLIPTextModel | encoder (reused) | tests/local_tests/kestrel/test_kestrel_loaders.py | PASS | loader |

## Conversion

No conversion script needed: the checkpoint already loads as published.

## Known Blockers

None.
";

#[test]
fn a_status_file_of_its_own_shape_still_gives_components() {
    let readme = "# Kestrel\n\n```bash\nhuggingface-cli download example/Kestrel-1 --local-dir official_weights/Kestrel-1\n```\n";
    let repo = Repo::new(&[
        ("tests/local_tests/kestrel/README.md", readme),
        (".gitignore", "official_weights/\n"),
        ("tests/local_tests/kestrel/PORT_STATUS.md", KESTREL_STATUS),
        (
            "tests/local_tests/kestrel/test_kestrel_loaders.py",
            ENCODER_TEST,
        ),
    ]);
    let out = repo.init("kestrel");
    let spec = parsed(&out);
    let names: Vec<(&str, &str)> = spec
        .components
        .iter()
        .map(|c| (c.name.as_str(), c.component_type.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("kestreltransformer2dmodel", "dit"),
            ("autoencoderkl", "vae"),
        ]
    );
    // two rows that run the same test file are one component, run once,
    // named by both rows
    let loaders = component(&spec, "autoencoderkl");
    assert_eq!(
        loaders.parity_tests,
        ["tests/local_tests/kestrel/test_kestrel_loaders.py"]
    );
    assert!(
        loaders.aliases.iter().any(|a| a == "CLIPTextModel"),
        "{:?}",
        loaders.aliases
    );
    assert_eq!(
        component(&spec, "kestreltransformer2dmodel").parity_tests,
        ["fastvideo/tests/transformers/test_kestrel.py"]
    );
    assert_eq!(
        component(&spec, "autoencoderkl").coverage_scope,
        "production_loader"
    );
    let p = |k: &str| spec.prep.get(k).map(String::as_str).unwrap_or_default();
    assert_eq!(p("needs_conversion"), "no");
    assert_eq!(p("source_layout"), "diffusers");
    assert_eq!(p("workload_types"), "T2I");
    // the id without the prose after it (issue #41)
    assert_eq!(p("official_ref"), "example/Kestrel-1");
    // from the README's download command
    assert_eq!(p("hf_weights_path"), "example/Kestrel-1");
    assert_eq!(p("local_weights_dir"), "official_weights/Kestrel-1");
    assert_eq!(p("gitignore_entries_added"), "official_weights/");
    // a file without a Summary has no Summary gaps to report
    assert!(!out.toml.contains("Summary leaves it open"), "{}", out.toml);
    // a test file outside the checkout: its scope cannot be read
    let at = line_of(&out.toml, "fastvideo/tests/transformers/test_kestrel.py\"") + 1;
    assert!(
        out.toml
            .lines()
            .nth(at - 1)
            .is_some_and(|l| l.starts_with("# fill in: ") && l.contains("not in this checkout")),
        "{}",
        out.toml
    );
    assert!(
        out.summary.unused_tests.is_empty(),
        "{:?}",
        out.summary.unused_tests
    );
}

#[test]
fn an_empty_family_still_writes_a_spec_that_parses() {
    let out = Repo::new(&[]).init("bare");
    let spec = parsed(&out);
    assert_eq!(spec.components.len(), 1);
    assert_eq!(spec.components[0].name, "unnamed");
    let fields: Vec<&str> = out
        .summary
        .placeholders
        .iter()
        .map(|p| p.field.as_str())
        .collect();
    assert!(
        fields.contains(&"component unnamed: parity_test"),
        "{fields:?}"
    );
}

#[test]
fn names_are_lowercase_identifiers_and_the_family_must_be_one() {
    let repo = harrier();
    let tests = repo.tests_of("harrier");
    let input = Input {
        family: "Harrier",
        repo_name: "FastVideo",
        status: None,
        readme: None,
        gitignore: None,
        tests: &tests,
    };
    let err = infer(&input, &|_| None).unwrap_err().to_string();
    assert!(
        err.contains("\"Harrier\" is not a lowercase identifier"),
        "{err}"
    );
    for out in [skylark().init("skylark"), harrier().init("harrier")] {
        for c in parsed(&out).components {
            assert!(
                !c.name.is_empty()
                    && c.name
                        .chars()
                        .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_'),
                "{}",
                c.name
            );
        }
    }
}

#[test]
fn checkout_paths_and_values() {
    assert_eq!(
        checkout_rel("/workspace/FastVideo/fastvideo/tests/t.py", "FastVideo").as_deref(),
        Some("fastvideo/tests/t.py")
    );
    assert_eq!(
        checkout_rel("/mnt/x/fastvideo-port-a/tests/local_tests/a/t.py", "repo").as_deref(),
        Some("tests/local_tests/a/t.py")
    );
    assert_eq!(
        checkout_rel("/data/elsewhere/tests/local_tests/a/t.py", "repo").as_deref(),
        Some("tests/local_tests/a/t.py")
    );
    assert_eq!(checkout_rel("/tmp/x.py", "repo"), None);
    assert_eq!(
        repo_value("/srv/checkout:/opt/lib", "checkout"),
        ("{repo}:/opt/lib".to_string(), true)
    );
    assert_eq!(
        repo_value("/srv/FastVideo/src", "x"),
        ("{repo}/src".to_string(), true)
    );
    assert_eq!(
        repo_value("/tmp/weights", "x"),
        ("/tmp/weights".to_string(), false)
    );
    assert_eq!(
        normalise_path("tests/local_tests/a/../pipelines/./t.py"),
        "tests/local_tests/pipelines/t.py"
    );
    assert_eq!(quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
    assert_eq!(type_of("DiT (ported)"), Some("dit"));
    assert_eq!(type_of("camera_conditioning"), None);
    assert_eq!(type_of("Text encoder"), Some("encoder"));
}

#[test]
fn readme_gaps_with_notes_and_a_recorded_absence_of_a_token() {
    let mut repo = harrier();
    let readme = HARRIER_README
        .replace("| Local weights dir | `<TODO>` |", "| Local weights dir | `<TODO>` (env: `HARRIER_ROOT`) |")
        .replace(
            "## Tests in this directory",
            "No token values here. Token env var found during\nprep: `none`.\n\n## Tests in this directory",
        );
    repo.files
        .insert("tests/local_tests/harrier/README.md".into(), readme);
    let out = repo.init("harrier");
    let spec = parsed(&out);
    let p = |k: &str| spec.prep.get(k).map(String::as_str).unwrap_or_default();
    assert_eq!(p("hf_token_env"), "none");
    assert!(
        p("local_weights_dir").starts_with("<fill in:"),
        "{}",
        p("local_weights_dir")
    );
}

/// A status file and README with the traps of real ones: a conversion
/// script "none for …", a key that contains `model_index_class`, a commit
/// glued to the reference, a `<pinned-clone>` in a command, node ids of
/// one file shared by two rows, the interpreter's `-B`, and tests outside
/// the family folder that only the README's gated commands name.
const LUMEN_STATUS: &str = "# Lumen Port Status

## Summary

- model_family: `lumen`
- workload_types: `T2I`
- official_ref: `https://example.org/lumen` at `a638721cf2271804d02738b69f2ad788c4a559fc`
- converted_model_index_classes: `LumenDensePipeline`; `LumenMoePipeline`
- local_tests_readme: `tests/local_tests/lumen/README.md`

## Component Matrix

| Component | Type | Reuse/Port | Official Definition | Official Instantiation | FastVideo Target | Prototype | Conversion | Parity | Open Issues |
|---|---|---|---|---|---|---|---|---|---|
| Encoder fp32 | text_encoder | reused | x | x | x | DONE | not_needed | PASS | none |
| Encoder bf16 | text_encoder | reused | x | x | x | DONE | not_needed | PASS | none |
| Dense DiT | DiT | port | x | x | x | pass | pass | exact | none |
| Wan VAE | VAE | reuse | x | x | x | pass | pass | exact | none |

## Conversion State

- conversion_script: none for the reused components or native transformer
- converted_weights_dir: none

## Parity Commands

| Scope | Command | Last Result | Notes |
|---|---|---|---|
| Encoder fp32 | `pytest tests/local_tests/lumen/test_lumen_encoder_parity.py::test_forward[fp32] -v -s` | PASS | x |
| Encoder bf16 | `python3 -B -m pytest tests/local_tests/lumen/test_lumen_encoder_parity.py::test_forward[bf16] -q -p no:cacheprovider` | PASS | x |
| Dense DiT ref | `LUMEN_REF_DIR=<pinned-clone> pytest tests/local_tests/lumen/test_lumen_extra_parity.py -v -s` | PASS | x |
";

const LUMEN_README: &str = "# Lumen\n\nRun each gated test alone:\n\n```bash\nPY=\"$HUB/.venv/bin/python\"\nLUMEN_RUN_GPU_TESTS=1 $PY -m pytest -v -s \\\n  tests/local_tests/transformers/test_lumen_dense_dit_parity.py\nLUMEN_RUN_GPU_TESTS=1 \\\n  $PY -m pytest -v -s tests/local_tests/vaes/test_lumen_vae_parity.py\n```\n";

#[test]
fn init_writes_only_what_the_checkout_says() {
    let test = "import torch\n\ndef test_forward():\n    assert True\n";
    let repo = Repo::new(&[
        ("tests/local_tests/lumen/PORT_STATUS.md", LUMEN_STATUS),
        ("tests/local_tests/lumen/README.md", LUMEN_README),
        ("tests/local_tests/lumen/test_lumen_encoder_parity.py", test),
        ("tests/local_tests/lumen/test_lumen_extra_parity.py", test),
        (
            "tests/local_tests/transformers/test_lumen_dense_dit_parity.py",
            test,
        ),
        ("tests/local_tests/vaes/test_lumen_vae_parity.py", test),
    ]);
    let out = repo.init("lumen");
    let spec = parsed(&out);
    let p = |k: &str| spec.prep.get(k).cloned().unwrap_or_default();
    // "none for …" is no conversion, not a recorded script
    assert_eq!(p("needs_conversion"), "no", "{}", out.toml);
    // `converted_model_index_classes` is not `model_index_class`
    assert_eq!(p("model_index_class"), "unknown", "{}", out.toml);
    // a commit glued to the reference is the reference's commit
    assert_eq!(p("official_ref"), "https://example.org/lumen");
    assert_eq!(
        p("official_ref_commit"),
        "a638721cf2271804d02738b69f2ad788c4a559fc"
    );
    // node ids kept: the two encoder rows run only their own tests
    assert_eq!(
        component(&spec, "encoder_fp32").parity_tests,
        ["tests/local_tests/lumen/test_lumen_encoder_parity.py::test_forward[fp32]"]
    );
    let bf16 = component(&spec, "encoder_bf16");
    assert_eq!(
        bf16.parity_tests,
        ["tests/local_tests/lumen/test_lumen_encoder_parity.py::test_forward[bf16]"]
    );
    // the project's own `python3 -B -m pytest` is read, its -B kept
    assert_eq!(
        bf16.command,
        [
            "python3",
            "-B",
            "-m",
            "pytest",
            "{test}",
            "-q",
            "-p",
            "no:cacheprovider"
        ]
    );
    // a placeholder in a command stays a fill-in, never a literal value
    let extra = spec
        .components
        .iter()
        .find(|c| {
            c.parity_tests
                .iter()
                .any(|t| t.ends_with("test_lumen_extra_parity.py"))
        })
        .expect("the extra row's component");
    let v = &extra.set_env["LUMEN_REF_DIR"];
    assert!(v.starts_with("<fill in:"), "{v}");
    assert!(
        out.summary
            .placeholders
            .iter()
            .any(|p| p.field.ends_with("set_env.LUMEN_REF_DIR")),
        "{:?}",
        out.summary.placeholders
    );
    // tests outside the family folder, found through the README's gated
    // commands, with their gates
    let dit = component(&spec, "dense_dit");
    assert_eq!(
        dit.parity_tests,
        ["tests/local_tests/transformers/test_lumen_dense_dit_parity.py"]
    );
    assert_eq!(dit.set_env["LUMEN_RUN_GPU_TESTS"], "1");
    let vae = component(&spec, "wan_vae");
    assert_eq!(
        vae.parity_tests,
        ["tests/local_tests/vaes/test_lumen_vae_parity.py"]
    );
    assert_eq!(vae.set_env["LUMEN_RUN_GPU_TESTS"], "1");
    // and P0 refuses what is still open, and nothing the file contradicts
    let unmet = crate::preconditions::prep_conditions(&spec, Path::new("/r"));
    assert!(
        unmet
            .iter()
            .any(|u| u.contains("set_env.LUMEN_REF_DIR is a placeholder")),
        "{unmet:?}"
    );
    let clash = crate::preconditions::status_conditions(&spec, LUMEN_STATUS, &|f| format!("p:{f}"));
    assert!(clash.is_empty(), "{clash:?}");
}

#[test]
fn p0_names_every_value_the_status_file_contradicts() {
    let out = Repo::new(&[("tests/local_tests/lumen/PORT_STATUS.md", LUMEN_STATUS)]).init("lumen");
    let mut spec = parsed(&out);
    spec.prep.insert("needs_conversion".into(), "yes".into());
    spec.prep
        .insert("official_ref_commit".into(), "ffffffffffff".into());
    spec.prep
        .insert("official_ref".into(), "https://example.org/other".into());
    let unmet =
        crate::preconditions::status_conditions(&spec, LUMEN_STATUS, &|f| format!("port.toml:{f}"));
    for want in [
        "port.toml:needs_conversion: prep.needs_conversion: is \"yes\" but PORT_STATUS.md Conversion State's conversion_script says \"none for the reused components or native transformer\"",
        "prep.official_ref_commit: is \"ffffffffffff\"",
        "prep.official_ref: is \"https://example.org/other\"",
    ] {
        assert!(unmet.iter().any(|u| u.contains(want)), "{want}: {unmet:#?}");
    }
    assert_eq!(unmet.len(), 3, "{unmet:#?}");
}

#[test]
fn rows_labelled_with_the_templates_word_join_by_their_files_only() {
    let status = "# Gear Port Status\n\n## Parity Commands\n\n| Scope | Command | Last Result | Notes |\n|---|---|---|---|\n| component | `python3 -B -m pytest tests/local_tests/generic/test_gear_embed_parity.py -q` | `non_skip_pass` | |\n| component | `python3 -B -m pytest tests/local_tests/vaes/test_gear_vae_parity.py -q` | `scaffold_skip` | |\n";
    let test = "def test_x():\n    assert True\n";
    let out = Repo::new(&[
        ("tests/local_tests/gear/PORT_STATUS.md", status),
        ("tests/local_tests/generic/test_gear_embed_parity.py", test),
        ("tests/local_tests/vaes/test_gear_vae_parity.py", test),
    ])
    .init("gear");
    let spec = parsed(&out);
    let tests: Vec<(&str, Vec<String>)> = spec
        .components
        .iter()
        .map(|c| (c.name.as_str(), c.parity_tests.clone()))
        .collect();
    // each row its own component, named by its file, never all on the first
    assert_eq!(
        tests,
        [
            (
                "embed",
                vec!["tests/local_tests/generic/test_gear_embed_parity.py".to_string()]
            ),
            (
                "vae",
                vec!["tests/local_tests/vaes/test_gear_vae_parity.py".to_string()]
            ),
        ],
        "{}",
        out.toml
    );
}

/// A status file whose values carry prose, absolute paths of the porter's
/// machine, a weights id with its revision, workloads in a list of its own
/// section; a README that runs a test under a backend variable (issue #41
/// item 6).
const FINCH_STATUS: &str = "# Finch Port Status

Official ref: example-org/Finch-1 (Diffusers layout)
Last updated: 2026-09-01

## Status

- workloads: T2A, V2A
- component parity: complete

## Summary

- official_ref_dir: `../FinchRef` relative to the FastVideo checkout
- hf_weights_path: `example-org/Finch-1@0a1b2c3d`
- hf_revision: unknown
- local_weights_dir: `/mnt/scratch/porter/finch/weights`
- official_ref_commit: `feedc0ffee12` (the last tag before the rewrite)
- hf_token_env: `HF_TOKEN`; the gated base model needs it

## Component Status

| Component | Type | Parity test | Status | Notes |
|---|---|---|---|---|
| FinchDiT | DiT (ported) | tests/local_tests/finch/test_finch_dit_parity.py | PASS (L4, 2026-08-30) | |
";

const FINCH_README: &str = "# Finch Local Tests

```bash
FINCH_ATTENTION=SDPA \\
pytest tests/local_tests/finch/test_finch_dit_parity.py -vs
```
";

#[test]
fn values_with_prose_absolute_paths_and_revisions_are_read_as_values_or_left_open() {
    let repo = Repo::new(&[
        ("tests/local_tests/finch/PORT_STATUS.md", FINCH_STATUS),
        ("tests/local_tests/finch/README.md", FINCH_README),
        (
            "tests/local_tests/finch/test_finch_dit_parity.py",
            TRANSFORMER_TEST,
        ),
    ]);
    let out = repo.init("finch");
    let spec = parsed(&out);
    let prep = |k: &str| spec.prep.get(k).cloned().unwrap_or_default();
    // the value, without the words after it
    assert_eq!(prep("official_ref"), "example-org/Finch-1", "{}", out.toml);
    assert_eq!(prep("official_ref_dir"), "../FinchRef");
    assert_eq!(prep("official_ref_commit"), "feedc0ffee12");
    assert_eq!(prep("hf_token_env"), "HF_TOKEN");
    assert!(out.toml.contains("are not part of it"), "{}", out.toml);
    // the revision the weights id carries is hf_revision
    assert_eq!(prep("hf_weights_path"), "example-org/Finch-1");
    assert_eq!(prep("hf_revision"), "0a1b2c3d");
    // a path of the porter's machine is a placeholder that says why
    assert!(
        prep("local_weights_dir").starts_with("<fill in:"),
        "{}",
        out.toml
    );
    let why = out
        .toml
        .lines()
        .find(|l| l.contains("/mnt/scratch/porter"))
        .unwrap();
    assert!(
        why.starts_with('#') && why.contains("absolute path"),
        "{why}"
    );
    assert!(
        out.summary
            .placeholders
            .iter()
            .any(|p| p.field == "prep.local_weights_dir")
    );
    // workloads of a list in another section
    assert_eq!(prep("workload_types"), "T2A, V2A");
    // the README's variable prefix becomes the component's set_env
    let dit = component(&spec, "finchdit");
    assert_eq!(
        dit.set_env.get("FINCH_ATTENTION").map(String::as_str),
        Some("SDPA"),
        "{}",
        out.toml
    );
}

/// `.gitignore` lines that name the staged folders below their top folder
/// (`official_weights/Finch-1/`) are the entries prep added (issue #41
/// item 6); an unrelated line is not.
#[test]
fn gitignore_lines_naming_the_staged_folders_themselves_are_read() {
    let status = "# Finch Port Status\n\n## Summary\n\n- official_ref_dir: `refs/FinchRef`\n- local_weights_dir: `official_weights/Finch-1`\n";
    let repo = Repo::new(&[
        ("tests/local_tests/finch/PORT_STATUS.md", status),
        (
            "tests/local_tests/finch/test_finch_dit_parity.py",
            TRANSFORMER_TEST,
        ),
        (
            ".gitignore",
            "*.pyc\nofficial_weights/Finch-1/\n/refs/FinchRef\nofficial_weights/Other/\n",
        ),
    ]);
    let out = repo.init("finch");
    let line = out
        .toml
        .lines()
        .find(|l| l.starts_with("gitignore_entries_added"))
        .unwrap();
    assert_eq!(
        line, r#"gitignore_entries_added = ["official_weights/Finch-1/", "/refs/FinchRef"]"#,
        "{}",
        out.toml
    );
}

/// P0 against a status file whose reference is a folder of the porter's
/// machine (`../Wren at SHA`) and whose weights carry prose: the spec's URL
/// and the id init read are no disagreement; another commit still is
/// (issue #41 item 6).
#[test]
fn p0_takes_a_reference_folder_and_prose_in_the_status_file_as_no_disagreement() {
    let status = "# Wren Port Status\n\n## Summary\n\n- model_family: `wren`\n- official_ref: `../Wren` at `abcdef1234567`\n- hf_weights_path: `example/Wren-1` (Diffusers layout)\n";
    let out = Repo::new(&[
        ("tests/local_tests/wren/PORT_STATUS.md", status),
        (
            "tests/local_tests/wren/test_wren_dit_parity.py",
            TRANSFORMER_TEST,
        ),
    ])
    .init("wren");
    let mut spec = parsed(&out);
    assert_eq!(
        spec.prep["hf_weights_path"], "example/Wren-1",
        "{}",
        out.toml
    );
    spec.prep
        .insert("official_ref".into(), "https://example.org/wren".into());
    let unmet = crate::preconditions::status_conditions(&spec, status, &|f| format!("p:{f}"));
    assert!(unmet.is_empty(), "{unmet:#?}");
    spec.prep
        .insert("official_ref_commit".into(), "0000000000000".into());
    let unmet = crate::preconditions::status_conditions(&spec, status, &|f| format!("p:{f}"));
    assert_eq!(unmet.len(), 1, "{unmet:#?}");
}

/// The family's pipeline parity test and its SSIM test (where FastVideo
/// keeps them) are wired as `[pipeline]` and `[quality]` (issue #42),
/// where init listed them as test files not used.
#[test]
fn the_pipeline_and_quality_tests_are_wired_for_p7_and_p10() {
    let mut repo = harrier();
    let d = "tests/local_tests/harrier";
    repo.files.insert(
        format!("{d}/test_harrier_pipeline_parity.py"),
        PLAIN_TEST.into(),
    );
    repo.files.insert(
        "fastvideo/tests/ssim/test_harrier_similarity.py".into(),
        PLAIN_TEST.into(),
    );
    let out = repo.init("harrier");
    let spec = parsed(&out);
    let p = spec.pipeline.clone().expect("a [pipeline]");
    assert_eq!(
        (p.smoke_test.as_deref(), p.parity_test.as_deref()),
        (
            Some("tests/local_tests/harrier/test_harrier_pipeline_smoke.py"),
            Some("tests/local_tests/harrier/test_harrier_pipeline_parity.py")
        )
    );
    assert_eq!(
        spec.quality.clone().expect("a [quality]").tests,
        ["fastvideo/tests/ssim/test_harrier_similarity.py"]
    );
    let steps: Vec<&str> = spec.pipeline_steps().map(|c| c.name.as_str()).collect();
    assert_eq!(steps, ["pipeline_smoke", "pipeline_parity"]);
    assert!(
        !out.summary
            .unused_tests
            .iter()
            .any(|u| u.what.contains("pipeline_parity")),
        "{:?}",
        out.summary.unused_tests
    );
    assert_eq!(out.summary.later.len(), 3, "{:?}", out.summary.later);
}

/// One family of its own shape: only a status file (and a README, a
/// `.gitignore`) and one parity test; `prep` of what init wrote.
fn prep_of(status: &str, readme: Option<&str>, gitignore: Option<&str>) -> (Inferred, PortSpec) {
    let mut files = vec![
        ("tests/local_tests/heron/PORT_STATUS.md", status),
        (
            "tests/local_tests/heron/test_heron_dit_parity.py",
            TRANSFORMER_TEST,
        ),
    ];
    if let Some(r) = readme {
        files.push(("tests/local_tests/heron/README.md", r));
    }
    if let Some(g) = gitignore {
        files.push((".gitignore", g));
    }
    let out = Repo::new(&files).init("heron");
    let spec = parsed(&out);
    (out, spec)
}

/// Folders written through a stand-in for the checkout's root
/// (`<repo_root>/HeronRef/src`) or as a variable with a default
/// (`${HERON_REF:-$PWD/HeronRef}`) are repo-relative folders, so the
/// `.gitignore` lines for them are found too; a variable without a
/// default is a placeholder that says so (issue #41 item 6: zimage,
/// minimax_h3).
#[test]
fn folders_under_a_stand_in_for_the_root_are_repo_relative() {
    let status = "# Heron\n\n## Summary\n\n- official_ref_dir: `<repo_root>/HeronRef/src`\n- local_weights_dir: `<repo_root>/official_weights/Heron/`\n";
    let (out, spec) = prep_of(status, None, Some("*.log\n/HeronRef/\nofficial_weights/\n"));
    assert_eq!(
        spec.prep["official_ref_dir"], "HeronRef/src",
        "{}",
        out.toml
    );
    assert_eq!(spec.prep["local_weights_dir"], "official_weights/Heron/");
    let line = out
        .toml
        .lines()
        .find(|l| l.starts_with("gitignore_entries_added"))
        .unwrap();
    assert_eq!(
        line,
        r#"gitignore_entries_added = ["/HeronRef/", "official_weights/"]"#
    );

    let status = "# Heron\n\n## Summary\n\n- official_ref_dir: `${HERON_REF:-$PWD/HeronRef}`\n- local_weights_dir: `$HERON_WEIGHTS/raw`\n";
    let (out, spec) = prep_of(status, None, None);
    assert_eq!(spec.prep["official_ref_dir"], "HeronRef", "{}", out.toml);
    assert!(
        spec.prep["local_weights_dir"].starts_with("<fill in:"),
        "{}",
        out.toml
    );
    let why = line_of(&out.toml, "local_weights_dir = ") - 2;
    assert!(
        out.toml
            .lines()
            .nth(why)
            .unwrap()
            .contains("shell variable"),
        "{}",
        out.toml
    );
}

/// A README's `## Reference` list labels its values in words
/// (`- Upstream implementation:`, `- Source checkout:`, `- Checkpoint:`):
/// they are official_ref, official_ref_dir and hf_weights_path, where init
/// left all three to fill in (issue #41 item 6: minimax_h3).
#[test]
fn a_readmes_labelled_reference_list_gives_the_reference_and_checkpoint() {
    let status = "# Heron\n\n## State\n\n- workloads: T2V\n";
    let readme = "# Heron checks\n\n## Reference\n\n- Reference implementation: `https://example.org/heron/pull/7`\n- Source checkout: `${HERON_SRC:-$PWD/HeronUpstream}`\n- Checkpoint: `example/Heron-2B`\n\nA note that mentions a checkpoint: not a field.\n";
    let (out, spec) = prep_of(status, Some(readme), None);
    assert_eq!(
        spec.prep["official_ref"], "https://example.org/heron/pull/7",
        "{}",
        out.toml
    );
    assert_eq!(spec.prep["official_ref_dir"], "HeronUpstream");
    assert_eq!(spec.prep["hf_weights_path"], "example/Heron-2B");
}

/// A status file whose reference is a folder of the porter's machine
/// (`../HeronRef` at a commit) gives way to the URL its README records;
/// the folder stays official_ref_dir's, the commit is kept (issue #41
/// item 6: mmaudio).
#[test]
fn a_reference_folder_gives_way_to_the_readmes_url() {
    let status = "# Heron\n\n## Summary\n\n- official_ref: `../HeronRef` at `0123456789abcdef`\n";
    let readme = "# Heron\n\n| Field | Value |\n|---|---|\n| Official reference | `https://example.org/heron` |\n| Local reference dir | `../HeronRef` beside the checkout |\n";
    let (out, spec) = prep_of(status, Some(readme), None);
    assert_eq!(
        spec.prep["official_ref"], "https://example.org/heron",
        "{}",
        out.toml
    );
    assert_eq!(spec.prep["official_ref_dir"], "../HeronRef");
    assert_eq!(spec.prep["official_ref_commit"], "0123456789abcdef");
    // without a URL anywhere, the folder is what the file says
    let (out, spec) = prep_of(status, None, None);
    assert_eq!(spec.prep["official_ref"], "../HeronRef", "{}", out.toml);
}

/// A source layout written as a contract value and then words about it
/// (`mixed official checkpoints and outside encoders`) is that value; a
/// text whose first word is none stays unknown with what it said
/// (issue #41 item 6: mmaudio).
#[test]
fn a_source_layout_followed_by_prose_is_its_first_word() {
    let status = "# Heron\n\n## Summary\n\n- source_layout: mixed official checkpoints and outside encoders\n";
    let (out, spec) = prep_of(status, None, None);
    assert_eq!(spec.prep["source_layout"], "mixed", "{}", out.toml);
    let status = "# Heron\n\n## Summary\n\n- source_layout: upstream-native package tree\n";
    let (out, spec) = prep_of(status, None, None);
    assert_eq!(spec.prep["source_layout"], "unknown", "{}", out.toml);
    assert!(out.toml.contains("not a source_layout value"));
}

/// A status file that states its conversion in a section of its own
/// (`## Weight Conversion` with `- Script: …py`) and its environment in
/// a sentence (`The upstream code imports successfully … with no
/// dependency changes.`) decides needs_conversion, dependency_changes,
/// official_env_status and so next_step; a table row's resolution saying
/// the same is not the port's statement (issue #41 item 6:
/// lingbot_video).
#[test]
fn conversion_and_environment_stated_in_words_are_read() {
    let status = "# Heron\n\n## Summary\n\n- model_family: `heron`\n\n## Weight Conversion\n\nThe upstream files need renaming before FastVideo loads them.\n\n- Script: `scripts/checkpoint_conversion/heron_to_diffusers.py`\n\n## Notes\n\n- The official code imports successfully in our venv with no dependency changes.\n";
    let (out, spec) = prep_of(status, None, None);
    assert_eq!(spec.prep["needs_conversion"], "yes", "{}", out.toml);
    assert_eq!(spec.prep["dependency_changes"], "none");
    assert_eq!(spec.prep["official_env_status"], "imports_ok");
    assert_eq!(spec.prep["next_step"], "add-model");
    // the same words only in an issue row's resolution decide nothing
    let status = "# Heron\n\n## Issues\n\n| ID | Issue | Resolution |\n|---|---|---|\n| I1 | venv | No dependency changes were needed; official code imports successfully. |\n";
    let (out, spec) = prep_of(status, None, None);
    assert!(
        spec.prep["dependency_changes"].starts_with("<fill in:"),
        "{}",
        out.toml
    );
    assert!(spec.prep["official_env_status"].starts_with("<fill in:"));
    assert!(spec.prep["needs_conversion"].starts_with("<fill in:"));
}

/// A status file's weights written `org/model@rev`: init splits them into
/// hf_weights_path and hf_revision, and P0 takes the pair as agreeing with
/// the file (it refused what init wrote: FastVideo's zimage); another
/// revision still disagrees.
#[test]
fn p0_takes_weights_at_a_revision_as_the_id_and_hf_revision() {
    let status = "# Heron\n\n## Summary\n\n- model_family: `heron`\n- hf_weights_path: `example/Heron-2B@a1b2c3d4e5`\n";
    let (out, mut spec) = prep_of(status, None, None);
    assert_eq!(
        spec.prep["hf_weights_path"], "example/Heron-2B",
        "{}",
        out.toml
    );
    assert_eq!(spec.prep["hf_revision"], "a1b2c3d4e5");
    let unmet = crate::preconditions::status_conditions(&spec, status, &|f| format!("p:{f}"));
    assert!(unmet.is_empty(), "{unmet:#?}");
    spec.prep.insert("hf_revision".into(), "ffff0000".into());
    let unmet = crate::preconditions::status_conditions(&spec, status, &|f| format!("p:{f}"));
    assert_eq!(unmet.len(), 1, "{unmet:#?}");
    assert!(unmet[0].contains("hf_weights_path"), "{unmet:#?}");
}

/// The basic example P9 ends with is wired as `[pipeline] example`: the
/// family's own where FastVideo keeps examples, else its variant's (named
/// like the pipeline tests, `basic_F_turbo.py` beside
/// `test_F_turbo_pipeline_smoke.py`), else one the README runs; none when
/// the checkout has none (init wired it in none of FastVideo's seven).
#[test]
fn the_basic_example_is_wired_as_the_pipelines_example() {
    let example = |extra: &[(&str, &str)], readme: Option<&str>| {
        let mut files = vec![
            ("tests/local_tests/heron/PORT_STATUS.md", "# Heron\n"),
            (
                "tests/local_tests/heron/test_heron_dit_parity.py",
                TRANSFORMER_TEST,
            ),
            (
                "tests/local_tests/heron/test_heron_turbo_pipeline_smoke.py",
                PLAIN_TEST,
            ),
        ];
        files.extend_from_slice(extra);
        if let Some(r) = readme {
            files.push(("tests/local_tests/heron/README.md", r));
        }
        let out = Repo::new(&files).init("heron");
        parsed(&out).pipeline.map(|p| p.example).unwrap_or_default()
    };
    let own = ("examples/inference/basic/basic_heron.py", "print(1)\n");
    let variant = (
        "examples/inference/basic/basic_heron_turbo.py",
        "print(1)\n",
    );
    let named = ("examples/heron_demo/basic_heron_demo.py", "print(1)\n");
    let readme = "# Heron\n\nRun `python examples/heron_demo/basic_heron_demo.py --steps 2`.\n";
    assert_eq!(
        example(&[own, variant], None),
        ["python", "examples/inference/basic/basic_heron.py"]
    );
    assert_eq!(
        example(&[variant, named], Some(readme)),
        ["python", "examples/inference/basic/basic_heron_turbo.py"]
    );
    assert_eq!(
        example(&[named], Some(readme)),
        ["python", "examples/heron_demo/basic_heron_demo.py"]
    );
    // named by the README but not in the checkout: nothing to run
    assert!(example(&[], Some(readme)).is_empty());
}

/// The pipeline class a status file quotes from `model_index.json`
/// (`_class_name=HeronPipeline`) is model_index_class, where init said
/// unknown (FastVideo's zimage); two variants' classes are a placeholder
/// naming both (lingbot_video), and the word in prose is neither.
#[test]
fn a_quoted_class_name_is_the_model_index_class() {
    let status = "# Heron\n\n## Pipeline\n\n- model_index_contract: `_class_name=HeronPipeline`; modules `vae`, `transformer`\n- We keep distinct `_class_name` identities per variant.\n";
    let (out, spec) = prep_of(status, None, None);
    assert_eq!(
        spec.prep["model_index_class"], "HeronPipeline",
        "{}",
        out.toml
    );
    let status = "# Heron\n\n## Notes\n\n- Base: its model index uses `_class_name: HeronBasePipeline`.\n- Large: its model index uses `_class_name: HeronLargePipeline`.\n";
    let (out, spec) = prep_of(status, None, None);
    assert!(
        spec.prep["model_index_class"].starts_with("<fill in:"),
        "{}",
        out.toml
    );
    assert!(out.toml.contains("HeronBasePipeline, HeronLargePipeline"));
    let status =
        "# Heron\n\n## Notes\n\n- We keep distinct `_class_name` identities per variant.\n";
    let (out, spec) = prep_of(status, None, None);
    assert_eq!(spec.prep["model_index_class"], "unknown", "{}", out.toml);
}
