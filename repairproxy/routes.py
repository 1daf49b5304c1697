"""The proxy's routes as plain ASGI handlers: HTTP framing only.

``POST /v1/chat/completions`` reads the body, asks the pipeline (``pipeline.py``) what to forward
and what to answer, and frames the answer: one JSON body, or an SSE stream whose tool-call events
are held by the gate until the pipeline has judged the assembled answer. Every other ``/v1/*``
route is relayed as it is (``/v1/responses`` too: it passes through unvalidated for now, and the
log line says so). Plain ASGI, not Starlette endpoints: a stream's headers must wait for the
verdict, and a framework's per-request cost would be most of the latency budget.
"""

from __future__ import annotations

import contextlib
import hmac
import re
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import orjson

from repairproxy.asgi import (
    ClientDisconnectedError,
    Receive,
    Responder,
    Scope,
    Send,
    cancel_on_disconnect,
    header_map,
    read_body,
)
from repairproxy.errors import (
    AuthenticationError,
    BadRequestError,
    NotFoundError,
    RepairProxyError,
    UpstreamBadAnswerError,
    UpstreamStatusError,
)
from repairproxy.events import Outcome, PipelineObserver
from repairproxy.exchange import Exchange
from repairproxy.pipeline import ChatOutcome, ChatPipeline, ChatRequest
from repairproxy.settings import Settings
from repairproxy.streaming import DONE_EVENT, SSEParser, ToolCallGate, completion_to_chunks
from repairproxy.upstream import HeaderList, Upstream, UpstreamReply, response_headers, timed
from repairproxy.wire import ChatCompletion

__all__ = ["Proxy"]

_JSON = (b"content-type", b"application/json")
_CHAT = "/v1/chat/completions"
# Bytes that may never reach a request line: controls, space, DEL and anything non-ASCII.
_NOT_URL_SAFE = re.compile(rb"[\x00-\x20\x7f-\xff]")
_UNVALIDATED = {"/v1/responses": "passed through unvalidated (Responses API)"}


def _raw_target(scope: Scope) -> str:
    """The path exactly as the client sent it (still percent-encoded), safe for a request line.

    Never the decoded ``path``: a decoded ``%0d%0a`` would end the request line and smuggle a
    second request (with the upstream key) onto a pooled connection.
    """
    raw = scope.get("raw_path") or scope["path"].encode("utf-8")
    for part in (raw, scope.get("query_string") or b""):
        if _NOT_URL_SAFE.search(part):
            raise BadRequestError("the request path or query holds characters not allowed in a URL")
    return str(raw.decode("ascii"))


def _completion_of(reply: UpstreamReply) -> ChatCompletion:
    """A 2xx answer that must be a chat completion; anything else is the upstream's fault."""
    try:
        completion = orjson.loads(reply.content)
    except orjson.JSONDecodeError:
        completion = None
    if not isinstance(completion, dict) or not isinstance(completion.get("choices"), list):
        raise UpstreamBadAnswerError(
            f"the upstream answered {reply.status_code} with a body that is not a chat completion"
        )
    return cast(ChatCompletion, completion)


class Proxy:
    """Route handlers bound to one app's upstream client, pipeline, observer and logger."""

    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        pipeline: ChatPipeline,
        observer: PipelineObserver,
        logger: Any,
        metrics: Any = None,
    ) -> None:
        self.settings = settings
        self.upstream = upstream
        self.pipeline = pipeline
        self.observer = observer
        self.metrics = metrics  # repairproxy.metrics.Metrics when metrics are on
        self.log = logger
        self._api_keys = tuple(key.encode() for key in settings.api_keys)
        self._metrics_keys = (
            (settings.metrics_api_key.encode(),) if settings.metrics_api_key else ()
        )
        self._warned_no_episode = False

    # -- dispatch ---------------------------------------------------------------------------------

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        ex = Exchange(time.perf_counter(), method, path)
        responder = Responder(send)
        try:
            if path == _CHAT and method == "POST":
                await self._chat(scope, receive, responder, ex)
            elif path.startswith("/v1/"):
                await self._passthrough(scope, receive, responder, ex)
            elif path == "/healthz":
                await responder.whole(200, [_JSON], b'{"status":"ok"}')
            elif path == "/readyz":
                ready = await self.upstream.ready()
                body = b'{"status":"ready"}' if ready else b'{"status":"upstream unreachable"}'
                await responder.whole(200 if ready else 503, [_JSON], body)
            elif path == "/metrics" and self.metrics is not None and method == "GET":
                await self._metrics(scope, responder)
            elif path == "/dashboard" and self.metrics is not None and method == "GET":
                await self._dashboard(scope, responder)
            else:
                raise NotFoundError(f"no route for {method} {path}")
        except ClientDisconnectedError:
            ex.status = 499  # nginx's "client closed request", for the log only
        except UpstreamStatusError as exc:
            ex.record.outcome = Outcome.UPSTREAM_ERROR
            await self._send_reply(responder, ex, exc.reply)
        except RepairProxyError as exc:
            if ex.record.outcome is Outcome.OK:
                ex.record.outcome = exc.outcome
            await self._send_error(responder, ex, exc)
        except Exception as exc:  # the process must survive any bug in one request
            self.log.exception("unhandled", path=path, error=repr(exc))
            ex.record.outcome = Outcome.UPSTREAM_ERROR
            error = RepairProxyError(f"internal proxy error: {type(exc).__name__}")
            await self._send_error(responder, ex, error)
        finally:
            if path.startswith("/v1/"):
                self._finish(ex, responder)

    # -- chat completions -------------------------------------------------------------------------

    async def _chat(
        self, scope: Scope, receive: Receive, responder: Responder, ex: Exchange
    ) -> None:
        headers = header_map(scope)
        self._authenticate(headers, self._api_keys)  # before reading: no buffer for strangers
        if scope["query_string"]:
            _raw_target(scope)  # the query goes upstream as sent: refuse what a URL cannot hold
        raw = await read_body(receive, headers, self.settings.max_body_bytes)
        ex.request_body = raw if self.settings.log_bodies else None
        pipeline = self.pipeline
        request = pipeline.parse(raw, headers, ex.record)
        ex.mode = request.mode.value
        try:
            await pipeline.admit(request, headers, ex.record)
        finally:
            ex.episode_id, ex.snapshot = request.episode_id, request.snapshot
        ex.chained_episode = not request.explicit_episode
        pipeline.prepare_forward(request)
        call = _ChatCall(self, ex, request, scope)
        await cancel_on_disconnect(
            call.stream(responder) if request.stream else call.buffered(responder), receive
        )

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
                sent = response_headers(response.headers)
                sent.extend(ex.proxy_headers(verdict=False))
                await responder.start(response.status_code, sent)
                with self.upstream.reading():
                    async for chunk in timed(response.iter_body(), ex.timer):
                        await responder.body(chunk)
                await responder.body(b"", more=False)

        await cancel_on_disconnect(relay(), receive)

    async def _metrics(self, scope: Scope, responder: Responder) -> None:
        self._authenticate(header_map(scope), self._metrics_keys)
        accept = header_map(scope).get("accept")
        body, content_type = self.metrics.exposition(accept)
        await responder.whole(200, [(b"content-type", content_type.encode())], body)

    async def _dashboard(self, scope: Scope, responder: Responder) -> None:
        self._authenticate(header_map(scope), self._api_keys)
        from repairproxy.dashboard import render_dashboard

        page = render_dashboard(self.metrics)
        await responder.whole(200, [(b"content-type", b"text/html; charset=utf-8")], page)

    # -- helpers ----------------------------------------------------------------------------------

    @staticmethod
    def _authenticate(headers: Mapping[str, str], keys: tuple[bytes, ...]) -> None:
        if not keys:
            return
        given = headers.get("authorization", "")
        token = given[7:].strip().encode() if given[:7].lower() == "bearer " else b""
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
        ex.status = reply.status_code
        await responder.whole(reply.status_code, headers, reply.content)

    async def _send_error(
        self, responder: Responder, ex: Exchange, error: RepairProxyError
    ) -> None:
        ex.status = error.status_code
        payload = orjson.dumps(error.to_openai())
        if responder.started:
            # Too late for a status code: tell a streaming client in-band, as OpenAI does.
            with contextlib.suppress(Exception):  # the client may be gone already
                await responder.body(b"data: " + payload + b"\n\n" + DONE_EVENT, more=False)
            return
        headers: HeaderList = [_JSON]
        headers.extend(ex.proxy_headers())
        await responder.whole(error.status_code, headers, payload)

    def _finish(self, ex: Exchange, responder: Responder) -> None:
        """The one log line, then the observer (metrics): both after the answer left."""
        status = ex.status or responder.status
        record = ex.record
        record.status = status
        record.upstream_seconds = ex.timer.seconds
        record.overhead_seconds = ex.overhead_ms() / 1000.0
        if responder.first_byte_at is not None:
            record.first_byte_seconds = responder.first_byte_at - ex.started
        event = ex.log_event(status, log_bodies=self.settings.log_bodies)
        if ex.path != _CHAT:
            event["validated"] = False
            note = _UNVALIDATED.get(ex.path)
            if note:
                event["note"] = note
        if ex.chained_episode and not self._warned_no_episode:
            self._warned_no_episode = True  # once per process, in the request's own line
            event["warning"] = (
                f"no {self.settings.episode_header} header: episodes are chained by conversation "
                "history; identical concurrent conversations cannot be told apart without it"
            )
        self.log.info("request", **event)
        if ex.path == _CHAT:
            self.observer.request_finished(record)


class _ChatCall:
    """One chat completion in flight: forward, let the pipeline judge, frame the answer."""

    def __init__(self, proxy: Proxy, ex: Exchange, request: ChatRequest, scope: Scope) -> None:
        self.proxy = proxy
        self.ex = ex
        self.request = request
        self.query: bytes = scope["query_string"]
        self.out_headers = proxy.upstream.outbound_headers(scope["headers"], keep_encoding=False)

    async def _reask(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.proxy.upstream.complete(body, self.out_headers, self.ex.timer)

    async def _judge(self, completion: ChatCompletion) -> ChatOutcome:
        ex = self.ex
        try:
            outcome = await self.proxy.pipeline.judge(
                self.request, completion, self._reask, ex.record
            )
        finally:
            ex.snapshot = self.request.snapshot
            ex.channels = tuple(c.channel for c in ex.record.caught)
            ex.repairs = ex.record.repair_attempts
        ex.channels = outcome.caught
        ex.repair_failed = outcome.repair_failed
        return outcome

    async def buffered(self, responder: Responder) -> None:
        ex = self.ex
        reply = await self.proxy.upstream.request(
            "POST", _CHAT, self.out_headers, self.request.forward_raw, ex.timer, self.query
        )
        content = reply.content
        if 200 <= reply.status_code < 300:
            outcome = await self._judge(_completion_of(reply))
            if outcome.changed:
                content = orjson.dumps(outcome.answer)
        else:
            ex.record.outcome = Outcome.UPSTREAM_ERROR
        ex.status = reply.status_code
        ex.response_body = content if self.proxy.settings.log_bodies else None
        headers = response_headers(reply.headers)
        headers.extend(ex.proxy_headers())
        responder.first_byte_at = time.perf_counter()
        await responder.whole(reply.status_code, headers, content)

    async def stream(self, responder: Responder) -> None:
        ex = self.ex
        upstream = self.proxy.upstream
        async with upstream.stream(
            "POST", _CHAT, self.out_headers, self.request.forward_raw, ex.timer, self.query
        ) as response:
            base_headers = response_headers(response.headers)
            content_type = response.header(b"content-type") or b""
            if response.status_code != 200 or b"text/event-stream" not in content_type:
                with upstream.reading():
                    content = await response.read()
                ex.status = response.status_code
                if response.status_code >= 300:
                    ex.record.outcome = Outcome.UPSTREAM_ERROR
                base_headers.extend(ex.proxy_headers())
                await responder.whole(response.status_code, base_headers, content)
                return
            ex.status = 200
            with upstream.reading():
                chunks = timed(response.iter_body(), ex.timer)
                if self.request.tools is None:
                    await self._relay_plain(chunks, responder, base_headers)
                else:
                    await self._relay_gated(chunks, responder, base_headers)

    async def _relay_plain(
        self, chunks: AsyncIterator[bytes], responder: Responder, headers: HeaderList
    ) -> None:
        headers.extend(self.ex.proxy_headers(verdict=False))
        await responder.start(200, headers)
        async for chunk in chunks:
            if responder.first_byte_at is None:
                responder.first_byte_at = time.perf_counter()
            await responder.body(chunk)
        await responder.body(b"", more=False)

    async def _relay_gated(
        self, chunks: AsyncIterator[bytes], responder: Responder, headers: HeaderList
    ) -> None:
        ex = self.ex
        parser = SSEParser()
        gate = ToolCallGate()
        upstream_error = False
        async for chunk in chunks:
            for event in parser.feed(chunk):
                upstream_error = upstream_error or _is_error_event(event.data)
                released = gate.feed(event)
                if released:
                    if not responder.started:
                        await responder.start(200, [*headers, *ex.proxy_headers(verdict=False)])
                        responder.first_byte_at = time.perf_counter()
                    await responder.body(b"".join(released))
        for event in parser.flush():
            upstream_error = upstream_error or _is_error_event(event.data)
            gate.feed(event)
        tail = list(gate.held)
        if upstream_error:  # the upstream's own in-band error: passed through, not "repaired"
            ex.record.outcome = Outcome.UPSTREAM_ERROR
        else:
            outcome = await self._judge(cast(ChatCompletion, gate.assembler.completion()))
            if outcome.changed:
                tail = completion_to_chunks(
                    outcome.answer,
                    gate.assembler.meta,
                    include_content=not gate.released_content,
                    include_role=not gate.released_content,
                    include_usage=self.request.include_usage,
                )
        if not responder.started:
            await responder.start(200, [*headers, *ex.proxy_headers()])
            responder.first_byte_at = time.perf_counter()
        else:
            trailer = ex.trailer_comment()
            if tail and tail[-1].strip() == DONE_EVENT.strip():
                tail.insert(len(tail) - 1, trailer)
            else:
                tail.append(trailer)
        await responder.body(b"".join(tail), more=False)


def _is_error_event(data: bytes | None) -> bool:
    if not data or b'"error"' not in data:
        return False
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(parsed, dict) and "error" in parsed and "choices" not in parsed
