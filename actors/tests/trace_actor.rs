//! The trace actor against the real scheduler and a simulated worker (a
//! channel standing in for its stream) that answers each traced rerun with
//! the rank files a traced run of a two-rank, tensor-parallel port would
//! send back: the investigation narrows from the blocks to the first
//! divergent block's modules, stops at the leaf or at its depth, and ends
//! with an error outcome when no file came back.

mod common;
use common::Sink;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fvd_actors::diagnosis::{DiagnosisArgs, DiagnosisMsg};
use fvd_actors::red_run::Diagnosis;
use fvd_actors::red_run::RedRun;
use fvd_actors::scheduler::{SchedulerActor, SchedulerArgs, SchedulerConfig, SchedulerMsg};
use fvd_actors::trace_actor::TraceActor;
use fvd_contracts::verdict::Verdict;
use fvd_store::Store;
use fvd_store::clock::ManualClock;
use fvd_store::messages::{CollectedFile, JobReport, ToWorker, WorkerInfo};
use fvd_store::model::{ComponentStatus, JobRecord, PortRow};
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

[component.trace]
layers = '^blocks\.\d+$'
reference = "ref/rank*.jsonl"
port = "port/rank*.jsonl"
depth = DEPTH
"#;

struct Harness {
    dir: tempfile::TempDir,
    store: Store,
    trace: ActorRef<DiagnosisMsg>,
    component: ActorRef<Diagnosis>,
    answers: mpsc::UnboundedReceiver<Diagnosis>,
    /// What the actor told the component to show on its row, in order.
    progress: Vec<(ComponentStatus, String)>,
    worker: mpsc::Receiver<ToWorker>,
    sched: ActorRef<SchedulerMsg>,
}

impl Harness {
    async fn new() -> Self {
        Self::with_fleet(false).await
    }

    /// `fixed`: the scheduler's fleet is fixed (embedded mode), so a
    /// rerun no worker can hold is refused at once.
    async fn with_fleet(fixed: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_path(&dir.path().join("state.db"))
            .await
            .unwrap();
        store
            .create_port(
                &PortRow {
                    family: "p".into(),
                    repo: "/repo".into(),
                    state: fvd_store::model::PortState::Running,
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
                    fixed_fleet: fixed,
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
                    cpu_slots: 1,
                    labels: Default::default(),
                    provides: Vec::new(),
                }),
                tx,
                conn: 1,
            })
            .unwrap();
        let (trace, _) = Actor::spawn(
            None,
            TraceActor,
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
        Self {
            dir,
            store,
            trace,
            component,
            answers,
            progress: Vec::new(),
            worker,
            sched,
        }
    }

    /// Hands a red run of `c` to the trace actor, as the component does.
    async fn investigate(&self, depth: u32) {
        self.investigate_needing(depth, 0).await
    }

    /// [`Harness::investigate`] of a component that needs `gpus` GPUs.
    async fn investigate_needing(&self, depth: u32, gpus: u32) {
        let text = SPEC.replace("DEPTH", &depth.to_string()).replace(
            "coverage_scope = \"both\"\n",
            &format!("coverage_scope = \"both\"\ngpus = {gpus}\n"),
        );
        let spec = fvd_spec::parse(Path::new("port.toml"), &text).unwrap();
        assert_eq!(spec.components[0].gpus, gpus);
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
        self.trace
            .cast(DiagnosisMsg::Diagnose(Box::new(RedRun {
                spec: spec.components[0].clone(),
                report: JobReport {
                    job_id: red.job_id,
                    ..JobReport::default()
                },
                worker_id: "w".into(),
                verdict: Verdict::DebugRed {
                    failures: Vec::new(),
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

    /// The next traced rerun the worker gets: its job, epoch, env and cwd.
    async fn assigned(&mut self) -> fvd_store::messages::Assignment {
        match tokio::time::timeout(Duration::from_secs(5), self.worker.recv()).await {
            Ok(Some(ToWorker::Assign(a))) => *a,
            other => panic!("expected an assignment, got {other:?}"),
        }
    }

    fn finish(&self, a: &fvd_store::messages::Assignment, files: Vec<CollectedFile>, error: &str) {
        self.sched
            .cast(SchedulerMsg::Finished {
                worker_id: "w".into(),
                report: Box::new(JobReport {
                    job_id: a.job_id.clone(),
                    lease_epoch: a.lease_epoch,
                    exit_code: Some(1),
                    files,
                    files_error: error.into(),
                    ..JobReport::default()
                }),
            })
            .unwrap();
    }

    async fn answer(&mut self) -> String {
        self.answer_for_run(1).await
    }
}

/// One JSONL record of `module` with abs_mean `a` and max `m` on a
/// `[4, cols]` tensor.
fn rec(module: &str, a: f64, m: f64, cols: u64, rank: u32, world: u32) -> String {
    format!(
        "{{\"module\": \"{module}\", \"tensor\": \"out\", \"step\": 0, \"abs_mean\": {a}, \"max\": {m}, \"shape\": [4, {cols}], \"rank\": {rank}, \"world_size\": {world}}}\n"
    )
}

/// The files of a traced run over `modules` `(name, reference abs_mean,
/// port abs_mean)`: one reference rank with `[4, 8]` tensors and two port
/// ranks holding `[4, 4]` halves (tensor parallel) whose stats differ
/// (so they are shards, not replicas) and merge to the port's value.
fn files(modules: &[(&str, f64, f64)]) -> Vec<CollectedFile> {
    let side = |f: &dyn Fn(&(&str, f64, f64)) -> String| modules.iter().map(f).collect::<String>();
    vec![
        CollectedFile {
            path: "ref/rank0.jsonl".into(),
            data: side(&|m| rec(m.0, m.1, 3.3 * m.1, 8, 0, 1)).into_bytes(),
        },
        CollectedFile {
            path: "port/rank0.jsonl".into(),
            data: side(&|m| rec(m.0, 0.9 * m.2, 2.7 * m.2, 4, 0, 2)).into_bytes(),
        },
        CollectedFile {
            path: "port/rank1.jsonl".into(),
            data: side(&|m| rec(m.0, 1.1 * m.2, 3.3 * m.2, 4, 1, 2)).into_bytes(),
        },
    ]
}

#[tokio::test]
async fn narrows_from_the_blocks_to_the_first_divergent_leaf() {
    let mut h = Harness::new().await;
    h.investigate(3).await;

    let a = h.assigned().await;
    assert_eq!(a.job_id, "p.c#trace.1");
    assert_eq!(a.cwd, "/repo/wt", "the rerun tests what the red run tested");
    assert_eq!(a.collect_env.as_deref(), Some("FVD_TRACE_DIR"));
    assert_eq!(a.env["FASTVIDEO_TRACE_ACTIVATIONS"], "1");
    assert_eq!(a.env["FASTVIDEO_TRACE_LAYERS"], r"^blocks\.\d+$");
    assert_eq!(
        a.env["FASTVIDEO_TRACE_OUTPUT"],
        "{collect_dir}/port_rank<rank>.jsonl"
    );
    let busy = ractor::call_t!(h.trace, DiagnosisMsg::InFlight, 5000).unwrap();
    assert_eq!(busy, ["c"]);
    h.finish(
        &a,
        files(&[
            ("blocks.0", 1.0, 1.0),
            ("blocks.1", 1.0, 1.3),
            ("blocks.2", 1.0, 1.6),
        ]),
        "",
    );

    let a = h.assigned().await;
    assert_eq!(a.job_id, "p.c#trace.2");
    assert_eq!(a.env["FASTVIDEO_TRACE_LAYERS"], r"^blocks\.1(\.|$)");
    assert_eq!(a.env["FVD_TRACE_REFERENCE_LAYERS"], r"^blocks\.1(\.|$)");
    h.finish(
        &a,
        files(&[
            ("blocks.1.attn", 1.0, 1.0),
            ("blocks.1.mlp", 2.0, 2.5),
            ("blocks.1", 1.0, 1.3),
        ]),
        "",
    );

    let summary = h.answer().await;
    assert_eq!(
        summary,
        "first divergence: blocks.1.mlp abs_mean drift 0.200 (reference blocks.1.mlp, step 0; leaf after 2 trace steps)"
    );
    let busy = ractor::call_t!(h.trace, DiagnosisMsg::InFlight, 5000).unwrap();
    assert!(busy.is_empty(), "{busy:?}");
    // Each step was shown on the component's row by the component, which
    // the actor told; the actor itself never wrote the row.
    assert_eq!(
        h.progress,
        [
            (
                ComponentStatus::Tracing,
                r"trace step 1 of at most 3: FASTVIDEO_TRACE_LAYERS=^blocks\.\d+$".to_string()
            ),
            (
                ComponentStatus::Tracing,
                r"trace step 2 of at most 3: FASTVIDEO_TRACE_LAYERS=^blocks\.1(\.|$)".to_string()
            ),
        ]
    );
    let row = h.store.components("p").await.unwrap().remove(0);
    assert_ne!(row.status, ComponentStatus::Tracing, "{row:?}");

    let inv = h.store.latest_trace("p", "c").await.unwrap().unwrap();
    assert_eq!((inv.outcome.as_str(), inv.steps.len()), ("leaf", 2));
    assert_eq!(inv.steps[0].first_module, "blocks.1");
    assert_eq!(inv.steps[1].first_module, "blocks.1.mlp");
    // The two port ranks were merged back to the reference's shape.
    let rows = inv.steps[0].report.as_ref().unwrap()["rows"].clone();
    assert_eq!(rows[0]["port_shape"], serde_json::json!([4, 8]), "{rows}");
    // The files are kept where the store keeps its own, one folder per rerun.
    assert!(h.dir.path().join("trace/p/c/2/port/rank1.jsonl").is_file());
    assert_eq!(
        h.store.latest_trace_summary("p", "c").await.unwrap(),
        Some(summary)
    );
    // The reruns' verdicts are recorded under their own name, not as runs of `c`.
    assert_eq!(h.store.jobs_of("p", "c#trace").await.unwrap().len(), 2);
    assert_eq!(h.store.jobs_of("p", "c").await.unwrap().len(), 1);
}

#[tokio::test]
async fn depth_ends_the_drill_before_a_leaf_and_missing_files_end_it_in_error() {
    let mut h = Harness::new().await;
    h.investigate(1).await;
    let a = h.assigned().await;
    h.finish(
        &a,
        files(&[("blocks.0", 1.0, 1.0), ("blocks.1", 1.0, 1.3)]),
        "",
    );
    let summary = h.answer().await;
    assert!(
        summary.starts_with("first divergence: blocks.1 abs_mean drift 0.231 ")
            && summary.ends_with("; trace depth 1 spent before a leaf)"),
        "{summary}"
    );
    assert_eq!(
        h.store
            .latest_trace("p", "c")
            .await
            .unwrap()
            .unwrap()
            .outcome
            .as_str(),
        "depth"
    );

    // A rerun whose folder could not come back ends the investigation.
    let mut h = Harness::new().await;
    h.investigate(3).await;
    let a = h.assigned().await;
    h.finish(&a, Vec::new(), "collected folder /w holds 9 bytes");
    let summary = h.answer().await;
    assert_eq!(
        summary,
        "trace step 1 failed: no trace files came back: collected folder /w holds 9 bytes"
    );
    // And so does one whose files match no glob, naming what was there.
    h.investigate(3).await;
    let a = h.assigned().await;
    let mut f = files(&[("blocks.0", 1.0, 1.0)]);
    f.retain(|c| c.path.starts_with("ref/"));
    h.finish(&a, f, "");
    let summary = h.answer_for_run(2).await;
    assert!(
        summary.contains("no port trace file matches \"port/rank*.jsonl\" among the 1 file(s) the traced rerun wrote (ref/rank0.jsonl)"),
        "{summary}"
    );
}

impl Harness {
    /// Like [`Harness::answer`], for the red run `p.c.N`: the run comes
    /// back with its summary, after what the actor told the component to
    /// show meanwhile (kept in `progress`).
    async fn answer_for_run(&mut self, n: u32) -> String {
        loop {
            match tokio::time::timeout(Duration::from_secs(10), self.answers.recv()).await {
                Ok(Some(Diagnosis::Progress {
                    job_id,
                    status,
                    reason,
                    ..
                })) => {
                    assert_eq!(job_id, format!("p.c.{n}"));
                    self.progress.push((status, reason));
                }
                Ok(Some(Diagnosis::Done(run))) => {
                    assert_eq!(
                        run.report.job_id,
                        format!("p.c.{n}"),
                        "the red run comes back"
                    );
                    assert!(run.route.is_empty() && run.variant_note.is_empty());
                    return run.trace_summary;
                }
                other => panic!("expected the investigation's answer, got {other:?}"),
            }
        }
    }
}

/// Files of a traced run whose two sides name different modules: the
/// reference `(module, abs_mean)` rows and the port's, one rank each.
fn sides(reference: &[(&str, f64)], port: &[(&str, f64)]) -> Vec<CollectedFile> {
    let side = |rows: &[(&str, f64)]| {
        rows.iter()
            .map(|(m, a)| rec(m, *a, 3.3 * a, 8, 0, 1))
            .collect::<String>()
            .into_bytes()
    };
    vec![
        CollectedFile {
            path: "ref/rank0.jsonl".into(),
            data: side(reference),
        },
        CollectedFile {
            path: "port/rank0.jsonl".into(),
            data: side(port),
        },
    ]
}

#[tokio::test]
async fn a_step_that_compares_nothing_fails_the_investigation() {
    // The port's modules have other names than the reference's.
    let mut h = Harness::new().await;
    h.investigate(3).await;
    let a = h.assigned().await;
    h.finish(
        &a,
        sides(
            &[("blocks.0", 1.0), ("blocks.1", 1.0)],
            &[("layers.0", 1.0), ("layers.1", 1.3)],
        ),
        "",
    );
    let summary = h.answer().await;
    assert!(
        summary.starts_with("trace step 1 failed: nothing_compared: "),
        "{summary}"
    );
    assert!(!summary.contains("no divergence"), "{summary}");
    let inv = h.store.latest_trace("p", "c").await.unwrap().unwrap();
    assert_eq!((inv.outcome.as_str(), inv.steps.len()), ("error", 1));
    assert!(
        inv.steps[0].error.starts_with("nothing_compared: "),
        "{:?}",
        inv.steps[0]
    );
    // The report is kept, and says so first.
    let rep = inv.steps[0].report.as_ref().unwrap();
    assert_eq!(rep["diagnostics"][0]["code"], "nothing_compared", "{rep}");

    // An empty port trace: the same.
    h.investigate(3).await;
    let a = h.assigned().await;
    let mut f = sides(&[("blocks.0", 1.0)], &[]);
    assert!(f[1].data.is_empty());
    f[1].path = "port/rank0.jsonl".into();
    h.finish(&a, f, "");
    let summary = h.answer_for_run(2).await;
    assert!(
        summary.starts_with("trace step 1 failed: nothing_compared: "),
        "{summary}"
    );
}

/// Block outputs whose reference labels run one block ahead of the port's
/// (`blocks.N` of the port is `blocks.N+1` of the reference), and, with
/// `insides`, their sub-modules matching in place.
fn shifted(insides: bool) -> Vec<CollectedFile> {
    let mut rows: Vec<(String, f64, f64)> = Vec::new();
    for n in 0..4 {
        if insides {
            rows.push((format!("blocks.{n}.attn"), 0.5 + n as f64, 0.5 + n as f64));
            rows.push((format!("blocks.{n}.mlp"), 0.7 + n as f64, 0.7 + n as f64));
        }
        // Reference: block n's output is 1 + n; the port writes block n's
        // real output, which the reference labels n + 1.
        rows.push((format!("blocks.{n}"), 1.0 + n as f64, 2.0 + n as f64));
    }
    let refs: Vec<(&str, f64, f64)> = rows.iter().map(|(m, a, b)| (m.as_str(), *a, *b)).collect();
    files(&refs)
}

#[tokio::test]
async fn a_shifted_dumper_is_an_untrusted_comparison_not_a_divergence() {
    let mut h = Harness::new().await;
    h.investigate(3).await;
    let a = h.assigned().await;
    h.finish(&a, shifted(true), "");
    let summary = h.answer().await;
    assert!(
        summary.starts_with(
            "trace step 1: comparison untrusted, no verdict on the port: layer_shift: port blocks.N:out matches reference blocks.N+1:out for N = 0, 1, 2"
        ),
        "{summary}"
    );
    assert!(
        summary.contains("check: the dumpers' indexing"),
        "{summary}"
    );
    assert!(!summary.contains("first divergence"), "{summary}");
    let inv = h.store.latest_trace("p", "c").await.unwrap().unwrap();
    assert_eq!((inv.outcome.as_str(), inv.steps.len()), ("untrusted", 1));
    let rep = inv.steps[0].report.as_ref().unwrap();
    assert_eq!(rep["verdict"], "untrusted");
    assert_eq!(rep["signatures"][0]["evidence"]["offset"], 1, "{rep}");
    // What the agent's packet is given is that summary.
    assert_eq!(
        h.store.latest_trace_summary("p", "c").await.unwrap(),
        Some(summary)
    );
}

#[tokio::test]
async fn a_shift_seen_on_block_outputs_is_confirmed_by_their_insides() {
    // Step 1 traces the block outputs only: a shift candidate that does not
    // stop the drill (the port's layers could be shifted too).
    let mut h = Harness::new().await;
    h.investigate(3).await;
    let a = h.assigned().await;
    h.finish(&a, shifted(false), "");
    let a = h.assigned().await;
    assert_eq!(a.env["FASTVIDEO_TRACE_LAYERS"], r"^blocks\.0(\.|$)");
    // Step 2: block 0's insides match in place, its output does not.
    h.finish(
        &a,
        files(&[
            ("blocks.0.attn", 0.5, 0.5),
            ("blocks.0.mlp", 0.7, 0.7),
            ("blocks.0", 1.0, 2.0),
        ]),
        "",
    );
    let summary = h.answer().await;
    assert!(
        summary.starts_with(
            "trace step 2: comparison untrusted, no verdict on the port: layer_shift: "
        ),
        "{summary}"
    );
    assert!(
        summary.contains("the next step traced the insides of blocks.0: all 2 match in place"),
        "{summary}"
    );
    let inv = h.store.latest_trace("p", "c").await.unwrap().unwrap();
    assert_eq!(inv.outcome.as_str(), "untrusted");

    // With no step left to look inside, the candidate rides along in the
    // summary of the divergence it could not explain.
    let mut h = Harness::new().await;
    h.investigate(1).await;
    let a = h.assigned().await;
    h.finish(&a, shifted(false), "");
    let summary = h.answer().await;
    assert!(
        summary.starts_with("first divergence: blocks.0 ")
            && summary.contains("; comparator checks: layer_shift: port blocks.N:out matches reference blocks.N+1:out")
            && summary.contains("check: trace the blocks' sub-modules too"),
        "{summary}"
    );
}

#[tokio::test]
async fn a_worker_that_compares_where_the_files_lie_sends_only_the_report() {
    let mut h = Harness::new().await;
    h.investigate(1).await;
    let a = h.assigned().await;
    // The worker is told how to compare: the spec's globs and options.
    let c = a
        .compare
        .clone()
        .expect("a traced rerun asks for a comparison");
    assert_eq!(
        (c.reference.as_str(), c.port.as_str()),
        ("ref/rank*.jsonl", "port/rank*.jsonl")
    );
    // It compares the files of its folder (here: a folder of the test's) and
    // sends back the report alone.
    let folder = tempfile::tempdir().unwrap();
    let written = files(&[("blocks.0", 1.0, 1.0), ("blocks.1", 1.0, 1.3)]);
    let mut names = Vec::new();
    for f in &written {
        let p = folder.path().join(&f.path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &f.data).unwrap();
        names.push(f.path.clone());
    }
    let spec = fvd_trace::FolderSpec {
        reference: c.reference,
        port: c.port,
        rename: c.rename,
        tol: c.tol,
        steps: c.steps,
    };
    let rep = fvd_trace::compare_folder(folder.path(), &names, &spec).unwrap();
    h.sched
        .cast(SchedulerMsg::Finished {
            worker_id: "w".into(),
            report: Box::new(JobReport {
                job_id: a.job_id.clone(),
                lease_epoch: a.lease_epoch,
                exit_code: Some(1),
                files_error: "collected folder holds 60000000 bytes".into(),
                trace_report: Some(serde_json::to_string(&rep).unwrap()),
                collected_bytes: 60_000_000,
                collected_files: 3,
                compare_ms: 7,
                wire_bytes: 2_000,
                ..JobReport::default()
            }),
        })
        .unwrap();
    let summary = h.answer().await;
    assert!(
        summary.starts_with("first divergence: blocks.1 abs_mean drift 0.231 "),
        "{summary}"
    );
    let inv = h.store.latest_trace("p", "c").await.unwrap().unwrap();
    let t = &inv.steps[0].transport;
    assert_eq!(
        (t.compared_on.as_str(), t.files_bytes, t.files, t.wire_bytes),
        ("worker w", 60_000_000, 3, 2_000)
    );
    let diags = &inv.steps[0].report.as_ref().unwrap()["diagnostics"];
    assert!(
        diags
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["code"] == "files_on_worker"),
        "{diags}"
    );

    // A worker that could not compare says why; that is the step's error.
    h.investigate(1).await;
    let a = h.assigned().await;
    h.sched
        .cast(SchedulerMsg::Finished {
            worker_id: "w".into(),
            report: Box::new(JobReport {
                job_id: a.job_id.clone(),
                lease_epoch: a.lease_epoch,
                exit_code: Some(1),
                trace_error: "no port trace file matches \"port/rank*.jsonl\"".into(),
                ..JobReport::default()
            }),
        })
        .unwrap();
    let summary = h.answer_for_run(2).await;
    assert_eq!(
        summary,
        "trace step 1 failed: no port trace file matches \"port/rank*.jsonl\""
    );
}

/// A traced rerun no worker of a fixed fleet can ever hold (it needs a GPU,
/// the one worker has none) ends the investigation in error, saying why,
/// and the red run goes back to its component instead of waiting.
#[tokio::test]
async fn a_traced_rerun_that_cannot_be_placed_ends_the_investigation() {
    let mut h = Harness::with_fleet(true).await;
    h.investigate_needing(4, 1).await;
    let summary = h.answer().await;
    assert!(
        summary.contains("cannot be placed") && summary.contains("p.c#trace.1"),
        "{summary}"
    );
}
