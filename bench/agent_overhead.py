#!/usr/bin/env python3
"""fvd's own time around each agent attempt (issue 29): writing the packet,
opening the ledger row, starting the attempt's model proxy, committing the
worktree (and, once per component, making the worktree), and what the
proxy adds to a model request, next to the same request sent to the model
server directly.

Writes a copy of examples/tinyport whose `timestep_embed` has a raw agent
behind fvd's proxy (tests/agents/api_agent.py, one Chat Completions request
per attempt, never a fix), so the port spends `--attempts` attempts; runs
the repository's scripted model server on loopback; reads fvd's
`agent attempt overhead` and `agent worktree ready` log lines. The agent's
own run (a Python start-up and one request) is reported apart.

Usage: python3 bench/agent_overhead.py [--fvd PATH] [--attempts 8] [--requests 200]
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def port(repo, attempts, agent):
    shutil.copytree(os.path.join(ROOT, "examples/tinyport"), repo,
                    ignore=shutil.ignore_patterns(".fvd", "__pycache__"))
    spec = os.path.join(repo, "tests/local_tests/tinyport/port.toml")
    text = open(spec).read()
    head, _, rest = text.partition("\n[[component]]\n")
    comps = ("\n[[component]]\n" + rest).split("\n[[component]]\n")
    keep = [c for c in comps if c.startswith('name = "timestep_embed"')][0]
    keep = "\n".join(keep.splitlines()[:6])
    text = (f"{head}\n[[component]]\n{keep}\n\n[agent]\n"
            f'command = ["python3", "-B", "{agent}", "--requests", "1"]\n'
            f'api = "openai-chat"\nmodel = "gpt-5"\nmax_attempts = {attempts}\ntimeout_s = 60\n')
    open(spec, "w").write(text)
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@invalid"]
    subprocess.run(git + ["init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run(git + ["add", "-A"], cwd=repo, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "base"], cwd=repo, check=True)


def request_ms(base, key, n, packet):
    """Median wall time of n Chat Completions requests to `base`, each the
    one api_agent.py sends: the packet and one tool."""
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}}]
    body = json.dumps({"model": "gpt-5", "messages": [{"role": "user", "content": packet}],
                       "tools": tools}).encode()
    out = []
    for _ in range(n):
        req = urllib.request.Request(base + "/chat/completions", data=body, headers={
            "content-type": "application/json", "authorization": "Bearer " + key})
        t = time.perf_counter()
        urllib.request.urlopen(req, timeout=30).read()
        out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fvd", default=os.path.join(ROOT, "target/release/fvd"))
    ap.add_argument("--attempts", type=int, default=8)
    ap.add_argument("--requests", type=int, default=200)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="fvd-agent-bench-")
    repo = os.path.join(tmp, "repo")
    port(repo, a.attempts, os.path.join(ROOT, "tests/agents/api_agent.py"))
    key = "sk-bench-0123456789abcdef"
    open(os.path.join(tmp, "key"), "w").write(key)
    server = subprocess.Popen([
        sys.executable, os.path.join(ROOT, "tests/agents/model_server.py"),
        "--key-file", os.path.join(tmp, "key"), "--port-file", os.path.join(tmp, "port")],
        stderr=subprocess.DEVNULL)
    try:
        while not os.path.exists(os.path.join(tmp, "port")):
            time.sleep(0.02)
        base = "http://127.0.0.1:%s/v1" % open(os.path.join(tmp, "port")).read().strip()
        env = dict(os.environ, OPENAI_API_KEY=key, OPENAI_BASE_URL=base, FVD_LOG="info")
        t = time.perf_counter()
        done = subprocess.run([a.fvd, "submit", "--family", "tinyport", "--wait", "--repo", repo],
                              env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t
        log = ANSI.sub("", done.stderr)
        rows = []
        for line in log.splitlines():
            if "agent attempt overhead" in line:
                rows.append({k: int(v) for k, v in re.findall(r"(\w+_ms)=(\d+)", line)})
        worktree = [int(m) for m in re.findall(r"worktree_ms=(\d+)", log)]
        if not rows:
            print(done.stdout, log[-4000:], sep="\n")
            sys.exit("no `agent attempt overhead` lines: did the port run its agent?")
        med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
        own = [r["total_ms"] - r["agent_ms"] for r in rows]
        print(f"{len(rows)} attempts in {wall:.1f} s (fvd {a.fvd})")
        print(f"  worktree (once per component): {worktree[0] if worktree else '?'} ms")
        for k in ("packet_ms", "ledger_ms", "proxy_ms", "commit_ms"):
            print(f"  {k[:-3]:<8} median {med(k):>4} ms  max {max(r[k] for r in rows)} ms")
        print(f"  fvd's own time per attempt: median {statistics.median(own)} ms, max {max(own)} ms "
              f"(the agent itself: median {med('agent_ms')} ms)")
        via = []
        agent_dir = os.path.join(repo, ".fvd/agent/tinyport/timestep_embed")
        for d in os.listdir(agent_dir):
            out = open(os.path.join(agent_dir, d, "agent.stdout")).read()
            via += [float(m) for m in re.findall(r"answered in ([0-9.]+) ms", out)]
        packet = open(os.path.join(agent_dir, "attempt-1", "prompt.md")).read()
        direct = request_ms(base, key, a.requests, packet)
        print(f"  a model request (the packet and one tool, not streamed, a new connection): "
              f"through the proxy median {statistics.median(via):.2f} ms over {len(via)}; "
              f"the same sent directly median {direct:.2f} ms over {a.requests}")
    finally:
        server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
