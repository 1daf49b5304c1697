"""``POST /v1/messages`` (Anthropic's Messages API) through the chat pipeline: an adapter.

The Messages API carries the same tool calls in another shape: ``tool_use`` content blocks with an
object ``input`` instead of ``tool_calls`` with a JSON string, ``tool_result`` blocks (``is_error``)
in the next user turn instead of ``role: tool`` messages, ``tools[].input_schema`` instead of
``parameters``, a top-level ``system``. This module translates both ways, so validation, promotion,
repair, budget and metrics are the chat pipeline's own:

    Messages request --to_chat_body--> chat body (tools, history)   -> parse / admit / judge
    Messages answer  --to_chat_completion--> chat completion        -> judge
    re-ask (chat body + repair turns) --messages_request--> Messages request upstream
    judged chat answer --to_message--> Messages answer (the first answer's id; stop_reason true)

The repair builders work on the chat shape; ``messages_request`` turns their turns into Messages'
own: a failed structured call stays a ``tool_use`` answered by a ``tool_result`` with
``is_error: true`` and the diagnosis; a call whose arguments are not a JSON object (``input`` must
be one), a call written as text and an empty answer get a user text turn. For an upstream that
does not serve ``/v1/messages``, ``to_chat_body`` is also what goes upstream and
``from_chat_completion`` builds the Messages answer from the chat one. A structured output
(``output_config.format``, the beta's ``output_format``) becomes chat's ``response_format``, so
its answer is checked and re-asked as chat's is.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from repairproxy.errors import anthropic_error_body

__all__ = [
    "error_body",
    "from_chat_completion",
    "message_events",
    "messages_request",
    "thinking_blocks",
    "thinking_on",
    "to_chat_body",
    "to_chat_completion",
    "to_message",
    "with_system_instruction",
]

_STOP_TO_FINISH = {
    "tool_use": "tool_calls",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "pause_turn": "stop",
    "refusal": "content_filter",
}
_FINISH_TO_STOP = {"tool_calls": "tool_use", "length": "max_tokens", "content_filter": "refusal"}
# Blocks of an answer the pipeline does not judge; kept as they came (thinking before the text).
_KEPT_BLOCKS = frozenset({"thinking", "redacted_thinking"})
# Options that mean the same in both APIs (a translated request carries them over).
_SHARED_OPTIONS = ("temperature", "top_p", "top_k", "stream")


def error_body(status: int, message: str) -> dict[str, Any]:
    """An error in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``."""
    return anthropic_error_body(status, message)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(block.get("text", ""))
            for block in content
            if isinstance(block, Mapping) and block.get("type", "text") == "text"
        )
    return ""


def _arguments(value: Any) -> str:
    """A ``tool_use`` input as chat's argument string (a string input is kept as it was sent:
    a stream's ``input_json_delta`` pieces that do not parse are broken JSON, for the judge)."""
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return ""


def _input_of(arguments: Any) -> dict[str, Any] | None:
    """Chat's argument string as a ``tool_use`` input; None when it is not a JSON object."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not isinstance(arguments, str):
        return None
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


# --- requests ------------------------------------------------------------------------------------


def _chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Client tools as chat ``tools``; server tools (web search, bash, ...) have no
    ``input_schema`` and are not validated."""
    if not isinstance(tools, list):
        return None
    out = []
    for tool in tools:
        if not isinstance(tool, Mapping) or "input_schema" not in tool:
            continue
        if tool.get("type") not in (None, "custom"):
            continue
        function: dict[str, Any] = {"name": tool.get("name")}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        schema = tool.get("input_schema")
        function["parameters"] = schema if schema is not None else {"type": "object"}
        out.append({"type": "function", "function": function})
    return out


def _chat_tool_choice(choice: Any) -> Any:
    """Messages' ``tool_choice`` in chat's words (None: not said)."""
    if not isinstance(choice, Mapping):
        return None
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))


_THINKING = frozenset({"thinking", "redacted_thinking"})


def thinking_blocks(answer: Mapping[str, Any]) -> list[Any]:
    """An answer's ``thinking`` and ``redacted_thinking`` blocks, as they came."""
    content = answer.get("content")
    return [
        b
        for b in (content if isinstance(content, list) else ())
        if isinstance(b, Mapping) and b.get("type") in _THINKING
    ]


def thinking_on(request: Mapping[str, Any]) -> bool:
    """Whether a Messages request asks for extended thinking (``enabled`` or ``adaptive``)."""
    thinking = request.get("thinking")
    return isinstance(thinking, Mapping) and thinking.get("type") not in (None, "disabled")


def _messages_tool_choice(choice: Any, original: Any) -> Any:
    """Chat's ``tool_choice`` (a re-ask's, maybe escalated) in Messages' words, keeping the
    client's ``disable_parallel_tool_use``."""
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        out: dict[str, Any] = {"type": "tool", "name": choice["function"].get("name")}
    elif choice == "required":
        out = {"type": "any"}
    elif choice in ("auto", "none"):
        out = {"type": choice}
    else:
        return original
    parallel = original.get("disable_parallel_tool_use") if isinstance(original, Mapping) else None
    if parallel is not None and out["type"] != "none":
        out["disable_parallel_tool_use"] = parallel
    return out


def _tool_result_text(block: Mapping[str, Any]) -> str:
    """A ``tool_result`` as the text the budget reads. ``is_error: true`` is the flag τ²-bench's
    rule counts; the chat view spells it as τ²-bench's own ``Error:`` prefix, which the error
    detector's default table recognises."""
    text = _text_of(block.get("content"))
    if block.get("is_error") is True and not text.startswith("Error"):
        return f"Error: {text}" if text else "Error"
    return text


def _chat_messages(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One Messages turn as chat messages: tool results first (they answer the previous turn's
    calls), then the text; an assistant's ``tool_use`` blocks as ``tool_calls``."""
    role = message.get("role")
    content = message.get("content")
    blocks: list[Any] = (
        [{"type": "text", "text": content}]
        if isinstance(content, str)
        else list(content)
        if isinstance(content, list)
        else []
    )
    if role == "assistant":
        calls = [
            {
                "id": block.get("id"),
                "type": "function",
                "function": {
                    "name": block.get("name"),
                    "arguments": _arguments(block.get("input")),
                },
            }
            for block in blocks
            if isinstance(block, Mapping) and block.get("type") == "tool_use"
        ]
        turn: dict[str, Any] = {"role": "assistant", "content": _text_of(blocks) or None}
        if calls:
            turn["tool_calls"] = calls
        return [turn]
    out: list[dict[str, Any]] = [
        {
            "role": "tool",
            "tool_call_id": block.get("tool_use_id"),
            "content": _tool_result_text(block),
        }
        for block in blocks
        if isinstance(block, Mapping) and block.get("type") == "tool_result"
    ]
    text = _text_of(blocks)
    if text or not out:
        out.append({"role": "user", "content": text})
    return out


def _system_text(system: Any) -> str:
    return system if isinstance(system, str) else _text_of(system)


def to_chat_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat-completions view of a Messages request: model, history, tools, options (also
    what goes upstream when the upstream serves chat completions only)."""
    messages: list[dict[str, Any]] = []
    system = _system_text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for message in body.get("messages") or ():
        if isinstance(message, Mapping):
            messages.extend(_chat_messages(message))
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    tools = _chat_tools(body.get("tools"))
    if tools is not None:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    chat_choice = _chat_tool_choice(choice)
    if chat_choice is not None:
        chat["tool_choice"] = chat_choice
    if isinstance(choice, Mapping) and choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False
    if "max_tokens" in body:
        chat["max_tokens"] = body["max_tokens"]
    if isinstance(body.get("stop_sequences"), list):
        chat["stop"] = body["stop_sequences"]
    for key in _SHARED_OPTIONS:
        if key in body:
            chat[key] = body[key]
    response_format = _chat_response_format(body)
    if response_format is not None:
        chat["response_format"] = response_format
    return chat


def _chat_response_format(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """Messages' structured output as chat's ``response_format``: ``output_config.format``, or
    the beta's top-level ``output_format`` (both ``{"type": "json_schema", "schema": ...}``)."""
    config = body.get("output_config")
    spec = config.get("format") if isinstance(config, Mapping) else None
    if spec is None:
        spec = body.get("output_format")
    if not isinstance(spec, Mapping) or spec.get("type") != "json_schema":
        return None
    # chat's json_schema needs a name (vLLM refuses one without); Messages' has none.
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": spec.get("schema")}}


def with_system_instruction(body: Mapping[str, Any], instruction: str) -> dict[str, Any]:
    """A copy of a Messages request whose top-level ``system`` ends with ``instruction``."""
    current = body.get("system")
    if isinstance(current, list):
        if any(isinstance(b, Mapping) and instruction in str(b.get("text", "")) for b in current):
            return dict(body)
        return {**body, "system": [*current, {"type": "text", "text": instruction}]}
    if isinstance(current, str) and current:
        if instruction in current:
            return dict(body)
        return {**body, "system": f"{current}\n\n{instruction}"}
    return {**body, "system": instruction}


def _append(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Add blocks as a turn of ``role``, joining the previous turn when it has the same role
    (Messages alternates roles; tool results must open their user turn)."""
    if not blocks:
        return
    last = turns[-1] if turns else None
    if last is not None and last.get("role") == role:
        content = last.get("content")
        previous = (
            [{"type": "text", "text": content}]
            if isinstance(content, str)
            else list(content)
            if isinstance(content, list)
            else []
        )
        last["content"] = [*previous, *blocks]
    else:
        turns.append({"role": role, "content": blocks})


def from_chat_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages (the repair turns the pipeline appends) as Messages turns.

    A call whose arguments are not a JSON object cannot be a ``tool_use`` (``input`` is an
    object): it leaves the assistant turn, and its diagnosis becomes user text."""
    turns: list[dict[str, Any]] = []
    dropped: set[Any] = set()
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            blocks: list[dict[str, Any]] = []
            text = _text_of(message.get("content"))
            if text:
                blocks.append({"type": "text", "text": text})
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                value = _input_of(function.get("arguments"))
                if value is None:
                    dropped.add(call.get("id"))
                    continue
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.get("id"),
                        "name": function.get("name"),
                        "input": value,
                    }
                )
            if not blocks:  # an assistant turn must say something; the user turn explains
                blocks.append({"type": "text", "text": "(no valid tool call)"})
            _append(turns, "assistant", blocks)
        elif role == "tool" and message.get("tool_call_id") not in dropped:
            _append(turns, "user", [_tool_result(message)])
        else:
            text = _text_of(message.get("content"))
            _append(turns, "user", [{"type": "text", "text": text or "(empty)"}])
    return _results_first(turns)


def _tool_result(message: Mapping[str, Any]) -> dict[str, Any]:
    # The pipeline answers a kept valid sibling with the template's "valid_sibling" text and a
    # failed call with its diagnosis; only the failed ones are errors.
    content = _text_of(message.get("content"))
    return {
        "type": "tool_result",
        "tool_use_id": message.get("tool_call_id"),
        "content": content,
        "is_error": not message.get("kept", False),
    }


def _not_a_result(block: Any) -> bool:
    return not (isinstance(block, Mapping) and block.get("type") == "tool_result")


def _results_first(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for turn in turns:
        content = turn.get("content")
        if turn.get("role") == "user" and isinstance(content, list):
            turn["content"] = sorted(content, key=_not_a_result)
    return turns


def messages_request(
    forward: Mapping[str, Any],
    history_length: int,
    chat_body: Mapping[str, Any],
    valid_sibling: str | None = None,
    answers: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A re-ask as a Messages request: the forwarded request, its messages extended by the repair
    turns the chat loop appended after the first ``history_length`` chat messages.
    ``valid_sibling``: the template's text for a kept valid call (its result is no error).
    ``answers``: the Messages answers the repair turns repeat, in order: each repeated assistant
    turn starts with its answer's ``thinking`` / ``redacted_thinking`` blocks, unmodified (an
    API with extended thinking refuses a tool_use turn without them). While thinking is on, the
    re-ask never forces a tool (such an API refuses a forced ``tool_choice`` with thinking)."""
    request = dict(forward)
    repair = list(chat_body.get("messages") or ())[history_length:]
    if valid_sibling is not None:
        repair = [
            {**m, "kept": True}
            if m.get("role") == "tool" and _text_of(m.get("content")) == valid_sibling
            else m
            for m in repair
        ]
    turns = [dict(m) for m in forward.get("messages") or () if isinstance(m, Mapping)]
    repeated = iter(answers)
    for turn in from_chat_messages(repair):
        content = list(turn["content"])
        if turn["role"] == "assistant":
            answer = next(repeated, None)
            if answer is not None:
                thoughts = thinking_blocks(answer)
                rest = [b for b in content if b.get("type") not in _THINKING]
                content = [*thoughts, *rest]
        _append(turns, str(turn["role"]), content)
    request["messages"] = _results_first(turns)
    request["stream"] = False
    choice = _messages_tool_choice(chat_body.get("tool_choice"), forward.get("tool_choice"))
    thinking = thinking_on(forward) or any(thinking_blocks(a) for a in answers)
    if thinking and isinstance(choice, Mapping) and choice.get("type") in ("any", "tool"):
        choice = forward.get("tool_choice")  # never forced while thinking: the client's own
    if choice is not None:
        request["tool_choice"] = choice
    if "temperature" in chat_body:
        request["temperature"] = chat_body["temperature"]
    return request


# --- answers -------------------------------------------------------------------------------------


def to_chat_completion(message: Mapping[str, Any]) -> dict[str, Any]:
    """The chat-completion view of a Messages answer (choice 0 = its content blocks)."""
    content = message.get("content")
    blocks = [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []
    calls = [
        {
            "id": block.get("id"),
            "type": "function",
            "function": {"name": block.get("name"), "arguments": _arguments(block.get("input"))},
        }
        for block in blocks
        if block.get("type") == "tool_use"
    ]
    chat_message: dict[str, Any] = {"role": "assistant", "content": _text_of(blocks) or None}
    if calls:
        chat_message["tool_calls"] = calls
    usage = message.get("usage")
    chat_usage = None
    if isinstance(usage, Mapping):
        prompt = _count(usage.get("input_tokens"))
        completion = _count(usage.get("output_tokens"))
        chat_usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
    finish = _STOP_TO_FINISH.get(str(message.get("stop_reason")), "stop")
    return {
        "id": message.get("id"),
        "object": "chat.completion",
        "model": message.get("model"),
        "choices": [{"index": 0, "message": chat_message, "finish_reason": finish}],
        "usage": chat_usage,
    }


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _message_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


def _blocks_of(chat_message: Mapping[str, Any], originals: Mapping[Any, Any]) -> list[Any]:
    blocks: list[Any] = []
    text = _text_of(chat_message.get("content"))
    if text:
        blocks.append({"type": "text", "text": text})
    for call in chat_message.get("tool_calls") or ():
        function = call.get("function") or {}
        value = _input_of(function.get("arguments"))
        original = originals.get(call.get("id"))
        if value is None and isinstance(original, Mapping):
            value = original.get("input") if isinstance(original.get("input"), dict) else None
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{secrets.token_hex(12)}",
                "name": function.get("name"),
                "input": value if value is not None else {},
            }
        )
    return blocks


def _stop_reason(blocks: Sequence[Any], stated: Any) -> Any:
    """``tool_use`` exactly when the answer holds a call: a promoted call makes an ``end_turn``
    a ``tool_use``; a stripped one makes a ``tool_use`` an ``end_turn``."""
    if any(isinstance(b, Mapping) and b.get("type") == "tool_use" for b in blocks):
        return "tool_use"
    return "end_turn" if stated in (None, "tool_use") else stated


def _usage(chat_usage: Any, base: Any) -> dict[str, Any]:
    usage = dict(base) if isinstance(base, Mapping) else {}
    if isinstance(chat_usage, Mapping):
        usage["input_tokens"] = _count(chat_usage.get("prompt_tokens"))
        usage["output_tokens"] = _count(chat_usage.get("completion_tokens"))
    usage.setdefault("input_tokens", 0)
    usage.setdefault("output_tokens", 0)
    return usage


def to_message(answer: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """A judged chat answer as a Messages answer, built on the first upstream answer: its id
    (one message id across re-asks), its thinking blocks, usage summed over every attempt."""
    message = dict(base)
    choices = answer.get("choices") or [{}]
    chat_message = choices[0].get("message") or {}
    content = base.get("content")
    blocks = [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []
    kept: list[Any] = [b for b in blocks if b.get("type") in _KEPT_BLOCKS]
    originals = {b.get("id"): b for b in blocks if b.get("type") == "tool_use"}
    message["content"] = [*kept, *_blocks_of(chat_message, originals)]
    message["stop_reason"] = _stop_reason(message["content"], base.get("stop_reason"))
    if message["stop_reason"] != "stop_sequence":
        message["stop_sequence"] = None
    message["usage"] = _usage(answer.get("usage"), base.get("usage"))
    return message


def from_chat_completion(completion: Mapping[str, Any], model: Any) -> dict[str, Any]:
    """A chat completion (from an upstream without ``/v1/messages``) as a Messages answer."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], Mapping) else {}
    chat_message = choice.get("message") or {}
    blocks = _blocks_of(chat_message, {})
    finish = choice.get("finish_reason")
    stated = _FINISH_TO_STOP.get(str(finish), "end_turn")
    return {
        "id": _message_id(),
        "type": "message",
        "role": "assistant",
        "model": completion.get("model") or model,
        "content": blocks,
        "stop_reason": _stop_reason(blocks, stated),
        "stop_sequence": None,
        "usage": _usage(completion.get("usage"), None),
    }


def _block_start(block: Mapping[str, Any]) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": ""}
    if kind == "tool_use":
        return {**block, "input": {}}
    if kind == "thinking":
        return {"type": "thinking", "thinking": "", "signature": ""}
    return dict(block)


def _block_deltas(block: Mapping[str, Any]) -> list[dict[str, Any]]:
    kind = block.get("type")
    if kind == "text":
        return [{"type": "text_delta", "text": block.get("text", "")}]
    if kind == "tool_use":
        return [{"type": "input_json_delta", "partial_json": _arguments(block.get("input"))}]
    if kind == "thinking":
        deltas = [{"type": "thinking_delta", "thinking": block.get("thinking", "")}]
        if block.get("signature"):
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        return deltas
    return []


def message_events(
    message: Mapping[str, Any], *, first_block: int = 0, preamble: bool = True
) -> list[dict[str, Any]]:
    """A whole Messages answer as the event stream a streaming client parses: ``message_start``
    (unless ``preamble`` is false: it already went out), the blocks from ``first_block`` on (the
    earlier ones already streamed), ``message_delta`` with stop reason and usage, ``message_stop``.
    """
    events: list[dict[str, Any]] = []
    found = message.get("usage")
    usage: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    if preamble:
        started = {
            **message,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage, "output_tokens": 0},
        }
        events.append({"type": "message_start", "message": started})
        events.append({"type": "ping"})
    content = message.get("content")
    blocks = list(content) if isinstance(content, list) else []
    for index in range(first_block, len(blocks)):
        block = blocks[index]
        events.append(
            {"type": "content_block_start", "index": index, "content_block": _block_start(block)}
        )
        for delta in _block_deltas(block):
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {
                "stop_reason": message.get("stop_reason"),
                "stop_sequence": message.get("stop_sequence"),
            },
            "usage": dict(usage or {}),
        }
    )
    events.append({"type": "message_stop"})
    return events
