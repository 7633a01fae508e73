//! A private one-node Slurm cluster on localhost: munged, slurmctld and
//! slurmd of Debian's `slurm-wlm` and `munge`, each with its key, sockets,
//! spool, pid and log files in one temporary folder and its own ports, so
//! nothing under /etc is touched and two runs on one machine do not meet.
//! Every Slurm command of the test reads this cluster's configuration
//! through `SLURM_CONF`; the jobs inherit it.
//!
//! The daemons run in the foreground as children of the test, and are
//! stopped by the PIDs in their pid files when the cluster is dropped,
//! after every job left the queue. Root is needed (SlurmUser=root), as CI
//! has it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The programs the cluster needs, from `slurm-wlm` and `munge`.
const PROGRAMS: &[&str] = &[
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "squeue",
    "scancel",
    "sinfo",
];

#[derive(Debug)]
struct Daemon {
    name: &'static str,
    child: Child,
    pid_file: PathBuf,
}

#[derive(Debug)]
pub struct Cluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
    daemons: Vec<Daemon>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| d.join(program).is_file())
            || ["/usr/sbin", "/sbin"]
                .iter()
                .any(|d| Path::new(d).join(program).is_file())
    })
}

fn short_host_name() -> String {
    let out = Command::new("hostname")
        .arg("-s")
        .output()
        .expect("run hostname -s");
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(!name.is_empty(), "hostname -s printed nothing");
    name
}

impl Cluster {
    /// Starts the cluster and waits until its node is idle; panics (with
    /// the daemons' logs) when Slurm cannot be started: this test fails,
    /// it never skips.
    pub fn start() -> Self {
        let missing: Vec<&str> = PROGRAMS.iter().copied().filter(|p| !on_path(p)).collect();
        assert!(
            missing.is_empty(),
            "Slurm cannot be started: {missing:?} not installed (scripts/test.sh runs \
             `apt-get install -y slurm-wlm munge` when they are missing)"
        );
        let dir = tempfile::Builder::new()
            .prefix("fvd-slurm-")
            .tempdir()
            .expect("tempdir");
        let root = dir.path().to_path_buf();
        // munged checks that no one else can write where its socket and
        // key live; slurmstepd, running jobs as root, must read the rest.
        set_mode(&root, 0o755);
        for sub in ["munge", "spool/ctld", "spool/d", "log"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        set_mode(&root.join("munge"), 0o700);
        let key = root.join("munge/munge.key");
        let mut bytes = vec![0u8; 1024];
        {
            use std::io::Read;
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut bytes))
                .expect("random munge key");
        }
        std::fs::write(&key, &bytes).unwrap();
        set_mode(&key, 0o400);

        let host = short_host_name();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let r = root.display();
        let conf = root.join("slurm.conf");
        std::fs::write(
            &conf,
            format!(
                "ClusterName=fvdtest\n\
                 SlurmctldHost={host}(127.0.0.1)\n\
                 SlurmctldPort={ctld}\n\
                 SlurmdPort={slurmd}\n\
                 AuthType=auth/munge\n\
                 AuthInfo=socket={r}/munge/munge.sock\n\
                 ProctrackType=proctrack/linuxproc\n\
                 TaskPlugin=task/none\n\
                 SelectType=select/cons_tres\n\
                 SelectTypeParameters=CR_CPU\n\
                 SlurmUser=root\n\
                 SlurmdUser=root\n\
                 StateSaveLocation={r}/spool/ctld\n\
                 SlurmdSpoolDir={r}/spool/d\n\
                 SlurmctldPidFile={r}/slurmctld.pid\n\
                 SlurmdPidFile={r}/slurmd.pid\n\
                 SlurmctldLogFile={r}/log/slurmctld.log\n\
                 SlurmdLogFile={r}/log/slurmd.log\n\
                 ReturnToService=2\n\
                 MpiDefault=none\n\
                 SwitchType=switch/none\n\
                 JobCompType=jobcomp/none\n\
                 AccountingStorageType=accounting_storage/none\n\
                 JobAcctGatherType=jobacct_gather/none\n\
                 KillWait=30\n\
                 NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN\n\
                 PartitionName=fvd Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
                ctld = free_port(),
                slurmd = free_port(),
            ),
        )
        .unwrap();

        let mut cluster = Cluster {
            dir,
            conf,
            daemons: Vec::new(),
        };
        let munge_pid = root.join("munge/munged.pid");
        cluster.spawn(
            "munged",
            Command::new("munged").args([
                "--foreground".to_string(),
                "--force".to_string(),
                format!("--socket={r}/munge/munge.sock"),
                format!("--key-file={}", key.display()),
                format!("--pid-file={}", munge_pid.display()),
                format!("--log-file={r}/log/munged.log"),
                format!("--seed-file={r}/munge/munged.seed"),
            ]),
            munge_pid,
        );
        cluster.wait_for("munged's socket", Duration::from_secs(20), |c| {
            c.dir.path().join("munge/munge.sock").exists()
        });
        let ctld_pid = root.join("slurmctld.pid");
        cluster.spawn("slurmctld", Command::new("slurmctld").arg("-D"), ctld_pid);
        let slurmd_pid = root.join("slurmd.pid");
        cluster.spawn("slurmd", Command::new("slurmd").arg("-D"), slurmd_pid);
        cluster.wait_for("the node to be idle", Duration::from_secs(60), |c| {
            let out = c.cmd("sinfo").args(["-h", "-o", "%t"]).output();
            out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle")
        });
        cluster
    }

    fn spawn(&mut self, name: &'static str, cmd: &mut Command, pid_file: PathBuf) {
        let log = std::fs::File::create(self.dir.path().join(format!("log/{name}.out")))
            .expect("daemon output file");
        let child = cmd
            .env("SLURM_CONF", &self.conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("Slurm cannot be started: cannot run {name}: {e}"));
        self.daemons.push(Daemon {
            name,
            child,
            pid_file,
        });
    }

    /// Polls `ready` until it holds; panics with the logs after `limit`,
    /// or at once when a daemon has exited.
    fn wait_for(&mut self, what: &str, limit: Duration, ready: impl Fn(&Self) -> bool) {
        let start = Instant::now();
        loop {
            if ready(self) {
                return;
            }
            let exited = self
                .daemons
                .iter_mut()
                .find_map(|d| match d.child.try_wait() {
                    Ok(Some(status)) => Some((d.name, status)),
                    _ => None,
                });
            if let Some((name, status)) = exited {
                panic!(
                    "Slurm cannot be started: {name} exited ({status}) before {what}\n{}",
                    self.logs()
                );
            }
            assert!(
                start.elapsed() < limit,
                "Slurm cannot be started: no {what} after {limit:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A Slurm command of this cluster.
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The job's state letter code (`R`, `CG`, …), `None` once it left the queue.
    pub fn job_state(&self, job: u32) -> Option<String> {
        let out = self
            .cmd("squeue")
            .args(["-h", "-o", "%t", "-j", &job.to_string()])
            .output()
            .ok()?;
        let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (!s.is_empty()).then_some(s)
    }

    /// `scancel ARGS JOB`.
    pub fn scancel(&self, args: &[&str], job: u32) {
        let out = self
            .cmd("scancel")
            .args(args)
            .arg(job.to_string())
            .output()
            .expect("run scancel");
        assert!(
            out.status.success(),
            "scancel {args:?} {job}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The daemons' logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        if let Ok(rd) = std::fs::read_dir(self.dir.path().join("log")) {
            for e in rd.flatten() {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                all.push_str(&format!("--- {}\n", e.path().display()));
                for l in tail.into_iter().rev() {
                    all.push_str(l);
                    all.push('\n');
                }
            }
        }
        all
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
}

fn pid_of(file: &Path) -> Option<i32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Jobs first (their processes belong to slurmstepd, not to us),
        // then the daemons, newest first, by their pid files.
        let _ = self.cmd("scancel").args(["--full", "--user=root"]).output();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let out = self.cmd("squeue").args(["-h", "-o", "%i"]).output();
            if out.map_or(true, |o| !o.status.success() || o.stdout.is_empty()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        for d in self.daemons.iter_mut().rev() {
            let pid = pid_of(&d.pid_file).unwrap_or(d.child.id() as i32);
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                match d.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        let _ = d.child.kill();
                        let _ = d.child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
    }
}
