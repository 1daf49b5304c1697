"""Frozen proxy settings: the only place flags and ``REPAIRPROXY_<FLAG>`` env vars are read.

Every flag of ``repairproxy serve`` has an env var twin (``--upstream-timeout`` ->
``REPAIRPROXY_UPSTREAM_TIMEOUT``); a flag given on the command line wins over the env var.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BUDGET_POLICIES",
    "DEFAULT_MAX_BODY_BYTES",
    "EXHAUSTED_POLICIES",
    "REPAIR_MODES",
    "Settings",
    "add_serve_arguments",
    "settings_from_args",
    "settings_from_namespace",
]

REPAIR_MODES = ("off", "prompt", "reflexive", "constrained")
EXHAUSTED_POLICIES = ("pass", "strip", "error")
BUDGET_POLICIES = ("annotate", "reject")
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
_ENV_PREFIX = "REPAIRPROXY_"
_TRUE = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the proxy process is configured with; built once, passed explicitly."""

    upstream: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    upstream_api_key: str | None = None
    api_keys: tuple[str, ...] = ()
    upstream_timeout: float = 600.0
    max_connections: int = 512
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    repair: str = "reflexive"
    max_repairs: int = 2
    on_exhausted: str = "pass"
    repair_template: Path | None = None
    budget: int = 10
    on_budget_exhausted: str = "annotate"
    episode_header: str = "x-episode-id"
    tool_error_pattern: str = r"^Error"
    max_episodes: int = 100_000
    episode_idle_ttl: float = 3600.0
    tools_cache_size: int = 256
    forbid_extra_arguments: bool = False
    log_bodies: bool = False
    log_level: str = "info"

    def __post_init__(self) -> None:
        # Fail at start-up, not on the first request.
        _check_choice("repair", self.repair, REPAIR_MODES)
        _check_choice("on_exhausted", self.on_exhausted, EXHAUSTED_POLICIES)
        _check_choice("on_budget_exhausted", self.on_budget_exhausted, BUDGET_POLICIES)
        if self.max_repairs < 0 or self.budget < 0:
            raise ValueError("--max-repairs and --budget must be >= 0")
        if self.upstream_timeout <= 0 or self.max_body_bytes <= 0:
            raise ValueError("--upstream-timeout and --max-body-bytes must be > 0")


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _env(environ: Mapping[str, str], flag: str) -> str | None:
    return environ.get(_ENV_PREFIX + flag.upper().replace("-", "_"))


def add_serve_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Declare the ``serve`` flags; each default comes from its ``REPAIRPROXY_<FLAG>`` env var."""
    d = Settings()

    def default(flag: str, fallback: object) -> object:
        value = _env(environ, flag)
        return fallback if value is None else value

    add = parser.add_argument
    add(
        "--upstream",
        default=default("upstream", None),
        help="OpenAI-compatible base URL (http://host:port or .../v1); omitted: embedded CPU model",
    )
    add("--host", default=default("host", d.host), help="listen address (default 127.0.0.1)")
    add("--port", type=int, default=default("port", d.port), help="listen port (default 8080)")
    add(
        "--upstream-api-key",
        default=default("upstream-api-key", None),
        help="key sent upstream instead of the client's Authorization",
    )
    # append would extend a non-empty default, so env keys live apart and apply only without flags.
    env_keys = _env(environ, "api-key")
    parser.set_defaults(env_api_keys=tuple(k for k in (env_keys or "").split(",") if k))
    add(
        "--api-key",
        dest="api_keys",
        action="append",
        default=None,
        help="a client key the proxy accepts (repeatable; env: comma-separated)",
    )
    add(
        "--upstream-timeout",
        type=float,
        default=default("upstream-timeout", d.upstream_timeout),
        help="seconds to wait for upstream bytes before answering 504 (default 600)",
    )
    add(
        "--max-connections",
        type=int,
        default=default("max-connections", d.max_connections),
        help="upstream connection pool size (default 512)",
    )
    add(
        "--max-body-bytes",
        type=int,
        default=default("max-body-bytes", d.max_body_bytes),
        help="larger request bodies get 413 (default 16 MiB)",
    )
    add(
        "--repair",
        choices=REPAIR_MODES,
        default=default("repair", d.repair),
        help="off: observe; prompt: add the repair instruction; reflexive: also re-ask with a "
        "diagnosis; constrained: also force the intended tool from attempt 2 (default reflexive)",
    )
    add(
        "--max-repairs",
        type=int,
        default=default("max-repairs", d.max_repairs),
        help="re-asks per answer (default 2)",
    )
    add(
        "--on-exhausted",
        choices=EXHAUSTED_POLICIES,
        default=default("on-exhausted", d.on_exhausted),
        help="when re-asks run out: pass the last answer, strip its invalid calls, or 502",
    )
    add(
        "--repair-template",
        type=Path,
        default=default("repair-template", None),
        help="file replacing the versioned repair texts (see repairproxy/templates)",
    )
    add(
        "--budget",
        type=int,
        default=default("budget", d.budget),
        help="tool errors an episode may make, counted like tau2-bench (default 10)",
    )
    add(
        "--on-budget-exhausted",
        choices=BUDGET_POLICIES,
        default=default("on-budget-exhausted", d.on_budget_exhausted),
        help="annotate the answer, or reject the episode's further requests with 429",
    )
    add(
        "--episode-header",
        default=default("episode-header", d.episode_header),
        help="request header naming the episode (default X-Episode-ID)",
    )
    add(
        "--tool-error-pattern",
        default=default("tool-error-pattern", d.tool_error_pattern),
        help="regex marking a role:tool message as a failed call (default ^Error)",
    )
    add(
        "--max-episodes",
        type=int,
        default=default("max-episodes", d.max_episodes),
        help="episodes remembered (LRU, default 100000)",
    )
    add(
        "--episode-idle-ttl",
        type=float,
        default=default("episode-idle-ttl", d.episode_idle_ttl),
        help="seconds an idle episode is kept (default 3600)",
    )
    add(
        "--tools-cache-size",
        type=int,
        default=default("tools-cache-size", d.tools_cache_size),
        help="distinct tools lists kept compiled (default 256)",
    )
    env_extra = _env(environ, "forbid-extra-arguments")
    add(
        "--forbid-extra-arguments",
        action="store_true",
        default=env_extra is not None and env_extra.lower() in _TRUE,
        help="undeclared argument names are schema violations even where the schema allows "
        "them (tau2-bench's Python tools reject unexpected keyword arguments)",
    )
    env_bodies = _env(environ, "log-bodies")
    add(
        "--log-bodies",
        action="store_true",
        default=env_bodies is not None and env_bodies.lower() in _TRUE,
        help="include prompt and answer text in the log lines",
    )
    add("--log-level", default=default("log-level", d.log_level), help="default info")


def settings_from_namespace(ns: argparse.Namespace) -> Settings:
    """Turn parsed ``serve`` arguments into Settings (argparse leaves env defaults as strings)."""
    template = ns.repair_template
    return Settings(
        upstream=ns.upstream or None,
        host=ns.host,
        port=int(ns.port),
        upstream_api_key=ns.upstream_api_key or None,
        api_keys=tuple(ns.api_keys or getattr(ns, "env_api_keys", ())),
        upstream_timeout=float(ns.upstream_timeout),
        max_connections=int(ns.max_connections),
        max_body_bytes=int(ns.max_body_bytes),
        repair=ns.repair,
        max_repairs=int(ns.max_repairs),
        on_exhausted=ns.on_exhausted,
        repair_template=Path(template) if template else None,
        budget=int(ns.budget),
        on_budget_exhausted=ns.on_budget_exhausted,
        episode_header=ns.episode_header.lower(),
        tool_error_pattern=ns.tool_error_pattern,
        max_episodes=int(ns.max_episodes),
        episode_idle_ttl=float(ns.episode_idle_ttl),
        tools_cache_size=int(ns.tools_cache_size),
        forbid_extra_arguments=bool(ns.forbid_extra_arguments),
        log_bodies=bool(ns.log_bodies),
        log_level=str(ns.log_level).lower(),
    )


def settings_from_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    """Parse ``serve`` flags (without the subcommand) against ``environ`` (default: os.environ)."""
    parser = argparse.ArgumentParser(prog="repairproxy serve")
    add_serve_arguments(parser, os.environ if environ is None else environ)
    return settings_from_namespace(parser.parse_args(list(argv)))
