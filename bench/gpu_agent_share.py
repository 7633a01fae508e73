#!/usr/bin/env python3
"""Issue #44 on a GPU: an agent's loop on one GPU with other components'
reruns beside it. `examples/gpuport`'s `mlp` is made red by a planted bug
(exact GELU where GPT-2 uses the tanh one); a scripted agent runs as a
fleet job on the worker (attempt 1 a wrong guess, attempt 2 the fix), its
verdict runs on the GPU. Each rep runs it twice, alternating the order:

- alone: nothing else on the GPU;
- beside: a second port (`attention` and `encoder`, GPUPORT_REPEATS=300,
  the GPU busy) is rerun in a loop while the agent works, every run asking
  for `--mib` so the three share the card.

  python3 bench/gpu_agent_share.py --fvd FVD [--out DIR] [--reps 2] [--mib 4096]

Per attempt: from its end (the orchestrator records the agent's commit,
`agent_attempts.finished_ms`) to its verdict (the verdict run's
`jobs.finished_ms`), split into queued -> started -> finished; and the
port's red -> green wall. One fleet (an orchestrator and one `--gpus all`
worker) serves both ports; each loop is a fresh family, so its first (red)
run starts the warm runner and the attempts' verdict runs are warm.

Results: DIR/gpu_agent_share.json, a summary on stdout and DIR/summary.txt.
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
from gpu_warm import PRELOAD, ROOT, Fleet, bench_env, log, save_logs, with_set_env  # noqa: E402

PORT_FILE = "fastvideo/models/encoders/gpuport.py"
RIGHT = 'F.gelu(x, approximate="tanh")'
PLANTED = 'F.gelu(x, approximate="none")'
GUESS = 'F.gelu(x.double(), approximate="none").float()'

AGENT = '''#!/usr/bin/env python3
"""A scripted agent: attempt 1 guesses wrong (float64), attempt 2 fixes the GELU."""
import argparse, pathlib
ap = argparse.ArgumentParser()
ap.add_argument("--attempt", type=int); ap.add_argument("--handoff"); ap.add_argument("--worktree")
a = ap.parse_args()
p = pathlib.Path(a.worktree) / "%(file)s"
text = p.read_text()
if a.attempt == 1:
    text = text.replace(%(planted)r, %(guess)r)
else:
    text = text.replace(%(guess)r, %(right)r).replace(%(planted)r, %(right)r)
p.write_text(text)
pathlib.Path(a.handoff).write_text("""component: mlp
mode: parity-debug
files_changed: %(file)s
official_files_used: none
prototype_key_dumps: none
port_state_file: tests/local_tests/gpuport/PORT_STATUS.md
concerns_or_unknowns: none
parity_test: tests/local_tests/encoders/test_gpuport_mlp_parity.py
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
''' % {"file": PORT_FILE, "planted": PLANTED, "guess": GUESS, "right": RIGHT}


def git(repo, *args):
    subprocess.run(["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", *args],
                   cwd=repo, check=True, stdout=subprocess.DEVNULL)


def spec_for(src, family, names, repeats, mib, agent):
    """The gpuport spec as `family` with components `names`, each asking
    for `mib` of a GPU, GPUPORT_REPEATS, the warm runner, and the agent."""
    head, _, rest = src.partition("[[component]]")
    head = head.replace('model_family = "gpuport"', f'model_family = "{family}"').replace(
        "tests/local_tests/gpuport/PORT_STATUS.md", f"tests/local_tests/{family}/PORT_STATUS.md")
    head = with_set_env(head, {"GPUPORT_REPEATS": repeats})
    blocks = ("[[component]]" + rest).split("[[component]]")[1:]
    out = head
    for b in blocks:
        if not any(f'name = "{n}"\n' in b for n in names):
            continue
        b = b.rstrip("\n") + f"\ngpu_memory_mib = {mib}\n"
        if agent:
            b += "agent = true\n"
        out += "[[component]]" + b + "\n"
    out += '[runner]\nmode = "warm"\npreload = [%s]\n' % ", ".join(f'"{m}"' for m in PRELOAD)
    if agent:
        out += ('\n[agent]\ncommand = ["python3", "-B", "tools/gelu_agent.py", "--attempt", "{attempt}",'
                ' "--handoff", "{handoff_file}", "--worktree", "{worktree}"]\ntimeout_s = 120\nmax_attempts = 3\n')
    return out


def make_repo(work, src, family, names, repeats, mib, agent):
    repo = os.path.join(work, f"repo-{family}")
    shutil.copytree(os.path.join(ROOT, "examples", "gpuport"), repo)
    os.makedirs(os.path.join(repo, "tests", "local_tests", family), exist_ok=True)
    with open(os.path.join(repo, "tests", "local_tests", family, "port.toml"), "w") as f:
        f.write(spec_for(src, family, names, repeats, mib, agent))
    if agent:
        path = os.path.join(repo, PORT_FILE)
        with open(path) as f:
            text = f.read()
        assert RIGHT in text, f"{PORT_FILE} changed: no {RIGHT}"
        with open(path, "w") as f:
            f.write(text.replace(RIGHT, PLANTED))
        os.makedirs(os.path.join(repo, "tools"), exist_ok=True)
        with open(os.path.join(repo, "tools", "gelu_agent.py"), "w") as f:
            f.write(AGENT)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    return repo


class Busy:
    """`submit --rerun` of the busy port in a loop until stopped."""

    def __init__(self, fleet, fvd, family, repo, timeout):
        self.stop = threading.Event()
        self.walls = []
        self.t = threading.Thread(target=self.run, args=(fleet, fvd, family, repo, timeout), daemon=True)
        self.t.start()

    def run(self, fleet, fvd, family, repo, timeout):
        while not self.stop.is_set():
            r = fleet.submit(fvd, family, repo, ["--rerun"], timeout=timeout)
            self.walls.append(round(r["wall_s"], 2))

    def done(self):
        self.stop.set()
        self.t.join(timeout=300)
        return self.walls


def attempts(db_path, family):
    """Each attempt of `family`'s mlp: its end, its verdict run's queue,
    start and finish (ms), and what they add up to."""
    db = sqlite3.connect(db_path)
    rows = db.execute(
        "SELECT a.attempt, a.finished_ms, a.duration_ms, j.queued_ms, j.started_ms, j.finished_ms, j.verdict "
        "FROM agent_attempts a LEFT JOIN jobs j ON j.job_id = a.job_after "
        "WHERE a.family = ? AND a.component = 'mlp' ORDER BY a.attempt", (family,)).fetchall()
    runs = db.execute("SELECT run_no, verdict, gpus, queued_ms, finished_ms FROM jobs WHERE family = ? "
                      "ORDER BY run_no", (family,)).fetchall()
    db.close()
    out = []
    for n, end, agent_ms, queued, started, finished, verdict in rows:
        rec = {"attempt": n, "agent_s": (agent_ms or 0) / 1000, "verdict": verdict}
        if end and finished:
            rec.update(end_to_verdict_s=(finished - end) / 1000, end_to_queued_s=(queued - end) / 1000,
                       queued_to_started_s=((started or queued) - queued) / 1000,
                       run_s=(finished - (started or queued)) / 1000)
        out.append(rec)
    wall = (runs[-1][4] - runs[0][3]) / 1000 if runs and runs[-1][4] else None
    return out, [{"run": r[0], "verdict": r[1], "gpus": r[2]} for r in runs], wall


def one_loop(fleet, fvd, work, src, label, mib, busy_port, timeout):
    family = label.replace("-", "")
    repo = make_repo(work, src, family, ["mlp"], "1", mib, agent=True)
    busy = Busy(fleet, fvd, *busy_port, timeout) if busy_port else None
    if busy:
        time.sleep(2)  # the busy runs are on the GPU before the loop starts
    try:
        r = fleet.submit(fvd, family, repo, [], timeout=timeout)
    finally:
        walls = busy.done() if busy else []
    tries, runs, wall = attempts(fleet.db, family)
    rec = {"label": label, "exit": r["exit"], "submit_wall_s": round(r["wall_s"], 2),
           "red_to_green_s": wall, "attempts": tries, "runs": runs, "busy_rerun_walls_s": walls}
    log(f"{label}: exit {r['exit']}, attempts {[(t['attempt'], t['verdict'], t.get('end_to_verdict_s')) for t in tries]}, "
        f"busy reruns {walls}")
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fvd", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(ROOT, "bench", "out", "gpu_agent_share")))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--mib", type=int, default=4096)
    ap.add_argument("--timeout", type=int, default=200)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gpu_agent_share.")
    env = bench_env(work)
    gpus = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip().splitlines()
    log(f"{len(gpus)} GPUs: {gpus}")
    os.environ.update(env)
    with open(os.path.join(ROOT, "examples", "gpuport", "tests", "local_tests", "gpuport", "port.toml")) as f:
        src = f.read()
    out = {"gpus": gpus, "mib": args.mib, "loops": []}
    # the scripted agent is a raw command: this bench's own specs are trusted
    fleet = Fleet(args.fvd, work, "fleet", env, ["--allow-agent-commands"])
    try:
        busy_repo = make_repo(work, src, "busy", ["attention", "encoder"], "300", args.mib, agent=False)
        first = fleet.submit(args.fvd, "busy", busy_repo, [], timeout=args.timeout)
        out["busy_first"] = first
        for rep in range(args.reps):
            order = ("alone", "beside") if rep % 2 == 0 else ("beside", "alone")
            for mode in order:
                port = ("busy", busy_repo) if mode == "beside" else None
                rec = one_loop(fleet, args.fvd, work, src, f"{mode}-{rep}", args.mib, port, args.timeout)
                rec["mode"] = mode
                out["loops"].append(rec)
        lines = []
        for mode in ("alone", "beside"):
            loops = [x for x in out["loops"] if x["mode"] == mode]
            e2v = [t["end_to_verdict_s"] for x in loops for t in x["attempts"] if "end_to_verdict_s" in t]
            runs = [t["run_s"] for x in loops for t in x["attempts"] if "run_s" in t]
            r2g = [x["red_to_green_s"] for x in loops if x["red_to_green_s"]]
            med = lambda xs: round(statistics.median(xs), 2) if xs else None  # noqa: E731
            out[f"summary_{mode}"] = {"end_to_verdict_s": e2v, "max_end_to_verdict_s": max(e2v, default=None),
                                      "run_s": runs, "red_to_green_s": r2g}
            lines.append(f"{mode}: attempt end -> verdict {[round(x, 2) for x in e2v]} s (max "
                         f"{max(e2v, default=None)}), verdict run {[round(x, 2) for x in runs]} s, red -> green "
                         f"{[round(x, 1) for x in r2g]} s (median {med(r2g)}), exits {[x['exit'] for x in loops]}")
        text = "\n".join(lines)
        print(text, flush=True)
        with open(os.path.join(args.out, "summary.txt"), "w") as f:
            f.write("\n".join(gpus) + "\n" + text + "\n")
    finally:
        fleet.stop()
        with open(os.path.join(args.out, "gpu_agent_share.json"), "w") as f:
            json.dump(out, f, indent=1)
        save_logs(work, args.out, 100000)
    log("done")


if __name__ == "__main__":
    main()
