r"""A start and a metric for NUTS from the posterior's mode and curvature (Laplace).

On a large Laplace release the collapsed path's target in ``φ`` is smooth but badly conditioned:
on Adult's 842-cell tree (631 parameters, ε = 1) the Hessian of the potential at its mode has
condition number 4·10⁵ in the log odds standardised by their released standard errors and
still 3·10³ once its diagonal is scaled away (by hand), so NUTS with a diagonal mass matrix
adapted in warm-up ran at step size 0.011 and ~670 leapfrog steps a draw and did not mix. The
correlations are what a diagonal metric cannot absorb; the curvature at the mode can. With the
metric

.. math::

    M^{-1} = H^{-1},\qquad H = ∇^2 U(\hat z),\quad \hat z = \arg\min_z U(z),            \tag{1}

(``U`` the potential energy in NumPyro's unconstrained space, the Gibbs sites held fixed), the
same release ran at step size 0.18 with 38 leapfrog steps a draw (``python -m benchmarks
collapsed --model user --edges mid --records 0 --time-limit 600``). Where the posterior is
skewed the curvature understates the spread (the draws' standard deviation was 0.8–3.4 times
the approximation's, the most on log odds of nearly empty cells, by hand); rescaling the
metric's variances to warm-up's draws after 100 steps was tried and mixed worse there.

:func:`laplace_metric` finds ``ẑ`` by L-BFGS (SciPy, on the host, with the compiled value and
gradient of ``U``) and ``H`` by central differences of the gradient, one coordinate at a time
(631 gradients of 5 ms; a forward-over-reverse Hessian compiled for 39 s and ran for 48 s
there, by hand). :func:`block_potential` builds ``U`` for the latent sites of a model that NUTS
moves, with other sites (the Gibbs blocks) held at given values; :func:`laplace_starts` draws
each chain's start from ``N(ẑ, H⁻¹)``; :func:`choose_metric` settles NUTS's options.

>>> import jax, numpyro, numpyro.distributions as dist
>>> numpyro.enable_x64()
>>> def model():
...     x = numpyro.sample("x", dist.Normal(1.0, 2.0))
...     numpyro.sample("y", dist.Normal(x, 1.0), obs=3.0)
>>> potential, params = block_potential(model, (), {}, {}, jax.random.key(0))
>>> metric = laplace_metric(potential, params)
>>> round(float(metric.mode["x"]), 6), round(float(metric.inverse_mass_matrix[0, 0]), 6)
(2.6, 0.8)
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize
from jax.flatten_util import ravel_pytree
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import potential_energy

__all__ = ["DECREMENT_TOLERANCE", "METRICS", "NEWTON_STEPS", "ChosenMetric", "LaplaceMetric",
           "block_potential", "choose_metric", "laplace_metric", "laplace_starts"]

Array = Any

#: The metrics of :func:`choose_metric`: the curvature at the mode, or NumPyro's adaptation.
METRICS = ("laplace", "adapt")


class LaplaceMetric(NamedTuple):
    """The mode and curvature of a potential (1).

    Attributes
    ----------
    mode : pytree
        ``ẑ``, unconstrained values of the sites NUTS moves.
    inverse_mass_matrix : array (D, D)
        ``H⁻¹``, in the order of :func:`jax.flatten_util.ravel_pytree` of ``mode`` (NumPyro's).
    converged : bool
        Whether the mode is stationary: its Newton decrement ``½ ∇Uᵀ H⁻¹ ∇U`` (the log
        density the quadratic model still expects to gain) is at most
        :data:`DECREMENT_TOLERANCE`.
    iterations : int
        L-BFGS iterations.
    decrement : float
        The Newton decrement at ``mode``.
    seconds : float
        Wall time, compilation of the gradient included.
    """

    mode: Any
    inverse_mass_matrix: Array
    converged: bool
    iterations: int
    seconds: float
    decrement: float = 0.0


#: The largest Newton decrement ``½ ∇Uᵀ H⁻¹ ∇U`` at which the point found counts as the mode:
#: the quadratic model expects less than this much more log density, a point within about
#: ``√(2 · 0.01) ≈ 0.14`` posterior standard deviations (in the metric) of its peak.
DECREMENT_TOLERANCE = 0.01

#: Newton steps ``z ← z − H⁻¹ ∇U`` (the curvature at L-BFGS's point, each step halved until
#: ``U`` falls) after L-BFGS, where its point is not yet stationary: SciPy's L-BFGS-B reports
#: success on a stall of its line search, and a mode off its peak centres the chains' starts
#: and the pilot map there.
NEWTON_STEPS = 5


def block_potential(model: Callable[..., Any], model_args: tuple, model_kwargs: dict,
                    fixed: Mapping[str, Array], rng_key: Array,
                    init_strategy: Callable | None = None) -> tuple[Callable, dict]:
    """``(U, z₀)``: the potential energy of ``model``'s latent sites but ``fixed`` (which are
    conditioned on their given values) in NumPyro's unconstrained space, and a starting point
    from ``init_strategy`` (NumPyro's default where not given)."""
    conditioned = handlers.condition(model, data=dict(fixed))
    strategy = init_to_uniform if init_strategy is None else init_strategy

    def start(key: Array) -> dict:
        # one compiled trace: NumPyro's initialize_model runs the model and its gradient op by
        # op, and compiled each small operation of the collapsed density on its own (32 s of
        # 40 on Adult's 842-cell tree, by hand); the potential is checked where it is used
        seeded = handlers.substitute(handlers.seed(conditioned, key), substitute_fn=strategy)
        tr = handlers.trace(seeded).get_trace(*model_args, **model_kwargs)
        out = {}
        for name, site in tr.items():
            if site["type"] != "sample" or site["is_observed"]:
                continue
            if site["fn"].support.is_discrete:
                raise ValueError(f"site {name!r} is discrete; the potential is over continuous "
                                 "sites (hold it fixed, or integrate it out)")
            out[name] = biject_to(site["fn"].support).inv(site["value"])
        return out

    potential = functools.partial(potential_energy, conditioned, model_args, model_kwargs)
    return potential, jax.jit(start)(rng_key)


def laplace_metric(potential_fn: Callable[[Any], Array], init_params: Any, *,
                   max_iterations: int = 10_000, step: float = 1e-5) -> LaplaceMetric:
    """The mode ``ẑ`` of ``potential_fn`` from ``init_params`` and ``H⁻¹`` at it (1).

    L-BFGS searches; where its point is not stationary (Newton decrement above
    :data:`DECREMENT_TOLERANCE`: SciPy reports success on a stalled line search too), up to
    :data:`NEWTON_STEPS` damped Newton steps with the curvature found there finish the search.

    Parameters
    ----------
    potential_fn : callable
        ``U(z)`` of a pytree ``z`` (one chain's unconstrained values).
    init_params : pytree
        Where L-BFGS starts.
    max_iterations : int
        L-BFGS's limit.
    step : float
        Central differences ``(∇U(ẑ + h e_i) − ∇U(ẑ − h e_i)) / 2h`` with
        ``h = step · max(1, |ẑ_i|)``.

    Raises
    ------
    ValueError
        Where ``U`` is not finite at ``init_params`` or ``H`` is not positive definite at the
        point found (no strict mode: a flat direction, such as an unidentified parameter with
        an improper prior).
    """
    began = time.perf_counter()
    flat, unravel = ravel_pytree(init_params)
    value_and_grad = jax.jit(jax.value_and_grad(lambda x: potential_fn(unravel(x))))

    def grad(x: np.ndarray) -> np.ndarray:  # the same compiled program as L-BFGS's
        return np.asarray(value_and_grad(jnp.asarray(x))[1])

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        value, gradient = value_and_grad(jnp.asarray(x))
        return float(value), np.asarray(gradient, dtype=float)

    x0 = np.asarray(flat, dtype=float)
    if not np.isfinite(objective(x0)[0]):
        raise ValueError("the potential energy is not finite at the starting point; start "
                         "inside the support (init=…)")
    found = scipy.optimize.minimize(objective, x0, jac=True, method="L-BFGS-B",
                                    options={"maxiter": max_iterations})
    mode = found.x
    hessian = np.empty((mode.size, mode.size))
    for i in range(mode.size):
        h = step * max(1.0, abs(mode[i]))
        up, down = mode.copy(), mode.copy()
        up[i] += h
        down[i] -= h
        hessian[:, i] = (grad(up) - grad(down)) / (2 * h)
    hessian = 0.5 * (hessian + hessian.T)
    values, vectors = np.linalg.eigh(hessian)
    if not np.all(np.isfinite(values)) or values[0] <= 1e-12 * max(values[-1], 1.0):
        raise ValueError(
            f"the potential's curvature at the point L-BFGS found is not positive definite "
            f"(smallest eigenvalue {values[0]:.3g}): no strict mode; sample with "
            "metric='adapt'")
    cov = (vectors / values) @ vectors.T
    cov = 0.5 * (cov + cov.T)
    mode, decrement = _newton(objective, mode, cov)
    return LaplaceMetric(unravel(jnp.asarray(mode)), jnp.asarray(cov),
                         decrement <= DECREMENT_TOLERANCE, int(found.nit),
                         time.perf_counter() - began, decrement)


def _newton(objective: Callable[[np.ndarray], tuple[float, np.ndarray]], x: np.ndarray,
            cov: np.ndarray) -> tuple[np.ndarray, float]:
    """Up to :data:`NEWTON_STEPS` damped Newton steps with the fixed inverse curvature
    ``cov`` from ``x`` while its Newton decrement exceeds :data:`DECREMENT_TOLERANCE`;
    ``(point, its decrement)``."""
    value, gradient = objective(x)
    decrement = 0.5 * float(gradient @ cov @ gradient)
    for _ in range(NEWTON_STEPS):
        if not decrement > DECREMENT_TOLERANCE:
            break
        direction, scale = cov @ gradient, 1.0
        for _ in range(30):  # halve the step until the potential falls
            trial = x - scale * direction
            trial_value, trial_gradient = objective(trial)
            if np.isfinite(trial_value) and trial_value < value:
                break
            scale *= 0.5
        else:
            break
        x, value, gradient = trial, trial_value, trial_gradient
        decrement = 0.5 * float(gradient @ cov @ gradient)
    return x, decrement


def laplace_starts(metric: LaplaceMetric, rng_key: Array, num_chains: int,
                   spread: float = 1.0) -> Any:
    """Each chain's start ``ẑ + spread · L u``, ``L Lᵀ = H⁻¹``, ``u ∼ N(0, I)`` (a leading
    chain axis where ``num_chains > 1``; ``spread=0``: every chain at the mode)."""
    flat, unravel = ravel_pytree(metric.mode)
    chol = jnp.linalg.cholesky(metric.inverse_mass_matrix)
    u = jax.random.normal(rng_key, (num_chains, flat.size), flat.dtype)
    starts = flat + spread * u @ chol.T
    if num_chains == 1:
        return unravel(starts[0])
    return jax.vmap(unravel)(starts)


class ChosenMetric(NamedTuple):
    """NUTS's metric as :func:`choose_metric` settled it.

    Attributes
    ----------
    name : {"laplace", "adapt", "pilot"}
        ``"pilot"``: the unit metric on the coordinates of a map fitted to a pilot run
        (:func:`~numpyro_dpgm.infer.bayes.nuts.run_nuts`'s ``metric="pilot"``).
    nuts_options : dict
        ``dense_mass``, and for ``"laplace"`` ``inverse_mass_matrix`` and
        ``adapt_mass_matrix=False``, for :class:`numpyro.infer.NUTS`.
    starts : pytree or None
        Unconstrained starts of NUTS's sites per chain (:func:`laplace_starts`), or ``None``.
    found : LaplaceMetric or None
        Its ``seconds`` include building the potential (:func:`block_potential`).
    """

    name: str
    nuts_options: dict
    starts: Any
    found: LaplaceMetric | None


def choose_metric(metric: str | None, model: Callable[..., Any], model_args: tuple,
                  model_kwargs: dict, fixed: Mapping[str, Array], init_strategy: Callable,
                  rng_key: Array, num_chains: int, radius: float,
                  dense_mass: bool | None) -> ChosenMetric:
    """NUTS's metric and starts for the sites of ``model`` but ``fixed`` (the Gibbs blocks).

    ``metric="laplace"``: (1) from the point of ``init_strategy``, the chains starting from
    draws of ``N(ẑ, H⁻¹)`` (``radius=0``: at ``ẑ``); ``"adapt"``: NumPyro's windowed adaptation
    with ``dense_mass``; ``None``: ``"laplace"``, or ``"adapt"`` with a warning where the
    curvature is not positive definite.
    """
    if metric not in (None, *METRICS):
        raise ValueError(f"metric must be one of {METRICS} or None, got {metric!r}")
    if metric == "adapt":
        return ChosenMetric("adapt", {"dense_mass": bool(dense_mass)}, None, None)
    k_init, k_start = jax.random.split(rng_key)
    began = time.perf_counter()
    try:
        potential, z0 = block_potential(model, model_args, model_kwargs, fixed, k_init,
                                        init_strategy)
        found = laplace_metric(potential, z0)
        # the potential's set-up (the model's first trace, compiled) counts
        found = found._replace(seconds=time.perf_counter() - began)
    except ValueError as e:
        if metric == "laplace":
            raise
        warnings.warn(f"NUTS adapts its mass matrix in warm-up: {e}", stacklevel=3)
        return ChosenMetric("adapt", {"dense_mass": bool(dense_mass)}, None, None)
    starts = laplace_starts(found, k_start, num_chains, spread=1.0 if radius > 0 else 0.0)
    options = {"dense_mass": True, "inverse_mass_matrix": found.inverse_mass_matrix,
               "adapt_mass_matrix": False}
    return ChosenMetric("laplace", options, starts, found)

