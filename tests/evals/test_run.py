"""The runner: results layout, resume after SIGKILL (nothing lost, nothing twice), the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from evals.tau2.logs import load_results
from evals.tau2.run import RESULTS_FILE, run, summarize
from tests.evals import run_fake
from tests.evals.conftest import REPO_ROOT

pytestmark = pytest.mark.anyio

TAU2_SIMULATION_KEYS = {
    "id",
    "task_id",
    "timestamp",
    "start_time",
    "end_time",
    "duration",
    "termination_reason",
    "agent_cost",
    "user_cost",
    "reward_info",
    "messages",
    "trial",
    "seed",
}


async def test_results_file_layout(tmp_path: Path) -> None:
    results = await run(run_fake.config(tmp_path), domain=run_fake.domain())
    raw = json.loads((tmp_path / RESULTS_FILE).read_text())
    assert set(raw) == {"timestamp", "info", "tasks", "simulations"}
    assert {
        "num_trials",
        "max_steps",
        "max_errors",
        "user_info",
        "agent_info",
        "environment_info",
    } <= set(raw["info"])
    assert raw["info"]["max_errors"] == 10 and raw["info"]["max_steps"] == 200
    assert [t["id"] for t in raw["tasks"]] == [f"task-{i}" for i in range(run_fake.NUM_TASKS)]
    sim = raw["simulations"][0]
    assert set(sim) >= TAU2_SIMULATION_KEYS
    assert sim["termination_reason"] == "user_stop"
    tool = next(m for m in sim["messages"] if m["role"] == "tool")
    assert {"id", "content", "requestor", "error"} <= set(tool)
    call = next(m for m in sim["messages"] if m["role"] == "assistant" and m["tool_calls"])
    assert {"id", "name", "arguments", "requestor"} <= set(call["tool_calls"][0])
    summary = summarize(results)
    assert summary["episodes"] == run_fake.NUM_TASKS * run_fake.NUM_TRIALS
    assert summary["successes"] == summary["episodes"]
    assert summary["pass_hat_k"] == {1: 1.0, 2: 1.0}
    assert summary["tool_errors"] == {} and summary["empty_turns"] == {}
    assert len(results.info.git_commit) == 40
    # Each trial has its own seed, shared by all tasks of that trial.
    seeds = {(s.trial, s.seed) for s in results.simulations}
    assert len(seeds) == run_fake.NUM_TRIALS


async def test_resume_refuses_a_different_run(tmp_path: Path) -> None:
    await run(replace(run_fake.config(tmp_path), num_trials=1), domain=run_fake.domain())
    with pytest.raises(ValueError, match="different run"):
        await run(replace(run_fake.config(tmp_path), max_errors=3), domain=run_fake.domain())


@pytest.mark.slow
async def test_resume_after_sigkill_loses_and_repeats_nothing(tmp_path: Path) -> None:
    results_path = tmp_path / RESULTS_FILE
    total = run_fake.NUM_TASKS * run_fake.NUM_TRIALS
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.evals.run_fake", str(tmp_path)], cwd=REPO_ROOT
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if results_path.exists() and len(load_results(results_path).simulations) >= 3:
                break
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=10)
    assert process.returncode == -signal.SIGKILL
    before = load_results(results_path)
    assert 3 <= len(before.simulations) < total, "the run must be killed mid-way"

    after = await run(
        run_fake.config(tmp_path), domain=run_fake.domain(), make_agent=run_fake.SlowGoldAgent
    )
    keys = [(s.task_id, s.trial) for s in after.simulations]
    assert len(keys) == total and len(set(keys)) == total
    assert [s.id for s in after.simulations[: len(before.simulations)]] == [
        s.id for s in before.simulations
    ]
    assert load_results(results_path).model_dump() == after.model_dump()
    assert all(s.reward_info is not None and s.reward_info.reward == 1.0 for s in after.simulations)


@pytest.mark.slow
def test_cli_gold_run_on_retail(tau2_data_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("evals.tau2.domains.retail")
    command = [
        sys.executable, "-m", "evals.tau2.run", "--domain", "retail",
        "--agent", "gold", "--user", "gold",
        "--num-trials", "2", "--task-ids", "0", "2", "--tau2-data", str(tau2_data_dir),
        "--save-to", str(tmp_path), "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "successes: 4" in done.stdout
    assert "nl_unscored: {'episodes': 2, 'successes': 2}" in done.stdout
    results = load_results(tmp_path / RESULTS_FILE)
    assert results.info.nl_assertions_scored is False
    assert results.info.domain_options == {"retail_modify_items_fix": False}
    assert sorted((s.task_id, s.trial) for s in results.simulations) == [
        ("0", 0),
        ("0", 1),
        ("2", 0),
        ("2", 1),
    ]
    # Task 2 has NL assertions (not scored without a judge); task 0 has none (trivially met).
    scored = {
        s.task_id: s.reward_info.nl_assertions_scored for s in results.simulations if s.reward_info
    }
    assert scored == {"0": True, "2": False}


async def test_llm_run_sends_one_episode_id_per_episode_and_uses_the_judge(tmp_path: Path) -> None:
    from evals.tau2.agents import ModelConfig
    from evals.tau2.run import RunConfig
    from tests.evals.fakes import CounterDomain, make_task
    from tests.support.scripted_upstream import ScriptedUpstream, completion, tool_call

    guidelines = tmp_path / "data" / "tau2" / "user_simulator"
    guidelines.mkdir(parents=True)
    (guidelines / "simulation_guidelines.md").write_text("# plain guidelines")
    (guidelines / "simulation_guidelines_tools.md").write_text("# guidelines with tools")
    task = make_task(reward_basis=["DB", "NL_ASSERTION"], nl_assertions=["polite"])
    task["evaluation_criteria"]["actions"] = [
        {"action_id": "a", "name": "add", "arguments": {"amount": 2}}
    ]
    verdict = (
        '{"results": [{"expectedOutcome": "polite", "reasoning": "ok", "metExpectation": true}]}'
    )
    with ScriptedUpstream() as upstream:
        for _ in range(2):  # two trials, played one after the other
            upstream.push(
                completion(content="Add 2."),  # user
                completion(tool_calls=[tool_call("add", {"amount": 2})]),  # agent
                completion(content="Done."),  # agent
                completion(content="Thanks ###STOP###"),  # user
                completion(content=verdict),  # judge
            )
        model = ModelConfig(model="agent-m", base_url=upstream.base_url, max_retries=0)
        config = RunConfig(
            domain="counter",
            data_dir=tmp_path / "data",
            save_to=tmp_path / "out",
            agent_model=model,
            user_model=replace(model, model="user-m"),
            judge_model=replace(model, model="judge-m"),
            num_trials=2,
            progress=False,
        )
        results = await run(config, domain=CounterDomain([task]))
        requests = upstream.requests
    assert [s.reward_info.reward for s in results.simulations if s.reward_info] == [1.0, 1.0]
    assert results.info.nl_assertions_scored is True
    assert results.info.agent_info.llm == "agent-m"
    assert results.info.user_info.global_simulation_guidelines == "# guidelines with tools"
    agent_ids = [r.headers["x-episode-id"] for r in requests if r.json()["model"] == "agent-m"]
    sims = results.simulations
    assert agent_ids == [sims[0].id, sims[0].id, sims[1].id, sims[1].id]
    assert sims[0].id != sims[1].id
    judge_requests = [r for r in requests if r.json()["model"] == "judge-m"]
    assert len(judge_requests) == 2 and "x-episode-id" not in judge_requests[0].headers


def test_domain_options_are_named_loaded_and_recorded(tau2_data_dir: Path, tmp_path: Path) -> None:
    from evals.tau2.domains import load_domain
    from evals.tau2.run import parse_args

    argv = ["--domain", "retail", "--tau2-data", str(tau2_data_dir), "--save-to", str(tmp_path)]
    plain = parse_args(argv, {})
    assert plain.domain_options == ()
    assert plain.domain_option_values() == {"retail_modify_items_fix": False}
    fixed = parse_args([*argv, "--domain-option", "retail_modify_items_fix"], {})
    assert fixed.domain_option_values() == {"retail_modify_items_fix": True}
    with pytest.raises(SystemExit):
        parse_args([*argv, "--domain-option", "no_such_fix"], {})
    retail = load_domain("retail", tau2_data_dir, {"retail_modify_items_fix": True})
    assert retail.modify_items_fix is True
    assert load_domain("retail", tau2_data_dir).modify_items_fix is False
    with pytest.raises(ValueError, match="unknown domain option"):
        load_domain("retail", tau2_data_dir, {"no_such_fix": True})
