"""``dpgm fit``: a graphical model (a point estimate or posterior draws) from a measurements
file, written as a model file."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ._common import Force, check_output, console, enable_x64, err_console, input_errors
from ._progress import mcmc_progress, show_progress

#: The point estimators come from the estimators' registry; ``nuts`` gives posterior draws.
#: The estimators' command-line names, in the registry's order (``estimation.ESTIMATORS``,
#: which ``tests/test_cli.py`` checks this against), and nuts. Spelled out so that ``dpgm --help``
#: does not import JAX.
ESTIMATOR_NAMES = ("naive", "cgm-em", "variational-em", "mcem", "prox-pgm", "posterior-mean")
METHODS = (*ESTIMATOR_NAMES, "nuts", "laplace")

#: Posterior draws from ``--method laplace`` by default (``--iters`` sets them).
LAPLACE_DRAWS = 1000

#: ``--path`` of ``--method nuts``: ``run_nuts``'s ``exact`` and ``collapsed`` arguments
#: (``normal``: the relaxed path on the normal relaxation, ``relaxation="normal"``).
NUTS_PATHS = {"auto": (None, None), "exact": (True, False), "relaxed": (False, False),
              "normal": (False, False), "collapsed": (None, True)}

#: ``--metric``'s choices: :data:`numpyro_dpgm.infer.bayes.nuts.NUTS_METRICS` (not imported
#: here, to keep the command's start light).
NUTS_METRICS = ("pilot", "laplace", "adapt")


#: The values of the nuts-only options when not given (they are refused with other methods).
NUTS_DEFAULTS = {"--chains": 2, "--time-limit": 600.0, "--target-accept": 0.8,
                 "--keep-draws": 1000, "--path": "auto", "--metric": None}


def _registry() -> dict:
    """The estimators' registry, imported when a fit runs."""
    from ..estimation import ESTIMATORS

    return ESTIMATORS

#: ``--stop`` of ``--method prox-pgm`` (``prox_pgm``'s ``stop``; spelled out, as above).
STOP_RULES = ("auto", "optimum", "risk", "discrepancy")

#: Estimators that take randomness (``--seed`` gives their ``rng_key``).
STOCHASTIC = ("mcem", "variational-em", "posterior-mean")


def _file_sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def fit(
    measurements: Annotated[Path, typer.Argument(help="measurements file from `dpgm release`")],
    out: Annotated[Path, typer.Option("--out", "-o", help="model file to write (JSON)")],
    method: Annotated[str, typer.Option(
        help=f"{', '.join(ESTIMATOR_NAMES)} (point estimates), nuts (posterior draws of the "
             "model given the noisy tables, for `dpgm synth --posterior`) or laplace (draws "
             "of a Laplace approximation of that posterior: seconds where NUTS takes "
             "minutes, its intervals approximate)")] = "cgm-em",
    iters: Annotated[int | None, typer.Option(
        help="iterations: the estimator's max_iters (EM iterations for cgm-em, a regulariser; "
             "default: the count of least estimated risk; mcem and variational-em, default "
             "10; mirror-descent iterations for prox-pgm, default 1000; L-BFGS iterations "
             "for naive, default 10000, a bound; "
             "SVI steps for posterior-mean, default 2000), NUTS draws per chain for nuts "
             "(default 500, after as many warm-up steps), draws for laplace (default "
             f"{LAPLACE_DRAWS})")] = None,
    chains: Annotated[int | None, typer.Option(
        help="nuts only: NUTS chains, run in parallel, one CPU device each (default 2)")] = None,
    time_limit: Annotated[float | None, typer.Option(
        help="nuts only: seconds from the command's start within which to keep drawing "
             "batches of --iters more draws per chain (no new warm-up) while some parameter's "
             "split R-hat is above 1.01 or its bulk ESS below 400; 0 for exactly --iters "
             "draws (default 600)")] = None,
    target_accept: Annotated[float | None, typer.Option(
        help="nuts only: NUTS's target acceptance probability, which sets its step size; raise "
             "it (e.g. 0.95) where draws diverge (default 0.8)")] = None,
    keep_draws: Annotated[int | None, typer.Option(
        help="nuts only: posterior draws kept in the model file, evenly spaced over every "
             "chain's draws (R-hat and ESS are computed on all of them); 0 keeps all (default "
             "1000)")] = None,
    path: Annotated[str | None, typer.Option(
        help="nuts only: exact (an exact Gibbs update of the latent count tables inside NUTS), "
             "relaxed (the continuous relaxation of the counts), normal (the normal relaxation: "
             "the counts' mean and covariance, no mass moved into near-empty cells), collapsed "
             "(the normal relaxation's counts integrated out of the parameters' update: mixes "
             "on large releases), or auto (the default: collapsed on a release of 150 to 1,200 "
             "coordinates with at least 10 records per cell of its largest table; else exact "
             "where the relaxation would leak over 1 % of the records into near-empty cells, "
             "or where the release pins the counts: the noise's share of the median released "
             "count below 7.5 %)")] = None,
    metric: Annotated[str | None, typer.Option(
        help="nuts only, the collapsed path: pilot (the default there: a pilot run with the "
             "curvature at the posterior's mode as NUTS's metric, then NUTS through a "
             "sinh-arcsinh map of each coordinate fitted to the pilot's draws, which follows "
             "the tails of nearly empty cells that the curvature does not see), laplace (the "
             "curvature alone) or adapt (NumPyro's adaptation in warm-up)")] = None,
    coding: Annotated[str, typer.Option(
        help="nuts only: the parameters the Normal prior sits on: reference (log-linear log "
             "odds against each attribute's level 0) or conditional (log odds of the junction "
             "tree's conditionals against each attribute's most frequent released level; "
             "decomposable networks; given the tables its blocks are independent, so NUTS needs "
             "no deep trees there), or auto (conditional where the released cliques form a "
             "decomposable network, else reference)")] = "auto",
    stop: Annotated[str | None, typer.Option(
        help="prox-pgm only: auto (default: risk where the path reaches the noise level "
             "within a third of the iterations, else optimum), optimum (the minimiser of the "
             "loss), risk (the mirror-descent path's iterate of least estimated error, Stein's "
             "unbiased risk estimate) or discrepancy (the path stopped at the noise "
             "level)")] = None,
    seed: Annotated[int, typer.Option(
        help="seed of the stochastic methods (nuts, mcem, variational-em, "
             "posterior-mean)")] = 0,
    total: Annotated[float | None, typer.Option(
        help="number of records N if public (default: the file's, else estimated from the "
             "noisy tables, which costs no privacy)")] = None,
    force: Force = False,
) -> None:
    """Fit a graphical model over the released cliques: writes a model file."""
    started = time.perf_counter()
    from ..infer.bayes.model import CODINGS
    from ..io import load_measurements, save_model
    from ..measurements import estimate_total
    from ..network import MarkovNetwork

    with input_errors():
        if method not in METHODS:
            raise ValueError(f"unknown --method {method!r}; choose one of {list(METHODS)} (the "
                             "estimators' registry, numpyro_dpgm.estimation.ESTIMATORS, nuts "
                             "and laplace)")
        if iters is not None and iters < 1:
            raise ValueError(f"--iters must be at least 1, got {iters}")
        if total is not None and not total > 0:
            raise ValueError(f"--total must be positive, got {total}")
        nuts_only = {"--chains": chains, "--time-limit": time_limit,
                     "--target-accept": target_accept, "--keep-draws": keep_draws,
                     "--path": path, "--metric": metric}
        given = [name for name, value in nuts_only.items() if value is not None]
        if given and method != "nuts":
            raise ValueError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to "
                             f"--method nuts only, not {method}")
        chains, time_limit, target_accept, keep_draws, path, metric = (
            NUTS_DEFAULTS[k] if v is None else v for k, v in nuts_only.items())
        if chains < 1:
            raise ValueError(f"--chains must be at least 1, got {chains}")
        if not time_limit >= 0:
            raise ValueError(f"--time-limit must be 0 or more seconds, got {time_limit}")
        if keep_draws < 0:
            raise ValueError(f"--keep-draws must be 0 (all) or more, got {keep_draws}")
        if not 0 < target_accept < 1:
            raise ValueError(f"--target-accept must lie strictly between 0 and 1, got "
                             f"{target_accept}")
        if method == "nuts":
            _device_per_chain(chains)
        if path not in NUTS_PATHS:
            raise ValueError(f"unknown --path {path!r}; choose one of {list(NUTS_PATHS)}")
        if metric is not None and metric not in NUTS_METRICS:
            raise ValueError(f"unknown --metric {metric!r}; choose one of {list(NUTS_METRICS)}")
        if coding not in CODINGS:
            raise ValueError(f"unknown --coding {coding!r}; choose one of {list(CODINGS)}")
        if coding != "auto" and method != "nuts":
            raise ValueError(f"--coding applies to --method nuts only, not {method}")
        if stop is not None and method != "prox-pgm":
            raise ValueError(f"--stop applies to --method prox-pgm only, not {method}")
        if stop is not None and stop not in STOP_RULES:
            raise ValueError(f"unknown --stop {stop!r}; choose one of {list(STOP_RULES)}")
        check_output(out, force=force, inputs=(measurements,))
        saved = load_measurements(measurements)
        cliques = list(dict.fromkeys(m.clique for m in saved.measurements))
        if not cliques:
            raise ValueError(f"{measurements} holds no measurements")
        measured = [a for a in saved.domain.attrs if any(a in c for c in cliques)]
        network = MarkovNetwork(saved.domain.project(measured), cliques)
        unmeasured = [a for a in saved.domain.attrs if a not in measured]
        n_source = "given" if total is not None else ("public" if saved.total else "estimated")
        n = total or saved.total or float(estimate_total(saved.measurements))
        enable_x64()
        t0 = time.perf_counter()
        if method == "nuts":
            result, options = _run_nuts(saved.measurements, network, n, iters or 500, chains,
                                        seed, path, coding, time_limit, keep_draws,
                                        started, target_accept, metric)
        elif method == "laplace":
            result, options = _run_laplace(saved.measurements, network, n,
                                           iters or LAPLACE_DRAWS, seed)
        else:
            # an estimated N is the estimator's own (rounded where latent counts need an integer)
            result, options = _run_fit(method, saved.measurements, network,
                                       None if n_source == "estimated" else n, iters, seed,
                                       stop)
            n = float(result.extras["total_count"])
        elapsed = time.perf_counter() - t0
        provenance = {
            "estimator": ({"nuts": "run_nuts", "laplace": "run_laplace"}[method]
                          if method in ("nuts", "laplace") else _registry()[method].__name__),
            "options": options,
            "total": n,
            "total_source": n_source,
            "measurements_file": str(measurements),
            "measurements_sha256": _file_sha256(measurements),
            "privacy": None if saved.ledger is None else saved.ledger.guarantee(),
        }
        # the whole domain goes into the model file: attributes in no released table have no
        # parameters there, and `dpgm synth` draws them uniformly (or drops them on request)
        save_model(out, result, categories=saved.categories, total=n, provenance=provenance,
                   domain=saved.domain)
    if method == "nuts":
        more = (f", then {options['batches']} further batch(es) of {options['warmup']} draws "
                "per chain to converge" if options["batches"] else "")
        summary = (f"{options['draws']} posterior draws ({chains} chain(s){more}, "
                   f"{options['path']} path: {options['path_reason']}), worst R-hat "
                   f"{options['max_rhat']:.3f}, "
                   f"smallest bulk ESS {options['min_ess_bulk']:.0f}, "
                   f"{options['divergences']} divergences, {options['max_depth_hits']} draws at "
                   "the maximum tree depth")
        if options["draws_kept"] < options["draws"]:
            summary += (f"; the model file keeps {options['draws_kept']} of the "
                        f"{options['draws']} draws, evenly spaced (--keep-draws)")
    elif method == "laplace":
        from ..infer.bayes.laplace import MEASURED_COVERAGE

        summary = (f"{options['draws']} draws of the Laplace approximation (its mode found in "
                   f"{options['iterations']} L-BFGS iterations"
                   f"{'' if options['mode_converged'] else ', not converged'}); "
                   f"{MEASURED_COVERAGE}")
    else:
        summary = f"{result.iterations} iterations, {_stop_status(result)}"
    console.print(f"fitted {method} on {len(saved.measurements)} tables "
                  f"({network.num_params} parameters, N = {n:.6g} {n_source}): "
                  f"{summary}, {elapsed:.2f} s", soft_wrap=True, highlight=False)
    if unmeasured:
        console.print(f"attributes in no released table are not modelled: {unmeasured}; the "
                      "model file keeps them, and `dpgm synth` draws them uniformly over their "
                      "values (--drop-unmodelled leaves them out)",
                      soft_wrap=True, highlight=False)
    console.print(f"wrote {out}", soft_wrap=True, highlight=False)


def _stop_status(result: Any) -> str:
    """Why a fit stopped, from its ``converged`` flag and the estimator's ``stop_reason`` and
    ``kept_start`` extras where it reports them."""
    selected = result.extras.get("selected_iteration")
    if selected is not None:
        what = (f"least estimated risk at iteration {selected}" if result.converged
                else f"iteration limit reached, least estimated risk so far at iteration "
                     f"{selected}")
        return f"{what} (stopped by {result.extras['stopped_by']})"
    if result.extras.get("stop") == "risk":
        return (f"{result.iterations} iteration(s), the count of least estimated risk for the "
                f"{result.extras['target']}'s tables")
    if result.extras.get("risk_path_iterations"):
        spent = (f"; the risk path had not reached the noise level after "
                 f"{result.extras['risk_path_iterations']} iterations")
        return ("converged" if result.converged else "iteration limit reached") + spent
    if result.converged:
        return "converged"
    if result.extras.get("kept_start"):
        return "not converged, ended worse than its start (the start is kept)"
    reason = result.extras.get("stop_reason", "iteration limit")
    return "iteration limit reached" if reason == "iteration limit" else f"not converged ({reason})"


def _device_per_chain(chains: int) -> None:
    """One CPU device per NUTS chain, so that ``run_nuts`` runs the chains in parallel: JAX's
    ``jax_num_cpu_devices``, set before JAX starts its backends unless set already (here or by
    ``XLA_FLAGS``); where JAX has started (the command called inside a running program), the
    chains run one after another."""
    import os

    import jax

    if (chains < 2 or jax.config.jax_num_cpu_devices >= 0
            or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")):
        return
    try:
        jax.config.update("jax_num_cpu_devices", chains)
    except RuntimeError:  # JAX's backends have started
        pass


def _run_nuts(measurements: list[Any], network: Any, total: float, draws: int, chains: int,
              seed: int, path: str = "auto", coding: str = "auto",
              time_limit: float = 0.0, keep_draws: int = 0,
              started: float | None = None,
              target_accept: float = 0.8,
              metric: str | None = None) -> tuple[Any, dict[str, Any]]:
    """Posterior draws of the record model (:func:`numpyro_dpgm.infer.bayes.run_nuts`) as one
    batched MarkovRandomField, with the path that ran and the convergence figures the provenance
    keeps (``run_nuts`` warns, naming the remedy, where they fall short); with ``time_limit``,
    batches of ``draws`` more per chain until converged or out of time (counted from
    ``started``, a :func:`time.perf_counter` time, default now); at most ``keep_draws`` draws
    (0: all), evenly spaced over the chains' draws, go into the model."""
    import jax
    import numpy as np

    from ..estimation.cgm_em import em_start
    from ..infer.bayes import noisy_marginals_model, run_nuts
    from ..infer.bayes.paths import choose_path
    from ..synthesis import posterior_models

    if coding == "conditional" and not network.is_decomposable:
        raise ValueError("--coding conditional needs a decomposable network (the released "
                         "cliques must be those of a chordal graph); use --coding reference")
    bayes = noisy_marginals_model(network, measurements, int(round(total)),
                                  triangulate=not network.is_decomposable, coding=coding,
                                  reference="released" if coding == "conditional" else None,
                                  relaxation="normal" if path == "normal" else "lgamma")
    start = em_start(bayes)
    # the path is chosen here, so that progress says which one runs from its first line
    exact, collapsed = NUTS_PATHS[path]
    chosen, reason = choose_path(bayes, exact, bayes.starting_point(start), collapsed)
    if metric in ("laplace", "pilot") and chosen != "collapsed":
        raise ValueError(f"--metric {metric} is the collapsed path's; this release takes the "
                         f"{chosen} path (--path collapsed, or --metric adapt)")
    err_console.print(f"NUTS path: {chosen} ({reason})", highlight=False, soft_wrap=True)
    if chosen == "normal":
        bayes = bayes.with_relaxation("normal")
    until = (f", then batches of {draws} more until converged (up to {time_limit:g} s)"
             if time_limit else "")
    limit = _left(time_limit, started)
    with mcmc_progress(f"NUTS, {chosen} path: {chains} chain(s) × ({draws} warm-up + {draws} "
                        f"draws){until}") as bar:
        mcmc = run_nuts(bayes, jax.random.key(seed), num_warmup=draws, num_samples=draws,
                        num_chains=chains, init=start, progress_bar=bar,
                        target_accept_prob=target_accept, metric=metric,
                        exact=chosen == "exact", collapsed=chosen == "collapsed",
                        time_limit=limit,
                        callback=_batch_lines(time.perf_counter() + (limit or 0.0)),
                        warmup_callback=_warmup_lines())
    figures = mcmc.convergence
    models = posterior_models(mcmc, network)
    drawn = models.batch_shape[0]
    if keep_draws and drawn > keep_draws:
        kept = np.round(np.linspace(0, drawn - 1, keep_draws)).astype(int)
        models = type(models)(models.network, models.theta[kept], method=models.method)
    options = {"draws": drawn, "draws_kept": models.batch_shape[0],
               "warmup": draws, "chains": chains, "seed": seed,
               "target_accept": target_accept,
               "time_limit": time_limit, "batches": mcmc.batches,
               "chain_method": str(mcmc.chain_method),
               "coding": bayes.coding.name, "path": mcmc.path, "path_reason": reason,
               "metric": mcmc.metric,
               "relaxation": mcmc.model.relaxation if mcmc.path != "exact" else None,
               "max_rhat": figures.max_r_hat, "min_ess_bulk": figures.min_ess_bulk,
               "max_depth_hits": figures.max_depth_hits, "divergences": figures.divergences}
    return models, options


def _run_laplace(measurements: list[Any], network: Any, total: float, draws: int,
                 seed: int) -> tuple[Any, dict[str, Any]]:
    """Draws of the Laplace approximation of the record model's collapsed posterior
    (:func:`numpyro_dpgm.infer.bayes.laplace.run_laplace`) as one batched MarkovRandomField."""
    import jax

    from ..infer.bayes import noisy_marginals_model, run_laplace
    from ..synthesis import posterior_models

    if draws < 2:
        raise ValueError(f"--iters (draws) must be at least 2 for --method laplace, got {draws}")
    if not network.is_decomposable:
        raise ValueError("--method laplace integrates the tables out along a junction tree: it "
                         "needs the released cliques of a chordal graph; use --method nuts")
    bayes = noisy_marginals_model(network, measurements, int(round(total)),
                                  coding="conditional", reference="released")
    err_console.print(f"Laplace approximation of the posterior, {draws} draws",
                      highlight=False, soft_wrap=True)
    fit = run_laplace(bayes, jax.random.key(seed), num_samples=draws)
    options = {"draws": draws, "seed": seed, "path": fit.path, "path_reason": fit.path_reason,
               "coding": bayes.coding.name, "mode_converged": fit.converged,
               "iterations": fit.laplace.iterations}
    return posterior_models(fit, network), options


def _left(time_limit: float, started: float | None) -> float | None:
    """``run_nuts``'s ``time_limit``: what is left of ``time_limit`` seconds since ``started``
    (``None``, exactly the first draws, for ``0``)."""
    if not time_limit:
        return None
    spent = 0.0 if started is None else time.perf_counter() - started
    return max(time_limit - spent, 0.0)


#: Seconds between two warm-up progress lines under ``--time-limit``.
WARMUP_LINE_EVERY = 10.0


def _warmup_lines() -> Any:
    """``run_nuts``'s ``warmup_callback`` under ``--time-limit``: a line with the steps done
    and the time left, at most every :data:`WARMUP_LINE_EVERY` seconds and at a chain's end."""
    last = [time.perf_counter()]

    def line(chain: int, done: int, total: int, left: float) -> None:
        now = time.perf_counter()
        if now - last[0] < WARMUP_LINE_EVERY and done < total:
            return
        last[0] = now
        err_console.print(f"warm-up, chain {chain + 1}: {done} of {total} steps, "
                          f"{max(left, 0.0):.0f} s left of its share of the time limit",
                          highlight=False, soft_wrap=True)

    return line


def _batch_lines(deadline: float) -> Any:
    """``run_nuts``'s ``callback``: a line before each further batch of NUTS draws, where the
    run stands and the time left before ``deadline`` (a :func:`time.perf_counter` time)."""

    def line(mcmc: Any, batch: int) -> None:
        fig = mcmc.convergence
        left = max(deadline - time.perf_counter(), 0.0)
        err_console.print(f"after {fig.num_draws} draws: worst R-hat {fig.max_r_hat:.3f}, "
                          f"smallest bulk ESS {fig.min_ess_bulk:.0f} (aim: ≤ 1.01 and ≥ 400); "
                          f"batch {batch} of {mcmc.num_samples} more draws per chain, "
                          f"{left:.0f} s left of the time limit", highlight=False,
                          soft_wrap=True)

    return line


def _run_fit(method: str, measurements: list[Any], network: Any, total: float | None,
             iters: int | None, seed: int,
             stop: str | None = None) -> tuple[Any, dict[str, Any]]:
    """The registered estimator ``method`` with the contract's options: ``--iters`` is its
    ``max_iters`` (its own default when not given), progress comes through ``callback``;
    ``stop`` is Prox-PGM's stopping rule."""
    import inspect

    import jax

    estimator = _registry()[method]
    limit = iters or inspect.signature(estimator).parameters["max_iters"].default
    options: dict[str, Any] = {"max_iters": limit}
    if method in STOCHASTIC:
        options["seed"] = seed
    extra = {} if stop is None else {"stop": stop}
    options.update(extra)
    with show_progress(method, None if isinstance(limit, str) else limit) as advance:
        result = estimator(measurements, network, total_count=total, rng_key=jax.random.key(seed),
                           max_iters=limit, callback=lambda i, _loss: advance(int(i)), **extra)
    return result, options
