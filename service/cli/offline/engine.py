"""Everything ``attrserve attribute`` takes from the service's own layers, imported here and
nowhere else in this package: the route's request model and its validation, ``build_work`` (the
route's checks and limits), the model's kind (its method plan), the wire codec and its images,
the worker's engine call (``run_work``), the engine errors' mapping and the workers' torch
thread rule (``limit_threads``)."""

from service.attributions.serving import build_work
from service.compat.kserve import validated
from service.kinds import of as kind_of
from service.kinds import run as run_work
from service.wire import codec, images
from service.wire.attributions import AttributionRequest
from service.wire.engine_errors import from_engine
from service.worker.threads import limit as limit_threads

__all__ = [
    "AttributionRequest",
    "build_work",
    "codec",
    "from_engine",
    "images",
    "kind_of",
    "limit_threads",
    "run_work",
    "validated",
]
