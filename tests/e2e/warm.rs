//! The warm runner through the real binary: `[runner] mode = "warm"` runs
//! embedded (`fvd submit`) and on a fleet worker from a zygote that
//! imported a stand-in heavy library once; an edit of the checkout is seen
//! by the next run; a preload module of the repository is refused with its
//! line; zygotes die with their worker.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::port::status_of;
use crate::support::{Sandbox, TestComponent, components, fvd, wait_for};

/// A port `warmy` of two components whose tests import `heavy` (a library
/// outside the repository that logs each import to `imports.log`) and the
/// repository's `repo_mod`, write who forked them to `<name>.who`, and
/// pass while `repo_mod.VALUE == 1`.
fn warm_port(sb: &Sandbox, preload: &str) {
    let lib = sb.dir.path().join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(
        lib.join("heavy.py"),
        format!(
            "import os, time\nwith open({:?}, 'a') as f:\n    f.write('%d\\n' % os.getpid())\ntime.sleep(0.3)\n",
            sb.dir.path().join("imports.log").display().to_string()
        ),
    )
    .unwrap();
    std::fs::write(sb.repo().join("repo_mod.py"), "VALUE = 1\n").unwrap();
    let body = |name: &str| {
        format!(
            "import heavy, repo_mod\nwith open({:?}, 'w') as f:\n    f.write('%d %d' % (os.getppid(), os.getpgid(0) == os.getpid()))\nassert repo_mod.VALUE == 1",
            sb.dir
                .path()
                .join(format!("{name}.who"))
                .display()
                .to_string()
        )
    };
    sb.port(
        "warmy",
        &[
            TestComponent::new("first", &body("first")),
            TestComponent::new("second", &body("second")),
        ],
    );
    let spec_path = sb.repo().join("tests/local_tests/warmy/port.toml");
    let spec = std::fs::read_to_string(&spec_path).unwrap();
    let spec = spec.replace(
        "timeout_s = 60\n",
        &format!(
            "timeout_s = 60\nset_env = {{ PYTHONPATH = {:?}, PYTHONDONTWRITEBYTECODE = \"1\" }}\n",
            lib.display().to_string()
        ),
    );
    std::fs::write(
        &spec_path,
        format!("{spec}\n[runner]\nmode = \"warm\"\npreload = [\"{preload}\"]\n"),
    )
    .unwrap();
}

fn imports(sb: &Sandbox) -> usize {
    std::fs::read_to_string(sb.dir.path().join("imports.log"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// `(parent pid, leads its own group)` a component's test recorded.
fn who(sb: &Sandbox, name: &str) -> (u32, bool) {
    let text = std::fs::read_to_string(sb.dir.path().join(format!("{name}.who"))).unwrap();
    let (ppid, leader) = text.split_once(' ').unwrap();
    (ppid.parse().unwrap(), leader == "1")
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

fn submit(sb: &Sandbox, extra: &[&str]) -> (std::process::Output, u32) {
    let child = fvd()
        .args(["submit", "--family", "warmy", "--wait"])
        .args(extra)
        .arg("--repo")
        .arg(sb.repo())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    (child.wait_with_output().unwrap(), pid)
}

#[test]
fn warm_runs_embedded_fork_from_one_zygote_and_see_the_next_edit() {
    let sb = Sandbox::with_repo_in("repo");
    warm_port(&sb, "heavy");
    let (out, submit_pid) = submit(&sb, &[]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    let (p1, lead1) = who(&sb, "first");
    let (p2, lead2) = who(&sb, "second");
    assert!(lead1 && lead2, "each run leads its own process group");
    assert_ne!(p1, submit_pid, "forked by a zygote, not by fvd: {text}");
    assert_eq!(p1, p2, "one zygote for both components");
    assert_eq!(imports(&sb), 1, "heavy was imported once, by the zygote");

    // An agent's edit, say: the next run sees it (and fails on it).
    std::fs::write(sb.repo().join("repo_mod.py"), "VALUE = 2\n").unwrap();
    let (out, _) = submit(&sb, &["--rerun"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let status = sb.local_status("warmy").unwrap();
    let rows = components(&status);
    for name in ["first", "second"] {
        let row = status_of(&rows, name);
        assert_eq!(row.1, "blocked", "{status}");
    }
    assert!(
        status.to_string().contains("debug_red"),
        "the edit made both red: {status}"
    );
    assert_eq!(
        imports(&sb),
        2,
        "a new fvd process, a new zygote; one import"
    );
}

#[test]
fn a_preload_module_of_the_repository_is_refused_at_submit_with_its_line() {
    let sb = Sandbox::with_repo_in("repo");
    warm_port(&sb, "repo_mod");
    let (out, _) = submit(&sb, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let spec =
        std::fs::read_to_string(sb.repo().join("tests/local_tests/warmy/port.toml")).unwrap();
    let line = spec.lines().position(|l| l.starts_with("preload")).unwrap() + 1;
    assert!(
        err.contains(&format!("port.toml:{line}:")) && err.contains("repo_mod"),
        "{err}"
    );
}

#[test]
fn warm_runs_on_a_fleet_worker_and_its_zygote_dies_with_it() {
    let mut sb = Sandbox::with_repo_in("repo");
    warm_port(&sb, "heavy");
    sb.serve();
    sb.worker("w1", 2);
    let out = sb.submit_remote("warmy", &["--wait"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{}", sb.logs());
    let (zygote, lead) = who(&sb, "first");
    assert!(lead);
    assert_eq!(who(&sb, "second").0, zygote, "one zygote");
    assert_ne!(zygote, sb.worker_pid("w1"));
    assert!(
        cmdline(zygote).contains("fvd_zygote.py"),
        "{}",
        cmdline(zygote)
    );
    assert_eq!(imports(&sb), 1);
    assert!(
        !sb.logs().contains(fvd_worker::zygote::WARNING_PREFIX),
        "{}",
        sb.logs()
    );
    // SIGKILL: the worker cannot end it; the zygote sees its stdin close.
    sb.kill_worker("w1");
    wait_for("the zygote to exit", Duration::from_secs(15), || {
        (!Path::new(&format!("/proc/{zygote}")).exists() || cmdline(zygote).is_empty())
            .then_some(())
    });
}
