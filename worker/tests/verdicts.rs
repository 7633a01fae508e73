//! The verdict classifier against real pytest runs: each small file under
//! `tests/pytest_cases/` runs through `run_job` (real subprocess, real JUnit
//! file, the embedded pytest plugin) and its verdict must be exactly the
//! expected one. Needs `python3` with pytest and numpy.

use std::path::PathBuf;
use std::time::Duration;

use fvd_contracts::verdict::{ErrorKind, FailureInfo, SkipInfo, SkipKind, Verdict};
use fvd_worker::exec::{JobOutcome, JobSpec, prepare_pytest, run_job};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn cases_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/pytest_cases")
}

struct Run {
    outcome: JobOutcome,
    verdict: Verdict,
}

async fn run_case_with(file: &str, extra: &[&str], timeout: Duration, plugin: bool) -> Run {
    run_in(cases_dir(), &[file], extra, timeout, plugin, &[]).await
}

/// pytest on `files` in `dir`, with `extra` arguments.
async fn run_in(
    dir: PathBuf,
    files: &[&str],
    extra: &[&str],
    timeout: Duration,
    plugin: bool,
    env: &[(&str, &str)],
) -> Run {
    let scratch = tempfile::tempdir().unwrap();
    let mut argv: Vec<String> = ["python3", "-m", "pytest"]
        .iter()
        .chain(files)
        .map(|s| s.to_string())
        .collect();
    argv.extend(
        ["-q", "-p", "no:cacheprovider", "--junitxml={junitxml}"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string()),
    );
    let mut spec = JobSpec {
        job_id: format!("verdict-{}", files.join("-").replace('/', "_")),
        argv,
        // Keep the source tree clean: no __pycache__ next to the cases.
        env: [("PYTHONDONTWRITEBYTECODE", "1")]
            .iter()
            .chain(env)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        secret_env_names: vec![],
        sandbox: fvd_worker::exec::JobSandbox::unjailed(),
        cwd: dir,
        gpus: vec![],
        timeout,
        grace: Duration::from_secs(2),
        junit: Some(scratch.path().join("junit.xml")),
        warm: None,
        stdin: None,
    };
    if plugin {
        prepare_pytest(&mut spec, scratch.path()).await.unwrap();
    }
    let (tx, mut rx) = mpsc::channel(64);
    let sink = fvd_telemetry::spawn(async move { while rx.recv().await.is_some() {} });
    let outcome = run_job(spec, tx, CancellationToken::new()).await.unwrap();
    sink.await.unwrap();
    let verdict = outcome.verdict();
    Run { outcome, verdict }
}

async fn run_case(file: &str, extra: &[&str]) -> Run {
    run_case_with(file, extra, Duration::from_secs(120), true).await
}

fn skip(case: &str, kind: SkipKind, reason: &str) -> SkipInfo {
    SkipInfo {
        case: case.into(),
        kind,
        reason: reason.into(),
    }
}

fn assert_verdict(run: &Run, want: Verdict) {
    assert_eq!(
        run.verdict, want,
        "exit {:?}, output:\n{}",
        run.outcome.exit_code, run.outcome.output_tail
    );
}

#[tokio::test]
async fn pass_is_non_skip_pass_in_both_junit_families() {
    for family in ["xunit2", "xunit1"] {
        let run = run_case("test_pass.py", &["-o", &format!("junit_family={family}")]).await;
        assert_verdict(
            &run,
            Verdict::NonSkipPass {
                passed: 2,
                xpass_checked: true,
            },
        );
        assert_eq!(run.verdict.status().as_str(), "non_skip_pass");
    }
}

#[tokio::test]
async fn failure_is_debug_red_with_its_assertion() {
    let run = run_case("test_fail.py", &[]).await;
    assert_verdict(
        &run,
        Verdict::DebugRed {
            failures: vec![FailureInfo {
                case: "test_fail::test_outputs_match".into(),
                message: "AssertionError: outputs differ by 0.5 assert 1.0 == 1.5".into(),
            }],
            failed: 1,
            passed: 0,
        },
    );
    assert_eq!(
        run.verdict.reason(),
        "test_fail::test_outputs_match: AssertionError: outputs differ by 0.5 assert 1.0 == 1.5"
    );
}

#[tokio::test]
async fn collection_error_is_error() {
    let run = run_case("test_collect_error.py", &[]).await;
    assert_verdict(
        &run,
        Verdict::Error {
            kind: ErrorKind::Collection,
            detail: "test_collect_error: ModuleNotFoundError: No module named \
                     'fvd_module_that_does_not_exist'"
                .into(),
        },
    );
}

#[tokio::test]
async fn fixture_error_is_setup_error() {
    let run = run_case("test_setup_error.py", &[]).await;
    assert_verdict(
        &run,
        Verdict::Error {
            kind: ErrorKind::Setup,
            detail: "test_setup_error::test_uses_weights: FileNotFoundError: \
                     official_weights/tinyport/model.npz"
                .into(),
        },
    );
}

#[tokio::test]
async fn teardown_error_after_a_pass_is_not_a_pass() {
    let run = run_case("test_teardown_error.py", &[]).await;
    assert_verdict(
        &run,
        Verdict::Error {
            kind: ErrorKind::Teardown,
            detail: "test_teardown_error::test_uses_workspace: RuntimeError: could not release \
                     the workspace"
                .into(),
        },
    );
}

#[tokio::test]
async fn skip_is_scaffold_with_reason_in_both_families() {
    for family in ["xunit2", "xunit1"] {
        let run = run_case("test_skip.py", &["-o", &format!("junit_family={family}")]).await;
        // pytest exits 0 here: the exit code alone would call this a pass.
        assert_eq!(run.outcome.exit_code, Some(0));
        assert_verdict(
            &run,
            Verdict::ScaffoldSkip {
                passed: 0,
                skips: vec![skip(
                    "test_skip::test_port_exists",
                    SkipKind::Skip,
                    "fastvideo TinyPort class missing",
                )],
            },
        );
        assert_eq!(
            run.verdict.reason(),
            "skipped: fastvideo TinyPort class missing"
        );
    }
}

#[tokio::test]
async fn module_level_importorskip_is_scaffold() {
    let run = run_case("test_importorskip.py", &[]).await;
    assert_verdict(
        &run,
        Verdict::ScaffoldSkip {
            passed: 0,
            skips: vec![skip(
                "test_importorskip",
                SkipKind::Skip,
                "could not import 'fvd_private_ops_that_do_not_exist': \
                 No module named 'fvd_private_ops_that_do_not_exist'",
            )],
        },
    );
}

#[tokio::test]
async fn xfail_is_scaffold() {
    let run = run_case("test_xfail.py", &[]).await;
    assert_verdict(
        &run,
        Verdict::ScaffoldSkip {
            passed: 0,
            skips: vec![skip(
                "test_xfail::test_decoder",
                SkipKind::Xfail,
                "decoder not ported yet",
            )],
        },
    );
}

#[tokio::test]
async fn non_strict_xpass_is_never_a_pass() {
    for family in ["xunit2", "xunit1"] {
        let run = run_case("test_xpass.py", &["-o", &format!("junit_family={family}")]).await;
        assert_verdict(
            &run,
            Verdict::ScaffoldSkip {
                passed: 0,
                skips: vec![skip(
                    "test_xpass::test_norm",
                    SkipKind::Xpass,
                    "norm epsilon still wrong",
                )],
            },
        );
    }
}

/// The caveat the plugin exists for: pytest's own JUnit writer reports a
/// non-strict xpass as a plain pass, so without the plugin the classifier
/// can only say that it could not check.
#[tokio::test]
async fn without_the_plugin_xpass_is_unchecked() {
    let run = run_case_with("test_xpass.py", &[], Duration::from_secs(120), false).await;
    assert_verdict(
        &run,
        Verdict::NonSkipPass {
            passed: 1,
            xpass_checked: false,
        },
    );
}

#[tokio::test]
async fn strict_xpass_is_debug_red() {
    let run = run_case("test_xpass_strict.py", &[]).await;
    assert_verdict(
        &run,
        Verdict::DebugRed {
            failures: vec![FailureInfo {
                case: "test_xpass_strict::test_attention".into(),
                message: "[XPASS(strict)] attention mask still wrong".into(),
            }],
            failed: 1,
            passed: 0,
        },
    );
}

#[tokio::test]
async fn no_tests_is_error_no_tests() {
    let run = run_case("test_no_tests.py", &[]).await;
    assert_eq!(run.outcome.exit_code, Some(5));
    assert_verdict(
        &run,
        Verdict::Error {
            kind: ErrorKind::NoTests,
            detail: "no tests collected".into(),
        },
    );
    assert_eq!(run.verdict.status().as_str(), "error");
}

#[tokio::test]
async fn pass_plus_skip_is_scaffold() {
    let run = run_case("test_mixed.py", &[]).await;
    assert_verdict(
        &run,
        Verdict::ScaffoldSkip {
            passed: 1,
            skips: vec![skip(
                "test_mixed::test_vae",
                SkipKind::Skip,
                "official vae needs private ops",
            )],
        },
    );
}

#[tokio::test]
async fn hanging_test_is_timeout() {
    let run = run_case_with("test_hang.py", &[], Duration::from_secs(4), true).await;
    assert!(run.outcome.timed_out);
    assert!(
        run.outcome.survivors.is_empty(),
        "{:?}",
        run.outcome.survivors
    );
    assert_verdict(&run, Verdict::Timeout);
    assert_eq!(run.verdict.status().as_str(), "timeout");
}

#[tokio::test]
async fn cuda_init_failure_is_infra_error() {
    let run = run_case("test_cuda_init.py", &[]).await;
    assert_verdict(
        &run,
        Verdict::InfraError {
            cause: "CUDA error: initialization error in test_cuda_init::test_on_gpu".into(),
        },
    );
}

#[tokio::test]
async fn missing_junit_is_error_naming_the_file() {
    let scratch = tempfile::tempdir().unwrap();
    let junit = scratch.path().join("never-written.xml");
    let spec = JobSpec {
        job_id: "no-junit".into(),
        // Ignores the {junitxml} argument, like a wrapper script that forgot
        // to pass it on.
        argv: vec![
            "python3".into(),
            "-c".into(),
            "print('ran')".into(),
            "{junitxml}".into(),
        ],
        env: vec![],
        secret_env_names: vec![],
        sandbox: fvd_worker::exec::JobSandbox::unjailed(),
        cwd: cases_dir(),
        gpus: vec![],
        timeout: Duration::from_secs(60),
        grace: Duration::from_secs(1),
        junit: Some(junit.clone()),
        warm: None,
        stdin: None,
    };
    let (tx, mut rx) = mpsc::channel(16);
    fvd_telemetry::spawn(async move { while rx.recv().await.is_some() {} });
    let outcome = run_job(spec, tx, CancellationToken::new()).await.unwrap();
    let v = outcome.verdict();
    match &v {
        Verdict::Error {
            kind: ErrorKind::JunitMissing,
            detail,
        } => assert!(detail.contains(junit.to_str().unwrap()), "{detail}"),
        other => panic!("expected junit_missing, got {other:?}"),
    }
}

/// The findings of a run that must be `tampered`.
fn findings(run: &Run) -> &[String] {
    match &run.verdict {
        Verdict::Tampered { findings } => findings,
        other => panic!(
            "expected tampered, got {other:?}; output:\n{}",
            run.outcome.output_tail
        ),
    }
}

#[tokio::test]
async fn a_port_that_swaps_its_judge_out_is_tampered_and_named() {
    // Each file's test fails on the port's bug; its port module swaps out
    // what would say so instead of fixing it (cheat_port.py).
    let cases = [
        (
            "test_cheat_swap_numpy.py",
            "numpy.testing.assert_allclose replaced by cheat_port.py:",
        ),
        (
            "test_cheat_swap_numpy_disguised.py",
            "numpy.testing.assert_allclose replaced by cheat_port.py:",
        ),
        (
            "test_cheat_swap_numpy_callable.py",
            "numpy.testing.assert_allclose replaced by a Passthrough object",
        ),
        (
            "test_cheat_register_report_hook.py",
            "hook pytest_runtest_makereport implemented at cheat_port.py:",
        ),
        (
            "test_cheat_patch_runner.py",
            "pytest's _pytest.runner.call_and_report replaced by cheat_port.py:",
        ),
    ];
    for (file, want) in cases {
        let run = run_case(file, &[]).await;
        let found = findings(&run);
        assert!(
            found.iter().any(|f| f.starts_with(want)),
            "{file}: {found:?}"
        );
        assert!(
            run.verdict
                .reason()
                .starts_with("the run changed what judges it: ")
        );
        // The run's own output says it too, for a person reading the log.
        assert!(
            run.outcome
                .output_tail
                .contains("fvd: the run changed what judges it:"),
            "{file}: {}",
            run.outcome.output_tail
        );
    }
    // Without a swap the same bug is red.
    let run = run_case("test_cheat_control.py", &[]).await;
    assert_eq!(
        run.verdict.status().as_str(),
        "debug_red",
        "{:?}",
        run.verdict
    );
}

#[tokio::test]
async fn a_port_that_unregisters_the_plugin_is_tampered() {
    let run = run_case("test_cheat_unregister_fvd.py", &[]).await;
    assert!(
        findings(&run)[0].contains("did not report"),
        "{:?}",
        run.verdict
    );
}

#[tokio::test]
async fn a_judge_that_patches_a_helper_inside_its_test_is_a_clean_pass() {
    let run = run_case("test_judge_monkeypatch.py", &[]).await;
    assert_verdict(
        &run,
        Verdict::NonSkipPass {
            passed: 2,
            xpass_checked: true,
        },
    );
}

/// Real FastVideo test files (2f3d40740, Apache-2.0; see
/// `fastvideo_suite/README.md`) with their conftest, at their paths: the
/// integrity check finds nothing in them.
#[tokio::test]
async fn real_fastvideo_tests_show_no_finding() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fastvideo_suite");
    let run = run_in(
        dir.clone(),
        &["apps/dreamverse/dreamverse/tests/test_config.py"],
        &[],
        Duration::from_secs(120),
        true,
        &[],
    )
    .await;
    assert_verdict(
        &run,
        Verdict::NonSkipPass {
            passed: 9,
            xpass_checked: true,
        },
    );
    let run = run_in(
        dir,
        &["tests/local_tests/pipelines"],
        &[],
        Duration::from_secs(120),
        true,
        &[],
    )
    .await;
    assert_eq!(
        run.verdict.status().as_str(),
        "scaffold_skip",
        "{:?}",
        run.verdict
    );
}

/// A pytest plugin of an installed distribution (its `pytest11` entry
/// point), here one on PYTHONPATH as `pip install --target` leaves it, is
/// the environment's, not the port's: no finding. The same distribution
/// planted in the repository is the repository's code: tampered.
#[tokio::test]
async fn an_installed_plugin_is_no_finding_and_one_planted_in_the_repository_is() {
    fn distribution(dir: &std::path::Path) {
        let info = dir.join("passing-1.0.dist-info");
        std::fs::create_dir_all(&info).unwrap();
        std::fs::write(
            info.join("METADATA"),
            "Metadata-Version: 2.1\nName: passing\nVersion: 1.0\n",
        )
        .unwrap();
        std::fs::write(
            info.join("entry_points.txt"),
            "[pytest11]\npassing = passing_plugin\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("passing_plugin.py"),
            "import sys\n\nimport pytest\n\nsys.stderr.write('passing plugin loaded\\n')\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n    outcome = yield\n    report = outcome.get_result()\n    if report.failed:\n        report.outcome = 'passed'\n        report.longrepr = None\n",
        )
        .unwrap();
    }
    let repo = tempfile::tempdir().unwrap();
    std::fs::write(repo.path().join("pytest.ini"), "[pytest]\n").unwrap();
    std::fs::write(
        repo.path().join("test_parity.py"),
        "def test_parity():\n    assert 1 == 1\n",
    )
    .unwrap();
    let site = tempfile::tempdir().unwrap();
    distribution(site.path());
    let path = site.path().display().to_string();
    let run = run_in(
        repo.path().to_path_buf(),
        &["test_parity.py"],
        &[],
        Duration::from_secs(120),
        true,
        &[("PYTHONPATH", &path)],
    )
    .await;
    assert!(
        run.outcome.output_tail.contains("passing plugin loaded")
            && run.outcome.output_tail.contains("1 passed"),
        "{}",
        run.outcome.output_tail
    );
    assert!(run.verdict.is_pass(), "{:?}", run.verdict);

    distribution(repo.path());
    std::fs::write(
        repo.path().join("test_parity.py"),
        "def test_parity():\n    assert 1 == 2\n",
    )
    .unwrap();
    let run = run_in(
        repo.path().to_path_buf(),
        &["test_parity.py"],
        &[],
        Duration::from_secs(120),
        true,
        &[],
    )
    .await;
    assert!(
        findings(&run)
            .iter()
            .any(|f| f
                .starts_with("hook pytest_runtest_makereport implemented at passing_plugin.py:")),
        "{:?}",
        run.verdict
    );
}

/// A run that used CUDA through torch reports its peak GPU memory: the
/// largest device's allocator peak plus the context's allowance (no NVML
/// here). One that imported torch but never initialised CUDA reports none,
/// and one that never imported torch reports none and the plugin did not
/// import it either: unknown, never 0.
#[tokio::test]
async fn the_plugin_reports_a_cuda_run_s_peak_and_nothing_without_cuda() {
    let fake = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fake_torch");
    let marks = tempfile::tempdir().unwrap();
    let imported = marks.path().join("imported");
    let env = [
        ("PYTHONPATH", fake.to_str().unwrap()),
        ("FAKE_TORCH_PEAK_MIB", "1000,3000"),
        ("FAKE_TORCH_IMPORTED", imported.to_str().unwrap()),
    ];
    let run = |file: &'static str, plugin: bool| async move {
        let files = [file];
        run_in(
            cases_dir(),
            &files,
            &[],
            Duration::from_secs(120),
            plugin,
            &env,
        )
        .await
    };
    let gpu = run("test_fake_cuda.py", true).await;
    assert!(gpu.verdict.is_pass(), "{:?}", gpu.verdict);
    assert_eq!(gpu.outcome.peak_gpu_mib, Some(3000 + 512));
    let cpu = run("test_fake_torch_cpu.py", true).await;
    assert!(cpu.verdict.is_pass(), "{:?}", cpu.verdict);
    assert_eq!(cpu.outcome.peak_gpu_mib, None, "torch without cuda");
    std::fs::remove_file(&imported).unwrap();
    let plain = run("test_pass.py", true).await;
    assert!(plain.verdict.is_pass(), "{:?}", plain.verdict);
    assert_eq!(plain.outcome.peak_gpu_mib, None, "no torch");
    assert!(!imported.exists(), "the plugin imported torch itself");
    let unplugged = run("test_fake_cuda.py", false).await;
    assert_eq!(unplugged.outcome.peak_gpu_mib, None, "no plugin: unknown");
}
