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

What chaining never joins: conversations of different tenants (client keys) or of different
models. Every digest starts from a ``scope`` (the session layer passes a digest of the tenant and
the request's model), so another client, or the same text sent to another model, starts its own
episode. What it cannot tell apart within one tenant and model: see the paragraph above.
"""

from __future__ import annotations

import ast
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import orjson

__all__ = [
    "CanonicalCache",
    "ChainIndex",
    "ChainLink",
    "ConversationKeys",
    "MemoryChainIndex",
    "canonical_message",
    "conversation_keys",
]

DIGEST_BYTES = 16
_SEED = b"repairproxy/chain/v1"
_SKIPPED_ROLES = frozenset({"system", "developer"})


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return repr(value)


def _text(content: Any) -> str:
    """Text content, the same whether sent as a string, as text parts, as null or not at all."""
    if type(content) is str:
        return content.strip()
    if content is None:
        return ""
    if isinstance(content, list):
        texts: list[str] = []
        others: list[Any] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type", "text") == "text":
                text = part.get("text")
                texts.append(text if isinstance(text, str) else "")
            else:
                others.append(part)
        joined = "".join(texts).strip()
        return joined if not others else f"{joined}\x00{_json(others)}"
    return _json(content)


def _arguments(arguments: Any) -> str:
    """Arguments as sorted compact JSON (clients re-serialise them) when they parse, else raw."""
    if type(arguments) is str:
        try:
            return _json(orjson.loads(arguments))
        except orjson.JSONDecodeError:
            return "\x00" + arguments.strip()
    return _json("" if arguments is None else arguments)


def _str(value: Any) -> str:
    return value if type(value) is str else ""


# Frameworks that resend a delivered call as assistant text: (marker before the calls, source).
# The calls are read back so the message digests as the answer the proxy delivered.
RESENT_CALL_MARKERS: tuple[tuple[str, str], ...] = (
    (
        "Calling tools:\n[",
        "smolagents 1.26.0 memory.py ActionStep.to_messages: 'Calling tools:\\n' + "
        "str([tool_call.dict() ...]) (a Python repr, arguments as a dict), captured in "
        "tests/data/frameworks/smolagents-1.26.0.json",
    ),
)


# Frameworks that resend a history WITHOUT the turn of a call that failed, the error appended
# to the user message instead: (marker opening the task's user message, marker of the error block,
# marker that closes it, source). After an answer to such a history the proxy also remembers
# "history + an elided answer", which the next request, cut back before its last error block,
# is looked up by.
ELIDED_TURN_FORMATS: tuple[tuple[str, str, str, str], ...] = (
    (
        "New task:\n",
        "\nError:\n",
        "\nNow let's retry: ",
        "smolagents 1.26.0: after a tool error the resent history has no 'Calling tools:' turn; "
        "the user message is 'New task:\\n{task}\\nError:\\n{error}\\nNow let's retry: ...' "
        "(tests/data/frameworks/smolagents-1.26.0.json)",
    ),
)
_ELIDED = b"\x00elided-answer"


def _elided_format(messages: Sequence[Mapping[str, Any]]) -> tuple[str, str, str] | None:
    """The elided-turn format a history is written in (read from its first user message)."""
    for message in messages:
        if message.get("role") == "user":
            text = _text(message.get("content"))
            break
    else:
        return None
    for opening, error, closing, _ in ELIDED_TURN_FORMATS:
        if text.startswith(opening):
            return opening, error, closing
    return None


def _elided_resume(
    messages: Sequence[Mapping[str, Any]], form: tuple[str, str, str], scope: bytes
) -> bytes | None:
    """The key of the history this request resends with its answer elided: the last user
    message cut back before its last error block, then the elided-answer marker."""
    last = messages[-1] if messages else None
    if last is None or last.get("role") != "user":
        return None
    text = _text(last.get("content"))
    _, error, closing = form
    cut = text.rfind(error)
    if cut < 0 or closing not in text[cut:]:
        return None
    stream = hashlib.blake2b(_SEED + scope, digest_size=DIGEST_BYTES)
    for message in messages[:-1]:
        stream.update(canonical_message(message))
    stream.update(canonical_message({"role": "user", "content": text[:cut]}))
    stream.update(_ELIDED)
    digest: bytes = stream.digest()
    return digest


def _resent_calls(text: str) -> tuple[str, list[Any]] | None:
    """(text before the marker, the calls) of an assistant text that resends delivered calls."""
    for marker, _ in RESENT_CALL_MARKERS:
        start = text.find(marker)
        if start < 0:
            continue
        try:
            # A literal only: ast.literal_eval never runs code.
            calls = ast.literal_eval(text[start + len(marker) - 1 :])
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
        if isinstance(calls, list) and all(isinstance(c, dict) for c in calls):
            return text[:start].strip(), calls
    return None


def canonical_message(message: Mapping[str, Any], *, with_call_ids: bool = True) -> bytes:
    """The bytes a message contributes to the conversation digest.

    Every field is length-prefixed, so no two different histories make the same stream. (Built
    as one string: orjson spends ~2 us escaping a 400-character text that encodes in 0.05 us.)
    """
    role = message.get("role")
    content = message.get("content")
    if type(role) is str and type(content) is str and role != "assistant":
        # Most of a history (user text, tool results): the general path below, written out.
        text = content.strip()
        form = f"{len(role)}:{role}{len(text)}:{text}"
        if role == "tool" or role == "function":
            extra = message.get("tool_call_id" if role == "tool" else "name")
            extra = extra if type(extra) is str else ""
            form = f"{form}{len(extra)}:{extra}"
        return form.encode("utf-8", "surrogatepass")
    role = _str(role)
    text = _text(content)
    form = f"{len(role)}:{role}{len(text)}:{text}"
    if role == "assistant":
        calls = message.get("tool_calls")
        calls = calls if type(calls) is list else []
        if not calls and "Calling tools:" in text:
            resent = _resent_calls(text)
            if resent is not None:
                text, calls = resent
                form = f"{len(role)}:{role}{len(text)}:{text}"
        function_call = message.get("function_call")
        if function_call is not None and isinstance(function_call, Mapping):
            calls = [*calls, {"function": function_call}]
        parts = [form, f"{len(calls)}:"]
        for call in calls:
            if type(call) is not dict and not isinstance(call, Mapping):
                call = {}
            function = call.get("function")
            if type(function) is not dict and not isinstance(function, Mapping):
                function = {}
            name = _str(function.get("name"))
            arguments = _arguments(function.get("arguments"))
            if with_call_ids:
                call_id = _str(call.get("id"))
                parts.append(
                    f"{len(name)}:{name}{len(arguments)}:{arguments}{len(call_id)}:{call_id}"
                )
            else:
                parts.append(f"{len(name)}:{name}{len(arguments)}:{arguments}")
        form = "".join(parts)
    elif role == "tool" or role == "function":
        extra = _str(message.get("tool_call_id" if role == "tool" else "name"))
        form = f"{form}{len(extra)}:{extra}"
    return form.encode("utf-8", "surrogatepass")


# A cache entry's bytes besides the texts of its key and forms (CPython 3.11, as tracemalloc
# counts them): the key's str header, each form's bytes header, the entry's list (80) and its
# OrderedDict slot and node (~64).
_KEY_STRING_BYTES = 56
_FORM_BYTES = 33
_ENTRY_BYTES = 144


def _cache_key(message: Any) -> str | None:
    """What ``canonical_message`` reads of an assistant message with tool calls (its content,
    and each call's id, name and arguments), when every one of them is a str, as one string:
    the values joined by NUL. None for any other message (computed afresh, never cached), and
    for a value holding a NUL: then the key splits back into the values, so equal keys mean
    equal values and equal forms, with call ids and without. A null content, id or name is
    the empty string (its form is); null arguments are not (their form is ``""``), so refused.

    Never dict equality: ``1 == 1.0 == True`` while their forms differ (arguments sent as
    numbers digest as ``1``, ``1.0``, ``true``); a value that is not exactly a str or None (a
    number, a subclass, an enum) is refused, and equal strings are equal texts. Other fields
    (a call's ``type`` and ``index``, ``refusal``...) do not reach the form, nor the key.
    """
    if type(message) is not dict or message.get("role") != "assistant":
        return None
    calls = message.get("tool_calls")
    if type(calls) is not list or not calls or message.get("function_call") is not None:
        return None
    if type(message["role"]) is not str:
        return None
    content = message.get("content")
    if content is None:
        content = ""
    elif type(content) is not str or "\x00" in content:
        return None
    values = [content]
    for call in calls:
        if type(call) is not dict:
            return None
        function = call.get("function")
        if type(function) is not dict:
            return None
        call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
        if call_id is None:
            call_id = ""
        if name is None:
            name = ""
        if (
            type(call_id) is not str
            or type(name) is not str
            or type(arguments) is not str
            or "\x00" in call_id
            or "\x00" in name
            or "\x00" in arguments
        ):
            return None
        values += (call_id, name, arguments)
    return "\x00".join(values)


def _entry_bytes(key: str, entry: list[Any]) -> int:
    forms = (form for form in entry[1:] if type(form) is bytes)
    return _ENTRY_BYTES + _KEY_STRING_BYTES + len(key) + sum(_FORM_BYTES + len(f) for f in forms)


class CanonicalCache:
    """``canonical_message`` remembered per conversation turn, so a resent history costs a
    key and a lookup per assistant call message instead of its canonical form (re-parsing and
    re-serialising each call's arguments: ~7 us a message here, ~1 us this way).

    Only assistant messages with tool calls are kept (the only ones whose form costs much more
    than reading their strings), keyed by the strings their form is made of (``_cache_key``),
    one entry for the forms with and without call ids. Bounded by ``max_bytes`` of keys and
    forms (estimated); the least recently used entries go first, but never one the running
    scan (a request's passes over its history, ``scan``) has read: a history whose turns
    outgrow the bound keeps those that fit, where LRU or FIFO would evict, on each miss, the
    turn the scan reads next and hit nothing (a 40,000-message history missed all its turns on
    every resend). One per process, on the event loop: no lock.
    """

    def __init__(self, max_bytes: int = 8 << 20) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.size = 0  # bytes held: keys and forms
        self._scans = 0  # scans begun; an entry's first slot holds the last that read it
        # key -> [scan, form with call ids, form without or its length where the form with ids
        # begins with it], least recently used first. An OrderedDict: a dict's ``next(iter())``
        # walks the slots its evictions left at the front, so evicting from a full dict cost a
        # walk each (quadratic in a long history's turns).
        self._forms: OrderedDict[str, list[Any]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._forms)

    def scan(self) -> Canonical:
        """``canonical`` for one request's passes over its history: what it reads stays."""
        self._scans += 1
        return partial(self._canonical, self._scans)

    def canonical(self, message: Mapping[str, Any], *, with_call_ids: bool = True) -> bytes:
        """``canonical_message(message, with_call_ids=...)``, from memory when it was seen."""
        self._scans += 1  # a scan of its own
        return self._canonical(self._scans, message, with_call_ids=with_call_ids)

    def _canonical(
        self, scan: int, message: Mapping[str, Any], *, with_call_ids: bool = True
    ) -> bytes:
        if not message.get("tool_calls"):  # most messages: not kept, no key to make
            return canonical_message(message, with_call_ids=with_call_ids)
        key = _cache_key(message)
        if key is None:
            return canonical_message(message, with_call_ids=with_call_ids)
        slot = 1 if with_call_ids else 2
        forms = self._forms
        entry = forms.get(key)
        if entry is not None:
            if entry[0] != scan:  # read again: the most recently used
                forms.move_to_end(key)
                entry[0] = scan
            held = entry[slot]
            if type(held) is bytes:
                return held
            if held is not None:  # the form without call ids: the first bytes of the one with
                form: bytes = entry[1][:held]
                return form
        form = canonical_message(message, with_call_ids=with_call_ids)
        if entry is None:
            entry = [scan, None, None]
            entry[slot] = form
            cost = _entry_bytes(key, entry)
            if cost <= self.max_bytes and self._make_room(cost, scan):
                forms[key] = entry
                self.size += cost
        elif slot == 2 and entry[1] is not None and entry[1].startswith(form):
            entry[2] = len(form)  # one call: its id ends the form with ids, held once
        elif self._make_room(_FORM_BYTES + len(form), scan):
            entry[slot] = form
            self.size += _FORM_BYTES + len(form)
        return form

    def _make_room(self, cost: int, scan: int) -> bool:
        """Evict the least recently used entries until ``cost`` more bytes fit; False (nothing
        evicted further) at an entry ``scan`` read, which every later entry was read after."""
        forms = self._forms
        while self.size + cost > self.max_bytes:
            old_key, old_entry = next(iter(forms.items()))
            if old_entry[0] == scan:
                return False
            del forms[old_key]
            self.size -= _entry_bytes(old_key, old_entry)
        return True


Canonical = Callable[..., bytes]


def _has_calls(message: Mapping[str, Any]) -> bool:
    return bool(message.get("tool_calls")) or message.get("function_call") is not None


def _has_all_call_ids(message: Mapping[str, Any]) -> bool:
    tool_calls = message.get("tool_calls")
    if message.get("function_call") is not None:
        return False
    return all(
        (type(call) is dict or isinstance(call, Mapping))
        and isinstance(call.get("id"), str)
        and call.get("id")
        for call in (tool_calls if isinstance(tool_calls, list) else ())
    )


def _messages(messages: Iterable[Any]) -> list[Mapping[str, Any]]:
    return [
        m
        for m in messages
        if (type(m) is dict or isinstance(m, Mapping)) and m.get("role") not in _SKIPPED_ROLES
    ]


def _stream(
    messages: Sequence[Mapping[str, Any]],
    with_call_ids: bool,
    scope: bytes = b"",
    canonical: Canonical = canonical_message,
) -> tuple[Any, bytes | None]:
    """The running hash over ``messages`` (from ``scope``) and its digest at the last assistant
    message."""
    last = -1
    for position, message in enumerate(messages):
        if message.get("role") == "assistant":
            last = position
    stream = hashlib.blake2b(_SEED + scope, digest_size=DIGEST_BYTES)
    resume: bytes | None = None
    for position, message in enumerate(messages):
        stream.update(canonical(message, with_call_ids=with_call_ids))
        if position == last:
            resume = stream.digest()
    return stream, resume


@dataclass(slots=True)  # per request; frozen=True would cost an object.__setattr__ a field
class ConversationKeys:
    """The digests of one request's history.

    ``resume``: the digest up to the last assistant message (None when there is none), which a
    continuing request is looked up by; ``plain_resume()`` is the same without assistant call
    ids (computed only when asked: the fallback for clients that invent ids); ``history``: the
    whole history's digest; ``answer_key`` extends it with an answer.
    """

    resume: bytes | None
    history: bytes
    _stream: Any = field(compare=False, repr=False)
    _messages: Sequence[Mapping[str, Any]] = field(compare=False, repr=False)
    _ids_matter: bool = field(compare=False, repr=False)
    _scope: bytes = field(default=b"", compare=False, repr=False)
    # Frameworks that resend a history without a failed call's turn (ELIDED_TURN_FORMATS): the
    # key to look up when ``resume`` finds nothing, and the extra key to link after an answer.
    elided_resume: bytes | None = None
    elided_link: bytes | None = None
    _canonical: Canonical = field(default=canonical_message, compare=False, repr=False)

    def plain_resume(self) -> bytes | None:
        """``resume`` without assistant call ids; None when that is ``resume`` itself."""
        if not self._ids_matter:
            return None
        return _stream(self._messages, False, self._scope, self._canonical)[1]

    def answer_key(self, answer: Mapping[str, Any]) -> bytes:
        """The key an answer is remembered under: with its call ids, unless one is missing."""
        if _has_all_call_ids(answer):
            stream = self._stream.copy()
            stream.update(self._canonical(answer))
        else:
            stream = _stream(self._messages, False, self._scope, self._canonical)[0]
            stream.update(self._canonical(answer, with_call_ids=False))
        digest: bytes = stream.digest()
        return digest


def conversation_keys(
    messages: Iterable[Any], *, scope: bytes = b"", cache: CanonicalCache | None = None
) -> ConversationKeys:
    """The keys of a request's history: one pass over its messages, from ``scope`` (histories
    under different scopes never share a key); ``cache`` remembers the costly message forms
    across requests (the same keys either way)."""
    kept = _messages(messages)
    canonical = canonical_message if cache is None else cache.scan()
    stream, resume = _stream(kept, True, scope, canonical)
    ids_matter = any(m.get("role") == "assistant" and _has_calls(m) for m in kept)
    elided_resume = elided_link = None
    form = _elided_format(kept)
    if form is not None:
        elided_resume = _elided_resume(kept, form, scope)
        if kept and kept[-1].get("role") == "user":
            linked = stream.copy()
            linked.update(_ELIDED)
            elided_link = linked.digest()
    return ConversationKeys(
        resume,
        stream.digest(),
        stream,
        kept,
        ids_matter,
        scope,
        elided_resume,
        elided_link,
        canonical,
    )


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
        max_links: int = 200_000,
        idle_ttl_seconds: float = 3600.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_links < 1:
            raise ValueError("max_links must be at least 1")
        self.max_links = max_links
        self.idle_ttl_seconds = idle_ttl_seconds
        self._clock = clock
        # key -> (last touched, episode id, ambiguous); least recently used first.
        self._links: OrderedDict[bytes, tuple[float, str, bool]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._links)

    async def link(self, key: bytes, episode_id: str) -> None:
        now = self._clock()
        self._expire(now)
        entry = self._links.pop(key, None)
        ambiguous = entry is not None and (entry[2] or entry[1] != episode_id)
        self._links[key] = (now, episode_id, ambiguous)
        if len(self._links) > self.max_links:
            self._links.popitem(last=False)

    async def lookup(self, key: bytes) -> ChainLink | None:
        now = self._clock()
        self._expire(now)
        entry = self._links.pop(key, None)
        if entry is None:
            return None
        self._links[key] = (now, entry[1], entry[2])
        return ChainLink(entry[1], entry[2])

    def _expire(self, now: float) -> None:
        deadline = now - self.idle_ttl_seconds
        while self._links:
            touched = next(iter(self._links.values()))[0]
            if touched > deadline:
                break
            self._links.popitem(last=False)
