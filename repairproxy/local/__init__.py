"""An embedded real model on CPU: Qwen2.5-Coder-1.5B-Instruct GGUF served like vLLM's hermes parser.

``start_embedded_upstream()`` runs it as a child process and returns its ``/v1`` base URL; the proxy
uses it as the upstream when none is given. ``ensure_model()`` (called by it) fetches the model into
the cache on first use, as ``python -m repairproxy.local fetch`` does.
Nothing here imports ``llama_cpp`` until a model is actually loaded.
"""

from repairproxy.local.arms import ARMS, Arm, ModelNotFetchedError, arm_named, resolve_cache_dir
from repairproxy.local.embedded import (
    EmbeddedUpstream,
    EmbeddedUpstreamError,
    start_embedded_upstream,
)
from repairproxy.local.ensure import ensure_model

__all__ = [
    "ARMS",
    "Arm",
    "EmbeddedUpstream",
    "EmbeddedUpstreamError",
    "ModelNotFetchedError",
    "arm_named",
    "ensure_model",
    "resolve_cache_dir",
    "start_embedded_upstream",
]
