"""Before `make demo` compiles anything: is the τ²-bench data (or its source) reachable?

Standard library only (it runs with the system python, before the venv exists). Mirrors
``evals.tau2.data.resolve_data_dir``: ``TAU2_DATA_DIR``, else a complete cache under
``$XDG_CACHE_HOME/repairproxy/tau2``, else one pinned file at ``$TAU2_DATA_URL`` (a HEAD request);
when none is there it names the remedy and exits 2. ``tests/evals/test_demo_scenes.py`` checks that
the names here agree with ``evals.tau2.data``.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

DATA_DIR_ENV = "TAU2_DATA_DIR"
DATA_URL_ENV = "TAU2_DATA_URL"
DEFAULT_DATA_URL = "https://raw.githubusercontent.com/sierra-research/tau2-bench"
PROBE = "v1.0.1/data/tau2/domains/retail/db.json"  # the first pinned file, under <tag>/data/
MARKER = Path("tau2") / "domains"

REMEDY = f"""\
The demo needs the τ²-bench data (MIT, Sierra Research). Any one of:
  - a local copy:  export {DATA_DIR_ENV}=/path/to/data   (the folder that holds tau2/domains/)
  - a mirror:      export {DATA_URL_ENV}=http://host:port   serving <tag>/data/<path>, e.g.
                   $TAU2_DATA_URL/{PROBE}   (files are sha256-checked)
  - network access to {DEFAULT_DATA_URL}
or skip the episode: make demo-scenes"""


def check(environ: dict[str, str] | os._Environ[str], timeout: float = 10.0) -> tuple[bool, str]:
    """(ok, what was found or what failed)."""
    given = environ.get(DATA_DIR_ENV)
    if given:
        path = Path(given).expanduser()
        if (path / MARKER).is_dir():
            return True, f"τ²-bench data: {DATA_DIR_ENV}={path}"
        return False, f"{DATA_DIR_ENV}={path} has no {MARKER} folder"
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    cache = Path(base) / "repairproxy" / "tau2"
    if (cache / "data" / ".complete").is_file():
        return True, f"τ²-bench data: the cache {cache}"
    url = f"{(environ.get(DATA_URL_ENV) or DEFAULT_DATA_URL).rstrip('/')}/{PROBE}"
    request = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            status = reply.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        return False, f"{url}: {getattr(exc, 'reason', exc)}"
    if status != 200:
        return False, f"{url}: HTTP {status}"
    return True, f"τ²-bench data: downloadable from {url.removesuffix(PROBE)} (on first use)"


def main() -> int:
    ok, said = check(os.environ)
    if ok:
        print(f"== {said}", flush=True)
        return 0
    print(f"error: the τ²-bench data is not reachable ({said}).\n{REMEDY}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
