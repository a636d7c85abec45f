"""MST: measure the one-way marginals and a maximum spanning tree of pairs (NIST 2018 winner).

McKenna, Miklau & Sheldon (2021), "Winning the NIST Contest: A scalable and general approach
to differentially private synthetic data", J. Privacy and Confidentiality 11(3), §4 and
Algorithm 1; mbi's ``mechanisms/mst.py`` is the reference implementation. The budget is
``ρ``-zCDP (an ``ApproxDP(ε, δ)`` budget becomes the largest ``ρ`` that implies it, by the
conversion of Canonne, Kamath & Steinke 2020, as mbi's ``cdp_rho``), split in thirds (§4):

1. **Measure** all one-way marginals together with the Gaussian mechanism at ``ρ/3``:
   ``σ₁ = √(3d/(2ρ))`` per cell for ``d`` attributes (L2 sensitivity ``√d``; mbi's
   ``measure`` with ``σ = √(3/(2ρ))`` and weights ``1/√d``).
2. **Compress** the domain: values whose noisy count is below ``3σ₁`` are merged
   (:mod:`.compression`; §4 "Domain compression", mbi's ``compress_domain``).
3. **Select** a spanning tree of attribute pairs with ``ρ/3``: fit the independence model
   ``p̂`` to the one-way measurements (mbi runs 2,500 mirror-descent iterations; a model of
   one-way cliques separates by attribute, and its exact fit is solved here in closed form,
   :func:`independent_fit`), score each pair by ``q_ab = ‖n_ab − N̂·p̂_ab‖₁`` (its
   L1 error; sensitivity 1 under add/remove, 2 under replace-one), and run Kruskal's algorithm
   with the exponential mechanism choosing each of the ``r − 1`` edges among the pairs that
   join two components, each at ``ε = √(8·(ρ/3)/(r − 1))`` (``ε²/8``-zCDP each; mbi's
   ``select``). ``r`` is the number of components left by the optional initial cliques.
4. **Measure** the tree's pairs (and the initial cliques) together at ``ρ/3``:
   ``σ₂ = √(3m/(2ρ))`` for ``m`` tables.
5. **Generate**: Prox-PGM on all measurements (mbi runs 10,000 mirror-descent iterations, the
   default here), one compiled program for the run.

When a stage has nothing to do (one attribute; initial cliques that already connect every
attribute) the budget is split evenly over the stages that run. The fitted model lives on the
compressed domain; the returned model spreads each merged value uniformly over its values
(:meth:`Compression.decompress_model`), an exactly equivalent distribution on the original
domain. The measurements in ``extras`` are ordinary :class:`~numpyro_dpgm.Measurement` on the
compressed domain (``extras["domain"]``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from networkx.utils import UnionFind
from scipy import optimize

from ..data import count
from ..domain import Clique, Domain
from ..estimation import Result
from ..measurements import Measurement, estimate_total
from ..privacy.conversions import Conversion
from ..privacy.guarantees import ZCDP, PrivacyCost
from ..privacy.ledger import PrivacyLedger
from ..privacy.releases import release_tables
from ._inputs import check_cliques, check_final_fit, check_positive_int, setup, split_key
from .compression import Compression, compress_domain
from .refit import Refit
from .selection import exponential_mechanism, selection_epsilon

__all__ = ["independent_fit", "mst"]


def independent_fit(measurements: Sequence[Measurement], total: float) -> dict[str, np.ndarray]:
    """The exact fit of a model of one-way cliques to one-way measurements, per attribute.

    With ``N`` fixed, the L2 loss separates by attribute: ``p_a`` minimises
    ``Σ_i w_i (N·p_i − z_i)²`` over the probability simplex, where each answer is
    ``d_i·n_i + noise`` (``d`` the query's diagonal, 1 without a query), ``z_i = y_i/d_i`` and
    ``w_i = d_i²``. The KKT conditions give ``p_i = max(0, z_i/N + ν/(w_i N²))`` with the one
    scalar ``ν`` that makes ``Σ p_i = 1`` (found by root finding). This is the optimum that
    Prox-PGM's mirror descent approaches on the same measurements.
    """
    out = {}
    for m in measurements:
        d = np.ones(m.values.size) if m.query is None else np.diag(m.query)
        if m.query is not None and not np.allclose(m.query, np.diag(d)):
            raise ValueError(f"the measurement of {m.clique} has a query that is not diagonal")
        z, w = m.values / d, d * d

        def excess(nu: float, z: np.ndarray = z, w: np.ndarray = w) -> float:
            return float(np.maximum(0.0, z / total + nu / (w * total**2)).sum() - 1.0)

        lo = -float(np.max(np.abs(z) * w)) * total - 1.0  # every p_i is 0 here
        hi = float(np.max(w)) * total**2
        while excess(hi) < 0:
            hi *= 2.0
        nu = optimize.brentq(excess, lo, hi, xtol=1e-12 * max(1.0, abs(hi)), rtol=1e-14)
        p = np.maximum(0.0, z / total + nu / (w * total**2))
        out[m.clique[0]] = p / p.sum()
    return out


def _components(domain: Domain, cliques: Sequence[Clique]) -> UnionFind:
    parts = UnionFind(domain.attrs)
    for c in cliques:
        parts.union(*c)
    return parts


def mst(
    data: Any,
    domain: Domain | Mapping[str, int] | None = None,
    *,
    budget: PrivacyCost | float,
    rng_key: Any = None,
    ledger: PrivacyLedger | None = None,
    sampler: str = "opendp",
    initial_cliques: Sequence[Iterable[str]] | None = None,
    compress: bool = True,
    neighbours: str = "add_remove",
    conversion: Conversion = "cks20",
    iters: int = 10_000,
    stop: str = "auto",
    compile_mode: str = "optimized",
    callback: Callable[[int, dict], None] | None = None,
) -> Result:
    """MST (McKenna, Miklau & Sheldon 2021): see the module notes for every step and constant.

    Parameters
    ----------
    data : Dataset, pandas DataFrame, array ``(num_records, num_attrs)`` or path
        The sensitive records (anything :func:`numpyro_dpgm.data.count` counts; all but a
        Dataset need ``domain``).
    domain : Domain or mapping, optional
    budget : ApproxDP, ZCDP or float
        The whole budget: ``ApproxDP(ε, δ)`` (spent as the ``ρ`` that implies it), ``ZCDP(ρ)``,
        or a number ``ρ``.
    rng_key : JAX PRNG key or int, optional
        Required by ``sampler="jax"`` (simulation studies only); refused by ``"opendp"``.
    ledger : PrivacyLedger, optional
        Debited with every selection and measurement; it must be able to pay the whole budget
        before any record is counted (otherwise :class:`BudgetExceededError`). Default: a fresh
        ledger holding exactly the budget (zCDP currency).
    sampler : {"opendp", "jax"}
        OpenDP's vetted samplers (real runs) or seeded JAX samplers (simulations).
    initial_cliques : sequence of attribute tuples, optional
        Cliques to measure in step 4 whatever the selection; their attributes start in one
        component of the tree (mbi's ``select(..., cliques=...)``).
    compress : bool
        Step 2 (default True).
    neighbours : {"add_remove", "replace_one"}
    conversion : {"cks20", "bs16"}
        The ``(ε, δ) → ρ`` conversion of an ``ApproxDP`` budget.
    iters : int
        Prox-PGM iterations of the final fit (step 5).
    stop : {"auto", "optimum", "risk", "discrepancy"}
        Prox-PGM's stopping rule for the final fit (:func:`~numpyro_dpgm.prox_pgm`; default
        its default): ``"risk"`` returns the mirror-descent path's iterate of least estimated
        error, from the uniform start; ``"auto"`` does so where the noise is high and fits
        the optimum otherwise; ``"optimum"`` is mbi's fit.
    compile_mode : {"optimized", "quick"}
        How XLA compiles the final fit, MST's only one (default ``"optimized"``). Where the
        noise is small that fit runs long: on Adult at ε = 10 (three seeds, one run each, by
        hand) its 9,250–10,000 iterations took 0.36–0.40 ms each compiled ``"optimized"``
        and 1.6–1.8 ms ``"quick"``, and the whole run 8.9–10.1 s against 19.3–23.8 s. Where
        the fit is short, ``"quick"`` saves its 0.2–1.4 s of extra compiling (Titanic, Adult
        at ε ≤ 1).
    callback : callable ``(step, info) -> None``, optional
        Progress: after each selected edge (``info["stage"] == "select"``) and after the final
        fit (``"generate"``).

    Returns
    -------
    Result
        ``model``: the fitted model on the original domain. ``loss_trace``, ``iterations``,
        ``converged``: those of the final Prox-PGM fit. ``extras``: ``selected`` (the tree's
        edges, in order), ``cliques`` (all measured cliques), ``measurements`` (ordinary
        Measurements on ``domain``), ``domain`` (the compressed domain), ``compression``
        (:class:`Compression` or ``None``), ``rho``, ``sigma`` (``{"one_way": σ₁,
        "cliques": σ₂}``), ``epsilon_selection``, ``ledger``, ``fit`` (the final Prox-PGM
        Result), ``total``, ``costs`` (the final fit's seconds, compile seconds, compiles,
        iterations), ``seconds`` (per stage), ``sampler``, ``sampling``
        (``"round"``: :func:`~numpyro_dpgm.synthesize` rounds this model's expected counts by
        default, as Private-PGM does; pass ``sampling="sample"`` to draw records instead).

    Raises
    ------
    ValueError, TypeError, KeyError
        A bad budget (ε ≤ 0, δ ∉ (0, 1), a pure ε budget), sampler, key, neighbours,
        initial cliques or iteration counts.
    BudgetExceededError
        The ledger cannot pay the budget; nothing is spent.
    """
    start = time.perf_counter()
    records, dom, neighbours, rho, key, ledger = setup(
        data, domain, budget=budget, sampler=sampler, rng_key=rng_key, ledger=ledger,
        neighbours=neighbours, conversion=conversion, label="MST (whole run)")
    initial = ([] if initial_cliques is None else
               check_cliques(initial_cliques, dom, "initial clique", min_size=2))
    iters = check_positive_int(iters, "iters")
    check_final_fit(stop, compile_mode)

    d = len(dom)
    r = len(list(_components(dom, initial).to_sets()))
    stages = 1 + (r > 1) + (d > 1)
    rho_stage = rho / stages
    eps_sel = selection_epsilon(rho_stage / (r - 1)) if r > 1 else None
    sens = 1.0 if neighbours == "add_remove" else 2.0
    seconds: dict[str, float] = {}
    common = {"domain": None, "mechanism": "gaussian", "neighbours": neighbours,
              "ledger": ledger, "sampler": sampler}

    # 1. one-way marginals at ρ/3
    tic = time.perf_counter()
    k1, k2, k3 = split_key(key, 3)
    oneway = [(a,) for a in dom.attrs]
    pairs = list(itertools.combinations(dom.attrs, 2))
    tables = count(records, oneway + pairs + [c for c in initial if c not in pairs], dom)
    log1 = release_tables({c: tables[c] for c in oneway}, ZCDP(rho_stage), rng_key=k1,
                          label="MST: one-way marginals", **common)
    sigma1 = float(log1[0].noise.sigma)
    seconds["measure_one_way"] = time.perf_counter() - tic

    # 2. domain compression (post-processing of the noisy one-way marginals)
    tic = time.perf_counter()
    compression: Compression | None = None
    cdom = dom
    if compress:
        compression, log1 = compress_domain(log1, dom)
        cdom = compression.domain

    def table(c: Clique) -> np.ndarray:
        t = np.asarray(tables[c])
        return t if compression is None else compression.aggregate(t, c)

    seconds["compress"] = time.perf_counter() - tic

    # 3. the tree, edge by edge, by the exponential mechanism at ρ/3 in total
    tic = time.perf_counter()
    total = estimate_total(log1)
    p_hat = independent_fit(log1, total)
    parts = _components(dom, initial)
    selected: list[Clique] = []
    if r > 1:
        scores = {(a, b): float(np.abs(table((a, b)) - total * np.multiply.outer(p_hat[a],
                                                                                 p_hat[b])).sum())
                  for a, b in pairs}
        for step in range(r - 1):
            k3, k_sel = split_key(k3, 2)
            candidates = [e for e in pairs if parts[e[0]] != parts[e[1]]]
            choice = exponential_mechanism(
                [scores[e] for e in candidates], eps_sel, sens, sampler=sampler,
                rng_key=k_sel, ledger=ledger, label=f"MST: tree edge {step + 1} of {r - 1}")
            edge = candidates[choice.index]
            parts.union(*edge)
            selected.append(edge)
            if callback is not None:
                callback(step + 1, {"stage": "select", "selected": edge,
                                    "candidates": len(candidates)})
    seconds["select"] = time.perf_counter() - tic

    # 4. the tree's pairs and the initial cliques at ρ/3
    tic = time.perf_counter()
    cliques = initial + selected
    log2: list[Measurement] = []
    sigma2 = None
    if cliques:
        log2 = release_tables({c: table(c) for c in cliques}, ZCDP(rho_stage), rng_key=k2,
                              label="MST: selected marginals", **common)
        sigma2 = float(log2[0].noise.sigma)
    seconds["measure_cliques"] = time.perf_counter() - tic

    # 5. generate
    tic = time.perf_counter()
    refit = Refit(cdom, iters, stop=stop, compile_mode=compile_mode)
    model = refit(log1 + log2, oneway + cliques)
    seconds["generate"] = time.perf_counter() - tic
    if callback is not None:
        callback(max(r - 1, 0) + 1, {"stage": "generate", "seconds": seconds["generate"],
                                     "iterations": refit.fit.iterations})
    if compression is not None:
        model = compression.decompress_model(model)
    extras = {
        "selected": tuple(selected),
        "cliques": tuple(oneway + cliques),
        "measurements": tuple(log1 + log2),
        "domain": cdom,
        "compression": compression,
        "rho": rho,
        "sigma": {"one_way": sigma1, "cliques": sigma2},
        "epsilon_selection": eps_sel,
        "ledger": ledger,
        "seconds": seconds,
        "sampler": sampler,
        "sampling": "round",
    }
    return refit.result(model, start, extras)
