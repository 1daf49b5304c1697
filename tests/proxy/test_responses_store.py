"""The proxy's own Responses store: chains continued from what the client was given (a promoted
or repaired answer included), ``GET`` / ``DELETE /v1/responses/{id}`` and ``/input_items`` by
tenant, full-history clients kept in one episode; in memory and on a real ``redis-server``.

The scripted upstream checks call ids as OpenAI does (a ``function_call_output`` needs its
``function_call`` earlier in the conversation), so a chain that lost the delivered answer fails
the way it fails against OpenAI."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import anyio
import openai
import orjson
import pytest

from repairproxy.episodes.responses_store import (
    MemoryResponsesStore,
    RedisResponsesStore,
    StoredResponse,
)
from repairproxy.settings import Settings
from tests.support.processes import RedisServer, redis_server
from tests.support.proxy_server import RunningProxy, running_proxy
from tests.support.responses_upstream import ResponsesUpstream, function_call, message

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_order_details",
        "description": "Get the status and details of an order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
            "additionalProperties": False,
        },
    }
]
GOOD = {"order_id": "#W1"}
TEXT_CALL = '{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture
def upstream() -> Iterator[ResponsesUpstream]:
    with ResponsesUpstream() as scripted:
        yield scripted


@pytest.fixture
def start(upstream: ResponsesUpstream) -> Iterator[Any]:
    with ExitStack() as stack:

        def start(**overrides: Any) -> RunningProxy:
            fields = {"upstream": upstream.base_url, "repair": "reflexive", **overrides}
            return stack.enter_context(running_proxy(Settings(**fields)))

        yield start


def _client(proxy: RunningProxy, key: str = "x") -> openai.OpenAI:
    client: openai.OpenAI = proxy.client(key)
    return client


def _call_of(response: Any) -> Any:
    return next(item for item in response.output if item.type == "function_call")


def _result(call_id: str, text: str = "Order #W1: delivered") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


# -- the store itself ------------------------------------------------------------------------------


def _record(size: int) -> StoredResponse:
    return StoredResponse([{"role": "user", "content": "x" * size}], {"id": "r", "output": []})


def test_the_memory_store_is_bounded_in_bytes_least_recently_used_first() -> None:
    async def main() -> None:
        store = MemoryResponsesStore(max_bytes=5_000)
        for n in range(8):
            await store.put("", f"r{n}", _record(1_000))
            if n == 2:
                assert await store.get("", "r0") is not None  # r0 used: r1 is the oldest now
        assert store.bytes <= 5_000
        assert await store.get("", "r1") is None
        assert await store.get("", "r7") is not None
        await store.put("", "huge", _record(10_000))  # larger than the whole bound: not kept
        assert await store.get("", "huge") is None

    anyio.run(main)


def test_a_tenant_never_reads_or_deletes_anothers_record() -> None:
    async def main() -> None:
        store = MemoryResponsesStore(max_bytes=1 << 20)
        await store.put("t-a", "resp_1", _record(10))
        assert await store.get("t-b", "resp_1") is None
        assert await store.delete("t-b", "resp_1") is False
        assert await store.get("t-a", "resp_1") is not None
        assert await store.delete("t-a", "resp_1") is True
        assert await store.get("t-a", "resp_1") is None

    anyio.run(main)


def test_a_tenant_over_its_quota_evicts_its_own_records_first() -> None:
    async def main() -> None:
        store = MemoryResponsesStore(max_bytes=8_000, tenant_quota=4_000)
        await store.put("quiet", "q1", _record(1_000))
        for n in range(20):  # far beyond the whole bound
            await store.put("busy", f"b{n}", _record(1_000))
        assert await store.get("quiet", "q1") is not None
        assert store.tenant_bytes("busy") <= 4_000 and store.bytes <= 8_000
        assert await store.get("busy", "b19") is not None
        assert await store.get("busy", "b0") is None  # its own oldest went
        await store.delete("quiet", "q1")
        assert store.tenant_bytes("quiet") == 0

    anyio.run(main)


def test_one_api_key_cannot_push_anothers_chain_out_of_the_store(
    start: Any, upstream: ResponsesUpstream
) -> None:
    """The store's bound is shared out per key: a client writing many long answers loses its own
    oldest, and a quiet client's chain still continues."""
    proxy = start(api_keys=("key-a", "key-b"), max_responses_memory=64_000)
    quiet, busy = _client(proxy, "key-a"), _client(proxy, "key-b")
    upstream.push([message("Noted.")])
    kept = quiet.responses.create(model="m", input="Remember #W1.")
    for n in range(40):  # ~4 KB each, 160 KB in all: twice the whole store
        upstream.push([message(f"Answer {n}.")])
        busy.responses.create(model="m", input=f"{n} " + "long question " * 280)
    upstream.push([message("It was #W1.")])
    second = quiet.responses.create(model="m", previous_response_id=kept.id, input="Which one?")
    assert second.output_text == "It was #W1."
    sent = orjson.dumps(upstream.requests[-1]["input"]).decode()
    assert "Remember #W1." in sent and "Noted." in sent  # rebuilt from the proxy's store


def test_the_redis_store_keeps_records_by_tenant_with_an_expiry(redis: RedisServer) -> None:
    from repairproxy.episodes.redis_store import redis_client

    async def main() -> None:
        client = redis_client(redis.url)
        try:
            await client.flushdb()
            store = RedisResponsesStore(client, 60.0, max_record_bytes=4_000)
            await store.put("t-a", "resp_1", _record(10))
            found = await store.get("t-a", "resp_1")
            assert found is not None and found.input == [{"role": "user", "content": "x" * 10}]
            assert await store.get("t-b", "resp_1") is None
            ttl = await client.pttl(b"repairproxy:rs:t-a/resp_1")
            assert 0 < ttl <= 60_000
            await store.put("t-a", "big", _record(5_000))  # over the per-record bound
            assert await store.get("t-a", "big") is None
            assert await store.delete("t-a", "resp_1") is True
            assert await store.get("t-a", "resp_1") is None
        finally:
            await client.aclose()

    anyio.run(main)


# -- chains through the proxy ----------------------------------------------------------------------


def _promoted_chain(proxy: RunningProxy, upstream: ResponsesUpstream) -> None:
    client = _client(proxy)
    upstream.push([message(TEXT_CALL)], [message("It was delivered.")])
    first = client.responses.create(model="m", input="Where is #W1?", tools=TOOLS)
    call = _call_of(first)  # promoted from text: the upstream never saw this call
    second = client.responses.create(
        model="m", previous_response_id=first.id, tools=TOOLS, input=[_result(call.call_id)]
    )
    assert second.output_text == "It was delivered."
    assert second.previous_response_id == first.id
    sent = upstream.requests[-1]
    assert sent["store"] is False and "previous_response_id" not in sent
    kinds = [(item.get("type", "message"), item.get("call_id")) for item in sent["input"]]
    assert kinds == [
        ("message", None),
        ("function_call", call.call_id),
        ("function_call_output", call.call_id),
    ]


def test_a_promoted_answer_continues_the_conversation_the_client_saw(
    start: Any, upstream: ResponsesUpstream
) -> None:
    _promoted_chain(start(repair="promote"), upstream)


def test_a_promoted_answer_continues_through_the_redis_store(
    start: Any, upstream: ResponsesUpstream, redis: RedisServer
) -> None:
    _promoted_chain(start(repair="promote", episode_store=redis.url), upstream)


def test_a_repaired_answer_continues_without_the_repair_turns_or_old_instructions(
    start: Any, upstream: ResponsesUpstream
) -> None:
    proxy = start()
    client = _client(proxy)
    upstream.push(
        [function_call("lookup_order", GOOD)],  # invented: re-asked
        [function_call("get_order_details", GOOD)],
        [message("It was delivered.")],
    )
    first = client.responses.create(
        model="m", input="Where is #W1?", tools=TOOLS, instructions="Answer in French."
    )
    call = _call_of(first)
    assert call.name == "get_order_details"
    second = client.responses.create(
        model="m", previous_response_id=first.id, tools=TOOLS, input=[_result(call.call_id)]
    )
    assert second.output_text == "It was delivered."
    sent = upstream.requests[-1]
    text = orjson.dumps(sent["input"]).decode()
    assert "lookup_order" not in text  # neither the invented call nor its diagnosis
    assert [item.get("name") for item in sent["input"] if item.get("name")] == ["get_order_details"]
    assert "Answer in French." not in sent.get("instructions", "")  # not carried over


def test_stored_responses_are_served_by_id_for_their_tenant_only(
    start: Any, upstream: ResponsesUpstream
) -> None:
    _served_by_tenant(start(repair="promote", api_keys=("key-a", "key-b")), upstream)


def test_stored_responses_are_served_by_tenant_from_redis(
    start: Any, upstream: ResponsesUpstream, redis: RedisServer
) -> None:
    proxy = start(repair="promote", api_keys=("key-a", "key-b"), episode_store=redis.url)
    _served_by_tenant(proxy, upstream)


def _served_by_tenant(proxy: RunningProxy, upstream: ResponsesUpstream) -> None:
    a, b = _client(proxy, "key-a"), _client(proxy, "key-b")
    upstream.push([message(TEXT_CALL)])
    first = a.responses.create(model="m", input="Where is #W1?", tools=TOOLS)
    assert a.responses.retrieve(first.id).output[0].type == "function_call"  # as delivered
    items = a.responses.input_items.list(first.id)
    assert [item.type for item in items.data] == ["message"]
    assert items.data[0].content[0].text == "Where is #W1?"  # type: ignore[union-attr]
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.create(model="m", previous_response_id=first.id, input="and?")
    a.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(first.id)
    assert len(upstream.requests) == 1  # nothing of this went upstream


def test_a_full_history_client_continues_its_episode(
    start: Any, upstream: ResponsesUpstream
) -> None:
    """The Agents SDK's default: no previous_response_id, the whole history resent, and an
    answer holding text and a call. The next turn continues the episode (and its charges)."""
    proxy = start()
    client = _client(proxy)
    upstream.push(
        [message("Let me check."), function_call("get_order_details", GOOD)],
        [message("It was delivered.")],
    )
    question = {"role": "user", "content": "Where is #W1?"}
    first = client.responses.with_raw_response.create(model="m", input=[question], tools=TOOLS)
    turn1 = first.parse()
    call = _call_of(turn1)
    history: list[Any] = [question, *(item.model_dump() for item in turn1.output)]
    second = client.responses.with_raw_response.create(
        model="m",
        tools=TOOLS,
        input=[*history, _result(call.call_id, "Error: order not found")],
    )
    episode = first.headers["x-repairproxy-episode-id"]
    assert second.headers["x-repairproxy-episode-id"] == episode
    assert second.headers["x-repairproxy-episode-errors"] == "1"
