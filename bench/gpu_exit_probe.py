#!/usr/bin/env python3
"""Issue #33 item 3 on a GPU: where a parity run's time outside its test
body goes, warm and cold.

  python3 bench/gpu_exit_probe.py --fvd FVD [--runs N] [--repeats N] [--out DIR]

One one-GPU component of `examples/gpuport` (`embed`), submitted embedded
and rerun N times, in each of --modes (`cold`, `warm`, `cold-omp1`: cold
with `OMP_NUM_THREADS=1`; `warm-fleet`: warm on one `fvd worker` kept across
the submits, as in an agent's loop). An embedded submit is a new process,
so a `warm` run there includes its zygote's start. The conftest's GPUPORT_BODY_LOG
records when the test body started and ended and when the process reached
pytest's sessionfinish, unconfigure and its atexit handlers; the store has
when the worker spawned the process, how long it ran (spawn to exit) and
when the orchestrator recorded its result. Per run, in seconds:

  start   spawn -> test body (imports, collection, fixtures, CUDA init)
  body    the test body
  finish  body end -> sessionfinish (the rest of the session)
  report  sessionfinish -> unconfigure (JUnit and terminal reports)
  atexit  unconfigure -> atexit handlers (pytest returning, sys.exit)
  exit    atexit -> process exit (interpreter and CUDA teardown)
  record  process exit -> result recorded (the worker's report, the store)

With --concurrency 1,2,4 (after the modes): start-up under concurrency, on
one `fvd worker` owning every GPU (one zygote): a port of K copies of
`embed`, one GPU each, submitted once (which starts the zygote, for the
first K) and rerun --runs times, so K runs start at once; per K the
medians over the reruns' runs of the phases above. A worker takes each GPU
once (`--gpus 0,0` is refused), so K is at most the GPU count.

Results: DIR/gpu_exit_probe.json and one line per run on stdout.
"""

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_warm import PRELOAD, ROOT, bench_env, log, sanitize, with_set_env  # noqa: E402

PHASES = ["start", "body", "finish", "report", "atexit", "exit", "record"]


def spec_of(src, body_log, repeats, warm, omp=None, copies=1, family="gpuprobe"):
    head, _, _ = src.partition("[[component]]")
    head = head.replace('model_family = "gpuport"', f'model_family = "{family}"').replace(
        "tests/local_tests/gpuport/PORT_STATUS.md", f"tests/local_tests/{family}/PORT_STATUS.md")
    text = head
    for i in range(copies):
        text += ('[[component]]\nname = "%s"\ntype = "encoder"\n'
                 'parity_test = "tests/local_tests/encoders/test_gpuport_embed_parity.py"\n'
                 'coverage_scope = "implementation_subcomponent"\n\n') % ("embed" if copies == 1 else f"embed_{i}")
    knobs = {"GPUPORT_REPEATS": repeats, "GPUPORT_BODY_LOG": body_log}
    if omp:
        knobs["OMP_NUM_THREADS"] = omp
    text = with_set_env(text, knobs)
    if warm:
        text += '\n[runner]\nmode = "warm"\npreload = [%s]\n' % ", ".join(f'"{m}"' for m in PRELOAD)
    return text


def split(job, recs):
    prefix = sanitize(job["job_id"]) + "."
    mine = [r for r in recs if r["job"].startswith(prefix) and r["rank"] == 0]
    body = next((r for r in mine if "t_end" in r), None)
    at = {r["phase"]: r["t"] for r in mine if "phase" in r}
    spawn = job["spawned_ms"] / 1000.0
    end = spawn + job["duration_ms"] / 1000.0
    if body is None or not {"sessionfinish", "unconfigure", "atexit"} <= set(at):
        return None
    marks = [spawn, body["t"], body["t_end"], at["sessionfinish"], at["unconfigure"], at["atexit"], end,
             job["finished_ms"] / 1000.0]
    return {p: round(b - a, 3) for p, a, b in zip(PHASES, marks, marks[1:])}


def medians(rows):
    return {p: round(statistics.median(s[p] for s in rows), 3) for p in PHASES}


def read_runs(db_path, body_log, since_ms=0):
    db = sqlite3.connect(db_path)
    jobs = [dict(zip(["job_id", "spawned_ms", "duration_ms", "finished_ms"], row)) for row in db.execute(
        "SELECT job_id, spawned_ms, duration_ms, finished_ms FROM jobs WHERE spawned_ms IS NOT NULL "
        "AND duration_ms IS NOT NULL AND finished_ms IS NOT NULL AND spawned_ms >= ? ORDER BY spawned_ms",
        (since_ms,))]
    db.close()
    with open(body_log) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return [s for s in (split(j, recs) for j in jobs) if s]


def concurrency(args, work, env, levels):
    """K runs at once on one worker and its one zygote, for each K."""
    from gpu_compute import Fleet

    repo = os.path.join(work, "concurrency")
    shutil.copytree(os.path.join(ROOT, "examples", "gpuport"), repo)
    body_log = os.path.join(work, "body-concurrency.jsonl")
    with open(os.path.join(repo, "tests", "local_tests", "gpuport", "port.toml")) as f:
        src = f.read()
    for k in levels:
        family = f"gpuprobe{k}"
        os.makedirs(os.path.join(repo, "tests", "local_tests", family), exist_ok=True)
        with open(os.path.join(repo, "tests", "local_tests", family, "port.toml"), "w") as f:
            f.write(spec_of(src, body_log, args.repeats, True, copies=k, family=family))
    fleet = Fleet(args.fvd, work, os.path.join(work, "concurrency.db"), env)
    out = {}
    try:
        for k in levels:
            since = None
            for i in range(args.runs + 1):
                if i == 1:
                    since = int(time.time() * 1000)
                r = fleet.submit(f"gpuprobe{k}", repo, ["--rerun"] if i else [], timeout=300)
                if r["exit"] != 0:
                    log(f"concurrency {k}: submit {i} exited {r['exit']}")
            rows = read_runs(fleet.db, body_log, since)
            if not rows:
                log(f"concurrency {k}: no run measured")
                continue
            med = medians(rows)
            starts = sorted(s["start"] for s in rows)
            out[str(k)] = {"runs": rows, "median": med, "start_max": starts[-1]}
            log(f"concurrency {k} ({len(rows)} runs): start-up median {med['start']:.3f} s, max {starts[-1]:.3f} s; "
                "medians " + "  ".join(f"{p} {med[p]:.3f}" for p in PHASES))
    finally:
        fleet.stop()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fvd", required=True)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=1000)
    ap.add_argument("--modes", default="cold,warm", help="comma-separated: cold, warm, cold-omp1 (cold with OMP_NUM_THREADS=1), warm-fleet (one worker kept across submits)")
    ap.add_argument("--concurrency", default="", help="comma-separated run counts at once, e.g. 1,2,4 (warm, one worker)")
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(ROOT, "bench", "out", "gpu_exit_probe")))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gpu_exit_probe.")
    env = bench_env(work)
    out = {"runs": {}}
    for mode in [m for m in args.modes.split(",") if m]:
        repo = os.path.join(work, mode)
        shutil.copytree(os.path.join(ROOT, "examples", "gpuport"), repo)
        body_log = os.path.join(work, f"body-{mode}.jsonl")
        with open(os.path.join(repo, "tests", "local_tests", "gpuport", "port.toml")) as f:
            text = spec_of(f.read(), body_log, args.repeats, mode.startswith("warm"), 1 if mode == "cold-omp1" else None)
        os.makedirs(os.path.join(repo, "tests", "local_tests", "gpuprobe"), exist_ok=True)
        with open(os.path.join(repo, "tests", "local_tests", "gpuprobe", "port.toml"), "w") as f:
            f.write(text)
        # warm-fleet: one worker for every submit, so its zygote stays (an
        # agent's loop); the other modes submit embedded.
        fleet = None
        if mode == "warm-fleet":
            from gpu_compute import Fleet

            fleet = Fleet(args.fvd, work, os.path.join(work, "fleet.db"), env)
        target = ["--orchestrator", fleet.url] if fleet else []
        try:
            for i in range(args.runs + 1):
                extra = ["--rerun"] if i else []
                t0 = time.time()
                r = subprocess.run([args.fvd, "submit", "--family", "gpuprobe", "--wait", "--repo", repo, *target, *extra],
                                   capture_output=True, text=True, env=env, timeout=300)
                log(f"{mode} submit {i}: exit {r.returncode} in {time.time() - t0:.1f} s")
                if r.returncode != 0:
                    print(r.stdout[-2000:], r.stderr[-2000:], flush=True)
        finally:
            if fleet:
                fleet.stop()
        rows = read_runs(fleet.db if fleet else os.path.join(repo, ".fvd", "state.db"), body_log)
        out["runs"][mode] = rows
        for k, s in enumerate(rows):
            log(f"{mode} run {k + 1}: " + "  ".join(f"{p} {s[p]:.3f}" for p in PHASES))
        if len(rows) > 1:
            later = rows[1:]
            med = medians(later)
            out.setdefault("median_after_first", {})[mode] = med
            log(f"{mode} median of runs 2..: " + "  ".join(f"{p} {med[p]:.3f}" for p in PHASES))
    if args.concurrency:
        out["concurrency"] = concurrency(args, work, env, [int(k) for k in args.concurrency.split(",")])
    with open(os.path.join(args.out, "gpu_exit_probe.json"), "w") as f:
        json.dump(out, f, indent=1)
    log("done")


if __name__ == "__main__":
    main()
