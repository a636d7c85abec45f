"""Select–measure–generate mechanisms for private synthetic data: MST, AIM and MWEM+PGM.

Each mechanism chooses which marginals of the data to measure, measures them with calibrated
noise, and fits a graphical model to the noisy measurements with Prox-PGM; the model's
records are the synthetic data. All follow the learners' contract
``f(data, domain, *, budget, rng_key=None, ledger=None, **options) -> Result``:

* :func:`mst`: MST (McKenna, Miklau & Sheldon 2021): one-way marginals, domain compression,
  a maximum spanning tree of pairs chosen by the exponential mechanism;
* :func:`aim`: AIM (McKenna, Mullins, Sheldon & Miklau 2022): workload-adaptive rounds with
  budget annealing under a model-size cap;
* :func:`mwem_pgm`: MWEM with a graphical-model back end (seed 003, §5).

Building blocks: :mod:`.selection` (the exponential mechanism, OpenDP or seeded JAX),
:mod:`.workload` (workloads, AIM's candidate weights, the workload error), :mod:`.compression`
(MST's domain compression) and :mod:`.refit` (warm-started refits and their costs).
"""

from .aim import aim
from .compression import Compression, compress_domain
from .mst import mst
from .mwem import mwem_pgm
from .selection import Selection, exponential_mechanism, selection_epsilon
from .workload import (
    all_marginals,
    candidate_weights,
    check_workload,
    downward_closure,
    target_marginals,
    workload_error,
)

__all__ = [
    "Compression",
    "Selection",
    "aim",
    "all_marginals",
    "candidate_weights",
    "check_workload",
    "compress_domain",
    "downward_closure",
    "exponential_mechanism",
    "mst",
    "mwem_pgm",
    "selection_epsilon",
    "target_marginals",
    "workload_error",
]
