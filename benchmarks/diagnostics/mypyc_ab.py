"""Would compiling the request path with mypyc pay? Build a compiled copy and measure it.

    python -m benchmarks.diagnostics.mypyc_ab [--requests 20000] [--repeats 5] [--keep DIR]

Copies this checkout's tracked files into a temporary tree, compiles ``MODULES`` there with
mypyc (one shared library, ~2.4 min on 2 cores; needs a C compiler and setuptools, which a
Python 3.11 venv has and a 3.12 one does not: `pip install setuptools`), then
runs ``benchmarks.diagnostics.decision_cost`` (the app in process, every feature on) from both
trees, interleaved, and prints each one's CPU per request. The project is ``mypy --strict``, so
these modules compile as they are; instructions are what mypyc removes (the whole server under
callgrind: 681k -> 567k a JSON request), but on the 2-core EPYC VM of 2026-12-03 the CPU time
did not follow (docs/measurements.md), which is why the package ships as Python.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The modules a JSON or streamed chat completion runs through, measured one by one under
# callgrind. (server.py compiles but costs more instructions compiled: its class subclasses
# uvicorn's; upstream/http1.py, observe/logging.py and observe/metrics.py do not compile as they
# are: an OSError subclass, a weak reference to the writer, a nested class.)
MODULES = (
    "repairproxy/asgi/call.py",
    "repairproxy/asgi/chat.py",
    "repairproxy/asgi/exchange.py",
    "repairproxy/asgi/gate.py",
    "repairproxy/asgi/messages.py",
    "repairproxy/asgi/responder.py",
    "repairproxy/asgi/responses.py",
    "repairproxy/asgi/routes.py",
    "repairproxy/episodes/budget.py",
    "repairproxy/episodes/chaining.py",
    "repairproxy/episodes/memory_store.py",
    "repairproxy/episodes/tool_errors.py",
    "repairproxy/observe/record.py",
    "repairproxy/pipeline.py",
    "repairproxy/reask.py",
    "repairproxy/repair.py",
    "repairproxy/structured.py",
    "repairproxy/textcalls.py",
    "repairproxy/upstream/client.py",
    "repairproxy/validation.py",
    "repairproxy/wire/openai.py",
)
_BUILD = """
import sys
from mypyc.build import mypycify
from setuptools import Distribution
extensions = mypycify(sys.argv[1:], opt_level="3", group_name="repairproxy._native")
distribution = Distribution({"name": "repairproxy-native", "ext_modules": extensions})
distribution.script_args = ["build_ext", "--inplace"]
distribution.parse_command_line()
distribution.run_commands()
"""


def build(tree: Path) -> None:
    """The tracked files of this checkout in ``tree``, ``MODULES`` compiled in place."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            (tree / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / name.decode())
    started = time.monotonic()
    print(f"== mypyc: {len(MODULES)} modules in {tree} (about 2 minutes)", flush=True)
    log = tree / "mypyc-build.log"
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, "-c", _BUILD, *MODULES], cwd=tree, stdout=out, stderr=out
        )
    if done.returncode:
        sys.exit(f"mypyc failed; its log: {log}")
    print(f"== built in {time.monotonic() - started:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="build here and keep it (default: a temp dir)")
    args = parser.parse_args(argv)
    tree = args.keep or Path(tempfile.mkdtemp(prefix="mypyc-ab-"))
    try:
        build(tree)
        probe = "import repairproxy.pipeline as p; print(p.__file__)"
        loaded = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        print(f"== the compiled tree loads {loaded}", flush=True)
        command = [sys.executable, "-m", "benchmarks.diagnostics.decision_cost"]
        command += ["--requests", str(args.requests), "--repeats", str(args.repeats)]
        command += ["--variant", f"compiled@{tree}", "--variant", f"python@{ROOT}"]
        subprocess.run(command, cwd=ROOT, check=True)
    finally:
        if args.keep is None:
            shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    main()
