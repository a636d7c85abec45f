r"""The fast approximate path: a Laplace approximation of the collapsed posterior.

With the tables integrated out (the :class:`~.collapse.collapse` handler, on a model of your own
or the library's), the posterior of the model's continuous parameters is smooth and
low-dimensional. :func:`run_laplace` approximates it by the normal distribution at its mode,

.. math::

    z \sim \mathcal N\big(\hat z,\ H^{-1}\big), \qquad \hat z = \arg\min_z U(z),\quad
    H = ∇^2 U(\hat z),                                                                    \tag{1}

in NumPyro's unconstrained space (``U`` the potential of :mod:`.laplace_metric`, with the
Laplace noise's mixing variances held at their prior mean ``2b²``: Gaussian noise of the same
variance), and draws the tables given each ``z`` from their conditional under the normal
relaxation (a fresh ``ξ`` per draw). It costs one L-BFGS search and one Hessian, the set-up of
:func:`~.nuts.run_nuts`'s collapsed path without its chains; its intervals are approximate
(the posterior of log odds of nearly empty cells is skewed, and (1) is symmetric). Their
coverage, measured against the truth over simulated releases, is :data:`MEASURED_COVERAGE`.

>>> import jax, jax.numpy as jnp, numpyro, numpyro.distributions as dist
>>> from numpyro_dpgm import MarkovNetwork
>>> from numpyro_dpgm.distributions import CollectiveGraphicalModel, GaussianNoise
>>> numpyro.enable_x64()
>>> net = MarkovNetwork({"smoker": 2, "cough": 2}, [("smoker", "cough")])
>>> def model(y, total):
...     scale = numpyro.sample("scale", dist.HalfNormal(2.0))
...     theta = numpyro.sample("theta", dist.Normal(0, scale).expand([4]).to_event(1))
...     n = numpyro.sample("n", CollectiveGraphicalModel(net, theta, total))
...     numpyro.sample("y", GaussianNoise(n, 5.0), obs=y)
>>> fit = run_laplace(model, jax.random.key(0), jnp.array([610.0, 95, 180, 115]), 1000,
...                   num_samples=200)
>>> fit.path, fit.samples["n"].shape, fit.samples["scale"].shape
('laplace', (200, 4), (200,))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
from numpyro import handlers
from numpyro.infer import Predictive
from numpyro.infer.util import constrain_fn

from .collapse import collapse, collapse_plan
from .collapse import gibbs_values as collapse_gibbs_values
from .conditional import ConditionalCoding
from .count_sites import CountSiteError
from .initialization import init_to_interior, init_values
from .laplace_metric import LaplaceMetric, block_potential, laplace_metric, laplace_starts
from .model import NoisyMarginalsModel, observed_answers
from .paths import collapsed_unable, released_log_odds

__all__ = ["MEASURED_COVERAGE", "LaplaceFit", "run_laplace"]

Array = Any

#: What the approximation's 90 % intervals covered, as :class:`LaplaceFit` states it
#: (``python -m benchmarks coverage_user --paths laplace,collapsed --records 100000 --levels 10
#: --concentration 0.3``, ``benchmarks/results/coverage_user-collapsed-cpu.json``).
MEASURED_COVERAGE = (
    "its 90 % intervals are approximate: over 100 simulated releases of a 200-cell table "
    "(100,000 records, Laplace noise at ε = 1) they held 83.4 % of the true cell "
    "probabilities (89.8 % in cells expecting at least one record, 22.2 % in the others), "
    "those of the collapsed NUTS path (run_nuts) 85.4 % (89.9 %, 42.6 %)")


class LaplaceFit(NamedTuple):
    """Output of :func:`run_laplace`.

    Attributes
    ----------
    samples : dict
        ``num_samples`` draws of every latent and deterministic site of the model (the tables
        ``n`` real-valued, from the normal relaxation), but the collapsed path's auxiliary
        ``ξ`` and ``v``.
    laplace : LaplaceMetric
        The mode ``ẑ`` (unconstrained), ``H⁻¹`` (``inverse_mass_matrix``), whether L-BFGS
        converged, its iterations and seconds.
    elapsed : float
        Seconds, compilation included.
    path, path_reason : str
        ``"laplace"``, and what the draws are (with :data:`MEASURED_COVERAGE`).
    model_args, model_kwargs : tuple, dict
        The arguments the model was fitted with (e.g. ``y=``).
    """

    samples: dict
    laplace: LaplaceMetric
    elapsed: float
    path: str
    path_reason: str
    model_args: tuple = ()
    model_kwargs: dict | None = None

    @property
    def converged(self) -> bool:
        """Whether the search for the mode met its tolerance."""
        return self.laplace.converged


def run_laplace(model: NoisyMarginalsModel | Callable[..., Any], rng_key: jax.Array,
                *model_args: Any, num_samples: int = 1000,
                init: str | Mapping[str, Array] = "uniform", **model_kwargs: Any) -> LaplaceFit:
    """Draws from the Laplace approximation (1) of a release model's collapsed posterior.

    Parameters
    ----------
    model : NoisyMarginalsModel or callable
        The library's model (``θ`` inferred, one release, the conditional coding), or a model
        of your own whose exact CGM sites the :class:`~.collapse.collapse` handler can
        integrate out (Laplace or Gaussian noise reading one junction-tree clique per answer).
    rng_key : JAX PRNG key
    *model_args, **model_kwargs
        Passed to the model (e.g. the observed answers ``y``).
    num_samples : int
        Draws returned (at least 2).
    init : "uniform" or mapping site -> value
        Where the search for the mode starts (as :func:`~.nuts.run_nuts`'s chains).

    Returns
    -------
    LaplaceFit

    Raises
    ------
    ValueError
        Where the model has no collapsible CGM site (the message says why), or the curvature
        at the point found is not positive definite (no strict mode).
    """
    if int(num_samples) < 2:
        raise ValueError(f"num_samples must be at least 2, got {num_samples}")
    start = time.perf_counter()
    handled, args, kwargs, fixed, strategy, what = _collapsed(model, model_args, model_kwargs,
                                                              init)
    k_init, k_draw, k_tables = jax.random.split(rng_key, 3)
    potential, z0 = block_potential(handled, args, kwargs, fixed, k_init, strategy)
    found = laplace_metric(potential, z0)
    z = laplace_starts(found, k_draw, int(num_samples))
    conditioned = handlers.condition(handled, data=fixed)
    params = jax.vmap(lambda u: constrain_fn(conditioned, args, kwargs, u))(z)
    auxiliary = set(fixed)
    sites = [k for k, s in handlers.trace(handlers.seed(conditioned, 0)).get_trace(
        *args, **kwargs).items()
        if k not in auxiliary and ((s["type"] == "sample" and not s["is_observed"])
                                   or s["type"] == "deterministic")]
    held = {k: v for k, v in fixed.items() if not k.endswith("xi")}
    draws = Predictive(handlers.condition(handled, data=held), posterior_samples=params,
                       return_sites=sites)(k_tables, *args, **kwargs)
    reason = (f"Laplace approximation of the collapsed posterior of {what}: the parameters from "
              "the normal distribution at their mode with the inverse Hessian as covariance "
              "(Laplace noise as Gaussian of its variance), the tables from their normal "
              f"relaxation given them; {MEASURED_COVERAGE}")
    return LaplaceFit(draws, found, time.perf_counter() - start, "laplace", reason,
                      tuple(model_args), dict(model_kwargs))


def _collapsed(model: Any, model_args: tuple, model_kwargs: dict, init: Any) -> tuple:
    """``(handled model, args, kwargs, Gibbs sites' fixed values, init strategy, what)``."""
    values = init_values(model, init)
    what = "your model"
    if isinstance(model, NoisyMarginalsModel):
        unable = collapsed_unable(model)
        if unable is not None:
            raise ValueError(f"run_laplace integrates the tables out, and cannot here: {unable}")
        if isinstance(init, str) and isinstance(model.coding, ConditionalCoding):
            values = {**values, "phi": released_log_odds(model)}
        model_kwargs = {"y": observed_answers(model, model_args, model_kwargs)}
        model, model_args, what = model.with_cgm(False), (), "the library's model"
    try:
        plan = collapse_plan(model, model_args, model_kwargs)
    except CountSiteError as e:
        raise ValueError(f"run_laplace integrates the tables out, and cannot here: {e}") from None
    names = ", ".join(repr(s.name) for s in plan.sites)
    return (collapse(model, plan), tuple(model_args), dict(model_kwargs),
            collapse_gibbs_values(plan), init_to_interior(values=values, radius=0.0),
            f"{what} (its site(s) {names} integrated out)")
