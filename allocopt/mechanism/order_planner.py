"""The round planner of order-based policies (:mod:`allocopt.mechanism.order_policies`).

Each round the planner builds a :class:`~allocopt.mechanism.order_policies.JobView`
of the active jobs, asks the policy for its order and walks the jobs in it:

- a preemptive policy's walk is over every active job; a non-preemptive
  policy's starts with the running jobs (they keep their GPUs until they
  finish) and continues with the waiting ones in rank order;
- a job takes ``scale_factor`` GPUs of its fastest type with room (among those
  where its throughput is positive; the type it ran on last round among equally
  fast ones), so a preempted or waiting job moves to a faster type when one
  frees up; a non-preemptive policy's running job keeps its type; with ``backfill=True`` (Tiresias's walk) a job
  that does not fit is skipped and later jobs may still start, with
  ``backfill=False`` the walk stops at the first job that does not fit (strict
  head-of-line order);
- with tenant GPU quotas (:mod:`allocopt.mechanism.tenants`), a job whose tenant
  would exceed its quota is passed over (it never blocks the walk);
- running jobs that the walk leaves out are preempted; the chosen jobs are
  placed on servers by :func:`~allocopt.mechanism.placement.place_arrays`
  (a job keeps last round's GPUs when it can).

A round lasts until the next event: the next arrival, the first completion
among the leased jobs, or the policy's ``next_change_s`` (a threshold crossing),
at most ``round_seconds`` and at least one step of every job it runs (so an
arrival during a slow job's step waits for its end); a policy without
``next_change_s`` (LAS) gets rounds of ``round_seconds``. Rounds that end at events make the simulation event-driven
where the policy allows it, as Tiresias's simulator is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from allocopt.cluster import Cluster
from allocopt.errors import InvalidOptionError
from allocopt.mechanism.capacity import remap_held
from allocopt.mechanism.order_policies import JobView, OrderPolicy
from allocopt.mechanism.placement import GpuLayout
from allocopt.mechanism.placement_policies import BestFit, PlacementPolicy
from allocopt.mechanism.priority import greedy_fill
from allocopt.mechanism.state import SimulationState
from allocopt.runtime.executor import JobRoundResult, Lease, RoundPlan


@dataclass(frozen=True)
class OrderOptions:
    """Options of :class:`OrderPlanner`.

    Attributes
    ----------
    round_seconds : float, default 360
        Longest round, seconds (the quantum of policies whose order changes continuously).
    backfill : bool, default True
        Let a job that fits start when one ahead of it does not (False: the walk stops there).
    event_rounds : bool, default True
        End a round at the next arrival, completion or policy event. False: every round
        is ``round_seconds`` long and starts on a multiple of it (Blox's simulator), so
        arrivals wait for the next round and a job's GPUs stay held until the end of
        the round in which it completes.
    """

    round_seconds: float = 360.0
    backfill: bool = True
    event_rounds: bool = True

    def __post_init__(self) -> None:
        if not self.round_seconds > 0:
            raise InvalidOptionError(f"round_seconds must be > 0, got {self.round_seconds!r}")


class OrderPlanner:
    """A :class:`~allocopt.mechanism.simulator.RoundPlanner` for an order-based policy.

    Parameters
    ----------
    state : SimulationState
    policy : OrderPolicy
    options : OrderOptions
    placement : PlacementPolicy, optional
        Where the chosen jobs get their GPUs (:mod:`allocopt.mechanism.placement_policies`; default best
        fit); jobs a placement defers (``consolidated``) wait for a later round.

    Attributes
    ----------
    attained_s : ndarray of shape (n_jobs,)
        Seconds each job has held GPUs.
    started_s : ndarray of shape (n_jobs,)
        When each job first held GPUs (NaN: never).
    preemptions : ndarray of int of shape (n_jobs,)
        Times each job was stopped before it finished.
    """

    def __init__(self, state: SimulationState, policy: OrderPolicy, options: OrderOptions | None = None,
                 placement: PlacementPolicy | None = None):
        self.policy, self.options = policy, options or OrderOptions()
        self.placement = placement or BestFit()
        self.layout = GpuLayout(state.cluster)
        self.solve_seconds: list[float] = []
        self.round_grid_s = None if self.options.event_rounds else self.options.round_seconds
        n = state.workload.num_jobs
        T = state.throughputs
        self.fastest = T.max(axis=1)
        # each job's types, fastest first (columns with throughput 0 last; the walk skips them)
        self._type_rank = np.argsort(-T, axis=1, kind="stable")
        self.attained_s = np.zeros(n)
        self.started_s = np.full(n, np.nan)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self._type = np.full(n, -1, dtype=np.int64)  # type held last round (-1: none)
        self._held_ids = np.zeros(0, dtype=np.int64)
        self._held_start = np.zeros(n, dtype=np.int64)
        self._held_count = np.zeros(n, dtype=np.int64)
        self._running = np.zeros(n, dtype=bool)

    def set_cluster(self, state: SimulationState, cluster: Cluster) -> None:
        """The cluster changed (:mod:`allocopt.mechanism.capacity`): renumber last round's GPUs; jobs that held
        GPUs which left lose their placement (a running job there is preempted at this round)."""
        layout = GpuLayout(cluster)
        self._held_ids, lost = remap_held(self.layout, layout, self._held_ids, self._held_start, self._held_count)
        self.layout = layout
        self._held_count[lost] = 0

    def view(self, state: SimulationState, now_s: float) -> JobView:
        """The policy's read-only view of the active jobs at ``now_s``."""
        rows = state.active_rows()
        wl = state.workload
        fastest = self.fastest[rows]
        remaining = state.remaining_steps[rows]
        total = wl.total_steps[rows]
        return JobView(
            now_s=float(now_s), rows=rows, arrival_s=wl.arrival_s[rows].copy(),
            num_gpus=wl.scale_factors[rows].astype(np.int64), attained_s=self.attained_s[rows].copy(),
            attained_gpu_s=self.attained_s[rows] * wl.scale_factors[rows],
            remaining_steps=remaining.copy(), total_steps=np.asarray(total, dtype=np.int64).copy(),
            remaining_s=np.divide(remaining, fastest, out=np.full(rows.size, np.inf), where=fastest > 0),
            duration_s=np.divide(total, fastest, out=np.full(rows.size, np.inf), where=fastest > 0),
            running=self._running[rows].copy(), started_s=self.started_s[rows].copy(),
            priority_weights=wl.priority_weights[rows].copy(),
            models=tuple(wl.models[r] for r in rows.tolist()))

    def order(self, view: JobView) -> np.ndarray:
        """Positions in ``view`` of its jobs in the policy's order (ties: arrival order)."""
        keys = np.asarray(self.policy.rank(view), dtype=np.float64)
        if keys.ndim == 1:
            keys = keys[None, :]
        if keys.ndim != 2 or keys.shape[1] != view.num_jobs:
            raise InvalidOptionError(f"policy {self.policy.name!r}: rank returned shape {keys.shape}, expected "
                                     f"({view.num_jobs},) or (k, {view.num_jobs}) for the view's jobs")
        if np.isnan(keys).any():
            raise InvalidOptionError(f"policy {self.policy.name!r}: rank returned NaN keys")
        return np.lexsort((np.arange(view.num_jobs), *keys[::-1]))

    def _walk(self, state: SimulationState, view: JobView, order: np.ndarray) -> np.ndarray:
        """GPU type of each view job this round (-1: none), walking ``order``."""
        rows = view.rows
        sizes = view.num_gpus
        if not self.policy.preemptive:  # running jobs first, in rank order
            order = order[np.argsort(~view.running[order], kind="stable")]
        chosen = np.full(rows.size, -1, dtype=np.int64)
        capacity = state.cluster.capacity.astype(np.int64)
        runnable = state.throughputs[rows] > 0
        quotas = state.tenants is not None and state.tenants.has_quotas
        left = state.tenants.gpu_quotas.copy() if quotas else None
        tenant = state.tenant_of[rows] if quotas else None
        if capacity.size == 1 and not quotas:
            walk = order[runnable[order, 0]]
            if self.options.backfill:
                taken = greedy_fill(sizes[walk], int(capacity[0]))
            else:
                taken = np.cumsum(sizes[walk]) <= capacity[0]
            chosen[walk[taken]] = 0
            return chosen
        free = capacity.copy()
        previous = self._type[rows]
        keeps = view.running if not self.policy.preemptive else np.zeros(rows.size, dtype=bool)
        speed = state.throughputs[rows]
        for k in order.tolist():
            need = int(sizes[k])
            if left is not None and need > left[tenant[k]]:  # over its tenant's quota: passed over, never blocks
                continue
            if need > free.max():
                if self.options.backfill:
                    continue
                break
            t = int(previous[k])
            if not (keeps[k] and free[t] >= need):
                fits = (free >= need) & runnable[k]
                if not fits.any():
                    if self.options.backfill:
                        continue
                    break
                best = np.flatnonzero(fits & (speed[k] == speed[k][fits].max()))
                t = t if t in best else int(self._type_rank[rows[k]][np.isin(self._type_rank[rows[k]], best)][0])
            chosen[k] = t
            free[t] -= need
            if left is not None:
                left[tenant[k]] -= need
        return chosen

    def plan(self, state: SimulationState, now_s: float, round_index: int) -> RoundPlan:
        view = self.view(state, now_s)
        rows = view.rows
        chosen = self._walk(state, view, self.order(view))
        run = chosen >= 0
        jobs, types = rows[run], chosen[run]
        sizes = state.workload.scale_factors[jobs].astype(np.int64)
        counts = self._held_count[jobs]
        offsets = np.repeat(self._held_start[jobs] - (np.cumsum(counts) - counts), counts)
        previous = self._held_ids[offsets + np.arange(int(counts.sum()))]
        models = state.workload.models
        placed = self.placement.place(self.layout, types, sizes, previous, counts, [models[j] for j in jobs.tolist()])
        ok = placed.placed
        if not ok.all():  # jobs the placement defers wait for a later round
            run[np.flatnonzero(run)[~ok]] = False
        start = placed.start[np.flatnonzero(ok).tolist() + [placed.start.size - 1]]
        jobs, types, sizes, extended, ids = jobs[ok], types[ok], sizes[ok], placed.extended[ok], placed.gpu_ids
        stopped = np.flatnonzero(self._running & ~np.isin(np.arange(self._running.size), jobs))
        seconds = self._round_length(state, replace(view, running=run), jobs, types)
        names = state.cluster.gpu_types
        bounds = start.tolist()
        flat = ids.tolist()
        leases = tuple(Lease(job, names[t], tuple(flat[a:b]), seconds, max_steps=steps, extended=keep)
                       for job, t, a, b, steps, keep in zip(
                           jobs.tolist(), types.tolist(), bounds[:-1], bounds[1:],
                           state.remaining_steps[jobs].tolist(), extended.tolist()))
        # what the next view sees: who holds GPUs, where
        self.preemptions[stopped[state.active[stopped]]] += 1
        self._running[:] = False
        self._running[jobs] = True
        self._type[:] = -1
        self._type[jobs] = types
        self._held_ids = ids
        self._held_count[:] = 0
        self._held_count[jobs] = sizes
        self._held_start[jobs] = start[:-1]
        first = jobs[np.isnan(self.started_s[jobs])]
        self.started_s[first] = now_s
        return RoundPlan(round_index, now_s, seconds, leases, tuple(stopped.tolist()))

    def _round_length(self, state: SimulationState, view: JobView, jobs: np.ndarray, types: np.ndarray) -> float:
        """Seconds until the next event (arrival, completion, the policy's next change), at most the quantum.
        ``view.running`` marks the jobs that run this round."""
        cap = self.options.round_seconds
        if not self.options.event_rounds:
            return cap * (1 + 1e-9)
        change = getattr(self.policy, "next_change_s", None)
        length = cap if change is None else min(cap, float(change(view)))
        arrival = state.workload.arrival_s
        later = int(np.searchsorted(arrival, view.now_s, side="right"))
        if later < arrival.size:
            length = min(length, float(arrival[later]) - view.now_s)
        if state.next_capacity_change_s > view.now_s:  # the cluster changes (allocopt.mechanism.capacity)
            length = min(length, float(state.next_capacity_change_s) - view.now_s)
        if jobs.size:
            tput = state.throughputs[jobs, types]
            length = min(length, float((state.remaining_steps[jobs] / tput).min()))
            # at least one step of every leased job: each round moves every job it runs (a round shorter than a
            # slow job's step would advance only the fast ones, and an event of the slow one would recur)
            length = max(length, float((1.0 / tput).max()))
        if not (length > 0 and math.isfinite(length)):
            length = cap
        return length * (1 + 1e-9)

    def observe(self, plan: RoundPlan, results: Sequence[JobRoundResult]) -> None:
        if not results:
            return
        jobs = np.fromiter((r.job_id for r in results), dtype=np.int64, count=len(results))
        self.attained_s[jobs] += np.array([r.run_seconds for r in results])


__all__ = ["OrderOptions", "OrderPlanner"]
