r"""Exact record moves of the count tables in any NumPyro model, as a block of ``Gibbs``.

For a user's model with exact :class:`~numpyro_dpgm.distributions.CollectiveGraphicalModel`
sites observed through this library's noise distributions (:mod:`.count_sites`),
:class:`CGMGibbs` samples the joint posterior the way NumPyro's ``DiscreteHMCGibbs`` does for
discrete sites: NUTS moves every continuous site given the tables, and :class:`RecordMoves`
moves the tables given every other site by the Metropolis–Hastings record swaps of
:mod:`.records`, which leave the exact conditional ``p(n | θ, rest, y)`` invariant:

.. code-block:: python

    def model(y, N, b):
        phi = numpyro.sample("phi", dist.Normal(0, 3).expand([net.num_params]).to_event(1))
        n = numpyro.sample("n", CollectiveGraphicalModel(net, phi, total_count=N))
        numpyro.sample("y", LaplaceNoise(n, b), obs=y)

    mcmc = MCMC(CGMGibbs(NUTS(model)), num_warmup=500, num_samples=500)
    mcmc.run(jax.random.key(0), y, N, b)

The swap of record ``x`` for a proposal ``x' ∼ p_θ`` (``θ`` read from the CGM site at the
current values of every other site) is accepted with probability
``min(1, p(y | n') / p(y | n))`` over the answers the move changes: the columns of the linear
map ``loc = J n + c`` at the (one per clique) cells the record leaves and enters, summed per
answer. Several CGM sites, and the tables of a plate of regions (a batch of CGM tables) that
share an answer, are moved in sequence with one running vector of answers, so a release that
reads several tables (a national total over regional tables, two releases of one table) is
exact too; sets of tables that share no answer (independent regions, a batch of releases) move
in parallel. The records are dealt from the tables once, at ``init``, and kept in the state
(:class:`RecordMovesState`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.infer import Gibbs
from numpyro.infer.gibbs import GIBBS_SITES_KWARG, prototype_trace, with_conditioning
from numpyro.infer.hmc import HMC
from numpyro.infer.hmc_gibbs import HMCGibbsState
from numpyro.infer.mcmc import MCMCKernel

from ...oracles import junction_tree as jt
from .count_sites import (
    NOISE_FAMILIES,
    CountLayout,
    count_layout,
    exact_count_sites,
    inner_distribution,
)
from .records import DealPlan, deal_plan, records_from_tables

__all__ = ["CGMGibbs", "ExactState", "MAX_DEFAULT_MOVES", "RecordMoves", "RecordMovesState",
           "answer_log_lik", "default_moves"]

Array = Any


#: Record swaps per update at most, by default (each costs about 2 µs on a CPU core).
MAX_DEFAULT_MOVES = 20_000


def default_moves(total_count: int) -> int:
    """``K = min(N, max(1000, N / 4), 20 000)`` record swaps per update."""
    return int(min(total_count, max(1000, total_count // 4), MAX_DEFAULT_MOVES))


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


class RecordMovesState(NamedTuple):
    """State of :class:`RecordMoves`: the tables ``z`` (one entry per count site), the records
    behind them (per site ``(B, N_max, d)`` codes), the next key, and the fraction of the last
    update's swaps accepted."""

    z: dict
    records: tuple
    rng_key: Array
    acceptance: Array

    @property
    def diverging(self) -> Array:
        """Always false (there is no trajectory), so that the field reads as with NUTS."""
        return jnp.zeros((), dtype=bool)


class _Site(NamedTuple):
    """Static plan of one count site's moves.

    ``local`` is ``None`` where the sets of tables share answers (a national total over
    regions): their moves then run in one sequence. Where every answer is read by one set only
    (independent releases per region or per simulated release), ``local`` ``(B, A_b)`` lists
    each set's answers and ``local_rows`` indexes them per cell, and the sets move in parallel.
    """

    plan: DealPlan
    batch: int
    num_params: int
    totals: np.ndarray
    rows: np.ndarray
    coefs: np.ndarray
    local: np.ndarray | None
    local_rows: np.ndarray | None


def _local_answers(rows: np.ndarray, batch: int, pad: int
                   ) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """Each set's answers and the cells' rows among them, where no two sets share an answer
    and every set reads as many; else ``(None, None)``."""
    if batch == 1:
        return None, None
    per = rows.reshape(batch, -1, rows.shape[-1])
    sets = [np.unique(r[r != pad]) for r in per]
    sizes = {len(a) for a in sets}
    if len(sizes) != 1 or len(np.unique(np.concatenate(sets))) != sum(len(a) for a in sets):
        return None, None
    local = np.stack(sets).astype(np.int32)
    size = local.shape[1]
    local_rows = np.stack([np.where(r == pad, size, np.searchsorted(a, r))
                           for r, a in zip(per, sets, strict=True)]).astype(np.int32)
    return local, local_rows


def _site_plans(layout: CountLayout) -> tuple[_Site, ...]:
    out = []
    for c in layout.counts:
        try:
            plan = deal_plan(c.network, int(np.max(c.totals, initial=0)))
        except ValueError as err:
            raise ValueError(f"count site {c.name!r}: {err}") from None
        batch = int(np.prod(c.batch_shape))
        local, local_rows = _local_answers(c.rows, batch, layout.num_answers)
        out.append(_Site(plan, batch, c.network.num_params, np.ravel(c.totals), c.rows,
                         c.coefs, local, local_rows))
    return tuple(out)


def _cell_strides(net: Any) -> tuple[Array, Array]:
    """``(d, C)`` strides and ``(2C,)`` offsets so that ``x @ strides`` stacked twice plus the
    offsets are the flat cells of records ``x_old`` and ``x_new`` in every clique."""
    dom = net.domain
    strides = np.zeros((len(dom.attrs), len(net.cliques)), dtype=np.int32)
    for j, (clique, shape) in enumerate(zip(net.cliques, net.shapes, strict=True)):
        step = np.cumprod((1,) + tuple(shape)[::-1])[:-1][::-1]
        for a, s in zip(clique, step, strict=True):
            strides[dom.index(a), j] = s
    offsets = np.asarray(net.offsets, dtype=np.int32)
    return jnp.asarray(strides), jnp.asarray(np.concatenate([offsets, offsets]))


def _swaps(site: _Site, families: np.ndarray, records: Array, n: Array, pred: Array, y: Array,
           scale: Array, theta: Array, moves: int, rng_key: Array) -> tuple:
    """``moves`` record swaps per set of tables of one count site.

    ``records`` ``(B, N_max, d)``, ``n`` ``(B·P,)``, ``pred``/``y``/``scale`` the answers with
    one padding entry, ``theta`` ``(B, P)``. The sets move in one sequence, or in parallel
    where they share no answer (``site.local``). Returns ``(records, n, pred, accepted)``.
    """
    codes = jnp.asarray(families)
    rows, coefs = jnp.asarray(site.rows), jnp.asarray(site.coefs, dtype=pred.dtype)
    totals = jnp.asarray(site.totals)
    if site.local is None:
        return _sequence(site, families, records, n, pred, y, scale, codes, rows, coefs, theta,
                         totals, moves, rng_key)
    nb, P = site.batch, site.num_params
    local = jnp.asarray(site.local)

    def one(rec: Array, n_b: Array, idx: Array, rows_b: Array, coefs_b: Array, theta_b: Array,
            total: Array, key: Array) -> tuple:
        rec, n_b, p_b, acc = _sequence(
            site, families, rec[None], n_b, _padded(pred[idx], 0.0), _padded(y[idx], 0.0),
            _padded(scale[idx], 1.0), _padded(codes[idx], 0), rows_b, coefs_b, theta_b[None],
            total[None], moves, key)
        return rec[0], n_b, p_b[:-1], acc

    rec, n, p_local, accepted = jax.vmap(one)(
        records, jnp.reshape(n, (nb, P)), local, jnp.asarray(site.local_rows),
        jnp.reshape(coefs, (nb, P, -1)), theta, totals, jax.random.split(rng_key, nb))
    pred = pred.at[local].set(p_local)
    return rec, jnp.ravel(n), pred, jnp.ravel(accepted)


def _padded(a: Array, value: float) -> Array:
    """``a`` with one padding entry ``value`` at the end (the answer a cell's padded row
    points to)."""
    return jnp.concatenate([a, jnp.full((1,), value, a.dtype)])


def _sequence(site: _Site, families: np.ndarray, records: Array, n: Array, pred: Array,
              y: Array, scale: Array, codes: Array, rows_of: Array, coefs_of: Array,
              theta: Array, totals: Array, moves: int, rng_key: Array) -> tuple:
    """``moves`` swaps per set of ``records`` ``(B', N_max, d)``, all in one sequence; the
    answers are ``pred``/``y``/``scale``/``codes`` (padding entry last) and ``rows_of``
    ``(B'·P, w)`` index them."""
    net, P = site.plan.network, site.num_params
    nb = records.shape[0]
    k_prop, k_idx, k_u = jax.random.split(rng_key, 3)
    props = jax.vmap(lambda t, k: jt.sample(net, t, k, moves))(
        theta, jax.random.split(k_prop, nb)).astype(jnp.int32)
    which = jnp.repeat(jnp.arange(nb), moves)
    idx = jnp.floor(jax.random.uniform(k_idx, (nb * moves,)) * totals[which]).astype(jnp.int32)
    log_u = jnp.log(jax.random.uniform(k_u, (nb * moves,), dtype=pred.dtype))
    strides, offsets = _cell_strides(net)
    pairs = jnp.tril(jnp.ones((len(offsets) * rows_of.shape[1],) * 2, dtype=bool), -1)

    def body(carry: tuple, inp: tuple) -> tuple:
        recs, tables, ans = carry
        b, i, x_new, lu = inp
        x_old = recs[b, i]
        cells = b * P + jnp.concatenate([x_old @ strides, x_new @ strides]) + offsets
        rows, half = rows_of[cells].ravel(), cells.shape[0] // 2
        sign = jnp.where(jnp.arange(cells.shape[0]) < half, -1.0, 1.0).astype(ans.dtype)
        delta = (sign[:, None] * coefs_of[cells]).ravel()
        same = rows[:, None] == rows[None, :]
        change = same.astype(delta.dtype) @ delta      # each answer's total change
        first = ~jnp.any(same & pairs, axis=1)         # count each answer once
        cur, yy, ss = ans[rows], y[rows], scale[rows]
        ll = answer_log_lik(codes[rows], families, jnp.stack([yy, yy]),
                            jnp.stack([cur + change, cur]), jnp.stack([ss, ss]))
        keep = first & (rows < ans.shape[0] - 1)
        accept = lu < jnp.sum(jnp.where(keep, ll[0] - ll[1], 0.0))
        a = accept.astype(ans.dtype)
        ans = ans.at[rows].add(a * delta)
        tables = tables.at[cells].add(a * sign)
        recs = recs.at[b, i].set(jnp.where(accept, x_new, x_old))
        return (recs, tables, ans), accept

    inputs = (which, idx, jnp.reshape(props, (nb * moves, -1)), log_u)
    (records, n, pred), accepted = jax.lax.scan(body, (records, n, pred), inputs)
    return records, n, pred, accepted


def _laplace(y: Array, loc: Array, scale: Array) -> Array:
    return -jnp.abs(y - loc) / scale


def _gaussian(y: Array, loc: Array, scale: Array) -> Array:
    return -0.5 * ((y - loc) / scale) ** 2


def _family_log_lik(code: int) -> Callable[[Array, Array, Array], Array]:
    """``(y, loc, scale) ↦`` the log likelihood of family ``code`` up to terms that do not
    depend on ``loc`` (none are dropped for the discrete families, whose normaliser does)."""
    if code == 0:
        return _laplace
    if code == 1:
        return _gaussian
    family = NOISE_FAMILIES[code]
    return lambda y, loc, scale: family(loc, scale).log_prob(y)


def answer_log_lik(codes: Array, present: np.ndarray, y: Array, loc: Array,
                   scale: Array) -> Array:
    """Per-answer log likelihood ``log p(y_i | loc_i)`` in the noise family of each answer, up
    to terms that do not depend on ``loc``.

    Parameters
    ----------
    codes : int array
        Index into :data:`~.count_sites.NOISE_FAMILIES` per answer (may be traced).
    present : int ndarray
        The family codes that occur (static).
    y, loc, scale : arrays of the shape of ``codes``
    """
    kinds = np.unique(present)
    if kinds.size == 1:
        return _family_log_lik(int(kinds[0]))(y, loc, scale)
    out = jnp.zeros(jnp.shape(loc), dtype=jnp.result_type(loc, float))
    for code in kinds:
        out = jnp.where(codes == code, _family_log_lik(int(code))(y, loc, scale), out)
    return out


class RecordMoves(MCMCKernel):
    """Exact record moves of every exact CGM site of a model: a block of
    :class:`numpyro.infer.Gibbs` (or the whole kernel where no other site is latent).

    Parameters
    ----------
    model : callable
        A NumPyro model whose exact CGM sites are read only by this library's noise sites
        (:func:`~.count_sites.count_layout` says why another is refused).
    moves : int, optional
        Record swaps per set of tables per update (default :func:`default_moves` of
        the largest total).

    Notes
    -----
    ``init_params`` gives the starting integer tables; tables not given are drawn from the CGM
    at a prototype of the other sites (:func:`numpyro.infer.gibbs.prototype_trace`).
    """

    sample_field = "z"

    def __init__(self, model: Callable[..., Any], *, moves: int | None = None):
        if moves is not None and int(moves) < 1:
            raise ValueError(f"moves must be a positive integer, got {moves}")
        self._model = model
        self._moves = moves
        self._layout: CountLayout | None = None
        self._sites: tuple = ()

    @property
    def model(self) -> Callable[..., Any]:
        return self._model

    @property
    def layout(self) -> CountLayout | None:
        """The :class:`~.count_sites.CountLayout` found at ``init``."""
        return self._layout

    def _plain_kwargs(self, model_kwargs: dict | None) -> dict:
        return {k: v for k, v in (model_kwargs or {}).items() if k != GIBBS_SITES_KWARG}

    def init(self, rng_key: Array, num_warmup: int, init_params: Any, model_args: tuple,
             model_kwargs: dict | None) -> RecordMovesState:
        self._layout = count_layout(self._model, model_args, self._plain_kwargs(model_kwargs))
        self._sites = _site_plans(self._layout)
        names = [c.name for c in self._layout.counts]
        keys = jax.random.split(rng_key, len(names) + 2)
        missing = [k for k in names if not init_params or k not in init_params]
        if missing:  # CGM draws at a prototype of the other sites (Gibbs passes its own)
            with jax.ensure_compile_time_eval():
                proto = prototype_trace(self._model, keys[-1], model_args,
                                        self._plain_kwargs(model_kwargs))
            init_params = {**(init_params or {}), **{k: proto[k]["value"] for k in missing}}
        z, records = {}, []
        for site, count, key in zip(self._sites, self._layout.counts, keys[1:-1],
                                    strict=True):
            n = jnp.asarray(init_params[count.name])
            _check_tables(count.name, n, count.totals, count.network)
            flat = jnp.reshape(n, (site.batch, site.num_params))
            deal = jax.vmap(lambda t, c, k, s=site: records_from_tables(s.plan, t, k, c))
            records.append(deal(flat, jnp.asarray(site.totals), jax.random.split(key, site.batch)))
            z[count.name] = n
        return RecordMovesState(z, tuple(records), keys[0], jnp.zeros(()))

    def _current(self, z: dict, model_args: tuple, model_kwargs: dict | None) -> tuple:
        """``(thetas, pred, y, scale)`` at the current values of every site."""
        seeded = handlers.seed(handlers.substitute(self._model, data=z), jax.random.key(0))
        tr = handlers.trace(seeded).get_trace(*model_args, **(model_kwargs or {}))
        thetas = []
        for count, site in zip(self._layout.counts, self._sites, strict=True):
            fn = inner_distribution(tr[count.name]["fn"])
            theta = jnp.broadcast_to(fn.theta, count.batch_shape + (site.num_params,))
            thetas.append(jnp.reshape(theta, (site.batch, site.num_params)))
        parts = [[], [], []]
        for s in self._layout.noise:
            fn = inner_distribution(tr[s.name]["fn"])
            value = jnp.asarray(tr[s.name]["value"])
            for out, arr in zip(parts, (fn.loc, value, fn.scale),
                                strict=True):
                out.append(jnp.ravel(jnp.broadcast_to(arr, s.shape)))
        pad = (jnp.zeros(1), jnp.zeros(1), jnp.ones(1))
        pred, y, scale = (jnp.concatenate(p + [q]).astype(jnp.result_type(float))
                          for p, q in zip(parts, pad, strict=True))
        return thetas, pred, y, scale

    def sample(self, state: RecordMovesState, model_args: tuple, model_kwargs: dict | None
               ) -> RecordMovesState:
        key, sub = jax.random.split(state.rng_key)
        thetas, pred, y, scale = self._current(state.z, model_args, model_kwargs)
        families = self._layout.families
        z, records, rates = dict(state.z), [], []
        for site, count, codes, theta, k in zip(
                self._sites, self._layout.counts, state.records, thetas,
                jax.random.split(sub, len(self._sites)), strict=True):
            moves = (default_moves(int(np.max(site.totals, initial=1))) if self._moves is None
                     else int(self._moves))
            n = jnp.ravel(state.z[count.name]).astype(pred.dtype)
            codes, n, pred, accepted = _swaps(site, families, codes, n, pred, y, scale,
                                              theta.astype(pred.dtype), moves, k)
            z[count.name] = jnp.reshape(n, jnp.shape(state.z[count.name])).astype(
                jnp.asarray(state.z[count.name]).dtype)
            records.append(codes)
            rates.append(jnp.mean(accepted.astype(pred.dtype)))
        return RecordMovesState(z, tuple(records), key,
                                jnp.mean(jnp.stack(rates)).astype(state.acceptance.dtype))

    def refresh(self, state: RecordMovesState, model_args: tuple, model_kwargs: dict | None
                ) -> RecordMovesState:
        """Identity: nothing is cached that depends on the other sites."""
        return state

    def wrap_model(self, wrapper: Callable[..., Any]) -> RecordMoves:
        kernel = copy.copy(self)
        kernel._model = wrapper(self._model)
        return kernel

    def get_constrain_fn(self, model_args: tuple, model_kwargs: dict | None) -> Callable:
        """Identity: the tables are already constrained."""
        return lambda z: z

    def postprocess_fn(self, model_args: tuple, model_kwargs: dict | None) -> Callable:
        """The tables and the model's deterministic sites (a model with no other latent
        site, run without :class:`numpyro.infer.Gibbs`)."""
        kwargs = self._plain_kwargs(model_kwargs)

        def fn(z: dict) -> dict:
            seeded = handlers.substitute(handlers.seed(self._model, 0), data=z)
            tr = handlers.trace(seeded).get_trace(*model_args, **kwargs)
            return {**z, **{k: s["value"] for k, s in tr.items()
                            if s["type"] == "deterministic"}}

        return fn


def _check_tables(name: str, n: Array, totals: np.ndarray, network: Any) -> None:
    """Raise where concrete starting tables are not integer tables of ``N`` records."""
    if isinstance(n, jax.core.Tracer):
        return
    arr = np.asarray(n)
    if arr.shape[:-1] != totals.shape or arr.shape[-1] != network.num_params:
        raise ValueError(f"starting tables of {name!r} have shape {arr.shape}; expected "
                         f"{totals.shape + (network.num_params,)}")
    if np.any(arr < 0) or np.any(arr != np.round(arr)):
        raise ValueError(f"starting tables of {name!r} must be non-negative integers")
    sums = np.stack([arr[..., network.slice_of(c)].sum(-1) for c in network.cliques], -1)
    if np.any(sums != totals[..., None]):
        raise ValueError(f"starting tables of {name!r} do not sum to total_count in every "
                         "clique")


class CGMGibbs(Gibbs):
    """NUTS (or HMC) on the continuous sites within Gibbs with :class:`RecordMoves` on the
    exact CGM sites, for any model of :mod:`.count_sites`' class.

    Parameters
    ----------
    inner_kernel : HMC or NUTS
        Built on the model; it moves every latent site but the exact count tables.
    moves : int, optional
        Record swaps per set of tables per step (:class:`RecordMoves`).
    joint_fn : callable, optional
        ``(rng_key, z, records) -> (z, records)``: a move of the tables and the NUTS sites
        together after every sweep that leaves the joint posterior invariant (``z`` every
        latent site's value, ``records`` the record moves' records); NUTS's potential and
        gradient are refreshed at its output. The library's model takes the non-centred moves
        of :mod:`.interweave`, which need its coding
        (:func:`~.gibbs.noncentred_fn`, :func:`~.gibbs.exact_kernel`).

    Notes
    -----
    Run it with :class:`numpyro.infer.MCMC` (``chain_method="sequential"`` or
    ``"parallel"``); the starting tables are drawn from the CGM at the starting values of the
    other sites unless ``init_params`` gives them. ``extra_fields`` such as ``num_steps`` and
    ``diverging`` read the NUTS block's.

    Examples
    --------
    >>> import jax, numpyro, numpyro.distributions as dist
    >>> from numpyro.infer import MCMC, NUTS
    >>> from numpyro_dpgm import MarkovNetwork
    >>> from numpyro_dpgm.distributions import CollectiveGraphicalModel, LaplaceNoise
    >>> from numpyro_dpgm.infer.bayes import CGMGibbs
    >>> numpyro.enable_x64()
    >>> net = MarkovNetwork({"a": 2, "b": 2}, [("a", "b")])
    >>> def model(y):
    ...     phi = numpyro.sample("phi", dist.Normal(0, 1).expand([4]).to_event(1))
    ...     n = numpyro.sample("n", CollectiveGraphicalModel(net, phi, total_count=20))
    ...     numpyro.sample("y", LaplaceNoise(n, 1.0), obs=y)
    >>> mcmc = MCMC(CGMGibbs(NUTS(model)), num_warmup=20, num_samples=20, progress_bar=False)
    >>> mcmc.run(jax.random.key(0), jax.numpy.array([9.0, 1.0, 2.5, 7.5]))
    >>> mcmc.get_samples()["n"].shape
    (20, 4)
    """

    _state_cls = ExactState

    def __init__(self, inner_kernel: HMC, *, moves: int | None = None,
                 joint_fn: Callable[..., tuple[dict, tuple]] | None = None):
        if not isinstance(inner_kernel, HMC):
            raise ValueError("inner_kernel must be an HMC or NUTS sampler")
        if inner_kernel.model is None:
            raise ValueError("CGMGibbs needs a kernel built on a model, not a potential_fn")
        super().__init__([(RecordMoves(inner_kernel.model, moves=moves), exact_count_sites),
                          (inner_kernel, None)])
        self.inner_kernel = self._kernels[1]
        self._max_tree_depth = getattr(inner_kernel, "_max_tree_depth", None)
        self._joint_fn = joint_fn

    def sample(self, state: Any, model_args: tuple, model_kwargs: dict | None) -> Any:
        state = super().sample(state, model_args, model_kwargs)
        if self._joint_fn is None:
            return state
        counts, hmc_state = state.block_states
        rng_key, key = jax.random.split(state.rng_key)
        z, records = self._joint_fn(key, {**counts.z, **hmc_state.z}, counts.records)
        tables = {k: z[k] for k in counts.z}
        counts = counts._replace(z=tables, records=records)
        hmc_state = self.inner_kernel.refresh(
            hmc_state._replace(z={k: z[k] for k in hmc_state.z}), model_args,
            with_conditioning(model_kwargs, tables))
        return state._replace(z=z, block_states=(counts, hmc_state), rng_key=rng_key)

    @property
    def layout(self) -> CountLayout | None:
        """The count sites and noise sites found at ``init``."""
        return self._kernels[0].layout
