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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._cache import LRUCache
from ..distributions.mrf import MarkovRandomField
from ..distributions.relaxation import warn_if_leaky
from ..infer.bayes import noisy_marginals_model, run_nuts
from ..infer.estep import estep_engine
from ..infer.result import Result, total_extras
from ..measurements import Measurement
from ..network import MarkovNetwork
from ..oracles import junction_tree as jt
from .cgm_em import em_start
from .contract import (
    check_max_iters,
    estimator,
    resolve_init,
    resolve_release,
    stochastic_key,
)
from .naive import fit_mle

__all__ = ["posterior_mean"]

Array = Any

_MODELS: LRUCache = LRUCache(32)  # the last 32 releases' models (keyed by scales and N too)


def _bayes_model(network: MarkovNetwork, measurements: Sequence[Measurement], total_count: int,
                 prior_scale: float) -> Any:
    """The Bayesian model, one object per release structure (so compiled code is reused); the
    prior sits on the reference coding at level 0, which does not depend on the released values
    (the conditional coding's released reference levels would)."""
    model = noisy_marginals_model(network, measurements, total_count, prior_scale=prior_scale,
                                  triangulate=True, record_marginals=False, coding="reference")
    key = (network, model.total_count, model.noise_family, tuple(model.noise_scales.tolist()),
           float(prior_scale),
           tuple((m.clique, None if m.query is None else np.asarray(m.query).tobytes())
                 for m in model.measurements))
    return _MODELS.setdefault(key, model), jnp.asarray(model.y)


@estimator("posterior-mean")
def posterior_mean(
    measurements: Sequence[Measurement],
    network_or_domain: MarkovNetwork | Mapping[str, int],
    *,
    total_count: float | None = None,
    rng_key: Any = None,
    init: str | MarkovRandomField | Array | None = None,
    max_iters: int | None = None,
    callback: Callable[[int, float], None] | None = None,
    method: str = "svi",
    prior_scale: float = 3.0,
    num_warmup: int = 500,
    num_chains: int = 1,
    learning_rate: float = 0.02,
    svi_draws: int = 256,
) -> Result:
    """Fit the max-ent model to the posterior mean of the clique marginals.

    Parameters
    ----------
    measurements : sequence of Measurement
        Noisy answers (one noise family).
    network_or_domain, total_count :
        As :func:`~numpyro_dpgm.estimation.variational_em.variational_em`.
    rng_key : JAX PRNG key
        The sampler's or optimiser's randomness; required (a ``TypeError`` without it).
    init : None, "uniform", "em", MarkovRandomField or array
        Starting point. ``None`` or ``"uniform"``: uniform tables and ``φ = 0`` (the only start
        of the SVI guide). With ``method="nuts"`` also ``"em"``, the NLBP-EM estimate
        (:func:`~numpyro_dpgm.estimation.cgm_em.em_start`), or a warm start from a previous
        fit's model or log-potentials θ (the chains start at ``φ(θ)`` and ``n = N·μ(θ)``).
    max_iters : int, optional
        The main loop: SVI steps (``method="svi"``, default 2000) or NUTS draws per chain after
        the warm-up (``method="nuts"``, default 500).
    callback : callable ``(iteration, loss) -> None``, optional
        Called once after the main loop with every entry of ``loss_trace`` (the loop runs
        compiled, in one piece).
    method : {"svi", "nuts"}
        How the posterior mean is computed (see the module notes).
    prior_scale : float
        Standard deviation of the Normal prior on each reference-coded parameter.
    num_warmup, num_chains :
        NUTS options.
    learning_rate, svi_draws :
        SVI options (``AutoNormal`` guide; ``svi_draws`` guide draws average ``μ``).

    Returns
    -------
    Result
        ``loss_trace``: SVI: the negative ELBO (single-particle estimate) at the start and
        after every step, ``iterations + 1`` values; NUTS: the potential energy of every draw
        (chains concatenated). ``iterations``: SVI steps or NUTS draws per chain. ``extras``:
        ``total_count``, ``total_count_estimated``, ``init``, ``mu_mean`` (posterior mean of
        the marginals, network layout),
        ``mu_sd`` (their posterior sd), ``maxent_grad_norm`` (how well the returned model
        matches ``mu_mean``), ``method``, ``relaxation_leak`` (the largest
        :func:`~numpyro_dpgm.distributions.relaxation.relaxation_leak` at the returned model; above
        0.01 a :class:`~numpyro_dpgm.distributions.relaxation.RelaxationWarning` is issued);
        NUTS adds ``divergences``.
    """
    start = time.perf_counter()
    release = resolve_release(measurements, network_or_domain, total_count).integer_total()
    network, measurements = release.network, release.measurements
    total_count, estimated = release.total, release.total_estimated
    if method not in ("svi", "nuts"):
        raise ValueError(f"method must be 'svi' or 'nuts', got {method!r}")
    steps = check_max_iters((2000 if method == "svi" else 500) if max_iters is None
                            else max_iters)
    init = resolve_init(init, network, named=("uniform", "em"))
    if method == "svi" and init not in (None, "uniform"):
        raise ValueError("the SVI guide starts at uniform tables: init must be None or "
                         f"'uniform' with method='svi', got {init!r}; use method='nuts' to "
                         "start from 'em' or a previous fit")
    how = "given" if init is not None and not isinstance(init, str) else (init or "uniform")
    key = stochastic_key(rng_key, "posterior_mean")
    model, y = _bayes_model(network, measurements, total_count, prior_scale)
    extras: dict[str, Any] = {"method": method, "init": how,
                              **total_extras(total_count, estimated)}
    if method == "nuts":
        if how == "em":
            start_values: Any = em_start(model)
        elif how == "given":
            latent = model.latent_network
            start_values = {"phi": model.coding.from_theta(init), "n": total_count
                            * latent.flatten(jt.marginals(latent, model.latent_theta(init)))}
        else:
            start_values = "uniform"
        mcmc = run_nuts(model, key, num_warmup=num_warmup, num_samples=steps,
                        num_chains=num_chains, init=start_values, chain_method="vectorized",
                        max_tree_depth=8)
        phi = mcmc.get_samples()["phi"]
        loss = np.asarray(mcmc.get_extra_fields()["potential_energy"])
        extras["divergences"] = int(np.sum(mcmc.get_extra_fields()["diverging"]))
    else:
        options = dict(guide="normal", first_steps=steps, steps=steps,
                       learning_rate=learning_rate, mean_draws=1)
        engine = estep_engine("variational", model, "n", options)
        k_fit, k_draw = jax.random.split(key)
        engine(k_fit, {}, (y,), {})
        phi = _guide_draws(engine.guide, svi_draws, k_draw, engine.svi.get_params(engine.state),
                           y)
        # numpyro's per-step loss is taken before each update: append the final point's
        final = engine.svi.evaluate(engine.state, {}, y)
        loss = np.append(engine.losses, float(final))
    mu = _marginals(network, model.coding, phi)
    mu_mean, mu_sd = jnp.mean(mu, axis=0), jnp.std(mu, axis=0)
    fit = fit_mle(network, mu_mean, 0.0, max_iters=2000)
    extras.update(mu_mean=np.asarray(mu_mean), mu_sd=np.asarray(mu_sd),
                  maxent_grad_norm=fit.extras["grad_norm"],
                  relaxation_leak=warn_if_leaky(
                      model.latent_network, model.latent_theta(fit.model.theta), total_count,
                      "posterior_mean", stacklevel=3))
    if callback is not None:
        for k, value in enumerate(loss):
            callback(k, float(value))
    return Result(model=fit.model, loss_trace=loss,
                  iterations=steps if method == "svi" else int(len(loss)),
                  converged=bool(fit.converged), elapsed=time.perf_counter() - start,
                  extras=extras)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _guide_draws(guide: Any, draws: int, key: Any, svi_params: dict, y: Array) -> Array:
    return guide.sample_posterior(key, svi_params, {}, y, sample_shape=(draws,))["phi"]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _marginals(network: MarkovNetwork, coding: Any, phi: Array) -> Array:
    return jax.vmap(lambda p: network.flatten(jt.marginals(network, coding.to_theta(p))))(phi)
