//! Manual smoke check on a GPU host: lists the host's GPUs the way the
//! worker does, then runs a small CUDA parity test (torch matmul against
//! numpy) through `run_job` twice: pinned to the first GPU (must be
//! `non_skip_pass`) and with no GPU leased (must be `infra_error`, since the
//! test then sees no CUDA device). Exits non-zero when either verdict is
//! wrong. Not a CI test: CI has no GPU.
//!
//! `cargo run -p fvd-worker --example gpu_smoke [python]`

use std::time::Duration;

use fvd_worker::exec::{JobSpec, prepare_pytest, run_job};
use fvd_worker::gpu;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const CUDA_TEST: &str = r#"
import os

import numpy as np
import torch


def test_cuda_matmul_parity():
    a = np.random.default_rng(0).standard_normal((256, 256))
    dev = torch.device("cuda")
    got = (torch.from_numpy(a).to(dev) @ torch.from_numpy(a).to(dev)).cpu().numpy()
    print("visible", os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count(),
          torch.cuda.get_device_name(0))
    assert torch.cuda.device_count() == 1
    np.testing.assert_allclose(got, a @ a, rtol=1e-10, atol=1e-10)
"#;

#[tokio::main]
async fn main() {
    let python = std::env::args().nth(1).unwrap_or_else(|| "python3".into());
    let gpus = gpu::inventory().await;
    println!("inventory: {gpus:?}");
    let Some(first) = gpus.first() else {
        eprintln!("no gpu found; nothing to check");
        std::process::exit(2);
    };
    let dir = std::env::temp_dir().join(format!("fvd-gpu-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("test_cuda_parity.py"), CUDA_TEST).unwrap();

    let mut ok = true;
    for (lease, want) in [
        (vec![first.index], "non_skip_pass"),
        (vec![], "infra_error"),
    ] {
        let scratch = dir.join(format!("scratch-{}", lease.len()));
        let mut spec = JobSpec {
            job_id: format!("gpu-smoke-{}", lease.len()),
            argv: [
                &python,
                "-B",
                "-m",
                "pytest",
                "test_cuda_parity.py",
                "-q",
                "-s",
            ]
            .iter()
            .map(|s| s.to_string())
            .chain(["-p".into(), "no:cacheprovider".into()])
            .collect(),
            env: vec![],
            secret_env_names: vec![],
            sandbox: fvd_worker::exec::JobSandbox::unjailed(),
            cwd: dir.clone(),
            gpus: lease.clone(),
            timeout: Duration::from_secs(300),
            grace: Duration::from_secs(5),
            junit: None,
            warm: None,
            stdin: None,
        };
        prepare_pytest(&mut spec, &scratch).await.unwrap();
        let (tx, mut rx) = mpsc::channel(64);
        fvd_telemetry::spawn(async move { while rx.recv().await.is_some() {} });
        let outcome = run_job(spec, tx, CancellationToken::new()).await.unwrap();
        let verdict = outcome.verdict();
        let got = verdict.status().as_str();
        println!(
            "lease {lease:?}: {got} ({}) survivors={:?} in {:?}",
            verdict.reason(),
            outcome.survivors,
            outcome.duration
        );
        for line in outcome
            .output_tail
            .lines()
            .filter(|l| l.contains("visible"))
        {
            println!("  {line}");
        }
        if got != want {
            println!("  expected {want}; output tail:\n{}", outcome.output_tail);
            ok = false;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::process::exit(if ok { 0 } else { 1 });
}
