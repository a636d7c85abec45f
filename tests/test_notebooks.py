"""The notebooks run from top to bottom, at test sizes.

Every notebook in ``notebooks/`` has one cell tagged ``parameters`` (papermill's convention) that
sets its run sizes: draws, warm-up, data sets. The suite executes each notebook in a Jupyter
kernel (``nbclient``, the notebook's folder as working directory) with that cell's assignments
replaced by :data:`TEST_SIZES`, so every cell runs while the draws cost test time; the committed
outputs come from the sizes written in the notebook.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"

#: Per notebook: the value each name of its ``parameters`` cell takes in the test run.
TEST_SIZES: dict[str, dict[str, int]] = {
    "bayesian_noisy_marginals.ipynb": {"num_warmup": 100, "num_samples": 100,
                                       "exact_warmup": 50, "exact_samples": 50},
    "quickstart.ipynb": {"num_warmup": 50, "num_samples": 50},
    "synthetic_data.ipynb": {"num_warmup": 60, "num_samples": 40, "m": 5},
    "user_model_regions.ipynb": {"num_warmup": 100, "num_samples": 100, "by_hand_draws": 20},
}


def parameters_cell(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook's one code cell tagged ``parameters``."""
    cells = [c for c in nb.cells
             if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{len(cells)} cells tagged 'parameters'; a notebook needs one"
    return cells[0]


def assigned_names(source: str) -> set[str]:
    """The names a cell of plain assignments binds (``a, b = 1, 2`` binds ``a`` and ``b``)."""
    names = set()
    for stmt in ast.parse(source).body:
        assert isinstance(stmt, ast.Assign), f"not an assignment: {ast.unparse(stmt)}"
        for target in stmt.targets:
            elts = target.elts if isinstance(target, ast.Tuple) else [target]
            names.update(e.id for e in elts)
    return names


def test_every_notebook_has_test_sizes_for_each_of_its_parameters() -> None:
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(TEST_SIZES)
    for name, sizes in TEST_SIZES.items():
        source = parameters_cell(nbformat.read(NOTEBOOKS / name, as_version=4)).source
        assert assigned_names(source) == set(sizes), name


def test_assigned_names_reads_tuples_and_refuses_code() -> None:
    assert assigned_names("# sizes\na, b = 1, 2\nc = 3") == {"a", "b", "c"}
    with pytest.raises(AssertionError, match="not an assignment"):
        assigned_names("a = 1\nprint(a)")


@pytest.mark.parametrize("name", sorted(TEST_SIZES))
def test_notebook_runs(name: str) -> None:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    cell = parameters_cell(nb)
    cell.source = "\n".join(f"{key} = {value!r}" for key, value in TEST_SIZES[name].items())
    client = NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
