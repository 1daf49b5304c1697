"""Ask one arm every decision point it has not answered yet, appending each raw answer to the log.

An arm is named ``NAME=SPEC``: an OpenAI-compatible base URL (vLLM serving a BF16 / FP8 / AWQ arm
made by ``evals.arms``), an embedded arm name (``repairproxy.local.arms``), or a folder holding one
GGUF file (served by the embedded llama.cpp server). The request is what ``LLMAgent`` sends, at
temperature 0, plus ``logprobs`` for the margin (dropped for the arm if the upstream refuses them).
Points go in replay order, one arm at a time, so an embedded arm reuses each prompt's prefix.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx

from evals.screen.answers import Answer, AnswerLog
from evals.screen.points import DecisionPoint

__all__ = ["ArmSpec", "AskOptions", "Progress", "ScreenError", "ask_arm", "parse_arm", "served"]

TOP_LOGPROBS = 5
_RETRIES = 3


class ScreenError(RuntimeError):
    """An arm cannot be reached or served, or a resumed screen does not match its points."""


@dataclass(frozen=True)
class ArmSpec:
    name: str
    spec: str  # URL, embedded arm name or GGUF folder, as given

    @property
    def kind(self) -> str:
        if self.spec.startswith(("http://", "https://")):
            return "url"
        return "dir" if Path(self.spec).expanduser().is_dir() else "embedded"


def parse_arm(text: str) -> ArmSpec:
    name, sep, spec = text.partition("=")
    if not sep or not name or not spec:
        raise ScreenError(f"--arm {text!r}: expected NAME=URL|ARM|DIR")
    return ArmSpec(name, spec)


@dataclass(frozen=True)
class AskOptions:
    max_tokens: int = 512
    seed: int = 0
    timeout_s: float = 1800.0  # a cold system turn on busy CPU cores took over 600 s
    concurrency: int = 1
    threads: int | None = None  # embedded arms: llama.cpp threads
    n_ctx: int = 16384
    model: str | None = None  # the model id to send; default: the upstream's first /models entry


def _gguf_in(folder: Path) -> Path:
    found = sorted(folder.glob("*.gguf")) + sorted(folder.glob("*/*.gguf"))
    if len(found) != 1:
        raise ScreenError(
            f"{folder} holds {len(found)} GGUF files; an arm folder for the embedded server holds "
            "exactly one (a vLLM checkpoint: serve it with vllm and pass NAME=URL)"
        )
    return found[0]


@contextmanager
def served(arm: ArmSpec, options: AskOptions) -> Iterator[str]:
    """The arm's ``/v1`` base URL, starting (and afterwards stopping) an embedded server for it."""
    if arm.kind == "url":
        yield arm.spec.rstrip("/")
        return
    try:
        from repairproxy.local import arm_named, start_embedded_upstream
        from repairproxy.local.arms import ARMS
    except ImportError as exc:  # pragma: no cover - the local extra is part of dev installs
        raise ScreenError(f"embedded arms need the local extra: {exc}") from exc
    with tempfile.TemporaryDirectory(prefix="screen-arm-") as scratch:
        if arm.kind == "dir":
            # Serve the folder's GGUF under the reference arm's file name in a scratch cache.
            models = Path(scratch) / "models"
            models.mkdir()
            (models / ARMS["q4_k_m"].filename).symlink_to(_gguf_in(Path(arm.spec).resolve()))
            embedded_arm, cache, fetch = "q4_k_m", scratch, False
        else:
            try:
                embedded_arm = arm_named(arm.spec).name
            except KeyError as exc:
                raise ScreenError(f"--arm {arm.name}={arm.spec}: {exc.args[0]}") from exc
            cache, fetch = None, True
        upstream = start_embedded_upstream(
            embedded_arm,
            cache_dir=cache,
            fetch=fetch,
            n_ctx=options.n_ctx,
            n_threads=options.threads,
            ready_timeout=600.0,
            prompt_cache=arm.kind != "dir",
        )
        try:
            yield upstream.base_url
        finally:
            upstream.close()


class Progress:
    """A tqdm bar on a terminal; on a pipe, a plain line every ``every_s`` s and at the end."""

    def __init__(
        self,
        total: int,
        done: int,
        label: str,
        *,
        stream: TextIO | None = None,
        every_s: float = 10,
    ) -> None:
        self._stream = stream or sys.stderr
        self._total, self._done, self._label = total, done, label
        self._start = time.monotonic()
        self._asked = 0
        self._last = 0.0
        self._every = every_s
        self._bar: Any = None
        if self._stream.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self._bar = tqdm(
                    total=total, initial=done, desc=label, unit="point", file=self._stream
                )
        if self._bar is None:  # say at once what is coming: a cold first answer can take minutes
            self._stream.write(f"{label}: {done}/{total} points, asking\n")
            self._stream.flush()

    def advance(self) -> None:
        self._done += 1
        self._asked += 1
        if self._bar is not None:
            self._bar.update(1)
            return
        now = time.monotonic()
        if now - self._last >= self._every or self._done == self._total:
            self._last = now
            self._stream.write(self.line() + "\n")
            self._stream.flush()

    def line(self) -> str:
        elapsed = time.monotonic() - self._start
        per = elapsed / self._asked if self._asked else 0.0
        eta = per * (self._total - self._done)
        return (
            f"{self._label}: {self._done}/{self._total} points, {per:.1f} s/point, "
            f"ETA {int(eta) // 60}m{int(eta) % 60:02d}s"
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _model_id(client: httpx.Client, base_url: str, options: AskOptions) -> str:
    if options.model:
        return options.model
    try:
        data = client.get(f"{base_url}/models").json().get("data") or []
        return str(data[0]["id"])
    except (httpx.HTTPError, ValueError, LookupError, TypeError, AttributeError):
        return "default"


class _Asker:
    def __init__(self, client: httpx.Client, base_url: str, model: str, options: AskOptions):
        self._client, self._url, self._model, self._options = client, base_url, model, options
        self.logprobs = True

    def body(self, point: DecisionPoint, tools: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model,
            "messages": list(point.messages),
            "tools": tools,
            "temperature": 0.0,
            "seed": self._options.seed,
            "max_tokens": self._options.max_tokens,
        }
        if self.logprobs:
            body |= {"logprobs": True, "top_logprobs": TOP_LOGPROBS}
        return body

    def ask(self, arm: str, point: DecisionPoint, tools: list[dict[str, Any]]) -> Answer:
        last = ""
        for attempt in range(_RETRIES):
            started = time.perf_counter()
            asked_logprobs = self.logprobs
            try:
                response = self._client.post(
                    f"{self._url}/chat/completions", json=self.body(point, tools)
                )
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code == 200:
                    completion = response.json()
                    seconds = time.perf_counter() - started
                    return Answer(arm, point.key, completion, seconds, asked_logprobs)
                last = f"HTTP {response.status_code}: {response.text[:300]}"
                if response.status_code == 400 and asked_logprobs:
                    self.logprobs = False  # an upstream without logprobs: screen without margins
                    continue
                if response.status_code < 500:
                    break
            time.sleep(min(4.0, 0.5 * 2**attempt))
        raise ScreenError(f"arm {arm}: point {point.key} got no answer ({last})")


def ask_arm(
    arm: ArmSpec,
    base_url: str,
    points: Sequence[DecisionPoint],
    tools: Mapping[str, list[dict[str, Any]]],
    log: AnswerLog,
    options: AskOptions,
    *,
    progress: Callable[[int, int], Progress] | None = None,
) -> int:
    """Ask every point of ``points`` not yet in ``log`` for ``arm``; returns how many were asked."""
    todo = [p for p in points if (arm.name, p.key) not in log.done]
    bar = (progress or (lambda t, d: Progress(t, d, f"screen {arm.name}")))(
        len(points), len(points) - len(todo)
    )
    asked = 0
    try:
        with httpx.Client(timeout=options.timeout_s) as client:
            asker = _Asker(client, base_url, _model_id(client, base_url, options), options)
            with ThreadPoolExecutor(max_workers=max(1, options.concurrency)) as pool:
                pending: set[Future[Answer]] = set()
                queue = iter(todo)
                for point in queue:
                    pending.add(pool.submit(asker.ask, arm.name, point, tools[point.domain]))
                    if len(pending) >= options.concurrency:
                        break
                while pending:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in finished:
                        log.append(future.result())
                        asked += 1
                        bar.advance()
                        point_next = next(queue, None)
                        if point_next is not None:
                            pending.add(
                                pool.submit(
                                    asker.ask, arm.name, point_next, tools[point_next.domain]
                                )
                            )
    finally:
        bar.close()
    return asked
