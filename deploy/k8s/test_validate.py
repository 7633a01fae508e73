"""validate.py passes fvd's manifests and fails broken copies of them."""

import shutil
from pathlib import Path

import pytest

import validate

HERE = Path(__file__).resolve().parent


def test_the_manifests_are_valid():
    count, problems = validate.validate(HERE)
    assert problems == []
    assert count >= 5


def broken(tmp_path: Path, name: str, old: str, new: str) -> Path:
    folder = tmp_path / "k8s"
    shutil.copytree(HERE, folder, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    path = folder / name
    text = path.read_text()
    assert old in text, f"{old!r} not in {name}"
    path.write_text(text.replace(old, new, 1))
    return folder


@pytest.mark.parametrize(
    "name, old, new, expected",
    [
        # a misspelt field: only the strict schema check sees it
        ("orchestrator.yaml", "periodSeconds: 5", "periodSecond: 5", "'periodSecond' was unexpected"),
        # a wrong type
        ("worker.yaml", "terminationGracePeriodSeconds: 3900", "terminationGracePeriodSeconds: soon", "terminationGracePeriodSeconds"),
        # a probe that asks a port nothing serves
        ("worker.yaml", "port: 7072\n              service: liveness", "port: 7073\n              service: liveness", "asks port 7073"),
        # a worker that dials another namespace
        ("worker.yaml", "fvd-orchestrator.fvd.svc", "fvd-orchestrator.other.svc", "is not a Service of namespace fvd"),
        # a drain that does not wait
        ("worker.yaml", ', "--wait"]', "]", "without --wait"),
        # a manifest kustomize would not apply
        ("kustomization.yaml", "  - repos.yaml\n", "", "repos.yaml is not listed"),
    ],
)
def test_a_broken_manifest_is_refused(tmp_path, name, old, new, expected):
    _, problems = validate.validate(broken(tmp_path, name, old, new))
    assert any(expected in p for p in problems), problems
