"""The one contract of the estimators from measurements, and their registry.

Every estimator from noisy measurements has the signature

.. code-block:: python

    f(measurements, network_or_domain, *, total_count=None, rng_key=None, init=None,
      max_iters=<its default>, callback=None, **options) -> Result

- ``network_or_domain``: a :class:`~numpyro_dpgm.network.MarkovNetwork`, or a
  :class:`~numpyro_dpgm.domain.Domain` (or mapping attribute -> size), in which case the network
  is the maximal measured cliques (:func:`resolve_network`);
- ``total_count``: ``N``; ``None`` estimates it from the measurements without privacy cost
  (:func:`resolve_total`), and ``extras["total_count"]`` / ``extras["total_count_estimated"]``
  record the value used and how it was obtained;
- ``rng_key``: a JAX PRNG key (NumPyro's name); required by the stochastic estimators (a
  ``TypeError`` without it), accepted and ignored by the deterministic ones;
- ``init``: ``None`` (the estimator's default start), a fitted
  :class:`~numpyro_dpgm.distributions.mrf.MarkovRandomField` or a θ array (warm start), or one
  of the estimator's named starts;
- ``max_iters``: the main iteration count (each estimator says which loop), or the name of a
  rule that chooses it from the release (``cgm_em``'s ``"risk"``);
- ``callback``: ``callback(iteration, loss)`` during the main loop (each estimator says when);
- every other setting is keyword-only.

:func:`estimator` registers a function under its command-line name in :data:`ESTIMATORS`.
An estimator resolves its first three arguments once, with :func:`resolve_release`, which also
warns about cliques with more cells than records; what it calls inside takes the resolved
:class:`Release`, not the contract's arguments again.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from .._warnings import warn_sparse_tables
from ..distributions.mrf import MarkovRandomField
from ..domain import Domain
from ..measurements import Measurement, estimate_total, measurement_list
from ..network import MarkovNetwork
from ..privacy.guarantees import ZCDP, ApproxDP, PureDP

__all__ = [
    "ESTIMATORS",
    "Release",
    "UnknownAttributeError",
    "approx_budget",
    "check_attributes",
    "estimator",
    "network_from_measurements",
    "resolve_init",
    "resolve_network",
    "resolve_release",
    "resolve_total",
    "stochastic_key",
    "check_max_iters",
    "warn_sparse_cliques",
]

#: The estimators from measurements, by their command-line name (``dpgm fit --method``).
ESTIMATORS: dict[str, Callable[..., Any]] = {}

def estimator(name: str) -> Callable[[Callable], Callable]:
    """Register an estimator under ``name`` in :data:`ESTIMATORS` (as ``dpgm fit --method``
    spells it); the function itself is returned unchanged."""

    def register(fn: Callable) -> Callable:
        ESTIMATORS[name] = fn
        return fn

    return register


class Release(NamedTuple):
    """An estimator's inputs, resolved once (:func:`resolve_release`).

    Attributes
    ----------
    measurements : list of Measurement
        The measurements, as a list.
    network : MarkovNetwork
        The model's network: the one given, or the maximal measured cliques of a domain.
    total : float
        ``N``: ``total_count`` checked, or estimated from the measurements.
    total_estimated : bool
        Whether ``total`` was estimated (``Result.extras["total_count_estimated"]``).
    """

    measurements: list
    network: MarkovNetwork
    total: float
    total_estimated: bool

    def integer_total(self) -> Release:
        """This release with an estimated ``N`` rounded to a whole number of records (at least
        one), as the latent count tables of a collective graphical model need; a given ``N``
        is kept as it is."""
        if not self.total_estimated:
            return self
        return self._replace(total=float(max(1, round(self.total))))


def resolve_release(measurements: Any, network_or_domain: Any,
                    total_count: Any) -> Release:
    """The contract's first three arguments resolved: :func:`resolve_network`, then
    :func:`resolve_total`, then :func:`warn_sparse_cliques`.

    >>> from numpyro_dpgm import Laplace, Measurement
    >>> m = Measurement(("a",), [30.0, 10.0], Laplace(1.0))
    >>> release = resolve_release([m], {"a": 2}, None)
    >>> release.network.cliques, release.total, release.total_estimated
    ((('a',),), 40.0, True)
    """
    network, measurements = resolve_network(network_or_domain, measurements)
    total, estimated = resolve_total(total_count, measurements)
    warn_sparse_cliques(network, total)
    return Release(measurements, network, total, estimated)


def warn_sparse_cliques(network: MarkovNetwork, total: float) -> None:
    """A :class:`~numpyro_dpgm._warnings.SparseTableWarning` for each clique of ``network``
    with more cells than the ``total`` records: its cells are mostly empty and the fit there is
    mostly noise."""
    warn_sparse_tables({c: network.domain.size(c) for c in network.cliques}, total,
                       "the model's clique")


def network_from_measurements(
    domain: Domain, measurements: Sequence[Measurement]
) -> MarkovNetwork:
    """Maximal measured cliques (attributes in domain order, first-appearance order)."""
    sets: list[frozenset[str]] = []
    for m in measurements:
        s = frozenset(m.clique)
        if s not in sets:
            sets.append(s)
    maximal = [s for s in sets if not any(s < t for t in sets)]
    return MarkovNetwork(domain, [domain.sorted(s) for s in maximal])


def resolve_network(network_or_domain: Any, measurements: Any) -> tuple[MarkovNetwork, list]:
    """``(network, measurements as a list)`` from the contract's first two arguments.

    A :class:`MarkovNetwork` is used as is; a :class:`Domain` or mapping attribute -> size gives
    the network of the maximal measured cliques. Raises ``ValueError`` for no measurements,
    ``KeyError`` for a measurement over an attribute not in the domain and ``TypeError`` for
    arguments of the wrong type.
    """
    measurements = measurement_list(
        measurements, "no measurements: an estimator needs at least one measurement")
    if isinstance(network_or_domain, MarkovNetwork):
        network = network_or_domain
        check_attributes(measurements, network.domain)
    elif isinstance(network_or_domain, Mapping):
        domain = (network_or_domain if isinstance(network_or_domain, Domain)
                  else Domain(network_or_domain))
        check_attributes(measurements, domain)
        network = network_from_measurements(domain, measurements)
    else:
        raise TypeError("network_or_domain must be a MarkovNetwork, a Domain or a mapping "
                        f"attribute -> size; got {type(network_or_domain).__name__}")
    return network, measurements


class UnknownAttributeError(KeyError, ValueError):
    """A measurement names an attribute that is not in the domain (a ``KeyError`` as for
    domains, and a ``ValueError`` as for every other bad input of an estimator)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def check_attributes(measurements: Sequence[Any], domain: Domain) -> None:
    """Raise :class:`UnknownAttributeError` for a measurement over an attribute not in
    ``domain`` (items that are not measurements are left to the caller's checks)."""
    if isinstance(measurements, Measurement):
        measurements = [measurements]
    for k, m in enumerate(measurements):
        if not isinstance(m, Measurement):
            continue
        clique = (m.clique,) if isinstance(m.clique, str) else tuple(m.clique)
        unknown = [a for a in clique if a not in domain.attrs]
        if unknown:
            raise UnknownAttributeError(
                f"measurement {k} of {clique}: unknown attribute(s) {unknown}; the domain has "
                f"{list(domain.attrs)}")


def resolve_total(total_count: Any, measurements: Sequence[Measurement]) -> tuple[float, bool]:
    """``(N, estimated)``: ``total_count`` checked, or ``None`` estimated from the measurements
    (:func:`~numpyro_dpgm.measurements.estimate_total`, post-processing: no privacy cost)."""
    if total_count is None:
        try:
            return float(estimate_total(measurements)), True
        except ValueError:
            raise ValueError("cannot estimate the total: no measurement's query determines the "
                             "sum of its table; pass total_count") from None
    try:
        total = float(total_count)
    except (TypeError, ValueError):
        raise TypeError(f"total_count must be a number, got {total_count!r}") from None
    if not math.isfinite(total) or total <= 0:
        raise ValueError(f"total_count must be a positive finite number, got {total_count!r}")
    return total, False


def check_max_iters(max_iters: Any) -> int:
    """``max_iters`` as an int, or ``ValueError`` unless it is a positive integer."""
    if isinstance(max_iters, bool) or not isinstance(max_iters, int | np.integer) \
            or max_iters < 1:
        raise ValueError(f"max_iters must be a positive integer, got {max_iters!r}")
    return int(max_iters)


def resolve_init(init: Any, network: MarkovNetwork, named: Sequence[str] = ()) -> Any:
    """A contract ``init``: ``None`` or one of ``named`` as is, else θ in ``network``'s layout.

    A :class:`MarkovRandomField` must be over ``network``; an array must have the network's
    number of parameters. Raises ``ValueError`` otherwise.
    """
    if init is None:
        return None
    if isinstance(init, str):
        if init in named:
            return init
        choices = ", ".join(repr(n) for n in named) or "none"
        raise ValueError(f"unknown init {init!r}; named starts: {choices}; or pass a "
                         "MarkovRandomField or log-potentials θ")
    if isinstance(init, MarkovRandomField):
        if init.network != network:
            raise ValueError("init is a model over a different network")
        init = init.theta
    theta = jnp.asarray(init, dtype=jnp.result_type(float))
    if theta.shape != (network.num_params,):
        raise ValueError(f"init has shape {theta.shape}; the network needs "
                         f"({network.num_params},)")
    return theta


def stochastic_key(rng_key: Any, name: str) -> Any:
    """``rng_key`` of a stochastic estimator; a ``TypeError`` saying what to pass without it."""
    if rng_key is None:
        raise TypeError(f"{name}() is stochastic: pass rng_key=jax.random.key(seed)")
    return rng_key


def approx_budget(budget: Any, delta: Any, name: str,
                  default_delta: float | None = None) -> ApproxDP | None:
    """The ``(ε, δ)`` budget of a learner whose guarantee is approximate DP.

    ``budget`` is an :class:`~numpyro_dpgm.privacy.guarantees.ApproxDP`, a bare ``ε`` (then
    ``δ`` is ``delta``, else ``default_delta``), or ``None`` (a non-private run, no ``δ``
    needed). ``delta`` may not contradict the δ of an ``ApproxDP`` budget.
    """
    if budget is None:
        return None
    if isinstance(budget, ApproxDP):
        if delta is not None and float(delta) != budget.delta:
            raise ValueError(f"{name}(): delta={delta!r} contradicts budget={budget!r}; give δ "
                             "once, in budget=ApproxDP(epsilon, delta)")
        return budget
    if isinstance(budget, PureDP | ZCDP):
        raise TypeError(f"{name}() gives (ε, δ)-DP: pass budget=ApproxDP(epsilon, delta), not "
                        f"{type(budget).__name__}")
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise TypeError(f"{name}(): budget must be ApproxDP(epsilon, delta), a number ε or "
                        f"None; got {budget!r}")
    delta = default_delta if delta is None else delta
    if delta is None:
        raise ValueError(f"{name}() needs δ: pass budget=ApproxDP(epsilon, delta)")
    return ApproxDP(float(budget), float(delta))
