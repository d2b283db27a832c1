"""Neuron attribution methods, one module per method."""
