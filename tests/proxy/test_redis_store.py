"""The Redis episode store and chain index on a real ``redis-server``: atomic updates across
clients, the same counts as the memory store, expiry, bytes per episode, and the guard that keeps
requests going while Redis is away."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis

from repairproxy.episodes.budget import (
    MAX_SEEN_RESULTS,
    MAX_TRACKED_CALL_IDS,
    EpisodeState,
    ErrorBudget,
)
from repairproxy.episodes.guard import GuardedChainIndex, GuardedEpisodeStore, StoreHealth
from repairproxy.episodes.memory_store import MemoryEpisodeStore
from repairproxy.episodes.redis_store import (
    RedisChainIndex,
    RedisEpisodeStore,
    StoreConflictError,
    StoreDataError,
    decode_state,
    encode_state,
    redis_client,
)
from repairproxy.validation import CallVerdict, Channel, MessageVerdict
from tests.support.processes import RedisServer, free_port, redis_server

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture
async def client(redis: RedisServer) -> AsyncIterator[Redis]:
    made = redis_client(redis.url)
    await made.flushdb()
    yield made
    await made.aclose()


def _verdict(*channels: Channel) -> MessageVerdict:
    return MessageVerdict(
        tuple(CallVerdict(i, f"call_{i}", f"tool_{i}", c, "") for i, c in enumerate(channels))
    )


def _history(turns: int, errors: set[int]) -> list[dict[str, Any]]:
    """A retail-like history: one call and one result per turn, ``errors`` failing."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Where is order #W1?"}]
    for turn in range(turns):
        call_id = f"chatcmpl-tool-{turn:032x}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "get_order_details", "arguments": '{"order_id":"1"}'},
                    }
                ],
            }
        )
        content = "Error: order not found" if turn in errors else '{"status": "delivered"}'
        messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
    return messages


def test_state_encodes_to_json_and_back() -> None:
    state = EpisodeState()
    state.count("unknown_tool")
    state.first_sight("call_1#0:abcd")
    state.expect("call_2#0")
    state.result_counts = {"call_1": 1}
    assert decode_state(encode_state(state)) == state


async def test_update_and_get_round_trip(client: Redis) -> None:
    store = RedisEpisodeStore(client, 60)
    assert await store.get("ep") is None
    assert await store.update("ep", lambda s: s.count("unknown_tool")) is None
    await store.update("ep", lambda s: s.count("schema_violation"))
    state = await store.get("ep")
    assert state is not None and state.by_channel == {"unknown_tool": 1, "schema_violation": 1}
    await RedisChainIndex(client, 60).link(b"d" * 16, "ep")
    await store.update("ep-2", lambda s: None)
    assert await store.count() == 2  # episodes only (the active_episodes gauge), not links


async def test_an_update_that_changes_nothing_still_creates_the_episode(client: Redis) -> None:
    store = RedisEpisodeStore(client, 60)
    await store.update("quiet", lambda s: None)
    assert await store.get("quiet") == EpisodeState()
    version = await client.get(store.key("quiet"))
    await store.update("quiet", lambda s: None)
    assert await client.get(store.key("quiet")) == version  # no write when nothing changed


async def test_concurrent_updates_from_two_pools_are_never_lost(redis: RedisServer) -> None:
    """Two clients (two processes' pools) x 16 tasks x 10 updates of one episode: exact."""
    clients = [redis_client(redis.url), redis_client(redis.url)]
    stores = [RedisEpisodeStore(c, 60) for c in clients]
    try:

        async def worker(store: RedisEpisodeStore) -> None:
            for _ in range(10):
                await store.update("hot", lambda s: s.count("unknown_tool"))

        async with anyio.create_task_group() as group:
            for index in range(16):
                group.start_soon(worker, stores[index % 2])
        state = await stores[0].get("hot")
        assert state is not None and state.errors == 160
        assert stores[0].conflicts + stores[1].conflicts > 0  # the race really happened
    finally:
        for c in clients:
            await c.aclose()


async def test_a_new_episode_is_new_to_exactly_one_of_many_processes(redis: RedisServer) -> None:
    clients = [redis_client(redis.url) for _ in range(4)]
    try:
        stores = [RedisEpisodeStore(c, 60) for c in clients]
        found: list[EpisodeState | None] = []

        async def look(store: RedisEpisodeStore) -> None:
            found.append(await store.get("fresh"))

        async with anyio.create_task_group() as group:
            for index in range(16):
                group.start_soon(look, stores[index % 4])
        assert sum(state is None for state in found) == 1
        assert all(state == EpisodeState() for state in found if state is not None)
        await stores[0].update("fresh", lambda s: s.count("unknown_tool"))  # version 0 is CAS-able
        state = await stores[1].get("fresh")
        assert state is not None and state.errors == 1
    finally:
        for c in clients:
            await c.aclose()


async def test_a_lost_race_gives_up_after_the_bound(client: Redis) -> None:
    """Every compare-and-set lost (another writer always first): a typed error after the bound,
    which the guard turns into an unknown budget."""
    store = RedisEpisodeStore(client, 60, max_attempts=3)
    calls: list[int] = []

    async def always_lost(*, keys: list[str], args: list[Any]) -> int:
        calls.append(1)
        return 0

    store._cas = always_lost  # type: ignore[assignment]
    with pytest.raises(StoreConflictError):
        await store.update("fight", lambda s: s.count("unknown_tool"))
    assert len(calls) == 3 and store.conflicts == 3


async def test_keys_expire_with_the_idle_ttl(client: Redis) -> None:
    store = RedisEpisodeStore(client, 0.4)
    chains = RedisChainIndex(client, 0.4)
    await store.update("brief", lambda s: s.count("unknown_tool"))
    await chains.link(b"\x01" * 16, "brief")
    assert 0 < await client.pttl(store.key("brief")) <= 400
    await anyio.sleep(0.25)
    await store.update("brief", lambda s: None)  # a touch pushes the deadline back
    await chains.lookup(b"\x01" * 16)
    await anyio.sleep(0.25)
    assert await store.get("brief") is not None
    assert await chains.lookup(b"\x01" * 16) is not None
    await anyio.sleep(0.6)
    assert await client.dbsize() == 0
    assert await chains.lookup(b"\x01" * 16) is None
    assert await store.get("brief") is None  # gone: a new episode of that name starts


async def test_chain_links_turn_ambiguous_across_clients(redis: RedisServer) -> None:
    a, b = redis_client(redis.url), redis_client(redis.url)
    try:
        one, two = RedisChainIndex(a, 60), RedisChainIndex(b, 60)
        await one.link(b"k" * 16, "ep-1")
        await two.link(b"k" * 16, "ep-1")
        link = await two.lookup(b"k" * 16)
        assert link is not None and (link.episode_id, link.ambiguous) == ("ep-1", False)
        await two.link(b"k" * 16, "ep-2")
        link = await one.lookup(b"k" * 16)
        assert link is not None and (link.episode_id, link.ambiguous) == ("ep-2", True)
        await one.link(b"k" * 16, "ep-2")  # once ambiguous, always ambiguous
        link = await one.lookup(b"k" * 16)
        assert link is not None and link.ambiguous
    finally:
        await a.aclose()
        await b.aclose()


async def test_budget_counts_as_the_memory_store_does(client: Redis) -> None:
    """One scripted episode through ErrorBudget on both stores: identical snapshots."""
    shared = ErrorBudget(RedisEpisodeStore(client, 60), chains=RedisChainIndex(client, 60))
    local = ErrorBudget(MemoryEpisodeStore())
    seen: list[tuple[int, dict[str, int]]] = []
    for budget in (shared, local):
        trace = []
        for turn in range(1, 8):
            body = {"messages": _history(turn, {1, 3, 4})}
            request = await budget.observe_request("ep", body)
            channels = (Channel.UNKNOWN_TOOL,) if turn in (2, 6) else (Channel.VALID,)
            answer = await budget.observe_answer("ep", _verdict(*channels))
            trace.append((request.errors, answer.errors, answer.remaining))
        seen.append((len(trace), dict(answer.by_channel)))
        assert trace == [
            (0, 0, 10),
            (1, 2, 8),
            (2, 2, 8),
            (3, 3, 7),
            (4, 4, 6),
            (4, 5, 5),
            (5, 5, 5),
        ]
    assert seen[0] == seen[1]


async def test_bytes_per_episode_are_measured_and_bounded(client: Redis) -> None:
    store = RedisEpisodeStore(client, 3600)
    budget = ErrorBudget(store)
    # A τ²-bench-sized episode: 30 tool results, 4 of them errors, one charged answer.
    await budget.observe_request("typical", {"messages": _history(30, {2, 9, 17, 25})})
    await budget.observe_answer("typical", _verdict(Channel.UNKNOWN_TOOL))
    typical = await store.memory_usage("typical")

    # The worst a client can make: every kept set at its bound, ids at their longest.
    def fill(state: EpisodeState) -> None:
        for i in range(MAX_SEEN_RESULTS):
            state.first_sight(f"{'x' * 64}#{i}:{i:016x}")
        state.result_counts = {f"{'y' * 60}{i:04d}": i for i in range(MAX_TRACKED_CALL_IDS)}
        for i in range(256):
            state.expect(f"{'z' * 64}#{i}")
        for label in ("unknown_tool", "schema_violation", "env_other_error"):
            state.count(label)

    await store.update("worst", fill)
    worst = await store.memory_usage("worst")
    print(f"\nredis MEMORY USAGE per episode: typical {typical} B, worst case {worst} B")
    assert typical is not None and typical < 4096
    assert worst is not None and worst < 192 * 1024


async def test_guard_keeps_requests_going_and_recovers(redis: RedisServer) -> None:
    """A store on a port where no Redis listens: unknown budgets, counted and logged once;
    a Redis started there later is used again by itself."""
    port = free_port()
    errors: list[str] = []
    lines: list[tuple[str, dict[str, Any]]] = []

    class Log:
        def warning(self, event: str, **fields: Any) -> None:
            lines.append((event, fields))

    health = StoreHealth(retry_after=0.2, count_error=errors.append, log=Log())
    client = redis_client(f"redis://127.0.0.1:{port}/0", timeout=0.5)
    store = GuardedEpisodeStore(RedisEpisodeStore(client, 60), health)
    chains = GuardedChainIndex(RedisChainIndex(client, 60), health)
    budget = ErrorBudget(store, default_budget=1, chains=chains)
    try:
        body = {"messages": _history(2, {0})}
        ref = await budget.resolve_episode({"x-episode-id": "away"}, body)
        assert not ref.new  # unknown is not "new": no episode counted twice
        snapshot = await budget.observe_request("away", body)
        assert snapshot.unknown and not snapshot.exhausted
        assert snapshot.errors_before == snapshot.errors  # no ladder rung crossed
        await chains.link(b"a" * 16, "away")
        assert await chains.lookup(b"a" * 16) is None
        assert errors == ["get", "update", "link", "lookup"]
        assert [event for event, _ in lines] == ["episode store unavailable"]
        assert "ConnectionError" in lines[0][1]["error"]

        # Redis comes up on that port; after the rest interval the store is used again.
        from tests.support.processes import _start_redis

        started = _start_redis(redis.binary, port)
        try:
            await anyio.sleep(0.25)
            counted = await budget.observe_request("away", body)
            assert not counted.unknown and counted.errors == 1 and counted.exhausted
            assert lines[-1][0] == "episode store available again"
            assert not health.down
        finally:
            started.kill()
            started.wait(5)
    finally:
        await client.aclose()


async def test_a_password_in_the_url_and_a_wrong_one() -> None:
    with redis_server("--requirepass", "s3cret") as server:
        good = redis_client(f"redis://:s3cret@127.0.0.1:{server.port}/2")
        bad = redis_client(f"redis://:wrong@127.0.0.1:{server.port}/2")
        errors: list[str] = []
        try:
            store = RedisEpisodeStore(good, 60)
            await store.update("ep", lambda s: s.count("unknown_tool"))
            assert await good.exists(store.key("ep")) == 1
            health = StoreHealth(count_error=errors.append)
            guarded = GuardedEpisodeStore(RedisEpisodeStore(bad, 60), health)
            snapshot = await ErrorBudget(guarded).observe_request("ep", {"messages": []})
            assert snapshot.unknown and errors == ["update"]  # refused: unknown, not an error
        finally:
            await good.aclose()
            await bad.aclose()


async def test_a_foreign_value_under_the_prefix_is_a_store_error(client: Redis) -> None:
    store = RedisEpisodeStore(client, 60)
    await client.set(store.key("odd"), b"not ours")
    with pytest.raises(StoreDataError):
        await store.get("odd")
    errors: list[str] = []
    guarded = GuardedEpisodeStore(store, StoreHealth(count_error=errors.append))
    snapshot = await ErrorBudget(guarded).observe_request("odd", {"messages": []})
    assert snapshot.unknown and errors == ["update"]
