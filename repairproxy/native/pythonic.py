"""Pythonic calls: ``[f(a=1), g(b='x')]`` bare or inside Llama 4's, LFM2's and OLMo 3's markers,
and Granite's one-call-per-line; literals only, never evaluated."""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable
from typing import Any

from repairproxy.native.base import (
    MAX_DEPTH,
    MAX_MATCHES,
    Malformed,
    NativeCall,
    NativeMatch,
    Scanner,
    Schemas,
    declared,
    grouped,
    make_calls,
)
from repairproxy.native.values import INTEGER, NAMED_CONSTANTS, literal

__all__ = [
    "bare_lines_may",
    "lfm2_list",
    "pythonic_bare",
    "pythonic_bare_lines",
    "pythonic_lines",
    "pythonic_list",
    "pythonic_may",
    "pythonic_wrapped",
    "tolerant_calls",
]

_PY_LIST_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")


def _pythonic_call(node: ast.expr) -> tuple[str, dict[str, Any]]:
    if not isinstance(node, ast.Call) or node.args:
        raise Malformed
    name = _dotted(node.func)
    arguments = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise Malformed
        arguments[keyword.arg] = literal(keyword.value, 0)
    return name, arguments


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _dotted(node.value) + "." + node.attr
    raise Malformed


def pythonic_list(source: str) -> list[tuple[str, dict[str, Any]]] | None:
    """``[f(a=1), g(b='x')]``: the calls whose arguments are literals (a bad one is skipped)."""
    try:
        node = ast.parse(source.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return _siblings(source)
    items = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    calls = []
    for item in items:
        if not isinstance(item, ast.Call):
            return None
        try:
            calls.append(_pythonic_call(item))
        except (Malformed, RecursionError):
            continue  # vLLM drops a call with an unreadable argument and keeps the others
    return calls or None


_SIBLING = re.compile(r"\)\s*,\s*(?=[A-Za-z_][\w.]*\s*\()")


def _siblings(source: str) -> list[tuple[str, dict[str, Any]]] | None:
    """A list Python's grammar refuses as a whole: its calls read one by one (split where one
    call's ``)`` is followed by ``, name(``), the unreadable ones dropped, as vLLM does."""
    text = source.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    inner = text[1:-1]
    pieces = []
    position = 0
    for split in _SIBLING.finditer(inner):
        pieces.append(inner[position : split.start() + 1])
        position = split.end()
    pieces.append(inner[position:])
    if len(pieces) < 2:
        return None
    calls = []
    for piece in pieces:
        try:
            node = ast.parse(piece.strip(), mode="eval").body
            calls.append(_pythonic_call(node))
        except (SyntaxError, ValueError, RecursionError, MemoryError, Malformed):
            continue
    return calls or None


def tolerant_calls(source: str) -> list[tuple[str, dict[str, Any]]] | None:
    """``[f(k=literal), ...]`` read by the tolerant reader (any keyword name, commas between the
    calls optional: one call per line reads too); None when it is not that."""
    try:
        return _TolerantPythonic(source.strip()).calls()
    except (Malformed, IndexError, RecursionError):
        return None


def lfm2_list(source: str) -> list[tuple[str, dict[str, Any]]] | None:
    """LFM2's pythonic list: Python's grammar first, then a tolerant reading of what it refuses
    (raw newlines and NUL bytes in strings, quotes left unescaped inside a string, ``07``)."""
    strict = pythonic_list(source)
    if strict is not None:
        return strict
    try:
        return _TolerantPythonic(source.strip()).calls()
    except (Malformed, IndexError, RecursionError):
        return None


_PY_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)")
_PY_NAME = re.compile(r"[A-Za-z_][\w.]*")
_PY_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", "'": "'", '"': '"'}


class _TolerantPythonic:
    """A forgiving reader of ``[f(k=literal, ...), ...]``: a quote closes its string only where
    what follows can continue the call (``,``, ``:``, closing brackets, the end), so a quote the
    model forgot to escape stays inside the string."""

    __slots__ = ("position", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.position = 0

    def _space(self) -> None:
        while self.position < len(self.text) and self.text[self.position].isspace():
            self.position += 1

    def _expect(self, character: str) -> None:
        self._space()
        if not self.text.startswith(character, self.position):
            raise Malformed
        self.position += 1

    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        self._expect("[")
        calls = []
        while True:
            self._space()
            if self.text.startswith("]", self.position):
                self.position += 1
                break
            calls.append(self._call())
            self._space()
            if self.text.startswith(",", self.position):
                self.position += 1
        self._space()
        if self.position != len(self.text) or not calls:
            raise Malformed
        return calls

    def _call(self) -> tuple[str, dict[str, Any]]:
        self._space()
        name = _PY_NAME.match(self.text, self.position)
        if name is None:
            raise Malformed
        self.position = name.end()
        self._expect("(")
        arguments: dict[str, Any] = {}
        while True:
            self._space()
            if self.text.startswith(")", self.position):
                self.position += 1
                return name.group(), arguments
            key = _PY_NAME.match(self.text, self.position)
            if key is None:
                raise Malformed
            self.position = key.end()
            self._expect("=")
            arguments[key.group()] = self._value(0)
            self._space()
            if self.text.startswith(",", self.position):
                self.position += 1

    def _value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise Malformed
        self._space()
        text = self.text
        character = text[self.position]
        if character in "'\"":
            return self._string(character)
        if character in "[({":
            return self._container(character, depth)
        number = _PY_NUMBER.match(text, self.position)
        if number is not None and number.group():
            self.position = number.end()
            token = number.group()
            if INTEGER.fullmatch(token.lstrip("+")):
                return int(token)
            value = float(token)
            if not math.isfinite(value):
                raise Malformed
            return value
        name = _PY_NAME.match(text, self.position)
        if name is None or name.group() not in NAMED_CONSTANTS:
            raise Malformed
        self.position = name.end()
        return NAMED_CONSTANTS[name.group()]

    def _container(self, opener: str, depth: int) -> Any:
        closer = {"[": "]", "(": ")", "{": "}"}[opener]
        self.position += 1
        items: list[Any] = []
        pairs: dict[str, Any] = {}
        while True:
            self._space()
            if self.text.startswith(closer, self.position):
                self.position += 1
                return pairs if opener == "{" and (pairs or not items) else items
            value = self._value(depth + 1)
            self._space()
            if opener == "{" and self.text.startswith(":", self.position):
                self.position += 1
                if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                    raise Malformed
                pairs[str(value)] = self._value(depth + 1)
            else:
                items.append(value)
            self._space()
            if self.text.startswith(",", self.position):
                self.position += 1
            elif not self.text.startswith(closer, self.position):
                raise Malformed

    def _string(self, quote: str) -> str:
        text = self.text
        position = self.position + 1
        pieces: list[str] = []
        while True:
            if position >= len(text):
                raise Malformed
            character = text[position]
            if character == "\\" and position + 1 < len(text):
                following = text[position + 1]
                pieces.append(_PY_ESCAPES.get(following, "\\" + following))
                position += 2
                continue
            if character == quote and self._closes(position + 1):
                self.position = position + 1
                return "".join(pieces)
            pieces.append(character)
            position += 1

    def _closes(self, position: int) -> bool:
        """Whether a quote ending at ``position`` can close its string: what follows goes on."""
        text = self.text
        closed = False
        while position < len(text) and (text[position].isspace() or text[position] in ")]}"):
            closed = closed or not text[position].isspace()
            position += 1
        if position == len(text):
            return True
        return text[position] == "," or (text[position] == ":" and not closed)


def pythonic_lines(source: str) -> list[tuple[str, dict[str, Any]]] | None:
    """Calls one per line (OLMo 3, Granite pythonic)."""
    try:
        tree = ast.parse(source.strip(), mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        # Keyword names Python reserves (``from="SFO"``) are still argument names.
        return tolerant_calls("[" + source.strip() + "]")
    calls = []
    for statement in tree.body:
        if not isinstance(statement, ast.Expr) or not isinstance(statement.value, ast.Call):
            return None
        try:
            calls.append(_pythonic_call(statement.value))
        except (Malformed, RecursionError):
            continue
    return calls or None


def pythonic_wrapped(
    family: str,
    opener: str,
    closer: str,
    reader: Callable[[str], list[tuple[str, dict[str, Any]]] | None],
) -> Callable[[Scanner, Schemas | None], list[NativeMatch]]:
    """Pythonic calls between markers (Llama 4 ``<|python_start|>``, LFM2, OLMo 3)."""

    def recognise(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
        del schemas
        text = scanner.text
        matches: list[NativeMatch] = []
        position = 0
        while len(matches) < MAX_MATCHES:
            start = scanner.find(opener, position)
            if start < 0:
                break
            close = scanner.find(closer, start + len(opener))
            stop = close if close >= 0 else len(text)
            position = stop
            body = text[start + len(opener) : stop]
            calls = reader(body)
            if calls is None:
                continue
            end = close + len(closer) if close >= 0 else len(text)
            echo = body + closer
            if close >= 0 and text.startswith(echo, end):
                end += len(echo)  # the model echoed the call after its end marker
            matches.append(
                NativeMatch(
                    family, start, end, make_calls((n, a, start, end, False) for n, a in calls)
                )
            )
            position = end
        return matches

    return recognise


def pythonic_may(text: str, schemas: Schemas | None) -> bool:
    """Whether a bare pythonic list can be in ``text``: ``[NAME(`` somewhere."""
    del schemas
    return _PY_LIST_START.search(text) is not None


def pythonic_bare(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """``[f(a=1), g(b=2)]`` in the text, no markers (pythonic, Llama 4 stripped, LFM2 stripped).

    What Python's grammar refuses is read tolerantly (as LFM2's) only when every name is a
    declared tool; a list repeated verbatim right after itself is the model echoing its call.
    """
    text = scanner.text
    if "(" not in text or "[" not in text:
        return []
    ends = scanner.bracket_ends("\"'")
    matches: list[NativeMatch] = []
    consumed = 0
    for found in scanner.finditer(_PY_LIST_START):
        start = found.start()
        if start < consumed or len(matches) >= MAX_MATCHES:
            continue
        end = ends.get(start)
        if end is None:
            # A quote the model broke unbalances the brackets: a list that ends its line is
            # still read (its calls one by one), once per line.
            line_end = text.find("\n", start)
            line_end = len(text) if line_end < 0 else line_end
            scanner.count(line_end - start)
            consumed = line_end
            end = line_end
            while end > start and text[end - 1] in " \t\r":
                end -= 1
            if text[end - 1] != "]":
                continue
        consumed = end
        scanner.count(end - start)
        source = text[start:end]
        calls = pythonic_list(source)
        if calls is None:
            calls = lfm2_list(source)
            if calls is None or not all(declared(name, schemas) for name, _ in calls):
                continue
        stop = end
        if text.startswith(source, end):
            stop = consumed = end + len(source)
        matches.append(
            NativeMatch(
                "pythonic", start, stop, make_calls((n, a, start, end, False) for n, a in calls)
            )
        )
    return matches


_PY_LINE_CALL = re.compile(r"^[ \t]*([A-Za-z_][\w.]*)\(", re.MULTILINE)


def bare_lines_may(text: str, schemas: Schemas | None) -> bool:
    """Whether Granite's bare lines can be in ``text``: a line opening with ``NAME(`` for a
    declared tool."""
    if schemas is None:
        return False
    return any(found.group(1) in schemas for found in _PY_LINE_CALL.finditer(text))


def pythonic_bare_lines(scanner: Scanner, schemas: Schemas | None) -> list[NativeMatch]:
    """Granite pythonic: whole lines that are each one call to a declared tool."""
    text = scanner.text
    if schemas is None or "(" not in text:
        return []
    ends = scanner.bracket_ends("\"'")
    calls: list[NativeCall] = []
    spans: list[tuple[int, int]] = []
    for found in scanner.finditer(_PY_LINE_CALL):
        if spans and found.start() < spans[-1][1]:
            continue
        name = found.group(1)
        close = ends.get(found.end() - 1)
        if close is None or name not in schemas:
            continue
        line_end = text.find("\n", close)
        line_end = len(text) if line_end < 0 else line_end
        if text[close:line_end].strip():
            continue
        scanner.count(close - found.start())
        read = pythonic_lines(text[found.start() : close])
        if read is None or len(read) != 1:
            continue
        ((call_name, arguments),) = read
        calls.append(NativeCall(call_name, arguments, found.start(), close))
        spans.append((found.start(), close))
    return grouped(scanner, "granite_pythonic", calls, spans, None)
