"""Limits on the work one request can make the proxy do: counted work (bytes scanned, bytes a
cache accounts for), never timings (those are in ``benchmarks/limits.py``)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import socket
import threading
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from repairproxy.asgi.gate import MAX_HELD_CONTENT_CHARS, SSEParser, ToolCallGate
from repairproxy.episodes import redis_store
from repairproxy.episodes.budget import MAX_SEEN_RESULTS, EpisodeState, ErrorBudget
from repairproxy.episodes.guard import GuardedEpisodeStore, StoreHealth
from repairproxy.episodes.memory_store import MemoryEpisodeStore
from repairproxy.episodes.redis_store import RedisEpisodeStore, decode_state, redis_client
from repairproxy.errors import InvalidToolsError
from repairproxy.repair import RepairPolicy, escalated_tool_choice
from repairproxy.types import RepairMode
from repairproxy.validation import CompiledTools, ToolsCache, compiled_size
from tests.support.processes import redis_server


def _chunk(delta: dict[str, Any]) -> bytes:
    payload = {"id": "c", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _stream(total: int, text: str) -> bytes:
    event = _chunk({"content": text})
    return event * (total // len(event))


@pytest.mark.parametrize("piece", [1 << 16, 1 << 20, 4 << 20])
def test_sse_parser_scans_each_byte_about_once(piece: int) -> None:
    data = _stream(4 << 20, "word " * 20)
    parser = SSEParser()
    events = 0
    for start in range(0, len(data), piece):
        events += len(parser.feed(data[start : start + piece]))
    assert events == data.count(b"\n\n")
    assert parser.scanned <= len(data) + 3 * (len(data) // piece + 1)


def test_sse_parser_does_not_rescan_one_event_split_into_many_chunks() -> None:
    event = _chunk({"content": "x" * (4 << 20)})
    parser = SSEParser()
    found = []
    for start in range(0, len(event), 4096):
        found += parser.feed(event[start : start + 4096])
    assert [e.raw for e in found] == [event]
    assert parser.scanned <= len(event) + 3 * (len(event) // 4096 + 1)


@pytest.mark.parametrize(
    "text", ["word ", '{"name": "get_order", "arguments": {"a": "', "```json\n{"]
)
def test_gate_reads_held_text_a_bounded_number_of_times(text: str) -> None:
    # Prose, a call written as text, a fenced call: 4 MB of content deltas each.
    gate = ToolCallGate()
    parser = SSEParser()
    first = _chunk({"content": text})
    data = first + _stream(4 << 20, "abcd" * 8)
    released = 0
    for event in parser.feed(data):
        released += len(gate.feed(event))
    assert gate.assembler.content_chars > 1_000_000
    assert released > 0  # flushed once the held text passed the bound
    # Linear: each content character is scanned at most once after the bounded held prefix
    # (the gate now looks at every delta for a call opening after prose, never re-reads).
    assert gate.scanned <= gate.assembler.content_chars + 4 * len(text) + MAX_HELD_CONTENT_CHARS


def test_tools_cache_is_bounded_by_the_memory_it_accounts_for() -> None:
    def tools(variant: int) -> list[dict[str, Any]]:
        schema = {
            "type": "object",
            "properties": {f"p{variant:02d}_{i}": {"type": "string"} for i in range(50)},
        }
        return [
            {"type": "function", "function": {"name": f"t{i}", "parameters": schema}}
            for i in range(20)
        ]

    one = orjson.dumps([tools(0), None])
    limit = 3 * compiled_size(one, 20) + 1000
    cache = ToolsCache(max_entries=256, max_bytes=limit)
    for variant in range(12):
        cache.compile({"tools": tools(variant)})
        assert cache.bytes <= limit
    assert len(cache) == 3
    assert cache.evictions == 9


def test_tools_list_larger_than_the_cache_is_compiled_but_not_kept() -> None:
    body = {
        "tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}]
    }
    cache = ToolsCache(max_bytes=10)
    assert cache.compile(body) is not None
    assert (len(cache), cache.bytes) == (0, 0)


def test_more_tools_than_the_cap_is_a_400_naming_the_field() -> None:
    tool = {"type": "function", "function": {"name": "a"}}
    cache = ToolsCache(max_tools=1024)
    assert cache.compile({"tools": [tool] * 1024}) is not None
    with pytest.raises(InvalidToolsError) as raised:
        cache.compile({"tools": [tool] * 1025})
    assert raised.value.status_code == 400
    assert raised.value.param == "tools"
    assert "1025 tools declared" in str(raised.value)


def test_constrained_names_the_intended_tool_in_one_pass_over_the_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    names = [f"tool_{i}" for i in range(5000)]
    compiled = CompiledTools([(name, {"type": "object"}) for name in names])
    text = ("prose " * 100) + "I will call tool_4321 now. module.tool_7 is not it."
    invented = {"name": "tool_43210", "arguments": "{}"}
    message = {
        "role": "assistant",
        "content": text,
        "tool_calls": [{"id": "c1", "type": "function", "function": invented}],
    }
    verdict = compiled.check_message(message)
    policy = RepairPolicy(mode=RepairMode.CONSTRAINED)
    searches = []
    search = re.search

    def counting_search(*args: Any, **kwargs: Any) -> Any:
        searches.append(args[0])
        return search(*args, **kwargs)

    monkeypatch.setattr(re, "search", counting_search)
    choice = escalated_tool_choice({}, verdict, 2, policy, message, compiled)
    assert choice is not None and choice["function"]["name"] in set(names)
    assert len(searches) <= 1  # not one search over the text per declared tool


def test_wrong_typed_redis_state_is_a_store_error() -> None:
    with pytest.raises(ValueError):
        decode_state(b'{"by_channel": {"unknown_tool": "3"}}')
    with pytest.raises(ValueError):
        decode_state(b'{"seen": [1, 2]}')
    assert decode_state(b'{"by_channel": {"unknown_tool": 3}}').errors == 3


def test_every_episode_state_field_has_a_type_check() -> None:
    assert set(redis_store._FIELD_CHECKS) == {f.name for f in dataclasses.fields(EpisodeState)}


@pytest.fixture
def hung_port() -> Iterator[int]:
    """A server that accepts connections and never answers (a hung Redis)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_hung_redis_costs_one_bounded_call_and_is_counted(hung_port: int) -> None:
    async def main() -> tuple[int, int]:
        client = redis_client(f"redis://127.0.0.1:{hung_port}", timeout=30.0)
        counted: list[str] = []
        health = StoreHealth(timeout=0.05, count_error=counted.append)
        store = GuardedEpisodeStore(RedisEpisodeStore(client), health)
        await store.update("e1", lambda state: None)
        await store.get("e1")
        await client.aclose()
        return health.timeouts, len(counted)

    timeouts, counted = asyncio.run(main())
    assert timeouts == 1  # the second call is skipped while the store rests
    assert counted == 2


def test_a_hung_redis_leaves_no_batched_read_behind(
    hung_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy's client has no socket timeout (the guard cuts each call): the batched read a
    request gave up on still ends, so no task and connection wait for a silent Redis for ever."""
    monkeypatch.setattr(redis_store, "BATCH_TIMEOUT", 0.2)

    async def main() -> tuple[bool, int, int]:
        client = redis_client(f"redis://127.0.0.1:{hung_port}", guarded=True)
        health = StoreHealth(timeout=0.05)
        store = GuardedEpisodeStore(RedisEpisodeStore(client), health)
        reading = await store.read("e1")
        await asyncio.sleep(0.5)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await client.aclose()
        return reading.unknown, health.timeouts, len(left)

    unknown, timeouts, left = asyncio.run(main())
    assert unknown and timeouts == 1  # the request went on without the store
    assert left == 0  # and the read it left behind ended too


def test_wrong_typed_state_in_a_real_redis_is_unknown_and_keeps_its_ttl() -> None:
    async def main(url: str) -> tuple[bool, int, int, int]:
        client = redis_client(url)
        try:
            store = RedisEpisodeStore(client, 3600)
            key = store.key("poisoned")
            await client.set(key, b'1:ab:{"by_channel": {"unknown_tool": "3"}}', px=500_000)
            health = StoreHealth()
            guarded = GuardedEpisodeStore(store, health)
            snapshot = await guarded.update("poisoned", lambda state: state.errors)
            before_ok = await client.pttl(key)
            await store.update("fine", lambda state: state.count("unknown_tool"))
            return snapshot == 0, health.errors, before_ok, await client.pttl(store.key("fine"))
        finally:
            await client.aclose()

    with redis_server() as server:
        blank, errors, poisoned_ttl, fine_ttl = asyncio.run(main(server.url))
    assert blank and errors == 1  # a store error, the mutation ran on a blank state
    assert poisoned_ttl <= 500_000  # not pushed back to the idle TTL (3,600,000 ms)
    assert fine_ttl > 3_000_000


def _failing_history(results: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Where is order #W1?"}]
    for turn in range(results):
        call_id = f"call_{turn:08d}"
        function = {"name": "get_order_details", "arguments": '{"order_id":"1"}'}
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": "Error: not found"})
    return messages


def test_a_history_with_more_failed_results_than_remembered_is_not_recounted() -> None:
    async def main() -> list[int]:
        budget = ErrorBudget(MemoryEpisodeStore(), default_budget=10_000)
        history = _failing_history(MAX_SEEN_RESULTS + 500)
        counted = []
        for _ in range(3):  # the same history resent: nothing new to count
            snapshot = await budget.observe_request("long", {"messages": history})
            counted.append(snapshot.errors)
        more = await budget.observe_request(
            "long", {"messages": _failing_history(len(history) // 2 + 1)}
        )
        counted.append(more.errors)
        return counted

    first, second, third, grown = asyncio.run(main())
    assert second == first and third == first
    assert grown == first + 1  # one more failed result: one more error
