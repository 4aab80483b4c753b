"""CBC through PuLP (the CBC binary bundled with PuLP, ``PULP_CBC_CMD``).

PuLP's API is one Python object per variable and per row, so building loops
over rows; each row's expression is made in one call from its CSR slice.
A ranged row ``lb < A_i x < ub`` becomes a ``<=`` row plus a ``>=`` row; its
dual is the sum of the two. CBC's ``pi`` is ``d objective / d rhs`` of the
minimization, our convention as is. https://coin-or.github.io/pulp/

CBC's text solution file, all PuLP reads, holds 8 significant digits
(``%15.8g``): an LP's values and duals come instead from the binary solution
file CBC also writes (``-saveSolution``: full doubles), after its first solve.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from allocopt.backends.base import Backend, RawResult, SolveOptions
from allocopt.errors import InvalidOptionError, SolverError
from allocopt.model import CompiledModel
from allocopt.solution import Status

STATUS_MAP = {
    1: Status.OPTIMAL,  # LpStatusOptimal
    0: Status.TIME_LIMIT,  # LpStatusNotSolved: CBC "Stopped" at a limit without a solution
    -1: Status.INFEASIBLE,  # LpStatusInfeasible (also CBC's "Integer infeasible")
    -2: Status.UNBOUNDED,  # LpStatusUnbounded
    -3: Status.ERROR,  # LpStatusUndefined
}
_SOLUTION_INTEGER_FEASIBLE = 2  # LpSolutionIntegerFeasible: CBC stopped at a limit with an incumbent
_NO_SOLUTION_FOUND = 0  # LpSolutionNoSolutionFound


@contextlib.contextmanager
def _quiet_pulp4_deprecations() -> Iterator[None]:
    """Silence PuLP 3's announcements of the PuLP 4 API (``LpVariable(...)``,
    ``PULP_CBC_CMD``): the replacements are missing from the PuLP versions we
    support, and our users cannot act on them."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*PuLP 4\.0", category=DeprecationWarning)
        yield


@dataclass
class _Handle:
    problem: Any  # pulp.LpProblem
    solver: Any  # pulp.PULP_CBC_CMD
    variables: list[Any]  # one pulp.LpVariable per column
    rows: list[tuple[int, Any]]  # (original row index, pulp.LpConstraint), ranged rows twice


class PulpBackend(Backend):
    """CBC through PuLP (see the module docstring)."""
    name = "pulp"
    required_modules = ("pulp",)
    install_hint = "pip install 'allocopt[pulp]'"

    def build(self, model: CompiledModel, options: SolveOptions) -> _Handle:
        import pulp

        settings: dict[str, Any] = {"msg": bool(options.verbose)}
        if options.time_limit_s is not None:
            settings["timeLimit"] = float(options.time_limit_s)
        if options.mip_gap is not None:
            settings["gapRel"] = float(options.mip_gap)
        if options.threads is not None:
            settings["threads"] = int(options.threads)
        settings.update(options.solver_options)
        with _quiet_pulp4_deprecations():
            return self._build(model, options, settings)

    @staticmethod
    def _build(model: CompiledModel, options: SolveOptions, settings: dict[str, Any]) -> _Handle:
        import pulp

        try:
            solver = pulp.PULP_CBC_CMD(**settings)
        except TypeError as err:
            raise InvalidOptionError(
                f"PULP_CBC_CMD rejected solver_options {sorted(options.solver_options)}: {err}; "
                "see https://coin-or.github.io/pulp/technical/solvers.html#pulp.apis.PULP_CBC_CMD") from err

        problem = pulp.LpProblem("allocopt", pulp.LpMinimize)
        variables = [
            pulp.LpVariable(f"x{j}", lowBound=lo if math.isfinite(lo) else None,
                            upBound=hi if math.isfinite(hi) else None,
                            cat=pulp.LpInteger if integer else pulp.LpContinuous)
            for j, (lo, hi, integer) in enumerate(zip(model.col_lb.tolist(), model.col_ub.tolist(),
                                                      model.integrality.tolist()))]
        # every column is in the objective, zeros included, so that CBC sees and values it
        problem.setObjective(pulp.LpAffineExpression(zip(variables, model.c.tolist())))
        rows: list[tuple[int, Any]] = []
        A = model.A
        indptr, indices, data = A.indptr, A.indices.tolist(), A.data.tolist()
        for i, (lo, hi) in enumerate(zip(model.row_lb.tolist(), model.row_ub.tolist())):
            start, end = indptr[i], indptr[i + 1]
            expr = pulp.LpAffineExpression(
                zip([variables[j] for j in indices[start:end]], data[start:end]))
            if lo == hi and math.isfinite(hi):
                rows.append((i, pulp.LpConstraint(expr, pulp.LpConstraintEQ, f"r{i}", hi)))
                continue
            if math.isfinite(hi):
                rows.append((i, pulp.LpConstraint(expr, pulp.LpConstraintLE, f"r{i}", hi)))
            if math.isfinite(lo):
                rows.append((i, pulp.LpConstraint(expr, pulp.LpConstraintGE, f"r{i}_lb", lo)))
        for _, constraint in rows:
            problem.addConstraint(constraint)
        return _Handle(problem, solver, variables, rows)

    def run(self, handle: _Handle, model: CompiledModel, options: SolveOptions) -> RawResult:
        import pulp

        started = time.perf_counter()
        folder = None if model.is_mip else tempfile.mkdtemp(prefix="allocopt-cbc-")
        binary = None if folder is None else f"{folder}/solution.bin"
        cbc_options = handle.solver.options
        if binary is not None and not any(c.isspace() for c in binary):
            # PuLP puts its options before its own -initialSolve: solve, write the binary file, then
            # PuLP's -initialSolve (at the optimum already: no iterations) and its text file
            handle.solver.options = [*cbc_options, f"initialSolve -saveSolution {binary}"]
        try:
            code = handle.problem.solve(handle.solver)
        except pulp.PulpSolverError as err:
            raise SolverError(f"CBC (through PuLP) failed: {err}; rerun with verbose=True "
                              "to see its log") from err
        finally:
            handle.solver.options = cbc_options
            full = None if binary is None else _binary_solution(binary, handle)
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        feasible_stop = handle.problem.sol_status == _SOLUTION_INTEGER_FEASIBLE
        status = Status.TIME_LIMIT if feasible_stop else STATUS_MAP.get(code, Status.ERROR)
        raw_status = f"{pulp.LpStatus.get(code, code)} ({code}), solution {pulp.LpSolution.get(handle.problem.sol_status)}"
        # CBC stopped by its time limit early in its search sometimes writes "Integer infeasible" (a third
        # of the runs of a feasible set cover at 0.01 s): past the limit, that is no proof
        if (status is Status.INFEASIBLE and handle.problem.sol_status == _NO_SOLUTION_FOUND
                and options.time_limit_s is not None and time.perf_counter() - started >= options.time_limit_s):
            status = Status.TIME_LIMIT
            raw_status += "; CBC said integer infeasible after its time limit, which is not a proof"
        result = RawResult(status=status, raw_status=raw_status)
        if code == pulp.LpStatusOptimal:  # also set when CBC stopped at a limit with an incumbent
            result.x = np.array([v.varValue for v in handle.variables], dtype=np.float64)
            pis = np.array([c.pi or 0.0 for _, c in handle.rows], dtype=np.float64)
            if full is not None:
                result.x, pis = full
            if not model.is_mip and result.status is Status.OPTIMAL:
                duals = np.zeros(model.num_rows)
                np.add.at(duals, [i for i, _ in handle.rows], pis)
                result.row_duals = duals
        return result


def _binary_solution(path: str, handle: _Handle) -> tuple[np.ndarray, np.ndarray] | None:
    """Column values (our column order) and row duals (``handle.rows`` order) from CBC's binary
    solution file: int32 rows and columns, then doubles: the objective, row activities, row duals,
    column values, reduced costs. None where the file is missing or does not fit the model."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    if len(raw) < 8:
        return None
    num_rows, num_cols = (int(v) for v in np.frombuffer(raw, np.int32, 2))
    values = np.frombuffer(raw, np.float64, offset=8)
    written = handle.problem.variables()  # CBC's column order: PuLP's variables sorted by name
    if num_rows != len(handle.rows) or num_cols != len(written) or values.size != 1 + 2 * (num_rows + num_cols):
        return None
    column = {id(v): j for j, v in enumerate(handle.variables)}
    x = np.zeros(len(handle.variables))
    for v, value in zip(written, values[1 + 2 * num_rows:1 + 2 * num_rows + num_cols].tolist()):
        if id(v) in column:  # not PuLP's __dummy
            x[column[id(v)]] = value
    return x, values[1 + num_rows:1 + 2 * num_rows].copy()
