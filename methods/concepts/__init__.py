"""Concept-based explanations: TCAV (``methods.tcav``)."""

from methods.concepts.cav import Cav, train_cav
from methods.concepts.core import TCAVResult, layer_activations, layer_gradients, tcav

__all__ = ["Cav", "TCAVResult", "layer_activations", "layer_gradients", "tcav", "train_cav"]
