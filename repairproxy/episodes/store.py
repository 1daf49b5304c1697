"""Where episode budgets and conversation links live: in the process, or in Redis for many.

``open_stores(settings)`` picks from ``--episode-store``: ``memory`` keeps today's in-process LRU;
``redis://`` / ``rediss://`` URLs share one budget between every worker and replica, behind the
guard that keeps the proxy serving when Redis is away (``guard.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from repairproxy.episodes.budget import EpisodeStore
from repairproxy.episodes.chaining import ChainIndex
from repairproxy.episodes.memory_store import MemoryEpisodeStore
from repairproxy.episodes.responses_store import MemoryResponsesStore, ResponsesStore
from repairproxy.settings import Settings

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from repairproxy.episodes.guard import StoreHealth

__all__ = ["REDIS_SCHEMES", "Stores", "is_redis_url", "open_stores"]

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
# Seconds between counts of the episodes in Redis (a SCAN) for the active_episodes gauge.
COUNT_INTERVAL = 15.0


def is_redis_url(spec: str) -> bool:
    return spec.startswith(REDIS_SCHEMES)


class Stores:
    """The episode store and chain index an app uses, and how to count and close them.

    ``chains`` None: ``ErrorBudget`` builds its in-process index. ``count``: the store's size
    when it is cheap to ask (memory); a shared store is counted in the background instead.
    """

    def __init__(
        self,
        episodes: EpisodeStore,
        chains: ChainIndex | None = None,
        health: StoreHealth | None = None,
        *,
        count: Callable[[], int] | None = None,
        client: Redis | None = None,
        responses: ResponsesStore | None = None,
        log: Any = None,
        threads: ResponsesStore | None = None,
    ) -> None:
        self.episodes = episodes
        # Delivered Responses answers (responses_store.py); in the process unless given.
        # ``is None``, not ``or``: an empty memory store has ``len`` 0 and would be replaced by
        # one without the per-key shares.
        self.responses: ResponsesStore = (
            responses if responses is not None else MemoryResponsesStore(64 * 1024 * 1024)
        )
        # Anthropic message threads' delivered answers (asgi/threads.py); None: the proxy's own.
        self.threads = threads
        self.chains = chains
        self.health = health  # guard.StoreHealth for a shared store
        self._count = count
        self._client = client
        self._log = log  # the start-up warning about Redis's eviction policy
        self._counted = 0
        self._counter: asyncio.Task[None] | None = None

    def active_episodes(self) -> int:
        """Episodes held now (for Redis: the latest periodic count)."""
        return self._count() if self._count is not None else self._counted

    async def start(self) -> None:
        """Begin counting a shared store's episodes in the background (call inside the loop)."""
        if self._client is not None and self._counter is None:
            await self._check_eviction_policy(self._client)
            self._counter = asyncio.get_running_loop().create_task(self._count_forever())

    async def _check_eviction_policy(self, client: Redis) -> None:
        """Warn when Redis may evict keys that have a TTL or not (``allkeys-*``): an evicted
        episode comes back with a full budget, an evicted stored answer is a 404. Episode keys
        always carry a TTL, so ``noeviction`` (default) or a ``volatile-*`` policy keeps them
        until they idle out; managed Redis that refuses ``CONFIG GET`` is said once, not
        fatal."""
        if self._log is None:
            return
        try:
            found = await asyncio.wait_for(client.config_get("maxmemory-policy"), 2.0)
        except Exception as exc:  # managed Redis may refuse CONFIG: say so, start anyway
            self._log.info(
                "redis_eviction_policy_unknown",
                detail=f"CONFIG GET maxmemory-policy failed ({type(exc).__name__}); make sure "
                "the policy is noeviction or volatile-*, never allkeys-*",
            )
            return
        values = {
            (k.decode() if isinstance(k, bytes) else str(k)): (
                v.decode() if isinstance(v, bytes) else str(v)
            )
            for k, v in dict(found).items()
        }
        policy = values.get("maxmemory-policy", "")
        if policy.startswith("allkeys-"):
            self._log.warning(
                "redis_eviction_policy",
                policy=policy,
                detail="Redis may evict episode keys under memory pressure: an evicted episode "
                "restarts with a full error budget and an evicted stored answer is lost; set "
                "maxmemory-policy to noeviction or a volatile-* policy",
            )

    async def _count_forever(self) -> None:
        store: Any = getattr(self.episodes, "inner", self.episodes)
        count = store.count
        while True:
            with contextlib.suppress(Exception):  # Redis away: keep the last count
                async with asyncio.timeout(COUNT_INTERVAL):  # the client has no socket timeout
                    self._counted = await count()
            await asyncio.sleep(COUNT_INTERVAL)

    async def aclose(self) -> None:
        if self._counter is not None:
            self._counter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._counter
            self._counter = None
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()


def open_stores(
    settings: Settings,
    *,
    log: Any = None,
    count_error: Callable[[str], None] | None = None,
    count_eviction: Callable[[str], None] | None = None,
) -> Stores:
    """The stores ``settings.episode_store`` names; Redis ones wrapped in the guard.

    ``count_error(operation)`` is called for each store call that failed or was skipped
    (``repairproxy_store_errors_total``); ``count_eviction(reason)`` for each episode the
    memory store evicts (``repairproxy_episode_evictions_total``); ``log`` receives the outage
    and recovery lines.
    """
    spec = settings.episode_store
    if spec == "memory":
        keys = len(settings.api_keys)
        memory = MemoryEpisodeStore(
            settings.max_episodes,
            settings.episode_idle_ttl,
            max_bytes=settings.max_episode_memory,
            tenant_quota=settings.max_episode_memory // keys if keys > 1 else None,
            tenant_episodes=max(1, settings.max_episodes // keys) if keys > 1 else None,
            on_evict=count_eviction,
        )
        responses = MemoryResponsesStore(
            settings.max_responses_memory,
            settings.episode_idle_ttl,
            tenant_quota=settings.max_responses_memory // keys if keys > 1 else None,
        )
        threads = MemoryResponsesStore(
            settings.max_responses_memory,
            settings.episode_idle_ttl,
            tenant_quota=settings.max_responses_memory // keys if keys > 1 else None,
        )
        return Stores(memory, count=memory.__len__, responses=responses, threads=threads)
    if not is_redis_url(spec):
        raise ValueError(
            f"--episode-store must be memory or a redis://, rediss:// or unix:// URL, not {spec!r}"
        )
    from repairproxy.episodes.guard import GuardedChainIndex, GuardedEpisodeStore, StoreHealth
    from repairproxy.episodes.redis_store import (
        RedisChainIndex,
        RedisEpisodeStore,
        ScriptBatch,
        redis_client,
    )
    from repairproxy.episodes.responses_store import GuardedResponsesStore, RedisResponsesStore

    client = redis_client(spec, max_connections=max(settings.max_connections, 16), guarded=True)
    health = StoreHealth(
        log=log,
        count_error=count_error or (lambda operation: None),
        timeout=settings.store_timeout,
    )
    ttl = settings.episode_idle_ttl
    keys = len(settings.api_keys)
    # One batch for every store on the client: what a request asks of several stores at once
    # (its stored record and its episode; the new record, its link and the episode's write) is
    # one round trip.
    batch = ScriptBatch(client)
    return Stores(
        GuardedEpisodeStore(RedisEpisodeStore(client, ttl, batch=batch), health),
        GuardedChainIndex(RedisChainIndex(client, ttl, batch=batch), health),
        health,
        client=client,
        log=log,
        responses=GuardedResponsesStore(
            RedisResponsesStore(
                client,
                ttl,
                max_record_bytes=settings.max_responses_memory,
                tenant_quota=settings.max_responses_memory // keys if keys > 1 else None,
                batch=batch,
            ),
            health,
        ),
        threads=GuardedResponsesStore(
            RedisResponsesStore(
                client,
                ttl,
                max_record_bytes=settings.max_responses_memory,
                tenant_quota=settings.max_responses_memory // keys if keys > 1 else None,
                prefix="repairproxy:threads:",
                batch=batch,
            ),
            health,
        ),
    )
