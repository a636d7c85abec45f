"""The study's outputs: per-cell summaries, CSV tables, the figures (Fig. 2 and 3b style) and the
markdown summary of a run's folder."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .._common import pyplot, write_csv

__all__ = ["plot_mobility", "plot_synthetic", "summarise", "summary_markdown", "write_synthetic"]


def summarise(rows: list[dict], keys: Sequence[str], value: str) -> list[dict]:
    """Per group of ``keys``: trials, how many reached a finite ``value``, and its mean, sd and
    median over those."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for g, rs in groups.items():
        vals = np.array([r[value] for r in rs], dtype=float)
        ok = vals[np.isfinite(vals)]
        out.append({**dict(zip(keys, g, strict=True)), "trials": len(rs),
                    "reached": len(ok), f"{value}_mean": ok.mean() if len(ok) else math.nan,
                    f"{value}_sd": ok.std(ddof=1) if len(ok) > 1 else math.nan,
                    f"{value}_median": np.median(ok) if len(ok) else math.nan})
    return out


_STYLE = {"naive": ("tab:red", "o", "-"), "cgm_em": ("tab:blue", "s", "-"),
          "psgd": ("tab:green", "^", "--"), "nonprivate": ("black", "", ":"),
          "random": ("gray", "", "-."), "truth": ("gray", "", "-.")}
_LABEL = {"naive": "Naive MLE", "cgm_em": "CGM-EM", "psgd": "PSGD (δ = 1/N)",
          "nonprivate": "non-private MLE", "random": "random", "truth": "true model"}


def plot_synthetic(summary: list[dict], path: Path, kind: str, k: int) -> None:
    """KL against ``N``, one panel per ε (Fig. 2 style), of one model and ``|X|``, to ``path``."""
    plt = pyplot()
    sel = [r for r in summary if r["model"] == kind and r["k"] == k]
    epsilons = sorted({r["epsilon"] for r in sel if r["epsilon"] != ""})
    fig, axes = plt.subplots(1, len(epsilons), figsize=(3.6 * len(epsilons), 3.4),
                             sharey=True, squeeze=False)
    for ax, eps in zip(axes[0], epsilons, strict=True):
        for m in ("naive", "cgm_em", "psgd", "nonprivate"):
            pts = sorted((r["N"], r["kl_mean"], r["kl_sd"]) for r in sel if r["method"] == m
                         and (r["epsilon"] == eps or m == "nonprivate")
                         and np.isfinite(r["kl_mean"]))
            if not pts:
                continue
            c, mk, ls = _STYLE[m]
            x, y, e = (np.array(v, dtype=float) for v in zip(*pts, strict=True))
            ax.errorbar(x, y, yerr=np.nan_to_num(e), color=c, marker=mk, ls=ls, capsize=3,
                        label=_LABEL[m])
        rand = [r["kl_mean"] for r in sel if r["method"] == "random"]
        if rand:
            ax.axhline(rand[0], color="gray", ls="-.", label=_LABEL["random"])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"ε = {eps:g}")
        ax.set_xlabel("population size N")
    axes[0][0].set_ylabel("KL(p_true ‖ p_learned)")
    axes[0][-1].legend(fontsize=7)
    name = {"chain3": "third-order chain", "er": "Erdős–Rényi"}[kind]
    fig.suptitle(f"{name}, 10 nodes, |X| = {k}: mean ± sd over trials")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_mobility(summary: list[dict], path: Path) -> None:
    """Held-out log-likelihood against ε, one panel per ``N`` (Fig. 3b style), to ``path``."""
    plt = pyplot()
    sizes = sorted({r["N"] for r in summary})
    fig, axes = plt.subplots(1, len(sizes), figsize=(3.8 * len(sizes), 3.4), squeeze=False)
    for ax, n in zip(axes[0], sizes, strict=True):
        sel = [r for r in summary if r["N"] == n]
        for m in ("naive", "cgm_em", "psgd"):
            pts = sorted((r["epsilon"], r["heldout_ll_mean"], r["heldout_ll_sd"]) for r in sel
                         if r["method"] == m and np.isfinite(r["heldout_ll_mean"]))
            if pts:
                c, mk, ls = _STYLE[m]
                x, y, e = (np.array(v, dtype=float) for v in zip(*pts, strict=True))
                ax.errorbar(x, y, yerr=np.nan_to_num(e), color=c, marker=mk, ls=ls, capsize=3,
                            label=_LABEL[m])
        for m in ("nonprivate", "truth"):
            v = [r["heldout_ll_mean"] for r in sel if r["method"] == m]
            if v:
                ax.axhline(v[0], color=_STYLE[m][0], ls=_STYLE[m][2], label=_LABEL[m])
        ax.set_xscale("log")
        ax.set_title(f"N = {n} user-days")
        ax.set_xlabel("ε")
    axes[0][0].set_ylabel("held-out log-likelihood per user-day")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("simulated mobility: tied 24-hour chain, 1/K normalisation")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _pm(r: dict | None, value: str, digits: int = 3) -> str:
    """``mean ± sd`` of a summary row (with ``reached/trials`` when some did not run)."""
    if r is None or not r[f"{value}_mean"] or not np.isfinite(float(r[f"{value}_mean"])):
        return "–" if r is None else f"unreachable ({r['trials']})"
    sd = r[f"{value}_sd"]
    txt = f"{float(r[f'{value}_mean']):.{digits}f}"
    if sd and np.isfinite(float(sd)):
        txt += f" ± {float(sd):.{digits}f}"
    if r["reached"] != r["trials"]:
        txt += f" ({r['reached']}/{r['trials']})"
    return txt


def summary_markdown(out: Path | str) -> str:
    """Markdown tables of a finished (or cut-off) run in ``out``, from its CSV files and
    ``meta.json``; :func:`run` writes them to ``summary.md``."""
    out = Path(out)
    lines: list[str] = []
    meta = json.loads((out / "meta.json").read_text()) if (out / "meta.json").exists() else {}
    if meta:
        lines += [f"Wall time {meta['wall_s']:.0f} s ({meta['wall_s'] / 60:.1f} min); trials of "
                  f"a cell as `{meta.get('batch', 'vmap')}` on {meta.get('backend', 'cpu')}; "
                  f"{meta['cpus']} CPUs; load average {meta['loadavg_start'][0]:.1f} at the "
                  f"start, {meta['loadavg_end'][0]:.1f} at the end.", ""]
    summ = _read_csv(out / "synthetic_summary.csv")
    idx = {(r["model"], r["k"], r["N"], r["epsilon"], r["method"]): r for r in summ}
    cells = sorted({(r["model"], r["k"], int(r["N"]), float(r["epsilon"])) for r in summ
                    if r["epsilon"]}, key=lambda c: (c[0], int(c[1]), c[2], c[3]))
    if cells:
        wins = 0
        lines += ["KL(p_true ‖ p_learned), mean ± sd over the trials (bold: the better of naive "
                  "MLE and CGM-EM):", "",
                  "| model | k | N | ε | naive MLE | CGM-EM | PSGD | non-private | random |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for model, k, n, eps in cells:
            key = (model, k, str(n), repr(eps))
            nv, em = idx.get((*key, "naive")), idx.get((*key, "cgm_em"))
            cols = [_pm(nv, "kl"), _pm(em, "kl")]
            if nv and em:
                better = int(float(em["kl_mean"]) < float(nv["kl_mean"]))
                wins += better
                cols[better] = f"**{cols[better]}**"
            lines.append(f"| {model} | {k} | {n} | {eps:g} | {cols[0]} | {cols[1]} | "
                         f"{_pm(idx.get((*key, 'psgd')), 'kl')} | "
                         f"{_pm(idx.get((model, k, str(n), '', 'nonprivate')), 'kl')} | "
                         f"{_pm(idx.get((model, k, '', '', 'random')), 'kl', 1)} |")
        lines += ["", f"CGM-EM below naive MLE in {wins} of {len(cells)} cells.", ""]
    runtime = _read_csv(out / "runtime.csv")
    if runtime:
        lines += ["Seconds per fit (compiled, one trial at a time) and ratio to naive MLE:", "",
                  "| model | k | N | ε | naive MLE | CGM-EM | PSGD | load |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['k']} | {r['N']} | {float(r['epsilon']):g} | "
                  f"{float(r['naive_s']):.3f} s | {float(r['cgm_em_ratio']):.2f}× | "
                  f"{float(r['psgd_ratio']):.1f}× | {float(r['loadavg_1min']):.1f} |"
                  for r in runtime]
        lines.append("")
    speed = _read_csv(out / "vmap_speedup.csv")
    if speed:
        lines += ["One `jax.vmap`-ed program over the trials of a cell against a loop of the "
                  "compiled single-trial program (both warm):", "",
                  "| model | k | N | ε | trials | naive: vmap / loop | CGM-EM: vmap / loop "
                  "| load |", "|---|---|---|---|---|---|---|---|"]
        for r in speed:
            lines.append(
                f"| {r['model']} | {r['k']} | {r['N']} | {float(r['epsilon']):g} | {r['trials']} "
                f"| {float(r['naive_vmap_s']):.1f} s / {float(r['naive_loop_s']):.1f} s "
                f"(**{float(r['naive_speedup']):.2f}×**) | {float(r['cgm_em_vmap_s']):.1f} s / "
                f"{float(r['cgm_em_loop_s']):.1f} s (**{float(r['cgm_em_speedup']):.2f}×**) | "
                f"{float(r['loadavg_1min']):.1f} |")
        lines.append("")
    mob = _read_csv(out / "mobility_summary.csv")
    if mob:
        midx = {(r["N"], r["epsilon"], r["method"]): r for r in mob}
        lines += ["Mobility: held-out log-likelihood per user-day, mean ± sd:", "",
                  "| N | ε | naive MLE | CGM-EM | PSGD | non-private | true model |",
                  "|---|---|---|---|---|---|---|"]
        for n, eps in sorted({(int(r["N"]), float(r["epsilon"])) for r in mob if r["epsilon"]}):
            g = [midx.get((str(n), repr(eps), m)) for m in ("naive", "cgm_em", "psgd")]
            ref = [midx.get((str(n), "", m)) for m in ("nonprivate", "truth")]
            lines.append(f"| {n} | {eps:g} | " + " | ".join(_pm(r, "heldout_ll") for r in g + ref)
                         + " |")
        lines.append("")
    return "\n".join(lines)


def write_synthetic(out: Path, rows: list[dict], timing: list[dict], speed: list[dict],
                    kind: str, k: int) -> None:
    """Tables and the figure of the cells finished so far."""
    write_csv(out / "synthetic.csv", rows)
    summary = summarise(rows, ("model", "k", "N", "epsilon", "method"), "kl")
    write_csv(out / "synthetic_summary.csv", summary)
    if timing:
        write_csv(out / "runtime.csv", timing)
        write_csv(out / "vmap_speedup.csv", speed)
    plot_synthetic(summary, out / f"synthetic_{kind}_k{k}.png", kind, k)
