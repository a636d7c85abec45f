r"""Exact moves of the latent count tables: the records behind them, swapped by Metropolis–Hastings.

The exact posterior of the integer clique tables ``n`` given ``θ`` and the release ``y`` is

.. math:: π(n) ∝ \mathrm{CGM}(n; θ, N)\, p(y \mid n),
          \qquad \mathrm{CGM}(n; θ, N) = h(n)\, e^{θ·n − N A(θ)},

with ``h(n) = N! Π_S Π n_S! / Π_C Π n_C!`` the number of sequences of ``N`` records whose
junction-tree tables are ``n`` (decomposable networks; otherwise the tables of the
triangulation's cliques, whose CGM is exact too). It is the law of the tables of records
``x_1, …, x_N`` with joint density

.. math:: π(x_{1:N}) ∝ \Big(\prod_{i=1}^N p_θ(x_i)\Big)\, p(y \mid n(x_{1:N})),

because summing ``Π p_θ(x_i) = e^{θ·n − N A(θ)}`` over the ``h(n)`` sequences with tables ``n``
gives the CGM pmf. One update of ``n`` (:func:`exact_count_update`) therefore runs on records:

1. **Records from the tables**: ``x_{1:N}`` drawn uniformly among the sequences with tables
   ``n`` (:func:`records_from_tables`), which is ``π(x_{1:N} | n)``: the root clique's cells
   are laid out by their counts; every other clique ``C`` with separator ``S`` deals the cells
   of each row ``n_C(s, ·)`` to the records with ``x_S = s`` in a random order.
2. **Record swaps**: ``K`` Metropolis–Hastings moves, each taking a record ``i`` uniformly out
   of the ``N`` (its cell tuple is drawn ∝ the counts, consistently across cliques, i.e. by the
   junction-tree conditionals ``n_C / n_S``) and proposing a new record ``x' ∼ p_θ`` in its
   place. The proposal density ``q(x → x') = p_θ(x')/N`` and its reverse
   ``q(x' → x) = p_θ(x_i)/N`` cancel the records' prior ratio
   ``p_θ(x')/p_θ(x_i)``, so the move is accepted with probability

   .. math:: α = \min\Big(1, \frac{p(y \mid n')}{p(y \mid n)}\Big),
             \qquad n' = n − φ(x_i) + φ(x'),

   a ratio of the noise likelihoods of the answers that read the (at most two per measured
   table) cells the move changes: detailed balance
   ``π(x) q(x → x') α(x → x') = π(x') q(x' → x) α(x' → x)`` holds move by move, and the
   record sequence's law is left invariant by every move, so by the ``K`` of them in
   sequence (a ``lax.scan``).
3. **Tables from the records**: ``n' = Σ_i φ(x_i)``.

Step 1 draws from the exact conditional of the records given ``n`` and step 2 leaves the joint
``π(x_{1:N})`` invariant, so if ``n ∼ π`` then the records are ``∼ π(x_{1:N})``, they still are
after the swaps, and their tables ``n' ∼ π``: the update leaves the exact posterior of the
tables invariant (data augmentation). In terms of tables only, ``h(n)·P(remove x | n) =
h_{N−1}(n − φ(x)) = h(n')·P(remove x' | n')``, which is why no ``h`` ratio appears in ``α``.

Cost: step 1 sorts the ``N`` records once per clique (``O(N log N)``), step 2 is ``O(K·(m +
d))`` for ``m`` measured tables and ``d`` attributes (dense query answers add their length),
step 3 is ``O(N)``. Memory: the records, ``N × d`` int32 (4·N·d bytes: 20 MB for a million
records of five attributes), beside the ``K`` proposals.

Moves are not run in parallel: two moves whose changed answers are disjoint could be, by the
argument above applied to the pair, but almost every move changes a cell of the largest
tables' most populated cells, so the disjoint batches would hold a handful of moves.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...distributions.constraints import decomposable_layout
from ...network import MarkovNetwork
from ...oracles import junction_tree as jt

__all__ = [
    "DealPlan",
    "RecordPlan",
    "deal_plan",
    "exact_count_update",
    "record_plan",
    "record_update",
    "record_swaps",
    "records_from_tables",
    "tables_from_records",
]

Array = Any


class _Deal(NamedTuple):
    """One junction-tree clique's step of :func:`records_from_tables`."""

    slot: slice           # the clique's table in the flat layout
    shape: tuple          # its shape, in the network clique's attribute order
    perm: tuple           # axes: separator attributes first, then the new ones
    sep_pos: np.ndarray   # columns of the separator attributes in the records
    sep_strides: np.ndarray
    new_pos: np.ndarray   # columns of the new attributes
    new_shape: tuple


class _Query(NamedTuple):
    answers: slice        # the measurement's answers in y
    strides: np.ndarray   # (d,) cell index of the measured table from a record's codes
    matrix: np.ndarray    # (m, cells): answers = matrix @ table


class RecordPlan(NamedTuple):
    """Static layout of the record moves of a model (build with :func:`record_plan`).

    Attributes
    ----------
    network : MarkovNetwork
        The latent network restricted to the attributes its cliques cover; records hold one
        code per attribute of its domain, in domain order.
    total : int
        ``N``, the number of records.
    deals : tuple
        Root-first junction-tree steps that lay records out from tables.
    id_strides : ndarray ``(d, k)``
        For the ``k`` identity measurements, answer index of a record's cell is
        ``codes @ id_strides + id_offsets``.
    id_offsets : ndarray ``(k,)``
    queries : tuple
        Measurements with a query matrix (their answers change densely).
    family : {"laplace", "gaussian"}
    scales : ndarray
        Per-answer noise scale ``b`` or ``σ``.
    """

    network: MarkovNetwork
    total: int
    deals: tuple
    id_strides: np.ndarray
    id_offsets: np.ndarray
    queries: tuple
    family: str
    scales: np.ndarray


def _strides(domain_shape: tuple, positions: list[int], d: int) -> np.ndarray:
    """``(d,)`` weights so that ``codes @ w`` is the C-order index over ``positions``."""
    w = np.zeros(d, dtype=np.int32)
    step = 1
    for p in reversed(positions):
        w[p] = step
        step *= domain_shape[p]
    return w


class DealPlan(NamedTuple):
    """How records are dealt from the tables of a network (:func:`deal_plan`).

    Attributes
    ----------
    network : MarkovNetwork
        The network restricted to the attributes its cliques cover (records hold one code per
        attribute of its domain, in domain order); same flat layout as the original.
    total : int
        The number of records dealt (an upper bound when a count is passed to
        :func:`records_from_tables`).
    deals : tuple
        Root-first junction-tree steps that lay records out from tables.
    """

    network: MarkovNetwork
    total: int
    deals: tuple


def deal_plan(network: MarkovNetwork, total: int) -> DealPlan:
    """The :class:`DealPlan` of a decomposable ``network`` for up to ``total`` records.

    Raises
    ------
    ValueError
        If the network is not decomposable (its cliques are not a junction tree's).
    """
    covered = decomposable_layout(network).covered
    dom = covered.domain
    d = len(dom.attrs)
    col = {a: i for i, a in enumerate(dom.attrs)}
    dshape = tuple(dom[a] for a in dom.attrs)
    tree = jt.build_junction_tree(covered, "min_fill")
    by_set = {frozenset(c): c for c in covered.cliques}
    missing = [c for c in tree.cliques if frozenset(c) not in by_set]
    if missing:
        raise ValueError(f"the network's cliques {list(covered.cliques)} are not a junction "
                         f"tree's (no table for {missing}): record moves need a decomposable "
                         "network")
    deals = []
    for i in tree.order:
        clique = by_set[frozenset(tree.cliques[i])]
        sep = tuple(a for a in clique if a in tree.separators[i])
        new = tuple(a for a in clique if a not in sep)
        deals.append(_Deal(
            slot=covered.slice_of(clique), shape=covered.shapes[covered.clique_index(clique)],
            perm=tuple(clique.index(a) for a in sep + new),
            sep_pos=np.asarray([col[a] for a in sep], dtype=np.int32),
            sep_strides=np.asarray(_strides(dshape, [col[a] for a in sep], d)[
                [col[a] for a in sep]], dtype=np.int32),
            new_pos=np.asarray([col[a] for a in new], dtype=np.int32),
            new_shape=tuple(dom[a] for a in new)))
    return DealPlan(covered, int(total), tuple(deals))


def record_plan(model: Any) -> RecordPlan:
    """The :class:`RecordPlan` of a :class:`~numpyro_dpgm.infer.bayes.NoisyMarginalsModel`."""
    covered, _, deals = deal_plan(model.latent_network, int(model.total_count))
    dom = covered.domain
    d = len(dom.attrs)
    col = {a: i for i, a in enumerate(dom.attrs)}
    dshape = tuple(dom[a] for a in dom.attrs)
    id_cols, id_offsets, queries = [], [], []
    start = 0
    for r, m in zip(model._readouts, model.measurements, strict=True):
        size = m.values.size
        strides = _strides(dshape, [col[a] for a in r.clique], d)
        if r.query is None:
            id_cols.append(strides)
            id_offsets.append(start)
        else:
            queries.append(_Query(slice(start, start + size), strides,
                                  np.asarray(r.query, dtype=float)))
        start += size
    id_strides = (np.stack(id_cols, axis=1) if id_cols
                  else np.zeros((d, 0), dtype=np.int32)).astype(np.int32)
    return RecordPlan(covered, int(model.total_count), deals, id_strides,
                      np.asarray(id_offsets, dtype=np.int32), tuple(queries),
                      model.noise_family, np.asarray(model.noise_scales, dtype=float))


def records_from_tables(plan: Any, n: Array, rng_key: Array, count: Array | None = None
                        ) -> Array:
    """A sequence of ``N`` records drawn uniformly among those whose tables are ``n``.

    Parameters
    ----------
    plan : RecordPlan or DealPlan
    n : array ``(num_params,)``
        Integer-valued, consistent tables in the latent network's layout.
    rng_key : PRNG key
    count : int array, optional
        ``N`` when the tables hold fewer than ``plan.total`` records: the first ``N`` rows are
        the records, the rest padding (codes of no meaning).

    Returns
    -------
    int32 array ``(plan.total, d)``
        Codes in the order of ``plan.network.domain``.
    """
    total = plan.total
    d = len(plan.network.domain.attrs)
    codes = jnp.zeros((total, d), dtype=jnp.int32)
    keys = jax.random.split(rng_key, len(plan.deals))
    # padding rows sort last, so that the records are the first ``count`` rows in every deal
    pad = (jnp.zeros(total, dtype=bool) if count is None
           else jnp.arange(total) >= jnp.asarray(count))
    for deal, key in zip(plan.deals, keys, strict=True):
        table = jnp.transpose(jnp.reshape(n[deal.slot], deal.shape), deal.perm)
        counts = jnp.round(jnp.ravel(table)).astype(jnp.int32)
        cells = jnp.repeat(jnp.arange(counts.size, dtype=jnp.int32), counts,
                           total_repeat_length=total)
        if deal.sep_pos.size:
            # records grouped by separator cell (the rows of the table), random order within
            row = codes[:, deal.sep_pos] @ jnp.asarray(deal.sep_strides)
            u = jax.random.uniform(key, (total,), dtype=jnp.result_type(float))
            order = jnp.lexsort((u, row, pad))
        elif count is None:
            order = jax.random.permutation(key, total)
        else:
            u = jax.random.uniform(key, (total,), dtype=jnp.result_type(float))
            order = jnp.lexsort((u, pad))
        if not deal.new_pos.size:
            continue
        rest = cells % int(np.prod(deal.new_shape))
        new = jnp.stack(jnp.unravel_index(rest, deal.new_shape), axis=-1).astype(jnp.int32)
        codes = codes.at[order[:, None], jnp.asarray(deal.new_pos)[None, :]].set(new)
    return codes


def tables_from_records(plan: RecordPlan, codes: Array, dtype: Any = None) -> Array:
    """The clique tables ``Σ_i φ(x_i)`` of records ``codes`` in the latent network's layout."""
    out = plan.network.features(codes)
    return out if dtype is None else out.astype(dtype)


def log_lik(family: str, y: Array, pred: Array, scale: Array) -> Array:
    if family == "laplace":
        return -jnp.abs(y - pred) / scale
    return -0.5 * ((y - pred) / scale) ** 2


def record_swaps(
    plan: RecordPlan, codes: Array, pred: Array, y: Array, proposals: Array, rng_key: Array,
) -> tuple[Array, Array, Array]:
    """Metropolis–Hastings record swaps, one per proposal, in sequence (module notes, step 2).

    Parameters
    ----------
    plan : RecordPlan
    codes : int array ``(N, d)``
        The current records.
    pred : array ``(num_answers,)``
        The noise-free answers of the current records' tables.
    y : array ``(num_answers,)``
        The released answers.
    proposals : int array ``(K, d)``
        New records, drawn from ``p_θ``.
    rng_key : PRNG key

    Returns
    -------
    codes, pred : the records and answers after the ``K`` moves
    accepted : bool array ``(K,)``
    """
    k_idx, k_u = jax.random.split(rng_key)
    moves = proposals.shape[0]
    idx = jax.random.randint(k_idx, (moves,), 0, plan.total)
    log_u = jnp.log(jax.random.uniform(k_u, (moves,), dtype=pred.dtype))
    strides = jnp.asarray(plan.id_strides)
    offsets = jnp.asarray(plan.id_offsets)
    scales = jnp.asarray(plan.scales, dtype=pred.dtype)
    y = jnp.asarray(y, dtype=pred.dtype)
    fam = plan.family

    def body(carry: tuple[Array, Array], inp: tuple[Array, Array, Array]) -> Any:
        recs, ans = carry
        i, x_new, lu = inp
        x_old = recs[i]
        a_old, a_new = x_old @ strides + offsets, x_new @ strides + offsets
        moved = a_old != a_new
        p_old, p_new = ans[a_old], ans[a_new]
        y_old, y_new, s_old, s_new = y[a_old], y[a_new], scales[a_old], scales[a_new]
        gain = (log_lik(fam, y_old, p_old - 1, s_old) - log_lik(fam, y_old, p_old, s_old)
                + log_lik(fam, y_new, p_new + 1, s_new) - log_lik(fam, y_new, p_new, s_new))
        delta = jnp.sum(jnp.where(moved, gain, 0.0))
        dense = []
        for q in plan.queries:
            mat = jnp.asarray(q.matrix, dtype=pred.dtype)
            change = mat[:, x_new @ q.strides] - mat[:, x_old @ q.strides]
            cur, yq, sq = ans[q.answers], y[q.answers], scales[q.answers]
            delta = delta + jnp.sum(log_lik(fam, yq, cur + change, sq)
                                    - log_lik(fam, yq, cur, sq))
            dense.append((q.answers, change))
        accept = lu < delta
        step = jnp.where(accept & moved, 1.0, 0.0).astype(ans.dtype)
        ans = ans.at[a_old].add(-step).at[a_new].add(step)
        for answers, change in dense:
            ans = ans.at[answers].add(jnp.where(accept, change, 0.0))
        recs = recs.at[i].set(jnp.where(accept, x_new, x_old))
        return (recs, ans), accept

    (codes, pred), accepted = jax.lax.scan(body, (codes, pred), (idx, proposals, log_u))
    return codes, pred, accepted


def record_update(
    plan: RecordPlan, predict: Any, codes: Array, n: Array, theta: Array, y: Array,
    rng_key: Array, moves: int,
) -> tuple[Array, Array, Array]:
    """``moves`` record swaps of records kept from the last update (module notes, steps 2–3).

    Keeping the records between updates, instead of dealing them afresh from ``n`` (step 1),
    gives the same chain of tables: a swap removes a uniformly chosen record, whose cell is
    distributed ∝ ``n`` whatever the records' order, so each swap's law given ``n`` is the
    same. It saves step 1's sort of the ``N`` records per clique at every update.

    Parameters
    ----------
    plan : RecordPlan
    predict : callable
        ``n ↦`` the noise-free answers (the model's ``predict``).
    codes : int array ``(N, d)``
        The records, whose tables are ``n``.
    n : array ``(num_params,)``
    theta : array ``(num_params,)``
        Log-potentials in the latent layout.
    y : array ``(num_answers,)``
    rng_key : PRNG key
    moves : int

    Returns
    -------
    codes, n : the records and their tables after the swaps (``n``'s dtype)
    acceptance : scalar array
        Fraction of the swaps accepted.
    """
    k_prop, k_mh = jax.random.split(rng_key)
    proposals = jt.sample(plan.network, theta, k_prop, int(moves)).astype(jnp.int32)
    codes, _, accepted = record_swaps(plan, codes, predict(n), y, proposals, k_mh)
    return codes, tables_from_records(plan, codes, n.dtype), jnp.mean(accepted, dtype=n.dtype)


def exact_count_update(
    plan: RecordPlan, predict: Any, n: Array, theta: Array, y: Array, rng_key: Array, moves: int,
) -> tuple[Array, Array]:
    """One exact update of the tables ``n`` given ``θ`` and ``y`` (module notes, steps 1–3).

    Parameters
    ----------
    plan : RecordPlan
    predict : callable
        ``n ↦`` the noise-free answers (the model's ``predict``).
    n : array ``(num_params,)``
        Current integer tables (latent layout).
    theta : array ``(num_params,)``
        Log-potentials in the latent layout.
    y : array ``(num_answers,)``
    rng_key : PRNG key
    moves : int
        ``K``, the number of record swaps.

    Returns
    -------
    n : array
        The new tables (same dtype).
    acceptance : scalar array
        Fraction of the ``K`` swaps accepted.
    """
    k_rec, k_swap = jax.random.split(rng_key)
    codes = records_from_tables(plan, n, k_rec)
    _, n, acceptance = record_update(plan, predict, codes, n, theta, y, k_swap, moves)
    return n, acceptance
