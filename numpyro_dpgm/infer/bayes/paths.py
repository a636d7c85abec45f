"""Which sampler :func:`~.nuts.run_nuts` runs on a model of noisy marginals, and why.

:func:`choose_path` reads the model and its release (size, records per cell, the noise's share
of the released counts, the relaxation leak at the starting ``θ``) and names one of the paths
of :mod:`.nuts`, with the reason ``run_nuts`` reports (``mcmc.path_reason``); the thresholds
below are where the measured samplers changed places.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from ...distributions.normal_cgm import normal_tables_plan
from ...distributions.relaxation import LEAK_TOLERANCE
from ...network import MarkovNetwork
from .collapse import PATH_REASON
from .conditional import ConditionalCoding
from .interweave import released_noise_share
from .model import NoisyMarginalsModel

__all__ = ["COLLAPSED_MAX_DIM", "COLLAPSED_MIN_COUNT", "COLLAPSED_MIN_DIM",
           "NORMAL_MIN_VARIANCE", "PINNED_SHARE", "choose_path", "collapsed_fit",
           "collapsed_reason", "collapsed_size", "collapsed_unable", "released_log_odds",
           "released_noise_variance", "start_theta"]

Array = Any

#: :func:`choose_path` takes the exact path where the median noise share of the released values
#: is below this. Set between the releases of ``python -m benchmarks gibbs`` (Adult's 97-cell
#: model) where the exact path had the larger ESS per second (Laplace: shares 0.024 and 0.049;
#: Gaussian: 0.0014) and those where the relaxed one had (Laplace: 0.11, 0.71 and 0.93).
PINNED_SHARE = 0.075

#: :func:`choose_path` takes the normal relaxation (conditional coding) where the noise variance
#: of every released value is at least this many counts². Set between the sparse releases of
#: ``python -m benchmarks gibbs --studies coverage`` (Laplace ``b = 2``, variance 8), where the
#: normal relaxation's 90 % intervals covered 85 % against the exact path's 91 %, and Adult's
#: 97-cell releases (variance 162 and more), where it had 4–54 times the ESS per second of the
#: ``lgamma`` relaxation on all four and moves no mass into near-empty cells. On Adult's 842-cell
#: releases (``gibbs-mid-*-cpu.json``, ``gibbs-bigmid-lgamma-cpu.jsonl``) neither relaxation
#: mixed: ``lgamma`` had 4.7 times its ESS per second on Adult's records at ε = 1 (about the
#: same at ε = 0.1), a fifth of it on 250,000 records at ε = 1.
NORMAL_MIN_VARIANCE = 50.0

#: :func:`choose_path` takes the collapsed path from this many coordinates of the normal
#: relaxation (cells of the junction tree's cliques) on. Below it the joint samplers mixed on
#: every release measured (Adult's 97-cell releases: R-hat ≤ 1.01, bulk ESS ≥ 400); from
#: Adult's 319- and 842-cell Laplace releases on, none did (R-hat 1.006–108, every draw at the
#: maximum tree depth).
COLLAPSED_MIN_DIM = 150

#: ... and up to this many: one value and gradient costs a diagonal-plus-low-rank factor per
#: junction-tree clique (:mod:`.collapsed_tree`; ``python -m benchmarks collapsed --gradient``
#: on the 2-core CPU: 1.9 ms on the 321-cell stand-in, 13 ms on Adult's 842-cell tree with its
#: one-way tables), but each stored draw of the tables a dense factor per clique, ``Σ_K |K|³``,
#: and the demo's tree (20,186 coordinates) has cliques of 10,000 and 8,500 cells, out of reach
#: of a dense factor per draw; the default leaves releases beyond the bound to the cheaper steps
#: of the other paths (which do not mix there either). A judgement, not a measured optimum.
COLLAPSED_MAX_DIM = 1200

#: ... where the records per cell of the largest latent table are at least this many: the
#: collapsed path samples the normal relaxation's posterior, which is close to the exact one
#: where cells hold many records (on 30 records in 6 cells the normal relaxation's 90 %
#: intervals covered 85 % against the exact path's 91 %).
COLLAPSED_MIN_COUNT = 10.0

def start_theta(model: NoisyMarginalsModel, values: Mapping[str, Array]) -> Array:
    """The starting ``θ`` of a run: the model's fixed ``θ``, else that of the starting ``φ``."""
    if model.theta is not None:
        return jnp.asarray(model.theta)
    return model.coding.to_theta(jnp.asarray(values["phi"]))


def choose_path(
    model: Any, exact: bool | None, values: Mapping[str, Array],
    collapsed: bool | None = None, one_release: bool = True,
) -> tuple[str, str]:
    """``("exact" | "relaxed" | "normal" | "collapsed", reason)`` for a run of :func:`run_nuts`.

    ``collapsed=True`` takes the collapsed path (:mod:`.collapse`), or says why it cannot
    (``θ`` fixed, several releases).
    ``collapsed=None`` with ``exact=None`` takes it where it can and the release is large,
    :data:`COLLAPSED_MIN_DIM` to :data:`COLLAPSED_MAX_DIM` coordinates, with at least
    :data:`COLLAPSED_MIN_COUNT` records per cell of the largest latent table (unless the model
    was built with ``relaxed=False``); :func:`collapsed_fit` says why not.

    ``"normal"`` is the relaxed path on the normal relaxation
    (:mod:`numpyro_dpgm.distributions.normal_cgm`), ``"relaxed"`` on the model's ``lgamma``
    density. A model built with ``relaxation="normal"`` takes the normal path
    unless ``exact=True``. Otherwise, with the conditional coding, ``exact=None`` picks the
    normal path where the noise variance of every released value is at least
    :data:`NORMAL_MIN_VARIANCE` counts² (there the counts' discreteness is hidden in the noise;
    measured on Adult's 97-cell releases it mixed fastest; on its 842-cell ones neither
    relaxation mixed, nor was either the faster on every release). Else
    ``exact=None`` picks the exact path when the relaxation leak of the latent tables at the
    starting ``θ`` exceeds :data:`~numpyro_dpgm.distributions.relaxation.LEAK_TOLERANCE`, or
    when the release pins the counts: the median over the released values of the noise's
    share, ``V / (max(y, 1) + V)`` (:func:`~.interweave.released_noise_share`), is below
    :data:`PINNED_SHARE`. A model built with ``relaxed=False`` always takes the exact path; a
    model of your own always takes the relaxed one (plain NUTS).

    The share decides which sampler's weakness a release meets. Where it is near 1 the exact
    path's data augmentation crawls (the share is its fraction of missing information); where
    it is small, ``y`` pins ``n`` far more tightly than ``θ`` does, and relaxed NUTS mixes
    poorly (on Adult's 97-cell model at ε = 1 and 250,000 records, share 0.024, every draw hit
    the maximum tree depth and the worst R-hat was 1.90). That is a weakness of the reference
    coding: with the prior on the conditional coding (``coding="conditional"``) relaxed NUTS
    mixed there (R-hat 1.03, bulk ESS 40, 0.53 per second against the exact path's 0.15), so
    for such a model only the leak sends the run to the exact path.
    """
    if not isinstance(model, NoisyMarginalsModel):
        if exact:
            raise TypeError("the exact path needs a NoisyMarginalsModel; a model of your own "
                            "runs plain NUTS (exact=None or False)")
        return "relaxed", "a model of your own runs plain NUTS"
    if collapsed:
        unable = "exact=True" if exact else collapsed_fit(model, one_release, by_default=False)
        if unable is not None:
            raise ValueError(f"collapsed=True, but {unable}")
        return "collapsed", f"{PATH_REASON} (collapsed=True)"
    if (collapsed is None and exact is None and model.relaxed
            and collapsed_fit(model, one_release) is None):
        return "collapsed", collapsed_reason(normal_tables_plan(model.latent_network).dim)
    if not model.relaxed and exact is not False:
        return "exact", "the model's CGM site is exact (relaxed=False)"
    normal = model.relaxation == "normal"
    if exact is not None:
        return ("exact", "exact=True") if exact else ("normal" if normal else "relaxed",
                                                      "exact=False")
    if normal:
        return "normal", ("the model's CGM site is the normal relaxation (relaxation='normal'), "
                          "which moves no mass into near-empty cells")
    if isinstance(model.coding, ConditionalCoding):
        least = float(np.min(released_noise_variance(model)))
        if least >= NORMAL_MIN_VARIANCE:
            return "normal", (
                f"the noise's variance is at least {least:.3g} counts² in every released value "
                f"(≥ {NORMAL_MIN_VARIANCE:g}), which hides the counts' discreteness: the normal "
                "relaxation, exact in the counts' mean and covariance, moves no mass into "
                "near-empty cells and mixed fastest on the 97-cell Adult releases measured")
    leak = model.relaxation_leak(start_theta(model, values))
    clique, worst = max(leak.items(), key=lambda kv: kv[1])
    where = (f"the relaxation leak at the starting θ is {100 * worst:.2g}% of N in the table "
             f"of {clique}")
    if worst > LEAK_TOLERANCE:
        return "exact", f"{where}, above the {100 * LEAK_TOLERANCE:g}% tolerance"
    where = f"{where}, within the {100 * LEAK_TOLERANCE:g}% tolerance"
    if isinstance(model.coding, ConditionalCoding):
        return "relaxed", (f"{where}, and with the conditional coding relaxed NUTS mixes also "
                           "where the release pins the counts")
    share = float(np.median(released_noise_share(model)))
    pins = (f"the noise's share of the median released count is {100 * share:.3g}% "
            f"({'below' if share < PINNED_SHARE else 'at least'} {100 * PINNED_SHARE:g}%")
    if share < PINNED_SHARE:
        return "exact", (f"{where}, but {pins}: the release pins the counts, where relaxed "
                         "NUTS mixes poorly)")
    return "relaxed", f"{where}, and {pins})"


def collapsed_unable(model: NoisyMarginalsModel, one_release: bool = True) -> str | None:
    """Why the collapsed path cannot sample ``model`` (``None`` where it can): it infers ``θ``
    from one release (the model's latent network is decomposable, as its CGM needs)."""
    if model.theta is not None:
        return "θ is fixed: the tables' posterior given θ is the exact path's (exact=True)"
    if not one_release:
        return "y is a batch of releases; the collapsed path takes one"
    return None


def released_log_odds(model: NoisyMarginalsModel) -> Array:
    """``φ`` of the released tables' conditionals under the conditional coding (negative
    counts clipped, half a count added: the normal relaxation's reference conditionals), where
    the collapsed path's search for the mode starts (:mod:`.laplace_metric`)."""
    net, const = model.latent_network, model._normal
    log_cond = np.zeros(net.num_params)
    for b in const.plan.blocks:
        cells = net.offsets[net.clique_index(b.clique)] + b.to_rows
        log_cond[cells] = np.log(const.reference[b.offset:b.offset + b.rows * b.cols])
    return model.coding.log_odds(jnp.asarray(log_cond))


def collapsed_fit(model: NoisyMarginalsModel, one_release: bool = True,
                  by_default: bool = True) -> str | None:
    """``None`` where the collapsed path suits ``model`` by default (:func:`choose_path`), else
    why not; with ``by_default=False``, where it can run at all
    (:func:`collapsed_unable`), whatever the release's size."""
    unable = collapsed_unable(model, one_release)
    if unable is not None or not by_default:
        return unable
    return collapsed_size([(model.latent_network, float(model.total_count))])


def collapsed_size(tables: Sequence[tuple[MarkovNetwork, float]]) -> str | None:
    """The collapsed path's size rule over latent tables ``(network, N)``, all together:
    ``None`` where their normal relaxation has :data:`COLLAPSED_MIN_DIM` to
    :data:`COLLAPSED_MAX_DIM` coordinates and each largest table holds at least
    :data:`COLLAPSED_MIN_COUNT` records per cell, else why not."""
    dim = sum(normal_tables_plan(net).dim for net, _ in tables)
    if not COLLAPSED_MIN_DIM <= dim <= COLLAPSED_MAX_DIM:
        return (f"the release's normal relaxation has {dim} coordinates, outside "
                f"[{COLLAPSED_MIN_DIM}, {COLLAPSED_MAX_DIM}] (COLLAPSED_MIN_DIM, "
                "COLLAPSED_MAX_DIM)")
    per_cell = min(total / max(net.domain.size(c) for c in net.cliques) for net, total in tables)
    if per_cell < COLLAPSED_MIN_COUNT:
        return (f"the largest latent table holds {per_cell:.3g} records per cell, below "
                f"COLLAPSED_MIN_COUNT = {COLLAPSED_MIN_COUNT:g}")
    return None


def collapsed_reason(dim: int) -> str:
    """Why :func:`choose_path` took the collapsed path on a release of ``dim`` coordinates."""
    return (f"{PATH_REASON}: the release is large ({dim} coordinates, where joint NUTS on θ "
            f"and the tables was measured not to mix from 319 cells on) and its tables hold "
            f"many records (at least {COLLAPSED_MIN_COUNT:g} per cell of the largest)")


def released_noise_variance(model: NoisyMarginalsModel) -> np.ndarray:
    """Per released value, the variance of its noise (the measurement's ``noise.variance``)."""
    return np.concatenate([np.full(np.size(m.values), m.noise.variance)
                           for m in model.measurements])
