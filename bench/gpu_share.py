#!/usr/bin/env python3
"""Issue #44 on a GPU: the four single-GPU `examples/gpuport` tests (embed,
attention, mlp, encoder), warm runner, `fvd submit --rerun` on one worker
owning the GPU(s), in three modes side by side: `whole` (`gpu_share =
false`: every run takes a whole GPU, one after another on a one-GPU
machine), `share` (each component's `gpu_memory_mib` set, the
orchestrator's default cap of 4 runs a GPU) and `learned` (no
`gpu_memory_mib`: the first submit's runs take whole GPUs, the reruns ask
for what fvd's plugin measured them to peak at). Without `gpu_share =
false`, a spec with no `gpu_memory_mib` is no whole-GPU baseline any more:
its reruns share by their learned peaks.

  python3 bench/gpu_share.py --fvd FVD [--out DIR] [--reps 3] [--mib 4096]
      [--modes share,learned,mps] [--repeats 1,300] [--copies 1]

`--copies 2 --repeats 1000`: each test twice, the eight one-GPU runs of
issue #33's 9-component case (its 2-GPU `tp_mlp` needs a second GPU), on
the GPUs lent; the summary's bodies summed per whole-GPU rerun are, on one
GPU, the bound of running them one after another.

Three fleets (an orchestrator and one `--gpus all` worker each) stay up
side by side; each gets one port per GPUPORT_REPEATS value (1: start-up
bound, 300: the GPU busy), submitted once to start its warm runner, then
rerun --reps times, the modes in turn (rotating), so all see the same
machine.
Per rerun: its wall time, each run's start-up (job start -> test body,
the conftest's GPUPORT_BODY_LOG hook) and body, and the GPU memory
`nvidia-smi` saw (sampled every ~0.2 s: the most any one process held, and
the most the GPU held in all).

Results: DIR/gpu_share.json, a summary on stdout and DIR/summary.txt.

  python3 bench/gpu_share.py --fvd FVD --learned [--out DIR] [--reps 3]

The learned estimate instead: one fleet, no `gpu_memory_mib` in the spec.
The first submit knows nothing, so each run takes a whole GPU; fvd's
pytest plugin measures each run's peak and the reruns ask for the most of
the recorded peaks x 1.25. Per submit: wall time and nvidia-smi's memory
as above; per run: the peak the plugin measured (`jobs.peak_gpu_mib`)
beside nvidia-smi's peak of its process, and what it says later runs ask
for (`jobs.next_gpu_mib`). Results: DIR/gpu_share_learned.json and
DIR/summary_learned.txt.
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
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_warm import PRELOAD, ROOT, Fleet, bench_env, log, sanitize, save_logs, startups, with_set_env  # noqa: E402

COMPONENTS = ["embed", "attention", "mlp", "encoder"]
# whole: gpu_share = false; share: gpu_memory_mib; learned: neither (the
# reruns ask for the measured peaks); mps: as share, the worker under
# `--mps`. `--modes` picks (whole always first: the baseline).
MODES = ("whole", "share", "learned")
REPEATS = ("1", "300")


def spec_for(src_text, family, mode, repeats, body_log, mib, copies=1):
    """The gpuport spec as `family`: its four single-GPU components (no
    tp_mlp), each `copies` times (`embed_0`, `embed_1`, ... when more than
    once), GPUPORT_REPEATS and the body log in set_env, the warm runner,
    and, sharing, `gpu_memory_mib` on each component."""
    head, _, rest = src_text.partition("[[component]]")
    head = head.replace('model_family = "gpuport"', f'model_family = "{family}"').replace(
        "tests/local_tests/gpuport/PORT_STATUS.md", f"tests/local_tests/{family}/PORT_STATUS.md")
    head = with_set_env(head, {"GPUPORT_REPEATS": repeats, "GPUPORT_BODY_LOG": body_log})
    blocks = ("[[component]]" + rest).split("[[component]]")[1:]
    kept = [b for b in blocks if any(f'name = "{c}"\n' in b for c in COMPONENTS)]
    assert len(kept) == 4, "the gpuport spec changed: four single-GPU components expected"
    if copies > 1:
        kept = [b.replace(f'name = "{c}"\n', f'name = "{c}_{i}"\n')
                for i in range(copies) for b in kept for c in COMPONENTS if f'name = "{c}"\n' in b]
    out = head
    for b in kept:
        b = b.rstrip("\n") + "\n"
        if mode == "whole":
            b += "gpu_share = false\n"
        if mode in ("share", "mps"):
            b += f"gpu_memory_mib = {mib}\n"
        out += "[[component]]" + b + "\n"
    out += '[runner]\nmode = "warm"\npreload = [%s]\n' % ", ".join(f'"{m}"' for m in PRELOAD)
    return out


def port_copy(work, name, family, spec_text):
    """A copy of `examples/gpuport` at WORK/NAME with `spec_text` as
    `family`'s spec; its path."""
    repo = os.path.join(work, name)
    shutil.copytree(os.path.join(ROOT, "examples", "gpuport"), repo)
    os.makedirs(os.path.join(repo, "tests", "local_tests", family), exist_ok=True)
    with open(os.path.join(repo, "tests", "local_tests", family, "port.toml"), "w") as f:
        f.write(spec_text)
    return repo


class Sampler:
    """nvidia-smi every ~0.2 s while a submit runs: the most memory one
    compute process held (MiB) and the most the GPU(s) held in all."""

    def __init__(self):
        self.stop = threading.Event()
        self.per_pid = {}
        self.total = 0
        self.samples = 0
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            try:
                apps = subprocess.run(
                    ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                    capture_output=True, text=True, timeout=5).stdout
                used = subprocess.run(
                    ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                    capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.TimeoutExpired):
                break
            for line in apps.splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                    self.per_pid[parts[0]] = max(self.per_pid.get(parts[0], 0), int(parts[1]))
            total = sum(int(x) for x in used.split() if x.strip().isdigit())
            self.total = max(self.total, total)
            self.samples += 1
            self.stop.wait(0.2)

    def done(self):
        self.stop.set()
        self.t.join(timeout=10)
        return {"process_peaks_mib": sorted(self.per_pid.values(), reverse=True),
                "gpu_peak_mib": self.total, "samples": self.samples}


def submit(fleet, fvd, family, repo, extra, timeout):
    s = Sampler()
    try:
        r = fleet.submit(fvd, family, repo, extra, timeout=timeout)
    finally:
        r_mem = s.done()
    return {**r, **r_mem}


def per_submit(subs, jobs):
    """Each submit with its jobs (those spawned while it ran): start-up and
    body per run."""
    for s in subs:
        lo, hi = s["t0"], s["t0"] + s["wall_s"]
        mine = [j for j in jobs if lo <= j["spawned_ms"] / 1000.0 <= hi]
        s["runs"] = [{"component": j["component"], "run": j["run"], "verdict": j["verdict"],
                      "duration_s": (j["duration_ms"] or 0) / 1000.0,
                      "startup_s": j.get("startup_s"), "body_s": j.get("body_s"),
                      "phases_s": j.get("phases_s")} for j in mine]
        if mine:
            spawn = min(j["spawned_ms"] for j in mine) / 1000.0
            recorded = max((j["finished_ms"] or 0) for j in mine) / 1000.0
            s["before_first_spawn_s"] = round(spawn - lo, 3)
            s["after_last_record_s"] = round(hi - recorded, 3) if recorded else None
    return subs


# A run's time, in order: spawn -> test body (start), the body, body end ->
# sessionfinish, -> unconfigure (reports), -> atexit, -> process exit,
# -> result recorded by the orchestrator; from the conftest's body log
# (GPUPORT_BODY_LOG) and the store.
PHASES = ["start", "body", "finish", "report", "atexit", "exit", "record"]


def phases(job, recs):
    """`job`'s PHASES in seconds, None where a mark is missing."""
    prefix = sanitize(job["job_id"]) + "."
    mine = [r for r in recs if r["job"].startswith(prefix) and r["rank"] == 0]
    body = [r for r in mine if "phase" not in r]
    marks = {r["phase"]: r["t"] for r in mine if "phase" in r}
    spawn = job["spawned_ms"] / 1000.0
    exit_ = spawn + (job["duration_ms"] or 0) / 1000.0 if job["duration_ms"] is not None else None
    rec = job["finished_ms"] / 1000.0 if job.get("finished_ms") else None
    points = [spawn, min((b["t"] for b in body), default=None), max((b["t_end"] for b in body), default=None),
              marks.get("sessionfinish"), marks.get("unconfigure"), marks.get("atexit"), exit_, rec]
    return {name: (round(b - a, 4) if a is not None and b is not None else None)
            for name, a, b in zip(PHASES, points, points[1:])}


def bodies(jobs, body_log):
    """startups() plus each run's body (t_end - t of its test body)."""
    out = startups(jobs, body_log)
    recs = []
    if os.path.exists(body_log):
        with open(body_log) as f:
            recs = [json.loads(line) for line in f if line.strip()]
    for j in out:
        prefix = sanitize(j["job_id"]) + "."
        mine = [r for r in recs if "phase" not in r and r["job"].startswith(prefix) and r["rank"] == 0]
        if mine:
            j["body_s"] = sum(r["t_end"] - r["t"] for r in mine)
        j["phases_s"] = phases(j, recs)
    return out


def med(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def summary(results, reps):
    """Per GPUPORT_REPEATS: each mode's walls and medians against whole
    GPUs', and the sum of the whole-GPU reruns' test bodies (on one GPU,
    the bound of running them one after another: every run its own
    wave)."""
    lines = []
    for repeats in REPEATS:
        row = {}
        for mode in MODES:
            subs = results[mode][repeats]["reruns"]
            walls = [round(s["wall_s"], 2) for s in subs]
            runs = [r for s in subs for r in s["runs"]]
            row[mode] = {
                "walls_s": walls,
                "body_sum_median_s": med([sum(r["body_s"] or 0 for r in s["runs"]) for s in subs]),
                "median_s": med(walls),
                "startup_median_s": med([r["startup_s"] for r in runs]),
                "body_median_s": med([r["body_s"] for r in runs]),
                "process_peak_mib": max((max(s["process_peaks_mib"], default=0) for s in subs), default=0),
                "gpu_peak_mib": max((s["gpu_peak_mib"] for s in subs), default=0),
                "exits": [s["exit"] for s in subs],
            }
        w = row["whole"]["median_s"]
        ratios = {m: (round(row[m]["median_s"] / w, 3) if w and row[m]["median_s"] else None)
                  for m in MODES if m != "whole"}
        for mode in MODES:
            subs = results[mode][repeats]["reruns"]
            runs = [r for s in subs for r in s["runs"]]
            row[mode]["phase_medians_s"] = {
                "before_first_spawn": med([s.get("before_first_spawn_s") for s in subs]),
                **{p: med([(r.get("phases_s") or {}).get(p) for r in runs]) for p in PHASES},
                "after_last_record": med([s.get("after_last_record_s") for s in subs]),
            }
        lines.append(f"GPUPORT_REPEATS={repeats}: whole {row['whole']['walls_s']} (median {w} s), " + ", ".join(
            f"{m} {row[m]['walls_s']} (median {row[m]['median_s']} s): {ratios[m]}x" for m in ratios))
        for mode in MODES:
            r = row[mode]
            lines.append(f"  {mode}: start-up median {r['startup_median_s']} s, body median "
                         f"{r['body_median_s']} s, peak per process {r['process_peak_mib']} MiB, "
                         f"GPU peak {r['gpu_peak_mib']} MiB, exits {r['exits']}, bodies summed per rerun "
                         f"{r['body_sum_median_s']} s")
            lines.append(f"    medians (s): {r['phase_medians_s']}")
        results[f"summary_{repeats}"] = {**row, "ratios": ratios}
    return "\n".join(lines)


def recorded_peaks(db):
    """Each finished run's peak as fvd's plugin measured it and what it
    says later runs ask for, by job id."""
    con = sqlite3.connect(db)
    rows = con.execute("SELECT job_id, peak_gpu_mib, next_gpu_mib FROM jobs WHERE state = 'finished'").fetchall()
    con.close()
    return {j: {"peak_gpu_mib": p, "next_gpu_mib": n} for j, p, n in rows}


def learned(args, work, env, src):
    """--learned: no gpu_memory_mib; the first submit against the reruns,
    which ask for what the first one's runs peaked at."""
    fleet = Fleet(args.fvd, work, "learned", env)
    body_log = os.path.join(work, "body-learned.jsonl")
    out = {}
    try:
        for repeats in REPEATS:
            family = f"learned{repeats}"
            repo = port_copy(work, f"repo-{family}", family, spec_for(src, family, "learned", repeats, body_log, 0))
            first = submit(fleet, args.fvd, family, repo, [], args.timeout)
            out[repeats] = {"first": first, "reruns": []}
            for rep in range(args.reps):
                s = submit(fleet, args.fvd, family, repo, ["--rerun"], args.timeout)
                out[repeats]["reruns"].append(s)
                log(f"learned rep {rep} REPEATS={repeats}: {s['wall_s']:.2f} s, process peaks "
                    f"{s['process_peaks_mib'][:4]} MiB, GPU {s['gpu_peak_mib']} MiB")
        jobs = bodies(fleet.jobs(), body_log)
        peaks = recorded_peaks(fleet.db)
        lines = []
        for repeats in REPEATS:
            r = out[repeats]
            per_submit([r["first"]] + r["reruns"], jobs)
            for s in [r["first"]] + r["reruns"]:
                for run in s["runs"]:
                    run.update(peaks.get(f"learned{repeats}.{run['component']}.{run['run']}", {}))
            walls = [round(s["wall_s"], 2) for s in r["reruns"]]
            first_peaks = {x["component"]: x.get("peak_gpu_mib") for x in r["first"]["runs"]}
            asks = {x["component"]: x.get("next_gpu_mib") for x in r["first"]["runs"]}
            lines.append(f"GPUPORT_REPEATS={repeats}: first (whole GPUs) {r['first']['wall_s']:.2f} s, "
                         f"reruns (learned) {walls} (median {med(walls)} s)")
            lines.append(f"  plugin peaks {first_peaks} MiB, learned asks {asks} MiB, nvidia-smi process "
                         f"peaks {r['first']['process_peaks_mib'][:4]} MiB, GPU peak first "
                         f"{r['first']['gpu_peak_mib']} / reruns {max(s['gpu_peak_mib'] for s in r['reruns'])} MiB")
        text = "\n".join(lines)
        print(text, flush=True)
        with open(os.path.join(args.out, "summary_learned.txt"), "w") as f:
            f.write(text + "\n")
    finally:
        fleet.stop()
        with open(os.path.join(args.out, "gpu_share_learned.json"), "w") as f:
            json.dump(out, f, indent=1)


def main():
    global MODES, REPEATS
    ap = argparse.ArgumentParser()
    ap.add_argument("--fvd", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(ROOT, "bench", "out", "gpu_share")))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mib", type=int, default=4096)
    ap.add_argument("--timeout", type=int, default=150)
    ap.add_argument("--learned", action="store_true",
                    help="no gpu_memory_mib: the first submit (whole GPUs) against reruns that ask for the learned peaks")
    ap.add_argument("--copies", type=int, default=1,
                    help="each of the four components this many times (2: the eight one-GPU runs of issue #33's case)")
    ap.add_argument("--repeats", default="1,300", help="GPUPORT_REPEATS values, comma-separated")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated, of whole, share, learned, mps (the worker under --mps)")
    args = ap.parse_args()
    MODES = tuple(dict.fromkeys(["whole"] + [m for m in args.modes.split(",") if m]))
    REPEATS = tuple(r for r in args.repeats.split(",") if r)
    assert set(MODES) <= {"whole", "share", "learned", "mps"}, MODES
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gpu_share.")
    env = bench_env(work)
    gpus = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip().splitlines()
    log(f"{len(gpus)} GPUs: {gpus}")
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "import torch, transformers.models.gpt2.modeling_gpt2"], check=False)
    log(f"page cache filled: {time.time() - t0:.1f} s")
    out = {"gpus": gpus, "mib": args.mib, "reps": args.reps}
    os.environ.update(env)
    with open(os.path.join(ROOT, "examples", "gpuport", "tests", "local_tests", "gpuport", "port.toml")) as f:
        src = f.read()
    if args.learned:
        learned(args, work, env, src)
        log("done")
        return
    fleets, ports = {}, {}
    try:
        for mode in MODES:
            body_log = os.path.join(work, f"body-{mode}.jsonl")
            fleets[mode] = Fleet(args.fvd, work, mode, env, worker_args=["--mps"] if mode == "mps" else [])
            out[mode] = {}
            for repeats in REPEATS:
                family = f"{mode}{repeats}"
                spec = spec_for(src, family, mode, repeats, body_log, args.mib, args.copies)
                repo = port_copy(work, f"repo-{family}", family, spec)
                ports[(mode, repeats)] = (family, repo, body_log)
                first = submit(fleets[mode], args.fvd, family, repo, [], args.timeout)
                out[mode][repeats] = {"first": first, "reruns": []}
        for rep in range(args.reps):
            for repeats in REPEATS:
                k = rep % len(MODES)
                for mode in MODES[k:] + MODES[:k]:
                    family, repo, _ = ports[(mode, repeats)]
                    s = submit(fleets[mode], args.fvd, family, repo, ["--rerun"], args.timeout)
                    out[mode][repeats]["reruns"].append(s)
                    log(f"rep {rep} {mode} REPEATS={repeats}: {s['wall_s']:.2f} s, process peaks "
                        f"{s['process_peaks_mib'][:4]} MiB, GPU {s['gpu_peak_mib']} MiB")
        for mode in MODES:
            jobs = bodies(fleets[mode].jobs(), os.path.join(work, f"body-{mode}.jsonl"))
            for repeats in REPEATS:
                r = out[mode][repeats]
                per_submit([r["first"]] + r["reruns"], jobs)
        text = summary(out, args.reps)
        print(text, flush=True)
        with open(os.path.join(args.out, "summary.txt"), "w") as f:
            f.write("\n".join(gpus) + "\n" + text + "\n")
    finally:
        for f in fleets.values():
            f.stop()
        with open(os.path.join(args.out, "gpu_share.json"), "w") as f:
            json.dump(out, f, indent=1)
        save_logs(work, args.out, 100000)
    log("done")


if __name__ == "__main__":
    main()
