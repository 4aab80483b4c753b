"""POP-style partitioning: approximate, opt-in, for allocations too large to solve whole.

Jobs are split at random into ``k`` groups and every GPU type's GPUs as evenly
as possible into ``k`` shares; each group is allocated on its share
independently (in worker processes, or Ray tasks) and the allocations are
stacked. The result is feasible for the whole problem, but only optimal per
partition, so its status is ``APPROXIMATE`` (or the first non-optimal status a
partition returned under ``best_effort``). Its objective is the policy's,
evaluated on the stacked allocation over the whole problem; with
``compare_exact=True`` the whole problem is solved too and
``extras["objective_ratio"]`` says how close it came (1.0 = optimal, below 1 =
worse). Supported: max-min fairness, max throughput and min makespan
(:data:`OBJECTIVES`).

Narayanan et al., "Solving Large-Scale Granular Resource Allocation Problems
Efficiently with POP", SOSP 2021.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from allocopt.allocation import Allocation, Timings
from allocopt.cluster import Cluster
from allocopt.errors import InvalidOptionError
from allocopt.problem import Problem
from allocopt.solution import Status

def _min_normalized(allocation: Allocation, options: dict[str, Any]) -> float:
    problem = allocation.problem
    scale = problem.scale_factors / problem.priority_weights
    if options.get("heterogeneity_aware", True):
        return float((allocation.effective_throughput * scale / problem.proportional_throughputs).min())
    return float((allocation.time_fraction * scale).min())


def _total_throughput(allocation: Allocation, options: dict[str, Any]) -> float:
    return float(allocation.effective_throughput.sum())


def _makespan(allocation: Allocation, options: dict[str, Any]) -> float:
    steps = allocation.problem.num_steps_remaining
    active = steps > 0
    return float((steps[active] / allocation.effective_throughput[active]).max(initial=0.0))


# The policies partitioning supports: the objective of a (stacked) allocation, whether larger is
# better, and the options under which that objective is the policy's own.
OBJECTIVES = {
    "max_min_fairness": (_min_normalized, "max", {"heterogeneity_aware", "space_sharing"}),
    "max_throughput": (_total_throughput, "max", {"space_sharing"}),
    "min_makespan": (_makespan, "min", {"space_sharing"}),
}


@dataclass(frozen=True)
class Partitioning:
    """How :func:`allocopt.solve` partitions a problem (``partitions=``).

    Attributes
    ----------
    num_partitions : int
        ``k``, at least 2.
    seed : int
        Seed of the random split of the jobs.
    parallel : {"process", "ray", "none"}
        Solve partitions in worker processes, as Ray tasks (``ray`` installed;
        joins the running Ray instance or starts a local one), or one after
        another in this process.
    workers : int or None
        Worker processes (``parallel="process"``); default ``min(k, CPUs)``.
    compare_exact : bool
        Also solve the whole problem and report ``objective_ratio``.
    """

    num_partitions: int
    seed: int = 0
    parallel: Literal["process", "ray", "none"] = "process"
    workers: int | None = None
    compare_exact: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.num_partitions, (int, np.integer)) or self.num_partitions < 2:
            raise InvalidOptionError(f"partitions must be an integer >= 2 (1 solves the whole problem), "
                                     f"got {self.num_partitions!r}")
        if self.parallel not in ("process", "ray", "none"):
            raise InvalidOptionError(f"parallel must be 'process', 'ray' or 'none', got {self.parallel!r}")
        if self.workers is not None and (not isinstance(self.workers, (int, np.integer)) or self.workers < 1):
            raise InvalidOptionError(f"workers must be a positive integer, got {self.workers!r}")


def split_capacity(capacity: np.ndarray, k: int) -> np.ndarray:
    """GPUs of each type per partition, shape (k, n_gpu_types): ``c // k`` each,
    the remainders dealt round-robin starting where the previous type's ended,
    so partitions' totals differ by at most one GPU."""
    capacity = np.asarray(capacity, dtype=np.int64)
    remainder = capacity % k
    start = np.concatenate(([0], np.cumsum(remainder)[:-1])) % k
    extra = (np.arange(k)[:, None] - start[None, :]) % k < remainder[None, :]
    return capacity[None, :] // k + extra


def solve_partitioned(problem: Problem, policy: str, partitioning: Partitioning, solve_options: dict[str, Any],
                      policy_options: dict[str, Any], solve: Callable[..., Allocation]) -> Allocation:
    """The stacked allocation of ``partitioning``'s sub-problems (see the module docstring), each
    solved by ``solve`` (:func:`allocopt.solve`, passed in so that this module does not import it).

    Raises
    ------
    InvalidOptionError
        For a policy or option partitioning does not support (:data:`OBJECTIVES`),
        fewer jobs than partitions, or a job that fits no partition's share of
        any type it can run on.
    """
    if policy not in OBJECTIVES:
        raise InvalidOptionError(f"partitions= supports the policies {', '.join(OBJECTIVES)}; got {policy!r}")
    evaluate, sense, allowed = OBJECTIVES[policy]
    unsupported = sorted(key for key, value in policy_options.items() if key not in allowed and value)
    if unsupported:
        raise InvalidOptionError(f"partitions= with {policy!r} supports the options {sorted(allowed)}; "
                                 f"solve without partitions for {unsupported}")
    if problem.num_jobs < partitioning.num_partitions:
        raise InvalidOptionError(f"partitions={partitioning.num_partitions} needs at least as many jobs; the "
                                 f"problem has {problem.num_jobs}")
    t0 = time.perf_counter()
    k = int(partitioning.num_partitions)
    shares = split_capacity(problem.capacity, k)
    fits = (problem.throughputs > 0) & (problem.scale_factors[:, None] <= shares.min(axis=0)[None, :])
    if not fits.any(axis=1).all():
        job = problem.job_ids[int(np.flatnonzero(~fits.any(axis=1))[0])]
        raise InvalidOptionError(f"with partitions={k}, job {job!r} (scale_factor "
                                 f"{problem.scale_factors[problem.job_index(job)]}) fits no partition's share of "
                                 f"the GPU types it runs on ({dict(zip(problem.gpu_types, shares.min(axis=0).tolist()))}"
                                 " GPUs each); use fewer partitions")
    groups = np.array_split(np.random.default_rng(partitioning.seed).permutation(problem.num_jobs), k)
    groups = [np.sort(g) for g in groups]  # none is empty: there are at least k jobs
    gpus_per_node = dict(zip(problem.gpu_types, problem.cluster.gpus_per_node.tolist()))
    subproblems = [problem.subset(rows, Cluster(dict(zip(problem.gpu_types, share.tolist())), gpus_per_node))
                   for rows, share in zip(groups, shares)]
    results = _run(solve, subproblems, policy, {**solve_options, **policy_options}, partitioning)

    X = np.zeros_like(problem.throughputs)
    P = None if problem.pairs is None or results[0]["pair_matrix"] is None else np.zeros(
        problem.pair_throughput_array.shape[:2])
    for rows, result in zip(groups, results):
        X[rows] = result["matrix"]
        if P is not None:
            P[problem.pairs_within(rows)] = result["pair_matrix"]
    statuses = [r["status"] for r in results]
    worst = next((status for status in statuses if status is not Status.OPTIMAL), Status.APPROXIMATE)
    allocation = Allocation(problem=problem, matrix=X, policy=policy, backend=results[0]["backend"],
                            status=worst, objective=None, message="", pair_matrix=P)
    objective = evaluate(allocation, policy_options) if worst is Status.APPROXIMATE else None
    extras: dict[str, Any] = {"num_partitions": k, "partition_objectives": [r["objective"] for r in results],
                              "partition_statuses": [str(status) for status in statuses],
                              "partition_solve_s": [r["total_s"] for r in results]}
    if partitioning.compare_exact:
        exact = solve(problem, policy, **solve_options, **policy_options).objective
        extras["exact_objective"] = exact
        if objective is not None and exact:
            extras["objective_ratio"] = objective / exact if sense == "max" else exact / objective
    timings = Timings(model_build_s=sum(r["model_build_s"] for r in results),
                      solver_build_s=sum(r["solver_build_s"] for r in results),
                      solve_s=sum(r["solve_s"] for r in results), total_s=time.perf_counter() - t0,
                      num_solves=sum(r["num_solves"] for r in results))
    message = (f"POP partitioning into {k}: each partition solved to optimality; the whole allocation is "
               "feasible but approximate." if worst is Status.APPROXIMATE else
               f"POP partitioning into {k}: partition {statuses.index(worst)} ended {worst} (best_effort): "
               f"{results[statuses.index(worst)]['message']}")
    return dataclasses.replace(allocation, objective=objective, message=message, timings=timings, extras=extras)


def _solve_one(solve: Callable[..., Allocation], problem: Problem, policy: str,
               solve_options: dict[str, Any]) -> dict[str, Any]:
    """One partition's result as plain arrays and numbers (what crosses a process boundary)."""
    allocation = solve(problem, policy, **solve_options)
    timings = allocation.timings
    return {"matrix": allocation.matrix, "pair_matrix": allocation.pair_matrix, "objective": allocation.objective,
            "status": allocation.status, "message": allocation.message,
            "backend": allocation.backend, "model_build_s": timings.model_build_s,
            "solver_build_s": timings.solver_build_s, "solve_s": timings.solve_s, "total_s": timings.total_s,
            "num_solves": timings.num_solves}


def _run(solve: Callable[..., Allocation], problems: list[Problem], policy: str, solve_options: dict[str, Any],
         partitioning: Partitioning) -> list[dict[str, Any]]:
    if partitioning.parallel == "none":
        return [_solve_one(solve, p, policy, solve_options) for p in problems]
    if partitioning.parallel == "ray":
        try:
            import ray
        except ImportError:
            raise InvalidOptionError("parallel='ray' needs Ray: pip install 'allocopt[ray]'") from None
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        remote = ray.remote(_solve_one)
        return ray.get([remote.remote(solve, p, policy, solve_options) for p in problems])
    workers = partitioning.workers or min(len(problems), os.cpu_count() or 1)
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers) as pool:
        n = len(problems)
        return list(pool.map(_solve_one, [solve] * n, problems, [policy] * n, [solve_options] * n))
