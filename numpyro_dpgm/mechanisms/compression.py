"""MST's domain compression: rare values of an attribute merged into one, by its noisy counts.

MST (McKenna, Miklau & Sheldon 2021, §4 "Domain compression"; mbi's ``compress_domain``) looks
at the noisy one-way marginal ``y_a = n_a + N(0, σ²)`` of each attribute and keeps the values
whose noisy count reaches ``3σ``; the others are merged into one new value. The compression
depends on the data only through the noisy measurements, so it is post-processing. The one-way
measurement is re-expressed on the compressed table: the kept cells as they are, and the sum of
the merged cells divided by ``√k`` (``k`` merged values), so that every answer still carries
noise of standard deviation ``σ``: the query is the identity with a last entry ``1/√k``.

A model fitted on the compressed domain spreads each merged value's mass uniformly over the
values it stands for (:meth:`Compression.decompress_model`, the maximum-entropy answer given no
measurement of how it splits), and records are decoded the same way
(:meth:`Compression.decode`: a merged code becomes one of its values, uniformly at random).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._jit import device_array
from ..distributions.mrf import MarkovRandomField
from ..domain import Domain
from ..measurements import Gaussian, Measurement
from ..network import MarkovNetwork

__all__ = ["COMPRESSION_THRESHOLD", "Compression", "compress_domain"]

#: Values whose noisy count is below this many noise standard deviations are merged (MST, §4).
COMPRESSION_THRESHOLD = 3.0


@dataclass(frozen=True)
class Compression:
    """A map from an attribute's values to compressed codes, for every attribute.

    Attributes
    ----------
    original : Domain
    domain : Domain
        The compressed domain (same attributes, fewer values where values were merged).
    groups : mapping attribute -> tuple of tuples of int
        ``groups[a][j]``: the original values that compressed code ``j`` stands for (one value
        each, except the last code of a compressed attribute, which stands for all the merged
        ones).
    """

    original: Domain
    domain: Domain
    groups: Mapping[str, tuple[tuple[int, ...], ...]]

    def code_map(self, attr: str) -> np.ndarray:
        """``code_map(a)[v]``: the compressed code of original value ``v``."""
        out = np.empty(self.original[attr], dtype=np.int64)
        for j, group in enumerate(self.groups[attr]):
            out[list(group)] = j
        return out

    def group_sizes(self, attr: str) -> np.ndarray:
        """Number of original values behind each compressed code of ``attr``."""
        return np.array([len(g) for g in self.groups[attr]], dtype=np.int64)

    @property
    def compressed(self) -> tuple[str, ...]:
        """The attributes with merged values."""
        return tuple(a for a in self.original.attrs if self.domain[a] < self.original[a])

    def encode(self, records: Any) -> np.ndarray:
        """Integer records ``(n, d)`` (columns in domain order) in compressed codes."""
        x = np.asarray(records)
        cols = [self.code_map(a)[x[:, i]] for i, a in enumerate(self.original.attrs)]
        return np.stack(cols, axis=1) if cols else x

    def aggregate(self, table: Any, clique: Sequence[str]) -> np.ndarray:
        """A count table of ``clique`` on the original domain, summed into compressed codes."""
        out = np.asarray(table, dtype=float)
        for axis, a in enumerate(clique):
            onehot = np.zeros((self.domain[a], self.original[a]))
            onehot[self.code_map(a), np.arange(self.original[a])] = 1.0
            out = np.moveaxis(np.tensordot(onehot, out, axes=([1], [axis])), 0, axis)
        return out

    def decode(self, records: Any, rng: np.random.Generator) -> np.ndarray:
        """Compressed records in original codes; a merged code becomes one of its values,
        uniformly at random (as mbi's ``reverse_data``)."""
        x = np.asarray(records)
        out = np.empty_like(x)
        for i, a in enumerate(self.original.attrs):
            groups = self.groups[a]
            first = np.array([g[0] for g in groups], dtype=x.dtype)
            out[:, i] = first[x[:, i]]
            if len(groups[-1]) > 1:
                merged = x[:, i] == len(groups) - 1
                out[merged, i] = rng.choice(np.asarray(groups[-1]), int(merged.sum()))
        return out

    def decompress_model(self, model: MarkovRandomField) -> MarkovRandomField:
        """The model on the original domain that spreads each merged code uniformly.

        ``p(x) = p_c(c(x)) / Π_a |g(c(x_a))|``: every clique's log-potentials are read at the
        compressed codes, and ``−log |g|`` is added once per attribute (to the first clique
        holding it, or to a new one-way clique). Works for batched ``θ`` (posterior draws).
        A concrete ``θ`` is rearranged on the host (NumPy), a traced one in JAX: eager JAX
        operations would compile a small program per table shape, and the shapes change with
        every compression.
        """
        if model.network.domain != self.domain:
            raise ValueError("the model is not over this compression's domain")
        net = model.network
        traced = isinstance(model.theta, jax.core.Tracer)
        xp = jnp if traced else np
        theta = model.theta if traced else np.asarray(model.theta)
        batch = theta.shape[:-1]
        tables = {c: xp.reshape(theta[..., o:o + n], batch + s) for c, o, n, s in
                  zip(net.cliques, net.offsets, net.sizes, net.shapes, strict=True)}
        cliques = list(net.cliques)
        cliques += [(a,) for a in self.compressed if not any(a in c for c in cliques)]
        out, placed = [], set()
        for c in cliques:
            table = tables.get(c)
            if table is None:
                table = xp.zeros(batch + self.domain.shape_of(c), dtype=theta.dtype)
            for axis, a in enumerate(c):
                table = xp.take(table, self.code_map(a), axis=len(batch) + axis)
                if a not in placed:
                    placed.add(a)
                    shape = [1] * len(c)
                    shape[axis] = -1
                    log_g = np.log(self.group_sizes(a).astype(float))[self.code_map(a)]
                    table = table - np.reshape(log_g.astype(theta.dtype), shape)
            out.append(xp.reshape(table, batch + (-1,)))
        network = MarkovNetwork(self.original, cliques)
        flat = xp.concatenate(out, axis=-1)
        return MarkovRandomField(network, flat if traced else device_array(flat))


def compress_domain(
    measurements: Sequence[Measurement],
    domain: Domain,
    threshold: float = COMPRESSION_THRESHOLD,
) -> tuple[Compression, list[Measurement]]:
    """Compress every attribute by its noisy one-way marginal (MST, §4).

    Parameters
    ----------
    measurements : sequence of Measurement
        One identity-query Gaussian measurement of each attribute's one-way table, in domain
        order (as :func:`~numpyro_dpgm.privacy.release_tables` returns them).
    domain : Domain
    threshold : float
        Values with noisy count ``< threshold·σ`` are merged (default 3, MST's).

    Returns
    -------
    compression : Compression
    measurements : list of Measurement
        The one-way measurements on the compressed domain (unchanged for an attribute with
        nothing merged).
    """
    if len(measurements) != len(domain):
        raise ValueError("give one one-way measurement per attribute, in domain order")
    groups: dict[str, tuple[tuple[int, ...], ...]] = {}
    sizes: dict[str, int] = {}
    out = []
    for a, m in zip(domain.attrs, measurements, strict=True):
        if tuple(m.clique) != (a,) or m.query is not None or not isinstance(m.noise, Gaussian):
            raise ValueError(f"expected an identity Gaussian measurement of ({a!r},), got "
                             f"{m.clique} with {type(m.noise).__name__} noise")
        y = np.asarray(m.values, dtype=float)
        keep = y >= threshold * m.noise.sigma
        kept = tuple((int(v),) for v in np.flatnonzero(keep))
        merged = tuple(int(v) for v in np.flatnonzero(~keep))
        groups[a] = kept + ((merged,) if merged else ())
        sizes[a] = len(groups[a])
        if not merged:
            out.append(m)
            continue
        k = len(merged)
        values = np.append(y[keep], y[~keep].sum() / math.sqrt(k))
        query = np.eye(values.size)
        query[-1, -1] = 1.0 / math.sqrt(k)
        out.append(Measurement((a,), values, m.noise, query=query))
    return Compression(domain, Domain(sizes), groups), out
