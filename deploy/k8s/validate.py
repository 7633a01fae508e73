#!/usr/bin/env python3
"""Validates fvd's Kubernetes manifests offline.

1. Every document of every manifest kustomization.yaml lists is checked
   strictly (unknown fields are errors) against the Kubernetes API schemas
   that the `kubernetes-validate` package ships, for the oldest and the
   newest Kubernetes version fvd supports. Nothing is fetched.
2. kustomization.yaml lists every manifest of the folder, and only those.
3. The manifests agree with each other and with fvd's flags: each grpc
   probe asks the port its container's --health-listen serves, the worker
   dials the orchestrator Service's name, namespace and port, the preStop
   drain names the worker's --workspace, which is a mounted volume, every
   volume mount has its volume, every claim its PersistentVolumeClaim or
   claim template, every Service targetPort a container port.
4. Every pod template meets the Pod Security level its namespace enforces
   (`pod-security.kubernetes.io/enforce`, pod_security.py).
5. The examples in optional/ (not applied by kustomization.yaml) pass the
   same schema check, and each Ingress backend is a Service port above.

kustomization.yaml's `patches` (inline JSON 6902 patches) are applied to
the documents they target first, so what is checked is what kustomize
would apply.

Usage: python3 deploy/k8s/validate.py [FOLDER]; exit 1 with one line per
problem (file, document, path), 0 when there is none.
"""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import urlparse

import kubernetes_validate
import yaml

import pod_security

# grpc probes are GA from 1.27; 1.30 is the oldest release still commonly
# run, 1.37 the newest the schemas cover.
VERSIONS = ("1.30.0", "1.37.0")


def load(folder: Path) -> tuple[list[tuple[str, int, dict]], list[str]]:
    """The documents of the manifests kustomization.yaml lists, as
    (file, index, document), and the problems found on the way."""
    problems: list[str] = []
    kust_path = folder / "kustomization.yaml"
    try:
        kust = yaml.safe_load(kust_path.read_text())
    except (OSError, yaml.YAMLError) as e:
        return [], [f"{kust_path}: {e}"]
    listed = list(kust.get("resources") or [])
    present = sorted(
        p.name for p in folder.glob("*.yaml") if p.name != "kustomization.yaml"
    )
    for name in present:
        if name not in listed:
            problems.append(f"{kust_path}: {name} is not listed in resources")
    docs: list[tuple[str, int, dict]] = []
    for name in listed:
        path = folder / name
        try:
            loaded = list(yaml.safe_load_all(path.read_text()))
        except (OSError, yaml.YAMLError) as e:
            problems.append(f"{kust_path}: resource {name}: {e}")
            continue
        for i, doc in enumerate(loaded):
            if doc is None:
                continue
            if not isinstance(doc, dict):
                problems.append(f"{path}: document {i + 1} is not a mapping")
                continue
            docs.append((str(path), i + 1, doc))
    namespace = kust.get("namespace")
    if not namespace:
        problems.append(f"{kust_path}: no namespace")
    for n, patch in enumerate(kust.get("patches") or [], 1):
        problems += apply_patch(docs, patch, f"{kust_path}: patch {n}")
    return docs, problems


def apply_patch(docs: list[tuple[str, int, dict]], patch: dict, at: str) -> list[str]:
    """Applies one inline JSON 6902 patch of a kustomization to the
    documents its target names (kind and name); the problems, if any."""
    target = patch.get("target") or {}
    try:
        ops = yaml.safe_load(patch.get("patch") or "")
    except yaml.YAMLError as e:
        return [f"{at}: {e}"]
    if not isinstance(ops, list) or not target.get("kind") or not target.get("name"):
        return [f"{at}: only inline JSON 6902 patches with a target kind and name are checked"]
    hits = [d for _, _, d in docs
            if d.get("kind") == target["kind"] and d.get("metadata", {}).get("name") == target["name"]]
    if not hits:
        return [f"{at}: its target {target['kind']} {target['name']} is no document"]
    problems = []
    for doc in hits:
        for op in ops:
            path = [seg.replace("~1", "/").replace("~0", "~") for seg in op.get("path", "").split("/")[1:]]
            node = doc
            try:
                for seg in path[:-1]:
                    node = node[int(seg)] if isinstance(node, list) else node[seg]
                last = path[-1]
                if op.get("op") == "replace":
                    key = int(last) if isinstance(node, list) else last
                    node[key]  # noqa: B018 - replace needs the value to exist
                    node[key] = op["value"]
                elif op.get("op") == "add":
                    if isinstance(node, list):
                        node.insert(len(node) if last == "-" else int(last), op["value"])
                    else:
                        node[last] = op["value"]
                elif op.get("op") == "remove":
                    del node[int(last) if isinstance(node, list) else last]
                else:
                    problems.append(f"{at}: op {op.get('op')!r} is not checked here")
            except (KeyError, IndexError, ValueError, TypeError):
                problems.append(f"{at}: path {op.get('path')} is not in {target['kind']} {target['name']}")
    return problems


def schema_problems(docs: list[tuple[str, int, dict]]) -> list[str]:
    problems = []
    for path, i, doc in docs:
        for version in VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                where = "/".join(str(p) for p in e.path) or "(document)"
                problems.append(
                    f"{path}: document {i} ({doc.get('kind')}), Kubernetes {version}: "
                    f"{where}: {e.message}"
                )
            except (
                kubernetes_validate.SchemaNotFoundError,
                kubernetes_validate.InvalidSchemaError,
            ) as e:
                problems.append(f"{path}: document {i}, Kubernetes {version}: {e}")
    return problems


def flag(args: list[str], name: str) -> str | None:
    """The value of `--name=VALUE` or `--name VALUE` in an argv."""
    for j, a in enumerate(args):
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
        if a == f"--{name}" and j + 1 < len(args):
            return args[j + 1]
    return None


def pod_specs(docs):
    for path, i, doc in docs:
        spec = (doc.get("spec") or {}).get("template", {}).get("spec")
        if spec:
            yield path, i, doc, spec


def consistency_problems(docs: list[tuple[str, int, dict]], namespace: str) -> list[str]:
    problems = []
    services = {d["metadata"]["name"]: d for _, _, d in docs if d.get("kind") == "Service"}
    claims = {
        d["metadata"]["name"]
        for _, _, d in docs
        if d.get("kind") == "PersistentVolumeClaim"
    }
    pods = list(pod_specs(docs))
    for path, i, doc, spec in pods:
        kind, name = doc.get("kind"), doc["metadata"]["name"]
        at = f"{path}: document {i} ({kind} {name})"
        templates = {
            t["metadata"]["name"]
            for t in (doc.get("spec") or {}).get("volumeClaimTemplates") or []
        }
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        for v in volumes.values():
            pvc = v.get("persistentVolumeClaim")
            if pvc and pvc["claimName"] not in claims:
                problems.append(f"{at}: volume {v['name']} claims {pvc['claimName']}, which no manifest defines")
        for c in spec.get("containers") or []:
            args = [str(a) for a in c.get("args") or []]
            mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts") or []}
            for m in mounts:
                if m not in volumes and m not in templates:
                    problems.append(f"{at}: container {c['name']} mounts {m}, which is no volume")
            health = flag(args, "health-listen")
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                grpc = (c.get(probe) or {}).get("grpc")
                if not grpc:
                    continue
                if health is None:
                    problems.append(f"{at}: {probe} is a grpc probe but {c['name']} has no --health-listen")
                elif str(grpc["port"]) != health.rsplit(":", 1)[-1]:
                    problems.append(
                        f"{at}: {probe} asks port {grpc['port']}, --health-listen serves {health}"
                    )
            if args[:1] == ["worker"]:
                url = urlparse(flag(args, "orchestrator") or "")
                host = (url.hostname or "").split(".")
                svc = services.get(host[0])
                if svc is None or host[1:2] != [namespace]:
                    problems.append(
                        f"{at}: --orchestrator {url.geturl()} is not a Service of namespace {namespace}"
                    )
                elif url.port not in [p["port"] for p in svc["spec"]["ports"]]:
                    problems.append(f"{at}: --orchestrator port {url.port} is not a port of Service {host[0]}")
                workspace = flag(args, "workspace")
                if workspace not in mounts.values():
                    problems.append(f"{at}: --workspace {workspace} is not a mounted volume")
                stop = ((c.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command") or []
                if stop[1:3] != ["worker", "drain"] or flag(stop, "workspace") != workspace:
                    problems.append(f"{at}: preStop must run `fvd worker drain --workspace {workspace}`, not {stop}")
                if "--wait" not in stop:
                    problems.append(f"{at}: preStop drain without --wait returns before the drain ends")
    for name, svc in services.items():
        selector = svc["spec"].get("selector") or {}
        targets = [
            (spec, doc)
            for _, _, doc, spec in pods
            if selector and all(
                doc["spec"]["template"]["metadata"].get("labels", {}).get(k) == v
                for k, v in selector.items()
            )
        ]
        if not targets:
            problems.append(f"Service {name}: its selector matches no pod template")
        for p in svc["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            for spec, doc in targets:
                ports = [
                    q
                    for c in spec.get("containers") or []
                    for q in c.get("ports") or []
                ]
                if not any(q.get("name") == target or q["containerPort"] == target for q in ports):
                    problems.append(
                        f"Service {name}: targetPort {target} is no container port of {doc['metadata']['name']}"
                    )
    return problems


def pod_security_problems(docs: list[tuple[str, int, dict]], namespace: str) -> list[str]:
    """Each pod template against the level its namespace enforces."""
    levels = [
        (d.get("metadata", {}).get("labels") or {}).get("pod-security.kubernetes.io/enforce")
        for _, _, d in docs
        if d.get("kind") == "Namespace" and d.get("metadata", {}).get("name") == namespace
    ]
    if not levels or not levels[0]:
        return [f"namespace {namespace}: no pod-security.kubernetes.io/enforce label"]
    problems = []
    for path, i, doc, spec in pod_specs(docs):
        for p in pod_security.problems(spec, levels[0]):
            problems.append(f"{path}: document {i} ({doc.get('kind')} {doc['metadata']['name']}): {p}")
    return problems


def optional_problems(folder: Path, docs: list[tuple[str, int, dict]]) -> tuple[int, list[str]]:
    """The examples under optional/: schemas, and Ingress backends that
    name a Service port of the manifests."""
    services = {d["metadata"]["name"]: d for _, _, d in docs if d.get("kind") == "Service"}
    extra: list[tuple[str, int, dict]] = []
    problems = []
    for path in sorted((folder / "optional").glob("*.yaml")):
        try:
            loaded = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError as e:
            problems.append(f"{path}: {e}")
            continue
        extra += [(str(path), i + 1, d) for i, d in enumerate(loaded) if isinstance(d, dict)]
    problems += schema_problems(extra)
    for path, i, doc in extra:
        if doc.get("kind") != "Ingress":
            continue
        for rule in (doc.get("spec") or {}).get("rules") or []:
            for p in (rule.get("http") or {}).get("paths") or []:
                backend = (p.get("backend") or {}).get("service") or {}
                svc = services.get(backend.get("name"))
                port = backend.get("port") or {}
                if svc is None:
                    problems.append(f"{path}: document {i}: backend Service {backend.get('name')} is not defined")
                elif not any(q.get("name") == port.get("name") or q["port"] == port.get("number")
                             for q in svc["spec"]["ports"]):
                    problems.append(f"{path}: document {i}: backend port {port} is not a port of {svc['metadata']['name']}")
    return len(extra), problems


def validate(folder: Path) -> tuple[int, list[str]]:
    """Number of documents checked, and every problem found."""
    docs, problems = load(folder)
    kust = yaml.safe_load((folder / "kustomization.yaml").read_text()) or {}
    namespace = kust.get("namespace") or ""
    problems += schema_problems(docs)
    problems += consistency_problems(docs, namespace)
    problems += pod_security_problems(docs, namespace)
    optional, more = optional_problems(folder, docs)
    return len(docs) + optional, problems + more


def main(argv: list[str]) -> int:
    folder = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent
    count, problems = validate(folder)
    for p in problems:
        print(p)
    if problems:
        print(f"k8s: {len(problems)} problem(s) in {folder}")
        return 1
    if count == 0:
        print(f"k8s: no manifest found in {folder}")
        return 1
    print(
        f"k8s: {count} documents in {folder} valid against Kubernetes "
        f"{', '.join(VERSIONS)} (kubernetes-validate {kubernetes_validate.__version__}, offline), "
        f"pod templates at their namespace's Pod Security level"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
