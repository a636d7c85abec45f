"""Brute-force reference for log-linear models: enumerate every record of the domain.

Everything here is plain numpy/scipy and reads only a network's domain and clique list (never its
parameter layout helpers nor any inference routine), so it is an independent oracle for the
library's exact inference. Joints are kept small (at most ~50k records).
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.special import logsumexp
from scipy.stats import chisquare

from numpyro_dpgm import MarkovNetwork

__all__ = [
    "ATOL",
    "RTOL",
    "BruteForce",
    "Reference",
    "assert_close",
    "chi_square_pvalue",
    "empirical_tv",
    "reference",
    "tv_bound",
    "Structure",
    "STRUCTURES",
    "MAX_STATES",
    "structure",
    "random_model",
    "split_theta",
    "exact_kl",
]

MAX_STATES = 50_000

Clique = tuple[str, ...]


def split_theta(network: MarkovNetwork, theta: np.ndarray) -> dict[Clique, np.ndarray]:
    """Cut a flat parameter vector into clique tables (concatenation of C-order ravels)."""
    theta = np.asarray(theta, dtype=np.float64)
    tables: dict[Clique, np.ndarray] = {}
    offset = 0
    for clique in network.cliques:
        shape = tuple(network.domain[a] for a in clique)
        size = math.prod(shape)
        tables[tuple(clique)] = theta[offset : offset + size].reshape(shape)
        offset += size
    if offset != theta.shape[-1]:
        raise ValueError(f"theta has {theta.shape[-1]} entries; the cliques need {offset}")
    return tables


class BruteForce:
    """The full joint ``p(x) ∝ exp(Σ_C θ_C(x_C))`` of a network, as an array over the domain.

    Axis ``i`` of :attr:`log_joint` is the ``i``-th attribute of the domain.
    """

    def __init__(self, network: MarkovNetwork, theta: np.ndarray):
        self.network = network
        self.attrs: tuple[str, ...] = tuple(network.domain)
        self.shape: tuple[int, ...] = tuple(network.domain[a] for a in self.attrs)
        n_states = math.prod(self.shape)
        if n_states > MAX_STATES:
            raise ValueError(f"joint has {n_states} states; the oracle stops at {MAX_STATES}")
        log_joint = np.zeros(self.shape, dtype=np.float64)
        letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
        axis_of = {a: i for i, a in enumerate(self.attrs)}
        for clique, table in split_theta(network, theta).items():
            # einsum broadcasts the clique table (in the clique's own axis order) into the joint
            src = "".join(letters[axis_of[a]] for a in clique)
            dst = "".join(letters[axis_of[a]] for a in self.attrs if a in clique)
            view = np.einsum(f"{src}->{dst}", table)
            bshape = tuple(k if a in clique else 1 for a, k in zip(self.attrs, self.shape,
                                                                    strict=True))
            log_joint = log_joint + view.reshape(bshape)
        self.log_joint: np.ndarray = log_joint
        self.log_z: float = float(logsumexp(log_joint)) if log_joint.size else 0.0
        self.joint: np.ndarray = np.exp(log_joint - self.log_z)

    def marginal(self, attrs: Iterable[str] | str) -> np.ndarray:
        """Marginal over ``attrs``, axes in the order given."""
        attrs = (attrs,) if isinstance(attrs, str) else tuple(attrs)
        keep = [self.attrs.index(a) for a in attrs]
        drop = tuple(i for i in range(len(self.attrs)) if i not in keep)
        table = self.joint.sum(axis=drop)
        kept_sorted = sorted(keep)
        return np.transpose(table, [kept_sorted.index(i) for i in keep])

    def clique_marginals(self) -> dict[Clique, np.ndarray]:
        """Marginal of every clique of the network, axes in each clique's order."""
        return {tuple(c): self.marginal(c) for c in self.network.cliques}

    def log_prob(self, records: np.ndarray) -> np.ndarray:
        """Exact log-probability of records of shape ``(..., num_attrs)`` (domain order)."""
        records = np.asarray(records)
        idx = tuple(records[..., i] for i in range(len(self.attrs)))
        return self.log_joint[idx] - self.log_z

    def records(self) -> np.ndarray:
        """Every record of the domain, shape ``(num_states, num_attrs)``, in C order."""
        grids = np.indices(self.shape).reshape(len(self.shape), -1)
        return grids.T.copy()

    def probs(self) -> np.ndarray:
        """Probability of each record of :meth:`records`, same order."""
        return self.joint.reshape(-1)

    def mean(self) -> np.ndarray:
        """Expected code of every attribute."""
        return np.array([
            np.dot(self.marginal(a), np.arange(self.network.domain[a])) for a in self.attrs
        ])


def features(net: MarkovNetwork, records: np.ndarray) -> np.ndarray:
    """``φ(x)`` of every record (domain order): one-hot clique tables, C order, concatenated."""
    attrs = tuple(net.domain)
    blocks = []
    for clique in net.cliques:
        shape = tuple(net.domain[a] for a in clique)
        cell = np.ravel_multi_index(tuple(records[:, attrs.index(a)] for a in clique), shape)
        block = np.zeros((len(records), math.prod(shape)))
        block[np.arange(len(records)), cell] = 1.0
        blocks.append(block)
    return np.concatenate(blocks, axis=1)


def exact_kl(p: BruteForce, q: BruteForce) -> float:
    """``KL(p ‖ q) = Σ_x p(x) (log p(x) − log q(x))`` over the whole joint."""
    if p.attrs != q.attrs or p.shape != q.shape:
        raise ValueError("models over different domains")
    logp = p.log_joint - p.log_z
    logq = q.log_joint - q.log_z
    return float(np.sum(p.joint * (logp - logq)))


# ------------------------------------------------------------------------------------------------
# Catalogue of structures
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Structure:
    """A named domain with cliques, plus attribute sets to query out of the model."""

    name: str
    domain: tuple[tuple[str, int], ...]
    cliques: tuple[Clique, ...]
    queries: tuple[Clique, ...] = ()
    decomposable: bool | None = None  # None: not asserted

    def network(self) -> MarkovNetwork:
        """The library's network for this structure."""
        return MarkovNetwork(dict(self.domain), self.cliques)

    @property
    def num_states(self) -> int:
        return math.prod(k for _, k in self.domain)


def _dom(names: Sequence[str], sizes: Sequence[int]) -> tuple[tuple[str, int], ...]:
    return tuple(zip(names, sizes, strict=True))


def _chain(n: int, sizes: Sequence[int]) -> Structure:
    names = [f"v{i}" for i in range(n)]
    cliques = tuple((names[i], names[i + 1]) for i in range(n - 1))
    return Structure(f"chain{n}", _dom(names, sizes), cliques,
                     queries=((names[0], names[-1]), (names[-1], names[n // 2], names[0])),
                     decomposable=True)


def _cycle(n: int, sizes: Sequence[int]) -> Structure:
    names = [f"c{i}" for i in range(n)]
    cliques = tuple((names[i], names[(i + 1) % n]) for i in range(n))
    spread = (names[0], names[2], names[n - 1]) if n > 4 else (names[2], names[0])
    return Structure(f"cycle{n}", _dom(names, sizes), cliques,
                     queries=((names[0], names[2]), spread, (names[3], names[1], names[0])),
                     decomposable=False)


def _grid3() -> Structure:
    names = [[f"g{i}{j}" for j in range(3)] for i in range(3)]
    sizes = [2, 3, 2, 3, 2, 3, 2, 3, 2]
    flat = [a for row in names for a in row]
    cliques = []
    for i in range(3):
        for j in range(3):
            if j < 2:
                cliques.append((names[i][j], names[i][j + 1]))
            if i < 2:
                cliques.append((names[i][j], names[i + 1][j]))
    return Structure(
        "grid3x3", _dom(flat, sizes), tuple(cliques),
        queries=(("g00", "g22"), ("g22", "g02", "g20"), ("g20", "g02")),
        decomposable=False,
    )


STRUCTURES: tuple[Structure, ...] = (
    Structure("single", _dom(["a"], [5]), (("a",),), queries=(("a",),), decomposable=True),
    _chain(3, [2, 3, 4]),
    _chain(6, [2, 3, 2, 4, 3, 5]),
    Structure(
        "tree",
        _dom(["r", "a", "b", "c", "d", "e", "f"], [3, 2, 4, 2, 3, 2, 5]),
        (("r", "a"), ("r", "b"), ("a", "c"), ("a", "d"), ("b", "e"), ("e", "f")),
        queries=(("c", "f"), ("d", "e", "c")),
        decomposable=True,
    ),
    Structure(
        "star",
        _dom(["hub", "l1", "l2", "l3", "l4", "l5"], [3, 2, 3, 4, 5, 2]),
        (("hub", "l1"), ("l2", "hub"), ("hub", "l3"), ("l4", "hub"), ("hub", "l5")),
        queries=(("l1", "l2"), ("l5", "l3", "l4")),
        decomposable=True,
    ),
    _cycle(4, [2, 3, 4, 5]),
    _cycle(5, [3, 2, 4, 3, 2]),
    _grid3(),
    Structure(
        "clique3_plus_edges",
        _dom(["a", "b", "c", "d", "e"], [2, 3, 4, 2, 3]),
        (("a", "b", "c"), ("c", "d"), ("b", "d"), ("d", "e"), ("e", "a")),
        queries=(("a", "d"), ("e", "c"), ("b", "e", "c")),
        decomposable=False,
    ),
    Structure(
        "triangles_sharing_edge",
        _dom(["a", "b", "c", "d"], [3, 2, 4, 3]),
        (("a", "b", "c"), ("b", "c", "d")),
        queries=(("a", "d"), ("d", "a", "b")),
        decomposable=True,
    ),
    Structure(
        "disconnected",
        _dom(["a", "b", "c", "d", "e", "f"], [2, 3, 4, 3, 2, 5]),
        (("a", "b"), ("b", "c"), ("d", "e")),
        queries=(("a", "d"), ("f", "c"), ("e", "f", "a")),
        decomposable=True,
    ),
    Structure(
        "attr_in_no_clique",
        _dom(["a", "z", "b", "c"], [3, 4, 2, 3]),
        (("a", "b"), ("b", "c")),
        queries=(("z",), ("z", "c"), ("c", "z", "a")),
        decomposable=True,
    ),
    Structure(
        "nondomain_order",
        _dom(["a", "b", "c", "d", "e"], [2, 3, 4, 5, 2]),
        (("c", "a", "b"), ("d", "b"), ("e", "d"), ("e", "c")),
        queries=(("e", "a"), ("d", "c", "a")),
        decomposable=False,
    ),
    Structure(
        "oneway_beside_twoway",
        _dom(["a", "b", "c", "d"], [4, 3, 2, 5]),
        (("a",), ("a", "b"), ("b",), ("c", "b"), ("c",), ("d",), ("c", "d")),
        queries=(("a", "d"), ("d", "a", "b")),
        decomposable=True,
    ),
    Structure(
        "sizes_1_to_5",
        _dom(["one", "two", "three", "four", "five"], [1, 2, 3, 4, 5]),
        (("one", "two"), ("two", "three"), ("three", "four", "five"), ("five", "one")),
        queries=(("one", "four"), ("five", "two"), ("four", "two", "one")),
        decomposable=False,
    ),
    Structure(
        "no_cliques",
        _dom(["a", "b"], [3, 2]),
        (),
        queries=(("b", "a"),),
        decomposable=True,
    ),
)

for _s in STRUCTURES:
    assert _s.num_states <= MAX_STATES, _s.name


def structure(name: str) -> Structure:
    """The catalogue entry called ``name``."""
    for s in STRUCTURES:
        if s.name == name:
            return s
    raise KeyError(f"no structure {name!r}; have {[s.name for s in STRUCTURES]}")


def random_model(
    structure: Structure, rng: np.random.Generator, scale: float = 1.0
) -> tuple[MarkovNetwork, np.ndarray]:
    """The structure's network with log-potentials drawn uniformly from ``[-scale, scale]``."""
    net = structure.network()
    return net, rng.uniform(-scale, scale, size=net.num_params)


# ------------------------------------------------------------------------------------------------
# Cached references and comparison helpers
# ------------------------------------------------------------------------------------------------
RTOL = 1e-8
ATOL = 1e-8


class Reference(NamedTuple):
    """A structure's network with fixed random log-potentials and its brute-force joint."""

    structure: Structure
    network: MarkovNetwork
    theta: np.ndarray
    exact: BruteForce


@functools.cache
def reference(name: str, scale: float = 1.0, seed: int = 0) -> Reference:
    """Deterministic random model of the catalogue entry ``name`` (cached per process)."""
    s = structure(name)
    rng = np.random.default_rng([zlib.crc32(name.encode()), seed, int(scale * 1000)])
    net, theta = random_model(s, rng, scale)
    theta.setflags(write=False)
    return Reference(s, net, theta, BruteForce(net, theta))


def assert_close(actual: object, expected: object, what: str = "") -> None:
    """``actual`` equals ``expected`` to 1e-8 relative and absolute tolerance (float64)."""
    actual = np.asarray(actual)
    assert actual.dtype == np.float64, f"{what}: expected float64, got {actual.dtype}"
    np.testing.assert_allclose(actual, np.asarray(expected), rtol=RTOL, atol=ATOL, err_msg=what)


def tv_bound(probs: np.ndarray, num_samples: int, delta: float = 1e-6) -> float:
    """Bound that the empirical total variation of ``num_samples`` exact draws exceeds w.p. < δ.

    ``E[TV] ≤ ½ Σ_i sqrt(p_i (1 − p_i) / n)`` (Jensen, per cell), and TV changes by at most
    ``1/n`` when one draw changes, so McDiarmid adds ``sqrt(log(1/δ) / (2n))``.
    """
    p = np.clip(np.asarray(probs, dtype=np.float64), 0.0, 1.0)
    mean_bound = 0.5 * float(np.sum(np.sqrt(p * (1 - p) / num_samples)))
    return mean_bound + math.sqrt(math.log(1 / delta) / (2 * num_samples))


def empirical_tv(samples: np.ndarray, probs: np.ndarray, shape: tuple[int, ...]) -> float:
    """Total variation between the frequencies of records ``samples`` and the table ``probs``."""
    flat = np.ravel_multi_index(tuple(np.asarray(samples).T), shape)
    freq = np.bincount(flat, minlength=math.prod(shape)) / len(flat)
    return 0.5 * float(np.abs(freq - np.asarray(probs).reshape(-1)).sum())


def chi_square_pvalue(samples: np.ndarray, probs: np.ndarray, shape: tuple[int, ...]) -> float:
    """Pearson chi-square p-value of sample counts against ``probs``.

    Cells with expected count below 5 are pooled into one cell so the asymptotics hold.
    """
    flat = np.ravel_multi_index(tuple(np.asarray(samples).T), shape)
    n = len(flat)
    counts = np.bincount(flat, minlength=math.prod(shape)).astype(np.float64)
    expected = np.asarray(probs, dtype=np.float64).reshape(-1) * n
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        assert obs[-1] == 0, "samples fell in cells of probability zero"
        obs, exp = obs[:-1], exp[:-1]
    exp = exp * (obs.sum() / exp.sum())  # remove float round-off before scipy's sum check
    return float(chisquare(obs, exp).pvalue)
