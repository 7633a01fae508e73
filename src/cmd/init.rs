//! `fvd init`: writes `REPO/tests/local_tests/<family>/port.toml` from what
//! the checkout already records (the family's `PORT_STATUS.md`, README and
//! test files). The inference is `fvd_spec::init`; this module reads the
//! files, writes the spec and prints the summary.
//!
//! Exit codes: 0 written; 2 when the spec exists (without `--force`), the
//! family folder is missing or a file cannot be read.

use super::exit::Exit;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use fvd_spec::init::{self, Input};

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Model family: the folder `tests/local_tests/<family>`.
    #[arg(long)]
    pub family: String,
    /// The checkout (default: the current directory).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// Rewrite an existing port.toml.
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: InitArgs) -> anyhow::Result<Exit> {
    init::check_family(&args.family)?;
    let repo = super::find_repo(&args.repo, &args.family)
        .canonicalize()
        .with_context(|| format!("repository {}", args.repo.display()))?;
    let rel_dir = format!("tests/local_tests/{}", args.family);
    let dir = repo.join(&rel_dir);
    if !dir.is_dir() {
        bail!(
            "{}: no such family folder (fvd init reads the family's PORT_STATUS.md, README.md and test files there)",
            args.repo.join(&rel_dir).display()
        );
    }
    // shown as the user gave the repository
    let shown = args.repo.join(&rel_dir).join("port.toml");
    let target = fvd_spec::default_path(&repo, &args.family);
    if target.exists() && !args.force {
        bail!(
            "{} already exists; pass --force to rewrite it",
            shown.display()
        );
    }
    let status = read_optional(&dir.join("PORT_STATUS.md"))?;
    let readme = read_optional(&dir.join("README.md"))?;
    let gitignore = read_optional(&repo.join(".gitignore"))?;
    let mut tests = Vec::new();
    collect_tests(&repo, &dir, &mut tests)
        .with_context(|| format!("cannot list {}", args.repo.join(&rel_dir).display()))?;
    // FastVideo keeps a family's parity tests by kind beside its folder
    // (`tests/local_tests/generic/test_F_C_parity.py`): those named for
    // the family are its too (issue #43: the example's time_shift, named
    // by no status row, was dropped).
    let local = repo.join("tests/local_tests");
    let prefix = format!("test_{}_", args.family);
    let mut beside = Vec::new();
    for entry in std::fs::read_dir(&local).into_iter().flatten().flatten() {
        let path = entry.path();
        if path != dir && entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_tests(&repo, &path, &mut beside)
                .with_context(|| format!("cannot list {}", path.display()))?;
        }
    }
    tests.extend(beside.into_iter().filter(|t| {
        t.rsplit('/')
            .next()
            .is_some_and(|name| name.starts_with(&prefix))
    }));
    tests.sort();
    tests.dedup();
    let repo_name = repo
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let input = Input {
        family: &args.family,
        repo_name: &repo_name,
        status: status.as_deref(),
        readme: readme.as_deref(),
        gitignore: gitignore.as_deref(),
        tests: &tests,
    };
    let read = |rel: &str| read_in_repo(&repo, rel);
    let out = init::infer(&input, &read)?;

    let tmp = target.with_extension("toml.tmp");
    std::fs::write(&tmp, &out.toml).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &target).with_context(|| format!("cannot write {}", shown.display()))?;

    let mut o = std::io::stdout().lock();
    let s = &out.summary;
    let mut lines = vec![format!("wrote {}", shown.display())];
    lines.push(format!("components ({}):", s.components.len()));
    for (name, tests) in &s.components {
        let files = if tests.is_empty() {
            "no test file found".to_string()
        } else {
            tests.join(", ")
        };
        lines.push(format!("  {name}: {files}"));
    }
    lines.push(format!("placeholders left ({}):", s.placeholders.len()));
    for p in &s.placeholders {
        lines.push(format!("  {}:{}: {}", shown.display(), p.line, p.field));
    }
    if !s.later.is_empty() {
        lines.push(format!("pipeline and quality ({}):", s.later.len()));
        for l in &s.later {
            lines.push(format!("  {l}"));
        }
    }
    lines.push(format!("test files not used ({}):", s.unused_tests.len()));
    for u in &s.unused_tests {
        lines.push(format!("  {}: {}", u.what, u.reason));
    }
    lines.push(format!("rows not used ({}):", s.unused_rows.len()));
    for u in &s.unused_rows {
        lines.push(format!("  {}: {}", u.what, u.reason));
    }
    if !s.placeholders.is_empty() {
        lines.push(format!(
            "fill in the placeholders, then: fvd submit --family {} --repo {}",
            args.family,
            args.repo.display()
        ));
    }
    for l in lines {
        match writeln!(o, "{l}") {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => break,
            other => other.context("cannot write the summary to stdout")?,
        }
    }
    Ok(Exit::Success)
}

/// A file's text, `None` when it does not exist; an error names the file.
fn read_optional(path: &Path) -> anyhow::Result<Option<String>> {
    match std::fs::read(path) {
        Ok(bytes) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| anyhow::anyhow!("cannot read {}: not utf-8 text", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// A repo-relative file a status row names; `None` when it is not a plain
/// path inside the checkout or cannot be read.
fn read_in_repo(repo: &Path, rel: &str) -> Option<String> {
    let p = Path::new(rel);
    if !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return None;
    }
    let bytes = std::fs::read(repo.join(p)).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Repo-relative paths (with `/`) of the `test_*.py` files under `dir`.
fn collect_tests(repo: &Path, dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            if name != "__pycache__" && !name.starts_with('.') {
                collect_tests(repo, &path, out)?;
            }
        } else if name.starts_with("test_")
            && name.ends_with(".py")
            && let Ok(rel) = path.strip_prefix(repo)
        {
            let parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push(parts.join("/"));
        }
    }
    Ok(())
}
