"""Readers of public GPU-cluster traces: Philly, Helios, Alibaba PAI 2020 and Tiresias's job lists.

Each reader turns a trace into a :class:`TraceWorkload`: a
:class:`~allocopt.mechanism.workload.Workload` for :func:`allocopt.simulate`, the
throughput table its jobs run at, and the count of trace rows left out by each
documented rule. The conversion rules are the same for every trace:

- **Arrival**: the job's submission time, in seconds after the first submission
  of the jobs kept.
- **GPUs**: the job's GPU count (Philly: the GPUs its last attempt held; PAI:
  the sum over its tasks of ``inst_num * plan_gpu / 100``, rounded up).
- **Model and steps**: the traces record run times, not models. A job's model is
  the trace's name for it where it has one (Tiresias's ``model_name``), else the
  trace's name (``philly``, ``helios``, ``pai``); its steps are its run time in
  seconds, and :attr:`TraceWorkload.throughputs` runs every job at one step per
  second on every GPU type, so that a job alone on its GPUs runs exactly as long
  as it ran in the trace. :meth:`TraceWorkload.with_models` instead gives each
  job a measured model (e.g. Gavel's), drawn at random among those that run at
  its GPU count, with steps = run time x that model's steps/s on a reference
  type: the run times are kept on that type and the others follow the
  measured speeds.
- **Run time**: Philly, the last attempt's end minus its start (earlier attempts
  were lost to failures); Helios, the ``duration`` column; PAI, the job's end
  minus the earliest start of its tasks; Tiresias, ``duration``.
- **Rows left out** (each counted in :attr:`TraceWorkload.skipped` and logged,
  never silently): jobs that use no GPU (``"no GPU"``), jobs that ran less than
  half a second or have no recorded start or end (``"no run time"``), PAI jobs
  absent from the task table (``"no task"``), and jobs whose status is not in
  ``statuses`` when given (``"status"``). Run times are rounded to whole seconds.
- **Tenant**: the job's virtual cluster (Philly's and Helios' ``vc``) or user
  (PAI's ``user``; ``tenant_field="user"`` picks Helios' and Philly's users),
  in ``Workload.tenants`` for :mod:`allocopt.mechanism.tenants`; a job whose row
  has none gets the tenant :data:`NO_TENANT`. Tiresias's job files name none.
- **Columns dropped**: the user or virtual cluster not chosen as tenant, CPU and
  memory requests, node counts, GPU ids and servers, queueing times (the simulator
  makes its own), PAI's ``gpu_type`` (the table gives each job the same speed on
  every type).

Malformed input raises :class:`~allocopt.mechanism.workload.TraceError` naming
the file, the line and the column (``field``); files that cannot be read or are
not UTF-8 raise :class:`~allocopt.errors.DataFileError`.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from os import PathLike
from typing import Any

import numpy as np

from allocopt.documents import read_text
from allocopt.errors import InvalidOptionError
from allocopt.mechanism.workload import (
    MAX_TRACE_SCALE,
    MAX_TRACE_STEPS,
    TraceError,
    Workload,
)
from allocopt.throughput.table import ThroughputTable

logger = logging.getLogger(__name__)

#: Columns of Helios's ``cluster_log.csv`` (S-Lab-System-Group/HeliosData).
HELIOS_COLUMNS: tuple[str, ...] = ("job_id", "user", "vc", "gpu_num", "cpu_num", "node_num", "state",
                                   "submit_time", "start_time", "end_time", "duration", "queue")
#: Columns of Alibaba PAI 2020's ``pai_job_table`` (alibaba/clusterdata, cluster-trace-gpu-v2020).
PAI_JOB_COLUMNS: tuple[str, ...] = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
#: Columns of Alibaba PAI 2020's ``pai_task_table``.
PAI_TASK_COLUMNS: tuple[str, ...] = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time",
                                     "plan_cpu", "plan_mem", "plan_gpu", "gpu_type")
#: Columns of Tiresias's simulator job files (SymbioticLab/Tiresias, ``simulator/*_job.csv``) it reads.
TIRESIAS_COLUMNS: tuple[str, ...] = ("job_id", "num_gpu", "submit_time", "duration")

_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
#: Tenant of a job whose trace row names no user or virtual cluster.
NO_TENANT = "none"
#: Columns a trace's tenant may come from (``tenant_field``; None: the jobs get no tenant).
TENANT_FIELDS = ("vc", "user")


@dataclass(frozen=True)
class TraceWorkload:
    """A converted trace.

    Attributes
    ----------
    workload : Workload
        The jobs kept, in arrival order; ``lines`` holds each job's line in the file.
    throughputs : ThroughputTable
        Steps/s of each job's (model, GPUs) on each GPU type: 1.0 everywhere, so steps are seconds.
    skipped : dict of str to int
        Rows of the trace left out, by rule (``"no GPU"``, ``"no run time"``, ``"status"``).
    job_ids : tuple of str
        The trace's id of each kept job, in ``workload`` order.
    """

    workload: Workload
    throughputs: ThroughputTable
    skipped: dict[str, int] = field(default_factory=dict)
    job_ids: tuple[str, ...] = ()

    def with_models(self, table: ThroughputTable, *, reference_gpu_type: str, seed: int = 0) -> TraceWorkload:
        """The same jobs as measured models of ``table``: each job's model is drawn (seeded, uniformly)
        among the table's models with an entry at its GPU count that runs on ``reference_gpu_type``, and
        its steps are its run time times that entry's steps/s there (at least 1).

        Raises
        ------
        TraceError
            A job whose GPU count no model of the table runs at on ``reference_gpu_type``.
        """
        if reference_gpu_type not in table.gpu_types:
            raise TraceError(f"reference_gpu_type {reference_gpu_type!r} is not a GPU type of the table "
                             f"{list(table.gpu_types)}", field="reference_gpu_type")
        column = table.gpu_types.index(reference_gpu_type)
        by_scale: dict[int, list[tuple[str, float]]] = {}
        for (model, scale), rate in zip(table.entries, table.throughputs_steps_per_s[:, column].tolist()):
            if rate > 0:
                by_scale.setdefault(scale, []).append((model, rate))
        wl = self.workload
        rng = np.random.default_rng(seed)
        draws = rng.random(wl.num_jobs)
        models, steps = [], np.empty(wl.num_jobs, dtype=np.int64)
        for k, scale in enumerate(wl.scale_factors.tolist()):
            choices = by_scale.get(scale)
            if not choices:
                raise TraceError(f"{wl._where(k)}: no model of the table runs on {scale} {reference_gpu_type} "
                                 f"GPUs (scale factors there: {sorted(by_scale)})", line=wl._line(k),
                                 field="gpus")
            model, rate = choices[int(draws[k] * len(choices))]
            models.append(model)
            steps[k] = max(1, int(wl.total_steps[k] * rate))
        workload = Workload(tuple(models), wl.scale_factors, steps, wl.arrival_s, wl.priority_weights, wl.source,
                            wl.lines, wl.tenants)
        return TraceWorkload(workload, table, dict(self.skipped), self.job_ids)


def unit_throughputs(workload: Workload, gpu_types: Sequence[str]) -> ThroughputTable:
    """One step per second on every type of ``gpu_types`` for each (model, GPUs) of ``workload``."""
    entries = sorted(set(workload.jobs()))
    return ThroughputTable(entries, list(gpu_types), np.ones((len(entries), len(gpu_types))))


class _Rows:
    """Typed access to one CSV row: errors name the file, line and column."""

    def __init__(self, path: str, line: int, values: Mapping[str, str]):
        self.path, self.line, self.values = path, line, values

    def error(self, column: str, message: str) -> TraceError:
        return TraceError(f"{self.path}:{self.line}: column {column}: {message}", line=self.line, field=column)

    def text(self, column: str) -> str:
        return self.values[column].strip()

    def number(self, column: str, *, minimum: float = 0.0, maximum: float = float(MAX_TRACE_STEPS)) -> float:
        raw = self.values[column].strip()
        try:
            value = float(raw)
        except ValueError:
            raise self.error(column, f"{raw!r} is not a number") from None
        if not math.isfinite(value) or not minimum <= value <= maximum:
            raise self.error(column, f"{raw!r} must be a finite number in [{minimum:g}, {maximum:g}]")
        return value

    def integer(self, column: str, *, maximum: int = MAX_TRACE_STEPS) -> int:
        value = self.number(column, maximum=maximum)
        if value != int(value):
            raise self.error(column, f"{self.values[column].strip()!r} is not a whole number")
        return int(value)

    def timestamp(self, column: str) -> float | None:
        """Seconds since the epoch of a ``YYYY-MM-DD HH:MM:SS`` time (None: empty or ``None``)."""
        raw = self.values[column].strip()
        if raw in ("", "None", "NULL", "null"):
            return None
        try:
            return datetime.strptime(raw, _TIME_FORMAT).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            raise self.error(column, f"{raw!r} is not a time {_TIME_FORMAT!r}") from None


def _csv_rows(path: str | PathLike[str], columns: Sequence[str], *, header: bool | None) -> Iterable[_Rows]:
    """Rows of a CSV file with ``columns`` (``header``: True, it has a header line naming them; False, it
    has none; None, either). Blank lines are skipped."""
    name = str(path)
    text = read_text(path, what="the trace")
    lines = text.split("\n")
    start, names = 0, list(columns)
    first = next((k for k, raw in enumerate(lines) if raw.strip()), None)
    if first is None:
        raise TraceError(f"{name}: no jobs in the trace", field="trace")
    head = [c.strip() for c in next(csv.reader([lines[first].rstrip("\r")]))]
    if header or (header is None and set(columns) <= set(head)):
        missing = [c for c in columns if c not in head]
        if missing:
            raise TraceError(f"{name}:{first + 1}: the header lacks column(s) {', '.join(missing)}; expected "
                             f"{', '.join(columns)}", line=first + 1, field=missing[0])
        names, start = head, first + 1
    for number in range(start, len(lines)):
        raw = lines[number].rstrip("\r")
        if not raw.strip():
            continue
        try:
            fields = next(csv.reader([raw]))
        except csv.Error as err:
            raise TraceError(f"{name}:{number + 1}: not a CSV line: {err}", line=number + 1, field="line") from None
        if len(fields) != len(names):
            raise TraceError(f"{name}:{number + 1}: {len(fields)} comma-separated columns, expected {len(names)}: "
                             f"{', '.join(names)}", line=number + 1, field="columns")
        yield _Rows(name, number + 1, dict(zip(names, fields)))


class _Collector:
    """Jobs kept and rows skipped while reading a trace."""

    def __init__(self, trace: str, source: str):
        self.trace, self.source = trace, source
        self.models: list[str] = []
        self.gpus: list[int] = []
        self.seconds: list[int] = []
        self.submit: list[float] = []
        self.lines: list[int] = []
        self.ids: list[str] = []
        self.tenants: list[str] = []
        self.skipped: dict[str, int] = {}

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def add(self, job_id: str, model: str, gpus: int, run_s: float, submit_s: float, line: int,
            tenant: str | None = None) -> None:
        if gpus <= 0:
            self.skip("no GPU")
            return
        if not run_s >= 0.5:
            self.skip("no run time")
            return
        self.ids.append(job_id)
        self.models.append(model)
        self.gpus.append(gpus)
        self.seconds.append(round(run_s))
        self.submit.append(submit_s)
        self.lines.append(line)
        if tenant is not None:
            self.tenants.append(tenant.strip() or NO_TENANT)

    def result(self, gpu_types: Sequence[str]) -> TraceWorkload:
        if not self.models:
            raise TraceError(f"{self.source}: no job of the trace is kept (rows left out: {self.skipped or 'none'})",
                             field="trace")
        if self.skipped:
            logger.info("%s: left out %s", self.source, ", ".join(f"{n} row(s): {r}" for r, n in self.skipped.items()))
        submit = np.array(self.submit)
        order = np.argsort(submit, kind="stable")
        arrival = (submit - submit.min())[order]
        workload = Workload(tuple(np.array(self.models, dtype=object)[order].tolist()),
                            np.array(self.gpus, dtype=np.int64)[order], np.array(self.seconds, dtype=np.int64)[order],
                            arrival, np.ones(len(self.models)), self.source, np.array(self.lines)[order],
                            tuple(np.array(self.tenants, dtype=object)[order].tolist()) if self.tenants else None)
        return TraceWorkload(workload, unit_throughputs(workload, gpu_types), dict(self.skipped),
                             tuple(np.array(self.ids, dtype=object)[order].tolist()))


def _check_statuses(statuses: Iterable[str] | None) -> frozenset[str] | None:
    return None if statuses is None else frozenset(statuses)


def read_tiresias_trace(path: str | PathLike[str], gpu_types: Sequence[str] = ("gpu",)) -> TraceWorkload:
    """A job file of Tiresias's simulator (``job_id,num_gpu,submit_time,iterations,model_name,duration,
    interval``; ``iterations`` and ``interval`` are not used, ``model_name`` names the model when present).

    Parameters
    ----------
    path : path-like
    gpu_types : sequence of str, default ("gpu",)
        GPU types of the throughput table (Tiresias's clusters have one).
    """
    jobs = _Collector("tiresias", str(path))
    for row in _csv_rows(path, TIRESIAS_COLUMNS, header=True):
        model = row.text("model_name") if "model_name" in row.values and row.text("model_name") else "tiresias"
        jobs.add(row.text("job_id"), model, row.integer("num_gpu", maximum=MAX_TRACE_SCALE),
                 row.number("duration"), row.number("submit_time"), row.line)
    return jobs.result(gpu_types)


def read_helios_trace(path: str | PathLike[str], gpu_types: Sequence[str] = ("gpu",), *,
                      statuses: Iterable[str] | None = None, tenant_field: str | None = "vc") -> TraceWorkload:
    """A Helios cluster's ``cluster_log.csv`` (:data:`HELIOS_COLUMNS`; Hu et al., SC '21).

    Parameters
    ----------
    path : path-like
    gpu_types : sequence of str, default ("gpu",)
    statuses : iterable of str, optional
        Keep only jobs whose ``state`` is one of these (e.g. ``{"COMPLETED"}``); default: every job.
    tenant_field : {"vc", "user"} or None, default "vc"
        The column each job's tenant comes from (None: no tenants).
    """
    keep = _check_statuses(statuses)
    _check_tenant_field(tenant_field, TENANT_FIELDS)
    jobs = _Collector("helios", str(path))
    for row in _csv_rows(path, HELIOS_COLUMNS, header=None):
        gpus = row.integer("gpu_num", maximum=MAX_TRACE_SCALE)
        submit = row.timestamp("submit_time")
        if submit is None:
            raise row.error("submit_time", "missing")
        run_s = row.number("duration")
        if keep is not None and row.text("state") not in keep:
            jobs.skip("status")
            continue
        jobs.add(row.text("job_id"), "helios", gpus, run_s, submit, row.line,
                 row.text(tenant_field) if tenant_field else None)
    return jobs.result(gpu_types)


def read_pai_trace(job_table: str | PathLike[str], task_table: str | PathLike[str],
                   gpu_types: Sequence[str] = ("gpu",), *, statuses: Iterable[str] | None = None,
                   tenant_field: str | None = "user") -> TraceWorkload:
    """Alibaba PAI 2020's ``pai_job_table`` with its ``pai_task_table`` (Weng et al., NSDI '22).

    The job table gives each job its submission (``start_time``) and end; the task
    table its GPUs (``inst_num * plan_gpu / 100`` summed over its tasks, rounded
    up) and its launch (the earliest task ``start_time``). Both files may come
    with or without their header line (the trace ships headers apart).

    Parameters
    ----------
    job_table, task_table : path-like
    gpu_types : sequence of str, default ("gpu",)
    statuses : iterable of str, optional
        Keep only jobs whose ``status`` is one of these (``{"Terminated"}``: the successful ones).
    tenant_field : {"user"} or None, default "user"
        The column each job's tenant comes from (None: no tenants).
    """
    keep = _check_statuses(statuses)
    _check_tenant_field(tenant_field, ("user",))
    gpu_percent: dict[str, float] = {}
    launch: dict[str, float] = {}
    for row in _csv_rows(task_table, PAI_TASK_COLUMNS, header=None):
        job = row.text("job_name")
        instances = row.number("inst_num", maximum=float(MAX_TRACE_SCALE))
        plan = row.number("plan_gpu", maximum=100.0 * MAX_TRACE_SCALE) if row.text("plan_gpu") else 0.0
        gpu_percent[job] = gpu_percent.get(job, 0.0) + instances * plan
        if row.text("start_time"):
            start = row.number("start_time")
            launch[job] = min(launch.get(job, start), start)
    jobs = _Collector("pai", str(job_table))
    for row in _csv_rows(job_table, PAI_JOB_COLUMNS, header=None):
        job = row.text("job_name")
        submit = row.number("start_time")
        end = row.number("end_time") if row.text("end_time") else None
        if keep is not None and row.text("status") not in keep:
            jobs.skip("status")
            continue
        if job not in gpu_percent:
            jobs.skip("no task")
            continue
        gpus = math.ceil(round(gpu_percent[job], 6) / 100.0)
        begin = launch.get(job)
        run_s = end - begin if end is not None and begin is not None else 0.0
        jobs.add(row.text("inst_id") or job, "pai", min(gpus, MAX_TRACE_SCALE), run_s, submit, row.line,
                 row.text(tenant_field) if tenant_field else None)
    return jobs.result(gpu_types)


def read_philly_trace(path: str | PathLike[str], gpu_types: Sequence[str] = ("gpu",), *,
                      statuses: Iterable[str] | None = None, tenant_field: str | None = "vc") -> TraceWorkload:
    """Philly's ``cluster_job_log`` (a JSON list of jobs; msr-fiddle/philly-traces, Jeon et al., ATC '19).

    Each job's GPUs are those its last attempt held (the ``gpus`` of every server
    in its ``detail``) and its run time that attempt's end minus its start; a job
    with no attempt, or whose last attempt has no start or end (``null``, empty or
    ``"None"``, as the trace writes it: still running when the log was taken, or
    not logged), is counted under ``"no run time"``.

    Parameters
    ----------
    path : path-like
    gpu_types : sequence of str, default ("gpu",)
    statuses : iterable of str, optional
        Keep only jobs whose ``status`` is one of these (``Pass``, ``Killed``, ``Failed``).
    tenant_field : {"vc", "user"} or None, default "vc"
        The field each job's tenant comes from (None: no tenants); a string, or null or absent
        (tenant :data:`NO_TENANT`).
    """
    _check_tenant_field(tenant_field, TENANT_FIELDS)
    name = str(path)
    text = read_text(path, what="the trace")
    keep = _check_statuses(statuses)
    jobs = _Collector("philly", name)
    for line, entry in _json_list(text, name):
        def error(key: str, message: str, line: int = line) -> TraceError:
            return TraceError(f"{name}:{line}: field {key}: {message}", line=line, field=key)

        if not isinstance(entry, Mapping):
            raise error("job", f"each job must be a JSON object, got {type(entry).__name__}")
        for key in ("jobid", "status", "submitted_time", "attempts"):
            if key not in entry:
                raise error(key, "missing")
        submitted = _philly_time(entry["submitted_time"], error, "submitted_time")
        if submitted is None:
            raise error("submitted_time", "missing")
        attempts = entry["attempts"]
        if not isinstance(attempts, list):
            raise error("attempts", f"must be a list, got {type(attempts).__name__}")
        if keep is not None and entry["status"] not in keep:
            jobs.skip("status")
            continue
        if not attempts:
            jobs.skip("no run time")
            continue
        last = attempts[-1]
        if not isinstance(last, Mapping) or not isinstance(last.get("detail", []), list):
            raise error("attempts", "each attempt must be an object with a 'detail' list")
        gpus = 0
        for server in last.get("detail", []):
            if not isinstance(server, Mapping) or not isinstance(server.get("gpus"), list):
                raise error("detail", "each server of an attempt must be an object with a 'gpus' list")
            gpus += len(server["gpus"])
        start = _philly_time(last.get("start_time"), error, "start_time")
        end = _philly_time(last.get("end_time"), error, "end_time")
        run_s = end - start if start is not None and end is not None else 0.0
        tenant = None
        if tenant_field:
            tenant = entry.get(tenant_field)
            if tenant is not None and not isinstance(tenant, str):
                raise error(tenant_field, f"must be a string or null, got {tenant!r}")
            tenant = tenant or NO_TENANT
        jobs.add(str(entry["jobid"]), "philly", min(gpus, MAX_TRACE_SCALE), run_s, submitted, line, tenant)
    return jobs.result(gpu_types)


def _check_tenant_field(tenant_field: str | None, allowed: Sequence[str]) -> None:
    if tenant_field is not None and tenant_field not in allowed:
        raise InvalidOptionError(f"tenant_field must be one of {list(allowed)} or None, got {tenant_field!r}")


def _philly_time(value: Any, error: Callable[[str, str], TraceError], key: str) -> float | None:
    if value is None or value in ("", "None"):  # the trace writes a missing time as "None" (its notebook's rule)
        return None
    if not isinstance(value, str):
        raise error(key, f"must be a time {_TIME_FORMAT!r} or null, got {value!r}")
    try:
        return datetime.strptime(value, _TIME_FORMAT).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        raise error(key, f"{value!r} is not a time {_TIME_FORMAT!r}") from None


def _json_list(text: str, name: str) -> Iterable[tuple[int, Any]]:
    """The elements of the JSON list in ``text``, each with the line it starts on."""
    decoder = json.JSONDecoder()

    def syntax(err: json.JSONDecodeError) -> TraceError:
        return TraceError(f"{name}:{err.lineno}: invalid JSON at column {err.colno}: {err.msg}", line=err.lineno,
                          field="json")

    pos = _skip_space(text, 0)
    if not text.startswith("[", pos):
        line = text.count("\n", 0, pos) + 1
        raise TraceError(f"{name}:{line}: expected a JSON list of jobs", line=line, field="json")
    pos = _skip_space(text, pos + 1)
    if text.startswith("]", pos):
        return
    while True:
        line = text.count("\n", 0, pos) + 1
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise syntax(err) from None
        except RecursionError:
            raise TraceError(f"{name}:{line}: JSON nested too deeply", line=line, field="json") from None
        yield line, value
        pos = _skip_space(text, pos)
        if text.startswith("]", pos):
            if text[_skip_space(text, pos + 1):].strip():
                end = text.count("\n", 0, pos) + 1
                raise TraceError(f"{name}:{end}: text after the list of jobs", line=end, field="json")
            return
        if not text.startswith(",", pos):
            raise syntax(json.JSONDecodeError("expected ',' or ']' between jobs", text, pos))
        pos = _skip_space(text, pos + 1)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


#: Public trace formats :func:`read_trace` reads.
TRACE_FORMATS = ("philly", "helios", "pai", "tiresias")


def read_trace(path: str | PathLike[str], trace_format: str, gpu_types: Sequence[str] = ("gpu",), *,
               task_table: str | PathLike[str] | None = None) -> TraceWorkload:
    """A public trace of ``trace_format`` (one of :data:`TRACE_FORMATS`) by its reader.

    ``path`` is the job file (PAI: ``pai_job_table``, with ``task_table`` its ``pai_task_table``).

    Raises
    ------
    InvalidOptionError
        An unknown format, or ``task_table`` missing for PAI or given for another format.
    """
    if trace_format not in TRACE_FORMATS:
        raise InvalidOptionError(f"unknown trace format {trace_format!r}; formats: {', '.join(TRACE_FORMATS)}")
    if (task_table is None) == (trace_format == "pai"):
        raise InvalidOptionError("a pai trace needs its task table (pai_task_table), and only a pai trace takes one"
                                 f"; got format {trace_format!r} with task_table={task_table!r}")
    if trace_format == "pai":
        return read_pai_trace(path, task_table, gpu_types)
    reader = {"philly": read_philly_trace, "helios": read_helios_trace, "tiresias": read_tiresias_trace}[trace_format]
    return reader(path, gpu_types)


__all__ = ["HELIOS_COLUMNS", "NO_TENANT", "PAI_JOB_COLUMNS", "PAI_TASK_COLUMNS", "TENANT_FIELDS", "TIRESIAS_COLUMNS",
           "TRACE_FORMATS", "TraceWorkload", "read_helios_trace", "read_pai_trace", "read_philly_trace",
           "read_tiresias_trace", "read_trace", "unit_throughputs"]
