"""Episodes: which one a request belongs to, and how much of its error budget is spent.

Counting follows τ²-bench: one unit per tool call its environment fails. The budget charges what
τ²-bench would have charged had each answer been delivered as it came:

* ``unknown_tool`` and ``schema_violation`` calls in the model's first answer (``observe_answer``),
  even when repaired: τ²-bench would have executed them and the environment would have failed them;
* error results in later requests (``role: tool``/``function``; ``observe_request``), recognised
  and labelled by ``tool_errors``. Agents resend the whole history, so each result counts once.

``tool_call_in_content``, ``invalid_json`` and ``empty_output`` are never charged (τ²-bench reads
the first as a message and ends the episode on the others as an infrastructure error); they are
kept apart as silent failures (``BudgetSnapshot.silent_by_channel``) for headers, logs and metrics.

A result is identified by (its ``tool_call_id``, which occurrence of that id it is in the history),
so upstreams that reuse ids (``"0"``, the same id twice in one answer) still count every error;
results without an id (legacy ``role: function`` ones included) share one positional bucket. When
a charged call reaches the client anyway (repair off, or exhausted with ``pass``), the position
its result will take is remembered, and that one result is absorbed instead of counted again. An
answer thus costs max(its first version's charges, its delivered calls' environment errors).

Episode identity (``resolve_episode``): the episode header when sent, else conversation chaining
(``chaining``). Everything kept per episode is bounded by the constants below, never by clients.

Tenancy: with client keys, every episode belongs to the tenant of the key that sent it, an HMAC of
the key under a per-deployment secret (``TenantKeys``), so two clients naming the same episode id,
or sending the same conversation, never share a budget. The store key of an episode is
``<tenant>/<id>`` (``EpisodeRef.key``); the key itself is never kept nor logged. Conversation links
are scoped to the tenant and the model. Without client keys there is one tenant, ``""``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from repairproxy.episodes.chaining import (
    CanonicalCache,
    ChainIndex,
    ConversationKeys,
    MemoryChainIndex,
    conversation_keys,
)
from repairproxy.episodes.keys import (
    TenantKeys,
    bounded,
    episode_id_for,
    header_episode_id,
    scoped,
)
from repairproxy.episodes.tool_errors import (
    DEFAULT_ENV_ERROR_TABLE,
    DEFAULT_TOOL_ERROR_PATTERN,
    ENV_OTHER_ERROR,
    ErrorClassifier,
    ToolErrorDetector,
    scanned_text,
)
from repairproxy.validation import CallVerdict, Channel, MessageVerdict
from repairproxy.wire.openai import content_text

__all__ = [
    "CHARGED_CHANNELS",
    "DEFAULT_ENV_ERROR_TABLE",
    "ENV_OTHER_ERROR",
    "NO_HEADER_WARNING",
    "SILENT_CHANNELS",
    "BudgetSnapshot",
    "EpisodeRef",
    "EpisodeState",
    "EpisodeStore",
    "ErrorBudget",
    "Reading",
    "SharedEpisodeStore",
    "TenantKeys",
    "Transaction",
    "episode_id_for",
]

T = TypeVar("T")

# Channels of the first answer that cost one unit each, and those that are only reported.
CHARGED_CHANNELS = frozenset({Channel.UNKNOWN_TOOL, Channel.SCHEMA_VIOLATION})
SILENT_CHANNELS = frozenset(
    {
        Channel.TOOL_CALL_IN_CONTENT,
        Channel.INVALID_JSON,
        Channel.EMPTY_OUTPUT,
        Channel.REQUEST_CONFLICT,
    }
)

# Client-chosen tool_call ids longer than this are hashed before they are kept.
MAX_CALL_ID_CHARS = 64
# Per episode: result keys remembered (oldest dropped first beyond this; far above any budget).
MAX_SEEN_RESULTS = 1024
# Per episode: positions of delivered charged calls whose result is still to come.
MAX_PENDING_RESULTS = 256
# Per episode: call ids whose result count in the latest history is kept (most recent ones).
MAX_TRACKED_CALL_IDS = 512
# Conversation links kept per episode the store can hold (the latest answer, and one before it
# for a client that retries a request).
LINKS_PER_EPISODE = 2

NO_HEADER_WARNING = (
    "requests arrive without an episode header: episodes are told apart by conversation "
    "chaining (identical concurrent runs cannot be told apart until their histories differ); "
    "send the header for exact per-episode budgets and for --on-budget-exhausted reject"
)


@dataclass(slots=True)  # per request; frozen=True would cost an object.__setattr__ a field
class EpisodeRef:
    """The episode of one request.

    ``explicit``: named by the client's header (only those may be rejected when spent);
    ``new``: nothing was counted for it before; ``conversation``: the digests of the request's
    history, so ``remember_answer(ref, ...)`` need not hash the history again;
    ``warn_missing_header``: true on the first header-less request this process sees.
    """

    id: str
    _: KW_ONLY
    explicit: bool
    new: bool
    conversation: ConversationKeys | None = None
    warn_missing_header: bool = False
    tenant: str = ""  # TenantKeys.tenant_of the request; "" without client keys
    txn: Transaction | None = None  # a shared store's read, written once after the upstream

    @property
    def key(self) -> str:
        """Where the store keeps this episode: the id, under its tenant."""
        return scoped(self.tenant, self.id)


@dataclass(slots=True)  # per request; frozen=True would cost an object.__setattr__ a field
class BudgetSnapshot:
    """An episode's count after one observation.

    ``errors_before``: the count before it (defaults to ``errors``); ``new_env_errors``: labels
    of the error results this request added; ``new_silent``: the silent failures of this answer.
    """

    episode_id: str
    errors: int
    budget: int
    by_channel: Mapping[str, int]
    silent_by_channel: Mapping[str, int] = field(default_factory=dict)
    errors_before: int = -1
    new_env_errors: tuple[str, ...] = ()
    new_silent: tuple[str, ...] = ()
    unknown: bool = False  # the shared store did not answer: counts untrusted, never enforced

    def __post_init__(self) -> None:
        if self.errors_before < 0:
            self.errors_before = self.errors

    @property
    def remaining(self) -> int:
        return max(self.budget - self.errors, 0)

    @property
    def exhausted(self) -> bool:
        # τ²-bench ends the episode once num_errors >= max_errors.
        return not self.unknown and self.errors >= self.budget


@dataclass(slots=True)
class EpisodeState:
    """What the store keeps per episode; plain types only, so a shared store can serialise it."""

    by_channel: dict[str, int] = field(default_factory=dict)  # charged, per label
    silent_by_channel: dict[str, int] = field(default_factory=dict)  # never charged
    seen: dict[str, None] = field(default_factory=dict)  # ordered set of counted result keys
    pending: dict[str, None] = field(default_factory=dict)  # result positions already charged
    result_counts: dict[str, int] = field(default_factory=dict)  # results per call id, latest

    @property
    def errors(self) -> int:
        return sum(self.by_channel.values())

    def count(self, label: str) -> None:
        self.by_channel[label] = self.by_channel.get(label, 0) + 1

    def count_silent(self, label: str) -> None:
        self.silent_by_channel[label] = self.silent_by_channel.get(label, 0) + 1

    def first_sight(self, key: str) -> bool:
        """Remember a result key; False when it was seen before."""
        if key in self.seen:
            return False
        self.seen[key] = None
        if len(self.seen) > MAX_SEEN_RESULTS:
            del self.seen[next(iter(self.seen))]
        return True

    def expect(self, position: str) -> None:
        """A charged call was delivered: its result at ``position`` is absorbed once."""
        self.pending[position] = None
        while len(self.pending) > MAX_PENDING_RESULTS:
            del self.pending[next(iter(self.pending))]

    def copy_from(self, other: EpisodeState) -> None:
        self.by_channel = dict(other.by_channel)
        self.silent_by_channel = dict(other.silent_by_channel)
        self.seen = dict(other.seen)
        self.pending = dict(other.pending)
        self.result_counts = dict(other.result_counts)


class EpisodeStore(Protocol):
    """Where episodes live. ``update`` must apply ``mutate`` atomically per episode (a shared store
    would do it as a transaction: load, mutate, compare-and-set)."""

    async def update(self, episode_id: str, mutate: Callable[[EpisodeState], T]) -> T: ...

    async def get(self, episode_id: str) -> EpisodeState | None: ...


@dataclass(slots=True)
class Reading:
    """One read of a shared store's episode: its state, and what a later write compares against.

    ``absent``: the read found nothing (and claimed the episode: one reader hears it);
    ``unknown``: the store did not answer (a blank state, never written back).
    """

    state: EpisodeState
    version: Any = None
    absent: bool = False
    unknown: bool = False


@runtime_checkable
class SharedEpisodeStore(EpisodeStore, Protocol):
    """A store across processes, where each round trip counts: ``read`` before the upstream call
    (claiming an absent episode), ``write`` after it (compare-and-set against the reading; on a
    lost race ``mutate`` runs again on what the winner wrote). The counting rules stay in the
    mutations (Python); the store only compares and sets."""

    async def read(self, episode_id: str, *, claim: bool = True) -> Reading: ...

    async def write(
        self, episode_id: str, reading: Reading, mutate: Callable[[EpisodeState], T]
    ) -> T | None: ...


@dataclass(slots=True)
class Transaction:
    """A request's episode on a shared store: read once before the upstream call, its mutations
    (the request's results, the answer's charge) applied here as they come and written together
    once after it (``ErrorBudget.settle``). ``request`` / ``answer``: their snapshots, as
    computed, then as the store took them."""

    reading: Reading
    working: EpisodeState
    # ("request" | "answer", the mutation), in the order they came.
    mutations: list[tuple[str, Callable[[EpisodeState], BudgetSnapshot]]] = field(
        default_factory=list
    )
    request: BudgetSnapshot | None = None
    answer: BudgetSnapshot | None = None
    settled: bool = False

    @classmethod
    def of(cls, reading: Reading) -> Transaction:
        working = EpisodeState()
        working.copy_from(reading.state)
        return cls(reading, working)

    def changed(self) -> bool:
        """Whether the mutations changed what the store keeps. ``result_counts`` alone is not a
        change: it is read only by the answer of the request that set it, which is replayed
        with it (the common request, a new successful result, then writes nothing)."""
        base, now = self.reading.state, self.working
        return (
            now.by_channel != base.by_channel
            or now.silent_by_channel != base.silent_by_channel
            or list(now.seen) != list(base.seen)
            or list(now.pending) != list(base.pending)
        )


def _text(content: Any) -> str:
    """A result's text as ``wire.content_text`` reads it; any other value as its ``str()`` (a
    client that sends a result as an object still carries its error text)."""
    if content is None or isinstance(content, str | list):
        return content_text(content)
    return str(content)


def _call_key(call_id: Any) -> str:
    """The kept form of a client-chosen tool_call id; ``""`` for results without one."""
    if not isinstance(call_id, str) or not call_id:
        return ""
    return bounded(call_id, MAX_CALL_ID_CHARS, "h:")


_ID_BYTES = 8  # a chained episode's id: "c-" + 16 hex digits
_IDS_PER_DRAW = 256  # ids drawn from the OS's random source in one read
_MAX_CHAIN_SCOPES = 4096  # (tenant, model) pairs whose chain scope is remembered...
_MAX_SCOPED_MODEL_CHARS = 256  # ...for model names up to this long


class _EpisodeIds:
    """Chained episode ids ("c-" + 16 hex digits), from one ``os.urandom`` read per 256 of them
    (the source ``secrets.token_hex`` reads; a system call per id was most of an id's cost).
    Filled on first use, so a process forked before it draws its own."""

    __slots__ = ("_offset", "_pool")

    def __init__(self) -> None:
        self._pool = b""
        self._offset = 0

    def __call__(self) -> str:
        start = self._offset
        if start >= len(self._pool):
            self._pool, start = os.urandom(_ID_BYTES * _IDS_PER_DRAW), 0
        self._offset = start + _ID_BYTES
        return "c-" + self._pool[start : start + _ID_BYTES].hex()


@dataclass(slots=True)
class _Results:
    """The tool results of one request's history, ready to apply to an episode."""

    errors: list[tuple[str, str, str]]  # (position, key, label) per error result
    others: list[str]  # positions of the results that are not errors
    counts: dict[str, int]  # results per call id


class ErrorBudget:
    """The accountant the pipeline calls: episode identity, and failures counted against K."""

    def __init__(
        self,
        store: EpisodeStore,
        default_budget: int = 10,
        tool_error_pattern: str | None = DEFAULT_TOOL_ERROR_PATTERN,
        classifier: Sequence[tuple[str, str]] = DEFAULT_ENV_ERROR_TABLE,
        *,
        chains: ChainIndex | None = None,
        episode_header: str = "x-episode-id",
        new_episode_id: Callable[[], str] | None = None,
        tenants: TenantKeys | None = None,
    ) -> None:
        if default_budget < 0:
            raise ValueError("default_budget must be >= 0")
        self.store = store
        self.default_budget = default_budget
        self.detector = ToolErrorDetector(tool_error_pattern)
        self.classify = ErrorClassifier(classifier)
        if chains is None:
            # One link per answer; the LRU keeps each live episode's latest ones.
            max_episodes = getattr(store, "max_episodes", 100_000)
            ttl = getattr(store, "idle_ttl_seconds", 3600.0)
            chains = MemoryChainIndex(LINKS_PER_EPISODE * max_episodes, ttl)
        self.chains = chains
        self.canonical = CanonicalCache()  # a resent history's call turns, digested once
        self.episode_header = episode_header.lower()
        self._new_episode_id = new_episode_id or _EpisodeIds()
        self._scopes: dict[tuple[str, str | None], bytes] = {}  # chain_scope's, remembered
        self._warned_missing_header = False
        self.tenants = tenants  # None: one namespace (no client keys)
        # A shared store: one read before the upstream call, one write after (``settle``).
        self.shared = store if isinstance(store, SharedEpisodeStore) else None

    def tenant_of(self, headers: Mapping[str, str]) -> str:
        return self.tenants.tenant_of(headers) if self.tenants is not None else ""

    def chain_scope(self, tenant: str, model: Any) -> bytes:
        """The prefix of every conversation link: a chain joins one tenant's one model only."""
        key = (tenant, model if isinstance(model, str) else None)
        scope = self._scopes.get(key)
        if scope is None:
            scope = _chain_scope(tenant, model)
            if isinstance(model, str) and len(model) > _MAX_SCOPED_MODEL_CHARS:
                return scope  # a client's model string: never kept when long
            if len(self._scopes) >= _MAX_CHAIN_SCOPES:
                self._scopes.clear()
            self._scopes[key] = scope
        return scope

    # -- identity ---------------------------------------------------------------------------------

    async def resolve_episode(
        self, headers: Mapping[str, str], body: Mapping[str, Any]
    ) -> EpisodeRef:
        """The episode a request belongs to: its header, else the conversation it continues."""
        tenant = self.tenant_of(headers)
        explicit = header_episode_id(headers, self.episode_header)
        if explicit is not None:
            if self.shared is not None:  # the claim is the read the request is counted on
                reading = await self.shared.read(scoped(tenant, explicit))
                return EpisodeRef(
                    explicit,
                    explicit=True,
                    new=reading.absent,
                    tenant=tenant,
                    txn=Transaction.of(reading),
                )
            new = await self.store.get(scoped(tenant, explicit)) is None
            return EpisodeRef(explicit, explicit=True, new=new, tenant=tenant)
        warn = not self._warned_missing_header
        self._warned_missing_header = True
        messages = body.get("messages")
        keys = conversation_keys(
            messages if isinstance(messages, list) else (),
            scope=self.chain_scope(tenant, body.get("model")),
            cache=self.canonical,
        )
        link = None
        if keys.resume is not None:
            link = await self.chains.lookup(keys.resume)
            plain = keys.plain_resume() if link is None else None
            if plain is not None:
                link = await self.chains.lookup(plain)
        if link is None and keys.elided_resume is not None:  # a failed call's turn left out
            link = await self.chains.lookup(keys.elided_resume)
        if link is None:
            episode_id, new = self._new_episode_id(), True
        elif not link.ambiguous:
            episode_id, new = link.episode_id, False
        else:
            # Identical histories from different episodes: continue a copy of the latest, so
            # each conversation keeps the count they share without adding to the other's.
            episode_id = self._new_episode_id()
            source = await self.store.get(scoped(tenant, link.episode_id))
            if source is not None:
                await self.store.update(
                    scoped(tenant, episode_id), lambda state: state.copy_from(source)
                )
            new = source is None
        return EpisodeRef(
            episode_id,
            explicit=False,
            new=new,
            conversation=keys,
            warn_missing_header=warn,
            tenant=tenant,
        )

    async def read_ahead(self, headers: Mapping[str, str]) -> EpisodeRef | None:
        """The header's episode read from a shared store without claiming it, so that a route
        reads it in the same round trip as its own store's lookup (before the body is known to
        be valid: nothing is claimed for a request refused later). None: no header, no shared
        store, or an episode not seen before (``resolve_episode`` claims it then)."""
        explicit = header_episode_id(headers, self.episode_header)
        if explicit is None or self.shared is None:
            return None
        tenant = self.tenant_of(headers)
        reading = await self.shared.read(scoped(tenant, explicit), claim=False)
        if reading.absent:
            return None
        return EpisodeRef(
            explicit, explicit=True, new=False, tenant=tenant, txn=Transaction.of(reading)
        )

    async def remember_answer(
        self, episode: EpisodeRef | str, body: Mapping[str, Any], answer_message: Any
    ) -> None:
        """Link the history plus the delivered answer to the episode, for the next request.

        ``body`` is the client's request as received (not the forwarded one); pass the
        ``EpisodeRef`` to reuse its digest. Episodes named by the header need no link.
        """
        if type(answer_message) is not dict and not isinstance(answer_message, Mapping):
            return
        if isinstance(episode, EpisodeRef):
            if episode.explicit:
                return
            episode_id, keys = episode.id, episode.conversation
        else:
            episode_id, keys = episode, None
        if keys is None:
            messages = body.get("messages")
            keys = conversation_keys(
                messages if isinstance(messages, list) else (),
                scope=self.chain_scope("", body.get("model")),
                cache=self.canonical,
            )
        await self.chains.link(keys.answer_key(answer_message), episode_id)
        if keys.elided_link is not None:
            await self.chains.link(keys.elided_link, episode_id)

    # -- counting ---------------------------------------------------------------------------------

    def _results(self, body: Mapping[str, Any]) -> _Results:
        # Runs on every request over the whole resent history: keep the per-message path short.
        errors: list[tuple[str, str, str]] = []
        others: list[str] = []
        counts: dict[str, int] = {}
        is_error = self.detector.is_error
        messages = body.get("messages")
        for message in messages if isinstance(messages, list) else ():
            if type(message) is not dict and not isinstance(message, Mapping):
                continue
            role = message.get("role")
            if role == "user":  # frameworks that write results as user text (smolagents)
                text = message.get("content")
                for error in self.detector.errors_in_text(
                    text if type(text) is str else _text(text)
                ):
                    occurrence = counts.get("", 0)
                    counts[""] = occurrence + 1
                    position = f"#{occurrence}"
                    sample = f"{len(error)}:{error}".encode("utf-8", "surrogatepass")
                    digest = hashlib.blake2b(sample, digest_size=8).hexdigest()
                    errors.append((position, f"{position}:{digest}", self.classify(error)))
                continue
            if role != "tool" and role != "function":
                continue
            if role == "tool":
                call_key = message.get("tool_call_id")
                if type(call_key) is not str or not 0 < len(call_key) <= MAX_CALL_ID_CHARS:
                    call_key = _call_key(call_key)  # absent, odd or long: the kept form
            else:
                call_key = ""
            occurrence = counts.get(call_key, 0)
            counts[call_key] = occurrence + 1
            position = f"{call_key}#{occurrence}"
            content = message.get("content")
            if type(content) is not str:
                content = _text(content)
            if not is_error(content):
                others.append(position)
                continue
            # Length plus both ends: a resent 1 MB error costs a bounded hash, not 1 MB of it.
            sample = f"{len(content)}:{scanned_text(content)}".encode("utf-8", "surrogatepass")
            digest = hashlib.blake2b(sample, digest_size=8).hexdigest()
            errors.append((position, f"{position}:{digest}", self.classify(content)))
        if len(counts) > MAX_TRACKED_CALL_IDS:
            counts = dict(list(counts.items())[-MAX_TRACKED_CALL_IDS:])
        return _Results(errors, others, counts)

    async def observe_request(
        self, episode: EpisodeRef | str, body: Mapping[str, Any], budget: int | None = None
    ) -> BudgetSnapshot:
        """Count the error results in a request's history that were not counted before."""
        episode_id, store_key = _names(episode)
        results = self._results(body)
        if (
            isinstance(episode, EpisodeRef)
            and episode.new
            and not episode.explicit
            and not (results.errors or results.others or results.counts)
        ):
            # A chained conversation's first turn with no tool result in it: nothing to count,
            # so nothing is stored (a one-off request takes no slot; the next turn finds the
            # episode by its chain link, and its state is written then, as for a new one). A
            # header-named episode is written: its next request tells "new" from the store.
            return self._snapshot(episode_id, EpisodeState(), budget, 0)

        def apply(state: EpisodeState) -> BudgetSnapshot:
            before = state.errors
            new: list[str] = []
            # Only the newest results ``seen`` can hold: older ones were counted when they were
            # new, and walking them would evict (and recount, every resend) the ones after them.
            for position, key, label in results.errors[-MAX_SEEN_RESULTS:]:
                if not state.first_sight(key):
                    continue
                if position in state.pending:
                    del state.pending[position]  # charged in the answer that made the call
                    continue
                state.count(label)
                new.append(label)
            if state.pending:
                for position in results.others:
                    state.pending.pop(position, None)  # the call did not fail after all
            state.result_counts = results.counts
            return self._snapshot(episode_id, state, budget, before, new_env_errors=tuple(new))

        if isinstance(episode, EpisodeRef) and self.shared is not None:
            txn = await self._transaction(episode)
            txn.request = self._apply(txn, "request", apply)
            return txn.request
        return await self.store.update(store_key, apply)

    async def observe_answer(
        self,
        episode: EpisodeRef | str,
        first_verdict: MessageVerdict,
        budget: int | None = None,
        delivered_invalid: Sequence[CallVerdict] = (),
    ) -> BudgetSnapshot:
        """Charge the first answer per τ²-bench's rule; remember delivered charged calls.

        ``delivered_invalid``: the invalid calls of the answer the client receives (repair off,
        or exhausted with ``pass``). Their results in later requests are absorbed, at most as
        many as this answer was charged.
        """
        episode_id, store_key = _names(episode)
        channels = [str(call.channel) for call in first_verdict.calls]
        delivered = _delivered_positions(first_verdict, delivered_invalid)
        charged = [c for c in channels if c in CHARGED_CHANNELS]
        silent = tuple(c for c in channels if c in SILENT_CHANNELS)
        delivered = delivered[: len(charged)]

        def apply(state: EpisodeState) -> BudgetSnapshot:
            before = state.errors
            for label in charged:
                state.count(label)
            for label in silent:
                state.count_silent(label)
            for call_key, offset in delivered:
                state.expect(f"{call_key}#{state.result_counts.get(call_key, 0) + offset}")
            return self._snapshot(episode_id, state, budget, before, new_silent=silent)

        if isinstance(episode, EpisodeRef) and self.shared is not None:
            txn = await self._transaction(episode)
            txn.answer = self._apply(txn, "answer", apply)
            return txn.answer
        return await self.store.update(store_key, apply)

    # -- a shared store: one read before the upstream call, one write after ------------------------

    async def _transaction(self, episode: EpisodeRef) -> Transaction:
        """The request's reading of its episode: the header's claim, else read now (nothing to
        read for a chained episode just drawn: its random id was never stored)."""
        if episode.txn is None:
            assert self.shared is not None
            if episode.new and not episode.explicit:
                reading = Reading(EpisodeState(), absent=True)
            else:
                reading = await self.shared.read(episode.key)
            episode.txn = Transaction.of(reading)
        return episode.txn

    @staticmethod
    def _apply(
        txn: Transaction, kind: str, mutate: Callable[[EpisodeState], BudgetSnapshot]
    ) -> BudgetSnapshot:
        txn.mutations.append((kind, mutate))
        snapshot = mutate(txn.working)
        return _unknown(snapshot) if txn.reading.unknown else snapshot

    async def settle(self, episode: EpisodeRef | None) -> Transaction | None:
        """Write what the request and its answer changed, in one compare-and-set (none when
        nothing changed; another when a racing request wrote first, the mutations replayed on
        its state). The transaction comes back with the snapshots as the store took them; None
        when there was nothing to write."""
        txn = episode.txn if episode is not None else None
        if txn is None or txn.settled or self.shared is None:
            return None
        txn.settled = True
        if txn.reading.unknown or not txn.changed():
            return None
        assert episode is not None
        mutations = tuple(txn.mutations)

        def replay(state: EpisodeState) -> list[BudgetSnapshot]:
            return [mutate(state) for _, mutate in mutations]

        snapshots = await self.shared.write(episode.key, txn.reading, replay)
        if snapshots is None:  # the store did not answer: counted and logged by its guard
            return None
        for (kind, _), snapshot in zip(mutations, snapshots, strict=True):
            if kind == "request":
                txn.request = snapshot
            else:
                txn.answer = snapshot
        return txn

    async def snapshot(
        self, episode: EpisodeRef | str, budget: int | None = None
    ) -> BudgetSnapshot:
        episode_id, store_key = _names(episode)
        state = await self.store.get(store_key)
        state = state or EpisodeState()
        return self._snapshot(episode_id, state, budget, state.errors)

    def _snapshot(
        self,
        episode_id: str,
        state: EpisodeState,
        budget: int | None,
        before: int,
        *,
        new_env_errors: tuple[str, ...] = (),
        new_silent: tuple[str, ...] = (),
    ) -> BudgetSnapshot:
        return BudgetSnapshot(
            episode_id,
            state.errors,
            self.default_budget if budget is None else budget,
            dict(state.by_channel),
            dict(state.silent_by_channel),
            before,
            new_env_errors,
            new_silent,
        )


def _unknown(snapshot: BudgetSnapshot) -> BudgetSnapshot:
    """A snapshot computed on a blank state (the store did not answer): nothing to trust."""
    snapshot.errors_before, snapshot.unknown = snapshot.errors, True
    return snapshot


def _chain_scope(tenant: str, model: Any) -> bytes:
    if not tenant and not isinstance(model, str):
        return b""
    name = model if isinstance(model, str) else ""
    return hashlib.blake2b(
        f"{tenant}\0{name}".encode("utf-8", "surrogatepass"), digest_size=8
    ).digest()


def _names(episode: EpisodeRef | str) -> tuple[str, str]:
    """(the id the client sees, the store key) of an episode; a bare id is its own key."""
    if isinstance(episode, EpisodeRef):
        return episode.id, episode.key
    return episode, episode


def _delivered_positions(
    first: MessageVerdict, delivered: Sequence[CallVerdict]
) -> list[tuple[str, int]]:
    """(call key, offset among the message's calls with that key) per delivered charged call.

    Results come back in call order, so a call's result is the (n + offset)-th result with its id,
    n being how many the history held. The offset counts every call of the delivered message;
    when the delivered calls are not the first answer's, only the invalid ones are known.
    """
    calls: Sequence[CallVerdict] = first.calls
    if not all(any(d is c for c in calls) for d in delivered):
        calls = delivered
    positions = []
    for verdict in delivered:
        if verdict.channel not in CHARGED_CHANNELS:
            continue
        key = _call_key(verdict.call_id)
        offset = sum(1 for c in calls if c.index < verdict.index and _call_key(c.call_id) == key)
        positions.append((key, offset))
    return positions
