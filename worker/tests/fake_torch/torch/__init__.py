"""A stand-in for torch in fvd's tests: only what fvd's pytest plugin reads
of ``torch.cuda`` to measure a run's peak GPU memory, with the peak the test
chooses. ``FAKE_TORCH_PEAK_MIB``: the allocator's peak per device, comma
separated (``1000,3000``: two devices); CUDA is initialised once a test
calls ``torch.cuda.init()``, as a real run's first tensor on a GPU does.
``FAKE_TORCH_IMPORTED``: a file created when this module is imported, so a
test can tell that nothing imported it. ``set_num_threads`` and
``get_num_threads``: the CPU pool's size, as a run sharing its GPU has it
set."""

import os
import sys
import types

MIB = 1 << 20

if os.environ.get("FAKE_TORCH_IMPORTED"):
    open(os.environ["FAKE_TORCH_IMPORTED"], "w").close()

cuda = types.ModuleType("torch.cuda")
_initialized = [False]


def _peaks():
    return [int(p) * MIB for p in os.environ.get("FAKE_TORCH_PEAK_MIB", "0").split(",")]


def init():
    _initialized[0] = True


def is_initialized():
    return _initialized[0]


def device_count():
    return len(_peaks())


def current_device():
    return 0


def max_memory_reserved(device=None):
    return _peaks()[device or 0] if _initialized[0] else 0


def memory_reserved(device=None):
    return 0


cuda.init = init
cuda.is_initialized = is_initialized
cuda.device_count = device_count
cuda.current_device = current_device
cuda.max_memory_reserved = max_memory_reserved
cuda.memory_reserved = memory_reserved
sys.modules["torch.cuda"] = cuda

# The CPU thread pool: sized at import as torch sizes it (OMP_NUM_THREADS,
# else a thread per core); IMPORTED_PID tells a forked run which process
# imported it (a warm runner's zygote).
IMPORT_THREADS = int(os.environ.get("OMP_NUM_THREADS") or 0) or (os.cpu_count() or 1)
IMPORTED_PID = os.getpid()
_threads = [IMPORT_THREADS]


def set_num_threads(n):
    _threads[0] = int(n)


def get_num_threads():
    return _threads[0]
