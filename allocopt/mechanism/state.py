"""The jobs of a simulation and their progress, shared by the simulator and its round planners."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from allocopt.cluster import Cluster
from allocopt.formulations.makespan import isolated_throughputs, policy_throughputs
from allocopt.mechanism.tenants import Tenants, folded_weights
from allocopt.mechanism.workload import Workload
from allocopt.problem import PairThroughputs, Problem
from allocopt.throughput.table import ThroughputTable


class SimulationState:
    """Jobs of a simulation (rows in arrival order) and their progress.

    Attributes
    ----------
    workload : Workload
    cluster : Cluster
    throughputs : ndarray of shape (n_jobs, n_gpu_types)
        Steps/s of each job on each type.
    remaining_steps : ndarray of int of shape (n_jobs,)
    active : ndarray of bool of shape (n_jobs,)
        Arrived and not finished.
    changed : bool
        Jobs arrived or left since the planner last looked.
    table : ThroughputTable or None
        Where pair (co-located) throughputs come from under space sharing.
    planned_throughputs : ndarray of shape (n_jobs, n_gpu_types) or None
        The throughputs the policy's problems carry, when they are not ``throughputs``
        (Gavel's agnostic planning,
        :func:`allocopt.adapters.gavel.gavel_agnostic_throughputs`); jobs still run
        at ``throughputs``.
    tenants : Tenants or None
        Tenants whose weights each problem carries (:mod:`allocopt.mechanism.tenants`), with
        ``tenant_of`` (ndarray of int of shape (n_jobs,)) each job's tenant.
    varying_capacity : bool
        The cluster changes during the simulation (:meth:`set_cluster`); problems then hold the
        jobs a GPU type of the current cluster can run (:meth:`runnable_rows`).
    next_capacity_change_s : float
        When the cluster changes next (seconds; ``inf``: never), for planners whose rounds end at events.
    """

    def __init__(self, workload: Workload, cluster: Cluster, throughputs: np.ndarray,
                 table: ThroughputTable | None = None, planned_throughputs: np.ndarray | None = None):
        self.workload = workload
        self.cluster = cluster
        self.throughputs = throughputs
        self.table = table
        self.planned_throughputs = planned_throughputs
        self.remaining_steps = workload.total_steps.astype(np.int64).copy()
        self.active = np.zeros(workload.num_jobs, dtype=bool)
        self.changed = False
        self._jobs: Problem | None = None  # every job, checked once; each problem() takes rows of it
        # finish-time fairness (Gavel's, after Themis): each job's isolated time accumulates, at every
        # allocation, the steps it made since the previous one over its isolated steps/s at that one
        self.isolated_time = np.zeros(workload.num_jobs)
        self._steps_at_call = np.full(workload.num_jobs, np.nan)
        self._isolated_rate = np.full(workload.num_jobs, np.nan)
        self.tenants: Tenants | None = None
        self.tenant_of: np.ndarray | None = None
        self.varying_capacity = False
        self.next_capacity_change_s = np.inf

    def set_cluster(self, cluster: Cluster) -> None:
        """The cluster from now on (same GPU types): the planners see it at their next round."""
        self.cluster = cluster
        self.varying_capacity = True
        self.changed = True

    def runnable_rows(self, rows: np.ndarray) -> np.ndarray:
        """Those of ``rows`` that some GPU type of the current cluster runs (positive throughput, enough GPUs)."""
        fits = (self.throughputs[rows] > 0) & (self.workload.scale_factors[rows, None] <= self.cluster.capacity)
        return rows[fits.any(axis=1)]

    def active_rows(self) -> np.ndarray:
        """Rows of the jobs that have arrived and are not finished."""
        return np.flatnonzero(self.active)

    def jobs(self) -> Problem:
        """Every job (throughputs, scale factors, weights) as one problem, checked at the first call."""
        if self._jobs is None:
            planned = self.throughputs if self.planned_throughputs is None else self.planned_throughputs
            self._jobs = Problem(planned, self.cluster, scale_factors=self.workload.scale_factors,
                                 priority_weights=self.workload.priority_weights)
        return self._jobs

    def problem(self, rows: np.ndarray, now_s: float, policy: str,
                pairs: tuple[np.ndarray, np.ndarray] | None = None,
                options: Mapping[str, Any] | None = None) -> Problem:
        """The allocation problem of ``rows`` at ``now_s`` (steps remaining, time since arrival);
        ``pairs`` (rows (p, 2), steps/s (p, n_gpu_types, 2), see :meth:`pairs`) for space sharing.

        For ``finish_time_fairness`` (``options``: its policy options) each call also advances
        :attr:`isolated_time` as Gavel's policy does between its calls, and the problem's
        ``time_isolated`` is that cumulative time (seconds)."""
        since = now_s - self.workload.arrival_s[rows]
        ftf = policy == "finish_time_fairness"
        isolated = self._advance_isolated_time(rows) if ftf else None
        if pairs is None and self.tenants is None and not self.varying_capacity:
            problem = self.jobs().with_progress(rows, num_steps_remaining=self.remaining_steps[rows],
                                                time_since_start=since, time_isolated=isolated)
        else:
            shared = None if pairs is None else PairThroughputs([tuple(p) for p in pairs[0].tolist()], pairs[1])
            weights = self.workload.priority_weights[rows]
            entities = entity_weights = None
            if self.tenants is not None and policy == "water_filling":  # the hierarchy: tenants are entities
                names = self.tenants.names
                entities = [names[k] for k in self.tenant_of[rows].tolist()]
                present = np.unique(self.tenant_of[rows])
                entity_weights = dict(zip([names[k] for k in present.tolist()], self.tenants.weights[present].tolist()))
            elif self.tenants is not None:  # tenants' weights folded into the jobs' priority weights
                weights = folded_weights(weights, self.tenant_of[rows], self.tenants.weights)
            planned = self.throughputs if self.planned_throughputs is None else self.planned_throughputs
            problem = Problem(planned[rows] if pairs is None else self.throughputs[rows], self.cluster,
                              job_ids=rows.tolist(), scale_factors=self.workload.scale_factors[rows],
                              priority_weights=weights, num_steps_remaining=self.remaining_steps[rows],
                              time_since_start=since, time_isolated=isolated, pair_throughputs=shared,
                              entities=entities, entity_weights=entity_weights)
        if ftf:
            self._remember_isolated_rates(problem, rows, options or {})
        return problem

    def _advance_isolated_time(self, rows: np.ndarray) -> np.ndarray:
        steps, rate = self._steps_at_call[rows], self._isolated_rate[rows]
        made = np.where(np.isfinite(steps), steps - self.remaining_steps[rows], 0.0)
        self.isolated_time[rows] += np.divide(made, rate, out=np.zeros(rows.size), where=made > 0)
        return self.isolated_time[rows]

    def _remember_isolated_rates(self, problem: Problem, rows: np.ndarray, options: Mapping[str, Any]) -> None:
        planned = policy_throughputs(problem, problem.num_steps_remaining > 0,
                                     heterogeneity_aware=options.get("heterogeneity_aware", True),
                                     reference_gpu_type=options.get("reference_gpu_type"),
                                     space_sharing=bool(options.get("space_sharing", False)))
        self._steps_at_call[:] = np.nan  # like Gavel, only the jobs of this call carry over
        self._isolated_rate[:] = np.nan
        self._steps_at_call[rows] = self.remaining_steps[rows]
        self._isolated_rate[rows] = isolated_throughputs(problem, planned)

    def pairs(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pairs of ``rows`` that may share GPUs: equal scale factors and a measured co-located pair
        in :attr:`table` (as in Gavel, every such pair is a candidate).

        Returns
        -------
        pairs : ndarray of int of shape (p, 2)
            Rows ``(a, b)``, ``a < b``, sorted.
        throughputs : ndarray of shape (p, n_gpu_types, 2)
            Steps/s of ``a`` and ``b`` sharing ``scale_factor`` GPUs of each type.
        """
        rows = np.sort(rows)
        scales = self.workload.scale_factors[rows]
        a, b = np.triu_indices(rows.size, 1)
        a, b = a[scales[a] == scales[b]], b[scales[a] == scales[b]]
        models = np.array(self.workload.models, dtype=object)
        values = self.table.pair_throughputs(models[rows[a]].tolist(), models[rows[b]].tolist(),
                                             scales[a], self.cluster.gpu_types)
        measured = ~np.isnan(values).any(axis=(1, 2))
        return np.column_stack([rows[a], rows[b]])[measured], values[measured]
