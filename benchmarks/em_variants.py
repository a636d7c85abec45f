"""EM from the posterior mean of the counts against naive MLE and MAP-EM (seed 002's models).

Models (seed 002, §4.1, :func:`benchmarks.workloads.seed002_release`): 10 nodes with
``--values`` values each (the paper: 10), pairwise potentials ``θ_e = log w``,
``w ~ Dirichlet(1)`` on every edge of the third-order chain (``chain3``, 24 edges) or of one
connected ER graph (``er``). For every
model, ``N``, ε and population (``--trials``): ``N`` records are drawn, every edge table is
released with Laplace noise ``b = |E|/ε`` (the JAX simulation sampler), and every estimator is
fitted:

- ``naive``: naive MLE with its default rule ``λ = max(b/N, 1e-4)``;
- ``naive_oracle``: naive MLE with the best λ of the grid ``b/N × 2^k``, k = −3..4, chosen with
  the *true* KL (a reference no release can compute; its time is one fit's);
- ``map_em``: CGM-EM with its defaults (10 NLBP-EM iterations of 15 steps from the naive fit);
- ``map_em_conv``: CGM-EM run to convergence (up to ``--conv-iters`` iterations from θ = 0);
- ``vem``: variational EM (AutoNormal guide over the relaxed CGM counts, alternating SVI and
  moment matching), from the naive start;
- ``mcem``: Monte-Carlo EM (NUTS draws of the counts, warm-started), from the naive start;
- ``mcem_exact``: Monte-Carlo EM on the exact CGM (record-swap draws of the integer tables,
  the records kept across E-steps), from the naive start, with ``mcem``'s draws per E-step;
- ``post_mean``: the max-ent model of the posterior mean of the marginals (Normal(0, 3²) prior
  on reference-coded parameters; SVI with a mean-field guide).

Reported per fit: KL(p_true ‖ p_fit) (exact, junction tree), wall time after compilation and
its ratio to naive's, with the load average. Compiled programs depend on the release's
structure and ``N`` (the variational guide's transforms hold ``N``), not on the noise scale, so
every estimator is first fitted once, untimed, on another population at each model and ``N``
(``--warm-every-cell``: before every cell).
The target (issue 12): in every cell some new estimator (vem, mcem, post_mean) has lower KL than
naive_oracle in every population at ≤ 20× naive's time.

Run ``python -m benchmarks em_variants [--trials K] [--Ns ...] [--epsilons ...] [--values V]
[--models ...] [--out DIR]``; writes ``em_variants.json``, ``em_variants.csv`` and
``em_variants.md`` (:func:`summary_markdown`) after every population. ``--merge A.json B.json
...`` runs nothing and merges earlier runs (a grid split across commands). Every row also
carries ``leak``: the largest :func:`~numpyro_dpgm.distributions.relaxation.relaxation_leak` of
the triangulated tables at the naive MLE, the fraction of ``N`` the relaxed CGM moves into
near-empty cells where the new estimators start.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from .harness import add_out_argument, load_1min, platform_summary, write_results
from .workloads import seed002_release

DESCRIPTION = ("variational EM, Monte-Carlo EM and the posterior mean vs naive MLE and MAP-EM "
               "on third-order chains and ER graphs: KL and time")

NEW = ("vem", "mcem", "mcem_exact", "post_mean")
ORACLE_GRID = tuple(2.0 ** k for k in range(-3, 5))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=5, help="populations per cell")
    parser.add_argument("--Ns", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--models", nargs="+", default=["chain3", "er"])
    parser.add_argument("--values", type=int, default=10, help="values per attribute")
    parser.add_argument("--estimators", nargs="+",
                        default=["naive", "naive_oracle", "map_em", "map_em_conv", *NEW])
    parser.add_argument("--em-iters", type=int, default=10, help="EM iterations of vem, mcem")
    parser.add_argument("--conv-iters", type=int, default=200)
    parser.add_argument("--svi-steps", type=int, default=300)
    parser.add_argument("--warm-every-cell", action="store_true",
                        help="fit an untimed population before every cell, not only before a "
                             "model's first ε at each N (compiled programs are shared across ε)")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                        help="run nothing: merge the rows of earlier runs' em_variants.json "
                             "(same model, seed, N, ε: fields of later files win) into --out")
    add_out_argument(parser, "em_variants")


def _fitters(args: argparse.Namespace, net: Any, meas: Any, n: int, b: float,
             truth: Any) -> dict[str, Any]:
    from numpyro_dpgm.estimation import cgm_em, naive_mle
    from numpyro_dpgm.estimation.mcem import mcem
    from numpyro_dpgm.estimation.posterior_mean import posterior_mean
    from numpyro_dpgm.estimation.variational_em import variational_em

    k = args.em_iters
    key = jax.random.key(0)  # the stochastic fits' key (the value they used by default before)
    return {
        "naive": lambda: naive_mle(meas, net, total_count=n),
        "naive_oracle": lambda: _oracle(meas, net, n, b, truth),
        "map_em": lambda: cgm_em(meas, net, total_count=n),
        "map_em_conv": lambda: cgm_em(meas, net, total_count=n, max_iters=args.conv_iters,
                                      init="zeros"),
        "vem": lambda: variational_em(meas, net, total_count=n, rng_key=key, max_iters=k,
                                      first_steps=args.svi_steps,
                                      steps=max(args.svi_steps // 3, 1), mean_draws=64),
        "mcem": lambda: mcem(meas, net, total_count=n, rng_key=key, max_iters=k, num_warmup=100,
                             first_draws=10, last_draws=80, max_tree_depth=6, chunk=10),
        "mcem_exact": lambda: mcem(meas, net, total_count=n, rng_key=key, max_iters=k,
                                   counts="exact", first_draws=10, last_draws=80, chunk=10),
        "post_mean": lambda: posterior_mean(meas, net, total_count=n, rng_key=key,
                                            max_iters=4 * args.svi_steps, svi_draws=64),
    }


def _oracle(meas: Any, net: Any, n: int, b: float, truth: Any) -> Any:
    """Naive MLE at the grid λ with the lowest true KL; its time is that of one fit."""
    from numpyro_dpgm.estimation import naive_mle
    from numpyro_dpgm.metrics import kl_divergence

    best, best_kl = None, np.inf
    for s in ORACLE_GRID:
        fit = naive_mle(meas, net, total_count=n, l2=max(s * b / n, 1e-4))
        kl = float(kl_divergence(truth, fit.model))
        if kl < best_kl:
            best, best_kl = fit._replace(extras=dict(fit.extras, grid_scale=s)), kl
    return best


def _leak(net: Any, meas: Any, n: int) -> float:
    """Largest relaxation leak of the triangulated tables at the naive MLE (the EM start)."""
    from numpyro_dpgm.distributions.relaxation import relaxation_leak
    from numpyro_dpgm.estimation import naive_mle
    from numpyro_dpgm.estimation.variational_em import latent_counts_model

    readout = latent_counts_model(net, meas, n).readout
    theta = readout.latent_theta(naive_mle(meas, net, total_count=n).model.theta)
    return max(relaxation_leak(readout.latent_network, theta, n).values())


def _trial(args: argparse.Namespace, model: str, seed: int, n: int, eps: float,
           names: list[str]) -> dict[str, Any]:
    from numpyro_dpgm.metrics import kl_divergence

    net, truth, meas, b = seed002_release(model, args.values, seed, n, eps)
    fitters = _fitters(args, net, meas, n, b, truth)
    row: dict[str, Any] = {"model": model, "seed": seed, "N": n, "epsilon": eps, "b": b,
                           "leak": _leak(net, meas, n)}
    for name in names:
        t0 = time.perf_counter()
        result = fitters[name]()
        jax.block_until_ready(result.model.theta)
        elapsed = time.perf_counter() - t0
        if name == "naive_oracle":
            elapsed = result.elapsed  # one fit of the grid
            row["naive_oracle_scale"] = result.extras["grid_scale"]  # λ = scale·b/N
        row[f"{name}_s"] = elapsed
        row[f"{name}_kl"] = float(kl_divergence(truth, result.model))
        row[f"{name}_load"] = load_1min()
    return row


FAIL_FACTOR = 10.0


def _failed(row: dict[str, Any], name: str) -> bool:
    """Whether a fit of a new estimator failed numerically rather than estimated badly.

    Its KL is not finite, above ``FAIL_FACTOR`` × naive's, or a whole number (to 1e-9): the
    signature of a model whose log-partition function lost its precision (``θ`` of order
    10⁶, as the general M-step produced along the gauge before its proximal term).
    """
    if name not in NEW:
        return False
    kl = row[f"{name}_kl"]
    return (not np.isfinite(kl) or abs(kl - round(kl)) < 1e-9
            or ("naive_kl" in row and kl > FAIL_FACTOR * row["naive_kl"]))


def _summarise(rows: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Per cell: mean KL, median time / naive, populations measured, and the target check.

    An estimator measured on fewer populations of a cell (merged runs) is summarised over
    those (``{name}_populations``); one not measured in a cell is left out of it. Failed fits
    (:func:`_failed`) are counted (``{name}_failed``), left out of the mean, and fail the
    target.
    """
    out = {}
    cells = sorted({(r["model"], r["N"], r["epsilon"]) for r in rows})
    for model, n, eps in cells:
        sel = [r for r in rows if (r["model"], r["N"], r["epsilon"]) == (model, n, eps)]
        cell: dict[str, Any] = {"populations": len(sel)}
        for name in names:
            measured = [r for r in sel if f"{name}_kl" in r]
            have = [r for r in measured if not _failed(r, name)]
            if not measured:
                continue
            cell[f"{name}_failed"] = len(measured) - len(have)
            if not have:
                continue
            cell[f"{name}_populations"] = len(have)
            cell[f"{name}_kl_mean"] = statistics.mean(r[f"{name}_kl"] for r in have)
            cell[f"{name}_time_ratio"] = statistics.median(
                r[f"{name}_s"] / r["naive_s"] for r in have)
        winners = []
        for name in NEW:
            if f"{name}_kl_mean" not in cell or "naive_oracle_kl_mean" not in cell:
                continue
            beats = not cell[f"{name}_failed"] and all(
                r[f"{name}_kl"] < r["naive_oracle_kl"] for r in sel if f"{name}_kl" in r)
            fast = cell[f"{name}_time_ratio"] <= 20
            cell[f"{name}_beats_oracle_everywhere"] = beats
            if beats and fast:
                winners.append(name)
        cell["target_met_by"] = winners
        out[f"{model} N={n} eps={eps:g}"] = cell
    return out


def summary_markdown(rows: list[dict[str, Any]], names: list[str]) -> str:
    """Markdown tables of a run: per cell (mean KL, median time / naive) and per population."""
    summary = _summarise(rows, names)
    lines = ["| cell | pops | leak | " + " | ".join(names) + " | target met by |",
             "|---|---|---|" + "---|" * len(names) + "---|"]
    for cell, v in summary.items():
        sel = [r for r in rows if f"{r['model']} N={r['N']} eps={r['epsilon']:g}" == cell]
        leaks = [r["leak"] for r in sel if "leak" in r]  # runs before it was recorded: none
        leak = statistics.mean(leaks) if leaks else None
        naive_s = statistics.median(r["naive_s"] for r in sel) if "naive" in names else None
        parts = []
        for k in names:
            failed = v.get(f"{k}_failed", 0)
            if f"{k}_kl_mean" not in v:
                parts.append(f"{failed} failed" if failed else "–")
                continue
            ratio = (f"{naive_s:.2f} s" if k == "naive" and naive_s is not None
                     else f"{v[f'{k}_time_ratio']:.0f}×")
            pops = v[f"{k}_populations"]
            few = f", {pops} pop{'s' if pops > 1 else ''}" if pops < v["populations"] else ""
            few += f", {failed} failed" if failed else ""
            parts.append(f"{v[f'{k}_kl_mean']:.3f} ({ratio}{few})")
        lines.append(f"| {cell.replace('eps', 'ε')} | {v['populations']} | "
                     + ("–" if leak is None else f"{leak:.3f}") + " | " + " | ".join(parts)
                     + f" | {', '.join(v['target_met_by']) or 'none'} |")
    new = [k for k in NEW if k in names]
    if new and "naive_oracle" in names:
        lines += ["", "Per population, KL of naive_oracle / " + " / ".join(new) + ":", ""]
        for r in rows:
            lines.append(f"- {r['model']} N={r['N']} ε={r['epsilon']:g} seed {r['seed']}: "
                         + " / ".join(f"{r[f'{k}_kl']:.3f}" if f"{k}_kl" in r else "–"
                                      for k in ["naive_oracle", *new])
                         + f" (load {r['naive_load']:.1f})")
    return "\n".join(lines) + "\n"


def merge_runs(paths: list[Path]) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """Rows of several ``em_variants.json`` merged by (model, seed, N, ε); later files win.

    Returns the rows, the estimators present (in the default order) and the runs' commands.
    """
    merged: dict[tuple, dict[str, Any]] = {}
    commands = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        commands.append(data["meta"]["command"])
        for row in data["rows"]:
            key = (row["model"], row["seed"], row["N"], row["epsilon"])
            merged.setdefault(key, {}).update(row)
    rows = [merged[k] for k in sorted(merged)]
    order = ["naive", "naive_oracle", "map_em", "map_em_conv", *NEW]
    names = [k for k in order if any(f"{k}_kl" in r for r in rows)]
    return rows, names, commands


def _write(out: Path, meta: dict, rows: list[dict[str, Any]], names: list[str]) -> None:
    summary = _summarise(rows, names)
    write_results(out, "em_variants", {"meta": meta, "summary": summary, "rows": rows}, rows,
                  indent=2)
    (out / "em_variants.md").write_text(summary_markdown(rows, names))


def main(args: argparse.Namespace) -> int:
    import numpyro

    numpyro.enable_x64()
    if args.merge:
        args.out.mkdir(parents=True, exist_ok=True)
        rows, names, commands = merge_runs(args.merge)
        meta = {"merged_from": [str(p) for p in args.merge], "commands": commands,
                "command": "python -m benchmarks em_variants --merge "
                           + " ".join(map(str, args.merge))}
        _write(args.out, meta, rows, names)
        print(summary_markdown(rows, names))
        return 0
    names = list(args.estimators)
    rows: list[dict[str, Any]] = []
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {**platform_summary(), "values": args.values, "trials": args.trials, "Ns": args.Ns,
            "epsilons": args.epsilons, "em_iters": args.em_iters, "svi_steps": args.svi_steps,
            "command": "python -m benchmarks em_variants " + " ".join(
                f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                for k, v in vars(args).items() if k not in ("out", "func", "name"))}
    for model in args.models:
        for n in args.Ns:
            for i, eps in enumerate(args.epsilons):
                if i == 0 or args.warm_every_cell:  # compile on an untimed population
                    _trial(args, model, 10_000 + args.trials, n, eps, names)
                for seed in range(args.trials):
                    row = _trial(args, model, seed, n, eps, names)
                    rows.append(row)
                    print(f"{model} N={n} ε={eps:g} seed={seed} " + " ".join(
                        f"{k}:{row[f'{k}_kl']:.3f}/{row[f'{k}_s']:.2f}s" for k in names)
                        + f" load={load_1min():.1f}", flush=True)
                    _write(args.out, meta, rows, names)
    print("\n" + summary_markdown(rows, names))
    return 0
