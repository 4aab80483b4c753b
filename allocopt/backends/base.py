"""The interface every solver backend implements.

A backend is one module with a :class:`Backend` subclass that declares its
name, the Python modules it needs, the extra that installs them and its
capabilities, and implements two steps:

``build(model, options) -> handle``
    hand the :class:`~allocopt.model.CompiledModel` to the solver (timed as
    ``build_seconds``);
``run(handle, model, options) -> RawResult``
    solve and read back (timed as ``solve_seconds``).

Backends that can start an LP from a simplex basis (``supports_warm_start``)
also implement ``set_basis(handle, model, basis, options)``; the base class
first makes the basis consistent with the model (:func:`repair_basis`).

Backends always receive the model in minimization form (``sense`` handled
here) and report minimization-form duals ``d objective_min / d delta``; this
base class flips signs for maximization and splits values per block, so every
backend returns the same :class:`~allocopt.solution.Solution`.
"""

from __future__ import annotations

import importlib.util
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from allocopt.errors import BackendNotInstalledError, InvalidOptionError
from allocopt.model import CompiledModel
from allocopt.solution import STATUS_MESSAGES, Basis, BasisStatus, Solution, Status


@dataclass(frozen=True)
class SolveOptions:
    """Options every backend understands.

    Attributes
    ----------
    time_limit_s : float or None
        Wall-clock limit for the solver, in seconds.
    mip_gap : float or None
        Relative MIP optimality gap at which to stop (MILPs only).
    threads : int or None
        Solver threads; None leaves the solver's default.
    verbose : bool
        Print the solver's log.
    solver_options : dict
        Passed verbatim to the solver under its own option names.
    """

    time_limit_s: float | None = None
    mip_gap: float | None = None
    threads: int | None = None
    verbose: bool = False
    solver_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        def real(value: Any) -> bool:
            return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))

        if self.time_limit_s is not None and not (real(self.time_limit_s) and self.time_limit_s > 0):
            raise InvalidOptionError(f"time_limit_s must be a positive number of seconds, got {self.time_limit_s!r}")
        if self.mip_gap is not None and not (real(self.mip_gap) and 0 <= self.mip_gap < 1):
            raise InvalidOptionError(f"mip_gap must be in [0, 1), got {self.mip_gap!r}")
        if not isinstance(self.verbose, (bool, np.bool_)):
            raise InvalidOptionError(f"verbose must be true or false, got {self.verbose!r}")
        if self.threads is not None and (not isinstance(self.threads, (int, np.integer))
                                         or isinstance(self.threads, bool) or not 1 <= self.threads <= 2**16):
            raise InvalidOptionError(f"threads must be a positive integer, got {self.threads!r}")
        if not isinstance(self.solver_options, dict):
            raise InvalidOptionError("solver_options must be a dict of the solver's own option names to values")


@dataclass
class RawResult:
    """What a backend's ``run`` reads back, in minimization form."""

    status: Status
    raw_status: str
    x: np.ndarray | None = None
    row_duals: np.ndarray | None = None  # d objective_min / d delta per row
    mip_gap: float | None = None
    detail: str = ""
    simplex_iterations: int | None = None
    basis: Callable[[], Basis | None] | None = None  # reads the final basis (None if none) when called


def _nonbasic_status(lb: np.ndarray, ub: np.ndarray) -> np.ndarray:
    """The status a nonbasic column or row can take given its bounds: at the
    lower bound when finite, else at the upper bound, else free at zero."""
    return np.where(np.isfinite(lb), BasisStatus.LOWER,
                    np.where(np.isfinite(ub), BasisStatus.UPPER, BasisStatus.ZERO)).astype(np.int8)


def _fit_statuses(status: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> np.ndarray:
    """Move nonbasic statuses to a bound that exists."""
    status = np.asarray(status, dtype=np.int8).copy()
    nonbasic = _nonbasic_status(lb, ub)
    bad = (((status == BasisStatus.LOWER) & ~np.isfinite(lb)) | ((status == BasisStatus.UPPER) & ~np.isfinite(ub))
           | ((status == BasisStatus.ZERO) & (np.isfinite(lb) | np.isfinite(ub)))
           | ~np.isin(status, np.array(list(BasisStatus), dtype=np.int8)))
    status[bad] = nonbasic[bad]
    return status


def repair_basis(model: CompiledModel, basis: Basis) -> Basis:
    """``basis`` made usable as a simplex start for ``model``: nonbasic statuses
    on bounds that exist, and exactly one basic column or row per row (excess
    basic columns leave the basis; missing ones are made up by row slacks).

    Raises
    ------
    InvalidOptionError
        When the status arrays do not have one entry per column and per row.
    """
    cols, rows = np.asarray(basis.col_status), np.asarray(basis.row_status)
    if cols.shape != (model.num_cols,) or rows.shape != (model.num_rows,):
        raise InvalidOptionError(f"a warm-start basis needs {model.num_cols} column and {model.num_rows} row "
                                 f"statuses; got {cols.shape} and {rows.shape}")
    cols = _fit_statuses(cols, model.col_lb, model.col_ub)
    rows = _fit_statuses(rows, model.row_lb, model.row_ub)
    excess = int((cols == BasisStatus.BASIC).sum() + (rows == BasisStatus.BASIC).sum()) - model.num_rows
    if excess > 0:
        basic = np.flatnonzero(cols == BasisStatus.BASIC)[-excess:]
        cols[basic] = _nonbasic_status(model.col_lb[basic], model.col_ub[basic])
        excess = int((cols == BasisStatus.BASIC).sum() + (rows == BasisStatus.BASIC).sum()) - model.num_rows
    if excess < 0:
        rows[np.flatnonzero(rows != BasisStatus.BASIC)[excess:]] = BasisStatus.BASIC
    return Basis(cols, rows)


def is_feasible(model: CompiledModel, x: np.ndarray, tol: float = 1e-6) -> bool:
    """Whether ``x`` satisfies the bounds, rows and integrality of ``model`` (tolerance relative to 1)."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape != (model.num_cols,) or not np.isfinite(x).all():
        return False
    ax = model.matrix @ x
    return bool(np.all(x >= model.col_lb - tol) and np.all(x <= model.col_ub + tol)
                and np.all(ax >= model.row_lb - tol * np.maximum(1.0, np.abs(model.row_lb)))
                and np.all(ax <= model.row_ub + tol * np.maximum(1.0, np.abs(model.row_ub)))
                and np.all(np.abs(x[model.integrality] - np.round(x[model.integrality])) <= tol))


class Backend(ABC):
    """Base class of the solver backends (see the module docstring)."""

    name: ClassVar[str]
    required_modules: ClassVar[tuple[str, ...]]
    install_hint: ClassVar[str]  # e.g. "pip install 'allocopt[pulp]'"
    supports_integer: ClassVar[bool] = True
    supports_duals: ClassVar[bool] = True
    supports_warm_start: ClassVar[bool] = False

    @classmethod
    def is_installed(cls) -> bool:
        """True when every required module can be found (without importing it)."""
        return all(importlib.util.find_spec(m) is not None for m in cls.required_modules)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this backend cannot solve here (not installed, no usable license), or None when it can."""
        if not cls.is_installed():
            return f"backend {cls.name!r} needs {', '.join(cls.required_modules)} ({cls.install_hint})"
        return None

    @classmethod
    def check_installed(cls) -> None:
        """Raise BackendNotInstalledError (naming the extra to install) unless :meth:`is_installed`."""
        if not cls.is_installed():
            raise BackendNotInstalledError(
                f"backend {cls.name!r} needs the Python package(s) {', '.join(cls.required_modules)}; "
                f"install them with: {cls.install_hint}")

    @abstractmethod
    def build(self, model: CompiledModel, options: SolveOptions) -> Any:
        """Hand the minimization-form model to the solver; return a handle."""

    @abstractmethod
    def run(self, handle: Any, model: CompiledModel, options: SolveOptions) -> RawResult:
        """Solve the model behind ``handle`` and read the answer back."""

    def set_basis(self, handle: Any, model: CompiledModel, basis: Basis, options: SolveOptions) -> None:
        """Start the LP behind ``handle`` from ``basis`` (backends with ``supports_warm_start``)."""
        raise TypeError(f"{type(self).__name__} sets supports_warm_start but does not implement set_basis")

    def solve(self, model: CompiledModel, options: SolveOptions | None = None,
              warm_start: Basis | None = None) -> Solution:
        """Solve ``model`` and return a :class:`Solution` in the model's own sense.

        ``warm_start``, a basis of this model or of a similar one mapped onto
        it, starts an LP's simplex where the backend supports it; other
        backends and MILPs solve from scratch.
        """
        self.check_installed()
        options = options or SolveOptions()
        if model.is_mip and not self.supports_integer:
            raise InvalidOptionError(
                f"backend {self.name!r} cannot solve models with integer variables; "
                "use backend='highs', 'gurobi', 'pulp' or 'scipy'")
        if model.num_cols == 0:  # several solvers reject an empty model; the empty point decides
            feasible = bool(np.all(model.row_lb <= 0.0) and np.all(model.row_ub >= 0.0))
            raw = RawResult(Status.OPTIMAL if feasible else Status.INFEASIBLE, raw_status="no columns",
                            x=np.zeros(0) if feasible else None)
            return self._to_solution(model, raw, 0.0, 0.0)
        minimize = model if model.sense == "min" else replace(model, c=-model.c, sense="min")
        t0 = time.perf_counter()
        handle = self.build(minimize, options)
        if warm_start is not None and self.supports_warm_start and not model.is_mip:
            self.set_basis(handle, minimize, repair_basis(model, warm_start), options)
        t1 = time.perf_counter()
        raw = self.run(handle, minimize, options)
        t2 = time.perf_counter()
        if raw.status is not Status.OPTIMAL and raw.x is not None and not is_feasible(model, raw.x):
            # some interfaces hand back whatever point the solver held when it stopped
            raw.x, raw.row_duals = None, None
            raw.detail = (raw.detail + " The point the solver returned is not feasible; it was dropped.").strip()
        return self._to_solution(model, raw, t1 - t0, t2 - t1)

    def _to_solution(self, model: CompiledModel, raw: RawResult,
                     build_seconds: float, solve_seconds: float) -> Solution:
        sign = 1.0 if model.sense == "min" else -1.0
        objective = None
        values: dict[str, np.ndarray] = {}
        if raw.x is not None:
            x = np.asarray(raw.x, dtype=np.float64)
            # not c @ x: OpenBLAS splits a dot product this long over threads, 8 ms on a busy machine
            objective = float((model.c * x).sum() + model.offset)
            values = {name: x[cols].reshape(shape) for name, (cols, shape) in model.variables.items()}
        else:
            x = None
        duals: dict[str, np.ndarray] = {}
        if raw.row_duals is not None and not model.is_mip:
            y = sign * np.asarray(raw.row_duals, dtype=np.float64)
            duals = {name: y[rows].reshape(shape) for name, (rows, shape) in model.constraints.items()}
        message = f"{STATUS_MESSAGES[raw.status]} ({self.name}: {raw.raw_status})"
        if raw.detail:
            message += f" {raw.detail}"
        return Solution(status=raw.status, message=message, objective=objective, x=x,
                        backend=self.name, raw_status=raw.raw_status,
                        build_seconds=build_seconds, solve_seconds=solve_seconds,
                        values=values, duals=duals, mip_gap=raw.mip_gap,
                        simplex_iterations=raw.simplex_iterations,
                        basis_reader=raw.basis if raw.status is Status.OPTIMAL else None)
