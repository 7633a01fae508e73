//! An agent attempt on this worker (issue #32): the orchestrator leases it
//! like a run, and the worker
//!
//! - checks out the attempt's base commit in a worktree of its own
//!   (`WORKSPACE/code/attempts/JOB`, sharing the clone's objects, fetched
//!   over the stream when the clone lacks the commit), removed when the
//!   attempt ends;
//! - writes the packet and the files the assignment carries (a preset's
//!   configuration) into the attempt's folder, and fills in the paths only
//!   it knows;
//! - serves the agent's model proxy on its loopback: each connection there
//!   becomes one `Tunnel` call to the orchestrator, which holds the proxy
//!   and the key; no key reaches this machine;
//! - runs the agent as it runs a test: jailed, allow-listed environment,
//!   output redacted and streamed, its process group ended;
//! - commits what the agent left and sends the commit back as a thin pack
//!   (`AttemptPack`), then its result (`JobFinished.agent`).
//!
//! The agent's own test runs are its business: fvd's verdict of the
//! attempt comes from a run fvd queues on the returned commit.

use std::path::Path;

use fvd_proto::auth::ClientAuth;
use fvd_proto::v1 as pb;
use fvd_proto::v1::worker_service_client::WorkerServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::client::{AgentIo, CodeLink, Outbox, WorkerConfig, code_fetch, job_code, run_assigned};
use crate::code::AttemptCheckout;
use crate::wire::{AgentAssignment, AgentResult, Assignment, Finished, pack_msg};

/// Bytes of a pack per `AttemptPack` message, under gRPC's 4 MiB limit.
const PACK_CHUNK_BYTES: usize = 1024 * 1024;

/// Bytes read from the agent's connection per tunnel frame.
const TUNNEL_FRAME_BYTES: usize = 64 * 1024;

/// Runs an agent assignment to its end: its `JobFinished`, with
/// `agent` set once the agent ran (a failure before that, such as a commit
/// that cannot be fetched, is a `spawn_error` without it).
pub(crate) async fn run(
    config: &WorkerConfig,
    mut a: Assignment,
    tx: &Outbox,
    code: &CodeLink,
    cancel: CancellationToken,
) -> Finished {
    let g = a.agent.take().unwrap_or_default();
    let job = job_code(&a);
    let checkout = match code
        .cache
        .attempt_checkout(&job, code_fetch(code, &a, tx), &cancel)
        .await
    {
        Ok(c) => c,
        Err(why) => {
            tracing::warn!(job = %a.job_id, %why, "the agent attempt's code is not available here");
            return Finished::refused(&a, why);
        }
    };
    tracing::info!(job = %a.job_id, commit = %checkout.base, fetched = checkout.fetched, checkout = %checkout.path.display(), "agent attempt checked out");
    let finished = match crate::client::scratch_dir(&config.workspace, &a.job_id, a.lease_epoch) {
        Ok(run_scratch) => {
            // The agent's files beside the scratch folder its run gets
            // (and removes when the run ends).
            let mut name = run_scratch.file_name().unwrap_or_default().to_os_string();
            name.push(".agent");
            let scratch = run_scratch.with_file_name(name);
            let f = attempt_in(config, a, g, tx, code, &checkout, &scratch, cancel).await;
            let _ = tokio::fs::remove_dir_all(&scratch).await;
            f
        }
        Err(e) => Finished::refused(&a, format!("job id refused: {e}")),
    };
    checkout.remove().await;
    finished
}

#[allow(clippy::too_many_arguments)]
async fn attempt_in(
    config: &WorkerConfig,
    mut a: Assignment,
    g: AgentAssignment,
    tx: &Outbox,
    code: &CodeLink,
    checkout: &AttemptCheckout,
    scratch: &Path,
    cancel: CancellationToken,
) -> Finished {
    let fail = |a: &Assignment, why: String| Finished::refused(a, why);
    let dir = std::path::absolute(scratch.join("attempt")).unwrap_or(scratch.join("attempt"));
    let _ = tokio::fs::remove_dir_all(&dir).await;
    if let Err(e) = tokio::fs::create_dir_all(&dir).await {
        return fail(&a, format!("cannot prepare {}: {e}", dir.display()));
    }
    let prompt = dir.join("prompt.md");
    let handoff = dir.join("handoff.txt");
    // The agent's ends of its model proxy and its tools: this loopback,
    // tunnelled to the orchestrator.
    let mut ends = Vec::new();
    for (wanted, target) in [(g.proxied, "model"), (g.tools, "tools")] {
        if !wanted {
            ends.push(None);
            continue;
        }
        match Tunnel::open(config, code, &a, target).await {
            Ok(t) => ends.push(Some(t)),
            Err(e) => return fail(&a, format!("cannot listen for the agent's {target}: {e}")),
        }
    }
    let tools = ends.pop().flatten();
    let tunnel = ends.pop().flatten();
    let proxy_url = tunnel
        .as_ref()
        .map(|t| format!("http://{}", t.addr))
        .unwrap_or_default();
    let tools_addr = tools
        .as_ref()
        .map(|t| t.addr.to_string())
        .unwrap_or_default();
    // `fvd mcp` is this program.
    let fvd = std::env::current_exe()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "fvd".into());
    let show = |p: &Path| p.to_string_lossy().into_owned();
    let (dir_s, workdir_s) = (show(&dir), show(&checkout.workdir));
    let (prompt_s, handoff_s) = (show(&prompt), show(&handoff));
    let fill = |t: &str| {
        t.replace("{attempt_dir}", &dir_s)
            .replace("{workdir}", &workdir_s)
            .replace("{prompt_file}", &prompt_s)
            .replace("{handoff_file}", &handoff_s)
            .replace("{proxy_url}", &proxy_url)
            .replace("{tools_addr}", &tools_addr)
            .replace("{fvd}", &fvd)
    };
    let packet = match write_files(&dir, &prompt, &g, &fill).await {
        Ok(p) => p,
        Err(why) => return fail(&a, why),
    };
    a.argv = a.argv.iter().map(|x| fill(x)).collect();
    if let Some(first) = a.argv.first_mut() {
        beside_worker(first);
    }
    for v in a.env.values_mut() {
        *v = fill(v);
    }
    a.cwd = workdir_s.clone();
    a.collect_junit = false;
    let io = AgentIo {
        stdin: g.packet_on_stdin.then(|| packet.into_bytes()),
        // Its checkout and its files, nothing else of the workspace (other
        // attempts' checkouts, the clone, the jobs' folders).
        read_only: vec![config.workspace.clone()],
        writable: vec![checkout.path.clone(), dir.clone()],
        ..AgentIo::default()
    };
    let secret_env = a.secret_env.clone();
    let (job_id, epoch) = (a.job_id.clone(), a.lease_epoch);
    let mut finished = run_assigned(config, a, tx, cancel, Some(&io)).await;
    drop(tunnel);
    drop(tools);
    // What the agent wrote is redacted like its output before it leaves.
    let mut secrets = config.job_secrets();
    for name in &secret_env {
        if let Ok(v) = std::env::var(name) {
            secrets.add(name, v.as_bytes());
        }
    }
    let handoff_text = tokio::fs::read_to_string(&handoff)
        .await
        .map(|t| secrets.text(&t))
        .unwrap_or_default();
    let stdout = {
        let kept = io.stdout.lock().expect("agent stdout lock");
        String::from_utf8_lossy(&kept).into_owned()
    };
    let mut result = AgentResult {
        handoff: handoff_text,
        stdout,
        ..Default::default()
    };
    match checkout.commit(&g.commit_message).await {
        Ok((sha, pack)) => {
            result.pack_bytes = pack.len() as u64;
            for piece in pack.chunks(PACK_CHUNK_BYTES) {
                tx.send(pack_msg(&job_id, epoch, piece.to_vec())).await;
            }
            tracing::info!(job = %job_id, commit = %sha, pack_bytes = pack.len(), "agent attempt committed");
            result.commit = sha;
        }
        Err(e) => {
            tracing::warn!(job = %job_id, error = %e, "the agent attempt could not be committed");
            result.error = format!("the attempt could not be committed on the worker: {e}");
        }
    }
    finished.agent = Some(result);
    finished
}

/// An agent CLI installed beside this worker rather than on its PATH
/// (`FVD_AGENT_CLI_DIR`, as `fvd agents check` finds it): `program`
/// becomes its path there.
fn beside_worker(program: &mut String) {
    if let Some(dir) = std::env::var_os("FVD_AGENT_CLI_DIR")
        && !program.contains('/')
    {
        let found = Path::new(&dir).join(program.as_str());
        if found.is_file() {
            *program = found.to_string_lossy().into_owned();
        }
    }
}

/// Writes the assignment's files (a preset's configuration) into the
/// attempt's folder `dir` and its packet to `prompt`, the paths only this
/// worker knows filled in by `fill`; the packet as written.
async fn write_files(
    dir: &Path,
    prompt: &Path,
    g: &AgentAssignment,
    fill: &impl Fn(&str) -> String,
) -> Result<String, String> {
    for (file, text) in &g.files {
        let path = fvd_paths::join_under(dir, file)
            .map_err(|e| format!("attempt file {file:?} refused: {e}"))?;
        if let Some(parent) = path.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| format!("cannot prepare {}: {e}", parent.display()))?;
        }
        tokio::fs::write(&path, fill(text))
            .await
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let packet = fill(&g.packet);
    tokio::fs::write(prompt, &packet)
        .await
        .map_err(|e| format!("cannot write {}: {e}", prompt.display()))?;
    Ok(packet)
}

/// The loopback end of an attempt's model proxy: every connection accepted
/// is carried by one `Tunnel` call; closed (with its connections) when
/// dropped.
struct Tunnel {
    addr: std::net::SocketAddr,
    stop: CancellationToken,
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Tunnel {
    async fn open(
        config: &WorkerConfig,
        code: &CodeLink,
        a: &Assignment,
        target: &str,
    ) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let client = WorkerServiceClient::with_interceptor(
            code.endpoint.connect_lazy(),
            ClientAuth::new(config.token.clone()),
        );
        let first = pb::TunnelFrame {
            job_id: a.job_id.clone(),
            lease_epoch: a.lease_epoch,
            worker_id: config.worker_id.clone(),
            target: target.to_string(),
            data: Vec::new(),
        };
        let stop = CancellationToken::new();
        let until = stop.clone();
        fvd_telemetry::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = until.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((sock, _)) = accepted else {
                    // Out of descriptors, say: not a busy loop meanwhile.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                };
                let (client, first, until) = (client.clone(), first.clone(), until.clone());
                fvd_telemetry::spawn(async move {
                    tokio::select! {
                        _ = until.cancelled() => {}
                        _ = carry(client, sock, first) => {}
                    }
                });
            }
        });
        Ok(Self { addr, stop })
    }
}

/// One connection of the agent, carried both ways by one `Tunnel` call.
async fn carry<T>(
    mut client: WorkerServiceClient<T>,
    sock: tokio::net::TcpStream,
    first: pb::TunnelFrame,
) where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let (mut rd, mut wr) = sock.into_split();
    let (ftx, frx) = mpsc::channel::<pb::TunnelFrame>(8);
    let _ = ftx.send(first).await;
    let reader = fvd_telemetry::spawn(async move {
        let mut buf = vec![0u8; TUNNEL_FRAME_BYTES];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let frame = pb::TunnelFrame {
                        data: buf[..n].to_vec(),
                        ..Default::default()
                    };
                    if ftx.send(frame).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    match client.tunnel(ReceiverStream::new(frx)).await {
        Ok(r) => {
            let mut inbound = r.into_inner();
            while let Ok(Some(f)) = inbound.message().await {
                if wr.write_all(&f.data).await.is_err() {
                    break;
                }
            }
            let _ = wr.shutdown().await;
        }
        Err(status) => {
            tracing::warn!(%status, "the orchestrator refused the agent's model-proxy tunnel");
        }
    }
    reader.abort();
}
