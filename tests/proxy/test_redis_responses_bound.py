"""The Redis Responses store's per-tenant byte bound, against a real redis-server on loopback:
a tenant over its share evicts its own least recently used records, never another tenant's; the
bytes accounted come back on delete and on expiry; two stores on one Redis (two workers) share
the bound; the proxy's wiring gives each API key its share."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import pytest

from repairproxy.episodes.responses_store import RedisResponsesStore, StoredResponse
from repairproxy.episodes.store import open_stores
from repairproxy.settings import Settings
from tests.support.processes import RedisServer, redis_server

pytestmark = pytest.mark.service


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def _record(size: int) -> StoredResponse:
    return StoredResponse([{"role": "user", "content": "x" * size}], {"id": "r", "output": []})


def _run(redis: RedisServer, body: Callable[[Any], Awaitable[None]]) -> None:
    from repairproxy.episodes.redis_store import redis_client

    async def main() -> None:
        client = redis_client(redis.url)
        try:
            await client.flushdb()
            await body(client)
        finally:
            await client.aclose()

    anyio.run(main)


def test_a_tenant_over_its_share_evicts_its_own_oldest_never_another_tenants(
    redis: RedisServer,
) -> None:
    async def body(client: Any) -> None:
        store = RedisResponsesStore(client, 60.0, max_record_bytes=100_000, tenant_quota=5_000)
        await store.put("quiet", "keep", _record(1_000))
        for n in range(20):  # ~1.1 KB each: four times the busy tenant's share
            await store.put("busy", f"r{n}", _record(1_000))
        assert await store.get("quiet", "keep") is not None
        assert await store.tenant_bytes("busy") <= 5_000
        kept = [n for n in range(20) if await store.get("busy", f"r{n}") is not None]
        assert kept == list(range(16, 20))  # the newest four, the oldest evicted first
        # A read is a use: r16 read, then a new record evicts r17, not r16.
        assert await store.get("busy", "r16") is not None
        await store.put("busy", "r20", _record(1_000))
        assert await store.get("busy", "r17") is None
        assert await store.get("busy", "r16") is not None

    _run(redis, body)


def test_bytes_come_back_on_delete_on_rewrite_and_on_expiry(redis: RedisServer) -> None:
    async def body(client: Any) -> None:
        store = RedisResponsesStore(client, 60.0, max_record_bytes=100_000, tenant_quota=5_000)
        await store.put("t", "a", _record(1_000))
        one = await store.tenant_bytes("t")
        assert one > 1_000
        await store.put("t", "a", _record(1_000))  # the same id rewritten: counted once
        assert await store.tenant_bytes("t") == one
        assert await store.delete("t", "a") is True
        assert await store.tenant_bytes("t") == 0
        assert await store.delete("t", "a") is False

        short = RedisResponsesStore(client, 0.6, max_record_bytes=100_000, tenant_quota=5_000)
        for n in range(3):
            await short.put("e", f"r{n}", _record(1_000))
        three = await short.tenant_bytes("e")
        assert three > 3_000
        time.sleep(0.35)
        await short.put("e", "s0", _record(1_000))  # the bookkeeping lives on with this record
        time.sleep(0.4)  # r0-r2 have expired in Redis, s0 has not
        assert await client.exists(b"repairproxy:rs:e/r0") == 0
        assert await short.tenant_bytes("e") == three // 3  # their bytes were given back
        for n in range(1, 4):  # so the tenant has its whole share again: nothing evicted
            await short.put("e", f"s{n}", _record(1_000))
        assert all([await short.get("e", f"s{n}") is not None for n in range(4)])

    _run(redis, body)


def test_two_workers_share_one_bound_and_an_oversized_record_is_not_kept(
    redis: RedisServer,
) -> None:
    async def body(client: Any) -> None:
        a = RedisResponsesStore(client, 60.0, max_record_bytes=100_000, tenant_quota=5_000)
        b = RedisResponsesStore(client, 60.0, max_record_bytes=100_000, tenant_quota=5_000)
        for n in range(10):
            await (a if n % 2 else b).put("t", f"r{n}", _record(1_000))
        assert await a.tenant_bytes("t") <= 5_000
        assert await b.get("t", "r9") is not None and await a.get("t", "r0") is None
        await a.put("t", "huge", _record(6_000))  # larger than the whole share
        assert await b.get("t", "huge") is None
        assert await b.get("t", "r9") is not None  # and it evicted nothing

    _run(redis, body)


def test_the_proxy_gives_each_api_key_its_share_of_the_responses_bound(
    redis: RedisServer,
) -> None:
    settings = Settings(
        upstream="http://127.0.0.1:9/v1",
        episode_store=redis.url,
        api_keys=("k1", "k2", "k3", "k4"),
        max_responses_memory=40_000,
    )
    shared = open_stores(settings)
    alone = open_stores(
        Settings(
            upstream="http://127.0.0.1:9/v1", episode_store=redis.url, max_responses_memory=40_000
        )
    )
    try:
        inner = shared.responses.inner  # type: ignore[attr-defined]
        assert isinstance(inner, RedisResponsesStore)
        assert inner.tenant_quota == 10_000  # 40,000 bytes among four keys
        assert alone.responses.inner.tenant_quota == 40_000  # type: ignore[attr-defined]
    finally:
        for stores in (shared, alone):
            anyio.run(stores.aclose)
