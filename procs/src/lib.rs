//! Finding live processes in `/proc`: those of a process group, and those
//! whose environment carries a marker variable (a cookie). Both the worker
//! (a job's processes, including ones that left its group with `setsid`)
//! and the orchestrator (what is left of an agent after a crash) need it;
//! signalling what is found stays with them.
//!
//! Linux only. Zombies are never listed (they are gone but for the reaping)
//! and neither is the calling process; a process that vanishes between the
//! listing and the reading is skipped.

use std::path::Path;

/// A process found in `/proc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    pub comm: String,
    /// Found by the marker, outside the process group asked for (or with
    /// no group asked for).
    pub left_group: bool,
}

/// Live processes in process group `pgid` (when given), plus those outside
/// it whose environment holds exactly the entry `NAME=VALUE` of `marker`.
pub fn find(pgid: Option<i32>, marker: Option<(&str, &str)>) -> Vec<ProcInfo> {
    let me = std::process::id() as i32;
    let needle = marker.map(|(name, value)| format!("{name}={value}").into_bytes());
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some(st) = parse_stat(&stat) else {
            continue;
        };
        if matches!(st.state, 'Z' | 'X') {
            continue;
        }
        let in_group = pgid == Some(st.pgid);
        let left_group = !in_group
            && needle
                .as_deref()
                .is_some_and(|n| environ_has(&entry.path(), n));
        if in_group || left_group {
            out.push(ProcInfo {
                pid: st.pid,
                ppid: st.ppid,
                pgid: st.pgid,
                comm: st.comm,
                left_group,
            });
        }
    }
    out
}

/// Live processes (not the caller, no zombie) whose environment holds the
/// variable `name`, with its value.
pub fn find_var(name: &str) -> Vec<(ProcInfo, String)> {
    let me = std::process::id() as i32;
    let prefix = format!("{name}=").into_bytes();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let Some(value) = env
            .split(|b| *b == 0)
            .find_map(|var| var.strip_prefix(prefix.as_slice()))
        else {
            continue;
        };
        let Some(st) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|s| parse_stat(&s))
        else {
            continue;
        };
        if matches!(st.state, 'Z' | 'X') {
            continue;
        }
        out.push((
            ProcInfo {
                pid: st.pid,
                ppid: st.ppid,
                pgid: st.pgid,
                comm: st.comm,
                left_group: true,
            },
            String::from_utf8_lossy(value).into_owned(),
        ));
    }
    out
}

/// When process `pid` started (clock ticks since boot, `/proc/PID/stat`'s
/// 22nd field): with the pid, it names one process for good, since pids
/// are reused. `None` when there is no such live process.
pub fn start_time(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let close = s.rfind(')')?;
    let mut rest = s.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    if matches!(state, 'Z' | 'X') {
        return None;
    }
    // Fields 4 to 21 (ppid … itrealvalue), then starttime.
    rest.nth(18)?.parse().ok()
}

/// Whether the environment of the process at `proc_dir` has the entry
/// `entry` (whole, not as the tail of another variable's name).
fn environ_has(proc_dir: &Path, entry: &[u8]) -> bool {
    std::fs::read(proc_dir.join("environ"))
        .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == entry))
}

/// The fields of `/proc/PID/stat` fvd reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub pid: i32,
    pub comm: String,
    pub state: char,
    pub ppid: i32,
    pub pgid: i32,
}

/// Parses `/proc/PID/stat`: `pid (comm) state ppid pgrp …`; comm may
/// contain spaces and parentheses, so it ends at the last `)`.
pub fn parse_stat(s: &str) -> Option<Stat> {
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let pid = s[..open].trim().parse().ok()?;
    let comm = s.get(open + 1..close)?.to_string();
    let mut rest = s.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgid = rest.next()?.parse().ok()?;
    Some(Stat {
        pid,
        comm,
        state,
        ppid,
        pgid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// `f`'s first `Some`, asked every 10 ms for at most 10 s: a child
    /// just spawned may not have exec'd yet (on a loaded machine, for a
    /// while), and until then `/proc/PID/environ` is its parent's.
    fn poll<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if let Some(v) = f() {
                return Some(v);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    #[test]
    fn stat_with_odd_comm() {
        let st = parse_stat("123 (a) b (c)) S 1 77 77 0 -1").unwrap();
        assert_eq!(
            (st.pid, st.comm.as_str(), st.state, st.ppid, st.pgid),
            (123, "a) b (c)", 'S', 1, 77)
        );
    }

    #[test]
    fn a_variable_is_found_with_its_value_and_a_start_time_names_a_live_process() {
        let mut marked = Command::new("sleep")
            .arg("30")
            .env("FVD_PROCS_VAR_TEST", "a:b=c")
            .spawn()
            .unwrap();
        // Just spawned, its environment may not read yet: a bounded wait.
        let found = poll(|| Some(find_var("FVD_PROCS_VAR_TEST")).filter(|f| !f.is_empty()))
            .unwrap_or_default();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0.pid, marked.id() as i32);
        assert_eq!(found[0].1, "a:b=c");
        let mine = start_time(std::process::id() as i32).expect("this process");
        assert!(mine > 0);
        assert_eq!(start_time(std::process::id() as i32), Some(mine), "stable");
        let child = start_time(marked.id() as i32).expect("the child");
        assert!(child >= mine);
        marked.kill().unwrap();
        marked.wait().unwrap();
        assert_eq!(start_time(marked.id() as i32), None, "gone");
        assert!(find_var("FVD_PROCS_VAR_TEST").is_empty());
    }

    #[test]
    fn a_marker_finds_its_process_and_only_a_whole_entry_matches() {
        let mut marked = Command::new("sleep")
            .arg("30")
            .env("FVD_PROCS_TEST", "cookie-1")
            .spawn()
            .unwrap();
        let mut lookalike = Command::new("sleep")
            .arg("30")
            .env("X_FVD_PROCS_TEST", "cookie-1")
            .spawn()
            .unwrap();
        // Until each child has exec'd, its environ is still the parent's
        // (neither entry is there yet): wait for both, with a deadline,
        // so the look-alike is checked with its own environment.
        let lookalike_ready = poll(|| {
            find_var("X_FVD_PROCS_TEST")
                .iter()
                .any(|(p, _)| p.pid == lookalike.id() as i32)
                .then_some(())
        });
        assert!(lookalike_ready.is_some(), "the look-alike never exec'd");
        let found = poll(|| {
            Some(find(None, Some(("FVD_PROCS_TEST", "cookie-1")))).filter(|f| !f.is_empty())
        })
        .unwrap_or_default();
        let pids: Vec<i32> = found.iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![marked.id() as i32], "{found:?}");
        assert!(found[0].left_group);
        assert!(find(None, Some(("FVD_PROCS_TEST", "cookie-2"))).is_empty());
        assert!(find(None, None).is_empty());
        for c in [&mut marked, &mut lookalike] {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        // Reaped: gone from the listing.
        assert!(find(None, Some(("FVD_PROCS_TEST", "cookie-1"))).is_empty());
    }
}
