"""``POST /v1/messages`` framed over HTTP: one JSON answer, or Anthropic's event stream whose
``tool_use`` blocks are held until the pipeline has judged the whole answer.

The decisions are the chat pipeline's (``pipeline.py``), reached through the adapter in
``wire/messages.py``. Two upstream kinds (``Settings.native_apis``): one that serves
``/v1/messages`` gets the request in its own shape, re-asks included; one that serves chat
completions only (the embedded model, llama.cpp) gets the chat view, and its answer is turned into
a Messages answer here, streamed as the events a Messages stream has. The answer keeps the first
upstream message's id; its usage counts every attempt. Text flows until it could open a call
written as text (the chat stream gate decides, per text block); ``ping`` events keep a stream
alive while a held call is repaired. A structured output (``output_config.format``) is held
whole until it is valid, as chat's ``response_format`` is.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any, cast

import orjson

from repairproxy.asgi.call import PipelineCall, answer_of
from repairproxy.asgi.chat_upstream import (
    CHAT_PATH,
    ChatTextRelay,
    ask_chat_stream,
    keep_alive,
    payload_of,
)
from repairproxy.asgi.exchange import Exchange
from repairproxy.asgi.gate import SSEEvent, SSEParser, ToolCallGate
from repairproxy.asgi.responder import Responder
from repairproxy.asgi.threads import (
    MessageThreads,
    ThreadTurn,
    apply_tool_changes,
    without_threads_beta,
)
from repairproxy.episodes.budget import EpisodeRef
from repairproxy.errors import (
    BadRequestError,
    UpstreamStatusError,
    UpstreamUnavailableError,
)
from repairproxy.pipeline import ChatPipeline, ChatRequest, Decision, instructs, json_object
from repairproxy.types import API, HeaderList, Outcome, Scope
from repairproxy.upstream.client import Upstream, UpstreamReply, chat_completion_of
from repairproxy.validation import text_calls_allowed
from repairproxy.wire.fields import chat_only_fields
from repairproxy.wire.messages import (
    error_body,
    from_chat_completion,
    message_events,
    messages_request,
    to_chat_body,
    to_chat_completion,
    to_message,
    with_system_instruction,
)
from repairproxy.wire.openai import ChatCompletion

__all__ = ["MESSAGES_PATH", "MessagesCall", "error_event", "sse"]

MESSAGES_PATH = "/v1/messages"
# While a held call is re-asked, the client gets a ping every ``KEEP_ALIVE_SECONDS`` (Anthropic
# pings idle streams).
_PING = b'event: ping\ndata: {"type":"ping"}\n\n'
_JSON = (b"content-type", b"application/json")
_SSE = (b"content-type", b"text/event-stream; charset=utf-8")


def sse(event: Mapping[str, Any]) -> bytes:
    """One Messages stream event: its ``event:`` line, then its data."""
    return (
        b"event: " + str(event.get("type")).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
    )


def error_event(status: int, message: str) -> bytes:
    """An error once a Messages stream has started: one ``error`` event in Anthropic's shape."""
    return sse(error_body(status, message))


def _anthropic_error(reply: UpstreamReply) -> UpstreamReply:
    """A chat upstream's error answer in Anthropic's shape (status kept, message carried over)."""
    try:
        body = orjson.loads(reply.content)
    except orjson.JSONDecodeError:
        body = None
    message = f"the upstream answered {reply.status_code}"
    if isinstance(body, dict):
        inner = body.get("error")
        found = inner.get("message") if isinstance(inner, dict) else body.get("message")
        if isinstance(found, str):
            message = found
    headers = [(n, v) for n, v in reply.headers if n.lower() != b"content-type"]
    content = orjson.dumps(error_body(reply.status_code, message))
    return UpstreamReply(reply.status_code, [*headers, _JSON], content)


class _Block:
    """One content block of a streamed answer, assembled from its events."""

    __slots__ = ("parts", "signature", "start", "stopped")

    def __init__(self, start: Mapping[str, Any]) -> None:
        self.start = dict(start)
        self.parts: list[str] = []
        self.signature = ""
        self.stopped = False

    @property
    def kind(self) -> Any:
        return self.start.get("type")

    def add(self, delta: Mapping[str, Any]) -> None:
        kind = delta.get("type")
        if kind == "text_delta":
            self.parts.append(str(delta.get("text", "")))
        elif kind == "input_json_delta":
            self.parts.append(str(delta.get("partial_json", "")))
        elif kind == "thinking_delta":
            self.parts.append(str(delta.get("thinking", "")))
        elif kind == "signature_delta":
            self.signature += str(delta.get("signature", ""))

    def whole(self) -> dict[str, Any]:
        joined = "".join(self.parts)
        if self.kind == "text":
            return {**self.start, "text": str(self.start.get("text", "")) + joined}
        if self.kind == "tool_use":
            if not joined.strip():
                return {**self.start, "input": self.start.get("input") or {}}
            try:
                value: Any = orjson.loads(joined)
            except orjson.JSONDecodeError:
                value = joined  # broken JSON: the judge sees it as such
            return {**self.start, "input": value}
        if self.kind == "thinking":
            signature = self.signature or self.start.get("signature", "")
            return {**self.start, "thinking": joined, "signature": signature}
        return dict(self.start)


class MessagesCall(PipelineCall):
    """One ``/v1/messages`` request in flight."""

    api = API.MESSAGES

    def __init__(
        self,
        upstream: Upstream,
        pipeline: ChatPipeline,
        ex: Exchange,
        scope: Scope,
        headers: Mapping[str, str],
        *,
        native: bool,
        threads: MessageThreads | None = None,
    ) -> None:
        super().__init__(upstream, pipeline, ex, scope, headers)
        self.native = native
        self.threads = threads  # the proxy's message threads (threads.py); None: not offered
        self.thread: ThreadTurn | None = None  # this request's, when it sent ``thread``
        self.tenant = ""
        self._thread_whole: dict[str, Any] = {}  # the threaded turn, whole, as kept
        if not native:  # Anthropic's headers mean nothing to a chat upstream
            self.out_headers = [
                (n, v) for n, v in self.out_headers if not n.startswith(b"anthropic-")
            ]
        self.body: dict[str, Any] = {}
        self.forward: dict[str, Any] = {}
        self.stream = False
        self._first: dict[str, Any] | None = None  # the first upstream answer (id, thinking)
        self._final: dict[str, Any] | None = None  # the Messages answer delivered
        self._reasked: list[dict[str, Any]] = []  # the re-asks' answers (native), in order

    # -- before the upstream ----------------------------------------------------------------------

    async def prepare(self, raw: bytes) -> ChatRequest:
        """Parse, find the episode (a header, else the history), count the history's error
        results, and build the body that goes upstream."""
        ex, pipeline = self.ex, self.pipeline
        body = json_object(raw)
        for name, kinds in (("messages", (list,)), ("tools", (list,)), ("system", (str, list))):
            if body.get(name) is not None and not isinstance(body[name], kinds):
                raise BadRequestError(f"'{name}' has the wrong type", param=name)
        if not isinstance(body.get("messages"), list):
            raise BadRequestError("'messages' is required", param="messages")
        if not self.native:  # what a chat-only upstream cannot do: refused or named
            self.ex.dropped = chat_only_fields("messages", body)
        ahead, stored_episode = await self._open_thread(body)
        if self.thread is not None:
            raw = orjson.dumps(body)  # the whole turn, without ``thread``
        self.body = body
        self.stream = body.get("stream") is True
        chat = to_chat_body(body)
        chat.pop("stream", None)  # re-asks and translated requests are answered whole

        async def linked() -> EpisodeRef | None:
            """The header's episode read with the thread, else the episode of the answer a
            thread continues (no header sent)."""
            if ahead is not None:
                return ahead
            if stored_episode and pipeline.settings.episode_header not in self.headers:
                return EpisodeRef(stored_episode, explicit=False, new=False, tenant=self.tenant)
            return None

        request = await self._open(chat, raw, episode=linked)
        ex.record.stream = self.stream
        if self.native:
            forward = body
            if request.tools is not None and instructs(request.mode):
                instruction = pipeline.policies[request.mode].template.instruction
                forward = with_system_instruction(body, instruction)
            self.forward = forward
            request.forward = request.body
            request.forward_raw = raw if forward is body else orjson.dumps(forward)
        else:
            pipeline.prepare_forward(request)
            if request.forward_raw is raw:  # unchanged: still the Messages bytes, not chat's
                request.forward_raw = orjson.dumps(request.body)
        return request

    async def _open_thread(self, body: dict[str, Any]) -> tuple[EpisodeRef | None, str | None]:
        """A threaded request made whole (threads.py): ``thread`` taken out, the stored history,
        ``system`` and ``tools`` put in, tool changes applied, the threads beta dropped from
        what goes upstream. The header's episode when it was read with the thread (one round
        trip to a shared store), and the episode id of the answer it continues, if any."""
        if self.threads is None or "thread" not in body:
            return None, None
        self.tenant = self.pipeline.episodes.tenant_of(self.headers)
        turn, ahead = await self._with_episode(self.threads.open(self.tenant, body))
        assert turn is not None  # "thread" is in body
        self.thread = turn
        # Kept as the client would have sent it whole (tool changes in place, the tools it
        # created the thread with), so a later reference resolves against those.
        self._thread_whole = {**body, "messages": list(body["messages"])}
        tools, messages = apply_tool_changes(body.get("tools"), body["messages"])
        body["messages"] = messages
        if tools is not None:
            body["tools"] = tools
        headers: HeaderList = []
        for name, value in self.out_headers:
            if name == b"anthropic-beta":
                kept = without_threads_beta(value)
                if kept is None:
                    continue
                value = kept
            headers.append((name, value))
        self.out_headers = headers
        return ahead, turn.previous.episode_id if turn.previous is not None else None

    async def finish(self, delivered: bool) -> None:
        """After the answer left, however it ended: the episode's write and, for a delivered
        threaded answer, the thread's latest message, together (one round trip to a shared
        store); the thread is closed."""
        turn, threads = self.thread, self.threads
        if turn is None or threads is None:
            await self.settle()
            return
        try:
            writes = [self.settle()]
            final = self._final
            if delivered and final is not None and final.get("type", "message") == "message":
                request = self.request
                episode = request.episode.id if request is not None and request.episode else None
                writes.append(threads.record(self.tenant, turn, self._thread_whole, final, episode))
            await self._together(*writes)
        finally:
            threads.close(turn)

    async def _reask(self, chat_body: dict[str, Any]) -> dict[str, Any]:
        """The pipeline's re-ask: in Messages' shape to a native upstream, else as it is."""
        assert self.request is not None
        if not self.native:
            reply = await self.upstream.request(
                "POST", CHAT_PATH, self.out_headers, orjson.dumps(chat_body), self.ex.timer
            )
            if not 200 <= reply.status_code < 300:
                raise UpstreamStatusError(_anthropic_error(reply))
            return cast(dict[str, Any], chat_completion_of(reply.content, reply.status_code))
        history = len(self.request.body.get("messages") or ())
        template = self.pipeline.policies[self.request.mode].template
        # The answers the repair turns repeat, in order: the first, then each re-ask's.
        repeated = [a for a in (self._first, *self._reasked) if a is not None]
        payload = messages_request(
            self.forward, history, chat_body, template.render("valid_sibling"), repeated
        )
        reply = await self.upstream.request(
            "POST",
            MESSAGES_PATH,
            self.out_headers,
            orjson.dumps(payload),
            self.ex.timer,
            self.query,
        )
        if not 200 <= reply.status_code < 300:
            raise UpstreamStatusError(reply)
        answer = answer_of(reply, items="content", shape="Messages")
        self._reasked.append(answer)
        return to_chat_completion(answer)

    def _delivered(self, outcome: Decision) -> ChatCompletion:
        """The Messages answer to deliver (kept as ``_final``); remembered as what the client
        will send back, its chat view, so chaining finds it."""
        answer = cast(dict[str, Any], outcome.answer)
        if self._first is not None:
            final = to_message(answer, self._first) if outcome.changed else self._first
        else:
            final = from_chat_completion(answer, self.body.get("model"))
        self._final = final
        return cast(ChatCompletion, to_chat_completion(final))

    async def _judge(self, completion: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """The Messages answer to deliver and whether it differs from the upstream's first."""
        outcome = await self._decide(cast(ChatCompletion, completion))
        assert self._final is not None
        return self._final, outcome.changed or self._first is None

    # -- buffered ---------------------------------------------------------------------------------

    async def _first_answer(self) -> tuple[UpstreamReply, dict[str, Any] | None]:
        """The upstream's answer to the forwarded request and its chat view (None: not 2xx)."""
        assert self.request is not None
        path = MESSAGES_PATH if self.native else CHAT_PATH
        reply = await self.upstream.request(
            "POST", path, self.out_headers, self.request.forward_raw, self.ex.timer, self.query
        )
        if not 200 <= reply.status_code < 300:
            self.ex.record.outcome = Outcome.UPSTREAM_ERROR
            return (reply if self.native else _anthropic_error(reply)), None
        if self.native:
            self._first = answer_of(reply, items="content", shape="Messages")
            return reply, to_chat_completion(self._first)
        return reply, cast(dict[str, Any], chat_completion_of(reply.content, reply.status_code))

    async def buffered(self, responder: Responder) -> None:
        reply, completion = await self._first_answer()
        if completion is None:
            await self.send_whole(responder, reply, reply.content)
            return
        final, changed = await self._judge(completion)
        content = orjson.dumps(final) if changed else reply.content
        await self.send_whole(responder, reply, content)

    # -- streamed ---------------------------------------------------------------------------------

    async def stream_answer(self, responder: Responder) -> None:
        if not self.native:
            await self._translated_stream(responder)
            return
        assert self.request is not None
        await self._stream(MESSAGES_PATH, self.request.forward_raw, responder, self._relay)

    async def _translated_stream(self, responder: Responder) -> None:
        """A chat upstream's stream, gated as chat streams are (prose flows, calls and text that
        could be a call are held), re-framed as Messages events; the rest once judged."""

        async def whole(completion: ChatCompletion) -> None:
            final, _ = await self._judge(completion)
            await self._events(responder, message_events(final))

        async def relay(chunks: AsyncIterable[bytes]) -> None:
            await self._relay_chat(chunks, responder)

        await ask_chat_stream(self, responder, relay=relay, whole=whole, error=_anthropic_error)

    async def _events(self, responder: Responder, events: list[dict[str, Any]]) -> None:
        """Events to end the stream with: the whole stream (headers with the verdict) when
        nothing went out yet, else the rest with the verdict comment before the last one."""
        ex = self.ex
        framed = [sse(event) for event in events]
        if not responder.started:
            headers: HeaderList = [_SSE, (b"cache-control", b"no-cache"), *ex.proxy_headers()]
            await responder.start(200, headers)
            responder.first_byte_at = time.perf_counter()
        else:
            framed.insert(max(len(framed) - 1, 0), ex.trailer_comment())
        await responder.body(b"".join(framed), more=False)

    async def _relay_chat(self, chunks: AsyncIterable[bytes], responder: Responder) -> None:
        message_id = f"msg_{secrets.token_hex(12)}"
        model = self.body.get("model")

        def frames(piece: str, meta: Mapping[str, Any] | None) -> bytes:
            out: list[dict[str, Any]] = []
            if meta is not None:  # the first piece: the message and its text block open
                started: dict[str, Any] = {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 0, "output_tokens": 0},
                }
                block = {"type": "text", "text": ""}
                out += [
                    {"type": "message_start", "message": started},
                    {"type": "ping"},
                    {"type": "content_block_start", "index": 0, "content_block": block},
                ]
            delta = {"type": "text_delta", "text": piece}
            out.append({"type": "content_block_delta", "index": 0, "delta": delta})
            return b"".join(sse(e) for e in out)

        text = ChatTextRelay(self, responder, [_SSE, (b"cache-control", b"no-cache")], frames)
        await text.run(chunks)
        final, _ = await keep_alive(responder, self._judge(text.completion()), _PING)
        final["id"] = message_id
        if not text.sent:
            await self._events(responder, message_events(final, preamble=not responder.started))
            return
        content = list(final.get("content") or ())
        more = text.rest(
            "".join(str(b.get("text", "")) for b in content if b.get("type") == "text")
        )
        events: list[dict[str, Any]] = []
        if more:
            delta = {"type": "text_delta", "text": more}
            events.append({"type": "content_block_delta", "index": 0, "delta": delta})
        events.append({"type": "content_block_stop", "index": 0})
        others = [b for b in content if b.get("type") != "text"]
        shown = {**final, "content": [{}, *others]}
        await self._events(
            responder, [*events, *message_events(shown, first_block=1, preamble=False)]
        )

    async def _relay(
        self, chunks: AsyncIterator[bytes], responder: Responder, headers: HeaderList
    ) -> None:
        """Release ``message_start``, pings, thinking and prose at once, in block order; hold
        ``tool_use`` blocks, text from where it could open a call written as text (the chat
        stream gate decides, per text block), every block after a held one and the closing
        events until ``message_stop``, then judge the whole answer."""
        ex = self.ex
        request = self.request
        # A structured output (output_config.format) has no prose to let through: every event
        # is held, message_start included, so the headers carry the verdict.
        hold_all = request is not None and request.output is not None
        gated = hold_all or (request is not None and request.tools is not None)
        hold_text = request is not None and text_calls_allowed(request.body)
        # A declared tool's name at a line start may open a call written without a marker.
        tool_names = request.tools.names if request is not None and request.tools else ()
        parser = SSEParser()
        blocks: dict[int, _Block] = {}
        gates: dict[int, ToolCallGate] = {}  # text blocks at the front, watched for a call
        pending: dict[int, list[bytes]] = {}  # held events, by block
        front = 0  # blocks before it went out whole; it is the one streaming (or held)
        stuck = False  # the front block is held: it and every later block wait for the verdict
        tail: list[bytes] = []  # message_delta, message_stop and anything unindexed
        start: dict[str, Any] | None = None
        closing: dict[str, Any] = {}
        usage: dict[str, Any] = {}
        failed = completed = False

        async def release(*raws: bytes) -> None:
            if not responder.started:
                await responder.start(200, [*headers, *ex.proxy_headers(verdict=False)])
                responder.first_byte_at = time.perf_counter()
            for raw in raws:
                await responder.body(raw)

        def held() -> list[bytes]:
            return [*(raw for i in sorted(pending) for raw in pending[i]), *tail]

        async for chunk in chunks:
            for event in parser.feed(chunk):
                payload = payload_of(event.data)
                kind = payload.get("type")
                index = payload.get("index")
                if kind == "message_start" and isinstance(payload.get("message"), dict):
                    start = payload["message"]
                    if isinstance(start.get("usage"), dict):
                        usage.update(start["usage"])
                elif kind == "content_block_start" and isinstance(index, int):
                    blocks[index] = _Block(payload.get("content_block") or {})
                elif kind == "content_block_delta" and isinstance(index, int) and index in blocks:
                    blocks[index].add(payload.get("delta") or {})
                elif kind == "content_block_stop" and isinstance(index, int) and index in blocks:
                    blocks[index].stopped = True
                elif kind == "message_delta":
                    if isinstance(payload.get("delta"), dict):
                        closing.update(payload["delta"])
                    if isinstance(payload.get("usage"), dict):
                        usage.update(payload["usage"])
                elif kind == "message_stop":
                    completed = True
                failed = failed or kind == "error"
                if not gated or failed:
                    await release(*held(), event.raw)
                    pending.clear()
                    tail.clear()
                    continue
                if hold_all:
                    tail.append(event.raw)
                    continue
                if kind in ("message_start", "ping"):
                    await release(event.raw)  # says nothing about the answer's content
                    continue
                if not isinstance(index, int):
                    tail.append(event.raw)
                    continue
                if stuck or index != front or index not in blocks:
                    pending.setdefault(index, []).append(event.raw)
                    continue
                block = blocks[index]
                if kind == "content_block_start":
                    if block.kind == "tool_use":
                        pending.setdefault(index, []).append(event.raw)
                        stuck = True
                    elif block.kind == "text" and hold_text:
                        gates[index] = ToolCallGate(tool_names=tool_names)
                        gates[index].feed(SSEEvent(event.raw, None))  # held with the text
                    else:
                        await release(event.raw)  # thinking, server tools, text that is text
                elif kind == "content_block_delta" and index in gates:
                    piece = (payload.get("delta") or {}).get("text", "")
                    chat = {"choices": [{"index": 0, "delta": {"content": str(piece)}}]}
                    await release(*gates[index].feed(SSEEvent(event.raw, orjson.dumps(chat))))
                elif kind == "content_block_stop" and index in gates and gates[index].held:
                    pending[index] = [*gates[index].held, event.raw]  # a call may open here
                    stuck = True
                elif kind == "content_block_stop":
                    await release(event.raw)
                    front += 1
                else:
                    await release(event.raw)
        for event in parser.flush():
            tail.append(event.raw)
        if failed or not gated:
            if failed:
                ex.record.outcome = Outcome.UPSTREAM_ERROR
            await self._finish(responder, headers, held())
            return
        if start is None or not completed:
            raise UpstreamUnavailableError("the upstream's event stream ended before message_stop")
        first = {
            **start,
            "content": [blocks[i].whole() for i in sorted(blocks)],
            "stop_reason": closing.get("stop_reason", start.get("stop_reason")),
            "stop_sequence": closing.get("stop_sequence", start.get("stop_sequence")),
            "usage": usage,
        }
        self._first = first
        final, changed = await keep_alive(responder, self._judge(to_chat_completion(first)), _PING)
        if not changed:
            await self._finish(responder, headers, held())
            return
        if not responder.started:  # all of it was held: the whole answer, message_start first
            await self._finish(responder, headers, [sse(event) for event in message_events(final)])
            return
        gate = gates.get(front)
        partial = gate if gate is not None and gate.released_content else None
        events = self._rest(final, first, front, partial)
        await self._finish(responder, headers, [sse(event) for event in events])

    @staticmethod
    def _rest(
        final: dict[str, Any], first: dict[str, Any], sent: int, partial: ToolCallGate | None
    ) -> list[dict[str, Any]]:
        """The events still to send for ``final`` when ``first``'s first ``sent`` blocks went
        out whole, and (``partial``) the next one, a text block, in part: that block's text
        after what was sent (when ``final`` still begins with it) and its stop, then the
        blocks after those (or only the calls, when ``final`` begins differently)."""
        content = list(final.get("content") or ())
        types = [b.get("type") for b in (first.get("content") or ())[:sent]]
        rest = (
            content[sent:]
            if [b.get("type") for b in content[:sent]] == types
            else [b for b in content if b.get("type") == "tool_use"]
        )
        events: list[dict[str, Any]] = []
        if partial is not None:
            text = ""
            if rest and rest[0].get("type") == "text":
                text = str(rest.pop(0).get("text", ""))
            left = partial.unsent({"choices": [{"message": {"content": text}}]})
            more = left["choices"][0]["message"].get("content")
            if more:
                delta = {"type": "text_delta", "text": more}
                events.append({"type": "content_block_delta", "index": sent, "delta": delta})
            events.append({"type": "content_block_stop", "index": sent})
            sent += 1
        shown = {**final, "content": [*([{}] * sent), *rest]}
        return [*events, *message_events(shown, first_block=sent, preamble=False)]

    async def _finish(self, responder: Responder, headers: HeaderList, tail: list[bytes]) -> None:
        """The held events; a stream whose headers already left gets the verdict as an SSE
        comment just before its last event."""
        if not responder.started:
            await responder.start(200, [*headers, *self.ex.proxy_headers()])
            responder.first_byte_at = time.perf_counter()
        else:
            tail.insert(max(len(tail) - 1, 0), self.ex.trailer_comment())
        await responder.body(b"".join(tail), more=False)
