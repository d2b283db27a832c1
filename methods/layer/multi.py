"""Several layers in one call: Captum's multi-layer form, ``layer=["encoder.0", "encoder.1"]``.

Each entry of the result is what that layer alone would give. Where the method reads the
layer without changing what the model computes (activations, the target's gradient at the
layer, LRP relevance), every layer is tapped in the same forward and backward: each tap
hands the rest of the model a leaf with the layer's value *grafted* onto the layer's own
graph, so a layer before another still gets its gradient through it. Methods that change the
model's computation at the layer (layer IG's path, ablation, conductance) run once per layer.

Captum's ``LayerIntegratedGradients`` with a list interpolates every layer at once: where the
output depends on the layers additively (branches summed, nothing non-linear after the join)
that equals each layer alone, and ours equals Captum's; where the branches meet before a
non-linearity the joint path shares their interaction and the two differ; and a layer before
another has its interpolated value overwritten downstream, so Captum raises (it warns about
such lists). Ours gives each layer's own IG, the other layers at their actual values.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch

from methods.engine import layers
from methods.engine.batching import forward_done
from methods.engine.call import Call, Output
from methods.engine.inputs import Forward, Tensors
from methods.engine.targets import Target
from methods.layer._common import LayerParams, layer_output


def _tapped(
    stack: ExitStack,
    call: Call,
    forward: Forward,
    paths: list[str],
    to_input: bool,
    mode: layers.TapMode,
) -> tuple[list[layers.Tap], Any]:
    """Every layer tapped (``mode``) for one forward of ``call``'s inputs; the taps and the
    output (each layer checked to have run once, as ``layers.run`` checks one)."""
    xs = call.inputs
    taps = [
        stack.enter_context(
            layers.tap(layers.resolve(call.model, p), p, to_input=to_input, mode=mode)
        )
        for p in paths
    ]
    for t in taps:
        t.reset()
        t.rows = xs[0].shape[0] if xs and xs[0].dim() else None
    out = forward(xs)
    for t in taps:
        t.check_ran()
    return taps, out


def _gradients(
    call: Call, forward: Forward, target: Target, paths: list[str], to_input: bool
) -> tuple[list[Tensors], list[Tensors], torch.Tensor]:
    """d(targeted output)/d(each layer), each layer's values, and the targeted outputs, from
    one forward and one backward."""
    with torch.enable_grad(), ExitStack() as stack:
        # "graft": each layer's leaf, with the gradient flowing on to the layers before it
        taps, out = _tapped(stack, call, forward, paths, to_input, "graft")
        selected = target.select(out)
        wanted = [leaf for t in taps for leaf in t.leaves if leaf.requires_grad]
        forward_done()
        found = (
            torch.autograd.grad(selected.sum(), wanted, allow_unused=True)
            if wanted and selected.requires_grad
            else (None,) * len(wanted)
        )
    grads = iter(found)
    per_layer: list[Tensors] = []
    for t in taps:
        full = [next(grads) if leaf.requires_grad else None for leaf in t.leaves]
        if any(leaf.requires_grad for leaf in t.leaves) and all(g is None for g in full):
            # nothing reached this layer's graft: what the layer alone gives (zeros where the
            # output is reached but not through it, the error where nothing is reached)
            module = layers.resolve(call.model, t.path)
            alone, _, _ = layers.layer_gradients(
                forward, call.inputs, target, module, t.path, to_input
            )
            per_layer.append(alone)
            continue
        per_layer.append(
            tuple(torch.zeros_like(v) if g is None else g for g, v in zip(full, t.leaves,
                                                                          strict=True))
        )  # fmt: skip
    return per_layer, [tuple(v.detach() for v in t.values) for t in taps], selected.detach()


def _activations(call: Call, p: LayerParams, paths: list[str]) -> list[Output]:
    with torch.no_grad(), ExitStack() as stack:
        # "cut": the rest of the forward gets clones, so an in-place op after a layer (a
        # ReLU(inplace=True), a residual +=) cannot change the values kept here
        taps, _ = _tapped(stack, call, call.forward, paths, p.attribute_to_layer_input, "cut")
    return [layer_output(tuple(leaf.detach() for leaf in t.leaves)) for t in taps]


def _gradient_x_activation(call: Call, p: LayerParams, paths: list[str]) -> list[Output]:
    grads, values, selected = _gradients(
        call, call.forward, call.target, paths, p.attribute_to_layer_input
    )
    outs = []
    for g, v in zip(grads, values, strict=True):
        if getattr(p, "multiply_by_inputs", True):
            g = tuple(a * b for a, b in zip(g, v, strict=True))
        outs.append(layer_output(g, outputs=selected))
    return outs


def _lrp(call: Call, p: LayerParams, paths: list[str]) -> list[Output]:
    from methods.gradient.lrp import conservation_delta, parse_rules, relevance_forward, scale

    forward = relevance_forward(call, parse_rules(call.model, getattr(p, "rules", None)))
    grads, _, selected = _gradients(call, forward, call.target, paths, p.attribute_to_layer_input)
    outs = []
    for g in grads:
        relevance = scale(g, selected)
        outs.append(
            layer_output(relevance, delta=conservation_delta(relevance, selected), outputs=selected)
        )
    return outs


#: the methods that take every layer in one pass
ONE_PASS: dict[str, Callable[[Call, LayerParams, list[str]], list[Output]]] = {
    "layer_activation": _activations,
    "layer_gradient_x_activation": _gradient_x_activation,
    "layer_lrp": _lrp,
}
