"""A Hugging Face ``CLIPModel`` directory served as a model of image–text pairs (CONTRACT 9.4,
``image_text_similarity``): each example is an image and a text, and the output is their
similarity as the model scores it, ``logits_per_image[i, i]`` (the logit scale times the
cosine of the two embeddings).

The attributions go to both at once. Perturbation methods hide image patches and text tokens
together (the image's patches at the vision model's patch size, one feature per token; a
hidden token becomes the pad token, a hidden patch the baseline image). Gradient methods
follow one path from both baselines at once: the pixels, and the text's token embeddings
(``ImageTextSimilarity(pixels, ids, embeds)`` puts ``embeds`` in place of the token
embedding's output), each token's scores summed over the embedding dim, as token models
answer.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from model_registry.hf_text import PADDED

#: an example's fields, as requests give them
FIELDS = ("image", "text")


class ImageTextSimilarity(nn.Module):
    """``logits_per_image[i, i]`` of ``model`` for each example's image and text (ids
    ``PADDED`` where the batch pads); with ``embeds``, those in place of the text's token
    embeddings."""

    def __init__(self, model: nn.Module, pad_id: int) -> None:
        super().__init__()
        self.model, self.pad_id = model, pad_id

    @property
    def token_embedding(self) -> nn.Module:
        clip: Any = self.model
        module: nn.Module = clip.text_model.embeddings.token_embedding
        return module

    def forward(self, pixel_values: Tensor, ids: Tensor, embeds: Tensor | None = None) -> Tensor:
        padded = ids == PADDED
        kw: dict[str, Any] = {
            "pixel_values": pixel_values,
            "input_ids": ids.masked_fill(padded, self.pad_id),
            "attention_mask": (~padded).long(),
        }
        if embeds is None:
            return self.model(**kw).logits_per_image.diagonal()

        def swap(_m: nn.Module, _i: Any, out: Tensor) -> Tensor:
            return embeds.to(out.dtype)

        handle = self.token_embedding.register_forward_hook(swap)
        try:
            return self.model(**kw).logits_per_image.diagonal()
        finally:
            handle.remove()

    def embedded(self, ids: Tensor) -> Tensor:
        """The token embeddings of ``ids`` (the pad token where the batch pads)."""
        with torch.no_grad():
            out: Tensor = self.token_embedding(ids.masked_fill(ids == PADDED, self.pad_id))
        return out

    def patches(self, shape: tuple[int, ...], first: int = 0) -> Tensor:
        """A feature mask (1, C, H, W) of the vision model's patches, numbered from ``first``
        row by row (a partial patch at the edge is its own)."""
        config: Any = self.model.config
        size = int(config.vision_config.patch_size)
        h, w = shape[-2:]
        rows = torch.arange(h) // size
        cols = torch.arange(w) // size
        per_row = -(-w // size)
        grid = rows[:, None] * per_row + cols[None, :] + first
        return grid.expand(1, shape[-3], h, w).contiguous()
