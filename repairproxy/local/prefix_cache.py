"""KV state of long shared prompt prefixes (system policy + tools), kept on disk across processes.

Every episode of a domain starts with the same system turn (τ²-bench's Retail one is ~4,800
tokens, minutes of prefill on two cores). The engine evaluates that turn on its own, saves the
llama.cpp state for exactly those tokens here, and a later process (the next demo, the next cell
of a study) loads it in about a second instead of prefilling again. Files are keyed by the prefix
tokens, the model file and the llama.cpp build, written atomically, and the least recently used
beyond ``max_files`` are removed.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["PrefixStateCache"]

_SUFFIX = ".kvstate"


class PrefixStateCache:
    """Saved llama.cpp states, one file per distinct prefix, under ``directory/<model>``."""

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

    def load(self, ctx: Any, tokens: Sequence[int]) -> bool:
        """Restore the state saved for exactly ``tokens`` into ``ctx``; False when that failed.

        After False the context's memory may have been cleared: the caller re-evaluates.
        """
        path = self.path_for(tokens)
        if not path.is_file():
            return False
        capacity = len(tokens)
        out = (self._llama_cpp.llama_token * capacity)()
        count = ctypes.c_size_t(0)
        ok = self._llama_cpp.llama_state_load_file(
            ctx, str(path).encode(), out, capacity, ctypes.byref(count)
        )
        if not ok or count.value != capacity or list(out) != list(tokens):
            path.unlink(missing_ok=True)  # unreadable or stale: make it again
            return False
        os.utime(path)  # recently used
        return True

    def save(self, ctx: Any, tokens: Sequence[int]) -> Path | None:
        """Write the context's state, which must hold exactly ``tokens``; None if it failed."""
        path = self.path_for(tokens)
        self.directory.mkdir(parents=True, exist_ok=True)
        handle, scratch = tempfile.mkstemp(dir=self.directory, prefix=".", suffix=".part")
        os.close(handle)
        array = (self._llama_cpp.llama_token * len(tokens))(*tokens)
        try:
            if not self._llama_cpp.llama_state_save_file(ctx, scratch.encode(), array, len(tokens)):
                return None
            os.replace(scratch, path)
        finally:
            Path(scratch).unlink(missing_ok=True)
        self._evict()
        return path

    def _evict(self) -> None:
        files = sorted(
            self.directory.glob(f"*{_SUFFIX}"), key=lambda p: p.stat().st_mtime, reverse=True
        )
        for stale in files[self.max_files :]:
            stale.unlink(missing_ok=True)
