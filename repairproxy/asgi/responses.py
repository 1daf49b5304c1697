"""``POST /v1/responses`` framed over HTTP: one JSON answer, or a Responses event stream whose
function-call items are held until the pipeline has judged the whole answer.

The decisions are the chat pipeline's (``pipeline.py``), reached through the adapter in
``responses_api.py``; this module only moves bytes and keeps the client's response chain intact:
the id returned is that of the upstream response the delivered answer came from, which the
upstream stored, so a later ``previous_response_id`` built on it works upstream.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import orjson

from repairproxy.asgi.exchange import Exchange
from repairproxy.asgi.gate import SSEParser, call_opening
from repairproxy.asgi.responder import Responder
from repairproxy.errors import (
    BadRequestError,
    UpstreamBadAnswerError,
    UpstreamStatusError,
    UpstreamUnavailableError,
)
from repairproxy.pipeline import ChatPipeline, ChatRequest, instructs, json_object
from repairproxy.types import API, HeaderList, Outcome, Scope
from repairproxy.upstream.client import Upstream, UpstreamReply, response_headers, timed
from repairproxy.wire.openai import ChatCompletion
from repairproxy.wire.responses import (
    response_events,
    responses_request,
    to_chat_body,
    to_chat_completion,
    to_response,
)

__all__ = ["RESPONSES_PATH", "ResponsesCall", "error_event"]

RESPONSES_PATH = "/v1/responses"
# Events that say nothing about the answer's content: released at once.
_PREAMBLE = frozenset({"response.created", "response.in_progress", "response.queued"})
_FAILED = frozenset({"response.failed", "response.incomplete", "error"})


def _response_of(content: bytes, status: int) -> dict[str, Any]:
    try:
        response = orjson.loads(content)
    except orjson.JSONDecodeError:
        response = None
    if not isinstance(response, dict) or not isinstance(response.get("output"), list):
        raise UpstreamBadAnswerError(
            f"the upstream answered {status} with a body that is not a Responses answer"
        )
    return response


def error_event(error: Mapping[str, Any]) -> bytes:
    """An error once a Responses stream has started, as OpenAI sends it: one ``error`` event
    (``type``, ``code``, ``message``, ``param``), never a chat-shaped ``data:`` line and
    ``[DONE]``. ``error``: the body of ``RepairProxyError.to_openai()``."""
    inner = error.get("error")
    detail: Mapping[str, Any] = inner if isinstance(inner, Mapping) else {}
    event = {
        "type": "error",
        "code": detail.get("code") or detail.get("type"),
        "message": detail.get("message"),
        "param": detail.get("param"),
    }
    return _sse(event)


def _id_key(value: Any) -> str | None:
    """An upstream id as a lookup key: only strings (a list or object id must not be a 500)."""
    return value if isinstance(value, str) else None


def _sse(event: Mapping[str, Any]) -> bytes:
    return (
        b"event: " + str(event.get("type")).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
    )


class ResponsesCall:
    """One ``/v1/responses`` request in flight."""

    def __init__(
        self,
        upstream: Upstream,
        pipeline: ChatPipeline,
        ex: Exchange,
        scope: Scope,
        headers: Mapping[str, str],
    ) -> None:
        self.upstream = upstream
        self.pipeline = pipeline
        self.ex = ex
        self.headers = headers
        self.query: bytes = scope["query_string"]
        self.out_headers = upstream.outbound_headers(scope["headers"], keep_encoding=False)
        self.body: dict[str, Any] = {}
        self.forward: dict[str, Any] = {}
        self.request: ChatRequest | None = None
        self._answers: dict[str | None, dict[str, Any]] = {}  # upstream responses by id

    # -- before the upstream ----------------------------------------------------------------------

    async def prepare(self, raw: bytes) -> ChatRequest:
        """Parse, find the episode (a header, else ``previous_response_id``, else the history),
        count the history's error results, and build the body that goes upstream."""
        ex, pipeline = self.ex, self.pipeline
        ex.record.api = API.RESPONSES
        body = json_object(raw)
        for name, kinds in (("input", (str, list)), ("tools", (list,))):
            if body.get(name) is not None and not isinstance(body[name], kinds):
                raise BadRequestError(f"'{name}' has the wrong type", param=name)
        self.body = body
        request = pipeline.parse_body(to_chat_body(body), raw, self.headers, ex.record)
        ex.mode = request.mode.value
        linked = await pipeline.episode_of_response(self.headers, body.get("previous_response_id"))
        try:
            await pipeline.admit(request, self.headers, ex.record, episode=linked)
        finally:
            ex.episode_id, ex.snapshot = request.episode_id, request.snapshot
        forward = body
        if request.tools is not None and instructs(request.mode):
            instruction = pipeline.policies[request.mode].template.instruction
            current = body.get("instructions")
            if not (isinstance(current, str) and instruction in current):
                text = f"{current}\n\n{instruction}" if isinstance(current, str) and current else ""
                forward = {**body, "instructions": text or instruction}
        self.forward = forward
        request.forward_raw = raw if forward is body else orjson.dumps(forward)
        self.request = request
        return request

    async def _reask(self, chat_body: dict[str, Any]) -> dict[str, Any]:
        """The pipeline's re-ask, sent as a Responses request; answered as a chat completion."""
        assert self.request is not None
        history = len(self.request.body.get("messages") or ())
        payload = orjson.dumps(responses_request(self.forward, history, chat_body))
        reply = await self.upstream.request(
            "POST", RESPONSES_PATH, self.out_headers, payload, self.ex.timer, self.query
        )
        if not 200 <= reply.status_code < 300:
            raise UpstreamStatusError(reply)
        response = _response_of(reply.content, reply.status_code)
        self._answers[_id_key(response.get("id"))] = response
        return to_chat_completion(response)

    async def _judge(self, response: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """The answer to deliver (a Responses object) and whether it differs from ``response``."""
        assert self.request is not None
        ex, request = self.ex, self.request
        self._answers[_id_key(response.get("id"))] = response
        completion = cast(ChatCompletion, to_chat_completion(response))
        try:
            outcome = await self.pipeline.judge(request, completion, self._reask, ex.record)
        finally:
            ex.snapshot = request.snapshot
            ex.channels = tuple(c.channel for c in ex.record.caught)
            ex.repairs = ex.record.repair_attempts
        ex.channels, ex.repair_failed = outcome.caught, outcome.repair_failed
        await self.pipeline.remember(request, outcome.answer)
        final = response
        if outcome.changed:
            base = self._answers.get(_id_key(outcome.answer.get("id")), response)
            final = to_response(cast(dict[str, Any], outcome.answer), base)
        await self.pipeline.remember_response(request, final.get("id"))
        return final, outcome.changed

    # -- buffered ---------------------------------------------------------------------------------

    async def buffered(self, responder: Responder) -> None:
        ex = self.ex
        assert self.request is not None
        reply = await self.upstream.request(
            "POST", RESPONSES_PATH, self.out_headers, self.request.forward_raw, ex.timer, self.query
        )
        content = reply.content
        if 200 <= reply.status_code < 300:
            final, changed = await self._judge(_response_of(reply.content, reply.status_code))
            if changed:
                content = orjson.dumps(final)
        else:
            ex.record.outcome = Outcome.UPSTREAM_ERROR
        await self._whole(responder, reply, content)

    async def _whole(self, responder: Responder, reply: UpstreamReply, content: bytes) -> None:
        self.ex.status = reply.status_code
        headers = response_headers(reply.headers)
        headers.extend(self.ex.proxy_headers())
        responder.first_byte_at = time.perf_counter()
        await responder.whole(reply.status_code, headers, content)

    # -- streamed ---------------------------------------------------------------------------------

    async def stream(self, responder: Responder) -> None:
        ex, upstream = self.ex, self.upstream
        assert self.request is not None
        async with upstream.stream(
            "POST", RESPONSES_PATH, self.out_headers, self.request.forward_raw, ex.timer, self.query
        ) as response:
            headers = response_headers(response.headers)
            content_type = response.header(b"content-type") or b""
            if response.status_code != 200 or b"text/event-stream" not in content_type:
                with upstream.reading():
                    content = await response.read()
                if response.status_code >= 300:
                    ex.record.outcome = Outcome.UPSTREAM_ERROR
                reply = UpstreamReply(response.status_code, response.headers, content)
                await self._whole(responder, reply, content)
                return
            ex.status = 200
            with upstream.reading():
                await self._relay(timed(response.iter_body(), ex.timer), responder, headers)

    async def _relay(
        self, chunks: AsyncIterator[bytes], responder: Responder, headers: HeaderList
    ) -> None:
        """Release the preamble and prose at once; hold function calls (and text that could be
        a call written as text) until ``response.completed``, then judge the whole answer."""
        ex = self.ex
        gated = self.request is not None and self.request.tools is not None
        parser = SSEParser()
        held: list[tuple[bytes, Any]] = []  # (raw event, its output index)
        final: dict[str, Any] | None = None
        failed = False
        sequence = 0
        prose: dict[int, bool] = {}  # output index -> its text is plain prose (released)
        text: dict[int, str] = {}
        opening: dict[int, bool | None] = {}  # output index -> its text opens a call, if decided

        async def release(raw: bytes) -> None:
            if not responder.started:
                await responder.start(200, [*headers, *ex.proxy_headers(verdict=False)])
                responder.first_byte_at = time.perf_counter()
            await responder.body(raw)

        async for chunk in chunks:
            for event in parser.feed(chunk):
                payload = _payload(event.data)
                kind = payload.get("type")
                if isinstance(payload.get("sequence_number"), int):
                    sequence = payload["sequence_number"] + 1
                if kind == "response.completed" and isinstance(payload.get("response"), dict):
                    final = payload["response"]
                failed = failed or kind in _FAILED
                if not gated or kind in _PREAMBLE or failed:
                    await release(event.raw)
                    continue
                index = payload.get("output_index")
                if (
                    kind == "response.output_text.delta"
                    and isinstance(index, int)
                    and not prose.get(index)
                    and opening.get(index) is None
                ):
                    # Read again only while undecided (short or blank): linear in the stream.
                    text[index] = text.get(index, "") + str(payload.get("delta", ""))
                    opening[index] = call_opening(text[index])
                    if opening[index] is False:
                        prose[index] = True  # plain prose: this item's events flow from now on
                        for raw, _ in [h for h in held if h[1] == index]:
                            await release(raw)
                        held = [h for h in held if h[1] != index]
                if isinstance(index, int) and prose.get(index):
                    await release(event.raw)
                    continue
                held.append((event.raw, index))
        for event in parser.flush():
            held.append((event.raw, None))
        tail = [raw for raw, _ in held]
        if failed or not gated:
            if failed:
                ex.record.outcome = Outcome.UPSTREAM_ERROR
            elif final is not None and self.request is not None:
                await self.pipeline.remember_response(self.request, final.get("id"))
            await self._finish(responder, headers, tail)
            return
        if final is None:
            raise UpstreamUnavailableError("the upstream's event stream ended before completing")
        answer, changed = await self._judge(final)
        if changed:
            # Message items already streamed as prose are not sent again; the closing
            # response.completed still carries the whole answer.
            events = response_events(answer, sequence, skip_messages=bool(prose))
            tail = [_sse(event) for event in events[2:]]
        await self._finish(responder, headers, tail)

    async def _finish(self, responder: Responder, headers: HeaderList, tail: list[bytes]) -> None:
        """The held events; a stream whose headers already left gets the verdict as an SSE
        comment (as chat streams do), just before its terminal event, so nothing follows that."""
        if not responder.started:
            await responder.start(200, [*headers, *self.ex.proxy_headers()])
            responder.first_byte_at = time.perf_counter()
        else:
            tail.insert(max(len(tail) - 1, 0), self.ex.trailer_comment())
        await responder.body(b"".join(tail), more=False)


def _payload(data: bytes | None) -> dict[str, Any]:
    if not data:
        return {}
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
