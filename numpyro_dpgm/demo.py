"""The demo: release noisy marginals of the bundled Adult data, fit models, report accuracy.

Steps: (1) release the 14 one-way and 13 two-way marginals of a fixed tree over Adult's attributes
with the Laplace mechanism (OpenDP's sampler, add/remove neighbours, ε split evenly by the
sensitivity rule); (2) fit the naive MLE, CGM-EM and Prox-PGM estimators on those measurements;
(3) report the average L1 error of each model's marginals against the true tables, on the released
(in-model) marginals and on 2-way marginals outside the model, with the fit times; (4) write a JSON
summary and PNG figures.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .data import Dataset, count, load_demo
from .domain import Clique
from .estimation.cgm_em import cgm_em
from .estimation.naive import naive_mle
from .estimation.prox_pgm import prox_pgm
from .metrics import noisy_tables_l1
from .network import MarkovNetwork
from .privacy import PrivacyLedger, PureDP, release, simulate_release

__all__ = ["ADULT_TREE", "run_demo"]

#: A fixed spanning tree over Adult's 14 attributes, chosen by domain knowledge (not from the
#: data, so choosing it costs no privacy).
ADULT_TREE: tuple[Clique, ...] = (
    ("age", "marital-status"),
    ("marital-status", "relationship"),
    ("relationship", "sex"),
    ("relationship", "income>50K"),
    ("income>50K", "education-num"),
    ("education-num", "occupation"),
    ("occupation", "workclass"),
    ("income>50K", "hours-per-week"),
    ("income>50K", "capital-gain"),
    ("capital-gain", "capital-loss"),
    ("sex", "race"),
    ("race", "native-country"),
    ("age", "fnlwgt"),
)


def _l1(estimate: np.ndarray, truth: np.ndarray) -> float:
    return float(np.abs(np.asarray(estimate) - truth / truth.sum()).sum())


def run_demo(
    epsilon: float = 1.0,
    out_dir: str | Path = "outputs/demo",
    seed: int | None = None,
    em_iters: int = 10,
    prox_iters: int = 3000,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the demo and return its summary (also written to ``out_dir/summary.json``).

    Parameters
    ----------
    epsilon : float
        Total privacy budget (pure ε-DP, add/remove neighbours) of the release.
    seed : int, optional
        ``None`` releases with OpenDP's vetted sampler (a real release); an integer uses the
        seeded JAX sampler instead (a reproducible simulation).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data: Dataset = load_demo("adult")
    domain = data.domain
    one_way = [(a,) for a in domain.attrs]
    cliques = list(ADULT_TREE) + one_way
    network = MarkovNetwork(domain, cliques)
    total = float(data.total)

    ledger = PrivacyLedger(PureDP(epsilon))
    progress(f"releasing {len(cliques)} marginals of {data.total} Adult records at ε = {epsilon}")
    if seed is None:
        meas = release(data, cliques, epsilon, ledger=ledger)
    else:
        import jax

        meas = simulate_release(data, cliques, epsilon, jax.random.key(seed), ledger=ledger)
    truth = count(data.records, cliques, domain)
    pairs = [(a, b) for i, a in enumerate(domain.attrs) for b in domain.attrs[i + 1:]]
    in_model = {frozenset(c) for c in ADULT_TREE}
    rng = np.random.default_rng(0)
    outside = [pairs[i] for i in rng.permutation(len(pairs))
               if frozenset(pairs[i]) not in in_model][:20]
    truth_out = count(data.records, outside, domain)

    fits: dict[str, Any] = {}
    for name, fit in (
        ("naive MLE", lambda: naive_mle(meas, network, total_count=total)),
        ("CGM-EM", lambda: cgm_em(meas, network, total_count=total, max_iters=em_iters)),
        ("Prox-PGM", lambda: prox_pgm(meas, network, total_count=total, max_iters=prox_iters)),
    ):
        progress(f"fitting {name}")
        t0 = time.perf_counter()
        result = fit()
        elapsed = time.perf_counter() - t0
        model = result.model
        err_in = float(np.mean([_l1(model.marginal(c), np.asarray(truth[c])) for c in cliques]))
        err_out = float(np.mean([_l1(model.marginal(c), np.asarray(truth_out[c]))
                                 for c in outside]))
        fits[name] = {"model": model, "l1_in_model": err_in, "l1_out_of_model": err_out,
                      "seconds": elapsed}

    summary = {
        "epsilon": epsilon,
        "records": data.total,
        "released": [list(c) for c in cliques],
        "sampler": "opendp" if seed is None else f"jax (seed {seed}, simulation)",
        "ledger": [{"label": e.label, "cost": str(e.cost)} for e in ledger.history],
        "noisy_tables_l1": noisy_tables_l1(meas, truth),
        "methods": {k: {kk: vv for kk, vv in v.items() if kk != "model"}
                    for k, v in fits.items()},
        "out_of_model_pairs": [list(c) for c in outside],
    }
    _replace(out / "summary.json", lambda tmp: tmp.write_text(json.dumps(summary, indent=2)))
    _plots(out, fits, summary, truth, domain)
    return summary


def _replace(path: Path, write: Callable[[Path], Any]) -> None:
    """Write ``path`` atomically: ``write`` fills a temporary file of the same folder and
    suffix, which is then renamed into place (and removed if anything fails)."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _plots(out: Path, fits: dict[str, Any], summary: dict[str, Any], truth: Any,
           domain: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")  # figures go to files
    import matplotlib.pyplot as plt

    names = list(fits)
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    x = np.arange(len(names))
    ax.bar(x - 0.2, [fits[n]["l1_in_model"] for n in names], 0.4, label="released marginals")
    ax.bar(x + 0.2, [fits[n]["l1_out_of_model"] for n in names], 0.4,
           label="2-way marginals outside the model")
    ax.axhline(summary["noisy_tables_l1"], color="k", ls="--", lw=1,
               label="noisy tables (clipped, normalised)")
    ax.set_xticks(x, names)
    top = max([summary["noisy_tables_l1"]] + [fits[n]["l1_out_of_model"] for n in names])
    ax.set_ylim(0, 1.35 * top)
    ax.set_ylabel("mean L1 error")
    ax.set_title(f"Adult, ε = {summary['epsilon']}")
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    fig.tight_layout()
    _replace(out / "errors.png", lambda tmp: fig.savefig(tmp, dpi=120))
    plt.close(fig)

    t = np.asarray(truth[("age",)])
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    ax.plot(t / t.sum(), "k-", lw=2, label="true")
    for n in names:
        ax.plot(np.asarray(fits[n]["model"].marginal(("age",))), lw=1, label=n)
    ax.set_xlabel("age (code)")
    ax.set_ylabel("probability")
    ax.set_title("Marginal of age")
    ax.legend(fontsize=8)
    fig.tight_layout()
    _replace(out / "age_marginal.png", lambda tmp: fig.savefig(tmp, dpi=120))
    plt.close(fig)
