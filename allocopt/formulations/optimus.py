"""Optimus: workers given greedily by the marginal reduction of remaining time
(Peng et al., "Optimus: An Efficient Dynamic Resource Scheduler for Deep
Learning Clusters", EuroSys 2018).

Over a :class:`~allocopt.goodput_problem.GoodputProblem`: job ``i`` has
``R_i`` units of work left (``remaining``, in the unit of its goodput times
seconds, e.g. samples) and runs at goodput ``E[i, c]`` in configuration ``c``:
the problem's goodput, times the job's restart factor outside its previous
configuration. Its estimated remaining time there is ``t[i, c] = R_i / E[i, c]``
seconds. Optimus's allocation, applied exactly:

1. pinned jobs keep their previous configuration;
2. the other jobs, shortest estimated remaining time first (at their fewest
   GPUs), each take the configuration with their fewest GPUs (of the type where
   it is fastest, among types with room) while some type has room -- every job
   gets one worker before any job gets two;
3. then, repeatedly, the job whose move to a larger configuration of the same
   GPU type cuts its remaining time the most per added GPU,
   ``(t[i, a] - t[i, b]) / (gpus_b - gpus_a)``, among moves that fit in the
   type's free GPUs, makes that move; it stops when no move fits or none cuts
   the time (gain <= 0).

Ties go to the earlier job, then to the configuration earlier in the
problem's order. Rigid jobs only take configurations with their GPU count, so
they are never grown.

The speed model is the goodput row: allocopt's goodput models
(:mod:`allocopt.throughput.goodput`) are fitted per job to measured step times,
and with ``gamma = 1`` and a fixed batch their step time is Optimus's
``theta0 + theta1 / w + theta2 * w`` (compute split over ``w`` workers, a
constant, synchronization growing with ``w``); :func:`allocopt.throughput.optimus_speed.fit_optimus_speed`
fits that three-parameter form itself. With every GPU count as a configuration
and remaining times convex and decreasing in the GPU count (as in that model),
step 3 is the greedy of separable convex resource allocation and reaches the
least total remaining time given step 2's single-GPU start.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from allocopt.allocation import Timings
from allocopt.errors import InvalidOptionError
from allocopt.formulations.base import ModelSolver, Policy, PolicyResult
from allocopt.formulations.sia import configuration_allocation
from allocopt.goodput_problem import ConfigurationAllocation, GoodputProblem


class Optimus(Policy):
    """Optimus's greedy marginal-gain allocation (see the module docstring).

    Options
    -------
    remaining : array-like of float of shape (n_jobs,), optional
        Work each job has left (> 0, in its goodput's unit times seconds, e.g.
        samples); default 1 for every job (then jobs compare by goodput alone).
    """

    name = "optimus"
    options: ClassVar[dict[str, Any]] = {"remaining": None}
    problem_type = GoodputProblem
    warm_starts = False

    def allocate(self, problem: GoodputProblem, solver: ModelSolver, *, remaining: Any = None) -> PolicyResult:
        work = _remaining(problem, remaining)
        configuration, upgrades = optimus_configurations(problem, work)
        n, C = problem.num_jobs, problem.num_configurations
        chosen = np.zeros((n, C))
        on = configuration >= 0
        chosen[np.flatnonzero(on), configuration[on]] = 1.0
        times = remaining_times(problem, work)
        estimated = float(times[np.flatnonzero(on), configuration[on]].sum())
        return PolicyResult(chosen, None, message=f"Optimus's greedy: {int(on.sum())} of {n} job(s) placed, "
                                                  f"{upgrades} move(s) to larger configurations.",
                            extras={"estimated_remaining_s": estimated, "moves": upgrades})

    def to_allocation(self, problem: GoodputProblem, result: PolicyResult, *, backend: str | None,
                      timings: Timings) -> ConfigurationAllocation:
        return configuration_allocation(problem, result, self.name, backend=backend, timings=timings)


def _remaining(problem: GoodputProblem, remaining: Any) -> np.ndarray:
    if remaining is None:
        return np.ones(problem.num_jobs)
    try:
        work = np.asarray(remaining, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise InvalidOptionError(f"optimus: remaining must be numbers, one per job: {err}") from None
    if work.shape != (problem.num_jobs,):
        raise InvalidOptionError(f"optimus: remaining has shape {work.shape}, expected (n_jobs,) = "
                                 f"({problem.num_jobs},)")
    bad = np.flatnonzero(~(np.isfinite(work) & (work > 0)))
    if bad.size:
        i = int(bad[0])
        raise InvalidOptionError(f"optimus: remaining of job {problem.job_ids[i]!r} is {work[i]}; give the work "
                                 "it has left as a finite number > 0 (leave finished jobs out of the problem)")
    return work


def remaining_times(problem: GoodputProblem, remaining: np.ndarray) -> np.ndarray:
    """``t[i, c] = remaining_i / E[i, c]``, seconds, shape (n_jobs, n_configurations); inf where not valid."""
    n, C = problem.num_jobs, problem.num_configurations
    factor = np.where(np.arange(C)[None, :] == problem.previous[:, None], 1.0, problem.restart_factor[:, None])
    speed = np.where(problem.valid, np.nan_to_num(problem.goodput) * factor, 0.0)
    return np.divide(remaining[:, None], speed, out=np.full((n, C), np.inf), where=speed > 0)


def optimus_configurations(problem: GoodputProblem, remaining: np.ndarray) -> tuple[np.ndarray, int]:
    """Steps 1-3 of the module docstring: each job's configuration (-1: none) and the number of moves."""
    n = problem.num_jobs
    configs = problem.configurations
    gpus, types = configs.num_gpus.astype(np.int64), configs.gpu_type.astype(np.int64)
    times = remaining_times(problem, remaining)
    free = problem.cluster.capacity.astype(np.int64).copy()
    chosen = np.full(n, -1, dtype=np.int64)
    pinned = np.flatnonzero(problem.pinned)
    chosen[pinned] = problem.previous[pinned]
    np.subtract.at(free, types[chosen[pinned]], gpus[chosen[pinned]])
    # step 2: one (smallest) configuration per job, shortest remaining time first
    fewest = np.where(problem.valid, gpus[None, :], np.iinfo(np.int64).max).min(axis=1)
    smallest = problem.valid & (gpus[None, :] == fewest[:, None])
    start_time = np.where(smallest, times, np.inf).min(axis=1)
    waiting = np.flatnonzero(~problem.pinned)
    for i in waiting[np.argsort(start_time[waiting], kind="stable")].tolist():
        fits = smallest[i] & (gpus <= free[types])
        if not fits.any():
            continue
        c = int(np.flatnonzero(fits)[np.argmin(times[i, fits])])
        chosen[i] = c
        free[types[c]] -= gpus[c]
    # step 3: the largest cut of remaining time per added GPU, until none fits or helps
    grow = (chosen >= 0) & ~problem.pinned
    moves = 0
    while grow.any():
        rows = np.flatnonzero(grow)
        cur = chosen[rows]
        extra = gpus[None, :] - gpus[cur][:, None]
        ok = (problem.valid[rows] & (types[None, :] == types[cur][:, None]) & (extra > 0)
              & (extra <= free[types][None, :]))
        gain = np.where(ok, (times[rows, cur][:, None] - times[rows]) / np.maximum(extra, 1), -np.inf)
        k = int(np.argmax(gain))
        r, c = divmod(k, gain.shape[1])
        if not gain[r, c] > 0:
            break
        i = int(rows[r])
        free[types[c]] -= int(gpus[c] - gpus[chosen[i]])
        chosen[i] = c
        moves += 1
    return chosen, moves


__all__ = ["Optimus", "optimus_configurations", "remaining_times"]
