"""Solver backends, one module each, interchangeable by name.

``highs`` (default, embedded), ``gurobi``, ``pulp`` (CBC), ``cvxpy`` and
``scipy``; ``auto`` picks the best installed solver that can take the model.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from allocopt.backends.base import Backend, RawResult, SolveOptions
from allocopt.errors import LicenseError, UnknownBackendError
from allocopt.model import CompiledModel
from allocopt.solution import Basis, Solution

logger = logging.getLogger(__name__)

_MODULES = {
    "highs": ("allocopt.backends.highs", "HighsBackend"),
    "gurobi": ("allocopt.backends.gurobi", "GurobiBackend"),
    "pulp": ("allocopt.backends.pulp", "PulpBackend"),
    "cvxpy": ("allocopt.backends.cvxpy", "CvxpyBackend"),
    "scipy": ("allocopt.backends.scipy", "ScipyBackend"),
}
BACKENDS: tuple[str, ...] = tuple(_MODULES)
AUTO_ORDER: tuple[str, ...] = ("gurobi", "highs")


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (one of :data:`BACKENDS`)."""
    if name not in _MODULES:
        raise UnknownBackendError(
            f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)} or 'auto'")
    module, cls = _MODULES[name]
    return getattr(importlib.import_module(module), cls)()


def installed_backends() -> list[str]:
    """Names of the backends whose solver packages are installed."""
    return [name for name in BACKENDS if get_backend(name).is_installed()]


def solve_model(model: CompiledModel, backend: str = "highs", options: SolveOptions | None = None,
                defaults: Mapping[str, Mapping[str, Any]] | None = None, warm_start: Basis | None = None) -> Solution:
    """Solve a compiled model with the named backend.

    ``backend="auto"`` tries Gurobi when it is installed and licensed for the
    model's size, and otherwise falls back to HiGHS (with a warning when
    Gurobi was installed but could not take the model). ``defaults`` maps a
    backend name to solver options used unless ``options.solver_options``
    sets them (policies tune solvers for their models this way).
    ``warm_start`` starts an LP from a simplex basis on backends that can
    (``highs``, ``gurobi``); the others ignore it.
    """
    options = options or SolveOptions()

    def run(name: str) -> Solution:
        tuned = {**(defaults or {}).get(name, {}), **options.solver_options}
        return get_backend(name).solve(model, replace(options, solver_options=tuned), warm_start)

    if backend != "auto":
        return run(backend)
    for name in AUTO_ORDER[:-1]:
        if not get_backend(name).is_installed():
            continue
        try:
            return run(name)
        except LicenseError as err:
            logger.warning("backend 'auto': %s cannot take this model (%s); falling back to %s", name, err,
                           AUTO_ORDER[-1])
    return run(AUTO_ORDER[-1])


__all__ = ["BACKENDS", "Backend", "RawResult", "SolveOptions", "get_backend",
           "installed_backends", "solve_model"]
