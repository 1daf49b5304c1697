"""One Retail episode's world: the agent tools over a copy-on-write view of the loaded store.

``call_tool`` follows τ²-bench v1.0.1's ``Environment.get_response``: any exception becomes the tool
message ``Error: <message>`` with ``error=True``; a successful result is sent as a string as-is, or
as ``json.dumps(model.model_dump())``. Retail is single-control: the user has no tools.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from evals.tau2.domains.base import Requestor, ToolResult
from evals.tau2.domains.retail.db import RetailDB
from evals.tau2.domains.retail.hashing import CanonicalCache
from evals.tau2.domains.retail.tools import (
    AGENT_TOOL_NAMES,
    WRITE_TOOLS,
    RetailTools,
    agent_tool_schemas,
)
from evals.tau2.tasks import (
    EnvAssertion,
    EnvFunctionCall,
    InitialState,
    as_env_assertion,
    as_initial_state,
)

__all__ = ["RetailEnvironment", "serialize_result"]


def serialize_result(result: Any) -> str:
    """A tool's return value as τ²-bench's ``Environment.to_json_str`` writes it."""
    if isinstance(result, str):
        return result
    if isinstance(result, BaseModel):
        return json.dumps(result.model_dump(), default=str)
    return json.dumps(result, default=str)


def _deep_merge(target: dict[str, Any], updates: dict[str, Any]) -> dict[str, Any]:
    """Merge ``updates`` into ``target`` recursively (τ²-bench merges with addict's ``update``)."""
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _deep_merge(target[key], value)
        else:
            target[key] = value
    return target


class RetailEnvironment:
    """A fresh Retail world; implements ``evals.tau2.domains.base.DomainEnvironment``."""

    def __init__(
        self,
        pristine: RetailDB,
        cache: CanonicalCache | None = None,
        *,
        modify_items_fix: bool = False,
    ) -> None:
        self._tools = RetailTools.sharing(pristine, modify_items_fix=modify_items_fix)
        self._cache = cache if cache is not None else CanonicalCache(pristine)

    @property
    def db(self) -> RetailDB:
        """The current database (read it; change it only through tools)."""
        return self._tools.db

    def agent_tools(self) -> list[dict[str, Any]]:
        return agent_tool_schemas()

    def user_tools(self) -> list[dict[str, Any]]:
        return []

    def call_tool(self, requestor: Requestor, name: str, arguments: dict[str, Any]) -> ToolResult:
        try:
            content = serialize_result(self._dispatch(requestor, name, arguments))
        except Exception as exc:  # τ²-bench reports every failure to the caller, never raises
            return ToolResult(content=f"Error: {exc}", error=True)
        return ToolResult(content=content, error=False)

    def _dispatch(self, requestor: str, name: str, arguments: Any) -> Any:
        if requestor == "user":
            raise ValueError("User tools not available")
        if requestor != "assistant":
            raise ValueError(f"Invalid requestor: {requestor}")
        if name not in AGENT_TOOL_NAMES:
            raise ValueError(f"Tool '{name}' not found.")
        if not isinstance(arguments, dict):
            raise TypeError(f"Tool arguments must be an object, not {type(arguments).__name__}")
        return getattr(self._tools, name)(**arguments)

    def apply_initial_state(self, initial_state: InitialState | Mapping[str, Any] | None) -> None:
        state = as_initial_state(initial_state)
        if state is None:
            return
        data = state.initialization_data
        if data is not None and data.agent_data is not None:
            merged = _deep_merge(self._tools.db.model_dump(), data.agent_data)
            self._tools.replace_db(RetailDB.model_validate(merged))
        if data is not None and data.user_data is not None:
            raise ValueError("User tools not available")
        for call in state.initialization_actions or []:
            self._run_env_function_call(call)
        self._replay_write_calls(state.message_history or [])

    def _replay_write_calls(self, messages: list[dict[str, Any]]) -> None:
        # τ²-bench re-executes only state-changing calls of a given history; reads change nothing.
        for message in messages:
            for tool_call in message.get("tool_calls") or []:
                if tool_call.get("name") in WRITE_TOOLS:
                    requestor = tool_call.get("requestor", "assistant")
                    self.call_tool(requestor, tool_call["name"], tool_call.get("arguments") or {})

    def _run_env_function_call(self, call: EnvFunctionCall) -> Any:
        env_type = call.env_type
        if env_type == "user":
            raise ValueError("User tools not available")
        name = call.func_name
        function: Callable[..., Any] | None = (
            None if name.startswith("_") else getattr(self._tools, name, None)
        )
        if not callable(function):
            raise ValueError(f"Function {name} not found in {env_type} tools")
        return function(**call.arguments)

    def run_env_assertion(self, assertion: EnvAssertion | Mapping[str, Any]) -> bool:
        typed = as_env_assertion(assertion)
        result = self._run_env_function_call(typed)
        if not isinstance(result, bool):
            raise ValueError(f"Function {typed.func_name} returned {type(result)} instead of bool")
        return bool(result == typed.assert_value)

    def db_hash(self) -> str:
        return self._cache.hash(self._tools.db)
