"""Schemas of the catalogue routes: models, methods, health; and the methods as the engine
lists them (``method_list``: GET /v1/methods and the OpenAPI document)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

import methods


class InputInfo(BaseModel):
    name: str
    dtype: str
    shape: list[int | None] = Field(description="null marks a free dim (dim 0: examples)")
    features: list[str] | None = Field(
        default=None, description="[N, F] inputs: the features' names, when the model gives them"
    )


class OutputInfo(BaseModel):
    shape: list[int | None] = Field(description="per example, without the batch dim")
    labels: list[str]


class ExportedInfo(BaseModel):
    """An attribution-export model's one step: the only method it serves, as baked in."""

    method: str
    params: dict[str, Any] | None = Field(description="the params baked in (null: unknown)")
    target: Any = Field(
        description='"input" (requests give one class per example) or the target baked in'
    )


ModelStateName = Literal["loading", "ready", "failed", "unloaded"]


class ModelState(BaseModel):
    state: ModelStateName = Field(
        description="loading (its worker group starting, or a worker being replaced) | ready "
        "| failed (it could not load, was refused by its checks, or its worker crashed: "
        "requests get 503 at once) | unloaded (through the model repository: requests get 404)"
    )
    reason: str | None = Field(
        default=None, description="why it is not ready: the load error, the crash, ..."
    )
    group: str = Field(description="the worker group serving it (its own id unless shared)")


class ModelInfo(BaseModel):
    id: str
    name: str = Field(description="the id again (KServe V1's model name)")
    ready: bool = Field(description="loaded and serving (state: ready)")
    state: ModelStateName = Field(default="ready", description="as in /v1/health/ready")
    reason: str | None = Field(default=None, description="why it is not ready")
    group: str | None = Field(default=None, description="the worker group serving it")
    version: str
    description: str
    device: str
    inputs: list[InputInfo]
    output: OutputInfo
    layers: list[str]
    embedding_layer: str | None = None
    tokenizer: bool = Field(default=False, description="accepts raw text inputs")
    images: bool = Field(
        default=False,
        description='accepts encoded images as inputs ([{"image": "<base64>"}]): its image '
        "processor makes them pixel_values",
    )
    predicts: bool = Field(
        default=True,
        description="gives predictions (KServe :predict, OIP infer), so attacks, "
        "counterfactuals and metrics can run on it",
    )
    methods: list[str] = Field(description="methods this model can serve")
    exported: ExportedInfo | None = Field(
        default=None,
        description="attribution-export models: the file's one method, params and target",
    )
    compiled: bool = Field(default=False, description="hook-free methods run torch.compile'd")
    compile_error: str | None = Field(
        default=None, description="compile = true but compilation failed: why (served eagerly)"
    )
    compile_ms: float | None = Field(
        default=None,
        description="compile = true: what compiling and warming up took at load, per worker "
        "(what the compiled calls must win back; a new input shape may compile again)",
    )
    verification: dict[str, Any] | None = Field(
        default=None,
        description="the device check at load: the probe's max_abs_diff, max_rel_diff, "
        "tolerance, reference (cpu-float64), ok, served (device/dtype) and method",
    )
    predictor: dict[str, Any] | None = Field(
        default=None,
        description="remote models: the predictor called (protocol, name, URL) and how it "
        "answered lately: healthy (no failure since its last success), failures_in_a_row, "
        "last_ok_at, last_error, last_error_at (Unix seconds)",
    )
    remote: dict[str, Any] | None = Field(
        default=None,
        description="remote models: the predictor's url, healthy (null before the first call, "
        "then whether the last call succeeded) and last_error",
    )
    precision: dict[str, Any] | None = Field(
        default=None,
        description="the default of attribution requests' precision (default: models.toml "
        'precision, else the dtype the model is served in); for "auto", the probe at load: '
        "per precision tried its worst example's rel_l2 from float32, ok (within tolerance) "
        "and speedup (probe; empty otherwise), and what it kept and why (chosen)",
    )
    not_ready_reason: str | None = Field(
        default=None, description="why the model is refused (a failed device check)"
    )
    defaults: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="models.toml defaults: per method (as requests name it), the params a "
        'request of that method leaves out take these values (e.g. {"integrated_gradients": '
        '{"n_steps": "auto"}})',
    )
    kind: str = Field(
        default="tensor",
        description='"tensor" (tensors or texts in, one output); a Hugging Face classifier\'s '
        'task, served alike: "text_classification", "token_classification", '
        '"image_classification"; "causal_lm" (a generative language model: inputs {prompt, '
        'features, baselines}, target the answer text); or "seq2seq_lm" (an encoder-decoder, '
        "the same with the prompt its source text)",
    )
    influence: dict[str, Any] | None = Field(
        default=None,
        description="models with a models.toml [models.influence] table: their index's status "
        '("building" with progress {done, total} and its job_id, "ready" with method, n_train, '
        'bytes and built_at, or "failed" with the error); null: influence not served',
    )


class ModelList(BaseModel):
    models: list[ModelInfo]


class MethodInfoOut(BaseModel):
    name: str
    kind: str
    needs_hooks: bool
    returns_delta: bool
    stochastic: bool
    description: str
    params: dict[str, Any] = Field(description="JSON schema of the method's parameters")


class MethodList(BaseModel):
    methods: list[MethodInfoOut]


class WorkerStatus(BaseModel):
    index: int
    group: str = Field(description="the worker group it belongs to")
    pid: int | None
    state: str = Field(description="starting | ready | busy | dead (restarting) | failed")
    restarts: int
    last_restart_reason: str | None = Field(
        default=None, description="why the worker was last restarted (e.g. no heartbeat)"
    )


class Health(BaseModel):
    status: str
    ready: bool | None = Field(default=None, description="/ready only: the status as a bool")
    workers: list[WorkerStatus] = Field(default_factory=list)
    models: dict[str, ModelState] | None = Field(
        default=None, description="/ready only: each model's state, why, and its group"
    )


class ProblemItem(BaseModel):
    """One field at fault."""

    loc: list[str | int] = Field(description='where, e.g. ["body", "params", "n_steps"]')
    msg: str
    type: str | None = None


class Problem(BaseModel):
    """RFC 9457 problem details (application/problem+json)."""

    type: str = Field(description="a URI naming the kind of problem")
    title: str
    status: int
    detail: str
    errors: list[ProblemItem] = Field(
        default_factory=list, description="the fields at fault, where there are any"
    )
    instance: str | None = Field(default=None, description="the request path")
    request_id: str | None = Field(default=None, description="the request's X-Request-ID")


def method_list() -> MethodList:
    return MethodList(
        methods=[
            MethodInfoOut(
                name=m.name,
                kind=m.kind,
                needs_hooks=m.needs_hooks,
                returns_delta=m.returns_delta,
                stochastic=m.stochastic,
                description=m.description,
                params=m.params,
            )
            for m in methods.available()
        ]
    )
