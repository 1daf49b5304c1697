"""Classify every tool call in a model answer into exactly one channel of a fixed vocabulary.

A request's declared tools are compiled once (jsonschema-rs validators, in an LRU keyed by their
serialised JSON and bounded by the memory they are estimated to take); each answer is then checked
call by call in a few microseconds.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema_rs
import orjson

from repairproxy.errors import InvalidToolsError
from repairproxy.schema_cost import (
    DEFAULT_MAX_SCHEMA_NODES,
    DEFAULT_MAX_SCHEMA_PATTERNS,
    MAX_SCHEMA_FANOUT,
    SchemaFanoutError,
    schema_fanout,
    schema_fanout_from_bytes,
    schema_nodes,
    schema_patterns,
    schema_validator,
)
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
