"""Workloads for the simulator: Gavel traces and synthetic Poisson workloads."""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from os import PathLike
from typing import Any

import numpy as np

from allocopt.cluster import Cluster
from allocopt.documents import parse_json, read_text
from allocopt.errors import InvalidProblemError
from allocopt.throughput.table import DEFAULT_SCALE_FACTOR_PROBS, ThroughputTable

#: Largest total_steps (and priority_weight) and scale_factor a trace line may give.
MAX_TRACE_STEPS = 2**53
MAX_TRACE_SCALE = 2**31 - 1

#: Columns of a Gavel trace line (tab-separated).
TRACE_COLUMNS: tuple[str, ...] = ("job_type", "command", "working_directory", "num_steps_arg", "needs_data_dir",
                                  "total_steps", "scale_factor", "priority_weight", "SLO", "arrival_time")
#: The optional 11th column of a trace line (allocopt's): the job's tenant (:mod:`allocopt.mechanism.tenants`).
TENANT_COLUMN = "tenant"


class TraceError(InvalidProblemError):
    """A workload trace is malformed; the message starts with ``path:line:``.

    ``line`` is the 1-based line number (None when the problem is not one line's).
    """

    def __init__(self, message: str, *, line: int | None = None, field: str | None = None):
        super().__init__(message, field=field)
        self.line = line


@dataclass(frozen=True)
class Workload:
    """Jobs to simulate, in arrival order.

    Attributes
    ----------
    models : tuple of str
    scale_factors : ndarray of int of shape (n_jobs,)
        GPUs each job uses.
    total_steps : ndarray of int of shape (n_jobs,)
        Training steps of each job.
    arrival_s : ndarray of shape (n_jobs,)
        Arrival times, seconds, non-decreasing.
    priority_weights : ndarray of shape (n_jobs,)
    source : str
        Where the jobs came from (a path, or a description of the generator).
    lines : ndarray of int of shape (n_jobs,)
        Line of each job in ``source`` (0 for generated jobs), for error messages.
    tenants : tuple of str, optional
        The tenant (user, virtual cluster) of each job; None when the jobs name none
        (:mod:`allocopt.mechanism.tenants`).
    """

    models: tuple[str, ...]
    scale_factors: np.ndarray
    total_steps: np.ndarray
    arrival_s: np.ndarray
    priority_weights: np.ndarray
    source: str = ""
    lines: np.ndarray | None = None
    tenants: tuple[str, ...] | None = None

    @property
    def num_jobs(self) -> int:
        """Number of jobs."""
        return len(self.models)

    def jobs(self) -> list[tuple[str, int]]:
        """``(model, scale_factor)`` of each job."""
        return list(zip(self.models, self.scale_factors.tolist()))

    def throughputs(self, table: ThroughputTable, gpu_types: Sequence[str]) -> np.ndarray:
        """Steps/s of each job on each of ``gpu_types``, shape (n_jobs, n_types)."""
        rows = []
        for k, (model, scale) in enumerate(self.jobs()):
            try:
                rows.append(table.row(model, scale, gpu_types))
            except InvalidProblemError as err:
                raise TraceError(f"{self._where(k)}: {err}", line=self._line(k), field="job_type") from None
        return np.array(rows, dtype=np.float64).reshape(self.num_jobs, len(gpu_types))

    def check_fits(self, throughputs: np.ndarray, cluster: Cluster) -> None:
        """Raise a :class:`TraceError` naming the first job no GPU type of ``cluster`` can run."""
        fits = ((throughputs > 0) & (self.scale_factors[:, None] <= cluster.capacity[None, :])).any(axis=1)
        if not fits.all():
            k = int(np.argmin(fits))
            raise TraceError(f"{self._where(k)}: job {k} ({self.models[k]!r}, scale_factor "
                             f"{self.scale_factors[k]}) fits no GPU type of {cluster}: it needs "
                             f"{self.scale_factors[k]} GPUs of a type on which it has positive throughput",
                             line=self._line(k), field="scale_factor")

    def _line(self, k: int) -> int | None:
        return int(self.lines[k]) if self.lines is not None and self.lines[k] > 0 else None

    def _where(self, k: int) -> str:
        line = self._line(k)
        return f"{self.source}:{line}" if line else f"{self.source} job {k}"


def shipped_trace(name: str) -> str:
    """Path of a Gavel trace shipped with allocopt (``artifact_evaluation``, ``small_test``, ...)."""
    path = resources.files("allocopt") / "data" / "gavel_traces" / f"{name}.trace"
    if not path.is_file():
        raise TraceError(f"no shipped trace {name!r}; see allocopt/data/gavel_traces/")
    return str(path)


def read_gavel_trace(path: str | PathLike[str], table: ThroughputTable | None = None) -> Workload:
    """Read a Gavel trace: one job a line, 10 tab-separated columns (:data:`TRACE_COLUMNS`), and
    optionally an 11th, the job's tenant (:data:`TENANT_COLUMN`; then on every line).

    Parameters
    ----------
    path : path-like
    table : ThroughputTable, optional
        When given, every model and scale factor must be in it.

    Raises
    ------
    TraceError
        Missing columns, non-numeric, negative or too large values, unknown
        models; the message starts with ``path:line:``.
    DataFileError
        For a file that cannot be read, a binary or a non-UTF-8 file (naming the line).
    """
    name = str(path)
    models, scales, steps, arrivals, weights, lines, tenants = [], [], [], [], [], [], []
    text = read_text(path, what="the trace")
    width, first = 0, 0  # columns of the first line (10, or 11 with tenants) and its number
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        fields = raw.rstrip("\r\n").split("\t")
        if not width and len(fields) in (len(TRACE_COLUMNS), len(TRACE_COLUMNS) + 1):
            width, first = len(fields), number
        if len(fields) != width:
            expected = (f"{len(TRACE_COLUMNS)}: {', '.join(TRACE_COLUMNS)}, optionally followed by "
                        f"{TENANT_COLUMN}" if not width else
                        f"{width}, as line {first} has ({'with' if width > len(TRACE_COLUMNS) else 'without'} "
                        f"the {TENANT_COLUMN} column)")
            raise TraceError(f"{name}:{number}: {len(fields)} tab-separated columns, expected {expected}",
                             line=number, field="columns")
        values = dict(zip((*TRACE_COLUMNS, TENANT_COLUMN), fields))
        if TENANT_COLUMN in values:
            tenant = values[TENANT_COLUMN].strip()
            if not tenant:
                raise TraceError(f"{name}:{number}: the {TENANT_COLUMN} column is empty", line=number,
                                 field=TENANT_COLUMN)
            tenants.append(tenant)
        parsed = {}
        for column, kind in (("total_steps", int), ("scale_factor", int), ("priority_weight", float),
                             ("arrival_time", float)):
            try:
                parsed[column] = kind(values[column]) if kind is float else int(float(values[column]))
            except (ValueError, OverflowError):
                raise TraceError(f"{name}:{number}: {column} is {values[column]!r}, not a finite number",
                                 line=number, field=column) from None
        for column, limit in (("total_steps", MAX_TRACE_STEPS), ("scale_factor", MAX_TRACE_SCALE),
                              ("priority_weight", MAX_TRACE_STEPS)):
            if not parsed[column] <= limit:
                raise TraceError(f"{name}:{number}: {column} is {values[column]!r}; it must be at most {limit}",
                                 line=number, field=column)
        if parsed["arrival_time"] < 0 or not np.isfinite(parsed["arrival_time"]):
            raise TraceError(f"{name}:{number}: arrival_time is {parsed['arrival_time']}; it must be >= 0 "
                             "seconds", line=number, field="arrival_time")
        for column in ("total_steps", "scale_factor", "priority_weight"):
            if not parsed[column] > 0:
                raise TraceError(f"{name}:{number}: {column} is {parsed[column]}; it must be positive",
                                 line=number, field=column)
        model = values["job_type"].strip()
        if table is not None:
            try:
                table.row(model, parsed["scale_factor"])
            except InvalidProblemError as err:
                raise TraceError(f"{name}:{number}: {err}", line=number, field="job_type") from None
        models.append(model)
        scales.append(parsed["scale_factor"])
        steps.append(parsed["total_steps"])
        arrivals.append(parsed["arrival_time"])
        weights.append(parsed["priority_weight"])
        lines.append(number)
    if not models:
        raise TraceError(f"{name}: no jobs in the trace", field="trace")
    arrival = np.array(arrivals)
    order = np.argsort(arrival, kind="stable")
    return Workload(tuple(np.array(models, dtype=object)[order].tolist()), np.array(scales)[order],
                    np.array(steps)[order], arrival[order], np.array(weights)[order], name, np.array(lines)[order],
                    tuple(np.array(tenants, dtype=object)[order].tolist()) if tenants else None)


def load_throughputs(path: str | PathLike[str]) -> ThroughputTable:
    """A throughput table from a file: allocopt's CSV or JSON measurements
    (:meth:`ThroughputTable.from_csv`, :meth:`~ThroughputTable.from_json`), or Gavel's
    ``simulation_throughputs.json`` (``{gpu_type: {"('Model', s)": {"null": steps/s,
    "('Other', s)": [steps/s of Model, steps/s of Other], ...}}}``): the isolated throughputs of the
    consolidated types and their co-located pairs, as :meth:`ThroughputTable.gavel` holds them (each
    unordered pair once, in the orientation first met; a pair a type does not list cannot share there)."""
    name = str(path)
    if name.lower().endswith(".csv"):
        return ThroughputTable.from_csv(path)
    if not read_text(path, what="the throughput table").lstrip().startswith("{"):
        return ThroughputTable.from_json(path)
    raw = parse_json(read_text(path, what="the throughput table"), name)
    types = [t for t in raw if not t.endswith("_unconsolidated")]
    try:
        keys = list(raw[types[0]])
        entries = [(str(m), int(sf)) for m, sf in (_gavel_key(k) for k in keys)]
        values = [[float(raw[t][k]["null"]) for t in types] for k in keys]
        row = {k: i for i, k in enumerate(keys)}
        pairs: dict[tuple[int, int], np.ndarray] = {}  # (row a, row b) in first orientation -> (types, 2)
        for j, t in enumerate(types):
            for k in keys:
                for other, tput in raw[t][k].items():
                    if other == "null":
                        continue
                    a, b = row[k], row[other]
                    if entries[a][1] != entries[b][1]:
                        raise ValueError(f"pair {k} / {other} on {t} has two scale factors")
                    key, flip = ((a, b), False) if (a, b) in pairs or (b, a) not in pairs else ((b, a), True)
                    slot = pairs.setdefault(key, np.zeros((len(types), 2)))
                    slot[j] = [float(tput[1]), float(tput[0])] if flip else [float(tput[0]), float(tput[1])]
        order = sorted(pairs)
        return ThroughputTable(entries, types, values,
                               pairs=[(entries[a][0], entries[b][0], entries[a][1]) for a, b in order],
                               pair_throughputs_steps_per_s=np.array([pairs[k] for k in order]).reshape(
                                   len(order), len(types), 2))
    except (IndexError, KeyError, TypeError, ValueError, SyntaxError, OverflowError, RecursionError,
            MemoryError) as err:
        raise InvalidProblemError(f"{name}: not Gavel's throughputs layout {{gpu_type: {{\"('Model', s)\": "
                                  f"{{\"null\": steps_per_s, \"('Other', s)\": [steps_per_s, steps_per_s]}}}}}}: "
                                  f"{err!r}", field="json") from None


def _gavel_key(text: str) -> tuple[Any, Any]:
    """Gavel's entry key ``"('Model (batch size B)', s)"`` -> ``(model, s)``."""
    if len(text) >= 1000:
        raise ValueError(f"entry key of {len(text)} characters")
    model, scale = ast.literal_eval(text)
    return model, scale


def generate_workload(table: ThroughputTable, num_jobs: int, *, jobs_per_hour: float, seed: int = 0,
                      cluster: Cluster | Mapping[str, int] | None = None, reference_gpu_type: str = "v100",
                      scale_factor_probs: Mapping[int, float] = DEFAULT_SCALE_FACTOR_PROBS,
                      short_job_prob: float = 0.8) -> Workload:
    """Gavel's synthetic workload: Poisson arrivals, measured job types, log-uniform durations.

    Arrivals are a Poisson process of rate ``jobs_per_hour`` starting at 0 s.
    The model is uniform over the table's models that run on
    ``reference_gpu_type`` and the scale factor drawn by ``scale_factor_probs``
    (renormalized over the model's entries). With ``cluster``, only entries
    that can run on it are drawn (positive throughput on a GPU type with at
    least ``scale_factor`` GPUs), so no job is larger than every type. A job's run time on
    ``reference_gpu_type`` is ``60 * 10**U(1.5, 3)`` s with probability
    ``short_job_prob``, else ``60 * 10**U(3, 4)`` s; its steps are that
    duration times its throughput there. Arrivals, job types and durations
    use independent random streams derived from ``seed``.

    Parameters
    ----------
    table : ThroughputTable
    num_jobs : int
    jobs_per_hour : float
        Arrival rate, jobs per hour.
    seed : int, default 0
    cluster : Cluster or mapping of str to int, optional
        The cluster the workload is for (GPUs per type); default: any entry
        that runs on ``reference_gpu_type``.
    reference_gpu_type : str, default "v100"
    scale_factor_probs : mapping of int to float, default ``{1: 0.7, 2: 0.1, 4: 0.15, 8: 0.05}``
    short_job_prob : float, default 0.8
    """
    if not jobs_per_hour > 0:
        raise InvalidProblemError(f"jobs_per_hour must be > 0, got {jobs_per_hour!r}", field="jobs_per_hour")
    arrival_rng, type_rng, duration_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    gaps = arrival_rng.exponential(3600.0 / jobs_per_hour, size=num_jobs)
    arrival = np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if num_jobs else np.zeros(0)
    if cluster is None:
        jobs = table.sample_jobs(Cluster({reference_gpu_type: max(scale_factor_probs)}), num_jobs, seed=type_rng,
                                 scale_factor_probs=scale_factor_probs)
    else:
        cluster = cluster if isinstance(cluster, Cluster) else Cluster(cluster)
        runs = table.throughputs_steps_per_s[:, _gpu_type_column(table, reference_gpu_type)] > 0
        reference_runs = ThroughputTable([e for e, ok in zip(table.entries, runs) if ok], table.gpu_types,
                                         table.throughputs_steps_per_s[runs])
        jobs = reference_runs.sample_jobs(cluster, num_jobs, seed=type_rng, scale_factor_probs=scale_factor_probs)
    short = duration_rng.random(num_jobs) < short_job_prob
    exponent = np.where(short, duration_rng.uniform(1.5, 3.0, num_jobs), duration_rng.uniform(3.0, 4.0, num_jobs))
    duration = 60.0 * 10.0 ** exponent
    ref = np.array([table.throughput(m, s, reference_gpu_type) for m, s in jobs])
    steps = np.maximum(1, (duration * ref).astype(np.int64))
    source = f"generated(num_jobs={num_jobs}, jobs_per_hour={jobs_per_hour}, seed={seed})"
    return Workload(tuple(m for m, _ in jobs), np.array([s for _, s in jobs], dtype=np.int64), steps, arrival,
                    np.ones(num_jobs), source, np.zeros(num_jobs, dtype=np.int64))


def _gpu_type_column(table: ThroughputTable, gpu_type: str) -> int:
    if gpu_type not in table.gpu_types:
        raise InvalidProblemError(f"reference_gpu_type {gpu_type!r} is not in the throughput table's GPU types "
                                  f"{list(table.gpu_types)}", field="reference_gpu_type")
    return table.gpu_types.index(gpu_type)


__all__ = ["TENANT_COLUMN", "TRACE_COLUMNS", "TraceError", "Workload", "generate_workload", "load_throughputs", "read_gavel_trace", "shipped_trace"]
