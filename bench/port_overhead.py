#!/usr/bin/env python3
"""fvd's overhead per parity run, side by side with plain pytest.

Builds (or takes) the release `fvd` binary, writes a throw-away port whose N
components each run a pytest test of about SECONDS seconds, then in one run:

  * baseline: the same N pytest commands, one after another, run directly
    (same argv fvd uses, JUnit report included);
  * fvd: `fvd submit --wait` embedded, with one CPU slot so the runs are
    sequential too, so wall times compare one to one.

Prints both wall times, the ratio (target <= 1.05 for 1 s tests), and the
dispatch latency, read from fvd's own state: from queue to process start
(jobs.queued_ms -> jobs.spawned_ms) in a port whose 8 jobs are queued at once
on 8 free slots, and from the end of one process to the start of the next on
a single slot (target < 20 ms).

Usage: python3 bench/port_overhead.py [--fvd PATH] [--n 10] [--seconds 1.0]
"""

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PREP = """[prep]
model_family = "{family}"
workload_types = "T2V"
official_ref = "bench"
official_ref_dir = "official"
official_ref_commit = "unknown"
hf_weights_path = "none"
hf_revision = "default"
local_weights_dir = "official_weights/{family}"
source_layout = "custom"
model_index_class = "none"
components_seen = "bench"
needs_conversion = "no"
hf_token_env = "HF_TOKEN"
dependency_changes = "none"
official_env_status = "imports_ok"
local_tests_readme = "tests/local_tests/{family}/README.md"
port_state_file = "tests/local_tests/{family}/PORT_STATUS.md"
gitignore_entries_added = "none"
next_step = "add-model"
open_questions = "none"
escape_hatch = "none"
"""


def write_port(repo, family, n, seconds):
    tests = os.path.join(repo, "tests", "local_tests", "generic")
    os.makedirs(tests, exist_ok=True)
    os.makedirs(os.path.join(repo, "tests", "local_tests", family), exist_ok=True)
    spec = PREP.format(family=family)
    rels = []
    for i in range(n):
        rel = f"tests/local_tests/generic/test_{family}_c{i}_parity.py"
        with open(os.path.join(repo, rel), "w") as f:
            f.write(f"import time\n\n\ndef test_parity():\n    time.sleep({seconds})\n    assert True\n")
        spec += (
            f'\n[[component]]\nname = "c{i}"\ntype = "generic"\n'
            f'parity_test = "{rel}"\ncoverage_scope = "both"\n'
        )
        rels.append(rel)
    with open(os.path.join(repo, "tests", "local_tests", family, "port.toml"), "w") as f:
        f.write(spec)
    return rels


def baseline(repo, rels):
    start = time.perf_counter()
    for i, rel in enumerate(rels):
        junit = os.path.join(repo, f"junit-{i}.xml")
        subprocess.run(
            [sys.executable, "-m", "pytest", rel, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
            cwd=repo,
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return time.perf_counter() - start


def run_fvd(fvd, repo, family, slots):
    start = time.perf_counter()
    r = subprocess.run(
        [fvd, "submit", "--family", family, "--repo", repo, "--wait", "--gpus", "none", "--cpu-slots", str(slots)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit(f"fvd submit exited {r.returncode}")
    return wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fvd", default=None)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    fvd = args.fvd
    if fvd is None:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "fvd"], cwd=ROOT, check=True)
        fvd = os.path.join(ROOT, "target", "release", "fvd")
    # fvd runs `python3`: make sure it is the interpreter running this script.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]

    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "overhead")
        rels = write_port(repo, "overhead", args.n, args.seconds)
        base = baseline(repo, rels)
        wall = run_fvd(fvd, repo, "overhead", 1)

        # Burst: 8 jobs queued at once, 8 free slots.
        lat_repo = os.path.join(tmp, "latency")
        write_port(lat_repo, "latency", 8, 0)
        run_fvd(fvd, lat_repo, "latency", 8)
        db = sqlite3.connect(os.path.join(lat_repo, ".fvd", "state.db"))
        lat = sorted(r[0] for r in db.execute("SELECT spawned_ms - queued_ms FROM jobs WHERE spawned_ms IS NOT NULL"))
        db.close()
        # Sequential: one slot; the next job can start once the previous
        # process ended, so measure from that end (spawn + duration, both
        # on the worker's clock) to the next spawn.
        seq_repo = os.path.join(tmp, "sequential")
        write_port(seq_repo, "sequential", 8, 0)
        run_fvd(fvd, seq_repo, "sequential", 1)
        db = sqlite3.connect(os.path.join(seq_repo, ".fvd", "state.db"))
        rows = list(db.execute("SELECT spawned_ms, duration_ms FROM jobs ORDER BY spawned_ms"))
        db.close()
        seq = sorted(rows[i][0] - (rows[i - 1][0] + rows[i - 1][1]) for i in range(1, len(rows)))

    print(f"parity runs: {args.n} x pytest test of {args.seconds:.2f} s, sequential")
    print(f"  plain pytest, one after another : {base:8.3f} s  ({base / args.n:.3f} s/run)")
    print(f"  fvd submit --wait (embedded)    : {wall:8.3f} s  ({wall / args.n:.3f} s/run)")
    print(f"  ratio fvd / plain pytest        : {wall / base:8.3f}  (target <= 1.05)")
    print(f"dispatch latency queue -> process start, 8 jobs queued at once on 8 free slots (ms):")
    print(f"  first {lat[0]:.1f}  median {statistics.median(lat):.1f}  max {lat[-1]:.1f}  (target < 20)")
    print(f"dispatch latency previous process end -> next process start, 1 slot (ms):")
    print(f"  min {seq[0]:.1f}  median {statistics.median(seq):.1f}  max {seq[-1]:.1f}")


if __name__ == "__main__":
    main()
