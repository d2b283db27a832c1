"""Weighted linear surrogate models in torch, batched over examples (no scikit-learn).

Each fitter takes X (B, S, F), y (B, S) and sample weights w (B, S) and fits B independent
models at once; objectives follow scikit-learn's so LIME and Kernel SHAP mean what Captum's do:

- ``least_squares``: sum w (y - X b - c)^2 (``LinearRegression``), minimum-norm when singular;
  ``ridge > 0`` adds ridge * |b|^2 (``Ridge(alpha=ridge)``).
- ``lasso``: sum w (y - X b - c)^2 / (2 sum w) + alpha |b|_1 (``Lasso(alpha)``), by FISTA.
- ``constrained_least_squares``: no intercept, sum b fixed (Kernel SHAP's efficiency constraint).
"""

from __future__ import annotations

import torch
from torch import Tensor

from methods.cancel import checkpoint


def _center(x: Tensor, y: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Weighted means removed, so the intercept drops out of the fit."""
    wn = w / w.sum(1, keepdim=True)
    xm = (wn.unsqueeze(2) * x).sum(1)
    ym = (wn * y).sum(1)
    return x - xm.unsqueeze(1), y - ym.unsqueeze(1), xm, ym


def _solve(x: Tensor, y: Tensor, w: Tensor, ridge: float) -> Tensor:
    """argmin_b sum w (y - X b)^2 + ridge |b|^2, minimum-norm; shape (B, F)."""
    sw = w.clamp(min=0).sqrt()
    a = sw.unsqueeze(2) * x
    rhs = sw * y
    b, _, f = x.shape
    if ridge > 0:
        eye = torch.eye(f, dtype=x.dtype, device=x.device).expand(b, f, f) * ridge**0.5
        a = torch.cat([a, eye], dim=1)
        rhs = torch.cat([rhs, torch.zeros(b, f, dtype=x.dtype, device=x.device)], dim=1)
    # gelsd (SVD) gives the minimum-norm answer on rank-deficient designs, like scipy's lstsq.
    # CUDA offers only gels, which needs full rank: on a GPU a KernelSHAP with fewer samples
    # than features gave a different, non-finite answer per run (make gpu-check), so the fit
    # (samples x features, small next to the forwards that scored the samples) runs on the CPU
    device = x.device
    a, rhs = a.cpu(), rhs.cpu()
    # one example's fit at a time (each is its own LAPACK call, batched or not): a wide design
    # takes seconds per example, and a cancelled request stops between them
    out = []
    for i in range(b):
        checkpoint()
        fit = torch.linalg.lstsq(a[i : i + 1], rhs[i : i + 1].unsqueeze(2), driver="gelsd")
        out.append(fit.solution.squeeze(2))
    return (torch.cat(out) if out else a.new_zeros(0, f)).to(device)


def least_squares(
    x: Tensor, y: Tensor, w: Tensor, *, ridge: float = 0.0, intercept: bool = True
) -> tuple[Tensor, Tensor]:
    """Weighted least squares (ridge if ``ridge`` > 0): coefficients (B, F) and intercepts (B,)."""
    if not intercept:
        coef = _solve(x, y, w, ridge)
        return coef, torch.zeros_like(coef[:, 0])
    xc, yc, xm, ym = _center(x, y, w)
    coef = _solve(xc, yc, w, ridge)
    return coef, ym - (coef * xm).sum(1)


def lasso(
    x: Tensor, y: Tensor, w: Tensor, alpha: float, *, max_iter: int = 1000, tol: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """Weighted lasso with intercept by FISTA (Beck & Teboulle 2009).

    With at least as many samples as features the steps use the F x F Gram matrix; with more
    features than samples (LIME on pixels) they go through the samples (S x F products, the
    top eigenvalue from the S x S matrix): the Gram matrix of a 32x32 image's 3072 pixels took
    75 GFLOP to build for 8 examples and an eigendecomposition of seconds each, and a 224 px
    image's would need 90 GB. Both are the same iteration; they differ only in rounding."""
    xc, yc, xm, ym = _center(x, y, w)
    wn = w / w.sum(1, keepdim=True)  # (B, S)
    corr = (xc.transpose(1, 2) @ (wn * yc).unsqueeze(2)).squeeze(2)  # (B, F)
    checkpoint()
    samples, features = xc.shape[1:]
    if features <= samples:
        gram = xc.transpose(1, 2) @ (wn.unsqueeze(2) * xc)  # (B, F, F)

        def hess(z: Tensor) -> Tensor:
            return (gram @ z.unsqueeze(2)).squeeze(2)

        small = gram
    else:
        xt = xc.transpose(1, 2).contiguous()  # (B, F, S): both products read memory in order

        def hess(z: Tensor) -> Tensor:
            scores = (xc @ z.unsqueeze(2)).squeeze(2)  # (B, S)
            return (xt @ (wn * scores).unsqueeze(2)).squeeze(2)

        root = wn.sqrt().unsqueeze(2) * xc
        small = root @ root.transpose(1, 2)  # (B, S, S): the Gram's nonzero eigenvalues
    tops = []
    for g in small:  # the largest eigenvalue, per example (seconds each for wide designs)
        checkpoint()
        tops.append(torch.linalg.eigvalsh(g)[-1])
    lip = torch.stack(tops).clamp(min=1e-12).unsqueeze(1)
    coef = torch.zeros_like(corr)
    z, t = coef, 1.0
    for it in range(max_iter):
        if it % 64 == 0:
            checkpoint()  # thousands of small steps: a cancelled fit stops here too
        grad = hess(z) - corr
        u = z - grad / lip
        new = u.sign() * (u.abs() - alpha / lip).clamp(min=0)
        t_next = (1 + (1 + 4 * t * t) ** 0.5) / 2
        z = new + ((t - 1) / t_next) * (new - coef)
        step = (new - coef).abs().max()
        coef, t = new, t_next
        if it > 0 and step <= tol * max(1.0, float(coef.abs().max())):
            break
    return coef, ym - (coef * xm).sum(1)


def constrained_least_squares(x: Tensor, y: Tensor, w: Tensor, total: Tensor) -> Tensor:
    """argmin_b sum w (y - X b)^2 subject to sum(b) = total (B,), no intercept; (B, F).

    The last coefficient is eliminated: b_F = total - sum_{j<F} b_j.
    """
    f = x.shape[2]
    if f == 1:
        return total.unsqueeze(1)
    last = x[:, :, -1]
    reduced = x[:, :, :-1] - last.unsqueeze(2)
    head = _solve(reduced, y - last * total.unsqueeze(1), w, 0.0)
    return torch.cat([head, (total - head.sum(1)).unsqueeze(1)], dim=1)
