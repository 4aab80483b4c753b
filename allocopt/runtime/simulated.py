"""An executor in simulated time: jobs progress by a throughput model."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np

from allocopt.errors import InvalidOptionError
from allocopt.runtime.executor import Executor, JobRoundResult, Lease, RoundOutcome, RoundPlan

ThroughputLookup = Callable[[Hashable, str, int], float]
PairThroughputLookup = Callable[[Hashable, Hashable, str], float]


class SimulatedExecutor(Executor):
    """Runs round plans in simulated time.

    A leased job runs ``min(floor(throughput * available_s), max_steps)`` steps,
    where ``available_s`` is the round minus any restart overhead, and holds its
    GPUs for ``overhead + steps / throughput`` seconds: it finishes early when it
    completes. The round ends when its last job stops, and :meth:`now` moves
    there (or to the plan's start when that is later).

    Parameters
    ----------
    throughputs : callable, mapping or ndarray
        ``throughputs(job_id, gpu_type, num_gpus) -> steps/s``,
        ``{job_id: {gpu_type: steps/s}}`` (steps/s of the whole job on its GPUs),
        or an array of shape (n_jobs, n_gpu_types) indexed by job id (an int)
        and the position of the type in ``gpu_types``; an array also runs
        rounds given as arrays (:meth:`run_arrays`).
    restart_overhead_s : float, default 0
        Seconds a job loses at the start of a lease that is not extended
        (checkpoint restore, process start).
    pair_throughputs : callable, optional
        ``pair_throughputs(job_id, partner_id, gpu_type) -> steps/s`` of a job
        sharing its GPUs (a lease with ``co_located_with``); required for such leases.
    gpu_types : sequence of str, optional
        The GPU type of each column of an array of ``throughputs`` (required with one).
    """

    def __init__(self, throughputs: ThroughputLookup | Mapping[Hashable, Mapping[str, float]] | np.ndarray, *,
                 restart_overhead_s: float = 0.0, pair_throughputs: PairThroughputLookup | None = None,
                 gpu_types: Sequence[str] | None = None):
        self.matrix: np.ndarray | None = None
        if isinstance(throughputs, np.ndarray):
            if gpu_types is None or throughputs.ndim != 2 or throughputs.shape[1] != len(gpu_types):
                raise InvalidOptionError("an array of throughputs needs shape (n_jobs, n_gpu_types) and gpu_types "
                                         "naming its columns")
            matrix, column = throughputs, {name: k for k, name in enumerate(gpu_types)}
            self.matrix = matrix
            self._lookup: ThroughputLookup = (
                lambda job, gpu_type, _n: float(matrix[job, column[gpu_type]]))  # type: ignore[index]
        elif isinstance(throughputs, Mapping):
            table = throughputs
            self._lookup = lambda job, gpu_type, _n: float(table[job][gpu_type])
        else:
            self._lookup = throughputs
        if not restart_overhead_s >= 0:
            raise InvalidOptionError(f"restart_overhead_s must be >= 0, got {restart_overhead_s!r}")
        self.restart_overhead_s = float(restart_overhead_s)
        self._pair_lookup = pair_throughputs
        self._now = 0.0

    def now(self) -> float:
        """Simulated seconds."""
        return self._now

    def run_round(self, plan: RoundPlan) -> Sequence[JobRoundResult]:
        self._now = max(self._now, plan.start_s)
        results = [self._run(lease) for lease in plan.leases]
        self._now += max((r.run_seconds for r in results), default=0.0)
        return results

    def run_arrays(self, start_s: float, round_seconds: float, jobs: np.ndarray, gpu_types: np.ndarray,
                   max_steps: np.ndarray, extended: np.ndarray, partners: np.ndarray,
                   gpu_type_names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`run_round` over leases given as arrays (needs an array of throughputs).

        Parameters
        ----------
        start_s, round_seconds : float
        jobs, gpu_types : ndarray of int of shape (m,)
            Job (row of the throughputs) and type (column) of each lease.
        max_steps : ndarray of int of shape (m,)
        extended : ndarray of bool of shape (m,)
        partners : ndarray of int of shape (m,)
            The co-located job of each lease (-1: none).
        gpu_type_names : sequence of str
            Name of each type (for the pair throughputs).

        Returns
        -------
        steps : ndarray of int of shape (m,)
        run_seconds : ndarray of shape (m,)
        completed : ndarray of bool of shape (m,)
        failed : ndarray of bool of shape (m,)
            Zero throughput: the job did not run.
        """
        if self.matrix is None:
            raise InvalidOptionError("run_arrays needs a SimulatedExecutor over an array of throughputs")
        self._now = max(self._now, start_s)
        tput = self.matrix[jobs, gpu_types]
        shared = np.flatnonzero(partners >= 0)
        if shared.size and self._pair_lookup is None:
            raise ValueError(f"job {int(jobs[shared[0]])} shares GPUs with {int(partners[shared[0]])}: give "
                             "SimulatedExecutor(pair_throughputs=...)")
        pair_lookup = self._pair_lookup
        for k in shared.tolist():
            tput[k] = pair_lookup(int(jobs[k]), int(partners[k]), gpu_type_names[gpu_types[k]])  # type: ignore[misc]
        overhead = np.where(extended, 0.0, min(self.restart_overhead_s, round_seconds))
        failed = ~(tput > 0)
        safe = np.where(failed, 1.0, tput)
        steps = np.floor(safe * (round_seconds - overhead)).astype(np.int64)
        completed = (steps >= max_steps) & ~failed
        steps = np.where(completed, max_steps, np.where(failed, 0, steps))
        seconds = np.where(failed, 0.0, overhead + steps / safe)
        self._now += float(seconds.max(initial=0.0))
        return steps, seconds, completed, failed

    def _run(self, lease: Lease) -> JobRoundResult:
        if lease.co_located_with is None:
            tput = self._lookup(lease.job_id, lease.gpu_type, len(lease.gpu_ids))
        elif self._pair_lookup is None:
            raise ValueError(f"job {lease.job_id!r} shares GPUs with {lease.co_located_with!r}: give "
                             "SimulatedExecutor(pair_throughputs=...)")
        else:
            tput = self._pair_lookup(lease.job_id, lease.co_located_with, lease.gpu_type)
        overhead = 0.0 if lease.extended else min(self.restart_overhead_s, lease.max_seconds)
        if not tput > 0:
            return JobRoundResult(lease.job_id, RoundOutcome.FAILED, 0, 0.0, restarted=not lease.extended,
                                  message=f"zero throughput on {lease.gpu_type}")
        steps = math.floor(tput * (lease.max_seconds - overhead))
        done = lease.max_steps is not None and steps >= lease.max_steps
        if done:
            steps = int(lease.max_steps)  # type: ignore[arg-type]
        return JobRoundResult(lease.job_id, RoundOutcome.COMPLETED if done else RoundOutcome.PREEMPTED, steps,
                              overhead + steps / tput, measured_steps_per_s=tput, restarted=not lease.extended)


__all__ = ["PairThroughputLookup", "SimulatedExecutor", "ThroughputLookup"]
