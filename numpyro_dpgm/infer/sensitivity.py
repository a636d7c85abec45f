"""Prior sensitivity of a NUTS run in one call: power-scaling the prior and the likelihood.

:func:`prior_sensitivity` computes, for every draw of a finished run, the log density of the
prior (every latent sample site but the count tables: ``φ``, hyperparameters) and of the
likelihood (the count tables given ``θ`` and the releases given the tables), and hands them to
ArviZ's power-scaling sensitivity check (Kallioinen, Paananen, Bürkner & Vehtari 2023,
"Detecting and diagnosing prior and likelihood sensitivity with power-scaling", Statistics and
Computing 34: the cumulative Jensen–Shannon distance of each posterior quantity when the prior,
or the likelihood, is raised to the power α ∈ {0.99, 1.01}, by Pareto-smoothed importance
weights). A quantity whose prior sensitivity is at or above the threshold (0.05) while its
likelihood sensitivity is below says "the prior decides this, not the release": the rare cells of
many-level tables, where a Normal prior on log odds lifts cells that expect under one record.
No refit is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from numpyro import handlers
from numpyro.infer import MCMC

from ..distributions.cgm import CollectiveGraphicalModel
from .bayes.count_sites import inner_distribution

__all__ = ["log_prior_likelihood", "prior_sensitivity"]

Array = Any


def _is_table(site: dict) -> bool:
    return isinstance(inner_distribution(site["fn"]), CollectiveGraphicalModel)


def log_prior_likelihood(model: Any, draws: dict, model_args: tuple = (),
                         model_kwargs: dict | None = None) -> tuple[Array, Array]:
    """Per draw, ``(log prior, log likelihood)`` of ``model`` at ``draws``.

    The prior is the sum of the log densities of the latent sample sites that are not count
    tables; the likelihood that of the count tables (CGM sites) and the observed sites.

    Parameters
    ----------
    model : callable
    draws : dict site -> array ``(S, ...)``
    model_args, model_kwargs
        As the run got them.

    Returns
    -------
    two arrays ``(S,)``
    """
    kwargs = dict(model_kwargs or {})

    def one(draw: dict) -> tuple[Array, Array]:
        seeded = handlers.seed(handlers.substitute(model, data=draw), jax.random.key(0))
        tr = handlers.trace(seeded).get_trace(*model_args, **kwargs)
        prior, lik = jnp.zeros(()), jnp.zeros(())
        for site in tr.values():
            if site["type"] != "sample":
                continue
            term = jnp.sum(site["fn"].log_prob(site["value"]))
            if site["is_observed"] or _is_table(site):
                lik = lik + term
            else:
                prior = prior + term
        return prior, lik

    return jax.lax.map(one, draws)


def prior_sensitivity(mcmc: MCMC, *, var_names: Sequence[str] | None = None,
                      threshold: float = 0.05) -> pd.DataFrame:
    """Power-scaling prior and likelihood sensitivity of every quantity of a finished run.

    Parameters
    ----------
    mcmc : numpyro.infer.MCMC
        A finished run (of :func:`~numpyro_dpgm.infer.bayes.run_nuts` or by hand), of any
        model with this library's distributions.
    var_names : sequence of str, optional
        The sites to check (default every latent and deterministic site).
    threshold : float
        The sensitivity at or above which ArviZ flags a quantity (its default 0.05).

    Returns
    -------
    pandas.DataFrame
        ArviZ's ``psense_summary``: per quantity its ``prior`` and ``likelihood`` sensitivity
        and a ``diagnosis`` (``"potential strong prior / weak likelihood"``, ``"potential
        prior-data conflict"`` or ``"✓"``).
    """
    model = mcmc.sampler.model
    flat = mcmc.get_samples()
    chains, draws = next(iter(mcmc.get_samples(group_by_chain=True).values())).shape[:2]
    prior, lik = log_prior_likelihood(model, dict(flat), tuple(mcmc._args),
                                      dict(mcmc._kwargs))
    shape = (chains, draws)
    posterior = {k: np.asarray(v).reshape(shape + v.shape[1:]) for k, v in flat.items()
                 if var_names is None or k in var_names}
    tree = az.from_dict({"posterior": posterior,
                         "log_prior": {"prior": np.asarray(prior).reshape(shape)},
                         "log_likelihood": {"likelihood": np.asarray(lik).reshape(shape)}})
    return az.psense_summary(tree, threshold=threshold)
