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


def turned_on(folder: Path, component: str) -> Path:
    """The operator's edit README.md asks for: a component turned on."""
    path = folder / "kustomization.yaml"
    text = path.read_text()
    old = f"# components:\n#   - {component} "
    assert old in text
    path.write_text(text.replace(old, f"components:\n  - {component} ", 1))
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
        # Pod Security: a workspace on the node's disk fails baseline
        ("worker.yaml", "emptyDir:\n            sizeLimit: 100Gi", "hostPath:\n            path: /scratch/fvd",
         "baseline: hostPath volumes: volume scratch"),
        # Pod Security: no seccomp profile fails restricted
        ("orchestrator.yaml", "        seccompProfile:\n          type: RuntimeDefault\n", "", "restricted: seccomp"),
        ("worker.yaml", "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true", "restricted: privilege escalation"),
        ("namespace.yaml", "pod-security.kubernetes.io/enforce: restricted", "team: fvd", "no pod-security.kubernetes.io/enforce"),
        # the GPU patch must hit the worker's limit
        ("kustomization.yaml", "limits/nvidia.com~1gpu", "limits/nvidia.com~1gpus", "0 patch values set the GPUs"),
        # ... and be the only GPU count: a request beside the limit is a second one
        ("worker.yaml", "            limits:\n", "              nvidia.com/gpu: 8\n            limits:\n",
         "requests 8 GPUs beside its limit"),
        # a resource kustomize cannot find: its refusal is reported
        ("kustomization.yaml", "  - worker.yaml\n", "  - workers.yaml\n", "kubectl kustomize refused it"),
        # a patch kustomize cannot apply
        ("kustomization.yaml", "name: fvd-worker\n    patch", "name: fvd-workers\n    patch", "0 patch values set the GPUs"),
        ("kustomization.yaml", "path: /spec/template/spec/containers/0/resources/limits/nvidia.com~1gpu",
         "path: /spec/template/spec/containers/0/resources/limits", "resources/limits: 1 is not of type"),
        # a worker on every GPU node, labelled or not
        ("worker.yaml", '        fvd.dev/worker: "true"\n', "", "lacks fvd.dev/worker"),
        # an image without a registry: ImagePullBackOff from Docker Hub
        ("kustomization.yaml", "newName: registry.example.com/fvd/fvd-worker", "newName: fvd-worker",
         "names no registry"),
        # a claim by default: Pending where no provisioner makes it
        ("worker.yaml", "      volumes:\n", "      volumes:\n        - name: weights\n          persistentVolumeClaim:\n"
         "            claimName: fvd-repos\n", "mounts claim fvd-repos by default"),
        ("repos.yaml", '["ReadWriteOnce"]', '["ReadOnlyMany"]', "most provisioners cannot make it"),
        # per-role credentials: --auth, from a mounted Secret
        ("orchestrator.yaml", "- --auth=/etc/fvd/auth/auth.toml", "- --token-file=/etc/fvd/auth/auth.toml",
         "without --auth"),
        ("orchestrator.yaml", "mountPath: /etc/fvd/auth", "mountPath: /etc/fvd/creds", "--auth /etc/fvd/auth/auth.toml is on no mounted volume"),
        ("orchestrator.yaml", "- key: auth.toml\n                path: auth.toml", "- key: auth.toml\n                path: creds.toml",
         "mounted without a key at auth.toml"),
        ("worker.yaml", "secretName: fvd-worker-token", "secretName: fvd-auth", "the orchestrator's credentials"),
        # what the API server would refuse: a volume twice
        ("worker.yaml", "      volumes:\n", "      volumes:\n        - name: shm\n          emptyDir: {}\n",
         "volume shm is defined twice"),
        # the weights component must mount what it says
        ("components/weights/kustomization.yaml", "mountPath: /weights\n          readOnly: true",
         "mountPath: /weights", "is not mounted read-only"),
        ("components/weights/kustomization.yaml", "path: /spec/template/spec/volumes/-\n",
         "path: /spec/template/spec/volume/-\n", "components/weights"),
        # the dashboard refuses a Host it was not told of
        ("orchestrator.yaml", "--dashboard-host=fvd.example.com", "--dashboard-host=other.example.com", "host fvd.example.com is not a --dashboard-host"),
        # the dashboard Ingress must reach a Service port
        ("optional/dashboard-ingress.yaml", "name: fvd-dashboard\n                port", "name: fvd-dash\n                port", "backend Service fvd-dash is not defined"),
    ],
)
def test_a_broken_manifest_is_refused(tmp_path, name, old, new, expected):
    _, problems = validate.validate(broken(tmp_path, name, old, new))
    assert any(expected in p for p in problems), problems


def test_the_placeholder_registry_passes_with_a_note_and_fails_ready():
    count, problems, notes = validate.check(HERE)
    assert problems == [] and len(notes) == 2, notes
    _, problems, _ = validate.check(HERE, ready=True)
    assert len(problems) == 2 and all("placeholder registry" in p for p in problems), problems


def test_an_operators_registry_passes_ready(tmp_path):
    folder = broken(tmp_path, "kustomization.yaml", "registry.example.com/fvd/fvd-worker", "ghcr.io/lab/fvd-worker")
    kust = folder / "kustomization.yaml"
    kust.write_text(kust.read_text().replace("registry.example.com/fvd/", "localhost:5000/fvd/"))
    count, problems, notes = validate.check(folder, ready=True)
    assert problems == [] and notes == [], problems
    images = {c["image"] for _, _, d in validate.load(folder)[0] if d.get("kind") in ("StatefulSet", "DaemonSet")
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {"ghcr.io/lab/fvd-worker:0.1.0", "localhost:5000/fvd/fvd-orchestrator:0.1.0"}


def test_no_claim_by_default_and_the_weights_component_mounts_one(tmp_path):
    docs, problems = validate.load(HERE)
    assert problems == []
    worker = next(d for _, _, d in docs if d.get("kind") == "DaemonSet")
    assert not any("persistentVolumeClaim" in v for v in worker["spec"]["template"]["spec"]["volumes"])
    folder = turned_on(broken(tmp_path, "kustomization.yaml", "namespace: fvd", "namespace: fvd"), "components/weights")
    count, problems = validate.validate(folder, ready=False)
    assert problems == []
    docs, _ = validate.load(folder)
    worker = next(d for _, _, d in docs if d.get("kind") == "DaemonSet")
    claims = [v["persistentVolumeClaim"] for v in worker["spec"]["template"]["spec"]["volumes"]
              if "persistentVolumeClaim" in v]
    assert claims == [{"claimName": "fvd-weights", "readOnly": True}]


def test_the_gpu_count_of_the_kustomization_is_what_is_checked(tmp_path):
    folder = broken(tmp_path, "kustomization.yaml", "value: 1\n", "value: 4\n")
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
