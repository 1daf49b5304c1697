"""``benchmarks.vs_peers``' rounds against a real server on loopback
(``benchmarks.support.fast_upstream`` in its own process): a round by time measures every target
for as long as it is given, whatever its speed; a round by count sends exactly that many
requests."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import pytest
import uvloop

from benchmarks.vs_peers import _cell_figures, _free_port, _Target, _wait_port


def _rounds(target: _Target, *rounds: tuple[bool, int, int, bool, float]) -> None:
    """Run the rounds in one loop, then close the target's connections inside it."""

    async def run() -> None:
        for stream, clients, requests, record, seconds in rounds:
            await target.round(stream, clients, requests, record, seconds)
        for pool in target.pools.values():
            for conn in pool:
                if conn.transport is not None:
                    conn.transport.close()
        await asyncio.sleep(0)

    uvloop.run(run())


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[int, int]]:
    """(port, pid) of the server the rounds drive."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.support.fast_upstream", "--port", str(port)]
    )
    try:
        _wait_port(port, process, 30)
        yield port, process.pid
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.parametrize("stream", [False, True])
def test_a_round_by_time_lasts_its_window_and_records_every_answer(
    upstream: tuple[int, int], stream: bool
) -> None:
    target = _Target("direct", upstream[0])
    _rounds(target, (stream, 3, 0, True, 0.3))
    key = (stream, 3)
    assert target.busy[key] >= 0.3  # every connection kept sending until the window closed
    assert len(target.samples[key]) == target.sent > 3
    assert all(sample > 0 for sample in target.samples[key])


def test_a_round_by_count_sends_that_many_and_an_unrecorded_round_keeps_nothing(
    upstream: tuple[int, int],
) -> None:
    target = _Target("direct", upstream[0])
    _rounds(target, (False, 4, 40, False, 0.0))  # a warm-up
    assert target.sent == 40 and not target.samples
    _rounds(target, (False, 4, 40, True, 0.0))
    assert len(target.samples[(False, 4)]) == 40 and target.sent == 80


def test_a_servers_rounds_are_kept_one_by_one_with_their_cpu(upstream: tuple[int, int]) -> None:
    port, pid = upstream
    server = _Target("server", port, pid)  # its CPU is read from /proc, as a peer's is
    direct = _Target("direct", port)
    _rounds(server, (False, 2, 0, True, 0.2), (False, 2, 60, True, 0.0))
    _rounds(direct, (False, 2, 60, True, 0.0))
    figures = _cell_figures(server, direct, (False, 2))
    rounds = figures["rounds"]
    assert [r["requests"] for r in rounds][1] == 60 and len(rounds) == 2
    assert (
        sum(r["requests"] for r in rounds) == figures["requests"] == len(server.samples[(False, 2)])
    )
    assert all(r["cpu_sched_us_per_request"] > 0 and r["p99_ms"] > 0 for r in rounds)
    total = sum(r["requests"] * r["cpu_sched_us_per_request"] for r in rounds)
    assert abs(total / figures["requests"] - figures["cpu_sched_us_per_request"]) < 1e-6 * total
