"""Formats that write XML-like parameters: MiniMax-M2 and Step-3 ``<invoke>``, DeepSeek DSML,
Qwen3 ``<function=...>`` (Qwen3-Coder, Step-3.5, Seed-OSS), GLM and Hunyuan v3 ``<arg_key>``."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from repairproxy.native.base import (
    MAX_MATCHES,
    NOT_JSON,
    SPACE,
    NativeCall,
    NativeMatch,
    Scanner,
    Schemas,
    grouped,
    loads,
)
from repairproxy.native.values import typed_arguments, typed_value

__all__ = [
    "bare_function_xml",
    "glm_format",
    "glm_may",
    "invoke_format",
    "tagged_xml",
]


def invoke_format(
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
            stray = False  # text outside the parameters: written in another format
            while True:
                param = parameter.search(text, inner, close)
                stray = stray or bool(
                    text[inner : close if param is None else param.start()].strip()
                )
                if param is None:
                    break
                end = scanner.find(parameter_close, param.end(), close)
                if end < 0:
                    return None
                raw[param.group(1)] = text[param.end() : end]
                strings[param.group(1)] = param.group(2) != "false"
                inner = end + len(parameter_close)
            name = opened.group(1)
            if stray:  # values this format cannot read exactly: reported with the raw text
                arguments: Any = text[opened.start() : close + len(invoke_close)]
                calls.append(NativeCall(name, arguments, opened.start(), close + len(invoke_close)))
                position = close + len(invoke_close)
                continue
            if string_attribute:
                arguments = _dsml_arguments(name, raw, strings, schemas)
                untyped = False
            else:
                arguments, untyped = typed_arguments(name, raw, schemas)
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
            decoded = loads(value.strip())
            arguments[key] = typed_value(value, spec) if decoded is NOT_JSON else decoded
    if len(arguments) == 1 and schema is not None:
        ((key, value),) = arguments.items()
        if key in ("arguments", "input") and key not in properties:
            inner = loads(value) if isinstance(value, str) else value
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


_FUNCTION_OPEN = re.compile(r"<function=([^>\s]{1,200})>")
_PARAMETER_OPEN = re.compile(r"<parameter=([^>\s]{1,200})>")


def _function_xml_body(
    scanner: Scanner, begin: int, stop: int, schemas: Schemas | None, *, exact: bool = False
) -> list[NativeCall] | None:
    """``<function=N><parameter=K>v</parameter>...</function>`` calls in ``text[begin:stop]``.

    ``exact``: the template writes each value right after its tag (Seed-OSS), so the value is
    kept as written; otherwise (Qwen3-Coder) the one newline the template adds each side goes.
    A call with neither ``</function>`` nor the wrapper's closer after it was cut off: None.
    """
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
        if close < 0 and stop >= len(text):
            return None  # cut off inside the call: its values may be incomplete
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
            if exact and value_end >= 0:
                pass
            else:
                if value.startswith("\n"):
                    value = value[1:]
                if value.endswith("\n"):
                    value = value[:-1]
            raw[param.group(1)] = value
        name = opened.group(1)
        arguments, untyped = typed_arguments(name, raw, schemas)
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


def tagged_xml(
    family: str,
    opener: str,
    closer: str,
    thinking: tuple[str, str] | None = None,
    *,
    exact: bool = False,
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
            calls = _function_xml_body(scanner, start + len(opener), stop, schemas, exact=exact)
            if not calls or (thinking is not None and _inside(scanner, start, thinking)):
                continue
            end = close + len(closer) if close >= 0 else len(text)
            matches.append(NativeMatch(family, start, end, tuple(calls)))
            position = end
        return matches

    return recognise


_THINKING = (("<think>", "</think>"), ("<seed:think>", "</seed:think>"))


def bare_function_xml(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
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
_GLM_HEAD = re.compile(r"<tool_call>\s*[A-Za-z_]")


def glm_may(text: str, schemas: Schemas | None) -> bool:
    """Whether a GLM (or Hunyuan v3) call can be in ``text``: a ``<tool_call>`` opening with a
    name, not JSON (hermes)."""
    del schemas
    return _GLM_HEAD.search(text) is not None


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
        position = SPACE.match(text, position + len(separator)).end()  # type: ignore[union-attr]
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
        position = SPACE.match(text, value_end + len("</arg_value>")).end()  # type: ignore[union-attr]
    if text[position:stop].strip():
        return None
    name = named.group(1)
    arguments, untyped = typed_arguments(name, raw, schemas)
    return NativeCall(name, arguments, begin, stop, untyped)


def glm_format(
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
        return grouped(scanner, family, calls, spans, outer)

    return recognise
