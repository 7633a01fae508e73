#!/usr/bin/env python3
"""Issue #13 on GPUs, in one run: the warm runner against cold runs, and
gang packing against FIFO placement, each beside its baseline.

  python3 bench/gpu_warm.py --fvd FVD --fvd-fifo FVD_FIFO [--out DIR]

FVD_FIFO is the same build with the scheduler's widest-gang preference off
(every width taken as 0: the first job that fits, the order before #13).

1. Warm vs cold: `examples/gpuport` (embed, attention, mlp, encoder on one
   GPU each, tp_mlp on two through torchrun, warm too since #33) on one
   worker owning 4 GPUs, submitted once and then rerun --iterations times
   (what an agent's loop does after each edit), cold and then with
   `[runner] mode = "warm"`, `preload = ["torch", "transformers",
   "transformers.models.gpt2.modeling_gpt2"]`. Per run: start-up = job
   start (`jobs.spawned_ms`) -> test body (the conftest's GPUPORT_BODY_LOG
   hook, after the fixtures: CUDA is up); per submit: wall time.
2. Packing: 8 one-GPU components and tp_mlp (2 GPUs) of one port on that
   worker, GPUPORT_REPEATS checks each, with FVD_FIFO and with FVD; the
   ideal is max(sum of GPU-seconds / 4, the longest job) from the same
   run's job durations.

Results: DIR/gpu_warm.json and progress lines on stdout.
"""

import argparse
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRELOAD = ["torch", "transformers", "transformers.models.gpt2.modeling_gpt2"]


def log(msg):
    print(f"[gpu_warm {time.strftime('%H:%M:%S', time.gmtime())}] {msg}", flush=True)


def save_logs(work, out, keep):
    """The last `keep` characters of each fleet log (`*.log`) in `work`,
    one after another under its name, into OUT/logs.txt: what a device
    run brings back of its orchestrators and workers."""
    logs = []
    for name in sorted(os.listdir(work)):
        if name.endswith(".log"):
            with open(os.path.join(work, name)) as f:
                logs.append(f"===== {name}\n{f.read()[-keep:]}")
    with open(os.path.join(out, "logs.txt"), "w") as f:
        f.write("\n".join(logs))


class Fleet:
    def __init__(self, fvd, work, name, env, serve_args=(), worker_args=()):
        self.work, self.name = work, name
        self.procs = []
        db = os.path.join(work, f"{name}.db")
        self.db = db
        olog = open(os.path.join(work, f"{name}-orchestrator.log"), "w")
        o = subprocess.Popen(
            [fvd, "orchestrator", "serve", "--listen", "127.0.0.1:0", "--db", f"sqlite://{db}", *serve_args],
            stdout=subprocess.PIPE, stderr=olog, text=True,
        )
        self.procs.append(o)
        line = o.stdout.readline()
        self.url = line.strip().split()[-1]
        assert self.url.startswith("http://"), line
        wlog = open(os.path.join(work, f"{name}-worker.log"), "w")
        w = subprocess.Popen(
            [fvd, "worker", "--orchestrator", self.url, "--workspace", os.path.join(work, f"ws-{name}"),
             "--gpus", "all", "--cpu-slots", "1", "--worker-id", name, *worker_args],
            stdout=subprocess.DEVNULL, stderr=wlog, env=env,
        )
        self.procs.append(w)
        deadline = time.time() + 30
        while time.time() < deadline:
            with open(os.path.join(work, f"{name}-orchestrator.log")) as f:
                if "worker registered" in f.read():
                    break
            time.sleep(0.1)
        else:
            raise SystemExit(f"{name}: the worker did not register")

    def submit(self, fvd, family, repo, extra=(), timeout=300):
        t0 = time.time()
        r = subprocess.run(
            [fvd, "submit", "--family", family, "--repo", repo, "--orchestrator", self.url, "--wait", *extra],
            capture_output=True, text=True, timeout=timeout,
        )
        wall = time.time() - t0
        log(f"{self.name}: submit {' '.join(extra)} exit {r.returncode} in {wall:.1f} s")
        if r.returncode != 0:
            print(r.stdout[-3000:], r.stderr[-3000:], flush=True)
        return {"exit": r.returncode, "wall_s": wall, "t0": t0}

    def jobs(self):
        db = sqlite3.connect(self.db)
        rows = db.execute(
            "SELECT job_id, component, run_no, gpus_needed, spawned_ms, duration_ms, verdict, finished_ms FROM jobs "
            "WHERE spawned_ms IS NOT NULL ORDER BY spawned_ms").fetchall()
        db.close()
        keys = ["job_id", "component", "run", "gpus", "spawned_ms", "duration_ms", "verdict", "finished_ms"]
        return [dict(zip(keys, r)) for r in rows]

    def stop(self):
        for p in reversed(self.procs):
            p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


def bench_env(work):
    """The benches' environment: NCCL without NVLink multicast, unbuffered
    Python, info logs, and a `torchrun` on PATH. Where torch's console
    script is missing, one is written as pip writes it, a Python script, so
    the warm runner finds its interpreter on the #! line (a shell wrapper
    would keep every torchrun run cold)."""
    env = dict(os.environ)
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
               PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", FVD_LOG="info")
    if shutil.which("torchrun") is None:
        bindir = os.path.join(work, "bin")
        os.makedirs(bindir)
        with open(os.path.join(bindir, "torchrun"), "w") as f:
            f.write("#!%s\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n" % sys.executable)
        os.chmod(os.path.join(bindir, "torchrun"), 0o755)
        env["PATH"] = bindir + os.pathsep + env["PATH"]
    return env


def with_set_env(spec_text, values):
    """The spec with `values` in its [defaults] set_env: a test sees only the
    allow-listed environment and the spec's own variables (docs/fleet.md
    "Containment"), so the bench's knobs travel in the spec."""
    pairs = ", ".join(f'{k} = "{v}"' for k, v in values.items())
    out = spec_text.replace("timeout_s = 300\n", f"timeout_s = 300\nset_env = {{ {pairs} }}\n", 1)
    assert out != spec_text, "the spec's [defaults] changed: set_env not added"
    return out


def sanitize(job_id):
    return re.sub(r"[^A-Za-z0-9]", "_", job_id)[:64]


def startups(jobs, body_log):
    bodies = []
    if os.path.exists(body_log):
        with open(body_log) as f:
            bodies = [json.loads(line) for line in f if line.strip()]
    out = []
    for j in jobs:
        prefix = sanitize(j["job_id"]) + "."
        ts = [b["t"] for b in bodies if "phase" not in b and b["job"].startswith(prefix) and b["rank"] == 0]
        if ts:
            out.append({**j, "startup_s": min(ts) - j["spawned_ms"] / 1000.0})
    return out


def warm_vs_cold(args, work, env):
    results = {}
    for mode in ("cold", "warm"):
        repo = os.path.join(work, f"gpuport-{mode}")
        shutil.copytree(os.path.join(ROOT, "examples", "gpuport"), repo)
        spec = os.path.join(repo, "tests", "local_tests", "gpuport", "port.toml")
        body_log = os.path.join(work, f"body-{mode}.jsonl")
        with open(spec) as f:
            text = with_set_env(f.read(), {"GPUPORT_BODY_LOG": body_log})
        with open(spec, "w") as f:
            f.write(text)
        if mode == "warm":
            with open(spec, "a") as f:
                f.write('\n[runner]\nmode = "warm"\npreload = [%s]\n' % ", ".join(f'"{m}"' for m in PRELOAD))
        fleet = Fleet(args.fvd, work, f"gpuport-{mode}", {**env, "GPUPORT_BODY_LOG": body_log})
        try:
            submits = [fleet.submit(args.fvd, "gpuport", repo)]
            for _ in range(args.iterations):
                submits.append(fleet.submit(args.fvd, "gpuport", repo, ["--rerun"]))
            jobs = startups(fleet.jobs(), body_log)
        finally:
            fleet.stop()
        one_gpu = [j for j in jobs if j["gpus"] == 1]
        later = [j["startup_s"] for j in one_gpu if j["run"] > 1]
        results[mode] = {
            "submits": submits,
            "jobs": jobs,
            "startup_1gpu_first_s": [j["startup_s"] for j in one_gpu if j["run"] == 1],
            "startup_1gpu_later_median_s": statistics.median(later) if later else None,
            "run_1gpu_later_median_s": statistics.median(
                [j["duration_ms"] / 1000.0 for j in one_gpu if j["run"] > 1]) if later else None,
        }
        log(f"{mode}: 1-GPU start-up, later runs (median) {results[mode]['startup_1gpu_later_median_s']}")
    return results


def pack_spec(src_text):
    head, _, _ = src_text.partition("[[component]]")
    head = head.replace('model_family = "gpuport"', 'model_family = "gpupack"').replace(
        "tests/local_tests/gpuport/PORT_STATUS.md", "tests/local_tests/gpupack/PORT_STATUS.md")
    tests = {
        "embed": "tests/local_tests/encoders/test_gpuport_embed_parity.py",
        "attention": "tests/local_tests/encoders/test_gpuport_attention_parity.py",
        "mlp": "tests/local_tests/encoders/test_gpuport_mlp_parity.py",
        "encoder": "tests/local_tests/encoders/test_gpuport_encoder_parity.py",
    }
    out = head
    for i in range(2):
        for name, test in tests.items():
            out += (f'[[component]]\nname = "{name}_{i}"\ntype = "encoder"\nparity_test = "{test}"\n'
                    'coverage_scope = "implementation_subcomponent"\n\n')
    out += ('[[component]]\nname = "tp_mlp"\ntype = "encoder"\n'
            'parity_test = "tests/local_tests/distributed/test_gpuport_tp_mlp_parity.py"\n'
            'coverage_scope = "implementation_subcomponent"\ngpus = 2\n'
            'command = ["torchrun", "--standalone", "--nproc_per_node={gpus}", "-m", "pytest", "{test}", "-q", '
            '"-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--junitxml={junitxml}"]\n')
    return out


def packing(args, work, env, ngpus):
    results = {}
    for label, fvd in (("fifo", args.fvd_fifo), ("pack", args.fvd)):
        repo = os.path.join(work, f"gpupack-{label}")
        shutil.copytree(os.path.join(ROOT, "examples", "gpuport"), repo)
        with open(os.path.join(repo, "tests", "local_tests", "gpuport", "port.toml")) as f:
            text = with_set_env(pack_spec(f.read()), {"GPUPORT_REPEATS": args.repeats})
        os.makedirs(os.path.join(repo, "tests", "local_tests", "gpupack"), exist_ok=True)
        with open(os.path.join(repo, "tests", "local_tests", "gpupack", "port.toml"), "w") as f:
            f.write(text)
        fleet = Fleet(fvd, work, f"gpupack-{label}", {**env, "GPUPORT_REPEATS": str(args.repeats)})
        try:
            sub = fleet.submit(fvd, "gpupack", repo, timeout=args.pack_timeout)
            jobs = fleet.jobs()
        finally:
            fleet.stop()
        gpu_s = sum(j["duration_ms"] / 1000.0 * j["gpus"] for j in jobs if j["duration_ms"])
        longest = max((j["duration_ms"] / 1000.0 for j in jobs if j["duration_ms"]), default=0)
        ideal = max(gpu_s / ngpus, longest)
        t0 = min(j["spawned_ms"] for j in jobs) / 1000.0 if jobs else 0
        tp = [j for j in jobs if j["gpus"] == 2]
        span = (max((j["spawned_ms"] + (j["duration_ms"] or 0)) for j in jobs) / 1000.0 - t0) if jobs else 0
        results[label] = {
            "submit": sub,
            "jobs": jobs,
            "makespan_s": span,
            "ideal_s": ideal,
            "over_ideal": span / ideal if ideal else None,
            "tp_mlp_start_s": (tp[0]["spawned_ms"] / 1000.0 - t0) if tp else None,
        }
        log(f"packing {label}: makespan {span:.1f} s, ideal {ideal:.1f} s, tp_mlp starts at "
            f"{results[label]['tp_mlp_start_s']}")
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fvd", required=True)
    ap.add_argument("--fvd-fifo", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(ROOT, "bench", "out", "gpu_warm")))
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--pack-timeout", type=int, default=200)
    ap.add_argument("--skip", default="", help="warm or pack: leave that part out")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gpu_warm.")
    env = bench_env(work)
    gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip().splitlines()
    log(f"{len(gpus)} GPUs: {gpus[:1]}")
    # Page cache: the first import of torch reads it from disk; both modes
    # must start from the same cache.
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "import torch, transformers.models.gpt2.modeling_gpt2"], check=True)
    log(f"import torch + transformers' gpt2, page cache filled: {time.time() - t0:.1f} s")
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "import torch, transformers.models.gpt2.modeling_gpt2; torch.zeros(1, device='cuda')"], check=True)
    import_cuda = time.time() - t0
    log(f"python + imports + CUDA init: {import_cuda:.1f} s")
    out = {"gpus": gpus, "python_imports_cuda_s": import_cuda}
    os.environ.update(env)
    try:
        if "warm" not in args.skip:
            out["warm_vs_cold"] = warm_vs_cold(args, work, env)
        with open(os.path.join(args.out, "gpu_warm.json"), "w") as f:
            json.dump(out, f, indent=1)
        if "pack" not in args.skip:
            out["packing"] = packing(args, work, env, len(gpus))
    finally:
        with open(os.path.join(args.out, "gpu_warm.json"), "w") as f:
            json.dump(out, f, indent=1)
        save_logs(work, args.out, 200000)
    log("done")


if __name__ == "__main__":
    main()
