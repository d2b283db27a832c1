"""Gradient attribution methods, one module per method."""
