"""Episode store memory and budget accounting cost.

Fills a ``MemoryEpisodeStore`` bounded at ``--max-episodes`` with episodes that each saw a few
errors, keeps going past the bound, and prints traced memory after each wave (it must stay flat
once the bound is reached). Then times ``observe_request`` on a τ²-bench-sized history.

    python -m benchmarks.diagnostics.sessions [--max-episodes 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
import tracemalloc
from typing import Any

from repairproxy.episodes.budget import ErrorBudget
from repairproxy.episodes.memory_store import MemoryEpisodeStore
from repairproxy.validation import CallVerdict, Channel, MessageVerdict

__all__ = ["main"]


def _history(turns: int, errors_every: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "policy " * 200},
        {"role": "user", "content": "I want to exchange an item."},
    ]
    for turn in range(turns):
        call_id = f"call_{turn}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "get_order_details",
                            "arguments": '{"order_id": "#W1"}',
                        },
                    }
                ],
            }
        )
        content = (
            "Error: Order not found" if turn % errors_every == 0 else '{"order_id": "#W1"}' * 20
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
    return messages


# A first answer with one hallucinated call, delivered as it came (repair off).
_CALL = CallVerdict(0, "call_x", "x", Channel.UNKNOWN_TOOL, "")
_FIRST = MessageVerdict((_CALL,))


async def _fill(budget: ErrorBudget, start: int, count: int, history: list[dict[str, Any]]) -> None:
    body = {"messages": history}
    for index in range(start, start + count):
        episode = f"episode-{index:09d}"
        await budget.observe_answer(episode, _FIRST, None, (_CALL,))
        await budget.observe_request(episode, body)


async def _run(max_episodes: int) -> None:
    store = MemoryEpisodeStore(max_episodes=max_episodes, idle_ttl_seconds=3600)
    budget = ErrorBudget(store)
    small = _history(turns=6, errors_every=3)  # 2 error results per episode
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    wave = max_episodes // 2
    print(f"store bounded at {max_episodes:,} episodes; each saw 3 errors (1 answer, 2 results)")
    print(
        f"{'episodes seen':>14} {'stored':>8} {'traced MiB':>11} {'bytes/stored':>13} {'s/wave':>7}"
    )
    for step in range(1, 7):
        started = time.perf_counter()
        await _fill(budget, (step - 1) * wave, wave, small)
        elapsed = time.perf_counter() - started
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
        print(
            f"{step * wave:>14,} {len(store):>8,} {used / 2**20:>11.1f} "
            f"{used / max(len(store), 1):>13.0f} {elapsed:>7.2f}"
        )
    tracemalloc.stop()

    long = {"messages": _history(turns=30, errors_every=4)}  # ~62 messages, 8 error results
    timing_budget = ErrorBudget(MemoryEpisodeStore())
    rounds = 2000
    started = time.perf_counter()
    for _ in range(rounds):
        await timing_budget.observe_request("one-episode", long)
    per_call = (time.perf_counter() - started) / rounds * 1e6
    snapshot = await timing_budget.snapshot("one-episode")
    print(
        f"\nobserve_request on a {len(long['messages'])}-message history "
        f"({snapshot.errors} error results, resent every turn): {per_call:.1f} us"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-episodes", type=int, default=100_000)
    asyncio.run(_run(parser.parse_args(argv).max_episodes))


if __name__ == "__main__":
    main()
