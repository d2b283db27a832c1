"""The shared engine: what every method needs and none should re-implement.

Inputs and forwards (`inputs`), targets (`targets`), baselines (`baselines`), chunking under a
memory budget (`batching`), gradients (`gradients`), quadrature rules (`quadrature`), the guard
that leaves the caller's model as it was (`guard`) and the interception of non-linearities
that hook-free DeepLift and guided backprop rely on (`intercept`).
"""
