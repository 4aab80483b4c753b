"""Per-job columns of an :class:`~allocopt.Engine`, kept up to date one row at a time.

The engine's jobs live in numpy columns (throughputs per GPU type, scale
factor, weight, optional fields) in the order the jobs were added. Adding a
job appends a row (the columns grow geometrically), changing one rewrites its
row, removing one marks its row dead (dead rows are squeezed out once they
outnumber the live ones). A :class:`~allocopt.Problem` is then cut from the
columns with array operations only, whatever the number of jobs.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np

from allocopt.cluster import Cluster
from allocopt.problem import Problem

#: Optional numeric fields of a job (problem-document names) -> (Problem argument, value when unset
#: while another job sets it: None leaves the gap, which Problem reports as a missing value).
OPTIONAL_FIELDS: dict[str, tuple[str, float | None]] = {
    "num_steps_remaining": ("num_steps_remaining", None), "time_since_start_s": ("time_since_start", 0.0),
    "slo_s": ("slos", np.inf), "time_isolated_s": ("time_isolated", 0.0)}

_MIN_ROWS = 16


class JobTable:
    """Columns of the jobs of an engine, in the order they were added.

    Parameters
    ----------
    gpu_types : iterable of str
        The GPU types a job may give throughputs for (more with :meth:`add_gpu_type`).
    """

    def __init__(self, gpu_types: Iterable[str]):
        self._row: dict[Hashable, int] = {}
        self._used = 0  # rows written so far (live and dead)
        self._ids = np.empty(_MIN_ROWS, dtype=object)
        self._live = np.zeros(_MIN_ROWS, dtype=bool)
        self._scale = np.ones(_MIN_ROWS, dtype=np.int64)
        self._weight = np.ones(_MIN_ROWS)
        self._entity = np.empty(_MIN_ROWS, dtype=object)
        self._has_entity = np.zeros(_MIN_ROWS, dtype=bool)
        self._optional = {name: np.full(_MIN_ROWS, np.nan) for name in OPTIONAL_FIELDS}
        self._throughputs = {t: np.zeros(_MIN_ROWS) for t in gpu_types}

    def __len__(self) -> int:
        return len(self._row)

    def add_gpu_type(self, gpu_type: str) -> None:
        """A new type: every job has throughput 0 there."""
        self._throughputs.setdefault(gpu_type, np.zeros(self._ids.size))

    def set(self, job_id: Hashable, entry: Mapping[str, Any]) -> None:
        """Write ``job_id``'s row from its validated entry (a new job gets a row at the end)."""
        row = self._row.get(job_id)
        if row is None:
            if self._used == self._ids.size:
                self._resize(max(_MIN_ROWS, 2 * len(self._row)))
            row = self._row[job_id] = self._used
            self._used += 1
            self._ids[row], self._live[row] = job_id, True
        tput = entry["throughputs"]
        for gpu_type, column in self._throughputs.items():
            column[row] = tput.get(gpu_type, 0.0)
        self._scale[row] = int(entry.get("scale_factor", 1))
        self._weight[row] = float(entry.get("priority_weight", 1.0))
        for name, column in self._optional.items():
            value = entry.get(name)
            column[row] = np.nan if value is None else float(value)
        self._has_entity[row] = "entity" in entry
        self._entity[row] = entry.get("entity")

    def remove(self, job_id: Hashable) -> None:
        """Drop ``job_id``'s row."""
        row = self._row.pop(job_id)
        self._live[row] = False
        self._ids[row] = self._entity[row] = None
        if self._used - len(self._row) > max(len(self._row), _MIN_ROWS):
            self._resize(max(_MIN_ROWS, 2 * len(self._row)))

    def _resize(self, size: int) -> None:
        """Keep the live rows, in order, in columns of ``size`` rows."""
        keep = np.flatnonzero(self._live[:self._used])

        def moved(column: np.ndarray, fill: Any) -> np.ndarray:
            out = np.full(size, fill, dtype=column.dtype)
            out[:keep.size] = column[keep]
            return out

        self._ids, self._entity = moved(self._ids, None), moved(self._entity, None)
        self._live, self._has_entity = moved(self._live, False), moved(self._has_entity, False)
        self._scale, self._weight = moved(self._scale, 1), moved(self._weight, 1.0)
        self._optional = {name: moved(column, np.nan) for name, column in self._optional.items()}
        self._throughputs = {t: moved(column, 0.0) for t, column in self._throughputs.items()}
        self._row = dict(zip(self._ids[:keep.size].tolist(), range(keep.size)))
        self._used = keep.size

    def problem(self, cluster: Cluster) -> tuple[Problem, tuple[Hashable, ...]]:
        """The problem of the jobs that fit ``cluster`` now, and the ids of those that do not.

        A job fits when a GPU type with positive throughput has at least its
        ``scale_factor`` GPUs. An optional field given by some jobs only is
        filled as a problem document leaves it (``OPTIONAL_FIELDS``).
        """
        live = np.flatnonzero(self._live[:self._used])
        T = np.column_stack([self._throughputs[t][live] for t in cluster.gpu_types]
                            ).reshape(live.size, cluster.num_gpu_types)
        scale = self._scale[live]
        fits = ((T > 0) & (scale[:, None] <= cluster.capacity[None, :])).any(axis=1)
        rows = live[fits]
        optional: dict[str, Any] = {}
        for name, (argument, fill) in OPTIONAL_FIELDS.items():
            values = self._optional[name][rows]
            unset = np.isnan(values)
            if rows.size and not unset.all():
                optional[argument] = values if fill is None else np.where(unset, fill, values)
        entities = self._entity[rows].tolist() if self._has_entity[rows].any() else None
        problem = Problem(T[fits], cluster, job_ids=self._ids[rows].tolist(), scale_factors=scale[fits],
                          priority_weights=self._weight[rows], entities=entities, **optional)
        return problem, tuple(self._ids[live[~fits]].tolist())


__all__ = ["JobTable", "OPTIONAL_FIELDS"]
