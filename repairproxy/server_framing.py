"""How the server reads a request head: llhttp with h11's leniencies, and the rewrite of a head
llhttp refuses (``normalise_head``) from where it starts (``head_start``).

Framing is read as h11 reads it wherever llhttp is stricter and h11's reading is unambiguous
(``tests/proxy/test_server_differential.py`` compares the two on generated streams): a bare LF
ends a line, Transfer-Encoding wins over a Content-Length beside it (the connection then closes
after the answer, RFC 9112 6.1), and a head llhttp refuses for an obs-fold, repeated identical
Content-Length values or a bare LF after the request line is rewritten (``normalise_head``) and
parsed again by a fresh parser, from where it starts (``head_start`` replays what was fed since
the last message boundary, kept up to the head cap: behind a larger body in the same read, such
a head is refused 400 as llhttp refuses it). The proxy re-frames every body upstream and never
forwards a head's bytes, so reading these as h11 does smuggles nothing.

``LimitedProtocol`` (``server.py``) parses with ``_lenient`` and, when llhttp refuses a head,
finds its start with ``head_start`` and feeds ``normalise_head``'s rewrite to a fresh parser.
"""

from __future__ import annotations

import re

import httptools

__all__ = ["head_start", "normalise_head"]


def _lenient(parser: httptools.HttpRequestParser) -> httptools.HttpRequestParser:
    """The leniencies this server parses with. uvicorn's: bytes after a ``connection: close``
    request are not an error (its answer goes out first). Ours, each where h11 does the same
    and the proxy's re-framing upstream keeps it unambiguous: a bare LF ends a line (RFC 9112
    2.2 lets a recipient accept it), and Transfer-Encoding wins over a Content-Length beside it
    (RFC 9112 6.3; the connection then closes after the answer, 6.1: ``_must_close``)."""
    parser.set_dangerous_leniencies(
        lenient_data_after_close=True,
        lenient_optional_cr_before_lf=True,
        lenient_chunked_length=True,
    )
    return parser


_BLANK_LINE = re.compile(b"\n\r?\n")  # where a head ends, as h11 finds it (_receivebuffer)
_FOLD = (b" ", b"\t")


def normalise_head(head: bytes) -> bytes | None:
    """A request head as h11 reads it, written as CRLF lines llhttp parses strictly: lines end at
    LF (a CR before it dropped), an obs-fold line joins the line before with one space (RFC 9112
    5.2), and repeated identical Content-Length values, as fields or a list, are one field (RFC
    9110 8.6). None where h11 refuses it: a fold before the first field, Content-Length values
    that differ. ``head`` ends with its blank line; anything else is left for llhttp to judge."""
    lines = head.split(b"\n")[:-2]
    lines = [line[:-1] if line[-1:] == b"\r" else line for line in lines]
    fields: list[bytes] = []
    for line in lines[1:]:
        if line[:1] in _FOLD:
            if not fields:
                return None  # h11: "continuation line at start of headers"
            fields[-1] += b" " + line.lstrip(b" \t")
        else:
            fields.append(line)
    seen: bytes | None = None
    kept = [lines[0]]
    for field in fields:
        name, colon, value = field.partition(b":")
        if colon and name.lower() == b"content-length":
            lengths = {length.strip() for length in value.split(b",")}
            if len(lengths) != 1:
                return None
            (length,) = lengths
            if seen is None:
                seen = length
                kept.append(b"content-length: " + length)
            elif length != seen:
                return None
            continue
        kept.append(field)
    return b"\r\n".join(kept) + b"\r\n\r\n"


class _Starts:
    """Where each message begins, for ``head_start``'s line-by-line replay."""

    def __init__(self) -> None:
        self.at = 0  # the line being fed begins here
        self.body = 0  # body bytes llhttp handed over from this line
        self.begun: int | None = None

    def on_message_begin(self) -> None:
        self.begun = self.at + self.body

    def on_body(self, body: bytes) -> None:
        self.body += len(body)


def head_start(stream: bytes) -> int | None:
    """Where in ``stream`` (which starts at a message boundary and ends where llhttp stopped
    with an error in a head) that head begins. A fresh parser is fed one line at a time: a head
    and a chunked body end at a line's end, and a Content-Length body's end is its bytes, so
    each message begins at a line's start or after the body bytes in that line. Runs only when
    llhttp refuses a head; None if the replay does not end in the same refusal."""
    starts = _Starts()
    parser = _lenient(httptools.HttpRequestParser(starts))
    at, size = 0, len(stream)
    while at < size:
        end = stream.find(b"\n", at)
        end = size if end < 0 else end + 1
        starts.at, starts.body = at, 0
        try:
            parser.feed_data(stream[at:end])
        except httptools.HttpParserError:
            return starts.begun
        at = end
    return None
