"""Pydantic models of the service's request and response bodies.

The four documents of :mod:`allocopt.schemas` have a model each (:class:`Problem`,
:class:`Allocation`, :class:`EngineState`, :class:`RoundPlan`) with the same
fields, required fields, types and bounds as the JSON Schema (checked by
``tests/test_server.py``); the OpenAPI document (``GET /openapi.json``) is built
from these models. Validation is strict: no string is read as a number, no
float as an integer, no boolean as either. Job ids are strings or integers.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, Strict, StrictBool, WithJsonSchema

from allocopt.backends import BACKENDS
from allocopt.mechanism.placement_policies import PLACEMENT_POLICIES


def _job_id(value: Any) -> str | int:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError("a job id must be a string or an integer")
    return value


def _entity(value: Any) -> str | int | None:
    return None if value is None else _job_id(value)


def _gpus_per_node(value: Any) -> int | dict[str, int]:
    def count(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 1

    if count(value) or (isinstance(value, dict) and all(isinstance(k, str) and count(v) for k, v in value.items())):
        return value
    raise ValueError("gpus_per_node must be an integer >= 1 or an object of GPU type to an integer >= 1")


JobId = Annotated[Any, PlainValidator(_job_id), WithJsonSchema({"type": ["string", "integer"]})]
Entity = Annotated[Any, PlainValidator(_entity), WithJsonSchema({"type": ["string", "integer", "null"]})]
GpusPerNode = Annotated[Any, PlainValidator(_gpus_per_node), WithJsonSchema(
    {"oneOf": [{"type": "integer", "minimum": 1},
               {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1}}]})]
Str = Annotated[str, Strict()]
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
NonNegative = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
Positive = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
Count = Annotated[int, Strict(), Field(ge=0)]
PositiveInt = Annotated[int, Strict(), Field(ge=1)]
Backend = Literal[(*BACKENDS, "auto")]  # type: ignore[valid-type]
PerType = dict[str, NonNegative]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ----- the problem document (schema "problem") ------------------------------------------------------------------
class Cluster(_Model):
    """GPUs of each type (the key order is the GPU-type order) and GPUs per server (default 8)."""

    gpus: dict[str, Count] = Field(min_length=1)
    gpus_per_node: GpusPerNode = None


class Job(_Model):
    """A job: steps/s of the whole job on ``scale_factor`` GPUs of each type (0: cannot run there); times in s."""

    id: JobId
    throughputs: PerType
    scale_factor: PositiveInt = None
    priority_weight: Positive = None
    num_steps_remaining: NonNegative = None
    time_since_start_s: NonNegative = None
    slo_s: Positive = None
    time_isolated_s: NonNegative = None
    entity: Entity = None


class Pair(_Model):
    """Space sharing: steps/s of each member of a pair of jobs sharing the same GPUs, per GPU type."""

    jobs: list[JobId] = Field(min_length=2, max_length=2)
    throughputs: dict[str, Annotated[list[NonNegative], Field(min_length=2, max_length=2)]]


class Problem(_Model):
    """The input of ``allocopt solve`` and ``POST /solve`` (other top-level keys are allowed, as in the schema)."""

    model_config = ConfigDict(extra="allow")

    cluster: Cluster
    jobs: list[Job]
    costs: dict[str, Positive] = None
    entity_weights: dict[str, Positive] = None
    pairs: list[Pair] = None


class SolveRequest(Problem):
    """``POST /solve``: a problem document, the policy, the backend and options of :func:`allocopt.solve`."""

    model_config = ConfigDict(extra="forbid")

    policy: Str = "max_min_fairness"
    backend: Backend = "highs"
    options: dict[str, Any] = Field(default_factory=dict, description=(
        "Policy options and the solve keywords time_limit_s, mip_gap, threads, best_effort, partitions, "
        "technique."))


# ----- the allocation document (schema "allocation") ------------------------------------------------------------
class AllocationRow(_Model):
    id: JobId
    fractions: dict[str, Number]
    effective_throughput: Number


class PairFractions(_Model):
    jobs: list[JobId] = Field(min_length=2, max_length=2)
    fractions: dict[str, Number]


class Timings(_Model):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())  # model_build_s is allocopt's name

    model_build_s: NonNegative
    solver_build_s: NonNegative
    solve_s: NonNegative
    total_s: NonNegative
    num_solves: Count


class Allocation(_Model):
    """The output of ``allocopt solve`` and ``POST /solve``: each job's time fraction on each GPU type."""

    policy: Str
    backend: Str | None
    status: Literal["optimal", "infeasible", "unbounded", "infeasible_or_unbounded", "time_limit", "error",
                    "approximate"]
    message: Str
    objective: Number | None
    gpu_types: list[Str]
    allocation: list[AllocationRow]
    pairs: list[PairFractions] = None
    timings: Timings


# ----- the round plan (schema "round_plan") ---------------------------------------------------------------------
class BatchSettings(_Model):
    """An elastic job's batch under one allocation."""

    batch_size: PositiveInt
    local_bsz: PositiveInt
    accum_steps: Count
    lr_scale: Positive


class Lease(_Model):
    job_id: JobId
    gpu_type: Str
    gpu_ids: list[Count] = Field(min_length=1)
    max_seconds: Positive
    max_steps: Count | None = None
    extended: StrictBool = False
    co_located_with: Entity = None
    batch: BatchSettings | None = None


class RoundPlan(_Model):
    """One round of the mechanism: the leases, and the jobs to stop."""

    round_index: Count
    start_s: NonNegative
    round_seconds: Positive
    leases: list[Lease]
    stop: list[JobId]


# ----- the engine state (schema "engine_state") -----------------------------------------------------------------
class RoundJobState(_Model):
    allocation: PerType
    received_s: PerType
    deficit_s: dict[str, Number]
    gpu_type: Str | None
    gpu_slots: list[Count]


class Rounds(_Model):
    round_index: Count = None
    clock_s: NonNegative = None
    last_reset_s: Number | None = None
    installed_version: Annotated[int, Strict()] | None = None
    pending: list[tuple[JobId, Str]] = None
    pending_seconds: NonNegative = None
    jobs: list[tuple[JobId, RoundJobState]] = None


class EngineState(_Model):
    """The engine's state document (``GET /engine``, ``allocopt serve --state``, :meth:`allocopt.Engine.save`)."""

    format: Literal["allocopt-engine"]
    format_version: Literal[1]
    version: Count
    policy: Str
    backend: Backend
    policy_options: dict[str, Any] = None
    solve_options: dict[str, Any] = None
    throughput_smoothing: Annotated[float, Strict(), Field(gt=0, le=1)] = None
    cluster: Cluster
    jobs: list[Job]
    measured: list[tuple[JobId, Str]] = None
    round_seconds: Positive = None
    recompute_min_seconds: NonNegative = None
    rounds: Rounds = None
    placement: Literal[tuple(PLACEMENT_POLICIES)] = None  # type: ignore[valid-type]


# ----- other requests -----------------------------------------------------------------------------------------------
class EngineConfig(_Model):
    """``POST /engine``: a new engine (or an :class:`EngineState` to restore)."""

    cluster: Cluster
    policy: Str = "max_min_fairness"
    backend: Backend = "highs"
    policy_options: dict[str, Any] = Field(default_factory=dict)
    solve_options: dict[str, Any] = Field(default_factory=dict)
    throughput_smoothing: Annotated[float, Strict(), Field(gt=0, le=1)] = 1.0


class JobPatch(_Model):
    """``PATCH /engine/jobs/{id}``: fields to change; ``throughputs`` updates the types it names; null resets."""

    throughputs: PerType = None
    scale_factor: PositiveInt | None = None
    priority_weight: Positive | None = None
    num_steps_remaining: NonNegative | None = None
    time_since_start_s: NonNegative | None = None
    slo_s: Positive | None = None
    time_isolated_s: NonNegative | None = None
    entity: Entity = None


class Observation(_Model):
    """``POST /engine/jobs/{id}/throughput``: a measured throughput."""

    gpu_type: Str
    steps_per_s: NonNegative


class Capacity(_Model):
    """``PUT /engine/capacity/{gpu_type}``: GPUs of the type now."""

    count: Count
    gpus_per_node: PositiveInt | None = None


class NextRound(_Model):
    """``POST /engine/rounds/next``; an empty body is ``{}``."""

    round_seconds: Positive | None = None


class RoundResult(_Model):
    """What one job did in a round (:class:`allocopt.runtime.executor.JobRoundResult`)."""

    job_id: JobId
    outcome: Literal["completed", "preempted", "failed"]
    steps: Count
    run_seconds: NonNegative
    measured_steps_per_s: NonNegative | None = None
    restarted: StrictBool = False
    message: Str = ""


# ----- other responses ----------------------------------------------------------------------------------------------
class Health(_Model):
    status: Literal["ok"]
    allocopt_version: Str
    engine: StrictBool
    engine_version: Count | None
    num_jobs: Count | None


class JobList(_Model):
    jobs: list[Job]
    engine_version: Count


class EngineAllocation(_Model):
    engine_version: Count
    waiting_jobs: list[JobId]
    allocation: Allocation


class Removed(_Model):
    removed: JobId
    engine_version: Count


class Observed(_Model):
    steps_per_s: NonNegative
    engine_version: Count


class ClusterChanged(_Model):
    cluster: Cluster
    engine_version: Count


class RoundRecorded(_Model):
    round_index: Count
    recorded: Count
    engine_version: Count


class Error(_Model):
    """Every error: the message, the error class, and the request field it is about (null for none)."""

    error: Str
    type: Str
    field: Str | None


# ----- elastic jobs under a goodput policy (``/elastic``; schema "goodput_engine_state") ------------------------------
Limit = Annotated[int, Strict(), Field(ge=1, le=2 ** 31)]


class ElasticSpec(_Model):
    """An elastic job's batch and replica limits (:class:`allocopt.runtime.elastic.ElasticSpec`, the job file's keys)."""

    batch_size: Limit
    application: Str | None = None
    max_batch_size: Limit | None = None
    min_local_bsz: Limit | None = None
    max_local_bsz: Limit | None = None
    min_replicas: Limit = 1
    max_replicas: Limit | None = None
    seed_profile: Str | None = None
    restart_delay_s: Positive | None = None
    lr_scaling: Literal["adascale", "linear", "sqrt", "none"] = "adascale"
    total_samples: Annotated[int, Strict(), Field(ge=1, le=2 ** 53)] | None = None


class ElasticJob(ElasticSpec):
    """``POST /elastic/jobs``: an elastic job, its id and the GPU types it may use (default all);
    ``seed_profile`` (a file) cannot be given over HTTP: report its step times instead."""

    id: JobId
    gpu_types: Annotated[list[Str], Field(min_length=1)] | None = None


class StepTime(_Model):
    """``POST /elastic/jobs/{id}/step_time``: a measured step time at (nodes, replicas, micro-batch) of a GPU type:
    ``compute_s`` of one micro-batch's forward and backward pass, ``iter_s`` of an iteration without
    gradient accumulation (compute plus gradient synchronization; at least ``compute_s``)."""

    gpu_type: Str
    num_nodes: PositiveInt = 1
    replicas: PositiveInt = 1
    local_bsz: PositiveInt
    compute_s: Positive
    iter_s: Positive


class StepTimeMean(_Model):
    """The mean of the step times measured at one point (the answer to a step time report)."""

    gpu_type: Str
    num_nodes: PositiveInt
    replicas: PositiveInt
    local_bsz: PositiveInt
    compute_s: Positive
    iter_s: Positive
    count: PositiveInt


class LearnedStepTime(StepTimeMean):
    """A measured point and the iteration time the job's fitted model predicts there (null in job lists)."""

    predicted_iter_s: Positive | None


class Gradient(_Model):
    """``POST /elastic/jobs/{id}/gradient``: gradient statistics at the job's initial batch size, as AdaptDL
    measures them (noise scale ``batch_size * grad_var / grad_sqr``); not both 0."""

    grad_sqr: NonNegative
    grad_var: NonNegative


class ElasticJobState(ElasticJob):
    """An elastic job as added, and what the engine holds for it."""

    gpu_types: list[Str]
    throughputs: PerType
    batch: BatchSettings | None
    gpu_ids: list[Count]
    restarts: Count
    samples_done: Count
    gradient: Gradient | None
    step_times: list[LearnedStepTime]


class ElasticJobList(_Model):
    jobs: list[ElasticJobState]
    round_index: Count


class ElasticRemoved(_Model):
    removed: JobId
    round_index: Count


class ElasticConfig(_Model):
    """``POST /elastic``: a goodput engine (or a :class:`GoodputEngineState` to restore); the options are
    :class:`allocopt.runtime.elastic.GoodputOptions`'."""

    cluster: Cluster
    policy: Str = "sia"
    round_seconds: Positive = 60.0
    policy_options: dict[str, Any] = Field(default_factory=dict, description=(
        "Options of the policy (sia: p, lambda_n, lambda_a...), the planner's backend and packed_placement, and the "
        "solve keywords time_limit_s, mip_gap, threads."))
    explore_types: StrictBool = True
    explore_replicas: StrictBool = True
    batch_tolerance: NonNegative = 0.05
    max_nodes: PositiveInt | None = None
    refit_budget_s: NonNegative = 0.25


class ElasticNextRound(_Model):
    """``POST /elastic/rounds/next``: no fields (an empty body is ``{}``); the round is the engine's ``round_seconds``."""


class ElasticMetrics(_Model):
    """What an elastic job last reported (:func:`allocopt.runtime.client.report`)."""

    grad_sqr: NonNegative | None = None
    grad_var: NonNegative | None = None
    sync_time: NonNegative | None = None


class ElasticRoundResult(RoundResult):
    """What one elastic job did in a round: its steady-state ``measured_steps_per_s`` at the lease's batch
    becomes a step time, its ``metrics`` gradient statistics and synchronization time."""

    metrics: ElasticMetrics = None


class ElasticRoundRecorded(_Model):
    round_index: Count
    recorded: Count


class GoodputOptionsState(_Model):
    policy_options: dict[str, Any]
    explore_types: StrictBool
    explore_replicas: StrictBool
    batch_tolerance: NonNegative
    max_nodes: PositiveInt | None
    refit_budget_s: NonNegative


Point = Annotated[list[PositiveInt], Field(min_length=3, max_length=3)]


class GoodputJobState(_Model):
    id: JobId
    spec: ElasticSpec
    submitted: NonNegative
    gpu_types: list[Str]
    measured: list[tuple[Str, Point, Positive, Positive, PositiveInt]]
    grad: Annotated[list[NonNegative], Field(min_length=2, max_length=2)] | None
    most_gpus: Count
    restarts: Count
    started: StrictBool
    restart_s: NonNegative | None
    steps_per_s: PerType
    samples_done: Count
    steps_at: Count
    last_batch: PositiveInt | None


class GoodputEngineState(_Model):
    """A goodput engine's state document (``GET /elastic``, :meth:`allocopt.runtime.elastic.GoodputEngine.to_json`)."""

    format: Literal["allocopt-goodput-engine"]
    format_version: Literal[1]
    policy: Str
    round_seconds: Positive
    round_index: Count
    cluster: Cluster
    options: GoodputOptionsState
    jobs: list[GoodputJobState]
