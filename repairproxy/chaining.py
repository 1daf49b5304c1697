"""Conversation chaining: which episode a request without an episode header continues.

Agents resend their whole history on every turn. After each answer the proxy remembers
``digest(history + answer) -> episode``; a later request whose history, up to and including its
last assistant message, has a remembered digest continues that episode. A request with no
assistant message, or none the proxy answered, starts a new one: sequential runs of one task never
merge, whatever their opening.

The digest runs over canonical per-message forms, one pass per request, so it survives what
clients change when they resend an answer they received: tool-call arguments re-serialised
(``json.dumps`` spacing, key order), missing vs null vs empty content, fields added or dropped
(``refusal``, ``annotations``, ``audio``, ``reasoning_content``, a tool call's ``type``/``index``).
Tool-call ids (random per call from vLLM, llama.cpp, OpenAI) are part of the digest, which tells
apart runs whose texts coincide; a client may invent ids for calls an upstream sent without one,
so an answer with id-less calls is remembered under a second digest that leaves assistant call
ids out, tried when the first finds nothing. System and developer messages are left out: many
frameworks rebuild them every turn (dates, dynamic instructions).

What stays ambiguous: two conversations whose histories are identical up to an answer (identical
concurrent runs of one task with a deterministic model, before a random tool-call id sets them
apart) cannot be told apart from their content. The index then marks the digest ambiguous, and
the session layer forks a copy of the episode for each request that continues it: the counts stay
exact, only the episode id changes until the histories diverge.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

__all__ = [
    "ChainIndex",
    "ChainLink",
    "ConversationKeys",
    "MemoryChainIndex",
    "canonical_message",
    "conversation_keys",
    "extend",
]

DIGEST_BYTES = 16
_SEED = b"repairproxy/chain/v1"
_SKIPPED_ROLES = frozenset({"system", "developer"})


def _content(content: Any) -> str:
    """Text content, the same whether sent as a string, as text parts, as null or not at all."""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        texts: list[str] = []
        others: list[str] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type", "text") == "text":
                text = part.get("text")
                texts.append(text if isinstance(text, str) else "")
            else:
                others.append(_json(part))
        joined = "".join(texts).strip()
        return joined if not others else joined + "\x00" + "\x00".join(others)
    return "" if content is None else _json(content)


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return repr(value)


def _arguments(arguments: Any) -> str:
    """Arguments as sorted compact JSON when they parse (clients re-serialise them), else raw."""
    if isinstance(arguments, str):
        try:
            return _json(orjson.loads(arguments))
        except orjson.JSONDecodeError:
            return arguments.strip()
    return "" if arguments is None else _json(arguments)


def _calls(message: Mapping[str, Any], with_call_ids: bool) -> list[list[str]]:
    calls: list[list[str]] = []
    tool_calls = message.get("tool_calls")
    for call in tool_calls if isinstance(tool_calls, list) else ():
        if not isinstance(call, Mapping):
            calls.append(["", ""])
            continue
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        name = function.get("name")
        form = [name if isinstance(name, str) else "", _arguments(function.get("arguments"))]
        if with_call_ids:
            call_id = call.get("id")
            form.append(call_id if isinstance(call_id, str) else "")
        calls.append(form)
    function_call = message.get("function_call")
    if isinstance(function_call, Mapping):
        name = function_call.get("name")
        calls.append(
            [name if isinstance(name, str) else "", _arguments(function_call.get("arguments"))]
        )
    return calls


def canonical_message(message: Mapping[str, Any], *, with_call_ids: bool = True) -> bytes:
    """The bytes a message contributes to the conversation digest."""
    role = message.get("role")
    role = role if isinstance(role, str) else ""
    form: list[Any] = [role, _content(message.get("content"))]
    if role == "assistant":
        form.append(_calls(message, with_call_ids))
    elif role == "tool":
        call_id = message.get("tool_call_id")
        form.append(call_id if isinstance(call_id, str) else "")
    elif role == "function":
        name = message.get("name")
        form.append(name if isinstance(name, str) else "")
    return orjson.dumps(form)


def extend(digest: bytes, message: Any, *, with_call_ids: bool = True) -> bytes:
    """The running digest after one more message (system/developer messages leave it as is)."""
    if not isinstance(message, Mapping) or message.get("role") in _SKIPPED_ROLES:
        return digest
    form = canonical_message(message, with_call_ids=with_call_ids)
    return hashlib.blake2b(digest + form, digest_size=DIGEST_BYTES).digest()


def _has_all_call_ids(message: Mapping[str, Any]) -> bool:
    tool_calls = message.get("tool_calls")
    if message.get("function_call") is not None:
        return False
    return all(
        isinstance(call, Mapping) and isinstance(call.get("id"), str) and call.get("id")
        for call in (tool_calls if isinstance(tool_calls, list) else ())
    )


@dataclass(frozen=True, slots=True)
class ConversationKeys:
    """The digests of one request's history.

    ``resume``: the keys a continuing request is looked up by, best first (the history up to its
    last assistant message, with and without assistant call ids; empty when there is none);
    ``history``/``history_plain``: the whole history, the two ways; ``answer_key`` extends them.
    """

    resume: tuple[bytes, ...]
    history: bytes
    history_plain: bytes

    def answer_key(self, answer: Mapping[str, Any]) -> bytes:
        """The key an answer is remembered under: with its call ids, unless one is missing."""
        if _has_all_call_ids(answer):
            return extend(self.history, answer)
        return extend(self.history_plain, answer, with_call_ids=False)


def conversation_keys(messages: Iterable[Any]) -> ConversationKeys:
    """All keys of a request's history, in one pass over its messages."""
    digest = plain = _SEED
    resume: tuple[bytes, ...] = ()
    for message in messages:
        if not isinstance(message, Mapping) or message.get("role") in _SKIPPED_ROLES:
            continue
        form = canonical_message(message)
        digest = hashlib.blake2b(digest + form, digest_size=DIGEST_BYTES).digest()
        if message.get("role") == "assistant":
            if message.get("tool_calls") or message.get("function_call") is not None:
                form = canonical_message(message, with_call_ids=False)
            plain = hashlib.blake2b(plain + form, digest_size=DIGEST_BYTES).digest()
            resume = (digest, plain) if digest != plain else (digest,)
        else:
            plain = hashlib.blake2b(plain + form, digest_size=DIGEST_BYTES).digest()
    return ConversationKeys(resume, digest, plain)


@dataclass(frozen=True, slots=True)
class ChainLink:
    episode_id: str
    ambiguous: bool = False  # two episodes remembered this digest


class ChainIndex(Protocol):
    """Where digests of answered histories point to their episodes (bounded, shared or not)."""

    async def link(self, key: bytes, episode_id: str) -> None:
        """Remember ``key -> episode_id``; a key already linked to another episode becomes
        ambiguous (and points to the latest). Atomic per key."""
        ...

    async def lookup(self, key: bytes) -> ChainLink | None: ...


class MemoryChainIndex:
    """In-process index: LRU bounded at ``max_links``, links idle longer than the TTL dropped.

    One link per answer; a conversation's older links stay (a client that retries a request
    resends an older history) until the LRU or the TTL drops them.
    """

    def __init__(
        self,
        max_links: int = 400_000,
        idle_ttl_seconds: float = 3600.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_links < 1:
            raise ValueError("max_links must be at least 1")
        self.max_links = max_links
        self.idle_ttl_seconds = idle_ttl_seconds
        self._clock = clock
        self._links: OrderedDict[bytes, tuple[float, ChainLink]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._links)

    async def link(self, key: bytes, episode_id: str) -> None:
        now = self._clock()
        self._expire(now)
        entry = self._links.pop(key, None)
        ambiguous = entry is not None and (entry[1].ambiguous or entry[1].episode_id != episode_id)
        self._links[key] = (now, ChainLink(episode_id, ambiguous))
        if len(self._links) > self.max_links:
            self._links.popitem(last=False)

    async def lookup(self, key: bytes) -> ChainLink | None:
        now = self._clock()
        self._expire(now)
        entry = self._links.pop(key, None)
        if entry is None:
            return None
        self._links[key] = (now, entry[1])
        return entry[1]

    def _expire(self, now: float) -> None:
        deadline = now - self.idle_ttl_seconds
        while self._links:
            touched, _ = next(iter(self._links.values()))
            if touched > deadline:
                break
            self._links.popitem(last=False)
