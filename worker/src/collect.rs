//! The files a job leaves in its collected folder (the activation traces of
//! a drill-down run), read back to travel in `JobFinished`: the
//! orchestrator may run on another machine and never sees this disk.
//!
//! The total is bounded so that a report always fits one gRPC message; over
//! the bound nothing is sent and the error says how much there was, rather
//! than a truncated set that would compare as a different trace.

use std::path::{Path, PathBuf};

/// Most bytes of collected files one report carries: under the 4 MiB that
/// tonic decodes by default, with room for the output tail and JUnit text.
pub const MAX_COLLECT_BYTES: u64 = 3 * 1024 * 1024;

/// One collected file: path relative to the folder (`/`-separated) and its
/// bytes, already redacted of secret values.
pub type Collected = (String, Vec<u8>);

/// Why a folder's files could not be collected.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error(
        "collected folder {dir} holds {bytes} bytes in {files} files, over the {limit} byte limit of what a job may send back; nothing was sent (narrow the trace: fewer layers, stats or steps)"
    )]
    TooLarge {
        dir: PathBuf,
        bytes: u64,
        files: usize,
        limit: u64,
    },
    #[error("cannot read collected folder {dir}: {source}")]
    Read {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// Every regular file under `dir` (recursively; links are not followed),
/// in path order, redacted with `secrets`. A missing folder is no file.
pub fn collect(
    dir: &Path,
    limit: u64,
    secrets: &[(Vec<u8>, Vec<u8>)],
) -> Result<Vec<Collected>, CollectError> {
    let mut paths = Vec::new();
    if dir.is_dir() {
        walk(dir, dir, &mut paths).map_err(|source| CollectError::Read {
            dir: dir.to_path_buf(),
            source,
        })?;
    }
    paths.sort();
    // Sizes first: an oversized folder is refused before anything is read.
    let bytes: u64 = paths.iter().map(|(_, _, len)| len).sum();
    if bytes > limit {
        return Err(CollectError::TooLarge {
            dir: dir.to_path_buf(),
            bytes,
            files: paths.len(),
            limit,
        });
    }
    paths
        .into_iter()
        .map(|(rel, full, _)| {
            let data = std::fs::read(&full).map_err(|source| CollectError::Read {
                dir: dir.to_path_buf(),
                source,
            })?;
            Ok((rel, crate::exec::redact_bytes(&data, secrets)))
        })
        .collect()
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf, u64)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let ty = entry.file_type()?;
        let path = entry.path();
        if ty.is_dir() {
            walk(root, &path, out)?;
        } else if ty.is_file() {
            let rel = path
                .strip_prefix(root)
                .expect("walked below the root")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.push((rel, path, entry.metadata()?.len()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_nested_files_in_order_and_redacts_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("port")).unwrap();
        std::fs::write(dir.path().join("port/rank1.jsonl"), "b").unwrap();
        std::fs::write(dir.path().join("port/rank0.jsonl"), "a").unwrap();
        std::fs::write(dir.path().join("ref.jsonl"), "key=s3cretvalue!").unwrap();
        let secrets = vec![(b"s3cretvalue".to_vec(), b"[redacted:K]".to_vec())];
        let got = collect(dir.path(), 1024, &secrets).unwrap();
        let names: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["port/rank0.jsonl", "port/rank1.jsonl", "ref.jsonl"]);
        assert_eq!(got[2].1, b"key=[redacted:K]!");
    }

    #[test]
    fn an_oversized_folder_sends_nothing_and_says_how_much() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![b'x'; 600]).unwrap();
        std::fs::write(dir.path().join("b"), vec![b'x'; 600]).unwrap();
        let err = collect(dir.path(), 1000, &[]).unwrap_err().to_string();
        assert!(
            err.contains("holds 1200 bytes in 2 files, over the 1000 byte limit"),
            "{err}"
        );
        assert!(
            collect(&dir.path().join("missing"), 10, &[])
                .unwrap()
                .is_empty()
        );
    }
}
