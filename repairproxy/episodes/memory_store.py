"""The in-process episode store: each tenant's LRU of episode states, bounded in count, bytes and
idle time, with tombstones so an evicted episode that had spent anything never comes back with a
full budget. ``redis_store.py`` is the same protocol shared between processes.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from repairproxy.episodes.budget import EpisodeState

__all__ = ["MemoryEpisodeStore"]

T = TypeVar("T")


class MemoryEpisodeStore:
    """In-process store: LRU bounded at ``max_episodes`` and at ``max_bytes`` (estimated), entries
    idle longer than the TTL dropped.

    Each tenant (the part of a key before ``/``) has its own LRU, at most ``tenant_quota``
    bytes and at most ``tenant_episodes`` episodes (the proxy sets both to its bound / the number
    of client keys), so one tenant's churn evicts only its own episodes; past ``max_bytes`` or
    ``max_episodes`` the largest tenant gives way. An evicted episode that had spent anything
    leaves a tombstone (its counts only, a few dozen bytes) in its own tenant's list, at most
    ``tenant_episodes`` (else ``max_episodes``) per tenant: seen again, it comes back with those
    counts, never with a full budget, and no tenant's evictions push out another's tombstones.
    ``on_evict(reason)`` is told of each eviction (``memory``, ``tenant_quota``, ``count``).

    ``update`` runs ``mutate`` without awaiting anything, so on one event loop it is atomic
    without a lock.
    """

    def __init__(
        self,
        max_episodes: int = 100_000,
        idle_ttl_seconds: float = 3600.0,
        *,
        max_bytes: int | None = None,
        tenant_quota: int | None = None,
        tenant_episodes: int | None = None,
        on_evict: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_episodes < 1:
            raise ValueError("max_episodes must be at least 1")
        if (max_bytes is not None and max_bytes < 1) or (
            tenant_quota is not None and tenant_quota < 1
        ):
            raise ValueError("max_bytes and tenant_quota must be at least 1")
        if tenant_episodes is not None and tenant_episodes < 1:
            raise ValueError("tenant_episodes must be at least 1")
        self.max_episodes = max_episodes
        self.idle_ttl_seconds = idle_ttl_seconds
        self.max_bytes = max_bytes
        self.tenant_quota = tenant_quota
        self.tenant_episodes = tenant_episodes
        self.evictions = 0
        self._on_evict = on_evict
        self._clock = clock
        # Per tenant, least recently used first: key -> (last touched, state, estimated bytes).
        self._tenants: dict[str, OrderedDict[str, tuple[float, EpisodeState, int]]] = {}
        self._tenant_bytes: dict[str, int] = {}
        self._count = 0
        self._bytes = 0
        # Per tenant, evicted episodes that had spent something: key -> (charged, silent).
        self._tombstones: dict[str, OrderedDict[str, tuple[dict[str, int], dict[str, int]]]] = {}

    def __len__(self) -> int:
        return self._count

    @property
    def bytes_used(self) -> int:
        return self._bytes

    async def update(self, episode_id: str, mutate: Callable[[EpisodeState], T]) -> T:
        # On every request: the accounting of _account is written out here (one call less).
        now = self._clock()
        self._expire(now)
        tenant, slash, _ = episode_id.partition("/")
        if not slash:
            tenant = ""
        lru = self._tenants.get(tenant)
        if lru is None:
            lru = self._tenants[tenant] = OrderedDict()
        entry = lru.pop(episode_id, None)
        if entry is not None:
            state, old_size, count = entry[1], entry[2], 0
        else:
            revived = self._revived(episode_id) if self._tombstones else None
            state, old_size, count = revived or EpisodeState(), 0, 1
        result = mutate(state)
        size = _estimated_bytes(episode_id, state)
        lru[episode_id] = (now, state, size)
        self._bytes += size - old_size
        self._count += count
        tenant_bytes = self._tenant_bytes
        tenant_bytes[tenant] = tenant_bytes.get(tenant, 0) + size - old_size
        if (
            self._count > self.max_episodes
            or self.tenant_quota is not None
            or (self.tenant_episodes is not None and len(lru) > self.tenant_episodes)
            or (self.max_bytes is not None and self._bytes > self.max_bytes)
        ):
            self._shrink(tenant, episode_id)
        return result

    async def get(self, episode_id: str) -> EpisodeState | None:
        self._expire(self._clock())
        lru = self._tenants.get(_tenant_of_key(episode_id))
        entry = lru.get(episode_id) if lru is not None else None
        if entry is not None:
            return entry[1]
        tombs = self._tombstones.get(_tenant_of_key(episode_id))
        tomb = tombs.get(episode_id) if tombs is not None else None
        if tomb is None:
            return None
        return EpisodeState(by_channel=dict(tomb[0]), silent_by_channel=dict(tomb[1]))

    def _revived(self, episode_id: str) -> EpisodeState | None:
        tenant = _tenant_of_key(episode_id)
        tombs = self._tombstones.get(tenant)
        tomb = tombs.pop(episode_id, None) if tombs is not None else None
        if tomb is None:
            return None
        if not tombs:
            del self._tombstones[tenant]
        return EpisodeState(by_channel=dict(tomb[0]), silent_by_channel=dict(tomb[1]))

    def _account(self, tenant: str, size: int, count: int) -> None:
        self._bytes += size
        self._count += count
        self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + size

    def _shrink(self, tenant: str, keep: str) -> None:
        """Evict until every bound holds; never the entry just written."""
        quota = self.tenant_quota
        while quota is not None and self._tenant_bytes.get(tenant, 0) > quota:
            if not self._evict_oldest(tenant, keep, "tenant_quota"):
                break
        share = self.tenant_episodes
        while share is not None and len(self._tenants.get(tenant, ())) > share:
            if not self._evict_oldest(tenant, keep, "tenant_quota"):
                break
        while self._count > self.max_episodes or (
            self.max_bytes is not None and self._bytes > self.max_bytes
        ):
            reason = "count" if self._count > self.max_episodes else "memory"
            largest = max(self._tenant_bytes, key=lambda t: self._tenant_bytes[t])
            if not self._evict_oldest(largest, keep, reason) and not any(
                self._evict_oldest(t, keep, reason) for t in list(self._tenants)
            ):
                break

    def _evict_oldest(self, tenant: str, keep: str, reason: str) -> bool:
        lru = self._tenants.get(tenant)
        if not lru:
            return False
        key = next(iter(lru))
        if key == keep:
            if len(lru) == 1:
                return False
            lru.move_to_end(key)  # the newest stays; the next oldest goes
            key = next(iter(lru))
        _, state, size = lru.pop(key)
        self._account(tenant, -size, -1)
        self._drop_empty(tenant)
        if state.by_channel or state.silent_by_channel:
            tombs = self._tombstones.get(tenant)
            if tombs is None:
                tombs = self._tombstones[tenant] = OrderedDict()
            tombs[key] = (dict(state.by_channel), dict(state.silent_by_channel))
            limit = self.tenant_episodes or self.max_episodes
            while len(tombs) > limit:  # this tenant's oldest only
                tombs.popitem(last=False)
        self.evictions += 1
        if self._on_evict is not None:
            self._on_evict(reason)
        return True

    def _drop_empty(self, tenant: str) -> None:
        if not self._tenants.get(tenant, True):
            del self._tenants[tenant]
            self._tenant_bytes.pop(tenant, None)

    def _expire(self, now: float) -> None:
        # Entries are ordered by last use, so the expired ones are at the front of each tenant's.
        deadline = now - self.idle_ttl_seconds
        for tenant in list(self._tenants):
            lru = self._tenants[tenant]
            while lru:
                touched, _, size = next(iter(lru.values()))
                if touched > deadline:
                    break
                lru.popitem(last=False)
                self._account(tenant, -size, -1)
            self._drop_empty(tenant)


# Estimated bytes of one kept entry: the state object and its dicts, plus per remembered key.
_ENTRY_BYTES = 1024
_KEY_BYTES = 160


def _estimated_bytes(key: str, state: EpisodeState) -> int:
    """A constant-time estimate (dict sizes, not a walk over them) of what an entry holds."""
    keys = (
        len(state.seen)
        + len(state.pending)
        + len(state.result_counts)
        + len(state.by_channel)
        + len(state.silent_by_channel)
    )
    return _ENTRY_BYTES + len(key) + _KEY_BYTES * keys


def _tenant_of_key(key: str) -> str:
    tenant, slash, _ = key.partition("/")
    return tenant if slash else ""
