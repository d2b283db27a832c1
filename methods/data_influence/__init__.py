"""Training-data influence (TracIn and activation similarity), exact to Captum 0.9.0.

``influence`` scores each training example's influence on each test example (or the top
``k``); ``self_influence`` each training example's on itself. ``build_index`` / ``query`` /
``index_self_influence`` split the work for a server: the training side once, as plain tensors
(``InfluenceIndex.to_dict``), then test batches against it.

Which Captum configuration each method equals (same checkpoints, ``checkpoints_load_func``
loading the state dict and returning the lr):

- ``tracin_cp``: ``TracInCP(model, data, checkpoints, loss_fn=L(reduction="none"),
  sample_wise_grads_per_batch=False, layers=layers)``, which is also
  ``loss_fn=L(reduction="sum"), sample_wise_grads_per_batch=True`` when every differentiated
  parameter belongs to an nn.Linear or nn.Conv2d (Captum's sample-wise trick skips others).
  Without ``layers`` the gradient is taken with respect to every parameter with
  ``requires_grad`` (Captum: every parameter).
- ``tracin_cp_fast``: ``TracInCPFast(model, final_fc_layer, ..., loss_fn=L(reduction="sum"))``.
  The gradient is taken at the layer's output, which is Captum's gradient at the model output
  when the layer is the model's last operation (Captum's assumption). Default layer: the
  model's last nn.Linear (in ``named_modules`` order).
- ``tracin_cp_fast_rand_proj``: ``TracInCPFastRandProj(..., loss_fn=L(reduction="sum"),
  projection_dim=projection_dim, seed=seed or 0)`` with an exact nearest-neighbour search
  (Captum's default is Annoy's approximate one); the same projection matrices for the same
  seed, drawn from a private generator.
- ``similarity``: ``SimilarityInfluence(model, layers, data, activation_dir,
  similarity_metric=cosine_similarity|euclidean_distance, similarity_direction=...)`` with
  direction "max" for cosine proponents and "min" for euclidean proponents (the nearest), the
  other direction for opponents; ``k=None`` gives the whole matrix.

Losses (the per-example loss, summed over an example's elements): ``cross_entropy``, ``nll``,
``mse``, ``bce_with_logits`` = Captum with the torch loss at reduction "sum" (or "none" with
``sample_wise_grads_per_batch=False``). Captum's "mean" equals it for cross_entropy and nll but
divides mse and bce_with_logits by the number of elements per example.
"""

from methods.data_influence.common import InfluenceResult
from methods.data_influence.index import (
    InfluenceIndex,
    build_index,
    concat,
    index_self_influence,
    query,
)
from methods.data_influence.tracin import influence, self_influence

__all__ = [
    "InfluenceIndex",
    "InfluenceResult",
    "build_index",
    "concat",
    "index_self_influence",
    "influence",
    "query",
    "self_influence",
]
