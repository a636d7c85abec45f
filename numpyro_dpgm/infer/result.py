"""The one return type of the point estimates (the estimators from measurements, the learners
from records, the mechanisms' fits and :class:`~numpyro_dpgm.infer.em.EM` on a model of your
own), and the queries it answers."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple

from ..distributions.mrf import MarkovRandomField
from ..domain import Clique
from ..network import MarkovNetwork

__all__ = ["Result", "answer_queries", "total_extras"]

Array = Any


class Result(NamedTuple):
    """What every point estimate returns: the estimators, the learners, ``EM.run``.

    Attributes
    ----------
    model : MarkovRandomField
        The fitted model; ``model.theta`` holds the log-potentials in the network's layout.
    loss_trace : array
        The method's objective (to be minimised), as documented by each method: an estimator's
        at its start and after every iteration (``iterations + 1`` values); ``EM.run``'s
        E-step objective of every iteration.
    iterations : int
        Number of iterations run.
    converged : bool
        Whether the method's stopping criterion was met before its iteration limit.
    elapsed : float
        Wall-clock seconds of the call, compilation included.
    extras : dict
        Method-specific information (the regularisation used, final gradient norm, ...), as
        documented by each estimator. Treat it as read-only.
    """

    model: MarkovRandomField
    loss_trace: Any
    iterations: int
    converged: bool
    elapsed: float
    extras: dict

    @property
    def theta(self) -> Any:
        """Log-potentials of the fitted model (``model.theta``)."""
        return self.model.theta

    @property
    def params(self) -> dict:
        """The fitted values of the model's ``numpyro.param`` sites: ``extras["params"]`` of
        ``EM.run`` on a model of your own, ``{"theta": theta}`` for the estimators."""
        return self.extras.get("params", {"theta": self.model.theta})

    @property
    def network(self) -> MarkovNetwork:
        """The fitted model's network."""
        return self.model.network


def total_extras(total: float, estimated: bool) -> dict[str, Any]:
    """The ``extras`` entries every result records about ``N``: its value and whether it was
    estimated from the release (``answer_queries`` answers in counts of it)."""
    return {"total_count": float(total), "total_count_estimated": bool(estimated)}


def answer_queries(
    model: MarkovRandomField | Result,
    queries: Iterable[Iterable[str] | str],
    total: float | None = None,
) -> dict[Clique, Array]:
    """Marginals of attribute sets, in or out of the model (seed 003, Problem 4; exact).

    In-model sets are projected from a junction-tree clique; for an out-of-model set the model
    is augmented with a zero potential on it (which leaves ``p_θ`` unchanged) and the marginal is
    read off the calibrated junction tree of the augmented model (Appendix B). With an exact
    oracle this is the marginal of the fitted maximum-entropy distribution.

    Parameters
    ----------
    model : MarkovRandomField or Result
        A fitted model (a :class:`Result` supplies its model and, by default, its total).
    queries : iterable of attribute tuples
        Each query's table has one axis per attribute, in the order given.
    total : float, optional
        Scale of the answers: 1 gives probabilities; default the fit's total for a
        :class:`Result`, else 1.

    Returns
    -------
    dict
        ``query -> table`` (count scale when ``total`` is the record count).
    """
    if isinstance(model, Result):
        if total is None:
            total = model.extras.get("total_count", 1.0)
        model = model.model
    if not isinstance(model, MarkovRandomField):
        raise TypeError(
            f"model must be a MarkovRandomField or a Result, got {type(model).__name__}"
        )
    total = 1.0 if total is None else float(total)
    if not math.isfinite(total) or total <= 0:
        raise ValueError(f"total must be a positive finite number, got {total}")
    if isinstance(queries, str):
        queries = [queries]
    out: dict[Clique, Array] = {}
    for q in queries:
        clique = model.network.domain.check_clique(q)
        out[clique] = total * model.marginal(clique)
    return out
