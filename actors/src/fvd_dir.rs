//! The port's `REPO/.fvd` folder, watched for the whole run: it holds the
//! components' worktrees, the agents' packets, gathered trace files and,
//! in embedded mode, the state database itself (which SQLite keeps
//! writing, unlinked, without an error). A port whose folder was deleted
//! or replaced mid-run is stopped with that reason instead of recording
//! verdicts of code that is no longer there (issue #27: wrong verdicts
//! reached `PORT_STATUS.md`).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The folder, and the marker file the port plants in it once it exists:
/// a folder deleted and made again can come back with the same inode (and
/// birth time to the second), so its identity is this file's content.
#[derive(Debug)]
pub struct FvdDir {
    path: PathBuf,
    marker: PathBuf,
    nonce: String,
    planted: Mutex<bool>,
}

impl FvdDir {
    /// `REPO/.fvd` of port `family`, marked now if it exists (a fleet port
    /// may create it later, with its first worktree: then it is marked
    /// then).
    pub fn new(repo: &Path, family: &str) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let path = repo.join(".fvd");
        let nonce = format!(
            "{}.{}.{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let dir = Self {
            marker: path.join(format!(".port-{family}")),
            path,
            nonce,
            planted: Mutex::new(false),
        };
        let _ = dir.check();
        dir
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `Err` with the reason once the folder marked before is gone or is
    /// another folder now; `Ok` while it is the same (or never existed).
    pub fn check(&self) -> Result<(), String> {
        let mut planted = self.planted.lock().unwrap_or_else(|e| e.into_inner());
        if !*planted {
            if self.path.is_dir() && std::fs::write(&self.marker, &self.nonce).is_ok() {
                *planted = true;
            }
            return Ok(());
        }
        match std::fs::read_to_string(&self.marker) {
            Ok(n) if n == self.nonce => Ok(()),
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Ok(()),
            _ if self.path.is_dir() => Err(format!(
                "{} was replaced by another folder while the port ran",
                self.path.display()
            )),
            _ => Err(format!(
                "{} was deleted while the port ran",
                self.path.display()
            )),
        }
    }
}

/// The reason a port stops when its folder went away, for people.
pub fn stop_reason(why: &str) -> String {
    format!(
        "stopped: {why}; its worktrees, agent records and trace files (and an embedded port's state) went with it, so nothing more is recorded and PORT_STATUS.md is left as it was; submit the port again to start over"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_deleted_or_replaced_is_told_and_one_never_there_is_not() {
        let repo = tempfile::tempdir().unwrap();
        let dir = FvdDir::new(repo.path(), "p");
        assert_eq!(dir.check(), Ok(()), "never there");
        std::fs::create_dir(repo.path().join(".fvd")).unwrap();
        assert_eq!(dir.check(), Ok(()), "seen now");
        assert_eq!(dir.check(), Ok(()), "the same");
        std::fs::remove_dir_all(repo.path().join(".fvd")).unwrap();
        let e = dir.check().unwrap_err();
        assert!(e.ends_with(".fvd was deleted while the port ran"), "{e}");
        // Made again, even with the same inode: another folder.
        std::fs::create_dir(repo.path().join(".fvd")).unwrap();
        let e = dir.check().unwrap_err();
        assert!(e.contains("replaced"), "{e}");
        // Another port of the repository marks it for itself.
        let other = FvdDir::new(repo.path(), "q");
        assert_eq!(other.check(), Ok(()));
    }
}
