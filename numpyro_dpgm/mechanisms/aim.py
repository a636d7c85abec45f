"""AIM: an adaptive and iterative mechanism for workload-aware private synthetic data.

McKenna, Mullins, Sheldon & Miklau (2022), "AIM: An Adaptive and Iterative Mechanism for
Differentially Private Synthetic Data", PVLDB 15(11), Algorithm 2 and §4; mbi's
``mechanisms/aim.py`` is the reference implementation. The budget is ``ρ``-zCDP (an
``ApproxDP(ε, δ)`` budget becomes the largest ``ρ`` that implies it, by the conversion of
Canonne, Kamath & Steinke 2020, as mbi's ``cdp_rho``). With ``Δ₂`` the L2 sensitivity of one
marginal (1 under add/remove, √2 under replace-one), every constant is the paper's:

* **Workload and candidates** (§4.2). The candidates are the downward closure ``W+`` of the
  workload ``W``, each with weight ``w_r = Σ_{s∈W} c_s·|r ∩ s|``
  (:func:`~numpyro_dpgm.mechanisms.workload.candidate_weights`).
* **Initialisation** (§4.1). ``T = 16·d`` rounds (``rounds=``) fix the starting per-round
  budget: measurement ``ρ_m = α·ρ/T`` with ``α = 0.9``, i.e. ``σ₀ = √(T/(2αρ))`` for
  ``Δ₂ = 1``, and selection ``ρ_s = (1 − α)·ρ/T``, i.e. ``ε₀ = √(8(1 − α)ρ/T)``. Every one-way
  candidate (or each of ``initial_cliques``) is measured at ``σ₀``, costing ``ρ_m`` each.
* **Rounds** (Algorithm 2). While budget remains: if ``ρ − ρ_used < 2(ρ_m + ρ_s)`` (that is
  ``2(1/(2σ²) + ε²/8)``) the round uses up the remainder, ``ρ_m = α(ρ − ρ_used)``,
  ``ρ_s = (1 − α)(ρ − ρ_used)``, and is the last one. Candidates are limited to those whose
  addition keeps the model's junction tree within ``(ρ_used/ρ)·MAX-SIZE`` megabytes (float64
  cells; ``max_model_size`` = 80 MB by default), ``ρ_used`` counting this round; candidates
  already inside a model clique always qualify (§4.3; mbi's ``filter_candidates``). The
  exponential mechanism selects ``r`` with score ``q_r = w_r(‖n_r − N̂·p̂_r‖₁ − √(2/π)·σ·n_r)``
  (``n_r`` cells; the penalty is the expected L1 norm of the noise the measurement would add),
  sensitivity ``max_r w_r`` (twice that under replace-one), at ``ε = √(8ρ_s)``; the marginal
  is measured with ``σ = Δ₂/√(2ρ_m)``; the model is refitted.
* **Annealing** (§4.4). If the refit moved the selected marginal by at most the expected noise,
  ``‖p̂_t(r) − p̂_{t−1}(r)‖₁·N̂ ≤ √(2/π)·σ·n_r``, the next rounds use ``σ/2`` and ``2ε``
  (``ρ_m`` and ``ρ_s`` times 4).

The ledger is charged ``ρ_s`` (as ``ε²/8``) for each selection and ``ρ_m`` for each
measurement; after a run it has spent the whole ``ρ`` (unless no candidate fits the size cap,
which ``extras["unspent"]`` reports). Refits are warm-started Prox-PGM fits
(:class:`~numpyro_dpgm.mechanisms.refit.Refit`); a round that re-measures a clique compiles
nothing, one that adds a clique compiles once.

**The final fit** (GENERATE) is Prox-PGM's default fit of all the measurements (``stop="auto"``):
where the noise is high, the mirror-descent path's iterate of least estimated risk
(:mod:`~numpyro_dpgm.estimation.risk_stop`), otherwise the optimum. mbi refits its
warm-started potentials for another 1,000 iterations (``stop="optimum"`` here). On Titanic at
ε = 0.1 (1,304 records, three seeds) the least-risk fit had workload error 0.644, 0.660 and
0.664 against the optimum's 0.734, 0.719 and 0.764; at ε = 1, 0.312 and 0.263 against 0.307
and 0.274; at ε = 10 (one seed), 0.139 against 0.133 (one run each: ``aim`` with the
seeded sampler, then ``prox_pgm`` of its measurements with each rule, scored by
:func:`~numpyro_dpgm.mechanisms.workload_error` of the model against the data's 3-way
tables). ``python -m benchmarks mechanisms`` measures the default end to end.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..data import count
from ..domain import Clique, Domain
from ..estimation import Result
from ..measurements import Measurement
from ..network import MarkovNetwork
from ..oracles import junction_tree as jt
from ..privacy.conversions import Conversion
from ..privacy.guarantees import ZCDP, PrivacyCost
from ..privacy.ledger import PrivacyLedger
from ..privacy.releases import release_tables
from ..privacy.sensitivity import marginal_sensitivity
from ..tables import project_table
from ._inputs import (
    check_cliques,
    check_final_fit,
    check_positive,
    check_positive_int,
    setup,
    split_key,
)
from .refit import Refit
from .selection import exponential_mechanism, selection_epsilon
from .workload import (
    DEFAULT_WORKLOAD_CELLS,
    all_marginals,
    candidate_weights,
    check_workload,
    downward_closure,
    model_marginals,
    target_marginals,
)

__all__ = ["DEFAULT_MAX_MODEL_SIZE", "MEASURE_FRACTION", "ROUNDS_PER_ATTRIBUTE", "aim",
           "model_size"]

#: MAX-SIZE of Algorithm 2, megabytes of float64 junction-tree cells (mbi's default 80).
DEFAULT_MAX_MODEL_SIZE = 80.0
#: ``α``: the share of each round's budget spent on measurement (§4.1; mbi's 0.9).
MEASURE_FRACTION = 0.9
#: ``T = 16·d``: the rounds that set the initial per-round budget (§4.1; mbi's default).
ROUNDS_PER_ATTRIBUTE = 16
_EXPECTED_ABS = math.sqrt(2.0 / math.pi)  # E|Z| of a standard normal


def model_size(domain: Domain, cliques: Sequence[Clique]) -> float:
    """Megabytes of the float64 junction-tree tables of a model with these cliques (AIM's
    JT-SIZE; mbi's ``hypothetical_model_size``)."""
    tree = jt.build_junction_tree(MarkovNetwork(domain, list(cliques)))
    return tree.num_cells * 8 / 2**20


def _workload(workload: Any, target: str | None, domain: Domain,
              max_cells: float) -> tuple[tuple[Clique, float], ...]:
    if target is not None:
        if not isinstance(workload, int) or isinstance(workload, bool):
            raise ValueError("target= builds the workload: give workload as the degree (an "
                             "int), not as a list of marginals")
        return target_marginals(domain, target, workload, max_cells)
    if isinstance(workload, int) and not isinstance(workload, bool):
        return all_marginals(domain, workload, max_cells)
    return check_workload(workload, domain)


class _SizeFilter:
    """AIM's candidate filter, with the hypothetical model sizes cached per model."""

    def __init__(self, domain: Domain, candidates: Sequence[Clique]):
        self.domain, self.candidates = domain, list(candidates)
        self._key: frozenset | None = None
        self._sizes: dict[Clique, float] = {}

    def __call__(self, cliques: Sequence[Clique], limit: float) -> list[Clique]:
        key = frozenset(frozenset(c) for c in cliques)
        if key != self._key:
            self._key, self._sizes = key, {}
        free = {frozenset(r) for r in downward_closure(cliques)}
        out = []
        for r in self.candidates:
            if frozenset(r) in free:
                out.append(r)
                continue
            if r not in self._sizes:
                self._sizes[r] = model_size(self.domain, list(cliques) + [r])
            if self._sizes[r] <= limit:
                out.append(r)
        return out


def _marginals(model: Any, domain: Domain, cliques: Sequence[Clique]) -> dict[Clique, Any]:
    """Model marginals of ``cliques``: the maximal ones by the oracle, the rest projected."""
    sets = [frozenset(c) for c in cliques]
    maximal = [c for c, s in zip(cliques, sets, strict=True) if not any(s < o for o in sets)]
    top = model_marginals(model, domain, maximal)
    out = {}
    for c, s in zip(cliques, sets, strict=True):
        if c in top:
            out[c] = top[c]
        else:
            host = next(m for m in maximal if s <= set(m))
            out[c] = np.asarray(project_table(top[host], host, c))
    return out


def aim(
    data: Any,
    domain: Domain | Mapping[str, int] | None = None,
    *,
    budget: PrivacyCost | float,
    rng_key: Any = None,
    ledger: PrivacyLedger | None = None,
    sampler: str = "opendp",
    workload: int | Sequence[Any] = 3,
    target: str | None = None,
    max_cells: float = DEFAULT_WORKLOAD_CELLS,
    max_model_size: float = DEFAULT_MAX_MODEL_SIZE,
    rounds: int | None = None,
    initial_cliques: Sequence[Iterable[str]] | None = None,
    neighbours: str = "add_remove",
    conversion: Conversion = "cks20",
    iters: int = 1000,
    stop: str = "auto",
    compile_mode: str = "quick",
    callback: Callable[[int, dict], None] | None = None,
) -> Result:
    """AIM (McKenna et al. 2022): see the module notes for every step and constant.

    Parameters
    ----------
    data : Dataset, pandas DataFrame, array ``(num_records, num_attrs)`` or path
        The sensitive records (all but a Dataset need ``domain``).
    domain : Domain or mapping, optional
    budget : ApproxDP, ZCDP or float
        The whole budget: ``ApproxDP(ε, δ)``, ``ZCDP(ρ)``, or a number ``ρ``.
    rng_key : JAX PRNG key or int, optional
        Required by ``sampler="jax"`` (simulation studies only); refused by ``"opendp"``.
    ledger : PrivacyLedger, optional
        Debited with every selection and measurement; it must be able to pay the whole budget
        before any record is counted (otherwise :class:`BudgetExceededError`).
    sampler : {"opendp", "jax"}
        OpenDP's vetted samplers (real runs) or seeded JAX samplers (simulations).
    workload : int or sequence
        An int ``k``: all ``k``-way marginals with at most ``max_cells`` cells (default 3, the
        paper's "all 3-way" workload). A sequence: marginals, or ``(marginal, weight)`` pairs.
    target : str, optional
        The paper's "target" workload: all ``workload``-way marginals containing this column.
    max_cells : float
        Largest marginal of a built-in workload (default 10,000, as mbi's scripts).
    max_model_size : float
        MAX-SIZE in megabytes (default 80).
    rounds : int, optional
        ``T`` of the initial budget split (default ``16·d``).
    initial_cliques : sequence of attribute tuples, optional
        Measured at the start instead of the one-way candidates.
    neighbours : {"add_remove", "replace_one"}
    conversion : {"cks20", "bs16"}
        The ``(ε, δ) → ρ`` conversion of an ``ApproxDP`` budget.
    iters : int
        Prox-PGM iterations per refit (mbi's ``max_iters`` = 1,000).
    stop : {"auto", "optimum", "risk", "discrepancy"}
        Prox-PGM's stopping rule for the final fit (GENERATE; the rounds' refits are
        warm-started optima). The default, :func:`~numpyro_dpgm.prox_pgm`'s, takes the
        path's iterate of least estimated risk where the noise is high (module notes);
        ``"optimum"`` continues the rounds' warm-started fit, as mbi does.
    compile_mode : {"quick", "optimized"}
        How XLA compiles the refits (default ``"quick"``, compiled about twice as fast; see
        :class:`~numpyro_dpgm.mechanisms.refit.Refit` for when ``"optimized"`` is better).
    callback : callable ``(round, info) -> None``, optional
        Progress after each round; ``info`` is that round's entry of ``extras["rounds"]``.

    Returns
    -------
    Result
        ``model``: the final fit; ``loss_trace``, ``iterations``, ``converged``: those of the
        final Prox-PGM fit. ``extras``: ``rounds`` (one dict per round: ``round``,
        ``selected``, ``sigma``, ``epsilon``, ``rho_used``, ``candidates``,
        ``model_size`` (MB), ``size_limit``, ``annealed``, ``select_seconds``,
        ``fit_seconds``, ``compile_seconds``, ``compiles``, ``iterations``), ``selected``,
        ``cliques`` (measured, in order), ``measurements`` (ordinary Measurements),
        ``workload``, ``candidates`` (``r -> w_r``), ``sigma0``, ``epsilon0``, ``rho``,
        ``unspent``, ``ledger``, ``fit``, ``total``, ``costs`` (every refit), ``sampler``,
        ``sampling`` (``"round"``: :func:`~numpyro_dpgm.synthesize` rounds this model's
        expected counts by default, as Private-PGM does; pass ``sampling="sample"`` to draw
        records instead).

    Raises
    ------
    ValueError, TypeError, KeyError
        A bad budget, sampler, key, workload (unknown attribute, repeated clique, bad
        weight), target column, size cap, rounds or iterations.
    BudgetExceededError
        The ledger cannot pay the budget; nothing is spent.
    """
    start = time.perf_counter()
    records, dom, neighbours, rho, key, ledger = setup(
        data, domain, budget=budget, sampler=sampler, rng_key=rng_key, ledger=ledger,
        neighbours=neighbours, conversion=conversion, label="AIM (whole run)")
    max_model_size = check_positive(max_model_size, "max_model_size")
    iters = check_positive_int(iters, "iters")
    check_final_fit(stop, compile_mode)
    T = ROUNDS_PER_ATTRIBUTE * len(dom) if rounds is None else check_positive_int(rounds,
                                                                                  "rounds")
    wl = _workload(workload, target, dom, max_cells)
    weights = candidate_weights(wl)
    initial = ([r for r in weights if len(r) == 1] if initial_cliques is None
               else check_cliques(initial_cliques, dom, "initial clique"))
    sizes = {c: model_size(dom, [c]) for c in initial}
    if max(sizes.values()) > max_model_size:
        raise ValueError(f"an initial clique alone needs {max(sizes.values()):.3g} MB, above "
                         f"max_model_size = {max_model_size:g}")

    l2 = marginal_sensitivity(1, neighbours).l2  # type: ignore[arg-type]
    score_sens = 1.0 if neighbours == "add_remove" else 2.0
    rho_m, rho_s = MEASURE_FRACTION * rho / T, (1.0 - MEASURE_FRACTION) * rho / T
    sigma0, eps0 = l2 / math.sqrt(2.0 * rho_m), selection_epsilon(rho_s)
    common = {"domain": dom, "mechanism": "gaussian", "neighbours": neighbours,
              "ledger": ledger, "sampler": sampler}

    # the true answers of every candidate (private: read by the scores only)
    true = count(records, list(dict.fromkeys(list(weights) + initial)), dom)
    answers = {c: np.asarray(true[c]) for c in true.keys()}

    key, k0 = split_key(key, 2)
    measurements: list[Measurement] = release_tables(
        {c: answers[c] for c in initial}, ZCDP(len(initial) * rho_m), rng_key=k0,
        label="AIM: initial marginals", **common)
    cliques = list(initial)
    rho_used = len(initial) * rho_m
    refit = Refit(dom, iters, compile_mode=compile_mode)
    model = refit(measurements, cliques)
    filt = _SizeFilter(dom, list(weights))
    log: list[dict[str, Any]] = []
    t = 0
    while rho - rho_used > 1e-12 * rho:
        t += 1
        tic = time.perf_counter()
        last = rho - rho_used < 2.0 * (rho_m + rho_s)
        if last:
            remaining = rho - rho_used
            rho_m, rho_s = MEASURE_FRACTION * remaining, (1.0 - MEASURE_FRACTION) * remaining
        sigma, eps = l2 / math.sqrt(2.0 * rho_m), selection_epsilon(rho_s)
        limit = max_model_size * (rho_used + rho_m + rho_s) / rho
        cands = filt(cliques, limit)
        if not cands:
            break
        est = _marginals(model, dom, cands)
        total = refit.total
        scores = [weights[r] * (np.abs(answers[r] - total * est[r]).sum()
                                - _EXPECTED_ABS * sigma * answers[r].size) for r in cands]
        key, k_sel, k_noise = split_key(key, 3)
        choice = cands[exponential_mechanism(
            scores, eps, score_sens * max(weights[r] for r in cands), sampler=sampler,
            rng_key=k_sel, ledger=ledger, label=f"AIM round {t}: exponential mechanism").index]
        measurements += release_tables({choice: answers[choice]}, ZCDP(rho_m), rng_key=k_noise,
                                       label=f"AIM round {t}: measurement of {choice}",
                                       **common)
        rho_used += rho_m + rho_s
        before = total * est[choice]
        if not any(set(choice) == set(c) for c in cliques):
            cliques.append(choice)
        select_seconds = time.perf_counter() - tic
        model = refit(measurements, cliques)
        after = refit.total * np.asarray(jt.marginal(model.network, model.theta, choice))
        annealed = bool(np.abs(after - before).sum() <= _EXPECTED_ABS * sigma * after.size)
        cost = refit.costs[-1]
        log.append({"round": t, "selected": choice, "sigma": sigma, "epsilon": eps,
                    "rho_used": rho_used, "candidates": len(cands),
                    "model_size": model_size(dom, cliques), "size_limit": limit,
                    "annealed": annealed, "select_seconds": select_seconds,
                    "fit_seconds": cost["seconds"], "compile_seconds": cost["compile_seconds"],
                    "compiles": cost["compiles"], "iterations": cost["iterations"]})
        if callback is not None:
            callback(t, log[-1])
        if last:
            break
        if annealed:
            rho_m, rho_s = 4.0 * rho_m, 4.0 * rho_s

    model = refit(measurements, cliques, stop=stop)  # GENERATE: the rounds' network
    extras = {
        "rounds": tuple(log),
        "selected": tuple(e["selected"] for e in log),
        "cliques": tuple(cliques),
        "measurements": tuple(measurements),
        "workload": wl,
        "candidates": weights,
        "sigma0": sigma0,
        "epsilon0": eps0,
        "rho": rho,
        "unspent": max(0.0, rho - rho_used),
        "ledger": ledger,
        "sampler": sampler,
        "sampling": "round",
    }
    return refit.result(model, start, extras)
