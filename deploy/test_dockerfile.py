"""deploy/Dockerfile builds with a plain `docker build`: it uses no BuildKit
feature, names every base image it pulls in its header, and the context it
needs is what the repository's top-level .dockerignore leaves in. Its
worker-agents target installs the coding-agent CLIs as scripts/agent-clis.sh
does: from the project's npm lock, Node from the distribution's archive.

Docker itself does not run here (no engine on CI's machines); these are the
checks that can be made of the files."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments out."""
    out, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").rstrip() + " "
        if not line.rstrip().endswith("\\"):
            out.append(current.strip())
            current = ""
    return out


def buildkit_only(text: str) -> list[str]:
    """The BuildKit-only features the classic builder refuses or ignores."""
    found = []
    if re.match(r"#\s*syntax\s*=", text):
        found.append("a # syntax= directive")
    for ins in instructions(text):
        word = ins.split()[0].upper()
        if word == "RUN" and re.search(r"--(mount|network|security)\b", ins):
            found.append(f"RUN flags: {ins[:60]}")
        if word in ("COPY", "ADD") and re.search(r"--(link|chmod|parents|exclude)\b", ins):
            found.append(f"{word} flags: {ins[:60]}")
        if "<<" in ins:
            found.append(f"a heredoc: {ins[:60]}")
    return found


def test_the_dockerfile_uses_no_buildkit_feature():
    assert buildkit_only(DOCKERFILE.read_text()) == []


def test_the_check_sees_buildkit_features():
    text = "# syntax=docker/dockerfile:1\nFROM x\nRUN --mount=type=cache,target=/a \\\n  make\nCOPY --link a b\nRUN <<EOF\nls\nEOF\n"
    found = buildkit_only(text)
    assert len(found) == 4, found


def test_every_base_image_is_named_in_the_header():
    text = DOCKERFILE.read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    stages = set()
    for ins in instructions(text):
        if ins.upper().startswith("FROM "):
            words = ins.split()
            image = words[1]
            m = re.fullmatch(r"\$\{(\w+)\}", image)
            if m:
                assert m.group(1) in args, f"FROM {image}: no ARG default"
                image = args[m.group(1)]
            if image not in stages:
                assert image in header, f"base image {image} is not named in the header"
            if len(words) >= 4 and words[2].upper() == "AS":
                stages.add(words[3])
    assert len(stages) == 4, stages


def test_the_context_keeps_what_copy_needs_and_drops_the_rest():
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ".git" in ignore and "target" in ignore
    for ins in instructions(DOCKERFILE.read_text()):
        words = ins.split()
        if words[0].upper() == "COPY" and not any(w.startswith("--from") for w in words):
            for src in words[1:-1]:
                if src == ".":
                    continue
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
                assert src not in ignore, f"COPY {src}: .dockerignore leaves it out"


def stage(text: str, name: str) -> list[str]:
    """The instructions of one stage: from its FROM to the next FROM."""
    out, inside = [], False
    for ins in instructions(text):
        words = ins.split()
        if words[0].upper() == "FROM":
            inside = len(words) >= 4 and words[3] == name
            if inside:
                out.append(ins)
            continue
        if inside:
            out.append(ins)
    return out


def agent_programs() -> list[str]:
    """The programs scripts/agent-clis.sh installs and checks by default."""
    text = (ROOT / "scripts" / "agent-clis.sh").read_text()
    m = re.search(r"^programs=\(([^)]*)\)", text, re.M)
    assert m, "scripts/agent-clis.sh: no programs=(...)"
    return m.group(1).split()


def test_the_agents_target_installs_the_locked_clis_as_agent_clis_sh_does():
    ins = stage(DOCKERFILE.read_text(), "worker-agents")
    assert ins, "no worker-agents stage"
    assert ins[0].split()[1] == "worker", "worker-agents must be built FROM the worker stage"
    text = " ".join(ins)
    lock = "tests/agents/clis/package-lock.json"
    copies = [i for i in ins if i.split()[0].upper() == "COPY"]
    assert any(lock in c and "tests/agents/clis/package.json" in c for c in copies), copies
    # Node and npm from the distribution's archive, not a download
    assert re.search(r"apt-get install [^&]*\bnodejs\b[^&]*\bnpm\b", text), text
    for fetch in ("curl ", "wget ", "nodesource", "nvm ", "ADD http"):
        assert fetch not in text, f"worker-agents fetches something itself: {fetch}"
    # only the lock's packages: an install over the lock, nothing named
    npm = [s.strip() for s in re.split(r"&&|;|\|\|", text) if s.strip().startswith("npm ")]
    assert any(s.startswith("npm install ") for s in npm), npm
    for s in npm:
        assert not re.search(r"npm (install|i|add) +[^-\s]", s), f"a package named outside the lock: {s}"
        assert "--ignore-scripts=false" in s, f"{s}: install scripts must run whatever an npmrc says"
    assert "not as locked" in text, "nothing compares what npm installed with the lock"
    # every program agent-clis.sh checks, checked here too, with the rebuild fallback
    loop = re.search(r"for p in ([^;]*);", text)
    assert loop and loop.group(1).split() == agent_programs(), (loop and loop.group(1), agent_programs())
    assert "--version" in text and "npm rebuild --ignore-scripts=false" in text
    assert "/usr/local/bin/$p" in text, "the CLIs must be on the worker's PATH"
    # back to the unprivileged user the pods run as
    assert ins[-1] == "USER 10001", ins[-1]


def test_the_agents_lock_is_one_the_context_keeps():
    lock = ROOT / "tests" / "agents" / "clis" / "package-lock.json"
    packages = json.loads(lock.read_text())["packages"]
    direct = packages[""]["dependencies"]
    for name, version in direct.items():
        assert packages[f"node_modules/{name}"]["version"] == version
        assert packages[f"node_modules/{name}"]["integrity"].startswith("sha512-")
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert not any(p.startswith("tests") for p in ignore), ignore
