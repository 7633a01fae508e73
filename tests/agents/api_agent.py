#!/usr/bin/env python3
"""A minimal agent for tests: it talks to a model API the way a raw
`[agent] command` behind fvd's proxy does (OpenAI Chat Completions at
`$OPENAI_BASE_URL` with `$OPENAI_API_KEY`, which fvd points at the proxy
and the attempt's token), sending its packet (`$FVD_PROMPT_FILE`) and one
`bash` tool, `--requests N` times, growing its history like a real agent;
0 is until a request is refused. It changes no code and hands nothing
back. It writes its environment next to the packet (`.env.json`).

`--pause S` waits S seconds after each answered request; `--retry-for S`
tries a request again while its connection fails (an orchestrator
restarting behind the worker's tunnel), for up to S seconds; `--tools`
calls fvd's `attempts` tool (`$FVD_TOOLS_ADDR`, `$FVD_TOOLS_TOKEN`) after
each answered request, likewise retried, and fails if it is refused.

Standard library only. Exit 0 when its requests are done, 3 when one was
refused.
"""

import argparse
import http.client
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1)
    ap.add_argument("--pause", type=float, default=0.0)
    ap.add_argument("--retry-for", type=float, default=0.0)
    ap.add_argument("--tools", action="store_true")
    a = ap.parse_args()
    packet_file = os.environ["FVD_PROMPT_FILE"]
    with open(packet_file + ".env.json", "w") as f:
        json.dump(dict(os.environ), f)
    packet = open(packet_file).read()
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    messages = [{"role": "user", "content": packet}]
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}}]
    n = 0
    while a.requests == 0 or n < a.requests:
        body = json.dumps({"model": "gpt-5", "messages": messages, "tools": tools}).encode()
        req = urllib.request.Request(base + "/chat/completions", data=body, headers={
            "content-type": "application/json",
            "authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
        })
        started = time.perf_counter()
        try:
            reply = retried(a.retry_for, lambda: json.load(urllib.request.urlopen(req, timeout=30)))
        except urllib.error.HTTPError as e:
            print(f"api_agent: request {n + 1} refused: {e.code}", file=sys.stderr)
            return 3
        messages.append(reply["choices"][0]["message"])
        messages.append({"role": "tool", "tool_call_id": "x", "content": "ok"})
        n += 1
        print(f"api_agent: request {n} answered in {(time.perf_counter() - started) * 1000:.2f} ms")
        if a.tools:
            answer = retried(a.retry_for, call_attempts_tool)
            if answer.get("is_error"):
                print(f"api_agent: the attempts tool refused: {answer.get('text')}", file=sys.stderr)
                return 3
            print(f"api_agent: the attempts tool answered after request {n}")
        time.sleep(a.pause)
    return 0


def retried(for_s, f):
    """f(), tried again while its connection fails, for up to `for_s` s."""
    deadline = time.monotonic() + for_s
    while True:
        try:
            return f()
        except urllib.error.HTTPError:
            raise
        except (OSError, http.client.HTTPException, ValueError) as e:
            if time.monotonic() >= deadline:
                raise
            print(f"api_agent: {e!r}; trying again", file=sys.stderr)
            time.sleep(0.2)


def call_attempts_tool():
    """One call of fvd's `attempts` tool over its wire (a JSON line each
    way), the way `fvd mcp` calls it."""
    host, port = os.environ["FVD_TOOLS_ADDR"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        req = {"token": os.environ["FVD_TOOLS_TOKEN"], "tool": "attempts", "arguments": {}, "pack_len": 0}
        s.sendall((json.dumps(req) + "\n").encode())
        line = s.makefile("rb").readline()
    if not line:
        raise ConnectionResetError("the tools closed the connection")
    return json.loads(line)


if __name__ == "__main__":
    sys.exit(main())
