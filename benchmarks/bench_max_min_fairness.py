#!/usr/bin/env python
"""Benchmark: heterogeneity-aware max-min fairness, allocopt vs. Gavel-style cvxpy.

For every (n_jobs, n_gpu_types) cell this script

* solves ``allocopt.solve(problem, "max_min_fairness", backend=b)`` with each
  requested allocopt backend ``b`` and splits the wall-clock time into
  formulation, model compilation, transfer to the solver and solver time
  (from ``Allocation.timings``);
* solves the *same* problem written the straightforward cvxpy way, as Gavel
  does (one cvxpy expression tree for the whole policy), with the same
  underlying solver (cvxpy's ``HIGHS`` for the ``highs`` backend, ``GUROBI``
  for ``gurobi``), and splits its time into expression building, cvxpy
  compilation (``Problem.get_problem_data``), solver interface and solver;
* checks that the objectives agree (relative difference <= 1e-6) and that
  allocopt's allocation is feasible;
* reports the issue's targets (without asserting them):
  (a) allocopt's model building (``model_build_s + solver_build_s``) is at
      most 10% of the HiGHS solve time at every size;
  (b) at 16,384 jobs x 8 types, backend ``highs`` end to end is at least 5x
      faster than the cvxpy formulation solved by HiGHS.

Usage::

    python benchmarks/bench_max_min_fairness.py                  # full run
    python benchmarks/bench_max_min_fairness.py --quick          # 256, 1024 on highs
    python benchmarks/bench_max_min_fairness.py --sizes 256,1024 --types 3 \\
        --backends highs,scipy --repeat 3 --json out.json --csv out.csv
    python benchmarks/bench_max_min_fairness.py --profile 16384x8  # cProfile allocopt's model building

See benchmarks/README.md for what each column means.
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import gc
import io
import json
import math
import os
import pstats
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from machine import machine_info
import allocopt
from allocopt.backends import BACKENDS, get_backend
from allocopt.errors import BackendNotInstalledError, LicenseError, LicenseLimitError
from allocopt.formulations.max_min_fairness import normalized_coefficients

DEFAULT_SIZES = (256, 1024, 4096, 16384)
DEFAULT_TYPES = (3, 8)
QUICK_SIZES = (256, 1024)
OBJECTIVE_RTOL = 1e-6
FEAS_TOL = 1e-6
TARGET_A_RATIO = 0.10  # (model_build_s + solver_build_s) / solve_s
TARGET_B_SPEEDUP = 5.0  # cvxpy end to end / highs end to end
TARGET_B_CELL = (16384, 8)

# The solver underneath each allocopt backend, as cvxpy names it. scipy's
# linprog(method="highs") runs HiGHS; allocopt's cvxpy backend runs the solver
# given by --cvxpy-solver (HIGHS by default; cvxpy's own default would be
# GUROBI when gurobipy is installed, which the size-limited license caps).
SAME_SOLVER = {"highs": "HIGHS", "scipy": "HIGHS", "gurobi": "GUROBI", "pulp": "CBC", "cvxpy": "HIGHS"}
# Cells of these are never skipped for time unless --cap-all is given.
UNCAPPED = ("highs", "gavel-cvxpy[HIGHS]")
try:
    from allocopt.backends.gurobi import SIZE_LIMIT as GUROBI_SIZE_LIMIT
except ImportError:
    GUROBI_SIZE_LIMIT = 2000  # gurobipy's pip license: about 2000 variables and 2000 constraints


# ----------------------------------------------------------------------------------------------
# Instances
# ----------------------------------------------------------------------------------------------
def generate_problem(n_jobs: int, n_gpu_types: int, seed: int = 0) -> allocopt.Problem:
    """A random, seeded, contended max-min-fairness instance.

    * Throughputs: job ``i`` has a base speed ``b_i`` log-uniform in [0.1, 10]
      steps/s; GPU type ``j`` a speedup ``f_j`` log-uniform in [1, 6] (types
      sorted slowest first); ``T_ij = b_i f_j e_ij`` with log-normal noise
      ``e_ij`` (sigma 0.3), so jobs prefer types to different degrees. About
      10% of the entries are 0 (the job cannot run there), never all of a row.
    * Scale factors from {1, 2, 4, 8} with probabilities 0.7/0.1/0.15/0.05
      (mean 1.9 GPUs per job).
    * Priority weights 1 (80%) or 2 (20%).
    * Capacity: ``max(8 * k, n / 4)`` GPUs in total split over the types by a
      Dirichlet(4) draw, at least 8 per type (so every scale factor fits):
      about 1.9 n GPUs demanded for n / 4 available, a contended cluster.
    """
    if n_jobs < 1 or n_gpu_types < 1:
        raise ValueError("n_jobs and n_gpu_types must be positive")
    rng = np.random.default_rng([seed, n_jobs, n_gpu_types])
    n, k = n_jobs, n_gpu_types
    base = np.exp(rng.uniform(np.log(0.1), np.log(10.0), n))
    speedup = np.sort(np.exp(rng.uniform(0.0, np.log(6.0), k)))
    noise = np.exp(rng.normal(0.0, 0.3, (n, k)))
    T = base[:, None] * speedup[None, :] * noise
    zero = rng.random((n, k)) < 0.10
    zero[np.arange(n), rng.integers(0, k, n)] = False  # every job can run somewhere
    T[zero] = 0.0
    scale = rng.choice([1, 2, 4, 8], size=n, p=[0.7, 0.1, 0.15, 0.05])
    weights = rng.choice([1.0, 2.0], size=n, p=[0.8, 0.2])
    total = max(8 * k, n // 4)
    share = rng.dirichlet(np.full(k, 4.0))
    capacity = np.maximum(8, np.round(share * total)).astype(int)
    cluster = allocopt.Cluster({f"gpu{j}": int(capacity[j]) for j in range(k)})
    return allocopt.Problem(T, cluster, scale_factors=scale, priority_weights=weights)


# ----------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------
@dataclass
class Cell:
    """One (solver, n_jobs, n_gpu_types) measurement; times are medians over repeats.

    For allocopt backends: ``formulate_s`` = total_s - model_build_s -
    solver_build_s - solve_s (policy formulation with LinExpr operations and
    option checks, not counted in Timings.model_build_s), ``compile_s`` =
    Timings.model_build_s (Model.compile), ``transfer_s`` =
    Timings.solver_build_s (backend build), ``solve_s`` = Timings.solve_s.

    For gavel-cvxpy baselines: ``formulate_s`` = building the cvxpy expression
    tree, ``compile_s`` = Problem.get_problem_data, ``transfer_s`` = time in
    the solver interface outside the solver's own clock plus unpack_results,
    ``solve_s`` = the solver's own reported time (solver_stats.solve_time).
    """

    solver: str
    kind: str  # "allocopt" or "baseline"
    n_jobs: int
    n_gpu_types: int
    status: str = "ok"  # ok | skipped: ... | error: ...
    formulate_s: float | None = None
    compile_s: float | None = None
    transfer_s: float | None = None
    solve_s: float | None = None
    total_s: float | None = None
    objective: float | None = None
    reference: str | None = None  # the cell the objective is compared with
    objective_rel_diff: float | None = None
    speedup: float | None = None  # same-solver gavel-cvxpy total_s / this total_s
    max_violation: float | None = None
    runs: list[dict[str, float]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def build_s(self) -> float | None:
        """Model building as target (a) counts it: compile + transfer."""
        if self.compile_s is None or self.transfer_s is None:
            return None
        return self.compile_s + self.transfer_s

    @property
    def overhead_s(self) -> float | None:
        """Everything outside the solver: total - solve."""
        if self.total_s is None or self.solve_s is None:
            return None
        return self.total_s - self.solve_s


class Skip(Exception):
    """Raised inside a cell to record it as skipped."""


def _median_runs(cell: Cell, runs: list[dict[str, float]]) -> None:
    cell.runs = runs
    for key in ("formulate_s", "compile_s", "transfer_s", "solve_s", "total_s"):
        setattr(cell, key, statistics.median(r[key] for r in runs))
    cell.objective = runs[-1]["objective"]


def max_violation(problem: allocopt.Problem, X: np.ndarray) -> float:
    """Largest violation of the base constraints by allocation ``X``."""
    viol = [float(np.max(-X, initial=0.0)),
            float(np.max(X.sum(axis=1) - 1.0, initial=0.0)),
            float(np.max((problem.scale_factors @ X - problem.capacity) / np.maximum(problem.capacity, 1),
                         initial=0.0)),
            float(np.max(X[~problem.runnable], initial=0.0))]
    return max(viol) + 0.0  # + 0.0 turns -0.0 into 0.0


# ----------------------------------------------------------------------------------------------
# allocopt
# ----------------------------------------------------------------------------------------------
def run_allocopt(problem: allocopt.Problem, backend: str, repeat: int,
                 solver_options: dict[str, Any] | None = None) -> Cell:
    cell = Cell(backend, "allocopt", problem.num_jobs, problem.cluster.num_gpu_types)
    runs = []
    try:
        for _ in range(repeat):
            gc.collect()
            alloc = allocopt.solve(problem, "max_min_fairness", backend=backend, solver_options=solver_options)
            t = alloc.timings
            runs.append({"formulate_s": t.total_s - t.model_build_s - t.solver_build_s - t.solve_s,
                         "compile_s": t.model_build_s, "transfer_s": t.solver_build_s,
                         "solve_s": t.solve_s, "total_s": t.total_s, "objective": alloc.objective})
        cell.max_violation = max_violation(problem, alloc.matrix)
    except LicenseLimitError as err:
        cell.status = f"skipped: license limit ({_short(err)})"
        return cell
    except BackendNotInstalledError as err:
        cell.status = f"skipped: not installed ({_short(err)})"
        return cell
    except LicenseError as err:
        cell.status = f"skipped: no license ({_short(err)})"
        return cell
    except Exception as err:  # noqa: BLE001 -- a benchmark records failures and goes on
        cell.status = f"error: {type(err).__name__}: {_short(err)}"
        return cell
    _median_runs(cell, runs)
    return cell


# ----------------------------------------------------------------------------------------------
# Gavel-style cvxpy baseline
# ----------------------------------------------------------------------------------------------
def build_gavel_cvxpy(problem: allocopt.Problem):
    """Max-min fairness as one cvxpy expression tree, the way Gavel writes it
    (``max_min_fairness_perf``), with x fixed to 0 where the job cannot run."""
    import cvxpy as cp

    n, k = problem.num_jobs, problem.cluster.num_gpu_types
    coef = normalized_coefficients(problem)  # s_i T_ij / (w_i p_i)
    scale_factors_array = np.repeat(problem.scale_factors.astype(np.float64)[:, None], k, axis=1)
    x = cp.Variable((n, k))
    objective = cp.Maximize(cp.min(cp.sum(cp.multiply(coef, x), axis=1)))
    constraints = [
        x >= 0,
        cp.sum(x, axis=1) <= 1,
        cp.sum(cp.multiply(scale_factors_array, x), axis=0) <= problem.capacity.astype(np.float64),
    ]
    rows, cols = np.nonzero(~problem.runnable)
    if rows.size:
        constraints.append(x[rows, cols] == 0)
    return cp.Problem(objective, constraints), x


def _cvxpy_data_size(data: Any) -> tuple[int | None, int | None]:
    """(columns, rows) of the solver data cvxpy's get_problem_data returned."""
    try:
        cols = next(int(np.size(data[key])) for key in ("c", "q") if key in data)
        rows = sum(int(data[key].shape[0]) for key in ("A", "F") if data.get(key) is not None)
        return cols, rows
    except Exception:  # noqa: BLE001
        return None, None


def run_gavel_cvxpy(problem: allocopt.Problem, solver: str, repeat: int,
                    solver_opts: dict[str, Any] | None = None) -> Cell:
    import cvxpy as cp

    cell = Cell(f"gavel-cvxpy[{solver}]", "baseline", problem.num_jobs, problem.cluster.num_gpu_types)
    if solver not in cp.installed_solvers():
        cell.status = f"skipped: cvxpy has no {solver} solver installed"
        return cell
    runs = []
    data = None
    try:
        for _ in range(repeat):
            gc.collect()
            t0 = time.perf_counter()
            prob, x = build_gavel_cvxpy(problem)
            t1 = time.perf_counter()
            data, chain, inverse_data = prob.get_problem_data(solver)
            t2 = time.perf_counter()
            raw = chain.solve_via_data(prob, data, False, False, dict(solver_opts or {}))
            t3 = time.perf_counter()
            prob.unpack_results(raw, chain, inverse_data)
            t4 = time.perf_counter()
            if prob.status != cp.OPTIMAL:
                raise RuntimeError(f"cvxpy status {prob.status}")
            inner = prob.solver_stats.solve_time if prob.solver_stats else None
            inner = (t3 - t2) if inner is None else min(float(inner), t3 - t2)
            runs.append({"formulate_s": t1 - t0, "compile_s": t2 - t1,
                         "transfer_s": (t3 - t2 - inner) + (t4 - t3), "solve_s": inner,
                         "total_s": t4 - t0, "objective": float(prob.value)})
        cell.max_violation = max_violation(problem, np.asarray(x.value))
    except Exception as err:  # noqa: BLE001
        text = f"{type(err).__name__}: {err}"
        cols, rows = _cvxpy_data_size(data) if data is not None else (None, None)
        if "size-limited" in text or "too large" in text.lower():
            cell.status = f"skipped: license limit ({_short(text)})"
        elif solver == "GUROBI" and cols is not None and max(cols, rows) > GUROBI_SIZE_LIMIT:
            # cvxpy swallows gurobipy's "size-limited license" error into a generic SolverError
            cell.status = (f"skipped: license limit (cvxpy's GUROBI model has {cols} variables and {rows} "
                           f"constraints; {_short(text, 40)})")
        else:
            cell.status = f"error: {_short(text)}"
        return cell
    _median_runs(cell, runs)
    return cell


# ----------------------------------------------------------------------------------------------
# Backend discovery
# ----------------------------------------------------------------------------------------------
def discover_backends() -> tuple[list[str], dict[str, str]]:
    """allocopt backends that are installed and importable now, and why the others are not."""
    available: list[str] = []
    missing: dict[str, str] = {}
    try:
        listed = set(allocopt.installed_backends())
    except Exception:  # noqa: BLE001 -- a backend module may not exist yet; check one by one
        listed = None
    for name in BACKENDS:
        try:
            backend = get_backend(name)
        except ImportError as err:
            missing[name] = f"backend module not importable ({_short(err)})"
            continue
        except Exception as err:  # noqa: BLE001
            missing[name] = f"backend failed to load ({type(err).__name__}: {_short(err)})"
            continue
        if (listed is not None and name not in listed) or not backend.is_installed():
            missing[name] = f"solver package not installed ({backend.install_hint})"
            continue
        available.append(name)
    return available, missing


# ----------------------------------------------------------------------------------------------
# Machine description
# ----------------------------------------------------------------------------------------------
# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------
def _short(err: Any, limit: int = 90) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


COLUMNS = [("solver", 20), ("jobs", 6), ("types", 5), ("formulate_s", 11), ("compile_s", 9), ("transfer_s", 10),
           ("solve_s", 9), ("total_s", 9), ("build/solve", 11), ("ovh/solve", 10), ("speedup", 8),
           ("objective", 12), ("rel.diff", 9), ("note", 0)]


def format_table(cells: list[Cell]) -> str:
    lines = ["  ".join(f"{name:>{w}}" if i not in (0, len(COLUMNS) - 1) else f"{name:<{w}}"
                       for i, (name, w) in enumerate(COLUMNS)).rstrip()]
    lines.append("-" * len(lines[0]))
    last_key = None
    for c in cells:
        key = (c.n_gpu_types, c.n_jobs)
        if last_key is not None and key != last_key:
            lines.append("")
        last_key = key
        if not c.ok:
            values = [c.solver, c.n_jobs, c.n_gpu_types] + ["-"] * 10 + [c.status]
        else:
            build = c.build_s / c.solve_s if c.solve_s and c.kind == "allocopt" else None
            ovh = c.overhead_s / c.solve_s if c.solve_s else None
            speed = c.speedup
            note = []
            if c.objective_rel_diff is not None and c.objective_rel_diff > OBJECTIVE_RTOL:
                note.append(f"OBJECTIVE MISMATCH vs {c.reference}")
            if c.max_violation is not None and c.max_violation > FEAS_TOL:
                note.append(f"infeasible by {c.max_violation:.1e}")
            values = [c.solver, c.n_jobs, c.n_gpu_types, _fmt_s(c.formulate_s), _fmt_s(c.compile_s),
                      _fmt_s(c.transfer_s), _fmt_s(c.solve_s), _fmt_s(c.total_s), _fmt_pct(build),
                      _fmt_pct(ovh), "-" if speed is None else f"{speed:.2f}x",
                      "-" if c.objective is None else f"{c.objective:.8f}",
                      "-" if c.objective_rel_diff is None else f"{c.objective_rel_diff:.1e}",
                      "; ".join(note)]
        lines.append("  ".join(f"{str(v):<{w}}" if i in (0, len(COLUMNS) - 1) else f"{str(v):>{w}}"
                               for i, (v, (_, w)) in enumerate(zip(values, COLUMNS))).rstrip())
    return "\n".join(lines)


def compare(cells: list[Cell], same_solver: dict[str, str]) -> None:
    """Fill objective_rel_diff / reference / speedup for every cell of one (n, k)."""
    by_name = {c.solver: c for c in cells if c.ok}
    ref_default = by_name.get("gavel-cvxpy[HIGHS]") or by_name.get("highs")
    for c in cells:
        if not c.ok:
            continue
        ref = None
        if c.kind == "allocopt":
            ref = by_name.get(f"gavel-cvxpy[{same_solver.get(c.solver, 'HIGHS')}]")
            if ref is not None and ref.total_s:
                c.speedup = ref.total_s / c.total_s
        if ref is None:
            ref = ref_default if ref_default is not c else by_name.get("highs")
        if ref is None or ref is c or c.objective is None or ref.objective is None:
            continue
        c.reference = ref.solver
        c.objective_rel_diff = abs(c.objective - ref.objective) / max(abs(ref.objective), 1e-12)


def evaluate_targets(cells: list[Cell]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    highs = [c for c in cells if c.solver == "highs" and c.kind == "allocopt"]
    ok = [c for c in highs if c.ok and c.solve_s]
    a_cells = [{"n_jobs": c.n_jobs, "n_gpu_types": c.n_gpu_types, "ratio": c.build_s / c.solve_s,
                "ratio_incl_formulation": c.overhead_s / c.solve_s} for c in ok]
    out["a"] = {"description": f"allocopt (model_build_s + solver_build_s) <= {TARGET_A_RATIO:.0%} of the "
                               "HiGHS solve time at every size",
                "met": bool(a_cells) and len(ok) == len(highs) and all(r["ratio"] <= TARGET_A_RATIO
                                                                      for r in a_cells),
                "cells": a_cells,
                "met_incl_formulation": bool(a_cells) and all(r["ratio_incl_formulation"] <= TARGET_A_RATIO
                                                              for r in a_cells)}
    n, k = TARGET_B_CELL
    hc = next((c for c in cells if c.solver == "highs" and (c.n_jobs, c.n_gpu_types) == (n, k) and c.ok), None)
    bc = next((c for c in cells if c.solver == "gavel-cvxpy[HIGHS]" and (c.n_jobs, c.n_gpu_types) == (n, k)
               and c.ok), None)
    b: dict[str, Any] = {"description": f"at {n} jobs x {k} types, highs end to end >= {TARGET_B_SPEEDUP:g}x "
                                        "faster than the cvxpy formulation with HiGHS, same objective"}
    if hc is None or bc is None:
        b.update(met=None, note="cell not measured (pass --sizes including 16384 and --types including 8)")
    else:
        speed = bc.total_s / hc.total_s
        same = hc.objective_rel_diff is not None and hc.objective_rel_diff <= OBJECTIVE_RTOL
        b.update(met=bool(speed >= TARGET_B_SPEEDUP and same), speedup=speed, objective_agrees=same,
                 highs_total_s=hc.total_s, cvxpy_total_s=bc.total_s,
                 highs_outside_solver_s=hc.overhead_s, cvxpy_outside_solver_s=bc.overhead_s,
                 highs_solve_s=hc.solve_s, cvxpy_solve_s=bc.solve_s)
    out["b"] = b
    agree = [c for c in cells if c.ok and c.objective_rel_diff is not None]
    out["objectives_agree"] = {"rtol": OBJECTIVE_RTOL, "compared": len(agree),
                               "max_rel_diff": max((c.objective_rel_diff for c in agree), default=None),
                               "mismatches": [f"{c.solver} {c.n_jobs}x{c.n_gpu_types} vs {c.reference}: "
                                              f"{c.objective_rel_diff:.2e}" for c in agree
                                              if c.objective_rel_diff > OBJECTIVE_RTOL]}
    return out


def format_targets(targets: dict[str, Any]) -> str:
    a, b, agree = targets["a"], targets["b"], targets["objectives_agree"]
    lines = ["Targets (reported, not asserted):"]
    worst = max(a["cells"], key=lambda r: r["ratio"], default=None)
    detail = (f"worst {100 * worst['ratio']:.1f}% at {worst['n_jobs']}x{worst['n_gpu_types']}; " if worst else "")
    worst_f = max(a["cells"], key=lambda r: r["ratio_incl_formulation"], default=None)
    if worst_f:
        detail += (f"counting the policy formulation too (total - solve): worst "
                   f"{100 * worst_f['ratio_incl_formulation']:.1f}% at "
                   f"{worst_f['n_jobs']}x{worst_f['n_gpu_types']}, "
                   f"{'met' if a['met_incl_formulation'] else 'MISSED'}")
    lines.append(f"  (a) {a['description']}: {'MET' if a['met'] else 'MISSED'} ({detail})")
    if b.get("met") is None:
        lines.append(f"  (b) {b['description']}: not measured ({b['note']})")
    else:
        lines.append(f"  (b) {b['description']}: {'MET' if b['met'] else 'MISSED'} "
                     f"(speedup {b['speedup']:.2f}x: highs {b['highs_total_s']:.2f} s vs cvxpy "
                     f"{b['cvxpy_total_s']:.2f} s end to end; outside the solver {b['highs_outside_solver_s']:.3f} s "
                     f"vs {b['cvxpy_outside_solver_s']:.3f} s; HiGHS time {b['highs_solve_s']:.2f} s vs "
                     f"{b['cvxpy_solve_s']:.2f} s; objectives {'agree' if b['objective_agrees'] else 'DIFFER'})")
    mx = agree["max_rel_diff"]
    lines.append(f"  objectives: {agree['compared']} cells compared, max relative difference "
                 f"{'-' if mx is None else f'{mx:.1e}'} (tolerance {agree['rtol']:g})"
                 + ("" if not agree["mismatches"] else "; MISMATCHES: " + ", ".join(agree["mismatches"])))
    return "\n".join(lines)


def format_machine(info: dict[str, Any]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    return (f"Machine: {info['platform']} ({info['machine']}), CPU {info['cpu']}, "
            f"{info['cpu_count']} CPUs ({info['cpus_usable']} usable), {info['memory_gib']} GiB RAM, "
            f"load average {info['load_average']} at start\n"
            f"Python {info['python']}; {versions}")


# ----------------------------------------------------------------------------------------------
# Profiling allocopt's model building
# ----------------------------------------------------------------------------------------------
def profile_model_building(n: int, k: int, seed: int, repeat: int = 1, top: int = 30) -> str:
    """Where allocopt's time outside the solver goes on the ``highs`` path.

    Times ``allocopt.solve`` (real solves), then profiles it with cProfile
    while ``HighsBackend.run`` is replaced by a stub that returns zeros, so
    the profile holds only formulation, ``Model.compile`` and
    ``HighsBackend.build`` (``passModel``).
    """
    from allocopt.backends.base import RawResult
    from allocopt.backends.highs import HighsBackend
    from allocopt.solution import Status

    problem = generate_problem(n, k, seed)
    allocopt.solve(generate_problem(64, k, seed), backend="highs")  # warm up imports
    out = io.StringIO()
    real = run_allocopt(problem, "highs", repeat)
    if not real.ok:
        return f"allocopt.solve failed: {real.status}"
    print(f"allocopt.solve, backend highs, {n} jobs x {k} types (median of {repeat}): formulate "
          f"{real.formulate_s:.4f} s, compile (model_build_s) {real.compile_s:.4f} s, transfer "
          f"(solver_build_s) {real.transfer_s:.4f} s, solve {real.solve_s:.4f} s, total {real.total_s:.4f} s",
          file=out)
    real_run = HighsBackend.run

    def stub_run(self, handle, model, options):  # noqa: ANN001
        return RawResult(Status.OPTIMAL, "stub", x=np.zeros(model.num_cols), objective=0.0)

    HighsBackend.run = stub_run
    try:
        reps = max(3, min(200, int(20000 / max(n * k, 1))))
        stubbed = run_allocopt(problem, "highs", reps)
        print(f"with run() stubbed (median of {reps}): formulate {stubbed.formulate_s * 1000:.3f} ms, compile "
              f"{stubbed.compile_s * 1000:.3f} ms, transfer {stubbed.transfer_s * 1000:.3f} ms, "
              f"total {stubbed.total_s * 1000:.3f} ms", file=out)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(reps):
            allocopt.solve(problem, "max_min_fairness", backend="highs")
        prof.disable()
    finally:
        HighsBackend.run = real_run
    print(f"\ncProfile of {reps} stubbed solves, top {top} by cumulative time:", file=out)
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    print(f"cProfile of {reps} stubbed solves, top {top} by internal time:", file=out)
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------
def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _options(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in filter(None, (v.strip() for v in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {item!r}")
        parsed: Any = value
        for cast in (int, float):
            try:
                parsed = cast(value)
                break
            except ValueError:
                pass
        if value.lower() in ("true", "false"):
            parsed = value.lower() == "true"
        out[key.strip()] = parsed
    return out


def _name_list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See benchmarks/README.md.")
    p.add_argument("--sizes", type=_int_list, default=None,
                   help=f"numbers of jobs (default {','.join(map(str, DEFAULT_SIZES))})")
    p.add_argument("--types", type=_int_list, default=None,
                   help=f"numbers of GPU types (default {','.join(map(str, DEFAULT_TYPES))})")
    p.add_argument("--backends", type=_name_list, default=None,
                   help="allocopt backends (default: every installed and importable one)")
    p.add_argument("--baselines", type=_name_list, default=None,
                   help="cvxpy solvers for the Gavel-style baseline, or 'none' (default: the solvers "
                        "underneath the chosen backends that cvxpy has, e.g. HIGHS,GUROBI)")
    p.add_argument("--cvxpy-solver", default="HIGHS", type=str.upper,
                   help="cvxpy solver for allocopt's cvxpy backend (default HIGHS)")
    p.add_argument("--highs-options", type=_options, default={}, metavar="KEY=VALUE,...",
                   help="HiGHS options for both allocopt's highs backend (and cvxpy backend on HIGHS) and "
                        "gavel-cvxpy[HIGHS], e.g. solver=ipm (default: HiGHS's defaults)")
    p.add_argument("--repeat", type=int, default=1, help="runs per cell; times are medians (default 1)")
    p.add_argument("--seed", type=int, default=0, help="instance seed (default 0)")
    p.add_argument("--max-seconds", type=float, default=120.0,
                   help="per-backend time budget for one run of a cell: after a run takes longer, larger "
                        "cells of that backend are skipped, as are cells whose linear extrapolation from the "
                        "previous size exceeds it (default 120)")
    p.add_argument("--cap-all", action="store_true",
                   help=f"apply --max-seconds to {' and '.join(UNCAPPED)} too (exempt by default)")
    p.add_argument("--json", metavar="PATH", help="write machine, cells and targets as JSON")
    p.add_argument("--csv", metavar="PATH", help="write the cells as CSV")
    p.add_argument("--quick", action="store_true",
                   help=f"{','.join(map(str, QUICK_SIZES))} jobs on highs only (plus its cvxpy baseline)")
    p.add_argument("--profile", metavar="NxK",
                   help="instead of the benchmark, profile allocopt's model building for N jobs x K types")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.quick:
        args.sizes = args.sizes or list(QUICK_SIZES)
        args.backends = args.backends or ["highs"]
    args.sizes = args.sizes or list(DEFAULT_SIZES)
    args.types = args.types or list(DEFAULT_TYPES)
    return args


def _budget_skip(name: str, n: int, k: int, history: dict[str, list[tuple[int, int, float]]],
                 max_seconds: float) -> str | None:
    for n0, k0, secs in history.get(name, []):
        if n0 <= n and k0 <= k and secs > max_seconds:
            return f"skipped: budget (a smaller cell {n0}x{k0} took {secs:.0f} s > --max-seconds {max_seconds:g})"
    same_k = [(n0, secs) for n0, k0, secs in history.get(name, []) if k0 == k and n0 < n]
    if same_k:
        n0, secs = max(same_k)
        predicted = secs * n / n0
        if predicted > max_seconds:
            return (f"skipped: budget ({n0}x{k} took {secs:.1f} s, so {n}x{k} would take > {predicted:.0f} s "
                    f"> --max-seconds {max_seconds:g})")
    return None


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    info = machine_info()
    print(format_machine(info), flush=True)
    available, missing = discover_backends()
    same_solver = dict(SAME_SOLVER, cvxpy=args.cvxpy_solver)
    if args.backends is None:
        backends = available
    else:
        unknown = [b for b in args.backends if b not in BACKENDS]
        if unknown:
            sys.exit(f"unknown backend(s) {unknown}; choose from {', '.join(BACKENDS)}")
        backends = list(args.backends)
    if missing:
        print("Backends not available: " + "; ".join(f"{b}: {why}" for b, why in missing.items()), flush=True)
    import cvxpy as cp
    cvx_solvers = set(cp.installed_solvers())
    if args.baselines is None:
        baselines = []
        for b in backends:
            s = same_solver.get(b, "HIGHS")
            if s in cvx_solvers and s not in baselines:
                baselines.append(s)
        if "HIGHS" not in baselines:
            baselines.insert(0, "HIGHS")
    elif [s.lower() for s in args.baselines] == ["none"]:
        baselines = []
    else:
        baselines = [s.upper() for s in args.baselines]
    print(f"allocopt backends: {', '.join(backends) or 'none'}; gavel-cvxpy baselines: "
          f"{', '.join(baselines) or 'none'}; sizes {args.sizes}; types {args.types}; repeat {args.repeat}; "
          f"seed {args.seed}; --max-seconds {args.max_seconds:g}"
          + (f"; HiGHS options {args.highs_options}" if args.highs_options else ""), flush=True)

    def backend_options(b: str) -> dict[str, Any] | None:
        if b == "highs":
            return dict(args.highs_options) or None
        if b == "cvxpy":
            opts: dict[str, Any] = {"solver": args.cvxpy_solver}
            if args.cvxpy_solver == "HIGHS" and args.highs_options:
                opts["highs_options"] = dict(args.highs_options)  # nested: "solver" is taken by cvxpy
            return opts
        return None

    def baseline_options(s: str) -> dict[str, Any] | None:
        return dict(args.highs_options) if s == "HIGHS" else None

    # Warm up every solver path (imports, first-call costs) on a tiny instance.
    warm = generate_problem(32, 2, args.seed)
    for b in backends:
        if b in available:
            run_allocopt(warm, b, 1, backend_options(b))
    for s in baselines:
        run_gavel_cvxpy(warm, s, 1, baseline_options(s))

    jobs: list[tuple[str, Callable[[allocopt.Problem], Cell]]] = []
    for b in backends:
        if b in missing and b not in available:
            jobs.append((b, lambda prob, b=b: Cell(b, "allocopt", prob.num_jobs, prob.cluster.num_gpu_types,
                                                   status=f"skipped: {missing[b]}")))
        else:
            opts = backend_options(b)
            jobs.append((b, lambda prob, b=b, opts=opts: run_allocopt(prob, b, args.repeat, opts)))
    for s in baselines:
        jobs.append((f"gavel-cvxpy[{s}]", lambda prob, s=s: run_gavel_cvxpy(prob, s, args.repeat,
                                                                             baseline_options(s))))

    cells: list[Cell] = []
    history: dict[str, list[tuple[int, int, float]]] = {}
    for k in sorted(args.types):
        for n in sorted(args.sizes):
            problem = generate_problem(n, k, args.seed)
            group = []
            for name, job in jobs:
                reason = None
                if args.cap_all or name not in UNCAPPED:
                    reason = _budget_skip(name, n, k, history, args.max_seconds)
                if reason:
                    cell = Cell(name, "baseline" if name.startswith("gavel") else "allocopt", n, k, status=reason)
                else:
                    t0 = time.perf_counter()
                    cell = job(problem)
                    per_run = (time.perf_counter() - t0) / (args.repeat if cell.ok else 1)
                    history.setdefault(name, []).append((n, k, per_run))
                group.append(cell)
                msg = (f"  total {cell.total_s:.3f} s, objective {cell.objective:.8f}" if cell.ok else
                       f"  {cell.status}")
                print(f"[{n:>6} x {k}] {name:<20}{msg}", file=sys.stderr, flush=True)
            compare(group, same_solver)
            cells.extend(group)

    targets = evaluate_targets(cells)
    try:
        info["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        pass
    print()
    print("Heterogeneity-aware max-min fairness; times per cell (median of --repeat runs).")
    print("formulate/compile/transfer/solve: see benchmarks/README.md; build/solve = (compile + transfer) / solve "
          "(target a); ovh/solve = (total - solve) / solve;\nspeedup = the same-solver gavel-cvxpy total / this "
          "total; rel.diff = |objective - reference| / |reference| (reference: the same-solver baseline, "
          "else gavel-cvxpy[HIGHS]).")
    print(format_table(cells))
    print()
    print(format_targets(targets))
    if "load_average_at_end" in info:
        print(f"Load average at the end: {info['load_average_at_end']} (other processes on the machine "
              "make times noisy)")
    result = {"benchmark": "max_min_fairness (heterogeneity-aware)", "machine": info,
              "args": {k: v for k, v in vars(args).items() if k not in ("json", "csv", "profile")},
              "backends": backends, "baselines": baselines, "unavailable": missing,
              "cells": [dict(asdict(c), build_s=c.build_s, overhead_s=c.overhead_s) for c in cells],
              "targets": targets}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2, default=_json_default)
        print(f"\nwrote {args.json}")
    if args.csv:
        fields = ["solver", "kind", "n_jobs", "n_gpu_types", "status", "formulate_s", "compile_s", "transfer_s",
                  "solve_s", "total_s", "build_s", "overhead_s", "speedup", "objective", "reference",
                  "objective_rel_diff", "max_violation"]
        with open(args.csv, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            for row in result["cells"]:
                writer.writerow(row)
        print(f"wrote {args.csv}")
    return result


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.profile:
        try:
            n, k = (int(v) for v in args.profile.lower().split("x"))
        except ValueError:
            sys.exit(f"--profile expects NxK, e.g. 16384x8, got {args.profile!r}")
        print(format_machine(machine_info()))
        print(profile_model_building(n, k, args.seed, args.repeat))
        return 0
    run_benchmark(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
