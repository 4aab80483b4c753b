"""The cluster: GPU types in a fixed order, their counts and node sizes."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from allocopt.errors import InvalidProblemError

DEFAULT_GPUS_PER_NODE = 8
#: Largest GPU count of a type (and GPUs per node) a Cluster accepts: 1,048,576 (a cluster's GPUs are
#: numbered one by one in placements and round plans).
MAX_COUNT = 2**20


class Cluster:
    """GPUs of each type, in a fixed type order.

    Parameters
    ----------
    gpus : mapping of str to int
        Number of GPUs of each type, e.g. ``{"v100": 36, "p100": 36, "k80": 36}``.
        The mapping's order is the GPU-type order of every array in allocopt.
    gpus_per_node : int or mapping of str to int, default 8
        GPUs per server, for all types or per type.

    Attributes
    ----------
    gpu_types : tuple of str
    capacity : ndarray of int of shape (n_gpu_types,)
        GPUs of each type.
    gpus_per_node : ndarray of int of shape (n_gpu_types,)
    """

    def __init__(self, gpus: Mapping[str, int],
                 gpus_per_node: int | Mapping[str, int] = DEFAULT_GPUS_PER_NODE):
        if not isinstance(gpus, Mapping) or not gpus:
            raise InvalidProblemError(
                "Cluster(gpus=...) needs a non-empty mapping of GPU type to GPU count, "
                "e.g. {'v100': 4, 'k80': 8}", field="gpus")
        self.gpu_types: tuple[str, ...] = tuple(str(t) for t in gpus)
        if len(set(self.gpu_types)) != len(self.gpu_types):
            raise InvalidProblemError(f"GPU type names must be distinct, got {list(gpus)}", field="gpus")
        self.capacity = self._counts(gpus, "gpus", allow_zero=True)
        if isinstance(gpus_per_node, Mapping):
            unknown = set(map(str, gpus_per_node)) - set(self.gpu_types)
            if unknown:
                raise InvalidProblemError(
                    f"gpus_per_node names unknown GPU type(s) {sorted(unknown)}; "
                    f"the cluster's types are {list(self.gpu_types)}", field="gpus_per_node")
            missing = [t for t in self.gpu_types if t not in gpus_per_node]
            if missing:
                raise InvalidProblemError(f"gpus_per_node has no entry for GPU type(s) {missing}",
                                          field="gpus_per_node")
            self.gpus_per_node = self._counts(gpus_per_node, "gpus_per_node", allow_zero=False)
        else:
            self.gpus_per_node = self._counts({t: gpus_per_node for t in self.gpu_types},
                                              "gpus_per_node", allow_zero=False)
        self.capacity.setflags(write=False)
        self.gpus_per_node.setflags(write=False)

    def _counts(self, mapping: Mapping, field: str, *, allow_zero: bool) -> np.ndarray:
        out = np.empty(len(self.gpu_types), dtype=np.int64)
        for j, t in enumerate(self.gpu_types):
            value = mapping[t]
            ok = isinstance(value, (int, np.integer)) or (isinstance(value, float) and value.is_integer())
            if not ok or isinstance(value, bool) or value < 0 or (value == 0 and not allow_zero) or value > MAX_COUNT:
                bound = "a non-negative" if allow_zero else "a positive"
                raise InvalidProblemError(f"{field}[{t!r}] must be {bound} integer up to {MAX_COUNT}, got {value!r}",
                                          field=field)
            out[j] = int(value)
        return out

    @property
    def num_gpu_types(self) -> int:
        """Number of GPU types."""
        return len(self.gpu_types)

    @property
    def num_nodes(self) -> np.ndarray:
        """Servers of each type (the last one may be partly filled)."""
        return -(-self.capacity // self.gpus_per_node)

    def index(self, gpu_type: str) -> int:
        """Position of ``gpu_type`` in :attr:`gpu_types`."""
        try:
            return self.gpu_types.index(gpu_type)
        except ValueError:
            raise InvalidProblemError(
                f"unknown GPU type {gpu_type!r}; the cluster's types are {list(self.gpu_types)}",
                field="gpu_type") from None

    def to_dict(self) -> dict:
        """``{"gpus": {type: count}, "gpus_per_node": {type: count}}`` (the problem document's ``cluster``)."""
        return {"gpus": dict(zip(self.gpu_types, self.capacity.tolist())),
                "gpus_per_node": dict(zip(self.gpu_types, self.gpus_per_node.tolist()))}

    @classmethod
    def from_dict(cls, data: Mapping) -> Cluster:
        """A cluster from :meth:`to_dict`'s form (``gpus_per_node`` optional); InvalidProblemError naming the field otherwise."""
        if not isinstance(data, Mapping) or "gpus" not in data:
            raise InvalidProblemError("a cluster must be an object with a 'gpus' field mapping "
                                      "GPU type to count", field="cluster")
        return cls(data["gpus"], data.get("gpus_per_node", DEFAULT_GPUS_PER_NODE))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Cluster) and self.gpu_types == other.gpu_types
                and np.array_equal(self.capacity, other.capacity)
                and np.array_equal(self.gpus_per_node, other.gpus_per_node))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        gpus = ", ".join(f"{t}={c}" for t, c in zip(self.gpu_types, self.capacity))
        return f"Cluster({gpus})"
