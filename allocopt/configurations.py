"""Configurations: the (GPU type, nodes, GPUs) shapes a job may be given.

Goodput-optimized schedulers (Sia, SOSP 2023) choose for each job one
configuration out of a small set instead of a time fraction per GPU type.
:func:`sia_configurations` builds Sia's published set.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from allocopt.cluster import Cluster
from allocopt.errors import InvalidProblemError


class Configurations:
    """An immutable, ordered set of configurations of one cluster.

    Parameters
    ----------
    cluster : Cluster
    gpu_type : array-like of int or str, shape (n_configurations,)
        GPU type of each configuration, as an index into ``cluster.gpu_types`` or its name.
    num_nodes : array-like of int, shape (n_configurations,)
        Servers each configuration spans.
    num_gpus : array-like of int, shape (n_configurations,)
        GPUs each configuration holds in total.

    Attributes
    ----------
    cluster : Cluster
    gpu_type, num_nodes, num_gpus : read-only ndarray of int, shape (n_configurations,)

    Raises
    ------
    InvalidProblemError
        For mismatched lengths, unknown types, non-positive counts, a
        configuration that does not fit its type (more GPUs than the type has,
        more nodes than it has, more GPUs than its nodes hold, fewer GPUs than
        nodes) or a repeated configuration.
    """

    __slots__ = ("cluster", "gpu_type", "num_nodes", "num_gpus")

    def __init__(self, cluster: Cluster, gpu_type: Any, num_nodes: Any, num_gpus: Any):
        if not isinstance(cluster, Cluster):
            raise InvalidProblemError(f"Configurations needs an allocopt.Cluster, got {type(cluster).__name__}",
                                      field="cluster")
        types = np.asarray(gpu_type).ravel()
        if types.dtype.kind in "US":
            types = np.array([cluster.index(str(t)) for t in types], dtype=np.int64)
        arrays = {"gpu_type": types, "num_nodes": np.asarray(num_nodes).ravel(),
                  "num_gpus": np.asarray(num_gpus).ravel()}
        sizes = {name: a.size for name, a in arrays.items()}
        if len(set(sizes.values())) != 1:
            raise InvalidProblemError(f"gpu_type, num_nodes and num_gpus must have one entry per configuration, "
                                      f"got lengths {sizes}", field="configurations")
        for name, a in arrays.items():
            if a.size and (a.dtype.kind not in "iuf" or not np.all(np.isfinite(a)) or np.any(a != np.round(a))):
                raise InvalidProblemError(f"{name} must hold integers, got {a.tolist()}", field=name)
            arrays[name] = a.astype(np.int64)
        t, nodes, gpus = arrays["gpu_type"], arrays["num_nodes"], arrays["num_gpus"]
        bad = np.flatnonzero((t < 0) | (t >= cluster.num_gpu_types))
        if bad.size:
            raise InvalidProblemError(f"configuration {bad[0]}: gpu_type {t[bad[0]]} is not an index into the "
                                      f"cluster's {cluster.num_gpu_types} GPU types", field="gpu_type")
        per_node = cluster.gpus_per_node[t]
        problems = [((nodes < 1) | (gpus < 1), "needs at least 1 node and 1 GPU"),
                    (gpus > cluster.capacity[t], "holds more GPUs than its type has"),
                    (nodes > cluster.num_nodes[t], "spans more nodes than its type has"),
                    (gpus > nodes * per_node, "holds more GPUs than its nodes do"),
                    (gpus < nodes, "spans more nodes than it has GPUs")]
        for mask, what in problems:
            bad = np.flatnonzero(mask)
            if bad.size:
                c = bad[0]
                raise InvalidProblemError(
                    f"configuration {c} ({cluster.gpu_types[t[c]]}, {nodes[c]} node(s), {gpus[c]} GPU(s)) {what} "
                    f"({cluster.capacity[t[c]]} GPUs on {cluster.num_nodes[t[c]]} node(s) of "
                    f"{per_node[c]}); fix or drop it", field="configurations")
        keys = np.stack([t, nodes, gpus], axis=1)
        if np.unique(keys, axis=0).shape[0] != keys.shape[0]:
            raise InvalidProblemError("configurations must be distinct; a (gpu_type, num_nodes, num_gpus) "
                                      "triple appears twice", field="configurations")
        for a in (t, nodes, gpus):
            a.setflags(write=False)
        for name, value in (("cluster", cluster), ("gpu_type", t), ("num_nodes", nodes), ("num_gpus", gpus)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Configurations is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle (and ``copy.deepcopy``) through the constructor, which validates again."""
        return (Configurations, (self.cluster, np.array(self.gpu_type), np.array(self.num_nodes),
                                 np.array(self.num_gpus)))

    def __len__(self) -> int:
        return int(self.gpu_type.size)

    @property
    def gpu_type_names(self) -> tuple[str, ...]:
        """GPU type name of each configuration."""
        return tuple(self.cluster.gpu_types[j] for j in self.gpu_type.tolist())

    def label(self, index: int) -> str:
        """A readable name of configuration ``index``, e.g. ``"#5 (rtx, 2 nodes, 16 GPUs)"``."""
        nodes, gpus = int(self.num_nodes[index]), int(self.num_gpus[index])
        return (f"#{index} ({self.cluster.gpu_types[self.gpu_type[index]]}, {nodes} node{'s' * (nodes > 1)}, "
                f"{gpus} GPU{'s' * (gpus > 1)})")

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Configurations) and self.cluster == other.cluster
                and all(np.array_equal(getattr(self, a), getattr(other, a))
                        for a in ("gpu_type", "num_nodes", "num_gpus")))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Configurations(n={len(self)}, gpu_types={self.cluster.gpu_types})"


def sia_configurations(cluster: Cluster, *, max_nodes: int | Mapping[str, int] | None = None,
                       all_gpu_counts: bool = False) -> Configurations:
    """Sia's configuration set of ``cluster``.

    Per GPU type with ``g`` GPUs per node and ``N`` full nodes: powers of two
    below ``g`` and ``g`` itself on one node (1, 2, 4, ..., g), then whole nodes
    (2g GPUs on 2 nodes, 3g on 3, ..., Ng on N) -- Sia's published
    ``CONFIGS_4GPU`` / ``CONFIGS_8GPU``. One-node configurations larger than
    the type's GPU count are dropped (a type of 2 GPUs gets 1 and 2); types
    without GPUs contribute nothing. Configurations are ordered by type (the
    cluster's order), then by GPU count.

    Parameters
    ----------
    cluster : Cluster
    max_nodes : int or mapping of str to int, optional
        Most nodes one configuration may span, for every type or per type
        (Sia's ``cluster_max_physical_nnodes``); types missing from a mapping are uncapped.
    all_gpu_counts : bool, default False
        Every GPU count from 1 to the type's capacity instead, each on the
        fewest nodes that hold it (``ceil(gpus / g)``), within ``max_nodes``.

    Returns
    -------
    Configurations

    Examples
    --------
    >>> from allocopt import Cluster
    >>> configs = sia_configurations(Cluster({"t4": 12}, gpus_per_node=4))
    >>> configs.num_gpus.tolist(), configs.num_nodes.tolist()
    ([1, 2, 4, 8, 12], [1, 1, 1, 2, 3])
    """
    if not isinstance(cluster, Cluster):
        raise InvalidProblemError(f"sia_configurations needs an allocopt.Cluster, got {type(cluster).__name__}",
                                  field="cluster")
    node_cap = _node_caps(cluster, max_nodes)
    types, nodes, gpus = [], [], []
    for j in range(cluster.num_gpu_types):
        capacity, per_node = int(cluster.capacity[j]), int(cluster.gpus_per_node[j])
        if all_gpu_counts:
            counts = np.arange(1, min(capacity, node_cap[j] * per_node) + 1)
            spans = -(-counts // per_node)
        else:
            one_node = 2 ** np.arange(per_node.bit_length())
            one_node = np.union1d(one_node, [per_node])
            one_node = one_node[one_node <= capacity]
            whole = np.arange(2, min(capacity // per_node, node_cap[j]) + 1)
            counts = np.concatenate([one_node, whole * per_node])
            spans = np.concatenate([np.ones(one_node.size, dtype=np.int64), whole])
        types.append(np.full(counts.size, j))
        nodes.append(spans)
        gpus.append(counts)
    if not sum(a.size for a in gpus):
        raise InvalidProblemError(f"{cluster!r} has no GPUs, so there is no configuration to allocate; "
                                  "give at least one GPU type a positive count", field="cluster")
    return Configurations(cluster, np.concatenate(types), np.concatenate(nodes), np.concatenate(gpus))


def _node_caps(cluster: Cluster, max_nodes: int | Mapping[str, int] | None) -> np.ndarray:
    """Most nodes per configuration for each type (its node count where uncapped)."""
    caps = cluster.num_nodes.copy()
    if max_nodes is None:
        return caps
    if isinstance(max_nodes, Mapping):
        unknown = sorted(set(map(str, max_nodes)) - set(cluster.gpu_types))
        if unknown:
            raise InvalidProblemError(f"max_nodes names unknown GPU type(s) {unknown}; the cluster's types are "
                                      f"{list(cluster.gpu_types)}", field="max_nodes")
        items = [(cluster.index(str(t)), v) for t, v in max_nodes.items()]
    else:
        items = [(j, max_nodes) for j in range(cluster.num_gpu_types)]
    for j, value in items:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InvalidProblemError(f"max_nodes must be a positive integer (per type or for all), got "
                                      f"{value!r} for {cluster.gpu_types[j]!r}", field="max_nodes")
        caps[j] = min(caps[j], int(value))
    return caps
