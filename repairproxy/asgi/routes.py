"""The proxy's routes as plain ASGI handlers: HTTP framing only.

``POST /v1/chat/completions`` reads the body, asks the pipeline (``pipeline.py``) what to forward,
and hands the answer's framing (JSON or SSE) to ``asgi.chat.ChatCall``. Every other ``/v1/*``
route is relayed as it is, except ``POST /v1/responses`` and ``POST /v1/messages``, which go
through the same pipeline via ``asgi.responses.ResponsesCall`` and ``asgi.messages.MessagesCall``
(the log line marks relayed routes ``validated: false``; errors on ``/v1/messages*`` are
Anthropic-shaped).
Plain ASGI, not Starlette endpoints: a stream's headers must wait for the verdict, and a
framework's per-request cost would be most of the latency budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import unquote

import orjson

from repairproxy.asgi.chat import CHAT_PATH, ChatCall
from repairproxy.asgi.exchange import Exchange
from repairproxy.asgi.gate import DONE_EVENT
from repairproxy.asgi.messages import MESSAGES_PATH, MessagesCall
from repairproxy.asgi.messages import error_event as messages_error_event
from repairproxy.asgi.responder import (
    ClientDisconnectedError,
    Responder,
    cancel_on_disconnect,
    header_map,
    read_body,
    response_writer,
)
from repairproxy.asgi.responses import RESPONSES_PATH, ResponsesCall, stored_response
from repairproxy.asgi.responses import error_event as responses_error_event
from repairproxy.asgi.threads import MessageThreads
from repairproxy.credentials import presented_key
from repairproxy.episodes.responses_store import MemoryResponsesStore, ResponsesStore
from repairproxy.errors import (
    AuthenticationError,
    BadRequestError,
    NotFoundError,
    PermissionDeniedError,
    RepairProxyError,
    UpstreamError,
    UpstreamStatusError,
)
from repairproxy.observe.logging import line_writer
from repairproxy.observe.record import PipelineObserver
from repairproxy.pipeline import ChatPipeline
from repairproxy.settings import Settings
from repairproxy.types import HeaderList, Outcome, Receive, Scope, Send
from repairproxy.upstream.client import Upstream, UpstreamReply, response_headers, timed

if TYPE_CHECKING:
    from repairproxy.observe.dashboard import DashboardSource
    from repairproxy.observe.logging import RequestLogger
    from repairproxy.observe.metrics import Metrics

__all__ = ["Proxy"]

_JSON = (b"content-type", b"application/json")
# Bytes that may never reach a request line: controls, space, DEL and anything non-ASCII.
_NOT_URL_SAFE = re.compile(rb"[\x00-\x20\x7f-\xff]")


_VALIDATED = frozenset({CHAT_PATH, RESPONSES_PATH, MESSAGES_PATH})


def _raw_target(scope: Scope) -> str:
    """The path exactly as the client sent it (still percent-encoded), safe for a request line.

    Never the decoded ``path``: a decoded ``%0d%0a`` would end the request line and smuggle a
    second request (with the upstream key) onto a pooled connection.
    """
    raw = scope.get("raw_path") or scope["path"].encode("utf-8")
    for part in (raw, scope.get("query_string") or b""):
        if _NOT_URL_SAFE.search(part):
            raise BadRequestError("the request path or query holds characters not allowed in a URL")
    if _has_dot_segment(raw):
        raise BadRequestError("the request path holds a '.' or '..' segment (plain or encoded)")
    return str(raw.decode("ascii"))


def _has_dot_segment(raw: bytes) -> bool:
    """Whether the path, decoded once or twice (``%2e``, ``%252e``, ``..%2f``), has a ``.`` or
    ``..`` segment: forwarded with the upstream key, it could reach a route outside ``/v1``."""
    if b"." not in raw and b"%" not in raw:
        return False  # the common path: nothing to decode
    path = raw.decode("ascii", "replace")
    for _ in range(2):
        path = unquote(path)
        if any(part in (".", "..") for part in path.replace("\\", "/").split("/")):
            return True
    return False


def _is_messages(path: str) -> bool:
    """Anthropic's routes, whose errors are Anthropic-shaped (count_tokens included)."""
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


class Proxy:
    """Route handlers bound to one app's upstream client, pipeline, observer and logger."""

    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        pipeline: ChatPipeline,
        observer: PipelineObserver,
        logger: RequestLogger,
        metrics: Metrics | None = None,
        *,
        dashboard: DashboardSource | None = None,
        responses_store: ResponsesStore | None = None,
        threads_store: ResponsesStore | None = None,
    ) -> None:
        self.settings = settings
        # The Responses answers the proxy delivered (previous_response_id, GET/DELETE by id).
        # ``is None``, not ``or``: an empty store is falsy (``len`` 0).
        self.responses_store: ResponsesStore = (
            responses_store
            if responses_store is not None
            else MemoryResponsesStore(settings.max_responses_memory, settings.episode_idle_ttl)
        )
        # Anthropic message threads (asgi/threads.py): the answers delivered to threaded turns.
        self.threads = MessageThreads(
            threads_store
            if threads_store is not None
            else MemoryResponsesStore(settings.max_responses_memory, settings.episode_idle_ttl)
        )
        self.upstream = upstream
        self.pipeline = pipeline
        self.observer = observer
        self.metrics = metrics  # repairproxy.observe.metrics.Metrics when /metrics is served here
        self.dashboard = dashboard  # the same Metrics, whose numbers /dashboard shows
        self.log = logger
        self._log_request = line_writer(logger, "request")  # the per-request line, direct
        self.draining = False  # set on SIGTERM (app.py): /readyz answers 503 from then on
        self._api_keys = tuple(key.encode() for key in settings.api_keys)
        self._metrics_keys = (
            (settings.metrics_api_key.encode(),) if settings.metrics_api_key else ()
        )

    # -- dispatch ---------------------------------------------------------------------------------

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        ex = Exchange(time.perf_counter(), method, path)
        responder = Responder(send, response_writer(scope))
        try:
            if path == CHAT_PATH and method == "POST":
                await self._chat(scope, receive, responder, ex)
            elif path == RESPONSES_PATH and method == "POST":
                await self._responses(scope, receive, responder, ex)
            elif path.startswith(RESPONSES_PATH + "/") and method in ("GET", "DELETE"):
                await self._stored_response(scope, receive, responder, ex)
            elif path == MESSAGES_PATH and method == "POST":
                await self._messages(scope, receive, responder, ex)
            elif path.startswith("/v1/"):
                await self._passthrough(scope, receive, responder, ex)
            elif path == "/healthz":
                await responder.whole(200, [_JSON], b'{"status":"ok"}')
            elif path == "/readyz" and self.draining:
                await responder.whole(503, [_JSON], b'{"status":"draining"}')
            elif path == "/readyz":
                ready = await self.upstream.ready()
                body = b'{"status":"ready"}' if ready else b'{"status":"upstream unreachable"}'
                await responder.whole(200 if ready else 503, [_JSON], body)
            elif path == "/metrics" and self.metrics is not None and method == "GET":
                await self._metrics(scope, responder)
            elif path == "/dashboard" and self.dashboard is not None and method == "GET":
                await self._dashboard(scope, responder)
            else:
                raise NotFoundError(f"no route for {method} {path}")
        except ClientDisconnectedError:
            ex.record.status = 499  # nginx's "client closed request", for the log only
        except UpstreamStatusError as exc:
            ex.record.outcome = Outcome.UPSTREAM_ERROR
            await self._send_reply(responder, ex, exc.reply)
        except RepairProxyError as exc:
            if ex.record.outcome is Outcome.OK:
                ex.record.outcome = exc.outcome
            if responder.started and isinstance(exc, UpstreamError):
                # The upstream failed mid-body: the client must see a cut body, never one that
                # looks complete. Returning without the last message makes the server close
                # the connection without the final chunk.
                ex.record.status = exc.status_code
                return
            await self._send_error(responder, ex, exc)
        except Exception as exc:  # the process must survive any bug in one request
            self.log.exception("unhandled", path=path, error=repr(exc))
            ex.record.outcome = Outcome.UPSTREAM_ERROR
            error = RepairProxyError(f"internal proxy error: {type(exc).__name__}")
            await self._send_error(responder, ex, error)
        finally:
            if path.startswith("/v1/"):
                try:
                    # With other requests in flight the server holds the answer to the end of
                    # this loop iteration (coalesce.py): yield once, so the log line and the
                    # metrics come after it leaves, not before.
                    await asyncio.sleep(0)
                finally:
                    self._finish(ex, responder)

    # -- chat completions and responses (validated) ----------------------------------------------

    async def _validated_request(
        self, scope: Scope, receive: Receive, ex: Exchange
    ) -> tuple[dict[str, str], bytes]:
        """Headers and body of a request the pipeline will judge, after auth and URL checks."""
        headers = header_map(scope)
        self._authenticate(headers, self._api_keys)  # before reading: no buffer for strangers
        if scope["query_string"]:
            _raw_target(scope)  # the query goes upstream as sent: refuse what a URL cannot hold
        raw = await read_body(receive, headers, self.settings.max_body_bytes)
        ex.record.request_body = raw if self.settings.log_bodies else None
        return headers, raw

    async def _chat(
        self, scope: Scope, receive: Receive, responder: Responder, ex: Exchange
    ) -> None:
        headers, raw = await self._validated_request(scope, receive, ex)
        call = ChatCall(self.upstream, self.pipeline, ex, scope, headers)
        try:
            request = await call.prepare(raw)
            await cancel_on_disconnect(
                call.stream(responder) if request.stream else call.buffered(responder),
                receive,
                scope,
            )
        finally:
            await call.settle()

    async def _responses(
        self, scope: Scope, receive: Receive, responder: Responder, ex: Exchange
    ) -> None:
        headers, raw = await self._validated_request(scope, receive, ex)
        call = ResponsesCall(self.upstream, self.pipeline, ex, scope, headers, self.responses_store)
        try:
            request = await call.prepare(raw)
            await cancel_on_disconnect(
                call.stream(responder) if request.stream else call.buffered(responder),
                receive,
                scope,
            )
        finally:
            await call.settle()

    async def _messages(
        self, scope: Scope, receive: Receive, responder: Responder, ex: Exchange
    ) -> None:
        headers, raw = await self._validated_request(scope, receive, ex)
        native = "messages" in self.settings.native_apis()
        call = MessagesCall(
            self.upstream, self.pipeline, ex, scope, headers, native=native, threads=self.threads
        )
        delivered = False
        try:
            await call.prepare(raw)
            await cancel_on_disconnect(
                call.stream_answer(responder) if call.stream else call.buffered(responder),
                receive,
                scope,
            )
            delivered = 200 <= responder.status < 300
        finally:
            await call.finish(delivered)

    async def _stored_response(
        self, scope: Scope, receive: Receive, responder: Responder, ex: Exchange
    ) -> None:
        """A Responses id the proxy delivered is served from its store (this tenant's only);
        any other is the upstream's, relayed, unless client keys are set (then unknown: the
        upstream's store is one namespace for every tenant)."""
        headers = header_map(scope)
        self._authenticate(headers, self._api_keys)
        tenant = self.pipeline.episodes.tenant_of(headers)
        path, method = scope["path"], scope["method"]
        found = await stored_response(
            self.responses_store, tenant, method, path, scope["query_string"]
        )
        if found is not None:
            ex.record.status = found[0]
            await responder.whole(found[0], [_JSON], orjson.dumps(found[1]))
        elif self.settings.api_keys or "responses" not in self.settings.native_apis():
            response_id = path[len(RESPONSES_PATH) + 1 :].partition("/")[0]
            raise NotFoundError(f"Response with id '{response_id[:128]}' not found.")
        else:
            await self._passthrough(scope, receive, responder, ex)

    # -- other routes -----------------------------------------------------------------------------

    async def _passthrough(
        self, scope: Scope, receive: Receive, responder: Responder, ex: Exchange
    ) -> None:
        headers = header_map(scope)
        self._authenticate(headers, self._api_keys)
        target = _raw_target(scope)
        raw = await read_body(receive, headers, self.settings.max_body_bytes)
        out_headers = self.upstream.outbound_headers(scope["headers"], keep_encoding=True)

        async def relay() -> None:
            async with self.upstream.stream(
                ex.method, target, out_headers, raw, ex.timer, scope["query_string"]
            ) as response:
                sent = response_headers(response.headers, head=ex.method == "HEAD")
                sent.extend(ex.proxy_headers(verdict=False))
                await responder.start(response.status_code, sent)
                with self.upstream.reading():
                    async for chunk in timed(response.iter_body(), ex.timer):
                        await responder.body(chunk)
                await responder.body(b"", more=False)

        await cancel_on_disconnect(relay(), receive, scope)

    async def _metrics(self, scope: Scope, responder: Responder) -> None:
        assert self.metrics is not None  # dispatched only when /metrics is served here
        self._authenticate(header_map(scope), self._metrics_keys)
        accept = header_map(scope).get("accept")
        body, content_type = self.metrics.exposition(accept)
        await responder.whole(200, [(b"content-type", content_type.encode())], body)

    async def _dashboard(self, scope: Scope, responder: Responder) -> None:
        assert self.dashboard is not None  # dispatched only when the page is served
        # The page shows every tenant's numbers (and model-invented tool names): never to a
        # client key. The metrics key opens it; with client keys and no metrics key, nobody.
        if self._metrics_keys:
            self._authenticate(header_map(scope), self._metrics_keys)
        elif self._api_keys:
            raise PermissionDeniedError(
                "/dashboard shows every tenant's data: set --metrics-api-key to open it"
            )
        from repairproxy.observe.dashboard import render_dashboard

        query = scope.get("query_string", b"").split(b"&")
        snapshot = any(part.split(b"=")[0] == b"snapshot" for part in query)
        page = render_dashboard(self.dashboard, snapshot=snapshot)
        await responder.whole(200, [(b"content-type", b"text/html; charset=utf-8")], page)

    # -- helpers ----------------------------------------------------------------------------------

    @staticmethod
    def _authenticate(headers: Mapping[str, str], keys: tuple[bytes, ...]) -> None:
        if not keys:
            return
        token = presented_key(headers).encode()  # the same key tenancy uses (credentials.py)
        # Compare against every key, always, so timing does not reveal which prefix matched.
        matched = False
        for key in keys:
            matched |= hmac.compare_digest(token, key)
        if not matched:
            raise AuthenticationError("missing or invalid API key for the proxy")

    async def _send_reply(self, responder: Responder, ex: Exchange, reply: UpstreamReply) -> None:
        if responder.started:
            return
        headers = response_headers(reply.headers)
        headers.extend(ex.proxy_headers())
        ex.record.status = reply.status_code
        await responder.whole(reply.status_code, headers, reply.content)

    async def _send_error(
        self, responder: Responder, ex: Exchange, error: RepairProxyError
    ) -> None:
        ex.record.status = error.status_code
        anthropic = _is_messages(ex.path)
        payload = orjson.dumps(error.to_anthropic() if anthropic else error.to_openai())
        if responder.started:
            # Too late for a status code: tell a streaming client in-band, as OpenAI does.
            if ex.path == RESPONSES_PATH:
                frame = responses_error_event(error.to_openai())
            elif anthropic:
                frame = messages_error_event(error.status_code, error.message)
            else:
                frame = b"data: " + payload + b"\n\n" + DONE_EVENT
            with contextlib.suppress(Exception):  # the client may be gone already
                await responder.body(frame, more=False)
            return
        headers: HeaderList = [_JSON]
        headers.extend(ex.proxy_headers())
        await responder.whole(error.status_code, headers, payload)

    def _finish(self, ex: Exchange, responder: Responder) -> None:
        """The one log line, then the observer (metrics): both after the answer left."""
        ex.settle(responder.status, responder.first_byte_at)
        record = ex.record
        event = ex.log_event(record.status, log_bodies=self.settings.log_bodies)
        if ex.path not in _VALIDATED:
            event["validated"] = False
        if record.warn_missing_header:  # once per process, in the request's own line
            event["warning"] = (
                f"no {self.settings.episode_header} header: episodes are chained by conversation "
                "history; identical concurrent conversations cannot be told apart without it"
            )
        self._log_request(event)
        if ex.path in _VALIDATED:
            self.observer.request_finished(record)
