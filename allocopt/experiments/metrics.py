"""The metrics of one run that researchers report, derived from a :class:`~allocopt.mechanism.simulator.SimulationResult`."""

from __future__ import annotations

from typing import Any

import numpy as np

from allocopt.mechanism.simulator import SimulationResult

#: Metric columns of a sweep's table, in order. Job-level metrics are over the measurement window; times in
#: seconds, GPU-hours in hours. ``queueing_delay_s`` is a job's time in the system without its GPUs:
#: JCT minus GPU-seconds over GPUs requested (time waiting before its first lease and between leases).
#: ``gpu_hours_by_type`` maps each GPU type to the GPU-hours leased of it over the whole run (all jobs; a GPU
#: shared by co-located jobs counted once).
#: ``tenant_average_jct_s``, ``tenant_gpu_hours`` and ``tenant_average_ftf`` map each tenant to its jobs' mean JCT,
#: GPU-hours and mean FTF over the window (None where the jobs name no tenant;
#: :mod:`allocopt.mechanism.tenants`).
METRICS: tuple[str, ...] = (
    "num_jobs", "num_measured", "average_jct_s", "median_jct_s", "p95_jct_s", "p99_jct_s", "makespan_s",
    "average_queueing_delay_s", "median_queueing_delay_s", "p99_queueing_delay_s",
    "average_ftf", "median_ftf", "p95_ftf", "p99_ftf", "max_ftf", "unfair_fraction",
    "gpu_hours_total", "gpu_hours_per_job", "gpu_hours_by_type", "restarts_total", "restarts_per_job", "utilization",
    "average_jobs_in_system", "num_rounds", "num_solves", "solve_s_per_round", "solve_s_total", "wall_s",
    "tenant_average_jct_s", "tenant_gpu_hours", "tenant_average_ftf")


def run_metrics(result: SimulationResult) -> dict[str, Any]:
    """:data:`METRICS` of one simulation (FTF metrics None where the run skipped the FTF companion)."""
    m, jobs = result.metrics, result.jobs
    a, b = m["window"]
    jct = np.asarray(jobs["jct_s"], dtype=np.float64)[a:b]
    gpu_s = np.asarray(jobs["gpu_hours"], dtype=np.float64)[a:b] * 3600
    scale = np.asarray(jobs["scale_factor"], dtype=np.float64)[a:b]
    waiting = np.maximum(jct - gpu_s / scale, 0.0)
    restarts = np.asarray(jobs["restarts"], dtype=np.float64)[a:b]
    out: dict[str, Any] = {
        "num_jobs": int(m["num_jobs"]), "num_measured": int(b - a),
        "average_jct_s": float(jct.mean()), "median_jct_s": float(np.median(jct)),
        "p95_jct_s": float(np.percentile(jct, 95)), "p99_jct_s": float(np.percentile(jct, 99)),
        "makespan_s": float(m["makespan_s"]),
        "average_queueing_delay_s": float(waiting.mean()), "median_queueing_delay_s": float(np.median(waiting)),
        "p99_queueing_delay_s": float(np.percentile(waiting, 99)),
        "gpu_hours_total": float(gpu_s.sum() / 3600), "gpu_hours_per_job": float(m["gpu_hours_per_job"]),
        "gpu_hours_by_type": dict(m["gpu_hours_by_type"]),
        "restarts_total": int(restarts.sum()), "restarts_per_job": float(m["restarts_per_job"]),
        "utilization": float(m["utilization"]), "average_jobs_in_system": _jobs_in_system(jobs),
        "num_rounds": int(m["num_rounds"]), "num_solves": int(m["num_solves"]),
        "solve_s_per_round": float(m["solve_s_per_round"]), "solve_s_total": float(m["solve_s_total"]),
        "wall_s": float(m["wall_s"]),
    }
    if "ftf" in jobs and "average_ftf" in m:
        ftf = np.asarray(jobs["ftf"], dtype=np.float64)[a:b]
        out.update(average_ftf=float(m["average_ftf"]), median_ftf=float(np.median(ftf)),
                   p95_ftf=float(np.percentile(ftf, 95)), p99_ftf=float(np.percentile(ftf, 99)),
                   max_ftf=float(m["max_ftf"]), unfair_fraction=float(m["unfair_fraction"]))
    tenants = m.get("tenants")
    if tenants:
        out.update(tenant_average_jct_s={t: v["average_jct_s"] for t, v in tenants.items()},
                   tenant_gpu_hours={t: v["gpu_hours"] for t, v in tenants.items()})
        if all("average_ftf" in v for v in tenants.values()):
            out["tenant_average_ftf"] = {t: v["average_ftf"] for t, v in tenants.items()}
    return {name: out.get(name) for name in METRICS}


def _jobs_in_system(jobs: dict[str, np.ndarray]) -> float:
    """Time-averaged number of jobs arrived and not finished, from the first arrival to the last finish."""
    arrival, finish = np.asarray(jobs["arrival_s"], float), np.asarray(jobs["finish_s"], float)
    span = finish.max() - arrival.min()
    return float((finish - arrival).sum() / span) if span > 0 else 0.0


def queue_length(jobs: dict[str, np.ndarray], times_s: np.ndarray) -> np.ndarray:
    """Jobs arrived by and not finished at each of ``times_s`` (seconds), shape like ``times_s``."""
    arrived = np.searchsorted(np.sort(np.asarray(jobs["arrival_s"], float)), times_s, side="right")
    finished = np.searchsorted(np.sort(np.asarray(jobs["finish_s"], float)), times_s, side="right")
    return arrived - finished


__all__ = ["METRICS", "queue_length", "run_metrics"]
