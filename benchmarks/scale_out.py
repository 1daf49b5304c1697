"""Scale-out costs: what the Redis store adds per request, and what ``--workers 2`` buys.

1. In process, per request of a 20-turn τ²-bench-like history: ``resolve_episode`` +
   ``observe_request`` + ``observe_answer`` (+ ``remember_answer`` without a header) on the memory
   store and on Redis, with and without the episode header: microseconds and Redis round trips.
2. ``python -m repairproxy serve`` with ``--workers 1`` and ``--workers 2`` (Redis store both) in
   front of ``benchmarks.support.fast_upstream``, driven at ``--concurrency`` over keep-alive
   connections, rounds interleaved: requests/s and the proxy's CPU-seconds per request (all its
   processes).

    python -m benchmarks.scale_out [--redis redis://127.0.0.1:6379/0] [--rounds 4]

Without ``--redis`` it starts ``redis-server`` on a free loopback port. The load generator and
the upstream share the machine's cores with the proxy, so on 2 cores two workers cannot double.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import uvloop

from benchmarks.support.load import REQUEST_BODY, Target, free_port, http_request, wait_port
from benchmarks.support.results import run_recorded
from repairproxy.episodes.budget import ErrorBudget
from repairproxy.episodes.memory_store import MemoryEpisodeStore
from repairproxy.episodes.redis_store import RedisChainIndex, RedisEpisodeStore, redis_client
from repairproxy.validation import CallVerdict, Channel, MessageVerdict

__all__ = ["main"]

QUESTION = "What does the Redis store add per request, and what does --workers 2 buy?"

_TICKS = os.sysconf("SC_CLK_TCK")


def _history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a retail agent. " * 40},
        {"role": "user", "content": "I want to exchange an item of order #W2378156."},
    ]
    for turn in range(turns):
        call_id = f"chatcmpl-tool-{turn:032x}"
        call = {"name": "get_order_details", "arguments": '{"order_id": "#W2378156"}'}
        calls = [{"id": call_id, "function": call}]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        content = "Error: order not found" if turn % 7 == 3 else '{"status": "delivered"}' * 8
        messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
    return messages


async def _store_costs(url: str, requests: int) -> None:
    verdict = MessageVerdict((CallVerdict(0, "c", "get_order_details", Channel.VALID, ""),))
    answer = {"role": "assistant", "content": "done"}
    client = redis_client(url)
    commands = 0
    original: Any = client.execute_command

    async def counted(*args: Any, **options: Any) -> Any:
        nonlocal commands
        commands += 1
        return await original(*args, **options)

    client.execute_command = counted  # type: ignore[method-assign]
    try:
        await client.flushdb()
        print(f"{'store':8} {'header':>6} {'us/request':>11} {'round trips':>12}")
        for name in ("memory", "redis"):
            for explicit in (True, False):
                if name == "memory":
                    budget = ErrorBudget(MemoryEpisodeStore())
                else:
                    budget = ErrorBudget(
                        RedisEpisodeStore(client, 3600), chains=RedisChainIndex(client, 3600)
                    )
                commands = 0
                started = time.perf_counter()
                for index in range(requests):
                    messages = _history(20)
                    messages[1]["content"] += f" ({index})"  # one episode per request
                    body = {"model": "m", "messages": messages}
                    headers = {"x-episode-id": f"ep-{index}"} if explicit else {}
                    ref = await budget.resolve_episode(headers, body)
                    await budget.observe_request(ref.id, body)
                    await budget.observe_answer(ref.id, verdict)
                    await budget.remember_answer(ref, body, answer)
                elapsed = (time.perf_counter() - started) / requests * 1e6
                trips = commands / requests if name == "redis" else 0.0
                print(f"{name:8} {explicit!s:>6} {elapsed:>11.0f} {trips:>12.1f}")
        ep = RedisEpisodeStore(client, 3600)
        used = await ep.memory_usage("ep-0")
        print(f"redis MEMORY USAGE of one 20-turn episode: {used} B")
    finally:
        client.execute_command = original  # type: ignore[method-assign]
        await client.aclose()


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (uvicorn's workers and their spawn helpers)."""
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            children = (task / "children").read_text().split() if task.exists() else []
            queue.extend(int(c) for c in children)
    return found


def _cpu_seconds(pid: int) -> float:
    total = 0
    for member in _tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICKS


async def _drive(
    targets: list[tuple[Target, int]], concurrency: int, requests: int, rounds: int
) -> dict[str, tuple[float, float]]:
    for target, _ in targets:
        await target.round(concurrency, min(requests, 400), record=False)
    cpu = dict.fromkeys((t.name for t, _ in targets), 0.0)
    for index in range(rounds):
        order = targets if index % 2 == 0 else targets[::-1]
        for target, pid in order:
            target.pools.clear()  # fresh connections: idle ones may have met the keep-alive
            before = _cpu_seconds(pid)
            await target.round(concurrency, requests)
            cpu[target.name] += _cpu_seconds(pid) - before
    return {
        t.name: (t.count[concurrency] / t.elapsed[concurrency], cpu[t.name] / t.count[concurrency])
        for t, _ in targets
    }


def _start(command: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=f"{QUESTION}\n\n{__doc__}", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis", default=None, help="a running Redis (default: start one)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=1000, help="per round and proxy")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--store-requests", type=int, default=300)
    args = parser.parse_args(argv)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        url = args.redis
        if url is None:
            binary = shutil.which("redis-server") or sys.exit("redis-server is not installed")
            port = free_port()
            processes.append(
                _start([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""])
            )
            wait_port(port)
            url = f"redis://127.0.0.1:{port}/0"
        print(
            f"machine: {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f} "
            "(shared with other processes: numbers are noisy)"
        )
        uvloop.run(_store_costs(url, args.store_requests))

        upstream_port = free_port()
        processes.append(
            _start(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.support.fast_upstream",
                    "--port",
                    str(upstream_port),
                ]
            )
        )
        proxies = []
        for workers in (1, 2):
            port = free_port()
            command = [sys.executable, "-m", "repairproxy", "serve", "--port", str(port)]
            command += ["--upstream", f"http://127.0.0.1:{upstream_port}/v1"]
            command += ["--episode-store", url, "--workers", str(workers)]
            process = _start(command)
            processes.append(process)
            proxies.append((workers, port, process))
        wait_port(upstream_port)
        body = orjson.dumps(REQUEST_BODY)
        targets = []
        for workers, port, process in proxies:
            wait_port(port)
            name = f"workers={workers}"
            targets.append((Target(name, port, http_request(port, body)), process.pid))
        time.sleep(2.0)  # let both workers finish importing
        results = uvloop.run(_drive(targets, args.concurrency, args.requests, args.rounds))
        print(f"concurrency {args.concurrency}, {args.rounds} interleaved rounds")
        print(f"{'proxy':>10} {'requests/s':>11} {'CPU ms/request':>15}")
        for name, (rps, cpu) in results.items():
            print(f"{name:>10} {rps:>11.0f} {cpu * 1e3:>15.3f}")
        one, two = results["workers=1"][0], results["workers=2"][0]
        print(f"workers=2 / workers=1: {two / one:.2f}x requests/s")
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(timeout=15)


if __name__ == "__main__":
    raise SystemExit(run_recorded("scale_out", main))
