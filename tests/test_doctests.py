"""The ``>>>`` examples in the docstrings of the package and of ``studies/`` run, each as one
test case.

Every module of the package and of the studies is imported (:func:`pkgutil.walk_packages`)
and its doctests are collected with :class:`doctest.DocTestFinder`; each example runs in a
namespace of its own module's globals, with float64 on (``conftest``), ``NORMALIZE_WHITESPACE``
and ``ELLIPSIS`` (write ``0.3...`` where a number prints at full precision), and numpy printing
at its legacy-free defaults. Examples should be cheap: tiny domains, a few iterations.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import numpy as np
import pytest

import numpyro_dpgm
import studies

#: Modules not imported for doctest collection (they need optional dependencies).
SKIP_MODULES: dict[str, str] = {}

#: Examples skipped by qualified name, with the reason.
SKIP_EXAMPLES: dict[str, str] = {}

FLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS


def _modules() -> list[str]:
    names = []
    for package in (numpyro_dpgm, studies):
        names.append(package.__name__)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
            if info.name not in SKIP_MODULES:
                names.append(info.name)
    return sorted(names)


def _collect() -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    found: dict[str, doctest.DocTest] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for test in finder.find(module):
            # a re-exported object is found again in its package: keep the defining module's
            if test.examples and test.name.startswith(name) and test.name not in found:
                found[test.name] = test
    return [found[k] for k in sorted(found)]


DOCTESTS = _collect()


def test_doctests_are_collected() -> None:
    """The collection itself works (a silent empty collection would pass every run)."""
    assert len(DOCTESTS) >= 13


@pytest.mark.parametrize("test", DOCTESTS, ids=[t.name for t in DOCTESTS])
def test_docstring_examples(test: doctest.DocTest) -> None:
    if test.name in SKIP_EXAMPLES:
        pytest.skip(SKIP_EXAMPLES[test.name])
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report: list[str] = []
    test.globs = dict(test.globs)  # each example gets a fresh copy of its module's globals
    with np.printoptions(legacy=False):
        result = runner.run(test, out=report.append, clear_globs=True)
    if result.failed:
        pytest.fail(f"{result.failed} of {result.attempted} example(s) of {test.name} failed:\n"
                    + "".join(report), pytrace=False)
