"""Parse ``<tool_call>`` blocks out of model text the way vLLM's ``hermes`` tool parser does.

Behaviour kept on purpose, because the proxy must see what a vLLM deployment would show it:
a declared name is not required (invented names pass through); a block whose JSON does not parse, or
lacks ``name``/``arguments``, makes the *whole* answer plain content with no tool calls; JSON
written without the tags stays in the content; text after the first ``<tool_call>`` is dropped.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

__all__ = [
    "TOOL_CALL_END",
    "TOOL_CALL_START",
    "HermesStreamSplitter",
    "ParsedCall",
    "ParsedOutput",
    "new_tool_call_id",
    "parse_hermes",
]

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
# A closed block, or an unclosed one running to the end of the text (cut by max_tokens or a stop).
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def new_tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text, re-serialised from the parsed object as vLLM does
    id: str = field(default_factory=new_tool_call_id)

    def to_openai(self) -> dict[str, object]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    content: str | None
    tool_calls: tuple[ParsedCall, ...] = ()

    @property
    def tools_called(self) -> bool:
        return bool(self.tool_calls)


def parse_hermes(text: str) -> ParsedOutput:
    """Split a finished answer into content and tool calls (vLLM ``extract_tool_calls``)."""
    if TOOL_CALL_START not in text:
        return ParsedOutput(text)
    calls: list[ParsedCall] = []
    for closed, unclosed in _BLOCK.findall(text):
        try:
            raw = json.loads(closed or unclosed)
            name = raw["name"]
            arguments = json.dumps(raw["arguments"], ensure_ascii=False)
        except (ValueError, KeyError, TypeError):
            return ParsedOutput(text)  # any bad block: vLLM gives up and returns all of it as text
        if not isinstance(name, str):
            return ParsedOutput(text)
        calls.append(ParsedCall(name, arguments))
    content = text[: text.find(TOOL_CALL_START)]
    return ParsedOutput(content or None, tuple(calls))


class HermesStreamSplitter:
    """Streams content as it comes and holds everything from the first ``<tool_call>`` on.

    ``feed`` returns the text that is safe to send as content now; ``finish`` parses the whole
    answer. Unlike vLLM, arguments are not streamed piecewise: the held calls are released whole
    once the answer ends (the proxy buffers tool-call deltas anyway).
    """

    def __init__(self) -> None:
        self._text: list[str] = []
        self._sent = 0
        self._holding = False

    @property
    def text(self) -> str:
        return "".join(self._text)

    def feed(self, delta: str) -> str:
        self._text.append(delta)
        if self._holding:
            return ""
        text = self.text
        start = text.find(TOOL_CALL_START, self._sent)
        if start >= 0:
            self._holding = True
            safe_end = start
        else:
            # Keep back a tail that could still grow into "<tool_call>".
            safe_end = len(text)
            for keep in range(min(len(TOOL_CALL_START) - 1, len(text) - self._sent), 0, -1):
                if TOOL_CALL_START.startswith(text[len(text) - keep :]):
                    safe_end = len(text) - keep
                    break
        out = text[self._sent : safe_end]
        self._sent = safe_end
        return out

    def finish(self) -> tuple[str, ParsedOutput]:
        """(content not yet sent, parse of the whole answer)."""
        text = self.text
        parsed = parse_hermes(text)
        rest = "" if parsed.tools_called else text[self._sent :]
        self._sent = len(text)
        return rest, parsed
