"""Call shapes in an answer's text: found, parsed, each with its span; judged elsewhere.

Every shape the proxy recognises (bare JSON or a list of them, ``<tool_call>`` blocks, fenced
JSON, ``<function=NAME>`` XML, each model family's native format from ``repairproxy/native/``)
is found here by ``find_text_calls``, with where it sits and what it says. Whether a shape is a
call the model made is ``repairproxy.textcalls``'s question (the promotion-safety rules), kept
apart because those rules read prose, and these readers read structure.
"""

from __future__ import annotations

import enum
import functools
import importlib
import re
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "JSON_FENCE_LANGUAGES",
    "MAX_JSON_SCANS",
    "MAX_TEXT_CALLS",
    "Shape",
    "TextCall",
    "calls_in_value",
    "find_text_calls",
    "fresh_call_id",
    "json_value_end",
]

# Scanning free text for JSON values tries at most this many opening brackets (bounds the cost).
MAX_JSON_SCANS = 64
# A text holding more calls than this is not an answer an agent acts on; the rest are ignored.
MAX_TEXT_CALLS = 32


class Shape(enum.StrEnum):
    """How a call was written in the text."""

    JSON = "json"  # bare JSON object, or a list of them
    TAGGED = "tool_call_tag"  # <tool_call>...</tool_call> (hermes)
    FENCED = "fenced_json"  # ```json ... ```
    XML = "function_xml"  # <function=NAME><parameter=K>v</parameter></function>
    NATIVE = "native"  # a model family's own format (repairproxy/native/)


@dataclass(frozen=True, slots=True)
class TextCall:
    """One tool call found in text.

    ``arguments`` is a parsed JSON object when it could be read, the raw string when it could not
    (the call then has invalid JSON), or None when the call's body was unreadable. ``start`` and
    ``end`` delimit the text to cut when the call is promoted; calls written together in one JSON
    list or one ``<tool_call>`` block share their span. ``source`` is that text, verbatim.
    """

    name: str | None
    arguments: Any
    start: int
    end: int
    shape: Shape
    source: str
    string_values: bool = False  # XML parameters: every value came as text (see validation)
    family: str | None = None  # the native recogniser's label (``native.RECOGNISERS``), if any
    # What to cut when promoted, where it is not all of ``start:end``: a native match keeps some
    # prose inside its span (Mistral's text after ``[TOOL_CALLS]``, harmony's final message).
    cuts: tuple[tuple[int, int], ...] = ()


def fresh_call_id() -> str:
    """An id in OpenAI's style for a call the proxy made from text."""
    return "call_" + secrets.token_hex(12)


# --- reading call objects ------------------------------------------------------------------------


def _loads(text: str) -> Any:
    """orjson.loads, None for anything that is not JSON (orjson bounds the depth itself)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return _NOT_JSON


_NOT_JSON: Any = object()
_SPACE = frozenset(" \t\r\n")


def _doubled(text: str) -> Any:
    """The one object inside a doubled brace pair, ``{{"name": ..., "arguments": {...}}}``, else
    ``_NOT_JSON``.

    A chat template that writes its call example with Jinja-escaped braces (the Qwen2.5 GGUFs'
    ``{{"name": <function-name>, ...}}``) shows the model a doubled pair, and the model copies
    it: the object inside is its call. One pair only, around one object, nothing else inside.
    """
    stripped = text.strip()
    if len(stripped) < 4 or stripped[0] != "{" or stripped[-1] != "}":
        return _NOT_JSON
    # The pair's inner braces are checked before anything is copied: most text that fails to
    # parse as JSON is prose in braces, not a doubled call.
    first = 1
    while stripped[first] in _SPACE:
        first += 1
    last = len(stripped) - 2
    while last > first and stripped[last] in _SPACE:
        last -= 1
    if stripped[first] != "{" or stripped[last] != "}" or last == first:
        return _NOT_JSON
    value = _loads(stripped[first : last + 1])
    return value if isinstance(value, dict) else _NOT_JSON


def _loads_call(text: str) -> Any:
    """``_loads``, or the object a doubled brace pair wraps (``_doubled``)."""
    value = _loads(text)
    return _doubled(text) if value is _NOT_JSON else value


def _arguments_of(raw: Any) -> Any:
    """Arguments as the model wrote them: an object stays, a JSON string is decoded if it can be."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        decoded = _loads(raw) if raw.strip() else {}
        return decoded if isinstance(decoded, dict) else raw
    return raw


def _one_call(value: Any) -> tuple[str, Any] | None:
    """(name, arguments) when ``value`` is one call object in any known spelling, else None."""
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if isinstance(name, str) and ("arguments" in value or "parameters" in value):
        raw = value["arguments"] if "arguments" in value else value["parameters"]
        return name, _arguments_of(raw)
    for key in ("function", "function_call"):  # an OpenAI tool_calls entry; the legacy shape
        inner = value.get(key)
        if isinstance(inner, dict) and isinstance(inner.get("name"), str):
            raw = inner.get("arguments", inner.get("parameters"))
            return inner["name"], _arguments_of(raw)
    return None


def calls_in_value(value: Any) -> list[tuple[str, Any]] | None:
    """Every call in a decoded JSON value, or None when it is not a call shape.

    A call object, a non-empty list made only of call objects, or ``{"tool_calls": [...]}``.
    """
    single = _one_call(value)
    if single is not None:
        return [single]
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list) and len(value) <= 2:
        value = value["tool_calls"]
    if isinstance(value, list) and value:
        calls = [_one_call(item) for item in value]
        if all(call is not None for call in calls):
            return [call for call in calls if call is not None]
    return None


# --- finding JSON values in prose ----------------------------------------------------------------

_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|"|[\[\]{}]', re.DOTALL)


def json_value_end(text: str, start: int) -> int | None:
    """The end of the bracketed JSON value opening at ``start`` (brackets balanced), or None.

    Only brackets and strings are tracked, iteratively: no recursion, whatever the depth.
    """
    depth = 0
    for token in _JSON_TOKEN.finditer(text, start):
        kind = token.group()
        if kind == '"':
            return None  # an unterminated string
        if kind in "[{":
            depth += 1
        elif kind in "]}":
            depth -= 1
            if depth == 0:
                return token.end()
    return None


# Outside brackets only an opening one matters (prose may hold a stray ``"`` or ``}``); inside,
# one match skips every string and plain character up to the next bracket, and stops at a quote
# whose string never closes (or the end). Possessive: nothing is tried twice.
_OPENING = re.compile(r"[\[{]")
_TO_NEXT_BRACKET = re.compile(r'(?:[^"\[\]{}]++|"(?:[^"\\]|\\.)*+")*+([\[\]{}]?)', re.DOTALL)


def _bracket_ends(text: str, begin: int, stop: int) -> dict[int, int]:
    """Where each bracket opened in ``text[begin:stop]`` closes, in one pass (linear, iterative).

    Quotes count only inside brackets: prose may hold a stray ``"`` before a call.
    """
    ends: dict[int, int] = {}
    stack: list[int] = []
    position = begin
    while True:
        if not stack:
            opening = _OPENING.search(text, position, stop)
            if opening is None:
                return ends
            position = opening.end()
            stack.append(opening.start())
        token = _TO_NEXT_BRACKET.match(text, position, stop)
        bracket = token.group(1) if token is not None else ""  # (it always matches)
        if not bracket or token is None:
            return ends  # the end, or an unterminated string: nothing after it can close
        position = token.end()
        if bracket in "[{":
            stack.append(position - 1)
        else:
            ends[stack.pop()] = position


def _bare_json_calls(text: str, begin: int, stop: int) -> Iterable[TextCall]:
    # Most often the call ends the answer: when all from the first bracket to the end is one
    # call value, the pass below would read that value first and nothing after it.
    first = _OPENING.search(text, begin, stop)
    if first is None:
        return
    start = first.start()
    end = start + len(text[start:stop].rstrip())
    if text[end - 1] in "}]":
        value = _loads_call(text[start:end])
        calls = calls_in_value(value) if value is not _NOT_JSON else None
        if calls is not None:
            source = text[start:end]
            for name, arguments in calls:
                yield TextCall(name, arguments, start, end, Shape.JSON, source)
            return
    ends = _bracket_ends(text, begin, stop)
    consumed = begin
    scans = 0
    for start in sorted(ends):
        if start < consumed:
            continue  # inside a value already read
        if scans >= MAX_JSON_SCANS:
            return
        scans += 1
        end = ends[start]
        value = _loads_call(text[start:end])
        if value is _NOT_JSON:
            continue
        calls = calls_in_value(value)
        if calls is not None:
            source = text[start:end]
            for name, arguments in calls:
                yield TextCall(name, arguments, start, end, Shape.JSON, source)
        consumed = end


# --- tags, fences and XML ------------------------------------------------------------------------

_TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_FUNCTION_XML = re.compile(r"<function=([^>\s]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER = re.compile(
    r"<parameter=([^>\s]+)>(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|\Z)", re.DOTALL
)
_FENCED = re.compile(r"```[ \t]*([A-Za-z_]*)[ \t]*\n?(.*?)```", re.DOTALL)
# Fences whose language says JSON (or nothing): a stream opening one may be a call (streaming).
JSON_FENCE_LANGUAGES = frozenset({"", "json", "jsonc", "tool_call", "tool_code", "tool_calls"})
_NAME_FIELD = re.compile(r'"name"\s*:\s*"([^"\\]{1,200})"')


def _xml_calls(body: str, start: int, end: int, source: str) -> list[TextCall]:
    calls = []
    for match in _FUNCTION_XML.finditer(body):
        name, inner = match.group(1), match.group(2)
        arguments: Any
        string_values = False
        if "<parameter=" in inner:
            arguments = {key: _parameter_value(value) for key, value in _PARAMETER.findall(inner)}
            string_values = True
        elif not inner.strip():
            arguments = {}
        else:
            arguments = _arguments_of(inner.strip())
        calls.append(TextCall(name, arguments, start, end, Shape.XML, source, string_values))
    return calls


def _parameter_value(value: str) -> str:
    # Qwen3-Coder writes each value on its own line(s): drop that framing newline only.
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _tagged_calls(text: str) -> list[TextCall]:
    calls: list[TextCall] = []
    for match in _TAGGED.finditer(text):
        body = match.group(1).strip()
        start, end = match.span()
        source = match.group()
        if "<function=" in body:
            calls.extend(_xml_calls(body, start, end, source))
            continue
        value = _loads_call(body)
        found = calls_in_value(value) if value is not _NOT_JSON else None
        if found is not None:
            calls.extend(TextCall(n, a, start, end, Shape.TAGGED, source) for n, a in found)
            continue
        # A tag is a call even when its body is broken: keep the name when it can be read.
        name = _NAME_FIELD.search(body)
        calls.append(
            TextCall(name.group(1) if name else None, None, start, end, Shape.TAGGED, source)
        )
    return calls


def _fenced_calls(text: str, begin: int, stop: int) -> list[TextCall]:
    calls: list[TextCall] = []
    for match in _FENCED.finditer(text, begin, stop):
        value = _loads_call(match.group(2).strip())
        found = calls_in_value(value) if value is not _NOT_JSON else None
        if found is None:
            continue
        start, end = match.span()
        source = match.group()
        calls.extend(TextCall(n, a, start, end, Shape.FENCED, source) for n, a in found)
    return calls


def _gaps(spans: Sequence[tuple[int, int]], length: int) -> list[tuple[int, int]]:
    gaps = []
    position = 0
    for start, end in sorted(spans):
        if start > position:
            gaps.append((position, start))
        position = max(position, end)
    if position < length:
        gaps.append((position, length))
    return gaps


@functools.cache
def _native_recogniser() -> Callable[..., Iterable[Any]] | None:
    """The model families' native recognisers (``native.find_native_calls``), when installed."""
    try:
        module = importlib.import_module(f"{__package__}.native")
    except ModuleNotFoundError:
        return None
    found = getattr(module, "find_native_calls", None)
    return found if callable(found) else None


def _native_calls(text: str, tools: Mapping[str, Mapping[str, Any]] | None) -> list[TextCall]:
    """The native recognisers' matches as text calls: the calls of one match share its span."""
    native = _native_recogniser()
    if native is None:
        return []
    calls: list[TextCall] = []
    # The built-in readings cover bare and fenced JSON already; the native ``json`` reading adds
    # only calls joined by ``;`` (Llama 3), and the native fence only ``tool_name`` keys (Command
    # R+'s "Action:" fence), so each runs only where there is one.
    skip = _READ_BY_BUILT_INS
    if ";" in text:
        skip -= {"json"}
    if '"tool_name"' in text:
        skip -= {"fenced_json"}
    for match in native(text, tools, skip=skip):
        source = text[match.start : match.end]
        cuts = match.cuts if match.kept else ()
        calls.extend(
            TextCall(
                call.name,
                call.arguments,
                match.start,
                match.end,
                Shape.NATIVE,
                source,
                call.string_values,
                match.family,
                cuts,
            )
            for call in match.calls
        )
    return calls


# The native families whose calls the built-in readings find on their own (same spans): hermes
# ``<tool_call>`` JSON, fenced JSON, bare JSON.
_READ_BY_BUILT_INS = frozenset({"fenced_json", "hermes", "json"})


def find_text_calls(
    text: str, tools: Mapping[str, Mapping[str, Any]] | None = None
) -> tuple[TextCall, ...]:
    """Every call shape written in ``text``, in order of appearance (empty when there is none).

    The one entry point for every recogniser. Tags first (their bodies may hold anything), then
    ``<function=...>`` XML outside tags, fenced JSON, bare JSON in what is left; then each model
    family's native format (``native``, when present), which wins where it also spans the
    family's wrapper (``_merge_native``). JSON that is not a call shape is prose.
    ``tools`` (name -> parameters schema) lets a native format that writes every value as text
    type them. This finds shapes only: ``read_text_calls`` judges which ones are calls.
    """
    # Only Granite's bare ``name(...)`` lines, for a declared tool, need none of ``{<[``.
    if (
        "{" not in text
        and "<" not in text
        and "[" not in text
        and (tools is None or "(" not in text)
    ):
        return ()
    found: list[TextCall] = []
    if "<tool_call>" in text:
        found.extend(_tagged_calls(text))
    if "<function=" in text:
        for gap_start, gap_end in _gaps([(c.start, c.end) for c in found], len(text)):
            segment = text[gap_start:gap_end]
            for match in _FUNCTION_XML.finditer(segment):
                start, end = gap_start + match.start(), gap_start + match.end()
                found.extend(_xml_calls(match.group(), start, end, match.group()))
    if "```" in text:
        for gap_start, gap_end in _gaps([(c.start, c.end) for c in found], len(text)):
            found.extend(_fenced_calls(text, gap_start, gap_end))
    if "{" in text:
        for gap_start, gap_end in _gaps([(c.start, c.end) for c in found], len(text)):
            found.extend(_bare_json_calls(text, gap_start, gap_end))
    native = _native_calls(text, tools)
    if native:
        found = _merge_native(text, found, native, tools)
    found.sort(key=lambda call: call.start)
    return tuple(found[:MAX_TEXT_CALLS])


def _merge_native(
    text: str,
    found: Sequence[TextCall],
    native: Sequence[TextCall],
    tools: Mapping[str, Mapping[str, Any]] | None,
) -> list[TextCall]:
    """The built-in readings and the native ones, one reading per stretch of text.

    A native match spans its family's wrapper and every call inside it, so where it covers text
    the built-in readings it overlaps leave out (a marker, a separator), it wins: the wrapper is
    cut with the call, and calls written under one wrapper are promoted together. On the
    same span the built-in reading stays, unless it left every value a string that the native
    reading typed by the declared schema. An unreadable built-in reading (a tag with a broken
    body) gives way only to a native call that names a declared tool (``<tool_call>garbage``
    is not GLM's call to "garbage"). A built-in reading that covers more than the native one
    stays.
    """
    kept = list(found)
    for span, group in _by_span(native).items():
        start, end = span
        overlapping = [c for c in kept if c.start < end and start < c.end]
        if not overlapping:
            kept.extend(group)
            continue
        if not all(start <= c.start and c.end <= end for c in overlapping):
            continue  # a built-in reading reaches past the native match: it stays
        readable = all(c.name is not None and c.arguments is not None for c in overlapping)
        wider = bool(
            _without_spans(text[start:end], [(c.start - start, c.end - start) for c in overlapping])
        )
        typed = all(c.string_values for c in overlapping) and not any(
            c.string_values for c in group
        )
        if readable:
            wins = wider or typed
        else:
            wins = tools is not None and all(c.name in tools for c in group)
        if wins:
            kept = [c for c in kept if c not in overlapping] + list(group)
    return kept


def _by_span(calls: Iterable[TextCall]) -> dict[tuple[int, int], list[TextCall]]:
    groups: dict[tuple[int, int], list[TextCall]] = {}
    for call in calls:
        groups.setdefault((call.start, call.end), []).append(call)
    return groups


def _without_spans(text: str, spans: Iterable[tuple[int, int]]) -> str:
    pieces = []
    position = 0
    for start, end in sorted(set(spans)):
        pieces.append(text[position:start])
        position = max(position, end)
    pieces.append(text[position:])
    return "\n".join(piece.strip() for piece in pieces if piece.strip())
