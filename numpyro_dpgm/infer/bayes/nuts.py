"""NUTS on a model with a relaxed CGM site, started from an interior point."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
from numpyro.infer import MCMC, NUTS

from ..._deprecation import renamed_key
from .initialization import _init_values, init_to_interior
from .model import NoisyMarginalsModel

__all__ = ["NUTS_FIELDS", "run_nuts"]

Array = Any

#: Statistics :func:`run_nuts` collects per draw (besides ``diverging``), for ArviZ.
NUTS_FIELDS = ("num_steps", "accept_prob", "potential_energy", "energy", "adapt_state.step_size")


@renamed_key
def run_nuts(
    model: NoisyMarginalsModel | Callable[..., Any],
    rng_key: jax.Array,
    *model_args: Any,
    num_warmup: int = 500,
    num_samples: int = 500,
    num_chains: int = 4,
    init: str | Mapping[str, Array] = "uniform",
    radius: float = 0.5,
    chain_method: str = "sequential",
    progress_bar: bool = False,
    target_accept_prob: float = 0.8,
    dense_mass: bool = False,
    max_tree_depth: int = 10,
    **model_kwargs: Any,
) -> MCMC:
    """Run NUTS on a model with a relaxed CGM site from an interior starting point.

    Parameters
    ----------
    model : NoisyMarginalsModel or callable
        Any NumPyro model.
    rng_key : JAX PRNG key
    *model_args, **model_kwargs
        Passed to the model (e.g. ``y=`` for a simulated release).
    num_warmup, num_samples, num_chains : int
    init : "uniform" or mapping site -> value
        Centre of the starting points: uniform tables and ``φ = 0`` (a
        :class:`NoisyMarginalsModel`'s sites); or given constrained values, such as the NLBP-EM
        estimate :func:`numpyro_dpgm.estimation.cgm_em.em_start`.
    radius : float
        Jitter of each chain's start in the unconstrained space (:func:`init_to_interior`).
    chain_method : {"sequential", "parallel", "vectorized"}
    progress_bar : bool
    target_accept_prob, dense_mass, max_tree_depth :
        NUTS options.

    Returns
    -------
    numpyro.infer.MCMC
        After ``run``; ``mcmc.get_samples()`` holds every latent and deterministic site and
        ``mcmc.get_extra_fields()`` the statistics :data:`NUTS_FIELDS` and ``diverging``.
    """
    values = _init_values(model, init)
    kernel = NUTS(model, init_strategy=init_to_interior(values=values, radius=radius),
                  target_accept_prob=target_accept_prob, dense_mass=dense_mass,
                  max_tree_depth=max_tree_depth)
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method=chain_method, progress_bar=progress_bar)
    mcmc.run(rng_key, *model_args, extra_fields=NUTS_FIELDS, **model_kwargs)
    return mcmc
