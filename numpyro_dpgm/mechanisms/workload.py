"""Workloads of marginal queries, AIM's candidate weights, and the workload error.

A workload is a sequence of ``(clique, weight)`` pairs: the marginals whose answers a
synthetic-data mechanism should preserve, each with its importance ``c_s > 0``. This module
builds the workloads of the AIM paper's experiments (McKenna, Mullins, Sheldon & Miklau 2022,
§6.1: all ``k``-way marginals, or all ``k``-way marginals that contain a target attribute),
checks user-given ones, forms AIM's candidate set (the downward closure ``W+``) with its
weights (§4.2), and scores an estimate by the workload error of the experiments (mean
total-variation distance ``½‖p̂_s − p_s‖₁``, §6.1; seed 003, Appendix C).
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..distributions.mrf import MarkovRandomField
from ..domain import Clique, Domain
from ..oracles import junction_tree as jt

__all__ = [
    "DEFAULT_WORKLOAD_CELLS",
    "all_marginals",
    "candidate_weights",
    "check_workload",
    "downward_closure",
    "model_marginals",
    "target_marginals",
    "workload_error",
]

#: Largest marginal (cells) in the built-in workloads: the cap of mbi's AIM and MST scripts
#: (``max_cells = 10000``), which the AIM paper's experiments use.
DEFAULT_WORKLOAD_CELLS = 10_000

Workload = tuple[tuple[Clique, float], ...]


def _check_degree(degree: Any, domain: Domain) -> int:
    if isinstance(degree, bool) or not isinstance(degree, int | np.integer) or degree < 1:
        raise ValueError(f"the workload degree must be a positive integer, got {degree!r}")
    return min(int(degree), len(domain))


def all_marginals(domain: Domain, degree: int = 3,
                  max_cells: float = DEFAULT_WORKLOAD_CELLS) -> Workload:
    """All ``degree``-way marginals with at most ``max_cells`` cells, weight 1 each.

    ``degree`` above the number of attributes means all of them (one marginal).

    Raises
    ------
    ValueError
        A bad degree, or no marginal small enough.
    """
    degree = _check_degree(degree, domain)
    out = tuple((c, 1.0) for c in itertools.combinations(domain.attrs, degree)
                if domain.size(c) <= max_cells)
    if not out:
        raise ValueError(f"no {degree}-way marginal has at most {max_cells:g} cells; raise "
                         "the cap or lower the degree")
    return out


def target_marginals(domain: Domain, target: str, degree: int = 3,
                     max_cells: float = DEFAULT_WORKLOAD_CELLS) -> Workload:
    """All ``degree``-way marginals that contain the attribute ``target`` (the AIM paper's
    "target" workload, §6.1), with at most ``max_cells`` cells, weight 1 each.

    Raises
    ------
    KeyError
        ``target`` is not an attribute of the domain.
    ValueError
        A bad degree, or no such marginal small enough.
    """
    if target not in domain:
        raise KeyError(f"unknown target column {target!r}; the domain has {list(domain.attrs)}")
    degree = _check_degree(degree, domain)
    others = [a for a in domain.attrs if a != target]
    out = tuple((domain.sorted((target,) + rest), 1.0)
                for rest in itertools.combinations(others, degree - 1)
                if domain.size((target,) + rest) <= max_cells)
    if not out:
        raise ValueError(f"no {degree}-way marginal with {target!r} has at most "
                         f"{max_cells:g} cells; raise the cap or lower the degree")
    return out


def check_workload(workload: Any, domain: Domain) -> Workload:
    """A user-given workload as ``(clique, weight)`` pairs.

    Items are cliques (weight 1) or ``(clique, weight)`` pairs with a positive finite weight.

    Raises
    ------
    KeyError
        A clique names an attribute not in the domain.
    ValueError, TypeError
        An empty workload, a clique listed twice, a bad weight.
    """
    if isinstance(workload, str) or not isinstance(workload, Iterable):
        raise TypeError(f"workload must be a list of attribute tuples or (tuple, weight) "
                        f"pairs, got {workload!r}")
    out, seen = [], set()
    for item in workload:
        weight: Any = 1.0
        if (isinstance(item, tuple | list) and len(item) == 2
                and not isinstance(item[0], str) and isinstance(item[1], numbers.Real)):
            item, weight = item
        clique = domain.check_clique((item,) if isinstance(item, str) else tuple(item))
        if isinstance(weight, bool) or not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"the weight of {clique} must be a positive finite number, "
                             f"got {weight!r}")
        if frozenset(clique) in seen:
            raise ValueError(f"workload clique {clique} is listed twice")
        seen.add(frozenset(clique))
        out.append((clique, float(weight)))
    if not out:
        raise ValueError("the workload is empty: give at least one marginal")
    return tuple(out)


def downward_closure(cliques: Iterable[Clique]) -> list[Clique]:
    """Every non-empty subset of the given cliques, each once (attributes in clique order),
    smallest first (ties in order of first appearance)."""
    seen: dict[frozenset[str], Clique] = {}
    for c in cliques:
        for r in range(1, len(c) + 1):
            for sub in itertools.combinations(c, r):
                seen.setdefault(frozenset(sub), sub)
    return sorted(seen.values(), key=len)


def candidate_weights(workload: Workload) -> dict[Clique, float]:
    """AIM's candidates ``W+`` (the downward closure of the workload) with their weights.

    ``w_r = Σ_{s ∈ W} c_s·|r ∩ s|`` (AIM paper, §4.2 "Candidates and their weights"; mbi's
    ``compile_workload``): a candidate counts for every workload marginal it overlaps, more
    for a larger overlap.
    """
    cliques = [c for c, _ in workload]
    sets = [(frozenset(c), w) for c, w in workload]
    return {r: math.fsum(w * len(frozenset(r) & s) for s, w in sets)
            for r in downward_closure(cliques)}


def model_marginals(model: MarkovRandomField | None, domain: Domain,
                    cliques: Sequence[Clique]) -> dict[Clique, np.ndarray]:
    """Probability tables of ``cliques`` under ``model`` (uniform when ``None``).

    One run of the network's compiled program answers every clique (out-of-model ones
    included) on the host; see :func:`numpyro_dpgm.oracles.junction_tree.marginals_of`.
    """
    if model is None:
        return {c: np.full(domain.shape_of(c), 1.0 / domain.size(c)) for c in cliques}
    tables = jt.marginals_of(model.network, model.theta, list(cliques))
    return dict(zip(cliques, tables, strict=True))


def workload_error(
    estimate: MarkovRandomField | Mapping[Any, Any] | None,
    tables: Mapping[Any, Any],
    weights: Mapping[Any, float] | None = None,
) -> float:
    """Mean (weighted) total-variation distance ``c_s·½‖p̂_s − n_s/N‖₁`` over the workload.

    The error metric of the AIM and MST experiments and of mbi's mechanism scripts (mean over
    the workload of ``0.5·w·‖X/ΣX − Y/ΣY‖₁``).

    Parameters
    ----------
    estimate : MarkovRandomField, mapping clique -> table, or None
        A fitted model, the tables of synthetic data (e.g. ``count(synthetic, cliques,
        domain)``; each normalised by its sum), or ``None`` for the uniform distribution.
    tables : mapping clique -> count table
        The true tables of the workload.
    weights : mapping clique -> weight, optional
        ``c_s`` (default 1).
    """
    if not tables:
        raise ValueError("no tables to compare with")
    cliques = [tuple(c) for c in tables]
    if isinstance(estimate, MarkovRandomField):
        est = model_marginals(estimate, estimate.network.domain, cliques)
    elif estimate is None:
        est = {c: np.full(np.shape(tables[c]), 1.0 / np.size(tables[c])) for c in cliques}
    else:
        est = {}
        for c in cliques:
            if c not in estimate:
                raise KeyError(f"the estimate has no table of {c}")
            t = np.asarray(estimate[c], dtype=float)
            est[c] = t / t.sum()
    errs = []
    for c in cliques:
        t = np.asarray(tables[c], dtype=float)
        w = 1.0 if weights is None else float(weights[c])
        errs.append(0.5 * w * np.abs(est[c] - t / t.sum()).sum())
    return float(np.mean(errs))
