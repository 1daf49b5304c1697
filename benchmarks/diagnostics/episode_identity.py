"""What finding a request's episode and counting its history costs, with and without the header.

Per request: ``resolve_episode`` + ``observe_request`` on τ²-bench-shaped histories (one tool call
per turn, every fourth result an error), by episode header, by conversation chaining in steady
state (the previous answer was remembered), and for a request that matches nothing (both chaining
keys tried). CPU time, best of 15 rounds of 100, so other load on the machine matters less.

    python -m benchmarks.diagnostics.episode_identity
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from benchmarks.diagnostics.sessions import _history
from repairproxy.episodes.budget import ErrorBudget
from repairproxy.episodes.memory_store import MemoryEpisodeStore

__all__ = ["main"]

T = TypeVar("T")


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    # The memory store never suspends: drive the coroutine without an event loop's overhead.
    try:
        coroutine.send(None)
    except StopIteration as stop:
        result: T = stop.value
        return result
    raise RuntimeError("the memory store suspended")


def _best_us(step: Callable[[], None]) -> float:
    rounds = []
    for _ in range(15):
        started = time.process_time()
        for _ in range(100):
            step()
        rounds.append((time.process_time() - started) / 100 * 1e6)
    return min(rounds)


def _row(turns: int) -> str:
    messages = _history(turns=turns, errors_every=4)
    body = {"model": "m", "messages": messages}
    budget = ErrorBudget(MemoryEpisodeStore())
    previous = {"messages": messages[:-2]}
    remembered = _run(budget.resolve_episode({}, previous))
    _run(budget.remember_answer(remembered, previous, messages[-2]))
    orphan = {"messages": [*messages[:-2], {**messages[-2], "content": "never answered"}]}

    def by_header() -> None:
        ref = _run(budget.resolve_episode({"x-episode-id": "e"}, body))
        _run(budget.observe_request(ref.id, body))

    def chained() -> None:
        ref = _run(budget.resolve_episode({}, body))
        assert not ref.new
        _run(budget.observe_request(ref.id, body))

    def no_match() -> None:
        ref = _run(budget.resolve_episode({}, orphan))
        _run(budget.observe_request(ref.id, orphan))

    return (
        f"{len(messages):>8} {_best_us(by_header):>8.0f} {_best_us(chained):>8.0f} "
        f"{_best_us(no_match):>9.0f}"
    )


def main() -> None:
    print(f"{'messages':>8} {'header':>8} {'chained':>8} {'no match':>9}  (us per request)")
    for turns in (3, 30, 100):
        print(_row(turns))


if __name__ == "__main__":
    main()
