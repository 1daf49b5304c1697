"""The grid runner end to end: real proxies on loopback in front of a gold-replaying upstream.

The upstream invents a tool name for a known share of the gold calls, so the proxy sees real
hallucinations; the truth of each episode (how many tool-not-found errors the agent meets with
repair off, none with reflexive repair) follows from ``hallucinated_actions``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from evals.grid.launch import free_port
from evals.grid.provenance import code_of, source_sha256
from evals.grid.spec import REPAIR_MODES, GridError, load_grid
from evals.repair_ablation import analysis_pairs, check_one_code, main, plan_runs
from tests.evals.conftest import REPO_ROOT
from tests.support.gold_upstream import GoldArm, GoldUpstream, hallucinated_actions

TASK_IDS = ("65", "69", "88")  # 3, 4 and 1 gold calls; distinct openings
SHARE = 0.5  # hallucinated gold calls: 65 -> [1], 69 -> [1, 3], 88 -> []
BUDGET = 2  # task 69 reaches it with repair off
REPAIRING = ("reflexive", "constrained")  # the modes that re-ask; the others pass names through


def _tasks(data_dir: Path) -> dict[str, dict[str, Any]]:
    path = data_dir / "tau2" / "domains" / "retail" / "tasks.json"
    tasks = json.loads(path.read_text(encoding="utf-8"))
    return {str(t["id"]): t for t in tasks if str(t["id"]) in TASK_IDS}


def _write_grid(path: Path, arms: str, *, modes: str = '["off", "reflexive"]') -> Path:
    path.write_text(
        f"""
name = "tiny"
[proxy]
args = ["--max-repairs", "2"]
{arms}
[[cell]]
domain = "retail"
user = "scripted"
modes = {modes}
tasks = {json.dumps(list(TASK_IDS))}
trials = 1
max_errors = {BUDGET}
max_steps = 60
""",
        encoding="utf-8",
    )
    return path


def _saved(results: Path) -> int:
    try:
        return len(json.loads(results.read_text(encoding="utf-8"))["simulations"])
    except (OSError, ValueError, KeyError):
        return 0


def _not_found_errors(simulation: dict[str, Any]) -> int:
    return sum(
        1
        for m in simulation["messages"]
        if m["role"] == "tool" and m.get("error") and "not found" in (m.get("content") or "")
    )


def test_grid_resumes_after_sigkill_and_matches_the_scripted_truth(
    tmp_path: Path, tau2_data_dir: Path
) -> None:
    tasks = _tasks(tau2_data_dir)
    truth = {i: hallucinated_actions(tasks[i], SHARE) for i in TASK_IDS}
    assert truth == {"65": [1], "69": [1, 3], "88": []}
    out = tmp_path / "run"
    with GoldUpstream(list(tasks.values()), {"flaky": GoldArm(SHARE, delay_s=0.1)}) as upstream:
        grid = _write_grid(
            tmp_path / "tiny.toml",
            f'[arms.flaky]\nupstream = "{upstream.base_url("flaky")}"\nmodel = "gold"\n',
            modes=json.dumps(list(REPAIR_MODES)),
        )
        command = [sys.executable, "-m", "evals.repair_ablation", str(grid), "--out", str(out)]
        command += ["--tau2-data", str(tau2_data_dir), "--no-progress"]
        first_results = out / "retail-flaky-scripted-k2" / "off" / "results.json"
        with (tmp_path / "first.log").open("wb") as log:
            # Its own session, so the kill takes the proxy it started down with it.
            first = subprocess.Popen(
                [*command, "--no-analysis"],
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            deadline = time.monotonic() + 90
            while _saved(first_results) < 1 and first.poll() is None:
                assert time.monotonic() < deadline, "no episode saved in 90 s"
                time.sleep(0.05)
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        saved_at_kill = _saved(first_results)
        assert 1 <= saved_at_kill < len(TASK_IDS), (tmp_path / "first.log").read_text()
        upstream.set_arm("flaky", GoldArm(SHARE))  # no more need to be slow
        second = subprocess.run(
            command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=180, check=False
        )
        assert second.returncode == 0, second.stdout + second.stderr

    for mode in REPAIR_MODES:
        folder = out / "retail-flaky-scripted-k2" / mode
        results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
        episodes = {(s["task_id"], s["trial"]): s for s in results["simulations"]}
        assert len(results["simulations"]) == len(episodes) == len(TASK_IDS)  # none twice
        assert set(episodes) == {(i, 0) for i in TASK_IDS}  # none lost
        provenance = json.loads((folder / "provenance.json").read_text(encoding="utf-8"))
        assert provenance["mode"] == mode
        assert provenance["user"]["simulator"] == "scripted"
        assert provenance["proxy"]["request_headers"]["X-Repairproxy-Repair"] == mode
        assert provenance["repair_template"]["version"]
        for task_id in TASK_IDS:
            simulation = episodes[(task_id, 0)]
            reward = simulation["reward_info"]["reward"]
            if mode not in REPAIRING:  # the invented names reach the environment
                expected = min(len(truth[task_id]), BUDGET)
                assert _not_found_errors(simulation) == expected, task_id
                failed = expected >= BUDGET
                assert simulation["termination_reason"] == (
                    "too_many_errors" if failed else "user_stop"
                )
                assert reward == (0.0 if failed else 1.0), task_id
            else:
                assert _not_found_errors(simulation) == 0, task_id
                assert simulation["termination_reason"] == "user_stop"
                assert reward == 1.0, task_id
                reports = [m["repairproxy"] for m in simulation["messages"] if m.get("repairproxy")]
                # The proxy's headers, recorded on each agent turn by the engine.
                assert sum(r.get("repairs", 0) for r in reports) == len(truth[task_id])

    # The analysis the runner ends with sees the same truth.
    summary = json.loads((out / "analysis" / "summary.json").read_text(encoding="utf-8"))
    off = summary["arms"]["retail-flaky-scripted-k2/off"]
    repaired = summary["arms"]["retail-flaky-scripted-k2/reflexive"]
    assert off["success"]["estimate"] == pytest.approx(2 / 3)  # task 69 ran out of budget
    assert off["success_at_budget"]["1"]["estimate"] == pytest.approx(1 / 3)  # only 88 is clean
    assert off["channel_counts"]["hallucinated_name"] == 3
    assert repaired["success"]["estimate"] == 1.0
    assert repaired["channel_counts"]["hallucinated_name"] == 0
    assert repaired["proxy"]["repairs"] == 3
    assert len(summary["pairs"]) == len(REPAIR_MODES) - 1  # each mode against off


def _stand_in_vllm(
    tmp_path: Path, tasks_file: Path, argv_file: Path, exit_after: int | None = None
) -> Path:
    script = tmp_path / "vllm"
    script.write_text(
        "#!/bin/sh\n"
        f"export PYTHONPATH='{REPO_ROOT}'\n"
        f"export GOLD_UPSTREAM_TASKS='{tasks_file}'\n"
        f"export GOLD_UPSTREAM_ARGV_FILE='{argv_file}'\n"
        + (f"export GOLD_UPSTREAM_EXIT_AFTER={exit_after}\n" if exit_after is not None else "")
        + f'exec "{sys.executable}" -m tests.support.gold_upstream "$@"\n',
        encoding="utf-8",
    )
    script.chmod(0o755)
    return script


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_a_launched_vllm_arm_is_started_with_its_command_line_and_stopped_after_its_cells(
    tmp_path: Path, tau2_data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = _tasks(tau2_data_dir)
    tasks_file = tmp_path / "tasks.json"
    tasks_file.write_text(json.dumps([tasks["88"]]), encoding="utf-8")
    argv_file = tmp_path / "argv.json"
    executable = _stand_in_vllm(tmp_path, tasks_file, argv_file)
    port = free_port()
    arm = (
        "[arms.int4]\n"
        'launch = "vllm"\n'
        'model = "org/model-AWQ"\n'
        'served_model_name = "model"\n'
        'quantization = "awq"\n'
        'tool_call_parser = "hermes"\n'
        f'executable = "{executable}"\n'
        f"port = {port}\n"
        'extra_args = ["--max-model-len", "8192"]\n'
        "ready_timeout_s = 60\n"
    )
    grid = _write_grid(tmp_path / "vllm.toml", arm, modes='["reflexive"]')
    grid.write_text(grid.read_text().replace(json.dumps(list(TASK_IDS)), '["88"]'))
    out = tmp_path / "run"
    args = [str(grid), "--out", str(out), "--tau2-data", str(tau2_data_dir), "--no-progress"]

    assert main([*args, "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "episodes: 1 planned, 0 already saved" in plan
    assert f"{executable} serve org/model-AWQ" in plan
    assert not out.exists()

    assert main([*args, "--no-analysis"]) == 0
    assert json.loads(argv_file.read_text()) == [
        "serve",
        "org/model-AWQ",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        "model",
        "--quantization",
        "awq",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--max-model-len",
        "8192",
    ]
    assert not _listening(port), "the launched server outlived its cells"
    results = json.loads(
        (out / "retail-int4-scripted-k2" / "reflexive" / "results.json").read_text()
    )
    assert [s["reward_info"]["reward"] for s in results["simulations"]] == [1.0]
    assert results["info"]["agent_info"]["llm"] == "model"
    logs = sorted(p.name for p in (out / "logs").iterdir())
    assert logs == ["proxy-int4.log", "vllm-int4.log"]


def test_a_server_that_dies_mid_run_stops_the_run(
    tmp_path: Path, tau2_data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks_file = tmp_path / "tasks.json"
    tasks_file.write_text(json.dumps([_tasks(tau2_data_dir)["88"]]), encoding="utf-8")
    _stand_in_vllm(tmp_path, tasks_file, tmp_path / "argv.json", exit_after=1)  # then it dies
    arm = f'[arms.x]\nlaunch = "vllm"\nmodel = "m"\nexecutable = "{tmp_path / "vllm"}"\n'
    grid = _write_grid(tmp_path / "g.toml", arm, modes='["off"]')
    grid.write_text(grid.read_text().replace(json.dumps(list(TASK_IDS)), '["88"]'))
    out = tmp_path / "run"
    args = [str(grid), "--out", str(out), "--tau2-data", str(tau2_data_dir), "--no-progress"]
    assert main(args) == 1
    assert "vllm server for x exited with 3 while in use" in capsys.readouterr().err
    results = json.loads((out / "retail-x-scripted-k2" / "off" / "results.json").read_text())
    # Stopped within a second: at most the episode in flight is saved, and only as an error.
    assert [s["termination_reason"] for s in results["simulations"]] in ([], ["agent_error"])


def test_episodes_that_met_a_dead_upstream_can_be_run_again(
    tmp_path: Path, tau2_data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()  # nobody listens there yet: the proxy answers 502, the episode agent_error
    arm = f'[arms.x]\nupstream = "http://127.0.0.1:{port}/v1"\nmodel = "m"\n'
    grid = _write_grid(tmp_path / "g.toml", arm, modes='["off"]')
    grid.write_text(grid.read_text().replace(json.dumps(list(TASK_IDS)), '["88"]'))
    out = tmp_path / "run"
    args = [str(grid), "--out", str(out), "--tau2-data", str(tau2_data_dir), "--no-progress"]
    args.append("--no-analysis")
    results = out / "retail-x-scripted-k2" / "off" / "results.json"

    assert main(args) == 0
    (episode,) = json.loads(results.read_text())["simulations"]
    assert episode["termination_reason"] == "agent_error"
    with GoldUpstream([_tasks(tau2_data_dir)["88"]], port=port):
        assert main(args) == 0  # a saved episode is never run twice, failed or not
        assert len(json.loads(results.read_text())["simulations"]) == 1
        assert main([*args, "--rerun-agent-errors"]) == 0
    assert "1 agent_error episode(s) to run again" in capsys.readouterr().out
    (episode,) = json.loads(results.read_text())["simulations"]
    assert (episode["termination_reason"], episode["reward_info"]["reward"]) == ("user_stop", 1.0)


def test_a_server_that_dies_on_start_fails_the_run_with_its_log(
    tmp_path: Path, tau2_data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    executable = tmp_path / "broken-vllm"
    executable.write_text("#!/bin/sh\necho 'CUDA out of memory'\nexit 3\n", encoding="utf-8")
    executable.chmod(0o755)
    arm = f'[arms.x]\nlaunch = "vllm"\nmodel = "m"\nexecutable = "{executable}"\n'
    grid = _write_grid(tmp_path / "broken.toml", arm)
    code = main([str(grid), "--out", str(tmp_path / "run"), "--tau2-data", str(tau2_data_dir)])
    assert code == 1
    err = capsys.readouterr().err
    assert "exited with 3" in err and "CUDA out of memory" in err


def test_pairs_compare_each_mode_with_off_and_each_arm_with_its_reference(
    tmp_path: Path, tau2_data_dir: Path
) -> None:
    arms = (
        '[arms.bf16]\nupstream = "http://127.0.0.1:9/v1"\nmodel = "m"\n'
        '[arms.int4]\nupstream = "http://127.0.0.1:9/v1"\nmodel = "m"\nreference = "bf16"\n'
    )
    grid = load_grid(_write_grid(tmp_path / "g.toml", arms, modes='["off", "prompt"]'))
    planned = plan_runs(grid, grid.select(None), tmp_path, tau2_data_dir)
    named = {
        (a.parent.parent.name + "/" + a.parent.name, b.parent.parent.name + "/" + b.parent.name)
        for a, b in analysis_pairs(grid, planned)
    }
    assert named == {
        ("retail-bf16-scripted-k2/off", "retail-bf16-scripted-k2/prompt"),
        ("retail-int4-scripted-k2/off", "retail-int4-scripted-k2/prompt"),
        ("retail-bf16-scripted-k2/off", "retail-int4-scripted-k2/off"),
        ("retail-bf16-scripted-k2/prompt", "retail-int4-scripted-k2/prompt"),
    }


def _saved_at(planned: Any, index: int, commit: str, dirty: bool = False, source: str = "") -> Any:
    item = planned[index]
    item.out_dir.mkdir(parents=True, exist_ok=True)
    record = {"git_commit": commit, "git_dirty": dirty, "source_sha256": source}
    (item.out_dir / "provenance.json").write_text(json.dumps(record), encoding="utf-8")
    return dataclasses.replace(item, done=1)


def test_a_grid_refuses_to_resume_at_other_code_or_mix_saved_commits(
    tmp_path: Path, tau2_data_dir: Path
) -> None:
    """The shipped cpu-grid ran its arms at 01c9b42 and e3c7c14 of a changing checkout; a resume
    (or a grid whose saved cells disagree) must say so and stop unless told."""
    arms = '[arms.a]\nupstream = "http://127.0.0.1:9/v1"\nmodel = "m"\n'
    grid = load_grid(_write_grid(tmp_path / "g.toml", arms, modes='["off", "prompt"]'))
    planned = plan_runs(grid, grid.select(None), tmp_path, tau2_data_dir)
    here = {"git_commit": "a" * 40, "git_dirty": False, "source_sha256": "s1"}
    same = [_saved_at(planned, 0, "a" * 40), planned[1]]
    check_one_code(same, here)  # the same clean commit: resumes
    other = [_saved_at(planned, 0, "b" * 40), planned[1]]
    with pytest.raises(GridError, match=r"bbbbbbb.*--allow-mixed-commits"):
        check_one_code(other, here)
    check_one_code(other, here, allow_mixed=True)
    # A dirty tree is identified by its source hash, not by the commit it sits on.
    dirty_here = {"git_commit": "a" * 40, "git_dirty": True, "source_sha256": "s1"}
    dirty_saved = [_saved_at(planned, 0, "a" * 40, dirty=True, source="s0"), planned[1]]
    with pytest.raises(GridError, match="source s0"):
        check_one_code(dirty_saved, dirty_here)
    check_one_code([_saved_at(planned, 0, "a" * 40, True, "s1"), planned[1]], dirty_here)


def test_source_hash_moves_with_any_source_file(tmp_path: Path) -> None:
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "a.py").write_text("x = 1\n")
    before = source_sha256(tmp_path)
    (tmp_path / "evals" / "a.py").write_text("x = 2\n")
    assert source_sha256(tmp_path) != before
    assert code_of({"git_commit": "c" * 40, "git_dirty": False}) == "c" * 40
