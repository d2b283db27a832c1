"""Token-level views of layer attributions on embedding layers."""

from __future__ import annotations

from torch import Tensor

from methods.errors import InvalidArgumentError


def per_token(attributions: Tensor | tuple[Tensor, ...]) -> Tensor | tuple[Tensor, ...]:
    """One score per token: embedding-layer attributions (N, L, E) summed over E -> (N, L)."""
    if isinstance(attributions, tuple):
        return tuple(_one(a) for a in attributions)
    return _one(attributions)


def _one(a: object) -> Tensor:
    if not isinstance(a, Tensor) or a.dim() < 3:
        raise InvalidArgumentError(
            "per_token expects embedding-layer attributions of shape (N, L, E), got "
            f"{getattr(a, 'shape', type(a).__name__)}",
            argument="attributions",
        )
    return a.sum(dim=-1)
