"""attrserve's HTTP service: ``create_app(settings)`` and the ``attrserve`` command."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from service.app import create_app
    from service.settings import Settings

__all__ = ["Settings", "__version__", "create_app"]


def __getattr__(name: str) -> Any:
    # Lazy: importing ``service`` must not import torch or fastapi.
    if name == "create_app":
        from service.app import create_app

        return create_app
    if name == "Settings":
        from service.settings import Settings

        return Settings
    raise AttributeError(f"module 'service' has no attribute {name!r}")
