"""The vocabulary every native recogniser shares: the typed matches, the step-counting scanner,
and small readers (JSON after a marker, call objects, adjacent calls grouped under one wrapper)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "MAX_DEPTH",
    "MAX_MATCHES",
    "NOT_JSON",
    "SPACE",
    "Malformed",
    "NativeCall",
    "NativeMatch",
    "Scanner",
    "Schemas",
    "call_objects",
    "declared",
    "grouped",
    "json_at",
    "loads",
    "make_calls",
    "skip_space",
]

# A text holding more matches than this is not an answer an agent acts on.
MAX_MATCHES = 32
# Nested values deeper than this are not read (the recursive readers stay bounded).
MAX_DEPTH = 64

Schemas = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class NativeCall:
    """One call of a match: its name and arguments (an object; the raw text when unreadable).

    ``string_values``: the format wrote every value as text and no schema was there to type it.
    """

    name: str
    arguments: Any
    start: int
    end: int
    string_values: bool = False


@dataclass(frozen=True, slots=True)
class NativeMatch:
    """Calls written together in one family's format, and the text they occupy.

    ``start``/``end`` delimit everything to cut when the calls are promoted (markers, separators,
    the family's own reasoning channel just before the call); ``kept`` are spans inside it that are
    prose and stay (Mistral's junk after ``[TOOL_CALLS]``, harmony's final message).
    """

    family: str
    start: int
    end: int
    calls: tuple[NativeCall, ...]
    kept: tuple[tuple[int, int], ...] = ()

    @property
    def cuts(self) -> tuple[tuple[int, int], ...]:
        """The spans to remove from the text: the match less what it keeps."""
        spans = []
        position = self.start
        for keep_start, keep_end in sorted(self.kept):
            if keep_start > position:
                spans.append((position, keep_start))
            position = max(position, keep_end)
        if position < self.end:
            spans.append((position, self.end))
        return tuple(spans)


class Scanner:
    """The text under scan and the count of characters the recognisers examined."""

    __slots__ = ("_ends", "steps", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.steps = 0
        self._ends: dict[str, dict[int, int]] = {}

    def find(self, marker: str, start: int, stop: int | None = None) -> int:
        """``str.find``, counting the characters it passes over."""
        limit = len(self.text) if stop is None else stop
        found = self.text.find(marker, start, limit)
        self.steps += (found if found >= 0 else limit) - start + 1
        return found

    def finditer(self, pattern: re.Pattern[str], start: int = 0) -> Iterable[re.Match[str]]:
        """``pattern.finditer``, counting the characters between matches."""
        position = start
        for match in pattern.finditer(self.text, start):
            self.steps += match.end() - position + 1
            position = match.end()
            yield match
        self.steps += len(self.text) - position

    def count(self, characters: int) -> None:
        self.steps += characters

    def bracket_ends(self, quotes: str) -> dict[int, int]:
        """Where each bracket opened in the text closes (one pass, computed once per quote set).

        Quotes count only inside brackets: prose holds apostrophes.
        """
        cached = self._ends.get(quotes)
        if cached is not None:
            return cached
        ends: dict[int, int] = {}
        stack: list[int] = []
        token = _BRACKET_TOKENS[quotes]
        text = self.text
        position = 0
        while True:
            found = token.search(text, position)
            if found is None:
                self.steps += len(text) - position
                break
            self.steps += found.end() - position
            kind = found.group()
            position = found.end()
            if kind in quotes:
                if not stack:
                    continue
                rest = _STRING_REST[kind].match(text, position)
                if rest is None:
                    break  # an unterminated string: nothing after it closes
                self.steps += rest.end() - position
                position = rest.end()
            elif kind in "[({":
                stack.append(found.start())
            elif stack:
                ends[stack.pop()] = position
        self._ends[quotes] = ends
        return ends


_BRACKET_TOKENS = {
    '"': re.compile(r'[\[\](){}"]'),
    "\"'": re.compile(r"[\[\](){}\"']"),
}
_STRING_REST = {
    '"': re.compile(r'(?:[^"\\]|\\.)*"', re.DOTALL),
    "'": re.compile(r"(?:[^'\\]|\\.)*'", re.DOTALL),
}


class Malformed(Exception):
    """The text is not a readable call in this format."""


NOT_JSON: Any = object()


def loads(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return NOT_JSON


def call_objects(value: Any, name_keys: Sequence[str] = ("name",)) -> list[tuple[str, Any]] | None:
    """(name, arguments) per call object in a decoded JSON value (one object or a list of them)."""
    items = value if isinstance(value, list) else [value]
    if not items:
        return None
    calls = []
    for item in items:
        if not isinstance(item, dict):
            return None
        name = next((item[k] for k in name_keys if isinstance(item.get(k), str)), None)
        raw = item.get("arguments", item.get("parameters", NOT_JSON))
        if name is None:
            inner = item.get("function")
            if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                name, raw = inner["name"], inner.get("arguments", inner.get("parameters", {}))
        if name is None or raw is NOT_JSON:
            return None
        if isinstance(raw, str):
            decoded = loads(raw) if raw.strip() else {}
            raw = decoded if isinstance(decoded, dict) else raw
        if raw is None:
            raw = {}
        calls.append((name, raw))
    return calls


def declared(name: str, schemas: Schemas | None) -> bool:
    """For marker-less formats: a name is a call only when it is a declared tool."""
    return schemas is not None and name in schemas


def make_calls(pieces: Iterable[tuple[str, Any, int, int, bool]]) -> tuple[NativeCall, ...]:
    return tuple(NativeCall(n, a, s, e, sv) for n, a, s, e, sv in pieces)


SPACE = re.compile(r"\s*")


def skip_space(scanner: Scanner, position: int) -> int:
    end = SPACE.match(scanner.text, position)
    stop = end.end() if end else position
    scanner.count(stop - position)
    return stop


def json_at(scanner: Scanner, position: int) -> tuple[Any, int] | None:
    """The bracketed JSON value opening at ``position`` and its end, or None."""
    end = scanner.bracket_ends('"').get(position)
    if end is None:
        return None
    scanner.count(end - position)
    value = loads(scanner.text[position:end])
    return None if value is NOT_JSON else (value, end)


def grouped(
    scanner: Scanner,
    family: str,
    calls: Sequence[NativeCall],
    spans: Sequence[tuple[int, int]],
    outer: tuple[str, str] | None,
) -> list[NativeMatch]:
    """Adjacent calls (only whitespace between) form one match, with an enclosing wrapper."""
    text = scanner.text
    matches: list[NativeMatch] = []
    group: list[NativeCall] = []
    group_span = (0, 0)
    for call, span in zip(calls, spans, strict=True):
        if group and not text[group_span[1] : span[0]].strip():
            group.append(call)
            group_span = (group_span[0], span[1])
            continue
        if group:
            matches.append(_wrapped(text, family, group, group_span, outer))
        group, group_span = [call], span
    if group:
        matches.append(_wrapped(text, family, group, group_span, outer))
    return matches


def _wrapped(
    text: str,
    family: str,
    calls: Sequence[NativeCall],
    span: tuple[int, int],
    outer: tuple[str, str] | None,
) -> NativeMatch:
    start, end = span
    if outer is not None:
        opener, closer = outer
        before = text[:start].rstrip()
        if before.endswith(opener):
            start = len(before) - len(opener)
        after = SPACE.match(text, end).end()  # type: ignore[union-attr]
        if text.startswith(closer, after):
            end = after + len(closer)
    return NativeMatch(family, start, end, tuple(calls))
