"""Structured outputs: the answer a client asked to be JSON (``response_format``), checked.

Quantized models break a ``json_schema`` the way they break tool arguments, and the clients that
ask for one (openai's ``.parse()``, pydantic-ai's native output, instructor's JSON modes) fail on
the first bad answer. A request's format is compiled once (jsonschema-rs, the way tools are: the
same regex limits, and a byte cap, since the client controls the schema and the compile and the
check run on the event loop) in a small LRU keyed by its JSON; an answer's text is then one of
two channels, kept beside the tool-call vocabulary of ``validation`` because they are not
tool-call errors and τ²-bench does not count them: they are never charged to an episode's error
budget.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema_rs
import orjson

from repairproxy.errors import BadRequestError
from repairproxy.validation import (
    DEFAULT_MAX_SCHEMA_NODES,
    DEFAULT_MAX_SCHEMA_PATTERNS,
    MAX_ERROR_PATHS,
    MAX_MESSAGE_CHARS,
    MAX_SCHEMA_FANOUT,
    SchemaFanoutError,
    schema_fanout,
    schema_fanout_from_bytes,
    schema_nodes,
    schema_patterns,
    schema_validator,
)

__all__ = [
    "FormatCache",
    "OutputChannel",
    "OutputFormat",
    "OutputVerdict",
    "output_format",
]

# Distinct response formats kept compiled; a client has a handful of output types.
DEFAULT_MAX_FORMATS = 256
# A response_format above this many bytes of JSON gets 400 (``--max-response-format-bytes``):
# compiling it holds the event loop, as tools do (``validation.DEFAULT_MAX_TOOLS_BYTES``).
DEFAULT_MAX_FORMAT_BYTES = 256 * 1024
# A schema above this many bytes of JSON is compiled for its request and not kept. Only an
# operator who raises the cap above it reaches this; each compile is still bounded by the cap.
MAX_CACHED_SCHEMA_BYTES = 1024 * 1024


class OutputChannel(enum.StrEnum):
    """What an answer's text is, for a request with a response format (metric and header values)."""

    VALID = "valid"
    NOT_JSON = "output_not_json"
    SCHEMA_VIOLATION = "output_schema_violation"


@dataclass(frozen=True, slots=True)
class OutputVerdict:
    """The verdict on one answer's text: its channel, a diagnosis, and the failing paths."""

    channel: OutputChannel
    diagnosis: str = ""
    error_paths: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.channel is OutputChannel.VALID


_VALID = OutputVerdict(OutputChannel.VALID)


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


def _path(parts: Any) -> str:
    path = "$"
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


class OutputFormat:
    """One request's ``response_format``, compiled: ``json_object`` or a ``json_schema``."""

    __slots__ = ("_validator", "kind", "name", "nodes", "patterns", "schema")

    def __init__(self, kind: str, name: str | None, schema: Mapping[str, Any] | None) -> None:
        self.kind = kind
        self.name = name
        self.schema = schema
        self._validator: Any = None
        # What compiling it cost, as FormatCache counts it against the request's caps.
        self.patterns = 0
        self.nodes = 0
        if schema is not None:
            try:
                self._validator = schema_validator(schema)
            except (
                jsonschema_rs.ValidationError,
                jsonschema_rs.ReferencingError,
                ValueError,
            ) as exc:
                lines = str(exc).strip().splitlines() or [repr(exc)]
                raise BadRequestError(
                    f"response_format.json_schema.schema is not a valid JSON Schema: "
                    f"{_short(lines[0])}",
                    param="response_format.json_schema.schema",
                ) from exc

    def check(self, content: Any) -> OutputVerdict:
        """Classify an answer's text: valid, not JSON, or not matching the schema."""
        if not isinstance(content, str) or not content.strip():
            return OutputVerdict(OutputChannel.NOT_JSON, "The answer was empty: JSON was expected.")
        try:
            value = orjson.loads(content)
        except orjson.JSONDecodeError as exc:
            return OutputVerdict(OutputChannel.NOT_JSON, f"The answer is not valid JSON ({exc}).")
        if self._validator is None:
            if isinstance(value, dict):
                return _VALID
            return OutputVerdict(
                OutputChannel.NOT_JSON,
                f"The answer must be one JSON object, not {type(value).__name__}.",
            )
        try:
            if self._validator.is_valid(value):
                return _VALID
            paths = tuple(
                f"{_path(error.instance_path)}: {_short(error.message)}"
                for _, error in zip(
                    range(MAX_ERROR_PATHS), self._validator.iter_errors(value), strict=False
                )
            )
        except (ValueError, TypeError, RecursionError):
            paths = ("$: the answer could not be checked (nested too deeply)",)
        shown = f" {self.name!r}" if self.name else ""
        return OutputVerdict(
            OutputChannel.SCHEMA_VIOLATION,
            f"The answer does not match the response schema{shown}: " + "; ".join(paths),
            paths,
        )

    def check_message(self, message: Mapping[str, Any]) -> OutputVerdict | None:
        """The verdict on an assistant message's text; None when there is no output to check (the
        model called tools, or refused)."""
        if message.get("tool_calls") or message.get("function_call") or message.get("refusal"):
            return None
        return self.check(message.get("content"))


def output_format(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The chat ``response_format`` that asks for JSON, if any (``text`` asks for nothing)."""
    value = body.get("response_format")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise BadRequestError("'response_format' must be an object", param="response_format")
    kind = value.get("type")
    if kind == "json_object":
        return value
    if kind != "json_schema":
        return None
    spec = value.get("json_schema")
    if not isinstance(spec, Mapping):
        raise BadRequestError(
            "response_format.json_schema must be an object", param="response_format.json_schema"
        )
    schema = spec.get("schema")
    if schema is not None and not isinstance(schema, Mapping | bool):
        raise BadRequestError(
            "response_format.json_schema.schema must be an object",
            param="response_format.json_schema.schema",
        )
    return value


def _schema(schema: Any) -> Mapping[str, Any]:
    """A declared schema as an object (``true`` and none accept anything, ``false`` nothing)."""
    if schema is None or schema is True:
        return {}
    if schema is False:
        return {"not": {}}
    return dict(schema)


class FormatCache:
    """Compiled response formats per distinct ``response_format`` JSON (an LRU); a format over
    ``max_format_bytes`` of JSON, over what ``compile`` leaves it of the request's regular
    expressions and JSON nodes, or whose check of one value of the answer can take more than
    ``MAX_SCHEMA_FANOUT``, is refused before anything is compiled."""

    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_FORMATS,
        *,
        max_format_bytes: int = DEFAULT_MAX_FORMAT_BYTES,
    ) -> None:
        if max_entries < 1 or max_format_bytes < 1:
            raise ValueError("max_entries and max_format_bytes must be at least 1")
        self.max_entries = max_entries
        self.max_format_bytes = max_format_bytes
        self._entries: OrderedDict[bytes, OutputFormat] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def compile(
        self,
        body: Mapping[str, Any],
        *,
        max_patterns: int = DEFAULT_MAX_SCHEMA_PATTERNS,
        max_nodes: int = DEFAULT_MAX_SCHEMA_NODES,
        tools_patterns: int = 0,
        tools_nodes: int = 0,
    ) -> OutputFormat | None:
        """The compiled format of a chat body; None when it asks for no JSON output.

        The caps are the request's (``validation.schema_patterns``, ``validation.schema_nodes``):
        what the request's tools took (``tools_patterns``, ``tools_nodes``) counts against them.
        """
        if body.get("response_format") is None:
            return None  # the common case costs one lookup
        value = output_format(body)
        if value is None:
            return None
        try:
            key = orjson.dumps(value)
        except TypeError as exc:
            raise BadRequestError(
                f"response_format is not JSON-serializable: {exc}", param="response_format"
            ) from exc
        if len(key) > self.max_format_bytes:
            raise BadRequestError(
                f"the response_format takes {len(key)} bytes of JSON; at most "
                f"{self.max_format_bytes} are accepted",
                param="response_format",
            )
        found = self._entries.get(key)
        # A cached format carries the counts its key gave: a hit counts nothing again.
        nodes = found.nodes if found is not None else schema_nodes(key)
        _check_caps("JSON objects and arrays", nodes, tools_nodes, max_nodes, "--max-schema-nodes")
        if found is not None:
            self._entries.move_to_end(key)
            _check_caps(_PATTERNS, found.patterns, tools_patterns, max_patterns, _PATTERNS_FLAG)
            return found
        if value.get("type") == "json_object":
            compiled = OutputFormat("json_object", None, None)
        else:
            spec = value["json_schema"]
            name = spec.get("name")
            schema = _schema(spec.get("schema"))
            patterns = len(schema_patterns(schema)) if b'"pattern' in key else 0
            _check_caps(_PATTERNS, patterns, tools_patterns, max_patterns, _PATTERNS_FLAG)
            _check_fanout(key, schema)
            compiled = OutputFormat("json_schema", name if isinstance(name, str) else None, schema)
            compiled.patterns = patterns
        compiled.nodes = nodes
        if len(key) <= MAX_CACHED_SCHEMA_BYTES:
            self._entries[key] = compiled
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return compiled


def _check_fanout(key: bytes, schema: Mapping[str, Any]) -> None:
    """Refuse a schema whose check of one value of the answer can take more than
    ``MAX_SCHEMA_FANOUT`` (``validation.schema_fanout``), or has no bound."""
    bound = schema_fanout_from_bytes(key)
    if bound is not None and bound <= MAX_SCHEMA_FANOUT:
        return
    try:
        schema_fanout(schema)
    except SchemaFanoutError as exc:
        message = exc.message("the response_format", "the answer", MAX_SCHEMA_FANOUT)
        raise BadRequestError(message, param="response_format") from exc


_PATTERNS = "distinct regular expressions (pattern, patternProperties)"
_PATTERNS_FLAG = "--max-schema-patterns"


def _check_caps(what: str, count: int, tools_count: int, cap: int, flag: str) -> None:
    if count + tools_count <= cap:
        return
    tools = f" and the tools {tools_count}" if tools_count else ""
    raise BadRequestError(
        f"the response_format holds {count} {what}{tools}; at most {cap} are accepted per "
        f"request ({flag})",
        param="response_format",
    )
