"""Frozen proxy settings, declared once: each field carries its flag's help, and argparse is built
from the fields, so a setting's name, type, default, env var and help live in one place.

Every flag of ``repairproxy serve`` has an env var twin (``--upstream-timeout`` ->
``REPAIRPROXY_UPSTREAM_TIMEOUT``); a flag given on the command line wins over the env var.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repairproxy.types import BudgetPolicy, OnExhausted, RepairMode

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "Settings",
    "add_serve_arguments",
    "settings_from_args",
    "settings_from_namespace",
]

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
_ENV_PREFIX = "REPAIRPROXY_"
_TRUE = frozenset({"1", "true", "yes", "on"})


def _truthy(text: str) -> bool:
    return text.strip().lower() in _TRUE


def _ints(text: str) -> tuple[int, ...]:
    return tuple(sorted({int(part) for part in text.split(",") if part.strip()}))


UPSTREAM_APIS = ("chat", "responses", "messages")


def _apis(text: str) -> tuple[str, ...]:
    names = tuple(part.strip().lower() for part in text.split(",") if part.strip())
    if names == ("probe",):
        return names
    unknown = [name for name in names if name not in UPSTREAM_APIS]
    if unknown or "chat" not in names:
        raise ValueError(
            f"--upstream-apis takes chat (always), responses, messages, or probe; got {text!r}"
        )
    return names


def _opt(
    help: str,
    *,
    parse: Callable[[str], Any] | None = None,
    switch: bool = False,
    flag: str | None = None,
    metavar: str | None = None,
) -> dict[str, Any]:
    """Field metadata for one flag: how to parse its text (flag or env var) and its help."""
    return {"help": help, "parse": parse, "switch": switch, "flag": flag, "metavar": metavar}


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the proxy process is configured with; built once, passed explicitly."""

    upstream: str | None = field(
        default=None,
        metadata=_opt(
            "OpenAI-compatible base URL (http://host:port, .../v1, or any base path); "
            "omitted: the embedded CPU model",
            metavar="URL",
        ),
    )
    embedded_arm: str = field(
        default="q4_k_m",
        metadata=_opt("embedded model arm served when no --upstream is given (default q4_k_m)"),
    )
    upstream_apis: tuple[str, ...] = field(
        default=(),
        metadata=_opt(
            "which APIs the upstream serves natively, comma-separated from chat, responses, "
            "messages; the others are translated to chat completions and back (default: all "
            "three for --upstream, chat for the embedded model; 'probe' asks the upstream at "
            "start-up)",
            parse=_apis,
            metavar="LIST",
        ),
    )
    host: str = field(default="127.0.0.1", metadata=_opt("listen address (default 127.0.0.1)"))
    port: int = field(default=8080, metadata=_opt("listen port (default 8080)", parse=int))
    upstream_api_key: str | None = field(
        default=None, metadata=_opt("key sent upstream instead of the client's Authorization")
    )
    api_keys: tuple[str, ...] = field(
        default=(),
        metadata=_opt(
            "a client key the proxy accepts (repeatable; env: comma-separated)", flag="--api-key"
        ),
    )
    upstream_timeout: float = field(
        default=600.0,
        metadata=_opt(
            "seconds to wait for upstream bytes before answering 504 (default 600)", parse=float
        ),
    )
    max_connections: int = field(
        default=512, metadata=_opt("upstream connection pool size (default 512)", parse=int)
    )
    max_body_bytes: int = field(
        default=DEFAULT_MAX_BODY_BYTES,
        metadata=_opt("larger request bodies get 413 (default 16 MiB)", parse=int),
    )
    max_header_bytes: int = field(
        default=64 * 1024,
        metadata=_opt(
            "request line + headers beyond this get 431, before the app (default 64 KiB)",
            parse=int,
        ),
    )
    header_timeout: float = field(
        default=10.0,
        metadata=_opt(
            "seconds a request's headers may take to arrive, else 408 (default 10)", parse=float
        ),
    )
    body_timeout: float = field(
        default=30.0,
        metadata=_opt(
            "seconds a request body may go without progress, else 408; before the app takes it, "
            "seconds from its head (default 30)",
            parse=float,
        ),
    )
    write_timeout: float = field(
        default=60.0,
        metadata=_opt(
            "seconds an answer may wait on a client that stopped reading, then the connection "
            "is dropped (default 60)",
            parse=float,
        ),
    )
    max_pipelined_requests: int = field(
        default=16,
        metadata=_opt(
            "requests queued on one connection behind the one answered; beyond, its bytes wait "
            "unread (default 16)",
            parse=int,
        ),
    )
    keep_alive_timeout: float = field(
        default=5.0,
        metadata=_opt("seconds an idle keep-alive connection is kept (default 5)", parse=float),
    )
    max_client_connections: int = field(
        default=1024,
        metadata=_opt(
            "open client connections; beyond, a new one gets 503 (default 1024; keep it below "
            "the fd limit)",
            parse=int,
        ),
    )
    repair: RepairMode = field(
        default=RepairMode.REFLEXIVE,
        metadata=_opt(
            "off: observe; prompt: add the repair instruction; promote: turn tool calls written "
            "as text into real ones; reflexive: also re-ask with a diagnosis; constrained: also "
            "force the intended tool from attempt 2 (default reflexive)",
            parse=RepairMode,
        ),
    )
    max_repairs: int = field(default=2, metadata=_opt("re-asks per answer (default 2)", parse=int))
    on_exhausted: OnExhausted = field(
        default=OnExhausted.PASS,
        metadata=_opt(
            "when re-asks run out: pass the last answer, strip its invalid calls, or 502",
            parse=OnExhausted,
        ),
    )
    repair_template: Path | None = field(
        default=None,
        metadata=_opt(
            "file replacing the versioned repair texts (see repairproxy/templates)", parse=Path
        ),
    )
    budget: int = field(
        default=10,
        metadata=_opt(
            "tool errors an episode may make, counted like tau2-bench (default 10)", parse=int
        ),
    )
    allow_client_budget: bool = field(
        default=False,
        metadata=_opt(
            "let X-Repairproxy-Budget raise an episode's budget above --budget (lowering it is "
            "always allowed)",
            switch=True,
        ),
    )
    tenant_secret: str | None = field(
        default=None,
        metadata=_opt(
            "secret the tenant of each --api-key is derived from (HMAC); set the same on every "
            "replica (default: random per process)"
        ),
    )
    on_budget_exhausted: BudgetPolicy = field(
        default=BudgetPolicy.ANNOTATE,
        metadata=_opt(
            "annotate the answer, or reject further requests of episodes with an explicit id",
            parse=BudgetPolicy,
        ),
    )
    episode_header: str = field(
        default="x-episode-id",
        metadata=_opt("request header naming the episode (default X-Episode-ID)"),
    )
    tool_error_pattern: str | None = field(
        default=None,
        metadata=_opt(
            "regex marking a role:tool message as a failed call, replacing the default table of "
            "known formats (tau2-bench, LangGraph, the OpenAI Agents SDK, pydantic-ai, LangChain)"
        ),
    )
    max_episodes: int = field(
        default=100_000, metadata=_opt("episodes remembered (LRU, default 100000)", parse=int)
    )
    max_episode_memory: int = field(
        default=256 * 1024 * 1024,
        metadata=_opt(
            "bytes the in-process episode store may hold (estimated; LRU; with several --api-key "
            "each tenant gets an equal share; default 256 MiB)",
            parse=int,
        ),
    )
    max_responses_memory: int = field(
        default=64 * 1024 * 1024,
        metadata=_opt(
            "bytes the in-process store of delivered Responses answers may hold (what "
            "previous_response_id continues; LRU; shared out per API key; with Redis, the same "
            "bound per API key; default 64 MiB)",
            parse=int,
        ),
    )
    episode_idle_ttl: float = field(
        default=3600.0, metadata=_opt("seconds an idle episode is kept (default 3600)", parse=float)
    )
    episode_store: str = field(
        default="memory",
        metadata=_opt(
            "where episode budgets live: memory (one process) or redis://HOST:PORT/DB "
            "(rediss:// and a password in the URL too; shared by every worker and replica)",
            metavar="memory|URL",
        ),
    )
    workers: int = field(
        default=1,
        metadata=_opt(
            "worker processes on one port (more than 1 needs the redis store)", parse=int
        ),
    )
    drain_timeout: float = field(
        default=30.0,
        metadata=_opt(
            "seconds SIGTERM waits for in-flight requests, streams and re-asks (default 30)",
            parse=float,
        ),
    )
    tools_cache_size: int = field(
        default=256, metadata=_opt("distinct tools lists kept compiled (default 256)", parse=int)
    )
    tools_cache_bytes: int = field(
        default=64 * 1024 * 1024,
        metadata=_opt(
            "estimated memory the compiled tools lists may take, least recently used dropped "
            "first (default 64 MiB)",
            parse=int,
        ),
    )
    max_tools: int = field(
        default=1024,
        metadata=_opt("a request declaring more tools gets 400 (default 1024)", parse=int),
    )
    max_tools_bytes: int = field(
        default=256 * 1024,
        metadata=_opt(
            "a request whose tools (JSON) are larger gets 400: compiling them holds the event "
            "loop (with --max-schema-patterns and --max-schema-nodes, ~40 ms at worst; "
            "default 256 KiB)",
            parse=int,
        ),
    )
    max_response_format_bytes: int = field(
        default=256 * 1024,
        metadata=_opt(
            "a request whose response_format (JSON) is larger gets 400: its schema is compiled "
            "on the event loop as tools are (default 256 KiB)",
            parse=int,
        ),
    )
    max_schema_patterns: int = field(
        default=16,
        metadata=_opt(
            "a request whose tools and response_format hold more distinct regular expressions "
            "(pattern, patternProperties keys) gets 400: one near the regex size limit takes "
            "~1.5-3 ms to compile on the event loop (default 16)",
            parse=int,
        ),
    )
    max_schema_nodes: int = field(
        default=8 * 1024,
        metadata=_opt(
            "a request whose tools and response_format hold more JSON objects and arrays gets "
            "400: each costs the compile up to ~4 us on the event loop; at the defaults the "
            "worst accepted request compiles in ~40 ms (default 8192)",
            parse=int,
        ),
    )
    store_timeout: float = field(
        default=0.25,
        metadata=_opt(
            "seconds one episode-store call may take before the request goes on without it "
            "(budget unknown; default 0.25)",
            parse=float,
        ),
    )
    forbid_extra_arguments: bool = field(
        default=False,
        metadata=_opt(
            "undeclared argument names are schema violations even where the schema allows "
            "them (tau2-bench's Python tools reject unexpected keyword arguments)",
            switch=True,
        ),
    )
    metrics: bool = field(
        default=True,
        metadata=_opt("export Prometheus metrics at GET /metrics (default on)", parse=_truthy),
    )
    metrics_port: int | None = field(
        default=None,
        metadata=_opt("serve /metrics on this port instead of the proxy's own", parse=int),
    )
    metrics_api_key: str | None = field(
        default=None, metadata=_opt("require this bearer key on /metrics (default: open)")
    )
    max_tool_labels: int = field(
        default=50,
        metadata=_opt(
            "distinct invented tool names labelled per model; the rest are _other", parse=int
        ),
    )
    max_model_labels: int = field(
        default=20, metadata=_opt("distinct model label values; the rest are _other", parse=int)
    )
    budget_ladder: tuple[int, ...] = field(
        default=(1, 2, 5, 10),
        metadata=_opt(
            "error counts k counted in episodes_over_budget_total (default 1,2,5,10)", parse=_ints
        ),
    )
    margin_probe: bool = field(
        default=False,
        metadata=_opt(
            "ask the upstream for logprobs on tool requests and record the tool-name margin",
            switch=True,
        ),
    )
    log_bodies: bool = field(
        default=False, metadata=_opt("include prompt and answer text in the log lines", switch=True)
    )
    log_level: str = field(default="info", metadata=_opt("default info"))

    def native_apis(self) -> frozenset[str]:
        """The APIs sent upstream as they came; the rest are translated to chat completions.
        ('probe' resolves at start-up; until then every API is assumed native.)"""
        if self.upstream_apis and self.upstream_apis != ("probe",):
            return frozenset(self.upstream_apis)
        return frozenset(UPSTREAM_APIS) if self.upstream is not None else frozenset({"chat"})

    def __post_init__(self) -> None:
        # Fail at start-up, not on the first request. Strings (tests, embedders) become enums.
        object.__setattr__(self, "repair", RepairMode(self.repair))
        object.__setattr__(self, "on_exhausted", OnExhausted(self.on_exhausted))
        object.__setattr__(self, "on_budget_exhausted", BudgetPolicy(self.on_budget_exhausted))
        object.__setattr__(self, "episode_header", self.episode_header.lower())
        object.__setattr__(self, "log_level", self.log_level.lower())
        if any(not key.strip() for key in self.api_keys):
            raise ValueError(
                "--api-key is empty (an unset shell variable?): refusing to start an open proxy; "
                "pass a real key, or no --api-key at all"
            )
        if self.max_repairs < 0 or self.budget < 0:
            raise ValueError("--max-repairs and --budget must be >= 0")
        if self.upstream_timeout <= 0 or self.max_body_bytes <= 0:
            raise ValueError("--upstream-timeout and --max-body-bytes must be > 0")
        if (
            min(self.max_header_bytes, self.max_client_connections, self.max_pipelined_requests) < 1
            or min(
                self.header_timeout, self.keep_alive_timeout, self.body_timeout, self.write_timeout
            )
            <= 0
        ):
            raise ValueError(
                "--max-header-bytes, --max-client-connections, --max-pipelined-requests, "
                "--header-timeout, --body-timeout, --write-timeout and --keep-alive-timeout "
                "must be > 0"
            )
        if self.workers < 1:
            raise ValueError("--workers must be >= 1")
        if self.workers > 1 and self.episode_store == "memory":
            raise ValueError(
                "--workers > 1 needs --episode-store redis://...: with the memory store each "
                "worker would keep its own half of every episode's budget"
            )
        if self.max_schema_patterns < 0 or self.max_schema_nodes < 1:
            raise ValueError("--max-schema-patterns must be >= 0 and --max-schema-nodes >= 1")
        if self.max_tool_labels < 1 or self.max_model_labels < 1:
            raise ValueError("--max-tool-labels and --max-model-labels must be >= 1")


def _flag_name(spec: dataclasses.Field[Any]) -> str:
    return spec.metadata.get("flag") or "--" + spec.name.replace("_", "-")


def _env(environ: Mapping[str, str], flag: str) -> str | None:
    return environ.get(_ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_"))


def add_serve_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Declare the ``serve`` flags from Settings' fields; defaults come from the env vars."""
    for spec in dataclasses.fields(Settings):
        meta = spec.metadata
        flag = _flag_name(spec)
        env = _env(environ, flag)
        if spec.name == "api_keys":
            # append would extend a non-empty default: env keys apply only without flags.
            parser.set_defaults(env_api_keys=tuple(k for k in (env or "").split(",") if k))
            parser.add_argument(
                flag, dest="api_keys", action="append", default=None, help=meta["help"]
            )
            continue
        if meta["switch"]:
            default = _truthy(env) if env is not None else spec.default
            parser.add_argument(
                flag, dest=spec.name, action="store_true", default=default, help=meta["help"]
            )
            continue
        parse = meta["parse"] or str
        choices = list(parse) if isinstance(parse, type) and issubclass(parse, enum.Enum) else None
        parser.add_argument(
            flag,
            dest=spec.name,
            type=parse,
            choices=choices,
            default=parse(env) if env is not None else spec.default,
            metavar=meta["metavar"],
            help=meta["help"],
        )


def settings_from_namespace(ns: argparse.Namespace) -> Settings:
    """Turn parsed ``serve`` arguments into Settings."""
    values = {spec.name: getattr(ns, spec.name) for spec in dataclasses.fields(Settings)}
    values["api_keys"] = tuple(ns.api_keys or getattr(ns, "env_api_keys", ()))
    values["upstream"] = values["upstream"] or None
    return Settings(**values)


def settings_from_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    """Parse ``serve`` flags (without the subcommand) against ``environ`` (default: os.environ)."""
    parser = argparse.ArgumentParser(prog="repairproxy serve")
    add_serve_arguments(parser, os.environ if environ is None else environ)
    return settings_from_namespace(parser.parse_args(list(argv)))
