"""``POST /v1/responses`` framed over HTTP: one JSON answer, or a Responses event stream whose
function-call items are held until the pipeline has judged the whole answer; and ``GET`` /
``DELETE /v1/responses/{id}`` (and ``/input_items``) for the answers the proxy delivered.

The decisions are the chat pipeline's (``pipeline.py``), reached through the adapter in
``wire/responses.py``. Chains are the proxy's own: every delivered answer goes into the
Responses store (``episodes/responses_store.py``) under the id the client saw, and a
``previous_response_id`` found there is rebuilt into the whole input, sent upstream with
``store: false`` (the current request's ``instructions`` only, as OpenAI does), so a promoted or
repaired answer continues exactly the conversation the client saw. An answer the proxy changed
gets an id of its own (a stream keeps the id its ``response.created`` announced); a gated stream
is renumbered, so sequence numbers rise by one whatever was held or replaced. A stream that asked
for a structured output (``text.format``) is held whole and checked, as chat's
``response_format`` is, so its headers carry the verdict. An upstream that
serves chat completions only (``--upstream-apis`` without ``responses``) is asked in chat and the
judged answer is translated back; a stream is then asked as a chat stream and framed as Responses
events while it arrives (prose flows, calls are held as the chat stream gate holds them;
``asgi/chat_upstream.py`` does that part for Messages too). A stream under way that waits for its
verdict (a held call re-asked) gets an SSE comment (``: keep-alive``) every few seconds.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any, cast
from urllib.parse import parse_qs

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
from repairproxy.asgi.gate import (
    MAX_HELD_CONTENT_CHARS,
    ProseWatch,
    SSEParser,
    call_opening,
    unsent_text,
)
from repairproxy.asgi.responder import Responder
from repairproxy.episodes.budget import EpisodeRef
from repairproxy.episodes.responses_store import (
    ResponsesStore,
    StoredResponse,
    input_items,
    resend_items,
)
from repairproxy.errors import (
    BadRequestError,
    NotFoundError,
    UpstreamStatusError,
    UpstreamUnavailableError,
)
from repairproxy.pipeline import ChatPipeline, ChatRequest, instructs, json_object
from repairproxy.types import API, HeaderList, Outcome, Scope
from repairproxy.upstream.client import Upstream, chat_completion_of
from repairproxy.wire.fields import chat_only_fields
from repairproxy.wire.openai import ChatCompletion, first_message
from repairproxy.wire.responses import (
    from_chat_completion,
    message_item,
    message_item_closed,
    message_item_opened,
    new_item_id,
    new_response_id,
    output_text_delta,
    response_events,
    responses_request,
    to_chat_body,
    to_chat_completion,
    to_response,
)

__all__ = ["RESPONSES_PATH", "ResponsesCall", "error_event", "stored_response"]

RESPONSES_PATH = "/v1/responses"
_SSE_HEADERS: HeaderList = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
]
_JSON_HEADERS: HeaderList = [(b"content-type", b"application/json")]
# Events that say nothing about the answer's content: released at once.
_PREAMBLE = frozenset({"response.created", "response.in_progress", "response.queued"})
_FAILED = frozenset({"response.failed", "response.incomplete", "error"})
_LIFECYCLE_FIELD = "response"  # the field of lifecycle events that holds the response object
# Sent while a stream under way waits for its verdict (OpenAI clients skip SSE comments).
_BEAT = b": keep-alive\n\n"


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


class ResponsesCall(PipelineCall):
    """One ``/v1/responses`` request in flight."""

    api = API.RESPONSES

    def __init__(
        self,
        upstream: Upstream,
        pipeline: ChatPipeline,
        ex: Exchange,
        scope: Scope,
        headers: Mapping[str, str],
        store: ResponsesStore,
    ) -> None:
        super().__init__(upstream, pipeline, ex, scope, headers)
        self.store = store
        self.body: dict[str, Any] = {}
        self.forward: dict[str, Any] = {}
        self.tenant = ""
        self.conversation: list[Any] = []  # the whole input of this turn, earlier turns included
        self.rebuilt = False  # previous_response_id came from the store: the input was rebuilt
        self.injected = False  # the repair instruction went upstream inside ``instructions``
        self.translate = "responses" not in pipeline.settings.native_apis()
        self.response_id: str | None = None  # the id the client sees (a stream: its first)
        self._sequence = 0
        self._answers: dict[str | None, dict[str, Any]] = {}  # upstream responses by id

    # -- before the upstream ----------------------------------------------------------------------

    async def prepare(self, raw: bytes) -> ChatRequest:
        """Parse, rebuild a stored chain, find the episode (a header, else the stored turn or
        ``previous_response_id``, else the history), count the history's error results, and
        build the body that goes upstream."""
        pipeline = self.pipeline
        body = json_object(raw)
        for name, kinds in (("input", (str, list)), ("tools", (list,))):
            if body.get(name) is not None and not isinstance(body[name], kinds):
                raise BadRequestError(f"'{name}' has the wrong type", param=name)
        if self.translate:  # what a chat-only upstream cannot do: refused or named
            self.ex.dropped = chat_only_fields("responses", body)
        self.body = body
        self.tenant = tenant = pipeline.episodes.tenant_of(self.headers)
        previous = body.get("previous_response_id")
        stored: StoredResponse | None = None
        ahead: EpisodeRef | None = None  # the header's episode, read with the stored turn
        if isinstance(previous, str):
            stored, ahead = await self._with_episode(self.store.get(tenant, previous))
        new_items = input_items(body.get("input"))
        view, upstream_body = body, body
        if stored is not None:
            history = stored.conversation()
            self.rebuilt = True
            self.conversation = [*history, *new_items]
            view = {k: v for k, v in body.items() if k != "previous_response_id"}
            view["input"] = self.conversation
            upstream_body = {**view, "input": [*resend_items(history), *new_items]}
            upstream_body["store"] = False
        else:
            self.conversation = new_items
            if self.translate and isinstance(previous, str):
                raise _unknown_previous(previous)  # a chat upstream has no store to ask

        async def linked() -> EpisodeRef | None:
            """The episode the stored turn or ``previous_response_id`` continues, if any."""
            if ahead is not None:
                return ahead
            if stored is None:
                return await pipeline.episode_of_response(self.headers, previous)
            if stored.episode_id and pipeline.settings.episode_header not in self.headers:
                return EpisodeRef(stored.episode_id, explicit=False, new=False, tenant=tenant)
            return None

        request = await self._open(to_chat_body(view), raw, episode=linked)
        if self.translate:
            self._prepare_chat(request)
            return request
        forward = upstream_body
        if request.tools is not None and instructs(request.mode):
            instruction = pipeline.policies[request.mode].template.instruction
            current = upstream_body.get("instructions")
            if not (isinstance(current, str) and instruction in current):
                text = f"{current}\n\n{instruction}" if isinstance(current, str) and current else ""
                forward = {**upstream_body, "instructions": text or instruction}
                self.injected = True  # the answer's ``instructions`` echo is put back as sent
        self.forward = forward
        request.forward_raw = raw if forward is body else orjson.dumps(forward)
        return request

    def _prepare_chat(self, request: ChatRequest) -> None:
        """The chat completion a chat-only upstream is asked for: never streamed (the answer is
        judged whole, then framed as Responses events)."""
        self.pipeline.prepare_forward(request)
        forward = dict(request.forward or request.body)
        forward["stream"] = False
        forward.pop("stream_options", None)
        request.forward = cast(Any, forward)
        request.forward_raw = orjson.dumps(forward)

    async def _reask(self, chat_body: dict[str, Any]) -> dict[str, Any]:
        """The pipeline's re-ask, sent as a Responses request; answered as a chat completion."""
        assert self.request is not None
        if self.translate:
            return await self.upstream.complete(chat_body, self.out_headers, self.ex.timer)
        history = len(self.request.body.get("messages") or ())
        # The answers the repair turns repeat, in order (the first, then each re-ask's).
        repeated = list(self._answers.values())
        payload = orjson.dumps(responses_request(self.forward, history, chat_body, repeated))
        reply = await self.upstream.request(
            "POST", RESPONSES_PATH, self.out_headers, payload, self.ex.timer, self.query
        )
        if not 200 <= reply.status_code < 300:
            raise UpstreamStatusError(reply)
        response = answer_of(reply, items="output", shape="Responses")
        self._answers[_id_key(response.get("id"))] = response
        return to_chat_completion(response)

    async def _judge(
        self,
        response: dict[str, Any],
        streamed: Mapping[int, Any] | None = None,
        partial: tuple[int, _ItemText] | None = None,
    ) -> tuple[dict[str, Any], bool]:
        """The answer to deliver (a Responses object) and whether it differs from ``response``.

        ``streamed``: the items a stream already sent whole (prose), by output index;
        ``partial``: the message item whose text went out in part (a call opened in it). A
        changed answer keeps them, the partial one with the answer's text after what was sent
        (nothing more when the answer no longer begins with it), and puts its calls after
        them, so the completed output is what the client saw."""
        self._answers[_id_key(response.get("id"))] = response
        outcome = await self._decide(cast(ChatCompletion, to_chat_completion(response)))
        final = response
        if outcome.changed:
            base = self._answers.get(_id_key(outcome.answer.get("id")), response)
            final = to_response(cast(dict[str, Any], outcome.answer), base)
            if streamed or partial:
                kept = [streamed[k] for k in sorted(streamed)] if streamed else []
                if partial is not None:
                    said = partial[1].said
                    shown = "".join(_item_text(item) for item in kept) + said
                    message = first_message(outcome.answer)
                    content = message.get("content") if message is not None else None
                    rest = unsent_text(content, shown) or ""
                    kept.append(message_item(str(partial[1].item_id), said + rest))
                fresh = [i for i in final["output"] if i.get("type") != "message"]
                final["output"] = [*kept, *fresh]
            final["id"] = self.response_id or new_response_id()
        final = self._as_delivered(final)
        await self._keep(final)
        return final, outcome.changed or self.rebuilt

    def _as_delivered(self, response: dict[str, Any]) -> dict[str, Any]:
        """``response`` as the client sees it: the stream's one id, and for a rebuilt chain the
        fields the client sent (not the ``store: false`` whole input that went upstream)."""
        if self.response_id is not None and response.get("id") != self.response_id:
            response = {**response, "id": self.response_id}
        if self.rebuilt:
            response = {
                **response,
                "previous_response_id": self.body.get("previous_response_id"),
                "store": self.body.get("store", True),
            }
        if self.injected and "instructions" in response:
            # The repair instruction is the proxy's own: never echoed back, never stored.
            response = {**response, "instructions": self.body.get("instructions")}
        return response

    async def _keep(self, final: Mapping[str, Any]) -> None:
        """Store the delivered answer for the next turn (unless the client said ``store:
        false``), and point its id at the episode."""
        assert self.request is not None
        response_id = final.get("id")
        if not isinstance(response_id, str):
            return
        # The link, the record and the episode's write (the answer is judged: nothing more will
        # change it) in one round trip to a shared store; the route's settle then has nothing to do.
        writes = [
            self.pipeline.remember_response(self.request, response_id),
            self.pipeline.settle(self.request, self.ex.record),
        ]
        if self.body.get("store") is not False:
            model = self.body.get("model")
            record = StoredResponse(
                self.conversation,
                dict(final),
                self.ex.record.episode_id,
                model if isinstance(model, str) else None,
            )
            writes.append(self.store.put(self.tenant, response_id, record))
        await self._together(*writes)

    # -- buffered ---------------------------------------------------------------------------------

    async def buffered(self, responder: Responder) -> None:
        if self.translate:
            await self._translated(responder)
            return
        ex = self.ex
        assert self.request is not None
        reply = await self.upstream.request(
            "POST", RESPONSES_PATH, self.out_headers, self.request.forward_raw, ex.timer, self.query
        )
        content = reply.content
        if 200 <= reply.status_code < 300:
            final, changed = await self._judge(answer_of(reply, items="output", shape="Responses"))
            if changed or self.injected:
                content = orjson.dumps(final)
        else:
            ex.record.outcome = Outcome.UPSTREAM_ERROR
        await self.send_whole(responder, reply, content)

    # -- a chat-only upstream ---------------------------------------------------------------------

    async def _translated(self, responder: Responder) -> None:
        """Ask the upstream in chat, judge, answer one Responses JSON object."""
        ex = self.ex
        assert self.request is not None
        reply = await self.upstream.request(
            "POST", CHAT_PATH, self.out_headers, self.request.forward_raw, ex.timer, self.query
        )
        if not 200 <= reply.status_code < 300:
            ex.record.outcome = Outcome.UPSTREAM_ERROR
            await self.send_whole(responder, reply, reply.content)  # chat errors are OpenAI-shaped
            return
        outcome = await self._decide(chat_completion_of(reply.content, reply.status_code))
        echoed = {**self.body, "input": None}
        final = from_chat_completion(
            cast(Mapping[str, Any], outcome.answer), echoed, new_response_id()
        )
        await self._keep(final)
        ex.record.status = 200
        headers = [*_JSON_HEADERS, *ex.proxy_headers()]
        responder.first_byte_at = time.perf_counter()
        await responder.whole(200, headers, orjson.dumps(final))

    async def _translated_stream(self, responder: Responder) -> None:
        """A chat upstream's stream, gated as chat streams are (prose flows as ``output_text``
        deltas; calls, text that could be a call and a structured output are held), framed as
        Responses events; the rest once judged. Chat errors are OpenAI-shaped: sent as they are."""

        async def whole(completion: ChatCompletion) -> None:
            await self._relay_chat(responder, None, completion)

        async def relay(chunks: AsyncIterable[bytes]) -> None:
            await self._relay_chat(responder, chunks)

        await ask_chat_stream(self, responder, relay=relay, whole=whole)

    async def _relay_chat(
        self,
        responder: Responder,
        chunks: AsyncIterable[bytes] | None,
        whole: ChatCompletion | None = None,
    ) -> None:
        """Frame a chat stream (or a ``whole`` answer) as a Responses stream: one response id,
        the text of message item 0 as it is released by the chat gate, then the judged rest
        (the text's remainder, the calls, the terminal event) with the verdict comment."""
        ex = self.ex
        self.response_id = response_id = new_response_id()
        echoed = {**self.body, "input": None}
        item = message_item(new_item_id("msg"), "", status="in_progress")

        def frames(piece: str, meta: Mapping[str, Any] | None) -> bytes:
            out: list[dict[str, Any]] = []
            if meta is not None:  # the first piece: the response and its message item open
                opened = from_chat_completion(
                    {"model": meta.get("model"), "choices": [{}]}, echoed, response_id
                )
                opened.update(status="in_progress", usage=None)
                out += [
                    {"type": "response.created", "response": opened},
                    {"type": "response.in_progress", "response": opened},
                    *message_item_opened(item, 0),
                ]
            out.append(output_text_delta(item, 0, piece))
            return b"".join(self._frame(e) for e in out)

        text = ChatTextRelay(self, responder, _SSE_HEADERS, frames)
        if chunks is not None:
            await text.run(chunks)
        if text.upstream_error is not None:  # the upstream's own in-band error: not judged
            ex.record.outcome = Outcome.UPSTREAM_ERROR
            if not responder.started:
                await responder.start(200, [*_SSE_HEADERS, *ex.proxy_headers()])
                responder.first_byte_at = time.perf_counter()
            await responder.body(error_event(text.upstream_error), more=False)
            return
        outcome = await keep_alive(responder, self._decide(whole or text.completion()), _BEAT)
        final = from_chat_completion(cast(Mapping[str, Any], outcome.answer), echoed, response_id)
        if not text.sent:
            await self._keep(final)
            await self._finish(
                responder, _SSE_HEADERS, [self._frame(e) for e in response_events(final)]
            )
            return
        shown = "".join(text.sent)
        rest = text.rest(
            "".join(
                str(part.get("text", ""))
                for out in final["output"]
                if out.get("type") == "message"
                for part in out.get("content") or ()
            )
        )
        item = message_item(str(item["id"]), shown + rest)
        final["output"] = [item, *(o for o in final["output"] if o.get("type") != "message")]
        await self._keep(final)
        events = [
            *([output_text_delta(item, 0, rest)] if rest else []),
            *message_item_closed(item, 0),
            *response_events(final, skip={0})[2:],
        ]
        await self._finish(responder, _SSE_HEADERS, [self._frame(e) for e in events])

    # -- streamed ---------------------------------------------------------------------------------

    async def stream(self, responder: Responder) -> None:
        if self.translate:
            await self._translated_stream(responder)
            return
        assert self.request is not None
        await self._stream(RESPONSES_PATH, self.request.forward_raw, responder, self._relay)

    def _frame(self, payload: Mapping[str, Any]) -> bytes:
        """One event as it leaves: the next sequence number, the response's one id."""
        event = dict(payload)
        event["sequence_number"] = self._sequence
        self._sequence += 1
        inner = event.get(_LIFECYCLE_FIELD)
        if isinstance(inner, dict) and "output" in inner:
            event[_LIFECYCLE_FIELD] = self._as_delivered(inner)
        return _sse(event)

    async def _relay(
        self, chunks: AsyncIterator[bytes], responder: Responder, headers: HeaderList
    ) -> None:
        """Release the preamble and prose at once; hold function calls, text that could be a
        call written as text (up to ``MAX_HELD_CONTENT_CHARS``) and a prose item's text from
        where a call opens in it, until the terminal event, then judge the whole answer. A
        gated (or rebuilt) stream is re-framed: one id, sequence numbers counted here; nothing
        follows its terminal event."""
        ex = self.ex
        # A structured output (text.format) has no prose to let through: held whole, preamble
        # included, so the headers carry the verdict (as a chat stream with response_format).
        hold_all = self.request is not None and self.request.output is not None
        gated = hold_all or (self.request is not None and self.request.tools is not None)
        rewrite = gated or self.rebuilt
        parser = SSEParser()
        held: list[tuple[dict[str, Any], Any]] = []  # (event, its output index)
        held_at: set[Any] = set()  # the output indices of the held events (one test a delta)
        final: dict[str, Any] | None = None
        failed = False
        prose: set[int] = set()  # output indices whose events flow (plain prose)
        streamed: dict[int, Any] = {}  # prose items sent whole, by output index
        texts: dict[int, _ItemText] = {}  # the text of the items at the front, by output index
        tools = self.request.tools if self.request is not None else None
        tool_names = tools.names if tools is not None else ()

        async def release(payload: dict[str, Any], raw: bytes) -> None:
            if not responder.started:
                await responder.start(200, [*headers, *ex.proxy_headers(verdict=False)])
                responder.first_byte_at = time.perf_counter()
            await responder.body(self._frame(payload) if rewrite else raw)

        async for chunk in chunks:
            for event in parser.feed(chunk):
                payload = payload_of(event.data)
                kind = payload.get("type")
                if not payload:
                    if not rewrite:
                        await release(payload, event.raw)
                    continue  # a comment or keep-alive: nothing of the answer
                inner = payload.get(_LIFECYCLE_FIELD)
                if kind == "response.created" and isinstance(inner, dict) and rewrite:
                    self.response_id = _id_key(inner.get("id")) or new_response_id()
                if kind == "response.completed" and isinstance(inner, dict):
                    final = inner
                failed = failed or kind in _FAILED
                if hold_all:
                    held.append((payload, payload.get("output_index")))
                    held_at.add(_held_key(payload.get("output_index")))
                    continue
                if not gated or kind in _PREAMBLE:
                    await release(payload, event.raw)
                    continue
                index = payload.get("output_index")
                if (
                    not failed
                    and kind == "response.output_text.delta"
                    and isinstance(index, int)
                    and held_at <= {index}  # no earlier item still held
                ):
                    text = texts.setdefault(index, _ItemText(payload.get("item_id"), tool_names))
                    if text.feed(str(payload.get("delta", ""))):
                        prose.add(index)  # this item's events flow (until a call opens in it)
                        for earlier, _ in held:
                            await release(earlier, b"")
                        held = []
                        held_at.clear()
                    else:
                        prose.discard(index)  # held from here on, until its text decides
                if isinstance(index, int) and index in prose and not failed:
                    if kind == "response.output_item.done":
                        streamed[index] = payload.get("item")
                    await release(payload, event.raw)
                    continue
                held.append((payload, index))
                held_at.add(_held_key(index))
        leftovers = [event.raw for event in parser.flush()]
        if not gated:
            if final is not None and not failed:
                await self._keep(self._as_delivered(final))
            elif failed:
                ex.record.outcome = Outcome.UPSTREAM_ERROR
            await self._finish(responder, headers, [] if rewrite else leftovers)
            return
        if failed:
            # Unjudged, as the upstream sent it, in order: the terminal event last.
            ex.record.outcome = Outcome.UPSTREAM_ERROR
            await self._finish(responder, headers, [self._frame(p) for p, _ in held])
            return
        if final is None:
            raise UpstreamUnavailableError("the upstream's event stream ended before completing")
        # An item whose text went out in part: a call opened in its prose and the rest waits.
        cut = next((i for i, t in texts.items() if t.said and i not in streamed), None)
        partial = (cut, texts[cut]) if cut is not None else None
        answer, changed = await keep_alive(responder, self._judge(final, streamed, partial), _BEAT)
        if not changed:
            await self._finish(responder, headers, [self._frame(p) for p, _ in held])
            return
        # The preamble went out already, unless everything was held (then it leads again).
        events = [p for p, _ in held if p.get("type") in _PREAMBLE]
        skip = set(streamed)
        if partial is not None:
            index, text = partial
            item = answer["output"][len(streamed)]
            rest = str(item["content"][0]["text"])[len(text.said) :]
            events += [
                *([output_text_delta(item, index, rest)] if rest else []),
                *message_item_closed(item, index),
            ]
            skip.add(len(streamed))
        events += response_events(answer, skip=skip)[2:]
        await self._finish(responder, headers, [self._frame(event) for event in events])

    async def _finish(self, responder: Responder, headers: HeaderList, tail: list[bytes]) -> None:
        """The held events; a stream whose headers already left gets the verdict as an SSE
        comment (as chat streams do), just before its terminal event, so nothing follows that."""
        if not responder.started:
            await responder.start(200, [*headers, *self.ex.proxy_headers()])
            responder.first_byte_at = time.perf_counter()
        elif tail:
            tail.insert(len(tail) - 1, self.ex.trailer_comment())
        await responder.body(b"".join(tail), more=False)


_UNHASHABLE = object()  # an output index sent as a list or an object: equal to no int


def _held_key(index: Any) -> Any:
    """An event's output index as ``held_at`` keeps it (any JSON value may arrive there)."""
    return index if isinstance(index, int | float | str) or index is None else _UNHASHABLE


def _unknown_previous(previous: str) -> NotFoundError:
    return NotFoundError(
        f"Previous response with id '{previous[:128]}' not found.", param="previous_response_id"
    )


class _ItemText:
    """The text of one message item at the front of a stream, as its deltas come: held while
    its start could open a call written as text; prose once it cannot (or it outgrew the
    hold), then read as the chat stream gate reads prose, so from where a call opens in it the
    text waits for the verdict (again up to ``MAX_HELD_CONTENT_CHARS``)."""

    __slots__ = (
        "_said",
        "_unsaid",
        "_unsaid_chars",
        "calling",
        "item_id",
        "length",
        "opening",
        "start",
        "tool_names",
        "watch",
    )

    def __init__(self, item_id: Any, tool_names: tuple[str, ...] = ()) -> None:
        self.item_id = item_id
        # The declared tools: a name at a line start may open a call written without a marker.
        self.tool_names = tool_names
        # The text the client has, and the text held since, as pieces: joining a growing string
        # on every delta would copy it whole each time (quadratic in a long answer's deltas).
        self._said: list[str] = []
        self._unsaid: list[str] = []
        self._unsaid_chars = 0
        self.start = ""  # read while its start is undecided (short or blank: linear overall)
        self.length = 0
        self.opening: bool | None = None  # its start opens a call, once that is decided
        self.watch: ProseWatch | None = None  # set once it is prose
        self.calling = False  # a call opened in its prose

    def feed(self, delta: str) -> bool:
        """Whether the item's held text, ``delta`` last, may go out now."""
        self.length += len(delta)
        self._unsaid.append(delta)
        self._unsaid_chars += len(delta)
        watch = self.watch
        if watch is None:
            if self.opening is None:
                self.start += delta
                self.opening = call_opening(self.start, tool_names=self.tool_names)
            if self.opening is not False and self.length <= MAX_HELD_CONTENT_CHARS:
                return False
            self.watch = watch = ProseWatch(tool_names=self.tool_names)
            if self.opening is not False:
                return self._flows()  # too long to hold: it goes, and is read from here on
            return self._settle(watch.feed(self.start))
        if self.calling:
            if self._unsaid_chars <= MAX_HELD_CONTENT_CHARS:
                return False
            self.calling, watch.pending = False, ""  # too long to hold: it goes after all
            return self._flows()
        return self._settle(watch.feed(delta))

    def _settle(self, opening: bool | None) -> bool:
        if opening is False:
            return self._flows()
        self.calling = opening is True
        return False

    def _flows(self) -> bool:
        self._said += self._unsaid
        self._unsaid, self._unsaid_chars = [], 0
        return True

    @property
    def said(self) -> str:
        """The text the client has (joined once, when asked: after the stream)."""
        if len(self._said) > 1:
            self._said = ["".join(self._said)]
        return self._said[0] if self._said else ""


def _item_text(item: Any) -> str:
    """The text of a message output item (its text parts, joined)."""
    content = item.get("content") if isinstance(item, Mapping) else None
    return "".join(str(part.get("text", "")) for part in content or () if isinstance(part, Mapping))


# -- GET / DELETE /v1/responses/{id} ----------------------------------------------------------


def _listed_item(item: Any, index: int, response_id: str) -> Any:
    """An input item as ``/input_items`` lists it: with an id, text as content parts."""
    if not isinstance(item, Mapping):
        return item
    listed = dict(item)
    listed.setdefault("id", f"item_{index}_{response_id[-12:]}")
    if listed.get("type", "message") == "message":
        listed["type"] = "message"
        content = listed.get("content")
        if isinstance(content, str):
            kind = "output_text" if listed.get("role") == "assistant" else "input_text"
            listed["content"] = [{"type": kind, "text": content}]
    return listed


async def stored_response(
    store: ResponsesStore, tenant: str, method: str, path: str, query: bytes
) -> tuple[int, dict[str, Any]] | None:
    """The answer to ``GET`` / ``DELETE /v1/responses/{id}`` or ``GET .../input_items`` for an
    id this tenant was given by the proxy; None when the store does not hold it."""
    response_id, _, rest = path[len(RESPONSES_PATH) + 1 :].partition("/")
    if not response_id or rest not in ("", "input_items") or method not in ("GET", "DELETE"):
        return None
    if method == "DELETE" and rest:
        return None
    record = await store.get(tenant, response_id)
    if record is None:
        return None
    if method == "DELETE":
        await store.delete(tenant, response_id)
        return 200, {"id": response_id, "object": "response", "deleted": True}
    if not rest:
        return 200, record.response
    params = parse_qs(query.decode("latin-1"))
    order = (params.get("order") or ["desc"])[0]
    if order not in ("asc", "desc"):
        raise BadRequestError("'order' must be asc or desc", param="order")
    try:
        limit = int((params.get("limit") or ["20"])[0])
    except ValueError:
        limit = -1
    if not 1 <= limit <= 100:
        raise BadRequestError("'limit' must be an integer from 1 to 100", param="limit")
    items = [_listed_item(item, i, response_id) for i, item in enumerate(record.input)]
    if order == "desc":
        items.reverse()
    after = params.get("after")
    if after:
        ids = [item.get("id") if isinstance(item, Mapping) else None for item in items]
        items = items[ids.index(after[0]) + 1 :] if after[0] in ids else []
    page = items[:limit]

    def id_of(item: Any) -> Any:
        return item.get("id") if isinstance(item, Mapping) else None

    return 200, {
        "object": "list",
        "data": page,
        "first_id": id_of(page[0]) if page else None,
        "last_id": id_of(page[-1]) if page else None,
        "has_more": len(items) > limit,
    }
