"""Multi-process metrics (``--workers N``): a worker's increments reach its files at the end of
the event-loop iteration that finished the requests (one write per sample for all of them), and a
scrape this worker answers sees its own requests of the same iteration.

prometheus-client picks its file-backed values at import, from ``PROMETHEUS_MULTIPROC_DIR``, so
the worker here is a child process with the variable set before the import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_WORKER = r"""
import asyncio, json, os, re
from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict

from repairproxy.observe.multiprocess import MultiProcessMetrics
from repairproxy.observe.record import RequestRecord
from repairproxy.settings import Settings

directory = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])


def in_files() -> float:
    return sum(
        value
        for path in directory.glob("counter_*.db")
        for key, value, *_ in MmapedDict.read_all_values_from_file(str(path))
        if '"repairproxy_requests_total"' in key
    )


def scraped(metrics: MultiProcessMetrics) -> float:
    body, _ = metrics.exposition(None)
    found = re.findall(rb"^repairproxy_requests_total\{[^}]*\} (\S+)", body, re.M)
    return sum(float(value) for value in found)


async def main() -> dict[str, float]:
    metrics = MultiProcessMetrics(Settings(upstream="http://upstream.invalid/v1"))
    seen = {}
    for _ in range(3):
        metrics.request_finished(RequestRecord(model="m"))
    seen["same_iteration"] = in_files()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    seen["next_iteration"] = in_files()
    for _ in range(2):
        metrics.request_finished(RequestRecord(model="m"))
    seen["scrape_same_iteration"] = scraped(metrics)
    return seen


print(json.dumps(asyncio.run(main())))
"""


def test_a_workers_increments_land_once_per_loop_iteration_and_its_scrapes_see_them(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", _WORKER], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {"same_iteration": 0, "next_iteration": 3, "scrape_same_iteration": 5}
