"""Monte-Carlo EM on the relaxed collective graphical model, or on the exact one.

E-step: the mean of NUTS draws of the latent count tables ``n`` from ``p(n | y; θ_t)`` (the
relaxed CGM with the ``lgamma`` density, sampled through the junction-tree stick-breaking
bijection); M-step: moment matching ``μ(θ_{t+1}) = n̄_t / N`` (seed 002, Algorithm 2 with the
posterior mean in place of NLBP's mode; Wei & Tanner 1990 for Monte-Carlo EM). The chain is
warm-started: the first E-step adapts step size and mass matrix, later ones continue from the
last state of the previous chain (its adapted step size) without new warm-up, and the number of
draws grows with the iteration (few early, when ``θ_t`` is far from the fixed point and
Monte-Carlo error is irrelevant; more later, when it dominates the step).

On a network that is not decomposable, ``n`` holds the tables of its triangulation's
junction-tree cliques (see :func:`~numpyro_dpgm.estimation.variational_em.latent_counts_model`).
The loop is :class:`numpyro_dpgm.infer.EM` with ``estep="mcmc"``.

With ``counts="exact"`` the E-step is the mean of exact draws of the integer tables from the
exact CGM posterior ``p(n | y; θ_t)`` instead (record swaps, :class:`~numpyro_dpgm.infer.estep.
ExactEStep`; the records are kept from one E-step to the next), with no relaxation and hence
no mass moved into near-empty cells (``estep="exact"``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..distributions.mrf import MarkovRandomField
from ..infer.result import Result
from ..measurements import Measurement
from ..network import MarkovNetwork
from .contract import estimator
from .variational_em import run_em_estimator

__all__ = ["mcem"]

Array = Any


@estimator("mcem")
def mcem(
    measurements: Sequence[Measurement],
    network_or_domain: MarkovNetwork | Mapping[str, int],
    *,
    total_count: float | None = None,
    rng_key: Any = None,
    init: str | MarkovRandomField | Array | None = None,
    max_iters: int = 10,
    callback: Callable[[int, float], None] | None = None,
    num_warmup: int = 200,
    first_draws: int = 25,
    last_draws: int = 400,
    growth: float = 2.0,
    max_tree_depth: int = 8,
    chunk: int = 25,
    tol: float = 1e-4,
    counts: str = "relaxed",
    burn_in: int = 50,
    moves: int | None = None,
) -> Result:
    """Learn an MRF from noisy clique tables by Monte-Carlo EM on the relaxed CGM.

    Parameters
    ----------
    measurements : sequence of Measurement
        Noisy answers (one noise family); every measured clique must lie in a clique of
        ``network``.
    network_or_domain, total_count, init :
        As :func:`~numpyro_dpgm.estimation.variational_em.variational_em`.
    rng_key : JAX PRNG key
        The chains' randomness; required (a ``TypeError`` without it).
    max_iters : int
        EM iterations, the main loop.
    callback : callable ``(iteration, loss) -> None``, optional
        Called after every EM iteration ``t = 1, 2, ...`` with ``loss_trace[t]``.
    num_warmup, first_draws, last_draws, growth, max_tree_depth, chunk :
        :class:`~numpyro_dpgm.infer.estep.MCMCEStep` options (draws per E-step:
        ``min(last, first·growth^t)``, rounded up to multiples of ``chunk``).
    counts : {"relaxed", "exact"}
        The E-step: NUTS on the relaxed CGM (:class:`~numpyro_dpgm.infer.estep.MCMCEStep`,
        options ``num_warmup``, ``max_tree_depth``), or exact record swaps on the integer
        tables (:class:`~numpyro_dpgm.infer.estep.ExactEStep`, options ``burn_in``, ``moves``;
        no relaxation, so no leak into near-empty cells).
    burn_in, moves :
        :class:`~numpyro_dpgm.infer.estep.ExactEStep` options (``counts="exact"``).
    tol : float
        Stop when the model's clique marginals move by less than ``tol`` (L1, per clique);
        Monte-Carlo error keeps the change above a few ``/√draws``, so MCEM usually runs its
        ``max_iters``.

    Returns
    -------
    Result
        ``loss_trace``: the measurements' negative log-likelihood at the model's expected
        counts, ``L(N·μ(θ_t))`` for ``t = 0..iterations``; ``extras``: ``estep_objective``
        (the mean log joint density of each E-step's draws), ``n_hat`` (last E-step's mean),
        ``latent_network``, ``marginal_change``, ``init``, ``total_count``,
        ``total_count_estimated``,
        ``relaxation_leak`` (as :func:`~numpyro_dpgm.estimation.variational_em.variational_em`).
    """
    if counts == "exact":
        options = dict(first_draws=first_draws, last_draws=last_draws, growth=growth,
                       burn_in=burn_in, moves=moves, chunk=chunk)
        return run_em_estimator(measurements, network_or_domain, total_count, init, rng_key,
                                max_iters, tol, "exact", options, callback)
    if counts != "relaxed":
        raise ValueError(f"counts must be 'relaxed' or 'exact', got {counts!r}")
    options = dict(num_warmup=num_warmup, first_draws=first_draws, last_draws=last_draws,
                   growth=growth, max_tree_depth=max_tree_depth, chunk=chunk)
    return run_em_estimator(measurements, network_or_domain, total_count, init, rng_key,
                            max_iters, tol, "mcmc", options, callback)
