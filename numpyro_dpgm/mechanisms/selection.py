"""Private selection: the exponential mechanism, drawn by OpenDP or by a seeded JAX sampler.

The exponential mechanism (McSherry & Talwar 2007) picks candidate ``i`` with probability
``∝ exp(ε·q_i/(2Δ))``, where ``q_i`` is its score on the data and ``Δ`` the largest change of
any score between neighbouring data sets. It is ε-DP and, being ε-bounded-range, ε²/8-zCDP
(Cesar & Rogers 2021, Lemma 3.2; Durfee & Rogers 2019): a zCDP budget ``ρ`` buys
``ε = √(8ρ)`` (:func:`selection_epsilon`). A ledger is debited with both guarantees,
``[ZCDP(ε²/8), PureDP(ε)]``, and charges the one its currency accepts.

Both samplers draw the exponential mechanism exactly, as "report noisy max" with Gumbel noise of
scale ``2Δ/ε`` (the Gumbel-max trick):

* ``sampler="opendp"`` (for real runs): OpenDP's ``make_noisy_max`` with output measure
  ``zero_concentrated_divergence`` (Gumbel noise, sampled exactly; McKenna & Sheldon 2020,
  "Permute-and-flip", compare OpenDP's documentation). Its own privacy map at ``d_in = Δ``
  must agree with ``ε²/8`` or the selection is refused before anything is charged. It draws
  from the operating system's cryptographic random source and cannot be seeded. Its
  constructors need the ``"contrib"`` feature, enabled only while the measurement is built.
* ``sampler="jax"``: Gumbel-max from a JAX key, **for simulation studies only** (reproducible,
  but built on a floating-point sampler).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..privacy.guarantees import ZCDP, PrivacyCost, PureDP
from ..privacy.ledger import PrivacyLedger
from ..privacy.samplers import opendp_contrib
from ..privacy.sensitivity import check_sampler

__all__ = ["Selection", "exponential_mechanism", "selection_epsilon", "selection_guarantees"]

#: OpenDP's privacy map may differ from the closed form by floating-point rounding only.
_OPENDP_MAP_TOLERANCE = 1e-9
#: The seeded sampler draws at least this many Gumbel variables (one compiled program for
#: every run with at most this many candidates).
GUMBEL_BLOCK = 256


class Selection(NamedTuple):
    """The outcome of the exponential mechanism.

    Attributes
    ----------
    index : int
        The selected candidate.
    probabilities : numpy array ``(k,)``
        Every candidate's selection probability ``softmax(ε·q/(2Δ))`` (a diagnostic computed
        from the private scores: do not release it).
    """

    index: int
    probabilities: np.ndarray


def selection_epsilon(rho: float) -> float:
    """ε of an exponential mechanism that costs ``ρ`` in zCDP: ``ε = √(8ρ)`` (Cesar & Rogers
    2021, Lemma 3.2: ε-DP selection is ε²/8-zCDP)."""
    if not (math.isfinite(rho) and rho > 0):
        raise ValueError(f"rho must be a positive finite number, got {rho!r}")
    return math.sqrt(8.0 * rho)


def selection_guarantees(epsilon: float) -> tuple[PrivacyCost, PrivacyCost]:
    """``(ZCDP(ε²/8), PureDP(ε))``: what one run of the exponential mechanism satisfies."""
    return ZCDP(epsilon * epsilon / 8.0), PureDP(epsilon)


def _check(scores: Any, epsilon: float, sensitivity: float) -> np.ndarray:
    scores = np.asarray(scores, dtype=float)
    if scores.ndim != 1 or scores.size == 0 or not np.all(np.isfinite(scores)):
        raise ValueError("scores must be a non-empty 1-d array of finite numbers")
    if not (isinstance(epsilon, float | int) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
    if not (isinstance(sensitivity, float | int) and math.isfinite(sensitivity)
            and sensitivity > 0):
        raise ValueError(f"sensitivity must be a positive finite number, got {sensitivity!r}")
    return scores


def _opendp_noisy_max(scale: float, sensitivity: float) -> tuple[Any, float]:
    """OpenDP's Gumbel report-noisy-max on ``Vec<f64>`` and its zCDP map at ``sensitivity``."""
    with opendp_contrib() as dp:
        space = (dp.vector_domain(dp.atom_domain(T="f64", nan=False)),
                 dp.linf_distance(T="f64", monotonic=False))
        meas = dp.m.make_noisy_max(*space, dp.zero_concentrated_divergence(), scale=scale)
        return meas, float(meas.map(float(sensitivity)))


def exponential_mechanism(
    scores: Any,
    epsilon: float,
    sensitivity: float,
    *,
    sampler: str = "opendp",
    rng_key: Any = None,
    ledger: PrivacyLedger | None = None,
    label: str = "exponential mechanism",
    details: dict | None = None,
) -> Selection:
    """Select an index with probability ``∝ exp(ε·score/(2Δ))`` (McSherry & Talwar 2007).

    Parameters
    ----------
    scores : array ``(k,)``
        Utility of every candidate on the data (larger is better), finite.
    epsilon : float
        ``ε > 0``: the selection is ε-DP and ε²/8-zCDP.
    sensitivity : float
        ``Δ``, the largest change of any score between neighbouring data sets.
    sampler : {"opendp", "jax"}
        OpenDP's vetted Gumbel noisy-max (real runs; not seedable), or Gumbel-max from
        ``rng_key`` (**simulation studies only**).
    rng_key : JAX PRNG key or int, optional
        Required by ``sampler="jax"``, refused by ``"opendp"``.
    ledger : PrivacyLedger, optional
        Debited with ``[ZCDP(ε²/8), PureDP(ε)]`` after every check and before the draw.
    label : str
        The ledger entry's label.
    details : dict, optional
        Extra facts for the ledger entry.

    Returns
    -------
    Selection
        ``(index, probabilities)``.

    Raises
    ------
    ValueError
        Empty or non-finite scores, ``ε`` or ``Δ`` not positive, a bad sampler or key, or
        OpenDP's privacy map disagreeing with ``ε²/8``.
    BudgetExceededError
        If the ledger cannot pay; nothing is drawn or charged.

    Examples
    --------
    >>> import jax
    >>> sel = exponential_mechanism([1.0, 3.0, 2.0], 2.0, 1.0, sampler="jax",
    ...                             rng_key=jax.random.key(0))
    >>> [round(float(p), 4) for p in sel.probabilities]
    [0.09, 0.6652, 0.2447]
    """
    scores = _check(scores, epsilon, sensitivity)
    sampler = check_sampler(sampler)
    logits = float(epsilon) * (scores - scores.max()) / (2.0 * float(sensitivity))
    probs = np.exp(logits - np.logaddexp.reduce(logits))
    info: dict[str, Any] = {"mechanism": "exponential", "epsilon": float(epsilon),
                            "sensitivity": float(sensitivity), "candidates": int(scores.size),
                            "sampler": sampler, **(details or {})}
    if sampler == "opendp":
        if rng_key is not None:
            raise ValueError("sampler='opendp' cannot be seeded; drop rng_key= or use "
                             "sampler='jax' (simulation studies only)")
        scale = 2.0 * float(sensitivity) / float(epsilon)
        meas, rho_map = _opendp_noisy_max(scale, sensitivity)
        closed_form = float(epsilon) ** 2 / 8.0
        if rho_map > closed_form * (1.0 + _OPENDP_MAP_TOLERANCE):
            raise ValueError(f"OpenDP's privacy map gives rho = {rho_map!r} for this selection "
                             f"but the ledger would be charged eps^2/8 = {closed_form!r}; "
                             "refusing to select")
        info["opendp_map"] = rho_map
    else:
        if rng_key is None:
            raise ValueError("sampler='jax' (simulation studies only) needs rng_key=")
        key = jax.random.key(int(rng_key)) if isinstance(rng_key, int | np.integer) else rng_key
    if ledger is not None:
        ledger.debit(selection_guarantees(float(epsilon)), label, info)
    if sampler == "opendp":
        index = int(meas(scores.tolist()))
    else:
        dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
        # drawn in a power-of-two length of at least GUMBEL_BLOCK (sliced), so that a run
        # whose number of candidates changes every round compiles the sampler once or twice,
        # not once per length
        size = max(GUMBEL_BLOCK, 1 << max(0, int(scores.size - 1).bit_length()))
        gumbel = np.asarray(jax.random.gumbel(key, (size,), dtype=dtype))[: scores.size]
        index = int(np.argmax(logits + gumbel))
    return Selection(index, probs)
