"""What the proxy reports: one record per request, the Prometheus metrics fed by it, the
dashboard page and the canonical log line."""

from repairproxy._exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "RequestRecord": "record",
        "PipelineObserver": "record",
        "NullObserver": "record",
        "Metrics": "metrics",
        "RequestLogger": "logging",
        "configure_logging": "logging",
        "render_dashboard": "dashboard",
    },
)
