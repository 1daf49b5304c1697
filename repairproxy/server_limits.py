"""Start-up limits fitted to the machine: the soft descriptor limit raised to the hard one, and
the client connection cap (and, if need be, the upstream pool) clamped to what it holds
(``fit_descriptors``, which ``cli.serve`` runs before it binds).
"""

from __future__ import annotations

import dataclasses

from repairproxy.settings import Settings

__all__ = ["fit_descriptors"]


_RESERVED_DESCRIPTORS = 64  # listening sockets, the loop's own, logs, model files, a metrics port


def fit_descriptors(
    settings: Settings, limits: tuple[int, int] | None = None
) -> tuple[Settings, str | None]:
    """Raise the soft descriptor limit to the hard one, then clamp the client connection cap
    (and, if even that cannot fit, the upstream pool) to what the limit holds beside the pools.
    Returns the settings to serve with and the warning to print (None: they fit as given).
    ``limits``: (soft, hard) to plan for, instead of the process's own (which are raised)."""
    if limits is None:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard and (hard == resource.RLIM_INFINITY or soft < hard):
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError):
                pass
    else:
        soft, hard = limits
        soft = hard
    store = settings.episode_store or ""
    redis = max(settings.max_connections, 16) if store.startswith(("redis", "rediss")) else 0
    room = soft - _RESERVED_DESCRIPTORS - redis
    clients, pool = settings.max_client_connections, settings.max_connections
    if clients + pool <= room:
        return settings, None
    if pool > room // 3:  # each share at least a third of what there is
        pool = max(1, room // 3)
    clients = max(1, room - pool)
    fitted = dataclasses.replace(settings, max_client_connections=clients, max_connections=pool)
    return fitted, (
        f"repairproxy: the descriptor limit is {soft}: --max-client-connections "
        f"{settings.max_client_connections} -> {clients}, --max-connections "
        f"{settings.max_connections} -> {pool} (raise the hard limit, ulimit -Hn, to keep them)"
    )
