"""Judge one raw answer at one decision point: channel, gold agreement, invented names, margin.

The channels are the proxy's own (``repairproxy.validation``, what the proxy runs with repair off:
nothing promoted, nothing re-asked), applied to the answer exactly as the upstream wrote it. The
judge is a pure function of (declared tools, gold call, raw completion), so ``--report`` re-derives
every verdict from the JSONL without a model or a proxy.

The tool-name margin is read at the token where the written name leaves the declared names: the
declared name sharing the longest prefix with it is its nearest rival (for a declared name, the
nearest *other* one), and the token holding the first character past that common prefix is where
the model chose. Margin = that token's log-prob minus its best alternative's.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from repairproxy.textcalls import stopped_by_length
from repairproxy.validation import Channel, CompiledTools, MessageVerdict, ToolsCache

__all__ = [
    "CHANNELS",
    "ERROR_CHANNELS",
    "THIN_MARGIN_NATS",
    "Judge",
    "Verdict",
    "divergence_margin",
]

# The answer-level channels, in the order reports show them.
CHANNELS = (
    "valid",
    "unknown_tool",
    "invalid_json",
    "schema_violation",
    "tool_call_in_content",
    "empty",
)
ERROR_CHANNELS = CHANNELS[1:]
# Under half a nat the written name was barely preferred (benchmarks/margin_probe's threshold).
THIN_MARGIN_NATS = 0.5

_CHANNEL_NAMES = {
    Channel.VALID: "valid",
    Channel.UNKNOWN_TOOL: "unknown_tool",
    Channel.INVALID_JSON: "invalid_json",
    Channel.SCHEMA_VIOLATION: "schema_violation",
    Channel.TOOL_CALL_IN_CONTENT: "tool_call_in_content",
    Channel.EMPTY_OUTPUT: "empty",
    # Not a study channel: a structured call the request's constraints forbid (the screen's
    # requests set none, so it never occurs there); as a call it is well-formed.
    Channel.REQUEST_CONFLICT: "valid",
}


@dataclass(frozen=True)
class Verdict:
    """What the screen counts about one answer."""

    channels: frozenset[str]  # every channel of its calls; {"valid"} when nothing failed
    text_only: bool  # a plain text answer: no call at all (valid to the proxy)
    gold_name: bool  # its first structured call names the gold tool
    gold_call: bool  # ... with the gold arguments
    invented: tuple[str, ...]  # undeclared names it called (structured or written as text)
    margin: float | None  # at the first call's divergence token; None without logprobs

    def has(self, channel: str) -> bool:
        return channel in self.channels


def _message(completion: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = completion.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        message = choices[0].get("message")
        if isinstance(message, Mapping):
            return message
    return {}


def _canonical(value: Any) -> bytes | None:
    try:
        parsed = orjson.loads(value) if isinstance(value, str) else value
        return orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONDecodeError, TypeError):
        return None


def _first_structured(message: Mapping[str, Any]) -> tuple[str | None, Any]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls or not isinstance(calls[0], Mapping):
        return None, None
    function = calls[0].get("function")
    if not isinstance(function, Mapping):
        return None, None
    name = function.get("name")
    return (name if isinstance(name, str) else None), function.get("arguments")


def _common_prefix(a: str, b: str) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


def _divergence(name: str, declared: Sequence[str]) -> int:
    """Index of the first character of ``name`` that no rival declared name shares."""
    rivals = [other for other in declared if other != name]
    if not rivals:
        return 0
    return max(_common_prefix(name, other) for other in rivals)


def _token_text(entry: Mapping[str, Any]) -> str:
    token = entry.get("token")
    return token if isinstance(token, str) else ""


def _token_margin(entry: Mapping[str, Any]) -> float | None:
    chosen = entry.get("logprob")
    top = entry.get("top_logprobs")
    if not isinstance(chosen, int | float) or not isinstance(top, list):
        return None
    mine = _token_text(entry)
    rivals = [
        float(alt["logprob"])
        for alt in top
        if isinstance(alt, Mapping)
        and isinstance(alt.get("logprob"), int | float)
        and _token_text(alt) != mine
    ]
    return float(chosen) - max(rivals) if rivals else None


def divergence_margin(
    completion: Mapping[str, Any], name: str, declared: Sequence[str]
) -> float | None:
    """The log-prob margin at the token where ``name`` leaves the declared names (or None)."""
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None
    logprobs = choices[0].get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    if not isinstance(content, list) or not content:
        return None
    entries = [entry for entry in content if isinstance(entry, Mapping)]
    text = "".join(_token_text(entry) for entry in entries)
    keyed = re.compile(r'"name"\s*:\s*"(' + re.escape(name) + ")").search(text)
    start = keyed.start(1) if keyed is not None else text.find(name)
    if start < 0:
        return None
    at = start + _divergence(name, declared)
    ends: list[int] = []
    length = 0
    for entry in entries:
        length += len(_token_text(entry))
        ends.append(length)
    index = bisect.bisect_right(ends, at)
    return _token_margin(entries[index]) if index < len(entries) else None


def _call_names(verdict: MessageVerdict) -> list[str]:
    return [call.name for call in verdict.calls if call.name]


class Judge:
    """Judges answers against one domain's declared tools (compiled once)."""

    def __init__(self, tools: list[dict[str, Any]]) -> None:
        compiled: CompiledTools | None = ToolsCache().compile({"tools": tools})
        if compiled is None:  # pragma: no cover - a domain always declares tools
            raise ValueError("no tools declared")
        self._tools = compiled

    def judge(
        self, completion: Mapping[str, Any], gold_name: str, gold_arguments: Mapping[str, Any]
    ) -> Verdict:
        message = _message(completion)
        # as the proxy's first verdict: an answer cut off by the token limit promotes nothing
        verdict = self._tools.check_message(message, cut_off=stopped_by_length(completion))
        declared = self._tools.names
        channels = frozenset(_CHANNEL_NAMES[call.channel] for call in verdict.calls) or {"valid"}
        if channels != {"valid"}:
            channels = channels - {"valid"}
        name, arguments = _first_structured(message)
        gold_args = _canonical(dict(gold_arguments))
        invented = tuple(n for n in _call_names(verdict) if n not in declared)
        names = _call_names(verdict)
        margin = divergence_margin(completion, names[0], declared) if names else None
        return Verdict(
            channels=frozenset(channels),
            text_only=not verdict.calls,
            gold_name=name == gold_name,
            gold_call=name == gold_name and _canonical(arguments) == gold_args,
            invented=invented,
            margin=margin,
        )
