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
        # Pod Security: weights from the node's disk fail baseline
        ("worker.yaml", "persistentVolumeClaim:\n            claimName: fvd-weights\n            readOnly: true",
         "hostPath:\n            path: /data/fvd-weights", "baseline: hostPath volumes: volume weights"),
        # Pod Security: no seccomp profile fails restricted
        ("orchestrator.yaml", "        seccompProfile:\n          type: RuntimeDefault\n", "", "restricted: seccomp"),
        ("worker.yaml", "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true", "restricted: privilege escalation"),
        ("namespace.yaml", "pod-security.kubernetes.io/enforce: restricted", "team: fvd", "no pod-security.kubernetes.io/enforce"),
        # the GPU patch must hit the worker's limit
        ("kustomization.yaml", "limits/nvidia.com~1gpu", "limits/nvidia.com~1gpus", "is not in DaemonSet fvd-worker"),
        # the dashboard Ingress must reach a Service port
        ("optional/dashboard-ingress.yaml", "name: fvd-dashboard\n                port", "name: fvd-dash\n                port", "backend Service fvd-dash is not defined"),
    ],
)
def test_a_broken_manifest_is_refused(tmp_path, name, old, new, expected):
    _, problems = validate.validate(broken(tmp_path, name, old, new))
    assert any(expected in p for p in problems), problems


def test_the_gpu_count_of_the_kustomization_is_what_is_checked(tmp_path):
    folder = broken(tmp_path, "kustomization.yaml", "value: 8", "value: 4")
    docs, problems = validate.load(folder)
    assert problems == []
    worker = next(d for _, _, d in docs if d.get("kind") == "DaemonSet")
    limits = worker["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 4


def test_pod_security_levels():
    import pod_security

    pod = {
        "hostNetwork": True,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "volumes": [{"name": "data", "nfs": {"server": "x", "path": "/"}}],
        "containers": [{
            "name": "c",
            "securityContext": {"privileged": True, "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}},
        }],
    }
    baseline = pod_security.problems(pod, "baseline")
    assert any("host namespaces" in p for p in baseline)
    assert any("privileged containers" in p for p in baseline)
    assert any("adds ['SYS_ADMIN']" in p for p in baseline)
    # nfs passes baseline but not restricted
    assert not any("volume types" in p for p in baseline)
    restricted = pod_security.problems(pod, "restricted")
    assert any("volume types: volume data is ['nfs']" in p for p in restricted)
    assert pod_security.problems(pod, "privileged") == []
    fixed = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "x"}}],
        "containers": [{"name": "c", "securityContext": {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
    }
    assert pod_security.problems(fixed, "restricted") == []
