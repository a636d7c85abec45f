"""EM over a NumPyro model with a collective-graphical-model site (seed 002, Algorithm 2).

Start. Where the model releases whole clique tables through this library's noise distributions
(:class:`~numpyro_dpgm.distributions.LaplaceNoise`, ``GaussianNoise``, ``DiscreteLaplaceNoise``,
``DiscreteGaussianNoise``) whose ``loc`` reads the latent tables cell by cell (``n`` itself, a
slice, a permutation, plus a constant), :class:`EM` starts the CGM's ``theta`` param from the
clipped noisy tables made consistent, naive MLE's fit (CGM-EM's own start), ``init="noisy"``
(:mod:`~numpyro_dpgm.infer.em_start`).

Stop and check. With the NLBP E-step EM runs until the fitted marginals stop moving (relative
change of the expected tables below ``tol``) or ``max_iters`` (1,000); it warns
(:class:`EMConvergenceWarning`) when it stops unconverged, or when its fit explains the release
worse than that consistent fit of the noisy tables does (noise log-likelihood of the expected
tables ``N·μ(θ)``).
"""

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
from .._warnings import warn
from ..distributions.cgm import CollectiveGraphicalModel
from ..distributions.mrf import MarkovRandomField
from ..oracles import junction_tree as jt
from ..oracles.nlbp import check_halvings, resolve_damping
from .bayes.checks import ConvergenceWarning
from .em_program import EMRun, em_loop, em_start_state
from .em_start import noisy_start, trace_at
from .estep import estep_engine
from .handlers import ModelEvidence, join, nlbp, split_static
from .mstep import m_step
from .result import Result, total_extras

__all__ = ["DEFAULT_MAX_ITERS", "EM", "EMConvergenceWarning"]

#: Most compiled general M-steps kept (by model and argument structure; least recently used
#: evicted first).
MAX_M_STEPS = 16
_M_STEPS: LRUCache = LRUCache(MAX_M_STEPS)

#: ``max_iters`` of :class:`EM` by E-step when none is given. NLBP-EM runs to its tolerance, so
#: its bound is not a cost: from the noisy start it converged within 18 iterations on the test
#: suite's 3-attribute chains (N = 20,000, Laplace b = 5) and within 60 on a six-table tree of
#: Adult's attributes (N = 48,842, b = 6). The sampling E-steps' means carry Monte-Carlo noise
#: that keeps the change above any tight tolerance, so their bound is the iterations they run.
DEFAULT_MAX_ITERS = {"nlbp": 1000, "variational": 10, "mcmc": 10, "exact": 10}

#: NLBP's tolerance within an E-step (the :class:`~numpyro_dpgm.infer.handlers.nlbp` handler's).
_INNER_TOL = 1e-8

#: Relative shortfall of a fit's noise log-likelihood below the noisy tables' fit's that warns.
_LOGLIK_SLACK = 1e-9

class EMConvergenceWarning(ConvergenceWarning):
    """An :class:`EM` run that stopped before converging, or whose fit explains the release
    worse than the consistent fit of the clipped noisy tables (its default start) does."""


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
    (:class:`~numpyro_dpgm.infer.estep.ExactEStep`; an exact CGM site, read by this
    library's noise sites, and no other latent site). M-step: maximise the
    complete-data log-likelihood
    ``θ·n̂ − N·A(θ)`` (plus the observed sites' log densities) over the ``numpyro.param`` sites.
    When the CGM's ``theta`` is itself a param site, the maximiser is moment matching: NLBP's
    ``η̂`` in natural space (no optimisation), or :func:`~numpyro_dpgm.infer.mstep.m_step`
    on the mean of the other E-steps. With NLBP in natural space that whole loop is one compiled
    program, the one :func:`~numpyro_dpgm.estimation.cgm_em.cgm_em` runs
    (:mod:`~numpyro_dpgm.infer.em_program`), its evidence the model's observed sites: a refit
    with new array arguments (values, totals, scales) reuses it, while a Python number among the
    arguments is part of the program (as in NumPyro's ``MCMC`` without ``jit_model_args``).
    Otherwise (e.g. tied parameters, ``theta = f(params)``) L-BFGS from ``optax`` solves it in
    the params' unconstrained space.

    Parameters
    ----------
    model : callable
        A NumPyro model with a :class:`CollectiveGraphicalModel` sample site ``latent`` and
        observed sites downstream of it.
    latent : str
    init : {"noisy", "param"}
        Start of the CGM's ``theta`` when it is a ``numpyro.param`` site itself. ``"noisy"``
        (default): the clipped noisy tables made consistent by naive MLE's fit (its default L2
        rule; CGM-EM's start) of the whole clique tables that the model's noise sites release,
        where every clique of the network has one (the library's four noise distributions
        with ``loc`` reading ``n`` cell by cell: ``n``, a slice or permutation of it, plus a
        constant; other observations count in the E-steps, not in the start). The param's own
        initial value is then only its shape. ``"param"``: the param's initial value (the
        uniform model for ``jnp.zeros``). A ``theta`` in ``run(init_params=...)`` is always
        kept. Where no noisy start applies (``theta`` computed from other params, no whole
        table released) the params' initial values are used; the result's ``extras["init"]``
        says which start ran.
    max_iters : int, optional
        Most EM iterations; default :data:`DEFAULT_MAX_ITERS` (1,000 with the NLBP E-step, a
        bound that runs to ``tol``; 10 with the sampling E-steps).
    inner_iters : int
        NLBP iterations per E-step.
    tol : float
        Stop when the model's marginals change by less than ``tol`` (L1, per clique: the
        relative change ``‖Δn_C‖₁ / N`` of the expected tables); the run counts as converged
        only if that last E-step converged as well.
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

    Warns
    -----
    EMConvergenceWarning
        With the NLBP E-step: when the run stops unconverged (at ``max_iters``, or with an
        E-step that stalled), or when the fit's noise log-likelihood at its expected tables
        ``N·μ(θ)`` is below that of the consistent fit of the clipped noisy tables (the default
        start; checked where the model releases whole tables). The message names the remedy.
        The sampling E-steps' means are Monte-Carlo or variational estimates, so neither check
        applies to them; judge those runs by their E-steps' own diagnostics.

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
    >>> fit = EM(model, latent="n").run(jax.random.key(0), y, 100, 2.0)
    >>> fit.extras["init"], fit.converged
    ('noisy', True)
    >>> [round(float(p), 2) for p in fit.model.marginal(("a",))]
    [0.35, 0.65]
    """

    def __init__(
        self,
        model: Callable,
        latent: str = "n",
        *,
        init: str = "noisy",
        max_iters: int | None = None,
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
        if estep not in DEFAULT_MAX_ITERS:
            raise ValueError("estep must be 'nlbp', 'variational', 'mcmc' or 'exact', got "
                             f"{estep!r}")
        if max_iters is None:
            max_iters = DEFAULT_MAX_ITERS[estep]
        if max_iters < 1 or inner_iters < 1:
            raise ValueError("max_iters and inner_iters must be at least 1")
        if init not in ("noisy", "param"):
            raise ValueError(f"init must be 'noisy' or 'param', got {init!r}")
        self.init = init
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

    def _check_observations(self, key: Any, params: dict, args: tuple, kwargs: dict) -> Any:
        """Refuse observed values that would give a quiet wrong answer: NaN or infinite entries
        (NLBP would return the uniform model) and shapes that do not broadcast against their
        distribution. The model is traced once with the latent site at a feasible point; that
        trace is returned."""
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
        return tr

    # -- start and check -------------------------------------------------------------------------
    def _trace_at(self, key: Any, data: dict, args: tuple, kwargs: dict) -> Any:
        """A trace of the model with the values of ``data`` substituted."""
        return trace_at(self.model, key, data, args, kwargs)

    def _start(self, key: Any, tr: Any, given: dict, args: tuple,
               kwargs: dict) -> tuple[dict, str, Any]:
        """The params EM starts from, how ``theta`` was chosen and the noisy-table ``θ`` (for
        the fit check; ``None`` where there is none or no check runs)."""
        theta_name = self._theta_param(tr)
        noisy = None
        wanted = self.init == "noisy" and theta_name is not None and theta_name not in given
        if self.estep == "nlbp" or wanted:
            noisy = noisy_start(self.model, self.latent, key, tr, args, kwargs)
        if theta_name in given:
            return given, "given", noisy
        if self.init == "param" or noisy is None or theta_name is None:
            return given, "param", noisy
        value = jnp.asarray(noisy, dtype=jnp.result_type(tr[theta_name]["value"]))
        return dict(given, **{theta_name: value}), "noisy", noisy

    def _release_loglik(self, key: Any, params: dict, fn: CollectiveGraphicalModel, theta: Any,
                        args: tuple, kwargs: dict) -> float:
        """``Σ log p(obs | n)`` of the observed sites at ``params`` and the expected tables
        ``n = N·μ(θ)`` of the CGM site ``fn`` at ``θ = theta``."""
        n = fn.total_count * fn.network.flatten(jt.marginals(fn.network, theta))
        tr = self._trace_at(key, dict(params, **{self.latent: n}), args, kwargs)
        return float(_observed_log_prob(tr, self.latent))

    def _e_step(self, key: Any, params: dict, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        if self.estep != "nlbp":
            return self._mean_e_step(key, params, args, kwargs)
        handler = nlbp(self.model, latent=self.latent, **self.nlbp_options)
        wrapped = handlers.substitute(handlers.seed(handler, key), data=params)
        tr = handlers.trace(wrapped).get_trace(*args, **kwargs)
        if self.latent not in tr:
            raise ValueError(f"the model has no sample site {self.latent!r}")
        return tr, handler.results[self.latent]

    def _mean_e_step(self, key: Any, params: dict, args: tuple,
                     kwargs: dict) -> tuple[Any, Any]:
        """Variational or Monte-Carlo E-step: the latent site's value becomes ``E[n]``."""
        tr = self._feasible_trace(key, params, args, kwargs)
        relaxed = bool(getattr(tr[self.latent]["fn"], "relaxed", False))
        if self.estep == "exact" and relaxed:
            raise ValueError("estep='exact' draws integer tables: it needs an exact CGM site "
                             "(CollectiveGraphicalModel(..., relaxed=False), the default)")
        if self.estep != "exact" and not relaxed:
            raise ValueError(f"estep={self.estep!r} needs a relaxed CGM site "
                             "(CollectiveGraphicalModel(..., relaxed=True)); estep='exact' "
                             "samples the exact one")
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
            a, kw = join(static, treedef, positions, arrays)
            values = {k: transforms[k](v) for k, v in u.items()}
            values[latent] = n_hat
            with handlers.trace() as t, handlers.substitute(data=values), \
                    handlers.seed(rng_seed=key):
                model(*a, **kw)
            site = t[latent]
            return -(site["fn"].complete_log_likelihood(site["value"])
                     + _observed_log_prob(t, latent))

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
            callback: Callable[[int, dict], None] | None = None, **kwargs: Any) -> Result:
        """Run EM from the start of ``init`` (or ``init_params``).

        ``callback(iteration, params)``, if given, is called after every M-step
        (``iteration = 1, 2, ...``) with the updated params.

        Returns
        -------
        Result
            ``model``: the record-level model at the final parameters; ``params``: the final
            values of the model's ``numpyro.param`` sites; ``loss_trace``: the E-step's
            objective per iteration (NLBP's ``F(n̂)``); ``iterations``, ``converged``,
            ``elapsed``; and ``extras``:

            - ``params``: as ``Result.params``;
            - ``n``: the last E-step's estimate of the latent count tables;
            - ``marginal_change``: ``max_C ‖μ_C(θ_{t+1}) − μ_C(θ_t)‖₁`` per iteration;
            - ``damping_halvings``: how often a stalled E-step was retried with half the
              damping;
            - ``init``: where the CGM's ``theta`` param started, ``"noisy"`` (the consistent
              fit of the clipped noisy tables), ``"param"`` (the param's own initial value) or
              ``"given"`` (``init_params``);
            - ``release_loglik``: ``Σ log p(obs | n)`` of the model's observed sites at the
              fit's expected tables ``n = N·μ(θ)`` (NLBP E-step; NaN otherwise);
            - ``noisy_loglik``: the same at the consistent fit of the clipped noisy tables (NaN
              where the model releases no whole table, or with a sampling E-step); the fit
              warns when its own is lower;
            - ``stop``: why the run stopped, ``"converged"``, ``"iteration limit"``,
              ``"stalled"`` (the marginals stopped moving before the last E-step converged) or
              ``"failed"`` (every NLBP iterate of the last E-step was non-finite);
            - ``estep``: the E-step that ran;
            - ``total_count``: the CGM site's ``N`` (a number; absent for an array of them),
              the scale :func:`~numpyro_dpgm.infer.result.answer_queries` answers on, as for
              the estimators' fits.
        """
        start = time.perf_counter()
        self._engine = None  # a fresh E-step state for every run
        args = tuple(_from_pandas(a) for a in args)
        kwargs = {k: _from_pandas(v) for k, v in kwargs.items()}
        tr = self._check_observations(rng_key, dict(init_params or {}), args, kwargs)
        params, how, noisy = self._start(rng_key, tr, dict(init_params or {}), args, kwargs)
        theta_name = self._theta_param(tr)
        if self.estep == "nlbp" and self.nlbp_options["space"] == "natural" and theta_name:
            params = {k: s["value"] for k, s in tr.items() if s["type"] == "param"} | params
            run = self._free_loop(tr, params, theta_name, args, kwargs, callback)
            recs = run.records
            # a retry (an E-step that did not move θ) is not an iteration; the last E-step is
            # one whatever it did (it ended the run)
            counted = recs.moved.astype(bool)
            counted[-1:] = True
            params = dict(params, **{theta_name: run.theta})
            n_hat, halvings, stop = run.n_hat, run.halvings, run.stop
            changes = [float(c) for c in recs.change[counted]]
            objectives = [float(o) for o in recs.objective[counted]]
            converged = stop == "converged"
        else:
            params, n_hat, changes, objectives, converged, stop = self._host_loop(
                rng_key, params, args, kwargs, callback)
            halvings = 0
        cgm = self._cgm(params, n_hat, args, kwargs, rng_key)
        release = reference = float("nan")
        if self.estep == "nlbp":
            release = self._release_loglik(rng_key, params, cgm, cgm.theta, args, kwargs)
            if noisy is not None:
                reference = self._release_loglik(rng_key, params, cgm, noisy, args, kwargs)
        total = cgm.total_count  # one N (the model's own, not estimated): answers in counts
        one_total = not (np.ndim(total) or isinstance(total, jax.core.Tracer))
        fit = Result(
            model=MarkovRandomField(cgm.network, cgm.theta),
            loss_trace=np.asarray(objectives, dtype=float),
            iterations=len(changes), converged=converged, elapsed=time.perf_counter() - start,
            extras={"params": params, "n": n_hat, "marginal_change": np.asarray(changes),
                    "damping_halvings": halvings, "init": how, "release_loglik": release,
                    "noisy_loglik": reference, "stop": stop, "estep": self.estep,
                    **(total_extras(total, False) if one_total else {})})
        if self.estep == "nlbp":
            self._warn_fit(fit)
        return fit

    def _free_loop(self, tr: Any, params: dict, theta_name: str, args: tuple, kwargs: dict,
                   callback: Callable[[int, dict], None] | None) -> EMRun:
        """NLBP-EM with the free M-step ``θ_{t+1} = η̂_t``: the compiled loop of
        :mod:`~numpyro_dpgm.infer.em_program` (CGM-EM's), its evidence the model's observed
        sites given the latent tables and the values upstream of them (``tr``, at ``params``)."""
        fn = tr[self.latent]["fn"]
        values = {}
        for name, site in tr.items():
            if name == self.latent:
                break
            if site["type"] in ("param", "sample"):
                values[name] = params.get(name, site["value"])
        static, treedef, positions, arrays = split_static((args, kwargs))
        evidence = _ReleaseEvidence(ModelEvidence(self.model, self.latent, static, treedef,
                                                  positions, self.nlbp_options["smoothing"]))
        theta0 = jnp.asarray(params[theta_name])
        dtype = theta0.dtype
        total = jnp.asarray(fn.total_count, dtype)
        data = (arrays, values)
        carry, _ = em_start_state(fn.network, evidence, theta0, data, total)
        opts = (jnp.asarray(self.tol, dtype), jnp.asarray(self.nlbp_options["max_iters"],
                                                          jnp.int32),
                jnp.asarray(_INNER_TOL, dtype), jnp.zeros((), dtype),
                jnp.asarray(self.max_halvings, jnp.int32), jnp.asarray(True))
        report = None
        if callback is not None:
            def report(t: int, carry: Any, _: float) -> None:
                callback(t, dict(params, **{theta_name: carry.theta}))
        schedule = resolve_damping("natural", self.nlbp_options["damping"])
        return em_loop(fn.network, evidence, data, carry, total, schedule, self.max_iters, opts,
                       report)

    def _host_loop(self, rng_key: Any, params: dict, args: tuple, kwargs: dict,
                   callback: Callable[[int, dict], None] | None) -> tuple:
        """EM iterated on the host: a sampling E-step (or NLBP in counts space, or a ``θ``
        computed from other params) and the matching M-step, until the marginals stop moving
        or ``max_iters``."""
        tr, res = self._e_step(rng_key, params, args, kwargs)
        params = {k: s["value"] for k, s in tr.items() if s["type"] == "param"} | params
        changes, objectives = [], []
        converged, stop = False, "iteration limit"
        fn = tr[self.latent]["fn"]
        mu_prev = fn.network.flatten(jt.marginals(fn.network, fn.theta))
        general_m_step = None
        for it in range(self.max_iters):
            if it > 0:
                if self.estep != "nlbp":  # fresh draws for the sampling E-steps
                    rng_key = jax.random.split(rng_key)[0]
                tr, res = self._e_step(rng_key, params, args, kwargs)
            theta_name = self._theta_param(tr)
            objectives.append(float(res.objective))
            n_hat = tr[self.latent]["value"]
            if self.estep != "nlbp" and theta_name is not None:
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
                converged = bool(res.converged)
                stop = "converged" if converged else "stalled"
                break
        return params, n_hat, changes, objectives, converged, stop

    def _warn_fit(self, fit: Result) -> None:
        """Say when an NLBP-EM run stopped unconverged or ended worse than the noisy tables'
        fit, and what to do about it."""
        said, remedies = [], []
        ext = fit.extras
        change, release, noisy = ext["marginal_change"], ext["release_loglik"], ext["noisy_loglik"]
        if ext["stop"] == "failed":
            said.append(f"EM stopped after {fit.iterations} iteration(s) because every NLBP "
                        "iterate of its last E-step was non-finite.")
            remedies.append("pass a smaller damping (e.g. damping=0.01) or smoothing=0.1, or "
                            "check the observed values and noise scales")
        elif not fit.converged and change[-1] >= self.tol:
            said.append(f"EM stopped at the iteration limit (max_iters={self.max_iters}) "
                        f"before converging: the marginals still moved by "
                        f"{change[-1]:.3g} (L1, largest clique) in the last "
                        f"iteration, against tol={self.tol:g}.")
            remedies.append("raise max_iters or continue from this fit with "
                            "init_params=fit.params")
        elif not fit.converged:
            said.append(f"EM stopped after {fit.iterations} iteration(s) because θ stopped "
                        "moving, but its last E-step had not converged within "
                        f"inner_iters={self.nlbp_options['max_iters']}: not a fixed point.")
            remedies.append("raise inner_iters (or max_halvings) or pass a smaller damping "
                            "(e.g. damping=0.01)")
        if release < noisy - _LOGLIK_SLACK * abs(noisy):
            said.append("Its fit explains the release worse than the clipped noisy tables do: "
                        f"noise log-likelihood {release:.8g} at the fitted expected "
                        f"tables against {noisy:.8g} at the tables' consistent fit "
                        "(naive MLE).")
            if ext["init"] != "noisy":
                remedies.append("start from that fit (init='noisy', no theta in init_params)")
        if said:
            remedies = remedies or ["raise max_iters and inner_iters"]
            warn(f"{' '.join(said)} The fit may be far from EM's answer; "
                 f"{'; '.join(remedies)}.", EMConvergenceWarning)

    def _cgm(self, params: dict, n: Any, args: tuple, kwargs: dict,
             key: Any) -> CollectiveGraphicalModel:
        """The CGM site's distribution at ``params`` (its value substituted, not sampled)."""
        return self._trace_at(key, dict(params, **{self.latent: n}), args,
                              kwargs)[self.latent]["fn"]


class _ReleaseEvidence(NamedTuple):
    """A model's :class:`~numpyro_dpgm.infer.handlers.ModelEvidence` called as the compiled EM
    loop calls its evidence, ``evidence(n, data, smoothing)`` with ``data = (arrays, values)``
    (the model's own smoothing option applies; the loop's is not used)."""

    model: ModelEvidence

    def __call__(self, n: Any, data: tuple, smoothing: Any = 0.0) -> Any:
        return self.model(n, *data)


def _observed_log_prob(tr: Any, latent: str) -> Any:
    """``Σ log p`` of a trace's observed sample sites other than ``latent``."""
    total = 0.0
    for name, site in tr.items():
        if site["type"] == "sample" and site["is_observed"] and name != latent:
            total = total + jnp.sum(site["fn"].log_prob(site["value"]))
    return total


def _from_pandas(x: Any) -> Any:
    """A pandas Series or DataFrame argument as its numpy values (JAX cannot trace pandas)."""
    if type(x).__module__.partition(".")[0] == "pandas" and hasattr(x, "to_numpy"):
        return x.to_numpy()
    return x
