//! fvd dropped into a FastVideo-shaped checkout (issue #11): the port
//! folders of a fixtures set laid out as a git repository, `fvd init` and
//! the porter's decisions for every family, and `fvd submit` on a machine
//! without torch. The e2e tests run it on the project's own folders, the
//! conformance suite on FastVideo's real ones.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use super::fvd;

/// Python that stands for a machine without torch, even where torch is
/// installed: `import torch` fails as it does there.
const NO_TORCH: &str = "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n";

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

pub fn git(repo: &Path, args: &[&str]) -> Output {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=porter",
            "-c",
            "user.email=p@example.invalid",
        ])
        .args(args)
        .current_dir(repo)
        .output()
        .expect("git");
    assert!(out.status.success(), "git {args:?}: {out:?}");
    out
}

/// A FastVideo-shaped checkout of the port folders under `fixtures`
/// (`tests/local_tests/<family>/`) and the `fastvideo` package (empty
/// here), committed.
pub fn checkout(fixtures: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixtures.join("tests"), &dir.path().join("tests"));
    std::fs::create_dir_all(dir.path().join("fastvideo")).unwrap();
    std::fs::write(dir.path().join("fastvideo/__init__.py"), "").unwrap();
    git(dir.path(), &["init", "-q"]);
    git(dir.path(), &["add", "-A"]);
    git(dir.path(), &["commit", "-qm", "the porter's checkout"]);
    dir
}

/// A folder whose `torch` fails to import, for PYTHONPATH.
pub fn without_torch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("torch")).unwrap();
    std::fs::write(dir.path().join("torch/__init__.py"), NO_TORCH).unwrap();
    dir
}

pub fn run(cmd: &mut Command, limit: Duration) -> Output {
    let start = Instant::now();
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{cmd:?} still ran after {limit:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub fn spec_path(repo: &Path, family: &str) -> PathBuf {
    repo.join(format!("tests/local_tests/{family}/port.toml"))
}

pub fn status_path(repo: &Path, family: &str) -> PathBuf {
    repo.join(format!("tests/local_tests/{family}/PORT_STATUS.md"))
}

/// `fvd init`, then the decisions a porter makes for the placeholders it
/// left (the spec says which line each is on): every `<fill in: …>` whose
/// answer does not depend on missing work is decided; a missing parity test
/// stays a placeholder, which P0 then refuses.
pub fn init_and_decide(repo: &Path, family: &str) -> String {
    let out = run(
        fvd().args(["init", "--family", family, "--repo"]).arg(repo),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "init {family}: {}", text(&out));
    let spec = std::fs::read_to_string(spec_path(repo, family)).unwrap();
    let decided: String = spec
        .lines()
        .map(|line| {
            let Some((key, value)) = line.split_once(" = ") else {
                return format!("{line}\n");
            };
            if !value.starts_with("\"<fill in:") {
                return format!("{line}\n");
            }
            let answer = match key {
                "hf_token_env" => "HF_TOKEN",
                "dependency_changes" => "none",
                "official_env_status" => "imports_ok",
                "next_step" => "add-model",
                "needs_conversion" => "no",
                "official_ref_dir" => "none",
                "workload_types" => "T2V",
                "official_ref" => "https://example.invalid/reference",
                "hf_weights_path" => "example/weights",
                "local_weights_dir" => "official_weights/model",
                "coverage_scope" => "both",
                "type" => "generic",
                _ => return format!("{line}\n"),
            };
            format!("{key} = \"{answer}\"\n")
        })
        .collect();
    std::fs::write(spec_path(repo, family), &decided).unwrap();
    decided
}

/// Every component gets the agent, which must never be asked about a
/// failure the code did not cause.
pub fn with_agent(repo: &Path, family: &str, marker: &Path) {
    let path = spec_path(repo, family);
    let spec = std::fs::read_to_string(&path)
        .unwrap()
        .replace("[[component]]\n", "[[component]]\nagent = true\n");
    let spec = format!(
        "{spec}\n[agent]\ncommand = [\"sh\", \"-c\", \"echo {family} >> {}\"]\nmax_attempts = 2\n",
        marker.display()
    );
    std::fs::write(path, spec).unwrap();
}

/// What `fvd submit` of a family does on a machine without torch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WithoutTorch {
    /// It waits for an environment (exit 4), one cause named.
    WaitsForTorch,
    /// The gate refuses it at P0 (a placeholder it cannot decide: no
    /// parity test exists yet), naming the spec's lines.
    RefusedAtP0,
    /// Every component needs a GPU, which this machine lacks: refused at
    /// once (exit 1), the one cause named. (The project's own folders have
    /// no such family; FastVideo's ltx2 is one.)
    #[allow(dead_code)]
    NeedsAGpu,
}

/// A test file of FastVideo's own tree (outside the port folders) that a
/// record names: a real checkout has it; it imports torch like the rest.
pub const ELSEWHERE: &str = "import torch\n\n\ndef test_model():\n    assert torch\n";

/// For every family: `fvd init`, the porter's decisions, an agent on every
/// component, and `fvd submit` on a machine without torch. Nothing hangs,
/// each family ends as `expect` says, no agent is asked, and no
/// `PORT_STATUS.md` (nor anything else of the checkout) changes.
/// `elsewhere`: test files outside the port folders that a full checkout
/// has, written (as [`ELSEWHERE`]) before anything runs.
pub fn submits_without_torch_keep_the_record(
    repo: &Path,
    elsewhere: &[&str],
    families: &[(&str, WithoutTorch)],
) {
    for rel in elsewhere {
        let file = repo.join(rel);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, ELSEWHERE).unwrap();
    }
    if !elsewhere.is_empty() {
        git(repo, &["add", "-A"]);
        git(repo, &["commit", "-qm", "fastvideo's own tests"]);
    }
    let torchless = without_torch();
    let marker = repo.join("../agent-asked");
    let before: Vec<Option<String>> = families
        .iter()
        .map(|(f, _)| std::fs::read_to_string(status_path(repo, f)).ok())
        .collect();
    for (family, _) in families {
        init_and_decide(repo, family);
        with_agent(repo, family, &marker);
    }
    // The specs are the porter's to commit; the agents' worktrees start
    // from that commit.
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", "port specs"]);
    for ((family, expect), before) in families.iter().zip(&before) {
        let out = run(
            fvd()
                .args([
                    "submit", "--family", family, "--wait", "--gpus", "none", "--repo",
                ])
                .arg(repo)
                .env("PYTHONPATH", torchless.path()),
            Duration::from_secs(120),
        );
        let all = text(&out);
        let causes: Vec<&str> = all
            .lines()
            .filter(|l| l.contains(" could not run on worker "))
            .collect();
        match expect {
            WithoutTorch::RefusedAtP0 => {
                assert_eq!(out.status.code(), Some(1), "{family}: {all}");
                assert!(all.contains("gate refused P0"), "{family}: {all}");
                assert!(
                    all.contains(&format!("tests/local_tests/{family}/port.toml:")),
                    "{family}: the refusal names the spec's lines: {all}"
                );
                assert!(causes.is_empty(), "{family}: {all}");
            }
            WithoutTorch::NeedsAGpu => {
                assert_eq!(out.status.code(), Some(1), "{family}: {all}");
                let refused: Vec<&str> = all
                    .lines()
                    .filter(|l| {
                        l.contains(
                            " cannot run on this machine: needs 1 GPU; this machine has none",
                        )
                    })
                    .collect();
                assert_eq!(refused.len(), 1, "{family}: one cause: {all}");
                assert!(causes.is_empty(), "{family}: {all}");
            }
            WithoutTorch::WaitsForTorch => {
                assert_eq!(
                    out.status.code(),
                    Some(4),
                    "{family} waits for an environment: {all}"
                );
                assert_eq!(causes.len(), 1, "{family}: one cause: {all}");
                assert!(
                    causes[0].contains("No module named 'torch'"),
                    "{family}: {all}"
                );
            }
        }
        // Nothing tested the code: the porter's record is untouched, and
        // no record is created for a port that never ran.
        let after = std::fs::read_to_string(status_path(repo, family)).ok();
        assert_eq!(&after, before, "{family}: PORT_STATUS.md changed");
    }
    assert!(!marker.exists(), "an agent was asked about the environment");
    let diff = git(repo, &["status", "--porcelain"]);
    assert!(
        String::from_utf8_lossy(&diff.stdout).trim().is_empty(),
        "the checkout is as the porter left it: {}",
        String::from_utf8_lossy(&diff.stdout)
    );
}
