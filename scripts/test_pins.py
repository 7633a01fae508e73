"""scripts/pins.py's check finds each kind of finding it promises, on small
repositories written here, and passes a clean one."""

import textwrap
from pathlib import Path

import pytest

import pins

HASH = "    --hash=sha256:" + "0" * 64


def lock_pair(root: Path, stem: str, requirements: str, pins_: dict[str, str], hashed=True):
    (root / stem).parent.mkdir(parents=True, exist_ok=True)
    (root / f"{stem}.in").write_text(textwrap.dedent(requirements))
    lines = []
    for name, version in pins_.items():
        lines.append(f"{name}=={version}" + (" \\" if hashed else ""))
        if hashed:
            lines.append(HASH)
    (root / f"{stem}.txt").write_text("# locked\n" + "\n".join(lines) + "\n")


@pytest.fixture
def repo(tmp_path):
    lock_pair(tmp_path, "requirements-dev", "numpy>=1.26\npytest>=8\n",
              {"numpy": "2.4.6", "pytest": "9.2.0", "packaging": "26.4"})
    lock_pair(tmp_path, "deploy/k8s/requirements", "kubernetes-validate==1.37.0\n",
              {"kubernetes-validate": "1.37.0", "pyyaml": "6.0.4", "packaging": "26.4"})
    lock_pair(tmp_path, "bench/requirements", "ray>=2,<3\n", {"ray": "2.60.0"})
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("import json\nimport numpy as np\nimport helper\n")
    (tmp_path / "tests" / "helper.py").write_text("from pytest import fixture\n")
    (tmp_path / "bench" / "b.py").write_text("import ray\nimport torch\n")
    return tmp_path


def run(root, capsys):
    code = pins.check(root)
    return code, capsys.readouterr().out


def test_a_clean_repository_passes(repo, capsys):
    code, out = run(repo, capsys)
    assert code == 0, out
    assert "3 locks" in out


def test_an_unpinned_import_is_named_with_its_line(repo, capsys):
    (repo / "tests" / "test_b.py").write_text("import os\n\nimport requests\n")
    code, out = run(repo, capsys)
    assert code == 1
    assert "tests/test_b.py:3: imports requests (requests)" in out


def test_a_bench_package_is_not_pinned_for_the_tests(repo, capsys):
    (repo / "tests" / "test_c.py").write_text("import ray\n")
    code, out = run(repo, capsys)
    assert code == 1 and "tests/test_c.py:1: imports ray" in out


def test_a_gpu_machine_package_is_allowed_only_where_it_runs(repo, capsys):
    (repo / "tests" / "test_d.py").write_text("import torch\n")
    code, out = run(repo, capsys)
    assert code == 1 and "tests/test_d.py:1: imports torch" in out


def test_a_requirement_the_lock_lacks(repo, capsys):
    (repo / "requirements-dev.in").write_text("numpy>=1.26\npytest>=8\nsafetensors>=0.4\n")
    code, out = run(repo, capsys)
    assert code == 1
    assert "requirements-dev.txt: does not pin safetensors (requirements-dev.in requires it)" in out


def test_a_pin_without_a_hash(repo, capsys):
    lock_pair(repo, "bench/requirements", "ray>=2,<3\n", {"ray": "2.60.0"}, hashed=False)
    code, out = run(repo, capsys)
    assert code == 1 and "bench/requirements.txt: ray has no --hash" in out


def test_a_pin_outside_its_specifier(repo, capsys):
    (repo / "requirements-dev.in").write_text("numpy<2\npytest>=8\n")
    code, out = run(repo, capsys)
    assert code == 1 and "pins numpy==2.4.6, outside '<2'" in out


def test_two_locks_of_one_interpreter_disagree(repo, capsys):
    lock_pair(repo, "deploy/k8s/requirements", "kubernetes-validate==1.37.0\n",
              {"kubernetes-validate": "1.37.0", "packaging": "25.0"})
    code, out = run(repo, capsys)
    assert code == 1
    assert "packaging is pinned to 26.4 by requirements-dev.txt and to 25.0" in out


def test_a_missing_lock_file(repo, capsys):
    (repo / "bench" / "requirements.txt").unlink()
    code, out = run(repo, capsys)
    assert code == 1 and "bench/requirements.txt: missing" in out
