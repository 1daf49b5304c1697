"""The proxy's own store of the Responses it delivered: proxy response id -> the tenant, the input
the client sent (the whole conversation up to that turn) and the answer it was given.

An upstream's store cannot continue a chain the proxy changed: a promoted or repaired answer is
not what the upstream stored (its stored history holds the repair turns the client never saw), a
chat-only upstream stores nothing, and vLLM keeps nothing unless told to. So every delivered
Responses answer is kept here and ``previous_response_id`` is rebuilt from it: the stored input,
the delivered output, then the new turn, sent upstream whole with ``store: false``.

Small on purpose (the Messages and translation routes reuse it): ``put`` / ``get`` / ``delete``
by tenant and id. Records are JSON bytes; a tenant's id is never found under another tenant.
``MemoryResponsesStore`` is an LRU bounded in bytes (``--max-responses-memory``, shared
out per API key);
``RedisResponsesStore`` keeps one key per response (``<prefix>rs:<tenant>/<id>``, expiring after
the idle TTL), shared by every worker and replica, behind ``GuardedResponsesStore`` (a store that
is away loses the record: the next turn's id is unknown, never a 500).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from repairproxy.episodes.guard import StoreHealth

__all__ = [
    "GuardedResponsesStore",
    "MemoryResponsesStore",
    "RedisResponsesStore",
    "ResponsesStore",
    "StoredResponse",
    "decode_record",
    "encode_record",
    "input_items",
    "resend_items",
]


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One delivered response: ``input`` the conversation the client sent for it (items, the
    earlier turns included), ``response`` the Responses object it received, ``episode_id`` the
    episode the turn was charged to (None: not known)."""

    input: list[Any]
    response: dict[str, Any]
    episode_id: str | None = None
    model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # room for other routes' own fields

    def conversation(self) -> list[Any]:
        """What a continuation starts from: the input, then the delivered output items."""
        output = self.response.get("output")
        return [*self.input, *(output if isinstance(output, list) else ())]


def encode_record(record: StoredResponse) -> bytes:
    return orjson.dumps(
        {
            "input": record.input,
            "response": record.response,
            "episode_id": record.episode_id,
            "model": record.model,
            "extra": record.extra,
        }
    )


def decode_record(raw: bytes) -> StoredResponse | None:
    """The record in ``raw``, or None when it is not one this store wrote."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not (
        isinstance(data, dict)
        and isinstance(data.get("input"), list)
        and isinstance(data.get("response"), dict)
    ):
        return None
    episode = data.get("episode_id")
    model = data.get("model")
    extra = data.get("extra")
    return StoredResponse(
        data["input"],
        data["response"],
        episode if isinstance(episode, str) else None,
        model if isinstance(model, str) else None,
        extra if isinstance(extra, dict) else {},
    )


class ResponsesStore(Protocol):
    """Where delivered responses live, by tenant ("" without client keys) and response id."""

    async def put(self, tenant: str, response_id: str, record: StoredResponse) -> None: ...

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None: ...

    async def delete(self, tenant: str, response_id: str) -> bool: ...


class MemoryResponsesStore:
    """An in-process LRU of encoded records, at most ``max_bytes`` of them (keys included) and
    each kept at most ``ttl`` seconds; a record larger than the whole bound is not kept.

    With ``tenant_quota`` (the proxy sets ``max_bytes`` / the number of API keys) a tenant over
    its quota evicts its own oldest records, so one client writing many long conversations cannot
    push another client's chains out of the shared LRU.
    """

    def __init__(
        self,
        max_bytes: int,
        ttl: float = 3600.0,
        *,
        tenant_quota: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_evict: Callable[[], None] | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.ttl = ttl
        self.tenant_quota = tenant_quota
        self._clock = clock
        self._on_evict = on_evict
        self._records: OrderedDict[tuple[str, str], tuple[bytes, float]] = OrderedDict()
        self._by_tenant: dict[str, OrderedDict[str, None]] = {}  # each tenant's ids, oldest first
        self._tenant_bytes: dict[str, int] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._records)

    def tenant_bytes(self, tenant: str) -> int:
        return self._tenant_bytes.get(tenant, 0)

    @staticmethod
    def _size(key: tuple[str, str], raw: bytes) -> int:
        return len(raw) + len(key[0]) + len(key[1]) + 64  # the entry's own overhead, roughly

    def _drop(self, key: tuple[str, str]) -> None:
        raw, _ = self._records.pop(key)
        size = self._size(key, raw)
        self.bytes -= size
        tenant, response_id = key
        ids = self._by_tenant[tenant]
        del ids[response_id]
        self._tenant_bytes[tenant] -= size
        if not ids:
            del self._by_tenant[tenant], self._tenant_bytes[tenant]

    def _evict(self, key: tuple[str, str]) -> None:
        self._drop(key)
        if self._on_evict is not None:
            self._on_evict()

    async def put(self, tenant: str, response_id: str, record: StoredResponse) -> None:
        key = (tenant, response_id)
        raw = encode_record(record)
        if key in self._records:
            self._drop(key)
        size = self._size(key, raw)
        quota = self.max_bytes if self.tenant_quota is None else self.tenant_quota
        if size > min(self.max_bytes, quota):
            return
        self._records[key] = (raw, self._clock() + self.ttl)
        self._by_tenant.setdefault(tenant, OrderedDict())[response_id] = None
        self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + size
        self.bytes += size
        while self._tenant_bytes[tenant] > quota:  # the writer pays first, from its own records
            self._evict((tenant, next(iter(self._by_tenant[tenant]))))
        while self.bytes > self.max_bytes:
            self._evict(next(iter(self._records)))

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        key = (tenant, response_id)
        entry = self._records.get(key)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            self._drop(key)
            return None
        self._records.move_to_end(key)
        self._by_tenant[tenant].move_to_end(response_id)
        return decode_record(entry[0])

    async def delete(self, tenant: str, response_id: str) -> bool:
        key = (tenant, response_id)
        if key not in self._records:
            return False
        self._drop(key)
        return True


class RedisResponsesStore:
    """One Redis key per response, ``<prefix>rs:<tenant>/<id>``, expiring ``ttl`` seconds after
    it was written or last read; a record over ``max_record_bytes`` is not kept."""

    def __init__(
        self,
        client: Redis,
        ttl: float,
        *,
        max_record_bytes: int,
        prefix: str = "repairproxy:",
    ) -> None:
        self.client = client
        self.ttl_ms = max(int(ttl * 1000), 1)
        self.max_record_bytes = max_record_bytes
        self.prefix = prefix

    def _key(self, tenant: str, response_id: str) -> bytes:
        return f"{self.prefix}rs:{tenant}/{response_id}".encode("utf-8", "surrogatepass")

    async def put(self, tenant: str, response_id: str, record: StoredResponse) -> None:
        raw = encode_record(record)
        if len(raw) <= self.max_record_bytes:
            await self.client.set(self._key(tenant, response_id), raw, px=self.ttl_ms)

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        raw = await self.client.getex(self._key(tenant, response_id), px=self.ttl_ms)
        return decode_record(raw) if isinstance(raw, bytes) else None

    async def delete(self, tenant: str, response_id: str) -> bool:
        return bool(await self.client.delete(self._key(tenant, response_id)))


class GuardedResponsesStore:
    """A ``ResponsesStore`` whose failures lose a record (unknown id), never fail a request."""

    def __init__(self, inner: ResponsesStore, health: StoreHealth) -> None:
        self.inner = inner
        self.health = health

    async def put(self, tenant: str, response_id: str, record: StoredResponse) -> None:
        await self.health.attempt(
            "response_put", lambda: self.inner.put(tenant, response_id, record)
        )

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        from repairproxy.episodes.guard import FAILED

        found = await self.health.attempt(
            "response_get", lambda: self.inner.get(tenant, response_id)
        )
        return None if found is FAILED or not isinstance(found, StoredResponse) else found

    async def delete(self, tenant: str, response_id: str) -> bool:
        done = await self.health.attempt(
            "response_delete", lambda: self.inner.delete(tenant, response_id)
        )
        return done is True


def input_items(value: Any) -> list[Any]:
    """A request's ``input`` as items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


def resend_items(items: list[Any]) -> list[Any]:
    """Earlier items as they go upstream again under ``store: false``: without their item ids
    (an upstream that stored nothing cannot resolve them, and a repaired call's id is the
    proxy's own); ``call_id`` links calls to results and is kept."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, Mapping) and "id" in item and item.get("type") != "reasoning":
            out.append({k: v for k, v in item.items() if k != "id"})
        else:
            out.append(item)
    return out
