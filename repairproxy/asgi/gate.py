"""SSE streams of chat completions: parse, hold tool-call deltas until the call is whole, re-emit.

A stream behaves as the buffered answer does: text flows, a candidate call is held until the
answer ends, and the pipeline decides on the whole answer as it would on a buffered one. Content
deltas go to the client at once, except from the point where the text could open a tool call
written as text (``{"``, ``[{``, ``<tool_call>``, ``<function=``, a JSON code fence, a model
family's native marker; where tools are declared, also a declared tool's name at the start of the
answer, a line or a sentence, as marker-less formats write it: ``get_weather(city="LA")``,
``get_weather{...}``, ``get_weather:0 {...}``), at the start or after prose: from there everything
is held, up to
``MAX_HELD_CONTENT_CHARS``, so that a decline written after the call ("... unless you confirm")
is seen before anything is promoted. Held text that is not a call is released as it came; a
promoted call replaces it (the prose after it kept, ``ToolCallGate.unsent``). Tool-call deltas,
the finish chunk and the usage chunk are held until the upstream stream ends;
then the assembled message is validated and either released byte for byte or replaced by chunks
rendered from the repaired answer (``completion_to_chunks``).

What a stream's HTTP headers can carry (headers leave before the first body byte):
* an answer made only of tool calls (or call-shaped text) is held whole, so its headers carry
  the full verdict: ``X-Repairproxy-Tool-Errors``, ``-Repairs``, ``-Episode-Errors``, and
  ``-Budget-Remaining``;
* once prose has streamed out, the headers only carry what was known before the answer
  (episode errors and budget as of the request); the verdict then follows as one SSE comment
  before ``[DONE]`` (``: x-repairproxy tool-errors=... repairs=... episode-errors=...``), which
  SSE clients, the openai SDK included, ignore;
* a stream for a request without tools is relayed untouched, with pre-answer headers only,
  unless it asked for a JSON ``response_format``: that answer is held whole until it is valid.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from repairproxy.native import opening_markers
from repairproxy.textcalls import JSON_FENCE_LANGUAGES

__all__ = [
    "DONE_EVENT",
    "MAX_HELD_CONTENT_CHARS",
    "ProseWatch",
    "SSEEvent",
    "SSEParser",
    "StreamAssembler",
    "ToolCallGate",
    "call_opening",
    "comment_event",
    "completion_to_chunks",
    "could_open_call",
    "data_event",
    "unsent_text",
]

DONE_EVENT = b"data: [DONE]\n\n"
# One pass finds the earliest of the three event separators.
_SEPARATOR = re.compile(rb"\r\n\r\n|\n\n|\r\r")
# Content held while it could still be a call written as text, at most this many characters:
# a longer answer is flushed (and, if it was a call after all, still promoted, its text kept).
MAX_HELD_CONTENT_CHARS = 16_384
# Tags and each model family's native opening markers (``native.opening_markers``): content
# beginning with one is held; a prefix of one is held until the next characters tell.
_TAG_OPENERS = ("<tool_call>", "<function=", *opening_markers())
# A pythonic call list opens ``[name(``: held while it could still be one.
_PYTHONIC_OPENING = re.compile(r"\[\s*[A-Za-z_][\w.]*(\s*)(\(?)")
# Markers that are words (``call:``, ``functions.``, ``functools[``): after prose they open a call
# only where a line or a sentence starts ("I'll check. functions.get_weather:0 {...}"), not
# inside one ("recall: ...", "I can call: ...", "these functions. work" are prose).
_WORD_OPENERS = tuple(opener for opener in _TAG_OPENERS if opener[0].isalnum())
_MARKED_OPENERS = tuple(opener for opener in _TAG_OPENERS if not opener[0].isalnum())
# Where, after prose, a call may open: any character a marked opener starts with, or a line or
# sentence start (where a word marker may follow; undecided at the end of the text).
_OPENER_START = re.compile(
    "["
    + re.escape("".join(sorted({opener[0] for opener in _MARKED_OPENERS} | set("{[`"))))
    + r"]|\n|[.!?:](?:[ \t]+|\Z)"
)
_BOUNDARY = frozenset("\n.!?:")
# An opener is decided within this many characters of where it starts (else it is prose).
_WATCH_WINDOW = 256
# After a declared tool's name, what makes it a call written without a marker: Granite's and
# pythonic ``name(``, Mistral's stripped ``name{``, Kimi's stripped ``name:0`` (spaces between).
_AFTER_NAME = re.compile(r"\s*(?:[({]|:\d)")
# ... and what leaves it undecided: only blanks so far, or a ``:`` waiting for its digit.
_AFTER_NAME_UNDECIDED = re.compile(r"\s*:?")


class SSEEvent:
    """One SSE event: its exact bytes (terminator included) and its joined ``data`` payload.
    (A plain slotted class: a frozen dataclass sets each field through ``object.__setattr__``,
    and a stream makes one event per chunk.)"""

    __slots__ = ("data", "raw")

    def __init__(self, raw: bytes, data: bytes | None) -> None:
        self.raw = raw
        self.data = data

    def __repr__(self) -> str:
        return f"SSEEvent(raw={self.raw!r}, data={self.data!r})"

    @property
    def is_done(self) -> bool:
        return self.data == b"[DONE]"


def data_event(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def comment_event(text: str) -> bytes:
    """An SSE comment line: SSE clients (the openai SDK included) ignore it."""
    return b": " + text.replace("\n", " ").encode() + b"\n\n"


class SSEParser:
    """Incremental SSE splitter; ``feed`` returns the events completed by this chunk.

    Linear in the bytes fed: each byte is searched for a separator once (a partial event is not
    searched again from its start when the next chunk arrives), and the buffer is trimmed once
    per chunk, not once per event. ``scanned`` counts the bytes searched (tests hold it to that).
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._searched = 0  # bytes of the buffer known to hold no separator start
        self.scanned = 0
        # Whether a CR was ever fed: until then the only separator is LF LF, found with
        # ``bytes.find`` (a memchr) instead of the three-way pattern (about 5x slower).
        self._cr = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if not self._cr and b"\r" in chunk:
            self._cr = True
        if not self._cr:
            return self._feed_lf(chunk)
        buffer = self._buffer
        buffer += chunk
        events: list[SSEEvent] = []
        start = 0
        # A separator may straddle the previous chunk's end: search from up to 3 bytes before.
        position = max(self._searched - 3, 0)
        while True:
            match = _SEPARATOR.search(buffer, position)
            if match is None:
                self.scanned += len(buffer) - position
                break
            self.scanned += match.end() - position
            cut, end = match.span()
            raw = bytes(buffer[start:end])
            events.append(SSEEvent(raw, _data_of(raw[: cut - start])))
            start = position = end
        if start:
            del buffer[:start]
        self._searched = len(buffer)
        return events

    def _feed_lf(self, chunk: bytes) -> list[SSEEvent]:
        """``feed`` for a stream without CRs: events end at LF LF."""
        buffer = self._buffer
        if buffer:
            buffer += chunk
            data: bytes | bytearray = buffer
        else:
            data = chunk  # the common case: the chunk holds whole events, nothing is copied
        events: list[SSEEvent] = []
        start = 0
        # A separator may straddle the previous chunk's end: search from 1 byte before.
        position = max(self._searched - 1, 0) if buffer else 0
        size = len(data)
        while True:
            cut = data.find(b"\n\n", position)
            if cut < 0:
                self.scanned += size - position
                break
            end = cut + 2
            self.scanned += end - position
            raw = bytes(data[start:end])
            if data.startswith(b"data: ", start) and data.find(b"\n", start, cut) < 0:
                payload: bytes | None = raw[6 : cut - start]  # one data line (no CR here)
            else:
                payload = _data_of(raw[: cut - start])
            events.append(SSEEvent(raw, payload))
            start = position = end
        if buffer:
            if start:
                del buffer[:start]
        elif start < size:
            buffer += data[start:]
        self._searched = len(buffer)
        return events

    def flush(self) -> list[SSEEvent]:
        """Whatever the upstream left unterminated at the end of the stream."""
        rest = bytes(self._buffer)
        self._buffer = bytearray()
        self._searched = 0
        if not rest.strip():
            return []
        return [SSEEvent(rest, _data_of(rest))]


def _data_of(block: bytes) -> bytes | None:
    if block.startswith(b"data: ") and b"\n" not in block and b"\r" not in block:
        return block[6:]  # the usual event: one data line
    parts = []
    for line in block.splitlines():
        if line.startswith(b"data:"):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(parts) if parts else None


class _CallParts:
    """One call's deltas, kept as pieces and joined once (``+=`` on a long string is quadratic)."""

    __slots__ = ("_arguments", "_name", "id", "type")

    def __init__(self) -> None:
        self.id: str | None = None
        self.type = "function"
        self._name: list[str] = []
        self._arguments: list[str] = []

    def add(self, name: Any, arguments: Any) -> None:
        if name and type(name) is str:
            self._name.append(name)
        if arguments and type(arguments) is str:
            self._arguments.append(arguments)

    @property
    def name(self) -> str:
        return _joined(self._name)

    @property
    def arguments(self) -> str:
        return _joined(self._arguments)


def _joined(parts: list[str]) -> str:
    """The pieces as one string, kept as one piece so that reading it again costs nothing."""
    if len(parts) > 1:
        parts[:] = ["".join(parts)]
    return parts[0] if parts else ""


_META_KEYS = ("id", "created", "model", "system_fingerprint")


class StreamAssembler:
    """Folds chunk JSON into the equivalent non-streaming ``chat.completion`` (choice 0).

    Linear in the stream: text and arguments are kept as pieces, joined when read.
    """

    __slots__ = (
        "_content",
        "calls",
        "content_chars",
        "content_only",
        "finish_reason",
        "function_call",
        "meta",
        "usage",
    )

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self._content: list[str] | None = None
        self.content_chars = 0
        self.calls: dict[int, _CallParts] = {}
        self.function_call: _CallParts | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.content_only = False  # of the last chunk added

    @property
    def content(self) -> str | None:
        return None if self._content is None else _joined(self._content)

    def add(self, chunk: Mapping[str, Any]) -> str:
        """Fold one chunk in; returns the content text it added (choice 0). ``content_only``
        then says whether the chunk held nothing but content deltas (no usage, no finish, no
        call delta, in any choice), read in the same pass.

        (``type(x) is dict`` rather than ``isinstance``: chunks are decoded JSON, and this runs
        for every event of every stream.)"""
        added = ""
        if not self.meta:
            self.meta = {k: chunk[k] for k in _META_KEYS if k in chunk}
        usage = chunk.get("usage")
        if type(usage) is dict:
            self.usage = usage
        choices = chunk.get("choices")
        if type(choices) is not list or not choices:
            self.content_only = False
            return added
        content_only = not usage
        for choice in choices:
            if type(choice) is not dict:
                content_only = False
                continue
            finish = choice.get("finish_reason")
            delta = choice.get("delta")
            if type(delta) is not dict:
                content_only = False
                continue  # an upstream's malformed chunk: nothing in it to assemble
            parts = delta.get("tool_calls")
            legacy = delta.get("function_call")
            if finish or parts or legacy:
                content_only = False
            if choice.get("index", 0) != 0:
                continue
            text = delta.get("content")
            if type(text) is str:
                if self._content is None:
                    self._content = []
                if text:
                    self._content.append(text)
                    self.content_chars += len(text)
                    added += text
            if type(parts) is list:
                calls = self.calls
                for part in parts:
                    if type(part) is not dict:
                        continue
                    index = part.get("index", len(calls))
                    if type(index) is not int:
                        continue  # a malformed part: no call to add it to (nor to sort it by)
                    call = calls.get(index)
                    if call is None:
                        call = calls[index] = _CallParts()
                    call_id = part.get("id")
                    if call_id:
                        call.id = call_id
                    kind = part.get("type")
                    if kind:
                        call.type = kind
                    function = part.get("function")
                    if type(function) is dict:
                        call.add(function.get("name"), function.get("arguments"))
            if type(legacy) is dict:
                self.function_call = self.function_call or _CallParts()
                self.function_call.add(legacy.get("name"), legacy.get("arguments"))
            if finish:
                self.finish_reason = finish
        self.content_only = content_only
        return added

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": call.type,
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for _, call in sorted(self.calls.items())
            ]
        if self.function_call is not None:
            message["function_call"] = {
                "name": self.function_call.name,
                "arguments": self.function_call.arguments,
            }
        return message

    def completion(self) -> dict[str, Any]:
        completion: dict[str, Any] = {
            **self.meta,
            "object": "chat.completion",
            "choices": [
                {"index": 0, "message": self.message(), "finish_reason": self.finish_reason}
            ],
        }
        if self.usage is not None:
            completion["usage"] = self.usage
        return completion


class ProseWatch:
    """Reads prose as it streams and says when a call written as text opens in it.

    ``feed`` returns True once a call opens, False while the prose is plain, None while an
    opener at its end is undecided (hold what ``feed`` was given until the next text decides).
    Only the new text and an undecided tail (at most ``_WATCH_WINDOW`` characters) are read.
    """

    __slots__ = ("_carry", "_fences", "_names", "pending", "read")

    def __init__(self, *, tool_names: Iterable[str] = ()) -> None:
        # Declared tools' names open a call where a word marker may (a line or sentence start).
        self._names = tuple(tool_names)
        self.pending = ""  # prose from an opener not decided yet
        self._carry = ""  # a line or sentence end the last text ended with (flows, but is read)
        self._fences = 0  # code fences in the prose read so far (odd: inside one)
        self.read = 0  # characters read by the last ``feed``

    def feed(self, added: str) -> bool | None:
        text = (self.pending or self._carry) + added
        self._carry = ""
        self.read = len(text)
        for match in _OPENER_START.finditer(text):
            start = match.start()
            if text.startswith("`", start) and (
                (start and text[start - 1] == "`")  # inside a run of backticks
                or (self._fences + text.count("```", 0, start)) % 2  # a fence's closing one
            ):
                continue
            window = text[start : start + _WATCH_WINDOW]
            if text[start] in _BOUNDARY:
                if match.end() == len(text):
                    # A line or sentence may start with the next text: read this end again then.
                    self._carry = match.group()
                    continue
                # Only a word marker here: other openers have their own matches.
                opening = _word_opening(window[match.end() - start :], self._names)
            else:
                opening = call_opening(window, words=False)
            if opening:
                self.pending = ""
                return True
            if opening is None and start + len(window) == len(text) < start + _WATCH_WINDOW:
                self._fences += text.count("```", 0, start)
                self.pending = window
                return None
        self._fences += text.count("```")
        self.pending = ""
        return False


class ToolCallGate:
    """Decides, event by event, what a stream with declared tools may release right now.

    ``feed`` returns the raw events to send at once; everything else stays held until ``held``
    is read at the end of the stream (in upstream order).
    """

    def __init__(
        self,
        *,
        hold_text: bool = True,
        max_held_chars: int = MAX_HELD_CONTENT_CHARS,
        hold_all: bool = False,
        tool_names: Iterable[str] = (),
    ) -> None:
        self.assembler = StreamAssembler()
        # The declared tools' names: one at the start of the answer or of a line or sentence
        # may open a call written without a marker (``get_weather(city="LA")``).
        self._names = tuple(name for name in tool_names if name) if hold_text else ()
        self._held: list[bytes] = []
        self._held_calls = False  # a tool-call/finish/usage event is among the held ones
        # The content is plain text: stream it straight through. Without ``hold_text`` (the
        # client sent tool_choice "none": text is text) content is never held.
        self._prose = not hold_text
        self._max_held_chars = max_held_chars
        self.released_content = False
        # Whether the held text opens a call: True or False once a prefix decides, else None.
        self._opening: bool | None = None
        self.scanned = 0  # characters of held text read to decide (tests hold it bounded)
        # A structured output (response_format) has no prose to let through: hold it whole.
        self._hold_all = hold_all
        # Prose is watched for a call opening after it (unless text is text: tool_choice none).
        self._watching = hold_text
        self._holding = False  # a call opened after prose: everything is held to the end
        self._prose_watch = ProseWatch(tool_names=self._names)
        self._released_chars = 0  # content characters the client already has

    def feed(self, event: SSEEvent) -> list[bytes]:
        data = event.data
        if data is None or data == b"[DONE]":
            self._held.append(event.raw)
            return []
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            self._held.append(event.raw)  # an upstream error payload or garbage: keep order
            return []
        if type(chunk) is not dict:
            self._held.append(event.raw)
            return []
        added = self.assembler.add(chunk)
        # Once a call's delta (or the finish) is held, everything after it is held too.
        if self._hold_all or self._held_calls or not self.assembler.content_only:
            self._held_calls = not self._hold_all
            self._held.append(event.raw)
            return []
        if self._prose:
            return self._prose_event(event.raw, added)
        self._held.append(event.raw)
        if self._opening is None and added:
            # Undecided prefixes are short (or blank): the text is read again only while one is.
            content = self.assembler.content or ""
            self.scanned += len(content)
            self._opening = call_opening(content, tool_names=self._names)
        if self._opening is None:
            return []
        if self._opening and self.assembler.content_chars <= self._max_held_chars:
            return []
        self._prose = True
        if self._opening is False:
            # Prose from the start: it flows unless a call opens further on in what is held.
            opening = self._watch(self.assembler.content or "")
            if opening is not False:
                self._holding = opening is True
                return []
        return self._release()

    def _prose_event(self, raw: bytes, added: str) -> list[bytes]:
        """A content event once prose has begun: released, unless a call may be opening."""
        if not self._watching:
            self.released_content = True
            self._released_chars = self.assembler.content_chars
            return [raw]
        self._held.append(raw)
        if self._holding:
            if self.assembler.content_chars - self._released_chars <= self._max_held_chars:
                return []
            self._holding = False  # too long to hold: it flows after all
            self._prose_watch.pending = ""
            return self._release()
        opening = self._watch(added) if added else (None if self._prose_watch.pending else False)
        if opening is False:
            return self._release()
        self._holding = opening is True
        return []

    def _watch(self, added: str) -> bool | None:
        opening = self._prose_watch.feed(added)
        self.scanned += self._prose_watch.read
        return opening

    def _release(self) -> list[bytes]:
        self.released_content = True
        self._released_chars = self.assembler.content_chars
        out, self._held = self._held, []
        return out

    def unsent(self, completion: Mapping[str, Any]) -> dict[str, Any]:
        """``completion`` (the pipeline's answer) less the content the client already has: what
        is left to send after the released prose (the prose after a promoted call), or nothing
        when the answer no longer begins with what was sent (a re-ask's new answer)."""
        final = dict(completion)
        if not self.released_content:
            return final
        choices = final.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            return final
        choice = dict(choices[0])
        message = dict(choice.get("message") or {})
        sent_text = (self.assembler.content or "")[: self._released_chars]
        message["content"] = unsent_text(message.get("content"), sent_text)
        choice["message"] = message
        final["choices"] = [choice, *choices[1:]]
        return final

    @property
    def held(self) -> list[bytes]:
        return self._held


def unsent_text(content: Any, sent_text: str) -> str | None:
    """What of ``content`` (the judged answer's text) is left to send once ``sent_text`` went
    out: the text after it, or None when ``content`` no longer begins with it (a re-ask's new
    answer)."""
    if not isinstance(content, str):
        return None
    sent = sent_text.rstrip()
    if not content.startswith(sent):
        # Promotion trims the prose it keeps: " Sure! ..." sent, "Sure! ..." kept.
        sent_text = sent_text.lstrip()
        sent = sent.lstrip()
        if not content.startswith(sent):
            return None
    tail = content[len(sent) :]
    rest = tail.strip() or None
    if rest is not None and sent and sent_text == sent:
        # The client's text stops mid-line ("the weather for"): the space before the rest
        # (" you.") is not there yet, so it goes with the rest.
        rest = tail[: len(tail) - len(tail.lstrip())] + rest
    return rest


def could_open_call(text: str) -> bool:
    """Whether content beginning with ``text`` may still turn out to be a call written as text."""
    return call_opening(text) is not False


def _word_opening(text: str, tool_names: tuple[str, ...] = ()) -> bool | None:
    """Whether a line beginning with ``text`` opens with a word marker (``call:``) or a
    declared tool's name called without a marker, as far as it tells (None while ``text`` is a
    prefix of one)."""
    stripped = text.lstrip(" \t")
    if any(stripped.startswith(opener) for opener in _WORD_OPENERS):
        return True
    named = _name_opening(stripped, tool_names) if tool_names else False
    if named:
        return True
    if named is None or any(opener.startswith(stripped) for opener in _WORD_OPENERS):
        return None
    return False


def _name_opening(text: str, tool_names: tuple[str, ...]) -> bool | None:
    """Whether ``text`` opens with a declared tool's name written as a call without a marker
    (the name, then ``(``, ``{`` or ``:<digit>``), as far as it tells: None while it is a
    prefix of a name, or a whole name followed by nothing that decides yet. A word that is no
    prefix of a name is decided at its first character that differs ("getting", "Sure")."""
    if not text or not (text[0].isalpha() or text[0] == "_"):
        return False
    undecided = False
    for name in tool_names:
        if text.startswith(name):
            if _AFTER_NAME.match(text, len(name)):
                return True
            undecided = undecided or _AFTER_NAME_UNDECIDED.fullmatch(text, len(name)) is not None
        elif not undecided and name.startswith(text):
            undecided = True
    return None if undecided else False


def call_opening(text: str, *, words: bool = True, tool_names: Iterable[str] = ()) -> bool | None:
    """Whether content beginning with ``text`` opens a call written as text, as far as it tells.

    True or False once the prefix decides it (every longer text beginning with it gets the same
    answer, so a stream need not read its text again), None while it could go either way.
    ``words``: whether a word marker (``call:``, ``functions.``) counts here: at the start of
    the answer or of a line, not inside a sentence. ``tool_names``: the declared tools, whose
    names open a call without a marker where a word marker may (``get_weather(city="LA")``).
    """
    stripped = text.lstrip()
    if not stripped:
        return None
    openers = _TAG_OPENERS if words else _MARKED_OPENERS
    if any(stripped.startswith(opener) for opener in openers):
        return True
    if words and tool_names:
        named = _name_opening(stripped, tuple(tool_names))
        if named is not False:
            return named
    first, rest = stripped[0], stripped[1:].lstrip()
    if first == "[" and rest and (rest[0].isalpha() or rest[0] == "_"):
        pythonic = _PYTHONIC_OPENING.match(stripped)
        if pythonic is not None and pythonic.group(2):
            return True
        if pythonic is not None and pythonic.end() == len(stripped):
            return None  # ``[get_wea``: the name may still be followed by ``(``
        return None if any(opener.startswith(stripped) for opener in openers) else False
    if first in "{[":
        if not rest:
            return None
        if first == "{" and rest[0] == "{":  # a doubled pair a template taught: ``{{"name"``
            inner = rest[1:].lstrip()
            return inner[0] == '"' if inner else None
        return rest[0] == ('"' if first == "{" else "{")  # an object's key; a list of calls
    if stripped.startswith("```"):
        language, newline, body = stripped[3:].partition("\n")
        language = language.strip().lower()
        if not newline:
            if len(language) < 16 and any(
                known.startswith(language) for known in JSON_FENCE_LANGUAGES
            ):
                return None
            return False
        if language not in JSON_FENCE_LANGUAGES:
            return False
        body = body.lstrip()
        return body[0] in "{[<" if body else None
    if "```".startswith(stripped):
        return None
    return None if any(opener.startswith(stripped) for opener in openers) else False


def completion_to_chunks(
    completion: Mapping[str, Any],
    meta: Mapping[str, Any],
    *,
    include_content: bool,
    include_role: bool,
    include_usage: bool,
) -> list[bytes]:
    """Render choice 0 of a ``chat.completion`` as SSE chunks a streaming client parses.

    One chunk per tool call (whole arguments), then the finish chunk, the usage chunk when the
    client asked for ``stream_options.include_usage``, and ``[DONE]``.
    """
    base = {
        "id": meta.get("id") or completion.get("id"),
        "object": "chat.completion.chunk",
        "created": meta.get("created") or completion.get("created"),
        "model": meta.get("model") or completion.get("model"),
    }
    if meta.get("system_fingerprint"):
        base["system_fingerprint"] = meta["system_fingerprint"]
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    deltas: list[dict[str, Any]] = []
    if include_content and message.get("content"):
        deltas.append({"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or ()):
        function = call.get("function") or {}
        deltas.append(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call.get("id"),
                        "type": call.get("type", "function"),
                        "function": {
                            "name": function.get("name", ""),
                            "arguments": function.get("arguments", ""),
                        },
                    }
                ]
            }
        )
    if message.get("function_call"):
        deltas.append({"function_call": message["function_call"]})
    if include_role:
        if deltas:
            deltas[0] = {"role": "assistant", **deltas[0]}
        else:
            deltas.append({"role": "assistant", "content": ""})
    events = [
        data_event({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        for delta in deltas
    ]
    events.append(
        data_event(
            {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": {},
                        "finish_reason": choice.get("finish_reason") or "stop",
                    }
                ],
            }
        )
    )
    if include_usage and completion.get("usage") is not None:
        events.append(data_event({**base, "choices": [], "usage": completion["usage"]}))
    events.append(DONE_EVENT)
    return events
