"""Marginal oracles for mirror descent: given log-potentials, the clique marginals and log Z.

Prox-PGM (seed 003, Algorithm 1, :mod:`numpyro_dpgm.estimation.prox_pgm`) needs one operation of
the model, the marginal oracle ``θ ↦ (μ(θ), A(θ))``; this module fixes what such an oracle is
(:class:`MarginalOracle`) and provides two:

* :class:`ExactOracle`: sum-product on the junction tree (stateless);
* :class:`ConvexGBPOracle`: Convex-GBP on a region graph (Algorithm 2, :mod:`.gbp`), whose
  messages are a warm-startable state; with it mirror descent is APPGM (Theorem 2).

:data:`ORACLES` selects them by name and :func:`resolve_oracle` turns a name, an oracle or a
factory into an oracle bound to a network.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from .._jit import device_array
from ..network import MarkovNetwork
from ..tables import project_table
from . import calibration
from . import junction_tree as jt
from ._region_layout import device_layout
from .factored import factored_plan
from .gbp import GBPState, checked_solve, init_state, validate_run_args
from .region_graph import RegionGraph, build_region_graph
from .triangulation import DEFAULT_METHOD, check_method

__all__ = [
    "ORACLES",
    "ConvexGBPOracle",
    "ExactOracle",
    "MarginalOracle",
    "apply_oracle",
    "oracle_operands",
    "resolve_oracle",
]

Array = Any


@runtime_checkable
class MarginalOracle(Protocol):
    """What Prox-PGM needs from a marginal oracle (seed 003, Algorithm 1 "Marginal-Oracle").

    An oracle is bound to a network and is hashable (it is static data of the jitted loop).

    Attributes
    ----------
    network : MarkovNetwork
        The cliques and parameter layout of ``theta`` and of the returned marginals.

    Methods
    -------
    init_state() -> pytree
        The oracle's initial state (``()`` for a stateless oracle; messages for Convex-GBP).
    __call__(theta, state) -> (mu, log_z, state)
        ``theta``: flat log-potentials in the network's layout. ``mu``: the (pseudo-)marginals
        of every network clique, flat in the same layout, each table summing to 1. ``log_z``:
        the log-partition function (or its approximation). ``state``: the state to warm-start
        the next call from. Pure and traceable under ``jit``.

    Optional: ``operands()`` and ``apply(operands, theta, state)`` (see
    :func:`oracle_operands`), and ``stateful_marginals = True`` for an oracle whose marginals
    depend on the state it starts from (mirror descent then takes every finite step).
    """

    network: MarkovNetwork

    def init_state(self) -> Any: ...

    def __call__(self, theta: Array, state: Any) -> tuple[Array, Array, Any]: ...


def _factored_call(network: MarkovNetwork, theta: Array, method: str) -> tuple[Array, Array]:
    """``(∇A(θ), A(θ))`` where the junction tree has a factored clique: the upward pass of
    :func:`~numpyro_dpgm.oracles.junction_tree.log_partition`, which contracts large
    triangulated cliques from their factors, and its reverse-mode gradient, the clique
    marginals in the network's layout (seed 002, §2). On Appendix C.4's 32 two-way marginals
    of Adult it cut the default fit from 40.5–232.8 s to 16.6–50.3 s a call (``python -m benchmarks
    converge --workloads c4``)."""
    log_z, mu = jax.value_and_grad(lambda t: jt.log_partition(network, t, method))(theta)
    return mu, log_z


def _calibrated_call(network: MarkovNetwork, theta: Array, method: str) -> tuple[Array, Array]:
    """``(μ(θ), A(θ))`` from the log-space calibration of the whole tree, each network clique's
    marginal projected from the tree clique that holds it."""
    tree = jt.build_junction_tree(network, method)
    cal = calibration.calibrate(tree, calibration.clique_log_potentials(tree, network, theta))
    parts = []
    for c in network.cliques:
        i = tree.containing(c)
        logp = cal.log_beliefs[i] - cal.log_z
        parts.append(jnp.ravel(jnp.exp(project_table(logp, tree.cliques[i], c, log=True))))
    mu = jnp.concatenate(parts) if parts else jnp.zeros(0, dtype=jnp.result_type(theta))
    return mu, cal.log_z


@dataclasses.dataclass(frozen=True)
class ExactOracle:
    """Exact marginals and log Z on the junction tree (stateless): by log-space calibration,
    or, where triangulation made a clique large enough to be factored, by the upward pass that
    contracts it from its factors and its gradient ``μ = ∇A(θ)``.

    Parameters
    ----------
    network : MarkovNetwork
    method : {"auto", "min_fill", "min_size"}
        Triangulation heuristic of the junction tree; the default, ``"auto"``, keeps the
        tree with fewer cells of the two (:func:`~numpyro_dpgm.oracles.build_junction_tree`).
    """

    network: MarkovNetwork
    method: str = DEFAULT_METHOD

    def __post_init__(self) -> None:
        if not isinstance(self.network, MarkovNetwork):
            raise TypeError(f"network must be a MarkovNetwork, got {type(self.network).__name__}")
        check_method(self.method)

    def init_state(self) -> tuple[()]:
        return ()

    def __call__(self, theta: Array, state: Any) -> tuple[Array, Array, Any]:
        factored = any(factored_plan(self.network, self.method).factored)
        call = _factored_call if factored else _calibrated_call
        mu, log_z = call(self.network, theta, self.method)
        return mu, log_z, state

    def host_start(self, theta: Array) -> tuple[Array, Array] | None:
        """``(μ, log Z)`` at a concrete ``theta``, as the call gives them, from the calibrated
        tree's program (:func:`~numpyro_dpgm.oracles.junction_tree.host_calibration`),
        which the queries of the fitted model share; ``None`` where the tree has a factored
        clique. A fit starts here rather than compiling the oracle a second time."""
        cal = jt.host_calibration(self.network, theta, self.method)
        if cal is None:
            return None
        tree = jt.build_junction_tree(self.network, self.method)
        parts = [np.zeros(0, cal.log_z.dtype)]
        for c in self.network.cliques:
            i = tree.containing(c)
            parts.append(np.ravel(project_table(cal.marginals[i], tree.cliques[i], c)))
        return device_array(np.concatenate(parts)), device_array(cal.log_z)


@dataclasses.dataclass(frozen=True)
class ConvexGBPOracle:
    """Approximate marginal oracle for Prox-PGM (APPGM: seed 003, Algorithm 1 with Algorithm 2).

    ``oracle(theta, state) -> (mu, log_z, state)``: ``theta`` is a flat log-potential vector in
    the network's layout; ``mu`` the pseudo-marginals of every network clique, flat in the same
    layout, each table summing to 1 (``network.unflatten(mu)`` gives them as
    :class:`CliqueTables`); ``log_z`` the estimate :func:`log_partition`; ``state`` the messages
    to warm-start the next call with. Pure and ``jit``-able; the oracle is hashable, so it can be
    static data of a jitted loop. By Theorem 2 of seed 003, mirror descent with this oracle
    solves the relaxed problem over the local polytope (Problem 2).

    Parameters
    ----------
    network : MarkovNetwork
    kind : {"saturated", "factor"}
    counting : "convex", "kikuchi", or explicit numbers (see :func:`build_region_graph`)
    iters : int
        Sweeps per call; 1 with warm-started messages is seed 003's practice (§6).
    damping : float
        Message damping (0.5 by default, as in the reference implementation).
    schedule : {"parallel", "sequential"}
        See :func:`convex_gbp`.
    minimal : bool
        Prune redundant edges of the saturated graph.
    """

    #: The marginals returned depend on the messages the call starts from, not on ``θ`` alone
    #: (``iters`` sweeps from them): mirror descent takes every finite step, so that the
    #: messages keep advancing, and uses its line search only to adapt the step size.
    stateful_marginals: ClassVar[bool] = True

    network: MarkovNetwork
    kind: str = "saturated"
    counting: Any = "convex"
    iters: int = 1
    damping: float = 0.5
    schedule: str = "parallel"
    minimal: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.network, MarkovNetwork):
            raise TypeError(f"network must be a MarkovNetwork, got {type(self.network).__name__}")
        validate_run_args(self.iters, self.damping, self.schedule)
        # build now, so construction errors surface here; explicit numbers become hashable
        rg = build_region_graph(self.network, self.kind, self.counting, self.minimal)
        if not isinstance(self.counting, str):
            object.__setattr__(self, "counting", rg.kappa)

    @property
    def region_graph(self) -> RegionGraph:
        """The (cached) region graph the oracle passes messages on."""
        return build_region_graph(self.network, self.kind, self.counting, self.minimal)

    def init_state(self) -> GBPState:
        """Algorithm 2's zero messages."""
        return init_state(self.region_graph)

    def operands(self) -> Any:
        """The region graph's index arrays (a pytree of device arrays, built once and cached).

        A compiled loop takes them as arguments and hands them back to :meth:`apply`, so that
        they are data of the program, not constants compiled into it.
        """
        return device_layout(self.region_graph)

    def apply(
        self, operands: Any, theta: Array, state: GBPState | None = None
    ) -> tuple[Array, Array, GBPState]:
        """:meth:`__call__` with the index arrays ``operands`` (:meth:`operands`) given."""
        out = checked_solve(self.region_graph, jnp.asarray(theta), state, self.iters,
                            self.damping, 1.0, self.schedule, None, layout=operands)
        return out.cliques, out.log_z, out.state

    def __call__(
        self, theta: Array, state: GBPState | None = None
    ) -> tuple[Array, Array, GBPState]:
        """One oracle call: ``iters`` warm-started sweeps from ``state`` (zero messages if None)."""
        return self.apply(None, theta, state)


def oracle_operands(oracle: MarginalOracle) -> Any:
    """The arrays an oracle computes with, to be passed into a compiled loop (``()`` if none).

    An oracle may split itself into static structure (the hashable oracle) and array operands:
    ``oracle.operands()`` returns them and ``oracle.apply(operands, theta, state)`` is
    ``oracle(theta, state)`` computed with them. A loop compiled with the oracle static passes
    the operands as arguments, so they are not compiled into the program as constants (for
    Convex-GBP: the region graph's index tables, tens of megabytes at 10³ regions).

    Parameters
    ----------
    oracle : MarginalOracle

    Returns
    -------
    pytree
        ``oracle.operands()``, or ``()`` for an oracle without that method.
    """
    get = getattr(oracle, "operands", None)
    return () if get is None else get()


def apply_oracle(
    oracle: MarginalOracle, operands: Any, theta: Array, state: Any
) -> tuple[Array, Array, Any]:
    """``oracle(theta, state)`` computed with ``operands`` (from :func:`oracle_operands`)."""
    apply = getattr(oracle, "apply", None)
    return oracle(theta, state) if apply is None else apply(operands, theta, state)


#: Oracles selectable by name, ``name -> factory(network) -> MarginalOracle``: ``"exact"``
#: (junction tree) and ``"convex_gbp"`` (Convex-GBP on the saturated region graph with counting
#: numbers 1, one warm-started sweep per step: APPGM, seed 003 §4).
ORACLES: dict[str, Callable[[MarkovNetwork], MarginalOracle]] = {
    "exact": ExactOracle,
    "convex_gbp": ConvexGBPOracle,
}


def resolve_oracle(
    oracle: str | MarginalOracle | Callable[[MarkovNetwork], MarginalOracle],
    network: MarkovNetwork,
) -> MarginalOracle:
    """The oracle bound to ``network`` that ``oracle`` names, is, or builds.

    Parameters
    ----------
    oracle : str, MarginalOracle or callable network -> MarginalOracle
        A name of :data:`ORACLES`, an oracle, or a factory called with ``network``.
    network : MarkovNetwork
        The network the oracle must be bound to.

    Returns
    -------
    MarginalOracle
        A hashable oracle whose ``network`` equals ``network``.

    Raises
    ------
    ValueError
        An unknown name, or an oracle bound to another network.
    TypeError
        Not a name, oracle or factory; a factory that returns no oracle; an unhashable oracle.
    """
    if isinstance(oracle, str):
        if oracle not in ORACLES:
            raise ValueError(f"unknown oracle {oracle!r}; available: {sorted(ORACLES)}")
        built = ORACLES[oracle](network)
    elif isinstance(oracle, MarginalOracle):
        built = oracle
    elif callable(oracle):
        built = oracle(network)
    else:
        raise TypeError(
            "oracle must be a name, a MarginalOracle or a factory network -> MarginalOracle; "
            f"got {type(oracle).__name__}"
        )
    if not isinstance(built, MarginalOracle):
        raise TypeError(f"the oracle factory returned {type(built).__name__}, not a MarginalOracle")
    if built.network != network:
        raise ValueError(
            f"the oracle is bound to {built.network!r}, but the model's network is {network!r}"
        )
    try:
        hash(built)
    except TypeError:
        raise TypeError(
            "the oracle must be hashable (it is static data of a jitted loop)"
        ) from None
    return built
