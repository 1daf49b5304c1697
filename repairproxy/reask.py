"""Pure builders of what a repair re-ask says: the versioned texts, the system instruction, the
repair turn after an invalid answer, and the re-ask request itself (Instructor's ``reask.py``).

No I/O and no loop here: ``repair`` runs the bounded loop and calls these.
"""

from __future__ import annotations

import importlib.resources
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from repairproxy.validation import CallVerdict, Channel, CompiledTools, MessageVerdict
from repairproxy.wire.openai import message_text

__all__ = [
    "DEFAULT_TEMPLATE",
    "DEFAULT_TEMPLATE_FILE",
    "MAX_NAME_EDITS",
    "MAX_QUOTE_CHARS",
    "OPTIONAL_SECTIONS",
    "REPEAT_TEMPERATURE_FACTOR",
    "TEMPLATE_SECTIONS",
    "RepairTemplate",
    "build_output_repair_turn",
    "build_repair_turn",
    "edit_distance",
    "grounding_texts",
    "lowered_temperature",
    "near_name",
    "quote_call",
    "repair_request",
    "ungrounded_values",
    "unrelated_tool",
    "with_repair_instruction",
]

_SECTION = re.compile(r"^=== (\w+) ===[ \t]*$", re.MULTILINE)
_VERSION = re.compile(r"^version\s*=\s*(\S+)\s*$", re.MULTILINE)
TEMPLATE_SECTIONS = (
    "instruction",
    "unknown_tool",
    "invalid_json",
    "schema_violation",
    "valid_sibling",
    "tool_call_in_content",
    "empty_output",
)
# Sections a template may leave out (repair-v1 has none of them); without them a call written as
# text gets the tool_call_in_content text (a call that conflicts with the request too), and a
# repeated answer its channel's own text.
OPTIONAL_SECTIONS = (
    "text_unknown_tool",
    "text_invalid_arguments",
    "unrelated_tool",
    "conflict",
    "repeated",
)
# Every placeholder a section may use; a template using another one is rejected when loaded.
_PLACEHOLDERS = dict.fromkeys(
    (
        "name",
        "closest",
        "declared",
        "diagnosis",
        "errors",
        "parameters",
        "version",
        "attempt",
        "max_repairs",
        "quote",
        "expected",
    ),
    "x",
)


@dataclass(frozen=True, slots=True)
class RepairTemplate:
    """The versioned repair texts: the system instruction and one diagnosis per channel."""

    version: str
    sections: Mapping[str, str]

    @classmethod
    def parse(cls, text: str) -> RepairTemplate:
        parts = _SECTION.split(text)
        version = _VERSION.search(parts[0])
        if version is None:
            raise ValueError("repair template: missing 'version = ...' line before the sections")
        sections = {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}
        missing = [name for name in TEMPLATE_SECTIONS if not sections.get(name)]
        if missing:
            raise ValueError(f"repair template: missing sections {missing}")
        for name, body in sections.items():
            try:
                body.format(**_PLACEHOLDERS)
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(
                    f"repair template: section {name!r}: bad placeholder {exc}"
                ) from exc
        return cls(version.group(1), sections)

    @classmethod
    def from_file(cls, path: str | Path) -> RepairTemplate:
        return cls.parse(Path(path).read_text(encoding="utf-8"))

    def render(self, section: str, **values: Any) -> str:
        return self.sections[section].format(version=self.version, **values)

    def has(self, section: str) -> bool:
        return bool(self.sections.get(section))

    @property
    def instruction(self) -> str:
        return self.sections["instruction"]


# The default texts: repair-v3, whose every re-ask lets the model answer in plain text when no
# declared tool fits (repair-v2, repair-v1 stay for the study's earlier arms: --repair-template).
DEFAULT_TEMPLATE_FILE = "templates/repair_v3.txt"
DEFAULT_TEMPLATE = RepairTemplate.parse(
    importlib.resources.files("repairproxy").joinpath(DEFAULT_TEMPLATE_FILE).read_text("utf-8")
)


_NOT_ALNUM = re.compile(r"[^a-z0-9]")
# ``constrained`` forces a tool the model did not name only when the name it wrote is this many
# single-character edits (insert, delete, substitute; case and separators ignored) from it: a
# misspelling, not another tool. Anything further is left to the model, which may decline.
MAX_NAME_EDITS = 2


def edit_distance(a: str, b: str, bound: int = MAX_NAME_EDITS) -> int:
    """Levenshtein distance of ``a`` and ``b``, or ``bound + 1`` once it is certainly above it."""
    if abs(len(a) - len(b)) > bound:
        return bound + 1
    previous = list(range(len(b) + 1))
    for i, char in enumerate(a, 1):
        current = [i]
        for j, other in enumerate(b, 1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char != other))
            )
        if min(current) > bound:
            return bound + 1
        previous = current
    return previous[-1]


def near_name(name: str | None, tool: str | None) -> bool:
    """Whether ``name`` is ``tool`` misspelled: at most ``MAX_NAME_EDITS`` edits apart."""
    if not name or not tool:
        return False
    a, b = _NOT_ALNUM.sub("", name.lower()), _NOT_ALNUM.sub("", tool.lower())
    return edit_distance(a, b) <= MAX_NAME_EDITS


# --- the system instruction ----------------------------------------------------------------------


def with_repair_instruction(body: Mapping[str, Any], template: RepairTemplate) -> dict[str, Any]:
    """A copy of ``body`` whose system prompt ends with the repair instruction.

    Requests without tools (a user simulator, a summariser) are returned unchanged: the instruction
    is about tool calls. Only the touched path is copied; the input is never mutated.
    """
    result = dict(body)
    if body.get("tools") is None and body.get("functions") is None:
        return result
    if not isinstance(body.get("messages"), list):
        return result  # malformed: let the upstream answer it as it would without the proxy
    instruction = template.instruction
    messages = list(body["messages"])
    first = messages[0] if messages else None
    if type(first) is not dict and not isinstance(first, Mapping):  # a dict skips the ABC check
        first = None
    if first is not None and first.get("role") in ("system", "developer"):
        content = first.get("content")
        system = dict(first)
        if isinstance(content, str):
            if instruction in content:
                return result
            system["content"] = f"{content}\n\n{instruction}" if content else instruction
        elif isinstance(content, list):
            system["content"] = [*content, {"type": "text", "text": instruction}]
        else:
            system["content"] = instruction
        messages[0] = system
    else:
        messages.insert(0, {"role": "system", "content": instruction})
    result["messages"] = messages
    return result


# --- the repair turn -----------------------------------------------------------------------------

# A call quoted back to the model is cut at this many characters.
MAX_QUOTE_CHARS = 1200
# Each repeated invalid answer halves the temperature of the next re-ask (absent means 1.0).
REPEAT_TEMPERATURE_FACTOR = 0.5


def _describe_parameters(schema: Mapping[str, Any] | None) -> str:
    """A one-line summary of the top-level parameters: name (type, required), enums listed."""
    if not schema:
        return "(none)"
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or not properties:
        return "(none)"
    required = set(schema.get("required") or ())
    described = []
    for name, spec in properties.items():
        spec = spec if isinstance(spec, Mapping) else {}
        kind = spec.get("type") or ("object" if "$ref" in spec else "any")
        if isinstance(kind, list):
            kind = " or ".join(map(str, kind))
        if isinstance(spec.get("enum"), list):
            kind = "one of " + ", ".join(_json(v) for v in spec["enum"])
        elif kind == "array" and isinstance(spec.get("items"), Mapping):
            kind = f"array of {spec['items'].get('type', 'items')}"
        described.append(f"{name} ({kind}{', required' if name in required else ''})")
    return "; ".join(described)


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # too deep, or not JSON
        return "(unreadable)"


_TEXT_SECTIONS = {
    Channel.UNKNOWN_TOOL: "text_unknown_tool",
    Channel.SCHEMA_VIOLATION: "text_invalid_arguments",
    Channel.INVALID_JSON: "text_invalid_arguments",
}


def _section_for(verdict: CallVerdict, template: RepairTemplate) -> str:
    """A call written as text gets the text for what was wrong inside it, if the template has it."""
    if verdict.conflict is not None and template.has("conflict"):
        return "conflict"
    if template.has("unrelated_tool") and unrelated_tool(verdict):
        # Not a misspelling of a listed tool: naming the "closest" one invites a made-up call.
        return "unrelated_tool"
    if verdict.text_call is not None and verdict.name and verdict.inner is not None:
        wanted = _TEXT_SECTIONS.get(verdict.inner)
        if wanted is not None and template.has(wanted):
            return wanted
    return str(verdict.channel)


def _render_call_diagnosis(
    verdict: CallVerdict,
    tools: CompiledTools,
    template: RepairTemplate,
    attempt: int,
    max_repairs: int,
    *,
    repeated: bool = False,
) -> str:
    name = verdict.name or ""
    values = {
        "name": name,
        "closest": verdict.closest_tool or "",
        "declared": ", ".join(tools.names) or "(none)",
        "diagnosis": verdict.diagnosis,
        "errors": "; ".join(verdict.error_paths) or verdict.diagnosis,
        "parameters": _describe_parameters(tools.schema_for(name)),
        "attempt": attempt,
        "max_repairs": max_repairs,
    }
    if repeated and template.has("repeated"):
        return template.render(
            "repeated", quote=quote_call(verdict), expected=_expected(verdict, tools), **values
        )
    return template.render(_section_for(verdict, template), **values)


def quote_call(verdict: CallVerdict) -> str:
    """The failing call as the model wrote it."""
    if verdict.text_call is not None:
        text = verdict.text_call.source
    elif verdict.channel is Channel.EMPTY_OUTPUT:
        text = "(an empty answer)"
    else:
        text = _json({"name": verdict.name, "arguments": verdict.arguments})
    return text if len(text) <= MAX_QUOTE_CHARS else text[: MAX_QUOTE_CHARS - 3] + "..."


def _expected(verdict: CallVerdict, tools: CompiledTools) -> str:
    """The exact correction: the intended tool with the model's own arguments when they fit."""
    if verdict.channel is Channel.EMPTY_OUTPUT:
        return "a reply to the user, or a call to one of the listed tools."
    target = verdict.closest_tool or (tools.names[0] if tools.names else "")
    arguments = verdict.text_call.arguments if verdict.text_call else verdict.arguments
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            arguments = None
    if isinstance(arguments, dict) and tools.check_call(target, arguments).channel is Channel.VALID:
        return _json({"name": target, "arguments": arguments})
    return _json({"name": target, "arguments": _skeleton(tools.schema_for(target))}) + (
        f" (fill in real values; parameters: {_describe_parameters(tools.schema_for(target))})"
    )


def _skeleton(schema: Mapping[str, Any] | None) -> dict[str, str]:
    properties = schema.get("properties") if schema else None
    if not isinstance(properties, Mapping):
        return {}
    required = (
        [name for name in schema.get("required") or () if name in properties] if schema else []
    )
    return {
        name: f"<{properties[name].get('type', 'value')}>"
        if isinstance(properties[name], Mapping)
        else "<value>"
        for name in required
    }


def _assistant_turn(message: Mapping[str, Any], attempt: int) -> dict[str, Any]:
    """The model's answer as a history entry: role, content, calls (ids filled in when missing)."""
    turn: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list) and tool_calls:
        calls = []
        for index, call in enumerate(tool_calls):
            call = dict(call) if isinstance(call, Mapping) else {}
            if not isinstance(call.get("id"), str) or not call["id"]:
                call["id"] = f"call_repair{attempt}_{index}"
            call.setdefault("type", "function")
            function = call.get("function")
            function = dict(function) if isinstance(function, Mapping) else {}
            function["name"] = function.get("name") if isinstance(function.get("name"), str) else ""
            arguments = function.get("arguments")
            if not isinstance(arguments, str):
                # Upstreams and chat templates expect a string; re-encode what the model sent.
                function["arguments"] = "" if arguments is None else _json(arguments)
            call["function"] = function
            calls.append(call)
        turn["tool_calls"] = calls
    elif isinstance(message.get("function_call"), Mapping):
        turn["function_call"] = dict(message["function_call"])
    return turn


def build_repair_turn(
    message: Mapping[str, Any],
    verdict: MessageVerdict,
    tools: CompiledTools,
    template: RepairTemplate,
    *,
    attempt: int = 1,
    max_repairs: int = 1,
    repeated: bool = False,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The messages to append after an invalid answer, and the valid calls the proxy keeps.

    Tool calls: the assistant turn, then one ``role: tool`` message per call with the same id
    (a diagnosis for a failed call, "kept" for a valid one). Legacy ``function_call``: a
    ``role: function`` message. Calls written as text and silent failures (no call to answer):
    one ``role: user`` message. ``repeated``: the model sent the same invalid answer again, so
    each failed call is quoted back with the exact correction expected.
    """
    turn = _assistant_turn(message, attempt)

    def render(call_verdict: CallVerdict) -> str:
        return _render_call_diagnosis(
            call_verdict, tools, template, attempt, max_repairs, repeated=repeated
        )

    # A conflict with the request that no call carries ("required" and no call) is answered
    # like a call written as text: in the user turn.
    # A structured call that conflicts (``request_conflict``) is answered in its own tool turn.
    structured = [
        v
        for v in verdict.calls
        if v.text_call is None and (v.conflict is None or v.channel is Channel.REQUEST_CONFLICT)
    ]
    in_text = [v for v in verdict.calls if v not in structured]
    replies: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    if "tool_calls" in turn:
        for call, call_verdict in zip(turn["tool_calls"], structured, strict=True):
            if call_verdict.channel is Channel.VALID:
                kept.append(call)
                content = template.render("valid_sibling")
            else:
                content = render(call_verdict)
            replies.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    elif "function_call" in turn and structured:
        name = turn["function_call"].get("name")
        replies.append(
            {
                "role": "function",
                "name": name if isinstance(name, str) else "",
                "content": render(structured[0]),
            }
        )
    elif structured and structured[0].channel is Channel.EMPTY_OUTPUT:
        # An empty assistant turn is rejected by some chat templates; the user turn says it all.
        return [{"role": "user", "content": render(structured[0])}], []
    failed_text = [v for v in in_text if v.channel is not Channel.VALID]
    if failed_text:
        replies.append({"role": "user", "content": "\n\n".join(map(render, failed_text))})
    return [turn, *replies], kept


# A response schema quoted in an output re-ask is cut to this many characters.
MAX_SCHEMA_QUOTE_CHARS = 4000


def build_output_repair_turn(
    content: Any,
    diagnosis: str,
    error_paths: Sequence[str],
    schema: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    """The messages to append after an answer that breaks the request's ``response_format``:
    the answer as the assistant turn, then one user turn naming what was wrong (the failing
    paths, one a line) and, for a schema, the schema itself."""
    lines = [diagnosis]
    if error_paths:
        lines.append("Failing paths:\n" + "\n".join(f"- {path}" for path in error_paths))
    if schema:
        quoted = _json(schema)
        if len(quoted) > MAX_SCHEMA_QUOTE_CHARS:
            quoted = quoted[: MAX_SCHEMA_QUOTE_CHARS - 3] + "..."
        lines.append("The JSON Schema the answer must match:\n" + quoted)
    lines.append("Answer again with only the corrected JSON value: no prose, no code fence.")
    return [
        {"role": "assistant", "content": content if isinstance(content, str) else ""},
        {"role": "user", "content": "\n\n".join(lines)},
    ]


def repair_request(
    body: Mapping[str, Any],
    history: Sequence[Mapping[str, Any]],
    tool_choice: Any | None,
    temperature: float | None = None,
) -> dict[str, Any]:
    request = dict(body)
    request["messages"] = [*(body.get("messages") or ()), *history]
    # Repairs are always asked without streaming: the whole answer must be validated first.
    request["stream"] = False
    request.pop("stream_options", None)
    if "n" in request:
        request["n"] = 1
    if temperature is not None:
        request["temperature"] = temperature
    if tool_choice is None:
        return request
    if body.get("tools") is None:
        # Legacy functions API: forcing is spelled function_call={"name": ...}; no "required".
        if isinstance(tool_choice, dict):
            request["function_call"] = {"name": tool_choice["function"]["name"]}
    else:
        request["tool_choice"] = tool_choice
    return request


def lowered_temperature(temperature: Any) -> float:
    current = float(temperature) if isinstance(temperature, int | float) else 1.0
    return max(current, 0.0) * REPEAT_TEMPERATURE_FACTOR


# --- is a re-asked call asked for? ---------------------------------------------------------------


def unrelated_tool(verdict: CallVerdict) -> bool:
    """A failed call to an undeclared tool that is no misspelling of a listed one: the model
    wanted something no listed tool does (the ``unrelated_tool`` text answers it)."""
    return Channel.UNKNOWN_TOOL in (verdict.channel, verdict.inner) and not near_name(
        verdict.name, verdict.closest_tool
    )


def grounding_texts(body: Mapping[str, Any], answers: Sequence[Mapping[str, Any]]) -> str:
    """What a call's values may come from, lower-cased: the conversation's user, tool and
    assistant turns (text and call arguments), the declared tools (enum values, defaults), and
    the model's ``answers`` under repair. The system prompt is not among them."""
    pieces: list[str] = []
    messages = body.get("messages")
    for message in [*(messages if isinstance(messages, list) else ()), *answers]:
        if not isinstance(message, Mapping) or message.get("role") in ("system", "developer"):
            continue
        pieces.append(message_text(message))
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping) and isinstance(function.get("arguments"), str):
                pieces.append(function["arguments"])
    pieces.append(_json(body.get("tools") or body.get("functions") or ()))
    return "\n".join(pieces).lower()


def ungrounded_values(arguments: Any, grounding: str) -> list[str]:
    """The string and number values in ``arguments`` (at any depth) that ``grounding`` (from
    ``grounding_texts``) does not contain: values the model made up rather than read."""
    missing: list[str] = []
    stack = [arguments]
    while stack and len(missing) < 8:
        value = stack.pop()
        if isinstance(value, Mapping):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            if value.strip() and value.strip().lower() not in grounding:
                missing.append(value)
        elif (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and _json(value) not in grounding
        ):
            missing.append(_json(value))
    return missing
