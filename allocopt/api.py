"""``allocopt.solve``: one entry point for every policy and backend."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from allocopt.allocation import Allocation, Timings
from allocopt.backends import BACKENDS, SolveOptions
from allocopt.errors import InvalidOptionError, UnknownBackendError
from allocopt.formulations import ModelSolver, PolicyResult, get_policy
from allocopt.goodput_problem import GoodputProblem
from allocopt.partitioning import Partitioning, solve_partitioned
from allocopt.problem import Problem
from allocopt.technique import choose, technique_extras
from allocopt.verify import checked

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def _annotations(method: Any) -> dict[str, str]:
    """Parameter name -> its annotation's text, of a policy's ``allocate`` (looked up once)."""
    return {name: str(p.annotation) for name, p in inspect.signature(method).parameters.items()}


def check_policy_options(pol: Any, options: dict[str, Any]) -> None:
    """InvalidOptionError naming the option whose value has the wrong type for ``pol``'s default.

    A flag (bool default) takes only true/false (a mapping too where the policy
    accepts one, e.g. ``column_generation``), a number option a finite number
    (an integer where the default is one), a string option a string.
    """
    hints = _annotations(pol.allocate) if options else {}
    for name, value in options.items():
        default = pol.options.get(name)
        annotation = hints.get(name, "")
        if isinstance(default, bool):
            ok = isinstance(value, (bool, np.bool_)) or ("Mapping" in annotation and isinstance(value, dict))
            expected = "true or false" + (" or an object of options" if "Mapping" in annotation else "")
        elif isinstance(default, int):
            ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            expected = "an integer"
        elif isinstance(default, float):
            ok = (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
                  and bool(np.isfinite(value)))
            expected = "a finite number"
        elif isinstance(default, str):
            ok, expected = isinstance(value, str), "a string"
        else:
            continue
        if not ok:
            raise InvalidOptionError(f"{name} must be {expected} (an option of policy {pol.name!r}), got {value!r}")


def solve(problem: Problem | Any, policy: str | None = None, *, backend: str = "highs",
          time_limit_s: float | None = None, mip_gap: float | None = None,
          threads: int | None = None, verbose: bool = False,
          solver_options: dict[str, Any] | None = None, best_effort: bool = False,
          warm_start: Allocation | None = None, partitions: int | Partitioning = 1,
          technique: str = "auto", **policy_options: Any) -> Allocation:
    """Compute ``policy``'s allocation of ``problem`` with ``backend``.

    Parameters
    ----------
    problem : Problem
    policy : str, optional
        Default ``"max_min_fairness"`` for a Problem and ``"sia"`` for a
        GoodputProblem. A name from ``allocopt.POLICIES``: ``max_min_fairness``,
        ``max_throughput``, ``min_makespan``, ``finish_time_fairness``,
        ``water_filling``, ``isolated``, ``proportional``, ``sia`` (over a
        :class:`~allocopt.GoodputProblem`), ...
    backend : {"highs", "gurobi", "pulp", "cvxpy", "scipy", "auto"}, default "highs"
        Solver backend; ``auto`` takes Gurobi when installed and licensed for
        the model, else HiGHS.
    time_limit_s : float, optional
        Solver wall-clock limit per solve, in seconds.
    mip_gap : float, optional
        Relative gap at which a MILP solve stops.
    threads : int, optional
        Solver threads.
    verbose : bool, default False
        Print the solver log.
    solver_options : dict, optional
        Passed verbatim to the solver under its own option names (for the
        cvxpy backend, ``{"solver": "CLARABEL"}`` picks cvxpy's solver).
    best_effort : bool, default False
        Return non-optimal results (e.g. a time-limited incumbent, or
        deadlines relaxed) as an Allocation whose ``status`` says so, instead
        of raising a :class:`~allocopt.errors.NotOptimalError`.
    warm_start : Allocation, optional
        An earlier allocation of the same policy on a similar problem (jobs
        matched by id): its final simplex bases start this solve's LPs on the
        ``highs`` and ``gurobi`` backends, which then need a few pivots where
        a cold solve needs thousands. Same optimum either way; other backends,
        and ``water_filling`` (whose LPs change as jobs freeze), solve from scratch.
    partitions : int or Partitioning, default 1
        ``k >= 2`` splits jobs and GPUs into ``k`` random sub-problems solved
        in parallel processes (POP; :mod:`allocopt.partitioning`): much faster
        on large problems, approximate (``status`` is ``APPROXIMATE``). A
        :class:`~allocopt.partitioning.Partitioning` sets the seed, Ray, and
        a comparison with the exact optimum.
    technique : str, default "auto"
        How the policy's model is solved exactly (:mod:`allocopt.technique`):
        ``auto`` picks from cheap statistics of the problem (job types,
        size, contention, a closed form certified by its dual bound);
        ``plain``, ``closed_form``, ``aggregate_job_types``,
        ``price_decomposition``, ``column_generation`` (max-min fairness,
        max throughput; ``plain`` and ``aggregate_job_types`` also
        water-filling), ``relaxation_first``, ``whole_milp``,
        ``dynamic_programming`` (sia) force one. ``Allocation.extras["technique"]`` and ``["technique_reason"]``
        say which was used and why.
    **policy_options
        Options of the policy (e.g. ``heterogeneity_aware=False``).

    Returns
    -------
    Allocation
        (or the policy's own result type for policies over other problem
        types, e.g. configurations for ``sia``)

    Raises
    ------
    InvalidOptionError, UnknownPolicyError, UnknownBackendError
        For unknown names or out-of-range options.
    BackendNotInstalledError
        When the backend's package is missing (the message names the extra).
    NotOptimalError
        (``InfeasibleError``, ``UnboundedError``, ``TimeLimitError``) when the
        solve did not prove optimality and ``best_effort`` is False; also when
        the answer fails its check (:mod:`allocopt.verify`: feasibility and
        the objective recomputed from the allocation).

    Examples
    --------
    >>> import allocopt
    >>> cluster = allocopt.Cluster({"v100": 1, "k80": 1})
    >>> problem = allocopt.Problem([[40, 10], [12, 4], [100, 50]], cluster)
    >>> alloc = allocopt.solve(problem, "max_min_fairness")
    >>> round(alloc.objective, 6)  # every job gets 8/11 of its proportional throughput
    0.727273
    """
    t0 = time.perf_counter()
    if policy is None:
        policy = "sia" if isinstance(problem, GoodputProblem) else \
            "pollux" if type(problem).__name__ == "PolluxProblem" else "max_min_fairness"
    pol = get_policy(policy)
    if not isinstance(problem, pol.problem_type):
        raise InvalidOptionError(f"policy {policy!r} expects an allocopt.{pol.problem_type.__name__}, got "
                                 f"{type(problem).__name__}; build one with allocopt.{pol.problem_type.__name__}(...)")
    if backend != "auto" and backend not in BACKENDS:
        raise UnknownBackendError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)} or 'auto'")
    unknown = sorted(set(policy_options) - set(pol.options))
    if unknown:
        allowed = ", ".join(sorted(pol.options)) or "none"
        common = ", ".join(p for p in inspect.signature(solve).parameters if p not in ("problem", "policy", "policy_options"))
        raise InvalidOptionError(f"policy {policy!r} has no option(s) {unknown}; its options: {allowed}; "
                                 f"options of every policy: {common}")
    check_policy_options(pol, policy_options)
    if solver_options is not None and not isinstance(solver_options, Mapping):
        raise InvalidOptionError(f"solver_options must be an object of the solver's own option names to values, "
                                 f"got {solver_options!r}")
    if not isinstance(best_effort, (bool, np.bool_)):
        raise InvalidOptionError(f"best_effort must be true or false, got {best_effort!r}")
    if warm_start is not None and (not isinstance(warm_start, Allocation) or warm_start.policy != pol.name):
        raise InvalidOptionError(f"warm_start must be an Allocation returned by allocopt.solve with policy "
                                 f"{pol.name!r}; got {type(warm_start).__name__}"
                                 + (f" of policy {warm_start.policy!r}" if isinstance(warm_start, Allocation) else ""))
    if not isinstance(partitions, Partitioning) and partitions != 1:
        partitions = Partitioning(partitions)
    if isinstance(partitions, Partitioning):
        if warm_start is not None:
            raise InvalidOptionError("warm_start and partitions exclude each other: partitions are drawn anew")
        return solve_partitioned(problem, pol.name, partitions, dict(
            backend=backend, time_limit_s=time_limit_s, mip_gap=mip_gap, threads=threads, verbose=verbose,
            solver_options=solver_options, best_effort=best_effort, technique=technique), policy_options, solve)
    options = {**pol.options, **policy_options}
    choice = choose(problem, pol.name, options, policy_options, technique, warm_start)
    options.update(choice.options)
    solver = ModelSolver(backend, SolveOptions(time_limit_s=time_limit_s, mip_gap=mip_gap, threads=threads,
                                               verbose=verbose, solver_options=dict(solver_options or {})),
                         best_effort=best_effort,
                         warm_start=warm_start.warm_start if warm_start and pol.warm_starts else None,
                         job_ids=problem.job_ids)
    if problem.num_jobs == 0:
        result = PolicyResult(np.zeros((0, problem.cluster.num_gpu_types)), None, message="No jobs to allocate.")
    elif choice.result is not None:
        result = choice.result
    else:
        started = time.perf_counter()
        result = pol.allocate(problem, solver, **options)
        # formulating the models happens inside allocate: everything there but the solver counts
        solver.model_build_s = time.perf_counter() - started - solver.solver_build_s - solver.solve_s
    result.extras = {**result.extras, **technique_extras(choice, result.extras)}
    for array in (result.matrix, result.pair_matrix):
        if array is not None:
            array.setflags(write=False)
    timings = Timings(model_build_s=solver.model_build_s, solver_build_s=solver.solver_build_s,
                      solve_s=solver.solve_s, total_s=time.perf_counter() - t0, num_solves=solver.num_solves)
    allocation = pol.to_allocation(problem, result, backend=solver.backend_used if solver.num_solves else None,
                                   timings=timings)
    if isinstance(allocation, Allocation):
        allocation = dataclasses.replace(allocation, warm_start=solver.warm_start_out(allocation.matrix)
                                         if pol.warm_starts else None)
        allocation = checked(allocation, options, best_effort)
        if not allocation.success:  # best_effort: the caller gets it, the log says it is not optimal
            logger.warning("%s: %s", allocation.status.value, allocation.message)
    return allocation
