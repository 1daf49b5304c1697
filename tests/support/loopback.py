"""The plumbing the scripted API upstreams share (``messages_upstream``, ``responses_upstream``):
a threaded stdlib HTTP server on 127.0.0.1, JSON answers, chunked event streams, and the bytes of
one SSE event; each upstream adds only its script and its API's shapes.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, Self, TypeVar

import orjson

__all__ = ["LoopbackHandler", "LoopbackUpstream", "sse_event"]

_State = TypeVar("_State")


def sse_event(kind: str, payload: Any) -> bytes:
    """One event as the OpenAI and Anthropic SDKs parse it: its ``event:`` line, then data."""
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    state: Any


class LoopbackHandler(BaseHTTPRequestHandler):
    """A quiet HTTP/1.1 handler that answers in JSON or as a chunked event stream."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def read_json(self) -> Any:
        length = int(self.headers.get("content-length") or 0)
        return orjson.loads(self.rfile.read(length) or b"{}")

    def send_json(self, status: int, body: Any) -> None:
        payload = orjson.dumps(body)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def send_stream(self, events: list[bytes]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in events:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")


class LoopbackUpstream(Generic[_State]):
    """Serves ``handler`` on a free port from construction; leave the ``with`` block to stop.
    ``state`` is what the handler reads as ``self.server.state``."""

    def __init__(self, handler: type[LoopbackHandler], state: _State) -> None:
        self._server = _Server(("127.0.0.1", 0), handler)
        self._server.state = state
        self.state = state
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
