"""Labels of the cells of a network's flat layout (coordinates for ArviZ and tables)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...network import MarkovNetwork

__all__ = ["cell_labels"]


def cell_label(attrs: Sequence[str], values: Sequence[int]) -> str:
    return ",".join(f"{a}={v}" for a, v in zip(attrs, values, strict=True))


def cell_labels(network: MarkovNetwork) -> tuple[list[str], list[str]]:
    """Labels of the cells of the network's flat layout, and of the clique each belongs to.

    Returns
    -------
    cells : list of str
        ``"a=0,b=1"`` for the cell ``(0, 1)`` of clique ``("a", "b")`` (attributes in the
        clique's order), in the network's layout; unique because no two cliques have the same
        attribute set.
    cliques : list of str
        ``"a,b"``, the clique of each cell.
    """
    cells, owners = [], []
    for c, shape in zip(network.cliques, network.shapes, strict=True):
        for idx in np.ndindex(*shape):
            cells.append(cell_label(c, idx))
            owners.append(",".join(c))
    return cells, owners
