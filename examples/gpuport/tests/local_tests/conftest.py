"""Shared setup of GpuPort's parity tests.

- ``device``: the GPU of this process (``cuda:LOCAL_RANK``), float32 with
  TF32 off so tolerances can be argued from float32 rounding alone.
  ``GPUPORT_DEVICE=cpu`` runs the same tests on the CPU (gloo for the
  distributed one), which is how they are checked where no GPU is.
- ``repeat_parity``: runs a test's parity check on ``GPUPORT_REPEATS_<NAME>``
  (else ``GPUPORT_REPEATS``, else 1) fresh seeded inputs. A single check is
  milliseconds of GPU work; repeats turn each test into a measurable,
  deliberately sized job for fvd's scheduling benchmark
  (``bench/gpu_proof.sh``), and every repeat is a real comparison.
- Under torchrun, only rank 0 writes the JUnit report (see
  ``pytest_configure``).

torch is imported lazily so that, without torch, every test skips instead
of failing at collection.
"""

import json
import os
import time

import pytest

BATCH = 16
SEQ = 512

# Checks timed per test in calibration mode: a fixed count, not a time
# budget, because ranks of a distributed test must agree on how many
# collectives they run.
CALIBRATION_CHECKS = int(os.environ.get("GPUPORT_CALIBRATE_CHECKS", "20"))


def _rank():
    return int(os.environ.get("RANK", "0"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """With ``GPUPORT_BODY_LOG=PATH``, appends when the test body started
    (after its fixtures: CUDA is up), when it ended, and which job it is:
    the GPU benchmarks (``bench/gpu_warm.py``, ``bench/gpu_compute.py``)
    measure start-up as job start -> ``t`` and a job's compute as
    ``t_end - t``."""
    path = os.environ.get("GPUPORT_BODY_LOG")
    start = time.time()
    yield
    if path:
        rec = {
            "t": start,
            "t_end": time.time(),
            "test": item.nodeid,
            "rank": _rank(),
            "job": os.environ.get("FVD_JOB_COOKIE", ""),
        }
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")


def _phase(name):
    """With ``GPUPORT_BODY_LOG=PATH``, appends when this process reached
    ``name`` of its end (``sessionfinish``, ``unconfigure``, ``atexit``):
    ``bench/gpu_exit_probe.py`` splits a run's time after its test body."""
    path = os.environ.get("GPUPORT_BODY_LOG")
    if path:
        rec = {"phase": name, "t": time.time(), "rank": _rank(), "job": os.environ.get("FVD_JOB_COOKIE", "")}
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")


def pytest_sessionfinish(session, exitstatus):
    _phase("sessionfinish")


def pytest_unconfigure(config):
    _phase("unconfigure")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if os.environ.get("GPUPORT_BODY_LOG"):
        import atexit

        atexit.register(_phase, "atexit")
    # torchrun starts pytest once per rank with the same --junitxml. Two
    # writers of one file race (torn or one-rank reports), and fvd reads one
    # file, so ranks > 0 write none. tryfirst: this must run before pytest's
    # junitxml plugin reads the option in its own pytest_configure. The
    # distributed tests fail on every rank when any rank fails, so rank 0's
    # report holds every rank's outcome.
    if _rank() > 0:
        config.option.xmlpath = None


@pytest.fixture(scope="session")
def device():
    torch = pytest.importorskip("torch")
    want = os.environ.get("GPUPORT_DEVICE", "cuda")
    if want == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("GpuPort parity runs on a CUDA GPU (GPUPORT_DEVICE=cpu runs it on the CPU)")
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    else:
        dev = torch.device(want)
    # Ampere and later would otherwise be free to run float32 matmuls in
    # TF32 (10-bit mantissa) and the tolerances below would not hold.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return dev


@pytest.fixture(scope="session")
def input_ids(device):
    """``input_ids(i)``: the i-th seeded batch of token ids, on the device."""
    import torch
    from gpuport_official import OFFICIAL_CONFIG

    def make(i):
        g = torch.Generator(device=device).manual_seed(1000 + i)
        return torch.randint(0, OFFICIAL_CONFIG["vocab_size"], (BATCH, SEQ), generator=g, device=device)

    return make


@pytest.fixture(scope="session")
def capture():
    """``capture(model, ids, names)`` runs the official model and returns its
    final hidden state and ``{name: (input, output)}`` of the named
    submodules, taken by forward hooks from the official forward itself."""
    import torch

    def first(x):
        return x[0] if isinstance(x, (tuple, list)) else x

    def run(model, ids, names):
        seen = {}
        modules = dict(model.named_modules())
        handles = []
        for name in names:

            def hook(_mod, args, kwargs, out, _name=name):
                x = args[0] if args else kwargs["hidden_states"]
                seen[_name] = (x, first(out))

            handles.append(modules[name].register_forward_hook(hook, with_kwargs=True))
        try:
            with torch.no_grad():
                final = model(input_ids=ids, use_cache=False).last_hidden_state
        finally:
            for h in handles:
                h.remove()
        missing = set(names) - set(seen)
        assert not missing, f"official forward never called {sorted(missing)}"
        return final, seen

    return run


def _assert_parity(actual, expected, *, rtol, atol):
    """``assert_close`` plus two guards: same shape and dtype, and a reference
    whose typical magnitude is far above ``atol`` (a tolerance near the
    values' own size would pass almost anything)."""
    import torch

    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype == torch.float32, (actual.dtype, expected.dtype)
    scale = expected.abs().mean().item()
    assert scale > 100 * atol, f"reference mean |x| {scale:.3g} is too small for atol {atol}"
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


@pytest.fixture(scope="session")
def assert_parity():
    return _assert_parity


def _repeats(component):
    raw = os.environ.get(f"GPUPORT_REPEATS_{component.upper()}") or os.environ.get("GPUPORT_REPEATS") or "1"
    n = int(raw)
    if n < 1:
        raise ValueError(f"repeat count for {component} must be >= 1, got {raw!r}")
    return n


@pytest.fixture
def repeat_parity(device):
    """``repeat_parity(component, check)``: ``check(i)`` compares port and
    official on the i-th seeded input and raises on a mismatch. Returns the
    number of checks run.

    With ``GPUPORT_CALIBRATE_OUT=PATH``, runs one warm-up and
    ``CALIBRATION_CHECKS`` timed checks instead and appends
    ``{"component", "seconds_per_check"}`` to PATH (rank 0 only), which
    ``bench/gpu_proof_plan.py`` turns into repeat counts.
    """
    import torch

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def run(component, check):
        out = os.environ.get("GPUPORT_CALIBRATE_OUT")
        check(0)
        if out:
            sync()
            t0 = time.perf_counter()
            for i in range(1, CALIBRATION_CHECKS + 1):
                check(i)
            sync()
            per = (time.perf_counter() - t0) / CALIBRATION_CHECKS
            if _rank() == 0:
                with open(out, "a") as f:
                    f.write(json.dumps({"component": component, "seconds_per_check": per}) + "\n")
            return CALIBRATION_CHECKS + 1
        n = _repeats(component)
        for i in range(1, n):
            check(i)
        sync()
        print(f"{component}: {n} parity checks on {device}")
        return n

    return run
