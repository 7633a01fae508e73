#!/usr/bin/env python3
"""Issue #32's load test: N agent components (scripted agents) on a fleet.

  python3 bench/agents_fleet.py --fvd FVD [--components 200] [--workers 4]
                                [--slots 4] [--out FILE]

Writes a throw-away port whose N components are each red until their agent
writes `fixes/NAME.txt` (a scripted agent, `tools/fix_agent.py`, which also
hands back a valid handoff), starts `fvd orchestrator serve` (agents on the
fleet, the default) and W workers with S CPU slots each (`--gpus none`),
submits the port and waits for it. Every agent attempt is a fleet job: the
worker checks out the attempt's base commit, runs the agent, and sends the
commit back as a thin pack; the orchestrator moves the component's branch
and queues the verdict run.

Prints (and writes as JSON to --out): the wall time, the attempts and
attempts per minute, how they spread over the workers, the orchestrator's
peak RSS (VmHWM) and CPU seconds (its own, and its children's: git), and
the bytes moved per attempt: the pack each attempt sent back, and the code
the workers fetched (the port's commit once per worker, then the attempts'
commits a worker had not made itself).
"""

import argparse
import json
import os
import re
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from port_overhead import PREP  # noqa: E402


AGENT = '''#!/usr/bin/env python3
"""A scripted agent: writes its component's fix and a valid handoff."""
import argparse, pathlib
ap = argparse.ArgumentParser()
ap.add_argument("--component"); ap.add_argument("--handoff"); ap.add_argument("--worktree")
a = ap.parse_args()
fix = pathlib.Path(a.worktree) / "fixes" / f"{a.component}.txt"
fix.parent.mkdir(parents=True, exist_ok=True)
fix.write_text("ok")
test = f"tests/local_tests/generic/test_bench_{a.component}_parity.py"
pathlib.Path(a.handoff).write_text(f"""component: {a.component}
mode: parity-debug
files_changed: fixes/{a.component}.txt
official_files_used: none
prototype_key_dumps: none
port_state_file: tests/local_tests/bench/PORT_STATUS.md
concerns_or_unknowns: none
parity_test: {test}
parity_status: non_skip_pass
production_loader_strictness: stateless
strict_load: not_run
pytest_output: 1 passed
blocker: none
conversion_retry_request: none
readme_updated: no
next_step: phase_6_continue
escape_hatch: none
""")
'''


def git(repo, *args):
    subprocess.run(
        ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", *args],
        cwd=repo, check=True, stdout=subprocess.DEVNULL,
    )


def write_port(repo, n):
    family = "bench"
    tests = os.path.join(repo, "tests", "local_tests", "generic")
    os.makedirs(tests, exist_ok=True)
    os.makedirs(os.path.join(repo, "tests", "local_tests", family), exist_ok=True)
    os.makedirs(os.path.join(repo, "tools"), exist_ok=True)
    with open(os.path.join(repo, "tools", "fix_agent.py"), "w") as f:
        f.write(AGENT)
    spec = PREP.format(family=family)
    spec += "\n[defaults]\ntimeout_s = 120\n"
    for i in range(n):
        name = f"c{i:03d}"
        rel = f"tests/local_tests/generic/test_bench_{name}_parity.py"
        with open(os.path.join(repo, rel), "w") as f:
            f.write(
                "import pathlib\n\n\ndef test_parity():\n"
                f"    p = pathlib.Path('fixes/{name}.txt')\n"
                "    assert p.is_file() and p.read_text() == 'ok'\n"
            )
        spec += (
            f'\n[[component]]\nname = "{name}"\ntype = "generic"\nparity_test = "{rel}"\n'
            'coverage_scope = "implementation_subcomponent"\nagent = true\n'
        )
    spec += (
        '\n[agent]\ncommand = ["python3", "-B", "tools/fix_agent.py", "--component", "{component}",'
        ' "--handoff", "{handoff_file}", "--worktree", "{worktree}"]\ntimeout_s = 120\nmax_attempts = 2\n'
    )
    with open(os.path.join(repo, "tests", "local_tests", family, "port.toml"), "w") as f:
        f.write(spec)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_stats(pid):
    """(VmHWM kB, own CPU s, children's CPU s) of a live process."""
    hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    own = (int(fields[11]) + int(fields[12])) / tick
    children = (int(fields[13]) + int(fields[14])) / tick
    return hwm, own, children


def plain(text):
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fvd", required=True)
    ap.add_argument("--components", type=int, default=200)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--out")
    a = ap.parse_args()
    fvd = os.path.abspath(a.fvd)
    work = tempfile.mkdtemp(prefix="fvd-agents-fleet-")
    repo = os.path.join(work, "repo")
    os.makedirs(repo)
    write_port(repo, a.components)
    env = dict(os.environ, FVD_LOG="info")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    db = os.path.join(work, "orchestrator.db")
    olog = open(os.path.join(work, "orchestrator.log"), "w")
    orch = subprocess.Popen(
        [fvd, "orchestrator", "serve", "--listen", f"127.0.0.1:{port}", "--db", f"sqlite://{db}",
         "--allow-agent-commands"],
        stdout=olog, stderr=subprocess.STDOUT, env=env,
    )
    workers = []
    try:
        time.sleep(0.5)
        for i in range(a.workers):
            wlog = open(os.path.join(work, f"worker-{i}.log"), "w")
            workers.append(subprocess.Popen(
                [fvd, "worker", "--orchestrator", url, "--workspace", os.path.join(work, f"ws-{i}"),
                 "--gpus", "none", "--cpu-slots", str(a.slots), "--worker-id", f"w{i}"],
                stdout=wlog, stderr=subprocess.STDOUT, env=env,
            ))
        t0 = time.monotonic()
        done = subprocess.run(
            [fvd, "submit", "--family", "bench", "--wait", "--orchestrator", url, "--repo", repo],
            capture_output=True, text=True, env=env,
        )
        wall = time.monotonic() - t0
        hwm, own, children = proc_stats(orch.pid)
    finally:
        for p in workers + [orch]:
            p.terminate()
        for p in workers + [orch]:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    con = sqlite3.connect(db)
    attempts = con.execute("SELECT COUNT(*) FROM agent_attempts WHERE state = 'recorded'").fetchone()[0]
    by_worker = dict(con.execute(
        "SELECT worker_id, COUNT(*) FROM agent_attempts GROUP BY worker_id").fetchall())
    statuses = dict(con.execute(
        "SELECT status, COUNT(*) FROM components WHERE family = 'bench' GROUP BY status").fetchall())
    runs = con.execute("SELECT COUNT(*) FROM jobs WHERE family = 'bench'").fetchone()[0]
    packs, fetched = [], []
    for i in range(a.workers):
        text = plain(open(os.path.join(work, f"worker-{i}.log")).read())
        packs += [int(m) for m in re.findall(r"agent attempt committed.*?pack_bytes=(\d+)", text)]
        fetched += [int(m) for m in re.findall(r"fetched the code of a commit.*?bytes=(\d+)", text)]
    result = {
        "components": a.components,
        "workers": a.workers,
        "slots_per_worker": a.slots,
        "submit_exit": done.returncode,
        "component_statuses": statuses,
        "wall_s": round(wall, 1),
        "attempts": attempts,
        "attempts_per_min": round(attempts / wall * 60, 1) if wall else 0,
        "attempts_by_worker": by_worker,
        "runs": runs,
        "orchestrator_peak_rss_mib": round(hwm / 1024, 1),
        "orchestrator_cpu_s": round(own, 1),
        "orchestrator_children_cpu_s": round(children, 1),
        "pack_bytes_per_attempt": {
            "n": len(packs),
            "median": statistics.median(packs) if packs else 0,
            "max": max(packs) if packs else 0,
        },
        "fetched": {
            "n": len(fetched),
            "total_bytes": sum(fetched),
            "first": fetched[0] if fetched else 0,
            "median": statistics.median(fetched) if fetched else 0,
        },
        "bytes_per_attempt": round((sum(packs) + sum(fetched)) / attempts) if attempts else 0,
        "work": work,
    }
    print(json.dumps(result, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
    return 0 if done.returncode == 0 and attempts == a.components else 1


if __name__ == "__main__":
    sys.exit(main())
