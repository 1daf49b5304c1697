"""Which ``role: tool`` results report a failed call, as the agent frameworks write them.

τ²-bench counts one error per tool message its environment flags; the proxy only sees the text, so
it recognises failures by the formats frameworks use (``KNOWN_FORMATS``, each traced to its source)
and sorts them into a few bounded labels (``DEFAULT_ENV_ERROR_TABLE``) for headers and metrics.

Default vs override: ``--tool-error-pattern`` defaults to ``^Error`` (τ²-bench's own format).
Left at that default it means "the whole table" (which contains ``^Error``); any other pattern
replaces the table entirely, so an operator who knows the agent's format gets exactly that.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "DEFAULT_ENV_ERROR_TABLE",
    "DEFAULT_TOOL_ERROR_PATTERN",
    "ENV_OTHER_ERROR",
    "KNOWN_FORMATS",
    "TEXT_ERROR_FORMATS",
    "ErrorClassifier",
    "ToolErrorDetector",
    "ToolErrorFormat",
    "scanned_text",
]

# The value of --tool-error-pattern that selects the table (settings' default).
DEFAULT_TOOL_ERROR_PATTERN = r"^Error"
# A tool result longer than this is matched on its first and last halves of this size only:
# frameworks put their markers at either end, and a 1 MB result must not cost a 1 MB regex scan.
MAX_SCANNED_CHARS = 8192


@dataclass(frozen=True, slots=True)
class ToolErrorFormat:
    """How one framework writes a failed call into the ``role: tool`` message."""

    framework: str
    pattern: str  # searched (re.search) in the result text
    source: str  # where the format comes from: file and version


KNOWN_FORMATS: tuple[ToolErrorFormat, ...] = (
    ToolErrorFormat(
        "tau2-bench",
        r"^Error",
        "tau2 v1.0.1 environment: ToolMessage(content=f'Error: {e}', error=True); also every "
        "LangGraph ToolNode template (langgraph/prebuilt/tool_node.py 1.2.24: "
        "'Error: {error}\\n Please fix your mistakes.', 'Error: {requested_tool} is not a valid "
        "tool, ...', 'Error invoking tool ...')",
    ),
    ToolErrorFormat(
        "openai-agents",
        r"^An error occurred while (?:running the tool|parsing tool arguments)\."
        r"(?: Please try again|$)",
        "openai-agents src/agents/tool.py default_tool_error_function: v0.0.3-v0.22.0 "
        "'... Please try again. Error: {error}', 0.24.0 without the error text, 0.25.0 the "
        "sentence alone ('An error occurred while running the tool.', the whole result)",
    ),
    ToolErrorFormat(
        "openai-agents-timeout",
        r"^Tool '[^'\n]*' timed out after [0-9.]+ seconds\.$",
        "openai-agents src/agents/tool.py default_tool_timeout_error_message (v0.14.0-0.24.0)",
    ),
    ToolErrorFormat(
        "pydantic-ai-retry",
        r"\n\nFix the errors and try again\.$",
        "pydantic_ai_slim/pydantic_ai/messages.py RetryPromptPart.model_response (v0.0.14-v2.33)",
    ),
    ToolErrorFormat(
        "pydantic-ai-json",
        r'^\{"error":',
        "pydantic-ai 2.68.0 OpenAIChatModel: a ModelRetry, a validation error or an unknown "
        'tool comes back as {"error": ...}',
    ),
    ToolErrorFormat(
        "instructor",
        r"^Validation Error found:\n",
        "instructor 1.17.0 processing/response.py reask for the tools modes: the tool result "
        "'Validation Error found:\\n{exception}\\nRecall the function correctly, fix the "
        "errors' (pydantic's '1 validation error for Model ...')",
    ),
    ToolErrorFormat(
        "langchain-tool-exception",
        r"^Tool (?:execution|input validation) error$",
        "langchain_core/tools/base.py 1.8.3 _handle_tool_error / _handle_validation_error "
        "(handle_tool_error=True with an empty ToolException; a ToolException with a message "
        "is sent as the bare message and cannot be told from a result)",
    ),
)

# Frameworks that write tool results into user messages, not ``role: tool`` ones: each match of
# the pattern is one failed call (its group ``error`` the error's text, for the labels below).
TEXT_ERROR_FORMATS: tuple[ToolErrorFormat, ...] = (
    ToolErrorFormat(
        "smolagents",
        r"(?:^|\n)Error:\n(?P<error>.*?)\nNow let's retry: take care not to repeat previous "
        r"errors!",
        "smolagents 1.26.0 memory.py ActionStep.to_messages: 'Error:\\n' + str(error) + "
        '"\\nNow let\'s retry: take care not to repeat previous errors! ...", merged into the '
        "user message (captured in tests/data/frameworks/smolagents-1.26.0.json)",
    ),
)
# A text format's marker: user messages without it are not searched at all.
_TEXT_ERROR_MARKER = "\nNow let's retry: "

# (label, pattern) in order, first match wins; an error that matches none is env_other_error.
DEFAULT_ENV_ERROR_TABLE: tuple[tuple[str, str], ...] = (
    (
        "env_unknown_tool",
        r"Tool '[^']*' not found|is not a valid tool, try one of|Unknown tool name:",
    ),
    (
        "env_argument_error",
        r"unexpected keyword argument|missing \d+ required|required (positional|keyword)"
        r"|positional arguments? but|validation errors? for|\d+ validation errors?:"
        r"|^Error invoking tool '[^']*' with kwargs|Tool input validation error"
        r"|while parsing tool arguments|Invalid arguments for tool|\"loc\":\s*\[",
    ),
    ("env_entity_not_found", r"not found"),
)
ENV_OTHER_ERROR = "env_other_error"


def scanned_text(content: str) -> str:
    """The part of a tool result that patterns look at: all of it, or both ends when huge."""
    if len(content) <= MAX_SCANNED_CHARS:
        return content
    half = MAX_SCANNED_CHARS // 2
    return f"{content[:half]}\n...\n{content[-half:]}"


class ToolErrorDetector:
    """Tells whether a tool result reports a failure: the table, or the operator's own pattern."""

    __slots__ = ("_formats", "_match_start", "_searches", "_text_errors", "pattern")

    def __init__(self, pattern: str | None = DEFAULT_TOOL_ERROR_PATTERN) -> None:
        if pattern is None or pattern == DEFAULT_TOOL_ERROR_PATTERN:
            formats = [(f.framework, f.pattern) for f in KNOWN_FORMATS]
        else:
            formats = [("custom", pattern)]
        self.pattern = "|".join(f"(?:{p})" for _, p in formats)
        self._formats = tuple((name, re.compile(p)) for name, p in formats)
        # One alternation searched at every position costs ~60 us on a 400-character result;
        # the start-anchored formats are tried at position 0 only, the others each on their own
        # (re's literal-prefix scan): ~2 us in all.
        # (Only the table's patterns are split: an operator's "^a|b" is not anchored as a whole.)
        table = len(formats) > 1
        anchored = [p[1:] for _, p in formats if table and p.startswith("^")]
        floating = [p for _, p in formats if not (table and p.startswith("^"))]
        self._match_start = (
            re.compile("|".join(f"(?:{p})" for p in anchored)).match if anchored else None
        )
        self._searches = tuple(re.compile(p).search for p in floating)
        # An operator's own pattern replaces the table, the text formats included.
        self._text_errors = (
            tuple(re.compile(f.pattern, re.DOTALL) for f in TEXT_ERROR_FORMATS) if table else ()
        )

    def errors_in_text(self, content: str) -> list[str]:
        """The failed calls a user message reports as text (smolagents), each error's text."""
        if not self._text_errors or _TEXT_ERROR_MARKER not in content:
            return []
        text = scanned_text(content)
        return [m.group("error") for regex in self._text_errors for m in regex.finditer(text)]

    def is_error(self, content: str) -> bool:
        text = scanned_text(content)
        if self._match_start is not None and self._match_start(text) is not None:
            return True
        return any(search(text) is not None for search in self._searches)

    def framework(self, content: str) -> str | None:
        """The first format that matches (``"custom"`` for an operator pattern), else None."""
        text = scanned_text(content)
        return next((name for name, regex in self._formats if regex.search(text)), None)


class ErrorClassifier:
    """Sorts error texts into the labels of a table; remembers the labels of short texts."""

    __slots__ = ("_classes", "_labels")

    # Texts up to this long have their label remembered (whole, as the key); longer ones are
    # classified again each time, so the memory stays bounded by count times this size.
    MAX_REMEMBERED_TEXT_CHARS: ClassVar[int] = 512
    # Labels remembered (cleared when full).
    MAX_REMEMBERED_LABELS: ClassVar[int] = 4096

    def __init__(self, table: Sequence[tuple[str, str]] = DEFAULT_ENV_ERROR_TABLE) -> None:
        self._classes = tuple((label, re.compile(pattern)) for label, pattern in table)
        self._labels: dict[str, str] = {}

    def __call__(self, content: str) -> str:
        label = self._labels.get(content)
        if label is not None:
            return label
        text = scanned_text(content)
        label = next(
            (label for label, pattern in self._classes if pattern.search(text)), ENV_OTHER_ERROR
        )
        if len(content) <= self.MAX_REMEMBERED_TEXT_CHARS:
            if len(self._labels) >= self.MAX_REMEMBERED_LABELS:
                self._labels.clear()
            self._labels[content] = label
        return label
