#!/usr/bin/env bash
# The project's test command (README "Run the tests"; .ci/run calls it).
# Installs the Python packages the example ports and the verdict tests run
# under, then: formatting, clippy with warnings denied, every Rust test (the
# fuzz targets of fuzz/ for FVD_FUZZ_SECS seconds in all, 60 here, shared by
# the test threads), and the tests of python/fvd_trace (numpy stand-ins for
# torch modules; the torch path is proven on GPUs, see bench/gpu_trace_proof.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
FVD_FUZZ_SECS="${FVD_FUZZ_SECS:-60}" cargo test --workspace --locked
(cd python && python3 -m pytest tests -q -p no:cacheprovider)
