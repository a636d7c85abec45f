"""Many private Frank–Wolfe regressions (Alg. 1) run in batches of bounded memory.

The logistic losses are sums over records, so they are evaluated on the distinct records with
their multiplicities (:func:`compress_rows`: exactly the same sums; typically far fewer rows).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..frank_wolfe import run_frank_wolfe_batch


def compress_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows with their multiplicities, padded (weight 0) to a bucketed length."""
    uniq, counts = np.unique(rows, axis=0, return_counts=True)
    m = uniq.shape[0]
    size = 64
    while size < m:  # 64, 96, 128, 192, 256, ...: at most a third of the rows are padding
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    pad = size - m
    if pad:
        uniq = np.concatenate([uniq, np.repeat(uniq[:1], pad, axis=0)])
        counts = np.concatenate([counts, np.zeros(pad, counts.dtype)])
    return uniq, counts.astype(float)


#: Largest number of feature entries materialised for one batched Frank–Wolfe call.
_MAX_BATCH_ENTRIES = 2**24


def solve_problems(
    build: Any,
    num: int,
    keys: Any,
    *,
    radius: float,
    num_records: int,
    noise_scale: float,
    iterations: int,
    with_trace: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run Alg. 1 on ``num`` regression problems, in batches of bounded memory.

    ``build(q)`` returns problem ``q``'s ``(features (m, d), labels (m,), weights (m,))`` (one
    ``(m, d)`` for all ``q``). Problems are built and run a batch at a time; the last batch is
    padded with copies of its first problem so that every batch has one compiled shape. Returns
    weights ``(num, d)``, loss traces ``(num, T)`` and gaps ``(num,)``.
    """
    first = build(0)
    m, d = first[0].shape
    size = max(1, min(num, _MAX_BATCH_ENTRIES // max(m * d, 1)))
    ws, losses, gaps = [], [], []
    for start in range(0, num, size):
        idx = list(range(start, min(start + size, num)))
        real = len(idx)
        idx += [idx[0]] * (size - real)
        parts = [first if q == 0 else build(q) for q in idx]
        w, loss, gap, _ = run_frank_wolfe_batch(
            np.stack([f for f, _, _ in parts]),
            np.stack([y for _, y, _ in parts]),
            np.stack([o for _, _, o in parts]),
            radius=radius,
            num_records=num_records,
            noise_scale=noise_scale,
            iterations=iterations,
            keys=keys[np.asarray(idx)],
            with_trace=with_trace,
        )
        ws.append(w[:real])
        losses.append(loss[:real])
        gaps.append(gap[:real])
    return np.concatenate(ws), np.concatenate(losses), np.concatenate(gaps)
