#!/usr/bin/env python3
"""What fvd's pytest plugin (worker/src/fvd_pytest_plugin.py) adds to a
parity run (issue #39: the honest fix keeps its wall time within 10%).

Two measures, side by side in one run:

1. Whole runs: a cold `python -m pytest` of a parity-like test file (numpy,
   and torch when installed, imported; `--tests` cases each comparing with
   `numpy.testing.assert_allclose`, and `torch.testing.assert_close` with
   torch), with the plugin loaded as the worker loads it and without it,
   interleaved `--runs` times; the median of each and their ratio.
2. One integrity check (what runs after every test's teardown and at the
   session's end), timed in a process that imported the same libraries.

Usage: python3 bench/plugin_overhead.py [--runs 20] [--tests 50]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = os.path.join(ROOT, "worker", "src", "fvd_pytest_plugin.py")

TEST = '''
import numpy as np
try:
    import torch
except ImportError:
    torch = None
import pytest


@pytest.mark.parametrize("i", range({tests}))
def test_parity(i):
    rng = np.random.default_rng(i)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    np.testing.assert_allclose(a @ a.T, (a @ a.T).T, rtol=1e-4, atol=1e-4)
    if torch is not None:
        t = torch.from_numpy(a)
        torch.testing.assert_close(t @ t.T, (t @ t.T).T, rtol=1e-4, atol=1e-4)
'''

CHECK = '''
import sys, time, types
import numpy
try:
    import torch, torch.testing
except ImportError:
    pass
import pytest, _pytest.config
sys.path.insert(0, sys.argv[1])
import fvd_pytest_plugin as p
config = _pytest.config.get_config()
n = int(sys.argv[2])
start = time.perf_counter()
for _ in range(n):
    p._check(config)
took = time.perf_counter() - start
assert not p._findings, p._findings
print("%.1f" % (took / n * 1e6))
'''


def run(folder, plugin):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "--junitxml", os.path.join(folder, "junit.xml"), "test_parity.py"]
    if plugin:
        env["PYTHONPATH"] = os.path.join(folder, "plugin")
        env["PYTEST_ADDOPTS"] = "-p fvd_pytest_plugin"
    else:
        env.pop("PYTEST_ADDOPTS", None)
    start = time.perf_counter()
    out = subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit("pytest failed:\n" + out.stdout + out.stderr)
    xml = open(os.path.join(folder, "junit.xml")).read()
    if plugin and 'name="fvd_integrity" value="clean"' not in xml:
        sys.exit("the plugin did not report a clean run:\n" + xml[:2000])
    return took


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--tests", type=int, default=50)
    ap.add_argument("--checks", type=int, default=2000)
    a = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="fvd-plugin-bench-")
    try:
        os.makedirs(os.path.join(folder, "plugin"))
        shutil.copy(PLUGIN, os.path.join(folder, "plugin"))
        with open(os.path.join(folder, "test_parity.py"), "w") as f:
            f.write(TEST.replace("{tests}", str(a.tests)))
        run(folder, True)
        run(folder, False)
        with_plugin, without = [], []
        for _ in range(a.runs):
            with_plugin.append(run(folder, True))
            without.append(run(folder, False))
        check = subprocess.run(
            [sys.executable, "-c", CHECK, os.path.join(folder, "plugin"), str(a.checks)],
            capture_output=True, text=True, cwd=folder)
        if check.returncode != 0:
            sys.exit("the check benchmark failed:\n" + check.stderr)
        try:
            import torch  # noqa: F401
            libs = "numpy and torch"
        except ImportError:
            libs = "numpy"
        w, wo = statistics.median(with_plugin), statistics.median(without)
        print("python %s, %s imported, %d tests per run, %d runs each" % (
            sys.version.split()[0], libs, a.tests, a.runs))
        print("run without the plugin: median %.3f s" % wo)
        print("run with the plugin:    median %.3f s  (ratio %.3f)" % (w, w / wo))
        print("one integrity check:    %s us" % check.stdout.strip())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
