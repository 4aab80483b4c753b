"""Time-varying capacity: servers or GPUs joining and leaving the cluster over a simulation.

A capacity event adds GPUs of a type to the cluster or removes them, at a time
(seconds from the start of the workload). :func:`allocopt.simulate` with
``capacity_events=`` starts from its ``cluster`` and applies each event at the
first round that starts at or after its time: the planner sees the new cluster
from that round on, and the allocation is recomputed then (whatever the
recompute throttle). GPU ids are numbered type by type, server by server
(:class:`~allocopt.mechanism.placement.GpuLayout`): GPUs that join get the next
ids of their type (new servers after the last one), and GPUs that leave are the
type's last ones (its highest-numbered servers first). A job holding a GPU that
leaves is preempted at that round boundary: as for any job moved between rounds,
it keeps every step it made (rounds end at checkpoints), is placed anew where the
mechanism gives it GPUs, and pays ``restart_overhead_s`` there. A job that no
GPU type of the current cluster can run waits until one can.

Events come as a CSV file (header ``time_s,gpu_type`` and one or both of
``gpus`` and ``servers``; each line sets one of them to a signed whole number,
``servers`` counting the type's ``gpus_per_node``) or as a list of mappings
with the same keys. Errors name the file, line and column.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import Any

import numpy as np

from allocopt.cluster import MAX_COUNT, Cluster
from allocopt.documents import read_text
from allocopt.mechanism.placement import GpuLayout
from allocopt.mechanism.workload import TraceError

#: Columns of a capacity-events CSV file: ``time_s``, ``gpu_type`` and at least one of ``gpus``, ``servers``.
CAPACITY_COLUMNS: tuple[str, ...] = ("time_s", "gpu_type", "gpus", "servers")


class CapacityEventError(TraceError):
    """A capacity event is malformed, names an unknown GPU type, or takes a type below 0 GPUs; the message
    names the file (or event) and line, ``field`` the column."""


@dataclass(frozen=True)
class CapacitySchedule:
    """The cluster over time: each change time and the GPUs of each type from then on.

    Attributes
    ----------
    base : Cluster
        The cluster at time 0 (before any event).
    times_s : ndarray of shape (k,)
        Distinct event times, seconds, increasing.
    capacity : ndarray of int of shape (k, n_gpu_types)
        GPUs of each type from ``times_s[i]`` on.
    source : str
    """

    base: Cluster
    times_s: np.ndarray
    capacity: np.ndarray
    source: str = ""

    def cluster(self, k: int) -> Cluster:
        """The cluster after the first ``k`` changes (``k = 0``: :attr:`base`)."""
        if k == 0:
            return self.base
        counts = dict(zip(self.base.gpu_types, self.capacity[k - 1].tolist()))
        return Cluster(counts, dict(zip(self.base.gpu_types, self.base.gpus_per_node.tolist())))

    @property
    def peak(self) -> Cluster:
        """Each type's largest count over the schedule (the cluster every job must fit somewhere in)."""
        most = np.maximum(self.base.capacity, self.capacity.max(axis=0)) if self.times_s.size else self.base.capacity
        return Cluster(dict(zip(self.base.gpu_types, most.tolist())),
                       dict(zip(self.base.gpu_types, self.base.gpus_per_node.tolist())))

    def gpu_seconds(self, end_s: float) -> float:
        """GPU-seconds the cluster offers from 0 to ``end_s``."""
        bounds = np.concatenate([[0.0], np.minimum(self.times_s, end_s), [end_s]])
        totals = np.concatenate([[self.base.capacity.sum()], self.capacity.sum(axis=1)]).astype(np.float64)
        return float((np.maximum(np.diff(bounds), 0.0) * totals).sum())

    def to_dict(self) -> dict[str, Any]:
        """``{"source": ..., "changes": [{"time_s": t, "gpus": {type: count}}, ...]}`` (GPUs from each time on)."""
        return {"source": self.source,
                "changes": [{"time_s": float(t), "gpus": dict(zip(self.base.gpu_types, row))}
                            for t, row in zip(self.times_s.tolist(), self.capacity.tolist())]}


def _integer(value: Any, where: str, line: int | None, column: str) -> int:
    if isinstance(value, bool):
        raise CapacityEventError(f"{where}: {column} is {value!r}, not a whole number", line=line, field=column)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise CapacityEventError(f"{where}: {column} is {value!r}, not a whole number", line=line,
                                 field=column) from None
    if not (math.isfinite(number) and number == int(number) and abs(number) <= MAX_COUNT):
        raise CapacityEventError(f"{where}: {column} is {value!r}; it must be a signed whole number of at most "
                                 f"{MAX_COUNT}", line=line, field=column)
    if number == 0:
        raise CapacityEventError(f"{where}: {column} is 0; an event adds (+N) or removes (-N) GPUs or servers",
                                 line=line, field=column)
    return int(number)


def _schedule(entries: Sequence[tuple[int | None, str, Mapping[str, Any]]], cluster: Cluster,
              source: str) -> CapacitySchedule:
    """Events ``(line, where, fields)`` checked against ``cluster`` into a schedule."""
    times, types, deltas, units, lines = [], [], [], [], []
    for line, where, entry in entries:
        unknown = sorted(set(map(str, entry)) - set(CAPACITY_COLUMNS))
        if unknown:
            raise CapacityEventError(f"{where}: unknown field(s) {unknown}; an event has "
                                     f"{', '.join(CAPACITY_COLUMNS)}", line=line, field=unknown[0])
        for key in ("time_s", "gpu_type"):
            if entry.get(key) is None or (isinstance(entry[key], str) and not entry[key].strip()):
                raise CapacityEventError(f"{where}: {key} is missing", line=line, field=key)
        raw_time = entry["time_s"]
        try:
            time_s = float(raw_time) if not isinstance(raw_time, bool) else math.nan
        except (TypeError, ValueError):
            time_s = math.nan
        if not (math.isfinite(time_s) and time_s >= 0):
            raise CapacityEventError(f"{where}: time_s is {raw_time!r}; it must be a finite number of seconds >= 0",
                                     line=line, field="time_s")
        gpu_type = str(entry["gpu_type"]).strip()
        if gpu_type not in cluster.gpu_types:
            raise CapacityEventError(f"{where}: gpu_type {gpu_type!r} is not a GPU type of the cluster "
                                     f"{list(cluster.gpu_types)}", line=line, field="gpu_type")
        j = cluster.gpu_types.index(gpu_type)
        given = [k for k in ("gpus", "servers") if entry.get(k) is not None
                 and not (isinstance(entry[k], str) and not entry[k].strip())]
        if len(given) != 1:
            raise CapacityEventError(f"{where}: give exactly one of gpus and servers (a signed change), got "
                                     f"{given or 'neither'}", line=line, field="gpus")
        delta = _integer(entry[given[0]], where, line, given[0])
        if given[0] == "servers":
            delta *= int(cluster.gpus_per_node[j])
        times.append(time_s)
        types.append(j)
        deltas.append(delta)
        units.append(given[0])
        lines.append((line, where))
    order = np.argsort(np.array(times, dtype=np.float64), kind="stable")
    counts = cluster.capacity.astype(np.int64).copy()
    change_times: list[float] = []
    rows: list[np.ndarray] = []
    for k in order.tolist():
        j = types[k]
        counts[j] += deltas[k]
        line, where = lines[k]
        if counts[j] < 0 or counts[j] > MAX_COUNT:
            raise CapacityEventError(f"{where}: at {times[k]:g} s this event leaves {cluster.gpu_types[j]} with "
                                     f"{int(counts[j])} GPUs; a type holds 0 to {MAX_COUNT}", line=line,
                                     field=units[k])
        if change_times and change_times[-1] == times[k]:
            rows[-1] = counts.copy()
        else:
            change_times.append(times[k])
            rows.append(counts.copy())
    capacity = np.array(rows, dtype=np.int64).reshape(len(rows), cluster.num_gpu_types)
    return CapacitySchedule(cluster, np.array(change_times, dtype=np.float64), capacity, source)


def read_capacity_events(path: str | PathLike[str], cluster: Cluster) -> CapacitySchedule:
    """A capacity-events CSV file (see the module) checked against ``cluster`` (the cluster at time 0).

    Raises
    ------
    CapacityEventError
        A missing or unknown column, a malformed number, an unknown GPU type, or a change that leaves a
        type below 0 GPUs; the message starts with ``path:line:``.
    DataFileError
        A file that cannot be read, or is not UTF-8.
    """
    name = str(path)
    text = read_text(path, what="the capacity events")
    numbered = [(k + 1, row) for k, row in enumerate(csv.reader(io.StringIO(text))) if any(c.strip() for c in row)]
    if not numbered:
        raise CapacityEventError(f"{name}: no capacity event given", field="time_s")
    head_line, header = numbered[0][0], [c.strip() for c in numbered[0][1]]
    missing = [c for c in ("time_s", "gpu_type") if c not in header] or (
        [] if {"gpus", "servers"} & set(header) else ["gpus"])
    if missing or set(header) - set(CAPACITY_COLUMNS) or len(set(header)) != len(header):
        raise CapacityEventError(f"{name}:{head_line}: the header must name time_s, gpu_type and gpus and/or "
                                 f"servers, each once, got {','.join(header)!r}", line=head_line,
                                 field=(missing or ["columns"])[0])
    entries = []
    for line, values in numbered[1:]:
        if len(values) != len(header):
            raise CapacityEventError(f"{name}:{line}: {len(values)} comma-separated columns, expected "
                                     f"{len(header)}: {', '.join(header)}", line=line, field="columns")
        entries.append((line, f"{name}:{line}", dict(zip(header, (v.strip() for v in values)))))
    if not entries:
        raise CapacityEventError(f"{name}: no capacity event given", field="time_s")
    return _schedule(entries, cluster, name)


def capacity_schedule(events: CapacitySchedule | Sequence[Mapping[str, Any]] | str | PathLike[str],
                      cluster: Cluster) -> CapacitySchedule:
    """The schedule of ``events``: a :class:`CapacitySchedule`, a CSV file, or a list of mappings
    (``{"time_s": 3600, "gpu_type": "v100", "servers": -2}``; errors name ``event K``, 1-based)."""
    if isinstance(events, CapacitySchedule):
        if events.base != cluster:
            raise CapacityEventError(f"the schedule starts from {events.base}, the simulation from {cluster}",
                                     field="cluster")
        return events
    if isinstance(events, (str, PathLike)):
        return read_capacity_events(events, cluster)
    entries = []
    for k, entry in enumerate(events, start=1):
        if not isinstance(entry, Mapping):
            raise CapacityEventError(f"capacity event {k}: expected a mapping of time_s, gpu_type and gpus or "
                                     f"servers, got {entry!r}", line=k, field="event")
        entries.append((k, f"capacity event {k}", entry))
    if not entries:
        raise CapacityEventError("no capacity event given", field="time_s")
    return _schedule(entries, cluster, "capacity events")


def remap_held(old: GpuLayout, new: GpuLayout, held_ids: np.ndarray, held_start: np.ndarray,
               held_count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Last round's GPUs, renumbered for a new layout of the same types.

    A GPU keeps its place within its type (type offset); GPUs beyond the new count are gone.

    Parameters
    ----------
    old, new : GpuLayout
    held_ids : ndarray of int
        GPU ids held, concatenated (ids of ``old``).
    held_start, held_count : ndarray of int of shape (n_jobs,)
        Job ``i`` held ``held_ids[held_start[i]:held_start[i] + held_count[i]]`` (count 0: none).

    Returns
    -------
    ids : ndarray of int
        ``held_ids`` in ``new``'s numbering (-1 where the GPU left).
    lost : ndarray of bool of shape (n_jobs,)
        Jobs that held a GPU that left (they are preempted).
    """
    held_ids = np.asarray(held_ids, dtype=np.int64)
    valid = held_ids >= 0
    types = old.gpu_type[np.where(valid, held_ids, 0)]
    offset = held_ids - old.type_start[types]
    present = valid & (offset < new.cluster.capacity[types])
    ids = np.where(present, new.type_start[types] + offset, -1)
    jobs = np.flatnonzero(held_count > 0)
    counts = held_count[jobs]
    within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    positions = np.repeat(held_start[jobs], counts) + within
    lost = np.zeros(held_count.size, dtype=bool)
    gone = np.bincount(np.repeat(np.arange(jobs.size), counts), ~present[positions], minlength=jobs.size) > 0
    lost[jobs[gone]] = True
    return ids, lost


__all__ = ["CAPACITY_COLUMNS", "CapacityEventError", "CapacitySchedule", "capacity_schedule",
           "read_capacity_events", "remap_held"]
