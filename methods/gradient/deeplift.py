"""DeepLift with the Rescale rule (and DeepLift's max rule for max-pooling).

Shrikumar et al. 2017, https://arxiv.org/abs/1704.02685. Inputs and baselines run as one
doubled batch; every non-linear call (module or functional, reused or not) gets the rule of
its own input and output differences (see ``methods.engine.deeplift``), so a model with
``F.relu`` gives the same numbers as its ``nn.ReLU`` twin, which Captum does not.
"""

from __future__ import annotations

from pydantic import Field

from methods.engine import deeplift as dl
from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Output
from methods.engine.path import completeness_delta
from methods.params import MultiplyByInputsParams, PythonOnly
from methods.registry import TokenCounterpart, register


class DeepLiftParams(MultiplyByInputsParams):
    eps: float = Field(
        1e-10, gt=0, description="below this |input difference| the plain gradient is used"
    )
    custom_attribution_func: PythonOnly = Field(
        None, description="Python API only: f(multipliers[, inputs[, baselines]]) -> attributions"
    )

    def combiner(self) -> dl.Combine:
        return dl.combiner(self.multiply_by_inputs, self.custom_attribution_func)


@register(
    "deeplift",
    exportable=True,
    family="gradient",
    params=DeepLiftParams,
    needs_hooks=True,
    returns_delta=True,
    batching="internal_batch_size",
    token_counterpart=TokenCounterpart("layer_deeplift"),
)
def deeplift(call: Call, p: DeepLiftParams) -> Output:
    """DeepLift (Rescale rule) against the baselines (default zeros)."""
    xs = call.inputs
    bs = format_baselines(call.baselines, xs)
    attrs, fx, fb, echo = dl.run_rows(call, xs, bs, call.target, dl.input_step(p.eps), p.combiner())
    return Output(attrs, delta=completeness_delta(attrs, fx, fb), outputs=fx, echo=echo)
