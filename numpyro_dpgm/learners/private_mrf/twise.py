"""Private learning of binary t-wise MRFs under ρ-zCDP (seed 001, Alg. 4, §4.1, and Alg. 5, §4.2).

``P(z) ∝ exp(h(z))`` with ``h`` multilinear of degree ``≤ t``: per-node regressions on parity
features (Alg. 4), and monomial estimates from privately released parity means (Alg. 5,
:mod:`.parities`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jax
import numpy as np

from ..._precision import warn_if_float32
from ...domain import Domain
from ...infer.result import Result
from ...privacy.guarantees import ZCDP, ApproxDP
from ...privacy.ledger import PrivacyLedger
from ..frank_wolfe import (
    NoiseMultiplier,
    check_iterations,
    default_iterations,
    fw_noise_scale,
    fw_zcdp_cost,
    resolve_noise_multiplier,
    resolve_privacy,
)
from ._charges import Charge, debit_all
from ._inputs import check_width, need_key, spins_from_data
from ._regressions import compress_rows, solve_problems
from .conversions import Monomial, twise_to_mrf
from .parities import gaussian_parities, parity_columns, pmw_parities

__all__ = ["learn_twise", "monomial_estimates"]


def _node_monomials(p: int, i: int, order: int) -> list[Monomial]:
    """``F_i``: the subsets of ``[p] \\ {i}`` of size ``1..t−1`` (by size, then
    lexicographically), then ``∅`` last, so that ``t = 2`` gives Alg. 2's ``(z_{−i}, 1)``."""
    others = [j for j in range(p) if j != i]
    out: list[Monomial] = []
    for s in range(1, order):
        out.extend(itertools.combinations(others, s))
    out.append(())
    return out


def monomial_estimates(
    node_coefficients: Sequence[Mapping[Monomial, float]],
    parities: Mapping[Monomial, float],
    order: int,
) -> dict[Monomial, float]:
    """Step 3 of Alg. 5: ``ĥ(I) = Σ_{J ⊇ I} ū_i(J) Q̂(J \\ I)``, ``i = min I``, ``Q̂(∅) = 1``.

    This is the mean over the data of ``∂_I u_i``, written through parity means; for a maximal
    monomial ``I`` of ``h`` it estimates ``h̄(I)`` (KM17 Lemma 6.4; seed 001, Lemma 4.4) [spec §6.2].

    Parameters
    ----------
    node_coefficients : sequence of mappings
        ``node_coefficients[i][J] = ū_i(J)`` for monomials ``J ∋ i`` (sorted tuples), the
        polynomial of node ``i``'s regression.
    parities : mapping
        ``Q̂(S) ≈ (1/n) Σ_m z^m_S`` for the sets ``S`` the sum needs (sorted tuples).
    order : int
        ``t``: every ``I`` with ``1 ≤ |I| ≤ t`` is estimated.

    Returns
    -------
    dict
        ``ĥ(I)`` for every ``I`` with ``1 ≤ |I| ≤ t`` over the ``len(node_coefficients)`` nodes.
    """
    p = len(node_coefficients)
    coefs = [{tuple(sorted(J)): float(v) for J, v in nc.items()} for nc in node_coefficients]
    par = {tuple(sorted(S)): float(v) for S, v in parities.items()}
    par[()] = 1.0
    out: dict[Monomial, float] = {}
    for size in range(1, order + 1):
        for I in itertools.combinations(range(p), size):
            i, Iset = I[0], set(I)
            total = 0.0
            for J, u in coefs[i].items():
                if Iset <= set(J):
                    rest = tuple(j for j in J if j not in Iset)
                    if rest not in par:
                        raise KeyError(
                            f"parity estimate of {rest} is needed for monomial {I} but missing"
                        )
                    total += u * par[rest]
            out[I] = total
    return out


def learn_twise(
    data: Any,
    domain: Domain | Sequence[str] | None = None,
    *,
    budget: float | ZCDP | None,
    rng_key: jax.Array | None = None,
    ledger: PrivacyLedger | None = None,
    order: int,
    width: float,
    estimator: Literal["parity", "regression"] = "parity",
    parity_release: Literal["pmw", "gaussian"] = "pmw",
    pmw_alpha: float = 0.05,
    split: bool = False,
    regression_share: float = 0.5,
    iterations: int | None = None,
    noise_multiplier: NoiseMultiplier = "rigorous",
    coding: Literal["spin", "code"] = "spin",
) -> Result:
    """Learn a binary t-wise MRF ``P(z) ∝ exp(h(z))`` under ρ-zCDP (seed 001, Alg. 4 and 5).

    Alg. 4 (§4.1, Thm 4.2): for every node ``i``, Lemma 4.1 gives
    ``P(z_i = +1 | z_{−i}) = σ(2 ∂_i h(z))`` with ``∂_i h(z) = Σ_{J ∋ i} h̄(J) z_{J∖i}``, so
    Alg. 1 is run on the parity features ``x = (z_I)_{I ∈ F_i}`` (all ``I ⊆ [p]∖{i}`` with
    ``|I| ≤ t − 1``), ``y = z_i``, over the ℓ1 ball of radius ``2λ``
    (``‖w*‖_1 = 2‖∂_i h‖_1 ≤ 2λ``), with budget ``ρ_1/p``; ``ū_i(I ∪ {i}) = w_I / 2``. The
    combined polynomial is ``ū(J) = ū_{min J}(J)`` [spec §6.1].

    Alg. 5 (§4.2, Thm 4.7): additionally release the parity means ``Q̂(S)``, ``1 ≤ |S| ≤ t − 1``
    (all that step 3 needs), with :func:`pmw_parities` (budget ``ρ_2``) and estimate every
    monomial by :func:`monomial_estimates`; for maximal monomials of ``h`` this is an
    ℓ∞-accurate estimate of ``h̄(I)`` [spec §6.2].

    Parameters
    ----------
    data : array ``(n, p)`` or Dataset
        Spins or codes, as in :func:`learn_ising`.
    budget : float, ZCDP or None
        Total ρ; ``None``: non-private (``b = 0``, exact parities).
    order : int
        ``t ≥ 2``.
    width : float
        ``λ ≥ max_i ‖∂_i h‖_1`` (public).
    rng_key : jax.Array
        PRNG key (simulation noise).
    estimator : {"parity", "regression"}
        Alg. 5 (default) or Alg. 4 alone (all of ρ to the regressions).
    parity_release : {"pmw", "gaussian"}
        PMW (the paper's choice, Lemma 4.5) or the Gaussian mechanism on all parity means
        (simple and rigorous; not the paper's).
    pmw_alpha : float
        PMW's accuracy target α.
    split : bool
        Alg. 5 budget option (b) [spec §6.2]: the first ``⌊n/2⌋`` records go to the regressions
        and the rest to the parity release, each with the full ρ (parallel composition). Default
        (a): all records to both, ``ρ_1 = regression_share·ρ``, ``ρ_2 = ρ − ρ_1``.
    regression_share : float
        ``ρ_1/ρ`` when ``split`` is false (default 1/2).
    iterations, noise_multiplier, coding, domain
        As in :func:`learn_ising` (default ``T = round((2λ n_1 √(ρ_1/p))^{2/3})``).
    ledger : PrivacyLedger, optional
        Charged ``p`` regression entries and (unless ``split``, where the disjoint halves compose
        in parallel) one parity-release entry; refused before any computation if the total does
        not fit.

    Returns
    -------
    Result
        ``model``: :func:`twise_to_mrf` of the Alg. 4 polynomial ``ū`` (all monomials of size
        ``≤ t``); ``extras``: ``"coefficients"`` (``ū``), ``"node_coefficients"`` (``ū_i``),
        ``"monomials"`` (Alg. 5's ``ĥ``, when ``estimator="parity"``), ``"parities"``,
        ``"pmw"`` (a :class:`PMWResult`, when used), ``"T"``, ``"rho_regression"``,
        ``"rho_parities"``, ``"noise_scale"``, ``"rho_spent"``, and non-private diagnostics
        ``"loss_traces"``, ``"gaps"``.
    """
    privacy, key = budget, rng_key
    start = time.perf_counter()
    warn_if_float32("learn_twise")
    spins, domain = spins_from_data(data, coding, domain)
    n, p = spins.shape
    if isinstance(order, bool) or not isinstance(order, int | np.integer) or order < 2:
        raise ValueError(f"order t must be an integer ≥ 2, got {order!r}")
    if order > p:
        raise ValueError(f"order t = {order} exceeds the number of variables p = {p}")
    lam = check_width(width)
    if isinstance(privacy, ApproxDP):
        raise ValueError("learn_twise is a zCDP mechanism; pass ρ (a float or ZCDP)")
    rho, target = resolve_privacy(privacy)
    c = resolve_noise_multiplier(noise_multiplier)
    key = need_key(key, rho)
    if estimator not in ("parity", "regression"):
        raise ValueError(f"estimator must be 'parity' or 'regression', got {estimator!r}")
    if parity_release not in ("pmw", "gaussian"):
        raise ValueError(f"parity_release must be 'pmw' or 'gaussian', got {parity_release!r}")
    share = float(regression_share)
    if not 0 < share < 1 and estimator == "parity" and not split:
        raise ValueError(f"regression_share must lie in (0, 1), got {regression_share!r}")
    use_parities = estimator == "parity"
    if split and estimator == "parity":
        n1 = n // 2
        reg_rows, par_rows = spins[:n1], spins[n1:]
        if n1 < 1 or n - n1 < 1:
            raise ValueError("split=True needs at least 2 records")
    else:
        n1 = n
        reg_rows, par_rows = spins, spins
    if rho is None:
        rho1 = rho2 = None
    elif split or not use_parities:
        rho1, rho2 = rho, (rho if use_parities else None)
    else:
        rho1, rho2 = share * rho, (1.0 - share) * rho
    radius = 2.0 * lam
    rho_node = None if rho1 is None else rho1 / p
    if iterations is None:
        T = 1000 if rho_node is None else default_iterations(radius, n1, rho_node)
    else:
        T = check_iterations(iterations)
    b = 0.0 if rho_node is None else fw_noise_scale(radius, n1, rho_node, T, c)
    queries = [S for s in range(1, order) for S in itertools.combinations(range(p), s)]
    charges = []
    if rho is not None:
        details = {
            "mechanism": "private Frank-Wolfe on parity features (seed 001, Alg. 1 in Alg. 4)",
            "target": target,
            "rho_calibrated": rho_node,
            "noise_multiplier": c,
            "noise_scale": b,
            "iterations": T,
            "radius": radius,
            "num_records": n1,
            "rows": "first half" if split and use_parities else "all",
            "neighbours": "replace_one",
            "sampler": "jax (simulation)",
        }
        if split and use_parities:
            details["parallel_composition"] = (
                "the parity release on the disjoint second half (ρ) composes in parallel"
            )
        charges = [
            Charge(fw_zcdp_cost(rho_node, c), f"learn_twise: node {domain.attrs[i]}", details)
            for i in range(p)
        ]
        if use_parities and not split:
            charges.append(
                Charge(
                    rho2,  # type: ignore[arg-type]
                    f"learn_twise: parity queries ({parity_release})",
                    {"mechanism": parity_release, "queries": len(queries)},
                )
            )
    elif ledger is not None:
        raise ValueError("a non-private run (budget=None) must not be given a ledger")
    if p > 20 and use_parities and parity_release == "pmw":
        raise ValueError(f"PMW keeps a distribution over 2^p states; p = {p} is too large")
    debit_all(ledger, charges)

    # step 1: the p regressions (Alg. 4)
    k_reg, k_par = jax.random.split(key)
    node_sets = [_node_monomials(p, i, order) for i in range(p)]
    rows, counts = compress_rows(reg_rows)
    w, losses, gaps = solve_problems(
        lambda i: (parity_columns(rows, node_sets[i]), rows[:, i].astype(float), counts),
        p,
        jax.random.split(k_reg, p),
        radius=radius,
        num_records=n1,
        noise_scale=b,
        iterations=T,
    )
    node_coefs: list[dict[Monomial, float]] = []
    for i in range(p):
        node_coefs.append(
            {
                tuple(sorted(I + (i,))): float(w[i, q] / 2.0)
                for q, I in enumerate(node_sets[i])
            }
        )
    combined = {
        J: node_coefs[J[0]][J]
        for size in range(1, order + 1)
        for J in itertools.combinations(range(p), size)
    }
    extras: dict[str, Any] = {
        "coefficients": combined,
        "node_coefficients": node_coefs,
        "T": T,
        "radius": radius,
        "noise_scale": b,
        "noise_multiplier": c,
        "rho": rho,
        "rho_regression": rho1,
        "rho_parities": rho2,
        "rho_spent": math.fsum(ch.rho for ch in charges),
        "loss_traces": losses,
        "gaps": gaps,
    }

    # steps 2–3: parity release and monomial estimates (Alg. 5)
    if estimator == "parity":
        if rho2 is None:
            means = parity_columns(par_rows, queries).mean(axis=0)
            parities: dict[Monomial, float] = {
                S: float(v) for S, v in zip(queries, means, strict=True)
            }
        elif parity_release == "pmw":
            pmw = pmw_parities(par_rows, queries, rho2, alpha=pmw_alpha, rng_key=k_par)
            parities = pmw.parities
            extras["pmw"] = pmw
        else:
            parities, sigma = gaussian_parities(par_rows, queries, rho2, k_par)
            extras["parity_sigma"] = sigma
        extras["parities"] = parities
        extras["monomials"] = monomial_estimates(node_coefs, parities, order)

    model = twise_to_mrf(combined, domain)
    return Result(
        model=model,
        loss_trace=losses.mean(axis=0),
        iterations=T - 1,
        converged=True,
        elapsed=time.perf_counter() - start,
        extras=extras,
    )
