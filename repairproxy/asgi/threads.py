"""Anthropic message threads (``anthropic-beta: message-threads-2026-08-12``), owned by the proxy.

A client that threads sends ``thread: {"type": "create"}`` with its whole history, then
``{"type": "continue", "previous_message_id": <the id of the answer it got>}`` with only the new
turn, and without ``system`` and ``tools`` (the thread keeps those it was created with). An
upstream thread cannot hold what the proxy delivered (a repaired or promoted answer is not what
the upstream produced) and a chat-only upstream holds nothing, so the proxy keeps every threaded
answer it delivered, per tenant, in the store the Responses chains use (bounded in bytes, memory
or Redis), and sends every turn upstream whole: history, ``system`` and ``tools``, never the
``thread`` field nor its beta value. The rebuilt history is the one the client was given, so
conversation chaining keeps the thread in one episode.

Refusals are the ones the SDKs recover from by replaying the full history under a new thread
(``error.details.error_code``): ``thread_not_found`` (unknown id, another tenant's, expired or
evicted), ``thread_already_continued`` (each answer is continued once), and
``thread_continue_in_flight`` (a continue from the same id is still running in this process).
``system`` messages inside ``messages`` may carry ``tool_addition`` / ``tool_removal`` blocks
(``tool_reference`` by name, or an inline ``tool_definition``): the proxy applies them, in order,
to the thread's tools, and sends the resulting ``tools`` upstream with the blocks left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from repairproxy.episodes.responses_store import ResponsesStore, StoredResponse
from repairproxy.errors import BadRequestError, ConflictError, NotFoundError

__all__ = [
    "THREADS_BETA",
    "MessageThreads",
    "ThreadTurn",
    "apply_tool_changes",
    "without_threads_beta",
]

THREADS_BETA = "message-threads-2026-08-12"
_TOOL_CHANGES = frozenset({"tool_addition", "tool_removal"})


def without_threads_beta(value: bytes) -> bytes | None:
    """An ``anthropic-beta`` header value without the threads beta (None: nothing left)."""
    kept = [
        p.strip() for p in value.split(b",") if p.strip() and p.strip() != THREADS_BETA.encode()
    ]
    return b",".join(kept) if kept else None


@dataclass(slots=True)
class ThreadTurn:
    """One threaded request: ``previous`` the answer it continues (None: a ``create``)."""

    previous_id: str | None = None
    previous: StoredResponse | None = None
    key: tuple[str, str] | None = None  # (tenant, previous id) while in flight


def _tool_name(tool: Any) -> str | None:
    return (
        tool.get("name")
        if isinstance(tool, Mapping) and isinstance(tool.get("name"), str)
        else None
    )


def apply_tool_changes(
    tools: list[Any] | None, messages: list[Any]
) -> tuple[list[Any] | None, list[Any]]:
    """The tools after every ``tool_addition`` / ``tool_removal`` block of the ``system``
    messages, in order, and the messages without those blocks (a system message left empty is
    left out). A reference names a tool the thread was created with (or defined earlier)."""
    if not any(
        isinstance(m, Mapping) and m.get("role") == "system" and isinstance(m.get("content"), list)
        for m in messages
    ):
        return tools, messages
    known = {name: tool for tool in tools or () if (name := _tool_name(tool)) is not None}
    active = list(tools or ())
    out: list[Any] = []
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if not (
            isinstance(message, Mapping)
            and message.get("role") == "system"
            and isinstance(content, list)
        ):
            out.append(message)
            continue
        kept = []
        for block in content:
            kind = block.get("type") if isinstance(block, Mapping) else None
            if kind not in _TOOL_CHANGES:
                kept.append(block)
                continue
            ref = block.get("tool") if isinstance(block.get("tool"), Mapping) else {}
            definition: Any = None
            if ref.get("type") == "tool_definition" and isinstance(ref.get("definition"), Mapping):
                definition = dict(ref["definition"])
                name = _tool_name(definition)
            else:
                name = ref.get("name") if isinstance(ref.get("name"), str) else None
                definition = known.get(name) if name is not None else None
            if name is None:
                raise BadRequestError(f"a {kind} block names no tool", param="messages")
            active = [t for t in active if _tool_name(t) != name]
            if kind == "tool_addition":
                if definition is None:
                    raise BadRequestError(
                        f"tool_addition names {name[:64]!r}, which the thread does not declare",
                        param="messages",
                    )
                known[name] = definition
                active.append(definition)
        if kept:
            out.append({**message, "content": kept})
    return active, out


class MessageThreads:
    """The threads of the answers this proxy delivered, in a ``ResponsesStore`` of their own."""

    def __init__(self, store: ResponsesStore) -> None:
        self.store = store
        self._in_flight: set[tuple[str, str]] = set()  # this process's continues running now

    async def open(self, tenant: str, body: dict[str, Any]) -> ThreadTurn | None:
        """Take ``thread`` out of ``body`` and make ``body`` the whole turn (history, system,
        tools); None: not a threaded request."""
        if "thread" not in body:
            return None
        thread = body.pop("thread")
        kind = thread.get("type") if isinstance(thread, Mapping) else None
        if kind == "create":
            return ThreadTurn()
        if kind != "continue":
            raise BadRequestError(
                '\'thread\' must be {"type": "create"} or {"type": "continue", '
                '"previous_message_id": ...}',
                param="thread",
            )
        previous_id = thread.get("previous_message_id")
        if not isinstance(previous_id, str) or not previous_id:
            raise BadRequestError("'thread.previous_message_id' is required", param="thread")
        for name in ("system", "tools"):
            if name in body:
                raise BadRequestError(
                    f"'{name}' is fixed by the thread's create turn; send tool_addition or "
                    "tool_removal blocks in a system message to change the tools",
                    param=name,
                )
        previous = await self.store.get(tenant, previous_id)
        if previous is None:
            raise NotFoundError(
                f"no thread state for previous_message_id '{previous_id[:128]}'",
                details={"error_code": "thread_not_found"},
            )
        if previous.extra.get("continued"):
            raise ConflictError(
                f"message '{previous_id[:128]}' was already continued; continue from the "
                "thread's latest message id",
                details={"error_code": "thread_already_continued"},
            )
        key = (tenant, previous_id)
        if key in self._in_flight:
            raise ConflictError(
                f"another request is continuing from '{previous_id[:128]}'",
                details={"error_code": "thread_continue_in_flight"},
            )
        self._in_flight.add(key)
        body["messages"] = [*previous.conversation(), *body["messages"]]
        for name in ("system", "tools"):
            if previous.extra.get(name) is not None:
                body[name] = previous.extra[name]
        return ThreadTurn(previous_id, previous, key)

    def close(self, turn: ThreadTurn) -> None:
        if turn.key is not None:
            self._in_flight.discard(turn.key)
            turn.key = None

    async def record(
        self,
        tenant: str,
        turn: ThreadTurn,
        sent: Mapping[str, Any],
        answer: Mapping[str, Any],
        episode_id: str | None,
    ) -> None:
        """Keep the delivered ``answer`` as the thread's latest message: ``sent`` (the whole
        turn as the client would have sent it), then the answer as an assistant message."""
        answer_id = answer.get("id")
        if not isinstance(answer_id, str) or not answer_id:
            return
        messages = list(sent.get("messages") or ())
        messages.append({"role": "assistant", "content": list(answer.get("content") or ())})
        extra = {name: sent.get(name) for name in ("system", "tools") if sent.get(name) is not None}
        model = sent.get("model") if isinstance(sent.get("model"), str) else None
        record = StoredResponse(messages, {"id": answer_id, "output": []}, episode_id, model, extra)
        if turn.previous is None or turn.previous_id is None:
            await self.store.put(tenant, answer_id, record)
            return
        done = turn.previous
        marked = {**done.extra, "continued": True}
        previous = StoredResponse(done.input, done.response, done.episode_id, done.model, marked)
        # Both in one round trip to a shared store (with the caller's episode write, if any).
        await self.store.put_many(tenant, [(answer_id, record), (turn.previous_id, previous)])
