"""Differentially private release of clique count tables.

:func:`release` counts the tables ``n_C`` of the cliques ``C ∈ 𝒞`` (:func:`numpyro_dpgm.data.count`)
and adds independent noise to every cell, calibrated to the sensitivity of releasing the
``|𝒞|`` tables *together* under an explicit neighbouring relation:

==================  ====================  ======================
neighbours          L1 sensitivity Δ₁      L2 sensitivity Δ₂
==================  ====================  ======================
``"add_remove"``    ``B·|𝒞|``             ``B·√|𝒞|``
``"replace_one"``   ``2·B·|𝒞|``           ``B·√(2|𝒞|)``
==================  ====================  ======================

Adding or removing one person changes each table by a non-negative vector of total mass at most
``B``, the *person bound* (1 for plain counts: one record per person); replacing a person removes
one such vector and adds another, so the L1 change per table is at most ``2B`` and the L2 change
at most ``√2·B`` (the two vectors are non-negative, so ``‖u − v‖₂² ≤ ‖u‖₁² + ‖v‖₁²``).
Summing over the ``|𝒞|`` tables gives the table above.

Noise (the :data:`~numpyro_dpgm.measurements.NoiseSpec` carried by each measurement):

* ``"laplace"`` / ``"discrete_laplace"``: scale ``b = Δ₁/ε``; ε-DP (Dwork & Roth 2014, Thm 3.6;
  for the discrete version Ghosh, Roughgarden & Sundararajan 2012).
* ``"gaussian"`` / ``"discrete_gaussian"``: ``σ = Δ₂/√(2ρ)`` for a ``ZCDP(ρ)`` budget
  (Bun & Steinke 2016, Prop. 1.6; Canonne, Kamath & Steinke 2020, Thm 4 for the discrete
  Gaussian). For an ``ApproxDP(ε, δ)`` budget the continuous Gaussian is calibrated by the
  analytic Gaussian mechanism (Balle & Wang 2018, Thm 8) unless ``calibration="zcdp"``; the
  discrete Gaussian always goes through zCDP, ``ρ = approx_to_zcdp(ε, δ)``, because the analytic
  bound is proven for the continuous distribution only.

Noise back ends (``sampler=``):

* ``"opendp"`` (default, for real releases): OpenDP's vetted samplers. ``make_laplace`` and
  ``make_gaussian`` on ``Vec<i64>`` draw the discrete Laplace and the discrete Gaussian exactly
  (Canonne, Kamath & Steinke 2020); on ``Vec<f64>`` they release the continuous mechanisms by
  rounding the input to a fine grid (granularity ``2^k``) and adding exactly sampled discrete
  noise on that grid, which avoids the floating-point weaknesses of textbook samplers
  (Mironov 2012).
  OpenDP draws from the operating system's cryptographic random source and cannot be seeded.
  Its constructors require the ``"contrib"`` feature flag, which is enabled only while the
  measurement is built (and switched off again if it was off). OpenDP's own privacy map is
  evaluated for every release and must agree with the closed form above that the ledger is
  charged with.
* ``"jax"``: a JAX-key-seeded sampler **for simulation studies only** (reproducible noise for
  experiments and tests); it uses floating-point samplers that are not safe for real releases.
  :func:`simulate_release` is the same as ``release(..., sampler="jax", rng=key)``.

When a :class:`~numpyro_dpgm.privacy.ledger.PrivacyLedger` is given, it is debited after all
arguments are validated and before any noise is drawn; a release that would overspend raises
:class:`~numpyro_dpgm.privacy.ledger.BudgetExceededError` and draws nothing.
"""

from __future__ import annotations

import math
import numbers
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from ..data import Dataset, count
from ..distributions.noise import discrete_gaussian_draw, discrete_laplace_draw
from ..domain import Clique, Domain
from ..measurements import (
    DiscreteGaussian,
    DiscreteLaplace,
    Gaussian,
    Laplace,
    Measurement,
    NoiseSpec,
    estimate_total,
)
from ..network import MarkovNetwork
from ..tables import CliqueTables
from .calibration import gaussian_rho, gaussian_sigma_approx, gaussian_sigma_zcdp, laplace_scale
from .conversions import Conversion, _check_conversion, approx_to_zcdp
from .guarantees import ZCDP, ApproxDP, PrivacyCost, PureDP
from .ledger import PrivacyLedger

__all__ = [
    "DEFAULT_MAX_CELLS",
    "SparseTableWarning",
    "check_release_size",
    "MECHANISMS",
    "NEIGHBOURS",
    "Sensitivity",
    "marginal_sensitivity",
    "calibrate",
    "release",
    "release_tables",
    "simulate_release",
    "simulate_noise",
    "estimate_total",
]

Mechanism = Literal["laplace", "gaussian", "discrete_laplace", "discrete_gaussian"]
Neighbours = Literal["add_remove", "replace_one"]
Sampler = Literal["opendp", "jax"]

MECHANISMS: tuple[str, ...] = ("laplace", "gaussian", "discrete_laplace", "discrete_gaussian")
NEIGHBOURS: tuple[str, ...] = ("add_remove", "replace_one")
_SAMPLERS = ("opendp", "jax")

#: OpenDP's privacy map may differ from the closed form by floating-point rounding only.
_OPENDP_MAP_TOLERANCE = 1e-9


#: Default cap on the cells of one release (all its tables together): 2·10⁷ cells are ~160 MB
#: of float64 counts, ~0.5 GB of JSON, and an exact fit of a clique that size needs gigabytes.
DEFAULT_MAX_CELLS = 20_000_000

#: Bytes one released cell costs on the way out, all copies together (its count, the noise, the
#: noisy value, and ~25 characters of JSON text, written through a string of that size).
_BYTES_PER_CELL = 64


class SparseTableWarning(UserWarning):
    """A released table has more cells than the data have records: most cells are empty and
    the noise dominates them; coarsening an attribute usually gives a more useful release."""


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
    physical = _physical_memory()
    if total > max_cells or (physical is not None and need > physical):
        where = (f"above max_cells = {max_cells:,.0f}" if total > max_cells else
                 f"more than this machine's {physical / 2**30:.1f} GiB")
        raise ValueError(
            f"the release has {total:,} cells (clique {largest} alone {sizes[largest]:,}) and "
            f"needs ~{need / 2**30:.1f} GiB to count, draw and write, {where}; release smaller "
            "tables (coarsen an attribute, or split the clique into overlapping smaller ones)"
            + (", or raise max_cells" if total > max_cells else ""))
    if num_records is not None:
        for c, cells in sizes.items():
            if cells > num_records:
                warnings.warn(
                    f"clique {c} has {cells:,} cells, {cells / max(num_records, 1):.3g}× the "
                    f"{num_records:,} records: most of its cells are empty and the noise "
                    "dominates them; coarsening an attribute usually gives a more useful "
                    "release", SparseTableWarning, stacklevel=3)
    return total


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


class Sensitivity(NamedTuple):
    """L1 and L2 sensitivity of releasing a set of count tables together."""

    l1: float
    l2: float


# --------------------------------------------------------------------------------------------
# argument checking
# --------------------------------------------------------------------------------------------
def _check_mechanism(mechanism: str) -> str:
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown mechanism {mechanism!r}; choose one of {list(MECHANISMS)}")
    return mechanism


def _check_neighbours(neighbours: str) -> str:
    if neighbours == "replace":  # accepted alias
        return "replace_one"
    if neighbours not in NEIGHBOURS:
        raise ValueError(
            f"unknown neighbouring relation {neighbours!r}; choose 'add_remove' (one person "
            "added or removed; N is then private) or 'replace_one' (one person's data replaced; "
            "N is public)"
        )
    return neighbours


def _check_sampler(sampler: str) -> str:
    if sampler not in _SAMPLERS:
        raise ValueError(
            f"unknown sampler {sampler!r}; choose 'opendp' (vetted, for real releases) or "
            "'jax' (seeded, for simulation studies only)"
        )
    return sampler


def _check_person_bound(person_bound: Any) -> float:
    try:
        value = float(person_bound)
    except (TypeError, ValueError):
        raise TypeError(f"person_bound must be a positive number, got {person_bound!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"person_bound (the largest total weight one person adds to a table) must be a "
            f"positive finite number, got {value}"
        )
    return value


def marginal_sensitivity(
    num_cliques: int, neighbours: Neighbours = "add_remove", person_bound: float = 1.0
) -> Sensitivity:
    """Sensitivity of releasing ``num_cliques`` count tables together.

    Parameters
    ----------
    num_cliques : int
        ``|𝒞|``, the number of tables released in one go (each person appears in every table).
    neighbours : {"add_remove", "replace_one"}
        The neighbouring relation.
    person_bound : float
        ``B``: the largest total weight one person contributes to one table (1 for plain counts
        with one record per person, and for record weights normalised to ``1/K`` for a person
        with ``K`` records).

    Returns
    -------
    Sensitivity
        ``(B|𝒞|, B√|𝒞|)`` for add/remove, ``(2B|𝒞|, B√(2|𝒞|))`` for replace-one.
    """
    if isinstance(num_cliques, bool) or not isinstance(num_cliques, int | np.integer):
        raise TypeError(f"num_cliques must be an integer, got {num_cliques!r}")
    if num_cliques < 1:
        raise ValueError(f"num_cliques must be at least 1, got {num_cliques}")
    neighbours = _check_neighbours(neighbours)
    b = _check_person_bound(person_bound)
    k = int(num_cliques)
    if neighbours == "add_remove":
        return Sensitivity(b * k, b * math.sqrt(k))
    return Sensitivity(2.0 * b * k, b * math.sqrt(2.0 * k))


def _as_budget(budget: Any) -> PrivacyCost:
    if isinstance(budget, PureDP | ZCDP | ApproxDP):
        return budget
    if isinstance(budget, numbers.Real) and not isinstance(budget, bool):
        return PureDP(float(budget))
    raise TypeError(
        "budget must be a number ε (pure DP), PureDP(epsilon), ZCDP(rho) or "
        f"ApproxDP(epsilon, delta); got {budget!r}"
    )


def calibrate(
    mechanism: Mechanism,
    budget: PrivacyCost | float,
    sensitivity: Sensitivity,
    *,
    calibration: Literal["analytic", "zcdp"] | None = None,
    conversion: Conversion = "bs16",
) -> tuple[NoiseSpec, tuple[PrivacyCost, ...]]:
    """Noise for ``mechanism`` at ``budget`` and the guarantees the resulting release satisfies.

    Parameters
    ----------
    mechanism : {"laplace", "gaussian", "discrete_laplace", "discrete_gaussian"}
    budget : float, PureDP, ZCDP or ApproxDP
        Laplace variants take ε (a number or ``PureDP``; ``ZCDP(ρ)`` is met with ``ε = √(2ρ)``,
        since ε-DP ⇒ ε²/2-zCDP). Gaussian variants take ``ZCDP(ρ)`` or ``ApproxDP(ε, δ)``.
    sensitivity : Sensitivity
        From :func:`marginal_sensitivity`.
    calibration : {"analytic", "zcdp"}, optional
        For ``ApproxDP`` budgets and the continuous Gaussian: ``"analytic"`` (default; Balle &
        Wang 2018) or ``"zcdp"`` (σ from ``ρ = approx_to_zcdp(ε, δ, conversion)``). The
        discrete Gaussian accepts only ``"zcdp"`` (its default).
    conversion : {"bs16", "cks20"}
        The (ε, δ) → ρ conversion for ``calibration="zcdp"``.

    Returns
    -------
    noise : NoiseSpec
        ``Laplace(Δ₁/ε)``, ``DiscreteLaplace(Δ₁/ε)``, ``Gaussian(σ)`` or ``DiscreteGaussian(σ)``.
    guarantees : tuple of PrivacyCost
        Every guarantee the release satisfies, most specific first (what a ledger is debited
        with; see :meth:`PrivacyLedger.charge_of`).
    """
    mechanism = _check_mechanism(mechanism)
    budget = _as_budget(budget)
    conversion = _check_conversion(conversion)  # type: ignore[assignment]
    if not isinstance(sensitivity, Sensitivity):
        sensitivity = Sensitivity(*sensitivity)
    if calibration not in (None, "analytic", "zcdp"):
        raise ValueError(f"unknown calibration {calibration!r}; choose 'analytic' or 'zcdp'")

    if mechanism in ("laplace", "discrete_laplace"):
        if isinstance(budget, ApproxDP):
            raise ValueError(
                f"the {mechanism} mechanism is pure ε-DP: give it PureDP(epsilon) (or a number "
                "ε), or use mechanism='gaussian' for an ApproxDP(epsilon, delta) budget"
            )
        if calibration is not None:
            raise ValueError(f"calibration= applies to Gaussian mechanisms, not to {mechanism}")
        eps = budget.epsilon if isinstance(budget, PureDP) else math.sqrt(2.0 * budget.rho)
        scale = laplace_scale(eps, sensitivity.l1)
        spec: NoiseSpec = Laplace(scale) if mechanism == "laplace" else DiscreteLaplace(scale)
        return spec, (PureDP(eps),)

    discrete = mechanism == "discrete_gaussian"
    if isinstance(budget, PureDP):
        raise ValueError(
            f"the {mechanism} mechanism is not ε-DP for any finite ε: give it ZCDP(rho) or "
            "ApproxDP(epsilon, delta), or use mechanism='laplace' for a pure ε budget"
        )
    if isinstance(budget, ZCDP):
        if calibration is not None:
            raise ValueError("calibration= applies to ApproxDP budgets only; a ZCDP budget fixes σ")
        sigma = gaussian_sigma_zcdp(budget.rho, sensitivity.l2)
        spec = DiscreteGaussian(sigma) if discrete else Gaussian(sigma)
        return spec, (ZCDP(budget.rho),)
    method = calibration or ("zcdp" if discrete else "analytic")
    if discrete and method == "analytic":
        raise ValueError(
            "the analytic Gaussian calibration (Balle & Wang 2018) is proven for the continuous "
            "Gaussian only; use calibration='zcdp' (the default) for the discrete Gaussian"
        )
    if method == "zcdp":
        rho = approx_to_zcdp(budget.epsilon, budget.delta, conversion)
        sigma = gaussian_sigma_zcdp(rho, sensitivity.l2)
        spec = DiscreteGaussian(sigma) if discrete else Gaussian(sigma)
        return spec, (ZCDP(rho), budget)
    sigma = gaussian_sigma_approx(budget.epsilon, budget.delta, sensitivity.l2, "analytic")
    return Gaussian(sigma), (budget, ZCDP(gaussian_rho(sigma, sensitivity.l2)))


# --------------------------------------------------------------------------------------------
# samplers
# --------------------------------------------------------------------------------------------
@contextmanager
def _opendp_contrib() -> Iterator[Any]:
    """``opendp.prelude`` with the "contrib" feature on (restored afterwards)."""
    try:
        import opendp.prelude as dp
        from opendp import mod as dp_mod
    except ImportError as err:  # pragma: no cover - opendp is a hard dependency
        raise ImportError(
            "sampler='opendp' needs the opendp package (pip install 'opendp>=0.12,<1')"
        ) from err
    features = getattr(dp_mod, "GLOBAL_FEATURES", None)
    was_on = features is not None and "contrib" in features
    dp.enable_features("contrib")
    try:
        yield dp
    finally:
        if features is not None and not was_on:
            dp.disable_features("contrib")


def _opendp_measurement(spec: NoiseSpec, sensitivity: Sensitivity) -> tuple[Any, float]:
    """OpenDP measurement on a vector of all cells, and its privacy map at the sensitivity.

    The map is ε (MaxDivergence) for the Laplace variants and ρ (ZeroConcentratedDivergence)
    for the Gaussian variants.
    """
    with _opendp_contrib() as dp:
        if isinstance(spec, Laplace | Gaussian):
            try:
                atom = dp.atom_domain(T="f64", nan=False)
            except TypeError:  # OpenDP < 0.13: float atoms exclude NaN by default
                atom = dp.atom_domain(T="f64")
            domain = dp.vector_domain(atom)
        else:
            domain = dp.vector_domain(dp.atom_domain(T="i64"))
        if isinstance(spec, Laplace):
            meas = dp.m.make_laplace(domain, dp.l1_distance(T="f64"), scale=spec.scale)
            d_in: float | int = float(sensitivity.l1)
        elif isinstance(spec, DiscreteLaplace):
            # integer data take an integer L1 distance (the person bound is an integer here)
            meas = dp.m.make_laplace(domain, dp.l1_distance(T="i64"), scale=spec.scale)
            d_in = int(round(sensitivity.l1))
        else:
            meas = dp.m.make_gaussian(domain, dp.l2_distance(T="f64"), scale=spec.sigma)
            d_in = float(sensitivity.l2)
        return meas, float(meas.map(d_in))


def _opendp_draw(meas: Any, spec: NoiseSpec, values: np.ndarray) -> np.ndarray:
    if isinstance(spec, DiscreteLaplace | DiscreteGaussian):
        out = meas(np.rint(values).astype(np.int64).tolist())
    else:
        out = meas(values.astype(np.float64).tolist())
    return np.asarray(out, dtype=np.float64)


def simulate_noise(key: Any, noise: NoiseSpec, shape: int | tuple[int, ...]) -> jax.Array:
    """Draw noise of the distribution ``noise`` with JAX: **for simulation studies only**.

    Reproducible from ``key``, jit-friendly and fast, but built on floating-point samplers
    that are not protected against the attacks vetted samplers defend against; real releases
    use ``sampler="opendp"`` of :func:`release`.

    Parameters
    ----------
    key : jax PRNG key (or an int seed)
    noise : NoiseSpec
        ``Laplace(b)``: ``b·Lap(0, 1)``; ``Gaussian(σ)``: ``σ·N(0, 1)``;
        ``DiscreteLaplace(b)``: ``P(z) ∝ e^{−|z|/b}``, a side then a geometric distance;
        ``DiscreteGaussian(σ)``: rejection sampling from the discrete Laplace (Canonne, Kamath &
        Steinke 2020, Alg. 3), ``P(z) ∝ e^{−z²/(2σ²)}``; the samplers of the observation models
        :class:`~numpyro_dpgm.distributions.DiscreteLaplaceNoise` and
        :class:`~numpyro_dpgm.distributions.DiscreteGaussianNoise`, at ``loc = 0``.
    shape : int or tuple of int
    """
    key = jax.random.key(key) if isinstance(key, int | np.integer) else key
    shape = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
    if isinstance(noise, Laplace):
        return noise.scale * jax.random.laplace(key, shape)
    if isinstance(noise, Gaussian):
        return noise.sigma * jax.random.normal(key, shape)
    zero = jnp.zeros((), dtype=jnp.result_type(float))
    if isinstance(noise, DiscreteLaplace):
        return discrete_laplace_draw(key, zero, noise.scale, shape).astype(int)
    if isinstance(noise, DiscreteGaussian):
        return discrete_gaussian_draw(key, zero, noise.sigma, shape).astype(int)
    raise TypeError(f"noise must be a NoiseSpec, got {type(noise).__name__}")


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


def _check_rng(sampler: str, rng: Any) -> Any:
    if sampler == "opendp":
        if rng is not None:
            raise ValueError(
                "sampler='opendp' draws from the operating system's cryptographic random source "
                "and cannot be seeded; drop rng=, or use sampler='jax' (simulation studies only) "
                "for reproducible noise"
            )
        return None
    if rng is None:
        raise ValueError(
            "sampler='jax' (for simulation studies) needs rng=, a JAX PRNG key such as "
            "jax.random.key(0)"
        )
    if isinstance(rng, int | np.integer) and not isinstance(rng, bool):
        return jax.random.key(int(rng))
    if not isinstance(rng, jax.Array):
        raise TypeError(f"rng must be a JAX PRNG key or an int seed, got {type(rng).__name__}")
    return rng


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
    rng: Any,
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
        meas, vetted = _opendp_measurement(spec, sensitivity)
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
        noisy = _opendp_draw(meas, spec, flat)
    else:
        noise = np.asarray(simulate_noise(rng, spec, flat.shape), dtype=np.float64)
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
    rng: Any = None,
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
    rng : JAX PRNG key or int, optional
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
    mechanism = _check_mechanism(mechanism)  # type: ignore[assignment]
    neighbours = _check_neighbours(neighbours)  # type: ignore[assignment]
    sampler = _check_sampler(sampler)  # type: ignore[assignment]
    budget = _as_budget(budget)
    key = _check_rng(sampler, rng)
    if domain is None and isinstance(cliques, MarkovNetwork) and not isinstance(data, Dataset):
        domain = cliques.domain
    records, dom = _resolve_data(data, domain)
    clique_list, dom = _resolve_cliques(cliques, dom)
    assert dom is not None
    check_release_size(clique_list, dom, _num_records(records), max_cells)
    bound = 1.0 if person_bound is None else _check_person_bound(person_bound)
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
        rng=key,
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
    rng: Any = None,
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
    mechanism = _check_mechanism(mechanism)  # type: ignore[assignment]
    neighbours = _check_neighbours(neighbours)  # type: ignore[assignment]
    sampler = _check_sampler(sampler)  # type: ignore[assignment]
    budget = _as_budget(budget)
    key = _check_rng(sampler, rng)
    bound = _check_person_bound(person_bound)
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
        rng=key,
        ledger=ledger,
        sampler=sampler,
        label=label,
    )


def simulate_release(
    data: Any,
    cliques: Sequence[Iterable[str]] | MarkovNetwork,
    budget: PrivacyCost | float,
    key: Any,
    **kwargs: Any,
) -> list[Measurement]:
    """:func:`release` with the JAX sampler seeded by ``key``: **for simulation studies only**.

    Reproducible noisy measurements for experiments and tests; not for releasing real data
    (use :func:`release`, whose default sampler is OpenDP's). Keyword arguments are those of
    :func:`release` except ``sampler`` and ``rng``.
    """
    if "sampler" in kwargs or "rng" in kwargs:
        raise TypeError("simulate_release fixes sampler='jax' and takes the seed as key")
    return release(data, cliques, budget, sampler="jax", rng=key, **kwargs)
