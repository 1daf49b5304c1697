"""Formats read off each family's own chat template (llama.cpp's ``models/templates/``, rendered
with a call): Nemotron Nano v2 ``<TOOLCALL>``, GigaChat, MiniCPM ``<function name=..>``,
Functionary v3.2 ``>>>NAME``, Llama 3.x ``<|python_tag|>``, LFM2 with JSON tools or without its
opener, and the Hermes-style wrappers other templates ask for (``<tool>``, ``<response>``, ...).

Each recogniser reads the calls exactly as the template writes them and claims the template's
markers around them (so no wrapper is left in content); a value cut off before it closes is no
call (``json_at`` and the closers below read only complete values)."""

from __future__ import annotations

import re
from collections.abc import Callable

import orjson

from repairproxy.native.base import (
    MAX_MATCHES,
    SPACE,
    NativeCall,
    NativeMatch,
    Scanner,
    Schemas,
    call_objects,
    declared,
    grouped,
    json_at,
    make_calls,
    skip_space,
)
from repairproxy.native.json_formats import marker_json
from repairproxy.native.pythonic import lfm2_list, tolerant_calls
from repairproxy.native.values import typed_arguments

__all__ = [
    "LFM2_END",
    "PYTHON_TAG",
    "functionary_v32",
    "functionary_v32_may",
    "gigachat",
    "hunyuan_v3_opensource",
    "kimi_k3",
    "lfm2_json",
    "lfm2_unopened",
    "llama_python_tag",
    "minicpm",
    "nemotron",
    "solar_open",
    "tool_call_pythonic",
    "tool_call_recipient",
    "wrapped_json",
]

Recognise = Callable[[Scanner, "Schemas | None"], list[NativeMatch]]

# NVIDIA Nemotron Nano v2: ``<TOOLCALL>[{"name": ..., "arguments": {...}}]</TOOLCALL>``.
nemotron: Recognise = marker_json("nemotron_v2", "<TOOLCALL>", "</TOOLCALL>")

# LFM2 with JSON tools (its template's ``tool_call_start`` then a JSON list).
lfm2_json: Recognise = marker_json("lfm2", "<|tool_call_start|>", "<|tool_call_end|>")

LFM2_END = "<|tool_call_end|>"
_LFM2_LIST = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")


def lfm2_unopened(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """LFM2's pythonic list when the server dropped its opener ``<|tool_call_start|>`` (a special
    token) but kept the closer: ``[bash(command='ls')]<|tool_call_end|>``."""
    del schemas
    text = scanner.text
    if "<|tool_call_start|>" in text:
        return []
    matches: list[NativeMatch] = []
    position = 0
    while len(matches) < MAX_MATCHES:
        close = scanner.find(LFM2_END, position)
        if close < 0:
            break
        line = text.rfind("\n", position, close) + 1
        opened = _LFM2_LIST.search(text, max(line, position), close)
        position = close + len(LFM2_END)
        if opened is None:
            continue
        calls = lfm2_list(text[opened.start() : close])
        if calls is None:
            continue
        start, end = opened.start(), close + len(LFM2_END)
        matches.append(
            NativeMatch("lfm2", start, end, make_calls((n, a, start, end, False) for n, a in calls))
        )
    return matches


# GigaChat: ``<|function_call|>{...}`` (GigaChat 2) and ``<|message_sep|>\n\nfunction
# call<|role_sep|>\n{...}`` (GigaChat 3's template, the whole turn header claimed).
_GIGACHAT_OPENERS = re.compile(
    r"<\|function_call\|>|(?:<\|message_sep\|>\s*)?function call<\|role_sep\|>"
)


def gigachat(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    del schemas
    text = scanner.text
    matches: list[NativeMatch] = []
    for opened in scanner.finditer(_GIGACHAT_OPENERS):
        if len(matches) >= MAX_MATCHES or (matches and opened.start() < matches[-1].end):
            continue
        body = skip_space(scanner, opened.end())
        if body >= len(text) or text[body] not in "[{":
            continue
        read = json_at(scanner, body)
        calls = call_objects(read[0]) if read is not None else None
        if read is None or calls is None:
            continue
        end = read[1]
        after = skip_space(scanner, end)
        if text.startswith("<|message_sep|>", after):
            end = after + len("<|message_sep|>")
        matches.append(
            NativeMatch(
                "gigachat",
                opened.start(),
                end,
                make_calls((n, a, body, read[1], False) for n, a in calls),
            )
        )
    return matches


# MiniCPM: ``<function name="N"><param name="K">v</param>...</function>``, or a JSON object as
# the body (``<function name="N">\n{...}\n</function>``).
_MINICPM_OPEN = re.compile(r"<function name=\"([^\"<>\n]{1,200})\">")
_MINICPM_PARAM = re.compile(r"<param name=\"([^\"<>\n]{1,200})\">")


def minicpm(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    text = scanner.text
    calls: list[NativeCall] = []
    spans: list[tuple[int, int]] = []
    close = -1
    for opened in scanner.finditer(_MINICPM_OPEN):
        if len(calls) >= MAX_MATCHES or (spans and opened.start() < spans[-1][1]):
            continue
        if close < opened.end():  # the next closer, searched for once per closer
            close = scanner.find("</function>", opened.end())
        if close < 0:
            break  # cut off before the call closed: no call
        name = opened.group(1)
        body = skip_space(scanner, opened.end())
        if body < close and text[body] == "{":
            read = json_at(scanner, body)
            if read is None or not isinstance(read[0], dict) or text[read[1] : close].strip():
                continue
            call = NativeCall(name, read[0], opened.start(), close + len("</function>"))
        else:
            raw: dict[str, str] = {}
            position = opened.end()
            ok = True
            while True:
                param = _MINICPM_PARAM.search(text, position, close)
                if param is None:
                    ok = not text[position:close].strip()
                    break
                # The template wraps a value holding ``<``, ``&`` or a newline in CDATA, which
                # may hold ``</param>`` itself: such a value ends at its ``]]>``.
                value_start = param.end()
                cdata = text.startswith("<![CDATA[", value_start)
                if cdata:
                    cdata_end = text.find("]]>", value_start + len("<![CDATA["), close)
                    value_end = cdata_end + len("]]>") if cdata_end >= 0 else -1
                    if not text.startswith("</param>", value_end):
                        value_end = -1
                else:
                    value_end = text.find("</param>", value_start, close)
                if value_end < 0 or text[position : param.start()].strip():
                    ok = False
                    break
                value = text[value_start:value_end]
                if cdata:
                    value = value[len("<![CDATA[") : -len("]]>")]
                raw[param.group(1)] = value
                position = value_end + len("</param>")
            if not ok:
                continue
            arguments, untyped = typed_arguments(name, raw, schemas)
            call = NativeCall(name, arguments, opened.start(), close + len("</function>"), untyped)
        calls.append(call)
        spans.append((call.start, call.end))
    return _adjacent("minicpm", text, calls, spans)


def _adjacent(
    family: str, text: str, calls: list[NativeCall], spans: list[tuple[int, int]]
) -> list[NativeMatch]:
    """Calls with only whitespace between them form one match."""
    matches: list[NativeMatch] = []
    group: list[NativeCall] = []
    for call, (start, _end) in zip(calls, spans, strict=True):
        if group and not text[group[-1].end : start].strip():
            group.append(call)
            continue
        if group:
            matches.append(NativeMatch(family, group[0].start, group[-1].end, tuple(group)))
        group = [call]
    if group:
        matches.append(NativeMatch(family, group[0].start, group[-1].end, tuple(group)))
    return matches


# Functionary v3.2: each call is ``>>>NAME\n{...}``; the generation prompt writes the first
# ``>>>``, so an answer may open with ``NAME\n{...}`` (a declared name); ``>>>all\n`` is prose.
_FUNCTIONARY_HEAD = re.compile(r"(>>>)?([A-Za-z_][\w.\-]{0,200})\n")


def functionary_v32_may(text: str, schemas: Schemas | None) -> bool:
    if ">>>" in text:
        return True
    head = _FUNCTIONARY_HEAD.match(text)
    return head is not None and declared(head.group(2), schemas)


def functionary_v32(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    text = scanner.text
    calls: list[NativeCall] = []
    kept: list[tuple[int, int]] = []
    unopened = _FUNCTIONARY_HEAD.match(text)
    at = 0 if unopened is not None and unopened.group(1) is None else scanner.find(">>>", 0)
    first = end = -1
    while at >= 0 and len(calls) < MAX_MATCHES:
        head = _FUNCTIONARY_HEAD.match(text, at)
        if head is None or (head.group(1) is None and not declared(head.group(2), schemas)):
            at = scanner.find(">>>", at + 1)
            continue
        if head.group(2) == "all":  # ``>>>all\n`` then prose, up to the next ``>>>``
            following = scanner.find(">>>", head.end())
            stop = following if following >= 0 else len(text)
            kept.append((head.end(), stop))
            first = at if first < 0 else first
            end, at = stop, following
            continue
        read = json_at(scanner, head.end()) if text.startswith("{", head.end()) else None
        if read is None or not isinstance(read[0], dict):
            break  # not a call, or one cut off before its value closed
        calls.append(NativeCall(head.group(2), read[0], at, read[1]))
        first = at if first < 0 else first
        end = read[1]
        at = scanner.find(">>>", end)
    if not calls:
        return []
    return [NativeMatch("functionary_v32", first, end, tuple(calls), tuple(kept))]


# Llama 3.x: ``<|python_tag|>`` then a built-in tool written as ``NAME.call(k="v")`` (its
# template's ``brave_search``, ``wolfram_alpha``, ``code_interpreter``) or a JSON call object;
# ``<|eom_id|>`` after it, when the server keeps it, is the template's too.
PYTHON_TAG = "<|python_tag|>"
_EOM = "<|eom_id|>"
_BUILT_IN = re.compile(r"\s*([A-Za-z_]\w{0,200})\.call\(")


def llama_python_tag(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    del schemas
    text = scanner.text
    matches: list[NativeMatch] = []
    position = 0
    while len(matches) < MAX_MATCHES:
        start = scanner.find(PYTHON_TAG, position)
        if start < 0:
            break
        body = skip_space(scanner, start + len(PYTHON_TAG))
        position = body
        end = -1
        pieces: list[tuple[str, object]] = []
        if text.startswith("{", body):
            read = json_at(scanner, body)
            found = call_objects(read[0]) if read is not None else None
            if read is None or found is None:
                continue
            pieces, end = list(found), read[1]
        else:
            head = _BUILT_IN.match(text, body)
            if head is None:
                continue
            close = scanner.bracket_ends("\"'").get(head.end() - 1)
            if close is None:
                continue  # cut off before the call closed
            read_calls = tolerant_calls("[" + head.group(1) + text[head.end() - 1 : close] + "]")
            if read_calls is None:
                continue
            pieces, end = list(read_calls), close
        after = skip_space(scanner, end)
        if text.startswith(_EOM, after):
            end = after + len(_EOM)
        matches.append(
            NativeMatch(
                "llama3_python_tag",
                start,
                end,
                make_calls((str(n), a, start, end, False) for n, a in pieces),
            )
        )
        position = end
    return matches


# Hermes-style wrappers other templates ask for around a JSON call: ``<tool>``, ``<tools>``,
# ``<response>``, ``<json>``, ``<xml>``, ``<function_call>``; the whole element is the call.
_WRAPPER_OPEN = re.compile(r"<(tool|tools|response|json|xml)>")


def wrapped_json(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    del schemas
    text = scanner.text
    matches: list[NativeMatch] = []
    for opened in scanner.finditer(_WRAPPER_OPEN):
        if len(matches) >= MAX_MATCHES or (matches and opened.start() < matches[-1].end):
            continue
        body = skip_space(scanner, opened.end())
        if body >= len(text) or text[body] not in "[{":
            continue
        read = json_at(scanner, body)
        calls = call_objects(read[0]) if read is not None else None
        if read is None or calls is None:
            continue
        closer = f"</{opened.group(1)}>"
        after = skip_space(scanner, read[1])
        if not text.startswith(closer, after):
            continue  # the element never closes: a cut-off answer or a quotation of one
        end = after + len(closer)
        matches.append(
            NativeMatch(
                "hermes",
                opened.start(),
                end,
                make_calls((n, a, body, read[1], False) for n, a in calls),
            )
        )
    return matches


# Upstage Solar Open: ``<|tool_calls|><|tool_call:begin|>ID<|tool_call:name|>NAME``
# ``<|tool_call:args|>{...}<|tool_call:end|>``... ``<|calls|>`` (the call id is the model's).
_SOLAR_CALL = re.compile(
    r"<\|tool_call:begin\|>[^<]{0,100}<\|tool_call:name\|>([^<\s]{1,200})<\|tool_call:args\|>"
)
_SOLAR_END = "<|tool_call:end|>"


def solar_open(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    del schemas
    text = scanner.text
    calls: list[NativeCall] = []
    spans: list[tuple[int, int]] = []
    for head in scanner.finditer(_SOLAR_CALL):
        if len(calls) >= MAX_MATCHES or (spans and head.start() < spans[-1][1]):
            continue
        body = skip_space(scanner, head.end())
        read = json_at(scanner, body) if text.startswith("{", body) else None
        if read is None or not isinstance(read[0], dict):
            continue
        after = skip_space(scanner, read[1])
        if not text.startswith(_SOLAR_END, after):
            continue  # cut off before the call closed
        calls.append(NativeCall(head.group(1), read[0], head.start(), after + len(_SOLAR_END)))
        spans.append((head.start(), after + len(_SOLAR_END)))
    matches = _adjacent("solar_open", text, calls, spans)
    widened = []
    for match in matches:
        start, end = match.start, match.end
        before = text[:start].rstrip()
        if before.endswith("<|tool_calls|>"):
            start = len(before) - len("<|tool_calls|>")
        after = skip_space(scanner, end)
        if text.startswith("<|calls|>", after):
            end = after + len("<|calls|>")
        widened.append(NativeMatch(match.family, start, end, match.calls))
    return widened


# Kimi K3: ``<|open|>tools<|sep|>`` then per call ``<|open|>call tool="N" index="I"<|sep|>``,
# its arguments ``<|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>``, then
# ``<|close|>call<|sep|>``; ``<|close|>tools<|sep|>`` ends them. ``type="string"`` values are
# text as written, the others JSON.
_K3_TOOLS = ("<|open|>tools<|sep|>", "<|close|>tools<|sep|>")
_K3_CALL = re.compile(r'<\|open\|>call tool="([^"<>]{1,200})"(?: index="\d{1,6}")?<\|sep\|>')
_K3_ARGUMENT = re.compile(r'<\|open\|>argument key="([^"<>]{1,200})" type="(\w{1,20})"<\|sep\|>')
_K3_ARGUMENT_END = "<|close|>argument<|sep|>"
_K3_CALL_END = "<|close|>call<|sep|>"
_K3_AROUND = ("<|open|>response<|sep|><|close|>response<|sep|>", "<|close|>message<|sep|>")


def kimi_k3(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    del schemas
    text = scanner.text
    matches: list[NativeMatch] = []
    position = 0
    while len(matches) < MAX_MATCHES:
        start = scanner.find(_K3_TOOLS[0], position)
        if start < 0:
            break
        close = scanner.find(_K3_TOOLS[1], start)
        if close < 0:
            break  # cut off before the calls closed
        position = close + len(_K3_TOOLS[1])
        calls = _k3_calls(scanner, start + len(_K3_TOOLS[0]), close)
        if not calls:
            continue
        begin, end = start, position
        if text.endswith(_K3_AROUND[0], 0, begin):
            begin -= len(_K3_AROUND[0])
        if text.startswith(_K3_AROUND[1], end):
            end += len(_K3_AROUND[1])
        matches.append(NativeMatch("kimi_k3", begin, end, tuple(calls)))
    return matches


def _k3_calls(scanner: Scanner, begin: int, stop: int) -> list[NativeCall] | None:
    text = scanner.text
    calls: list[NativeCall] = []
    position = begin
    while True:
        head = _K3_CALL.match(text, position, stop)
        if head is None:
            return calls if not text[position:stop].strip() else None
        scanner.count(head.end() - position)
        end = scanner.find(_K3_CALL_END, head.end(), stop)
        if end < 0:
            return None
        arguments: dict[str, object] = {}
        cursor = head.end()
        while cursor < end:
            argument = _K3_ARGUMENT.match(text, cursor, end)
            if argument is None:
                if text[cursor:end].strip():
                    return None
                break
            value_end = scanner.find(_K3_ARGUMENT_END, argument.end(), end)
            if value_end < 0:
                return None
            raw = text[argument.end() : value_end]
            if argument.group(2) == "string":
                arguments[argument.group(1)] = raw
            else:
                try:
                    arguments[argument.group(1)] = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    return None
            cursor = value_end + len(_K3_ARGUMENT_END)
        calls.append(NativeCall(head.group(1), arguments, head.start(), end + len(_K3_CALL_END)))
        position = end + len(_K3_CALL_END)


# Calls other templates write inside Hermes' ``<tool_call>`` tag: Python's call syntax
# (``<tool_call>get_weather(city="NYC")</tool_call>``), and harmony's recipient header
# (``<tool_call>assistant to=functions.NAME json\n{...}\n</tool_call>``).
_TOOL_CALL = ("<tool_call>", "</tool_call>")
_PYTHONIC_HEAD = re.compile(r"\s*\[?\s*[A-Za-z_][\w.]*\(")
_RECIPIENT = re.compile(r"\s*(?:assistant\s+)?to=functions\.([^\s<{]{1,200})(?:\s+json)?\s*")


def tool_call_pythonic(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    del schemas
    text = scanner.text
    matches: list[NativeMatch] = []
    position = 0
    while len(matches) < MAX_MATCHES:
        start = scanner.find(_TOOL_CALL[0], position)
        if start < 0:
            break
        body = start + len(_TOOL_CALL[0])
        close = scanner.find(_TOOL_CALL[1], body)
        if close < 0:
            break
        position = close + len(_TOOL_CALL[1])
        if _PYTHONIC_HEAD.match(text, body, close) is None:
            continue
        source = text[body:close].strip()
        calls = tolerant_calls(source if source.startswith("[") else "[" + source + "]")
        if calls is None:
            continue
        matches.append(
            NativeMatch(
                "hermes",
                start,
                position,
                make_calls((n, a, start, position, False) for n, a in calls),
            )
        )
    return matches


def tool_call_recipient(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    del schemas
    text = scanner.text
    matches: list[NativeMatch] = []
    position = 0
    while len(matches) < MAX_MATCHES:
        start = scanner.find(_TOOL_CALL[0], position)
        if start < 0:
            break
        body = start + len(_TOOL_CALL[0])
        position = body
        head = _RECIPIENT.match(text, body)
        if head is None or not text.startswith("{", head.end()):
            continue
        read = json_at(scanner, head.end())
        if read is None or not isinstance(read[0], dict):
            continue
        after = skip_space(scanner, read[1])
        if not text.startswith(_TOOL_CALL[1], after):
            continue
        end = after + len(_TOOL_CALL[1])
        matches.append(
            NativeMatch(
                "openai_harmony", start, end, (NativeCall(head.group(1), read[0], start, end),)
            )
        )
        position = end
    return matches


# Tencent Hunyuan 3 (``Hy3``): Hunyuan v3's markers with ``:opensource`` in each tag:
# ``<tool_calls:opensource><tool_call:opensource>NAME<tool_sep:opensource>``
# ``<arg_key:opensource>K</arg_key:opensource><arg_value:opensource>V</arg_value:opensource>``
# ``</tool_call:opensource></tool_calls:opensource>``.
_HY3_CALL = ("<tool_call:opensource>", "</tool_call:opensource>")
_HY3_CALLS = ("<tool_calls:opensource>", "</tool_calls:opensource>")
_HY3_SEP = "<tool_sep:opensource>"
_HY3_ARGUMENT = re.compile(
    r"\s*<arg_key:opensource>(.*?)</arg_key:opensource>\s*<arg_value:opensource>",
    re.DOTALL,
)
_HY3_VALUE_END = "</arg_value:opensource>"


def hunyuan_v3_opensource(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    text = scanner.text
    calls: list[NativeCall] = []
    spans: list[tuple[int, int]] = []
    position = 0
    while len(calls) < MAX_MATCHES:
        start = scanner.find(_HY3_CALL[0], position)
        if start < 0:
            break
        close = scanner.find(_HY3_CALL[1], start)
        if close < 0:
            break  # cut off before the call closed
        position = close + len(_HY3_CALL[1])
        body = start + len(_HY3_CALL[0])
        separator = scanner.find(_HY3_SEP, body, close)
        name = text[body : separator if separator >= 0 else close].strip()
        if not re.fullmatch(r"[A-Za-z_][\w.\-]{0,200}", name):
            continue
        raw: dict[str, str] = {}
        cursor = separator + len(_HY3_SEP) if separator >= 0 else close
        complete = True
        while cursor < close:
            argument = _HY3_ARGUMENT.match(text, cursor, close)
            if argument is None:
                complete = not text[cursor:close].strip()
                break
            value_end = scanner.find(_HY3_VALUE_END, argument.end(), close)
            if value_end < 0:
                complete = False
                break
            raw[argument.group(1).strip()] = text[argument.end() : value_end]
            cursor = SPACE.match(text, value_end + len(_HY3_VALUE_END)).end()  # type: ignore[union-attr]
        if not complete:
            continue
        arguments, untyped = typed_arguments(name, raw, schemas)
        calls.append(NativeCall(name, arguments, start, position, untyped))
        spans.append((start, position))
    return grouped(scanner, "hunyuan_v3", calls, spans, _HY3_CALLS)
