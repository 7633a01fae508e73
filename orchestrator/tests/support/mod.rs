//! The orchestrator booted in-process for tests: the real server
//! ([`fvd_orchestrator::start`] on `127.0.0.1:0`, real SQLite, real tonic)
//! on a manual clock, a throw-away port repository, gRPC clients, and
//! simulated workers ([`sim_worker`]) that answer assignments with the
//! JUnit reports a test chooses.
//!
//! Each test names its own family: component actors are registered as
//! `family/component` in ractor's registry, which is one per process and so
//! shared by the servers of every test running at once in a test binary.

// Each test binary uses a part of it.
#![allow(dead_code)]

pub mod sim_worker;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fvd_actors::scheduler::{SchedulerConfig, SchedulerMsg};
use fvd_orchestrator::{Server, ServerConfig};
use fvd_proto::auth::{ClientAuth, Token};
use fvd_proto::v1 as pb;
use fvd_proto::v1::port_service_client::PortServiceClient;
use fvd_store::Store;
use fvd_store::clock::ManualClock;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

pub use sim_worker::SimWorker;

/// The lease time-to-live the tests' server runs with.
pub const LEASE_TTL: Duration = Duration::from_secs(5);
/// How long a test waits for the port to reach a state.
pub const DEADLINE: Duration = Duration::from_secs(60);

pub type Ports = PortServiceClient<InterceptedService<Channel, ClientAuth>>;

/// One component of a generated port: its name, whether its parity test
/// file is written, and extra lines for its `[[component]]` table.
#[derive(Debug, Clone)]
pub struct Comp {
    pub name: String,
    pub test_file: bool,
    pub extra: String,
}

impl Comp {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.into(),
            test_file: true,
            extra: String::new(),
        }
    }

    /// Its parity test file is not written (P2 must refuse).
    pub fn without_test_file(mut self) -> Self {
        self.test_file = false;
        self
    }

    pub fn with(mut self, lines: &str) -> Self {
        self.extra.push_str(lines);
        self.extra.push('\n');
        self
    }
}

/// A running server on a manual clock and a port repository beside it.
#[derive(Debug)]
pub struct Harness {
    pub dir: tempfile::TempDir,
    pub server: Server,
    pub clock: Arc<ManualClock>,
    pub token: Option<Token>,
    pub channel: Channel,
}

impl Harness {
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// With `token`, every call must carry it.
    pub async fn start_with(token: Option<Token>) -> Self {
        Self::start_config(token, |_| {}).await
    }

    /// With `token`, and the server's config changed by `change`.
    pub async fn start_config(
        token: Option<Token>,
        change: impl FnOnce(&mut ServerConfig),
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("repo")).expect("repo folder");
        let store = Store::open_path(&dir.path().join("state.db"))
            .await
            .expect("store");
        let clock = Arc::new(ManualClock::default());
        let config = ServerConfig {
            scheduler: SchedulerConfig {
                lease_ttl: LEASE_TTL,
                // Leases are checked when a test moves the clock ([`Self::expire`]).
                tick: Duration::from_secs(3600),
                fixed_fleet: false,
                ..SchedulerConfig::default()
            },
            token: token.clone(),
            clock: clock.clone(),
            // The gate's tests run agents (the replay stand-ins).
            agents: fvd_workspace::agent::AgentPolicy::allowing(),
            resume_on_start: false,
            ..ServerConfig::default()
        };
        let mut config = config;
        change(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let server = fvd_orchestrator::start(listener, store, config)
            .await
            .expect("server");
        let channel = Channel::from_shared(server.url())
            .expect("url")
            .connect()
            .await
            .expect("channel");
        Self {
            dir,
            server,
            clock,
            token,
            channel,
        }
    }

    pub fn repo(&self) -> PathBuf {
        self.dir.path().join("repo")
    }

    /// A port client carrying this harness's token.
    pub fn ports(&self) -> Ports {
        self.ports_with(self.token.clone())
    }

    pub fn ports_with(&self, token: Option<Token>) -> Ports {
        PortServiceClient::with_interceptor(self.channel.clone(), ClientAuth::new(token))
    }

    /// A simulated worker with no GPU and four CPU slots, registered.
    pub async fn worker(&self, id: &str) -> SimWorker {
        SimWorker::connect(
            self.channel.clone(),
            self.token.clone(),
            sim_worker::register(id, 0, 4),
        )
        .await
        .unwrap_or_else(|e| panic!("worker {id} could not register: {e}"))
    }

    /// Writes `tests/local_tests/<family>/port.toml` (complete prep
    /// handoff, then `prep_extra`, then the components and `tail`) and the
    /// components' parity test files; returns the spec's path.
    pub fn write_port(
        &self,
        family: &str,
        comps: &[Comp],
        prep_extra: &str,
        tail: &str,
    ) -> PathBuf {
        let repo = self.repo();
        let dir = repo.join("tests/local_tests").join(family);
        std::fs::create_dir_all(&dir).expect("port folder");
        let names: Vec<&str> = comps.iter().map(|c| c.name.as_str()).collect();
        let mut spec = prep(family, &names.join(", "), prep_extra);
        for c in comps {
            let rel = format!("tests/local_tests/{family}/test_{}_parity.py", c.name);
            if c.test_file {
                std::fs::write(
                    repo.join(&rel),
                    "def test_parity():\n    assert True  # never run: a simulated worker answers\n",
                )
                .expect("parity test");
            }
            spec.push_str(&format!(
                "\n[[component]]\nname = \"{}\"\ntype = \"generic\"\nparity_test = \"{rel}\"\ncoverage_scope = \"implementation_subcomponent\"\n{}",
                c.name, c.extra
            ));
        }
        spec.push_str(tail);
        let path = dir.join("port.toml");
        std::fs::write(&path, spec).expect("port.toml");
        path
    }

    /// Submits the spec at `path` as `fvd submit` does.
    pub async fn submit(
        &self,
        family: &str,
        path: &Path,
    ) -> Result<pb::SubmitResponse, tonic::Status> {
        let spec_toml = std::fs::read_to_string(path).expect("read spec");
        self.submit_text(family, path, &spec_toml).await
    }

    pub async fn submit_text(
        &self,
        family: &str,
        path: &Path,
        spec_toml: &str,
    ) -> Result<pb::SubmitResponse, tonic::Status> {
        self.ports()
            .submit(pb::SubmitRequest {
                family: family.into(),
                repo: self.repo().display().to_string(),
                spec_path: path.display().to_string(),
                spec_toml: spec_toml.into(),
                rerun: false,
                // No commit: the simulated workers run nothing from a checkout.
                commit: String::new(),
            })
            .await
            .map(|r| r.into_inner())
    }

    pub async fn status(&self, family: &str) -> Result<pb::PortSnapshot, tonic::Status> {
        let r = self
            .ports()
            .status(pb::StatusRequest {
                family: family.into(),
            })
            .await?
            .into_inner();
        Ok(r.ports
            .into_iter()
            .next()
            .expect("one port asked, one port"))
    }

    /// Polls the port's snapshot until `done` holds; panics with the last
    /// snapshot at the deadline.
    pub async fn wait_for(
        &self,
        family: &str,
        what: &str,
        done: impl Fn(&pb::PortSnapshot) -> bool,
    ) -> pb::PortSnapshot {
        let start = Instant::now();
        loop {
            let snap = self.status(family).await.ok();
            if let Some(s) = snap.as_ref().filter(|s| done(s)) {
                return s.clone();
            }
            assert!(
                start.elapsed() < DEADLINE,
                "port {family} never reached: {what}; last snapshot: {snap:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the port's state is `state`.
    pub async fn wait_state(&self, family: &str, state: &str) -> pb::PortSnapshot {
        self.wait_for(family, &format!("state {state}"), |s| s.state == state)
            .await
    }

    /// Moves the manual clock past the lease time-to-live and has the
    /// scheduler check its leases; returns once it has.
    pub async fn expire_leases(&self) {
        self.clock.advance_ms(LEASE_TTL.as_millis() as i64 + 1);
        self.server
            .scheduler
            .cast(SchedulerMsg::Tick)
            .expect("scheduler alive");
        // Messages are handled in order: once Counts answers, Tick was handled.
        ractor::call_t!(self.server.scheduler, SchedulerMsg::Counts, 10_000)
            .expect("scheduler answers");
    }
}

/// Waits for the worker's next assignment, up to the deadline.
pub async fn assigned(w: &mut SimWorker) -> pb::AssignJob {
    tokio::time::timeout(DEADLINE, w.next_assign())
        .await
        .unwrap_or_else(|_| panic!("worker {} got no assignment in time", w.id))
        .unwrap_or_else(|| panic!("the stream of worker {} ended", w.id))
}

/// The component an assignment runs (from its `FVD_COMPONENT`).
pub fn component_of(a: &pb::AssignJob) -> &str {
    a.env.get("FVD_COMPONENT").map(String::as_str).unwrap_or("")
}

/// Answers the next `n` assignments of `w`, each with `answer(component)`.
pub async fn answer(w: &mut SimWorker, n: usize, answer: impl Fn(&str) -> pb::JobFinished) {
    for _ in 0..n {
        let a = assigned(w).await;
        w.run(&a, answer(component_of(&a))).await;
    }
}

/// The component's snapshot in `s`.
pub fn comp<'a>(s: &'a pb::PortSnapshot, name: &str) -> &'a pb::ComponentSnapshot {
    s.components
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no component {name} in {s:#?}"))
}

/// `(phase, outcome)` of each recorded gate event, in order.
pub fn gate(s: &pb::PortSnapshot) -> Vec<(String, String)> {
    s.gate_events
        .iter()
        .map(|g| (g.phase.clone(), g.outcome.clone()))
        .collect()
}

/// The latest gate event of `phase`.
pub fn event<'a>(s: &'a pb::PortSnapshot, phase: &str) -> &'a pb::GateEvent {
    s.gate_events
        .iter()
        .rev()
        .find(|g| g.phase == phase)
        .unwrap_or_else(|| panic!("no gate event of {phase} in {s:#?}"))
}

/// A complete prep handoff for `family` (every field decided, no value
/// that looks like a token), plus `extra` lines that override or add.
fn prep(family: &str, components: &str, extra: &str) -> String {
    let fields = [
        ("model_family", family.to_string()),
        ("workload_types", "T2V".into()),
        ("official_ref", format!("upstream.{family}")),
        ("official_ref_dir", "upstream".into()),
        ("official_ref_commit", "unknown".into()),
        ("hf_weights_path", "none".into()),
        ("hf_revision", "default".into()),
        ("local_weights_dir", format!("weights/{family}")),
        ("source_layout", "custom".into()),
        ("model_index_class", "none".into()),
        ("components_seen", components.into()),
        ("needs_conversion", "no".into()),
        ("hf_token_env", "HF_TOKEN".into()),
        ("dependency_changes", "none".into()),
        ("official_env_status", "imports_ok".into()),
        (
            "local_tests_readme",
            format!("tests/local_tests/{family}/README.md"),
        ),
        (
            "port_state_file",
            format!("tests/local_tests/{family}/PORT_STATUS.md"),
        ),
        ("gitignore_entries_added", "none".into()),
        ("next_step", "add-model".into()),
        ("open_questions", "none".into()),
        ("escape_hatch", "none".into()),
    ];
    let overridden: Vec<&str> = extra
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim()))
        .collect();
    let mut out = String::from("[prep]\n");
    for (k, v) in fields {
        if !overridden.contains(&k) {
            out.push_str(&format!("{k} = \"{v}\"\n"));
        }
    }
    out.push_str(extra);
    out.push_str("\n[defaults]\ntimeout_s = 60\n");
    out
}

/// A JUnit report of one passing case (with the xfail/xpass property the
/// worker's pytest plugin adds).
pub fn pass() -> pb::JobFinished {
    finished(
        0,
        r#"<testcase classname="t" name="test_parity"><properties><property name="fvd_outcome" value="passed"/></properties></testcase>"#,
        1,
        0,
        0,
    )
}

/// A JUnit report of one failing case whose assertion says `message`.
pub fn fail(message: &str) -> pb::JobFinished {
    finished(
        1,
        &format!(
            r#"<testcase classname="t" name="test_parity"><failure message="{message}">AssertionError: {message}</failure></testcase>"#
        ),
        1,
        1,
        0,
    )
}

/// A JUnit report of a test module that could not be collected because
/// `module` is not installed.
pub fn missing_module(module: &str) -> pb::JobFinished {
    finished(
        2,
        &format!(
            r#"<testcase classname="" name="test_parity"><error message="collection failure">ImportError while importing the test module.
    import {module}
E   ModuleNotFoundError: No module named '{module}'</error></testcase>"#
        ),
        1,
        0,
        1,
    )
}

fn finished(exit: i32, cases: &str, tests: u32, failures: u32, errors: u32) -> pb::JobFinished {
    pb::JobFinished {
        exit_code: Some(exit),
        duration_ms: 10,
        junit_xml: format!(
            r#"<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="{tests}" failures="{failures}" errors="{errors}" skipped="0"><properties><property name="fvd_integrity" value="clean"/></properties>{cases}</testsuite></testsuites>"#
        ),
        ..Default::default()
    }
}

/// Runs git in `dir` with a fixed identity; panics with its stderr.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args([
            "-c",
            "user.name=fvd-test",
            "-c",
            "user.email=fvd-test@localhost",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}
