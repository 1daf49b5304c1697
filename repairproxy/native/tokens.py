"""Formats made of special tokens: DeepSeek V3/V3.1, Kimi K2, gpt-oss harmony, Mistral
``[TOOL_CALLS]``; each also read with its markers dropped where that stays unambiguous."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from repairproxy.native.base import (
    MAX_MATCHES,
    NativeCall,
    NativeMatch,
    Scanner,
    Schemas,
    call_objects,
    declared,
    grouped,
    json_at,
    loads,
    make_calls,
    skip_space,
)

__all__ = [
    "DS_CALLS_BEGIN",
    "DS_CALL_BEGIN",
    "KIMI_SECTION",
    "MISTRAL",
    "deepseek",
    "harmony",
    "kimi",
    "kimi_may",
    "mistral",
    "mistral_may",
]

DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
_DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
_DS_CALL_END = "<｜tool▁call▁end｜>"
_DS_SEP = "<｜tool▁sep｜>"
_DS_V3_HEAD = re.compile(
    r"\s*function\s*" + re.escape(_DS_SEP) + r"\s*([^\s`]{1,200})\s*```(?:json)?\s*"
)
_DS_V31_HEAD = re.compile(r"\s*([^\s<]{1,200})\s*" + re.escape(_DS_SEP) + r"\s*")


def deepseek(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """DeepSeek V3 (``function<sep>NAME ```json {...} ```) and V3.1 (``NAME<sep>{...}``)."""
    del schemas
    text = scanner.text
    calls: list[NativeCall] = []
    spans: list[tuple[int, int]] = []
    position = 0
    while len(calls) < MAX_MATCHES:
        start = scanner.find(DS_CALL_BEGIN, position)
        if start < 0:
            break
        close = scanner.find(_DS_CALL_END, start)
        if close < 0:
            break
        position = close + len(_DS_CALL_END)
        body = start + len(DS_CALL_BEGIN)
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
        value = loads(raw)
        if not isinstance(value, dict):
            continue
        calls.append(NativeCall(head.group(1), value, start, position))
        spans.append((start, position))
    return grouped(scanner, "deepseek", calls, spans, (DS_CALLS_BEGIN, _DS_CALLS_END))


KIMI_SECTION = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
_KIMI_HEAD = re.compile(r"\s*(?:functions\.)?([A-Za-z_][\w\-]*(?:\.[A-Za-z_][\w\-]*)*)?:?(\d+)\s*$")
_KIMI_STRIPPED = re.compile(r"(functions\.)?([A-Za-z_][\w\-.]{0,200}):(\d+)[ \t]*(?=[{\[])")


_KIMI_INDEX = re.compile(r":\d+[ \t]*[{\[]")


def kimi_may(text: str, schemas: Schemas | None) -> bool:
    """Whether a Kimi call can be in ``text``: its section marker, or the stripped head
    ``functions.NAME:0 {`` (or ``NAME:0 {`` for a declared name)."""
    if KIMI_SECTION[0] in text:
        return True
    if "{" not in text or _KIMI_INDEX.search(text) is None:
        return False
    return "functions." in text or any(f"{name}:" in text for name in schemas or ())


def kimi(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """Kimi K2: ``<|tool_call_begin|>functions.NAME:IDX <|tool_call_argument_begin|>{...}``
    ``<|tool_call_end|>`` inside ``<|tool_calls_section_begin|>...``.

    A call written with the index only takes its name from the declared tools when exactly one
    of them fits its arguments; a malformed head (``functions.name.0``) is dropped.
    """
    text = scanner.text
    matches: list[NativeMatch] = []
    position = 0
    while len(matches) < MAX_MATCHES:
        start = scanner.find(KIMI_SECTION[0], position)
        if start < 0:
            break
        close = scanner.find(KIMI_SECTION[1], start)
        stop = close if close >= 0 else len(text)
        end = close + len(KIMI_SECTION[1]) if close >= 0 else len(text)
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
            value = loads(text[argument + len("<|tool_call_argument_begin|>") : call_end].strip())
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
        if found.group(1) is None and not declared(name, schemas):
            continue
        if found.group(1) is None and found.start() and text[found.start() - 1].isalnum():
            continue
        read = json_at(scanner, found.end())
        if read is None or not isinstance(read[0], dict):
            continue
        calls.append(NativeCall(name, read[0], found.start(), read[1]))
        spans.append((found.start(), read[1]))
    return grouped(scanner, "kimi_k2", calls, spans, None)


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
    r"\s*(?:<\|start\|>\s*assistant\s*)?"
    r"(?:<\|channel\|>\s*(?P<channel>analysis|final|commentary)\s*)?<\|message\|>"
)


def harmony(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
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
        # The call's value, then ``<|call|>``; servers strip ``<|call|>`` as a stop token, and
        # a template writing ``<|end|>`` (a final message follows) ends it the same way.
        body = skip_space(scanner, found.end())
        if text.startswith("{", body):
            read = json_at(scanner, body)
            if read is None:
                break  # cut off inside its value: no call
            value, value_end = read
        elif text.startswith("<|call|>", body):
            value, value_end = {}, body
        else:
            position = body
            continue
        position = skip_space(scanner, value_end)
        for closer in ("<|call|>", "<|end|>"):
            if text.startswith(closer, position):
                position += len(closer)
                break
        else:
            position = value_end
        if not isinstance(value, dict):
            continue
        if first < 0:
            first = _harmony_transcript_start(text, found.start())
        calls.append(NativeCall(name, value, found.start(), position))
        last = position
    if not calls:
        return []
    final = _HARMONY_MESSAGE.match(text, last)
    if final is not None and final.group("channel") in ("final", None):
        # A final message ends with ``<|return|>`` (its stop token, when the server keeps it) or,
        # in a transcript, ``<|end|>``; neither is prose.
        ends = [
            (found_at, marker)
            for marker in ("<|end|>", "<|return|>")
            if (found_at := text.find(marker, final.end())) >= 0
        ]
        stop, marker = min(ends) if ends else (len(text), "")
        kept.append((final.end(), stop))
        last = stop + len(marker)
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


MISTRAL = "[TOOL_CALLS]"
# v11 ``NAME{...}``; v13 and Magistral/Devstral ``NAME[ARGS]{...}``; Mistral Small 3.2
# ``NAME[CALL_ID]ID[ARGS]{...}`` (the call id is the model's, dropped: the proxy names calls).
_MISTRAL_HEAD = r"([A-Za-z_][\w.\-]{0,200})(?:\[CALL_ID\][A-Za-z0-9_\-]{0,64})?(?:\[ARGS\])?\s*"
_MISTRAL_V11 = re.compile(r"\s*" + _MISTRAL_HEAD + r"(?=\{)")
_MISTRAL_STRIPPED = re.compile(r"\A\s*" + _MISTRAL_HEAD + r"(?=\{)")


def mistral_may(text: str, schemas: Schemas | None) -> bool:
    """Whether a Mistral call can be in ``text``: its marker, or the whole text one stripped
    ``NAME{`` call to a declared tool."""
    if MISTRAL in text:
        return True
    named = _MISTRAL_STRIPPED.match(text)
    return named is not None and declared(named.group(1), schemas)


def mistral(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """``[TOOL_CALLS][{...}]`` (before v11) and ``[TOOL_CALLS]NAME{...}`` (v11, repeatable)."""
    text = scanner.text
    matches: list[NativeMatch] = []
    calls: list[NativeCall] = []
    spans: list[tuple[int, int]] = []
    position = 0
    while len(matches) + len(calls) < MAX_MATCHES:
        start = scanner.find(MISTRAL, position)
        if start < 0:
            break
        body = start + len(MISTRAL)
        position = body
        named = _MISTRAL_V11.match(text, body)
        if named is not None:
            read = json_at(scanner, named.end())
            if read is not None and isinstance(read[0], dict):
                calls.append(NativeCall(named.group(1), read[0], named.start(1), read[1]))
                spans.append((start, read[1]))
                position = read[1]
            continue
        following = text.find(MISTRAL, body)
        limit = following if following >= 0 else len(text)  # read up to the next marker only
        opening = scanner.find("[", body, limit)
        brace = text.find("{", body, opening if opening >= 0 else limit)
        if opening < 0 or brace >= 0:
            continue
        read = json_at(scanner, opening)
        found = call_objects(read[0]) if read is not None and isinstance(read[0], list) else None
        if read is None or found is None:
            continue
        junk = (body, opening) if text[body:opening].strip() else None
        matches.append(
            NativeMatch(
                "mistral",
                start,
                read[1],
                make_calls((n, a, opening, read[1], False) for n, a in found),
                (junk,) if junk else (),
            )
        )
        position = read[1]
    matches.extend(grouped(scanner, "mistral", calls, spans, None))
    if not matches and MISTRAL not in text:
        named = _MISTRAL_STRIPPED.match(text)
        if named is not None and declared(named.group(1), schemas):
            read = json_at(scanner, named.end())
            if read is not None and isinstance(read[0], dict) and not text[read[1] :].strip():
                call = NativeCall(named.group(1), read[0], named.start(1), read[1])
                matches.append(NativeMatch("mistral", named.start(1), read[1], (call,)))
    return sorted(matches, key=lambda match: match.start)
