"""Variational EM on the relaxed collective graphical model: learn from ``E_q[n]``, not the mode.

Seed 002's EM (Algorithm 2) puts the *mode* of ``p(n | y; θ_t)`` (NLBP, Eq. 6) into the M-step.
The E-step that the EM derivation asks for is the posterior *mean*: the expected complete-data
log-likelihood ``E[θ·n − N·A(θ) | y; θ_t]`` is linear in ``n``, so its maximiser moment-matches
``μ(θ_{t+1}) = E[n | y; θ_t] / N``. Here that mean is approximated by variational inference on
the NumPyro model

.. code-block:: python

    theta = numpyro.param("theta", theta0)                         # network layout
    n = numpyro.sample("n", CollectiveGraphicalModel(latent_net, embed(theta), N, relaxed=True))
    numpyro.sample("y", LaplaceNoise(Q n, b), obs=y)                # or GaussianNoise

(:func:`latent_counts_model`). ``n`` lives on the scaled marginal polytope of the network, or of
its triangulation when the network is not decomposable (the junction-tree cliques' tables; the
released tables are their projections; ``embed`` writes ``θ`` into that layout without changing
``p_θ``). The guide is NumPyro's ``AutoNormal`` (or ``AutoMultivariateNormal``) in the
unconstrained coordinates of the junction-tree stick-breaking bijection: a Gaussian there is a
logistic-normal on each conditional table, which matches the shape of the hyper-multinomial's
conditional multinomials (notes/measured.md §2: NUTS and these guides run unchanged on it).

**Alternating maximisation of the ELBO.** E-step: Adam steps on the guide with ``θ`` held fixed
(warm-started from the previous E-step's guide); ``E_q[n]`` by Monte Carlo over guide draws.
M-step: moment matching on ``E_q[n]`` (closed form on decomposable networks, L-BFGS on
``θ·E_q[n] − N·A(θ)`` otherwise). Both steps raise the ELBO
``E_q[log p(n; θ) + log p(y | n)] + H(q)`` (the M-step exactly, since the ELBO depends on ``θ``
only through ``θ·E_q[n] − N·A(θ)``), so this is coordinate ascent on the ELBO. The loop is
:class:`numpyro_dpgm.infer.EM` with ``estep="variational"``, which runs on any model of that
shape.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
import numpyro

from .._cache import LRUCache
from ..distributions.cgm import CollectiveGraphicalModel
from ..distributions.mrf import MarkovRandomField
from ..distributions.noise import GaussianNoise, LaplaceNoise
from ..distributions.relaxation import warn_if_leaky
from ..infer.bayes import noisy_marginals_model
from ..infer.em import EM
from ..infer.result import Result, total_extras
from ..measurements import Measurement
from ..network import MarkovNetwork
from .contract import (
    Release,
    check_max_iters,
    estimator,
    resolve_init,
    resolve_release,
    stochastic_key,
)
from .losses import measurement_nll
from .naive import naive_fit

__all__ = [
    "initial_theta",
    "latent_counts_model",
    "model_arguments",
    "run_em_estimator",
    "variational_em",
]

Array = Any


# ------------------------------------------------------------------------------------------------
# the model
# ------------------------------------------------------------------------------------------------
def latent_counts_model(
    network: MarkovNetwork,
    measurements: Sequence[Measurement],
    total_count: int,
    *,
    relaxed: bool = True,
) -> Callable[..., None]:
    """The NumPyro model ``model(y)`` of a release with ``θ`` a ``numpyro.param`` (for EM).

    Sites: ``theta`` (param, the network's layout), ``n`` (CGM, relaxed or exact, on the
    network or its triangulation, :func:`~numpyro_dpgm.distributions.constraints.triangulated`),
    ``y`` (observed: every measurement's answers, Laplace- or Gaussian-family noise).

    Parameters
    ----------
    network : MarkovNetwork
        Any network; when it is not decomposable, ``n`` holds the tables of its
        triangulation's junction-tree cliques.
    measurements : sequence of Measurement
        One noise family (as :func:`numpyro_dpgm.infer.bayes.noisy_marginals_model`).
    total_count : int
    relaxed : bool
        A relaxed CGM site (the sampling and variational E-steps) or an exact one (the exact
        E-step's record swaps).

    Returns
    -------
    callable
        ``model(y, scales, N)`` with ``y`` the concatenated answers, ``scales`` their noise
        scales (:func:`model_arguments` gives both and ``N`` for this release); ``theta``
        starts at zero (pass ``init_params`` to EM). Attribute ``readout``: the
        :class:`~numpyro_dpgm.infer.bayes.NoisyMarginalsModel` that maps ``n`` to the answers and
        holds ``latent_network``. Models are cached by the release's structure (network,
        measured cliques and queries, noise family), so compiled samplers are reused across
        releases of the same shape, whatever their noise scales and ``N`` (NUTS; the variational
        guide is built per ``N``, see :func:`~numpyro_dpgm.infer.estep.estep_engine`).
    """
    readout = noisy_marginals_model(network, measurements, total_count,
                                    theta=jnp.zeros(network.num_params), triangulate=True,
                                    record_marginals=False)
    key = (network, readout.noise_family, bool(relaxed),
           tuple((m.clique, None if m.query is None else np.asarray(m.query).tobytes())
                 for m in readout.measurements))
    model = _MODELS.get(key)
    if model is None:
        model = _MODELS[key] = _make_model(readout, bool(relaxed))
    model.readout = readout  # type: ignore[attr-defined]
    return model


_MODELS: LRUCache = LRUCache(32)  # the last 32 release structures' models


def _make_model(readout: Any, relaxed: bool) -> Callable[..., None]:
    noise = LaplaceNoise if readout.noise_family == "laplace" else GaussianNoise
    net, latent = readout.network, readout.latent_network

    def model(y: Array, scales: Array, total: Array) -> None:
        theta = numpyro.param("theta", jnp.zeros(net.num_params))
        n = numpyro.sample("n", CollectiveGraphicalModel(
            latent, readout.latent_theta(theta), total, relaxed=relaxed))
        numpyro.sample("y", noise(readout.predict(n), scales), obs=y)

    return model


def model_arguments(model: Callable[..., None]) -> tuple[Array, Array, Array]:
    """The arguments ``(y, scales, N)`` of a :func:`latent_counts_model` for its release."""
    r = model.readout  # type: ignore[attr-defined]
    return (jnp.asarray(r.y), jnp.asarray(r.noise_scales),
            jnp.asarray(float(r.total_count)))


# ------------------------------------------------------------------------------------------------
# the estimator
# ------------------------------------------------------------------------------------------------
def initial_theta(release: Release, init: Any) -> tuple[Array, str]:
    """``θ₀`` for EM: ``None``/``"naive"`` (naive MLE, default L2 rule), ``"zeros"``, or a
    warm start (a :class:`MarkovRandomField` over the release's network or log-potentials)."""
    network = release.network
    init = resolve_init(init, network, named=("naive", "zeros"))
    if init is None or init == "naive":
        return naive_fit(release).model.theta, "naive"
    if isinstance(init, str):
        return jnp.zeros(network.num_params), "zeros"
    return init, "given"


def run_em_estimator(
    measurements: Sequence[Measurement], network_or_domain: Any, total_count: float | None,
    init: Any, rng_key: Any, max_iters: int, tol: float, estep: str,
    estep_options: dict, callback: Callable[[int, float], None] | None = None,
) -> Result:
    """Shared body of :func:`variational_em` and :func:`~numpyro_dpgm.estimation.mcem.mcem`."""
    start = time.perf_counter()
    name = {"variational": "variational_em", "mcmc": "mcem", "exact": "mcem"}[estep]
    release = resolve_release(measurements, network_or_domain, total_count).integer_total()
    network, measurements = release.network, release.measurements
    total, estimated = release.total, release.total_estimated
    max_iters = check_max_iters(max_iters)
    key = stochastic_key(rng_key, name)
    theta0, how = initial_theta(release, init)
    model = latent_counts_model(network, measurements, total, relaxed=estep != "exact")
    readout = model.readout  # type: ignore[attr-defined]
    leak = (None if estep == "exact" else  # no relaxation to leak
            warn_if_leaky(readout.latent_network, readout.latent_theta(theta0), total, name,
                          stacklevel=4))
    nll = measurement_nll(network, measurements, total)
    losses = [nll(theta0)]

    def record(iteration: int, params: dict) -> None:
        losses.append(nll(params["theta"]))
        if callback is not None:
            callback(iteration, losses[-1])

    em = EM(model, latent="n", max_iters=max_iters, tol=tol, estep=estep,
            estep_options=estep_options)
    fit = em.run(key, *model_arguments(model), init_params={"theta": theta0}, callback=record)
    theta = fit.params["theta"]
    return Result(
        model=MarkovRandomField(network, theta),
        loss_trace=np.asarray(losses),
        iterations=fit.iterations,
        converged=fit.converged,
        elapsed=time.perf_counter() - start,
        extras={"n_hat": fit.extras["n"], "marginal_change": fit.extras["marginal_change"],
                "estep_objective": fit.loss_trace, "init": how,
                "latent_network": readout.latent_network, "estep": estep,
                "relaxation_leak": leak, **total_extras(total, estimated)},
    )


@estimator("variational-em")
def variational_em(
    measurements: Sequence[Measurement],
    network_or_domain: MarkovNetwork | Mapping[str, int],
    *,
    total_count: float | None = None,
    rng_key: Any = None,
    init: str | MarkovRandomField | Array | None = None,
    max_iters: int = 10,
    callback: Callable[[int, float], None] | None = None,
    guide: str = "normal",
    first_steps: int = 1000,
    steps: int = 200,
    learning_rate: float = 0.05,
    num_particles: int = 1,
    mean_draws: int = 256,
    tol: float = 1e-4,
) -> Result:
    """Learn an MRF from noisy clique tables by variational EM on the relaxed CGM.

    Parameters
    ----------
    measurements : sequence of Measurement
        Noisy answers (one noise family); every measured clique must lie in a clique of
        the network.
    network_or_domain : MarkovNetwork, Domain or mapping attribute -> size
        Any network (not decomposable: the latent counts are its triangulation's tables);
        given a domain, the maximal measured cliques.
    total_count : float, optional
        ``N`` (public); ``None`` estimates it from the measurements (no privacy cost), rounded
        to an integer (the latent counts sum to ``N``).
    rng_key : JAX PRNG key
        The SVI runs' randomness; required (a ``TypeError`` without it).
    init : None, "naive", "zeros", MarkovRandomField or array
        ``θ₀``: naive MLE with its default L2 rule (``None`` or ``"naive"``), uniform
        (``"zeros"``), or a warm start (a previous fit's model or log-potentials).
    max_iters : int
        EM iterations, the main loop (E-step: SVI on the guide; M-step: moment matching on
        ``E_q[n]``).
    callback : callable ``(iteration, loss) -> None``, optional
        Called after every EM iteration ``t = 1, 2, ...`` with ``loss_trace[t]``.
    guide, first_steps, steps, learning_rate, num_particles, mean_draws :
        :class:`~numpyro_dpgm.infer.estep.VariationalEStep` options.
    tol : float
        Stop when the model's clique marginals move by less than ``tol`` (L1, per clique).

    Returns
    -------
    Result
        ``loss_trace``: the measurements' negative log-likelihood at the model's expected
        counts, ``L(N·μ(θ_t))`` for ``t = 0..iterations``
        (:func:`~numpyro_dpgm.estimation.losses.measurement_nll`); ``extras``:
        ``estep_objective`` (the ELBO of each E-step), ``n_hat`` (last ``E_q[n]``, latent
        layout), ``latent_network``, ``marginal_change``, ``init``, ``total_count``,
        ``total_count_estimated``, ``relaxation_leak`` (largest
        :func:`~numpyro_dpgm.distributions.relaxation.relaxation_leak` at ``θ₀``;
        above 0.01 a :class:`~numpyro_dpgm.distributions.relaxation.RelaxationWarning` is
        issued).
    """
    options = dict(guide=guide, first_steps=first_steps, steps=steps,
                   learning_rate=learning_rate, num_particles=num_particles,
                   mean_draws=mean_draws)
    return run_em_estimator(measurements, network_or_domain, total_count, init, rng_key,
                            max_iters, tol, "variational", options, callback)
