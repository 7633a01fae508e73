#!/usr/bin/env python3
"""Issue #33 item 3: where a warm (forked) run's time outside its test body
goes inside Python, function by function.

  python3 bench/gpu_fork_profile.py [--zygote old|new] [--repeats N] [--out DIR]

Does what fvd's zygote does, without fvd: imports the preload list and
pytest (`--zygote new`: through worker/src/fvd_zygote.py's own `preload`,
so with whatever it does beyond the imports; `old`: the imports alone, as
the zygote did before issue #33's item 3), then forks --children children
one after another. Each runs `pytest.main` on `embed`'s parity test of a
copy of `examples/gpuport` under cProfile, from the fork to pytest's
return, and reports when the body started and ended (the conftest's
GPUPORT_BODY_LOG), when pytest returned, and when the parent reaped it
(the child ends as the zygote of that version ends it: `new` through
fvd_zygote.finish, `old` through sys.exit). Per child, in seconds:
fork -> body, body, body -> pytest returned, pytest returned -> reaped;
and the top functions by cumulative and own time (profiler overhead
included: compare the two variants, not absolute times).

Results: DIR/gpu_fork_profile-VARIANT.txt and lines on stdout.
"""

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
PRELOAD = ["torch", "transformers", "transformers.models.gpt2.modeling_gpt2"]
TEST = "tests/local_tests/encoders/test_gpuport_embed_parity.py"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zygote", choices=["old", "new"], default="new")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--children", type=int, default=3)
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--preload", default=",".join(PRELOAD))
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(ROOT, "bench", "out", "gpu_fork_profile")))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gpu_fork_profile.")
    repo = os.path.join(work, "repo")
    shutil.copytree(os.path.join(ROOT, "examples", "gpuport"), repo)
    body_log = os.path.join(work, "body.jsonl")
    t0 = time.time()
    sys.path.insert(0, os.path.join(ROOT, "worker", "src"))
    import fvd_zygote

    if args.zygote == "new":
        fvd_zygote.preload(args.preload.split(","))
    else:
        import importlib

        for name in args.preload.split(","):
            importlib.import_module(name)
        import pytest  # noqa: F401
    print(f"[profile {args.zygote}] preload {time.time() - t0:.1f} s", flush=True)
    report = io.StringIO()
    for child in range(args.children):
        stats = os.path.join(work, f"child{child}.prof")
        marks = os.path.join(work, f"child{child}.json")
        t_fork = time.time()
        pid = os.fork()
        if pid == 0:
            run_child(args, repo, body_log, stats, marks, t_fork)
        _, status = os.waitpid(pid, 0)
        t_reaped = time.time()
        with open(marks) as f:
            m = json.load(f)
        with open(body_log) as f:
            body = [json.loads(line) for line in f if line.strip()]
        body = [b for b in body if b.get("job") == f"child{child}" and "t_end" in b]
        if not body:
            with open(os.path.join(work, f"child{child}.out")) as f:
                sys.exit(f"child {child} ran no test body (status {status}):\n{f.read()[-3000:]}")
        body = body[-1]
        line = (f"child {child} (status {status}): fork -> body {body['t'] - t_fork:.3f}  body {body['t_end'] - body['t']:.3f}  "
                f"body -> pytest returned {m['returned'] - body['t_end']:.3f}  returned -> reaped {t_reaped - m['returned']:.3f}")
        print(f"[profile {args.zygote}] {line}", flush=True)
        report.write(line + "\n")
        if child == args.children - 1:
            for key in ("cumulative", "tottime"):
                s = io.StringIO()
                pstats.Stats(stats, stream=s).sort_stats(key).print_stats(args.top)
                report.write(f"\n===== child {child}, by {key}\n{s.getvalue()}")
    with open(os.path.join(args.out, f"gpu_fork_profile-{args.zygote}.txt"), "w") as f:
        f.write(report.getvalue())


def run_child(args, repo, body_log, stats, marks, t_fork):
    """The job, as fvd_zygote.run_child runs it (folder, sys.path, pytest's
    arguments), under the profiler."""
    code = 3
    try:
        out = os.open(os.path.join(os.path.dirname(stats), os.path.basename(stats).split(".")[0] + ".out"),
                      os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.chdir(repo)
        sys.path.insert(0, repo)
        os.environ.update(GPUPORT_REPEATS=str(args.repeats), GPUPORT_BODY_LOG=body_log,
                          FVD_JOB_COOKIE=os.path.basename(stats).split(".")[0])
        import pytest

        prof = cProfile.Profile()
        prof.enable()
        try:
            code = pytest.main([TEST, "-q", "-p", "no:cacheprovider", "--junitxml=" + os.path.join(repo, "report.xml")])
        finally:
            prof.disable()
        with open(marks, "w") as f:
            json.dump({"returned": time.time()}, f)
        prof.dump_stats(stats)
    except BaseException as e:  # noqa: BLE001
        sys.stderr.write(f"child failed: {type(e).__name__}: {e}\n")
        os._exit(3)
    if args.zygote == "new":
        import fvd_zygote

        fvd_zygote.finish(int(code))
    sys.stdout.flush()
    sys.exit(int(code))


if __name__ == "__main__":
    main()
