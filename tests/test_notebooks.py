"""The notebooks in notebooks/ execute without error and are stored without outputs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 120

nbformat = pytest.importorskip("nbformat", reason="nbformat not installed: pip install -e '.[dev]'")


def _kernel_available() -> str | None:
    """None when nbclient and a python3 kernel (ipykernel) are installed, else why not."""
    try:
        import nbclient  # noqa: F401
    except ImportError:
        return "nbclient not installed: pip install -e '.[dev]'"
    try:
        import ipykernel  # noqa: F401
    except ImportError:
        return "ipykernel not installed: pip install -e '.[dev]'"
    return None


def test_notebooks_exist():
    names = {p.name for p in NOTEBOOKS}
    assert {"01-quickstart.ipynb", "02-heterogeneity.ipynb", "03-solver-scaling.ipynb",
            "04-goodput.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stripped(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.cells and nb.cells[0].cell_type == "markdown", "each notebook starts with a markdown cell"
    for k, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.outputs, f"{path.name} cell {k} has saved outputs; strip them before committing"
            assert cell.execution_count is None, f"{path.name} cell {k} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, tmp_path):
    reason = _kernel_available()
    if reason:
        pytest.skip(reason)
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    started = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as err:  # names the cell and shows the traceback
        pytest.fail(f"{path.name}: a cell raised:\n{err}")
    for k, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            errors = [o for o in cell.outputs if o.output_type == "error"]
            assert not errors, f"{path.name} cell {k}: {errors[0].ename}: {errors[0].evalue}"
    print(f"{path.name}: {time.perf_counter() - started:.1f} s")
