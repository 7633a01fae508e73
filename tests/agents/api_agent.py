#!/usr/bin/env python3
"""A minimal agent for tests: it talks to a model API the way a raw
`[agent] command` behind fvd's proxy does (OpenAI Chat Completions at
`$OPENAI_BASE_URL` with `$OPENAI_API_KEY`, which fvd points at the proxy
and the attempt's token), sending its packet (`$FVD_PROMPT_FILE`) and one
`bash` tool, `--requests N` times, growing its history like a real agent;
0 is until a request is refused. It changes no code and hands nothing
back. It writes its environment next to the packet (`.env.json`).

Standard library only. Exit 0 when its requests are done, 3 when one was
refused.
"""

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1)
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
            with urllib.request.urlopen(req, timeout=30) as r:
                reply = json.load(r)
        except urllib.error.HTTPError as e:
            print(f"api_agent: request {n + 1} refused: {e.code}", file=sys.stderr)
            return 3
        messages.append(reply["choices"][0]["message"])
        messages.append({"role": "tool", "tool_call_id": "x", "content": "ok"})
        n += 1
        print(f"api_agent: request {n} answered in {(time.perf_counter() - started) * 1000:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
