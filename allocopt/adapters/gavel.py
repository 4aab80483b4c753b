"""Drop-in replacement for Gavel's policy objects.

``get_policy(name, solver=None)`` returns an object whose ``get_allocation``
takes the argument lists of the Gavel policy of that name (nested dicts keyed
by job id and worker type) and returns ``{job_id: {worker_type: fraction}}``,
computed by allocopt. Job ids may be any hashable. Packing (``*_packed``)
policies and ``gandiva`` read pairs from the same throughputs dict: a key
that is a 2-tuple of job ids (or a Gavel ``JobIdPair``) whose values are
``[tput_a, tput_b]`` per worker type; their time fractions come back under
the same key. Every name of :data:`POLICY_NAMES` is implemented.

``solver`` accepts an allocopt backend name (``"highs"``, ``"gurobi"``, ...)
or a cvxpy solver name as Gavel passes them (``"ECOS"``, ``"SCS"``, ...), which
runs through the ``cvxpy`` backend with that solver; ``"GUROBI"`` uses the
native Gurobi backend. None means HiGHS.

Differences from Gavel, by design: ``isolated`` caps each job's share at 1
instead of rescaling every row by the largest row sum (see
:mod:`allocopt.formulations.shares`); when SLOs cannot all be met the
``*_SLOs`` policy minimizes the total deadline shortfall (with a warning)
instead of silently dropping every SLO; ``min_total_duration*`` is one exact
LP instead of a bisection that stops within 5%; water-filling detects
bottlenecks exactly instead of with a MILP and a 1.0001 slack; the baselines
(``fifo``, ``gandiva``, ``allox``) keep no state between calls. As in Gavel's
``FinishTimeFairnessPolicyWithPerf``, ``times_since_start`` also stands for
the time a job would have needed so far under its isolated share.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from allocopt.api import solve
from allocopt.backends import BACKENDS
from allocopt.cluster import Cluster
from allocopt.errors import AllocoptWarning, InvalidProblemError, UnknownPolicyError
from allocopt.problem import Problem
from allocopt.solution import Status

NestedDict = Mapping[Hashable, Mapping[str, float]]


class GavelPolicy:
    """A Gavel-compatible policy object; see :func:`get_policy`."""

    def __init__(self, name: str, policy: str, signature: str, solver: str | None,
                 options: dict[str, Any] | None = None):
        self._name = name
        self._policy = policy
        self._signature = signature
        self._options = {k: v for k, v in (options or {}).items() if v is not None}
        self._backend, self._solver_options = _backend_for(solver)

    @property
    def name(self) -> str:
        """Gavel's name of the policy."""
        return self._name

    def get_allocation(self, *args: Any, **kwargs: Any) -> dict[Hashable, dict[str, float]] | None:
        """Gavel's ``get_allocation``; the accepted arguments depend on the policy name
        (see :data:`SIGNATURES`)."""
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
        throughputs, pairs, pair_keys = _split_pairs(values["unflattened_throughputs"])
        if not throughputs:
            return None
        if values.get("return_effective_throughputs"):
            raise TypeError(f"{self._name}: return_effective_throughputs=True is not supported; "
                            "allocopt.solve(...).extras['levels'] holds each job's normalized level")
        try:  # Gavel orders jobs by id (fifo inside entities takes the lowest id first)
            throughputs = dict(sorted(throughputs.items()))
        except TypeError:
            pass
        cluster_spec = values["cluster_spec"]
        cluster = Cluster({t: cluster_spec[t] for t in sorted(cluster_spec)})
        slos = values.get("SLOs") or None
        steps = _current(values.get("num_steps_remaining"), throughputs)
        if "SLOs" in params:  # Gavel's SLO policy needs the steps of the jobs with a deadline only
            steps = _deadline_steps(slos, steps, throughputs)
        started = _current(values.get("times_since_start"), throughputs)
        problem = Problem.from_dicts(
            throughputs, cluster,
            scale_factors=values.get("scale_factors"),
            priority_weights=values.get("unflattened_priority_weights"),
            costs=values.get("instance_costs"),
            num_steps_remaining=steps,
            time_since_start=started, time_isolated=started,
            slos=slos, pair_throughputs=pairs or None,
            entities=_entities(values.get("entity_to_job_mapping"), throughputs),
            entity_weights=values.get("entity_weights"))
        options = dict(self._options)
        if "instance_costs" in params and values.get("instance_costs") is None:
            options.pop("normalize_by_cost", None)
        allocation = solve(problem, self._policy, backend=self._backend, solver_options=self._solver_options,
                           best_effort=slos is not None, **options)
        if allocation.status is not Status.OPTIMAL:
            warnings.warn(f"{self._name}: {allocation.message}", AllocoptWarning, stacklevel=2)
        return {pair_keys.get(key, key): fractions for key, fractions in allocation.to_dict().items()}


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


def _current(values: Mapping | None, jobs: Mapping) -> dict | None:
    """Gavel passes per-job dicts that may still hold jobs that have left; keep the current ones
    (a current job missing from ``values`` is reported by Problem.from_dicts)."""
    if values is None:
        return None
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


def _backend_for(solver: str | None) -> tuple[str, dict[str, Any]]:
    if solver is None:
        return "highs", {}
    if solver in BACKENDS or solver == "auto":
        return solver, {}
    if solver.upper() == "GUROBI":
        return "gurobi", {}
    return "cvxpy", {"solver": solver.upper()}


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
    "gandiva": ("gandiva", "unweighted", {}),
    "allox": ("allox", "allox", {}),
    "max_min_fairness_water_filling": ("water_filling", "water_filling", {"heterogeneity_aware": False}),
    "max_min_fairness_water_filling_perf": ("water_filling", "water_filling", {}),
    "max_min_fairness_water_filling_packed": ("water_filling", "water_filling", _PACKED),
}


def get_policy(name: str, solver: str | None = None,
               priority_reweighting_policies: Mapping[Hashable, str] | None = None) -> GavelPolicy:
    """The allocopt implementation of Gavel's policy ``name``.

    ``priority_reweighting_policies`` (``{entity: "fairness" | "fifo"}``) is the
    water-filling policies' constructor argument."""
    if name not in POLICY_NAMES:
        raise UnknownPolicyError(f"unknown Gavel policy {name!r}; allocopt implements "
                                 f"{', '.join(sorted(POLICY_NAMES))}")
    policy, signature, options = POLICY_NAMES[name]
    if priority_reweighting_policies is not None:
        if policy != "water_filling":
            raise TypeError(f"priority_reweighting_policies only applies to the water-filling policies, not {name!r}")
        options = {**options, "entity_policies": dict(priority_reweighting_policies)}
    return GavelPolicy(name, policy, signature, solver, options)
