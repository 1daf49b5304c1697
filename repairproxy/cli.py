"""Command line: ``repairproxy serve --upstream URL ...`` (also ``python -m repairproxy``).

Thin on purpose: parse flags into Settings, start the embedded CPU model when no upstream is given,
run uvicorn (uvloop + httptools, with the header, timeout and connection limits of
``repairproxy.server``) on the app: one process, or ``--workers N`` under uvicorn's
process manager (``repairproxy.workers``). SIGTERM drains: uvicorn stops accepting and waits up to
``--drain-timeout`` for in-flight requests and streams before the process exits.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from repairproxy.settings import Settings, add_serve_arguments, settings_from_namespace

__all__ = ["build_parser", "main", "open_proxy_warning", "serve"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="repairproxy",
        description="OpenAI-compatible proxy that validates and repairs tool calls.",
    )
    commands = parser.add_subparsers(dest="command")
    serve_parser = commands.add_parser(
        "serve",
        help="run the proxy (default command)",
        epilog="Every flag is also an env var: --max-repairs -> REPAIRPROXY_MAX_REPAIRS.",
    )
    add_serve_arguments(serve_parser, os.environ)
    return parser


def _start_embedded(arm: str) -> Any:
    """The zero-config upstream: the embedded CPU model, fetched on first use (progress bar,
    checksum), imported only when it is needed."""
    hint = "Pass --upstream URL (any OpenAI-compatible server), or install repairproxy[local]"
    try:
        from repairproxy.local import start_embedded_upstream
    except ImportError as exc:
        sys.exit(
            "repairproxy: no --upstream given and the embedded CPU model is missing "
            f"({exc}). {hint}."
        )
    print(
        f"repairproxy: no --upstream given; starting the embedded CPU model (arm {arm}; "
        "fetched on first use) ...",
        file=sys.stderr,
        flush=True,
    )
    try:
        return start_embedded_upstream(arm, fetch=True, progress=True)
    except Exception as exc:  # not installed, fetch failed, or the child died: say which
        sys.exit(
            "repairproxy: no --upstream given and the embedded CPU model did not start:\n"
            f"{exc}\n{hint}."
        )


def _model_ids(base_url: str) -> str:
    """The model ids the upstream serves (what clients send as ``model``), for the start line."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=5.0) as reply:
            data = json.load(reply)["data"]
        return ", ".join(str(card["id"]) for card in data) or "?"
    except Exception:  # informative only: an upstream without /models still works
        return "?"


def _bind(settings: Settings) -> socket.socket:
    """The listening socket, bound before anything slow (the embedded model) starts, so a busy
    port fails at once and names the remedy."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, settings.port))
    except OSError as exc:
        sock.close()
        sys.exit(
            f"repairproxy: cannot listen on {settings.host}:{settings.port} ({exc.strerror}). "
            "Another process holds the port? Pick another: --port N (or REPAIRPROXY_PORT=N; "
            'make serve ARGS="--port N").'
        )
    sock.listen(2048)
    return sock


def open_proxy_warning(settings: Settings) -> str | None:
    """The warning for a listen address beyond loopback without client keys (an open proxy)."""
    if settings.api_keys:
        return None
    try:
        loopback = ipaddress.ip_address(settings.host).is_loopback
    except ValueError:
        loopback = settings.host == "localhost"
    if loopback:
        return None
    return (
        f"repairproxy: WARNING: listening on {settings.host} without --api-key: anyone who can "
        "reach this address can use the upstream through the proxy. Pass --api-key KEY (or "
        "REPAIRPROXY_API_KEYS), or listen on 127.0.0.1."
    )


def serve(settings: Settings) -> None:
    """Run the proxy until interrupted; owns the embedded upstream's lifetime if it started one."""
    import uvicorn

    from repairproxy.app import create_app
    from repairproxy.server import fit_descriptors, server_options

    settings, fitted = fit_descriptors(settings)
    for warning in (open_proxy_warning(settings), fitted):
        if warning:
            print(warning, file=sys.stderr, flush=True)
    listener = _bind(settings)
    embedded = None
    if not settings.upstream:
        embedded = _start_embedded(settings.embedded_arm)
        # The embedded server speaks chat completions only: the other APIs are translated.
        apis = settings.upstream_apis or ("chat",)
        settings = replace(settings, upstream=embedded.base_url, upstream_apis=apis)
    try:
        options = server_options(settings)
        models = f"; send model: {_model_ids(embedded.base_url)}" if embedded else ""
        workers = f", {settings.workers} workers" if settings.workers > 1 else ""
        print(
            f"repairproxy: serving on http://{settings.host}:{settings.port}/v1 "
            f"-> {settings.upstream} (repair={settings.repair}{models}{workers}); "
            f"live page http://{settings.host}:{settings.port}/dashboard",
            file=sys.stderr,
            flush=True,
        )
        if settings.workers > 1:
            listener.close()  # uvicorn's process manager binds its own socket
            _serve_workers(settings, options)
        else:
            server = uvicorn.Server(uvicorn.Config(create_app(settings), **options))
            server.run(sockets=[listener])
    finally:
        listener.close()
        if embedded is not None:
            embedded.close()


def _serve_workers(settings: Settings, options: dict[str, Any]) -> None:
    """``--workers N``: uvicorn's process manager, Prometheus in multi-process mode."""
    import uvicorn

    from repairproxy.workers import MULTIPROC_ENV, SETTINGS_ENV, encode_settings

    if settings.metrics_port is not None:
        sys.exit(
            "repairproxy: --metrics-port cannot be combined with --workers > 1 (each worker "
            "would bind it); /metrics on the proxy port sums every worker"
        )
    directory = os.environ.get(MULTIPROC_ENV)
    owned = None
    if directory:  # given by the operator: start from empty files, as prometheus_client asks
        os.makedirs(directory, exist_ok=True)
        for name in os.listdir(directory):
            if name.endswith(".db"):
                os.unlink(os.path.join(directory, name))
    else:
        owned = directory = tempfile.mkdtemp(prefix="repairproxy-metrics-")
    # Set before any worker starts: prometheus_client picks its value store at import.
    os.environ[MULTIPROC_ENV] = directory
    os.environ[SETTINGS_ENV] = encode_settings(settings)
    try:
        uvicorn.run(
            "repairproxy.workers:worker_app", factory=True, workers=settings.workers, **options
        )
    finally:
        if owned is not None:
            shutil.rmtree(owned, ignore_errors=True)


def _check_store(settings: Settings) -> None:
    from repairproxy.episodes.store import is_redis_url

    if settings.episode_store != "memory" and not is_redis_url(settings.episode_store):
        raise ValueError(
            "--episode-store must be memory or a redis://, rediss:// or unix:// URL, "
            f"not {settings.episode_store!r}"
        )
    if is_redis_url(settings.episode_store):
        try:
            import redis  # noqa: F401
        except ImportError as exc:
            raise ValueError(
                f"--episode-store {settings.episode_store.split('@')[-1]} needs redis-py: "
                "pip install 'repairproxy[redis]'"
            ) from exc


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or (args[0].startswith("-") and args[0] not in ("-h", "--help")):
        args.insert(0, "serve")  # `repairproxy --upstream URL` means serve
    ns = build_parser().parse_args(args)
    try:
        settings = settings_from_namespace(ns)
        _check_store(settings)
    except ValueError as exc:
        sys.exit(f"repairproxy: {exc}")
    serve(settings)
