"""The "generate" step of select–measure–generate: a warm-started Prox-PGM refit per round.

Each round adds a measurement, and the model is refitted by
:func:`~numpyro_dpgm.estimation.prox_pgm` over all measurements so far, started from the
previous round's potentials (embedded into the new network with
:func:`~numpyro_dpgm.metrics.embed_theta`; zero potentials on new cliques). The network holds
every measured clique (in the order first measured), so a round that measures a clique again
keeps the network.

Prox-PGM compiles one program per network and set of loss terms. Repeated Gaussian
measurements of one clique are therefore merged for the fit into their inverse-variance
weighted mean, ``ȳ = Σ y_i/σ_i² / Σ 1/σ_i²`` with ``σ̄⁻² = Σ σ_i⁻²``: the L2 loss differs by a
constant only (``Σ ‖μ − y_i‖²/2σ_i² = ‖μ − ȳ‖²/2σ̄² + c``), so the fit is the same, and a
round that re-measures a clique changes data, not structure, and compiles nothing. A round
that adds a clique changes the structure and compiles once. :class:`Refit` records, for every
fit, its seconds, its iterations, and the seconds JAX spent compiling (read from
``jax.monitoring``'s compile events).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax.monitoring
import numpy as np

from .._jit import check_compile_mode
from .._warnings import SparseTableWarning, warn
from ..distributions.mrf import MarkovRandomField
from ..domain import Clique, Domain
from ..estimation import prox_pgm
from ..estimation.prox_pgm import ProxPGMConvergenceWarning
from ..infer.result import Result
from ..measurements import Gaussian, Measurement
from ..metrics import embed_theta
from ..network import MarkovNetwork

__all__ = ["Refit", "compile_seconds", "merge_measurements"]

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_TRACE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                 "/jax/core/compile/jaxpr_to_mlir_module_duration")


@contextlib.contextmanager
def compile_seconds() -> Iterator[dict[str, float]]:
    """Count JAX's compilations inside the block: ``{"compiles", "seconds"}`` (tracing,
    lowering and backend compilation together)."""
    seen = {"compiles": 0, "seconds": 0.0}

    def listen(event: str, duration: float, **_: Any) -> None:
        if event == _COMPILE_EVENT:
            seen["compiles"] += 1
            seen["seconds"] += duration
        elif event in _TRACE_EVENTS:
            seen["seconds"] += duration

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def merge_measurements(measurements: Sequence[Measurement]) -> list[Measurement]:
    """Identity-query Gaussian measurements of the same clique merged into one (module notes);
    the others as they are. Order: each clique where it first appears."""
    groups: dict[tuple, list[Measurement]] = {}
    order: list[Any] = []
    for k, m in enumerate(measurements):
        key = tuple(m.clique) if m.query is None and isinstance(m.noise, Gaussian) else k
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(m)
    out = []
    for key in order:
        ms = groups[key]
        if len(ms) == 1:
            out.append(ms[0])
            continue
        w = np.array([1.0 / m.noise.sigma ** 2 for m in ms])
        values = np.sum([wi * m.values for wi, m in zip(w, ms, strict=True)], axis=0) / w.sum()
        out.append(Measurement(ms[0].clique, values, Gaussian(float(1.0 / np.sqrt(w.sum())))))
    return out


class Refit:
    """Warm-started Prox-PGM refits over a growing list of measurements, with their costs.

    Parameters
    ----------
    domain : Domain
    iters : int
        Prox-PGM's ``max_iters`` per fit.
    oracle : str or oracle factory
        Prox-PGM's marginal oracle.
    total_count : float, optional
        ``N`` when public; ``None`` estimates it from the measurements.
    stop : {"optimum", "auto", "risk", "discrepancy"}
        Prox-PGM's stopping rule (only ``"optimum"`` starts from the previous potentials; the
        others follow the path from the uniform distribution, ``"auto"`` where it applies).
    compile_mode : {"quick", "optimized"}
        How XLA compiles each refit's loop (default ``"quick"``: no backend optimisation
        passes; see :func:`~numpyro_dpgm.prox_pgm`). Every new clique is a new program that
        then runs briefly, so compiling dominates: on Adult at ε = 1, AIM's 32 refits spent
        138 of their 180 s compiling, against 336 of 361 s with ``"optimized"`` (one run
        each, summed from ``extras["costs"]``; docs/mechanisms.md). Take ``"optimized"`` for
        models whose fits run long (large cliques, many iterations).

    Attributes
    ----------
    model : MarkovRandomField or None
        The latest fit's model.
    fit : Result or None
        The latest Prox-PGM result.
    costs : list of dict
        Per fit: ``seconds``, ``compile_seconds``, ``compiles`` (JAX compilations, small ones
        included), ``iterations``, ``cliques``, ``new_structure`` (whether the network or the
        loss terms differ from the previous fit's, which makes Prox-PGM compile its program).
    """

    def __init__(self, domain: Domain, iters: int, oracle: str | Callable = "exact",
                 total_count: float | None = None, stop: str = "optimum",
                 compile_mode: str = "quick"):
        self.domain, self.iters, self.oracle, self.total_count = domain, iters, oracle, total_count
        self.stop, self.compile_mode = stop, check_compile_mode(compile_mode)
        self.model: MarkovRandomField | None = None
        self.fit: Result | None = None
        self.costs: list[dict[str, Any]] = []
        self._structure: Any = None

    @property
    def total(self) -> float:
        """``N`` of the latest fit (the given total, or its estimate)."""
        assert self.fit is not None
        return float(self.fit.extras["total_count"])

    def __call__(self, measurements: Sequence[Measurement], cliques: Sequence[Clique],
                 iters: int | None = None, stop: str | None = None) -> MarkovRandomField:
        """Refit on ``measurements`` over the network of ``cliques`` (a superset of the
        previous fit's cliques), warm-started from the previous potentials when the stopping
        rule (``stop``, default the Refit's) is ``"optimum"``."""
        network = MarkovNetwork(self.domain, list(cliques))
        stop = self.stop if stop is None else stop
        init = None
        if self.model is not None and stop == "optimum":
            init = embed_theta(self.model.network, self.model.theta, network)
        merged = merge_measurements(measurements)
        structure = (network, tuple((tuple(m.clique), m.query is None) for m in merged))
        start = time.perf_counter()
        with compile_seconds() as compiled, warnings.catch_warnings():
            # a round's refit is warm-started by the next; the run's last fit says whether it
            # converged (Result.converged, and a warning from :meth:`result`)
            warnings.simplefilter("ignore", ProxPGMConvergenceWarning)
            # the mechanism chose the cliques under its own size rule: no advice to coarsen
            warnings.simplefilter("ignore", SparseTableWarning)
            fit = prox_pgm(merged, network,
                           total_count=self.total_count, max_iters=iters or self.iters,
                           oracle=self.oracle, init=init, stop=stop,
                           compile_mode=self.compile_mode)
        self.costs.append({"seconds": time.perf_counter() - start,
                           "compile_seconds": compiled["seconds"],
                           "compiles": compiled["compiles"], "iterations": fit.iterations,
                           "converged": fit.converged,
                           "cliques": len(network.cliques),
                           "new_structure": structure != self._structure})
        self.fit, self.model, self._structure = fit, fit.model, structure
        return fit.model

    def result(self, model: MarkovRandomField, start: float, extras: dict) -> Result:
        """A mechanism's Result: ``model``, the last fit's loss trace, iterations and
        convergence, the seconds since ``start``, and ``extras`` with the fit, ``N`` and the
        per-fit ``costs``."""
        assert self.fit is not None
        fit = self.fit
        if not fit.converged:
            warn(f"the mechanism's last Prox-PGM fit stopped at its limit of {fit.iterations} "
                 "iterations before converging; pass a larger iters= (or refine the model with "
                 "prox_pgm(result.extras['measurements'], ..., init=result.model))",
                 ProxPGMConvergenceWarning)
        extras = {**extras, "fit": fit, "total": self.total, "costs": tuple(self.costs)}
        return Result(model=model, loss_trace=fit.loss_trace, iterations=fit.iterations,
                      converged=fit.converged, elapsed=time.perf_counter() - start,
                      extras=extras)
