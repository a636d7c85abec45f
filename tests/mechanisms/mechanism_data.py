"""Small data sets with known structure for the mechanism tests (fixed seeds)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest

from numpyro_dpgm import Domain
from numpyro_dpgm.privacy import ZCDP, BudgetExceededError, PrivacyLedger

CHAIN = Domain({"a": 2, "b": 2, "c": 2, "d": 2})


def chain_records(n: int = 3000, seed: int = 7) -> pd.DataFrame:
    """Records of a binary chain a → b → c → d: each attribute copies its parent and flips it
    with probability 0.1, 0.15, 0.2 (adjacent pairs depend most); ``a`` is 1 with
    probability 0.4."""
    rng = np.random.default_rng(seed)
    a = (rng.random(n) < 0.4).astype(int)
    b = a ^ (rng.random(n) < 0.1)
    c = b ^ (rng.random(n) < 0.15)
    d = c ^ (rng.random(n) < 0.2)
    return pd.DataFrame({"a": a, "b": b, "c": c, "d": d})


def refuses(mechanism: Callable[..., Any], records: Any, **kwargs: Any) -> str:
    """Call ``mechanism`` on the chain with a seeded sampler and a ledger of ρ = 1, changed by
    ``kwargs``; check that it raises an input or budget error and that nothing was spent.
    Returns the message."""
    ledger = PrivacyLedger(ZCDP(1.0))
    args = {"budget": ZCDP(0.5), "ledger": ledger, "rng_key": 0, "sampler": "jax", **kwargs}
    with pytest.raises((ValueError, TypeError, KeyError, BudgetExceededError)) as err:
        mechanism(records, CHAIN, **args)
    assert ledger.history == ()
    return str(err.value)


@pytest.fixture(scope="session", name="chain_records")
def chain_records_fixture() -> pd.DataFrame:
    """3,000 records of the binary chain (the fixture ``chain_records``; imported by the test
    modules that use it: a ``conftest.py`` here would shadow the tests' own ``conftest``)."""
    return chain_records()
