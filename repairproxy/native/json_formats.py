"""Formats that write JSON after a marker or bare: hermes-style tags, Granite, Granite 20B,
InternLM2, Phi-4-mini, Hunyuan/Jamba ``<tool_calls>``, Apertus, Cohere, fenced and bare JSON."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from repairproxy.native.base import (
    MAX_MATCHES,
    NOT_JSON,
    NativeCall,
    NativeMatch,
    Scanner,
    Schemas,
    call_objects,
    json_at,
    loads,
    make_calls,
    skip_space,
)

__all__ = [
    "apertus",
    "cohere",
    "fenced_json",
    "llama3_json",
    "marker_json",
]


def marker_json(
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
            body = skip_space(scanner, start + len(opener))
            position = start + len(opener)
            if body >= len(scanner.text) or scanner.text[body] not in "[{":
                continue
            if lists_only and scanner.text[body] != "[":
                continue
            read = json_at(scanner, body)
            if read is None:
                continue
            value, end = read
            calls = call_objects(value, name_keys)
            if calls is None:
                continue
            stop = end
            if closer is not None:
                after = skip_space(scanner, end)
                if scanner.text.startswith(closer, after):
                    stop = after + len(closer)
            matches.append(
                NativeMatch(
                    family, start, stop, make_calls((n, a, body, end, False) for n, a in calls)
                )
            )
            position = stop
        return matches

    return recognise


def llama3_json(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
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
        value = loads(text[start:end])
        calls = call_objects(value) if value is not NOT_JSON else None
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


def fenced_json(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
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
        body = skip_space(scanner, opened.end())
        read = json_at(scanner, body) if body < close and text[body] in "[{" else None
        if read is None or text[read[1] : close].strip():
            continue
        calls = call_objects(read[0], ("name", "tool_name"))  # Command R+ writes tool_name
        if calls is None:
            continue
        matches.append(
            NativeMatch(
                "fenced_json",
                _action_label(text, start),
                close + 3,
                make_calls((n, a, body, read[1], False) for n, a in calls),
            )
        )
    return matches


# Command R+'s template writes its call as "Action:" then the fence: the label is the wrapper's.
_ACTION_LABEL = re.compile(r"(?:^|\n)(Action:[ \t]*\n?)\Z")


def _action_label(text: str, fence: int) -> int:
    """Where the fence at ``fence`` starts, with Command R+'s "Action:" label right before it."""
    found = _ACTION_LABEL.search(text, max(0, fence - 12), fence)
    return found.start(1) if found is not None else fence


def apertus(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
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
        body = skip_space(scanner, start + len(opener))
        close = scanner.find(closer, body)
        stop = close if close >= 0 else len(text)
        position = stop
        scanner.count(stop - body)
        value = loads(text[body:stop].strip())
        if value is NOT_JSON:
            value = loads(_closed_json(text[body:stop].strip()))
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


def cohere(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """Command R+/A: ``<|START_ACTION|>[{"tool_name": ..., "parameters": ...}]<|END_ACTION|>``."""
    found = marker_json(
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
