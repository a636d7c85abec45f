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
``mcmc.get_samples()`` holds both sites for ArviZ. :func:`exact_kernel` builds the same sweep
as :class:`numpyro.infer.Gibbs` blocks (:class:`ExactGibbs`, whose state forwards NUTS's
statistics so that the usual ``extra_fields`` work): its block for ``n``
(:class:`RecordSwaps`) keeps the records between updates instead of dealing them from ``n``
each time, which a stateless ``gibbs_fn`` must do. When ``θ`` is fixed, :class:`ExactCounts`
is the update alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from numpyro import handlers
from numpyro.infer import NUTS, Gibbs
from numpyro.infer.gibbs import GIBBS_SITES_KWARG, with_conditioning
from numpyro.infer.hmc_gibbs import HMCGibbsState
from numpyro.infer.mcmc import MCMCKernel

from .interweave import noise_share, noncentred_moves
from .model import NoisyMarginalsModel
from .records import exact_count_update, record_plan, record_update, records_from_tables

__all__ = [
    "ExactCounts",
    "ExactGibbs",
    "RecordState",
    "RecordSwaps",
    "DEFAULT_INTERWEAVE",
    "default_interweave",
    "default_moves",
    "exact_gibbs_fn",
    "exact_kernel",
    "noncentred_fn",
]

Array = Any

#: Record swaps per update at most, by default (each costs about 2 µs on a CPU core).
MAX_DEFAULT_MOVES = 20_000


def default_moves(total_count: int) -> int:
    """``K = min(N, max(1000, N / 4), 20 000)`` record swaps per update."""
    return int(min(total_count, max(1000, total_count // 4), MAX_DEFAULT_MOVES))


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
) -> Callable[..., tuple[Array, Array, Array]]:
    """``(rng_key, phi, n, records) -> (phi, n, records)``: ``moves`` non-centred moves
    (:func:`~numpyro_dpgm.infer.bayes.interweave.noncentred_moves`), per release, picking
    events by the noise share of their counts in the release
    (:func:`~numpyro_dpgm.infer.bayes.interweave.noise_share`)."""
    plan = record_plan(model)
    y_arr = jnp.asarray(model.y if y is None else y)
    weights = noise_share(model)

    def one(key: Array, phi: Array, n: Array, codes: Array, yy: Array) -> tuple:
        codes, n, phi, _ = noncentred_moves(plan, model, codes, n, phi, yy, key, moves,
                                            weights=weights)
        return phi, n, codes

    def fn(rng_key: Array, phi: Array, n: Array, codes: Array) -> tuple:
        if n.ndim == 1:
            return one(rng_key, phi, n, codes, y_arr)
        keys = jax.random.split(rng_key, n.shape[0])
        yy = jnp.broadcast_to(y_arr, (n.shape[0], y_arr.shape[-1]))
        return jax.vmap(one)(keys, phi, n, codes, yy)

    return fn


class RecordState(NamedTuple):
    """State of :class:`RecordSwaps`: the tables ``z = {"n": …}``, the records behind them
    (``(N, d)`` codes, ``(R, N, d)`` for a batch of releases), the next key, and the fraction
    of the last update's swaps accepted."""

    z: dict
    records: Array
    rng_key: Array
    acceptance: Array

    @property
    def diverging(self) -> Array:
        """Always false (there is no trajectory), so that the field reads as with NUTS."""
        return jnp.zeros((), dtype=bool)


class RecordSwaps(MCMCKernel):
    """The exact update of ``n`` as a block of :class:`numpyro.infer.Gibbs`, keeping the records.

    A ``gibbs_fn`` (:func:`exact_gibbs_fn`) has no state, so it deals records from ``n`` at
    every update; this block deals them once, at ``init``, and keeps them in its state
    (:func:`~.records.record_update`), which gives the same chain of tables for a fraction
    of the time. The joint chain of the records and ``φ`` leaves
    ``p(φ) Π_i p_θ(x_i) p(y | n(x))`` invariant: the swaps move the records given ``φ``, and
    ``φ``'s block reads them through ``n`` only.

    Parameters
    ----------
    model : NoisyMarginalsModel
        With ``relaxed=False``; ``θ`` read from the site ``phi`` of the conditioning values
        (the other block's), or the model's fixed ``θ``.
    moves : int, optional
        Record swaps per update (:func:`default_moves`).
    y : array, optional
        The answers the run conditions on (default the released values).
    """

    sample_field = "z"

    def __init__(self, model: NoisyMarginalsModel, *, moves: int | None = None,
                 y: Array | None = None):
        self._exact = model
        self._plan = record_plan(model)
        self._y = jnp.asarray(model.y if y is None else y)
        self._moves = default_moves(model.total_count) if moves is None else int(moves)
        if self._moves < 1:
            raise ValueError(f"moves must be a positive integer, got {moves}")

    def _theta(self, model_kwargs: dict | None, dtype: Any) -> Array:
        if self._exact.theta is not None:
            return jnp.asarray(self._exact.theta, dtype=dtype)
        return self._exact.coding.to_theta((model_kwargs or {})[GIBBS_SITES_KWARG]["phi"])

    def init(self, rng_key: Array, num_warmup: int, init_params: Any, model_args: tuple,
             model_kwargs: dict | None) -> RecordState:
        if not init_params or "n" not in init_params:
            raise ValueError(f"{type(self).__name__} needs init_params={{'n': integer tables}}")
        n = jnp.asarray(init_params["n"])
        key, deal = jax.random.split(rng_key)
        if n.ndim == 1:
            codes = records_from_tables(self._plan, n, deal)
        else:
            keys = jax.random.split(deal, n.shape[0])
            codes = jax.vmap(lambda t, k: records_from_tables(self._plan, t, k))(n, keys)
        return RecordState({"n": n}, codes, key, jnp.zeros((), n.dtype))

    def sample(self, state: RecordState, model_args: tuple, model_kwargs: dict | None
               ) -> RecordState:
        key, sub = jax.random.split(state.rng_key)
        n = state.z["n"]
        theta = self._theta(model_kwargs, n.dtype)
        model, plan, k = self._exact, self._plan, self._moves

        def one(codes: Array, n: Array, theta: Array, yy: Array, key: Array) -> tuple:
            return record_update(plan, model.predict, codes, n, model.latent_theta(theta), yy,
                                 key, k)

        if n.ndim == 1:
            codes, n, acceptance = one(state.records, n, theta, self._y, sub)
        else:
            batch = n.shape[0]
            codes, n, acceptance = jax.vmap(one)(
                state.records, n, jnp.broadcast_to(theta, (batch, theta.shape[-1])),
                jnp.broadcast_to(self._y, (batch, self._y.shape[-1])),
                jax.random.split(sub, batch))
            acceptance = jnp.mean(acceptance)
        return RecordState({"n": n}, codes, key, acceptance.astype(state.acceptance.dtype))

    def refresh(self, state: RecordState, model_args: tuple, model_kwargs: dict | None
                ) -> RecordState:
        """Identity: nothing is cached that depends on ``φ``."""
        return state

    def wrap_model(self, wrapper: Callable[..., Any]) -> RecordSwaps:
        """``self``: the block has no model of its own."""
        return self

    def get_constrain_fn(self, model_args: tuple, model_kwargs: dict | None) -> Callable:
        """Identity: the tables are already constrained."""
        return lambda z: z


def _from_nuts(field: str) -> property:
    """A property that reads ``field`` of the state's NUTS block."""
    return property(lambda self: getattr(self.hmc_state, field),
                    doc=f"NUTS's ``{field}`` (the last block's state).")


class ExactState(HMCGibbsState):
    """:class:`~numpyro.infer.hmc_gibbs.HMCGibbsState` that also answers NUTS's statistics
    (``diverging``, ``num_steps``, ``accept_prob``, ``potential_energy``, ``energy``,
    ``adapt_state``) from its NUTS block, so that ``extra_fields`` read as with plain NUTS."""

    __slots__ = ()

    diverging = _from_nuts("diverging")
    num_steps = _from_nuts("num_steps")
    accept_prob = _from_nuts("accept_prob")
    potential_energy = _from_nuts("potential_energy")
    energy = _from_nuts("energy")
    adapt_state = _from_nuts("adapt_state")


class ExactGibbs(Gibbs):
    """:class:`numpyro.infer.Gibbs` of :class:`RecordSwaps` on ``n`` and NUTS on ``φ``, with
    :class:`ExactState` (NUTS's statistics forwarded) and, optionally, non-centred moves of
    ``(φ, n)`` after every sweep.

    Parameters
    ----------
    counts : RecordSwaps
    inner_kernel : NUTS
    joint_fn : callable, optional
        ``(rng_key, phi, n, records) -> (phi, n, records)``, a move that leaves the joint
        posterior invariant (:func:`noncentred_fn`); NUTS's potential and gradient are
        refreshed at its output.
    """

    _state_cls = ExactState

    def __init__(self, counts: RecordSwaps, inner_kernel: NUTS,
                 joint_fn: Callable[..., Any] | None = None):
        super().__init__([(counts, ["n"]), (inner_kernel, None)])
        self._max_tree_depth = getattr(inner_kernel, "_max_tree_depth", None)
        self._joint_fn = joint_fn

    def sample(self, state: Any, model_args: tuple, model_kwargs: dict | None) -> Any:
        state = super().sample(state, model_args, model_kwargs)
        if self._joint_fn is None:
            return state
        counts, hmc_state = state.block_states
        rng_key, key = jax.random.split(state.rng_key)
        phi, n, codes = self._joint_fn(key, hmc_state.z["phi"], counts.z["n"], counts.records)
        counts = counts._replace(z={"n": n}, records=codes)
        kwargs = with_conditioning(model_kwargs, {"n": n})
        hmc_state = self._kernels[-1].refresh(hmc_state._replace(z={"phi": phi}), model_args,
                                              kwargs)
        return state._replace(z={"n": n, "phi": phi}, block_states=(counts, hmc_state),
                              rng_key=rng_key)


class ExactCounts(RecordSwaps):
    """The exact update of ``n`` alone, for a model with ``θ`` fixed (no continuous site); its
    state (:class:`RecordState`) keeps the records between updates.

    Parameters
    ----------
    model : NoisyMarginalsModel
    moves : int, optional
    y : array, optional
        As :class:`RecordSwaps`.
    """

    @property
    def model(self) -> NoisyMarginalsModel:
        return self._exact

    def postprocess_fn(self, model_args: tuple, model_kwargs: dict | None) -> Callable:
        """Add the model's deterministic sites (``theta``, ``mu``) to each draw of ``n``."""
        kwargs = {} if model_kwargs is None else model_kwargs

        def fn(z: dict) -> dict:
            seeded = handlers.substitute(handlers.seed(self._exact, 0), data=z)
            tr = handlers.trace(seeded).get_trace(*model_args, **kwargs)
            return {**z, **{k: s["value"] for k, s in tr.items()
                            if s["type"] == "deterministic"}}

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
        The answers the run conditions on (default the released values).
    **nuts_options
        Passed to :class:`numpyro.infer.NUTS` (``init_strategy``, ``target_accept_prob``,
        ``dense_mass``, ``max_tree_depth``); unused when ``θ`` is fixed.

    Returns
    -------
    ExactGibbs or ExactCounts
        Run it with :class:`numpyro.infer.MCMC`, passing ``init_params={"n": tables}`` (one
        set of integer tables per chain).
    """
    if not isinstance(model, NoisyMarginalsModel):
        raise TypeError(f"model must be a NoisyMarginalsModel, got {type(model).__name__}")
    if model.relaxed:
        raise ValueError("the exact kernel needs a model with relaxed=False "
                         "(model.with_cgm(relaxed=False) gives it)")
    if model.theta is not None:
        return ExactCounts(model, moves=moves, y=y)
    k = default_interweave(model) if interweave is None else int(interweave)
    joint = noncentred_fn(model, moves=k, y=y) if k > 0 else None
    return ExactGibbs(RecordSwaps(model, moves=moves, y=y), NUTS(model, **nuts_options),
                      joint_fn=joint)
