#!/usr/bin/env bash
# The project's test command (README "Run the tests"; .ci/run calls it).
# Installs the Python packages the example ports and the verdict tests run
# under and, when missing, Debian's chromium and chromium-driver (the
# dashboard's browser test), Node and the pinned coding-agent CLIs (the
# real-agent tests, cached in target/agents-cli), then: formatting, clippy with warnings denied,
# the API documentation with no broken intra-doc link, every Rust test (the fuzz targets of fuzz/ for FVD_FUZZ_SECS seconds in
# all, 60 here, shared by the test threads), the
# tests of python/fvd_trace (numpy stand-ins for torch modules; the torch
# path is proven on GPUs, see bench/gpu_trace_proof.sh) and the check that
# tests/fixtures/traces matches its generator. Every input is inside the
# repository (tests/fixtures): nothing beside the checkout is read.
set -euo pipefail
cd "$(dirname "$0")/.."
# requirements-dev.txt is a lock (exact versions with hashes; pip checks
# every hash): scripts/pins.py refreshes it and checks it below.
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
# The git-escape test (tests/e2e/git_escape.rs) runs a worker as `nobody`,
# who cannot reach a Python under /root: Debian's python3 runs its parity
# tests, with Debian's pytest and numpy.
if ! /usr/bin/python3 -c 'import pytest, numpy' >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        python3-pytest python3-numpy >/dev/null
fi
cargo fmt --all -- --check
# --features fvd/conformance,fvd/slurm,fvd/agents: those targets compile
# and are linted here too, though the conformance suite runs only in
# .ci/run.
cargo clippy --workspace --all-targets --features fvd/conformance,fvd/slurm,fvd/agents --locked -- -D warnings
# Every test stage runs even when an earlier one failed, and cargo runs
# every test binary (--no-fail-fast): one failure cannot hide the others.
status=0
# The API documentation of every crate, with no broken intra-doc link (a
# renamed item a doc comment still names fails here). --keep-going documents
# every crate, so each broken link is reported. About 35 s on two cores
# once clippy has checked the dependencies; nothing here is run.
RUSTDOCFLAGS="-D rustdoc::broken_intra_doc_links" \
    cargo doc --no-deps --workspace --locked --keep-going || status=1
# The Slurm worker job on a one-node Slurm cluster the test starts and
# stops itself (tests/slurm: private munged, slurmctld and slurmd, stopped
# by the PIDs in their pid files). Root and Debian's packages are needed;
# without them the test fails, it never skips.
if ! { command -v slurmctld && command -v munged; } >/dev/null 2>&1; then
    echo "slurm: installing slurm-wlm and munge"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge; } >/dev/null ||
        echo "slurm: apt-get install slurm-wlm munge failed; the Slurm test will fail"
fi
# Real coding-agent CLIs as component subagents (tests/agents): Node when
# the machine has none and the pinned Claude Code, Codex and opencode into
# the cache target/agents-cli (kept between runs); each then runs the
# example's fix against the scripted model server inside unshare -n.
if ! agent_clis=$(bash scripts/agent-clis.sh); then
    echo "agents: the coding-agent CLIs could not be installed; the real-agent tests will fail"
    agent_clis=""
    status=1
fi
# The real-agent tests find the CLIs in target/agents-cli/bin; named only
# when the cache is elsewhere (FVD_AGENT_CLI_CACHE), since every other test
# would see the variable too.
if [ -n "$agent_clis" ] && [ "$agent_clis" != "$PWD/target/agents-cli/bin" ]; then
    export FVD_AGENT_CLI_DIR="$agent_clis"
fi
# Every Rust test, the Slurm and real-agent ones among them (one build:
# their features only add those test targets).
FVD_FUZZ_SECS="${FVD_FUZZ_SECS:-60}" \
    cargo test --workspace --locked --no-fail-fast --features fvd/slurm,fvd/agents || status=1
# The Python tests: fvd_trace's, the trace fixtures against their
# generator, and the pins' own (the lock files cover every import).
python_tests() {
    local py="$1" s=0
    (cd python && "$py" -m pytest tests -q -p no:cacheprovider) || s=1
    "$py" -m pytest tests/fixtures/traces -q -p no:cacheprovider || s=1
    (cd scripts && "$py" -m pytest test_pins.py -q -p no:cacheprovider) || s=1
    return "$s"
}
python_tests python3 || status=1
python3 scripts/pins.py check || status=1
# The same Python tests under releases the lock does not pin, reported and
# never failing the command: the newest release of every requirement, and
# the oldest numpy requirements-dev.in allows. A warning here is the notice
# that a refresh of the pins (README "Python dependencies") needs work.
for variant in newest numpy-1.26; do
    versions=""
    venv="$PWD/target/python-$variant"
    rm -rf "$venv"
    case "$variant" in
        newest) spec=(--upgrade -r requirements-dev.in) ;;
        numpy-1.26) spec=(-r requirements-dev.in "numpy==1.26.*") ;;
    esac
    if python3 -m venv "$venv" &&
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${spec[@]}" &&
        versions=$("$venv/bin/python" -c 'import numpy, pytest, safetensors; print(f"numpy {numpy.__version__}, pytest {pytest.__version__}, safetensors {safetensors.__version__}")') &&
        python_tests "$venv/bin/python"; then
        echo "python ($variant: $versions): passed"
    else
        echo "WARNING: python ($variant${versions:+: $versions}): the Python tests failed or could not be installed; the pinned run above decides the status"
    fi
done


# The Kubernetes manifests, validated offline against the Kubernetes
# schemas that kubernetes-validate ships (and the validator's own tests;
# docker itself is not run here). The release binary the images of
# deploy/Dockerfile carry is not built here: it compiles the same code as
# the test build (tests/layout/profiles.rs checks that no code is compiled
# for one profile only), and building it took minutes of CI's two cores.
python3 -m pip install --quiet --disable-pip-version-check -r deploy/k8s/requirements.txt || status=1
python3 deploy/k8s/validate.py || status=1
python3 -m pytest deploy/k8s deploy/test_dockerfile.py -q -p no:cacheprovider || status=1
exit "$status"
