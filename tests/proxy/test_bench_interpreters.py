"""The benchmarks' interpreter choice: ``benchmarks.overhead --variant LABEL#PYTHON`` runs that
proxy on another interpreter, ``benchmarks.vs_peers --python`` runs repairproxy and LiteLLM on one
(LiteLLM in a venv of its own per interpreter), and each run says which build it measured."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.overhead import _Variant
from benchmarks.support.interpreters import interpreter_build, main
from benchmarks.vs_peers import DEFAULT_LITELLM_VENV, litellm_venv_for


def test_a_variant_names_its_source_interpreter_and_flags() -> None:
    variant = _Variant.parse("pgo@/tmp/base#/opt/venv/bin/python=--metrics false")
    assert (variant.label, variant.source, variant.python) == (
        "pgo",
        "/tmp/base",
        "/opt/venv/bin/python",
    )
    assert variant.extra == ["--metrics", "false"]
    assert variant.describe() == "pgo@/tmp/base on /opt/venv/bin/python --metrics false"


def test_a_plain_variant_runs_on_this_interpreter() -> None:
    variant = _Variant.parse("now")
    assert (variant.label, variant.source, variant.python, variant.extra) == ("now", None, None, [])
    assert _Variant.parse("base@/tmp/b").python is None


def test_the_build_line_reads_the_interpreter_it_is_given() -> None:
    line = interpreter_build(sys.executable)
    assert line.startswith(f"CPython {platform.python_version()}, ")
    with open("/proc/self/maps") as maps:
        linked = "libpython" in maps.read()
    assert ("libpython shared" if linked else "libpython linked in") in line


def test_an_interpreter_that_cannot_run_is_reported_not_raised(tmp_path: Path) -> None:
    assert interpreter_build(str(tmp_path / "no-python")).startswith("unreadable (")


def test_litellm_gets_a_venv_per_interpreter() -> None:
    assert litellm_venv_for(sys.executable) == DEFAULT_LITELLM_VENV
    other = litellm_venv_for("/usr/bin/python3-not-this-one")
    assert other.parent == DEFAULT_LITELLM_VENV.parent
    assert other.name.startswith(DEFAULT_LITELLM_VENV.name + "-") and other != DEFAULT_LITELLM_VENV
    assert litellm_venv_for("/usr/bin/python3-not-this-one") == other  # stable


def test_the_listing_times_each_interpreter(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--python", sys.executable, "--repeats", "1"])
    out = capsys.readouterr().out
    assert f"  {sys.executable}: CPython {platform.python_version()}" in out
    assert " ms (" in out


def test_venv_needs_one_interpreter() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.support.interpreters", "--venv", os.devnull],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "--venv needs exactly one --python" in done.stderr
