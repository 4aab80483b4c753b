"""Admission control for the simulator: which arrived jobs join the scheduled jobs.

By default every job joins the active jobs when it arrives. An admission policy
keeps arrived jobs in a FIFO wait queue instead and, at the start of every
round, says which of them are admitted; a job's completion time still counts
from its arrival, so time in the wait queue is part of its JCT. Built-in
policies (:data:`ADMISSION_POLICIES`, by name in :func:`allocopt.simulate`):

``accept_all``
    Every arrived job is admitted at once (the default).
``load_based``
    Blox's ``loadBasedAccept`` (msr-fiddle/blox, ``admission_control/``):
    queued jobs are admitted in arrival order while the GPUs the admitted
    (active) jobs ask for, plus those already admitted this round, stay at most
    ``threshold`` times the cluster's GPUs; the job that crosses the limit is
    still admitted, as Blox's loop tests the limit before adding each job.

A policy is an object with a ``name`` and an ``admit(waiting, state, now_s)``
method returning a boolean mask over ``waiting`` (job rows in arrival order).
The executors' drivers (``allocopt run``, ``allocopt slurm``) call the same
policies through :func:`admit_jobs`, with an :class:`AdmissionState` of their
jobs in place of the simulation state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from allocopt.cluster import Cluster
from allocopt.errors import InvalidOptionError
from allocopt.mechanism.state import SimulationState


@runtime_checkable
class AdmissionPolicy(Protocol):
    """Decides which queued jobs are admitted at a round's start.

    ``admit(waiting, state, now_s)`` gets the rows of the queued jobs (arrival
    order) and the simulation state (``state.active`` marks the admitted jobs
    not finished) and returns a boolean mask over ``waiting``.
    """

    name: str

    def admit(self, waiting: np.ndarray, state: SimulationState, now_s: float) -> np.ndarray: ...


class AcceptAll:
    """Admit every arrived job."""

    name = "accept_all"

    def admit(self, waiting: np.ndarray, state: SimulationState, now_s: float) -> np.ndarray:
        return np.ones(waiting.size, dtype=bool)


class LoadBased:
    """Blox's load-based admission.

    Parameters
    ----------
    threshold : float, default 1.2
        Largest GPU demand of the admitted jobs, as a multiple of the cluster's GPUs
        (Blox's experiments use 1.0, 1.2 and 1.4).
    """

    name = "load_based"

    def __init__(self, threshold: float = 1.2):
        if not (isinstance(threshold, (int, float)) and threshold > 0 and np.isfinite(threshold)):
            raise InvalidOptionError(f"load_based: threshold must be a positive number, got {threshold!r}")
        self.threshold = float(threshold)

    def admit(self, waiting: np.ndarray, state: SimulationState, now_s: float) -> np.ndarray:
        demand = state.workload.scale_factors
        limit = self.threshold * float(state.cluster.capacity.sum())
        current = float(demand[state.active].sum())
        before = current + np.concatenate([[0], np.cumsum(demand[waiting])[:-1]])  # demand before each is added
        return before <= limit


#: Admission policies by name: each a factory taking its options as keywords.
ADMISSION_POLICIES: dict[str, Any] = {"accept_all": AcceptAll, "load_based": LoadBased}


def admission_policy(admission: Any, options: Mapping[str, Any] | None = None) -> AdmissionPolicy:
    """The admission policy ``admission`` names (or is), with ``options``."""
    if isinstance(admission, str):
        factory = ADMISSION_POLICIES.get(admission)
        if factory is None:
            raise InvalidOptionError(f"unknown admission policy {admission!r}; known: "
                                     f"{', '.join(sorted(ADMISSION_POLICIES))}")
        try:
            return factory(**dict(options or {}))
        except TypeError as err:
            raise InvalidOptionError(f"admission policy {admission!r}: {err}") from None
    if isinstance(admission, AdmissionPolicy):
        if options:
            raise InvalidOptionError("admission_options given with an admission policy object: set them on it")
        return admission
    raise InvalidOptionError(f"admission must be a name ({', '.join(sorted(ADMISSION_POLICIES))}) or an object "
                             f"with a name and an admit(waiting, state, now_s) method, got {admission!r}")


class AdmissionQueue:
    """The simulator's wait queue in front of an admission policy.

    Attributes
    ----------
    waiting : ndarray of int
        Rows of the arrived jobs not admitted yet, in arrival order.
    admitted_s : ndarray of shape (n_jobs,)
        When each job was admitted (NaN: not yet).
    """

    def __init__(self, policy: AdmissionPolicy, num_jobs: int):
        self.policy = policy
        self.waiting = np.zeros(0, dtype=np.int64)
        self.admitted_s = np.full(num_jobs, np.nan)

    def admit(self, state: SimulationState, next_job: int, now_s: float) -> int:
        """Queue the jobs arrived by ``now_s`` and activate those the policy admits; the index of the
        next job to arrive."""
        arrival = state.workload.arrival_s
        end = max(int(np.searchsorted(arrival, now_s, side="right")), next_job)
        if end > next_job:
            self.waiting = np.concatenate([self.waiting, np.arange(next_job, end, dtype=np.int64)])
        if self.waiting.size:
            mask = np.asarray(self.policy.admit(self.waiting.copy(), state, now_s), dtype=bool)
            if mask.shape != self.waiting.shape:
                raise InvalidOptionError(f"admission policy {self.policy.name!r}: admit returned shape {mask.shape}, "
                                         f"expected {self.waiting.shape}")
            if mask.any():
                rows = self.waiting[mask]
                state.active[rows] = True
                state.changed = True
                self.admitted_s[rows] = now_s
                self.waiting = self.waiting[~mask]
        return end


@dataclass(frozen=True)
class AdmissionJobs:
    """The jobs' columns an admission policy reads: GPUs each asks for, submission times (s)."""

    scale_factors: np.ndarray
    arrival_s: np.ndarray


@dataclass(frozen=True)
class AdmissionState:
    """What an admission policy sees of an executor's jobs (the fields of
    :class:`~allocopt.mechanism.state.SimulationState` the built-in policies read)."""

    workload: AdmissionJobs
    cluster: Cluster
    active: np.ndarray


def admit_jobs(policy: AdmissionPolicy, cluster: Cluster, scale_factors: np.ndarray, arrival_s: np.ndarray,
               active: np.ndarray, waiting: np.ndarray, now_s: float) -> np.ndarray:
    """Which of the ``waiting`` rows (submission order) ``policy`` admits, as a boolean mask.

    ``scale_factors`` and ``arrival_s`` are per job (every row); ``active`` marks the
    admitted jobs not finished.

    Raises
    ------
    InvalidOptionError
        When the policy returns a mask of another shape.
    """
    state = AdmissionState(AdmissionJobs(np.asarray(scale_factors, dtype=np.int64),
                                         np.asarray(arrival_s, dtype=float)), cluster, np.asarray(active, dtype=bool))
    waiting = np.asarray(waiting, dtype=np.int64)
    mask = np.asarray(policy.admit(waiting.copy(), state, now_s), dtype=bool)  # type: ignore[arg-type]
    if mask.shape != waiting.shape:
        raise InvalidOptionError(f"admission policy {policy.name!r}: admit returned shape {mask.shape}, "
                                 f"expected {waiting.shape}")
    return mask


__all__ = ["ADMISSION_POLICIES", "AcceptAll", "AdmissionJobs", "AdmissionPolicy", "AdmissionQueue", "AdmissionState",
           "LoadBased", "admission_policy", "admit_jobs"]
