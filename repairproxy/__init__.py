"""repairproxy: an OpenAI-compatible proxy that validates every tool call and repairs broken ones.

The public surface is small: ``create_app(settings)`` for embedding the ASGI app, ``Settings``
for its frozen configuration; ``python -m repairproxy serve --upstream URL`` runs it.
"""

from typing import TYPE_CHECKING

from repairproxy.settings import Settings

if TYPE_CHECKING:
    from repairproxy.app import create_app

__all__ = ["Settings", "__version__", "create_app"]

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # create_app pulls in the validators and the repair loop; `import repairproxy` stays light.
    if name == "create_app":
        from repairproxy.app import create_app

        return create_app
    raise AttributeError(name)
