"""attrserve's HTTP service: ``service.app.create_app(settings)`` and the ``attrserve`` command.

The folders read as the path of a request: ``http`` (routes, middleware, fast path) ->
``serving`` and ``jobs`` (use cases) -> ``pool`` (queue, batching, worker processes) ->
``worker`` (the worker process) -> ``kinds`` (what each kind of model decides) -> ``wire``
(schemas and codecs) -> ``core`` (errors, settings, the work that crosses processes). Each layer
imports only the ones after it (``[tool.importlinter]`` in pyproject.toml).
"""

from service.core.version import __version__

__all__ = ["__version__"]
