"""Issue 7's re-solve target: after one job arrives, a warm-started solve against a cold one.

The instance is :func:`~allocopt.bench.instances.random_problem` with its last
job held back; each event solves the jobs before it, then adds the job and
times ``allocopt.solve(..., warm_start=previous)`` against a cold solve of the
same problem (both on highs, same run). The ratio is cold over warm, medians
over the events; the target is ``>= 5``.
"""

from __future__ import annotations

import statistics
from typing import Any

from allocopt.bench.instances import random_problem

RESOLVE_TARGET = {"name": "re-solve after one job arrives, 2,048 jobs, 8 types (>= 5x faster than cold)",
                  "policy": "max_min_fairness", "kind": "random", "n_jobs": 2048, "n_gpu_types": 8,
                  "min_ratio": 5.0}


def run_resolve_target(*, n_jobs: int = 2048, n_gpu_types: int = 8, events: int = 5, seed: int = 0,
                       policies: tuple[str, ...] = ("max_min_fairness", "max_throughput", "min_makespan")
                       ) -> list[dict[str, Any]]:
    """One row per policy: median warm and cold seconds over ``events`` arrivals, their ratio,
    the largest relative objective difference, and ``met`` (ratio >= 5; max-min fairness is the target)."""
    from allocopt.api import solve

    full = random_problem(n_jobs + events, n_gpu_types, seed)
    rows = []
    for policy in policies:
        warm_s, cold_s, diff = [], [], 0.0
        for event in range(events):
            before = full.subset(range(n_jobs + event - 1))
            after = full.subset(range(n_jobs + event))
            previous = solve(before, policy)
            warm = solve(after, policy, warm_start=previous)
            cold = solve(after, policy)
            warm_s.append(warm.timings.total_s)
            cold_s.append(cold.timings.total_s)
            diff = max(diff, abs(warm.objective - cold.objective) / max(abs(cold.objective), 1e-12))
        warm_median, cold_median = statistics.median(warm_s), statistics.median(cold_s)
        ratio = cold_median / warm_median
        rows.append({**RESOLVE_TARGET, "name": RESOLVE_TARGET["name"].replace("after", f"({policy}) after"),
                     "policy": policy, "n_jobs": n_jobs, "n_gpu_types": n_gpu_types, "limit_s": None,
                     "technique": "warm_start", "total_s": warm_median, "baseline": "cold allocopt.solve",
                     "baseline_status": "ok", "baseline_total_s": cold_median, "ratio": ratio,
                     "objective_rel_diff": diff, "met": ratio >= RESOLVE_TARGET["min_ratio"], "events": events,
                     "techniques": {}, "exclude": {}})
    return rows
