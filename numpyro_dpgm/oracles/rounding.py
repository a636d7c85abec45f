"""Synthetic records by rounding expected counts along the junction tree (no sampling noise).

Forward sampling (:func:`~numpyro_dpgm.oracles.junction_tree.sample`) draws every record
independently, so the synthetic counts of a cell scatter around ``N·p`` with a binomial spread.
Rounding (the default of Private-PGM's ``synthetic_data``; McKenna, Miklau & Sheldon 2021,
"Winning the NIST contest", §4) removes that spread: the attributes are generated one at a time
(:func:`rounding_order`), and within each group of records that agree on an attribute's parents
the ``n_g`` records receive the values whose counts are the model's expected counts
``n_g · p(x | parents = g)`` rounded to integers that sum exactly to ``n_g``: the floor of every
expected count, plus one more for ``n_g − Σ floor`` cells drawn without replacement with
probabilities proportional to the fractional parts (:func:`round_counts`). The values are then
dealt to the group's records in a random order, so that attributes that are conditionally
independent given their parents stay so.

Every attribute's counts within every parent group are therefore the floor or the ceiling of
their expected counts; the first attribute's one-way counts are within 1 of ``N · p``, and
there are exactly ``N`` records. The records come from a NumPy generator seeded by the JAX key:
the same key gives the same records.

All ``N`` records of a data set are rounded together, in host memory:
:func:`rounding_bytes` estimates it (about ``16 d + 48`` bytes a record for ``d`` attributes),
and :func:`round_records` refuses (:class:`RoundingMemoryError`) a data set that would not fit
in the machine's physical memory.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..domain import Clique
from ..network import MarkovNetwork
from .calibration import as_vector
from .junction_tree import conditional_logits
from .memory import check_memory, physical_memory
from .triangulation import build_junction_tree

__all__ = ["RoundingMemoryError", "check_rounding_memory", "round_counts", "round_records",
           "rounding_bytes", "rounding_order"]

Array = Any

#: Bytes a record needs while it is rounded, per attribute (its int64 code, and the copy in
#: the output frame) and per record (the working arrays of one attribute's step).
BYTES_PER_CODE = 16
BYTES_PER_RECORD = 48


class RoundingMemoryError(MemoryError):
    """A data set too large to round in this machine's memory (all its records at once)."""


def rounding_bytes(num_records: int, num_attrs: int) -> int:
    """Estimated bytes that rounding ``num_records`` records of ``num_attrs`` attributes holds."""
    return num_records * (BYTES_PER_CODE * num_attrs + BYTES_PER_RECORD)


def rounding_order(network: MarkovNetwork, method: str = "min_fill") -> tuple[tuple[str, Clique],
                                                                               ...]:
    """The attributes in the order rounding generates them, each with its parents.

    The junction tree's cliques are visited root first; clique ``C_i`` with separator ``S_i``
    generates its new attributes ``a_1, a_2, …`` (:meth:`JunctionTree.new_attributes`) one at a
    time, ``a_k`` with the parents ``S_i + (a_1, …, a_{k−1})``. Given its parents, an attribute
    is independent of every attribute generated before it.

    Parameters
    ----------
    network : MarkovNetwork
    method : {"min_fill", "min_size"}
        Triangulation heuristic.

    Returns
    -------
    tuple of (attribute, parents)
        Every attribute of the domain once; ``parents`` in the order of the tables rounded.
    """
    tree = build_junction_tree(network, method)
    order = []
    for i in tree.order:
        new = tree.new_attributes(i)
        order += [(a, tree.separators[i] + new[:k]) for k, a in enumerate(new)]
    return tuple(order)


def round_counts(probs: np.ndarray, totals: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Integer counts of each row's ``totals · probs``, summing exactly to ``totals``.

    Each cell gets the floor of its expected count; the ``totals − Σ floor`` left over in a row
    go one each to cells drawn without replacement with probabilities proportional to their
    fractional parts (Efraimidis & Spirakis 2006: the cells with the largest ``u^(1/frac)``,
    ``u ~ U(0, 1)``). A cell whose expected count is an integer (zero included) gets exactly it.

    Parameters
    ----------
    probs : array ``(rows, cells)``
        Every row a probability vector.
    totals : int array ``(rows,)``
    rng : numpy.random.Generator

    Returns
    -------
    int64 array ``(rows, cells)``
        Every count the floor or the ceiling of ``totals[r] · probs[r, c]``; rows sum to
        ``totals``.
    """
    probs, totals = np.asarray(probs, dtype=np.float64), np.asarray(totals)
    if probs.ndim != 2 or totals.shape != probs.shape[:1]:
        raise ValueError(f"probs must be (rows, cells) and totals (rows,); got shapes "
                         f"{probs.shape} and {totals.shape}")
    expected = totals.astype(np.float64)[:, None] * probs
    floor = np.floor(expected)
    frac = expected - floor
    counts = floor.astype(np.int64)
    extra = totals.astype(np.int64) - counts.sum(axis=1)
    if not np.any(extra > 0):
        return counts
    # a tiny fraction's key overflows to -inf: clamped, it still ranks above every cell of
    # fraction 0 (which never gets a leftover record)
    with np.errstate(divide="ignore", over="ignore"):
        keys = np.log(rng.random(frac.shape)) / np.where(frac > 0, frac, 1)
    keys = np.where(frac > 0, np.maximum(keys, np.finfo(np.float64).min), -np.inf)
    rank = np.argsort(np.argsort(-keys, axis=1, kind="stable"), axis=1, kind="stable")
    return counts + (rank < extra[:, None])


def _generator(rng_key: Array) -> np.random.Generator:
    """A NumPy generator seeded by the words of a JAX key (typed or raw ``uint32[2]``)."""
    key = jnp.asarray(rng_key)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return np.random.default_rng(np.asarray(key, dtype=np.uint32).ravel())


def _normalised_rows(prob: np.ndarray) -> np.ndarray:
    """``prob`` (rows, cells), non-negative, with every row divided by its sum (a row of zeros
    stays zero: no record is in it)."""
    sums = prob.sum(axis=1, keepdims=True)
    return np.divide(prob, sums, out=np.zeros_like(prob), where=sums > 0)


def _conditionals(logits: Array, shape: tuple[int, ...]) -> np.ndarray:
    """Probabilities of a ``(rows, cells)`` table of log-probabilities, rows normalised, cells
    unravelled to ``shape``."""
    logits = np.asarray(logits, dtype=np.float64)
    top = np.max(logits, axis=1, keepdims=True)
    prob = _normalised_rows(np.exp(logits - np.where(np.isfinite(top), top, 0.0)))
    return prob.reshape((prob.shape[0],) + shape)


def _round_column(table: np.ndarray, row: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Values of one attribute for records whose parent group is ``row``, rounded per group.

    ``table[g]`` is the attribute's distribution in group ``g``. The groups' rounded counts
    (:func:`round_counts`) are laid out group after group and dealt to the records, each group's
    records taken in a random order.
    """
    sizes = np.bincount(row, minlength=table.shape[0])
    used = np.flatnonzero(sizes)
    counts = round_counts(table[used], sizes[used], rng)
    cells = table.shape[1]
    values = np.repeat(np.tile(np.arange(cells), len(used)), counts.ravel())
    shuffled = rng.permutation(len(row))
    order = shuffled[np.argsort(row[shuffled], kind="stable")]
    out = np.empty(len(row), dtype=np.int64)
    out[order] = values
    return out


def check_rounding_memory(num_records: int, num_attrs: int) -> None:
    """Raise :class:`RoundingMemoryError` where rounding ``num_records`` records of ``num_attrs``
    attributes would not fit in physical memory (:func:`rounding_bytes`)."""
    need = rounding_bytes(num_records, num_attrs)
    have = physical_memory()
    if have is not None and need > have:
        raise RoundingMemoryError(
            f"rounding {num_records:,} records of {num_attrs} attributes needs about "
            f"{need / 2**30:.1f} GiB at once (all records of a data set are rounded together), "
            f"more than this machine's {have / 2**30:.1f} GiB; draw them by sampling instead "
            "(sampling='sample'), which holds one chunk of records at a time")


def round_records(network: MarkovNetwork, theta: Array, rng_key: Array, num_records: int,
                  method: str = "min_fill") -> np.ndarray:
    """``num_records`` records of ``p_θ`` by rounding expected counts (module notes).

    Parameters
    ----------
    network : MarkovNetwork
    theta : array ``(num_params,)`` or CliqueTables
        Log-potentials in the network's layout (one model, no batch axis).
    rng_key : JAX PRNG key
        Seeds the remainders' draws and the dealing order: the same key, the same records.
    num_records : int
        ``N`` >= 1.
    method : {"min_fill", "min_size"}
        Triangulation heuristic.

    Returns
    -------
    int64 array ``(num_records, num_attrs)``
        Codes in domain order.

    Raises
    ------
    RoundingMemoryError
        If the records would not fit in physical memory (:func:`rounding_bytes`).
    """
    if isinstance(num_records, bool) or not isinstance(num_records, (int, np.integer)) \
            or num_records < 1:
        raise ValueError(f"num_records must be a positive integer, got {num_records!r}")
    domain = network.domain
    check_rounding_memory(int(num_records), len(domain))
    theta = as_vector(network, theta)  # one model: a batch is refused here
    tree = build_junction_tree(network, method)
    check_memory(tree)
    rng = _generator(rng_key)
    codes = np.zeros((int(num_records), len(domain)), dtype=np.int64)
    for i, logits in zip(tree.order, conditional_logits(network, theta, method), strict=True):
        sep, new = tree.separators[i], tree.new_attributes(i)
        cond = _conditionals(logits, domain.shape_of(new))
        for k, a in enumerate(new):
            parents = sep + new[:k]
            # p(a_k | S, a_1..a_{k-1}): the clique's conditional summed over a_{k+1}.., per row
            joint = cond.sum(axis=tuple(range(k + 2, cond.ndim)))
            table = _normalised_rows(joint.reshape(-1, domain[a]))
            row = (np.ravel_multi_index(tuple(codes[:, domain.index(p)] for p in parents),
                                        domain.shape_of(parents)) if parents
                   else np.zeros(len(codes), dtype=np.int64))
            codes[:, domain.index(a)] = _round_column(table, row, rng)
    return codes
