r"""Non-centred moves of ``(φ, n)`` together: the exact path's remedy where noise swamps counts.

NUTS on ``φ`` given ``n`` and record swaps on ``n`` given ``φ`` (:mod:`.gibbs`) form a data
augmentation, which mixes slowly in directions where the release says little about the
tables: a cell expecting ``λ`` records under Laplace noise of scale ``b`` with ``λ ≪ 2b²``
has ``n`` nearly determined by ``θ`` and ``θ`` by ``n``, and the pair crawls (the fraction of
missing information, ``2b²/(λ + 2b²)``, is the lag-one autocorrelation). The *non-centred*
parameterisation has the opposite strength (Yu & Meng 2011, interweaving): write each record
through auxiliary variables that do not depend on ``θ`` and move ``θ`` with them fixed, so
that the records follow ``θ`` and only ``y`` resists.

One move changes one reference-coded parameter ``φ_j`` (log odds of the event
``S = {x : x_A = v}``), by ``δ ∼ N(0, s²)`` with ``s`` drawn from :data:`STEP_SCALES` (a
symmetric scale mixture). Along this coordinate ``p_θ`` changes only through ``μ = P_θ(S)``:
the conditionals ``p_θ(· | S)`` and ``p_θ(· | S^c)`` do not depend on ``φ_j``. So record ``i``
is ``(u_i, w_i, w'_i)`` with ``u_i ∼ U(0, 1)``, ``w_i ∼ p_θ(· | S)``, ``w'_i ∼ p_θ(· | S^c)``
and ``x_i = w_i`` if ``u_i < μ`` else ``w'_i``; given the records, these auxiliaries are drawn
from their exact conditionals (``u_i ∼ U(0, μ)`` for a record in ``S``, ``U(μ, 1)`` else; the
unused one of ``w_i, w'_i`` fresh). With them fixed, ``φ_j → φ_j + δ`` moves ``μ`` to ``μ'``
and switches exactly the records whose ``u_i`` lies between: if ``μ' < μ``, each record in
``S`` leaves it with probability ``1 − μ'/μ`` (their number ``k ∼ Binomial(n_S, 1 − μ'/μ)``, a
uniformly random subset) and takes a fresh value from ``p_θ(· | S^c)``; if ``μ' > μ``, each
record outside ``S`` enters with probability ``1 − (1 − μ')/(1 − μ)`` and takes a value from
``p_θ(· | S)``. The target of ``(φ, u, w, w')`` is ``p(φ) · p(y | n(φ, u, w, w'))`` (the
auxiliaries' laws do not depend on ``φ_j``), and the proposal is symmetric, so the move is
accepted with probability (``μ' = μe^δ / (μe^δ + 1 − μ)`` in closed form)

.. math:: α = \min\Big(1, \frac{p(φ')\, p(y \mid n')}{p(φ)\, p(y \mid n)}\Big),

which leaves the joint posterior of ``(φ, n)`` invariant. A move that would switch more than
``k_max`` records is rejected (the reverse move switches the same records, so the restriction
is symmetric). Each move costs one junction-tree calibration and ``O(N)`` to pick the
switching records.
"""

from __future__ import annotations

import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ...inference import junction_tree as jt
from .records import RecordPlan, _log_lik

__all__ = ["STEP_SCALES", "noncentred_moves", "noise_share"]

Array = Any

#: Scales ``s`` of the proposal ``δ ∼ N(0, s²)``, each drawn with equal probability: log odds
#: steps from a twentieth to two.
STEP_SCALES = (0.05, 0.2, 0.7, 2.0)
#: Log-potential added to the cells a conditional draw must avoid.
_EXCLUDE = -1e4


def noise_share(model: Any) -> np.ndarray:
    """Per parameter ``φ_j`` (event ``x_A = v``), the share of the noise in the released count of
    its event: ``V / (max(ŷ, 1) + V)`` with ``ŷ`` the event's count summed from the smallest
    identity measurement containing ``A`` and ``V`` that sum's noise variance (``2b²`` or
    ``σ²`` per cell); 1 where no measurement contains ``A``. The data augmentation mixes
    slowly where it is near 1, so the non-centred moves pick ``j`` with these weights."""
    out = np.ones(model.coding.dim)
    net = model.network
    meas = [(m, r) for m, r in zip(model.measurements, model._readouts, strict=True)
            if r.query is None]
    j = 0
    for attrs, _host in model.coding.terms:
        fits = [(m, r) for m, r in meas if set(attrs) <= set(r.clique)]
        best = min(fits, key=lambda mr: mr[0].values.size) if fits else None
        for v in itertools.product(*(range(1, net.domain[a]) for a in attrs)):
            if best is not None:
                m, r = best
                table = np.asarray(m.values, dtype=float).reshape(net.domain.shape_of(r.clique))
                sel = tuple(v[attrs.index(a)] if a in attrs else slice(None) for a in r.clique)
                part = table[sel]
                var = float(np.size(part)) * _cell_variance(model, m)
                out[j] = var / (max(float(np.sum(part)), 1.0) + var)
            j += 1
    return out


def _cell_variance(model: Any, m: Any) -> float:
    scale = m.noise.scale if model.noise_family == "laplace" else m.noise.sigma
    return 2.0 * scale**2 if model.noise_family == "laplace" else scale**2


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
    weights : array ``(dim,)``, optional
        Probabilities (up to a constant) of picking each ``φ_j`` (default uniform; a choice
        that does not depend on the state keeps every move reversible).

    Returns
    -------
    codes, n, phi : the new records, tables and parameters
    accepted : bool array ``(moves,)``
    """
    net = plan.network
    k_max = int(min(k_max, plan.total))
    dim = model.coding.dim
    prior_scale = jnp.broadcast_to(jnp.asarray(model.prior_scale, dtype=phi.dtype), (dim,))
    owner = np.repeat(np.arange(len(net.cliques)), net.sizes)  # clique of each flat cell
    owner = jnp.asarray(owner)
    scales = jnp.asarray(STEP_SCALES, dtype=phi.dtype)
    log_w = jnp.log(jnp.ones(dim, phi.dtype) if weights is None
                    else jnp.asarray(weights, dtype=phi.dtype))
    fam, ys = plan.family, jnp.asarray(plan.scales, dtype=phi.dtype)

    def eta_of(p: Array) -> Array:
        return model.latent_theta(model.coding.to_theta(p))

    def prob(eta: Array, indicator: Array) -> Array:
        return indicator @ net.flatten(jt.marginals(net, eta))

    def body(carry: tuple, key: Array) -> tuple:
        codes, n, phi = carry
        k_j, k_s, k_d, k_b, k_pick, k_new, k_u = jax.random.split(key, 7)
        j = jax.random.categorical(k_j, log_w)
        delta = scales[jax.random.randint(k_s, (), 0, scales.size)] * jax.random.normal(
            k_d, dtype=phi.dtype)
        ind = model.latent_theta(model.coding.to_theta(jnp.zeros(dim, phi.dtype).at[j].set(1)))
        eta = eta_of(phi)
        mu = prob(eta, ind)
        mu_new = mu * jnp.exp(delta) / (mu * jnp.exp(delta) + 1.0 - mu)  # θ' = θ + δ·1_S
        shrink = mu_new < mu
        idx = net.cell_indices(codes)
        member = jnp.sum(ind[idx], axis=-1) > 0.5
        pool = jnp.where(shrink, member, ~member)
        p_switch = jnp.where(shrink, 1.0 - mu_new / mu, 1.0 - (1.0 - mu_new) / (1.0 - mu))
        p_switch = jnp.clip(p_switch, 0.0, 1.0)
        k = jax.random.binomial(k_b, jnp.sum(pool).astype(phi.dtype), p_switch)
        scores = jnp.where(pool, jax.random.uniform(k_pick, pool.shape, dtype=phi.dtype), 2.0)
        _, pick = jax.lax.top_k(-scores, k_max)
        active = jnp.arange(k_max) < k
        # fresh values from p_θ(· | S^c) when S shrinks, from p_θ(· | S) when it grows
        host = owner == owner[jnp.argmax(ind)]
        avoid = jnp.where(shrink, ind, jnp.where(host, 1.0 - ind, 0.0))
        fresh = jt.sample(net, eta + _EXCLUDE * avoid, k_new, k_max).astype(codes.dtype)
        old = codes[pick]
        new = jnp.where(active[:, None], fresh, old)
        change = (jnp.zeros_like(n).at[net.cell_indices(new).ravel()].add(1.0)
                  .at[net.cell_indices(old).ravel()].add(-1.0))
        n_new = n + change
        phi_new = phi.at[j].add(delta)
        log_alpha = (jnp.sum(_log_lik(fam, y, model.predict(n_new), ys)
                             - _log_lik(fam, y, model.predict(n), ys))
                     - 0.5 * ((phi_new[j] / prior_scale[j]) ** 2 - (phi[j] / prior_scale[j]) ** 2))
        accept = (k <= k_max) & (jnp.log(jax.random.uniform(k_u, dtype=phi.dtype)) < log_alpha)
        codes = jnp.where(accept, codes.at[pick].set(new), codes)
        n = jnp.where(accept, n_new, n)
        phi = jnp.where(accept, phi_new, phi)
        return (codes, n, phi), accept

    (codes, n, phi), accepted = jax.lax.scan(body, (codes, n, phi),
                                             jax.random.split(rng_key, int(moves)))
    return codes, n, phi, accepted
