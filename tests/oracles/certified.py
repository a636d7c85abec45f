"""Reference optimisers that cannot fail silently: each returns its answer with a certificate.

A test's second opinion must not depend on luck (a line search that gives up, a tolerance that
a new scipy interprets differently). The solvers here are plain numpy, use no library code, and
either converge by construction or assert their own optimality certificate before returning:

- :func:`project_simplex_bisection`: the Euclidean projection onto ``{w ≥ 0, Σw = t}`` by
  bisection on the threshold ``τ`` of ``w = max(v − τ, 0)``; the bracket halves every step, so
  200 steps reach machine precision for any input.
- :func:`newton_minimize`: damped Newton with a Levenberg term and backtracking on a smooth
  convex function given its exact gradient and Hessian; it asserts ``‖∇f‖∞ ≤ gtol`` at the
  answer (for a convex ``f`` a stationary point is a global minimiser).
- :func:`simplex_qp`: ``min_{p ∈ Δ} ½‖A p − y‖²_W`` by accelerated projected gradient with the
  exact sort-based projection (Held, Wolfe & Crowder 1974); it asserts the Frank–Wolfe duality
  gap ``∇f(p)·p − min_i ∇f(p)_i``, an upper bound on ``f(p) − f*``, below ``gap_tol``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["newton_minimize", "project_simplex_bisection", "simplex_qp"]


def project_simplex_bisection(v: np.ndarray, total: float = 1.0, steps: int = 200) -> np.ndarray:
    """``argmin_w ½‖w − v‖²`` over ``w ≥ 0, Σw = total`` (``total > 0``), by bisection on ``τ``.

    ``g(τ) = Σ max(v − τ, 0)`` is continuous and non-increasing, ``g(max v) = 0 < total`` and
    ``g(min v − total) ≥ total``, so the root lies in that bracket; the projection is
    ``max(v − τ*, 0)``, rescaled by the (≤ 1 ulp) residual of the sum.
    """
    v = np.asarray(v, dtype=np.float64).ravel()
    lo, hi = float(v.min()) - total, float(v.max())
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if np.maximum(v - mid, 0.0).sum() > total:
            lo = mid
        else:
            hi = mid
    w = np.maximum(v - 0.5 * (lo + hi), 0.0)
    assert w.sum() > 0
    return w * (total / w.sum())


def _project_simplex_sort(v: np.ndarray) -> np.ndarray:
    """The projection onto the unit simplex in closed form: ``τ`` from the sorted entries."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    k = np.nonzero(u - css / np.arange(1, v.size + 1) > 0)[0][-1]
    return np.maximum(v - css[k] / (k + 1), 0.0)


def newton_minimize(
    fun: Callable[[np.ndarray], tuple[float, np.ndarray, np.ndarray]],
    x0: np.ndarray,
    *,
    gtol: float = 1e-10,
    max_iters: int = 200,
) -> tuple[np.ndarray, float]:
    """Minimise a smooth convex ``f`` from its value, gradient and Hessian; returns ``(x, f(x))``.

    Steps solve ``(H + ρI) d = −g`` with ``ρ = ‖g‖`` (a Levenberg term that keeps the step
    defined on flat directions and vanishes at the optimum, giving quadratic convergence where
    ``H`` is non-singular), followed by Armijo backtracking. Raises ``AssertionError`` unless
    ``‖∇f(x)‖∞ ≤ gtol`` is reached, so a returned point is a certified minimiser.
    """
    x = np.asarray(x0, dtype=np.float64).copy()
    f, g, h = fun(x)
    for _ in range(max_iters):
        if np.max(np.abs(g)) <= gtol:
            return x, f
        d = np.linalg.solve(h + np.linalg.norm(g) * np.eye(x.size), -g)
        step = 1.0
        while True:
            f_new, g_new, h_new = fun(x + step * d)
            if f_new <= f + 1e-4 * step * (g @ d) or step < 1e-12:
                break
            step *= 0.5
        if f_new > f:  # round-off level: the line search found no descent
            break
        x, f, g, h = x + step * d, f_new, g_new, h_new
    assert np.max(np.abs(g)) <= gtol, f"reference not certified: ‖∇f‖∞ = {np.max(np.abs(g))}"
    return x, f


def simplex_qp(
    a: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    *,
    gap_tol: float = 1e-10,
    max_iters: int = 200_000,
) -> tuple[np.ndarray, float]:
    """``min_{p ∈ Δ} f(p) = ½ Σ w (A p − y)²`` by FISTA with restarts; returns ``(p, f(p))``.

    Stops when the Frank–Wolfe gap ``G(p) = ∇f(p)·p − min_i ∇f(p)_i ≥ f(p) − f*`` falls below
    ``gap_tol·max(1, f(p))`` and asserts that it did: the returned value is within that gap of
    the true minimum, whatever the conditioning of ``A``.
    """
    a, y, w = (np.asarray(z, dtype=np.float64) for z in (a, y, w))
    n = a.shape[1]
    step = 1.0 / np.linalg.eigvalsh(a.T @ (w[:, None] * a)).max()

    def value_grad(p: np.ndarray) -> tuple[float, np.ndarray]:
        r = a @ p - y
        return 0.5 * float(np.sum(w * r * r)), a.T @ (w * r)

    p = np.full(n, 1.0 / n)
    z, t = p.copy(), 1.0
    f, g = value_grad(p)
    gap = np.inf
    for _ in range(max_iters):
        _, gz = value_grad(z)
        p_new = _project_simplex_sort(z - step * gz)
        f_new, g_new = value_grad(p_new)
        if f_new > f:  # O'Donoghue–Candès restart: drop the momentum when it overshoots
            z, t = p.copy(), 1.0
            continue
        t_new = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
        z = p_new + ((t - 1.0) / t_new) * (p_new - p)
        p, f, g, t = p_new, f_new, g_new, t_new
        gap = float(g @ p - g.min())
        if gap <= gap_tol * max(1.0, f):
            break
    assert gap <= gap_tol * max(1.0, f), f"reference not certified: Frank–Wolfe gap {gap}"
    return p, f
