"""One ``llama_cpp.Llama`` behind a lock: prompt text in, sampled text, logprobs and usage out.

Generation is serialised (one model, few cores), and consecutive requests share the KV cache through
llama.cpp's prefix matching, so each turn of an episode only prefills what the last turn added.
A long system turn (policy + tools) is evaluated on its own and its state kept on disk
(``PrefixStateCache``), so the first turn of a later episode, in any process, loads it instead of
prefilling it. Sampling never uses a grammar unless the caller passes one (forced tool choice).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from repairproxy.local.prefix_cache import PrefixStateCache

if TYPE_CHECKING:  # numpy comes with llama-cpp-python; the proxy alone does not need it
    import numpy as np


__all__ = [
    "ContextOverflowError",
    "Engine",
    "EngineConfig",
    "Generation",
    "SamplingParams",
    "TokenLogprob",
]


class ContextOverflowError(ValueError):
    """The prompt does not leave room for a single generated token."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model_path: Path
    n_ctx: int = 16384
    n_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    n_batch: int = 512
    # Where system-turn KV states are kept across processes (None: RAM prefix reuse only).
    prompt_cache_dir: Path | None = None
    prompt_cache_min_tokens: int = 512  # shorter system turns prefill in seconds anyway
    prompt_cache_max_files: int = 6


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What a request may set. Defaults are Qwen2.5's generation_config, which vLLM applies too."""

    max_tokens: int | None = None
    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    min_p: float = 0.0
    repeat_penalty: float = 1.05
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    grammar: str | None = None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    logprob: float
    bytes: list[int]
    top: tuple[tuple[str, float, list[int]], ...] = ()

    def to_openai(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "logprob": self.logprob,
            "bytes": self.bytes,
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": b} for t, lp, b in self.top],
        }


@dataclass(slots=True)
class Generation:
    text: str = ""
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    # Where the system turn's KV came from: "ram", "disk", "disk+computed", "computed", "none".
    prefix_source: str = "none"


# on_delta(text_safe_to_emit, logprobs_of_tokens_since_last_call)
DeltaCallback = Callable[[str, list[TokenLogprob]], None]


def _decode_prefix(buffer: bytes) -> str:
    """The text of ``buffer`` up to any incomplete UTF-8 sequence at its end."""
    try:
        return buffer.decode("utf-8")
    except UnicodeDecodeError as exc:
        return buffer[: exc.start].decode("utf-8", errors="replace")


def _stop_holdback(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters could still be the start of a stop string."""
    hold = 0
    for stop in stops:
        for keep in range(min(len(stop) - 1, len(text)), hold, -1):
            if stop.startswith(text[len(text) - keep :]):
                hold = keep
                break
    return hold


class Engine:
    """Loads the GGUF once; ``generate`` is thread-safe and serialised."""

    def __init__(self, config: EngineConfig) -> None:
        # ggml's OpenMP threads spin between ops by default; on shared cores (CI, a laptop with a
        # browser, two model servers) spinning threads starve each other: 3-5x slower here.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        import llama_cpp  # deferred: the proxy and the unit tests never need the runtime

        self._llama_cpp = llama_cpp
        self.config = config
        self._lock = threading.Lock()
        self.llm = llama_cpp.Llama(
            model_path=str(config.model_path),
            n_ctx=config.n_ctx,
            n_threads=config.n_threads,
            n_threads_batch=config.n_threads,
            n_batch=config.n_batch,
            logits_all=False,  # logprobs are read from the last row only; all rows would be GBs
            verbose=False,
        )
        self._vocab = self.llm._model.vocab
        self._n_vocab = self.llm.n_vocab()
        end_of_turn = self.tokenize("<|im_end|>")
        self._end_of_turn = end_of_turn[0] if len(end_of_turn) == 1 else None
        self._prefix_cache = (
            PrefixStateCache(
                config.prompt_cache_dir, config.model_path, max_files=config.prompt_cache_max_files
            )
            if config.prompt_cache_dir is not None
            else None
        )

    def tokenize(self, text: str) -> list[int]:
        tokens: list[int] = self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        return tokens

    def _piece(self, token: int) -> bytes:
        piece: bytes = self.llm.detokenize([token], special=False)
        return piece

    def _last_logprobs(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        import numpy as np

        ptr = self._llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).astype(np.float32)
        shifted = logits - logits.max()
        result: np.ndarray[Any, np.dtype[np.float32]] = shifted - np.log(np.exp(shifted).sum())
        return result

    def _logprob_of(self, token: int, top_n: int) -> TokenLogprob:
        import numpy as np

        logprobs = self._last_logprobs()
        piece = self._piece(token)
        top: list[tuple[str, float, list[int]]] = []
        if top_n > 0:
            best = np.argpartition(-logprobs, top_n)[:top_n]
            for candidate in sorted(best.tolist(), key=lambda i: -float(logprobs[i])):
                raw = self._piece(candidate)
                top.append(
                    (raw.decode("utf-8", errors="replace"), float(logprobs[candidate]), list(raw))
                )
        value = float(logprobs[token])
        return TokenLogprob(
            piece.decode("utf-8", errors="replace"), max(value, -9999.0), list(piece), tuple(top)
        )

    def _cached_prefix(self, tokens: list[int]) -> int:
        """How many leading ``tokens`` the context already holds (only its live tokens count)."""
        cached = 0
        for a, b in zip(self.llm._input_ids.tolist(), tokens, strict=False):  # live tokens
            if a != b:
                break
            cached += 1
        return cached

    def _system_turn_length(self, tokens: list[int]) -> int:
        """Tokens up to the end of the first turn when it is long enough to keep; else 0."""
        if self._end_of_turn is None or self._prefix_cache is None:
            return 0
        try:
            end = tokens.index(self._end_of_turn) + 1
        except ValueError:
            return 0
        if end < self.config.prompt_cache_min_tokens or end >= len(tokens):
            return 0
        return end

    def _ensure_prefix(
        self, prefix: list[int], cached: int, cancelled: threading.Event | None
    ) -> tuple[str, int]:
        """Make the context hold ``prefix`` (or more of the prompt); say where it came from and
        how many of its tokens were not evaluated here.

        "ram": already there; "disk": loaded whole; "disk+computed": a saved state sharing its
        start was loaded and the rest evaluated; "computed": evaluated here. The prefix is always
        evaluated as a batch of its own and then saved, so a state loaded later is what this
        process would have computed.
        """
        assert self._prefix_cache is not None
        if cached >= len(prefix):
            return "ram", cached
        source = "computed"
        match = self._prefix_cache.best_match(
            prefix, min_common=self.config.prompt_cache_min_tokens, max_tokens=self.config.n_ctx
        )
        if match is not None and match.common > cached:
            if self._prefix_cache.load(self.llm._ctx.ctx, match):
                # Llama tracks its tokens in input_ids[:n_tokens]; tell it what the state holds,
                # up to where it agrees with this prompt (eval drops the KV beyond that).
                self.llm.input_ids[: len(match.tokens)] = match.tokens
                self.llm.n_tokens = match.common
                if match.common == len(prefix):
                    return "disk", match.common
                cached, source = match.common, "disk+computed"
            else:
                cached = 0  # a failed load may have cleared the memory
        self.llm.n_tokens = min(cached, self.llm.n_tokens)
        # In n_batch steps (as eval would), so a client that leaves stops a minutes-long prefill.
        while self.llm.n_tokens < len(prefix):
            if cancelled is not None and cancelled.is_set():
                return "cancelled", cached
            start = self.llm.n_tokens
            self.llm.eval(prefix[start : start + self.config.n_batch])
        self._prefix_cache.save(self.llm._ctx.ctx, prefix)
        return source, cached

    def generate(
        self,
        prompt: str,
        params: SamplingParams,
        *,
        on_delta: DeltaCallback | None = None,
        cancelled: threading.Event | None = None,
    ) -> Generation:
        """Sample a completion of ``prompt``; ``on_delta`` receives text as it becomes final."""
        with self._lock:
            return self._generate(prompt, params, on_delta, cancelled)

    def _generate(
        self,
        prompt: str,
        params: SamplingParams,
        on_delta: DeltaCallback | None,
        cancelled: threading.Event | None,
    ) -> Generation:
        llama_cpp = self._llama_cpp
        tokens = self.tokenize(prompt)
        room = self.config.n_ctx - len(tokens)
        if room < 1:
            raise ContextOverflowError(
                f"the prompt has {len(tokens)} tokens; this model's context is {self.config.n_ctx}"
            )
        limit = room if params.max_tokens is None else min(params.max_tokens, room)
        result = Generation(prompt_tokens=len(tokens), cached_tokens=self._cached_prefix(tokens))
        started = time.perf_counter()
        system_turn = self._system_turn_length(tokens)
        if system_turn:
            source, reused = self._ensure_prefix(
                tokens[:system_turn], result.cached_tokens, cancelled
            )
            result.prefix_source, result.cached_tokens = source, max(result.cached_tokens, reused)
            if source == "cancelled":
                result.finish_reason = "cancelled"
                return result
        self.llm.set_seed(params.seed if params.seed is not None else random.getrandbits(31))
        grammar = (
            llama_cpp.LlamaGrammar.from_string(params.grammar, verbose=False)
            if params.grammar
            else None
        )
        buffer = b""
        emitted = 0
        pending: list[TokenLogprob] = []
        first_token_at: float | None = None
        result.finish_reason = "length"
        if limit > 0:
            for token in self.llm.generate(
                tokens,
                temp=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                min_p=params.min_p,
                repeat_penalty=params.repeat_penalty,
                grammar=grammar,
            ):
                if first_token_at is None:
                    first_token_at = time.perf_counter()
                if llama_cpp.llama_vocab_is_eog(self._vocab, token):
                    result.finish_reason = "stop"
                    break
                result.completion_tokens += 1
                if params.logprobs:
                    logprob = self._logprob_of(token, params.top_logprobs)
                    pending.append(logprob)
                    result.logprobs.append(logprob)
                buffer += self._piece(token)
                text = _decode_prefix(buffer)
                cut = min((i for s in params.stop if (i := text.find(s)) >= 0), default=-1)
                if cut >= 0:
                    text, result.finish_reason = text[:cut], "stop"
                    buffer = text.encode("utf-8")
                    break
                safe = len(text) - _stop_holdback(text, params.stop)
                if on_delta is not None and (safe > emitted or pending):
                    on_delta(text[emitted:safe], pending)
                    emitted, pending = safe, []
                if result.completion_tokens >= limit:
                    break
                if cancelled is not None and cancelled.is_set():
                    result.finish_reason = "cancelled"
                    break
        result.text = buffer.decode("utf-8", errors="replace")
        if on_delta is not None and (len(result.text) > emitted or pending):
            on_delta(result.text[emitted:], pending)
        end = time.perf_counter()
        result.prefill_seconds = (first_token_at or end) - started
        result.decode_seconds = end - (first_token_at or end)
        return result
