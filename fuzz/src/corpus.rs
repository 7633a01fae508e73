//! Seeds: the project's own inputs. Each target's hand-written seeds live
//! in `fuzz/corpus/<target>/`, inputs that once failed in
//! `fuzz/regressions/<target>/` (replayed first on every run, so a fixed
//! crash stays fixed), and real files of the repository (the example port,
//! test fixtures) are picked up by suffix so the seeds follow them.

use std::path::{Path, PathBuf};

/// Where a target's seeds come from, relative to the workspace root.
#[derive(Debug, Clone, Copy)]
pub enum Source {
    /// Every file of a folder (not recursive).
    Dir(&'static str),
    /// Every file below a folder whose name ends with one of the suffixes.
    Tree(&'static str, &'static [&'static str]),
}

/// The workspace root (seeds are found from it).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("fuzz/ is a folder of the workspace")
        .to_path_buf()
}

/// Where failing inputs of `target` are kept once fixed.
pub fn regressions(target: &str) -> PathBuf {
    root().join("fuzz/regressions").join(target)
}

/// The seeds of a target: its corpus folder, its regressions, and its
/// sources, each file once, in a stable order. Missing folders are no seed.
pub fn seeds(target: &crate::engine::Target) -> Vec<(PathBuf, Vec<u8>)> {
    let root = root();
    let mut paths = Vec::new();
    files(
        &root.join("fuzz/corpus").join(target.name),
        false,
        &[],
        &mut paths,
    );
    files(&regressions(target.name), false, &[], &mut paths);
    for s in target.seeds {
        match s {
            Source::Dir(d) => files(&root.join(d), false, &[], &mut paths),
            Source::Tree(d, suffixes) => files(&root.join(d), true, suffixes, &mut paths),
        }
    }
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .filter_map(|p| {
            let data = std::fs::read(&p).ok()?;
            Some((p, data))
        })
        .collect()
}

fn files(dir: &Path, deep: bool, suffixes: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(ty) = e.file_type() else { continue };
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if ty.is_dir() && deep && !name.starts_with('.') && name != "__pycache__" {
            files(&path, deep, suffixes, out);
        } else if ty.is_file()
            && !name.starts_with('.')
            && (suffixes.is_empty() || suffixes.iter().any(|s| name.ends_with(s)))
        {
            out.push(path);
        }
    }
}
