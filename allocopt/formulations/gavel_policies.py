"""Gavel's policies by name: the catalogue of Gavel's policy names and their allocopt counterparts, and
:class:`GavelPolicy`, Gavel's policy object with the state Gavel's policies keep between calls.

Used by the Gavel adapter (:mod:`allocopt.adapters.gavel`, which documents the behaviour, Gavel's
argument lists and the differences from Gavel) and by the simulator's ``gavel:NAME`` policies.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np

from allocopt.allocation import Allocation as AllocoptAllocation
from allocopt.api import solve
from allocopt.backends import BACKENDS
from allocopt.cluster import Cluster
from allocopt.errors import AllocoptWarning, InvalidProblemError, UnknownPolicyError
from allocopt.formulations.makespan import isolated_throughputs, policy_throughputs
from allocopt.formulations.shares import isolated_matrix
from allocopt.problem import Problem
from allocopt.solution import Status

Allocation = dict[Hashable, dict[str, float]]

SIGNATURES: dict[str, tuple[str, ...]] = {
    "weighted": ("unflattened_throughputs", "scale_factors", "unflattened_priority_weights", "cluster_spec"),
    "unweighted": ("unflattened_throughputs", "scale_factors", "cluster_spec"),
    "cost": ("unflattened_throughputs", "scale_factors", "cluster_spec", "instance_costs"),
    "cost_slos": ("unflattened_throughputs", "scale_factors", "cluster_spec", "instance_costs", "SLOs",
                  "num_steps_remaining"),
    "duration": ("unflattened_throughputs", "scale_factors", "num_steps_remaining", "cluster_spec"),
    "finish_time": ("unflattened_throughputs", "scale_factors", "unflattened_priority_weights",
                    "times_since_start", "num_steps_remaining", "cluster_spec"),
    "allox": ("unflattened_throughputs", "scale_factors", "times_since_start", "num_steps_remaining",
              "cluster_spec"),
    "water_filling": ("unflattened_throughputs", "scale_factors", "unflattened_priority_weights", "cluster_spec",
                      "entity_weights", "entity_to_job_mapping", "verbose", "return_effective_throughputs"),
}
# Gavel's heterogeneity-agnostic policies assume every type runs at the V100 speed.
_AGNOSTIC = {"heterogeneity_aware": False, "reference_gpu_type": "v100"}
_PACKED = {"space_sharing": True}

# Gavel policy name -> (allocopt policy, get_allocation signature, policy options)
POLICY_NAMES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "max_min_fairness": ("max_min_fairness", "weighted", {"heterogeneity_aware": False}),
    "max_min_fairness_perf": ("max_min_fairness", "weighted", {}),
    "max_sum_throughput_perf": ("max_throughput", "unweighted", {}),
    "max_sum_throughput_normalized_by_cost_perf": ("max_throughput", "cost", {"normalize_by_cost": True}),
    "max_sum_throughput_normalized_by_cost_perf_SLOs": ("max_throughput", "cost_slos",
                                                        {"normalize_by_cost": True}),
    "isolated": ("isolated", "unweighted", {}),
    "min_total_duration": ("min_makespan", "duration", _AGNOSTIC),
    "min_total_duration_perf": ("min_makespan", "duration", {}),
    "finish_time_fairness": ("finish_time_fairness", "finish_time", _AGNOSTIC),
    "finish_time_fairness_perf": ("finish_time_fairness", "finish_time", {}),
    "max_min_fairness_packed": ("max_min_fairness", "weighted", _PACKED),
    "min_total_duration_packed": ("min_makespan", "duration", _PACKED),
    "finish_time_fairness_packed": ("finish_time_fairness", "finish_time", _PACKED),
    "max_sum_throughput_normalized_by_cost_packed_SLOs": ("max_throughput", "cost_slos",
                                                          {"normalize_by_cost": True, **_PACKED}),
    "fifo": ("fifo", "unweighted", {}),
    "fifo_perf": ("fifo", "unweighted", {"heterogeneity_aware": True}),
    "fifo_packed": ("fifo", "unweighted", {"heterogeneity_aware": True, **_PACKED}),
    "gandiva": ("gandiva", "unweighted", _PACKED),
    "allox": ("allox", "allox", {"alpha": 1.0}),
    "max_min_fairness_water_filling": ("water_filling", "water_filling", {"heterogeneity_aware": False}),
    "max_min_fairness_water_filling_perf": ("water_filling", "water_filling", {}),
    "max_min_fairness_water_filling_packed": ("water_filling", "water_filling", _PACKED),
}

# Gavel policies whose objects keep state between calls (:mod:`allocopt.adapters.gavel`), with the flags that
# reproduce Gavel's behaviour: allocopt's simulator runs ``gavel:NAME`` of these through this adapter
STATEFUL_POLICIES: dict[str, dict[str, Any]] = {"fifo": {"faithful_type_choice": True}, "gandiva": {},
                                                "allox": {}}

# Gavel policy name -> the ``name`` of Gavel's policy class (what Gavel's scheduler branches on)
GAVEL_CLASS_NAMES: dict[str, str] = {
    "max_min_fairness": "MaxMinFairness",
    "max_min_fairness_perf": "MaxMinFairness_Perf",
    "max_min_fairness_packed": "MaxMinFairness_Packing",
    "max_min_fairness_water_filling": "MaxMinFairnessWaterFilling",
    "max_min_fairness_water_filling_perf": "MaxMinFairnessWaterFilling_Perf",
    "max_min_fairness_water_filling_packed": "MaxMinFairnessWaterFilling_Packing",
    "max_sum_throughput_perf": "ThroughputSumWithPerf",
    "max_sum_throughput_normalized_by_cost_perf": "ThroughputNormalizedByCostSum_Perf",
    "max_sum_throughput_normalized_by_cost_perf_SLOs": "ThroughputNormalizedByCostSum_PerfSLOs",
    "max_sum_throughput_normalized_by_cost_packed_SLOs": "ThroughputNormalizedByCostSum_PackingSLOs",
    "isolated": "Isolated",
    "min_total_duration": "MinTotalDuration",
    "min_total_duration_perf": "MinTotalDuration_Perf",
    "min_total_duration_packed": "MinTotalDuration_Packing",
    "finish_time_fairness": "FinishTimeFairness",
    "finish_time_fairness_perf": "FinishTimeFairness_Perf",
    "finish_time_fairness_packed": "FinishTimeFairness_Packing",
    "fifo": "FIFO",
    "fifo_perf": "FIFO_Perf",
    "fifo_packed": "FIFO_Packing",
    "gandiva": "Gandiva_Packing",
    "allox": "AlloX_Perf",
}


class GavelPolicy:
    """A Gavel-compatible policy object; see :func:`allocopt.adapters.gavel.get_policy` and the
    :mod:`allocopt.adapters.gavel` module docstring.

    Parameters
    ----------
    policy_name : str
        Gavel's policy name (a key of :data:`POLICY_NAMES`).
    solver : str, optional
        allocopt backend, cvxpy solver name, ``"highs-ipm"`` or ``"highs-simplex"`` (module
        docstring); None: ``"highs"``, with HiGHS's interior point on Gavel's LP policies.
    seed : int, optional
        Seed of ``fifo``'s and ``gandiva``'s random choices (None: 0).
    priority_reweighting_policies : mapping, optional
        ``{entity: "fairness" | "fifo"}`` of the water-filling policies.
    alpha : float, optional
        AlloX's share of the queue considered (Gavel's default 1.0).
    packing_threshold : float, optional
        ``fifo_packed``'s normalized-throughput threshold (Gavel's default 1.5).
    faithful_type_choice : bool, default False
        ``fifo`` only: reproduce Gavel's worker-type choice (:mod:`allocopt.adapters.gavel`).
    faithful_agnostic : bool, default False
        Heterogeneity-agnostic policies only: like Gavel's, plan on every GPU type of the
        cluster, including types where the job's throughput is 0 (planned at its V100
        speed; Gavel's mechanism then never runs it there, so that time is lost).
    faithful_bisection : bool, default False
        ``min_total_duration*`` only: Gavel's bisection over feasibility LPs, which
        stops within 5% (``min_makespan``'s ``method="bisection"``), instead of the exact LP.
    """

    def __init__(self, policy_name: str, solver: str | None = None, seed: int | None = None,
                 priority_reweighting_policies: Mapping[Hashable, str] | None = None, *,
                 alpha: float | None = None, packing_threshold: float | None = None,
                 faithful_type_choice: bool = False, faithful_bisection: bool = False,
                 faithful_agnostic: bool = False):
        if policy_name not in POLICY_NAMES:
            raise UnknownPolicyError(f"unknown Gavel policy {policy_name!r}; allocopt implements "
                                     f"{', '.join(sorted(POLICY_NAMES))}")
        self._key = policy_name
        self._name = GAVEL_CLASS_NAMES[policy_name]
        self._policy, self._signature, options = POLICY_NAMES[policy_name]
        self._options = {k: v for k, v in options.items() if v is not None}
        if priority_reweighting_policies is not None:
            if self._policy != "water_filling":
                raise TypeError("priority_reweighting_policies only applies to the water-filling policies, "
                                f"not {policy_name!r}")
            self._options["entity_policies"] = dict(priority_reweighting_policies)
        if alpha is not None:
            if self._policy != "allox":
                raise TypeError(f"alpha only applies to allox, not {policy_name!r}")
            self._options["alpha"] = float(alpha)
        if packing_threshold is not None:
            if policy_name != "fifo_packed":
                raise TypeError(f"packing_threshold only applies to fifo_packed, not {policy_name!r}")
            self._options["packing_threshold"] = float(packing_threshold)
        if faithful_type_choice and policy_name != "fifo":
            raise TypeError(f"faithful_type_choice only applies to fifo, not {policy_name!r}")
        self._faithful_type_choice = faithful_type_choice
        if faithful_agnostic and self._options.get("heterogeneity_aware", True):
            raise TypeError(f"faithful_agnostic only applies to the heterogeneity-agnostic policies, not "
                            f"{policy_name!r}")
        self._faithful_agnostic = faithful_agnostic
        if faithful_bisection:
            if self._policy != "min_makespan":
                raise TypeError(f"faithful_bisection only applies to min_total_duration*, not {policy_name!r}")
            self._options["method"] = "bisection"
        self._backend, self._solver_options = _backend_for(solver, self._policy)
        default_highs = (solver is None or solver == "highs") and bool(self._solver_options)
        self._solver_reason = HIGHS_IPM_REASON if default_highs else None
        self._last_allocation: AllocoptAllocation | None = None
        if self._backend == "cvxpy":
            self._options = {**gavel_program_options(policy_name, self._options), **self._options}
        self._rng = random.Random(0 if seed is None else seed)
        # state kept between calls (the Gavel adapter's module docstring)
        self._cumulative_isolated_time: dict[Hashable, float] = {}
        self._isolated_throughputs_prev_iteration: dict[Hashable, float] = {}
        self._num_steps_remaining_prev_iteration: dict[Hashable, float] = {}
        self._prev_allocation: Allocation = {}
        self._assignments: dict[Hashable, str] = {}
        self._assigned_combinations: dict[Hashable, tuple[Hashable, Hashable | None]] = {}

    @property
    def name(self) -> str:
        """The name of Gavel's policy class (``MaxMinFairness_Perf``, ...)."""
        return self._name

    @property
    def arguments(self) -> tuple[str, ...]:
        """The argument names of ``get_allocation``, in Gavel's order (:data:`SIGNATURES`)."""
        return SIGNATURES[self._signature]

    @property
    def policy_name(self) -> str:
        """Gavel's policy name as ``utils.get_policy`` takes it (``max_min_fairness_perf``, ...)."""
        return self._key

    def release(self, jobs: Iterable[Hashable]) -> None:
        """Forget the worker types held for ``jobs`` (FIFO keeps a job on its type until it completes): they
        were preempted (their GPUs left the cluster) and queue again at their place in job order. Not in
        Gavel, whose cluster does not change."""
        for job in jobs:
            self._assignments.pop(job, None)

    def get_allocation(self, *args: Any, **kwargs: Any) -> Allocation | None:
        """Gavel's ``get_allocation``; the accepted arguments depend on the policy
        (:data:`SIGNATURES`). Returns None when there are no jobs, as Gavel does."""
        values = self._bind(args, kwargs)
        throughputs, pairs, pair_keys = _split_pairs(values["unflattened_throughputs"])
        if not throughputs:
            self._isolated_throughputs_prev_iteration = {}
            self._num_steps_remaining_prev_iteration = {}
            return None
        if values.get("return_effective_throughputs"):
            raise TypeError(f"{self._name}: return_effective_throughputs=True is not supported; "
                            "allocopt.solve(...).extras['levels'] holds each job's normalized level")
        if self._policy == "allox":
            return self._allox(throughputs, values)
        if self._key == "fifo":
            return self._fifo(_sorted(throughputs), values)
        if self._policy == "gandiva":
            return self._gandiva(_sorted(throughputs), pairs, pair_keys, values)
        throughputs = _sorted(throughputs)  # Gavel orders jobs by id (fifo inside entities takes the lowest first)
        if self._faithful_agnostic:  # Gavel plans every type at the V100 speed, 0 steps/s included
            throughputs = {job: dict(zip(row, gavel_agnostic_throughputs(
                np.array([list(row.values())], dtype=np.float64), list(row))[0].tolist()))
                for job, row in throughputs.items()}
        cluster = _cluster(values["cluster_spec"])
        slos = values.get("SLOs") or None
        steps = _current(values.get("num_steps_remaining"), throughputs)
        if "SLOs" in SIGNATURES[self._signature]:  # the SLO policy needs the steps of jobs with a deadline only
            steps = _deadline_steps(slos, steps, throughputs)
        isolated_time = None
        if self._policy == "finish_time_fairness":
            isolated_time = self._update_isolated_time(steps, throughputs)
        problem = Problem.from_dicts(
            throughputs, cluster,
            scale_factors=values.get("scale_factors"),
            priority_weights=values.get("unflattened_priority_weights"),
            costs=values.get("instance_costs"),
            num_steps_remaining=steps,
            time_since_start=_current(values.get("times_since_start"), throughputs),
            time_isolated=isolated_time,
            slos=slos, pair_throughputs=pairs or None,
            entities=_entities(values.get("entity_to_job_mapping"), throughputs),
            entity_weights=values.get("entity_weights"))
        options = dict(self._options)
        if not pairs:
            options.pop("space_sharing", None)  # no pair to pack: the plain policy
        if "instance_costs" in SIGNATURES[self._signature] and values.get("instance_costs") is None:
            options.pop("normalize_by_cost", None)
        allocation = self._solve(problem, best_effort=slos is not None, **options)
        if self._policy == "finish_time_fairness":
            self._remember_isolated_throughputs(problem, steps)
        return {pair_keys.get(key, key): fractions for key, fractions in allocation.items()}

    def get_allocation_using_job_type_throughputs(
            self, unflattened_throughputs: Mapping[Hashable, Mapping[str, Mapping[Hashable, float]]],
            job_id_to_job_type_key: Mapping[Hashable, Hashable], scale_factors: Mapping[Hashable, int],
            unflattened_priority_weights: Mapping[Hashable, float],
            cluster_spec: Mapping[str, int]) -> Allocation | None:
        """Gavel's ``MaxMinFairnessPolicyWithPacking.get_allocation_using_job_type_throughputs``.

        ``unflattened_throughputs[job_type][worker_type][other]`` is a job type's
        throughput alone (``other`` None) or next to a job of type ``other``; job
        types are ``(model, scale_factor)`` keys and only types of equal scale
        factor pair. The pairs are expanded to jobs and solved as the packed
        max-min fairness LP; the answer holds each job and each pair of jobs (keyed
        like Gavel: a ``JobIdPair`` when the ids are, else a tuple).
        """
        if self._key != "max_min_fairness_packed":
            raise TypeError(f"{self._name} has no get_allocation_using_job_type_throughputs "
                            "(Gavel's MaxMinFairness_Packing has)")
        jobs = sorted(job_id_to_job_type_key)
        if not jobs:
            return None
        types = sorted(cluster_spec)
        kind = {job: job_id_to_job_type_key[job] for job in jobs}
        missing = [job for job in jobs if kind[job] not in unflattened_throughputs]
        if missing:
            raise InvalidProblemError(f"job(s) {missing[:5]} have a job type with no throughputs",
                                      field="unflattened_throughputs", job=missing[0])
        singles = {job: {t: float(unflattened_throughputs[kind[job]][t][None]) for t in types} for job in jobs}
        pairs, keys = {}, {}
        for i, a in enumerate(jobs):
            for b in jobs[i + 1:]:
                if scale_factors[a] != scale_factors[b] or _scale(kind[a]) != _scale(kind[b]):
                    continue
                pairs[(a, b)] = {t: [float(unflattened_throughputs[kind[a]][t].get(kind[b], 0.0)),
                                     float(unflattened_throughputs[kind[b]][t].get(kind[a], 0.0))]
                                 for t in types}
                keys[(a, b)] = _pair_key(a, b)
        problem = Problem.from_dicts(singles, _cluster(cluster_spec), scale_factors=scale_factors,
                                     priority_weights=unflattened_priority_weights, pair_throughputs=pairs or None)
        allocation = self._solve(problem, **self._options)
        return {keys.get(key, key): fractions for key, fractions in allocation.items()}

    def get_throughputs(self, throughputs: np.ndarray, index: tuple, scale_factors: Mapping[Hashable, int],
                        cluster_spec: Mapping[str, int]) -> np.ndarray:
        """Gavel's ``IsolatedPolicy.get_throughputs``: each job's throughput under the
        isolated share, shape (n_jobs, 1); ``index`` is ``(job_ids, worker_types)``."""
        job_ids, worker_types = index
        T = np.asarray(throughputs, dtype=np.float64)
        problem = Problem(T, Cluster({t: cluster_spec[t] for t in worker_types}),
                          scale_factors=[scale_factors[job] for job in job_ids])
        return (T * isolated_matrix(problem)).sum(axis=1).reshape(-1, 1)

    # -- helpers ---------------------------------------------------------------------------------

    def _bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        params = SIGNATURES[self._signature]
        if len(args) > len(params):
            raise TypeError(f"{self._name}.get_allocation takes at most {len(params)} positional "
                            f"arguments ({', '.join(params)}), got {len(args)}")
        values = dict(zip(params, args))
        for key, value in kwargs.items():
            if key not in params:
                raise TypeError(f"{self._name}.get_allocation got an unexpected argument {key!r}; "
                                f"it takes {', '.join(params)}")
            if key in values:
                raise TypeError(f"{self._name}.get_allocation got multiple values for {key!r}")
            values[key] = value
        missing = [p for p in ("unflattened_throughputs", "cluster_spec") if p not in values]
        if missing:
            raise TypeError(f"{self._name}.get_allocation is missing {', '.join(missing)}")
        return values

    @property
    def last_allocation(self) -> AllocoptAllocation | None:
        """The :class:`allocopt.Allocation` of the last solve (status, message, ``extras``; with the
        HiGHS interior point chosen for Gavel's LPs, ``extras["solver_path"]`` says why); None before one."""
        return self._last_allocation

    def _solve(self, problem: Problem, **options: Any) -> Allocation:
        allocation = solve(problem, self._policy, backend=self._backend, solver_options=self._solver_options,
                           **options)
        if self._solver_reason:
            allocation.extras["solver_path"] = self._solver_reason
        self._last_allocation = allocation
        if allocation.status is not Status.OPTIMAL:
            warnings.warn(f"{self._name}: {allocation.message}", AllocoptWarning, stacklevel=3)
        return allocation.to_dict()

    def _update_isolated_time(self, steps: dict | None, jobs: Mapping) -> dict:
        """Gavel's ``_cumulative_isolated_time`` update: steps made since the last call
        over the isolated throughput at that call, in seconds."""
        steps = steps or {}
        for job in jobs:
            total = self._cumulative_isolated_time.setdefault(job, 0.0)
            if (job in steps and job in self._num_steps_remaining_prev_iteration
                    and job in self._isolated_throughputs_prev_iteration):
                made = self._num_steps_remaining_prev_iteration[job] - steps[job]
                self._cumulative_isolated_time[job] = total + made / self._isolated_throughputs_prev_iteration[job]
        return {job: self._cumulative_isolated_time[job] for job in jobs}

    def _remember_isolated_throughputs(self, problem: Problem, steps: dict | None) -> None:
        options = {k: self._options.get(k, d) for k, d in
                   (("heterogeneity_aware", True), ("reference_gpu_type", None), ("space_sharing", False))}
        active = problem.num_steps_remaining > 0
        planned = policy_throughputs(problem, active, **options)
        isolated = isolated_throughputs(problem, planned)
        self._isolated_throughputs_prev_iteration = dict(zip(problem.job_ids, isolated.tolist()))
        self._num_steps_remaining_prev_iteration = dict(steps or {})

    def _allox(self, throughputs: Mapping, values: dict) -> Allocation:
        """AlloX with Gavel's stickiness: jobs that held a whole GPU keep it."""
        spec = values["cluster_spec"]
        types = sorted(spec)
        allocation: Allocation = {job: {t: 0.0 for t in spec} for job in throughputs}
        free = {t: int(spec[t]) for t in types}
        waiting = []
        for job in throughputs:
            prev = self._prev_allocation.get(job)
            if prev is not None and sum(prev.get(t, 0.0) for t in types) == 1.0:
                allocation[job] = dict(prev)
                for t in types:
                    free[t] -= int(prev.get(t, 0.0) == 1.0)
            else:
                waiting.append(job)
        if waiting and sum(free.values()) > 0:
            problem = Problem.from_dicts(
                {job: throughputs[job] for job in waiting}, Cluster(free),
                scale_factors=_current(values.get("scale_factors"), waiting),
                num_steps_remaining=_current(values.get("num_steps_remaining"), waiting),
                time_since_start=_current(values.get("times_since_start"), waiting))
            for job, fractions in self._solve(problem, **self._options).items():
                allocation[job].update({t: f for t, f in fractions.items() if f > 0})
        self._prev_allocation = {job: dict(fractions) for job, fractions in allocation.items()}
        return allocation

    def _fifo(self, throughputs: Mapping, values: dict) -> Allocation:
        """Gavel's base-mode FIFO: jobs keep their worker type until they complete."""
        spec, scale = values["cluster_spec"], values["scale_factors"]
        free = {t: int(spec[t]) for t in spec}
        queue = [job for job in throughputs if job not in self._assignments]
        previous = _sorted(self._assignments)
        if not self._faithful_type_choice:  # the GPUs of every running job first: none is handed out twice
            for job in previous:
                if job in throughputs:
                    free[previous[job]] -= scale[job]
        # Gavel's order: running jobs' GPUs subtracted as they come in id order, so a completed job's GPUs
        # may go to the queue's head while a later running job still holds them (Gavel over-commits)
        for job, worker_type in previous.items():
            del self._assignments[job]
            if job in throughputs:
                self._assignments[job] = worker_type
                if self._faithful_type_choice:
                    free[worker_type] -= scale[job]
            elif queue and scale[queue[0]] <= free[worker_type] and throughputs[queue[0]][worker_type] > 0:
                head = queue.pop(0)  # the completed job's GPUs go to the head of the queue
                self._assignments[head] = worker_type
                free[worker_type] -= scale[head]
        if self._faithful_type_choice:
            self._fifo_as_gavel(queue, throughputs, scale, free)
        else:
            self._fifo_fill(queue, throughputs, scale, free)
        allocation: Allocation = {job: {t: 0.0 for t in spec} for job in throughputs}
        for job, worker_type in self._assignments.items():
            allocation[job][worker_type] = 1.0
        return allocation

    def _fifo_fill(self, queue: list, throughputs: Mapping, scale: Mapping, free: dict) -> None:
        """allocopt's ``fifo`` over the queue and the free GPUs, a type drawn at random among those with room."""
        room = max(free.values(), default=0)  # FIFO stops at the first job that fits on no type
        queue = queue[:next((k for k, job in enumerate(queue) if scale[job] > room), len(queue))]
        if not queue:
            return
        problem = Problem.from_dicts({job: throughputs[job] for job in queue}, _cluster(free),
                                     scale_factors=_current(scale, queue))
        chosen = self._solve(problem, seed=self._rng.randrange(2 ** 32), **self._options)
        for job, fractions in chosen.items():
            self._assignments.update({job: t for t, f in fractions.items() if f > 0})

    def _fifo_as_gavel(self, queue: list, throughputs: Mapping, scale: Mapping, free: dict) -> None:
        """Gavel's base-mode type choice, bug included: the last available type in name order."""
        available = sorted(t for t in free if free[t] > 0)
        while queue and available:
            job = queue.pop(0)
            fitting = [i for i, t in enumerate(available) if free[t] >= scale[job]]
            if not fitting:
                break
            drawn = self._rng.randrange(len(fitting))
            worker_type = available[-1]
            if throughputs[job][worker_type] > 0.0:
                self._assignments[job] = worker_type
                free[worker_type] -= scale[job]
                if free[worker_type] == 0:
                    available.pop(fitting[drawn])

    def _gandiva(self, throughputs: Mapping, pairs: Mapping, pair_keys: Mapping, values: dict) -> Allocation:
        """Gandiva: an even time split over combinations; random pairs kept while they gain."""
        spec, scale = values["cluster_spec"], values["scale_factors"]
        types = sorted(spec)
        singles = list(throughputs)
        by_members = {frozenset(members): members for members in pairs}

        def gain(members: tuple) -> float:
            total = 0.0
            for t in types:
                packed = pairs[members][t]
                for k, job in enumerate(members):
                    if packed[k] <= 0.0:
                        return 0.0
                    total += packed[k] / throughputs[job][t]
            return total

        for job, (combination, other) in list(self._assigned_combinations.items()):
            if (job not in throughputs or (other is not None and other not in throughputs)
                    or other is None or gain(combination) < 1.0):
                self._assigned_combinations.pop(job, None)
                self._assigned_combinations.pop(other, None)
        combinations: list[tuple] = [(job,) for job in singles]
        if sum(scale[job] for job in singles) > sum(spec.values()):
            unassigned = [job for job in singles if job not in self._assigned_combinations]
            for _ in range(len(unassigned)):
                if len(unassigned) < 2:
                    break
                a, b = self._rng.sample(unassigned, 2)
                members = by_members.get(frozenset((a, b)))
                if scale[a] != scale[b] or members is None:  # Gavel fails on a pair it has no throughputs of
                    continue
                unassigned.remove(a)
                unassigned.remove(b)
                self._assigned_combinations[a] = (members, b)
                self._assigned_combinations[b] = (members, a)
            for job in unassigned:
                self._assigned_combinations[job] = ((job,), None)
            combinations = list(dict.fromkeys(c for c, _ in self._assigned_combinations.values()))
        capacity = np.array([spec[t] for t in types], dtype=np.float64)
        allocation: Allocation = {job: {t: 0.0 for t in types} for job in singles}
        allocation.update({pair_keys[members]: {t: 0.0 for t in types} for members in pairs})
        for combination in combinations:
            runs = np.array([all(_tput(throughputs, pairs, combination, t)) for t in types])
            share = np.where(runs, capacity / (len(combinations) * scale[combination[0]]), 0.0)
            share /= max(share.sum(), 1.0)
            key = combination[0] if len(combination) == 1 else pair_keys[combination]
            allocation[key] = dict(zip(types, share.tolist()))
        return allocation


def gavel_program_options(policy_name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options that make the cvxpy backend solve Gavel's policy ``policy_name`` (a key of
    :data:`POLICY_NAMES`) as Gavel's code writes it, given its other ``options``: finish-time fairness as
    one conic program (``method="conic_gavel"``; ``"conic"`` with pairs), the LPs of max-min fairness,
    max-sum throughput and the min-total-duration bisection with ``gavel_program=True``, so a solver such
    as ECOS returns Gavel's point of a degenerate optimum to the last bit."""
    policy, signature, _ = POLICY_NAMES[policy_name]
    packed = bool(options.get("space_sharing"))
    if policy == "finish_time_fairness":
        return {"method": "conic" if packed else "conic_gavel"}
    if not packed and (policy == "max_min_fairness" or options.get("method") == "bisection"
                       or (policy == "max_throughput" and signature in ("unweighted", "cost"))):
        return {"gavel_program": True}
    return {}


def gavel_agnostic_throughputs(throughputs: np.ndarray, gpu_types: list[str]) -> np.ndarray:
    """The throughputs Gavel's heterogeneity-agnostic policies plan with, shape (n_jobs, n_gpu_types),
    steps/s: a type where a job cannot run (0 steps/s) counts at its ``v100`` throughput (1 where that is 0
    or there is no ``v100`` type), so the policy may give it time there, which Gavel's mechanism never
    uses (``faithful_agnostic=True``; the policy itself then plans every type at the V100 speed)."""
    T = np.asarray(throughputs, dtype=np.float64)
    reference = T[:, gpu_types.index("v100")] if "v100" in gpu_types else np.zeros(T.shape[0])
    reference = np.where(reference > 0, reference, 1.0)
    return np.where(T > 0, T, reference[:, None])


def _tput(singles: Mapping, pairs: Mapping, combination: tuple, worker_type: str) -> list[bool]:
    """Whether every member of ``combination`` runs (throughput > 0) on ``worker_type``."""
    if len(combination) == 1:
        return [singles[combination[0]][worker_type] > 0]
    return [v > 0 for v in pairs[combination][worker_type]]


def _sorted(values: Mapping) -> dict:
    """``values`` in job-id order, as Gavel orders jobs (insertion order where ids do not compare)."""
    try:
        return dict(sorted(values.items(), key=lambda item: item[0]))
    except TypeError:
        return dict(values)


def _cluster(spec: Mapping[str, int]) -> Cluster:
    return Cluster({t: int(spec[t]) for t in sorted(spec)})


def _scale(job_type: Hashable) -> Any:
    """The scale factor in a Gavel job-type key ``(model, scale_factor)``."""
    return job_type[1] if isinstance(job_type, tuple) and len(job_type) == 2 else None


def _pair_key(a: Hashable, b: Hashable) -> Hashable:
    """Gavel's ``JobIdPair(a[0], b[0])`` when the ids are Gavel ``JobIdPair`` singletons, else ``(a, b)``."""
    if hasattr(a, "singletons") and hasattr(a, "is_pair"):
        return type(a)(a[0], b[0])
    return (a, b)


def _split_pairs(throughputs: Mapping) -> tuple[dict, dict, dict]:
    """Gavel's throughputs dict holds single jobs (a number per worker type) and, for
    packing policies, pairs (``[tput_a, tput_b]`` per worker type) keyed by a 2-tuple or
    a Gavel ``JobIdPair``. Returns the singles, the pairs keyed ``(a, b)``, and the
    original key of each pair."""
    singles, pairs, keys = {}, {}, {}
    for key, row in throughputs.items():
        if not any(isinstance(v, (list, tuple, np.ndarray)) for v in row.values()):
            singles[key] = row
            continue
        members = tuple(key.singletons()) if hasattr(key, "singletons") else tuple(key)
        pairs[members] = row
        keys[members] = key
    return singles, pairs, keys


def _current(values: Mapping | None, jobs: Any) -> dict | None:
    """Gavel passes per-job dicts that may still hold jobs that have left; keep the current ones
    (a current job missing from ``values`` is reported by Problem.from_dicts)."""
    if values is None:
        return None
    jobs = set(jobs)
    return {job: value for job, value in values.items() if job in jobs}


def _entities(mapping: Mapping | None, jobs: Mapping) -> dict | None:
    """``{entity: [job ids]}`` to ``{job: entity}`` over the current jobs."""
    if mapping is None:
        return None
    entities = {job: entity for entity, members in mapping.items() for job in members if job in jobs}
    missing = [job for job in jobs if job not in entities]
    if missing:
        raise InvalidProblemError(f"entity_to_job_mapping has no entity for job(s) {missing[:5]}",
                                  field="entity_to_job_mapping", job=missing[0])
    return entities


def _deadline_steps(slos: Mapping | None, steps: dict | None, jobs: Mapping) -> dict | None:
    """Steps of the jobs with a deadline; the others' are irrelevant to the policy and set to 0."""
    if not slos:
        return None
    missing = [job for job in slos if job not in (steps or {})]
    if missing:
        raise InvalidProblemError(f"job(s) {missing[:5]} have an SLO but no num_steps_remaining",
                                  field="num_steps_remaining", job=missing[0])
    return {job: steps.get(job, 0.0) for job in jobs}


# HiGHS's interior point without crossover: a point inside the optimal face, as ECOS returns
HIGHS_IPM = {"solver": "ipm", "run_crossover": "off"}
# allocopt policies behind Gavel's LP policies: LPs with many optima, of which ECOS (Gavel's default solver)
# returns a point inside the optimal face; on them the adapter's HiGHS path is HIGHS_IPM
CENTRAL_POINT_POLICIES = frozenset({"max_min_fairness", "max_throughput", "finish_time_fairness", "min_makespan"})
HIGHS_IPM_REASON = ("HiGHS interior point without crossover (highs-simplex: dual simplex): Gavel's LPs have many "
                    "optima and Gavel's mechanism turns different optima into different runs; ECOS, Gavel's solver, "
                    "returns a point inside the optimal face, as this does, where dual simplex returns a vertex "
                    "(docs/how-to/reproduce-gavel.md)")


def highs_options_for(policy: str) -> dict[str, Any]:
    """HiGHS's ``solver_options`` for allocopt ``policy`` standing in for Gavel's: :data:`HIGHS_IPM` for
    :data:`CENTRAL_POINT_POLICIES`, else HiGHS's defaults (a vertex; AlloX's matching needs one)."""
    return dict(HIGHS_IPM) if policy in CENTRAL_POINT_POLICIES else {}


def _backend_for(solver: str | None, policy: str) -> tuple[str, dict[str, Any]]:
    if solver is None or solver == "highs":  # "HIGHS", as Gavel passes cvxpy's names: cvxpy's HiGHS
        return "highs", highs_options_for(policy)
    if solver.lower() in ("highs-ipm", "highs_ipm"):
        return "highs", dict(HIGHS_IPM)
    if solver.lower() in ("highs-simplex", "highs_simplex"):
        return "highs", {}
    if solver in BACKENDS or solver == "auto":
        return solver, {}
    if solver.upper() == "GUROBI":
        return "gurobi", {}
    return "cvxpy", {"solver": solver.upper()}
