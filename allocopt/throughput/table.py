"""Measured throughputs of job types (model, scale factor) on GPU types.

A :class:`ThroughputTable` holds one row per measured ``(model, scale_factor)``
entry and one column per GPU type: the steps per second of the whole job on
``scale_factor`` GPUs of that type, running alone (0.0 where it cannot run).
It turns lists of job types into :class:`~allocopt.Problem` throughput matrices
and draws random workloads from them.
"""

from __future__ import annotations

import difflib
import json
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from types import MappingProxyType
from typing import Any

import numpy as np

from allocopt.cluster import Cluster
from allocopt.errors import InvalidProblemError
from allocopt.problem import Problem

#: Gavel's distribution of job scale factors (GPUs per job) in its generated workloads.
DEFAULT_SCALE_FACTOR_PROBS: Mapping[int, float] = MappingProxyType({1: 0.7, 2: 0.1, 4: 0.15, 8: 0.05})

_GAVEL_FILE = "gavel_throughputs.json"


class ThroughputTable:
    """Isolated throughput of each ``(model, scale_factor)`` entry on each GPU type.

    Build one with :meth:`gavel` (Gavel's measurements on k80, p100 and v100,
    shipped with allocopt) or :meth:`from_records` (your own measurements).
    Tables are immutable.

    Parameters
    ----------
    entries : sequence of (str, int)
        Distinct ``(model, scale_factor)`` pairs, one per row.
    gpu_types : sequence of str
        Distinct GPU type names, one per column.
    throughputs_steps_per_s : array-like of shape (n_entries, n_gpu_types)
        Steps/s of the whole job on ``scale_factor`` GPUs of each type;
        finite and >= 0, with 0.0 where the job cannot run.
    """

    def __init__(self, entries: Sequence[tuple[str, int]], gpu_types: Sequence[str],
                 throughputs_steps_per_s: Any):
        self._entries = tuple((str(m), int(s)) for m, s in entries)
        self._gpu_types = tuple(str(t) for t in gpu_types)
        T = np.array(throughputs_steps_per_s, dtype=np.float64)
        if T.shape != (len(self._entries), len(self._gpu_types)):
            raise InvalidProblemError(
                f"throughputs_steps_per_s has shape {T.shape}, expected (n_entries, n_gpu_types) = "
                f"({len(self._entries)}, {len(self._gpu_types)})", field="throughputs_steps_per_s")
        if len(set(self._gpu_types)) != len(self._gpu_types):
            raise InvalidProblemError(f"GPU types must be distinct, got {list(self._gpu_types)}",
                                      field="gpu_types")
        self._row = {entry: i for i, entry in enumerate(self._entries)}
        if len(self._row) != len(self._entries):
            dup = next(e for i, e in enumerate(self._entries) if self._row[e] != i)
            raise InvalidProblemError(f"entry (model {dup[0]!r}, scale_factor {dup[1]}) appears twice",
                                      field="entries")
        bad_scale = [e for e in self._entries if e[1] < 1]
        if bad_scale:
            raise InvalidProblemError(f"model {bad_scale[0][0]!r} has scale_factor {bad_scale[0][1]}; "
                                      "scale factors must be >= 1 GPU", field="scale_factor")
        bad = ~np.isfinite(T) | (T < 0)
        if bad.any():
            i, j = (int(v[0]) for v in np.nonzero(bad))
            raise InvalidProblemError(
                f"throughput of model {self._entries[i][0]!r} at scale_factor {self._entries[i][1]} on GPU "
                f"type {self._gpu_types[j]!r} is {T[i, j]}; give finite steps/s >= 0 (0.0 where it cannot run)",
                field="throughputs_steps_per_s")
        T.setflags(write=False)
        self._T = T
        self._models = tuple(dict.fromkeys(m for m, _ in self._entries))
        self._scales: dict[str, tuple[int, ...]] = {m: () for m in self._models}
        for m, s in self._entries:
            self._scales[m] += (s,)
        position = {m: k for k, m in enumerate(self._models)}
        self._model_of = np.array([position[m] for m, _ in self._entries], dtype=np.int64)
        self._scale_of = np.array([s for _, s in self._entries], dtype=np.int64)

    # ----- construction ----------------------------------------------------------
    @classmethod
    def gavel(cls) -> ThroughputTable:
        """Gavel's measured isolated throughputs (26 models, scale factors 1-8, k80/p100/v100).

        From https://github.com/stanford-futuredata/gavel (MIT License); see
        ``allocopt/data/README.md`` for how the shipped copy was derived.
        """
        text = resources.files("allocopt").joinpath("data", _GAVEL_FILE).read_text(encoding="utf-8")
        return cls.from_records(json.loads(text)["jobs"])

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]]) -> ThroughputTable:
        """Build from one record per measured entry.

        Parameters
        ----------
        records : iterable of mapping
            Each ``{"model": str, "scale_factor": int, "throughputs_steps_per_s":
            {gpu_type: steps_per_s}}`` (the layout of :meth:`to_records`). Every
            record must give every GPU type named in any record (0.0 where the
            job cannot run); GPU types keep their order of first appearance.

        Examples
        --------
        >>> table = ThroughputTable.from_records([
        ...     {"model": "bert", "scale_factor": 1, "throughputs_steps_per_s": {"a100": 9.0, "t4": 2.5}}])
        >>> table.throughput("bert", 1, "t4")
        2.5
        """
        records = list(records)
        entries: list[tuple[str, int]] = []
        for k, rec in enumerate(records):
            if not isinstance(rec, Mapping) or not {"model", "scale_factor", "throughputs_steps_per_s"} <= set(rec):
                raise InvalidProblemError(f"records[{k}] must be a mapping with 'model', 'scale_factor' and "
                                          "'throughputs_steps_per_s'", field=f"records[{k}]")
            scale = rec["scale_factor"]
            if isinstance(scale, bool) or not isinstance(scale, (int, np.integer)):
                raise InvalidProblemError(f"records[{k}] (model {rec['model']!r}) has scale_factor {scale!r}; "
                                          "give an integer number of GPUs", field="scale_factor")
            if not isinstance(rec["throughputs_steps_per_s"], Mapping):
                raise InvalidProblemError(f"records[{k}] (model {rec['model']!r}): throughputs_steps_per_s must "
                                          "map GPU type to steps/s", field="throughputs_steps_per_s")
            entries.append((str(rec["model"]), int(scale)))
        gpu_types = tuple(dict.fromkeys(t for rec in records for t in rec["throughputs_steps_per_s"]))
        T = np.empty((len(records), len(gpu_types)))
        for k, rec in enumerate(records):
            row = rec["throughputs_steps_per_s"]
            missing = [t for t in gpu_types if t not in row]
            if missing:
                raise InvalidProblemError(f"records[{k}] (model {entries[k][0]!r}, scale_factor {entries[k][1]}) "
                                          f"has no throughput for GPU type(s) {missing}; give 0.0 where the job "
                                          "cannot run", field="throughputs_steps_per_s")
            try:
                T[k] = [float(row[t]) for t in gpu_types]
            except (TypeError, ValueError) as err:
                raise InvalidProblemError(f"records[{k}] (model {entries[k][0]!r}, scale_factor "
                                          f"{entries[k][1]}) has a non-numeric throughput: {err}",
                                          field="throughputs_steps_per_s") from None
        return cls(entries, gpu_types, T)

    def to_records(self) -> list[dict[str, Any]]:
        """One record per entry, in the layout :meth:`from_records` reads."""
        return [{"model": m, "scale_factor": s, "throughputs_steps_per_s": dict(zip(self._gpu_types, row))}
                for (m, s), row in zip(self._entries, self._T.tolist())]

    # ----- lookups -------------------------------------------------------------------
    @property
    def gpu_types(self) -> tuple[str, ...]:
        """GPU types, in column order."""
        return self._gpu_types

    @property
    def models(self) -> tuple[str, ...]:
        """Model names, in order of first appearance."""
        return self._models

    @property
    def entries(self) -> tuple[tuple[str, int], ...]:
        """``(model, scale_factor)`` of each row."""
        return self._entries

    @property
    def throughputs_steps_per_s(self) -> np.ndarray:
        """Read-only array of shape (n_entries, n_gpu_types), rows in :attr:`entries` order."""
        return self._T

    def __len__(self) -> int:
        return len(self._entries)

    def scale_factors(self, model: str) -> tuple[int, ...]:
        """Scale factors (GPUs per job) measured for ``model``, in table order."""
        try:
            return self._scales[model]
        except KeyError:
            raise self._unknown_model(model) from None

    def throughput(self, model: str, scale_factor: int, gpu_type: str) -> float:
        """Steps/s of ``model`` on ``scale_factor`` GPUs of ``gpu_type`` (0.0: cannot run)."""
        return float(self._T[self._row_index(model, scale_factor), self._columns([gpu_type])[0]])

    def row(self, model: str, scale_factor: int, gpu_types: Sequence[str] | None = None) -> np.ndarray:
        """Steps/s of ``model`` at ``scale_factor`` on each of ``gpu_types``
        (default: all, in column order), shape (len(gpu_types),)."""
        cols = self._columns(self._gpu_types if gpu_types is None else gpu_types)
        return self._T[self._row_index(model, scale_factor), cols]

    def problem(self, jobs: Sequence[tuple[str, int]], cluster: Cluster, *,
                job_ids: Sequence[Any] | None = None, priority_weights: Any = None) -> Problem:
        """A :class:`~allocopt.Problem` of the given job types on ``cluster``.

        Parameters
        ----------
        jobs : sequence of (str, int)
            ``(model, scale_factor)`` of each job; each must be in the table.
        cluster : Cluster
            Its GPU types must all be in the table.
        job_ids : sequence of hashable, optional
            Default ``0 .. n_jobs - 1``.
        priority_weights : array-like of shape (n_jobs,), optional
            Default 1.0 for every job.
        """
        cols = self._columns(cluster.gpu_types)
        rows = np.fromiter((self._row_index(m, s) for m, s in jobs), dtype=np.int64, count=len(jobs))
        return Problem(self._T[np.ix_(rows, cols)], cluster, job_ids=job_ids,
                       scale_factors=np.array([s for _, s in jobs], dtype=np.int64),
                       priority_weights=priority_weights)

    # ----- sampling --------------------------------------------------------------------
    def sample_jobs(self, cluster: Cluster, n_jobs: int, *, seed: int | np.random.Generator,
                    scale_factor_probs: Mapping[int, float] = DEFAULT_SCALE_FACTOR_PROBS
                    ) -> list[tuple[str, int]]:
        """Draw ``n_jobs`` job types ``(model, scale_factor)`` that can run on ``cluster``.

        The model is uniform over the models with at least one eligible entry;
        the scale factor is drawn by ``scale_factor_probs`` renormalized over that
        model's eligible entries. An entry is eligible when its scale factor has
        positive probability and the job has positive throughput on a GPU type
        of which ``cluster`` has at least ``scale_factor`` GPUs.

        Parameters
        ----------
        cluster : Cluster
        n_jobs : int
        seed : int or numpy.random.Generator
        scale_factor_probs : mapping of int to float
            Relative weight of each scale factor (GPUs per job).
        """
        if isinstance(n_jobs, bool) or not isinstance(n_jobs, (int, np.integer)) or n_jobs < 0:
            raise InvalidProblemError(f"n_jobs must be a non-negative integer, got {n_jobs!r}", field="n_jobs")
        scales, weights = _distribution(scale_factor_probs, "scale_factor_probs", integer=True)
        prob = dict(zip(scales.tolist(), weights.tolist()))
        fits = ((self._T[:, self._columns(cluster.gpu_types)] > 0)
                & (self._scale_of[:, None] <= cluster.capacity[None, :])).any(axis=1)
        entry_weight = np.where(fits, [prob.get(s, 0.0) for s in self._scale_of.tolist()], 0.0)
        eligible = np.flatnonzero(np.bincount(self._model_of, weights=entry_weight,
                                              minlength=len(self._models)) > 0)
        if eligible.size == 0:
            raise InvalidProblemError(
                f"no entry of the table fits {cluster} with scale factors {sorted(prob)}: every job needs "
                "positive throughput on a GPU type with at least scale_factor GPUs", field="scale_factor_probs")
        rng = np.random.default_rng(seed)
        picked = rng.integers(eligible.size, size=n_jobs)
        rows = np.empty(n_jobs, dtype=np.int64)
        for k, model in enumerate(eligible.tolist()):  # one vectorized draw per model
            jobs = np.flatnonzero(picked == k)
            candidates = np.flatnonzero((self._model_of == model) & (entry_weight > 0))
            p = entry_weight[candidates] / entry_weight[candidates].sum()
            rows[jobs] = candidates[rng.choice(candidates.size, size=jobs.size, p=p)]
        return [self._entries[i] for i in rows.tolist()]

    def sample_problem(self, cluster: Cluster, n_jobs: int, *, seed: int | np.random.Generator,
                       scale_factor_probs: Mapping[int, float] = DEFAULT_SCALE_FACTOR_PROBS,
                       priority_weights: Mapping[float, float] | None = None) -> Problem:
        """A random :class:`~allocopt.Problem` of ``n_jobs`` jobs on ``cluster``.

        The jobs are ``sample_jobs(cluster, n_jobs, seed=seed, ...)`` for an
        integer ``seed``, in order, with ids ``"job-000"``, ``"job-001"``, ...
        The result depends only on the table, the arguments and ``seed``.

        Parameters
        ----------
        cluster : Cluster
            Its GPU types must all be in the table.
        n_jobs : int
        seed : int or numpy.random.Generator
        scale_factor_probs : mapping of int to float, default ``{1: 0.7, 2: 0.1, 4: 0.15, 8: 0.05}``
            Relative weight of each scale factor (GPUs per job), Gavel's default.
        priority_weights : mapping of float to float, optional
            Relative weight of each priority weight, e.g. ``{1: 0.8, 2: 0.2}``;
            default: every job has priority weight 1.

        Examples
        --------
        >>> import allocopt
        >>> table = ThroughputTable.gavel()
        >>> problem = table.sample_problem(allocopt.Cluster({"v100": 4, "k80": 4}), 3, seed=0)
        >>> problem.job_ids
        ('job-000', 'job-001', 'job-002')
        """
        rng = np.random.default_rng(seed)
        jobs = self.sample_jobs(cluster, n_jobs, seed=rng, scale_factor_probs=scale_factor_probs)
        weights = None
        if priority_weights is not None:
            values, probs = _distribution(priority_weights, "priority_weights", integer=False)
            weights = values[rng.choice(values.size, size=n_jobs, p=probs)]
        width = max(3, len(str(n_jobs - 1)))
        return self.problem(jobs, cluster, job_ids=[f"job-{i:0{width}d}" for i in range(n_jobs)],
                            priority_weights=weights)

    # ----- helpers -------------------------------------------------------------------------
    def _row_index(self, model: str, scale_factor: int) -> int:
        try:
            return self._row[(model, scale_factor)]
        except (KeyError, TypeError):
            measured = ", ".join(map(str, self.scale_factors(model)))  # raises for an unknown model
            raise InvalidProblemError(f"model {model!r} has no measurement at scale_factor={scale_factor!r}; "
                                      f"measured scale factors: {measured}", field="scale_factor") from None

    def _columns(self, gpu_types: Sequence[str]) -> np.ndarray:
        try:
            return np.array([self._gpu_types.index(t) for t in gpu_types], dtype=np.int64)
        except ValueError:
            unknown = [t for t in gpu_types if t not in self._gpu_types]
            raise InvalidProblemError(f"unknown GPU type(s) {unknown}; the throughput table has "
                                      f"{list(self._gpu_types)}", field="gpu_type") from None

    def _unknown_model(self, model: str) -> InvalidProblemError:
        text = str(model)
        close = [m for m in self._models if text and m.lower().startswith(text.lower())][:3] \
            or difflib.get_close_matches(text, self._models, n=3)
        hint = f"did you mean {' or '.join(map(repr, close))}?" if close else \
            f"see ThroughputTable.models for all {len(self._models)}, e.g. {list(self._models[:3])}"
        return InvalidProblemError(f"unknown model {model!r}; {hint}", field="model")

    def __repr__(self) -> str:
        return (f"ThroughputTable({len(self._models)} models, {len(self._entries)} entries, "
                f"gpu_types={self._gpu_types})")


def _distribution(probs: Mapping[Any, float], name: str, *, integer: bool) -> tuple[np.ndarray, np.ndarray]:
    """Values and normalized probabilities of a ``{value: weight}`` mapping."""
    if not isinstance(probs, Mapping) or not probs:
        raise InvalidProblemError(f"{name} must be a non-empty mapping of value to probability", field=name)
    kind = numbers.Integral if integer else numbers.Real
    if any(isinstance(v, bool) or not isinstance(v, kind) or not v > 0 for v in probs):
        what = "positive integers" if integer else "positive numbers"
        raise InvalidProblemError(f"{name} keys must be {what}, got {list(probs)}", field=name)
    raw = list(probs.values())
    if any(isinstance(w, bool) or not isinstance(w, numbers.Real) or not 0 <= w < math.inf for w in raw) \
            or not sum(raw) > 0:
        raise InvalidProblemError(f"{name} values must be finite probabilities >= 0 with a positive sum, "
                                  f"got {raw}", field=name)
    values = np.array(list(probs), dtype=np.int64 if integer else np.float64)
    weights = np.array(raw, dtype=np.float64)
    return values, weights / weights.sum()


__all__ = ["DEFAULT_SCALE_FACTOR_PROBS", "ThroughputTable"]
