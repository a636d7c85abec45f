"""The posterior mean of the model's marginals as an estimator.

The Bayesian model of :func:`numpyro_dpgm.infer.bayes.noisy_marginals_model` (a Normal prior on
minimal reference-coded parameters ``φ``, ``θ = Mφ``, relaxed CGM counts ``n``, noisy released
tables ``y``) gives a posterior over ``θ``. Under squared error on the clique marginals, the
Bayes estimate is the posterior mean ``μ̄ = E[μ(θ) | y]``. It lies in the marginal polytope (a
convex set containing every ``μ(θ)``), in its relative interior, so a unique member of the
model family matches it: the maximum-entropy distribution with those marginals,
``θ̂ = argmax_θ θ·μ̄ − A(θ)`` (:func:`~numpyro_dpgm.estimation.naive.fit_mle` with no penalty).
That member is the estimate returned as a :class:`~numpyro_dpgm.MarkovRandomField`.

The posterior mean comes from NUTS (``method="nuts"``, :func:`~numpyro_dpgm.infer.bayes.run_nuts`)
or, when NUTS is too slow for the latent dimension, from a mean-field Gaussian guide in the
unconstrained coordinates of ``φ`` and ``n`` (``method="svi"``; an approximation: mean-field
guides under-disperse, but the mean of ``μ`` over the guide still averages over the posterior's
width). On networks that are not decomposable ``n`` holds the tables of the triangulation.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._cache import LRUCache
from ..distributions.relaxation import warn_if_leaky
from ..infer.bayes import noisy_marginals_model, run_nuts
from ..infer.estep import estep_engine
from ..inference import junction_tree as jt
from ..measurements import Measurement
from ..network import MarkovNetwork
from .cgm_em import em_start
from .naive import fit_mle
from .result import Result

__all__ = ["posterior_mean"]

Array = Any

_MODELS: LRUCache = LRUCache(32)  # the last 32 releases' models (keyed by scales and N too)


def _bayes_model(network: MarkovNetwork, measurements: Sequence[Measurement], total_count: int,
                 prior_scale: float) -> Any:
    """The Bayesian model, one object per release structure (so compiled code is reused)."""
    model = noisy_marginals_model(network, measurements, total_count, prior_scale=prior_scale,
                                  triangulate=True, record_marginals=False)
    key = (network, model.total_count, model.noise_family, tuple(model.noise_scales.tolist()),
           float(prior_scale),
           tuple((m.clique, None if m.query is None else np.asarray(m.query).tobytes())
                 for m in model.measurements))
    return _MODELS.setdefault(key, model), jnp.asarray(model.y)


def posterior_mean(
    measurements: Sequence[Measurement],
    network: MarkovNetwork,
    total_count: int,
    method: str = "svi",
    *,
    key: Any = None,
    prior_scale: float = 3.0,
    num_warmup: int = 500,
    num_samples: int = 500,
    num_chains: int = 1,
    svi_steps: int = 2000,
    learning_rate: float = 0.02,
    svi_draws: int = 256,
    init: str = "uniform",
) -> Result:
    """Fit the max-ent model to the posterior mean of the clique marginals.

    Parameters
    ----------
    measurements : sequence of Measurement
        Noisy answers (one noise family).
    network : MarkovNetwork
        Any network (not decomposable: the latent counts are its triangulation's tables).
    total_count : int
        ``N`` (public).
    method : {"svi", "nuts"}
        How the posterior mean is computed (see the module notes).
    key : JAX PRNG key, optional
    prior_scale : float
        Standard deviation of the Normal prior on each reference-coded parameter.
    num_warmup, num_samples, num_chains :
        NUTS options.
    svi_steps, learning_rate, svi_draws :
        SVI options (``AutoNormal`` guide; ``svi_draws`` guide draws average ``μ``).
    init : {"uniform", "em"}
        Starting point of the chains (NUTS): uniform tables and ``φ = 0``, or the NLBP-EM
        estimate (:func:`~numpyro_dpgm.estimation.cgm_em.em_start`). The guide starts
        at uniform tables and ``φ = 0``.

    Returns
    -------
    Result
        ``loss_trace``: the final negative ELBO (SVI) or the potential energy per draw
        (NUTS); ``extras``: ``mu_mean`` (posterior mean of the marginals, network layout),
        ``mu_sd`` (their posterior sd), ``maxent_grad_norm`` (how well the returned model
        matches ``mu_mean``), ``method``, ``relaxation_leak`` (the largest
        :func:`~numpyro_dpgm.distributions.relaxation.relaxation_leak` at the returned model; above
        0.01 a :class:`~numpyro_dpgm.distributions.relaxation.RelaxationWarning` is issued);
        NUTS adds ``divergences``.
    """
    start = time.perf_counter()
    if not isinstance(network, MarkovNetwork):
        raise TypeError(f"network must be a MarkovNetwork, got {type(network).__name__}")
    if method not in ("svi", "nuts"):
        raise ValueError(f"method must be 'svi' or 'nuts', got {method!r}")
    key = jax.random.key(0) if key is None else key
    model, y = _bayes_model(network, measurements, total_count, prior_scale)
    extras: dict[str, Any] = {"method": method}
    if method == "nuts":
        mcmc = run_nuts(model, key, num_warmup=num_warmup, num_samples=num_samples,
                        num_chains=num_chains, init=em_start(model) if init == "em" else init,
                        chain_method="vectorized",
                        max_tree_depth=8)
        phi = mcmc.get_samples()["phi"]
        loss = np.asarray(mcmc.get_extra_fields()["potential_energy"])
        extras["divergences"] = int(np.sum(mcmc.get_extra_fields()["diverging"]))
    else:
        options = dict(guide="normal", first_steps=svi_steps, steps=svi_steps,
                       learning_rate=learning_rate, mean_draws=1)
        engine = estep_engine("variational", model, "n", options)
        k_fit, k_draw = jax.random.split(key)
        res = engine(k_fit, {}, (y,), {})
        phi = _guide_draws(engine.guide, svi_draws, k_draw, engine.svi.get_params(engine.state),
                           y)
        loss = np.asarray([-res.objective])
    mu = _marginals(network, model.coding, phi)
    mu_mean, mu_sd = jnp.mean(mu, axis=0), jnp.std(mu, axis=0)
    fit = fit_mle(network, mu_mean, 0.0, max_iters=2000)
    extras.update(mu_mean=np.asarray(mu_mean), mu_sd=np.asarray(mu_sd),
                  maxent_grad_norm=fit.extras["grad_norm"],
                  relaxation_leak=warn_if_leaky(
                      model.latent_network, model.latent_theta(fit.model.theta), total_count,
                      "posterior_mean", stacklevel=3))
    return Result(model=fit.model, loss_trace=loss, iterations=int(len(loss)),
                  converged=bool(fit.converged), elapsed=time.perf_counter() - start,
                  extras=extras)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _guide_draws(guide: Any, draws: int, key: Any, svi_params: dict, y: Array) -> Array:
    return guide.sample_posterior(key, svi_params, {}, y, sample_shape=(draws,))["phi"]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _marginals(network: MarkovNetwork, coding: Any, phi: Array) -> Array:
    return jax.vmap(lambda p: network.flatten(jt.marginals(network, coding.to_theta(p))))(phi)
