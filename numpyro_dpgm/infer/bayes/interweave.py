r"""Non-centred moves of ``(φ, n)`` together: the exact path's remedy where noise swamps counts.

NUTS on ``φ`` given ``n`` and record swaps on ``n`` given ``φ`` (:mod:`.gibbs`) form a data
augmentation, which mixes slowly in directions where the release says little about the
tables: a cell expecting ``λ`` records under Laplace noise of scale ``b`` with ``λ ≪ 2b²``
has ``n`` nearly determined by ``θ`` and ``θ`` by ``n``, and the pair crawls (the fraction of
missing information, ``2b²/(λ + 2b²)``, is the lag-one autocorrelation). The *non-centred*
parameterisation has the opposite strength (Yu & Meng 2011, interweaving): write each record
through auxiliary variables that do not depend on ``θ`` and move ``θ`` with them fixed, so
that the records follow ``θ`` and only ``y`` resists.

One move adds ``δ ∼ N(0, s²)`` (``s`` drawn from :data:`STEP_SCALES`, a symmetric scale
mixture) to the log-potential of one event ``S``: either the event ``x_A = v`` of a
reference-coded parameter ``φ_j`` (``φ_j → φ_j + δ``), or a cell ``x_C = c`` of a clique table
(``θ_C(c) → θ_C(c) + δ``, which is ``φ → φ + δ·R e_c`` with ``R`` the Möbius inversion of
:meth:`~.coding.ReferenceCoding.from_theta`). The cells matter where a reference cell is
sparse: its log odds enter every parameter of its term, and no single ``φ_j`` moves them.
A cell event may also move *within a context* ``C = {x_a = c_a}``, one attribute of its clique
held at the cell's value: ``δ`` is added on ``S`` and ``κ = log(μe^δ + 1 − μ)`` taken off
``C``, with ``μ = P_θ(S | C)``, which keeps ``P_θ(C)`` and every conditional below; only the
records in ``C`` switch between ``S`` and ``C ∖ S``. These are the directions a release pins
least: where the margin ``x_a = c_a`` is measured closely and its split among the other
attribute's values is not (a sparse row of a two-way table), an unconditional move changes the
pinned margin and is rejected. (The map ``(φ, δ) ↦ (φ', −δ)`` is an involution, since
``κ`` turns into ``−κ``, and has unit Jacobian, since moving ``θ`` along ``1_C`` leaves
``P(S | C)`` unchanged, so the acceptance probability below needs no correction.) The
unconditional moves are the case ``C`` = everything, which the argument below takes (within
a context, read ``C ∖ S`` for ``S^c`` and the records in ``C`` for all records).
Along such a direction ``p_θ`` changes only through ``μ = P_θ(S)``: the conditionals
``p_θ(· | S)`` and ``p_θ(· | S^c)`` do not depend on ``δ``. So record ``i``
is ``(u_i, w_i, w'_i)`` with ``u_i ∼ U(0, 1)``, ``w_i ∼ p_θ(· | S)``, ``w'_i ∼ p_θ(· | S^c)``
and ``x_i = w_i`` if ``u_i < μ`` else ``w'_i``; given the records, these auxiliaries are drawn
from their exact conditionals (``u_i ∼ U(0, μ)`` for a record in ``S``, ``U(μ, 1)`` else; the
unused one of ``w_i, w'_i`` fresh). With them fixed, the move takes ``μ`` to ``μ'``
and switches exactly the records whose ``u_i`` lies between: if ``μ' < μ``, each record in
``S`` leaves it with probability ``1 − μ'/μ`` (their number ``k ∼ Binomial(n_S, 1 − μ'/μ)``, a
uniformly random subset) and takes a fresh value from ``p_θ(· | S^c)``; if ``μ' > μ``, each
record outside ``S`` enters with probability ``1 − (1 − μ')/(1 − μ)`` and takes a value from
``p_θ(· | S)``. The target of ``(φ, u, w, w')`` is ``p(φ) · p(y | n(φ, u, w, w'))`` (the
auxiliaries' laws do not depend on ``δ``), and the proposal is symmetric, so the move is
accepted with probability (``μ' = μe^δ / (μe^δ + 1 − μ)`` in closed form)

.. math:: α = \min\Big(1, \frac{p(φ')\, p(y \mid n')}{p(φ)\, p(y \mid n)}\Big),

which leaves the joint posterior of ``(φ, n)`` invariant. A move that would switch more than
``k_max`` records is rejected (the reverse move switches the same records, so the restriction
is symmetric). Each move costs one junction-tree calibration and ``O(N)`` to pick the
switching records (one look-up of each record's cell of the event's table, kept up to date
between moves).

Under the conditional coding (:mod:`.conditional`) the parameters are the log odds of the
junction tree's conditionals, and the argument needs the map from ``θ``'s move to ``φ``'s to be
linear. It is for a move that keeps every conditional normalised: an event within one block's
context (a separator cell ``x_S = s``, or the root clique's table), where ``φ``'s change is
:meth:`~.conditional.ConditionalCoding.tangent`. So :func:`events` offers those moves only: each
cell of a junction-tree clique within its separator cell, and within the value of one residual
attribute more where the residual has two or more. Directions such as one attribute's margin
across a separator's values have no such move, which is why the exact path mixes more slowly
under this coding (the how-to on the CGM has the figures).
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ...oracles import junction_tree as jt
from .conditional import ConditionalCoding
from .records import RecordPlan, log_lik

__all__ = ["STEP_SCALES", "Events", "events", "noncentred_moves", "noise_share",
           "released_noise_share"]

Array = Any

#: Scales ``s`` of the proposal ``δ ∼ N(0, s²)``, each drawn with equal probability: log odds
#: steps from a twentieth to two.
STEP_SCALES = (0.05, 0.2, 0.7, 2.0)
#: Log-potential added to the cells a conditional draw must avoid.
_EXCLUDE = -1e4


class Events(NamedTuple):
    """The events of :func:`noncentred_moves`, one row each (numpy arrays, static).

    Attributes
    ----------
    phi : int array
        ``j`` for the event ``x_A = v`` of parameter ``φ_j``, else -1.
    cell : int array
        The cell (network layout) for an event ``x_C = c`` of a clique table, else -1.
    context : int array
        For a cell event, a bit mask of the positions in its clique of the attributes whose
        values it keeps (the move stays within ``x_a = c_a`` for each), 0 for none (the move
        is unconditional).
    host : int array
        The network clique whose table holds the event.
    """

    phi: np.ndarray
    cell: np.ndarray
    context: np.ndarray
    host: np.ndarray


def events(network: Any, coding: Any) -> Events:
    """Every event of the non-centred moves of ``network`` (with its ``coding``).

    Reference coding: the parameters' events, the cells of the clique tables, and each cell of a
    clique of two or more attributes within the value of each of its attributes. Conditional
    coding: each cell of the junction tree's cliques within its separator cell (a move of one
    conditional ``p(x_R | x_S = s)``), and where the residual has two or more attributes, also
    within the value of each of them: moves that keep every conditional normalised, so that
    they are linear in ``β``."""
    if isinstance(coding, ConditionalCoding):
        rows = []
        for clique, sep, res in coding.blocks:
            h = network.clique_index(clique)
            mask = sum(1 << clique.index(a) for a in sep)
            masks = [mask] + ([mask | 1 << clique.index(a) for a in res] if len(res) > 1 else [])
            rows += [(-1, network.offsets[h] + c, m, h) for c in range(network.sizes[h])
                     for m in masks]
        return Events(*(np.asarray(col, dtype=np.int32) for col in zip(*rows, strict=True)))
    hosts = [host for attrs, host in coding.terms
             for _ in itertools.product(*coding.levels(attrs))]
    rows = [(j, -1, 0, host) for j, host in enumerate(hosts)]
    for h, (clique, size, offset) in enumerate(zip(network.cliques, network.sizes,
                                                   network.offsets, strict=True)):
        contexts = [0] + ([1 << pos for pos in range(len(clique))] if len(clique) > 1 else [])
        rows += [(-1, offset + c, mask, h) for c in range(size) for mask in contexts]
    return Events(*(np.asarray(col, dtype=np.int32) for col in zip(*rows, strict=True)))


def noise_share(model: Any) -> np.ndarray:
    """Per event of :func:`events`, the share of the noise in its released count:
    ``V / (max(ŷ, 1) + V)`` with ``ŷ`` the event's count summed from the smallest identity
    measurement containing its attributes and ``V`` that sum's noise variance (``2b²`` or
    ``σ²`` per cell); 1 where no measurement contains them. The data augmentation mixes
    slowly where it is near 1, so the non-centred moves pick events with these weights."""
    net = model.network
    meas = [(m, r) for m, r in zip(model.measurements, model._readouts, strict=True)
            if r.query is None]

    def share(attrs: tuple, values: tuple) -> float:
        fits = [(m, r) for m, r in meas if set(attrs) <= set(r.clique)]
        if not fits:
            return 1.0
        m, r = min(fits, key=lambda mr: mr[0].values.size)
        table = np.asarray(m.values, dtype=float).reshape(net.domain.shape_of(r.clique))
        part = table[tuple(values[attrs.index(a)] if a in attrs else slice(None)
                           for a in r.clique)]
        return _missing_information(float(np.sum(part)), float(np.size(part))
                                    * m.noise.variance)

    coding = model.coding
    of_phi = [] if isinstance(coding, ConditionalCoding) else [
        share(attrs, v) for attrs, _host in coding.terms
        for v in itertools.product(*coding.levels(attrs))]
    of_cell = np.asarray([share(tuple(c), cell) for c, shape in
                          zip(net.cliques, net.shapes, strict=True) for cell in np.ndindex(*shape)])
    ev = events(net, coding)
    return np.where(ev.phi >= 0, np.asarray(of_phi + [1.0])[np.maximum(ev.phi, 0)],
                    of_cell[np.maximum(ev.cell, 0)])


def released_noise_share(model: Any) -> np.ndarray:
    """Per released value of the model's measurements, the share of the noise in it,
    ``V / (max(y, 1) + V)`` (``V``: the noise's variance, ``noise.variance``): the fraction of
    missing information about the count it releases. Near 1 the noise swamps the count; near 0
    the release pins it (:func:`~numpyro_dpgm.infer.bayes.paths.choose_path` reads the median).

    >>> import numpy as np
    >>> from numpyro_dpgm import MarkovNetwork
    >>> from numpyro_dpgm.infer.bayes import noisy_marginals_model
    >>> from numpyro_dpgm.measurements import Laplace, Measurement
    >>> y = np.array([798.0, 198.0, -3.0])
    >>> model = noisy_marginals_model(MarkovNetwork({"a": 3}, [("a",)]),
    ...                               [Measurement(("a",), y, Laplace(1.0))], 1000)
    >>> released_noise_share(model).round(3).tolist()  # V = 2: 2/800, 2/200, 2/3
    [0.002, 0.01, 0.667]
    """
    return np.concatenate([
        _missing_information(np.asarray(m.values, dtype=float).ravel(), m.noise.variance)
        for m in model.measurements])


def _missing_information(count: Any, variance: float) -> Any:
    return variance / (np.maximum(count, 1.0) + variance)


def noncentred_moves(
    plan: RecordPlan, model: Any, codes: Array, n: Array, phi: Array, y: Array, rng_key: Array,
    moves: int, k_max: int = 256, weights: Array | None = None,
) -> tuple[Array, Array, Array, Array]:
    """``moves`` non-centred Metropolis–Hastings moves of ``(φ, n)`` (module notes).

    Parameters
    ----------
    plan : RecordPlan
    model : NoisyMarginalsModel
        With ``θ`` inferred (its ``coding``, ``prior_scale``, ``latent_theta``, ``predict``).
    codes : int array ``(N, d)``
        The records behind ``n`` (:func:`~.records.records_from_tables` deals them).
    n : array ``(num_params,)``
        Integer tables, latent layout.
    phi : array ``(dim,)``
    y : array ``(num_answers,)``
    rng_key : PRNG key
    moves : int
    k_max : int
        Most records one move may switch.
    weights : array ``(dim + num_params,)``, optional
        Probabilities (up to a constant) of picking each event: the ``φ_j``'s, then the cells
        of the network's clique tables (:func:`noise_share`'s order; default uniform; a choice
        that does not depend on the state keeps every move reversible).

    Returns
    -------
    codes, n, phi : the new records, tables and parameters
    accepted : bool array ``(moves,)``
    """
    net, layout = plan.network, model.network
    k_max = int(min(k_max, plan.total))
    dim, cells = model.coding.dim, layout.num_params
    prior_scale = jnp.broadcast_to(jnp.asarray(model.prior_scale, dtype=phi.dtype), (dim,))
    owner = jnp.asarray(np.repeat(np.arange(len(net.cliques)), net.sizes))  # latent cells
    owner_net = jnp.asarray(np.repeat(np.arange(len(layout.cliques)), layout.sizes))
    width = max(len(c) for c in layout.cliques)
    coords = jnp.asarray(np.concatenate([  # each network cell's coordinates in its clique
        np.pad(np.stack(np.unravel_index(np.arange(size), shape), -1),
               ((0, 0), (0, width - len(shape)))) if shape else np.zeros((1, width), int)
        for shape, size in zip(layout.shapes, layout.sizes, strict=True)]))
    ev = Events(*(jnp.asarray(a) for a in events(layout, model.coding)))
    scales = jnp.asarray(STEP_SCALES, dtype=phi.dtype)
    log_w = jnp.log(jnp.ones(ev.phi.size, phi.dtype) if weights is None
                    else jnp.asarray(weights, dtype=phi.dtype))
    fam, ys = plan.family, jnp.asarray(plan.scales, dtype=phi.dtype)
    tiny = jnp.finfo(phi.dtype).tiny

    def eta_of(p: Array) -> Array:
        return model.latent_theta(model.coding.to_theta(p))

    def indicators(e: Array) -> tuple[Array, Array]:
        """The event's cells and its context's, in the network's layout (one clique)."""
        j, c, mask, host = ev.phi[e], ev.cell[e], ev.context[e], ev.host[e]
        unit = jnp.zeros(dim, phi.dtype).at[jnp.maximum(j, 0)].set(1.0)
        event = jnp.where(j >= 0, model.coding.to_theta(unit),
                          jnp.zeros(cells, phi.dtype).at[jnp.maximum(c, 0)].set(1.0))
        held = ((mask >> jnp.arange(width)) & 1) == 1
        kept = jnp.all((coords == coords[jnp.maximum(c, 0)]) | ~held, axis=1)
        context = (owner_net == host) & kept
        return event, context.astype(phi.dtype)

    def body(carry: tuple, key: Array) -> tuple:
        codes, idx, n, phi = carry
        k_j, k_s, k_d, k_pick, k_new, k_u = jax.random.split(key, 6)
        event, context = indicators(jax.random.categorical(k_j, log_w))
        delta = scales[jax.random.randint(k_s, (), 0, scales.size)] * jax.random.normal(
            k_d, dtype=phi.dtype)
        eta = eta_of(phi)
        ind, ctx = model.latent_theta(event), model.latent_theta(context)
        marg = net.flatten(jt.marginals(net, eta))
        # μ = P(S | C); the move adds δ on S and −κ on C, which keeps P(C)
        mu = jnp.clip((ind @ marg) / jnp.maximum(ctx @ marg, tiny), tiny, 1.0 - 1e-12)
        grown = mu * jnp.exp(delta) + 1.0 - mu
        mu_new, kappa = mu * jnp.exp(delta) / grown, jnp.log(grown)
        shrink = mu_new < mu
        host = owner[jnp.argmax(ind)]  # the latent clique whose table holds the event
        col = jnp.take(idx, host, axis=1)
        in_s, in_c = ind[col] > 0.5, ctx[col] > 0.5
        pool = jnp.where(shrink, in_s, in_c & ~in_s)
        p_switch = jnp.where(shrink, 1.0 - mu_new / mu, 1.0 - (1.0 - mu_new) / (1.0 - mu))
        p_switch = jnp.clip(p_switch, 0.0, 1.0)
        # each record of the pool switches independently (a Binomial number, a uniform subset)
        switch = pool & (jax.random.uniform(k_pick, pool.shape, dtype=phi.dtype) < p_switch)
        k = jnp.sum(switch)
        (pos,) = jnp.nonzero(switch, size=k_max, fill_value=plan.total)
        active = jnp.arange(k_max) < k
        # fresh values from p_θ(· | C∖S) when S shrinks, from p_θ(· | S) when it grows
        target = jnp.where(shrink, ctx - ind, ind)
        avoid = jnp.where(owner == host, 1.0 - target, 0.0)
        fresh = jt.sample(net, eta + _EXCLUDE * avoid, k_new, k_max).astype(codes.dtype)
        fresh_idx = net.cell_indices(fresh).astype(idx.dtype)
        weight = jnp.repeat(active.astype(n.dtype), idx.shape[-1])
        change = (jnp.zeros_like(n).at[fresh_idx.ravel()].add(weight)
                  .at[idx[pos].ravel()].add(-weight))
        n_new = n + change
        phi_new = (phi + delta * model.coding.tangent(event)
                   - kappa * model.coding.tangent(context))
        log_alpha = (jnp.sum(log_lik(fam, y, model.predict(n_new), ys)
                             - log_lik(fam, y, model.predict(n), ys))
                     - 0.5 * jnp.sum((phi_new / prior_scale) ** 2 - (phi / prior_scale) ** 2))
        accept = (k <= k_max) & (jnp.log(jax.random.uniform(k_u, dtype=phi.dtype)) < log_alpha)
        at = jnp.where(accept & active, pos, plan.total)  # out of range: dropped
        codes = codes.at[at].set(fresh, mode="drop")
        idx = idx.at[at].set(fresh_idx, mode="drop")
        n = jnp.where(accept, n_new, n)
        phi = jnp.where(accept, phi_new, phi)
        return (codes, idx, n, phi), accept

    idx = net.cell_indices(codes).astype(jnp.int32)
    (codes, _, n, phi), accepted = jax.lax.scan(body, (codes, idx, n, phi),
                                                jax.random.split(rng_key, int(moves)))
    return codes, n, phi, accepted
