"""Soak: ``python -m benchmarks.soak --minutes M`` drives the proxy with steady mixed traffic and
watches its memory.

Traffic (round robin, at ``--rate`` requests/s): valid tool calls, hallucinated names (repaired
by a re-ask), streamed answers, upstream faults (500s and connections reset mid-body), and
clients that hang up before the answer. Episodes come and go (header ids and header-less
conversations). The proxy runs as its own process with a bounded episode store; its RSS is
sampled every 5 s. After a warm-up minute, the run fails when RSS grows by more than 10% or
5 MiB, whichever is larger. The series is printed either way. Exit status 0 = bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import socket
import subprocess
import sys
import time
from collections import Counter

import httpx
import orjson

from benchmarks.support.load import free_port, rss_mib, wait_port
from benchmarks.support.results import run_recorded

QUESTION = (
    "Do the proxy's memory, descriptors and answers hold under hours of steady mixed traffic?"
)

_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    }
]
KINDS = ("valid", "hallucinated", "stream", "fault", "abandoned", "valid", "hallucinated")


def _completion(name: str) -> bytes:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": name, "arguments": '{"order_id": "#W1"}'},
    }
    return orjson.dumps(
        {
            "id": "chatcmpl-soak",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
        }
    )


_GOOD, _BAD = _completion("get_order_details"), _completion("lookup_order")


async def _upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers by the request's ``x-soak-kind``; re-asks (more messages) always get a good call."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            kind = b"valid"
            for line in head.split(b"\r\n"):
                lower = line.lower()
                if lower.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
                elif lower.startswith(b"x-soak-kind:"):
                    kind = line.split(b":", 1)[1].strip()
            body = await reader.readexactly(length)
            reask = body.count(b'"role"') > 2
            if kind == b"fault":
                writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 500\r\n\r\n{"id":')
                await writer.drain()
                writer.transport.abort()
                return
            if kind == b"abandoned":
                await asyncio.sleep(0.3)
            if kind == b"stream" and not reask:
                events = (
                    b"".join(
                        b"data: "
                        + orjson.dumps({"id": "c", "choices": [{"index": 0, "delta": d}]})
                        + b"\n\n"
                        for d in (
                            {"role": "assistant", "content": "Looking"},
                            {"content": " it up."},
                        )
                    )
                    + b"data: [DONE]\n\n"
                )
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(events), events)
                )
            else:
                payload = _BAD if kind == b"hallucinated" and not reask else _GOOD
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
                )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        pass  # the client left, or the run ended (3.11 logs a cancelled handler otherwise)
    finally:
        writer.close()


async def _abandon(port: int, body: bytes, episode: str) -> None:
    """A client that sends its request and hangs up before the answer."""
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"x-soak-kind: abandoned\r\nx-episode-id: %s\r\ncontent-length: %d\r\n\r\n%s"
        % (episode.encode(), len(body), body)
    )
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.transport.abort()


async def _drive(args: argparse.Namespace, port: int, pid: int) -> list[tuple[float, float]]:
    series: list[tuple[float, float]] = []
    outcomes: Counter[str] = Counter()
    kinds = itertools.cycle(KINDS)
    started = time.monotonic()
    deadline = started + args.minutes * 60
    interval = 1.0 / args.rate
    pending: set[asyncio.Task[None]] = set()
    next_sample = started
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1", timeout=10) as client:

        async def one(index: int, kind: str) -> None:
            episode = f"soak-{index // 5}"  # five requests per episode, then a new one
            body = {
                "model": "m",
                "messages": [
                    {"role": "system", "content": "agent"},
                    {"role": "user", "content": f"order {index // 5}"},
                ],
                "tools": _TOOLS,
                "stream": kind == "stream",
            }
            raw = orjson.dumps(body)
            if kind == "abandoned":
                await _abandon(port, raw, episode)
                outcomes["abandoned"] += 1
                return
            headers = {"x-soak-kind": kind, "content-type": "application/json"}
            if index % 3:
                headers["x-episode-id"] = episode  # every third conversation is chained instead
            try:
                response = await client.post("/chat/completions", content=raw, headers=headers)
                outcomes[f"{kind}:{response.status_code}"] += 1
            except httpx.HTTPError as exc:
                outcomes[f"{kind}:{type(exc).__name__}"] += 1

        for index in itertools.count():
            now = time.monotonic()
            if now >= deadline:
                break
            if now >= next_sample:
                series.append((now - started, rss_mib(pid)))
                next_sample += 5.0
            task = asyncio.create_task(one(index, next(kinds)))
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(max(0.0, started + (index + 1) * interval - time.monotonic()))
        await asyncio.gather(*pending, return_exceptions=True)
    series.append((time.monotonic() - started, rss_mib(pid)))
    print("outcomes:", ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    return series


def verdict(series: list[tuple[float, float]], warmup: float) -> tuple[bool, str]:
    """Bounded when RSS after the warm-up grows by at most max(10%, 5 MiB)."""
    after = [rss for t, rss in series if t >= warmup]
    if len(after) < 2:
        return True, "run shorter than the warm-up: nothing to judge"
    base = after[0]
    allowed = max(0.10 * base, 5.0)
    growth = max(after) - base
    ok = growth <= allowed
    return ok, f"RSS after warm-up {base:.1f} MiB, grew {growth:+.1f} MiB (allowed {allowed:.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=f"{QUESTION}\n\n{__doc__}", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=40.0, help="requests per second")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before judging")
    args = parser.parse_args(argv)

    async def serve_upstream(sock: socket.socket) -> None:
        server = await asyncio.start_server(_upstream, sock=sock)
        async with server:
            await server.serve_forever()

    upstream_sock = socket.socket()
    upstream_sock.bind(("127.0.0.1", 0))
    upstream_port = upstream_sock.getsockname()[1]
    port = free_port()
    proxy = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "repairproxy",
            "serve",
            "--port",
            str(port),
            "--upstream",
            f"http://127.0.0.1:{upstream_port}/v1",
            "--repair",
            "reflexive",
            "--max-episodes",
            "2000",
            "--upstream-timeout",
            "5",
        ],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
    )

    async def run() -> list[tuple[float, float]]:
        upstream = asyncio.create_task(serve_upstream(upstream_sock))
        await asyncio.to_thread(wait_port, port)
        try:
            return await _drive(args, port, proxy.pid)
        finally:
            upstream.cancel()

    try:
        series = asyncio.run(run())
        alive = proxy.poll() is None
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
    print("t(s)   RSS(MiB)")
    for t, rss in series:
        print(f"{t:6.0f} {rss:8.1f}")
    ok, why = verdict(series, args.warmup)
    print(("bounded: " if ok else "GROWING: ") + why + ("" if alive else "; the proxy died"))
    return 0 if ok and alive else 1


if __name__ == "__main__":
    raise SystemExit(run_recorded("soak", main))
