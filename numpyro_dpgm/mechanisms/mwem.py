"""End-to-end private mechanisms built on the model-based estimator: MWEM + PGM.

MWEM (Hardt, Ligett & McSherry 2012) answers a workload of marginal queries by repeating, for
``T`` rounds, *select* (the exponential mechanism picks a workload marginal the current model
answers badly), *measure* (a noisy answer to that marginal) and *update* the model. With the
model-based estimator of seed 003 (McKenna et al. 2021, §5 "MWEM" and Appendix C.2; first
proposed with Private-PGM, McKenna, Sheldon & Miklau 2019) the update is Prox-PGM over all
measurements so far, warm-started from the previous round's parameters, and the data
distribution is a graphical model over the measured cliques instead of a full data vector.

Privacy accounting (every step is debited on a :class:`~numpyro_dpgm.privacy.PrivacyLedger`
before its randomness is drawn):

* **Budget split.** The total is split evenly over the ``T`` rounds. In zCDP (a ``ZCDP(ρ)``
  total, or ``ApproxDP(ε, δ)`` turned into ``ρ = approx_to_zcdp(ε, δ)``) each round gets
  ``ρ/T``, of which the fraction ``selection_fraction = f`` pays for selection and ``1 − f``
  for measurement: the exponential mechanism runs at ``ε_sel = √(8·f·ρ/T)`` and costs
  ``ε_sel²/8 = f·ρ/T`` (it is ``ε``-bounded-range, hence ``ε²/8``-zCDP; Cesar & Rogers 2021,
  Lemma 3.2), and the measurement is the Gaussian mechanism with ``ρ_meas = (1 − f)·ρ/T``
  (``σ = Δ₂/√(2ρ_meas)``; Bun & Steinke 2016) or the Laplace mechanism with
  ``ε = √(2ρ_meas)``. With a pure ``PureDP(ε)`` total each round gets ``ε/T`` (``f·ε/T`` for
  selection, the rest for Laplace noise), by basic composition. The default ``f = 0.1`` is that
  of Private-PGM's MWEM+PGM (``alpha = 0.9`` to measurement); ``f = 0.5`` splits each round in
  half. The ledger's total spending after a run equals the budget given (up to rounding).
* **Selection.** The score of a workload clique ``C`` is
  ``q(D, C) = ‖n_C(D) − N̂·p̂_C‖₁ − pen_C``: the L1 error, on the count scale, of the current
  model's marginal ``p̂_C`` scaled by its total ``N̂`` (a public quantity: the given
  ``total_count`` or the estimate from earlier noisy measurements), minus the expected L1 norm
  of the noise a measurement of ``C`` would add (``pen_C = σ·√(2/π)·|C|`` for Gaussian and
  ``b·|C|`` for Laplace noise, ``|C|`` the number of cells; data-independent, as in
  Private-PGM's ``worst_approximated``; ``penalty=False`` drops it). Only ``n_C`` depends on
  the data, so the score's sensitivity is ``Δq = 1`` under add/remove neighbours (one
  record moves one cell by one) and ``Δq = 2`` under replace-one. The exponential mechanism
  picks ``C`` with probability ``∝ exp(ε_sel·q(D, C)/(2Δq))`` (McSherry & Talwar 2007).
  Before the first measurement with a private total there is no public scale: ``N̂ = 0`` and
  the first round's scores are ``N − pen_C``, which favours small tables.
* **Size guard.** As in Private-PGM's MWEM, candidates whose addition would make the model's
  junction tree hold more than ``max_cells`` cells are left out of the selection (the
  triangulation depends only on the cliques selected so far, which are public outputs, so the
  guard costs no privacy). Cliques already in the model never grow it and stay eligible, so
  every round after the first has a candidate; if no workload clique fits on its own the call is
  refused before anything is spent.

Randomness: with ``sampler="jax"`` (the default, kept from the previous release) the
exponential mechanism (Gumbel-max) and the measurement noise are drawn from the JAX key
``rng_key``: **for simulation studies only** (reproducible, but floating-point samplers are not
hardened for real releases; see :func:`numpyro_dpgm.privacy.simulate_noise`).
``sampler="opendp"`` draws both with OpenDP's vetted samplers
(:func:`~numpyro_dpgm.mechanisms.selection.exponential_mechanism`,
:func:`~numpyro_dpgm.privacy.release_tables`).

The refits are warm-started Prox-PGM fits (:class:`~numpyro_dpgm.mechanisms.refit.Refit`):
repeated Gaussian measurements of a clique are merged for the fit (same optimum), so a round
that re-selects a clique compiles nothing.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..data import count
from ..distributions.mrf import MarkovRandomField
from ..domain import Clique, Domain
from ..estimation import Result
from ..measurements import Gaussian, Measurement
from ..network import MarkovNetwork
from ..oracles import junction_tree as jt
from ..oracles.protocol import MarginalOracle
from ..privacy.conversions import approx_to_zcdp
from ..privacy.guarantees import ZCDP, ApproxDP, PrivacyCost, PureDP
from ..privacy.ledger import PrivacyLedger
from ..privacy.releases import release_tables
from ..privacy.sensitivity import calibrate, check_neighbours, marginal_sensitivity
from ._inputs import resolve_key, resolve_records, split_key
from .refit import Refit
from .selection import exponential_mechanism
from .workload import check_workload, model_marginals, workload_error

__all__ = ["DEFAULT_MAX_CELLS", "mwem_pgm"]

#: Default cap on the number of cells of the model's junction tree (8e6 float64 cells = 64 MB).
DEFAULT_MAX_CELLS = 8_000_000


def _round_costs(
    budget: PrivacyCost, rounds: int, fraction: float, mechanism: str
) -> tuple[PrivacyCost, float, PrivacyCost, PrivacyCost]:
    """(whole cost to check, ε_sel, selection charge, measurement budget) per round."""
    if isinstance(budget, ApproxDP):
        budget = ZCDP(approx_to_zcdp(budget.epsilon, budget.delta))
    if isinstance(budget, ZCDP):
        rho_r = budget.rho / rounds
        eps_sel = math.sqrt(8.0 * fraction * rho_r)
        return budget, eps_sel, ZCDP(fraction * rho_r), ZCDP((1.0 - fraction) * rho_r)
    if mechanism == "gaussian":
        raise ValueError(
            "the Gaussian mechanism is not ε-DP: give mwem_pgm a ZCDP(rho) or "
            "ApproxDP(epsilon, delta) budget, or use mechanism='laplace' with a pure budget"
        )
    eps_r = budget.epsilon / rounds
    return budget, fraction * eps_r, PureDP(fraction * eps_r), PureDP((1.0 - fraction) * eps_r)


def mwem_pgm(
    data: Any,
    domain: Domain | Mapping[str, int] | None,
    *,
    budget: PrivacyCost | float,
    rng_key: Any = None,
    ledger: PrivacyLedger | None = None,
    workload: Sequence[Iterable[str]],
    rounds: int,
    mechanism: str = "gaussian",
    neighbours: str = "add_remove",
    selection_fraction: float = 0.1,
    penalty: bool = True,
    total_count: float | None = None,
    max_cells: float = DEFAULT_MAX_CELLS,
    oracle: str | MarginalOracle | Callable[[MarkovNetwork], MarginalOracle] = "exact",
    iters: int = 100,
    compile_mode: str = "quick",
    callback: Callable[[int, dict], None] | None = None,
    sampler: str = "jax",
) -> Result:
    """MWEM with a graphical-model back end (Hardt et al. 2012; seed 003, §5 and App. C.2).

    See the module notes for the privacy accounting, the score and the size guard.

    Parameters
    ----------
    data : Dataset, pandas DataFrame or array ``(num_records, num_attrs)``
        The sensitive records (a DataFrame or array needs ``domain``).
    domain : Domain or mapping, optional
        Domain of the records; ``None`` for a Dataset (which carries its own).
    workload : sequence of attribute tuples
        The marginals to answer; each round selects one of them to measure (a clique may be
        selected again in a later round).
    budget : ZCDP, ApproxDP, PureDP or float
        The whole privacy budget of the run (a number is pure ε). Gaussian noise needs a zCDP
        or (ε, δ) budget; an (ε, δ) budget is spent in zCDP, ``ρ = approx_to_zcdp(ε, δ)``.
    rounds : int
        ``T``, the number of select–measure–update rounds.
    rng_key : JAX PRNG key or int
        Seeds the exponential mechanism and the noise of ``sampler="jax"`` (required there):
        **simulation studies only**. Refused by ``sampler="opendp"``.
    ledger : PrivacyLedger, optional
        Debited with every selection and measurement; it must be able to pay the whole budget
        up front (otherwise :class:`BudgetExceededError` before anything is touched). Default: a
        fresh ledger holding exactly ``budget`` (zCDP currency for (ε, δ) budgets).
    mechanism : {"gaussian", "laplace"}
        Measurement noise.
    neighbours : {"add_remove", "replace_one"}
        The neighbouring relation: score sensitivity 1 or 2, and the marginal's sensitivity
        (L1 1 or 2, L2 1 or √2).
    selection_fraction : float in (0, 1)
        ``f``, each round's share of the budget spent on selection.
    penalty : bool
        Subtract the expected L1 noise of a measurement from each score.
    total_count : float, optional
        ``N``, treated as public when given (e.g. under replace-one). ``None``: estimated from
        the noisy measurements (the honest choice under add/remove).
    max_cells : float
        Cap on the junction-tree size (cells) of the model; candidates exceeding it are skipped.
    oracle : "exact", "convex_gbp", MarginalOracle or factory
        Prox-PGM's marginal oracle for the refits (seed 003: APPGM with ``"convex_gbp"``). The
        scores still read workload marginals off the fitted model's junction tree, so the size
        guard applies to both.
    iters : int
        Prox-PGM iterations per round (warm-started).
    compile_mode : {"quick", "optimized"}
        How XLA compiles the refits (default ``"quick"``, compiled about twice as fast; see
        :class:`~numpyro_dpgm.mechanisms.refit.Refit` for when ``"optimized"`` is better).
    callback : callable ``(round, info) -> None``, optional
        Progress report after each round (``info`` holds the selected clique and the error).
    sampler : {"jax", "opendp"}
        ``"jax"``: seeded samplers (simulation studies only); ``"opendp"``: OpenDP's vetted
        samplers for the selection and the noise (real runs; not seedable).

    Returns
    -------
    Result
        ``model``: the final fitted model; ``loss_trace``: the workload error (mean TVD, see
        :func:`workload_error`) of the uniform start and after every round, a **non-private
        diagnostic** computed from the true data; ``iterations``: rounds run; ``converged``:
        True. ``extras``: ``selected`` (clique per round), ``errors`` (= ``loss_trace``),
        ``selection_probability`` (probability the chosen clique had), ``num_candidates``
        (eligible cliques per round), ``measurements``, ``noise`` (NoiseSpec of the
        measurements), ``epsilon_selection``, ``score_sensitivity``, ``ledger``,
        ``fit`` (the last Prox-PGM :class:`Result`), ``total``, ``costs`` (per round: the
        refit's ``seconds``, ``compile_seconds``, ``compiles``, ``iterations``).

    Raises
    ------
    ValueError, TypeError, KeyError
        Bad budget, rounds, fraction, mechanism, neighbours, workload, cap or iterations.
    BudgetExceededError
        The ledger cannot pay the budget; nothing is spent.
    """
    start = time.perf_counter()
    records, dom = resolve_records(data, domain)
    weighted = check_workload(workload, dom)
    if any(w != 1.0 for _, w in weighted):
        raise ValueError("MWEM+PGM answers every workload marginal alike: give cliques "
                         "without weights")
    cliques_w = [c for c, _ in weighted]

    # -- options ------------------------------------------------------------------------------
    if isinstance(rounds, bool) or not isinstance(rounds, int | np.integer) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    rounds = int(rounds)
    if isinstance(iters, bool) or not isinstance(iters, int | np.integer) or iters < 1:
        raise ValueError(f"iters must be a positive integer, got {iters!r}")
    if mechanism not in ("gaussian", "laplace"):
        raise ValueError(f"unknown mechanism {mechanism!r}; use 'gaussian' or 'laplace'")
    neighbours = check_neighbours(neighbours)
    try:
        fraction = float(selection_fraction)
    except (TypeError, ValueError):
        raise TypeError(
            f"selection_fraction must be a number, got {selection_fraction!r}"
        ) from None
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"selection_fraction must lie in (0, 1), got {selection_fraction!r}")
    if not (isinstance(max_cells, numbers.Real) and max_cells > 0):
        raise ValueError(f"max_cells must be a positive number, got {max_cells!r}")
    if total_count is not None:
        total_count = float(total_count)
        if not math.isfinite(total_count) or total_count <= 0:
            raise ValueError(f"total_count must be a positive finite number, got {total_count}")
    if isinstance(budget, numbers.Real) and not isinstance(budget, bool):
        budget = PureDP(float(budget))
    if not isinstance(budget, PureDP | ZCDP | ApproxDP):
        raise TypeError(f"budget must be PureDP, ZCDP, ApproxDP or a number ε; got {budget!r}")
    whole, eps_sel, sel_cost, meas_budget = _round_costs(budget, rounds, fraction, mechanism)
    if ledger is None:
        ledger = PrivacyLedger(budget, currency="zcdp" if isinstance(budget, ApproxDP) else None)
    elif not isinstance(ledger, PrivacyLedger):
        raise TypeError(f"ledger must be a PrivacyLedger, got {type(ledger).__name__}")
    key = resolve_key(sampler, rng_key)
    ledger.check(whole, "MWEM+PGM (whole run)")  # refuse before touching the data

    # noise of every measurement (data-independent), and the selection penalty per clique
    spec, _ = calibrate(mechanism, meas_budget,  # type: ignore[arg-type]
                        marginal_sensitivity(1, neighbours))  # type: ignore[arg-type]
    per_cell = (spec.sigma * math.sqrt(2.0 / math.pi) if isinstance(spec, Gaussian)
                else spec.scale)  # type: ignore[union-attr]
    pen = {c: (per_cell * dom.size(c) if penalty else 0.0) for c in cliques_w}
    score_sens = 1.0 if neighbours == "add_remove" else 2.0

    # size guard, cached by the set of model cliques
    size_cache: dict[frozenset, float] = {}

    def tree_cells(cls: Sequence[Clique]) -> float:
        k = frozenset(frozenset(c) for c in cls)
        if k not in size_cache:
            size_cache[k] = float(jt.build_junction_tree(MarkovNetwork(dom, list(cls))).num_cells)
        return size_cache[k]

    if not any(tree_cells([c]) <= max_cells for c in cliques_w):
        raise ValueError(
            f"every workload clique alone exceeds max_cells={max_cells:g}; raise the cap"
        )

    # -- the true answers (private; used only by the exponential mechanism and the diagnostics)
    true = count(records, cliques_w, dom)
    true_tables = {c: np.asarray(true[c]) for c in cliques_w}

    refit = Refit(dom, int(iters), oracle, total_count, compile_mode=compile_mode)
    model: MarkovRandomField | None = None
    model_cliques: list[Clique] = []
    measurements: list[Measurement] = []
    selected: list[Clique] = []
    probs_sel: list[float] = []
    n_cand: list[int] = []
    errors = [workload_error(None, true_tables)]
    scale = 0.0 if total_count is None else total_count
    for r in range(rounds):
        key, k_sel, k_noise = split_key(key, 3)
        in_model = {frozenset(c) for c in model_cliques}
        candidates = [
            c for c in cliques_w
            if any(frozenset(c) <= m for m in in_model) or tree_cells(model_cliques + [c])
            <= max_cells
        ]
        est = model_marginals(model, dom, candidates)
        scores = np.array([
            np.abs(true_tables[c] - scale * est[c]).sum() - pen[c] for c in candidates
        ])
        i, probs = exponential_mechanism(
            scores, eps_sel, score_sens, sampler=sampler, rng_key=k_sel, ledger=ledger,
            label=f"MWEM round {r + 1}: exponential mechanism")
        choice = candidates[i]
        selected.append(choice)
        probs_sel.append(float(probs[i]))
        n_cand.append(len(candidates))
        measurements += release_tables(
            {choice: true_tables[choice]}, meas_budget, domain=dom, mechanism=mechanism,
            neighbours=neighbours, rng_key=k_noise, ledger=ledger, sampler=sampler,
            label=f"MWEM round {r + 1}: {mechanism} measurement of {choice}",
        )
        if frozenset(choice) not in in_model:
            model_cliques.append(choice)
        model = refit(measurements, model_cliques)
        scale = refit.total
        errors.append(workload_error(model, true_tables))
        if callback is not None:
            callback(r + 1, {"selected": choice, "error": errors[-1]})

    assert model is not None
    extras = {
        "selected": tuple(selected),
        "errors": np.asarray(errors),
        "selection_probability": np.asarray(probs_sel),
        "num_candidates": tuple(n_cand),
        "measurements": tuple(measurements),
        "noise": spec,
        "epsilon_selection": eps_sel,
        "score_sensitivity": score_sens,
        "ledger": ledger,
        "fit": refit.fit,
        "total": scale,
        "costs": tuple(refit.costs),
    }
    return Result(model=model, loss_trace=np.asarray(errors), iterations=rounds, converged=True,
                  elapsed=time.perf_counter() - start, extras=extras)

