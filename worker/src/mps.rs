//! CUDA MPS for runs sharing a GPU (`fvd worker --mps`, off by default).
//!
//! Without MPS, the runs placed on one GPU by memory take turns on it: the
//! driver time-slices their contexts. With MPS, one server per GPU holds a
//! single context and the runs' kernels execute side by side. The worker
//! starts its own control daemon (`nvidia-cuda-mps-control -d`) with its
//! pipe and log folders in `WORKSPACE/mps/`, sees only the GPUs it offers
//! (named by UUID, so a run's `CUDA_VISIBLE_DEVICES` names the same GPU
//! under the daemon's remapping), and stops it (`quit`) when the worker
//! ends. A daemon left by a worker that was killed (same folder) is told
//! to quit first. A GPU job's environment then carries the daemon's
//! folders; a CPU job's carries nothing of MPS.
//!
//! A job that shares its GPU is capped at the MiB it was placed by
//! (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, which counts the job's CUDA
//! context, about 516 MiB on an H200): past it the job itself runs out
//! of memory, not the run beside it, and an out-of-memory error while
//! sharing is rerun alone (uncapped) and raises the ask. A job that holds
//! its GPU alone is not capped. What MPS cannot do: a fatal GPU fault in
//! one run reaches every run on that GPU's server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::gpu::GpuInfo;

/// The control program, looked up on `PATH`.
pub const CONTROL: &str = "nvidia-cuda-mps-control";

/// Longest wait for the control program to answer one command.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error("--mps: this worker offers no GPU")]
    NoGpu,
    #[error("--mps: cannot create {path}: {source}")]
    Folder {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--mps: cannot run {CONTROL}: {source}")]
    Spawn { source: std::io::Error },
    #[error("--mps: `{CONTROL} {what}` exited with {status}: {output}")]
    Failed {
        what: String,
        status: std::process::ExitStatus,
        output: String,
    },
    #[error("--mps: `{CONTROL}` did not answer {what:?} within {timeout:?}")]
    Timeout { what: String, timeout: Duration },
}

/// A running MPS control daemon of this worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mps {
    pipe: PathBuf,
    log: PathBuf,
    /// Host index → UUID of each GPU the daemon sees.
    uuids: BTreeMap<u32, String>,
}

impl Mps {
    /// Starts the daemon for `gpus` with its folders under `workspace`,
    /// after telling one left there by an earlier worker to quit.
    pub async fn start(workspace: &Path, gpus: &[GpuInfo]) -> Result<Self, MpsError> {
        if gpus.is_empty() {
            return Err(MpsError::NoGpu);
        }
        let root = workspace.join("mps");
        let mps = Mps {
            pipe: root.join("pipe"),
            log: root.join("log"),
            uuids: gpus.iter().map(|g| (g.index, g.uuid.clone())).collect(),
        };
        for dir in [&mps.pipe, &mps.log] {
            std::fs::create_dir_all(dir).map_err(|source| MpsError::Folder {
                path: dir.clone(),
                source,
            })?;
        }
        if mps.pipe.join("control").exists() && mps.ask("get_server_list").await.is_ok() {
            tracing::warn!(pipe = %mps.pipe.display(), "an earlier MPS control daemon answers in this workspace: told to quit");
            mps.ask("quit").await?;
        }
        let out = mps
            .control()
            .arg("-d")
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|source| MpsError::Spawn { source })?;
        if !out.status.success() {
            return Err(MpsError::Failed {
                what: "-d".into(),
                status: out.status,
                output: both(&out.stdout, &out.stderr),
            });
        }
        // the daemon answers once it listens
        mps.ask("get_server_list").await?;
        Ok(mps)
    }

    /// What a job on `gpus` adds to its environment.
    pub fn client_env(&self, gpus: &[u32]) -> Vec<(String, String)> {
        if gpus.is_empty() {
            return Vec::new();
        }
        let visible: Vec<String> = gpus
            .iter()
            .map(|i| self.uuids.get(i).cloned().unwrap_or_else(|| i.to_string()))
            .collect();
        vec![
            ("CUDA_MPS_PIPE_DIRECTORY".into(), path(&self.pipe)),
            ("CUDA_MPS_LOG_DIRECTORY".into(), path(&self.log)),
            ("CUDA_VISIBLE_DEVICES".into(), visible.join(",")),
        ]
    }

    /// The cap of a job's device memory: the MiB it shares of its one GPU
    /// (`Assignment::shared_mib`; the job sees that GPU as device 0);
    /// nothing for a job that holds its GPUs alone or has none.
    pub fn memory_limit(&self, shared_mib: Option<u64>) -> Option<(String, String)> {
        shared_mib.map(|mib| {
            (
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_string(),
                format!("0={mib}M"),
            )
        })
    }

    /// Tells the daemon (and the servers it started) to quit.
    pub async fn stop(&self) -> Result<(), MpsError> {
        self.ask("quit").await.map(|_| ())
    }

    /// The control program with this daemon's folders and GPUs.
    fn control(&self) -> Command {
        let mut cmd = Command::new(CONTROL);
        let uuids: Vec<&str> = self.uuids.values().map(String::as_str).collect();
        cmd.env("CUDA_MPS_PIPE_DIRECTORY", &self.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.log)
            .env("CUDA_VISIBLE_DEVICES", uuids.join(","))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// Sends one command to the running daemon; its answer.
    async fn ask(&self, what: &str) -> Result<String, MpsError> {
        let mut child = self
            .control()
            .stdin(Stdio::piped())
            .spawn()
            .map_err(|source| MpsError::Spawn { source })?;
        if let Some(mut stdin) = child.stdin.take() {
            // a daemon that is gone closes nothing: the exit status says so
            let _ = stdin.write_all(format!("{what}\n").as_bytes()).await;
        }
        let out = tokio::time::timeout(ANSWER_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| MpsError::Timeout {
                what: what.into(),
                timeout: ANSWER_TIMEOUT,
            })?
            .map_err(|source| MpsError::Spawn { source })?;
        if !out.status.success() {
            return Err(MpsError::Failed {
                what: what.into(),
                status: out.status,
                output: both(&out.stdout, &out.stderr),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn both(stdout: &[u8], stderr: &[u8]) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(stdout),
        String::from_utf8_lossy(stderr)
    );
    let text = text.trim();
    if text.is_empty() {
        "no output".into()
    } else {
        text.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, uuid: &str) -> GpuInfo {
        GpuInfo {
            index,
            uuid: uuid.into(),
            name: "GPU".into(),
            memory_mib: Some(1000),
        }
    }

    #[test]
    fn a_gpu_job_names_its_gpu_by_uuid_and_a_cpu_job_gets_nothing() {
        let mps = Mps {
            pipe: "/w/mps/pipe".into(),
            log: "/w/mps/log".into(),
            uuids: [gpu(2, "GPU-b"), gpu(5, "GPU-e")]
                .iter()
                .map(|g| (g.index, g.uuid.clone()))
                .collect(),
        };
        let env = mps.client_env(&[5]);
        assert_eq!(
            env,
            vec![
                (
                    "CUDA_MPS_PIPE_DIRECTORY".to_string(),
                    "/w/mps/pipe".to_string()
                ),
                ("CUDA_MPS_LOG_DIRECTORY".into(), "/w/mps/log".into()),
                ("CUDA_VISIBLE_DEVICES".into(), "GPU-e".into()),
            ]
        );
        assert_eq!(mps.client_env(&[2, 5])[2].1, "GPU-b,GPU-e");
        assert!(mps.client_env(&[]).is_empty());
        // a run sharing its GPU is capped at its share; one alone is not
        assert_eq!(
            mps.memory_limit(Some(1280)),
            Some((
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_string(),
                "0=1280M".to_string()
            ))
        );
        assert_eq!(mps.memory_limit(None), None);
    }

    #[tokio::test]
    async fn no_gpu_is_refused_before_anything_runs() {
        let dir = tempfile::tempdir().unwrap();
        let err = Mps::start(dir.path(), &[]).await.unwrap_err();
        assert_eq!(err.to_string(), "--mps: this worker offers no GPU");
        assert!(!dir.path().join("mps").exists());
    }
}
