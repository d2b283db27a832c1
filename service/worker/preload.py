"""What the workers' forkserver imports for the models (``service.pool.processes``): the
modules their sources name (``ModelSource.preload``), listed in ``ATTRSERVE_WORKER_PRELOAD``
by the pool before the forkserver starts.

multiprocessing skips a preload module only when it raises ImportError; one that fails
otherwise (a transformers built for another torch) would stop the forkserver and every worker
with it. Here each is tried alone and a failure is left to the workers that load its models,
which report it for those models only.
"""

from __future__ import annotations

import importlib
import os

#: the variable the pool sets (comma-separated module names)
ENV = "ATTRSERVE_WORKER_PRELOAD"


def declared() -> list[str]:
    """The modules listed for the forkserver so far."""
    return [n for n in os.environ.get(ENV, "").split(",") if n]


def declare(names: list[str]) -> None:
    """Add ``names`` to what a forkserver started from this process will import."""
    os.environ[ENV] = ",".join(dict.fromkeys([*declared(), *names]))


def preload(names: list[str]) -> list[str]:
    """Import each of ``names``; the ones that imported."""
    done = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # the worker loading the model reports it
            continue
        done.append(name)
    return done


preload(declared())
