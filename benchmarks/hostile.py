"""Does the front door hold? A bounded mixed hostile load beside well-formed clients (issue 51).

The proxy runs as its own process (``python -m repairproxy serve``) in front of an echo upstream
whose chat answer repeats the user's message, so every well-formed answer can be checked against
its request. Beside the well-formed clients, for ``--seconds``:

- pipeliners: keyless ``GET /healthz`` in 40 KB writes, reading the answers (finding 1);
- stalled readers: the same, never reading (the write deadline);
- slow heads (a byte a second) and half-open sockets (header deadline, connection cap);
- trickled and abandoned bodies, keyless and keyed (early-answer close, body deadline);
- trailer and chunk-extension floods (the head cap holds after the head);
- bad pipelines (a bad request behind good ones) and GET bodies;
- hostile tools: a pattern too large to compile, and tools JSON past the cap (finding 10).

It prints the proxy's peak RSS and open descriptors (``/proc``), the largest event-loop lag the
proxy itself measured (``repairproxy_event_loop_lag_max_seconds``), the well-formed answers that
came back and the ones that were wrong (must be 0), and writes them with
``benchmarks/support/results.py``. The issue asks for a 30-minute run on a quiet machine:

    python -m benchmarks.hostile --seconds 1800
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from benchmarks.support.results import run_recorded, write_json

__all__ = ["main"]

QUESTION = "Under a mixed hostile load, does every well-formed client get its own answer?"
KEY = "bench-key"


class _Echo(BaseHTTPRequestHandler):
    """Chat: a completion whose content is the last user message. Anything else: 200 ``{}``."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(b'{"object": "list", "data": []}')

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        content = request.get("messages", [{}])[-1].get("content", "")
        answer = {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
        }
        self._answer(json.dumps(answer).encode())

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _chat(marker: str, tools: list[Any] | None = None) -> bytes:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": marker}]}
    if tools is not None:
        body["tools"] = tools
    return json.dumps(body).encode()


def _post(port: int, body: bytes, key: str | None = KEY) -> tuple[int, bytes]:
    auth = f"authorization: Bearer {key}\r\n".encode() if key else b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + auth
            + b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        data = b""
        while chunk := client.recv(65536):
            data += chunk
    status = int(data[9:12]) if data[:5] == b"HTTP/" else 0
    return status, data.partition(b"\r\n\r\n")[2]


class _Load:
    def __init__(self, port: int, until: float) -> None:
        self.port = port
        self.until = until
        self.answered = 0
        self.wrong = 0
        self.failed = 0  # well-formed requests with no answer or a non-200 (reported, not "wrong")
        self.hostile = 0
        self.lock = threading.Lock()

    def running(self) -> bool:
        return time.monotonic() < self.until

    def connect(self, timeout: float = 10.0) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    # -- the well-formed ---------------------------------------------------------------------------

    def well_formed(self) -> None:
        while self.running():
            marker = uuid.uuid4().hex
            try:
                status, body = _post(self.port, _chat(marker))
            except OSError:
                status, body = 0, b""
            with self.lock:
                if status != 200:
                    self.failed += 1
                    continue
                self.answered += 1
                content = json.loads(body)["choices"][0]["message"]["content"]
                if content != marker:
                    self.wrong += 1

    # -- the hostile -------------------------------------------------------------------------------

    def _hostile(self, action: Any) -> None:
        while self.running():
            with suppress(OSError, ValueError):
                action()
            with self.lock:
                self.hostile += 1

    def pipeliner(self) -> None:
        def act() -> None:
            with self.connect() as client:
                payload = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n" * 5000
                reader = threading.Thread(target=_drain, args=(client,), daemon=True)
                reader.start()
                for start in range(0, len(payload), 40_000):
                    client.sendall(payload[start : start + 40_000])
                reader.join(timeout=30)

        self._hostile(act)

    def stalled_reader(self) -> None:
        def act() -> None:
            with self.connect() as client:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                payload = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n" * 20000
                client.settimeout(5)
                with suppress(OSError):
                    client.sendall(payload)
                time.sleep(3)

        self._hostile(act)

    def slow_head(self) -> None:
        def act() -> None:
            with self.connect() as client:
                for byte in b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 30:
                    client.sendall(bytes([byte]))
                    time.sleep(1.0)
                    if not self.running():
                        return

        self._hostile(act)

    def half_open(self) -> None:
        def act() -> None:
            held = [self.connect() for _ in range(20)]
            time.sleep(3)
            for sock in held:
                sock.close()

        self._hostile(act)

    def trickled_body(self) -> None:
        def act() -> None:
            for key in (None, KEY):
                with self.connect() as client:
                    auth = f"authorization: Bearer {key}\r\n".encode() if key else b""
                    client.sendall(
                        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                        + auth
                        + b"content-length: 1000\r\n\r\n{"
                    )
                    for _ in range(4):
                        time.sleep(1.0)
                        client.sendall(b" ")
                    _drain(client)

        self._hostile(act)

    def floods(self) -> None:
        def act() -> None:
            for tail in (
                b"2\r\n{}\r\n0\r\n" + b"x-t: " + b"a" * 200 + b"\r\n",
                b"1;" + b"e" * 4096,
            ):
                with self.connect() as client:
                    client.sendall(
                        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                        b"transfer-encoding: chunked\r\n\r\n"
                    )
                    for _ in range(2000):
                        client.sendall(tail if tail.startswith(b"1;") else tail[12:])
                    _drain(client)

        self._hostile(act)

    def bad_pipelines(self) -> None:
        def act() -> None:
            with self.connect() as client:
                client.sendall(
                    b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n" * 3
                    + b"GET /v1/models HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nGET /"
                    + b"BAD\x01 / HTTP/1.1\r\n\r\n"
                )
                _drain(client)

        self._hostile(act)

    def hostile_tools(self) -> None:
        pattern = {f"p{i}": {"type": "string", "pattern": r"(\w{100}){30}"} for i in range(40)}
        slow = [
            {
                "type": "function",
                "function": {"name": "s", "parameters": {"type": "object", "properties": pattern}},
            }
        ]
        big = [
            {
                "type": "function",
                "function": {
                    "name": f"t{i}",
                    "parameters": {
                        "type": "object",
                        "properties": {"a": {"type": "string", "description": "d" * 1000}},
                    },
                },
            }
            for i in range(1024)
        ]

        def act() -> None:
            _post(self.port, _chat("x", slow))
            _post(self.port, _chat("x", big))

        self._hostile(act)


def _drain(client: socket.socket) -> None:
    with suppress(OSError):
        while client.recv(1 << 20):
            pass


def _proc(pid: int) -> tuple[int, int]:
    """(RSS bytes, open descriptors) of ``pid``."""
    rss = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def _metric(port: int, name: str) -> float | None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        data = b""
        while chunk := client.recv(65536):
            data += chunk
    for line in data.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=QUESTION)
    parser.add_argument("--seconds", type=float, default=20.0, help="load duration (default 20)")
    parser.add_argument("--clients", type=int, default=4, help="well-formed clients (default 4)")
    parser.add_argument(
        "--only", action="append", default=[], help="run only this hostile load (repeatable)"
    )
    args = parser.parse_args(argv)
    upstream = _Server(("127.0.0.1", 0), _Echo)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = _free_port()
    deadline = "2"
    command = [
        sys.executable, "-m", "repairproxy", "serve",
        "--upstream", f"http://127.0.0.1:{upstream.server_address[1]}/v1",
        "--port", str(port), "--api-key", KEY, "--repair", "off",
        "--header-timeout", deadline, "--body-timeout", deadline,
        "--write-timeout", deadline, "--keep-alive-timeout", deadline,
        "--max-client-connections", "256",
    ]  # fmt: skip
    # The proxy's log goes to a file: a pipe nobody reads fills after ~1,500 of its "Invalid HTTP
    # request" warnings, and the proxy then blocks on its next log write (it stopped answering
    # for good in a 60 s run; that was this harness, not the proxy).
    with tempfile.NamedTemporaryFile(prefix="hostile-proxy-", suffix=".log", delete=False) as log:
        proxy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    try:
        started = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > started or proxy.poll() is not None:
                    raise SystemExit("the proxy did not start") from None
                time.sleep(0.1)
        base_rss, base_fds = _proc(proxy.pid)
        load = _Load(port, time.monotonic() + args.seconds)
        hostile = [
            load.pipeliner, load.stalled_reader, load.slow_head, load.slow_head,
            load.half_open, load.trickled_body, load.floods, load.bad_pipelines,
            load.hostile_tools,
        ]  # fmt: skip
        if args.only:
            hostile = [work for work in hostile if work.__name__ in args.only]
        workers = [load.well_formed] * args.clients + hostile
        threads = [threading.Thread(target=work, daemon=True) for work in workers]
        for thread in threads:
            thread.start()
        peak_rss, peak_fds = base_rss, base_fds
        while load.running():
            rss, fds = _proc(proxy.pid)
            peak_rss, peak_fds = max(peak_rss, rss), max(peak_fds, fds)
            time.sleep(0.2)
        for thread in threads:
            thread.join(timeout=40)
        # The proxy's own lag metric, read once the load has stopped; how long the proxy took to
        # accept that connection is itself a figure (a proxy still at its connection cap, or a
        # full listen backlog, makes it wait).
        after_load = time.monotonic()
        lag = None
        while lag is None and time.monotonic() - after_load < 120:
            with suppress(OSError):
                lag = _metric(port, "repairproxy_event_loop_lag_max_seconds") or 0.0
        metrics_wait = time.monotonic() - after_load
    finally:
        proxy.terminate()
        try:
            proxy.wait(timeout=40)  # a graceful drain (--drain-timeout 30) first
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait(timeout=10)
        upstream.shutdown()
    figures = {
        "seconds": args.seconds,
        "well_formed_clients": args.clients,
        "well_formed_answered": load.answered,
        "well_formed_wrong": load.wrong,
        "well_formed_failed": load.failed,
        "hostile_attempts": load.hostile,
        "rss_start_mib": round(base_rss / 2**20, 1),
        "rss_peak_mib": round(peak_rss / 2**20, 1),
        "fds_start": base_fds,
        "fds_peak": peak_fds,
        "max_loop_lag_ms": None if lag is None else round(lag * 1000, 1),
        "seconds_until_metrics_answered_after_load": round(metrics_wait, 1),
    }
    print(f"{QUESTION}\n")
    print(f"load: {args.seconds:g} s, {args.clients} well-formed clients beside 9 hostile ones")
    print(
        f"well-formed answers: {load.answered}, wrong: {load.wrong}, "
        f"no answer or not 200: {load.failed}"
    )
    print(f"hostile attempts: {load.hostile}")
    print(f"proxy RSS: {figures['rss_start_mib']} MiB at start, {figures['rss_peak_mib']} MiB peak")
    print(f"proxy descriptors: {base_fds} at start, {peak_fds} peak")
    print(f"max event-loop lag (the proxy's own metric): {figures['max_loop_lag_ms']} ms")
    print(
        f"after the load, /metrics answered in {metrics_wait:.1f} s"
        + ("" if lag is not None else " (never, within 120 s)")
    )
    write_json("hostile", figures, command="python -m benchmarks.hostile " + " ".join(argv or []))
    if load.wrong:
        raise SystemExit(1)


if __name__ == "__main__":
    raise SystemExit(run_recorded("hostile", main))
