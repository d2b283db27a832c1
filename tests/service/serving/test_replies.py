"""Typed results: a reply is cut to some of its examples, joined from parts and stored as arrays
by its fields' own rules (``service.core.work.Reply``), so the pool, the worker's merge and the
job store list none of them."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from service.core.work import Reply


def _reply(n: int, seed: int, width: int = 4) -> Reply:
    rng = np.random.default_rng(seed)
    return Reply(
        work_id=seed,
        attributions=[rng.random((n, width)), rng.random((n, 2))],
        as_tuple=True,
        delta=rng.random(n),
        outputs=rng.random((n, 3)),
        target=list(range(n)),
        tokens=[["a"] * width for _ in range(n)],
        params={"n_steps": 8},
        predictions=rng.random((n, width)),
        compute_ms=2.0,
        fidelity={
            "delta_ratio": list(rng.random(n)),
            "rel_l2": 0.1,
            "checked": True,
            "fallback": False,
            "topk_agreement": None,
            "tried": None,
        },
        study={
            "flipped": [bool(i % 2) for i in range(n)],
            "name": "fgsm",
            "side": {"indices": [[i] for i in range(n)]},
        },
        study_rows=["flipped", "side.indices"],
    )


def _same(a: Reply, b: Reply) -> None:
    for f in dataclasses.fields(Reply):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, list) and x and isinstance(x[0], np.ndarray):
            assert len(x) == len(y) and all(np.array_equal(p, q) for p, q in zip(x, y, strict=True))
        elif isinstance(x, np.ndarray):
            assert np.array_equal(x, y), f.name
        else:
            assert x == y, f.name


@pytest.mark.parametrize("cuts", [[0, 5], [0, 2, 5], [0, 1, 3, 5]])
def test_a_reply_cut_and_joined_is_the_reply(cuts: list[int]) -> None:
    whole = _reply(5, 1)
    parts = [whole.cut(9, a, b - a, 5) for a, b in itertools.pairwise(cuts)]
    for (a, b), part in zip(itertools.pairwise(cuts), parts, strict=True):
        assert part.target == list(range(a, b)) and part.study is not None
        assert part.study["flipped"] == whole.study["flipped"][a:b]  # type: ignore[index]
        assert part.study["side"]["indices"] == [[i] for i in range(a, b)]
        assert part.compute_ms == whole.compute_ms  # a merged call's time is shared
    joined = Reply.join(whole.work_id, parts)
    _same(joined, dataclasses.replace(whole, compute_ms=2.0 * len(parts)))


def test_a_reply_stored_as_arrays_comes_back() -> None:
    reply = _reply(3, 2)
    back = Reply.from_arrays(reply.to_arrays())
    _same(back, dataclasses.replace(reply, work_id=0))


def test_joined_token_scores_pad_and_cut_back_to_each_text() -> None:
    """Texts tokenized apart have different widths: joined, the narrower part is padded with
    zeros; a merged batch's share is cut back to its own texts' width."""
    short, wide = _reply(2, 3, width=3), _reply(2, 4, width=5)
    joined = Reply.join(0, [short, wide])
    assert joined.attributions[0].shape == (4, 5)
    assert np.array_equal(joined.attributions[0][:2, 3:], np.zeros((2, 2)))
    back = joined.cut(1, 0, 2, 4)
    assert back.attributions[0].shape == (2, 3) and back.predictions.shape == (2, 3)  # type: ignore[union-attr]


def test_chunk_files_of_earlier_versions_are_read() -> None:
    """A job stored before typed results: ``convergence_delta`` and ``per_example``."""
    reply = _reply(2, 5)
    arrays = reply.to_arrays()
    arrays["convergence_delta"] = arrays.pop("delta")
    import json

    meta = json.loads(str(arrays["meta"]))
    meta["per_example"] = meta.pop("study_rows")
    arrays["meta"] = np.array(json.dumps(meta))
    _same(Reply.from_arrays(arrays), dataclasses.replace(reply, work_id=0))
