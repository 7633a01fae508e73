#!/usr/bin/env python3
"""Plain-Python baseline of `fvd trace compare`: the same algorithm (rank
merge with replicated detection, sharded dim from the reference's shape,
exact pooled std; aligned compare in reference order with floors for sum and
mean; exact steps; first divergence), written the way one would in a script.
It exists only to be timed against the Rust binary by trace_bench.sh.

Usage: trace_compare_py.py --reference FILE... --port FILE... [--rename R]...
"""

import argparse
import json
import math
import re
import sys

DEFAULT_TOL = {"abs_mean": 5e-3, "max": 2e-2}
REPL_TOL = 1e-6


def read(paths):
    files = []
    for i, p in enumerate(paths):
        recs = [json.loads(line) for line in open(p) if line.strip()]
        m = re.search(r"rank[_-]?(\d+)", p.split("/")[-1].lower())
        rank = recs[0].get("rank") if recs and "rank" in recs[0] else (int(m.group(1)) if m else i)
        files.append((rank, recs))
    files.sort(key=lambda f: f[0])
    return [f[1] for f in files]


def keyed(recs):
    seen = {}
    out = []
    for r in recs:
        k = (r["module"], r.get("tensor", "out"), r.get("step"))
        n = seen.get(k, 0)
        seen[k] = n + 1
        out.append(k + (n,))
    return out


STATS = ("abs_mean", "sum", "min", "max", "mean", "std")
META = {"module", "tensor", "step", "shape", "dtype", "rank", "world_size", "numel"}


def numel(r):
    if "numel" in r:
        return r["numel"]
    if "shape" in r:
        return math.prod(r["shape"])
    return None


def same(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= REPL_TOL * max(abs(a), abs(b))
    return a == b


def merge_group(group, ref_shape):
    first = group[0]
    stat_keys = [k for k in first if k not in META]
    if all(r.get("shape") == first.get("shape")
           and all(k in r and same(first[k], r[k]) for k in stat_keys)
           and len([k for k in r if k not in META]) == len(stat_keys)
           for r in group[1:]):
        return dict(first)
    k = len(group)
    out = {"module": first["module"], "tensor": first.get("tensor", "out"), "step": first.get("step")}
    shapes = [r.get("shape") for r in group]
    if all(s is not None for s in shapes):
        s0 = shapes[0]
        if all(s == s0 for s in shapes):
            if ref_shape == s0:
                return dict(first)
            if ref_shape is not None and len(ref_shape) == len(s0):
                fits = [d for d in range(len(s0)) if ref_shape[d] == k * s0[d]
                        and all(e == d or ref_shape[e] == s0[e] for e in range(len(s0)))]
                if len(fits) == 1:
                    s = list(s0)
                    s[fits[0]] *= k
                    out["shape"] = s
        else:
            diff = [d for d in range(len(s0)) if any(s[d] != s0[d] for s in shapes)]
            if len(diff) == 1:
                s = list(s0)
                s[diff[0]] = sum(x[diff[0]] for x in shapes)
                out["shape"] = s
    counts = [numel(r) for r in group]
    have_counts = all(c is not None for c in counts)
    n = sum(counts) if have_counts else None
    for key in stat_keys:
        vals = [r.get(key) for r in group]
        if any(not isinstance(v, (int, float)) for v in vals):
            continue
        if key == "sum":
            out[key] = sum(vals)
        elif key == "min":
            out[key] = min(vals)
        elif key == "max":
            out[key] = max(vals)
        elif key in ("abs_mean", "mean") and have_counts:
            out[key] = sum(v * c for v, c in zip(vals, counts)) / n
        elif key == "std" and have_counts:
            means = [r["mean"] if "mean" in r else r["sum"] / c for r, c in zip(group, counts)]
            m = sum(mu * c for mu, c in zip(means, counts)) / n
            m2 = 0.0
            for s, mu, c in zip(vals, means, counts):
                if c > 1:
                    m2 += s * s * (c - 1)
                m2 += c * (mu - m) ** 2
            out[key] = math.sqrt(m2 / (n - 1))
    if "dtype" in first:
        out["dtype"] = first["dtype"]
    if have_counts:
        out["numel"] = n
    return out


def merge(files, ref_shapes):
    if len(files) == 1:
        return files[0]
    keys = [keyed(f) for f in files]
    index = [dict(zip(k, range(len(k)))) for k in keys]
    out = []
    for r, k in zip(files[0], keys[0]):
        group = [r] + [files[i][index[i][k]] for i in range(1, len(files)) if k in index[i]]
        out.append(merge_group(group, ref_shapes.get(k) if ref_shapes else None))
    return out


def drift(stat, a, b, abs_mean, n):
    if a == b:
        return 0.0
    floor = 0.0
    if stat == "sum":
        floor = (abs_mean or 0.0) * (n or 1)
    elif stat in ("mean", "min", "max"):
        floor = abs_mean or 0.0
    return abs(a - b) / max(abs(a), abs(b), floor, sys.float_info.min)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", nargs="+", required=True)
    ap.add_argument("--port", nargs="+", required=True)
    ap.add_argument("--rename", action="append", default=[])
    a = ap.parse_args()
    rules = []
    for r in a.rename:
        pat, tpl = r.split("=>", 1)
        rules.append((re.compile(pat), re.sub(r"\$(\d+)", r"\\g<\1>", tpl)))
    cache = {}

    def rename(name):
        if name not in cache:
            cur = name
            for pat, tpl in rules:
                cur = pat.sub(tpl, cur)
            cache[name] = cur
        return cache[name]

    ref = merge(read(a.reference), None)
    ref_keys = keyed(ref)
    port_files = read(a.port)
    for f in port_files:
        for r in f:
            new = rename(r["module"])
            if new != r["module"]:
                r["port_module"] = r["module"]
                r["module"] = new
    ref_shapes = {k: r["shape"] for r, k in zip(ref, ref_keys) if "shape" in r}
    port = merge(port_files, ref_shapes)
    port_index = dict(zip(keyed(port), range(len(port))))

    rows, first = [], None
    step_exact, step_order = {}, []
    used = set()
    for i, (r, k) in enumerate(zip(ref, ref_keys)):
        j = port_index.get(k)
        if j is None:
            continue
        used.add(j)
        p = port[j]
        shape_ok = not ("shape" in r and "shape" in p) or r["shape"] == p["shape"]
        am = max(abs(r.get("abs_mean", 0.0)), abs(p.get("abs_mean", 0.0)))
        n = numel(r) or numel(p)
        drifts, exact, worst = {}, True, None
        for s in r:
            if s in META or s not in p:
                continue
            x, y = r[s], p[s]
            if isinstance(x, (int, float)) and isinstance(y, (int, float)):
                exact &= x == y
                d = drift(s, x, y, am, n)
                drifts[s] = d
                tol = DEFAULT_TOL.get(s)
                if tol is not None and d > tol and (worst is None or d / tol > worst[2]):
                    worst = (s, d, d / tol)
            else:
                exact &= x == y
        exact &= r.get("shape") == p.get("shape")
        diverged = not shape_ok or worst is not None
        pm = p.get("port_module", p["module"])
        if diverged and first is None:
            s = "shape" if not shape_ok else worst[0]
            first = {"reference_module": r["module"], "port_module": pm, "tensor": k[1], "step": k[2],
                     "stat": s, "reference": r.get(s), "port": p.get(s),
                     "drift": None if s == "shape" else worst[1]}
        rows.append({"index": i, "reference_module": r["module"], "port_module": pm, "tensor": k[1],
                     "step": k[2], "reference_shape": r.get("shape"), "port_shape": p.get("shape"),
                     "drift": drifts, "diverged": diverged, "exact": exact})
        if k[2] not in step_exact:
            step_order.append(k[2])
            step_exact[k[2]] = exact
        else:
            step_exact[k[2]] &= exact
    report = {
        "first_divergence": first,
        "rows": rows,
        "exact_steps": [s for s in step_order if step_exact[s]],
        "unmatched": {"reference": len(ref) - len(rows), "port": len(port) - len(used)},
    }
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")
    return 1 if first else 0


if __name__ == "__main__":
    sys.exit(main())
