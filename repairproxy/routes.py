"""The proxy's routes as plain ASGI handlers: chat completions, pass-through ``/v1/*``, health.

``POST /v1/chat/completions`` is the one route that reads answers: it compiles the declared tools,
accounts the episode's error budget, forwards the body (byte for byte unless the repair instruction
was added), validates the answer, runs the bounded repair loop, and adds ``X-Repairproxy-*``
headers. Plain ASGI (not Starlette endpoints): a stream's headers must wait for the verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from repairproxy.errors import (
    AuthenticationError,
    BadRequestError,
    BudgetExhaustedError,
    InvalidJSONBodyError,
    PayloadTooLargeError,
    RepairExhaustedError,
    RepairProxyError,
)
from repairproxy.repair import RepairMode, RepairPolicy, repair_completion, with_repair_instruction
from repairproxy.sessions import BudgetSnapshot, ErrorBudget, episode_id_for
from repairproxy.settings import Settings
from repairproxy.streaming import (
    DONE_EVENT,
    SSEParser,
    ToolCallGate,
    comment_event,
    completion_to_chunks,
)
from repairproxy.upstream import (
    HeaderList,
    Upstream,
    UpstreamReply,
    UpstreamStatusError,
    UpstreamTimer,
    response_headers,
    timed,
)
from repairproxy.validation import Channel, CompiledTools, MessageVerdict, ToolsCache

__all__ = ["Proxy"]

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_JSON = (b"content-type", b"application/json")
_REPAIR_HEADER = "x-repairproxy-repair"
_BUDGET_HEADER = "x-repairproxy-budget"
_REASKING = (RepairMode.REFLEXIVE, RepairMode.CONSTRAINED)
# Enum construction by value is slow on the hot path; a dict lookup is not.
_MODES = {mode.value: mode for mode in RepairMode}
# Bytes that may never reach a request line: controls, space, DEL and anything non-ASCII.
_NOT_URL_SAFE = re.compile(rb"[\x00-\x20\x7f-\xff]")


class ClientDisconnectedError(Exception):
    """The client went away; nothing is left to answer."""


@dataclass(slots=True)
class _Exchange:
    """Per-request state: what the headers and the one log line report."""

    started: float
    method: str
    path: str
    timer: UpstreamTimer = field(default_factory=UpstreamTimer)
    model: str | None = None
    episode_id: str | None = None
    stream: bool = False
    mode: str | None = None
    channels: tuple[str, ...] = ()
    repairs: int = 0
    status: int = 0
    snapshot: BudgetSnapshot | None = None
    request_body: bytes | None = None
    response_body: bytes | None = None

    def overhead_ms(self) -> float:
        return max((time.perf_counter() - self.started - self.timer.seconds) * 1000.0, 0.0)

    def proxy_headers(self, *, verdict: bool = True) -> HeaderList:
        """``X-Repairproxy-*`` headers; without ``verdict`` only what was known pre-answer."""
        out: HeaderList = []
        if verdict:
            out.append((b"x-repairproxy-tool-errors", ",".join(self.channels).encode()))
            out.append((b"x-repairproxy-repairs", str(self.repairs).encode()))
        if self.snapshot is not None:
            out.append(
                (b"x-repairproxy-episode-id", self.snapshot.episode_id.encode("latin-1", "replace"))
            )
            out.append((b"x-repairproxy-episode-errors", str(self.snapshot.errors).encode()))
            out.append((b"x-repairproxy-budget-remaining", str(self.snapshot.remaining).encode()))
            if self.snapshot.exhausted:
                out.append((b"x-repairproxy-budget-exhausted", b"true"))
        out.append((b"x-repairproxy-overhead-ms", f"{self.overhead_ms():.3f}".encode()))
        return out

    def trailer_comment(self) -> bytes:
        """The verdict for a stream whose headers left before it was known."""
        fields = {
            "tool-errors": ",".join(self.channels),
            "repairs": str(self.repairs),
            "overhead-ms": f"{self.overhead_ms():.3f}",
        }
        if self.snapshot is not None:
            fields["episode-errors"] = str(self.snapshot.errors)
            fields["budget-remaining"] = str(self.snapshot.remaining)
        return comment_event("x-repairproxy " + " ".join(f"{k}={v}" for k, v in fields.items()))


class _Responder:
    """Wraps ``send``, remembering whether the response started (later errors go in-band)."""

    __slots__ = ("_send", "started", "status")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.status = 0

    async def start(self, status: int, headers: HeaderList) -> None:
        self.started = True
        self.status = status
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, chunk: bytes, *, more: bool = True) -> None:
        await self._send({"type": "http.response.body", "body": chunk, "more_body": more})

    async def whole(self, status: int, headers: HeaderList, content: bytes) -> None:
        headers.append((b"content-length", str(len(content)).encode()))
        await self.start(status, headers)
        await self.body(content, more=False)


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


def _header_map(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


async def _read_body(receive: Receive, headers: Mapping[str, str], limit: int) -> bytes:
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"request body over the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnectedError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"request body over the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _cancel_on_disconnect(work: Awaitable[None], receive: Receive) -> None:
    """Run ``work``; if the client disconnects first, cancel it (closing the upstream request)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, watcher):
            if not pending.done():
                pending.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnectedError
    task.result()


def _invalid_call_ids(verdict: MessageVerdict) -> tuple[str | None, ...]:
    return tuple(c.call_id for c in verdict.calls if c.channel is not Channel.VALID)


def _first_message(completion: Mapping[str, Any]) -> Mapping[str, Any] | None:
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, dict) else None


class Proxy:
    """Route handlers bound to one app's upstream client, caches and budget store."""

    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        tools_cache: ToolsCache,
        budget: ErrorBudget,
        policies: Mapping[RepairMode, RepairPolicy],
        logger: Any,
    ) -> None:
        self.settings = settings
        self.upstream = upstream
        self.tools_cache = tools_cache
        self.budget = budget
        self.policies = policies
        self.log = logger
        self._api_keys = tuple(key.encode() for key in settings.api_keys)

    # -- dispatch -------------------------------------------------------------------------------

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        exchange = _Exchange(time.perf_counter(), method, path)
        responder = _Responder(send)
        try:
            if path == "/v1/chat/completions" and method == "POST":
                await self._chat(scope, receive, responder, exchange)
            elif path.startswith("/v1/"):
                await self._passthrough(scope, receive, responder, exchange)
            elif path == "/healthz":
                await responder.whole(200, [_JSON], b'{"status":"ok"}')
            elif path == "/readyz":
                ready = await self.upstream.ready()
                await responder.whole(
                    200 if ready else 503,
                    [_JSON],
                    b'{"status":"ready"}' if ready else b'{"status":"upstream unreachable"}',
                )
            else:
                error = RepairProxyError(f"no route for {method} {path}", code="not_found")
                error.status_code, error.error_type = 404, "invalid_request_error"
                await self._send_error(responder, exchange, error)
        except ClientDisconnectedError:
            exchange.status = 499  # nginx's "client closed request", for the log only
        except UpstreamStatusError as exc:
            await self._send_reply(responder, exchange, exc.reply)
        except RepairProxyError as exc:
            await self._send_error(responder, exchange, exc)
        except Exception as exc:  # the process must survive any bug in one request
            self.log.exception("unhandled", path=path, error=repr(exc))
            error = RepairProxyError(f"internal proxy error: {type(exc).__name__}")
            await self._send_error(responder, exchange, error)
        finally:
            if path.startswith("/v1/"):
                self._log(exchange, responder)

    # -- chat completions -----------------------------------------------------------------------

    async def _chat(
        self, scope: Scope, receive: Receive, responder: _Responder, ex: _Exchange
    ) -> None:
        headers = _header_map(scope)
        self._authenticate(headers)  # before reading: an unknown client gets no buffer
        if scope["query_string"]:
            _raw_target(scope)  # the query goes upstream as sent: refuse what a URL cannot hold
        raw = await _read_body(receive, headers, self.settings.max_body_bytes)
        ex.request_body = raw if self.settings.log_bodies else None
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidJSONBodyError(f"the request body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise InvalidJSONBodyError("the request body must be a JSON object")
        model = body.get("model")
        ex.model = model if isinstance(model, str) else None
        ex.stream = body.get("stream") is True
        tools = self.tools_cache.compile(body)
        mode = self._mode(headers)
        ex.mode = mode.value
        budget = self._budget(headers)
        ex.episode_id = episode_id_for(headers, body, self.settings.episode_header)
        ex.snapshot = await self.budget.observe_request(ex.episode_id, body, budget)
        if ex.snapshot.exhausted and self.settings.on_budget_exhausted == "reject":
            raise BudgetExhaustedError(
                f"episode {ex.episode_id} spent its error budget "
                f"({ex.snapshot.errors} errors, budget {ex.snapshot.budget})"
            )
        forward: Mapping[str, Any] = body
        forward_raw = raw
        if tools is not None and mode is not RepairMode.OFF:
            forward = with_repair_instruction(body, self.policies[mode].template)
            forward_raw = orjson.dumps(forward)
        out_headers = self.upstream.outbound_headers(scope["headers"], keep_encoding=False)
        call = _ChatCall(
            self, ex, forward, forward_raw, out_headers, scope["query_string"], tools, mode, budget
        )
        if ex.stream:
            await _cancel_on_disconnect(call.stream(responder), receive)
        else:
            await call.buffered(responder)

    # -- other routes ---------------------------------------------------------------------------

    async def _passthrough(
        self, scope: Scope, receive: Receive, responder: _Responder, ex: _Exchange
    ) -> None:
        headers = _header_map(scope)
        self._authenticate(headers)  # before reading: an unknown client gets no buffer
        target = _raw_target(scope)
        raw = await _read_body(receive, headers, self.settings.max_body_bytes)
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

        await _cancel_on_disconnect(relay(), receive)

    # -- helpers --------------------------------------------------------------------------------

    def _authenticate(self, headers: Mapping[str, str]) -> None:
        if not self._api_keys:
            return
        given = headers.get("authorization", "")
        token = given[7:].strip().encode() if given[:7].lower() == "bearer " else b""
        # Compare against every key, always, so timing does not reveal which prefix matched.
        matched = False
        for key in self._api_keys:
            matched |= hmac.compare_digest(token, key)
        if not matched:
            raise AuthenticationError("missing or invalid API key for the proxy")

    def _mode(self, headers: Mapping[str, str]) -> RepairMode:
        override = headers.get(_REPAIR_HEADER)
        value = override.strip().lower() if override else self.settings.repair
        mode = _MODES.get(value)
        if mode is not None:
            return mode
        raise BadRequestError(
            f"X-Repairproxy-Repair must be one of {', '.join(_MODES)}", param=_REPAIR_HEADER
        )

    def _budget(self, headers: Mapping[str, str]) -> int | None:
        override = headers.get(_BUDGET_HEADER)
        if override is None:
            return None
        value = override.strip()
        if not value.isdigit():
            raise BadRequestError(
                "X-Repairproxy-Budget must be a non-negative integer", param=_BUDGET_HEADER
            )
        return int(value)

    async def _send_reply(self, responder: _Responder, ex: _Exchange, reply: UpstreamReply) -> None:
        if responder.started:
            return
        headers = response_headers(reply.headers)
        headers.extend(ex.proxy_headers())
        ex.status = reply.status_code
        await responder.whole(reply.status_code, headers, reply.content)

    async def _send_error(
        self, responder: _Responder, ex: _Exchange, error: RepairProxyError
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

    def _log(self, ex: _Exchange, responder: _Responder) -> None:
        status = ex.status or responder.status
        event: dict[str, Any] = {
            "method": ex.method,
            "path": ex.path,
            "status": status,
            "model": ex.model,
            "episode_id": ex.episode_id,
            "stream": ex.stream,
            "mode": ex.mode,
            "channels": list(ex.channels),
            "repairs": ex.repairs,
            "latency_ms": round((time.perf_counter() - ex.started) * 1000.0, 3),
            "overhead_ms": round(ex.overhead_ms(), 3),
            "upstream_calls": ex.timer.calls,
        }
        if ex.snapshot is not None:
            event["episode_errors"] = ex.snapshot.errors
            event["budget_remaining"] = ex.snapshot.remaining
        if self.settings.log_bodies:
            event["request_body"] = (
                ex.request_body.decode("utf-8", "replace") if ex.request_body else None
            )
            event["response_body"] = (
                ex.response_body.decode("utf-8", "replace") if ex.response_body else None
            )
        self.log.info("request", **event)


class _ChatCall:
    """One chat completion in flight: forward, validate, repair, answer (buffered or streamed)."""

    def __init__(
        self,
        proxy: Proxy,
        ex: _Exchange,
        forward: Mapping[str, Any],
        forward_raw: bytes,
        out_headers: HeaderList,
        query: bytes,
        tools: CompiledTools | None,
        mode: RepairMode,
        budget: int | None,
    ) -> None:
        self.proxy = proxy
        self.ex = ex
        self.forward = forward
        self.forward_raw = forward_raw
        self.out_headers = out_headers
        self.query = query
        self.tools = tools
        self.mode = mode
        self.budget = budget

    async def _reask(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.proxy.upstream.complete(body, self.out_headers, self.ex.timer)

    async def _judge(
        self, completion: dict[str, Any], body: Mapping[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        """Validate (and maybe repair) one answer: the answer to send, and whether it changed."""
        assert self.tools is not None
        message = _first_message(completion)
        if message is None:
            return completion, False
        verdict: MessageVerdict = self.tools.check_message(message)
        if verdict.ok or self.mode not in _REASKING:
            self.ex.channels = tuple(c.value for c in verdict.error_channels)
            await self._observe(verdict, _invalid_call_ids(verdict))
            return completion, False
        policy = self.proxy.policies[self.mode]
        try:
            outcome = await repair_completion(body, completion, self.tools, policy, self._reask)
        except RepairExhaustedError as exc:
            self.ex.channels = tuple(str(c) for c in exc.channels)
            self.ex.repairs = exc.attempts
            await self._observe(verdict, ())  # the client gets an error, not the calls
            raise
        self.ex.channels = tuple(c.value for c in outcome.caught)
        self.ex.repairs = outcome.attempts
        changed = outcome.attempts > 0 or outcome.response != completion
        await self._observe(outcome.first_verdict, outcome.delivered_invalid_call_ids)
        return outcome.response, changed

    async def _observe(
        self, first: MessageVerdict, delivered_invalid: Iterable[str | None]
    ) -> None:
        """Charge the first answer's errors; remember invalid calls the client will still see."""
        ex = self.ex
        if ex.episode_id is None:
            return
        ex.snapshot = await self.proxy.budget.observe_answer(
            ex.episode_id, first.error_channels, self.budget, delivered_call_ids=delivered_invalid
        )

    async def buffered(self, responder: _Responder) -> None:
        ex = self.ex
        reply = await self.proxy.upstream.request(
            "POST", "/v1/chat/completions", self.out_headers, self.forward_raw, ex.timer, self.query
        )
        content = reply.content
        if self.tools is not None and 200 <= reply.status_code < 300:
            try:
                completion = orjson.loads(content)
            except orjson.JSONDecodeError:
                completion = None
            if isinstance(completion, dict):
                answer, changed = await self._judge(completion, self.forward)
                if changed:
                    content = orjson.dumps(answer)
        ex.status = reply.status_code
        ex.response_body = content if self.proxy.settings.log_bodies else None
        headers = response_headers(reply.headers)
        headers.extend(ex.proxy_headers())
        await responder.whole(reply.status_code, headers, content)

    async def stream(self, responder: _Responder) -> None:
        ex = self.ex
        upstream = self.proxy.upstream
        async with upstream.stream(
            "POST", "/v1/chat/completions", self.out_headers, self.forward_raw, ex.timer, self.query
        ) as response:
            base_headers = response_headers(response.headers)
            content_type = response.header(b"content-type") or b""
            if response.status_code != 200 or b"text/event-stream" not in content_type:
                with upstream.reading():
                    content = await response.read()
                ex.status = response.status_code
                base_headers.extend(ex.proxy_headers())
                await responder.whole(response.status_code, base_headers, content)
                return
            ex.status = 200
            with upstream.reading():
                chunks = timed(response.iter_body(), ex.timer)
                if self.tools is None:
                    await self._relay_plain(chunks, responder, base_headers)
                else:
                    await self._relay_gated(chunks, responder, base_headers)

    async def _relay_plain(
        self, chunks: AsyncIterator[bytes], responder: _Responder, headers: HeaderList
    ) -> None:
        headers.extend(self.ex.proxy_headers(verdict=False))
        await responder.start(200, headers)
        async for chunk in chunks:
            await responder.body(chunk)
        await responder.body(b"", more=False)

    async def _relay_gated(
        self, chunks: AsyncIterator[bytes], responder: _Responder, headers: HeaderList
    ) -> None:
        ex = self.ex
        parser = SSEParser()
        gate = ToolCallGate()
        async for chunk in chunks:
            for event in parser.feed(chunk):
                released = gate.feed(event)
                if released:
                    if not responder.started:
                        early = [*headers, *ex.proxy_headers(verdict=False)]
                        await responder.start(200, early)
                    await responder.body(b"".join(released))
        for event in parser.flush():
            gate.feed(event)
        first = gate.assembler.completion()
        options = self.forward.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        reask_body = {
            k: v for k, v in self.forward.items() if k not in ("stream", "stream_options")
        }
        answer, changed = await self._judge(first, reask_body)
        if changed:
            tail = completion_to_chunks(
                answer,
                gate.assembler.meta,
                include_content=not gate.released_content,
                include_role=not gate.released_content,
                include_usage=include_usage,
            )
        else:
            tail = list(gate.held)
        if not responder.started:
            await responder.start(200, [*headers, *ex.proxy_headers()])
        else:
            trailer = ex.trailer_comment()
            if tail and tail[-1].strip() == DONE_EVENT.strip():
                tail.insert(len(tail) - 1, trailer)
            else:
                tail.append(trailer)
        await responder.body(b"".join(tail), more=False)
