"""What becomes of each request field when a Responses or Messages request is answered by a
chat-only upstream (the embedded model, llama.cpp, vLLM without ``/v1/responses``).

``FIELDS[api][name]`` is one of:

* ``honoured``: translated into the chat request, or done by the proxy itself (its Responses
  store and message threads);
* ``dropped``: the chat API has no such thing and leaving it out does not change what the answer
  may be (metadata, cache keys, tiers, reasoning effort): the request is answered without it,
  the log line lists it (``dropped_fields``) and the ``X-Repairproxy-Dropped-Fields`` header
  names it;
* ``refused``: leaving it out would change the answer (a server-side conversation, a background
  run, a hosted tool the upstream cannot run): a 400 naming it.

A field this table does not know is dropped the same way (named in the header). Tools are
refused by type: a hosted tool (Responses: any ``type`` other than ``function``; Messages: a
server tool, one with a ``type`` other than ``custom`` and no ``input_schema``). The table is
written out as ``docs/chat-only-fields.md`` by ``field_table()``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from repairproxy.errors import BadRequestError

__all__ = ["FIELDS", "Fate", "chat_only_fields", "field_table"]

Fate = Literal["honoured", "dropped", "refused"]

_RESPONSES: dict[str, Fate] = {
    "model": "honoured",
    "input": "honoured",
    "instructions": "honoured",
    "tools": "honoured",  # function tools; hosted ones refused (below)
    "tool_choice": "honoured",
    "parallel_tool_calls": "honoured",
    "temperature": "honoured",
    "top_p": "honoured",
    "max_output_tokens": "honoured",
    "stream": "honoured",
    "text": "honoured",  # text.format as response_format
    "previous_response_id": "honoured",  # the proxy's own store
    "store": "honoured",  # the proxy's own store
    "metadata": "dropped",
    "user": "dropped",
    "safety_identifier": "dropped",
    "prompt_cache_key": "dropped",
    "prompt_cache_retention": "dropped",
    "service_tier": "dropped",
    "reasoning": "dropped",
    "include": "dropped",
    "truncation": "dropped",
    "top_logprobs": "dropped",
    "stream_options": "dropped",
    "max_tool_calls": "dropped",
    "conversation": "refused",  # a server-side conversation the upstream does not keep
    "background": "refused",  # a run the client polls for later
    "prompt": "refused",  # a stored prompt template the upstream cannot expand
}

_MESSAGES: dict[str, Fate] = {
    "model": "honoured",
    "messages": "honoured",
    "system": "honoured",
    "tools": "honoured",  # client tools; server tools refused (below)
    "tool_choice": "honoured",
    "max_tokens": "honoured",
    "stop_sequences": "honoured",
    "temperature": "honoured",
    "top_p": "honoured",
    "top_k": "honoured",
    "stream": "honoured",
    "output_config": "honoured",  # output_config.format as response_format
    "output_format": "honoured",
    "thread": "honoured",  # the proxy's own message threads
    "metadata": "dropped",
    "service_tier": "dropped",
    "thinking": "dropped",
    "context_management": "dropped",
    "cache_control": "dropped",
    "inference_geo": "dropped",
    "speed": "dropped",
    "container": "refused",  # code execution state the upstream does not have
    "mcp_servers": "refused",  # remote tools the upstream cannot call
}

FIELDS: Mapping[str, Mapping[str, Fate]] = {"responses": _RESPONSES, "messages": _MESSAGES}


def _hosted(api: str, tool: Any) -> str | None:
    """The type of a hosted (server) tool, None for a function / client tool."""
    if not isinstance(tool, Mapping):
        return None
    kind = tool.get("type")
    if api == "responses":
        return None if kind == "function" else str(kind)
    if kind in (None, "custom") or "input_schema" in tool:
        return None
    return str(kind)


def chat_only_fields(api: str, body: Mapping[str, Any]) -> tuple[str, ...]:
    """The fields of ``body`` dropped on a chat-only upstream; a 400 for a refused one."""
    table = FIELDS[api]
    dropped: list[str] = []
    for name in body:
        fate = table.get(name, "dropped")
        if fate == "refused" and body[name] not in (None, False):
            raise BadRequestError(
                f"'{name}' is not supported by this proxy's upstream (chat completions only): "
                "answering without it would change the answer",
                param=name,
                code="unsupported_parameter",
            )
        if fate == "dropped" or (fate == "refused" and body[name] is not None):
            dropped.append(name)
    tools = body.get("tools")
    for index, tool in enumerate(tools if isinstance(tools, list) else ()):
        hosted = _hosted(api, tool)
        if hosted is not None:
            raise BadRequestError(
                f"hosted tool '{hosted[:64]}' (tools[{index}]) cannot run on this proxy's "
                "upstream (chat completions only)",
                param=f"tools[{index}]",
                code="unsupported_parameter",
            )
    return tuple(dropped)


def field_table() -> str:
    """The table as Markdown, one section per API (``docs/chat-only-fields.md`` is this text)."""
    lines: list[str] = [
        "# Request fields on a chat-only upstream",
        "",
        "Generated from `repairproxy/wire/fields.py` (`field_table()`; a test keeps this file",
        "current). *honoured*: translated, or done by the proxy itself; *dropped*: answered",
        "without it, named in the `X-Repairproxy-Dropped-Fields` header and the log line's",
        "`dropped_fields`; *refused*: a 400 naming it, because answering without it would change",
        "the answer.",
        "",
    ]
    for api, table in FIELDS.items():
        path = "/v1/responses" if api == "responses" else "/v1/messages"
        lines += [f"## `{path}` on a chat-only upstream", "", "| field | fate |", "|---|---|"]
        lines += [f"| `{name}` | {fate} |" for name, fate in table.items()]
        lines += [
            "| hosted / server tools | refused |",
            "| any other field | dropped |",
            "",
        ]
    return "\n".join(lines)
