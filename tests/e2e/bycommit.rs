//! Code travels by commit (issue #12): `fvd worker` runs in a mount
//! namespace of its own where a tmpfs hides the port's checkout, against
//! an `fvd orchestrator serve` that sees it. The example port reaches the
//! verdicts embedded mode reaches on the same repository, the agent
//! component's attempt commits reach the worker as small incremental packs,
//! and weights the spec names in `worker_paths` come from the worker's own
//! disk (`--provide`), or the job waits saying no worker provides them.
//!
//! CI runs as root; without `unshare` and a tmpfs mount these tests fail,
//! they never skip.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::agent::{example_repo, git};
use crate::support::{LOG_FILTER, Sandbox, TestComponent, fvd, wait_for};

/// `unshare -m` with a tmpfs over `hidden`, then `argv`: the command sees
/// nothing below `hidden`.
pub(crate) fn hidden_from(hidden: &Path, argv: &[&str]) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount -t tmpfs fvd-hidden "$0" && exec "$@""#)
        .arg(hidden)
        .args(argv);
    cmd
}

/// Checks, in the same kind of namespace the worker gets, that the
/// checkout is really out of sight there (and in plain sight here).
pub(crate) fn assert_hidden(hidden: &Path, repo: &Path) {
    assert!(repo.join(".git").exists());
    let probe = hidden_from(hidden, &["test", "!", "-e", &repo.display().to_string()])
        .output()
        .expect("run unshare (util-linux)");
    assert!(
        probe.status.success(),
        "unshare -m with a tmpfs over {} did not hide {} (this test needs root and mount namespaces; it does not skip): {}",
        hidden.display(),
        repo.display(),
        String::from_utf8_lossy(&probe.stderr)
    );
}

/// Starts `fvd worker` in its own mount namespace with `hidden` covered.
pub(crate) fn spawn_hidden_worker(sb: &mut Sandbox, id: &str, extra: &[&str]) {
    spawn_hidden_worker_with(sb, id, extra, &[]);
}

/// [`spawn_hidden_worker`] with variables of its own.
pub(crate) fn spawn_hidden_worker_with(
    sb: &mut Sandbox,
    id: &str,
    extra: &[&str],
    env: &[(&str, String)],
) {
    let url = sb.url.clone().expect("serve() first");
    let ws = sb.dir.path().join(format!("ws-{id}"));
    let bin = env!("CARGO_BIN_EXE_fvd");
    let mut argv = vec![
        bin,
        "worker",
        "--orchestrator",
        &url,
        "--gpus",
        "none",
        "--worker-id",
        id,
        "--cpu-slots",
        "2",
    ];
    let ws_s = ws.display().to_string();
    argv.extend(["--workspace", &ws_s]);
    argv.extend(extra);
    let hidden = sb
        .repo()
        .parent()
        .expect("repo below the sandbox")
        .to_path_buf();
    let log = std::fs::File::create(sb.dir.path().join(format!("worker-{id}.log"))).unwrap();
    let mut cmd = hidden_from(&hidden, &argv);
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd.env("FVD_LOG", LOG_FILTER)
        .current_dir(sb.dir.path())
        .stdout(Stdio::null())
        .stderr(log);
    sb.spawn_worker(id, cmd);
}

pub(crate) fn outcome(cmd: &mut Command) -> (Option<i32>, String) {
    let out = cmd.output().unwrap();
    let text = format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// `(name, status, runs, reason)` of every component, sorted.
pub(crate) fn verdicts(status: &serde_json::Value) -> Vec<(String, String, u64, String)> {
    let mut v: Vec<_> = status["components"]
        .as_array()
        .expect("components")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_string(),
                c["status"].as_str().unwrap_or_default().to_string(),
                c["runs"].as_u64().unwrap_or_default(),
                c["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

/// A log file's text without its colour escapes.
pub(crate) fn plain_log(path: &Path) -> String {
    let raw = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ parameters final-letter
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The `fetched the code of a commit` lines of a worker log: (commit, bytes).
fn fetches(log: &str) -> Vec<(String, u64)> {
    log.lines()
        .filter(|l| l.contains("fetched the code of a commit"))
        .map(|l| {
            let field = |k: &str| {
                l.split(&format!(" {k}="))
                    .nth(1)
                    .and_then(|r| r.split(' ').next())
                    .unwrap_or_default()
                    .to_string()
            };
            (field("commit"), field("bytes").parse().unwrap_or(0))
        })
        .collect()
}

/// The example port's verdicts in embedded mode (the question answered
/// with its first option): what a fleet must reach on the same repository.
pub(crate) fn embedded_verdicts() -> Vec<(String, String, u64, String)> {
    let embedded = Sandbox::new();
    example_repo(&embedded, |t| t);
    let (code, out) = outcome(
        fvd()
            .args(["submit", "--family", "tinyport", "--wait", "--repo"])
            .arg(embedded.repo()),
    );
    assert_eq!(code, Some(3), "{out}");
    let (code, out) = outcome(
        fvd()
            .args(["answer", "tinyport", "E001", "--option", "1", "--repo"])
            .arg(embedded.repo()),
    );
    assert_eq!(code, Some(1), "{out}");
    verdicts(&embedded.local_status("tinyport").unwrap())
}

/// `fvd answer tinyport E001 --option 1 --wait` on the sandbox's
/// orchestrator: the example port then ends with exit 1 (its blocked
/// components).
pub(crate) fn answer_first_option(sb: &Sandbox, url: &str) {
    let (code, out) = outcome(fvd().args([
        "answer",
        "tinyport",
        "E001",
        "--option",
        "1",
        "--wait",
        "--orchestrator",
        url,
    ]));
    assert_eq!(code, Some(1), "{out}\n{}", sb.logs());
}

#[test]
fn a_worker_that_cannot_see_the_checkout_reaches_the_embedded_verdicts() {
    let want = embedded_verdicts();

    // The same port on a fleet whose one worker cannot see the checkout.
    let mut sb = Sandbox::with_repo_in("hidden/repo");
    let base = example_repo(&sb, |t| t);
    let hidden = sb.dir.path().join("hidden");
    assert_hidden(&hidden, sb.repo());
    // Agents on this host (the fleet case is `agents_on_the_fleet.rs`):
    // their commits reach the worker by fetch.
    let url = sb.serve_with(&["--allow-agent-commands", "--agents", "host"]);
    spawn_hidden_worker(&mut sb, "far", &[]);
    let out = sb.submit_remote("tinyport", &["--wait"]);
    let text = format!(
        "{}{}\nlogs:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        sb.logs()
    );
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains(&format!("port tinyport runs commit {}", &base[..12])),
        "{text}"
    );
    answer_first_option(&sb, &url);
    let got = verdicts(&sb.remote_status("tinyport").unwrap());
    assert_eq!(got, want, "fleet by commit vs embedded");

    // Every job ran by commit, none in a checkout the worker could not see.
    let log = plain_log(&sb.dir.path().join("worker-far.log"));
    assert!(!log.contains("mode=Shared"), "{log}");
    let placed = log.matches("the job's code is placed").count();
    assert!(placed >= 9, "{placed} jobs placed:\n{log}");
    assert_eq!(placed, log.matches("mode=ByCommit").count(), "{log}");

    // The port's commit once, then each agent attempt's commit as a small
    // pack against what the worker already held.
    let fetched = fetches(&log);
    assert_eq!(
        fetched.first().map(|f| f.0.as_str()),
        Some(base.as_str()),
        "{fetched:?}"
    );
    let attempts: Vec<String> = git(
        sb.repo(),
        &[
            "log",
            "--format=%H",
            &format!("{base}..fvd/tinyport/timestep_embed"),
        ],
    )
    .lines()
    .map(str::to_string)
    .collect();
    assert_eq!(attempts.len(), 2, "two attempts on the branch");
    for a in &attempts {
        let (_, bytes) = fetched
            .iter()
            .find(|(c, _)| c == a)
            .unwrap_or_else(|| panic!("attempt commit {a} never reached the worker: {fetched:?}"));
        assert!(*bytes < 8 * 1024, "an attempt's commit cost {bytes} bytes");
    }
    let first = fetched[0].1;
    eprintln!(
        "bycommit: first job fetched {first} bytes; agent attempts {:?} bytes",
        fetched[1..].iter().map(|f| f.1).collect::<Vec<_>>()
    );
}

#[test]
fn weights_named_in_worker_paths_come_from_the_worker_that_provides_them() {
    let mut sb = Sandbox::with_repo_in("hidden/repo");
    sb.port(
        "weighted",
        &[TestComponent::new(
            "loader",
            "with open('official_weights/tiny/w.txt') as f:\n    assert f.read() == 'node weights'",
        )],
    );
    let spec = sb.repo().join("tests/local_tests/weighted/port.toml");
    let text = std::fs::read_to_string(&spec).unwrap();
    std::fs::write(
        &spec,
        text.replace(
            "[defaults]\n",
            "[defaults]\nworker_paths = [\"official_weights/tiny\"]\n",
        ),
    )
    .unwrap();
    // The weights are ignored by git: no commit carries them.
    std::fs::write(sb.repo().join(".gitignore"), "official_weights/\n").unwrap();
    std::fs::create_dir_all(sb.repo().join("official_weights/tiny")).unwrap();
    std::fs::write(
        sb.repo().join("official_weights/tiny/w.txt"),
        "node weights",
    )
    .unwrap();
    git(sb.repo(), &["init", "-q", "-b", "main"]);
    git(sb.repo(), &["add", "-A"]);
    git(sb.repo(), &["commit", "-q", "-m", "base"]);
    let hidden = sb.dir.path().join("hidden");
    assert_hidden(&hidden, sb.repo());

    // Embedded mode: the checkout holds the weights, so its worker
    // provides them.
    let (code, out) = outcome(
        fvd()
            .args(["submit", "--family", "weighted", "--wait", "--repo"])
            .arg(sb.repo()),
    );
    assert_eq!(code, Some(0), "{out}");

    sb.serve();
    spawn_hidden_worker(&mut sb, "bare", &[]);
    let submit = sb.submit_remote("weighted", &[]);
    assert!(
        submit.status.success(),
        "{}",
        String::from_utf8_lossy(&submit.stderr)
    );
    let reason = wait_for("the waiting reason", Duration::from_secs(60), || {
        let s = sb.remote_status("weighted")?;
        let r = s["components"][0]["reason"].as_str()?.to_string();
        r.contains("worker path").then_some(r)
    });
    assert_eq!(
        reason,
        "waiting: needs worker path official_weights/tiny; no registered worker provides it (fvd worker --provide PATH=DIR)"
    );

    // A worker with the weights on its own disk takes the job; its
    // checkout links them in.
    let node = sb.dir.path().join("node-weights/tiny");
    std::fs::create_dir_all(&node).unwrap();
    std::fs::write(node.join("w.txt"), "node weights").unwrap();
    let provide = format!("official_weights/tiny={}", node.display());
    spawn_hidden_worker(&mut sb, "holder", &["--provide", &provide]);
    let done = wait_for("the component's verdict", Duration::from_secs(120), || {
        let s = sb.remote_status("weighted")?;
        let c = &s["components"][0];
        (c["status"] == "non_skip_pass" || c["status"] == "blocked").then(|| c.clone())
    });
    assert_eq!(done["status"], "non_skip_pass", "{done}\n{}", sb.logs());
    assert_eq!(done["worker_id"], "holder", "{done}");
}
