//! The port's `REPO/.fvd` folder, watched for the whole run: it holds the
//! components' worktrees, the agents' packets, gathered trace files and,
//! in embedded mode, the state database itself (which SQLite keeps
//! writing, unlinked, without an error). A port whose folder was deleted
//! or replaced mid-run is stopped with that reason instead of recording
//! verdicts of code that is no longer there (issue #27: wrong verdicts
//! reached `PORT_STATUS.md`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The folder and its identity (device, inode) when first seen.
#[derive(Debug)]
pub struct FvdDir {
    path: PathBuf,
    seen: Mutex<Option<(u64, u64)>>,
}

impl FvdDir {
    /// `REPO/.fvd`, seen now if it exists (a fleet port may create it
    /// later, with its first worktree: then it is seen then).
    pub fn new(repo: &Path) -> Self {
        let dir = Self {
            path: repo.join(".fvd"),
            seen: Mutex::new(None),
        };
        let _ = dir.check();
        dir
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `Err` with the reason once the folder seen before is gone or is
    /// another folder now; `Ok` while it is the same (or never existed).
    pub fn check(&self) -> Result<(), String> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) => {
                let id = (m.dev(), m.ino());
                match *seen {
                    None => {
                        *seen = Some(id);
                        Ok(())
                    }
                    Some(was) if was == id => Ok(()),
                    Some(_) => Err(format!(
                        "{} was replaced by another folder while the port ran",
                        self.path.display()
                    )),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && seen.is_some() => Err(format!(
                "{} was deleted while the port ran",
                self.path.display()
            )),
            // Never seen, or unreadable for now: nothing to compare.
            Err(_) => Ok(()),
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
        let dir = FvdDir::new(repo.path());
        assert_eq!(dir.check(), Ok(()), "never there");
        std::fs::create_dir(repo.path().join(".fvd")).unwrap();
        assert_eq!(dir.check(), Ok(()), "seen now");
        assert_eq!(dir.check(), Ok(()), "the same");
        std::fs::remove_dir(repo.path().join(".fvd")).unwrap();
        let e = dir.check().unwrap_err();
        assert!(e.ends_with(".fvd was deleted while the port ran"), "{e}");
        std::fs::create_dir(repo.path().join(".fvd")).unwrap();
        let e = dir.check().unwrap_err();
        assert!(e.contains("replaced"), "{e}");
    }
}
