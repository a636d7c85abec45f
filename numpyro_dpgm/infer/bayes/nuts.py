"""NUTS on a model of noisy marginals: relaxed CGM tables, exact tables moved by record swaps, or
the tables integrated out.

Three paths sample the posterior of a :class:`~.model.NoisyMarginalsModel`:

- **relaxed**: NUTS on ``φ`` and the relaxed tables ``n`` together (the relaxed CGM density on
  ``N·M``); fast where every cell expects several records, biased where cells are near-empty
  (:func:`~numpyro_dpgm.distributions.relaxation.relaxation_leak`), and badly conditioned at
  large ``N``, where ``y`` pins ``n`` to within a few counts while ``θ`` moves on the scale
  ``1/√(Nμ)``;
- **exact**: the model with the exact CGM pmf on integer tables, sampled by
  :class:`numpyro.infer.HMCGibbs`: NUTS on ``φ`` given ``n`` and exact record swaps on ``n``
  given ``φ`` (:mod:`.gibbs`, :mod:`.records`);
- **collapsed**: the normal relaxation's tables integrated out of ``θ``'s update, Laplace
  noise as a normal scale mixture (the :class:`~.collapse.collapse` handler): NUTS on ``φ``
  alone, whose target is smooth where every released value puts a kink into the joint of
  ``(φ, n)``; each step costs one pass along the junction tree (:mod:`.collapsed_tree`). The
  library's model runs it as the model with exact tables that it is, through the same handler
  and kernel as a model of your own.

:func:`run_nuts` takes the collapsed path by default on a large release whose tables hold many
records (:func:`~.paths.choose_path`), the exact path where the relaxation leak at the starting
``θ`` exceeds the tolerance (1 % of ``N`` in some table) or where the release pins the counts
(:func:`~.paths.choose_path`), says which path ran
(``mcmc.path``, ``mcmc.path_reason``), warns when a relaxed posterior leaks, and warns when
the run has not converged (:mod:`.checks`); with ``time_limit`` it first draws further batches
until the run has converged or time is up (:mod:`.extend`).
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro.infer import MCMC, NUTS

from ...distributions.cgm import CollectiveGraphicalModel
from .checks import (
    TARGET_ESS,
    ConvergenceWarning,
    converged,
    convergence_figures,
    posterior_leak,
    warn_convergence,
    warn_relaxed_leak,
)
from .collapse import (
    PATH_REASON,
    collapse,
    collapse_kernel,
    collapse_plan,
    collapse_start,
)
from .collapse import gibbs_values as collapse_gibbs_values
from .conditional import ConditionalCoding
from .count_gibbs import CGMGibbs, RecordMoves
from .count_sites import CountSiteError, count_networks, split_sites
from .extend import (
    ProgramData,
    chain_method_for,
    draw_until,
    draws_held,
    first_draws,
    resolve_chain_method,
)
from .gibbs import interweave_fn
from .initialization import init_to_interior, init_values
from .laplace_metric import ChosenMetric, choose_metric
from .model import OBSERVED, NoisyMarginalsModel, observed_answers, y_argument
from .paths import (
    choose_path,
    collapsed_reason,
    collapsed_size,
    released_log_odds,
    start_theta,
)
from .pilot_map import (
    MAPPED_SITE,
    PROBABILITIES,
    fit_sinh_arcsinh,
    linear_map,
    map_inverse,
    sinh_arcsinh_map,
)
from .team import Leader, Member, chain_shares, deadline_in, lead, seconds_to, team_cores
from .team import current as current_team
from .warmup import bounded_warmup

__all__ = ["CHAIN_METHODS", "DENSE_MAX_DIM", "NUTS_FIELDS", "NUTS_METRICS", "PILOT_DRAWS",
           "PILOT_SHARE", "WARMUP_SHARE", "WARMUP_SHARE_FIXED_METRIC", "WARMUP_STEPS",
           "WARMUP_STEPS_FIXED_METRIC", "pilot_draws", "run_nuts", "user_collapse"]

Array = Any

#: Largest number of parameters ``φ`` for which the exact path adapts a dense mass matrix.
DENSE_MAX_DIM = 1000

#: Statistics :func:`run_nuts` collects per draw (besides ``diverging``), for ArviZ.
NUTS_FIELDS = ("num_steps", "accept_prob", "potential_energy", "energy", "adapt_state.step_size")


def _one_release(model: NoisyMarginalsModel, model_args: tuple, model_kwargs: dict) -> bool:
    """Whether the run conditions on one observed release (not a batch, not ``y=None``)."""
    y = y_argument(model_args, model_kwargs)
    return y is not None and np.ndim(model.y if y is OBSERVED else y) == 1


def _exact_start(model: NoisyMarginalsModel, values: Mapping[str, Array], y: Array,
                 num_chains: int, rng_key: Array) -> Array:
    """Integer starting tables: one CGM draw of ``N`` records at the starting ``θ`` per chain
    (and release)."""
    eta = model.latent_theta(start_theta(model, values))
    cgm = CollectiveGraphicalModel(model.latent_network, eta, model.total_count)
    shape = (num_chains,) + tuple(y.shape[:-1])
    n0 = cgm.sample(rng_key, shape)
    return n0 if num_chains > 1 else n0[0]


def run_nuts(
    model: NoisyMarginalsModel | Callable[..., Any],
    rng_key: jax.Array,
    *model_args: Any,
    num_warmup: int | None = None,
    num_samples: int = 500,
    num_chains: int = 4,
    init: str | Mapping[str, Array] = "uniform",
    radius: float = 0.5,
    chain_method: str = "auto",
    progress_bar: bool = False,
    target_accept_prob: float = 0.8,
    dense_mass: bool | None = None,
    metric: str | None = None,
    max_tree_depth: int = 10,
    exact: bool | None = None,
    collapsed: bool | None = None,
    gibbs_moves: int | None = None,
    interweave: int | None = None,
    check: bool = True,
    time_limit: float | None = None,
    target_ess: float = TARGET_ESS,
    callback: Callable[[MCMC, int], None] | None = None,
    warmup_callback: Callable[[int, int, int, float], None] | None = None,
    **model_kwargs: Any,
) -> MCMC:
    """Posterior draws of a model of noisy marginals by NUTS, on the relaxed or the exact path.

    Parameters
    ----------
    model : NoisyMarginalsModel or callable
        Any NumPyro model (which runs plain NUTS).
    rng_key : JAX PRNG key
    *model_args, **model_kwargs
        Passed to the model (e.g. ``y=`` for a simulated release).
    num_warmup : int, optional
        Warm-up steps per chain; default :data:`WARMUP_STEPS` where warm-up adapts the mass
        matrix, :data:`WARMUP_STEPS_FIXED_METRIC` where it adapts only the step size (the
        Laplace metric, below).
    num_samples, num_chains : int
    init : "uniform" or mapping site -> value
        Centre of the starting points: uniform tables and ``φ = 0`` (a
        :class:`NoisyMarginalsModel`'s sites); or given constrained values, such as the NLBP-EM
        estimate :func:`numpyro_dpgm.estimation.cgm_em.em_start`. On the exact path the
        starting tables are a CGM draw of ``N`` records at the starting ``θ`` per chain.
    radius : float
        Jitter of each chain's start in the unconstrained space (:func:`init_to_interior`).
    chain_method : {"auto", "sequential", "parallel", "vectorized", "processes"}
        ``"auto"`` (default): ``"parallel"`` where JAX has a device per chain (on a CPU, set
        ``numpyro.set_host_device_count(num_chains)`` before JAX starts; ``dpgm fit`` does),
        else ``"sequential"``. The exact path with ``θ`` inferred runs ``"vectorized"`` as
        ``"sequential"`` (:class:`numpyro.infer.HMCGibbs` takes one key at a time).
        ``"processes"`` (CPU, Linux): the chains shared out over a process per core, this one
        and fresh ones, each pinned to its core and running its chains one after another
        (:mod:`~numpyro_dpgm.infer.bayes.team`): the pilot's draws pooled for one map, the
        convergence of all chains checked between batches, their draws joined into the one
        run returned (``mcmc.processes`` says how many processes ran, ``mcmc.team_notes``
        what each did; the run cannot be continued by ``draw_more``). The model and its
        arguments must pickle with ``cloudpickle``; ``callback`` and ``warmup_callback`` see
        this process's chains. Not chosen by ``"auto"``: each process pays the set-up and
        compilation on one core, and on Adult's 842-cell release that cost more than the
        cores gave back, with the compilation cached too (:mod:`~numpyro_dpgm.infer.bayes.team`).
    progress_bar : bool
    target_accept_prob, max_tree_depth :
        NUTS options.
    dense_mass : bool, optional
        NUTS's mass matrix; default dense on the exact path when ``φ`` has at most
        :data:`DENSE_MAX_DIM` entries and ``y`` is one release (the reference-coded parameters
        are correlated: on a 97-cell Adult model a diagonal mass matrix took 315 leapfrog steps
        per draw and hit the maximum depth, a dense one 28), diagonal otherwise (a batch of
        releases: a dense matrix over 100 releases hit the maximum depth on every draw) and on
        the relaxed path. Not used with the Laplace metric (below), which is dense.
    metric : {"pilot", "laplace", "adapt"}, optional
        NUTS's metric on the collapsed path. ``"laplace"``: the inverse Hessian of the
        potential at its mode, with the Gibbs sites at their prior means
        (:mod:`~numpyro_dpgm.infer.bayes.laplace_metric`), kept through warm-up (which adapts
        the step size), and each chain starting from a draw of that normal approximation
        (``radius=0``: at the mode); on Adult's 842-cell tree the posterior's correlations
        held NUTS with an adapted diagonal metric at step size 0.011 and ~670 leapfrog steps
        a draw. ``"pilot"`` (the default): a pilot run with the Laplace metric
        (:func:`pilot_draws` per chain, at most :data:`PILOT_SHARE` of ``time_limit``),
        then NUTS through a sinh-arcsinh map of each of the approximation's whitened
        coordinates fitted to the pilot's quantiles (:mod:`~numpyro_dpgm.infer.bayes.pilot_map`):
        the release's own posterior bends the metric where its tails are not the
        curvature's (nearly empty cells); ``mcmc.pilot`` holds the pilot run (its wall time in
        ``mcmc.pilot.seconds``), ``mcmc.pilot_map`` the map (fitted in ``mcmc.map_seconds``).
        Where the curvature is not positive definite, the default falls back to ``"adapt"``
        with a warning. ``"adapt"``: NumPyro's windowed adaptation
        (``dense_mass``), the only metric of the other paths.
    exact : bool, optional
        ``True``: the exact path (:mod:`numpyro_dpgm.infer.bayes.gibbs`); ``False``: the relaxed
        one, on the model's relaxation; ``None`` (default): :func:`~.paths.choose_path`: the normal
        relaxation where the model was built with it, or (conditional coding) where every
        released value's noise variance is at least :data:`~.paths.NORMAL_MIN_VARIANCE`; else exact
        where the relaxation leak at the starting ``θ`` exceeds 1 % of ``N`` in some latent
        table, where the release pins the counts (the noise's share of the median released
        count below :data:`~.paths.PINNED_SHARE`), or where the model was built with
        ``relaxed=False``.
    collapsed : bool, optional
        ``True``: the collapsed path (:mod:`numpyro_dpgm.infer.bayes.collapse`: NUTS on ``φ``
        with the tables integrated out under the normal relaxation, then the tables drawn
        given ``φ``); ``False``: never; ``None`` (default): with ``exact=None``, on a large
        release whose tables hold many records (:func:`~.paths.choose_path`).
    gibbs_moves : int, optional
        Record swaps per step on the exact path
        (:func:`~numpyro_dpgm.infer.bayes.count_gibbs.default_moves`).
    interweave : int, optional
        Non-centred moves of ``(φ, n)`` per step on the exact path
        (:mod:`~numpyro_dpgm.infer.bayes.interweave`; default
        :func:`~numpyro_dpgm.infer.bayes.gibbs.default_interweave`, 0 for none).
    check : bool
        After the run, warn (:class:`~numpyro_dpgm.infer.bayes.checks.ConvergenceWarning`)
        when a parameter's rank-normalised split R-hat exceeds 1.01, its bulk ESS is below 100,
        draws hit the maximum tree depth or draws diverged, naming the remedy; and on the
        relaxed path of a :class:`NoisyMarginalsModel`, warn (``RelaxationWarning``) when the
        leak at the posterior mean ``θ`` exceeds the tolerance.
    time_limit : float, optional
        Seconds for the whole run, warm-up included. Warm-up then runs in chunks
        (:func:`~.warmup.bounded_warmup`) and stops, keeping what it has adapted, once it has used
        :data:`WARMUP_SHARE` of the limit (:data:`WARMUP_SHARE_FIXED_METRIC` with the Laplace
        metric; with a ``ConvergenceWarning``; ``mcmc.warmup_steps`` says how far each chain got);
        the first chain's set-up and compilation are not charged to that share
        (``bounded_warmup``'s ``limit``), only to the limit. The first draws and every further
        batch run one compiled program (:func:`~.extend.first_draws`) in calls of at most
        :data:`~.extend.DRAW_CHUNK` draws, sized to what the time left holds at the last call's
        pace (the first at the pace of warm-up's last steps, after a compilation as long as
        warm-up's), with the clock checked between calls: the first draws stop at the limit, but
        not below :data:`MIN_FIRST_DRAWS` per chain (with a ``ConvergenceWarning`` when cut). After
        them, keep drawing batches of as many draws per chain (:func:`~.extend.draw_until`: no new
        warm-up) while some parameter or latent cell has a split R-hat above 1.01 or a bulk ESS
        below ``target_ess``, the last batch stopping short at the limit. So the run ends within
        about one call of the limit.
        ``None`` (default): exactly ``num_samples`` draws per chain.
    target_ess : float
        The bulk ESS that ``time_limit``'s batches aim for (default 400).
    callback : callable, optional
        ``callback(mcmc, batch)`` before each further batch (progress; ``mcmc.convergence``
        then holds the figures of the draws so far).
    warmup_callback : callable, optional
        With ``time_limit``: ``warmup_callback(chain, steps_done, num_warmup, seconds_left)``
        after every chunk of warm-up (progress with the time left).

    Returns
    -------
    numpyro.infer.MCMC
        After ``run``; ``mcmc.get_samples()`` holds every latent and deterministic site (``n``
        integer-valued on the exact path) and ``mcmc.get_extra_fields()`` the statistics
        :data:`NUTS_FIELDS` and ``diverging`` (only ``diverging``, always false, when ``θ`` is
        fixed on the exact path).
        Set on it: ``mcmc.path`` (``"exact"``, ``"relaxed"``, ``"normal"`` or
        ``"collapsed"``), ``mcmc.path_reason`` (why),
        ``mcmc.model`` (the model sampled: on the exact and the collapsed paths, ``model``
        with ``relaxed=False``; the collapsed path's draws hold the sites ``n_xi`` and, for
        Laplace noise, ``n_v`` besides the usual ones, and ``mcmc.collapse_plan``),
        ``mcmc.metric`` (``"pilot"``, ``"laplace"`` or ``"adapt"``) and ``mcmc.laplace`` (the
        :class:`~numpyro_dpgm.infer.bayes.laplace_metric.LaplaceMetric`, or ``None``) and, with
        ``check`` or ``time_limit``, ``mcmc.convergence`` (the
        :class:`~numpyro_dpgm.infer.bayes.checks.ConvergenceFigures` the warnings are based on)
        and ``mcmc.batches`` (the further batches ``time_limit`` drew); with ``time_limit``,
        ``mcmc.warmup_seconds``, ``mcmc.draws_seconds`` and ``mcmc.batches_seconds``
        (warm-up's, the first draws' and the further batches' wall time, compilation and the
        convergence checks between batches included).
    """
    started = time.perf_counter()
    if metric not in (None, *NUTS_METRICS):
        raise ValueError(f"metric must be one of {NUTS_METRICS} or None, got {metric!r}")
    if chain_method not in CHAIN_METHODS:
        raise ValueError(f"chain_method must be one of {CHAIN_METHODS}, got {chain_method!r}")
    if chain_method == "processes":
        settings = dict(
            num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains, init=init,
            radius=radius, progress_bar=progress_bar, target_accept_prob=target_accept_prob,
            dense_mass=dense_mass, metric=metric, max_tree_depth=max_tree_depth, exact=exact,
            collapsed=collapsed, gibbs_moves=gibbs_moves, interweave=interweave, check=check,
            time_limit=time_limit, target_ess=target_ess, callback=callback,
            warmup_callback=warmup_callback)
        return _run_team(model, rng_key, model_args, model_kwargs, settings)
    deadline = None if time_limit is None else started + float(time_limit)
    method = resolve_chain_method(chain_method, num_chains)
    values = init_values(model, init)
    options = dict(num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                   method=method, progress_bar=progress_bar, radius=radius,
                   target_accept_prob=target_accept_prob, dense_mass=dense_mass,
                   max_tree_depth=max_tree_depth, deadline=deadline,
                   warmup_callback=warmup_callback)
    if not isinstance(model, NoisyMarginalsModel):
        counts, others = split_sites(model, model_args, model_kwargs)
        plan = user_collapse(model, model_args, model_kwargs, exact, collapsed)
        if plan is not None:
            return _finish(_run_user_collapsed(model, rng_key, model_args, model_kwargs,
                                               plan[0], plan[1], values, metric=metric,
                                               **options),
                           started, time_limit, target_ess, callback, check, max_tree_depth)
        if metric in ("laplace", "pilot"):
            raise ValueError(f"metric={metric!r} is the collapsed path's; this model runs on "
                             "the exact path (collapsed=True, or metric='adapt')")
        if counts and exact is not False:
            return _finish(_run_user_exact(
                model, rng_key, model_args, model_kwargs, counts, others, values,
                gibbs_moves=gibbs_moves, **options),
                started, time_limit, target_ess, callback, check, max_tree_depth)
        if counts:
            raise ValueError(f"exact=False, but the model's site(s) {list(counts)} are exact CGM "
                             "tables, which NUTS cannot move; build them with relaxed=True for "
                             "the relaxed path")
    path, reason = choose_path(model, exact, values, collapsed,
                               _one_release(model, model_args, model_kwargs))
    if metric in ("laplace", "pilot") and path != "collapsed":
        raise ValueError(f"metric={metric!r} is the collapsed path's; this run takes the "
                         f"{path} path (collapsed=True, or metric='adapt')")
    if path == "collapsed":  # the same handler and kernel as a model of your own
        sampled = model.with_cgm(False)
        kwargs = {"y": observed_answers(model, model_args, model_kwargs)}
        try:
            plan = collapse_plan(sampled, (), kwargs)
        except CountSiteError as e:
            raise ValueError(f"the collapsed path cannot run: {e}") from None
        if isinstance(init, str) and isinstance(model.coding, ConditionalCoding):
            values = {**values, "phi": released_log_odds(model)}
        return _finish(_run_user_collapsed(sampled, rng_key, (), kwargs, plan, reason, values,
                                           metric=metric, **options),
                       started, time_limit, target_ess, callback, check, max_tree_depth)
    if path != "exact":
        sampled = model
        if isinstance(model, NoisyMarginalsModel):
            sampled = model.with_relaxation(
                "normal" if path == "normal" else
                model.relaxation if model.relaxation != "normal" else "lgamma")
        kernel = NUTS(sampled, init_strategy=init_to_interior(values=values, radius=radius),
                      target_accept_prob=target_accept_prob, dense_mass=bool(dense_mass),
                      max_tree_depth=max_tree_depth)
        fields = NUTS_FIELDS
        mcmc = MCMC(kernel, num_warmup=_warmup(num_warmup, None), num_samples=num_samples,
                    num_chains=num_chains, progress_bar=progress_bar, progress_rate=1,
                    chain_method=chain_method_for(method, num_chains, progress_bar))
        _sample(mcmc, rng_key, model_args, model_kwargs, fields, None, deadline,
                warmup_callback)
    else:  # the kernel of a model of your own with exact tables, and the non-centred moves
        sampled = model.with_cgm(False)
        y = observed_answers(model, model_args, model_kwargs)
        k_start, rng_key = jax.random.split(rng_key)
        n0 = _exact_start(sampled, values, y, num_chains, k_start)
        if dense_mass is None:  # one release only: a batch's releases are independent
            dense_mass = (sampled.theta is None and y.ndim == 1
                          and sampled.coding.dim <= DENSE_MAX_DIM)
        mcmc = _run_user_exact(
            sampled, rng_key, model_args, model_kwargs, ("n",),
            ("phi",) if sampled.theta is None else (), {**values, "n": n0},
            gibbs_moves=gibbs_moves,
            joint_fn=interweave_fn(sampled, interweave, y),
            **{**options, "dense_mass": dense_mass})
        mcmc.path_reason = reason
        return _finish(mcmc, started, time_limit, target_ess, callback, check, max_tree_depth)
    mcmc.path, mcmc.path_reason, mcmc.model, mcmc.batches = path, reason, sampled, 0
    mcmc.fields = fields
    return _finish(mcmc, started, time_limit, target_ess, callback, check, max_tree_depth)


def _finish(mcmc: MCMC, started: float, time_limit: float | None, target_ess: float,
            callback: Callable[[MCMC, int], None] | None, check: bool, max_tree_depth: int,
            ) -> MCMC:
    """Further batches within ``time_limit``, the convergence figures and the warnings; in a
    team's run (``chain_method="processes"``), over every process's chains."""
    sampled, path, fields = mcmc.model, mcmc.path, mcmc.fields
    mcmc.metric = getattr(mcmc, "metric", "adapt")  # set by the collapsed paths
    mcmc.laplace = getattr(mcmc, "laplace", None)
    team = current_team()
    if time_limit is not None:
        spent = time.perf_counter() - started

        def decide(draws: dict[str, Any]) -> bool:
            mcmc.convergence = _figures_of(draws, max_tree_depth)
            return converged(mcmc.convergence, target_ess)

        def done(m: MCMC) -> bool:
            draws = _checked_draws(m, sampled)
            return decide(draws) if team is None else team.converged(draws, decide)

        # a draw of every chain is expected to take what it took in the first draws; without
        # timed first draws (no warm-up), the whole call so far spread over them
        pace = getattr(mcmc, "draw_pace", spent / max(mcmc.num_samples, 1))
        began = time.perf_counter()
        mcmc.batches = draw_until(mcmc, done, started + time_limit, pace, fields, callback)
        mcmc.batches_seconds = time.perf_counter() - began
    if isinstance(team, Member):
        team.join(mcmc._states, _notes(mcmc))
    elif team is not None:
        _join(mcmc, team)
    mcmc.processes = getattr(mcmc, "processes", 1)
    if check and (time_limit is None or team is not None):  # else draw_until's last check
        mcmc.convergence = _figures(mcmc, sampled, max_tree_depth)
    if check:
        _check(mcmc, sampled, path)
    return mcmc


#: Warm-up steps per chain by default where warm-up adapts the mass matrix (NumPyro's windows).
WARMUP_STEPS = 500

#: Warm-up steps per chain by default where the metric is given (the Laplace metric of the
#: collapsed path) and warm-up adapts the step size only: on Adult's 842-cell tree with
#: ``time_limit=600`` this default (and a quarter of the limit for warm-up) ended at 598 s with
#: worst R-hat 1.046 and smallest bulk ESS 92, where 500 steps cut at half the limit gave
#: 1.71 and 3.5 (``benchmarks/results/collapsed-limit-user-mid-blocked-cpu.json``,
#: ``…-mid-laplace-settled-cpu.json``).
WARMUP_STEPS_FIXED_METRIC = 150

#: The share of ``time_limit`` that warm-up may use at most (the rest is for draws).
WARMUP_SHARE = 0.5

#: The same where warm-up adapts the step size only.
WARMUP_SHARE_FIXED_METRIC = 0.25


#: The metrics that warm-up keeps (it adapts the step size only).
FIXED_METRICS = ("laplace", "pilot")


def _warmup(num_warmup: int | None, chosen: Any) -> int:
    """``num_warmup``, or its default for the metric ``chosen`` (a
    :class:`~.laplace_metric.ChosenMetric`, ``None`` where the mass matrix adapts)."""
    if num_warmup is not None:
        return int(num_warmup)
    fixed = chosen is not None and chosen.name in FIXED_METRICS
    return WARMUP_STEPS_FIXED_METRIC if fixed else WARMUP_STEPS


def _share(chosen: Any) -> float:
    """:data:`WARMUP_SHARE`, or :data:`WARMUP_SHARE_FIXED_METRIC` for a metric warm-up keeps
    (:data:`FIXED_METRICS`)."""
    return WARMUP_SHARE_FIXED_METRIC if chosen.name in FIXED_METRICS else WARMUP_SHARE


#: The fewest first draws per chain when ``time_limit`` cuts them (the fewest a split R-hat
#: is computed from); a run whose draws cost more than the limit leaves may overrun it by these.
MIN_FIRST_DRAWS = 4


def _sample(mcmc: MCMC, rng_key: Array, model_args: tuple, model_kwargs: dict,
            fields: tuple, init_params: Any, deadline: float | None,
            warmup_callback: Callable | None, share: float = WARMUP_SHARE) -> None:
    """``mcmc.run``; with a ``deadline``, warm-up bounded by :func:`~.warmup.bounded_warmup`
    to ``share`` of the time left and the first draws cut to fit the rest, at the
    pace of warm-up's last steps (and after a compilation as long as warm-up's, where the
    draws need a program of their own). A kernel with ``program_data`` (runs that share one
    compiled program, :class:`~.extend.ProgramData`) takes that way without a deadline too,
    unless NumPyro's progress bar is asked for (which ``mcmc.run`` draws)."""
    mcmc.warmup_steps = (mcmc.num_warmup,) * mcmc.num_chains
    shared = getattr(mcmc.sampler, "program_data", None) is not None and not mcmc.progress_bar
    if (deadline is None and not shared) or mcmc.num_warmup == 0:
        mcmc.run(rng_key, *model_args, extra_fields=fields, init_params=init_params,
                 **model_kwargs)
        return
    k_warm, k_run = jax.random.split(rng_key)
    start = time.perf_counter()
    warm = bounded_warmup(mcmc, k_warm, model_args, model_kwargs,
                          deadline=(np.inf if deadline is None
                                    else start + share * (deadline - start)),
                          init_params=init_params, callback=warmup_callback,
                          extra_fields=fields, limit=deadline)
    steps = mcmc.warmup_steps = warm.steps
    mcmc.warmup_seconds = time.perf_counter() - start
    if min(steps) < mcmc.num_warmup:
        warnings.warn(
            f"run_nuts: warm-up stopped after {min(steps)} of {mcmc.num_warmup} steps in some "
            f"chain, to keep within time_limit ({share:.0%} of it is for warm-up); the "
            "step size and mass matrix are those adapted so far. Remedy: a longer time_limit, "
            "or fewer warm-up steps", ConvergenceWarning, stacklevel=5)
    # a draw costs what a step at the end of warm-up cost (the adapted step size: early
    # warm-up steps are cheaper or dearer); parallel chains run side by side. The draws run in
    # the program of the further batches (draw_more's), in calls the clock is checked between:
    # chains one after another in warm-up's own program (step_program; compiled already),
    # vectorised or parallel ones in a program of their own, which compiles about as long as
    # warm-up's step did.
    side_by_side = mcmc.num_chains if mcmc.chain_method == "parallel" else 1
    asked = mcmc.num_samples
    mcmc.draws_seconds = first_draws(
        mcmc, k_run, model_args, model_kwargs, fields, deadline=deadline,
        pace=warm.step_seconds * mcmc.num_chains / side_by_side,
        compile_seconds=warm.compile_seconds, at_least=MIN_FIRST_DRAWS)
    mcmc.num_samples = draws_held(mcmc)
    if mcmc.num_samples < asked:
        warnings.warn(
            f"run_nuts: the first draws stopped at {mcmc.num_samples} of {asked} per chain, "
            f"to keep within time_limit (a draw of every chain took {mcmc.draw_pace:.3g} s). "
            "Remedy: a longer time_limit, or fewer warm-up steps", ConvergenceWarning,
            stacklevel=5)


def user_collapse(model: Callable[..., Any], model_args: tuple = (),
                  model_kwargs: dict | None = None, exact: bool | None = None,
                  collapsed: bool | None = None) -> tuple[Any, str] | None:
    """``(plan, reason)`` where :func:`run_nuts` runs a model of your own on the collapsed
    path (:mod:`.collapse`), else ``None`` (the record moves): with ``collapsed=True`` (or a
    ``ValueError`` that says why it cannot), and by default (``exact`` and ``collapsed`` not
    given) by the size rule of :func:`~.paths.collapsed_fit`, all count sites together."""
    model_kwargs = dict(model_kwargs or {})
    counts, others = split_sites(model, model_args, model_kwargs)
    if not counts or collapsed is False or exact:
        if collapsed and counts:
            raise ValueError("collapsed=True, but exact=True")
        return None
    if not others:
        if collapsed:
            raise ValueError("collapsed=True, but the model has no latent site besides the "
                             "count tables: θ is fixed, and the exact path samples the tables")
        return None
    if not collapsed:
        nets = count_networks(model, model_args, model_kwargs).values()
        if not all(net.is_decomposable for net, _ in nets) or collapsed_size(
                [(net, float(np.min(total))) for net, total in nets]) is not None:
            return None
    try:
        plan = collapse_plan(model, model_args, model_kwargs)
    except CountSiteError as e:
        if collapsed:
            raise ValueError(f"collapsed=True, but {e}") from None
        return None
    sites = ", ".join(repr(s.name) for s in plan.sites)
    if collapsed:
        return plan, f"{PATH_REASON}, on the model's site(s) {sites} (collapsed=True)"
    return plan, f"{collapsed_reason(plan.dim)}; on the model's site(s) {sites}"


def _run_user_collapsed(model: Callable[..., Any], rng_key: Array, model_args: tuple,
                        model_kwargs: dict, plan: Any, reason: str, values: Mapping,
                        *, metric: str | None, radius: float, dense_mass: bool | None,
                        **options: Any) -> MCMC:
    """The collapsed path, for a model of your own and the library's (with exact tables): ξ
    and ``v`` by Gibbs, NUTS on the rest (:func:`~.collapse.collapse_kernel`), with the
    ``metric`` of :func:`run_nuts` (``None``: ``"pilot"``, or ``"adapt"`` with a warning
    where the curvature at the mode is not positive definite)."""
    k_metric, rng_key = jax.random.split(rng_key)
    chosen = choose_metric("laplace" if metric == "pilot" else metric, collapse(model, plan),
                           model_args, model_kwargs, collapse_gibbs_values(plan),
                           init_to_interior(values=values, radius=0.0), k_metric,
                           options["num_chains"], radius, dense_mass)
    setting = dict(model_args=model_args, model_kwargs=model_kwargs, plan=plan, reason=reason,
                   values=values, radius=radius, **options)
    if metric != "laplace" and chosen.name == "laplace":
        return _run_mapped(model, rng_key, chosen, setting)
    return _collapsed_run(model, rng_key, chosen, **setting)


def _collapsed_run(model: Callable[..., Any], rng_key: Array, chosen: Any, *,
                   model_args: tuple, model_kwargs: dict, plan: Any, reason: str,
                   values: Mapping, num_warmup: int | None, num_samples: int, num_chains: int,
                   method: str, progress_bar: bool, radius: float, target_accept_prob: float,
                   max_tree_depth: int, deadline: float | None,
                   warmup_callback: Callable | None, kernel: Any = None) -> MCMC:
    """The collapsed path's run with the metric ``chosen`` (a
    :class:`~.laplace_metric.ChosenMetric`), by ``kernel`` where given (built for ``model``
    with ``chosen``'s options), else a new one."""
    if kernel is None:
        kernel = _collapsed_kernel(model, chosen, model_args=model_args,
                                   model_kwargs=model_kwargs, plan=plan, values=values,
                                   radius=radius, target_accept_prob=target_accept_prob,
                                   max_tree_depth=max_tree_depth)
    fields = ("diverging",) + NUTS_FIELDS
    mcmc = MCMC(kernel, num_warmup=_warmup(num_warmup, chosen), num_samples=num_samples,
                num_chains=num_chains,
                chain_method=chain_method_for(
                    "sequential" if method == "vectorized" else method, num_chains, progress_bar),
                progress_bar=progress_bar, progress_rate=1)
    init_params = {**collapse_start(plan, num_chains), **(chosen.starts or {})}
    _sample(mcmc, rng_key, model_args, model_kwargs, fields, init_params or None, deadline,
            warmup_callback, _share(chosen))
    mcmc.path, mcmc.path_reason, mcmc.model = "collapsed", reason, model
    mcmc.metric, mcmc.laplace = chosen.name, chosen.found
    mcmc.batches, mcmc.fields, mcmc.collapse_plan = 0, fields, plan
    return mcmc


def _collapsed_kernel(model: Callable[..., Any], chosen: Any, *, model_args: tuple,
                      model_kwargs: dict, plan: Any, values: Mapping, radius: float,
                      target_accept_prob: float, max_tree_depth: int, **_: Any) -> Any:
    """The collapsed path's kernel for ``model`` with the metric ``chosen``."""
    return collapse_kernel(
        model, plan, model_args, model_kwargs,
        init_strategy=init_to_interior(values=values, radius=radius),
        target_accept_prob=target_accept_prob, max_tree_depth=max_tree_depth,
        **chosen.nuts_options)


#: The ways :func:`run_nuts` runs its chains (``chain_method``): NumPyro's three, ``"auto"``
#: and a team of processes (:mod:`.team`).
CHAIN_METHODS = ("auto", "sequential", "parallel", "vectorized", "processes")

#: The metrics of :func:`run_nuts` (``metric``): the collapsed path's two and NumPyro's.
NUTS_METRICS = ("pilot", "laplace", "adapt")

#: Draws per chain of the pilot run of ``metric="pilot"`` (with the Laplace metric), whose
#: quantiles the map of :mod:`.pilot_map` is fitted to.
PILOT_DRAWS = 100


def pilot_draws(num_samples: int) -> int:
    """Draws per chain of the pilot run: :data:`PILOT_DRAWS`, or the run's own
    ``num_samples`` where it asks fewer (a pilot longer than the run it serves costs more than
    it can save), and at least as many as the map's fit has quantiles."""
    return max(min(PILOT_DRAWS, int(num_samples)), len(PROBABILITIES))


#: The share of the time left that the pilot run (its warm-up and draws) may use at most.
PILOT_SHARE = 0.4


def _run_mapped(model: Callable[..., Any], rng_key: Array, chosen: Any,
                setting: dict[str, Any]) -> MCMC:
    """``metric="pilot"``: a pilot run with the Laplace metric ``chosen`` (:func:`pilot_draws`
    per chain, at most :data:`PILOT_SHARE` of the time left), then the collapsed path's
    kernel on the model under :class:`~.pilot_map.sinh_arcsinh_map` fitted to the pilot's
    draws, from each chain's last pilot state, NUTS on the map's standard normal coordinates
    (unit metric, the step size adapted in :data:`WARMUP_STEPS_FIXED_METRIC` steps).

    Both runs are runs of one kernel on the mapped model: the pilot's map is
    :func:`~.pilot_map.linear_map` of the Laplace metric (NUTS with the unit metric on its
    coordinates is NUTS with that metric), the map the kernel's
    :class:`~.extend.ProgramData`, so the second run steps the program compiled for the
    first."""
    k_pilot, k_run = jax.random.split(rng_key)
    deadline, plan, chains = setting["deadline"], setting["plan"], setting["num_chains"]
    found = chosen.found
    loc = ravel_pytree(found.mode)[0]
    the_map = ProgramData(linear_map(loc, jnp.linalg.cholesky(found.inverse_mass_matrix)))
    unit = {"dense_mass": False, "adapt_mass_matrix": False}
    mapped_model = sinh_arcsinh_map(model, the_map, found.mode)
    kernel = _collapsed_kernel(mapped_model, ChosenMetric("pilot", unit, None, found),
                               **setting)
    kernel.program_data = the_map

    def mapped_starts(z: Array, **others: Array) -> dict[str, Array]:
        """Each chain's start (``z``: (chains, D), unconstrained) on the map's coordinates."""
        out = {MAPPED_SITE: jax.vmap(functools.partial(map_inverse, the_map.value))(z),
               **others}
        return out if chains > 1 else {k: v[0] for k, v in out.items()}

    laplace = ChosenMetric("laplace", unit, mapped_starts(
        jax.vmap(lambda s: ravel_pytree(s)[0])(chosen.starts) if chains > 1
        else ravel_pytree(chosen.starts)[0][None]), found)
    pilot_deadline = (None if deadline is None else
                      time.perf_counter() + PILOT_SHARE * (deadline - time.perf_counter()))
    began = time.perf_counter()
    pilot = _collapsed_run(mapped_model, k_pilot, laplace,
                           **{**setting, "num_samples": pilot_draws(setting["num_samples"]),
                              "deadline": pilot_deadline},
                           kernel=kernel)
    pilot.seconds, began = time.perf_counter() - began, time.perf_counter()
    grouped = pilot.get_samples(group_by_chain=True)
    # z = loc + L u under the linear map: the pilot's draws of the model's sites, flattened
    z = loc + grouped[MAPPED_SITE] @ the_map.value.chol.T
    rows, team = z.reshape(-1, loc.size), current_team()
    if team is not None:  # every process's pilot draws, for one map (chain_method="processes")
        rows = team.pool(np.asarray(rows))
    the_map.value = fit_sinh_arcsinh(rows, loc, the_map.value.chol)
    mapped = ChosenMetric("pilot", unit, mapped_starts(
        z[:, -1], **{f"{s.name}_v": grouped[f"{s.name}_v"][:, -1] for s in plan.sites
                     if s.laplace.size}), found)
    map_seconds = time.perf_counter() - began
    mcmc = _collapsed_run(mapped_model, k_run, mapped, **setting, kernel=kernel)
    pilot.model = mcmc.model = model
    mcmc.pilot, mcmc.pilot_map, mcmc.map_seconds = pilot, the_map.value, map_seconds
    return mcmc


def _run_user_exact(model: Callable[..., Any], rng_key: Array, model_args: tuple,
                    model_kwargs: dict, counts: tuple, others: tuple, values: Mapping,
                    *, num_warmup: int, num_samples: int, num_chains: int, method: str,
                    progress_bar: bool, radius: float, target_accept_prob: float,
                    dense_mass: bool | None, max_tree_depth: int, gibbs_moves: int | None,
                    deadline: float | None, warmup_callback: Callable | None,
                    joint_fn: Callable | None = None) -> MCMC:
    """A model with exact CGM sites (the library's among them): NUTS within Gibbs with record
    moves (:class:`~.count_gibbs.CGMGibbs`, with ``joint_fn`` after every sweep), or the
    record moves alone where no other site is latent."""
    if others:
        others_values = {k: v for k, v in values.items() if k not in counts}
        inner = NUTS(model, init_strategy=init_to_interior(values=others_values, radius=radius),
                     target_accept_prob=target_accept_prob, dense_mass=bool(dense_mass),
                     max_tree_depth=max_tree_depth)
        kernel = CGMGibbs(inner, moves=gibbs_moves, joint_fn=joint_fn)
        fields = ("diverging",) + NUTS_FIELDS
    else:
        kernel, fields = RecordMoves(model, moves=gibbs_moves), ("diverging",)
    # neither kernel starts from a batch of keys: vectorised chains run one after another
    mcmc = MCMC(kernel, num_warmup=_warmup(num_warmup, None), num_samples=num_samples,
                num_chains=num_chains,
                chain_method=chain_method_for(
                    "sequential" if method == "vectorized" else method, num_chains, progress_bar),
                progress_bar=progress_bar, progress_rate=1)
    init_params = {k: values[k] for k in counts if k in values} or None
    _sample(mcmc, rng_key, model_args, model_kwargs, fields, init_params, deadline,
            warmup_callback)
    mcmc.path, mcmc.model, mcmc.batches, mcmc.fields = "exact", model, 0, fields
    mcmc.path_reason = (f"the model's site(s) {', '.join(map(repr, counts))} are exact CGM "
                        "tables: record moves on them" + (
                            f" within Gibbs, NUTS on {', '.join(map(repr, others))}"
                            if others else ""))
    return mcmc


def _figures(mcmc: MCMC, model: Any, max_tree_depth: int) -> Any:
    """The run's :class:`~.checks.ConvergenceFigures` over every parameter and latent cell
    (:func:`_checked_draws`)."""
    return _figures_of(_checked_draws(mcmc, model), max_tree_depth)


def _figures_of(draws: dict[str, Any], max_tree_depth: int) -> Any:
    """:class:`~.checks.ConvergenceFigures` of :func:`_checked_draws`'s ``draws``."""
    return convergence_figures(draws["samples"], list(draws["samples"]),
                               draws.get("num_steps"), max_tree_depth, draws.get("diverging"))


def _checked_draws(mcmc: MCMC, model: Any) -> dict[str, Any]:
    """The draws the convergence checks read, grouped by chain: ``"samples"`` of every
    parameter and latent cell (``φ``, ``θ`` and ``n`` of the library's model, ``n`` where ``θ``
    is fixed; every site of a model of your own but the collapsed path's auxiliary ``ξ`` and
    ``v`` and the noise's location ``mu``, a function of the tables) and NUTS's
    ``"num_steps"`` and ``"diverging"`` where the run has them."""
    samples = mcmc.get_samples(group_by_chain=True)
    if isinstance(model, NoisyMarginalsModel):
        sites = ["phi", "theta", "n"] if model.theta is None else ["n"]
    else:
        plan = getattr(mcmc, "collapse_plan", None)
        auxiliary = set() if plan is None else {f"{s.name}_{a}" for s in plan.sites
                                                for a in ("xi", "v")}
        auxiliary.add(MAPPED_SITE)
        sites = [k for k in samples if k != "mu" and k not in auxiliary]
    extra = mcmc.get_extra_fields(group_by_chain=True)
    draws = {"samples": {k: samples[k] for k in sites if k in samples}}
    draws.update({k: extra[k] for k in ("num_steps", "diverging") if k in extra})
    return draws


def _notes(mcmc: MCMC) -> dict[str, Any]:
    """What a process of a team says of its run besides its draws: its warm-up steps, draws
    held, seconds per draw of its chains and its phases' seconds (``None`` where not run)."""
    pilot = getattr(mcmc, "pilot", None)
    return {"warmup_steps": tuple(mcmc.warmup_steps), "draws": draws_held(mcmc),
            "draw_pace": getattr(mcmc, "draw_pace", None),
            **{k: getattr(mcmc, k, None) for k in ("warmup_seconds", "draws_seconds",
                                                    "batches_seconds", "map_seconds")},
            "pilot_seconds": getattr(pilot, "seconds", None),
            "laplace_seconds": getattr(mcmc.laplace, "seconds", None)}


def _join(mcmc: MCMC, leader: Leader) -> None:
    """The team's draws in ``mcmc``: every member's chains after this process's;
    ``mcmc.team_notes`` what each process said of its run (:func:`_notes`), this one's first."""
    own = _notes(mcmc)
    mcmc._states, notes = leader.join(mcmc._states)
    mcmc.team_notes = [own, *notes]
    mcmc._states_flat, mcmc._last_state = None, None
    mcmc.num_chains = int(jax.tree.leaves(mcmc._states)[0].shape[0])
    mcmc.warmup_steps = tuple(mcmc.warmup_steps) + sum((n["warmup_steps"] for n in notes), ())
    mcmc.processes = leader.size


def _run_team(model: Any, rng_key: Array, model_args: tuple, model_kwargs: dict,
              settings: dict[str, Any]) -> MCMC:
    """``chain_method="processes"``: the chains shared out over a process per core
    (:mod:`.team`), each process with a key of its own and the same wall-clock deadline."""
    shares = chain_shares(settings["num_chains"], len(team_cores()))
    keys = jax.random.split(rng_key, len(shares))
    if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        keys = jax.random.key_data(keys)
    keys = np.asarray(keys)
    wall = deadline_in(settings["time_limit"])
    own = {**settings, "num_chains": shares[0], "chain_method": "sequential"}
    if len(shares) == 1:
        return run_nuts(model, keys[0], *model_args, **own, **model_kwargs)
    runs = [functools.partial(_member_run, model, keys[i], model_args, model_kwargs,
                              {**own, "num_chains": shares[i], "progress_bar": False,
                               "check": False, "callback": None, "warmup_callback": None},
                              wall)
            for i in range(1, len(shares))]
    with warnings.catch_warnings(record=True) as caught:  # said again where run_nuts was called
        warnings.simplefilter("always")
        with lead(runs):
            mcmc = run_nuts(model, keys[0], *model_args,
                            **{**own, "time_limit": seconds_to(wall)}, **model_kwargs)
    for w in caught:
        warnings.warn(w.message, w.category, stacklevel=3)
    return mcmc


def _member_run(model: Any, rng_key: Array, model_args: tuple, model_kwargs: dict,
                settings: dict[str, Any], wall: float | None) -> None:
    """A team member's share of :func:`_run_team`'s run (in its own process)."""
    run_nuts(model, rng_key, *model_args, **{**settings, "time_limit": seconds_to(wall)},
             **model_kwargs)


def _check(mcmc: MCMC, model: Any, path: str) -> None:
    warn_convergence(mcmc.convergence, path, stacklevel=6)
    samples = mcmc.get_samples(group_by_chain=True)
    if path == "relaxed" and isinstance(model, NoisyMarginalsModel) and "theta" in samples:
        theta = np.asarray(samples["theta"])
        leaks = posterior_leak(model, theta.reshape((-1,) + theta.shape[2:]))
        warn_relaxed_leak(leaks, float(model.total_count), stacklevel=6)
