//! The files a job leaves in its collected folder (the activation traces of
//! a drill-down run), read back to travel in `JobFinished`: the
//! orchestrator may run on another machine and never sees this disk.
//!
//! The total is bounded so that a report always fits one gRPC message; over
//! the bound nothing is sent and the error says how much there was, rather
//! than a truncated set that would compare as a different trace. A traced
//! rerun is therefore compared here, where its files lie ([`compare`]): its
//! report comes back whatever the size of the trace, and its files too
//! when they fit.

use std::path::{Path, PathBuf};

use fvd_contracts::redactor::Redactor;

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
    #[error("collected file {path} changed between listing and reading ({why}); nothing was sent")]
    Changed { path: String, why: String },
}

/// Every regular file under `dir` (recursively; links are not followed),
/// in path order, redacted with `secrets`. A missing folder is no file.
pub fn collect(dir: &Path, limit: u64, secrets: &Redactor) -> Result<Vec<Collected>, CollectError> {
    let listed = list(dir)?;
    // Sizes first: an oversized folder is refused before anything is read.
    let bytes: u64 = listed.iter().map(|l| l.len).sum();
    if bytes > limit {
        return Err(CollectError::TooLarge {
            dir: dir.to_path_buf(),
            bytes,
            files: listed.len(),
            limit,
        });
    }
    listed
        .iter()
        .map(|l| Ok((l.rel.clone(), secrets.bytes(&read(dir, l)?))))
        .collect()
}

/// Most bytes of the comparison report a traced rerun sends back: past
/// this, only the rows around the first divergence (the report's own
/// `rows_trimmed` diagnostic says so). Leaves the files of a small trace
/// room under [`MAX_COLLECT_BYTES`].
pub const MAX_REPORT_BYTES: usize = 1024 * 1024;

/// What a collected folder holds: bytes and regular files (links not
/// followed). A missing folder holds nothing.
pub fn size(dir: &Path) -> Result<(u64, usize), CollectError> {
    let listed = list(dir)?;
    Ok((listed.iter().map(|l| l.len).sum(), listed.len()))
}

/// Compares the trace files of `dir` where they lie (the regular files its
/// listing finds, links not followed, picked by `spec`'s globs) and returns
/// the report as JSON of at most about [`MAX_REPORT_BYTES`], redacted with
/// `secrets` like every byte that leaves the worker. The error is redacted
/// too: it may quote a malformed line.
pub fn compare(
    dir: &Path,
    spec: &fvd_trace::FolderSpec,
    secrets: &Redactor,
) -> Result<String, String> {
    let redacted = |text: String| secrets.text(&text);
    let listed = list(dir).map_err(|e| redacted(e.to_string()))?;
    let written: Vec<String> = listed.into_iter().map(|l| l.rel).collect();
    let report = fvd_trace::compare_folder(dir, &written, spec).map_err(redacted)?;
    Ok(redacted(fvd_trace::trimmed_json(&report, MAX_REPORT_BYTES)))
}

/// A regular file as the walk saw it: what is read later must be the same
/// file (same device and inode) and no bigger.
#[derive(Debug, Clone)]
struct Listed {
    rel: String,
    full: PathBuf,
    len: u64,
    dev: u64,
    ino: u64,
}

/// The regular files under `dir`, in path order.
fn list(dir: &Path) -> Result<Vec<Listed>, CollectError> {
    let mut out = Vec::new();
    if dir.is_dir() {
        walk(dir, dir, &mut out).map_err(|source| CollectError::Read {
            dir: dir.to_path_buf(),
            source,
        })?;
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(out)
}

/// Reads one listed file. The test process (or one it left behind) owns
/// the folder and may swap an entry for a link, a FIFO or another file
/// between the listing and the reading: the open does not follow a link in
/// the last component nor block on a FIFO, and the opened file must be the
/// one listed (which also catches a folder on the way swapped for a link).
fn read(dir: &Path, l: &Listed) -> Result<Vec<u8>, CollectError> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let changed = |why: &str| CollectError::Changed {
        path: l.rel.clone(),
        why: why.to_string(),
    };
    let io = |source| CollectError::Read {
        dir: dir.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&l.full)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                changed("it is now a symbolic link")
            } else {
                io(e)
            }
        })?;
    let m = file.metadata().map_err(io)?;
    if !m.is_file() || (m.dev(), m.ino()) != (l.dev, l.ino) {
        return Err(changed("it is no longer the file that was listed"));
    }
    let mut data = Vec::with_capacity(l.len as usize);
    file.take(l.len + 1).read_to_end(&mut data).map_err(io)?;
    if data.len() as u64 > l.len {
        return Err(changed("it grew after it was listed"));
    }
    Ok(data)
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<Listed>) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        // The entry's own type: a link is neither a folder nor a file here.
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
            let m = entry.metadata()?;
            out.push(Listed {
                rel,
                full: path,
                len: m.len(),
                dev: m.dev(),
                ino: m.ino(),
            });
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
        let secrets = Redactor::new([("K", "s3cretvalue")]);
        let got = collect(dir.path(), 1024, &secrets).unwrap();
        let names: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["port/rank0.jsonl", "port/rank1.jsonl", "ref.jsonl"]);
        assert_eq!(got[2].1, b"key=[redacted:K]!");
    }

    #[test]
    fn links_are_not_followed_even_when_swapped_in_after_the_listing() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("id_rsa");
        std::fs::write(&secret, "PRIVATE KEY").unwrap();
        std::fs::create_dir_all(dir.path().join("port")).unwrap();
        std::fs::write(dir.path().join("port/rank0.jsonl"), "a").unwrap();
        std::fs::write(dir.path().join("rank1.jsonl"), "b").unwrap();
        // A link present at the listing is not listed.
        std::os::unix::fs::symlink(&secret, dir.path().join("key.jsonl")).unwrap();
        let got = collect(dir.path(), 1024, &Redactor::default()).unwrap();
        let names: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["port/rank0.jsonl", "rank1.jsonl"]);

        // A file swapped for a link after the listing is not read.
        let listed = list(dir.path()).unwrap();
        let at = dir.path().join("rank1.jsonl");
        std::fs::remove_file(&at).unwrap();
        std::os::unix::fs::symlink(&secret, &at).unwrap();
        let err = read(dir.path(), &listed[1]).unwrap_err().to_string();
        assert!(
            err.contains(
                "rank1.jsonl changed between listing and reading (it is now a symbolic link)"
            ),
            "{err}"
        );

        // A folder swapped for a link: the last component is a plain file,
        // but not the one listed.
        std::fs::write(outside.path().join("rank0.jsonl"), "PRIVATE").unwrap();
        std::fs::remove_dir_all(dir.path().join("port")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("port")).unwrap();
        let err = read(dir.path(), &listed[0]).unwrap_err().to_string();
        assert!(err.contains("no longer the file that was listed"), "{err}");
    }

    #[test]
    fn a_fifo_swapped_in_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("rank0.jsonl");
        std::fs::write(&at, "a").unwrap();
        let listed = list(dir.path()).unwrap();
        std::fs::remove_file(&at).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(&at)
            .status()
            .unwrap();
        assert!(made.success());
        let err = read(dir.path(), &listed[0]).unwrap_err().to_string();
        assert!(err.contains("no longer the file that was listed"), "{err}");
    }

    #[test]
    fn a_file_that_grew_after_the_listing_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("rank0.jsonl");
        std::fs::write(&at, "a").unwrap();
        let listed = list(dir.path()).unwrap();
        std::fs::write(&at, "abc").unwrap();
        let err = read(dir.path(), &listed[0]).unwrap_err().to_string();
        assert!(err.contains("it grew after it was listed"), "{err}");
    }

    #[test]
    fn a_folder_is_compared_where_it_lies_and_its_report_redacted() {
        let dir = tempfile::tempdir().unwrap();
        let rec = |m: &str, a: f64| {
            format!(
                "{{\"module\": \"{m}\", \"tensor\": \"out\", \"step\": 0, \"abs_mean\": {a}, \"shape\": [2], \"rank\": 0, \"world_size\": 1}}\n"
            )
        };
        std::fs::write(
            dir.path().join("reference_rank0.jsonl"),
            rec("s3cretvalue.0", 1.0) + &rec("s3cretvalue.1", 1.0),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("port_rank0.jsonl"),
            rec("s3cretvalue.0", 1.0) + &rec("s3cretvalue.1", 2.0),
        )
        .unwrap();
        // A link is not a trace file of the folder, whatever its name.
        std::os::unix::fs::symlink(
            dir.path().join("port_rank0.jsonl"),
            dir.path().join("port_rank1.jsonl"),
        )
        .unwrap();
        let secrets = Redactor::new([("K", "s3cretvalue")]);
        let spec = fvd_trace::FolderSpec {
            reference: "reference_rank*.jsonl".into(),
            port: "port_rank*.jsonl".into(),
            ..Default::default()
        };
        let json = compare(dir.path(), &spec, &secrets).unwrap();
        assert!(!json.contains("s3cretvalue"), "{json}");
        let rep: fvd_trace::Report = serde_json::from_str(&json).unwrap();
        assert_eq!(rep.first_divergence.unwrap().port_module, "[redacted:K].1");
        assert_eq!(size(dir.path()).unwrap(), (json_len(dir.path()), 2));

        std::fs::write(
            dir.path().join("port_rank0.jsonl"),
            "s3cretvalue is no json\n",
        )
        .unwrap();
        let err = compare(dir.path(), &spec, &secrets).unwrap_err();
        assert!(err.contains("malformed"), "{err}");
        assert!(!err.contains("s3cretvalue"), "{err}");
    }

    /// Bytes of the folder's two regular files.
    fn json_len(dir: &Path) -> u64 {
        ["reference_rank0.jsonl", "port_rank0.jsonl"]
            .iter()
            .map(|f| std::fs::metadata(dir.join(f)).unwrap().len())
            .sum()
    }

    #[test]
    fn an_oversized_folder_sends_nothing_and_says_how_much() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![b'x'; 600]).unwrap();
        std::fs::write(dir.path().join("b"), vec![b'x'; 600]).unwrap();
        let err = collect(dir.path(), 1000, &Redactor::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("holds 1200 bytes in 2 files, over the 1000 byte limit"),
            "{err}"
        );
        assert!(
            collect(&dir.path().join("missing"), 10, &Redactor::default())
                .unwrap()
                .is_empty()
        );
    }
}
