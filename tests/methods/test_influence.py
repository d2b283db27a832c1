"""methods.data_influence: parity with Captum 0.9.0's TracIn and similarity influence."""

from __future__ import annotations

import copy
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from captum.influence import (
    SimilarityInfluence,
    TracInCP,
    TracInCPFast,
    TracInCPFastRandProj,
)
from captum.influence._core.similarity_influence import cosine_similarity, euclidean_distance
from captum.influence._utils.nearest_neighbors import NearestNeighbors
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from methods.data_influence import (
    InfluenceIndex,
    build_index,
    index_self_influence,
    influence,
    query,
    self_influence,
)
from methods.errors import InvalidArgumentError, InvalidTypeError, UnsupportedModelError

F64 = torch.float64
LRS = [0.5, 1.0, 0.25]
N_TRAIN, N_TEST = 10, 4


class TwoInputs(nn.Module):
    """A conv branch and a linear branch, joined by a final linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.side = nn.Linear(3, 4)
        self.head = nn.Linear(2 * 9 + 4, 3)

    def forward(self, image: Tensor, extra: Tensor) -> Tensor:
        a = torch.relu(self.conv(image)).flatten(1)
        return self.head(torch.cat([a, torch.tanh(self.side(extra))], dim=1))


class NoVmap(nn.Module):
    """An MLP whose forward reads a Python number (``.item()``), which vmap cannot batch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(5, 8), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        scale = 1.0 if float(x.abs().max()) < 1e9 else 0.0
        return self.fc2(torch.relu(self.fc1(x))) * scale


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))


class Case:
    """A model, its checkpoints saved in ``tmp``, and train / test data."""

    def __init__(self, make: Any, tmp: Path, xs: tuple[Tensor, ...], targets: str) -> None:
        torch.manual_seed(1)
        self.make = make
        self.paths, self.states = [], []
        for i in range(len(LRS)):
            torch.manual_seed(10 + i)
            m = make().double()
            path = tmp / f"checkpoint-{i}.pt"
            torch.save(m.state_dict(), path)
            self.paths.append(str(path))
            self.states.append(m.state_dict())
        self.lr_of = dict(zip(self.paths, LRS, strict=True))
        torch.manual_seed(2)
        self.model = make().double()
        self.train = tuple(x[:N_TRAIN] for x in xs)
        self.test = tuple(x[N_TRAIN:] for x in xs)
        n = N_TRAIN + N_TEST
        labels = torch.randint(0, 3, (n,)) if targets == "class" else torch.randn(n, 3, dtype=F64)
        self.train_y, self.test_y = labels[:N_TRAIN], labels[N_TRAIN:]
        self.ours = [{"weights": p, "lr": lr} for p, lr in zip(self.paths, LRS, strict=True)]

    def load(self, model: nn.Module, path: str) -> float:
        model.load_state_dict(torch.load(path))
        return self.lr_of[path]

    def dataset(self) -> TensorDataset:
        return TensorDataset(*self.train, self.train_y)

    def captum_model(self) -> nn.Module:
        return copy.deepcopy(self.model)


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Case:
    torch.manual_seed(0)
    x = torch.randn(N_TRAIN + N_TEST, 5, dtype=F64)
    return Case(mlp, tmp_path_factory.mktemp("mlp"), (x,), "class")


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Case:
    torch.manual_seed(0)
    n = N_TRAIN + N_TEST
    xs = (torch.randn(n, 1, 5, 5, dtype=F64), torch.randn(n, 3, dtype=F64))
    return Case(TwoInputs, tmp_path_factory.mktemp("two"), xs, "class")


@pytest.fixture(scope="module")
def regression(tmp_path_factory: pytest.TempPathFactory) -> Case:
    torch.manual_seed(0)
    x = torch.randn(N_TRAIN + N_TEST, 5, dtype=F64)
    return Case(mlp, tmp_path_factory.mktemp("reg"), (x,), "regression")


def close(a: Tensor, b: Tensor) -> None:
    torch.testing.assert_close(a, b.to(a.dtype), rtol=1e-10, atol=1e-12)


def snapshot(model: nn.Module) -> tuple[dict[str, Tensor], bool, list[bool]]:
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return state, model.training, [p.requires_grad for p in model.parameters()]


def assert_untouched(model: nn.Module, before: tuple[dict[str, Tensor], bool, list[bool]]) -> None:
    state, training, flags = before
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert model.training == training
    assert [p.requires_grad for p in model.parameters()] == flags
    for m in model.modules():
        assert not m._forward_hooks and not m._backward_hooks and not m._forward_pre_hooks
        assert all(p.grad is None for p in m.parameters(recurse=False))


class ExactNN(NearestNeighbors):
    """Exact dot-product neighbours (Captum's default needs annoy)."""

    def setup(self, data: Tensor) -> None:
        self.data = data.view(len(data), -1)

    def get_nearest_neighbors(self, query: Tensor, k: int) -> tuple[Tensor, Tensor]:
        values, indices = torch.topk(query.view(len(query), -1) @ self.data.T, k, dim=1)
        return indices, values


# --- TracInCP ---------------------------------------------------------------------------


@pytest.mark.parametrize("sample_wise", [False, True])
def test_tracin_cp_matches_captum(case: Case, sample_wise: bool) -> None:
    reduction = "sum" if sample_wise else "none"
    ref = TracInCP(
        case.captum_model(),
        case.dataset(),
        case.paths,
        checkpoints_load_func=case.load,
        loss_fn=nn.CrossEntropyLoss(reduction=reduction),
        batch_size=4,
        sample_wise_grads_per_batch=sample_wise,
    )
    expected = ref.influence((*case.test, case.test_y))
    before = snapshot(case.model)
    got = influence(
        case.model, case.train, case.train_y, case.test, case.test_y, checkpoints=case.ours
    )
    assert got.indices is None and got.scores.shape == (N_TEST, N_TRAIN)
    close(got.scores, expected)
    assert_untouched(case.model, before)
    close(
        self_influence(case.model, case.train, case.train_y, checkpoints=case.ours),
        ref.self_influence(),
    )


def test_tracin_cp_mean_reduction_and_layers(case: Case) -> None:
    ref = TracInCP(
        case.captum_model(),
        case.dataset(),
        case.paths,
        checkpoints_load_func=case.load,
        layers=["2"],
        loss_fn=nn.CrossEntropyLoss(reduction="mean"),
        batch_size=3,
        sample_wise_grads_per_batch=True,
    )
    kw: dict[str, Any] = {"checkpoints": case.ours, "layers": ["2"], "batch_size": 4}
    got = influence(case.model, case.train, case.train_y, case.test, case.test_y, **kw)
    close(got.scores, ref.influence((*case.test, case.test_y)))
    close(self_influence(case.model, case.train, case.train_y, **kw), ref.self_influence())
    for proponents in (True, False):
        want = ref.influence((*case.test, case.test_y), k=3, proponents=proponents)
        top = influence(
            case.model,
            case.train,
            case.train_y,
            case.test,
            case.test_y,
            k=3,
            proponents=proponents,
            **kw,
        )
        assert top.indices is not None
        assert torch.equal(top.indices, want.indices)
        close(top.scores, want.influence_scores)


def test_tracin_cp_two_inputs_with_a_conv(two: Case) -> None:
    ref = TracInCP(
        two.captum_model(),
        two.dataset(),
        two.paths,
        checkpoints_load_func=two.load,
        loss_fn=nn.CrossEntropyLoss(reduction="sum"),
        batch_size=4,
        sample_wise_grads_per_batch=True,
    )
    got = influence(
        two.model, two.train, two.train_y, two.test, two.test_y, checkpoints=two.ours, batch_size=3
    )
    close(got.scores, ref.influence((*two.test, two.test_y)))
    close(
        self_influence(two.model, two.train, two.train_y, checkpoints=two.ours),
        ref.self_influence(),
    )


def test_tracin_cp_mse(regression: Case) -> None:
    c = regression
    ref = TracInCP(
        c.captum_model(),
        c.dataset(),
        c.paths,
        checkpoints_load_func=c.load,
        loss_fn=nn.MSELoss(reduction="none"),
        batch_size=5,
    )
    got = influence(c.model, c.train, c.train_y, c.test, c.test_y, checkpoints=c.ours, loss="mse")
    close(got.scores, ref.influence((*c.test, c.test_y)))
    # Captum's "mean" divides each example's squared error by its 3 elements, on both sides
    mean = TracInCP(
        c.captum_model(),
        c.dataset(),
        c.paths,
        checkpoints_load_func=c.load,
        loss_fn=nn.MSELoss(reduction="mean"),
        batch_size=5,
        sample_wise_grads_per_batch=True,
    )
    close(got.scores / 9, mean.influence((*c.test, c.test_y)))


@pytest.mark.parametrize("loss", ["nll", "bce_with_logits"])
def test_other_losses(case: Case, loss: str) -> None:
    if loss == "nll":
        fn: nn.Module = nn.NLLLoss(reduction="sum")
        ty, yy = case.train_y, case.test_y
    else:
        fn = nn.BCEWithLogitsLoss(reduction="sum")
        targets = torch.rand(N_TRAIN + N_TEST, 3, dtype=F64)
        ty, yy = targets[:N_TRAIN], targets[N_TRAIN:]
    data = TensorDataset(*case.train, ty)
    for cls in (TracInCP, TracInCPFast):
        extra: dict[str, Any] = {"sample_wise_grads_per_batch": True} if cls is TracInCP else {}
        args = (data, case.paths) if cls is TracInCP else ("2", data, case.paths)
        ref = cls(
            case.captum_model(),
            *args,
            checkpoints_load_func=case.load,
            loss_fn=fn,
            batch_size=4,
            **extra,
        )
        method = "tracin_cp" if cls is TracInCP else "tracin_cp_fast"
        got = influence(
            case.model,
            case.train,
            ty,
            case.test,
            yy,
            checkpoints=case.ours,
            loss=loss,
            method=method,
        )
        close(got.scores, ref.influence((*case.test, yy)))


def test_vmap_fallback_loop_matches_captum(tmp_path: Path) -> None:
    torch.manual_seed(0)
    c = Case(NoVmap, tmp_path, (torch.randn(N_TRAIN + N_TEST, 5, dtype=F64),), "class")
    ref = TracInCP(
        c.captum_model(),
        c.dataset(),
        c.paths,
        checkpoints_load_func=c.load,
        loss_fn=nn.CrossEntropyLoss(reduction="none"),
        batch_size=4,
    )
    got = influence(c.model, c.train, c.train_y, c.test, c.test_y, checkpoints=c.ours)
    close(got.scores, ref.influence((*c.test, c.test_y)))


# --- TracInCPFast and random projections ---------------------------------------------------


@pytest.mark.parametrize("layers", [None, "2"])
def test_tracin_cp_fast_matches_captum(case: Case, layers: str | None) -> None:
    ref = TracInCPFast(
        case.captum_model(),
        "2",
        case.dataset(),
        case.paths,
        checkpoints_load_func=case.load,
        loss_fn=nn.CrossEntropyLoss(reduction="sum"),
        batch_size=4,
    )
    kw: dict[str, Any] = {"method": "tracin_cp_fast", "checkpoints": case.ours, "layers": layers}
    before = snapshot(case.model)
    got = influence(
        case.model, case.train, case.train_y, case.test, case.test_y, batch_size=3, **kw
    )
    close(got.scores, ref.influence((*case.test, case.test_y)))
    close(self_influence(case.model, case.train, case.train_y, **kw), ref.self_influence())
    for proponents in (True, False):
        want = ref.influence((*case.test, case.test_y), k=4, proponents=proponents)
        top = influence(
            case.model,
            case.train,
            case.train_y,
            case.test,
            case.test_y,
            k=4,
            proponents=proponents,
            **kw,
        )
        assert top.indices is not None and torch.equal(top.indices, want.indices)
        close(top.scores, want.influence_scores)
    assert_untouched(case.model, before)


@pytest.mark.parametrize("projection_dim", [None, 4, 9, 100])
def test_rand_proj_matches_captum(case: Case, projection_dim: int | None) -> None:
    state = torch.random.get_rng_state()
    ref = TracInCPFastRandProj(
        case.captum_model(),
        "2",
        case.dataset(),
        case.paths,
        checkpoints_load_func=case.load,
        loss_fn=nn.CrossEntropyLoss(reduction="sum"),
        batch_size=4,
        nearest_neighbors=ExactNN(),
        projection_dim=projection_dim,
        seed=7,
    )
    torch.random.set_rng_state(state)
    kw: dict[str, Any] = {
        "method": "tracin_cp_fast_rand_proj",
        "checkpoints": case.ours,
        "projection_dim": projection_dim,
        "seed": 7,
    }
    got = influence(case.model, case.train, case.train_y, case.test, case.test_y, **kw)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global generator untouched
    close(got.scores, ref.influence((*case.test, case.test_y), k=None))
    for proponents in (True, False):
        want = ref.influence((*case.test, case.test_y), k=3, proponents=proponents)
        top = influence(
            case.model,
            case.train,
            case.train_y,
            case.test,
            case.test_y,
            k=3,
            proponents=proponents,
            **kw,
        )
        assert top.indices is not None and torch.equal(top.indices, want.indices)
        close(top.scores, want.influence_scores)
    index = build_index(case.model, case.train, case.train_y, **kw)
    assert index.embeddings is not None
    width = 3 * 8 if projection_dim in (None, 100) else 4 if projection_dim == 4 else 9
    assert index.embeddings.shape == (N_TRAIN, width * len(LRS))
    close(index.embeddings, ref.src_intermediate_quantities)
    with pytest.raises(InvalidArgumentError) as err:
        self_influence(
            case.model,
            case.train,
            case.train_y,
            method="tracin_cp_fast_rand_proj",
            checkpoints=case.ours,
        )
    assert err.value.argument == "method"
    with pytest.raises(InvalidArgumentError):
        index_self_influence(index)


# --- similarity -------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_similarity_matches_captum(case: Case, metric: str, tmp_path: Path) -> None:
    data = TensorDataset(*case.train)
    for proponents in (True, False):
        direction = "max" if (metric == "cosine") == proponents else "min"
        # Captum 0.9.0 fails on a single layer (its LayerActivation returns a list that it
        # wraps in another list), so it is asked for two and "1" is compared.
        ref = SimilarityInfluence(
            case.captum_model(),
            ["1", "2"],
            data,
            str(tmp_path / f"{metric}-{proponents}"),
            similarity_metric=cosine_similarity if metric == "cosine" else euclidean_distance,
            similarity_direction=direction,
            batch_size=5,
        )
        for k in (3, N_TRAIN):
            want_idx, want_val = ref.influence(case.test[0], top_k=k)["1"]
            got = influence(
                case.model,
                case.train,
                None,
                case.test,
                None,
                method="similarity",
                layers="1",
                similarity=metric,
                k=k,
                proponents=proponents,
                batch_size=3,
            )
            assert got.indices is not None and torch.equal(got.indices, want_idx)
            close(got.scores, want_val)
        full = influence(
            case.model,
            case.train,
            case.train_y,
            case.test,
            case.test_y,
            method="similarity",
            layers=["1"],
            similarity=metric,
            proponents=proponents,
        )
        want_full = torch.empty(N_TEST, N_TRAIN, dtype=F64).scatter_(1, want_idx, want_val)
        close(full.scores, want_full)
    with pytest.raises(InvalidArgumentError):
        self_influence(case.model, case.train, case.train_y, method="similarity")


# --- index ----------------------------------------------------------------------------------


METHOD_KW: list[dict[str, Any]] = [
    {"method": "tracin_cp"},
    {"method": "tracin_cp", "layers": ["0", "2"]},
    {"method": "tracin_cp_fast"},
    {"method": "tracin_cp_fast_rand_proj", "projection_dim": 4, "seed": 3},
    {"method": "similarity", "layers": "1", "similarity": "euclidean"},
]


@pytest.mark.parametrize("kw", METHOD_KW, ids=lambda kw: str(list(kw.values())))
def test_index_query_equals_influence(case: Case, kw: dict[str, Any], tmp_path: Path) -> None:
    cps = None if kw["method"] == "similarity" else case.ours
    seen: list[tuple[int, int]] = []
    before = snapshot(case.model)
    index = build_index(
        case.model,
        case.train,
        case.train_y,
        checkpoints=cps,
        batch_size=3,
        progress=lambda done, total: seen.append((done, total)),
        **kw,
    )
    chunks = 4 * (1 if cps is None else len(LRS))
    assert seen == [(i + 1, chunks) for i in range(chunks)]
    full = influence(
        case.model, case.train, case.train_y, case.test, case.test_y, checkpoints=cps, **kw
    )
    got = query(index, case.model, case.test, case.test_y, checkpoints=cps)
    close(got.scores, full.scores)
    one = influence(
        case.model,
        case.train,
        case.train_y,
        case.test,
        case.test_y,
        checkpoints=cps,
        batch_size=1,
        **kw,
    )
    torch.testing.assert_close(one.scores, full.scores, rtol=1e-12, atol=1e-14)
    top = query(index, case.model, case.test, case.test_y, checkpoints=cps, k=2, proponents=False)
    want = influence(
        case.model,
        case.train,
        case.train_y,
        case.test,
        case.test_y,
        checkpoints=cps,
        k=2,
        proponents=False,
        **kw,
    )
    assert top.indices is not None and want.indices is not None
    assert torch.equal(top.indices, want.indices)
    close(top.scores, want.scores)
    # the round trip through safetensors
    d = index.to_dict()
    path = tmp_path / "index.safetensors"
    save_file(d["tensors"], str(path), metadata={"index": json.dumps(d["metadata"])})
    with safe_open(str(path), "pt") as f:
        meta = json.loads(f.metadata()["index"])
    back = InfluenceIndex.from_dict({"tensors": load_file(str(path)), "metadata": meta})
    again = query(back, case.model, case.test, case.test_y, checkpoints=cps)
    assert torch.equal(again.scores, got.scores)
    if kw["method"] in ("tracin_cp", "tracin_cp_fast"):
        sub = {k: v for k, v in kw.items() if k in ("method", "layers")}
        close(
            index_self_influence(back),
            self_influence(case.model, case.train, case.train_y, checkpoints=cps, **sub),
        )
    assert_untouched(case.model, before)


def test_index_shapes_and_in_memory_checkpoints(case: Case) -> None:
    index = build_index(
        case.model,
        case.train,
        case.train_y,
        method="tracin_cp_fast",
        checkpoints=[{"weights": s, "lr": lr} for s, lr in zip(case.states, LRS, strict=True)],
    )
    assert [t.shape for t in index.output_grads] == [(N_TRAIN, 3)] * 3
    assert [t.shape for t in index.layer_inputs] == [(N_TRAIN, 8)] * 3
    index = build_index(case.model, case.train, case.train_y, checkpoints=case.states[:1])
    assert index.lrs == [1.0] and index.grads[0].shape == (N_TRAIN, 5 * 8 + 8 + 8 * 3 + 3)
    assert index.grads[0].dtype == F64
    # bare paths have lr 1: equal to the first checkpoint given as a dict with lr 1
    a = influence(
        case.model, case.train, case.train_y, case.test, case.test_y, checkpoints=[case.paths[0]]
    )
    b = influence(
        case.model,
        case.train,
        case.train_y,
        case.test,
        case.test_y,
        checkpoints=[{"weights": case.states[0]}],
    )
    assert torch.equal(a.scores, b.scores)
    # a query with other checkpoints than the index's is refused
    with pytest.raises(InvalidArgumentError) as err:
        query(index, case.model, case.test, case.test_y, checkpoints=case.states[1:2])
    assert err.value.argument == "checkpoints"
    with pytest.raises(InvalidArgumentError):
        query(index, case.model, case.test, case.test_y, checkpoints=case.ours)


def test_untouched_in_training_mode_with_frozen_parameter(case: Case) -> None:
    model = copy.deepcopy(case.model).train()
    model[0].bias.requires_grad_(False)
    before = snapshot(model)
    got = influence(model, case.train, case.train_y, case.test, case.test_y, checkpoints=case.ours)
    index = build_index(model, case.train, case.train_y, checkpoints=case.ours)
    assert index.param_names == ["0.weight", "2.weight", "2.bias"]
    assert got.scores.shape == (N_TEST, N_TRAIN)
    assert_untouched(model, before)


def test_concurrent_calls_share_one_model(case: Case) -> None:
    """The fast and similarity methods hook the model: each call's hook ignores the others."""
    kws: list[dict[str, Any]] = [
        {"method": "tracin_cp_fast", "checkpoints": case.ours},
        {"method": "similarity", "layers": "1"},
    ] * 4

    def run(kw: dict[str, Any]) -> Tensor:
        return influence(
            case.model, case.train, case.train_y, case.test, case.test_y, batch_size=2, **kw
        ).scores

    want = [run(kw) for kw in kws]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(run, kws))
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


# --- errors -----------------------------------------------------------------------------------


def test_typed_errors(case: Case) -> None:
    m, tr, ty, te, yy = case.model, case.train, case.train_y, case.test, case.test_y
    cps = case.ours

    def check(exc: type[Exception], argument: str, **kw: Any) -> None:
        with pytest.raises(exc) as err:
            influence(m, kw.pop("tr", tr), kw.pop("ty", ty), te, yy, **{"checkpoints": cps, **kw})
        assert getattr(err.value, "argument", None) == argument

    check(InvalidArgumentError, "method", method="tracin")
    check(InvalidArgumentError, "loss", loss="hinge")
    check(InvalidArgumentError, "checkpoints", checkpoints=None)
    check(InvalidArgumentError, "checkpoints", checkpoints=[])
    check(InvalidArgumentError, "checkpoints", checkpoints=[{"weights": case.paths[0], "lr": 0}])
    check(
        InvalidArgumentError,
        "checkpoints",
        checkpoints=[{"weights": case.paths[0], "lr": float("nan")}],
    )
    check(InvalidTypeError, "checkpoints", checkpoints=[{"weights": case.paths[0], "lr": "1"}])
    check(InvalidArgumentError, "checkpoints", checkpoints=["/nonexistent/checkpoint.pt"])
    check(InvalidArgumentError, "checkpoints", checkpoints=[{"weights": {"x": torch.ones(1)}}])
    check(InvalidArgumentError, "checkpoints", method="similarity", layers="1")
    check(InvalidArgumentError, "layers", layers=["nope"])
    check(InvalidArgumentError, "layers", layers=[])
    check(InvalidArgumentError, "layers", layers="1")  # a ReLU has no parameters
    check(InvalidArgumentError, "layers", method="tracin_cp_fast", layers="1")
    check(InvalidArgumentError, "layers", method="tracin_cp_fast", layers=["0", "2"])
    check(InvalidArgumentError, "layers", method="similarity", checkpoints=None)
    check(InvalidArgumentError, "train_labels", ty=ty[:-1])
    check(InvalidArgumentError, "train_inputs", tr=(tr[0], tr[0][:-1]))
    check(InvalidTypeError, "train_inputs", tr=[1, 2])
    check(InvalidTypeError, "train_labels", ty=[1, 2])
    check(InvalidArgumentError, "k", k=0)
    check(InvalidArgumentError, "k", k=N_TRAIN + 1)
    check(InvalidArgumentError, "k", k=True)
    check(InvalidTypeError, "proponents", k=1, proponents=1)
    check(InvalidArgumentError, "batch_size", batch_size=0)
    check(
        InvalidArgumentError, "projection_dim", method="tracin_cp_fast_rand_proj", projection_dim=0
    )
    check(
        InvalidArgumentError,
        "similarity",
        method="similarity",
        checkpoints=None,
        layers="1",
        similarity="dot",
    )
    check(InvalidArgumentError, "labels", loss="mse")  # class labels for a regression loss
    with pytest.raises(UnsupportedModelError):
        influence(lambda x: x, tr, ty, te, yy, checkpoints=cps)
    with pytest.raises(InvalidTypeError) as err:
        query("index", m, te, yy)  # type: ignore[arg-type]
    assert err.value.argument == "index"
    with pytest.raises(InvalidArgumentError) as err:
        InfluenceIndex.from_dict({"tensors": {}, "metadata": {"format": "other"}})
    assert err.value.argument == "index"


def test_an_index_built_in_chunks_joins_into_the_whole(case: Case) -> None:
    from methods.data_influence import concat

    model, ckpts, (train_x,), train_y = case.model, case.ours, case.train, case.train_y
    for method in ("tracin_cp", "tracin_cp_fast", "tracin_cp_fast_rand_proj"):
        kw: dict = {"method": method, "checkpoints": ckpts}
        if method == "tracin_cp_fast_rand_proj":
            kw["projection_dim"] = 3
        whole = build_index(model, train_x, train_y, **kw)
        parts = [
            build_index(model, train_x[s : s + 4], train_y[s : s + 4], **kw)
            for s in range(0, len(train_x), 4)
        ]
        joined = concat(parts)
        a, b = whole.to_dict(), joined.to_dict()
        assert a["metadata"] == b["metadata"]
        for k, v in a["tensors"].items():
            torch.testing.assert_close(b["tensors"][k], v, rtol=1e-12, atol=1e-14)
