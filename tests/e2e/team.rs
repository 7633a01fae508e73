//! One orchestrator for a team (issue #30), on a real fleet: `fvd
//! orchestrator serve --auth FILE` with credentials made by `fvd auth add`
//! and a worker that dials with a `worker` credential.
//!
//! - A second checkout of a family is refused naming both locations; the
//!   first port's repository, status file and verdicts do not change, and
//!   after its owner resets it the second checkout's port is its own.
//! - A worker's token is refused submit, answer and cancel; a viewer's
//!   answer and cancel; a porter's another porter's port; each with exit 6
//!   and a line naming the credential and role, never the token.
//! - An answer records who gave it: status, the action log, PORT_STATUS.md.
//! - A token removed from the file is refused once the server gets SIGHUP;
//!   a file that does not parse keeps the previous set; a revoked worker
//!   loses its stream and exits.
//! - Exit codes scripts use: 5 for an orchestrator that does not answer,
//!   `fvd status --exit-status` non-zero while a port waits or is blocked.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::agent::{example_repo, git};
use crate::support::{Auth, Sandbox, TestComponent, components, fvd, wait_for, write_port};

/// Runs `cmd`: its exit code, and its stdout and stderr, labelled.
fn run(cmd: &mut Command) -> (Option<i32>, String) {
    let out = cmd.output().expect("run fvd");
    (
        out.status.code(),
        format!(
            "stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `fvd ARGS --orchestrator URL --token-file TOKEN-OF-WHO`.
fn as_who(sb: &Sandbox, who: &str, args: &[&str]) -> (Option<i32>, String) {
    let url = sb.url.clone().expect("serve() first");
    run(fvd()
        .args(args)
        .args(["--orchestrator", &url])
        .args(sb.token_args(who)))
}

/// The example port with only its `time_shift` component, whose agent
/// asks E001 and passes once it is answered.
fn only_time_shift(spec: String) -> String {
    let (head, rest) = spec
        .split_once("\n[[component]]")
        .expect("components in port.toml");
    let (comps, agent) = rest.split_once("\n[agent]").expect("[agent] in port.toml");
    let kept = comps
        .split("\n[[component]]")
        .find(|b| b.contains("name = \"time_shift\""))
        .expect("time_shift's block");
    format!("{head}\n[[component]]{kept}\n[agent]{agent}")
}

/// Refused with exit 6, the line naming `names` and no token of `auth`.
fn refused(got: (Option<i32>, String), auth: &Auth, names: &str) {
    let (code, out) = got;
    assert_eq!(code, Some(6), "{out}");
    assert!(out.contains(names), "expected {names:?} in:\n{out}");
    for t in auth.tokens() {
        assert!(!out.contains(&t), "a token was printed:\n{out}");
    }
}

fn status_json(sb: &Sandbox, family: &str) -> serde_json::Value {
    let (code, out) = as_who(sb, "viewer", &["status", family, "--json"]);
    assert_eq!(code, Some(0), "{out}");
    let json = out
        .split_once("stdout:\n")
        .and_then(|(_, r)| r.split_once("\nstderr:"))
        .map(|(j, _)| j.to_string())
        .unwrap();
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"))
}

#[test]
fn roles_are_enforced_per_call_and_an_answer_records_who_gave_it() {
    let mut sb = Sandbox::new().with_auth();
    let auth = sb.auth.clone().unwrap();
    auth.add("other", "porter");
    example_repo(&sb, only_time_shift);
    // The example's agent is a raw command: this host allows them.
    sb.serve_with(&["--allow-agent-commands"]);
    sb.worker("w1", 2);
    let repo = sb.repo().display().to_string();
    let submit = ["submit", "--family", "tinyport", "--repo", &repo];

    // A worker's credential connects, nothing else.
    refused(
        as_who(&sb, "fleet", &submit),
        &auth,
        "credential fleet (worker) may not use the port service",
    );
    refused(
        as_who(&sb, "viewer", &submit),
        &auth,
        "credential viewer (viewer) may not submit: that needs a porter or admin credential",
    );
    // Without a token at all.
    let (code, out) = run(fvd()
        .args(submit)
        .args(["--orchestrator", sb.url.as_deref().unwrap()]));
    assert_eq!(code, Some(6), "{out}");
    assert!(out.contains("no token"), "{out}");

    // The porter submits; the port pauses on E001 (exit 3).
    let mut wait = submit.to_vec();
    wait.push("--wait");
    let (code, out) = as_who(&sb, "porter", &wait);
    assert_eq!(code, Some(3), "{out}\n{}", sb.logs());
    let (code, out) = as_who(&sb, "viewer", &["status", "tinyport", "--exit-status"]);
    assert_eq!(code, Some(3), "paused on a question: {out}");

    let answer = ["answer", "tinyport", "E001", "--option", "1"];
    refused(
        as_who(&sb, "fleet", &answer),
        &auth,
        "credential fleet (worker) may not use the port service",
    );
    refused(
        as_who(&sb, "fleet", &["cancel", "tinyport"]),
        &auth,
        "credential fleet (worker) may not use the port service",
    );
    refused(
        as_who(&sb, "viewer", &answer),
        &auth,
        "credential viewer (viewer) may not answer: that needs a porter or admin credential",
    );
    refused(
        as_who(&sb, "viewer", &["cancel", "tinyport"]),
        &auth,
        "credential viewer (viewer) may not cancel",
    );
    refused(
        as_who(&sb, "other", &answer),
        &auth,
        "other (porter) may not answer port tinyport: it is porter's; only porter or an admin may",
    );
    refused(
        as_who(&sb, "other", &["cancel", "tinyport"]),
        &auth,
        "other (porter) may not cancel port tinyport",
    );
    let status = status_json(&sb, "tinyport");
    assert_eq!(status["state"], "ask_user", "nothing changed: {status}");
    assert_eq!(status["escapes"][0]["status"], "open", "{status}");
    // Nor may another porter open a new port in porter's checkout (its
    // branches, worktrees, status file, and its tests run there), issue #38.
    write_port(sb.repo(), "intruder", &[TestComponent::new("x", "pass")]);
    refused(
        as_who(
            &sb,
            "other",
            &["submit", "--family", "intruder", "--repo", &repo],
        ),
        &auth,
        &format!(
            "other (porter) may not open port intruder: its checkout {repo} holds port tinyport (porter's); only porter or an admin may open a port there"
        ),
    );
    let (code, out) = as_who(&sb, "viewer", &["status", "intruder", "--json"]);
    assert_ne!(code, Some(0), "no port was opened: {out}");
    assert!(
        !sb.repo()
            .join("tests/local_tests/intruder/PORT_STATUS.md")
            .exists()
    );

    // Its owner answers; the port resumes and passes.
    let mut answer_wait = answer.to_vec();
    answer_wait.push("--wait");
    let (code, out) = as_who(&sb, "porter", &answer_wait);
    assert_eq!(code, Some(0), "{out}\n{}", sb.logs());
    let status = status_json(&sb, "tinyport");
    assert_eq!(status["escapes"][0]["answered_by"], "porter", "{status}");
    assert_eq!(status["owner"], "porter", "{status}");
    let actions: Vec<(String, String, String)> = status["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["action"].as_str().unwrap().to_string(),
                a["actor"].as_str().unwrap().to_string(),
                a["detail"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(actions.len(), 2, "{actions:?}");
    assert_eq!(
        (actions[0].0.as_str(), actions[0].1.as_str()),
        ("submit", "porter")
    );
    assert_eq!(
        actions[1],
        ("answer".into(), "porter".into(), "E001".into()),
        "{actions:?}"
    );
    let (code, out) = as_who(&sb, "viewer", &["status", "tinyport", "--exit-status"]);
    assert_eq!(code, Some(0), "every component passed: {out}");
    assert!(out.contains("E001 time_shift answered by porter"), "{out}");

    // PORT_STATUS.md says who answered, and whose submit ran.
    let ps = std::fs::read_to_string(sb.repo().join("tests/local_tests/tinyport/PORT_STATUS.md"))
        .unwrap();
    let row = ps.lines().find(|l| l.starts_with("| E001 |")).unwrap();
    assert!(row.contains("answered by porter: option 1"), "{row}");
    assert!(ps.contains(" for porter: non_skip_pass"), "{ps}");
    for t in auth.tokens() {
        assert!(
            !ps.contains(&t) && !sb.logs().contains(&t),
            "a token leaked"
        );
    }
}

#[test]
fn a_revoked_token_is_refused_after_sighup_and_a_broken_file_keeps_the_old_set() {
    let mut sb = Sandbox::new().with_auth();
    let auth = sb.auth.clone().unwrap();
    sb.port("revoke", &[TestComponent::new("one", "assert True")]);
    sb.serve();
    sb.worker("w1", 1);
    let hup = |sb: &Sandbox| {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(sb.orchestrator_pid() as i32),
            nix::sys::signal::Signal::SIGHUP,
        )
        .unwrap();
    };
    let (code, out) = as_who(&sb, "viewer", &["status"]);
    assert_eq!(code, Some(0), "{out}");

    // A file that does not parse: the previous set holds.
    let good = std::fs::read_to_string(&auth.file).unwrap();
    std::fs::write(&auth.file, "[[token]\n").unwrap();
    hup(&sb);
    wait_for(
        "the failed reload to be logged",
        Duration::from_secs(20),
        || {
            sb.logs()
                .contains("kept the previous credentials")
                .then_some(())
        },
    );
    assert_eq!(as_who(&sb, "viewer", &["status"]).0, Some(0));
    std::fs::write(&auth.file, good).unwrap();

    // Revoked: refused from the reload on.
    for name in ["viewer", "fleet"] {
        let out = fvd()
            .args(["auth", "remove", name, "--file"])
            .arg(&auth.file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    hup(&sb);
    let out = wait_for("the viewer to be refused", Duration::from_secs(20), || {
        let (code, out) = as_who(&sb, "viewer", &["status"]);
        (code == Some(6)).then_some(out)
    });
    assert!(
        out.contains("token not known to this orchestrator (wrong, or revoked)"),
        "{out}"
    );
    // The revoked worker's stream is closed and it is refused when it
    // dials again: it exits instead of taking jobs.
    let exit = sb.wait_worker_exit("w1", Duration::from_secs(30));
    assert_eq!(exit.code(), Some(6), "refused: {exit:?}\n{}", sb.logs());
    assert!(
        sb.logs().contains("the worker's credential was revoked"),
        "{}",
        sb.logs()
    );
    // The others hold.
    let (code, out) = as_who(&sb, "porter", &["status"]);
    assert_eq!(code, Some(0), "{out}");
}

/// Issue #38: `fvd auth add --out` writes the token to a new file only its
/// owner reads (one that exists is refused, and nothing is added); without
/// it the token is alone on stdout, as before. `fvd orchestrator serve` and
/// `fvd worker` name, in one line, a token file its group or others can read.
#[test]
fn auth_add_out_writes_a_private_token_file_and_the_servers_warn_about_a_readable_one() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let mut sb = Sandbox::new().with_auth();
    let auth = sb.auth.clone().unwrap();
    // The sandbox's credentials were made with --out.
    for name in ["fleet", "porter", "viewer", "root"] {
        let p = auth.token(name);
        assert_eq!(mode(&p), 0o600, "{}", p.display());
        let t = std::fs::read_to_string(&p).unwrap();
        assert!(
            t.starts_with("fvd_") && t.ends_with('\n') && t.trim().len() == 68,
            "{t:?}"
        );
    }
    let add = |name: &str, out: Option<&Path>| {
        let mut cmd = fvd();
        cmd.args(["auth", "add", name, "--role", "viewer", "--file"])
            .arg(&auth.file);
        if let Some(out) = out {
            cmd.arg("--out").arg(out);
        }
        cmd.output().unwrap()
    };
    let taken = auth.token("porter");
    let before = std::fs::read_to_string(&taken).unwrap();
    let out = add("second", Some(&taken));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("cannot create the token file {}", taken.display())),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&taken).unwrap(), before, "kept");
    let list = fvd()
        .args(["auth", "list", "--file"])
        .arg(&auth.file)
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(!list.contains("second"), "nothing added: {list}");
    let out = add("third", None);
    let printed = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success() && printed.starts_with("fvd_") && printed.trim().len() == 68,
        "{printed:?}"
    );

    // The orchestrator's token file readable by its group, the worker's
    // by everyone.
    let admin = auth.token("single-admin");
    std::fs::write(&admin, "adminTok-e2e-5Hq8Zr2Lw7Nc\n").unwrap();
    std::fs::set_permissions(&admin, std::fs::Permissions::from_mode(0o640)).unwrap();
    let fleet = auth.token("fleet");
    std::fs::set_permissions(&fleet, std::fs::Permissions::from_mode(0o644)).unwrap();
    sb.serve_with(&["--token-file", &admin.display().to_string()]);
    let line = |log: &str, path: &Path| {
        log.lines()
            .filter(|l| {
                l.starts_with(&format!(
                    "fvd: warning: the token file {} is readable by",
                    path.display()
                ))
            })
            .count()
    };
    let log = sb.orchestrator_log();
    assert_eq!(line(&log, &admin), 1, "{log}");
    assert!(log.contains("readable by its group (mode 0640)"), "{log}");
    sb.worker("w1", 1);
    let log = wait_for("the worker's warning", Duration::from_secs(30), || {
        let log = sb.worker_log("w1");
        (line(&log, &fleet) == 1).then_some(log)
    });
    assert!(
        log.contains("readable by its group and others (mode 0644)"),
        "{log}"
    );
}

#[test]
fn two_checkouts_of_one_family_keep_their_repository_status_file_and_verdicts() {
    let mut sb = Sandbox::with_repo_in("a");
    sb.auth = Some(Auth::new());
    let auth = sb.auth.clone().unwrap();
    auth.add("bob", "porter");
    write_port(
        sb.repo(),
        "shared",
        &[TestComponent::new("one", "assert True")],
    );
    git(sb.repo(), &["init", "-q", "-b", "main"]);
    git(sb.repo(), &["add", "-A"]);
    git(sb.repo(), &["commit", "-q", "-m", "a"]);
    // B: another repository, same family, other code.
    let b = sb.dir.path().join("b");
    std::fs::create_dir_all(&b).unwrap();
    write_port(
        &b,
        "shared",
        &[TestComponent::new(
            "one",
            "assert False, 'the code of checkout b'",
        )],
    );
    git(&b, &["init", "-q", "-b", "main"]);
    git(&b, &["add", "-A"]);
    git(&b, &["commit", "-q", "-m", "b"]);
    sb.serve();
    sb.worker("w1", 1);

    let a_path = sb.repo().canonicalize().unwrap().display().to_string();
    let b_path = b.canonicalize().unwrap().display().to_string();
    let submit = |who: &str, repo: &str| {
        as_who(
            &sb,
            who,
            &["submit", "--family", "shared", "--wait", "--repo", repo],
        )
    };
    let (code, out) = submit("porter", &a_path);
    assert_eq!(code, Some(0), "{out}\n{}", sb.logs());
    let status_file = |root: &Path| root.join("tests/local_tests/shared/PORT_STATUS.md");
    let a_file = std::fs::read(status_file(sb.repo())).expect("A's status file");

    // B is refused, whoever submits it, naming both locations.
    for who in ["bob", "porter", "root"] {
        let (code, out) = submit(who, &b_path);
        assert_eq!(code, Some(2), "{who}: {out}");
        assert!(
            out.contains(&format!("port shared belongs to {a_path}"))
                && out.contains(&format!("this submit comes from {b_path}"))
                && out.contains("another checkout")
                && out.contains("its owner: porter"),
            "{who}: {out}"
        );
    }
    let status = status_json(&sb, "shared");
    assert_eq!(status["repo"], a_path.as_str(), "{status}");
    assert!(
        status["repo_identity"]
            .as_str()
            .is_some_and(|i| i.starts_with("root:") && i.ends_with(&a_path)),
        "{status}"
    );
    let rows = components(&status);
    assert_eq!(
        (rows[0].1.as_str(), rows[0].2),
        ("non_skip_pass", 1),
        "A's verdict stands: {status}"
    );
    assert_eq!(std::fs::read(status_file(sb.repo())).unwrap(), a_file);
    assert!(!status_file(&b).exists(), "nothing was written into B");

    // Only its owner (or an admin) may reset it; then B's port is B's.
    refused(
        as_who(&sb, "bob", &["reset", "shared"]),
        &auth,
        "bob (porter) may not reset port shared: it is porter's",
    );
    let (code, out) = as_who(&sb, "porter", &["reset", "shared"]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = submit("bob", &b_path);
    assert_eq!(code, Some(1), "B's code is red: {out}\n{}", sb.logs());
    let status = status_json(&sb, "shared");
    assert_eq!(status["repo"], b_path.as_str(), "{status}");
    assert_eq!(status["owner"], "bob", "{status}");
    let actions: Vec<(String, String)> = status["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["action"].as_str().unwrap().to_string(),
                a["actor"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("submit".to_string(), "porter".to_string()),
            ("reset".to_string(), "porter".to_string()),
            ("submit".to_string(), "bob".to_string()),
        ],
        "the log outlives the reset: {status}"
    );
    // A's file never changed; B's has B's verdict.
    assert_eq!(std::fs::read(status_file(sb.repo())).unwrap(), a_file);
    let b_file = std::fs::read_to_string(status_file(&b)).unwrap();
    assert!(b_file.contains("debug_red"), "{b_file}");
    assert!(b_file.contains(" for bob: debug_red"), "{b_file}");
}

#[test]
fn an_orchestrator_that_does_not_answer_is_exit_5_naming_its_url() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Nothing listens there any more.
    let url = format!("http://127.0.0.1:{port}");
    let (code, out) = run(fvd().args(["status", "--orchestrator", &url]));
    assert_eq!(code, Some(5), "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("fvd: error:"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.starts_with(&format!(
            "fvd: error: cannot reach the orchestrator at {url}: "
        )),
        "{line}"
    );
    assert_eq!(out.matches("fvd: error:").count(), 1, "one line: {out}");
}
