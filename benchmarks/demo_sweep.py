"""Which τ²-bench tasks does repair visibly change on the embedded model? Each task run twice
through ``python -m evals.demo`` (repair off, then reflexive), one table out.

    python -m benchmarks.demo_sweep [--domain retail] [--tasks 8] [--out docs/demo-sweep]

Tasks are chosen by a stated rule, not by their outcome: the ``--tasks`` tasks whose gold
trajectory has the fewest actions (at least one), ties broken by id. Per run: the reward, tool
calls run and failed, invalid answers the agent received, what the proxy caught, the verdict.
Everything is written to ``OUT/sweep.md`` and ``OUT/sweep.jsonl`` with each run's transcript.
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

from evals.data import resolve_data_dir

COUNTS = re.compile(
    r"agent answers (?P<turns>\d+); .*?invalid answers delivered to the agent (?P<invalid>\d+); "
    r"tool calls run (?P<ran>\d+) \((?P<failed>\d+) failed\)"
)
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
            *(sys.executable, "-m", "evals.demo", "--domain", domain, "--task-id", task_id),
            *("--repair", mode, "--save-to", str(save_to)),
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
        row.update({k: int(v) for k, v in counts.groupdict().items()})
    verdict = VERDICT.search(done.stdout)
    row["verdict"] = verdict.group("verdict") if verdict else None
    reward = re.search(r"\(reward ([0-9.]+)\)", row["verdict"] or "")
    row["reward"] = float(reward.group(1)) if reward else None
    return row


def table(rows: list[dict[str, Any]]) -> str:
    by = {(r["domain"], r["task"], r["mode"]): r for r in rows}
    lines = [
        "| task | off: reward · ran (failed) · invalid delivered | "
        "reflexive: reward · ran (failed) · invalid delivered | changed |",
        "|---|---|---|---|",
    ]

    def cell(row: dict[str, Any] | None) -> str:
        if row is None or row.get("reward") is None:
            return "—"
        return f"{row['reward']:g} · {row.get('ran')} ({row.get('failed')}) · {row.get('invalid')}"

    for domain, task in dict.fromkeys((r["domain"], r["task"]) for r in rows):
        off, on = by.get((domain, task, "off")), by.get((domain, task, "reflexive"))
        changed = ""
        if off and on and off.get("reward") is not None and on.get("reward") is not None:
            keys = ("reward", "ran", "failed", "invalid")
            changed = "yes" if any(off.get(k) != on.get(k) for k in keys) else "no"
        lines.append(f"| {domain} {task} | {cell(off)} | {cell(on)} | {changed} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--domain", default="retail", choices=["retail", "telecom"])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("docs/demo-sweep"))
    args = parser.parse_args(argv)
    data_dir = resolve_data_dir(None, os.environ)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "sweep.jsonl"
    done = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    have = {(r["domain"], r["task"], r["mode"]) for r in done}
    started = time.monotonic()
    for task_id in shortest_tasks(data_dir, args.domain, args.tasks):
        for mode in ("off", "reflexive"):
            if (args.domain, task_id, mode) in have:
                continue
            row = run_one(args.domain, task_id, mode, args.out)
            done.append(row)
            with log.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    report = table(done)
    (args.out / "sweep.md").write_text(
        f"# Demo sweep\n\n`python -m benchmarks.demo_sweep --domain {args.domain} --tasks "
        f"{args.tasks}` ({time.monotonic() - started:.0f} s this run)\n\n{report}\n",
        encoding="utf-8",
    )
    print(report)


if __name__ == "__main__":
    main()
