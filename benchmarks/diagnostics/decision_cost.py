"""CPU per request of the app alone: the ASGI app driven in process, the upstream a canned answer
through the transport seam, no server and no sockets. What is left is the decision (parse,
episode, instruction, validation, budget, chaining) and the record's views (headers, the log
line, metrics), the part of ``benchmarks.overhead``'s figure that the HTTP layers do not cost.

    python -m benchmarks.diagnostics.decision_cost [--requests 20000] [--repeats 5] [--stream]
        [--history TURNS] [--gap-us US] [--profile] [--variant LABEL@DIR ...]

Every feature is on (validation, metrics, chaining: no episode header, repair=reflexive); the
request and the answer are ``benchmarks.overhead``'s. With ``--variant``, each checkout runs in
its own subprocess, interleaved repeat by repeat; the figure is process CPU time (not wall
time) per request, the median of the repeats. ``--profile`` prints cProfile's call counts per
request (repeatable under load, unlike times) and the top functions. ``--history TURNS`` sends a
resent history of that many call turns (an assistant call and its tool result each) before the
last user message, as an agent does late in an episode: the per-message work of the budget and
of chaining grows with it. ``--gap-us US`` puts the process to sleep that long before each
request, as a server sleeps between two requests at one client: the same work then costs more
CPU (it starts cold), which is where a request at one client spends its extra time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import select
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from benchmarks.support.fast_upstream import CANNED_COMPLETION
from benchmarks.support.load import REQUEST_BODY

__all__ = ["main"]


class _Answer:
    """The canned upstream answer as a ``TransportResponse``."""

    def __init__(self, body: bytes, stream: bool) -> None:
        self.status_code = 200
        kind = b"text/event-stream" if stream else b"application/json"
        self.headers = [(b"content-type", kind), (b"content-length", b"%d" % len(body))]
        self._body = body

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def iter_body(self) -> AsyncIterator[bytes]:
        yield self._body

    async def read(self) -> bytes:
        return self._body

    async def aclose(self) -> None:
        return None


def _sse_body() -> bytes:
    base = {k: CANNED_COMPLETION[k] for k in ("id", "created", "model")}
    call = CANNED_COMPLETION["choices"][0]["message"]["tool_calls"][0]
    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, **call}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    chunks = [
        b"data: " + orjson.dumps({**base, "object": "chat.completion.chunk", **e}) for e in events
    ]
    return b"\n\n".join([*chunks, b"data: [DONE]"]) + b"\n\n"


class _Canned:
    """A ``Transport`` that answers every request with the same bytes."""

    def __init__(self, stream: bool) -> None:
        self._stream = stream
        self._body = _sse_body() if stream else orjson.dumps(CANNED_COMPLETION)

    async def request(
        self,
        method: str,
        target: str,
        headers: Any,
        body: bytes = b"",
        timeout: float | None = None,
    ) -> _Answer:
        return _Answer(self._body, self._stream)

    async def aclose(self) -> None:
        return None


def _history(turns: int) -> list[dict[str, Any]]:
    """``turns`` call turns, each an assistant call and its (successful) tool result."""
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        call_id = f"call_{turn}"
        arguments = orjson.dumps({"order_id": f"#W{turn:07d}"}).decode()
        function = {"name": "get_order_details", "arguments": arguments}
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        )
        result = {"order_id": f"#W{turn:07d}", "status": "delivered", "items": ["lamp"] * 3}
        messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": orjson.dumps(result).decode()}
        )
    return messages


def _body(stream: bool, turns: int) -> bytes:
    body: dict[str, Any] = dict(REQUEST_BODY)
    if turns:
        system, user = body["messages"]
        body["messages"] = [system, user, *_history(turns), {"role": "user", "content": "And?"}]
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


async def _drive(
    requests: int,
    stream: bool,
    profile: cProfile.Profile | None,
    turns: int = 0,
    gap: float = 0.0,
) -> float:
    """Process CPU seconds for ``requests`` chat completions through the app (after a warm-up);
    with ``gap``, the process sleeps that many seconds before each request, and only the
    requests' own CPU time is summed."""
    from repairproxy.app import create_app
    from repairproxy.settings import Settings

    settings = Settings(upstream="http://bench/v1")
    app = create_app(settings, log_stream=io.BytesIO(), transport=_Canned(stream))
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    lifespan = asyncio.ensure_future(app({"type": "lifespan"}, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    body = _body(stream, turns)
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"authorization", b"Bearer bench"),
            (b"content-length", b"%d" % len(body)),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    message = {"type": "http.request", "body": body, "more_body": False}
    never = asyncio.get_running_loop().create_future()  # no disconnect during a request

    async def request_once() -> None:
        sent = 0

        async def receive() -> dict[str, Any]:
            nonlocal sent
            sent += 1
            if sent == 1:
                return message
            return await never  # type: ignore[no-any-return]

        status = 0

        async def send(event: dict[str, Any]) -> None:
            nonlocal status
            if event["type"] == "http.response.start":
                status = event["status"]

        await app(dict(scope), receive, send)
        assert status == 200, status

    for _ in range(200):
        await request_once()
    if profile is not None:
        profile.enable()
    used = 0.0
    if gap:
        for _ in range(requests):
            select.select([], [], [], gap)  # asleep, as a server between two requests
            began = time.thread_time()
            await request_once()
            used += time.thread_time() - began
    else:
        started = time.process_time()
        for _ in range(requests):
            await request_once()
        used = time.process_time() - started
    if profile is not None:
        profile.disable()
    await inbox.put({"type": "lifespan.shutdown"})
    await lifespan
    return used


def _one(args: argparse.Namespace) -> None:
    import uvloop

    profile = cProfile.Profile() if args.profile else None
    used = uvloop.run(_drive(args.requests, args.stream, profile, args.history, args.gap_us / 1e6))
    print(f"{used / args.requests * 1e6:.2f}")
    if profile is not None:
        stats = pstats.Stats(profile, stream=sys.stderr)
        calls = stats.total_calls  # type: ignore[attr-defined]
        print(f"{calls / args.requests:.1f} function calls a request", file=sys.stderr)
        stats.strip_dirs().sort_stats(args.sort).print_stats(args.top)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--history", type=int, default=0, help="call turns resent per request")
    parser.add_argument(
        "--gap-us",
        type=float,
        default=0.0,
        help="sleep this many µs before each request: its work then starts cold, as a server's "
        "does at one client (2026-12-03: 105 µs a request back to back, 144 after 100 µs, "
        "215 after 1 ms)",
    )
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--sort", default="tottime", choices=["tottime", "cumulative", "ncalls"])
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--variant", action="append", default=[], help="LABEL[@DIR]: a checkout to run from"
    )
    args = parser.parse_args(argv)
    if args.one or args.profile:
        _one(args)
        return
    variants = [v.partition("@")[::2] for v in args.variant] or [("this", "")]
    samples: dict[str, list[float]] = {label: [] for label, _ in variants}
    kind = (
        ("streamed" if args.stream else "JSON")
        + f", {args.history} turns" * bool(args.history)
        + f", {args.gap_us:g} µs asleep before each" * bool(args.gap_us)
    )
    print(
        f"{args.requests} requests ({kind}) per sample, x{args.repeats} interleaved; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    for index in range(args.repeats):
        shift = index % len(variants)
        for label, source in variants[shift:] + variants[:shift]:
            env = dict(os.environ)
            if source:
                env["PYTHONPATH"] = source
            command = [sys.executable, "-m", "benchmarks.diagnostics.decision_cost", "--one"]
            command += ["--requests", str(args.requests), "--history", str(args.history)]
            command += ["--gap-us", str(args.gap_us)] if args.gap_us else []
            command += ["--stream"] if args.stream else []
            out = subprocess.run(
                command, env=env, cwd=source or None, capture_output=True, text=True, check=True
            )
            samples[label].append(float(out.stdout.split()[-1]))
    for label, values in samples.items():
        print(
            f"{label:>12}: median {statistics.median(values):.1f} us/request CPU "
            f"(min {min(values):.1f}, max {max(values):.1f})"
        )


if __name__ == "__main__":
    main()
