"""Memory and event-loop bounds under a hostile mix: does one kind of request grow the proxy?

Starts a scripted loopback upstream (in a thread) and ``python -m repairproxy serve`` as a
subprocess, then sends each hostile shape in turn, reading the proxy's RSS from /proc before and
after: big headers (just under the cap, and far over it: 431), many tools (distinct lists of the
``--max-tools`` cap), many episodes (a fresh ``X-Episode-ID`` each), big streams (4 MB SSE). Prints
bytes kept per request per shape, then runs the mix for ``--seconds`` and prints the peak RSS
against ``baseline + sum of the configured caps + 32 MiB`` (the formula printed with its terms).
Last, the largest ``/healthz`` delay (event-loop lag seen from outside, polled every 5 ms) during a
4 MB stream and during a 5,000-tool constrained request.

    python -m benchmarks.memory [--seconds 600] [--source DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson

from benchmarks.support.results import run_recorded

__all__ = ["main"]

QUESTION = "Does any one kind of hostile request grow the proxy's memory or hold its event loop?"

MIB = 1 << 20
_STREAM_EVENT = b"data: " + orjson.dumps(
    {"id": "s", "object": "chat.completion.chunk", "created": 1, "model": "m",
     "choices": [{"index": 0, "delta": {"content": "x" * 1000}, "finish_reason": None}]}
) + b"\n\n"  # fmt: skip


def _completion(content: str | None, calls: list[dict[str, Any]]) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return orjson.dumps(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )


_CALL = [
    {
        "id": "call_1",
        "type": "function",
        "function": {"name": "tool_0", "arguments": '{"order_id": "#W1"}'},
    }
]
_PLAIN = _completion(None, _CALL)
_LONG = _completion(
    "tool_1 " * 14_000, [{**_CALL[0], "function": {"name": "nope", "arguments": "{"}}]
)


async def _upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = await reader.readexactly(length)
            if b"BIGSTREAM" in body:
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                for _ in range(4000):  # 4 MB of content deltas
                    writer.write(b"%x\r\n%s\r\n" % (len(_STREAM_EVENT), _STREAM_EVENT))
                    await writer.drain()
                done = b"data: [DONE]\n\n"
                writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            else:
                answer = _LONG if b"LONGTEXT" in body else _PLAIN
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(answer), answer)
                )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def _start_upstream() -> int:
    ready: list[int] = []

    async def run() -> None:
        server = await asyncio.start_server(_upstream, "127.0.0.1", 0, limit=64 * MIB)
        ready.append(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(run()), daemon=True).start()
    while not ready:
        time.sleep(0.01)
    return ready[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _tools(count: int, salt: int) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": f"tool {i} of list {salt}",
                "parameters": {
                    "type": "object",
                    "properties": {"order_id": {"type": "string"}},
                    "required": ["order_id"],
                },
            },
        }
        for i in range(count)
    ]


class _Shapes:
    """Each hostile request shape, as a function of its sequence number."""

    def __init__(self, client: httpx.Client, max_tools: int) -> None:
        self.client = client
        self.max_tools = max_tools
        self.tool_lists = [orjson.dumps(_tools(max_tools, salt)) for salt in range(8)]

    def _chat(self, body: bytes, **headers: str) -> int:
        response = self.client.post(
            "/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json", **headers},
        )
        return response.status_code

    def headers_under_cap(self, n: int) -> int:
        return self._chat(b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
                          **{"x-pad": "a" * 60_000})  # fmt: skip

    def headers_over_cap(self, n: int) -> int:
        address = ("127.0.0.1", int(self.client.base_url.port or 80))
        with socket.create_connection(address, timeout=30) as sock:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * MIB)
            answer = sock.recv(64)
        return int(answer.split(b" ")[1]) if answer else 0

    def many_tools(self, n: int) -> int:
        tools = self.tool_lists[n % len(self.tool_lists)]
        body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":%s}' % tools
        return self._chat(body)

    def many_episodes(self, n: int) -> int:
        history = [{"role": "user", "content": f"turn {i} " * 50} for i in range(20)]
        body = orjson.dumps({"model": "m", "messages": history, "tools": _tools(3, 0)})
        return self._chat(body, **{"x-episode-id": f"episode-{n}-{time.monotonic_ns()}"})

    def big_stream(self, n: int) -> int:
        body = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"BIGSTREAM"}]}'
        with self.client.stream(
            "POST", "/v1/chat/completions", content=body,
            headers={"content-type": "application/json"},
        ) as response:  # fmt: skip
            for _ in response.iter_raw():
                pass
            return response.status_code


def _max_healthz_delay(base: str, during: Callable[[], Any]) -> float:
    """The largest /healthz round trip (s) while ``during`` runs, polled every 5 ms."""
    worst = 0.0
    done = threading.Event()

    def poll() -> None:
        nonlocal worst
        with httpx.Client(base_url=base, timeout=60) as client:
            while not done.is_set():
                started = time.perf_counter()
                client.get("/healthz")
                worst = max(worst, time.perf_counter() - started)
                time.sleep(0.005)

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        during()
    finally:
        done.set()
        thread.join()
    return worst


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=f"{QUESTION}\n\n{__doc__}", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=600.0, help="length of the mixed run")
    parser.add_argument("--per-shape", type=int, default=40, help="requests per shape, measured")
    parser.add_argument("--source", default=None, help="a checkout to run the proxy from")
    args = parser.parse_args(argv)
    if args.source:
        sys.path.insert(0, args.source)
    from repairproxy.settings import Settings

    defaults = Settings(upstream="-")
    max_tools = int(getattr(defaults, "max_tools", 1024))
    upstream_port = _start_upstream()
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.source:
        env["PYTHONPATH"] = args.source
    command = [sys.executable, "-m", "repairproxy", "serve", "--port", str(port)]
    command += ["--upstream", f"http://127.0.0.1:{upstream_port}/v1", "--repair", "reflexive"]
    if hasattr(defaults, "max_tools"):
        command += ["--max-tools", "5000"]  # the constrained probe below declares 5,000
    proxy = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the proxy did not start")
            time.sleep(0.1)
        with httpx.Client(base_url=base, timeout=120) as client:
            shapes = _Shapes(client, max_tools)
            order: list[tuple[str, Callable[[int], int]]] = [
                ("headers_under_cap", shapes.headers_under_cap),
                ("headers_over_cap", shapes.headers_over_cap),
                ("many_tools", shapes.many_tools),
                ("many_episodes", shapes.many_episodes),
                ("big_stream", shapes.big_stream),
            ]
            for _, shape in order:  # warm-up: imports, pools, first compilations
                shape(0)
            baseline = _rss(proxy.pid)
            print(f"baseline RSS after warm-up: {baseline / MIB:.1f} MiB")
            print(f"{'shape':>18} {'requests':>8} {'statuses':>14} {'kept/request':>14}")
            for name, shape in order:
                before = _rss(proxy.pid)
                statuses = sorted({shape(n + 1) for n in range(args.per_shape)})
                kept = (_rss(proxy.pid) - before) / args.per_shape
                print(
                    f"{name:>18} {args.per_shape:>8} {statuses!s:>14} {kept / 1024:>11.1f} KiB",
                    flush=True,
                )
            peak = _rss(proxy.pid)
            started = time.monotonic()
            count = 0
            while time.monotonic() - started < args.seconds:
                name, shape = order[count % len(order)]
                shape(count)
                count += 1
                peak = max(peak, _rss(proxy.pid))
            caps = _caps(defaults)
            bound = baseline + sum(caps.values()) + 32 * MIB
            terms = " + ".join(f"{k} {v / MIB:.1f}" for k, v in caps.items())
            print(
                f"mixed run: {count} requests in {time.monotonic() - started:.0f} s; peak RSS "
                f"{peak / MIB:.1f} MiB; bound = baseline {baseline / MIB:.1f} + {terms} + 32 "
                f"= {bound / MIB:.1f} MiB -> {'within' if peak <= bound else 'OVER'}"
            )
            stream_lag = _max_healthz_delay(base, lambda: shapes.big_stream(0))
            print(f"max /healthz delay during a 4 MB stream: {stream_lag * 1e3:.1f} ms")

            def constrained() -> None:
                body = orjson.dumps(
                    {
                        "model": "m",
                        "messages": [{"role": "user", "content": "LONGTEXT"}],
                        "tools": _tools(5000, 99),
                    }
                )
                status = client.post(
                    "/v1/chat/completions",
                    content=body,
                    headers={
                        "content-type": "application/json",
                        "x-repairproxy-repair": "constrained",
                    },
                ).status_code
                print(f"  (5,000-tool constrained request answered {status})")

            tools_lag = _max_healthz_delay(base, constrained)
            print(
                f"max /healthz delay during a 5,000-tool constrained request over 100 KB of "
                f"text: {tools_lag * 1e3:.1f} ms"
            )
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)


def _caps(settings: Any) -> dict[str, int]:
    """The configured memory caps (those this checkout has), bytes."""
    caps = {
        "tools cache": int(getattr(settings, "tools_cache_bytes", 0)),
        "episode store": int(getattr(settings, "max_episode_memory", 0)),
        # one in-flight body per connection would be max_client_connections x 16 MiB: the mix
        # is sequential, so one body and one header block in flight
        "one body": int(settings.max_body_bytes),
        "one header block": int(getattr(settings, "max_header_bytes", 0)),
    }
    return {name: value for name, value in caps.items() if value}


if __name__ == "__main__":
    raise SystemExit(run_recorded("memory", main))
