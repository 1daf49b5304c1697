"""Several model servers for one arm: the grid spreads the arm's episodes over them (one queue,
per-upstream concurrency), with results identical in content to a one-server run, and resumes
exactly."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from evals.grid.upstream_pool import UpstreamPool
from evals.repair_ablation import main
from evals.tau2.agents import ModelConfig
from tests.support.gold_upstream import GoldArm, GoldUpstream

TASK_IDS = ("65", "69", "88")
TRIALS = 2
CELL = "retail-spread-scripted-k2"


def _context(task_id: str, trial: int) -> Any:
    return SimpleNamespace(
        task=SimpleNamespace(id=task_id), trial=trial, policy="p", episode_id="e"
    )


def _saved(task_id: str, trial: int) -> Any:
    return SimpleNamespace(task_id=task_id, trial=trial)


@pytest.mark.anyio
async def test_pool_gives_each_episode_the_least_busy_server_and_takes_it_back() -> None:
    pool = UpstreamPool(ModelConfig("m", "http://unused/v1"), ["http://a/v1", "http://b/v1"], 2)
    assert pool.concurrency == 4
    for index in range(4):
        pool.make_agent(_context(f"t{index}", 0))
    assert pool.active == [2, 2]  # never more than per_upstream while the gate holds 4
    pool.episode_saved(_saved("t1", 0))  # t1 went to b
    assert pool.active == [2, 1]
    pool.make_agent(_context("t4", 0))
    assert pool.active == [2, 2] and pool.started == [2, 3]
    pool.episode_saved(_saved("unknown", 0))  # not one of the pool's: ignored
    assert [m.base_url for m in pool.models] == ["http://a/v1", "http://b/v1"]
    await pool.aclose()


def _tasks(data_dir: Path) -> list[dict[str, Any]]:
    tasks = json.loads((data_dir / "tau2/domains/retail/tasks.json").read_text(encoding="utf-8"))
    return [t for t in tasks if str(t["id"]) in TASK_IDS]


def _grid(path: Path, urls: list[str]) -> Path:
    path.write_text(
        f"""
name = "spread"
concurrency = 1
[arms.spread]
upstream = {json.dumps(urls)}
model = "gold"
[[cell]]
domain = "retail"
user = "scripted"
modes = ["off"]
tasks = {json.dumps(list(TASK_IDS))}
trials = {TRIALS}
max_errors = 2
max_steps = 60
""",
        encoding="utf-8",
    )
    return path


def _content(results: Path) -> dict[tuple[str, int], Any]:
    """Each episode without what differs between runs (ids, times, ports)."""
    data = json.loads(results.read_text(encoding="utf-8"))
    episodes = {}
    for simulation in data["simulations"]:
        messages = [
            (m["role"], m.get("content"), json.dumps(m.get("tool_calls"), sort_keys=True))
            for m in simulation["messages"]
        ]
        calls = [
            [(c["name"], c["arguments"]) for c in (m.get("tool_calls") or [])]
            for m in simulation["messages"]
        ]
        key = (simulation["task_id"], simulation["trial"])
        episodes[key] = (
            [(role, text) for role, text, _ in messages],
            calls,
            simulation["termination_reason"],
            simulation["reward_info"]["reward"],
        )
    return episodes


def _run(grid: Path, out: Path, data_dir: Path) -> int:
    argv = [str(grid), "--out", str(out), "--tau2-data", str(data_dir)]
    return main([*argv, "--no-progress", "--no-analysis"])


def test_two_upstreams_split_an_arm_and_match_one(tmp_path: Path, tau2_data_dir: Path) -> None:
    tasks = _tasks(tau2_data_dir)
    arm = {"default": GoldArm(0.5, delay_s=0.02)}
    with (
        GoldUpstream(tasks, arm) as one,
        GoldUpstream(tasks, arm) as a,
        GoldUpstream(tasks, arm) as b,
    ):
        single = tmp_path / "single"
        assert _run(_grid(tmp_path / "one.toml", [one.base_url()]), single, tau2_data_dir) == 0
        spread = tmp_path / "spread"
        grid = _grid(tmp_path / "two.toml", [a.base_url(), b.base_url()])
        assert _run(grid, spread, tau2_data_dir) == 0
        split = (len(a.requests), len(b.requests))
        # Resuming a finished run plays nothing again and changes nothing.
        before = (spread / CELL / "off" / "results.json").read_bytes()
        assert _run(grid, spread, tau2_data_dir) == 0
        assert (len(a.requests), len(b.requests)) == split
        assert (spread / CELL / "off" / "results.json").read_bytes() == before
        total = len(one.requests)

    assert split[0] > 0 and split[1] > 0 and sum(split) == total  # both servers, nothing extra
    ours = _content(spread / CELL / "off" / "results.json")
    theirs = _content(single / CELL / "off" / "results.json")
    assert set(ours) == {(t, trial) for t in TASK_IDS for trial in range(TRIALS)}
    assert ours == theirs
    provenance = json.loads((spread / CELL / "off" / "provenance.json").read_text())
    assert len(provenance["proxy"]["urls"]) == 2
