"""Inputs shared by the mechanisms: records and domain, the budget in zCDP, the ledger, the key.

Every mechanism checks all of its arguments and has the ledger confirm that it can pay the
whole budget before any record is counted (:func:`open_ledger`): a run that cannot be paid for
raises :class:`~numpyro_dpgm.privacy.BudgetExceededError` with nothing spent or touched.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

from .._jit import check_compile_mode
from ..data import Dataset
from ..domain import Clique, Domain
from ..estimation.prox_pgm import STOP_RULES
from ..privacy.conversions import Conversion, approx_to_zcdp, check_conversion
from ..privacy.guarantees import ZCDP, ApproxDP, PrivacyCost, PureDP
from ..privacy.ledger import PrivacyLedger
from ..privacy.releases import check_rng
from ..privacy.sensitivity import check_neighbours, check_sampler

__all__ = ["check_cliques", "check_final_fit", "check_positive", "check_positive_int",
           "open_ledger", "resolve_key", "resolve_records", "setup", "split_key", "zcdp_budget"]


def resolve_records(data: Any, domain: Domain | Mapping[str, int] | None) -> tuple[Any, Domain]:
    """``(records, domain)`` from a :class:`Dataset`, or records with their ``domain``."""
    if isinstance(data, Dataset):
        if domain is not None and Domain(domain) != data.domain:
            raise ValueError("the Dataset carries its own domain, which differs from domain=")
        return data.records, data.domain
    if domain is None:
        raise ValueError("records need their domain: pass domain= (or a Dataset)")
    return data, domain if isinstance(domain, Domain) else Domain(domain)


def zcdp_budget(budget: Any, conversion: Conversion = "cks20") -> tuple[float, PrivacyCost]:
    """``(ρ, budget)``: the zCDP parameter a Gaussian mechanism spends, and the budget as given.

    ``ApproxDP(ε, δ)`` becomes the largest ``ρ`` whose ρ-zCDP implies (ε, δ)-DP under
    ``conversion`` (:func:`~numpyro_dpgm.privacy.approx_to_zcdp`); ``ZCDP(ρ)`` is ``ρ``; a bare
    number is ``ρ``, as for the other zCDP learners (e.g.
    :func:`~numpyro_dpgm.learners.learn_ising`). A ``PureDP`` budget is refused: Gaussian noise
    is not ε-DP for any finite ε.
    """
    conversion = check_conversion(conversion)  # type: ignore[assignment]
    if isinstance(budget, numbers.Real) and not isinstance(budget, bool):
        budget = ZCDP(float(budget))
    if isinstance(budget, PureDP):
        raise ValueError(
            "the mechanism measures with Gaussian noise, which is not ε-DP for any finite ε: "
            "give it ApproxDP(epsilon, delta) or ZCDP(rho)"
        )
    if isinstance(budget, ApproxDP):
        return approx_to_zcdp(budget.epsilon, budget.delta, conversion), budget
    if isinstance(budget, ZCDP):
        return budget.rho, budget
    raise TypeError(f"budget must be ApproxDP(epsilon, delta), ZCDP(rho) or a number ρ; "
                    f"got {budget!r}")


def open_ledger(ledger: PrivacyLedger | None, budget: PrivacyCost, rho: float, label: str,
                conversion: Conversion = "cks20") -> PrivacyLedger:
    """The ledger to debit, after checking that it can pay ``ZCDP(rho)`` (nothing is charged).

    Default: a fresh ledger holding exactly the budget, in zCDP currency (an ``ApproxDP``
    budget is kept as given and spent in ρ with the same ``conversion``).
    """
    if ledger is None:
        if isinstance(budget, ApproxDP):
            ledger = PrivacyLedger(budget, currency="zcdp", conversion=conversion)
        else:
            ledger = PrivacyLedger(ZCDP(rho))
    elif not isinstance(ledger, PrivacyLedger):
        raise TypeError(f"ledger must be a PrivacyLedger, got {type(ledger).__name__}")
    ledger.check(ZCDP(rho), label)
    return ledger


def resolve_key(sampler: str, rng_key: Any) -> Any:
    """The JAX key of the ``"jax"`` sampler (required; an int is a seed), or ``None`` for
    ``"opendp"`` (which refuses a key), as :func:`~numpyro_dpgm.privacy.release` checks it."""
    return check_rng(check_sampler(sampler), rng_key)


def check_cliques(cliques: Any, domain: Domain, what: str, min_size: int = 1) -> list[Clique]:
    """A user-given list of cliques (e.g. ``initial_cliques``), each checked against the
    domain, with at least ``min_size`` attributes, none listed twice."""
    if isinstance(cliques, str) or not isinstance(cliques, Iterable):
        raise TypeError(f"{what} must be a list of attribute tuples, got {cliques!r}")
    out: list[Clique] = []
    for c in cliques:
        clique = domain.check_clique((c,) if isinstance(c, str) else tuple(c))
        if len(clique) < min_size:
            raise ValueError(f"{what} {clique} has fewer than {min_size} attributes")
        if any(set(clique) == set(o) for o in out):
            raise ValueError(f"{what} {clique} is listed twice")
        out.append(clique)
    if not out:
        raise ValueError(f"{what} is empty")
    return out


class Setup(NamedTuple):
    """A mechanism's checked inputs: records, domain, neighbouring relation, ρ, key, ledger."""

    records: Any
    domain: Domain
    neighbours: str
    rho: float
    key: Any
    ledger: PrivacyLedger


def setup(data: Any, domain: Domain | Mapping[str, int] | None, *, budget: Any, sampler: str,
          rng_key: Any, ledger: PrivacyLedger | None, neighbours: str,
          conversion: Conversion, label: str) -> Setup:
    """Check a mechanism's common arguments and that the ledger can pay ``ρ`` (charging
    nothing, counting no record)."""
    records, dom = resolve_records(data, domain)
    neighbours = check_neighbours(neighbours)
    rho, budget = zcdp_budget(budget, conversion)
    key = resolve_key(sampler, rng_key)
    return Setup(records, dom, neighbours, rho, key,
                 open_ledger(ledger, budget, rho, label, conversion))


def split_key(key: Any, num: int = 2) -> tuple[Any, ...]:
    """``num`` fresh keys from ``key`` (``None`` stays ``None``: the OpenDP sampler).

    The ``i``-th is ``fold_in(key, i)``: one compiled program for every ``num``, where
    ``jax.random.split`` compiles one per ``num`` and another to unstack its result.
    """
    if key is None:
        return (None,) * num
    return tuple(jax.random.fold_in(key, i) for i in range(num))


def check_positive_int(value: Any, name: str) -> int:
    """``value`` as an int, or ``ValueError`` unless it is a positive integer."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_positive(value: Any, name: str) -> float:
    """``value`` as a float, or ``ValueError`` unless it is a positive finite number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def check_final_fit(stop: Any, compile_mode: Any) -> None:
    """The final fit's stopping rule and compile mode, checked before any budget is spent."""
    if stop not in STOP_RULES:
        raise ValueError(f"unknown stop {stop!r}; use one of {', '.join(map(repr, STOP_RULES))} "
                         "(the final fit's stopping rule, see prox_pgm)")
    check_compile_mode(compile_mode)
