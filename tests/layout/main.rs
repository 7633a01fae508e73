//! Checks of the repository's shape that no crate's own tests see: the
//! one git runner (`git.rs`), the
//! layer rule of `ARCHITECTURE.md` against the crates' real dependencies
//! (`cargo metadata`), and the links and paths the documents name.
//!
//! Both read the checkout only; neither builds or runs fvd.

mod git;
mod layers;
mod links;
mod profiles;

use std::path::{Path, PathBuf};

/// The repository's root: this package's manifest folder.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Every `.rs` file of the repository (not below `target`, `.git` or
/// `node_modules`): its path relative to the root, and the path itself.
fn rust_files() -> Vec<(String, PathBuf)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if !matches!(name.as_str(), "target" | ".git" | "node_modules") {
                    walk(&p, out);
                }
            } else if name.ends_with(".rs") {
                out.push(p);
            }
        }
    }
    let root = root();
    let mut files = Vec::new();
    walk(&root, &mut files);
    files
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (rel, p)
        })
        .collect()
}

/// `file:line: text` of each line of `text` that `hit` holds for.
fn lines_where(file: &str, text: &str, hit: impl Fn(&str) -> bool) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| hit(l))
        .map(|(i, l)| format!("{file}:{}: {}", i + 1, l.trim()))
        .collect()
}
