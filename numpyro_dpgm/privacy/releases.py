"""Differentially private release of clique count tables.

:func:`release` counts the tables ``n_C`` of the cliques ``C ∈ 𝒞`` (:func:`numpyro_dpgm.data.count`)
and adds independent noise to every cell, calibrated to the sensitivity of releasing the
``|𝒞|`` tables *together* under an explicit neighbouring relation
(:func:`~numpyro_dpgm.privacy.sensitivity.marginal_sensitivity`,
:func:`~numpyro_dpgm.privacy.sensitivity.calibrate`); the noise is drawn by OpenDP's vetted
samplers (``sampler="opendp"``, the default) or, for simulation studies only, by a seeded JAX
sampler (:mod:`~numpyro_dpgm.privacy.samplers`). :func:`simulate_release` is the same as
``release(..., sampler="jax", rng_key=key)``.

Before anything is counted or spent, :func:`check_release_size` refuses a release too large to
make or keep (above :data:`DEFAULT_MAX_CELLS` cells or the machine's memory) and warns
(:class:`SparseTableWarning`) of a table with more cells than records.

When a :class:`~numpyro_dpgm.privacy.ledger.PrivacyLedger` is given, it is debited after all
arguments are validated and before any noise is drawn; a release that would overspend raises
:class:`~numpyro_dpgm.privacy.ledger.BudgetExceededError` and draws nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import jax
import numpy as np
import pandas as pd

from .._warnings import SparseTableWarning, warn_sparse_tables
from ..data import Dataset, count
from ..domain import Clique, Domain
from ..measurements import (
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    Laplace,
    Measurement,
    NoiseSpec,
)
from ..network import MarkovNetwork
from ..oracles.memory import physical_memory
from ..tables import CliqueTables
from .calibration import gaussian_rho
from .conversions import Conversion
from .guarantees import ApproxDP, PrivacyCost
from .ledger import PrivacyLedger
from .samplers import opendp_draw, opendp_measurement, simulate_noise
from .sensitivity import (
    Mechanism,
    Neighbours,
    Sampler,
    Sensitivity,
    as_budget,
    calibrate,
    check_mechanism,
    check_neighbours,
    check_person_bound,
    check_sampler,
    marginal_sensitivity,
)

__all__ = [
    "DEFAULT_MAX_CELLS",
    "SparseTableWarning",
    "check_release_size",
    "release",
    "release_tables",
    "simulate_release",
]

#: OpenDP's privacy map may differ from the closed form by floating-point rounding only.
_OPENDP_MAP_TOLERANCE = 1e-9

#: Default cap on the cells of one release (all its tables together): 2·10⁷ cells are ~160 MB
#: of float64 counts, ~0.5 GB of JSON, and an exact fit of a clique that size needs gigabytes.
DEFAULT_MAX_CELLS = 20_000_000

#: Bytes one released cell costs on the way out, all copies together (its count, the noise, the
#: noisy value, and ~25 characters of JSON text, written through a string of that size).
_BYTES_PER_CELL = 64


def check_release_size(cliques: Sequence[Clique], domain: Domain,
                       num_records: int | None = None,
                       max_cells: float = DEFAULT_MAX_CELLS) -> int:
    """Refuse, before any count is made or budget spent, a release too large to make or keep.

    Parameters
    ----------
    cliques : sequence of cliques
    domain : Domain
    num_records : int, optional
        Records of the data; a clique with more cells than records gives a
        :class:`SparseTableWarning`.
    max_cells : float
        Cap on the cells of all tables together (default :data:`DEFAULT_MAX_CELLS`).

    Returns
    -------
    int
        The number of released cells.

    Raises
    ------
    ValueError
        Above ``max_cells``, or when the estimated memory (``64`` bytes a cell) exceeds the
        machine's physical memory; the message gives the figures and the remedy.
    """
    if not max_cells > 0:
        raise ValueError(f"max_cells must be positive, got {max_cells}")
    sizes = {c: domain.size(c) for c in cliques}
    total = sum(sizes.values())
    largest = max(sizes, key=sizes.get) if sizes else None
    need = total * _BYTES_PER_CELL
    physical = physical_memory()
    if total > max_cells or (physical is not None and need > physical):
        where = (f"above max_cells = {max_cells:,.0f}" if total > max_cells else
                 f"more than this machine's {physical / 2**30:.1f} GiB")
        raise ValueError(
            f"the release has {total:,} cells (clique {largest} alone {sizes[largest]:,}) and "
            f"needs ~{need / 2**30:.1f} GiB to count, draw and write, {where}; release smaller "
            "tables (coarsen an attribute, or split the clique into overlapping smaller ones)"
            + (", or raise max_cells" if total > max_cells else ""))
    if num_records is not None:
        warn_sparse_tables(sizes, num_records, "clique")
    return total


# --------------------------------------------------------------------------------------------
# release
# --------------------------------------------------------------------------------------------
def _resolve_data(data: Any, domain: Domain | Mapping[str, int] | None) -> tuple[Any, Domain]:
    if isinstance(data, Dataset):
        if domain is not None and Domain(domain) != data.domain:
            raise ValueError(
                "mismatched domains: the Dataset carries its own domain "
                f"{data.domain!r}, which differs from domain= {Domain(domain)!r}; drop domain="
            )
        return data.records, data.domain
    if isinstance(data, CliqueTables):
        raise TypeError("data is already a CliqueTables of counts; use release_tables(...)")
    if domain is None:
        raise ValueError(
            "records need their domain: pass domain=Domain({...}) (or a Dataset, which carries it)"
        )
    domain = domain if isinstance(domain, Domain) else Domain(domain)
    if not isinstance(data, pd.DataFrame):
        data = np.asarray(data)
    return data, domain


def _num_records(records: Any) -> int | None:
    """Rows of an in-memory DataFrame or array; ``None`` when unknown (a file path)."""
    if isinstance(records, (pd.DataFrame, np.ndarray)) and records.ndim >= 1:
        return int(records.shape[0])
    return None


def _resolve_cliques(
    cliques: Any, domain: Domain | None
) -> tuple[list[Clique], Domain | None]:
    if isinstance(cliques, MarkovNetwork):
        net_domain = cliques.domain
        if domain is not None:
            for c in cliques.cliques:
                for a in c:
                    if a not in domain or domain[a] != net_domain[a]:
                        got = domain[a] if a in domain else "absent"
                        raise ValueError(
                            f"mismatched domains: the network gives attribute {a!r} "
                            f"{net_domain[a]} values, the data's domain {got}"
                        )
        return list(cliques.cliques), domain if domain is not None else net_domain
    if isinstance(cliques, str) or not isinstance(cliques, Iterable):
        raise TypeError(
            "cliques must be a list of tuples of attribute names (or a MarkovNetwork), "
            f"got {cliques!r}"
        )
    items = [(c,) if isinstance(c, str) else tuple(c) for c in cliques]
    if not items:
        raise ValueError("empty list of cliques: name at least one clique table to release")
    if domain is not None:
        items = [domain.check_clique(c) for c in items]
    elif any(not c for c in items):
        raise ValueError("empty clique: a clique needs at least one attribute")
    seen: dict[frozenset[str], Clique] = {}
    for c in items:
        if frozenset(c) in seen:
            raise ValueError(
                f"clique {c} is listed twice (as {seen[frozenset(c)]}); release each table once"
            )
        seen[frozenset(c)] = c
    return items, domain


def check_rng(sampler: str, rng_key: Any) -> Any:
    if sampler == "opendp":
        if rng_key is not None:
            raise ValueError(
                "sampler='opendp' draws from the operating system's cryptographic random source "
                "and cannot be seeded; drop rng_key=, or use sampler='jax' (simulation studies "
                "only) for reproducible noise"
            )
        return None
    if rng_key is None:
        raise ValueError(
            "sampler='jax' (for simulation studies) needs rng_key=, a JAX PRNG key such as "
            "jax.random.key(0)"
        )
    if isinstance(rng_key, int | np.integer) and not isinstance(rng_key, bool):
        return jax.random.key(int(rng_key))
    if not isinstance(rng_key, jax.Array):
        raise TypeError(f"rng_key must be a JAX PRNG key or an int seed, got "
                        f"{type(rng_key).__name__}")
    return rng_key


def _default_label(mechanism: str, cliques: Sequence[Clique]) -> str:
    names = ", ".join("(" + ", ".join(c) + ")" for c in cliques[:6])
    more = f", … ({len(cliques)} tables)" if len(cliques) > 6 else ""
    return f"{mechanism} release of {names}{more}"


class _Plan(NamedTuple):
    sensitivity: Sensitivity
    spec: NoiseSpec
    guarantees: tuple[PrivacyCost, ...]
    calibration: str | None
    conversion: str


def _plan(
    num_cliques: int,
    budget: PrivacyCost,
    *,
    mechanism: str,
    neighbours: str,
    person_bound: float,
    ledger: PrivacyLedger | None,
    calibration: str | None,
    conversion: str | None,
    label: str,
) -> _Plan:
    """Sensitivity, noise and guarantees of a release; validates before any data is touched."""
    if ledger is not None and not isinstance(ledger, PrivacyLedger):
        raise TypeError(f"ledger must be a PrivacyLedger, got {type(ledger).__name__}")
    if mechanism.startswith("discrete") and person_bound != round(person_bound):
        raise ValueError(
            f"the {mechanism} mechanism releases integer counts, so the person bound must be a "
            f"whole number of records; got person_bound={person_bound}"
        )
    sensitivity = marginal_sensitivity(num_cliques, neighbours, person_bound)  # type: ignore[arg-type]
    if conversion is None:
        conversion = ledger.conversion if ledger is not None else "bs16"
    spec, guarantees = calibrate(
        mechanism,  # type: ignore[arg-type]
        budget,
        sensitivity,
        calibration=calibration,  # type: ignore[arg-type]
        conversion=conversion,  # type: ignore[arg-type]
    )
    if isinstance(spec, Gaussian | DiscreteGaussian) and isinstance(budget, ApproxDP):
        calibration = calibration or ("zcdp" if isinstance(spec, DiscreteGaussian) else "analytic")
    else:
        calibration = None
    if ledger is not None:  # fail early (before counting); debited again right before drawing
        ledger.check(guarantees, label)
    return _Plan(sensitivity, spec, guarantees, calibration, conversion)


def _release_counted(
    tables: Mapping[Clique, Any],
    cliques: Sequence[Clique],
    plan: _Plan,
    *,
    mechanism: str,
    neighbours: str,
    person_bound: float,
    rng_key: Any,
    ledger: PrivacyLedger | None,
    sampler: str,
    label: str,
) -> list[Measurement]:
    sensitivity, spec, guarantees = plan.sensitivity, plan.spec, plan.guarantees
    arrays = [np.asarray(tables[c], dtype=np.float64) for c in cliques]
    flat = np.concatenate([a.ravel() for a in arrays])
    details: dict[str, Any] = {
        "mechanism": mechanism,
        "noise": spec,
        "neighbours": neighbours,
        "sensitivity": sensitivity,
        "person_bound": person_bound,
        "cliques": tuple(cliques),
        "sampler": sampler,
    }
    if plan.calibration is not None:
        details["calibration"] = plan.calibration
        details["conversion"] = plan.conversion

    if sampler == "opendp":
        meas, vetted = opendp_measurement(spec, sensitivity)
        closed_form = (
            guarantees[0].epsilon
            if isinstance(spec, Laplace | DiscreteLaplace)
            else gaussian_rho(spec.sigma, sensitivity.l2)  # type: ignore[union-attr]
        )
        if vetted > closed_form * (1.0 + _OPENDP_MAP_TOLERANCE):
            raise RuntimeError(
                f"OpenDP's privacy map gives {vetted!r} for this release but the closed form "
                f"gives {closed_form!r}; refusing to release"
            )
        details["opendp_map"] = vetted

    if ledger is not None:
        ledger.debit(guarantees, label, details)

    if sampler == "opendp":
        noisy = opendp_draw(meas, spec, flat)
    else:
        noise = np.asarray(simulate_noise(rng_key, spec, flat.shape), dtype=np.float64)
        noisy = flat + noise
    out, offset = [], 0
    for c, a in zip(cliques, arrays, strict=True):
        out.append(Measurement(c, noisy[offset : offset + a.size], spec))
        offset += a.size
    return out


def release(
    data: Any,
    cliques: Sequence[Iterable[str]] | MarkovNetwork,
    budget: PrivacyCost | float,
    *,
    domain: Domain | Mapping[str, int] | None = None,
    mechanism: Mechanism = "laplace",
    neighbours: Neighbours = "add_remove",
    rng_key: Any = None,
    ledger: PrivacyLedger | None = None,
    weights: Any = None,
    person_bound: float | None = None,
    sampler: Sampler = "opendp",
    calibration: Literal["analytic", "zcdp"] | None = None,
    conversion: Conversion | None = None,
    label: str | None = None,
    max_cells: float = DEFAULT_MAX_CELLS,
) -> list[Measurement]:
    """Count the clique tables of ``data`` and release them with calibrated noise.

    Parameters
    ----------
    data : Dataset, pandas DataFrame or array ``(num_records, num_attrs)``
        The records; a DataFrame or array needs ``domain=``.
    cliques : sequence of tuples of attribute names, or MarkovNetwork
        The tables released together; the sensitivity grows with their number ``|𝒞|``.
    budget : float, PureDP, ZCDP or ApproxDP
        The privacy spent by this release (see :func:`calibrate`): a number is ε.
    domain : Domain, optional
        Domain of array or DataFrame records (a Dataset carries its own).
    mechanism : {"laplace", "gaussian", "discrete_laplace", "discrete_gaussian"}
    neighbours : {"add_remove", "replace_one"}
        The neighbouring relation the guarantee refers to (module table). Under add/remove the
        number of records N is private too; estimate it with :func:`estimate_total`.
    rng_key : JAX PRNG key or int, optional
        Required by ``sampler="jax"``; must be ``None`` for ``sampler="opendp"``.
    ledger : PrivacyLedger, optional
        Debited (before any noise is drawn) with the release's guarantee.
    weights : array ``(num_records,)``, optional
        Record weights for :func:`numpyro_dpgm.data.count` (continuous mechanisms only). The
        caller guarantees that one person's records carry a total weight of at most
        ``person_bound`` (default 1, i.e. the ``1/K`` normalisation of a person with ``K``
        records); a record weight above the bound is rejected.
    person_bound : float, optional
        ``B``, the largest total weight (or number of records, without weights) that one person
        contributes to a table; the sensitivity is multiplied by it. Default 1.
    sampler : {"opendp", "jax"}
        ``"opendp"``: vetted samplers for real releases. ``"jax"``: seeded, **simulation studies
        only** (see :func:`simulate_release`).
    calibration : {"analytic", "zcdp"}, optional
        Gaussian calibration for ``ApproxDP`` budgets (see :func:`calibrate`).
    conversion : {"bs16", "cks20"}, optional
        (ε, δ) → ρ conversion; default the ledger's, else ``"bs16"``.
    label : str, optional
        Ledger label; default names the mechanism and cliques.
    max_cells : float
        Cap on the cells of all tables together (:func:`check_release_size`): a larger release
        is refused before anything is counted or spent. A clique with more cells than records
        gives a :class:`SparseTableWarning`.

    Returns
    -------
    list of Measurement
        One identity-query measurement per clique, in the order given, each with its NoiseSpec.

    Raises
    ------
    ValueError, TypeError, KeyError
        Bad budget (ε ≤ 0, δ ∉ (0, 1)), empty or repeated cliques, unknown attributes,
        mismatched domains, unknown mechanism / neighbours / sampler, bad weights, a release
        above ``max_cells`` or the machine's memory.
    BudgetExceededError
        If the ledger cannot pay; nothing is drawn or charged.
    """
    mechanism = check_mechanism(mechanism)  # type: ignore[assignment]
    neighbours = check_neighbours(neighbours)  # type: ignore[assignment]
    sampler = check_sampler(sampler)  # type: ignore[assignment]
    budget = as_budget(budget)
    key = check_rng(sampler, rng_key)
    if domain is None and isinstance(cliques, MarkovNetwork) and not isinstance(data, Dataset):
        domain = cliques.domain
    records, dom = _resolve_data(data, domain)
    clique_list, dom = _resolve_cliques(cliques, dom)
    assert dom is not None
    check_release_size(clique_list, dom, _num_records(records), max_cells)
    bound = 1.0 if person_bound is None else check_person_bound(person_bound)
    label = label or _default_label(mechanism, clique_list)
    plan = _plan(
        len(clique_list),
        budget,
        mechanism=mechanism,
        neighbours=neighbours,
        person_bound=bound,
        ledger=ledger,
        calibration=calibration,
        conversion=conversion,
        label=label,
    )
    if weights is not None:
        if mechanism.startswith("discrete"):
            raise ValueError(
                f"the {mechanism} mechanism adds integer noise to integer counts; weighted "
                "counts are fractional, so use mechanism='laplace' or 'gaussian' with weights"
            )
        w = np.asarray(weights, dtype=float)
        if w.size and np.nanmax(w) > bound:
            raise ValueError(
                f"a record weight is {float(np.nanmax(w))} > {bound}, the per-person bound. "
                "Normalise weights so that each person's records sum to at most 1 (e.g. 1/K "
                "for a person with K records), or declare the bound with person_bound=B"
            )
    tables = count(records, clique_list, dom, weights)
    return _release_counted(
        tables,
        clique_list,
        plan,
        mechanism=mechanism,
        neighbours=neighbours,
        person_bound=bound,
        rng_key=key,
        ledger=ledger,
        sampler=sampler,
        label=label,
    )


def release_tables(
    tables: CliqueTables | Mapping[Iterable[str], Any],
    budget: PrivacyCost | float,
    *,
    domain: Domain | Mapping[str, int] | None = None,
    mechanism: Mechanism = "laplace",
    neighbours: Neighbours = "add_remove",
    rng_key: Any = None,
    ledger: PrivacyLedger | None = None,
    person_bound: float = 1.0,
    sampler: Sampler = "opendp",
    calibration: Literal["analytic", "zcdp"] | None = None,
    conversion: Conversion | None = None,
    label: str | None = None,
) -> list[Measurement]:
    """Release count tables that were already computed (e.g. by :func:`numpyro_dpgm.data.count`).

    All tables are released together (sensitivity from their number, as in :func:`release`).
    The caller guarantees that one person contributes total weight at most ``person_bound``
    to each table. With ``domain=`` every clique and table shape is checked against it. The
    discrete mechanisms require integer-valued tables. Other parameters and errors as in
    :func:`release`.
    """
    mechanism = check_mechanism(mechanism)  # type: ignore[assignment]
    neighbours = check_neighbours(neighbours)  # type: ignore[assignment]
    sampler = check_sampler(sampler)  # type: ignore[assignment]
    budget = as_budget(budget)
    key = check_rng(sampler, rng_key)
    bound = check_person_bound(person_bound)
    if not isinstance(tables, Mapping):
        raise TypeError(
            f"tables must be a CliqueTables (clique -> count table), got {type(tables).__name__}"
        )
    dom = None if domain is None else (domain if isinstance(domain, Domain) else Domain(domain))
    clique_list, _ = _resolve_cliques(list(tables.keys()), dom)
    table_of = {tuple(c): v for c, v in tables.items()}
    arrays = {}
    for c in clique_list:
        a = np.asarray(table_of[c], dtype=np.float64)
        if dom is not None and a.shape != dom.shape_of(c):
            raise ValueError(
                f"mismatched domains: the table of clique {c} has shape {a.shape} but the "
                f"domain gives {dom.shape_of(c)}"
            )
        if a.ndim != len(c):
            raise ValueError(f"the table of clique {c} has {a.ndim} axes; expected {len(c)}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"the table of clique {c} has non-finite entries")
        if mechanism.startswith("discrete") and np.any(a != np.rint(a)):
            raise ValueError(
                f"the {mechanism} mechanism needs integer counts; the table of clique {c} has "
                "fractional entries (weighted counts?); use mechanism='laplace' or 'gaussian'"
            )
        arrays[c] = a
    label = label or _default_label(mechanism, clique_list)
    plan = _plan(
        len(clique_list),
        budget,
        mechanism=mechanism,
        neighbours=neighbours,
        person_bound=bound,
        ledger=ledger,
        calibration=calibration,
        conversion=conversion,
        label=label,
    )
    return _release_counted(
        arrays,
        clique_list,
        plan,
        mechanism=mechanism,
        neighbours=neighbours,
        person_bound=bound,
        rng_key=key,
        ledger=ledger,
        sampler=sampler,
        label=label,
    )


def simulate_release(
    data: Any,
    cliques: Sequence[Iterable[str]] | MarkovNetwork,
    budget: PrivacyCost | float,
    rng_key: Any,
    **kwargs: Any,
) -> list[Measurement]:
    """:func:`release` with the JAX sampler seeded by ``rng_key``: **for simulation studies only**.

    Reproducible noisy measurements for experiments and tests; not for releasing real data
    (use :func:`release`, whose default sampler is OpenDP's). Keyword arguments are those of
    :func:`release` except ``sampler`` and ``rng_key``.
    """
    if "sampler" in kwargs or "rng" in kwargs:
        raise TypeError("simulate_release fixes sampler='jax' and takes the seed as rng_key")
    return release(data, cliques, budget, sampler="jax", rng_key=rng_key, **kwargs)
