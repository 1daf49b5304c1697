"""Round trips to a real ``redis-server`` per request, counted with MONITOR (structure, not time).

The common request (an episode header, a valid answer, no new tool error) costs one round trip: the
claim read before the upstream call, nothing after it. A request that changes the episode (a new
error result, a charged answer) costs one before and one after; a lost race costs more, never a
lost count (``test_scale_out``, ``test_redis_store``).

The Responses and thread stores keep the same discipline: a chained turn with an episode header
reads its stored turn and its episode in one round trip (one ``MULTI`` / ``EXEC`` block), and
writes its new record, the id's link and any change of the episode in one more.
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


@pytest.fixture(scope="module")
def translating(redis: RedisServer, upstream: ScriptedUpstream) -> Iterator[ProxyProcess]:
    """Responses and Messages translated to the chat upstream (the stores are the same)."""
    flags = ("--episode-store", redis.url, "--repair", "off", "--store-timeout", "2")
    with proxy_process(upstream.base_url, *flags, "--upstream-apis", "chat") as process:
        yield process


def _per_request(monitor: CommandMonitor) -> dict[str, int]:
    """The commands sent since the last reset, less the gauge's SCAN (every 15 s, not per
    request)."""
    sent = monitor.settle()
    sent.pop("scan", None)
    return dict(sent)


def _round_trips(monitor: CommandMonitor) -> int:
    """The round trips since the last reset (after ``_per_request``), less the gauge's SCAN."""
    return monitor.round_trips - monitor.sent.get("scan", 0)


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


_RESPONSES_TOOL = {"type": "function", **ORDER_TOOL["function"]}


def _respond(
    client: httpx.Client, proxy: ProxyProcess, body: dict[str, Any], episode: str
) -> dict[str, Any]:
    body = {"model": "scripted-model", "tools": [_RESPONSES_TOOL], **body}
    response = client.post(
        f"{proxy.root_url}/v1/responses", json=body, headers={"x-episode-id": episode}, timeout=30
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _result_of(answer: dict[str, Any], text: str) -> dict[str, Any]:
    call = next(item for item in answer["output"] if item["type"] == "function_call")
    return {"type": "function_call_output", "call_id": call["call_id"], "output": text}


def test_a_chained_responses_turn_is_one_round_trip_before_and_one_after(
    redis: RedisServer, upstream: ScriptedUpstream, translating: ProxyProcess
) -> None:
    valid = completion(tool_calls=[tool_call("get_order_details", {"order_id": "1"})])
    unknown = completion(tool_calls=[tool_call("cancel_everything", {})])
    upstream.push(valid, valid, valid, unknown)
    with httpx.Client() as client, CommandMonitor(redis.port) as monitor:
        first = _respond(client, translating, {"input": "Where is order #W1?"}, "chain")
        ok = _result_of(first, '{"status": "delivered"}')
        second = _respond(
            client, translating, {"previous_response_id": first["id"], "input": [ok]}, "chain"
        )
        monitor.reset()  # the scripts are loaded, the connections made
        ok = _result_of(second, '{"status": "delivered"}')
        third = _respond(
            client, translating, {"previous_response_id": second["id"], "input": [ok]}, "chain"
        )
        common, common_trips = _per_request(monitor), _round_trips(monitor)
        monitor.reset()
        failed = _result_of(third, "Error: order not found")  # a new error result, then charged
        _respond(
            client, translating, {"previous_response_id": third["id"], "input": [failed]}, "chain"
        )
        changing, changing_trips = _per_request(monitor), _round_trips(monitor)
    # Before: the stored turn and the episode (read, not claimed); after: the id's link and the
    # new record; the episode is written only when it changed (then in the same block).
    assert common_trips == 2, common
    assert common == {"multi": 2, "exec": 2, "evalsha": 4}, common
    assert changing_trips == 2, changing
    assert changing == {"multi": 2, "exec": 2, "evalsha": 5}, changing


def _thread(
    client: httpx.Client, proxy: ProxyProcess, thread: dict[str, Any], text: str, episode: str
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "scripted-model",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": text}],
        "thread": thread,
    }
    if thread["type"] == "create":
        body["tools"] = [
            {
                "name": ORDER_TOOL["function"]["name"],
                "input_schema": ORDER_TOOL["function"]["parameters"],
            }
        ]
    headers = {"anthropic-beta": "message-threads-2026-08-12", "x-episode-id": episode}
    response = client.post(f"{proxy.root_url}/v1/messages", json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_a_continued_thread_is_one_round_trip_before_and_one_after(
    redis: RedisServer, upstream: ScriptedUpstream, translating: ProxyProcess
) -> None:
    upstream.push(*[completion(content=f"Answer {n}.") for n in range(3)])
    with httpx.Client() as client, CommandMonitor(redis.port) as monitor:
        first = _thread(client, translating, {"type": "create"}, "Hi", "thread")
        previous = {"type": "continue", "previous_message_id": first["id"]}
        second = _thread(client, translating, previous, "More?", "thread")
        monitor.reset()
        previous = {"type": "continue", "previous_message_id": second["id"]}
        _thread(client, translating, previous, "And then?", "thread")
        sent, trips = _per_request(monitor), _round_trips(monitor)
    # Before: the thread's latest message and the episode; after: the new message and the
    # previous one marked continued (nothing of the episode changed: no write).
    assert trips == 2, sent
    assert sent == {"multi": 2, "exec": 2, "evalsha": 4}, sent
