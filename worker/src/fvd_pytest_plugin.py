"""fvd's pytest plugin: each test's real outcome, and whether anything in
the run changed how pytest judges it.

Outcomes. pytest's JUnit writer reports a non-strict xpass (an
xfail-marked test that passed) as a plain pass, which would let a stale
scaffold count as parity. This plugin stores the outcome pytest itself
decided (passed, failed, skipped, xfailed, xpassed, xpassed_strict, error)
as the testcase property ``fvd_outcome``; fvd's verdict classifier reads it.

Integrity. A run whose code swapped out what judges it is no pass, whatever
its cases say. After each test's teardown and at the end of the session the
plugin looks for:

- an assertion helper (``numpy.testing.assert_*``, ``numpy.allclose``,
  ``torch.testing.assert_close``, ``torch.allclose``/``equal``,
  ``math.isclose``, ``pytest.approx``, ``unittest.TestCase.assert*``)
  that is no longer the library's own: a Python function whose code lives
  outside the library's folder, a builtin under another name, or another
  object than the one the library had when the plugin was loaded;
- a function of pytest's own machinery (how a test is run, reported and
  written to JUnit) replaced since the plugin was loaded;
- a hook that can change a verdict (``pytest_runtest_makereport``,
  ``pytest_report_teststatus``, ``pytest_pyfunc_call``, …) implemented in
  the repository outside a ``conftest.py`` or a collected test module (the
  judge, which fvd pins), or outside both the repository and the installed
  packages, by a plugin pytest did not load from an installed
  distribution's entry point.

It writes what it found as the JUnit testsuite property ``fvd_integrity``:
``clean``, or ``tampered`` followed by one finding per line, each naming
what was replaced and where the replacement was defined. The classifier
turns ``tampered`` into the ``tampered`` verdict; a run whose cases carry
``fvd_outcome`` but whose suite has no ``fvd_integrity`` (the plugin was
unregistered, or the report rewritten) is ``tampered`` too.

This is a tripwire for the known ways code swaps out its judge, not a wall:
code running in the test's own process can reach anything the plugin holds.
The wall is fvd's pinned judge and the jail. Nothing is imported here that
the run would not import anyway: a library's helpers are looked at only
once the run itself imported it.

GPU memory (issue #44). At the end of the session, when the run itself
imported ``torch`` and initialised CUDA (the plugin never imports torch: a
CPU-only run pays nothing), the plugin appends the most GPU memory the
process held, in MiB, as one line to the file named by ``FVD_PEAK_GPU_FILE``
(each process of a run, rank or xdist worker, appends its own; the worker
takes the largest). Per device it is ``torch.cuda.max_memory_reserved`` (the
caching allocator's peak) plus the CUDA context's own memory, which the
allocator does not see: NVML's count for this process less what the
allocator holds now, when ``pynvml`` is importable and knows the process;
otherwise a fixed allowance of ``CONTEXT_ALLOWANCE_MIB``. The largest over
the devices is reported. Memory a library takes outside torch's allocator
(cuBLAS workspaces are inside it; NCCL buffers, a custom kernel's own
``cudaMalloc`` are not) is not counted.

Loaded by the worker with ``-p fvd_pytest_plugin`` from a scratch directory
put on PYTHONPATH, before any conftest or test module.
"""

import os
import sys
import types

import pytest

OUTCOME = "fvd_outcome"
PEAK_GPU_ENV = "FVD_PEAK_GPU_FILE"
# What a CUDA context holds outside torch's allocator when NVML cannot say:
# about what one takes on current data-centre GPUs with lazy module loading
# (CUDA 11.7+), rounded up.
CONTEXT_ALLOWANCE_MIB = 512
MIB = 1 << 20
XFAIL_REASON = "fvd_xfail_reason"
INTEGRITY = "fvd_integrity"

# module -> attribute names of the assertion helpers a test may judge with.
HELPERS = {
    "numpy.testing": (
        "assert_allclose",
        "assert_almost_equal",
        "assert_approx_equal",
        "assert_array_almost_equal",
        "assert_array_almost_equal_nulp",
        "assert_array_equal",
        "assert_array_less",
        "assert_array_max_ulp",
        "assert_equal",
        "assert_string_equal",
    ),
    "numpy": ("allclose", "isclose", "array_equal", "array_equiv"),
    "torch.testing": ("assert_close",),
    "torch": ("allclose", "equal", "isclose"),
    "math": ("isclose",),
    "pytest": ("approx",),
}

# The package folders a helper of each module must come from.
HELPER_HOMES = {
    "numpy.testing": ("numpy",),
    "numpy": ("numpy",),
    "torch.testing": ("torch",),
    "torch": ("torch",),
    "math": (),
    "pytest": ("_pytest", "pytest"),
    "unittest": ("unittest",),
}

# pytest's machinery: how a test is called, reported, and written out.
MACHINERY = (
    "_pytest.runner",
    "_pytest.reports",
    "_pytest.junitxml",
    "_pytest.python",
    "_pytest.skipping",
    "_pytest.outcomes",
    "_pytest.main",
    "_pytest.unittest",
    "pluggy._callers",
    "pluggy._hooks",
    "pluggy._manager",
)

# Hooks whose implementation can change what a run reports.
VERDICT_HOOKS = (
    "pytest_runtest_protocol",
    "pytest_runtest_setup",
    "pytest_runtest_call",
    "pytest_runtest_teardown",
    "pytest_runtest_makereport",
    "pytest_runtest_logreport",
    "pytest_report_teststatus",
    "pytest_pyfunc_call",
    "pytest_runtestloop",
    "pytest_collection",
    "pytest_collection_modifyitems",
    "pytest_collectreport",
    "pytest_make_collect_report",
    "pytest_deselected",
    "pytest_sessionfinish",
    "pytest_unconfigure",
    "pytest_exception_interact",
)

_THIS_FILE = os.path.realpath(__file__)


def _snapshot_machinery():
    """Every function and class of pytest's machinery, as loaded: the
    modules' own, and the functions in their classes' dicts."""
    seen = {}
    for name in MACHINERY:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            if isinstance(value, (types.FunctionType, type)):
                seen[(name, attr)] = value
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                for member, inner in list(vars(value).items()):
                    if isinstance(inner, (types.FunctionType, property, staticmethod, classmethod)):
                        seen[(name, attr + "." + member)] = inner
    return seen


def _helpers_now():
    """The assertion helpers of the libraries imported so far, by
    (module, attribute)."""
    seen = {}
    for modname, names in HELPERS.items():
        mod = sys.modules.get(modname)
        if mod is None:
            continue
        for attr in names:
            value = getattr(mod, attr, None)
            if value is not None:
                seen[(modname, attr)] = value
    case = getattr(sys.modules.get("unittest"), "TestCase", None)
    if case is not None:
        for attr in _assert_names(case):
            seen[("unittest", "TestCase." + attr)] = getattr(case, attr)
    return seen


_NAMES = []


def _assert_names(case):
    """The `assert*` names of unittest's TestCase, listed once."""
    if not _NAMES or _NAMES[0] is not case:
        _NAMES[:] = [case, [a for a in dir(case) if a.startswith("assert")]]
    return _NAMES[1]


# Taken at import, which pytest does for `-p` plugins before it reads any
# conftest or test module.
_MACHINERY = _snapshot_machinery()
_HELPERS = _helpers_now()
_findings = []
_rootdir = [os.path.realpath(os.getcwd())]
_judged_files = set()


def _code_of(obj):
    """The code object an object runs, without following ``__wrapped__``
    (which any replacement can set to the original)."""
    for _ in range(4):
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
            continue
        if isinstance(obj, property):
            obj = obj.fget
            continue
        code = getattr(obj, "__code__", None)
        if isinstance(code, types.CodeType):
            return code
        inner = getattr(obj, "__func__", None)
        if inner is None and _from_numpy(type(obj)):
            # numpy's array-function dispatchers keep the Python function
            # (only theirs: any object can carry an `_implementation`).
            inner = getattr(obj, "_implementation", None)
        if inner is None:
            return None
        obj = inner
    return None


def _from_numpy(cls):
    return (getattr(cls, "__module__", None) or "").split(".")[0] == "numpy"


def _where(obj):
    code = _code_of(obj)
    if code is None:
        return "a %s object" % type(obj).__name__
    path = os.path.realpath(code.co_filename)
    root = os.path.join(_rootdir[0], "")
    if path.startswith(root):
        path = path[len(root):]
    return "%s:%d" % (path, code.co_firstlineno)


def _under(path, folder):
    return path == folder or path.startswith(os.path.join(folder, ""))


# package name -> (its module, its folder), found once per module object.
_FOLDERS = {}


def _package_folders(names):
    out = []
    for name in names:
        mod = sys.modules.get(name)
        known = _FOLDERS.get(name)
        if known is not None and known[0] is mod:
            out.append(known[1])
            continue
        f = getattr(mod, "__file__", None)
        if isinstance(f, str):
            folder = os.path.realpath(os.path.dirname(f))
            _FOLDERS[name] = (mod, folder)
            out.append(folder)
    return out


# Where a library's own wrapper of its helper is defined: a decorator of
# the standard library (numpy 1.24 wraps its testing helpers with a
# contextlib.ContextDecorator), or numpy's generated array-function
# dispatchers (before numpy 1.25). Only through these is `__wrapped__`
# followed: a replacement defined anywhere else is judged by its own code.
_WRAPPER_FILES = ("contextlib.py", "functools.py")
_STDLIB = os.path.realpath(os.path.dirname(os.__file__))
_GENERATED = ("<__array_function__ internals>",)


def _helper_is_own(modname, attr, value):
    """Whether `value` is the library's own helper `modname.attr`."""
    name = attr.rsplit(".", 1)[-1]
    homes = _package_folders(HELPER_HOMES[modname])
    for _ in range(4):
        code = _code_of(value)
        if code is None:
            # A builtin (torch.allclose, math.isclose, a numpy ufunc) of the
            # same name is the library's; any other object without code (a
            # callable instance, a partial) is not.
            builtin = isinstance(value, types.BuiltinFunctionType) or (
                type(value).__name__ == "ufunc" and _from_numpy(type(value))
            )
            return builtin and getattr(value, "__name__", None) == name
        if code.co_filename in _GENERATED:
            if "numpy" not in HELPER_HOMES[modname]:
                return False
        else:
            path = os.path.realpath(code.co_filename)
            if any(_under(path, home) for home in homes):
                return True
            if not (_under(path, _STDLIB) and os.path.basename(path) in _WRAPPER_FILES):
                return False
        value = getattr(value, "__wrapped__", None)
        if value is None:
            return False
    return False


def _check_helpers():
    current = _helpers_now()
    for key, value in current.items():
        if _VERIFIED.get(key) is value:
            continue
        modname, attr = key
        before = _HELPERS.get(key)
        swapped = before is not None and value is not before and not _same_method(value, before)
        if swapped or not _helper_is_own(modname, attr, value):
            _note("%s.%s replaced by %s" % (modname, attr, _where(value)))
        elif not isinstance(value, types.MethodType):
            # Checked once per object: the next check of the same object
            # costs one identity test (a method is bound anew on each read).
            _VERIFIED[key] = value
    for (modname, attr), before in _HELPERS.items():
        if (modname, attr) not in current and sys.modules.get(modname) is not None:
            _note("%s.%s removed" % (modname, attr))


# (module, attribute) -> the object found to be the library's own.
_VERIFIED = {}


def _same_method(a, b):
    """Two reads of one method of a class (bound anew on each read)."""
    fa = getattr(a, "__func__", None)
    return fa is not None and fa is getattr(b, "__func__", None)


def _check_machinery():
    for (modname, attr), before in _MACHINERY.items():
        mod = sys.modules.get(modname)
        if mod is None:
            continue
        if "." in attr:
            cls_name, member = attr.split(".", 1)
            owner = vars(mod).get(cls_name)
            value = vars(owner).get(member) if isinstance(owner, type) else None
        else:
            value = vars(mod).get(attr)
        if value is before:
            continue
        code = _code_of(value)
        if code is not None and _installed(os.path.realpath(code.co_filename)):
            # An installed plugin's own patch (pytest-rerunfailures, say).
            continue
        where = "nothing" if value is None else _where(value)
        _note("pytest's %s.%s replaced by %s" % (modname, attr, where))


_INSTALLED = []


def _installed_folders():
    """The folders of installed packages and of the standard library,
    found once."""
    if _INSTALLED:
        return _INSTALLED
    import site
    import sysconfig

    out = set()
    for key in ("purelib", "platlib", "stdlib", "platstdlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            out.add(os.path.realpath(p))
    try:
        out.update(os.path.realpath(p) for p in site.getsitepackages())
    except AttributeError:
        pass
    user = getattr(site, "getusersitepackages", lambda: None)()
    if isinstance(user, str):
        out.add(os.path.realpath(user))
    for p in sys.path:
        if p and os.path.basename(p.rstrip("/")) in ("site-packages", "dist-packages"):
            out.add(os.path.realpath(p))
    _INSTALLED.extend(sorted(p for p in out if p != "/"))
    return _INSTALLED


def _installed(path):
    """Whether `path` is a file of an installed package (site-packages or
    dist-packages), never one of the repository's."""
    return any(_under(path, p) for p in _installed_folders() if "-packages" in p)


def _hook_is_judged(path):
    """Whether a hook implemented in `path` belongs to the judge or to what
    is installed: this plugin, a conftest.py or collected test module of the
    repository, or a file of an installed package or the standard library."""
    if path == _THIS_FILE or _installed(path):
        return True
    if _under(path, _rootdir[0]):
        return os.path.basename(path) == "conftest.py" or path in _judged_files
    return any(_under(path, p) for p in _installed_folders())


# id -> hook implementation already found to be the judge's or installed
# (kept, so that its id is not reused).
_JUDGED_HOOKS = {}


# Filled once: pytest loads entry-point plugins only while it configures.
_DISTRIBUTED = []


def _distributed_plugins(manager):
    """The plugins (id -> plugin) pytest loaded from an installed
    distribution's `pytest11` entry point, wherever it is installed
    (site-packages, or a folder on PYTHONPATH), but never one whose files
    are in the repository: a `*.dist-info` there is the repository's code.
    Read on the first check, which runs after pytest configured."""
    if _DISTRIBUTED:
        return _DISTRIBUTED[0]
    out = {}
    for plugin, dist in manager.list_plugin_distinfo():
        inner = getattr(dist, "_dist", dist)
        try:
            base = os.path.realpath(str(inner.locate_file("")))
        except Exception:  # noqa: BLE001 - an odd distribution is not trusted
            continue
        if not _under(base, _rootdir[0]):
            out[id(plugin)] = plugin
    _DISTRIBUTED.append(out)
    return out


def _check_hooks(config):
    hook = config.pluginmanager.hook
    distributed = _distributed_plugins(config.pluginmanager)
    for name in VERDICT_HOOKS:
        caller = getattr(hook, name, None)
        if caller is None:
            continue
        for impl in caller.get_hookimpls():
            if _JUDGED_HOOKS.get(id(impl.function)) is impl.function:
                continue
            if distributed.get(id(impl.plugin)) is impl.plugin:
                _JUDGED_HOOKS[id(impl.function)] = impl.function
                continue
            code = _code_of(impl.function)
            if code is None:
                _note("hook %s implemented by %s (%s)" % (name, _where(impl.function), impl.plugin_name))
                continue
            if _hook_is_judged(os.path.realpath(code.co_filename)):
                _JUDGED_HOOKS[id(impl.function)] = impl.function
            else:
                _note("hook %s implemented at %s, outside the judge" % (name, _where(impl.function)))


def _note(finding):
    if finding not in _findings:
        _findings.append(finding)


def _check(config):
    try:
        _check_helpers()
        _check_machinery()
        _check_hooks(config)
    except Exception as e:  # noqa: BLE001 - a check that broke is a finding
        _note("the integrity check failed: %s: %s" % (type(e).__name__, e))


def _label(report):
    wasxfail = getattr(report, "wasxfail", None)
    if wasxfail is not None:
        return "xfailed" if report.skipped else "xpassed"
    if report.failed:
        if str(report.longrepr).startswith("[XPASS(strict)]"):
            return "xpassed_strict"
        return "failed" if report.when == "call" else "error"
    return report.outcome


def pytest_configure(config):
    _rootdir[0] = os.path.realpath(str(config.rootpath))


def pytest_collection_finish(session):
    for item in session.items:
        path = getattr(item, "path", None) or getattr(item, "fspath", None)
        if path is not None:
            _judged_files.add(os.path.realpath(str(path)))


# tryfirst makes this the outermost wrapper, so it sees the report after
# pytest's skipping plugin has turned it into an xfail or xpass.
@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    # One label per test: from the call phase, or from setup when the call
    # never ran (setup error, skip, xfail(run=False)).
    if report.when == "call" or (report.when == "setup" and not report.passed):
        props = [(OUTCOME, _label(report))]
        wasxfail = getattr(report, "wasxfail", None)
        if wasxfail:
            props.append((XFAIL_REASON, str(wasxfail).removeprefix("reason: ")))
        for prop in props:
            # The item's list feeds the teardown report the JUnit writer
            # reads; the report's own copy covers a call failure followed by
            # a teardown error, which pytest writes from the call report.
            item.user_properties.append(prop)
            report.user_properties.append(prop)
    if report.when == "teardown":
        # After the test's fixtures are undone, so a judge's own
        # monkeypatch of a helper is gone again.
        _check(item.config)


def _peak_gpu_mib():
    """The most GPU memory this process held on any device, in MiB
    (rounded up), or None when the run never initialised CUDA through
    torch. Never imports torch."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return None
    peaks = []
    for d in range(cuda.device_count()):
        reserved = cuda.max_memory_reserved(d)
        if reserved > 0:
            peaks.append(reserved + _context_bytes(cuda, d))
    if not peaks:
        # CUDA is up but the allocator never held anything: the context.
        peaks.append(_context_bytes(cuda, cuda.current_device()))
    return -(-max(peaks) // MIB)


def _context_bytes(cuda, d):
    """What device `d`'s CUDA context of this process holds outside the
    allocator: NVML's per-process count less the allocator's, or the
    allowance when NVML is missing or does not list this process (another
    PID namespace)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            uuid = str(cuda.get_device_properties(d).uuid)
            handle = pynvml.nvmlDeviceGetHandleByUUID("GPU-" + uuid.removeprefix("GPU-"))
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if p.pid == os.getpid() and p.usedGpuMemory:
                    return max(0, p.usedGpuMemory - cuda.memory_reserved(d))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML: the allowance
        pass
    return CONTEXT_ALLOWANCE_MIB * MIB


def _report_peak_gpu():
    path = os.environ.get(PEAK_GPU_ENV)
    if not path:
        return
    try:
        mib = _peak_gpu_mib()
    except Exception as e:  # noqa: BLE001 - unknown, never a wrong number
        sys.stderr.write("fvd: cannot measure the run's peak gpu memory: %s: %s\n" % (type(e).__name__, e))
        return
    if mib is None:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, b"%d\n" % mib)
        finally:
            os.close(fd)
    except OSError as e:
        sys.stderr.write("fvd: cannot report the run's peak gpu memory to %s: %s\n" % (path, e))


# tryfirst: before the JUnit writer's own sessionfinish writes the file.
@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    config = session.config
    _report_peak_gpu()
    _check(config)
    xml = _junit_writer(config)
    if xml is None:
        return
    if _findings:
        xml.add_global_property(INTEGRITY, "tampered\n" + "\n".join(_findings))
        sys.stderr.write("fvd: the run changed what judges it:\n")
        for f in _findings:
            sys.stderr.write("fvd:   %s\n" % f)
    else:
        xml.add_global_property(INTEGRITY, "clean")


def _junit_writer(config):
    try:
        from _pytest.junitxml import xml_key

        return config.stash.get(xml_key, None)
    except ImportError:
        return getattr(config, "_xml", None)
