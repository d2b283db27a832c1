"""The chunking helpers: folded results, and caches that stay bounded."""

from __future__ import annotations

import torch
from torch import nn

from methods.engine import batching, masks, quadrature
from methods.engine.batching import measured_once, run_chunks


def test_reduce_equals_summing_the_list_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(37, 5, dtype=torch.float32, generator=g)

    def chunk(s: int, e: int) -> torch.Tensor:
        return rows[s:e].sum(0)

    parts, used = run_chunks(37, 4, chunk, retry_oom=False)
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    folded, used2 = run_chunks(37, 4, chunk, retry_oom=False, reduce=lambda a, b: a + b)
    assert used == used2 == 4
    assert torch.equal(total, folded)


def test_reduce_survives_an_out_of_memory_retry() -> None:
    seen: list[tuple[int, int]] = []

    def chunk(s: int, e: int) -> int:
        if e - s > 2:
            raise torch.OutOfMemoryError("too big")
        seen.append((s, e))
        return e - s

    total, used = run_chunks(9, 8, chunk, retry_oom=True, reduce=lambda a, b: a + b)
    assert (total, used) == (9, 2)
    assert seen == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 9)]


def test_measurements_per_model_are_bounded() -> None:
    model = nn.Linear(2, 2)
    n = batching.MEASURED_PER_MODEL
    for key in range(n + 10):
        assert measured_once(model, key, lambda: 7)() == 7
    kept = batching._MEASURED[model]
    assert len(kept) == n
    assert 0 not in kept and n + 9 in kept  # the oldest went first
    calls: list[int] = []

    def measure() -> int:
        calls.append(1)
        return 0

    assert measured_once(model, n + 9, measure)() == 7  # still cached
    assert calls == []


def test_engine_caches_are_bounded_by_count() -> None:
    assert quadrature.rule.cache_info().maxsize == quadrature.RULE_CACHE_SIZE
    assert quadrature.rule_tensors.cache_info().maxsize == quadrature.RULE_CACHE_SIZE
    for i in range(masks.CACHE_SIZE + 5):
        masks.format_feature_mask(None, (torch.zeros(1, i + 1),), "feature_ablation")
    assert len(masks._default_masks) <= masks.CACHE_SIZE


def test_examples_of_other_sizes_are_scaled_not_measured_again() -> None:
    """Texts of every length are one family: one measuring pass, then each length's bytes
    scaled from it, linearly down and quadratically up (never smaller than a linear guess)."""
    owner = nn.Linear(2, 2)
    measured: list[int] = []

    def measure(nbytes: int) -> int:
        measured.append(nbytes)
        return nbytes

    fam = ("layer_integrated_gradients", 2)
    assert measured_once(owner, ("len", 20), lambda: measure(1000), (fam, 20))() == 1000
    assert measured_once(owner, ("len", 10), lambda: measure(7), (fam, 10))() == 500
    assert measured_once(owner, ("len", 40), lambda: measure(7), (fam, 40))() == 4000
    assert measured_once(owner, ("len", 20), lambda: measure(7), (fam, 20))() == 1000
    assert measured == [1000]  # one pass for the family
    assert measured_once(owner, ("len", 100), lambda: measure(6000), (fam, 100))() == 6000
    assert measured == [1000, 6000]  # 5x the reference: measured, and the new reference
    assert measured_once(owner, ("len", 50), lambda: measure(7), (fam, 50))() == 3000
    other = ("integrated_gradients", 2)
    assert measured_once(owner, ("img", 1), lambda: measure(9), (other, 5))() == 9
    assert measured == [1000, 6000, 9]  # another family measures its own


class _Tanhs(nn.Module):
    """``depth`` tanh steps, no parameters: autograd saves every step's output (``depth``
    rows' worth of activations) while any one step works on one."""

    def __init__(self, depth: int = 40) -> None:
        super().__init__()
        self.depth = depth

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.depth):
            x = torch.tanh(x) * 1.01
        return x[:, :4]


def test_cpu_perturbation_chunks_follow_the_largest_activation_not_their_sum() -> None:
    """On a CPU, ``"auto"`` perturbations per forward keep the working set (twice the
    largest activation) in the caches, under the memory budget (what every activation
    costs). Counting every activation for both gave real models one perturbation a forward
    (BERT-base on 32-token embeddings: 2x slower per row)."""
    import methods
    from methods.engine.batching import CPU_CHUNK_BYTES

    width = 1 << 17  # 512 KiB a row; the 40 saved outputs: 20 MiB, over CPU_CHUNK_BYTES
    x = torch.randn(1, width)
    mask = (torch.arange(width) * 64 // width).unsqueeze(0)  # 64 features
    res = methods.attribute(_Tanhs(), x, "feature_ablation", target=0, feature_mask=mask,
                            perturbations_per_eval="auto")  # fmt: skip
    assert res.params["perturbations_per_eval"] == CPU_CHUNK_BYTES // (2 * 4 * width)  # 4
    # the memory budget still binds: 3x the saved bytes of a perturbation must fit
    batching.set_memory_budget(3 * 40 * 4 * width * 2)
    try:
        res = methods.attribute(_Tanhs(), x + 1, "feature_ablation", target=0,
                                feature_mask=mask, perturbations_per_eval="auto")  # fmt: skip
    finally:
        batching.set_memory_budget(None)
    assert res.params["perturbations_per_eval"] <= 2


def test_cpu_gradient_chunks_keep_the_working_set_in_the_caches() -> None:
    """Integrated gradients' ``"auto"`` rows per pass on a CPU: the memory budget holds 682
    rows of this model, the caches 16 (twice a row's largest activation: 256 KiB); the
    benchmarks' 3x64x64 CNN ran 2.2x faster per row at 32 rows than at the budget's 416."""
    import methods
    from methods.engine.batching import CPU_CHUNK_BYTES

    width = 1 << 15  # 128 KiB a row
    x = torch.randn(1, width)
    res = methods.attribute(_Tanhs(depth=2), x, "integrated_gradients", target=0, n_steps=200,
                            internal_batch_size="auto")  # fmt: skip
    assert res.params["internal_batch_size"] == CPU_CHUNK_BYTES // (2 * 4 * width)  # 16
    ref = methods.attribute(_Tanhs(depth=2), x, "integrated_gradients", target=0, n_steps=200)
    torch.testing.assert_close(res.attributions, ref.attributions)


def test_at_most_caps_auto_chunks_only() -> None:
    """``at_most`` caps an "auto" chunk within its block (a path still takes one step of every
    example); an explicit internal_batch_size and the code after the block are the caller's."""

    def per_row() -> int:
        return 1000

    auto = batching.rows_per_chunk("auto", 600, per_row, granule=3)
    assert auto == 600
    with batching.at_most(50):
        assert batching.rows_per_chunk("auto", 600, per_row, granule=3) == 48
        assert batching.rows_per_chunk("auto", 600, per_row, granule=64) == 50
        assert batching.rows_per_chunk(200, 600, per_row, granule=3) == 198
    assert batching.rows_per_chunk("auto", 600, per_row, granule=3) == auto


def test_a_measured_only_forward_lets_go_of_what_it_saves() -> None:
    """Perturbation methods measure a forward's bytes with grad enabled but never run its
    backward: with ``keep=False`` the saved activations are counted and freed as the forward
    goes (its peak that of a no-grad forward: ViT-B/16 23 MiB of RSS instead of 148), and the
    count is the same."""
    import weakref

    refs: list[weakref.ref[torch.Tensor]] = []

    def forward(x: torch.Tensor) -> torch.Tensor:
        for _ in range(5):
            r = torch.tanh(x)  # tanh saves its output for backward
            refs.append(weakref.ref(r))
            x = r * 1.01
            del r
        return x

    counts = {}
    for keep in (True, False):
        refs.clear()
        leaf = torch.randn(3, 1000, requires_grad=True)
        out, saved = batching.count_saved_bytes(lambda x=leaf: forward(x), keep=keep)
        counts[keep] = (saved.nbytes, saved.working // 2)  # the total, the largest tensor
        alive = sum(r() is not None for r in refs)
        assert alive == (5 if keep else 0), (keep, alive)
        del out
    assert counts[True] == counts[False] == (5 * 3 * 1000 * 4, 3 * 1000 * 4)


def test_a_forward_that_differentiates_inside_itself_is_measured_keeping_what_it_saves() -> None:
    """A force field's forward returns -dE/dx, a backward inside the forward: letting go of
    what it saves would break it, so it is measured again keeping them (and the perturbation
    methods work on it as they did)."""
    import methods

    def forces(x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            x = x if x.requires_grad else x.detach().requires_grad_(True)
            energy = (torch.tanh(x) ** 2).sum()
            (grad,) = torch.autograd.grad(energy, x, create_graph=True)
        return -grad

    x = torch.randn(2, 5)
    kept = batching.count_saved_bytes(lambda: forces(x.clone().requires_grad_(True)))
    let_go = batching.count_saved_bytes(lambda: forces(x.clone().requires_grad_(True)), keep=False)
    assert kept[1] == let_go[1] and kept[1].nbytes > 0
    res = methods.attribute(forces, x, "feature_ablation", target=0)
    with torch.no_grad():
        want = torch.stack([forces(x)[:, 0] - forces(x.index_fill(1, torch.tensor([j]), 0))[:, 0]
                            for j in range(5)], dim=1)  # fmt: skip
    torch.testing.assert_close(res.attributions, want)


class _CountsBackwards(torch.autograd.Function):
    calls = 0

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
        _CountsBackwards.calls += 1
        return g


class _Counted(nn.Module):
    """Counts the backwards run through its output."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _CountsBackwards.apply(self.inner(x))


def test_a_rows_cost_is_measured_without_its_backward() -> None:
    """The measuring run of "auto" ends where the engine's backward would start: one backward
    per chunk and none for the measure, the same attributions, the same bytes counted as with
    the backward; a backward the engine does not announce (the caller's own) still runs."""
    import methods
    from methods.engine.gradients import grad_of_sum

    model, x = _Counted(), torch.randn(2, 64)
    for method, kw in [("integrated_gradients", {}), ("layer_integrated_gradients",
                                                    {"layer": "inner.0"})]:  # fmt: skip
        _CountsBackwards.calls = 0
        res = methods.attribute(model, x, method, target=0, n_steps=12, internal_batch_size="auto",
                                **kw)  # fmt: skip
        chunks = -(-12 * 2 // res.params["internal_batch_size"])
        assert _CountsBackwards.calls == chunks, method
        ref = methods.attribute(model, x, method, target=0, n_steps=12, **kw)
        torch.testing.assert_close(res.attributions, ref.attributions)

    def announced() -> None:
        leaf = x.clone().requires_grad_(True)
        grad_of_sum(model(leaf)[:, 0], (leaf,))

    def own() -> None:
        leaf = x.clone().requires_grad_(True)
        torch.autograd.grad(model(leaf)[:, 0].sum(), leaf)

    _CountsBackwards.calls = 0
    full = batching.count_saved_bytes(announced)[1]
    assert _CountsBackwards.calls == 1
    assert batching.row_bytes_estimate(announced, 1).nbytes == full.nbytes
    assert _CountsBackwards.calls == 1
    assert batching.row_bytes_estimate(own, 1).nbytes == full.nbytes
    assert _CountsBackwards.calls > 1  # run again keeping what it saves, as before


def test_a_backward_inside_the_model_runs_while_a_row_is_measured() -> None:
    """A model that attributes inside its forward (through the engine) is not cut short by the
    measure of the call around it: that backward is the model's own."""
    import methods

    inner = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))

    def model(x: torch.Tensor) -> torch.Tensor:
        sal = methods.attribute(inner, x.detach(), "saliency", target=0).attributions
        return inner(x) + sal.sum(1, keepdim=True)

    x = torch.randn(3, 8)
    res = methods.attribute(model, x, "integrated_gradients", target=1, n_steps=6,
                            internal_batch_size="auto")  # fmt: skip
    ref = methods.attribute(model, x, "integrated_gradients", target=1, n_steps=6)
    torch.testing.assert_close(res.attributions, ref.attributions)
