"""Privately learning Markov random fields (seed 001: Zhang, Kamath, Kulkarni & Wu 2020).

Parameter learning under ρ-zCDP by per-node private sparse logistic regression, the private
Frank–Wolfe of :mod:`~numpyro_dpgm.learners.frank_wolfe` (Alg. 1) inside:

* :func:`learn_ising` (:mod:`.ising`) — Ising models
  ``P(z) ∝ exp(Σ_{i<j} A_ij z_i z_j + Σ_i θ_i z_i)`` on ``{±1}^p`` (Alg. 2; Lemma 3.7, Thm 3.8);
* :func:`learn_pairwise` (:mod:`.pairwise`) — pairwise models
  ``P(z) ∝ exp(Σ_{i<j} W_ij(z_i, z_j) + Σ_i θ_i(z_i))`` on ``[k]^p`` with centred ``W_ij``
  (Alg. 3; Lemma 3.10, Eq. (1), Thm 3.11);
* :func:`learn_twise` (:mod:`.twise`) — binary t-wise MRFs ``P(z) ∝ exp(h(z))``, ``h``
  multilinear of degree ``≤ t`` (Alg. 4, §4.1; and Alg. 5, §4.2, with the parity queries released
  by private multiplicative weights, :func:`pmw_parities` in :mod:`.parities`, Lemma 4.5);

and structure learning under (ε, δ)-DP by sample-and-aggregate with a stability-based mode
(:func:`learn_structure`, :func:`stable_mode` in :mod:`.structure`; Lemma 6.1, Cor. 6.3). The
learned parameters become MarkovRandomFields by the functions of :mod:`.conversions`.

The reconstruction of the algorithm boxes, constants and tests follows the spec
``notes/zhang2020.md``; its tags are cited as ``[spec §n]``.

Conventions
-----------
* Records. The Ising learners take spins ``±1`` (``coding="spin"``) or the library's codes
  ``0/1`` (``coding="code"``, or a :class:`~numpyro_dpgm.data.Dataset`); code ``a`` is the spin
  ``s_a = 1 − 2a`` (code 0 ↔ +1, code 1 ↔ −1). The pairwise learner takes codes in ``[k_i]``.
* Models. Every learner returns a :class:`~numpyro_dpgm.infer.result.Result` whose model is
  a :class:`~numpyro_dpgm.distributions.mrf.MarkovRandomField` with one single-attribute clique
  per node (``θ``) and one pair clique per estimated edge, in the library's overcomplete
  layout: the Ising pair table is ``A_ij s_a s_b`` and the field table ``θ_i s_a``
  (:func:`ising_to_mrf`); the pairwise tables are ``W_ij(a, b)`` and ``θ_i(a)``
  (:func:`pairwise_to_mrf`); a t-wise monomial ``I`` has the table ``h̄(I) Π_{j∈I} s_{a_j}``
  (:func:`twise_to_mrf`). The per-node estimates are not symmetric (``Â_ij`` comes from node
  ``i``'s regression); the model uses the symmetric part ``(Â + Âᵀ)/2``.
* Privacy. Neighbouring datasets have the same public size ``n`` and differ in one record. A
  learner computes its whole charge first and raises
  :class:`~numpyro_dpgm.privacy.BudgetExceededError` before touching the data when the ledger
  cannot pay it; then it debits one entry per node (per regression family) and runs. The noise
  (Laplace in Alg. 1, Laplace in PMW and the stable histogram, Gaussian for the alternative
  parity release) is drawn from the given JAX key: reproducible, meant for simulation studies.
* Diagnostics. Loss traces, Frank–Wolfe gaps and block histograms in ``extras`` are computed on
  the raw data and are not private; do not release them.
* Computation. The logistic losses are sums over records, so they are evaluated on the distinct
  records with their multiplicities (exactly the same sums; typically far fewer rows).
"""

from .conversions import ising_to_mrf, pairwise_to_mrf, twise_to_mrf
from .ising import learn_ising
from .pairwise import learn_pairwise
from .parities import PMWResult, pmw_parities
from .structure import StructureResult, learn_structure, stable_mode
from .twise import learn_twise, monomial_estimates

__all__ = [
    "PMWResult",
    "StructureResult",
    "ising_to_mrf",
    "learn_ising",
    "learn_pairwise",
    "learn_structure",
    "learn_twise",
    "monomial_estimates",
    "pairwise_to_mrf",
    "pmw_parities",
    "stable_mode",
    "twise_to_mrf",
]
