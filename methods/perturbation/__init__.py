"""Perturbation attribution methods, one module per method."""
