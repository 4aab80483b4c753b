"""Pollux's scheduling problem: replicas per job and node, valued by speedup over a fair share.

Pollux (Qiao et al., OSDI 2021) allocates each job a number of replicas (one
GPU each) on every node. A job's value depends only on how many replicas it
gets and whether they span one node or several (its goodput model predicts
throughput from those two numbers), so a :class:`PolluxProblem` holds each
job's *speedup* per (GPU type, one node / several nodes, replicas): its goodput
at the best batch size there over its goodput at a fair share of the cluster.
It also holds what the last round left: each job's replicas per node and its
restart factor. :class:`PolluxAllocation` is the answer: replicas per job and node.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from allocopt.allocation import Timings
from allocopt.cluster import Cluster
from allocopt.errors import InvalidProblemError
from allocopt.solution import Status

#: Nodes one job may span at most (Sia's port of Pollux caps it at 16).
DEFAULT_MAX_NODES = 16
#: Seconds one restart costs in Pollux's restart factor (its simulator's ``delay``).
DEFAULT_RESTART_DELAY_S = 30.0


def pollux_restart_factor(age_s: Any, restarts: Any, delay_s: Any = DEFAULT_RESTART_DELAY_S) -> np.ndarray:
    """Pollux's factor on the speedup of a job whose allocation changes this round.

    ``max(age_s - restarts * delay_s, 0) / (age_s + delay_s)``: the share of the
    job's age not lost to its restarts, counting the one about to happen. Unlike
    :func:`allocopt.restart_factor` (Sia's), a young job is not exempt: a job of
    age 0 gets 0, so Pollux starts no job in the round it arrives. Arrays broadcast.

    Parameters
    ----------
    age_s : array-like of float
        Seconds since each job was submitted (>= 0).
    restarts : array-like of int
        Restarts so far (>= 0).
    delay_s : array-like of float, default 30
        Seconds one restart costs (> 0).

    Returns
    -------
    ndarray of float in [0, 1)
    """
    age, count, delay = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (age_s, restarts, delay_s)))
    for name, a, ok in (("age_s", age, age >= 0), ("restarts", count, (count >= 0) & (count == np.round(count))),
                        ("delay_s", delay, delay > 0)):
        if not np.all(ok & np.isfinite(a)):
            raise InvalidProblemError(f"pollux_restart_factor: {name} must be finite and "
                                      f"{'> 0' if name == 'delay_s' else '>= 0'}, got {a[~(ok & np.isfinite(a))][0]}",
                                      field=name)
    return np.maximum(age - count * delay, 0.0) / (age + delay)


class PolluxProblem:
    """Jobs, the nodes of a cluster, and each job's speedup per allocation shape.

    Parameters
    ----------
    speedup : array-like of shape (n_jobs, n_types, 2, max_replicas + 1)
        ``speedup[i, t, s, r]``: job ``i``'s goodput with ``r`` replicas on GPUs
        of type ``t`` spread over one node (``s = 0``) or several (``s = 1``), at
        the batch size that maximizes it, over its goodput at a fair share
        (dimensionless). 0 or NaN where the job cannot take that shape (beyond
        its batch-size limits or its most replicas); entry ``r = 0`` is ignored.
        ``n_types`` is 1 for a heterogeneity-unaware problem (every node counts
        the same and a job may span types, as Pollux sees a cluster) or the
        cluster's number of types (a job's replicas lie on one type).
    cluster : Cluster
        Its nodes: ``cluster.num_nodes[t]`` nodes of ``cluster.gpus_per_node[t]``
        GPUs per type (the last one holds what is left), numbered type by type.
    job_ids : sequence of hashable, optional
    previous : array-like of int of shape (n_jobs, n_nodes), optional
        Replicas each job held on each node last round; default none.
    restart_factor : array-like of float in [0, 1], shape (n_jobs,), optional
        Factor on the speedup of a job whose replicas per node change (new jobs
        included, see :func:`pollux_restart_factor`); default 1.
    max_nodes : int or array-like of int, default 16
        Most nodes a job may span.

    Raises
    ------
    InvalidProblemError
        Naming the job and field, for malformed input: a negative or infinite
        speedup, a shape that does not match the cluster, a previous allocation
        that overfills a node or is negative, a restart factor outside [0, 1].
    """

    def __init__(self, speedup: Any, cluster: Cluster, *, job_ids: Sequence[Hashable] | None = None,
                 previous: Any = None, restart_factor: Any = None, max_nodes: Any = DEFAULT_MAX_NODES):
        if not isinstance(cluster, Cluster):
            raise InvalidProblemError(f"cluster must be an allocopt.Cluster, got {type(cluster).__name__}",
                                      field="cluster")
        self.cluster = cluster
        try:
            S = np.array(speedup, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise InvalidProblemError(f"speedup must be a numeric array of shape (n_jobs, n_types, 2, "
                                      f"max_replicas + 1): {err}", field="speedup") from err
        k = cluster.num_gpu_types
        if S.ndim != 4 or S.shape[1] not in (1, k) or S.shape[2] != 2 or S.shape[3] < 2:
            raise InvalidProblemError(f"speedup has shape {S.shape}; expected (n_jobs, 1 or {k}, 2, "
                                      "max_replicas + 1) with max_replicas >= 1", field="speedup")
        n = S.shape[0]
        self.job_ids = _job_ids(job_ids, n)
        bad = np.isinf(S) | (S < 0)
        if bad.any():
            i = int(np.argwhere(bad)[0][0])
            raise InvalidProblemError(f"speedup of job {self.job_ids[i]!r} has a negative or infinite entry; give "
                                      "finite values >= 0 (0 or NaN where the job cannot take the shape)",
                                      field="speedup", job=self.job_ids[i])
        S = np.nan_to_num(S, nan=0.0)
        S[..., 0] = 0.0
        S[:, :, 1, 1] = 0.0  # several nodes need at least 2 replicas
        self.speedup = S
        sizes = [np.minimum(cluster.gpus_per_node[t], cluster.capacity[t] - cluster.gpus_per_node[t] * np.arange(
            cluster.num_nodes[t])) for t in range(k)]
        self.node_gpus = np.concatenate(sizes).astype(np.int64)
        self.node_type = np.repeat(np.arange(k), cluster.num_nodes).astype(np.int64)
        m = self.node_gpus.size
        if previous is None:
            P = np.zeros((n, m), dtype=np.int64)
        else:
            try:
                P = np.array(previous, dtype=np.float64)
            except (TypeError, ValueError) as err:
                raise InvalidProblemError(f"previous must be integers of shape (n_jobs, n_nodes): {err}",
                                          field="previous") from err
            if P.shape != (n, m):
                raise InvalidProblemError(f"previous has shape {P.shape}, expected (n_jobs, n_nodes) = ({n}, {m})",
                                          field="previous")
            wrong = ~np.isfinite(P) | (P < 0) | (P != np.round(P))
            if wrong.any():
                i = int(np.argwhere(wrong)[0][0])
                raise InvalidProblemError(f"previous replicas of job {self.job_ids[i]!r} must be whole numbers >= 0",
                                          field="previous", job=self.job_ids[i])
            P = P.astype(np.int64)
            over = np.flatnonzero(P.sum(axis=0) > self.node_gpus)
            if over.size:
                raise InvalidProblemError(f"previous places {int(P[:, over[0]].sum())} replicas on node {over[0]}, "
                                          f"which has {self.node_gpus[over[0]]} GPUs", field="previous")
        self.previous = P
        f = np.ones(n) if restart_factor is None else np.array(restart_factor, dtype=np.float64)
        if f.shape != (n,) or not np.all(np.isfinite(f) & (f >= 0) & (f <= 1)):
            i = 0 if f.shape != (n,) else int(np.flatnonzero(~(np.isfinite(f) & (f >= 0) & (f <= 1)))[0])
            raise InvalidProblemError(f"restart_factor must hold one value in [0, 1] per job (shape ({n},)); "
                                      f"job {self.job_ids[i] if n else None!r} is out of range or the shape is "
                                      f"{f.shape}", field="restart_factor", job=self.job_ids[i] if n else None)
        self.restart_factor = f
        mn = np.broadcast_to(np.asarray(max_nodes), (n,)) if np.ndim(max_nodes) == 0 else np.asarray(max_nodes)
        if mn.shape != (n,) or mn.dtype.kind not in "iuf" or np.any(mn < 1) or np.any(mn != np.round(mn)):
            raise InvalidProblemError(f"max_nodes must be a whole number >= 1 (or one per job), got {max_nodes!r}",
                                      field="max_nodes")
        self.max_nodes = mn.astype(np.int64)
        for name in ("speedup", "node_gpus", "node_type", "previous", "restart_factor", "max_nodes"):
            getattr(self, name).setflags(write=False)

    @property
    def num_jobs(self) -> int:
        """Number of jobs."""
        return self.speedup.shape[0]

    @property
    def num_nodes(self) -> int:
        """Number of nodes of the cluster."""
        return int(self.node_gpus.size)

    @property
    def heterogeneity_aware(self) -> bool:
        """Whether speedups differ by GPU type (and a job's replicas stay on one type)."""
        return self.speedup.shape[1] > 1 or self.cluster.num_gpu_types == 1

    def speedup_of(self, replicas: np.ndarray) -> np.ndarray:
        """Each job's speedup under ``replicas`` (shape (n_jobs, n_nodes)); 0 where the shape is
        not one the job can take (more replicas than its table, spread over types in an aware problem)."""
        replicas = np.asarray(replicas)
        total = replicas.sum(axis=1)
        spread = (np.count_nonzero(replicas, axis=1) > 1).astype(np.int64)
        if self.speedup.shape[1] == 1:
            t = np.zeros(self.num_jobs, dtype=np.int64)
            one_type = np.ones(self.num_jobs, dtype=bool)
        else:
            on = replicas > 0
            types = np.stack([on[:, self.node_type == j].any(axis=1) for j in range(self.speedup.shape[1])], axis=1)
            one_type = types.sum(axis=1) <= 1
            t = types.argmax(axis=1)
        inside = total < self.speedup.shape[3]
        value = self.speedup[np.arange(self.num_jobs), t, spread, np.minimum(total, self.speedup.shape[3] - 1)]
        return np.where(inside & one_type, value, 0.0)

    def __repr__(self) -> str:
        aware = "aware" if self.heterogeneity_aware else "unaware"
        return (f"PolluxProblem(n_jobs={self.num_jobs}, n_nodes={self.num_nodes}, {aware}, "
                f"cluster={self.cluster!r})")


@dataclass(frozen=True)
class PolluxAllocation:
    """Replicas per job and node chosen by the ``pollux`` policy.

    Attributes
    ----------
    problem : PolluxProblem
    replicas : read-only ndarray of int, shape (n_jobs, n_nodes)
    objective : float or None
        Pollux's fitness: the power mean with exponent ``p`` of the jobs' scaled speedups.
    restarted : read-only ndarray of bool, shape (n_jobs,)
        Jobs whose replicas per node differ from ``problem.previous``.
    speedup : read-only ndarray of float, shape (n_jobs,)
        Each job's speedup under ``replicas`` (before the restart factor).
    """

    problem: PolluxProblem
    replicas: np.ndarray
    policy: str
    backend: str | None
    status: Status
    objective: float | None
    message: str = ""
    timings: Timings = field(default_factory=Timings)
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def job_ids(self) -> tuple:
        return self.problem.job_ids

    @property
    def success(self) -> bool:
        return self.status is Status.OPTIMAL

    @property
    def num_replicas(self) -> np.ndarray:
        """Replicas of each job (GPUs)."""
        return self.replicas.sum(axis=1)

    @property
    def num_nodes(self) -> np.ndarray:
        """Nodes each job spans."""
        return np.count_nonzero(self.replicas, axis=1)

    @property
    def restarted(self) -> np.ndarray:
        return np.any(self.replicas != self.problem.previous, axis=1)

    @property
    def speedup(self) -> np.ndarray:
        return self.problem.speedup_of(self.replicas)

    def nodes_of(self, job: Hashable) -> list[int]:
        """Node index of each replica of ``job`` (Pollux's allocation list form)."""
        i = self.problem.job_ids.index(job)
        return np.repeat(np.arange(self.problem.num_nodes), self.replicas[i]).tolist()

    def __repr__(self) -> str:
        obj = "None" if self.objective is None else f"{self.objective:.6g}"
        return (f"PolluxAllocation(policy={self.policy!r}, backend={self.backend!r}, status={self.status.value}, "
                f"objective={obj}, n_jobs={self.problem.num_jobs}, "
                f"allocated={int(np.count_nonzero(self.num_replicas))})")


def _job_ids(job_ids: Sequence[Hashable] | None, n: int) -> tuple:
    if job_ids is None:
        return tuple(range(n))
    ids = tuple(job_ids)
    if len(ids) != n:
        raise InvalidProblemError(f"job_ids has {len(ids)} entries but speedup has {n} rows", field="job_ids")
    if len(set(ids)) != n:
        seen: set = set()
        dup = next(j for j in ids if j in seen or seen.add(j))
        raise InvalidProblemError(f"job id {dup!r} appears more than once", field="job_ids", job=dup)
    return ids
