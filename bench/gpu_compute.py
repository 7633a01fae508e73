#!/usr/bin/env python3
"""Issue #33 on GPUs: the agent loop's rerun at the compute limit.

  python3 bench/gpu_compute.py --fvd FVD --mode cold|warm [--repeats N] [--out DIR]

The case: `examples/gpuport` widened to 8 one-GPU components and tp_mlp on
two GPUs through `torchrun` (bench/gpu_warm.py's `pack_spec`), one worker
owning every GPU, GPUPORT_REPEATS checks per test. One orchestrator
database per mode; the port is submitted once (its runs give the
durations placement reads), then rerun with `--placement fifo` and with
`--placement duration` (the default), alternating --pairs times, each
rerun on a fresh `fvd orchestrator serve` over the same database and port
(the one worker reconnects, and its zygote stays warm). With
--mode warm the spec gets `[runner] mode = "warm"` and torchrun runs warm
too (ranks forked from the zygote).

Per rerun: the wall time of `fvd submit --rerun --wait`, the makespan
(first job start to last job end), when tp_mlp started, and the port's
compute-only ideal: max(sum over jobs of test-body seconds x GPUs / GPUs,
the longest body), from the test bodies' own start and end (the conftest's
GPUPORT_BODY_LOG hook; rank 0 for torchrun). Results: DIR/gpu_compute-MODE.json
and progress lines on stdout.
"""

import argparse
import json
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_warm import PRELOAD, ROOT, bench_env, log, pack_spec, sanitize, with_set_env  # noqa: E402


class Fleet:
    """One worker owning every GPU, kept for the whole run (its zygote stays
    warm across reruns, as in an agent's loop), and an orchestrator on one
    fixed loopback port and database, restarted with each placement policy:
    the worker reconnects to the new one."""

    def __init__(self, fvd, work, db, env):
        self.fvd, self.work, self.db, self.env = fvd, work, db, env
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.orch = None
        self.n = 0
        self.serve("duration")
        self.wlog = open(os.path.join(work, "worker.log"), "w")
        self.worker = subprocess.Popen(
            [fvd, "worker", "--orchestrator", self.url, "--workspace", os.path.join(work, "ws"),
             "--gpus", "all", "--cpu-slots", "1", "--worker-id", "gpus"],
            stdout=subprocess.DEVNULL, stderr=self.wlog, env=env,
        )
        self.registered()

    def serve(self, placement):
        if self.orch is not None:
            self.orch.terminate()
            self.orch.wait(timeout=30)
        self.n += 1
        self.olog = os.path.join(self.work, f"orchestrator-{self.n}-{placement}.log")
        self.orch = subprocess.Popen(
            [self.fvd, "orchestrator", "serve", "--listen", f"127.0.0.1:{self.port}",
             "--db", f"sqlite://{self.db}", "--placement", placement],
            stdout=subprocess.DEVNULL, stderr=open(self.olog, "w"), env=self.env,
        )

    def registered(self):
        deadline = time.time() + 60
        while time.time() < deadline:
            with open(self.olog) as f:
                if "worker registered" in f.read():
                    return
            time.sleep(0.1)
        raise SystemExit(f"{self.olog}: the worker did not register")

    def submit(self, family, repo, extra, timeout):
        t0 = time.time()
        r = subprocess.run(
            [self.fvd, "submit", "--family", family, "--repo", repo, "--orchestrator", self.url, "--wait", *extra],
            capture_output=True, text=True, timeout=timeout,
        )
        wall = time.time() - t0
        log(f"submit {' '.join(extra)} exit {r.returncode} in {wall:.1f} s")
        if r.returncode not in (0,):
            print(r.stdout[-3000:], r.stderr[-3000:], flush=True)
        return {"exit": r.returncode, "wall_s": wall}

    def jobs(self):
        db = sqlite3.connect(self.db)
        rows = db.execute(
            "SELECT job_id, component, run_no, gpus_needed, spawned_ms, duration_ms, verdict FROM jobs "
            "WHERE spawned_ms IS NOT NULL ORDER BY spawned_ms").fetchall()
        db.close()
        keys = ["job_id", "component", "run", "gpus", "spawned_ms", "duration_ms", "verdict"]
        return [dict(zip(keys, r)) for r in rows]

    def stop(self):
        for p in (self.worker, self.orch):
            p.terminate()
        for p in (self.worker, self.orch):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


def bodies(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def measure(fleet, body_log, since_ms, ngpus, sub):
    jobs = [j for j in fleet.jobs() if j["spawned_ms"] >= since_ms]
    recs = [b for b in bodies(body_log) if b["rank"] == 0 and "t_end" in b]
    gpu_s, longest, startup = 0.0, 0.0, []
    for j in jobs:
        prefix = sanitize(j["job_id"]) + "."
        mine = [b for b in recs if b["job"].startswith(prefix)]
        if not mine:
            continue
        body = sum(b["t_end"] - b["t"] for b in mine)
        gpu_s += body * j["gpus"]
        longest = max(longest, body)
        startup.append(min(b["t"] for b in mine) - j["spawned_ms"] / 1000.0)
    ideal = max(gpu_s / ngpus, longest)
    t0 = min(j["spawned_ms"] for j in jobs) / 1000.0
    end = max(j["spawned_ms"] + (j["duration_ms"] or 0) for j in jobs) / 1000.0
    tp = [j for j in jobs if j["gpus"] == 2]
    return {
        "wall_s": sub["wall_s"],
        "exit": sub["exit"],
        "makespan_s": end - t0,
        "ideal_s": ideal,
        "wall_over_ideal": sub["wall_s"] / ideal if ideal else None,
        "makespan_over_ideal": (end - t0) / ideal if ideal else None,
        "body_gpu_s": gpu_s,
        "longest_body_s": longest,
        "startup_median_s": statistics.median(startup) if startup else None,
        "startup_max_s": max(startup) if startup else None,
        "tp_mlp_start_s": (tp[0]["spawned_ms"] / 1000.0 - t0) if tp else None,
        "jobs": [
            {k: j[k] for k in ("component", "run", "gpus", "spawned_ms", "duration_ms", "verdict")}
            for j in jobs
        ],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fvd", required=True)
    ap.add_argument("--mode", choices=["cold", "warm"], required=True)
    ap.add_argument("--repeats", type=int, default=4000)
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=280)
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(ROOT, "bench", "out", "gpu_compute")))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gpu_compute.")
    env = bench_env(work)
    gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip().splitlines()
    log(f"{len(gpus)} GPUs: {gpus[:1]}; mode {args.mode}; GPUPORT_REPEATS={args.repeats}")
    subprocess.run([sys.executable, "-c", "import torch, transformers.models.gpt2.modeling_gpt2"], check=True)

    repo = os.path.join(work, "repo")
    shutil.copytree(os.path.join(ROOT, "examples", "gpuport"), repo)
    with open(os.path.join(repo, "tests", "local_tests", "gpuport", "port.toml")) as f:
        text = pack_spec(f.read())
    body_log = os.path.join(work, "bodies.jsonl")
    text = with_set_env(text, {"GPUPORT_REPEATS": args.repeats, "GPUPORT_BODY_LOG": body_log})
    if args.mode == "warm":
        text += '\n[runner]\nmode = "warm"\npreload = [%s]\n' % ", ".join(f'"{m}"' for m in PRELOAD)
    os.makedirs(os.path.join(repo, "tests", "local_tests", "gpupack"), exist_ok=True)
    with open(os.path.join(repo, "tests", "local_tests", "gpupack", "port.toml"), "w") as f:
        f.write(text)
    os.environ.update(env)
    db = os.path.join(work, "state")
    out = {"gpus": gpus, "mode": args.mode, "repeats": args.repeats, "reruns": []}
    result = os.path.join(args.out, f"gpu_compute-{args.mode}.json")
    runs = [("first", "duration")] + [p for _ in range(args.pairs) for p in (("rerun", "fifo"), ("rerun", "duration"))]
    fleet = Fleet(args.fvd, work, db, env)
    try:
        for i, (what, policy) in enumerate(runs):
            if i > 0:
                fleet.serve(policy)
                fleet.registered()
            since = int(time.time() * 1000)
            extra = ["--rerun"] if what == "rerun" else []
            sub = fleet.submit("gpupack", repo, extra, timeout=args.timeout)
            m = measure(fleet, body_log, since, len(gpus), sub)
            m.update(what=what, placement=policy)
            out["reruns"].append(m)
            log(f"{what} {policy}: wall {m['wall_s']:.1f} s, makespan {m['makespan_s']:.1f} s, ideal {m['ideal_s']:.1f} s "
                f"(wall/ideal {m['wall_over_ideal']}), tp_mlp at {m['tp_mlp_start_s']}, "
                f"start-up median {m['startup_median_s']}, max {m['startup_max_s']}")
            with open(result, "w") as f:
                json.dump(out, f, indent=1)
    finally:
        fleet.stop()
        with open(result, "w") as f:
            json.dump(out, f, indent=1)
        logs = []
        for name in sorted(os.listdir(work)):
            if name.endswith(".log"):
                with open(os.path.join(work, name)) as f:
                    logs.append(f"===== {name}\n{f.read()[-100000:]}")
        with open(os.path.join(args.out, f"logs-{args.mode}.txt"), "w") as f:
            f.write("\n".join(logs))
    log("done")


if __name__ == "__main__":
    main()
