"""A Sia-style scheduling policy: goodput-configuration rounds for a Sia-like scheduler loop.

Sia's scheduler (siasosp23/artifacts, ``sia.py``) is called every round with its
jobs' goodput estimates and the previous round's allocations and answers each
job's configuration -- a GPU type, a number of nodes and of GPUs -- and the
GPUs it gets. :meth:`SiaPolicy.optimize` does that with
:func:`allocopt.mechanism.sia_rounds.plan_round` (the ``sia`` MILP with
restart factors and pinning, then Sia's placement); the policy keeps each
job's age, restarts and checkpoint-restore state between rounds.

Accepted shapes
---------------
``jobs``: ``{job_id: job}``, ``job`` a mapping with exactly one of
    ``"goodput"``: the job's goodput (samples/s) per configuration, a mapping
    ``{(gpu_type, num_nodes, num_gpus): goodput}`` (configurations left out: 0)
    or a sequence in :attr:`SiaPolicy.configurations` order;
    ``"models"``: ``{gpu_type: GoodputModel}`` (types left out: cannot run),
    evaluated with :func:`allocopt.throughput.goodput.goodput_matrix`;
    and optionally ``"application"`` (its checkpoint-restore delay,
    :func:`~allocopt.mechanism.sia_rounds.restart_delay_s`), ``"restart_delay_s"``
    (seconds, overrides it) and ``"rigid_gpus"`` (a rigid job's GPU count).
``prev_allocations``: ``{job_id: [gpu_id, ...]}``, the GPU ids each job held last
    round (absent or empty: none). GPU ids are cluster-wide, numbered type by
    type in cluster order, node by node (:class:`~allocopt.mechanism.placement.GpuLayout`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from allocopt.cluster import Cluster
from allocopt.configurations import Configurations, sia_configurations
from allocopt.errors import InvalidProblemError
from allocopt.mechanism.sia_rounds import SiaJobState, SiaRoundPlan, advance, commit_plan, plan_round, restart_delay_s
from allocopt.throughput.goodput import goodput_matrix


class SiaAssignment(NamedTuple):
    """One job's answer for a round: its configuration and GPU ids.

    ``extended`` is True when the job keeps last round's GPUs; otherwise it
    (re)starts and first spends ``restore_delay_s`` seconds in checkpoint-restore.
    """

    gpu_type: str
    num_nodes: int
    num_gpus: int
    gpu_ids: tuple[int, ...]
    extended: bool
    restore_delay_s: float


class SiaPolicy:
    """Sia-style scheduling policy: ``optimize(jobs, prev_allocations) -> {job_id: SiaAssignment}``.

    Parameters
    ----------
    cluster : Cluster or mapping of str to int
        GPUs of each type (with ``gpus_per_node`` when a mapping).
    gpus_per_node : int or mapping of str to int, default 8
        Used only when ``cluster`` is a mapping.
    configurations : Configurations, optional
        The configurations jobs may get (default: :func:`allocopt.sia_configurations` of the cluster).
    round_seconds : float, default 60
        Length of a round (Sia's scheduling interval), in seconds: jobs age by it each call.
    p, lambda_n, lambda_a : float
        Options of the ``sia`` policy.
    backend : str, default "highs"
    **solve_options
        Passed to :func:`allocopt.solve` (``time_limit_s``, ``mip_gap``, ...).

    Attributes
    ----------
    last_plan : SiaRoundPlan or None
        The last round's plan: ``stop`` (jobs that lost their GPUs), ``evicted``, the allocation.
    """

    def __init__(self, cluster: Cluster | Mapping[str, int], *, gpus_per_node: int | Mapping[str, int] = 8,
                 configurations: Configurations | None = None, round_seconds: float = 60.0, p: float = -0.5,
                 lambda_n: float = 1.1, lambda_a: float = 0.0, backend: str = "highs", **solve_options: Any):
        self.cluster = cluster if isinstance(cluster, Cluster) else Cluster(cluster, gpus_per_node)
        self.configurations = configurations if configurations is not None else sia_configurations(self.cluster)
        if self.configurations.cluster != self.cluster:
            raise InvalidProblemError("configurations belong to another cluster", field="configurations")
        self.round_seconds = float(round_seconds)
        self.options = dict(p=p, lambda_n=lambda_n, lambda_a=lambda_a, backend=backend, **solve_options)
        self.last_plan: SiaRoundPlan | None = None
        self._states: dict[Hashable, SiaJobState] = {}
        self._round_index = 0
        self._index = {(t, int(n), int(g)): c for c, (t, n, g) in enumerate(
            zip(self.configurations.gpu_type_names, self.configurations.num_nodes, self.configurations.num_gpus))}
        self._type_start = np.concatenate([[0], np.cumsum(self.cluster.capacity)])

    def optimize(self, jobs: Mapping[Hashable, Mapping[str, Any]],
                 prev_allocations: Mapping[Hashable, Sequence[int]]) -> dict[Hashable, SiaAssignment]:
        """This round's configuration and GPU ids of every job that gets GPUs (see the module docstring).

        Jobs left out of ``jobs`` are forgotten; a job's previous configuration
        is read from its ``prev_allocations`` entry.

        Raises
        ------
        InvalidProblemError
            For a malformed job entry or GPU ids; ``field`` names it.
        """
        for job_id in set(self._states) - set(jobs):
            del self._states[job_id]
        states = []
        for job_id, job in jobs.items():
            if not isinstance(job, Mapping) or ("goodput" in job) == ("models" in job):
                raise InvalidProblemError(f"jobs[{job_id!r}] must be a mapping with exactly one of 'goodput' and "
                                          "'models'", field="jobs", job=job_id)
            state = self._states.get(job_id)
            if state is None:
                application = str(job.get("application", ""))
                state = self._states[job_id] = SiaJobState(
                    job_id, application, self._round_index * self.round_seconds,
                    float(job.get("restart_delay_s", restart_delay_s(application))))
            state.rigid_gpus = job.get("rigid_gpus")
            state.previous = self._configuration_of(job_id, prev_allocations.get(job_id, ()))
            states.append(state)
        plan = plan_round(states, self.cluster, self.configurations, self._goodput(jobs), prev_allocations,
                          round_index=self._round_index, start_s=self._round_index * self.round_seconds,
                          round_seconds=self.round_seconds, **self.options)
        commit_plan(states, plan)
        advance(states, self.round_seconds)
        self.last_plan = plan
        self._round_index += 1
        out = {}
        for lease in plan.leases:
            c = plan.configuration[lease.job_id]
            out[lease.job_id] = SiaAssignment(lease.gpu_type, int(self.configurations.num_nodes[c]),
                                              int(self.configurations.num_gpus[c]), lease.gpu_ids, lease.extended,
                                              plan.restore_delay_s.get(lease.job_id, 0.0))
        return out

    def _goodput(self, jobs: Mapping[Hashable, Mapping[str, Any]]) -> np.ndarray:
        """The (n_jobs, n_configurations) goodput matrix in ``jobs`` order."""
        n_cfg = len(self.configurations)
        out = np.zeros((len(jobs), n_cfg))
        with_models = [i for i, job in enumerate(jobs.values()) if "models" in job]
        if with_models:
            entries = list(jobs.values())
            out[with_models] = goodput_matrix([entries[i]["models"] for i in with_models], self.configurations)
        for i, (job_id, job) in enumerate(jobs.items()):
            goodput = job.get("goodput")
            if goodput is None:
                continue
            if isinstance(goodput, Mapping):
                for key, value in goodput.items():
                    c = self._index.get((key[0], int(key[1]), int(key[2]))) if isinstance(key, tuple) and \
                        len(key) == 3 else None
                    if c is None:
                        raise InvalidProblemError(f"jobs[{job_id!r}]['goodput'] names {key!r}, not a configuration "
                                                  "(gpu_type, num_nodes, num_gpus) of this policy",
                                                  field="goodput", job=job_id)
                    out[i, c] = value
            else:
                row = np.asarray(goodput, dtype=np.float64).ravel()
                if row.size != n_cfg:
                    raise InvalidProblemError(f"jobs[{job_id!r}]['goodput'] has {row.size} values; give one per "
                                              f"configuration ({n_cfg})", field="goodput", job=job_id)
                out[i] = row
        return out

    def _configuration_of(self, job_id: Hashable, gpu_ids: Sequence[int]) -> int:
        """Index of the configuration ``gpu_ids`` form (-1 for none or a shape outside the configurations)."""
        if not len(gpu_ids):
            return -1
        ids = np.asarray(gpu_ids)
        if ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= self._type_start[-1]:
            raise InvalidProblemError(f"prev_allocations[{job_id!r}] must hold GPU ids in [0, "
                                      f"{self._type_start[-1]}), got {list(gpu_ids)}", field="prev_allocations",
                                      job=job_id)
        types = np.searchsorted(self._type_start, ids, side="right") - 1
        if np.unique(types).size != 1:
            return -1
        t = int(types[0])
        nodes = np.unique((ids - self._type_start[t]) // int(self.cluster.gpus_per_node[t])).size
        return self._index.get((self.cluster.gpu_types[t], nodes, ids.size), -1)


__all__ = ["SiaAssignment", "SiaPolicy"]
