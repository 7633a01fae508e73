//! The launcher's side of the jail: `LAUNCHER __jail run PLAN -- PROGRAM
//! ARGS…` sets the jail of `PLAN` up in its own, fresh, single-threaded
//! process (unsharing a user namespace needs one thread), then execs the
//! program, which keeps its pid, process group, pipes and environment.
//! `__jail probe PLAN` sets it up and exits 0, so a worker learns at start
//! whether this host allows it.
//!
//! A jail that cannot be set up never runs the program: the launcher says
//! why on stderr (`fvd: jail: …`) and exits [`SETUP_FAILED`].

use std::collections::HashSet;
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use caps::{CapSet, Capability};

use crate::jail::{JAIL_ARG, Mechanism, Plan};

/// Exit status of a launcher whose jail could not be set up.
pub const SETUP_FAILED: i32 = 125;
/// Exit status of a launcher that could not exec the program.
pub const EXEC_FAILED: i32 = 127;

/// The capabilities a job keeps (of those fvd's process has): what root
/// in a container gets by default, less `MKNOD` (a device node of the disk),
/// `SETFCAP` and `SETPCAP`, plus `IPC_LOCK` and `SYS_NICE` that GPU and
/// thread-pinning code uses. None of them reads another process's memory,
/// mounts, or bypasses Landlock.
pub const KEEP: &[Capability] = &[
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_FOWNER,
    Capability::CAP_FSETID,
    Capability::CAP_KILL,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
    Capability::CAP_NET_BIND_SERVICE,
    Capability::CAP_NET_RAW,
    Capability::CAP_SYS_CHROOT,
    Capability::CAP_AUDIT_WRITE,
    Capability::CAP_IPC_LOCK,
    Capability::CAP_SYS_NICE,
];

/// Acts as the launcher when this process was started as one
/// (`argv[1] == "__jail"`), and never returns then; returns at once
/// otherwise. Call it first in `main`, before any thread starts.
pub fn main_if_jail() {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(JAIL_ARG.as_ref()) {
        return;
    }
    let args: Vec<OsString> = args.collect();
    std::process::exit(launch(&args));
}

fn fail(why: impl std::fmt::Display) -> i32 {
    eprintln!("fvd: jail: {why}");
    SETUP_FAILED
}

/// `run PLAN -- PROGRAM ARGS…` or `probe PLAN`; returns the exit status
/// when it does not exec.
fn launch(args: &[OsString]) -> i32 {
    let (Some(verb), Some(plan)) = (args.first(), args.get(1)) else {
        return fail("usage: __jail run PLAN -- PROGRAM ARGS… | __jail probe PLAN");
    };
    let plan: Plan = match serde_json::from_slice(plan.as_bytes()) {
        Ok(p) => p,
        Err(e) => return fail(format!("unreadable plan: {e}")),
    };
    if let Err(e) = apply(&plan) {
        return fail(e);
    }
    match verb.to_str() {
        Some("probe") => 0,
        Some("run") => {
            let argv = match args.get(2).map(|a| a.as_bytes()) {
                Some(b"--") => &args[3..],
                _ => return fail("run: the program follows `--`"),
            };
            let Some(program) = argv.first() else {
                return fail("run: no program");
            };
            let cargs: Result<Vec<CString>, _> = argv
                .iter()
                .map(|a| CString::new(a.as_bytes().to_vec()))
                .collect();
            let Ok(cargs) = cargs else {
                return fail("run: an argument holds a NUL byte");
            };
            let e = nix::unistd::execvp(&cargs[0], &cargs).unwrap_err();
            eprintln!(
                "fvd: jail: cannot run {}: {}",
                program.to_string_lossy(),
                std::io::Error::from(e)
            );
            EXEC_FAILED
        }
        _ => fail("the verb is run or probe"),
    }
}

/// Sets the jail of `plan` up in this process.
pub fn apply(plan: &Plan) -> Result<(), String> {
    let mut hidden: Vec<PathBuf> = plan
        .hide
        .iter()
        .filter(|p| p.symlink_metadata().is_ok())
        .cloned()
        .collect();
    block_devices(Path::new("/dev"), &mut hidden);
    let read_only: Vec<PathBuf> = plan
        .read_only
        .iter()
        .filter(|p| p.symlink_metadata().is_ok())
        .cloned()
        .collect();
    let writable: Vec<PathBuf> = plan
        .writable
        .iter()
        .filter(|p| p.is_dir())
        .cloned()
        .collect();
    match plan.mechanism {
        Mechanism::Namespace => {
            namespace(&hidden, &read_only, &writable)?;
            drop_capabilities()?;
            nix::sys::prctl::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
            if plan.scoped {
                own_domain()?;
            }
        }
        Mechanism::Landlock => {
            drop_capabilities()?;
            landlock(&hidden, &read_only, &writable)?;
        }
    }
    Ok(())
}

/// Every block device below `dir` (symbolic links not followed; the
/// folders of shared memory and terminals skipped).
fn block_devices(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(t) = e.file_type() else { continue };
        let p = e.path();
        if t.is_block_device() {
            out.push(p);
        } else if t.is_dir()
            && !matches!(
                e.file_name().to_str(),
                Some("shm" | "pts" | "mqueue" | "hugepages")
            )
        {
            block_devices(&p, out);
        }
    }
}

/// A private mount namespace (inside a user namespace of one's own when
/// this process may not mount) where each read-only path is a read-only
/// bind mount of itself and each hidden path is covered.
fn namespace(
    hidden: &[PathBuf],
    read_only: &[PathBuf],
    writable: &[PathBuf],
) -> Result<(), String> {
    use nix::mount::{MsFlags, mount};
    use nix::sched::{CloneFlags, unshare};
    let may_mount = caps::has_cap(None, CapSet::Effective, Capability::CAP_SYS_ADMIN)
        .map_err(|e| format!("reading capabilities: {e}"))?;
    if may_mount {
        unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare(mount): {e}"))?;
    } else {
        let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
        unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)
            .map_err(|e| format!("unshare(user, mount): {e}"))?;
        let write = |file: &str, text: String| {
            std::fs::write(file, text).map_err(|e| format!("{file}: {e}"))
        };
        write("/proc/self/setgroups", "deny".into())?;
        write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
        write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    }
    // Nothing done here may reach the host's namespace.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("making / private: {e}"))?;
    // Outer paths first, so that a read-only path inside another stays
    // read-only (a later recursive bind of the outer one would carry it
    // anyway); then the writable folders inside them.
    let mut ordered: Vec<&PathBuf> = read_only.iter().collect();
    ordered.sort_by_key(|p| p.components().count());
    for r in ordered {
        read_only_bind(r)?;
    }
    for w in writable {
        writable_bind(w)?;
    }
    for h in hidden {
        let is_dir = h.symlink_metadata().is_ok_and(|m| m.is_dir());
        let done = if is_dir {
            mount(
                Some("tmpfs"),
                h,
                Some("tmpfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("size=4k,mode=000"),
            )
        } else {
            mount(
                Some("/dev/null"),
                h,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
        };
        done.map_err(|e| format!("covering {}: {e}", h.display()))?;
    }
    Ok(())
}

/// Makes `path` (a folder and everything mounted below it, or a file) a
/// read-only bind mount of itself. The flags a user namespace may not
/// clear (`nosuid`, `nodev`, `noexec`, the atime ones) are kept as the
/// mount below has them, or the remount would be refused.
fn read_only_bind(path: &Path) -> Result<(), String> {
    rebind(path, true)
}

/// [`read_only_bind`]'s twin: a writable bind mount of `path` over a
/// read-only one (a bind copies the read-only flag of the mount it comes
/// from, so it is remounted without it; what is mounted below `path` keeps
/// its own).
fn writable_bind(path: &Path) -> Result<(), String> {
    rebind(path, false)
}

fn rebind(path: &Path, read_only: bool) -> Result<(), String> {
    use nix::mount::{MsFlags, mount};
    use nix::sys::statvfs::{FsFlags, statvfs};
    let what = if read_only { "read-only" } else { "writable" };
    let e = |step: &str, x: nix::Error| format!("making {} {what} ({step}): {x}", path.display());
    let had = statvfs(path).map_err(|x| e("statvfs", x))?.flags();
    mount(
        Some(path),
        path,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|x| e("bind", x))?;
    let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT;
    if read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    for (st, ms) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if had.contains(st) {
            flags |= ms;
        }
    }
    mount(None::<&str>, path, None::<&str>, flags, None::<&str>).map_err(|x| e("remount", x))
}

/// Keeps only [`KEEP`] of this process's capabilities, for itself and what
/// it execs (bounding, inheritable and ambient sets emptied of the rest).
fn drop_capabilities() -> Result<(), String> {
    let err = |what: &str, e: caps::errors::CapsError| format!("{what}: {e}");
    let permitted = caps::read(None, CapSet::Permitted).map_err(|e| err("capabilities", e))?;
    // Ambient capabilities survive execve: none may.
    let _ = caps::clear(None, CapSet::Ambient);
    if permitted.is_empty() {
        return Ok(());
    }
    let keep: HashSet<Capability> = KEEP.iter().copied().collect();
    if permitted.contains(&Capability::CAP_SETPCAP) {
        for c in caps::runtime::thread_all_supported() {
            if !keep.contains(&c) {
                caps::drop(None, CapSet::Bounding, c).map_err(|e| err("bounding set", e))?;
            }
        }
    }
    caps::clear(None, CapSet::Inheritable).map_err(|e| err("inheritable set", e))?;
    let left: HashSet<Capability> = permitted.intersection(&keep).copied().collect();
    caps::set(None, CapSet::Effective, &left).map_err(|e| err("effective set", e))?;
    caps::set(None, CapSet::Permitted, &left).map_err(|e| err("permitted set", e))?;
    Ok(())
}

/// Puts this process in a Landlock domain of its own that restricts
/// nothing a job does (it handles only making block devices, which no job
/// may do anyway): what it brings is Landlock's scoping. A process in a
/// domain can read the `/proc/PID/environ`, `mem`, `fd`… of, trace, and
/// `pidfd_getfd` from only processes of its own domain or one nested in
/// it, whatever their uid, so a job cannot read an agent's or another
/// job's tokens (issue #38). A Landlock jail gets the same from its own
/// domain. Moving a file to another folder is the one right every rule set
/// refuses unless a rule allows it: the domain allows it everywhere, or a
/// job's `os.rename` between folders fails with EXDEV.
fn own_domain() -> Result<(), String> {
    use landlock::{
        AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    };
    let e = |what: &str, e: landlock::RulesetError| format!("landlock {what}: {e}");
    let root = PathFd::new("/").map_err(|x| format!("landlock: /: {x}"))?;
    let status = Ruleset::default()
        .handle_access(AccessFs::MakeBlock | AccessFs::Refer)
        .map_err(|x| e("ruleset", x))?
        .create()
        .map_err(|x| e("ruleset", x))?
        .add_rule(PathBeneath::new(root, AccessFs::Refer))
        .map_err(|x| e("rule", x))?
        .restrict_self()
        .map_err(|x| e("restrict", x))?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err("this kernel does not enforce Landlock".into());
    }
    Ok(())
}

/// A Landlock domain that may read every file except the hidden paths,
/// and (when some paths are read-only) write only below the paths that
/// contain no read-only one.
fn landlock(hidden: &[PathBuf], read_only: &[PathBuf], writable: &[PathBuf]) -> Result<(), String> {
    use landlock::{
        ABI, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    };
    let e = |what: &str, e: landlock::RulesetError| format!("landlock {what}: {e}");
    let mut readable = Vec::new();
    complement(Path::new("/"), hidden, &mut readable);
    // ABI 1's write rights: every way to change a file or a folder's
    // entries (truncate, ABI 3, is left to the kernels that have it: a
    // read-only path's files cannot be opened for writing anyway).
    let write = AccessFs::from_write(ABI::V1);
    let read_only = landlock_read_only(read_only, &busy_folders());
    let mut handled = AccessFs::ReadFile | AccessFs::Refer;
    if !read_only.is_empty() {
        handled |= write;
    }
    let mut rs = Ruleset::default()
        .handle_access(handled)
        .map_err(|x| e("ruleset", x))?
        .create()
        .map_err(|x| e("ruleset", x))?;
    // Moving files between folders stays allowed (Landlock refuses a move
    // that would make a file readable, so the hidden ones stay hidden).
    let root = PathFd::new("/").map_err(|x| format!("landlock: /: {x}"))?;
    rs = rs
        .add_rule(PathBeneath::new(root, AccessFs::Refer))
        .map_err(|x| e("rule", x))?;
    for p in readable {
        // Gone since the listing, or not openable even as a path: nothing
        // to allow.
        let Ok(fd) = PathFd::new(&p) else { continue };
        rs = rs
            .add_rule(PathBeneath::new(fd, AccessFs::ReadFile))
            .map_err(|x| e("rule", x))?;
    }
    if !read_only.is_empty() {
        let mut outside = Vec::new();
        complement(Path::new("/"), &read_only, &mut outside);
        for p in outside {
            // A file takes only the rights a file can have.
            let rights = if p.is_dir() {
                write
            } else {
                write & AccessFs::from_file(ABI::V1)
            };
            let Ok(fd) = PathFd::new(&p) else { continue };
            rs = rs
                .add_rule(PathBeneath::new(fd, rights))
                .map_err(|x| e("rule", x))?;
        }
        for w in writable {
            let Ok(fd) = PathFd::new(w) else { continue };
            rs = rs
                .add_rule(PathBeneath::new(fd, write))
                .map_err(|x| e("rule", x))?;
        }
    }
    let status = rs.restrict_self().map_err(|x| e("restrict", x))?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err("this kernel does not enforce Landlock".into());
    }
    Ok(())
}

/// Where jobs create files directly (`tempfile` in `/tmp`, say): a
/// Landlock rule set cannot leave a folder below one of these read-only
/// without refusing every new entry in it.
pub fn busy_folders() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = ["/tmp", "/var/tmp", "/dev/shm"]
        .iter()
        .map(PathBuf::from)
        .collect();
    if let Some(t) = std::env::var_os("TMPDIR") {
        v.push(PathBuf::from(t));
    }
    v.into_iter()
        .map(|p| p.canonicalize().unwrap_or(p))
        .collect()
}

/// The read-only paths Landlock can protect: folders (a read-only file
/// would leave its whole folder without a way to create an entry, and a
/// checkout's top folder must stay writable), and none below a busy
/// folder (a job could then create no file directly in `/tmp`). The others
/// stay writable under Landlock ([`crate::Jail::warnings`] says so).
pub fn landlock_read_only(read_only: &[PathBuf], busy: &[PathBuf]) -> Vec<PathBuf> {
    read_only
        .iter()
        .filter(|p| p.is_dir())
        .filter(|p| !busy.iter().any(|b| p.starts_with(b) && *p != b))
        .cloned()
        .collect()
}

/// The largest paths below `dir` that contain no hidden path: every entry
/// of `dir` but the hidden ones, descending into the folders on the way to
/// a hidden path. Symbolic links are left out (what they point to is
/// reached by its own path).
pub fn complement(dir: &Path, hidden: &[PathBuf], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if hidden.contains(&p) {
            continue;
        }
        let Ok(t) = e.file_type() else { continue };
        if t.is_symlink() {
            continue;
        }
        if t.is_dir() && hidden.iter().any(|h| h.starts_with(&p)) {
            complement(&p, hidden, out);
        } else {
            out.push(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn landlock_protects_folders_outside_the_busy_ones_only() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        for f in ["scratch/code/repo.git", "tmp/ws/code/repo.git"] {
            std::fs::create_dir_all(root.join(f)).unwrap();
        }
        std::fs::write(root.join("scratch/code/.git"), "gitdir: x\n").unwrap();
        let busy = vec![root.join("tmp")];
        let ro = vec![
            root.join("scratch/code/repo.git"),
            root.join("scratch/code/.git"),
            root.join("tmp/ws/code/repo.git"),
        ];
        assert_eq!(
            landlock_read_only(&ro, &busy),
            vec![root.join("scratch/code/repo.git")]
        );
    }

    #[test]
    fn the_complement_leaves_out_exactly_the_hidden_paths() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        for f in ["a/secret/token", "a/secret/other", "a/b/x", "c"] {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "x").unwrap();
        }
        std::os::unix::fs::symlink(root.join("a/secret/token"), root.join("link")).unwrap();
        let hidden = vec![root.join("a/secret/token")];
        let mut out = Vec::new();
        complement(root, &hidden, &mut out);
        out.sort();
        let rel: Vec<_> = out
            .iter()
            .map(|p| p.strip_prefix(root).unwrap().display().to_string())
            .collect();
        assert_eq!(rel, ["a/b", "a/secret/other", "c"]);
    }
}
