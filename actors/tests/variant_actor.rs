//! The variant actor against the real scheduler and a simulated worker with
//! three CPU slots (a channel standing in for its stream): a red run's
//! variants are all assigned before any of them ends, each with its
//! overrides; their verdicts fill the table next to the baseline, and the
//! component gets the note naming what passed. With a traced component the
//! variants are traced over the red run's investigated scopes and the table
//! says where each one's first divergence lies.

mod common;
use common::Sink;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fvd_actors::diagnosis::{DiagnosisArgs, DiagnosisMsg};
use fvd_actors::red_run::Diagnosis;
use fvd_actors::red_run::RedRun;
use fvd_actors::scheduler::{SchedulerActor, SchedulerArgs, SchedulerConfig, SchedulerMsg};
use fvd_actors::variant_actor::VariantActor;
use fvd_contracts::verdict::{FailureInfo, Verdict};
use fvd_store::Store;
use fvd_store::clock::ManualClock;
use fvd_store::messages::{Assignment, JobReport, ToWorker, WorkerInfo};
use fvd_store::model::{ComponentStatus, JobRecord, PortRow, PortState};
use ractor::{Actor, ActorRef};
use tokio::sync::mpsc;

const SPEC: &str = r#"
[prep]
model_family = "p"
official_env_status = "imports_ok"

[[component]]
name = "c"
type = "dit"
parity_test = "t.py"
coverage_scope = "both"
set_env = { PYTHONPATH = "{repo}", EPS_FIX = "0" }
TRACE
[[component.variant]]
name = "eps_fix"
env = { EPS_FIX = "1" }

[[component.variant]]
name = "fp32"
env = { FASTVIDEO_DTYPE = "fp32" }

[[component.variant]]
name = "tf32_off"
env = { TORCH_ALLOW_TF32 = "0" }
"#;

const TRACE: &str = r#"
[component.trace]
layers = '^blocks\.\d+$'
reference = "ref/rank*.jsonl"
port = "port/rank*.jsonl"
"#;

struct Harness {
    _dir: tempfile::TempDir,
    store: Store,
    variants: ActorRef<DiagnosisMsg>,
    component: ActorRef<Diagnosis>,
    answers: mpsc::UnboundedReceiver<Diagnosis>,
    worker: mpsc::Receiver<ToWorker>,
    sched: ActorRef<SchedulerMsg>,
    spec: fvd_spec::ComponentSpec,
}

impl Harness {
    async fn new(traced: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_path(&dir.path().join("state.db"))
            .await
            .unwrap();
        store
            .create_port(
                &PortRow {
                    family: "p".into(),
                    repo: "/repo".into(),
                    state: PortState::Running,
                    ..PortRow::default()
                },
                &["c".into()],
            )
            .await
            .unwrap();
        let (sched, _) = Actor::spawn(
            None,
            SchedulerActor,
            SchedulerArgs {
                store: store.clone(),
                clock: Arc::new(ManualClock::default()),
                config: SchedulerConfig {
                    lease_ttl: Duration::from_secs(5),
                    tick: Duration::from_secs(3600),
                    fixed_fleet: false,
                    ..SchedulerConfig::default()
                },
            },
        )
        .await
        .unwrap();
        let (tx, worker) = mpsc::channel(64);
        sched
            .cast(SchedulerMsg::WorkerConnected {
                info: Box::new(WorkerInfo {
                    worker_id: "w".into(),
                    host: "sim".into(),
                    gpus: Vec::new(),
                    cpu_slots: 3,
                    labels: Default::default(),
                    provides: Vec::new(),
                }),
                tx,
                conn: 1,
            })
            .unwrap();
        let (variants, _) = Actor::spawn(
            None,
            VariantActor,
            DiagnosisArgs {
                family: "p".into(),
                code: Default::default(),
                store: store.clone(),
                scheduler: sched.clone(),
            },
        )
        .await
        .unwrap();
        let (atx, answers) = mpsc::unbounded_channel();
        let (component, _) = Actor::spawn(None, Sink::new(), atx).await.unwrap();
        let text = SPEC.replace("TRACE", if traced { TRACE } else { "" });
        let spec = fvd_spec::parse(Path::new("port.toml"), &text)
            .unwrap()
            .components
            .remove(0);
        Self {
            _dir: dir,
            store,
            variants,
            component,
            answers,
            worker,
            sched,
            spec,
        }
    }

    /// Queues the red run `p.c.1` and hands it over, as the component does.
    async fn vary(&self) {
        let red = self
            .store
            .queue_job(&JobRecord {
                family: "p".into(),
                component: "c".into(),
                argv: vec!["pytest".into()],
                cwd: "/repo/wt".into(),
                timeout_ms: 1000,
                ..JobRecord::default()
            })
            .await
            .unwrap();
        assert_eq!(red.job_id, "p.c.1");
        self.variants
            .cast(DiagnosisMsg::Diagnose(Box::new(RedRun {
                spec: self.spec.clone(),
                report: JobReport {
                    job_id: red.job_id,
                    ..JobReport::default()
                },
                worker_id: "w".into(),
                verdict: Verdict::DebugRed {
                    failures: vec![FailureInfo {
                        case: "t::test".into(),
                        message: "max diff 0.3".into(),
                    }],
                    failed: 1,
                    passed: 0,
                },
                component: self.component.get_derived(),
                span: tracing::Span::none(),
                route: Default::default(),
                trace_summary: String::new(),
                variant_note: String::new(),
            })))
            .unwrap();
    }

    async fn assigned(&mut self) -> Assignment {
        match tokio::time::timeout(Duration::from_secs(5), self.worker.recv()).await {
            Ok(Some(ToWorker::Assign(a))) => *a,
            other => panic!("expected an assignment, got {other:?}"),
        }
    }

    fn finish(&self, a: &Assignment, passed: bool, trace_report: Option<String>) {
        let case = if passed {
            r#"<testcase classname="t" name="test"><properties><property name="fvd_outcome" value="passed"/></properties></testcase>"#
        } else {
            r#"<testcase classname="t" name="test"><failure message="AssertionError: max diff 0.3">assert 0.3 &lt; 1e-3</failure></testcase>"#
        };
        self.sched
            .cast(SchedulerMsg::Finished {
                worker_id: "w".into(),
                report: Box::new(JobReport {
                    job_id: a.job_id.clone(),
                    lease_epoch: a.lease_epoch,
                    exit_code: Some(if passed { 0 } else { 1 }),
                    junit_xml: Some(format!(
                        r#"<testsuites><testsuite name="pytest" tests="1"><properties><property name="fvd_integrity" value="clean"/></properties>{case}</testsuite></testsuites>"#
                    )),
                    trace_report,
                    ..JobReport::default()
                }),
            })
            .unwrap();
    }

    /// What the actor tells the component next: what to show on its row
    /// (`Diagnosing`) or the red run back with the table's note.
    async fn told(&mut self) -> Diagnosis {
        match tokio::time::timeout(Duration::from_secs(10), self.answers.recv()).await {
            Ok(Some(m)) => m,
            other => panic!("expected a message to the component, got {other:?}"),
        }
    }

    async fn note(&mut self) -> String {
        loop {
            match self.told().await {
                Diagnosis::Progress { .. } => {}
                Diagnosis::Done(run) => {
                    assert_eq!(run.report.job_id, "p.c.1", "the red run comes back");
                    assert!(run.route.is_empty() && run.trace_summary.is_empty());
                    return run.variant_note;
                }
            }
        }
    }
}

#[tokio::test]
async fn every_variant_runs_at_once_and_the_table_names_the_one_that_passes() {
    let mut h = Harness::new(false).await;
    h.vary().await;
    // All three are on the worker before any of them ended.
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(h.assigned().await);
    }
    let busy = ractor::call_t!(h.variants, DiagnosisMsg::InFlight, 5000).unwrap();
    assert_eq!(busy, ["c"]);
    let by_job: Vec<(&str, &str, &str)> = runs
        .iter()
        .map(|a| {
            (
                a.job_id.as_str(),
                a.env["FVD_VARIANT"].as_str(),
                a.cwd.as_str(),
            )
        })
        .collect();
    assert_eq!(
        by_job,
        [
            ("p.c#variant.1", "eps_fix", "/repo/wt"),
            ("p.c#variant.2", "fp32", "/repo/wt"),
            ("p.c#variant.3", "tf32_off", "/repo/wt"),
        ]
    );
    // The variant's overrides win over set_env; the rest of set_env stays.
    assert_eq!(runs[0].env["EPS_FIX"], "1");
    assert_eq!(runs[1].env["EPS_FIX"], "0");
    assert_eq!(runs[1].env["FASTVIDEO_DTYPE"], "fp32");
    assert_eq!(runs[2].env["PYTHONPATH"], "{repo}");
    assert!(
        runs.iter()
            .all(|a| a.collect_env.is_none() && a.compare.is_none())
    );
    // The component is told to show them running; it writes its row, the
    // variant actor does not.
    match h.told().await {
        Diagnosis::Progress {
            job_id,
            status,
            verdict,
            reason,
        } => {
            assert_eq!(job_id, "p.c.1");
            assert_eq!(status, ComponentStatus::Variants);
            assert_eq!(verdict, fvd_store::model::RecordedVerdict::DebugRed);
            assert_eq!(reason, "3 variant run(s) at once: eps_fix, fp32, tf32_off");
        }
        other => panic!("expected the variants' progress, got {other:?}"),
    }
    let row = h.store.components("p").await.unwrap().remove(0);
    assert_ne!(row.status, ComponentStatus::Variants, "{row:?}");

    // They end in any order.
    h.finish(&runs[2], false, None);
    h.finish(&runs[0], true, None);
    h.finish(&runs[1], false, None);
    let note = h.note().await;
    assert_eq!(note, "passes with EPS_FIX=1 (variant eps_fix)");

    let t = h.store.variant_table("p", "c").await.unwrap();
    let rows: Vec<(&str, &str, &str, &str)> = t
        .iter()
        .map(|r| {
            (
                r.name.as_str(),
                r.state.as_str(),
                r.verdict.as_str(),
                r.finding.as_str(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("baseline", "done", "debug_red", "baseline"),
            ("eps_fix", "done", "non_skip_pass", "passes"),
            ("fp32", "done", "debug_red", "red"),
            ("tf32_off", "done", "debug_red", "red"),
        ]
    );
    assert_eq!(t[1].env, ["EPS_FIX=1"]);
    // Variant runs are recorded under their own name, not as runs of `c`.
    assert_eq!(h.store.jobs_of("p", "c#variant").await.unwrap().len(), 3);
    assert_eq!(h.store.jobs_of("p", "c").await.unwrap().len(), 1);
    let busy = ractor::call_t!(h.variants, DiagnosisMsg::InFlight, 5000).unwrap();
    assert!(busy.is_empty(), "{busy:?}");
}

/// A report of a traced run over `blocks` (module, port abs_mean) against a
/// reference of abs_mean 1.0 each, as the worker would send it.
fn report(blocks: &[(&str, f64)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let rec = |m: &str, a: f64| {
        format!(
            "{{\"module\": \"{m}\", \"tensor\": \"out\", \"step\": 0, \"abs_mean\": {a}, \"max\": {}, \"shape\": [4, 8], \"rank\": 0, \"world_size\": 1}}\n",
            3.0 * a
        )
    };
    std::fs::create_dir_all(dir.path().join("ref")).unwrap();
    std::fs::create_dir_all(dir.path().join("port")).unwrap();
    let reference: String = blocks.iter().map(|(m, _)| rec(m, 1.0)).collect();
    let port: String = blocks.iter().map(|(m, a)| rec(m, *a)).collect();
    std::fs::write(dir.path().join("ref/rank0.jsonl"), reference).unwrap();
    std::fs::write(dir.path().join("port/rank0.jsonl"), port).unwrap();
    let spec = fvd_trace::FolderSpec {
        reference: "ref/rank*.jsonl".into(),
        port: "port/rank*.jsonl".into(),
        ..Default::default()
    };
    let rep = fvd_trace::compare_folder(
        dir.path(),
        &["port/rank0.jsonl".into(), "ref/rank0.jsonl".into()],
        &spec,
    )
    .unwrap();
    serde_json::to_string(&rep).unwrap()
}

#[tokio::test]
async fn traced_variants_say_where_each_first_divergence_lies() {
    let mut h = Harness::new(true).await;
    // The red run's investigation: the blocks, then block 2's insides,
    // whose norm diverges first.
    let inv = h.store.start_trace("p", "c", "p.c.1").await.unwrap();
    for (step, layers, first, json) in [
        (
            1,
            r"^blocks\.\d+$",
            "blocks.2",
            report(&[("blocks.1", 1.0), ("blocks.2", 1.5)]),
        ),
        (
            2,
            r"^blocks\.2(\.|$)",
            "blocks.2.norm",
            report(&[("blocks.2.norm", 1.5), ("blocks.2", 1.5)]),
        ),
    ] {
        let job = format!("p.c#trace.{step}");
        h.store
            .add_trace_step(inv, step, layers, layers, &job)
            .await
            .unwrap();
        h.store
            .finish_trace_step(inv, step, "", first, &json, "")
            .await
            .unwrap();
    }
    h.store
        .finish_trace(
            inv,
            fvd_store::states::TraceOutcome::Leaf,
            "first divergence: blocks.2.norm",
        )
        .await
        .unwrap();
    h.vary().await;
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(h.assigned().await);
    }
    // One traced run each, over every scope the investigation traced.
    for a in &runs {
        assert_eq!(
            a.env["FASTVIDEO_TRACE_LAYERS"],
            r"(?:^blocks\.\d+$)|(?:^blocks\.2(\.|$))"
        );
        assert_eq!(a.env["FASTVIDEO_TRACE_ACTIVATIONS"], "1");
        assert_eq!(a.collect_env.as_deref(), Some("FVD_TRACE_DIR"));
        let c = a.compare.as_ref().expect("compared on the worker");
        assert_eq!(c.port, "port/rank*.jsonl");
    }
    // eps_fix: green, nothing diverges; fp32: block 1 diverges first now;
    // tf32_off: the same norm.
    h.finish(
        &runs[0],
        true,
        Some(report(&[("blocks.1", 1.0), ("blocks.2.norm", 1.0)])),
    );
    h.finish(
        &runs[1],
        false,
        Some(report(&[("blocks.1", 1.4), ("blocks.2.norm", 1.5)])),
    );
    h.finish(
        &runs[2],
        false,
        Some(report(&[("blocks.1", 1.0), ("blocks.2.norm", 1.5)])),
    );
    let note = h.note().await;
    assert_eq!(
        note,
        "passes with EPS_FIX=1 (variant eps_fix); with FASTVIDEO_DTYPE=fp32 (variant fp32) the first divergence moves to blocks.1"
    );
    let t = h.store.variant_table("p", "c").await.unwrap();
    let rows: Vec<(&str, &str, &str)> = t
        .iter()
        .map(|r| {
            (
                r.name.as_str(),
                r.first_divergence.as_str(),
                r.finding.as_str(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("baseline", "blocks.2.norm", "baseline"),
            ("eps_fix", "", "passes"),
            ("fp32", "blocks.1", "moves"),
            ("tf32_off", "blocks.2.norm", "same"),
        ]
    );
    assert!(t[2].drift.unwrap() > 0.2, "{:?}", t[2]);
}
