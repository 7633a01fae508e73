#!/usr/bin/env bash
# fvd's hypothesis variants on real GPUs (issue #19, item 4): the
# gpuport_variants example, a red single-GPU DiT whose timestep sinusoid is
# computed in bfloat16, drilled down by the trace actor to blocks.0's time
# embedding; then its three variants (time_fp32, tf32_off, deterministic)
# run traced, each on a GPU of its own. The same port runs twice: with
# every GPU (the variants side by side) and with GPU 0 alone (one after
# another); the script checks the expected table both times and prints the
# variants' wall time in each mode.
#
#   bash bench/gpu_variants.sh PATH/TO/fvd             (from the repository
#                                                       root; torch, CUDA and
#                                                       2 or more GPUs)
#   MODE=parallel bash bench/gpu_variants.sh PATH/TO/fvd     one mode only
#   MODE=sequential bash bench/gpu_variants.sh PATH/TO/fvd
#
# Results go to $OUT when set (the device tool's folder), else
# bench/out/gpu_variants: per mode submit.txt, status.json, status.txt,
# trace_show.txt, check.txt, PORT_STATUS.md; summary.txt; gpus.txt.
# Exits non-zero when a table is not the expected one.
set -euo pipefail

FVD=$(realpath "${1:?usage: bench/gpu_variants.sh PATH/TO/fvd}")
MODE=${MODE:-both}
ROOT=$(pwd)
REPO=$ROOT/examples/gpuport
FAMILY=gpuport_variants
RESULTS=${OUT:-$ROOT/bench/out/gpu_variants}
mkdir -p "$RESULTS"
[[ -f $REPO/tests/local_tests/$FAMILY/port.toml ]] || { echo "run from the repository root" >&2; exit 2; }
case $MODE in both|parallel|sequential) ;; *) echo "MODE must be both, parallel or sequential" >&2; exit 2 ;; esac

# NVLink multicast stays off on shared hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# The test imports fvd_trace from this checkout.
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export FVD_LOG=${FVD_LOG:-info}

nvidia-smi -L > "$RESULTS/gpus.txt"
NGPUS=$(grep -c '^GPU ' "$RESULTS/gpus.txt" || true)
echo "$NGPUS GPU(s)"
if [[ $MODE != sequential && $NGPUS -lt 2 ]]; then
  echo "the parallel mode needs 2 or more GPUs (found $NGPUS)" >&2
  exit 2
fi

# run_mode NAME GPUS EXPECTED_CONCURRENCY: one embedded port from a clean
# state, its outputs under $RESULTS/NAME, and the table checked.
run_mode() {
  local name=$1 gpus=$2 concurrency=$3 dir=$RESULTS/$1
  mkdir -p "$dir"
  rm -rf "$REPO/.fvd" "$REPO/tests/local_tests/$FAMILY/PORT_STATUS.md"
  local start end code
  start=$(date +%s.%N)
  set +e
  "$FVD" submit --family "$FAMILY" --repo "$REPO" --gpus "$gpus" --wait > "$dir/submit.txt" 2> "$dir/submit.log"
  code=$?
  set -e
  end=$(date +%s.%N)
  "$FVD" status "$FAMILY" --json --repo "$REPO" > "$dir/status.json"
  "$FVD" status "$FAMILY" --repo "$REPO" > "$dir/status.txt"
  "$FVD" trace show "$FAMILY" dit --repo "$REPO" > "$dir/trace_show.txt" || true
  cp "$REPO/tests/local_tests/$FAMILY/PORT_STATUS.md" "$dir/" || true
  for run in 1 2 3; do
    "$FVD" logs "$FAMILY" 'dit#variant' --run "$run" --repo "$REPO" > "$dir/variant_run_$run.txt" 2>&1 || true
  done
  python3 - "$dir/status.json" "$name" "$code" "$start" "$end" "$concurrency" > "$dir/check.txt" <<'EOF'
import json, sys

path, mode, code, start, end, want = sys.argv[1:]
code, want = int(code), int(want)
s = json.load(open(path))
problems = []

def check(ok, what):
    if not ok:
        problems.append(what)

check(code == 1, f"submit exit {code}, expected 1 (blocked)")
c = s["components"][0]
check(c["status"] == "blocked" and c["runs"] == 1, f"dit is {c['status']} after {c['runs']} runs, expected blocked after 1")
reason = c["reason"]
check(reason.startswith("debug_red: passes with GPUPORT_TIME_DTYPE=float32 (variant time_fp32); first divergence: blocks.0.time_"),
      f"reason: {reason}")
rows = {r["name"]: r for r in c["variants"]}
check(list(rows) == ["baseline", "time_fp32", "tf32_off", "deterministic"], f"table rows {list(rows)}")
base = rows.get("baseline", {})
check(base.get("verdict") == "debug_red" and base.get("first_divergence", "").startswith("blocks.0.time_"),
      f"baseline {base}")
fp32 = rows.get("time_fp32", {})
check(fp32.get("verdict") == "non_skip_pass" and fp32.get("finding") == "passes", f"time_fp32 {fp32}")
for name in ("tf32_off", "deterministic"):
    r = rows.get(name, {})
    check(r.get("verdict") == "debug_red" and r.get("finding") == "same"
          and r.get("first_divergence") == base.get("first_divergence"), f"{name} {r}")
variants = [r for n, r in rows.items() if n != "baseline"]
spans = [(r["spawned_ms"], r["finished_ms"]) for r in variants if r.get("spawned_ms") and r.get("finished_ms")]
check(len(spans) == 3, f"variant timestamps {spans}")
# Most variant runs alive at once.
events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
alive = peak = 0
for _, d in events:
    alive += d
    peak = max(peak, alive)
if mode == "parallel":
    check(peak >= want, f"at most {peak} variant runs at once, expected {want}")
else:
    check(peak == 1, f"{peak} variant runs at once, expected one after another")
variants_s = (max(b for _, b in spans) - min(a for a, _ in spans)) / 1000 if spans else float("nan")
print(json.dumps({
    "mode": mode,
    "submit_s": round(float(end) - float(start), 1),
    "variants_s": round(variants_s, 1),
    "variant_runs_at_once": peak,
    "first_divergence": base.get("first_divergence"),
    "problems": problems,
}))
for r in c["variants"]:
    print(f"  {r['name']:<14} {' '.join(r['env']):<34} {r['verdict']:<14} {r['first_divergence'] or '-':<24} {r['finding']}")
sys.exit(1 if problems else 0)
EOF
  local ok=$?
  cat "$dir/check.txt"
  return $ok
}

status=0
if [[ $MODE != sequential ]]; then
  want=$(( NGPUS < 3 ? NGPUS : 3 ))
  run_mode parallel all "$want" || status=1
fi
if [[ $MODE != parallel ]]; then
  run_mode sequential 0 1 || status=1
fi

python3 - "$RESULTS" > "$RESULTS/summary.txt" <<'EOF'
import json, os, sys

root = sys.argv[1]
got = {}
for mode in ("parallel", "sequential"):
    p = os.path.join(root, mode, "check.txt")
    if os.path.exists(p):
        got[mode] = json.loads(open(p).readline())
for mode, r in got.items():
    print(f"{mode:<10} variants {r['variants_s']} s ({r['variant_runs_at_once']} at once), whole port {r['submit_s']} s, problems: {r['problems'] or 'none'}")
if len(got) == 2 and got["parallel"]["variants_s"] > 0:
    p, s = got["parallel"], got["sequential"]
    print(f"variants side by side: {p['variants_s']} s against {s['variants_s']} s one after another ({s['variants_s'] / p['variants_s']:.2f}x); "
          f"whole port {p['submit_s']} s against {s['submit_s']} s")
EOF
cat "$RESULTS/summary.txt"
exit $status
