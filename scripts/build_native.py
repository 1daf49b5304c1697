"""Compile the request path with mypyc (``make native``): repairproxy.compiled.COMPILED_MODULES.

One shared library (``repairproxy/_native__mypyc*.so``) and a shim per module beside its source,
built in place, then ``repairproxy/_native_manifest.json`` with the sha256 of every source file:
``repairproxy.compiled`` loads the compiled modules only while that manifest matches the sources.
About 2-3 minutes on 2 cores (C compilation at -O3, one job per core).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["REPAIRPROXY_PURE_PYTHON"] = "1"  # this process reads the sources, never old builds

from mypyc.build import mypycify  # noqa: E402
from setuptools import Distribution  # noqa: E402

from repairproxy.compiled import COMPILED_MODULES, MANIFEST, source_digests  # noqa: E402


def main() -> None:
    os.chdir(ROOT)
    package = ROOT / "repairproxy"
    (package / MANIFEST).unlink(missing_ok=True)  # a failed build leaves the sources in charge
    for old in package.rglob("*.so"):  # an older list's modules must not shadow their sources
        old.unlink()
    sources = source_digests(package)  # what mypyc reads now, not what is there at the end
    paths = [str(Path(*name.split(".")).with_suffix(".py")) for name in COMPILED_MODULES]
    started = time.monotonic()
    print(f"== mypyc: type-checking and generating C for {len(paths)} modules", flush=True)
    extensions = mypycify(
        paths,
        opt_level="3",
        group_name="repairproxy._native",
        target_dir=str(ROOT / "build" / "mypyc"),
    )
    print(
        f"== C compiler: {len(extensions)} extension modules, -O3 "
        f"(C generated in {time.monotonic() - started:.0f} s)",
        flush=True,
    )
    distribution = Distribution({"name": "repairproxy-native", "ext_modules": extensions})
    distribution.script_args = ["build_ext", "--inplace", "--parallel", str(os.cpu_count() or 1)]
    distribution.parse_command_line()
    distribution.run_commands()
    if source_digests(package) != sources:
        sys.exit("== a source changed during the build: the build is not used; run it again")
    manifest = {
        "python": sys.implementation.cache_tag,
        "modules": list(COMPILED_MODULES),
        "sources": sources,
    }
    (package / MANIFEST).write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    print(f"== compiled {len(paths)} modules in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
