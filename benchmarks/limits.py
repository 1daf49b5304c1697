"""What one hostile request costs the event loop and the tools cache, printed before/after.

* the largest event-loop lag (a 1 ms ticker's worst delay) while a 4 MB chat stream with declared
  tools goes through the relay's parser, gate and ``upstream.timed`` (which yields between chunks),
  for prose and for a call written as text, in 1 MB and 4 MB to show the growth is linear;
* the same lag while ``constrained`` mode judges a 100 KB answer against 5,000 declared tools;
* the memory a compiled tools list really takes per byte of its JSON (RSS, since jsonschema-rs
  allocates outside Python's allocator, where tracemalloc cannot see it): the factor behind
  ``validation.COMPILED_BYTES_PER_JSON_BYTE``.

Run it on today's tree and on an older checkout to compare (``PYTHONPATH=/path/to/old``):

    python -m benchmarks.limits
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from benchmarks.support.results import run_recorded
from repairproxy.asgi.gate import SSEParser, ToolCallGate
from repairproxy.repair import RepairPolicy, escalated_tool_choice
from repairproxy.types import RepairMode
from repairproxy.upstream.client import UpstreamTimer, timed
from repairproxy.validation import CompiledTools, ToolsCache

__all__ = ["main"]

QUESTION = "What does one hostile request cost the event loop and the tools cache?"


def _event(text: str) -> bytes:
    payload = {"id": "c", "choices": [{"index": 0, "delta": {"content": text}}]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _stream(size: int, first: str) -> list[bytes]:
    body = _event(first) + _event("word " * 8) * (size // len(_event("word " * 8)))
    return [body[i : i + 16384] for i in range(0, len(body), 16384)]


async def _max_lag(work: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """(the work's wall seconds, the worst delay of a 1 ms ticker meanwhile, seconds)."""
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        while not done:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - before - 0.001)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    await work()
    elapsed = time.perf_counter() - started
    done = True
    await task
    return elapsed, worst


async def _relay(chunks: list[bytes]) -> None:
    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    parser, gate = SSEParser(), ToolCallGate()
    async for chunk in timed(body(), UpstreamTimer()):
        for event in parser.feed(chunk):
            gate.feed(event)
    gate.assembler.completion()


async def _constrained(tools: int, text_bytes: int) -> None:
    compiled = CompiledTools([(f"tool_{i}", {"type": "object"}) for i in range(tools)])
    text = ("plain words " * (text_bytes // 12)) + ' {"name": "tool_x", "arguments": {}}'
    message = {"role": "assistant", "content": text}
    verdict = compiled.check_message(message)
    policy = RepairPolicy(mode=RepairMode.CONSTRAINED)
    escalated_tool_choice({}, verdict, 2, policy, message, compiled)


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _compiled_factor(lists: int = 8, tools: int = 200) -> tuple[float, int]:
    """RSS growth per byte of tools JSON over ``lists`` distinct lists kept in the cache."""
    cache: Any = ToolsCache(max_entries=lists + 1)
    if hasattr(cache, "max_bytes"):
        cache.max_bytes = 1 << 40
    bodies = []
    for variant in range(lists):
        properties = {
            f"v{variant}_p{i}": {"type": "string", "description": "a field " * 4} for i in range(20)
        }
        bodies.append(
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": f"t{i}",
                            "parameters": {"type": "object", "properties": properties},
                        },
                    }
                    for i in range(tools)
                ]
            }
        )
    json_bytes = sum(len(orjson.dumps([b["tools"], None])) for b in bodies)
    before = _rss()
    for body in bodies:
        cache.compile(body)
    return (_rss() - before) / json_bytes, json_bytes


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=QUESTION).parse_args(argv)
    for label, first in (
        ("prose", "Sure, "),
        ("call as text", '{"name": "get_order", "arguments": "'),
    ):
        for size in (1 << 20, 4 << 20):
            chunks = _stream(size, first)
            elapsed, lag = asyncio.run(_max_lag(functools.partial(_relay, chunks)))
            print(
                f"stream {label:12s} {size >> 20} MB: relay {elapsed * 1000:8.1f} ms, "
                f"max loop lag {lag * 1000:7.1f} ms"
            )
    elapsed, lag = asyncio.run(_max_lag(lambda: _constrained(5000, 100_000)))
    print(
        f"constrained 5,000 tools x 100 KB: judge {elapsed * 1000:8.1f} ms, "
        f"max loop lag {lag * 1000:7.1f} ms"
    )
    factor, json_bytes = _compiled_factor()
    print(f"compiled tools: {factor:.1f} bytes of RSS per byte of tools JSON ({json_bytes} bytes)")


if __name__ == "__main__":
    raise SystemExit(run_recorded("limits", main))
