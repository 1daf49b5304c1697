"""``--workers N``: several proxy processes on one port, one budget (Redis), one ``/metrics``.

uvicorn's process manager starts the workers; each builds its app from the Settings the parent
handed over in ``SETTINGS_ENV`` (``worker_app`` is the factory it imports). Their metrics are
summed across processes by ``observe.multiprocess``.
"""

from __future__ import annotations

import base64
import os
import pickle
from typing import Any

from repairproxy.observe.multiprocess import MULTIPROC_ENV
from repairproxy.settings import Settings

__all__ = [
    "MULTIPROC_ENV",
    "SETTINGS_ENV",
    "decode_settings",
    "encode_settings",
    "worker_app",
]

SETTINGS_ENV = "REPAIRPROXY_WORKER_SETTINGS"


def encode_settings(settings: Settings) -> str:
    """Settings for the environment of worker processes this process starts (never read from
    anywhere else: a worker trusts its parent)."""
    return base64.b64encode(pickle.dumps(settings)).decode("ascii")


def decode_settings(text: str) -> Settings:
    settings = pickle.loads(base64.b64decode(text))
    if not isinstance(settings, Settings):
        raise TypeError(f"{SETTINGS_ENV} does not hold Settings")
    return settings


def worker_app() -> Any:
    """The uvicorn factory each worker imports (``repairproxy.workers:worker_app``)."""
    from repairproxy.app import create_app

    return create_app(decode_settings(os.environ[SETTINGS_ENV]))
