"""Tool calls in an open model family's own format, read when the server's parser missed them.

A model server with no (or the wrong) tool parser, a malformed variant, or a quantized model
drifting from its template leaves the call in ``content`` in the family's native text: Gemma 4's
``<|tool_call>call:NAME{...}``, pythonic lists, gpt-oss harmony channels, DeepSeek's and Kimi's
special tokens, GLM's ``<arg_key>``, MiniMax's and Step-3's ``<invoke>``, Mistral's
``[TOOL_CALLS]``...
Each format has one recogniser (``RECOGNISERS``: family label -> recogniser); each returns typed
matches: the family, the span to cut (the wrapper included, so no marker stays in ``content``),
and the calls with arguments typed by the declared schema where the format writes every value as
text. Marker-stripped variants (a server that drops special tokens from ``content``) are read where
they stay unambiguous, mostly by requiring the name to be a declared tool.

Detection is linear in the text: every recogniser finds its markers with forward searches that never
revisit text, and ``Scanner.steps`` counts the characters examined (tests hold it to that).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson

__all__ = [
    "FAMILIES",
    "RECOGNISERS",
    "NativeCall",
    "NativeMatch",
    "Scanner",
    "find_native_calls",
    "opening_markers",
    "promoted_format",
    "typed_value",
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


# --- values ------------------------------------------------------------------------------------


class _Malformed(Exception):
    """The text is not a readable call in this format."""


_NOT_JSON: Any = object()


def _loads(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return _NOT_JSON


def _allowed_types(spec: Any) -> set[str]:
    """The JSON types a property schema admits (``type``, a list of them, ``anyOf``/``oneOf``)."""
    if not isinstance(spec, Mapping):
        return set()
    kinds: set[str] = set()
    kind = spec.get("type")
    if isinstance(kind, str):
        kinds.add(kind)
    elif isinstance(kind, list):
        kinds.update(k for k in kind if isinstance(k, str))
    for key in ("anyOf", "oneOf"):
        options = spec.get(key)
        if isinstance(options, list):
            for option in options:
                kinds |= _allowed_types(option)
    if not kinds and "enum" in spec and isinstance(spec["enum"], list):
        kinds.update("string" if isinstance(v, str) else "number" for v in spec["enum"])
    if not kinds and ("properties" in spec):
        kinds.add("object")
    return kinds


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def typed_value(raw: str, spec: Any) -> Any:
    """A value the format wrote as text, typed by its property schema (as vLLM's XML parsers do).

    A string property keeps the text; otherwise the text is read as JSON (then as a Python
    literal: ``True``, ``None``, single quotes) when that gives a type the schema admits.
    """
    kinds = _allowed_types(spec)
    if not kinds or kinds == {"string"}:
        return raw
    text = raw.strip()
    value = _loads(text)
    if value is _NOT_JSON and _INTEGER.fullmatch(text) and kinds & {"integer", "number"}:
        return int(text)  # a leading zero (``018956``) is not JSON but is the number
    if value is _NOT_JSON:
        value = _python_literal(text)
    if value is not _NOT_JSON:
        kind = _json_kind(value)
        if kind in kinds or (kind == "integer" and "number" in kinds):
            return value
        if kind == "number" and "integer" in kinds and float(value).is_integer():
            return int(value)
    return raw


_INTEGER = re.compile(r"-?\d{1,40}")


def _python_literal(text: str) -> Any:
    try:
        node = ast.parse(text, mode="eval").body
        return _literal(node, 0)
    except (SyntaxError, ValueError, RecursionError, MemoryError, _Malformed):
        return _NOT_JSON


_NAMED_CONSTANTS = {"True": True, "False": False, "None": None, "true": True, "false": False}
_NAMED_CONSTANTS["null"] = None


def _literal(node: ast.expr, depth: int) -> Any:
    """A Python (or JSON-spelled) literal as a JSON value; sets and tuples become lists."""
    if depth > MAX_DEPTH:
        raise _Malformed
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
            return value
        if isinstance(value, float) and math.isfinite(value):
            return value
        raise _Malformed  # bytes, complex, inf
    if isinstance(node, ast.Name) and node.id in _NAMED_CONSTANTS:
        return _NAMED_CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _literal(node.operand, depth + 1)
        if isinstance(inner, bool) or not isinstance(inner, (int, float)):
            raise _Malformed
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_literal(item, depth + 1) for item in node.elts]
    if isinstance(node, ast.Dict):
        result: dict[str, Any] = {}
        for key_node, value_node in zip(node.keys, node.values, strict=True):
            if key_node is None:
                raise _Malformed
            name = _literal(key_node, depth + 1)
            if not isinstance(name, (str, int, float)) or isinstance(name, bool):
                raise _Malformed
            result[str(name)] = _literal(value_node, depth + 1)
        return result
    raise _Malformed


def _typed_arguments(
    name: str, arguments: dict[str, str], schemas: Schemas | None
) -> tuple[dict[str, Any], bool]:
    """Text values typed by ``name``'s schema; ``(arguments, True)`` untyped when no schema."""
    schema = schemas.get(name) if schemas is not None else None
    if schema is None:
        return dict(arguments), True
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    return {key: typed_value(value, properties.get(key)) for key, value in arguments.items()}, False


def _call_objects(value: Any, name_keys: Sequence[str] = ("name",)) -> list[tuple[str, Any]] | None:
    """(name, arguments) per call object in a decoded JSON value (one object or a list of them)."""
    items = value if isinstance(value, list) else [value]
    if not items:
        return None
    calls = []
    for item in items:
        if not isinstance(item, dict):
            return None
        name = next((item[k] for k in name_keys if isinstance(item.get(k), str)), None)
        raw = item.get("arguments", item.get("parameters", _NOT_JSON))
        if name is None:
            inner = item.get("function")
            if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                name, raw = inner["name"], inner.get("arguments", inner.get("parameters", {}))
        if name is None or raw is _NOT_JSON:
            return None
        if isinstance(raw, str):
            decoded = _loads(raw) if raw.strip() else {}
            raw = decoded if isinstance(decoded, dict) else raw
        if raw is None:
            raw = {}
        calls.append((name, raw))
    return calls


def _declared(name: str, schemas: Schemas | None) -> bool:
    """For marker-less formats: a name is a call only when it is a declared tool."""
    return schemas is not None and name in schemas


def _make_calls(pieces: Iterable[tuple[str, Any, int, int, bool]]) -> tuple[NativeCall, ...]:
    return tuple(NativeCall(n, a, s, e, sv) for n, a, s, e, sv in pieces)


# --- JSON after a marker -----------------------------------------------------------------------

_SPACE = re.compile(r"\s*")


def _skip_space(scanner: Scanner, position: int) -> int:
    end = _SPACE.match(scanner.text, position)
    stop = end.end() if end else position
    scanner.count(stop - position)
    return stop


def _json_at(scanner: Scanner, position: int) -> tuple[Any, int] | None:
    """The bracketed JSON value opening at ``position`` and its end, or None."""
    end = scanner.bracket_ends('"').get(position)
    if end is None:
        return None
    scanner.count(end - position)
    value = _loads(scanner.text[position:end])
    return None if value is _NOT_JSON else (value, end)


def _marker_json(
    family: str,
    opener: str,
    closer: str | None,
    *,
    name_keys: Sequence[str] = ("name",),
    lists_only: bool = False,
) -> Callable[[Scanner, Schemas | None], list[NativeMatch]]:
    """A format that writes ``opener`` then a JSON call object or list (then ``closer``)."""

    def recognise(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
        del schemas
        matches: list[NativeMatch] = []
        position = 0
        while len(matches) < MAX_MATCHES:
            start = scanner.find(opener, position)
            if start < 0:
                break
            body = _skip_space(scanner, start + len(opener))
            position = start + len(opener)
            if body >= len(scanner.text) or scanner.text[body] not in "[{":
                continue
            if lists_only and scanner.text[body] != "[":
                continue
            read = _json_at(scanner, body)
            if read is None:
                continue
            value, end = read
            calls = _call_objects(value, name_keys)
            if calls is None:
                continue
            stop = end
            if closer is not None:
                after = _skip_space(scanner, end)
                if scanner.text.startswith(closer, after):
                    stop = after + len(closer)
            matches.append(
                NativeMatch(
                    family, start, stop, _make_calls((n, a, body, end, False) for n, a in calls)
                )
            )
            position = stop
        return matches

    return recognise


def _llama3_json(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """Bare JSON call objects (Llama 3) or lists of them (xLAM, marker-stripped Granite and
    Phi-4-mini), several joined by ``;``: the separators go too."""
    del schemas
    text = scanner.text
    if '"name"' not in text:
        return []
    ends = scanner.bracket_ends('"')
    matches: list[NativeMatch] = []
    group: list[NativeCall] = []
    group_start = group_end = -1
    consumed = 0
    for start in sorted(ends):
        if start < consumed or text[start] == "(":
            continue
        end = ends[start]
        consumed = end
        scanner.count(end - start)
        value = _loads(text[start:end])
        calls = _call_objects(value) if value is not _NOT_JSON else None
        if calls is None:
            continue
        between = text[group_end:start] if group else ""
        if group and between.strip() in ("", ";"):
            group.extend(NativeCall(n, a, start, end) for n, a in calls)
            group_end = end
            continue
        if group:
            matches.append(NativeMatch("json", group_start, group_end, tuple(group)))
        group = [NativeCall(n, a, start, end) for n, a in calls]
        group_start, group_end = start, end
    if group:
        matches.append(NativeMatch("json", group_start, group_end, tuple(group)))
    return matches[:MAX_MATCHES]


_FENCE = re.compile(r"```[ \t]*(?:json|tool_calls?|tool_code)?[ \t]*\n")


def _fenced_json(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """A JSON code fence holding a call object or list (the fence is the wrapper)."""
    del schemas
    matches: list[NativeMatch] = []
    position = 0
    text = scanner.text
    while len(matches) < MAX_MATCHES:
        start = scanner.find("```", position)
        if start < 0:
            break
        opened = _FENCE.match(text, start)
        close = scanner.find("```", start + 3)
        if close < 0:
            break
        position = close + 3
        if opened is None:
            continue
        body = _skip_space(scanner, opened.end())
        read = _json_at(scanner, body) if body < close and text[body] in "[{" else None
        if read is None or text[read[1] : close].strip():
            continue
        calls = _call_objects(read[0])
        if calls is None:
            continue
        matches.append(
            NativeMatch(
                "fenced_json",
                start,
                close + 3,
                _make_calls((n, a, body, read[1], False) for n, a in calls),
            )
        )
    return matches


def _apertus(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """``<|tools_prefix|>[{"NAME": {args}}, ...]<|tools_suffix|>``; a cut-off list is closed."""
    del schemas
    opener, closer = "<|tools_prefix|>", "<|tools_suffix|>"
    text = scanner.text
    matches: list[NativeMatch] = []
    position = 0
    while len(matches) < MAX_MATCHES:
        start = scanner.find(opener, position)
        if start < 0:
            break
        body = _skip_space(scanner, start + len(opener))
        close = scanner.find(closer, body)
        stop = close if close >= 0 else len(text)
        position = stop
        scanner.count(stop - body)
        value = _loads(text[body:stop].strip())
        if value is _NOT_JSON:
            value = _loads(_closed_json(text[body:stop].strip()))
        if not isinstance(value, list) or not value:
            continue
        calls = []
        for item in value:
            if isinstance(item, dict) and len(item) == 1:
                ((name, arguments),) = item.items()
                if isinstance(arguments, dict):
                    calls.append(NativeCall(name, arguments, body, stop))
                    continue
            calls = []
            break
        if calls:
            end = close + len(closer) if close >= 0 else len(text)
            matches.append(NativeMatch("apertus", start, end, tuple(calls)))
            position = end
    return matches


def _closed_json(text: str) -> str:
    """A cut-off JSON value closed: the brackets still open are closed in order."""
    stack: list[str] = []
    in_string = escaped = False
    for character in text:
        if in_string:
            if escaped:
                escaped = False
            elif character == "\\":
                escaped = True
            elif character == '"':
                in_string = False
        elif character == '"':
            in_string = True
        elif character in "[{":
            stack.append("]" if character == "[" else "}")
        elif character in "]}" and stack:
            stack.pop()
    if in_string:
        return text
    return text + "".join(reversed(stack))


_COHERE_THINKING = re.compile(r"<\|START_THINKING\|>.*?<\|END_THINKING\|>\s*\Z", re.DOTALL)


def _cohere(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """Command R+/A: ``<|START_ACTION|>[{"tool_name": ..., "parameters": ...}]<|END_ACTION|>``."""
    found = _marker_json(
        "cohere_command", "<|START_ACTION|>", "<|END_ACTION|>", name_keys=("tool_name", "name")
    )(scanner, schemas)
    return [
        _with_reasoning_before(scanner, m, "<|START_THINKING|>", _COHERE_THINKING) for m in found
    ]


def _with_reasoning_before(
    scanner: Scanner, match: NativeMatch, opener: str, block: re.Pattern[str]
) -> NativeMatch:
    """The family's own reasoning channel right before its call belongs to the call's wrapper."""
    text = scanner.text
    begin = text.rfind(opener, 0, match.start)
    if begin < 0:
        return match
    scanner.count(match.start - begin)
    if block.fullmatch(text, begin, match.start) is None and block.match(text, begin) is None:
        return match
    found = block.match(text, begin, match.start)
    if found is None or found.end() != match.start:
        return match
    return NativeMatch(match.family, begin, match.end, match.calls, match.kept)


# --- XML-like parameter formats ---------------------------------------------------------------


def _invoke_format(
    family: str,
    prefix: str,
    wrappers: Sequence[tuple[str, str]],
    *,
    bare: bool,
    string_attribute: bool = False,
) -> Callable[[Scanner, Schemas | None], list[NativeMatch]]:
    """``<PREFIXinvoke name="N"><PREFIXparameter name="K">v</PREFIXparameter></PREFIXinvoke>``.

    MiniMax-M2 (no prefix), Step-3 (``steptml:``), DeepSeek V3.2/V4 DSML (``｜DSML｜``, with a
    ``string="true|false"`` attribute saying whether the value is text or JSON). The block is
    wrapped in one of ``wrappers``; ``bare`` reads unwrapped invokes too (marker-stripped text).
    """
    invoke_open = re.compile(r"<" + re.escape(prefix) + r'invoke\s+name="([^"]{1,200})"\s*>')
    invoke_close = "</" + prefix + "invoke>"
    parameter = re.compile(
        r"<"
        + re.escape(prefix)
        + r'parameter\s+name="([^"]{1,200})"(?:\s+string="(true|false)")?\s*>'
    )
    parameter_close = "</" + prefix + "parameter>"

    def invokes(
        scanner: Scanner, begin: int, stop: int, schemas: Schemas | None
    ) -> list[NativeCall] | None:
        text = scanner.text
        calls: list[NativeCall] = []
        position = begin
        while True:
            opened = invoke_open.search(text, position, stop)
            if opened is None:
                scanner.count(stop - position)
                break
            gap = text[position : opened.start()]
            if (
                calls
                and gap.strip()
                not in (
                    "",
                    "<｜tool_call_end｜><｜tool_sep｜><｜tool_call_begin｜>",
                )
                and not _only_markers(gap)
            ):
                break
            scanner.count(opened.end() - position)
            close = scanner.find(invoke_close, opened.end(), stop)
            if close < 0:
                return None
            raw: dict[str, str] = {}
            strings: dict[str, bool] = {}
            inner = opened.end()
            while True:
                param = parameter.search(text, inner, close)
                if param is None:
                    break
                end = scanner.find(parameter_close, param.end(), close)
                if end < 0:
                    return None
                raw[param.group(1)] = text[param.end() : end]
                strings[param.group(1)] = param.group(2) != "false"
                inner = end + len(parameter_close)
            name = opened.group(1)
            if string_attribute:
                arguments = _dsml_arguments(name, raw, strings, schemas)
                untyped = False
            else:
                arguments, untyped = _typed_arguments(name, raw, schemas)
            calls.append(
                NativeCall(name, arguments, opened.start(), close + len(invoke_close), untyped)
            )
            position = close + len(invoke_close)
        return calls

    def recognise(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
        text = scanner.text
        matches: list[NativeMatch] = []
        covered: list[tuple[int, int]] = []
        for opener, closer in wrappers:
            position = 0
            while len(matches) < MAX_MATCHES:
                start = scanner.find(opener, position)
                if start < 0:
                    break
                close = scanner.find(closer, start + len(opener))
                stop = close if close >= 0 else len(text)
                position = stop
                calls = invokes(scanner, start + len(opener), stop, schemas)
                if not calls:
                    continue
                end = close + len(closer) if close >= 0 else calls[-1].end
                head = _step_header(text, start + len(opener), calls[0].start, calls[0].name)
                lead = text[start + len(opener) : calls[0].start]
                if head is None and lead.strip() and not _only_markers(lead):
                    continue
                matches.append(NativeMatch(family, start, end, tuple(calls)))
                covered.append((start, end))
                position = end
        if bare and prefix + "invoke" in text:
            position = 0
            while len(matches) < MAX_MATCHES:
                start = scanner.find("<" + prefix + "invoke", position)
                if start < 0:
                    break
                if any(s <= start < e for s, e in covered):
                    position = start + 1
                    continue
                read = invokes(scanner, start, len(text), schemas)
                if read is None:
                    break  # an invoke never closed: no later one closes either
                if not read:
                    position = start + 1
                    continue
                calls = read
                begin = start
                stripped = _STEP_STRIPPED_HEAD.search(text, max(0, start - 220), start)
                if stripped and stripped.end() == start and stripped.group(1) == calls[0].name:
                    begin = stripped.start()
                matches.append(NativeMatch(family, begin, calls[-1].end, tuple(calls)))
                position = calls[-1].end
        return matches

    return recognise


def _dsml_arguments(
    name: str, raw: Mapping[str, str], strings: Mapping[str, bool], schemas: Schemas | None
) -> dict[str, Any]:
    """DSML values: ``string="true"`` is text, ``"false"`` JSON; the schema has the last word.

    A lone ``arguments``/``input`` parameter the schema does not declare, holding an object, is
    a wrapper the model added around the real arguments.
    """
    schema = schemas.get(name) if schemas is not None else None
    properties = schema.get("properties") if schema is not None else None
    properties = properties if isinstance(properties, Mapping) else {}
    arguments: dict[str, Any] = {}
    for key, value in raw.items():
        spec = properties.get(key)
        if strings[key]:
            arguments[key] = typed_value(value, spec) if spec is not None else value
        else:
            decoded = _loads(value.strip())
            arguments[key] = typed_value(value, spec) if decoded is _NOT_JSON else decoded
    if len(arguments) == 1 and schema is not None:
        ((key, value),) = arguments.items()
        if key in ("arguments", "input") and key not in properties:
            inner = _loads(value) if isinstance(value, str) else value
            if isinstance(inner, dict):
                return inner
    return arguments


_STEP_HEAD = re.compile(r"\s*(?:<｜tool_call_begin｜>)?\s*function<｜tool_sep｜>([^\s<]+)\s*")
_STEP_STRIPPED_HEAD = re.compile(r"function([A-Za-z_][\w.\-]*)\n")
_MARKER = re.compile(r"\s*(?:<｜[^｜]{1,40}｜>|<\|[^|]{1,40}\|>)\s*")


def _only_markers(gap: str) -> bool:
    """Between calls: nothing but special-token markers and whitespace."""
    position = 0
    while position < len(gap):
        found = _MARKER.match(gap, position)
        if found is None or found.end() == position:
            return not gap[position:].strip()
        position = found.end()
    return True


def _step_header(text: str, begin: int, stop: int, name: str) -> str | None:
    found = _STEP_HEAD.match(text, begin, stop)
    if found is not None and found.end() == stop and found.group(1) == name:
        return found.group(1)
    return None


# --- Qwen3 XML, GLM, Hunyuan v3 ----------------------------------------------------------------

_FUNCTION_OPEN = re.compile(r"<function=([^>\s]{1,200})>")
_PARAMETER_OPEN = re.compile(r"<parameter=([^>\s]{1,200})>")


def _function_xml_body(
    scanner: Scanner, begin: int, stop: int, schemas: Schemas | None
) -> list[NativeCall] | None:
    """``<function=N><parameter=K>v</parameter>...</function>`` calls in ``text[begin:stop]``."""
    text = scanner.text
    calls = []
    position = begin
    while True:
        opened = _FUNCTION_OPEN.search(text, position, stop)
        if opened is None:
            scanner.count(stop - position)
            break
        if text[position : opened.start()].strip():
            return None
        scanner.count(opened.end() - position)
        close = scanner.find("</function>", opened.end(), stop)
        end = close if close >= 0 else stop
        raw: dict[str, str] = {}
        params = list(_PARAMETER_OPEN.finditer(text, opened.end(), end))
        scanner.count(end - opened.end())
        if not params and text[opened.end() : end].strip():
            return None
        for index, param in enumerate(params):
            limit = params[index + 1].start() if index + 1 < len(params) else end
            value_end = text.find("</parameter>", param.end(), limit)
            value = text[param.end() : value_end if value_end >= 0 else limit]
            if value_end < 0:
                value = value.rstrip()
            if value.startswith("\n"):
                value = value[1:]
            if value.endswith("\n"):
                value = value[:-1]
            raw[param.group(1)] = value
        name = opened.group(1)
        arguments, untyped = _typed_arguments(name, raw, schemas)
        after = close + len("</function>") if close >= 0 else stop
        calls.append(NativeCall(name, arguments, opened.start(), after, untyped))
        position = after
        if close < 0:
            break
    return calls


def _inside(scanner: Scanner, position: int, block: tuple[str, str]) -> bool:
    """Whether ``position`` lies inside an open ``block`` (the family's reasoning tags)."""
    opened = scanner.text.rfind(block[0], 0, position)
    if opened < 0:
        return False
    return scanner.text.find(block[1], opened, position) < 0


def _tagged_xml(
    family: str, opener: str, closer: str, thinking: tuple[str, str] | None = None
) -> Callable[[Scanner, Schemas | None], list[NativeMatch]]:
    """Qwen3-Coder / Qwen3 XML / Step-3.5 / Seed-OSS: function XML inside a tag.

    A call inside the family's own reasoning block (``<seed:think>``) is the model thinking
    about the call, not making it.
    """

    def recognise(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
        text = scanner.text
        matches: list[NativeMatch] = []
        position = 0
        while len(matches) < MAX_MATCHES:
            start = scanner.find(opener, position)
            if start < 0:
                break
            close = scanner.find(closer, start + len(opener))
            stop = close if close >= 0 else len(text)
            position = stop
            calls = _function_xml_body(scanner, start + len(opener), stop, schemas)
            if not calls or (thinking is not None and _inside(scanner, start, thinking)):
                continue
            end = close + len(closer) if close >= 0 else len(text)
            matches.append(NativeMatch(family, start, end, tuple(calls)))
            position = end
        return matches

    return recognise


_THINKING = (("<think>", "</think>"), ("<seed:think>", "</seed:think>"))


def _bare_function_xml(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """``<function=N>...</function>`` without its ``<tool_call>`` (marker-stripped Qwen3)."""
    matches: list[NativeMatch] = []
    position = 0
    while len(matches) < MAX_MATCHES:
        start = scanner.find("<function=", position)
        if start < 0:
            break
        close = scanner.find("</function>", start)
        stop = close + len("</function>") if close >= 0 else len(scanner.text)
        calls = _function_xml_body(scanner, start, stop, schemas)
        position = stop
        if calls and not any(_inside(scanner, start, block) for block in _THINKING):
            matches.append(NativeMatch("qwen3_xml", start, calls[-1].end, tuple(calls)))
    return matches


_GLM_NAME = re.compile(r"\s*([A-Za-z_][\w.\-]{0,200})\s*")
_ARG_KEY = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>", re.DOTALL)


def _glm_body(
    scanner: Scanner, begin: int, stop: int, schemas: Schemas | None, separator: str
) -> NativeCall | None:
    """``NAME[<tool_sep>]<arg_key>k</arg_key><arg_value>v</arg_value>...`` up to ``stop``."""
    text = scanner.text
    named = _GLM_NAME.match(text, begin, stop)
    if named is None:
        return None
    position = named.end()
    if separator:
        if not text.startswith(separator, position):
            return None
        position = _SPACE.match(text, position + len(separator)).end()  # type: ignore[union-attr]
    elif text.startswith("<tool_sep>", position):
        return None
    raw: dict[str, str] = {}
    while position < stop:
        key = _ARG_KEY.match(text, position, stop)
        if key is None:
            break
        value_end = scanner.find("</arg_value>", key.end(), stop)
        if value_end < 0:
            return None
        raw[key.group(1).strip()] = text[key.end() : value_end]
        scanner.count(value_end - position)
        position = _SPACE.match(text, value_end + len("</arg_value>")).end()  # type: ignore[union-attr]
    if text[position:stop].strip():
        return None
    name = named.group(1)
    arguments, untyped = _typed_arguments(name, raw, schemas)
    return NativeCall(name, arguments, begin, stop, untyped)


def _glm_format(
    family: str, separator: str, outer: tuple[str, str] | None
) -> Callable[[Scanner, Schemas | None], list[NativeMatch]]:
    """GLM 4.5/4.7 (``<tool_call>NAME<arg_key>...``) and Hunyuan v3 (``NAME<tool_sep>...``)."""

    def recognise(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
        text = scanner.text
        if separator and separator not in text:
            return []
        if "<arg_key>" not in text and not separator and "<tool_call>" not in text:
            return []
        calls: list[NativeCall] = []
        spans: list[tuple[int, int]] = []
        position = 0
        while len(calls) < MAX_MATCHES:
            start = scanner.find("<tool_call>", position)
            if start < 0:
                break
            close = scanner.find("</tool_call>", start)
            if close < 0:
                break
            position = close + len("</tool_call>")
            call = _glm_body(scanner, start + len("<tool_call>"), close, schemas, separator)
            if call is None:
                continue
            calls.append(call)
            spans.append((start, position))
        return _grouped(scanner, family, calls, spans, outer)

    return recognise


def _grouped(
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
        after = _SPACE.match(text, end).end()  # type: ignore[union-attr]
        if text.startswith(closer, after):
            end = after + len(closer)
    return NativeMatch(family, start, end, tuple(calls))


# --- Gemma 4 and FunctionGemma -----------------------------------------------------------------

_GEMMA_BARE = re.compile(r"[^,}\]]*")
_GEMMA_KEY = re.compile(r"\s*([^:{}\[\],<]{1,200}?)\s*:")


def _gemma_value(text: str, position: int, stop: int, quote: str, depth: int) -> tuple[Any, int]:
    """One value of Gemma's argument grammar, read within ``text[:stop]``."""
    if depth > MAX_DEPTH or position >= stop:
        raise _Malformed
    if text.startswith(quote, position, stop):
        end = text.find(quote, position + len(quote), stop)
        if end < 0:
            raise _Malformed
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
                raise _Malformed
    bare = _GEMMA_BARE.match(text, position, stop)
    token = bare.group().strip() if bare is not None else ""
    if bare is None or not token or bare.end() >= stop:
        raise _Malformed
    value = _loads(token)
    return (token if value is _NOT_JSON or isinstance(value, (dict, list)) else value), bare.end()


def _space_at(text: str, position: int, stop: int) -> int:
    found = _SPACE.match(text, position, stop)
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
                raise _Malformed
            key = text[position + len(quote) : key_end]
            position = key_end + len(quote) + 1
        else:
            found = _GEMMA_KEY.match(text, position, stop)
            if found is None:
                raise _Malformed
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
            raise _Malformed


def _gemma_format(
    family: str, quote: str, openers: Sequence[str], closers: Sequence[str], *, bare: bool
) -> Callable[[Scanner, Schemas | None], list[NativeMatch]]:
    """``call:NAME{k:<|"|>v<|"|>,n:42}`` (Gemma 4) or with ``<escape>`` quotes (FunctionGemma)."""
    call = re.compile(r"(?:call:|<call>)([A-Za-z_][\w.\-]{0,200})\{")

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
            except (_Malformed, IndexError):
                scanner.count(limit - found.end())
                continue
            scanner.count(end - found.end())
            name = found.group(1)
            arguments = _typed_strings(name, arguments, schemas)
            if (
                prefix_start == start
                and not text.startswith("<call>", start)
                and quote not in text[start:end]
            ) and not _declared(name, schemas):
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


# --- pythonic calls ----------------------------------------------------------------------------

_PY_LIST_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")


def _pythonic_call(node: ast.expr) -> tuple[str, dict[str, Any]]:
    if not isinstance(node, ast.Call) or node.args:
        raise _Malformed
    name = _dotted(node.func)
    arguments = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise _Malformed
        arguments[keyword.arg] = _literal(keyword.value, 0)
    return name, arguments


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _dotted(node.value) + "." + node.attr
    raise _Malformed


def _pythonic_list(source: str) -> list[tuple[str, dict[str, Any]]] | None:
    """``[f(a=1), g(b='x')]``: the calls whose arguments are literals (a bad one is skipped)."""
    try:
        node = ast.parse(source.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    items = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    calls = []
    for item in items:
        if not isinstance(item, ast.Call):
            return None
        try:
            calls.append(_pythonic_call(item))
        except (_Malformed, RecursionError):
            continue  # vLLM drops a call with an unreadable argument and keeps the others
    return calls or None


def _lfm2_list(source: str) -> list[tuple[str, dict[str, Any]]] | None:
    """LFM2's pythonic list: Python's grammar first, then a tolerant reading of what it refuses
    (raw newlines and NUL bytes in strings, quotes left unescaped inside a string, ``07``)."""
    strict = _pythonic_list(source)
    if strict is not None:
        return strict
    try:
        return _TolerantPythonic(source.strip()).calls()
    except (_Malformed, IndexError, RecursionError):
        return None


_PY_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)")
_PY_NAME = re.compile(r"[A-Za-z_][\w.]*")
_PY_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", "'": "'", '"': '"'}


class _TolerantPythonic:
    """A forgiving reader of ``[f(k=literal, ...), ...]``: a quote closes its string only where
    what follows can continue the call (``,``, ``:``, closing brackets, the end), so a quote the
    model forgot to escape stays inside the string."""

    __slots__ = ("position", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.position = 0

    def _space(self) -> None:
        while self.position < len(self.text) and self.text[self.position].isspace():
            self.position += 1

    def _expect(self, character: str) -> None:
        self._space()
        if not self.text.startswith(character, self.position):
            raise _Malformed
        self.position += 1

    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        self._expect("[")
        calls = []
        while True:
            self._space()
            if self.text.startswith("]", self.position):
                self.position += 1
                break
            calls.append(self._call())
            self._space()
            if self.text.startswith(",", self.position):
                self.position += 1
        self._space()
        if self.position != len(self.text) or not calls:
            raise _Malformed
        return calls

    def _call(self) -> tuple[str, dict[str, Any]]:
        self._space()
        name = _PY_NAME.match(self.text, self.position)
        if name is None:
            raise _Malformed
        self.position = name.end()
        self._expect("(")
        arguments: dict[str, Any] = {}
        while True:
            self._space()
            if self.text.startswith(")", self.position):
                self.position += 1
                return name.group(), arguments
            key = _PY_NAME.match(self.text, self.position)
            if key is None:
                raise _Malformed
            self.position = key.end()
            self._expect("=")
            arguments[key.group()] = self._value(0)
            self._space()
            if self.text.startswith(",", self.position):
                self.position += 1

    def _value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise _Malformed
        self._space()
        text = self.text
        character = text[self.position]
        if character in "'\"":
            return self._string(character)
        if character in "[({":
            return self._container(character, depth)
        number = _PY_NUMBER.match(text, self.position)
        if number is not None and number.group():
            self.position = number.end()
            token = number.group()
            if _INTEGER.fullmatch(token.lstrip("+")):
                return int(token)
            value = float(token)
            if not math.isfinite(value):
                raise _Malformed
            return value
        name = _PY_NAME.match(text, self.position)
        if name is None or name.group() not in _NAMED_CONSTANTS:
            raise _Malformed
        self.position = name.end()
        return _NAMED_CONSTANTS[name.group()]

    def _container(self, opener: str, depth: int) -> Any:
        closer = {"[": "]", "(": ")", "{": "}"}[opener]
        self.position += 1
        items: list[Any] = []
        pairs: dict[str, Any] = {}
        while True:
            self._space()
            if self.text.startswith(closer, self.position):
                self.position += 1
                return pairs if opener == "{" and (pairs or not items) else items
            value = self._value(depth + 1)
            self._space()
            if opener == "{" and self.text.startswith(":", self.position):
                self.position += 1
                if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                    raise _Malformed
                pairs[str(value)] = self._value(depth + 1)
            else:
                items.append(value)
            self._space()
            if self.text.startswith(",", self.position):
                self.position += 1
            elif not self.text.startswith(closer, self.position):
                raise _Malformed

    def _string(self, quote: str) -> str:
        text = self.text
        position = self.position + 1
        pieces: list[str] = []
        while True:
            if position >= len(text):
                raise _Malformed
            character = text[position]
            if character == "\\" and position + 1 < len(text):
                following = text[position + 1]
                pieces.append(_PY_ESCAPES.get(following, "\\" + following))
                position += 2
                continue
            if character == quote and self._closes(position + 1):
                self.position = position + 1
                return "".join(pieces)
            pieces.append(character)
            position += 1

    def _closes(self, position: int) -> bool:
        """Whether a quote ending at ``position`` can close its string: what follows goes on."""
        text = self.text
        closed = False
        while position < len(text) and (text[position].isspace() or text[position] in ")]}"):
            closed = closed or not text[position].isspace()
            position += 1
        if position == len(text):
            return True
        return text[position] == "," or (text[position] == ":" and not closed)


def _pythonic_lines(source: str) -> list[tuple[str, dict[str, Any]]] | None:
    """Calls one per line (OLMo 3, Granite pythonic)."""
    try:
        tree = ast.parse(source.strip(), mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    calls = []
    for statement in tree.body:
        if not isinstance(statement, ast.Expr) or not isinstance(statement.value, ast.Call):
            return None
        try:
            calls.append(_pythonic_call(statement.value))
        except (_Malformed, RecursionError):
            continue
    return calls or None


def _pythonic_wrapped(
    family: str,
    opener: str,
    closer: str,
    reader: Callable[[str], list[tuple[str, dict[str, Any]]] | None],
) -> Callable[[Scanner, Schemas | None], list[NativeMatch]]:
    """Pythonic calls between markers (Llama 4 ``<|python_start|>``, LFM2, OLMo 3)."""

    def recognise(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
        del schemas
        text = scanner.text
        matches: list[NativeMatch] = []
        position = 0
        while len(matches) < MAX_MATCHES:
            start = scanner.find(opener, position)
            if start < 0:
                break
            close = scanner.find(closer, start + len(opener))
            stop = close if close >= 0 else len(text)
            position = stop
            body = text[start + len(opener) : stop]
            calls = reader(body)
            if calls is None:
                continue
            end = close + len(closer) if close >= 0 else len(text)
            echo = body + closer
            if close >= 0 and text.startswith(echo, end):
                end += len(echo)  # the model echoed the call after its end marker
            matches.append(
                NativeMatch(
                    family, start, end, _make_calls((n, a, start, end, False) for n, a in calls)
                )
            )
            position = end
        return matches

    return recognise


def _pythonic_bare(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """``[f(a=1), g(b=2)]`` in the text, no markers (pythonic, Llama 4 stripped, LFM2 stripped).

    What Python's grammar refuses is read tolerantly (as LFM2's) only when every name is a
    declared tool; a list repeated verbatim right after itself is the model echoing its call.
    """
    text = scanner.text
    if "(" not in text or "[" not in text:
        return []
    ends = scanner.bracket_ends("\"'")
    matches: list[NativeMatch] = []
    consumed = 0
    for found in scanner.finditer(_PY_LIST_START):
        start = found.start()
        if start < consumed or len(matches) >= MAX_MATCHES:
            continue
        end = ends.get(start)
        if end is None:
            continue
        consumed = end
        scanner.count(end - start)
        source = text[start:end]
        calls = _pythonic_list(source)
        if calls is None:
            calls = _lfm2_list(source)
            if calls is None or not all(_declared(name, schemas) for name, _ in calls):
                continue
        stop = end
        if text.startswith(source, end):
            stop = consumed = end + len(source)
        matches.append(
            NativeMatch(
                "pythonic", start, stop, _make_calls((n, a, start, end, False) for n, a in calls)
            )
        )
    return matches


_PY_LINE_CALL = re.compile(r"^[ \t]*([A-Za-z_][\w.]*)\(", re.MULTILINE)


def _pythonic_bare_lines(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """Granite pythonic: whole lines that are each one call to a declared tool."""
    text = scanner.text
    if schemas is None or "(" not in text:
        return []
    ends = scanner.bracket_ends("\"'")
    calls: list[NativeCall] = []
    spans: list[tuple[int, int]] = []
    for found in scanner.finditer(_PY_LINE_CALL):
        if spans and found.start() < spans[-1][1]:
            continue
        name = found.group(1)
        close = ends.get(found.end() - 1)
        if close is None or name not in schemas:
            continue
        line_end = text.find("\n", close)
        line_end = len(text) if line_end < 0 else line_end
        if text[close:line_end].strip():
            continue
        scanner.count(close - found.start())
        read = _pythonic_lines(text[found.start() : close])
        if read is None or len(read) != 1:
            continue
        ((call_name, arguments),) = read
        calls.append(NativeCall(call_name, arguments, found.start(), close))
        spans.append((found.start(), close))
    return _grouped(scanner, "granite_pythonic", calls, spans, None)


# --- special-token formats ---------------------------------------------------------------------

_DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
_DS_CALLS_END = "<｜tool▁calls▁end｜>"
_DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
_DS_CALL_END = "<｜tool▁call▁end｜>"
_DS_SEP = "<｜tool▁sep｜>"
_DS_V3_HEAD = re.compile(
    r"\s*function\s*" + re.escape(_DS_SEP) + r"\s*([^\s`]{1,200})\s*```(?:json)?\s*"
)
_DS_V31_HEAD = re.compile(r"\s*([^\s<]{1,200})\s*" + re.escape(_DS_SEP) + r"\s*")


def _deepseek(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """DeepSeek V3 (``function<sep>NAME ```json {...} ```) and V3.1 (``NAME<sep>{...}``)."""
    del schemas
    text = scanner.text
    calls: list[NativeCall] = []
    spans: list[tuple[int, int]] = []
    position = 0
    while len(calls) < MAX_MATCHES:
        start = scanner.find(_DS_CALL_BEGIN, position)
        if start < 0:
            break
        close = scanner.find(_DS_CALL_END, start)
        if close < 0:
            break
        position = close + len(_DS_CALL_END)
        body = start + len(_DS_CALL_BEGIN)
        head = _DS_V3_HEAD.match(text, body, close)
        fenced = head is not None
        if head is None:
            head = _DS_V31_HEAD.match(text, body, close)
        if head is None:
            continue
        raw = text[head.end() : close].strip()
        if fenced:
            if not raw.endswith("```"):
                continue
            raw = raw[:-3].strip()
        value = _loads(raw)
        if not isinstance(value, dict):
            continue
        calls.append(NativeCall(head.group(1), value, start, position))
        spans.append((start, position))
    return _grouped(scanner, "deepseek", calls, spans, (_DS_CALLS_BEGIN, _DS_CALLS_END))


_KIMI_SECTION = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
_KIMI_HEAD = re.compile(r"\s*(?:functions\.)?([A-Za-z_][\w\-]*(?:\.[A-Za-z_][\w\-]*)*)?:?(\d+)\s*$")
_KIMI_STRIPPED = re.compile(r"(functions\.)?([A-Za-z_][\w\-.]{0,200}):(\d+)[ \t]*(?=[{\[])")


def _kimi(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """Kimi K2: ``<|tool_call_begin|>functions.NAME:IDX <|tool_call_argument_begin|>{...}``
    ``<|tool_call_end|>`` inside ``<|tool_calls_section_begin|>...``.

    A call written with the index only takes its name from the declared tools when exactly one
    of them fits its arguments; a malformed head (``functions.name.0``) is dropped.
    """
    text = scanner.text
    matches: list[NativeMatch] = []
    position = 0
    while len(matches) < MAX_MATCHES:
        start = scanner.find(_KIMI_SECTION[0], position)
        if start < 0:
            break
        close = scanner.find(_KIMI_SECTION[1], start)
        stop = close if close >= 0 else len(text)
        end = close + len(_KIMI_SECTION[1]) if close >= 0 else len(text)
        position = end
        calls = []
        inner = start
        while True:
            begin = scanner.find("<|tool_call_begin|>", inner, stop)
            if begin < 0:
                break
            argument = scanner.find("<|tool_call_argument_begin|>", begin, stop)
            call_end = scanner.find("<|tool_call_end|>", begin, stop)
            if argument < 0 or call_end < 0 or argument > call_end:
                break
            inner = call_end + len("<|tool_call_end|>")
            head = _KIMI_HEAD.match(text[begin + len("<|tool_call_begin|>") : argument])
            value = _loads(text[argument + len("<|tool_call_argument_begin|>") : call_end].strip())
            if head is None or not isinstance(value, dict):
                continue
            name = head.group(1) or _only_fitting_tool(value, schemas)
            if name is None:
                continue
            calls.append(NativeCall(name, value, begin, inner))
        if calls:
            matches.append(NativeMatch("kimi_k2", start, end, tuple(calls)))
    if not matches and ":" in text and "{" in text:
        matches.extend(_kimi_stripped(scanner, schemas))
    return matches


def _kimi_stripped(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """``functions.NAME:0 {...}`` left once the special tokens are dropped."""
    text = scanner.text
    calls: list[NativeCall] = []
    spans: list[tuple[int, int]] = []
    for found in scanner.finditer(_KIMI_STRIPPED):
        if spans and found.start() < spans[-1][1]:
            continue
        name = found.group(2)
        if found.group(1) is None and not _declared(name, schemas):
            continue
        if found.group(1) is None and found.start() and text[found.start() - 1].isalnum():
            continue
        read = _json_at(scanner, found.end())
        if read is None or not isinstance(read[0], dict):
            continue
        calls.append(NativeCall(name, read[0], found.start(), read[1]))
        spans.append((found.start(), read[1]))
    return _grouped(scanner, "kimi_k2", calls, spans, None)


def _only_fitting_tool(arguments: Mapping[str, Any], schemas: Schemas | None) -> str | None:
    """The one declared tool whose properties hold every argument and whose required are given."""
    if schemas is None:
        return None
    fitting = []
    for name, schema in schemas.items():
        properties = schema.get("properties")
        required = schema.get("required")
        keys = set(properties) if isinstance(properties, Mapping) else set()
        needed = set(required) if isinstance(required, list) else set()
        if set(arguments) <= keys and needed <= set(arguments):
            fitting.append(name)
    return fitting[0] if len(fitting) == 1 else None


_HARMONY_CALL = re.compile(
    r"(?:<\|start\|>\s*assistant\s*)?"
    r"(?:to=functions\.(?P<before>[^\s<]{1,200})\s*)?"
    r"<\|channel\|>\s*(?:commentary|analysis)"
    r"(?:\s*to=functions\.(?P<after>[^\s<]{1,200}))?\s*"
    r"(?:<\|constrain\|>\s*)?(?:json\s*)?<\|message\|>"
)
_HARMONY_MESSAGE = re.compile(
    r"(?:<\|start\|>\s*assistant\s*)?<\|channel\|>\s*(?P<channel>analysis|final|commentary)\s*<\|message\|>"
)


def _harmony(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """gpt-oss harmony: ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>``
    ``{...}<|call|>``.

    The analysis messages before a call are part of its transcript (the reasoning channel); the
    text of a final message after it stays as prose.
    """
    del schemas
    text = scanner.text
    if "<|message|>" not in text or "functions." not in text:
        return []
    calls: list[NativeCall] = []
    kept: list[tuple[int, int]] = []
    position = 0
    first = -1
    last = -1
    while len(calls) < MAX_MATCHES:
        found = _HARMONY_CALL.search(text, position)
        if found is None:
            scanner.count(len(text) - position)
            break
        scanner.count(found.end() - position)
        name = found.group("before") or found.group("after")
        if name is None:
            position = found.end()  # an analysis or final message, not a call
            continue
        close = scanner.find("<|call|>", found.end())
        if close < 0:
            break
        position = close + len("<|call|>")
        body = text[found.end() : close].strip()
        value = _loads(body) if body else {}
        if not isinstance(value, dict):
            continue
        if first < 0:
            first = _harmony_transcript_start(text, found.start())
        calls.append(NativeCall(name, value, found.start(), position))
        last = position
    if not calls:
        return []
    final = _HARMONY_MESSAGE.match(text, last)
    if final is not None and final.group("channel") == "final":
        end_marker = text.find("<|end|>", final.end())
        stop = end_marker if end_marker >= 0 else len(text)
        kept.append((final.end(), stop))
        last = stop + len("<|end|>") if end_marker >= 0 else stop
    return [NativeMatch("openai_harmony", first, last, tuple(calls), tuple(kept))]


def _harmony_transcript_start(text: str, call_start: int) -> int:
    """Back over the analysis messages that open the transcript before the first call."""
    begin = text.find("<|channel|>")
    start_marker = text.find("<|start|>")
    candidates = [i for i in (begin, start_marker) if 0 <= i <= call_start]
    start = min(candidates) if candidates else call_start
    if "<|channel|>final" in text[start:call_start]:
        return call_start
    return start


_MISTRAL = "[TOOL_CALLS]"
_MISTRAL_V11 = re.compile(r"\s*([A-Za-z_][\w.\-]{0,200})(?=\{)")
_MISTRAL_STRIPPED = re.compile(r"\A\s*([A-Za-z_][\w.\-]{0,200})(?=\{)")


def _mistral(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """``[TOOL_CALLS][{...}]`` (before v11) and ``[TOOL_CALLS]NAME{...}`` (v11, repeatable)."""
    text = scanner.text
    matches: list[NativeMatch] = []
    calls: list[NativeCall] = []
    spans: list[tuple[int, int]] = []
    position = 0
    while len(matches) + len(calls) < MAX_MATCHES:
        start = scanner.find(_MISTRAL, position)
        if start < 0:
            break
        body = start + len(_MISTRAL)
        position = body
        named = _MISTRAL_V11.match(text, body)
        if named is not None:
            read = _json_at(scanner, named.end())
            if read is not None and isinstance(read[0], dict):
                calls.append(NativeCall(named.group(1), read[0], named.start(1), read[1]))
                spans.append((start, read[1]))
                position = read[1]
            continue
        following = text.find(_MISTRAL, body)
        limit = following if following >= 0 else len(text)  # read up to the next marker only
        opening = scanner.find("[", body, limit)
        brace = text.find("{", body, opening if opening >= 0 else limit)
        if opening < 0 or brace >= 0:
            continue
        read = _json_at(scanner, opening)
        found = _call_objects(read[0]) if read is not None and isinstance(read[0], list) else None
        if read is None or found is None:
            continue
        junk = (body, opening) if text[body:opening].strip() else None
        matches.append(
            NativeMatch(
                "mistral",
                start,
                read[1],
                _make_calls((n, a, opening, read[1], False) for n, a in found),
                (junk,) if junk else (),
            )
        )
        position = read[1]
    matches.extend(_grouped(scanner, "mistral", calls, spans, None))
    if not matches and _MISTRAL not in text:
        named = _MISTRAL_STRIPPED.match(text)
        if named is not None and _declared(named.group(1), schemas):
            read = _json_at(scanner, named.end())
            if read is not None and isinstance(read[0], dict) and not text[read[1] :].strip():
                call = NativeCall(named.group(1), read[0], named.start(1), read[1])
                matches.append(NativeMatch("mistral", named.start(1), read[1], (call,)))
    return sorted(matches, key=lambda match: match.start)


_M3 = "]<]minimax[>["
_M3_ELEMENT = re.compile(r"<([A-Za-z_][\w.\-]{0,200})>|</([A-Za-z_][\w.\-]{0,200})>")
_M3_INVOKE = re.compile(r'<invoke name="([^"]{1,200})">')


def _minimax_m3(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """MiniMax-M3: ``]<]minimax[>[`` before every tag; arguments as nested elements."""
    text = scanner.text
    opener, closer = _M3 + "<tool_call>", _M3 + "</tool_call>"
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
        body = text[start + len(opener) : close].replace(_M3, "")
        scanner.count(close - start)
        calls = _m3_invokes(body, schemas, start, position)
        if calls:
            matches.append(NativeMatch("minimax_m3", start, position, tuple(calls)))
    return matches


def _m3_invokes(
    body: str, schemas: Schemas | None, start: int, end: int
) -> list[NativeCall] | None:
    calls = []
    position = 0
    while True:
        opened = _M3_INVOKE.search(body, position)
        if opened is None:
            break
        if body[position : opened.start()].strip():
            return None
        close = body.find("</invoke>", opened.end())
        if close < 0:
            return None
        name = opened.group(1)
        schema = schemas.get(name) if schemas is not None else None
        try:
            tree, rest = _m3_elements(body, opened.end(), close, 0)
        except _Malformed:
            return None
        if rest.strip():
            return None
        arguments = _m3_typed(tree, schema)
        if not isinstance(arguments, dict):
            return None
        calls.append(NativeCall(name, arguments, start, end))
        position = close + len("</invoke>")
    return calls if calls and not body[position:].strip() else None


def _m3_elements(
    body: str, position: int, stop: int, depth: int
) -> tuple[list[tuple[str, Any]], str]:
    """Child elements ``<k>...</k>`` of one element: (key, text or children) in order, and the
    text left between them."""
    if depth > MAX_DEPTH:
        raise _Malformed
    children: list[tuple[str, Any]] = []
    text_parts: list[str] = []
    while position < stop:
        tag = _M3_ELEMENT.search(body, position, stop)
        if tag is None:
            text_parts.append(body[position:stop])
            break
        text_parts.append(body[position : tag.start()])
        if tag.group(2) is not None:
            raise _Malformed  # a closing tag with no opening one
        key = tag.group(1)
        close = _m3_close(body, key, tag.end(), stop)
        inner, inner_text = _m3_elements(body, tag.end(), close, depth + 1)
        children.append((key, inner if inner else inner_text))
        position = close + len(key) + 3
    return children, "".join(text_parts) if not children else "".join(text_parts).strip()


def _m3_close(body: str, key: str, position: int, stop: int) -> int:
    depth = 1
    opening, closing = f"<{key}>", f"</{key}>"
    while True:
        next_close = body.find(closing, position, stop)
        if next_close < 0:
            raise _Malformed
        next_open = body.find(opening, position, next_close)
        if next_open >= 0:
            depth += 1
            position = next_open + len(opening)
            continue
        depth -= 1
        if depth == 0:
            return next_close
        position = next_close + len(closing)


def _m3_typed(value: Any, schema: Any) -> Any:
    """An element's content typed by its schema: objects from children, arrays from repeats."""
    kinds = _allowed_types(schema)
    if isinstance(value, str):
        return typed_value(value, schema) if kinds else value
    if "array" in kinds and "object" not in kinds:
        item_schema = schema.get("items") if isinstance(schema, Mapping) else None
        return [_m3_typed(child, item_schema) for _, child in value]
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    properties = properties if isinstance(properties, Mapping) else {}
    result: dict[str, Any] = {}
    for key, child in value:
        typed = _m3_typed(child, properties.get(key))
        if key in result:
            previous = result[key]
            result[key] = (previous if isinstance(previous, list) else [previous]) + [typed]
        else:
            result[key] = typed
    return result


# --- the registry ------------------------------------------------------------------------------

Recogniser = Callable[[Scanner, "Schemas | None"], list[NativeMatch]]

# Family label -> recogniser, in precedence order: a match claims its text, so later (looser,
# marker-less) recognisers never read inside an earlier one's match.
RECOGNISERS: Mapping[str, Recogniser] = MappingProxyType(
    {
        "openai_harmony": _harmony,
        "deepseek": _deepseek,
        "deepseek_dsml": _invoke_format(
            "deepseek_dsml",
            "｜DSML｜",
            (
                ("<｜DSML｜function_calls>", "</｜DSML｜function_calls>"),
                ("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"),
            ),
            bare=False,
            string_attribute=True,
        ),
        "kimi_k2": _kimi,
        "step3": _invoke_format(
            "step3", "steptml:", (("<｜tool_calls_begin｜>", "<｜tool_calls_end｜>"),), bare=True
        ),
        "minimax_m3": _minimax_m3,
        "minimax_m2": _invoke_format(
            "minimax_m2", "", (("<minimax:tool_call>", "</minimax:tool_call>"),), bare=True
        ),
        "gemma4": _gemma_format(
            "gemma4",
            '<|"|>',
            ("<|tool_call>", "<channel|>"),
            ("<tool_call|>", "<turn|>"),
            bare=True,
        ),
        "functiongemma": _gemma_format(
            "functiongemma",
            "<escape>",
            ("<start_function_call>",),
            ("<end_function_call>",),
            bare=False,
        ),
        "hunyuan_v3": _glm_format("hunyuan_v3", "<tool_sep>", ("<tool_calls>", "</tool_calls>")),
        "glm": _glm_format("glm", "", None),
        "seed_oss": _tagged_xml(
            "seed_oss", "<seed:tool_call>", "</seed:tool_call>", ("<seed:think>", "</seed:think>")
        ),
        "qwen3_xml": _tagged_xml("qwen3_xml", "<tool_call>", "</tool_call>"),
        "hermes": _marker_json("hermes", "<tool_call>", "</tool_call>"),
        "tool_calls_json": _marker_json("tool_calls_json", "<tool_calls>", "</tool_calls>"),
        "granite": _marker_json("granite", "<|tool_call|>", None, lists_only=True),
        "granite_20b_fc": _marker_json("granite_20b_fc", "<function_call>", None),
        "internlm2": _marker_json("internlm2", "<|action_start|><|plugin|>", "<|action_end|>"),
        "phi4mini": _marker_json("phi4mini", "functools", None, lists_only=True),
        "apertus": _apertus,
        "cohere_command": _cohere,
        "mistral": _mistral,
        "llama4_pythonic": _pythonic_wrapped(
            "llama4_pythonic", "<|python_start|>", "<|python_end|>", _pythonic_list
        ),
        "lfm2": _pythonic_wrapped("lfm2", "<|tool_call_start|>", "<|tool_call_end|>", _lfm2_list),
        "olmo3": _pythonic_wrapped(
            "olmo3", "<function_calls>", "</function_calls>", _pythonic_lines
        ),
        "qwen3_xml_bare": _bare_function_xml,
        "fenced_json": _fenced_json,
        "pythonic": _pythonic_bare,
        "granite_pythonic": _pythonic_bare_lines,
        "json": _llama3_json,
    }
)

# The labels a promotion's format can carry (metrics, log, header): the families and "other".
FAMILIES: tuple[str, ...] = tuple(
    sorted({"qwen3_xml" if f == "qwen3_xml_bare" else f for f in RECOGNISERS} | {"other"})
)

# Each family's opening markers: a stream whose text may still open one is held (the gate).
_OPENING_MARKERS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "openai_harmony": ("<|channel|>", "<|start|>"),
        "deepseek": (_DS_CALLS_BEGIN, _DS_CALL_BEGIN),
        "deepseek_dsml": ("<｜DSML｜function_calls>", "<｜DSML｜tool_calls>"),
        "kimi_k2": (_KIMI_SECTION[0], "<|tool_call_begin|>", "functions."),
        "step3": ("<｜tool_calls_begin｜>", "<steptml:invoke"),
        "minimax_m3": (_M3,),
        "minimax_m2": ("<minimax:tool_call>", "<invoke name="),
        "gemma4": ("<|tool_call>", "<|channel>", "<call>", "call:"),
        "functiongemma": ("<start_function_call>",),
        "hunyuan_v3": ("<tool_calls>",),
        "glm": ("<tool_call>",),
        "seed_oss": ("<seed:tool_call>",),
        "qwen3_xml": ("<tool_call>", "<function="),
        "hermes": ("<tool_call>",),
        "tool_calls_json": ("<tool_calls>",),
        "granite": ("<|tool_call|>",),
        "granite_20b_fc": ("<function_call>",),
        "internlm2": ("<|action_start|>",),
        "phi4mini": ("functools[",),
        "apertus": ("<|tools_prefix|>",),
        "cohere_command": ("<|START_ACTION|>", "<|START_THINKING|>"),
        "mistral": (_MISTRAL,),
        "llama4_pythonic": ("<|python_start|>",),
        "lfm2": ("<|tool_call_start|>",),
        "olmo3": ("<function_calls>",),
    }
)


def opening_markers() -> tuple[str, ...]:
    """Every family's opening markers, deduplicated, longest first (the stream gate holds
    on them)."""
    markers = {marker for group in _OPENING_MARKERS.values() for marker in group}
    return tuple(sorted(markers, key=lambda marker: (-len(marker), marker)))


# The shapes of ``textcalls`` that are one family's format already.
_SHAPE_FORMATS = MappingProxyType(
    {"tool_call_tag": "hermes", "function_xml": "qwen3_xml", "fenced_json": "fenced_json"}
)
_SHAPE_FORMATS_JSON = "json"


def promoted_format(shape: str, source: str) -> str:
    """The bounded label (one of ``FAMILIES``) of a promoted text call, from its shape and text:
    for metrics, the log line and ``X-Repairproxy-Promoted-Format``."""
    if shape == _SHAPE_FORMATS_JSON:
        return "json"
    if shape in _SHAPE_FORMATS:
        return _SHAPE_FORMATS[shape]
    matches = find_native_calls(source)
    family = matches[0].family if matches else "other"
    family = "qwen3_xml" if family == "qwen3_xml_bare" else family
    return family if family in FAMILIES else "other"


def _schemas_of(tools: Any) -> Schemas | None:
    """name -> parameters schema, from a request's ``tools`` list or such a mapping already."""
    if tools is None:
        return None
    if isinstance(tools, Mapping):
        return tools
    schemas: dict[str, Mapping[str, Any]] = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            schemas[function["name"]] = parameters if isinstance(parameters, Mapping) else {}
    return schemas


def find_native_calls(
    text: str,
    tools: Schemas | Sequence[Mapping[str, Any]] | None = None,
    *,
    scanner: Scanner | None = None,
) -> list[NativeMatch]:
    """Every call written in a family's native format in ``text``, in order of appearance.

    ``tools``: the declared tools (a request's ``tools`` list, or name -> parameters schema), used
    to type values the format wrote as text and to accept marker-less variants only for declared
    names; without them string values stay strings (``NativeCall.string_values``). Matches never
    overlap: the first recogniser in ``RECOGNISERS`` to claim text keeps it.
    """
    scan = scanner if scanner is not None else Scanner(text)
    schemas = _schemas_of(tools)
    taken: list[NativeMatch] = []
    for family, recognise in RECOGNISERS.items():
        del family
        for match in recognise(scan, schemas):
            if not match.calls or any(match.start < m.end and m.start < match.end for m in taken):
                continue
            taken.append(match)
    taken.sort(key=lambda match: match.start)
    return taken[:MAX_MATCHES]
