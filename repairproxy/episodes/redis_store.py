"""Episodes and conversation links in Redis, shared by every worker and replica.

An episode is one string key, ``<prefix>ep:<id>`` = ``<version>:<token>:<EpisodeState as JSON>``.
An update reads it with its TTL (a script; the TTL is pushed back by the write, or by a
``PEXPIRE`` once a tenth of it has passed, and never for a value it cannot read), runs ``mutate``
on the decoded state, and writes the result with a compare-and-set script that checks the
version: two processes that mutate one episode at once never lose an update, the loser retries on
the state the winner wrote (bounded; the ladder rungs and the seen-result keys are decided inside
the mutation, so a retried one decides again on fresh data). The random token makes the write
idempotent: when the client resends the script after a reply was lost, the script recognises its
own write instead of failing the version check and counting twice. An update that changes
nothing writes nothing (one round trip: the common request without a new tool error).

``get`` claims an episode it does not find (an empty state, in the same script): of two replicas
that meet a new episode at once, exactly one hears "absent", so the episode is counted as started
once (``repairproxy_episodes_total``).

A request through the proxy spends one round trip when nothing changed and two when something
did (``read`` before the upstream call: the claim and the state in one script;
``write`` after it: one compare-and-set of everything the request and its answer changed, which
``ErrorBudget`` computed in Python, replayed on the winner's state after a lost race).

The stores of one client share a ``ScriptBatch``: the calls a request makes of several stores at
once (a Responses or thread route's stored turn and the header's episode before the upstream call;
the new record, its link and the episode's write after it) go in one round trip, and so do the
reads of requests that arrive together.

A conversation link is ``<prefix>ch:<digest hex>`` = ``<0|1>:<episode id>`` (1: ambiguous), set by
one script so that two replicas linking one digest to two episodes both see it ambiguous.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import NoScriptError, RedisError

from repairproxy.episodes.budget import EpisodeState, Reading
from repairproxy.episodes.chaining import ChainLink

__all__ = [
    "DEFAULT_PREFIX",
    "MAX_ATTEMPTS",
    "RedisChainIndex",
    "RedisEpisodeStore",
    "ScriptBatch",
    "StoreConflictError",
    "StoreDataError",
    "decode_state",
    "encode_state",
    "redis_client",
]

T = TypeVar("T")

DEFAULT_PREFIX = "repairproxy:"
# Compare-and-set attempts per update before it gives up (the count is then unknown, never wrong).
# 16 clients of one episode on 2 processes need a handful at most; the jittered pause grows.
MAX_ATTEMPTS = 64
_FIELDS = tuple(f.name for f in dataclasses.fields(EpisodeState))
# Seconds a batch of reads may wait for Redis at most (each caller gives up at its own timeout).
BATCH_TIMEOUT = 5.0

# KEYS[1] the episode; ARGV: expected version, new value (with its version and token), TTL in
# ms, the token. 1: written (or written already by this very call, resent after a lost reply).
_CAS = """
local current = redis.call('GET', KEYS[1])
local version, token = '0', ''
if current then version, token = string.match(current, '^(%d+):(%x*):') end
if version == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if token == ARGV[4] then return 1 end
return 0
"""

# KEYS[1] the episode. Its value and remaining TTL in ms (nil: absent); the TTL is not touched,
# so an unreadable value is not kept alive by the requests it fails.
_READ = """
local current = redis.call('GET', KEYS[1])
if not current then return false end
return {current, redis.call('PTTL', KEYS[1])}
"""

# KEYS[1] the episode; ARGV: the empty state (version 0), TTL in ms. What a request reads before
# its upstream call, in one round trip: {value, TTL left in ms}, or nil when absent until now
# (then claimed: of two readers exactly one hears it). The TTL is not touched here (``_READ``).
_READ_OR_CLAIM = """
local current = redis.call('GET', KEYS[1])
if not current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return false
end
return {current, redis.call('PTTL', KEYS[1])}
"""

# KEYS[1] the episode; ARGV: the empty state (version 0), TTL in ms. nil: absent until now.
_CLAIM = """
local current = redis.call('GET', KEYS[1])
if current then return current end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
"""

# KEYS[1] the digest; ARGV: episode id, TTL in ms. Another episode's link makes it ambiguous.
_LINK = """
local current = redis.call('GET', KEYS[1])
local flag = '0'
if current and (string.sub(current, 1, 1) == '1' or string.sub(current, 3) ~= ARGV[1]) then
  flag = '1'
end
redis.call('SET', KEYS[1], flag .. ':' .. ARGV[1], 'PX', ARGV[2])
return flag
"""


class StoreConflictError(RuntimeError):
    """An update lost the compare-and-set ``MAX_ATTEMPTS`` times in a row."""


class StoreDataError(RuntimeError):
    """A key under the prefix does not hold what this store writes (another program's)."""


def redis_client(
    url: str, *, max_connections: int = 64, timeout: float = 1.0, guarded: bool = False
) -> Redis:
    """An asyncio client with its own connection pool for ``redis://`` / ``rediss://`` URLs
    (password and database number in the URL). Connects lazily: a proxy starts without Redis.

    Two quick retries on a broken connection (a restarted Redis leaves stale ones in the pool),
    not redis-py's ten: while Redis is away a request must not wait seconds for it. ``guarded``:
    every call is cut by the guard's timeout (``--store-timeout``), so the socket has none of its
    own (redis-py's wraps each send in a task, ``asyncio.wait_for``, and each read in a timer: a
    fifth of a round trip's CPU). The reply parser is hiredis's when it is installed.
    """
    client: Redis = Redis.from_url(
        url,
        max_connections=max_connections,
        socket_connect_timeout=min(timeout, 0.25),
        socket_timeout=None if guarded else timeout,
        health_check_interval=30,
        retry=Retry(ExponentialWithJitterBackoff(base=0.005, cap=0.05), retries=2),
    )
    return client


def encode_state(state: EpisodeState) -> bytes:
    return orjson.dumps({name: getattr(state, name) for name in _FIELDS})


def _counts(value: Any) -> bool:
    return isinstance(value, dict) and all(type(v) is int for v in value.values())


def _ordered_set(value: Any) -> bool:
    return isinstance(value, dict) and all(v is None for v in value.values())


# What each field of ``EpisodeState`` holds: dicts of ints (counts) or of nulls (ordered sets);
# JSON's keys are strings already. Written out rather than read from the annotations' text (which
# a mypyc-compiled EpisodeState, ``benchmarks.diagnostics.mypyc_ab``, reports as plain ``dict``); a
# test checks that every field has one.
_FIELD_CHECKS: dict[str, Callable[[Any], bool]] = {
    "by_channel": _counts,
    "silent_by_channel": _counts,
    "seen": _ordered_set,
    "pending": _ordered_set,
    "result_counts": _counts,
}


def decode_state(raw: bytes) -> EpisodeState:
    """The stored state; ``ValueError`` when a field is not what this store writes (a wrong
    type would otherwise fail later, inside the request, as a 500)."""
    data = orjson.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("the episode state is not a JSON object")
    for name, check in _FIELD_CHECKS.items():
        if name in data and not check(data[name]):
            raise ValueError(f"field {name!r} does not hold what this store writes")
    return EpisodeState(**{name: data[name] for name in _FIELDS if name in data})


def _load(version: bytes, body: bytes) -> tuple[int, EpisodeState]:
    try:
        return int(version), decode_state(body)
    except (ValueError, TypeError, KeyError) as exc:  # orjson's JSONDecodeError is a ValueError
        raise StoreDataError(f"unreadable episode state: {exc}") from exc


def _split(value: bytes | str | None) -> tuple[bytes, bytes | None]:
    """(version, state JSON) of a stored value; version ``b"0"`` when the key is absent."""
    if value is None:
        return b"0", None
    if isinstance(value, str):  # a client made with decode_responses=True
        value = value.encode()
    version, _, rest = value.partition(b":")
    return version, rest.partition(b":")[2]


class ScriptBatch:
    """The script calls on one client made in one turn of the event loop, sent together: one
    write and one read of the socket. A request that needs several stores at once (its record,
    its episode, its link) issues their calls concurrently and pays one round trip; concurrent
    requests share one too. Alone, a call goes as it is (one ``EVALSHA``); together, the calls go
    as one ``MULTI`` / ``EXEC`` (atomic, and one visible round trip in ``MONITOR``). The stores of
    one client share one batch (``open_stores``)."""

    def __init__(self, client: Redis) -> None:
        self.client = client
        self._waiting: list[tuple[Any, list[Any], asyncio.Future[Any]]] = []

    async def __call__(self, script: Any, *, keys: list[Any], args: list[Any]) -> Any:
        return await self.submit(script, keys=keys, args=args)

    def submit(self, script: Any, *, keys: list[Any], args: list[Any]) -> asyncio.Future[Any]:
        """Queue the call now (several from one caller go in one batch); its reply later."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._waiting.append((script, [len(keys), *keys, *args], future))
        if len(self._waiting) == 1:
            loop.call_soon(self._flush, loop)
        return future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._waiting = self._waiting, []
        loop.create_task(self._send(batch))

    async def _send(self, batch: list[tuple[Any, list[Any], asyncio.Future[Any]]]) -> None:
        try:
            # The callers' own timeouts (the guard's) do not reach this task: a Redis that never
            # answers must not keep it, and its connection, for ever.
            async with asyncio.timeout(BATCH_TIMEOUT):
                if len(batch) == 1:
                    script, words, _ = batch[0]
                    count = words[0]
                    results: list[Any] = [
                        await script(keys=words[1 : count + 1], args=words[count + 1 :])
                    ]
                else:
                    results = await self._together([(s, w) for s, w, _ in batch])
        except BaseException as exc:  # every caller hears it (the guard counts it)
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, _, future), result in zip(batch, results, strict=True):
            if future.done():
                continue  # the caller gave up (its timeout)
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def _together(self, calls: list[tuple[Any, list[Any]]]) -> list[Any]:
        pipe = self.client.pipeline(transaction=True)
        for script, words in calls:
            pipe.evalsha(script.sha, *words)
        results = list(await pipe.execute(raise_on_error=False))
        missing = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
        if missing:  # Redis restarted: load the scripts again and run those calls alone
            for index in missing:
                script, words = calls[index]
                await self.client.script_load(script.script)
                try:
                    results[index] = await self.client.evalsha(script.sha, *words)
                except RedisError as exc:
                    results[index] = exc
        return results


class RedisEpisodeStore:
    """``EpisodeStore`` on Redis: atomic per episode across processes, idle keys expire."""

    def __init__(
        self,
        client: Redis,
        idle_ttl_seconds: float = 3600.0,
        *,
        prefix: str = DEFAULT_PREFIX,
        max_attempts: int = MAX_ATTEMPTS,
        batch: ScriptBatch | None = None,
    ) -> None:
        self.client = client
        self.batch = batch if batch is not None else ScriptBatch(client)
        self.idle_ttl_seconds = idle_ttl_seconds
        self.prefix = prefix
        self.max_attempts = max_attempts
        self._ttl_ms = max(int(idle_ttl_seconds * 1000), 1)
        self._cas = client.register_script(_CAS)
        self._claim = client.register_script(_CLAIM)
        self._read = client.register_script(_READ)
        self._read_or_claim = client.register_script(_READ_OR_CLAIM)
        self._empty = b"0::" + encode_state(EpisodeState())
        self.conflicts = 0  # compare-and-set attempts lost (for tests and benchmarks)

    def key(self, episode_id: str) -> str:
        return f"{self.prefix}ep:{episode_id}"

    async def update(self, episode_id: str, mutate: Callable[[EpisodeState], T]) -> T:
        key = self.key(episode_id)
        for attempt in range(self.max_attempts):
            read = await self.batch(self._read, keys=[key], args=[])
            value, ttl_left = (read[0], int(read[1])) if read else (None, 0)
            version, body = _split(value)
            number, state = _load(version, body) if body is not None else (0, EpisodeState())
            result = mutate(state)
            encoded = encode_state(state)
            if encoded == body:
                # Nothing changed: the read was the transaction. The idle TTL is pushed back only
                # once a tenth of it has passed (one more round trip, rarely).
                if ttl_left < self._ttl_ms * 0.9:
                    await self.client.pexpire(key, self._ttl_ms)
                return result
            token = secrets.token_hex(6).encode()
            value = b"%d:%s:%s" % (number + 1, token, encoded)
            if await self.batch(self._cas, keys=[key], args=[version, value, self._ttl_ms, token]):
                return result
            self.conflicts += 1
            # Someone else wrote first: read again after a short jittered pause.
            await asyncio.sleep(random.uniform(0, 0.0005 * min(attempt + 1, 10)))
        raise StoreConflictError(
            f"episode {episode_id}: {self.max_attempts} concurrent updates won over this one"
        )

    async def read(self, episode_id: str, *, claim: bool = True) -> Reading:
        """The episode as a request finds it before its upstream call (one round trip; claims
        an absent one unless ``claim`` is false, pushes the idle TTL back). ``write`` later sets
        against it."""
        key = self.key(episode_id)
        if claim:
            args = [self._empty, self._ttl_ms]
            read = await self.batch(self._read_or_claim, keys=[key], args=args)
        else:
            read = await self.batch(self._read, keys=[key], args=[])
        if not read:
            return Reading(EpisodeState(), (b"0", None), absent=True)
        version, body = _split(read[0])
        state = _load(version, body)[1] if body is not None else EpisodeState()
        if int(read[1]) < self._ttl_ms * 0.9:
            # A readable episode's idle TTL, pushed back once a tenth of it has passed (one more
            # round trip, rarely: every few minutes of an hour's TTL).
            await self.client.pexpire(key, self._ttl_ms)
        return Reading(state, (version, body))

    async def write(
        self, episode_id: str, reading: Reading, mutate: Callable[[EpisodeState], T]
    ) -> T | None:
        """``mutate`` on the state ``reading`` found, set if nobody wrote since (one round trip);
        else read again and mutate that, like ``update``. Nothing is written when nothing
        changed."""
        key = self.key(episode_id)
        version, body = reading.version if reading.version is not None else (b"0", None)
        base = reading.state
        for attempt in range(self.max_attempts):
            state = EpisodeState()
            state.copy_from(base)
            number = int(version)
            result = mutate(state)
            encoded = encode_state(state)
            if encoded == body:
                return result
            token = secrets.token_hex(6).encode()
            value = b"%d:%s:%s" % (number + 1, token, encoded)
            if await self.batch(self._cas, keys=[key], args=[version, value, self._ttl_ms, token]):
                return result
            self.conflicts += 1
            await asyncio.sleep(random.uniform(0, 0.0005 * min(attempt + 1, 10)))
            read = await self.batch(self._read, keys=[key], args=[])
            version, body = _split(read[0] if read else None)
            base = _load(version, body)[1] if body is not None else EpisodeState()
        raise StoreConflictError(
            f"episode {episode_id}: {self.max_attempts} concurrent updates won over this one"
        )

    async def get(self, episode_id: str) -> EpisodeState | None:
        """The episode's state; None (once, to one caller) when it did not exist, which also
        creates it empty."""
        value = await self._claim(keys=[self.key(episode_id)], args=[self._empty, self._ttl_ms])
        version, body = _split(value)
        return _load(version, body)[1] if body is not None else None

    async def count(self, batch: int = 1000) -> int:
        """Episodes under this prefix: a SCAN, for the ``active_episodes`` gauge only."""
        total = 0
        async for _ in self.client.scan_iter(match=f"{self.prefix}ep:*", count=batch):
            total += 1
        return total

    async def memory_usage(self, episode_id: str) -> int | None:
        """Bytes Redis spends on the episode's key (``MEMORY USAGE``), None when absent."""
        used: Any = await self.client.memory_usage(self.key(episode_id), samples=0)
        return int(used) if used is not None else None


class RedisChainIndex:
    """``ChainIndex`` on Redis: one key per answered history, expiring with the idle TTL."""

    def __init__(
        self,
        client: Redis,
        idle_ttl_seconds: float = 3600.0,
        *,
        prefix: str = DEFAULT_PREFIX,
        batch: ScriptBatch | None = None,
    ) -> None:
        self.client = client
        self.batch = batch if batch is not None else ScriptBatch(client)
        self.idle_ttl_seconds = idle_ttl_seconds
        self.prefix = prefix
        self._ttl_ms = max(int(idle_ttl_seconds * 1000), 1)
        self._link = client.register_script(_LINK)

    def key(self, digest: bytes) -> str:
        return f"{self.prefix}ch:{digest.hex()}"

    async def link(self, key: bytes, episode_id: str) -> None:
        await self.batch(self._link, keys=[self.key(key)], args=[episode_id, self._ttl_ms])

    async def lookup(self, key: bytes) -> ChainLink | None:
        value = await self.client.getex(self.key(key), px=self._ttl_ms)
        if value is None:
            return None
        if isinstance(value, str):
            value = value.encode()
        flag, _, episode_id = value.partition(b":")
        return ChainLink(episode_id.decode("utf-8", "surrogateescape"), flag == b"1")
