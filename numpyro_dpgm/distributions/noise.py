"""Observation models of released tables: independent noise on every cell (event dim 1)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpyro.distributions as dist

__all__ = ["LaplaceNoise", "GaussianNoise"]


class LaplaceNoise(dist.Independent):
    """``y_i = loc_i + Laplace(0, scale)`` independently for every cell.

    ``loc`` is typically the latent count vector ``n`` (or a linear query of it), so that
    ``log p(y | n) = −||y − n||₁ / b − m log(2b)`` (seed 002, Eq. 3).

    Parameters
    ----------
    loc : array ``(..., m)``
    scale : float or array broadcastable to ``loc``
        The Laplace scale ``b`` (sensitivity / ε for the Laplace mechanism).
    """

    def __init__(self, loc: Any, scale: Any, *, validate_args: bool | None = None):
        loc = jnp.asarray(loc)
        if loc.ndim < 1:
            raise ValueError("LaplaceNoise needs a vector loc (one entry per released cell)")
        super().__init__(dist.Laplace(loc, scale), 1, validate_args=validate_args)

    @property
    def scale(self) -> Any:
        return self.base_dist.scale

    def smoothed_log_prob(self, value: Any, width: float) -> Any:
        """Log density with the kink of ``|r|`` replaced by a Huber function of width ``width``.

        ``ρ_δ(r) = r²/(2δ)`` for ``|r| ≤ δ`` and ``|r| − δ/2`` beyond, so the gradient
        ``clip(r/δ, −1, 1)/b`` is continuous (seed 002's NLBP with a smoothed evidence term;
        ``width → 0`` recovers the Laplace log density up to a constant).
        """
        r = jnp.abs(value - self.base_dist.loc)
        huber = jnp.where(r <= width, r**2 / (2 * width), r - width / 2)
        b = self.base_dist.scale
        return jnp.sum(-huber / b - jnp.log(2 * b), axis=-1)


class GaussianNoise(dist.Independent):
    """``y_i = loc_i + Normal(0, scale)`` independently for every cell."""

    def __init__(self, loc: Any, scale: Any, *, validate_args: bool | None = None):
        loc = jnp.asarray(loc)
        if loc.ndim < 1:
            raise ValueError("GaussianNoise needs a vector loc (one entry per released cell)")
        super().__init__(dist.Normal(loc, scale), 1, validate_args=validate_args)

    @property
    def scale(self) -> Any:
        return self.base_dist.scale
