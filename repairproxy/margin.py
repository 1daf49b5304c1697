"""The tool-name margin probe: how close the model came to naming another tool.

With ``--margin-probe`` a request that declares tools asks the upstream for ``logprobs`` and
``top_logprobs``; for each tool call the margin is the log-prob of the chosen token minus that of
its strongest rival, at the token where the name was decided: where the written name leaves the
declared name nearest it (Retail's names share prefixes, ``get_order_details`` and
``get_user_details``, so their first token decides nothing). Thin margins are where quantization
flips decisions. Works on OpenAI-shaped logprobs (vLLM, the embedded server); answers without them
give no margin.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from typing import Any

from repairproxy.textcalls import find_text_calls

__all__ = [
    "PROBE_TOP_LOGPROBS",
    "decision_offset",
    "named_tool_name_margins",
    "strip_probe",
    "tool_name_margins",
    "with_probe",
]

PROBE_TOP_LOGPROBS = 5


def with_probe(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``body`` asking for logprobs, and whether the probe added them (strip them later if so).

    Left alone when the request declares no tools or the client asked for logprobs itself.
    """
    if not body.get("tools") or body.get("logprobs") or body.get("top_logprobs"):
        return body, False
    return {**body, "logprobs": True, "top_logprobs": PROBE_TOP_LOGPROBS}, True


def strip_probe(completion: dict[str, Any]) -> dict[str, Any]:
    """Remove the logprobs the probe added, in place (a completion or a chunk); returns it."""
    choices = completion.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, dict) and "logprobs" in choice:
                choice["logprobs"] = None  # what an answer that never asked for them carries
    return completion


def _token_text(entry: Mapping[str, Any]) -> str:
    token = entry.get("token")
    return token if isinstance(token, str) else ""


def _same_token(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    a_bytes, b_bytes = a.get("bytes"), b.get("bytes")
    if isinstance(a_bytes, list) and isinstance(b_bytes, list):
        return a_bytes == b_bytes
    return _token_text(a) == _token_text(b)


def _margin(entry: Mapping[str, Any]) -> float | None:
    chosen = entry.get("logprob")
    top = entry.get("top_logprobs")
    if not isinstance(chosen, int | float) or not isinstance(top, list):
        return None
    rivals = [
        float(alt["logprob"])
        for alt in top
        if isinstance(alt, Mapping)
        and isinstance(alt.get("logprob"), int | float)
        and not _same_token(alt, entry)
    ]
    return float(chosen) - max(rivals) if rivals else None


def _call_names(message: Mapping[str, Any]) -> list[str]:
    """The names of the message's tool calls; of the calls written as text when it has none."""
    names: list[str] = []
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if isinstance(name, str) and name:
            names.append(name)
    content = message.get("content")
    if not names and isinstance(content, str):
        names = [call.name for call in find_text_calls(content) if call.name]
    return names


def _find_name(text: str, name: str, start: int) -> int:
    """Where the tool name begins in the generated text: after a JSON ``"name"`` key if any."""
    keyed = re.compile(r'"name"\s*:\s*"(' + re.escape(name) + ")").search(text, start)
    if keyed is not None:
        return keyed.start(1)
    return text.find(name, start)


def decision_offset(name: str, declared: Sequence[str]) -> int:
    """Where ``name`` leaves the declared name nearest it: the length of the longest prefix it
    shares with any other declared name (0 when none is declared). The token holding that
    character chose between them; at the name's length (a declared name continues it), the
    token after the name did."""
    others = [other for other in declared if other != name]
    if not others:
        return 0
    return max(_shared_prefix(name, other) for other in others)


def _shared_prefix(a: str, b: str) -> int:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


def named_tool_name_margins(
    completion: Mapping[str, Any], declared: Sequence[str] = ()
) -> list[tuple[str, float]]:
    """(written name, margin) per tool call whose deciding token is in
    ``choices[0].logprobs.content``, in call order; the deciding token is where the name leaves
    the nearest of ``declared`` (``decision_offset``), its first token without ``declared``.

    Calls written as text (a small model's ``{"name": ...}`` in ``content``) count as calls.
    """
    choices = completion.get("choices")
    if not isinstance(choices, Sequence) or not choices or not isinstance(choices[0], Mapping):
        return []
    choice = choices[0]
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    message = choice.get("message")
    if not isinstance(content, list) or not content or not isinstance(message, Mapping):
        return []
    entries = [entry for entry in content if isinstance(entry, Mapping)]
    ends: list[int] = []
    length = 0
    for entry in entries:
        length += len(_token_text(entry))
        ends.append(length)
    text = "".join(_token_text(entry) for entry in entries)
    margins: list[tuple[str, float]] = []
    cursor = 0
    for name in _call_names(message):
        at = _find_name(text, name, cursor)
        if at < 0:
            continue  # the call is not in the scored tokens (e.g. an API that hides them)
        cursor = at + len(name)
        decided = at + decision_offset(name, declared)
        if decided >= length:  # nothing scored after the name: its last character's token
            decided = at + len(name) - 1
        margin = _margin(entries[bisect.bisect_right(ends, decided)])
        if margin is not None:
            margins.append((name, margin))
    return margins


def tool_name_margins(completion: Mapping[str, Any], declared: Sequence[str] = ()) -> list[float]:
    """The margins of ``named_tool_name_margins``, in call order."""
    return [margin for _, margin in named_tool_name_margins(completion, declared)]
