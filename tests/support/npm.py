"""npm packages the tests drive, installed on first use from the npm registry at a pinned
version into ``~/.cache/repairproxy/npm/<name>@<version>`` (``$REPAIRPROXY_NPM_CACHE`` moves
it), so a test that needs one runs rather than skips. A machine without ``npm`` fails the test:
``.ci/run`` installs it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["ANTHROPIC_SDK", "node_modules"]

# The @anthropic-ai/sdk whose default tool runner threads (message-threads-2026-08-12).
ANTHROPIC_SDK = ("@anthropic-ai/sdk", "1.16.0")


def node_modules(package: tuple[str, str]) -> str:
    """The ``node_modules`` folder holding ``package`` (name, version), installed if missing."""
    name, version = package
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("node and npm are needed (apt-get install nodejs npm; .ci/run does)")
    cache = Path(os.environ.get("REPAIRPROXY_NPM_CACHE", Path.home() / ".cache/repairproxy/npm"))
    prefix = cache / f"{name.replace('/', '+')}@{version}"
    modules = prefix / "node_modules"
    if not (modules / name / "package.json").is_file():
        prefix.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [
                "npm",
                "install",
                "--prefix",
                str(prefix),
                "--no-audit",
                "--no-fund",
                "--save-exact",
                f"{name}@{version}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            pytest.fail(f"npm install {name}@{version} failed: {done.stderr[-2000:]}")
    return str(modules)
