"""Robustness: adversarial attacks (``methods.attack``) and minimal counterfactual
perturbations (``methods.min_perturbation``)."""

from methods.robustness.attack import AttackResult, attack

__all__ = ["AttackResult", "attack"]
