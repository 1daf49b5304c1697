"""Structured logging: one canonical JSON line per request, built without global structlog state.

Prompt and answer text never reach the log unless ``--log-bodies`` is set; the caller decides what
goes into the event, this module only renders it.
"""

from __future__ import annotations

import sys
from typing import IO, Any, BinaryIO, cast

import orjson
import structlog
from structlog.typing import FilteringBoundLogger

__all__ = ["RequestLogger", "configure_logging"]

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}

RequestLogger = FilteringBoundLogger


def _orjson_bytes(obj: Any, **_: Any) -> bytes:
    return orjson.dumps(obj, default=str)


def configure_logging(level: str = "info", stream: IO[bytes] | None = None) -> RequestLogger:
    """A structlog logger writing one JSON object per line (bytes, via orjson) to ``stream``.

    Returned rather than installed globally, so two apps in one process (tests) do not share state.
    """
    logger = structlog.wrap_logger(
        structlog.BytesLogger(cast(BinaryIO, stream if stream is not None else sys.stdout.buffer)),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(serializer=_orjson_bytes),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level.lower(), 20)),
        cache_logger_on_first_use=True,
    )
    return cast(FilteringBoundLogger, logger)
