"""The Pod Security Standards' checks of a pod template, offline.

Kubernetes' admission controller (pod-security.kubernetes.io/enforce on a
namespace) refuses pods that break the level the namespace names. No
checker of those rules ships on PyPI, so this module checks the fields
each control of the standards names
(https://kubernetes.io/docs/concepts/security/pod-security-standards/),
for the two levels that restrict anything: `baseline` and `restricted`
(which includes baseline). `privileged` allows everything.

`problems(spec, level)` returns one line per broken control, naming the
control and the field; an empty list means the template passes.
"""

from __future__ import annotations

LEVELS = ("privileged", "baseline", "restricted")

# Baseline: capabilities a container may add beyond the runtime's defaults.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}
# Baseline: the sysctls a pod may set.
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
# Restricted: the volume types a pod may use.
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def containers(spec: dict):
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(kind) or []:
            yield f"{kind}[{c.get('name')}]", c


def problems(spec: dict, level: str) -> list[str]:
    """The controls of `level` that the pod spec `spec` breaks."""
    if level not in LEVELS:
        return [f"unknown Pod Security level {level!r} (one of {', '.join(LEVELS)})"]
    if level == "privileged":
        return []
    out = baseline(spec)
    if level == "restricted":
        out += restricted(spec)
    return out


def baseline(spec: dict) -> list[str]:
    out = []
    pod_sc = spec.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(f"baseline: host namespaces: spec.{field} must be unset or false")
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("baseline: HostProcess: spec.securityContext.windowsOptions.hostProcess must be false")
    for v in spec.get("volumes") or []:
        if "hostPath" in v:
            out.append(f"baseline: hostPath volumes: volume {v.get('name')} is a hostPath")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"baseline: sysctls: {sysctl.get('name')} is not a safe sysctl")
    out += seccomp_unconfined("spec.securityContext", pod_sc)
    out += selinux("spec.securityContext", pod_sc)
    out += apparmor("spec.securityContext", pod_sc)
    for where, c in containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"baseline: privileged containers: {where}.securityContext.privileged must be false")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"baseline: HostProcess: {where} asks for a host process")
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            out.append(f"baseline: capabilities: {where} adds {sorted(added - BASELINE_CAPABILITIES)}")
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                out.append(f"baseline: host ports: {where} port {p.get('name') or p.get('containerPort')} sets hostPort")
        if sc.get("procMount") not in (None, "Default"):
            out.append(f"baseline: /proc mount type: {where}.securityContext.procMount must be Default")
        out += seccomp_unconfined(f"{where}.securityContext", sc)
        out += selinux(f"{where}.securityContext", sc)
        out += apparmor(f"{where}.securityContext", sc)
    return out


def seccomp_unconfined(where: str, sc: dict) -> list[str]:
    kind = (sc.get("seccompProfile") or {}).get("type")
    return [f"baseline: seccomp: {where}.seccompProfile.type is Unconfined"] if kind == "Unconfined" else []


def selinux(where: str, sc: dict) -> list[str]:
    opts = sc.get("seLinuxOptions") or {}
    out = []
    if opts.get("type", "") not in SELINUX_TYPES:
        out.append(f"baseline: SELinux: {where}.seLinuxOptions.type {opts.get('type')!r} is not allowed")
    for field in ("user", "role"):
        if opts.get(field):
            out.append(f"baseline: SELinux: {where}.seLinuxOptions.{field} must be unset")
    return out


def apparmor(where: str, sc: dict) -> list[str]:
    kind = (sc.get("appArmorProfile") or {}).get("type")
    return [f"baseline: AppArmor: {where}.appArmorProfile.type is Unconfined"] if kind == "Unconfined" else []


def restricted(spec: dict) -> list[str]:
    out = []
    pod_sc = spec.get("securityContext") or {}
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"restricted: volume types: volume {v.get('name')} is {sorted(kinds - RESTRICTED_VOLUMES)}")
    if pod_sc.get("runAsUser") == 0:
        out.append("restricted: running as non-root user: spec.securityContext.runAsUser is 0")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    for where, c in containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"restricted: privilege escalation: {where}.securityContext.allowPrivilegeEscalation must be false")
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            out.append(f"restricted: running as non-root: {where} (or the pod) must set runAsNonRoot: true")
        if sc.get("runAsUser") == 0:
            out.append(f"restricted: running as non-root user: {where}.securityContext.runAsUser is 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"restricted: seccomp: {where} (or the pod) must set seccompProfile.type RuntimeDefault or Localhost")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"restricted: capabilities: {where} must drop ALL")
        extra = set(caps.get("add") or []) - {"NET_BIND_SERVICE"}
        if extra:
            out.append(f"restricted: capabilities: {where} may add only NET_BIND_SERVICE, not {sorted(extra)}")
    return out
