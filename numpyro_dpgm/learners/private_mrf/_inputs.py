"""Validation of the MRF learners' inputs: records as spins or codes, domains, width, key."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jax
import numpy as np

from ...data import Dataset, records_to_array
from ...domain import Domain


def default_domain(p: int, k: int | Sequence[int]) -> Domain:
    sizes = [k] * p if isinstance(k, int) else list(k)
    return Domain({f"x{i}": int(s) for i, s in enumerate(sizes)})


def check_domain(domain: Any, p: int, binary: bool) -> Domain:
    if isinstance(domain, int) and not isinstance(domain, bool):
        domain = default_domain(p, domain)
    elif isinstance(domain, Sequence) and not isinstance(domain, str):
        domain = Domain({str(a): 2 for a in domain}) if binary else None
        if domain is None:
            raise TypeError("give the pairwise learner a Domain (or an int k), not a name list")
    elif isinstance(domain, Mapping) and not isinstance(domain, Domain):
        domain = Domain(domain)
    if not isinstance(domain, Domain):
        raise TypeError(f"domain must be a Domain, got {type(domain).__name__}")
    if len(domain) != p:
        raise ValueError(f"the data have {p} columns but the domain has {len(domain)} attributes")
    if binary and any(k != 2 for k in domain.shape):
        raise ValueError(
            f"an Ising model needs binary attributes; the domain has sizes {domain.shape}"
        )
    return domain


def spins_from_data(
    data: Any, coding: Literal["spin", "code"], domain: Any
) -> tuple[np.ndarray, Domain]:
    """Validated ``(n, p)`` int8 spins ``±1`` and the (binary) domain."""
    if isinstance(data, Dataset):
        domain = check_domain(data.domain, len(data.domain), binary=True)
        codes = data.to_array()
        return (1 - 2 * codes).astype(np.int8), domain
    if coding not in ("spin", "code"):
        raise ValueError(f"coding must be 'spin' (±1) or 'code' (0/1), got {coding!r}")
    arr = np.asarray(data)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] < 2:
        raise ValueError(
            f"data must be a 2-d array (num_records, p ≥ 2) of records, got shape {arr.shape}"
        )
    allowed = (-1, 1) if coding == "spin" else (0, 1)
    if not np.all(np.isin(arr, allowed)):
        bad = np.unique(arr[~np.isin(arr, allowed)])[:5]
        raise ValueError(
            f"Ising data must be binary: with coding={coding!r} every value must be in "
            f"{allowed}; found {bad.tolist()}"
            + (" (codes 0/1? pass coding='code')" if coding == "spin" else "")
        )
    spins = arr.astype(np.int8) if coding == "spin" else (1 - 2 * arr).astype(np.int8)
    p = arr.shape[1]
    domain = default_domain(p, 2) if domain is None else check_domain(domain, p, binary=True)
    return spins, domain


def codes_from_data(data: Any, domain: Any) -> tuple[np.ndarray, Domain]:
    """Validated ``(n, p)`` integer codes and the domain of a pairwise model."""
    if isinstance(data, Dataset):
        domain = data.domain
        codes = data.to_array()
    else:
        arr = np.asarray(data)
        if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] < 2:
            raise ValueError(
                f"data must be a 2-d array (num_records, p ≥ 2) of codes, got shape {arr.shape}"
            )
        if domain is None:
            raise ValueError(
                "learn_pairwise needs the domain (a Domain, or an int k for k values per "
                "attribute): inferring the alphabet from the data would leak it"
            )
        domain = check_domain(domain, arr.shape[1], binary=False)
        codes = records_to_array(arr, domain)
    if any(k < 2 for k in domain.shape):
        raise ValueError(f"every attribute needs at least 2 values; sizes {domain.shape}")
    return codes.astype(np.int64), domain


def check_width(width: Any) -> float:
    lam = float(width)
    if not math.isfinite(lam) or lam <= 0:
        raise ValueError(f"width (a bound λ on the model's width) must be > 0, got {width!r}")
    return lam


def need_key(key: Any, rho: float | None) -> Any:
    if key is None:
        if rho is not None:
            raise ValueError("a private run needs a PRNG key for its noise (rng_key=...)")
        return jax.random.key(0)
    return key
