"""Render OpenAI chat messages and tools into Qwen2.5's Hermes/ChatML prompt, as its template does.

This is the template Qwen2.5 ships in ``tokenizer_config.json`` (the one vLLM renders), written out
by hand because the copy embedded in the GGUF has a ``{{"name"...}}`` typo the model then imitates.
Tools go in ``<tools></tools>`` in the system turn, assistant calls are ``<tool_call>`` blocks, and
consecutive ``role: tool`` results share one user turn as ``<tool_response>`` blocks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DEFAULT_SYSTEM", "RENDERING", "REPAIR_MARKER", "render_prompt", "text_of"]

DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# The proxy appends its repair instruction to the system prompt; every template's instruction
# starts with this. The embedded server renders that paragraph after the tools block, so a run
# with repair on and one with it off share the policy + tools prefix in the prompt cache (4,968
# tokens reused instead of ~1,500). Only this server does it: other upstreams render as they do.
REPAIR_MARKER = "Tool-call repair:"
# Recorded in the study's provenance: what the embedded server's prompts look like.
RENDERING = "qwen2.5-hermes; repair instruction after the tools block"

_TOOLS_HEADER = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\n</tool_call>'
)


def _tojson(value: Any) -> str:
    # Jinja's tojson in transformers: json.dumps with ensure_ascii=False and default separators.
    return json.dumps(value, ensure_ascii=False)


def text_of(content: Any) -> str:
    """Message content as text: ``None`` is empty, a list of parts is its texts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            str(part.get("text", "")) if isinstance(part, Mapping) else str(part)
            for part in content
        )
    return str(content)


def _arguments_json(arguments: Any) -> str:
    """Arguments as the template writes them: parsed and re-serialised, raw text if unparsable."""
    if isinstance(arguments, str):
        try:
            return _tojson(json.loads(arguments))
        except ValueError:
            # A broken call being replayed (e.g. in a repair turn): show the model what it wrote.
            return arguments
    return _tojson(arguments if arguments is not None else {})


def _render_tool_call(call: Mapping[str, Any]) -> str:
    function = call.get("function", call)
    name = function.get("name", "")
    return (
        f'\n<tool_call>\n{{"name": "{name}", "arguments": '
        f"{_arguments_json(function.get('arguments'))}}}\n</tool_call>"
    )


def _system_turn(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None) -> str:
    has_system = bool(messages) and messages[0].get("role") == "system"
    system = text_of(messages[0].get("content")) if has_system else DEFAULT_SYSTEM
    if not tools:
        return f"<|im_start|>system\n{system}<|im_end|>\n"
    system, instruction = _split_instruction(system)
    listed = "".join("\n" + _tojson(tool) for tool in tools)
    after = f"\n\n{instruction}" if instruction else ""
    return f"<|im_start|>system\n{system}{_TOOLS_HEADER}{listed}{_TOOLS_FOOTER}{after}<|im_end|>\n"


def _split_instruction(system: str) -> tuple[str, str]:
    """The system text without the proxy's repair instruction paragraph, and that paragraph."""
    at = system.find(REPAIR_MARKER)
    if at < 0 or (at > 0 and not system[:at].endswith("\n\n")):
        return system, ""
    end = system.find("\n\n", at)
    instruction = system[at:] if end < 0 else system[at:end]
    rest = system[:at].removesuffix("\n\n") + ("" if end < 0 else system[end:])
    return rest, instruction


def render_prompt(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    *,
    add_generation_prompt: bool = True,
) -> str:
    """The full prompt text for ``messages`` (OpenAI shape) and ``tools`` (OpenAI tool objects)."""
    out = [_system_turn(messages, tools)]
    for index, message in enumerate(messages):
        role = message.get("role")
        if index == 0 and role == "system":
            continue  # already in the system turn
        calls = message.get("tool_calls") or (
            [message["function_call"]] if message.get("function_call") else []
        )
        if role == "assistant" and calls:
            content = text_of(message.get("content"))
            body = ("\n" + content if content else "") + "".join(
                _render_tool_call(c) for c in calls
            )
            out.append(f"<|im_start|>assistant{body}<|im_end|>\n")
        elif role in ("tool", "function"):
            previous = messages[index - 1].get("role") if index > 0 else None
            following = messages[index + 1].get("role") if index + 1 < len(messages) else None
            if previous not in ("tool", "function"):
                out.append("<|im_start|>user")
            out.append(f"\n<tool_response>\n{text_of(message.get('content'))}\n</tool_response>")
            if following not in ("tool", "function"):
                out.append("<|im_end|>\n")
        else:
            # user, assistant without calls, a later system message, or any other role as itself
            out.append(f"<|im_start|>{role}\n{text_of(message.get('content'))}<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)
