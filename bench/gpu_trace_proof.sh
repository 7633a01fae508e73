#!/usr/bin/env bash
# fvd's trace actor on real GPUs (issue #4, item 6): the gpuport_traced
# example, a red encoder run as 2 torchrun ranks over NCCL, drilled down by
# the trace actor from the layers' MLPs to the first divergent leaf.
#
#   bench/gpu_trace_proof.sh PATH/TO/fvd        (from the repository root,
#                                                on a machine with 2 GPUs)
#
# Results go to $OUT when set (the device tool's folder), else
# bench/out/gpu_trace: submit.txt, status.json, trace_show.txt,
# trace_show.json, PORT_STATUS.md, gpus.txt.
set -euo pipefail

FVD=$(realpath "${1:?usage: bench/gpu_trace_proof.sh PATH/TO/fvd}")
ROOT=$(pwd)
REPO=$ROOT/examples/gpuport
RESULTS=${OUT:-$ROOT/bench/out/gpu_trace}
mkdir -p "$RESULTS"
[[ -f $REPO/tests/local_tests/gpuport_traced/port.toml ]] || { echo "run from the repository root" >&2; exit 2; }

# NVLink multicast stays off on shared hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# The test imports fvd_trace from this checkout.
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export FVD_LOG=${FVD_LOG:-info}

nvidia-smi -L > "$RESULTS/gpus.txt" || true
rm -rf "$REPO/.fvd"
start=$(date +%s.%N)
set +e
"$FVD" submit --family gpuport_traced --repo "$REPO" --wait > "$RESULTS/submit.txt" 2> "$RESULTS/submit.log"
code=$?
set -e
end=$(date +%s.%N)
echo "submit exit $code in $(python3 -c "print(round($end - $start, 1))") s" | tee -a "$RESULTS/submit.txt"
"$FVD" status gpuport_traced --json --repo "$REPO" > "$RESULTS/status.json"
"$FVD" trace show gpuport_traced encoder_dp --repo "$REPO" > "$RESULTS/trace_show.txt" || true
"$FVD" trace show gpuport_traced encoder_dp --repo "$REPO" --json > "$RESULTS/trace_show.json" || true
cp "$REPO/tests/local_tests/gpuport_traced/PORT_STATUS.md" "$RESULTS/" || true
"$FVD" logs 'gpuport_traced' 'encoder_dp#trace' --repo "$REPO" > "$RESULTS/trace_run_log.txt" 2>&1 || true
cat "$RESULTS/submit.txt"
