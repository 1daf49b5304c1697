"""KV state of long shared prompt prefixes (system policy + tools), kept on disk across processes.

Every episode of a domain starts with the same system turn (τ²-bench's Retail one is 4,968 tokens
with the embedded template: minutes of prefill on two cores). The engine evaluates that turn on its
own, saves the llama.cpp state for exactly those tokens here, and a later process (the next demo,
the next cell of a study) loads it in about a second instead of prefilling again. Files are keyed
by the prefix tokens, the model file and the llama.cpp build, written atomically, and the least
recently used beyond ``max_files`` are removed.
"""

from __future__ import annotations

import array
import ctypes
import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PrefixStateCache", "SavedPrefix"]

_SUFFIX = ".kvstate"
_TOKENS = ".tokens"


@dataclass(frozen=True, slots=True)
class SavedPrefix:
    """A saved state: its file, the tokens it holds, and how many lead the prompt asked about."""

    path: Path
    tokens: tuple[int, ...]
    common: int


class PrefixStateCache:
    """Saved llama.cpp states, one file per distinct prefix, under ``directory/<model>``.

    Each ``.kvstate`` file has a ``.tokens`` sidecar (its tokens, int32) so a prompt can reuse the
    saved state sharing its longest prefix: a system turn that differs only at its end (a repair
    instruction appended, another tool list) loads the common part and prefills the rest.
    """

    def __init__(self, directory: Path, model_path: Path, *, max_files: int = 6) -> None:
        import llama_cpp

        self._llama_cpp = llama_cpp
        stat = model_path.stat()
        self._salt = f"{model_path.name}:{stat.st_size}:{llama_cpp.__version__}".encode()
        self.directory = directory / model_path.stem
        self.max_files = max_files

    def path_for(self, tokens: Sequence[int]) -> Path:
        digest = hashlib.sha256(self._salt)
        digest.update(b",".join(str(t).encode() for t in tokens))
        return self.directory / f"{digest.hexdigest()[:40]}{_SUFFIX}"

    def has(self, tokens: Sequence[int]) -> bool:
        return self.path_for(tokens).is_file()

    def best_match(
        self, tokens: Sequence[int], *, min_common: int = 1, max_tokens: int | None = None
    ) -> SavedPrefix | None:
        """The saved state whose tokens share the longest prefix with ``tokens``.

        Only states that share at least ``min_common`` tokens count (loading a 140 MB state to
        reuse the three tokens every system turn opens with costs more than it saves), and only
        states of at most ``max_tokens`` tokens (a longer one does not fit this context: loading
        it fails, and that failure says nothing about the file).
        """
        exact = self.path_for(tokens)
        if exact.is_file():  # named by its tokens: no need to read the sidecar
            return SavedPrefix(exact, tuple(tokens), len(tokens))
        best: SavedPrefix | None = None
        for path in self.directory.glob(f"*{_SUFFIX}"):
            try:
                saved = array.array("i", path.with_suffix(_TOKENS).read_bytes())
            except (OSError, ValueError):
                continue
            if max_tokens is not None and len(saved) > max_tokens:
                continue
            common = 0
            for a, b in zip(saved, tokens, strict=False):
                if a != b:
                    break
                common += 1
            if common >= max(min_common, 1) and (best is None or common > best.common):
                best = SavedPrefix(path, tuple(saved), common)
        return best

    def load(self, ctx: Any, saved: SavedPrefix) -> bool:
        """Restore ``saved`` into ``ctx`` (all its tokens); False when that failed.

        After False the context's memory may have been cleared: the caller re-evaluates.
        """
        capacity = len(saved.tokens)
        out = (self._llama_cpp.llama_token * capacity)()
        count = ctypes.c_size_t(0)
        ok = self._llama_cpp.llama_state_load_file(
            ctx, str(saved.path).encode(), out, capacity, ctypes.byref(count)
        )
        if not ok or count.value != capacity or tuple(out) != saved.tokens:
            saved.path.unlink(missing_ok=True)  # unreadable or stale: make it again
            saved.path.with_suffix(_TOKENS).unlink(missing_ok=True)
            return False
        os.utime(saved.path)  # recently used
        return True

    def save(self, ctx: Any, tokens: Sequence[int]) -> Path | None:
        """Write the context's state, which must hold exactly ``tokens``; None if it failed."""
        path = self.path_for(tokens)
        self.directory.mkdir(parents=True, exist_ok=True)
        handle, scratch = tempfile.mkstemp(dir=self.directory, prefix=".", suffix=".part")
        os.close(handle)
        state_tokens = (self._llama_cpp.llama_token * len(tokens))(*tokens)
        try:
            if not self._llama_cpp.llama_state_save_file(
                ctx, scratch.encode(), state_tokens, len(tokens)
            ):
                return None
            os.replace(scratch, path)
        finally:
            Path(scratch).unlink(missing_ok=True)
        # The sidecar after the state: a sidecar on its own can only be a state removed since.
        self._write_atomically(path.with_suffix(_TOKENS), array.array("i", tokens).tobytes())
        self._evict()
        return path

    def _write_atomically(self, path: Path, data: bytes) -> None:
        handle, scratch = tempfile.mkstemp(dir=self.directory, prefix=".", suffix=".part")
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(scratch, path)

    def _evict(self) -> None:
        files = sorted(
            self.directory.glob(f"*{_SUFFIX}"), key=lambda p: p.stat().st_mtime, reverse=True
        )
        for stale in files[self.max_files :]:
            stale.unlink(missing_ok=True)
            stale.with_suffix(_TOKENS).unlink(missing_ok=True)
        for sidecar in self.directory.glob(f"*{_TOKENS}"):  # a state whose save failed
            if not sidecar.with_suffix(_SUFFIX).exists():
                sidecar.unlink(missing_ok=True)
