"""benchmarks/ says which figure is the product's: every module at its top answers one question
(``QUESTION``, which ``--help`` prints) and, run as a command, writes its latest figure to
``benchmarks/results/`` through ``benchmarks.support.results.run_recorded``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.support import results

ROOT = Path(__file__).resolve().parents[2]
FIGURES = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")


def _question(tree: ast.Module) -> str | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "QUESTION" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            return value if isinstance(value, str) else None
    return None


def _recorded_name(tree: ast.Module) -> str | None:
    """The name passed to run_recorded in the module's ``if __name__ == "__main__"`` block."""
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            for call in ast.walk(node):
                if (
                    isinstance(call, ast.Call)
                    and ast.unparse(call.func).endswith("run_recorded")
                    and call.args
                    and isinstance(call.args[0], ast.Constant)
                ):
                    return str(call.args[0].value)
    return None


def test_there_are_figures() -> None:
    assert {"overhead", "vs_peers", "textcalls", "memory"} <= set(FIGURES)


@pytest.mark.parametrize("name", FIGURES)
def test_each_figure_asks_one_question_and_records_its_answer(name: str) -> None:
    tree = ast.parse((ROOT / "benchmarks" / f"{name}.py").read_text())
    question = _question(tree)
    assert question and question.endswith("?"), f"benchmarks/{name}.py: no QUESTION ending in '?'"
    assert _recorded_name(tree) == name, (
        f"benchmarks/{name}.py: __main__ must run_recorded({name!r})"
    )
    shown = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert " ".join(question.split()) in " ".join(shown.stdout.split())


def test_diagnostics_and_support_say_what_they_are_for() -> None:
    for folder in ("diagnostics", "support"):
        for path in sorted((ROOT / "benchmarks" / folder).glob("*.py")):
            assert ast.get_docstring(ast.parse(path.read_text())), path


def _fake_benchmark(argv: list[str]) -> int:
    if "--fail" in argv:
        print("half a table")
        return 3
    print("figure: 42 us")
    return 0


def test_run_recorded_writes_what_the_command_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BENCHMARK_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["x", "--rounds", "3"])
    assert results.run_recorded("fake", _fake_benchmark) == 0
    written = (tmp_path / "fake.txt").read_text()
    assert written.splitlines()[0] == "$ python -m benchmarks.fake --rounds 3"
    assert "figure: 42 us" in written


@pytest.mark.parametrize("argv", [["--fail"], ["--help"]])
def test_run_recorded_keeps_the_last_figure_on_failure_or_help(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BENCHMARK_RESULTS_DIR", str(tmp_path))
    (tmp_path / "fake.txt").write_text("the last measurement\n")
    monkeypatch.setattr(sys, "argv", ["x", *argv])
    results.run_recorded("fake", _fake_benchmark)
    assert (tmp_path / "fake.txt").read_text() == "the last measurement\n"


def test_the_test_suite_never_writes_into_benchmarks_results() -> None:
    assert results.results_dir() != results.RESULTS_DIR
