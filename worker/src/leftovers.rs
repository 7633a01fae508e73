//! No test outlives its worker: every job process carries `FVD_WORKER`
//! (this worker's incarnation and workspace) in its environment, and
//!
//! - a reaper, a small shell process started with the worker in a process
//!   group of its own, waits on a pipe only the worker holds; when the
//!   worker is gone (its `kill -9` included) the pipe closes and the reaper
//!   kills every process marked with that incarnation, so no orphan keeps
//!   a GPU;
//! - a worker starting on a workspace first ends the processes left there
//!   by incarnations that are no longer alive (the reaper killed too, or a
//!   host reboot aside), before it takes a job.
//!
//! Why not `PR_SET_PDEATHSIG`: it reaches only the direct child (pytest's
//! own children and `setsid` escapees survive), it fires when the spawning
//! *thread* ends (tokio's blocking threads come and go), and setting it
//! needs `unsafe` in `pre_exec`, which the workspace denies. Why not a
//! cgroup: creating one needs root or a systemd delegation that a Slurm job
//! or a pod does not have. The reaper uses the same environment marker that
//! already finds a job's escapees ([`crate::exec::job_processes`]).

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

pub use fvd_procs::ProcInfo;

/// The variable that marks a job's processes with their worker:
/// `PID.STARTTIME:WORKSPACE`.
pub const WORKER_ENV: &str = "FVD_WORKER";

/// This worker process, for good: its pid and start time (pids are
/// reused, the pair is not).
pub fn incarnation() -> String {
    let pid = std::process::id() as i32;
    format!("{pid}.{}", fvd_procs::start_time(pid).unwrap_or(0))
}

/// The value of [`WORKER_ENV`] for jobs of this process on `workspace`.
pub fn marker(workspace: &Path) -> String {
    format!("{}:{}", incarnation(), canonical(workspace).display())
}

fn canonical(workspace: &Path) -> PathBuf {
    std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.to_path_buf())
}

/// Whether the incarnation `PID.STARTTIME` is a live process.
fn alive(incarnation: &str) -> bool {
    let Some((pid, start)) = incarnation.split_once('.') else {
        return false;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<i32>(), start.parse::<u64>()) else {
        return false;
    };
    fvd_procs::start_time(pid) == Some(start)
}

/// Ends the processes left on `workspace` by workers that are gone (their
/// process groups, then each of them), waits (bounded) until they are,
/// and returns them. A live worker's jobs on the same workspace (another
/// embedded `fvd submit` of the repository) are left alone.
pub fn sweep(workspace: &Path) -> Vec<ProcInfo> {
    let ws = canonical(workspace).display().to_string();
    let left: Vec<ProcInfo> = fvd_procs::find_var(WORKER_ENV)
        .into_iter()
        .filter(|(_, v)| {
            v.split_once(':')
                .is_some_and(|(inc, w)| w == ws && !alive(inc))
        })
        .map(|(p, _)| p)
        .collect();
    if left.is_empty() {
        return left;
    }
    for p in &left {
        let _ = killpg(Pid::from_raw(p.pgid), Signal::SIGKILL);
        let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while left.iter().any(|p| fvd_procs::start_time(p.pid).is_some()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    left
}

/// The reaper of this worker's jobs: alive as long as this handle (its
/// stdin) is; dropping it, or the worker's death, makes it kill every
/// process marked `marker` and exit.
#[derive(Debug)]
pub struct Reaper {
    child: Child,
}

/// The reaper's program: wait for the end of stdin, then kill each process
/// whose environment holds `FVD_WORKER=$1` (its group too, when it leads
/// one). Plain POSIX sh, tr and grep, found on every worker host.
const REAPER_SH: &str = r#"cat >/dev/null
for e in /proc/[0-9]*/environ; do
  if tr '\0' '\n' <"$e" 2>/dev/null | grep -qxF "FVD_WORKER=$1"; then
    p=${e#/proc/}; p=${p%/environ}
    kill -KILL -- "-$p" 2>/dev/null
    kill -KILL "$p" 2>/dev/null
  fi
done
"#;

impl Reaper {
    /// Starts the reaper of the jobs marked `marker`, in a process group
    /// of its own (a signal to the worker's group does not reach it).
    pub fn start(marker: &str) -> std::io::Result<Self> {
        let child = Command::new("sh")
            .args(["-c", REAPER_SH, "fvd-reaper", marker])
            .env_remove(WORKER_ENV)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        Ok(Self { child })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        // Closing its stdin sets it off; it exits once done.
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.flush();
        }
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GONE: &str = "4194305.1";

    fn marked_sleep(value: &str) -> Child {
        Command::new("sleep")
            .arg("60")
            .env(WORKER_ENV, value)
            .process_group(0)
            .spawn()
            .unwrap()
    }

    fn wait_gone(c: &mut Child) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if c.try_wait().unwrap().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    fn wait_marked(n: usize, var_value: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while fvd_procs::find_var(WORKER_ENV)
            .iter()
            .filter(|(_, v)| v.ends_with(var_value))
            .count()
            < n
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_start_sweeps_what_dead_workers_left_and_spares_a_live_one_s_jobs() {
        let ws = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let wsd = canonical(ws.path()).display().to_string();
        // A worker that is gone (a pid above Linux's highest), one alive
        // (this test), and a gone worker of another workspace.
        let mut orphan = marked_sleep(&format!("{GONE}:{wsd}"));
        let mut live = marked_sleep(&marker(ws.path()));
        let mut elsewhere = marked_sleep(&format!("{GONE}:{}", canonical(other.path()).display()));
        wait_marked(2, &wsd);
        let swept = sweep(ws.path());
        assert_eq!(
            swept.iter().map(|p| p.pid).collect::<Vec<_>>(),
            [orphan.id() as i32],
            "{swept:?}"
        );
        assert!(wait_gone(&mut orphan));
        assert!(
            live.try_wait().unwrap().is_none(),
            "a live worker's job stays"
        );
        assert!(
            elsewhere.try_wait().unwrap().is_none(),
            "another workspace's"
        );
        live.kill().unwrap();
        elsewhere.kill().unwrap();
        live.wait().unwrap();
        elsewhere.wait().unwrap();
    }

    #[test]
    fn the_reaper_kills_its_worker_s_jobs_when_the_worker_goes() {
        let ws = tempfile::tempdir().unwrap();
        let mark = format!("{}-reaper-test", marker(ws.path()));
        let mut job = marked_sleep(&mark);
        let mut stranger = marked_sleep("someone-else");
        wait_marked(1, "-reaper-test");
        let reaper = Reaper::start(&mark).unwrap();
        drop(reaper);
        assert!(wait_gone(&mut job), "the job died with its worker");
        assert!(stranger.try_wait().unwrap().is_none());
        stranger.kill().unwrap();
        stranger.wait().unwrap();
    }
}
