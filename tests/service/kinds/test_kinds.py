"""Model kinds as plug-ins: each served spec gets its kind from one place, every kind answers
the whole interface, and the serving path is kind-blind (a kind registered by a test is
served without a branch for it anywhere else)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import pytest

import model_registry
from methods import registry
from model_registry import tasks
from model_registry.spec import ExplainSpec, ExportedStep, LoadedModel, ModelSpec, OutputSpec
from model_registry.task_loaders import finish_tensor, read_tensor
from service import kinds
from service.attributions import serving as attributions
from service.compat import kserve
from service.core.errors import InvalidRequest, ServiceError, UnsupportedMethod
from service.core.settings import Settings
from service.core.work import Attribution, Reply, new_id
from service.kinds.base import Catalogue, ModelKind, Ran, envelope, timing
from service.kinds.plan import Plan
from service.wire.attributions import AttributionRequest

BUILTIN = {s.id: s for s in model_registry.builtin_specs()}
#: one spec of each kind (an exported step on the tabular model's spec)
EXAMPLES: dict[str, ModelSpec] = {
    "tensor": BUILTIN["tabular-mlp"],
    "causal_lm": BUILTIN["tiny-lm"],
    # an encoder-decoder: as a causal LM, its prompt the source (a spec alone: no load here)
    "seq2seq_lm": dataclasses.replace(
        BUILTIN["tiny-lm"], id="t5-dir", source="hf:t5-dir", task="seq2seq_lm"
    ),
    # a question answerer: a token model of question and context pairs
    "question_answering": dataclasses.replace(
        BUILTIN["text-classifier"],
        id="squad",
        source="hf:squad",
        task="question_answering",
        output=OutputSpec(shape=(3,), labels=("start", "end", "span")),
    ),
    # a detector: scored per wanted box (a spec alone: no load here)
    "object_detection": dataclasses.replace(
        BUILTIN["tabular-mlp"],
        id="cars",
        source="python:cars:detector",
        task="object_detection",
        output=OutputSpec(shape=(), labels=("car", "person")),
    ),
    # image–text pairs (CLIP): their spec names both inputs and the processor's directory
    "image_text": dataclasses.replace(
        BUILTIN["tabular-mlp"],
        id="match",
        source="hf:clip",
        task="image_text_similarity",
        output=OutputSpec(shape=(), labels=()),
    ),
    "exported": dataclasses.replace(
        BUILTIN["tabular-mlp"],
        id="tab-ig",
        source="attribution-export:ig.pt2",
        exported=ExportedStep("integrated_gradients", params={"n_steps": 8}, target="input"),
    ),
}


def test_every_kind_has_an_example() -> None:
    assert set(EXAMPLES) == set(kinds.KINDS)


@pytest.mark.parametrize("name", sorted(kinds.KINDS))
def test_the_kind_is_chosen_once_from_the_spec(name: str) -> None:
    spec = EXAMPLES[name]
    kind = kinds.of(spec)
    assert kind is kinds.KINDS[name] and kind.name == name == tasks.task_of(spec).family
    offers = kind.describe(spec)
    assert offers == kind.catalogue(spec) and kind.catalogue(spec) is kind.catalogue(spec)
    methods = offers.methods
    assert methods and all(isinstance(m, str) for m in methods)
    ex = offers.explanation
    assert ex.method in methods
    planned = kind.check(spec, ex.method, dict(ex.params), Settings())
    # a token model's gradient method runs on its embedding layer (the plan says which)
    rewritten = planned.attributed_layer is not None
    assert planned.method.name == (f"layer_{ex.method}" if rewritten else ex.method)


@pytest.mark.parametrize("name", sorted(kinds.KINDS))
def test_predictions_only_where_the_kind_gives_them(name: str) -> None:
    spec, kind = EXAMPLES[name], kinds.KINDS[name]
    x: Any = np.zeros((1, 8), np.float32).tolist()
    fields = kind.catalogue(spec).example_fields
    if fields == ("image", "text"):
        pytest.skip(
            "an image decodes with its processor's directory: tests/service/kinds/test_tasks.py"
        )
    if fields is not None:  # examples as objects
        x = [{"question": "who", "context": "a film"}]
    if kind.catalogue(spec).predicts:
        work = kind.predict_work(Settings(), spec, x, time.time() + 1, "r")
        assert work.predictions and work.n == 1
    else:
        with pytest.raises(UnsupportedMethod) as e:
            kind.predict_work(Settings(), spec, x, time.time() + 1, "r")
        assert e.value.errors[0]["loc"] == ["path", "model_id"]


def test_explain_defaults_come_from_the_kind() -> None:
    tab, lm, ex = EXAMPLES["tensor"], EXAMPLES["causal_lm"], EXAMPLES["exported"]
    assert kserve.with_defaults({}, tab) == {
        "method": "integrated_gradients",
        "params": {},
        "target": "predicted",
    }
    assert kserve.with_defaults({}, ex)["target"] is None  # the file's baked target
    assert kserve.with_defaults({"target": 1}, lm)["target"] == 1


class Doubling(ModelKind):
    """A toy kind: ``inputs`` is a list of numbers, the "attribution" doubles them."""

    name = "doubling"

    def describe(self, spec: ModelSpec) -> Catalogue:
        return Catalogue(
            methods=["saliency"],
            explanation=ExplainSpec("saliency"),
            target=None,
            tokenizer=False,
            pictures=1,
            no_predictions="gives no predictions",
        )

    def check(
        self, spec: ModelSpec, method: str, params: dict[str, Any], settings: Settings | None
    ) -> Plan:
        if method != "saliency":
            raise UnsupportedMethod("doubling only", loc=("body", "method"))
        return Plan(registry.get(method), dict(params))

    def build_work(
        self,
        settings: Settings,
        spec: ModelSpec,
        req: AttributionRequest,
        deadline: float,
        request_id: str = "",
    ) -> Attribution:
        if not isinstance(req.inputs, list):
            raise InvalidRequest("a list of numbers", loc=("body", "inputs"))
        arr = np.asarray(req.inputs, dtype=np.float64)
        return Attribution(
            id=new_id(),
            model_id=spec.id,
            method=req.method,
            arrays=(arr,),
            texts=(),
            target=None,
            baselines=None,
            params={},
            internal_batch_size=None,
            perturbations_per_eval=None,
            noise_tunnel=None,
            seed=None,
            return_delta=False,
            deadline=deadline,
            n=len(arr),
            cost=len(arr),
        )

    def run(self, lm: LoadedModel, work: Attribution) -> Reply:
        return Reply(work_id=work.id, attributions=[work.arrays[0] * 2], target=[None] * work.n)


class OnePool:
    """The pool's interface as the serving path uses it: the job runs here, in-process."""

    def submit(self, work: Attribution) -> Any:
        import asyncio

        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        fut.set_result(Doubling().run(None, work))  # type: ignore[arg-type]
        return type("Entry", (), {"future": fut, "dispatched": time.perf_counter()})()

    def cancel(self, entry: Any) -> None:
        raise AssertionError("not cancelled")


def test_a_new_kind_is_one_module_one_entry_and_one_task(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    monkeypatch.setitem(kinds.KINDS, "doubling", Doubling())
    doubling = tasks.Task(
        "doubling", "doubling", read_tensor, finish_tensor, frozenset({"attributions"})
    )
    monkeypatch.setattr(tasks, "TASKS", {**tasks.TASKS, "doubling": doubling})
    spec = dataclasses.replace(BUILTIN["tabular-mlp"], id="twice", task="doubling")
    req = AttributionRequest.model_validate({"method": "saliency", "inputs": [1.0, 2.5]})
    body, _, _ = asyncio.run(
        attributions.attribute(Settings(), OnePool(), spec, req, None, time.perf_counter())  # type: ignore[arg-type]
    )
    assert body["attributions"].tolist() == [2.0, 5.0] and body["model_id"] == "twice"
    with pytest.raises(ServiceError, match="gives no predictions"):
        asyncio.run(
            attributions.attribute(
                Settings(),
                OnePool(),
                spec,
                req,
                None,
                time.perf_counter(),
                predictions=True,  # type: ignore[arg-type]
            )
        )


def test_the_response_envelope_is_shared() -> None:
    reply = Reply(work_id=1, attributions=[np.ones((2, 3))], target=[0, 1], params={"a": 1})
    body = envelope(
        ("m", "7"), Ran("saliency"), reply, "json", timing(1.0, 2.0, time.perf_counter())
    )
    assert body["model_id"] == "m" and body["model_version"] == "7"
    assert body["attributions"].shape == (2, 3) and body["target"] == [0, 1]
    assert set(body["timing_ms"]) == {"queue", "compute", "total"}
    assert "requested_method" not in body


@pytest.mark.parametrize(
    ("prompt", "features"),
    [
        ("{:>999999999} lives in", ["Dave"]),  # a format spec: a gigabyte of padding
        ("{0} lives in", ["Dave"]),
        ("{who!r} lives in", {"who": "Dave"}),
        ("{who.upper} lives in", {"who": "Dave"}),
        ("{where} lives in", {"who": "Dave"}),
        ("{ lives in", ["Dave"]),
    ],
)
def test_causal_lm_prompts_take_plain_slots_only(prompt: str, features: Any) -> None:
    spec = EXAMPLES["causal_lm"]
    body = {"method": "feature_ablation", "inputs": {"prompt": prompt, "features": features}}
    req = AttributionRequest.model_validate(body)
    with pytest.raises(InvalidRequest) as e:
        attributions.build_work(Settings(), spec, req, time.time() + 60)
    assert e.value.errors[0]["loc"] == ["body", "inputs", "prompt"]
    for fine, values in (("{} lives in {}", ["Dave", "Palm Coast"]), ("{who} lives", {"who": "D"})):
        ok = AttributionRequest.model_validate(
            {**body, "inputs": {"prompt": fine, "features": values}}
        )
        assert attributions.build_work(Settings(), spec, ok, time.time() + 60).n == 1


def test_token_ids_outside_the_vocabulary_are_refused_before_the_model() -> None:
    spec = BUILTIN["text-classifier"]
    lm = model_registry.load(spec)
    size = lm.model.get_submodule(spec.embedding_layer).num_embeddings
    for bad in (size, 10**6, -1):
        req = AttributionRequest.model_validate(
            {"method": "feature_ablation", "inputs": [[1, 2, bad]], "target": 0}
        )
        work = attributions.build_work(Settings(), spec, req, time.time() + 60)
        with pytest.raises(InvalidRequest) as e:
            kinds.run(lm, work)
        assert e.value.errors[0]["loc"] == ["body", "inputs"]
        assert f"token id {bad}" in e.value.detail and f"0..{size - 1}" in e.value.detail
    ok = AttributionRequest.model_validate(
        {"method": "feature_ablation", "inputs": [[1, 2, size - 1]], "target": 0}
    )
    assert (
        kinds.run(lm, attributions.build_work(Settings(), spec, ok, time.time() + 60)).error is None
    )
