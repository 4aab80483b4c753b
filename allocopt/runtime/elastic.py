"""Elastic, goodput-optimized jobs for ``allocopt run``: the job-file fields and the goodput engine.

An elastic job declares its initial batch size and limits and how many replicas it
may use; each round a goodput policy (``--policy sia``; others plug in with
:func:`register_goodput_policy`) picks its GPU type and replica count from the
job's goodput model (Pollux's, :mod:`allocopt.throughput.goodput`), the model
picks the batch size and accumulation steps for that allocation, and the executor
launches the job's ranks with them (``ALLOCOPT_BATCH_SIZE``...,
:func:`allocopt.runtime.launch.batch_environment`). A job whose GPUs or batch
change is stopped at its checkpoint and restarted; a job whose configuration stays
keeps running.

Each job's goodput model per GPU type is, in order of preference:

1. fitted (:func:`~allocopt.throughput.goodput.fit_perf_params`, Pollux's RMSE loss over the mean
   step time of each point, warm started from the previous fit) to
   its own step times on the type: the rows of its seed profile there
   (``seed_profile``, 1-GPU step times as Sia profiles a job) plus what it measured
   in earlier rounds;
2. else the fit of a type it has such rows on, projected by the two types'
   1-GPU throughput ratio (:func:`~allocopt.throughput.bootstrap.project`; ratio from
   the application profiles or seed profiles of both, 1 where unknown), as Sia does;
3. else its application's profile on the type (``--profiles``), or on another type.

A job with no model at all is offered one GPU of any type (goodput 1, as Sia's
simulator before a job's first run). Until a job has step times on every type it
may use it is offered one GPU of a type it has none on (Sia profiles a new job on
one GPU of each type), and it may take at most twice the GPUs it has held (Sia's
replica exploration); both can be switched off in :class:`GoodputOptions`.

Step times come from the executor: the steady-state steps/s of a round gives
the iteration time ``T`` at (nodes, replicas, micro-batch, accumulation steps
``s``); with a reported ``sync_time`` ``t_s`` the compute time of a micro-batch is
``(T - t_s) / (s + 1)``, else ``T / (s + 1)``. Measurements at the same
(nodes, replicas, micro-batch) are averaged. Gradient statistics come from the
job's ``grad_sqr``/``grad_var`` reports, else from its application's profile at
its initial batch size, else none (efficiency ``M0 / M``: the batch stays at its
initial size until the job reports them).

A job's length is its ``total_samples`` when it gives them (each launch ends at the step that
reaches them at its batch size), else its ``total_steps``; priorities (``priority_weight``) do not
enter Sia's objective.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, astuple, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from allocopt.cluster import Cluster
from allocopt.configurations import Configurations, sia_configurations
from allocopt.errors import InvalidOptionError, InvalidProblemError
from allocopt.runtime.executor import BatchSettings, JobRoundResult, RoundOutcome, RoundPlan
from allocopt.throughput.goodput import (PARAM_FLOOR_S, GoodputModel, GradParams, PerfParams, fit_perf_params,
                                        goodput_matrix, optimize_models)

log = logging.getLogger(__name__)

#: Seconds one restart is assumed to cost a job before one was measured (Pollux's restart penalty input).
DEFAULT_RESTART_S = 1.0
#: A job's model on a type is refitted when it has a step time at a new point, or when the mean step
#: time at a point moved by more than this fraction since the last fit.
REFIT_CHANGE = 0.05
#: How the learning rate follows the batch size: AdaScale's gain (Pollux's), linear, square root, or not.
LR_SCALINGS = ("adascale", "linear", "sqrt", "none")


# ----- the job file ---------------------------------------------------------------------
@dataclass(frozen=True)
class ElasticSpec:
    """What makes a job of the job file elastic (the fields sit beside ``name``, ``command``...).

    Attributes
    ----------
    batch_size : int
        Initial global batch size ``M0`` (samples per step over all replicas).
    application : str or None
        A profile name under ``--profiles`` (default: Sia's shipped profiles, e.g. ``cifar10``): prior
        step times, batch limits and gradient statistics.
    max_batch_size : int or None
        Largest global batch size; default the application's largest validated one, else ``batch_size``.
    min_local_bsz, max_local_bsz : int or None
        Smallest and largest micro-batch of one replica (samples; the largest is the memory limit);
        defaults: the application profile's, else 1 and ``max_batch_size``.
    min_replicas, max_replicas : int or None
        Fewest and most replicas (GPUs) the job may run on; ``max_replicas`` None: no limit.
    seed_profile : str or None
        A CSV of the job's own step times (``gpu_type, local_bsz, placement, step_time, sync_time``,
        as :func:`allocopt.throughput.profiles.read_seed_profile` reads), relative to the job file.
    restart_delay_s : float or None
        Seconds a restart costs (the policy's restart penalty); None: measured, :data:`DEFAULT_RESTART_S` before.
    lr_scaling : str
        One of :data:`LR_SCALINGS`; ``ALLOCOPT_LR_SCALE`` for batch ``M``: AdaScale's gain
        ``S * efficiency(M)`` with ``S = M / M0`` (``adascale``), ``S``, ``sqrt(S)`` or 1.
    total_samples : int or None
        The job's length in samples (as Pollux's and Sia's jobs train for a number of epochs): it
        ends at the first step that reaches them, whatever batch sizes it ran at; each launch gets
        ``ALLOCOPT_TOTAL_STEPS`` = its start step + ``ceil(samples left / batch size)``. None: the
        job's length is its ``total_steps``.
    """

    batch_size: int
    application: str | None = None
    max_batch_size: int | None = None
    min_local_bsz: int | None = None
    max_local_bsz: int | None = None
    min_replicas: int = 1
    max_replicas: int | None = None
    seed_profile: str | None = None
    restart_delay_s: float | None = None
    lr_scaling: str = "adascale"
    total_samples: int | None = None


#: Job-file keys of :class:`ElasticSpec`.
ELASTIC_KEYS = frozenset(f.name for f in fields(ElasticSpec))


def parse_elastic(entry: Mapping[str, Any], path: str | Path, name: str) -> ElasticSpec | None:
    """The :class:`ElasticSpec` of a job-file entry, None when it has none of :data:`ELASTIC_KEYS`.

    Raises
    ------
    InvalidProblemError
        Naming the file, the job and the field.
    """
    given = {k: entry[k] for k in ELASTIC_KEYS if k in entry}
    if not given:
        return None

    def bad(key: str, what: str) -> InvalidProblemError:
        return InvalidProblemError(f"{path}: job {name!r}: {key} {what}, got {entry.get(key)!r}", field=key, job=name)

    if "batch_size" not in given:
        raise bad("batch_size", "is needed by an elastic job (it gives application, min_replicas or the like)")
    ints = {}
    for key in ("batch_size", "max_batch_size", "min_local_bsz", "max_local_bsz", "min_replicas", "max_replicas",
                "total_samples"):
        if key in given and given[key] is not None:
            v = given[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer() \
                    or not 1 <= v <= (2 ** 53 if key == "total_samples" else 2 ** 31):
                raise bad(key, f"must be an integer from 1 to {'2**53' if key == 'total_samples' else '2**31'}")
            ints[key] = int(v)
    for lo, hi in (("batch_size", "max_batch_size"), ("min_local_bsz", "max_local_bsz"),
                   ("min_replicas", "max_replicas")):
        if lo in ints and hi in ints and ints[lo] > ints[hi]:
            raise bad(hi, f"must be at least {lo} ({ints[lo]})")
    for key in ("application", "seed_profile"):
        if given.get(key) is not None and not (isinstance(given[key], str) and given[key].strip()):
            raise bad(key, "must be a non-empty string")
    delay = given.get("restart_delay_s")
    if delay is not None and (isinstance(delay, bool) or not isinstance(delay, (int, float))
                              or not 0 < delay < math.inf):
        raise bad("restart_delay_s", "must be a number of seconds > 0")
    scaling = given.get("lr_scaling", "adascale")
    if scaling not in LR_SCALINGS:
        raise bad("lr_scaling", f"must be one of {', '.join(LR_SCALINGS)}")
    seed = given.get("seed_profile")
    if seed is not None:
        seed_path = Path(seed) if Path(seed).is_absolute() else Path(path).resolve().parent / seed
        if not seed_path.is_file():
            raise bad("seed_profile", f"must name a readable CSV file (looked for {seed_path})")
        seed = str(seed_path)
    return ElasticSpec(batch_size=ints["batch_size"], application=given.get("application"),
                       max_batch_size=ints.get("max_batch_size"), min_local_bsz=ints.get("min_local_bsz"),
                       max_local_bsz=ints.get("max_local_bsz"), min_replicas=ints.get("min_replicas", 1),
                       max_replicas=ints.get("max_replicas"), seed_profile=seed,
                       restart_delay_s=None if delay is None else float(delay), lr_scaling=scaling,
                       total_samples=ints.get("total_samples"))


# ----- goodput policies -------------------------------------------------------------------
#: A goodput policy's round: ``(jobs, cluster, configurations, goodput, previous_gpu_ids, *, round_index,
#: start_s, round_seconds, **options) -> SiaRoundPlan``, as :func:`allocopt.mechanism.sia_round_plan.plan_round`.
GoodputPlanner = Callable[..., Any]
_PLANNERS: dict[str, GoodputPlanner | str] = {"sia": "allocopt.mechanism.sia_round_plan:plan_round"}


def register_goodput_policy(name: str, planner: GoodputPlanner | str) -> None:
    """Make ``allocopt run --policy NAME`` plan elastic rounds with ``planner`` (a callable, or
    ``"module:function"`` imported on first use) taking and returning what
    :func:`~allocopt.mechanism.sia_round_plan.plan_round` does.

    Not needed for a policy registered in :data:`allocopt.formulations.POLICIES` over a
    :class:`~allocopt.goodput_problem.GoodputProblem`: its rounds are
    :func:`~allocopt.mechanism.sia_round_plan.plan_round` with ``policy=NAME`` (Sia's restart factors,
    pinning and placement around that policy's allocation)."""
    _PLANNERS[str(name)] = planner


def _problem_policies() -> list[str]:
    """Registered policies over a GoodputProblem (their modules are imported to tell)."""
    from allocopt.formulations import POLICIES
    from allocopt.goodput_problem import GoodputProblem

    return [name for name in POLICIES if getattr(POLICIES[name], "problem_type", None) is GoodputProblem]


def goodput_policies() -> tuple[str, ...]:
    """Names of the goodput policies: registered planners and policies over a GoodputProblem."""
    return tuple(sorted(set(_PLANNERS) | set(_problem_policies())))


def is_goodput_policy(name: str) -> bool:
    """Whether ``name`` is a goodput policy (planned by :class:`GoodputEngine`)."""
    if name in _PLANNERS:
        return True
    from allocopt.formulations import POLICIES
    from allocopt.goodput_problem import GoodputProblem

    return name in POLICIES and getattr(POLICIES[name], "problem_type", None) is GoodputProblem


def _planner(name: str) -> GoodputPlanner:
    planner = _PLANNERS.get(name)
    if planner is None and is_goodput_policy(name):
        import functools

        from allocopt.mechanism.sia_round_plan import plan_round

        planner = _PLANNERS[name] = functools.partial(plan_round, policy=name)
    if planner is None:
        raise InvalidOptionError(f"unknown goodput policy {name!r}; known: {', '.join(goodput_policies())}")
    if isinstance(planner, str):
        import importlib

        module, _, attr = planner.partition(":")
        planner = _PLANNERS[name] = getattr(importlib.import_module(module), attr)
    return planner


@dataclass(frozen=True)
class GoodputOptions:
    """Options of :class:`GoodputEngine`.

    Attributes
    ----------
    policy_options : mapping
        Passed to the policy's planner (Sia: ``p``, ``lambda_n``, ``lambda_a``, ``backend``...).
    explore_types : bool, default True
        Offer a job one GPU of a type it has no step times on until it has them on every type it may use.
    explore_replicas : bool, default True
        A job may take at most twice the GPUs it has held so far (1 before its first run).
    batch_tolerance : float, default 0.05
        A job that keeps its GPUs keeps its batch unless the model's best batch has more than this
        relative goodput gain (a new batch means a restart).
    max_nodes : int or None
        Most nodes one configuration may span (Sia's ``cluster_max_physical_nnodes``).
    refit_budget_s : float, default 0.25
        Seconds a round spends refitting models that have new step times, models of types without
        any fit first, then the longest-waiting ones; the others plan with their previous fit
        this round and are refitted in a later one.
    """

    policy_options: Mapping[str, Any] = field(default_factory=dict)
    explore_types: bool = True
    explore_replicas: bool = True
    batch_tolerance: float = 0.05
    max_nodes: int | None = None
    refit_budget_s: float = 0.25


# ----- per-job model state ----------------------------------------------------------------
@dataclass
class _Measured:
    """Mean step times at one (nodes, replicas, micro-batch) of one GPU type."""

    compute_s: float
    iter_s: float
    count: int = 1
    at_fit: float | None = None  # iter_s when the type's model was last fitted

    def add(self, compute_s: float, iter_s: float) -> None:
        self.count += 1
        self.compute_s += (compute_s - self.compute_s) / self.count
        self.iter_s += (iter_s - self.iter_s) / self.count


@dataclass
class _ElasticJob:
    spec: ElasticSpec
    state: Any  # SiaJobState
    submitted: float
    gpu_types: tuple[str, ...]
    seed: dict[str, dict[tuple[int, int, int], _Measured]] = field(default_factory=dict)
    measured: dict[str, dict[tuple[int, int, int], _Measured]] = field(default_factory=dict)
    fits: dict[str, PerfParams] = field(default_factory=dict)
    stale: set[str] = field(default_factory=set)
    grad: GradParams | None = None
    batch: BatchSettings | None = None
    most_gpus: int = 0
    restart_s: float | None = None
    steps_remaining: int | None = None
    steps_per_s: dict[str, float] = field(default_factory=dict)
    models: dict[str, GoodputModel | None] = field(default_factory=dict)  # cache of model(); cleared on changes
    samples_done: int = 0  # samples of the steps up to steps_at
    steps_at: int = 0
    last_batch: int | None = None  # batch size of its latest lease

    def rows(self, gpu_type: str) -> dict[tuple[int, int, int], _Measured]:
        """Seed rows of the type, overridden by measured ones at the same point."""
        return {**self.seed.get(gpu_type, {}), **self.measured.get(gpu_type, {})}


@dataclass(frozen=True)
class ElasticDecision:
    """What the engine decided for one lease: its batch and the goodput model it came from.

    ``model`` is the :class:`GoodputModel` whose optimum (at the lease's nodes and replicas) gave
    ``optimal``; ``batch`` is what the job runs (``optimal`` unless it kept its previous batch).
    """

    job_id: Hashable
    gpu_type: str
    num_nodes: int
    replicas: int
    batch: BatchSettings
    optimal: BatchSettings
    model: GoodputModel | None

    def to_json(self) -> dict[str, Any]:
        m = self.model
        return {"batch": asdict(self.batch), "optimal": asdict(self.optimal), "num_nodes": self.num_nodes,
                "model": None if m is None else {
                    "perf_params": list(astuple(m.perf_params)), "grad_params": [m.grad_params.sqr, m.grad_params.var],
                    "init_batch_size": m.init_batch_size, "max_batch_size": m.max_batch_size,
                    "max_local_bsz": m.max_local_bsz, "min_local_bsz": m.min_local_bsz}}


def model_from_json(doc: Mapping[str, Any]) -> GoodputModel:
    """The :class:`GoodputModel` of an :meth:`ElasticDecision.to_json` ``model`` entry."""
    return GoodputModel(PerfParams(*doc["perf_params"]), GradParams(*doc["grad_params"]), doc["init_batch_size"],
                        doc["max_batch_size"], doc["max_local_bsz"], min_local_bsz=doc["min_local_bsz"])


# ----- the engine ---------------------------------------------------------------------------
class GoodputEngine:
    """Plans rounds of elastic jobs with a goodput policy, keeps and refits each job's goodput model.

    The counterpart of :class:`allocopt.Engine` for elastic jobs, with the interface
    :class:`allocopt.runtime.loop.Scheduler` drives (``add_job``, ``update_job``, ``remove_job``,
    ``next_round``, ``record_round``, ``to_json``/``from_json``).

    Parameters
    ----------
    cluster : Cluster
    policy : str, default "sia"
        A registered goodput policy (:func:`goodput_policies`).
    round_seconds : float
    profiles : mapping of (application, gpu type) to ApplicationProfile, optional
        Prior models, batch limits and gradient statistics of the applications jobs name.
    options : GoodputOptions, optional
    """

    def __init__(self, cluster: Cluster, policy: str = "sia", *, round_seconds: float = 60.0,
                 profiles: Mapping[tuple[str, str], Any] | None = None, options: GoodputOptions | None = None):
        _planner(policy)
        self.cluster, self.policy, self.round_seconds = cluster, policy, float(round_seconds)
        self.options = options or GoodputOptions()
        self.profiles = dict(profiles or {})
        self.configurations: Configurations = sia_configurations(cluster, max_nodes=self.options.max_nodes)
        self._jobs: dict[Hashable, _ElasticJob] = {}
        self._gpu_ids: dict[Hashable, tuple[int, ...]] = {}
        self._round_index = 0
        self._prior_fits: dict[tuple[str, str], PerfParams] = {}
        self.decisions: dict[Hashable, ElasticDecision] = {}  # of the last planned round
        self._defer_refits = False  # while planning: stale models beyond the refit budget keep their fit
        self._stale_since: dict[tuple[Hashable, str], int] = {}  # round each pending refit was asked in
        self.solve_seconds: list[float] = []

    # ----- jobs ------------------------------------------------------------------------
    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def job_ids(self) -> list[Hashable]:
        """The jobs' ids, in the order they were added."""
        return list(self._jobs)

    @property
    def round_index(self) -> int:
        """Index of the next round :meth:`next_round` plans."""
        return self._round_index

    def add_job(self, job_id: Hashable, spec: ElasticSpec, *, gpu_types: Sequence[str] | None = None,
                submitted: float | None = None) -> None:
        """Add an elastic job (``gpu_types``: the types it may use, default all).

        Raises
        ------
        InvalidProblemError
            When its application has no profile, or its seed profile cannot be read.
        """
        from allocopt.mechanism.sia_round_plan import SiaJobState

        if spec.application is not None and not any(app == spec.application for app, _ in self.profiles):
            known = sorted({app for app, _ in self.profiles})
            raise InvalidProblemError(f"job {job_id!r}: no profile of application {spec.application!r} (profiles "
                                      f"of {', '.join(known) or 'none'}); pass --profiles DIR with "
                                      f"{spec.application}/placements-<type>.csv, or leave application out",
                                      field="application", job=job_id)
        allowed = [t for t in self.cluster.gpu_types if gpu_types is None or t in gpu_types]
        sizes = {t: int(self.configurations.num_gpus[self.configurations.gpu_type == k].max(initial=0))
                 for k, t in enumerate(self.cluster.gpu_types)}
        largest = max((sizes[t] for t in allowed), default=0)
        if largest < spec.min_replicas:
            raise InvalidProblemError(f"job {job_id!r}: min_replicas {spec.min_replicas} is more than the largest "
                                      f"configuration of its GPU types {allowed} ({largest} GPUs); lower it",
                                      field="min_replicas", job=job_id)
        submitted = time.time() if submitted is None else float(submitted)
        job = _ElasticJob(spec, SiaJobState(job_id, spec.application or "", submitted,
                                            spec.restart_delay_s or DEFAULT_RESTART_S),
                          submitted, tuple(t for t in self.cluster.gpu_types if gpu_types is None or t in gpu_types))
        if spec.seed_profile is not None:
            from allocopt.throughput.profiles import read_seed_profile

            for gpu_type, obs in read_seed_profile(spec.seed_profile).items():
                rows = job.seed.setdefault(gpu_type, {})
                for n, k, m, it, comp in zip(obs.num_nodes.tolist(), obs.num_replicas.tolist(),
                                             obs.local_bsz.tolist(), obs.iter_time_s.tolist(),
                                             obs.compute_time_s.tolist()):
                    point = rows.get((n, k, m))
                    if point is None:
                        rows[(n, k, m)] = _Measured(comp, it)
                    else:
                        point.add(comp, it)
                job.stale.add(gpu_type)
        job.grad = self._prior_grad(spec)
        self._jobs[job_id] = job

    def update_job(self, job_id: Hashable, *, num_steps_remaining: int | None = None) -> None:
        """Record a job's remaining steps (reported with its state)."""
        self._job(job_id).steps_remaining = num_steps_remaining

    def sync_progress(self, job_id: Hashable, steps_done: int) -> int:
        """Count the samples of the job's steps up to ``steps_done`` (its checkpoint): the steps since the
        last call ran at its latest lease's batch size (its initial one before any). Returns the samples done."""
        job = self._job(job_id)
        new = max(int(steps_done) - job.steps_at, 0)
        job.samples_done += new * (job.last_batch or job.spec.batch_size)
        job.steps_at = max(job.steps_at, int(steps_done))
        return job.samples_done

    def launch_total_steps(self, job_id: Hashable, batch_size: int) -> int | None:
        """``ALLOCOPT_TOTAL_STEPS`` of a launch at ``batch_size`` of a job with ``total_samples``: its step so far
        plus the steps that reach them (None for a job whose length is its ``total_steps``)."""
        job = self._job(job_id)
        if job.spec.total_samples is None:
            return None
        return job.steps_at + -(-max(job.spec.total_samples - job.samples_done, 0) // int(batch_size))

    def remove_job(self, job_id: Hashable) -> None:
        """Forget a job (finished or failed)."""
        self._jobs.pop(job_id, None)
        for key in [k for k in self._stale_since if k[0] == job_id]:
            del self._stale_since[key]
        self._gpu_ids.pop(job_id, None)
        self.decisions.pop(job_id, None)

    def get_job(self, job_id: Hashable) -> dict[str, Any]:
        """A job's state: ``throughputs`` (latest measured steps/s per GPU type), ``batch`` (its current
        batch settings), ``gpu_ids``, ``restarts``, ``samples_done``, and what it was added with and
        reported: ``spec`` (its :class:`ElasticSpec` as a dict), ``gpu_types``, ``grad`` (``[grad_sqr,
        grad_var]`` or None)."""
        job = self._job(job_id)
        return {"throughputs": dict(job.steps_per_s), "batch": None if job.batch is None else asdict(job.batch),
                "gpu_ids": list(self._gpu_ids.get(job_id, ())), "restarts": job.state.num_restarts,
                "samples_done": job.samples_done, "spec": asdict(job.spec), "gpu_types": list(job.gpu_types),
                "grad": None if job.grad is None else [job.grad.sqr, job.grad.var]}

    def observe_throughput(self, job_id: Hashable, gpu_type: str, steps_per_s: float) -> None:
        """Steps/s without the batch they were measured at carry no step time: kept for reports only."""
        self._job(job_id).steps_per_s[gpu_type] = float(steps_per_s)

    def observe_step_time(self, job_id: Hashable, gpu_type: str, num_nodes: int, replicas: int, local_bsz: int,
                          compute_s: float, iter_s: float) -> None:
        """Add a measured step time (seconds of one micro-batch's compute, and of an iteration
        without accumulation) of a job; its model on the type is refitted on next use."""
        job = self._job(job_id)
        if not (math.isfinite(compute_s) and math.isfinite(iter_s) and 0 < compute_s <= iter_s):
            raise InvalidProblemError(f"job {job_id!r}: step times must be finite, > 0 and compute <= iteration, "
                                      f"got {compute_s}, {iter_s}", field="step_time", job=job_id)
        rows = job.measured.setdefault(gpu_type, {})
        key = (int(num_nodes), int(replicas), int(local_bsz))
        point = rows.get(key)
        if point is None:
            rows[key] = _Measured(compute_s, iter_s)
        else:
            point.add(compute_s, iter_s)
            if point.at_fit is not None and abs(point.iter_s / point.at_fit - 1.0) <= REFIT_CHANGE:
                return  # the model still fits it
        job.stale.add(gpu_type)
        job.models.clear()
        self._stale_since.setdefault((job_id, gpu_type), self._round_index)

    def observe_gradient(self, job_id: Hashable, grad_sqr: float, grad_var: float) -> None:
        """A job's reported gradient statistics (at its initial batch size)."""
        job, grad = self._job(job_id), GradParams(float(grad_sqr), float(grad_var))
        if grad != job.grad:
            job.grad = grad
            job.models.clear()

    def _job(self, job_id: Hashable) -> _ElasticJob:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise InvalidProblemError(f"unknown elastic job {job_id!r}", field="job_id", job=job_id) from None

    # ----- models ------------------------------------------------------------------------
    def _profile(self, application: str | None, gpu_type: str | None = None) -> Any:
        if application is None:
            return None
        if gpu_type is not None:
            return self.profiles.get((application, gpu_type))
        return next((p for (app, _), p in sorted(self.profiles.items()) if app == application), None)

    def _prior_grad(self, spec: ElasticSpec) -> GradParams | None:
        profile = self._profile(spec.application)
        return None if profile is None else profile.grad_params(spec.batch_size)

    def _limits(self, job: _ElasticJob, gpu_type: str) -> tuple[int, int, int, int]:
        """(M0, max batch, min micro-batch, max micro-batch) of the job on the type."""
        spec = job.spec
        profile = self._profile(spec.application, gpu_type) or self._profile(spec.application)
        m0 = spec.batch_size
        m_max = spec.max_batch_size or (max(profile.max_batch_size, m0) if profile is not None else m0)
        lo = spec.min_local_bsz or (min(profile.min_local_bsz, m0) if profile is not None else 1)
        seeds = job.seed.get(gpu_type)
        hi = spec.max_local_bsz or (profile.max_local_bsz if profile is not None
                                    else max(k[2] for k in seeds) if seeds else m_max)
        return m0, max(m_max, m0), lo, max(hi, lo)

    def _fit(self, job: _ElasticJob, gpu_type: str) -> PerfParams | None:
        rows = job.rows(gpu_type)
        if not rows:
            return None
        if self._defer_refits and gpu_type in job.fits:
            return job.fits[gpu_type]
        if gpu_type in job.stale or gpu_type not in job.fits:
            keys = np.array(list(rows), dtype=np.float64)
            vals = np.array([(r.compute_s, r.iter_s) for r in rows.values()])
            initial = job.fits.get(gpu_type)
            if initial is not None:  # a warm start with a time pinned at the floor for want of data that the
                # rows now have (a first multi-GPU or multi-node step time) does not move it: start afresh
                nodes, replicas = keys[:, 0], keys[:, 1]
                one_node, multi_node, beyond_two = (nodes == 1) & (replicas > 1), nodes > 1, replicas > 2
                freed = {2: multi_node.any(), 3: (multi_node.any() and beyond_two.any()), 4: one_node.any(),
                         5: (one_node.any() and beyond_two.any())}
                values = astuple(initial)
                if any(free and values[k] <= 2 * PARAM_FLOOR_S for k, free in freed.items()):
                    initial = None
            job.fits[gpu_type] = fit_perf_params(keys[:, 0], keys[:, 1], keys[:, 2], vals[:, 0], vals[:, 1],
                                                 initial=initial, loss="rmse")
            job.stale.discard(gpu_type)
            self._stale_since.pop((job.state.job_id, gpu_type), None)
            for r in rows.values():
                r.at_fit = r.iter_s
        return job.fits[gpu_type]

    def _prior_fit(self, application: str | None, gpu_type: str) -> PerfParams | None:
        profile = self._profile(application, gpu_type)
        if profile is None:
            return None
        key = (application, gpu_type)
        if key not in self._prior_fits:
            self._prior_fits[key] = profile.fit()
        return self._prior_fits[key]

    def _one_gpu_time(self, job: _ElasticJob, gpu_type: str) -> float | None:
        """Prior seconds of one iteration on one GPU at the job's initial batch (seed or profile), for ratios."""
        rows = {k: r for k, r in job.seed.get(gpu_type, {}).items() if k[1] == 1}
        m = max(1, job.spec.batch_size)
        if rows:
            sizes = np.array(sorted(k[2] for k in rows), dtype=np.float64)
            times = np.array([rows[k].iter_s for k in sorted(rows, key=lambda k: k[2])])
            return float(np.interp(m, sizes, times))
        prior = self._prior_fit(job.spec.application, gpu_type)
        return None if prior is None else float(prior.iter_time(1, 1, m))

    def model(self, job_id: Hashable, gpu_type: str) -> GoodputModel | None:
        """The job's goodput model on ``gpu_type`` (see the module docstring), None where it has none."""
        job = self._job(job_id)
        if gpu_type not in job.models:
            job.models[gpu_type] = self._model(job, gpu_type)
        return job.models[gpu_type]

    def _model(self, job: _ElasticJob, gpu_type: str) -> GoodputModel | None:
        if gpu_type not in job.gpu_types:
            return None
        m0, m_max, lo, hi = self._limits(job, gpu_type)
        grad = job.grad or GradParams(1.0, 0.0)
        own = self._fit(job, gpu_type)
        if own is not None:
            return GoodputModel(own, grad, m0, m_max, hi, min_local_bsz=lo)
        sources = [t for t in job.gpu_types if job.rows(t)]
        if sources:
            source = max(sources, key=lambda t: len(job.rows(t)))
            a, b = self._one_gpu_time(job, source), self._one_gpu_time(job, gpu_type)
            ratio = a / b if a and b else 1.0
            return GoodputModel(self._fit(job, source).scaled(1.0 / ratio), grad, m0, m_max, hi,  # type: ignore[union-attr]
                                min_local_bsz=lo)
        prior = self._prior_fit(job.spec.application, gpu_type)
        if prior is None and job.spec.application is not None:
            other = self._profile(job.spec.application)
            prior = self._prior_fit(job.spec.application, other.gpu_type) if other is not None else None
        return None if prior is None else GoodputModel(prior, grad, m0, m_max, hi, min_local_bsz=lo)

    def predicted_iter_time(self, job_id: Hashable, gpu_type: str, num_nodes: int, replicas: int,
                            local_bsz: int) -> float:
        """Seconds of one iteration (no accumulation) the job's current model predicts."""
        model = self.model(job_id, gpu_type)
        if model is None:
            return math.nan
        return float(model.perf_params.iter_time(num_nodes, replicas, local_bsz))

    def measurements(self, job_id: Hashable) -> dict[str, dict[tuple[int, int, int], tuple[float, float, int]]]:
        """The job's measured step times: per type, (nodes, replicas, micro-batch) -> (compute s, iteration s, count)."""
        return {t: {k: (r.compute_s, r.iter_s, r.count) for k, r in rows.items()}
                for t, rows in self._job(job_id).measured.items()}

    def _lr_scale(self, job: _ElasticJob, batch: int) -> float:
        s = batch / job.spec.batch_size
        scaling = job.spec.lr_scaling
        if scaling == "linear":
            return s
        if scaling == "sqrt":
            return math.sqrt(s)
        if scaling == "none" or job.grad is None:
            return 1.0 if scaling == "none" else s
        g = job.grad
        return float((g.var + g.sqr) / (g.var / s + g.sqr)) if g.var + g.sqr > 0 else 1.0

    def _settings(self, job: _ElasticJob, replicas: int, local: float, accum: float) -> BatchSettings:
        batch = int(replicas * int(local) * (int(accum) + 1))
        return BatchSettings(batch, int(local), int(accum), self._lr_scale(job, batch))

    # ----- rounds ------------------------------------------------------------------------
    def _goodput(self, jobs: Sequence[_ElasticJob], ids: Sequence[Hashable]) -> tuple[np.ndarray, list[list[Any]]]:
        """Goodput matrix (jobs x configurations) with exploration and replica limits applied; the models."""
        configs, types = self.configurations, self.cluster.gpu_types
        models = [[self.model(j, t) for t in types] for j in ids]
        goodput = goodput_matrix(models, configs) if ids else np.zeros((0, len(configs)))
        n = len(jobs)
        gpus = configs.num_gpus[None, :]
        allowed = np.array([[t in job.gpu_types for t in types] for job in jobs], dtype=bool).reshape(n, len(types))
        has_rows = np.array([[bool(job.rows(t)) for t in types] for job in jobs], dtype=bool).reshape(n, len(types))
        no_model = np.array([all(m is None for m in row) for row in models], dtype=bool)
        explore = no_model.copy()
        if self.options.explore_types:
            explore |= (allowed & ~has_rows).any(axis=1)
        unmeasured = allowed & ~has_rows if self.options.explore_types else allowed
        unmeasured = np.where(no_model[:, None], allowed, unmeasured)
        one_gpu = unmeasured[:, configs.gpu_type] & (gpus == 1)
        goodput = np.where(explore[:, None], np.where(one_gpu, np.maximum(goodput, 0) + 1.0, 0.0), goodput)
        lo = np.array([job.spec.min_replicas for job in jobs]).reshape(n, 1)
        hi = np.array([job.spec.max_replicas or 2 ** 31 for job in jobs]).reshape(n, 1)
        if self.options.explore_replicas:  # at most twice the GPUs held so far, at least min_replicas
            cap = np.array([max(2 * job.most_gpus, 1) for job in jobs]).reshape(n, 1)
            hi = np.minimum(hi, np.maximum(cap, lo))
        goodput = np.where((gpus >= lo) & (gpus <= hi) & allowed[:, configs.gpu_type], goodput, 0.0)
        return np.where(np.isfinite(goodput) & (goodput > 0), goodput, 0.0), models

    def next_round(self) -> RoundPlan:
        """Plan the next round: each job's configuration (the policy), GPUs (placement) and batch.

        Leases carry :class:`BatchSettings`; a lease is ``extended`` only where the job keeps its GPUs and
        its batch. :attr:`decisions` holds what each lease's batch came from.
        """
        from allocopt.mechanism.sia_round_plan import commit_plan

        now = time.time()
        ids = list(self._jobs)
        jobs = [self._jobs[j] for j in ids]
        for job in jobs:
            job.state.age_s = max(now - job.submitted, 0.0)
            job.state.restart_delay_s = job.spec.restart_delay_s or job.restart_s or DEFAULT_RESTART_S
        self._refit_within_budget()
        self._defer_refits = True
        try:
            goodput, models = self._goodput(jobs, ids)
        finally:
            self._defer_refits = False
        # a job whose previous configuration is not offered (it profiles another type, or its limits
        # changed) must move: the move is not its choice, so the policy sees no previous configuration
        # and charges no restart penalty (else a job that must move might be left idle)
        rows = np.arange(len(jobs))
        previous = np.array([j.state.previous for j in jobs], dtype=np.int64)
        forced = (previous >= 0) & (goodput[rows, np.maximum(previous, 0)] <= 0) if len(jobs) else \
            np.zeros(0, dtype=bool)
        states = [replace(j.state, previous=-1) if f else j.state for j, f in zip(jobs, forced.tolist())]
        started = time.perf_counter()
        plan = _planner(self.policy)(states, self.cluster, self.configurations, goodput,
                                     self._gpu_ids, round_index=self._round_index, start_s=now,
                                     round_seconds=self.round_seconds, **dict(self.options.policy_options))
        self.solve_seconds.append(time.perf_counter() - started)
        commit_plan([j.state for j in jobs], plan)
        types = self.cluster.gpu_types
        starts = np.concatenate([[0], np.cumsum(self.cluster.capacity)])
        row = {j: i for i, j in enumerate(ids)}
        n = len(plan.leases)
        t_of = np.array([types.index(l.gpu_type) for l in plan.leases], dtype=np.int64)
        replicas_of = np.array([len(l.gpu_ids) for l in plan.leases], dtype=np.int64)
        ids_flat = np.concatenate([np.asarray(l.gpu_ids, dtype=np.int64) for l in plan.leases]) if n else \
            np.zeros(0, dtype=np.int64)
        lease_of = np.repeat(np.arange(n), replicas_of)
        node_of = (ids_flat - starts[t_of[lease_of]]) // self.cluster.gpus_per_node[t_of[lease_of]]
        span = int(node_of.max(initial=0)) + 1  # distinct (lease, node) pairs counted per lease: its nodes
        nodes_of = np.bincount(np.unique(lease_of * span + node_of) // span, minlength=n)
        lease_models = [models[row[l.job_id]][t] for l, t in zip(plan.leases, t_of.tolist())]
        with_model = [k for k, m in enumerate(lease_models) if m is not None]
        _, local, accum = optimize_models([lease_models[k] for k in with_model], nodes_of[with_model],
                                          replicas_of[with_model])
        chosen = dict(zip(with_model, zip(local.tolist(), accum.tolist())))
        leases, self.decisions = [], {}
        for k, lease in enumerate(plan.leases):
            job, model = self._jobs[lease.job_id], lease_models[k]
            replicas, nodes = int(replicas_of[k]), int(nodes_of[k])
            optimal = self._optimal(job, chosen.get(k), replicas, lease.gpu_type)
            batch = optimal
            if lease.extended and job.batch is not None and model is not None:
                keep = float(model.goodput(nodes, replicas, job.batch.local_bsz, job.batch.accum_steps))
                best = float(model.goodput(nodes, replicas, optimal.local_bsz, optimal.accum_steps))
                if best <= (1.0 + self.options.batch_tolerance) * keep:
                    batch = job.batch
            extended = lease.extended and batch == job.batch
            if lease.extended and not extended:  # same GPUs, new batch: a restart
                job.state.num_restarts += 1
                job.state.restore_remaining_s = job.state.restart_delay_s
            job.batch = batch
            job.last_batch = batch.batch_size
            job.most_gpus = max(job.most_gpus, replicas)
            self.decisions[lease.job_id] = ElasticDecision(lease.job_id, lease.gpu_type, nodes, replicas, batch,
                                                           optimal, model)
            leases.append(replace(lease, extended=extended, batch=batch))
        for job_id in plan.stop:
            self._jobs[job_id].batch = None
        self._gpu_ids = {lease.job_id: lease.gpu_ids for lease in leases}
        self._round_index += 1
        log.debug("goodput round %d: %d jobs, %d leases (%d extended), %.3f s in the policy, %d refits pending",
                  self._round_index - 1, len(jobs), len(leases), sum(l.extended for l in leases),
                  self.solve_seconds[-1], len(self._stale_since))
        return replace(plan, leases=tuple(leases))

    def _refit_within_budget(self) -> None:
        """Refit stale models, those without a fit first, then the longest-waiting, until the budget is spent."""
        pending = [(gpu_type in self._jobs[job_id].fits, since, job_id, gpu_type)
                   for (job_id, gpu_type), since in self._stale_since.items() if job_id in self._jobs]
        pending.sort(key=lambda p: (p[0], p[1]))
        deadline = time.perf_counter() + self.options.refit_budget_s
        for has_fit, _, job_id, gpu_type in pending:
            if has_fit and time.perf_counter() >= deadline:
                break
            job = self._jobs[job_id]
            self._fit(job, gpu_type)
            job.models.clear()

    def _optimal(self, job: _ElasticJob, best: tuple[float, float] | None, replicas: int,
                 gpu_type: str) -> BatchSettings:
        """The model's goodput-optimal batch (``best``: its micro-batch and accumulation steps); without a
        model (or where none fits) the initial batch split over the replicas (at least ``min_local_bsz``
        each, accumulating beyond memory)."""
        if best is not None and best[0] > 0:
            return self._settings(job, replicas, best[0], best[1])
        m0, _, lo, hi = self._limits(job, gpu_type)
        per = max(lo, math.ceil(m0 / replicas))
        accum = max(math.ceil(per / hi) - 1, 0)
        return self._settings(job, replicas, math.ceil(per / (accum + 1)), accum)

    def record_round(self, results: Sequence[JobRoundResult]) -> None:
        """Learn from a round's results: step times (refitting the models), gradient statistics, restart costs."""
        from allocopt.mechanism.sia_round_plan import advance

        live = [j for j in self._jobs.values()]
        advance([j.state for j in live], self.round_seconds)
        for r in results:
            decision, job = self.decisions.get(r.job_id), self._jobs.get(r.job_id)
            if decision is None or job is None:
                continue
            grad = (r.metrics or {}).get("grad_sqr"), (r.metrics or {}).get("grad_var")
            if all(v is not None and math.isfinite(v) and v >= 0 for v in grad) and (grad[0] or grad[1]):
                self.observe_gradient(r.job_id, *grad)  # type: ignore[arg-type]
            sps = r.measured_steps_per_s
            if sps is not None and sps > 0:
                b = decision.batch
                iteration = 1.0 / sps
                sync = float((r.metrics or {}).get("sync_time", 0.0) or 0.0)
                sync = min(max(sync, 0.0), 0.9 * iteration)
                compute = (iteration - sync) / (b.accum_steps + 1)
                self.observe_step_time(r.job_id, decision.gpu_type, decision.num_nodes, decision.replicas,
                                       b.local_bsz, compute, compute + sync)
                job.steps_per_s[decision.gpu_type] = float(sps)
                if r.restarted and r.run_seconds > 0:
                    lost = max(r.run_seconds - r.steps / sps, 0.05)
                    job.restart_s = lost if job.restart_s is None else 0.5 * (job.restart_s + lost)
            if r.steps > 0:
                job.state.restore_remaining_s = 0.0
            if r.outcome is not RoundOutcome.PREEMPTED:
                self._gpu_ids.pop(r.job_id, None)  # its processes ended: nothing held into the next round
                job.batch = None

    # ----- persistence ------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The engine's state: cluster, policy, options, and per job its spec, measurements, gradient
        statistics, restarts and submission time (GPUs held are not kept: a restored engine holds none)."""
        opts = self.options
        return {"format": "allocopt-goodput-engine", "format_version": 1, "policy": self.policy,
                "round_seconds": self.round_seconds, "round_index": self._round_index,
                "cluster": {"gpus": dict(zip(self.cluster.gpu_types, self.cluster.capacity.tolist())),
                            "gpus_per_node": dict(zip(self.cluster.gpu_types, self.cluster.gpus_per_node.tolist()))},
                "options": {"policy_options": dict(opts.policy_options), "explore_types": opts.explore_types,
                            "explore_replicas": opts.explore_replicas, "batch_tolerance": opts.batch_tolerance,
                            "max_nodes": opts.max_nodes, "refit_budget_s": opts.refit_budget_s},
                "jobs": [{"id": job_id, "spec": asdict(j.spec), "submitted": j.submitted, "gpu_types": list(j.gpu_types),
                          "measured": [[t, list(k), r.compute_s, r.iter_s, r.count]
                                       for t, rows in j.measured.items() for k, r in rows.items()],
                          "grad": None if j.grad is None else [j.grad.sqr, j.grad.var], "most_gpus": j.most_gpus,
                          "restarts": j.state.num_restarts, "started": j.state.started, "restart_s": j.restart_s,
                          "steps_per_s": j.steps_per_s, "samples_done": j.samples_done, "steps_at": j.steps_at,
                          "last_batch": j.last_batch} for job_id, j in self._jobs.items()]}

    @classmethod
    def from_json(cls, document: Mapping[str, Any], profiles: Mapping[tuple[str, str], Any] | None = None
                  ) -> GoodputEngine:
        """An engine in the state :meth:`to_json` wrote (holding no GPUs).

        Raises
        ------
        InvalidProblemError
            For a document of another format, or with malformed content.
        """
        if document.get("format") != "allocopt-goodput-engine" or document.get("format_version") != 1:
            raise InvalidProblemError("not a goodput engine state (format allocopt-goodput-engine, version 1)",
                                      field="format")
        try:
            o = document["options"]
            engine = cls(Cluster.from_dict(document["cluster"]), document["policy"],
                         round_seconds=float(document["round_seconds"]), profiles=profiles,
                         options=GoodputOptions(dict(o["policy_options"]), bool(o["explore_types"]),
                                                bool(o["explore_replicas"]), float(o["batch_tolerance"]),
                                                o["max_nodes"], float(o["refit_budget_s"])))
            engine._round_index = int(document["round_index"])
            for doc in document["jobs"]:
                job_id = doc["id"]
                engine.add_job(job_id, ElasticSpec(**doc["spec"]), gpu_types=doc["gpu_types"],
                               submitted=float(doc["submitted"]))
                job = engine._jobs[job_id]
                for t, key, compute, iteration, count in doc["measured"]:
                    job.measured.setdefault(t, {})[tuple(key)] = _Measured(float(compute), float(iteration),
                                                                           int(count))
                    job.stale.add(t)
                if doc["grad"] is not None:
                    job.grad = GradParams(*doc["grad"])
                job.most_gpus, job.restart_s = int(doc["most_gpus"]), doc["restart_s"]
                job.state.num_restarts, job.state.started = int(doc["restarts"]), bool(doc["started"])
                job.steps_per_s = {str(t): float(v) for t, v in doc["steps_per_s"].items()}
                job.samples_done, job.steps_at = int(doc["samples_done"]), int(doc["steps_at"])
                job.last_batch = None if doc["last_batch"] is None else int(doc["last_batch"])
        except (KeyError, TypeError, ValueError) as err:
            raise InvalidProblemError(f"malformed goodput engine state ({type(err).__name__}: {err})",
                                      field="jobs") from None
        return engine


def load_job_profiles(profile_dir: str | Path | None, applications: Sequence[str]) -> dict[tuple[str, str], Any]:
    """The profiles of ``applications`` under ``profile_dir`` (default: Sia's shipped profiles), every GPU type.

    Raises
    ------
    ProfileFormatError
        When the directory holds no profiles or a file is malformed.
    """
    from allocopt.throughput.profiles import discover, load_application, shipped_profiles_dir

    root = Path(profile_dir) if profile_dir is not None else shipped_profiles_dir()
    wanted = set(applications)
    if not wanted:
        return {}
    return {(app, t): load_application(root, app, t) for app, t in discover(root) if app in wanted}


__all__ = ["DEFAULT_RESTART_S", "ELASTIC_KEYS", "LR_SCALINGS", "ElasticDecision", "ElasticSpec", "GoodputEngine",
           "GoodputOptions", "goodput_policies", "is_goodput_policy", "load_job_profiles", "model_from_json",
           "parse_elastic", "register_goodput_policy"]
