"""``allocopt.Engine``: a stateful allocation engine for schedulers that embed allocopt.

A scheduler keeps one Engine, tells it what changes (jobs arrive, finish or
change; throughputs are measured; nodes join or leave) and asks for the
current allocation whenever it needs one. The engine rebuilds the
:class:`~allocopt.Problem` and re-solves only when something changed since
the last :meth:`Engine.allocate`; otherwise it returns the cached allocation.

Every public method takes the engine's re-entrant lock, so one engine can be
shared by many threads (an HTTP service, a scheduler loop and a metrics
thread). A solve holds the lock: mutations wait for it to finish.

>>> import allocopt
>>> engine = allocopt.Engine({"v100": 1, "k80": 1})
>>> engine.add_job("a", throughputs={"v100": 40.0, "k80": 10.0})
>>> engine.add_job("b", throughputs={"v100": 12.0, "k80": 4.0})
>>> engine.add_job("c", throughputs={"v100": 100.0, "k80": 50.0})
>>> round(engine.allocate().objective, 6)
0.727273
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import threading
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, overload

import numpy as np

from allocopt.allocation import Allocation
from allocopt.api import check_policy_options, solve
from allocopt.backends import BACKENDS, SolveOptions
from allocopt.cluster import DEFAULT_GPUS_PER_NODE, MAX_COUNT, Cluster
from allocopt.documents import parse_json, read_text
from allocopt.errors import (AllocoptError, DataFileError, DuplicateJobError, InvalidOptionError,
                             InvalidProblemError, UnknownBackendError, UnknownJobError)
from allocopt.formulations import get_policy
from allocopt.job_table import JobTable
from allocopt.jsonio import JsonSource, document_or_write, read_json
from allocopt.mechanism.placement import GpuLayout
from allocopt.mechanism.placement_policies import PlacementPolicy, placement_policy
from allocopt.mechanism.priority import MechanismOptions, PriorityMechanism
from allocopt.problem import Problem
from allocopt.runtime.executor import JobRoundResult, Lease, RoundPlan
from allocopt.schemas.checks import check_cluster_document

#: ``format`` of the engine's state document (:meth:`Engine.to_json`).
STATE_FORMAT = "allocopt-engine"
STATE_FORMAT_VERSION = 1

#: Keyword arguments of :func:`allocopt.solve` an engine passes on (``solve_options``).
SOLVE_OPTIONS = ("time_limit_s", "mip_gap", "threads", "verbose", "solver_options", "best_effort")

#: Optional per-job fields, named as in the problem JSON document (:meth:`allocopt.Problem.to_json`).
JOB_FIELDS = ("scale_factor", "priority_weight", "num_steps_remaining", "time_since_start_s", "slo_s",
              "time_isolated_s", "entity")

# Problem's array names -> the per-job field names of the engine (and of the problem document).
_FIELD_NAMES = {"scale_factors": "scale_factor", "priority_weights": "priority_weight", "slos": "slo_s",
                "time_since_start": "time_since_start_s", "time_isolated": "time_isolated_s",
                "entities": "entity"}

# Capacity of every GPU type in the cluster a single job is validated against: capacity is
# checked when allocating (a job may wait for nodes to join), not when it is added.
_VALIDATION_CAPACITY = MAX_COUNT


class Engine:
    """A stateful, thread-safe allocation engine.

    Parameters
    ----------
    cluster : Cluster or mapping of str to int
        The GPUs of each type now (``{"v100": 4, "k80": 8}``); change it later
        with :meth:`set_capacity`.
    policy : str, default "max_min_fairness"
        A policy over :class:`~allocopt.Problem` from ``allocopt.POLICIES``.
    backend : str, default "highs"
        Solver backend, or ``"auto"``.
    policy_options : mapping, optional
        Options of the policy (e.g. ``{"heterogeneity_aware": False}``); JSON values.
    solve_options : mapping, optional
        Other keyword arguments of :func:`allocopt.solve`: ``time_limit_s``,
        ``mip_gap``, ``threads``, ``verbose``, ``solver_options``, ``best_effort``.
    throughput_smoothing : float in (0, 1], default 1.0
        Weight ``a`` of a new measurement in :meth:`observe_throughput`: the
        first measurement of a (job, GPU type) replaces the given throughput,
        each later one ``x`` moves it to ``(1 - a) * old + a * x``. The default
        1.0 keeps the latest measurement.
    round_seconds : float, default 360
        Default length of a round of :meth:`next_round`, in seconds.
    recompute_min_seconds : float, default 1920
        :meth:`next_round` installs a new allocation in the priority mechanism
        (restarting its received-time counters) when the state changed, at most
        once per this many seconds of rounds (Gavel's rate limit).
    placement : str or PlacementPolicy, default "best_fit"
        Where :meth:`next_round` puts each selected job's GPUs: a name of
        :data:`~allocopt.mechanism.placement_policies.PLACEMENT_POLICIES` (saved
        in the state document) or a policy object (not saved: a restored engine
        places by best fit). A job's model, for ``consolidated``, is its entry in
        :attr:`placement_models`, else its id (a model is matched by the longest
        known name it starts with, so ``vgg16-a`` is ``vgg16``); a job the policy
        leaves unplaced waits for a later round.

    Attributes
    ----------
    version : int
        Incremented by every change of the engine's state; an allocation is
        recomputed only when the version moved since the last one.
    placement_models : dict of job id to str
        Model names the placement policy reads (default: the job id); not saved.

    Raises
    ------
    UnknownPolicyError, UnknownBackendError, InvalidOptionError
        For unknown names, options or a policy over another problem type.
    InvalidProblemError
        For a malformed cluster.
    """

    def __init__(self, cluster: Cluster | Mapping[str, int], policy: str = "max_min_fairness",
                 backend: str = "highs", *, policy_options: Mapping[str, Any] | None = None,
                 solve_options: Mapping[str, Any] | None = None, throughput_smoothing: float = 1.0,
                 round_seconds: float = 360.0, recompute_min_seconds: float = 1920.0,
                 placement: str | PlacementPolicy = "best_fit"):
        if not isinstance(cluster, Cluster):
            cluster = Cluster(cluster)
        pol = get_policy(policy)
        if pol.problem_type is not Problem:
            raise InvalidOptionError(f"policy {policy!r} allocates an allocopt.{pol.problem_type.__name__}; "
                                     "the Engine allocates jobs with throughputs per GPU type (allocopt.Problem)")
        if backend != "auto" and backend not in BACKENDS:
            raise UnknownBackendError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)} or 'auto'")
        policy_options = dict(policy_options or {})
        unknown = sorted(set(policy_options) - set(pol.options))
        if unknown:
            raise InvalidOptionError(f"policy {policy!r} has no option(s) {unknown}; its options: "
                                     f"{', '.join(sorted(pol.options)) or 'none'}")
        solve_options = dict(solve_options or {})
        unknown = sorted(set(solve_options) - set(SOLVE_OPTIONS))
        if unknown:
            raise InvalidOptionError(f"unknown solve option(s) {unknown}; choose from {', '.join(SOLVE_OPTIONS)} "
                                     "(policy options go in policy_options)")
        for name, options in (("policy_options", policy_options), ("solve_options", solve_options)):
            try:
                json.dumps(options, allow_nan=False)
            except (TypeError, ValueError, RecursionError) as err:
                raise InvalidOptionError(f"{name} must hold JSON values (the engine saves them): {err}") from None
        # the values are checked now, not at the first allocate()
        check_policy_options(pol, policy_options)
        try:
            SolveOptions(**{k: v for k, v in solve_options.items() if k != "best_effort"})
        except InvalidOptionError as err:
            raise InvalidOptionError(f"solve_options: {err}") from None
        if not isinstance(solve_options.get("best_effort", False), bool):
            raise InvalidOptionError(f"solve_options: best_effort must be true or false, got "
                                     f"{solve_options['best_effort']!r}")
        if (isinstance(recompute_min_seconds, bool) or not isinstance(recompute_min_seconds, numbers.Real)
                or not 0 <= recompute_min_seconds <= MAX_ROUND_SECONDS):
            raise InvalidOptionError(f"recompute_min_seconds must be a number of seconds from 0 to "
                                     f"{MAX_ROUND_SECONDS:g}, got {recompute_min_seconds!r}")
        if (isinstance(throughput_smoothing, bool) or not isinstance(throughput_smoothing, (int, float))
                or not 0 < throughput_smoothing <= 1):
            raise InvalidOptionError(f"throughput_smoothing must be in (0, 1], got {throughput_smoothing!r}")
        # next_round's contract: jobs added between recomputes run on otherwise idle GPUs, an
        # allocation is installed at most once per recompute_min_seconds (time 0 included), and
        # shares follow the allocation however often it is recomputed (time owed counts)
        self.mechanism_options = MechanismOptions(round_seconds=_seconds(round_seconds, "round_seconds"),
                                                  recompute_min_seconds=recompute_min_seconds, run_unallocated=True,
                                                  time_zero_recomputes_free=False, deficit_in_priority=True)
        self.placement = placement_policy(placement)
        self._placement_name = placement if isinstance(placement, str) else "best_fit"
        self.placement_models: dict[Hashable, str] = {}
        self.policy = policy
        self.backend = backend
        self.policy_options = policy_options
        self.solve_options = solve_options
        self.throughput_smoothing = float(throughput_smoothing)
        self.version = 0
        self._lock = threading.RLock()
        self._gpus = dict(zip(cluster.gpu_types, cluster.capacity.tolist()))
        self._gpus_per_node = dict(zip(cluster.gpu_types, cluster.gpus_per_node.tolist()))
        self._jobs: dict[Hashable, dict[str, Any]] = {}
        self._table = JobTable(self._gpus)  # the jobs' columns, from which problem() is cut
        self._measured: dict[Hashable, set[str]] = {}  # job -> GPU types with a measured throughput
        self._cached: tuple[int, Allocation] | None = None
        # Round state (next_round): per job, the installed allocation, received seconds and deficit per GPU
        # type, and the GPUs held last round as (type, type-local indices); pending: the unrecorded leases.
        self._round_jobs: dict[Hashable, dict[str, Any]] = {}
        self._round_index = 0
        self._clock_s = 0.0
        self._last_reset_s: float | None = None
        self._installed_version: int | None = None
        self._pending: dict[Hashable, str] = {}
        self._pending_seconds = 0.0

    # ----- state ------------------------------------------------------------------------
    @property
    def cluster(self) -> Cluster:
        """The cluster now."""
        with self._lock:
            return Cluster(self._gpus, self._gpus_per_node)

    @property
    def job_ids(self) -> tuple[Hashable, ...]:
        """Job ids in the order they were added."""
        with self._lock:
            return tuple(self._jobs)

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        with self._lock:
            return job_id in self._jobs

    def get_job(self, job_id: Hashable) -> dict[str, Any]:
        """The job as a problem-document job object: ``{"id", "throughputs", "scale_factor", ...}``.

        ``throughputs`` has every GPU type of the cluster (0.0 where none was given).
        """
        with self._lock:
            return self._job_document(job_id, self._entry(job_id))

    # ----- jobs -------------------------------------------------------------------------
    def add_job(self, job_id: str | int, throughputs: Mapping[str, float], scale_factor: int = 1,
                priority_weight: float = 1.0, num_steps_remaining: float | None = None,
                time_since_start_s: float | None = None, slo_s: float | None = None,
                time_isolated_s: float | None = None, entity: str | int | None = None) -> None:
        """Add a job.

        Parameters
        ----------
        job_id : str or int
        throughputs : mapping of str to float
            Steps/s of the whole job on ``scale_factor`` GPUs of each type;
            types left out count as 0 (the job cannot run there).
        scale_factor : int, default 1
            GPUs the job uses at once.
        priority_weight : float, default 1.0
        num_steps_remaining, time_since_start_s, slo_s, time_isolated_s, entity : optional
            As in the problem document (steps, seconds, seconds from now, seconds, entity label).

        Raises
        ------
        DuplicateJobError
            When ``job_id`` is already in the engine.
        InvalidProblemError
            For a malformed value; ``field`` names it.
        """
        fields = {"scale_factor": scale_factor, "priority_weight": priority_weight,
                  "num_steps_remaining": num_steps_remaining, "time_since_start_s": time_since_start_s,
                  "slo_s": slo_s, "time_isolated_s": time_isolated_s, "entity": entity}
        with self._lock:
            self._check_job_id(job_id)
            if job_id in self._jobs:
                raise DuplicateJobError(f"job {job_id!r} is already in the engine; update it with update_job "
                                        "or remove it first", field="job_id", job=job_id)
            entry = {"throughputs": throughputs, **{k: v for k, v in fields.items() if v is not None}}
            self._store(job_id, self._validated(job_id, entry))
            self._changed()

    def update_job(self, job_id: Hashable, **fields: Any) -> None:
        """Change fields of a job (the keyword arguments of :meth:`add_job` but ``job_id``).

        ``throughputs`` updates the GPU types it names and keeps the others; a
        field set to None goes back to its default (1 GPU, weight 1.0, unset).

        Raises
        ------
        UnknownJobError
        InvalidProblemError
            For an unknown field or a malformed value; ``field`` names it. The job is left unchanged.
        """
        unknown = sorted(set(fields) - {"throughputs", *JOB_FIELDS})
        if unknown:
            raise InvalidProblemError(f"update_job got unknown field(s) {unknown}; known: throughputs, "
                                      f"{', '.join(JOB_FIELDS)}", field=unknown[0])
        with self._lock:
            entry = dict(self._entry(job_id))
            for name, value in fields.items():
                if name == "throughputs":
                    if not isinstance(value, Mapping):
                        raise InvalidProblemError(f"throughputs of job {job_id!r} must be a mapping of GPU type "
                                                  f"to steps/s, got {type(value).__name__}",
                                                  field="throughputs", job=job_id)
                    entry["throughputs"] = {**entry["throughputs"], **value}
                elif value is None:
                    entry.pop(name, None)
                else:
                    entry[name] = value
            self._store(job_id, self._validated(job_id, entry))
            if "throughputs" in fields and job_id in self._measured:
                self._measured[job_id] -= set(fields["throughputs"])
            self._changed()

    def remove_job(self, job_id: Hashable) -> None:
        """Remove a job (finished or cancelled).

        Raises
        ------
        UnknownJobError
        """
        with self._lock:
            self._entry(job_id)
            del self._jobs[job_id]
            self._table.remove(job_id)
            self._round_jobs.pop(job_id, None)
            self._pending.pop(job_id, None)
            self._measured.pop(job_id, None)
            self._changed()

    def observe_throughput(self, job_id: Hashable, gpu_type: str, steps_per_s: float) -> float:
        """Record a measured throughput of a job on a GPU type; return the new estimate in steps/s.

        The first measurement of the pair replaces the throughput given when the
        job was added; later ones are smoothed (see ``throughput_smoothing``).

        Raises
        ------
        UnknownJobError
        InvalidProblemError
            For an unknown GPU type or a negative or non-finite value.
        """
        with self._lock:
            entry = self._entry(job_id)
            self._check_gpu_type(gpu_type)
            value = _finite_non_negative(steps_per_s, "steps_per_s", job_id)
            if gpu_type in self._measured.get(job_id, ()):
                old = float(entry["throughputs"].get(gpu_type, 0.0))
                value = (1 - self.throughput_smoothing) * old + self.throughput_smoothing * value
            updated = {**entry, "throughputs": {**entry["throughputs"], gpu_type: value}}
            self._store(job_id, self._validated(job_id, updated))
            self._measured.setdefault(job_id, set()).add(gpu_type)
            self._changed()
            return value

    # ----- cluster ----------------------------------------------------------------------
    def set_capacity(self, gpu_type: str, count: int, *, gpus_per_node: int | None = None) -> None:
        """Set the number of GPUs of a type (nodes joined or left); a new type is added.

        Jobs have throughput 0 on a new type until :meth:`update_job` or
        :meth:`observe_throughput` gives one. Jobs that no longer fit anywhere
        stay in the engine and get no allocation until capacity returns (see
        :meth:`allocate`).

        Parameters
        ----------
        gpu_type : str
        count : int
            GPUs of the type, >= 0.
        gpus_per_node : int, optional
            GPUs per server of the type; default: unchanged, or 8 for a new type.

        Raises
        ------
        InvalidProblemError
            For a negative or non-integer count, or an empty type name.
        """
        if not isinstance(gpu_type, str) or not gpu_type:
            raise InvalidProblemError(f"gpu_type must be a non-empty string, got {gpu_type!r}", field="gpu_type")
        with self._lock:
            per_node = self._gpus_per_node.get(gpu_type, DEFAULT_GPUS_PER_NODE)
            cluster = Cluster({**self._gpus, gpu_type: count},
                              {**self._gpus_per_node, gpu_type: per_node if gpus_per_node is None else gpus_per_node})
            self._gpus = dict(zip(cluster.gpu_types, cluster.capacity.tolist()))
            self._gpus_per_node = dict(zip(cluster.gpu_types, cluster.gpus_per_node.tolist()))
            self._table.add_gpu_type(gpu_type)
            self._changed()

    # ----- allocation -------------------------------------------------------------------
    def problem(self) -> tuple[Problem, tuple[Hashable, ...]]:
        """The problem :meth:`allocate` solves now, and the jobs left out of it.

        Jobs left out cannot run on the cluster now: no GPU type with positive
        throughput has at least their ``scale_factor`` GPUs.
        """
        with self._lock:
            return self._table.problem(Cluster(self._gpus, self._gpus_per_node))

    def allocate(self) -> Allocation:
        """The allocation of the current state, solved again only if the state changed,
        starting from the previous allocation's solver basis (``allocopt.solve(warm_start=...)``).

        Jobs that cannot run on the cluster now are left out of the
        allocation's problem and listed in ``allocation.extras["waiting_jobs"]``;
        ``allocation.extras["engine_version"]`` is the :attr:`version` it was computed at.

        Raises
        ------
        InvalidProblemError
            When the jobs together do not form a valid problem (e.g. some jobs
            give ``num_steps_remaining`` and others not).
        NotOptimalError, SolverError, ...
            As :func:`allocopt.solve`; nothing is cached then.
        """
        with self._lock:
            if self._cached is not None and self._cached[0] == self.version:
                return self._cached[1]
            problem, waiting = self.problem()
            previous = self._cached[1] if self._cached is not None else None
            allocation = solve(problem, self.policy, backend=self.backend, warm_start=previous,
                               **self.solve_options, **self.policy_options)
            allocation = dataclasses.replace(allocation, extras={**allocation.extras, "waiting_jobs": list(waiting),
                                                                 "engine_version": self.version})
            self._cached = (self.version, allocation)
            return allocation

    # ----- rounds -----------------------------------------------------------------------
    def next_round(self, round_seconds: float | None = None) -> RoundPlan:
        """The next round's leases under Gavel's priority mechanism, with GPU ids.

        Each job's priority on a GPU type is its allocated time fraction over the
        share of that type's time it received (:mod:`allocopt.mechanism.priority`);
        selected jobs are placed on GPU ids (:mod:`allocopt.mechanism.placement`),
        keeping last round's GPUs where possible (``Lease.extended``).
        ``RoundPlan.stop`` lists the jobs that held GPUs last round and hold none
        now (removed jobs are not listed). A changed state is solved again
        (:meth:`allocate`) and installed at most once per ``recompute_min_seconds``;
        jobs added in between run on otherwise idle GPUs until then.

        Run time is credited by :meth:`record_round`; when it is not called
        before the next :meth:`next_round`, every lease counts as having run its
        full round. The round clock (``RoundPlan.start_s``) advances by each
        round's length. GPU ids are numbered by :class:`~allocopt.mechanism.placement.GpuLayout`
        over the cluster now, so a capacity change renumbers them; a job keeps
        its GPUs when the same type-local GPUs still exist.

        Parameters
        ----------
        round_seconds : float, optional
            Length of this round in seconds (default: the engine's ``round_seconds``).

        Raises
        ------
        InvalidOptionError
            For a round length that is not a positive finite number.
        NotOptimalError, SolverError, ...
            As :meth:`allocate`.
        """
        seconds = _seconds(self.mechanism_options.round_seconds if round_seconds is None else round_seconds,
                           "round_seconds")
        with self._lock:
            self._credit(((job, gpu_type, self._pending_seconds) for job, gpu_type in self._pending.items()))
            types, ids = list(self._gpus), list(self._jobs)
            initial = self.mechanism_options.initial_received_rounds * self.mechanism_options.round_seconds
            for job in ids:
                self._round_jobs.setdefault(job, {"allocation": {}, "received_s": {}, "deficit_s": {},
                                                  "gpu_type": None, "gpu_slots": []})
            states = [self._round_jobs[job] for job in ids]

            def matrix(key: str, default: float) -> np.ndarray:
                return np.array([[s[key].get(t, default) for t in types] for s in states]).reshape(len(ids), len(types))

            throughputs = np.array([[self._jobs[j]["throughputs"].get(t, 0.0) for t in types] for j in ids]
                                   ).reshape(len(ids), len(types))
            scale = np.array([int(self._jobs[j].get("scale_factor", 1)) for j in ids], dtype=np.int64)
            capacity = np.array([self._gpus[t] for t in types], dtype=np.int64)
            mechanism = PriorityMechanism(throughputs, scale, capacity, types, self.mechanism_options)
            mechanism.allocation = matrix("allocation", 0.0)
            mechanism.received_s = matrix("received_s", initial)
            mechanism.deficit_s = matrix("deficit_s", 0.0)
            mechanism.last_reset_s = self._last_reset_s
            rows = np.arange(len(ids))
            if self._installed_version != self.version and mechanism.recompute_due(self._clock_s):
                allocation = self.allocate()
                row_of = {job: k for k, job in enumerate(allocation.job_ids)}
                new = np.array([allocation.matrix[row_of[j]] if j in row_of else np.zeros(len(types))
                                for j in ids]).reshape(len(ids), len(types))
                mechanism.reset(self._clock_s, rows, new)
                self._last_reset_s, self._installed_version = self._clock_s, self.version
                for k, state in enumerate(states):
                    for key in ("allocation", "received_s", "deficit_s"):
                        state[key] = dict(zip(types, getattr(mechanism, key)[k].tolist()))
            chosen = mechanism.select(rows)
            run = np.flatnonzero(chosen >= 0)
            layout = GpuLayout(self.cluster)
            previous = {}
            for job, state in zip(ids, states):
                gpu_type, slots = state["gpu_type"], state["gpu_slots"]
                if gpu_type in self._gpus and slots and max(slots) < self._gpus[gpu_type]:
                    start = int(layout.type_start[types.index(gpu_type)])
                    previous[job] = tuple(start + s for s in slots)
            run_ids = [ids[k] for k in run]
            held_ids = [previous.get(job, ()) for job in run_ids]
            counts = np.fromiter(map(len, held_ids), dtype=np.int64, count=len(held_ids))
            previous_ids = np.fromiter((g for gpus in held_ids for g in gpus), dtype=np.int64,
                                       count=int(counts.sum()))
            placed = self.placement.place(layout, chosen[run], scale[run], previous_ids, counts,
                                          [self.placement_models.get(job, str(job)) for job in run_ids])
            bounds, flat = placed.start.tolist(), placed.gpu_ids.tolist()
            leases = []
            for i, (k, job) in enumerate(zip(run.tolist(), run_ids)):
                if not placed.placed[i]:  # the placement policy defers it (e.g. consolidated: no whole servers)
                    continue
                remaining = self._jobs[job].get("num_steps_remaining")
                leases.append(Lease(job, types[chosen[k]], tuple(flat[bounds[i]:bounds[i + 1]]), seconds,
                                    max_steps=None if remaining is None else math.ceil(remaining),
                                    extended=bool(placed.extended[i])))
            held = {lease.job_id: lease for lease in leases}
            stop = tuple(job for job, state in zip(ids, states) if state["gpu_type"] is not None and job not in held)
            for job, state in zip(ids, states):
                lease = held.get(job)
                state["gpu_type"] = lease.gpu_type if lease else None
                start = int(layout.type_start[types.index(lease.gpu_type)]) if lease else 0
                state["gpu_slots"] = [g - start for g in lease.gpu_ids] if lease else []
            plan = RoundPlan(self._round_index, self._clock_s, seconds, tuple(leases), stop)
            self._pending = {lease.job_id: lease.gpu_type for lease in leases}
            self._pending_seconds = seconds
            self._round_index += 1
            self._clock_s += seconds
            return plan

    def record_round(self, results: Sequence[JobRoundResult]) -> None:
        """Credit the run time of the last :meth:`next_round`'s leases.

        Each result adds its ``run_seconds`` to the job's received time on its
        lease's GPU type, and a ``measured_steps_per_s`` goes to
        :meth:`observe_throughput`. Leases without a result count 0 seconds;
        results of jobs removed since the plan are ignored. Call it at most
        once per round.

        Raises
        ------
        InvalidProblemError
            When no round is awaiting results, for a job without a lease in that
            round, a negative or non-finite ``run_seconds`` or
            ``measured_steps_per_s``, or a measurement the job cannot take (e.g.
            0 steps/s on its only GPU type). All or nothing: the engine is left
            exactly as before the call then.
        """
        with self._lock:
            credits = []
            for result in results:
                if result.job_id not in self._pending:
                    if result.job_id in self._jobs or not self._round_index:
                        raise InvalidProblemError(f"job {result.job_id!r} has no lease awaiting results (call "
                                                  "record_round once after each next_round)", field="results",
                                                  job=result.job_id)
                    continue
                run_s = result.run_seconds
                if (isinstance(run_s, bool) or not isinstance(run_s, numbers.Real)
                        or not 0 <= run_s <= MAX_ROUND_SECONDS):
                    raise InvalidProblemError(f"run_seconds of job {result.job_id!r} is {run_s!r}; give seconds "
                                              f"from 0 to {MAX_ROUND_SECONDS:g}", field="run_seconds",
                                              job=result.job_id)
                if result.measured_steps_per_s is not None:
                    _finite_non_negative(result.measured_steps_per_s, "measured_steps_per_s", result.job_id)
                credits.append((result.job_id, self._pending[result.job_id], float(run_s)))
            saved = (dict(self._jobs), {job: set(types) for job, types in self._measured.items()}, self.version,
                     self._pending,
                     {job: dict(state["received_s"]) for job, state in self._round_jobs.items()})
            pending = self._pending
            try:
                self._pending = {}
                self._credit(credits)
                for result in results:
                    if result.job_id in pending and result.measured_steps_per_s is not None:
                        self.observe_throughput(result.job_id, pending[result.job_id], result.measured_steps_per_s)
            except BaseException:
                for job, entry in saved[0].items():
                    if self._jobs.get(job) is not entry:
                        self._table.set(job, entry)
                self._jobs, self._measured, self.version, self._pending = saved[:4]
                for job, received in saved[4].items():
                    self._round_jobs[job]["received_s"] = received
                raise

    def _credit(self, credits: Iterable[tuple[Hashable, str, float]]) -> None:
        """Add (job, GPU type, seconds) run times to the received-time counters; no round is pending after."""
        initial = self.mechanism_options.initial_received_rounds * self.mechanism_options.round_seconds
        for job, gpu_type, seconds in credits:
            received = self._round_jobs[job]["received_s"]
            received[gpu_type] = received.get(gpu_type, initial) + seconds
        self._pending = {}

    # ----- persistence ------------------------------------------------------------------
    @overload
    def to_json(self, path: None = None) -> dict[str, Any]: ...

    @overload
    def to_json(self, path: str | os.PathLike[str]) -> None: ...

    def to_json(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
        """The engine's state as a JSON document (written to ``path`` when given, atomically);
        its ``cluster`` and ``jobs`` form a problem document."""
        return document_or_write(self._state_document(), path)

    def _state_document(self) -> dict[str, Any]:
        with self._lock:
            return {"format": STATE_FORMAT, "format_version": STATE_FORMAT_VERSION, "version": self.version,
                    "policy": self.policy, "backend": self.backend, "policy_options": self.policy_options,
                    "placement": self._placement_name,
                    "solve_options": self.solve_options, "throughput_smoothing": self.throughput_smoothing,
                    "cluster": {"gpus": dict(self._gpus), "gpus_per_node": dict(self._gpus_per_node)},
                    "jobs": [self._job_document(j, e) for j, e in self._jobs.items()],
                    "measured": [[j, t] for j, t in sorted(((j, t) for j, types in self._measured.items()
                                                            for t in types), key=repr)],
                    "round_seconds": self.mechanism_options.round_seconds,
                    "recompute_min_seconds": self.mechanism_options.recompute_min_seconds,
                    "rounds": {"round_index": self._round_index, "clock_s": self._clock_s,
                               "last_reset_s": self._last_reset_s, "installed_version": self._installed_version,
                               "pending": [[j, t] for j, t in self._pending.items()],
                               "pending_seconds": self._pending_seconds,
                               "jobs": [[j, state] for j, state in self._round_jobs.items()]}}

    @classmethod
    def from_json(cls, source: JsonSource) -> Engine:
        """An engine in the state of a document written by :meth:`to_json`, or of the JSON file at path ``source``.

        Every field is checked here (``allocopt/schemas/engine_state.schema.json``
        and the values' ranges): a state that loads can be allocated and
        planned. Files (:meth:`load`) and the service's ``POST /engine`` go
        through this one loader.

        Raises
        ------
        InvalidProblemError
            For a document of another format or with malformed content; the
            message and ``field`` name the offending field (e.g. ``rounds.clock_s``).
        DataFileError
            For a file that cannot be read or is not JSON.
        """
        document = read_json(source, what="engine state")
        if not isinstance(document, Mapping) or document.get("format") != STATE_FORMAT:
            raise InvalidProblemError(f"not an engine state document: 'format' must be {STATE_FORMAT!r}",
                                      field="format")
        if document.get("format_version") != STATE_FORMAT_VERSION or isinstance(document["format_version"], bool):
            raise InvalidProblemError(f"unsupported engine state format_version {document.get('format_version')!r}; "
                                      f"this allocopt reads {STATE_FORMAT_VERSION}", field="format_version")
        missing = [name for name in ("version", "policy", "backend", "cluster", "jobs") if name not in document]
        if missing:
            raise _state_error(missing[0], "is missing (a state document as Engine.to_json writes it has "
                                           "version, policy, backend, cluster and jobs)")
        unknown = sorted(set(document) - _STATE_FIELDS, key=str)
        if unknown:
            raise _state_error(str(unknown[0]), "is not a field of an engine state; known: "
                                                f"{', '.join(sorted(_STATE_FIELDS))}")
        jobs, measured = document.get("jobs", []), document.get("measured", [])
        if not isinstance(jobs, list) or not all(isinstance(j, Mapping) and "id" in j for j in jobs):
            raise InvalidProblemError("'jobs' must be a list of job objects with an 'id'", field="jobs")
        if not isinstance(measured, list):
            raise _state_error("measured", "must be a list of [job_id, gpu_type]")
        for name in ("policy", "backend", "placement"):
            if not isinstance(document.get(name, ""), str):
                raise _state_error(name, f"must be a string, got {document[name]!r}")
        for name in ("policy_options", "solve_options"):
            if not isinstance(document.get(name, {}), Mapping):
                raise _state_error(name, f"must be an object, got {document[name]!r}")
        try:
            check_cluster_document(document.get("cluster"))
        except InvalidProblemError as err:
            raise InvalidProblemError(f"engine state: {err}", field=err.field) from None
        try:
            engine = cls(Cluster.from_dict(document["cluster"]), document.get("policy", "max_min_fairness"),
                         document.get("backend", "highs"), policy_options=document.get("policy_options"),
                         solve_options=document.get("solve_options"),
                         throughput_smoothing=document.get("throughput_smoothing", 1.0),
                         round_seconds=document.get("round_seconds", 360.0),
                         recompute_min_seconds=document.get("recompute_min_seconds", 1920.0),
                         placement=document.get("placement", "best_fit"))
        except InvalidOptionError as err:
            raise _state_error("options", str(err)) from None
        for k, job in enumerate(jobs):
            unknown = sorted(set(job) - {"id", "throughputs", *JOB_FIELDS}, key=str)
            if unknown or "throughputs" not in job:
                raise InvalidProblemError(f"jobs[{k}] must have 'id' and 'throughputs' and no field(s) other than "
                                          f"{', '.join(JOB_FIELDS)}; got {sorted(job, key=str)}", field=f"jobs[{k}]")
            try:
                engine.add_job(job["id"], **{key: v for key, v in job.items() if key != "id"})
            except InvalidProblemError as err:
                field = "id" if err.field == "job_id" else err.field
                raise InvalidProblemError(f"jobs[{k}]: {err}", field=f"jobs[{k}].{field}", job=err.job) from None
        for cell in measured:
            if not (isinstance(cell, list) and len(cell) == 2 and _known(cell[0], engine._jobs)
                    and _known(cell[1], engine._gpus)):
                raise InvalidProblemError(f"'measured' entry {cell!r} must be [job_id, gpu_type] of a known job "
                                          "and type", field="measured")
            engine._measured.setdefault(cell[0], set()).add(cell[1])
        version = document.get("version", engine.version)
        if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= 2**63 - 1:
            raise InvalidProblemError(f"'version' must be a non-negative integer, got {version!r}", field="version")
        engine.version = version
        engine._restore_rounds(document.get("rounds", {}))
        return engine

    def _restore_rounds(self, rounds: Any) -> None:
        """Install the round state of a state document (see :meth:`to_json`), every field checked."""
        if not isinstance(rounds, Mapping):
            raise _state_error("rounds", "must be an object")
        unknown = sorted(set(rounds) - {"round_index", "clock_s", "last_reset_s", "installed_version", "pending",
                                        "pending_seconds", "jobs"}, key=str)
        if unknown:
            raise _state_error(f"rounds.{unknown[0]}", "is not a field of the round state")
        round_index = _state_int(rounds.get("round_index", 0), "rounds.round_index")
        clock_s = _state_seconds(rounds.get("clock_s", 0.0), "rounds.clock_s")
        pending_seconds = _state_seconds(rounds.get("pending_seconds", 0.0), "rounds.pending_seconds")
        installed, last_reset = rounds.get("installed_version"), rounds.get("last_reset_s")
        if installed is not None:
            installed = _state_int(installed, "rounds.installed_version")
            if installed > self.version:
                raise _state_error("rounds.installed_version", f"is {installed}, after the engine's version "
                                                               f"{self.version}")
        if last_reset is not None:
            last_reset = _state_seconds(last_reset, "rounds.last_reset_s")
            if last_reset > clock_s:
                raise _state_error("rounds.last_reset_s", f"is {last_reset}, after the round clock {clock_s}")
        entries = rounds.get("jobs", [])
        if not isinstance(entries, list):
            raise _state_error("rounds.jobs", "must be a list of [job_id, state]")
        jobs: dict[Hashable, dict[str, Any]] = {}
        for k, entry in enumerate(entries):
            where = f"rounds.jobs[{k}]"
            if not (isinstance(entry, list) and len(entry) == 2 and _known(entry[0], self._jobs)):
                raise _state_error(where, "must be [job_id, state] of a job in 'jobs'")
            job, state = entry
            if job in jobs:
                raise _state_error(where, f"repeats job {job!r}")
            if not isinstance(state, Mapping) or set(state) != _ROUND_JOB_FIELDS:
                raise _state_error(where, "state must be an object with exactly "
                                          f"{', '.join(sorted(_ROUND_JOB_FIELDS))}")
            restored: dict[str, Any] = {}
            for key in ("allocation", "received_s", "deficit_s"):
                restored[key] = self._per_type(state[key], f"{where}.{key}", negative=key == "deficit_s")
            gpu_type, slots = state["gpu_type"], state["gpu_slots"]
            if gpu_type is not None and not _known(gpu_type, self._gpus):
                raise _state_error(f"{where}.gpu_type", f"is {gpu_type!r}, not a GPU type of the cluster "
                                                        f"{list(self._gpus)}")
            if not isinstance(slots, list) or (gpu_type is None and slots):
                raise _state_error(f"{where}.gpu_slots", "must be a list of GPU indices (empty without a gpu_type)")
            restored["gpu_type"] = gpu_type
            restored["gpu_slots"] = [_state_int(g, f"{where}.gpu_slots", 2**31) for g in slots]
            jobs[job] = restored
        pending_list = rounds.get("pending", [])
        if not isinstance(pending_list, list):
            raise _state_error("rounds.pending", "must be a list of [job_id, gpu_type]")
        pending: dict[Hashable, str] = {}
        for k, cell in enumerate(pending_list):
            if not (isinstance(cell, list) and len(cell) == 2 and _known(cell[0], jobs)
                    and _known(cell[1], self._gpus)):
                raise _state_error(f"rounds.pending[{k}]", f"is {cell!r}; give [job_id, gpu_type] of a job in "
                                                           "rounds.jobs and a GPU type of the cluster")
            pending[cell[0]] = cell[1]
        self._round_index, self._clock_s, self._pending_seconds = round_index, clock_s, pending_seconds
        self._installed_version, self._last_reset_s = installed, last_reset
        self._round_jobs, self._pending = jobs, pending

    def _per_type(self, values: Any, field: str, *, negative: bool) -> dict[str, float]:
        """A per-GPU-type map of seconds or fractions from a state document, checked."""
        if not isinstance(values, Mapping):
            raise _state_error(field, "must be an object of GPU type to number")
        out = {}
        for gpu_type, value in values.items():
            if not _known(gpu_type, self._gpus):
                raise _state_error(f"{field}.{gpu_type}", "names an unknown GPU type; the cluster's are "
                                                          f"{list(self._gpus)}")
            ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and abs(value) <= MAX_CLOCK_SECONDS
            if not ok or (value < 0 and not negative):
                raise _state_error(f"{field}.{gpu_type}", f"is {value!r}; give a number from "
                                                          f"{-MAX_CLOCK_SECONDS if negative else 0:g} to "
                                                          f"{MAX_CLOCK_SECONDS:g}")
            out[gpu_type] = float(value)
        return out

    def save(self, path: str | os.PathLike) -> None:
        """Write the state to ``path`` as JSON, atomically (the same as ``to_json(path)``)."""
        self.to_json(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Engine:
        """An engine in the state saved at ``path`` by :meth:`save`.

        Raises
        ------
        DataFileError
            Naming ``path`` (and the line, for a syntax error), for a file that
            cannot be read, is not JSON, or holds an invalid state (as :meth:`from_json`).
        """
        document = parse_json(read_text(path, what="the engine state"), path)
        try:
            return cls.from_json(document)
        except AllocoptError as err:
            raise DataFileError(f"invalid engine state: {str(err).removeprefix('engine state: ')}", path=path) from None

    def __repr__(self) -> str:
        with self._lock:
            gpus = ", ".join(f"{t}={c}" for t, c in self._gpus.items())
            return (f"Engine(policy={self.policy!r}, backend={self.backend!r}, n_jobs={len(self._jobs)}, "
                    f"gpus=({gpus}), version={self.version})")

    # ----- helpers ------------------------------------------------------------------------
    def _changed(self) -> None:
        self.version += 1

    def _store(self, job_id: Hashable, entry: dict[str, Any]) -> None:
        """Keep a validated entry, and its row of the job table."""
        self._jobs[job_id] = entry
        self._table.set(job_id, entry)

    def _entry(self, job_id: Hashable) -> dict[str, Any]:
        try:
            return self._jobs[job_id]
        except (KeyError, TypeError):
            raise UnknownJobError(f"unknown job {job_id!r}; the engine has {len(self._jobs)} job(s)",
                                  field="job_id", job=job_id) from None

    def _check_gpu_type(self, gpu_type: Any) -> None:
        if gpu_type not in self._gpus:
            raise InvalidProblemError(f"unknown GPU type {gpu_type!r}; the cluster's types are "
                                      f"{list(self._gpus)} (add one with set_capacity)", field="gpu_type")

    @staticmethod
    def _check_job_id(job_id: Any) -> None:
        if isinstance(job_id, bool) or not isinstance(job_id, (str, int)):
            raise InvalidProblemError(f"job id {job_id!r} must be a string or an integer", field="job_id")

    def _job_document(self, job_id: Hashable, entry: Mapping[str, Any]) -> dict[str, Any]:
        tput = entry["throughputs"]
        return {"id": job_id, **entry, "throughputs": {t: float(tput.get(t, 0.0)) for t in self._gpus}}

    def _validated(self, job_id: Hashable, entry: dict[str, Any]) -> dict[str, Any]:
        """``entry`` with plain-float throughputs, after Problem's validation of the job alone."""
        tput = entry["throughputs"]
        if not isinstance(tput, Mapping):
            raise InvalidProblemError(f"throughputs of job {job_id!r} must be a mapping of GPU type to steps/s, "
                                      f"got {type(tput).__name__}", field="throughputs", job=job_id)
        for gpu_type in tput:
            self._check_gpu_type(gpu_type)
        values = {t: _finite_non_negative(v, f"throughputs.{t}", job_id) for t, v in tput.items()}
        for name in JOB_FIELDS:
            value, kind = entry.get(name), (str, int) if name == "entity" else numbers.Real
            if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
                expected = "a string or an integer" if name == "entity" else "a number"
                raise InvalidProblemError(f"{name} of job {job_id!r} must be {expected}, got {value!r}",
                                          field=name, job=job_id)
        entry = {**entry, "throughputs": values}
        cluster = {"gpus": {t: _VALIDATION_CAPACITY for t in self._gpus}}
        try:
            Problem.from_json({"cluster": cluster, "jobs": [self._job_document(job_id, entry)]})
        except InvalidProblemError as err:
            field = (err.field or "").removeprefix("jobs[0].")  # a schema path within the one-job document
            raise InvalidProblemError(str(err).replace("jobs[0].", "", 1), field=_FIELD_NAMES.get(field, field),
                                      job=job_id) from None
        return entry


#: Longest round (and recompute interval), and the largest round clock a state may hold: seconds.
#: Bounds keep every counter finite, so a state document is always valid JSON (no Infinity).
MAX_ROUND_SECONDS = 1e9
MAX_CLOCK_SECONDS = 1e15

_STATE_FIELDS = {"format", "format_version", "version", "policy", "backend", "policy_options", "solve_options",
                 "throughput_smoothing", "cluster", "jobs", "measured", "round_seconds", "recompute_min_seconds",
                 "rounds", "placement"}
_ROUND_JOB_FIELDS = {"allocation", "received_s", "deficit_s", "gpu_type", "gpu_slots"}


def _state_error(field: str, message: str) -> InvalidProblemError:
    return InvalidProblemError(f"engine state: {field} {message}", field=field)


def _known(key: Any, mapping: Mapping) -> bool:
    """``key in mapping`` for keys of any type (unhashable ones are not in it)."""
    try:
        return key in mapping
    except TypeError:
        return False


def _state_int(value: Any, field: str, limit: int = 2**63 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise _state_error(field, f"is {value!r}; give an integer from 0 to {limit}")
    return value


def _state_seconds(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= MAX_CLOCK_SECONDS:
        raise _state_error(field, f"is {value!r}; give a number of seconds from 0 to {MAX_CLOCK_SECONDS:g}")
    return float(value)


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= MAX_ROUND_SECONDS:
        raise InvalidOptionError(f"{name} must be a positive number of seconds up to {MAX_ROUND_SECONDS:g}, "
                                 f"got {value!r}")
    return float(value)


def _finite_non_negative(value: Any, name: str, job_id: Hashable) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise InvalidProblemError(f"{name} of job {job_id!r} is {value!r}; give finite steps/s >= 0",
                                  field=name, job=job_id)
    return float(value)
