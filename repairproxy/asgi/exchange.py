"""What one HTTP exchange reports, as views of its ``RequestRecord``: the ``X-Repairproxy-*``
headers, the SSE trailer comment and the one JSON log line. The exchange holds no fact of its own
beyond the method, the path and the clocks: routes and the pipeline write into the record, the
headers, the trailer, the log line and the metrics read it."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from repairproxy.asgi.gate import comment_event
from repairproxy.episodes.budget import BudgetSnapshot
from repairproxy.observe.record import RequestRecord
from repairproxy.types import HeaderList
from repairproxy.upstream.client import UpstreamTimer

__all__ = ["Exchange"]

# Invented names go into a header: keep them short and free of separators and non-Latin-1 text.
_MAX_HEADER_NAMES = 16
_MAX_NAME_CHARS = 64
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/-]")


def _header_name(name: str) -> str:
    return _NAME_UNSAFE.sub("_", name[:_MAX_NAME_CHARS])


# The failing paths of a structured output, as one header value (Latin-1, bounded).
_MAX_PATHS_CHARS = 512


def _paths_header(paths: tuple[str, ...]) -> bytes:
    joined = "; ".join(paths)
    if len(joined) > _MAX_PATHS_CHARS:
        joined = joined[: _MAX_PATHS_CHARS - 3] + "..."
    return joined.replace("\r", " ").replace("\n", " ").encode("latin-1", "replace")


def _formats(formats: list[str]) -> str:
    """The distinct formats of the promoted calls, in order (bounded labels: no escaping)."""
    return ",".join(dict.fromkeys(formats))


def _margins(record: RequestRecord) -> str:
    """``name=margin`` per call (bounded names, 3 decimals), in call order."""
    pairs = zip(record.tool_name_margin_names, record.tool_name_margins, strict=False)
    shown = list(pairs)[:_MAX_HEADER_NAMES]
    return ",".join(f"{_header_name(name)}={margin:.3f}" for name, margin in shown)


def _counts(snapshot: BudgetSnapshot) -> tuple[str, str]:
    """(episode errors, budget remaining) as sent; ``unknown`` while the shared store is away."""
    if snapshot.unknown:
        return "unknown", "unknown"
    return str(snapshot.errors), str(snapshot.remaining)


@dataclass(slots=True)
class Exchange:
    """One request's record and clocks; every method is a view of them. (Not frozen: a frozen
    dataclass sets each field through ``object.__setattr__``, made on every request.)"""

    started: float
    method: str
    path: str
    timer: UpstreamTimer = field(default_factory=UpstreamTimer)
    record: RequestRecord = field(default_factory=RequestRecord)
    # Request fields a chat-only upstream answered without (wire/fields.py): header and log.
    dropped: tuple[str, ...] = ()

    def overhead_ms(self) -> float:
        return max((time.perf_counter() - self.started - self.timer.seconds) * 1000.0, 0.0)

    def settle(self, sent_status: int, first_byte_at: float | None) -> None:
        """The facts known once the answer left: the status (unless a route set one the
        responder did not send, e.g. 499), upstream time, overhead and time to first byte."""
        record = self.record
        record.status = record.status or sent_status
        record.upstream_seconds = self.timer.seconds
        record.overhead_seconds = self.overhead_ms() / 1000.0
        if first_byte_at is not None:
            record.first_byte_seconds = first_byte_at - self.started

    def proxy_headers(self, *, verdict: bool = True) -> HeaderList:
        """``X-Repairproxy-*`` headers; without ``verdict`` only what was known pre-answer."""
        out: HeaderList = []
        record = self.record
        if verdict:
            channels = tuple(dict.fromkeys(record.channels))  # each channel once
            out.append(
                (b"x-repairproxy-tool-errors", ",".join(channels).encode() if channels else b"")
            )
            if record.repair_attempts:  # tool-errors then names every attempt's channels
                out.append((b"x-repairproxy-first-tool-errors", _first(record).encode()))
            out.append((b"x-repairproxy-repairs", b"%d" % record.repair_attempts))
            if record.promoted:
                out.append((b"x-repairproxy-promoted", b"%d" % record.promoted))
            if record.promoted_formats:
                formats = _formats(record.promoted_formats).encode()
                out.append((b"x-repairproxy-promoted-format", formats))
            caught = record.caught_calls
            invented = [c.tool for c in caught if c.tool] if caught else ()
            if invented:
                shown = ",".join(_header_name(n) for n in invented[:_MAX_HEADER_NAMES])
                out.append((b"x-repairproxy-unknown-tools", shown.encode()))
            if record.repair_failed:
                out.append((b"x-repairproxy-repair-failed", record.repair_failed.encode()))
            if record.repair_results:  # fixed, failed, upstream_error or withheld
                result = str(record.repair_results[0].result).encode()
                out.append((b"x-repairproxy-repair-result", result))
            if record.delivered_channels is not None:  # what the client received, judged
                delivered = ",".join(record.delivered_channels).encode()
                out.append((b"x-repairproxy-delivered-tool-errors", delivered))
                # The first answer's own calls (text calls included): a hallucination rate's
                # denominator, whatever a re-ask later replaced them with.
                out.append((b"x-repairproxy-first-tool-calls", b"%d" % record.tool_calls))
            if record.repair_attempts:
                out.append(
                    (b"x-repairproxy-repair-prompt-tokens", b"%d" % record.repair_prompt_tokens)
                )
                out.append(
                    (
                        b"x-repairproxy-repair-completion-tokens",
                        b"%d" % record.repair_completion_tokens,
                    )
                )
                out.append(
                    (b"x-repairproxy-repair-seconds", f"{record.repair_seconds:.3f}".encode())
                )
            out.append((b"x-repairproxy-upstream-calls", b"%d" % self.timer.calls))
            if record.tool_name_margins:  # --margin-probe, non-streamed: name=margin per call
                out.append((b"x-repairproxy-tool-name-margins", _margins(record).encode()))
            output = record.output
            if output is not None:  # a response format was asked for: never budget errors
                out.append(
                    (b"x-repairproxy-output-errors", ",".join(output.caught_channels).encode())
                )
                out.append((b"x-repairproxy-output-repairs", b"%d" % output.repair_attempts))
                if output.error_paths:
                    paths = _paths_header(output.error_paths)
                    out.append((b"x-repairproxy-output-error-paths", paths))
            if len(record.choice_channels) > 1:  # n > 1: the headers above describe choice 0
                per_choice = ";".join(
                    f"{index}={','.join(channels)}"
                    for index, channels in enumerate(record.choice_channels)
                )
                out.append((b"x-repairproxy-choice-tool-errors", per_choice.encode()))
        snapshot = record.snapshot
        if snapshot is not None:
            out.append(
                (b"x-repairproxy-episode-id", snapshot.episode_id.encode("latin-1", "replace"))
            )
            if snapshot.unknown:
                out.append((b"x-repairproxy-episode-errors", b"unknown"))
                out.append((b"x-repairproxy-budget-remaining", b"unknown"))
            else:
                out.append((b"x-repairproxy-episode-errors", b"%d" % snapshot.errors))
                out.append((b"x-repairproxy-budget-remaining", b"%d" % snapshot.remaining))
            if snapshot.exhausted:
                out.append((b"x-repairproxy-budget-exhausted", b"true"))
        if self.dropped:
            out.append((b"x-repairproxy-dropped-fields", ",".join(self.dropped).encode()))
        out.append((b"x-repairproxy-overhead-ms", b"%.3f" % self.overhead_ms()))
        return out

    def trailer_comment(self) -> bytes:
        """The verdict for a stream whose headers left before it was known."""
        fields = {
            "tool-errors": ",".join(dict.fromkeys(self.record.channels)),
            "repairs": str(self.record.repair_attempts),
            "overhead-ms": f"{self.overhead_ms():.3f}",
        }
        if self.record.repair_attempts:
            fields["first-tool-errors"] = _first(self.record)
        if self.record.promoted:
            fields["promoted"] = str(self.record.promoted)
        if self.record.promoted_formats:
            fields["promoted-format"] = _formats(self.record.promoted_formats)
        if self.record.repair_failed:
            fields["repair-failed"] = self.record.repair_failed
        if self.record.repair_results:
            fields["repair-result"] = str(self.record.repair_results[0].result)
        if self.record.delivered_channels is not None:
            fields["delivered-tool-errors"] = ",".join(self.record.delivered_channels)
        if self.record.output is not None:
            fields["output-errors"] = ",".join(self.record.output.caught_channels)
            fields["output-repairs"] = str(self.record.output.repair_attempts)
        if self.record.snapshot is not None:
            fields["episode-errors"], fields["budget-remaining"] = _counts(self.record.snapshot)
        return comment_event("x-repairproxy " + " ".join(f"{k}={v}" for k, v in fields.items()))

    def log_event(self, status: int, *, log_bodies: bool) -> dict[str, Any]:
        """The canonical log line's fields."""
        record = self.record
        # The StrEnum members and the tuple go in as they are: orjson writes a str subclass as
        # its string and a tuple as an array (the same bytes as .value and list(), which cost a
        # Python-level enum property call each).
        event: dict[str, Any] = {
            "method": self.method,
            "path": self.path,
            "api": record.api,
            "status": status,
            "model": record.model,
            "episode_id": record.episode_id,
            "stream": record.stream,
            "mode": record.mode,
            "outcome": record.outcome,
            "channels": record.channels,
            "repairs": record.repair_attempts,
            "latency_ms": round((time.perf_counter() - self.started) * 1000.0, 3),
            "overhead_ms": round(self.overhead_ms(), 3),
            "upstream_calls": self.timer.calls,
        }
        if self.dropped:
            event["dropped_fields"] = self.dropped
        if record.caught_calls:
            event["caught"] = [
                {"channel": c.channel, "form": c.form, "tool": c.tool, "detail": c.detail}
                for c in record.caught_calls
            ]
        if record.promoted:
            event["promoted"] = record.promoted
        if record.promoted_formats:
            event["promoted_format"] = _formats(record.promoted_formats)
        if record.repair_failed:
            event["repair_failed"] = record.repair_failed
        if record.repair_results:
            event["repair_result"] = record.repair_results[0].result
        if record.delivered_channels is not None:
            event["delivered_channels"] = record.delivered_channels
        if record.env_errors:
            event["env_errors"] = list(record.env_errors)
        if record.output is not None:
            event["output_errors"] = list(record.output.caught_channels)
            event["output_repairs"] = record.output.repair_attempts
            if record.output.error_paths:
                event["output_error_paths"] = list(record.output.error_paths)
        snapshot = record.snapshot
        if snapshot is not None:
            unknown = snapshot.unknown
            event["episode_errors"] = "unknown" if unknown else snapshot.errors
            event["budget_remaining"] = "unknown" if unknown else snapshot.remaining
        if log_bodies:
            event["request_body"] = _text(record.request_body)
            event["response_body"] = _text(record.response_body)
        return event


def _text(body: bytes | None) -> str | None:
    return body.decode("utf-8", "replace") if body else None


def _first(record: RequestRecord) -> str:
    """The first answer's channels alone (``tool-errors`` adds each re-ask's): the study counts
    "caught in the first answer" from it."""
    return ",".join(dict.fromkeys(str(call.channel) for call in record.caught_calls))
