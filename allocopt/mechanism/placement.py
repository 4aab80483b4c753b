"""Placement of a round's jobs onto servers and GPU ids.

GPU ids are cluster-wide, numbered type by type (cluster order), node by node
(``Cluster.gpus_per_node``). Jobs that ran on a type last round keep exactly
their previous GPUs when these are still free (the lease is extended, no
restart); the others are placed largest first, each on as few servers as
possible: a job needing at most one server's GPUs goes to the fullest server
that still fits it (best fit), a larger one takes the emptiest servers first.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from allocopt.cluster import Cluster
from allocopt.errors import InvalidProblemError


class GpuLayout:
    """Cluster-wide GPU ids of a :class:`~allocopt.Cluster`.

    Attributes
    ----------
    cluster : Cluster
    gpu_type : ndarray of int of shape (n_gpus,)
        Type (column index) of each GPU id.
    node : ndarray of int of shape (n_gpus,)
        Cluster-wide server index of each GPU id.
    local_index : ndarray of int of shape (n_gpus,)
        Index of each GPU within its server.
    node_type : ndarray of int of shape (n_nodes,)
        Type of each server.
    node_start : ndarray of int of shape (n_nodes + 1,)
        First GPU id of each server (and the total GPU count last).
    type_start : ndarray of int of shape (n_gpu_types + 1,)
        First GPU id of each type.
    """

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        counts, per = cluster.capacity, cluster.gpus_per_node
        self.gpu_type = np.repeat(np.arange(counts.size), counts)
        self.local_index = np.concatenate([np.arange(c) % p for c, p in zip(counts, per)]).astype(np.int64)
        nodes = cluster.num_nodes
        node_offset = np.concatenate([[0], np.cumsum(nodes)])
        self.node = np.concatenate([np.arange(c) // p + o for c, p, o in zip(counts, per, node_offset)]
                                   ).astype(np.int64)
        self.node_type = np.repeat(np.arange(counts.size), nodes)
        self.node_start = np.concatenate([[0], np.cumsum(np.bincount(self.node, minlength=int(nodes.sum())))])
        self.type_start = np.concatenate([[0], np.cumsum(counts)])
        self.type_nodes = [np.arange(node_offset[j], node_offset[j + 1]) for j in range(counts.size)]

    @property
    def num_gpus(self) -> int:
        """GPUs in the cluster."""
        return int(self.gpu_type.size)

    def describe(self, gpu_id: int) -> str:
        """``"v100 node 3 gpu 1"`` for a GPU id."""
        return (f"{self.cluster.gpu_types[self.gpu_type[gpu_id]]} node {self.node[gpu_id]} "
                f"gpu {self.local_index[gpu_id]}")


class Placement(NamedTuple):
    """Where one job runs: its GPU ids, and whether it keeps last round's GPUs."""

    gpu_ids: tuple[int, ...]
    extended: bool


def place(layout: GpuLayout, job_ids: Sequence[Hashable], gpu_types: np.ndarray, num_gpus: np.ndarray,
          previous: Mapping[Hashable, tuple[int, ...]] | None = None) -> list[Placement]:
    """GPU ids for each of a round's jobs.

    Parameters
    ----------
    layout : GpuLayout
    job_ids : sequence of hashable, length n
    gpu_types : ndarray of int of shape (n,)
        Type (column index) each job runs on.
    num_gpus : ndarray of int of shape (n,)
        GPUs each job needs.
    previous : mapping of job id to tuple of int, optional
        GPU ids each job held last round.

    Returns
    -------
    list of Placement, in ``job_ids`` order

    Raises
    ------
    InvalidProblemError
        When the jobs of a type need more GPUs than it has.
    """
    previous = previous or {}
    gpu_types, num_gpus = np.asarray(gpu_types, dtype=np.int64), np.asarray(num_gpus, dtype=np.int64)
    demand = np.bincount(gpu_types, weights=num_gpus, minlength=layout.cluster.num_gpu_types)
    over = np.flatnonzero(demand > layout.cluster.capacity)
    if over.size:
        j = int(over[0])
        raise InvalidProblemError(f"the round's jobs need {int(demand[j])} GPUs of type "
                                  f"{layout.cluster.gpu_types[j]!r}, which has {layout.cluster.capacity[j]}",
                                  field="gpu_types")
    free = np.ones(layout.num_gpus, dtype=bool)
    node_free = np.diff(layout.node_start)
    out: list[Placement | None] = [None] * len(job_ids)
    order = np.argsort(-num_gpus, kind="stable").tolist()
    pending = []
    for i in order:  # keep last round's GPUs where all are still free and of the same type and count
        ids = previous.get(job_ids[i])
        if ids is not None and len(ids) == num_gpus[i]:
            arr = np.fromiter(ids, dtype=np.int64, count=len(ids))
            if (layout.gpu_type[arr] == gpu_types[i]).all() and free[arr].all():
                free[arr] = False
                np.subtract.at(node_free, layout.node[arr], 1)
                out[i] = Placement(tuple(ids), True)
                continue
        pending.append(i)
    for i in pending:
        j, n = int(gpu_types[i]), int(num_gpus[i])
        nodes = layout.type_nodes[j]
        per_node = int(layout.cluster.gpus_per_node[j])
        counts = node_free[nodes]
        fits = np.flatnonzero(counts >= n)
        if n <= per_node and fits.size:
            chosen = [int(nodes[fits[np.argmin(counts[fits])]])]  # best fit: the fullest server that fits
        else:
            by_free = nodes[np.argsort(-counts, kind="stable")]  # emptiest servers first
            enough = int(np.searchsorted(np.cumsum(node_free[by_free]), n)) + 1
            chosen = by_free[:enough].tolist()
        ids: list[int] = []
        for node in chosen:
            start = int(layout.node_start[node])
            local = np.flatnonzero(free[start:layout.node_start[node + 1]])[:n - len(ids)] + start
            free[local] = False
            node_free[node] -= local.size
            ids.extend(local.tolist())
        out[i] = Placement(tuple(ids), False)
    return out  # type: ignore[return-value]


__all__ = ["GpuLayout", "Placement", "place"]
