//! The environment a job or an agent starts from: an allow-list of the
//! variables of fvd's own process (a worker, an orchestrator) that may reach
//! it. Everything else of fvd's environment stays behind: fvd's token
//! (`--token-env`), model-API keys, cloud credentials, whatever a scheduler
//! or a shell left there. What a spec asks for by name (`env`), its literal
//! values (`set_env`) and fvd's own per-run `FVD_*` variables are added by
//! the caller, on top.
//!
//! The list (docs/fleet.md "Containment", "The environment"):
//!
//! - the process's identity and locale: `PATH`, `HOME`, `USER`, `LOGNAME`,
//!   `LANG`, `LANGUAGE`, `LC_*`, `TZ`, `TMPDIR`;
//! - the interpreter's own settings, `PYTHON*` (`PYTHONPATH`, `PYTHONHOME`,
//!   `PYTHONDONTWRITEBYTECODE`, `PYTHONHASHSEED`, …), and where its packages
//!   are: `VIRTUAL_ENV`, `CONDA_PREFIX`;
//! - what CUDA, cuDNN, cuBLAS, NCCL and the NVIDIA container runtime read:
//!   `LD_LIBRARY_PATH`, `CUDA_*`, `CUDNN_*`, `CUBLAS_*`, `NCCL_*`,
//!   `NVIDIA_*`, and libfabric's `FI_*` (NCCL over AWS EFA);
//! - thread counts: `OMP_NUM_THREADS`, `MKL_NUM_THREADS`;
//! - caches and offline switches of the model libraries, paths and flags
//!   only: `HF_HOME`, `HF_HUB_CACHE`, `HF_HUB_OFFLINE`,
//!   `HF_DATASETS_OFFLINE`, `TRANSFORMERS_CACHE`, `TRANSFORMERS_OFFLINE`,
//!   `TORCH_HOME`, `TRITON_CACHE_DIR`, `XDG_CACHE_HOME`;
//! - CA bundles for HTTPS behind a corporate proxy: `SSL_CERT_FILE`,
//!   `SSL_CERT_DIR`, `REQUESTS_CA_BUNDLE`.
//!
//! No prefix lets through a name that reads like a credential (`TOKEN`,
//! `SECRET`, `PASSWORD`, `PASSWD`, `KEY`, `CREDENTIAL`, `AUTH`), and no
//! `FVD_*` variable of fvd's own process passes: fvd sets a run's own.
//! `HF_TOKEN`, proxies (`https_proxy` may hold a password) and the like
//! reach a test only when its spec names them (`env = ["HF_TOKEN"]`),
//! which also makes their values redacted.

/// Variables passed by exact name.
pub const EXACT: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "LD_LIBRARY_PATH",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_CACHE",
    "TRANSFORMERS_OFFLINE",
    "TORCH_HOME",
    "TRITON_CACHE_DIR",
    "XDG_CACHE_HOME",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
];

/// Variables passed by prefix, unless their name reads like a credential.
pub const PREFIXES: &[&str] = &[
    "LC_", "PYTHON", "CUDA_", "CUDNN_", "CUBLAS_", "NCCL_", "NVIDIA_", "FI_",
];

/// Words that keep a variable out even when its prefix is allowed.
const CREDENTIAL_WORDS: &[&str] = &[
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "KEY",
    "CREDENTIAL",
    "AUTH",
];

/// Whether the variable `name` of fvd's own process may reach a job or an
/// agent.
pub fn passes(name: &str) -> bool {
    if EXACT.contains(&name) {
        return true;
    }
    if !PREFIXES.iter().any(|p| name.starts_with(p)) {
        return false;
    }
    let upper = name.to_ascii_uppercase();
    !CREDENTIAL_WORDS.iter().any(|w| upper.contains(w))
}

/// The variables of this process that pass, in name order (variables whose
/// name or value is not UTF-8 are left out).
pub fn inherited() -> Vec<(String, String)> {
    filtered(
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
    )
}

/// The variables of `env` that pass, in name order.
pub fn filtered<K: Into<String>, V: Into<String>>(
    env: impl IntoIterator<Item = (K, V)>,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = env
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .filter(|(k, _)| passes(k))
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_lets_through_what_runs_need_and_nothing_that_reads_like_a_secret() {
        for ok in [
            "PATH",
            "HOME",
            "LC_ALL",
            "LC_CTYPE",
            "TMPDIR",
            "USER",
            "CUDA_HOME",
            "CUDA_DEVICE_ORDER",
            "NCCL_SOCKET_IFNAME",
            "NVIDIA_VISIBLE_DEVICES",
            "LD_LIBRARY_PATH",
            "HF_HOME",
            "FI_PROVIDER",
            "PYTHONPATH",
            "PYTHONDONTWRITEBYTECODE",
        ] {
            assert!(passes(ok), "{ok}");
        }
        for no in [
            "FVD_TOKEN",
            "FVD_JOB_COOKIE",
            "ANTHROPIC_API_KEY",
            "OPENAI_API_KEY",
            "HF_TOKEN",
            "AWS_SECRET_ACCESS_KEY",
            "GITHUB_TOKEN",
            "https_proxy",
            "LD_PRELOAD",
            "SSH_AUTH_SOCK",
            "NCCL_AUTH_TOKEN",
            "CUDA_API_KEY",
            "NVIDIA_SECRET",
            "path",
            "",
        ] {
            assert!(!passes(no), "{no}");
        }
    }
}
