"""Limits uvicorn does not have, held at the HTTP protocol before the app sees a byte.

uvicorn's httptools protocol hands every byte a client sends to the parser, and httptools keeps a
header's name and value until the header ends: one unauthenticated 48 MiB header is buffered
whole (twice: the parser's copy and the scope's), and a connection that never finishes its headers
is held forever (with the fd limit at 128, 150 such sockets starve ``/healthz``).
``LimitedProtocol`` subclasses that protocol and adds, per connection:

- **header bytes**: the request line and headers of one request may take ``--max-header-bytes``
  (default 64 KiB); the parser is fed at most that many bytes before the headers end, so what it
  holds is bounded, and the client gets ``431`` and a closed connection (each refusal's body is
  one JSON error that OpenAI and Anthropic clients both read). (A pipelined request that
  starts in the same read as the previous one's end may carry one read, <= 256 KiB, uncounted.)
- **header-read timeout**: from the first byte of a request (or the connection's start) its headers
  must arrive within ``--header-timeout`` seconds, else ``408`` (or a silent close if nothing came).
- **connections**: beyond ``--max-client-connections`` open connections, a new one is answered
  ``503`` at once and closed, before it can hold a file descriptor for long.

Heads are read as h11 reads them wherever llhttp is stricter and h11's reading is unambiguous
(``server_framing.py``); the request and its answer run through ``_Cycle``, uvicorn's
``RequestResponseCycle`` written lean (``server_cycle.py``). The refusals' bytes are in
``server_refusals.py``, and the descriptor limit is fitted at start-up in ``server_limits.py``.
This module holds the protocol and ``server_options``, and re-exports the names the rest imports.

Idle keep-alive connections close after ``--keep-alive-timeout`` (uvicorn's timer, armed once
per connection rather than once per request). Each refusal
is counted in ``repairproxy_connections_refused_total{reason}``. The limits are read from the app's
Settings (the protocol finds the app below uvicorn's wrappers), so ``--workers`` needs no extra
plumbing. Without httptools, uvicorn's h11 protocol runs with ``h11_max_incomplete_event_size`` set
to the same header cap (h11 answers such a request 400, not 431).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, cast
from urllib.parse import unquote

import httptools
from uvicorn.protocols.http.flow_control import (
    HIGH_WATER_LIMIT,
    FlowControl,
    service_unavailable,
)
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from repairproxy.asgi.responder import DISCONNECT_EXTENSION, RESPONSE_EXTENSION
from repairproxy.coalesce import CoalescingTransport
from repairproxy.server_cycle import _Cycle
from repairproxy.server_cycle import bad_header_name as bad_header_name
from repairproxy.server_cycle import bad_header_value as bad_header_value
from repairproxy.server_framing import _BLANK_LINE, _lenient, head_start, normalise_head
from repairproxy.server_limits import fit_descriptors
from repairproxy.server_refusals import (
    _BAD_REQUEST,
    _BODY_REFUSED,
    _BODY_TIMEOUT,
    _BUSY,
    _EXPECTATION,
    _NOT_IMPLEMENTED,
    _TIMEOUT,
    _TOO_LARGE,
    RefusalCounter,
)
from repairproxy.settings import Settings

__all__ = [
    "LimitedProtocol",
    "RefusalCounter",
    "fit_descriptors",
    "head_start",
    "normalise_head",
    "server_options",
]


def _find_settings(app: Any) -> tuple[Settings, Any]:
    """The Settings (and the app holding them) below uvicorn's middleware wrappers."""
    for _ in range(8):
        settings = getattr(app, "settings", None)
        if isinstance(settings, Settings):
            return settings, app
        app = getattr(app, "app", None)
        if app is None:
            break
    return Settings(upstream="-"), None  # a foreign app: the defaults


class _Stop(Exception):
    """Raised in a parser callback to stop parsing the rest of a read (a refused request)."""


class _GatedFlow(FlowControl):
    """uvicorn's flow control, but reading stays paused while the protocol holds bytes it does
    not feed (a full pipeline, a queued request's body, a refusal waiting its turn): the app's
    ``receive`` and the disconnect watch resume reading, and would read without bound."""

    def __init__(self, transport: asyncio.Transport, protocol: LimitedProtocol) -> None:
        super().__init__(transport)
        self.protocol: LimitedProtocol | None = protocol  # dropped at the connection's end

    def resume_reading(self) -> None:
        protocol = self.protocol
        if protocol is None or not protocol.holding():
            super().resume_reading()


class LimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus the limits of the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings, self._owner = _find_settings(self.app)
        _lenient(self.parser)
        self._max_header_bytes = settings.max_header_bytes
        self._header_timeout = settings.header_timeout
        self._body_timeout = settings.body_timeout
        self._write_timeout = settings.write_timeout
        self._max_connections = settings.max_client_connections
        self._max_queued = settings.max_pipelined_requests
        # A head that starts inside a piece is counted from the piece's start: pieces are small
        # enough that a head of up to cap - _slice bytes always passes.
        self._slice = max(256, min(4096, self._max_header_bytes // 8))
        self._in_headers = True  # between one request's end and the next one's headers' end
        self._header_bytes = 0  # fed since the current head began (its first piece whole)
        self._began = False  # a request began in the piece being fed
        self._piece = 0  # size of the piece being fed
        self._chunked = False  # the request being parsed has a chunked body
        self._expects_body = False
        self._overhead = 0  # chunk framing, extensions and trailers fed since the last chunk
        self._body_in_piece = 0
        self._chunk_done = False
        self._chunk_had_body = False
        self._trailers = False
        self._stash = b""  # bytes read but not fed (a full pipeline): at most one read,
        self._stash_at = 0  # from this offset (kept whole: no copy of the rest per stall)
        self._refusing = False  # a refusal is written or waits: nothing more is parsed
        self._deferred: tuple[str, bytes] | None = None  # a refusal after the earlier answers
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_since = 0.0  # loop time of the body phase's start or its last progress
        self._write_timer: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None  # loop time of the last answer while idle
        self._current: _Cycle | None = None  # the cycle running (self.cycle: the last parsed)
        self._must_close = False  # the request being parsed has Content-Length and chunked
        # The pieces fed since the last message boundary at a piece's end (at most the head cap
        # of bytes; None past it): what a head llhttp refuses is re-read from (_renormalise).
        self._replay: list[bytes] | None = []
        self._replay_bytes = 0
        self._raw_head: bytes | None = None  # a refused head's bytes until its blank line comes
        self._normalised = False  # the head being parsed was rewritten: no second rewrite

    # -- refusals ---------------------------------------------------------------------------------

    def _count(self, reason: str) -> None:
        metrics = getattr(self._owner, "metrics", None)
        if metrics is not None:
            metrics.connection_refused(reason)

    def _refused(self, reason: str, answer: bytes) -> None:
        """Answer ``answer`` now and close (the earlier answers are out, or none was asked)."""
        self._count(reason)
        self._refusing = True
        if not self.transport.is_closing():
            if answer:
                self.transport.write(answer)
            self.transport.close()

    def _refuse(self, reason: str, answer: bytes) -> None:
        """Refuse the request being parsed: after the answers to the requests before it (in
        flight or queued), then close. Nothing after it is parsed."""
        self._refusing = True
        self._stash = b""
        self._disarm_body_timer()
        self.flow.pause_reading()
        cycle = cast("_Cycle | None", self.cycle)
        if cycle is not None and not cycle.response_complete and not self._in_headers:
            # The refused request is this cycle itself (its body broke or never came).
            if cycle.queued:  # never started: it simply is not dispatched
                self.pipeline = deque(
                    entry for entry in self.pipeline if cast(object, entry[0]) is not cycle
                )
            else:
                cycle.disconnected = True  # the app's answer, if any comes, is not written
                cycle.wake()
                if cycle.response_started:  # too late for a status: the answer is cut
                    self._count(reason)
                    self.transport.close()
                    return
                self._current = None
        running = self._current
        if (running is not None and not running.response_complete) or self.pipeline:
            self._deferred = (reason, answer)
        else:
            self._refused(reason, answer)

    # -- connection -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        busy = len(self.connections) >= self._max_connections
        # While other requests are in flight, writes leave at the end of the loop iteration, with
        # the other connections' (coalesce.py).
        coalescing = CoalescingTransport(transport, self.loop, in_flight=self.tasks)
        super().connection_made(cast(asyncio.Transport, coalescing))
        self.flow = _GatedFlow(cast(asyncio.Transport, coalescing), self)
        self._current = None  # the cycle running (self.cycle: the last parsed)
        if busy:
            self._refused("max_connections", _BUSY)
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        self._disarm_body_timer()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        self.connections.discard(self)
        self._stash = b""
        cycles = [cast("_Cycle | None", self.cycle), self._current]
        cycles.extend(cast(_Cycle, cycle) for cycle, _ in self.pipeline)
        for cycle in {id(c): c for c in cycles if c is not None}.values():
            if not cycle.response_complete:
                cycle.disconnected = True
            cycle.wake()
        if self.flow is not None:
            self.flow.resume_writing()
            if isinstance(self.flow, _GatedFlow):
                self.flow.protocol = None  # the flow and the protocol hold each other
        if exc is None:
            self.transport.close()
        self.parser = None  # type: ignore[assignment]
        for cycle in {id(c): c for c in cycles if c is not None}.values():
            if cycle.disconnected:
                cycle.disconnect_seen()
        # The protocol and its last cycle hold each other (so do the requests a pipeline still
        # queues): dropped here, a closed connection goes without the cycle collector.
        self.cycle = None  # type: ignore[assignment]
        self._current = None
        self.pipeline.clear()

    def holding(self) -> bool:
        """Whether bytes wait unfed, or feeding is stopped (reading must stay paused)."""
        return bool(self._stash) or self._refusing or self._stalled()

    def _stalled(self) -> bool:
        """Feeding stops while the queue is full, or a queued request's body would be read
        before the app takes the request."""
        if len(self.pipeline) >= self._max_queued:
            return True
        cycle = cast("_Cycle | None", self.cycle)
        return cycle is not None and cycle.queued and not self._in_headers

    # -- timers -----------------------------------------------------------------------------------

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self._header_timeout, self._header_timed_out)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if not self._in_headers or self.transport.is_closing() or self._refusing:
            return
        running = self._current
        if (running is not None and not running.response_complete) or self.pipeline:
            return  # an answer is being made: the keep-alive timer takes over after it
        if self._header_bytes:
            self._refused("header_timeout", _TIMEOUT)
        else:  # an idle connection that never sent a request: nothing to answer
            self._refused("header_timeout", b"")

    def _disarm_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_timed_out(self) -> None:
        """A body that made no progress for ``--body-timeout`` (before the app took it: that
        long since its head, however slowly bytes came)."""
        self._body_timer = None
        cycle = cast("_Cycle | None", self.cycle)
        if cycle is None or self._in_headers or self.transport.is_closing() or self._refusing:
            return
        left = self._body_since + self._body_timeout - self.loop.time()
        if cycle.queued or left > 0:  # queued: we stopped reading it, not the client
            self._body_timer = self.loop.call_later(max(left, 0.05), self._body_timed_out)
            return
        self._refuse("body_timeout", _BODY_TIMEOUT)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self._write_timeout, self._write_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_timed_out(self) -> None:
        """The client stopped reading: what we hold for it is dropped with the connection. A
        closing connection too: a whole answer handed over before ``close`` waits in the
        buffer for a reader that may never come."""
        self._write_timer = None
        if self.flow.write_paused:
            self._count("write_timeout")
            self.transport.abort()

    # -- reading ----------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._idle_since = None  # bytes came: busy until the next answer completes
        if self._refusing or self.parser is None:
            return
        if self._raw_head is not None:
            self._collect_head(data)
            return
        if self._stash or self._stalled():
            self._stash = self._stash[self._stash_at :] + data
            self._stash_at = 0
            self.flow.pause_reading()
            return
        self._feed(data)

    def _feed(self, data: bytes, pos: int = 0) -> None:
        """Feed ``data`` from ``pos`` in pieces no larger than the caps allow, stopping (the rest
        stashed, reading paused) when the queue is full or a refusal was decided."""
        size = len(data)
        while pos < size:
            if self._refusing or self.parser is None or self.transport.is_closing():
                return
            if self._stalled():
                self._stash, self._stash_at = data, pos
                self.flow.pause_reading()
                return
            rest = size - pos
            if self._in_headers:
                room = self._max_header_bytes - self._header_bytes
                step = min(room, self._slice if rest > self._slice else rest)
                if self.pipeline or data.count(b"\r\n\r\n", pos, pos + step) > 1:
                    # Several heads in the piece (pipelining): small pieces, so the queue
                    # overshoots its cap by one small piece's heads at most.
                    step = min(step, 256)
            elif self._chunked:
                step = min(rest, self._max_header_bytes - self._overhead)
            else:
                step = rest
            if step <= 0:
                self._refuse("header_bytes", _TOO_LARGE)
                return
            piece = data if step == size else data[pos : pos + step]
            pos += step
            in_headers = self._in_headers
            self._began = False
            self._piece = step
            self._body_in_piece = 0
            self._chunk_done = False
            try:
                self.parser.feed_data(piece)
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
                return
            except httptools.HttpParserError:
                if self._refusing:
                    return
                again = self._renormalise(piece, data[pos:]) if self._in_headers else None
                if again is None:
                    if not self._refusing and self._raw_head is None:
                        self.logger.warning("Invalid HTTP request received.")
                        self._refuse("bad_request", _BAD_REQUEST)
                    return
                data, pos, size = again, 0, len(again)  # the rewritten head, then the rest
                continue
            replay = self._replay
            if self._in_headers and not self._header_bytes:  # a message boundary: nothing to keep
                if replay is None or replay:
                    self._replay, self._replay_bytes = [], 0
            elif replay is not None:
                self._replay_bytes += step
                if self._replay_bytes > self._max_header_bytes:
                    self._replay = None
                else:
                    replay.append(piece)
            if self._in_headers:
                if in_headers and not self._began:
                    self._header_bytes += step
                if self._header_bytes >= self._max_header_bytes:
                    self._refuse("header_bytes", _TOO_LARGE)
                    return
                if self._header_bytes and self._header_timer is None:
                    # A timer only for heads still incomplete after a piece (most requests
                    # arrive whole in one read: no timer armed and cancelled on the hot path).
                    self._arm_header_timer()
            elif self._chunked or self._expects_body:
                # A body still to come (most arrive with their head: no timer then).
                if self._body_timer is None:
                    self._body_timer = self.loop.call_later(
                        self._body_timeout, self._body_timed_out
                    )
                if not self._chunked:
                    continue
                if self._chunk_done:
                    self._overhead = 0
                else:
                    self._overhead += step - self._body_in_piece
                if self._overhead >= self._max_header_bytes:
                    self._refuse("header_bytes", _TOO_LARGE)
                    return

    def _renormalise(self, piece: bytes, rest: bytes) -> bytes | None:
        """llhttp refused the head being parsed (in ``piece``; ``rest``: what follows, unfed).
        Read it as h11 reads it (``normalise_head``): a bare LF after the request line, obs-fold
        and repeated identical Content-Length values, which llhttp has no leniency for, become
        one unambiguous CRLF head for a fresh parser. Returns what to feed from the head on, or
        None: refused (set here), or the head's end has yet to come (``_collect_head``)."""
        replay = self._replay
        if replay is None or self._normalised:
            return None  # the head's start is not known, or llhttp refused our own rewrite
        stream = b"".join([*replay, piece])
        start = head_start(stream)
        if start is None:
            return None
        self._replay, self._replay_bytes = [], 0
        return self._rewrite(stream[start:] + rest)

    def _rewrite(self, raw: bytes) -> bytes | None:
        end = _BLANK_LINE.search(raw)
        if end is None:
            if len(raw) >= self._max_header_bytes:
                self._refuse("header_bytes", _TOO_LARGE)
            else:  # the rest of the head is still to come
                self._raw_head = raw
                self.flow.resume_reading()
                self._arm_header_timer()
            return None
        self._raw_head = None
        head = normalise_head(raw[: end.end()])
        if head is None or len(head) >= self._max_header_bytes:
            self.logger.warning("Invalid HTTP request received.")
            self._refuse("bad_request", _BAD_REQUEST)
            return None
        self.parser = _lenient(httptools.HttpRequestParser(self))  # llhttp's errors are final
        self._normalised = True
        self._in_headers, self._header_bytes = True, 0
        return head + raw[end.end() :]

    def _collect_head(self, data: bytes) -> None:
        """More of a head that is being rewritten (``_rewrite``): fed once it is whole."""
        raw = cast(bytes, self._raw_head) + data
        self._raw_head = None
        again = self._rewrite(raw)
        if again is not None:
            self._feed(again)

    def _feed_stash(self) -> None:
        """The queue drained: feed what waits, then read again."""
        if self._refusing or self.parser is None or self.transport.is_closing():
            return
        stash, at = self._stash, self._stash_at
        self._stash, self._stash_at = b"", 0
        if stash:
            self._feed(stash, at)
        if not self.holding():
            self.flow.resume_reading()

    # -- parser callbacks -------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        # uvicorn's also builds a scope (and copies the app state) that on_headers_complete
        # below replaces whole: only the per-request fields are reset here.
        if self._refusing:
            raise _Stop
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self._began = True
        self._header_bytes = self._piece
        self._chunked = False
        self._overhead = 0
        self._trailers = False

    def on_chunk_header(self) -> None:
        self._chunk_had_body = False

    def on_chunk_complete(self) -> None:
        if self._chunk_had_body:
            self._chunk_done = True

    def _check_head(self, method: str) -> tuple[str, bytes] | None:
        """A refusal for a head llhttp accepted but this server does not serve."""
        length = -1
        codings: list[bytes] = []
        for name, value in self.headers:
            if name == b"transfer-encoding":
                codings.extend(token.strip().lower() for token in value.split(b","))
            elif name == b"content-length":
                length = int(value) if value.strip().isdigit() else 1
            elif name == b"expect" and value.lower() != b"100-continue":
                return "expectation_failed", _EXPECTATION
        self._must_close = bool(codings) and length >= 0
        length = max(length, 0)
        self._expects_body = bool(codings or length)
        if codings:
            if codings != [b"chunked"]:
                return "unsupported_coding", _NOT_IMPLEMENTED
            self._chunked = True
        if (codings or length) and method in ("GET", "HEAD"):
            return "body_refused", _BODY_REFUSED
        return None

    def on_headers_complete(self) -> None:
        if self._refusing:
            raise _Stop
        self._in_headers = False
        self._normalised = False
        if self._header_timer is not None:
            self._disarm_header_timer()
        parser = self.parser
        method = parser.get_method().decode("ascii")
        refusal = self._check_head(method)
        if refusal is not None:
            self._in_headers = True  # the refused request holds no cycle
            self._refuse(*refusal)
            raise _Stop
        http_version = parser.get_http_version()
        url = self.url
        if url[:1] == b"/" and b"?" not in url and b"#" not in url:
            raw_path, query = url, b""  # what parse_url answers for a bare path, without it
        else:
            parsed = httptools.parse_url(url)
            raw_path, query = parsed.path, parsed.query or b""
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        root = self.root_path
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": http_version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": root,
            "headers": self.headers,
            "state": self.app_state.copy(),
            "method": method,
            "path": root + path if root else path,
            "raw_path": root.encode("ascii") + raw_path if root else raw_path,
            "query_string": query,
        }
        self.scope = scope  # type: ignore[assignment]
        # Trailer fields (on_header after the head) go to a list nobody reads, counted as chunk
        # overhead: nothing forwards them, and the scope's headers stay as the head left them.
        self.headers = []
        if parser.should_upgrade() and self._should_upgrade():
            return  # uvicorn's websocket hand-over follows (data_received)
        app = self.app
        if self.limit_concurrency is not None and (
            len(self.connections) >= self.limit_concurrency
            or len(self.tasks) >= self.limit_concurrency
        ):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")
        cycle = _Cycle(
            self,
            scope,
            # RFC 9112 6.1: after a request with both Transfer-Encoding and Content-Length (the
            # former wins) the server MUST close the connection once it has answered.
            keep_alive=http_version != "1.0"
            and parser.should_keep_alive()
            and not self._must_close,
            expect_100_continue=self.expect_100_continue,
        )
        scope["extensions"] = {
            DISCONNECT_EXTENSION: {"watch": cycle.watch_disconnect, "loop": self.loop},
            RESPONSE_EXTENSION: cycle,
        }
        self.cycle = cycle  # type: ignore[assignment]
        running = self._current
        if (running is None or running.response_complete) and not self.pipeline:
            self._current = cycle
            self._start_asgi_task(cycle, app)  # type: ignore[arg-type]
        else:  # a pipelined request waits for the answers before it
            cycle.queued = True
            self.pipeline.appendleft((cycle, app))  # type: ignore[arg-type]
        self._body_since = self.loop.time()

    def on_body(self, body: bytes) -> None:
        self._body_in_piece += len(body)
        self._chunk_had_body = True
        if self.parser.should_upgrade() and self._should_upgrade():
            return
        cycle = cast(_Cycle, self.cycle)
        if cycle.taken:  # progress (before the app takes the body, its deadline is fixed)
            self._body_since = self.loop.time()
        if cycle.response_complete:
            return
        cycle.received.append(body)
        cycle.received_bytes += len(body)
        if cycle.received_bytes > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.wake()

    # The keep-alive timer, armed lazily: uvicorn cancels it on every read and arms a new one
    # after every answer (a timer made and cancelled per request). Here one timer stays armed
    # while the connection is used, and when it fires it closes the connection only if it has
    # been idle for the whole timeout since the last answer, else it re-arms for what is left.

    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None  # bytes came: busy until the next answer completes

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if self.pipeline:
            self._idle_since = None
            queued, app = self.pipeline.pop()
            cycle = cast(_Cycle, queued)
            cycle.queued = False
            self._current = cycle
            self._start_asgi_task(queued, app)
            if self._stash and not self._refusing:
                self.loop.call_soon(self._feed_stash)
            return
        self._current = None
        if self._deferred is not None:  # a refused request, answered after the earlier ones
            reason, answer = self._deferred
            self._deferred = None
            self._refused(reason, answer)
            return
        if self._stash:
            self.loop.call_soon(self._feed_stash)
        else:
            self.flow.resume_reading()
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self._keep_alive_expired
            )

    def _keep_alive_expired(self) -> None:
        self.timeout_keep_alive_task = None
        idle_since = self._idle_since
        if idle_since is None:
            return  # a request is in progress: its answer arms the timer again
        left = idle_since + self.timeout_keep_alive - self.loop.time()
        if left > 0:
            self.timeout_keep_alive_task = self.loop.call_later(left, self._keep_alive_expired)
        else:
            self.timeout_keep_alive_handler()

    def on_message_complete(self) -> None:
        cycle = cast(_Cycle, self.cycle)
        if self._body_timer is not None:
            self._disarm_body_timer()
        if not cycle.response_complete and not (
            self.parser.should_upgrade() and self._should_upgrade()
        ):
            cycle.more_body = False
            cycle.wake()
        self._in_headers = True  # the next bytes on this connection start the next request
        self._header_bytes = 0
        self._chunked = False


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for this proxy: uvloop + the limited httptools protocol when present."""
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "loop": _best("uvloop", "asyncio"),
        "lifespan": "on",
        "access_log": False,  # our own canonical log line replaces it
        "log_level": "warning",
        "server_header": False,  # the upstream's Server/Date headers pass through instead
        "date_header": False,
        "proxy_headers": False,  # no X-Forwarded-* rewriting middleware on the hot path
        "timeout_graceful_shutdown": settings.drain_timeout,
        "timeout_keep_alive": settings.keep_alive_timeout,
    }
    if _best("httptools", "h11") == "httptools":
        options["http"] = LimitedProtocol
    else:
        options["http"] = "h11"
        options["h11_max_incomplete_event_size"] = settings.max_header_bytes
        options["limit_concurrency"] = settings.max_client_connections
    return options


def _best(module: str, fallback: str) -> str:
    try:
        __import__(module)
    except ImportError:
        return fallback
    return module
