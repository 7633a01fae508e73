//! Caps on what an agent attempt sends back (issue #38): the git pack of
//! its commit (an attempt on a worker, a `run_parity` snapshot) and what
//! that commit unpacks to. A pack of a few hundred KiB can hold hundreds of
//! MiB of repetitive text in thousands of files; checked out, it fills the
//! orchestrator's disk and its diff its memory.
//!
//! [`take_in`] indexes a pack into a quarantine object folder beside the
//! repository's own (which it reads as an alternate), measures the files
//! the commit adds or changes against its base from the objects alone
//! (`git ls-tree -r -l`, nothing checked out, no blob read into fvd's
//! memory), and moves the pack into the repository only when every
//! number is within [`AttemptLimits`]; a refused pack leaves nothing
//! behind. What is counted is what a checkout of the commit over its base
//! writes: each path whose content differs from the base's.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

const MIB: u64 = 1024 * 1024;

/// Limits on one attempt's commit as it comes back (`fvd orchestrator
/// serve --max-attempt-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptLimits {
    /// Bytes of the pack itself, checked while it is received.
    pub max_pack_bytes: u64,
    /// Bytes of all the files the commit adds or changes.
    pub max_unpacked_bytes: u64,
    /// How many files it adds or changes.
    pub max_files: u64,
    /// Bytes of its largest file.
    pub max_file_bytes: u64,
}

impl Default for AttemptLimits {
    fn default() -> Self {
        Self {
            max_pack_bytes: 64 * MIB,
            max_unpacked_bytes: 128 * MIB,
            max_files: 5000,
            max_file_bytes: 32 * MIB,
        }
    }
}

/// What a commit adds or changes over its base.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unpacked {
    pub bytes: u64,
    pub files: u64,
    pub largest: u64,
    pub largest_path: String,
}

impl AttemptLimits {
    /// Why a pack of `bytes` is refused, in one line; `None` within the cap.
    pub fn pack_refusal(&self, bytes: u64) -> Option<String> {
        (bytes > self.max_pack_bytes).then(|| {
            format!(
                "the attempt's pack is over {} (--max-attempt-pack-mib)",
                limit(self.max_pack_bytes)
            )
        })
    }

    /// Why a commit that unpacks to `u` is refused, in one line with its
    /// numbers and each limit it is over; `None` within them.
    pub fn refusal(&self, u: &Unpacked) -> Option<String> {
        let mut over: Vec<(String, &str)> = Vec::new();
        if u.bytes > self.max_unpacked_bytes {
            over.push((limit(self.max_unpacked_bytes), "--max-attempt-unpacked-mib"));
        }
        if u.files > self.max_files {
            over.push((format!("{} files", self.max_files), "--max-attempt-files"));
        }
        if u.largest > self.max_file_bytes {
            over.push((
                format!("{} a file", limit(self.max_file_bytes)),
                "--max-attempt-file-mib",
            ));
        }
        if over.is_empty() {
            return None;
        }
        let (limits, flags): (Vec<String>, Vec<&str>) = over.into_iter().unzip();
        Some(format!(
            "the attempt's commit unpacks to {} in {} new or changed files (largest {}: {}), over the limit of {} ({})",
            human(u.bytes),
            u.files,
            human(u.largest),
            u.largest_path,
            limits.join(" / "),
            flags.join(", ")
        ))
    }
}

/// `n` bytes for a person: B, KiB or MiB with one decimal.
pub fn human(n: u64) -> String {
    if n < 1024 {
        format!("{n} B")
    } else if n < MIB {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", n as f64 / MIB as f64)
    }
}

/// A limit as its flag gives it (whole MiB), else as [`human`].
fn limit(n: u64) -> String {
    if n.is_multiple_of(MIB) {
        format!("{} MiB", n / MIB)
    } else {
        human(n)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TakeInError {
    /// Over a limit: the agent's doing, in one line with the numbers.
    #[error("{0}")]
    OverLimit(String),
    /// The commit is not one of this attempt's (missing, or not descending
    /// from its base).
    #[error("{0}")]
    NotAnAttempt(String),
    #[error("taking in the attempt's pack in {dir}: {detail}")]
    Git { dir: PathBuf, detail: String },
    #[error("taking in the attempt's pack in {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl From<fvd_git::GitError> for TakeInError {
    fn from(e: fvd_git::GitError) -> Self {
        let fvd_git::GitError::Failed { args, dir, detail } = e;
        TakeInError::Git {
            dir,
            detail: format!("git {args}: {detail}"),
        }
    }
}

/// A quarantine object folder, removed when dropped (with whatever was
/// not moved out of it).
struct Quarantine {
    dir: PathBuf,
}

impl Drop for Quarantine {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Takes `pack` (thin against `base`) into the repository of `dir` only
/// if `sha` is a commit of it that descends from `base` and unpacks within
/// `limits`; its measure when it is taken in. With an empty pack the
/// commit must already be there (it is measured all the same).
pub async fn take_in(
    dir: &Path,
    base: &str,
    sha: &str,
    pack: &[u8],
    limits: &AttemptLimits,
) -> Result<Unpacked, TakeInError> {
    if let Some(why) = limits.pack_refusal(pack.len() as u64) {
        return Err(TakeInError::OverLimit(why));
    }
    let objects = PathBuf::from(
        fvd_git::run(
            dir,
            &[
                "rev-parse",
                "--path-format=absolute",
                "--git-path",
                "objects",
            ],
            &[],
        )
        .await?,
    );
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TakeInError::Io { path, source }
    };
    let quarantine = Quarantine {
        dir: objects.join(format!(
            "incoming-fvd-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        )),
    };
    let q_pack = quarantine.dir.join("pack");
    std::fs::create_dir_all(&q_pack).map_err(io(&q_pack))?;
    let envs: [(&str, &OsStr); 3] = [
        ("GIT_OBJECT_DIRECTORY", quarantine.dir.as_os_str()),
        ("GIT_ALTERNATE_OBJECT_DIRECTORIES", objects.as_os_str()),
        // Git refuses to update a ref while objects are quarantined.
        ("GIT_QUARANTINE_PATH", quarantine.dir.as_os_str()),
    ];
    if !pack.is_empty() {
        fvd_git::run_with_input(dir, &["index-pack", "--stdin", "--fix-thin"], &envs, pack).await?;
    }
    let commit = format!("{sha}^{{commit}}");
    fvd_git::run(dir, &["rev-parse", "--verify", "--quiet", &commit], &envs)
        .await
        .map_err(|_| TakeInError::NotAnAttempt(format!("the attempt's commit {sha} is missing")))?;
    fvd_git::run(dir, &["merge-base", "--is-ancestor", base, sha], &envs)
        .await
        .map_err(|_| {
            TakeInError::NotAnAttempt(format!(
                "the attempt's commit {sha} does not descend from its base {base}"
            ))
        })?;
    let unpacked = measure(dir, base, sha, &envs).await?;
    if let Some(why) = limits.refusal(&unpacked) {
        return Err(TakeInError::OverLimit(why));
    }
    migrate(&q_pack, &objects.join("pack"))?;
    Ok(unpacked)
}

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Moves the quarantine's pack files into the repository's pack folder:
/// each pack before its reverse index and its index, so git never sees an
/// index without its pack.
fn migrate(from: &Path, to: &Path) -> Result<(), TakeInError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TakeInError::Io { path, source }
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(from)
        .map_err(io(from))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    let rank = |p: &Path| match p.extension().and_then(OsStr::to_str) {
        Some("pack") => 0,
        Some("idx") => 2,
        _ => 1,
    };
    files.sort_by_key(|p| rank(p));
    std::fs::create_dir_all(to).map_err(io(to))?;
    for f in files {
        let Some(name) = f.file_name() else { continue };
        let dest = to.join(name);
        // The same pack taken in before (an attempt run again).
        if dest.exists() {
            continue;
        }
        std::fs::rename(&f, &dest).map_err(io(&dest))?;
    }
    Ok(())
}

/// The files `sha`'s tree adds or changes over `base`'s, read from the
/// objects (`ls-tree -r -l`), line by line: nothing of the listing is kept
/// but the base's paths.
async fn measure(
    dir: &Path,
    base: &str,
    sha: &str,
    envs: &[(&str, &OsStr)],
) -> Result<Unpacked, TakeInError> {
    let mut before: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    each_blob(dir, base, envs, |path, oid, _| {
        before.insert(path.to_vec(), oid.to_vec());
    })
    .await?;
    let mut u = Unpacked::default();
    each_blob(dir, sha, envs, |path, oid, size| {
        if before.get(path).is_some_and(|o| o == oid) {
            return;
        }
        u.files += 1;
        u.bytes = u.bytes.saturating_add(size);
        if size > u.largest || u.largest_path.is_empty() {
            u.largest = size;
            u.largest_path = String::from_utf8_lossy(path).into_owned();
        }
    })
    .await?;
    Ok(u)
}

/// Calls `each(path, oid, size)` for every blob of `commit`'s tree,
/// streaming git's listing.
async fn each_blob(
    dir: &Path,
    commit: &str,
    envs: &[(&str, &OsStr)],
    mut each: impl FnMut(&[u8], &[u8], u64),
) -> Result<(), TakeInError> {
    use tokio::io::AsyncBufReadExt;
    let failed = |detail: String| TakeInError::Git {
        dir: dir.to_path_buf(),
        detail: format!("git ls-tree -r -l {commit}: {detail}"),
    };
    let mut cmd = fvd_git::command(dir);
    cmd.args(["ls-tree", "-r", "-l", "-z", commit])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().map_err(|e| failed(e.to_string()))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = tokio::io::BufReader::new(stdout);
    let mut entry = Vec::new();
    loop {
        entry.clear();
        let n = lines
            .read_until(0, &mut entry)
            .await
            .map_err(|e| failed(e.to_string()))?;
        if n == 0 {
            break;
        }
        if entry.last() == Some(&0) {
            entry.pop();
        }
        // `<mode> SP <type> SP <object> SP+ <size> TAB <path>`
        let Some(tab) = entry.iter().position(|&b| b == b'\t') else {
            continue;
        };
        let (meta, path) = (&entry[..tab], &entry[tab + 1..]);
        let mut fields = meta.split(|&b| b == b' ').filter(|f| !f.is_empty());
        let (Some(_mode), Some(kind), Some(oid), Some(size)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if kind != b"blob" {
            continue;
        }
        let size = std::str::from_utf8(size)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0);
        each(path, oid, size);
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| failed(e.to_string()))?;
    if !out.status.success() {
        return Err(failed(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_its_numbers_and_only_the_limits_it_is_over() {
        let limits = AttemptLimits::default();
        let bomb = Unpacked {
            bytes: 200 * MIB,
            files: 20_000,
            largest: 10 * 1024,
            largest_path: "bomb/f00001.txt".into(),
        };
        assert_eq!(
            limits.refusal(&bomb).unwrap(),
            "the attempt's commit unpacks to 200.0 MiB in 20000 new or changed files (largest 10.0 KiB: bomb/f00001.txt), over the limit of 128 MiB / 5000 files (--max-attempt-unpacked-mib, --max-attempt-files)"
        );
        let one = Unpacked {
            bytes: 40 * MIB,
            files: 1,
            largest: 40 * MIB,
            largest_path: "w.bin".into(),
        };
        assert!(
            limits
                .refusal(&one)
                .unwrap()
                .ends_with("over the limit of 32 MiB a file (--max-attempt-file-mib)")
        );
        assert_eq!(limits.refusal(&Unpacked::default()), None);
        assert_eq!(limits.pack_refusal(64 * MIB), None);
        assert_eq!(
            limits.pack_refusal(64 * MIB + 1).unwrap(),
            "the attempt's pack is over 64 MiB (--max-attempt-pack-mib)"
        );
    }
}
