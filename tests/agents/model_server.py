#!/usr/bin/env python3
"""A scripted model server for testing coding-agent CLIs offline.

It speaks the four model APIs the agent presets use, streaming and not:

- Anthropic Messages (`POST /v1/messages`),
- OpenAI Chat Completions (`POST /v1/chat/completions`),
- OpenAI Responses (`POST /v1/responses`),
- Gemini (`POST /v1beta/models/M:generateContent` and
  `:streamGenerateContent?alt=sse`).

Each reply comes from a script (`--script FILE`, JSON) chosen by a marker in
the request's messages; the step is the number of assistant turns already in
the request, so a CLI that sends its whole history each turn walks the
script. Steps are abstract (`bash`, `read`, `edit`, `write`, `handoff`,
`text`, and `mcp`: a tool an MCP server offers, by its own name) and
become the tool calls of whichever CLI asks, from the tool names and
argument schemas it offers. Usage is deterministic (the script's, per
reply) and every request is logged as one JSON line (`--log FILE`): path,
protocol, model, streaming, script, step, status and the usage returned.
Request bodies and credentials are not logged.

Script file:

    {"scripts": [{"name": "fix", "marker": "fvd parity-debug: tinyport / timestep_embed",
                  "usage": {"input": 1000, "output": 100, "cache_read": 0, "cache_write": 0},
                  "captures": {"workdir": "Work in `([^`]+)`"},
                  "steps": [{"read": "{workdir}/a.py"},
                            {"edit": {"path": "{workdir}/a.py", "old": "x", "new": "y"},
                             "fail": {"status": 500, "times": 1}},
                            {"bash": "python3 -m pytest -q"},
                            {"handoff": "component: ...", "valid": true},
                            {"text": "done"}]}]}

- `captures`: regexes over the request's text whose first group fills
  `{name}` in the steps' strings.
- `fail`: the first `times` requests at that step get `status` (a retry of
  the same turn walks on once they are spent).
- `loop`: a step `{"loop": STEP}` repeats STEP for every later turn (an
  agent that never finishes: turn caps and budgets end it).

Like the real APIs, a reply uses no more output tokens than the request's
cap (`max_tokens`, `max_completion_tokens`, `max_output_tokens`,
`generationConfig.maxOutputTokens`); the cap asked for is logged
(`max_tokens`).
- `handoff`: the handoff returned the way the client takes one: through a
  `StructuredOutput` tool (Claude Code's `--json-schema`), as JSON text when
  the request asks for a JSON schema (Codex's `--output-schema`), else as
  the text of the final reply.

`--key K`: every request must carry K (`x-api-key`, `Authorization: Bearer`,
`x-goog-api-key` or `?key=`), or it is answered 401. `--lo-up` brings the
loopback interface up first (a fresh `unshare -n` namespace has it down).

Standard library only.
"""

import argparse
import http.server
import json
import os
import re
import sys
import threading
import time
import urllib.parse

LOCK = threading.Lock()


def lo_up():
    """Sets IFF_UP on `lo` (needs CAP_NET_ADMIN in this network namespace)."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        req = struct.pack("16sH14s", b"lo", 0, b"\0" * 14)
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, siocgifflags, req))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH14s", b"lo", flags | iff_up, b"\0" * 14))
    finally:
        s.close()


class Script:
    def __init__(self, raw):
        self.name = raw.get("name", raw["marker"])
        self.marker = raw["marker"]
        self.usage = {**{"input": 1000, "output": 100, "cache_read": 0, "cache_write": 0}, **raw.get("usage", {})}
        self.captures = {k: re.compile(v) for k, v in raw.get("captures", {}).items()}
        self.steps = raw["steps"]
        self.failed = {}  # step index -> failures served

    def step(self, turn):
        if turn < len(self.steps):
            return self.steps[turn]
        last = self.steps[-1] if self.steps else {"text": "done"}
        if "loop" in last:
            return last
        return {"text": "done"}


def fill(value, vars_):
    if isinstance(value, str):
        for k, v in vars_.items():
            value = value.replace("{" + k + "}", v)
        return value
    if isinstance(value, dict):
        return {k: fill(v, vars_) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, vars_) for v in value]
    return value


# ---------------------------------------------------------------- requests


class Request:
    """What the server needs of one request, whatever its protocol."""

    def __init__(self, protocol, body, model, stream):
        self.protocol = protocol
        self.body = body
        self.model = model
        self.stream = stream
        self.tools = {}  # name -> JSON schema of its arguments
        self.text = ""  # every user-side text, for markers and captures
        self.turns = 0  # assistant turns already in the history
        self.json_format = False  # the client asks for a JSON-schema reply
        getattr(self, "_read_" + protocol)(body)

    def _read_anthropic(self, b):
        for t in b.get("tools") or []:
            if "name" in t:
                self.tools[t["name"]] = t.get("input_schema") or {}
        texts = []
        for m in b.get("messages") or []:
            if m.get("role") == "assistant":
                self.turns += 1
            else:
                texts.append(json.dumps(m.get("content")))
        self.text = "\n".join(texts)

    def _read_chat(self, b):
        for t in b.get("tools") or []:
            f = t.get("function") or {}
            if "name" in f:
                self.tools[f["name"]] = f.get("parameters") or {}
        texts = []
        for m in b.get("messages") or []:
            if m.get("role") == "assistant":
                self.turns += 1
            elif m.get("role") != "system":
                texts.append(json.dumps(m.get("content")))
        self.text = "\n".join(texts)
        rf = b.get("response_format") or {}
        self.json_format = rf.get("type") == "json_schema"

    def _read_responses(self, b):
        for t in b.get("tools") or []:
            if t.get("type") == "function" and "name" in t:
                self.tools[t["name"]] = t.get("parameters") or {}
        items = b.get("input")
        if isinstance(items, str):
            items = [{"type": "message", "role": "user", "content": items}]
        texts = []
        for it in items or []:
            kind = it.get("type", "message")
            if kind in ("function_call", "custom_tool_call", "local_shell_call"):
                self.turns += 1
            elif kind == "message" and it.get("role") == "assistant":
                self.turns += 1
            elif kind == "message" and it.get("role") == "user":
                texts.append(json.dumps(it.get("content")))
        self.text = "\n".join(texts)
        fmt = ((b.get("text") or {}).get("format")) or {}
        self.json_format = fmt.get("type") == "json_schema"

    def _read_gemini(self, b):
        for t in b.get("tools") or []:
            for f in t.get("functionDeclarations") or t.get("function_declarations") or []:
                self.tools[f["name"]] = f.get("parameters") or f.get("parametersJsonSchema") or {}
        texts = []
        for c in b.get("contents") or []:
            if c.get("role") == "model":
                self.turns += 1
            else:
                texts.append(json.dumps(c.get("parts")))
        self.text = "\n".join(texts)
        cfg = b.get("generationConfig") or {}
        self.json_format = cfg.get("responseMimeType") == "application/json" and bool(
            cfg.get("responseSchema") or cfg.get("responseJsonSchema")
        )


# ------------------------------------------------------------ tool choice


def props(schema):
    return (schema or {}).get("properties") or {}


def pick(names, tools):
    for n in names:
        if n in tools:
            return n
    return None


def first_prop(schema, names):
    p = props(schema)
    for n in names:
        if n in p:
            return n
    return names[0]


def shell_call(req, command):
    name = pick(["Bash", "bash", "exec_command", "shell", "run_shell_command", "shell_command"], req.tools)
    if name is None:
        return None
    schema = req.tools[name]
    key = first_prop(schema, ["command", "cmd"])
    args = {key: command}
    if props(schema).get(key, {}).get("type") == "array":
        args[key] = ["bash", "-lc", command]
    if "description" in props(schema):
        args["description"] = "run a command"
    return name, args


def tool_call(req, step):
    """The (tool name, arguments) of an abstract step for this client."""
    if "bash" in step:
        return shell_call(req, step["bash"])
    if "read" in step:
        name = pick(["Read", "read", "read_file"], req.tools)
        if name is None:
            return shell_call(req, "cat " + step["read"])
        key = first_prop(req.tools[name], ["file_path", "filePath", "absolute_path", "path"])
        return name, {key: step["read"]}
    if "edit" in step:
        e = step["edit"]
        name = pick(["Edit", "edit", "replace"], req.tools)
        if name is None:
            code = (
                "import pathlib,sys;p=pathlib.Path(sys.argv[1]);t=p.read_text();"
                "assert sys.argv[2] in t;p.write_text(t.replace(sys.argv[2],sys.argv[3],1))"
            )
            return shell_call(req, "python3 -c %s %s %s %s" % tuple(map(quote, [code, e["path"], e["old"], e["new"]])))
        s = req.tools[name]
        args = {
            first_prop(s, ["file_path", "filePath", "absolute_path", "path"]): e["path"],
            first_prop(s, ["old_string", "oldString", "old_str"]): e["old"],
            first_prop(s, ["new_string", "newString", "new_str"]): e["new"],
        }
        if "instruction" in props(s):
            args["instruction"] = "apply the fix"
        return name, args
    if "write" in step:
        w = step["write"]
        name = pick(["Write", "write", "write_file"], req.tools)
        if name is None:
            code = "import pathlib,sys;pathlib.Path(sys.argv[1]).write_text(sys.argv[2])"
            return shell_call(req, "python3 -c %s %s %s" % tuple(map(quote, [code, w["path"], w["content"]])))
        s = req.tools[name]
        return name, {
            first_prop(s, ["file_path", "filePath", "absolute_path", "path"]): w["path"],
            first_prop(s, ["content"]): w["content"],
        }
    if "mcp" in step:
        # A tool of an MCP server, by the name the server gave it; each CLI
        # prefixes it its own way (mcp__fvd__run_parity, fvd_run_parity).
        want = step["mcp"]
        for name in sorted(req.tools):
            if name == want or name.endswith("__" + want) or name.endswith("_" + want):
                return name, {}
        return None
    if "tool" in step:
        return step["tool"]["name"], step["tool"].get("input", {})
    return None


def quote(s):
    return "'" + s.replace("'", "'\"'\"'") + "'"


# ---------------------------------------------------------------- replies


class Reply:
    """One assistant turn: a text or a tool call, with its usage."""

    def __init__(self, text=None, call=None, usage=None):
        self.text = text
        self.call = call  # (name, args) or None
        self.usage = usage


def output_cap(protocol, body):
    """The most output tokens a request allows, if it says."""
    if protocol == "anthropic":
        cap = body.get("max_tokens")
    elif protocol == "chat":
        cap = body.get("max_completion_tokens", body.get("max_tokens"))
    elif protocol == "responses":
        cap = body.get("max_output_tokens")
    else:
        cap = (body.get("generationConfig") or {}).get("maxOutputTokens")
    return cap if isinstance(cap, int) else None


def decide(server, req):
    """The script and step a request gets, and the reply or error."""
    script = None
    if req.tools:
        for s in server.scripts:
            if s.marker in req.text:
                script = s
                break
    if script is None:
        return None, None, None, Reply(text="ok", usage=dict(server.fallback_usage))
    turn = req.turns
    step = script.step(turn)
    if "loop" in step:
        step = step["loop"]
    vars_ = {}
    for k, rx in script.captures.items():
        m = rx.search(req.text)
        if m:
            vars_[k] = m.group(1)
    step = fill(step, vars_)
    fail = step.get("fail")
    if fail:
        with LOCK:
            served = script.failed.get(turn, 0)
            if served < fail.get("times", 1):
                script.failed[turn] = served + 1
                return script, turn, fail, None
    usage = {**script.usage, **step.get("usage", {})}
    if "text" in step:
        return script, turn, None, Reply(text=step["text"], usage=usage)
    if "handoff" in step:
        block = step["handoff"]
        if "StructuredOutput" in req.tools:
            return script, turn, None, Reply(call=("StructuredOutput", {"handoff": block}), usage=usage)
        if req.json_format:
            return script, turn, None, Reply(text=json.dumps({"handoff": block}), usage=usage)
        return script, turn, None, Reply(text="Done.\n\n" + block + "\n", usage=usage)
    call = tool_call(req, step)
    if call is None:
        return script, turn, None, Reply(text="no tool for step %s" % json.dumps(step), usage=usage)
    return script, turn, None, Reply(call=call, usage=usage)


def error_body(protocol, status, message):
    if protocol == "anthropic":
        kind = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    if protocol == "gemini":
        return {"error": {"code": status, "message": message, "status": "UNAVAILABLE"}}
    return {"error": {"message": message, "type": "server_error" if status >= 500 else "invalid_request_error", "code": None}}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fvd-model-server/1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        path = urllib.parse.urlparse(self.path).path
        if path.endswith("/models"):
            return self.send_json(200, {"object": "list", "data": [], "models": []})
        self.send_json(404, {"error": {"message": "not found: " + path}})

    def do_POST(self):
        url = urllib.parse.urlparse(self.path)
        n = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(n)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return self.send_json(400, {"error": {"message": "body is not JSON"}})
        path, query = url.path, urllib.parse.parse_qs(url.query)
        stream = bool(body.get("stream"))
        model = body.get("model", "")
        if path.endswith("/messages/count_tokens"):
            return self.send_json(200, {"input_tokens": 100})
        if path.endswith("/messages"):
            protocol = "anthropic"
        elif path.endswith("/chat/completions"):
            protocol = "chat"
        elif path.endswith("/responses"):
            protocol = "responses"
        elif ":generateContent" in path or ":streamGenerateContent" in path:
            protocol = "gemini"
            model = path.rsplit("/", 1)[-1].split(":")[0]
            stream = ":streamGenerateContent" in path
        else:
            return self.send_json(404, {"error": {"message": "no such endpoint: " + path}})
        srv = self.server
        entry = {"seq": 0, "time": time.time(), "path": path, "protocol": protocol, "model": model, "stream": stream}
        given = self.credential(query)
        if srv.key is not None and given != srv.key:
            entry.update(status=401, auth="missing" if given is None else "wrong")
            srv.log(entry)
            return self.send_json(401, error_body(protocol, 401, "invalid x-api-key"))
        entry["auth"] = "ok" if srv.key is not None else "unchecked"
        req = Request(protocol, body, model, stream)
        script, turn, fail, reply = decide(srv, req)
        entry.update(script=script.name if script else None, turn=turn, tools=len(req.tools))
        if fail:
            entry.update(status=fail["status"])
            srv.log(entry)
            return self.send_json(fail["status"], error_body(protocol, fail["status"], "scripted failure"))
        if protocol != "anthropic":
            # Only Anthropic's usage has a field for tokens written to a cache.
            reply.usage = {**reply.usage, "cache_write": 0}
        cap = output_cap(protocol, body)
        if cap is not None:
            entry.update(max_tokens=cap)
            reply.usage = {**reply.usage, "output": min(reply.usage["output"], cap)}
        entry.update(
            status=200,
            usage=reply.usage,
            reply="tool:" + reply.call[0] if reply.call else "text",
        )
        srv.log(entry)
        getattr(self, "reply_" + protocol)(req, reply, srv.next_id())

    def credential(self, query):
        for h in ("x-api-key", "x-goog-api-key"):
            if self.headers.get(h):
                return self.headers.get(h)
        auth = self.headers.get("authorization") or ""
        if auth.lower().startswith("bearer "):
            return auth[7:]
        if "key" in query:
            return query["key"][0]
        return None

    # --- plumbing

    def send_json(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_sse(self):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True

    def sse(self, data, event=None):
        out = ""
        if event:
            out += "event: %s\n" % event
        out += "data: %s\n\n" % (data if isinstance(data, str) else json.dumps(data))
        self.wfile.write(out.encode())
        self.wfile.flush()

    # --- Anthropic Messages

    def reply_anthropic(self, req, r, n):
        u = r.usage
        usage = {
            "input_tokens": u["input"],
            "output_tokens": u["output"],
            "cache_read_input_tokens": u["cache_read"],
            "cache_creation_input_tokens": u["cache_write"],
        }
        if r.call:
            block = {"type": "tool_use", "id": "toolu_%04d" % n, "name": r.call[0], "input": r.call[1]}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": r.text}
            stop = "end_turn"
        msg = {"id": "msg_%04d" % n, "type": "message", "role": "assistant", "model": req.model,
               "stop_reason": stop, "stop_sequence": None}
        if not req.stream:
            return self.send_json(200, {**msg, "content": [block], "usage": usage})
        self.start_sse()
        start_usage = {**usage, "output_tokens": 1}
        self.sse({"type": "message_start", "message": {**msg, "content": [], "stop_reason": None, "usage": start_usage}},
                 "message_start")
        if r.call:
            self.sse({"type": "content_block_start", "index": 0, "content_block": {**block, "input": {}}},
                     "content_block_start")
            self.sse({"type": "content_block_delta", "index": 0,
                      "delta": {"type": "input_json_delta", "partial_json": json.dumps(r.call[1])}},
                     "content_block_delta")
        else:
            self.sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                     "content_block_start")
            self.sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": r.text}},
                     "content_block_delta")
        self.sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
        self.sse({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                  "usage": {"output_tokens": u["output"]}}, "message_delta")
        self.sse({"type": "message_stop"}, "message_stop")

    # --- OpenAI Chat Completions

    def reply_chat(self, req, r, n):
        u = r.usage
        usage = {
            "prompt_tokens": u["input"] + u["cache_read"],
            "completion_tokens": u["output"],
            "total_tokens": u["input"] + u["cache_read"] + u["output"],
            "prompt_tokens_details": {"cached_tokens": u["cache_read"]},
        }
        if r.call:
            call = {"id": "call_%04d" % n, "type": "function",
                    "function": {"name": r.call[0], "arguments": json.dumps(r.call[1])}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": r.text}
            finish = "stop"
        base = {"id": "chatcmpl-%04d" % n, "created": int(time.time()), "model": req.model}
        if not req.stream:
            return self.send_json(200, {**base, "object": "chat.completion",
                                        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                                        "usage": usage})
        self.start_sse()
        chunk = {**base, "object": "chat.completion.chunk"}
        if r.call:
            delta = {"role": "assistant", "content": None,
                     "tool_calls": [{"index": 0, **message["tool_calls"][0]}]}
        else:
            delta = {"role": "assistant", "content": r.text}
        self.sse({**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        self.sse({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if (req.body.get("stream_options") or {}).get("include_usage"):
            self.sse({**chunk, "choices": [], "usage": usage})
        self.sse("[DONE]")

    # --- OpenAI Responses

    def reply_responses(self, req, r, n):
        u = r.usage
        usage = {
            "input_tokens": u["input"] + u["cache_read"],
            "input_tokens_details": {"cached_tokens": u["cache_read"]},
            "output_tokens": u["output"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["input"] + u["cache_read"] + u["output"],
        }
        if r.call:
            item = {"type": "function_call", "id": "fc_%04d" % n, "call_id": "call_%04d" % n,
                    "name": r.call[0], "arguments": json.dumps(r.call[1]), "status": "completed"}
        else:
            item = {"type": "message", "id": "msg_%04d" % n, "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": r.text, "annotations": []}]}
        resp = {"id": "resp_%04d" % n, "object": "response", "created_at": int(time.time()),
                "model": req.model, "status": "completed", "output": [item], "usage": usage}
        if not req.stream:
            return self.send_json(200, resp)
        self.start_sse()
        seq = iter(range(1000))
        ev = lambda kind, **kw: self.sse({"type": kind, "sequence_number": next(seq), **kw}, kind)  # noqa: E731
        ev("response.created", response={**resp, "status": "in_progress", "output": [], "usage": None})
        ev("response.in_progress", response={**resp, "status": "in_progress", "output": [], "usage": None})
        if r.call:
            ev("response.output_item.added", output_index=0, item={**item, "arguments": "", "status": "in_progress"})
            ev("response.function_call_arguments.delta", output_index=0, item_id=item["id"], delta=item["arguments"])
            ev("response.function_call_arguments.done", output_index=0, item_id=item["id"], arguments=item["arguments"])
        else:
            ev("response.output_item.added", output_index=0, item={**item, "content": [], "status": "in_progress"})
            ev("response.content_part.added", output_index=0, item_id=item["id"], content_index=0,
               part={"type": "output_text", "text": "", "annotations": []})
            ev("response.output_text.delta", output_index=0, item_id=item["id"], content_index=0, delta=r.text)
            ev("response.output_text.done", output_index=0, item_id=item["id"], content_index=0, text=r.text)
            ev("response.content_part.done", output_index=0, item_id=item["id"], content_index=0,
               part=item["content"][0])
        ev("response.output_item.done", output_index=0, item=item)
        ev("response.completed", response=resp)

    # --- Gemini

    def reply_gemini(self, req, r, n):
        u = r.usage
        usage = {
            "promptTokenCount": u["input"] + u["cache_read"],
            "candidatesTokenCount": u["output"],
            "cachedContentTokenCount": u["cache_read"],
            "totalTokenCount": u["input"] + u["cache_read"] + u["output"],
        }
        part = {"functionCall": {"name": r.call[0], "args": r.call[1]}} if r.call else {"text": r.text}
        resp = {"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
                "usageMetadata": usage, "modelVersion": req.model, "responseId": "resp_%04d" % n}
        if not req.stream:
            return self.send_json(200, resp)
        self.start_sse()
        self.sse(resp)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, scripts, key, log_path, fallback_usage):
        super().__init__(addr, Handler)
        self.scripts = scripts
        self.key = key
        self.log_path = log_path
        self.fallback_usage = fallback_usage
        self.counter = 0
        self.logged = 0

    def next_id(self):
        with LOCK:
            self.counter += 1
            return self.counter

    def log(self, entry):
        with LOCK:
            self.logged += 1
            entry["seq"] = self.logged
            if self.log_path:
                with open(self.log_path, "a") as f:
                    f.write(json.dumps(entry) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--script", help="the script file (JSON)")
    ap.add_argument("--log", help="append one JSON line per request here")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", help="write the bound port here once listening")
    ap.add_argument("--key-file", help="the key every request must carry (read from this file)")
    ap.add_argument("--lo-up", action="store_true", help="bring the loopback interface up first")
    a = ap.parse_args()
    if a.lo_up:
        lo_up()
    raw = json.load(open(a.script)) if a.script else {}
    scripts = [Script(s) for s in raw.get("scripts", [])]
    key = open(a.key_file).read().strip() if a.key_file else None
    fallback = {**{"input": 10, "output": 1, "cache_read": 0, "cache_write": 0}, **raw.get("fallback_usage", {})}
    srv = Server(("127.0.0.1", a.port), scripts, key, a.log, fallback)
    if a.port_file:
        tmp = a.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(srv.server_address[1]))
        os.replace(tmp, a.port_file)
    print("model_server: listening on 127.0.0.1:%d" % srv.server_address[1], file=sys.stderr, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
