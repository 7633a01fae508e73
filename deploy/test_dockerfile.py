"""deploy/Dockerfile builds with a plain `docker build`: it uses no BuildKit
feature, names every base image it pulls in its header, and the context it
needs is what the repository's top-level .dockerignore leaves in.

Docker itself does not run here (no engine on CI's machines); these are the
checks that can be made of the files."""

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
    assert len(stages) == 3, stages


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
