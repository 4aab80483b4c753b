"""Sia's configuration MILP, written as Sia's policy code writes it (cvxpy).

Sia's simulator policy rounds each utility ``goodput ** p`` to 2 decimals, so
many configurations tie, and which of the tied ones a run takes decides later
rounds (a job that stays small explores larger configurations later). Sia's
CBC breaks those ties by its search path, which depends on the exact matrices
it is handed. cvxpy hands a solver the same matrices only for the same
expression tree and the same coefficients, so :func:`sia_utilities` computes
the utility matrix as Sia does (float32 throughout; configurations a job
cannot use keep Sia's goodput of 1e-4, scaled with the job's row; the
re-allocation factor applied to every configuration but the previous one;
rounded to 2 decimals and clipped), and :func:`solve_sia_program` builds Sia's
program around it: a binary (jobs x configurations) matrix variable, the
objective ``sum(w @ (X * A)) + lambda_n * (jobs - sum(X))`` (minimized for
``p < 0``), and the constraints in Sia's order (``X >= 0``, ``X <= 1``, the
GPUs of each type (at most the type's, at least 0), one configuration per job,
then ``X[i, c] == 1`` for each job in checkpoint-restore). :func:`solve_sia_round`
does both for one round, from the goodput matrix, the configurations and the
cluster; :func:`sia_goodput` normalizes raw goodputs as Sia does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from allocopt.backends.cvxpy import require_solver
from allocopt.errors import InvalidOptionError

ZERO_GOODPUT = 1e-4  # Sia's ZERO_ALLOC_GAIN: goodputs at or below it do not count


@dataclass
class SiaProgramResult:
    """One solve of Sia's program.

    configuration : int array (n_jobs,), the chosen configuration per job, -1 for none.
    status : cvxpy's status string ("optimal", ...).
    objective : float or None, the program's value.
    solver, build_s, solve_s : the cvxpy solver used and seconds spent building and solving.
    """

    configuration: np.ndarray
    status: str
    objective: float | None
    solver: str
    build_s: float
    solve_s: float
    options: dict = field(default_factory=dict)


def sia_utilities(goodput: np.ndarray, previous: np.ndarray, realloc_factor: np.ndarray, p: float,
                  decimals: int = 2, clip: float = 3000.0) -> np.ndarray:
    """Sia's utility matrix ``round(G ** p, decimals)`` clipped at ``clip``, in float32 as Sia computes it.

    ``goodput`` (jobs x configurations, float32, normalized, 1e-4 where a job cannot run) is scaled by
    each job's re-allocation factor except at its ``previous`` configuration (-1: none).
    """
    mat = np.array(goodput, dtype=np.float32, copy=True)
    previous = np.asarray(previous, dtype=np.int64)
    rows = np.flatnonzero(previous >= 0)
    keep = mat[rows, previous[rows]]
    # Sia multiplies each float32 row by its factor as a float32 scalar
    mat[rows] *= np.asarray(realloc_factor, dtype=np.float64)[rows].astype(np.float32)[:, None]
    mat[rows, previous[rows]] = keep
    with np.errstate(divide="ignore", over="ignore"):
        utility = np.round(np.power(mat, p), decimals=decimals)
    utility[utility > clip] = clip
    return utility


def sia_goodput(goodput: np.ndarray) -> np.ndarray:
    """Sia's normalized float32 goodput matrix from raw goodputs (jobs x configurations, 0 where a job
    cannot run): each row divided by its smallest goodput above 1e-4 (1 where there is none);
    configurations a job cannot use start at 1e-4 and are scaled with the row; then at least 1e-4."""
    mat = np.asarray(goodput, dtype=np.float32)
    counted = np.where(mat > ZERO_GOODPUT, mat, np.float32(np.inf)).min(axis=1, initial=np.inf)
    smallest = np.where(np.isfinite(counted), counted, np.float32(1.0)).astype(np.float32)
    # Sia: ``scale = 1.0 / smallest`` (a float64), then the float32 row times it in float32
    scale = (1.0 / smallest.astype(np.float64)).astype(np.float32)
    out = np.where(mat > 0, mat, np.float32(ZERO_GOODPUT)) * scale[:, None]
    out[out <= ZERO_GOODPUT] = np.float32(ZERO_GOODPUT)
    return out.astype(np.float32, copy=False)


def solve_sia_round(goodput: np.ndarray, gpu_type: np.ndarray, num_gpus: np.ndarray, capacity: np.ndarray,
                    previous: np.ndarray, pinned: np.ndarray, realloc_factor: np.ndarray, p: float,
                    lambda_n: float, *, decimals: int = 2, clip: float = 3000.0, solver: str = "CBC",
                    mip_gap: float = 1e-4, threads: int = 8) -> SiaProgramResult:
    """One round of Sia's policy as Sia's code solves it: :func:`sia_utilities` of Sia's normalized
    float32 ``goodput`` (jobs x configurations), then :func:`solve_sia_program`.

    ``gpu_type``, ``num_gpus`` : int arrays (n_configurations,), each configuration's GPU type and GPUs;
    ``capacity`` : GPUs of each type; ``previous`` : each job's previous configuration (-1: none);
    ``pinned`` : bool per job, kept at its previous configuration (checkpoint-restore);
    ``realloc_factor`` : each job's re-allocation factor (Pollux's, unclipped, as Sia's).
    """
    previous = np.asarray(previous, dtype=np.int64)
    utility = sia_utilities(goodput, previous, realloc_factor, p, decimals, clip)
    gpu_type = np.asarray(gpu_type, dtype=np.int64)
    reduce_matrix = np.zeros((gpu_type.size, len(capacity)), dtype=np.uint32)
    reduce_matrix[np.arange(gpu_type.size), gpu_type] = np.asarray(num_gpus, dtype=np.uint32)
    kept = [(int(i), int(previous[i])) for i in np.flatnonzero(np.asarray(pinned, dtype=bool))]
    return solve_sia_program(utility, reduce_matrix, np.asarray(capacity, dtype=np.uint32), kept, lambda_n, p < 0,
                             solver=solver, mip_gap=mip_gap, threads=threads)


def solve_sia_program(utility: np.ndarray, reduce_matrix: np.ndarray, total_gpus: np.ndarray,
                      pinned: Sequence[tuple[int, int]], lambda_n: float, minimize: bool, *, solver: str = "CBC",
                      mip_gap: float = 1e-4, threads: int = 8, verbose: bool = False) -> SiaProgramResult:
    """Solve Sia's configuration program with cvxpy's ``solver``.

    Parameters
    ----------
    utility : float32 array (n_jobs, n_configurations), from :func:`sia_utilities`.
    reduce_matrix : uint32 array (n_configurations, n_types), the GPUs of each configuration in its type's column.
    total_gpus : uint32 array (n_types,), the GPUs of each type.
    pinned : (job row, configuration) pairs that must be kept (jobs in checkpoint-restore), in job order.
    lambda_n : float, the cost of leaving a job without GPUs.
    minimize : bool, True for ``p < 0`` (Sia minimizes then).
    solver : str, a cvxpy solver name (Sia: "CBC", which needs cylp).
    mip_gap : float, the relative MIP gap (CBC's ``allowablePercentageGap`` is 100 times it).
    threads : int, CBC's ``numberThreads`` (Sia: 8).
    """
    try:
        import cvxpy as cp
    except ImportError as err:  # pragma: no cover - cvxpy is a dev dependency
        raise InvalidOptionError("Sia's program needs cvxpy: pip install 'allocopt[cvxpy]'") from err
    require_solver(solver, " (CBC needs cylp: pip install cylp)" if solver == "CBC" else "")
    t0 = time.perf_counter()
    n_jobs, n_configs = utility.shape
    weights = np.ones((1, n_jobs), dtype=np.float32)
    x = cp.Variable(shape=utility.shape, integer=True)
    objective = cp.sum(weights @ cp.multiply(x, utility)) + lambda_n * (n_jobs - cp.sum(x))
    used = cp.sum(x @ reduce_matrix, axis=0)
    constraints = [x >= 0, x <= 1, used <= total_gpus, used >= 0,
                   (x @ np.ones((n_configs, 1), dtype=np.uint32)) <= np.ones((n_jobs, 1), dtype=np.uint32)]
    constraints += [x[i, c] == 1 for i, c in pinned]
    program = cp.Problem(cp.Minimize(objective) if minimize else cp.Maximize(objective), constraints=constraints)
    options: dict = {"verbose": verbose}
    if solver == "CBC":
        options.update(numberThreads=threads, allowablePercentageGap=mip_gap * 100)
    t1 = time.perf_counter()
    try:
        program.solve(solver=solver, **options)
        status = program.status
    except cp.error.SolverError as err:
        status = f"solver_error: {err}"
    t2 = time.perf_counter()
    configuration = np.full(n_jobs, -1, dtype=np.int64)
    if x.value is not None:
        chosen = np.round(x.value, decimals=0).astype(np.uint32)
        configuration = np.where(chosen.sum(axis=1) > 0, np.argmax(chosen, axis=1), -1)
    return SiaProgramResult(configuration, status, None if program.value is None else float(program.value),
                            solver, t1 - t0, t2 - t1, options)


__all__ = ["SiaProgramResult", "sia_goodput", "sia_utilities", "solve_sia_program", "solve_sia_round"]
