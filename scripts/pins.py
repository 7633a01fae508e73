#!/usr/bin/env python3
"""The project's Python pins: lock files, and the check that they cover
what the repository's Python code imports.

Each lock is a pair: `NAME.in` holds the loose requirements a person edits,
`NAME.txt` the same set locked by pip-compile (exact versions, a hash for
every file of each version), which is what the README's commands install.

    python3 scripts/pins.py check     # exit 1 with one line per finding
    python3 scripts/pins.py refresh   # re-lock every .in (needs PyPI)

`check` reads every lock pair and every `.py` file of the scanned folders
below, and finds:
- a requirement of a `.in` that its `.txt` does not pin, a pin without a
  hash, or a pin that does not satisfy the `.in`'s specifier;
- a package that two locks installed into one interpreter pin differently;
- an import (file:line) of a package that is neither in the standard
  library, nor the repository's own code, nor pinned by the lock that folder
  runs under, nor listed below as provided by the machine it runs on.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# pip-compile's version, so that a refresh writes the same file layout.
PIP_TOOLS = "pip-tools==7.6.2"
COMPILE_FLAGS = ["--quiet", "--generate-hashes", "--allow-unsafe", "--strip-extras",
                 "--no-emit-index-url", "--no-emit-find-links"]

# The lock files, by the name the scanned folders use below.
LOCKS = {
    "dev": "requirements-dev",
    "k8s": "deploy/k8s/requirements",
    "bench": "bench/requirements",
}
# Locks installed into the same interpreter (scripts/test.sh installs both
# into the machine's python3): a package they share must have one version.
SHARED_INTERPRETER = [("dev", "k8s")]

# Packages that come with the machine a folder's code runs on, not from a
# lock: the GPU machines' images carry torch and transformers.
GPU_MACHINE = {"torch", "transformers"}

# Which locks (and machine packages) each folder's code runs under. The
# first matching prefix wins; a folder not listed is not scanned, and says
# why in SKIPPED.
SCANNED = [
    ("examples/gpuport/", {"dev"}, GPU_MACHINE),
    ("examples/tinyport/", {"dev"}, set()),
    ("bench/", {"dev", "bench"}, GPU_MACHINE),
    ("deploy/k8s/", {"k8s", "dev"}, set()),
    ("deploy/", {"dev"}, set()),
    ("python/", {"dev"}, GPU_MACHINE),
    ("scripts/", {"dev"}, set()),
    ("tests/", {"dev"}, set()),
    ("worker/tests/", {"dev"}, set()),
]
SKIPPED = {
    # FastVideo's own port folders, kept as inputs of the init and contract
    # tests: fvd parses them and runs them only to see them fail on an
    # environment without torch.
    "tests/fixtures/fastvideo/": "FastVideo's files, inputs the tests read",
    "target/": "build output",
    "fuzz/": "fuzz corpora",
}
# Imports that fail on purpose: each names the file and why.
MISSING_ON_PURPOSE = {
    ("worker/tests/pytest_cases/test_collect_error.py", "fvd_module_that_does_not_exist"):
        "the collection-error case of the worker's verdict tests",
    ("examples/tinyport/official/tinyport_official/vae.py", "tinyport_private_ops"):
        "the example's vae skips on a private dependency no one can install",
}
# Import names whose distribution is named otherwise, for packages that are
# not installed where the check runs (an installed one is looked up).
DISTRIBUTION_OF = {"yaml": "pyyaml", "kubernetes_validate": "kubernetes-validate"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Lock:
    name: str
    stem: Path
    src: str  # the .in and .txt, relative to the repository
    out: str
    requirements: dict[str, str] = field(default_factory=dict)  # name -> specifier
    pins: dict[str, str] = field(default_factory=dict)  # name -> version
    unhashed: list[str] = field(default_factory=list)


REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*?)\s*(#.*)?$")


def read_lock(root: Path, name: str, stem: str, findings: list[str]) -> Lock | None:
    lock = Lock(name, root / stem, f"{stem}.in", f"{stem}.txt")
    src, out = root / lock.src, root / lock.out
    for path, shown in ((src, lock.src), (out, lock.out)):
        if not path.is_file():
            findings.append(f"{shown}: missing (lock {name!r})")
            return None
    for n, line in enumerate(src.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = REQ.match(line)
        if not m:
            findings.append(f"{lock.src}:{n}: not a requirement: {line.strip()}")
            continue
        lock.requirements[normalize(m.group(1))] = m.group(3).split(";")[0].strip()
    # pip-compile's layout: `name==version \` then `--hash=...` lines.
    text = out.read_text(encoding="utf-8")
    current = None
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("--hash="):
            if current is None:
                findings.append(f"{lock.out}:{n}: a hash before any pin")
            else:
                current[1] = True
            continue
        if stripped.startswith("-"):
            findings.append(f"{lock.out}:{n}: an option the lock must not carry: {stripped}")
            continue
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", stripped)
        if not m:
            findings.append(f"{lock.out}:{n}: not an exact pin: {stripped}")
            continue
        if current is not None and not current[1]:
            lock.unhashed.append(current[0])
        current = [normalize(m.group(1)), False]
        lock.pins[current[0]] = m.group(2)
    if current is not None and not current[1]:
        lock.unhashed.append(current[0])
    return lock


def satisfies(version: str, spec: str) -> bool | None:
    """Whether `version` meets `spec`; None when packaging is unavailable."""
    if not spec:
        return True
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:
        return None
    return SpecifierSet(spec).contains(version, prereleases=True)


def check_locks(locks: dict[str, Lock], findings: list[str]) -> None:
    for lock in locks.values():
        txt = lock.out
        for req, spec in lock.requirements.items():
            if req not in lock.pins:
                findings.append(f"{txt}: does not pin {req} ({lock.src} requires it)"
                                f": run `python3 scripts/pins.py refresh`")
            elif satisfies(lock.pins[req], spec) is False:
                findings.append(f"{txt}: pins {req}=={lock.pins[req]}, outside {spec!r} "
                                f"of {lock.src}")
        for name in lock.unhashed:
            findings.append(f"{txt}: {name} has no --hash")
    for a, b in SHARED_INTERPRETER:
        if a not in locks or b not in locks:
            continue
        for name in sorted(set(locks[a].pins) & set(locks[b].pins)):
            if locks[a].pins[name] != locks[b].pins[name]:
                findings.append(
                    f"{name} is pinned to {locks[a].pins[name]} by {locks[a].out} and to "
                    f"{locks[b].pins[name]} by {locks[b].out}, which install into one "
                    f"interpreter")


def local_modules(root: Path) -> set[str]:
    """Every module or package name the repository defines itself."""
    names = set()
    for path in root.rglob("*.py"):
        if any(part in ("target", ".git") for part in path.relative_to(root).parts):
            continue
        names.add(path.stem)
        for parent in path.relative_to(root).parents:
            if parent.name:
                names.add(parent.name)
    return names


def distribution_of(module: str) -> str:
    try:
        from importlib.metadata import packages_distributions
        dists = packages_distributions().get(module)
    except Exception:  # noqa: BLE001 - an odd site-packages must not hide findings
        dists = None
    if dists:
        return normalize(dists[0])
    return normalize(DISTRIBUTION_OF.get(module, module))


def imports(path: Path):
    """(line, top-level module) of every absolute import in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def check_imports(root: Path, locks: dict[str, Lock], findings: list[str]) -> int:
    local = local_modules(root)
    stdlib = set(sys.stdlib_module_names)
    scanned = 0
    for path in sorted(root.rglob("*.py")):
        relpath = path.relative_to(root).as_posix()
        if relpath.startswith(".git/") or any(relpath.startswith(s) for s in SKIPPED):
            continue
        rule = next((r for r in SCANNED if relpath.startswith(r[0])), None)
        if rule is None:
            continue
        _, lock_names, machine = rule
        pinned = set().union(*(locks[n].pins for n in lock_names if n in locks))
        scanned += 1
        try:
            found = list(imports(path))
        except SyntaxError as e:
            findings.append(f"{relpath}:{e.lineno}: cannot be parsed: {e.msg}")
            continue
        for line, module in found:
            if module in stdlib or module in local or module in machine:
                continue
            if (relpath, module) in MISSING_ON_PURPOSE:
                continue
            dist = distribution_of(module)
            if dist not in pinned:
                locks_named = ", ".join(sorted(f"{LOCKS[n]}.txt" for n in lock_names))
                findings.append(f"{relpath}:{line}: imports {module} ({dist}), which no lock "
                                f"this folder runs under pins ({locks_named})")
    return scanned


def check(root: Path) -> int:
    findings: list[str] = []
    locks = {}
    for name, stem in LOCKS.items():
        lock = read_lock(root, name, stem, findings)
        if lock is not None:
            locks[name] = lock
    check_locks(locks, findings)
    scanned = check_imports(root, locks, findings)
    for f in findings:
        print(f"pins: {f}")
    if findings:
        print(f"pins: {len(findings)} finding(s)")
        return 1
    pinned = sum(len(lock.pins) for lock in locks.values())
    print(f"pins: {len(locks)} locks ({pinned} pins) cover the imports of {scanned} files")
    return 0


def refresh(root: Path) -> int:
    """Re-locks every .in with a pinned pip-tools in a venv of its own."""
    with tempfile.TemporaryDirectory(prefix="fvd-pins-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        py = venv / "bin" / "python"
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", PIP_TOOLS], check=True)
        for stem in LOCKS.values():
            folder, base = (root / stem).parent, Path(stem).name
            print(f"pins: locking {stem}.in -> {stem}.txt", flush=True)
            subprocess.run([str(venv / "bin" / "pip-compile"), *COMPILE_FLAGS, "--upgrade",
                            "-o", f"{base}.txt", f"{base}.in"], cwd=folder, check=True,
                           env={**os.environ, "CUSTOM_COMPILE_COMMAND": "python3 scripts/pins.py refresh"})
    return check(root)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("check", "refresh"))
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    return check(root) if args.command == "check" else refresh(root)


if __name__ == "__main__":
    sys.exit(main())
