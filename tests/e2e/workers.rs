//! Workers under the faults of a real fleet (issue #27, item 7): their
//! tests die with them, a stale pid file signals nothing, a duplicate id is
//! refused, and an orchestrator restart adopts the runs in flight.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::{Sandbox, TestComponent, components, fvd, wait_for};

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().to_string()))
        .is_some_and(|r| !r.starts_with('Z') && !r.starts_with('X'))
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The pid of the reaper of worker `id` (a `sh` whose arguments name the
/// worker's workspace).
fn reaper_of(sb: &Sandbox, id: &str) -> Option<i32> {
    let ws = std::fs::canonicalize(sb.dir.path().join(format!("ws-{id}"))).ok()?;
    let ws = ws.display().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd);
        (cmd.contains("fvd-reaper") && cmd.contains(&ws)).then_some(pid)
    })
}

#[test]
fn a_killed_worker_s_test_dies_with_it_and_a_restart_ends_what_is_left() {
    let mut sb = Sandbox::new();
    let release = sb.repo().join("never");
    let (first, second) = (sb.repo().join("first.pid"), sb.repo().join("second.pid"));
    // The first run records its pid in `first`, the rerun in `second`.
    let body = format!(
        "p = {first:?} if not os.path.exists({first:?}) else {second:?}\nopen(p, 'w').write(str(os.getpid()))\n{}",
        crate::port::blocks_until(&release),
        first = first.display().to_string(),
        second = second.display().to_string(),
    );
    sb.port("orphans", &[TestComponent::new("a", &body)]);
    sb.serve();
    sb.worker("w1", 1);
    assert!(sb.submit_remote("orphans", &[]).status.success());
    let pid = wait_for("the first test running", Duration::from_secs(60), || {
        read_pid(&first)
    });
    // kill -9 of the worker: its reaper ends the test at once.
    sb.kill_worker("w1");
    wait_for(
        "the orphaned test to be ended",
        Duration::from_secs(20),
        || (!alive(pid)).then_some(()),
    );

    // That reaper exits once its scan of /proc is done (slow on a loaded
    // machine); until then it would be taken for the next worker's.
    wait_for(
        "the first worker's reaper to exit",
        Duration::from_secs(60),
        || reaper_of(&sb, "w1").is_none().then_some(()),
    );

    // Now the reaper dies too (a kill of everything, an OOM): the next
    // worker on the workspace ends the leftover before it takes a job.
    sb.worker("w1", 1);
    let pid2 = wait_for("the rerun running", Duration::from_secs(60), || {
        read_pid(&second)
    });
    let reaper = wait_for("w1's reaper", Duration::from_secs(10), || {
        reaper_of(&sb, "w1")
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(reaper),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    sb.kill_worker("w1");
    assert!(alive(pid2), "with no reaper, the test outlives its worker");
    sb.worker("w1", 1);
    wait_for(
        "the restarted worker to end the leftover",
        Duration::from_secs(20),
        || (!alive(pid2)).then_some(()),
    );
    // The worker logs the sweep after its kills: on a loaded machine the
    // line may come after the process is gone.
    wait_for(
        "the restarted worker to say it ended the leftover",
        Duration::from_secs(20),
        || {
            sb.logs()
                .contains("ended processes an earlier worker of this workspace left running")
                .then_some(())
        },
    );
}

/// An embedded state read after its submits ended lists no worker: each
/// past `fvd submit` registered one, and none of them runs any more (it
/// used to list one per past submit, as if connected).
#[test]
fn an_embedded_state_lists_no_worker_of_an_ended_submit() {
    let sb = Sandbox::new();
    sb.port("ended", &[TestComponent::new("solo", "assert True")]);
    for _ in 0..2 {
        let out = fvd()
            .args(["submit", "--family", "ended", "--rerun", "--wait", "--repo"])
            .arg(sb.repo())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
    let out = fvd()
        .args(["workers", "--json", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["workers"], serde_json::json!([]), "{v}");
    let out = fvd()
        .args(["workers", "--repo"])
        .arg(sb.repo())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no worker is connected"), "{text}");
}

#[test]
fn drain_signals_nothing_when_the_pid_file_names_another_process() {
    let sb = Sandbox::new();
    let ws = sb.dir.path().join("ws-stale");
    std::fs::create_dir_all(&ws).unwrap();
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    std::fs::write(ws.join("worker.pid"), sleeper.id().to_string()).unwrap();
    let out = fvd()
        .args(["worker", "drain", "--workspace"])
        .arg(&ws)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("is not the fvd worker of") && stderr.contains("sleep 60"),
        "{stderr}"
    );
    assert!(
        sleeper.try_wait().unwrap().is_none(),
        "the unrelated process was not signalled"
    );
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

#[test]
fn a_second_worker_with_a_live_worker_s_id_is_refused() {
    let mut sb = Sandbox::new();
    sb.port("twins", &[TestComponent::new("a", "assert True")]);
    sb.serve();
    sb.worker("twin", 1);
    wait_for("the first twin registered", Duration::from_secs(30), || {
        sb.logs().contains("worker registered").then_some(())
    });
    // Same id, another workspace and process.
    let out = fvd()
        .args(["worker", "--orchestrator", sb.url.as_deref().unwrap()])
        .args(["--gpus", "none", "--worker-id", "twin", "--cpu-slots", "1"])
        .arg("--workspace")
        .arg(sb.dir.path().join("ws-twin-2"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}\n{}", sb.logs());
    assert!(
        stderr.contains("worker id twin is in use by a live worker"),
        "{stderr}"
    );
    // The first is not a zombie: it still takes the port's job.
    assert!(sb.submit_remote("twins", &[]).status.success());
    let status = wait_for("the port to end", Duration::from_secs(60), || {
        let s = sb.remote_status("twins")?;
        (s["state"] != "running").then_some(s)
    });
    let rows = components(&status);
    assert_eq!(
        (rows[0].1.as_str(), rows[0].3.as_str()),
        ("non_skip_pass", "twin"),
        "{status}"
    );
}

/// A port of one blocking component on one worker at a fixed address,
/// its run in flight; returns the address and the release file.
fn one_run_in_flight(sb: &mut Sandbox, family: &str) -> (String, std::path::PathBuf) {
    let release = sb.repo().join("release");
    sb.port(
        family,
        &[TestComponent::new(
            "a",
            &crate::port::blocks_until(&release),
        )],
    );
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    sb.serve_at(&addr, &[]);
    sb.worker("w1", 1);
    assert!(sb.submit_remote(family, &[]).status.success());
    wait_for("the run in flight", Duration::from_secs(60), || {
        let rows = components(&sb.remote_status(family)?);
        (rows[0].1 == "running").then_some(())
    });
    (addr, release)
}

fn ended(sb: &Sandbox, family: &str) -> serde_json::Value {
    wait_for("the port to end", Duration::from_secs(90), || {
        let s = sb.remote_status(family)?;
        (s["state"] != "running").then_some(s)
    })
}

#[test]
fn a_worker_back_without_its_run_after_an_orchestrator_restart_runs_it_again_at_once() {
    let mut sb = Sandbox::new();
    let (addr, release) = one_run_in_flight(&mut sb, "lostrun");
    sb.kill_orchestrator();
    sb.kill_worker("w1");
    // A long grace: the run is not waited for once its worker says it
    // does not run it.
    sb.serve_at(&addr, &["--adopt-grace", "600"]);
    std::fs::write(&release, "go").unwrap();
    sb.worker("w1", 1);
    let status = ended(&sb, "lostrun");
    let rows = components(&status);
    assert_eq!(
        (rows[0].1.as_str(), rows[0].2),
        ("non_skip_pass", 2),
        "the cut-off run and its rerun: {status}"
    );
    assert!(
        sb.orchestrator_log()
            .contains("worker w1 came back without it"),
        "{}",
        sb.orchestrator_log()
    );
}

#[test]
fn a_run_whose_worker_does_not_come_back_runs_again_after_the_grace() {
    let mut sb = Sandbox::new();
    let (addr, release) = one_run_in_flight(&mut sb, "nocome");
    sb.kill_orchestrator();
    sb.kill_worker("w1");
    sb.serve_at(&addr, &["--adopt-grace", "1"]);
    std::fs::write(&release, "go").unwrap();
    sb.worker("w2", 1);
    let status = ended(&sb, "nocome");
    let rows = components(&status);
    assert_eq!(
        (rows[0].1.as_str(), rows[0].2, rows[0].3.as_str()),
        ("non_skip_pass", 2, "w2"),
        "{status}"
    );
    assert!(
        sb.orchestrator_log()
            .contains("worker w1 did not come back in time"),
        "{}",
        sb.orchestrator_log()
    );
}

/// A loopback proxy to `upstream` that resets the first connection once
/// the worker's registration is on its way: the client's HTTP/2 frames go
/// through until its first HEADERS frame (the registration's stream),
/// which is kept back; the socket is then closed with the registration's
/// bytes unread, which sends a TCP reset. Every later connection is
/// forwarded. Frames, not reads, decide the moment, so however the
/// client's writes are split or joined the request is already sent when
/// the reset comes (an earlier reset would be hidden by tonic, which
/// reconnects before dispatching).
fn resetting_proxy(upstream: String) -> String {
    use std::io::{Read, Write};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut first = true;
        for client in listener.incoming().flatten() {
            let Ok(server) = std::net::TcpStream::connect(&upstream) else {
                continue;
            };
            let (mut c_read, mut s_write) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (mut s_read, mut c_write) = (server, client);
            let cut = Arc::new(AtomicBool::new(false));
            let cut_seen = cut.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                while let Ok(n) = s_read.read(&mut buf) {
                    // Nothing from the server reaches a connection being
                    // reset (its GOAWAY would end the stream gracefully).
                    if n == 0
                        || cut_seen.load(Ordering::SeqCst)
                        || c_write.write_all(&buf[..n]).is_err()
                    {
                        return;
                    }
                }
            });
            let reset = std::mem::replace(&mut first, false);
            std::thread::spawn(move || {
                if reset {
                    let _ = c_read.set_read_timeout(Some(Duration::from_secs(10)));
                    let mut preface = [0u8; 24];
                    if c_read.read_exact(&mut preface).is_err() {
                        return;
                    }
                    let _ = s_write.write_all(&preface);
                    loop {
                        let mut head = [0u8; 9];
                        if c_read.read_exact(&mut head).is_err() {
                            return;
                        }
                        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
                        let mut payload = vec![0u8; len];
                        if c_read.read_exact(&mut payload).is_err() {
                            return;
                        }
                        const HEADERS: u8 = 0x1;
                        if head[3] == HEADERS {
                            break;
                        }
                        let _ = s_write.write_all(&head);
                        let _ = s_write.write_all(&payload);
                    }
                    // The registration's message follows its headers: it
                    // is left unread, and both sides closed.
                    let mut peek = [0u8; 1];
                    let _ = c_read.peek(&mut peek);
                    cut.store(true, Ordering::SeqCst);
                    let _ = s_write.shutdown(std::net::Shutdown::Both);
                    drop(c_read);
                    return;
                }
                let mut buf = [0u8; 16 * 1024];
                while let Ok(n) = c_read.read(&mut buf) {
                    if n == 0 || s_write.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("http://{addr}")
}

#[test]
fn a_reset_during_registration_is_retried_not_fatal() {
    let mut sb = Sandbox::new();
    sb.port("resets", &[TestComponent::new("a", "assert True")]);
    let url = sb.serve();
    let proxy = resetting_proxy(url.trim_start_matches("http://").to_string());
    let w = sb.worker_at(&proxy, "w1", 1, &[]);
    sb.spawn_worker("w1", w);
    assert!(sb.submit_remote("resets", &[]).status.success());
    let status = wait_for("the port to end", Duration::from_secs(60), || {
        let s = sb.remote_status("resets")?;
        (s["state"] != "running").then_some(s)
    });
    assert_eq!(
        components(&status)[0].1,
        "non_skip_pass",
        "{status}\n{}",
        sb.logs()
    );
    let log = crate::durability::strip_colours(&sb.logs());
    // The reset reaches the worker as UNKNOWN ("transport error"): it used
    // to be taken for a refusal, exit 2. The client meets it reading
    // (ConnectionReset) or writing (BrokenPipe), whichever it does first.
    assert!(
        log.contains("connection lost; reconnecting")
            && (log.contains("ConnectionReset") || log.contains("BrokenPipe")),
        "the reset was met and retried: {log}"
    );
}

/// Runs `sql` on the SQLite file `db` through Python's sqlite3, as the
/// tests' other queries (`chaos::query`), for writing.
fn execute(db: &Path, sql: &str) {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\nc.executescript(sys.argv[2])\nc.commit()",
        ])
        .arg(db)
        .arg(sql)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue #33: leases commit without an fsync; their epochs come from
/// blocks reserved by a synced commit. The orchestrator is killed (-9) in
/// the middle of a block with a run in flight, and a power cut is emulated
/// on top: the run's lease, never synced, is gone from the database (its
/// row back as it was queued). The restarted orchestrator must number its
/// leases above the whole block, not above the lease rows it sees (which
/// would hand out the lost epoch again), and no result of the run cut off
/// is accepted: the port's verdict is the new run's.
#[test]
fn a_kill_9_mid_epoch_block_numbers_leases_above_the_block_and_accepts_no_stale_result() {
    let mut sb = Sandbox::new();
    let (addr, release) = one_run_in_flight(&mut sb, "epochs");
    let db = sb.dir.path().join("orchestrator.db");
    let one = |sql: &str| crate::chaos::query(&db, sql)[0][0].as_i64().unwrap();
    let reserved = one("SELECT reserved_to FROM lease_epochs");
    let first = one("SELECT lease_epoch FROM jobs WHERE job_id = 'epochs.a.1'");
    assert!(
        0 < first && first < reserved,
        "the run's epoch {first} is inside the reserved block (to {reserved})"
    );
    sb.kill_orchestrator();
    execute(
        &db,
        "UPDATE jobs SET state = 'queued', lease_epoch = 0, worker_id = '', gpus = '[]', started_ms = NULL, spawned_ms = NULL WHERE job_id = 'epochs.a.1';
         UPDATE components SET status = 'queued', worker_id = '' WHERE family = 'epochs';",
    );
    // The worker still runs the cut-off run and reports it (and its
    // result, once released) to the restarted orchestrator.
    sb.serve_at(&addr, &["--adopt-grace", "600"]);
    std::fs::write(&release, "go").unwrap();
    let status = ended(&sb, "epochs");
    let rows = components(&status);
    assert_eq!(rows[0].1, "non_skip_pass", "{status}");
    let runs = crate::chaos::query(
        &db,
        "SELECT job_id, state, verdict, lease_epoch FROM jobs WHERE family = 'epochs' ORDER BY run_no",
    );
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(
        (runs[0][1].as_str(), runs[0][2].as_str()),
        (Some("abandoned"), Some("")),
        "the cut-off run's result is not recorded: {runs:?}"
    );
    let again = runs[1][3].as_i64().unwrap();
    assert!(
        again > reserved,
        "the rerun's epoch {again} is above the block reserved before the kill ({reserved}): {runs:?}"
    );
    assert!(
        one("SELECT reserved_to FROM lease_epochs") >= again,
        "its own epoch was reserved first"
    );
    assert_eq!(runs[1][2].as_str(), Some("non_skip_pass"), "{runs:?}");
    // The worker came back with the cut-off run (still running, or ended
    // and its result held): cancelled as an orphan, or its result
    // rejected, never taken.
    let log = sb.orchestrator_log();
    assert!(
        log.lines().any(|l| l.contains("epochs.a.1")
            && (l.contains("a lease it does not hold")
                || l.contains("rejected a message with a stale or unknown lease"))),
        "{log}"
    );
}

/// Issue #38: a worker whose link stalls past the lease TTL (no reset,
/// just silence) is lost to the scheduler, and its job goes back to the
/// queue. Once the link heals, the worker must register again and run it;
/// before, the orchestrator kept the stalled stream open, the worker's
/// heartbeats went on arriving on a stream no registration knew, and the
/// job waited for a worker forever.
#[test]
fn a_worker_lost_to_a_stalled_link_registers_again_and_runs_its_job() {
    let mut sb = Sandbox::new();
    let release = sb.repo().join("release");
    sb.port(
        "stall",
        &[TestComponent::new(
            "only",
            &crate::port::blocks_until(&release),
        )],
    );
    let url = sb.serve_with(&["--lease-ttl", "1.5"]);
    let proxy = crate::support::Proxy::start(url.trim_start_matches("http://"));
    let w1 = sb.worker_at(&proxy.url(), "w1", 1, &[]);
    sb.spawn_worker("w1", w1);
    let submit = sb.submit_remote("stall", &[]);
    assert!(submit.status.success(), "{submit:?}");
    wait_for("the job running on w1", Duration::from_secs(60), || {
        let rows = components(&sb.remote_status("stall")?);
        (rows[0].1 == "running" && rows[0].3 == "w1").then_some(())
    });
    // Silence both ways until the orchestrator gives w1 up.
    proxy.pause(true);
    wait_for("w1 to be lost", Duration::from_secs(60), || {
        sb.logs()
            .contains("worker missed its heartbeats; its leases expire")
            .then_some(())
    });
    std::fs::write(&release, "go").unwrap();
    proxy.pause(false);
    // w1 comes back on a new stream and the job gets its verdict.
    let status = wait_for(
        "the verdict after w1 is back",
        Duration::from_secs(90),
        || {
            let s = sb.remote_status("stall")?;
            (s["state"] != "running").then_some(s)
        },
    );
    let rows = components(&status);
    assert_eq!(
        (rows[0].1.as_str(), rows[0].3.as_str()),
        ("non_skip_pass", "w1"),
        "{status}\n{}",
        sb.logs()
    );
    let registered = sb.logs().matches("worker registered worker=w1").count();
    assert!(
        registered >= 2,
        "w1 registered {registered} times:\n{}",
        sb.logs()
    );
}
