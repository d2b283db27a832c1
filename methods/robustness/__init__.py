"""Robustness: adversarial attacks (``methods.attack``) and minimal counterfactual
perturbations (``methods.min_perturbation``)."""

from methods.robustness.attack import AttackResult, attack
from methods.robustness.minimal import MinPerturbationResult, min_perturbation

__all__ = ["AttackResult", "MinPerturbationResult", "attack", "min_perturbation"]
