"""A scripted Anthropic Messages API upstream: a real HTTP server on 127.0.0.1.

A test pushes the content blocks ``POST /v1/messages`` should answer with, in order (or an error
reply); the server wraps each in a message with a fresh id. ``"stream": true`` gets the event stream
the official ``anthropic`` SDK parses (``event:`` lines, a ping, text and ``input_json_delta``
split over several deltas). ``POST /v1/messages/count_tokens`` answers a fixed count. Every
request and its headers are recorded.

    with MessagesUpstream() as upstream:
        upstream.push([tool_use("get_order", {"order_id": "#W1"})])
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.support.loopback import LoopbackHandler, LoopbackUpstream, sse_event

__all__ = ["COUNTED_TOKENS", "MessagesUpstream", "text", "thinking", "tool_use"]

COUNTED_TOKENS = 42
_ids = itertools.count(1)


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def thinking(value: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": value, "signature": "sig-" + str(next(_ids))}


def tool_use(name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    """A ``tool_use`` block; a string ``arguments`` is streamed as it is (broken JSON when it
    does not parse; the non-streamed answer then carries it as a string input)."""
    return {"type": "tool_use", "id": f"toolu_{next(_ids):04d}", "name": name, "input": arguments}


def _message(content: list[dict[str, Any]], request: dict[str, Any]) -> dict[str, Any]:
    calls = any(block["type"] == "tool_use" for block in content)
    return {
        "id": f"msg_{next(_ids):04d}",
        "type": "message",
        "role": "assistant",
        "model": request.get("model", "scripted-model"),
        "content": content,
        "stop_reason": "tool_use" if calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 20, "output_tokens": 5},
    }


def _halves(value: str) -> list[str]:
    return [value[: len(value) // 2], value[len(value) // 2 :]] if value else []


def _events(message: dict[str, Any]) -> list[bytes]:
    out: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        payload = {"type": kind, **fields}
        out.append(sse_event(kind, payload))

    usage = message["usage"]
    started = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {**usage, "output_tokens": 1},
    }
    emit("message_start", message=started)
    emit("ping")
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            emit("content_block_start", index=index, content_block={"type": "text", "text": ""})
            for piece in _halves(block["text"]):
                emit(
                    "content_block_delta", index=index, delta={"type": "text_delta", "text": piece}
                )
        elif block["type"] == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            emit("content_block_start", index=index, content_block=start)
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
            emit("content_block_delta", index=index, delta=delta)
            delta = {"type": "signature_delta", "signature": block["signature"]}
            emit("content_block_delta", index=index, delta=delta)
        else:
            emit("content_block_start", index=index, content_block={**block, "input": {}})
            raw = block["input"]
            arguments = raw if isinstance(raw, str) else orjson.dumps(raw).decode()
            for piece in _halves(arguments):
                delta = {"type": "input_json_delta", "partial_json": piece}
                emit("content_block_delta", index=index, delta=delta)
        emit("content_block_stop", index=index)
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    emit("message_delta", delta=delta, usage={"output_tokens": usage["output_tokens"]})
    emit("message_stop")
    return out


def _error(message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


def _refusal(request: dict[str, Any], headers: dict[str, str]) -> dict[str, Any] | None:
    """What Anthropic's API refuses that a proxy could get wrong: with extended thinking on, an
    assistant turn holding ``tool_use`` that does not start with a thinking block, and a
    forced ``tool_choice``; and (this upstream keeps no threads) a ``thread`` field or the
    threads beta, which the proxy must never forward."""
    if "thread" in request or "message-threads-" in headers.get("anthropic-beta", ""):
        return _error("this upstream keeps no threads: the proxy forwarded `thread`")
    thinking = request.get("thinking")
    if not (isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")):
        return None
    choice = request.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") in ("any", "tool"):
        return _error("Thinking may not be enabled when tool_choice forces tool use.")
    for index, message in enumerate(request.get("messages") or ()):
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        content = message.get("content")
        if not isinstance(content, list):
            continue
        kinds = [b.get("type") for b in content if isinstance(b, dict)]
        if "tool_use" in kinds and kinds[0] not in ("thinking", "redacted_thinking"):
            return _error(
                f"messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, "
                f"but found `{kinds[0]}`. When `thinking` is enabled, a final `assistant` "
                "message must start with a thinking block."
            )
    return None


@dataclass
class _State:
    script: list[Any] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)  # ids of the messages answered
    delay: float = 0.0  # seconds before each answer (a slow re-ask)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(LoopbackHandler):
    def do_POST(self) -> None:
        request = self.read_json()
        state: _State = self.server.state
        with state.lock:
            state.requests.append(request)
            state.headers.append({k.lower(): v for k, v in self.headers.items()})
            state.paths.append(self.path)
            if self.path.startswith("/v1/messages/count_tokens"):
                self.send_json(200, {"input_tokens": COUNTED_TOKENS})
                return
            if not self.path.startswith("/v1/messages"):
                self.send_json(404, {"detail": "Not Found"})
                return
            refusal = _refusal(request, {k.lower(): v for k, v in self.headers.items()})
            if refusal is not None:  # refused as Anthropic's API refuses it; the script waits
                self.send_json(400, refusal)
                return
            scripted = state.script.pop(0) if state.script else [text("script exhausted")]
            delay = state.delay if len(state.requests) > 1 else 0.0
        if delay:
            time.sleep(delay)
        if isinstance(scripted, tuple):  # (status, body): an error answer
            self.send_json(*scripted)
            return
        message = _message(scripted, request)
        with state.lock:
            state.answered.append(message["id"])
        if request.get("stream"):
            self.send_stream(_events(message))
        else:
            self.send_json(200, message)


class MessagesUpstream(LoopbackUpstream["_State"]):
    """Starts on construction; leave the ``with`` block to stop."""

    def __init__(self) -> None:
        super().__init__(_Handler, _State())

    def push(self, *answers: list[dict[str, Any]]) -> None:
        with self.state.lock:
            self.state.script.extend(answers)

    def slow_re_asks(self, seconds: float) -> None:
        """Every request after the first waits ``seconds`` before it is answered."""
        with self.state.lock:
            self.state.delay = seconds

    def push_error(self, status: int, body: Any) -> None:
        with self.state.lock:
            self.state.script.append((status, body))

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return list(self.state.requests)

    @property
    def headers(self) -> list[dict[str, str]]:
        with self.state.lock:
            return list(self.state.headers)

    @property
    def answered(self) -> list[str]:
        with self.state.lock:
            return list(self.state.answered)

    @property
    def paths(self) -> list[str]:
        with self.state.lock:
            return list(self.state.paths)
