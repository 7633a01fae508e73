#!/usr/bin/env bash
# The project's test command (README "Run the tests"; .ci/run calls it).
# Installs the Python packages the example ports and the verdict tests run
# under and, when missing, Debian's chromium and chromium-driver (the
# dashboard's browser test), then: formatting, clippy with warnings denied,
# every Rust test (the fuzz targets of fuzz/ for FVD_FUZZ_SECS seconds in
# all, 60 here, shared by the test threads), the
# tests of python/fvd_trace (numpy stand-ins for torch modules; the torch
# path is proven on GPUs, see bench/gpu_trace_proof.sh) and the check that
# tests/fixtures/traces matches its generator. Every input is inside the
# repository (tests/fixtures): nothing beside the checkout is read.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
# The dashboard's browser test (tests/e2e/dashboard.rs) drives Debian's
# headless Chromium through its chromedriver; a CI machine comes without
# them (root there; sudo elsewhere).
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        chromium chromium-driver fonts-liberation >/dev/null
fi
cargo fmt --all -- --check
# --features fvd/conformance: the conformance target compiles and is linted
# here too (it shares tests/checks with e2e), though it runs only in .ci/run.
cargo clippy --workspace --all-targets --features fvd/conformance --locked -- -D warnings
# Every test stage runs even when an earlier one failed, and cargo runs
# every test binary (--no-fail-fast): one failure cannot hide the others.
status=0
FVD_FUZZ_SECS="${FVD_FUZZ_SECS:-60}" cargo test --workspace --locked --no-fail-fast || status=1
(cd python && python3 -m pytest tests -q -p no:cacheprovider) || status=1
python3 -m pytest tests/fixtures/traces -q -p no:cacheprovider || status=1
exit "$status"
