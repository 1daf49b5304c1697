"""``POST /v1/responses`` through the chat pipeline: an adapter, not a second copy.

The Responses API (the OpenAI Agents SDK's and pydantic-ai's default, served by recent vLLM)
carries the same tool calls in another shape: ``function_call`` output items instead of
``tool_calls``, ``function_call_output`` input items instead of ``role: tool`` messages,
``instructions`` instead of a system message. This module translates both ways, so validation,
promotion, repair, budget and metrics are the chat pipeline's own:

    Responses request --to_chat_body--> chat body (tools, history)  -> parse / admit / judge
    Responses answer  --to_chat_completion--> chat completion       -> judge
    re-ask (chat body + repair turns) --responses_request--> Responses request upstream
    judged chat answer --to_response--> Responses answer (the id of the upstream response it
                                        came from, so ``previous_response_id`` keeps working)

``previous_response_id`` chains are the proxy's own (``episodes/responses_store.py``): the
routes rebuild the whole input from what was delivered, so the adapter only ever sees whole
conversations. For upstreams that serve chat completions only, ``from_chat_completion`` turns
a judged chat answer into a Responses object, and ``response_events`` streams it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Container, Mapping, Sequence
from typing import Any

__all__ = [
    "from_chat_completion",
    "from_chat_messages",
    "message_item",
    "message_item_closed",
    "message_item_opened",
    "new_item_id",
    "new_response_id",
    "output_text_delta",
    "reasoning_items",
    "reasoning_on",
    "response_events",
    "responses_request",
    "to_chat_body",
    "to_chat_completion",
    "to_response",
]

_TEXT_PARTS = ("input_text", "output_text", "text")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type", "text") in _TEXT_PARTS
        )
    return ""


def _chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Function tools as chat ``tools``; built-in tools (web search, ...) are not validated."""
    if not isinstance(tools, list):
        return None
    out = []
    for tool in tools:
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            continue
        function: dict[str, Any] = {"name": tool.get("name")}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        parameters = tool.get("parameters")
        function["parameters"] = parameters if parameters is not None else {"type": "object"}
        out.append({"type": "function", "function": function})
    return out


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _responses_tool_choice(choice: Any) -> Any:
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        return {"type": "function", "name": choice["function"].get("name")}
    return choice


def _messages_of(items: Any) -> list[dict[str, Any]]:
    """Responses input items as chat messages (the history the pipeline reads)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role", "user")
            # "developer" is the Responses name of the system role (chat servers know "system").
            role = "system" if role == "developer" else role
            messages.append({"role": role, "content": _text_of(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            # One assistant turn: its text and the calls after it are one chat message, as the
            # answer was when the proxy delivered it (so the conversation chain recognises it).
            last = messages[-1] if messages else None
            if last is not None and last.get("role") == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            elif last is not None and last.get("role") == "assistant":
                last["tool_calls"] = [call]
                last["content"] = last.get("content") or None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": output if isinstance(output, str) else _text_of(output),
                }
            )
    return messages


def to_chat_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat-completions view of a Responses request: model, history, tools, options."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    messages.extend(_messages_of(body.get("input")))
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    tools = _chat_tools(body.get("tools"))
    if tools is not None:
        chat["tools"] = tools
    for key in ("tool_choice", "temperature", "top_p", "stream", "parallel_tool_calls"):
        if key in body:
            chat[key] = _chat_tool_choice(body[key]) if key == "tool_choice" else body[key]
    if isinstance(body.get("max_output_tokens"), int):
        chat["max_tokens"] = body["max_output_tokens"]
    response_format = _chat_response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    return chat


def _chat_response_format(text: Any) -> dict[str, Any] | None:
    """``text.format`` (flat: type, name, schema, strict) as chat's ``response_format``."""
    spec = text.get("format") if isinstance(text, Mapping) else None
    if not isinstance(spec, Mapping) or spec.get("type") not in ("json_schema", "json_object"):
        return None
    if spec["type"] == "json_object":
        return {"type": "json_object"}
    inner = {k: spec[k] for k in ("name", "schema", "strict", "description") if k in spec}
    return {"type": "json_schema", "json_schema": inner}


def from_chat_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages (the repair turns the pipeline appends) as Responses input items."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id"),
                    "output": _text_of(message.get("content")),
                }
            )
            continue
        text = _text_of(message.get("content"))
        if text or role != "assistant":
            items.append({"type": "message", "role": role or "user", "content": text})
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.get("id"),
                    "name": function.get("name"),
                    "arguments": function.get("arguments", ""),
                }
            )
    return items


def reasoning_items(response: Mapping[str, Any]) -> list[Any]:
    """A Responses answer's ``reasoning`` items as they came (``encrypted_content`` included)."""
    output = response.get("output")
    return [
        item
        for item in (output if isinstance(output, list) else ())
        if isinstance(item, Mapping) and item.get("type") == "reasoning"
    ]


def reasoning_on(request: Mapping[str, Any]) -> bool:
    """Whether a Responses request asks for reasoning (an ``effort`` other than ``none``)."""
    reasoning = request.get("reasoning")
    return isinstance(reasoning, Mapping) and reasoning.get("effort") not in (None, "none")


def responses_request(
    forward: Mapping[str, Any],
    history_length: int,
    chat_body: Mapping[str, Any],
    answers: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A re-ask as a Responses request: the forwarded request, its input extended by the repair
    turns the chat loop appended after the first ``history_length`` messages. ``answers``: the
    Responses answers the repair turns repeat, in order: each repeated assistant turn is
    preceded by its answer's ``reasoning`` items, unmodified (``encrypted_content`` too). With
    reasoning on, the re-ask never forces a tool call."""
    request = dict(forward)
    original = forward.get("input")
    items: list[Any] = (
        [{"type": "message", "role": "user", "content": original}]
        if isinstance(original, str)
        else list(original or ())
    )
    repeated = iter(answers)
    for message in list(chat_body.get("messages") or ())[history_length:]:
        if message.get("role") == "assistant":
            answer = next(repeated, None)
            if answer is not None:
                items.extend(reasoning_items(answer))
        items.extend(from_chat_messages([message]))
    request["input"] = items
    request["stream"] = False
    reasoning = reasoning_on(forward) or any(reasoning_items(a) for a in answers)
    if "tool_choice" in chat_body:
        choice = _responses_tool_choice(chat_body["tool_choice"])
        forced = choice == "required" or (
            isinstance(choice, Mapping) and choice.get("type") == "function"
        )
        if not (reasoning and forced):
            request["tool_choice"] = choice
    if "temperature" in chat_body:
        request["temperature"] = chat_body["temperature"]
    return request


def to_chat_completion(response: Mapping[str, Any]) -> dict[str, Any]:
    """The chat-completion view of a Responses answer (choice 0 = the output items)."""
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in response.get("output") or ():
        if not isinstance(item, Mapping):
            continue
        if item.get("type") == "message":
            text.append(_text_of(item.get("content")))
        elif item.get("type") == "function_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = calls
    usage = response.get("usage")
    chat_usage = None
    if isinstance(usage, Mapping):
        chat_usage = {
            "prompt_tokens": usage.get("input_tokens", 0),
            "completion_tokens": usage.get("output_tokens", 0),
            "total_tokens": usage.get("total_tokens", 0),
        }
    return {
        "id": response.get("id"),
        "object": "chat.completion",
        "model": response.get("model"),
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": chat_usage,
    }


def new_item_id(prefix: str) -> str:
    """An output item id of the proxy's own (``msg``, ``fc``, ``call``)."""
    return f"{prefix}_{secrets.token_hex(12)}"


_item_id = new_item_id


def new_response_id() -> str:
    """A response id of the proxy's own (an answer it changed, or one it translated)."""
    return f"resp_{secrets.token_hex(24)}"


def from_chat_completion(
    completion: Mapping[str, Any], request: Mapping[str, Any], response_id: str
) -> dict[str, Any]:
    """A chat completion (from a chat-only upstream, judged) as the Responses answer to
    ``request``: the request's echoed fields, the message and function-call items, usage."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], Mapping) else {}
    message = dict(choice.get("message") or {})
    calls = []
    for call in message.get("tool_calls") or ():
        if isinstance(call, Mapping):
            call_id = call.get("id")
            calls.append({**call, "id": call_id if isinstance(call_id, str) else _item_id("call")})
    if calls:
        message["tool_calls"] = calls
    answer = {**completion, "choices": [{**choice, "message": message}]}
    raw_usage = completion.get("usage")
    usage: Mapping[str, Any] = raw_usage if isinstance(raw_usage, Mapping) else {}
    created = completion.get("created")
    base: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created if isinstance(created, int) else int(time.time()),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "metadata": request.get("metadata") or {},
        "model": completion.get("model") or request.get("model"),
        "output": [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": request.get("previous_response_id"),
        "store": request.get("store", True),
        "temperature": request.get("temperature"),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage.get("completion_tokens", 0),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.get("total_tokens", 0),
        },
    }
    response = to_response(answer, base)
    if choice.get("finish_reason") == "length":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    return response


def to_response(answer: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """A judged chat answer as a Responses answer, built on the upstream response it came from:
    non-message items (reasoning) kept, message and function-call items from the answer."""
    response = dict(base)
    choices = answer.get("choices") or [{}]
    message = choices[0].get("message") or {}
    kept = [
        item
        for item in base.get("output") or ()
        if isinstance(item, Mapping) and item.get("type") not in ("message", "function_call")
    ]
    originals = {
        item.get("call_id"): item
        for item in base.get("output") or ()
        if isinstance(item, Mapping) and item.get("type") == "function_call"
    }
    output: list[Any] = list(kept)
    text = _text_of(message.get("content"))
    if text:
        output.append(
            {
                "type": "message",
                "id": _item_id("msg"),
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        original = originals.get(call.get("id"))
        output.append(
            {
                "type": "function_call",
                "id": original.get("id") if original else _item_id("fc"),
                "call_id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments", ""),
                "status": "completed",
            }
        )
    response["output"] = output
    usage = answer.get("usage")
    if isinstance(usage, Mapping) and isinstance(base.get("usage"), Mapping):
        response["usage"] = {
            **base["usage"],
            "input_tokens": usage.get("prompt_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0),
            "total_tokens": usage.get("total_tokens", 0),
        }
    return response


def response_events(
    response: Mapping[str, Any], first_sequence: int = 0, *, skip: Container[int] = ()
) -> list[dict[str, Any]]:
    """A whole Responses answer as the event stream a streaming client parses (``skip``: the
    output indices whose events already went out), ending with its terminal event
    (``response.completed``, or ``response.incomplete`` for an answer cut short)."""
    events: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": first_sequence + len(events), **fields})

    started = {**response, "status": "in_progress", "output": []}
    emit("response.created", response=started)
    emit("response.in_progress", response=started)
    for index, item in enumerate(response.get("output") or ()):
        if index in skip:
            continue
        if item.get("type") == "message" and len(item.get("content") or ()) == 1:
            text = str(item["content"][0].get("text", ""))
            for event in (
                *message_item_opened(item, index),
                output_text_delta(item, index, text),
                *message_item_closed(item, index),
            ):
                events.append({**event, "sequence_number": first_sequence + len(events)})
            continue
        if item.get("type") == "message":
            emit("response.output_item.added", output_index=index, item={**item, "content": []})
            for part_index, part in enumerate(item.get("content") or ()):
                empty = {**part, "text": ""}
                ids = {"item_id": item.get("id"), "output_index": index}
                emit("response.content_part.added", content_index=part_index, part=empty, **ids)
                text = part.get("text", "")
                emit("response.output_text.delta", content_index=part_index, delta=text, **ids)
                emit("response.output_text.done", content_index=part_index, text=text, **ids)
                emit("response.content_part.done", content_index=part_index, part=part, **ids)
        elif item.get("type") == "function_call":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            ids = {"item_id": item.get("id"), "output_index": index}
            arguments = item.get("arguments", "")
            emit("response.function_call_arguments.delta", delta=arguments, **ids)
            emit("response.function_call_arguments.done", arguments=arguments, **ids)
        else:
            emit("response.output_item.added", output_index=index, item=item)
        emit("response.output_item.done", output_index=index, item=item)
    incomplete = response.get("status") == "incomplete"
    emit("response.incomplete" if incomplete else "response.completed", response=dict(response))
    return events


# -- one assistant message item, streamed as its text arrives -------------------------------------


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    """An assistant message output item with one ``output_text`` part."""
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [part],
    }


def message_item_opened(item: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
    """The events that open a message item and its one text part (no sequence numbers)."""
    part = {"type": "output_text", "text": "", "annotations": []}
    ids = {"item_id": item.get("id"), "output_index": index}
    added = {**item, "status": "in_progress", "content": []}
    return [
        {"type": "response.output_item.added", "output_index": index, "item": added},
        {"type": "response.content_part.added", "content_index": 0, "part": part, **ids},
    ]


def output_text_delta(item: Mapping[str, Any], index: int, delta: str) -> dict[str, Any]:
    """One piece of a message item's text (no sequence number)."""
    return {
        "type": "response.output_text.delta",
        "item_id": item.get("id"),
        "output_index": index,
        "content_index": 0,
        "delta": delta,
    }


def message_item_closed(item: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
    """The events that close a message item whose whole text (``item``'s) was streamed."""
    content = item.get("content") or [{}]
    part = content[0]
    ids = {"item_id": item.get("id"), "output_index": index}
    text = part.get("text", "")
    return [
        {"type": "response.output_text.done", "content_index": 0, "text": text, **ids},
        {"type": "response.content_part.done", "content_index": 0, "part": part, **ids},
        {"type": "response.output_item.done", "output_index": index, "item": dict(item)},
    ]
