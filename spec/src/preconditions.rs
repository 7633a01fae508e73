//! What the gate checks of a spec before any work runs: P0 (the prep
//! handoff complete, decided and free of placeholders and token values; the
//! state file the family's own; coverage scopes the contract knows; no value
//! the family's `PORT_STATUS.md` contradicts) and P2
//! (every parity test a file inside the repository). Pure functions of the
//! spec and the repository path, so `fvd init`, `fvd submit --dry-run` and
//! the gate actor ask the same questions.

use std::path::Path;

use fvd_contracts::common::CoverageScope;
use fvd_contracts::kind::{ContractKind, check_block};

use crate::PortSpec;

/// P0: the prep handoff is complete, free of token values and of
/// placeholders, `needs_conversion` is decided (`yes` or `no`: `unknown`
/// sends the port back to prep), the state file belongs to the family, and
/// every component's coverage scope is one the parity contract knows. Each
/// condition names the spec file and line.
pub fn prep_conditions(spec: &PortSpec, repo: &Path) -> Vec<String> {
    let file = display_path(&spec.path, repo);
    let at = |line: Option<usize>| match line {
        Some(l) => format!("{file}:{l}"),
        None => file.clone(),
    };
    let prep_at = |field: &str| at(spec.prep_lines.get(field).copied());
    let text: String = spec
        .prep
        .iter()
        .map(|(k, v)| format!("{k}: {v}\n"))
        .collect();
    let mut unmet: Vec<String> = check_block(ContractKind::PrepHandoff, &text, 1)
        .into_iter()
        .map(|f| {
            // A finding of a nested field names its root key first.
            let root = f.field.split(['.', '[']).next().unwrap_or(&f.field);
            format!("{}: prep.{}: {}", prep_at(root), f.field, f.message)
        })
        .collect();
    match spec.prep.get("needs_conversion").map(|v| v.trim()) {
        Some("yes" | "no") | None => {}
        Some(other) => unmet.push(format!(
            "{}: prep.needs_conversion: is {other:?}; P0 needs yes or no (an undecided conversion goes back to prep)",
            prep_at("needs_conversion")
        )),
    }
    if let Some(p) = spec.prep.get("port_state_file")
        && !fvd_contracts::contract::is_placeholder(p)
        && !owned_state_file(p, &spec.family)
    {
        unmet.push(format!(
            "{}: prep.port_state_file: {p} is not inside tests/local_tests/{}/; a port writes only its own family's state file",
            prep_at("port_state_file"),
            spec.family
        ));
    }
    // The parity contract's fields are the components' (a pipeline step
    // is P7's, checked by the spec).
    for c in spec.parity_components() {
        let line = |field: &str| at(c.lines.get(field).copied());
        for (field, value) in [
            ("type", c.component_type.as_str()),
            ("coverage_scope", c.coverage_scope.as_str()),
        ] {
            if fvd_contracts::contract::is_placeholder(value) {
                unmet.push(format!(
                    "{}: component {}: {field} is a placeholder ({value}); fill it in",
                    line(field),
                    c.name
                ));
            }
        }
        for t in &c.parity_tests {
            if fvd_contracts::contract::is_placeholder(t) {
                unmet.push(format!(
                    "{}: component {}: parity_test is a placeholder ({t}); fill it in",
                    line("parity_test"),
                    c.name
                ));
            }
        }
        for (k, v) in &c.set_env {
            if fvd_contracts::contract::is_placeholder(v) {
                unmet.push(format!(
                    "{}: component {}: set_env.{k} is a placeholder ({v}); fill it in",
                    line("name"),
                    c.name
                ));
            }
        }
        if !fvd_contracts::contract::is_placeholder(&c.coverage_scope)
            && c.coverage_scope.parse::<CoverageScope>().is_err()
        {
            unmet.push(format!(
                "{}: component {}: coverage_scope is {:?}; the parity contract knows {}",
                line("coverage_scope"),
                c.name,
                c.coverage_scope,
                CoverageScope::expected()
            ));
        }
    }
    // what the porter's own status file records
    let state = spec
        .prep
        .get("port_state_file")
        .filter(|p| {
            !fvd_contracts::contract::is_placeholder(p) && owned_state_file(p, &spec.family)
        })
        .cloned()
        .unwrap_or_else(|| format!("tests/local_tests/{}/PORT_STATUS.md", spec.family));
    if let Ok(path) = fvd_paths::join_under_no_links(repo, &state)
        && let Ok(text) = std::fs::read_to_string(path)
    {
        unmet.extend(status_conditions(spec, &text, &prep_at));
    }
    unmet
}

/// P0's check of the spec against the port's own `PORT_STATUS.md`: where
/// both record a value (the Summary's `model_family`, `official_ref`,
/// `official_ref_commit`, `hf_weights_path`, `source_layout`,
/// `model_index_class`; Conversion State's `conversion_script` for
/// `needs_conversion`), they must agree. A value either side leaves open
/// (`unknown`, a placeholder, empty) is no disagreement. Each finding names
/// the spec line and both values.
pub fn status_conditions(
    spec: &PortSpec,
    status: &str,
    at: &dyn Fn(&str) -> String,
) -> Vec<String> {
    use fvd_contracts::port_status::{import, plain};
    let (st, _) = import(status);
    let norm = |v: &str| {
        plain(v)
            .replace('`', "")
            .trim_matches(['"', '\''])
            .trim()
            .trim_end_matches('/')
            .to_ascii_lowercase()
    };
    let open = |v: &str| {
        let n = norm(v);
        n.is_empty()
            || matches!(n.as_str(), "unknown" | "tbd" | "todo" | "n/a" | "-")
            || fvd_contracts::contract::is_placeholder(v)
            || n.starts_with('<')
    };
    let mut unmet = Vec::new();
    let mut differ = |field: &str, mine: &str, theirs: &str, source: &str| {
        unmet.push(format!(
            "{}: prep.{field}: is {mine:?} but {source} says {:?}; make them agree",
            at(field),
            plain(theirs)
        ));
    };
    let family = st.summary.get("model_family").map(str::to_owned);
    if let Some(f) = family.filter(|f| !open(f))
        && norm(&f) != spec.family
    {
        differ("model_family", &spec.family, &f, "PORT_STATUS.md Summary");
    }
    for field in [
        "official_ref",
        "official_ref_commit",
        "hf_weights_path",
        "source_layout",
        "model_index_class",
    ] {
        // a commit glued to the reference (`URL at SHA`) is the reference's commit
        let glued = || {
            st.summary
                .get("official_ref")
                .and_then(|r| r.rsplit_once(" at ").map(|(_, sha)| sha.to_owned()))
        };
        let theirs = match (field, st.summary.get(field)) {
            (_, Some(v)) => Some(v.to_owned()),
            ("official_ref_commit", None) => glued(),
            _ => None,
        };
        let (Some(mine), Some(theirs)) = (spec.prep.get(field), theirs) else {
            continue;
        };
        let theirs = theirs.as_str();
        if open(mine) || open(theirs) {
            continue;
        }
        let (a, b) = (norm(mine), norm(theirs));
        // a folder of the porter's machine (`../Ref`, `/mnt/…`) says where
        // their checkout lies, not which reference it is: no disagreement
        let reference = b.rsplit_once(" at ").map_or(b.as_str(), |(u, _)| u.trim());
        if matches!(field, "official_ref" | "hf_weights_path")
            && reference.starts_with(['/', '~', '.'])
            && !a.starts_with(['/', '~', '.'])
        {
            continue;
        }
        // the value before prose the file writes after it (`org/model
        // (Diffusers layout)`, `` `../Ref` relative to … ``)
        let prose = b
            .strip_prefix(a.as_str())
            .is_some_and(|r| r.starts_with([' ', ';', ',', '(']) && !r.starts_with(" at "));
        let agree = prose
            || match field {
                // one sha may be written short
                "official_ref_commit" => a.starts_with(&b) || b.starts_with(&a),
                // `URL at SHA`: the reference is the part before ` at `
                "official_ref" => {
                    a == b || b.rsplit_once(" at ").is_some_and(|(u, _)| norm(u) == a)
                }
                "hf_weights_path" => {
                    a == b || at_revision(&a, &b, spec.prep.get("hf_revision").map(|r| norm(r)))
                }
                _ => a == b,
            };
        if !agree {
            differ(field, mine, theirs, "PORT_STATUS.md Summary");
        }
    }
    if let (Some(mine), Some(script)) = (
        spec.prep.get("needs_conversion"),
        st.conversion_state.get("conversion_script"),
    ) && !open(script)
    {
        let s = norm(script);
        let first = s
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '/'))
            .find(|w| !w.is_empty())
            .unwrap_or_default();
        let none = matches!(first, "none" | "no" | "n/a" | "not_required" | "not_needed")
            || s.starts_with("not required")
            || s.starts_with("not needed");
        let says = if none { "no" } else { "yes" };
        if matches!(mine.as_str(), "yes" | "no") && mine != says {
            differ(
                "needs_conversion",
                mine,
                script,
                "PORT_STATUS.md Conversion State's conversion_script",
            );
        }
    }
    unmet
}

/// The file's `org/model@rev` against the spec's id `mine` and its
/// hf_revision: the way init writes them, so they agree when the id is the
/// same and one revision starts the other (a sha may be written short).
fn at_revision(mine: &str, theirs: &str, revision: Option<String>) -> bool {
    theirs.split_once('@').is_some_and(|(id, rev)| {
        id == mine
            && revision
                .is_some_and(|m| !m.is_empty() && (m.starts_with(rev) || rev.starts_with(&m)))
    })
}

/// Whether a `port_state_file` value is a relative path inside
/// `tests/local_tests/<family>/` (no `..`, not absolute).
pub fn owned_state_file(path: &str, family: &str) -> bool {
    let p = Path::new(path.trim().trim_matches('`'));
    let mut parts = p.components();
    let prefix = [
        std::path::Component::Normal("tests".as_ref()),
        std::path::Component::Normal("local_tests".as_ref()),
        std::path::Component::Normal(family.as_ref()),
    ];
    prefix
        .iter()
        .all(|want| parts.next().as_ref() == Some(want))
        && parts.clone().next().is_some()
        && parts.all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// `path` relative to `repo` when it lies inside it, as given otherwise.
fn display_path(path: &str, repo: &Path) -> String {
    Path::new(path)
        .strip_prefix(repo)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.to_string())
}

/// Whether `path`, with every symbolic link resolved, lies inside `repo`
/// (itself resolved).
fn resolves_inside(path: &Path, repo: &Path) -> bool {
    match (path.canonicalize(), repo.canonicalize()) {
        (Ok(p), Ok(r)) => p.starts_with(r),
        _ => false,
    }
}

/// P2: every component's parity test file exists, and the official side
/// imports (or its private deps are stubbed) so scaffolding may start.
pub fn scaffold_conditions(spec: &PortSpec, repo: &Path) -> Vec<String> {
    let mut unmet = Vec::new();
    match spec.prep.get("official_env_status").map(String::as_str) {
        Some("imports_ok" | "private_deps_need_stubs") => {}
        other => unmet.push(format!(
            "official_env_status is {}; parity scaffolding needs imports_ok or private_deps_need_stubs",
            other.unwrap_or("missing")
        )),
    }
    // The pipeline's tests are P7's: their files may come later.
    for c in spec.parity_components() {
        for t in c.test_files() {
            match fvd_paths::join_under(repo, t) {
                Err(e) => unmet.push(format!(
                    "component {}: parity test is not in the repository: {e}",
                    c.name
                )),
                Ok(p) if !p.is_file() => unmet.push(format!(
                    "component {}: parity test {t} does not exist",
                    c.name
                )),
                // A committed symbolic link must not make a file outside
                // the repository the parity test.
                Ok(p) if !resolves_inside(&p, repo) => unmet.push(format!(
                    "component {}: parity test {t} is a symbolic link (or lies below one) that leads outside the repository",
                    c.name
                )),
                Ok(_) => {}
            }
        }
    }
    unmet
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#"[prep]
model_family = "tiny"
workload_types = "T2V"
official_ref = "https://example.invalid/tiny"
official_ref_dir = "official/"
official_ref_commit = "abc123"
hf_weights_path = "example/tiny"
hf_revision = "main"
local_weights_dir = "official_weights/tiny"
source_layout = "diffusers"
model_index_class = "none"
components_seen = ["embed"]
needs_conversion = "no"
hf_token_env = "HF_TOKEN"
dependency_changes = "none"
official_env_status = "imports_ok"
local_tests_readme = "tests/local_tests/tiny/README.md"
port_state_file = "tests/local_tests/tiny/PORT_STATUS.md"
gitignore_entries_added = ["official_weights/"]
next_step = "add-model"
open_questions = []
escape_hatch = "none"

[[component]]
name = "embed"
type = "generic"
parity_test = "tests/local_tests/tiny/test_embed.py"
coverage_scope = "both"
"#;

    fn conditions(text: &str) -> Vec<String> {
        let spec = crate::parse(Path::new("/repo/tests/local_tests/tiny/port.toml"), text).unwrap();
        prep_conditions(&spec, Path::new("/repo"))
    }

    #[test]
    fn a_complete_prep_passes_p0() {
        assert_eq!(conditions(SPEC), Vec::<String>::new());
    }

    #[test]
    fn undecided_conversion_and_unknown_scope_are_refused_with_file_and_line() {
        let text = SPEC
            .replace(
                "needs_conversion = \"no\"",
                "needs_conversion = \"unknown\"",
            )
            .replace("coverage_scope = \"both\"", "coverage_scope = \"full\"");
        let c = conditions(&text);
        assert!(
            c.iter().any(|m| m.starts_with(
                "tests/local_tests/tiny/port.toml:13: prep.needs_conversion: is \"unknown\""
            )),
            "{c:#?}"
        );
        assert!(
            c.iter().any(|m| m.starts_with(
                "tests/local_tests/tiny/port.toml:28: component embed: coverage_scope is \"full\"; the parity contract knows production_loader | implementation_subcomponent | both"
            )),
            "{c:#?}"
        );
    }

    #[test]
    fn placeholders_are_refused_where_they_are_written() {
        let text = SPEC
            .replace(
                "official_ref_commit = \"abc123\"",
                "official_ref_commit = \"<fill in: git -C official rev-parse HEAD>\"",
            )
            .replace(
                "type = \"generic\"",
                "type = \"<fill in: vae | encoder | dit | generic>\"",
            );
        let c = conditions(&text);
        assert!(
            c.iter()
                .any(|m| m
                    .starts_with("tests/local_tests/tiny/port.toml:6: prep.official_ref_commit:")),
            "{c:#?}"
        );
        assert!(
            c.iter().any(|m| m.starts_with(
                "tests/local_tests/tiny/port.toml:26: component embed: type is a placeholder"
            )),
            "{c:#?}"
        );
    }

    #[test]
    fn a_state_file_of_another_family_is_refused() {
        for other in [
            "tests/local_tests/dreamx/PORT_STATUS.md",
            "../PORT_STATUS.md",
            "/etc/PORT_STATUS.md",
            "tests/local_tests/tiny/../dreamx/PORT_STATUS.md",
            "tests/local_tests/tiny",
        ] {
            let text = SPEC.replace("tests/local_tests/tiny/PORT_STATUS.md", other);
            let c = conditions(&text);
            assert!(
                c.iter().any(|m| m
                    .starts_with("tests/local_tests/tiny/port.toml:18: prep.port_state_file:")
                    && m.contains("not inside tests/local_tests/tiny/")),
                "{other}: {c:#?}"
            );
        }
        assert!(owned_state_file("tests/local_tests/tiny/STATUS.md", "tiny"));
        assert!(owned_state_file(
            "`tests/local_tests/tiny/PORT_STATUS.md`",
            "tiny"
        ));
    }

    #[test]
    fn parity_tests_must_be_files_inside_the_repository() {
        let top = tempfile::tempdir().unwrap();
        let repo = top.path().join("repo");
        std::fs::create_dir_all(repo.join("t")).unwrap();
        std::fs::write(repo.join("t/test_a.py"), "").unwrap();
        std::fs::write(top.path().join("test_outside.py"), "").unwrap();
        let spec = |parity_test: &str| {
            crate::parse(
                Path::new("p.toml"),
                &format!(
                    "[prep]\nmodel_family = \"p\"\nofficial_env_status = \"imports_ok\"\n\n[[component]]\nname = \"a\"\ntype = \"generic\"\nparity_test = {parity_test:?}\ncoverage_scope = \"both\"\n"
                ),
            )
            .unwrap()
        };
        assert!(scaffold_conditions(&spec("t/test_a.py"), &repo).is_empty());
        let missing = scaffold_conditions(&spec("t/test_b.py"), &repo);
        assert_eq!(
            missing,
            ["component a: parity test t/test_b.py does not exist"]
        );
        // Both exist, outside the repository.
        let outside = top.path().join("test_outside.py").display().to_string();
        for bad in ["../test_outside.py", outside.as_str()] {
            let unmet = scaffold_conditions(&spec(bad), &repo);
            assert_eq!(unmet.len(), 1, "{bad}: {unmet:?}");
            assert!(unmet[0].contains("is not in the repository"), "{unmet:?}");
        }
        // A committed link to a file outside, or a folder link leading
        // there: refused. A link inside the repository stays fine.
        std::os::unix::fs::symlink(
            top.path().join("test_outside.py"),
            repo.join("t/test_link.py"),
        )
        .unwrap();
        std::os::unix::fs::symlink(top.path(), repo.join("up")).unwrap();
        std::os::unix::fs::symlink(repo.join("t/test_a.py"), repo.join("t/test_same.py")).unwrap();
        for bad in ["t/test_link.py", "up/test_outside.py"] {
            let unmet = scaffold_conditions(&spec(bad), &repo);
            assert_eq!(unmet.len(), 1, "{bad}: {unmet:?}");
            assert!(
                unmet[0].contains("leads outside the repository"),
                "{unmet:?}"
            );
        }
        assert!(scaffold_conditions(&spec("t/test_same.py"), &repo).is_empty());
    }
}
