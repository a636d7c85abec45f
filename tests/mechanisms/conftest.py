"""Fixtures of the mechanism tests."""

from __future__ import annotations

import pandas as pd
import pytest
from mechanism_data import chain_records as _chain_records


@pytest.fixture(scope="session")
def chain_records() -> pd.DataFrame:
    """3,000 records of the binary chain of :mod:`mechanism_data`."""
    return _chain_records()
