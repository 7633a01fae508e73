//! `[prep]`: each prep_handoff field from the status file, the README,
//! `.gitignore`, or written `unknown` / `"<fill in: …>"` with where it
//! would come from.

use std::collections::BTreeSet;

use fvd_contracts::common::SourceLayout;
use fvd_contracts::fields::BlockStruct;
use fvd_contracts::prep::{DependencyChanges, OfficialEnvStatus, PrepHandoff};

use super::markdown::{self, ident, is_gap, key_words, one_line, strip_md};
use super::{Cx, Plan, command};

/// One `[prep]` value and why it is what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Pv {
    Known { value: String, source: String },
    List { items: Vec<String>, source: String },
    Unknown { searched: String },
    Fill { hint: String, from: String },
}

/// Keys of READMEs' field tables and status headers, as [`key_words`]
/// writes them, and the prep field each one gives.
fn synonym(words: &str) -> Option<&'static str> {
    Some(match words {
        "model family" => "model_family",
        "workload types" | "workload type" | "workload" | "workloads" => "workload_types",
        "official reference"
        | "official ref"
        | "official implementation"
        | "reference implementation"
        | "diffusers implementation" => "official_ref",
        "official ref dir"
        | "local reference dir"
        | "reference dir"
        | "official reference dir"
        | "source checkout"
        | "reference checkout" => "official_ref_dir",
        "official ref commit"
        | "official commit version"
        | "official commit"
        | "official version" => "official_ref_commit",
        "hf weights path" | "hf weights" | "checkpoint" | "hf checkpoint" => "hf_weights_path",
        "hf revision" => "hf_revision",
        "local weights dir" | "local weights" | "raw weights" => "local_weights_dir",
        "source layout" => "source_layout",
        "model index class" => "model_index_class",
        "needs conversion" => "needs_conversion",
        "hf token env" | "token env var" | "token env" => "hf_token_env",
        "dependency changes" => "dependency_changes",
        "official env status" => "official_env_status",
        "local tests readme" => "local_tests_readme",
        _ => return None,
    })
}

/// A field value found somewhere, and where.
#[derive(Debug, Clone)]
struct Found {
    value: String,
    source: String,
    /// The text as written, prose and markdown included.
    raw: String,
}

/// Fields that hold one word (an id, a path, a revision, a name): words
/// after it are prose, not part of it.
const ONE_WORD: &[&str] = &[
    "official_ref",
    "official_ref_dir",
    "official_ref_commit",
    "hf_weights_path",
    "hf_revision",
    "local_weights_dir",
    "model_index_class",
    "hf_token_env",
];

/// Fields that hold a path a worker reads: an absolute path on the
/// porter's machine (`/mnt/…`) is none a worker has.
const MACHINE_PATHS: &[&str] = &[
    "official_ref",
    "official_ref_dir",
    "local_weights_dir",
    "hf_weights_path",
];

/// The value a field's text gives, and the prose after it that is not
/// part of it (`` `../Ref` relative to the checkout ``, `default; pin it
/// before publishing`, `org/model (Diffusers layout)`); `Err` says why the
/// text gives no value (an absolute path of the porter's machine).
fn cleaned(key: &str, raw: &str) -> Result<(String, Option<String>), String> {
    let v = strip_md(raw).trim().to_string();
    let (value, prose) = if !ONE_WORD.contains(&key) || (key == "official_ref" && at_commit(&v)) {
        (v, None)
    } else {
        let t = raw.trim();
        // a value in backticks followed by words: the backticked part
        let quoted = t
            .strip_prefix('`')
            .and_then(|r| r.split_once('`'))
            .map(|(q, rest)| (q.trim().to_string(), strip_md(rest)));
        let (head, rest) = match quoted {
            Some((q, rest)) if !q.is_empty() => (q, rest),
            _ => match v.find(|c: char| c.is_whitespace() || c == ';' || c == ',') {
                Some(i) => (v[..i].to_string(), v[i..].to_string()),
                None => (v.clone(), String::new()),
            },
        };
        let more = rest.trim_start().strip_prefix(',').map(str::trim);
        if let Some(more) =
            more.filter(|m| m.split_whitespace().next().is_some_and(|w| w.contains('/')))
        {
            return Err(format!(
                "several values ({}, {}); prep picks one",
                head,
                one_line(more, 80)
            ));
        }
        let rest = rest
            .trim()
            .trim_start_matches([';', ',', '-', '—', ':'])
            .trim()
            .to_string();
        (head, (!rest.is_empty()).then_some(rest))
    };
    if MACHINE_PATHS.contains(&key) && value.contains('$') {
        return Err(format!(
            "a shell variable ({}) whose value each machine sets",
            one_line(&value, 80)
        ));
    }
    if MACHINE_PATHS.contains(&key) && (value.starts_with('/') || value.starts_with('~')) {
        return Err(format!(
            "an absolute path of the porter's machine ({}) a worker does not have",
            one_line(&value, 80)
        ));
    }
    Ok((value, prose))
}

/// `URL at SHA`.
fn at_commit(v: &str) -> bool {
    v.rsplit_once(" at ").is_some_and(|(_, sha)| {
        let sha = sha.trim().trim_matches('`');
        sha.len() >= 7 && sha.chars().all(|c| c.is_ascii_hexdigit())
    })
}

/// Values written as fields: `(prep field, value as written, where)`.
fn field_values(text: &str, file: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for t in markdown::tables(text) {
        if t.header.len() != 2 {
            continue;
        }
        for i in 0..t.rows.len() {
            if let Some(k) = synonym(&key_words(t.cell(i, 0))) {
                out.push((
                    k.to_string(),
                    t.cell(i, 1).to_string(),
                    format!("{file} `{}` table", t.heading),
                ));
            }
        }
    }
    let fields = <PrepHandoff as BlockStruct>::FIELDS;
    for line in text.lines() {
        let l = line.trim().trim_start_matches(['-', '*']).trim();
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let k = k.trim().trim_matches('`');
        if fields.contains(&k) {
            out.push((
                k.to_string(),
                v.trim().to_string(),
                format!("{file} `{k}:` line"),
            ));
        } else if let Some(field) = synonym(&key_words(k)).filter(|_| bullet(line)) {
            // `- Checkpoint: org/model` in a README's list
            out.push((
                field.to_string(),
                v.trim().to_string(),
                format!("{file} `{k}:` line"),
            ));
        }
    }
    out
}

/// A markdown list item (`- x`, `* x`).
fn bullet(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("- ") || t.starts_with("* ")
}

/// A folder field written through a stand-in for the checkout's root
/// (`<repo_root>/Ref/src`, `$PWD/Ref`) or as a variable with a default
/// (`${REF_DIR:-$PWD/Ref}`): the text with the repo-relative path in its
/// place, and how it was written. `None` for any other text.
fn repo_relative(key: &str, raw: &str) -> Option<(String, String)> {
    if !matches!(key, "official_ref_dir" | "local_weights_dir") {
        return None;
    }
    let t = raw.trim();
    let (path, rest) = match t.strip_prefix('`').and_then(|r| r.split_once('`')) {
        Some((q, rest)) => (q.trim(), rest),
        None => match t.split_once(char::is_whitespace) {
            Some((q, rest)) => (q, rest),
            None => (t, ""),
        },
    };
    let mut p = path;
    let mut defaulted = false;
    if let Some(inner) = p.strip_prefix("${").and_then(|r| r.strip_suffix('}')) {
        p = inner.split_once(":-")?.1;
        defaulted = true;
    }
    let mut rooted = false;
    for root in [
        "<repo_root>/",
        "<repo-root>/",
        "<repo>/",
        "$PWD/",
        "${PWD}/",
    ] {
        if let Some(r) = p.strip_prefix(root) {
            p = r;
            rooted = true;
            break;
        }
    }
    let p = p.trim_start_matches("./");
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/');
    if !(defaulted || rooted) || p.is_empty() || p.starts_with(['/', '.']) || !p.chars().all(plain)
    {
        return None;
    }
    let how = if defaulted {
        format!("written {path}: its default, the checkout's root being the repository")
    } else {
        format!("written {path}, the checkout's root being the repository")
    };
    Some((format!("`{p}`{rest}"), how))
}

impl Cx<'_> {
    fn readme_name(&self) -> String {
        format!("{}/README.md", self.dir)
    }

    /// Where init looked for a field, for `unknown` and `<fill in>` notes.
    fn searched(&self, gaps: &[String]) -> String {
        let mut s = Vec::new();
        if self.status.is_some() {
            s.push("PORT_STATUS.md Summary and header".to_string());
        } else {
            s.push("no PORT_STATUS.md".to_string());
        }
        if self.input.readme.is_some() {
            s.push("README.md field tables and `key:` lines".to_string());
        } else {
            s.push("no README.md".to_string());
        }
        let mut out = s.join(", ");
        for g in gaps {
            out.push_str(&format!("; {g} leaves it open"));
        }
        out
    }

    /// A field from the status Summary, the status header, then the README.
    /// `Err` carries the places that hold a gap (`<TODO>`) for it.
    fn find(&self, key: &str) -> Result<Found, Vec<String>> {
        let mut gaps = Vec::new();
        let mut candidates: Vec<(String, String)> = Vec::new();
        if let Some(st) = self.status {
            // an empty key is absence (a file without a Summary reads as
            // the contract's empty skeleton), not a recorded gap
            if let Some(v) = st.summary.get(key).filter(|v| !strip_md(v).is_empty()) {
                candidates.push((v.to_string(), "PORT_STATUS.md Summary".into()));
            }
            for l in &st.preamble {
                let l = l.trim().trim_start_matches(['-', '*']).trim();
                if let Some((k, v)) = l.split_once(':')
                    && synonym(&key_words(k)) == Some(key)
                {
                    candidates.push((v.to_string(), "PORT_STATUS.md header".into()));
                }
            }
        }
        if let Some(readme) = self.input.readme {
            for (k, v, src) in field_values(readme, "README.md") {
                if k == key {
                    candidates.push((v, src));
                }
            }
        }
        let in_status = candidates
            .iter()
            .any(|(_, s)| s.starts_with("PORT_STATUS.md"));
        if let Some(text) = self.input.status.filter(|_| !in_status) {
            // `- key: value` lines of other sections (a `## Status` list)
            for line in text.lines() {
                let Some(l) = line.trim_start().strip_prefix(['-', '*']) else {
                    continue;
                };
                if let Some((k, v)) = l.split_once(':')
                    && synonym(&key_words(k)) == Some(key)
                    && !candidates.iter().any(|(c, _)| c == v)
                {
                    let k = k.trim().trim_matches('`');
                    candidates.push((v.to_string(), format!("PORT_STATUS.md `{k}:` line")));
                }
            }
        }
        // texts that give no value, grouped by why
        let mut refused: Vec<(String, Vec<String>)> = Vec::new();
        for (v, source) in candidates {
            let (v, source) = match repo_relative(key, &v) {
                Some((v, how)) => (v, format!("{source} ({how})")),
                None => (v, source),
            };
            if is_gap(&v) {
                gaps.push(source);
                continue;
            }
            match cleaned(key, &v) {
                Ok((value, prose)) => {
                    let source = match prose {
                        Some(p) => format!(
                            "{source}; the words after it, {:?}, are not part of it",
                            one_line(&p, 80)
                        ),
                        None => source,
                    };
                    return Ok(Found {
                        value,
                        source,
                        raw: v,
                    });
                }
                Err(why) => match refused.iter_mut().find(|(w, _)| *w == why) {
                    Some((_, sources)) => sources.push(source),
                    None => refused.push((why, vec![source])),
                },
            }
        }
        for (why, sources) in refused {
            let verb = if sources.len() > 1 { "give" } else { "gives" };
            gaps.push(format!("{} {verb} {why}, which", sources.join(" and ")));
        }
        Err(gaps)
    }

    fn text_or_fill(&self, key: &str, hint: &str) -> Pv {
        match self.find(key) {
            Ok(f) => Pv::Known {
                value: f.value,
                source: f.source,
            },
            Err(gaps) => Pv::Fill {
                hint: hint.into(),
                from: format!("prep decides it; searched {}", self.searched(&gaps)),
            },
        }
    }

    fn text_or_unknown(&self, key: &str) -> Pv {
        match self.find(key) {
            Ok(f) => Pv::Known {
                value: f.value,
                source: f.source,
            },
            Err(gaps) => Pv::Unknown {
                searched: self.searched(&gaps),
            },
        }
    }

    fn enum_field<T: std::str::FromStr>(&self, key: &str, expected: &str) -> Pv {
        match self.find(key) {
            Ok(f) if f.value.parse::<T>().is_ok() => Pv::Known {
                value: f.value.trim().to_string(),
                source: f.source,
            },
            Ok(f) => Pv::Fill {
                hint: expected.into(),
                from: format!(
                    "{} says {:?}, not a contract value",
                    f.source,
                    one_line(&f.value, 80)
                ),
            },
            Err(gaps) => match stated(&self.all_texts(), key) {
                Some((value, source)) => Pv::Known { value, source },
                None => Pv::Fill {
                    hint: expected.into(),
                    from: format!("prep decides it; searched {}", self.searched(&gaps)),
                },
            },
        }
    }

    /// Every texts init reads, for searches across them.
    pub(super) fn all_texts(&self) -> Vec<(&'static str, &str)> {
        let mut v = Vec::new();
        if let Some(s) = self.input.status {
            v.push(("PORT_STATUS.md", s));
        }
        if let Some(r) = self.input.readme {
            v.push(("README.md", r));
        }
        v
    }

    pub(super) fn prep(&self, plan: &Plan) -> Vec<(&'static str, Pv)> {
        let mut out: Vec<(&'static str, Pv)> = Vec::new();
        for &field in <PrepHandoff as BlockStruct>::FIELDS {
            let v = match field {
                "model_family" => self.model_family(),
                "workload_types" => {
                    self.text_or_fill(field, "T2V, I2V, V2V, T2I or a shim with its rationale")
                }
                "official_ref" => self.official_ref(),
                "official_ref_dir" => {
                    self.text_or_fill(field, "the reference checkout's folder, or none")
                }
                "hf_weights_path" | "local_weights_dir" => self.weights(field),
                "official_ref_commit" => self.official_ref_commit(field),
                "hf_revision" => self.hf_revision(),
                "model_index_class" => self.model_index_class(),
                "source_layout" => self.source_layout(),
                "components_seen" => components_seen(plan),
                "needs_conversion" => self.needs_conversion(),
                "hf_token_env" => self.hf_token_env(),
                "dependency_changes" => {
                    self.enum_field::<DependencyChanges>(field, &DependencyChanges::expected())
                }
                "official_env_status" => {
                    self.enum_field::<OfficialEnvStatus>(field, &OfficialEnvStatus::expected())
                }
                "local_tests_readme" => self.local_tests_readme(),
                "port_state_file" => Pv::Known {
                    value: format!("{}/PORT_STATUS.md", self.dir),
                    source: if self.status.is_some() {
                        "the family's own status file".into()
                    } else {
                        "the family's own status file; it does not exist yet, fvd writes it when the port ends".into()
                    },
                },
                "gitignore_entries_added" => self.gitignore_entries(),
                "next_step" => next_step(&out),
                "open_questions" => self.open_rows("Q"),
                "escape_hatch" => self.escape_hatch(),
                _ => Pv::Fill {
                    hint: field.into(),
                    from: "a prep field init does not know yet".into(),
                },
            };
            out.push((field, v));
        }
        out
    }

    /// `model_family`: the family folder's name, with what the texts say
    /// when they name another.
    fn model_family(&self) -> Pv {
        let family = self.input.family;
        let source = match self.find("model_family") {
            Ok(f) if ident(&f.value) == family => f.source,
            Ok(f) => format!(
                "the family folder's name ({} says {:?})",
                f.source,
                one_line(&f.value, 60)
            ),
            Err(_) => "the family folder's name".into(),
        };
        Pv::Known {
            value: family.into(),
            source,
        }
    }

    /// `hf_weights_path` or `local_weights_dir` (`field`): as the texts
    /// give it, else from the README's download command, else to fill in.
    fn weights(&self, field: &str) -> Pv {
        match (self.find(field), self.download()) {
            (Ok(f), _) if field == "hf_weights_path" && f.value.contains('@') => {
                let (id, _) = f.value.split_once('@').unwrap_or_default();
                Pv::Known {
                    value: id.to_string(),
                    source: format!("{} (its @revision is hf_revision)", f.source),
                }
            }
            (Ok(f), _) => Pv::Known {
                value: f.value,
                source: f.source,
            },
            (Err(_), Some((id, _))) if field == "hf_weights_path" => Pv::Known {
                value: id,
                source: "README.md's huggingface-cli download command".into(),
            },
            (Err(_), Some((_, Some(dir)))) => Pv::Known {
                value: dir,
                source: "README.md's huggingface-cli download command (--local-dir)".into(),
            },
            (Err(gaps), _) => Pv::Fill {
                hint: if field == "hf_weights_path" {
                    "HF id or local path of the weights".into()
                } else {
                    "where the weights are staged".into()
                },
                from: format!(
                    "prep decides it; searched {} and its download commands",
                    self.searched(&gaps)
                ),
            },
        }
    }

    /// `hf_revision`: as the texts give it, else the revision
    /// `hf_weights_path` carries (`org/model@rev`, `org/model (revision
    /// rev)`), else unknown.
    fn hf_revision(&self) -> Pv {
        let given = self.text_or_unknown("hf_revision");
        let open = match &given {
            Pv::Unknown { .. } => true,
            Pv::Known { value, .. } => value.eq_ignore_ascii_case("unknown"),
            _ => false,
        };
        match self.weights_revision() {
            Some((_, rev, source)) if open => Pv::Known {
                value: rev,
                source: format!("{source}, the revision hf_weights_path names"),
            },
            _ => given,
        }
    }

    /// The HF id and revision of `hf_weights_path` when its text names a
    /// revision, and where.
    fn weights_revision(&self) -> Option<(String, String, String)> {
        let f = self.find("hf_weights_path").ok()?;
        if let Some((id, rev)) = f.value.split_once('@')
            && !rev.is_empty()
        {
            return Some((id.to_string(), rev.to_string(), f.source));
        }
        let words: Vec<&str> = f
            .raw
            .split(|c: char| c.is_whitespace() || matches!(c, '(' | ')' | ',' | ';' | '`'))
            .filter(|w| !w.is_empty())
            .collect();
        let at = words.iter().position(|w| {
            w.trim_end_matches([':', '='])
                .eq_ignore_ascii_case("revision")
        })?;
        let rev = words.get(at + 1)?.trim_start_matches(['=', ':']);
        (!rev.is_empty()).then(|| (f.value.clone(), rev.to_string(), f.source))
    }

    /// `official_ref_commit` (`field`): as the texts give it, else the
    /// commit of a `URL at SHA` reference, else unknown.
    fn official_ref_commit(&self, field: &str) -> Pv {
        match (self.find(field), self.ref_at_commit()) {
            (Ok(f), _) => Pv::Known {
                value: f.value,
                source: f.source,
            },
            (Err(_), Some((_, sha, source))) => Pv::Known {
                value: sha,
                source: format!("{source} (\"at <commit>\" after the reference)"),
            },
            (Err(gaps), None) => Pv::Unknown {
                searched: self.searched(&gaps),
            },
        }
    }

    /// `escape_hatch`: `none` when PORT_STATUS.md has no open escape hatch,
    /// else to fill in once they are answered.
    fn escape_hatch(&self) -> Pv {
        match self.open_rows("E") {
            Pv::List { items, .. } => Pv::Fill {
                hint: "none once the open escape hatches are answered".into(),
                from: format!(
                    "PORT_STATUS.md has open escape hatches: {}",
                    items.join("; ")
                ),
            },
            _ => Pv::Known {
                value: "none".into(),
                source: if self.status.is_some() {
                    "PORT_STATUS.md Escape Hatches: no open row".into()
                } else {
                    "nothing: no PORT_STATUS.md records an escape hatch".into()
                },
            },
        }
    }

    /// The repository and folder of the README's first `huggingface-cli
    /// download ID [--local-dir DIR]` (or `hf download`).
    fn download(&self) -> Option<(String, Option<String>)> {
        let readme = self.input.readme?;
        for line in readme.lines() {
            let Some(words) = command::words(line.trim()) else {
                continue;
            };
            let Some(at) = words.windows(2).position(|w| {
                matches!(w[0].as_str(), "huggingface-cli" | "hf") && w[1] == "download"
            }) else {
                continue;
            };
            let rest = &words[at + 2..];
            let Some(id) = rest.iter().find(|w| !w.starts_with('-') && w.contains('/')) else {
                continue;
            };
            let dir = rest
                .iter()
                .position(|w| w == "--local-dir")
                .and_then(|i| rest.get(i + 1))
                .or_else(|| {
                    rest.iter()
                        .find_map(|w| w.strip_prefix("--local-dir=").map(|_| w))
                })
                .map(|d| d.trim_start_matches("--local-dir=").to_string());
            return Some((id.clone(), dir));
        }
        None
    }

    /// `official_ref`: as the texts give it (the part before "at <commit>"
    /// of `URL at SHA`); a folder of the porter's machine (`../Ref`) gives
    /// way to a URL another text gives, since the folder is
    /// `official_ref_dir`'s.
    fn official_ref(&self) -> Pv {
        let given = match self.ref_at_commit() {
            Some((url, _, source)) => Pv::Known {
                value: url,
                source: format!("{source} (the part before \"at <commit>\")"),
            },
            None => self.text_or_fill(
                "official_ref",
                "url or import path of the official implementation",
            ),
        };
        let Pv::Known { value, source } = &given else {
            return given;
        };
        if !value.starts_with(['.', '/', '~', '<', '$']) {
            return given;
        }
        let url = self.input.readme.and_then(|r| {
            field_values(r, "README.md")
                .into_iter()
                .filter(|(k, _, _)| k == "official_ref")
                .find_map(|(_, v, src)| {
                    let (v, _) = cleaned("official_ref", &v).ok()?;
                    v.contains("://").then_some((v, src))
                })
        });
        match url {
            Some((url, src)) => Pv::Known {
                value: url,
                source: format!(
                    "{src}; {source} gives the folder {value:?}, which is official_ref_dir's"
                ),
            },
            None => given,
        }
    }

    /// `official_ref` written as `URL at SHA` (a commit glued to the
    /// reference): the reference, the commit and where it was read.
    fn ref_at_commit(&self) -> Option<(String, String, String)> {
        let f = self.find("official_ref").ok()?;
        let (url, sha) = f.value.rsplit_once(" at ")?;
        let sha = sha.trim().trim_matches('`');
        let hex = sha.len() >= 7 && sha.len() <= 64 && sha.chars().all(|c| c.is_ascii_hexdigit());
        hex.then(|| {
            (
                url.trim().trim_matches('`').to_string(),
                sha.to_string(),
                f.source,
            )
        })
    }

    fn model_index_class(&self) -> Pv {
        if let Ok(f) = self.find("model_index_class") {
            return Pv::Known {
                value: f.value,
                source: f.source,
            };
        }
        // `model_index_class=null` in an inspection's output, say; the name
        // as a whole word (not inside `converted_model_index_classes`)
        let whole = |text: &str, at: usize| {
            let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
            !text[..at].chars().next_back().is_some_and(word)
                && !text[at + "model_index_class".len()..]
                    .chars()
                    .next()
                    .is_some_and(word)
        };
        for (file, text) in self.all_texts() {
            if let Some(at) = text
                .match_indices("model_index_class")
                .map(|(i, _)| i)
                .find(|&i| whole(text, i))
            {
                let rest =
                    text[at + "model_index_class".len()..].trim_start_matches(['`', ' ', '=', ':']);
                let v: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.'))
                    .collect();
                if !v.is_empty() {
                    let value = if matches!(v.as_str(), "null" | "None" | "none") {
                        "none".to_string()
                    } else {
                        v
                    };
                    return Pv::Known {
                        value,
                        source: format!("`model_index_class` in {file}"),
                    };
                }
            }
        }
        if let Some(pv) = self.class_names() {
            return pv;
        }
        Pv::Unknown {
            searched: format!(
                "{}; `model_index_class` and `_class_name` anywhere in them",
                self.searched(&[])
            ),
        }
    }

    /// The pipeline class `model_index.json`'s `_class_name` names where
    /// the texts quote it (`_class_name=ZPipeline`, `` `_class_name:
    /// ZPipeline` ``): that class when they name one, a placeholder naming
    /// them when several (one per variant).
    fn class_names(&self) -> Option<Pv> {
        let mut names: Vec<(String, &str)> = Vec::new();
        for (file, text) in self.all_texts() {
            for (at, _) in text.match_indices("_class_name") {
                // `_class_name=X`, `_class_name: X`, `"_class_name": "X"`;
                // not the word in prose (`_class_name` identities)
                let Some(rest) = text[at + "_class_name".len()..]
                    .trim_start_matches(['"', '\''])
                    .trim_start()
                    .strip_prefix(['=', ':'])
                else {
                    continue;
                };
                let rest = rest.trim_start_matches(['`', '"', '\'', ' ']);
                let v: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if v.len() > 1 && !names.iter().any(|(n, _)| *n == v) {
                    names.push((v, file));
                }
            }
        }
        match names.as_slice() {
            [] => None,
            [(one, file)] => Some(Pv::Known {
                value: one.clone(),
                source: format!("`_class_name` in {file}"),
            }),
            several => Some(Pv::Fill {
                hint: "the pipeline class of the variant this port serves".into(),
                from: format!(
                    "the texts give several `_class_name`s ({}); prep picks one",
                    several
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
    }

    fn source_layout(&self) -> Pv {
        let mut said = Vec::new();
        let mut candidates: Vec<Found> = Vec::new();
        if let Ok(f) = self.find("source_layout") {
            candidates.push(f);
        }
        if let Some(v) = self
            .status
            .and_then(|s| s.conversion_state.get("source_layout"))
            .filter(|v| !is_gap(v))
        {
            candidates.push(Found {
                value: strip_md(v),
                source: "PORT_STATUS.md Conversion State".into(),
                raw: v.to_string(),
            });
        }
        for f in candidates {
            if f.value.to_ascii_lowercase().parse::<SourceLayout>().is_ok() {
                return Pv::Known {
                    value: f.value.to_ascii_lowercase(),
                    source: f.source,
                };
            }
            // `mixed raw checkpoints and …`: a contract value, then prose
            let lower = f.value.to_ascii_lowercase();
            if let Some((first, rest)) = lower.split_once(char::is_whitespace)
                && first.parse::<SourceLayout>().is_ok()
                && first != "unknown"
            {
                return Pv::Known {
                    value: first.to_string(),
                    source: format!(
                        "{}; the words after it, {:?}, are not part of it",
                        f.source,
                        one_line(rest.trim(), 80)
                    ),
                };
            }
            said.push(format!("{} says {:?}", f.source, one_line(&f.value, 60)));
        }
        for (file, text) in self.all_texts() {
            let lower = text.to_ascii_lowercase();
            if lower.contains("diffusers layout") || lower.contains("diffusers checkpoint layout") {
                return Pv::Known {
                    value: "diffusers".into(),
                    source: format!("{file}, which calls the checkpoint a Diffusers layout"),
                };
            }
        }
        let mut searched = self.searched(&[]);
        if !said.is_empty() {
            searched.push_str(&format!("; {}, not a source_layout value", said.join(", ")));
        }
        Pv::Unknown { searched }
    }

    fn needs_conversion(&self) -> Pv {
        // `none`, `no`, `not needed`, also with words after them (`none for
        // the reused components or native transformer`)
        let none_like = |v: &str| {
            let v = strip_md(v).to_ascii_lowercase();
            let first = v
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '/'))
                .find(|w| !w.is_empty())
                .unwrap_or_default();
            v.is_empty()
                || v == "-"
                || matches!(
                    first,
                    "none" | "n/a" | "na" | "no" | "not_required" | "not_needed"
                )
                || v.starts_with("not required")
                || v.starts_with("not needed")
        };
        if let Some(st) = self.status {
            for key in ["conversion_script", "converted_weights_dir"] {
                if let Some(v) = st.conversion_state.get(key)
                    && !none_like(v)
                    && !is_gap(v)
                {
                    return Pv::Known {
                        value: "yes".into(),
                        source: format!("PORT_STATUS.md Conversion State ({key} recorded)"),
                    };
                }
            }
            let says_no = |text: &str| {
                let l = text.to_ascii_lowercase();
                l.contains("no conversion")
                    || l.contains("not_required")
                    || l.contains("conversion is not required")
                    || l.contains("conversion not required")
                    || l.contains("conversion is not needed")
                    || l.contains("conversion not needed")
            };
            if let Some(v) = st.conversion_state.get("conversion_script")
                && none_like(v)
                && !is_gap(v)
                && !strip_md(v).is_empty()
            {
                return Pv::Known {
                    value: "no".into(),
                    source: format!(
                        "PORT_STATUS.md Conversion State (conversion_script: {})",
                        one_line(&strip_md(v), 60)
                    ),
                };
            }
            let raw = self.input.status.unwrap_or_default();
            if let Some(script) = sections_titled(raw, "conversion")
                .iter()
                .find_map(|s| conversion_script(s))
            {
                return Pv::Known {
                    value: "yes".into(),
                    source: format!("PORT_STATUS.md's conversion section (script {script})"),
                };
            }
            if sections_titled(raw, "conversion")
                .iter()
                .any(|s| says_no(s))
            {
                return Pv::Known {
                    value: "no".into(),
                    source: "PORT_STATUS.md, which says conversion is not required".into(),
                };
            }
        }
        match self.find("needs_conversion") {
            Ok(f) if matches!(f.value.to_ascii_lowercase().as_str(), "yes" | "no") => Pv::Known {
                value: f.value.to_ascii_lowercase(),
                source: f.source,
            },
            other => {
                let gaps = other.err().unwrap_or_default();
                Pv::Fill {
                    hint: "yes | no".into(),
                    from: format!(
                        "P0 needs it decided: yes when a conversion script or converted folder is recorded; searched PORT_STATUS.md Conversion State, {}",
                        self.searched(&gaps)
                    ),
                }
            }
        }
    }

    fn hf_token_env(&self) -> Pv {
        const NAMES: [&str; 4] = [
            "HF_TOKEN",
            "HUGGINGFACE_HUB_TOKEN",
            "HUGGING_FACE_HUB_TOKEN",
            "HF_API_KEY",
        ];
        if let Some(readme) = self.input.readme {
            for name in NAMES {
                let whole_word = readme.match_indices(name).any(|(i, _)| {
                    let before = readme[..i].chars().next_back();
                    let after = readme[i + name.len()..].chars().next();
                    let edge = |c: Option<char>| {
                        c.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'))
                    };
                    edge(before) && edge(after)
                });
                if whole_word {
                    return Pv::Known {
                        value: name.into(),
                        source: "README.md, which names the variable (never a value)".into(),
                    };
                }
            }
        }
        match self.find("hf_token_env") {
            Ok(f) if crate::is_env_name(&f.value) => Pv::Known {
                value: f.value,
                source: f.source,
            },
            Ok(f) if f.value.to_ascii_lowercase().starts_with("none") => Pv::Known {
                value: "none".into(),
                source: format!("{}: no token variable recorded", f.source),
            },
            _ => {
                if let Some(readme) = self.input.readme {
                    let l = readme.to_ascii_lowercase();
                    if let Some(i) = l.find("token env var") {
                        // the sentence, which may wrap onto the next line
                        let rest = &l[i..];
                        let end = [". ", ".\n", "\n\n"]
                            .iter()
                            .filter_map(|stop| rest.find(stop))
                            .min()
                            .unwrap_or(rest.len())
                            .min(160);
                        let sentence = rest.get(..end).unwrap_or(rest);
                        if sentence.contains("none") {
                            return Pv::Known {
                                value: "none".into(),
                                source: "README.md: no token variable recorded".into(),
                            };
                        }
                    }
                }
                Pv::Fill {
                    hint: "the variable that holds the HF token, or none".into(),
                    from: "a variable name only, never a value; searched README.md for HF_TOKEN, HUGGINGFACE_HUB_TOKEN and HF_API_KEY".into(),
                }
            }
        }
    }

    fn local_tests_readme(&self) -> Pv {
        let canonical = self.readme_name();
        if self.input.readme.is_some() {
            let source = match self.find("local_tests_readme") {
                Ok(f) if f.value != canonical => format!(
                    "the family's README.md ({} gives {:?})",
                    f.source,
                    one_line(&f.value, 100)
                ),
                _ => "the family's README.md".into(),
            };
            return Pv::Known {
                value: canonical,
                source,
            };
        }
        Pv::Fill {
            hint: "the family's README.md (write it first)".into(),
            from: format!("{canonical} does not exist"),
        }
    }

    fn gitignore_entries(&self) -> Pv {
        let Some(gi) = self.input.gitignore else {
            return Pv::Unknown {
                searched: "the checkout has no .gitignore".into(),
            };
        };
        // the folders prep stages: the reference checkout and the weights
        let mut wanted: Vec<String> = Vec::new();
        for key in ["official_ref_dir", "local_weights_dir"] {
            if let Ok(f) = self.find(key) {
                wanted.push(f.value);
            }
        }
        if let Some((_, Some(dir))) = self.download() {
            wanted.push(dir);
        }
        if let Some(v) = self
            .status
            .and_then(|s| s.conversion_state.get("converted_weights_dir"))
        {
            wanted.push(strip_md(v));
        }
        let roots: BTreeSet<String> = wanted
            .iter()
            .filter(|w| !w.starts_with('/'))
            .filter_map(|w| {
                w.trim_start_matches("./")
                    .split('/')
                    .next()
                    .map(str::to_string)
            })
            .filter(|r| !r.is_empty() && r != "none" && !r.contains(char::is_whitespace))
            .collect();
        // the folders themselves, for a line that names one below the root
        // (`official_weights/Model/`) or a parent of one
        let folders: Vec<String> = wanted
            .iter()
            .filter(|w| !w.starts_with('/'))
            .map(|w| w.trim_start_matches("./").trim_end_matches('/').to_string())
            .filter(|w| !w.is_empty() && w != "none" && !w.contains(char::is_whitespace))
            .collect();
        let mut items = Vec::new();
        for line in gi.lines() {
            let l = line.trim();
            if l.starts_with('#') || l.is_empty() || l.starts_with('!') {
                continue;
            }
            let bare = l.trim_start_matches('/').trim_end_matches('/');
            let names = roots.contains(bare)
                || folders
                    .iter()
                    .any(|f| f == bare || f.starts_with(&format!("{bare}/")));
            if names && !bare.is_empty() && !items.contains(&l.to_string()) {
                items.push(l.to_string());
            }
        }
        if items.is_empty() {
            Pv::Unknown {
                searched: format!(
                    ".gitignore for the reference and weight folders ({})",
                    if roots.is_empty() {
                        "none recorded".to_string()
                    } else {
                        roots.into_iter().collect::<Vec<_>>().join(", ")
                    }
                ),
            }
        } else {
            Pv::List {
                items,
                source: ".gitignore lines for the reference and weight folders".into(),
            }
        }
    }

    /// Open rows of Open Questions (`Q`) or Escape Hatches (`E`): a list of
    /// `ID: question`, `none`, or `unknown` without a status file.
    fn open_rows(&self, kind: &str) -> Pv {
        let Some(st) = self.status else {
            return Pv::Unknown {
                searched: "no PORT_STATUS.md records them".into(),
            };
        };
        let (section, t) = if kind == "Q" {
            ("Open Questions", &st.open_questions.table)
        } else {
            ("Escape Hatches", &st.escape_hatches.table)
        };
        let closed = |s: &str| {
            matches!(
                strip_md(s).to_ascii_lowercase().as_str(),
                "resolved"
                    | "closed"
                    | "answered"
                    | "done"
                    | "complete"
                    | "completed"
                    | "fixed"
                    | "superseded"
                    | "withdrawn"
                    | "wontfix"
                    | "won't fix"
                    | "n/a"
            )
        };
        let mut items = Vec::new();
        for i in 0..t.rows.len() {
            let status = t.cell(i, "Status").unwrap_or_default();
            let resolution = t.cell(i, "Resolution").unwrap_or_default();
            if closed(status) || (strip_md(status).is_empty() && !strip_md(resolution).is_empty()) {
                continue;
            }
            let id = strip_md(t.cell(i, "ID").unwrap_or_default());
            let q = strip_md(t.cell(i, "Question").unwrap_or_default());
            if id.is_empty() && q.is_empty() {
                continue;
            }
            items.push(one_line(&format!("{id}: {q}"), 160));
        }
        if items.is_empty() {
            Pv::Known {
                value: "none".into(),
                source: format!("PORT_STATUS.md {section}: no open row"),
            }
        } else {
            Pv::List {
                items,
                source: format!("open rows of PORT_STATUS.md {section}"),
            }
        }
    }
}

/// `components_seen`: the status's component table, else the components
/// found, else to fill in.
fn components_seen(plan: &Plan) -> Pv {
    if !plan.matrix_labels.is_empty() {
        Pv::List {
            items: plan.matrix_labels.clone(),
            source: "PORT_STATUS.md component table".into(),
        }
    } else if !plan.cands.is_empty() {
        Pv::List {
            items: plan.cands.iter().map(|c| c.name.clone()).collect(),
            source: "the components below (no component table in PORT_STATUS.md)".into(),
        }
    } else {
        Pv::Fill {
            hint: "the components of the official model".into(),
            from: "no component table and no parity test found".into(),
        }
    }
}

/// `next_step`: `add-model` when the `official_env_status` already in
/// `out` allows parity scaffolding, else to fill in.
fn next_step(out: &[(&'static str, Pv)]) -> Pv {
    match out.iter().find(|(k, _)| *k == "official_env_status") {
        Some((_, Pv::Known { value, .. }))
            if value
                .parse::<OfficialEnvStatus>()
                .is_ok_and(OfficialEnvStatus::allows_parity_scaffolding) =>
        {
            Pv::Known {
                value: "add-model".into(),
                source: "official_env_status, which allows parity scaffolding".into(),
            }
        }
        _ => Pv::Fill {
            hint: "add-model | ask_user".into(),
            from: "follows official_env_status, which is not decided".into(),
        },
    }
}

/// The script a conversion section's `- Script: path.py` (`Converter:`,
/// `Conversion script:`) line names.
fn conversion_script(section: &str) -> Option<String> {
    section.lines().find_map(|line| {
        let l = line.trim_start().strip_prefix(['-', '*'])?;
        let (k, v) = l.split_once(':')?;
        let named = matches!(
            key_words(k).as_str(),
            "script" | "converter" | "conversion script" | "conversion_script"
        );
        let v = strip_md(v);
        let path = v.split_whitespace().find(|w| w.ends_with(".py"))?;
        named.then(|| path.to_string())
    })
}

/// A sentence of the texts that states `field` in words (`Official
/// source imports successfully … with no dependency changes.`): the
/// contract value and the line, for a field no `key:` line gives.
fn stated(texts: &[(&'static str, &str)], field: &str) -> Option<(String, String)> {
    for (file, text) in texts {
        // a table row is a record of its own (an issue's resolution), not
        // the port's statement
        for line in text.lines().filter(|l| !l.trim_start().starts_with('|')) {
            let l = line.to_ascii_lowercase();
            let value = match field {
                "dependency_changes"
                    if l.contains("no dependency changes")
                        || l.contains("no dependency change was") =>
                {
                    "none"
                }
                "official_env_status"
                    if l.contains("official")
                        && (l.contains("imports successfully")
                            || l.contains("imports cleanly"))
                        && !l.contains("not ")
                        && !l.contains("fail") =>
                {
                    "imports_ok"
                }
                _ => continue,
            };
            let said = strip_md(line.trim().trim_start_matches(['-', '*']).trim());
            return Some((
                value.to_string(),
                format!("{file}, which says {:?}", one_line(&said, 100)),
            ));
        }
    }
    None
}

/// The bodies of the `## ` sections of `text` whose heading contains `word`
/// (case-insensitive), headings inside fences left alone.
fn sections_titled(text: &str, word: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut inside = false;
    let mut fenced = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fenced = !fenced;
        }
        if !fenced && t.starts_with("## ") {
            inside = t.to_ascii_lowercase().contains(word);
            if inside {
                out.push(String::new());
            }
            continue;
        }
        if inside && let Some(last) = out.last_mut() {
            last.push_str(line);
            last.push('\n');
        }
    }
    out
}
