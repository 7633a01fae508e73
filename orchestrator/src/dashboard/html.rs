//! The pages, server-side, with maud: every interpolated value is
//! HTML-escaped by the macro, so a reason, a log line or a diff can never
//! become markup. A page is a layout around live sections; each section is
//! rendered by one function that both the page and its event stream call,
//! so an update is the same markup the page would have on a reload.

use std::hash::{Hash, Hasher};

use fvd_store::AttemptRow;
use fvd_store::traces::TraceInvestigation;
use maud::{DOCTYPE, Markup, PreEscaped, html};

use super::views::{
    ComponentPage, ComponentView, IndexView, LogView, PortView, QuestionView, SEARCH_CONTEXT,
    SearchView, TimelineView, WorkersView,
};

/// What the pages may offer besides reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No orchestrator in this process (`fvd dashboard --repo`): no form.
    ReadOnly,
    /// Answers go to the orchestrator; `token` says whether it wants its
    /// bearer token with each.
    Answer { token: bool },
}

/// A live section: the page's element and the payload of its updates
/// carry the same hash, so a client replaces only what changed.
pub struct Section {
    pub id: &'static str,
    pub html: String,
}

impl Section {
    pub fn new(id: &'static str, inner: Markup) -> Self {
        Section {
            id,
            html: inner.into_string(),
        }
    }

    pub fn hash(&self) -> String {
        let mut h = std::hash::DefaultHasher::new();
        self.html.hash(&mut h);
        format!("{:016x}", h.finish())
    }

    fn render(&self) -> Markup {
        html! {
            div id=(self.id) data-live data-hash=(self.hash()) { (PreEscaped(&self.html)) }
        }
    }
}

/// `2024-05-01 12:03:04Z` from milliseconds since the epoch; empty for 0.
pub fn time(ms: i64) -> String {
    if ms <= 0 {
        return String::new();
    }
    let (y, m, d, h, mi, s) = fvd_telemetry::civil_utc(ms.div_euclid(1000));
    format!("{y:04}-{m:02}-{d:02} {h:02}:{mi:02}:{s:02}Z")
}

fn duration(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1000)
    }
}

/// Percent-encodes a path segment (families and components are plain
/// names, but a link must not break on an odd one).
pub fn seg(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn status(s: &str) -> Markup {
    html! { span class={ "st st-" (s) } { (s) } }
}

/// Runs on a time axis, a lane per worker and GPU; each bar links to its
/// run's page and says what it was when hovered.
fn timeline(t: &TimelineView) -> Markup {
    let span = (t.t1_ms - t.t0_ms).max(1) as f64;
    let pct = |ms: i64| (ms - t.t0_ms) as f64 * 100.0 / span;
    html! {
        @if t.lanes.is_empty() && t.requeued.is_empty() {
            p.empty { "No run started yet." }
        }
        @if !t.lanes.is_empty() {
            div.timeline data-t0-ms=(t.t0_ms) data-t1-ms=(t.t1_ms) {
                p.axis { span.t { (time(t.t0_ms)) } " → " span.t { (time(t.t1_ms)) } " · " (duration((t.t1_ms - t.t0_ms) as u64)) }
                @for lane in &t.lanes {
                    div.lane {
                        span.label { (lane.label) }
                        div.track {
                            @for b in &lane.bars {
                                @let left = pct(b.start_ms);
                                @let width = (pct(b.end_ms) - left).max(0.4);
                                a class={ "bar st-" (b.outcome) @if b.running { " running" } }
                                    href={ "/ports/" (seg(&b.family)) "/components/" (seg(&b.component)) "?run=" (b.run_no) }
                                    style={ "left:" (format!("{left:.2}")) "%;width:" (format!("{width:.2}")) "%" }
                                    data-component=(b.component) data-run=(b.run_no) data-outcome=(b.outcome)
                                    title={ (b.family) " · " (b.component) " run " (b.run_no) ": " (b.outcome) ", " (duration((b.end_ms - b.start_ms) as u64)) } {
                                    (b.component) " #" (b.run_no)
                                }
                            }
                        }
                    }
                }
            }
        }
        @if !t.requeued.is_empty() {
            p.requeued {
                "Queued again after losing their worker (on no lane: the store no longer names it): "
                @for (i, b) in t.requeued.iter().enumerate() {
                    @if i > 0 { ", " }
                    a href={ "/ports/" (seg(&b.family)) "/components/" (seg(&b.component)) "?run=" (b.run_no) } data-requeued=(b.job_id) { (b.component) " #" (b.run_no) }
                    " (started " span.t { (time(b.start_ms)) } ")"
                }
            }
        }
    }
}

/// Buttons that show only the rows of one state in the section `target`
/// (`data-status`/`data-state` rows); the choice is kept in the URL
/// (`?show=STATE`) and survives the section's live updates.
fn filter(target: &str, states: &[&str]) -> Markup {
    html! {
        nav.filter data-filter-for=(target) {
            "show: "
            button type="button" data-value="" { "all" }
            @for s in states { " " button type="button" data-value=(s) { (s) } }
        }
    }
}

/// Hours of GPU time, for people.
fn gpu_hours(h: f64) -> String {
    if h <= 0.0 {
        String::new()
    } else if h < 0.01 {
        format!("{:.1} GPU-s", h * 3600.0)
    } else {
        format!("{h:.2} GPU-h")
    }
}

fn layout(title: &str, events: &str, mode: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · fvd" }
                link rel="stylesheet" href="/assets/dashboard.css";
                script src="/assets/dashboard.js" defer {}
            }
            body data-events=(events) {
                header {
                    a.brand href="/" { "fvd" }
                    nav { a href="/" { "ports" } a href="/workers" { "workers" } }
                    span.mode { (mode) }
                    span #live title="live updates" { "○ connecting" }
                }
                main { (body) }
            }
        }
    }
}

// ----- index ----------------------------------------------------------------

pub fn index_sections(v: &IndexView) -> Vec<Section> {
    vec![Section::new(
        "ports",
        html! {
            @if v.ports.is_empty() {
                p.empty { "No port yet: " code { "fvd submit --family F" } " starts one." }
            } @else {
                table {
                    thead { tr { th { "family" } th { "phase" } th { "state" } th { "components" } th { "questions" } th { "started" } th { "updated" } } }
                    tbody {
                        @for p in &v.ports {
                            tr data-family=(p.family) data-status=(p.state) {
                                td { a href={ "/ports/" (seg(&p.family)) } { (p.family) } }
                                td { (p.phase) }
                                td { (status(&p.state)) }
                                td.counts {
                                    @for (s, n) in &p.counts { span class={ "count st-" (s) } { (n) " " (s) } " " }
                                }
                                td { @if p.open_questions > 0 { span.st.st-ask_user { (p.open_questions) " open" } } }
                                td.t { (time(p.created_ms)) }
                                td.t { (time(p.updated_ms)) }
                            }
                        }
                    }
                }
            }
        },
    )]
}

pub fn index_page(v: &IndexView, mode: &str) -> Markup {
    let sections = index_sections(v);
    layout(
        "ports",
        "/events",
        mode,
        html! {
            h1 { "Ports" }
            (filter("ports", &["running", "ask_user", "environment", "waiting", "blocked", "cancelled"]))
            @for s in &sections { (s.render()) }
            p.twin { "JSON: " a href="/api/ports" { "/api/ports" } }
        },
    )
}

// ----- port -----------------------------------------------------------------

fn gpus(c: &ComponentView) -> String {
    if c.gpus.is_empty() {
        if c.gpus_needed > 0 {
            format!("{} wanted", c.gpus_needed)
        } else {
            String::new()
        }
    } else {
        c.gpus
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

fn question(family: &str, repo: &str, q: &QuestionView, access: Access) -> Markup {
    // The command a person can paste, from anywhere: it names the
    // checkout whose embedded state holds the port (issue #43).
    let repo_arg = if repo.is_empty() {
        " --repo DIR".to_string()
    } else {
        format!(" --repo {}", shell_word(repo))
    };
    html! {
        article.question id={ "q-" (q.id) } data-status=(q.status) {
            h3 { (q.id) " · " (q.component) " · " (status(&q.status)) @if !q.decision_type.is_empty() { " · " (q.decision_type) } }
            p { (q.question) }
            @if !q.recommended.is_empty() { p.rec { "recommended: " (q.recommended) } }
            @if q.status == "open" {
                @match access {
                    Access::ReadOnly => {
                        ol { @for o in &q.options { li { (o) } } }
                        p.note { "Read-only dashboard: answer with " code { "fvd answer " (family) " " (q.id) " --option N" (repo_arg) } "." }
                    }
                    Access::Answer { token } => {
                        form.answer method="post" action={ "/ports/" (seg(family)) "/answer" } {
                            input type="hidden" name="id" value=(q.id);
                            @for (i, o) in q.options.iter().enumerate() {
                                label.option {
                                    input type="radio" name="option" value=(i + 1) required[i == 0];
                                    " " (i + 1) ". " (o)
                                }
                            }
                            label.option { input type="radio" name="option" value="0"; " other: " input type="text" name="text" placeholder="your answer"; }
                            @if token {
                                label.token { "porter token " input type="password" name="token" autocomplete="off" required; }
                            }
                            button type="submit" { "answer " (q.id) }
                            output.result {}
                        }
                    }
                }
            } @else if !q.answer.is_empty() {
                p { "answer: " strong { (q.answer) } @if !q.answered_by.is_empty() { " · by " span.who { (q.answered_by) } } }
            }
        }
    }
}

pub fn port_sections(v: &PortView, access: Access) -> Vec<Section> {
    let head = html! {
        p.head {
            "state " (status(&v.state)) " · phase " strong { (v.phase) }
            " · started " span.t { (time(v.created_ms)) } " · updated " span.t { (time(v.updated_ms)) }
            " · elapsed " span.elapsed { (duration(v.elapsed_ms as u64)) }
            @if v.gpu_hours > 0.0 { " · " span.gpuh { (gpu_hours(v.gpu_hours)) } }
            @if let Some(u) = &v.trace_url { " · " a.trace href=(u) { "trace" } }
        }
        @if !v.port_status_path.is_empty() { p.path { "status file: " code { (v.port_status_path) } } }
        @if let Some(a) = &v.agent_spend { p.spend { "agents spent " (spend(a)) } }
    };
    let phases = html! {
        ol.phases {
            @for p in &v.phases {
                li class={ "ph ph-" (if p.outcome.is_empty() { "none" } else { &p.outcome }) @if p.current { " current" } }
                    title={ (p.id) " " (p.name) @if !p.outcome.is_empty() { ": " (p.outcome) " " (time(p.at_ms)) } } {
                    b { (p.id) } span { (p.name) }
                }
            }
        }
        @if !v.refusals.is_empty() {
            ul.refusals {
                @for r in &v.refusals {
                    li {
                        (status(&r.outcome)) " " b { (r.phase) } " " span.t { (time(r.at_ms)) }
                        @if !r.conditions.is_empty() { ul { @for c in &r.conditions { li { (c) } } } }
                    }
                }
            }
        }
    };
    let matrix = html! {
        table.matrix {
            thead { tr { th { "component" } th { "status" } th { "runs" } th { "worker" } th.wide { "GPUs" } th { "elapsed" } th.wide { "GPU time" } th.wide { "agent spend" } th.reason { "last reason" } th.wide { "time" } } }
            tbody {
                @for c in &v.components {
                    tr id={ "c-" (c.name) } data-component=(c.name) data-status=(c.status) data-updated-ms=(c.updated_ms) {
                        td { a href={ "/ports/" (seg(&v.family)) "/components/" (seg(&c.name)) } { (c.name) } }
                        td { (status(&c.status)) }
                        td.n { (c.runs) }
                        td.w { (c.worker_id) }
                        td.w.wide { (gpus(c)) }
                        td.n { @if let Some(e) = c.elapsed_ms { (duration(e.max(0) as u64)) } }
                        td.n.wide { (gpu_hours(c.gpu_hours)) }
                        td.n.wide { @if let Some(a) = &c.agent_spend { (spend(a)) } }
                        // Three lines at most; the whole reason on hover
                        // and on the component's page.
                        td.reason { div.clamp title=(c.reason) { (c.reason) } }
                        td.t.wide { (time(c.updated_ms)) }
                    }
                }
            }
        }
    };
    // Open questions are what a person is here for: a section at the top
    // of the page; answered ones stay below, in their own.
    let open = html! {
        @if v.questions.iter().any(|q| q.status == "open") {
            h2 { "Open questions" }
            @for q in v.questions.iter().filter(|q| q.status == "open") { (question(&v.family, &v.repo, q, access)) }
        }
    };
    let questions = html! {
        @if v.questions.is_empty() {
            p.empty { "No question asked." }
        } @else if v.questions.iter().all(|q| q.status == "open") {
            p.empty { "No question answered yet." }
        } @else {
            @for q in v.questions.iter().filter(|q| q.status != "open") { (question(&v.family, &v.repo, q, access)) }
        }
    };
    vec![
        Section::new("port-head", head),
        Section::new("phases", phases),
        Section::new("matrix", matrix),
        Section::new("questions", questions),
        Section::new("timeline", timeline(&v.timeline)),
        Section::new("open-questions", open),
    ]
}

pub fn port_page(v: &PortView, access: Access, mode: &str) -> Markup {
    let s = port_sections(v, access);
    let f = seg(&v.family);
    layout(
        &v.family,
        &format!("/ports/{f}/events"),
        mode,
        html! {
            h1 { "Port " (v.family) }
            (s[0].render())
            (s[5].render())
            h2 { "Components" }
            (filter("matrix", &["running", "queued", "agent", "ask_user", "environment", "non_skip_pass", "blocked"]))
            (s[2].render())
            h2 { "Timeline" }
            p.note { "Every run of every submit, a lane per worker and GPU; a bar links to its run." }
            (s[4].render())
            h2 { "Phases" }
            (s[1].render())
            h2 { "Questions" }
            (s[3].render())
            p.twin { "JSON: " a href={ "/api/ports/" (f) } { "/api/ports/" (v.family) } }
        },
    )
}

// ----- component ------------------------------------------------------------

fn diff(text: &str) -> Markup {
    html! {
        pre.diff {
            @for line in text.lines() {
                @let class = if line.starts_with("+++") || line.starts_with("---") { "h" }
                    else if line.starts_with('+') { "add" }
                    else if line.starts_with('-') { "del" }
                    else if line.starts_with("@@") { "hunk" }
                    else { "" };
                span class=(class) { (line) } "\n"
            }
        }
    }
}

/// USD and tokens of some attempts, in a few words.
fn spend(a: &crate::dashboard::views::SpendView) -> String {
    let mut t = format!("${:.4} · {} tokens", a.cost_usd, a.tokens);
    if a.unpriced_tokens > 0 {
        t.push_str(&format!(" (+{} without a price)", a.unpriced_tokens));
    }
    t
}

/// One attempt's model usage and how it ended on the model side.
fn usage(u: &fvd_store::usage::AttemptUsage) -> Markup {
    html! {
        p.usage {
            (if u.preset.is_empty() { "command" } else { &u.preset }) " " code { (u.model) }
            " · " (u.input_tokens) " in, " (u.output_tokens) " out, " (u.cache_read_tokens) " cache read, " (u.cache_write_tokens) " cache write"
            " · " @match u.cost_usd { Some(c) => { "$" (format!("{c:.4}")) }, None => { "cost unknown" } }
            " · " (u.requests) " request(s)"
            @if u.retries > 0 { " · " (u.retries) " retried" }
            " · " (u.outcome)
            @if !u.stop_reason.is_empty() { ": " (u.stop_reason) }
        }
        @if !u.permission_denials.is_empty() {
            ul.denials { @for d in &u.permission_denials { li { "permission denied: " code { (d) } } } }
        }
    }
}

fn attempts(v: &[AttemptRow]) -> Markup {
    html! {
        @if v.is_empty() {
            p.empty { "No agent attempt." }
        } @else {
            @for a in v {
                details.attempt {
                    summary {
                        b { "attempt " (a.attempt) } " " (a.kind) " · " (a.state)
                        " · " (status(a.verdict_before.as_str())) " → " (status(if a.verdict_after.is_none() { "pending" } else { a.verdict_after.as_str() }))
                        " · handoff " (a.handoff_status)
                        @if a.tries > 1 { " · tries " (a.tries) }
                        " · " (duration(a.duration_ms))
                        @if !a.commit_sha.is_empty() { " · " code { (a.commit_sha.get(..10).unwrap_or(&a.commit_sha)) } }
                        @if !a.judge_changed.is_empty() { " · " b.judge { "changed the judge" } }
                    }
                    @if !a.judge_changed.is_empty() {
                        p.reason.judge {
                            "Changed the judge, not counted: its run used the port's own "
                            @for (i, f) in a.judge_changed.iter().enumerate() { @if i > 0 { ", " } code { (f) } }
                            ". A person approves or rejects it (its question is on the port's page)."
                        }
                        @if !a.judge_diff.is_empty() { (diff(&a.judge_diff)) }
                    }
                    @if !a.handoff_summary.is_empty() { p { (a.handoff_summary) } }
                    @if let Some(u) = &a.usage { (usage(u)) }
                    @if !a.reason_after.is_empty() { p.reason { "after: " (a.reason_after) } }
                    @if !a.diff_stat.is_empty() { pre.stat { (a.diff_stat) } }
                    @if a.diff.is_empty() { p.empty { "empty diff" } } @else { (diff(&a.diff)) }
                }
            }
        }
    }
}

fn trace(family: &str, component: &str, t: &Option<TraceInvestigation>) -> Markup {
    html! {
        @match t {
            None => { p.empty { "Not traced." } }
            Some(t) => {
                p { (status(t.state.as_str())) " " (t.outcome) " · investigated run " code { (t.job_id) } " · " span.t { (time(t.started_ms)) } }
                @if !t.summary.is_empty() { p.reason { (t.summary) } }
                @for s in &t.steps {
                    section.step {
                        h4 { "step " (s.step) ": " code { (s.layers) } @if !s.first_module.is_empty() { " → first divergent " code { (s.first_module) } } }
                        @if !s.error.is_empty() { p.reason { (s.error) } }
                        @if s.report.is_some() {
                            div.plotted {
                                img.plot src={ "/ports/" (seg(family)) "/components/" (seg(component)) "/trace/" (s.step) "/plot.svg" }
                                    alt={ "drift plot of step " (s.step) } loading="lazy";
                                @if let Some(r) = s.report.as_ref().and_then(|r| serde_json::from_value::<fvd_trace::Report>(r.clone()).ok()) {
                                    (drift_table(&r))
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Rows a drift table shows: up to the first divergence and a few after
/// it (the plot has them all).
const DRIFT_TABLE_ROWS: usize = 40;

/// The plot's rows as a table, in its x order: each row's module (port and
/// reference name), tensor, step, largest drift and the stats beyond
/// tolerance; the first divergence marked.
fn drift_table(r: &fvd_trace::Report) -> Markup {
    let first = r.first_divergence.as_ref().map(|f| f.port_module.as_str());
    let until = r
        .rows
        .iter()
        .position(|row| row.diverged)
        .map_or(DRIFT_TABLE_ROWS, |i| {
            (i + 5).min(DRIFT_TABLE_ROWS.max(i + 1))
        });
    html! {
        table.drift {
            thead { tr { th { "#" } th { "module (port / reference)" } th { "tensor" } th { "step" } th { "max drift" } th { "beyond tolerance" } } }
            tbody {
                @for (i, row) in r.rows.iter().enumerate().take(until) {
                    @let max = row.drift.0.iter().map(|(_, v)| *v).fold(0.0_f64, f64::max);
                    tr class={ @if row.diverged { "diverged" } @if first == Some(row.port_module.as_str()) && row.diverged { " first" } } {
                        td.n { (i) }
                        td { code { (row.port_module) } @if row.reference_module != row.port_module { br; code.ref { (row.reference_module) } } }
                        td { (row.tensor) }
                        td.n { @if let Some(st) = row.step { (st) } }
                        td.n { (format!("{max:.2e}")) }
                        td { (row.exceeded.join(", ")) }
                    }
                }
            }
        }
        @if r.rows.len() > until { p.note { (r.rows.len() - until) " more rows in the plot and in " code { "fvd trace compare" } "." } }
    }
}

fn runs(v: &ComponentPage) -> Markup {
    let base = format!(
        "/ports/{}/components/{}",
        seg(&v.family),
        seg(&v.component.name)
    );
    html! {
        table.runs {
            thead { tr { th { "run" } th { "state" } th { "verdict" } th { "worker" } th { "started" } th { "took" } th { "reason" } } }
            tbody {
                @for r in v.runs.iter().rev() {
                    tr {
                        td { a href={ (base) "?run=" (r.run_no) } { (r.run_no) } }
                        td { (r.state) }
                        td { @if !r.verdict.is_empty() { (status(&r.verdict)) } }
                        td.w { (r.worker_id) }
                        td.t { (time(r.started_ms.unwrap_or(0))) }
                        td.w { @if let Some(d) = r.duration_ms { (duration(d)) } }
                        td.reason { (r.reason) }
                    }
                }
            }
        }
    }
}

pub fn component_sections(v: &ComponentPage) -> Vec<Section> {
    let c = &v.component;
    vec![
        Section::new(
            "component-head",
            html! {
                p.head { (status(&c.status)) " · " (c.runs) " run(s)" @if !c.worker_id.is_empty() { " · worker " (c.worker_id) } " · updated " span.t { (time(c.updated_ms)) } }
                @if !c.reason.is_empty() { p.reason { (c.reason) } }
            },
        ),
        Section::new("runs", runs(v)),
        Section::new("attempts", attempts(&v.attempts)),
        Section::new("trace", trace(&v.family, &c.name, &v.trace)),
    ]
}

fn log(family: &str, component: &str, l: &Option<LogView>) -> Markup {
    html! {
        @match l {
            None => { p.empty { "No run yet." } }
            Some(l) => {
                @let txt = format!("/ports/{}/components/{}/log.txt", seg(family), seg(component));
                p { "run " (l.run_no) " · " code { (l.job_id) }
                    " · " a.download href={ (txt) "?run=" (l.run_no) "&download=1" } { "download" }
                    @if l.following { " · " span.following { "following" } }
                    @if l.cut { " · earlier output left out (" code { "fvd logs " (family) " " (component) " --run " (l.run_no) } ")" } }
                (search_form(family, component, l.run_no, ""))
                // Each line is anchored (`#L12`, numbered as in the whole
                // output), so a search hit links to its place.
                pre #log data-follow=[l.following.then(|| format!(
                    "/ports/{}/components/{}/log?run={}{}", seg(family), seg(component), l.run_no,
                    l.last_seq.map(|s| format!("&after={s}")).unwrap_or_default()))] {
                    @for (i, line) in l.text.split_inclusive('\n').enumerate() {
                        span id={ "L" (l.first_line + i) } { (line) }
                    }
                }
            }
        }
    }
}

/// The form that searches a run's output: a page of its own (it works
/// without the script), in the dashboard's layout.
fn search_form(family: &str, component: &str, run: u32, q: &str) -> Markup {
    html! {
        form.search method="get" action={ "/ports/" (seg(family)) "/components/" (seg(component)) "/search" } {
            input type="hidden" name="run" value=(run);
            input type="search" name="q" value=(q) placeholder="search this run's output";
            " " button type="submit" { "search" }
        }
    }
}

/// `line` with each occurrence of `needle` (ASCII, any case) marked; a
/// needle with other characters marks nothing (the line is marked whole).
fn marked(line: &str, needle: &str) -> Markup {
    let n = needle.len();
    let mut parts: Vec<(&str, bool)> = Vec::new();
    let (b, mut from, mut i) = (line.as_bytes(), 0, 0);
    if needle.is_ascii() && n > 0 {
        while i + n <= b.len() {
            if b[i..i + n].eq_ignore_ascii_case(needle.as_bytes()) {
                parts.push((&line[from..i], false));
                parts.push((&line[i..i + n], true));
                i += n;
                from = i;
            } else {
                i += 1;
            }
        }
    }
    parts.push((&line[from..], false));
    html! { @for (t, m) in parts { @if m { mark { (t) } } @else { (t) } } }
}

/// The hits of a search of a run's output, each among the lines around
/// it; every line links to its place on the component's page.
pub fn search_page(v: &SearchView, mode: &str) -> Markup {
    let base = format!("/ports/{}/components/{}", seg(&v.family), seg(&v.component));
    let run = format!("{base}?run={}", v.run_no);
    let txt = format!("{base}/log.txt?run={}", v.run_no);
    let place = |n: usize| {
        if n >= v.page_first_line {
            format!("{run}#L{n}")
        } else {
            txt.clone()
        }
    };
    let shown: usize = v.blocks.iter().flatten().filter(|l| l.hit).count();
    layout(
        &format!("search · {} run {}", v.component, v.run_no),
        "",
        mode,
        html! {
            p.crumbs {
                a.back href=(run) { "← run " (v.run_no) " of " (v.component) }
                " · " a href={ "/ports/" (seg(&v.family)) } { "port " (v.family) }
            }
            h1 { "Search run " (v.run_no) " of " (v.component) }
            (search_form(&v.family, &v.component, v.run_no, &v.query))
            @if v.query.is_empty() {
                p.empty { "Type what to look for in this run's output." }
            } @else if v.matches == 0 {
                p.empty #search-summary { "No line of run " (v.run_no) " holds “" (v.query) "”." }
            } @else {
                p #search-summary {
                    (v.matches) " line" @if v.matches > 1 { "s" } " hold “" (v.query) "”"
                    @if shown < v.matches { " · the first " (shown) " shown" }
                    " · each with " (SEARCH_CONTEXT) " lines around it; a line number opens it in the run's output"
                }
                @for b in &v.blocks {
                    pre.hits {
                        @for l in b {
                            span class={ "line" @if l.hit { " hit" } } data-line=(l.number) {
                                a.ln href=(place(l.number)) { (l.number) }
                                " " @if l.hit { (marked(&l.text, &v.query)) } @else { (l.text) } "\n"
                            }
                        }
                    }
                }
            }
            p.twin {
                a href=(run) { "back to the run's output" }
                " · whole output: " a href=(txt) { "as text" } " · " a href={ (txt) "&download=1" } { "download" }
                " · JSON: " a href={ "/api" (base) "/search?run=" (v.run_no) "&q=" (seg(&v.query)) } { "search" }
            }
        },
    )
}

pub fn component_page(v: &ComponentPage, mode: &str) -> Markup {
    let s = component_sections(v);
    let f = seg(&v.family);
    let c = seg(&v.component.name);
    layout(
        &format!("{} · {}", v.component.name, v.family),
        &format!("/ports/{f}/components/{c}/events"),
        mode,
        html! {
            p.crumbs { a href={ "/ports/" (f) } { "← port " (v.family) } }
            h1 { "Component " (v.component.name) }
            (s[0].render())
            h2 { "Output" }
            (log(&v.family, &v.component.name, &v.log))
            h2 { "Runs" }
            (s[1].render())
            h2 { "Agent attempts" }
            @if let Some(w) = &v.worktree { p.path { "worktree " code { (w.path) } " · branch " code { (w.branch) } } }
            (s[2].render())
            h2 { "Trace drill-down" }
            (s[3].render())
            p.twin { "JSON: " a href={ "/api/ports/" (f) "/components/" (c) } { "/api/ports/" (v.family) "/components/" (v.component.name) } }
        },
    )
}

// ----- workers --------------------------------------------------------------

/// The runs the store gives to a worker that is gone: nobody holds them.
fn interrupted(v: &WorkersView) -> Markup {
    html! {
        @if !v.interrupted.is_empty() {
            section.interrupted {
                h3 { "Interrupted runs" }
                p.note { "Their worker is gone, so nothing runs them now: their port runs them again when it resumes (an orchestrator gives a restarted worker a grace to claim them first)." }
                table {
                    thead { tr { th { "job" } th { "port" } th { "component" } th { "state" } th { "was on" } th { "started" } } }
                    tbody { @for i in &v.interrupted { @let j = &i.run; tr data-job=(j.job_id) {
                        td { a href={ "/ports/" (seg(&j.family)) "/components/" (seg(&j.component)) "?run=" (j.run_no) } { code { (j.job_id) } } }
                        td { a href={ "/ports/" (seg(&j.family)) } { (j.family) } }
                        td { (j.component) }
                        td { (status("interrupted")) }
                        td.w { (i.worker_id) " (gone)" }
                        td.t { (time(j.started_ms.unwrap_or(0))) }
                    } } }
                }
            }
        }
    }
}

/// The workers that registered once and are gone, folded into one line.
fn gone_workers(v: &WorkersView) -> Markup {
    let last = v.gone.iter().map(|w| w.last_seen_ms).max().unwrap_or(0);
    html! {
        @if !v.gone.is_empty() {
            details.gone {
                summary {
                    (v.gone.len()) " earlier worker" @if v.gone.len() > 1 { "s" } " (not running now)"
                    @if last > 0 { ", last seen " span.t { (time(last)) } }
                }
                ul { @for w in &v.gone {
                    li data-gone-worker=(w.worker_id) {
                        code { (w.worker_id) } @if !w.host.is_empty() { " on " (w.host) }
                        @if w.last_seen_ms > 0 { " · last seen " span.t { (time(w.last_seen_ms)) } }
                    }
                } }
            }
        }
    }
}

pub fn workers_sections(v: &WorkersView) -> Vec<Section> {
    let f = &v.fleet;
    let body = html! {
        @if !f.live {
            p.note { "No live scheduler in this process: a stored worker counts as running while its process runs on this host (each embedded fvd submit has a worker of its own, gone when it ends)." }
        }
        @if f.workers.is_empty() { p.empty { "No worker running." } }
        @for w in &f.workers {
            article.worker data-worker=(w.worker_id) {
                h3 { (w.worker_id) " · " (w.host)
                    @if w.draining { " · " span.st.st-draining { "draining" } }
                    " · " @if f.live { "heartbeat " } @else { "registered " } span.t { (time(w.last_seen_ms)) } }
                p {
                    "GPUs: " @if w.gpus.is_empty() { "none" }
                    @for g in &w.gpus {
                        @let free = w.free_gpus.as_ref().is_some_and(|f| f.contains(&g.index));
                        span class={ "gpu " @if w.free_gpus.is_none() { "" } @else if free { "free" } @else { "busy" } }
                            title={ (g.name) " " (g.memory_mib) " MiB" } { (g.index) } " "
                    }
                    " · CPU slots "
                    @if let Some(c) = w.free_cpu { (c) "/" (w.cpu_slots) " free" } @else { (w.cpu_slots) }
                    @for (k, val) in &w.labels { " · " code { (k) "=" (val) } }
                    @for p in &w.provides { " · provides " code { (p) } }
                }
                @for u in w.gpu_use() { p.gpu-use { (u.to_string()) } }
                @if !w.jobs.is_empty() {
                    table {
                        thead { tr { th { "job" } th { "port" } th { "component" } th { "epoch" } th { "GPUs" } th { "started" } } }
                        tbody { @for j in &w.jobs { tr {
                            td { a href={ "/ports/" (seg(&j.family)) "/components/" (seg(&j.component)) "?run=" (j.run_no) } { code { (j.job_id) } } }
                            td { a href={ "/ports/" (seg(&j.family)) } { (j.family) } }
                            td { (j.component) }
                            td.n { (j.lease_epoch) }
                            td { (j.gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")) }
                            td.t { (time(j.started_ms.unwrap_or(0))) }
                        } } }
                    }
                }
            }
        }
        (interrupted(v))
        (gone_workers(v))
    };
    vec![
        Section::new("workers", body),
        Section::new("fleet-timeline", timeline(&v.timeline)),
    ]
}

pub fn workers_page(v: &WorkersView, mode: &str) -> Markup {
    let s = workers_sections(v);
    layout(
        "workers",
        "/workers/events",
        mode,
        html! {
            h1 { "Workers" }
            (s[0].render())
            h2 { "Timeline" }
            p.note { "Every port's runs of the last hour and those still running, a lane per worker and GPU." }
            (s[1].render())
            p.twin { "JSON: " a href="/api/workers" { "/api/workers" } }
        },
    )
}

/// The sign-in page of a dashboard that needs a reader's credential:
/// one password field, posted to `/login`, back to `next` after.
pub fn login_page(next: &str, why: &str, mode: &str) -> Markup {
    layout(
        "sign in",
        "",
        mode,
        html! {
            h1 { "sign in" }
            @if !why.is_empty() { p.reason #login-error { (why) } }
            form.login method="post" action="/login" {
                input type="hidden" name="next" value=(next);
                label.token { "viewer, porter or admin token " input type="password" name="token" autocomplete="off" required; }
                button type="submit" { "sign in" }
            }
            p.note { "The token is checked and forgotten: the browser keeps a session cookie, which ends when the token is revoked." }
        },
    )
}

/// A page for an error (unknown port, refused answer) with a way back.
pub fn error_page(title: &str, message: &str, back: &str, mode: &str) -> Markup {
    layout(
        title,
        "",
        mode,
        html! {
            h1 { (title) }
            p.reason { (message) }
            p { a href=(back) { "back" } }
        },
    )
}

/// `s` as one shell word: as it is when it needs no quoting, else in
/// single quotes.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:@,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #43: a read-only page's hint is a command that works pasted
    /// anywhere: it names the port's checkout.
    #[test]
    fn a_read_only_question_says_the_command_with_its_checkout() {
        let q = QuestionView {
            id: "E001".into(),
            component: "c".into(),
            decision_type: "ambiguity".into(),
            question: "which?".into(),
            recommended: "a".into(),
            options: vec!["a".into(), "b".into()],
            status: "open".into(),
            answer: String::new(),
            answered_by: String::new(),
            attempt: 1,
        };
        let html = question("fam", "/work/my repo", &q, Access::ReadOnly).into_string();
        assert!(
            html.contains("fvd answer fam E001 --option N --repo '/work/my repo'"),
            "{html}"
        );
        let html = question("fam", "/work/repo", &q, Access::ReadOnly).into_string();
        assert!(html.contains("--option N --repo /work/repo<"), "{html}");
    }

    #[test]
    fn a_hit_marks_each_occurrence_in_any_case_and_stays_escaped() {
        let m = marked("<b> NeEdle-1 and needle-1", "needle-1").into_string();
        assert_eq!(
            m,
            "&lt;b&gt; <mark>NeEdle-1</mark> and <mark>needle-1</mark>"
        );
        assert_eq!(marked("déjà vu", "déjà").into_string(), "déjà vu");
    }

    #[test]
    fn times_are_utc_civil_dates() {
        assert_eq!(time(0), "");
        assert_eq!(time(1_000), "1970-01-01 00:00:01Z");
        assert_eq!(time(951_782_400_000), "2000-02-29 00:00:00Z");
        assert_eq!(time(1_735_689_599_000), "2024-12-31 23:59:59Z");
    }

    /// Issue #44: a GPU that runs share says how many and what they leased
    /// of it; a GPU one run holds whole says so.
    #[test]
    fn a_worker_says_what_the_runs_on_each_gpu_hold_of_it() {
        use crate::query::{Fleet, Gpu, Lease, Worker};
        let gpu = |index| Gpu {
            index,
            name: "H200".into(),
            memory_mib: 143_771,
        };
        let lease = |job: &str, gpus: Vec<u32>, share_mib| Lease {
            job_id: job.into(),
            gpus,
            share_mib,
            ..Lease::default()
        };
        let v = WorkersView {
            fleet: Fleet {
                live: true,
                workers: vec![Worker {
                    worker_id: "w".into(),
                    gpus: vec![gpu(0), gpu(1), gpu(2)],
                    free_gpus: Some(vec![2]),
                    jobs: vec![
                        lease("p.a.1", vec![0], 4096),
                        lease("p.b.1", vec![0], 2048),
                        lease("p.c.1", vec![1], 0),
                    ],
                    ..Worker::default()
                }],
                ..Fleet::default()
            },
            gone: Vec::new(),
            interrupted: Vec::new(),
            timeline: Default::default(),
        };
        let html = &workers_sections(&v)[0].html;
        assert!(
            html.contains("GPU 0: 2 runs sharing it, 6144 of 143771 MiB leased"),
            "{html}"
        );
        assert!(html.contains("GPU 1: 1 run, held whole"), "{html}");
        assert!(!html.contains("GPU 2:"), "{html}");
    }

    #[test]
    fn values_are_escaped_and_segments_encoded() {
        let v = PortView {
            family: "f".into(),
            state: "running".into(),
            phase: "P6".into(),
            repo: String::new(),
            port_status_path: String::new(),
            created_ms: 0,
            updated_ms: 0,
            phases: Vec::new(),
            refusals: Vec::new(),
            components: vec![ComponentView {
                name: "a/b".into(),
                status: "blocked".into(),
                reason: "<script>alert(1)</script>".into(),
                ..ComponentView::default()
            }],
            questions: Vec::new(),
            agent_spend: None,
            timeline: Default::default(),
            gpu_hours: 0.0,
            elapsed_ms: 0,
            trace_url: None,
            interrupted: Vec::new(),
        };
        let s = port_sections(&v, Access::ReadOnly);
        let matrix = &s[2].html;
        assert!(!matrix.contains("<script>"), "{matrix}");
        assert!(matrix.contains("&lt;script&gt;"));
        assert!(matrix.contains("/components/a%2Fb"));
        assert_eq!(
            s[2].hash(),
            Section::new("matrix", PreEscaped(matrix.clone())).hash()
        );
    }
}
