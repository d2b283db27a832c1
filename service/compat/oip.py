"""Open Inference Protocol v2: requests decoded into the attributions route's inputs, replies
encoded as OIP outputs (JSON, or the binary tensor data extension).

``infer`` gives the model's output as one tensor named ``output``. ``explain`` gives one
``attributions.<input>`` tensor per model input, ``outputs`` (the model's output at the target,
one per example), ``convergence_delta`` where the method has one, and ``tokens`` (BYTES) for raw
texts. Its request ``parameters`` carry the attribution options; inputs named
``baselines.<input>`` are the baselines. Models that take encoded images take them as BYTES
(base64 in JSON, the files themselves as binary data) besides their ``pixel_values``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from model_registry.spec import ModelSpec
from service import kinds
from service.compat import tensors as oip_tensors
from service.compat.kserve import validated, with_defaults
from service.compat.protocol import InferenceRequest
from service.compat.tensors import OF_TORCH
from service.core.errors import InvalidRequest, Loc
from service.core.settings import Settings
from service.core.work import Reply
from service.wire.attributions import REQUEST_FIELDS, AttributionRequest
from service.wire.json import OPTIONS

#: request parameters the protocol (or Triton's client) uses for itself, not explain options
RESERVED = ("binary_data_output", "sequence_id", "sequence_start", "sequence_end", "priority")
BASELINE = "baselines."
OUTPUT = "output"


@dataclass
class Decoded:
    request: InferenceRequest
    inputs: Any  # {name: array}, texts or encoded images: the attributions route's ``inputs``
    baselines: dict[str, np.ndarray]


def model_metadata(spec: ModelSpec, platform: str) -> dict[str, Any]:
    def dims(shape: tuple[int | None, ...]) -> list[int]:
        return [-1 if d is None else d for d in shape]

    fields = kinds.of(spec).catalogue(spec).example_fields
    inputs = (
        [{"name": f, "datatype": "BYTES", "shape": [-1]} for f in fields]
        if fields is not None
        else [
            {"name": i.name, "datatype": OF_TORCH[i.dtype], "shape": dims(i.shape)}
            for i in spec.inputs
        ]
    )
    return {
        "name": spec.id,
        "versions": [spec.version],
        "platform": platform,
        "inputs": inputs,
        "outputs": [
            {
                "name": OUTPUT,
                "datatype": OF_TORCH.get(spec.dtype, "FP32"),
                "shape": dims((None, *spec.output.shape)),
            }
        ],
    }


def decode(
    body: bytes, header_length: str | None, spec: ModelSpec, settings: Settings, explain: bool
) -> Decoded:
    """The request, its inputs and (explain) baselines; every tensor checked as the attributions
    route checks its own (through ``codec`` afterwards)."""
    header, binary = oip_tensors.split_body(body, header_length)
    req: InferenceRequest = validated(InferenceRequest, header, ("body",))
    fields = kinds.of(spec).catalogue(spec).example_fields  # examples as objects: by field
    names = list(fields) if fields is not None else [i.name for i in spec.inputs]
    arrays: dict[str, Any] = {}
    baselines: dict[str, np.ndarray] = {}
    offset = 0
    for k, t in enumerate(req.inputs):
        loc: Loc = ("body", "inputs", k)
        value, offset = oip_tensors.decode(
            t, binary, offset, loc, settings.max_tensor_elements, files=spec.images is not None
        )
        if explain and t.name.startswith(BASELINE) and t.name[len(BASELINE) :] in names:
            if isinstance(value, list):
                raise InvalidRequest(f"{t.name} must be numbers, not BYTES", loc=loc)
            baselines[t.name[len(BASELINE) :]] = value
        elif t.name in names:
            if t.name in arrays:
                raise InvalidRequest(f"input {t.name!r} is given twice", loc=(*loc, "name"))
            arrays[t.name] = value
        else:
            extra = f" (or {BASELINE}<input>)" if explain else ""
            raise InvalidRequest(
                f"unknown input {t.name!r}; model {spec.id!r} takes {names}{extra}",
                loc=(*loc, "name"),
            )
    if offset != len(binary):
        raise InvalidRequest(
            f"the body holds {len(binary) - offset} bytes after the last binary tensor",
            loc=("body",),
        )
    if fields is not None:
        return Decoded(req, _objects(arrays, fields), baselines)
    texts = [v for v in arrays.values() if isinstance(v, list)]
    if texts:
        if len(arrays) != 1:
            raise InvalidRequest("a BYTES (text) input must be the only input", loc=("body",))
        if spec.images is not None:  # encoded images: base64 in JSON, the files in binary
            return Decoded(req, [{"image": v} for v in texts[0]], baselines)
        return Decoded(req, texts[0], baselines)
    return Decoded(req, arrays, baselines)


def _objects(arrays: dict[str, Any], fields: tuple[str, ...]) -> list[dict[str, Any]]:
    """One BYTES input per field (a question and a context per example) as the examples'
    objects."""
    missing = [f for f in fields if f not in arrays]
    if missing:
        raise InvalidRequest(
            f"the model takes one BYTES input per field {list(fields)}; missing {missing}",
            loc=("body", "inputs"),
        )
    columns = [arrays[f] for f in fields]
    if not all(isinstance(c, list) for c in columns) or len({len(c) for c in columns}) != 1:
        raise InvalidRequest(
            f"inputs {list(fields)} must be BYTES of one length (an entry per example)",
            loc=("body", "inputs"),
        )
    return [dict(zip(fields, row, strict=True)) for row in zip(*columns, strict=True)]


def oip_move(d: Decoded | None) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """OIP: a model input's errors point at its entry in ``inputs`` (by index), baselines at
    their ``baselines.<input>`` entry, attribution options at ``parameters``."""
    index = {} if d is None else {t.name: k for k, t in enumerate(d.request.inputs)}
    fields = REQUEST_FIELDS - {"inputs", "baselines"} | {"method", "params"}

    def move(loc: Loc) -> Loc:
        if len(loc) > 2 and loc[1] == "inputs" and loc[2] in index:
            return ("body", "inputs", index[loc[2]], *loc[3:])
        if len(loc) > 2 and loc[1] == "baselines" and BASELINE + str(loc[2]) in index:
            return ("body", "inputs", index[BASELINE + str(loc[2])], *loc[3:])
        if len(loc) > 1 and loc[1] in fields:
            return ("body", "parameters", *loc[1:])
        return loc

    return move


def _json_value(value: Any) -> Any:
    """A parameter that is JSON text holding an object or list (for clients that only send
    strings, numbers and booleans as parameters), else the value as it is."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def explain_request(d: Decoded, spec: ModelSpec) -> AttributionRequest:
    given = {k: _json_value(v) for k, v in (d.request.parameters or {}).items()}
    for name in RESERVED:
        given.pop(name, None)
    timeout = given.pop("timeout", None)  # Triton's request timeout, in microseconds
    if isinstance(timeout, (int, float)) and timeout > 0 and "deadline_ms" not in given:
        given["deadline_ms"] = timeout / 1e3
    given = with_defaults(given, spec)
    for name in ("inputs", "baselines", "output_encoding"):
        if name in given:
            hint = f"send them as inputs named {BASELINE}<input>" if name == "baselines" else ""
            raise InvalidRequest(
                f"parameters.{name} is not an explain parameter" + (f": {hint}" if hint else ""),
                loc=("body", "parameters", name),
            )
    if d.baselines:
        # inputs without a baselines.<input> tensor get zeros, as when none are given
        given["baselines"] = {i.name: d.baselines.get(i.name, 0.0) for i in spec.inputs}
    req: AttributionRequest = validated(
        AttributionRequest, {**given, "inputs": d.inputs}, ("body", "parameters")
    )
    return req


def _binary_outputs(req: InferenceRequest, available: list[str]) -> dict[str, bool]:
    """Which outputs to send, and whether each goes as binary data."""
    default = bool((req.parameters or {}).get("binary_data_output", False))
    if not req.outputs:
        return {name: default for name in available}
    chosen: dict[str, bool] = {}
    for k, o in enumerate(req.outputs):
        if o.name not in available:
            raise InvalidRequest(
                f"unknown output {o.name!r}; this request has {available}",
                loc=("body", "outputs", k, "name"),
            )
        chosen[o.name] = bool((o.parameters or {}).get("binary_data", default))
    return chosen


def infer_outputs(reply: Reply) -> dict[str, Any]:
    return {OUTPUT: reply.predictions, **_answers(reply)}


def _answers(reply: Reply) -> dict[str, Any]:
    """A question-answering model's answers: their text, and where each lies in its context
    (character offsets; -1 where the tokenizer cannot say)."""
    answers = (reply.study or {}).get("answers")
    if answers is None:
        return {}
    offsets = [[-1 if a[k] is None else a[k] for k in ("start", "end")] for a in answers]
    return {
        "answers": [[a["text"]] for a in answers],  # BYTES [N, 1]
        "answers.offsets": np.array(offsets, dtype=np.int64),
    }


def explain_outputs(spec: ModelSpec, reply: Reply) -> dict[str, Any]:
    out: dict[str, Any] = {}
    names = [i.name for i in spec.inputs]
    if reply.layers is not None:  # a list of layers: attributions.<layer> (.<j>: its tensors)
        listed = reply.params.get("layer") or []
        names = [
            f"{layer}.{j}" if count > 1 else str(layer)
            for layer, count in zip(listed, reply.layers, strict=False)
            for j in range(count)
        ]
    for name, part in zip(names, reply.attributions, strict=False):
        out[f"attributions.{name}"] = part
    if reply.outputs is not None:
        out["outputs"] = reply.outputs
    if reply.delta is not None:
        out["convergence_delta"] = reply.delta
    if reply.base_values is not None:
        out["base_values"] = reply.base_values
    for name, part in zip(names, reply.standard_error or [], strict=False):
        out[f"standard_error.{name}"] = part
    if reply.tokens is not None:
        out["tokens"] = reply.tokens
    if reply.units is not None:  # each unit's character offsets, -1 past a text's units
        widest = max((len(u) for u in reply.units), default=0)
        offsets = np.full((len(reply.units), widest, 2), -1, dtype=np.int64)
        for i, row in enumerate(reply.units):
            for j, unit in enumerate(row):
                offsets[i, j] = (unit["start"], unit["end"])
        out["units.offsets"] = offsets
    for name, part in zip(names, reply.segments or [], strict=False):
        out[f"feature_mask.{name}"] = part  # the segments credited, [N, H, W]
    out.update(_answers(reply))
    for name, value in (reply.metrics or {}).items():  # metrics.infidelity, metrics.deletion.auc
        parts = value if isinstance(value, dict) else {"": value}
        for key, arr in parts.items():
            out[f"metrics.{name}" + (f".{key}" if key else "")] = arr
    return out


def encode(
    spec: ModelSpec, req: InferenceRequest, values: dict[str, Any], parameters: dict[str, Any]
) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's size when binary tensors follow it."""
    chosen = _binary_outputs(req, list(values))
    outputs, blobs = [], []
    for name, binary in chosen.items():
        meta, blob = oip_tensors.encode(name, values[name], binary)
        outputs.append(meta)
        if blob is not None:
            blobs.append(blob)
    head: dict[str, Any] = {"model_name": spec.id, "model_version": spec.version}
    if req.id is not None:
        head["id"] = req.id
    if parameters:
        head["parameters"] = parameters
    head["outputs"] = outputs
    header = orjson.dumps(head, option=OPTIONS)
    if not blobs:
        return header, None
    return b"".join((header, *blobs)), len(header)
