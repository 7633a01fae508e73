#!/usr/bin/env python3
"""The warm runner against cold runs, on the CPU, in seconds (issue #13).

Writes two identical throw-away ports of N components whose tests import a
stand-in heavy library (`heavy_stand_in`, outside the repository: it sleeps
--import-s seconds and allocates 256 MiB at import, as torch + transformers
do for 4-15 s), one cold and one with

    [runner]
    mode = "warm"
    preload = ["heavy_stand_in"]

and runs each with `fvd submit --wait` embedded on one CPU slot, so runs
follow one another. Per run, start-up is job start -> test body: from the
worker's spawn time (`jobs.spawned_ms`, the fork for a warm run) to the
moment pytest calls the test function (a conftest hook). Also: the wall time
of each submit (the warm one includes its zygote's one import) and from one
run's end to the next run's test body (the loop an agent waits on).

Usage: python3 bench/warm_cpu.py [--fvd PATH] [--n 6] [--import-s 1.5]
"""

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from port_overhead import PREP  # noqa: E402

HEAVY = """import time
_ballast = bytearray(256 << 20)
for _i in range(0, len(_ballast), 4096):
    _ballast[_i] = 1
time.sleep({seconds})
"""

CONFTEST = """import json, os, time


def pytest_runtest_call(item):
    with open(os.environ["WARM_BENCH_LOG"], "a") as f:
        f.write(json.dumps({"test": item.path.name, "t": time.time(), "pid": os.getpid()}) + "\\n")
"""


def write_port(repo, family, n, lib, log, warm):
    tests = os.path.join(repo, "tests", "local_tests", "generic")
    os.makedirs(tests, exist_ok=True)
    os.makedirs(os.path.join(repo, "tests", "local_tests", family), exist_ok=True)
    with open(os.path.join(repo, "conftest.py"), "w") as f:
        f.write(CONFTEST)
    spec = PREP.format(family=family)
    spec += f'\n[defaults]\nset_env = {{ PYTHONPATH = "{lib}", WARM_BENCH_LOG = "{log}", PYTHONDONTWRITEBYTECODE = "1" }}\n'
    for i in range(n):
        rel = f"tests/local_tests/generic/test_{family}_c{i}_parity.py"
        with open(os.path.join(repo, rel), "w") as f:
            f.write("import heavy_stand_in  # noqa: F401\n\n\ndef test_parity():\n    assert True\n")
        spec += f'\n[[component]]\nname = "c{i}"\ntype = "generic"\nparity_test = "{rel}"\ncoverage_scope = "both"\n'
    if warm:
        spec += '\n[runner]\nmode = "warm"\npreload = ["heavy_stand_in"]\n'
    with open(os.path.join(repo, "tests", "local_tests", family, "port.toml"), "w") as f:
        f.write(spec)


def run(fvd, tmp, family, n, lib, warm):
    repo = os.path.join(tmp, family)
    log = os.path.join(tmp, f"{family}.log")
    write_port(repo, family, n, lib, log, warm)
    start = time.perf_counter()
    r = subprocess.run(
        [fvd, "submit", "--family", family, "--repo", repo, "--wait", "--gpus", "none", "--cpu-slots", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit(f"fvd submit ({family}) exited {r.returncode}: {r.stderr[-2000:]}")
    if warm and "warm runner unavailable" in r.stderr:
        sys.exit(f"the warm port ran cold: {r.stderr[-2000:]}")
    body = {}
    with open(log) as f:
        for line in f:
            rec = json.loads(line)
            comp = rec["test"].split("_")[-2]
            body[comp] = rec["t"] * 1000.0
    db = sqlite3.connect(os.path.join(repo, ".fvd", "state.db"))
    rows = list(db.execute("SELECT component, spawned_ms, duration_ms FROM jobs ORDER BY spawned_ms"))
    db.close()
    startup = [(body[c] - spawned) / 1000.0 for c, spawned, _ in rows]
    # From the end of one run (spawn + duration) to the next run's body.
    turn = [(body[rows[i][0]] - (rows[i - 1][1] + rows[i - 1][2])) / 1000.0 for i in range(1, len(rows))]
    return {"wall_s": wall, "startup_s": startup, "end_to_next_body_s": turn}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fvd", default=None)
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--import-s", type=float, default=1.5)
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    fvd = args.fvd
    if fvd is None:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "fvd"], cwd=ROOT, check=True)
        fvd = os.path.join(ROOT, "target", "release", "fvd")
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    with tempfile.TemporaryDirectory() as tmp:
        lib = os.path.join(tmp, "lib")
        os.makedirs(lib)
        with open(os.path.join(lib, "heavy_stand_in.py"), "w") as f:
            f.write(HEAVY.format(seconds=args.import_s))
        cold = run(fvd, tmp, "coldbench", args.n, lib, False)
        warm = run(fvd, tmp, "warmbench", args.n, lib, True)
    med = statistics.median
    out = {
        "n": args.n,
        "import_s": args.import_s,
        "cold": cold,
        "warm": warm,
        "startup_median_s": {"cold": med(cold["startup_s"]), "warm": med(warm["startup_s"])},
        "end_to_next_body_median_s": {
            "cold": med(cold["end_to_next_body_s"]),
            "warm": med(warm["end_to_next_body_s"]),
        },
    }
    print(f"{args.n} runs one after another, each importing a {args.import_s:.1f} s stand-in library")
    print(f"{'':34}{'cold':>10}{'warm':>10}{'ratio':>9}")
    rows = [
        ("start-up, job start -> test body", out["startup_median_s"]["cold"], out["startup_median_s"]["warm"]),
        ("run end -> next test body", out["end_to_next_body_median_s"]["cold"], out["end_to_next_body_median_s"]["warm"]),
        ("whole port, wall", cold["wall_s"], warm["wall_s"]),
    ]
    for name, c, w in rows:
        print(f"{name:34}{c:>9.3f}s{w:>9.3f}s{c / w:>8.1f}x")
    print("(medians; a warm run's start is its fork: the zygote's one import is in the warm wall time)")
    print("warm start-ups:", " ".join(f"{s:.3f}" for s in warm["startup_s"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
