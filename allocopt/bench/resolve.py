"""The re-solve target: after a change, a warm-started solve against a cold one, for every LP policy.

The instance is :func:`~allocopt.bench.instances.random_problem` (2,048 jobs,
8 types, plus a few held back). Events, each applied to a solved problem:

``arrival``
    one more job;
``departure``
    one job leaves;
``throughput``
    5% of the jobs get new throughputs (times a log-normal factor, sigma 0.2);
``capacity``
    one GPU type gains 10% GPUs.

Per policy and event: ``allocopt.solve(after, warm_start=previous)`` (with the
default technique: max-min fairness prices the GPU types from the previous
solve's capacity duals, the others start the simplex from its basis, and min
makespan and finish-time fairness first check whether the previous allocation
still attains their per-job lower bound) against a cold solve of the same
problem with the plain LP, and the cold solve with the default technique for
reference; all on highs, same run.
Ratio: cold plain over warm, medians over the repetitions; the target is
``>= 10``.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from allocopt.bench.instances import random_problem
from allocopt.cluster import Cluster
from allocopt.problem import Problem

RESOLVE_TARGET = {"name": "warm re-solve after a change, 2,048 jobs, 8 types (>= 10x faster than cold)",
                  "policy": "max_min_fairness", "kind": "random", "n_jobs": 2048, "n_gpu_types": 8,
                  "min_ratio": 10.0}
EVENTS = ("arrival", "departure", "throughput", "capacity")
LP_POLICIES = ("max_min_fairness", "max_throughput", "min_makespan", "finish_time_fairness")


def _with(problem: Problem, *, throughputs: np.ndarray | None = None, cluster: Cluster | None = None) -> Problem:
    """``problem`` with new throughputs or a new cluster (same jobs and ids)."""
    return Problem(problem.throughputs if throughputs is None else throughputs,
                   problem.cluster if cluster is None else cluster, job_ids=problem.job_ids,
                   scale_factors=problem.scale_factors, priority_weights=problem.priority_weights,
                   num_steps_remaining=problem.num_steps_remaining, time_since_start=problem.time_since_start)


def event_pair(full: Problem, n_jobs: int, event: str, repetition: int) -> tuple[Problem, Problem]:
    """(before, after) of ``event`` on the first ``n_jobs`` jobs of ``full`` (seeded by ``repetition``)."""
    rng = np.random.default_rng([repetition, EVENTS.index(event)])
    base = full.subset(range(n_jobs))
    if event == "arrival":
        return base, full.subset([*range(n_jobs), n_jobs + repetition])
    if event == "departure":
        return base, full.subset(np.delete(np.arange(n_jobs), rng.integers(n_jobs)))
    if event == "throughput":
        changed = rng.choice(n_jobs, size=max(1, n_jobs // 20), replace=False)
        T = base.throughputs.copy()
        T[changed] *= np.exp(rng.normal(0.0, 0.2, (changed.size, T.shape[1])))
        return base, _with(base, throughputs=T)
    j = int(rng.integers(base.cluster.num_gpu_types))
    gpus = dict(zip(base.gpu_types, base.capacity.tolist()))
    gpus[base.gpu_types[j]] = int(np.ceil(gpus[base.gpu_types[j]] * 1.1))
    return base, _with(base, cluster=Cluster(gpus))


def run_resolve_target(*, n_jobs: int = 2048, n_gpu_types: int = 8, repetitions: int = 3, seed: int = 0,
                       policies: tuple[str, ...] = LP_POLICIES, events: tuple[str, ...] = EVENTS
                       ) -> list[dict[str, Any]]:
    """One row per (policy, event): median warm and cold seconds, their ratio, the largest relative
    objective difference, and ``met`` (ratio >= 10)."""
    from allocopt.api import solve
    from allocopt.technique import TECHNIQUES

    full = random_problem(n_jobs + repetitions, n_gpu_types, seed)
    rows = []
    for policy in policies:
        plain = {"technique": "plain"} if policy in TECHNIQUES["plain"] else {}
        for event in events:
            warm_s, cold_s, auto_s, diff = [], [], [], 0.0
            for repetition in range(repetitions):
                before, after = event_pair(full, n_jobs, event, repetition)
                previous = solve(before, policy, **plain)
                warm = solve(after, policy, warm_start=previous)
                cold = solve(after, policy, **plain)
                auto = solve(after, policy)
                warm_s.append(warm.timings.total_s)
                cold_s.append(cold.timings.total_s)
                auto_s.append(auto.timings.total_s)
                diff = max(diff, abs(warm.objective - cold.objective) / max(abs(cold.objective), 1e-12))
            warm_median, cold_median = statistics.median(warm_s), statistics.median(cold_s)
            ratio = cold_median / warm_median
            rows.append({**RESOLVE_TARGET, "name": f"warm re-solve, {policy}, {event}", "policy": policy,
                         "event": event, "n_jobs": n_jobs, "n_gpu_types": n_gpu_types, "limit_s": None,
                         "technique": "warm_start", "total_s": warm_median, "baseline": "cold allocopt.solve (plain)",
                         "baseline_status": "ok", "baseline_total_s": cold_median, "ratio": ratio,
                         "cold_auto_s": statistics.median(auto_s), "objective_rel_diff": diff,
                         "met": ratio >= RESOLVE_TARGET["min_ratio"], "repetitions": repetitions,
                         "techniques": {}, "exclude": {}})
    return rows
