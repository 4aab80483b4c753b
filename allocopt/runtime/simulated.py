"""An executor in simulated time: jobs progress by a throughput model."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence

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
    throughputs : callable or mapping
        ``throughputs(job_id, gpu_type, num_gpus) -> steps/s``, or
        ``{job_id: {gpu_type: steps/s}}`` (steps/s of the whole job on its GPUs).
    restart_overhead_s : float, default 0
        Seconds a job loses at the start of a lease that is not extended
        (checkpoint restore, process start).
    pair_throughputs : callable, optional
        ``pair_throughputs(job_id, partner_id, gpu_type) -> steps/s`` of a job
        sharing its GPUs (a lease with ``co_located_with``); required for such leases.
    """

    def __init__(self, throughputs: ThroughputLookup | Mapping[Hashable, Mapping[str, float]], *,
                 restart_overhead_s: float = 0.0, pair_throughputs: PairThroughputLookup | None = None):
        if isinstance(throughputs, Mapping):
            table = throughputs
            self._lookup: ThroughputLookup = lambda job, gpu_type, _n: float(table[job][gpu_type])
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
