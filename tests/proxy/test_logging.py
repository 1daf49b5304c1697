"""The log line's writer: one write per loop iteration for the lines of concurrent requests,
in order, nothing lost; outside a loop a line goes out at once."""

from __future__ import annotations

import asyncio
import io

import orjson

from repairproxy.observe.logging import LoopBatchedWriter, configure_logging


class CountingTarget(io.BytesIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: object) -> int:  # type: ignore[override]
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
