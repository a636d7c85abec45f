"""Workloads shared by the benchmarks: cliques of the bundled Adult data and seed 002's releases.

- :func:`tree_workload` / :func:`three_way_workload`: cliques on Adult's 14 attributes
  (``numpyro_dpgm.load_demo()``), each with the out-of-model query :data:`QUERY`;
  :func:`adult_workload` builds either from the data set by name;
- :func:`seed002_release`: a synthetic model of seed 002 (§4.1; the builders of
  :mod:`studies.bernstein2017`), records drawn from it and their Laplace
  release;
- :func:`mbi_problem`: Gaussian measurements as mbi 2.0 takes them (its domain and loss);
- :data:`ADULT_EDGES` and :func:`adult_data`: networks of edges of the demo's tree, on Adult or
  on records drawn from the model fitted to it (the Bayesian benchmarks);
- :func:`releases` (with :func:`release_cases` and :data:`RELEASE_DATA`): Laplace releases of
  Adult's demo tree, Titanic's tree and seed 002's models with their error measures (the
  benchmarks of naive MLE's and CGM-EM's defaults);
- :func:`user_model_of`: the library's model of a release written by hand with the public
  distributions (the user-model benchmarks).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import networkx as nx
import numpy as np

__all__ = ["ADULT_EDGES", "CHAIN_EDGES", "QUERY", "RELEASE_DATA", "RELEASE_ERRORS",
           "SHARED_DATA", "Clique", "Workload", "add_release_arguments", "adult_data",
           "adult_release", "adult_workload",
           "available_release_data", "mbi_problem",
           "mutual_information", "release_cases", "releases", "seed002_records",
           "seed002_release", "shared_dataset", "three_way_workload", "tree_workload",
           "user_model_of"]

#: The out-of-model query of the Adult workloads (no clique of either holds it).
QUERY = ("age", "fnlwgt", "capital-gain")

Clique = tuple[str, ...]


class Workload(NamedTuple):
    """A named set of cliques with its out-of-model query."""

    name: str
    description: str
    cliques: tuple[Clique, ...]
    query: Clique


# ------------------------------------------------------------------------------------------------
# Adult
# ------------------------------------------------------------------------------------------------
def mutual_information(records: np.ndarray, sizes: Sequence[int], i: int, j: int) -> float:
    """Plug-in mutual information (nats) of columns ``i`` and ``j`` of integer ``records``.

    Parameters
    ----------
    records : int array, shape ``(n, d)``
    sizes : sequence of int
        Number of values of every column.
    i, j : int
        Column indices.

    Returns
    -------
    float
    """
    flat = records[:, i] * sizes[j] + records[:, j]
    joint = np.bincount(flat, minlength=sizes[i] * sizes[j]).reshape(sizes[i], sizes[j])
    p = joint / joint.sum()
    outer = p.sum(1, keepdims=True) * p.sum(0, keepdims=True)
    nz = p > 0
    return float(np.sum(p[nz] * np.log(p[nz] / outer[nz])))


def tree_workload(records: np.ndarray, attrs: Sequence[str], sizes: Sequence[int]) -> Workload:
    """14 one-way + (spanning tree + 2) two-way marginals chosen by mutual information.

    Parameters
    ----------
    records : int array, shape ``(n, d)``
        Codes in domain order.
    attrs : sequence of str
        Attribute names in domain order.
    sizes : sequence of int
        Their numbers of values.

    Returns
    -------
    Workload
    """
    pairs = list(itertools.combinations(range(len(attrs)), 2))
    mi = {(i, j): mutual_information(records, sizes, i, j) for i, j in pairs}
    graph = nx.Graph()
    graph.add_nodes_from(range(len(attrs)))
    graph.add_weighted_edges_from((i, j, w) for (i, j), w in mi.items())
    tree = {tuple(sorted(e)) for e in nx.maximum_spanning_tree(graph, algorithm="kruskal").edges}
    rest = sorted((p for p in pairs if p not in tree), key=lambda p: (-mi[p], p))
    chosen = sorted(tree, key=lambda p: (-mi[p], p)) + rest[:2]
    cliques = tuple((a,) for a in attrs) + tuple((attrs[i], attrs[j]) for i, j in chosen)
    return Workload(
        "tree",
        f"{len(attrs)} one-way + {len(chosen)} two-way marginals: the maximum spanning tree of "
        "pairwise empirical mutual information plus the 2 highest-MI pairs outside it",
        cliques,
        QUERY,
    )


def three_way_workload(attrs: Sequence[str]) -> Workload:
    """The triples of consecutive attributes in domain order.

    Parameters
    ----------
    attrs : sequence of str
        Attribute names in domain order.

    Returns
    -------
    Workload
    """
    cliques = tuple(tuple(attrs[i : i + 3]) for i in range(len(attrs) - 2))
    return Workload(
        "3way",
        f"{len(cliques)} three-way marginals (a_i, a_i+1, a_i+2) of consecutive attributes in "
        "domain order",
        cliques,
        QUERY,
    )


def adult_workload(name: str, dataset: Any) -> Workload:
    """The workload ``name`` (``"tree"`` or ``"3way"``) on a data set's attributes.

    Parameters
    ----------
    name : str
        ``"tree"`` (:func:`tree_workload` of its records) or ``"3way"``
        (:func:`three_way_workload`).
    dataset : numpyro_dpgm.Dataset
        Usually ``numpyro_dpgm.load_demo()``.

    Returns
    -------
    Workload

    Raises
    ------
    ValueError
        For another name.
    """
    attrs = dataset.domain.attrs
    if name == "tree":
        return tree_workload(dataset.to_array(), attrs, dataset.domain.shape)
    if name == "3way":
        return three_way_workload(attrs)
    raise ValueError(f"unknown workload {name!r}; choose from ['tree', '3way']")


# ------------------------------------------------------------------------------------------------
# Seed 002's synthetic models
# ------------------------------------------------------------------------------------------------
def seed002_release(model: str, values: int, seed: int, n: int,
                    epsilon: float) -> tuple[Any, Any, list, float]:
    """A synthetic model of seed 002, ``n`` records from it and the Laplace release of its edges.

    The network has 10 nodes of ``values`` values on the edges of
    :func:`~studies.bernstein2017.model_edges` (``"chain3"`` or ``"er"``), its
    log-potentials are ``log w``, ``w ~ Dirichlet(1)`` per edge (generator ``seed``); the
    records come from ``MarkovRandomField.sample`` (key ``seed``) and every edge table is
    released at ``epsilon`` (add/remove neighbours, the JAX simulation sampler, key
    ``1000 + seed``), with Laplace scale ``b = |E|/ε``.

    Parameters
    ----------
    model : str
        ``"chain3"`` or ``"er"``.
    values : int
        Values per node.
    seed : int
        Seed of the log-potentials, the records and (plus 1000) the noise.
    n : int
        Records.
    epsilon : float
        The release's ε.

    Returns
    -------
    (MarkovNetwork, MarkovRandomField, list of Measurement, float)
        The network, the true model, the release and its Laplace scale ``b``.
    """
    import jax

    from numpyro_dpgm import MarkovRandomField
    from numpyro_dpgm.privacy import simulate_release
    from studies.bernstein2017 import dirichlet_theta, synthetic_network

    net = synthetic_network(model, values)
    edges = list(net.cliques)
    truth = MarkovRandomField(net, dirichlet_theta(net, np.random.default_rng(seed)))
    records = seed002_records(truth, seed, n)
    meas = simulate_release(records, edges, epsilon, jax.random.key(1000 + seed),
                            domain=net.domain)
    return net, truth, meas, len(edges) / epsilon


def seed002_records(truth: Any, seed: int, n: int) -> np.ndarray:
    """The ``n`` records of :func:`seed002_release`'s population ``seed`` (codes in domain
    order), drawn from its true model ``truth`` with key ``seed``."""
    import jax

    return np.asarray(truth.sample(jax.random.key(seed), (n,)))


def mbi_problem(ms: Sequence[Any], domain: Any) -> tuple[Any, Any, list]:
    """mbi's domain, its loss of Gaussian measurements ``ms`` and the measurements themselves
    (``mbi.marginal_loss.LinearMeasurement``), for ``domain`` (this library's)."""
    import mbi
    from mbi import marginal_loss

    mdom = mbi.Domain(domain.attrs, domain.shape)
    lms = [marginal_loss.LinearMeasurement(np.asarray(m.values), tuple(m.clique),
                                           stddev=m.noise.sigma) for m in ms]
    return mdom, marginal_loss.from_linear_measurements(lms, mdom), lms


# ------------------------------------------------------------------------------------------------
# Networks of edges of the demo's tree (the Bayesian benchmarks)
# ------------------------------------------------------------------------------------------------
_SMALL = [("relationship", "sex"), ("relationship", "income>50K"),
          ("income>50K", "education-num"), ("sex", "race")]
#: ``small``: four edges of the demo's tree (97 cells with their one-way tables); ``mid``: eight
#: (842 cells); ``capital``: its leakiest tables, ``income>50K – capital-gain – capital-loss``.
ADULT_EDGES = {
    "small": _SMALL,
    "mid": _SMALL + [("marital-status", "relationship"), ("education-num", "occupation"),
                     ("occupation", "workclass"), ("income>50K", "hours-per-week")],
    "capital": [("income>50K", "capital-gain"), ("capital-gain", "capital-loss")],
}


#: The tree of three 2-way cliques (321 cells): a chain over four of Adult's attributes.
CHAIN_EDGES = [("workclass", "occupation"), ("occupation", "relationship"),
               ("relationship", "education-num")]


def adult_release(records: int, eps: float, seed: int, edges: str = "chain",
                  ) -> tuple[Any, Any, np.ndarray]:
    """The model of a Laplace release at ``eps`` of Adult's tables, its data set and the true
    tables (network layout): ``records`` drawn from the fitted tree of ``edges`` (0: Adult's own
    records); ``edges`` is ``"chain"`` (:data:`CHAIN_EDGES`, the tables alone) or a key of
    :data:`ADULT_EDGES` (with its one-way tables)."""
    import jax

    from numpyro_dpgm import MarkovNetwork
    from numpyro_dpgm.infer.bayes import noisy_marginals_model
    from numpyro_dpgm.privacy import simulate_release

    chain = edges == "chain"
    edges = CHAIN_EDGES if chain else ADULT_EDGES[edges]
    data, with_one_way = adult_data(edges, records or None, seed)
    net = MarkovNetwork(data.domain, edges) if chain else with_one_way
    ms = simulate_release(data, list(net.cliques), eps, jax.random.key(seed + 7))
    truth = net.flatten(data.count(list(net.cliques)))
    return noisy_marginals_model(net, ms, int(data.total)), data, np.asarray(truth, float)


def adult_data(edges: Sequence[Clique], records: int | None, seed: int) -> tuple[Any, Any]:
    """Adult restricted to the edges' attributes (``records=None``), or ``records`` records drawn
    from the junction-tree MLE of its true tables; the network has the edges and one-ways."""
    import jax
    import pandas as pd

    from numpyro_dpgm import Dataset, MarkovNetwork, load_demo
    from numpyro_dpgm.data import count
    from numpyro_dpgm.oracles import junction_tree as jt

    adult = load_demo()
    attrs = [a for a in adult.domain.attrs if any(a in e for e in edges)]
    dom = adult.domain.project(attrs)
    data = Dataset(adult.records[attrs], dom)
    net = MarkovNetwork(dom, list(edges) + [(a,) for a in attrs])
    if records is None:
        return data, net
    tree = MarkovNetwork(dom, list(edges))
    truth = count(data.records, tree.cliques, dom)
    jtree = jt.build_junction_tree(tree, "min_fill")
    by_set = {frozenset(c): c for c in tree.cliques}
    tables = {}
    for i, c in enumerate(jtree.cliques):  # the MLE of a tree: θ_C = log μ_C − log μ_S
        clique = by_set[frozenset(c)]
        mu = (np.asarray(truth[clique], dtype=float) + 1e-9) / data.total
        sep = [clique.index(a) for a in jtree.separators[i]]
        tables[clique] = np.log(mu) - (np.log(mu.sum(axis=tuple(
            j for j in range(len(clique)) if j not in sep), keepdims=True)) if sep else 0.0)
    theta = tree.flatten(tables)
    codes = np.asarray(jt.sample(tree, theta, jax.random.key(seed), int(records)))
    return Dataset(pd.DataFrame(codes, columns=list(dom.attrs)), dom), net


# ------------------------------------------------------------------------------------------------
# Laplace releases with their error measures
# ------------------------------------------------------------------------------------------------
#: Data sets of :func:`releases`.
RELEASE_DATA = ("adult", "titanic", "chain3", "er", "chain3-v5")

#: What the ``error`` of :func:`releases` measures, per data set.
RELEASE_ERRORS = {"adult": "mean L1 on the released tables", "titanic": "same",
                  "chain3": "KL(truth || fit)", "er": "same", "chain3-v5": "same"}

#: The shared data folder beside a source checkout (Titanic is read from there).
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _tables_case(dataset: Any, cliques: list, eps: float, seed: int) -> tuple:
    import jax

    from numpyro_dpgm.metrics import marginal_l1_error
    from numpyro_dpgm.network import MarkovNetwork
    from numpyro_dpgm.privacy import simulate_release

    network = MarkovNetwork(dataset.domain, cliques)
    truth = dataset.count(cliques)
    meas = simulate_release(dataset, cliques, eps, jax.random.key(seed))
    return (network, meas, float(dataset.total), lambda m: float(marginal_l1_error(m, truth)),
            truth)


def shared_dataset(name: str) -> Any:
    """``name``'s records and domain from :data:`SHARED_DATA` (``NAME.csv``,
    ``NAME-domain.json``), as a :class:`numpyro_dpgm.data.Dataset`."""
    import pandas as pd

    from numpyro_dpgm.data import Dataset
    from numpyro_dpgm.domain import Domain

    domain = Domain(json.loads((SHARED_DATA / f"{name}-domain.json").read_text()))
    return Dataset(pd.read_csv(SHARED_DATA / f"{name}.csv")[list(domain.attrs)], domain)


def add_release_arguments(parser: Any, *, sizes: list[int], seeds: int) -> None:
    """The options that pick :func:`releases`: ``--data``, ``--sizes`` (records of the
    ``chain3`` and ``er`` populations), ``--epsilons`` and ``--seeds`` (releases per data set,
    size and ε), with the benchmark's defaults for the last two."""
    parser.add_argument("--data", nargs="+", default=list(RELEASE_DATA), choices=RELEASE_DATA)
    parser.add_argument("--sizes", type=int, nargs="+", default=sizes,
                        help="records of the chain3 and er populations")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.1, 1.0, 10.0])
    parser.add_argument("--seeds", type=int, default=seeds,
                        help="releases per data set, size and ε")


def available_release_data(data: Sequence[str]) -> list[str]:
    """``data`` without ``titanic`` when :data:`SHARED_DATA` lacks it (said on stdout)."""
    keep = [d for d in data if d != "titanic" or (SHARED_DATA / "titanic.csv").exists()]
    if len(keep) < len(data):
        print(f"titanic skipped: {SHARED_DATA / 'titanic.csv'} is not there")
    return keep


def release_cases(data: list[str], sizes: list[int]) -> list[tuple[str, int | None]]:
    """``(data set, N)`` pairs: every size for ``chain3`` and ``er``, ``None`` for the rest."""
    return [(d, n) for d in data for n in (sizes if d in ("chain3", "er") else [None])]


def releases(name: str, size: int | None, eps: float, seeds: range) -> Iterator[tuple]:
    """``(network, measurements, N, error, tables)`` per seed: ``error(model)`` against the
    truth, ``tables`` the records' true tables of the released cliques."""
    if name in ("adult", "titanic"):
        from numpyro_dpgm.data import load_demo
        from numpyro_dpgm.demo import ADULT_TREE

        if name == "adult":
            dataset = load_demo("adult")
            cliques = list(ADULT_TREE) + [(a,) for a in dataset.domain.attrs]
        else:
            dataset = shared_dataset("titanic")
            attrs = list(dataset.domain.attrs)
            cliques = list(tree_workload(dataset.to_array(), attrs,
                                         [dataset.domain[a] for a in attrs]).cliques)
        for seed in seeds:
            yield _tables_case(dataset, cliques, eps, seed)
        return
    from numpyro_dpgm.data import count
    from numpyro_dpgm.metrics import kl_divergence

    model, values, n = ("chain3", 5, 100_000) if name == "chain3-v5" else (name, 10, size)
    for seed in seeds:
        net, truth, meas, _ = seed002_release(model, values, seed, n, eps)
        tables = count(seed002_records(truth, seed, n), [m.clique for m in meas], net.domain)
        yield net, meas, float(n), lambda m, t=truth: float(kl_divergence(t, m)), tables


def user_model_of(lib: Any, prior: str = "normal") -> Any:
    """The library model ``lib`` written by hand with the public distributions; ``prior``:
    the library's ``N(0, s²)`` on ``φ`` (``"normal"``), or ``"dirichlet"``: a
    ``ConditionalDirichlet`` whose concentration ``concentration_from_release`` reads from
    ``lib``'s released tables (the network's own cliques, Laplace noise)."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    from numpyro_dpgm.distributions import CollectiveGraphicalModel, LaplaceNoise
    from numpyro_dpgm.infer.bayes import ConditionalDirichlet, concentration_from_release

    net, coding, total = lib.latent_network, lib.coding, int(lib.total_count)
    scale = jnp.broadcast_to(jnp.asarray(lib.prior_scale, dtype=float), (coding.dim,))
    b = jnp.asarray(lib.noise_scales)
    if prior == "normal":
        phi_prior = dist.Normal(0.0, scale).to_event(1)
    elif prior == "dirichlet":
        if np.shape(lib.y) != (net.num_params,):
            raise ValueError("prior='dirichlet' reads its concentration from the released "
                             "tables of the network's cliques; this release answers "
                             f"{np.shape(lib.y)} values, not the {net.num_params} cells")
        found = concentration_from_release(coding, np.asarray(lib.y),
                                           2.0 * np.asarray(lib.noise_scales) ** 2)
        phi_prior = ConditionalDirichlet(coding, found.concentration)
    else:
        raise ValueError(f"prior must be 'normal' or 'dirichlet', got {prior!r}")

    def model(y):
        phi = numpyro.sample("phi", phi_prior)
        theta = numpyro.deterministic("theta", coding.to_theta(phi))
        n = numpyro.sample("n", CollectiveGraphicalModel(net, theta, total,
                                                         normalized=lib.normalized))
        numpyro.sample("y", LaplaceNoise(lib.predict(n), b), obs=y)

    return model
