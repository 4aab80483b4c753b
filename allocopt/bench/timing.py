"""Timing one allocopt solve or one cvxpy solve, split the same way on both sides."""

from __future__ import annotations

import gc
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from allocopt.errors import (
    AllocoptError,
    BackendNotInstalledError,
    LicenseError,
    NotOptimalError,
    TimeLimitError,
)

#: Objectives agree when ``|a - b| <= OBJECTIVE_RTOL * max(|b|, 1e-12)``.
OBJECTIVE_RTOL = 1e-6


@dataclass
class Measurement:
    """One timed solve (medians over repeats); seconds.

    allocopt: ``build_s`` = ``Timings.model_build_s`` (formulating and
    compiling the models), ``transfer_s`` = ``Timings.solver_build_s``
    (handing them to the solver), ``solve_s`` = ``Timings.solve_s``,
    ``total_s`` = ``Timings.total_s``. cvxpy: ``build_s`` = the expression
    tree plus ``Problem.get_problem_data`` (cvxpy's compilation),
    ``transfer_s`` = the solver interface outside the solver's own clock and
    unpacking, ``solve_s`` = the solver's own time, ``total_s`` = end to end.
    """

    status: str = "ok"  # ok | skipped: ... | timeout: ... | error: ... | estimated: ...
    build_s: float | None = None
    transfer_s: float | None = None
    solve_s: float | None = None
    total_s: float | None = None
    objective: float | None = None
    num_solves: int | None = None
    runs: list[float] = field(default_factory=list)  # total_s of every run
    values: Any = field(default=None, repr=False)  # the solution (allocopt Allocation or cvxpy values), not saved

    @property
    def ok(self) -> bool:
        """Whether the run finished (status ``ok``)."""
        return self.status == "ok"

    def summary(self) -> dict[str, Any]:
        """Every field but ``values``, for JSON."""
        return {f: getattr(self, f) for f in ("status", "build_s", "transfer_s", "solve_s", "total_s", "objective",
                                              "num_solves", "runs")}


def short(err: Any, limit: int = 120) -> str:
    """``err`` on one line, at most ``limit`` characters."""
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _median(runs: list[dict[str, float]], out: Measurement) -> Measurement:
    for key in ("build_s", "transfer_s", "solve_s", "total_s"):
        setattr(out, key, statistics.median(r[key] for r in runs))
    out.runs = [r["total_s"] for r in runs]
    return out


def time_allocopt(problem: Any, policy: str, *, backend: str = "highs", options: dict[str, Any] | None = None,
                  repeat: int = 1, time_limit_s: float | None = None,
                  solver_options: dict[str, Any] | None = None) -> Measurement:
    """``allocopt.solve(problem, policy, backend=backend, solver_options=solver_options, **options)``,
    ``repeat`` times.

    Failures become the status (``skipped: ...`` for a missing or unlicensed
    solver, ``timeout: ...`` at ``time_limit_s``, ``error: ...`` otherwise).
    """
    from allocopt.api import solve

    runs = []
    try:
        for _ in range(repeat):
            gc.collect()
            alloc = solve(problem, policy, backend=backend, time_limit_s=time_limit_s, solver_options=solver_options,
                          **(options or {}))
            t = alloc.timings
            runs.append({"build_s": t.model_build_s, "transfer_s": t.solver_build_s, "solve_s": t.solve_s,
                         "total_s": t.total_s})
    except (BackendNotInstalledError, LicenseError) as err:
        return Measurement(status=f"skipped: {short(err)}")
    except TimeLimitError:
        return Measurement(status=f"timeout: over {time_limit_s:g} s")
    except NotOptimalError as err:
        return Measurement(status=f"error: {short(err)}")
    except AllocoptError as err:
        return Measurement(status=f"error: {type(err).__name__}: {short(err)}")
    out = Measurement(objective=alloc.objective, num_solves=alloc.timings.num_solves, values=alloc)
    return _median(runs, out)


def time_cvxpy(build: Callable[[], tuple[Any, Any]], *, solver: str = "HIGHS",
               solver_opts: dict[str, Any] | None = None, time_limit_s: float | None = None,
               objective: Callable[[float], float] = float, repeat: int = 1) -> Measurement:
    """Build a cvxpy problem with ``build() -> (problem, variable)`` and solve it with ``solver``.

    ``objective`` maps cvxpy's optimal value to the policy's objective (e.g.
    ``1 / theta`` for a makespan). ``time_limit_s`` becomes the solver's
    ``time_limit`` option. ``values`` of the result: the variable's value.
    """
    import cvxpy as cp

    if solver not in cp.installed_solvers():
        return Measurement(status=f"skipped: cvxpy has no {solver} solver (pip install cvxpy[{solver.lower()}])")
    opts = dict(solver_opts or {})
    if time_limit_s is not None:
        opts["time_limit"] = float(time_limit_s)
    runs = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        prob, var = build()
        data, chain, inverse_data = prob.get_problem_data(solver, solver_opts=opts)
        t1 = time.perf_counter()
        try:
            raw = chain.solve_via_data(prob, data, False, False, opts)
        except cp.error.SolverError as err:
            return Measurement(status=f"error: {short(err)}")
        t2 = time.perf_counter()
        with warnings.catch_warnings():  # "Solution may be inaccurate": the status below says so
            warnings.simplefilter("ignore", UserWarning)
            prob.unpack_results(raw, chain, inverse_data)
        t3 = time.perf_counter()
        if prob.status != cp.OPTIMAL:
            over = time_limit_s is not None and t2 - t1 >= 0.95 * time_limit_s
            return Measurement(status=f"timeout: over {time_limit_s:g} s" if over
                               else f"error: cvxpy status {prob.status}", total_s=t3 - t0)
        stats = prob.solver_stats
        inner = min(float(stats.solve_time), t2 - t1) if stats and stats.solve_time else t2 - t1
        runs.append({"build_s": t1 - t0, "transfer_s": (t2 - t1 - inner) + (t3 - t2), "solve_s": inner,
                     "total_s": t3 - t0})
    return _median(runs, Measurement(objective=objective(prob.value), num_solves=1, values=var.value))
