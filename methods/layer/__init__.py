"""Layer attribution methods, one module per method."""
