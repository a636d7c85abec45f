"""Reproduction of seed 002's experiments (Bernstein et al. 2017, "Differentially private learning
of undirected graphical models using collective graphical models", Section 4).

**Synthetic models (§4.1).** Ten nodes, pairwise potentials, ``θ_e = log w_e`` with
``w_e ~ Dirichlet(1)`` over each edge's ``|X|²`` cells: the third-order chain (an edge when
``1 ≤ |i − j| ≤ 3``, 24 edges) and a connected Erdős–Rényi graph ``G(10, 0.3)`` (the paper does
not give ``p``; one graph from a fixed seed, 14 edges). For each (model, N, ε): five populations
``n_i ~ p(n)`` and five noise draws ``y_ij = n_i + Laplace(|𝒞|/ε)`` per population (add/remove
neighbours, seed 002 Prop. 3), 25 trials. The populations of a given ``(model, N)`` are shared by
the ε values of the grid (the noise draws are not). Methods:

* ``naive``: :func:`~numpyro_dpgm.estimation.naive.naive_mle`'s computation with its default
  ``λ = max(b/N, 10⁻⁴)``, the 25 trials of a cell as one ``jax.vmap``-ed program on an
  accelerator, a loop of the compiled single-trial program on CPU (:func:`resolve_batch`);
* ``cgm_em``: :func:`~numpyro_dpgm.estimation.cgm_em.cgm_em`'s computation
  at the recorded run's settings (naive start with ``4b/N``, 10 EM iterations of 50
  natural-space NLBP steps, no damping halvings: ``fits.EM_*``), batched too;
* ``psgd``: :func:`~numpyro_dpgm.learners.psgd.psgd` on the population's records, ``(ε, 1/N)``;
  ε values it cannot reach are recorded as ``unreachable``;
* ``nonprivate``: the MLE of the exact counts (``λ = 10⁻⁴``), one per population;
* ``random``: Dirichlet(1) random tables per clique, then the same MLE (seed 002's reference).

Metric: exact ``KL(p_true ‖ p_learned) = (θ − φ)·μ(θ) − A(θ) + A(φ)`` by the junction tree.

**Mobility (§4.2).** The Wi-Fi data are not public: users' days are simulated from a known
time-homogeneous chain over ``24`` hourly steps, state 0 meaning "not connected" (a missing
hour) and ``1..L`` access points, with a sticky missing state. Days with no connection at all
are not in the data (a log has no trace of them). The released statistics are the 24 tables of
the chain (the first hour and the 23 transitions); every user-day contributes ``1/K`` to each,
``K`` being its number of transitions that are not missing–missing (seed 002's normalisation),
so one user-day changes each table by at most 1 and the L1 sensitivity is 24. The fitted model
is the tied chain (one node potential on the first hour, one pairwise table shared by all
steps); naive MLE pools its projected tables, CGM-EM runs :class:`~numpyro_dpgm.infer.em.EM`
with the tied parameters, PSGD clips per user-day. Score: mean held-out log-likelihood per
user-day on 25% held-out users.

Outputs (:func:`run`): ``synthetic.csv`` (one row per fit), ``synthetic_summary.csv``,
``runtime.csv`` (each method's time per fit relative to naive MLE), ``vmap_speedup.csv``,
``mobility.csv``, ``mobility_summary.csv``, ``synthetic_<model>.png`` (Fig. 2 style) and
``mobility.png`` (Fig. 3b style), ``meta.json`` (grid, wall time, load averages).

The study's modules: :mod:`.models` (the synthetic graphs, Dirichlet log-potentials, the exact
sampler), :mod:`.fits` (the batched fits of a grid cell and their timing), :mod:`.synthetic` (the
§4.1 grid), :mod:`.mobility` (the §4.2 study), :mod:`.report` (summaries, CSV tables, figures,
markdown) and :mod:`.study` (the grids and :func:`run`).
"""

from __future__ import annotations

from .fits import resolve_batch
from .mobility import mobility_chain, user_weights
from .models import ExactSampler, dirichlet_theta, model_edges, synthetic_network
from .report import summary_markdown
from .study import FULL, QUICK, run

__all__ = [
    "FULL",
    "QUICK",
    "ExactSampler",
    "dirichlet_theta",
    "mobility_chain",
    "model_edges",
    "resolve_batch",
    "run",
    "summary_markdown",
    "synthetic_network",
    "user_weights",
]
