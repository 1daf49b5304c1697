"""Episodes: who a request belongs to, and how much of its error budget is spent.

Counting follows τ²-bench: one unit per failed tool call. Failures show up in two places, and the
same failure must not be counted twice:

* in the model's answer, as invalid calls the proxy caught (``observe_answer``): counted even when
  repaired, because that is what they would have cost without the proxy;
* in later requests, as ``role: tool`` results whose content reports an error (``observe_request``),
  classified by a table. Agents resend the whole history on every turn, so each result is counted
  once, keyed by its ``tool_call_id`` and a hash of its content.

When an invalid call the proxy already counted reaches the client anyway (repair off, or exhausted
with ``pass``), its id is remembered as *pre-counted*: the first error result carrying that id is
absorbed instead of counted again (only once, so an upstream that reuses ids cannot hide errors).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import orjson

__all__ = [
    "DEFAULT_ENV_ERROR_TABLE",
    "BudgetSnapshot",
    "EpisodeState",
    "EpisodeStore",
    "ErrorBudget",
    "MemoryEpisodeStore",
    "episode_id_for",
]

T = TypeVar("T")

# Client-chosen episode ids longer than this are hashed: ids live in memory and in log lines.
MAX_EPISODE_ID_CHARS = 128
# Per-episode memory of observed error results; the oldest keys go first beyond this.
MAX_SEEN_RESULTS = 1024
# Error texts whose label is remembered (cleared when full).
MAX_REMEMBERED_LABELS = 4096

# (label, pattern) in order, first match wins; content that matches none is env_other_error.
# Messages as τ²-bench's environment writes them: f"Error: {exception}".
DEFAULT_ENV_ERROR_TABLE: tuple[tuple[str, str], ...] = (
    ("env_unknown_tool", r"Tool '[^']*' not found"),
    (
        "env_argument_error",
        r"unexpected keyword argument|missing \d+ required|required (positional|keyword)"
        r"|positional arguments? but|validation errors? for",
    ),
    ("env_entity_not_found", r"not found"),
)
ENV_OTHER_ERROR = "env_other_error"


def episode_id_for(
    headers: Mapping[str, str], body: Mapping[str, Any], header_name: str = "x-episode-id"
) -> str:
    """The episode of a request: the header when given, else a fingerprint of its opening.

    The fingerprint hashes (model, system prompt, first user message): stable across the turns of
    one conversation. Two runs of the same task with the same opening share it; send the header.
    """
    value = headers.get(header_name)
    if value is None:
        wanted = header_name.lower()
        value = next((v for k, v in headers.items() if k.lower() == wanted), None)
    if value:
        value = value.strip()
        if len(value) <= MAX_EPISODE_ID_CHARS:
            return value
        return "h-" + hashlib.blake2b(value.encode(), digest_size=16).hexdigest()
    system: Any = None
    first_user: Any = None
    for message in body.get("messages") or ():
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if system is None and role in ("system", "developer"):
            system = message.get("content")
        elif role == "user":
            first_user = message.get("content")
            break
    try:
        opening = orjson.dumps([body.get("model"), system, first_user], option=orjson.OPT_SORT_KEYS)
    except TypeError:
        opening = repr((body.get("model"), system, first_user)).encode()
    return "fp-" + hashlib.blake2b(opening, digest_size=12).hexdigest()


@dataclass(frozen=True, slots=True)
class BudgetSnapshot:
    episode_id: str
    errors: int
    budget: int
    by_channel: Mapping[str, int]

    @property
    def remaining(self) -> int:
        return max(self.budget - self.errors, 0)

    @property
    def exhausted(self) -> bool:
        # τ²-bench ends the episode once num_errors >= max_errors.
        return self.errors >= self.budget


@dataclass(slots=True)
class EpisodeState:
    """What the store keeps per episode; plain types only, so a shared store can serialise it."""

    by_channel: dict[str, int] = field(default_factory=dict)
    seen: dict[str, None] = field(default_factory=dict)  # insertion-ordered set of result keys
    precounted: dict[str, None] = field(default_factory=dict)  # counted calls the client received

    @property
    def errors(self) -> int:
        return sum(self.by_channel.values())

    def count(self, label: str) -> None:
        self.by_channel[label] = self.by_channel.get(label, 0) + 1

    def observe_result(self, key: str, call_id: str | None, label: str) -> None:
        if key in self.seen:
            return
        self.seen[key] = None
        if len(self.seen) > MAX_SEEN_RESULTS:
            del self.seen[next(iter(self.seen))]
        if call_id is not None and call_id in self.precounted:
            del self.precounted[call_id]
            return
        self.count(label)

    def precount(self, call_ids: Iterable[str]) -> None:
        for call_id in call_ids:
            self.precounted[call_id] = None
        while len(self.precounted) > MAX_SEEN_RESULTS:
            del self.precounted[next(iter(self.precounted))]


class EpisodeStore(Protocol):
    """Where episodes live. ``update`` must apply ``mutate`` atomically per episode (a shared store
    would do it as a transaction: load, mutate, compare-and-set)."""

    async def update(self, episode_id: str, mutate: Callable[[EpisodeState], T]) -> T: ...

    async def get(self, episode_id: str) -> EpisodeState | None: ...


class MemoryEpisodeStore:
    """In-process store: LRU bounded at ``max_episodes``, entries idle longer than the TTL dropped.

    ``update`` runs ``mutate`` without awaiting anything, so on one event loop it is atomic
    without a lock.
    """

    def __init__(
        self,
        max_episodes: int = 100_000,
        idle_ttl_seconds: float = 3600.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_episodes < 1:
            raise ValueError("max_episodes must be at least 1")
        self.max_episodes = max_episodes
        self.idle_ttl_seconds = idle_ttl_seconds
        self._clock = clock
        # Least recently used first; each entry remembers when it was last touched.
        self._episodes: OrderedDict[str, tuple[float, EpisodeState]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._episodes)

    async def update(self, episode_id: str, mutate: Callable[[EpisodeState], T]) -> T:
        now = self._clock()
        self._expire(now)
        entry = self._episodes.pop(episode_id, None)
        state = entry[1] if entry is not None else EpisodeState()
        self._episodes[episode_id] = (now, state)
        if len(self._episodes) > self.max_episodes:
            self._episodes.popitem(last=False)
        return mutate(state)

    async def get(self, episode_id: str) -> EpisodeState | None:
        self._expire(self._clock())
        entry = self._episodes.get(episode_id)
        return entry[1] if entry is not None else None

    def _expire(self, now: float) -> None:
        # Entries are ordered by last use, so the expired ones are all at the front.
        deadline = now - self.idle_ttl_seconds
        while self._episodes:
            touched, _ = next(iter(self._episodes.values()))
            if touched > deadline:
                break
            self._episodes.popitem(last=False)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return "" if content is None else str(content)


class ErrorBudget:
    """The accountant the routes call: counts failures per episode against a budget K."""

    def __init__(
        self,
        store: EpisodeStore,
        default_budget: int = 10,
        tool_error_pattern: str = r"^Error",
        classifier: Sequence[tuple[str, str]] = DEFAULT_ENV_ERROR_TABLE,
    ) -> None:
        if default_budget < 0:
            raise ValueError("default_budget must be >= 0")
        self.store = store
        self.default_budget = default_budget
        self._is_error = re.compile(tool_error_pattern)
        self._classes = tuple((label, re.compile(pattern)) for label, pattern in classifier)
        # The same error texts come back on every turn (histories are resent): remember labels.
        self._labels: dict[str, str] = {}

    def classify(self, content: str) -> str:
        """The env_* label of an error tool result."""
        label = self._labels.get(content)
        if label is None:
            label = next(
                (label for label, pattern in self._classes if pattern.search(content)),
                ENV_OTHER_ERROR,
            )
            if len(self._labels) >= MAX_REMEMBERED_LABELS:
                self._labels.clear()
            self._labels[content] = label
        return label

    def tool_errors(self, body: Mapping[str, Any]) -> list[tuple[str, str | None, str]]:
        """(dedupe key, tool_call_id, label) per tool result in ``body`` that reports an error."""
        # Runs on every request over the whole resent history: keep the per-message path short.
        found = []
        is_error = self._is_error.search
        for position, message in enumerate(body.get("messages") or ()):
            if type(message) is not dict and not isinstance(message, Mapping):
                continue
            role = message.get("role")
            if role != "tool" and role != "function":
                continue
            content = message.get("content")
            if type(content) is not str:
                content = _text(content)
            if not is_error(content):
                continue
            call_id = message.get("tool_call_id")
            call_id = call_id if isinstance(call_id, str) and call_id else None
            # Without an id, the position identifies the result: histories only grow.
            ident = call_id if call_id is not None else f"#{position}:{message.get('name')}"
            digest = hashlib.blake2b(content.encode(), digest_size=8).hexdigest()
            found.append((f"{ident}:{digest}", call_id, self.classify(content)))
        return found

    async def observe_request(
        self, episode_id: str, body: Mapping[str, Any], budget: int | None = None
    ) -> BudgetSnapshot:
        """Count the error tool results in a request's history that were not counted before."""
        errors = self.tool_errors(body)

        def apply(state: EpisodeState) -> BudgetSnapshot:
            for key, call_id, label in errors:
                state.observe_result(key, call_id, label)
            return self._snapshot(episode_id, state, budget)

        return await self.store.update(episode_id, apply)

    async def observe_answer(
        self,
        episode_id: str,
        channels: Sequence[Any],
        budget: int | None = None,
        *,
        delivered_call_ids: Iterable[str | None] = (),
    ) -> BudgetSnapshot:
        """Count each non-valid channel caught in the model's first answer.

        ``delivered_call_ids``: ids of invalid calls that reached the client (repair off, or
        exhausted with ``pass``); their error results in later requests are not counted again.
        """
        labels = [str(channel) for channel in channels if str(channel) != "valid"]
        ids = [call_id for call_id in delivered_call_ids if call_id]

        def apply(state: EpisodeState) -> BudgetSnapshot:
            for label in labels:
                state.count(label)
            state.precount(ids)
            return self._snapshot(episode_id, state, budget)

        return await self.store.update(episode_id, apply)

    async def snapshot(self, episode_id: str, budget: int | None = None) -> BudgetSnapshot:
        state = await self.store.get(episode_id)
        return self._snapshot(episode_id, state or EpisodeState(), budget)

    def _snapshot(self, episode_id: str, state: EpisodeState, budget: int | None) -> BudgetSnapshot:
        return BudgetSnapshot(
            episode_id,
            state.errors,
            self.default_budget if budget is None else budget,
            dict(state.by_channel),
        )
