#!/usr/bin/env bash
# Issue #33 item 3 on a GPU machine, before against after in one run:
# a warm run's start-up (job start -> test body) with 1, 2 and 4 runs at
# once on one worker, and its time after the body, with two fvd builds
# (the zygote's Python is compiled into the binary).
#
#   bash bench/gpu_startup.sh FVD_BEFORE FVD_AFTER [OUT]
#
# 1. bench/gpu_fork_profile.py with the zygote's old and new preload:
#    where a forked child's time goes inside Python (cProfile).
# 2. bench/gpu_exit_probe.py --modes warm-fleet --concurrency 1,2,4 with
#    each build: per run start / body / finish / report / atexit / exit.
# Each step is bounded with `timeout`; results land in OUT (default
# bench/out/gpu_startup) as they come.
set -u
before=${1:?FVD_BEFORE}
after=${2:?FVD_AFTER}
out=${3:-${OUT:-bench/out/gpu_startup}}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export PYTHONUNBUFFERED=1
levels=${GPU_STARTUP_LEVELS:-1,2,4}
runs=${GPU_STARTUP_RUNS:-3}
repeats=${GPU_STARTUP_REPEATS:-500}
log() { echo "[gpu_startup $(date -u +%H:%M:%S)] $*" | tee -a "$out/progress.txt"; }

nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$out/progress.txt"
log "page cache, python + torch + transformers GPT-2 import: $(python3 -c 'import time; t = time.time(); import torch, transformers.models.gpt2.modeling_gpt2; print(round(time.time() - t, 1))') s"
for z in old new; do
  log "profile, zygote $z"
  timeout 120 python3 "$here/gpu_fork_profile.py" --zygote "$z" --out "$out" 2>&1 | tee -a "$out/progress.txt"
done
for which in before after; do
  fvd=$before
  [ "$which" = after ] && fvd=$after
  log "exit probe + concurrency $levels, $which"
  mkdir -p "$out/$which"
  timeout 240 python3 "$here/gpu_exit_probe.py" --fvd "$fvd" --modes warm-fleet --runs "$runs" \
    --repeats "$repeats" --concurrency "$levels" --out "$out/$which" 2>&1 | tee -a "$out/progress.txt"
done
log done
