//! A simulated worker speaking the real `Connect` protocol over gRPC: it
//! registers, heartbeats if asked, and answers each assignment with the
//! `JobStarted` and `JobFinished` its caller chooses instead of running
//! anything. Shared by the orchestrator's in-process tests
//! (`tests/support/mod.rs`) and its scheduler bench (`benches/scheduler.rs`,
//! through `#[path]`), so both drive the server the way `fvd worker` does.

// Each includer uses a part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::time::Duration;

use fvd_proto::auth::{ClientAuth, Token};
use fvd_proto::v1 as pb;
use fvd_proto::v1::worker_service_client::WorkerServiceClient;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// One worker message.
pub fn wm(m: pb::worker_msg::Msg) -> pb::WorkerMsg {
    pb::WorkerMsg { msg: Some(m) }
}

/// A registration of `gpus` GPUs (80 GiB each) and `cpu_slots` CPU slots.
pub fn register(id: &str, gpus: u32, cpu_slots: u32) -> pb::Register {
    pb::Register {
        worker_id: id.to_string(),
        host: "sim".into(),
        gpus: (0..gpus)
            .map(|i| pb::Gpu {
                index: i,
                uuid: format!("GPU-{id}-{i}"),
                name: "sim".into(),
                memory_mib: 80_000,
            })
            .collect(),
        cpu_slots,
        labels: HashMap::new(),
        version: "sim".into(),
        provides: Vec::new(),
        // As an older worker: no incarnation, nothing running.
        ..Default::default()
    }
}

/// A registered simulated worker: the sending half of its stream and the
/// orchestrator's messages to it.
#[derive(Debug)]
pub struct SimWorker {
    pub id: String,
    tx: mpsc::Sender<pb::WorkerMsg>,
    inbound: tonic::Streaming<pb::OrchestratorMsg>,
}

impl SimWorker {
    /// Opens a `Connect` stream over `channel` (with the bearer `token`, if
    /// any), registers and waits for `Registered`. The server's refusal
    /// (a wrong token, a bad registration) is the error.
    pub async fn connect(
        channel: Channel,
        token: Option<Token>,
        reg: pb::Register,
    ) -> Result<Self, tonic::Status> {
        let mut client = WorkerServiceClient::with_interceptor(channel, ClientAuth::new(token));
        let id = reg.worker_id.clone();
        let (tx, rx) = mpsc::channel::<pb::WorkerMsg>(4096);
        // Register is the stream's first message: the server reads it
        // before it answers the call.
        tx.send(wm(pb::worker_msg::Msg::Register(reg)))
            .await
            .map_err(|_| tonic::Status::internal("the outbound stream closed"))?;
        let mut inbound = client.connect(ReceiverStream::new(rx)).await?.into_inner();
        match inbound.message().await? {
            Some(pb::OrchestratorMsg {
                msg: Some(pb::orchestrator_msg::Msg::Registered(_)),
            }) => Ok(Self { id, tx, inbound }),
            other => Err(tonic::Status::internal(format!(
                "expected registered first, got {other:?}"
            ))),
        }
    }

    /// Sends one message on the stream (ignored once the stream closed,
    /// as a worker that went away).
    pub async fn send(&self, m: pb::worker_msg::Msg) {
        let _ = self.tx.send(wm(m)).await;
    }

    /// The orchestrator's next message; `None` once the stream ended.
    pub async fn recv(&mut self) -> Option<pb::orchestrator_msg::Msg> {
        loop {
            match self.inbound.message().await {
                Ok(Some(pb::OrchestratorMsg { msg: Some(m) })) => return Some(m),
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// The next assignment, skipping other messages (cancellations).
    pub async fn next_assign(&mut self) -> Option<pb::AssignJob> {
        loop {
            if let pb::orchestrator_msg::Msg::AssignJob(a) = self.recv().await? {
                return Some(a);
            }
        }
    }

    /// Answers assignment `a` as a worker whose process started and ended
    /// at once: `JobStarted`, then `finished` under `a`'s job id and lease
    /// epoch (whatever those fields of `finished` held).
    pub async fn run(&self, a: &pb::AssignJob, finished: pb::JobFinished) {
        self.send(pb::worker_msg::Msg::JobStarted(pb::JobStarted {
            job_id: a.job_id.clone(),
            lease_epoch: a.lease_epoch,
            pid: 1,
            started_at_ms: 0,
        }))
        .await;
        self.send(pb::worker_msg::Msg::JobFinished(pb::JobFinished {
            job_id: a.job_id.clone(),
            lease_epoch: a.lease_epoch,
            ..finished
        }))
        .await;
    }

    /// Heartbeats every `every` until the stream closes.
    pub fn heartbeat_every(&self, every: Duration) -> JoinHandle<()> {
        let tx = self.tx.clone();
        fvd_telemetry::spawn(async move {
            let mut t = tokio::time::interval(every);
            loop {
                t.tick().await;
                let beat = wm(pb::worker_msg::Msg::Heartbeat(pb::Heartbeat::default()));
                if tx.send(beat).await.is_err() {
                    return;
                }
            }
        })
    }
}
