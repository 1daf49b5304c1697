"""Gemma 4's and FunctionGemma's ``call:NAME{key:value}`` grammar (``<|"|>`` or ``<escape>``
quotes), with the markers around it and Gemma's thought channel before it."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from repairproxy.native.base import (
    MAX_DEPTH,
    MAX_MATCHES,
    NOT_JSON,
    SPACE,
    Malformed,
    NativeCall,
    NativeMatch,
    Scanner,
    Schemas,
    declared,
    loads,
)
from repairproxy.native.values import typed_value

__all__ = [
    "gemma_format",
    "gemma_may",
]

_GEMMA_BARE = re.compile(r"[^,}\]]*")
_GEMMA_KEY = re.compile(r"\s*([^:{}\[\],<]{1,200}?)\s*:")
_GEMMA_CALL = re.compile(r"(?:call:|<call>)([A-Za-z_][\w.\-]{0,200})\{")


def gemma_may(text: str, schemas: Schemas | None) -> bool:
    """Whether a Gemma call can be in ``text``: its head (``call:NAME{`` or ``<call>NAME{``)."""
    del schemas
    return _GEMMA_CALL.search(text) is not None


def _gemma_value(text: str, position: int, stop: int, quote: str, depth: int) -> tuple[Any, int]:
    """One value of Gemma's argument grammar, read within ``text[:stop]``."""
    if depth > MAX_DEPTH or position >= stop:
        raise Malformed
    if text.startswith(quote, position, stop):
        end = text.find(quote, position + len(quote), stop)
        if end < 0:
            raise Malformed
        return text[position + len(quote) : end], end + len(quote)
    if text[position] == "{":
        return _gemma_object(text, position, stop, quote, depth + 1)
    if text[position] == "[":
        items: list[Any] = []
        position += 1
        while True:
            position = _space_at(text, position, stop)
            if text.startswith("]", position, stop):
                return items, position + 1
            value, position = _gemma_value(text, position, stop, quote, depth + 1)
            items.append(value)
            position = _space_at(text, position, stop)
            if text.startswith(",", position, stop):
                position += 1
            elif not text.startswith("]", position, stop):
                raise Malformed
    bare = _GEMMA_BARE.match(text, position, stop)
    token = bare.group().strip() if bare is not None else ""
    if bare is None or not token or bare.end() >= stop:
        raise Malformed
    value = loads(token)
    return (token if value is NOT_JSON or isinstance(value, (dict, list)) else value), bare.end()


def _space_at(text: str, position: int, stop: int) -> int:
    found = SPACE.match(text, position, stop)
    return found.end() if found is not None else position


def _gemma_object(
    text: str, position: int, stop: int, quote: str, depth: int
) -> tuple[dict[str, Any], int]:
    """``{key:value,...}``: keys bare or quoted; FunctionGemma may omit the comma after a string."""
    result: dict[str, Any] = {}
    position += 1
    while True:
        position = _space_at(text, position, stop)
        if text.startswith("}", position, stop):
            return result, position + 1
        if text.startswith(quote, position, stop):
            key_end = text.find(quote, position + len(quote), stop)
            if key_end < 0 or not text.startswith(":", key_end + len(quote), stop):
                raise Malformed
            key = text[position + len(quote) : key_end]
            position = key_end + len(quote) + 1
        else:
            found = _GEMMA_KEY.match(text, position, stop)
            if found is None:
                raise Malformed
            key = found.group(1).strip()
            position = found.end()
        value, position = _gemma_value(text, position, stop, quote, depth)
        result[key] = value
        position = _space_at(text, position, stop)
        if text.startswith(",", position, stop):
            position += 1
        elif not text.startswith("}", position, stop) and not (
            isinstance(value, str) and text[position - len(quote) : position] == quote
        ):
            raise Malformed


def gemma_format(
    family: str, quote: str, openers: Sequence[str], closers: Sequence[str], *, bare: bool
) -> Callable[[Scanner, Schemas | None], list[NativeMatch]]:
    """``call:NAME{k:<|"|>v<|"|>,n:42}`` (Gemma 4) or with ``<escape>`` quotes (FunctionGemma)."""
    call = _GEMMA_CALL

    def recognise(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
        text = scanner.text
        if "call" not in text or "{" not in text:
            return []
        matches: list[NativeMatch] = []
        position = 0
        # Each call is read only up to where the next one starts: the reads never overlap.
        found_calls = list(scanner.finditer(call))
        for index, found in enumerate(found_calls):
            if found.start() < position or len(matches) >= MAX_MATCHES:
                continue
            limit = found_calls[index + 1].start() if index + 1 < len(found_calls) else len(text)
            start = found.start()
            prefix_start = _gemma_prefix(text, start, openers)
            if prefix_start is None:
                if not bare or (start and text[start - 1] not in "\n"):
                    continue
                prefix_start = start
            if text.startswith("<call>", start) and prefix_start == start and not bare:
                continue
            try:
                arguments, end = _gemma_object(text, found.end() - 1, limit, quote, 0)
            except (Malformed, IndexError):
                scanner.count(limit - found.end())
                continue
            scanner.count(end - found.end())
            name = found.group(1)
            arguments = _typed_strings(name, arguments, schemas)
            if (
                prefix_start == start
                and not text.startswith("<call>", start)
                and quote not in text[start:end]
            ) and not declared(name, schemas):
                continue  # bare ``call:x{...}`` without quotes or markers: only a declared tool
            stop = end
            for closer in closers:
                if text.startswith(closer, end):
                    stop = end + len(closer)
                    break
            prefix_start = _gemma_thought(text, prefix_start)
            matches.append(
                NativeMatch(family, prefix_start, stop, (NativeCall(name, arguments, start, end),))
            )
            position = stop
        return matches

    return recognise


def _typed_strings(name: str, arguments: dict[str, Any], schemas: Schemas | None) -> dict[str, Any]:
    """Quoted values the schema declares as another type (FunctionGemma quotes every value)."""
    schema = schemas.get(name) if schemas is not None else None
    properties = schema.get("properties") if schema is not None else None
    if not isinstance(properties, Mapping):
        return arguments
    return {
        key: typed_value(value, properties.get(key)) if isinstance(value, str) else value
        for key, value in arguments.items()
    }


def _gemma_prefix(text: str, start: int, openers: Sequence[str]) -> int | None:
    """Where the call's opening marker begins (``<|tool_call>``, ``<|tool_call>:``,
    ``<channel|>``)."""
    for opener in openers:
        for glue in ("", ":"):
            begin = start - len(opener) - len(glue)
            if begin >= 0 and text.startswith(opener + glue, begin):
                return begin
    if text.startswith("<call>", start):
        return start
    return None


_GEMMA_THOUGHT_OPEN = "<|channel>thought"


def _gemma_thought(text: str, start: int) -> int:
    """Gemma 4's thought channel right before the call (``<|channel>thought ... <channel|>``)."""
    if not text.startswith("<channel|>", start):
        return start
    begin = text.rfind(_GEMMA_THOUGHT_OPEN, 0, start)
    if begin >= 0 and "<|tool_call>" not in text[begin:start]:
        return begin
    return start
