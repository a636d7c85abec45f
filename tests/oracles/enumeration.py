"""Exact posteriors of count tables by enumeration: every table, weighted, and its moments."""

from __future__ import annotations

import numpy as np
from scipy.special import gammaln, logsumexp


def compositions(total: int, parts: int) -> np.ndarray:
    """Every vector of ``parts`` non-negative integers summing to ``total`` (recursively)."""
    if parts == 1:
        return np.array([[total]])
    blocks = []
    for first in range(total + 1):
        rest = compositions(total - first, parts - 1)
        blocks.append(np.column_stack([np.full(len(rest), first), rest]))
    return np.concatenate(blocks)


def log_multinomial(n: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``log Mult(n; Σn, p)`` over the last axis."""
    return gammaln(n.sum(-1) + 1) - gammaln(n + 1).sum(-1) + (n * np.log(p)).sum(-1)


def laplace_loglik(pred: np.ndarray, y: np.ndarray, b: float) -> np.ndarray:
    """``log p(y | pred)`` of Laplace noise of scale ``b`` up to its constant."""
    return -np.abs(pred - y).sum(-1) / b


def moments(values: np.ndarray, log_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of ``values`` under the weights ``exp(log_w)``."""
    w = np.exp(log_w - logsumexp(log_w))
    mean = w @ values
    return mean, np.sqrt(w @ (values - mean) ** 2)
