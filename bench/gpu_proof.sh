#!/usr/bin/env bash
# fvd on real GPUs (issue #6, item 6): the gpuport example through an
# orchestrator and one worker per GPU, timed against the same parity
# commands run one after another with plain pytest (torchrun for the
# multi-GPU one), on the same machine in the same run.
#
#   bench/gpu_proof.sh PATH/TO/fvd        (from the repository root)
#
# GPU_PROOF_SECONDS (default 10) sizes each parity test: a calibration pass
# times one check of each component, and GPUPORT_REPEATS_<NAME> is set so
# each test does about that much GPU work (nominally: on 2 x H200 a check in
# a long loop cost 1.6-2.2x what calibration measured, so 10 gave 20-26 s
# per test; the figures are in examples/gpuport/tests/local_tests/gpuport/
# README.md). The counts are fixed before
# anything is timed and both runs use them: a job that lands on a busy GPU
# takes longer instead of doing less.
#
# Workers: fvd places a job's GPUs on one worker, so a 2-GPU component needs
# a worker that owns 2 GPUs, and two workers must never offer the same GPU.
# Phase 1 runs one worker per GPU (gpu0, gpu1, ...) and the single-GPU
# components spread over them; the multi-GPU components wait in fvd's
# queue. When every single-GPU component is final, those workers stop and
# one worker owning every GPU (gpus-all) joins and takes the multi-GPU
# components. The switch is inside the timed fvd run.
#
# Results go to $OUT when set (the device tool's folder), else
# bench/out/gpu_proof: summary.json, fvd_status.json, PORT_STATUS.md,
# sequential.json and the logs of the orchestrator, workers and submit.
set -euo pipefail

FVD=$(realpath "${1:?usage: bench/gpu_proof.sh PATH/TO/fvd}")
ROOT=$(pwd)
PORT_DIR=$ROOT/examples/gpuport
PLAN=(python3 "$ROOT/bench/gpu_proof_plan.py")
TARGET_S=${GPU_PROOF_SECONDS:-10}
RESULTS=${OUT:-$ROOT/bench/out/gpu_proof}
WORK=$(mktemp -d /tmp/gpu_proof.XXXXXX)
mkdir -p "$RESULTS"
[[ -f $PORT_DIR/tests/local_tests/gpuport/port.toml ]] || { echo "run from the repository root" >&2; exit 2; }

# NVLink multicast stays off on shared hosts; set here so every process
# started below (workers, their jobs, torchrun ranks) inherits it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# info: registrations, leases and job starts (which worker, which GPUs) land
# in the logs kept with the results.
export FVD_LOG=${FVD_LOG:-info}

log() { echo "[gpu_proof $(date -u +%H:%M:%S)] $*"; }
now() { date +%s.%N; }

PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

nvidia-smi -L | tee "$WORK/gpus.txt"
NGPU=$(grep -c '^GPU ' "$WORK/gpus.txt")
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0)
(( NGPU >= 2 )) || { echo "needs at least 2 GPUs (tp_mlp runs on 2), found $NGPU" >&2; exit 2; }
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
"$FVD" --version

# torchrun is torch's console script; where only the module is installed,
# an equivalent shim keeps the port's command unchanged.
if ! command -v torchrun >/dev/null; then
    mkdir -p "$WORK/bin"
    printf '#!/bin/sh\nexec python3 -m torch.distributed.run "$@"\n' >"$WORK/bin/torchrun"
    chmod +x "$WORK/bin/torchrun"
    export PATH=$WORK/bin:$PATH
    log "torchrun not on PATH: using python3 -m torch.distributed.run"
fi

log "calibration: one check per component, ${TARGET_S}s of checks per test"
"${PLAN[@]}" calibrate "$WORK/cal.jsonl" || log "calibration: a parity command failed (see above)"
"${PLAN[@]}" repeats "$WORK/cal.jsonl" "$TARGET_S" | tee "$WORK/repeats.env"
# shellcheck disable=SC1091
source "$WORK/repeats.env"

# ---- fvd: orchestrator, workers, submit -------------------------------
"$FVD" orchestrator serve --listen 127.0.0.1:0 --db "sqlite://$WORK/fvd.db" \
    >"$WORK/orchestrator.out" 2>"$WORK/orchestrator.log" &
PIDS+=($!)
for _ in $(seq 100); do [[ -s $WORK/orchestrator.out ]] && break; sleep 0.1; done
# First line: "fvd orchestrator listening on http://127.0.0.1:PORT".
URL=$(head -1 "$WORK/orchestrator.out" | awk '{print $NF}')
[[ $URL == http://* ]] || { echo "no orchestrator URL in: $(cat "$WORK/orchestrator.out")" >&2; exit 1; }
log "orchestrator at $URL"

start_worker() { # id gpus
    "$FVD" worker --orchestrator "$URL" --workspace "$WORK/ws-$1" --gpus "$2" \
        --cpu-slots 1 --worker-id "$1" >"$WORK/worker-$1.log" 2>&1 &
    PIDS+=($!)
    LAST_PID=$!
}
wait_registered() { # count: workers registered so far, per the orchestrator's log
    for _ in $(seq 100); do
        (( $(grep -c 'worker registered' "$WORK/orchestrator.log" || true) >= $1 )) && return 0
        sleep 0.1
    done
    log "warning: fewer than $1 worker registrations seen in the orchestrator log"
}

PER_GPU=()
for ((i = 0; i < NGPU; i++)); do
    start_worker "gpu$i" "$i"
    PER_GPU+=("$LAST_PID")
done
wait_registered "$NGPU"

NMULTI=$("${PLAN[@]}" components | awk -F'\t' '$2 > 1' | wc -l)
T0=$(now)
# Bounded: a component that can never be placed must not hang the run.
timeout "${GPU_PROOF_FVD_TIMEOUT:-300}" \
    "$FVD" submit --family gpuport --repo "$PORT_DIR" --orchestrator "$URL" --wait >"$WORK/submit.log" 2>&1 &
SUBMIT=$!
PIDS+=("$SUBMIT")
T1=0
if (( NMULTI > 0 )); then
    # Phase 1 ends when every single-GPU component is final.
    while kill -0 "$SUBMIT" 2>/dev/null; do
        if "$FVD" status gpuport --json --orchestrator "$URL" >"$WORK/poll.json" 2>/dev/null &&
            "${PLAN[@]}" final "$WORK/poll.json" 1; then
            T1=$(now)
            break
        fi
        sleep 0.2
    done
    log "single-GPU components final after $(awk "BEGIN{print $T1 - $T0}")s; per-GPU workers out, one $NGPU-GPU worker in"
    for p in "${PER_GPU[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PER_GPU[@]}"; do wait "$p" 2>/dev/null || true; done
    start_worker gpus-all all
fi
FVD_RC=0
wait "$SUBMIT" || FVD_RC=$?
T2=$(now)
log "fvd submit exited $FVD_RC after $(awk "BEGIN{print $T2 - $T0}")s"
cat "$WORK/submit.log"
"$FVD" status gpuport --json --orchestrator "$URL" >"$RESULTS/fvd_status.json"
cp "$PORT_DIR/tests/local_tests/gpuport/PORT_STATUS.md" "$RESULTS/PORT_STATUS.md"
cleanup
PIDS=()

# ---- baseline: the same commands, one after another --------------------
log "sequential baseline"
SEQ_RC=0
"${PLAN[@]}" sequential "$RESULTS/sequential.json" "$WORK/seq-junit" || SEQ_RC=$?

"${PLAN[@]}" summary --seq "$RESULTS/sequential.json" --status "$RESULTS/fvd_status.json" \
    --out "$RESULTS/summary.json" --gpu-name "$GPU_NAME" --ngpus "$NGPU" --target-s "$TARGET_S" \
    --fvd-start "$T0" --fvd-phase1 "$T1" --fvd-end "$T2" --fvd-rc "$FVD_RC"

# ---- fvd_trace: one process against two tensor-parallel ranks ----------
TRACE_RC=0
if [[ -f $ROOT/python/fvd_trace/__init__.py ]]; then
    log "fvd_trace: reference (1 process) and tensor-parallel port (2 ranks), then fvd trace compare"
    TR=$WORK/trace
    CUDA_VISIBLE_DEVICES=0 python3 "$ROOT/bench/gpu_trace_proof.py" reference "$TR" || TRACE_RC=$?
    for variant in port bug; do
        flag=()
        [[ $variant == bug ]] && flag=(--bug)
        CUDA_VISIBLE_DEVICES=0,1 torchrun --standalone --nproc_per_node=2 \
            "$ROOT/bench/gpu_trace_proof.py" port "$TR/$variant" "${flag[@]}" || TRACE_RC=$?
    done
    # Port names → reference names; dropout (identity in eval) has no port
    # counterpart and is left out.
    COMPARE=(--rename '^tp\.up$=>h.0.mlp.c_fc' --rename '^tp\.act$=>h.0.mlp.act'
        --rename '^tp\.down$=>h.0.mlp.c_proj' --rename '^tp$=>h.0.mlp'
        --layers '^h\.0\.mlp(\.(c_fc|act|c_proj))?$' --tol std=5e-3 --tol sum=5e-3)
    for variant in port bug; do
        echo "===== fvd trace compare --reference ref.jsonl --port $variant/port_rank0.jsonl $variant/port_rank1.jsonl ${COMPARE[*]}"
        rc=0
        "$FVD" trace compare --reference "$TR/ref.jsonl" \
            --port "$TR/$variant/port_rank0.jsonl" "$TR/$variant/port_rank1.jsonl" "${COMPARE[@]}" 2>&1 || rc=$?
        echo "exit $rc"
        # The correct port must match (0); the planted bug must be found (1).
        if [[ $variant == port ]]; then want=0; else want=1; fi
        if (( rc != want )); then TRACE_RC=1; fi
    done >"$RESULTS/trace_compare.txt"
    cat "$RESULTS/trace_compare.txt"
    tar -C "$TR" -czf "$RESULTS/traces.tar.gz" .
    log "fvd_trace part: $([[ $TRACE_RC == 0 ]] && echo ok || echo FAILED)"
else
    log "python/fvd_trace is absent: trace part skipped"
fi

# Logs in one file: $OUT keeps few files.
for f in "$WORK"/repeats.env "$WORK"/orchestrator.log "$WORK"/worker-*.log "$WORK"/submit.log; do
    echo "===== $(basename "$f")"
    cat "$f"
done >"$RESULTS/fvd_logs.txt"
log "results in $RESULTS"
(( FVD_RC == 0 && SEQ_RC == 0 && TRACE_RC == 0 ))
