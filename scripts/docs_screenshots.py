"""Screenshots of the built site (``site/``, from ``make docs``) with headless Chromium: the home
page and the configuration reference, into ``docs/screenshots/``.

    python scripts/docs_screenshots.py [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHOTS = {"home.png": "/", "configuration.png": "/reference/configuration/"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args(argv)
    site = ROOT / "site"
    if not (site / "index.html").is_file():
        raise SystemExit("no site/: run make docs first")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        for name, path in SHOTS.items():
            url = f"http://127.0.0.1:{server.server_address[1]}{path}"
            subprocess.run(
                [
                    args.chromium,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--hide-scrollbars",
                    "--window-size=1440,1000",
                    f"--screenshot={args.out / name}",
                    url,
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
            print(args.out / name)
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
