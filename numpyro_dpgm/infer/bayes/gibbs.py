"""NUTS for ``θ`` and the exact record-swap update for the integer tables ``n``, in NumPyro.

On a model whose CGM site is exact (``noisy_marginals_model(..., relaxed=False)``) the latent
``n`` is discrete, so NUTS cannot move it. :func:`exact_gibbs_fn` is the ``gibbs_fn`` of
:class:`numpyro.infer.HMCGibbs` that moves it instead, by the exact update of
:mod:`.records` (``K`` Metropolis–Hastings record swaps that leave ``p(n | θ, y)`` invariant):

.. code-block:: python

    kernel = HMCGibbs(NUTS(model), gibbs_fn=exact_gibbs_fn(model), gibbs_sites=["n"])

Each MCMC step then updates ``n`` given ``φ`` (the Gibbs block) and ``φ`` given ``n`` (NUTS on
the exact conditional ``p(φ | n) ∝ p(φ) e^{θ·n − N A(θ)}``, whose gradient is
``Mᵀ(n − N μ(θ))``). Both blocks leave the joint posterior invariant, so the sweep does, and
``mcmc.get_samples()`` holds both sites for ArviZ. :func:`exact_kernel` builds the kernel that
any model with exact CGM sites runs, :class:`~.count_gibbs.CGMGibbs` (NUTS within
:class:`numpyro.infer.Gibbs` with the record moves of :class:`~.count_gibbs.RecordMoves`, which
keep the records between updates instead of dealing them from ``n`` each time, as a stateless
``gibbs_fn`` must), and gives it the non-centred moves of :mod:`.interweave`, which need this
model's coding, as its ``joint_fn`` (:func:`noncentred_fn`). When ``θ`` is fixed, the record
moves alone are the kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from numpyro.infer import NUTS
from numpyro.infer.mcmc import MCMCKernel

from .count_gibbs import CGMGibbs, ExactState, RecordMoves, default_moves
from .interweave import noise_share, noncentred_moves
from .model import NoisyMarginalsModel
from .records import exact_count_update, record_plan

__all__ = [
    "ExactState",
    "DEFAULT_INTERWEAVE",
    "default_interweave",
    "default_moves",
    "exact_gibbs_fn",
    "exact_kernel",
    "interweave_fn",
    "noncentred_fn",
]

Array = Any

#: Non-centred moves per step by default (:func:`default_interweave`).
DEFAULT_INTERWEAVE = 32


def default_interweave(model: NoisyMarginalsModel) -> int:
    """Non-centred moves of ``(φ, n)`` per step by default: :data:`DEFAULT_INTERWEAVE`, or none
    when ``θ`` is fixed. Measured (``python -m benchmarks gibbs --studies adult,coverage
    --models small --eps 1,0.1 --interweave 0,32``, ``benchmarks/results/gibbs-cpu.json``, two
    CPU cores): on Adult's 97-cell model at ε = 1 the record swaps alone left the smallest bulk
    ESS at 1.5 of 1,000 draws (R-hat 1.65: the split of sparse rows of the two-way tables
    crawls), 32 moves per step raised it to 34 (R-hat 1.07) at twice the wall time; at ε = 0.1
    from 1.3 to 2.5, not enough. On 100 sparse releases of 6 cells the default reached a
    bulk ESS of 181 in 36 s."""
    return 0 if model.theta is not None else DEFAULT_INTERWEAVE


def exact_gibbs_fn(
    model: NoisyMarginalsModel, *, moves: int | None = None, y: Array | None = None,
) -> Callable[..., dict[str, Array]]:
    """The ``gibbs_fn`` of :class:`numpyro.infer.HMCGibbs` for the site ``n`` of ``model``.

    Parameters
    ----------
    model : NoisyMarginalsModel
        With an exact CGM site (``relaxed=False``); ``θ`` inferred (site ``phi``) or fixed.
    moves : int, optional
        Record swaps per update (:func:`default_moves` of ``N`` by default).
    y : array, optional
        The answers the run conditions on (``(num_answers,)`` or a batch of releases
        ``(R, num_answers)``); default the model's released values.

    Returns
    -------
    callable
        ``gibbs_fn(rng_key, gibbs_sites, hmc_sites) -> {"n": new tables}``.
    """
    if not isinstance(model, NoisyMarginalsModel):
        raise TypeError(f"model must be a NoisyMarginalsModel, got {type(model).__name__}")
    plan = record_plan(model)
    y_arr = jnp.asarray(model.y if y is None else y)
    k = default_moves(model.total_count) if moves is None else int(moves)
    if k < 1:
        raise ValueError(f"moves must be a positive integer, got {moves}")

    def one(n: Array, theta: Array, yy: Array, key: Array) -> Array:
        eta = model.latent_theta(theta)
        return exact_count_update(plan, model.predict, n, eta, yy, key, k)[0]

    def gibbs_fn(rng_key: Array, gibbs_sites: dict, hmc_sites: dict) -> dict[str, Array]:
        n = gibbs_sites["n"]
        if model.theta is not None:
            theta = jnp.asarray(model.theta, dtype=n.dtype)
        else:
            theta = model.coding.to_theta(hmc_sites["phi"])
        if n.ndim == 1:
            return {"n": one(n, theta, y_arr, rng_key)}
        batch = n.shape[0]
        keys = jax.random.split(rng_key, batch)
        theta = jnp.broadcast_to(theta, (batch, theta.shape[-1]))
        yy = jnp.broadcast_to(y_arr, (batch, y_arr.shape[-1]))
        return {"n": jax.vmap(one)(n, theta, yy, keys)}

    return gibbs_fn


def noncentred_fn(
    model: NoisyMarginalsModel, *, moves: int, y: Array | None = None,
) -> Callable[[Array, dict, tuple], tuple[dict, tuple]]:
    """The ``joint_fn`` of :class:`~.count_gibbs.CGMGibbs` for this model:
    ``(rng_key, {"phi", "n"}, records) -> (values, records)``, ``moves`` non-centred moves
    (:func:`~numpyro_dpgm.infer.bayes.interweave.noncentred_moves`) per release, picking
    events by the noise share of their counts in the release
    (:func:`~numpyro_dpgm.infer.bayes.interweave.noise_share`)."""
    plan = record_plan(model)
    y_arr = jnp.asarray(model.y if y is None else y)
    weights = noise_share(model)

    def one(key: Array, phi: Array, n: Array, codes: Array, yy: Array) -> tuple:
        codes, n, phi, _ = noncentred_moves(plan, model, codes, n, phi, yy, key, moves,
                                            weights=weights)
        return phi, n, codes

    def fn(rng_key: Array, z: dict, records: tuple) -> tuple[dict, tuple]:
        n, codes = z["n"], records[0]  # the record moves keep (B, N, d) records
        if n.ndim == 1:
            phi, n, codes = one(rng_key, z["phi"], n, codes[0], y_arr)
            codes = codes[None]
        else:
            keys = jax.random.split(rng_key, n.shape[0])
            yy = jnp.broadcast_to(y_arr, (n.shape[0], y_arr.shape[-1]))
            phi, n, codes = jax.vmap(one)(keys, z["phi"], n, codes, yy)
        return {**z, "phi": phi, "n": n}, (codes,)

    return fn


def exact_kernel(
    model: NoisyMarginalsModel,
    *,
    moves: int | None = None,
    interweave: int | None = None,
    y: Array | None = None,
    **nuts_options: Any,
) -> MCMCKernel:
    """The MCMC kernel of an exact model: NUTS on ``φ`` within Gibbs, or the update alone.

    Parameters
    ----------
    model : NoisyMarginalsModel
        With ``relaxed=False``.
    moves : int, optional
        Record swaps per update of ``n`` (:func:`default_moves`).
    interweave : int, optional
        Non-centred moves of ``(φ, n)`` per step (:mod:`.interweave`), which mix the
        directions where the noise swamps the counts; default :func:`default_interweave`,
        0 for none.
    y : array, optional
        The answers the non-centred moves condition on (default the released values); the
        record moves read them from the model's arguments.
    **nuts_options
        Passed to :class:`numpyro.infer.NUTS` (``init_strategy``, ``target_accept_prob``,
        ``dense_mass``, ``max_tree_depth``); unused when ``θ`` is fixed.

    Returns
    -------
    CGMGibbs or RecordMoves
        :class:`~.count_gibbs.CGMGibbs`, the kernel of any model with exact CGM sites, with
        the non-centred moves as its ``joint_fn``.
        Run it with :class:`numpyro.infer.MCMC`, passing ``init_params={"n": tables}`` (one
        set of integer tables per chain).
    """
    if not isinstance(model, NoisyMarginalsModel):
        raise TypeError(f"model must be a NoisyMarginalsModel, got {type(model).__name__}")
    if model.relaxed:
        raise ValueError("the exact kernel needs a model with relaxed=False "
                         "(model.with_cgm(relaxed=False) gives it)")
    if model.theta is not None:
        return RecordMoves(model, moves=moves)
    return CGMGibbs(NUTS(model, **nuts_options), moves=moves,
                    joint_fn=interweave_fn(model, interweave, y))


def interweave_fn(model: NoisyMarginalsModel, interweave: int | None = None,
                  y: Array | None = None) -> Callable | None:
    """The exact path's ``joint_fn`` for this model: ``interweave`` non-centred moves per step
    (:func:`noncentred_fn`; default :func:`default_interweave`), or ``None`` for none."""
    k = default_interweave(model) if interweave is None else int(interweave)
    return noncentred_fn(model, moves=k, y=y) if k > 0 else None
