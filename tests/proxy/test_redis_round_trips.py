"""Round trips to a real ``redis-server`` per request, counted with MONITOR (structure, not time).

The common request (an episode header, a valid answer, no new tool error) costs one round trip: the
claim read before the upstream call, nothing after it. A request that changes the episode (a new
error result, a charged answer) costs one before and one after; a lost race costs more, never a
lost count (``test_scale_out``, ``test_redis_store``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from benchmarks.support.redis_probe import CommandMonitor
from tests.support.processes import ProxyProcess, RedisServer, proxy_process, redis_server
from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call
from tests.support.tools import ORDER_TOOL

pytestmark = pytest.mark.slow


def _history(results: list[str]) -> list[dict[str, Any]]:
    """A user turn, then one call of the order tool per result, answered with that result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Where is order #W1?"}]
    for index, content in enumerate(results):
        call_id = f"call-{index}"
        call = tool_call("get_order_details", {"order_id": "1"}, call_id)
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
    return messages


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as scripted:
        yield scripted


@pytest.fixture(scope="module")
def proxy(redis: RedisServer, upstream: ScriptedUpstream) -> Iterator[ProxyProcess]:
    flags = ("--episode-store", redis.url, "--repair", "off", "--store-timeout", "2")
    with proxy_process(upstream.base_url, *flags) as process:
        yield process


def _per_request(monitor: CommandMonitor) -> dict[str, int]:
    """The commands sent since the last reset, less the gauge's SCAN (every 15 s, not per
    request)."""
    sent = monitor.settle()
    sent.pop("scan", None)
    return dict(sent)


def _ask(client: httpx.Client, proxy: ProxyProcess, episode: str, results: list[str]) -> None:
    body = {"model": "scripted-model", "messages": _history(results), "tools": [ORDER_TOOL]}
    response = client.post(
        f"{proxy.root_url}/v1/chat/completions",
        json=body,
        headers={"x-episode-id": episode},
        timeout=30,
    )
    assert response.status_code == 200, response.text


def test_the_common_request_is_one_round_trip(
    redis: RedisServer, upstream: ScriptedUpstream, proxy: ProxyProcess
) -> None:
    valid = completion(tool_calls=[tool_call("get_order_details", {"order_id": "1"})])
    upstream.push(*[valid for _ in range(6)])
    ok = '{"status": "delivered"}'
    with httpx.Client() as client, CommandMonitor(redis.port) as monitor:
        _ask(client, proxy, "common", [])  # a new episode: claimed by the same one read
        monitor.reset()  # (and the pool's connection set-up left behind)
        for turn in range(1, 6):  # each turn adds a successful result: no new error
            _ask(client, proxy, "common", [ok] * turn)
        sent = _per_request(monitor)
    assert sent == {"evalsha": 5}, sent


def test_a_request_that_changes_the_episode_is_one_before_and_one_after(
    redis: RedisServer, upstream: ScriptedUpstream, proxy: ProxyProcess
) -> None:
    valid = completion(tool_calls=[tool_call("get_order_details", {"order_id": "1"})])
    unknown = completion(tool_calls=[tool_call("cancel_everything", {})])
    upstream.push(valid, valid, valid, unknown)
    with httpx.Client() as client, CommandMonitor(redis.port) as monitor:
        _ask(client, proxy, "warm", ["Error: order not found"])  # loads the write's script once
        _ask(client, proxy, "changing", [])
        monitor.reset()
        _ask(client, proxy, "changing", ["Error: order not found"])  # a new error result
        after_error = _per_request(monitor)
        monitor.reset()
        _ask(client, proxy, "changing", ["Error: order not found"])  # charged: unknown tool
        after_charge = _per_request(monitor)
    # The read (claim script) before the upstream call, the compare-and-set script after it.
    assert after_error == {"evalsha": 2}, after_error
    assert after_charge == {"evalsha": 2}, after_charge
    assert monitor.scripted["set"] == 1  # the write was a script's SET, not a client command
