"""The ``nlbp`` effect handler: MAP of a CGM site given the observed sites downstream of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
from numpyro import handlers
from numpyro.primitives import Messenger

from ..distributions.cgm import CollectiveGraphicalModel
from ..distributions.noise import LaplaceNoise
from ..oracles.nlbp import NLBPResult, nlbp_map

__all__ = ["nlbp", "ModelEvidence", "split_static"]


class _ById:
    """Hashable by identity: lets an unhashable static argument through ``jit`` (retraces)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ById) and other.obj is self.obj


def split_static(tree: Any) -> tuple[tuple[Any, ...], Any, tuple[int, ...], tuple[Any, ...]]:
    """Split a pytree of model arguments into static (hashable) and array leaves.

    Returns ``(static_leaves, treedef, array_positions, arrays)``; arrays (numpy or JAX) become
    dynamic arguments of compiled functions, everything else is static.
    """
    leaves, treedef = jax.tree.flatten(tree)
    static, positions, arrays = [], [], []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, jax.Array | np.ndarray):
            positions.append(i)
            arrays.append(leaf)
            static.append(None)
        else:
            try:
                hash(leaf)
                static.append(leaf)
            except TypeError:
                static.append(_ById(leaf))
    return tuple(static), treedef, tuple(positions), tuple(arrays)


def join(static: tuple, treedef: Any, positions: tuple[int, ...], arrays: tuple) -> Any:
    leaves = [s.obj if isinstance(s, _ById) else s for s in static]
    for i, a in zip(positions, arrays, strict=True):
        leaves[i] = a
    return jax.tree.unflatten(treedef, leaves)


class ModelEvidence(NamedTuple):
    """``n ↦ log p(y | n, ...)``: the log density of a model's observed sites given the latent
    site ``latent = n``, every other upstream value substituted (hashable, for ``jit``).

    Called as ``evidence(n, arrays, values)``: ``arrays`` are the array leaves of the model's
    ``(args, kwargs)`` (see :func:`split_static`) and ``values`` the upstream site values.
    """

    model: Callable
    latent: str
    static: tuple
    treedef: Any
    positions: tuple[int, ...]
    smoothing: float | None

    def __call__(self, n: Any, arrays: tuple, values: dict) -> Any:
        args, kwargs = join(self.static, self.treedef, self.positions, arrays)
        data = dict(values)
        data[self.latent] = n
        with handlers.block(), handlers.trace() as tr, handlers.substitute(data=data):
            self.model(*args, **kwargs)
        total = 0.0
        seen_latent = False
        for name, site in tr.items():
            if site["type"] != "sample":
                continue
            if name == self.latent:
                seen_latent = True
                continue
            if not site["is_observed"]:
                if name in values:
                    continue
                raise ValueError(
                    f"site {name!r} is latent and comes after {self.latent!r}; the nlbp handler "
                    "needs every site downstream of the CGM site to be observed"
                )
            fn, value = site["fn"], site["value"]
            if self.smoothing and isinstance(fn, LaplaceNoise):
                lp = fn.smoothed_log_prob(value, self.smoothing)
            else:
                lp = fn.log_prob(value)
            if site.get("scale") is not None:
                lp = site["scale"] * lp
            total = total + lp.sum()
        if not seen_latent:  # pragma: no cover - guarded by the handler
            raise ValueError(f"the model has no sample site {self.latent!r}")
        return total


class nlbp(Messenger):
    """Replace a :class:`CollectiveGraphicalModel` site by its NLBP MAP given the data.

    When the model reaches the sample site ``latent``, the handler maximises the relaxed CGM
    posterior ``θ·n + H(n) + log p(y | n)`` (seed 002, Eq. 6) by non-linear belief propagation
    (Algorithm 1) and uses the maximiser as the site's value. ``log p(y | n)`` is the log
    density of every observed site after the CGM site, with ``n`` substituted; its gradient
    comes from autodiff, so Laplace, Gaussian and partial (linear-query) observations all work.

    Parameters
    ----------
    fn : callable, optional
        A NumPyro model.
    latent : str
        Name of the CGM sample site.
    space, damping, max_iters, tol :
        NLBP options (see :func:`numpyro_dpgm.oracles.nlbp.nlbp_map`).
    smoothing : float, optional
        Width (in counts) of a Huber smoothing of Laplace observation sites' kink.

    Attributes
    ----------
    results : dict
        The :class:`~numpyro_dpgm.oracles.nlbp.NLBPResult` of the last run (by site name).

    Examples
    --------
    >>> import jax, jax.numpy as jnp, numpyro
    >>> from numpyro import handlers
    >>> from numpyro_dpgm import MarkovNetwork
    >>> from numpyro_dpgm.distributions import CollectiveGraphicalModel, LaplaceNoise
    >>> numpyro.enable_x64()
    >>> net = MarkovNetwork({"a": 2, "b": 2}, [("a", "b")])
    >>> def model(y):
    ...     theta = numpyro.param("theta", jnp.zeros(net.num_params))
    ...     n = numpyro.sample("n", CollectiveGraphicalModel(net, theta, 40))
    ...     numpyro.sample("y", LaplaceNoise(n, 2.0), obs=y)
    >>> y = jnp.array([12.0, 9.0, 11.0, 8.0])
    >>> tr = handlers.trace(nlbp(model, latent="n", max_iters=500)).get_trace(y)
    >>> bool(abs(tr["n"]["value"].sum() - 40) < 1e-6)
    True
    """

    def __init__(
        self,
        fn: Callable | None = None,
        latent: str = "n",
        *,
        space: str = "natural",
        damping: Any = None,
        max_iters: int = 200,
        tol: float = 1e-8,
        smoothing: float | None = None,
        eta0: Any = None,
    ):
        if smoothing is not None and smoothing <= 0:
            raise ValueError(f"smoothing must be a positive width, got {smoothing}")
        self.latent = latent
        self.options = dict(space=space, damping=damping, max_iters=max_iters, tol=tol)
        self.smoothing = smoothing
        self.eta0 = eta0
        self.results: dict[str, NLBPResult] = {}
        self._call: tuple[tuple, dict] | None = None
        self._values: dict[str, Any] = {}
        super().__init__(fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._call = (args, kwargs)
        self._values = {}
        return super().__call__(*args, **kwargs)

    def process_message(self, msg: dict) -> None:
        if msg["type"] != "sample" or msg["name"] != self.latent:
            return
        fn = msg["fn"]
        if not isinstance(fn, CollectiveGraphicalModel):
            raise TypeError(
                f"site {self.latent!r} has distribution {type(fn).__name__}; the nlbp handler "
                "needs a CollectiveGraphicalModel"
            )
        if msg["is_observed"]:
            raise ValueError(f"site {self.latent!r} is observed; nothing to infer")
        if self._call is None:
            raise RuntimeError("use nlbp(model, ...) as a wrapped model, not as a bare context")
        if fn.batch_shape:
            raise ValueError("the nlbp handler supports one (unbatched) CGM site")
        static, treedef, positions, arrays = split_static(self._call)
        evidence = ModelEvidence(self.fn, self.latent, static, treedef, positions,
                                 self.smoothing)
        result = nlbp_map(fn.network, fn.theta, fn.total_count, evidence,
                          (arrays, dict(self._values)), eta0=self.eta0, **self.options)
        self.results[self.latent] = result
        msg["value"] = result.n
        msg["infer"] = dict(msg.get("infer") or {}, nlbp=result)

    def postprocess_message(self, msg: dict) -> None:
        if msg["type"] in ("param", "sample") and msg["name"] != self.latent:
            if msg.get("value") is not None:
                self._values[msg["name"]] = msg["value"]
