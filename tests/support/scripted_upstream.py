"""A scripted OpenAI-compatible upstream: a real HTTP server on 127.0.0.1 that plays chosen answers.

A test pushes the answers ``POST /v1/chat/completions`` should return, in order, and reads back
every request the server received. A scripted ``completion(...)`` is served as JSON, or as an SSE
stream (content and tool-call arguments split into several deltas, usage chunk when asked) when
the request says ``"stream": true``. ``GET /v1/models`` always answers; any other path echoes
what it received.

    with ScriptedUpstream() as upstream:
        upstream.push(completion(tool_calls=[tool_call("get_order", {"order_id": "#W1"})]))
        client = openai.OpenAI(base_url=upstream.base_url, api_key="x")
        ...
        assert upstream.chat_requests[0]["tools"]
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

__all__ = [
    "RecordedRequest",
    "Reply",
    "ScriptedUpstream",
    "completion",
    "error_reply",
    "tool_call",
]

_ids = itertools.count(1)


@dataclass(frozen=True)
class Reply:
    """One scripted answer. ``fault="close"`` drops the connection without answering."""

    status: int = 200
    body: Any = None
    raw: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0
    fault: str | None = None
    # Seconds to sleep between SSE events when streamed (lets a test disconnect mid-stream).
    event_delay: float = 0.0


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


def tool_call(
    name: str, arguments: str | dict[str, Any], call_id: str | None = None
) -> dict[str, Any]:
    """A tool call as the upstream returns it; dict arguments JSON-encoded, strings kept as is."""
    args = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    return {
        "id": call_id or f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def completion(
    *,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    usage: dict[str, int] | None = None,
    model: str = "scripted-model",
    extra: dict[str, Any] | None = None,
    **reply_options: Any,
) -> Reply:
    """A ``chat.completion`` answer holding one assistant message."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body = {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "system_fingerprint": "fp_scripted",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
            }
        ],
        "usage": usage or {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        **(extra or {}),
    }
    return Reply(body=body, **reply_options)


def error_reply(status: int, message: str, error_type: str = "invalid_request_error") -> Reply:
    return Reply(
        status=status,
        body={"error": {"message": message, "type": error_type, "param": None, "code": None}},
    )


def _split(text: str, parts: int) -> list[str]:
    if not text:
        return []
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


def sse_events(body: dict[str, Any], include_usage: bool) -> list[bytes]:
    """A completion rendered as the chunk stream an OpenAI-compatible server would send."""
    base = {k: body[k] for k in ("id", "created", "model", "system_fingerprint")}
    base["object"] = "chat.completion.chunk"
    choice = body["choices"][0]
    message = choice["message"]

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {
            **base,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    events = [event({"role": "assistant", "content": ""})]
    events += [event({"content": piece}) for piece in _split(message.get("content") or "", 3)]
    for index, call in enumerate(message.get("tool_calls") or ()):
        function = call["function"]
        head = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": function["name"], "arguments": ""},
        }
        events.append(event({"tool_calls": [head]}))
        for piece in _split(function["arguments"], 3):
            events.append(
                event({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    events.append(event({}, choice["finish_reason"]))
    if include_usage:
        events.append(
            b"data: " + orjson.dumps({**base, "choices": [], "usage": body["usage"]}) + b"\n\n"
        )
    events.append(b"data: [DONE]\n\n")
    return events


@dataclass
class _State:
    script: deque[Reply] = field(default_factory=deque)
    requests: list[RecordedRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    connections: set[socket.socket] = field(default_factory=set)
    aborted_streams: int = 0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes; no 40 ms ACK stalls
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.state.lock:
            self.server.state.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.state.lock:
            self.server.state.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _handle(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path
        recorded = RecordedRequest(
            self.command, path, {k.lower(): v for k, v in self.headers.items()}, body
        )
        state = self.server.state
        with state.lock:
            state.requests.append(recorded)
        if path.startswith("/v1/chat/completions"):
            with state.lock:
                reply = (
                    state.script.popleft() if state.script else error_reply(500, "script exhausted")
                )
            self._play(reply, body)
        elif path.startswith("/v1/models"):
            self._send_json(
                200, {"object": "list", "data": [{"id": "scripted-model", "object": "model"}]}
            )
        else:
            echo = {"method": self.command, "path": path, "body": body.decode("utf-8", "replace")}
            self._send_json(200, echo)

    def _play(self, reply: Reply, request_body: bytes) -> None:
        if reply.delay:
            time.sleep(reply.delay)
        if reply.fault == "close":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        try:
            request = orjson.loads(request_body)
        except orjson.JSONDecodeError:
            request = {}
        wants_stream = isinstance(request, dict) and request.get("stream") is True
        if (
            wants_stream
            and reply.status == 200
            and isinstance(reply.body, dict)
            and reply.raw is None
        ):
            include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
            self._send_stream(sse_events(reply.body, include_usage), reply.event_delay)
            return
        payload = reply.raw if reply.raw is not None else orjson.dumps(reply.body)
        self._send_bytes(reply.status, payload, reply.headers)

    def _send_json(self, status: int, body: Any) -> None:
        self._send_bytes(status, orjson.dumps(body), ())

    def _send_bytes(
        self, status: int, payload: bytes, headers: tuple[tuple[str, str], ...]
    ) -> None:
        self.send_response(status)
        names = {name.lower() for name, _ in headers}
        if "content-type" not in names:
            self.send_header("Content-Type", "application/json")
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        try:
            self.end_headers()
            self.wfile.write(payload)
        except OSError:  # the proxy gave up on us (timeout tests)
            self.close_connection = True

    def _send_stream(self, events: list[bytes], event_delay: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in events:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                if event_delay:
                    time.sleep(event_delay)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the proxy closed the upstream request (client disconnect tests)
            self.close_connection = True
            with self.server.state.lock:
                self.server.state.aborted_streams += 1


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    state: _State


class ScriptedUpstream:
    """Start on construction; ``close()`` (or leave the ``with`` block) to stop."""

    def __init__(self) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.state = _State()
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def push(self, *replies: Reply) -> None:
        with self._server.state.lock:
            self._server.state.script.extend(replies)

    @property
    def pending(self) -> int:
        return len(self._server.state.script)

    @property
    def aborted_streams(self) -> int:
        """Streams the reader hung up on before their end."""
        return self._server.state.aborted_streams

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._server.state.lock:
            return list(self._server.state.requests)

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """Bodies of the chat-completion requests received, in order."""
        return [r.json() for r in self.requests if r.path.startswith("/v1/chat/completions")]

    def close(self) -> None:
        self._server.shutdown()
        with self._server.state.lock:
            open_connections = list(self._server.state.connections)
        for connection in open_connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ScriptedUpstream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
