"""Reproduction study for "Privately Learning Markov Random Fields" (seed 001, Zhang et al. 2020).

The paper has no experiments; its claims are sample complexities (Table 1, Thms 3.8, 3.11, Cor.
6.3). This study measures, on data sampled exactly from known models:

1. Ising parameter learning (Alg. 2): ``max_{i≠j} |Â_ij − A_ij|`` against ``n`` at several
   privacy levels, on the 8-cycle with ``|A_ij| = 0.5`` (random signs, ``θ = 0``, width
   ``λ = 1``) of the spec (zhang2020 §9 B).
2. Pairwise parameter learning (Alg. 3): ``max |Ŵ_ij(u, b) − W_ij(u, b)|`` against ``n`` on the
   5-cycle with ``k = 3`` and random double-centred ``W_ij`` scaled to ``max |W_ij| = 0.6``
   (``λ = 1.2``; spec §9 C).
3. Structure learning: the rate of exact recovery of the Ising 8-cycle's edge set against ``n``
   for (a) sample-and-aggregate with the stable mode under (ε, δ)-DP (Lemma 6.1, Cor. 6.3),
   (b) zCDP parameter learning (Alg. 2) with the ρ that implies the same (ε, δ), thresholded at
   ``η/2``, and (c) the same thresholding without privacy.
4. (Full mode only.) The dimension: at fixed ``n`` and (ε, δ), Ising ``p``-cycles for growing
   ``p`` (sampled exactly by the junction tree): the parameter error of (b) and the recovery
   rates of (a)–(c) against ``p`` (Table 1: ``log p`` for structure under approximate DP,
   ``√p`` for zCDP parameter learning).

Privacy levels are (ε, δ = 10⁻⁶)-DP, met through the largest ρ with ρ-zCDP ⇒ (ε, δ)-DP
(Lemma 2.13); the learners use the library's default, rigorously calibrated Frank–Wolfe noise
(``noise_multiplier="rigorous"``) and, for Alg. 3, the ``"parallel"`` budget split. All noise comes
from JAX keys (a simulation study); data sampling uses numpy generators with fixed seeds.

:func:`run` writes ``ising_error.csv``, ``pairwise_error.csv``, ``structure.csv`` (one row per run),
``summary.csv`` (medians and rates) and ``ising_error.png``, ``pairwise_error.png``,
``structure.png``; the full mode adds ``dimension.csv`` and ``dimension.png``.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from numpyro_dpgm.distributions.mrf import MarkovRandomField
from numpyro_dpgm.domain import Domain
from numpyro_dpgm.learners.private_mrf import (
    ising_to_mrf,
    learn_ising,
    learn_pairwise,
    learn_structure,
    pairwise_to_mrf,
)
from numpyro_dpgm.privacy.conversions import approx_to_zcdp
from numpyro_dpgm.privacy.guarantees import ApproxDP

from ._common import pyplot, write_csv

__all__ = ["DELTA", "ising_cycle", "pairwise_cycle", "run", "sample_exact"]

#: δ of every (ε, δ) privacy level of the study.
DELTA = 1e-6

#: Fixed seed streams of the data samplers.
_STREAMS = {"ising": 1, "pairwise": 2, "structure": 7}


# ------------------------------------------------------------------------------------------------
# models and exact sampling
# ------------------------------------------------------------------------------------------------
def ising_cycle(p: int = 8, weight: float = 0.5, seed: int = 0) -> np.ndarray:
    """A ``p``-cycle coupling matrix with ``|A_ij| = weight`` and random signs (spec §9 B)."""
    rng = np.random.default_rng(seed)
    A = np.zeros((p, p))
    for i in range(p):
        j = (i + 1) % p
        A[i, j] = A[j, i] = weight * rng.choice([-1.0, 1.0])
    return A


def pairwise_cycle(p: int = 5, k: int = 3, scale: float = 0.6, seed: int = 0) -> np.ndarray:
    """A ``p``-cycle of double-centred ``k × k`` weights with ``max |W_ij| = scale`` (spec §9 C);
    dense ``(p, p, k, k)`` with ``W[j, i] = W[i, j]ᵀ``."""
    rng = np.random.default_rng(seed)
    W = np.zeros((p, p, k, k))
    for i in range(p):
        j = (i + 1) % p
        M = rng.normal(size=(k, k))
        M = M - M.mean(0, keepdims=True) - M.mean(1, keepdims=True) + M.mean()
        M *= scale / np.abs(M).max()
        W[i, j], W[j, i] = M, M.T
    return W


class _ExactSampler:
    """Exact i.i.d. records of a small model: its probabilities over every record come from the
    library's junction tree once, then records are drawn with numpy."""

    def __init__(self, model: MarkovRandomField):
        shape = model.network.domain.shape
        self.states = np.array(list(itertools.product(*[range(k) for k in shape])))
        prob = np.exp(np.asarray(model.log_prob(self.states)))
        self.prob = prob / prob.sum()

    def __call__(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return self.states[rng.choice(len(self.states), size=n, p=self.prob)]


def sample_exact(model: MarkovRandomField, n: int, seed: int) -> np.ndarray:
    """``n`` exact records (codes) of a model over at most ~10⁵ records."""
    return _ExactSampler(model)(n, np.random.default_rng(seed))


# ------------------------------------------------------------------------------------------------
# the three studies
# ------------------------------------------------------------------------------------------------
def _privacy_levels(epsilons: Sequence[float]) -> list[tuple[str, Any, float | None, float]]:
    levels: list[tuple[str, Any, float | None, float]] = []
    for eps in epsilons:
        levels.append((f"eps={eps:g}", ApproxDP(eps, DELTA), eps, approx_to_zcdp(eps, DELTA)))
    levels.append(("non-private", None, None, math.inf))
    return levels


def _ising_error(A_hat: np.ndarray, A: np.ndarray) -> float:
    off = ~np.eye(A.shape[0], dtype=bool)
    return float(np.max(np.abs(A_hat - A)[off]))


def _pairwise_error(W_hat: np.ndarray, W: np.ndarray) -> float:
    p = W.shape[0]
    return max(
        float(np.max(np.abs(W_hat[i, j] - W[i, j]))) for i in range(p) for j in range(p) if i != j
    )


def _parameter_study(
    name: str,
    sampler: _ExactSampler,
    learn: Callable[[np.ndarray, Any, jax.Array], tuple[float, int]],
    ns: Sequence[int],
    epsilons: Sequence[float],
    reps: int,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    rows = []
    for label, privacy, eps, rho in _privacy_levels(epsilons):
        for n in ns:
            errs = []
            for rep in range(reps):
                data = sampler(n, np.random.default_rng([_STREAMS[name], n, rep]))
                key = jax.random.key(10_000 * rep + n % 9973)
                err, T = learn(data, privacy, key)
                errs.append(err)
                rows.append({
                    "model": name, "privacy": label, "epsilon": eps,
                    "delta": DELTA if eps else None, "rho": rho, "n": n, "rep": rep, "T": T,
                    "error": err,
                })
            log(f"  {name:8s} {label:12s} n={n:7d}  median error {np.median(errs):.4f}")
    return rows


def _structure_study(
    A: np.ndarray,
    sampler: _ExactSampler,
    ns: Sequence[int],
    epsilon: float,
    reps: int,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    p = A.shape[0]
    truth = frozenset((i, j) for i, j in itertools.combinations(range(p), 2) if A[i, j] != 0)
    eta = float(np.min(np.abs(A[A != 0])))
    lam = float(np.max(np.abs(A).sum(axis=1)))
    rho = approx_to_zcdp(epsilon, DELTA)
    rows = []

    for n in ns:
        hits = {"stable mode (eps,delta)-DP": 0, "Alg. 2 + threshold, zCDP": 0,
                "Alg. 2 + threshold, non-private": 0}
        for rep in range(reps):
            z = 1 - 2 * sampler(n, np.random.default_rng([_STREAMS["structure"], n, rep]))
            key = jax.random.key(rep)
            found = {
                "stable mode (eps,delta)-DP": learn_structure(
                    z, budget=ApproxDP(epsilon, DELTA), rng_key=key, min_edge_weight=eta,
                    width=lam).edges,
                "Alg. 2 + threshold, zCDP": _threshold_edges(
                    learn_ising(z, budget=rho, width=lam, rng_key=key).extras["A"], eta
                ),
                "Alg. 2 + threshold, non-private": _threshold_edges(
                    learn_ising(z, budget=None, width=lam, iterations=300).extras["A"], eta
                ),
            }
            for method, got in found.items():
                ok = got == truth
                hits[method] += ok
                rows.append({"method": method, "epsilon": epsilon, "delta": DELTA, "rho": rho,
                             "n": n, "rep": rep, "success": int(ok)})
        log(f"  structure n={n:7d}  " + ", ".join(f"{m}: {h}/{reps}" for m, h in hits.items()))
    return rows


def _dimension_study(
    ps: Sequence[int], n: int, epsilon: float, reps: int, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    rho = approx_to_zcdp(epsilon, DELTA)
    rows = []
    for p in ps:
        A = ising_cycle(p)
        truth = frozenset((i, j) for i, j in itertools.combinations(range(p), 2) if A[i, j] != 0)
        eta, lam = 0.5, float(np.max(np.abs(A).sum(axis=1)))
        model = ising_to_mrf(A)
        hits = dict.fromkeys(
            ("stable mode (eps,delta)-DP", "Alg. 2 + threshold, zCDP",
             "Alg. 2 + threshold, non-private"), 0
        )
        errs = []
        for rep in range(reps):
            codes = np.asarray(model.sample(jax.random.key(1000 * p + rep), (n,)))
            key = jax.random.key(rep)
            zcdp = learn_ising(codes, budget=rho, width=lam, rng_key=key, coding="code").extras["A"]
            nonpriv = learn_ising(codes, budget=None, width=lam, iterations=300, coding="code")
            stable = learn_structure(codes, budget=ApproxDP(epsilon, DELTA), rng_key=key,
                                     min_edge_weight=eta, width=lam, coding="code").edges
            errs.append(_ising_error(zcdp, A))
            found = {
                "stable mode (eps,delta)-DP": stable,
                "Alg. 2 + threshold, zCDP": _threshold_edges(zcdp, eta),
                "Alg. 2 + threshold, non-private": _threshold_edges(nonpriv.extras["A"], eta),
            }
            for method, got in found.items():
                hits[method] += got == truth
                rows.append({"p": p, "n": n, "epsilon": epsilon, "delta": DELTA, "rho": rho,
                             "rep": rep, "method": method, "success": int(got == truth),
                             "zcdp_error": errs[-1]})
        log(f"  dimension p={p:3d}: zCDP error {np.median(errs):.3f}; "
            + ", ".join(f"{m}: {h}/{reps}" for m, h in hits.items()))
    return rows


def _threshold_edges(A_hat: np.ndarray, eta: float) -> frozenset:
    p = A_hat.shape[0]
    sym = 0.5 * np.abs(A_hat + A_hat.T)
    return frozenset((i, j) for i, j in itertools.combinations(range(p), 2) if sym[i, j] > eta / 2)


# ------------------------------------------------------------------------------------------------
# output
# ------------------------------------------------------------------------------------------------
def _summary(param_rows: list[dict[str, Any]], struct_rows: list[dict[str, Any]]) -> list[dict]:
    out = []
    groups: dict[tuple, list[dict]] = {}
    for r in param_rows:
        groups.setdefault((r["model"], r["privacy"], r["n"]), []).append(r)
    for (model, privacy, n), rs in groups.items():
        out.append({"study": f"{model} parameter error", "setting": privacy, "n": n,
                    "value": float(np.median([r["error"] for r in rs])), "runs": len(rs),
                    "T": rs[0]["T"]})
    sgroups: dict[tuple, list[dict]] = {}
    for r in struct_rows:
        sgroups.setdefault((r["method"], r["n"]), []).append(r)
    for (method, n), rs in sgroups.items():
        out.append({"study": "ising structure recovery rate", "setting": method, "n": n,
                    "value": float(np.mean([r["success"] for r in rs])), "runs": len(rs),
                    "T": None})
    return out


def slopes(summary: list[dict]) -> dict[tuple[str, str], float]:
    """Least-squares slope of log(median error) against log(n) for every parameter curve."""
    curves: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in summary:
        if r["study"].endswith("parameter error"):
            curves.setdefault((r["study"], r["setting"]), []).append((r["n"], r["value"]))
    return {
        k: float(np.polyfit(np.log([n for n, _ in v]), np.log([e for _, e in v]), 1)[0])
        for k, v in curves.items()
        if len(v) >= 2
    }


#: Line styles of the recovery-rate curves (overlapping curves stay visible).
_STYLES = (
    {"marker": "o", "linestyle": "-", "markersize": 8},
    {"marker": "s", "linestyle": "--", "markersize": 6},
    {"marker": "^", "linestyle": ":", "markersize": 5},
)


def _plain_ticks(ax: Any, values: Sequence[int]) -> None:
    """Label a logarithmic x axis at ``values`` only, in plain numbers."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.xaxis.set_major_locator(FixedLocator(list(values)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{v:g}" for v in values])


def _plots(out: Path, summary: list[dict]) -> list[Path]:
    plt = pyplot()

    paths = []
    for study, fname, ylabel in (
        ("ising parameter error", "ising_error.png",
         r"median $\max_{i\neq j}|\hat A_{ij}-A_{ij}|$"),
        ("pairwise parameter error", "pairwise_error.png",
         r"median $\max|\hat W_{ij}(u,b)-W_{ij}(u,b)|$"),
    ):
        fig, ax = plt.subplots(figsize=(5.5, 4))
        settings = dict.fromkeys(r["setting"] for r in summary if r["study"] == study)
        for s in settings:
            pts = sorted((r["n"], r["value"]) for r in summary
                         if r["study"] == study and r["setting"] == s)
            ax.loglog(*zip(*pts, strict=True), marker="o", label=s)
        ax.set_xlabel("n (records)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{study.split()[0].capitalize()}: Alg. {2 if 'ising' in study else 3}, "
                     f"δ = {DELTA:g}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=120)
        plt.close(fig)
        paths.append(out / fname)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    study = "ising structure recovery rate"
    methods = dict.fromkeys(r["setting"] for r in summary if r["study"] == study)
    for s, style in zip(methods, _STYLES, strict=False):
        pts = sorted((r["n"], r["value"]) for r in summary
                     if r["study"] == study and r["setting"] == s)
        ax.semilogx(*zip(*pts, strict=True), label=s, **style)
    _plain_ticks(ax, sorted({r["n"] for r in summary if r["study"] == study}))
    ax.set_xlabel("n (records)")
    ax.set_ylabel("exact recovery rate")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("Ising 8-cycle structure, ε = 1, δ = 1e-6")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "structure.png", dpi=120)
    plt.close(fig)
    paths.append(out / "structure.png")
    return paths


def _dimension_plot(out: Path, rows: list[dict[str, Any]]) -> Path:
    plt = pyplot()

    ps = sorted({r["p"] for r in rows})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    err = [np.median([r["zcdp_error"] for r in rows if r["p"] == p
                      and r["method"].endswith("zCDP")]) for p in ps]
    ax1.loglog(ps, err, marker="o", label="Alg. 2, zCDP (ρ matched to ε, δ)")
    _plain_ticks(ax1, ps)
    ax1.set_xlabel("p")
    ax1.set_ylabel(r"median $\max|\hat A_{ij}-A_{ij}|$")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    for method, style in zip(dict.fromkeys(r["method"] for r in rows), _STYLES, strict=False):
        rate = [np.mean([r["success"] for r in rows if r["p"] == p and r["method"] == method])
                for p in ps]
        ax2.semilogx(ps, rate, label=method, **style)
    _plain_ticks(ax2, ps)
    ax2.set_xlabel("p")
    ax2.set_ylabel("exact recovery rate")
    ax2.set_ylim(-0.05, 1.05)
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=8)
    n, eps = rows[0]["n"], rows[0]["epsilon"]
    fig.suptitle(f"Ising p-cycles, n = {n}, ε = {eps:g}, δ = {DELTA:g}")
    fig.tight_layout()
    fig.savefig(out / "dimension.png", dpi=120)
    plt.close(fig)
    return out / "dimension.png"


# ------------------------------------------------------------------------------------------------
# entry point
# ------------------------------------------------------------------------------------------------
def run(out_dir: str | Path, quick: bool = False, verbose: bool = True) -> dict[str, Any]:
    """Run the study and write its CSV tables and PNG figures into ``out_dir``.

    Parameters
    ----------
    out_dir : str or Path
        Created if missing.
    quick : bool
        A small version (fewer ``n``, privacy levels and repetitions; well under a couple of
        minutes on two CPU cores) for smoke tests; the full version takes longer.
    verbose : bool
        Print progress.

    Returns
    -------
    dict
        ``"summary"`` (rows of ``summary.csv``), ``"slopes"`` (log-log slopes of the error
        curves), ``"files"`` (the paths written) and ``"elapsed"`` (seconds).
    """
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log: Callable[[str], None] = print if verbose else (lambda _msg: None)
    if quick:
        ising_ns, pair_ns, struct_ns = (2000, 8000, 32000), (5000, 20000, 80000), (5000, 20000)
        epsilons, reps, struct_reps = (1.0, 8.0), 2, 3
        dimension_ps: tuple[int, ...] = ()
        dimension_n = 0
    else:
        ising_ns = (1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000)
        pair_ns = (5000, 10000, 20000, 40000, 80000, 160000, 320000)
        struct_ns = (2500, 5000, 10000, 20000, 40000)
        epsilons, reps, struct_reps = (1.0, 4.0, 16.0), 5, 10
        dimension_ps, dimension_n = (8, 16, 32), 20000

    A = ising_cycle()
    lam = float(np.max(np.abs(A).sum(axis=1)))
    ising_model = ising_to_mrf(A)
    ising_sampler = _ExactSampler(ising_model)
    W = pairwise_cycle()
    k = W.shape[2]
    lam_k = float(np.max(np.abs(W).max(axis=3).sum(axis=1)))
    pair_domain = Domain({f"x{i}": k for i in range(W.shape[0])})
    pair_sampler = _ExactSampler(pairwise_to_mrf(W, np.zeros((W.shape[0], k)), pair_domain))

    def learn_A(codes: np.ndarray, privacy: Any, key: jax.Array) -> tuple[float, int]:
        res = learn_ising(codes, budget=privacy, width=lam, rng_key=key, coding="code")
        return _ising_error(res.extras["A"], A), int(res.extras["T"])

    def learn_W(codes: np.ndarray, privacy: Any, key: jax.Array) -> tuple[float, int]:
        res = learn_pairwise(codes, budget=privacy, width=lam_k, domain=k, rng_key=key,
                             budget_split="parallel")
        return _pairwise_error(res.extras["W"], W), int(max(res.extras["T"]))

    log("zhang2020: Ising parameter learning (Alg. 2)")
    ising_rows = _parameter_study("ising", ising_sampler, learn_A, ising_ns, epsilons, reps, log)
    log("zhang2020: pairwise parameter learning (Alg. 3)")
    pair_rows = _parameter_study("pairwise", pair_sampler, learn_W, pair_ns, epsilons, reps, log)
    log("zhang2020: structure learning (Lemma 6.1 vs zCDP Alg. 2)")
    struct_rows = _structure_study(A, ising_sampler, struct_ns, 1.0, struct_reps, log)

    summary = _summary(ising_rows + pair_rows, struct_rows)
    files = [out / "ising_error.csv", out / "pairwise_error.csv", out / "structure.csv",
             out / "summary.csv"]
    for path, rows in zip(files, (ising_rows, pair_rows, struct_rows, summary), strict=True):
        write_csv(path, rows)
    files += _plots(out, summary)
    if dimension_ps:
        log("zhang2020: dimension (Table 1)")
        dim_rows = _dimension_study(dimension_ps, dimension_n, 1.0, struct_reps // 2, log)
        write_csv(out / "dimension.csv", dim_rows)
        files += [out / "dimension.csv", _dimension_plot(out, dim_rows)]
    elapsed = time.perf_counter() - start
    log(f"zhang2020: wrote {len(files)} files to {out} in {elapsed:.1f} s")
    return {"summary": summary, "slopes": slopes(summary), "files": files, "elapsed": elapsed}
