#!/usr/bin/env bash
# Benchmarks of `fvd trace`, each side by side with its baseline in one run:
#
#  1. merge + compare of RANKS rank files x RECORDS records against one
#     reference trace: the release `fvd trace compare` vs the plain-Python
#     implementation of the same algorithm (bench/trace_compare_py.py).
#  2. the dump comparator on two DUMP_GB safetensors files: `fvd trace dumps`
#     vs numpy computing the same metrics (bench/trace_dumps_numpy.py), with peak
#     RSS from /usr/bin/time -v, and GB/s next to a memory-copy baseline.
#
# Inputs are generated into bench/out/ (gitignored) once and reused.
# Env: RANKS (8), RECORDS (200000), DUMP_GB (2), SKIP_TRACE=1, SKIP_DUMPS=1,
#      FVD_BIN (use this fvd binary instead of building one),
#      CARGO_TARGET_DIR (default /work/targets/trace).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
out="$here/out"
RANKS="${RANKS:-8}"
RECORDS="${RECORDS:-200000}"
DUMP_GB="${DUMP_GB:-2}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/targets/trace}"
mkdir -p "$out"

echo "== $(nproc) cores; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ -n "${FVD_BIN:-}" ]]; then
  # A binary built earlier (the shared tree may not compile mid-edit).
  fvd="$FVD_BIN"
else
  echo "== building release fvd"
  (cd "$root" && cargo build --release -p fvd --quiet)
  fvd="$CARGO_TARGET_DIR/release/fvd"
fi

# Wall seconds and peak RSS (MiB) of a command, stdout to a file.
measure() { # name outfile cmd...
  local name="$1" dest="$2"
  shift 2
  local log="$out/$name.time"
  set +e
  /usr/bin/time -v "$@" >"$dest" 2>"$log"
  local rc=$?
  set -e
  local wall rss
  wall=$(grep "Elapsed (wall clock)" "$log" | awk '{print $NF}' |
    awk -F: '{ if (NF==3) print $1*3600+$2*60+$3; else print $1*60+$2 }')
  rss=$(grep "Maximum resident set size" "$log" | awk '{printf "%.1f", $NF/1024}')
  echo "$wall $rss $rc"
}

renames=(--rename '^blocks\.(\d+)=>transformer.h.$1' --rename '\.norm1$=>.ln_1'
  --rename '\.norm2$=>.ln_2' --rename '\.attention$=>.attn' --rename '\.ffn(\.|$)=>.mlp$1')

if [[ "${SKIP_TRACE:-}" != 1 ]]; then
  tdir="$out/trace_${RANKS}x${RECORDS}"
  if [[ ! -f "$tdir/ref.jsonl" ]]; then
    echo "== generating $RANKS x $RECORDS records into $tdir"
    python3 "$here/trace_gen.py" --ranks "$RANKS" --records "$RECORDS" --out "$tdir"
  fi
  ports=("$tdir"/port_rank*.jsonl)
  # Warm the page cache so both sides read from memory.
  cat "$tdir"/*.jsonl >/dev/null
  echo "== merge + compare: $RANKS ranks x $RECORDS records"
  read -r rs_t rs_m rs_rc < <(measure fvd_compare "$out/fvd_compare.json" \
    "$fvd" trace compare --json --reference "$tdir/ref.jsonl" --port "${ports[@]}" "${renames[@]}")
  read -r py_t py_m py_rc < <(measure py_compare "$out/py_compare.json" \
    python3 "$here/trace_compare_py.py" --reference "$tdir/ref.jsonl" --port "${ports[@]}" "${renames[@]}")
  python3 - "$out/fvd_compare.json" "$out/py_compare.json" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
keys = ("reference_module", "port_module", "tensor", "step", "stat")
same = all(a["first_divergence"][k] == b["first_divergence"][k] for k in keys) and len(a["rows"]) == len(b["rows"])
print(f"   same answer: {same} (first divergence {a['first_divergence']['port_module']} step {a['first_divergence']['step']}, {len(a['rows'])} rows)")
EOF
  printf "   fvd (rust, release): %8.2f s  peak %8.1f MiB  exit %s\n" "$rs_t" "$rs_m" "$rs_rc"
  printf "   python baseline:     %8.2f s  peak %8.1f MiB  exit %s\n" "$py_t" "$py_m" "$py_rc"
  awk -v a="$py_t" -v b="$rs_t" 'BEGIN { printf "   speed-up: %.1fx (target >= 20x)\n", a / b }'
fi

if [[ "${SKIP_DUMPS:-}" != 1 ]]; then
  ddir="$out/dumps_${DUMP_GB}g"
  if [[ ! -f "$ddir/port.safetensors" ]]; then
    echo "== generating two ${DUMP_GB} GiB dumps into $ddir"
    python3 "$here/trace_dumps_gen.py" "$ddir" "$DUMP_GB"
  fi
  bytes=$(($(stat -c %s "$ddir/ref.safetensors") + $(stat -c %s "$ddir/port.safetensors")))
  cat "$ddir/ref.safetensors" "$ddir/port.safetensors" >/dev/null
  echo "== dump comparator: 2 x ${DUMP_GB} GiB safetensors (float32)"
  read -r rs_t rs_m rs_rc < <(measure fvd_dumps "$out/fvd_dumps.json" \
    "$fvd" trace dumps "$ddir/ref.safetensors" "$ddir/port.safetensors" --json)
  read -r np_t np_m np_rc < <(measure np_dumps "$out/np_dumps.json" \
    python3 "$here/trace_dumps_numpy.py" "$ddir/ref.safetensors" "$ddir/port.safetensors")
  cat_t=$(python3 -c "
import time, sys
t = time.perf_counter()
for p in sys.argv[1:]:
    with open(p, 'rb', buffering=0) as f:
        while f.read(1 << 24): pass
print(time.perf_counter() - t)" "$ddir/ref.safetensors" "$ddir/port.safetensors")
  copy_gbs=$(python3 "$here/trace_memcpy.py" 1)
  python3 - "$out/fvd_dumps.json" "$out/np_dumps.json" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
fa = a["first_divergence"]["reference_module"] + ":" + a["first_divergence"]["tensor"]
worst = max(abs(x["metrics"]["rel_diff"] - y["rel_diff"]) for x, y in zip(a["tensors"], b["tensors"]))
print(f"   same answer: {fa == b['first_divergence']} (first divergence {fa}; max |rel_diff difference| {worst:.2e})")
EOF
  printf "   fvd (rust, release): %8.2f s  peak %8.1f MiB  exit %s  %6.2f GB/s\n" "$rs_t" "$rs_m" "$rs_rc" \
    "$(awk -v b="$bytes" -v t="$rs_t" 'BEGIN { print b / t / 1e9 }')"
  printf "   numpy baseline:      %8.2f s  peak %8.1f MiB  exit %s  %6.2f GB/s\n" "$np_t" "$np_m" "$np_rc" \
    "$(awk -v b="$bytes" -v t="$np_t" 'BEGIN { print b / t / 1e9 }')"
  awk -v a="$np_t" -v b="$rs_t" 'BEGIN { printf "   speed-up: %.1fx (target >= 3x; peak RSS target < 256 MiB)\n", a / b }'
  awk -v b="$bytes" -v t="$cat_t" -v c="$copy_gbs" \
    'BEGIN { printf "   baselines: page-cache read %.2f GB/s, numpy memory copy %.2f GB/s\n", b / t / 1e9, c }'
fi
echo "== load average at end: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine slows both sides)"
