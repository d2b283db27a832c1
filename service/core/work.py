"""What crosses the process boundary: jobs, batches and replies, as plain picklable data."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: a resolved target as plain data (``service.wire.targets``): None, or a dict with a "kind"
WireTarget = dict[str, Any] | None
#: a new job id (unique in the server process)
new_id = itertools.count(1).__next__
#: ``Job.method`` of a prediction: the model's outputs for the inputs, no attribution
PREDICT = "predict"
#: ``Job.method`` of a TCAV query (``Job.study`` says which concepts, layers, caches)
TCAV = "tcav"
#: ``Job.method`` of a chunk of an influence index build, and of an influence query
INFLUENCE_INDEX = "influence_index"
INFLUENCE = "influence"
#: ``Job.method`` of an attack and of a counterfactual search (``Job.study``: which, params)
ATTACK = "attack"
COUNTERFACTUAL = "counterfactual"
#: the methods that are not the engine's attribution methods
STUDIES = (TCAV, INFLUENCE_INDEX, INFLUENCE, ATTACK, COUNTERFACTUAL)


@dataclass
class Job:
    """One validated request, ready for the engine (arrays stay numpy until the worker)."""

    id: int
    model_id: str
    method: str  # the method the engine runs
    arrays: tuple[np.ndarray, ...]
    #: raw texts (or pairs of texts) for the model's tokenizer
    texts: tuple[str | tuple[str, str], ...]
    target: WireTarget
    baselines: Any
    params: dict[str, Any]
    internal_batch_size: int | str | None
    perturbations_per_eval: int | str | None
    noise_tunnel: dict[str, Any] | None
    seed: int | None
    return_delta: bool
    deadline: float  # time.time() after which the work is abandoned
    n: int
    cost: int
    #: the method the request named (``method`` is what the engine runs: a token model's
    #: gradient method is rewritten onto its embedding layer); None: the same
    requested: str | None = None
    #: token models: the embedding layer a rewritten gradient method attributes to (summed)
    attributed_layer: str | None = None
    #: saliency rewritten onto a layer: take the absolute value before summing
    post_abs: bool = False
    #: requests with equal keys may be merged into one engine call; None: never merged
    key: tuple[Any, ...] | None = None
    #: the HTTP request's X-Request-ID, for the worker's log lines
    request_id: str = ""
    #: token models: the most tokens a text may have
    max_tokens: int | None = None
    #: also return the model's whole output per example (KServe/OIP explain; always on PREDICT)
    predictions: bool = False
    #: a chunk of an attribution job: runs when no synchronous request waits (or when jobs are
    #: owed their share of worker time), never merged, preempted by synchronous work
    background: bool = False
    #: causal LMs: the prompt, features, baselines, skip_tokens, target text and gen_args of
    #: an ``attribute_generation`` call (``service.kinds.causal_lm``); None otherwise
    generation: dict[str, Any] | None = None
    #: also compare with the model's float64 CPU copy (never merged)
    verify: bool = False
    #: images sent encoded: each file's bytes, which pictures draw over (``arrays`` holds their
    #: ``pixel_values``); kept by the server, never sent to a worker or stored with a job
    images: tuple[bytes, ...] = ()
    #: concept and influence queries: what the worker studies beyond the inputs (plain data:
    #: the sets' files and digests, layers, settings, the cache directory)
    study: dict[str, Any] | None = None
    #: explanation metrics to compute after the attributions (``methods.evaluation.
    #: parse_metrics``' form: every metric asked for with all its parameters); None: none
    metrics: dict[str, dict[str, Any]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "images": ()}


def study_job(
    model_id: str,
    method: str,
    arrays: tuple[np.ndarray, ...],
    study: dict[str, Any] | None = None,
    *,
    texts: tuple[str | tuple[str, str], ...] = (),
    deadline: float = 0.0,
    cost: int = 1,
    seed: int | None = None,
    max_tokens: int | None = None,
    request_id: str = "",
) -> Job:
    """A job with no attribution parameters (a prediction, or one of the ``STUDIES``): its
    inputs, and what the worker studies beyond them."""
    n = len(texts) if texts else int(arrays[0].shape[0])
    return Job(
        id=new_id(),
        model_id=model_id,
        method=method,
        arrays=arrays,
        texts=texts,
        target=None,
        baselines=None,
        params={},
        internal_batch_size=None,
        perturbations_per_eval=None,
        noise_tunnel=None,
        seed=seed,
        return_delta=False,
        deadline=deadline,
        n=n,
        cost=cost,
        max_tokens=max_tokens,
        request_id=request_id,
        study=study,
    )


@dataclass
class Batch:
    id: int
    jobs: list[Job]
    #: torch intra-op threads to compute on (``service.pool.cores``)
    threads: int = 1


@dataclass
class Reply:
    """A job's answer; ``error`` is ``ServiceError.to_data()`` when it failed."""

    job_id: int
    attributions: list[np.ndarray] = field(default_factory=list)
    as_tuple: bool = False
    #: a list of layers was attributed: how many of ``attributions`` each layer has, in order
    #: (``delta`` is then (N, layers))
    layers: list[int] | None = None
    delta: np.ndarray | None = None
    outputs: np.ndarray | None = None
    target: list[Any] | None = None
    tokens: list[list[str]] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    #: the model's whole output per example, when the job asked for it
    predictions: np.ndarray | None = None
    compute_ms: float = 0.0
    merged: int = 1
    error: dict[str, Any] | None = None
    #: causal LMs: input_tokens, output_tokens, seq_attr, token_attr (plain lists)
    generation: dict[str, Any] | None = None
    #: ``Job.verify``: ``methods.verify``'s figures (``Verification.as_dict``)
    verification: dict[str, Any] | None = None
    #: a study's answer as plain data (TCAV's score rows, influence's indices and scores)
    study: dict[str, Any] | None = None
    #: the metrics asked for (``Job.metrics``): numpy arrays, curves as {"auc", "curve"}
    metrics: dict[str, Any] | None = None
    #: of ``compute_ms``, the metrics' part
    metrics_ms: float = 0.0
