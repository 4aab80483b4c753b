"""The executor interface: what runs a round's leases, in simulated or wall-clock time.

The mechanism (:mod:`allocopt.mechanism`) decides each round which job runs on
which GPUs and hands a :class:`RoundPlan` to an :class:`Executor`; the
executor runs it and reports a :class:`JobRoundResult` per lease. The
simulator, the local-process executor and the Ray executor implement the same
interface, so the whole loop (solve, mechanism, placement, run, measure,
re-estimate) is one code path.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from collections.abc import Mapping
from dataclasses import dataclass, field


class RoundOutcome(str, enum.Enum):
    """How a job's round ended."""

    COMPLETED = "completed"  # the job ran all its steps
    PREEMPTED = "preempted"  # the lease ended (or the job was stopped) before the job finished
    FAILED = "failed"  # the job exited with an error or could not start

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class BatchSettings:
    """The batch an elastic job runs with under one allocation (see :mod:`allocopt.runtime.elastic`).

    Attributes
    ----------
    batch_size : int
        Global batch size, samples per step over all ranks: ``replicas * local_bsz * (accum_steps + 1)``.
    local_bsz : int
        Micro-batch of one rank, samples.
    accum_steps : int
        Gradient-accumulation steps per step (0: one micro-batch per step).
    lr_scale : float
        Learning-rate multiplier that goes with ``batch_size`` (1 at the job's initial batch size).
    """

    batch_size: int
    local_bsz: int
    accum_steps: int
    lr_scale: float


@dataclass(frozen=True)
class Lease:
    """One job's right to run this round.

    Attributes
    ----------
    job_id : hashable
    gpu_type : str
    gpu_ids : tuple of int
        Cluster-wide GPU ids (see :class:`allocopt.mechanism.placement.GpuLayout`), ``scale_factor`` of them.
    max_seconds : float
        Length of the lease (the round), in seconds.
    max_steps : int or None
        Steps the job may run this round (None: as many as fit in ``max_seconds``).
    extended : bool
        The job keeps the GPUs it held last round: no restart.
    co_located_with : hashable or None
        Under space sharing, the job sharing these GPUs.
    batch : BatchSettings or None
        An elastic job's batch for this allocation (None: a rigid job); a running job whose batch
        changes is restarted, even on the same GPUs.
    """

    job_id: Hashable
    gpu_type: str
    gpu_ids: tuple[int, ...]
    max_seconds: float
    max_steps: int | None = None
    extended: bool = False
    co_located_with: Hashable | None = None
    batch: BatchSettings | None = None


@dataclass(frozen=True)
class RoundPlan:
    """What runs in one round: the leases, and the jobs to stop (those that held GPUs last round
    and hold none now)."""

    round_index: int
    start_s: float
    round_seconds: float
    leases: tuple[Lease, ...]
    stop: tuple[Hashable, ...] = ()


@dataclass(frozen=True)
class JobRoundResult:
    """What a job did in its lease.

    Attributes
    ----------
    job_id : hashable
    outcome : RoundOutcome
    steps : int
        Training steps completed this round.
    run_seconds : float
        Seconds the job held its GPUs this round (until it completed, was stopped or failed).
    measured_steps_per_s : float or None
        Throughput measured while running (steady state, excluding start-up), if any.
    restarted : bool
        The job was (re)started this round rather than continuing an extended lease.
    message : str
        Why a job failed, or other detail.
    metrics : mapping of str to float
        The latest values the job reported with :func:`allocopt.runtime.client.report` (e.g. the
        gradient statistics ``grad_sqr``, ``grad_var`` and ``sync_time`` of elastic jobs).
    """

    job_id: Hashable
    outcome: RoundOutcome
    steps: int
    run_seconds: float
    measured_steps_per_s: float | None = None
    restarted: bool = False
    message: str = ""
    metrics: Mapping[str, float] = field(default_factory=dict)


class Executor(ABC):
    """Runs round plans; implementations: simulated time, local processes, Ray."""

    @abstractmethod
    def run_round(self, plan: RoundPlan) -> Sequence[JobRoundResult]:
        """Run every lease of ``plan`` until the round ends; one result per lease."""

    @abstractmethod
    def now(self) -> float:
        """Current time in seconds (simulated, or wall clock since the executor started)."""

    def close(self) -> None:
        """Stop everything still running and release resources."""
