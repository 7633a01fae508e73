//! One target per parser of fvd, each with the properties its results must
//! have besides not panicking. Inputs that are not UTF-8 go through the
//! decoder the CLI uses (`fvd_contracts::text::utf8`) and then, lossily,
//! through the parser, as the existing never-panic test did.

use std::path::Path;

use fvd_contracts::kind::{self, ContractKind};
use fvd_contracts::secrets;
use fvd_contracts::verdict::{self, CaseOutcome, JunitEvidence, RunEvidence};
use fvd_contracts::{Finding, block, port_status};

use crate::corpus::Source;
use crate::engine::{Target, signature};

/// Every target, in the order `fvd-fuzz list` prints them.
pub const TARGETS: &[Target] = &[
    Target {
        name: "contract_block",
        run: contract_block,
        dictionary: CONTRACT_TOKENS,
        seeds: &[
            Source::Tree("examples/tinyport/tools/replay", &[".handoff"]),
            Source::Tree("tests/fixtures", &[".md", ".txt"]),
        ],
    },
    Target {
        name: "port_status",
        run: port_status_import,
        dictionary: CONTRACT_TOKENS,
        seeds: &[
            Source::Tree("examples/tinyport", &["PORT_STATUS.md"]),
            Source::Tree("tests/fixtures", &[".md"]),
        ],
    },
    Target {
        name: "port_spec",
        run: port_spec,
        dictionary: SPEC_TOKENS,
        seeds: &[
            Source::Tree("examples", &["port.toml"]),
            Source::Tree("tests/fixtures", &[".toml"]),
        ],
    },
    Target {
        name: "trace_jsonl",
        run: trace_jsonl,
        dictionary: TRACE_TOKENS,
        seeds: &[Source::Tree("tests/fixtures", &[".jsonl"])],
    },
    Target {
        name: "safetensors_header",
        run: safetensors_header,
        dictionary: SAFETENSORS_TOKENS,
        seeds: &[],
    },
    Target {
        name: "npy_header",
        run: npy_header,
        dictionary: NPY_TOKENS,
        seeds: &[],
    },
    Target {
        name: "junit_verdict",
        run: junit_verdict,
        dictionary: JUNIT_TOKENS,
        seeds: &[Source::Tree("tests/fixtures", &[".xml"])],
    },
    Target {
        name: "credentials",
        run: credentials,
        dictionary: CREDENTIALS_TOKENS,
        seeds: &[],
    },
    Target {
        name: "handoff",
        run: handoff,
        dictionary: CONTRACT_TOKENS,
        seeds: &[Source::Tree(
            "examples/tinyport/tools/replay",
            &[".handoff"],
        )],
    },
];

/// The target called `name` (or the self-test below).
pub fn find(name: &str) -> Option<&'static Target> {
    TARGETS
        .iter()
        .chain([&SELFTEST_ABORT])
        .find(|t| t.name == name)
}

/// Not a parser: aborts the process on inputs holding `ABORT`, so the
/// tests can check that a crash which kills the fuzzer is caught and its
/// input recovered. Not in [`TARGETS`].
pub const SELFTEST_ABORT: Target = Target {
    name: "selftest_abort",
    run: |input| {
        if input.windows(5).any(|w| w == b"ABORT") {
            std::process::abort();
        }
        input.len() as u64 % 3
    },
    dictionary: &[b"ABORT"],
    seeds: &[],
};

/// Text of a fuzz input: decoded when it is UTF-8, else the decoder's
/// error is checked and the text taken lossily.
fn text(input: &[u8]) -> std::borrow::Cow<'_, str> {
    match fvd_contracts::text::utf8(input) {
        Ok(t) => t.into(),
        Err(e) => {
            assert!(e.line >= 1 && e.column >= 1, "position of {e:?}");
            String::from_utf8_lossy(input)
        }
    }
}

/// A finding names a field of bounded length and never repeats a secret.
fn check_findings(findings: &[Finding]) {
    check_lengths(findings);
    for f in findings {
        assert!(
            secrets::scan_line(&f.field).is_none() && secrets::scan_line(&f.message).is_none(),
            "a finding repeats a secret-looking value: {f}"
        );
    }
}

/// Findings of the raw block parser: bounded; its callers redact them.
fn check_lengths(findings: &[Finding]) {
    let bound = 4 * fvd_contracts::findings::MAX_KEY_CHARS + 1;
    for f in findings {
        assert!(
            f.field.chars().count() <= bound,
            "finding field of {} chars",
            f.field.chars().count()
        );
    }
}

/// Error messages of bounded length (an echo of the input is cut) that
/// never repeat a secret.
fn check_message(message: &str, bound: usize) {
    assert!(
        message.chars().count() <= bound,
        "a {}-char error message: {}…",
        message.chars().count(),
        message.chars().take(200).collect::<String>()
    );
    assert!(
        secrets::scan_text(message, 1).is_empty(),
        "an error message repeats a secret-looking value"
    );
}

fn messages(findings: &[Finding]) -> Vec<&str> {
    findings
        .iter()
        .take(4)
        .map(|f| f.message.as_str())
        .collect()
}

fn contract_block(input: &[u8]) -> u64 {
    let text = text(input);
    let parsed = block::parse(&text, 1);
    check_lengths(&parsed.findings);
    let fenced = block::fenced_blocks(&text).len();
    // One kind checked as given per input (all twelve would cost twelve
    // times the time), besides the check that infers the kind.
    let k = ContractKind::ALL[input.len() % ContractKind::ALL.len()];
    check_findings(&kind::check_block(k, &text, 1));
    match kind::check(&text, None) {
        Ok(r) => {
            check_findings(&r.findings);
            // What `fvd contracts check --json` prints besides findings.
            if let kind::Summary::Block(fields) = &r.summary {
                for (k, v) in fields {
                    assert!(
                        secrets::scan_line(k).is_none() && secrets::scan_line(v).is_none(),
                        "the summary repeats a secret-looking value"
                    );
                }
            }
            let mut parts = messages(&r.findings);
            let k = r.kind.to_string();
            parts.push(&k);
            signature(&parts) ^ fenced.min(4) as u64
        }
        Err(e) => {
            let e = e.to_string();
            check_message(&e, 2048);
            signature(&[&e])
        }
    }
}

/// Import, render, import again: the second render is the first (fvd
/// rewrites the file in place on every port end), and findings are sane.
fn port_status_import(input: &[u8]) -> u64 {
    let text = text(input);
    let (status, findings) = port_status::import(&text);
    check_findings(&findings);
    let rendered = status.render();
    let (again, _) = port_status::import(&rendered);
    let twice = again.render();
    if twice != rendered {
        let a: Vec<&str> = rendered.lines().collect();
        let b: Vec<&str> = twice.lines().collect();
        let i = a
            .iter()
            .zip(&b)
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len()));
        panic!(
            "render of an import is not stable at line {i}: {:?} vs {:?}",
            a.get(i.saturating_sub(1)..(i + 2).min(a.len())),
            b.get(i.saturating_sub(1)..(i + 2).min(b.len()))
        );
    }
    signature(&messages(&findings))
}

/// A spec parses into identifier-named components only, and its errors
/// are short and secret-free.
fn port_spec(input: &[u8]) -> u64 {
    let text = text(input);
    match fvd_spec::parse(Path::new("port.toml"), &text) {
        Ok(spec) => {
            assert!(fvd_paths::is_identifier(&spec.family));
            for c in &spec.components {
                assert!(
                    fvd_paths::is_identifier(&c.name),
                    "component name {:?} accepted",
                    fvd_paths::shown(&c.name)
                );
                let _ = c.argv();
            }
            signature(&["ok"]) ^ spec.components.len().min(8) as u64
        }
        Err(e) => {
            let e = e.to_string();
            // The message is cut at MAX_MESSAGE_CHARS (and an ellipsis);
            // `port.toml:LINE:COL: ` comes before it.
            check_message(
                &e,
                fvd_paths::MAX_MESSAGE_CHARS + 1 + "port.toml:99999:99999: ".len(),
            );
            signature(&[&e])
        }
    }
}

/// A credentials file (`--auth`) gives valid, distinct names and distinct
/// hashes, or an error at `file:line:col` that repeats no token-long word.
fn credentials(input: &[u8]) -> u64 {
    use fvd_proto::credentials::{self, MAX_ECHOED_WORD};
    let text = text(input);
    match credentials::parse(Path::new("auth.toml"), &text) {
        Ok(entries) => {
            for (i, e) in entries.iter().enumerate() {
                assert!(credentials::valid_name(&e.name), "name {:?}", e.name);
                for other in &entries[..i] {
                    assert_ne!(other.name, e.name, "two entries named {}", e.name);
                    assert_ne!(other.hash, e.hash, "two entries with one token");
                }
            }
            signature(&["ok"]) ^ entries.len().min(8) as u64
        }
        Err(e) => {
            let e = e.to_string();
            let rest = e
                .strip_prefix("auth.toml:")
                .unwrap_or_else(|| panic!("an error without its file: {e}"));
            let mut parts = rest.splitn(3, ':');
            for what in ["line", "column"] {
                let n = parts.next().unwrap_or_default();
                assert!(n.parse::<usize>().is_ok_and(|n| n >= 1), "no {what} in {e}");
            }
            let longest = e
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
                .map(|w| w.chars().count())
                .max()
                .unwrap_or(0);
            assert!(
                longest <= MAX_ECHOED_WORD,
                "an error repeats a {longest}-char word (a token?)"
            );
            check_message(&e, 1024);
            signature(&[&e])
        }
    }
}

fn trace_jsonl(input: &[u8]) -> u64 {
    let text = text(input);
    for line in text.lines().take(64) {
        let _ = fvd_trace::record::parse_line(line);
        // The fast path answers only for lines it fully understands, and
        // then exactly as serde_json does.
        if let (Some(fast), serde) = fvd_trace::record::parse_line_both_ways(line) {
            assert_eq!(Some(&fast), serde.as_ref(), "fast path and serde disagree");
        }
    }
    match fvd_trace::record::parse_trace(Path::new("t.jsonl"), &text) {
        Ok(records) => {
            assert!(records.len() <= text.lines().count());
            signature(&["ok"]) ^ (records.len().min(16) as u64)
        }
        Err(e) => signature(&[&e.to_string()]),
    }
}

/// The first byte sets how many bytes follow the header in the "file".
fn safetensors_header(input: &[u8]) -> u64 {
    let Some((&extra, header)) = input.split_first() else {
        return 0;
    };
    let file_len = 8 + header.len() as u64 + u64::from(extra) * 16;
    match fvd_trace::dumps::parse_safetensors_header(Path::new("d.safetensors"), header, file_len) {
        Ok(d) => {
            for t in &d.tensors {
                let end = t
                    .shape
                    .iter()
                    .try_fold(t.dtype.size() as u64, |a, &d| a.checked_mul(d as u64))
                    .and_then(|bytes| bytes.checked_add(t.offset));
                assert!(
                    t.offset >= 8 + header.len() as u64 && end.is_some_and(|e| e <= file_len),
                    "tensor {:?} runs past its file",
                    t.key
                );
            }
            signature(&["ok"]) ^ d.tensors.len().min(8) as u64
        }
        Err(e) => coarse(&e.to_string()),
    }
}

/// The signature of a header error: its first words only (the rest names
/// the bad value, a new one each time).
fn coarse(message: &str) -> u64 {
    let words: Vec<&str> = message.split_whitespace().skip(1).take(3).collect();
    signature(&[&words.join(" ")])
}

fn npy_header(input: &[u8]) -> u64 {
    let Some((&extra, head)) = input.split_first() else {
        return 0;
    };
    let file_len = head.len() as u64 + u64::from(extra) * 16;
    match fvd_trace::dumps::parse_npy_header(Path::new("x.npy"), head, file_len) {
        Ok((dtype, shape, offset)) => {
            let end = shape
                .iter()
                .try_fold(dtype.size() as u64, |a, &d| a.checked_mul(d as u64))
                .and_then(|bytes| bytes.checked_add(offset));
            assert!(
                end.is_some_and(|e| e <= file_len),
                "npy data runs past its file"
            );
            signature(&["ok"]) ^ shape.len().min(8) as u64
        }
        Err(e) => coarse(&e.to_string()),
    }
}

/// A run is a pass only when its report lists cases and every one passed,
/// whatever the exit code says; the first byte sets the run's other facts.
fn junit_verdict(input: &[u8]) -> u64 {
    let Some((&facts, xml)) = input.split_first() else {
        return 0;
    };
    let xml = text(xml);
    let ev = RunEvidence {
        junit: JunitEvidence::Xml(&xml),
        timed_out: facts & 1 != 0,
        cancelled: facts & 2 != 0,
        exit_code: match facts >> 4 {
            0 => None,
            n => Some(i32::from(n) - 8),
        },
        signal: (facts & 4 != 0).then_some(9),
        output_tail: if facts & 8 != 0 {
            "RuntimeError: CUDA error: out of memory"
        } else {
            "1 passed"
        },
        worker_lost: facts == 0xff,
        plugin: facts & 0x40 != 0,
    };
    let v = verdict::classify(&ev);
    let reason = v.reason();
    assert!(!reason.contains('\n'), "a verdict reason spans lines");
    assert!(reason.chars().count() <= 2 * verdict::MAX_MESSAGE_CHARS + 1);
    if v.is_pass() {
        assert!(!ev.timed_out && !ev.cancelled && !ev.worker_lost);
        let report = verdict::parse_junit(&xml).expect("a pass has a readable report");
        assert!(!report.cases.is_empty(), "a pass with no case");
        assert!(
            report
                .cases
                .iter()
                .all(|c| c.outcome == CaseOutcome::Passed),
            "a pass with a case that did not pass"
        );
    }
    signature(&[v.status().as_str(), &reason])
}

/// The agent's handoff, from its file or its stdout: a valid one has a
/// value, the summary is one line, and nothing kept repeats a secret.
fn handoff(input: &[u8]) -> u64 {
    let Some((&from, rest)) = input.split_first() else {
        return 0;
    };
    let text = text(rest);
    let r = if from & 1 == 0 {
        fvd_workspace::agent::read_handoff("timestep_embed", Some(&text), "")
    } else {
        fvd_workspace::agent::read_handoff("timestep_embed", None, &text)
    };
    assert_eq!(r.status.as_str() == "valid", r.value.is_some());
    assert!(!r.summary.contains('\n'), "a handoff summary spans lines");
    // The summary keeps the last 400 bytes of its findings and the text
    // the last 16 KiB of the block: a cut can turn `xhf_…` (no token) into
    // `hf_…`, so the first word of a cut record is not checked.
    let uncut = |s: &str, max: usize| -> String {
        if s.len() + 4 <= max {
            s.to_string()
        } else {
            s.split_once(char::is_whitespace)
                .map_or(String::new(), |(_, rest)| rest.to_string())
        }
    };
    assert!(
        secrets::scan_text(&uncut(&r.summary, 400), 1).is_empty()
            && secrets::scan_text(&uncut(&r.text, 16 * 1024), 1).is_empty(),
        "a handoff record repeats a secret-looking value"
    );
    signature(&[r.status.as_str(), &r.summary])
}

const CONTRACT_TOKENS: &[&[u8]] = &[
    b"```text\n",
    b"```\n",
    b"\n- ",
    b": ",
    b"  ",
    b"none",
    b"unknown",
    b"unknown (searched: grep -r x official/)",
    b"<placeholder>",
    b"component: ",
    b"parity_status: non_skip_pass",
    b"parity_status: debug_red",
    b"next_step: ask_user",
    b"next_step: blocked",
    b"next_step: phase_5_conversion_retry",
    b"escape_hatch:\n  needs_user_input: yes\n  question: q\n",
    b"options:\n    - a\n    - b\n",
    b"files_changed:\n  - a.py\n",
    b"blocker: none",
    b"E001",
    b"Q001",
    b"I001",
    b"## Component Matrix\n",
    b"## Escape Hatches\n",
    b"## Current Phase\n",
    b"| --- | --- |\n",
    b"| a | b | c |\n",
    b"# Tiny Port Status\n",
    b"model_family: tinyport",
    b"hf_token_env: HF_TOKEN",
    b"hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    b"Bearer abcdefghijklmnopqrstuvwxyz012345",
    b"api_key = s3cr3t-v4lue-0123456789abcdef",
    b"`",
    b"|",
];

const SPEC_TOKENS: &[&[u8]] = &[
    b"[prep]\n",
    b"[defaults]\n",
    b"[[component]]\n",
    b"[component.trace]\n",
    b"[agent]\n",
    b"name = \"",
    b"name = \"../../x\"\n",
    b"name = \"c#trace\"\n",
    b"model_family = \"tinyport\"\n",
    b"type = \"generic\"\n",
    b"parity_test = \"t.py\"\n",
    b"coverage_scope = \"both\"\n",
    b"command = [\"a\", \"{test}\"]\n",
    b"env = [\"HF_TOKEN\"]\n",
    b"agent = true\n",
    b"layers = '^blocks\\.\\d+$'\n",
    b"rename = ['^a=>b']\n",
    b"tol = [\"abs_mean=0.01\"]\n",
    b"steps = \"0,15\"\n",
    b"depth = 3\n",
    b"output = \"{dir}/p<rank>.jsonl\"\n",
    b"labels = { site = \"a\" }\n",
    b" = ",
    b"\"\"\"",
    b"'''",
    b"[",
    b"]",
    b"{",
    b"}",
    b"hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    b"\\u00e9",
    b"\\\"",
];

const CREDENTIALS_TOKENS: &[&[u8]] = &[
    b"[[token]]\n",
    b"name = \"alice\"\n",
    b"role = \"porter\"\n",
    b"role = \"admin\"\n",
    b"role = \"boss\"\n",
    b"sha256 = \"",
    b"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    b"fvd_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    b"\"\n",
    b" = ",
    b"[",
    b"]",
    b"\"",
    b"#",
];

const TRACE_TOKENS: &[&[u8]] = &[
    b"{\"module\": \"blocks.0\", ",
    b"\"tensor\": \"out\", ",
    b"\"step\": 0, ",
    b"\"rank\": 1, ",
    b"\"stats\": {\"abs_mean\": 0.5, \"shape\": [1, 2]}",
    b"\"shape\": [2, 3]",
    b"\"dtype\": \"float32\"",
    b"NaN",
    b"-Infinity",
    b"1e-310",
    b"}\n",
    b"\\u0000",
    b"[",
    b"]",
];

const SAFETENSORS_TOKENS: &[&[u8]] = &[
    b"{\"a:out\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
    b"\"__metadata__\":{\"fvd_order\":\"[\\\"a:out\\\"]\"}",
    b"\"dtype\":\"BF16\"",
    b"\"dtype\":\"F64\"",
    b"\"shape\":[4611686018427387904,4]",
    b"\"data_offsets\":[0,18446744073709551615]",
    b",",
    b"{",
    b"}",
];

const NPY_TOKENS: &[&[u8]] = &[
    b"\x93NUMPY",
    b"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
    b"'descr': '<V2'",
    b"'shape': ()",
    b"'shape': (4294967296, 4294967296)",
    b"'fortran_order': True",
    b"(",
    b")",
    b",",
];

const JUNIT_TOKENS: &[&[u8]] = &[
    b"<testsuite>",
    b"</testsuite>",
    b"<testsuites>",
    b"<testcase classname=\"t\" name=\"test_a\">",
    b"<testcase classname=\"t\" name=\"test_b\"/>",
    b"</testcase>",
    b"<failure message=\"assert 1 == 2\">trace</failure>",
    b"<error message=\"collection failure\"/>",
    b"<skipped type=\"pytest.skip\" message=\"no dep\"/>",
    b"<skipped type=\"pytest.xfail\" message=\"xfail\"/>",
    b"<properties><property name=\"fvd_outcome\" value=\"xpassed\"/></properties>",
    b"<property name=\"fvd_outcome\" value=\"passed\"/>",
    b"&amp;",
    b"&#0;",
    b"<![CDATA[",
    b"]]>",
    b"<?xml version=\"1.0\"?>",
];
