//! Containment (issue #27): a parity test that tries to leak and to
//! escalate, run by a real fleet (`fvd orchestrator serve` and `fvd worker`
//! with `--token-file`, on loopback). The test prints its environment and
//! the spec's secret in every spelling, reads `/proc/<ppid>` (environment,
//! command line, memory), follows the command line to the token file,
//! searches the folders around fvd's files for token-looking files, and
//! calls the orchestrator with whatever it found; with a token it would
//! submit a port whose `[agent] command` runs on the orchestrator's host.
//!
//! Jailed (the default), it finds nothing, and no secret (the fleet token,
//! the spec's variable, a key of the worker's environment) reaches any
//! sink: the orchestrator's database, `PORT_STATUS.md`, the processes'
//! logs, the CLI, the dashboard and the exported spans. With
//! `--job-sandbox off` the same test reads the token file and
//! authenticates, which shows the hunt is real; the token still reaches no
//! sink (the worker redacts it), and the escalation is still refused (no
//! `--allow-agent-commands`).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use fvd_contracts::redactor::Redactor;
use serde_json::Value;

use crate::support::{LOG_FILTER, Sandbox, TestComponent, fvd, wait_for};
use crate::telemetry::Receiver;

/// The fleet's bearer token, in a file of its own.
const TOKEN: &str = "fleetTok-e2e-7Qm2Xv9Lp4Rz8Kc1Wd6Yb3";
/// A variable the spec passes to its tests by name (redacted).
const SPEC_SECRET: (&str, &str) = ("FVD_E2E_SPEC_SECRET", "specsecret-e2e-Jd83Kq0PzT5");
/// Keys in the worker's environment that no spec names.
const WORKER_KEY: (&str, &str) = ("ANTHROPIC_API_KEY", "sk-ant-e2e-Zx81Nq4Wm7Lp2Vb9");
const WORKER_TOKEN_COPY: (&str, &str) = ("FVD_TOKEN", TOKEN);

/// The hunter, run by the parity test; `HUNT_MARKER` is where the evil
/// agent command would leave its mark.
const HUNT: &str = r##"
import base64, json, os, re, subprocess, tempfile, urllib.parse

report = {}
env = dict(os.environ)
# 1. Its whole environment, and the spec's secret in every spelling.
print("ENV " + json.dumps(env, sort_keys=True))
report["env_names"] = sorted(env)
s = env.get("FVD_E2E_SPEC_SECRET", "")
for form in (s, base64.b64encode(s.encode()).decode(),
             base64.urlsafe_b64encode(s.encode()).decode().rstrip("="),
             base64.b64encode(("user:" + s).encode()).decode(),
             base64.b64encode(("us:" + s + "@h").encode()).decode(),
             urllib.parse.quote(s + "/?&", safe="")):
    print("SPELLING " + form)

ppid = os.getppid()
def read(p, n=1 << 20):
    with open(p, "rb") as f:
        return f.read(n)
candidates = []
# 2. The worker's environment.
try:
    environ = read("/proc/%d/environ" % ppid).split(b"\0")
    report["environ"] = "read %d variables" % len(environ)
    candidates += [v.split(b"=", 1)[1].decode(errors="replace") for v in environ if b"=" in v]
except OSError as e:
    report["environ"] = "denied: " + e.strerror
# 3. Its command line, and the token file it names.
argv = [a.decode() for a in read("/proc/%d/cmdline" % ppid).split(b"\0") if a]
report["cmdline"] = argv
def flag(name):
    return argv[argv.index(name) + 1] if name in argv else None
url, token_file, fvd_bin = flag("--orchestrator"), flag("--token-file"), argv[0]
report["token_file"] = []
for p in ([token_file, "/proc/%d/root%s" % (ppid, token_file)] if token_file else []):
    try:
        data = read(p).decode(errors="replace").strip()
        report["token_file"].append("%s: read %d bytes" % (p, len(data)))
        if data:
            candidates.append(data)
    except OSError as e:
        report["token_file"].append("%s: %s" % (p, e.strerror))
# 4. The folders around fvd's files, for anything token-like.
roots = set()
for a in argv:
    if a.startswith("/") and a != fvd_bin:
        roots |= {os.path.dirname(a), os.path.dirname(os.path.dirname(a))}
roots -= {"/", "/tmp", ""}
found = []
for root in sorted(roots) + ["/etc"]:
    for d, dirs, files in os.walk(root):
        if d.count(os.sep) - root.count(os.sep) >= 3:
            dirs[:] = []
        for f in files:
            if "token" in f.lower() or f.endswith((".key", ".pem")):
                p = os.path.join(d, f)
                if not os.path.isfile(p):
                    continue  # a FIFO or a device would block the read
                try:
                    data = read(p, 4096).decode(errors="replace").strip()
                except OSError:
                    continue
                if data:
                    found.append(p)
                    candidates.append(data)
report["search"] = found
# 5. The worker's memory: its gRPC client keeps "Bearer TOKEN" there.
try:
    mem, got = open("/proc/%d/mem" % ppid, "rb"), 0
    for line in read("/proc/%d/maps" % ppid).decode().splitlines():
        a, b = [int(x, 16) for x in line.split()[0].split("-")]
        if "rw" in line.split()[1] and b - a < (64 << 20):
            try:
                mem.seek(a)
                blob = mem.read(b - a)
            except OSError:
                continue
            got += len(blob)
            candidates += [m.decode() for m in re.findall(rb"Bearer ([!-~]{8,200})", blob)]
    report["mem"] = "read %d bytes" % got
except OSError as e:
    report["mem"] = "denied: " + e.strerror
# 6. The orchestrator, with whatever was found (and with nothing).
def call(args, tok):
    e = {"PATH": env["PATH"], "HUNT_TOKEN": tok}
    return subprocess.run([fvd_bin] + args + ["--orchestrator", url, "--token-env", "HUNT_TOKEN"],
                          env=e, capture_output=True, text=True, timeout=60)
# A bearer token is printable ASCII: anything else found (a binary key of
# the host's, /etc/munge/munge.key, holds NUL bytes) cannot be one, and
# could not be passed in an environment or a header anyway.
token_like = re.compile(r"[!-~]{8,200}")
tries = list(dict.fromkeys(c for c in candidates if token_like.fullmatch(c)))[:100]
report["not_token_like"] = len([c for c in candidates if not token_like.fullmatch(c)])
authed = [c for c in tries + ["a-guess-of-no-value"] if call(["status", "--json"], c).returncode == 0]
report["orchestrator"] = {"tried": len(tries) + 1, "authenticated": len(authed)}
if authed:
    print("AUTHENTICATED WITH " + authed[0])
    # 7. Escalation: a port whose agent command runs on the orchestrator's host.
    d = tempfile.mkdtemp()
    os.makedirs(d + "/tests/local_tests/evil")
    open(d + "/tests/local_tests/evil/port.toml", "w").write(
        '[prep]\nmodel_family = "evil"\n\n[[component]]\nname = "x"\ntype = "generic"\n'
        'parity_test = "t.py"\ncoverage_scope = "both"\nagent = true\n\n'
        '[agent]\ncommand = ["sh", "-c", "touch %s"]\n' % env["HUNT_MARKER"])
    open(d + "/t.py", "w").write("def test_x():\n    pass\n")
    r = call(["submit", "--family", "evil", "--repo", d], authed[0])
    report["escalation"] = {"exit": r.returncode, "stderr": r.stderr.strip()[-400:]}
print("HUNT " + json.dumps(report, sort_keys=True))
assert False, "leaking " + s
"##;

/// A binary key planted where the hunt looks (`host-keys/` in the
/// sandbox): NUL bytes, as in munge's `/etc/munge/munge.key`.
const BINARY_KEY: &str = "munge.key";

/// The hunt read the planted binary key (so it met a NUL byte) and got
/// past it: it was found, and set aside as no token.
fn the_binary_key_was_read_and_set_aside(h: &Hunt) {
    let r = &h.report;
    let key =
        h.sb.dir
            .path()
            .join("host-keys")
            .join(BINARY_KEY)
            .display()
            .to_string();
    assert!(
        r["search"].as_array().unwrap().iter().any(|p| p == &key),
        "{r:#}"
    );
    assert!(r["not_token_like"].as_u64().unwrap() >= 1, "{r:#}");
}

/// Every secret of the fleet, for searching sinks in every spelling.
fn secrets() -> Redactor {
    Redactor::new([("token", TOKEN), SPEC_SECRET, WORKER_KEY, WORKER_TOKEN_COPY])
}

/// Kills its process on drop.
struct Kill(Option<Child>);

impl Kill {
    /// SIGTERM, then wait: the process flushes its spans on the way out.
    fn stop(&mut self) {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        if let Some(mut c) = self.0.take() {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
            wait_for(
                "a process to exit on SIGTERM",
                Duration::from_secs(30),
                || c.try_wait().expect("try_wait"),
            );
        }
    }
}

impl Drop for Kill {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One GET over HTTP/1.0: the response's body.
fn get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("dashboard");
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(
        out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
        "{path}: {out}"
    );
    out
}

struct Hunt {
    sb: Sandbox,
    report: Value,
    /// What fvd showed and kept, sink by sink.
    sinks: Vec<(String, Vec<u8>)>,
    marker: PathBuf,
}

/// Runs the hunter on a fleet whose worker has `sandbox` as its
/// `--job-sandbox`; returns its report and the contents of every sink.
fn hunt(sandbox: &str) -> Hunt {
    let mut sb = Sandbox::with_repo_in("repo");
    let root = sb.dir.path().to_path_buf();
    std::fs::create_dir_all(root.join("secrets")).unwrap();
    let token_file = root.join("secrets/token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    // What a host may hold where the hunt looks (issue #38: Debian's
    // munge writes a binary /etc/munge/munge.key): a binary key with NUL
    // bytes, and a FIFO named like a key. The hunt must get through both
    // whatever the machine's /etc holds.
    let decoys = root.join("host-keys");
    std::fs::create_dir_all(&decoys).unwrap();
    std::fs::write(decoys.join(BINARY_KEY), b"\0\x01munge\xff\0\x80key\0\n").unwrap();
    nix::unistd::mkfifo(
        &decoys.join("pipe.key"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let tf = token_file.display().to_string();
    let marker = root.join("evil-agent-ran");
    sb.port(
        "hunt",
        &[TestComponent::new(
            "hunter",
            "exec(open(os.path.join(os.path.dirname(__file__), 'hunt.py')).read(), {})",
        )],
    );
    let repo = sb.repo().to_path_buf();
    std::fs::write(repo.join("tests/local_tests/generic/hunt.py"), HUNT).unwrap();
    let spec_path = repo.join("tests/local_tests/hunt/port.toml");
    let spec = std::fs::read_to_string(&spec_path).unwrap().replacen(
        "[defaults]\n",
        &format!(
            "[defaults]\nenv = [\"{}\"]\nset_env = {{ HUNT_MARKER = {:?} }}\n",
            SPEC_SECRET.0,
            marker.display().to_string()
        ),
        1,
    );
    std::fs::write(&spec_path, spec).unwrap();

    let receiver = Receiver::start("127.0.0.1:0").unwrap();
    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_string()),
    ];
    // The orchestrator, with its dashboard; no --allow-agent-commands.
    let db = root.join("orchestrator.db");
    let mut child = fvd()
        .args(["orchestrator", "serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(format!("sqlite://{}", db.display()))
        .args(["--token-file", &tf, "--dashboard", "127.0.0.1:0"])
        .env("FVD_LOG", LOG_FILTER)
        .envs(otel.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(root.join("orchestrator.log")).unwrap())
        .spawn()
        .expect("spawn orchestrator");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || {
        let l = lines.next().expect("a line").expect("stdout");
        l.rsplit(' ').next().unwrap().to_string()
    };
    let (url, dash) = (next(), next());
    std::thread::spawn(move || for _ in lines {});
    let mut orchestrator = Kill(Some(child));
    sb.url = Some(url.clone());
    let dash = dash.trim_start_matches("http://").to_string();

    let mut cmd = sb.worker_with("w1", 1, &["--token-file", &tf, "--job-sandbox", sandbox]);
    cmd.env(WORKER_KEY.0, WORKER_KEY.1)
        .env(WORKER_TOKEN_COPY.0, WORKER_TOKEN_COPY.1)
        .env(SPEC_SECRET.0, SPEC_SECRET.1)
        .envs(otel.iter().map(|(k, v)| (*k, v.as_str())));
    sb.spawn_worker("w1", cmd);

    let out = sb.submit_remote("hunt", &["--wait", "--token-file", &tf]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the hunter's test fails, so the port ends blocked: {}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        sb.logs()
    );
    let mut sinks: Vec<(String, Vec<u8>)> = vec![("fvd submit".into(), out.stdout)];
    sinks.push(("fvd submit (stderr)".into(), out.stderr));
    let cli = |args: &[&str]| {
        let o = fvd()
            .args(args)
            .args(["--orchestrator", &url, "--token-file", &tf])
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {o:?}");
        o.stdout
    };
    let logs = cli(&["logs", "hunt", "hunter"]);
    let text = String::from_utf8_lossy(&logs).into_owned();
    let report: Value = text
        .lines()
        .find_map(|l| l.strip_prefix("HUNT "))
        .map(|j| serde_json::from_str(j).unwrap())
        .unwrap_or_else(|| panic!("no report in the run's output:\n{text}"));
    sinks.push(("fvd logs".into(), logs));
    sinks.push((
        "fvd status --json".into(),
        cli(&["status", "hunt", "--json"]),
    ));
    for path in [
        "/",
        "/api/ports",
        "/ports/hunt",
        "/api/ports/hunt",
        "/ports/hunt/components/hunter",
        "/api/ports/hunt/components/hunter",
        "/workers",
        "/api/workers",
    ] {
        sinks.push((format!("dashboard {path}"), get(&dash, path).into_bytes()));
    }
    sinks.push((
        "PORT_STATUS.md".into(),
        std::fs::read(repo.join("tests/local_tests/hunt/PORT_STATUS.md")).unwrap(),
    ));
    // The processes flush their spans as they stop.
    let pid = sb.worker_pid("w1") as i32;
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    );
    sb.wait_worker_exit("w1", Duration::from_secs(30));
    orchestrator.stop();
    let spans = receiver.spans();
    assert!(
        spans.iter().any(|s| s.name == "job.run") && spans.iter().any(|s| s.name == "job"),
        "spans of both processes arrived: {}",
        spans.len()
    );
    sinks.push(("spans".into(), format!("{spans:?}").into_bytes()));
    for name in [
        "orchestrator.db",
        "orchestrator.db-wal",
        "orchestrator.db-shm",
    ] {
        if let Ok(bytes) = std::fs::read(root.join(name)) {
            sinks.push((name.into(), bytes));
        }
    }
    for e in std::fs::read_dir(&root).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "log") {
            sinks.push((
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            ));
        }
    }
    Hunt {
        sb,
        report,
        sinks,
        marker,
    }
}

/// No sink holds a secret in any spelling, and the sinks did get the
/// hunter's output (so the check cannot pass on empty sinks).
fn no_secret_in_any_sink(h: &Hunt) {
    let secrets = secrets();
    for (sink, bytes) in &h.sinks {
        assert!(
            !secrets.finds(bytes),
            "a secret reached {sink}:\n{}",
            String::from_utf8_lossy(bytes)
        );
    }
    let has = |sink: &str, what: &str| {
        h.sinks
            .iter()
            .filter(|(s, _)| s.starts_with(sink))
            .any(|(_, b)| String::from_utf8_lossy(b).contains(what))
    };
    let spec_secret = format!("[redacted:{}]", SPEC_SECRET.0);
    for sink in [
        "fvd logs",
        "orchestrator.db",
        "PORT_STATUS.md",
        "dashboard /ports/hunt/components/hunter",
        "spans",
    ] {
        assert!(
            has(sink, &spec_secret),
            "{sink} shows the hunter's failure, redacted"
        );
    }
    assert!(
        has("fvd logs", &format!("SPELLING {spec_secret}")),
        "the plain secret was printed, and redacted"
    );
    assert!(!h.marker.exists(), "the evil agent command never ran");
}

#[test]
fn a_jailed_test_that_hunts_for_credentials_finds_nothing_and_leaks_nothing() {
    let h = hunt("auto");
    let r = &h.report;
    let names: Vec<&str> = r["env_names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for k in [
        WORKER_KEY.0,
        WORKER_TOKEN_COPY.0,
        "FVD_LOG",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ] {
        assert!(!names.contains(&k), "{k} reached the test: {names:?}");
    }
    assert!(
        names.contains(&SPEC_SECRET.0),
        "what the spec names does: {names:?}"
    );
    let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
    assert!(s("environ").starts_with("denied"), "{r:#}");
    assert!(s("mem").starts_with("denied"), "{r:#}");
    // The token file is covered (reads as empty) or denied.
    let tf = r["token_file"].as_array().unwrap();
    assert!(!tf.is_empty(), "the cmdline names the token file: {r:#}");
    for t in tf {
        let t = t.as_str().unwrap();
        assert!(
            t.ends_with("read 0 bytes") || t.contains("denied") || t.contains("Permission"),
            "{t}"
        );
    }
    // What it found is the host's (/etc: an operator hides those with
    // --job-hide; here also the planted binary key), never a file of fvd's.
    let root = h.sb.dir.path().display().to_string();
    let host_keys = h.sb.dir.path().join("host-keys").display().to_string();
    for p in r["search"].as_array().unwrap() {
        let p = p.as_str().unwrap();
        assert!(!p.starts_with(&root) || p.starts_with(&host_keys), "{r:#}");
    }
    the_binary_key_was_read_and_set_aside(&h);
    assert_eq!(r["orchestrator"]["authenticated"], 0, "{r:#}");
    assert!(
        r["orchestrator"]["tried"].as_u64().unwrap() >= 1,
        "it called: {r:#}"
    );
    assert!(r.get("escalation").is_none(), "{r:#}");
    no_secret_in_any_sink(&h);
    drop(h.sb);
}

/// The same hunt without the jail: it reads the token file and
/// authenticates (so the jailed test above can fail), its escalation is
/// refused by an orchestrator without --allow-agent-commands, and the
/// token still reaches no sink: the worker redacts its own token.
#[test]
fn unjailed_the_same_hunt_finds_the_token_and_its_agent_command_is_still_refused() {
    let h = hunt("off");
    let r = &h.report;
    assert!(
        r["token_file"][0]
            .as_str()
            .is_some_and(|t| t.ends_with(&format!("read {} bytes", TOKEN.len()))),
        "{r:#}"
    );
    assert!(
        r["orchestrator"]["authenticated"].as_u64().unwrap() >= 1,
        "{r:#}"
    );
    the_binary_key_was_read_and_set_aside(&h);
    let esc = &r["escalation"];
    assert_eq!(esc["exit"], 2, "{r:#}");
    assert!(
        esc["stderr"]
            .as_str()
            .unwrap()
            .contains("runs no raw agent command"),
        "{r:#}"
    );
    // Only the worker's own token and the spec's secret are known to fvd
    // here: the test read the worker's environment, but printed only the
    // names it found, and the token it authenticated with.
    let known = Redactor::new([("token", TOKEN), SPEC_SECRET]);
    for (sink, bytes) in &h.sinks {
        assert!(!known.finds(bytes), "a secret reached {sink}");
    }
    assert!(
        h.sinks.iter().any(|(s, b)| s == "fvd logs"
            && String::from_utf8_lossy(b).contains("AUTHENTICATED WITH [redacted:fvd-token]")),
        "the token it found was printed, and redacted"
    );
    assert!(!h.marker.exists(), "the evil agent command never ran");
    let _: &Path = h.sb.repo();
}

/// Embedded mode: a test cannot reach the loopback orchestrator's token
/// in `.fvd/run` (hidden in the jail's namespace), nor the porter's own
/// environment beyond the allow-list. Unjailed, the same test reads the
/// run files (it fails on them), and the token it prints is redacted.
#[test]
fn an_embedded_test_sees_no_run_token_and_no_key_of_the_porter() {
    let sb = Sandbox::new();
    sb.port(
        "emb",
        &[TestComponent::new(
            "peek",
            "import glob\nrun = os.path.join(os.getcwd(), '.fvd', 'run')\nseen = {p: open(p).read() for p in glob.glob(run + '/*')}\nassert 'ANTHROPIC_API_KEY' not in os.environ\nassert not seen, seen",
        )],
    );
    let submit = |sandbox: &str| {
        let out = fvd()
            .args([
                "submit", "--family", "emb", "--wait", "--rerun", "--gpus", "none",
            ])
            .args(["--job-sandbox", sandbox, "--repo"])
            .arg(sb.repo())
            .env(WORKER_KEY.0, WORKER_KEY.1)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let (code, text) = submit("namespace");
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = submit("off");
    assert_eq!(
        code,
        Some(1),
        "unjailed, the test reads the run files: {text}"
    );
    assert!(
        text.contains(".token': '[redacted:fvd-token]'"),
        "the token it read is redacted: {text}"
    );
    let status = std::fs::read_to_string(sb.repo().join("tests/local_tests/emb/PORT_STATUS.md"))
        .unwrap_or_default();
    assert!(!status.is_empty() && !text.contains("sk-ant"), "{status}");
}

/// A port submitted where agent commands were allowed, resumed by an
/// orchestrator started without `--allow-agent-commands`: its agent
/// components block, saying why, instead of running the command.
#[test]
fn a_port_resumed_without_the_flag_blocks_its_agents_instead_of_running_them() {
    let mut sb = Sandbox::with_repo_in("repo");
    crate::agent::example_repo(&sb, |t| t);
    let url = sb.serve_with(&["--allow-agent-commands"]);
    // No worker yet: the port is stored, its runs queued.
    let out = fvd()
        .args([
            "submit",
            "--family",
            "tinyport",
            "--orchestrator",
            &url,
            "--repo",
        ])
        .arg(sb.repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    sb.kill_orchestrator();
    let addr = url.trim_start_matches("http://").to_string();
    sb.serve_at(&addr, &[]);
    sb.worker("w1", 2);
    let status = wait_for("the port to end", Duration::from_secs(120), || {
        let s = sb.remote_status("tinyport")?;
        (s["state"] != "running").then_some(s)
    });
    let c = status["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "timestep_embed")
        .unwrap()
        .clone();
    assert_eq!(c["status"], "blocked", "{status:#}");
    assert!(
        c["reason"]
            .as_str()
            .unwrap()
            .contains("runs no raw agent command"),
        "{c:#}"
    );
    let attempts = fvd()
        .args([
            "attempts",
            "tinyport",
            "timestep_embed",
            "--json",
            "--orchestrator",
            &url,
        ])
        .output()
        .unwrap();
    let ledger: Value = serde_json::from_slice(&attempts.stdout).unwrap();
    assert_eq!(ledger["attempts"], serde_json::json!([]), "{ledger}");
}
