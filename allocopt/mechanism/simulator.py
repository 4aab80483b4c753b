"""Trace-driven simulation of a scheduling policy on a GPU cluster.

The loop is the one a real deployment runs: jobs arrive, a :class:`RoundPlanner`
turns the current jobs into a :class:`~allocopt.runtime.executor.RoundPlan`,
an :class:`~allocopt.runtime.executor.Executor` runs it (here the
:class:`~allocopt.runtime.simulated.SimulatedExecutor`, in simulated time),
and the results update each job's progress. :class:`PriorityPlanner` is
Gavel's planner (recompute the allocation with :func:`allocopt.solve` when jobs
arrive or leave, at most every ``recompute_min_seconds``; priorities;
placement). Another planner (e.g. Sia-style configuration rounds) plugs in by
implementing :class:`RoundPlanner`. ``mode="ideal"`` applies the fractional
allocation directly, without rounds, to measure the mechanism's overhead.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike
from typing import TYPE_CHECKING, Any, Protocol, overload

import numpy as np

from allocopt.allocation import Allocation
from allocopt.api import solve
from allocopt.cluster import Cluster
from allocopt.errors import AllocoptError, InvalidOptionError, InvalidProblemError
from allocopt.extras import require_extra
from allocopt.formulations import POLICIES
from allocopt.formulations.shares import isolated_shares
from allocopt.jsonio import JsonSource, document_or_write, read_json
from allocopt.mechanism.admission import AdmissionPolicy, AdmissionQueue, admission_policy
from allocopt.mechanism.capacity import CapacitySchedule, capacity_schedule, remap_held
from allocopt.mechanism.order_planner import OrderOptions, OrderPlanner
from allocopt.mechanism.order_policies import OrderPolicy, order_policy
from allocopt.mechanism.fidelity import FIDELITY_PROFILES, Fidelity, resolve_fidelity
from allocopt.mechanism.placement import GpuLayout, place_arrays
from allocopt.mechanism.placement_policies import PlacementPolicy, placement_policy
from allocopt.mechanism.priority import MechanismOptions, PriorityMechanism
from allocopt.mechanism.sia_rounds import SiaExecutor, SiaPlanner, rigid_throughputs, sia_workload
from allocopt.mechanism.sia_workloads import SiaWorkloadJob, read_sia_workload
from allocopt.mechanism.state import SimulationState
from allocopt.mechanism.tenants import Tenants, resolve_tenants, tenant_metrics
from allocopt.mechanism.workload import Workload, read_gavel_trace
from allocopt.problem import Problem
from allocopt.runtime.executor import Executor, JobRoundResult, Lease, RoundOutcome, RoundPlan
from allocopt.runtime.simulated import SimulatedExecutor
from allocopt.throughput.profiles import load_profiles
from allocopt.throughput.table import ThroughputTable

if TYPE_CHECKING:
    from allocopt.formulations.gavel_policies import GavelPolicy

#: Policies that, given Sia application ``profiles``, run on Sia's job side with their own decision each round
#: (:class:`~allocopt.mechanism.sia_rounds.SiaPlanner` and its subclasses).
GOODPUT_POLICIES = ("sia", "pollux", "optimus")


class SimulationError(AllocoptError, RuntimeError):
    """The simulation cannot make progress (e.g. jobs no planner ever schedules)."""


def resolve_policy(name: str, options: Mapping[str, Any] | None = None,
                   backend: str | None = None, fidelity: Fidelity | None = None) -> tuple[str, dict[str, Any], bool]:
    """An allocopt or Gavel policy name -> (allocopt policy, options, heterogeneity-agnostic).

    Under a Gavel name, ``fidelity`` (default: the ``"allocopt"`` preset) chooses Gavel's solver paths:
    ``min_total_duration_bisection``: ``min_total_duration*`` bisects as Gavel's code does
    (``method="bisection"``; ``method="lp"``: allocopt's exact LP); ``highs_interior_point``: with
    ``backend="highs"`` and no ``solver_options``, Gavel's LP policies
    (:data:`~allocopt.formulations.gavel_policies.CENTRAL_POINT_POLICIES`) get HiGHS's interior point
    without crossover, as the Gavel adapter's HiGHS path; ``gavel_programs``: with ``backend="cvxpy"``,
    Gavel's programs as Gavel writes them
    (:func:`~allocopt.formulations.gavel_policies.gavel_program_options`).

    Gavel names map through :data:`~allocopt.formulations.gavel_policies.POLICY_NAMES`; like
    Gavel, their types are visited in random order unless Gavel's class name
    contains ``Perf`` or ``Packing`` (``gandiva``'s is ``Gandiva_Packing``,
    ``allox``'s ``AlloX_Perf``). A name of both (``max_min_fairness``, ``isolated``,
    ``fifo``, ...) is allocopt's; prefix ``gavel:`` for Gavel's meaning
    (``gavel:max_min_fairness`` is heterogeneity-agnostic). An allocopt policy
    is agnostic when its ``heterogeneity_aware`` option is False.
    """
    from allocopt.formulations.gavel_policies import (CENTRAL_POINT_POLICIES, GAVEL_CLASS_NAMES, POLICY_NAMES,
                                                      gavel_program_options, highs_options_for)

    fidelity = fidelity or FIDELITY_PROFILES["allocopt"]
    extra = dict(options or {})
    gavel_name = name.removeprefix("gavel:")
    if name in POLICIES and gavel_name == name:
        merged = {**POLICIES[name].options, **extra}
        policy, agnostic = name, merged.get("heterogeneity_aware", True) is False
    elif gavel_name in POLICY_NAMES:
        policy, _, gavel_options = POLICY_NAMES[gavel_name]
        merged = {**POLICIES[policy].options, **gavel_options, **extra}
        extra = {**gavel_options, **extra}
        agnostic = not any(tag in GAVEL_CLASS_NAMES[gavel_name] for tag in ("Perf", "Packing"))
        if policy == "min_makespan" and fidelity.min_total_duration_bisection:  # Gavel's search, to 5%
            extra.setdefault("method", "bisection")
        if (backend == "highs" and fidelity.highs_interior_point and "solver_options" not in extra
                and policy in CENTRAL_POINT_POLICIES):
            extra["solver_options"] = highs_options_for(policy)
        if backend == "cvxpy" and fidelity.gavel_programs:
            extra = {**gavel_program_options(gavel_name, {**gavel_options, **extra}), **extra}
    else:
        raise InvalidOptionError(f"unknown policy {name!r}; allocopt policies: {', '.join(sorted(POLICIES))}; "
                                 f"Gavel names: {', '.join(sorted(POLICY_NAMES))}")
    if POLICIES[policy].problem_type is not Problem:
        raise InvalidOptionError(f"policy {name!r} allocates configurations, not time fractions; the "
                                 "priority-round simulator needs a policy over an allocopt.Problem")
    return policy, extra, agnostic


def _faithful_agnostic(name: str, options: dict[str, Any], default: bool = False) -> bool:
    """Pop ``faithful_agnostic`` from ``options`` (:func:`resolve_policy`'s): True plans Gavel's
    heterogeneity-agnostic policies (``gavel:max_min_fairness``, ``gavel:finish_time_fairness``,
    ``gavel:min_total_duration``, ...) as Gavel's code does, on every GPU type at the job's V100
    speed, also a type where the job cannot run (that time is then lost: the mechanism never runs
    a job where its throughput is 0); allocopt never plans such time. Without the option:
    ``default`` (the fidelity's ``agnostic_on_every_type``) where ``name`` is such a policy."""
    from allocopt.formulations.gavel_policies import POLICY_NAMES

    if "faithful_agnostic" not in options:
        gavel_name = name.removeprefix("gavel:")
        return default and (gavel_name != name or name not in POLICIES) and gavel_name in POLICY_NAMES \
            and POLICY_NAMES[gavel_name][2].get("heterogeneity_aware", True) is False
    faithful = options.pop("faithful_agnostic")
    if not isinstance(faithful, bool):
        raise InvalidOptionError(f"faithful_agnostic must be True or False, got {faithful!r}")
    gavel_name = name.removeprefix("gavel:")
    agnostic = (gavel_name != name or name not in POLICIES) and gavel_name in POLICY_NAMES \
        and POLICY_NAMES[gavel_name][2].get("heterogeneity_aware", True) is False
    if faithful and not agnostic:
        raise InvalidOptionError(f"faithful_agnostic only applies to Gavel's heterogeneity-agnostic policies "
                                 f"(gavel:max_min_fairness, gavel:finish_time_fairness, gavel:min_total_duration, "
                                 f"...), not {name!r}")
    return faithful


def gavel_policy_for(name: str, options: Mapping[str, Any], backend: str, seed: int,
                     fidelity: Fidelity | None = None) -> GavelPolicy | None:
    """Gavel's policy object (:class:`~allocopt.formulations.gavel_policies.GavelPolicy`, as the Gavel
    adapter's) for ``gavel:NAME`` when Gavel's policy keeps state between calls
    (:data:`~allocopt.formulations.gavel_policies.STATEFUL_POLICIES`: ``fifo``, ``gandiva``, ``allox``),
    else None. ``fidelity`` (default: the ``"allocopt"`` preset): ``fifo_type_choice`` gives ``gavel:fifo``
    Gavel's worker-type choice (else a seeded random type among those with room).

    ``seed`` seeds its random choices as Gavel's ``--seed`` seeds the policy's;
    ``options`` (:func:`resolve_policy`'s) may hold the object's flags
    (``faithful_type_choice``, ``alpha``), ``solver_options`` (``{"solver": ...}``
    with the cvxpy backend) and ``space_sharing`` (Gandiva's, always on).
    """
    from allocopt.formulations.gavel_policies import STATEFUL_POLICIES, GavelPolicy

    gavel_name = name.removeprefix("gavel:")
    if gavel_name == name or gavel_name not in STATEFUL_POLICIES:
        return None
    flags = dict(STATEFUL_POLICIES[gavel_name])
    if gavel_name == "fifo":
        flags["faithful_type_choice"] = (fidelity or FIDELITY_PROFILES["allocopt"]).fifo_type_choice
    unknown = []
    for key, value in options.items():
        if key in ("faithful_type_choice", "alpha"):
            flags[key] = value
        elif key not in ("solver_options", "space_sharing"):
            unknown.append(key)
    if unknown or options.get("space_sharing", gavel_name == "gandiva") != (gavel_name == "gandiva"):
        raise InvalidOptionError(f"policy {name!r} runs Gavel's policy object, which takes the options "
                                 f"faithful_type_choice (fifo), alpha (allox) and solver_options; got "
                                 f"{', '.join(sorted(options))}")
    solver = dict(options.get("solver_options") or {}).get("solver") if backend == "cvxpy" else backend
    return GavelPolicy(gavel_name, solver or backend, seed, **flags)


class RoundPlanner(Protocol):
    """What decides each round: the seam between the simulator loop and a scheduling mechanism.

    ``plan`` sees the state (active jobs, remaining steps) and returns the
    leases of the round starting at ``now_s``; ``observe`` receives what the
    executor did. ``solve_seconds`` lists the wall-clock seconds of every
    allocation computed so far (for the metrics). A planner with a
    ``round_grid_s`` attribute (seconds, not None) has its rounds start only at
    multiples of it (Sia's simulator); otherwise a round starts when a job
    arrives at an idle cluster.
    """

    solve_seconds: list[float]

    def plan(self, state: SimulationState, now_s: float, round_index: int) -> RoundPlan: ...

    def observe(self, plan: RoundPlan, results: Sequence[JobRoundResult]) -> None: ...


@dataclass(frozen=True)
class RoundLeases:
    """A round's leases as arrays, one row per lease (a co-located pair: a row per member).

    Attributes
    ----------
    jobs : ndarray of int of shape (m,)
        Job (row) of each lease.
    gpu_types : ndarray of int of shape (m,)
        Type (column index) each runs on.
    entries : ndarray of int of shape (m,)
        Placement each lease holds: leases of co-located jobs share one.
    partners : ndarray of int of shape (m,)
        The job sharing the GPUs (-1: none).
    max_steps : ndarray of int of shape (m,)
        Steps each job may run (its remaining steps).
    extended : ndarray of bool of shape (m,)
        The job keeps last round's GPUs.
    gpu_ids : ndarray of int
        GPU ids of every placement, concatenated.
    gpu_start : ndarray of int of shape (n_entries + 1,)
        Placement ``e`` holds ``gpu_ids[gpu_start[e]:gpu_start[e + 1]]``.
    stop : ndarray of int
        Jobs that held GPUs last round and hold none now.
    """

    jobs: np.ndarray
    gpu_types: np.ndarray
    entries: np.ndarray
    partners: np.ndarray
    max_steps: np.ndarray
    extended: np.ndarray
    gpu_ids: np.ndarray
    gpu_start: np.ndarray
    stop: np.ndarray

    def to_plan(self, round_index: int, start_s: float, round_seconds: float, gpu_types: Sequence[str]) -> RoundPlan:
        """The :class:`~allocopt.runtime.executor.RoundPlan` any executor runs."""
        ids, bounds = self.gpu_ids.tolist(), self.gpu_start.tolist()
        held = [tuple(ids[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        leases = tuple(Lease(job, gpu_types[t], held[e], round_seconds, max_steps=steps, extended=ext,
                             co_located_with=None if partner < 0 else partner)
                       for job, t, e, partner, steps, ext in zip(
                           self.jobs.tolist(), self.gpu_types.tolist(), self.entries.tolist(),
                           self.partners.tolist(), self.max_steps.tolist(), self.extended.tolist()))
        return RoundPlan(round_index, start_s, round_seconds, leases, tuple(self.stop.tolist()))


class PriorityPlanner:
    """Gavel's planner: allocation by :func:`allocopt.solve`, priorities, greedy selection, placement.

    Under space sharing (policy option ``space_sharing=True``) every pair of
    active jobs with equal scale factors and a measured co-located throughput
    (:meth:`SimulationState.pairs`) is a candidate; the allocation gives pairs
    their own time fractions, the mechanism walks jobs and pairs together
    (:meth:`~allocopt.mechanism.priority.PriorityMechanism.select_with_pairs`)
    and a pair that runs holds its scale factor's GPUs once, with a lease for
    each member (``co_located_with``) progressing at its pair throughput
    (:meth:`pair_throughput`).

    The round is planned as arrays (:meth:`plan_leases`, :meth:`observe_leases`);
    :meth:`plan` and :meth:`observe` give and take the lease objects any
    :class:`~allocopt.runtime.executor.Executor` runs.

    Parameters
    ----------
    state : SimulationState
    policy : str
        allocopt policy name.
    policy_options : mapping
        Options passed to :func:`allocopt.solve`.
    options : MechanismOptions
    backend : str, default "highs"
    placement : PlacementPolicy, optional
        Where the selected jobs get their GPUs (:mod:`allocopt.mechanism.placement_policies`; default:
        :func:`~allocopt.mechanism.placement.place_arrays`, best fit); one that may defer a job is refused.
    gavel_policy : allocopt.adapters.gavel.GavelPolicy, optional
        Compute each allocation with this Gavel policy object instead of
        :func:`allocopt.solve`: one object for the whole simulation, so the
        state Gavel's policy keeps between calls (FIFO's job types, Gandiva's
        pairs and random generator, AlloX's running jobs) carries over as in
        Gavel's simulator (:func:`gavel_policy_for`).
    """

    def __init__(self, state: SimulationState, policy: str, policy_options: Mapping[str, Any],
                 options: MechanismOptions, backend: str = "highs", gavel_policy: GavelPolicy | None = None,
                 placement: PlacementPolicy | None = None):
        self.policy, self.policy_options, self.backend = policy, dict(policy_options), backend
        if placement is not None and getattr(placement, "may_defer", False):
            raise InvalidOptionError(f"placement {placement.name!r} may leave a job waiting for free servers; it runs "
                                     "with order-based policies (las, tiresias, srtf, ...), not with the priority "
                                     "mechanism of allocation policies")
        self.placement = placement
        self.gavel_policy = gavel_policy
        self.options = options
        self.space_sharing = bool(self.policy_options.get("space_sharing"))
        if self.space_sharing and state.table is None:
            raise InvalidOptionError(f"policy {policy!r} with space_sharing=True needs co-located pair throughputs "
                                     "from a ThroughputTable (Gavel traces); this workload has none")
        cluster = state.cluster
        self.mechanism = PriorityMechanism(state.throughputs, state.workload.scale_factors, cluster.capacity,
                                           cluster.gpu_types, options)
        self.layout = GpuLayout(cluster)
        self.solve_seconds: list[float] = []
        n = state.workload.num_jobs
        self._known = np.zeros(n, dtype=bool)
        # last round's placements: a job alone -> its slice of _held_ids (count 0: none); a pair -> its slice
        self._held_ids = np.zeros(0, dtype=np.int64)
        self._held_start = np.zeros(n, dtype=np.int64)
        self._held_count = np.zeros(n, dtype=np.int64)
        self._held_pairs: dict[tuple[int, int], tuple[int, int]] = {}
        self._allocation: Allocation | None = None  # the last one: the next solve starts from its basis
        self._idle = False  # the last plan ran nothing
        self._pair_of: dict[int, int] = {}  # co-located job this round -> row of mechanism.pairs
        self._last: RoundLeases | None = None
        self._cluster_changed = False  # recompute at the next round, whatever the throttle
        if state.tenants is not None and state.tenants.has_quotas:
            self.mechanism.set_quotas(state.tenant_of, state.tenants.gpu_quotas)

    def set_cluster(self, state: SimulationState, cluster: Cluster) -> None:
        """The cluster changed (:mod:`allocopt.mechanism.capacity`): renumber last round's GPUs, drop the
        placements of jobs that held GPUs which left (they are placed anew), recompute at the next round."""
        layout = GpuLayout(cluster)
        ids, lost = remap_held(self.layout, layout, self._held_ids, self._held_start, self._held_count)
        self._held_ids, self.layout = ids, layout
        self._held_count[lost] = 0
        self._held_pairs = {key: (a, c) for key, (a, c) in self._held_pairs.items() if (ids[a:a + c] >= 0).all()}
        self.mechanism.capacity = cluster.capacity.astype(np.int64)
        if self.gavel_policy is not None:  # Gavel's FIFO keeps a job on its type: a preempted one queues again
            self.gavel_policy.release(np.flatnonzero(lost).tolist())
        self._cluster_changed = True

    def plan(self, state: SimulationState, now_s: float, round_index: int) -> RoundPlan:
        leases = self.plan_leases(state, now_s)
        return leases.to_plan(round_index, now_s, self.options.round_seconds, state.cluster.gpu_types)

    def plan_leases(self, state: SimulationState, now_s: float) -> RoundLeases:
        """The leases of the round starting at ``now_s``, as arrays."""
        known_now = state.active
        arrived = np.flatnonzero(known_now & ~self._known)
        left = np.flatnonzero(~known_now & self._known)
        self.mechanism.add_jobs(arrived)
        self.mechanism.remove_jobs(left)
        self._known = known_now.copy()
        rows = state.active_rows()
        # Gavel lifts the recompute throttle when nothing ran and no job is left to arrive
        stalled = self._idle and not (~state.active & (state.remaining_steps > 0)).any()
        if state.changed and rows.size and (stalled or self._cluster_changed or self.mechanism.recompute_due(now_s)):
            self._recompute(state, rows, now_s)
            self._cluster_changed = False
        sizes = state.workload.scale_factors
        if self.space_sharing:
            chosen, pair_index, pair_types = self.mechanism.select_with_pairs(rows)
            pairs = self.mechanism.pairs[pair_index]
        else:
            chosen = self.mechanism.select(rows)
            pair_index = pair_types = np.zeros(0, dtype=np.int64)
            pairs = np.zeros((0, 2), dtype=np.int64)
        run = chosen >= 0
        jobs, types = rows[run], chosen[run]
        pair_keys = [tuple(p) for p in pairs.tolist()]
        # last round's GPUs of each entry (jobs, then pairs), concatenated
        counts = np.concatenate([self._held_count[jobs],
                                 [self._held_pairs.get(key, (0, 0))[1] for key in pair_keys]]).astype(np.int64)
        starts = np.concatenate([self._held_start[jobs], [self._held_pairs.get(key, (0, 0))[0] for key in pair_keys]])
        offsets = np.repeat(starts.astype(np.int64) - (np.cumsum(counts) - counts), counts)
        previous = self._held_ids[offsets + np.arange(int(counts.sum()))]
        entry_types, entry_sizes = np.concatenate([types, pair_types]), np.concatenate([sizes[jobs], sizes[pairs[:, 0]]])
        if self.placement is None:
            ids, gpu_start, extended = place_arrays(self.layout, entry_types, entry_sizes, previous, counts)
        else:
            models = state.workload.models
            ids, gpu_start, extended, _ = self.placement.place(
                self.layout, entry_types, entry_sizes, previous, counts,
                [models[j] for j in np.concatenate([jobs, pairs[:, 0]]).tolist()])
        was_running = self._held_count > 0
        for a, b in self._held_pairs:
            was_running[[a, b]] = True
        self._pair_of = {}
        for k, (a, b) in enumerate(pair_keys):
            self._pair_of[a] = self._pair_of[b] = int(pair_index[k])
        single = np.arange(jobs.size)
        paired = jobs.size + np.arange(pairs.shape[0])
        members = pairs.ravel()  # a, b, a, b, ...: a lease for each member, right after each other
        lease_jobs = np.concatenate([jobs, members])
        was_running[lease_jobs] = False
        leases = RoundLeases(
            jobs=lease_jobs, gpu_types=np.concatenate([types, np.repeat(pair_types, 2)]),
            entries=np.concatenate([single, np.repeat(paired, 2)]),
            partners=np.concatenate([np.full(jobs.size, -1, dtype=np.int64), pairs[:, ::-1].ravel()]),
            max_steps=state.remaining_steps[lease_jobs].astype(np.int64),
            extended=np.concatenate([extended[single], np.repeat(extended[paired], 2)]),
            gpu_ids=ids, gpu_start=gpu_start, stop=np.flatnonzero(was_running))
        self._held_ids = ids
        self._held_count[:] = 0
        self._held_count[jobs] = sizes[jobs]
        self._held_start[jobs] = gpu_start[single]
        self._held_pairs = {key: (int(gpu_start[jobs.size + k]), int(sizes[key[0]]))
                            for k, key in enumerate(pair_keys)}
        self._idle = not lease_jobs.size
        self._last = leases
        return leases

    def _recompute(self, state: SimulationState, rows: np.ndarray, now_s: float) -> None:
        if state.varying_capacity:  # jobs no type of the current cluster runs get no time until one can
            runnable = state.runnable_rows(rows)
            if runnable.size < rows.size:
                self.mechanism.reset(now_s, rows, np.zeros((rows.size, state.cluster.num_gpu_types)))
                if not runnable.size:
                    state.changed = False
                    return
                rows = runnable
        started = time.perf_counter()
        pairs = state.pairs(rows) if self.space_sharing else None
        if self.gavel_policy is not None:
            matrix, pair_fractions = self._gavel_allocation(state, rows, now_s, pairs)
            self.solve_seconds.append(time.perf_counter() - started)
            if pairs is None:
                self.mechanism.reset(now_s, rows, matrix)
            else:
                self.mechanism.reset(now_s, rows, matrix, pairs[0], pair_fractions, pairs[1])
            state.changed = False
            return
        allocation = solve(state.problem(rows, now_s, self.policy, pairs, self.policy_options), self.policy,
                           backend=self.backend, warm_start=self._allocation, **self.policy_options)
        self._allocation = allocation
        self.solve_seconds.append(time.perf_counter() - started)
        if pairs is None:
            self.mechanism.reset(now_s, rows, allocation.matrix)
        else:  # the solved pairs (problem.pairs: positions in rows), with their throughputs
            kept = allocation.problem.pairs if allocation.problem.pairs is not None else np.zeros((0, 2), np.int64)
            pair_rows = rows[kept]
            index = {key: k for k, key in enumerate(map(tuple, pairs[0].tolist()))}
            values = pairs[1][np.array([index[key] for key in map(tuple, pair_rows.tolist())], dtype=np.int64)]
            fractions = allocation.pair_matrix if allocation.pair_matrix is not None else np.zeros(values.shape[:2])
            self.mechanism.reset(now_s, rows, allocation.matrix, pair_rows, fractions, values)
        state.changed = False

    def _gavel_allocation(self, state: SimulationState, rows: np.ndarray, now_s: float,
                          pairs: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray | None]:
        """:attr:`gavel_policy`'s allocation of ``rows`` (job ids: the rows) and of ``pairs``, called with
        the arguments Gavel's scheduler passes: the time fractions of ``rows``, shape (m, n_gpu_types),
        and of the pairs, shape (p, n_gpu_types) (None without pairs)."""
        types, ids = list(state.cluster.gpu_types), rows.tolist()
        throughputs: dict[Hashable, dict[str, Any]] = {
            job: dict(zip(types, row)) for job, row in zip(ids, state.throughputs[rows].tolist())}
        if pairs is not None:  # Gavel's pair entries: [steps/s of a, of b] per type, keyed (a, b)
            throughputs.update({(a, b): dict(zip(types, values))
                                for (a, b), values in zip(pairs[0].tolist(), pairs[1].tolist())})
        wl = state.workload
        values = {"unflattened_throughputs": throughputs,
                  "scale_factors": dict(zip(ids, wl.scale_factors[rows].tolist())),
                  "unflattened_priority_weights": dict(zip(ids, wl.priority_weights[rows].tolist())),
                  "times_since_start": dict(zip(ids, (now_s - wl.arrival_s[rows]).tolist())),
                  "num_steps_remaining": dict(zip(ids, state.remaining_steps[rows].tolist())),
                  "cluster_spec": dict(zip(types, state.cluster.capacity.tolist()))}
        arguments = self.gavel_policy.arguments
        answer = self.gavel_policy.get_allocation(**{k: v for k, v in values.items() if k in arguments}) or {}
        zero = dict.fromkeys(types, 0.0)
        matrix = np.array([[answer.get(job, zero)[t] for t in types] for job in ids], dtype=np.float64)
        if pairs is None:
            return matrix, None
        fractions = np.array([[answer.get((a, b), zero)[t] for t in types] for a, b in pairs[0].tolist()],
                             dtype=np.float64).reshape(-1, len(types))
        return matrix, fractions

    def pair_throughput(self, job: Hashable, partner: Hashable, gpu_type: str) -> float:
        """Steps/s of ``job`` sharing its GPUs of ``gpu_type`` with ``partner`` this round."""
        p = self._pair_of[int(job)]
        member = int(self.mechanism.pairs[p, 1] == int(job))
        return float(self.mechanism.pair_throughputs[p, self.layout.cluster.gpu_types.index(gpu_type), member])

    def observe(self, plan: RoundPlan, results: Sequence[JobRoundResult]) -> None:
        if not results or self._last is None:
            return
        position = {job: i for i, job in enumerate(self._last.jobs.tolist())}
        ran = np.fromiter((position[r.job_id] for r in results), dtype=np.int64, count=len(results))
        seconds = np.zeros(self._last.jobs.size)
        seconds[ran] = [(plan.start_s + r.run_seconds) - plan.start_s for r in results]  # as _array_round
        self.observe_leases(self._last, seconds, ran)

    def observe_leases(self, leases: RoundLeases, run_seconds: np.ndarray, ran: np.ndarray | None = None) -> None:
        """Credit the received-time counters with each lease's ``run_seconds`` (of leases ``ran``: all by default).

        A co-located pair is credited once, with its longer member's run time (Gavel's).
        """
        ran = np.arange(leases.jobs.size) if ran is None else ran
        alone = ran[leases.partners[ran] < 0]
        self.mechanism.record(leases.jobs[alone], leases.gpu_types[alone], run_seconds[alone])
        shared = ran[leases.partners[ran] >= 0]
        pair_types, pair_seconds = np.zeros(0, dtype=np.int64), np.zeros(0)
        members = np.zeros((0, 2), dtype=np.int64)
        if shared.size:
            entries, first = np.unique(leases.entries[shared], return_index=True)
            longest = np.zeros(int(leases.entries.max()) + 1)
            np.maximum.at(longest, leases.entries[shared], run_seconds[shared])
            pairs = np.array([self._pair_of[j] for j in leases.jobs[shared[first]].tolist()], dtype=np.int64)
            pair_types, pair_seconds = leases.gpu_types[shared[first]], longest[entries]
            self.mechanism.record_pairs(pairs, pair_types, pair_seconds)
            members = self.mechanism.pairs[pairs]
        if self.options.running_type_totals:  # Gavel's order: latest-ending first, then job (single, then pairs)
            seconds = np.concatenate([run_seconds[alone], pair_seconds])
            first_job = np.concatenate([leases.jobs[alone], members[:, 0]])
            second_job = np.concatenate([np.full(alone.size, -1), members[:, 1]])
            order = np.lexsort((second_job, first_job, second_job >= 0, -seconds))
            self.mechanism.credit_totals(np.concatenate([leases.gpu_types[alone], pair_types])[order], seconds[order])


@dataclass
class SimulationResult:
    """Outcome of :func:`simulate`.

    Attributes
    ----------
    metrics : dict
        ``average_jct_s``, ``median_jct_s``, ``p99_jct_s`` (over the measurement
        window), ``makespan_s``, ``utilization`` (busy GPU-seconds over GPUs x
        makespan), ``restarts_per_job``, ``gpu_hours_per_job``, ``gpu_hours_by_type`` (GPU type
        to GPU-hours leased, all jobs), ``num_rounds``,
        ``num_solves``, ``solve_s_per_round`` (mean solve wall-clock seconds per
        round), ``solve_s_total``, ``wall_s`` (the simulation's own wall-clock
        seconds), ``num_jobs`` and ``window`` (first and last job index measured);
        with ``ftf=True``, ``average_ftf``, ``max_ftf`` and ``unfair_fraction``
        (finish-time fairness over the window).
    jobs : dict of str to ndarray
        Per job, in arrival order: ``model``, ``scale_factor``, ``arrival_s``,
        ``finish_s``, ``jct_s``, ``gpu_hours``, ``restarts``; with ``ftf=True``,
        ``isolated_jct_s`` (JCT under an isolated share) and ``ftf`` (``jct_s``
        over it).
    rounds : dict of str to ndarray
        Per round: ``start_s``, ``end_s``, ``busy_gpus`` (GPUs leased), ``gpu_s_<type>`` (GPU-seconds
        leased of each GPU type).
    config : dict
        Policy, mode, cluster, round length, seed, workload source.
    """

    metrics: dict[str, Any]
    jobs: dict[str, np.ndarray]
    rounds: dict[str, np.ndarray]
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: metrics, config, per-job and per-round lists."""
        def plain(a: np.ndarray) -> list:
            return a.tolist()

        return {"metrics": self.metrics, "config": self.config,
                "jobs": {k: plain(v) for k, v in self.jobs.items()},
                "rounds": {k: plain(v) for k, v in self.rounds.items()}}

    @overload
    def to_json(self, path: None = None) -> dict[str, Any]: ...

    @overload
    def to_json(self, path: str | PathLike[str]) -> None: ...

    def to_json(self, path: str | PathLike[str] | None = None) -> dict[str, Any] | None:
        """:meth:`to_dict`'s document (metrics, config, per-job and per-round lists); written to ``path`` when given."""
        return document_or_write(self.to_dict(), path)

    @classmethod
    def from_json(cls, source: JsonSource) -> SimulationResult:
        """A result from :meth:`to_json`'s document, or the path of a JSON file holding one."""
        data = read_json(source, what="simulation result")
        if not isinstance(data, Mapping) or not {"metrics", "jobs", "rounds"} <= set(data):
            raise InvalidProblemError("a simulation result document needs 'metrics', 'jobs' and 'rounds' fields",
                                      field="document")
        columns = {}
        for part in ("jobs", "rounds"):
            if not isinstance(data[part], Mapping) or not all(isinstance(v, list) for v in data[part].values()):
                raise InvalidProblemError(f"'{part}' must map each column name to a list", field=part)
            columns[part] = {k: np.array(v) for k, v in data[part].items()}
        return cls(dict(data["metrics"]), columns["jobs"], columns["rounds"], dict(data.get("config", {})))

    def to_frame(self) -> Any:
        """The per-job results as a pandas DataFrame, one row per job in arrival order (needs pandas).

        Columns are :attr:`jobs`' keys (``model``, ``scale_factor``, ``arrival_s``,
        ``finish_s``, ``jct_s``, ``gpu_hours``, ``restarts``, ...), indexed by job number.
        """
        require_extra("pandas", "pandas", "SimulationResult.to_frame")
        import pandas as pd

        frame = pd.DataFrame({name: values for name, values in self.jobs.items()})
        frame.index.name = "job"
        return frame

    def to_csv(self, path: str | PathLike[str]) -> None:
        """One row per job: index and the ``jobs`` columns."""
        names = list(self.jobs)
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["job", *names])
            for k, row in enumerate(zip(*(self.jobs[n].tolist() for n in names))):
                writer.writerow([k, *row])

    def plot(self, path: str | PathLike[str] | None = None) -> Any:
        """JCT CDF and busy GPUs over time as a matplotlib ``Figure`` (needs matplotlib: the ``plot`` extra).

        Written to ``path`` (any format matplotlib knows from the suffix) when
        given. The figure is built without pyplot, so matplotlib's backend and
        pyplot's current figure are left alone: in Jupyter, a cell ending in
        ``result.plot()`` shows it.
        """
        require_extra("matplotlib", "plot", "SimulationResult.plot")
        from matplotlib.figure import Figure

        fig = Figure(figsize=(10, 4), layout="tight")
        left, right = fig.subplots(1, 2)
        jct = np.sort(self.jobs["jct_s"]) / 3600
        left.plot(jct, np.arange(1, jct.size + 1) / max(jct.size, 1))
        left.set(xlabel="JCT (hours)", ylabel="fraction of jobs", title="JCT CDF")
        right.step(self.rounds["start_s"] / 3600, self.rounds["busy_gpus"], where="post")
        right.set(xlabel="time (hours)", ylabel="GPUs busy", title="utilization")
        if path is not None:
            fig.savefig(path)
        return fig


def simulate(workload: Workload | str | PathLike[str], cluster: Cluster | Mapping[str, int],
             policy: str | OrderPolicy = "max_min_fairness_perf", *, throughputs: ThroughputTable | None = None,
             round_seconds: float = 360.0, recompute_min_seconds: float = 1920.0,
             initial_received_rounds: float = 0.5, type_order: str | Sequence[str] | None = None,
             run_unallocated: bool = False, seed: int = 0, mode: str = "mechanism", restart_overhead_s: float = 0.0,
             window: tuple[int, int] | None = None, backend: str = "highs",
             policy_options: Mapping[str, Any] | None = None, executor: Executor | None = None,
             planner: RoundPlanner | None = None, progress: bool = False,
             profiles: str | PathLike[str] | Mapping[tuple[str, str], Any] | None = None,
             ftf: bool = True, fidelity: Fidelity | str | Mapping[str, Any] | None = None,
             admission: str | AdmissionPolicy | None = None,
             placement: str | PlacementPolicy | None = None,
             tenants: Tenants | Mapping[str, Any] | str | PathLike[str] | None = None,
             capacity_events: CapacitySchedule | Sequence[Mapping[str, Any]] | str | PathLike[str] | None = None,
             ) -> SimulationResult:
    """Simulate ``policy`` on ``cluster`` running ``workload``.

    Parameters
    ----------
    workload : Workload or path
        Jobs (:func:`~allocopt.mechanism.workload.generate_workload`), or a
        Gavel trace file; with ``profiles``, a Sia workload CSV (or its jobs,
        :func:`~allocopt.mechanism.sia_workloads.read_sia_workload`).
    cluster : Cluster or mapping of str to int
        ``{"v100": 36, ...}`` (8 GPUs per server) or a Cluster.
    policy : str, default "max_min_fairness_perf"
        An allocopt policy name or a Gavel policy name (``gavel:NAME``, or a name
        allocopt has no policy of); ``gavel:fifo``, ``gavel:gandiva`` and
        ``gavel:allox`` run Gavel's stateful policy object
        (:func:`gavel_policy_for`; ``mode="ideal"`` solves allocopt's policy instead).
        An order-based policy (``las``, ``tiresias``, ``tiresias_gittins``,
        ``srtf``, ``sjf``, ``order:fifo``, ``optimus`` without ``profiles``, with ``policy_options`` as its options,
        or an :class:`~allocopt.mechanism.order_policies.OrderPolicy` object) runs
        on :class:`~allocopt.mechanism.order_planner.OrderPlanner`: rounds end at
        the next arrival, completion or policy event, at most ``round_seconds``.
    throughputs : ThroughputTable, optional
        Default: Gavel's measurements (:meth:`ThroughputTable.gavel`).
    round_seconds : float, default 360
    recompute_min_seconds : float, default 1920
        Minimum seconds between allocation recomputes.
    initial_received_rounds : float, default 0.5
        Rounds each received-time counter starts at.
    type_order : {"fastest_first", "random"} or list of str, optional
        Default: random for heterogeneity-agnostic policies, else fastest first.
    run_unallocated : bool, default False
        Let jobs that arrived after the last recompute run on GPUs the walk
        gives them (Gavel, False: they hold those GPUs idle until the next
        recompute). See :class:`~allocopt.mechanism.priority.MechanismOptions`.
    seed : int, default 0
        Seed of the random type order.
    mode : {"mechanism", "ideal"}, default "mechanism"
        ``ideal``: every job progresses continuously at its allocated rate
        (allocation recomputed at every arrival and departure), no rounds.
    restart_overhead_s : float, default 0
        Seconds lost by a job at each lease that does not keep its GPUs.
    window : (int, int), optional
        Measure the JCT metrics over jobs ``a .. b - 1`` (arrival order) only.
    backend : str, default "highs"
    policy_options : mapping, optional
        Extra options of the policy. Under Gavel's names with ``backend="highs"``,
        Gavel's LP policies (max-min fairness, max-sum throughput, finish-time
        fairness, min total duration) default to ``solver_options={"solver": "ipm",
        "run_crossover": "off"}``, the Gavel adapter's HiGHS path (a point inside
        the optimal face, as Gavel's ECOS returns; ``config["solver_path"]`` says
        so); ``solver_options={"solver": "simplex"}`` for dual simplex's vertex.
        For Gavel's heterogeneity-agnostic names
        (``gavel:max_min_fairness``, ``gavel:finish_time_fairness``, ...)
        ``faithful_agnostic=True`` plans as Gavel's code does, also on a type where a
        job cannot run (at its V100 speed; that time is lost), as the Gavel adapter's
        flag of that name; allocopt never plans such time.
    executor : Executor, optional
        Default: a :class:`SimulatedExecutor` over the table's throughputs
        (with ``profiles``: a :class:`~allocopt.mechanism.sia_rounds.SiaExecutor`).
    planner : RoundPlanner, optional
        Default: :class:`PriorityPlanner` (Gavel's mechanism).
    progress : bool, default False
        Show a progress bar (needs tqdm).
    profiles : path or mapping, optional
        Sia application profiles (a directory or
        :func:`~allocopt.throughput.profiles.load_profiles`): simulate a Sia
        workload. Policy ``sia`` runs :class:`~allocopt.mechanism.sia_rounds.SiaPlanner`
        rounds (``round_seconds`` typically 60), ``pollux`` and ``optimus`` the same rounds
        with their decision (:mod:`~allocopt.mechanism.pollux_rounds`,
        :mod:`~allocopt.mechanism.optimus_rounds`); jobs progress in samples by
        their profiled (true) goodput. A directory is read as Sia's simulator
        reads it (``load_profiles(..., sia_numbers=True)``) when the policy
        option ``faithful_to_sia`` is set. Any other policy runs Gavel-style
        rounds with each job's requested GPUs and batch size fixed
        (:func:`~allocopt.mechanism.sia_rounds.rigid_throughputs`).
    fidelity : str, Fidelity or mapping, optional
        Whose simulator to follow (:mod:`allocopt.mechanism.fidelity`): ``"allocopt"``,
        ``"gavel"``, ``"sia"``, a :class:`~allocopt.mechanism.fidelity.Fidelity`, or
        ``{"profile": NAME, FIELD: VALUE, ...}``. Default ``"allocopt"``, allocopt's own model,
        also under Gavel's policy names (their policies, under allocopt's accounting);
        ``"gavel"`` reproduces Gavel's simulator, ``"sia"`` with policy ``sia`` Sia's (the
        policy option ``faithful_to_sia=True`` is the same switch).
    admission : str or AdmissionPolicy, optional
        Admission control (:mod:`allocopt.mechanism.admission`): ``"accept_all"``,
        ``"load_based"`` (Blox's, threshold 1.2), or a policy object such as
        ``LoadBased(1.4)``; arrived jobs wait in a queue until admitted (their
        JCT counts from arrival). Default: every job joins when it arrives.
    placement : str or PlacementPolicy, optional
        Where each round's jobs get their GPUs (:mod:`allocopt.mechanism.placement_policies`):
        ``"best_fit"`` (the default), ``"packing"``, ``"scattered"``, ``"consolidated"``
        (Tiresias's model-skew rule; order-based policies only, as it may leave a job
        waiting), or a policy object.
    ftf : bool, default True
        Finish-time fairness: run a companion simulation of the same jobs under
        the ``isolated`` policy (each job an equal share of the cluster) in
        ``ideal`` mode, and report each job's JCT over its JCT there
        (``jobs["ftf"]``, ``jobs["isolated_jct_s"]``; metrics ``average_ftf``,
        ``max_ftf``, ``unfair_fraction``: the share of jobs with FTF > 1).
    tenants : Tenants, mapping, path or "equal", optional
        Tenants' weights and GPU quotas (:mod:`allocopt.mechanism.tenants`): a
        :class:`~allocopt.mechanism.tenants.Tenants`, ``{name: weight}`` or ``{name:
        {"weight": w, "gpu_quota": q}}``, a tenants file (CSV or JSON), or ``"equal"``
        (weight 1 for every tenant the workload names). Every job must name a listed
        tenant (``Workload.tenants``). Water-filling policies get the tenants as entities
        (hierarchical max-min fairness); other allocation policies get the weights folded
        into the jobs' priority weights; quotas cap the GPUs a tenant's jobs hold in a round
        (``mode="mechanism"``, not with space sharing or Sia's rounds). Whenever the jobs
        name tenants, ``metrics["tenants"]`` and ``jobs["tenant"]`` report per-tenant results.
    capacity_events : CapacitySchedule, list of mapping or path, optional
        Servers or GPUs joining and leaving (:mod:`allocopt.mechanism.capacity`): a CSV file
        (``time_s,gpu_type,gpus`` or ``servers``) or ``[{"time_s": 3600, "gpu_type": "v100",
        "servers": -2}, ...]``, applied from ``cluster`` at round boundaries; jobs on GPUs that
        leave are preempted and placed anew. ``mode="mechanism"`` with an allocation or
        order-based policy (not Sia's rounds). Utilization is then over the GPU-seconds the
        cluster offered, and the FTF companion run uses each type's peak count.

    Returns
    -------
    SimulationResult

    Raises
    ------
    TraceError
        Malformed trace, unknown model, or a job no GPU type can run;
        :class:`~allocopt.mechanism.tenants.TenantError` for malformed tenants or a job of an
        unknown tenant, :class:`~allocopt.mechanism.capacity.CapacityEventError` for a
        malformed capacity event (both are TraceErrors naming the line and field).
    InvalidOptionError
        Unknown policy or out-of-range options.
    """
    wall = time.perf_counter()
    if not isinstance(cluster, Cluster):
        cluster = Cluster(dict(cluster))
    if mode not in ("mechanism", "ideal"):
        raise InvalidOptionError(f"mode must be 'mechanism' or 'ideal', got {mode!r}")
    fid = resolve_fidelity(fidelity)
    if profiles is not None and policy in GOODPUT_POLICIES and dict(policy_options or {}).get("faithful_to_sia"):
        fid = FIDELITY_PROFILES["sia"] if fidelity is None else fid
    admitter = None if admission is None else admission_policy(admission)
    if admitter is not None and mode != "mechanism":
        raise InvalidOptionError(f"admission control runs in mode 'mechanism' only, got mode={mode!r}")
    if placement is not None and (mode != "mechanism" or (profiles is not None and policy in GOODPUT_POLICIES)):
        raise InvalidOptionError("placement plug-ins run with the round mechanism of allocation and order-based "
                                 f"policies (mode='mechanism'), not with mode={mode!r} or Sia's rounds")
    sia_rounds = profiles is not None and policy in ("sia", "pollux")
    if (tenants is not None or capacity_events is not None) and sia_rounds:
        raise InvalidOptionError(f"tenants and capacity_events apply to allocation and order-based policies, not to "
                                 f"{policy!r}'s configuration rounds")
    if capacity_events is not None and mode != "mechanism":
        raise InvalidOptionError(f"capacity_events run with the round mechanism (mode='mechanism'), got mode={mode!r}")
    schedule = None if capacity_events is None else capacity_schedule(capacity_events, cluster)
    if profiles is not None:
        faithful = fid.sia_profile_numbers and policy in GOODPUT_POLICIES
        profiles = profiles if isinstance(profiles, Mapping) else load_profiles(profiles, sia_numbers=faithful)
        sia_jobs = _sia_jobs(workload, profiles)
        workload = sia_workload(sia_jobs, profiles, "" if isinstance(workload, Sequence) else str(workload))
    order = None
    if profiles is not None and policy in GOODPUT_POLICIES:
        if mode != "mechanism":
            raise InvalidOptionError(f"policy {policy!r} runs in mode 'mechanism' only, got {mode!r}")
        state = SimulationState(workload, cluster, np.ones((workload.num_jobs, cluster.num_gpu_types)))
        if policy == "pollux":  # Pollux's decision, Sia's job side (allocopt.mechanism.pollux_rounds)
            from allocopt.mechanism.pollux_rounds import PolluxPlanner as planner_class
        elif policy == "optimus":  # Optimus's decision, Sia's job side (allocopt.mechanism.optimus_rounds)
            from allocopt.mechanism.optimus_rounds import OptimusPlanner as planner_class
        else:
            planner_class = SiaPlanner
        planner = planner_class(state, profiles, round_seconds=round_seconds, backend=backend, fidelity=fid,
                                **{"batch_sizes": [j.batch_size for j in sia_jobs], **dict(policy_options or {})})
        executor = executor or SiaExecutor()
        name, options, agnostic = policy, dict(policy_options or {}), False
        solver_path, faithful_agnostic = None, False
    else:
        order = order_policy(policy, policy_options)
        if order is not None:  # an order-based policy (allocopt.mechanism.order_policies): ranks, no solve
            if mode != "mechanism":
                raise InvalidOptionError(f"order-based policy {order.name!r} runs in mode 'mechanism' only")
            name, options, agnostic, faithful_agnostic = order.name, dict(policy_options or {}), False, False
            policy = policy if isinstance(policy, str) else order.name
            explicit = False
        else:
            name, options, agnostic = resolve_policy(policy, policy_options, backend, fid)
            explicit = "faithful_agnostic" in (policy_options or {})
            faithful_agnostic = _faithful_agnostic(policy, options,
                                                   fid.agnostic_on_every_type and mode == "mechanism")
        solver_path = None
        if "solver_options" in options and "solver_options" not in (policy_options or {}):  # resolve_policy's
            from allocopt.formulations.gavel_policies import HIGHS_IPM_REASON
            solver_path = HIGHS_IPM_REASON
        if faithful_agnostic and explicit and mode != "mechanism":  # a job planned only where it cannot run would never progress
            raise InvalidOptionError("faithful_agnostic=True reproduces Gavel's round mechanism: mode='mechanism' "
                                     f"only, got mode={mode!r}")
        if profiles is not None:
            T = rigid_throughputs(workload, [j.batch_size for j in sia_jobs], profiles, cluster)
        else:
            table = throughputs if throughputs is not None else ThroughputTable.gavel()
            if not isinstance(workload, Workload):
                workload = read_gavel_trace(workload, table)
            T = workload.throughputs(table, cluster.gpu_types)
        workload.check_fits(T, cluster if schedule is None else schedule.peak)
        planned = None
        if faithful_agnostic:
            from allocopt.formulations.gavel_policies import gavel_agnostic_throughputs
            planned = gavel_agnostic_throughputs(T, list(cluster.gpu_types))
        state = SimulationState(workload, cluster, T, None if profiles is not None else table, planned)
        state.varying_capacity = schedule is not None
        if tenants is not None:
            state.tenants, state.tenant_of = resolve_tenants(tenants, workload)
            if state.tenants.has_quotas and (mode != "mechanism" or options.get("space_sharing")):
                raise InvalidOptionError("tenant GPU quotas are enforced by the round mechanism: mode='mechanism' "
                                         "without space sharing")
    # Gavel's FIFO policies run only allocated entries (priority > 0)
    mech = MechanismOptions(round_seconds, recompute_min_seconds, initial_received_rounds,
                            type_order or ("random" if agnostic else "fastest_first"), seed,
                            work_conserving=name != "fifo", run_unallocated=run_unallocated,
                            pair_finishes_at_lease_end=fid.pair_finishes_at_lease_end,
                            running_type_totals=fid.running_type_totals)
    bar = _progress(workload.num_jobs, progress)
    if mode == "ideal":
        finish, busy_gpu_s, gpu_s, starts, rounds, solve_s = _run_ideal(state, name, options, backend, bar)
    else:
        default_planner = planner is None
        placer = None if placement is None else placement_policy(placement)
        if order is not None and planner is None:
            planner = OrderPlanner(state, order, OrderOptions(round_seconds), placer)
        planner = planner or PriorityPlanner(state, name, options, mech, backend,
                                             gavel_policy_for(policy, options, backend, seed, fid), placer)
        if executor is None:
            executor = SimulatedExecutor(np.asarray(T, dtype=np.float64), gpu_types=cluster.gpu_types,
                                         restart_overhead_s=restart_overhead_s,
                                         pair_throughputs=planner.pair_throughput
                                         if default_planner and isinstance(planner, PriorityPlanner) else None)
        pair_end = isinstance(planner, PriorityPlanner) and planner.options.pair_finishes_at_lease_end
        queue = None if admitter is None else AdmissionQueue(admitter, workload.num_jobs)
        if schedule is not None and not hasattr(planner, "set_cluster"):
            raise InvalidOptionError(f"capacity_events need a planner with set_cluster(state, cluster); "
                                     f"{type(planner).__name__} has none")
        finish, busy_gpu_s, gpu_s, starts, rounds = _run_rounds(state, planner, executor, bar, pair_end, queue,
                                                                schedule)
        solve_s = planner.solve_seconds
    if bar is not None:
        bar.close()
    jct = finish - workload.arrival_s
    a, b = window if window is not None else (0, workload.num_jobs)
    if not 0 <= a < b <= workload.num_jobs:
        raise InvalidOptionError(f"window {window} must satisfy 0 <= a < b <= {workload.num_jobs} (jobs)")
    measured = jct[a:b]
    makespan = float(finish.max())
    fairness: dict[str, Any] = {}
    if ftf:
        isolated = simulate(sia_jobs if profiles is not None else workload,
                            cluster if schedule is None else schedule.peak, "isolated",
                            throughputs=throughputs, mode="ideal", backend=backend, profiles=profiles, ftf=False)
        fairness = {"isolated_jct_s": isolated.jobs["jct_s"], "ftf": jct / isolated.jobs["jct_s"]}
    num_rounds = len(rounds["start_s"])
    by_type = np.array(rounds.pop("gpu_s_by_type", []), dtype=np.float64).reshape(num_rounds, cluster.num_gpu_types)
    rounds.update({f"gpu_s_{t}": by_type[:, k] for k, t in enumerate(cluster.gpu_types)})
    metrics = {
        "average_jct_s": float(measured.mean()), "median_jct_s": float(np.median(measured)),
        "p99_jct_s": float(np.percentile(measured, 99)), "makespan_s": makespan,
        "utilization": float(busy_gpu_s / (cluster.capacity.sum() * makespan if schedule is None
                                           else schedule.gpu_seconds(makespan))) if makespan > 0 else 0.0,
        "restarts_per_job": float(np.maximum(starts[a:b] - 1, 0).mean()),
        "gpu_hours_per_job": float(gpu_s[a:b].mean() / 3600),
        "gpu_hours_by_type": dict(zip(cluster.gpu_types, (by_type.sum(axis=0) / 3600).tolist())),
        "num_rounds": num_rounds, "num_solves": len(solve_s),
        "solve_s_per_round": float(sum(solve_s) / max(num_rounds, 1)), "solve_s_total": float(sum(solve_s)),
        "wall_s": time.perf_counter() - wall, "num_jobs": workload.num_jobs, "window": [a, b],
    }
    if fairness:
        rho = fairness["ftf"][a:b]
        metrics.update(average_ftf=float(rho.mean()), max_ftf=float(rho.max()),
                       unfair_fraction=float((rho > 1).mean()))
    jobs = {"model": np.array(workload.models, dtype=object), "scale_factor": workload.scale_factors,
            "arrival_s": workload.arrival_s, "finish_s": finish, "jct_s": jct, "gpu_hours": gpu_s / 3600,
            "restarts": np.maximum(starts - 1, 0), **fairness}
    if workload.tenants is not None:
        names = state.tenants.names if state.tenants is not None else tuple(dict.fromkeys(workload.tenants))
        tenant_of = state.tenant_of if state.tenants is not None else _tenant_index(workload.tenants, names)
        jobs["tenant"] = np.array(workload.tenants, dtype=object)
        metrics["tenants"] = tenant_metrics(names, tenant_of[a:b], measured, gpu_s[a:b] / 3600,
                                            fairness["ftf"][a:b] if fairness else None)
    config = {"policy": policy, "allocopt_policy": name, "policy_options": options, "mode": mode,
              "cluster": cluster.to_dict(), "round_seconds": round_seconds,
              "recompute_min_seconds": recompute_min_seconds, "run_unallocated": run_unallocated,
              "type_order": mech.type_order
              if isinstance(mech.type_order, str) else list(mech.type_order), "seed": seed,
              "restart_overhead_s": restart_overhead_s, "workload": workload.source,
              "fidelity": fid.to_dict()}
    if admitter is not None:
        config["admission"] = admitter.name
    if placement is not None:
        config["placement"] = placement if isinstance(placement, str) else placement.name
    if solver_path is not None:
        config["solver_path"] = solver_path
    if faithful_agnostic:
        config["faithful_agnostic"] = True
    if state.tenants is not None:
        config["tenants"] = state.tenants.to_dict()
    if schedule is not None:
        config["capacity_events"] = schedule.to_dict()
    return SimulationResult(metrics, jobs, {k: np.asarray(v) for k, v in rounds.items()}, config)


def _tenant_index(labels: Sequence[str], names: Sequence[str]) -> np.ndarray:
    """Position in ``names`` of each of ``labels``, shape (len(labels),)."""
    unique, inverse = np.unique(np.array(labels, dtype=object).astype(str), return_inverse=True)
    position = {name: k for k, name in enumerate(names)}
    return np.array([position[u] for u in unique.tolist()], dtype=np.int64)[inverse]


def _sia_jobs(workload: Any, profiles: Mapping[tuple[str, str], Any]) -> Sequence[SiaWorkloadJob]:
    """The jobs of a Sia workload given as a CSV path or as jobs."""
    if isinstance(workload, Sequence) and not isinstance(workload, str):
        return workload
    if isinstance(workload, Workload):
        raise InvalidOptionError("with profiles, give the Sia workload as a CSV path or its jobs "
                                 "(read_sia_workload), not a Workload")
    return read_sia_workload(workload, applications=sorted({a for a, _ in profiles}))


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    require_extra("tqdm", "progress", "simulate(progress=True)")
    from tqdm import tqdm

    return tqdm(total=total, unit="job")


def _admit(state: SimulationState, next_job: int, now_s: float) -> int:
    """Activate the jobs that arrived by ``now_s``; the index of the next one to arrive."""
    arrival = state.workload.arrival_s
    end = int(np.searchsorted(arrival, now_s, side="right"))
    if end > next_job:
        state.active[next_job:end] = True
        state.changed = True
    return max(end, next_job)


def _run_rounds(state: SimulationState, planner: RoundPlanner, executor: Executor, bar: Any,
                pair_finishes_at_lease_end: bool = False, admission: AdmissionQueue | None = None,
                schedule: CapacitySchedule | None = None,
                ) -> tuple[np.ndarray, float, np.ndarray, np.ndarray, dict[str, list]]:
    """Rounds until every job finished. The default planner and executor exchange arrays
    (:meth:`PriorityPlanner.plan_leases`, :meth:`SimulatedExecutor.run_arrays`); others, lease objects.
    ``pair_finishes_at_lease_end``: see :class:`~allocopt.mechanism.priority.MechanismOptions`;
    ``admission``: arrived jobs wait in it until admitted (default: all join when they arrive);
    ``schedule``: the cluster's changes, applied at the first round starting at or after each
    (the planner's ``set_cluster``); rounds then also record ``gpus``, the cluster's GPUs."""
    wl = state.workload
    n = wl.num_jobs
    finish = np.full(n, np.nan)
    gpu_s = np.zeros(n)
    starts = np.zeros(n, dtype=np.int64)
    rounds: dict[str, list] = {"start_s": [], "end_s": [], "busy_gpus": [], "gpu_s_by_type": []}
    busy_gpu_s, now, next_job, done, index = 0.0, 0.0, 0, 0, 0
    idle = False
    grid = getattr(planner, "round_grid_s", None)

    def start(t: float) -> float:  # the first round start at or after t
        return math.ceil(t / grid - 1e-9) * grid if grid else t

    arrays = (isinstance(planner, PriorityPlanner) and isinstance(executor, SimulatedExecutor)
              and executor.matrix is not None)
    changes = 0  # capacity changes applied
    if schedule is not None:
        rounds["gpus"] = []
        state.next_capacity_change_s = float(schedule.times_s[0]) if schedule.times_s.size else np.inf
    while done < n:
        if not state.active.any() and (admission is None or not admission.waiting.size):
            now = max(now, start(float(wl.arrival_s[next_job])))
        if schedule is not None:
            changes = _apply_capacity(state, planner, schedule, changes, now)
        next_job = _admit(state, next_job, now) if admission is None else admission.admit(state, next_job, now)
        ran = _array_round(state, planner, executor, now) if arrays else _lease_round(state, planner, executor,
                                                                                    now, index)
        if ran is None:
            change_s = float(state.next_capacity_change_s) if schedule is not None else np.inf
            if next_job >= n:
                if idle and not np.isfinite(change_s):  # told once that nothing runs (it may recompute): stuck
                    stuck = state.active_rows()[:5].tolist()
                    raise SimulationError(f"no job can be scheduled and none will arrive; stuck jobs {stuck}")
                if not idle:
                    idle = True
                    continue
                idle = False
                now = start(change_s)  # the cluster changes next
                continue
            now = start(min(float(wl.arrival_s[next_job]), change_s))
            continue
        idle = False
        jobs, steps, seconds, restarted, completed, entries, widths, types = ran
        state.remaining_steps[jobs] -= steps
        gpu_s[jobs] += widths[entries] * seconds
        starts[jobs] += restarted
        held = np.full(widths.size, -1.0)  # placement -> seconds busy (co-located jobs share their GPUs)
        np.maximum.at(held, entries, seconds)
        busy_gpu_s += float((widths * np.maximum(held, 0.0)).sum())
        placement_type = np.zeros(widths.size, dtype=np.int64)
        placement_type[entries] = types
        rounds["gpu_s_by_type"].append(np.bincount(placement_type, widths * np.maximum(held, 0.0),
                                                   state.cluster.num_gpu_types))
        if completed.any():
            ended = seconds
            if pair_finishes_at_lease_end:  # a co-located job finishes with its placement's last member
                ended = np.where(np.bincount(entries)[entries] > 1, held[entries], seconds)
            finish[jobs[completed]] = now + ended[completed]
            state.active[jobs[completed]] = False
            state.changed = True
            done += int(completed.sum())
            if bar is not None:
                bar.update(int(completed.sum()))
        rounds["start_s"].append(now)
        now = start(executor.now())
        rounds["end_s"].append(now)
        rounds["busy_gpus"].append(int(widths[held >= 0].sum()))
        if schedule is not None:
            rounds["gpus"].append(int(state.cluster.capacity.sum()))
        index += 1
    return finish, busy_gpu_s, gpu_s, starts, rounds


def _apply_capacity(state: SimulationState, planner: Any, schedule: CapacitySchedule, applied: int,
                    now: float) -> int:
    """Apply the capacity changes due by ``now`` (the first ``applied`` already are); how many are applied."""
    due = int(np.searchsorted(schedule.times_s, now, side="right"))
    if due > applied:
        cluster = schedule.cluster(due)
        state.set_cluster(cluster)
        planner.set_cluster(state, cluster)
    state.next_capacity_change_s = float(schedule.times_s[due]) if due < schedule.times_s.size else np.inf
    return max(due, applied)


RoundArrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _array_round(state: SimulationState, planner: PriorityPlanner, executor: SimulatedExecutor,
                 now: float) -> RoundArrays | None:
    """One round of arrays: per lease job, steps, seconds, restarted, completed, placement; widths per placement;
    per lease job, its GPU type's index. None when nothing runs."""
    leases = planner.plan_leases(state, now)
    if not leases.jobs.size:
        return None
    steps, seconds, completed, failed = executor.run_arrays(
        now, planner.options.round_seconds, leases.jobs, leases.gpu_types, leases.max_steps, leases.extended,
        leases.partners, state.cluster.gpu_types)
    # received time as the difference of the end and start timestamps (as Gavel's simulator and a deployment
    # measure it: where jobs are entitled to equal shares, the mechanism orders them by these last bits)
    planner.observe_leases(leases, (now + seconds) - now)
    if failed.any():
        k = int(np.argmax(failed))
        raise SimulationError(f"job {int(leases.jobs[k])} failed: zero throughput on "
                              f"{state.cluster.gpu_types[leases.gpu_types[k]]}")
    return (leases.jobs, steps, seconds, ~leases.extended, completed, leases.entries,
            np.diff(leases.gpu_start), leases.gpu_types)


def _lease_round(state: SimulationState, planner: RoundPlanner, executor: Executor, now: float,
                 index: int) -> RoundArrays | None:
    """One round of lease objects through any planner and executor, as :func:`_array_round`'s arrays."""
    plan = planner.plan(state, now, index)
    if not plan.leases:
        return None
    results = executor.run_round(plan)
    planner.observe(plan, results)
    failed = [r for r in results if r.outcome is RoundOutcome.FAILED]
    if failed:
        raise SimulationError(f"job {failed[0].job_id} failed: {failed[0].message}")
    gpus_of = {lease.job_id: lease.gpu_ids for lease in plan.leases}
    type_of = {lease.job_id: state.cluster.gpu_types.index(lease.gpu_type) for lease in plan.leases}
    placements: dict[tuple[int, ...], int] = {}
    entries = np.array([placements.setdefault(gpus_of[r.job_id], len(placements)) for r in results],
                       dtype=np.int64)
    return (np.fromiter((r.job_id for r in results), dtype=np.int64, count=len(results)),
            np.array([r.steps for r in results], dtype=np.int64), np.array([r.run_seconds for r in results]),
            np.array([r.restarted for r in results], dtype=np.int64),
            np.array([r.outcome is RoundOutcome.COMPLETED for r in results], dtype=bool), entries,
            np.array([len(ids) for ids in placements], dtype=np.int64),
            np.array([type_of[r.job_id] for r in results], dtype=np.int64))


def _run_ideal(state: SimulationState, policy: str, options: Mapping[str, Any], backend: str,
               bar: Any) -> tuple[np.ndarray, float, np.ndarray, np.ndarray, dict[str, list], list[float]]:
    """Continuous progress at the allocated rates; a new allocation at every arrival and departure.

    The ``isolated`` share is a closed form of the active jobs (:func:`isolated_shares`): it is
    computed from the checked jobs' arrays, without a problem and a solve per event."""
    wl = state.workload
    closed_form = policy == "isolated" and not options
    n = wl.num_jobs
    finish = np.full(n, np.nan)
    gpu_s = np.zeros(n)
    remaining = wl.total_steps.astype(np.float64)
    rounds: dict[str, list] = {"start_s": [], "end_s": [], "busy_gpus": [], "gpu_s_by_type": []}
    solve_s: list[float] = []
    busy_gpu_s, now, next_job, done = 0.0, 0.0, 0, 0
    allocation = None
    while done < n:
        if not state.active.any():
            now = max(now, float(wl.arrival_s[next_job]))
        next_job = _admit(state, next_job, now)
        rows = state.active_rows()
        state.remaining_steps[rows] = np.ceil(remaining[rows]).astype(np.int64)
        started = time.perf_counter()
        if closed_form:
            jobs = state.jobs()
            X = isolated_shares(jobs.capacity, jobs.scale_factors[rows], jobs.runnable[rows])
        else:
            allocation = solve(state.problem(rows, now, policy, options=options), policy, backend=backend,
                               warm_start=allocation, **options)
            X = allocation.matrix
        solve_s.append(time.perf_counter() - started)
        rate = (X * state.throughputs[rows]).sum(axis=1)
        to_finish = np.divide(remaining[rows], rate, out=np.full(rows.size, np.inf), where=rate > 0)
        next_arrival = float(wl.arrival_s[next_job]) if next_job < n else np.inf
        dt = min(float(to_finish.min()), next_arrival - now)
        if not np.isfinite(dt):
            raise SimulationError(f"no job can progress and none will arrive; stuck jobs {rows[:5].tolist()}")
        gpus = X.sum(axis=1) * wl.scale_factors[rows]
        remaining[rows] -= rate * dt
        gpu_s[rows] += gpus * dt
        busy_gpu_s += float(gpus.sum() * dt)
        rounds["start_s"].append(now)
        now += dt
        rounds["end_s"].append(now)
        rounds["busy_gpus"].append(float(gpus.sum()))
        rounds["gpu_s_by_type"].append((X * wl.scale_factors[rows, None]).sum(axis=0) * dt)
        ended = rows[to_finish <= dt * (1 + 1e-12)]
        finish[ended] = now
        state.active[ended] = False
        done += ended.size
        if bar is not None:
            bar.update(ended.size)
    return finish, busy_gpu_s, gpu_s, np.ones(n, dtype=np.int64), rounds, solve_s


__all__ = ["PriorityPlanner", "RoundLeases", "RoundPlanner", "SimulationError", "SimulationResult", "SimulationState",
           "gavel_policy_for", "resolve_policy", "simulate"]
