"""The interpreter the proxy runs on, measured: CPython 3.11 takes ~20-30% more CPU time for the
same work built as pyenv builds it by default (no ``--enable-optimizations``, no LTO, a shared
libpython) than built optimised (Debian's ``/usr/bin/python3.11``, measured; the official
``python`` Docker images that ``docker/Dockerfile`` starts from are configured
``--enable-optimizations --with-lto``). Every CPU figure of this project depends on it, so the
benchmarks print the interpreter they ran the proxy on (``interpreter_build``) and can run it on
another (``benchmarks.overhead --variant LABEL#PYTHON``, ``benchmarks.vs_peers --python``).

    python -m benchmarks.support.interpreters [--python PATH ...] [--repeats 5]
        [--venv DIR --python PATH]   # a venv on that interpreter with this checkout installed

Without ``--venv`` it lists the CPython interpreters it finds (this one, ``/usr/bin/python3*``,
pyenv's versions, or those given) with their build and the CPU time of a fixed pure-Python
workload (dicts, strings, small objects, the kind of work the request path does), interleaved,
the median of the repeats.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys

__all__ = ["interpreter_build", "main"]

# What the workload does: build and read back small dicts, lists and slotted objects, format and
# join strings: the request path's mix, without any package (it runs on a bare interpreter).
_WORKLOAD = """
import time
class P:
    __slots__ = ("a", "b")
    def __init__(self, a, b):
        self.a = a
        self.b = b
def work():
    d = {}
    for i in range(60000):
        d[str(i)] = [i, i * 2, {"a": i, "b": f"v{i}"}]
    s = 0
    for k, v in d.items():
        s += v[0] + len(k) + v[2]["a"] + len(v[2]["b"])
    s += sum(P(i, i).a for i in range(100000))
    return "".join(k for k in list(d)[:1000])
work()
start = time.process_time()
work()
print(time.process_time() - start)
"""

_BUILD = """
import platform, sys, sysconfig
args = sysconfig.get_config_var("CONFIG_ARGS") or ""
flags = [f for f in ("--enable-optimizations", "--with-lto") if f in args]
try:  # what the running executable maps, not what sysconfig was told (Debian says shared)
    with open("/proc/self/maps") as maps:
        linked = "libpython" in maps.read()
except OSError:
    linked = bool(sysconfig.get_config_var("Py_ENABLE_SHARED"))
shared = "libpython shared" if linked else "libpython linked in"
print(f"CPython {platform.python_version()}, {shared}, configured with "
      f"{' '.join(flags) or 'neither --enable-optimizations nor --with-lto'}")
"""


def interpreter_build(python: str) -> str:
    """One line: the interpreter's version and how it was built (as far as its sysconfig says:
    distributions such as Debian build with PGO and LTO without saying so in CONFIG_ARGS)."""
    try:
        done = subprocess.run(
            [python, "-c", _BUILD], capture_output=True, text=True, timeout=60, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unreadable ({exc})"
    return done.stdout.strip()


def _workload_ms(python: str) -> float:
    done = subprocess.run(
        [python, "-c", _WORKLOAD], capture_output=True, text=True, timeout=300, check=True
    )
    return float(done.stdout) * 1e3


def _found() -> list[str]:
    candidates = [sys.executable, *sorted(glob.glob("/usr/bin/python3.[0-9]*"))]
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(os.path.join(root, "versions", "3.*", "bin", "python3")))
    seen: dict[str, str] = {}
    for path in candidates:
        if not os.access(path, os.X_OK) or path.endswith("-config"):
            continue
        seen.setdefault(os.path.realpath(path), path)
    return [path for path in seen.values() if _is_supported(path)]


def _is_supported(python: str) -> bool:
    check = (  # what this project runs on: CPython >= 3.11
        "import sys, platform; "
        "sys.exit(platform.python_implementation() != 'CPython' or sys.version_info < (3, 11))"
    )
    try:
        return subprocess.run([python, "-c", check], timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _make_venv(directory: str, python: str) -> None:
    """A venv on ``python`` with this checkout installed (editable: it runs this tree's code)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(f"creating {directory} on {python} ({interpreter_build(python)})", flush=True)
    subprocess.run([python, "-m", "venv", directory], check=True)
    pip = [os.path.join(directory, "bin", "python"), "-m", "pip"]
    print(f"installing {root} into it (pip, progress below)", flush=True)
    subprocess.run([*pip, "install", "--progress-bar", "on", "-e", root], check=True)
    print(f"done: {os.path.join(directory, 'bin', 'python')}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", action="append", help="an interpreter (repeatable)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--venv", help="create a venv here on the one --python given")
    args = parser.parse_args(argv)
    if args.venv:
        if not args.python or len(args.python) != 1:
            parser.error("--venv needs exactly one --python")
        _make_venv(args.venv, args.python[0])
        return
    pythons = args.python or _found()
    times: dict[str, list[float]] = {python: [] for python in pythons}
    for repeat in range(args.repeats):
        print(f"repeat {repeat + 1}/{args.repeats}", flush=True)
        for python in pythons:
            times[python].append(_workload_ms(python))
    print(f"{'workload CPU':>13}  interpreter")
    for python in sorted(pythons, key=lambda p: statistics.median(times[p])):
        spread = f"{min(times[python]):.0f}-{max(times[python]):.0f}"
        print(
            f"{statistics.median(times[python]):>8.0f} ms ({spread})  {python}: "
            f"{interpreter_build(python)}"
        )


if __name__ == "__main__":
    main()
