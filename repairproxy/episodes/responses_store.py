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
out per API key); ``RedisResponsesStore`` keeps one key per response (``<prefix>rs:<tenant>/<id>``,
expiring after the idle TTL), bounded in bytes per tenant as the LRU is, shared by every worker
and replica, behind ``GuardedResponsesStore`` (a store that is away loses the record: the next
turn's id is unknown, never a 500).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from repairproxy.episodes.guard import StoreHealth
    from repairproxy.episodes.redis_store import ScriptBatch

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

    async def put_many(
        self, tenant: str, records: Sequence[tuple[str, StoredResponse]]
    ) -> None: ...  # in one round trip where that counts

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None: ...

    async def delete(self, tenant: str, response_id: str) -> bool: ...


def _accounted_size(tenant: str, response_id: str, raw: bytes) -> int:
    """The bytes a record counts for in either store: record, keys and the entry's own overhead."""
    return len(raw) + len(tenant) + len(response_id) + 64


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

    def _drop(self, key: tuple[str, str]) -> None:
        raw, _ = self._records.pop(key)
        size = _accounted_size(key[0], key[1], raw)
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
        size = _accounted_size(key[0], key[1], raw)
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

    async def put_many(self, tenant: str, records: Sequence[tuple[str, StoredResponse]]) -> None:
        for response_id, record in records:
            await self.put(tenant, response_id, record)

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


# The tenant's bookkeeping beside its records, in one atomic step per operation (every worker and
# replica shares it): KEYS[1] the tenant's ids by last use (a sorted set, score = Redis's clock in
# ms, kept strictly increasing), KEYS[2] their sizes (a hash), KEYS[3] their byte total; ARGV[1]
# the record key prefix. An id older than the TTL whose record is gone gives its bytes back.
_LUA_HELPERS = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function stamp(now)  -- strictly after every use so far: ties would sort by id
  local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2]
  if top and tonumber(top) >= now then return tonumber(top) + 1 end
  return now
end
local function forget(id)
  local size = tonumber(redis.call('HGET', KEYS[2], id) or '0')
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[1], id)
  if size > 0 then redis.call('DECRBY', KEYS[3], size) end
end
local function prune(now, ttl)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - ttl)) do
    if redis.call('EXISTS', ARGV[1] .. id) == 0 then forget(id) end
  end
end
"""
# put: ARGV[2] id, ARGV[3] record, ARGV[4] its accounted size, ARGV[5] ttl ms, ARGV[6] quota.
# Returns how many of the tenant's own records were evicted to make room.
_PUT = (
    _LUA_HELPERS
    + """
local now, ttl, quota = now_ms(), tonumber(ARGV[5]), tonumber(ARGV[6])
prune(now, ttl)
forget(ARGV[2])
local size = tonumber(ARGV[4])
local evicted = 0
if size <= quota then
  redis.call('SET', ARGV[1] .. ARGV[2], ARGV[3], 'PX', ttl)
  redis.call('ZADD', KEYS[1], stamp(now), ARGV[2])
  redis.call('HSET', KEYS[2], ARGV[2], size)
  local total = redis.call('INCRBY', KEYS[3], size)
  while total > quota do
    local two = redis.call('ZRANGE', KEYS[1], 0, 1)  -- the oldest that is not this record
    local oldest = two[1] == ARGV[2] and two[2] or two[1]
    if oldest == nil then break end
    redis.call('DEL', ARGV[1] .. oldest)
    forget(oldest)
    evicted = evicted + 1
    total = tonumber(redis.call('GET', KEYS[3]) or '0')
  end
else
  redis.call('DEL', ARGV[1] .. ARGV[2])
end
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ttl) end
return evicted
"""
)
# get: ARGV[2] id, ARGV[3] ttl ms. The record (its expiry renewed) or nil.
_GET = (
    _LUA_HELPERS
    + """
local raw = redis.call('GETEX', ARGV[1] .. ARGV[2], 'PX', ARGV[3])
if raw then
  redis.call('ZADD', KEYS[1], 'XX', stamp(now_ms()), ARGV[2])
  for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ARGV[3]) end
end
return raw
"""
)
# total: ARGV[2] ttl ms. The tenant's accounted bytes, expired records given back first.
_TOTAL = (
    _LUA_HELPERS
    + """
prune(now_ms(), tonumber(ARGV[2]))
return tonumber(redis.call('GET', KEYS[3]) or '0')
"""
)
# delete: ARGV[2] id. 1 when a record was deleted.
_DELETE = (
    _LUA_HELPERS
    + """
local deleted = redis.call('DEL', ARGV[1] .. ARGV[2])
forget(ARGV[2])
return deleted
"""
)


class RedisResponsesStore:
    """One Redis key per response, ``<prefix>rs:<tenant>/<id>``, expiring ``ttl`` seconds after
    it was written or last read, and each tenant's records bounded in bytes like the in-process
    store's: at most ``tenant_quota`` bytes (records, keys and ~64 bytes each; the proxy gives
    each API key ``--max-responses-memory`` / the number of keys, one tenant without keys the
    whole bound), the tenant's least recently used records evicted first, so one client cannot
    fill Redis or, under its ``maxmemory`` policy, push out another client's chains. A record
    larger than the whole quota is not kept. The bookkeeping (``<prefix>rsz:``, ``rsb:``, ``rst:``
    + tenant: ids by last use, sizes, total) is updated by one Lua script per operation, atomic
    across workers and replicas, and expires with the records; a record that expired by its TTL
    gives its bytes back at the tenant's next put or size check (``tenant_bytes``). (The scripts
    name record keys they build, so a Redis Cluster would need every tenant's keys in one slot:
    not supported.)"""

    def __init__(
        self,
        client: Redis,
        ttl: float,
        *,
        max_record_bytes: int,
        tenant_quota: int | None = None,
        prefix: str = "repairproxy:",
        batch: ScriptBatch | None = None,
    ) -> None:
        from repairproxy.episodes.redis_store import ScriptBatch

        self.client = client
        # Shared with the episode store on the same client: a request's record and its episode
        # go to Redis in one round trip when it asks for both at once.
        self.batch = batch if batch is not None else ScriptBatch(client)
        self.ttl_ms = max(int(ttl * 1000), 1)
        self.max_record_bytes = max_record_bytes
        self.tenant_quota = max_record_bytes if tenant_quota is None else tenant_quota
        self.prefix = prefix
        self._put = client.register_script(_PUT)
        self._get = client.register_script(_GET)
        self._delete = client.register_script(_DELETE)
        self._total = client.register_script(_TOTAL)

    def _keys(self, tenant: str) -> tuple[list[bytes], bytes]:
        """The tenant's three bookkeeping keys and its record key prefix."""
        base = self.prefix.encode("utf-8", "surrogatepass")
        name = tenant.encode("utf-8", "surrogatepass")
        keys = [base + b"rsz:" + name, base + b"rsb:" + name, base + b"rst:" + name]
        return keys, base + b"rs:" + name + b"/"

    async def tenant_bytes(self, tenant: str) -> int:
        """The bytes accounted to ``tenant`` now (expired records given back first)."""
        keys, records = self._keys(tenant)
        return int(await self._total(keys=keys, args=[records, self.ttl_ms]))

    async def put(self, tenant: str, response_id: str, record: StoredResponse) -> None:
        await self.put_many(tenant, [(response_id, record)])

    async def put_many(self, tenant: str, records: Sequence[tuple[str, StoredResponse]]) -> None:
        """Every record in one batch (one round trip), each put by its own script call."""
        quota = min(self.max_record_bytes, self.tenant_quota)
        keys, prefix = self._keys(tenant)
        calls = []
        for response_id, record in records:
            raw = encode_record(record)
            size = _accounted_size(tenant, response_id, raw)
            ident = response_id.encode("utf-8", "surrogatepass")
            args = [prefix, ident, raw, size, self.ttl_ms, quota]
            calls.append(self.batch.submit(self._put, keys=keys, args=args))
        await asyncio.gather(*calls)

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        keys, records = self._keys(tenant)
        ident = response_id.encode("utf-8", "surrogatepass")
        raw = await self.batch(self._get, keys=keys, args=[records, ident, self.ttl_ms])
        return decode_record(raw) if isinstance(raw, bytes) else None

    async def delete(self, tenant: str, response_id: str) -> bool:
        keys, records = self._keys(tenant)
        ident = response_id.encode("utf-8", "surrogatepass")
        return bool(await self._delete(keys=keys, args=[records, ident]))


class GuardedResponsesStore:
    """A ``ResponsesStore`` whose failures lose a record (unknown id), never fail a request."""

    def __init__(self, inner: ResponsesStore, health: StoreHealth) -> None:
        self.inner = inner
        self.health = health

    async def put(self, tenant: str, response_id: str, record: StoredResponse) -> None:
        await self.health.attempt(
            "response_put", lambda: self.inner.put(tenant, response_id, record)
        )

    async def put_many(self, tenant: str, records: Sequence[tuple[str, StoredResponse]]) -> None:
        await self.health.attempt("response_put", lambda: self.inner.put_many(tenant, records))

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
