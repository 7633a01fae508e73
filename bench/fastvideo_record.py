#!/usr/bin/env python3
"""The porter's record on a FastVideo checkout, every family with a
PORT_STATUS.md, through the sequences a real port goes through.

For each family, in a clone of the checkout: `fvd init`, the placeholders
filled as a porter would (each option's first word, a stand-in test at a
parity test's conventional path), every test the spec runs replaced by a
CPU stand-in at its real path, file and test names (torch absent: a test
passes, fails numerically or fails on the environment as the file's `MODE`
line, which the script edits and commits, says; where a test lies under
fastvideo/, the package's and its tests' torch-importing `__init__`/
`conftest` are emptied), a fake `nvidia-smi` offering one GPU, then
`fvd submit --dry-run` and four submits, each on a commit of its own:

  pass     every stand-in passes
  red      the spec's first component fails numerically (a regression?)
  env      the porter's fix, whose run fails on the environment (exit 4,
           the file untouched?)
  fixed    the fix passes (Current Phase back to the porter's?)

It prints what init wrote ([prep] values, placeholders, unknowns) and the
pipeline and quality tests it wired, then the sequence: the phases the dry
run shows, exit codes, whether the red run is a regression, whether the
environment failure left the file byte for byte, the porter's words missing
once the fix passed (a multiset of whitespace-separated words, quotes and
punctuation around them aside) and those away at a step before it (a cell
fvd filled and gives back), and whether Current Phase after the fix is what
it was after the first pass. Outputs and files of every step are left in
the work folder.

    python3 bench/fastvideo_record.py --fvd target/debug/fvd \
        --checkout /tmp/fv --work /tmp/fvseq [--family F ...]

The checkout is a git repository at the commit to measure (FastVideo
2f3d40740). Nothing in it is changed; each family works in its own clone.
"""

import argparse
import collections
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

STANDIN = '''# CPU stand-in for {path} (fvd's bench/fastvideo_record.py): MODE
# says which test passes, fails numerically or meets a broken environment.
import pytest

MODE = {{}}


def _check(node):
    mode = MODE.get(node, MODE.get("*", "pass"))
    if mode == "env":
        raise OSError("libcudart.so.12: cannot open shared object file: No such file or directory")
    diff = 0.03125 if mode == "numeric" else 0.0
    assert diff <= 1e-5, f"max abs diff {{diff}} exceeds atol 1e-05"
'''

STANDIN_TEST = '''

def {name}():
    _check("{name}")
'''

STANDIN_PARAM = '''

@pytest.mark.parametrize("case", {ids!r})
def {name}(case):
    _check(f"{name}[{{case}}]")
'''

FAKE_SMI = "#!/bin/sh\necho '0, GPU-standin-0, stand-in GPU, 81920'\n"


def run(cmd, cwd, env=None):
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def git(repo, *args):
    rc, out = run(["git", "-c", "user.name=porter", "-c", "user.email=porter@example.org", *args], repo)
    if rc != 0:
        sys.exit(f"git {' '.join(args)} in {repo}: {out}")
    return out


def fill(hint, key, family):
    """What a porter fills a placeholder with."""
    if " | " in hint:
        return hint.split(" | ")[0].split()[0]
    h = hint.lower()
    if key == "PYTHONPATH" or "pythonpath" in h:
        return "{repo}"
    if "url" in h:
        return "https://example.org/official"
    if "hf id" in h:
        return "example/weights"
    if "weights are staged" in h:
        return f"official_weights/{family}"
    if "commit" in h:
        return "0123456789abcdef0123456789abcdef01234567"
    return "none"


def fill_spec(text, family):
    """Every `"<fill in: …>"` of the spec filled; the parity tests a
    placeholder names by convention."""
    made = []

    def one(m):
        hint = m.group(2)
        conv = re.search(r"by convention (\S+?\.py)", hint)
        if conv:
            made.append(conv.group(1))
            return f'{m.group(1)}"{conv.group(1)}"'
        return f'{m.group(1)}"{fill(hint, m.group(1).strip(" =").split()[-1], family)}"'

    text = re.sub(r'(\b[\w.]+ = )"<fill in: (.*?)>"', one, text)
    # a component type left open
    return text, made


def spec_tests(spec):
    comps = []
    for c in spec.get("component", []):
        t = c["parity_test"]
        comps.append((c["name"], [t] if isinstance(t, str) else list(t)))
    pipe = spec.get("pipeline", {})
    later = [pipe[k] for k in ("smoke_test", "parity_test") if k in pipe]
    return comps, later


def words(text):
    """Words as a person reads them: a value fvd quotes (`x` → "x") is
    the same word."""
    return collections.Counter(w.strip("`\"'.,;:()[]") for w in text.split())


def lost(original, now):
    """The porter's words missing from `now`, each with its count."""
    return dict(words(original) - words(now))


def section(text, title):
    m = re.search(rf"^## {title}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    return m.group(1) if m else None


def prep_counts(toml_text):
    prep = tomllib.loads(toml_text).get("prep", {})
    fills = sum(1 for v in prep.values() if isinstance(v, str) and v.startswith("<fill in"))
    unknown = sum(1 for v in prep.values() if v == "unknown")
    return len(prep) - fills - unknown, fills, unknown


def family_run(fvd, checkout, work, family, env):
    d = work / family
    if d.exists():
        shutil.rmtree(d)
    git(work, "clone", "-q", str(checkout), str(d))
    status_path = d / "tests/local_tests" / family / "PORT_STATUS.md"
    original = status_path.read_text()
    row = {"family": family}
    rc, out = run([fvd, "init", "--family", family, "--repo", str(d)], d, env)
    row["init_rc"] = rc
    spec_path = d / "tests/local_tests" / family / "port.toml"
    text = spec_path.read_text()
    row["prep_values"], row["prep_fill"], row["prep_unknown"] = prep_counts(text)
    pipe = tomllib.loads(text).get("pipeline", {})
    row["pipeline"] = {k: pipe.get(k) for k in ("smoke_test", "parity_test", "example")}
    row["quality"] = tomllib.loads(text).get("quality", {}).get("tests", [])
    text, made = fill_spec(text, family)
    spec_path.write_text(text)
    spec = tomllib.loads(text)
    comps, later = spec_tests(spec)
    nodes = collections.defaultdict(lambda: collections.defaultdict(list))
    for t in [t for _, ts in comps for t in ts] + later + made:
        path, _, node = t.partition("::")
        name, _, case = node.partition("[")
        ids = nodes[path][name or "test_" + re.sub(r"\W", "_", pathlib.Path(path).stem.removeprefix("test_"))]
        if case:
            ids.append(case.rstrip("]"))
    for path, names in nodes.items():
        f = d / path
        f.parent.mkdir(parents=True, exist_ok=True)
        body = STANDIN.format(path=path)
        for name, ids in names.items():
            if ids:
                body += STANDIN_PARAM.format(name=name, ids=sorted(set(ids)))
            else:
                body += STANDIN_TEST.format(name=name)
        f.write_text(body)
    if any(p.startswith("fastvideo/") for p in nodes):
        # torch is absent: the package and its tests' conftest import it
        (d / "fastvideo/__init__.py").write_text("")
        (d / "fastvideo/tests/conftest.py").write_text("")
    target = comps[0]
    row["red_component"] = target[0]

    def submit(step, mode):
        for t in target[1]:
            path, _, node = t.partition("::")
            f = d / path
            mode_line = f"MODE = {{{node or '*'!r}: {mode!r}}}"
            f.write_text(re.sub(r"^MODE = .*$", mode_line, f.read_text(), flags=re.M))
        git(d, "add", "-A")
        git(d, "commit", "-q", "--allow-empty", "-m", f"stand-in: {step}")
        rc, out = run([fvd, "submit", "--family", family, "--repo", str(d), "--wait", "--color", "never"], d, env)
        (work / f"{family}.{step}.out").write_text(out)
        now = status_path.read_text()
        (work / f"{family}.{step}.md").write_text(now)
        return rc, now

    git(d, "add", "-A")
    git(d, "commit", "-q", "-m", "fvd init, placeholders filled, CPU stand-ins")
    rc, out = run([fvd, "submit", "--family", family, "--repo", str(d), "--dry-run", "--color", "never"], d, env)
    (work / f"{family}.dry.out").write_text(out)
    row["dry_rc"] = rc
    row["dry_phases"] = [f"P{i}" for i in range(12) if f"gate P{i}: " in out]
    seq = {}
    for step, mode in (("pass", "pass"), ("red", "numeric"), ("env", "env"), ("fixed", "pass")):
        rc, now = submit(step, mode)
        seq[step] = {"rc": rc, "lost": lost(original, now), "text": now}
    row["rc"] = {k: v["rc"] for k, v in seq.items()}
    row["lost"] = sum(seq["fixed"]["lost"].values())
    row["away"] = {k: v["lost"] for k, v in seq.items() if v["lost"]}
    row["regression"] = "(regression)" in seq["red"]["text"]
    row["env_untouched"] = seq["env"]["text"] == seq["red"]["text"]
    phase = lambda t: section(t, "Current Phase")
    row["phase_back"] = phase(seq["fixed"]["text"]) == phase(seq["pass"]["text"])
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fvd", required=True)
    ap.add_argument("--checkout", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--family", action="append")
    a = ap.parse_args()
    fvd = str(pathlib.Path(a.fvd).resolve())
    checkout = pathlib.Path(a.checkout).resolve()
    work = pathlib.Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    families = a.family or sorted(
        p.parent.name for p in (checkout / "tests/local_tests").glob("*/PORT_STATUS.md")
    )
    smi = work / "bin/nvidia-smi"
    smi.parent.mkdir(exist_ok=True)
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    env = dict(os.environ, PATH=f"{smi.parent}:{os.environ['PATH']}", NO_COLOR="1")
    rows = [family_run(fvd, checkout, work, f, env) for f in families]
    print("| family | [prep] values | placeholders | unknown | pipeline smoke | parity | example | quality |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        p = r["pipeline"]
        print(f"| {r['family']} | {r['prep_values']} | {r['prep_fill']} | {r['prep_unknown']} | "
              f"{'yes' if p['smoke_test'] else 'no'} | {'yes' if p['parity_test'] else 'no'} | "
              f"{'yes' if p['example'] else 'no'} | {len(r['quality'])} |")
    print()
    print("| family | dry-run P0-P11 | red component | exit pass/red/env/fixed | regression | env: file untouched | words lost | phase back | words away mid-sequence |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rc = "/".join(str(r["rc"][k]) for k in ("pass", "red", "env", "fixed"))
        print(f"| {r['family']} | {len(r['dry_phases'])}/12 | {r['red_component']} | {rc} | "
              f"{'yes' if r['regression'] else 'NO'} | {'yes' if r['env_untouched'] else 'NO'} | "
              f"{r['lost']} | {'yes' if r['phase_back'] else 'NO'} | {r['away'] or ''} |")
    n = sum(r["regression"] for r in rows)
    print(f"\nregressions recognised: {n} of {len(rows)}; words lost: {sum(r['lost'] for r in rows)}")
    (work / "result.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
