"""Classify every tool call in a model answer into exactly one channel of a fixed vocabulary.

A request's declared tools are compiled once (jsonschema-rs validators, in an LRU keyed by their
serialised JSON and bounded by the memory they are estimated to take); each answer is then checked
call by call in a few microseconds.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import itertools
import json
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

import jsonschema_rs
import orjson

from repairproxy.errors import InvalidToolsError
from repairproxy.textcall_taint import QuotedCalls
from repairproxy.textcalls import (
    TextCall,
    find_call_in_text,
    quoted_calls,
    read_text_calls,
)
from repairproxy.wire.openai import message_text

__all__ = [
    "COMPILED_BYTES_PER_JSON_BYTE",
    "COMPILED_BYTES_PER_TOOL",
    "DEFAULT_MAX_SCHEMA_NODES",
    "DEFAULT_MAX_SCHEMA_PATTERNS",
    "DEFAULT_MAX_TOOLS",
    "DEFAULT_TOOLS_CACHE_BYTES",
    "MAX_SCHEMA_FANOUT",
    "CallRules",
    "CallVerdict",
    "Channel",
    "CompiledTools",
    "MessageVerdict",
    "SchemaFanoutError",
    "ToolsCache",
    "compiled_size",
    "find_call_in_text",
    "schema_fanout",
    "schema_fanout_from_bytes",
    "schema_nodes",
    "schema_patterns",
    "schema_validator",
    "text_calls_allowed",
]

# A schema violation lists at most this many failing paths: enough to repair, short enough to read.
MAX_ERROR_PATHS = 8
# Offending values are echoed in diagnoses; a huge value would flood the repair turn.
MAX_MESSAGE_CHARS = 160
# Remembered closest-name answers per compiled tools list (cleared when full).
MAX_REMEMBERED_NAMES = 256


class Channel(enum.StrEnum):
    """The fixed vocabulary of outcomes; metrics and headers use these values as labels."""

    VALID = "valid"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_JSON = "invalid_json"
    SCHEMA_VIOLATION = "schema_violation"
    TOOL_CALL_IN_CONTENT = "tool_call_in_content"
    EMPTY_OUTPUT = "empty_output"
    # Not one of the study's six: a structured call that breaks the request's constraints
    # (``tool_choice`` names another function; more calls than ``parallel_tool_calls: false``
    # allows). Reported and re-asked like the text calls that do, never charged.
    REQUEST_CONFLICT = "request_conflict"


@dataclass(frozen=True, slots=True)
class CallVerdict:
    """The verdict on one tool call (or on a whole message, for the two silent failures).

    ``name`` is the model's raw name, possibly undeclared: never use it as a metric label as is
    (map it to a bounded set, e.g. declared names plus ``"undeclared"``).
    """

    index: int
    call_id: str | None
    name: str | None
    channel: Channel
    diagnosis: str
    closest_tool: str | None = None
    error_paths: tuple[str, ...] = ()
    # A call written as text (channel tool_call_in_content): the call as found, and the channel it
    # would have had as a structured call (valid: it can be promoted as it is).
    text_call: TextCall | None = None
    inner: Channel | None = None
    # The arguments as the model sent them (kept for invalid calls only, to quote them back).
    arguments: Any = None
    # A call written as text that conflicts with the request (another tool than the one
    # tool_choice names, a second call under parallel_tool_calls false, no call under
    # "required"): why. Such a call is never promoted, whatever its inner channel.
    conflict: str | None = None

    @property
    def promotable(self) -> bool:
        """A call written as text that can become a real tool call as it is."""
        return self.text_call is not None and self.inner is Channel.VALID and not self.conflict

    @property
    def form(self) -> str:
        """``"text"`` for a call written in the answer's text, else ``"structured"``."""
        return "structured" if self.text_call is None else "text"


@dataclass(frozen=True, slots=True)
class MessageVerdict:
    """Verdicts for one assistant message: one per tool call, or one silent-failure verdict.

    A plain text answer without any call has no verdicts and is ``ok``.
    """

    calls: tuple[CallVerdict, ...]

    @property
    def ok(self) -> bool:
        return all(call.channel is Channel.VALID for call in self.calls)

    @property
    def error_channels(self) -> tuple[Channel, ...]:
        return tuple(call.channel for call in self.calls if call.channel is not Channel.VALID)


def _mapping(value: Any) -> bool:
    """``isinstance(value, Mapping)``, a dict answered without the ABC's (Python-level) check."""
    return type(value) is dict or isinstance(value, Mapping)


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


def _json_path(parts: Iterable[str | int]) -> str:
    path = "$"
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            path += f".{part}"
        else:
            path += f"[{json.dumps(part)}]"
    return path


def _normalized(name: str) -> str:
    # Models swap case and separators (getOrder / get-order / get_order): compare without them.
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _closed(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` with top-level ``additionalProperties: false`` unless it says otherwise.

    Tools implemented as functions (τ²-bench's) reject unexpected keyword arguments although
    their generated schemas do not forbid extra properties; this makes the proxy catch them too.
    """
    closed = dict(schema)
    open_keywords = ("additionalProperties", "patternProperties", "unevaluatedProperties")
    if isinstance(closed.get("properties"), Mapping) and not any(
        k in closed for k in open_keywords
    ):
        closed["additionalProperties"] = False
    return closed


@dataclass(slots=True)  # per request; frozen=True would cost an object.__setattr__ a field
class CallRules:
    """What the request allows an answer's calls to be (see ``textcalls``: the three outcomes).

    ``forced``: the function ``tool_choice`` names; ``required``: ``tool_choice: "required"``;
    ``single``: ``parallel_tool_calls: false``;
    ``conversation``: the request's messages, whose tool results and user messages hold JSON
    that, copied into an answer, is not a call.
    """

    forced: str | None = None
    required: bool = False
    single: bool = False
    conversation: Any = None
    _quoted: QuotedCalls | None = dataclasses.field(default=None, repr=False, compare=False)

    def quoted_calls(self) -> QuotedCalls | None:
        """The conversation's non-assistant content indexed for taint, built once per request
        (on first use); None without a conversation."""
        if self.conversation is None:
            return None
        if self._quoted is None:
            self._quoted = quoted_calls(self.conversation)
        return self._quoted

    @classmethod
    def of_request(cls, body: Mapping[str, Any]) -> CallRules:
        choice = body.get("tool_choice")
        forced: str | None = None
        if choice is not None and _mapping(choice):
            function = choice.get("function")
            name = function.get("name") if _mapping(function) else choice.get("name")
            forced = name if isinstance(name, str) else None
        legacy = body.get("function_call")
        if (
            forced is None
            and legacy is not None
            and _mapping(legacy)
            and isinstance(legacy.get("name"), str)
        ):
            forced = legacy["name"]
        return cls(
            forced,
            choice == "required",
            body.get("parallel_tool_calls") is False,
            body.get("messages"),
        )


_NO_RULES = CallRules()


class CompiledTools:
    """The declared tools of one request, compiled once; checks calls and whole messages."""

    __slots__ = (
        "_closest",
        "_normalized_names",
        "_schemas",
        "_validators",
        "fanout",
        "name_set",
        "names",
        "nodes",
        "patterns",
    )

    def __init__(
        self,
        tools: Sequence[tuple[str, Mapping[str, Any]]],
        *,
        forbid_extra_arguments: bool = False,
    ) -> None:
        validators: dict[str, Any] = {}
        schemas: dict[str, Mapping[str, Any]] = {}
        for name, schema in tools:
            enforced = _closed(schema) if forbid_extra_arguments else schema
            try:
                validators[name] = schema_validator(enforced)
            except (
                jsonschema_rs.ValidationError,
                jsonschema_rs.ReferencingError,
                ValueError,
            ) as exc:
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                raise InvalidToolsError(
                    f"tool {name!r} does not declare a valid JSON Schema: {_short(first_line)}",
                    tool_name=name,
                ) from exc
            schemas[name] = schema
        self.names: tuple[str, ...] = tuple(validators)
        self.name_set = frozenset(self.names)
        self._validators = validators
        self._schemas = schemas
        self._normalized_names = {_normalized(name): name for name in self.names}
        # Hallucinated names recur within a conversation: remember their closest match.
        self._closest: dict[str, str] = {}
        # What compiling them cost, as ToolsCache counts it against the request's caps, and
        # the most work checking one value of an answer can take (an upper bound).
        self.patterns = 0
        self.nodes = 0
        self.fanout = 0

    def schema_for(self, name: str) -> Mapping[str, Any] | None:
        """The declared parameters schema of ``name`` (None when undeclared)."""
        return self._schemas.get(name)

    def closest_name(self, name: str) -> str | None:
        """The declared tool the model most likely meant (None only when no tool is declared)."""
        if not self.names:
            return None
        if name in self._validators:
            return name
        normalized = _normalized(name)
        exact = self._normalized_names.get(normalized)
        if exact is not None:
            return exact
        remembered = self._closest.get(normalized)
        if remembered is not None:
            return remembered
        closest = self._most_similar(normalized)
        if len(self._closest) >= MAX_REMEMBERED_NAMES:
            self._closest.clear()
        self._closest[normalized] = closest
        return closest

    def _most_similar(self, normalized: str) -> str:
        # SequenceMatcher.ratio() is slow (~50 us a pair); quick_ratio() bounds it from above, so
        # the exact ratio is computed only for candidates that could still win.
        matcher = difflib.SequenceMatcher(None, b=normalized)
        bounds = []
        for position, (candidate, original) in enumerate(self._normalized_names.items()):
            matcher.set_seq1(candidate)
            bounds.append((-matcher.quick_ratio(), position, candidate, original))
        bounds.sort()
        best, best_ratio = self.names[0], -1.0
        for negative_bound, _, candidate, original in bounds:
            if -negative_bound <= best_ratio:
                break
            matcher.set_seq1(candidate)
            ratio = matcher.ratio()
            if ratio > best_ratio:
                best, best_ratio = original, ratio
        return best

    def check_call(
        self,
        name: str | None,
        arguments: str | Mapping[str, Any] | None,
        *,
        index: int = 0,
        call_id: str | None = None,
    ) -> CallVerdict:
        """Classify one call: unknown_tool, invalid_json, schema_violation or valid (the
        checks of ``_CALL_CHECKS``, in order; the first that finds a fault decides)."""
        # Most calls are valid: a declared name and a JSON object the schema holds, decided
        # here in one go; any doubt goes through the checks, which say what is wrong.
        validator = self._validators.get(name) if type(name) is str else None
        if validator is not None and type(arguments) is str:
            try:
                parsed = orjson.loads(arguments)
                valid = type(parsed) is dict and validator.is_valid(parsed)
            except (ValueError, TypeError, RecursionError):  # JSONDecodeError is a ValueError
                valid = False
            if valid:
                return CallVerdict(index, call_id, name, Channel.VALID, "")
        call = _Call(index, call_id, name, arguments)
        for check in _CALL_CHECKS:
            verdict = check(self, call)
            if verdict is not None:
                return verdict
        return CallVerdict(index, call_id, name, Channel.VALID, "")

    def check_message(
        self,
        message: Mapping[str, Any],
        *,
        text_calls: bool = True,
        rules: CallRules | None = None,
        cut_off: bool = False,
    ) -> MessageVerdict:
        """Classify every call of an assistant message, or the message itself when it has none.

        Calls written in the text are classified too, one verdict each (``tool_call_in_content``,
        with their inner channel), unless ``text_calls`` is False (the client sent
        ``tool_choice: "none"``: text is text). Only candidate calls count: a call shape that is
        prose (narrated, declined, quoted from the conversation, in reasoning or code; see
        ``textcalls.read_text_calls``) is text. ``rules`` (the request's ``CallRules``) mark the
        text calls that conflict with the request, and make an answer without any call under
        ``tool_choice: "required"`` one ``tool_call_in_content`` verdict. A text call repeating
        a structured call of the same message is only commentary and is not counted.
        ``cut_off``: the answer was cut off by the token limit (``finish_reason: "length"``):
        its call shapes are text (``textcalls.NotACall.CUT_OFF``).
        """
        verdict = self._check_message(message, text_calls, rules or _NO_RULES, cut_off)
        if rules is None or not text_calls:
            return verdict
        return _with_rules(verdict, rules)

    def _check_message(
        self, message: Mapping[str, Any], text_calls: bool, rules: CallRules, cut_off: bool
    ) -> MessageVerdict:
        tool_calls = message.get("tool_calls")
        structured: tuple[CallVerdict, ...] = ()
        if isinstance(tool_calls, list) and tool_calls:
            structured = tuple([self._check_tool_call(i, c) for i, c in enumerate(tool_calls)])
        elif tool_calls and not isinstance(tool_calls, list):
            structured = (self.check_call(None, None),)
        elif isinstance(message.get("function_call"), Mapping):
            function_call = message["function_call"]
            structured = (
                self.check_call(function_call.get("name"), function_call.get("arguments")),
            )
        text = message_text(message)
        if structured:
            if not text_calls or not text:
                return MessageVerdict(structured)
            seen = _structured_keys(message)
            in_text = tuple(
                verdict
                for verdict in self._check_text(text, rules, cut_off)
                if verdict.text_call is not None and _text_call_key(verdict.text_call) not in seen
            )
            return MessageVerdict(structured + in_text)
        if not text.strip():
            if message.get("refusal"):
                return MessageVerdict(())
            return MessageVerdict(
                (
                    CallVerdict(
                        0,
                        None,
                        None,
                        Channel.EMPTY_OUTPUT,
                        "The answer was empty: it had neither text nor a tool call.",
                    ),
                )
            )
        if not text_calls:
            return MessageVerdict(())
        return MessageVerdict(self._check_text(text, rules, cut_off))

    def _check_text(self, text: str, rules: CallRules, cut_off: bool) -> tuple[CallVerdict, ...]:
        verdicts = []
        reading = read_text_calls(
            text, conversation=rules.quoted_calls(), tools=self._schemas, cut_off=cut_off
        )
        for index, call in enumerate(reading.calls):
            arguments = call.arguments
            schema = self._schemas.get(call.name) if call.name is not None else None
            if call.string_values and isinstance(arguments, dict) and schema is not None:
                arguments = _typed_values(arguments, schema)
                call = dataclasses.replace(call, arguments=arguments)
            inner = self.check_call(call.name, arguments, index=index)
            closest = self.closest_name(call.name or "")
            hint = f" (closest declared tool: {closest!r})" if closest else ""
            shown = f" to {_short(call.name)!r}" if call.name else ""
            problem = "" if inner.channel is Channel.VALID else " " + inner.diagnosis
            verdicts.append(
                CallVerdict(
                    index,
                    None,
                    call.name,
                    Channel.TOOL_CALL_IN_CONTENT,
                    f"The answer wrote a tool call{shown} as text{hint} instead of calling the "
                    f"tool; text is never executed.{problem}",
                    closest_tool=closest,
                    error_paths=inner.error_paths,
                    text_call=call,
                    inner=inner.channel,
                )
            )
        return tuple(verdicts)

    def _check_tool_call(self, index: int, call: Any) -> CallVerdict:
        if not _mapping(call):
            return self.check_call(None, None, index=index)
        function = call.get("function")
        call_id = call.get("id") if isinstance(call.get("id"), str) else None
        if not _mapping(function):
            return self.check_call(None, None, index=index, call_id=call_id)
        return self.check_call(
            function.get("name"), function.get("arguments"), index=index, call_id=call_id
        )


@dataclass(slots=True)
class _Call:
    """One call as ``check_call`` reads it; each check may fill what the next one needs."""

    index: int
    call_id: str | None
    name: str | None
    arguments: str | Mapping[str, Any] | None
    validator: jsonschema_rs.Validator | None = None
    parsed: Any = None

    def fault(self, channel: Channel, diagnosis: str, **extra: Any) -> CallVerdict:
        return CallVerdict(
            self.index,
            self.call_id,
            self.name,
            channel,
            diagnosis,
            arguments=self.arguments,
            **extra,
        )


def _declared(tools: CompiledTools, call: _Call) -> CallVerdict | None:
    """The name is a declared tool (else unknown_tool, with the closest declared name)."""
    name = call.name
    call.validator = tools._validators.get(name) if isinstance(name, str) else None
    if call.validator is not None:
        return None
    closest = tools.closest_name(name) if isinstance(name, str) else tools.closest_name("")
    shown = name if isinstance(name, str) and name else "(no name)"
    declared = ", ".join(tools.names) or "(none)"
    hint = f" Did you mean {closest!r}?" if closest else ""
    call.name = name if isinstance(name, str) else None
    return call.fault(
        Channel.UNKNOWN_TOOL,
        f"Tool {_short(shown)!r} does not exist.{hint} Declared tools: {declared}.",
        closest_tool=closest,
    )


def _decoded(tools: CompiledTools, call: _Call) -> CallVerdict | None:
    """The arguments decode as JSON (some upstreams hand them over decoded already)."""
    arguments = call.arguments
    if not isinstance(arguments, str | None):
        call.parsed = arguments  # decoded: anything but an object is caught next
        return None
    try:
        call.parsed = orjson.loads(arguments if arguments is not None else "")
    except orjson.JSONDecodeError as exc:
        return call.fault(
            Channel.INVALID_JSON,
            f"The arguments of {call.name!r} are not valid JSON ({exc}). "
            "Send the arguments as one JSON object, e.g. {} when there are none.",
        )
    return None


def _an_object(tools: CompiledTools, call: _Call) -> CallVerdict | None:
    """The arguments are one JSON object."""
    if type(call.parsed) is dict or isinstance(call.parsed, Mapping):
        return None
    return call.fault(
        Channel.INVALID_JSON,
        f"The arguments of {call.name!r} must be a JSON object, not {type(call.parsed).__name__}.",
    )


def _schema_holds(tools: CompiledTools, call: _Call) -> CallVerdict | None:
    """The arguments match the tool's parameters schema (else its first failing paths)."""
    validator = call.validator
    assert validator is not None  # _declared ran first
    try:
        if validator.is_valid(call.parsed):
            return None
    except (ValueError, TypeError, RecursionError):
        return call.fault(Channel.INVALID_JSON, "The arguments hold non-JSON values.")
    try:
        paths = tuple(
            f"{_json_path(error.instance_path)}: {_short(error.message)}"
            for _, error in zip(
                range(MAX_ERROR_PATHS), validator.iter_errors(call.parsed), strict=False
            )
        )
    except (ValueError, TypeError, RecursionError):
        paths = ("$: the arguments could not be checked (nested too deeply)",)
    return call.fault(
        Channel.SCHEMA_VIOLATION,
        f"The arguments of {call.name!r} do not match its parameters schema: " + "; ".join(paths),
        error_paths=paths,
    )


# The checks of one call, in order; each returns the verdict on a fault, None to go on.
_CALL_CHECKS: tuple[Callable[[CompiledTools, _Call], CallVerdict | None], ...] = (
    _declared,
    _decoded,
    _an_object,
    _schema_holds,
)


def _with_rules(verdict: MessageVerdict, rules: CallRules) -> MessageVerdict:
    """``verdict`` with the text calls that conflict with the request marked (see CallRules)."""
    if rules.forced is None and not rules.required and not rules.single:
        return verdict
    calls = list(verdict.calls)
    if rules.required and not calls:
        calls.append(
            CallVerdict(
                0,
                None,
                None,
                Channel.TOOL_CALL_IN_CONTENT,
                "The request requires a tool call (tool_choice is 'required') and the answer "
                "made none.",
                conflict="tool_choice is 'required'",
            )
        )
        return MessageVerdict(tuple(calls))
    several = rules.single and len(calls) > 1
    structured_seen = 0
    for position, call in enumerate(calls):
        if call.text_call is None and call.channel is Channel.VALID:
            structured_seen += 1
            broken = _structured_conflict(call, rules, structured_seen, several)
            if broken is not None:
                calls[position] = dataclasses.replace(
                    call,
                    channel=Channel.REQUEST_CONFLICT,
                    conflict=broken,
                    diagnosis=f"The call to {_short(str(call.name))!r} conflicts with the "
                    f"request: {broken}.",
                )
            continue
        if call.text_call is None or call.channel is not Channel.TOOL_CALL_IN_CONTENT:
            continue
        conflict: str | None = None
        if rules.forced is not None and call.name != rules.forced:
            conflict = f"tool_choice names {_short(rules.forced)!r}"
        elif several:
            conflict = "parallel_tool_calls is false: at most one call"
        if conflict is not None:
            calls[position] = dataclasses.replace(
                call,
                conflict=conflict,
                diagnosis=f"{call.diagnosis} It conflicts with the request: {conflict}.",
            )
    return MessageVerdict(tuple(calls))


def _structured_conflict(
    call: CallVerdict, rules: CallRules, seen: int, several: bool
) -> str | None:
    """The constraint a valid structured call breaks (the ``seen``-th of its message), if any:
    a named ``tool_choice`` other than its tool; under ``parallel_tool_calls: false``, every
    call after the first."""
    if rules.forced is not None and call.name != rules.forced:
        return f"tool_choice names {_short(rules.forced)!r}"
    if several and seen > 1:
        return "parallel_tool_calls is false: at most one call"
    return None


def _canonical(arguments: Any) -> str:
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str) else arguments
        return orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()
    except (orjson.JSONDecodeError, TypeError):  # not JSON, or deeper than orjson writes
        return arguments[:MAX_MESSAGE_CHARS] if isinstance(arguments, str) else "(unreadable)"


def _structured_keys(message: Mapping[str, Any]) -> set[tuple[str, str]]:
    calls: list[Any] = list(message.get("tool_calls") or ())
    if isinstance(message.get("function_call"), Mapping):
        calls.append({"function": message["function_call"]})
    keys = set()
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            keys.add((str(function.get("name")), _canonical(function.get("arguments"))))
    return keys


def _text_call_key(call: TextCall) -> tuple[str, str]:
    return str(call.name), _canonical(call.arguments)


def _typed_values(arguments: dict[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """XML parameters arrive as text: decode those the schema does not declare as strings."""
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return arguments
    typed = dict(arguments)
    for key, value in arguments.items():
        spec = properties.get(key)
        kind = spec.get("type") if isinstance(spec, Mapping) else None
        if not isinstance(value, str) or kind in (None, "string"):
            continue
        try:
            typed[key] = orjson.loads(value.strip())
        except orjson.JSONDecodeError:
            continue
    return typed


def text_calls_allowed(body: Mapping[str, Any]) -> bool:
    """False when the client asked for no tool call (``tool_choice: "none"``): text is text."""
    return body.get("tool_choice") != "none" and body.get("function_call") != "none"


# --- compiling and caching -----------------------------------------------------------------------


def _declared_tools(body: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]] | None:
    """(name, parameters schema) per declared function, from ``tools`` or legacy ``functions``."""
    tools = body.get("tools")
    functions = body.get("functions")
    if tools is None and functions is None:
        return None
    declared: list[tuple[str, Mapping[str, Any]]] = []
    for position, tool in enumerate(tools or ()):
        if not isinstance(tool, Mapping):
            raise InvalidToolsError(f"tools[{position}] is not an object")
        if tool.get("type", "function") != "function":
            continue  # other tool kinds (built-in, custom) have no JSON Schema to enforce
        function = tool.get("function")
        if not isinstance(function, Mapping):
            raise InvalidToolsError(f"tools[{position}] has no 'function' object")
        declared.append(_declared_function(function, f"tools[{position}]"))
    for position, function in enumerate(functions or ()):
        if not isinstance(function, Mapping):
            raise InvalidToolsError(f"functions[{position}] is not an object", param="functions")
        declared.append(_declared_function(function, f"functions[{position}]"))
    return declared


def _declared_function(function: Mapping[str, Any], where: str) -> tuple[str, Mapping[str, Any]]:
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidToolsError(f"{where} has no function name")
    parameters = function.get("parameters")
    if parameters is None:
        # OpenAI: omitting parameters declares a function that takes no (or any) arguments.
        return name, {"type": "object"}
    if not isinstance(parameters, Mapping):
        raise InvalidToolsError(
            f"tool {name!r}: 'parameters' must be a JSON Schema object", tool_name=name
        )
    return name, parameters


# A compiled tools list costs about this many bytes of memory per byte of its JSON, plus a fixed
# cost per tool: ``python -m benchmarks.limits`` measured 18.5 bytes of RSS per JSON byte (8 lists
# of 200 tools, 2.6 MB of JSON; the issue's own measure was ~22x), rounded up to 24. RSS, because
# jsonschema-rs allocates outside Python's allocator, where tracemalloc does not see it.
COMPILED_BYTES_PER_JSON_BYTE = 24
COMPILED_BYTES_PER_TOOL = 4096
DEFAULT_TOOLS_CACHE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_TOOLS = 1024
# The worst accepted tools list compiles in ~50 ms on the loop (benchmarks/hostile.py measures
# ~100-200 ms per MiB of tools JSON and ~40 us per tool on the 2-core dev machine).
DEFAULT_MAX_TOOLS_BYTES = 256 * 1024
# Patterns run in fancy-regex with bounded backtracking and a bounded program: a pattern whose
# compiled size passes the limit (``(\w{100}){30}``) is refused as an invalid schema (400)
# instead of costing seconds of matching; one near the limit matches 3,000 characters in
# ~10 ms.
PATTERN_OPTIONS = jsonschema_rs.FancyRegexOptions(
    backtrack_limit=10_000, size_limit=256 * 1024, dfa_size_limit=256 * 1024
)
# The bytes do not bound the compile. A pattern near that size limit (``(\w{100}){27}``, 14
# bytes) takes ~1.5-3 ms to compile, where an everyday one takes ~0.05 ms: 256 KiB of them took
# 8-20 s. And every JSON object costs ~1-4 us: 256 KiB of ``{}`` took ~100 ms. Hence two caps
# per request (its tools and response_format together). At these, ``python -m benchmarks.limits``
# measured the worst accepted request (16 such patterns beside 8,000 properties) at ~40 ms to
# compile on the 2-core dev machine; real tool lists take ~35-50 bytes of JSON per node (the
# retail tools: 1.7 KB, 35 nodes), so 8,192 admits any that fits the byte cap.
DEFAULT_MAX_SCHEMA_PATTERNS = 16
DEFAULT_MAX_SCHEMA_NODES = 8 * 1024
# Nor do they bound the check: a $ref lets a small schema check one value of an answer against
# one subschema many times (an allOf naming the next level twice doubles it per level: ~20 ms
# at 20 levels, ~0.5 s at 24 for the answer ``1``; building an invalid answer's errors, ~2 s at
# 16). Hence a cap on the work of checking one value (``schema_fanout``), per schema (each tool,
# the response_format). At 1,024, ``python -m benchmarks.limits`` measured the worst accepted
# fan-out at <0.05 ms to check a valid answer and 2-5 ms an invalid one (jsonschema-rs builds
# every error, ~5 us each) on the 2-core dev machine; real schemas take 3-25 (tau2's tools at
# most 15, pydantic models with $defs 6-23).
MAX_SCHEMA_FANOUT = 1024


def schema_validator(schema: Mapping[str, Any]) -> jsonschema_rs.Validator:
    """A client-declared JSON Schema compiled the one way the proxy compiles them (a tool's
    parameters, a ``response_format``): offline, so a remote ``$ref`` never makes the proxy fetch
    a URL, and with ``PATTERN_OPTIONS``, so matching a declared pattern is bounded (backtracking
    and program size). Raises what ``jsonschema_rs.validator_for`` raises for an invalid schema."""
    return jsonschema_rs.validator_for(dict(schema), offline=True, pattern_options=PATTERN_OPTIONS)


def schema_nodes(key: bytes) -> int:
    """The JSON objects and arrays in serialised JSON, counted by their opening brackets: those
    inside strings count too, so it is an upper bound, and it costs no walk."""
    return key.count(b"{") + key.count(b"[")


def schema_patterns(schema: Any) -> set[str]:
    """The distinct regular expressions compiling ``schema`` compiles (jsonschema-rs compiles one
    pattern once per schema): every string under a ``pattern`` key and every key of a
    ``patternProperties`` object, wherever it is, since a ``$ref`` can point anywhere (a pattern
    under ``examples`` counts too: an upper bound)."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            pattern = node.get("pattern")
            if isinstance(pattern, str):
                found.add(pattern)
            keyed = node.get("patternProperties")
            if isinstance(keyed, dict):
                found.update(key for key in keyed if isinstance(key, str))
            stack.extend(value for value in node.values() if isinstance(value, dict | list))
        elif isinstance(node, list):
            stack.extend(value for value in node if isinstance(value, dict | list))
    return found


def schema_fanout_from_bytes(key: bytes) -> int | None:
    """An upper bound of ``schema_fanout`` for any schema in serialised JSON, read without a
    walk; None when the JSON may name a reference (a key ending in "ef": ``$ref``,
    ``$dynamicRef``, ``$recursiveRef``). Without one, a schema checks a value against each of its
    subschemas at most once, and ``_weight`` counts each JSON value at most twice (as a
    subschema, and as an entry of ``properties``), so twice the JSON values (at most one more
    than the commas and brackets) bound it, with one to spare for ``_closed``'s."""
    if b'ef":' in key:
        return None
    return 2 * (2 + key.count(b",") + schema_nodes(key))


# -- how many times one value of an answer can be checked ----------------------------------------

# Keywords whose subschemas check the same value as the schema holding them, and references.
_SAME_VALUE = frozenset(
    ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies")
)
_REFERENCES = frozenset(("$ref", "$dynamicRef", "$recursiveRef"))
# Keywords whose subschemas check the value's members (properties, items, property names).
_MEMBERS = frozenset(
    (
        "properties",
        "patternProperties",
        "additionalProperties",
        "unevaluatedProperties",
        "propertyNames",
        "prefixItems",
        "items",
        "additionalItems",
        "contains",
        "unevaluatedItems",
    )
)
_APPLYING = _SAME_VALUE | _REFERENCES | _MEMBERS
# A subschema with only these is its $ref's target (pydantic writes a field's description there).
_REFERENCE_ONLY = frozenset(
    ("$ref", "$comment", "title", "description", "default", "examples", "deprecated")
)
# Keywords that compare the value with names or values the schema lists: weighed by those.
_COMPARED = frozenset(("required", "dependentRequired", "enum", "const"))
_KEYWORDS = _APPLYING | _COMPARED
# Where $id and anchors can be (a $ref reaches $defs too), and which of those map names to them.
_SUBSCHEMA_MAPS = frozenset(
    ("properties", "patternProperties", "dependentSchemas", "dependencies", "$defs", "definitions")
)
_SUBSCHEMA_HOLDERS = _APPLYING | _SUBSCHEMA_MAPS
# The base URI of a schema without $id; .invalid names nothing a client's $id can.
_ROOT_URI = "https://repairproxy.invalid/schema.json"
# Merging per-member maps costs their sizes; past this many entries (a schema that shares wide
# subschemas at many places) maps merge collapsed to their largest entry: coarser, still a bound.
_MERGE_BUDGET = 8 * 1024

_Triple = tuple[int, int, int]
_ZERO: _Triple = (0, 0, 0)
_ZEROS = itertools.repeat(0)


class SchemaFanoutError(ValueError):
    """``schema_fanout`` refused a schema: over the limit (``bound``: at least that much), or
    with no bound (``bound`` None; ``reason`` says why, ``{values}`` standing for what the schema
    checks)."""

    def __init__(self, reason: str, bound: int | None = None) -> None:
        super().__init__(reason or f"at least {bound} checks of one value")
        self.reason = reason
        self.bound = bound

    def message(self, subject: str, values: str, limit: int) -> str:
        """The refusal as the client reads it: ``subject`` ("tool 'f'") checks ``values`` ("its
        arguments")."""
        if self.bound is not None:
            return (
                f"{subject} can check one value of {values} against at least {self.bound} "
                "subschemas, names and values (a subschema that a $ref or an applicator reaches "
                f"again counts again); at most {limit} are accepted per value (schema fan-out "
                "limit)"
            )
        return f"{subject} {self.reason.replace('{values}', values)} (schema fan-out limit)"


def schema_fanout(schema: Any, limit: int = MAX_SCHEMA_FANOUT) -> int:
    """An upper bound of the work of checking one value of an answer (one instance location)
    against ``schema``: the subschemas jsonschema-rs may check that value against, each
    weighted by the names and values it compares. Raises ``SchemaFanoutError`` past ``limit``,
    or where there is no bound.

    Why per value: checking an answer checks each of its values against some subschemas, so it
    costs at most this bound times the answer's values, and the answer's size bounds those.
    The bound is the schema's doing. Without a reference each subschema sits at one place and
    checks a value at most once; a ``$ref`` lets a small schema reach one subschema many times
    for one value, doubling with each level whose ``allOf`` names the next level twice (or
    ``oneOf``, ``not``, ``if``/``then``/``else``: when errors are collected every branch runs).

    The walk (linear: each subschema once, merges of wide per-member maps budgeted):
    - ``here(S)``, checks of the value S checks from one check of S: S's weight (one, one per
      ``properties``/``patternProperties`` entry it looks up, and ``_weight``'s names and values
      it compares) plus ``here`` of every subschema S applies to the same value, once per time it
      names it (``allOf``/``anyOf``/``oneOf`` entries, ``not``, ``if``/``then``/``else``,
      ``dependentSchemas``, the target of ``$ref``; ``$dynamicRef`` and ``$recursiveRef`` count
      every subschema they may land on). A subschema that is only a ``$ref`` (and annotations)
      is its target. A cycle of these never leaves the value: refused.
    - ``nested(S)``, at most the checks of any one value inside it. A member of the value (a
      property, an array position, a property name) is checked by what S and everything S
      applies to the same value apply to that member: ``properties`` by name, else
      ``additionalProperties``; every ``patternProperties`` entry (any may match);
      ``prefixItems``/``items``, ``additionalItems``, ``contains``, ``unevaluated*``. Those sum
      per member, their ``here`` at the member itself and their ``nested`` below it, and
      ``nested(S)`` is the largest over members: two properties are two values, so a ``left``
      and a ``right`` that both recurse cost no more than one.
    - A recursion through members (a tree's ``children: {items: {$ref}}``) makes ``nested``
      depend on itself: within a strongly connected part of the graph every ``nested`` is the
      same, and finite only if each member reaches back into the part at most once and beside
      nothing else that goes deeper, so each level of the answer costs what the one above did.
      Otherwise (the recursion reached twice for one member: a ``left`` in two branches of a
      ``oneOf``) the checks multiply with each level of the answer's nesting: refused.
    The bound is ``max(here(root), nested(root))``: sums of maxima, never an under-estimate.
    A reference outside the document is refused: offline, jsonschema-rs can only reach its
    bundled meta-schemas that way, and the walk cannot see into them.
    """
    if isinstance(schema, Mapping) and not isinstance(schema, dict):
        schema = dict(schema)  # as schema_validator compiles it
    return _FanoutWalk(schema, limit).run()


def _sum(a: _Triple, b: _Triple) -> _Triple:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def _difference(a: _Triple, b: _Triple) -> _Triple:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


def _top(a: _Triple, b: _Triple) -> _Triple:
    return (max(a[0], b[0]), max(a[1], b[1]), max(a[2], b[2]))


def _without_loops(triple: _Triple, nested: int) -> _Triple:
    return (triple[0], triple[1] + triple[2] * nested, 0)


class _Members:
    """What one check of a value against a subschema (and everything that checks the same value
    with it) checks at each member of that value: at a property no entry names,
    ``property_default``; at one named, that plus ``property_delta[name]``; the same for array
    positions; ``key`` at a property name. Each a triple: checks of the member itself; at most
    of any one value nested in it; references back into the strongly connected part being
    solved (each worth that part's ``nested``, once known)."""

    __slots__ = ("item_default", "item_delta", "key", "peak", "property_default", "property_delta")

    def __init__(self) -> None:
        self.property_default = _ZERO
        self.property_delta: dict[str, _Triple] = {}
        self.item_default = _ZERO
        self.item_delta: dict[int, _Triple] = {}
        self.key = _ZERO
        self.peak: int | None = None  # the most checks it holds, known once it holds no loop

    def size(self) -> int:
        return len(self.property_delta) + len(self.item_delta)

    def each(self) -> Iterator[_Triple]:
        """Every member's triple: each named one, and any other of each kind."""
        yield self.property_default
        for delta in self.property_delta.values():
            yield _sum(self.property_default, delta)
        yield self.item_default
        for delta in self.item_delta.values():
            yield _sum(self.item_default, delta)
        yield self.key

    def add(self, other: _Members) -> None:
        self.property_default = _sum(self.property_default, other.property_default)
        self.item_default = _sum(self.item_default, other.item_default)
        self.key = _sum(self.key, other.key)
        for name, delta in other.property_delta.items():
            mine = self.property_delta.get(name)
            self.property_delta[name] = delta if mine is None else _sum(mine, delta)
        for position, delta in other.item_delta.items():
            found = self.item_delta.get(position)
            self.item_delta[position] = delta if found is None else _sum(found, delta)

    def collapsed(self) -> _Members:
        """One triple per kind of member, at least each member's: coarser, still a bound."""
        found = _Members()
        found.key = self.key
        found.property_default = properties = self.property_default
        for delta in self.property_delta.values():
            found.property_default = _top(found.property_default, _sum(properties, delta))
        found.item_default = items = self.item_default
        for delta in self.item_delta.values():
            found.item_default = _top(found.item_default, _sum(items, delta))
        return found

    def closed(self, nested: int) -> _Members:
        """Back references replaced by ``nested``, the bound they stood for."""
        found = _Members()
        found.property_default = _without_loops(self.property_default, nested)
        found.property_delta = {
            n: _without_loops(t, nested) for n, t in self.property_delta.items()
        }
        found.item_default = _without_loops(self.item_default, nested)
        found.item_delta = {p: _without_loops(t, nested) for p, t in self.item_delta.items()}
        found.key = _without_loops(self.key, nested)
        return found

    def most(self) -> int:
        """The most checks of any one member, or of any one value nested in one (no loops)."""
        if self.peak is None:
            found = max(*self.property_default[:2], *self.item_default[:2], *self.key[:2])
            for default, deltas in (
                (self.property_default, self.property_delta.values()),
                (self.item_default, self.item_delta.values()),
            ):
                if deltas:
                    found = max(
                        found,
                        default[0] + max(delta[0] for delta in deltas),
                        default[1] + max(delta[1] for delta in deltas),
                    )
            self.peak = found
        return self.peak


_NO_MEMBERS = _Members()
_NO_MEMBERS.peak = 0


def _weight(node: dict[str, Any]) -> int:
    """One, and one per name or JSON value ``node`` compares the value with (``required``,
    ``dependentRequired``, ``enum``, ``const``): a 20,000-name ``required`` takes ~1 ms to check
    on the 2-core dev machine, where a subschema takes ~15 ns."""
    weight = 1
    for keyword in ("enum", "const"):
        if keyword in node:
            value = node[keyword]
            weight += _json_values(value) if isinstance(value, dict | list) else 1
    required = node.get("required")
    if isinstance(required, list):
        weight += len(required)
    for keyword in ("dependentRequired", "dependencies"):  # draft 7's: its lists of names
        dependent = node.get(keyword)
        if isinstance(dependent, dict):
            weight += sum(len(names) for names in dependent.values() if isinstance(names, list))
    return weight


def _json_values(value: Any) -> int:
    """The JSON values in ``value``, itself included."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


class _Moves:
    """The subschemas of one schema that check members of its value, by member: a property it
    names, any other property, every property (patterns: any may match), and the same for array
    positions; a property name."""

    __slots__ = (
        "item_always",
        "item_default",
        "item_named",
        "key",
        "property_always",
        "property_default",
        "property_named",
    )

    def __init__(self) -> None:
        self.property_named: dict[str, int] = {}
        self.property_default: list[int] = []
        self.property_always: list[int] = []
        self.item_named: dict[int, list[int]] = {}
        self.item_default: list[int] = []
        self.item_always: list[int] = []
        self.key: list[int] = []

    def targets(self) -> list[int]:
        found = list(self.property_named.values())
        for targets in self.item_named.values():
            found.extend(targets)
        for targets in (
            self.property_default,
            self.property_always,
            self.item_default,
            self.item_always,
            self.key,
        ):
            found.extend(targets)
        return found


class _FanoutWalk:
    """One run of ``schema_fanout``: the schema's subschemas, numbered as a depth-first walk
    reaches them, and what it has found out about each (in lists indexed by number)."""

    def __init__(self, schema: Any, limit: int) -> None:
        self.limit = limit
        self.numbers: dict[int, int] = {}
        self.nodes: list[Any] = []
        self.bases: list[str] = []
        self.same: list[list[int]] = []
        self.moves: list[_Moves | None] = []
        self.successors: list[list[int]] = []
        self.here: list[int] = []
        self.nested: list[int] = []
        self.members: list[_Members] = []
        self.resources: dict[str, Any] = {_ROOT_URI: schema}
        self.resolved: dict[tuple[str, str], tuple[Any, str] | None] = {}
        self.indexed = False
        self.anchors: dict[tuple[str, str], tuple[Any, str]] = {}
        self.dynamic_anchors: dict[str, list[tuple[Any, str]]] = {}
        self.recursive_anchors: list[tuple[Any, str]] = []
        self.budget = _MERGE_BUDGET
        self.collapsed: dict[int, _Members] = {}
        # Subschemas that apply nothing (most of a schema) share one number per weight, solved
        # from the start.
        self.terminals: dict[int, int] = {}
        self.solved: list[int] = []
        self.visits = 0
        self.plain = self.terminals[1] = self.append(None, _ROOT_URI, 1)
        self.solved.append(self.plain)
        self.root = self.number(schema, _ROOT_URI)

    def number(self, node: Any, base: str) -> int:
        if not isinstance(node, dict) or _KEYWORDS.isdisjoint(node):
            return self.plain  # most of a schema: applies nothing, compares nothing
        found = self.numbers.get(id(node))
        if found is not None:
            return found
        if _APPLYING.isdisjoint(node):  # compares only: solved as it is, one number per weight
            weight = _weight(node)
            found = self.terminals.get(weight)
            if found is None:
                found = self.terminals[weight] = self.append(None, base, weight)
                self.solved.append(found)
        elif "$ref" in node and node.keys() <= _REFERENCE_ONLY:
            return self.number_reference(node, base)
        else:
            if isinstance(node.get("$id"), str):
                base = urldefrag(urljoin(base, node["$id"]))[0]
                self.resources.setdefault(base, node)
            found = self.append(node, base, 0)
        self.numbers[id(node)] = found
        return found

    def numbered(self, nodes: Iterable[Any], base: str) -> list[int]:
        """``number`` of each, the plain ones (most of a schema) told apart without a call."""
        plain, keywords, number = self.plain, _KEYWORDS, self.number
        return [
            plain
            if (type(node) is dict and keywords.isdisjoint(node)) or type(node) is bool
            else number(node, base)
            for node in nodes
        ]

    def number_reference(self, node: dict[str, Any], base: str) -> int:
        """A subschema that is only a ``$ref`` (and annotations) is its target: numbered as it
        is, following a chain of them without recursion."""
        chain: set[int] = set()
        while True:
            if id(node) in chain:
                raise SchemaFanoutError(
                    "has a cycle of references that never leaves one value of {values} "
                    f"($ref {node['$ref']!r})"
                )
            chain.add(id(node))
            reference = node["$ref"]
            if not isinstance(reference, str):
                found = self.plain  # not a schema jsonschema-rs compiles: it refuses it
                break
            node, base = self.targets("$ref", reference, base)[0]
            known = self.numbers.get(id(node))
            if known is not None:
                found = known
                break
            if not (isinstance(node, dict) and node.keys() <= _REFERENCE_ONLY and "$ref" in node):
                found = self.number(node, base)
                break
        for identity in chain:
            self.numbers[identity] = found
        return found

    def append(self, node: Any, base: str, here: int) -> int:
        self.nodes.append(node)
        self.bases.append(base)
        self.same.append([])
        self.moves.append(None)
        self.successors.append([])
        self.here.append(here)
        self.nested.append(0)
        self.members.append(_NO_MEMBERS)
        return len(self.nodes) - 1

    def expand(self, number: int) -> None:
        """Number what node ``number`` applies, and to what: the same value, or which members."""
        node, base, same = self.nodes[number], self.bases[number], self.same[number]
        moves = None if _MEMBERS.isdisjoint(node) else _Moves()
        weight = _weight(node)
        for keyword, value in node.items():
            if keyword not in _APPLYING:
                continue
            if keyword in ("allOf", "anyOf", "oneOf"):
                if isinstance(value, list):
                    same.extend(self.numbered(value, base))
            elif keyword in ("not", "if", "then", "else"):
                same.append(self.number(value, base))
            elif keyword in ("dependentSchemas", "dependencies"):
                if isinstance(value, dict):
                    for entry in value.values():
                        if isinstance(entry, dict | bool):  # else names: weighed as compared
                            same.append(self.number(entry, base))
            elif keyword in _REFERENCES:
                if isinstance(value, str):
                    same.extend(self.number(t, b) for t, b in self.targets(keyword, value, base))
            elif moves is not None:
                weight += self.add_move(moves, keyword, value, base)
        self.here[number] = weight
        if moves is not None:
            self.moves[number] = moves
            self.successors[number] = same + moves.targets()
        else:
            self.successors[number] = same

    def add_move(self, moves: _Moves, keyword: str, value: Any, base: str) -> int:
        """File what ``keyword`` applies to members in ``moves``; its weight: one per property
        it looks up or pattern it matches."""
        if keyword == "properties":
            if isinstance(value, dict):
                numbers = self.numbered(value.values(), base)
                moves.property_named = dict(zip(value, numbers, strict=True))
                return len(value)
        elif keyword == "patternProperties":
            if isinstance(value, dict):
                moves.property_always.extend(self.number(c, base) for c in value.values())
                return len(value)
        elif keyword == "prefixItems" or (keyword == "items" and isinstance(value, list)):
            if isinstance(value, list):
                for position, child in enumerate(value):
                    targets = moves.item_named.setdefault(position, [])
                    targets.append(self.number(child, base))
        else:
            target = self.number(value, base)
            if keyword == "additionalProperties":
                moves.property_default.append(target)
            elif keyword == "unevaluatedProperties":
                moves.property_always.append(target)
            elif keyword == "additionalItems":
                moves.item_default.append(target)
            elif keyword == "propertyNames":
                moves.key.append(target)
            else:  # items (one schema for every position), contains, unevaluatedItems
                moves.item_always.append(target)
        return 0

    def targets(self, keyword: str, reference: str, base: str) -> list[tuple[Any, str]]:
        """What a reference can land on, with each one's base URI."""
        key = (reference, base)
        if key not in self.resolved:
            self.resolved[key] = self.resolve(reference, base)
        found = self.resolved[key]
        if found is None:
            raise SchemaFanoutError(
                f"has a {keyword} the proxy cannot follow within the schema ({reference!r}), "
                "so it cannot bound how often one value of {values} is checked"
            )
        if keyword == "$dynamicRef":  # may land on any subschema naming its anchor: count all
            self.index()
            return [found, *self.dynamic_anchors.get(urldefrag(reference)[1], ())]
        if keyword == "$recursiveRef":
            self.index()
            return [found, *self.recursive_anchors]
        return [found]

    def resolve(self, reference: str, base: str) -> tuple[Any, str] | None:
        """The subschema a reference names within the document, and its base URI; else None."""
        if reference.startswith("#"):  # the common case, and one urljoin gets wrong for urn:
            uri, fragment = base, reference[1:]
        else:
            uri, fragment = urldefrag(urljoin(base, reference))
        if uri not in self.resources:
            self.index()
        node = self.resources.get(uri)
        if "%" in fragment:
            fragment = unquote(fragment)
        if node is None or not fragment:
            return None if node is None else (node, uri)
        if fragment[0] != "/":
            self.index()
            return self.anchors.get((uri, fragment))
        for token in fragment[1:].split("/"):
            if "~" in token:
                token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict):
                if token not in node:
                    return None
                node = node[token]
                if isinstance(node, dict) and "$id" in node and isinstance(node["$id"], str):
                    uri = urldefrag(urljoin(uri, node["$id"]))[0]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                return None
        return (node, uri) if isinstance(node, dict | bool) else None

    def index(self) -> None:
        """Find the document's $id, $anchor, $dynamicAnchor and $recursiveAnchor, once."""
        if self.indexed:
            return
        self.indexed = True
        stack = [(self.resources[_ROOT_URI], _ROOT_URI)]
        while stack:
            node, base = stack.pop()
            if not isinstance(node, dict):
                continue
            if isinstance(node.get("$id"), str):
                base = urldefrag(urljoin(base, node["$id"]))[0]
                self.resources.setdefault(base, node)
            for keyword in ("$anchor", "$dynamicAnchor"):
                name = node.get(keyword)
                if isinstance(name, str):
                    self.anchors[(base, name)] = (node, base)
                    if keyword == "$dynamicAnchor":
                        self.dynamic_anchors.setdefault(name, []).append((node, base))
            if node.get("$recursiveAnchor") is True:
                self.recursive_anchors.append((node, base))
            for keyword in _SUBSCHEMA_HOLDERS.intersection(node):
                value = node[keyword]
                if isinstance(value, list):
                    stack.extend((child, base) for child in value)
                elif isinstance(value, dict) and keyword in _SUBSCHEMA_MAPS:
                    stack.extend((child, base) for child in value.values())
                else:
                    stack.append((value, base))

    def run(self) -> int:
        """Tarjan's algorithm without recursion, over the subschemas and what they apply: each
        strongly connected part is solved once every part it reaches is."""
        index: list[int] = []  # by number: when the walk reached it; -1: not yet
        low: list[int] = []
        on_stack: set[int] = set()
        stack: list[int] = []
        work: list[tuple[int, int]] = []

        def visit(number: int) -> None:
            self.expand(number)
            missing = len(self.nodes) - len(index)
            index.extend([-1] * missing)
            low.extend([-1] * missing)
            for solved in self.solved:  # terminals are reached, not visited
                index[solved] = low[solved] = 0
            self.solved.clear()
            self.visits += 1
            index[number] = low[number] = self.visits
            stack.append(number)
            on_stack.add(number)
            work.append((number, 0))

        if self.nodes[self.root] is None:  # a schema that applies nothing
            return self.over(self.here[self.root])
        visit(self.root)
        while work:
            number, position = work[-1]
            successors = self.successors[number]
            while position < len(successors):
                target = successors[position]
                position += 1
                if index[target] < 0:
                    work[-1] = (number, position)
                    visit(target)
                    break
                if target in on_stack and index[target] < low[number]:
                    low[number] = index[target]
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[number])
                if low[number] == index[number]:
                    member = stack.pop()
                    on_stack.discard(member)
                    if member == number and number not in successors:
                        self.solve_one(number)
                        continue
                    part = [member]
                    while member != number:
                        member = stack.pop()
                        on_stack.discard(member)
                        part.append(member)
                    self.solve_part(part)
        return max(self.here[self.root], self.nested[self.root])

    def over(self, count: int) -> int:
        if count > self.limit:
            raise SchemaFanoutError("", count)
        return count

    def solve_one(self, number: int) -> None:
        """A subschema on no cycle: everything it applies is solved."""
        here = self.here
        here[number] = self.over(here[number] + sum(map(here.__getitem__, self.same[number])))
        members = self.members[number] = self.members_of(number, None)
        self.nested[number] = self.over(members.most())

    def solve_part(self, part: list[int]) -> None:
        """A strongly connected part: a recursion through members, or a cycle that never leaves
        one value (refused)."""
        inside = set(part)
        here = self.here
        ordered = self.same_value_order(part, inside)
        for number in ordered:
            here[number] = self.over(here[number] + sum(map(here.__getitem__, self.same[number])))
        for number in ordered:  # once every ``here`` of the part is known
            self.members[number] = self.members_of(number, inside)
        nested, loops = 0, False
        for members in {id(self.members[n]): self.members[n] for n in part}.values():
            if members.peak is not None:
                nested = max(nested, members.peak)
                continue
            for at_member, below, back in members.each():
                nested = max(nested, at_member, below)
                if back:
                    if back > 1 or below > 0:
                        raise SchemaFanoutError(
                            "has a recursion that checks one value of {values} more times the "
                            "deeper the value nests (a recursive subschema reached twice for "
                            "one member of a value, or beside another that goes deeper)"
                        )
                    loops = True
        self.over(nested)
        closed: dict[int, _Members] = {}
        for number in part:
            self.nested[number] = nested
            if loops:
                members = self.members[number]
                if id(members) not in closed:
                    closed[id(members)] = members.closed(nested)
                self.members[number] = closed[id(members)]

    def same_value_order(self, part: list[int], inside: set[int]) -> list[int]:
        """The part's subschemas, each after those it applies to the same value; a cycle of
        these never leaves one value: refused."""
        done: set[int] = set()
        order: list[int] = []
        for start in part:
            if start in done:
                continue
            open_nodes = {start}
            path = [(start, iter(self.same[start]))]
            while path:
                number, children = path[-1]
                for child in children:
                    if child not in inside or child in done:
                        continue
                    if child in open_nodes:
                        raise SchemaFanoutError(
                            "has a cycle of references that never leaves one value of {values} "
                            f"({self.reference_on([n for n, _ in path])})"
                        )
                    open_nodes.add(child)
                    path.append((child, iter(self.same[child])))
                    break
                else:
                    path.pop()
                    open_nodes.discard(number)
                    done.add(number)
                    order.append(number)
        return order

    def reference_on(self, path: list[int]) -> str:
        for number in reversed(path):
            node = self.nodes[number]
            for keyword in ("$ref", "$dynamicRef", "$recursiveRef"):
                if isinstance(node.get(keyword), str):
                    return f"{keyword} {node[keyword]!r}"
        return "through its applicators"

    def members_of(self, number: int, inside: set[int] | None) -> _Members:
        """What one check of node ``number`` checks at each member of the value; references
        into ``inside``, the part being solved, are counted as such."""
        moves, same = self.moves[number], self.same[number]
        if moves is None:
            if not same:
                return _NO_MEMBERS
            if len(same) == 1:
                return self.members[same[0]]
            merged = _Members()
        else:
            merged = self.own_members(moves, inside)
        for child in same:
            found = self.members[child]
            if found is _NO_MEMBERS:
                continue
            size = found.size()
            if size:
                self.budget -= size
                if self.budget < 0:
                    if id(found) not in self.collapsed:
                        self.collapsed[id(found)] = found.collapsed()
                    found = self.collapsed[id(found)]
            merged.add(found)
        return merged

    def own_members(self, moves: _Moves, inside: set[int] | None) -> _Members:
        here, nested = self.here, self.nested

        def checks(targets: list[int]) -> _Triple:
            at_member = below = back = 0
            for target in targets:
                at_member += here[target]
                if inside is not None and target in inside:
                    back += 1
                else:
                    below += nested[target]
            return (at_member, below, back)

        found = _Members()
        default = checks(moves.property_default)
        found.property_default = _sum(default, checks(moves.property_always))
        named = moves.property_named
        if default == _ZERO and (inside is None or inside.isdisjoint(named.values())):
            targets = named.values()
            triples = zip(
                map(here.__getitem__, targets),
                map(nested.__getitem__, targets),
                _ZEROS,
                strict=False,
            )
            found.property_delta = dict(zip(named, triples, strict=False))
        else:
            found.property_delta = {
                name: _difference(checks([target]), default)
                for name, target in moves.property_named.items()
            }
        default = checks(moves.item_default)
        found.item_default = _sum(default, checks(moves.item_always))
        found.item_delta = {
            position: _difference(checks(targets), default)
            for position, targets in moves.item_named.items()
        }
        found.key = checks(moves.key)
        return found


def compiled_size(key: bytes, tools: int) -> int:
    """The memory a compiled tools list is accounted for, estimated from its JSON's size."""
    return len(key) * COMPILED_BYTES_PER_JSON_BYTE + tools * COMPILED_BYTES_PER_TOOL


class ToolsCache:
    """Compiled tools per distinct ``tools``/``functions`` list: an LRU keyed by their JSON,
    bounded by entries and by the memory its compiled validators are estimated to take.

    A list estimated larger than the whole bound is compiled for its request and not kept. A
    request declaring more than ``max_tools`` functions, more than ``max_tools_bytes`` of them,
    more regular expressions or JSON nodes than ``compile`` is allowed, or a tool whose check of
    one value of its arguments can take more than ``MAX_SCHEMA_FANOUT`` (``schema_fanout``), is
    refused before anything is compiled.
    """

    def __init__(
        self,
        max_entries: int = 256,
        *,
        max_bytes: int = DEFAULT_TOOLS_CACHE_BYTES,
        max_tools: int = DEFAULT_MAX_TOOLS,
        max_tools_bytes: int = DEFAULT_MAX_TOOLS_BYTES,
        forbid_extra_arguments: bool = False,
    ) -> None:
        if max_entries < 1 or max_bytes < 1 or max_tools < 1 or max_tools_bytes < 1:
            raise ValueError("max_entries, max_bytes and max_tools must be at least 1")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_tools = max_tools
        self.max_tools_bytes = max_tools_bytes
        # Also treat arguments the schema does not name as violations (see ``_closed``).
        self.forbid_extra_arguments = forbid_extra_arguments
        self._entries: OrderedDict[bytes, tuple[CompiledTools, int]] = OrderedDict()
        self.bytes = 0  # estimated memory of the kept entries (compiled_size)
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def compile(
        self,
        body: Mapping[str, Any],
        *,
        max_patterns: int = DEFAULT_MAX_SCHEMA_PATTERNS,
        max_nodes: int = DEFAULT_MAX_SCHEMA_NODES,
    ) -> CompiledTools | None:
        """The compiled tools of a request body; None when it declares no tools.

        ``max_patterns`` caps the distinct regular expressions (counted per tool, since each
        tool compiles on its own) and ``max_nodes`` the JSON objects and arrays of the tools
        (see ``schema_nodes``); the compiled tools carry both counts, for the request's other
        schema (``structured.FormatCache``) to be counted against what is left.
        """
        tools, functions = body.get("tools"), body.get("functions")
        if tools is None and functions is None:
            return None
        param = "tools" if isinstance(tools, list) and tools else "functions"
        declared_count = sum(len(v) for v in (tools, functions) if isinstance(v, list))
        if declared_count > self.max_tools:
            raise InvalidToolsError(
                f"{declared_count} tools declared; at most {self.max_tools} are accepted",
                param=param,
            )
        key = self._key(body)
        if len(key) > self.max_tools_bytes:
            raise InvalidToolsError(
                f"the tools declared take {len(key)} bytes of JSON; at most "
                f"{self.max_tools_bytes} are accepted",
                param=param,
            )
        entry = self._entries.get(key)
        # A cached entry carries the counts its key gave: a hit counts nothing again.
        nodes = entry[0].nodes if entry is not None else schema_nodes(key)
        if nodes > max_nodes:
            raise InvalidToolsError(
                f"the tools declared hold {nodes} JSON objects and arrays; at most {max_nodes} "
                "are accepted (--max-schema-nodes)",
                param=param,
            )
        if entry is not None:
            self._entries.move_to_end(key)
            _check_patterns(entry[0].patterns, max_patterns, param)
            return entry[0]
        declared = _declared_tools(body)
        # Most tools declare no pattern: one scan of the key spares them the walk.
        patterns = (
            sum(len(schema_patterns(schema)) for _, schema in declared or ())
            if b'"pattern' in key
            else 0
        )
        _check_patterns(patterns, max_patterns, param)
        fanout = schema_fanout_from_bytes(key)
        if fanout is None or fanout > MAX_SCHEMA_FANOUT:
            fanout = max((self._fanout(n, s, param) for n, s in declared or ()), default=0)
        compiled = CompiledTools(declared or [], forbid_extra_arguments=self.forbid_extra_arguments)
        compiled.patterns, compiled.nodes, compiled.fanout = patterns, nodes, fanout
        size = compiled_size(key, len(compiled.names))
        if size > self.max_bytes:
            return compiled  # kept for this request only
        self._entries[key] = (compiled, size)
        self.bytes += size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.bytes -= evicted
            self.evictions += 1
        return compiled

    def _fanout(self, name: str, schema: Mapping[str, Any], param: str) -> int:
        """The tool's ``schema_fanout``, as compiled (closed, when extra arguments are
        forbidden); over ``MAX_SCHEMA_FANOUT``, or unbounded, the tools are refused."""
        enforced = _closed(schema) if self.forbid_extra_arguments else schema
        try:
            fanout = schema_fanout_from_bytes(orjson.dumps(enforced))
        except TypeError:  # not JSON (a caller's own mapping): walked as it is
            fanout = None
        if fanout is not None and fanout <= MAX_SCHEMA_FANOUT:
            return fanout
        try:
            return schema_fanout(enforced)
        except SchemaFanoutError as exc:
            message = exc.message(f"tool {name!r}", "its arguments", MAX_SCHEMA_FANOUT)
            raise InvalidToolsError(message, tool_name=name, param=param) from exc

    @staticmethod
    def _key(body: Mapping[str, Any]) -> bytes:
        # The serialised tools are the key itself: the dict hashes them, and equality is exact, so
        # no digest collision can hand a request another request's validators. Keys are not sorted
        # (that doubles the cost per request); a client that reorders keys only costs a recompile.
        try:
            return orjson.dumps([body.get("tools"), body.get("functions")])
        except TypeError as exc:
            raise InvalidToolsError(f"tools are not JSON-serializable: {exc}") from exc


def _check_patterns(patterns: int, max_patterns: int, param: str) -> None:
    if patterns > max_patterns:
        raise InvalidToolsError(
            f"the tools declared hold {patterns} distinct regular expressions (pattern, "
            f"patternProperties); at most {max_patterns} are accepted (--max-schema-patterns)",
            param=param,
        )
