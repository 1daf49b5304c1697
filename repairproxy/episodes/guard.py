"""A shared store that may fail must never fail a request: the guard turns its errors into an
unknown budget.

``GuardedEpisodeStore`` and ``GuardedChainIndex`` wrap a Redis store and index. When a call
fails (Redis down, a timeout, a compare-and-set race lost too often, an unreadable key) the
request goes on without it: an update runs on a blank state and its snapshot is marked
``unknown`` (the header says ``X-Repairproxy-Budget-Remaining: unknown``,
``--on-budget-exhausted reject`` lets the request through, no ladder rung is counted), a lookup
finds nothing. ``StoreHealth`` counts every such
call (``repairproxy_store_errors_total``), logs one line when the store goes away and one when it
is back, and skips the store for a while after a failure (``retry_after`` seconds, doubling while
it keeps failing, up to ``max_retry_after``), so a dead host costs one connect timeout per
interval instead of one per request. It tries again by itself. Each call is cut at ``timeout``
(``--store-timeout``, 250 ms): a Redis that accepts and never answers costs a request that long,
counted as an error of the operation like any other failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from redis.exceptions import RedisError

from repairproxy.episodes.budget import (
    BudgetSnapshot,
    EpisodeState,
    EpisodeStore,
    Reading,
    SharedEpisodeStore,
)
from repairproxy.episodes.chaining import ChainIndex, ChainLink
from repairproxy.episodes.redis_store import StoreConflictError, StoreDataError

__all__ = ["STORE_ERRORS", "GuardedChainIndex", "GuardedEpisodeStore", "StoreHealth"]

T = TypeVar("T")

# What a store call may raise that means "no store now" (anything else is a bug and propagates).
STORE_ERRORS: tuple[type[BaseException], ...] = (
    RedisError,
    OSError,
    TimeoutError,
    StoreConflictError,
    StoreDataError,
)


class _Skipped(Exception):
    """The store failed a moment ago: not tried again yet."""


class _Failed:
    """The marker ``StoreHealth.attempt`` returns when the store did not answer."""


FAILED = _Failed()


class StoreHealth:
    """Whether the shared store answers; counts and logs the calls that went without it."""

    def __init__(
        self,
        *,
        retry_after: float = 1.0,
        max_retry_after: float = 8.0,
        timeout: float = 0.25,
        count_error: Callable[[str], None] = lambda operation: None,
        log: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.retry_after = retry_after
        self.max_retry_after = max_retry_after
        self.timeout = timeout
        self._rest = retry_after
        self._count_error = count_error
        self._log = log
        self._clock = clock
        self._down_until = 0.0
        self.down = False
        self.errors = 0
        self.timeouts = 0  # calls cut at ``timeout`` (also counted in ``errors``)

    def check(self) -> None:
        """Raise ``_Skipped`` while the store is resting after a failure."""
        if self.down and self._clock() < self._down_until:
            raise _Skipped

    def failed(self, operation: str, exc: BaseException | None) -> None:
        self.errors += 1
        self._count_error(operation)
        if exc is None:
            return  # skipped while down: already logged
        if self.down:
            self._rest = min(self._rest * 2, self.max_retry_after)
        self._down_until = self._clock() + self._rest
        if not self.down:
            self.down = True
            if self._log is not None:
                self._log.warning(
                    "episode store unavailable",
                    operation=operation,
                    error=f"{type(exc).__name__}: {exc}",
                    effect="budgets unknown and not enforced until it answers again",
                )

    def succeeded(self) -> None:
        if self.down:
            self.down = False
            self._rest = self.retry_after
            if self._log is not None:
                self._log.warning("episode store available again")

    async def attempt(self, operation: str, call: Callable[[], Awaitable[T]]) -> T | _Failed:
        """``call()``'s result, or ``FAILED`` (counted and logged) when the store is away."""
        try:
            self.check()
            # A hung store (accepts, never answers) must cost a request this long at most.
            async with asyncio.timeout(self.timeout):
                result = await call()
        except _Skipped:
            self.failed(operation, None)
            return FAILED
        except STORE_ERRORS as exc:
            if isinstance(exc, TimeoutError):
                self.timeouts += 1
            self.failed(operation, exc)
            return FAILED
        self.succeeded()
        return result


def _unknown(result: T) -> T:
    """A snapshot computed on a blank state: counted nothing that can be trusted."""
    if isinstance(result, BudgetSnapshot):
        return cast(T, dataclasses.replace(result, errors_before=result.errors, unknown=True))
    return result


class GuardedEpisodeStore:
    """An ``EpisodeStore`` whose failures degrade to an unknown budget, never to an error."""

    def __init__(self, inner: EpisodeStore, health: StoreHealth) -> None:
        self.inner = inner
        self.health = health
        self.idle_ttl_seconds: float = getattr(inner, "idle_ttl_seconds", 3600.0)

    async def update(self, episode_id: str, mutate: Callable[[EpisodeState], T]) -> T:
        result = await self.health.attempt("update", lambda: self.inner.update(episode_id, mutate))
        return _unknown(mutate(EpisodeState())) if isinstance(result, _Failed) else result

    async def get(self, episode_id: str) -> EpisodeState | None:
        state = await self.health.attempt("get", lambda: self.inner.get(episode_id))
        # Unknown, not absent: an episode is not counted as started again while Redis is away.
        return EpisodeState() if isinstance(state, _Failed) else state

    async def read(self, episode_id: str, *, claim: bool = True) -> Reading:
        """The shared store's reading; an unknown one (blank, never written back) when away."""
        inner = cast(SharedEpisodeStore, self.inner)
        reading = await self.health.attempt("get", lambda: inner.read(episode_id, claim=claim))
        return Reading(EpisodeState(), unknown=True) if isinstance(reading, _Failed) else reading

    async def write(
        self, episode_id: str, reading: Reading, mutate: Callable[[EpisodeState], T]
    ) -> T | None:
        """The write after the upstream call; None when the store did not take it."""
        inner = cast(SharedEpisodeStore, self.inner)
        result = await self.health.attempt(
            "update", lambda: inner.write(episode_id, reading, mutate)
        )
        return None if isinstance(result, _Failed) else result


class GuardedChainIndex:
    """A ``ChainIndex`` whose failures lose a link (the next request starts an episode)."""

    def __init__(self, inner: ChainIndex, health: StoreHealth) -> None:
        self.inner = inner
        self.health = health

    async def link(self, key: bytes, episode_id: str) -> None:
        await self.health.attempt("link", lambda: self.inner.link(key, episode_id))

    async def lookup(self, key: bytes) -> ChainLink | None:
        link = await self.health.attempt("lookup", lambda: self.inner.lookup(key))
        return None if isinstance(link, _Failed) else link
