"""Every answer checked before it is called optimal.

After a solve, :func:`checked` recomputes from the returned allocation, in the
problem's own units, that it satisfies the base constraints (time fractions
>= 0, a job's time <= 1, GPUs in use <= capacity, nothing on a type a job
cannot run on) and, for the policies whose objective is a function of the
allocation alone, that the objective the policy reports is the one the
allocation attains. An answer that fails is not returned as optimal: it
raises :class:`~allocopt.errors.NotOptimalError`, or with ``best_effort`` comes
back with status ``approximate`` (feasible, objective not confirmed) or
``error`` (infeasible) and a message that says what disagreed.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from allocopt.allocation import Allocation
from allocopt.errors import NotOptimalError
from allocopt.solution import Status

logger = logging.getLogger(__name__)

#: Policies whose answer is a per-job reference share, not a schedule of all jobs (not checked).
REFERENCE_SHARES = ("proportional",)
FEASIBILITY_TOL = 1e-6  # time fractions, and GPUs relative to the capacity (at least 1)
OBJECTIVE_RTOL = 1e-6  # reported and recomputed objectives, relative to the larger


def infeasibility(allocation: Allocation) -> str | None:
    """A sentence naming the first base constraint the allocation breaks, or None."""
    problem, X = allocation.problem, allocation.matrix
    if not np.isfinite(X).all() or (allocation.pair_matrix is not None and not np.isfinite(allocation.pair_matrix).all()):
        return "the allocation holds NaN or infinite time fractions"
    if (X < -FEASIBILITY_TOL).any() or (allocation.pair_matrix is not None
                                        and (allocation.pair_matrix < -FEASIBILITY_TOL).any()):
        return "a time fraction is negative"
    ids = problem.job_ids
    wrong = np.flatnonzero((X * ~problem.runnable).max(axis=1, initial=0.0) > FEASIBILITY_TOL)
    if wrong.size:
        return f"job {ids[wrong[0]]!r} has time on a GPU type it cannot run on"
    time = allocation.time_fraction
    over = np.flatnonzero(time > 1.0 + FEASIBILITY_TOL)
    if over.size:
        return f"job {ids[over[0]]!r} gets {time[over[0]]:.9g} of its time (more than all of it)"
    used, capacity = allocation.gpus_used, problem.capacity
    full = np.flatnonzero(used > capacity + FEASIBILITY_TOL * np.maximum(capacity, 1))
    if full.size:
        j = full[0]
        return f"{used[j]:.9g} GPUs of type {problem.gpu_types[j]!r} are in use, more than its {capacity[j]}"
    return None


def attained_objective(allocation: Allocation, options: Mapping[str, Any]) -> float | None:
    """The objective the allocation attains under its policy and ``options``, or None for the
    policies whose objective is not a function of the allocation alone."""
    problem, policy = allocation.problem, allocation.policy
    if policy in ("max_min_fairness", "water_filling"):
        if options.get("heterogeneity_aware", True):
            normalized = allocation.normalized_throughput * problem.scale_factors
        else:
            normalized = allocation.time_fraction * problem.scale_factors
        if policy == "water_filling":
            from allocopt.formulations.water_filling import first_level

            return first_level(problem, normalized, options.get("entity_policies"))
        return float((normalized / problem.priority_weights).min())
    if policy == "min_makespan" and options.get("heterogeneity_aware", True):
        steps = problem.num_steps_remaining
        with np.errstate(divide="ignore"):
            return float(np.max(steps[steps > 0] / allocation.effective_throughput[steps > 0], initial=0.0))
    if policy == "max_throughput" and "deadline_met" not in allocation.extras:  # not the relaxed model
        if not options.get("normalize_by_cost"):
            return float(allocation.effective_throughput.sum())
        steps = (problem.throughputs / problem.costs * allocation.matrix).sum()
        if allocation.pair_matrix is not None:
            steps += (problem.pair_throughput_array.sum(axis=2) / problem.costs * allocation.pair_matrix).sum()
        return float(steps)
    return None


def checked(allocation: Allocation, options: Mapping[str, Any], best_effort: bool) -> Allocation:
    """``allocation`` if it is feasible and, when optimal, attains its objective (see the module
    docstring); otherwise raise, or with ``best_effort`` return it with a non-optimal status."""
    if allocation.problem.num_jobs == 0 or allocation.policy in REFERENCE_SHARES:
        return allocation
    fault = infeasibility(allocation)
    status = Status.ERROR
    if fault is None and allocation.status is Status.OPTIMAL and allocation.objective is not None:
        if not np.isfinite(allocation.objective):
            fault, status = f"the objective is {allocation.objective}", Status.APPROXIMATE
    if fault is None and allocation.status is Status.OPTIMAL and allocation.objective is not None:
        attained = attained_objective(allocation, options)
        reported = allocation.objective
        gap = abs(attained - reported) / max(abs(attained), abs(reported), 1e-300) if attained is not None else 0.0
        if gap > OBJECTIVE_RTOL:
            fault = (f"the reported objective {reported:.12g} is not the {attained:.12g} the allocation attains "
                     f"(relative difference {gap:.2g})")
            status = Status.APPROXIMATE
    if fault is None:
        return allocation
    message = (f"{allocation.policy} on backend {allocation.backend}: the answer failed its check: {fault}. "
               "Try another backend.")
    if not best_effort:
        raise NotOptimalError(message, status=status)
    logger.warning("%s", message)
    return dataclasses.replace(allocation, status=status, message=message)
