//! The verdict of a finished job: what its report says about the code, or
//! that its environment (not the code) failed it. Used by the component
//! actor for parity runs and by the trace actor for traced reruns; the
//! scheduler, which delivers the reports, classifies nothing.

use std::path::PathBuf;

use fvd_contracts::verdict::{self, JunitEvidence, RunEvidence, Verdict};

use fvd_store::messages::{JobReport, JunitStatus};

/// The verdict of a run: an environment failure when its cause lies
/// outside the repository (`in_repo` says which top-level modules the
/// checkout holds), else what its JUnit report says.
pub fn classify(report: &JobReport, in_repo: &dyn Fn(&str) -> bool) -> Verdict {
    if !report.preflight_error.is_empty() {
        return Verdict::Environment {
            cause: report.preflight_error.clone(),
        };
    }
    let ev = evidence(report);
    if let Some(env) = verdict::environment_cause(&ev, &report.spawn_error, in_repo) {
        return env;
    }
    verdict::classify(&ev)
}

/// The CUDA out-of-memory error a run raised, if it raised one
/// ([`verdict::out_of_memory`]).
pub fn out_of_memory(report: &JobReport) -> Option<String> {
    verdict::out_of_memory(&evidence(report))
}

/// What the classifier reads of a report.
fn evidence(report: &JobReport) -> RunEvidence<'_> {
    let junit = match (&report.junit_xml, report.junit_status) {
        (Some(xml), _) => JunitEvidence::Xml(xml),
        (None, JunitStatus::Unreadable) => JunitEvidence::Unreadable {
            path: "junit.xml",
            error: &report.junit_error,
        },
        // Not asked for, not written, or an empty file: no report.
        (None, JunitStatus::NotRequested | JunitStatus::Read | JunitStatus::Missing) => {
            JunitEvidence::Missing { path: "junit.xml" }
        }
    };
    RunEvidence {
        junit,
        timed_out: report.timed_out,
        cancelled: report.cancelled,
        exit_code: report.exit_code,
        signal: report.signal,
        output_tail: &report.output_tail,
        worker_lost: false,
        // A worker loads fvd's pytest plugin for every run whose report
        // it collects (`fvd_worker::exec::prepare_pytest`).
        plugin: true,
    }
}

/// [`classify`] for a program judged by its exit status (P9's example,
/// case `case`): no report is read; an environment signature in what it
/// printed is still the environment's.
pub fn classify_exit(report: &JobReport, in_repo: &dyn Fn(&str) -> bool, case: &str) -> Verdict {
    if !report.preflight_error.is_empty() {
        return Verdict::Environment {
            cause: report.preflight_error.clone(),
        };
    }
    let ev = RunEvidence {
        junit: JunitEvidence::Missing { path: "junit.xml" },
        timed_out: report.timed_out,
        cancelled: report.cancelled,
        exit_code: report.exit_code,
        signal: report.signal,
        output_tail: &report.output_tail,
        worker_lost: false,
        plugin: false,
    };
    if report.exit_code != Some(0)
        && let Some(env) = verdict::environment_cause(&ev, &report.spawn_error, in_repo)
    {
        return env;
    }
    verdict::classify_exit(&ev, case)
}

/// Which top-level Python modules a component's runs find in the checkout:
/// the repository's top-level folders and `.py` files, those of the
/// folders its literal `PYTHONPATH` names inside the checkout, and those
/// beside its test files (pytest puts the test's root on the path). A
/// missing module that is none of these is the environment's.
pub fn repo_modules(repo: &str, spec: &fvd_spec::ComponentSpec) -> impl Fn(&str) -> bool + use<> {
    let repo = PathBuf::from(repo);
    let mut roots = vec![repo.clone()];
    if let Some(pp) = spec.set_env.get("PYTHONPATH") {
        for part in pp.split(':').filter(|p| !p.is_empty()) {
            let part = part.replace("{repo}", &repo.to_string_lossy());
            let p = repo.join(part);
            if p.starts_with(&repo) {
                roots.push(p);
            }
        }
    }
    for t in spec.test_files() {
        let mut dir = repo.join(t);
        while dir.pop() && dir.starts_with(&repo) && dir != repo {
            roots.push(dir.clone());
        }
    }
    move |top: &str| {
        !top.is_empty()
            && !top.contains(['/', '\\'])
            && top != ".."
            && roots
                .iter()
                .any(|r| r.join(top).is_dir() || r.join(format!("{top}.py")).is_file())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_missing_report_is_told_by_its_status_not_its_words() {
        let none = |_: &str| false;
        let kind = |status, error: &str| {
            let report = JobReport {
                exit_code: Some(1),
                junit_status: status,
                junit_error: error.into(),
                ..JobReport::default()
            };
            match classify(&report, &none) {
                Verdict::Error { kind, .. } => kind.as_str(),
                other => panic!("{other:?}"),
            }
        };
        // The words are for people: whatever they say, the status decides.
        assert_eq!(kind(JunitStatus::Missing, "gone"), "junit_missing");
        assert_eq!(kind(JunitStatus::NotRequested, ""), "junit_missing");
        assert_eq!(kind(JunitStatus::Read, ""), "junit_missing");
        assert_eq!(
            kind(JunitStatus::Unreadable, "junit file j.xml was not written"),
            "junit_unreadable"
        );
    }

    #[test]
    fn repository_modules_are_its_folders_files_pythonpath_and_test_roots() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        for d in ["fastvideo", "src/extra", "tests/local_tests/fam/helpers"] {
            std::fs::create_dir_all(repo.join(d)).unwrap();
        }
        std::fs::write(repo.join("conftest_utils.py"), "").unwrap();
        let mut spec = fvd_spec::parse(
            Path::new("p.toml"),
            "[prep]\nmodel_family = \"fam\"\n\n[[component]]\nname = \"a\"\ntype = \"generic\"\nparity_test = \"tests/local_tests/fam/test_a.py\"\ncoverage_scope = \"both\"\n",
        )
        .unwrap()
        .components
        .remove(0);
        spec.set_env
            .insert("PYTHONPATH".into(), "{repo}/src:/usr/lib/elsewhere".into());
        let has = repo_modules(&repo.to_string_lossy(), &spec);
        for m in ["fastvideo", "conftest_utils", "extra", "helpers", "tests"] {
            assert!(has(m), "{m} is in the repository");
        }
        for m in ["torch", "elsewhere", "..", "", "src/extra"] {
            assert!(!has(m), "{m:?} is not");
        }
    }
}
