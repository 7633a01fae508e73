"""Write activation traces in FastVideo's JSONL shape from any torch.nn.Module.

``attach(model, prefix=...)`` registers forward hooks on the model's named
modules and writes one JSON record per output tensor, exactly the shape
``fvd trace compare`` reads: ``module``, ``tensor``, ``step``, the enabled
stats, plus ``rank``, ``world_size`` and ``numel`` so that per-rank traces
merge exactly. It honours FastVideo's environment variables:

``FASTVIDEO_TRACE_ACTIVATIONS``
    on unless unset or ``"0"`` (FastVideo's own toggle semantics)
``FASTVIDEO_TRACE_LAYERS``
    regex *searched* in module names; empty traces every module
``FASTVIDEO_TRACE_STATS``
    comma-separated stats, default ``abs_mean,sum``
``FASTVIDEO_TRACE_OUTPUT``
    output path, ``<pid>`` replaced; default ``/tmp/fv_trace_<pid>.jsonl``;
    with several ranks, ``_rank<N>`` is added before the extension unless
    the path already holds ``<rank>``
``FASTVIDEO_TRACE_STEPS``
    comma-separated steps to capture; empty captures all

and one of its own, ``FVD_TRACE_DUMP``: a ``.safetensors`` path (``<pid>``
and ``<rank>`` replaced) where full float32 copies of every traced output
are written, keyed ``module:tensor`` (``@step`` when a step is set), with
the execution order in ``__metadata__["fvd_order"]`` (a JSON list of keys)
because safetensors headers do not keep insertion order.

``std`` is torch's default, the unbiased (sample) std, as in FastVideo's
writer; ``fvd trace merge`` pools it with the same convention.

torch is imported lazily: the writers and the stat code run on numpy
arrays too, which is how they are tested without a GPU machine.
"""

import json
import math
import os
import re
import struct
import tempfile

__all__ = [
    "TraceConfig",
    "TraceHandle",
    "attach",
    "compute_stats",
    "dump_key",
    "JsonlSink",
    "SafetensorsDumpWriter",
    "ORDER_METADATA_KEY",
]

ORDER_METADATA_KEY = "fvd_order"
KNOWN_STATS = ("abs_mean", "sum", "min", "max", "mean", "std", "shape", "dtype")


class TraceConfig:
    """The trace settings, from FastVideo's env vars (or given directly)."""

    def __init__(self, enabled=True, layers="", stats=("abs_mean", "sum"), output=None,
                 steps=None, dump=None):
        self.enabled = enabled
        self.layers = layers or ""
        self.pattern = re.compile(self.layers) if self.layers else None
        unknown = [s for s in stats if s not in KNOWN_STATS]
        if unknown:
            raise ValueError(f"unknown trace stats {unknown}; known: {', '.join(KNOWN_STATS)}")
        self.stats = tuple(stats)
        self.output = output or "/tmp/fv_trace_<pid>.jsonl"
        self.steps = None if steps is None else frozenset(steps)
        self.dump = dump

    @classmethod
    def from_env(cls, env=None):
        env = os.environ if env is None else env
        toggle = env.get("FASTVIDEO_TRACE_ACTIVATIONS")
        stats = [s.strip() for s in env.get("FASTVIDEO_TRACE_STATS", "abs_mean,sum").split(",") if s.strip()]
        steps_txt = env.get("FASTVIDEO_TRACE_STEPS", "").strip()
        steps = [int(s) for s in steps_txt.split(",") if s.strip()] if steps_txt else None
        return cls(
            enabled=toggle is not None and toggle != "0",
            layers=env.get("FASTVIDEO_TRACE_LAYERS", ""),
            stats=stats,
            output=env.get("FASTVIDEO_TRACE_OUTPUT") or None,
            steps=steps,
            dump=env.get("FVD_TRACE_DUMP") or None,
        )

    def matches(self, name):
        return self.pattern is None or self.pattern.search(name) is not None

    def wants_step(self, step):
        return self.steps is None or step is None or step in self.steps


def resolve_path(template, rank, world_size, pid=None):
    """Fill ``<pid>`` and ``<rank>``; add ``_rank<N>`` for multi-rank runs."""
    pid = os.getpid() if pid is None else pid
    path = template.replace("<pid>", str(pid))
    if "<rank>" in path:
        return path.replace("<rank>", str(rank))
    if world_size > 1:
        root, ext = os.path.splitext(path)
        return f"{root}_rank{rank}{ext}"
    return path


def dump_key(module, tensor, step):
    """The dump key ``fvd trace dumps`` parses: ``module:tensor[@step]``."""
    return f"{module}:{tensor}" if step is None else f"{module}:{tensor}@{step}"


def _finite_or_name(v):
    # Same tokens as Python's json for non-finite floats, but as strings so
    # the line stays valid JSON; fvd reads them back as numbers.
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def compute_stats(x, names):
    """Stats of a numpy array or torch tensor, computed in float (float64
    for numpy, float32 like FastVideo for torch). Returns (stats, numel)."""
    out = {}
    is_torch = type(x).__module__.startswith("torch")
    if is_torch:
        shape = list(x.shape)
        dtype = str(x.dtype)
        xf = x.detach().float()
        numel = int(xf.numel())

        def red(name):
            if name == "abs_mean":
                return xf.abs().mean().item()
            if name == "sum":
                return xf.sum().item()
            if name == "min":
                return xf.min().item()
            if name == "max":
                return xf.max().item()
            if name == "mean":
                return xf.mean().item()
            if name == "std":
                return xf.std().item()  # unbiased, torch's default
            raise KeyError(name)
    else:
        import numpy as np

        arr = np.asarray(x)
        shape = list(arr.shape)
        dtype = str(arr.dtype)
        xf = arr.astype(np.float64)
        numel = int(xf.size)

        def red(name):
            if name == "abs_mean":
                return float(np.abs(xf).mean())
            if name == "sum":
                return float(xf.sum())
            if name == "min":
                return float(xf.min())
            if name == "max":
                return float(xf.max())
            if name == "mean":
                return float(xf.mean())
            if name == "std":
                return float(xf.std(ddof=1)) if numel > 1 else float("nan")
            raise KeyError(name)

    for name in names:
        if name == "shape":
            out["shape"] = shape
        elif name == "dtype":
            out["dtype"] = dtype
        else:
            try:
                out[name] = _finite_or_name(float(red(name)))
            except Exception as e:  # a failed reduction is reported, not fatal
                out[name] = f"<error: {type(e).__name__}: {e}>"
    return out, numel


class JsonlSink:
    """Line-buffered JSONL writer (every record reaches the file at once)."""

    def __init__(self, path):
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self.path = path
        self._f = open(path, "a", buffering=1)

    def write(self, record):
        self._f.write(json.dumps(record) + "\n")

    def close(self):
        self._f.close()


class SafetensorsDumpWriter:
    """Streams float32 tensors to a safetensors file without holding them:
    data goes to a temporary file as it comes, and ``close`` writes the
    header (with the execution order in ``__metadata__``) followed by the
    data. A key seen twice keeps its first tensor."""

    def __init__(self, path):
        self.path = path
        parent = os.path.dirname(path) or "."
        os.makedirs(parent, exist_ok=True)
        self._data = tempfile.TemporaryFile(dir=parent)
        self._entries = {}
        self._order = []
        self._offset = 0

    def add(self, key, array):
        """``array``: a numpy array (converted to little-endian float32)."""
        import numpy as np

        if key in self._entries:
            return
        a = np.ascontiguousarray(np.asarray(array, dtype="<f4"))
        raw = a.tobytes()
        self._data.write(raw)
        self._entries[key] = {
            "dtype": "F32",
            "shape": list(a.shape),
            "data_offsets": [self._offset, self._offset + len(raw)],
        }
        self._offset += len(raw)
        self._order.append(key)

    def close(self):
        header = dict(self._entries)
        header["__metadata__"] = {ORDER_METADATA_KEY: json.dumps(self._order)}
        h = json.dumps(header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        self._data.seek(0)
        with open(self.path, "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            while True:
                chunk = self._data.read(1 << 24)
                if not chunk:
                    break
                f.write(chunk)
        self._data.close()


def _leaves(value, name="out"):
    """Tensor leaves of a module output: tuples/lists as ``out[i]``, dicts
    as ``out[key]``; anything that is not a tensor is skipped."""
    if type(value).__module__.startswith("torch") and hasattr(value, "shape"):
        yield name, value
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{name}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{name}[{k}]")


def _rank_info():
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class TraceHandle:
    """What ``attach`` returns: set the step, then ``close()`` (or use it as
    a context manager) to remove the hooks and finish the files."""

    def __init__(self, config, rank=0, world_size=1):
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.step = None
        self.modules = 0
        self._hooks = []
        self.output = resolve_path(config.output, rank, world_size)
        self._sink = JsonlSink(self.output)
        self._dump = None
        if config.dump:
            self._dump = SafetensorsDumpWriter(resolve_path(config.dump, rank, world_size))

    def set_step(self, step):
        self.step = step

    def record(self, module, tensor_name, tensor):
        """Write one record (and dump the tensor if dumping)."""
        if not self.config.wants_step(self.step):
            return
        stats, numel = compute_stats(tensor, self.config.stats)
        rec = {"module": module, "tensor": tensor_name, "step": self.step}
        rec.update(stats)
        rec["rank"] = self.rank
        rec["world_size"] = self.world_size
        rec["numel"] = numel
        self._sink.write(rec)
        if self._dump is not None:
            if type(tensor).__module__.startswith("torch"):
                tensor = tensor.detach().float().cpu().numpy()
            self._dump.add(dump_key(module, tensor_name, self.step), tensor)

    def close(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._sink.close()
        if self._dump is not None:
            self._dump.close()
            self._dump = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def attach(model, prefix="", config=None, rank=None, world_size=None):
    """Hook every matching named module of ``model``; ``prefix`` is put in
    front of module names (e.g. ``"transformer."`` to match a pipeline's
    names). Returns a ``TraceHandle``, or None when tracing is off.

    ``rank`` and ``world_size`` default to the process group's (or
    ``RANK``/``WORLD_SIZE``); a model that one rank runs whole inside a
    distributed job (the unsharded reference, say) passes ``rank=0,
    world_size=1`` so its trace is not taken for one shard of several."""
    config = TraceConfig.from_env() if config is None else config
    if not config.enabled:
        return None
    group_rank, group_size = _rank_info()
    rank = group_rank if rank is None else rank
    world_size = group_size if world_size is None else world_size
    handle = TraceHandle(config, rank, world_size)
    for name, module in model.named_modules():
        full = f"{prefix}{name}" if name else prefix.rstrip(".")
        if not full or not config.matches(full):
            continue

        def hook(_mod, _inp, output, _name=full):
            for tname, t in _leaves(output):
                handle.record(_name, tname, t)

        handle._hooks.append(module.register_forward_hook(hook))
        handle.modules += 1
    return handle
