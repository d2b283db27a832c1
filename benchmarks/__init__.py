"""Side-by-side benchmarks against Captum (run: python -m benchmarks)."""
