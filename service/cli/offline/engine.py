"""Everything ``attrserve attribute`` takes from the service's own layers, imported here and
nowhere else in this package: the route's request model and its validation, ``build_job`` (the
route's checks and limits), the cost plan, the wire codec, and the worker's ``run_job``. When
those layers move, this is the one module to re-point."""

from service.serving import support
from service.serving.attributions import build_job
from service.serving.kserve import validated
from service.wire import codec
from service.wire.attributions import AttributionRequest
from service.worker.compute import run_job

__all__ = ["AttributionRequest", "build_job", "codec", "run_job", "support", "validated"]
