"""Validated, array-based inputs of an allocation problem.

Jobs have a fixed order (``job_ids``) and GPU types the cluster's order. Every
array is validated once, when the Problem is built, and then frozen.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, NamedTuple, overload

import numpy as np

from allocopt.cluster import Cluster
from allocopt.errors import InvalidProblemError
from allocopt.schemas.checks import check_problem_document
from allocopt.jsonio import JsonSource, document_or_write, read_json


#: Positive throughputs (steps/s, pair throughputs too) allocopt accepts: outside it solver
#: tolerances swamp the data; 0 (cannot run) is always allowed.
THROUGHPUT_RANGE = (1e-9, 1e9)
#: The most one job's positive throughputs may differ (a type a million times slower than the
#: job's best is as good as unusable: give it 0).
THROUGHPUT_SPREAD = 1e6
#: Priority weights and entity weights allocopt accepts: a job of a millionth of another's weight
#: is still allocated to solver precision.
WEIGHT_RANGE = (1e-3, 1e3)


def _outside(values: np.ndarray, bounds: tuple[float, float]) -> np.ndarray:
    """Bool mask of the entries outside ``bounds``."""
    return (values < bounds[0]) | (values > bounds[1])


def _range_text(what: str, bounds: tuple[float, float], unit: str = "") -> str:
    return f"allocopt supports {what} between {bounds[0]:g} and {bounds[1]:g}{unit}"


def _is_frame(obj: Any) -> bool:
    return hasattr(obj, "columns") and hasattr(obj, "index") and hasattr(obj, "to_numpy")


def _plain(value: Any) -> Any:
    """numpy scalars to Python ones, for JSON."""
    return value.item() if isinstance(value, np.generic) else value


def _pairs_from_json(pairs: Any) -> dict | None:
    if pairs is None:
        return None
    if not isinstance(pairs, list):
        raise InvalidProblemError("'pairs' must be a list of {\"jobs\": [a, b], \"throughputs\": {...}}",
                                  field="pairs")
    out = {}
    for k, pair in enumerate(pairs):
        if not isinstance(pair, Mapping) or not isinstance(pair.get("jobs"), list) or len(pair["jobs"]) != 2:
            raise InvalidProblemError(f"pairs[{k}] must be an object with 'jobs': [a, b] and 'throughputs'",
                                      field=f"pairs[{k}]")
        out[tuple(pair["jobs"])] = pair.get("throughputs")
    return out


class PairThroughputs(NamedTuple):
    """Pair throughputs in array form, for many pairs: ``jobs[p] = (job_a, job_b)`` and
    ``values[p, j] = (tput_a, tput_b)`` in steps/s on GPU type ``j`` (cluster order)."""

    jobs: Sequence[tuple[Hashable, Hashable]]
    values: Any  # array-like of shape (n_pairs, n_gpu_types, 2)


def _distinct(rows: np.ndarray, seen: np.ndarray) -> bool:
    """Whether ``rows`` (indices into ``seen``, all False) are distinct."""
    seen[rows] = True
    return int(np.count_nonzero(seen)) == rows.size


def _frozen(arr: np.ndarray | None) -> np.ndarray | None:
    if arr is not None:
        arr.setflags(write=False)
    return arr


class Problem:
    """Jobs, the cluster and the throughput of each job on each GPU type.

    Parameters
    ----------
    throughputs : array-like of shape (n_jobs, n_gpu_types) or pandas.DataFrame
        Steps per second of the whole job on ``scale_factor`` GPUs of each
        type, columns in ``cluster.gpu_types`` order; 0 where the job cannot
        run. A DataFrame's index gives the job ids and its columns the GPU
        types (in any order).
    cluster : Cluster
    job_ids : sequence of hashable, optional
        Distinct job ids; default ``0 .. n_jobs - 1`` (or the DataFrame index).
    scale_factors : array-like of int of shape (n_jobs,), default 1
        GPUs each job uses at once.
    priority_weights : array-like of shape (n_jobs,), default 1.0
        Positive weights; a job of weight 2 is entitled to twice the share.
    num_steps_remaining : array-like of shape (n_jobs,), optional
        Training steps each job has left.
    time_since_start : array-like of shape (n_jobs,), optional
        Seconds since each job arrived.
    costs : mapping of str to float or array-like of shape (n_gpu_types,), optional
        Price of one GPU of each type per hour (any currency).
    slos : array-like of shape (n_jobs,), optional
        Seconds from now by which each job must finish; ``inf`` for no deadline.
        Jobs with a deadline need ``num_steps_remaining``.
    time_isolated : array-like of shape (n_jobs,), optional
        Seconds each job would have needed so far under its isolated share
        (finish-time fairness); default 0.
    entities : sequence of hashable of length n_jobs, optional
        The entity (user, organization) each job belongs to, for hierarchical policies.
    entity_weights : mapping of entity to float, optional
        Positive weight of each entity; default 1 for every entity.
    pair_throughputs : mapping of (job_id, job_id) to mapping of str to (float, float), optional
        Steps/s of each member of a pair when the two share the same GPUs:
        ``{(a, b): {gpu_type: (tput_a, tput_b)}}``; ``(0, 0)`` where they cannot
        share. For many pairs, a :class:`PairThroughputs` (arrays) is faster. Members must have equal scale factors. Stored as ``pairs``
        (int array of shape (n_pairs, 2), job rows) and ``pair_throughput_array``
        (shape (n_pairs, n_gpu_types, 2)).

    Notes
    -----
    Numeric range: positive throughputs (and pair throughputs) from 1e-9 to
    1e9 steps/s (:data:`THROUGHPUT_RANGE`), one job's positive throughputs
    within a factor 1e6 of each other (:data:`THROUGHPUT_SPREAD`), and
    priority and entity weights from 1e-3 to 1e3 (:data:`WEIGHT_RANGE`); every
    problem inside it is solved to the solvers' precision, and values outside
    it raise :class:`~allocopt.errors.InvalidProblemError` naming the field and
    the range.
    """

    def __init__(self, throughputs: Any, cluster: Cluster, *,
                 job_ids: Sequence[Hashable] | None = None,
                 scale_factors: Any = None, priority_weights: Any = None,
                 num_steps_remaining: Any = None, time_since_start: Any = None,
                 costs: Mapping[str, float] | Any = None, slos: Any = None,
                 time_isolated: Any = None, entities: Sequence[Hashable] | None = None,
                 entity_weights: Mapping[Hashable, float] | None = None,
                 pair_throughputs: Mapping[tuple[Hashable, Hashable], Mapping[str, Any]] | PairThroughputs
                 | None = None):
        if not isinstance(cluster, Cluster):
            raise InvalidProblemError(
                f"cluster must be an allocopt.Cluster, got {type(cluster).__name__}; "
                "build one with allocopt.Cluster({'v100': 4, ...})", field="cluster")
        self.cluster = cluster
        if _is_frame(throughputs):
            if job_ids is None:
                job_ids = list(throughputs.index)
            columns = [str(c) for c in throughputs.columns]
            unknown = sorted(set(columns) - set(cluster.gpu_types))
            if unknown:
                raise InvalidProblemError(
                    f"throughputs has column(s) for unknown GPU type(s) {unknown}; "
                    f"the cluster's types are {list(cluster.gpu_types)}", field="throughputs")
            missing = [t for t in cluster.gpu_types if t not in columns]
            if missing:
                raise InvalidProblemError(
                    f"throughputs has no column for GPU type(s) {missing}; add them (0.0 where "
                    "a job cannot run)", field="throughputs")
            order = [columns.index(t) for t in cluster.gpu_types]
            throughputs = throughputs.to_numpy(dtype=np.float64)[:, order]
        try:
            T = np.array(throughputs, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise InvalidProblemError(f"throughputs must be a numeric array of shape "
                                      f"(n_jobs, n_gpu_types): {err}", field="throughputs") from err
        k = cluster.num_gpu_types
        if T.ndim != 2 or T.shape[1] != k:
            n_guess = T.shape[0] if T.ndim >= 1 else "n_jobs"
            raise InvalidProblemError(
                f"throughputs has shape {T.shape}, expected (n_jobs, n_gpu_types) = ({n_guess}, {k}) "
                f"with columns in the cluster's type order {list(cluster.gpu_types)}", field="throughputs")
        n = T.shape[0]
        self.throughputs = T
        self.job_ids = self._job_ids(job_ids, n)
        self.scale_factors = self._vector("scale_factors", scale_factors, 1, integer=True)
        self.priority_weights = self._vector("priority_weights", priority_weights, 1.0)
        self.num_steps_remaining = self._vector("num_steps_remaining", num_steps_remaining, None)
        self.time_since_start = self._vector("time_since_start", time_since_start, None)
        self.slos = self._vector("slos", slos, None, allow_inf=True)
        self.time_isolated = self._vector("time_isolated", time_isolated, None)
        self.costs = self._costs(costs)
        self._validate()
        self.entities, self.entity_ids, self.entity_weights = self._entities(entities, entity_weights)
        self.pairs, self.pair_throughput_array = self._pairs(pair_throughputs)
        for name in ("throughputs", "scale_factors", "priority_weights", "num_steps_remaining",
                     "time_since_start", "slos", "costs", "time_isolated", "entities", "entity_weights",
                     "pairs", "pair_throughput_array"):
            _frozen(getattr(self, name))

    # ----- construction helpers ------------------------------------------------
    @classmethod
    def from_dicts(cls, throughputs: Mapping[Hashable, Mapping[str, float]], cluster: Cluster, *,
                   scale_factors: Mapping[Hashable, int] | None = None,
                   priority_weights: Mapping[Hashable, float] | None = None,
                   num_steps_remaining: Mapping[Hashable, float] | None = None,
                   time_since_start: Mapping[Hashable, float] | None = None,
                   costs: Mapping[str, float] | None = None,
                   slos: Mapping[Hashable, float] | None = None,
                   time_isolated: Mapping[Hashable, float] | None = None,
                   entities: Mapping[Hashable, Hashable] | None = None,
                   entity_weights: Mapping[Hashable, float] | None = None,
                   pair_throughputs: Mapping[tuple[Hashable, Hashable], Mapping[str, Any]] | None = None
                   ) -> Problem:
        """Build from ``{job_id: {gpu_type: steps_per_s}}`` and per-job dicts.

        Per-job dicts must cover every job, except ``slos`` (jobs without an
        entry have no deadline). Job ids may be any hashable.
        """
        if not isinstance(throughputs, Mapping):
            raise InvalidProblemError("throughputs must be a mapping {job_id: {gpu_type: steps_per_s}}",
                                      field="throughputs")
        job_ids = list(throughputs)
        types = cluster.gpu_types
        T = np.empty((len(job_ids), len(types)))
        for i, job in enumerate(job_ids):
            row = throughputs[job]
            if not isinstance(row, Mapping):
                raise InvalidProblemError(f"throughputs[{job!r}] must be a mapping of GPU type to "
                                          f"steps/s, got {type(row).__name__}", field="throughputs", job=job)
            unknown = sorted(set(map(str, row)) - set(types))
            if unknown:
                raise InvalidProblemError(
                    f"job {job!r} has throughputs for unknown GPU type(s) {unknown}; the cluster's "
                    f"types are {list(types)}", field="throughputs", job=job)
            missing = [t for t in types if t not in row]
            if missing:
                raise InvalidProblemError(
                    f"job {job!r} has no throughput for GPU type(s) {missing}; give 0.0 where the job "
                    "cannot run", field="throughputs", job=job)
            try:
                T[i] = [row[t] for t in types]
            except (TypeError, ValueError):
                raise InvalidProblemError(f"job {job!r} has a non-numeric throughput {dict(row)}; give steps/s "
                                          "as numbers", field="throughputs", job=job) from None

        def per_job(name: str, mapping: Mapping | None, partial: bool = False, fill: Any = np.nan):
            if mapping is None:
                return None
            if not isinstance(mapping, Mapping):
                raise InvalidProblemError(f"{name} must be a mapping of job id to value", field=name)
            unknown = [j for j in mapping if j not in throughputs]
            if unknown:
                raise InvalidProblemError(f"{name} names job(s) {unknown[:5]} that are not in throughputs",
                                          field=name, job=unknown[0])
            if not partial:
                missing = [j for j in job_ids if j not in mapping]
                if missing:
                    raise InvalidProblemError(f"{name} has no entry for job(s) {missing[:5]}; give a value "
                                              "for every job", field=name, job=missing[0])
            return [mapping.get(j, fill) for j in job_ids]

        return cls(T, cluster, job_ids=job_ids,
                   scale_factors=per_job("scale_factors", scale_factors),
                   priority_weights=per_job("priority_weights", priority_weights),
                   num_steps_remaining=per_job("num_steps_remaining", num_steps_remaining),
                   time_since_start=per_job("time_since_start", time_since_start),
                   costs=costs, slos=per_job("slos", slos, partial=True, fill=np.inf),
                   time_isolated=per_job("time_isolated", time_isolated),
                   entities=per_job("entities", entities), entity_weights=entity_weights,
                   pair_throughputs=pair_throughputs)

    @classmethod
    def from_json(cls, source: JsonSource) -> Problem:
        """Build from a problem document (see :meth:`to_json`), or the path of a JSON file holding one.

        The document is what ``allocopt solve`` reads:
        ``{"cluster": {"gpus": {type: count}}, "jobs": [{"id", "throughputs": {type: steps/s}, ...}]}``
        (``allocopt/schemas/problem.schema.json``; e.g. ``examples/problem.json``). The
        value types and the keys the schema allows are checked first, and an
        :class:`InvalidProblemError` names the path of the first violation
        (e.g. ``jobs[3].scale_factor``).
        """
        data = read_json(source, what="problem")
        if not isinstance(data, Mapping) or "jobs" not in data or "cluster" not in data:
            got = (f"an object with fields {sorted(map(str, data))}" if isinstance(data, Mapping)
                   else type(data).__name__)
            raise InvalidProblemError(f"a problem document needs 'cluster' and 'jobs' fields; got {got}",
                                      field="document")
        check_problem_document(data)
        cluster = Cluster.from_dict(data["cluster"])
        jobs = data["jobs"]
        if not isinstance(jobs, list):
            raise InvalidProblemError("'jobs' must be a list of job objects", field="jobs")
        fields = {"scale_factor": "scale_factors", "priority_weight": "priority_weights",
                  "num_steps_remaining": "num_steps_remaining",
                  "time_since_start_s": "time_since_start", "slo_s": "slos",
                  "time_isolated_s": "time_isolated", "entity": "entities"}
        throughputs: dict = {}
        columns: dict[str, dict] = {v: {} for v in fields.values()}
        for k, job in enumerate(jobs):
            if not isinstance(job, Mapping) or "id" not in job or "throughputs" not in job:
                raise InvalidProblemError(f"jobs[{k}] must be an object with 'id' and 'throughputs'",
                                          field=f"jobs[{k}]")
            unknown = sorted(set(job) - set(fields) - {"id", "throughputs"})
            if unknown:
                raise InvalidProblemError(f"jobs[{k}] (id {job['id']!r}) has unknown field(s) {unknown}; "
                                          f"known: id, throughputs, {', '.join(fields)}",
                                          field=f"jobs[{k}]", job=job["id"])
            job_id = job["id"]
            if isinstance(job_id, (list, dict)):
                raise InvalidProblemError(f"jobs[{k}] has id {job_id!r}; job ids must be strings or numbers",
                                          field=f"jobs[{k}].id")
            if job_id in throughputs:
                raise InvalidProblemError(f"job id {job_id!r} appears twice in 'jobs'", field="jobs", job=job_id)
            throughputs[job_id] = job["throughputs"]
            for key, name in fields.items():
                if key in job:
                    columns[name][job_id] = job[key]

        def full(name: str, default: Any):
            col = columns[name]
            if not col:
                return None
            return {j: col.get(j, default) for j in throughputs}

        return cls.from_dicts(throughputs, cluster,
                              scale_factors=full("scale_factors", 1),
                              priority_weights=full("priority_weights", 1.0),
                              num_steps_remaining=full("num_steps_remaining", np.nan),
                              time_since_start=full("time_since_start", 0.0),
                              costs=data.get("costs"), slos=columns["slos"] or None,
                              time_isolated=full("time_isolated", 0.0),
                              entities=full("entities", None), entity_weights=data.get("entity_weights"),
                              pair_throughputs=_pairs_from_json(data.get("pairs")))

    @overload
    def to_json(self, path: None = None) -> dict[str, Any]: ...

    @overload
    def to_json(self, path: str | os.PathLike[str]) -> None: ...

    def to_json(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
        """The problem document that :meth:`from_json` reads back; written to ``path`` when given."""
        jobs = []
        for i, job in enumerate(self.job_ids):
            entry: dict[str, Any] = {
                "id": _plain(job),
                "throughputs": dict(zip(self.cluster.gpu_types, self.throughputs[i].tolist())),
                "scale_factor": int(self.scale_factors[i]),
                "priority_weight": float(self.priority_weights[i])}
            if self.num_steps_remaining is not None:
                entry["num_steps_remaining"] = float(self.num_steps_remaining[i])
            if self.time_since_start is not None:
                entry["time_since_start_s"] = float(self.time_since_start[i])
            if self.slos is not None and np.isfinite(self.slos[i]):
                entry["slo_s"] = float(self.slos[i])
            if self.time_isolated is not None:
                entry["time_isolated_s"] = float(self.time_isolated[i])
            if self.entities is not None:
                entry["entity"] = _plain(self.entity_ids[self.entities[i]])
            jobs.append(entry)
        doc: dict[str, Any] = {"cluster": self.cluster.to_dict(), "jobs": jobs}
        if self.costs is not None:
            doc["costs"] = dict(zip(self.cluster.gpu_types, self.costs.tolist()))
        if self.entities is not None:
            doc["entity_weights"] = {_plain(e): float(w) for e, w in zip(self.entity_ids, self.entity_weights)}
        if self.pairs is not None:
            doc["pairs"] = [{"jobs": [_plain(self.job_ids[a]), _plain(self.job_ids[b])],
                             "throughputs": dict(zip(self.cluster.gpu_types, tput.tolist()))}
                            for (a, b), tput in zip(self.pairs.tolist(), self.pair_throughput_array)]
        return document_or_write(doc, path)

    # ----- accessors ---------------------------------------------------------------
    @property
    def num_jobs(self) -> int:
        """Number of jobs."""
        return self.throughputs.shape[0]

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The cluster's GPU type names, in order."""
        return self.cluster.gpu_types

    @property
    def capacity(self) -> np.ndarray:
        """GPUs of each type, shape (n_gpu_types,)."""
        return self.cluster.capacity

    def job_index(self, job_id: Hashable) -> int:
        """Row of ``job_id`` in every per-job array."""
        try:
            return self._index[job_id]
        except KeyError:
            raise InvalidProblemError(f"unknown job id {job_id!r}", field="job_id", job=job_id) from None

    @functools.cached_property
    def _index(self) -> dict[Hashable, int]:
        """Job id -> row (built at the first look-up)."""
        return dict(zip(self.job_ids, range(self.num_jobs)))

    @functools.cached_property
    def runnable(self) -> np.ndarray:
        """Bool (n_jobs, n_gpu_types): positive throughput and enough GPUs of the type (read-only)."""
        return _frozen((self.throughputs > 0) & (self.scale_factors[:, None] <= self.capacity[None, :]))

    @property
    def proportional_throughputs(self) -> np.ndarray:
        """Steps/s of each job under the cluster-proportional share
        ``X[i, j] = c_j / sum(c)``, shape (n_jobs,)."""
        total = self.capacity.sum()
        return self.throughputs @ (self.capacity / total) if total else np.zeros(self.num_jobs)

    def pairs_within(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """Indices of the pairs (``self.pairs``) whose members are both at positions ``rows``."""
        member = np.zeros(self.num_jobs, dtype=bool)
        member[np.asarray(rows, dtype=np.int64)] = True
        return np.flatnonzero(member[self.pairs].all(axis=1)) if self.pairs is not None else np.zeros(0, np.int64)

    def subset(self, rows: Sequence[int] | np.ndarray, cluster: Cluster | None = None) -> Problem:
        """The problem of the jobs at positions ``rows`` (in that order), on
        ``cluster`` (default this one, which must have the same GPU types),
        with the pairs whose members are both kept."""
        rows = np.asarray(rows, dtype=np.int64)
        cluster = self.cluster if cluster is None else cluster
        if cluster.gpu_types != self.gpu_types:
            raise InvalidProblemError(f"a subset's cluster must have the GPU types {list(self.gpu_types)}, got "
                                      f"{list(cluster.gpu_types)}", field="cluster")

        def pick(values: np.ndarray | None) -> np.ndarray | None:
            return None if values is None else values[rows]

        pairs = None
        if self.pairs is not None:
            kept = self.pairs_within(rows)
            ids = self.job_ids
            pairs = PairThroughputs([(ids[a], ids[b]) for a, b in self.pairs[kept].tolist()],
                                    self.pair_throughput_array[kept])
        entities = entity_weights = None
        if self.entities is not None:
            entities = [self.entity_ids[e] for e in self.entities[rows].tolist()]
            kept_entities = set(entities)
            entity_weights = {e: float(w) for e, w in zip(self.entity_ids, self.entity_weights) if e in kept_entities}
        return Problem(self.throughputs[rows], cluster, job_ids=[self.job_ids[i] for i in rows.tolist()],
                       scale_factors=self.scale_factors[rows], priority_weights=self.priority_weights[rows],
                       num_steps_remaining=pick(self.num_steps_remaining),
                       time_since_start=pick(self.time_since_start), costs=self.costs, slos=pick(self.slos),
                       time_isolated=pick(self.time_isolated), entities=entities, entity_weights=entity_weights,
                       pair_throughputs=pairs)

    def with_progress(self, rows: Sequence[int] | np.ndarray, *, num_steps_remaining: Any = None,
                      time_since_start: Any = None, time_isolated: Any = None) -> Problem:
        """The jobs at positions ``rows`` (distinct, in that order) with new progress vectors, for a
        caller that re-solves subsets of one set of jobs (a simulator, at every event).

        Throughputs, scale factors, weights and deadlines were checked when this
        problem was built and are not checked again; the progress vectors
        (steps, seconds; each of shape (len(rows),)) are checked as the
        constructor checks them. Problems with pairs or entities: use :meth:`subset`.
        """
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if self.pairs is not None or self.entities is not None:
            raise InvalidProblemError("with_progress takes a problem without pairs or entities; use subset()",
                                      field="rows")
        seen = np.zeros(self.num_jobs, dtype=bool)
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_jobs or not _distinct(rows, seen)):
            raise InvalidProblemError(f"rows must be distinct positions 0..{self.num_jobs - 1} of this problem's "
                                      "jobs", field="rows")
        new = object.__new__(Problem)
        new.cluster, new.costs = self.cluster, self.costs
        new.throughputs = self.throughputs[rows]
        new.job_ids = tuple(map(self.job_ids.__getitem__, rows.tolist()))
        new.scale_factors, new.priority_weights = self.scale_factors[rows], self.priority_weights[rows]
        new.slos = None if self.slos is None else self.slos[rows]
        new.num_steps_remaining = new._vector("num_steps_remaining", num_steps_remaining, None)
        new.time_since_start = new._vector("time_since_start", time_since_start, None)
        new.time_isolated = new._vector("time_isolated", time_isolated, None)
        new._validate_progress()
        new.entities, new.entity_ids, new.entity_weights = None, (), None
        new.pairs, new.pair_throughput_array = None, None
        for name in ("throughputs", "scale_factors", "priority_weights", "num_steps_remaining",
                     "time_since_start", "slos", "time_isolated"):
            _frozen(getattr(new, name))
        return new

    def __repr__(self) -> str:
        return f"Problem(n_jobs={self.num_jobs}, cluster={self.cluster!r})"

    # ----- validation ----------------------------------------------------------------
    def _job_ids(self, job_ids: Sequence[Hashable] | None, n: int) -> tuple:
        if job_ids is None:
            return tuple(range(n))
        ids = tuple(job_ids)
        if len(ids) != n:
            raise InvalidProblemError(f"job_ids has {len(ids)} entries but throughputs has {n} rows",
                                      field="job_ids")
        try:
            if len(set(ids)) == n:
                return ids
        except TypeError:
            pass  # the walk below names the unhashable id
        seen: set = set()
        dups = []
        for job in ids:
            try:
                if job in seen:
                    dups.append(job)
                seen.add(job)
            except TypeError:
                raise InvalidProblemError(f"job id {job!r} is not hashable", field="job_ids") from None
        if dups:
            raise InvalidProblemError(f"duplicate job id(s) {dups[:5]}; job ids must be distinct",
                                      field="job_ids", job=dups[0])
        return ids

    def _vector(self, name: str, value: Any, default: Any, *, integer: bool = False,
                allow_inf: bool = False) -> np.ndarray | None:
        n = self.num_jobs
        if value is None:
            return None if default is None else np.full(n, default, dtype=np.int64 if integer else np.float64)
        if isinstance(value, Mapping):
            raise InvalidProblemError(f"{name} is a mapping; use Problem.from_dicts for per-job dicts, "
                                      "or pass an array in job order", field=name)
        try:
            arr = np.array(value, dtype=np.float64).reshape(-1) if np.ndim(value) <= 1 else None
        except (TypeError, ValueError) as err:
            raise InvalidProblemError(f"{name} must be numeric: {err}", field=name) from err
        if arr is None or arr.shape != (n,):
            raise InvalidProblemError(f"{name} has shape {np.shape(value)}, expected (n_jobs,) = ({n},)",
                                      field=name)
        bad = ~np.isfinite(arr) if not allow_inf else np.isnan(arr)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InvalidProblemError(f"{name} of job {self.job_ids[i]!r} is {arr[i]}; give a finite number",
                                      field=name, job=self.job_ids[i])
        if integer:
            frac = arr != np.round(arr)
            if frac.any():
                i = int(np.flatnonzero(frac)[0])
                raise InvalidProblemError(f"{name} of job {self.job_ids[i]!r} is {arr[i]}; it must be an "
                                          "integer number of GPUs", field=name, job=self.job_ids[i])
            return arr.astype(np.int64)
        return arr

    def _entities(self, entities: Sequence[Hashable] | None,
                  weights: Mapping[Hashable, float] | None) -> tuple[np.ndarray | None, tuple, np.ndarray | None]:
        """Entity index per job, the entity ids in first-seen order, and their weights."""
        if entities is None:
            if weights:
                raise InvalidProblemError("entity_weights is given but no job has an entity; pass entities=...",
                                          field="entity_weights")
            return None, (), None
        labels = list(entities)
        if len(labels) != self.num_jobs:
            raise InvalidProblemError(f"entities has {len(labels)} entries, expected one per job ({self.num_jobs})",
                                      field="entities")
        ids: dict[Hashable, int] = {}
        index = np.empty(self.num_jobs, dtype=np.int64)
        for i, label in enumerate(labels):
            try:
                index[i] = ids.setdefault(label, len(ids))
            except TypeError:
                raise InvalidProblemError(f"entity {label!r} of job {self.job_ids[i]!r} is not hashable",
                                          field="entities", job=self.job_ids[i]) from None
        weights = dict(weights or {})
        unknown = [e for e in weights if e not in ids]
        if unknown:
            raise InvalidProblemError(f"entity_weights names entit(ies) {unknown[:5]} that no job belongs to",
                                      field="entity_weights")
        w = np.array([weights.get(e, 1.0) for e in ids], dtype=np.float64)
        bad = ~np.isfinite(w) | (w <= 0)
        if bad.any():
            e = list(ids)[int(np.flatnonzero(bad)[0])]
            raise InvalidProblemError(f"entity_weights[{e!r}] is {weights[e]}; weights must be positive",
                                      field="entity_weights")
        if _outside(w, WEIGHT_RANGE).any():
            e = list(ids)[int(np.flatnonzero(_outside(w, WEIGHT_RANGE))[0])]
            raise InvalidProblemError(f"entity_weights[{e!r}] is {weights[e]:g}; "
                                      f"{_range_text('entity weights', WEIGHT_RANGE)}: rescale the weights",
                                      field="entity_weights")
        return index, tuple(ids), w

    def _pairs(self, pairs: Mapping | PairThroughputs | None) -> tuple[np.ndarray | None, np.ndarray | None]:
        if pairs is None:
            return None, None
        if not isinstance(pairs, (Mapping, PairThroughputs)):
            raise InvalidProblemError("pair_throughputs must be a mapping {(job_a, job_b): {gpu_type: "
                                      "(tput_a, tput_b)}}", field="pair_throughputs")
        types = self.cluster.gpu_types
        keys = list(pairs.jobs if isinstance(pairs, PairThroughputs) else pairs)
        bad = next((k for k in keys if not (isinstance(k, tuple) and len(k) == 2)), None)
        if bad is not None:
            raise InvalidProblemError(f"pair_throughputs key {bad!r} must be a 2-tuple of job ids",
                                      field="pair_throughputs")
        rows = np.array([(self._index.get(a, -1), self._index.get(b, -1)) for a, b in keys],
                        dtype=np.int64).reshape(-1, 2)

        def fail(p: int, message: str) -> InvalidProblemError:
            return InvalidProblemError(f"pair {keys[p]!r} {message}", field="pair_throughputs", job=keys[p][0])

        unknown = np.flatnonzero((rows < 0).any(axis=1))
        if unknown.size:
            p = int(unknown[0])
            raise fail(p, f"names unknown job {keys[p][int(np.argmax(rows[p] < 0))]!r}")
        same = np.flatnonzero(rows[:, 0] == rows[:, 1])
        if same.size:
            raise fail(int(same[0]), "pairs a job with itself")
        swapped = rows[:, 0] > rows[:, 1]
        rows = np.sort(rows, axis=1)
        code = rows[:, 0] * self.num_jobs + rows[:, 1]
        _, first, counts = np.unique(code, return_index=True, return_counts=True)
        if (counts > 1).any():
            dup = np.flatnonzero(code == code[first[np.argmax(counts > 1)]])[1]
            raise fail(int(dup), "appears twice (in either order)")
        scale = self.scale_factors[rows]
        mixed = np.flatnonzero(scale[:, 0] != scale[:, 1])
        if mixed.size:
            p = int(mixed[0])
            raise fail(p, f"has scale factors {scale[p, 0]} and {scale[p, 1]}; only jobs with equal scale "
                          "factors can share GPUs, remove the pair")
        try:
            if isinstance(pairs, PairThroughputs):
                values = np.array(pairs.values, dtype=np.float64)
                if values.shape[:2] != (len(keys), len(types)):
                    raise InvalidProblemError(f"PairThroughputs.values has shape {values.shape}, expected "
                                              f"(n_pairs, n_gpu_types, 2) = ({len(keys)}, {len(types)}, 2)",
                                              field="pair_throughputs")
            else:
                type_set = set(types)
                for p, by_type in enumerate(pairs.values()):
                    if not isinstance(by_type, Mapping) or by_type.keys() != type_set:
                        raise fail(p, f"must give (tput_a, tput_b) for exactly the GPU types {list(types)}")
                values = np.array([[by_type[t] for t in types] for by_type in pairs.values()], dtype=np.float64)
        except (TypeError, ValueError) as err:
            if isinstance(err, InvalidProblemError):
                raise
            raise InvalidProblemError(f"pair throughputs must be numeric pairs (tput_a, tput_b): {err}",
                                      field="pair_throughputs") from err
        values = values.reshape(len(keys), len(types), -1) if keys else np.zeros((0, len(types), 2))
        if values.shape[2] != 2:
            raise fail(0, "must give two throughputs (tput_a, tput_b) per GPU type")
        invalid = np.flatnonzero(~np.isfinite(values).all(axis=(1, 2)) | (values < 0).any(axis=(1, 2)))
        if invalid.size:
            p = int(invalid[0])
            raise fail(p, f": each GPU type needs two finite steps/s >= 0, got {values[p].tolist()}")
        out = np.flatnonzero(((values > 0) & _outside(values, THROUGHPUT_RANGE)).any(axis=(1, 2)))
        if out.size:
            p = int(out[0])
            raise fail(p, f"has throughputs {values[p].tolist()}; "
                          f"{_range_text('positive throughputs', THROUGHPUT_RANGE, ' steps/s')}")
        values[swapped] = values[swapped, :, ::-1]
        return rows, values

    def _costs(self, costs: Any) -> np.ndarray | None:
        if costs is None:
            return None
        types = self.cluster.gpu_types
        if isinstance(costs, Mapping):
            unknown = sorted(set(map(str, costs)) - set(types))
            missing = [t for t in types if t not in costs]
            if unknown or missing:
                raise InvalidProblemError(f"costs must give a price for each GPU type {list(types)}; "
                                          f"unknown: {unknown}, missing: {missing}", field="costs")
            costs = [costs[t] for t in types]
        try:
            arr = np.array(costs, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise InvalidProblemError(f"costs must be a price per GPU type {list(types)}, got {costs!r}",
                                      field="costs") from None
        if arr.shape != (len(types),):
            raise InvalidProblemError(f"costs has {arr.size} entries, expected one per GPU type {list(types)}",
                                      field="costs")
        bad = ~np.isfinite(arr) | (arr <= 0)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise InvalidProblemError(f"costs[{types[j]!r}] is {arr[j]}; prices must be positive and finite",
                                      field="costs")
        return arr

    def _validate(self) -> None:
        T, ids, types = self.throughputs, self.job_ids, self.cluster.gpu_types
        bad = ~np.isfinite(T) | (T < 0)
        if bad.any():
            i, j = (int(v[0]) for v in np.nonzero(bad))
            raise InvalidProblemError(
                f"throughput of job {ids[i]!r} on GPU type {types[j]!r} is {T[i, j]}; throughputs must be "
                "finite steps/s >= 0 (use 0.0 where the job cannot run)", field="throughputs", job=ids[i])
        out = (T > 0) & _outside(T, THROUGHPUT_RANGE)
        if out.any():
            i, j = (int(v[0]) for v in np.nonzero(out))
            raise InvalidProblemError(
                f"throughput of job {ids[i]!r} on GPU type {types[j]!r} is {T[i, j]:g} steps/s; "
                f"{_range_text('positive throughputs', THROUGHPUT_RANGE, ' steps/s')} (0 where a job cannot "
                "run): express them in other units (e.g. steps per minute, or thousands of steps per second)",
                field="throughputs", job=ids[i])
        positive = np.where(T > 0, T, np.nan)
        with np.errstate(invalid="ignore"):
            low, high = np.nanmin(positive, axis=1, initial=np.inf), np.nanmax(positive, axis=1, initial=0.0)
        wide = np.flatnonzero(high > THROUGHPUT_SPREAD * low)
        if wide.size:
            i = int(wide[0])
            raise InvalidProblemError(
                f"the throughputs of job {ids[i]!r} range from {low[i]:g} to {high[i]:g} steps/s; allocopt supports "
                f"a factor of at most {THROUGHPUT_SPREAD:g} between one job's positive throughputs: a GPU type that "
                "much slower than the job's best is as good as unusable, give it 0", field="throughputs", job=ids[i])
        s = self.scale_factors
        if (s < 1).any():
            i = int(np.flatnonzero(s < 1)[0])
            raise InvalidProblemError(f"scale_factor of job {ids[i]!r} is {s[i]}; it must be >= 1 GPU",
                                      field="scale_factors", job=ids[i])
        max_capacity = int(self.capacity.max())
        if (s > max_capacity).any():
            i = int(np.flatnonzero(s > max_capacity)[0])
            raise InvalidProblemError(
                f"job {ids[i]!r} needs scale_factor={s[i]} GPUs but the largest GPU type has {max_capacity} "
                f"({self.cluster}); reduce its scale factor or add GPUs", field="scale_factors", job=ids[i])
        w = self.priority_weights
        if (w <= 0).any():
            i = int(np.flatnonzero(w <= 0)[0])
            raise InvalidProblemError(f"priority_weight of job {ids[i]!r} is {w[i]}; weights must be positive",
                                      field="priority_weights", job=ids[i])
        if _outside(w, WEIGHT_RANGE).any():
            i = int(np.flatnonzero(_outside(w, WEIGHT_RANGE))[0])
            raise InvalidProblemError(f"priority_weight of job {ids[i]!r} is {w[i]:g}; "
                                      f"{_range_text('priority weights', WEIGHT_RANGE)}: rescale the weights",
                                      field="priority_weights", job=ids[i])
        if self.num_jobs:
            idle = ~self.runnable.any(axis=1)
            if idle.any():
                i = int(np.flatnonzero(idle)[0])
                raise InvalidProblemError(
                    f"job {ids[i]!r} has zero throughput on every GPU type with at least its "
                    f"scale_factor={s[i]} GPUs (throughputs {dict(zip(types, T[i].tolist()))}, {self.cluster}); "
                    "give it a positive throughput on a type that fits it, or remove it",
                    field="throughputs", job=ids[i])
        self._validate_progress()

    def _validate_progress(self) -> None:
        """The per-job progress vectors and deadlines (what :meth:`with_progress` replaces)."""
        ids = self.job_ids
        for name in ("num_steps_remaining", "time_since_start", "time_isolated"):
            arr = getattr(self, name)
            if arr is not None and (arr < 0).any():
                i = int(np.flatnonzero(arr < 0)[0])
                raise InvalidProblemError(f"{name} of job {ids[i]!r} is {arr[i]}; it must be >= 0",
                                          field=name, job=ids[i])
        if self.slos is not None:
            if (self.slos <= 0).any():
                i = int(np.flatnonzero(self.slos <= 0)[0])
                raise InvalidProblemError(f"slo of job {ids[i]!r} is {self.slos[i]} s; deadlines must be "
                                          "positive seconds from now (inf for none)", field="slos", job=ids[i])
            if self.num_steps_remaining is None and np.isfinite(self.slos).any():
                i = int(np.flatnonzero(np.isfinite(self.slos))[0])
                raise InvalidProblemError(f"job {ids[i]!r} has a deadline (slo) but num_steps_remaining is "
                                          "not given; deadlines need the steps each job has left",
                                          field="num_steps_remaining", job=ids[i])
