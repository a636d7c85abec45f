"""EM over a NumPyro model with a collective-graphical-model site (seed 002, Algorithm 2)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from numpyro import handlers
from numpyro.distributions import biject_to, constraints

from .._cache import LRUCache
from ..distributions.cgm import CollectiveGraphicalModel
from ..distributions.mrf import MarkovRandomField
from ..inference import junction_tree as jt
from ..inference.nlbp import ScaledDamping, check_halvings, resolve_damping
from .estep import estep_engine
from .handlers import _join, nlbp, split_static
from .mstep import m_step

__all__ = ["EM", "EMResult"]

#: Most compiled general M-steps kept (by model and argument structure; least recently used
#: evicted first).
MAX_M_STEPS = 16
_M_STEPS: LRUCache = LRUCache(MAX_M_STEPS)


class EMResult(NamedTuple):
    """Output of :meth:`EM.run`.

    Attributes
    ----------
    params : dict
        Final values of the model's ``numpyro.param`` sites.
    n : array
        The last E-step's estimate of the latent count tables.
    model : MarkovRandomField
        The record-level model at the final parameters.
    iterations : int
    converged : bool
    marginal_change : list of float
        ``max_C ‖μ_C(θ_{t+1}) − μ_C(θ_t)‖₁`` per iteration.
    estep_objective : list of float
        NLBP's ``F(n̂)`` per iteration.
    elapsed : float
    damping_halvings : int
        How often a stalled E-step was retried with half the damping.
    """

    params: dict
    n: Any
    model: MarkovRandomField
    iterations: int
    converged: bool
    marginal_change: list
    estep_objective: list
    elapsed: float
    damping_halvings: int = 0


class EM:
    """Expectation-maximisation for a NumPyro model whose latent site is a CGM.

    E-step (``estep="nlbp"``, default): the :class:`~numpyro_dpgm.infer.handlers.nlbp` handler
    replaces the latent site by the approximate MAP of ``p(n | y; θ_t)``. ``estep="variational"``
    puts the mean ``E_q[n]`` of a guide fitted by SVI there instead
    (:class:`~numpyro_dpgm.infer.estep.VariationalEStep`), ``estep="mcmc"`` the
    mean of NUTS draws of ``n`` given ``θ_t`` (Monte-Carlo EM,
    :class:`~numpyro_dpgm.infer.estep.MCMCEStep`); both need a relaxed CGM site and run
    with the params fixed, warm-started from the previous E-step. ``estep="exact"`` puts the
    mean of exact record-swap draws of the integer tables there
    (:class:`~numpyro_dpgm.infer.estep.ExactEStep`; the model must be a
    :func:`~numpyro_dpgm.estimation.variational_em.latent_counts_model`). M-step: maximise the
    complete-data log-likelihood
    ``θ·n̂ − N·A(θ)`` (plus the observed sites' log densities) over the ``numpyro.param`` sites.
    When the CGM's ``theta`` is itself a param site, the maximiser is moment matching: NLBP's
    ``η̂`` in natural space (no optimisation), or :func:`~numpyro_dpgm.infer.mstep.m_step`
    on the mean of the other E-steps; otherwise (e.g. tied parameters,
    ``theta = f(params)``) L-BFGS from ``optax`` solves it in the params' unconstrained space.

    Parameters
    ----------
    model : callable
        A NumPyro model with a :class:`CollectiveGraphicalModel` sample site ``latent`` and
        observed sites downstream of it.
    latent : str
    max_iters : int
        EM iterations (a regulariser for MAP-EM; see :func:`numpyro_dpgm.estimation.cgm_em`).
    inner_iters : int
        NLBP iterations per E-step.
    tol : float
        Stop when the model's marginals change by less than ``tol`` (L1, per clique); the run
        counts as converged only if that last E-step converged as well.
    space, damping, smoothing :
        NLBP options.
    max_halvings : int
        With the NLBP E-step in natural space and the free M-step: an E-step that finds nothing
        better than its start is retried with the damping halved, at most this many times in a
        run, and the halved damping is kept (as in :func:`~numpyro_dpgm.estimation.cgm_em`).
    lbfgs_iters : int
        Iterations of the general M-step.
    m_step_prox : float
        Weight of the proximal term ``½·prox·‖u − u_t‖²`` added to the general M-step's
        objective (``u``: the params' unconstrained values, ``u_t`` the current ones). It
        leaves EM's fixed points unchanged (the term and its gradient vanish at ``u = u_t``) and
        pins the directions along which ``Q`` is flat, such as the gauge of over-complete
        log-potentials, where L-BFGS otherwise drifts: without it, variational EM on a 10-node
        ER graph (``N = 10³``) moved ``θ`` to ±10⁶ along the gauge within three iterations,
        until the log-partition function lost its precision.
    estep : {"nlbp", "variational", "mcmc", "exact"}
        The E-step (see above).
    estep_options : dict, optional
        Options of the variational or Monte-Carlo E-step (keyword arguments of
        ``VariationalEStep`` / ``MCMCEStep`` / ``ExactEStep``).

    Examples
    --------
    >>> import jax, jax.numpy as jnp, numpyro
    >>> from numpyro_dpgm import MarkovNetwork
    >>> from numpyro_dpgm.distributions import CollectiveGraphicalModel, LaplaceNoise
    >>> numpyro.enable_x64()
    >>> net = MarkovNetwork({"a": 2, "b": 2}, [("a", "b")])
    >>> def model(y, N, scale):
    ...     theta = numpyro.param("theta", jnp.zeros(net.num_params))
    ...     n = numpyro.sample("n", CollectiveGraphicalModel(net, theta, total_count=N))
    ...     numpyro.sample("y", LaplaceNoise(n, scale), obs=y)
    >>> y = jnp.array([30.0, 5.0, 8.0, 57.0])
    >>> fit = EM(model, latent="n", max_iters=5).run(jax.random.key(0), y, 100, 2.0)
    >>> [round(float(p), 2) for p in fit.model.marginal(("a",))]
    [0.35, 0.65]
    """

    def __init__(
        self,
        model: Callable,
        latent: str = "n",
        *,
        max_iters: int = 10,
        inner_iters: int = 50,
        tol: float = 1e-6,
        space: str = "natural",
        damping: Any = None,
        smoothing: float | None = None,
        lbfgs_iters: int = 200,
        m_step_prox: float = 1e-6,
        estep: str = "nlbp",
        estep_options: dict | None = None,
        max_halvings: int = 20,
    ):
        if max_iters < 1 or inner_iters < 1:
            raise ValueError("max_iters and inner_iters must be at least 1")
        if estep not in ("nlbp", "variational", "mcmc", "exact"):
            raise ValueError("estep must be 'nlbp', 'variational', 'mcmc' or 'exact', got "
                             f"{estep!r}")
        self.estep = estep
        self.estep_options = dict(estep_options or {})
        self._engine: Any = None
        self.model = model
        self.latent = latent
        self.max_iters = max_iters
        self.tol = tol
        self.lbfgs_iters = lbfgs_iters
        if not m_step_prox >= 0:
            raise ValueError(f"m_step_prox must be non-negative, got {m_step_prox}")
        self.m_step_prox = float(m_step_prox)
        self.nlbp_options = dict(space=space, damping=damping, max_iters=inner_iters,
                                 smoothing=smoothing)
        self.max_halvings = check_halvings(max_halvings)

    # -- E-step ----------------------------------------------------------------------------------
    def _feasible_trace(self, key: Any, params: dict, args: tuple, kwargs: dict) -> Any:
        """A trace of the model with the params as given (their initial values where absent)
        and the latent site at a feasible point: cheap, and runs no E-step."""
        latent = self.latent

        def value(site: dict) -> Any:
            if site["name"] == latent:
                return site["fn"].support.feasible_like(jnp.zeros(site["fn"].shape()))
            return params.get(site["name"])

        wrapped = handlers.substitute(handlers.seed(self.model, key), substitute_fn=value)
        tr = handlers.trace(wrapped).get_trace(*args, **kwargs)
        if latent not in tr:
            raise ValueError(f"the model has no sample site {latent!r}")
        return tr

    def _check_observations(self, key: Any, params: dict, args: tuple, kwargs: dict) -> None:
        """Refuse observed values that would give a quiet wrong answer: NaN or infinite entries
        (NLBP would return the uniform model) and shapes that do not broadcast against their
        distribution. The model is traced once with the latent site at a feasible point."""
        tr = self._feasible_trace(key, params, args, kwargs)
        for name, site in tr.items():
            if site["type"] != "sample" or not site["is_observed"]:
                continue
            obs = np.asarray(site["value"])
            expected = tuple(site["fn"].shape())
            try:
                np.broadcast_shapes(obs.shape, expected)
            except ValueError:
                raise ValueError(f"observed site {name!r} has shape {obs.shape}; its "
                                 f"distribution has shape {expected}") from None
            if np.issubdtype(obs.dtype, np.number) and not np.all(np.isfinite(obs)):
                bad = np.argwhere(~np.isfinite(obs))
                raise ValueError(
                    f"observed site {name!r} has {len(bad)} NaN or infinite value(s), the first "
                    f"at index {tuple(int(i) for i in bad[0])}; drop or re-release those "
                    "entries before fitting")

    def _e_step(self, key: Any, params: dict, args: tuple, kwargs: dict,
                options: dict | None = None) -> tuple[Any, Any]:
        if self.estep != "nlbp":
            return self._mean_e_step(key, params, args, kwargs)
        handler = nlbp(self.model, latent=self.latent, **(options or self.nlbp_options))
        wrapped = handlers.substitute(handlers.seed(handler, key), data=params)
        tr = handlers.trace(wrapped).get_trace(*args, **kwargs)
        if self.latent not in tr:
            raise ValueError(f"the model has no sample site {self.latent!r}")
        return tr, handler.results[self.latent]

    def _mean_e_step(self, key: Any, params: dict, args: tuple,
                     kwargs: dict) -> tuple[Any, Any]:
        """Variational or Monte-Carlo E-step: the latent site's value becomes ``E[n]``."""
        tr = self._feasible_trace(key, params, args, kwargs)
        if not getattr(tr[self.latent]["fn"], "relaxed", False):
            raise ValueError(f"estep={self.estep!r} needs a relaxed CGM site "
                             "(CollectiveGraphicalModel(..., relaxed=True))")
        if self._engine is None:
            self._engine = estep_engine(self.estep, self.model, self.latent, self.estep_options,
                                        support=tr[self.latent]["fn"].support)
        full = {k: s["value"] for k, s in tr.items() if s["type"] == "param"}
        res = self._engine(key, full, args, kwargs)
        tr[self.latent]["value"] = res.n
        return tr, res

    # -- M-step ----------------------------------------------------------------------------------
    def _theta_param(self, tr: Any) -> str | None:
        theta = tr[self.latent]["fn"].theta
        for name, site in tr.items():
            if site["type"] == "param" and site["value"] is theta:
                return name
        return None

    def _cached_m_step(self, key: Any, tr: Any, args: tuple, kwargs: dict) -> Callable:
        """:meth:`_make_m_step`, compiled once per model and argument structure (the last
        :data:`MAX_M_STEPS` of them are kept)."""
        static, treedef, positions, arrays = split_static((args, kwargs))
        names = tuple(k for k, s in tr.items() if s["type"] == "param")
        cache_key = (self.model, self.latent, self.lbfgs_iters, self.m_step_prox, names, static,
                     treedef, positions)
        try:
            found = _M_STEPS.get(cache_key)
        except TypeError:  # unhashable static arguments: no caching
            return self._make_m_step(key, tr, args, kwargs)
        if found is None:
            found = _M_STEPS[cache_key] = self._make_m_step(key, tr, args, kwargs)
        return functools.partial(found, arrays=arrays)

    def _make_m_step(self, key: Any, tr: Any, args: tuple, kwargs: dict) -> Callable:
        """Compile ``(params, n̂) ↦ argmax_params θ(params)·n̂ − N·A(θ(params)) + Σ log p(obs)``."""
        names = [k for k, s in tr.items() if s["type"] == "param"]
        transforms = {
            k: biject_to(tr[k]["kwargs"].get("constraint", constraints.real)) for k in names
        }
        static, treedef, positions, arrays = split_static((args, kwargs))
        model, latent, iters = self.model, self.latent, self.lbfgs_iters

        def neg_q(u: dict, n_hat: Any, arrays: tuple) -> Any:
            a, kw = _join(static, treedef, positions, arrays)
            values = {k: transforms[k](v) for k, v in u.items()}
            values[latent] = n_hat
            with handlers.trace() as t, handlers.substitute(data=values), \
                    handlers.seed(rng_seed=key):
                model(*a, **kw)
            total = 0.0
            for name, site in t.items():
                if site["type"] != "sample":
                    continue
                if name == latent:
                    total = total + site["fn"].complete_log_likelihood(site["value"])
                elif site["is_observed"]:
                    total = total + jnp.sum(site["fn"].log_prob(site["value"]))
            return -total

        solver = optax.lbfgs()

        prox = self.m_step_prox

        @jax.jit
        def solve(u_t: dict, n_hat: Any, arrays: tuple) -> dict:
            def f(x: dict) -> Any:  # Q plus the proximal term around the current params
                moved = jax.tree_util.tree_map(lambda a, b: jnp.sum((a - b) ** 2), x, u_t)
                return neg_q(x, n_hat, arrays) + 0.5 * prox * sum(
                    jax.tree_util.tree_leaves(moved))

            value_and_grad = optax.value_and_grad_from_state(f)

            def step(carry: Any, _: Any) -> Any:
                u, state = carry
                value, grad = value_and_grad(u, state=state)
                updates, state = solver.update(grad, state, u, value=value, grad=grad,
                                               value_fn=f)
                return (optax.apply_updates(u, updates), state), None

            (u, _), _ = jax.lax.scan(step, (u_t, solver.init(u_t)), None, length=iters)
            return u

        def m_step(params: dict, n_hat: Any, arrays: tuple = arrays) -> dict:
            u = {k: transforms[k].inv(params[k]) for k in names}
            u = solve(u, n_hat, arrays)
            return {k: transforms[k](v) for k, v in u.items()}

        return m_step

    # -- loop ------------------------------------------------------------------------------------
    def run(self, rng_key: Any, *args: Any, init_params: dict | None = None,
            callback: Callable[[int, dict], None] | None = None, **kwargs: Any) -> EMResult:
        """Run EM from the params' initial values (or ``init_params``).

        ``callback(iteration, params)``, if given, is called after every M-step
        (``iteration = 1, 2, ...``) with the updated params.
        """
        start = time.perf_counter()
        self._engine = None  # a fresh E-step state for every run
        params = dict(init_params or {})
        args = tuple(_from_pandas(a) for a in args)
        kwargs = {k: _from_pandas(v) for k, v in kwargs.items()}
        self._check_observations(rng_key, params, args, kwargs)
        tr, res = self._e_step(rng_key, params, args, kwargs)
        params = {k: s["value"] for k, s in tr.items() if s["type"] == "param"} | params
        changes, objectives = [], []
        converged = False
        fn = tr[self.latent]["fn"]
        mu_prev = fn.network.flatten(jt.marginals(fn.network, fn.theta))
        natural = self.nlbp_options["space"] == "natural"
        general_m_step = None
        options, halvings = dict(self.nlbp_options), 0
        schedule = resolve_damping(options["space"], options["damping"])
        for it in range(self.max_iters):
            if it > 0:
                if self.estep != "nlbp":  # fresh draws for the sampling E-steps
                    rng_key = jax.random.split(rng_key)[0]
                tr, res = self._e_step(rng_key, params, args, kwargs, options)
            theta_name = self._theta_param(tr)
            free = self.estep == "nlbp" and natural and theta_name is not None
            while (free and halvings < self.max_halvings and not bool(res.converged)
                   and bool(jnp.all(res.eta == tr[self.latent]["fn"].theta))):
                # nothing beat the start: retry with half the damping, and keep it
                halvings += 1
                options["damping"] = ScaledDamping(schedule, 0.5 ** halvings)
                tr, res = self._e_step(rng_key, params, args, kwargs, options)
            objectives.append(float(res.objective))
            n_hat = tr[self.latent]["value"]
            if free:
                params = dict(params, **{theta_name: res.eta})
            elif self.estep != "nlbp" and theta_name is not None:
                params = dict(params, **{theta_name: m_step(fn.network, n_hat,
                                                             params[theta_name])})
            else:
                if general_m_step is None:
                    general_m_step = self._cached_m_step(rng_key, tr, args, kwargs)
                params = general_m_step(params, n_hat)
            theta = self._cgm(params, n_hat, args, kwargs, rng_key).theta
            mu = fn.network.flatten(jt.marginals(fn.network, theta))
            change = max(float(jnp.sum(jnp.abs(mu[fn.network.slice_of(c)]
                                               - mu_prev[fn.network.slice_of(c)])))
                         for c in fn.network.cliques)
            changes.append(change)
            mu_prev = mu
            if callback is not None:
                callback(it + 1, params)
            if change < self.tol:
                # a fixed point only if the E-step converged too (an E-step that found nothing
                # better than its start returns it, and θ stops moving without converging)
                converged = bool(res.converged)
                break
        cgm = self._cgm(params, n_hat, args, kwargs, rng_key)
        return EMResult(params, n_hat, MarkovRandomField(cgm.network, cgm.theta), len(changes),
                        converged, changes, objectives, time.perf_counter() - start, halvings)

    def _cgm(self, params: dict, n: Any, args: tuple, kwargs: dict,
             key: Any) -> CollectiveGraphicalModel:
        """The CGM site's distribution at ``params`` (its value substituted, not sampled)."""
        data = dict(params)
        data[self.latent] = n
        model = handlers.substitute(handlers.seed(self.model, key), data=data)
        return handlers.trace(model).get_trace(*args, **kwargs)[self.latent]["fn"]


def _from_pandas(x: Any) -> Any:
    """A pandas Series or DataFrame argument as its numpy values (JAX cannot trace pandas)."""
    if type(x).__module__.partition(".")[0] == "pandas" and hasattr(x, "to_numpy"):
        return x.to_numpy()
    return x
