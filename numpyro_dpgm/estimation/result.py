"""The common return type of the estimators."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..distributions.mrf import MarkovRandomField
from ..network import MarkovNetwork

__all__ = ["Result"]


class Result(NamedTuple):
    """What every estimation function returns.

    Attributes
    ----------
    model : MarkovRandomField
        The fitted model; ``model.theta`` holds the log-potentials in the network's layout.
    loss_trace : array, shape ``(iterations + 1,)``
        The method's objective (to be minimised) at the initial point and after every
        iteration; its meaning is documented by each estimator.
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
    def network(self) -> MarkovNetwork:
        """The fitted model's network."""
        return self.model.network
