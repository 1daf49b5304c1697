"""Growth curves: the cost of one request for 1x and 4x its input, for every input that grows.

A per-request cost that grows faster than its input is a limit users meet only when they scale:
a long stream, a long conversation, a long answer. Each curve measures one cost at a size and at
four times it, interleaved, repeated; it prints the median of the repeats' same-run ratios
(4x the input should cost at most 4.5x):

* ``stream/chat``, ``stream/responses``, ``stream/messages``: the proxy's CPU per streamed request
  (its process, from /proc) whose text arrives in N and 4N deltas, then a call written as text (a
  gated stream, tools declared, read delta by delta; ``benchmarks.support.stream_upstream``);
* ``history``: one chained turn (``ErrorBudget``: episode lookup by the history's digest, the
  tool results counted, the answer linked) on a conversation of M and 4M messages resent whole,
  the turn before it already seen (the digest cache warm, as in a running agent);
* ``textcalls/...``: ``read_text_calls`` on answers of B and 4B bytes with fences (one left open
  at the end; code fences holding calls);
* ``taint``: the promotion taint index (``textcall_taint.QuotedCalls``) built over a conversation
  of T and 4T turns (tool results holding JSON, calls and JSON escaped in JSON strings; user turns
  with fenced calls), then asked about one call;
* ``resent/responses``: the proxy's CPU per ``/v1/responses`` request from a client that resends
  the whole chain as ``input`` each turn (no ``previous_response_id``) of C and 4C turns (a call
  and its result each), a short streamed answer.

    python -m benchmarks.growth [--deltas 1500] [--messages 10000] [--turns 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, cast

import orjson
import uvloop

from benchmarks.support.load import TOOLS, Target, free_port, wait_port
from benchmarks.support.results import run_recorded

__all__ = ["main"]

QUESTION = "Does every per-request cost grow at most linearly with its input (4x: at most 4.5x)?"
GOAL = 4.5

_USER = {"role": "user", "content": "Where is my order #W2378156?"}
_TOOL: dict[str, Any] = cast(dict[str, Any], TOOLS[0]["function"])
_BODIES: dict[str, tuple[bytes, dict[str, Any]]] = {
    "chat": (
        b"/v1/chat/completions",
        {"model": "m", "messages": [_USER], "tools": TOOLS, "stream": True},
    ),
    "responses": (
        b"/v1/responses",
        {
            "model": "m",
            "input": _USER["content"],
            "tools": [{"type": "function", **_TOOL}],
            "stream": True,
        },
    ),
    "messages": (
        b"/v1/messages",
        {
            "model": "m",
            "max_tokens": 256,
            "messages": [_USER],
            "tools": [
                {
                    "name": _TOOL["name"],
                    "description": _TOOL.get("description", ""),
                    "input_schema": _TOOL["parameters"],
                }
            ],
            "stream": True,
        },
    ),
}


def _request(port: int, path: bytes, body: dict[str, Any], deltas: int) -> bytes:
    raw = orjson.dumps(body)
    return (
        b"POST %s?deltas=%d HTTP/1.1\r\nhost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n"
        b"anthropic-version: 2023-06-01\r\ncontent-length: %d\r\n\r\n%s"
        % (path, deltas, port, len(raw), raw)
    )


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ratio_line(name: str, size: str, small: list[float], large: list[float], unit: str) -> str:
    ratios = [b / a for a, b in zip(small, large, strict=True) if a > 0]
    ratio = statistics.median(ratios)
    verdict = "ok" if ratio <= GOAL else f"ABOVE {GOAL}x"
    return (
        f"{name:22} {size:22} {statistics.median(small):10.1f} -> "
        f"{statistics.median(large):10.1f} {unit:8} {ratio:5.2f}x "
        f"(repeats {min(ratios):.2f}-{max(ratios):.2f}) {verdict}"
    )


def _resent_chain(turns: int) -> dict[str, Any]:
    """A Responses request resending ``turns`` calls and their results whole, then a question."""
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": _USER["content"]}]
    for turn in range(turns):
        call_id = f"call_{turn:08d}"
        arguments = orjson.dumps({"order_id": f"#W{turn}"}).decode()
        items.append(
            {
                "type": "function_call",
                "call_id": call_id,
                "name": _TOOL["name"],
                "arguments": arguments,
            }
        )
        output = orjson.dumps({"order_id": f"#W{turn}", "status": "delivered"}).decode()
        items.append({"type": "function_call_output", "call_id": call_id, "output": output})
    items.append({"type": "message", "role": "user", "content": "And the next one?"})
    return {**_BODIES["responses"][1], "input": items}


async def _resent_chains(args: argparse.Namespace, proxy_port: int, pid: int) -> str:
    """CPU per request for a resent chain of C and 4C turns (a short answer: 10 deltas)."""
    sizes = (args.turns, args.turns * 4)
    payloads = {n: _request(proxy_port, b"/v1/responses", _resent_chain(n), 10) for n in sizes}
    for n in sizes:  # warm-up
        await Target(f"resent/{n}", proxy_port, payloads[n]).round(1, 3, record=False)
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for repeat in range(args.repeats):
        for n in sizes if repeat % 2 == 0 else sizes[::-1]:
            before = _cpu_seconds(pid)
            fresh = Target(f"resent/{n}", proxy_port, payloads[n])
            await fresh.round(1, args.resent_requests, record=False)
            samples[n].append((_cpu_seconds(pid) - before) / args.resent_requests * 1e6)
    size = f"{sizes[0]} -> {sizes[1]} turns"
    return _ratio_line("resent/responses", size, samples[sizes[0]], samples[sizes[1]], "us")


async def _served(args: argparse.Namespace, proxy_port: int, pid: int) -> list[str]:
    """The curves measured through the proxy process."""
    return [*await _streams(args, proxy_port, pid), await _resent_chains(args, proxy_port, pid)]


async def _streams(args: argparse.Namespace, proxy_port: int, pid: int) -> list[str]:
    lines = []
    for api, (path, body) in _BODIES.items():
        sizes = (args.deltas, args.deltas * 4)
        payloads = {n: _request(proxy_port, path, body, n) for n in sizes}
        # A fresh connection (Target) each round: the server closes one left idle meanwhile.
        for n in sizes:  # warm-up
            await Target(f"{api}/{n}", proxy_port, payloads[n]).round(1, 5, record=False)
        samples: dict[int, list[float]] = {n: [] for n in sizes}
        for repeat in range(args.repeats):
            order = sizes if repeat % 2 == 0 else sizes[::-1]
            for n in order:
                before = _cpu_seconds(pid)
                fresh = Target(f"{api}/{n}", proxy_port, payloads[n])
                await fresh.round(1, args.stream_requests, record=False)
                samples[n].append((_cpu_seconds(pid) - before) / args.stream_requests * 1e6)
        size = f"{sizes[0]} -> {sizes[1]} deltas"
        lines.append(_ratio_line(f"stream/{api}", size, samples[sizes[0]], samples[sizes[1]], "us"))
    return lines


def _in_process(
    name: str, size: str, make: Callable[[int], Callable[[], Any]], base: int, repeats: int
) -> str:
    """Best-of-3 process time of ``make(n)()`` for n = base and 4 * base, ``repeats`` times."""
    runs = {n: make(n) for n in (base, base * 4)}
    samples: dict[int, list[float]] = {n: [] for n in runs}
    for _ in range(repeats):
        for n, run in runs.items():
            best = float("inf")
            for _ in range(3):
                gc.collect()
                started = time.process_time()
                run()
                best = min(best, time.process_time() - started)
            samples[n].append(best * 1e3)
    return _ratio_line(name, size, samples[base], samples[base * 4], "ms")


def _history_turn(messages: int) -> Callable[[], Any]:
    from repairproxy.episodes.budget import ErrorBudget
    from repairproxy.episodes.memory_store import MemoryEpisodeStore

    history: list[dict[str, Any]] = [_USER]
    turn = 0
    while len(history) < messages + 2:
        call_id = f"call_{turn:08d}"
        arguments = orjson.dumps({"order_id": f"#W{turn}"}).decode()
        function = {"name": _TOOL["name"], "arguments": arguments}
        call = {"id": call_id, "type": "function", "function": function}
        history.append({"role": "assistant", "content": None, "tool_calls": [call]})
        history.append({"role": "tool", "tool_call_id": call_id, "content": '{"ok": true}'})
        turn += 1
    history = history[: messages + 1]
    while history[-1]["role"] != "tool":  # the resent history ends with the last call's result
        history.pop()
    budget = ErrorBudget(MemoryEpisodeStore())
    answer = {"role": "assistant", "content": "Done."}

    async def one(messages_sent: list[dict[str, Any]], answered: Any) -> Any:
        body = {"model": "m", "messages": messages_sent}
        ref = await budget.resolve_episode({}, body)
        await budget.observe_request(ref, body)
        await budget.remember_answer(ref, body, answered)
        return ref

    # The turn before, answered by the proxy with the call whose result ends the history: the
    # timed turn then continues that episode (a chained turn, as in a running agent).
    first = asyncio.run(one(history[:-2], history[-2]))
    again = asyncio.run(one(history, answer))
    if again.id != first.id:
        raise RuntimeError("the timed history turn did not chain to the turn before")
    return lambda: asyncio.run(one(history, answer))


def _textcalls(shape: str) -> Callable[[int], Callable[[], Any]]:
    from repairproxy.textcalls import read_text_calls

    call = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'
    makers: dict[str, Callable[[int], str]] = {
        "open fence at the end": lambda n: (
            ("Let me check.\n```json\n" + call + "\n```\n") * n + "```json\n" + call
        ),
        "code fences with calls": lambda n: ("```python\n" + call + "\n```\n" + call + "\n") * n,
        "open fence, bare calls": lambda n: "```\n" + ("Then " + call + "\n") * n,
    }

    def make(n: int) -> Callable[[], Any]:
        text = makers[shape](n)
        return lambda: read_text_calls(text)

    return make


def _taint_index(turns: int) -> Callable[[], Any]:
    """Build the taint index over ``turns`` turns and ask it about one call (not quoted)."""
    from repairproxy.textcall_shapes import find_text_calls
    from repairproxy.textcall_taint import QuotedCalls

    messages: list[dict[str, Any]] = [{"role": "system", "content": "You look up orders."}]
    for turn in range(turns):
        call = {"name": "get_order_details", "arguments": {"order_id": f"#W{turn}"}}
        quoted = orjson.dumps(call).decode()
        page = {"order": f"#W{turn}", "note": quoted, "items": [{"sku": turn, "qty": 1}]}
        user = f"Please check this:\n```json\n{quoted}\n```\nthanks"
        call_id = f"call_{turn:08d}"
        function = {"name": call["name"], "arguments": orjson.dumps(call["arguments"]).decode()}
        messages += [
            {"role": "user", "content": user},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            },
            {"role": "tool", "tool_call_id": call_id, "content": orjson.dumps(page).decode()},
        ]
    source = '{"name": "cancel_order", "arguments": {"order_id": "#W1"}}'

    def run() -> bool:
        index = QuotedCalls(messages, find_text_calls)
        return index.holds("cancel_order", {"order_id": "#W1"}, source)

    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=f"{QUESTION}\n\n{__doc__}", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--deltas", type=int, default=1500, help="text deltas of the short stream")
    parser.add_argument("--stream-requests", type=int, default=5, help="per repeat and size")
    parser.add_argument("--messages", type=int, default=10_000, help="the short history")
    parser.add_argument("--fences", type=int, default=100, help="fenced blocks, short answer")
    parser.add_argument("--turns", type=int, default=1000, help="the short resent Responses chain")
    parser.add_argument("--resent-requests", type=int, default=10, help="per repeat and size")
    parser.add_argument("--taint-turns", type=int, default=500, help="the short taint index")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(
        f"machine: {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f} "
        "(other processes share the cpus: ratios are of one run, medians of its repeats)"
    )
    print(f"{'curve':22} {'input':22} {'1x':>10}    {'4x':>10} {'':8} ratio")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    upstream_port, proxy_port = free_port(), free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.support.stream_upstream", "--port", str(upstream_port)],
        env=env,
    )
    proxy = subprocess.Popen(
        [
            *(sys.executable, "-m", "repairproxy", "serve", "--port", str(proxy_port)),
            *("--upstream", f"http://127.0.0.1:{upstream_port}/v1", "--repair", "reflexive"),
            *("--upstream-apis", "chat,responses,messages"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_port(upstream_port)
        wait_port(proxy_port)
        for line in uvloop.run(_served(args, proxy_port, proxy.pid)):
            print(line, flush=True)
    finally:
        for process in (proxy, upstream):
            process.terminate()
            process.wait(10)
    size = f"{args.messages} -> {args.messages * 4} msgs"
    print(_in_process("history", size, _history_turn, args.messages, args.repeats), flush=True)
    for shape in ("open fence at the end", "code fences with calls", "open fence, bare calls"):
        size = f"{args.fences} -> {args.fences * 4} blocks"
        line = _in_process(f"textcalls/{shape[:12]}", size, _textcalls(shape), args.fences, 3)
        print(f"{line}   [{shape}]", flush=True)
    size = f"{args.taint_turns} -> {args.taint_turns * 4} turns"
    print(_in_process("taint", size, _taint_index, args.taint_turns, args.repeats), flush=True)
    one, five, fifteen = os.getloadavg()
    print(f"load average at the end: {one:.2f}, {five:.2f}, {fifteen:.2f} (1, 5, 15 min)")


if __name__ == "__main__":
    raise SystemExit(run_recorded("growth", main))
