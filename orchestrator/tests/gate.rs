//! The gate's phase transitions, driven in-process through the real gRPC
//! edge: the orchestrator on a manual clock, simulated workers answering
//! with chosen JUnit reports, and the port read back with `Status`.

mod support;

use support::{Comp, Harness, answer, assigned, comp, component_of, event, fail, gate, pass};

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[tokio::test]
async fn p0_refuses_an_undecided_prep_records_why_and_blocks_the_port_at_p0() {
    let h = Harness::start().await;
    let spec = h.write_port(
        "undecided",
        &[Comp::new("a")],
        "needs_conversion = \"unknown\"\n",
        "",
    );
    h.submit("undecided", &spec).await.expect("submitted");
    let s = h.wait_state("undecided", "blocked").await;
    assert_eq!(s.phase, "P0");
    assert_eq!(gate(&s), pairs(&[("P0", "refused")]), "nothing after P0");
    let p0 = event(&s, "P0");
    // The condition names the spec's file and the field's line.
    let line = std::fs::read_to_string(&spec)
        .unwrap()
        .lines()
        .position(|l| l.starts_with("needs_conversion"))
        .unwrap()
        + 1;
    assert_eq!(
        p0.conditions,
        [format!(
            "tests/local_tests/undecided/port.toml:{line}: prep.needs_conversion: is \"unknown\"; P0 needs yes or no (an undecided conversion goes back to prep)"
        )],
    );
    assert_eq!(comp(&s, "a").runs, 0, "nothing ran");
    assert!(
        !h.repo()
            .join("tests/local_tests/undecided/PORT_STATUS.md")
            .exists(),
        "a refusal creates no status file"
    );
}

#[tokio::test]
async fn p2_refuses_a_missing_parity_test_naming_it() {
    let h = Harness::start().await;
    let spec = h.write_port(
        "no_test",
        &[Comp::new("a"), Comp::new("b").without_test_file()],
        "",
        "",
    );
    h.submit("no_test", &spec).await.expect("submitted");
    let s = h.wait_state("no_test", "blocked").await;
    assert_eq!(s.phase, "P2");
    assert_eq!(
        gate(&s),
        pairs(&[("P0", "passed"), ("P1", "pending"), ("P2", "refused")])
    );
    assert_eq!(
        event(&s, "P2").conditions,
        ["component b: parity test tests/local_tests/no_test/test_b_parity.py does not exist"]
    );
    assert_eq!((comp(&s, "a").runs, comp(&s, "b").runs), (0, 0));
}

#[tokio::test]
async fn a_blocked_component_ends_p6_and_p7_refuses_naming_it() {
    let h = Harness::start().await;
    let mut w = h.worker("w1").await;
    let spec = h.write_port("one_blocked", &[Comp::new("a"), Comp::new("b")], "", "");
    h.submit("one_blocked", &spec).await.expect("submitted");
    let s = h
        .wait_for("one_blocked", "P6 entered", |s| {
            gate(s).contains(&("P6".into(), "entered".into()))
        })
        .await;
    assert_eq!((s.state.as_str(), s.phase.as_str()), ("running", "P6"));
    answer(&mut w, 2, |c| {
        if c == "b" {
            fail("max abs diff 0.5 over 1e-3")
        } else {
            pass()
        }
    })
    .await;
    let s = h.wait_state("one_blocked", "blocked").await;
    assert_eq!(s.phase, "P7");
    assert_eq!(
        gate(&s)[5..],
        pairs(&[
            ("P5", "passed"),
            ("P6", "entered"),
            ("P6", "passed"),
            ("P7", "refused")
        ])[..]
    );
    assert_eq!(comp(&s, "a").status, "non_skip_pass");
    assert_eq!(comp(&s, "b").status, "blocked");
    let p7 = &event(&s, "P7").conditions;
    assert_eq!(p7.len(), 1, "only the blocked component: {p7:?}");
    assert!(
        p7[0].starts_with("component b is blocked (debug_red: ")
            && p7[0].contains("max abs diff 0.5 over 1e-3"),
        "{p7:?}"
    );
}

#[tokio::test]
async fn every_component_passing_leaves_p7_to_p11_pending_and_the_port_waiting() {
    let h = Harness::start().await;
    let mut w = h.worker("w1").await;
    let spec = h.write_port("all_pass", &[Comp::new("a"), Comp::new("b")], "", "");
    h.submit("all_pass", &spec).await.expect("submitted");
    answer(&mut w, 2, |_| pass()).await;
    let s = h.wait_state("all_pass", "waiting").await;
    assert_eq!(s.phase, "P7");
    assert_eq!(
        gate(&s)[7..],
        pairs(&[
            ("P6", "passed"),
            ("P7", "pending"),
            ("P8", "pending"),
            ("P9", "pending"),
            ("P10", "pending"),
            ("P11", "pending"),
        ])[..]
    );
    for c in ["a", "b"] {
        assert_eq!(
            (comp(&s, c).status.as_str(), comp(&s, c).runs),
            ("non_skip_pass", 1)
        );
    }
}

#[tokio::test]
async fn an_agents_question_pauses_the_port_in_ask_user() {
    let h = Harness::start().await;
    // The agent answers every attempt with this handoff: it asks a person.
    let handoff = h.dir.path().join("handoff.txt");
    std::fs::write(&handoff, QUESTION).unwrap();
    let tail = format!(
        "\n[agent]\ncommand = [\"cp\", \"{}\", \"{{handoff_file}}\"]\nmax_attempts = 3\ntimeout_s = 30\n",
        handoff.display()
    );
    let spec = h.write_port(
        "asks",
        &[Comp::new("a"), Comp::new("shift").with("agent = true")],
        "",
        &tail,
    );
    // The agent works in a git worktree of the repository.
    let repo = h.repo();
    support::git(&repo, &["init", "-q", "-b", "main"]);
    support::git(&repo, &["add", "-A"]);
    support::git(&repo, &["commit", "-q", "-m", "base"]);
    let mut w = h.worker("w1").await;
    h.submit("asks", &spec).await.expect("submitted");
    answer(&mut w, 2, |c| {
        if c == "shift" {
            fail("shifted timesteps differ by 0.33")
        } else {
            pass()
        }
    })
    .await;
    let s = h.wait_state("asks", "ask_user").await;
    assert_eq!(s.phase, "P6");
    assert_eq!(comp(&s, "a").status, "non_skip_pass");
    let shift = comp(&s, "shift");
    assert_eq!(shift.status, "ask_user", "{shift:?}");
    assert_eq!(s.escapes.len(), 1, "{:?}", s.escapes);
    let e = &s.escapes[0];
    assert_eq!(
        (e.component.as_str(), e.decision_type.as_str()),
        ("shift", "ambiguity")
    );
    assert!(e.question.starts_with("Which default shift"), "{e:?}");
    assert!(
        shift
            .reason
            .contains(&format!("waiting for an answer to {}", e.id)),
        "{shift:?}"
    );
    // Paused, not decided: P6 stays open.
    assert!(
        !gate(&s).contains(&("P6".into(), "passed".into())),
        "{s:#?}"
    );
}

/// A handoff whose agent asks which default to keep (the project's own
/// words; the fields are the component_skill_handoff contract's).
const QUESTION: &str = "component: shift
mode: parity-debug
files_changed: none
official_files_used: none
prototype_key_dumps: none
port_state_file: tests/local_tests/asks/PORT_STATUS.md
concerns_or_unknowns: the reference config and its preset disagree on the default shift
parity_test: tests/local_tests/asks/test_shift_parity.py
parity_status: debug_red
production_loader_strictness: stateless
strict_load: not_run
pytest_output: pytest tests/local_tests/asks/test_shift_parity.py: 1 failed
blocker: none
conversion_retry_request: none
readme_updated: no
next_step: ask_user
escape_hatch:
  needs_user_input: yes
  decision_type: ambiguity
  question: Which default shift should the port keep, the preset's 3.0 or the config's 1.0?
  recommended_option: 3.0, as the preset the test runs
  options:
    - 3.0, as the preset the test runs
    - 1.0, as the config (the test changes)
  safe_default: none
  blocked_until_answered: yes
  state_snapshot:
    phase: P6
    files_changed:
      - none
    command_or_test: pytest tests/local_tests/asks/test_shift_parity.py
    evidence: E001; the default 1.0 is off by 0.33 from the preset
";

#[tokio::test]
async fn an_environment_failure_pauses_the_port_in_environment_until_a_worker_can_run_it() {
    let h = Harness::start().await;
    let mut w1 = h.worker("w1").await;
    let spec = h.write_port("no_torch", &[Comp::new("a")], "", "");
    h.submit("no_torch", &spec).await.expect("submitted");
    answer(&mut w1, 1, |_| support::missing_module("torch")).await;
    let s = h.wait_state("no_torch", "environment").await;
    assert_eq!(s.phase, "P6");
    let a = comp(&s, "a");
    assert_eq!(a.status, "environment", "{a:?}");
    assert!(a.reason.contains("No module named 'torch'"), "{a:?}");
    assert_eq!(a.runs, 0, "an environment failure is not a run of the code");

    // A worker whose environment has torch takes the run, and the port goes on.
    let mut w2 = h.worker("w2").await;
    answer(&mut w2, 1, |_| pass()).await;
    let s = h.wait_state("no_torch", "waiting").await;
    assert_eq!(
        (
            comp(&s, "a").status.as_str(),
            comp(&s, "a").runs,
            comp(&s, "a").worker_id.as_str()
        ),
        ("non_skip_pass", 1, "w2")
    );
}

#[tokio::test]
async fn a_resubmitted_spec_reruns_only_the_component_it_changed() {
    let h = Harness::start().await;
    let mut w = h.worker("w1").await;
    let spec = h.write_port("replan", &[Comp::new("a"), Comp::new("b")], "", "");
    h.submit("replan", &spec).await.expect("submitted");
    answer(&mut w, 2, |_| pass()).await;
    h.wait_state("replan", "waiting").await;

    let spec = h.write_port(
        "replan",
        &[Comp::new("a"), Comp::new("b").with("timeout_s = 90")],
        "",
        "",
    );
    let r = h.submit("replan", &spec).await.expect("resubmitted");
    assert!(r.resumed);
    assert_eq!(
        r.changes,
        ["component b: timeout 60 s -> 90 s; it runs again"]
    );
    let a = assigned(&mut w).await;
    assert_eq!(component_of(&a), "b", "only b runs again: {a:?}");
    assert_eq!(a.timeout_ms, 90_000);
    w.run(&a, pass()).await;
    let s = h
        .wait_for("replan", "b passed its second run", |s| {
            s.state == "waiting" && comp(s, "b").runs == 2
        })
        .await;
    assert_eq!(comp(&s, "a").runs, 1, "a kept its verdict");
    assert_eq!(comp(&s, "b").status, "non_skip_pass");
}
