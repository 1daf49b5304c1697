"""The answers the server layer writes itself, before any route is known, and what counts them.

Each refusal (431, 408, 400, 417, 501, 503) is a whole HTTP/1.1 response that closes the
connection, with one JSON error body that OpenAI and Anthropic clients both read.
``LimitedProtocol`` (``server.py``) writes them and reports each to a ``RefusalCounter``
(``repairproxy_connections_refused_total{reason}``).
"""

from __future__ import annotations

from typing import Protocol

import orjson

__all__ = ["RefusalCounter"]


class RefusalCounter(Protocol):
    """What the protocol reports refusals to (``Metrics.connection_refused``)."""

    def connection_refused(self, reason: str) -> None: ...


def _refusal(status: bytes, kind: str, code: str, message: str) -> bytes:
    """A refusal written before any route is known, as a JSON error both API families read: the
    OpenAI shape (``error.message``, ``type``, ``code``) and Anthropic's (``"type": "error"``,
    ``error.type``, ``error.message``) in one body."""
    error = {"type": kind, "message": message, "code": code, "param": None}
    body = orjson.dumps({"type": "error", "error": error})
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode("ascii") + b"\r\nconnection: close\r\n\r\n"
    ) + body


_TOO_LARGE = _refusal(
    b"431 Request Header Fields Too Large",
    "invalid_request_error",
    "request_header_fields_too_large",
    "request line and headers too large",
)
_TIMEOUT = _refusal(
    b"408 Request Timeout",
    "invalid_request_error",
    "request_timeout",
    "request headers not received in time",
)
_BAD_REQUEST = _refusal(
    b"400 Bad Request", "invalid_request_error", "invalid_http_request", "invalid HTTP request"
)
_BODY_REFUSED = _refusal(
    b"400 Bad Request",
    "invalid_request_error",
    "body_not_allowed",
    "a GET or HEAD request may not carry a body",
)
_BODY_TIMEOUT = _refusal(
    b"408 Request Timeout",
    "invalid_request_error",
    "request_timeout",
    "request body not received in time",
)
_EXPECTATION = _refusal(
    b"417 Expectation Failed",
    "invalid_request_error",
    "expectation_failed",
    "only Expect: 100-continue is supported",
)
_NOT_IMPLEMENTED = _refusal(
    b"501 Not Implemented",
    "invalid_request_error",
    "unsupported_transfer_coding",
    "only Transfer-Encoding: chunked is supported",
)
_BUSY = _refusal(
    b"503 Service Unavailable",
    "overloaded_error",
    "too_many_connections",
    "too many open connections",
)
