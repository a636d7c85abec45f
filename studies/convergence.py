"""Convergence of NUTS on a small simulated release (R-hat and ESS of the relaxed CGM posterior).

:func:`demo_release` simulates Laplace releases of a 3-attribute chain; :func:`demo_convergence`
runs NUTS on :func:`~numpyro_dpgm.infer.bayes.noisy_marginals_model` of one of them and reports
:func:`~numpyro_dpgm.infer.diagnostics.convergence_report`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np
from numpyro.infer import MCMC

from numpyro_dpgm.distributions.mrf import MarkovRandomField
from numpyro_dpgm.infer.bayes import (
    NoisyMarginalsModel,
    noisy_marginals_model,
    reference_coding,
    run_nuts,
)
from numpyro_dpgm.infer.diagnostics import ConvergenceReport, convergence_report, to_inference_data
from numpyro_dpgm.network import MarkovNetwork
from numpyro_dpgm.privacy.releases import simulate_release

__all__ = ["DemoRelease", "DemoRun", "demo_convergence", "demo_release"]

Array = Any


class DemoRelease(NamedTuple):
    """A small simulated release: the network, the true log-potentials, the true counts and
    the Laplace measurements of every clique table."""

    network: MarkovNetwork
    theta: Array
    counts: Array
    measurements: list
    total_count: int


def demo_release(
    seed: int = 0, total_count: int = 200, epsilon: float = 1.0,
) -> DemoRelease:
    """Simulate a release on a 3-attribute chain ``a(2) – b(3) – c(2)``.

    ``θ`` is drawn from the reference-coded prior with scale 1 (seeded), ``N`` records are drawn
    from ``p_θ``, and both clique tables are released with the Laplace mechanism at ``ε``
    (add/remove neighbours, JAX sampler: a simulation).
    """
    net = MarkovNetwork({"a": 2, "b": 3, "c": 2}, [("a", "b"), ("b", "c")])
    coding = reference_coding(net)
    k_theta, k_rec, k_noise = jax.random.split(jax.random.key(seed), 3)
    theta = coding.to_theta(jax.random.normal(k_theta, (coding.dim,)))
    records = np.asarray(MarkovRandomField(net, theta).sample(k_rec, (total_count,)))
    counts = net.features(records)
    measurements = simulate_release(records, net, epsilon, k_noise, domain=net.domain)
    return DemoRelease(net, theta, counts, measurements, total_count)


class DemoRun(NamedTuple):
    """Output of :func:`demo_convergence`."""

    report: ConvergenceReport
    tree: Any
    mcmc: MCMC
    model: NoisyMarginalsModel
    release: DemoRelease


def demo_convergence(
    seed: int = 0,
    *,
    num_chains: int = 4,
    num_warmup: int = 500,
    num_samples: int = 1000,
    chain_method: str = "sequential",
) -> DemoRun:
    """NUTS on :func:`demo_release`'s model (θ inferred, prior scale 2), with R-hat and ESS.

    Returns
    -------
    DemoRun
        ``report`` (:class:`ConvergenceReport`), ``tree`` (from :func:`to_inference_data`, with
        posterior predictive draws), the ``mcmc`` run, the ``model`` and the ``release``.
    """
    release = demo_release(seed)
    model = noisy_marginals_model(release.network, release.measurements, release.total_count,
                                  prior_scale=2.0, coding="reference")  # θ's prior's coding
    mcmc = run_nuts(model, jax.random.key(seed + 1), num_chains=num_chains,
                    num_warmup=num_warmup, num_samples=num_samples, chain_method=chain_method)
    tree = to_inference_data(mcmc, model, rng_key=jax.random.key(seed + 2))
    return DemoRun(convergence_report(tree), tree, mcmc, model, release)
