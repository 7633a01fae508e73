//! The phases after P7 (issue #42). P8 (config, presets, registry) is a
//! person's to accept and is recorded pending with why. P9 verifies in the
//! workflow's order at the one commit P7 ran (the port's, with every
//! component's fix): conversion (fvd does not run it: a port that needs it
//! waits there), every component's parity (a verdict of that commit
//! counts; a component whose pass is of another commit runs again there),
//! the pipeline's smoke and parity tests (P7 ran them at that commit), and
//! last the basic example, judged by its exit status. A failure stops the
//! sequence and says where it goes back. P10 runs the quality regression
//! tests; one that skips (its references are a person's to seed) is an
//! escape hatch, never a pass: seeded, it runs again; deferred, P10 is
//! recorded pending under the person's answer. P11 is a person's review.

use super::*;

use fvd_store::EscapeRow;
use fvd_store::model::JobState;
use fvd_store::states::EscapeStatus;

/// The answer to a missing quality reference that reruns the test.
pub const SEEDED: &str = "the references are seeded: run the quality test again";
/// The answer that defers quality regression (P10 then stays pending).
pub const DEFER: &str = "defer quality regression: go on to the review without it";

/// P7 passed: P8 recorded as a person's, then P9 at the pipeline's commit.
/// `Ok(false)` while runs go on, `Ok(true)` once the port ends for now.
pub(super) async fn verification(
    myself: &ActorRef<GateMsg>,
    st: &mut GateState,
) -> Result<bool, ActorProcessingErr> {
    record(
        st,
        Phase::PipelineConfigPresetsRegistryExamples,
        GateOutcome::Pending,
        vec!["pipeline config, presets and registry are a person's to accept (no pipeline handoff covers them); P9 runs the example".into()],
    )
    .await?;
    let p9 = Phase::ParityActivationAndLocalVerification;
    let needs = st.args.spec.prep.get("needs_conversion").cloned();
    if needs.as_deref() != Some("no") {
        record(
            st,
            p9,
            GateOutcome::Pending,
            vec![format!(
                "needs_conversion: {}; P9 starts with the conversion, which fvd does not run",
                needs.as_deref().unwrap_or("missing")
            )],
        )
        .await?;
        wait_after(st, Phase::QualityRegression).await?;
        set_state(st, PortState::Waiting, p9).await?;
        return Ok(true);
    }
    st.phase = p9;
    record(st, p9, GateOutcome::Entered, vec![]).await?;
    set_state(st, PortState::Running, p9).await?;
    let stale = of_other_code(st).await?;
    if stale.is_empty() {
        return example(myself, st).await;
    }
    st.wave = stale.iter().map(|c| c.name.clone()).collect();
    for c in stale {
        st.args
            .store
            .reset_component(&st.args.family, &c.name)
            .await?;
        st.finals.remove(&c.name);
        // Its own test, at the pipeline's commit: no agent loop here.
        let mut c = c.clone();
        c.agent = None;
        spawn_component(myself, st, &c).await?;
    }
    Ok(false)
}

/// A P9 step is final: the components it ran again (all final), or the
/// example.
pub(super) async fn after_verification(
    myself: &ActorRef<GateMsg>,
    st: &mut GateState,
    name: &str,
) -> Result<bool, ActorProcessingErr> {
    let p9 = Phase::ParityActivationAndLocalVerification;
    let commit = short(&pipeline_commit(st));
    if name != fvd_spec::later::EXAMPLE_STEP {
        let red: Vec<String> = st
            .wave
            .iter()
            .filter_map(|n| {
                let r = &st.finals[n];
                (r.status != ComponentStatus::NonSkipPass).then(|| {
                    format!(
                        "component {n} passes at its own commit but is {} ({}) at {commit}, the commit that holds every fix: back to P6 for {n}",
                        r.status, r.reason
                    )
                })
            })
            .collect();
        if red.is_empty() {
            return example(myself, st).await;
        }
        refuse(st, p9, red).await?;
        set_state(st, PortState::Blocked, Phase::ComponentParityDebug).await?;
        return Ok(true);
    }
    let row = &st.finals[name];
    let argv = st
        .args
        .spec
        .example_step()
        .map(|c| c.argv().join(" "))
        .unwrap_or_default();
    if row.status != ComponentStatus::NonSkipPass {
        let why = format!("the example `{argv}` is {} ({})", row.status, row.reason);
        let whose = "the pipeline's own (its example, config or presets): fix it and resubmit";
        refuse(st, p9, vec![why, whose.into()]).await?;
        return Ok(true);
    }
    let mut order: Vec<String> = st
        .args
        .spec
        .parity_components()
        .map(|c| c.name.clone())
        .collect();
    order.extend(st.args.spec.pipeline_steps().map(|c| c.name.clone()));
    record(
        st,
        p9,
        GateOutcome::Passed,
        vec![format!(
            "at {commit}, in order: needs_conversion no; {} non_skip_pass; the example `{argv}` exited 0",
            order.join(", ")
        )],
    )
    .await?;
    quality(myself, st).await
}

/// P9's last step: the basic example, or P9 pending without one.
async fn example(
    myself: &ActorRef<GateMsg>,
    st: &mut GateState,
) -> Result<bool, ActorProcessingErr> {
    let Some(ex) = st.args.spec.example_step().cloned() else {
        let commit = short(&pipeline_commit(st));
        record(
            st,
            Phase::ParityActivationAndLocalVerification,
            GateOutcome::Pending,
            vec![format!(
                "every component and pipeline step passes at {commit}; P9 ends with the basic example, and the spec declares none ([pipeline] example)"
            )],
        )
        .await?;
        wait_after(st, Phase::QualityRegression).await?;
        set_state(
            st,
            PortState::Waiting,
            Phase::ParityActivationAndLocalVerification,
        )
        .await?;
        return Ok(true);
    };
    forget_of_other_code(st, vec![ex.name.clone()]).await?;
    st.wave = [ex.name.clone()].into();
    spawn_component(myself, st, &ex).await?;
    Ok(false)
}

/// P10: the quality tests one at a time, or P10 pending without any.
async fn quality(
    myself: &ActorRef<GateMsg>,
    st: &mut GateState,
) -> Result<bool, ActorProcessingErr> {
    let p10 = Phase::QualityRegression;
    let steps: Vec<fvd_spec::ComponentSpec> = st.args.spec.quality_steps().cloned().collect();
    let Some(first) = steps.first() else {
        record(
            st,
            p10,
            GateOutcome::Pending,
            vec!["no [quality] test in the spec: a video SSIM or an audio metric test, or a person's explicit deferral".into()],
        )
        .await?;
        return review(st).await;
    };
    st.phase = p10;
    record(st, p10, GateOutcome::Entered, vec![]).await?;
    set_state(st, PortState::Running, p10).await?;
    forget_of_other_code(st, steps.iter().map(|c| c.name.clone()).collect()).await?;
    st.wave = [first.name.clone()].into();
    spawn_component(myself, st, first).await?;
    Ok(false)
}

/// A quality test is final: the next one after a pass, P10 passed after
/// the last; a skip asks a person for its references; anything else
/// refuses P10.
pub(super) async fn after_quality(
    myself: &ActorRef<GateMsg>,
    st: &mut GateState,
    name: &str,
) -> Result<bool, ActorProcessingErr> {
    let p10 = Phase::QualityRegression;
    let steps: Vec<fvd_spec::ComponentSpec> = st.args.spec.quality_steps().cloned().collect();
    let row = st.finals[name].clone();
    let test = steps
        .iter()
        .find(|c| c.name == name)
        .map(|c| c.parity_tests.join(" "))
        .unwrap_or_default();
    if row.status == ComponentStatus::NonSkipPass {
        if let Some(next) = steps.iter().skip_while(|c| c.name != name).nth(1) {
            st.wave = [next.name.clone()].into();
            spawn_component(myself, st, next).await?;
            return Ok(false);
        }
        let passed: Vec<String> = steps
            .iter()
            .map(|c| format!("{} non_skip_pass", c.name))
            .collect();
        record(st, p10, GateOutcome::Passed, vec![passed.join(", ")]).await?;
        return review(st).await;
    }
    if row.verdict == RecordedVerdict::ScaffoldSkip {
        return missing_reference(myself, st, name, &test, &row.reason).await;
    }
    let why = format!("{name} ({test}) is {} ({})", row.status, row.reason);
    refuse(st, p10, vec![why]).await?;
    Ok(true)
}

/// A quality test that skipped: its references are a person's to seed. The
/// latest escape hatch of the test decides: answered, it is acted on
/// (seeded: the test runs again; deferred: P10 pending under the answer);
/// open, the port waits for it; none yet (or a rerun skipped again), one
/// is raised and the port pauses for it.
async fn missing_reference(
    myself: &ActorRef<GateMsg>,
    st: &mut GateState,
    name: &str,
    test: &str,
    reason: &str,
) -> Result<bool, ActorProcessingErr> {
    let p10 = Phase::QualityRegression;
    let family = st.args.family.clone();
    let latest = st
        .args
        .store
        .escapes(&family)
        .await?
        .into_iter()
        .rfind(|e| e.component == name);
    match latest {
        Some(e) if e.status == EscapeStatus::Open => {
            set_state(st, PortState::AskUser, p10).await?;
            Ok(true)
        }
        Some(e) if e.status == EscapeStatus::Answered && !defers(&e) => {
            st.args
                .store
                .resolve_escape(&family, &e.id, Some(name))
                .await?;
            st.finals.remove(name);
            let c = st
                .args
                .spec
                .quality_steps()
                .find(|c| c.name == name)
                .cloned();
            let c = c.ok_or("a quality step of the spec")?;
            spawn_component(myself, st, &c).await?;
            Ok(false)
        }
        Some(e) if defers(&e) && e.status != EscapeStatus::Withdrawn => {
            if e.status == EscapeStatus::Answered {
                st.args.store.resolve_escape(&family, &e.id, None).await?;
            }
            let by = match e.answered_by.as_str() {
                "" => String::new(),
                who => format!(" by {who}"),
            };
            record(
                st,
                p10,
                GateOutcome::Pending,
                vec![format!(
                    "{name} ({test}) skipped ({reason}); quality regression deferred{by} in answer to {}",
                    e.id
                )],
            )
            .await?;
            review(st).await
        }
        _ => {
            let floor = crate::port_status::escape_floor(&st.args.store, &family)
                .await
                .unwrap_or(0);
            let hatch = EscapeRow {
                family: family.clone(),
                component: name.to_string(),
                phase: p10.id(),
                decision_type: "blocker".into(),
                question: format!(
                    "the quality test {test} skipped ({reason}): its reference outputs are not seeded. Seed them (the family's seeded references, on the reference hardware) and run it again, or defer quality regression?"
                ),
                recommended: SEEDED.into(),
                options: vec![SEEDED.into(), DEFER.into()],
                safe_default: DEFER.into(),
                ..EscapeRow::default()
            };
            let id = st.args.store.raise_escape(&hatch, floor).await?;
            tracing::info!(%family, %id, step = %name, "a quality test's references are missing: a person decides");
            spans::escape_hatch(&st.span, &p10.id(), "ask_user");
            set_state(st, PortState::AskUser, p10).await?;
            Ok(true)
        }
    }
}

/// Whether an answer to a missing reference defers quality regression:
/// only its option saying so does; anything else runs the test again (a
/// rerun that skips again asks again, never a pass).
fn defers(e: &EscapeRow) -> bool {
    e.answer.starts_with("option 2:") && e.answer.ends_with(DEFER)
}

/// P11: a person's review; the port waits for it.
async fn review(st: &mut GateState) -> Result<bool, ActorProcessingErr> {
    let p11 = Phase::PostParityReviewAndHandoff;
    record(
        st,
        p11,
        GateOutcome::Pending,
        vec!["post-parity review and handoff need a person".into()],
    )
    .await?;
    set_state(st, PortState::Waiting, p11).await?;
    Ok(true)
}

/// The components whose recorded pass is of another commit than the
/// pipeline's: P9 runs them again there.
async fn of_other_code(st: &GateState) -> Result<Vec<fvd_spec::ComponentSpec>, ActorProcessingErr> {
    let commit = pipeline_commit(st);
    let mut out = Vec::new();
    if commit.is_empty() {
        return Ok(out);
    }
    for c in st.args.spec.parity_components() {
        let jobs = st.args.store.jobs_of(&st.args.family, &c.name).await?;
        let last = jobs.iter().rev().find(|j| j.state == JobState::Finished);
        if last.is_none_or(|j| j.commit != commit) {
            out.push(c.clone());
        }
    }
    Ok(out)
}

fn pipeline_commit(st: &GateState) -> String {
    st.pipeline_code
        .as_ref()
        .map_or_else(|| st.args.code.commit.clone(), |c| c.commit.clone())
}

/// A commit as people read it.
fn short(sha: &str) -> String {
    match sha {
        "" => "the checkout (not in git)".into(),
        s => s[..s.len().min(12)].to_string(),
    }
}

async fn set_state(
    st: &GateState,
    state: PortState,
    phase: Phase,
) -> Result<(), ActorProcessingErr> {
    st.args
        .store
        .set_port_state(&st.args.family, state, &phase.id())
        .await?;
    Ok(())
}
