"""Which τ²-bench tasks does repair visibly change on the embedded model? Each task run twice
through ``python -m evals.demo`` (repair off, then reflexive), one table out.

    python -m benchmarks.demo_sweep [--domain retail] [--tasks 8 | --task-ids 75 80 ...]
        [--out studies/demo-sweep]

Tasks are chosen by a stated rule, not by their outcome: by default the ``--tasks`` tasks whose
gold trajectory has the fewest actions (at least one), ties broken by id; with ``--task-ids``
the tasks named, in that order (the rule that named them is the caller's to state). Per run: the
reward, tool calls run and failed, invalid answers the agent received, what the proxy caught, the
verdict. Everything is written to ``OUT/sweep.md`` and ``OUT/sweep.jsonl`` with each run's
transcript; runs already in ``OUT/sweep.jsonl`` are not run again.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.support.results import run_recorded
from evals.tau2.data import resolve_data_dir

QUESTION = "Which τ²-bench tasks does repair visibly change on the embedded model?"

COUNTS = re.compile(
    r"agent answers (?P<turns>\d+); caught by the proxy: (?P<caught_by>.*?); promoted "
    r"(?P<promoted>\d+); re-asks (?P<reasks>\d+); invalid answers delivered to the agent "
    r"(?P<invalid>\d+); tool calls run (?P<ran>\d+) \((?P<failed>\d+) failed\)"
)
CAUGHT = re.compile(r"(?P<channel>[a-z_]+) x(?P<count>\d+)")
VERDICT = re.compile(r"^verdict: (?P<verdict>.*)$", re.M)


def shortest_tasks(data_dir: Path, domain: str, count: int) -> list[str]:
    tasks = json.loads((data_dir / "tau2" / "domains" / domain / "tasks.json").read_text())
    sized = [
        (len((task.get("evaluation_criteria") or {}).get("actions") or []), task["id"])
        for task in tasks
    ]
    ranked = sorted((n, int(i) if i.isdigit() else i, i) for n, i in sized if n >= 1)
    return [task_id for _, _, task_id in ranked[:count]]


def run_one(domain: str, task_id: str, mode: str, out: Path) -> dict[str, Any]:
    save_to = out / f"{domain}-{task_id}-{mode}"
    started = time.monotonic()
    done = subprocess.run(
        [
            *(sys.executable, "-m", "evals.demo.episode", "--domain", domain, "--task-id", task_id),
            *("--part", "episode", "--repair", mode, "--save-to", str(save_to)),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    (save_to / "transcript.txt").write_text(done.stdout + done.stderr, encoding="utf-8")
    row: dict[str, Any] = {"domain": domain, "task": task_id, "mode": mode, "rc": done.returncode}
    row["seconds"] = round(time.monotonic() - started, 1)
    counts = COUNTS.search(done.stdout)
    if counts:
        found = counts.groupdict()
        caught_by = found.pop("caught_by")
        row.update({k: int(v) for k, v in found.items()})
        row["caught_by"] = {m["channel"]: int(m["count"]) for m in CAUGHT.finditer(caught_by)}
        row["caught"] = sum(row["caught_by"].values())
    verdict = VERDICT.search(done.stdout)
    row["verdict"] = verdict.group("verdict") if verdict else None
    reward = re.search(r"\(reward ([0-9.]+)\)", row["verdict"] or "")
    row["reward"] = float(reward.group(1)) if reward else None
    return row


def table(rows: list[dict[str, Any]]) -> str:
    by = {(r["domain"], r["task"], r["mode"]): r for r in rows}
    lines = [
        "| task | off: reward · caught · ran (failed) · invalid delivered · s | "
        "reflexive: reward · caught · ran (failed) · invalid delivered · s | changed |",
        "|---|---|---|---|",
    ]

    def cell(row: dict[str, Any] | None) -> str:
        if row is None or row.get("reward") is None:
            return "—"
        caught = row.get("caught", "?")
        return (
            f"{row['reward']:g} · {caught} · {row.get('ran')} ({row.get('failed')}) · "
            f"{row.get('invalid')} · {row.get('seconds', 0):.0f}"
        )

    for domain, task in dict.fromkeys((r["domain"], r["task"]) for r in rows):
        off, on = by.get((domain, task, "off")), by.get((domain, task, "reflexive"))
        changed = ""
        if off and on and off.get("reward") is not None and on.get("reward") is not None:
            keys = ("reward", "caught", "ran", "failed", "invalid")
            changed = "yes" if any(off.get(k) != on.get(k) for k in keys) else "no"
        lines.append(f"| {domain} {task} | {cell(off)} | {cell(on)} | {changed} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=QUESTION)
    parser.add_argument("--domain", default="retail", choices=["retail", "telecom"])
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--tasks", type=int, default=8, help="the N shortest gold trajectories")
    chosen.add_argument("--task-ids", nargs="+", default=None, help="these tasks, in this order")
    parser.add_argument("--rule", default=None, help="with --task-ids: the rule that chose them")
    parser.add_argument("--out", type=Path, default=Path("studies/demo-sweep"))
    args = parser.parse_args(argv)
    data_dir = resolve_data_dir(None, os.environ)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "sweep.jsonl"
    done = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    have = {(r["domain"], r["task"], r["mode"]) for r in done}
    started = time.monotonic()
    if args.task_ids:
        task_ids, chose = list(args.task_ids), f"--task-ids {' '.join(args.task_ids)}"
        rule = args.rule or "the tasks named (no rule given)"
    else:
        task_ids, chose = shortest_tasks(data_dir, args.domain, args.tasks), f"--tasks {args.tasks}"
        rule = f"the {args.tasks} tasks with the fewest gold actions (at least one), ties by id"
    if args.rule:
        chose += f' --rule "{args.rule}"'
    for task_id in task_ids:
        for mode in ("off", "reflexive"):
            if (args.domain, task_id, mode) in have:
                continue
            row = run_one(args.domain, task_id, mode, args.out)
            done.append(row)
            with log.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    report = table(done)
    total = sum(float(r.get("seconds") or 0) for r in done)
    (args.out / "sweep.md").write_text(
        f"# Demo sweep\n\n`python -m benchmarks.demo_sweep --domain {args.domain} {chose}`\n\n"
        f"Tasks: {rule}. Each run is `python -m evals.demo --task-id ID --repair MODE`; cells: "
        "reward · answers the proxy caught · tool calls run (failed) · invalid answers delivered "
        f"to the agent (re-checked by evals.demo.transcript) · wall seconds. {len(done)} runs, "
        f"{total:.0f} s in all ({time.monotonic() - started:.0f} s this invocation).\n\n"
        f"{report}\n",
        encoding="utf-8",
    )
    print(report)


if __name__ == "__main__":
    raise SystemExit(run_recorded("demo_sweep", main))
