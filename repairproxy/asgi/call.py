"""What every validated route does around its own framing, written once: the preamble (the chat
view parsed, the repair mode read, the episode admitted), the verdict (judge, then remember what
the client got), and the upstream answers that are sent on whole as they came.

Chat completions, Responses and Messages subclass ``PipelineCall`` and add only their framing:
the body they forward, how a re-ask is asked, and how the judged answer is written back. The
facts of the request go into ``ex.record`` and nowhere else (``asgi/exchange.py`` reads them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import orjson

from repairproxy.asgi.exchange import Exchange
from repairproxy.asgi.responder import Responder
from repairproxy.episodes.budget import EpisodeRef
from repairproxy.errors import UpstreamBadAnswerError
from repairproxy.pipeline import ChatPipeline, ChatRequest, Decision
from repairproxy.types import API, HeaderList, Outcome, Scope
from repairproxy.upstream.client import Upstream, UpstreamReply, response_headers, timed
from repairproxy.wire.openai import ChatCompletion

__all__ = ["PipelineCall", "Relay", "answer_of"]

T = TypeVar("T")

# What a route does with an upstream event stream: (chunks, responder, the upstream's headers).
Relay = Callable[[AsyncIterator[bytes], Responder, HeaderList], Awaitable[None]]


def answer_of(reply: UpstreamReply, *, items: str, shape: str) -> dict[str, Any]:
    """A 2xx body that must be a JSON object whose ``items`` field is a list (``output``,
    ``content``): anything else is the upstream's fault (502), named as its ``shape``."""
    try:
        answer = orjson.loads(reply.content)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get(items), list):
        raise UpstreamBadAnswerError(
            f"the upstream answered {reply.status_code} with a body that is not a {shape} answer"
        )
    return answer


class PipelineCall:
    """One validated request in flight: the steps every API shares; framing in subclasses."""

    api: API = API.CHAT

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
        self.request: ChatRequest | None = None
        self._admitted: ChatRequest | None = None
        ex.record.api = self.api  # before the body is read: a 400 is logged under its API

    # -- the preamble -----------------------------------------------------------------------------

    async def _open(
        self,
        chat_body: dict[str, Any],
        raw: bytes,
        *,
        episode: Callable[[], Awaitable[EpisodeRef | None]] | None = None,
    ) -> ChatRequest:
        """Parse the chat view (the repair mode with it), then admit the episode: ``episode``
        finds it when the API links turns itself (after parsing: a malformed body is a 400
        first), else the pipeline does (a header, else the history)."""
        record = self.ex.record
        request = self.pipeline.parse_body(chat_body, raw, self.headers, record)
        linked = await episode() if episode is not None else None
        self._admitted = request  # settled however admission ends (a rejection included)
        await self.pipeline.admit(request, self.headers, record, episode=linked)
        self.request = request
        return request

    async def settle(self) -> None:
        """After the upstream call, however it ended: the episode's one write to a shared store."""
        await self.pipeline.settle(self._admitted, self.ex.record)

    # -- a shared store: one round trip before the upstream call, one after ---------------------

    async def _with_episode(self, lookup: Awaitable[T]) -> tuple[T, EpisodeRef | None]:
        """``lookup`` (the route's own store: a stored response, a thread) and, on a shared
        store with an episode header, that episode read ahead (``ErrorBudget.read_ahead``) at
        the same time: one round trip before the upstream call instead of two."""
        budget = self.pipeline.episodes
        if budget.shared is None or budget.episode_header not in self.headers:
            return await lookup, None
        return await asyncio.gather(lookup, budget.read_ahead(self.headers))

    async def _together(self, *writes: Awaitable[Any]) -> None:
        """The writes after the upstream call: at once on a shared store (one round trip: the
        stores of one client share a batch), one after another in the process. Each runs
        however another ends; the first failure is raised after them."""
        if self.pipeline.episodes.shared is None:
            failures: list[BaseException] = []
            for write in writes:
                try:
                    await write
                except Exception as exc:
                    failures.append(exc)
        else:
            done = await asyncio.gather(*writes, return_exceptions=True)
            failures = [result for result in done if isinstance(result, BaseException)]
        if failures:
            raise failures[0]

    # -- the verdict ------------------------------------------------------------------------------

    async def _reask(self, chat_body: dict[str, Any]) -> dict[str, Any]:
        """One re-ask of the pipeline's repair loop, answered as a chat completion."""
        raise NotImplementedError

    def _delivered(self, outcome: Decision) -> ChatCompletion:
        """The chat view of what the client gets, remembered so its next turn continues the
        episode. An adapter that delivers another shape frames it here."""
        return outcome.answer

    async def _decide(self, completion: ChatCompletion) -> Decision:
        """Judge one chat-shaped answer (re-asks included), then remember what is delivered."""
        assert self.request is not None
        outcome = await self.pipeline.judge(self.request, completion, self._reask, self.ex.record)
        await self.pipeline.remember(self.request, self._delivered(outcome))
        return outcome

    # -- answers sent on whole --------------------------------------------------------------------

    async def send_whole(self, responder: Responder, reply: UpstreamReply, content: bytes) -> None:
        """One JSON (or error) answer with every header the verdict gives."""
        self.ex.record.status = reply.status_code
        # A 2xx body was read as plain JSON (and may be re-serialised): the upstream's
        # content-encoding cannot describe what is sent.
        rewritten = content is not reply.content or 200 <= reply.status_code < 300
        headers = response_headers(reply.headers, rewritten=rewritten)
        headers.extend(self.ex.proxy_headers())
        responder.first_byte_at = time.perf_counter()
        await responder.whole(reply.status_code, headers, content)

    async def _stream(self, path: str, body: bytes, responder: Responder, relay: Relay) -> None:
        """Ask ``path`` for a stream: an event stream goes to ``relay``; anything else (an
        error, a JSON body) is sent on whole, as it came."""
        ex, upstream = self.ex, self.upstream
        async with upstream.stream(
            "POST", path, self.out_headers, body, ex.timer, self.query
        ) as response:
            # The event stream is re-framed by the relay: its upstream encoding no longer holds.
            headers = response_headers(response.headers, rewritten=True)
            content_type = response.header(b"content-type") or b""
            if response.status_code != 200 or b"text/event-stream" not in content_type:
                with upstream.reading():
                    content = await response.read()
                if response.status_code >= 300:
                    ex.record.outcome = Outcome.UPSTREAM_ERROR
                reply = UpstreamReply(response.status_code, response.headers, content)
                await self.send_whole(responder, reply, content)
                return
            ex.record.status = 200
            with upstream.reading():
                await relay(timed(response.iter_body(), ex.timer), responder, headers)
