"""Set-up output a newcomer can read: pip's and CMake's lines filtered to progress.

``pip ... 2>&1 | python scripts/setup_progress.py pip`` prints one line per 20 packages
collected, each wheel built, the final count and every warning or error; ``... cmake`` prints
llama.cpp's compile percentage in steps of 10. The last 40 lines of the raw output are kept and
printed if the command failed (its status comes from ``set -o pipefail`` in the caller), so
nothing needed to diagnose a failure is lost: see ``--on-failure``.
"""

from __future__ import annotations

import re
import sys
import time
from collections import deque
from pathlib import Path

# Make prints "[ 42%] Building ...", Ninja "[42/97] Building ...".
PERCENT = re.compile(r"\[\s*(\d+)%\]|\[(\d+)/(\d+)\]")
KEEP = re.compile(r"(?i)\b(error|warning: (?!.*deprecat))|Successfully built|^Building wheel for")
# Harmless lines that read like trouble to a newcomer: a pip.conf naming a local index that is not
# there (once per package); llama-cpp-python asking scikit-build-core for an extra it dropped;
# llama.cpp's CMake suggesting ccache. They stay in the raw log.
NOISE = re.compile(
    r"WARNING: Location '.*' is ignored"
    r"|scikit-build-core \S+ does not provide the extra 'pyproject'"
    r"|Warning: ccache not found"
)
# A compiler's own diagnostic ("file.h:14148:10: warning: ..."): llama.cpp's build, hundreds of
# lines from system headers on some gcc versions; counted, kept in the log, not printed.
COMPILER_WARNING = re.compile(r"^\s*\S+:\d+:\d+: warning: ")


def main(argv: list[str]) -> int:
    mode = argv[1] if len(argv) > 1 else "pip"
    tail_file = Path(argv[2]) if len(argv) > 2 else None
    tail: deque[str] = deque(maxlen=40)
    collected = 0
    shown_percent = -10
    compiler_warnings = 0
    started = time.monotonic()
    for raw in sys.stdin:
        line = raw.rstrip("\n")
        tail.append(line)
        if NOISE.search(line):
            continue
        elapsed = f"{time.monotonic() - started:5.0f} s"
        if mode == "cmake":
            if COMPILER_WARNING.search(line):
                compiler_warnings += 1
                continue
            match = PERCENT.search(line)
            if match:
                done, total = match.group(2), match.group(3)
                percent = (
                    int(match.group(1) or 0) if total is None else 100 * int(done) // int(total)
                )
                if percent >= shown_percent + 10:
                    shown_percent = percent // 10 * 10
                    print(f"   [{elapsed}] llama.cpp compiled {percent}%", flush=True)
            elif KEEP.search(line) and "Building wheel" not in line:
                print(f"   {line.strip()}", flush=True)
            continue
        if line.startswith("Collecting "):
            collected += 1
            if collected % 20 == 0:
                print(f"   [{elapsed}] {collected} packages collected", flush=True)
        elif line.startswith("Successfully installed"):
            print(f"   [{elapsed}] installed {len(line.split()) - 2} packages", flush=True)
        elif KEEP.search(line):
            print(f"   {line.strip()}", flush=True)
    if compiler_warnings:
        plural = "s" if compiler_warnings != 1 else ""
        print(f"   ({compiler_warnings} compiler warning{plural}, not shown: the raw log has them)")
    if tail_file is not None:
        tail_file.write_text("\n".join(tail) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
