"""The log line's writer: one write per loop iteration for the lines of concurrent requests,
in order, nothing lost; outside a loop a line goes out at once."""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path
from typing import Any

import orjson
import structlog

from repairproxy.observe.logging import LoopBatchedWriter, configure_logging, line_writer


class CountingTarget(io.BytesIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: object) -> int:
        self.writes += 1
        return super().write(data)  # type: ignore[arg-type]


def test_lines_of_one_loop_iteration_share_one_write_and_keep_their_order() -> None:
    target = CountingTarget()
    logger = configure_logging("info", LoopBatchedWriter(target))  # type: ignore[arg-type]

    async def sixteen_requests() -> None:
        async def one(index: int) -> None:
            logger.info("request", n=index)

        tasks = [asyncio.ensure_future(one(i)) for i in range(16)]
        await asyncio.sleep(0)  # the 16 run in this loop iteration; the write comes after them
        assert all(task.done() for task in tasks) and target.writes == 0
        await asyncio.sleep(0)

    asyncio.run(sixteen_requests())
    lines = [orjson.loads(line) for line in target.getvalue().splitlines()]
    assert [line["n"] for line in lines] == list(range(16))
    assert target.writes == 1


def test_outside_a_loop_each_line_is_written_at_once() -> None:
    target = CountingTarget()
    logger = configure_logging("info", LoopBatchedWriter(target))  # type: ignore[arg-type]
    logger.info("startup")
    assert target.writes == 1 and b'"startup"' in target.getvalue()


def _stock_logger(stream: io.BytesIO) -> Any:
    """structlog's own chain for the same line: what the one processor must write."""
    return structlog.wrap_logger(
        structlog.BytesLogger(stream),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(
                serializer=lambda obj, **_: orjson.dumps(obj, default=str)
            ),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(10),
    )


_TIME = re.compile(rb'"timestamp":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z"')


def test_the_line_is_structlogs_stock_chain_byte_for_byte_but_the_time() -> None:
    ours, stock = io.BytesIO(), io.BytesIO()
    event = {
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 200,
        "channels": ["unknown_tool"],
        "latency_ms": 0.5,
        "model": None,
        "level": "overridden",  # a field named like the level is overwritten, in its place
        "odd": Path("/tmp/x"),  # not JSON: rendered with str()
    }
    for logger in (configure_logging("debug", ours), _stock_logger(stock)):
        logger.info("request", **event)
        logger.warning("store", error="away")
        logger.exception("unhandled", error="x")
        logger.debug("dbg")
    got, want = ours.getvalue().splitlines(), stock.getvalue().splitlines()
    assert len(got) == len(want) == 4
    for line, expected in zip(got, want, strict=True):
        assert _TIME.search(line) is not None
        assert _TIME.sub(b"T", line) == _TIME.sub(b"T", expected)
    first = orjson.loads(got[0])
    assert list(first)[-2:] == ["event", "timestamp"] and first["level"] == "info"
    assert orjson.loads(got[2])["level"] == "error"


def test_the_level_filter_still_drops_lower_levels() -> None:
    stream = io.BytesIO()
    logger = configure_logging("warning", stream)
    logger.info("request")
    logger.warning("kept")
    assert [orjson.loads(line)["event"] for line in stream.getvalue().splitlines()] == ["kept"]


def _fields() -> dict[str, Any]:
    return {
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 200,
        "channels": ["unknown_tool"],
        "latency_ms": 0.5,
        "model": None,
        "level": "overridden",
        "odd": Path("/tmp/x"),
    }


def test_the_request_line_writer_writes_what_logger_info_writes() -> None:
    direct, through = io.BytesIO(), io.BytesIO()
    line_writer(configure_logging("info", direct), "request")(_fields())
    configure_logging("info", through).info("request", **_fields())
    got, want = direct.getvalue(), through.getvalue()
    assert got.endswith(b"\n") and got.count(b"\n") == 1
    assert _TIME.sub(b"T", got) == _TIME.sub(b"T", want)


def test_the_request_line_writer_keeps_the_level_filter_and_other_loggers() -> None:
    quiet = io.BytesIO()
    line_writer(configure_logging("warning", quiet), "request")(_fields())
    assert quiet.getvalue() == b""
    stock = io.BytesIO()
    line_writer(_stock_logger(stock), "request")(_fields())  # not ours: the plain call
    line = orjson.loads(stock.getvalue())
    assert (line["event"], line["level"], line["status"]) == ("request", "info", 200)
