//! Out of the jail through git (issue #38): every parity test and every
//! agent of the example port plants hooks (every name git runs, in the
//! hooks folder and in a `core.hooksPath` of its own), `core.fsmonitor`,
//! and a `.git` file pointing to a repository of its own making, in every
//! git folder it can reach from its checkout: its worktree's, the worker's
//! clone `WORKSPACE/code/repo.git`, and any `*.git` folder beside the
//! folders above it (inside the test's sandbox). The port then goes through agent attempts on the
//! worker (commit, pack, adoption), verdict runs by commit (a worktree
//! added per commit), a question and its answer, and a rerun of every
//! component (the worker resets and cleans the checkouts it reuses). No
//! hook or fsmonitor ever runs: each would append a line to a marker file
//! outside the jail, as whoever ran it.
//!
//! Three workers, each in a mount namespace where a tmpfs hides the
//! repository (code by commit): root with the jail (the planting is
//! refused: the git folders are read-only to jobs), `nobody` with the jail
//! (the same, from a user namespace or Landlock), and root with
//! `--job-sandbox off` (the planting succeeds, so the test can fail, and
//! fvd's git still runs nothing: the one runner's configuration).
//!
//! CI runs as root; without `unshare`, a tmpfs mount and `setpriv` this
//! test fails, it never skips.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::agent::example_repo;
use crate::bycommit::{answer_first_option, assert_hidden, hidden_from, verdicts};
use crate::support::{LOG_FILTER, Sandbox};

const NOBODY: u32 = 65534;

/// What every parity test (through a `conftest.py`) and every agent
/// (through its command) runs first. Writes one report per process into
/// the marker folder.
const PLANTER: &str = r#"
import glob, json, os, subprocess

NAMES = ["pre-commit", "prepare-commit-msg", "commit-msg", "post-commit",
         "post-checkout", "post-index-change", "reference-transaction",
         "post-merge", "post-rewrite", "pre-auto-gc", "pre-rebase",
         "push-to-checkout", "fsmonitor-watchman"]

def plant(who):
    mark = os.environ.get("FVD_E2E_HOOK_MARK") or open(os.path.join(os.path.dirname(__file__), "mark")).read().strip()
    hook = os.path.join(mark, "hook.sh")
    sandbox = os.path.dirname(mark)
    report = {"who": who, "uid": os.getuid(), "cwd": os.getcwd(), "dirs": {}, "gitfile": None}

    def attempt(f):
        try:
            f()
            return "planted"
        except OSError as e:
            return "refused: %s" % (e.strerror,)

    found = set()
    d = os.getcwd()
    while True:
        g = os.path.join(d, ".git")
        if os.path.isdir(g):
            found.add(g)
        elif os.path.isfile(g):
            try:
                admin = open(g).read().split("gitdir:", 1)[1].strip()
                admin = os.path.normpath(os.path.join(d, admin))
                found.add(admin)
                cd = os.path.join(admin, "commondir")
                if os.path.isfile(cd):
                    found.add(os.path.normpath(os.path.join(admin, open(cd).read().strip())))
            except (OSError, IndexError):
                pass
        # Beside the folders above it, inside the test's own sandbox only
        # (other tests' repositories are not this test's to spoil).
        if (d + "/").startswith(sandbox + "/"):
            for c in glob.glob(os.path.join(d, "*.git")) + glob.glob(os.path.join(d, "*", "*.git")):
                if os.path.isdir(c) and not c.startswith(mark + "/"):
                    found.add(c)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    for c in list(found):
        found.update(p for p in glob.glob(os.path.join(c, "worktrees", "*")) if os.path.isdir(p))
    for g in sorted(found):
        r = {}
        def hooks():
            os.makedirs(os.path.join(g, "hooks"), exist_ok=True)
            for n in NAMES:
                with open(os.path.join(g, "hooks", n), "w") as f:
                    f.write(open(hook).read())
                os.chmod(os.path.join(g, "hooks", n), 0o755)
        r["hooks"] = attempt(hooks)
        def config():
            with open(os.path.join(g, "config"), "a") as f:
                f.write("[core]\n\tfsmonitor = %s\n\thooksPath = %s\n" % (hook, os.path.join(mark, "hooks")))
        r["config"] = attempt(config)
        report["dirs"][g] = r
    # The checkout's own `.git` file, sent to a repository of the job's.
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True).stdout.strip()
    if top and os.path.isfile(os.path.join(top, ".git")):
        fake = os.path.join(mark, "fake-%d.git" % os.getpid())
        subprocess.run(["git", "init", "-q", "--bare", fake], capture_output=True)
        def gitfile():
            with open(os.path.join(fake, "config"), "a") as f:
                f.write("[core]\n\tfsmonitor = %s\n" % hook)
            with open(os.path.join(top, ".git"), "w") as f:
                f.write("gitdir: %s\n" % fake)
        report["gitfile"] = attempt(gitfile)
    with open(os.path.join(mark, "report-%s-%d.json" % (who, os.getpid())), "w") as f:
        json.dump(report, f)
"#;

/// The other half of the planter module (issue #38, item 2): the agent
/// says which token it holds (as a digest only) and waits while a parity
/// test of the same worker hunts for it in every process's environment
/// and command line and in every file of the worker's workspace. The hunt
/// reports digests of everything token-like it read, the tools scopes
/// (`FVD_TOOLS_*` together) it found, and what it could read.
const HUNTER: &str = r#"
import hashlib, re, time

TOKENISH = re.compile(rb"[A-Za-z0-9_+/=.-]{16,}")

def mark_dir():
    return os.environ.get("FVD_E2E_HOOK_MARK") or open(os.path.join(os.path.dirname(__file__), "mark")).read().strip()

def digest(v):
    return hashlib.sha256(v).hexdigest()

def hold():
    mark = mark_dir()
    if os.path.exists(os.path.join(mark, "hunted")):
        return
    token = os.environ.get("FVD_TOOLS_TOKEN", "").encode()
    me = os.getpid()
    with open(os.path.join(mark, "held-%d.json" % me), "w") as f:
        json.dump({"digest": digest(token) if token else None}, f)
    open(os.path.join(mark, "agent-ready"), "a").close()
    deadline = time.time() + 40  # the agent's timeout is longer
    why = "deadline"
    while time.time() < deadline:
        if os.path.exists(os.path.join(mark, "hunted")):
            why = "hunted"
            break
        time.sleep(0.05)
    open(os.path.join(mark, "released-%s-%d" % (why, me)), "a").close()

def workspace():
    d = os.getcwd()
    while d != "/":
        if os.path.isdir(os.path.join(d, "code")) and os.path.isdir(os.path.join(d, "jobs")):
            return d
        d = os.path.dirname(d)
    return None

def hunt():
    mark = mark_dir()
    if os.path.exists(os.path.join(mark, "hunted")):
        return
    deadline = time.time() + 90
    while not os.path.exists(os.path.join(mark, "agent-ready")) and time.time() < deadline:
        time.sleep(0.05)
    me = os.getpid()
    found, scopes = set(), []
    seen = {"pids": 0, "environs": 0, "cmdlines": 0, "files": 0, "workspace": workspace()}
    def take(blob):
        for part in blob.split(b"\0"):
            value = part.split(b"=", 1)[-1]
            found.add(digest(value))
            for m in TOKENISH.findall(part):
                found.add(digest(m))
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == me:
            continue
        seen["pids"] += 1
        try:
            env = open("/proc/%s/environ" % p, "rb").read()
            seen["environs"] += 1
            take(env)
            names = dict(kv.split(b"=", 1) for kv in env.split(b"\0") if b"=" in kv)
            if b"FVD_TOOLS_TOKEN" in names:
                scopes.append(sorted(k.decode() for k in names if k.startswith(b"FVD_TOOLS")))
        except OSError:
            pass
        try:
            take(open("/proc/%s/cmdline" % p, "rb").read())
            seen["cmdlines"] += 1
        except OSError:
            pass
    if seen["workspace"]:
        for d, _, files in os.walk(seen["workspace"]):
            if "/objects" in d:
                continue
            for f in files:
                try:
                    take(open(os.path.join(d, f), "rb").read(1 << 20))
                    seen["files"] += 1
                except OSError:
                    pass
    with open(os.path.join(mark, "hunt-%d.json" % me), "w") as f:
        json.dump({"digests": sorted(found), "scopes": scopes, "seen": seen}, f)
    open(os.path.join(mark, "hunted"), "a").close()
"#;

/// Loaded by pytest before each parity test of the folder it is in.
const CONFTEST: &str = r#"
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tools"))
import fvd_e2e_planter
fvd_e2e_planter.plant("test")
# The vae test is the hunter: it waits (at most 90 s) for an agent.
if os.path.basename(os.path.dirname(os.path.abspath(__file__))) == "vaes":
    fvd_e2e_planter.hunt()
"#;

/// The agent: plants, then is the example's replay agent.
const AGENT: &str = r#"
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fvd_e2e_planter
fvd_e2e_planter.plant("agent")
fvd_e2e_planter.hold()
os.execvp("python3", ["python3", "-B", "tools/replay_agent.py", *sys.argv[1:]])
"#;

/// How a worker runs in a scenario.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Worker {
    RootJailed,
    NobodyJailed,
    RootUnjailed,
}

struct Outcome {
    reports: Vec<serde_json::Value>,
    ran: Option<String>,
    clone: PathBuf,
    /// The hunter's report and the agents' (`held-*`: the digest of the
    /// token each held), and why each agent stopped waiting.
    hunts: Vec<serde_json::Value>,
    held: Vec<serde_json::Value>,
    released: Vec<String>,
}

fn scenario(worker: Worker) -> Outcome {
    let mut sb = Sandbox::with_repo_in("hidden/repo");
    let root = sb.dir.path().to_path_buf();
    let mark = root.join("mark");
    std::fs::create_dir_all(mark.join("hooks")).unwrap();
    let hook = mark.join("hook.sh");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\necho \"uid=$(id -u) $0 $* in $PWD\" >> {}/ran\n",
            mark.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    for n in ["post-checkout", "post-commit", "reference-transaction"] {
        std::fs::copy(&hook, mark.join("hooks").join(n)).unwrap();
    }
    example_repo(&sb, |t| {
        t.replace(
            r#"command = ["python3", "-B", "tools/replay_agent.py","#,
            r#"command = ["python3", "-B", "tools/fvd_e2e_agent.py","#,
        )
        // The hunter's test waits for an agent, the agent for the hunt.
        .replace("timeout_s = 60\n", "timeout_s = 150\n")
    });
    let repo = sb.repo().to_path_buf();
    std::fs::write(
        repo.join("tools/fvd_e2e_planter.py"),
        format!("{PLANTER}{HUNTER}"),
    )
    .unwrap();
    std::fs::write(repo.join("tools/fvd_e2e_agent.py"), AGENT).unwrap();
    // The marker folder, named by a file of the port (tests get only the
    // spec's variables).
    std::fs::write(repo.join("tools/mark"), mark.display().to_string()).unwrap();
    let mut planted_in = 0;
    for dir in std::fs::read_dir(repo.join("tests/local_tests")).unwrap() {
        let dir = dir.unwrap().path();
        let has_test = std::fs::read_dir(&dir)
            .map(|es| {
                es.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("test_"))
            })
            .unwrap_or(false);
        if has_test {
            std::fs::write(dir.join("conftest.py"), CONFTEST).unwrap();
            planted_in += 1;
        }
    }
    assert!(planted_in >= 3, "the example's test folders");
    crate::agent::git(&repo, &["add", "-A"]);
    crate::agent::git(&repo, &["commit", "-q", "-m", "planters"]);
    let hidden = root.join("hidden");
    assert_hidden(&hidden, &repo);

    let url = sb.serve_with(&["--allow-agent-commands"]);
    let ws = root.join("ws-w1");
    std::fs::create_dir_all(&ws).unwrap();
    // Someone else's worker needs to reach its binary, its workspace and
    // the marker folder.
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let fvd = bin.join("fvd");
    std::fs::copy(env!("CARGO_BIN_EXE_fvd"), &fvd).unwrap();
    for p in [&root, &bin, &mark, &mark.join("hooks")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    std::fs::set_permissions(&fvd, std::fs::Permissions::from_mode(0o755)).unwrap();
    if worker == Worker::NobodyJailed {
        std::os::unix::fs::chown(&ws, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let fvd_s = fvd.display().to_string();
    let ws_s = ws.display().to_string();
    let mut argv: Vec<&str> = Vec::new();
    if worker == Worker::NobodyJailed {
        argv.extend([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ]);
    }
    argv.extend([
        fvd_s.as_str(),
        "worker",
        "--orchestrator",
        url.as_str(),
        "--gpus",
        "none",
        "--worker-id",
        "w1",
        "--cpu-slots",
        "2",
        "--workspace",
        ws_s.as_str(),
        "--job-sandbox",
        if worker == Worker::RootUnjailed {
            "off"
        } else {
            "auto"
        },
    ]);
    let log = std::fs::File::create(root.join("worker-w1.log")).unwrap();
    let mut cmd = hidden_from(&hidden, &argv);
    if worker == Worker::NobodyJailed {
        // Debian's Python, with Debian's pytest and numpy (scripts/test.sh
        // installs them): a Python below /root is out of nobody's reach.
        cmd.env("PATH", "/usr/local/bin:/usr/bin:/bin");
        let probe = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(["python3", "-c", "import pytest, numpy"])
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .output()
            .expect("run setpriv (util-linux)");
        assert!(
            probe.status.success(),
            "nobody's python3 lacks pytest or numpy (apt-get install python3-pytest python3-numpy; scripts/test.sh does): {}",
            String::from_utf8_lossy(&probe.stderr)
        );
    }
    cmd.env("FVD_LOG", LOG_FILTER)
        .env("HOME", &ws)
        .current_dir(&root)
        .stdout(Stdio::null())
        .stderr(log);
    sb.spawn_worker("w1", cmd);

    // Agent attempts, verdict runs by commit, a question.
    let out = sb.submit_remote("tinyport", &["--wait"]);
    let text = format!(
        "{}{}\nlogs:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        sb.logs()
    );
    assert_eq!(out.status.code(), Some(3), "{worker:?}: {text}");
    answer_first_option(&sb, &url);
    let got = verdicts(&sb.remote_status("tinyport").unwrap());
    for name in ["timestep_embed", "time_shift", "embed", "transformer"] {
        assert!(
            got.iter()
                .any(|(n, s, _, _)| n == name && s == "non_skip_pass"),
            "{worker:?}: {name} did not pass: {got:?}\n{}",
            sb.logs()
        );
    }
    // Every component again, in the checkouts the worker now reuses.
    let out = sb.submit_remote("tinyport", &["--wait", "--rerun"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{worker:?}: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        sb.logs()
    );

    let (mut reports, mut hunts, mut held, mut released) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for e in std::fs::read_dir(&mark).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let json = || serde_json::from_str(&std::fs::read_to_string(e.path()).unwrap()).unwrap();
        if name.starts_with("report-") {
            reports.push(json());
        } else if name.starts_with("hunt-") {
            hunts.push(json());
        } else if name.starts_with("held-") {
            held.push(json());
        } else if let Some(why) = name.strip_prefix("released-") {
            released.push(why.split('-').next().unwrap_or_default().to_string());
        }
    }
    Outcome {
        reports,
        ran: std::fs::read_to_string(mark.join("ran")).ok(),
        clone: ws.join("code/repo.git").canonicalize().unwrap(),
        hunts,
        held,
        released,
    }
}

/// The planting reached the worker's clone from tests and agents, and what
/// it did there: `(tests, agents, planted)` where `planted` counts the
/// hooks or configurations written into the clone.
fn reach(o: &Outcome, worker: Worker) -> (usize, usize, usize) {
    let (mut tests, mut agents, mut planted) = (0, 0, 0);
    for r in &o.reports {
        let dirs = r["dirs"].as_object().unwrap();
        // The sandbox is gone by now: paths are compared as written (the
        // clone's is canonical, and so are the planter's).
        let clone = dirs.iter().find(|(p, _)| Path::new(p.as_str()) == o.clone);
        let Some((_, what)) = clone else {
            continue;
        };
        match r["who"].as_str() {
            Some("test") => tests += 1,
            Some("agent") => agents += 1,
            _ => {}
        }
        for k in ["hooks", "config"] {
            if what[k] == "planted" {
                planted += 1;
            }
        }
        if worker == Worker::NobodyJailed {
            assert_eq!(r["uid"], NOBODY, "{r}");
        }
    }
    (tests, agents, planted)
}

/// Whether the hunt found the token an agent held while it ran: `(found,
/// scopes)`, the second the tools scopes it read in other processes'
/// environments. Fails unless exactly one hunt ran while an agent waited
/// for it (so its result is about a live agent).
fn hunted(o: &Outcome, worker: Worker) -> (bool, usize) {
    assert_eq!(o.hunts.len(), 1, "{worker:?}: one hunt: {:#?}", o.hunts);
    assert!(
        o.released.iter().any(|w| w == "hunted"),
        "{worker:?}: no agent was waiting when the hunt ran: released {:?}",
        o.released
    );
    let h = &o.hunts[0];
    assert!(
        h["seen"]["pids"].as_u64().unwrap() > 1 && h["seen"]["files"].as_u64().unwrap() > 10,
        "{worker:?}: the hunt saw too little to mean anything: {}",
        h["seen"]
    );
    let digests: Vec<&str> = h["digests"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d.as_str())
        .collect();
    let tokens: Vec<&str> = o.held.iter().filter_map(|x| x["digest"].as_str()).collect();
    assert!(
        !tokens.is_empty(),
        "{worker:?}: no agent held a tools token: {:?}",
        o.held
    );
    let found = tokens.iter().any(|t| digests.contains(t));
    (found, h["scopes"].as_array().unwrap().len())
}

#[test]
fn hooks_planted_by_tests_and_agents_never_run_on_a_worker() {
    for worker in [
        Worker::RootJailed,
        Worker::NobodyJailed,
        Worker::RootUnjailed,
    ] {
        let o = scenario(worker);
        // Item 2: a parity test hunts a running agent of the same worker.
        let (found, scopes) = hunted(&o, worker);
        match worker {
            Worker::RootJailed | Worker::NobodyJailed => assert!(
                !found && scopes == 0,
                "{worker:?}: a parity test reached a running agent's tools token (found {found}, {scopes} scopes): {}",
                o.hunts[0]["seen"]
            ),
            // Unjailed it does: the hunt can fail.
            Worker::RootUnjailed => assert!(
                found && scopes > 0,
                "{worker:?}: the unjailed hunt should find the agent's token: {}",
                o.hunts[0]["seen"]
            ),
        }
        let ran: Vec<&str> = o.ran.as_deref().unwrap_or_default().lines().collect();
        assert!(
            ran.is_empty(),
            "{worker:?}: a planted program ran {} times, first:\n{}",
            ran.len(),
            ran[..ran.len().min(10)].join("\n")
        );
        let (tests, agents, planted) = reach(&o, worker);
        assert!(
            tests >= 5 && agents >= 2,
            "{worker:?}: the planter reached the worker's clone from {tests} tests and {agents} agents: {:#?}",
            o.reports
        );
        match worker {
            // The jail leaves the git folders read-only: every plant there
            // is refused, and so is rewriting the checkout's `.git` file
            // (with a namespace; Landlock protects folders only).
            Worker::RootJailed | Worker::NobodyJailed => {
                assert_eq!(planted, 0, "{worker:?}: {:#?}", o.reports);
                for r in &o.reports {
                    for (dir, what) in r["dirs"].as_object().unwrap() {
                        for k in ["hooks", "config"] {
                            assert_ne!(what[k], "planted", "{worker:?}: {dir}: {r}");
                        }
                    }
                }
            }
            // Unjailed, the planting succeeds: only fvd's git runner
            // stands between it and the worker.
            Worker::RootUnjailed => {
                assert!(planted > 0, "{worker:?}: {:#?}", o.reports);
                assert!(
                    o.reports.iter().any(|r| r["gitfile"] == "planted"),
                    "{worker:?}: {:#?}",
                    o.reports
                );
            }
        }
    }
}
