"""scripts/setup_progress.py: what a newcomer sees of the set-up's pip and CMake output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "setup_progress.py"

HEADER = "/usr/lib/gcc/x86_64-linux-gnu/12/include/avx512fintrin.h:14148:10"
CMAKE_OUTPUT = [
    "  WARNING: scikit-build-core 1.1.2 does not provide the extra 'pyproject'",
    *(
        f"  [{n:3d}%] Building C object ggml/src/CMakeFiles/ggml-cpu.dir/op{n}.c.o"
        for n in range(101)
    ),
    *(f"  {HEADER}: warning: ‘__Y’ may be used uninitialized [-Wmaybe-uninitialized]",) * 300,
    "  /src/ggml.c:12:3: error: unknown type name 'foo'",
    "  -- Warning: ccache not found - consider installing it for faster compilation or disable "
    "this warning with GGML_CCACHE=OFF",
    "  Successfully built llama-cpp-python",
]


def _filter(mode: str, lines: list[str], tmp_path: Path) -> list[str]:
    tail = tmp_path / "tail.log"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), mode, str(tail)],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    assert tail.read_text().splitlines()[-1] == lines[-1]  # the raw tail is kept
    return done.stdout.splitlines()


def test_cmake_shows_percent_steps_errors_and_a_count_of_compiler_warnings(tmp_path: Path) -> None:
    shown = _filter("cmake", CMAKE_OUTPUT, tmp_path)
    percents = [line for line in shown if "llama.cpp compiled" in line]
    assert [line.rsplit(" ", 1)[1] for line in percents] == [f"{n}%" for n in range(0, 101, 10)]
    assert not any("may be used uninitialized" in line for line in shown)
    assert any("error: unknown type name" in line for line in shown)
    assert not any("does not provide the extra" in line for line in shown)  # harmless, quiet
    assert not any("ccache" in line for line in shown)
    assert shown[-1] == "   (300 compiler warnings, not shown: the raw log has them)"
    assert len(shown) == 11 + 3


def test_pip_counts_packages_and_keeps_its_warnings(tmp_path: Path) -> None:
    lines = [f"Collecting package{n}" for n in range(45)]
    lines += ["WARNING: Location 'file:///opt/x/simple/six/' is ignored: it is neither a file"]
    lines += ["  WARNING: the script foo is installed in '/x' which is not on PATH"]
    lines += ["Successfully installed a-1 b-2 c-3"]
    shown = _filter("pip", lines, tmp_path)
    assert [line.split("] ", 1)[1] for line in shown if "collected" in line] == [
        "20 packages collected",
        "40 packages collected",
    ]
    assert not any("is ignored" in line for line in shown)
    assert any("not on PATH" in line for line in shown)
    assert shown[-1].endswith("installed 3 packages")
