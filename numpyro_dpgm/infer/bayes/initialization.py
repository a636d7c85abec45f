"""Starting points of the samplers: interior values of a relaxed CGM site, jittered per chain."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpyro.distributions as dist
from numpyro.distributions.transforms import biject_to
from numpyro.infer.initialization import init_to_median, init_to_uniform

from ...distributions.constraints import ScaledMarginalPolytope
from .model import NoisyMarginalsModel

__all__ = ["init_to_interior"]

Array = Any


def init_to_interior(
    site: dict | None = None,
    values: Mapping[str, Array] | None = None,
    radius: float = 0.5,
) -> Any:
    """Initialisation strategy: given interior values, jittered in the unconstrained space.

    For a latent site with a value in ``values``: ``T(T⁻¹(value) + U(−radius, radius))`` with
    ``T = biject_to(support)``, drawn from the site's random key (so every chain starts at its
    own point). A relaxed CGM site without a value starts from uniform tables ``N / |X_C|``
    jittered likewise, a site marked ``infer={"init_to_mean": True}`` (the normal relaxation's
    ``z``) from its mean; other sites fall back to :func:`numpyro.infer.init_to_uniform`, or
    with ``radius=0`` to :func:`numpyro.infer.init_to_median` (the start of a search for the
    posterior's mode: on Adult's 842-cell tree L-BFGS from a uniform draw in ``(−2, 2)`` stalled
    at a point whose curvature was not positive definite, from the prior's median it found the
    mode).

    Exact CGM draws contain zero cells, which the bijection maps to ``−∞``; that is why NumPyro's
    ``init_to_median`` / ``init_to_sample`` fail on a relaxed CGM site and this strategy is used.

    Parameters
    ----------
    values : mapping site name -> constrained value, optional
    radius : float
        Half-width of the jitter (0: start exactly at the values).
    """
    if site is None:
        return functools.partial(init_to_interior, values=values, radius=radius)
    values = {} if values is None else values
    if site["type"] != "sample" or site["is_observed"]:
        return None
    fn = site["fn"]
    support = fn.support
    name = site["name"]
    if name in values:
        center = jnp.broadcast_to(jnp.asarray(values[name]), fn.shape())
    elif isinstance(support, ScaledMarginalPolytope):
        center = support.feasible_like(jnp.zeros(fn.shape()))
    elif site.get("infer", {}).get("init_to_mean"):  # the normal relaxation's z
        center = fn.mean
    elif radius <= 0:  # no jitter: the prior's median, not a draw far out in its support
        return init_to_median(site)
    else:
        return init_to_uniform(site, radius=radius)
    transform = biject_to(support)
    u = transform.inv(center)
    finite = jnp.all(jnp.isfinite(u))
    if not isinstance(finite, jax.core.Tracer) and not bool(finite):
        raise ValueError(
            f"the starting value of site {name!r} is on the boundary of its support (a zero "
            "cell?); start from an interior point such as uniform tables or the NLBP-EM estimate"
        )
    if radius > 0:
        rng_key = site["kwargs"].get("rng_key")
        if rng_key is not None:
            sample_shape = site["kwargs"].get("sample_shape", ())
            u = u + dist.Uniform(-radius, radius)(rng_key=rng_key,
                                                  sample_shape=sample_shape + u.shape)
    return transform(u)


def init_values(model: Any, init: str | Mapping[str, Array]) -> dict[str, Array]:
    if isinstance(model, NoisyMarginalsModel):
        return model.starting_point(init)
    if isinstance(init, str):
        if init == "uniform":
            return {}
        raise ValueError(f"init={init!r} needs a NoisyMarginalsModel; pass a dict of values")
    return dict(init)
