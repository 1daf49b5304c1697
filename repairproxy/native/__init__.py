"""Tool calls in an open model family's own format, read when the server's parser missed them.

A model server with no (or the wrong) tool parser, a malformed variant, or a quantized model
drifting from its template leaves the call in ``content`` in the family's native text: Gemma 4's
``<|tool_call>call:NAME{...}``, pythonic lists, gpt-oss harmony channels, DeepSeek's and Kimi's
special tokens, GLM's ``<arg_key>``, MiniMax's and Step-3's ``<invoke>``, Mistral's
``[TOOL_CALLS]``...
Each format has one recogniser (``RECOGNISERS``: family label -> recogniser); each returns typed
matches: the family, the span to cut (the wrapper included, so no marker stays in ``content``),
and the calls with arguments typed by the declared schema where the format writes every value as
text. Marker-stripped variants (a server that drops special tokens from ``content``) are read where
they stay unambiguous, mostly by requiring the name to be a declared tool.

Detection is linear in the text: every recogniser finds its markers with forward searches that never
revisit text, and ``Scanner.steps`` counts the characters examined (tests hold it to that).
"""

from typing import TYPE_CHECKING

from repairproxy._exports import lazy_exports

if TYPE_CHECKING:  # the names' types, for callers importing them from the package
    from repairproxy.native.base import NativeCall as NativeCall
    from repairproxy.native.base import NativeMatch as NativeMatch
    from repairproxy.native.base import Scanner as Scanner
    from repairproxy.native.registry import FAMILIES as FAMILIES
    from repairproxy.native.registry import RECOGNISERS as RECOGNISERS
    from repairproxy.native.registry import find_native_calls as find_native_calls
    from repairproxy.native.registry import opening_markers as opening_markers
    from repairproxy.native.registry import promoted_format as promoted_format
    from repairproxy.native.values import typed_value as typed_value

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "FAMILIES": "registry",
        "RECOGNISERS": "registry",
        "find_native_calls": "registry",
        "opening_markers": "registry",
        "promoted_format": "registry",
        "NativeCall": "base",
        "NativeMatch": "base",
        "Scanner": "base",
        "typed_value": "values",
    },
)
