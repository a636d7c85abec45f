"""The ``relax`` effect handler: every exact CGM site of a model on its relaxed density.

A model written with exact :class:`~numpyro_dpgm.distributions.CollectiveGraphicalModel`
sites (integer tables) cannot be fitted by gradient methods (SVI, plain NUTS). Under
:class:`relax` each such site draws real tables from the relaxed CGM on the scaled marginal
polytope instead (``relaxed=True``, the ``lgamma`` density: the exact pmf with ``n!`` replaced
by ``Γ(n+1)``), so the same model runs in :func:`~.svi.run_svi`. The relaxation moves mass into
cells that expect few records (:func:`~numpyro_dpgm.distributions.relaxation.relaxation_leak`);
the exact path of :func:`~.nuts.run_nuts` does not.

>>> import jax, numpyro, numpyro.distributions as dist
>>> from numpyro import handlers
>>> from numpyro_dpgm import MarkovNetwork
>>> from numpyro_dpgm.distributions import CollectiveGraphicalModel
>>> numpyro.enable_x64()
>>> net = MarkovNetwork({"a": 2}, [("a",)])
>>> def model():
...     numpyro.sample("n", CollectiveGraphicalModel(net, jax.numpy.zeros(2), 10))
>>> site = handlers.trace(handlers.seed(relax(model), 0)).get_trace()["n"]
>>> site["fn"].relaxed
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpyro.distributions as dist
from numpyro.primitives import Messenger

from ...distributions.cgm import CollectiveGraphicalModel
from .count_sites import CountSiteError

__all__ = ["relax"]


def _relaxed(fn: Any, name: str) -> Any:
    """``fn`` with its exact CGM replaced by the relaxed one (through ``expand`` wrappers)."""
    if isinstance(fn, CollectiveGraphicalModel):
        if fn.relaxed:
            return fn
        return CollectiveGraphicalModel(fn.network, fn.theta, fn.total_count, relaxed=True,
                                        normalized=fn.normalized)
    if isinstance(fn, dist.ExpandedDistribution):
        return _relaxed(fn.base_dist, name).expand(fn.batch_shape)
    raise CountSiteError(f"site {name!r}: relax handles a CollectiveGraphicalModel, or one "
                         f"expanded by a plate, not {type(fn).__name__}")


def _has_cgm(fn: Any) -> bool:
    while isinstance(fn, dist.ExpandedDistribution | dist.Independent):
        fn = fn.base_dist
    return isinstance(fn, CollectiveGraphicalModel)


class relax(Messenger):
    """Run ``fn`` with every latent CGM site on the relaxed (``lgamma``) density.

    Parameters
    ----------
    fn : callable, optional
        A NumPyro model (or use ``relax()`` as a context manager).
    """

    def __init__(self, fn: Callable | None = None):
        super().__init__(fn)

    def process_message(self, msg: dict) -> None:
        if msg["type"] == "sample" and not msg["is_observed"] and _has_cgm(msg["fn"]):
            msg["fn"] = _relaxed(msg["fn"], msg["name"])
