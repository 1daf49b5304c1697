"""Progress bars that stay readable when piped.

On a terminal tqdm redraws its bar in place. Piped (``make`` through ``tee``, a CI log) each redraw
is a carriage return, so a whole download or grid becomes one line of thousands of characters.
There each redraw is written as its own line instead, at most one per ``pipe_interval`` seconds
(and the last one when the bar closes).
"""

from __future__ import annotations

import sys
from typing import IO, Any

__all__ = ["progress_bar"]


class _Lines:
    """A text stream that writes each of tqdm's redraws as a line of its own."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        for piece in text.split("\r"):
            line = piece.rstrip(" \n")
            if line.strip():
                self._stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self._stream.flush()


def progress_bar(
    *, file: IO[str] | None = None, pipe_interval: float = 10.0, **options: Any
) -> Any:
    """A ``tqdm`` bar on ``file`` (stderr by default): in place on a terminal, one line per
    redraw at most every ``pipe_interval`` seconds elsewhere. ``options`` go to tqdm."""
    from tqdm import tqdm

    stream = sys.stderr if file is None else file
    isatty = getattr(stream, "isatty", None)
    if callable(isatty) and isatty():
        return tqdm(file=stream, **options)
    options.setdefault("mininterval", pipe_interval)
    options.setdefault("ascii", True)
    return tqdm(file=_Lines(stream), dynamic_ncols=False, ncols=100, **options)
