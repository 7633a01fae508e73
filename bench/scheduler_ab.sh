#!/usr/bin/env bash
# Two or more builds of the scheduler bench, taking turns (issue #44): the
# rate of one build spreads ±10-15% between reps on one machine, so a
# before/after comparison runs them alternately, rotating the order each
# rep, and compares means and medians.
#
#   bench/scheduler_ab.sh REPS WORKERS JOBS BIN [BIN ...]
#
# BIN: a scheduler bench binary, e.g. one commit's
#   cargo bench -p fvd-orchestrator --bench scheduler --no-run
#   strip -o bench/out/sched_<name> target/release/deps/scheduler-<hash>
# built in a clone of its own with its own target directory: worktrees
# sharing one target directory write the same binary path, and cargo's
# mtime check may then keep the other commit's binary (check with cmp).
# Each run: BIN WORKERS 8 JOBS --deadline-s 40 --probes 2000 (JOBS = 5 ×
# WORKERS × 8 as in the sweep), bounded by PER seconds (default 180).
# Output under $OUT (default bench/out/scheduler_ab): each run's text and
# summary.txt.
set -euo pipefail
if [ $# -lt 4 ]; then
  sed -n '2,18p' "$0" >&2
  exit 2
fi
reps=$1 workers=$2 jobs=$3
shift 3
out=${OUT:-bench/out/scheduler_ab}
mkdir -p "$out"
: >"$out/summary.txt"
for b in "$@"; do
  [ -x "$b" ] || { echo "scheduler_ab: $b is not an executable bench binary" >&2; exit 2; }
done
builds=("$@")
for r in $(seq 1 "$reps"); do
  for b in "${builds[@]}"; do
    name=$(basename "$b")
    log="$out/${name}_${workers}_$r.txt"
    timeout "${PER:-180}" "$b" "$workers" 8 "$jobs" --deadline-s 40 --probes 2000 >"$log" 2>&1 || true
    rate=$(awk '/^RESULT fvd_dispatches_per_s/ {print $3}' "$log")
    echo "$name $workers rep=$r rate=${rate:-none}" | tee -a "$out/summary.txt"
  done
  # The next rep starts with the next build.
  builds=("${builds[@]:1}" "${builds[0]}")
done
python3 - "$out/summary.txt" "$workers" <<'PY'
import statistics, sys
rates = {}
for line in open(sys.argv[1]):
    name, workers, _, rate = line.split()
    if workers == sys.argv[2] and rate != "rate=none":
        rates.setdefault(name, []).append(float(rate[5:]))
for name, r in rates.items():
    print(f"{name} x{sys.argv[2]}: {len(r)} reps, mean {statistics.mean(r):.0f}/s, "
          f"median {statistics.median(r):.0f}/s, {min(r):.0f}-{max(r):.0f}")
PY
