"""The default triangulation ``"auto"``: the cheaper junction tree of min-fill and min-size.

Two 4-cycles where a different heuristic wins (each tree is built explicitly to check the
choice), exactness of the chosen tree against enumeration, Appendix C.4's Adult cliques (refused
under min-fill, accepted by default), and the content of the memory errors.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from oracles.brute_force import BruteForce, assert_close

from numpyro_dpgm import MarkovNetwork
from numpyro_dpgm.distributions.mrf import MarkovRandomField
from numpyro_dpgm.oracles import ExactOracle, memory
from numpyro_dpgm.oracles import junction_tree as jt
from numpyro_dpgm.oracles import triangulation as tr
from studies.mckenna2021 import adult_cliques, load_demo


def _cells(tree: jt.JunctionTree) -> dict[frozenset, int]:
    return {frozenset(c): tree.domain.size(c) for c in tree.cliques}


def min_fill_wins() -> MarkovNetwork:
    """Cycle a-b-d-c-a: min-size's first step, eliminating ``c`` ({a, c, d}: 50 cells, the
    smallest new clique), leaves the triangle {a, b, d} of 250 cells (300 in all); min-fill's
    chord b-c gives {a, b, c} and {b, c, d}, 100 cells each."""
    return MarkovNetwork({"a": 5, "b": 10, "c": 2, "d": 5},
                         [("c", "d"), ("a", "c"), ("b", "d"), ("a", "b")])


def min_size_wins() -> MarkovNetwork:
    """Cycle a-d-b-c-a with two 10-value attributes opposite each other: min-fill's chord joins
    them ({a, c, d} and {b, c, d}, 200 cells each), min-size's joins the 2-value pair ({a, b, c}
    and {a, b, d}, 40 cells each)."""
    return MarkovNetwork({"a": 2, "b": 2, "c": 10, "d": 10},
                         [("a", "d"), ("b", "d"), ("b", "c"), ("a", "c")])


CASES = {
    "min_fill": (min_fill_wins, {frozenset("abc"): 100, frozenset("bcd"): 100},
                 {frozenset("acd"): 50, frozenset("abd"): 250}),
    "min_size": (min_size_wins, {frozenset("acd"): 200, frozenset("bcd"): 200},
                 {frozenset("abc"): 40, frozenset("abd"): 40}),
}


# ------------------------------------------------------------------------------------------------
# The choice
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("winner", sorted(CASES))
def test_auto_keeps_the_tree_with_fewer_cells(winner: str) -> None:
    """Each heuristic builds its own tree; "auto" (the default) is the cheaper one, cached."""
    make, fill_cliques, size_cliques = CASES[winner]
    net = make()
    by_fill, by_size = jt.build_junction_tree(net, "min_fill"), jt.build_junction_tree(
        net, "min_size")
    assert _cells(by_fill) == fill_cliques and _cells(by_size) == size_cliques
    cheaper = by_fill if winner == "min_fill" else by_size
    assert cheaper.num_cells < (by_size if winner == "min_fill" else by_fill).num_cells
    assert jt.build_junction_tree(net, "auto") is cheaper
    assert jt.build_junction_tree(net) is cheaper  # the default
    assert jt.build_junction_tree(MarkovNetwork(dict(net.domain), list(net.cliques))) is cheaper
    assert tr.DEFAULT_METHOD == "auto" and tr.METHODS == ("auto", "min_fill", "min_size")
    # naming a heuristic still gives exactly that heuristic's tree
    assert jt.build_junction_tree(net, "min_fill") is by_fill
    assert jt.build_junction_tree(net, "min_size") is by_size


def test_a_tie_keeps_min_fill() -> None:
    """Equal cells (a chain, and a 4-cycle of equal attributes) keep min-fill's tree."""
    for net in (MarkovNetwork({"a": 2, "b": 3, "c": 4}, [("a", "b"), ("b", "c")]),
                MarkovNetwork({a: 3 for a in "abcd"},
                              [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")])):
        by_fill, by_size = (jt.build_junction_tree(net, m) for m in ("min_fill", "min_size"))
        assert by_fill is not by_size and by_fill.num_cells == by_size.num_cells
        assert jt.build_junction_tree(net) is by_fill


def test_defaults_and_the_three_methods() -> None:
    """Every entry point defaults to "auto"; a bad method names the three valid ones."""
    net = min_size_wins()
    theta = jnp.zeros(net.num_params)
    assert ExactOracle(net).method == "auto" and ExactOracle(net, "min_size").method == "min_size"
    assert MarkovRandomField(net, theta).method == "auto"
    three = "use 'auto', 'min_fill' or 'min_size'"
    for call in (lambda: jt.build_junction_tree(net, "min_degree"),
                 lambda: jt.log_partition(net, theta, "min_degree"),
                 lambda: ExactOracle(net, "min_degree"),
                 lambda: MarkovRandomField(net, theta, method="min_degree"),
                 lambda: tr.check_method(None)):
        with pytest.raises(ValueError, match=f"unknown triangulation method .*; {three}$"):
            call()


# ------------------------------------------------------------------------------------------------
# Exactness of the chosen tree
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("winner", sorted(CASES))
def test_auto_answers_as_its_heuristic_and_as_enumeration(winner: str) -> None:
    """log Z, clique marginals, an out-of-model marginal and the oracle's output under the
    default equal those of the chosen heuristic (bit for bit) and enumeration of the joint."""
    net = CASES[winner][0]()
    theta = np.random.default_rng(21).uniform(-3.0, 3.0, net.num_params)
    exact = BruteForce(net, theta)
    theta = jnp.asarray(theta)
    log_z = jt.log_partition(net, theta)
    assert float(log_z) == float(jt.log_partition(net, theta, winner))
    assert_close(log_z, exact.log_z, "log Z")
    mus, theirs = jt.marginals(net, theta), jt.marginals(net, theta, 1.0, winner)
    for c in net.cliques:
        np.testing.assert_array_equal(np.asarray(mus[c]), np.asarray(theirs[c]))
        assert_close(mus[c], exact.marginal(c), f"marginal {c}")
    query = ("d", "a", "b")  # in no network clique; in a tree clique only under min-size's tree
    mu = jt.marginal(net, theta, query)
    np.testing.assert_array_equal(np.asarray(mu), np.asarray(jt.marginal(net, theta, query,
                                                                         winner)))
    assert_close(mu, exact.marginal(query), f"marginal {query}")
    mu, log_z, _ = ExactOracle(net)(theta, ())
    mu_w, log_z_w, _ = ExactOracle(net, winner)(theta, ())
    np.testing.assert_array_equal(np.asarray(mu), np.asarray(mu_w))
    assert float(log_z) == float(log_z_w)
    assert_close(mu, np.concatenate([exact.marginal(c).ravel() for c in net.cliques]))


# ------------------------------------------------------------------------------------------------
# Appendix C.4's Adult cliques
# ------------------------------------------------------------------------------------------------
def test_adult_c4_cliques_pass_the_memory_check_by_default(monkeypatch) -> None:
    """Min-fill asks for a clique of 7 attributes (5.7·10⁹ cells) above the 1 GiB cap;
    the default keeps min-size's 1.4·10⁷ cells and passes."""
    monkeypatch.delenv(memory.MAX_CLIQUE_BYTES_ENV, raising=False)
    domain = load_demo().domain
    net = MarkovNetwork(domain, adult_cliques(domain))
    by_fill = jt.build_junction_tree(net, "min_fill")
    by_size = jt.build_junction_tree(net, "min_size")
    assert max(len(c) for c in by_fill.cliques) == 7
    assert by_fill.num_cells == 5_886_162_600 and by_size.num_cells == 13_682_104
    with pytest.raises(memory.CliqueTooLargeError) as err:
        memory.check_memory(by_fill, network=net)
    assert "5,712,000,000 cells" in str(err.value)
    assert "alternatives: method='min_size' (it fits)" in str(err.value)
    assert jt.build_junction_tree(net) is by_size
    memory.check_memory(jt.build_junction_tree(net), network=net)
    memory.check_memory(jt.build_junction_tree(net))


# ------------------------------------------------------------------------------------------------
# The memory errors
# ------------------------------------------------------------------------------------------------
def test_cap_error_names_cliques_heuristics_and_alternatives(monkeypatch) -> None:
    """Min-fill's tree of :func:`min_size_wins` has two 200-cell cliques (1,600 bytes); with a
    cap of 1,000 bytes the error names both, what each heuristic needs, min-size (which fits),
    the approximate oracle, and the exact ways to raise the cap, which then work."""
    monkeypatch.delenv(memory.MAX_CLIQUE_BYTES_ENV, raising=False)
    net = min_size_wins()
    by_fill = jt.build_junction_tree(net, "min_fill")
    by_size = jt.build_junction_tree(net, "min_size")
    with memory.clique_memory_cap(1000), pytest.raises(memory.CliqueTooLargeError) as err:
        jt.log_partition(net, jnp.zeros(net.num_params), "min_fill")
    # 4 float64 copies of the tables and separators: 4·8·(400 + 100 + 1) and 4·8·(80 + 4 + 1)
    assert [memory.oracle_bytes(t) for t in (by_fill, by_size)] == [16_032, 2_720]
    assert str(err.value) == (
        "the junction tree has clique ('a', 'c', 'd') with 200 cells (1,600 bytes = "
        "1.49e-06 GiB as float64), above the exact oracle's cap of 1,000 bytes "
        "(9.31e-07 GiB); cliques above the cap: ('a', 'c', 'd') (200 cells), "
        "('b', 'c', 'd') (200 cells); the triangulations need: method='min_fill' (this tree) "
        "400 cells in all, largest clique 200 cells (1.49e-06 GiB), about 1.49e-05 GiB "
        "to run; method='min_size' 80 cells in all, largest clique 40 cells "
        "(2.98e-07 GiB), about 2.53e-06 GiB to run; alternatives: method='min_size' "
        "(it fits); the approximate oracle ConvexGBPOracle (APPGM: prox_pgm(..., "
        "oracle='convex_gbp')); raise the cap to at least 1,600 bytes: set "
        "$NUMPYRO_DPGM_MAX_CLIQUE_BYTES=1600 or run inside 'with "
        "numpyro_dpgm.oracles.memory.clique_memory_cap(1600):'"
    )
    with memory.clique_memory_cap(1000):  # the default picks min-size's tree, which fits
        jt.log_partition(net, jnp.zeros(net.num_params))
    with memory.clique_memory_cap(1600):
        memory.check_memory(by_fill, network=net)
    monkeypatch.setenv(memory.MAX_CLIQUE_BYTES_ENV, "1600")
    memory.check_memory(by_fill, network=net)


def test_cap_error_when_neither_heuristic_fits() -> None:
    """No heuristic is suggested when neither fits; more than three cliques are counted."""
    net = min_size_wins()
    with pytest.raises(memory.CliqueTooLargeError) as err:
        memory.check_memory(jt.build_junction_tree(net, "min_size"), max_bytes=100,
                            network=net)
    msg = str(err.value)
    assert "method='min_size' (this tree) 80 cells" in msg and "method='min_fill' 400" in msg
    assert "alternatives: the approximate oracle ConvexGBPOracle" in msg
    assert "(it fits)" not in msg
    chain = MarkovNetwork({a: 10 for a in "abcdef"},
                          [("a", "b"), ("b", "c"), ("c", "d"), ("d", "e"), ("e", "f")])
    with pytest.raises(memory.CliqueTooLargeError,
                       match=r"\('c', 'd'\) \(100 cells\) and 2 more; the triangulations"):
        memory.check_memory(jt.build_junction_tree(chain), max_bytes=100, network=chain)
    with pytest.raises(memory.CliqueTooLargeError,  # without the network: no comparison
                       match=r"and 2 more; alternatives: the other triangulation method"):
        memory.check_memory(jt.build_junction_tree(chain), max_bytes=100)


def test_machine_memory_error_compares_the_heuristics(monkeypatch) -> None:
    """A tree beyond the machine's memory: the error names the other heuristic where it fits."""
    net = min_size_wins()
    by_fill = jt.build_junction_tree(net, "min_fill")
    by_size = jt.build_junction_tree(net, "min_size")
    monkeypatch.setattr(memory, "physical_memory", lambda: memory.oracle_bytes(by_size))
    with pytest.raises(memory.JunctionTreeTooLargeError) as err:
        memory.check_memory(by_fill, network=net)
    msg = str(err.value)
    assert msg.startswith("the junction tree's 2 cliques hold 400 cells (largest ('a', 'c', "
                          "'d') (200 cells), ('b', 'c', 'd') (200 cells)); exact inference")
    assert "method='min_fill' (this tree) 400 cells in all" in msg
    assert msg.endswith("alternatives: method='min_size' (it fits); the approximate oracle "
                        "ConvexGBPOracle (APPGM: prox_pgm(..., oracle='convex_gbp')); measure "
                        "smaller cliques (coarsen an attribute)")
    memory.check_memory(by_size, network=net)
