"""Pure-Python parts of fvd_trace, tested with numpy (no torch needed):
env parsing, paths, stats, JSONL records, the safetensors dump writer, and
attach() on a stand-in module whose outputs are numpy arrays."""

import json
import os
import struct
import tempfile
import unittest

import numpy as np

import fvd_trace
from fvd_trace import (
    ORDER_METADATA_KEY,
    SafetensorsDumpWriter,
    TraceConfig,
    TraceHandle,
    compute_stats,
    dump_key,
    resolve_path,
)


class EnvTest(unittest.TestCase):
    def test_fastvideo_toggle_semantics(self):
        self.assertFalse(TraceConfig.from_env({}).enabled)
        self.assertFalse(TraceConfig.from_env({"FASTVIDEO_TRACE_ACTIVATIONS": "0"}).enabled)
        for v in ("1", "true", ""):
            self.assertTrue(TraceConfig.from_env({"FASTVIDEO_TRACE_ACTIVATIONS": v}).enabled)

    def test_layers_stats_steps(self):
        c = TraceConfig.from_env({
            "FASTVIDEO_TRACE_ACTIVATIONS": "1",
            "FASTVIDEO_TRACE_LAYERS": r"block\.layers",
            "FASTVIDEO_TRACE_STATS": "abs_mean, max,shape",
            "FASTVIDEO_TRACE_STEPS": "0,15",
        })
        self.assertTrue(c.matches("transformer.block.layers.0.attn"))  # search, not fullmatch
        self.assertFalse(c.matches("transformer.norm"))
        self.assertEqual(c.stats, ("abs_mean", "max", "shape"))
        self.assertTrue(c.wants_step(15) and not c.wants_step(1) and c.wants_step(None))
        self.assertTrue(TraceConfig.from_env({}).matches("anything"))
        with self.assertRaises(ValueError):
            TraceConfig(stats=("kurtosis",))

    def test_paths(self):
        self.assertEqual(resolve_path("/t/fv_<pid>.jsonl", 0, 1, pid=7), "/t/fv_7.jsonl")
        self.assertEqual(resolve_path("/t/fv.jsonl", 3, 8), "/t/fv_rank3.jsonl")
        self.assertEqual(resolve_path("/t/r<rank>/fv.jsonl", 3, 8), "/t/r3/fv.jsonl")
        self.assertEqual(dump_key("blocks.0", "out[0]", None), "blocks.0:out[0]")
        self.assertEqual(dump_key("blocks.0", "out", 2), "blocks.0:out@2")


class StatsTest(unittest.TestCase):
    def test_stats_are_float_and_std_is_unbiased(self):
        x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
        s, n = compute_stats(x, ("abs_mean", "sum", "min", "max", "mean", "std", "shape", "dtype"))
        self.assertEqual(n, 6)
        self.assertAlmostEqual(s["abs_mean"], 1.5)
        # The values cancel: the sum is compared by the tensor's magnitude
        # (abs_mean * n), never relative to itself.
        self.assertLessEqual(abs(s["sum"]), 1e-6 * s["abs_mean"] * n)
        self.assertLessEqual(abs(s["mean"]), 1e-6 * s["abs_mean"])
        self.assertEqual((s["min"], s["max"]), (-2.5, 2.5))
        self.assertAlmostEqual(s["std"], float(np.std(x.astype(np.float64), ddof=1)))
        self.assertEqual(s["shape"], [2, 3])
        self.assertEqual(s["dtype"], "float32")

    def test_non_finite_and_errors_stay_valid_json(self):
        s, _ = compute_stats(np.array([1.0]), ("std",))
        self.assertEqual(s["std"], "NaN")
        s, _ = compute_stats(np.array([], dtype=np.float32), ("max",))
        self.assertTrue(s["max"].startswith("<error: "))
        json.loads(json.dumps(s))


def read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        tensors[k] = np.frombuffer(data[a:b], dtype="<f4").reshape(v["shape"])
    return header, tensors


class DumpTest(unittest.TestCase):
    def test_writer_keeps_execution_order_in_metadata(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "dump.safetensors")
            w = SafetensorsDumpWriter(p)
            w.add("layers.10:out", np.ones((2, 2)))
            w.add("layers.2:out@0", np.arange(3, dtype=np.float64))
            w.add("layers.10:out", np.zeros((2, 2)))  # repeat: first one kept
            w.close()
            header, t = read_safetensors(p)
            self.assertEqual(json.loads(header["__metadata__"][ORDER_METADATA_KEY]),
                             ["layers.10:out", "layers.2:out@0"])
            np.testing.assert_array_equal(t["layers.10:out"], np.ones((2, 2)))
            np.testing.assert_array_equal(t["layers.2:out@0"], [0, 1, 2])
            try:
                from safetensors.numpy import load_file
            except ImportError:
                return
            loaded = load_file(p)
            np.testing.assert_array_equal(loaded["layers.2:out@0"], [0, 1, 2])


class FakeModule:
    """Just enough of torch.nn.Module for attach(): named_modules and
    register_forward_hook. Outputs are numpy arrays, so the hook records
    them through TraceHandle.record directly."""

    def __init__(self, children):
        self.children = children
        self.hooks = []

    def named_modules(self):
        yield "", self
        for name, m in self.children.items():
            yield name, m

    def register_forward_hook(self, fn):
        self.hooks.append(fn)
        outer = self

        class H:
            def remove(self):
                outer.hooks.remove(fn)

        return H()


class AttachTest(unittest.TestCase):
    def test_attach_filters_modules_and_writes_records_with_rank_fields(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "trace.jsonl")
            dump = os.path.join(d, "dump.safetensors")
            blocks = {f"blocks.{i}": FakeModule({}) for i in range(3)}
            model = FakeModule({"embed": FakeModule({}), **blocks})
            cfg = TraceConfig(layers=r"^m\.blocks\.\d+$", stats=("abs_mean", "max", "shape"),
                              output=out, dump=dump)
            h = fvd_trace.attach(model, prefix="m.", config=cfg)
            self.assertEqual(h.modules, 3)
            self.assertEqual(len(model.children["embed"].hooks), 0)
            # Drive the handle as the hooks would.
            for step in (0, 1):
                h.set_step(step)
                for i in range(3):
                    h.record(f"m.blocks.{i}", "out", np.full((1, 4), float(i + step)))
            h.close()
            self.assertEqual(len(model.children["blocks.0"].hooks), 0)
            recs = read_lines(out)
            self.assertEqual(len(recs), 6)
            self.assertEqual(recs[4], {"module": "m.blocks.1", "tensor": "out", "step": 1,
                                       "abs_mean": 2.0, "max": 2.0, "shape": [1, 4],
                                       "rank": 0, "world_size": 1, "numel": 4})
            header, _ = read_safetensors(dump)
            order = json.loads(header["__metadata__"][ORDER_METADATA_KEY])
            self.assertEqual(order[:2], ["m.blocks.0:out@0", "m.blocks.1:out@0"])

    def test_rank_override_marks_an_unsharded_run_inside_a_distributed_job(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "ref.jsonl")
            env = {"RANK": "1", "WORLD_SIZE": "2"}
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                model = FakeModule({"blocks.0": FakeModule({})})
                cfg = TraceConfig(stats=("sum",), output=out)
                h = fvd_trace.attach(model, config=cfg, rank=0, world_size=1)
                h.record("blocks.0", "out", np.ones((2, 2)))
                h.close()
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            # No `_rank1` suffix and no shard fields of a 2-rank run.
            rec = read_lines(out)[0]
            self.assertEqual((rec["rank"], rec["world_size"]), (0, 1))

    def test_off_returns_none(self):
        self.assertIsNone(fvd_trace.attach(FakeModule({}), config=TraceConfig(enabled=False)))

    def test_steps_filter(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "t.jsonl")
            h = TraceHandle(TraceConfig(output=out, steps=[1], stats=("sum",)))
            for s in (0, 1, 2):
                h.set_step(s)
                h.record("m", "out", np.ones(2))
            h.close()
            self.assertEqual([r["step"] for r in read_lines(out)], [1])


if __name__ == "__main__":
    unittest.main()
