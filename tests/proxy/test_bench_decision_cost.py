"""``benchmarks.diagnostics.decision_cost``: the app in process, back to back or asleep between
requests (``--gap-us``); with a gap only the requests' own CPU time is counted, not the sleeps."""

from __future__ import annotations

import time

import uvloop

from benchmarks.diagnostics.decision_cost import _drive


def test_requests_with_a_gap_count_their_cpu_and_not_the_sleep() -> None:
    requests, gap = 40, 0.005
    started = time.monotonic()
    used = uvloop.run(_drive(requests, False, None, 0, gap))
    asleep = requests * gap
    assert time.monotonic() - started >= asleep  # it did sleep before each request
    assert 0 < used < asleep / 2  # the requests' CPU only (~0.1-0.3 ms each), not the 200 ms


def test_back_to_back_requests_are_counted_as_before() -> None:
    used = uvloop.run(_drive(40, True, None, 2))  # streamed, with a resent history
    assert 0 < used < 40 * 0.05
