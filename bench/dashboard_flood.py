#!/usr/bin/env python3
"""Does gRPC stay responsive while the dashboard is flooded? (issue #27 item 8)

Starts `fvd orchestrator serve --auth FILE --dashboard 127.0.0.1:0` under a
file-descriptor limit (default 256, soft and hard), then, in one run:

  * baseline: `fvd status` over gRPC, N times, nothing else connected;
  * flood: CONNS connections from CLIENTS loopback addresses (127.0.0.2, ...),
    each asking for a live stream (`GET /events`) and held open, then
    `fvd status` N times again while they are held.

Prints each phase's median, p90 and max wall time of `fvd status` (what a
person or script sees: process start-up included), what the flood got
(streams served, 429s, connections closed at once), and the orchestrator's
open descriptors. `--no-caps` passes `--dashboard-max-connections 100000`,
which lifts the caps, to show the failure they prevent: a status call that
does not answer within --timeout counts as a timeout.

Usage: python3 bench/dashboard_flood.py --fvd target/release/fvd
           [--n 20] [--conns 600] [--clients 40] [--fd-limit 256] [--no-caps]
"""

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def status_times(fvd, url, token, n, timeout):
    out = []
    for _ in range(n):
        t = time.monotonic()
        try:
            r = subprocess.run(
                [fvd, "status", "--orchestrator", url, "--token-file", token],
                capture_output=True,
                timeout=timeout,
            )
            ok = r.returncode == 0
        except subprocess.TimeoutExpired:
            ok = False
        out.append((time.monotonic() - t, ok))
    return out


def summary(name, times):
    ok = sorted(t for t, good in times if good)
    failed = len(times) - len(ok)
    if not ok:
        return f"{name}: every call failed or timed out ({failed})"
    p90 = ok[min(len(ok) - 1, int(len(ok) * 0.9))]
    return (
        f"{name}: median {statistics.median(ok) * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms,"
        f" max {ok[-1] * 1000:.1f} ms over {len(ok)} calls; {failed} failed or timed out"
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fvd", default="target/release/fvd")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--conns", type=int, default=600)
    ap.add_argument("--clients", type=int, default=40)
    ap.add_argument("--fd-limit", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--no-caps", action="store_true")
    a = ap.parse_args()
    fvd = os.path.abspath(a.fvd)
    # This process holds every connection of the flood.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as d:
        auth = os.path.join(d, "auth.toml")
        token = os.path.join(d, "viewer.token")
        with open(token, "wb") as f:
            f.write(
                subprocess.run(
                    [fvd, "auth", "add", "viewer", "--role", "viewer", "--file", auth],
                    check=True,
                    capture_output=True,
                ).stdout
            )
        extra = ["--dashboard-max-connections", "100000"] if a.no_caps else []
        serve = subprocess.Popen(
            [
                "sh",
                "-c",
                f'ulimit -n {a.fd_limit} && exec "$0" "$@"',
                fvd,
                "orchestrator",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--db",
                f"sqlite://{d}/state.db",
                "--auth",
                auth,
                "--dashboard",
                "127.0.0.1:0",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            url = serve.stdout.readline().split()[-1]
            dash = serve.stdout.readline().split()[-1]
            host, port = dash.removeprefix("http://").rsplit(":", 1)
            port = int(port)
            fds = lambda: len(os.listdir(f"/proc/{serve.pid}/fd"))
            base = status_times(fvd, url, token, a.n, a.timeout)
            before = fds()
            request = f"GET /events HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n\r\n".encode()
            held, refused_connect = [], 0
            per = max(1, a.conns // a.clients)
            for i in range(a.conns):
                s = socket.socket()
                s.settimeout(5)
                s.bind((f"127.0.0.{2 + i // per}", 0))
                try:
                    s.connect((host, port))
                    s.sendall(request)
                    held.append(s)
                except OSError:
                    refused_connect += 1
                    s.close()
            got = {"stream": 0, "429": 0, "closed": refused_connect, "no answer": 0}
            for s in held:
                s.settimeout(2)
                try:
                    head = s.recv(512)
                except (socket.timeout, OSError) as e:
                    got["no answer" if isinstance(e, socket.timeout) else "closed"] += 1
                    continue
                if not head:
                    got["closed"] += 1
                elif head.startswith(b"HTTP/1.1 200"):
                    got["stream"] += 1
                elif head.startswith(b"HTTP/1.1 429"):
                    got["429"] += 1
                else:
                    got["no answer"] += 1
            loaded = fds()
            flood = status_times(fvd, url, token, a.n, a.timeout)
            print(f"orchestrator fd limit {a.fd_limit}; caps {'lifted' if a.no_caps else 'on'}")
            print(summary("fvd status, quiet", base))
            print(summary(f"fvd status, {a.conns} stream requests from {a.clients} addresses held", flood))
            print(f"flood: {got}; orchestrator descriptors {before} -> {loaded}")
            for s in held:
                s.close()
        finally:
            serve.terminate()
            try:
                serve.wait(timeout=10)
            except subprocess.TimeoutExpired:
                serve.kill()


if __name__ == "__main__":
    sys.exit(main())
