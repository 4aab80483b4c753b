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
    """GPU ids for each of a round's jobs (:func:`place_arrays` over a mapping of last round's GPUs).

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
    held = [previous.get(job, ()) for job in job_ids]
    counts = np.fromiter(map(len, held), dtype=np.int64, count=len(held))
    ids = np.fromiter((g for gpus in held for g in gpus), dtype=np.int64, count=int(counts.sum()))
    flat, start, extended = place_arrays(layout, gpu_types, num_gpus, ids, counts)
    bounds = start.tolist()
    flat_list = flat.tolist()
    return [Placement(tuple(flat_list[a:b]), keep) for a, b, keep in zip(bounds[:-1], bounds[1:], extended.tolist())]


def place_arrays(layout: GpuLayout, gpu_types: np.ndarray, num_gpus: np.ndarray, previous_ids: np.ndarray,
                 previous_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPU ids for each of a round's entries, vectorized over the entries of each (type, size).

    An entry keeps last round's GPUs when it held as many as it needs now, all
    of its type (and, should two entries name the same GPU, free when its turn
    comes, largest entry first). The others are placed largest first, in entry
    order among equal sizes: best fit on one server, else the emptiest servers
    (see the module's description).

    Parameters
    ----------
    layout : GpuLayout
    gpu_types : ndarray of int of shape (n,)
        Type (column index) each entry runs on.
    num_gpus : ndarray of int of shape (n,)
    previous_ids : ndarray of int of shape (sum(previous_counts),)
        GPU ids each entry held last round, concatenated in entry order.
    previous_counts : ndarray of int of shape (n,)
        How many ids of ``previous_ids`` are each entry's (0: none).

    Returns
    -------
    gpu_ids : ndarray of int of shape (num_gpus.sum(),)
        Every entry's GPU ids, concatenated in entry order.
    start : ndarray of int of shape (n + 1,)
        Entry ``i`` holds ``gpu_ids[start[i]:start[i + 1]]``.
    extended : ndarray of bool of shape (n,)
        Whether each entry keeps last round's GPUs.

    Raises
    ------
    InvalidProblemError
        When the entries of a type need more GPUs than it has.
    """
    gpu_types, num_gpus = np.asarray(gpu_types, dtype=np.int64), np.asarray(num_gpus, dtype=np.int64)
    previous_ids, previous_counts = (np.asarray(previous_ids, dtype=np.int64),
                                     np.asarray(previous_counts, dtype=np.int64))
    demand = np.bincount(gpu_types, weights=num_gpus, minlength=layout.cluster.num_gpu_types)
    over = np.flatnonzero(demand > layout.cluster.capacity)
    if over.size:
        j = int(over[0])
        raise InvalidProblemError(f"the round's jobs need {int(demand[j])} GPUs of type "
                                  f"{layout.cluster.gpu_types[j]!r}, which has {layout.cluster.capacity[j]}",
                                  field="gpu_types")
    start = np.concatenate([[0], np.cumsum(num_gpus)]).astype(np.int64)
    out = np.empty(int(start[-1]), dtype=np.int64)
    free = np.ones(layout.num_gpus, dtype=bool)
    order = np.argsort(-num_gpus, kind="stable")
    extended = _kept(layout, gpu_types, num_gpus, previous_ids, previous_counts, order)
    kept_ids = previous_ids[np.repeat(extended, previous_counts)]
    out[_positions(start, np.flatnonzero(extended), num_gpus)] = kept_ids
    free[kept_ids] = False
    node_free = np.diff(layout.node_start) - np.bincount(layout.node[kept_ids], minlength=layout.node_type.size)
    pending = order[~extended[order]]
    for j in np.flatnonzero(np.bincount(gpu_types[pending], minlength=layout.cluster.num_gpu_types)).tolist():
        of_type = pending[gpu_types[pending] == j]
        for size in sorted(set(num_gpus[of_type].tolist()), reverse=True):
            group = of_type[num_gpus[of_type] == size]
            placed = _best_fit(layout, j, size, group, free, node_free, out, start) if size else group.size
            if placed < group.size:
                _spread(layout, j, size, group[placed:], free, node_free, out, start)
    return out, start, extended


def _positions(start: np.ndarray, entries: np.ndarray, num_gpus: np.ndarray) -> np.ndarray:
    """Indices into the flat id array of every slot of ``entries``, entry by entry."""
    counts = num_gpus[entries]
    offsets = np.repeat(start[entries] - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    return offsets + np.arange(int(counts.sum()))


def _kept(layout: GpuLayout, gpu_types: np.ndarray, num_gpus: np.ndarray, previous_ids: np.ndarray,
          previous_counts: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Which entries keep last round's GPUs (same count, same type, not claimed by an earlier entry)."""
    owner = np.repeat(np.arange(gpu_types.size), previous_counts)
    wrong = np.bincount(owner[layout.gpu_type[previous_ids] != gpu_types[owner]], minlength=gpu_types.size)
    kept = (previous_counts == num_gpus) & (previous_counts > 0) & (wrong == 0)
    candidate = previous_ids[np.repeat(kept, previous_counts)]
    named = np.zeros(layout.num_gpus, dtype=bool)
    named[candidate] = True
    if np.count_nonzero(named) == candidate.size:
        return kept
    # entries that name the same GPU: walk them largest first, as a sequential placement would
    bounds = np.concatenate([[0], np.cumsum(previous_counts)])
    taken = np.zeros(layout.num_gpus, dtype=bool)
    for i in order[kept[order]].tolist():
        ids = previous_ids[bounds[i]:bounds[i + 1]]
        if taken[ids].any() or np.unique(ids).size != ids.size:
            kept[i] = False
        else:
            taken[ids] = True
    return kept


def _best_fit(layout: GpuLayout, j: int, size: int, group: np.ndarray, free: np.ndarray, node_free: np.ndarray,
              out: np.ndarray, start: np.ndarray) -> int:
    """Place the first entries of ``group`` (all of type ``j`` and ``size`` GPUs) one server each, best fit.

    Entry after entry, each takes the lowest free GPUs of the fullest server
    that fits it; with equal sizes a server stays the fullest that fits until
    it no longer fits, so servers fill in order of (free GPUs, index). Returns
    how many entries were placed (the rest fit no single server).
    """
    if size > int(layout.cluster.gpus_per_node[j]):
        return 0
    nodes = layout.type_nodes[j]
    counts = node_free[nodes]
    fits = counts >= size
    nodes, counts = nodes[fits], counts[fits]
    by_fullness = np.lexsort((nodes, counts))
    nodes, counts = nodes[by_fullness], counts[by_fullness]
    slots = counts // size
    total = np.cumsum(slots)
    k = min(group.size, int(total[-1]) if total.size else 0)
    if not k:
        return 0
    used = int(np.searchsorted(total, k)) + 1
    nodes, slots, total = nodes[:used], slots[:used], total[:used]
    take = np.minimum(slots, k - (total - slots))
    lengths = layout.node_start[nodes + 1] - layout.node_start[nodes]
    seg = np.repeat(np.arange(used), lengths)
    gpus = layout.node_start[nodes][seg] + np.arange(int(lengths.sum())) - np.repeat(
        np.cumsum(lengths) - lengths, lengths)
    is_free = free[gpus]
    rank = np.cumsum(is_free) - 1
    rank -= np.repeat(np.concatenate([[0], np.cumsum(is_free)[np.cumsum(lengths)[:-1] - 1]]), lengths)
    chosen = is_free & (rank < (take * size)[seg])
    ids = gpus[chosen]
    free[ids] = False
    node_free[nodes] -= take * size
    out[(start[group[:k], None] + np.arange(size)).ravel()] = ids
    return k


def _spread(layout: GpuLayout, j: int, size: int, group: np.ndarray, free: np.ndarray, node_free: np.ndarray,
            out: np.ndarray, start: np.ndarray) -> None:
    """Place each entry of ``group`` (type ``j``, ``size`` GPUs each) in turn on the lowest free GPU ids
    of the emptiest servers of the type (stable in server order), as many servers as it needs."""
    first_node = int(layout.type_nodes[j][0]) if layout.type_nodes[j].size else 0
    counts = node_free[layout.type_nodes[j]].tolist()
    bounds = layout.node_start.tolist()
    for i in group.tolist():
        ids: list[int] = []
        for k in sorted(range(len(counts)), key=counts.__getitem__, reverse=True):
            if len(ids) == size:
                break
            node = first_node + k
            local = np.flatnonzero(free[bounds[node]:bounds[node + 1]])[:size - len(ids)] + bounds[node]
            free[local] = False
            counts[k] -= local.size
            ids.extend(local.tolist())
        out[start[i]:start[i + 1]] = ids
    node_free[layout.type_nodes[j]] = counts


__all__ = ["GpuLayout", "Placement", "place", "place_arrays"]
