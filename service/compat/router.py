"""Drop-in routes for KServe and Triton clients: KServe V1 (``:predict``, ``:explain``) and the
Open Inference Protocol v2 (metadata, health, ``infer``, ``explain``).

The model routes are raw handlers over the body's bytes: each FastAPI route declared here
names its handler as its fast handler (``service.http.routing.raw``), which the app calls
straight, and the route's endpoint (for servers without the fast path) calls the same one.
Both run the attributions route's own serving code: codec checks, limits, batching,
cancellation, errors. Errors are problem+json with an ``error`` member too, the one KServe
and Triton clients read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from service.attributions import serving as attributions
from service.compat import kserve, oip, predictions
from service.compat.protocol import (
    InferenceRequest,
    InferenceResponse,
    LiveResponse,
    ModelMetadata,
    ModelReadyResponse,
    ReadyResponse,
    ServerMetadata,
    V1Explanations,
    V1Predictions,
    V1Request,
)
from service.compat.tensors import HEADER, decompress
from service.core.context import request_id
from service.core.errors import MalformedRequest, ServiceError, UnknownModel
from service.core.offload import large, offload_if
from service.core.version import __version__
from service.http import headers
from service.http.observed import ERRORS, Observed, until_disconnect
from service.http.openapi_doc import raw_body
from service.http.problems import HANDLED, problem, to_service_error
from service.http.responses import OrjsonResponse
from service.http.routing import OPEN, Policy, RawHandler, declare, raw
from service.http.state import AppState, get_state
from service.serving.capability import Done, tapped
from service.wire.catalog import Health, Problem
from service.wire.json import parse_json

router = APIRouter()  # tags per route: each operation in one group (one class per API)
State = Annotated[AppState, Depends(get_state)]
Handler = RawHandler
#: what the OIP server metadata lists
EXTENSIONS = ["binary_tensor_data", "explain", "model_repository"]


def _spec(state: AppState, params: dict[str, str], *, computing: bool = True) -> Any:
    """The model's spec; ``computing``: 503 for a model that failed (``AppState.serving``)."""
    spec = (state.healthy if computing else state.spec)(params["model_id"])
    version = params.get("version")
    if version is not None and version != spec.version:
        raise UnknownModel(
            f"model {spec.id!r} serves version {spec.version!r}, not {version!r}",
            loc=("path", "version"),
        )
    return spec


def _json(body: bytes) -> Any:
    try:
        return parse_json(body)
    except ValueError as exc:
        raise MalformedRequest(f"the body is not valid JSON: {exc}", loc=("body",)) from None


def _compat_errors(handler: Handler) -> Handler:
    """Errors as problem+json with the ``error`` member KServe and Triton clients read."""

    async def run(
        state: AppState, request: Request, params: dict[str, str], body: bytes
    ) -> Response:
        try:
            return await handler(state, request, params, body)
        except HANDLED as exc:
            return problem(to_service_error(exc), request.url.path)

    run.__doc__ = handler.__doc__
    return run


def _deadline(request: Request) -> float | None:
    return headers.deadline(request.headers.get(headers.DEADLINE_HEADER))


@_compat_errors
async def v1_predict(
    state: AppState, request: Request, params: dict[str, str], body: bytes
) -> Response:
    with Observed(state, request.scope, params["model_id"], "predict") as seen:
        spec = _spec(state, params)
        data = kserve.validated(V1Request, _json(body), ("body",))
        try:
            reply = await predictions.predict(
                state.settings,
                state.pool,
                spec,
                kserve.inputs_of(data, spec),
                _deadline(request),
                seen.started,
                request_id=request_id.get(),
                disconnected=lambda: until_disconnect(request.receive),
                offload=large(len(body)),
            )
        except ServiceError as err:
            raise err.relocate(kserve.v1_move(data.instances is not None)) from None
        seen.computed(reply.compute_ms)
        # a task's own answer per example: a question-answering model's answers, a
        # detector's detections
        own = {n: reply.study[n] for n in reply.study_rows or [] if reply.study and "." not in n}
        return OrjsonResponse({"predictions": reply.predictions, **own})


async def _explain(
    state: AppState,
    request: Request,
    model_id: str,
    req: Any,
    spec: Any,
    off: bool,
    predictions: bool,
) -> tuple[dict[str, Any], Any]:
    with Observed(state, request.scope, model_id, "explain", req.method) as seen:
        result, work, reply = await attributions.attribute(
            state.settings,
            state.pool,
            spec,
            req,
            _deadline(request),
            seen.started,
            request_id=request_id.get(),
            disconnected=lambda: until_disconnect(request.receive),
            offload=off,
            predictions=predictions,
        )
        seen.computed(reply.compute_ms)
        tapped(state, "attributions", Done(spec, work, reply, {}, {}))  # a monitor's window
        return result, reply


@_compat_errors
async def v1_explain(
    state: AppState, request: Request, params: dict[str, str], body: bytes
) -> Response:
    spec = _spec(state, params)
    data = kserve.validated(V1Request, _json(body), ("body",))
    try:
        req = kserve.explain_request(data, spec, kserve.inputs_of(data, spec))
        off = large(len(body))
        result, reply = await _explain(state, request, spec.id, req, spec, off, True)
    except ServiceError as err:
        raise err.relocate(kserve.v1_move(data.instances is not None)) from None
    return OrjsonResponse(kserve.explain_response(result, reply, req.output_encoding))


async def _oip_decode(
    state: AppState, request: Request, spec: Any, body: bytes, explain: bool
) -> oip.Decoded:
    limit = state.settings.max_body_bytes
    encoding = request.headers.get("content-encoding", "")
    header_length = request.headers.get(HEADER)

    def work() -> oip.Decoded:
        raw = decompress(body, encoding, limit)
        return oip.decode(raw, header_length, spec, state.settings, explain)

    return await offload_if(large(len(body)), work)


def _oip_response(body: bytes, header_length: int | None) -> Response:
    if header_length is None:
        return Response(body, media_type="application/json")
    return Response(
        body,
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(header_length)},
    )


@_compat_errors
async def v2_infer(
    state: AppState, request: Request, params: dict[str, str], body: bytes
) -> Response:
    with Observed(state, request.scope, params["model_id"], "infer") as seen:
        spec = _spec(state, params)
        d = await _oip_decode(state, request, spec, body, explain=False)
        try:
            reply = await predictions.predict(
                state.settings,
                state.pool,
                spec,
                d.inputs,
                _deadline(request),
                seen.started,
                request_id=request_id.get(),
                disconnected=lambda: until_disconnect(request.receive),
            )
        except ServiceError as err:
            raise err.relocate(oip.oip_move(d)) from None
        seen.computed(reply.compute_ms)
        return _oip_response(*oip.encode(spec, d.request, oip.infer_outputs(reply), {}))


@_compat_errors
async def v2_explain(
    state: AppState, request: Request, params: dict[str, str], body: bytes
) -> Response:
    spec = _spec(state, params)
    d = await _oip_decode(state, request, spec, body, explain=True)
    try:
        req = oip.explain_request(d, spec)
        result, reply = await _explain(state, request, spec.id, req, spec, False, predictions=False)
    except ServiceError as err:
        raise err.relocate(oip.oip_move(d)) from None
    parameters = {"method": result["method"], "params": result["params"]}
    if result.get("requested_method"):
        parameters["requested_method"] = result["requested_method"]
    values = oip.explain_outputs(spec, reply)
    return _oip_response(*oip.encode(spec, d.request, values, parameters))


# -- the FastAPI routes: the document, and servers without the fast path ------------------------
COMPAT_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "description": f"{d['description']} (also as `error`)"}
    for code, d in ERRORS.items()
}


async def _raw(handler: Handler, state: AppState, request: Request, **params: str) -> Response:
    return await handler(state, request, params, await request.body())


@router.post(
    "/v1/models/{model_id}:predict",
    operation_id="predict",
    tags=["kserve"],
    response_model=V1Predictions,
    responses=COMPAT_ERRORS,
    openapi_extra=raw_body(V1Request, "KServe V1: instances (or inputs)"),
)
@declare(Policy(fast=raw(v1_predict)))
async def predict_route(model_id: str, state: State, request: Request) -> Response:
    """KServe V1 predict: the model's outputs for the instances."""
    return await _raw(v1_predict, state, request, model_id=model_id)


@router.post(
    "/v1/models/{model_id}:explain",
    operation_id="explain",
    tags=["kserve"],
    response_model=V1Explanations,
    responses=COMPAT_ERRORS,
    openapi_extra=raw_body(V1Request, "KServe V1: instances and optional attribution parameters"),
)
@declare(Policy(fast=raw(v1_explain)))
async def explain_route(model_id: str, state: State, request: Request) -> Response:
    """KServe V1 explain: predictions and one explanation per instance; without parameters,
    the model's default explanation (models.toml ``explain``)."""
    return await _raw(v1_explain, state, request, model_id=model_id)


@router.get("/", operation_id="root", response_model=Health, tags=["kserve"])
@declare(OPEN)
async def root() -> OrjsonResponse:
    """KServe V1 liveness: ``{"status": "alive"}`` while the process is up."""
    return OrjsonResponse({"status": "alive"})


@router.get("/v2", operation_id="serverMetadata", response_model=ServerMetadata, tags=["oip"])
@declare(OPEN)
async def server_metadata() -> OrjsonResponse:
    """OIP server metadata."""
    return OrjsonResponse({"name": "attrserve", "version": __version__, "extensions": EXTENSIONS})


@router.get("/v2/health/live", operation_id="serverLive", response_model=LiveResponse, tags=["oip"])
@declare(OPEN)
async def server_live() -> OrjsonResponse:
    """OIP liveness: the process is up."""
    return OrjsonResponse({"live": True})


@router.get(
    "/v2/health/ready",
    operation_id="serverReady",
    response_model=ReadyResponse,
    tags=["oip"],
    responses={503: {"model": ReadyResponse, "description": "a worker is not ready"}},
)
@declare(OPEN)
async def server_ready(state: State) -> OrjsonResponse:
    """OIP readiness: at least one model is ready (503 otherwise)."""
    ok = state.pool.ready
    return OrjsonResponse({"ready": ok}, status_code=200 if ok else 503)


def _v2_model_route(
    verb: str, suffix: str, endpoint: Callable[..., Awaitable[Response]], **doc: Any
) -> None:
    """An OIP model route, also under ``/versions/{version}`` (undocumented: the same)."""
    for path, shown in (
        ("/v2/models/{model_id}", True),
        ("/v2/models/{model_id}/versions/{version}", False),
    ):
        router.add_api_route(
            path + suffix,
            endpoint,
            methods=[verb],
            tags=["oip"],
            include_in_schema=shown,
            **(doc if shown else {"response_model": doc.get("response_model")}),
        )


async def model_metadata(model_id: str, state: State, request: Request) -> OrjsonResponse:
    """OIP model metadata: inputs and output with OIP datatypes, -1 for free dims."""
    spec = _spec(state, dict(request.path_params), computing=False)
    torchscript = state.pool.model_info.get(spec.id, {}).get("torchscript", False)
    platform = "pytorch_libtorch" if torchscript else "pytorch"
    return OrjsonResponse(oip.model_metadata(spec, platform))


async def model_ready(model_id: str, state: State, request: Request) -> OrjsonResponse:
    """OIP model readiness: the model is loaded and passed its checks (503 otherwise)."""
    spec = _spec(state, dict(request.path_params), computing=False)
    ok = state.pool.model_ready(spec.id)
    return OrjsonResponse({"name": spec.id, "ready": ok}, status_code=200 if ok else 503)


@declare(Policy(fast=raw(v2_infer)))
async def infer_route(model_id: str, state: State, request: Request) -> Response:
    """OIP inference: the model's output as the tensor ``output``."""
    return await v2_infer(state, request, dict(request.path_params), await request.body())


@declare(Policy(fast=raw(v2_explain)))
async def oip_explain_route(model_id: str, state: State, request: Request) -> Response:
    """OIP explain: ``attributions.<input>`` per model input, ``outputs``, ``convergence_delta``."""
    return await v2_explain(state, request, dict(request.path_params), await request.body())


_v2_model_route(
    "GET", "", model_metadata, operation_id="modelMetadata", response_model=ModelMetadata
)
_v2_model_route(
    "GET",
    "/ready",
    model_ready,
    operation_id="modelReady",
    response_model=ModelReadyResponse,
    responses={503: {"model": ModelReadyResponse, "description": "not loaded yet"}},
)
_v2_model_route(
    "POST",
    "/infer",
    infer_route,
    operation_id="infer",
    response_model=InferenceResponse,
    responses=COMPAT_ERRORS,
    openapi_extra=raw_body(
        InferenceRequest,
        "OIP inference request; with the binary tensor data extension the body is this JSON "
        "(Inference-Header-Content-Length bytes) followed by the binary tensors",
        binary=True,
    ),
)
_v2_model_route(
    "POST",
    "/explain",
    oip_explain_route,
    operation_id="oipExplain",
    response_model=InferenceResponse,
    responses=COMPAT_ERRORS,
    openapi_extra=raw_body(
        InferenceRequest,
        "OIP inference request whose parameters name the method (and target, params, ...); "
        "inputs named baselines.<input> are the baselines",
        binary=True,
    ),
)
