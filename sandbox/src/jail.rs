//! The jail a job or an agent starts in, seen from the process that starts
//! it (a worker, an orchestrator): which mechanism this host allows, decided
//! once at start-up by running the launcher ([`Jail::start`]), and the
//! command that runs a program inside it ([`Jail::command`]).
//!
//! Two mechanisms, the first this host allows (`Mode::Auto`):
//!
//! - [`Mechanism::Namespace`]: a private mount namespace (as root with
//!   `CAP_SYS_ADMIN`; otherwise inside a user namespace of one's own that
//!   maps only one's own uid) where every hidden file is covered by
//!   `/dev/null` and every hidden folder by an empty read-only tmpfs. A
//!   covered path reads as empty; nothing changes outside the jail.
//! - [`Mechanism::Landlock`]: a Landlock domain that may read every file
//!   but the hidden ones (and `REFER`, so files still move between
//!   folders). Landlock only allows, never denies, so the rules are the
//!   complement of the hidden paths taken when the job starts: a file
//!   created later *directly* in a folder on the way to a hidden path (the
//!   token's folder and those above it) cannot be read by that job. Keep
//!   token files in a folder of their own; [`Jail::warnings`] names
//!   folders where this would bite.
//!
//! Either way the launcher drops every capability but a short list of
//! harmless ones ([`crate::launch::KEEP`]: the file-ownership ones, `KILL`,
//! `SETUID`/`SETGID`, networking, `IPC_LOCK`, `SYS_NICE`) and sets
//! `no_new_privs`, so a job of a root worker cannot read the worker's
//! `/proc` (it is not dumpable, [`crate::harden`]), mount, load modules or
//! read raw memory; block devices are hidden too (root reads them by file
//! permissions alone).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// The argument that makes a launcher binary act as one
/// (`fvd __jail run PLAN -- PROGRAM ARGS…`).
pub const JAIL_ARG: &str = "__jail";

/// How the jail is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mechanism {
    Namespace,
    Landlock,
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mechanism::Namespace => "namespace",
            Mechanism::Landlock => "landlock",
        })
    }
}

/// What an operator asks for (`--job-sandbox`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// A namespace if this host allows one, else Landlock; neither is an
    /// error.
    #[default]
    Auto,
    Namespace,
    Landlock,
    /// No jail: jobs run as fvd's user with its file access. Only the
    /// environment allow-list applies.
    Off,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Mode::Auto),
            "namespace" => Ok(Mode::Namespace),
            "landlock" => Ok(Mode::Landlock),
            "off" => Ok(Mode::Off),
            _ => Err(format!(
                "{s:?} is not a sandbox mode: auto, namespace, landlock or off"
            )),
        }
    }
}

/// Why no jail could be made.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error("cannot hide {path}: {source}")]
    Hidden {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot run the jail's launcher {launcher}: {source}")]
    Launcher {
        launcher: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "this host allows no jail for jobs ({why}); fix that, or run them unjailed with --job-sandbox off (docs/fleet.md \"Containment\")"
    )]
    Unavailable { why: String },
}

/// The plan the launcher gets: how, which paths to hide, and which to
/// leave readable but not writable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub mechanism: Mechanism,
    pub hide: Vec<PathBuf>,
    /// Readable, never writable inside the jail (issue #38: the git
    /// directories a job runs in, so that nothing a job writes there can
    /// change what fvd's own git does outside the jail). With a namespace
    /// each is a read-only bind mount of itself; with Landlock (folders
    /// only, none below `/tmp` and the like: `launch::landlock_read_only`),
    /// writes are allowed only below the paths that contain none of them
    /// ([`Jail::warnings`] of a jail with such paths says what that costs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only: Vec<PathBuf>,
    /// Folders below a read-only path that stay writable (issue #39: an
    /// agent writes its own worktree and files, nothing else of the
    /// repository). With a namespace each is a writable bind mount of
    /// itself over the read-only one; with Landlock, a rule that allows
    /// writing below it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writable: Vec<PathBuf>,
    /// A namespace jail that also puts the job in a Landlock domain of its
    /// own (issue #38): no job can then read another job's or agent's
    /// `/proc/PID/environ`, `mem` or `fd`, or trace it, though they share a
    /// uid (Landlock lets a domain reach only its own and nested domains).
    /// A Landlock jail always is one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub scoped: bool,
}

impl Plan {
    /// Whether a job of this plan is kept from the other jobs' processes.
    pub fn isolates_processes(&self) -> bool {
        self.scoped || self.mechanism == Mechanism::Landlock
    }
}

/// A jail, or none (`Jail::default()`, [`Jail::off`]). Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Jail {
    armed: Option<Arc<Armed>>,
}

impl PartialEq for Jail {
    fn eq(&self, other: &Self) -> bool {
        match (&self.armed, &other.armed) {
            (None, None) => true,
            (Some(a), Some(b)) => a.launcher == b.launcher && a.plan == b.plan,
            _ => false,
        }
    }
}

impl Eq for Jail {}

#[derive(Debug)]
struct Armed {
    launcher: PathBuf,
    plan: Plan,
    plan_json: String,
}

impl Jail {
    /// No jail.
    pub fn off() -> Self {
        Self::default()
    }

    /// The jail `mode` asks for, with `hidden` covered: probed by running
    /// `launcher` once as a job would (so what is reported is what jobs
    /// get). Hidden paths must exist; they are resolved to their real
    /// location.
    pub fn start(mode: Mode, launcher: &Path, hidden: &[PathBuf]) -> Result<Self, JailError> {
        let mut hide = Vec::new();
        for h in hidden {
            let real = h.canonicalize().map_err(|source| JailError::Hidden {
                path: h.clone(),
                source,
            })?;
            if !hide.contains(&real) {
                hide.push(real);
            }
        }
        // A namespace with its own Landlock domain first; without one on a
        // kernel that has no Landlock (the jobs then share a trust domain,
        // and `describe` says so).
        let tries: &[(Mechanism, bool)] = match mode {
            Mode::Off => return Ok(Self::off()),
            Mode::Auto => &[
                (Mechanism::Namespace, true),
                (Mechanism::Namespace, false),
                (Mechanism::Landlock, false),
            ],
            Mode::Namespace => &[(Mechanism::Namespace, true), (Mechanism::Namespace, false)],
            Mode::Landlock => &[(Mechanism::Landlock, false)],
        };
        let mut why = Vec::new();
        for &(mechanism, scoped) in tries {
            let jail = Self::planned(
                launcher,
                Plan {
                    mechanism,
                    hide: hide.clone(),
                    read_only: Vec::new(),
                    writable: Vec::new(),
                    scoped,
                },
            );
            match jail.probe()? {
                Ok(()) => return Ok(jail),
                Err(e) if scoped => why.push(format!("{mechanism} with a Landlock domain: {e}")),
                Err(e) => why.push(format!("{mechanism}: {e}")),
            }
        }
        Err(JailError::Unavailable {
            why: why.join("; "),
        })
    }

    /// A jail of `mechanism` without asking whether this host allows it
    /// (tests; [`Jail::start`] probes); a namespace one has its Landlock
    /// domain.
    pub fn unprobed(launcher: &Path, mechanism: Mechanism, hide: Vec<PathBuf>) -> Self {
        Self::planned(
            launcher,
            Plan {
                mechanism,
                hide,
                read_only: Vec::new(),
                writable: Vec::new(),
                scoped: mechanism == Mechanism::Namespace,
            },
        )
    }

    /// Whether each job of this jail is kept from the others' processes
    /// (their environments, memory and open files): false when off, and
    /// for a namespace jail on a kernel without Landlock.
    pub fn isolates_processes(&self) -> bool {
        self.armed
            .as_ref()
            .is_some_and(|a| a.plan.isolates_processes())
    }

    fn planned(launcher: &Path, plan: Plan) -> Self {
        let plan_json = serde_json::to_string(&plan).expect("a plan serializes");
        Self {
            armed: Some(Arc::new(Armed {
                launcher: launcher.to_path_buf(),
                plan,
                plan_json,
            })),
        }
    }

    /// The same jail, hiding `more` as well (paths that do not exist are
    /// left out; each is resolved to its real location).
    pub fn hiding(&self, more: &[PathBuf]) -> Self {
        self.adding(more, |p| &mut p.hide)
    }

    /// The same jail with `more` added to the plan's list `list` picks
    /// (existing paths, at their real locations); off stays off.
    fn adding(&self, more: &[PathBuf], list: fn(&mut Plan) -> &mut Vec<PathBuf>) -> Self {
        let Some(a) = &self.armed else {
            return self.clone();
        };
        let mut plan = a.plan.clone();
        add_real(list(&mut plan), more);
        Self::planned(&a.launcher, plan)
    }

    /// The same jail, with `more` readable but not writable inside it
    /// (paths that do not exist are left out; each is resolved to its
    /// real location). Off stays off: nothing is protected then.
    pub fn read_only(&self, more: &[PathBuf]) -> Self {
        self.adding(more, |p| &mut p.read_only)
    }

    /// The same jail, with the folders `more` writable though a read-only
    /// path holds them (those that do not exist are left out; each is
    /// resolved to its real location). Off stays off.
    pub fn writable(&self, more: &[PathBuf]) -> Self {
        self.adding(more, |p| &mut p.writable)
    }

    /// The paths it leaves read-only (real locations).
    pub fn read_only_paths(&self) -> &[PathBuf] {
        self.armed.as_ref().map_or(&[], |a| &a.plan.read_only)
    }

    /// What tells this jail from another of the same launcher (a warm
    /// runner keys its zygotes by it): the plan as JSON, empty when off.
    pub fn plan_key(&self) -> &str {
        self.armed.as_ref().map_or("", |a| &a.plan_json)
    }

    /// The mechanism, or `None` when off.
    pub fn mechanism(&self) -> Option<Mechanism> {
        self.armed.as_ref().map(|a| a.plan.mechanism)
    }

    /// The paths it hides (real locations).
    pub fn hidden(&self) -> &[PathBuf] {
        self.armed.as_ref().map_or(&[], |a| &a.plan.hide)
    }

    /// One line for a log: the mechanism and what it hides.
    pub fn describe(&self) -> String {
        match &self.armed {
            None => "off: jobs run unjailed, with the allow-listed environment only".into(),
            Some(a) => {
                let list = |v: &[PathBuf]| {
                    v.iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let mut line = format!(
                    "{} (hides {}, and block devices",
                    a.plan.mechanism,
                    if a.plan.hide.is_empty() {
                        "no file of fvd's".to_string()
                    } else {
                        list(&a.plan.hide)
                    }
                );
                if !a.plan.read_only.is_empty() {
                    line.push_str(&format!("; read-only: {}", list(&a.plan.read_only)));
                }
                if !a.plan.writable.is_empty() {
                    line.push_str(&format!(
                        "; writable below them: {}",
                        list(&a.plan.writable)
                    ));
                }
                line.push_str(if a.plan.isolates_processes() {
                    "; each job in a Landlock domain of its own, kept from the others' /proc"
                } else {
                    "; no Landlock domain here (the kernel or its seccomp profile refuses one): jobs of one user can read each other's /proc/PID/environ"
                });
                line.push(')');
                line
            }
        }
    }

    /// Folders where Landlock's snapshot would bite (see the module doc):
    /// a hidden path lies below `$HOME`, `$TMPDIR`, `/tmp`, `/var/tmp` or
    /// `/dev/shm`, where jobs create files and read them back.
    pub fn warnings(&self) -> Vec<String> {
        let Some(a) = &self.armed else {
            return Vec::new();
        };
        if a.plan.mechanism != Mechanism::Landlock {
            return Vec::new();
        }
        let mut busy: Vec<PathBuf> = ["/tmp", "/var/tmp", "/dev/shm"]
            .iter()
            .map(PathBuf::from)
            .collect();
        for var in ["HOME", "TMPDIR"] {
            if let Some(v) = std::env::var_os(var) {
                busy.push(PathBuf::from(v));
            }
        }
        let mut out = Vec::new();
        let busy = crate::launch::busy_folders();
        for r in &a.plan.read_only {
            if !r.is_dir() {
                out.push(format!(
                    "{} stays writable to jobs: Landlock leaves only folders read-only",
                    r.display()
                ));
            } else if let Some(b) = busy.iter().find(|b| r.starts_with(b) && r != *b) {
                out.push(format!(
                    "{} stays writable to jobs: with Landlock a folder below {} cannot be read-only without refusing every new file there; give the workspace a folder of its own",
                    r.display(),
                    b.display()
                ));
            } else if let Some(parent) = r.parent() {
                out.push(format!(
                    "{} is read-only to jobs: with Landlock, a job cannot create a file or folder directly in {} or a folder above it (only below their other entries); give the workspace a folder of its own",
                    r.display(),
                    parent.display()
                ));
            }
        }
        for h in &a.plan.hide {
            for b in &busy {
                let b = b.canonicalize().unwrap_or_else(|_| b.clone());
                if h.starts_with(&b) && *h != b {
                    out.push(format!(
                        "{} lies below {}: with Landlock, a file a job creates directly in {} or a folder between it and {} cannot be read back by that job; move it to a folder of its own",
                        h.display(),
                        b.display(),
                        b.display(),
                        h.display()
                    ));
                }
            }
        }
        out
    }

    /// `argv` as a command inside the jail (through the launcher), or as
    /// itself when off. The caller sets its environment (start from
    /// `env_clear`), folder, group and pipes.
    pub fn command(&self, argv: &[String]) -> Command {
        match &self.armed {
            None => {
                let mut c = Command::new(&argv[0]);
                c.args(&argv[1..]);
                c
            }
            Some(a) => {
                let mut c = Command::new(&a.launcher);
                c.args([JAIL_ARG, "run", &a.plan_json, "--"]).args(argv);
                c
            }
        }
    }

    /// Runs the launcher as a job would, with `true` as the job: `Ok(Err)`
    /// says why this host does not allow the jail.
    fn probe(&self) -> Result<Result<(), String>, JailError> {
        let Some(a) = &self.armed else {
            return Ok(Ok(()));
        };
        let out = Command::new(&a.launcher)
            .args([JAIL_ARG, "probe", &a.plan_json])
            .env_clear()
            .stdin(Stdio::null())
            .output()
            .map_err(|source| JailError::Launcher {
                launcher: a.launcher.clone(),
                source,
            })?;
        if out.status.success() {
            return Ok(Ok(()));
        }
        let text = String::from_utf8_lossy(&out.stderr);
        let why = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.trim().trim_start_matches("fvd: jail: ").to_string())
            .unwrap_or_else(|| format!("the launcher exited with {}", out.status));
        Ok(Err(why))
    }
}

/// Adds each of `more` that exists, at its real location, once.
fn add_real(to: &mut Vec<PathBuf>, more: &[PathBuf]) {
    for m in more {
        if let Ok(real) = m.canonicalize()
            && !to.contains(&real)
        {
            to.push(real);
        }
    }
}

/// Resolves `program` as `execvp` would for a job started in `cwd` with
/// `PATH` = `path`: `None` when it cannot be found (so a missing command is
/// reported as one, before a launcher would start).
pub fn resolve(program: &str, path: Option<&str>, cwd: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = cwd.join(program);
        return runnable(&p).then_some(p);
    }
    path.unwrap_or("/usr/local/bin:/usr/bin:/bin")
        .split(':')
        .map(|d| {
            if d.is_empty() {
                cwd.to_path_buf()
            } else {
                cwd.join(d)
            }
        })
        .map(|d| d.join(program))
        .find(|p| runnable(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_off_needs_no_launcher() {
        assert_eq!("auto".parse::<Mode>(), Ok(Mode::Auto));
        assert_eq!("landlock".parse::<Mode>(), Ok(Mode::Landlock));
        assert!("chroot".parse::<Mode>().is_err());
        let j = Jail::start(Mode::Off, Path::new("/nonexistent"), &[]).unwrap();
        assert_eq!(j.mechanism(), None);
        let c = j.command(&["echo".into(), "x".into()]);
        assert_eq!(c.get_program(), "echo");
    }

    #[test]
    fn a_hidden_path_that_does_not_exist_is_an_error_naming_it() {
        let e = Jail::start(
            Mode::Landlock,
            Path::new("/nonexistent"),
            &[PathBuf::from("/nonexistent/token")],
        )
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/token"), "{e}");
    }

    #[test]
    fn landlock_warns_about_a_token_below_tmp() {
        let j = Jail::unprobed(
            Path::new("/x"),
            Mechanism::Landlock,
            vec![PathBuf::from("/tmp/fvd/token")],
        );
        let w = j.warnings();
        assert!(w.iter().any(|l| l.contains("below /tmp")), "{w:?}");
        let j = Jail::unprobed(
            Path::new("/x"),
            Mechanism::Namespace,
            vec![PathBuf::from("/tmp/fvd/token")],
        );
        assert!(j.warnings().is_empty());
    }

    #[test]
    fn programs_resolve_like_execvp() {
        let d = tempfile::tempdir().unwrap();
        assert!(resolve("sh", Some("/usr/bin:/bin"), d.path()).is_some());
        assert!(resolve("no-such-program-fvd", Some("/usr/bin:/bin"), d.path()).is_none());
        assert!(resolve("./missing.sh", None, d.path()).is_none());
    }
}
