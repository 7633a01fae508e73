#!/usr/bin/env python3
"""A replay coding agent for tests and examples: attempt N applies the
recorded patch NNNN.patch of a folder to the worktree and hands back the
recorded NNNN.handoff (a component_skill_handoff block, or a pipeline step's
pipeline_handoff), as a real agent
would after reading its prompt and editing code. An attempt with a handoff
but no patch changes nothing (an agent that only asks a question). When
NNNN.expect exists, each of its lines must appear in the prompt, or the
agent refuses: that is how a recording proves it was given, say, the
answer to the question it asked.

fvd runs it like any agent CLI, from the port's `[agent].command`:

    python3 -B tools/replay_agent.py --patches tools/replay/{component}
        --attempt {attempt} --prompt {prompt_file} --handoff {handoff_file}
        --worktree {worktree}

Exit codes: 0 the patch applied, 1 it did not apply, 2 no recorded patch
for this attempt or an unreadable prompt.
"""

import argparse
import pathlib
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patches", required=True, help="folder of NNNN.patch and NNNN.handoff")
    ap.add_argument("--attempt", required=True, type=int)
    ap.add_argument("--prompt", required=True, help="the packet fvd wrote")
    ap.add_argument("--handoff", required=True, help="where the handoff block goes")
    ap.add_argument("--worktree", required=True)
    a = ap.parse_args()

    worktree = pathlib.Path(a.worktree)
    prompt = pathlib.Path(a.prompt)
    try:
        packet = prompt.read_text()
    except OSError as e:
        print(f"replay_agent: cannot read prompt {prompt}: {e}", file=sys.stderr)
        return 2
    # A real agent reads the packet; the replay agent at least checks that it
    # got one and shows what it was told, so the agent log tells the story.
    if "component_context:" not in packet and "pipeline_context:" not in packet:
        print(f"replay_agent: prompt {prompt} holds no component_context or pipeline_context block", file=sys.stderr)
        return 2
    for line in packet.splitlines():
        if line.startswith("Run `"):
            print(f"replay_agent: told {line}")

    folder = worktree / a.patches
    patch = folder / f"{a.attempt:04d}.patch"
    handoff = folder / f"{a.attempt:04d}.handoff"
    expect = folder / f"{a.attempt:04d}.expect"
    if expect.is_file():
        for want in expect.read_text().splitlines():
            if want.strip() and want.strip() not in packet:
                print(f"replay_agent: the prompt lacks {want.strip()!r} ({expect.name})", file=sys.stderr)
                return 2
    if not patch.is_file() and not handoff.is_file():
        print(f"replay_agent: no recorded patch {patch} for attempt {a.attempt}", file=sys.stderr)
        return 2
    if patch.is_file():
        # Patches are recorded relative to the port folder, which may sit
        # below the top of its repository (fvd's own examples/tinyport).
        prefix = subprocess.run(
            ["git", "rev-parse", "--show-prefix"], cwd=worktree, capture_output=True, text=True
        ).stdout.strip()
        cmd = ["git", "apply", "--whitespace=nowarn"]
        if prefix:
            cmd.append(f"--directory={prefix.rstrip('/')}")
        done = subprocess.run(cmd + [str(patch)], cwd=worktree)
        if done.returncode != 0:
            print(f"replay_agent: patch {patch} does not apply", file=sys.stderr)
            return 1
        print(f"replay_agent: applied {patch.name}")
    else:
        print(f"replay_agent: attempt {a.attempt} changes nothing; it hands back {handoff.name}")
    if handoff.is_file():
        pathlib.Path(a.handoff).write_text(handoff.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
