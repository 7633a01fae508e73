"""Activation tracing for numpy modules, in FastVideo's JSONL shape.

FastVideo traces a torch model with forward hooks when
``FASTVIDEO_TRACE_ACTIVATIONS=1``; this is the same mechanism for the plain
numpy objects of this example, so a red component can be drilled down
without torch. ``attach(model)`` walks the model's attributes the way
``named_modules()`` does (``blocks.0.mlp.fc1``: attributes, list items),
wraps every sub-module whose name matches the layer regex, and writes one
JSON record per output array when the wrapped module returns:

    {"module": "blocks.0.norm", "tensor": "out", "step": null,
     "abs_mean": ..., "sum": ..., "max": ..., "shape": [8, 32],
     "rank": 0, "world_size": 2, "numel": 256}

Environment (read when ``attach`` is called; arguments override):

- ``FASTVIDEO_TRACE_ACTIVATIONS``: ``1``/``true`` turns tracing on; off,
  ``attach`` changes nothing and costs nothing.
- ``FASTVIDEO_TRACE_LAYERS``: regex searched in module names (empty: all).
- ``FASTVIDEO_TRACE_STATS``: comma-separated stats (default ``abs_mean,sum``).
- ``FASTVIDEO_TRACE_OUTPUT``: file path; ``<pid>`` and ``<rank>`` are
  filled in (default ``/tmp/fv_trace_<pid>.jsonl``).
- ``FASTVIDEO_TRACE_STEPS``: comma-separated steps to record (empty: all).

The reference side has no hooks of its own (it plays an upstream
repository); a parity test attaches this tracer to it with an explicit
``output`` and ``layers``.
"""

import json
import os
import re

import numpy as np

STATS = ("abs_mean", "sum", "min", "max", "mean", "std", "shape", "dtype")


def _enabled(value):
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _is_module(value):
    """Objects of this example's own classes that can be called."""
    if isinstance(value, (np.ndarray, np.generic, type)) or not callable(value):
        return False
    return hasattr(value, "__dict__") and not callable(getattr(value, "__func__", None)) and (
        type(value).__module__.split(".")[0] in ("fastvideo", "tinyport_official")
    )


def named_modules(model, prefix=""):
    """``(name, owner, key, module)`` for every sub-module, depth first,
    parents before children; ``owner[key]`` or ``owner.key`` holds it."""
    out = []
    for attr, value in list(vars(model).items()):
        name = f"{prefix}.{attr}" if prefix else attr
        if isinstance(value, list):
            for i, item in enumerate(value):
                if _is_module(item):
                    out.append((f"{name}.{i}", value, i, item))
                    out.extend(named_modules(item, f"{name}.{i}"))
        elif _is_module(value):
            out.append((name, model, attr, value))
            out.extend(named_modules(value, name))
    return out


def _stats(x, names):
    a = np.asarray(x)
    f = a.astype(np.float64)
    rec = {}
    for n in names:
        if n == "abs_mean":
            rec[n] = float(np.abs(f).mean())
        elif n == "sum":
            rec[n] = float(f.sum())
        elif n == "min":
            rec[n] = float(f.min())
        elif n == "max":
            rec[n] = float(f.max())
        elif n == "mean":
            rec[n] = float(f.mean())
        elif n == "std":
            # torch's default (and FastVideo's): the sample std.
            rec[n] = float(f.std(ddof=1)) if f.size > 1 else 0.0
        elif n == "shape":
            rec[n] = list(a.shape)
        elif n == "dtype":
            rec[n] = str(a.dtype)
    return rec


def _leaves(value, name="out"):
    if isinstance(value, (np.ndarray, np.generic)):
        return [(name, value)]
    if isinstance(value, (tuple, list)):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, f"{name}.{i}")]
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{name}.{k}")]
    return []


class _Traced:
    """Stands in for a module: calls it, records its outputs."""

    def __init__(self, module, name, handle):
        self._module = module
        self._name = name
        self._handle = handle

    def __call__(self, *args, **kwargs):
        out = self._module(*args, **kwargs)
        self._handle.record(self._name, out)
        return out

    def __getattr__(self, attr):
        return getattr(self._module, attr)


class TraceHandle:
    """An attached trace; ``close()`` (or leaving ``with``) detaches it."""

    def __init__(self, path, stats, steps, rank, world_size):
        self.path = path
        self.stats = stats
        self.steps = steps
        self.rank = rank
        self.world_size = world_size
        self.step = None
        self._undo = []
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self._file = open(path, "a", buffering=1, encoding="utf-8")

    def set_step(self, step):
        self.step = step

    def record(self, module, output):
        if self.steps is not None and self.step not in self.steps:
            return
        for tensor, arr in _leaves(output):
            rec = {"module": module, "tensor": tensor, "step": self.step}
            rec.update(_stats(arr, self.stats))
            rec.update(rank=self.rank, world_size=self.world_size, numel=int(np.asarray(arr).size))
            self._file.write(json.dumps(rec) + "\n")

    def close(self):
        for owner, key, module in reversed(self._undo):
            if isinstance(owner, list):
                owner[key] = module
            else:
                setattr(owner, key, module)
        self._undo = []
        if not self._file.closed:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Off:
    """What ``attach`` returns when tracing is off."""

    path = None

    def set_step(self, step):
        pass

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def attach(model, output=None, layers=None, rank=0, world_size=1, env=None):
    """Trace ``model``'s matching sub-modules; returns a handle to close."""
    env = os.environ if env is None else env
    if not _enabled(env.get("FASTVIDEO_TRACE_ACTIVATIONS", "")):
        return _Off()
    layers = env.get("FASTVIDEO_TRACE_LAYERS", "") if layers is None else layers
    pattern = re.compile(layers or ".*")
    stats = [s.strip() for s in env.get("FASTVIDEO_TRACE_STATS", "abs_mean,sum").split(",") if s.strip()]
    unknown = [s for s in stats if s not in STATS]
    if unknown:
        raise ValueError(f"FASTVIDEO_TRACE_STATS: unknown stats {unknown}")
    steps_text = env.get("FASTVIDEO_TRACE_STEPS", "")
    steps = None
    if steps_text.strip():
        steps = {None if s.strip() in ("null", "none") else int(s) for s in steps_text.split(",") if s.strip()}
    template = output or env.get("FASTVIDEO_TRACE_OUTPUT") or "/tmp/fv_trace_<pid>.jsonl"
    path = template.replace("<pid>", str(os.getpid())).replace("<rank>", str(rank))
    handle = TraceHandle(path, stats, steps, rank, world_size)
    # Every module is found before any is wrapped, so names stay the
    # attribute paths of the bare model.
    for name, owner, key, module in named_modules(model):
        if not pattern.search(name):
            continue
        traced = _Traced(module, name, handle)
        handle._undo.append((owner, key, module))
        if isinstance(owner, list):
            owner[key] = traced
        else:
            setattr(owner, key, traced)
    return handle
