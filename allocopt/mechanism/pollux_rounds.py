"""Pollux's rounds in allocopt's simulator: the ``pollux`` policy decides, Sia's job side runs.

:class:`PolluxPlanner` is :class:`~allocopt.mechanism.sia_rounds.SiaPlanner` with
another decision each round: the jobs' speedups over their fair share from the
same goodput models (fitted to each job's own measured step times with
``learn_throughputs``, the batch size re-chosen for every shape), Pollux's
restart factor, the ``pollux`` policy (:func:`allocopt.solve`, exact by default,
``technique="genetic"`` for Pollux's search), then GPU ids on the chosen nodes.
Everything after the decision is SiaPlanner's: restarts pay the application's
checkpoint-restore time, jobs step through the round re-choosing their batch
size (``sia_stepping``), their models are refit from what they measure.

Heterogeneity-unaware (the default, as Pollux; Sia runs Pollux so in its
``multi_simulator_unaware.py``): one speedup per shape from each job's model on
its reference type (the first type it has measurements on, else the cluster's
first type), nodes of every type interchangeable; a job whose replicas land on
several types keeps those on the type where it has most and drops the others,
as Sia's simulator does (``fix_allocations_by_dropping``). Aware: a speedup per
type and one type per job.

``unaware_job_model`` (fidelity field ``sia_unaware_job_model``, on in the ``sia``
preset) gives each job the model Sia's unaware simulator gives it (``Job(h_unaware=True)``):
one throughput model per job, fitted to every step time it measured on any GPU type
(a (nodes, GPUs, micro-batch) point measured on a second type is not recorded again);
the job re-chooses its batch size from that model within the limits of the type it
runs on, and the policy's speedups use it with the batch-size limits of
:data:`SIA_UNAWARE_REFERENCE_TYPE` (Sia's ``aws`` application) up to the application's
largest batch size. Without it each job has a model per type and the policy plans
with the first type it measured, capped at the requested batch size with ``cap_policy_batch``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from allocopt.api import solve
from allocopt.cluster import Cluster
from allocopt.errors import InvalidOptionError
from allocopt.mechanism.fidelity import Fidelity
from allocopt.mechanism.sia_job_steps import sia_optimize
from allocopt.mechanism.sia_round_plan import SiaJobState, SiaRoundPlan, node_shape
from allocopt.mechanism.sia_rounds import SIA_MAX_REPLICAS, SiaPlanner
from allocopt.mechanism.state import SimulationState
from allocopt.pollux_problem import PolluxProblem, pollux_restart_factor
from allocopt.runtime.executor import Lease
from allocopt.solution import Status
from allocopt.throughput.profiles import ApplicationProfile

#: The GPU type whose application limits (initial, largest and micro-batch sizes) Sia's heterogeneity-unaware
#: jobs plan with (``Job.get_speedup_fn`` reads ``applications["aws"]``); where the cluster has no such
#: type, its first type with a profile of the job's application.
SIA_UNAWARE_REFERENCE_TYPE = "aws"

#: Policy options of ``pollux`` the planner passes on to :func:`allocopt.solve`.
POLICY_OPTIONS = ("p", "speedup_scale", "epsilon", "population", "generations", "relaxation_first")


class PolluxPlanner(SiaPlanner):
    """Pollux's rounds (module docstring) as the simulator's ``RoundPlanner``.

    Parameters
    ----------
    state : SimulationState
    profiles : mapping of (application, gpu type) to ApplicationProfile
    round_seconds : float, default 60
    heterogeneity_aware : bool, default False
        A speedup per GPU type (one type per job) instead of Pollux's one per shape.
    restart_delay_s : float, default 30
        The delay in Pollux's restart factor (the restore time a restart actually costs is
        SiaPlanner's ``restore_s``).
    max_nodes : int, default 16
        Most nodes per job (Sia's port of Pollux).
    technique : {"auto", "milp", "genetic"}, default "auto"
    seed : int, default 0
        The genetic search's seed in round 0 (round ``k``: ``seed + k``).
    backend : str, default "highs"
    p : float, default -1
        Exponent of the generalized mean of speedups (option of the ``pollux`` policy).
    virtual_node_gpus : int, optional
        Split every node into nodes of this many GPUs for the policy, as Sia's unaware simulator
        does (4; the default with ``faithful_to_sia`` or a fidelity with ``sia_virtual_nodes``); jobs
        still run on the real nodes.
    unaware_job_model : bool, optional
        One throughput model per job across GPU types, as Sia's unaware simulator's jobs (module
        docstring); default the fidelity's ``sia_unaware_job_model``.
    fidelity : Fidelity, optional
        SiaPlanner's fidelity profile (default allocopt's own model; ``faithful_to_sia``: Sia's).
    **options
        The ``pollux`` policy's other options (``speedup_scale``, ``epsilon``, ``population``,
        ``generations``, ``relaxation_first``) and SiaPlanner's options of the job side
        (``learn_throughputs``, ``sia_stepping``, ``explore_replicas``, ``slowdowns``, ``restore_s``,
        ``round_grid``, ``batch_sizes``, ``cap_policy_batch``, ``faithful_to_sia`` for all of them as
        in Sia's simulator).
    """

    def __init__(self, state: SimulationState, profiles: Mapping[tuple[str, str], ApplicationProfile], *,
                 round_seconds: float = 60.0, heterogeneity_aware: bool = False, restart_delay_s: float = 30.0,
                 max_nodes: int = 16, technique: str = "auto", seed: int = 0, backend: str = "highs",
                 p: float = -1.0, virtual_node_gpus: int | None = None, unaware_job_model: bool | None = None,
                 fidelity: Fidelity | None = None, **options: Any):
        policy = {k: options.pop(k) for k in POLICY_OPTIONS if k in options}
        unknown = sorted(set(options) - JOB_SIDE)
        if unknown:
            raise InvalidOptionError(f"pollux in the simulator has no option(s) {unknown}; its options: "
                                     f"{', '.join(sorted(JOB_SIDE | set(POLICY_OPTIONS) | PLANNER))}")
        super().__init__(state, profiles, round_seconds=round_seconds, backend=backend, fidelity=fidelity, **options)
        self.heterogeneity_aware = bool(heterogeneity_aware)
        self.one_model_per_job = bool(self.fidelity.sia_unaware_job_model if unaware_job_model is None
                                      else unaware_job_model)
        cluster = self.cluster
        if virtual_node_gpus is None and self.fidelity.sia_virtual_nodes and not heterogeneity_aware:
            virtual_node_gpus = int(cluster.gpus_per_node.min())
        if virtual_node_gpus is not None:
            v = int(virtual_node_gpus)
            if heterogeneity_aware or v < 1 or np.any(cluster.capacity % v) or np.any(cluster.gpus_per_node % v):
                raise InvalidOptionError(f"virtual_node_gpus={virtual_node_gpus!r}: give a divisor of every type's GPUs "
                                         "per node and GPU count, with heterogeneity_aware=False")
        self.virtual_node_gpus = None if virtual_node_gpus is None else int(virtual_node_gpus)
        start = np.concatenate([[0], np.cumsum(cluster.capacity)])
        if self.virtual_node_gpus:  # Sia's unaware simulator: every node split into nodes of v GPUs
            v = self.virtual_node_gpus
            self._node_first = np.arange(0, int(cluster.capacity.sum()), v, dtype=np.int64)
            self._node_size = np.full(self._node_first.size, v, dtype=np.int64)
            self._problem_cluster = Cluster({"gpu": int(cluster.capacity.sum())}, gpus_per_node=v)
        else:
            self._node_first = np.concatenate([start[t] + np.arange(cluster.num_nodes[t]) * cluster.gpus_per_node[t]
                                               for t in range(cluster.num_gpu_types)]).astype(np.int64)
            self._node_size = np.concatenate([np.minimum(cluster.gpus_per_node[t], cluster.capacity[t]
                                                         - cluster.gpus_per_node[t] * np.arange(cluster.num_nodes[t]))
                                              for t in range(cluster.num_gpu_types)]).astype(np.int64)
            self._problem_cluster = cluster
        self._node_gpu_type = np.searchsorted(start, self._node_first, side="right") - 1
        self.restart_delay_s = float(restart_delay_s)
        self.max_nodes = int(max_nodes)
        self.technique = technique
        self.seed = int(seed)
        self.policy_options = {"p": float(p), **policy}
        self.backend = backend
        self._population: tuple[list, np.ndarray] | None = None
        self._attained: dict[Hashable, float] = {}  # per job: GPU-seconds leased so far (Pollux's attained service)
        self.fitness: list[float] = []

    def _decide(self, jobs: list[SiaJobState], models: list, epochs: Mapping[Hashable, int], now_s: float,
                round_index: int) -> SiaRoundPlan:
        if not jobs:
            return SiaRoundPlan(round_index, now_s, self.round_seconds, ())
        # Pollux's order of jobs (its genetic search's repair favours earlier jobs; the MILP's ties follow it)
        order = sorted(range(len(jobs)), key=lambda i: (self._attained.get(jobs[i].job_id, 0.0), jobs[i].arrival_s))
        jobs, models = [jobs[i] for i in order], [models[i] for i in order]
        problem = self._problem(jobs, models, epochs)
        options = dict(self.policy_options)
        if self.technique == "genetic":
            options["seed"] = self.seed + round_index
            options["seed_population"] = self._carried([j.job_id for j in jobs])
        started = time.perf_counter()
        alloc = solve(problem, "pollux", backend=self.backend, technique=self.technique, best_effort=True, **options)
        self.solve_seconds.append(time.perf_counter() - started)
        if alloc.status not in (Status.OPTIMAL, Status.APPROXIMATE):
            raise RuntimeError(f"pollux: round {round_index} ended {alloc.status.value}: {alloc.message}")
        if "population" in alloc.extras:
            self._population = ([j.job_id for j in jobs], alloc.extras["population"])
        self.fitness.append(float(alloc.objective))
        plan = self._leases(jobs, np.array(alloc.replicas), round_index, now_s)
        held = {job.job_id: self._attained.get(job.job_id, 0.0) for job in jobs}
        for lease in plan.leases:
            held[lease.job_id] += len(lease.gpu_ids) * self.round_seconds
        self._attained = held
        return plan

    # ----- the round's problem ------------------------------------------------------------
    def _problem(self, jobs: Sequence[SiaJobState], models: list, epochs: Mapping[Hashable, int]) -> PolluxProblem:
        cluster = self.cluster
        n, k = len(jobs), cluster.num_gpu_types
        fair = math.ceil(int(cluster.capacity.sum()) / n)
        caps = [self._cap(job) for job in jobs]
        R = max(caps)
        columns = k if self.heterogeneity_aware else 1
        S = np.zeros((n, columns, 2, R + 1))
        largest = cluster.gpus_per_node if self.virtual_node_gpus is None else \
            np.full(cluster.num_gpu_types, self.virtual_node_gpus)
        for i, job in enumerate(jobs):
            r = np.arange(1, caps[i] + 1)
            reference = self._reference_type(job)
            base_model = self._goodput_model(job, reference, models[i], epochs)
            if base_model is None:  # no model yet: Sia's unaware fallback speedup r / fair share
                S[i, :, 0, 1:caps[i] + 1] = np.where(r <= largest.max(), r / fair, 0.0)
                S[i, :, 1, 2:caps[i] + 1] = r[1:] / fair
                continue
            base = float(self._goodput(base_model, np.array([1.0]), np.array([float(fair)]))[0])
            if not (np.isfinite(base) and base > 0):  # the fair share is outside the model's range
                base = float(self._goodput(base_model, np.array([1.0]), np.array([1.0]))[0]) * fair
            for c in range(columns):
                t = c if self.heterogeneity_aware else reference
                model = base_model if t == reference else self._goodput_model(job, t, models[i], epochs)
                if model is None:
                    continue
                size = int(largest[t] if self.heterogeneity_aware else largest.max())
                one = r[r <= size].astype(np.float64)
                if one.size:
                    S[i, c, 0, one.astype(int)] = self._goodput(model, np.ones_like(one), one) / base
                several = r[r >= 2].astype(np.float64)
                if several.size:
                    S[i, c, 1, several.astype(int)] = self._goodput(model, np.full_like(several, 2.0), several) / base
        S = np.where(np.isfinite(S) & (S > 0), S, 0.0)
        previous = np.zeros((n, self._node_first.size), dtype=np.int64)
        for i, job in enumerate(jobs):
            for g in self._gpu_ids.get(job.job_id, ()):
                previous[i, self._node_of(g)] += 1
        age = np.array([job.age_s for job in jobs])
        restarts = np.array([job.num_restarts for job in jobs])
        return PolluxProblem(S, self._problem_cluster, job_ids=[job.job_id for job in jobs], previous=previous,
                             restart_factor=pollux_restart_factor(age, restarts, self.restart_delay_s),
                             max_nodes=self.max_nodes)

    def _goodput(self, model: Any, nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
        """Goodputs of ``model`` at (nodes, replicas), batch size chosen for each; with ``sia_stepping`` in the
        arithmetic of Sia's simulator (:func:`~allocopt.mechanism.sia_job_steps.sia_optimize`, float64: Sia's
        Pollux passes its counts as integers)."""
        if self.sia_stepping:
            return sia_optimize(model, nodes, replicas)[0]
        return np.asarray(model.optimize(nodes, replicas)[0], dtype=np.float64)

    def _cap(self, job: SiaJobState) -> int:
        """Most replicas of ``job``: SiaPlanner's cap; with virtual nodes also the smallest type's GPUs
        (Sia's unaware simulator, whose jobs must fit on one type)."""
        if self.explore_replicas:
            cap = self._replica_cap(job)
        else:
            profile = self._any_profile(job.application)
            cap = max(1, min(SIA_MAX_REPLICAS, profile.max_batch_size // profile.min_local_bsz))
        if self.virtual_node_gpus:
            cap = min(cap, int(self.cluster.capacity.min()))
        return cap

    def _reference_type(self, job: SiaJobState) -> int:
        """The type whose speedups an unaware policy plans with: the first type the job measured (with
        ``one_model_per_job``: :data:`SIA_UNAWARE_REFERENCE_TYPE`), else the first type with a profile."""
        names = self.cluster.gpu_types
        profiled = [t for t, name in enumerate(names) if (job.application, name) in self.profiles]
        if self.one_model_per_job:
            return next((t for t in profiled if names[t] == SIA_UNAWARE_REFERENCE_TYPE), profiled[0])
        known = [t for t in range(self.cluster.num_gpu_types) if (job.job_id, t) in self._learned]
        return known[0] if known else profiled[0]

    def _goodput_model(self, job: SiaJobState, t: int, models: list, epochs: Mapping[Hashable, int]) -> Any:
        if not self.learn_throughputs:
            return models[t]
        if self._model_key(job.job_id, t) not in self._learned:
            return None
        return self._learned_model(job.job_id, t, epochs[job.job_id], policy=True)

    def _node_of(self, gpu_id: int) -> int:
        return int(np.searchsorted(self._node_first, gpu_id, side="right")) - 1

    def _carried(self, job_ids: list) -> np.ndarray | None:
        if self._population is None:
            return None
        before, states = self._population
        at = {job: i for i, job in enumerate(before)}
        out = np.zeros((states.shape[0], len(job_ids), states.shape[2]), dtype=np.int64)
        for i, job in enumerate(job_ids):
            if job in at:
                out[:, i] = states[:, at[job]]
        return out

    # ----- from replicas per node to leases ------------------------------------------------
    def _leases(self, jobs: Sequence[SiaJobState], replicas: np.ndarray, round_index: int,
                now_s: float) -> SiaRoundPlan:
        cluster = self.cluster
        node_type = self._node_gpu_type
        # a job on several types keeps its replicas on the type where it has most (Sia: the others dropped)
        for i in range(len(jobs)):
            per_type = np.bincount(node_type, replicas[i], minlength=cluster.num_gpu_types)
            if np.count_nonzero(per_type) > 1:
                replicas[i, node_type != int(np.argmax(per_type))] = 0
        node_first, node_size = self._node_first, self._node_size
        taken = np.zeros(int(cluster.capacity.sum()), dtype=bool)
        gpus: dict[Hashable, tuple[int, ...]] = {}
        keep = []
        for i, job in enumerate(jobs):  # jobs whose replicas per node are unchanged keep their GPU ids
            before = self._gpu_ids.get(job.job_id, ())
            counts = np.bincount([self._node_of(g) for g in before], minlength=replicas.shape[1]) if before else None
            if counts is not None and np.array_equal(counts, replicas[i]):
                gpus[job.job_id] = tuple(sorted(before))
                taken[list(before)] = True
                keep.append(i)
        for i, job in enumerate(jobs):
            if i in keep or not replicas[i].any():
                continue
            ids = []
            for node in np.flatnonzero(replicas[i]):
                slots = node_first[node] + np.arange(node_size[node])
                free = slots[~taken[slots]][:replicas[i, node]]
                taken[free] = True
                ids.extend(free.tolist())
            gpus[job.job_id] = tuple(sorted(ids))
        names = cluster.gpu_types
        leases, delays, configuration, stop = [], {}, {}, []
        for job in jobs:
            ids = gpus.get(job.job_id)
            before = tuple(sorted(self._gpu_ids.get(job.job_id, ())))
            if ids is None:
                configuration[job.job_id] = -1
                if before:
                    stop.append(job.job_id)
                continue
            t, shape = node_shape(cluster, ids)
            configuration[job.job_id] = self._configuration_index(t, sum(shape))
            # as Sia's Job.reallocate (SiaPlanner's packed_placement): same type and GPUs per node, no restart
            extended = ids == before or (bool(self.options.get("packed_placement")) and bool(before)
                                         and node_shape(cluster, ids) == node_shape(cluster, before))
            if not extended:
                delays[job.job_id] = job.restart_delay_s if job.restore_s is None else job.restore_s
            leases.append(Lease(job.job_id, names[t], ids, float(self.round_seconds), extended=extended))
        return SiaRoundPlan(round_index, now_s, self.round_seconds, tuple(leases), tuple(stop),
                            configuration=configuration, restore_delay_s=delays)

    def _configuration_index(self, t: int, count: int) -> int:
        """An index of Sia's configuration set for the job state's ``previous`` (>= 0: running)."""
        configs = self.configurations
        match = np.flatnonzero((configs.gpu_type == t) & (configs.num_gpus == count))
        return int(match[0]) if match.size else int(np.flatnonzero(configs.gpu_type == t)[0])


#: SiaPlanner's options of the job side that PolluxPlanner passes on.
JOB_SIDE = {"explore_replicas", "slowdowns", "restore_s", "learn_throughputs", "round_grid", "sia_stepping",
            "batch_sizes", "cap_policy_batch", "faithful_to_sia"}
PLANNER = {"heterogeneity_aware", "restart_delay_s", "max_nodes", "technique", "seed", "virtual_node_gpus",
           "unaware_job_model"}
