//! The worker's one edge with the generated types of a job: an `AssignJob`
//! becomes an [`Assignment`] where it arrives ([`assignment`]), what a run
//! gave ([`Finished`]) becomes a `JobFinished` where it leaves
//! ([`finished_msg`]), and a run's events and an attempt's pack become
//! their stream messages ([`event_msg`], [`pack_msg`]). Past this file a
//! job is domain types only: `run_assigned` and the agent attempt neither
//! take nor build a `pb::` type. (The stream's own messages, such as
//! `Register`, `Heartbeat`, `FetchCode` and `TunnelFrame`, stay with the
//! stream in `client.rs` and `attempt.rs`.)

use std::collections::BTreeMap;

use fvd_proto::v1 as pb;

use crate::exec::{JobEvent, OutputStream};

/// A job as the orchestrator assigned it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Assignment {
    pub job_id: String,
    pub lease_epoch: u64,
    pub family: String,
    pub component: String,
    pub argv: Vec<String>,
    /// Literal variables (`{repo}` and `{collect_dir}` filled in here).
    pub env: BTreeMap<String, String>,
    /// Names of the variables this worker reads from its own environment.
    pub secret_env: Vec<String>,
    pub cwd: String,
    pub gpus: Vec<u32>,
    pub timeout_ms: u64,
    pub collect_junit: bool,
    /// The orchestrator's `job` span (empty: none).
    pub traceparent: String,
    /// The variable naming the folder of files to send back (empty: none).
    pub collect_env: String,
    /// Where its traced files are compared, here.
    pub compare: Option<fvd_trace::FolderSpec>,
    pub preflight: Vec<String>,
    pub preflight_key: String,
    pub commit: String,
    pub code_prefix: String,
    pub worker_paths: Vec<String>,
    pub fvd_writes: Vec<String>,
    pub warm: bool,
    pub preload: Vec<String>,
    /// An agent attempt's own part.
    pub agent: Option<AgentAssignment>,
    /// MiB of its one GPU the job shares; 0: it holds its GPUs alone.
    pub share_mib: u64,
    /// With `share_mib`: the most runs its GPU may hold at once.
    pub share_cap: u32,
}

/// What an agent attempt brings besides its command.
#[derive(Debug, Clone, Default)]
pub(crate) struct AgentAssignment {
    pub packet: String,
    pub packet_on_stdin: bool,
    /// A preset's configuration files: (path in the attempt's folder, text).
    pub files: Vec<(String, String)>,
    pub proxied: bool,
    pub tools: bool,
    pub commit_message: String,
}

/// How a run's JUnit report was found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum JunitStatus {
    #[default]
    NotRequested,
    Read,
    Missing,
    Unreadable,
}

/// What a run gave, as the worker sends it back.
#[derive(Debug, Clone, Default)]
pub(crate) struct Finished {
    pub job_id: String,
    pub lease_epoch: u64,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub cancelled: bool,
    pub duration_ms: u64,
    pub junit_xml: String,
    pub junit_error: String,
    pub junit_status: JunitStatus,
    pub output_tail: String,
    pub survivors: Vec<u32>,
    pub spawn_error: String,
    pub preflight_error: String,
    /// Collected files: (relative path, bytes).
    pub files: Vec<(String, Vec<u8>)>,
    pub files_error: String,
    pub trace_report: String,
    pub trace_error: String,
    pub collected_bytes: u64,
    pub collected_files: u32,
    pub compare_ms: u64,
    pub agent: Option<AgentResult>,
    /// The most GPU memory the run held (MiB); `None`: unknown.
    pub peak_gpu_mib: Option<u64>,
}

impl Finished {
    /// The result of job `a` that never ran, and why.
    pub fn refused(a: &Assignment, why: String) -> Self {
        Finished {
            job_id: a.job_id.clone(),
            lease_epoch: a.lease_epoch,
            spawn_error: why,
            ..Default::default()
        }
    }
}

/// An agent attempt's end as the worker saw it.
#[derive(Debug, Clone, Default)]
pub(crate) struct AgentResult {
    pub commit: String,
    pub handoff: String,
    pub pack_bytes: u64,
    pub error: String,
    pub stdout: String,
}

impl Assignment {
    /// The MiB of its one GPU the job shares (placed by memory, whether or
    /// not another run is on it yet); `None` when it holds its GPUs alone
    /// or has none. What MPS caps it at and what sizes its CPU threads.
    pub fn shared_mib(&self) -> Option<u64> {
        (self.gpus.len() == 1 && self.share_mib > 0).then_some(self.share_mib)
    }
}

/// The assignment an `AssignJob` carries.
pub(crate) fn assignment(a: pb::AssignJob) -> Assignment {
    Assignment {
        job_id: a.job_id,
        lease_epoch: a.lease_epoch,
        family: a.family,
        component: a.component,
        argv: a.argv,
        env: a.env.into_iter().collect(),
        secret_env: a.secret_env,
        cwd: a.cwd,
        gpus: a.gpus,
        timeout_ms: a.timeout_ms,
        collect_junit: a.collect_junit,
        traceparent: a.traceparent,
        collect_env: a.collect_env,
        compare: a.compare.map(|c| fvd_trace::FolderSpec {
            reference: c.reference,
            port: c.port,
            rename: c.rename,
            tol: c.tol,
            steps: c.steps,
        }),
        preflight: a.preflight,
        preflight_key: a.preflight_key,
        commit: a.commit,
        code_prefix: a.code_prefix,
        worker_paths: a.worker_paths,
        fvd_writes: a.fvd_writes,
        warm: a.warm,
        preload: a.preload,
        agent: a.agent.map(|g| AgentAssignment {
            packet: g.packet,
            packet_on_stdin: g.packet_on_stdin,
            files: g.files.into_iter().map(|f| (f.path, f.text)).collect(),
            proxied: g.proxied,
            tools: g.tools,
            commit_message: g.commit_message,
        }),
        share_mib: a.gpu_memory_mib,
        share_cap: a.gpu_share_cap,
    }
}

/// The `JobFinished` message of a result.
pub(crate) fn finished_msg(f: Finished) -> pb::WorkerMsg {
    let junit_status = match f.junit_status {
        JunitStatus::NotRequested => pb::JunitStatus::NotRequested,
        JunitStatus::Read => pb::JunitStatus::Read,
        JunitStatus::Missing => pb::JunitStatus::Missing,
        JunitStatus::Unreadable => pb::JunitStatus::Unreadable,
    };
    msg(pb::worker_msg::Msg::JobFinished(pb::JobFinished {
        job_id: f.job_id,
        lease_epoch: f.lease_epoch,
        exit_code: f.exit_code,
        signal: f.signal,
        timed_out: f.timed_out,
        cancelled: f.cancelled,
        duration_ms: f.duration_ms,
        junit_xml: f.junit_xml,
        junit_error: f.junit_error,
        output_tail: f.output_tail,
        survivors: f.survivors,
        spawn_error: f.spawn_error,
        files: f
            .files
            .into_iter()
            .map(|(path, data)| pb::CollectedFile { path, data })
            .collect(),
        files_error: f.files_error,
        preflight_error: f.preflight_error,
        junit_status: junit_status.into(),
        trace_report: f.trace_report,
        trace_error: f.trace_error,
        collected_bytes: f.collected_bytes,
        collected_files: f.collected_files,
        compare_ms: f.compare_ms,
        agent: f.agent.map(|r| pb::AgentResult {
            commit: r.commit,
            handoff: r.handoff,
            pack_bytes: r.pack_bytes,
            error: r.error,
            stdout: r.stdout,
        }),
        peak_gpu_mib: f.peak_gpu_mib,
    }))
}

/// The stream message of a run's event of job `job_id` under lease
/// `epoch`; `None` for an event the orchestrator does not hear.
pub(crate) fn event_msg(job_id: &str, epoch: u64, ev: JobEvent) -> Option<pb::WorkerMsg> {
    let m = match ev {
        JobEvent::Started { pid, at } => pb::worker_msg::Msg::JobStarted(pb::JobStarted {
            job_id: job_id.to_string(),
            lease_epoch: epoch,
            pid,
            started_at_ms: at
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
        }),
        JobEvent::Output {
            stream,
            seq,
            offset,
            data,
        } => pb::worker_msg::Msg::JobLog(pb::JobLog {
            job_id: job_id.to_string(),
            lease_epoch: epoch,
            stream: match stream {
                OutputStream::Stdout => pb::Stream::Stdout as i32,
                OutputStream::Stderr => pb::Stream::Stderr as i32,
            },
            seq,
            offset,
            data,
        }),
        JobEvent::Stopping { .. } => return None,
    };
    Some(msg(m))
}

/// One piece of an attempt's pack.
pub(crate) fn pack_msg(job_id: &str, epoch: u64, data: Vec<u8>) -> pb::WorkerMsg {
    msg(pb::worker_msg::Msg::AttemptPack(pb::AttemptPack {
        job_id: job_id.to_string(),
        lease_epoch: epoch,
        data,
    }))
}

/// A stream message of `m`.
pub(crate) fn msg(m: pb::worker_msg::Msg) -> pb::WorkerMsg {
    pb::WorkerMsg { msg: Some(m) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-GPU job placed by memory shares it; one alone, one with
    /// several GPUs or none does not.
    #[test]
    fn a_job_shares_its_gpu_only_when_placed_by_memory_on_one() {
        let on = |gpus: Vec<u32>, mib| {
            assignment(pb::AssignJob {
                gpus,
                gpu_memory_mib: mib,
                ..Default::default()
            })
            .shared_mib()
        };
        assert_eq!(on(vec![5], 1280), Some(1280));
        assert_eq!(on(vec![5], 0), None);
        assert_eq!(on(vec![], 1280), None);
        assert_eq!(on(vec![0, 1], 1280), None);
    }

    /// Every field of an assignment and of a result crosses the edge.
    #[test]
    fn an_assignment_and_a_result_cross_the_edge_whole() {
        let a = assignment(pb::AssignJob {
            job_id: "f/c/1".into(),
            lease_epoch: 7,
            env: [("A".to_string(), "1".to_string())].into_iter().collect(),
            compare: Some(pb::TraceCompare {
                reference: "r/*.jsonl".into(),
                port: "p/*.jsonl".into(),
                ..Default::default()
            }),
            agent: Some(pb::AgentAssignment {
                packet: "do it".into(),
                files: vec![pb::AttemptFile {
                    path: "cfg.json".into(),
                    text: "{}".into(),
                }],
                proxied: true,
                ..Default::default()
            }),
            warm: true,
            ..Default::default()
        });
        assert_eq!(
            (a.job_id.as_str(), a.lease_epoch, a.warm),
            ("f/c/1", 7, true)
        );
        assert_eq!(a.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(a.compare.as_ref().unwrap().port, "p/*.jsonl");
        let g = a.agent.as_ref().unwrap();
        assert!(g.proxied && g.files == [("cfg.json".to_string(), "{}".to_string())]);
        let m = finished_msg(Finished {
            files: vec![("x".into(), b"y".to_vec())],
            junit_status: JunitStatus::Missing,
            agent: Some(AgentResult {
                commit: "abc".into(),
                ..Default::default()
            }),
            ..Finished::refused(&a, "no".into())
        });
        let Some(pb::worker_msg::Msg::JobFinished(f)) = m.msg else {
            panic!("{m:?}")
        };
        assert_eq!((f.job_id.as_str(), f.lease_epoch), ("f/c/1", 7));
        assert_eq!(f.spawn_error, "no");
        assert_eq!(f.junit_status, pb::JunitStatus::Missing as i32);
        assert_eq!(f.files[0].data, b"y");
        assert_eq!(f.agent.unwrap().commit, "abc");
    }
}
