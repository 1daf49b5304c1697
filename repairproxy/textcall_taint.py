"""Taint by content: calls the request's own non-assistant content already holds.

A call written in an answer whose name and arguments, as a structure, appear in a tool result,
a user turn or a system/developer message of the request is text that the model copied from
what it was shown (an injection in a fetched page, a pasted message, a RAG document), not a call
it chose to make. ``QuotedCalls`` indexes every such structure once per request:

* every call shape ``find_text_calls`` finds in each of those texts (bare or tagged JSON, fences,
  each family's native format);
* every JSON value in them, decoded and walked: an object naming a call (``name`` with
  ``arguments``/``parameters``, or ``function: {...}``) is indexed, and a string value holding
  JSON or markup is read again the same way (JSON escaped inside JSON, at any depth up to
  ``MAX_NESTING``), so ``{"note": "{\\"name\\": \\"delete_account\\", ...}"}`` taints
  ``delete_account(...)``;
* keyed by the name and the arguments normalised: keys sorted, whitespace runs inside strings
  collapsed, scalars compared by their text (``1`` and ``"1"`` alike: a format that writes
  values as text must not slip by).

The ``tools`` field and its rendering never taint (they are not content). Calls the assistant
itself made earlier in the conversation (its structured ``tool_calls``) are exempt: an agent
repeating an earlier look-up, or a framework echoing the calls it ran into a user turn, is not an
injection. Building the index reads each byte of that content a bounded number of times (once per
nesting level it sits at): linear in the request's size; it is built at most once per request,
on first use.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from repairproxy.wire.openai import content_text

__all__ = ["MAX_NESTING", "QuotedCalls", "call_key"]

# JSON inside a JSON string is read again this many levels down; deeper nesting is not content
# a model is shown to act on.
MAX_NESTING = 6
# Containers nested deeper than this inside one JSON value are not walked.
_MAX_WALK = 64
_TAINTING_ROLES = frozenset({"tool", "function", "user", "system", "developer"})
_SPACE = re.compile(r"\s+")
_MARKUP = re.compile(r"[{\[<]")


def _normalised(value: Any, depth: int = 0) -> Any:
    if depth > _MAX_WALK:
        return None
    if isinstance(value, Mapping):
        return {str(k): _normalised(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalised(v, depth + 1) for v in value]
    if isinstance(value, str):
        return _SPACE.sub(" ", value.strip())
    if isinstance(value, bool) or value is None:
        return orjson.dumps(value).decode()
    return _SPACE.sub(" ", str(value))


def call_key(name: Any, arguments: Any) -> tuple[str, str]:
    """A call as a structure: its name and its arguments normalised (see the module doc)."""
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments) if arguments.strip() else {}
        except orjson.JSONDecodeError:
            return str(name), _SPACE.sub(" ", arguments.strip())
    if arguments is None:
        arguments = {}
    try:
        canonical = orjson.dumps(_normalised(arguments), option=orjson.OPT_SORT_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):
        canonical = repr(arguments)
    return str(name), canonical


def _named_call(node: Mapping[str, Any]) -> tuple[str, Any] | None:
    """(name, arguments) of an object that names a call, else None."""
    name = node.get("name")
    if isinstance(name, str):
        for key in ("arguments", "parameters", "args", "input"):
            if key in node:
                return name, node[key]
        return None
    function = node.get("function")
    if isinstance(function, Mapping) and isinstance(function.get("name"), str):
        return function["name"], function.get("arguments", function.get("parameters", {}))
    return None


class QuotedCalls:
    """The calls a request's non-assistant content holds, indexed on first use.

    ``find_calls``: the text-call finder (``textcall_shapes.find_text_calls``), given so this
    module stays below the one that judges text calls.
    """

    __slots__ = ("_find", "_keys", "_messages", "_own", "_texts")

    def __init__(self, messages: Any, find_calls: Callable[[str], Iterable[Any]]) -> None:
        self._messages = messages if isinstance(messages, list) else []
        self._find = find_calls
        self._keys: set[tuple[str, str]] | None = None
        self._own: set[tuple[str, str]] = set()
        self._texts: list[str] = []

    @property
    def empty(self) -> bool:
        self._build()
        return not self._keys and not self._texts

    def texts(self) -> tuple[str, ...]:
        """The tainting texts, each JSON string read out of them included (decoded)."""
        self._build()
        return tuple(self._texts)

    def holds(self, name: Any, arguments: Any, source: str | None = None) -> bool:
        """Whether the call (name, arguments) is one the content holds; ``source``: the call's
        own text, also looked for verbatim. The assistant's own earlier calls never are."""
        self._build()
        key = call_key(name, arguments)
        if key in self._own:
            return False
        if self._keys and key in self._keys:
            return True
        return source is not None and source != "" and any(source in t for t in self._texts)

    def _build(self) -> None:
        if self._keys is not None:
            return
        self._keys = set()
        for message in self._messages:
            if not isinstance(message, Mapping):
                continue
            role = message.get("role")
            if role == "assistant":
                self._own_calls(message)
            elif role in _TAINTING_ROLES:
                text = content_text(message.get("content"))
                if text:
                    self._read(text, 0)

    def _own_calls(self, message: Mapping[str, Any]) -> None:
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, Mapping):
                found = _named_call(call)
                if found is not None:
                    self._own.add(call_key(*found))

    def _read(self, text: str, depth: int) -> None:
        """Index the calls in ``text`` and in the JSON values it holds, strings read again."""
        if depth > MAX_NESTING or _MARKUP.search(text) is None:
            return
        assert self._keys is not None
        self._texts.append(text)
        for call in self._find(text):
            self._keys.add(call_key(call.name, call.arguments))
        for value in _json_values(text):
            self._walk(value, depth, 0)

    def _walk(self, value: Any, depth: int, level: int) -> None:
        if level > _MAX_WALK:
            return
        assert self._keys is not None
        if isinstance(value, str):
            if len(value) > 1:
                self._read(value, depth + 1)
        elif isinstance(value, list):
            for item in value:
                self._walk(item, depth, level + 1)
        elif isinstance(value, dict):
            found = _named_call(value)
            if found is not None:
                self._keys.add(call_key(*found))
            for item in value.values():
                self._walk(item, depth, level + 1)


def _json_values(text: str) -> Iterable[Any]:
    """The outermost JSON values written in ``text`` (objects, arrays; the whole text when it is
    one JSON string), decoded. The brackets are matched in one pass; a bracketed span that is
    not JSON is tried again inside, at most ``_RETRIES`` times the text's size in all."""
    stripped = text.strip()
    if stripped.startswith('"'):
        try:
            whole = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            return
        yield whole
        return
    budget = _RETRIES * len(text)
    consumed = 0
    for start, end in _bracket_spans(text):
        if start < consumed:
            continue
        budget -= end - start
        if budget < 0:
            return
        try:
            value = orjson.loads(text[start:end])
        except orjson.JSONDecodeError:
            continue
        consumed = end
        yield value


_RETRIES = 4
_TOKEN = re.compile(r'[\[\]{}"]')
_STRING_REST = re.compile(r'(?:[^"\\]|\\.)*"', re.DOTALL)


def _bracket_spans(text: str) -> list[tuple[int, int]]:
    """Every matched ``{...}``/``[...]`` span, by start (strings inside brackets skipped; quotes
    outside them are prose), in one pass."""
    spans: list[tuple[int, int]] = []
    stack: list[int] = []
    position = 0
    while True:
        token = _TOKEN.search(text, position)
        if token is None:
            break
        kind = token.group()
        position = token.end()
        if kind == '"':
            if not stack:
                continue
            rest = _STRING_REST.match(text, position)
            if rest is None:
                break
            position = rest.end()
        elif kind in "[{":
            stack.append(token.start())
        elif stack:
            spans.append((stack.pop(), position))
    spans.sort()
    return spans
