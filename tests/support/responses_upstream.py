"""A scripted OpenAI Responses API upstream: a real HTTP server on 127.0.0.1.

A test pushes the output items ``POST /v1/responses`` should answer with, in order; the server
wraps each in a response object with a fresh id, stores it (``store`` defaults to true, as
OpenAI's does) and answers ``previous_response_id`` only for ids it stored (400 otherwise, as
OpenAI and vLLM do). Like OpenAI, it refuses a ``function_call_output`` whose ``call_id`` no
``function_call`` earlier in the conversation (stored chain + input) carries: 400 ``No tool call
found for function call output with call_id ...``. ``"stream": true`` gets the event stream
the official SDK parses (text and arguments split over several deltas). Every request is recorded.

    with ResponsesUpstream() as upstream:
        upstream.push([function_call("get_order", {"order_id": "#W1"})])
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.support.loopback import LoopbackHandler, LoopbackUpstream, sse_event

__all__ = ["ResponsesUpstream", "function_call", "message"]

_ids = itertools.count(1)


def message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{next(_ids)}",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call(name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    n = next(_ids)
    return {
        "type": "function_call",
        "id": f"fc_{n}",
        "call_id": f"call_{n}",
        "name": name,
        "arguments": args,
        "status": "completed",
    }


def _response(output: list[dict[str, Any]], request: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"resp_{next(_ids)}",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "model": request.get("model", "scripted-model"),
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools", []),
        "previous_response_id": request.get("previous_response_id"),
        "instructions": request.get("instructions"),  # echoed, as OpenAI does
        "usage": {
            "input_tokens": 20,
            "output_tokens": 5,
            "total_tokens": 25,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def _events(response: dict[str, Any], terminal: str = "response.completed") -> list[bytes]:
    out: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        payload = {"type": kind, "sequence_number": len(out), **fields}
        out.append(sse_event(kind, payload))

    pending = {**response, "status": "in_progress", "output": []}
    emit("response.created", response=pending)
    emit("response.in_progress", response=pending)
    for index, item in enumerate(response["output"]):
        ids = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            emit("response.output_item.added", output_index=index, item={**item, "content": []})
            text = item["content"][0]["text"]
            part = {"type": "output_text", "text": "", "annotations": []}
            emit("response.content_part.added", content_index=0, part=part, **ids)
            for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
                emit("response.output_text.delta", content_index=0, delta=piece, **ids)
            emit("response.output_text.done", content_index=0, text=text, **ids)
            emit("response.content_part.done", content_index=0, part={**part, "text": text}, **ids)
        else:
            added = {**item, "arguments": "", "status": "in_progress"}
            emit("response.output_item.added", output_index=index, item=added)
            args = item["arguments"]
            for piece in (args[: len(args) // 2], args[len(args) // 2 :]):
                emit("response.function_call_arguments.delta", delta=piece, **ids)
            emit("response.function_call_arguments.done", arguments=args, **ids)
        emit("response.output_item.done", output_index=index, item=item)
    if terminal != "response.completed":
        response = {**response, "status": terminal.removeprefix("response.")}
    emit(terminal, response=response)
    return out


def _unanswerable_call_id(items: list[Any]) -> str | None:
    """The first function_call_output whose call_id no earlier function_call carries."""
    seen: set[Any] = set()
    for item in items:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            seen.add(item.get("call_id"))
        elif item.get("type") == "function_call_output" and item.get("call_id") not in seen:
            return str(item.get("call_id"))
    return None


@dataclass
class _State:
    script: list[list[dict[str, Any]]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    stored: dict[str, dict[str, Any]] = field(default_factory=dict)
    histories: dict[str, list[Any]] = field(default_factory=dict)  # id -> chain items
    terminals: list[str] = field(default_factory=list)  # the next streams' last event types
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(LoopbackHandler):
    def do_GET(self) -> None:
        models = [{"id": "scripted-model", "object": "model"}]
        self.send_json(200, {"object": "list", "data": models})

    def do_POST(self) -> None:
        request = self.read_json()
        state: _State = self.server.state
        with state.lock:
            state.requests.append(request)
            state.headers.append({k.lower(): v for k, v in self.headers.items()})
            previous = request.get("previous_response_id")
            if previous is not None and previous not in state.stored:
                error = {"message": f"Previous response with id '{previous}' not found."}
                self.send_json(400, {"error": {**error, "type": "invalid_request_error"}})
                return
            raw_input = request.get("input")
            items = (
                [{"type": "message", "role": "user", "content": raw_input}]
                if isinstance(raw_input, str)
                else list(raw_input or [])
            )
            history = [*state.histories.get(previous, []), *items]
            unknown = _unanswerable_call_id(history)
            if unknown is not None:
                error = {
                    "message": f"No tool call found for function call output with call_id "
                    f"{unknown}.",
                    "type": "invalid_request_error",
                    "param": "input",
                }
                self.send_json(400, {"error": error})
                return
            output = state.script.pop(0) if state.script else [message("script exhausted")]
            response = _response(output, request)
            if request.get("store", True):
                state.stored[response["id"]] = response
                state.histories[response["id"]] = [*history, *output]
        if request.get("stream"):
            with state.lock:
                terminal = state.terminals.pop(0) if state.terminals else "response.completed"
            self.send_stream(_events(response, terminal))
        else:
            self.send_json(200, response)


class ResponsesUpstream(LoopbackUpstream["_State"]):
    """Starts on construction; leave the ``with`` block to stop."""

    def __init__(self) -> None:
        super().__init__(_Handler, _State())

    def push(self, *outputs: list[dict[str, Any]]) -> None:
        with self.state.lock:
            self.state.script.extend(outputs)

    def end_stream_with(self, terminal: str) -> None:
        """The next streamed answer ends with ``terminal`` (``response.incomplete``, ...)."""
        with self.state.lock:
            self.state.terminals.append(terminal)

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return list(self.state.requests)

    @property
    def stored_ids(self) -> set[str]:
        with self.state.lock:
            return set(self.state.stored)
