//! The gRPC edge in-process: authentication, how refused requests map to
//! status codes, what it keeps of a worker's result, and lease fencing of
//! results over a real `Connect` stream, with the manual clock expiring
//! leases.

mod support;

use fvd_proto::auth::Token;
use fvd_proto::v1 as pb;
use support::{Comp, Harness, SimWorker, answer, assigned, comp, component_of, fail, pass};
use tonic::Code;

#[tokio::test]
async fn with_a_token_every_call_without_it_is_refused() {
    let token = Token::random();
    let h = Harness::start_with(Some(token.clone())).await;
    let status = |t: Option<Token>| {
        let mut ports = h.ports_with(t);
        async move {
            ports
                .status(pb::StatusRequest {
                    family: String::new(),
                })
                .await
        }
    };
    let other = Token::random();
    for (who, t) in [("no token", None), ("another token", Some(other.clone()))] {
        let e = status(t).await.expect_err(who);
        assert_eq!(e.code(), Code::Unauthenticated, "{who}: {e:?}");
    }
    for (who, t) in [("no token", None), ("another token", Some(other))] {
        let e = SimWorker::connect(
            h.channel.clone(),
            t,
            support::sim_worker::register("w1", 0, 1),
        )
        .await
        .expect_err(who);
        assert_eq!(e.code(), Code::Unauthenticated, "worker with {who}: {e:?}");
    }
    // The refusals were the token's: with it, both calls go through.
    let all = status(Some(token)).await.expect("status with the token");
    assert!(all.into_inner().ports.is_empty());
    h.worker("w1").await;
}

#[tokio::test]
async fn an_invalid_spec_is_invalid_argument_naming_file_and_line() {
    let h = Harness::start().await;
    let path = h.write_port(
        "bad_spec",
        &[Comp::new("a").with("colour = \"blue\"")],
        "",
        "",
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let line = text.lines().position(|l| l.starts_with("colour")).unwrap() + 1;
    let e = h
        .submit("bad_spec", &path)
        .await
        .expect_err("an unknown key");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let at = format!("{}:{line}:", path.display());
    assert!(
        e.message().starts_with(&at) && e.message().contains("colour"),
        "{at} in {:?}",
        e.message()
    );
    // Refused before anything was stored.
    let e = h.status("bad_spec").await.expect_err("no port");
    assert_eq!(e.code(), Code::NotFound);
}

#[tokio::test]
async fn status_and_watch_of_an_unknown_family_are_not_found() {
    let h = Harness::start().await;
    let e = h.status("nope").await.expect_err("unknown family");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("nope"), "{e:?}");
    let e = h
        .ports()
        .watch(pb::WatchRequest {
            family: "nope".into(),
        })
        .await
        .expect_err("unknown family");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("nope"), "{e:?}");
}

#[tokio::test]
async fn a_result_naming_a_file_outside_its_folder_keeps_none_of_its_files() {
    let h = Harness::start().await;
    let traced = Comp::new("a").with(
        "\n[component.trace]\nlayers = \"^blocks$\"\nreference = \"reference_rank*.jsonl\"\nport = \"port_rank*.jsonl\"\ndepth = 1",
    );
    let spec = h.write_port("traced", &[traced], "", "");
    let mut w = h.worker("w1").await;
    h.submit("traced", &spec).await.expect("submitted");
    // The red run is drilled down: a traced rerun that gathers files.
    answer(&mut w, 1, |_| fail("blocks diverge")).await;
    let rerun = assigned(&mut w).await;
    assert!(!rerun.collect_env.is_empty(), "a traced rerun: {rerun:?}");
    let files = ["port_rank0.jsonl", "reference_rank0.jsonl", "../x"]
        .iter()
        .map(|p| pb::CollectedFile {
            path: p.to_string(),
            data: b"{}\n".to_vec(),
        })
        .collect();
    let mut done = pass();
    done.files = files;
    w.run(&rerun, done).await;

    let s = h.wait_state("traced", "blocked").await;
    assert_eq!(comp(&s, "a").status, "blocked");
    let report = h
        .ports()
        .trace_report(pb::TraceReportRequest {
            family: "traced".into(),
            component: "a".into(),
        })
        .await
        .expect("an investigation")
        .into_inner();
    let inv: serde_json::Value = serde_json::from_str(&report.investigation_json).unwrap();
    assert_eq!(inv["outcome"], "error", "{inv:#}");
    let error = inv["steps"][0]["error"].as_str().unwrap_or_default();
    // Refused at the edge (the writer's own check would word it otherwise).
    assert!(
        error.starts_with(
            "no trace files came back: worker w1 sent back a file fvd refuses, so none was kept"
        ),
        "{inv:#}"
    );
    // Nothing of the result was written, inside the run's folder or beside it.
    let trace = h.dir.path().join("trace/traced/a");
    let written: Vec<_> = walk(&trace);
    assert!(written.is_empty(), "{written:?}");
}

/// Every file below `dir` (none when it does not exist).
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn a_result_under_a_stale_lease_epoch_is_rejected() {
    let h = Harness::start().await;
    let spec = h.write_port("stale", &[Comp::new("a")], "", "");
    let mut first = h.worker("w1").await;
    h.submit("stale", &spec).await.expect("submitted");
    let old = assigned(&mut first).await;
    assert_eq!(component_of(&old), "a");

    // w1 falls silent past the lease's time to live: the lease expires and
    // the run goes back to the queue.
    h.expire_leases().await;
    let s = h.status("stale").await.unwrap();
    assert_eq!(comp(&s, "a").status, "queued", "{s:#?}");

    // w1 comes back on a new stream and is leased the run again, under a
    // newer epoch.
    let mut again = h.worker("w1").await;
    let new = assigned(&mut again).await;
    assert_eq!(new.job_id, old.job_id);
    assert!(new.lease_epoch > old.lease_epoch, "{old:?} {new:?}");

    // A pass under the old epoch, then a failure under the live one: only
    // the live lease's result counts.
    again.run(&old, pass()).await;
    again.run(&new, fail("the live lease's result")).await;
    let s = h.wait_state("stale", "blocked").await;
    let a = comp(&s, "a");
    assert_eq!(a.status, "blocked", "{a:?}");
    assert!(a.reason.contains("the live lease's result"), "{a:?}");
    assert_eq!(a.runs, 1);
    drop(first);
}

#[tokio::test]
async fn a_worker_that_floods_its_output_gets_no_more_stored_than_the_cap() {
    const CAP: u64 = 1024 * 1024;
    let h = Harness::start_config(None, |c| c.scheduler.max_output_bytes = CAP).await;
    let spec = h.write_port("flood", &[Comp::new("a")], "", "");
    let mut w = h.worker("w1").await;
    h.submit("flood", &spec).await.expect("submitted");
    let a = assigned(&mut w).await;
    // A hostile worker ignores its own cap: 8 MiB in 64 KiB chunks.
    let chunk = vec![b'x'; 64 * 1024];
    for seq in 0..128u64 {
        w.send(pb::worker_msg::Msg::JobLog(pb::JobLog {
            job_id: a.job_id.clone(),
            lease_epoch: a.lease_epoch,
            stream: pb::Stream::Stdout as i32,
            seq,
            offset: seq * chunk.len() as u64,
            data: chunk.clone(),
        }))
        .await;
    }
    w.run(&a, pass()).await;
    h.wait_state("flood", "waiting").await;
    let stored: usize = h
        .server
        .store
        .logs(&a.job_id, None)
        .await
        .unwrap()
        .iter()
        .map(|(_, _, d)| d.len())
        .sum();
    assert!(
        stored as u64 >= CAP && stored as u64 <= CAP + 64 * 1024,
        "{stored} bytes stored of 8 MiB sent"
    );
}

/// A registration as `fvd worker` sends it: its incarnation and the jobs
/// it runs.
fn incarnation_of(id: &str, incarnation: &str, running: &[(&str, u64)]) -> pb::Register {
    pb::Register {
        incarnation: incarnation.into(),
        running: running
            .iter()
            .map(|(j, e)| pb::RunningJob {
                job_id: j.to_string(),
                lease_epoch: *e,
            })
            .collect(),
        ..support::sim_worker::register(id, 0, 4)
    }
}

#[tokio::test]
async fn a_worker_that_reconnects_keeps_its_run_and_another_process_under_its_id_is_refused() {
    let h = Harness::start().await;
    let spec = h.write_port("reconnect", &[Comp::new("a")], "", "");
    let connect = |reg: pb::Register| SimWorker::connect(h.channel.clone(), h.token.clone(), reg);
    let mut first = connect(incarnation_of("w1", "100.1", &[])).await.unwrap();
    h.submit("reconnect", &spec).await.expect("submitted");
    let a = assigned(&mut first).await;

    // Another process under w1's id, while w1 is alive: refused.
    let twin = connect(incarnation_of("w1", "200.1", &[]))
        .await
        .unwrap_err();
    assert_eq!(twin.code(), tonic::Code::AlreadyExists, "{twin}");
    assert!(
        twin.message()
            .contains("worker id w1 is in use by a live worker")
    );

    // w1 itself on a new stream before its old one is seen gone (a
    // partition that healed), still running the run: the run goes on
    // under its lease, not queued again and cancelled on it.
    let again = connect(incarnation_of("w1", "100.1", &[(&a.job_id, a.lease_epoch)]))
        .await
        .unwrap();
    drop(first);
    let s = h.status("reconnect").await.unwrap();
    assert_eq!(comp(&s, "a").status, "running", "{s:#?}");
    again.run(&a, pass()).await;
    let s = h.wait_state("reconnect", "waiting").await;
    assert_eq!(
        (comp(&s, "a").status.as_str(), comp(&s, "a").runs),
        ("non_skip_pass", 1)
    );

    // Once w1 is silent past the lease TTL, a new process may take its id.
    h.expire_leases().await;
    connect(incarnation_of("w1", "300.1", &[]))
        .await
        .expect("w1 gone, its id free");
}
