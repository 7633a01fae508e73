//! The web dashboard (issue #16), in a real browser: Debian's headless
//! Chromium driven through its chromedriver (WebDriver) signs in with a
//! viewer's token (the orchestrator has named credentials and requires a
//! viewer), watches the example port's matrix change while a fleet (`fvd
//! orchestrator serve --dashboard` and an `fvd worker`) runs it, is refused
//! an answer with the viewer's token and with a wrong one, answers E001
//! from the page with the porter's, sees who answered, sees the port resume
//! and end, and saves screenshots under `target/tmp/dashboard/`. Each matrix change the
//! page applied is timed from the moment the dashboard received the port
//! event to the browser's `MutationObserver` callback. A second test serves
//! an embedded state read-only with `fvd dashboard --repo` while `fvd
//! submit` writes it.
//!
//! Needs `/usr/bin/chromium` and `/usr/bin/chromedriver` (Debian's
//! `chromium` and `chromium-driver`; `scripts/test.sh` installs them).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::agent::example_repo;
use crate::support::{LOG_FILTER, Sandbox, TestComponent, fvd, wait_for};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Kills its process on drop (an orchestrator).
pub(crate) struct Kill(pub(crate) Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A chromedriver in a process group of its own: dropped, the whole group
/// is killed, the Chromium it started too (ending chromedriver alone left
/// the browser running, busy, after a failed test).
pub(crate) struct KillGroup(Child);

impl Drop for KillGroup {
    fn drop(&mut self) {
        let pgid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

fn out_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A chromedriver on a free loopback port, and a headless Chromium session
/// through it with a fresh profile.
fn browser(rt: &tokio::runtime::Runtime, profile: &Path) -> (KillGroup, Client) {
    for bin in [CHROMIUM, CHROMEDRIVER] {
        assert!(
            Path::new(bin).exists(),
            "{bin} is missing: install Debian's chromium and chromium-driver (scripts/test.sh does: apt-get install -y chromium chromium-driver)"
        );
    }
    let port = free_port();
    let driver = KillGroup(
        Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn chromedriver"),
    );
    wait_for("chromedriver to listen", Duration::from_secs(30), || {
        TcpStream::connect(("127.0.0.1", port)).ok()
    });
    let caps = json!({
        "goog:chromeOptions": {
            "binary": CHROMIUM,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                "--window-size=1280,1500",
                format!("--user-data-dir={}", profile.display()),
            ]
        }
    });
    let caps = match caps {
        Value::Object(m) => m,
        _ => unreachable!(),
    };
    let client = rt
        .block_on(
            ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(caps)
                .connect(&format!("http://127.0.0.1:{port}")),
        )
        .expect("a chromium session through chromedriver");
    (driver, client)
}

/// Runs `script` in the page and returns its value.
fn js(rt: &tokio::runtime::Runtime, c: &Client, script: &str) -> Value {
    rt.block_on(c.execute(script, vec![])).expect("script runs")
}

/// Component → status as the page's matrix shows it now.
const MATRIX: &str = "const m = {}; for (const tr of document.querySelectorAll('#matrix tr[data-component]')) m[tr.dataset.component] = tr.dataset.status; return m;";

/// `fvd orchestrator serve --dashboard 127.0.0.1:0` with `args`; its gRPC
/// URL and the dashboard's.
pub(crate) fn orchestrator_with_dashboard(sb: &Sandbox, args: &[&str]) -> (Kill, String, String) {
    let db = sb.repo().join("orchestrator.db");
    let mut child = fvd()
        .args(["orchestrator", "serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(format!("sqlite://{}", db.display()))
        .args(args)
        .args(["--dashboard", "127.0.0.1:0", "--allow-agent-commands"])
        .env("FVD_LOG", LOG_FILTER)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(sb.repo().join("orchestrator.log")).unwrap())
        .spawn()
        .expect("spawn orchestrator");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || {
        let l = lines.next().expect("a line").expect("stdout");
        l.rsplit(' ').next().unwrap().to_string()
    };
    let (url, dash) = (next(), next());
    // Keep reading stdout, so the server never writes into a closed pipe.
    std::thread::spawn(move || for _ in lines {});
    assert!(dash.starts_with("http://127.0.0.1:"), "{dash}");
    (Kill(child), url, dash)
}

/// The example port on a fleet with named credentials: an orchestrator
/// with `--auth`, `args` and a dashboard, one worker `w1`; the
/// orchestrator's guard, its URL, the dashboard's, and a reader of each
/// credential's token by name.
fn example_fleet_with_dashboard(
    sb: &mut Sandbox,
    args: &[&str],
) -> (Kill, String, String, impl Fn(&str) -> String + use<>) {
    let auth = sb.auth.clone().expect("Sandbox::with_auth()");
    example_repo(sb, |t| t);
    let file = auth.file.display().to_string();
    let mut all = vec!["--auth", file.as_str()];
    all.extend_from_slice(args);
    let (orch, url, dash) = orchestrator_with_dashboard(sb, &all);
    sb.url = Some(url.clone());
    let w = sb.worker_at(&url, "w1", 2, &[]);
    sb.spawn_worker("w1", w);
    let token = move |name: &str| {
        std::fs::read_to_string(auth.token(name))
            .unwrap()
            .trim()
            .to_string()
    };
    (orch, url, dash, token)
}

#[test]
fn the_browser_watches_the_example_port_and_answers_e001_from_the_page() {
    let started = Instant::now();
    let mut sb = Sandbox::new().with_auth();
    let auth = sb.auth.clone().unwrap();
    let (_orch, _url, dash, token) =
        example_fleet_with_dashboard(&mut sb, &["--dashboard-require-viewer"]);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let profile = tempfile::tempdir().unwrap();
    let (_driver, c) = browser(&rt, profile.path());
    let out = out_dir();

    // Pages need a reader's credential: the browser signs in as the viewer.
    rt.block_on(c.goto(&format!("{dash}/"))).unwrap();
    assert!(
        js(
            &rt,
            &c,
            "return !!document.querySelector('form.login') && !document.getElementById('ports')"
        )
        .as_bool()
        .unwrap_or(false),
        "an index without a sign-in: {}",
        js(&rt, &c, "return document.body.innerText")
    );
    rt.block_on(async {
        c.find(Locator::Css("form.login input[name=token]"))
            .await?
            .send_keys(&token("viewer"))
            .await?;
        c.find(Locator::Css("form.login button"))
            .await?
            .click()
            .await
    })
    .unwrap();
    // The index before the port exists; it shows the port once submitted.
    wait_for("the index page to go live", Duration::from_secs(20), || {
        (js(
            &rt,
            &c,
            "return document.getElementById('live') && document.getElementById('live').className",
        ) == "on")
            .then_some(())
    });
    assert_eq!(
        js(&rt, &c, "return document.cookie"),
        "",
        "the session cookie is HttpOnly"
    );
    let submit = sb.submit_remote("tinyport", &[]);
    assert!(
        submit.status.success(),
        "{}",
        String::from_utf8_lossy(&submit.stderr)
    );
    wait_for(
        "the index to list tinyport",
        Duration::from_secs(30),
        || {
            js(
                &rt,
                &c,
                "return !!document.querySelector('#ports tr[data-family=tinyport]')",
            )
            .as_bool()
            .unwrap_or(false)
            .then_some(())
        },
    );

    // The port page: record every change of the matrix as the browser sees it.
    rt.block_on(c.goto(&format!("{dash}/ports/tinyport")))
        .unwrap();
    js(
        &rt,
        &c,
        &format!(
            "window.seen = []; const sec = document.getElementById('matrix');
             const snap = () => {{ {MATRIX} }};
             const upd = () => {{ const u = {{}};
                 for (const tr of sec.querySelectorAll('tr[data-component]'))
                     u[tr.dataset.component] = Number(tr.dataset.updatedMs);
                 return u; }};
             window.seen.push({{t: performance.timeOrigin + performance.now(), ev: 0, m: snap(), u: upd()}});
             new MutationObserver(() => window.seen.push({{
                 t: performance.timeOrigin + performance.now(),
                 ev: Number(sec.dataset.eventUs || 0), m: snap(), u: upd() }}))
               .observe(sec, {{childList: true, subtree: true}});
             return true;"
        ),
    );
    wait_for(
        "the page to show E001 with its answer form",
        Duration::from_secs(180),
        || {
            js(
                &rt,
                &c,
                "return !!document.querySelector('#q-E001 form.answer')",
            )
            .as_bool()
            .unwrap_or(false)
            .then_some(())
        },
    );
    let m = js(&rt, &c, MATRIX);
    assert_eq!(m["time_shift"], "ask_user", "{m}");
    assert_eq!(m["embed"], "non_skip_pass", "{m}");
    assert_eq!(m["vae"], "blocked", "{m}");
    // Readable component rows on a narrow window and a wide one (issue
    // #43): no row taller than 6 lines, the reason at least 20 characters
    // wide (at 800 px it used to shrink to ~8 and rows grew 40-80 lines).
    for width in [800u32, 1280] {
        rt.block_on(c.set_window_size(width, 1500)).unwrap();
        let rows = js(
            &rt,
            &c,
            "const out = []; for (const tr of document.querySelectorAll('#matrix tr[data-component]')) { const td = tr.querySelector('td.reason'); const cs = getComputedStyle(td); const ch = parseFloat(cs.fontSize) * 0.6; out.push({name: tr.dataset.component, lines: tr.getBoundingClientRect().height / parseFloat(getComputedStyle(tr.querySelector('td')).lineHeight), reason_chars: td.getBoundingClientRect().width / ch}); } return out;",
        );
        for r in rows.as_array().unwrap() {
            let lines = r["lines"].as_f64().unwrap();
            let chars = r["reason_chars"].as_f64().unwrap();
            assert!(
                lines <= 6.0,
                "at {width} px the row of {} is {lines:.1} lines tall: {rows}",
                r["name"]
            );
            assert!(
                chars >= 20.0,
                "at {width} px the reason of {} is {chars:.0} characters wide: {rows}",
                r["name"]
            );
        }
        std::fs::write(
            out.join(format!("port-{width}px.png")),
            rt.block_on(c.screenshot()).unwrap(),
        )
        .unwrap();
    }
    rt.block_on(c.set_window_size(1280, 1500)).unwrap();
    // The open question is the page's first section after its head.
    let headings = js(
        &rt,
        &c,
        "return [...document.querySelectorAll('h2')].map(h => h.textContent)",
    );
    assert_eq!(headings[0], "Open questions", "{headings}");
    let seen = js(&rt, &c, "return window.seen");
    let seen = seen.as_array().unwrap();
    assert!(
        seen.len() >= 2 && seen.first().map(|s| &s["m"]) != seen.last().map(|s| &s["m"]),
        "the matrix never changed in the open page: {seen:?}"
    );
    std::fs::write(
        out.join("port-paused.png"),
        rt.block_on(c.screenshot()).unwrap(),
    )
    .unwrap();

    // The viewer's token is refused an answer, a wrong one too; nothing
    // changes.
    let form = "#q-E001 form.answer";
    rt.block_on(async {
        c.find(Locator::Css(&format!(
            "{form} input[name=option][value='1']"
        )))
        .await?
        .click()
        .await
    })
    .unwrap();
    let post = |t: &str| {
        rt.block_on(async {
            let field = c
                .find(Locator::Css(&format!("{form} input[name=token]")))
                .await?;
            field.clear().await?;
            field.send_keys(t).await?;
            // Each refusal's text is the output's; clear it first.
            c.execute(
                &format!(
                    "const o = document.querySelector('{form} output'); o.className = 'result'; o.textContent = ''"
                ),
                vec![],
            )
            .await?;
            c.find(Locator::Css(&format!("{form} button")))
                .await?
                .click()
                .await
        })
        .unwrap();
    };
    let refusal = || {
        wait_for("the refusal", Duration::from_secs(20), || {
            let t = js(
                &rt,
                &c,
                &format!(
                    "const o = document.querySelector('{form} output'); return o.className + ' ' + o.textContent"
                ),
            );
            let t = t.as_str().unwrap_or_default().to_string();
            (t.starts_with("result err ") && t.len() > "result err ".len()).then_some(t)
        })
    };
    post(&token("viewer"));
    let refused = refusal();
    assert!(
        refused.contains(
            "credential viewer (viewer) may not answer: that needs a porter or admin credential"
        ),
        "{refused}"
    );
    post("not-the-token");
    let refused = refusal();
    assert!(
        refused.contains("token not known to this orchestrator"),
        "{refused}"
    );
    assert_eq!(js(&rt, &c, MATRIX)["time_shift"], "ask_user");

    // With the porter's, E001 is answered and the port resumes.
    post(&token("porter"));
    wait_for(
        "time_shift to pass after the answer",
        Duration::from_secs(120),
        || (js(&rt, &c, MATRIX)["time_shift"] == "non_skip_pass").then_some(()),
    );
    wait_for(
        "the port to end blocked at P7",
        Duration::from_secs(60),
        || {
            let head = js(
                &rt,
                &c,
                "return document.getElementById('port-head').textContent",
            );
            let refused_p7 = js(
                &rt,
                &c,
                "return !!document.querySelector('#phases li.ph-refused b') && document.querySelector('#phases li.ph-refused b').textContent",
            );
            (head.as_str().is_some_and(|h| h.contains("blocked")) && refused_p7 == "P7")
                .then_some(())
        },
    );
    let q = js(
        &rt,
        &c,
        "return document.querySelector('#q-E001').dataset.status",
    );
    assert!(q == "answered" || q == "resolved", "{q}");
    let who = js(
        &rt,
        &c,
        "return document.querySelector('#q-E001 .who').textContent",
    );
    assert_eq!(who, "porter", "the page says who answered");
    std::fs::write(
        out.join("port-resumed.png"),
        rt.block_on(c.screenshot()).unwrap(),
    )
    .unwrap();

    // The JSON twin says the same.
    rt.block_on(c.goto(&format!("{dash}/api/ports/tinyport")))
        .unwrap();
    let twin: Value = serde_json::from_str(
        js(&rt, &c, "return document.body.innerText")
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(twin["state"], "blocked", "{twin}");
    assert_eq!(twin["questions"][0]["id"], "E001");
    assert_eq!(twin["questions"][0]["answered_by"], "porter", "{twin}");
    let logs = sb.logs() + &std::fs::read_to_string(sb.repo().join("orchestrator.log")).unwrap();
    for t in auth.tokens() {
        assert!(
            !twin.to_string().contains(&t) && !logs.contains(&t),
            "a token reached a page or a log"
        );
    }

    // The fleet, live from the scheduler: the worker, idle now.
    rt.block_on(c.goto(&format!("{dash}/workers"))).unwrap();
    assert!(
        js(
            &rt,
            &c,
            "return !!document.querySelector('#workers article[data-worker=w1]')"
        )
        .as_bool()
        .unwrap_or(false),
        "the workers page shows w1"
    );
    rt.block_on(c.goto(&format!("{dash}/api/workers"))).unwrap();
    let fleet: Value = serde_json::from_str(
        js(&rt, &c, "return document.body.innerText")
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(fleet["fleet"]["live"], true, "{fleet}");
    assert_eq!(fleet["fleet"]["workers"][0]["worker_id"], "w1", "{fleet}");
    assert_eq!(fleet["fleet"]["workers"][0]["free_cpu"], 2, "{fleet}");

    // Event → visible: every matrix change that an event caused.
    let mut ms: Vec<f64> = seen
        .iter()
        .filter(|s| s["ev"].as_f64().unwrap_or(0.0) > 0.0)
        .map(|s| s["t"].as_f64().unwrap() - s["ev"].as_f64().unwrap() / 1000.0)
        .collect();
    ms.sort_by(f64::total_cmp);
    assert!(!ms.is_empty(), "no event-driven matrix change: {seen:?}");
    let median = ms[ms.len() / 2];
    let max = ms[ms.len() - 1];
    // Commit → visible: a component whose status changed, from the time
    // its row was written (`updated_ms`, before the event is sent).
    let mut commit: Vec<f64> = seen
        .windows(2)
        .flat_map(|w| {
            let (a, b) = (&w[0], &w[1]);
            b["m"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, st)| a["m"][k.as_str()] != **st)
                .filter_map(|(k, _)| Some(b["t"].as_f64()? - b["u"][k.as_str()].as_f64()?))
                .collect::<Vec<_>>()
        })
        .collect();
    commit.sort_by(f64::total_cmp);
    let report = json!({
        "changes": ms.len(), "median_ms": median, "max_ms": max, "all_ms": ms,
        "status_changes": commit.len(),
        "commit_median_ms": commit.get(commit.len() / 2),
        "commit_max_ms": commit.last(),
        "test_s": started.elapsed().as_secs_f64(),
    });
    std::fs::write(out.join("latency.json"), report.to_string()).unwrap();
    eprintln!(
        "dashboard: event → visible in the browser over {} matrix changes: median {median:.1} ms, max {max:.1} ms; status commit → visible over {} changes: median {:.1} ms, max {:.1} ms (test {:.1} s; screenshots in {})",
        ms.len(),
        commit.len(),
        commit.get(commit.len() / 2).copied().unwrap_or(f64::NAN),
        commit.last().copied().unwrap_or(f64::NAN),
        started.elapsed().as_secs_f64(),
        out.display()
    );
    // Generous: a debug build on a shared 2-core machine.
    assert!(median < 1000.0, "{report}");
    let _ = rt.block_on(c.close());
}

/// `fvd dashboard --repo REPO` on a free loopback port: the process (killed
/// on drop) and its address.
pub(crate) fn read_only_dashboard(repo: &Path) -> (Kill, String) {
    let mut d = fvd()
        .args(["dashboard", "--listen", "127.0.0.1:0", "--repo"])
        .arg(repo)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(d.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .unwrap_or_else(|| panic!("an address in {line:?}"))
        .to_string();
    (Kill(d), addr)
}

/// A plain HTTP/1.0 request on loopback; the status line and the body.
pub(crate) fn http(addr: &str, method: &str, path: &str, body: &str) -> (String, String) {
    let (status, _, body) = http_with(addr, method, path, &[("Accept", "application/json")], body);
    (status, body)
}

#[test]
fn fvd_dashboard_follows_an_embedded_state_read_only_while_submit_writes_it() {
    let sb = Sandbox::new();
    let flag = sb.repo().join("go");
    sb.port(
        "dash",
        &[
            TestComponent::new("quick", "assert True"),
            TestComponent::new(
                "slow",
                &format!(
                    "while not os.path.exists({:?}):\n    time.sleep(0.05)\nassert True",
                    flag.display().to_string()
                ),
            ),
        ],
    );
    let mut submit = Kill(
        fvd()
            .args(["submit", "--family", "dash", "--wait", "--repo"])
            .arg(sb.repo())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("slow to run", Duration::from_secs(60), || {
        let s = sb.local_status("dash")?;
        (s["components"][1]["status"] == "running").then_some(())
    });
    let (_d, addr) = read_only_dashboard(sb.repo());

    let (status, body) = http(&addr, "GET", "/api/ports/dash", "");
    assert!(status.contains("200"), "{status} {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["components"][1]["status"], "running", "{v}");
    let (status, body) = http(&addr, "GET", "/ports/dash", "");
    assert!(
        status.contains("200") && body.contains("read-only"),
        "{status}"
    );
    assert!(!body.contains("<form"), "a read-only page has no form");
    let (status, body) = http(&addr, "POST", "/ports/dash/answer", "id=E001&option=1");
    assert!(
        status.contains("403") && body.contains("read-only"),
        "{status} {body}"
    );

    // The component page follows slow's output while it runs.
    let (status, body) = http(&addr, "GET", "/ports/dash/components/slow", "");
    assert!(status.contains("200"), "{status}");
    assert!(
        body.contains("data-follow=\"/ports/dash/components/slow/log?run=1"),
        "a running job's output is followed: {body}"
    );

    // The page's event stream reports slow's pass, found by polling the
    // database the submit process writes; the output stream, its end.
    let stream = |path: &str| {
        let mut s = TcpStream::connect(&addr).unwrap();
        write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        s
    };
    let read = |s: &mut TcpStream, into: &mut String| {
        let mut buf = [0u8; 8192];
        if let Ok(n) = s.read(&mut buf) {
            into.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    };
    let mut events = stream("/ports/dash/events");
    let mut log = stream("/ports/dash/components/slow/log?run=1");
    std::fs::write(&flag, "").unwrap();
    let (mut seen, mut output) = (String::new(), String::new());
    wait_for(
        "the event stream to show slow passing",
        Duration::from_secs(60),
        || {
            read(&mut events, &mut seen);
            seen.contains(r#"data-component=\"slow\" data-status=\"non_skip_pass\""#)
                .then_some(())
        },
    );
    wait_for("the output stream to end", Duration::from_secs(30), || {
        read(&mut log, &mut output);
        output.contains("event: end").then_some(())
    });
    assert!(
        output.contains("event: log") && output.contains("1 passed"),
        "{output}"
    );
    let code = wait_for("submit to end", Duration::from_secs(60), || {
        submit.0.try_wait().unwrap()
    });
    assert_eq!(code.code(), Some(0));
}

/// The operator's views of an embedded state, read-only, in the browser:
/// the port's timeline holds every run of both submits on its worker's
/// lane, the matrix filters by status (kept in the URL), the fleet's
/// timeline shows the same runs, and a run's output is searched and
/// downloaded as text. Screenshots go to `target/tmp/dashboard/`.
#[test]
fn the_operator_sees_the_timeline_history_filters_and_searches_a_log() {
    let sb = Sandbox::new();
    sb.port(
        "ops",
        &[
            TestComponent::new("fine", "assert True"),
            TestComponent::new(
                "red",
                "print('needle-4711 found here')\nassert False, 'off by 0.5'",
            ),
            TestComponent::new("also_fine", "time.sleep(0.2)"),
        ],
    );
    for extra in [&[][..], &["--rerun"]] {
        let out = fvd()
            .args(["submit", "--family", "ops", "--wait"])
            .args(extra)
            .arg("--repo")
            .arg(sb.repo())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "red is red: {out:?}");
    }
    let (_d, addr) = read_only_dashboard(sb.repo());

    // The JSON twin: two runs per component on the timeline, on CPU lanes
    // of each submit's worker (each embedded process has its own), elapsed
    // times, no GPU time.
    let (status, body) = http(&addr, "GET", "/api/ports/ops", "");
    assert!(status.contains("200"), "{status} {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let lanes = v["timeline"]["lanes"].as_array().unwrap();
    assert!(
        lanes
            .iter()
            .all(|l| l["label"].as_str().unwrap().contains("· CPU ")),
        "{v}"
    );
    // No two bars of a lane overlap: concurrent runs are on lanes of
    // their own.
    for l in lanes {
        let mut bars: Vec<(i64, i64)> = l["bars"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["start_ms"].as_i64().unwrap(),
                    b["end_ms"].as_i64().unwrap(),
                )
            })
            .collect();
        bars.sort();
        assert!(bars.windows(2).all(|w| w[0].1 <= w[1].0), "{l}");
    }
    let mut runs: Vec<(String, u64)> = lanes
        .iter()
        .flat_map(|l| l["bars"].as_array().unwrap().iter())
        .map(|b| {
            (
                b["component"].as_str().unwrap().to_string(),
                b["run_no"].as_u64().unwrap(),
            )
        })
        .collect();
    runs.sort();
    assert_eq!(
        runs,
        [
            ("also_fine", 1),
            ("also_fine", 2),
            ("fine", 1),
            ("fine", 2),
            ("red", 1),
            ("red", 2)
        ]
        .map(|(c, n)| (c.to_string(), n)),
        "every run of both submits: {v}"
    );
    assert!(v["elapsed_ms"].as_i64().unwrap() > 0, "{v}");
    assert_eq!(v["gpu_hours"], 0.0, "CPU runs: {v}");
    let also = v["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "also_fine")
        .unwrap();
    assert!(also["elapsed_ms"].as_i64().unwrap() >= 200, "{also}");

    // A run's output: searched (numbered lines), and downloaded as a file.
    let (status, body) = http(
        &addr,
        "GET",
        "/ports/ops/components/red/log.txt?run=2&q=NEEDLE-4711",
        "",
    );
    assert!(status.contains("200"), "{status}");
    let hits: Vec<&str> = body.lines().collect();
    assert!(
        !hits.is_empty()
            && hits.iter().all(|l| l.contains("needle-4711")
                && l.split_once(": ")
                    .is_some_and(|(n, _)| n.parse::<u32>().is_ok())),
        "{body}"
    );
    // The page's search (issue #43): a page of the dashboard (its header
    // and navigation), each hit among the lines around it and linked to
    // its line of the run's output, and a way back; a plain form, so it
    // works without the script.
    let (status, comp) = http(&addr, "GET", "/ports/ops/components/red?run=2", "");
    assert!(status.contains("200"), "{status}");
    assert!(
        comp.contains("action=\"/ports/ops/components/red/search\""),
        "the component's search form: {comp}"
    );
    let (status, found) = http(
        &addr,
        "GET",
        "/ports/ops/components/red/search?run=2&q=NEEDLE-4711",
        "",
    );
    assert!(status.contains("200"), "{status} {found}");
    assert!(
        found.contains("<header>") && found.contains("href=\"/workers\""),
        "the dashboard's layout: {found}"
    );
    assert!(
        found.contains("<mark>needle-4711</mark>"),
        "the hit is marked: {found}"
    );
    let hit = found
        .split("class=\"line hit\" data-line=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or_else(|| panic!("a numbered hit: {found}"));
    let context = found.matches("class=\"line\" data-line=").count();
    assert!(context >= 2, "lines around the hit: {found}");
    assert!(
        found.contains(&format!("href=\"/ports/ops/components/red?run=2#L{hit}\"")),
        "the hit links to its line: {found}"
    );
    assert!(
        found.contains("class=\"back\" href=\"/ports/ops/components/red?run=2\""),
        "a way back: {found}"
    );
    let line = comp
        .split(&format!("<span id=\"L{hit}\">"))
        .nth(1)
        .and_then(|r| r.split("</span>").next())
        .unwrap_or_else(|| panic!("line {hit} anchored on the run's page: {comp}"));
    assert!(line.contains("needle-4711"), "{line}");
    let twin = get_json(
        &addr,
        "/api/ports/ops/components/red/search?run=2&q=needle-4711",
    );
    assert_eq!(twin["matches"], hits.len(), "{twin}");
    let mut s = TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "GET /ports/ops/components/red/log.txt?run=1&download=1 HTTP/1.0\r\nHost: {addr}\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    assert!(
        raw.contains("attachment; filename=\"ops-red-run1.log\"") && raw.contains("AssertionError"),
        "{raw}"
    );

    // The browser: the port's timeline, then the matrix filtered to
    // `blocked` (in the URL too), then the fleet's timeline.
    let out = out_dir();
    let profile = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (_driver, c) = browser(&rt, profile.path());
    let base = format!("http://{addr}");
    rt.block_on(c.goto(&format!("{base}/ports/ops"))).unwrap();
    let bars = js(
        &rt,
        &c,
        "return [...document.querySelectorAll('#timeline .bar')].map(b => b.dataset.component + '#' + b.dataset.run + ':' + b.dataset.outcome)",
    );
    let bars: Vec<String> = serde_json::from_value(bars).unwrap();
    assert_eq!(bars.len(), 6, "{bars:?}");
    assert!(bars.contains(&"red#2:debug_red".to_string()), "{bars:?}");
    assert!(
        bars.contains(&"fine#1:non_skip_pass".to_string()),
        "{bars:?}"
    );
    let widths = js(
        &rt,
        &c,
        "return [...document.querySelectorAll('#timeline .bar')].map(b => b.getBoundingClientRect().width)",
    );
    assert!(
        widths
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w.as_f64().unwrap() > 0.0),
        "every bar is drawn: {widths}"
    );
    std::fs::write(
        out.join("timeline.png"),
        rt.block_on(c.screenshot()).unwrap(),
    )
    .unwrap();

    rt.block_on(async {
        c.find(Locator::Css(
            "nav.filter[data-filter-for=matrix] button[data-value=blocked]",
        ))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    });
    let visible = js(
        &rt,
        &c,
        "return [...document.querySelectorAll('#matrix tr[data-component]')].filter(r => getComputedStyle(r).display !== 'none').map(r => r.dataset.component)",
    );
    assert_eq!(visible, json!(["red"]), "only the blocked row shows");
    let url = rt.block_on(c.current_url()).unwrap();
    assert!(url.as_str().ends_with("/ports/ops?show=blocked"), "{url}");
    std::fs::write(
        out.join("filtered.png"),
        rt.block_on(c.screenshot()).unwrap(),
    )
    .unwrap();
    // The URL keeps the filter: a reload (or a link) shows the same rows.
    rt.block_on(c.goto(&format!("{base}/ports/ops?show=non_skip_pass")))
        .unwrap();
    let visible = js(
        &rt,
        &c,
        "return [...document.querySelectorAll('#matrix tr[data-component]')].filter(r => getComputedStyle(r).display !== 'none').map(r => r.dataset.component).sort()",
    );
    assert_eq!(visible, json!(["also_fine", "fine"]));

    rt.block_on(c.goto(&format!("{base}/workers"))).unwrap();
    let fleet = js(
        &rt,
        &c,
        "return document.querySelectorAll('#fleet-timeline .bar').length",
    );
    assert_eq!(
        fleet,
        json!(6),
        "the fleet's last hour holds the port's runs"
    );
    // Both submits' workers are gone (issue #43): no card, one folded
    // line that opens to list them.
    let gone = js(
        &rt,
        &c,
        "const d = document.querySelector('#workers details.gone'); return {cards: document.querySelectorAll('#workers article.worker').length, open: d && d.open, summary: d && d.querySelector('summary').textContent, listed: d && d.querySelectorAll('li[data-gone-worker]').length}",
    );
    assert_eq!(gone["cards"], 0, "{gone}");
    assert_eq!(gone["open"], false, "folded: {gone}");
    assert_eq!(gone["listed"], 2, "{gone}");
    assert!(
        gone["summary"]
            .as_str()
            .is_some_and(|s| s.starts_with("2 earlier workers")),
        "{gone}"
    );
    std::fs::write(
        out.join("fleet-timeline.png"),
        rt.block_on(c.screenshot()).unwrap(),
    )
    .unwrap();

    // The search from the run's page, in the browser: the hits open in
    // the dashboard's layout, and a hit's line number opens the run's
    // output at that line, in view.
    rt.block_on(c.goto(&format!("{base}/ports/ops/components/red?run=2")))
        .unwrap();
    rt.block_on(async {
        c.find(Locator::Css("form.search input[name=q]"))
            .await?
            .send_keys("needle-4711")
            .await?;
        c.find(Locator::Css("form.search button"))
            .await?
            .click()
            .await
    })
    .unwrap();
    wait_for("the search's page", Duration::from_secs(20), || {
        js(
            &rt,
            &c,
            "return !!document.getElementById('search-summary')",
        )
        .as_bool()
        .unwrap_or(false)
        .then_some(())
    });
    let url = rt.block_on(c.current_url()).unwrap();
    assert!(
        url.path().ends_with("/ports/ops/components/red/search"),
        "{url}"
    );
    assert_eq!(
        js(
            &rt,
            &c,
            "return !!document.querySelector('header nav a[href=\"/workers\"]') && document.querySelectorAll('pre.hits .line.hit mark').length"
        ),
        json!(hits.len()),
        "the dashboard's header and each hit marked"
    );
    std::fs::write(out.join("search.png"), rt.block_on(c.screenshot()).unwrap()).unwrap();
    rt.block_on(async {
        c.find(Locator::Css("pre.hits .line.hit a.ln"))
            .await?
            .click()
            .await
    })
    .unwrap();
    let seen = wait_for(
        "the hit's line on the run's page",
        Duration::from_secs(20),
        || {
            let v = js(
                &rt,
                &c,
                "const id = location.hash.slice(1); const el = id && document.getElementById(id); const log = document.getElementById('log'); if (!el || !log) return null; const r = el.getBoundingClientRect(), p = log.getBoundingClientRect(); return {text: el.textContent, inside: r.top >= p.top - 1 && r.bottom <= p.bottom + 1 && r.bottom <= window.innerHeight, search: location.pathname + location.search};",
            );
            (!v.is_null()).then_some(v)
        },
    );
    assert_eq!(seen["search"], "/ports/ops/components/red?run=2", "{seen}");
    assert!(
        seen["text"]
            .as_str()
            .is_some_and(|t| t.contains("needle-4711")),
        "{seen}"
    );
    assert_eq!(seen["inside"], true, "the line is in view: {seen}");
    std::fs::write(
        out.join("search-hit.png"),
        rt.block_on(c.screenshot()).unwrap(),
    )
    .unwrap();
    rt.block_on(c.close()).unwrap();
}

/// One HTTP/1.0 exchange with `headers` added: the status line, the
/// response's headers and its body.
fn http_with(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (String, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{extra}Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let (status, rest) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), rest.to_string(), body.to_string())
}

/// A browser signed in as a porter answers from the page without typing a
/// token (issue #43: the form asked a signed-in porter for one); a viewer's
/// session still gets the token field, and its answer is refused.
#[test]
fn a_browser_signed_in_as_a_porter_answers_without_a_token() {
    let mut sb = Sandbox::new().with_auth();
    let (_orch, _url, dash, token) = example_fleet_with_dashboard(&mut sb, &[]);
    let out = sb.submit_remote("tinyport", &["--wait"]);
    assert_eq!(out.status.code(), Some(3), "{}", sb.logs());
    let addr = dash.trim_start_matches("http://").to_string();
    let origin = dash.clone();
    let session = |who: &str| {
        let (status, head, _) = http_with(
            &addr,
            "POST",
            "/login",
            &[("Origin", &origin)],
            &format!("token={}&next=/", token(who)),
        );
        assert!(
            status.contains("303") || status.contains("302"),
            "{status}\n{head}"
        );
        head.lines()
            .find_map(|l| {
                l.strip_prefix("set-cookie: ")
                    .or_else(|| l.strip_prefix("Set-Cookie: "))
            })
            .and_then(|c| c.split(';').next())
            .unwrap_or_else(|| panic!("no session cookie: {head}"))
            .to_string()
    };
    let page = |cookie: &str| {
        let (status, _, body) =
            http_with(&addr, "GET", "/ports/tinyport", &[("Cookie", cookie)], "");
        assert!(status.contains("200"), "{status}");
        body
    };
    let viewer = session("viewer");
    assert!(
        page(&viewer).contains("name=\"token\""),
        "a viewer's page asks for a token"
    );
    let (status, _, body) = http_with(
        &addr,
        "POST",
        "/ports/tinyport/answer",
        &[
            ("Cookie", &viewer),
            ("Origin", &origin),
            ("Accept", "application/json"),
        ],
        "id=E001&option=1",
    );
    assert!(!status.contains("200"), "{status} {body}");
    assert!(body.contains("may not answer"), "{body}");

    let porter = session("porter");
    assert!(
        !page(&porter).contains("name=\"token\""),
        "a porter's page asks for no token"
    );
    // From another origin, the session does not answer.
    let (status, _, body) = http_with(
        &addr,
        "POST",
        "/ports/tinyport/answer",
        &[
            ("Cookie", &porter),
            ("Origin", "http://evil.example"),
            ("Accept", "application/json"),
        ],
        "id=E001&option=1",
    );
    assert!(status.contains("403"), "{status} {body}");
    let (status, _, body) = http_with(
        &addr,
        "POST",
        "/ports/tinyport/answer",
        &[
            ("Cookie", &porter),
            ("Origin", &origin),
            ("Accept", "application/json"),
        ],
        "id=E001&option=1",
    );
    assert!(status.contains("200"), "{status} {body}");
    let s = sb.remote_status("tinyport").unwrap();
    let e = s["escapes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == "E001")
        .unwrap()
        .clone();
    assert_eq!(e["answered_by"], "porter", "{e:#}");
}

/// `GET path` of the dashboard at `addr` as JSON (a twin under `/api`).
fn get_json(addr: &str, path: &str) -> Value {
    let (status, body) = http(addr, "GET", path, "");
    assert!(status.contains("200"), "{path}: {status} {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// Issue #43: an embedded state's `/workers` page after several `fvd
/// submit`s, each of which registered a worker of its own that ended with
/// it. Only the worker of the submit that runs now is a card (holding its
/// run); the others fold into one line; a run whose submit was killed is
/// interrupted, held by nobody; and every timeline lane names its worker
/// (a run stopped by Ctrl-C, queued again, is listed apart).
#[test]
fn an_embedded_state_s_gone_workers_fold_away_and_hold_no_run() {
    let sb = Sandbox::new();
    let release = sb.repo().join("release");
    let blocking = crate::port::blocks_until(&release);
    sb.port(
        "killed",
        &[
            TestComponent::new("quick", "assert True"),
            TestComponent::new("stuck", &blocking),
        ],
    );
    sb.port("stopped", &[TestComponent::new("stuck", &blocking)]);
    sb.port("later", &[TestComponent::new("waits", &blocking)]);
    let submit = |family: &str| {
        Kill(
            fvd()
                .args(["submit", "--family", family, "--wait", "--repo"])
                .arg(sb.repo())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let running = |family: &str, component: &str| {
        wait_for(
            &format!("{family}/{component} to run"),
            Duration::from_secs(90),
            || {
                let s = sb.local_status(family)?;
                s["components"]
                    .as_array()?
                    .iter()
                    .any(|c| c["name"] == component && c["status"] == "running")
                    .then_some(())
            },
        )
    };
    // Killed mid-run (kill -9): the store still gives `stuck` to its worker.
    let killed = submit("killed");
    let killed_pid = killed.0.id();
    running("killed", "stuck");
    drop(killed);
    // Stopped mid-run (Ctrl-C): its run goes back to the queue.
    let mut stopped = submit("stopped");
    let stopped_pid = stopped.0.id();
    running("stopped", "stuck");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(stopped_pid as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    wait_for("the stopped submit to end", Duration::from_secs(60), || {
        stopped.0.try_wait().unwrap()
    });
    let (_d, addr) = read_only_dashboard(sb.repo());
    let of =
        |pid: u32| move |id: &Value| id.as_str().is_some_and(|s| s.ends_with(&format!("-{pid}")));

    // No submit runs: no worker card, two earlier workers in one line,
    // the killed submit's run interrupted and on no card.
    let v = get_json(&addr, "/api/workers");
    assert!(
        v["fleet"]["workers"].as_array().unwrap().is_empty(),
        "{v:#}"
    );
    let gone: Vec<&Value> = v["gone"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| &w["worker_id"])
        .collect();
    assert_eq!(gone.len(), 2, "{v:#}");
    assert!(gone.iter().any(|w| of(killed_pid)(w)), "{v:#}");
    assert!(gone.iter().any(|w| of(stopped_pid)(w)), "{v:#}");
    let cut = v["interrupted"].as_array().unwrap();
    assert!(
        cut.iter().any(|i| i["run"]["family"] == "killed"
            && i["run"]["component"] == "stuck"
            && of(killed_pid)(&i["worker_id"])),
        "the killed submit's run is interrupted: {v:#}"
    );
    let bars: Vec<&Value> = v["timeline"]["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l["bars"].as_array().unwrap().iter())
        .filter(|b| b["family"] == "killed" && b["component"] == "stuck")
        .collect();
    assert!(!bars.is_empty(), "{v:#}");
    for b in bars {
        assert_eq!(b["outcome"], "interrupted", "{b}");
        assert_eq!(b["running"], false, "{b}");
    }
    // No lane without its worker's name, on the fleet's timeline or a
    // port's.
    for t in [
        &v["timeline"],
        &get_json(&addr, "/api/ports/stopped")["timeline"],
    ] {
        for l in t["lanes"].as_array().unwrap() {
            let label = l["label"].as_str().unwrap();
            assert!(
                label
                    .split(" · ")
                    .next()
                    .is_some_and(|w| !w.trim().is_empty()),
                "a lane without a worker: {t:#}"
            );
        }
    }
    let (status, page) = http(&addr, "GET", "/workers", "");
    assert!(status.contains("200"), "{status}");
    assert!(!page.contains("<article class=\"worker\""), "{page}");
    assert!(
        page.contains("2 earlier workers") && page.contains("No worker running."),
        "{page}"
    );
    let cut = page
        .split("class=\"interrupted\"")
        .nth(1)
        .expect("an interrupted section");
    assert!(
        cut.contains(">killed<") && cut.contains("interrupted"),
        "{page}"
    );

    // The port's page says the same: `stuck` is interrupted, not running
    // on the killed submit's worker, and its output is not followed.
    let port = get_json(&addr, "/api/ports/killed");
    let stuck = port["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "stuck")
        .unwrap();
    assert_eq!(stuck["status"], "interrupted", "{port:#}");
    let bars: Vec<&Value> = port["timeline"]["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l["bars"].as_array().unwrap().iter())
        .filter(|b| b["component"] == "stuck")
        .collect();
    assert!(
        !bars.is_empty() && bars.iter().all(|b| b["outcome"] == "interrupted"),
        "{port:#}"
    );
    let c = get_json(&addr, "/api/ports/killed/components/stuck");
    assert_eq!(c["runs"][0]["state"], "interrupted", "{c:#}");
    assert_eq!(c["log"]["following"], false, "{c:#}");

    // A submit runs: its worker is the one card, holding its run.
    let later = submit("later");
    let later_pid = later.0.id();
    running("later", "waits");
    let v = get_json(&addr, "/api/workers");
    let workers = v["fleet"]["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 1, "only the running submit's worker: {v:#}");
    assert!(of(later_pid)(&workers[0]["worker_id"]), "{v:#}");
    assert_eq!(workers[0]["jobs"][0]["family"], "later", "{v:#}");
    assert_eq!(v["gone"].as_array().unwrap().len(), 2, "{v:#}");
    let (_, page) = http(&addr, "GET", "/workers", "");
    assert_eq!(
        page.matches("<article class=\"worker\"").count(),
        1,
        "{page}"
    );
    assert!(page.contains("2 earlier workers"), "{page}");

    std::fs::write(&release, "").unwrap();
    let mut later = later;
    wait_for("the later submit to end", Duration::from_secs(90), || {
        later.0.try_wait().unwrap()
    });
    let v = get_json(&addr, "/api/workers");
    assert!(
        v["fleet"]["workers"].as_array().unwrap().is_empty(),
        "{v:#}"
    );
    assert_eq!(v["gone"].as_array().unwrap().len(), 3, "{v:#}");
    let (_, page) = http(&addr, "GET", "/workers", "");
    assert!(!page.contains("<article class=\"worker\""), "{page}");
    assert!(
        page.contains("3 earlier workers") && page.contains("No worker running."),
        "{page}"
    );
}
