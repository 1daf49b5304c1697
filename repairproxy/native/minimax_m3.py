"""MiniMax-M3: ``]<]minimax[>[`` before every tag the template writes; arguments as nested elements.

The template's ``to_xml`` macro writes a mapping as one element per key, a list as ``<item>``
elements, and a string as it is: a tag with no namespace token before it is part of a value (a
string holding HTML keeps it). Where the declared schema lets one element tree be read two ways
(a union with a string alternative, or two structured alternatives that both fit), the template
wrote both readings the same: the call cannot be read exactly, so its arguments stay the raw text
and validation reports the call instead of promoting either reading.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from repairproxy.native.base import (
    MAX_DEPTH,
    MAX_MATCHES,
    Malformed,
    NativeCall,
    NativeMatch,
    Scanner,
    Schemas,
)
from repairproxy.native.values import allowed_types, typed_value

__all__ = ["M3", "minimax_m3"]

M3 = "]<]minimax[>["
_TAG = re.compile(re.escape(M3) + r"<(/?)([A-Za-z_][\w.\-]{0,200})>")
_INVOKE = re.compile(re.escape(M3) + r'<invoke name="([^"]{1,200})">')
_INVOKE_CLOSE = M3 + "</invoke>"
_ITEM = "item"  # the element the template writes for each member of a list

# An element's content: its text, or its child elements as (tag, content) in order.
Tree = str | list[tuple[str, "Tree"]]


class _Unreadable(Exception):
    """The schema admits more than one reading of the elements: none is promoted."""


def minimax_m3(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """``]<]minimax[>[<tool_call>`` ... ``]<]minimax[>[</tool_call>`` holding ``<invoke>``s."""
    text = scanner.text
    opener, closer = M3 + "<tool_call>", M3 + "</tool_call>"
    matches: list[NativeMatch] = []
    position = 0
    while len(matches) < MAX_MATCHES:
        start = scanner.find(opener, position)
        if start < 0:
            break
        close = scanner.find(closer, start)
        if close < 0:
            break
        position = close + len(closer)
        body = text[start + len(opener) : close]
        scanner.count(close - start)
        calls = _invokes(body, schemas, start, position)
        if calls:
            matches.append(NativeMatch("minimax_m3", start, position, tuple(calls)))
    return matches


def _invokes(body: str, schemas: Schemas | None, start: int, end: int) -> list[NativeCall] | None:
    """The block's calls; where one cannot be read exactly (malformed elements, text between
    them, two readings) every call of the block keeps the raw text as its arguments, so the block
    stays claimed and reported, and no looser recogniser reads other values into it."""
    calls = []
    position = 0
    readable = True
    while True:
        opened = _INVOKE.search(body, position)
        if opened is None:
            break
        close = body.find(_INVOKE_CLOSE, opened.end())
        if close < 0:  # an invoke never closed inside a closed block: malformed
            calls.append(NativeCall(opened.group(1), "", start, end))
            readable, position = False, len(body)
            break
        readable = readable and not body[position : opened.start()].strip()
        name = opened.group(1)
        schema = schemas.get(name) if schemas is not None else None
        raw = body[opened.start() : close + len(_INVOKE_CLOSE)]
        try:
            tree = _elements(body, opened.end(), close, 0)
            if isinstance(tree, str) and tree.strip():
                raise Malformed  # text in the invoke outside any argument element
            arguments: Any = _typed(tree if isinstance(tree, list) else [], schema)
        except (Malformed, _Unreadable):
            arguments = raw
        calls.append(NativeCall(name, arguments, start, end))
        position = close + len(_INVOKE_CLOSE)
    if not calls:
        return None
    if not readable or body[position:].strip():
        return [NativeCall(call.name, body.strip(), start, end) for call in calls]
    return calls


def _elements(body: str, position: int, stop: int, depth: int) -> Tree:
    """The content of one element between ``position`` and ``stop``: its text as written, or its
    child elements (only blank text between them)."""
    if depth > MAX_DEPTH:
        raise Malformed
    children: list[tuple[str, Tree]] = []
    between: list[str] = []
    while True:
        tag = _TAG.search(body, position, stop)
        if tag is None:
            between.append(body[position:stop])
            break
        between.append(body[position : tag.start()])
        if tag.group(1):
            raise Malformed  # a closing tag with no opening one
        key = tag.group(2)
        close = _close(body, key, tag.end(), stop)
        children.append((key, _elements(body, tag.end(), close, depth + 1)))
        position = close + len(M3) + len(key) + 3
    if not children:
        return "".join(between)
    if "".join(between).strip():
        raise Malformed  # text mixed with elements: no reading is exact
    return children


def _close(body: str, key: str, position: int, stop: int) -> int:
    """Where the element ``key`` opened before ``position`` closes (same-named ones nest)."""
    depth = 1
    opening, closing = f"{M3}<{key}>", f"{M3}</{key}>"
    while True:
        next_close = body.find(closing, position, stop)
        if next_close < 0:
            raise Malformed
        next_open = body.find(opening, position, next_close)
        if next_open >= 0:
            depth += 1
            position = next_open + len(opening)
            continue
        depth -= 1
        if depth == 0:
            return next_close
        position = next_close + len(closing)


def _typed(tree: Tree, schema: Any) -> Any:
    """An element's content typed by its schema: text as the schema's scalar, children as its
    structure (under a union, as the one alternative they fit)."""
    if isinstance(tree, str):
        return typed_value(tree, schema) if allowed_types(schema) else tree
    options = _alternatives(schema)
    if any("string" in allowed_types(option) for option in options):
        raise _Unreadable  # a string may hold this markup as it is: two readings
    if len(options) <= 1:
        return _structured(tree, options[0] if options else None)
    readings: dict[bytes, Any] = {}
    for option in options:
        reading = _fitted(tree, option)
        if reading is not None:
            readings.setdefault(orjson.dumps(reading, option=orjson.OPT_SORT_KEYS), reading)
    if len(readings) != 1:
        raise _Unreadable
    return next(iter(readings.values()))


def _alternatives(schema: Any) -> list[Mapping[str, Any]]:
    """The schema's alternatives, one per ``anyOf``/``oneOf`` member or listed type (flattened);
    none for a schema that says nothing about types."""
    if not isinstance(schema, Mapping) or not allowed_types(schema):
        return []
    members = [
        member
        for key in ("anyOf", "oneOf")
        if isinstance(schema.get(key), list)
        for member in schema[key]
    ]
    options = [option for member in members for option in _alternatives(member)]
    if options:
        return options
    kind = schema.get("type")
    if isinstance(kind, list):
        return [{**schema, "type": k} for k in kind if isinstance(k, str)]
    return [schema]


def _structured(children: list[tuple[str, Tree]], option: Mapping[str, Any] | None) -> Any:
    """The children as the one structure ``option`` admits (a list, else an object); what fits
    the schema is validation's business."""
    kinds = allowed_types(option)
    if option is not None and "array" in kinds and "object" not in kinds:
        return [_typed(child, option.get("items")) for _, child in children]
    properties = option.get("properties") if option is not None else None
    return _as_object(children, properties if isinstance(properties, Mapping) else None)


def _fitted(children: list[tuple[str, Tree]], option: Mapping[str, Any]) -> Any:
    """The children read as ``option`` (a list of ``<item>``s, or an object whose keys it
    declares and whose required keys are all there); None when they do not fit it."""
    kinds = allowed_types(option)
    if "array" in kinds and all(key == _ITEM for key, _ in children):
        return [_typed(child, option.get("items")) for _, child in children]
    if "object" not in kinds:
        return None
    properties = option.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    keys = {key for key, _ in children}
    required = option.get("required")
    if isinstance(required, list) and not set(required) <= keys:
        return None
    if properties and not keys <= set(properties):
        return None
    return _as_object(children, properties)


def _as_object(children: list[tuple[str, Tree]], properties: Mapping[str, Any] | None) -> Any:
    """The children as an object; a key written several times collects its values in a list."""
    result: dict[str, Any] = {}
    for key, child in children:
        typed = _typed(child, properties.get(key) if properties else None)
        if key in result:
            previous = result[key]
            result[key] = (previous if isinstance(previous, list) else [previous]) + [typed]
        else:
            result[key] = typed
    return result
