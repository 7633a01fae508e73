//! The spec's text: `[prep]`, `[defaults]`, the components with a comment
//! on every inferred value, and the closing list of what is not a component.

use std::collections::BTreeSet;

use fvd_contracts::secrets;

use super::command::Pytest;
use super::markdown::{Label, ident, one_line};
use super::prep::Pv;
use super::{Cand, Cx, Placeholder, Plan, TYPES, Unused, below_checkout, pyfile};

/// The spec text being written, line by line.
#[derive(Debug, Default)]
struct Out {
    lines: Vec<String>,
    placeholders: Vec<Placeholder>,
}

/// What replaces anything secret-looking that would be copied.
const LEFT_OUT: &str = "[left out: it looks like a secret]";

/// A TOML basic string.
pub(super) fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            '\t' => q.push_str("\\t"),
            c if c.is_control() => q.push_str(&format!("\\u{:04X}", c as u32)),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

fn fill(hint: &str) -> String {
    format!("<fill in: {}>", hint.replace(['<', '>'], ""))
}

/// A value as init writes it: one line, never a secret.
fn clean(s: &str) -> String {
    let s = one_line(s, 400);
    if secrets::scan_line(&s).is_some() {
        fill("the value here looked like a secret and was left out; name its variable instead")
    } else {
        s
    }
}

impl Out {
    fn line(&mut self, s: impl Into<String>) {
        self.lines.push(s.into());
    }

    fn comment(&mut self, text: &str) {
        self.comment_at(0, text);
    }

    /// A comment line indented by `indent` spaces after the `#` (a list item).
    fn comment_at(&mut self, indent: usize, text: &str) {
        let t = one_line(text, 1000);
        let t = if secrets::scan_line(&t).is_some() {
            // redact the words that look secret; if the line still does
            // (a value split over words), leave the whole line out
            let words: Vec<String> = t.split(' ').map(secrets::redact).collect();
            let r = words.join(" ");
            if secrets::scan_line(&r).is_some() {
                LEFT_OUT.to_string()
            } else {
                r
            }
        } else {
            t
        };
        self.lines.push(format!("#{} {t}", " ".repeat(indent)));
    }

    /// `key = "value"`, recording a placeholder under `field`.
    fn string(&mut self, key: &str, value: &str, field: &str) {
        let v = clean(value);
        if fvd_contracts::contract::is_placeholder(&v) {
            self.placeholders.push(Placeholder {
                line: self.lines.len() + 1,
                field: field.to_string(),
            });
        }
        self.lines.push(format!("{key} = {}", quote(&v)));
    }

    fn array(&mut self, key: &str, items: &[String], field: &str) {
        let items: Vec<String> = items.iter().map(|i| clean(i)).collect();
        if items
            .iter()
            .any(|i| fvd_contracts::contract::is_placeholder(i))
        {
            self.placeholders.push(Placeholder {
                line: self.lines.len() + 1,
                field: field.to_string(),
            });
        }
        let quoted: Vec<String> = items.iter().map(|i| quote(i)).collect();
        self.lines.push(format!("{key} = [{}]", quoted.join(", ")));
    }
}

/// The spec's text and where its placeholders are.
pub(super) struct Rendered {
    pub text: String,
    pub placeholders: Vec<Placeholder>,
}

/// A component as it is written.
struct Written {
    name: String,
    aliases: Vec<String>,
    ctype: (String, String),
    tests: Vec<String>,
    coverage: (String, String),
    set_env: Vec<(String, String)>,
    env: Vec<String>,
    /// Why `set_env` and `env` are what they are.
    env_notes: Vec<String>,
    command: Option<Vec<String>>,
    command_note: Option<String>,
    gpus: Option<String>,
    notes: Vec<String>,
}

impl Cx<'_> {
    pub(super) fn render(&self, prep: &[(&'static str, Pv)], plan: &Plan) -> Rendered {
        let mut o = Out::default();
        self.header(&mut o);
        let token_env = o.prep(prep);
        self.defaults(&mut o, plan, token_env.as_ref());
        let written: Vec<Written> = if plan.cands.is_empty() {
            vec![no_component()]
        } else {
            plan.cands
                .iter()
                .map(|c| self.written(c, token_env.as_deref()))
                .collect()
        };
        for w in &written {
            o.component(w);
        }
        o.not_components(plan);
        let mut text = o.lines.join("\n");
        text.push('\n');
        Rendered {
            text,
            placeholders: o.placeholders,
        }
    }

    /// Writes the spec's opening comments: what it was read from, and what
    /// a `<fill in: ...>` means.
    fn header(&self, o: &mut Out) {
        let family = self.input.family;
        let mut read_from = Vec::new();
        if self.status.is_some() {
            read_from.push("PORT_STATUS.md".to_string());
        }
        if self.input.readme.is_some() {
            read_from.push("README.md".to_string());
        }
        read_from.push(format!("{} test files", self.input.tests.len()));
        o.comment(&format!(
            "Port spec of `{family}`, written by `fvd init` from {} in {}.",
            read_from.join(", "),
            self.dir
        ));
        o.comment("Each value says where it comes from. Each \"<fill in: ...>\" is a decision nothing in the checkout records: fvd submit refuses to pass P0 until it is made.");
        o.line("");
    }

    /// Writes the `[defaults]` table, when there is something to put in it:
    /// the token variable passed to every test, and the preflight checks
    /// (commented out) among the unused test files of this folder.
    fn defaults(&self, o: &mut Out, plan: &Plan, token_env: Option<&String>) {
        let preflights: Vec<&Unused> = plan
            .unused_tests
            .iter()
            .filter(|u| u.reason.starts_with("preflight check") && u.what.starts_with(&self.dir))
            .collect();
        if token_env.is_none() && preflights.is_empty() {
            return;
        }
        o.line("");
        o.line("[defaults]");
        if let Some(t) = token_env {
            o.comment("passed through to every test by name and redacted from its output (prep.hf_token_env)");
            o.array("env", std::slice::from_ref(t), "defaults.env");
        }
        for p in preflights {
            o.comment(&format!(
                "{} looks like a preflight check; to run it once per worker before the port's first job:",
                p.what
            ));
            o.line(format!(
                "# preflight = [\"python3\", \"-m\", \"pytest\", {}, \"-q\"]",
                quote(&p.what)
            ));
        }
    }

    fn written(&self, c: &Cand, token_env: Option<&str>) -> Written {
        let mut notes = vec![format!("from {}", c.from.join("; "))];
        notes.extend(c.notes.iter().cloned());
        let tests = if c.tests.is_empty() {
            vec![fill(&format!(
                "the parity test of {} (by convention {}/test_{}_{}_parity.py)",
                c.name, self.dir, self.input.family, c.name
            ))]
        } else {
            self.selection(c)
        };
        let texts: Vec<(String, Option<String>)> =
            c.tests.iter().map(|t| (t.clone(), self.text(t))).collect();
        for (t, text) in &texts {
            if text.is_none() {
                notes.push(format!("{t} is not in this checkout"));
            }
        }

        // set_env, env and the command from the Parity Commands row
        let mut set_env = Vec::new();
        let mut env: Vec<String> = Vec::new();
        let mut env_notes = Vec::new();
        let mut command = None;
        let mut command_note = None;
        if let Some(p) = &c.cmd {
            (set_env, env, env_notes) = self.assignments(p, token_env);
            (command, command_note) = self.command(p, &mut notes);
            if !p.preamble.is_empty() {
                notes.push(format!(
                    "the status runs `{}` first; fvd runs tests from the checkout",
                    p.preamble.join(" ")
                ));
            }
        }
        let (coverage, gpus) = coverage(c, &texts);
        Written {
            name: c.name.clone(),
            aliases: aliases(c),
            ctype: ctype(c),
            tests,
            coverage,
            set_env,
            env,
            env_notes,
            command,
            command_note,
            gpus,
            notes,
        }
    }

    /// The variables the status's command sets, sorted out: those set
    /// (`set_env`, a template value becoming a `<fill in: ...>`), those
    /// passed through by name (`env`: secret-looking ones, after the token
    /// variable), and a note on each that is not copied as it stands.
    fn assignments(
        &self,
        p: &Pytest,
        token_env: Option<&str>,
    ) -> (Vec<(String, String)>, Vec<String>, Vec<String>) {
        let mut set_env = Vec::new();
        let mut env: Vec<String> = Vec::new();
        let mut env_notes = Vec::new();
        for (k, v) in &p.assignments {
            let secret_name = {
                let u = k.to_ascii_uppercase();
                ["TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY", "APIKEY"]
                    .iter()
                    .any(|s| u.contains(s))
                    || u.ends_with("_KEY")
            };
            if !crate::is_env_name(k) {
                env_notes.push(format!("{k} is set by the status's command but is no variable name fvd accepts; left out"));
            } else if secret_name || secrets::scan_line(&format!("{k}={v}")).is_some() {
                if Some(k.as_str()) != token_env && !env.contains(k) {
                    env.push(k.clone());
                }
                env_notes.push(format!("{k}: its value is not copied; passed through by name from the worker's environment"));
            } else if is_template_value(v) {
                // `<pinned-clone>`: the status names a value to choose,
                // not one to copy
                set_env.push((
                    k.clone(),
                    fill(&format!(
                        "the value of {k} on the workers (the status writes {v})"
                    )),
                ));
                env_notes.push(format!("{k}: the status writes {v}, a value to choose"));
            } else {
                let (value, changed) = repo_value(v, self.input.repo_name);
                if changed {
                    env_notes.push(format!(
                        "{k} was {v} (the porter's checkout); {{repo}} is the checkout a run tests"
                    ));
                }
                set_env.push((k.clone(), value));
            }
        }
        if !env.is_empty()
            && let Some(t) = token_env
        {
            env.insert(0, t.to_string());
        }
        (set_env, env, env_notes)
    }

    /// The component's command when the status's differs from the default
    /// (flags, interpreter flags, an absolute interpreter, which becomes
    /// `{repo}/…` inside the checkout or is noted in `notes`), with a note
    /// on its flags; `(None, None)` when the default does.
    fn command(
        &self,
        p: &Pytest,
        notes: &mut Vec<String>,
    ) -> (Option<Vec<String>>, Option<String>) {
        let trivial = (p.flags.is_empty() || p.flags == ["-q"]) && p.interpreter_flags.is_empty();
        let abs_program = p.program.starts_with('/');
        if trivial && !abs_program {
            return (None, None);
        }
        let program = if abs_program {
            match below_checkout(&p.program, self.input.repo_name) {
                Some(rel) => format!("{{repo}}/{rel}"),
                None => {
                    notes.push(format!(
                        "{} is the interpreter the status names; workers need it at that path",
                        p.program
                    ));
                    p.program.clone()
                }
            }
        } else {
            p.program.clone()
        };
        let mut argv = vec![program];
        if p.module {
            argv.extend(p.interpreter_flags.iter().cloned());
            argv.extend(["-m".to_string(), "pytest".to_string()]);
        }
        argv.push("{test}".into());
        argv.extend(p.flags.iter().cloned());
        let command_note = (!trivial).then(|| {
            format!(
                "the status runs it with {}; the worker adds --junitxml",
                p.flags.join(" ")
            )
        });
        (Some(argv), command_note)
    }
}

/// The placeholder component written when none was found, to be renamed
/// and filled in.
fn no_component() -> Written {
    Written {
        name: "unnamed".into(),
        aliases: Vec::new(),
        ctype: (
            fill(&TYPES.join(" | ")),
            "no component found: rename this one and fill it in".into(),
        ),
        tests: vec![fill("the component's parity test")],
        coverage: (
            fill("production_loader | implementation_subcomponent | both"),
            "nothing to read it from".into(),
        ),
        set_env: Vec::new(),
        env: Vec::new(),
        env_notes: Vec::new(),
        command: None,
        command_note: None,
        gpus: None,
        notes: vec![
            "no Component Matrix row, Parity Commands row or test file named a component".into(),
        ],
    }
}

/// The texts of the candidate's labels other than its own name, each once.
fn aliases(c: &Cand) -> Vec<String> {
    let mut aliases: Vec<String> = Vec::new();
    for l in &c.labels {
        if l.identity() != c.name && !aliases.contains(&l.text) {
            aliases.push(l.text.clone());
        }
    }
    aliases
}

/// The component's type and the comment saying where it comes from: the
/// matrix Type cell, else the name or a label, else its test's folder,
/// else a `<fill in: ...>`.
fn ctype(c: &Cand) -> (String, String) {
    match c.type_cell.as_deref().filter(|t| !t.is_empty()) {
        Some(cell) => match type_of(cell) {
            Some(t) => (t.to_string(), format!("type: Type `{cell}`")),
            None => match c.labels.iter().find_map(|l| type_of(&l.text)) {
                Some(t) => (
                    t.to_string(),
                    format!("type: from the name (Type `{cell}` is not a component type)"),
                ),
                None => (
                    fill(&TYPES.join(" | ")),
                    format!("fill in: Type `{cell}` is not a component type"),
                ),
            },
        },
        None => {
            match type_of(&c.name).or_else(|| c.labels.iter().find_map(|l| type_of(&l.text))) {
                Some(t) => (t.to_string(), "type: from the name".into()),
                // FastVideo files a test by kind: tests/local_tests/
                // generic/, transformers/, vaes/ (issue #43).
                None => match c.tests.iter().find_map(|t| type_of(kind_folder(t)?)) {
                    Some(t) => (t.to_string(), "type: from its test's folder".into()),
                    None => (
                        fill(&TYPES.join(" | ")),
                        "fill in: no Type column and the name says nothing".into(),
                    ),
                },
            }
        }
    }
}

/// The component's coverage scope with the comment saying why, read per
/// test file from `texts` (each file with its text, `None` when it is not
/// in the checkout), and the `gpus` comment when a file uses CUDA.
fn coverage(c: &Cand, texts: &[(String, Option<String>)]) -> ((String, String), Option<String>) {
    let mut scopes: BTreeSet<&str> = BTreeSet::new();
    let mut why = Vec::new();
    let mut unreadable = false;
    let mut cuda_in = Vec::new();
    for (t, text) in texts {
        let Some(text) = text else {
            unreadable = true;
            why.push(format!("{t} is not in this checkout"));
            continue;
        };
        let ev = pyfile::evidence(text);
        let name = pyfile::file_name(t);
        if ev.cuda {
            cuda_in.push(name.to_string());
        }
        if !ev.loaders.is_empty() {
            scopes.insert("production_loader");
            why.push(format!(
                "{name} loads through {}",
                ev.loaders.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        } else if !ev.direct.is_empty() {
            scopes.insert("implementation_subcomponent");
            why.push(format!(
                "{name} builds {} directly",
                ev.direct.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        } else if let Some(kind) = pyfile::not_parity(t, Some(text)) {
            // a helper test run beside the parity test (a conversion
            // check, say) does not decide what the parity test covers
            why.push(format!("{name} is a {kind} (not counted)"));
        } else {
            scopes.insert("");
            why.push(format!(
                "{name} shows neither a production loader nor a FastVideo class built directly"
            ));
        }
    }
    let fill_scope = fill("production_loader | implementation_subcomponent | both");
    let coverage = if c.tests.is_empty() {
        (fill_scope, "fill in: no parity test to read it from".into())
    } else if unreadable || scopes.contains("") || scopes.is_empty() {
        (fill_scope, format!("fill in: {}", why.join("; ")))
    } else if scopes.len() == 2 {
        ("both".into(), format!("coverage_scope: {}", why.join("; ")))
    } else {
        let s = scopes.iter().next().copied().unwrap_or_default();
        (s.to_string(), format!("coverage_scope: {}", why.join("; ")))
    };
    let gpus = (!cuda_in.is_empty()).then(|| format!("gpus: CUDA in {}", cuda_in.join(", ")));
    (coverage, gpus)
}

impl Out {
    /// Writes the `[prep]` table, each value with where it comes from;
    /// returns `prep.hf_token_env` when it names a variable.
    fn prep(&mut self, prep: &[(&'static str, Pv)]) -> Option<String> {
        let o = self;
        o.line("[prep]");
        let mut token_env = None;
        for (field, v) in prep {
            let f = format!("prep.{field}");
            match v {
                Pv::Known { value, source } => {
                    o.comment(&format!("from {source}"));
                    o.string(field, value, &f);
                }
                Pv::List { items, source } => {
                    o.comment(&format!("from {source}"));
                    o.array(field, items, &f);
                }
                Pv::Unknown { searched } => {
                    o.comment(&format!("unknown; searched {searched}"));
                    o.string(field, "unknown", &f);
                }
                Pv::Fill { hint, from } => {
                    o.comment(&format!("fill in: {from}"));
                    o.string(field, &fill(hint), &f);
                }
            }
            if field.eq(&"hf_token_env")
                && let Pv::Known { value, .. } = v
                && crate::is_env_name(value)
            {
                token_env = Some(value.clone());
            }
        }
        token_env
    }

    /// Writes one `[[component]]` table, each inferred value under the
    /// comment that says where it comes from.
    fn component(&mut self, w: &Written) {
        let o = self;
        o.line("");
        o.line("[[component]]");
        for n in &w.notes {
            o.comment(n);
        }
        let at = |k: &str| format!("component {}: {k}", w.name);
        o.string("name", &w.name, &at("name"));
        if !w.aliases.is_empty() {
            o.array("aliases", &w.aliases, &at("aliases"));
        }
        o.comment(&w.ctype.1);
        o.string("type", &w.ctype.0, &at("type"));
        if let [one] = w.tests.as_slice() {
            o.string("parity_test", one, &at("parity_test"));
        } else {
            o.array("parity_test", &w.tests, &at("parity_test"));
        }
        o.comment(&w.coverage.1);
        o.string("coverage_scope", &w.coverage.0, &at("coverage_scope"));
        for n in &w.env_notes {
            o.comment(n);
        }
        if !w.set_env.is_empty() {
            let pairs: Vec<String> = w
                .set_env
                .iter()
                .map(|(k, v)| format!("{k} = {}", quote(&clean(v))))
                .collect();
            if let Some((k, _)) = w
                .set_env
                .iter()
                .find(|(_, v)| fvd_contracts::contract::is_placeholder(&clean(v)))
            {
                o.placeholders.push(Placeholder {
                    line: o.lines.len() + 1,
                    field: at(&format!("set_env.{k}")),
                });
            }
            o.line(format!("set_env = {{ {} }}", pairs.join(", ")));
        }
        if !w.env.is_empty() {
            o.array("env", &w.env, &at("env"));
        }
        if let Some(cmd) = &w.command {
            if let Some(n) = &w.command_note {
                o.comment(n);
            }
            o.array("command", cmd, &at("command"));
        }
        if let Some(g) = &w.gpus {
            o.comment(g);
            o.line("gpus = 1");
        }
    }

    /// Writes the closing comments: the test files and the rows that are
    /// not components, each with why.
    fn not_components(&mut self, plan: &Plan) {
        let o = self;
        if !plan.unused_tests.is_empty() || !plan.unused_rows.is_empty() {
            o.line("");
        }
        if !plan.unused_tests.is_empty() {
            o.comment("Test files that are not component parity tests (no component runs them):");
            for u in &plan.unused_tests {
                o.comment_at(2, &format!("{}: {}", u.what, u.reason));
            }
        }
        if !plan.unused_rows.is_empty() {
            o.comment("Rows that are not components:");
            for (u, cmd) in &plan.unused_rows {
                match cmd {
                    Some(c) => o.comment_at(2, &format!("{}: {}: {}", u.what, u.reason, c)),
                    None => o.comment_at(2, &format!("{}: {}", u.what, u.reason)),
                }
            }
        }
    }
}

/// Whether a value is a template to fill in (`<pinned-clone>`,
/// `/path/to/weights`, `${VAR}`), not a value to copy.
fn is_template_value(v: &str) -> bool {
    let v = v.trim();
    (v.starts_with('<') && v.ends_with('>'))
        || v.contains("/path/to/")
        || v.starts_with("${")
        || v.starts_with('$')
}

/// The kind folder a test sits in below `tests/local_tests/`
/// (`generic`, `transformers`, `vaes`), if it sits in one.
fn kind_folder(test: &str) -> Option<&str> {
    let rest = test.strip_prefix("tests/local_tests/")?;
    let (folder, file) = rest.split_once('/')?;
    (!file.contains('/')).then_some(folder)
}

/// The component type a label or Type cell names, if any.
pub(super) fn type_of(text: &str) -> Option<&'static str> {
    let id = ident(&Label::new(text).base);
    if let Some(t) = TYPES.iter().find(|t| **t == id) {
        return Some(t);
    }
    let lower = text.to_ascii_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let has = |w: &str| lower.contains(w);
    Some(if has("vae") || has("autoencoder") {
        "vae"
    } else if has("vocoder") {
        "vocoder"
    } else if has("upsampler") {
        "upsampler"
    } else if has("scheduler") {
        "scheduler"
    } else if has("conditioner") {
        "conditioner"
    } else if has("transformer") || words.contains(&"dit") {
        "dit"
    } else if has("encoder") || has("tokenizer") {
        "encoder"
    } else {
        return None;
    })
}

/// A variable's value with paths of the porter's checkout turned into
/// `{repo}` (each `:`-separated part); `true` when something changed.
pub(super) fn repo_value(v: &str, repo_name: &str) -> (String, bool) {
    let mut changed = false;
    let parts: Vec<String> = v
        .split(':')
        .map(|part| {
            if part.starts_with('/')
                && let Some(rel) = below_checkout(part, repo_name)
            {
                changed = true;
                if rel.is_empty() {
                    "{repo}".to_string()
                } else {
                    format!("{{repo}}/{rel}")
                }
            } else {
                part.to_string()
            }
        })
        .collect();
    (parts.join(":"), changed)
}
