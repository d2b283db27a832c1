"""Shared set-up of the surrogate-model methods (LIME, Kernel SHAP).

Both sample coalitions of interpretable features, evaluate the model on them in batched
forwards and fit one weighted linear model per example (all examples at once), or one model
for the whole batch when the model returns one scalar per batch, as Captum does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from methods.engine import coalitions
from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Output
from methods.engine.inputs import Tensors
from methods.engine.masks import FeatureMasks, format_feature_mask, spread
from methods.engine.perturb import Evaluator, echo, start
from methods.errors import InvalidArgumentError


@dataclass
class Surrogate:
    call: Call
    masks: FeatureMasks
    baselines: Tensors
    ev: Evaluator
    #: f(inputs) per model row, shape (B,)
    full: Tensor
    #: models fitted: N (one per example) or 1 (the output is one scalar per batch)
    rows: int
    dtype: torch.dtype

    @property
    def n_features(self) -> int:
        return self.masks.n_features

    def evaluate(
        self, keep: Tensor, per_row: coalitions.PerRow | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Outputs (B, P) for coalitions keep (P, B or 1, F), and per_row values if given."""
        xs = self.call.inputs
        values, extra = coalitions.evaluate(self.ev, self.masks, keep, xs, self.baselines, per_row)
        return values.reshape(keep.shape[0], self.rows).t().to(self.dtype), extra

    def finish(
        self,
        coef: Tensor,
        return_input_shape: bool,
        base: Tensor | None = None,
        *,
        error: Tensor | None = None,
        exact: bool | None = None,
    ) -> Output:
        """Coefficients (B, F) onto the inputs' elements, or as Captum's (B, F) table;
        ``base``: the output at the baselines, per row (Kernel SHAP's base values);
        ``error``: the coefficients' standard errors (B, F), laid out the same way (zeros
        where ``exact``)."""
        if error is None and exact:
            error = torch.zeros_like(coef)
        if return_input_shape:
            attrs = self._spread(coef)
            se = None if error is None else self._spread(error)
            return Output(attrs, echo=echo(self.ev), base=base, standard_error=se)
        se = None if error is None else (self._table(error),)
        return Output(
            (self._table(coef),), echo=echo(self.ev), as_tuple=False, base=base, standard_error=se
        )

    def _spread(self, coef: Tensor) -> Tensors:
        return spread(coef.t().contiguous(), self.masks, self.call.inputs, self.call.method)

    def _table(self, coef: Tensor) -> Tensor:
        ids = self.masks.ids
        # Captum numbers interpretable features from the smallest id; gaps get coefficient 0.
        table = coef.new_zeros(coef.shape[0], int(ids.max() - ids.min()) + 1)
        table[:, (ids - ids.min()).to(coef.device)] = coef
        return table


def prepare(call: Call, feature_mask: object) -> Surrogate:
    xs = call.inputs
    masks = format_feature_mask(feature_mask, xs, call.method)
    bs = format_baselines(call.baselines, xs)
    ev, out = start(call, xs)
    if out.numel() == call.n and ev.per_example:
        rows = call.n
    elif out.numel() == 1:
        rows = 1
        ev.per_example = False
    else:
        raise InvalidArgumentError(
            f"{call.method} fits a linear model to one scalar per example (or per batch), but "
            f"the targeted output has shape {tuple(out.shape)} for {call.n} examples; pass a "
            "target selecting one value per example",
            argument="target",
        )
    if rows == 1 and masks.rows > 1 and call.n > 1:
        raise InvalidArgumentError(
            f"{call.method}: the model returns one scalar per batch, so one model is fitted for "
            "the whole batch and feature_mask must be shared (dim 0 of 1)",
            argument="feature_mask",
        )
    dtype = out.dtype if out.is_floating_point() else torch.get_default_dtype()
    return Surrogate(call, masks, bs, ev, out.reshape(rows).to(dtype), rows, dtype)
