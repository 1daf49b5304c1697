"""Declaring a domain's tools once and deriving everything else from the declaration.

Both domains (Retail, Telecom) declare their tools this way. A method marked
``@tool(description, **param_docs)`` is callable by its side (agent or user) and is advertised with
a JSON schema that pydantic builds from the method's signature, exactly as τ²-bench builds it
(``create_model("parameters", ...)``), so parameter names, types, defaults and required lists
cannot drift from the code. Tools are listed in class-definition order, as τ²-bench lists them.
Methods marked ``@env_function`` are the setup and assertion helpers that only task data
(``initialization_actions``, ``env_assertions``) may call.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import Field, create_model

__all__ = ["ToolKit", "ToolSpec", "ToolType", "env_function", "tool"]

_TOOL_ATTR = "__evals_tool__"
_ENV_ATTR = "__evals_env_function__"


class ToolType(StrEnum):
    """τ²-bench's tool types: only WRITE tools change state (and are replayed)."""

    READ = "read"
    WRITE = "write"
    GENERIC = "generic"


F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told about one tool: τ²-bench's description and per-parameter docs."""

    description: str
    param_docs: dict[str, str] = field(default_factory=dict)
    tool_type: ToolType = ToolType.GENERIC

    @property
    def mutates(self) -> bool:
        """Whether a call can change state (τ²-bench's WRITE tools); others are safe to repeat."""
        return self.tool_type is ToolType.WRITE


def tool(
    description: str,
    *,
    mutates: bool = False,
    tool_type: ToolType | None = None,
    **param_docs: str,
) -> Callable[[F], F]:
    """Mark a method as a tool; the function itself is returned unchanged (no wrapper frames).

    ``tool_type`` defaults to WRITE when ``mutates`` is set, else GENERIC.
    """
    kind = tool_type or (ToolType.WRITE if mutates else ToolType.GENERIC)

    def mark(func: F) -> F:
        setattr(func, _TOOL_ATTR, ToolSpec(description, dict(param_docs), kind))
        return func

    return mark


def env_function(func: F) -> F:
    """Mark a method as callable from task data (setup actions and assertions), never by a model."""
    setattr(func, _ENV_ATTR, True)
    return func


class ToolKit:
    """Base of the agent's and the user's toolkits: lookup, schemas and raw calls by name."""

    # Which side of τ²-bench's environment this toolkit is ("assistant" or "user").
    env_type = "assistant"

    @classmethod
    def _marked(cls, attr: str) -> dict[str, Callable[..., Any]]:
        # Definition order, as τ²-bench lists tools in the order its classes define them.
        found: dict[str, Callable[..., Any]] = {}
        for klass in reversed(cls.__mro__):
            for name, member in vars(klass).items():
                if callable(member) and getattr(member, attr, None):
                    found[name] = member
        return found

    @classmethod
    def tool_specs(cls) -> dict[str, ToolSpec]:
        return {name: getattr(f, _TOOL_ATTR) for name, f in cls._marked(_TOOL_ATTR).items()}

    @classmethod
    def openai_tools(cls) -> list[dict[str, Any]]:
        """The tools in OpenAI ``tools`` format, as τ²-bench's ``Tool.openai_schema`` renders them.

        (Descriptions are τ²-bench's docstring short + long parts joined by a blank line.)
        """
        functions = cls._marked(_TOOL_ATTR)
        return [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": spec.description,
                    "parameters": _parameters_schema(functions[name], spec),
                },
            }
            for name, spec in cls.tool_specs().items()
        ]

    @classmethod
    def tool_names(cls, tool_type: ToolType | None = None) -> tuple[str, ...]:
        """The tools' names in listing order, all of them or those of one type."""
        specs = cls.tool_specs()
        return tuple(n for n, s in specs.items() if tool_type is None or s.tool_type is tool_type)

    @classmethod
    def has_tool(cls, name: str) -> bool:
        return name in cls.tool_specs()

    def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        """Call a tool with the caller's arguments as they are (τ²-bench validates nothing)."""
        if not self.has_tool(name):
            raise ValueError(f"Tool '{name}' not found.")
        return getattr(self, name)(**arguments)

    @classmethod
    def has_env_function(cls, name: str) -> bool:
        """Whether task data may call ``name`` (every tool, and every ``@env_function``)."""
        return name in cls._marked(_ENV_ATTR) or cls.has_tool(name)

    def call_env_function(self, name: str, arguments: dict[str, Any]) -> Any:
        """Call a tool or a setup/assertion helper on behalf of task data."""
        if not self.has_env_function(name):
            raise ValueError(f"Function {name} not found in {self.env_type} tools")
        return getattr(self, name)(**arguments)


def _parameters_schema(func: Callable[..., Any], spec: ToolSpec) -> dict[str, Any]:
    hints = typing.get_type_hints(func)
    fields: dict[str, Any] = {}
    for name, param in inspect.signature(func).parameters.items():
        if name == "self":
            continue
        default: Any = ... if param.default is inspect.Parameter.empty else param.default
        if name in spec.param_docs:
            default = Field(default, description=spec.param_docs[name])
        fields[name] = (hints.get(name, Any), default)
    return create_model("parameters", **fields).model_json_schema()  # type: ignore[no-any-return]
