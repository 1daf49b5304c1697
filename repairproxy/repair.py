"""Reflexive repair: pure builders of the repair turns, and the one bounded async re-ask loop.

The client never sees a repair turn. Valid calls that came in the same turn as a broken one are
*kept by the proxy*: the model is told they are kept and asked to re-issue only the failed calls;
the final answer carries the kept calls (original ids, original order) followed by the repaired
ones, dropping any re-issued duplicate of a kept call (same name, same arguments). If the model
answers the repair with text only, the kept calls are returned without that text.
"""

from __future__ import annotations

import copy
import enum
import importlib.resources
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from repairproxy.errors import RepairExhaustedError
from repairproxy.validation import CallVerdict, Channel, CompiledTools, MessageVerdict

__all__ = [
    "DEFAULT_TEMPLATE",
    "OnExhausted",
    "RepairMode",
    "RepairOutcome",
    "RepairPolicy",
    "RepairTemplate",
    "SendFn",
    "build_repair_turn",
    "escalated_tool_choice",
    "repair_completion",
    "with_repair_instruction",
]

SendFn = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class RepairMode(enum.StrEnum):
    OFF = "off"  # observe only
    PROMPT = "prompt"  # add the instruction to the system prompt; forward answers unchanged
    REFLEXIVE = "reflexive"  # instruction + re-ask with a diagnosis per failed call
    CONSTRAINED = "constrained"  # reflexive, and attempt >= 2 forces the intended tool


class OnExhausted(enum.StrEnum):
    PASS = "pass"  # return the last answer (with the kept valid calls)
    STRIP = "strip"  # return it without its invalid calls
    ERROR = "error"  # raise errors.RepairExhaustedError


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

    @property
    def instruction(self) -> str:
        return self.sections["instruction"]


DEFAULT_TEMPLATE = RepairTemplate.parse(
    importlib.resources.files("repairproxy").joinpath("templates/repair_v1.txt").read_text("utf-8")
)


@dataclass(frozen=True, slots=True)
class RepairPolicy:
    mode: RepairMode = RepairMode.REFLEXIVE
    max_repairs: int = 2
    on_exhausted: OnExhausted = OnExhausted.PASS
    template: RepairTemplate = DEFAULT_TEMPLATE

    def __post_init__(self) -> None:
        # Settings may hand over plain strings ("constrained"); store the enum members.
        object.__setattr__(self, "mode", RepairMode(self.mode))
        object.__setattr__(self, "on_exhausted", OnExhausted(self.on_exhausted))
        if self.max_repairs < 0:
            raise ValueError("max_repairs must be >= 0")

    @property
    def re_asks(self) -> bool:
        return self.mode in (RepairMode.REFLEXIVE, RepairMode.CONSTRAINED)


@dataclass(frozen=True, slots=True)
class RepairOutcome:
    response: dict[str, Any]
    attempts: int
    caught: tuple[Channel, ...]
    first_verdict: MessageVerdict
    exhausted: bool
    # Ids of invalid calls in the returned answer (they reach the client): pass them to
    # ErrorBudget.observe_answer(delivered_call_ids=...) so their error results are not recounted.
    delivered_invalid_call_ids: tuple[str, ...] = ()


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
    first = messages[0] if messages and isinstance(messages[0], Mapping) else None
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
            kind = "one of " + ", ".join(orjson.dumps(v).decode() for v in spec["enum"])
        elif kind == "array" and isinstance(spec.get("items"), Mapping):
            kind = f"array of {spec['items'].get('type', 'items')}"
        described.append(f"{name} ({kind}{', required' if name in required else ''})")
    return "; ".join(described)


def _render_call_diagnosis(
    verdict: CallVerdict,
    tools: CompiledTools,
    template: RepairTemplate,
    attempt: int,
    max_repairs: int,
) -> str:
    name = verdict.name or ""
    return template.render(
        str(verdict.channel),
        name=name,
        closest=verdict.closest_tool or "",
        declared=", ".join(tools.names) or "(none)",
        diagnosis=verdict.diagnosis,
        errors="; ".join(verdict.error_paths) or verdict.diagnosis,
        parameters=_describe_parameters(tools.schema_for(name)),
        attempt=attempt,
        max_repairs=max_repairs,
    )


def _as_text(arguments: Any) -> str:
    if arguments is None:
        return ""
    try:
        return orjson.dumps(arguments).decode()
    except TypeError:
        return str(arguments)


def _assistant_turn(message: Mapping[str, Any], attempt: int) -> dict[str, Any]:
    """The model's answer as a history entry: role, content, calls (ids filled in when missing)."""
    turn: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    tool_calls = message.get("tool_calls")
    if tool_calls:
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
                function["arguments"] = _as_text(arguments)
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
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The messages to append after an invalid answer, and the valid calls the proxy keeps.

    Tool calls: the assistant turn, then one ``role: tool`` message per call with the same id
    (a diagnosis for a failed call, "kept" for a valid one). Legacy ``function_call``: a
    ``role: function`` message. Silent failures (no call to answer): a ``role: user`` message.
    """
    turn = _assistant_turn(message, attempt)
    render = _render_call_diagnosis
    if "tool_calls" in turn:
        kept: list[dict[str, Any]] = []
        replies: list[dict[str, Any]] = []
        for call, call_verdict in zip(turn["tool_calls"], verdict.calls, strict=True):
            if call_verdict.channel is Channel.VALID:
                kept.append(call)
                content = template.render("valid_sibling")
            else:
                content = render(call_verdict, tools, template, attempt, max_repairs)
            replies.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        return [turn, *replies], kept
    (only,) = verdict.calls
    content = render(only, tools, template, attempt, max_repairs)
    if "function_call" in turn:
        reply = {
            "role": "function",
            "name": turn["function_call"].get("name") or "",
            "content": content,
        }
        return [turn, reply], []
    if only.channel is Channel.EMPTY_OUTPUT:
        # An empty assistant turn is rejected by some chat templates; the user turn says it all.
        return [{"role": "user", "content": content}], []
    return [turn, {"role": "user", "content": content}], []


def escalated_tool_choice(
    body: Mapping[str, Any], verdict: MessageVerdict, attempt: int, policy: RepairPolicy
) -> Any | None:
    """The ``tool_choice`` to force on this attempt (constrained mode, attempt >= 2), else None.

    The closest declared tool when every failed call points at the same one, otherwise
    ``"required"``; nothing for an empty answer (text may be the right answer) or when the client
    said ``tool_choice: "none"``.
    """
    if policy.mode is not RepairMode.CONSTRAINED or attempt < 2:
        return None
    if body.get("tool_choice") == "none" or body.get("function_call") == "none":
        return None
    failed = [call for call in verdict.calls if call.channel is not Channel.VALID]
    if not failed or all(call.channel is Channel.EMPTY_OUTPUT for call in failed):
        return None
    intended = {
        call.closest_tool if call.channel in _POINTS_BY_CLOSEST else call.name for call in failed
    }
    if len(intended) == 1 and None not in intended:
        (name,) = intended
        return {"type": "function", "function": {"name": name}}
    return "required"


_POINTS_BY_CLOSEST = (Channel.UNKNOWN_TOOL, Channel.TOOL_CALL_IN_CONTENT)


def _repair_request(
    body: Mapping[str, Any], history: Sequence[Mapping[str, Any]], tool_choice: Any | None
) -> dict[str, Any]:
    request = dict(body)
    request["messages"] = [*(body.get("messages") or ()), *history]
    # Repairs are always asked without streaming: the whole answer must be validated first.
    request["stream"] = False
    request.pop("stream_options", None)
    if "n" in request:
        request["n"] = 1
    if tool_choice is None:
        return request
    if body.get("tools") is None:
        # Legacy functions API: forcing is spelled function_call={"name": ...}; no "required".
        if isinstance(tool_choice, dict):
            request["function_call"] = {"name": tool_choice["function"]["name"]}
    else:
        request["tool_choice"] = tool_choice
    return request


# --- assembling the final answer -----------------------------------------------------------------


def _first_message(response: Mapping[str, Any]) -> Mapping[str, Any] | None:
    choices = response.get("choices")
    if not choices or not isinstance(choices[0], Mapping):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, Mapping) else None


def _sum_usage(usages: Iterable[Any]) -> dict[str, Any] | None:
    total: dict[str, Any] | None = None
    for usage in usages:
        if not isinstance(usage, Mapping):
            continue
        total = _add_counts(total or {}, usage)
    return total


def _add_counts(into: dict[str, Any], usage: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in usage.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            previous = into.get(key, 0)
            into[key] = (previous if isinstance(previous, int | float) else 0) + value
        elif isinstance(value, Mapping):
            nested = into.get(key)
            into[key] = _add_counts(dict(nested) if isinstance(nested, Mapping) else {}, value)
        elif key not in into:
            into[key] = value
    return into


def _call_key(call: Mapping[str, Any]) -> tuple[str, str]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str) else arguments
        canonical = orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()
    except (orjson.JSONDecodeError, TypeError):
        canonical = str(arguments)
    return str(function.get("name")), canonical


def _final_response(
    last: Mapping[str, Any],
    kept: Sequence[dict[str, Any]],
    verdict: MessageVerdict,
    strip_invalid: bool,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    response = copy.deepcopy(dict(last))
    if usage is not None:
        response["usage"] = usage
    message = _first_message(response)
    if message is None:
        return response
    assert isinstance(message, dict)
    calls = list(message.get("tool_calls") or ())
    if strip_invalid:
        invalid = {c.index for c in verdict.calls if c.channel is not Channel.VALID and calls}
        calls = [call for index, call in enumerate(calls) if index not in invalid]
        if isinstance(message.get("function_call"), Mapping) and not verdict.ok:
            del message["function_call"]
    if kept:
        if not calls:
            # Text written in reply to a repair turn the client never sees would not make sense to
            # it, and τ²-bench rejects a message holding both text and tool calls.
            message["content"] = None
        seen = {_call_key(call) for call in kept}
        calls = [*copy.deepcopy(list(kept)), *(c for c in calls if _call_key(c) not in seen)]
    choice = response["choices"][0]
    if calls:
        message["tool_calls"] = calls
        choice["finish_reason"] = "tool_calls"
    elif "tool_calls" in message:
        del message["tool_calls"]  # every call was stripped
        choice["finish_reason"] = "stop"
    elif (
        strip_invalid
        and "function_call" not in message
        and choice.get("finish_reason") == ("function_call")
    ):
        choice["finish_reason"] = "stop"
    return response


# --- the loop ------------------------------------------------------------------------------------


def _verdict_of(tools: CompiledTools, response: Mapping[str, Any]) -> MessageVerdict:
    message = _first_message(response)
    return tools.check_message(message) if message is not None else MessageVerdict(())


async def repair_completion(
    body: Mapping[str, Any],
    first_response: Mapping[str, Any],
    tools: CompiledTools,
    policy: RepairPolicy,
    send: SendFn,
) -> RepairOutcome:
    """Validate the upstream's answer and, while it holds an invalid call, re-ask (bounded).

    ``body`` is the request as it went upstream; ``send`` posts a non-streaming request upstream
    and returns the completion JSON (it raises on upstream failure). In OFF/PROMPT modes the answer
    is only validated. With ``OnExhausted.ERROR`` the error carries every channel caught; the
    first answer's verdict is ``tools.check_message`` of ``first_response``'s message.
    """
    verdict = first_verdict = _verdict_of(tools, first_response)
    caught = list(first_verdict.error_channels)
    if not policy.re_asks or first_verdict.ok:
        return RepairOutcome(
            dict(first_response),
            0,
            tuple(caught),
            first_verdict,
            False,
            first_verdict.error_call_ids,
        )

    last: Mapping[str, Any] = first_response
    usages: list[Any] = [first_response.get("usage")]
    history: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    attempts = 0
    while not verdict.ok and attempts < policy.max_repairs:
        attempts += 1
        message = _first_message(last)
        assert message is not None  # an invalid verdict always comes from a message
        turn, newly_kept = build_repair_turn(
            message,
            verdict,
            tools,
            policy.template,
            attempt=attempts,
            max_repairs=policy.max_repairs,
        )
        history.extend(turn)
        kept.extend(newly_kept)
        tool_choice = escalated_tool_choice(body, verdict, attempts, policy)
        last = await send(_repair_request(body, history, tool_choice))
        usages.append(last.get("usage"))
        verdict = _verdict_of(tools, last)
        caught.extend(verdict.error_channels)

    usage = _sum_usage(usages)
    if verdict.ok:
        response = _final_response(last, kept, verdict, False, usage)
        return RepairOutcome(response, attempts, tuple(caught), first_verdict, False)
    if policy.on_exhausted is OnExhausted.ERROR:
        raise RepairExhaustedError(
            f"no valid tool call after {attempts} repair attempt(s): "
            + ", ".join(map(str, verdict.error_channels)),
            attempts=attempts,
            channels=tuple(map(str, caught)),
        )
    strip = policy.on_exhausted is OnExhausted.STRIP
    response = _final_response(last, kept, verdict, strip, usage)
    delivered = () if strip else verdict.error_call_ids
    return RepairOutcome(response, attempts, tuple(caught), first_verdict, True, delivered)
