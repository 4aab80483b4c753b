"""Placement plug-ins: where a round's jobs get their GPUs.

Every policy first keeps each job on the GPUs it held last round when it needs
as many, of the same type, and they are free (the lease is extended, no
restart); the policies differ in where the other jobs go. GPU ids and servers
are those of :class:`~allocopt.mechanism.placement.GpuLayout`. Built-in policies
(:data:`PLACEMENT_POLICIES`, by name in :func:`allocopt.simulate`):

``best_fit`` (the default)
    :func:`~allocopt.mechanism.placement.place_arrays`: a job that fits one
    server goes to the fullest server that fits it; a larger one takes the
    emptiest servers first.
``packing``
    Against fragmentation: a job that fits one server goes to the fullest
    server that fits it, a larger one fills the fullest servers first, so
    empty servers stay whole for large jobs.
``scattered``
    Each job's GPUs are dealt one at a time to the servers with the most free
    GPUs (Tiresias's non-consolidated placement: spread over servers).
``consolidated``
    Tiresias's model-skew rule (Gu et al., NSDI 2019, section 4): a job whose
    model has a skewed tensor-size distribution (its largest tensor's share of
    the model, :data:`TIRESIAS_MODEL_SKEW`, at least ``skew_threshold``) must
    run on as few servers as possible (one when it fits one, else
    ``ceil(GPUs / GPUs per server)`` whole servers) and waits for a later
    round when they are not free; other jobs are placed by best fit.

A policy is an object with a ``name`` and a ``place(layout, gpu_types,
num_gpus, previous_ids, previous_counts, models)`` method returning a
:class:`PlacementResult`; a policy that may leave entries unplaced (they wait)
sets ``may_defer = True``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from allocopt.errors import InvalidOptionError
from allocopt.mechanism.placement import GpuLayout, _kept, place_arrays


class PlacementResult(NamedTuple):
    """Placement of a round's entries.

    Attributes
    ----------
    gpu_ids : ndarray of int
        Every placed entry's GPU ids, concatenated in entry order.
    start : ndarray of int of shape (n + 1,)
        Entry ``i`` holds ``gpu_ids[start[i]:start[i + 1]]`` (none when not placed).
    extended : ndarray of bool of shape (n,)
        The entry keeps last round's GPUs.
    placed : ndarray of bool of shape (n,)
    """

    gpu_ids: np.ndarray
    start: np.ndarray
    extended: np.ndarray
    placed: np.ndarray


@runtime_checkable
class PlacementPolicy(Protocol):
    """Places a round's entries (see the module's description)."""

    name: str

    def place(self, layout: GpuLayout, gpu_types: np.ndarray, num_gpus: np.ndarray, previous_ids: np.ndarray,
              previous_counts: np.ndarray, models: Sequence[str]) -> PlacementResult: ...


class BestFit:
    """allocopt's placement (:func:`~allocopt.mechanism.placement.place_arrays`)."""

    name = "best_fit"
    may_defer = False

    def place(self, layout: GpuLayout, gpu_types: np.ndarray, num_gpus: np.ndarray, previous_ids: np.ndarray,
              previous_counts: np.ndarray, models: Sequence[str]) -> PlacementResult:
        ids, start, extended = place_arrays(layout, gpu_types, num_gpus, previous_ids, previous_counts)
        return PlacementResult(ids, start, extended, np.ones(num_gpus.size, dtype=bool))


class _Sequential(ABC):
    """Keep last round's GPUs, then place the other entries one by one, largest first (``_choose``)."""

    name = "sequential"
    may_defer = False

    def place(self, layout: GpuLayout, gpu_types: np.ndarray, num_gpus: np.ndarray, previous_ids: np.ndarray,
              previous_counts: np.ndarray, models: Sequence[str]) -> PlacementResult:
        gpu_types = np.asarray(gpu_types, dtype=np.int64)
        num_gpus = np.asarray(num_gpus, dtype=np.int64)
        previous_ids = np.asarray(previous_ids, dtype=np.int64)
        previous_counts = np.asarray(previous_counts, dtype=np.int64)
        demand = np.bincount(gpu_types, weights=num_gpus, minlength=layout.cluster.num_gpu_types)
        if (demand > layout.cluster.capacity).any():
            j = int(np.argmax(demand > layout.cluster.capacity))
            raise InvalidOptionError(f"the round's jobs need {int(demand[j])} GPUs of type "
                                     f"{layout.cluster.gpu_types[j]!r}, which has {layout.cluster.capacity[j]}")
        order = np.argsort(-num_gpus, kind="stable")
        extended = _kept(layout, gpu_types, num_gpus, previous_ids, previous_counts, order)
        free = np.ones(layout.num_gpus, dtype=bool)
        held: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * num_gpus.size
        bounds = np.concatenate([[0], np.cumsum(previous_counts)])
        for i in np.flatnonzero(extended).tolist():
            held[i] = previous_ids[bounds[i]:bounds[i + 1]]
            free[held[i]] = False
        placed = extended.copy()
        for i in order[~extended[order]].tolist():
            if num_gpus[i] == 0:
                placed[i] = True
                continue
            chosen = self._choose(layout, int(gpu_types[i]), int(num_gpus[i]), free, models[i])
            if chosen is not None:
                held[i] = chosen
                free[chosen] = False
                placed[i] = True
        widths = np.array([h.size for h in held], dtype=np.int64)
        start = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)
        ids = np.concatenate(held) if held else np.zeros(0, dtype=np.int64)
        return PlacementResult(ids.astype(np.int64), start, extended, placed)

    @abstractmethod
    def _choose(self, layout: GpuLayout, j: int, size: int, free: np.ndarray, model: str) -> np.ndarray | None:
        """The GPU ids of type ``j`` to give an entry of ``size`` GPUs (None: it waits)."""

    @staticmethod
    def _servers(layout: GpuLayout, j: int, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Servers of type ``j`` and their free GPU counts."""
        nodes = layout.type_nodes[j]
        counts = np.add.reduceat(free.astype(np.int64), layout.node_start[:-1])[nodes] if nodes.size else nodes
        return nodes, counts

    @staticmethod
    def _take(layout: GpuLayout, nodes: Sequence[int], size: int, free: np.ndarray) -> np.ndarray:
        """The lowest free GPU ids of ``nodes``, in that order, ``size`` of them."""
        ids: list[int] = []
        for node in nodes:
            a, b = int(layout.node_start[node]), int(layout.node_start[node + 1])
            ids.extend((np.flatnonzero(free[a:b]) + a)[:size - len(ids)].tolist())
            if len(ids) == size:
                break
        return np.array(ids, dtype=np.int64)

    def _best_fit_one_server(self, layout: GpuLayout, j: int, size: int, free: np.ndarray) -> np.ndarray | None:
        nodes, counts = self._servers(layout, j, free)
        fits = counts >= size
        if not fits.any():
            return None
        k = np.lexsort((nodes[fits], counts[fits]))[0]
        return self._take(layout, [int(nodes[fits][k])], size, free)


class Packing(_Sequential):
    """Fullest servers first (best fit on one server when the job fits one)."""

    name = "packing"

    def _choose(self, layout: GpuLayout, j: int, size: int, free: np.ndarray, model: str) -> np.ndarray | None:
        one = self._best_fit_one_server(layout, j, size, free)
        if one is not None:
            return one
        nodes, counts = self._servers(layout, j, free)
        order = np.lexsort((nodes, counts))
        order = order[counts[order] > 0]
        return self._take(layout, nodes[order].tolist(), size, free)


class Scattered(_Sequential):
    """One GPU at a time to the server with the most free GPUs (ties: lower server)."""

    name = "scattered"

    def _choose(self, layout: GpuLayout, j: int, size: int, free: np.ndarray, model: str) -> np.ndarray | None:
        nodes, counts = self._servers(layout, j, free)
        counts = counts.copy()
        ids: list[int] = []
        taken = free.copy()
        for _ in range(size):
            k = int(np.argmax(counts))  # the first of the most free
            node = int(nodes[k])
            a, b = int(layout.node_start[node]), int(layout.node_start[node + 1])
            gpu = int(np.flatnonzero(taken[a:b])[0]) + a
            taken[gpu] = False
            counts[k] -= 1
            ids.append(gpu)
        return np.array(ids, dtype=np.int64)


#: Largest tensor's share of the model's parameters, ``max(tensors) / sum(tensors)`` over the tensor sizes
#: (MB) of Tiresias's simulator (SymbioticLab/Tiresias, ``simulator/models.py``, ``m_tensors``; Apache 2.0),
#: rounded to 4 decimals: VGG and AlexNet are skewed, ResNet and Inception are not.
TIRESIAS_MODEL_SKEW: dict[str, float] = {
    "vgg19": 0.7165, "vgg16": 0.7441, "vgg11": 0.7739, "alexnet": 0.6107, "resnet152": 0.0602,
    "resnet101": 0.0752, "resnet50": 0.1117, "inception4": 0.0444, "inception3": 0.1378,
}


class Consolidated(_Sequential):
    """Tiresias's rule: skewed models on as few servers as possible, or wait; others by best fit.

    Parameters
    ----------
    skew_threshold : float, default 0.5
        A model is skewed when its largest tensor's share is at least this.
    model_skew : mapping of str to float, default :data:`TIRESIAS_MODEL_SKEW`
        Skew of each model; a model is matched by name, case-insensitively, or by
        the longest name it starts with (``"VGG16 (batch size 32)"`` is ``vgg16``).
        Models not in it are not skewed.
    """

    name = "consolidated"
    may_defer = True

    def __init__(self, skew_threshold: float = 0.5, model_skew: Mapping[str, float] = TIRESIAS_MODEL_SKEW):
        if not 0 <= skew_threshold <= 1:
            raise InvalidOptionError(f"consolidated: skew_threshold must be in [0, 1], got {skew_threshold!r}")
        self.skew_threshold = float(skew_threshold)
        self.model_skew = {str(k).lower(): float(v) for k, v in model_skew.items()}
        self._names = sorted(self.model_skew, key=len, reverse=True)

    def skewed(self, model: str) -> bool:
        """Whether ``model`` must be consolidated."""
        name = str(model).lower()
        skew = self.model_skew.get(name)
        if skew is None:
            skew = next((self.model_skew[k] for k in self._names if name.startswith(k)), 0.0)
        return skew >= self.skew_threshold

    def _choose(self, layout: GpuLayout, j: int, size: int, free: np.ndarray, model: str) -> np.ndarray | None:
        one = self._best_fit_one_server(layout, j, size, free)
        if one is not None:
            return one
        nodes, counts = self._servers(layout, j, free)
        per = int(layout.cluster.gpus_per_node[j])
        if self.skewed(model):  # ceil(size / per) servers: whole empty ones, the last best fit
            whole = nodes[counts == per]
            need = math.ceil(size / per)
            if whole.size < need:
                return None
            return self._take(layout, whole[:need].tolist(), size, free)
        order = np.lexsort((nodes, -counts))  # as best_fit: emptiest servers first
        order = order[counts[order] > 0]
        return self._take(layout, nodes[order].tolist(), size, free)


#: Placement policies by name: each a factory taking its options as keywords.
PLACEMENT_POLICIES: dict[str, Any] = {"best_fit": BestFit, "packing": Packing, "scattered": Scattered,
                                      "consolidated": Consolidated}


def placement_policy(placement: Any) -> PlacementPolicy:
    """The placement policy ``placement`` names (with default options) or is."""
    if isinstance(placement, str):
        factory = PLACEMENT_POLICIES.get(placement)
        if factory is None:
            raise InvalidOptionError(f"unknown placement policy {placement!r}; known: "
                                     f"{', '.join(sorted(PLACEMENT_POLICIES))}")
        return factory()
    if isinstance(placement, PlacementPolicy):
        return placement
    raise InvalidOptionError(f"placement must be a name ({', '.join(sorted(PLACEMENT_POLICIES))}) or an object with "
                             f"a name and a place(...) method, got {placement!r}")


__all__ = ["PLACEMENT_POLICIES", "TIRESIAS_MODEL_SKEW", "BestFit", "Consolidated", "Packing", "PlacementPolicy",
           "PlacementResult", "Scattered", "placement_policy"]
