#!/usr/bin/env python3
"""Helpers of bench/gpu_proof.sh that need the port spec or arithmetic.

Every parity command comes from the port's own port.toml, with `{test}`,
`{gpus}` and `{junitxml}` filled in as fvd's worker fills them, so the
sequential baseline runs exactly what fvd runs. Standard library only
(tomllib: Python 3.11+).

  components                      name, gpus and test of each component (TSV)
  calibrate CAL                   time each component's parity check (JSONL)
  repeats CAL TARGET_S            `export GPUPORT_REPEATS_<NAME>=N` lines
  final STATUS_JSON GPUS          exit 0 when every component needing GPUS
                                  GPUs is final in `fvd status --json`
  sequential OUT_JSON JUNIT_DIR   run every parity command one after another
  summary ...                     the figures (see `summary --help`)
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET

PORT_DIR = "examples/gpuport"
SPEC = f"{PORT_DIR}/tests/local_tests/gpuport/port.toml"
DEFAULT_COMMAND = ["python3", "-m", "pytest", "{test}", "-q", "-p", "no:cacheprovider", "--junitxml={junitxml}"]
FINAL = {"non_skip_pass", "blocked"}


def components():
    with open(SPEC, "rb") as f:
        spec = tomllib.load(f)
    d = spec.get("defaults", {})
    out = []
    for c in spec["component"]:
        out.append({
            "name": c["name"],
            "test": c["parity_test"],
            "gpus": int(c.get("gpus", d.get("gpus", 0))),
            "command": c.get("command", d.get("command", DEFAULT_COMMAND)),
        })
    return out


def argv(comp, junit, tests=None):
    """The command as fvd's worker runs it; `tests` replaces a `{test}`
    element by several test paths (calibration only)."""
    out = []
    for a in comp["command"]:
        if a == "{test}" and tests:
            out.extend(tests)
            continue
        out.append(a.replace("{test}", comp["test"]).replace("{gpus}", str(comp["gpus"])).replace("{junitxml}", junit))
    return out


def visible(gpus):
    # The first `gpus` host GPUs, as a lease of that size on GPU 0.. gets.
    return ",".join(str(i) for i in range(gpus))


def run(cmd, gpus, extra_env=None):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible(gpus), **(extra_env or {}))
    t0 = time.monotonic()
    rc = subprocess.call(cmd, cwd=PORT_DIR, env=env)
    return rc, time.monotonic() - t0


def junit_counts(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    keys = ("tests", "failures", "errors", "skipped")
    return {k: sum(int(s.get(k, 0)) for s in suites) for k in keys}


def cmd_components(_):
    for c in components():
        print(f"{c['name']}\t{c['gpus']}\t{c['test']}")


def cmd_calibrate(a):
    comps = components()
    # One pytest process for the single-GPU tests that share a command (one
    # interpreter start instead of several); every other component alone.
    single = [c for c in comps if c["gpus"] == 1]
    groups = []
    if single and all(c["command"] == single[0]["command"] for c in single):
        groups.append((single[0], [c["test"] for c in single]))
    else:
        groups += [(c, None) for c in single]
    groups += [(c, None) for c in comps if c["gpus"] != 1]
    env = {"GPUPORT_CALIBRATE_OUT": os.path.abspath(a.cal)}
    failed = 0
    for comp, tests in groups:
        cmd = argv(comp, os.path.join(os.path.dirname(os.path.abspath(a.cal)), f"cal-{comp['name']}.xml"), tests)
        print("calibrate:", " ".join(cmd), flush=True)
        rc, secs = run(cmd, comp["gpus"], env)
        print(f"calibrate: rc={rc} in {secs:.1f}s", flush=True)
        failed += rc != 0
    return 1 if failed else 0


def cmd_repeats(a):
    per = {}
    with open(a.cal) as f:
        for line in f:
            r = json.loads(line)
            per[r["component"]] = r["seconds_per_check"]
    for name in sorted(per):
        n = max(1, math.ceil(a.target_s / per[name]))
        print(f"export GPUPORT_REPEATS_{name.upper()}={n}  # {per[name] * 1000:.2f} ms per check")


def cmd_final(a):
    with open(a.status) as f:
        status = {c["name"]: c["status"] for c in json.load(f)["components"]}
    names = [c["name"] for c in components() if c["gpus"] == a.gpus]
    return 0 if all(status.get(n) in FINAL for n in names) else 1


def cmd_sequential(a):
    os.makedirs(a.junit_dir, exist_ok=True)
    rows = []
    t0 = time.monotonic()
    for c in components():
        junit = os.path.join(os.path.abspath(a.junit_dir), f"{c['name']}.xml")
        cmd = argv(c, junit)
        print(f"sequential: {c['name']} on GPUs {visible(c['gpus'])}: {' '.join(cmd)}", flush=True)
        rc, secs = run(cmd, c["gpus"])
        counts = junit_counts(junit)
        print(f"sequential: {c['name']} rc={rc} {secs:.2f}s {counts}", flush=True)
        rows.append({"name": c["name"], "gpus": c["gpus"], "rc": rc, "seconds": secs, "junit": counts})
    total = time.monotonic() - t0
    with open(a.out, "w") as f:
        json.dump({"total_seconds": total, "components": rows}, f, indent=2)
    print(f"sequential: total {total:.2f}s", flush=True)
    return 0 if all(r["rc"] == 0 for r in rows) else 1


def cmd_summary(a):
    with open(a.seq) as f:
        seq = json.load(f)
    with open(a.status) as f:
        status = json.load(f)
    gpus_of = {c["name"]: c["gpus"] for c in components()}
    fvd_total = a.fvd_end - a.fvd_start
    seq_total = seq["total_seconds"]
    seq_single = sum(r["seconds"] for r in seq["components"] if r["gpus"] == 1)
    s = {
        "gpu": a.gpu_name,
        "gpus": a.ngpus,
        "target_seconds_per_test": a.target_s,
        "fvd_exit_code": a.fvd_rc,
        "port_state": status.get("state"),
        "fvd_seconds": round(fvd_total, 2),
        "sequential_seconds": round(seq_total, 2),
        "speedup": round(seq_total / fvd_total, 3),
        "components": [
            {
                "name": c["name"],
                "gpus": gpus_of.get(c["name"]),
                "status": c["status"],
                "worker": c.get("worker_id", ""),
                "sequential_seconds": round(next(r["seconds"] for r in seq["components"] if r["name"] == c["name"]), 2),
            }
            for c in status["components"]
        ],
    }
    if a.fvd_phase1 > 0:
        p1 = a.fvd_phase1 - a.fvd_start
        s["single_gpu_phase"] = {
            "fvd_seconds": round(p1, 2),
            "sequential_seconds": round(seq_single, 2),
            "speedup": round(seq_single / p1, 3),
            "ideal_speedup": a.ngpus,
        }
    with open(a.out, "w") as f:
        json.dump(s, f, indent=2)
    print(f"GPU: {a.ngpus} x {a.gpu_name}")
    print(f"fvd (orchestrator + one worker per GPU, then one {a.ngpus}-GPU worker): {fvd_total:.2f}s, exit {a.fvd_rc}, port {status.get('state')}")
    print(f"sequential plain pytest/torchrun:  {seq_total:.2f}s")
    print(f"speedup, all components: {seq_total / fvd_total:.2f}x")
    if "single_gpu_phase" in s:
        p = s["single_gpu_phase"]
        print(f"speedup, single-GPU components: {p['speedup']:.2f}x "
              f"({p['sequential_seconds']:.2f}s sequential vs {p['fvd_seconds']:.2f}s fvd; ideal {a.ngpus}x)")
    for c in s["components"]:
        print(f"  {c['name']:10} gpus={c['gpus']} {c['status']:14} worker={c['worker']:8} sequential {c['sequential_seconds']:.2f}s")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("components").set_defaults(fn=cmd_components)
    c = sub.add_parser("calibrate")
    c.add_argument("cal")
    c.set_defaults(fn=cmd_calibrate)
    c = sub.add_parser("repeats")
    c.add_argument("cal")
    c.add_argument("target_s", type=float)
    c.set_defaults(fn=cmd_repeats)
    c = sub.add_parser("final")
    c.add_argument("status")
    c.add_argument("gpus", type=int)
    c.set_defaults(fn=cmd_final)
    c = sub.add_parser("sequential")
    c.add_argument("out")
    c.add_argument("junit_dir")
    c.set_defaults(fn=cmd_sequential)
    c = sub.add_parser("summary")
    for name in ("--seq", "--status", "--out", "--gpu-name"):
        c.add_argument(name, required=True)
    for name in ("--fvd-start", "--fvd-end", "--target-s"):
        c.add_argument(name, type=float, required=True)
    c.add_argument("--fvd-phase1", type=float, default=0.0)
    c.add_argument("--fvd-rc", type=int, required=True)
    c.add_argument("--ngpus", type=int, required=True)
    c.set_defaults(fn=cmd_summary)
    a = p.parse_args()
    sys.exit(a.fn(a) or 0)


if __name__ == "__main__":
    main()
