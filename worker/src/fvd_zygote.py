"""fvd's warm-runner zygote: imports a port's preload modules once, then
forks one child per job that runs pytest in-process.

Started by the worker (worker/src/zygote.rs) as
    PYTHON fvd_zygote.py SOCKET MODULE...
with only the environment that matters at import time. It never initialises
CUDA and never imports the repository's own packages (the spec refuses a
preload module that is part of the repository), so a forked child sees the
repository's code as it is on disk when the job starts.

Protocol, one Unix-socket connection per job: the worker sends one JSON line
{"args", "no_bytecode", "env", "cwd", "stdout", "stderr", "safe_path",
"ranks", "rank_env", "write_beneath"} (write_beneath: the paths a one-process
job may write below, as [path, is_folder] pairs, or null: see own_domain); stdout/stderr are named pipes the worker already reads.
The zygote forks, puts the child in a process group of its own (pgid = pid,
set by both sides before the reply), answers {"pid": N}, and once it reaped
the child {"status": WAIT_STATUS}. A line {"error": "..."} instead of a pid
means nothing was forked.

With "ranks": N > 1 (a warm torchrun), it forks N children into one process
group led by rank 0 (whose pid it answers), each with the job's environment
plus its "rank_env" entry; ranks above 0 drop --junitxml, so rank 0's report
is the verdict. A rank that fails ends the others (SIGTERM, SIGKILL after
KILL_GRACE seconds) with one line on the job's stderr, as torchrun does; the
status, sent once every rank is reaped, is the first failure's, else 0.
The zygote exits when its stdin (a pipe the worker holds) closes, killing the
process groups of the children it still has.

What a child does not pay again (bench/gpu_exit_probe.py measures it):
- The preload's objects are frozen (gc.freeze) before the first fork, so a
  child's garbage collections (pytest runs full ones at its end) do not walk
  torch's and transformers' objects, nor copy their pages by writing to them.
- pytest's own plugin modules are imported here, not per run. Installed
  plugins (entry points) are not: pytest rewrites their asserts when it
  imports them, and warns about any imported before it.
- Once pytest has returned (its JUnit report written and closed), the child
  flushes stdout and stderr, runs the atexit handlers, closes the files it
  opened and left open (writing their buffers, as finalisation would), and
  ends with os._exit: no interpreter finalisation and no CUDA teardown in
  the process, which took 1.2-1.7 s on an H100. A child that still has a
  non-daemon thread, or a torch.distributed process group it did not
  destroy, exits as Python normally does instead.
"""

import ctypes
import gc
import json
import os
import selectors
import signal
import socket
import sys
import time

# Seconds between the SIGTERM a failed rank's group gets and the SIGKILL.
KILL_GRACE = 3.0


def fail(code, message):
    sys.stderr.write("fvd zygote: " + message + "\n")
    sys.stderr.flush()
    os._exit(code)


def preload(modules):
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001 - any failure means no zygote
            fail(3, "import %s failed: %s: %s" % (name, type(e).__name__, e))
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        fail(4, "CUDA was initialised while importing the preload modules; a fork cannot use it")
    try:
        import pytest  # noqa: F401 - every child runs it
    except BaseException as e:  # noqa: BLE001
        fail(3, "import pytest failed: %s: %s" % (type(e).__name__, e))
    pytest_plugins()
    # Everything imported so far lives as long as the zygote: out of the
    # collector's sight, in the zygote and in every child.
    gc.collect()
    gc.freeze()


def pytest_plugins():
    """Imports pytest's builtin plugin modules (`_pytest.junitxml`, …),
    which pytest.main otherwise imports in every child. Best effort: one
    that fails here fails the same way in the child, as it would cold."""
    import importlib

    try:
        from _pytest.config import default_plugins
    except BaseException:  # noqa: BLE001 - another pytest layout: nothing to warm
        return
    for name in default_plugins:
        try:
            importlib.import_module("_pytest." + name)
        except BaseException:  # noqa: BLE001
            pass


class Conn:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.pid = None


class Group:
    """The children of one job: one, or a torchrun's ranks (pgid = rank 0)."""

    def __init__(self, conn, pgid, ranks, err_fd):
        self.conn = conn
        self.pgid = pgid
        self.ranks = ranks  # pid -> rank
        self.err_fd = err_fd  # the job's stderr (several ranks), else None
        self.failed = None
        self.kill_at = None

    def reaped(self, pid, status):
        rank = self.ranks.pop(pid, 0)
        if status != 0 and self.failed is None:
            self.failed = status
            if self.ranks:
                self.say("rank %d %s; ending the other ranks" % (rank, describe(status)))
                self.signal(signal.SIGTERM)
                self.kill_at = time.monotonic() + KILL_GRACE

    def signal(self, sig):
        try:
            os.killpg(self.pgid, sig)
        except OSError:
            pass

    def say(self, text):
        if self.err_fd is not None:
            try:
                os.write(self.err_fd, ("fvd: " + text + "\n").encode())
            except OSError:
                pass

    def done(self):
        if self.err_fd is not None:
            os.close(self.err_fd)
            self.err_fd = None
        return 0 if self.failed is None else self.failed


def describe(status):
    if os.WIFSIGNALED(status):
        return "was killed by signal %d" % os.WTERMSIG(status)
    return "exited with code %d" % os.WEXITSTATUS(status)


def send_line(conn, obj):
    try:
        conn.sock.setblocking(True)
        conn.sock.sendall((json.dumps(obj) + "\n").encode())
    except OSError:
        pass


def serve(path):
    """The zygote's loop. Returns (request, out_fd, err_fd) in a forked
    child, None when the zygote should exit."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    listener.setblocking(False)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "listen")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    sel.register(0, selectors.EVENT_READ, "stdin")
    parent = os.getppid()
    children = {}  # pid -> Group
    # "held": the stderr of jobs with several ranks, kept to report a failed
    # rank; a child forked for another job must not hold it open.
    state = {"listener": listener, "sel": sel, "wake": (wake_r, wake_w), "conns": set(), "held": set()}
    sys.stdout.write("ready\n")
    sys.stdout.flush()

    def shutdown():
        for group in set(children.values()):
            group.signal(signal.SIGKILL)
        try:
            os.unlink(path)
        except OSError:
            pass
        return None

    while True:
        events = sel.select(timeout=1.0)
        if os.getppid() != parent:
            return shutdown()
        now = time.monotonic()
        for group in set(children.values()):
            if group.kill_at is not None and now >= group.kill_at:
                group.signal(signal.SIGKILL)
                group.kill_at = None
        for key, _ in events:
            what = key.data
            if what == "stdin":
                try:
                    data = os.read(0, 4096)
                except OSError:
                    data = b""
                if not data:
                    return shutdown()
            elif what == "wake":
                try:
                    while os.read(wake_r, 4096):
                        pass
                except OSError:
                    pass
            elif what == "listen":
                try:
                    sock, _ = listener.accept()
                except OSError:
                    continue
                sock.setblocking(False)
                conn = Conn(sock)
                state["conns"].add(conn)
                sel.register(sock, selectors.EVENT_READ, conn)
            else:
                conn = what
                try:
                    data = conn.sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(conn.sock)
                    if conn.pid is None:
                        state["conns"].discard(conn)
                        conn.sock.close()
                    continue
                conn.buf += data
                if conn.pid is not None or b"\n" not in conn.buf:
                    continue
                sel.unregister(conn.sock)
                line = conn.buf.split(b"\n", 1)[0]
                forked = fork(conn, line, state, children)
                if forked is not None:
                    return forked
        # Reap after every wake-up: SIGCHLD may coalesce.
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            group = children.pop(pid, None)
            if group is None:
                continue
            group.reaped(pid, status)
            if not group.ranks:
                conn = group.conn
                state["held"].discard(group.err_fd)
                send_line(conn, {"status": group.done()})
                state["conns"].discard(conn)
                conn.sock.close()


def fork(conn, line, state, children):
    try:
        req = json.loads(line)
        flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC
        out_fd = os.open(req["stdout"], flags)
        err_fd = os.open(req["stderr"], flags)
        os.set_blocking(out_fd, True)
        os.set_blocking(err_fd, True)
    except BaseException as e:  # noqa: BLE001
        send_line(conn, {"error": "%s: %s" % (type(e).__name__, e)})
        state["conns"].discard(conn)
        conn.sock.close()
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    ranks = int(req.get("ranks") or 1)
    rank_env = req.get("rank_env") or [{}] * ranks
    pgid = None
    pids = {}
    for rank in range(ranks):
        try:
            pid = os.fork()
        except OSError as e:
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                    os.waitpid(p, 0)
                except OSError:
                    pass
            os.close(out_fd)
            os.close(err_fd)
            send_line(conn, {"error": "fork: %s" % e})
            state["conns"].discard(conn)
            conn.sock.close()
            return None
        if pid == 0:
            child_setup(state, pgid)
            # A one-process job gets a Landlock domain of its own (see
            # own_domain), entered once its output goes to the job.
            req["own_domain"] = ranks == 1
            req["env"].update(rank_env[rank])
            req["rank"] = rank
            return (req, out_fd, err_fd)
        if pgid is None:
            pgid = pid
        try:
            os.setpgid(pid, pgid)
        except OSError:
            pass  # the child did it first, or already exited
        pids[pid] = rank
    os.close(out_fd)
    keep_err = None
    if ranks > 1:
        keep_err = err_fd
        state["held"].add(err_fd)
    else:
        os.close(err_fd)
    conn.pid = pgid
    group = Group(conn, pgid, pids, keep_err)
    for pid in pids:
        children[pid] = group
    send_line(conn, {"pid": pgid})
    return None


def child_setup(state, pgid):
    """In the forked child: leave the zygote's group (for a group of its
    own, or rank 0's), signals and files."""
    try:
        os.setpgid(0, pgid or 0)
    except OSError:
        pass
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    state["sel"].close()
    state["listener"].close()
    for conn in state["conns"]:
        conn.sock.close()
    for fd in state["wake"]:
        os.close(fd)
    for fd in state["held"]:
        os.close(fd)


# Landlock's filesystem rights (linux/landlock.h): the write rights of ABI 1
# but making block devices, which no job is granted; truncating (ABI 3);
# moving a file to another folder (ABI 2), which every rule set refuses
# unless a rule allows it.
FS_WRITE_FILE = 1 << 1
FS_WRITE = FS_WRITE_FILE | sum(1 << b for b in (4, 5, 6, 7, 8, 9, 10, 12))
FS_MAKE_BLOCK = 1 << 11
FS_REFER = 1 << 13
FS_TRUNCATE = 1 << 14


class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def own_domain(write_beneath=None):
    """A one-process job of a jailed zygote enters a Landlock domain of its
    own, nested in the zygote's: the other jobs this zygote forks cannot
    read its /proc/PID/environ, mem or fd, nor it theirs (issue #38). It
    handles making block devices (refused everywhere) and moving files
    between folders (allowed everywhere). With `write_beneath` (pairs of a
    path and whether it is a folder, from the worker) it also handles every
    write right and grants it only below those paths: a warm test writes
    its checkout, its scratch folder and what lies outside the worker's
    workspace, not the workspace's other jobs or code store, as a cold one
    (issue #39). The ranks of one job stay in one domain (they share GPU
    memory by file descriptor). Only under fvd's jail (no_new_privs set); a
    kernel without Landlock leaves the child as it was."""
    try:
        with open("/proc/self/status") as f:
            if "NoNewPrivs:\t1" not in f.read():
                return
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        # landlock_create_ruleset, landlock_add_rule, landlock_restrict_self:
        # one number on every architecture.
        abi = libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
        if abi < 1:
            return
        handled = FS_MAKE_BLOCK
        if abi >= 2:
            handled |= FS_REFER
        confine = write_beneath is not None
        truncate = FS_TRUNCATE if abi >= 3 else 0
        if confine:
            handled |= FS_WRITE | truncate
        attr = ctypes.c_uint64(handled)
        fd = libc.syscall(444, ctypes.byref(attr), ctypes.c_size_t(8), ctypes.c_uint32(0))
        if fd < 0:
            return
        rules = []
        if abi >= 2:
            rules.append(("/", FS_REFER))
        if confine:
            for path, folder in write_beneath:
                rules.append((path, FS_WRITE | truncate if folder else FS_WRITE_FILE | truncate))
        for path, rights in rules:
            try:
                parent = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # gone since the worker listed it: nothing to grant
            rule = PathBeneath(rights, parent)
            done = libc.syscall(445, ctypes.c_int(fd), ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0))
            os.close(parent)
            if done != 0:
                os.close(fd)
                raise OSError(ctypes.get_errno(), "landlock_add_rule " + path)
        if libc.syscall(446, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            os.close(fd)
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
        os.close(fd)
    except (OSError, AttributeError) as e:
        if write_beneath is not None:
            # A confinement that cannot be set up is not a run without it:
            # the job ends as a cold one whose jail failed.
            os.write(2, ("fvd: jail: the warm run's write rules cannot be set up: %s\n" % e).encode())
            os._exit(125)


def run_child(req, out_fd, err_fd):
    """Becomes the job: its fds, environment, folder and sys.path, then
    pytest.main with the cold command's arguments; exits with its code."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.close(out_fd)
    os.close(err_fd)
    if req.get("own_domain"):
        own_domain(req.get("write_beneath"))
    os.environ.clear()
    os.environ.update(req["env"])
    cwd = req["cwd"]
    os.chdir(cwd)
    cwd = os.getcwd()
    # sys.path as `python -m pytest` in this folder would have it: the
    # folder first (unless PYTHONSAFEPATH), then the job's PYTHONPATH entries
    # the zygote's own environment did not have (the pytest plugin's folder).
    front = [] if req.get("safe_path") else [cwd]
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and entry not in sys.path and entry not in front:
            front.append(os.path.abspath(entry))
    sys.path[0:0] = front
    # Only preload modules were imported; a module of the checkout in the
    # cache would hide an edit, so none may stay (tests/e2e/warm.rs).
    root = os.path.join(cwd, "")
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if isinstance(f, str) and os.path.abspath(f).startswith(root):
            del sys.modules[name]
    import importlib

    importlib.invalidate_caches()
    if req.get("no_bytecode"):
        sys.dont_write_bytecode = True
    import pytest

    args = list(req["args"])
    if req.get("rank", 0) > 0:
        args = without_junit(args)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    chosen = req.get("rank_env") or os.environ.get("FVD_RUN_THREADS") == threads
    if chosen and threads.isdigit() and int(threads) > 0 and torch is not None:
        # The zygote's import sized torch's pool; torchrun's count for a
        # rank and the worker's for a run sharing its GPU are no zygote
        # keys, so the child applies them.
        torch.set_num_threads(int(threads))
    sys.argv = [os.path.join(os.path.dirname(pytest.__file__), "__main__.py")] + args
    try:
        code = pytest.main(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finish(int(code))


def finish(code):
    """Ends the child with `code` once pytest has returned. What a normal
    exit would still do that matters (atexit handlers: logging, coverage,
    multiprocessing, weakref finalizers; the buffers of files left open)
    is done here, then os._exit skips finalisation and CUDA's teardown; the
    kernel frees the process's memory and GPU context either way. A
    non-daemon thread (a normal exit waits for it) or a live
    torch.distributed process group (its destructor talks to the other
    ranks) keeps the normal exit."""
    import threading

    main = threading.main_thread()
    waiting = [t for t in threading.enumerate() if t is not main and not t.daemon and t.is_alive()]
    dist = sys.modules.get("torch.distributed")
    try:
        group = dist is not None and dist.is_available() and dist.is_initialized()
    except BaseException:  # noqa: BLE001 - unsure: exit normally
        group = True
    if waiting or group:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.exit(code)
    import atexit

    atexit._run_exitfuncs()
    # As Python's own exit: standard streams first (a failed flush makes
    # the status 120), then every other file, in close_left_open.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            if code == 0:
                code = 120
    close_left_open()
    os._exit(code)


def close_left_open():
    """Closes the files this child opened and left open, outer layers (text)
    before the buffers and raw files they wrap, so a buffered write reaches
    its file as it would when finalisation frees the object. The zygote's
    objects are frozen (gc.freeze), so gc.get_objects() holds the child's
    alone; the standard streams are left to the kernel."""
    import _io

    std = {id(s) for s in (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__)}
    files = [o for o in gc.get_objects() if isinstance(o, _io._IOBase) and id(o) not in std]
    layers = (_io._TextIOBase, _io._BufferedIOBase, _io._RawIOBase, _io._IOBase)
    for layer in layers:
        for f in files:
            if isinstance(f, layer):
                try:
                    if not f.closed:
                        f.close()
                except BaseException:  # noqa: BLE001 - as a finaliser, ignore it
                    pass


def without_junit(args):
    """pytest's arguments less its JUnit report (rank 0 alone writes it)."""
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("--junitxml", "--junit-xml", "--junit_xml"):
            skip = True
            continue
        if a.split("=", 1)[0] in ("--junitxml", "--junit-xml", "--junit_xml"):
            continue
        out.append(a)
    return out


if __name__ == "__main__":
    # The folder of this file: nothing to import there. (Done here, not at
    # import: multiprocessing's spawn re-imports a child's main module.)
    sys.path.pop(0)
    socket_path = sys.argv[1]
    preload(sys.argv[2:])
    forked = serve(socket_path)
    if forked is not None:
        run_child(*forked)
