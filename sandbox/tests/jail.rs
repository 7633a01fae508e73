//! Every path a job could take to fvd's token, tried by a real job under a
//! stand-in for a worker, jailed and not: the stand-in holds the token in
//! its environment (`--token-env`) and in its memory, and names its token
//! file in its arguments (`--token-file`), as a worker does. The job reads
//! `/proc/PPID/environ`, follows `/proc/PPID/cmdline` to the token file,
//! searches the folder it lies in and the parent's root, reads
//! `/proc/PPID/mem` and a raw block device. Unjailed, each path yields the
//! token (so the test can fail); jailed, none does, with either mechanism,
//! as this user and as an unprivileged one.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use fvd_sandbox::{Jail, Mechanism};

const TOKEN: &str = "fvdtok_Zq8Xw2Lm4Np6Rs0Tv3Yb5Cd7";
const NOBODY: u32 = 65534;

/// The worker stand-in: holds the token like `fvd worker` does, optionally
/// hardened like every fvd process, and runs the job with `PATH` only.
const STANDIN: &str = r#"
import ctypes, os, subprocess, sys
harden, token_file = sys.argv[1], sys.argv[3]
held = open(token_file).read() * 3  # in memory, like the worker's client
if harden == "harden":
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
job = sys.argv[sys.argv.index("--") + 1:]
r = subprocess.run(job, env={"PATH": os.environ["PATH"]}, capture_output=True)
sys.stdout.buffer.write(r.stdout)
sys.stderr.buffer.write(r.stderr)
sys.exit(r.returncode)
"#;

/// The job: tries every path and prints one line per path, `PATH found` or
/// `PATH nothing: why`. The oracle (argv[1]) only tells it what to look
/// for in what it managed to read.
const ATTACK: &str = r#"
import os, re, sys
oracle, search_root = sys.argv[1].encode(), sys.argv[2]
ppid = os.getppid()
def report(path, data=None, err=None):
    if data is not None and oracle in data:
        print(path, "found")
    else:
        print(path, "nothing:", err if err else "read %d bytes" % len(data or b""))
def read(p, n=1 << 20):
    with open(p, "rb") as f:
        return f.read(n)
# 1. the job's own environment
report("env", "\n".join("%s=%s" % kv for kv in os.environ.items()).encode())
# 2. the parent's environment
try: report("environ", read("/proc/%d/environ" % ppid))
except OSError as e: report("environ", err=e)
# 3. the parent's command line, and the token file it names
try:
    argv = read("/proc/%d/cmdline" % ppid).split(b"\0")
    tf = argv[argv.index(b"--token-file") + 1].decode()
    try: report("token_file", read(tf))
    except OSError as e: report("token_file", err=e)
    try: report("proc_root", read("/proc/%d/root%s" % (ppid, tf)))
    except OSError as e: report("proc_root", err=e)
except (OSError, ValueError) as e:
    report("token_file", err=e); report("proc_root", err=e)
# 4. searching the file system around it
found, errors = b"", []
for d, _, files in os.walk(search_root):
    for f in files:
        try: found += read(os.path.join(d, f))
        except OSError as e: errors.append(str(e))
report("search", found, None if found else "; ".join(errors[:1]))
# 5. the parent's memory
try:
    mem, got = open("/proc/%d/mem" % ppid, "rb"), b""
    for line in read("/proc/%d/maps" % ppid).decode().splitlines():
        a, b = [int(x, 16) for x in line.split()[0].split("-")]
        if "rw" in line.split()[1] and b - a < (64 << 20):
            try:
                mem.seek(a); got += mem.read(b - a)
            except OSError: pass
    report("mem", got)
except OSError as e: report("mem", err=e)
# 6. a raw block device (root reads its disk by file permissions alone)
devs = sorted(os.path.join("/dev", d) for d in os.listdir("/dev")
              if re.match(r"^(sd[a-z]|vd[a-z]|nvme\d+n\d+|xvd[a-z])$", d))
if devs:
    try: data = read(devs[0], 4096); print("disk", "readable" if data else "nothing: empty")
    except OSError as e: print("disk", "nothing:", e)
else:
    print("disk", "nothing: no block device")
"#;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Who {
    Me,
    Nobody,
}

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new(who: Who) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("secrets")).unwrap();
        std::fs::create_dir_all(root.join("work")).unwrap();
        std::fs::write(root.join("secrets/token"), TOKEN).unwrap();
        std::fs::write(root.join("secrets/readme"), "not a secret").unwrap();
        std::fs::write(root.join("standin.py"), STANDIN).unwrap();
        std::fs::write(root.join("attack.py"), ATTACK).unwrap();
        std::fs::set_permissions(
            root.join("secrets/token"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        if who == Who::Nobody {
            for p in ["", "secrets", "work", "standin.py", "attack.py"] {
                let p = root.join(p);
                let mode = if p.is_dir() { 0o755 } else { 0o644 };
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            }
            for p in ["secrets/token", "secrets/readme", "work"] {
                std::os::unix::fs::chown(root.join(p), Some(NOBODY), Some(NOBODY)).unwrap();
            }
        }
        Setup { dir }
    }

    fn token_file(&self) -> PathBuf {
        self.dir.path().join("secrets/token")
    }

    /// Runs the attack as `who` under the stand-in; `jail` None: neither
    /// hardened nor jailed.
    fn hunt(&self, who: Who, jail: Option<Mechanism>) -> Vec<(String, String)> {
        let root = self.dir.path();
        let mut job: Vec<String> = Vec::new();
        if let Some(m) = jail {
            let j = Jail::unprobed(launcher(), m, vec![self.token_file()]);
            let c = j.command(&["python3".into()]);
            job.push(c.get_program().to_string_lossy().into_owned());
            job.extend(c.get_args().map(|a| a.to_string_lossy().into_owned()));
        } else {
            job.push("python3".into());
        }
        job.push(root.join("attack.py").display().to_string());
        job.push(TOKEN.into());
        job.push(root.display().to_string());
        let mut cmd = Command::new("python3");
        cmd.arg(root.join("standin.py"))
            .arg(if jail.is_some() { "harden" } else { "plain" })
            .arg("--token-file")
            .arg(self.token_file())
            .arg("--")
            .args(&job)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .env("FVD_TOKEN", TOKEN)
            .current_dir(root.join("work"));
        if who == Who::Nobody && nix::unistd::geteuid().is_root() {
            cmd.uid(NOBODY).gid(NOBODY);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{who:?} {jail:?}: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

fn launcher() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_fvd-jail"))
}

/// `python3 -c SCRIPT ARGS…` in `jail` (in `cwd`, with `PATH` only): its
/// stdout, once it exited 0 (else the test fails, saying `what`).
fn python_in(jail: &Jail, script: &str, args: &[String], cwd: Option<&Path>, what: &str) -> String {
    let mut argv = vec!["python3".to_string(), "-c".to_string(), script.to_string()];
    argv.extend(args.iter().cloned());
    let mut cmd = jail.command(&argv);
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    let out = cmd
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn found(results: &[(String, String)], path: &str) -> bool {
    let (_, v) = results
        .iter()
        .find(|(k, _)| k == path)
        .unwrap_or_else(|| panic!("no result for {path}: {results:?}"));
    v == "found" || v == "readable"
}

const PATHS: &[&str] = &["environ", "token_file", "proc_root", "search", "mem"];

fn hunt_both_ways(who: Who, mechanism: Mechanism) {
    let s = Setup::new(who);
    // Unjailed, every path reaches the token: the attack works.
    let open = s.hunt(who, None);
    for p in PATHS {
        assert!(
            found(&open, p),
            "{who:?}, unjailed: {p} should find the token: {open:?}"
        );
    }
    assert!(
        !found(&open, "env"),
        "the stand-in passes PATH only: {open:?}"
    );
    // (Whether root reads a raw disk unjailed depends on the host: a VM's
    // device cgroup may refuse it. Jailed, it never does.)
    // Jailed, none does.
    let jailed = s.hunt(who, Some(mechanism));
    for p in PATHS.iter().chain(&["env", "disk"]) {
        assert!(
            !found(&jailed, p),
            "{who:?}, {mechanism}: {p} reached the token: {jailed:?}"
        );
    }
}

#[test]
fn namespace_jail_keeps_every_path_to_the_token_closed() {
    hunt_both_ways(Who::Me, Mechanism::Namespace);
}

#[test]
fn landlock_jail_keeps_every_path_to_the_token_closed() {
    hunt_both_ways(Who::Me, Mechanism::Landlock);
}

#[test]
fn namespace_jail_of_an_unprivileged_worker_keeps_every_path_closed() {
    hunt_both_ways(Who::Nobody, Mechanism::Namespace);
}

#[test]
fn landlock_jail_of_an_unprivileged_worker_keeps_every_path_closed() {
    hunt_both_ways(Who::Nobody, Mechanism::Landlock);
}

/// Hardening alone does not stop a job of a root worker: with all of
/// root's capabilities it reads the parent's environment anyway. Hence
/// the jail drops them.
#[test]
fn a_root_job_with_its_capabilities_reads_a_hardened_parent() {
    if !nix::unistd::geteuid().is_root() {
        // Only root has the capabilities this is about; as a user the
        // hardened parent is out of reach already (the jailed tests above).
        let s = Setup::new(Who::Me);
        let r = s.hunt(Who::Me, Some(Mechanism::Landlock));
        assert!(!found(&r, "environ"), "{r:?}");
        return;
    }
    let s = Setup::new(Who::Me);
    let root = s.dir.path();
    let out = Command::new("python3")
        .arg(root.join("standin.py"))
        .args(["harden", "--token-file"])
        .arg(s.token_file())
        .arg("--")
        .args([
            "python3",
            &root.join("attack.py").display().to_string(),
            TOKEN,
        ])
        .arg(root)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("FVD_TOKEN", TOKEN)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("environ found"), "{text}");
}

/// What stays readable in a jail: the files beside the token, and files
/// the job writes in a folder of its own.
#[test]
fn a_jailed_job_reads_everything_but_the_hidden_paths() {
    for m in [Mechanism::Namespace, Mechanism::Landlock] {
        let s = Setup::new(Who::Me);
        let j = Jail::unprobed(launcher(), m, vec![s.token_file()]);
        let script = format!(
            "import os\nprint(open({readme:?}).read())\nopen('new.txt', 'w').write('mine')\nprint(open('new.txt').read())\ntry:\n    open({token:?}).read() and print('LEAK')\nexcept OSError as e:\n    print('hidden', e.errno)\n",
            readme = s.dir.path().join("secrets/readme"),
            token = s.token_file(),
        );
        let work = s.dir.path().join("work");
        let text = python_in(&j, &script, &[], Some(&work), &m.to_string());
        assert!(
            text.contains("not a secret") && text.contains("mine"),
            "{m}: {text}"
        );
        assert!(
            !text.contains("LEAK") && !text.contains(TOKEN),
            "{m}: {text}"
        );
    }
}

/// Landlock's documented limit: a file created after the job started,
/// directly in a folder on the way to a hidden path, is unreadable to
/// that job; a namespace has no such limit.
#[test]
fn landlock_cannot_read_a_new_file_beside_the_token_and_a_namespace_can() {
    for (m, readable) in [(Mechanism::Landlock, false), (Mechanism::Namespace, true)] {
        let s = Setup::new(Who::Me);
        let j = Jail::unprobed(launcher(), m, vec![s.token_file()]);
        let new = s.dir.path().join("secrets/new.txt");
        let script = format!(
            "open({new:?}, 'w').write('x')\ntry:\n    print(open({new:?}).read() == 'x')\nexcept OSError:\n    print(False)\n"
        );
        let out = j
            .command(&["python3".into(), "-c".into(), script])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.trim(),
            if readable { "True" } else { "False" },
            "{m}: {text}"
        );
    }
}

#[test]
fn this_host_allows_a_jail_and_start_reports_which() {
    let s = Setup::new(Who::Me);
    let j = Jail::start(fvd_sandbox::Mode::Auto, launcher(), &[s.token_file()]).unwrap();
    assert!(j.mechanism().is_some(), "{}", j.describe());
    assert_eq!(j.hidden(), [s.token_file().canonicalize().unwrap()]);
    let j = Jail::start(fvd_sandbox::Mode::Landlock, launcher(), &[s.token_file()]).unwrap();
    assert_eq!(j.mechanism(), Some(Mechanism::Landlock));
}

#[test]
fn a_jail_that_cannot_be_set_up_never_runs_the_program() {
    let out = Command::new(launcher())
        .args(["__jail", "run", "{not json", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(fvd_sandbox::launch::SETUP_FAILED));
    assert!(String::from_utf8_lossy(&out.stderr).contains("fvd: jail: unreadable plan"));
    let j = Jail::unprobed(launcher(), Mechanism::Landlock, vec![]);
    let out = j
        .command(&["no-such-program-fvd".into()])
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(fvd_sandbox::launch::EXEC_FAILED));
}

/// A read-only path (issue #38: the git folders around a job's checkout)
/// reads as before and takes no write: no new file in it, no change to a
/// file in it, no removal or rename, and a read-only file cannot be
/// replaced (with a namespace; Landlock protects folders only). Beside it
/// the job writes as before. Both mechanisms, as this user and (as root)
/// as an unprivileged one, who owns the files.
#[test]
fn a_read_only_path_reads_and_takes_no_write() {
    for who in [Who::Me, Who::Nobody] {
        if who == Who::Nobody && !nix::unistd::geteuid().is_root() {
            continue;
        }
        for m in [Mechanism::Namespace, Mechanism::Landlock] {
            let s = Setup::new(who);
            // Outside /tmp: Landlock leaves nothing below a folder where
            // jobs create files read-only (`launch::landlock_read_only`).
            let outside = tempfile::Builder::new()
                .prefix("fvd-jail-test")
                .tempdir_in("/run")
                .or_else(|_| tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")))
                .unwrap();
            std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o755))
                .unwrap();
            let work = outside.path().join("work");
            std::fs::create_dir_all(&work).unwrap();
            if who == Who::Nobody {
                std::os::unix::fs::chown(&work, Some(NOBODY), Some(NOBODY)).unwrap();
            }
            let git = work.join("repo.git");
            std::fs::create_dir_all(git.join("hooks")).unwrap();
            std::fs::write(git.join("config"), "[core]\n").unwrap();
            std::fs::write(work.join(".git"), "gitdir: repo.git\n").unwrap();
            std::fs::create_dir_all(work.join("sub")).unwrap();
            if who == Who::Nobody {
                for p in [
                    git.clone(),
                    git.join("hooks"),
                    git.join("config"),
                    work.join(".git"),
                    work.join("sub"),
                ] {
                    std::os::unix::fs::chown(&p, Some(NOBODY), Some(NOBODY)).unwrap();
                }
            }
            let j = Jail::unprobed(launcher(), m, vec![s.token_file()])
                .read_only(&[git.clone(), work.join(".git")]);
            assert_eq!(j.read_only_paths().len(), 2, "{}", j.describe());
            let script = r##"
import os
def attempt(name, f):
    try:
        f()
        print(name, "WROTE")
    except OSError as e:
        print(name, "refused")
print("config", open("repo.git/config").read().strip())
attempt("hook", lambda: open("repo.git/hooks/post-checkout", "w").write("#!/bin/sh\n"))
attempt("append", lambda: open("repo.git/config", "a").write("[core]\nfsmonitor = x\n"))
attempt("mkdir", lambda: os.mkdir("repo.git/new"))
attempt("rename", lambda: os.rename("repo.git/hooks", "repo.git/hooks2"))
attempt("unlink", lambda: os.unlink("repo.git/config"))
attempt("gitfile", lambda: open(".git", "w").write("gitdir: /elsewhere\n"))
attempt("replace", lambda: (open("fake", "w").write("x"), os.rename("fake", ".git")))
open("sub/beside.txt", "w").write("ok")
print("beside", open("sub/beside.txt").read())
"##;
            let mut cmd = j.command(&["python3".into(), "-c".into(), script.into()]);
            cmd.current_dir(&work)
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap());
            if who == Who::Nobody {
                cmd.uid(NOBODY).gid(NOBODY);
            }
            let out = cmd.output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{who:?} {m}: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(text.contains("config [core]"), "{who:?} {m}: {text}");
            let refused: &[&str] = match m {
                Mechanism::Namespace => &[
                    "hook", "append", "mkdir", "rename", "unlink", "gitfile", "replace",
                ],
                Mechanism::Landlock => &["hook", "append", "mkdir", "rename", "unlink"],
            };
            for a in refused {
                assert!(
                    text.contains(&format!("{a} refused")),
                    "{who:?} {m}: {a} was not refused: {text}"
                );
            }
            assert!(text.contains("beside ok"), "{who:?} {m}: {text}");
            assert!(!git.join("hooks/post-checkout").exists());
            assert_eq!(
                std::fs::read_to_string(git.join("config")).unwrap(),
                "[core]\n"
            );
            if m == Mechanism::Namespace {
                assert_eq!(
                    std::fs::read_to_string(work.join(".git")).unwrap(),
                    "gitdir: repo.git\n"
                );
            }
        }
    }
}

/// Two jobs of one uid (a test and an agent of one worker): the agent holds
/// its tokens in its environment; the test, started beside it, reads the
/// agent's `/proc/PID/environ`, `mem` and `fd` and signals it. Unjailed
/// every read yields the token; in either jail none does (issue #38).
#[test]
fn a_jailed_job_cannot_reach_a_sibling_job_s_process() {
    const HOLDER: &str = r#"
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(30)
"#;
    const PROBE: &str = r#"
import os, sys, time
pid_file, token = sys.argv[1], sys.argv[2].encode()
deadline = time.time() + 20
while not (os.path.exists(pid_file) and open(pid_file).read()):
    if time.time() > deadline: sys.exit("the holder never started")
    time.sleep(0.02)
pid = int(open(pid_file).read())
def line(what, f):
    try:
        data = f()
        print(what, "found" if token in data else "nothing: read %d bytes" % len(data))
    except OSError as e:
        print(what, "nothing:", e)
line("environ", lambda: open("/proc/%d/environ" % pid, "rb").read())
line("cmdline", lambda: open("/proc/%d/cmdline" % pid, "rb").read())
def fds():
    out = b""
    for fd in os.listdir("/proc/%d/fd" % pid):
        out += os.readlink("/proc/%d/fd/%s" % (pid, fd)).encode()
    return out + token  # the list itself is the leak
line("fd", fds)
def mem():
    got, m = b"", open("/proc/%d/mem" % pid, "rb")
    for l in open("/proc/%d/maps" % pid).read().splitlines():
        a, b = [int(x, 16) for x in l.split()[0].split("-")]
        if "rw" in l.split()[1] and b - a < (64 << 20):
            try:
                m.seek(a); got += m.read(b - a)
            except OSError: pass
    return got
line("mem", mem)
"#;
    let dir = tempfile::tempdir().unwrap();
    let run = |jail: &Jail, tag: &str| -> String {
        let pid_file = dir.path().join(format!("pid-{tag}"));
        let mut holder = jail
            .command(&[
                "python3".into(),
                "-c".into(),
                HOLDER.into(),
                pid_file.display().to_string(),
            ])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .env("FVD_TOOLS_TOKEN", TOKEN)
            .spawn()
            .unwrap();
        let text = python_in(
            jail,
            PROBE,
            &[pid_file.display().to_string(), TOKEN.into()],
            None,
            tag,
        );
        let _ = holder.kill();
        let _ = holder.wait();
        text
    };
    let open = run(&Jail::off(), "off");
    for what in ["environ", "fd", "mem"] {
        assert!(
            open.contains(&format!("{what} found")),
            "unjailed, {what} should reach the sibling: {open}"
        );
    }
    for m in [Mechanism::Namespace, Mechanism::Landlock] {
        let got = run(&Jail::unprobed(launcher(), m, Vec::new()), &m.to_string());
        for what in ["environ", "fd", "mem"] {
            assert!(
                got.contains(&format!("{what} nothing")),
                "{m}: {what} reached the sibling: {got}"
            );
        }
        // The command line stays readable: fvd puts no secret in one.
        assert!(got.contains("cmdline nothing: read"), "{m}: {got}");
    }
}

/// A read-only folder with a writable one inside it (issue #39: an agent
/// writes its worktree, nothing else of the repository): a write lands in
/// the writable folder, is refused beside it, and a read-only file inside
/// the writable folder (its `.git`) stays read-only. Both mechanisms.
#[test]
fn a_writable_folder_inside_a_read_only_one() {
    for m in [Mechanism::Namespace, Mechanism::Landlock] {
        // Not below /tmp: Landlock leaves no read-only folder there
        // (`launch::landlock_read_only`), and a checkout may lie there.
        let d = tempfile::Builder::new()
            .prefix("fvd-jail-test")
            .tempdir_in("/run")
            .or_else(|_| tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")))
            .unwrap();
        let repo = d.path().join("repo");
        let wt = repo.join(".fvd/worktrees/c");
        std::fs::create_dir_all(&wt).unwrap();
        std::fs::write(repo.join("main.py"), "x").unwrap();
        std::fs::write(wt.join(".git"), "gitdir: x\n").unwrap();
        let j = Jail::unprobed(launcher(), m, Vec::new())
            .read_only(&[repo.clone(), wt.join(".git")])
            .writable(std::slice::from_ref(&wt));
        let script = format!(
            "import os\nfor p in [{a:?}, {b:?}, {c:?}, {d:?}]:\n    try:\n        open(p, 'a').write('y')\n        print('wrote', p)\n    except OSError as e:\n        print('refused', p, e.errno)\n",
            a = wt.join("fix.py"),
            b = repo.join("main.py"),
            c = repo.join(".fvd/state.db"),
            d = wt.join(".git"),
        );
        let text = python_in(&j, &script, &[], None, &m.to_string());
        assert!(
            text.contains(&format!("wrote {}", wt.join("fix.py").display())),
            "{m}: {text}"
        );
        for p in [repo.join("main.py"), repo.join(".fvd/state.db")] {
            assert!(
                text.contains(&format!("refused {}", p.display())),
                "{m}: {text}"
            );
        }
        if m == Mechanism::Namespace {
            // Landlock leaves files writable (folders only).
            assert!(
                text.contains(&format!("refused {}", wt.join(".git").display())),
                "{m}: {text}"
            );
        }
    }
}

/// A Landlock domain refuses to move a file to another folder unless its
/// rule set allows it (the one right every rule set denies by default): a
/// job's own domain must not, or `os.rename` between folders, `pip` and
/// every tool that moves a finished file into place fail with EXDEV.
#[test]
fn a_jailed_job_moves_files_between_folders() {
    for m in [Mechanism::Namespace, Mechanism::Landlock] {
        let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("x"), "x").unwrap();
        let j = Jail::unprobed(launcher(), m, Vec::new());
        let script = "import os, sys\nos.rename(sys.argv[1], sys.argv[2])\nprint('moved')\n";
        let text = python_in(
            &j,
            script,
            &[
                a.join("x").display().to_string(),
                b.join("x").display().to_string(),
            ],
            None,
            &format!("{m}: a move between folders"),
        );
        assert_eq!(text.trim(), "moved", "{m}");
        assert!(b.join("x").is_file(), "{m}");
    }
}
