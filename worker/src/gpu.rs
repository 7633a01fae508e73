//! GPU inventory of the worker's host, read from `nvidia-smi`, the
//! `--gpus all|none|0,1` selection of which of them the worker offers, and
//! the CPU threads of a run sharing one of them.
//!
//! A host without `nvidia-smi`, or where it fails, has no GPUs: the worker
//! then offers CPU slots only instead of refusing to start.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The query the inventory runs; [`parse_nvidia_smi`] reads its output.
pub const NVIDIA_SMI_ARGS: &[&str] = &[
    "--query-gpu=index,uuid,name,memory.total",
    "--format=csv,noheader,nounits",
];

/// A hung driver can make `nvidia-smi` block; the worker must still start.
pub const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(15);

/// The thread count CPU libraries read (torch's intra-op pool, OpenMP,
/// and through OpenMP most BLAS builds).
pub const THREADS_VAR: &str = "OMP_NUM_THREADS";

/// Set beside [`THREADS_VAR`] when the worker chose the count: the warm
/// runner then leaves it out of a zygote's key and sizes the forked run's
/// pool instead (`fvd_zygote.py`), so runs that share a GPU and runs that
/// hold one alone fork from the same zygote.
pub const THREADS_SET_BY_FVD: &str = "FVD_RUN_THREADS";

/// The CPU threads of a run sharing its GPU (issue #44): the host's `cores`
/// split evenly among the most GPU runs the worker may hold at once, its
/// `gpus` times the scheduler's `cap` per GPU; at least 1. Every process's
/// pool otherwise has a thread per core: four runs on a 16-core host ran
/// their CPU work (building a model) 4x slower than one alone
/// (`bench/gpu_contention.py`). A run holding its GPUs alone keeps the
/// libraries' default.
pub fn shared_run_threads(cores: usize, gpus: usize, cap: u32) -> u32 {
    let runs = gpus.max(1).saturating_mul(cap.max(1) as usize);
    u32::try_from((cores / runs).max(1)).unwrap_or(u32::MAX)
}

/// One GPU of the host.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GpuInfo {
    /// Host index, as `CUDA_VISIBLE_DEVICES` and `nvidia-smi` number it.
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// Total memory in MiB; `None` when the driver reports `[N/A]`.
    pub memory_mib: Option<u64>,
}

/// Errors of the GPU inventory and selection.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("nvidia-smi line {line_no} {line:?}: expected 4 comma-separated fields")]
    Fields { line_no: usize, line: String },
    #[error("nvidia-smi line {line_no} {line:?}: bad gpu index {index:?}")]
    Index {
        line_no: usize,
        line: String,
        index: String,
    },
    #[error("nvidia-smi line {line_no} {line:?}: bad memory.total {memory:?}")]
    Memory {
        line_no: usize,
        line: String,
        memory: String,
    },
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("{program} timed out after {timeout:?}")]
    Timeout { program: String, timeout: Duration },
    #[error("{program} exited with {status}: {stderr}")]
    Failed {
        program: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("gpu selection {input:?}: {token:?} is not all, none or a gpu index")]
    BadSelection { input: String, token: String },
    #[error("gpu selection {input:?}: index {index} is listed twice")]
    DuplicateIndex { input: String, index: u32 },
    #[error(
        "gpu selection names index {index}, which this host does not have (it has {available:?})"
    )]
    NotPresent { index: u32, available: Vec<u32> },
}

/// Parse the output of `nvidia-smi` run with [`NVIDIA_SMI_ARGS`]: one
/// `index, uuid, name, memory` line per GPU. Blank lines are ignored.
pub fn parse_nvidia_smi(csv: &str) -> Result<Vec<GpuInfo>, GpuError> {
    let mut gpus = Vec::new();
    for (i, raw) in csv.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let line_no = i + 1;
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() < 4 {
            return Err(GpuError::Fields {
                line_no,
                line: line.to_string(),
            });
        }
        // A product name could contain a comma; index and uuid lead and the
        // memory ends the line, so the name is everything between.
        let index = fields[0].parse().map_err(|_| GpuError::Index {
            line_no,
            line: line.to_string(),
            index: fields[0].to_string(),
        })?;
        let mem = fields[fields.len() - 1];
        let memory_mib = if mem.starts_with('[') {
            None
        } else {
            Some(mem.parse().map_err(|_| GpuError::Memory {
                line_no,
                line: line.to_string(),
                memory: mem.to_string(),
            })?)
        };
        gpus.push(GpuInfo {
            index,
            uuid: fields[1].to_string(),
            name: fields[2..fields.len() - 1].join(", "),
            memory_mib,
        });
    }
    Ok(gpus)
}

/// Run `program` (normally `nvidia-smi`) with [`NVIDIA_SMI_ARGS`] and parse
/// its output.
pub async fn query_gpus(program: &str) -> Result<Vec<GpuInfo>, GpuError> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(NVIDIA_SMI_ARGS)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(NVIDIA_SMI_TIMEOUT, cmd.output())
        .await
        .map_err(|_| GpuError::Timeout {
            program: program.to_string(),
            timeout: NVIDIA_SMI_TIMEOUT,
        })?
        .map_err(|source| GpuError::Spawn {
            program: program.to_string(),
            source,
        })?;
    if !out.status.success() {
        return Err(GpuError::Failed {
            program: program.to_string(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    parse_nvidia_smi(&String::from_utf8_lossy(&out.stdout))
}

/// The host's GPUs, or none when `nvidia-smi` is absent or fails (logged):
/// the worker then serves CPU slots only.
pub async fn inventory() -> Vec<GpuInfo> {
    match query_gpus("nvidia-smi").await {
        Ok(gpus) => gpus,
        Err(e) => {
            tracing::info!(error = %e, "no gpu inventory; offering cpu slots only");
            Vec::new()
        }
    }
}

/// Which of the host's GPUs the worker offers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GpuSelection {
    #[default]
    All,
    None,
    /// Host indices, in the order given.
    Indices(Vec<u32>),
}

impl GpuSelection {
    /// Parse `all`, `none` or a comma-separated list of indices (`0,1`).
    pub fn parse(input: &str) -> Result<Self, GpuError> {
        let t = input.trim();
        match t.to_ascii_lowercase().as_str() {
            "all" => return Ok(GpuSelection::All),
            "none" => return Ok(GpuSelection::None),
            _ => {}
        }
        let mut indices = Vec::new();
        for token in t.split(',') {
            let token = token.trim();
            let index: u32 = token
                .parse()
                .ok()
                .filter(|_| token.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| GpuError::BadSelection {
                    input: input.to_string(),
                    token: token.to_string(),
                })?;
            if indices.contains(&index) {
                return Err(GpuError::DuplicateIndex {
                    input: input.to_string(),
                    index,
                });
            }
            indices.push(index);
        }
        Ok(GpuSelection::Indices(indices))
    }

    /// The selected GPUs of `inventory`; a named index the host lacks is an
    /// error rather than silently dropped.
    pub fn apply(&self, inventory: &[GpuInfo]) -> Result<Vec<GpuInfo>, GpuError> {
        match self {
            GpuSelection::All => Ok(inventory.to_vec()),
            GpuSelection::None => Ok(Vec::new()),
            GpuSelection::Indices(want) => want
                .iter()
                .map(|&index| {
                    inventory
                        .iter()
                        .find(|g| g.index == index)
                        .cloned()
                        .ok_or_else(|| GpuError::NotPresent {
                            index,
                            available: inventory.iter().map(|g| g.index).collect(),
                        })
                })
                .collect(),
        }
    }
}

impl FromStr for GpuSelection {
    type Err = GpuError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GpuSelection::parse(s)
    }
}

impl fmt::Display for GpuSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuSelection::All => f.write_str("all"),
            GpuSelection::None => f.write_str("none"),
            GpuSelection::Indices(v) => {
                let s: Vec<String> = v.iter().map(u32::to_string).collect();
                f.write_str(&s.join(","))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100X2: &str = "0, GPU-3f1c2a9e-8d1b-4c52-9a7e-1b2c3d4e5f60, NVIDIA H100 80GB HBM3, 81559\n\
                          1, GPU-77aa0c1d-2e3f-4a5b-8c9d-0e1f2a3b4c5d, NVIDIA H100 80GB HBM3, 81559\n";

    #[test]
    fn a_shared_run_gets_its_part_of_the_cores() {
        // 16 cores, 1 GPU, 4 runs on it at most: 4 threads each.
        assert_eq!(shared_run_threads(16, 1, 4), 4);
        assert_eq!(shared_run_threads(128, 8, 4), 4);
        assert_eq!(shared_run_threads(2, 1, 4), 1);
        assert_eq!(shared_run_threads(7, 2, 3), 1);
        assert_eq!(shared_run_threads(64, 2, 3), 10);
        // Never 0, whatever is reported.
        assert_eq!(shared_run_threads(0, 0, 0), 1);
        assert_eq!(shared_run_threads(16, 0, 0), 16);
    }

    #[test]
    fn parses_canned_output() {
        let gpus = parse_nvidia_smi(H100X2).unwrap();
        assert_eq!(gpus.len(), 2);
        assert_eq!(
            gpus[1],
            GpuInfo {
                index: 1,
                uuid: "GPU-77aa0c1d-2e3f-4a5b-8c9d-0e1f2a3b4c5d".into(),
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_mib: Some(81559),
            }
        );
    }

    /// Captured from a real single-H200 host.
    const H200_REAL: &str = "0, GPU-145098f9-6127-1cc2-0b0a-8a26c242a817, NVIDIA H200, 143771\n";

    #[test]
    fn parses_real_h200_output() {
        let gpus = parse_nvidia_smi(H200_REAL).unwrap();
        assert_eq!(
            gpus,
            vec![GpuInfo {
                index: 0,
                uuid: "GPU-145098f9-6127-1cc2-0b0a-8a26c242a817".into(),
                name: "NVIDIA H200".into(),
                memory_mib: Some(143771),
            }]
        );
    }

    #[test]
    fn tolerates_blank_lines_na_memory_and_commas_in_names() {
        let gpus = parse_nvidia_smi("\n3, GPU-x, Odd, Name, [N/A]\n\n").unwrap();
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0].index, 3);
        assert_eq!(gpus[0].name, "Odd, Name");
        assert_eq!(gpus[0].memory_mib, None);
        assert!(parse_nvidia_smi("").unwrap().is_empty());
    }

    #[test]
    fn rejects_malformed_lines() {
        let e = parse_nvidia_smi("0, GPU-x, H100").unwrap_err();
        assert!(matches!(e, GpuError::Fields { line_no: 1, .. }), "{e}");
        let e = parse_nvidia_smi("x, GPU-x, H100, 10").unwrap_err();
        assert!(e.to_string().contains("\"x\""), "{e}");
        let e = parse_nvidia_smi("0, GPU-x, H100, lots").unwrap_err();
        assert!(e.to_string().contains("lots"), "{e}");
    }

    #[test]
    fn selection_parse() {
        assert_eq!(GpuSelection::parse("all").unwrap(), GpuSelection::All);
        assert_eq!(GpuSelection::parse(" None ").unwrap(), GpuSelection::None);
        assert_eq!(
            GpuSelection::parse("0, 2").unwrap(),
            GpuSelection::Indices(vec![0, 2])
        );
        let e = GpuSelection::parse("0,x1").unwrap_err();
        assert!(e.to_string().contains("\"x1\""), "{e}");
        assert!(GpuSelection::parse("").is_err());
        assert!(GpuSelection::parse("0,,1").is_err());
        assert!(GpuSelection::parse("+1").is_err());
        assert!(GpuSelection::parse("1,1").is_err());
        assert_eq!(GpuSelection::parse("1,0").unwrap().to_string(), "1,0");
    }

    #[test]
    fn selection_apply() {
        let inv = parse_nvidia_smi(H100X2).unwrap();
        assert_eq!(GpuSelection::All.apply(&inv).unwrap().len(), 2);
        assert!(GpuSelection::None.apply(&inv).unwrap().is_empty());
        let one = GpuSelection::parse("1").unwrap().apply(&inv).unwrap();
        assert_eq!(one[0].index, 1);
        let e = GpuSelection::parse("0,5").unwrap().apply(&inv).unwrap_err();
        assert!(e.to_string().contains("index 5"), "{e}");
        assert!(GpuSelection::All.apply(&[]).unwrap().is_empty());
    }

    #[tokio::test]
    async fn missing_or_failing_binary_is_an_error() {
        let e = query_gpus("/nonexistent/nvidia-smi").await.unwrap_err();
        assert!(matches!(e, GpuError::Spawn { .. }), "{e}");
        let e = query_gpus("false").await.unwrap_err();
        assert!(matches!(e, GpuError::Failed { .. }), "{e}");
        // echo prints the query arguments back: not the expected csv.
        let e = query_gpus("echo").await.unwrap_err();
        assert!(matches!(e, GpuError::Index { line_no: 1, .. }), "{e}");
    }

    #[tokio::test]
    async fn queries_a_fake_nvidia_smi() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("nvidia-smi");
        // The fake checks it was asked the documented query.
        let script = format!(
            "#!/bin/sh\n[ \"$1 $2\" = \"{}\" ] || exit 9\nprintf '%s' '{H100X2}'\n",
            NVIDIA_SMI_ARGS.join(" ")
        );
        std::fs::write(&fake, script).unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let program = fake.to_str().unwrap();
        // Another test thread forking while the script was open for writing
        // can make exec fail with ETXTBSY for a moment.
        let mut tries = 0;
        let gpus = loop {
            match query_gpus(program).await {
                Err(GpuError::Spawn { source, .. })
                    if source.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 50 =>
                {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => break other.unwrap(),
            }
        };
        assert_eq!(gpus, parse_nvidia_smi(H100X2).unwrap());
    }
}
