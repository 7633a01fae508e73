//! The proxy between a client and the repository's scripted model server
//! (`tests/agents/model_server.py`, a real HTTP server on loopback that
//! demands the real key): every protocol streamed and not, metered to the
//! server's own figures; the token checked and the key never handed out;
//! retries; and the trips (a refused key, a spent budget, an upstream that
//! cannot be reached).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fvd_agentproxy::{
    Api, Config, Limits, Price, PriceTable, Proxy, Retry, Secret, Tokens, Trip, Upstream,
};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

const KEY: &str = "sk-test-key-0f1e2d3c4b5a69788796a5b4c3d2e1f0";
const MARK: &str = "MARKER-proxy-test";

struct Server {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(key: &str, script: Value) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let script_path = dir.path().join("script.json");
        std::fs::write(&script_path, script.to_string()).unwrap();
        let key_file = dir.path().join("key");
        std::fs::write(&key_file, key).unwrap();
        let port_file = dir.path().join("port");
        let log = dir.path().join("log.jsonl");
        let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/agents/model_server.py");
        let child = Command::new("python3")
            .arg(server)
            .arg("--script")
            .arg(&script_path)
            .arg("--key-file")
            .arg(&key_file)
            .arg("--port-file")
            .arg(&port_file)
            .arg("--log")
            .arg(&log)
            .spawn()
            .expect("python3 runs the scripted model server");
        let deadline = Instant::now() + Duration::from_secs(20);
        let port = loop {
            if let Ok(p) = std::fs::read_to_string(&port_file) {
                break p.trim().parse().unwrap();
            }
            assert!(Instant::now() < deadline, "the model server did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        Server {
            child,
            port,
            log,
            _dir: dir,
        }
    }

    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The usage the server returned, summed over its successful replies.
    fn usage(&self) -> Tokens {
        let mut t = Tokens::default();
        for r in self.requests().iter().filter(|r| r["status"] == 200) {
            let u = &r["usage"];
            t.add(&Tokens {
                input: u["input"].as_u64().unwrap(),
                output: u["output"].as_u64().unwrap(),
                cache_read: u["cache_read"].as_u64().unwrap(),
                cache_write: u["cache_write"].as_u64().unwrap(),
            });
        }
        t
    }
}

fn script(steps: Value) -> Value {
    json!({"scripts": [{"name": "t", "marker": MARK,
        "usage": {"input": 1000, "output": 50, "cache_read": 200, "cache_write": 10},
        "steps": steps}]})
}

fn price() -> Price {
    Price {
        input: 3.0,
        output: 15.0,
        cache_read: 0.3,
        cache_write: 3.75,
    }
}

fn config(api: Api, upstream: &str, key: &str, limits: Limits) -> Config {
    Config {
        api,
        upstream: Upstream::parse(upstream).unwrap(),
        key: Secret::new(key.into()),
        limits,
        prices: PriceTable {
            models: [("m1".to_string(), price())].into(),
            fallback: None,
        },
        retry: Retry {
            retries: 2,
            base: Duration::from_millis(5),
            max_wait: Duration::from_millis(50),
        },
        label: "tiny/c/1".into(),
    }
}

/// One request through the proxy: its status and body.
async fn post(url: &str, path: &str, headers: &[(&str, &str)], body: Value) -> (u16, String) {
    let rest = url.strip_prefix("http://").unwrap();
    let authority = rest.split('/').next().unwrap();
    let tcp = tokio::net::TcpStream::connect(authority).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    fvd_telemetry::spawn(async move {
        let _ = conn.await;
    });
    let mut b = hyper::Request::post(path)
        .header("host", authority)
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = tx
        .send_request(b.body(Full::new(Bytes::from(body.to_string()))).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// A request of `protocol` with the marker and one tool, so the server
/// walks its script.
fn request(protocol: &str, stream: bool) -> (String, Value) {
    let text = format!("fix it {MARK}");
    match protocol {
        "anthropic" => (
            "/v1/messages".into(),
            json!({"model": "m1", "max_tokens": 100, "stream": stream,
                "tools": [{"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}],
                "messages": [{"role": "user", "content": text}]}),
        ),
        "chat" => (
            "/v1/chat/completions".into(),
            json!({"model": "m1", "stream": stream,
                "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}],
                "messages": [{"role": "user", "content": text}]}),
        ),
        "responses" => (
            "/v1/responses".into(),
            json!({"model": "m1", "stream": stream,
                "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}],
                "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}]}),
        ),
        "gemini" => (
            if stream {
                "/v1beta/models/m1:streamGenerateContent?alt=sse".into()
            } else {
                "/v1beta/models/m1:generateContent".into()
            },
            json!({"tools": [{"functionDeclarations": [{"name": "run_shell_command", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}]}],
                "contents": [{"role": "user", "parts": [{"text": text}]}]}),
        ),
        _ => unreachable!(),
    }
}

fn api_of(protocol: &str) -> (Api, &'static str, &'static str) {
    match protocol {
        "anthropic" => (Api::Anthropic, "", "x-api-key"),
        "chat" | "responses" => (Api::OpenAi, "/v1", "authorization"),
        _ => (Api::Gemini, "", "x-goog-api-key"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_protocol_is_forwarded_with_the_key_and_metered_to_the_servers_figures() {
    let server = Server::start(KEY, script(json!([{"loop": {"bash": "true"}}])));
    for protocol in ["anthropic", "chat", "responses", "gemini"] {
        for stream in [false, true] {
            let (api, base, header) = api_of(protocol);
            let upstream = format!("http://127.0.0.1:{}{base}", server.port);
            let proxy = Proxy::start(config(api, &upstream, KEY, Limits::default()))
                .await
                .unwrap();
            assert!(proxy.base_url().ends_with(base), "{}", proxy.base_url());
            assert!(!proxy.token().unwrap().contains(KEY));
            let token = if header == "authorization" {
                format!("Bearer {}", proxy.token().unwrap())
            } else {
                proxy.token().unwrap().to_string()
            };
            let before = server.usage();
            let (path, body) = request(protocol, stream);
            let (status, text) = post(&proxy.base_url(), &path, &[(header, &token)], body).await;
            assert_eq!(status, 200, "{protocol} stream={stream}: {text}");
            assert!(
                text.contains("true"),
                "{protocol} stream={stream}: the tool call reached the client: {text}"
            );
            assert!(!text.contains(KEY));
            // The usage is metered once the reply's last byte passed.
            let deadline = Instant::now() + Duration::from_secs(10);
            while proxy.usage().requests == 0 || proxy.usage().tokens == Tokens::default() {
                assert!(Instant::now() < deadline, "{protocol}: never metered");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let mut want = server.usage();
            want.input -= before.input;
            want.output -= before.output;
            want.cache_read -= before.cache_read;
            want.cache_write -= before.cache_write;
            let u = proxy.usage();
            assert_eq!(u.tokens, want, "{protocol} stream={stream}");
            assert!((u.cost_usd - price().cost(&want)).abs() < 1e-12, "{u:?}");
            assert_eq!(u.models.iter().collect::<Vec<_>>(), ["m1"], "{u:?}");
            assert_eq!(proxy.tripped(), None);
        }
    }
    // The server saw the real key on every request it answered.
    let log = server.requests();
    assert_eq!(log.len(), 8, "{log:?}");
    assert!(log.iter().all(|r| r["auth"] == "ok"), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_the_token_never_reaches_the_upstream() {
    let server = Server::start(KEY, script(json!([{"loop": {"bash": "true"}}])));
    let upstream = format!("http://127.0.0.1:{}", server.port);
    let proxy = Proxy::start(config(Api::Anthropic, &upstream, KEY, Limits::default()))
        .await
        .unwrap();
    let (path, body) = request("anthropic", false);
    for headers in [
        vec![],
        vec![("x-api-key", "fvd-wrong")],
        // The real key is no token either.
        vec![("x-api-key", KEY)],
    ] {
        let (status, text) = post(&proxy.base_url(), &path, &headers, body.clone()).await;
        assert_eq!(status, 401, "{text}");
    }
    assert!(server.requests().is_empty());
    assert_eq!(proxy.usage().refused, 3);
}

/// The proxy of an attempt adopted after a restart of the orchestrator is
/// started with the token's digest: the agent's token still gets through,
/// nothing else does, and the new proxy has no token to hand out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_started_again_from_the_token_s_digest_admits_the_agent_s_token_only() {
    let server = Server::start(KEY, script(json!([{"loop": {"bash": "true"}}])));
    let upstream = format!("http://127.0.0.1:{}", server.port);
    let first = Proxy::start(config(Api::Anthropic, &upstream, KEY, Limits::default()))
        .await
        .unwrap();
    let token = first.token().unwrap().to_string();
    let digest = first.token_digest();
    drop(first);
    let again = Proxy::start_with(
        config(Api::Anthropic, &upstream, KEY, Limits::default()),
        fvd_agentproxy::AttemptToken::from_digest_hex(&digest).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(again.token(), None);
    assert_eq!(again.token_digest(), digest);
    let (path, body) = request("anthropic", false);
    for (headers, want) in [
        (vec![("x-api-key", token.as_str())], 200),
        (vec![("x-api-key", "fvd-wrong")], 401),
        (vec![("x-api-key", digest.as_str())], 401),
    ] {
        let (status, text) = post(&again.base_url(), &path, &headers, body.clone()).await;
        assert_eq!(status, want, "{headers:?}: {text}");
    }
    assert_eq!(server.requests().len(), 1);
    assert_eq!(again.usage().refused, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_upstream_is_retried_then_trips_the_proxy() {
    // The first request at step 0 fails once: the retry gets through.
    let server = Server::start(
        KEY,
        script(
            json!([{"bash": "true", "fail": {"status": 500, "times": 1}},
                      {"bash": "true", "fail": {"status": 503, "times": 9}}]),
        ),
    );
    let upstream = format!("http://127.0.0.1:{}/v1", server.port);
    let proxy = Proxy::start(config(Api::OpenAi, &upstream, KEY, Limits::default()))
        .await
        .unwrap();
    let auth = format!("Bearer {}", proxy.token().unwrap());
    let (path, body) = request("chat", true);
    let (status, text) = post(&proxy.base_url(), &path, &[("authorization", &auth)], body).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(proxy.usage().retries, 1);
    assert_eq!(proxy.tripped(), None);
    // Step 1 keeps failing: two retries, then the 503 reaches the client
    // and the proxy is tripped.
    let (path, mut body) = request("chat", false);
    body["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": "ran it"}));
    let (status, _) = post(&proxy.base_url(), &path, &[("authorization", &auth)], body).await;
    assert_eq!(status, 503);
    assert_eq!(proxy.usage().retries, 3);
    assert!(
        matches!(
            proxy.tripped(),
            Some(Trip::Upstream {
                status: Some(503),
                ..
            })
        ),
        "{:?}",
        proxy.tripped()
    );
    let statuses: Vec<_> = server
        .requests()
        .iter()
        .map(|r| r["status"].clone())
        .collect();
    assert_eq!(statuses, [500, 200, 503, 503, 503]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_key_trips_the_proxy_at_once() {
    let server = Server::start(KEY, script(json!([{"loop": {"bash": "true"}}])));
    let upstream = format!("http://127.0.0.1:{}", server.port);
    let proxy = Proxy::start(config(
        Api::Anthropic,
        &upstream,
        "sk-wrong-key",
        Limits::default(),
    ))
    .await
    .unwrap();
    let (path, body) = request("anthropic", true);
    let (status, _) = post(
        &proxy.base_url(),
        &path,
        &[("x-api-key", proxy.token().unwrap())],
        body.clone(),
    )
    .await;
    assert_eq!(status, 401);
    assert_eq!(proxy.tripped(), Some(Trip::Auth { status: 401 }));
    // Not retried, and nothing more goes out.
    let (status, text) = post(
        &proxy.base_url(),
        &path,
        &[("x-api-key", proxy.token().unwrap())],
        body,
    )
    .await;
    assert_eq!(status, 403, "{text}");
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_budget_stops_forwarding_before_the_request_that_would_cross_it() {
    let server = Server::start(KEY, script(json!([{"loop": {"bash": "true"}}])));
    let upstream = format!("http://127.0.0.1:{}", server.port);
    // One reply costs 1000*3 + 50*15 + 200*0.3 + 10*3.75 per million USD
    // = 0.0038475, its prompt 0.0030975: after two, 0.002305 is left, less
    // than the third's prompt alone, so the third is refused before it is
    // forwarded (issue #43: the cap holds before the request).
    let limits = Limits {
        usd: Some(0.01),
        ..Limits::default()
    };
    let proxy = Proxy::start(config(Api::Anthropic, &upstream, KEY, limits))
        .await
        .unwrap();
    let mut trips = proxy.trips();
    let (path, body) = request("anthropic", true);
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let (status, _) = post(
            &proxy.base_url(),
            &path,
            &[("x-api-key", proxy.token().unwrap())],
            body.clone(),
        )
        .await;
        statuses.push(status);
        // Metering ends with the streamed body; wait for it (bounded)
        // before the next request, as an agent waits for its reply.
        let deadline = Instant::now() + Duration::from_secs(10);
        while proxy.usage().tokens.total()
            < 1260 * statuses.iter().filter(|s| **s == 200).count() as u64
        {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    assert_eq!(statuses, [200, 200, 403, 403, 403]);
    tokio::time::timeout(Duration::from_secs(5), trips.wait_for(Option::is_some))
        .await
        .unwrap()
        .unwrap();
    let Some(Trip::Budget(why)) = proxy.tripped() else {
        panic!("{:?}", proxy.tripped())
    };
    assert!(why.starts_with("0.0077 of 0.01 USD spent"), "{why}");
    let u = proxy.usage();
    // Under the cap: the request that would have crossed it never left.
    assert!(u.cost_usd < 0.01, "{u:?}");
    assert_eq!(server.requests().len(), 2);
    assert_eq!(u.refused, 3);
}

/// The 200k-token reply of issue #43 on a $0.05 cap: the proxy lowers the
/// request's `max_tokens` to what the cap leaves at the model's output
/// price before forwarding it, so the reply (which, like a real API's,
/// keeps to the cap asked) costs at most its prompt past the cap; the next
/// request is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_of_any_size_is_held_to_what_the_cap_leaves() {
    let server = Server::start(
        KEY,
        json!({"scripts": [{"name": "t", "marker": MARK,
            "usage": {"input": 1000, "output": 200_000, "cache_read": 0, "cache_write": 0},
            "steps": [{"loop": {"bash": "true"}}]}]}),
    );
    let upstream = format!("http://127.0.0.1:{}", server.port);
    let limits = Limits {
        usd: Some(0.05),
        ..Limits::default()
    };
    let proxy = Proxy::start(config(Api::Anthropic, &upstream, KEY, limits))
        .await
        .unwrap();
    let (path, mut body) = request("anthropic", false);
    body["max_tokens"] = json!(200_000);
    let h = [("x-api-key", proxy.token().unwrap())];
    let (status, text) = post(&proxy.base_url(), &path, &h, body.clone()).await;
    assert_eq!(status, 200, "{text}");
    let asked = server.requests();
    // 0.05 USD / 15 USD per million output tokens.
    assert_eq!(asked[0]["max_tokens"], 3333, "{asked:?}");
    assert_eq!(asked[0]["usage"]["output"], 3333, "{asked:?}");
    let u = proxy.usage();
    // Past the cap by the prompt (1000 input tokens: 0.003 USD), never by
    // the 200k tokens of output (3 USD) it asked for.
    assert!(u.cost_usd > 0.05 && u.cost_usd <= 0.05 + 0.003, "{u:?}");
    let (status, text) = post(&proxy.base_url(), &path, &h, body).await;
    assert_eq!(status, 403, "{text}");
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_the_turn_cap_is_refused_and_trips_the_proxy() {
    let server = Server::start(KEY, script(json!([{"loop": {"bash": "true"}}])));
    let upstream = format!("http://127.0.0.1:{}", server.port);
    let limits = Limits {
        turns: Some(2),
        ..Limits::default()
    };
    let proxy = Proxy::start(config(Api::Anthropic, &upstream, KEY, limits))
        .await
        .unwrap();
    let (path, body) = request("anthropic", false);
    // A side request (no tools: a title, a summary) is not a turn.
    let mut side = body.clone();
    side.as_object_mut().unwrap().remove("tools");
    let h = [("x-api-key", proxy.token().unwrap())];
    assert_eq!(post(&proxy.base_url(), &path, &h, side).await.0, 200);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(post(&proxy.base_url(), &path, &h, body.clone()).await.0);
    }
    assert_eq!(statuses, [200, 200, 403]);
    assert_eq!(proxy.tripped(), Some(Trip::Turns("2 of 2 turns".into())));
    assert_eq!(server.requests().len(), 3);
    assert_eq!((proxy.usage().requests, proxy.usage().turns), (3, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_trips_the_proxy_after_its_retries() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let proxy = Proxy::start(config(
        Api::Gemini,
        &format!("http://127.0.0.1:{port}"),
        KEY,
        Limits::default(),
    ))
    .await
    .unwrap();
    let (path, body) = request("gemini", false);
    let (status, text) = post(
        &proxy.base_url(),
        &path,
        &[("x-goog-api-key", proxy.token().unwrap())],
        body,
    )
    .await;
    assert_eq!(status, 502, "{text}");
    assert!(!text.contains(KEY));
    assert!(
        matches!(proxy.tripped(), Some(Trip::Upstream { status: None, .. })),
        "{:?}",
        proxy.tripped()
    );
    assert_eq!(proxy.usage().retries, 2);
}
