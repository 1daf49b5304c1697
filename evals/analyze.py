"""``python -m evals.analyze RESULTS.json... [--pair REF COMPARED ...] --out DIR``.

Each results file is one arm, labelled ``NAME=PATH`` on the command line or, by default, by the
two folders above it as the path was given (``runs/NAME/<cell>/<mode>/results.json`` →
``<cell>/<mode>``; a symlink is not followed). Without ``--pair``, every grid cell's repair mode
``off`` is compared with each of its other modes; two files outside a grid layout are compared
with each other (the first is the reference). ``--family NAME=PATTERN,...`` fixes the Holm
families (patterns over ``REFERENCE vs COMPARED``). The grid runner calls ``analyze()`` in process.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from evals.analysis import parallel
from evals.analysis.summary import (
    Arm,
    ArmSummary,
    Summary,
    build_summary,
    default_pairs,
    load_arm,
    summarize_arm,
)
from evals.report.write import write_report

__all__ = ["PARALLEL_FILES", "AnalysisError", "analyze", "main", "parse_family"]


class AnalysisError(Exception):
    """The inputs cannot be analysed as asked (a missing file, an unknown pair label)."""


def _split(spec: str | Path) -> tuple[str | None, Path]:
    text = str(spec)
    name, sep, path = text.partition("=")
    if sep and name and not Path(text).exists():
        return name, Path(path)
    return None, Path(text)


PARALLEL_FILES = 8  # from this many results files on, worker processes read them


def _read(path: Path, label: str | None) -> tuple[Arm, ArmSummary]:
    """One results file read and summarised: both are per file, so one worker's call."""
    arm = load_arm(path, label)
    return arm, summarize_arm(arm)


def _load(specs: Sequence[str | Path]) -> tuple[list[Arm], dict[str, ArmSummary]]:
    """The arms, labelled apart, and their summaries: in forked workers when the machine has
    idle CPUs (``evals.analysis.parallel``; a paper-grid file takes ~90 ms to read and summarise,
    its result ~10 ms to send back), else here."""
    calls: list[parallel.Call] = []
    for spec in specs:
        label, path = _split(spec)
        if path.is_dir():
            path = path / "results.json"
        if not path.is_file():
            raise AnalysisError(f"no results file at {path}")
        calls.append((_read, (path, label)))
    workers = parallel.idle_workers() if len(calls) >= PARALLEL_FILES else 1
    read: list[tuple[Arm, ArmSummary]] = parallel.run_calls(calls, workers)
    counts: dict[str, int] = {}
    for arm, _ in read:
        counts[arm.label] = counts.get(arm.label, 0) + 1
    unique: list[Arm] = []
    summaries: dict[str, ArmSummary] = {}
    for arm, summary in read:  # one default label twice: told apart by agent model, then #n
        label = arm.label
        if counts[label] > 1 and arm.agent_model:
            label = f"{label} ({arm.agent_model})"
        base, n = label, 1
        while label in summaries:
            n += 1
            label = f"{base}#{n}"
        if label != arm.label:  # an arm's summary carries its label and nothing else of it
            arm, summary = replace(arm, label=label), replace(summary, label=label)
        unique.append(arm)
        summaries[label] = summary
    return unique, summaries


def _resolve(name: str, arms: Sequence[Arm]) -> str:
    for arm in arms:
        if name == arm.label:
            return arm.label
    wanted = {Path(name).absolute(), Path(name).resolve()}
    for arm in arms:  # a pair may name an arm by its path (or its folder) too
        where = {arm.path.absolute(), arm.path.resolve()}
        where |= {p.parent for p in where}
        if wanted & where:
            return arm.label
    labels = ", ".join(arm.label for arm in arms)
    raise AnalysisError(f"--pair names {name!r}, which is none of the arms ({labels})")


def _default_pairs(arms: Sequence[Arm]) -> list[tuple[str, str]]:
    """Each grid cell's mode off against its other modes; two files outside a grid layout are
    compared with each other, the first as the reference."""
    pairs = default_pairs(arms)
    if not pairs and len(arms) == 2:
        return [(arms[0].label, arms[1].label)]
    return pairs


@contextmanager
def _collector_paused() -> Iterator[None]:
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def parse_family(text: str) -> tuple[str, list[str]]:
    """``NAME=PATTERN[,PATTERN...]`` of ``--family``."""
    name, sep, patterns = text.partition("=")
    chosen = [p.strip() for p in patterns.split(",") if p.strip()]
    if not sep or not name.strip() or not chosen:
        raise AnalysisError(f"--family {text!r}: expected NAME=PATTERN[,PATTERN...]")
    return name.strip(), chosen


def analyze(
    paths: Sequence[str | Path],
    pairs: Sequence[tuple[str, str]] | None,
    out_dir: Path,
    title: str = "repairproxy analysis",
    *,
    families: Mapping[str, Sequence[str]] | None = None,
) -> Summary:
    """Read the arms, compare the pairs (default: see ``_default_pairs``), Holm-adjust within
    ``families`` (default: the built-in ones), and write summary.json, report.md, report.html
    and the PNG figures into ``out_dir``."""
    # A paper grid's arms are millions of small objects that live until the report is
    # written, and every full collection walked them all (~5 s of 28 s CPU at 120 files):
    # they are loaded with the cyclic collector paused, then frozen (never scanned, still
    # freed by reference counts) while the numbers and figures are made.
    with _collector_paused():
        arms, summaries = _load(paths)
        gc.freeze()
    try:
        return _analyze(arms, summaries, pairs, out_dir, title, families)
    finally:
        gc.unfreeze()


def _analyze(
    arms: Sequence[Arm],
    summaries: Mapping[str, ArmSummary],
    pairs: Sequence[tuple[str, str]] | None,
    out_dir: Path,
    title: str,
    families: Mapping[str, Sequence[str]] | None,
) -> Summary:
    if not arms:
        raise AnalysisError("no results files given")
    chosen = [(_resolve(r, arms), _resolve(c, arms)) for r, c in pairs] if pairs else []
    summary = build_summary(
        arms, chosen or _default_pairs(arms), families or None, summaries=summaries
    )
    if not chosen and not default_pairs(arms) and len(arms) == 2:
        reference, compared = arms[0].label, arms[1].label
        said = (
            f"No grid layout: the two files are compared, {reference} as the reference of "
            f"{compared}."
        )
        summary = replace(summary, notes=[said, *summary.notes])
    write_report(summary, out_dir, title)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evals.analyze", description=__doc__)
    parser.add_argument("results", nargs="+", help="results.json files (or NAME=PATH)")
    parser.add_argument(
        "--pair",
        nargs=2,
        action="append",
        metavar=("REFERENCE", "COMPARED"),
        help="compare two arms (labels or paths); repeatable",
    )
    parser.add_argument(
        "--family",
        action="append",
        metavar="NAME=PATTERN,...",
        help="a Holm family: pairs whose 'REFERENCE vs COMPARED' matches a pattern; repeatable",
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--title", default="repairproxy analysis")
    args = parser.parse_args(argv)
    try:
        families = dict(parse_family(f) for f in args.family or []) or None
        summary = analyze(
            args.results,
            [tuple(p) for p in args.pair or []],
            args.out,
            args.title,
            families=families,
        )
    except AnalysisError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for arm in summary.arms.values():
        print(f"{arm.label}: {arm.scored} episodes")
    print(f"{len(summary.pairs)} pair(s); report in {args.out / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
