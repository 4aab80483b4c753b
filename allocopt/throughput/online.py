"""Online throughput estimates from measured steps/s.

A :class:`ThroughputEstimator` keeps a smoothed throughput ``T[job, gpu type]``
(steps/s of the whole job on its ``scale_factor`` GPUs of that type) from the
measurements an executor or the simulator reports, and fills the cells never
measured with a prior, so that the next :class:`~allocopt.Problem` always has a
complete matrix.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from allocopt.errors import InvalidProblemError
from allocopt.throughput.table import ThroughputTable

_STATE_VERSION = 1


class ThroughputEstimator:
    """Exponential moving averages of measured throughput, with priors for unmeasured cells.

    Estimate of ``(job, gpu_type)``:

    * measured: the exponential moving average of its measurements. The first
      measurement sets it; each later one ``x`` with weight ``w`` moves it to
      ``(1 - a) * old + a * x`` with ``a = 1 - (1 - smoothing) ** w``, so one
      measurement of weight 2 counts as two equal measurements of weight 1;
    * never measured, the first of these that exists:

      1. the job's own prior (``add_job(..., prior=...)``);
      2. the table's value of the job's ``(model, scale_factor)``;
      3. a learned ratio: for each GPU type ``a`` on which the job was measured
         with positive steps/s and for which at least ``min_ratio_jobs`` other
         jobs were measured with positive steps/s on both ``a`` and
         ``gpu_type``, ``estimate[a] * r[a, gpu_type]`` with
         ``r = exp(median over those jobs of log(T[gpu_type] / T[a]))``; the
         geometric mean over such ``a``. Ratios are learned over all
         registered jobs, whatever their scale factor;
      4. ``default_steps_per_s``.

      Without any, :meth:`matrix` and :meth:`estimate` raise.

    Parameters
    ----------
    table : ThroughputTable or None
        Source of the table priors (jobs added with a ``model``); None: no table.
    gpu_types : sequence of str
        Distinct GPU types, the columns of :meth:`matrix`. Types missing from
        the table have no table prior.
    smoothing : float in (0, 1], default 0.5
        Weight of a new measurement of weight 1; 1 keeps only the latest.
    default_steps_per_s : float or mapping of str to float, optional
        Last-resort prior, for every GPU type or per type.
    min_ratio_jobs : int, default 1
        Jobs measured on both types needed before a type-to-type ratio is used.

    Examples
    --------
    >>> est = ThroughputEstimator(None, ["k80", "v100"], smoothing=0.5)
    >>> est.add_job("a"); est.add_job("b")
    >>> est.observe_many(["a", "a", "b"], ["k80", "v100", "k80"], [2.0, 6.0, 4.0])
    >>> est.observe("a", "k80", 4.0)
    >>> est.matrix()  # a on k80: 0.5 * 2 + 0.5 * 4; b on v100: 4 * (6 / 3), the ratio learned from a
    array([[3., 6.],
           [4., 8.]])
    """

    def __init__(self, table: ThroughputTable | None, gpu_types: Sequence[str], *, smoothing: float = 0.5,
                 default_steps_per_s: float | Mapping[str, float] | None = None, min_ratio_jobs: int = 1):
        if table is not None and not isinstance(table, ThroughputTable):
            raise InvalidProblemError(f"table must be a ThroughputTable or None, got {type(table).__name__}",
                                      field="table")
        self._table = table
        self._gpu_types = tuple(str(t) for t in gpu_types)
        self._col = {t: j for j, t in enumerate(self._gpu_types)}
        if len(self._col) != len(self._gpu_types) or not self._gpu_types:
            raise InvalidProblemError(f"gpu_types must be distinct and non-empty, got {list(self._gpu_types)}",
                                      field="gpu_types")
        if isinstance(smoothing, bool) or not isinstance(smoothing, numbers.Real) or not 0 < smoothing <= 1:
            raise InvalidProblemError(f"smoothing must be in (0, 1], got {smoothing!r}", field="smoothing")
        if isinstance(min_ratio_jobs, bool) or not isinstance(min_ratio_jobs, numbers.Integral) \
                or min_ratio_jobs < 1:
            raise InvalidProblemError(f"min_ratio_jobs must be an integer >= 1, got {min_ratio_jobs!r}",
                                      field="min_ratio_jobs")
        self._smoothing = float(smoothing)
        self._min_ratio_jobs = int(min_ratio_jobs)
        self._default = self._per_type(np.nan if default_steps_per_s is None else default_steps_per_s,
                                       "default_steps_per_s")
        k = len(self._gpu_types)
        self._ids: list[Hashable] = []
        self._row: dict[Hashable, int] = {}
        self._models: list[str | None] = []
        self._scales: list[int] = []
        self._value = np.full((0, k), np.nan)  # EMA; NaN where never measured
        self._count = np.zeros((0, k), dtype=np.int64)  # measurements per cell
        self._prior = np.full((0, k), np.nan)  # job's own or table prior; NaN where none
        self._ratios: tuple[np.ndarray, np.ndarray] | None = None  # cache of _log_ratios()

    # ----- jobs ------------------------------------------------------------------------
    @property
    def gpu_types(self) -> tuple[str, ...]:
        """GPU types, in column order."""
        return self._gpu_types

    @property
    def job_ids(self) -> tuple[Hashable, ...]:
        """Registered jobs, in row order (removing a job moves the last job into its row)."""
        return tuple(self._ids)

    @property
    def smoothing(self) -> float:
        """Weight of a new measurement of weight 1."""
        return self._smoothing

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, job_id: Hashable) -> bool:
        return job_id in self._row

    def add_job(self, job_id: Hashable, model: str | None = None, scale_factor: int = 1,
                prior: Mapping[str, float] | Sequence[float] | None = None) -> None:
        """Register a job before observing it.

        Parameters
        ----------
        job_id : hashable
            New, distinct id (str or int if the state is to be saved as JSON).
        model : str, optional
            Model name in the table; its ``(model, scale_factor)`` row is the
            prior. Must be in the table when there is one.
        scale_factor : int, default 1
            GPUs the job uses.
        prior : mapping of str to float or array-like of shape (n_gpu_types,), optional
            The job's own prior steps/s per GPU type (some types may be
            omitted, or NaN in an array); overrides the table.
        """
        try:
            if job_id in self._row:
                raise InvalidProblemError(f"job {job_id!r} is already registered; remove_job it first",
                                          field="job_id", job=job_id)
        except TypeError:
            raise InvalidProblemError(f"job id {job_id!r} is not hashable", field="job_id") from None
        if isinstance(scale_factor, bool) or not isinstance(scale_factor, numbers.Integral) or scale_factor < 1:
            raise InvalidProblemError(f"scale_factor of job {job_id!r} is {scale_factor!r}; give an integer >= 1",
                                      field="scale_factor", job=job_id)
        row = np.full(len(self._gpu_types), np.nan)
        if model is not None and self._table is not None:
            known = [t for t in self._gpu_types if t in self._table.gpu_types]
            row[[self._col[t] for t in known]] = self._table.row(model, int(scale_factor), known)
        if prior is not None:
            own = self._per_type(prior, "prior", job_id)
            row = np.where(np.isnan(own), row, own)
        n = len(self._ids)
        if n == self._value.shape[0]:  # grow by doubling
            extra = max(n, 8)
            self._value = np.vstack([self._value, np.full((extra, len(self._gpu_types)), np.nan)])
            self._count = np.vstack([self._count, np.zeros((extra, len(self._gpu_types)), dtype=np.int64)])
            self._prior = np.vstack([self._prior, np.full((extra, len(self._gpu_types)), np.nan)])
        self._value[n], self._count[n], self._prior[n] = np.nan, 0, row
        self._ids.append(job_id)
        self._row[job_id] = n
        self._models.append(None if model is None else str(model))
        self._scales.append(int(scale_factor))

    def remove_job(self, job_id: Hashable) -> None:
        """Forget a job and its measurements (they stop informing the learned ratios)."""
        i, last = self._rows([job_id])[0], len(self._ids) - 1
        for arr in (self._value, self._count, self._prior):
            arr[i] = arr[last]
        for seq in (self._ids, self._models, self._scales):
            seq[i] = seq[last]
            seq.pop()
        del self._row[job_id]
        if i != last:
            self._row[self._ids[i]] = i
        self._ratios = None

    # ----- measurements ----------------------------------------------------------------
    def observe(self, job_id: Hashable, gpu_type: str, steps_per_s: float, *, weight: float = 1.0) -> None:
        """Record one measured throughput (steps/s of the whole job) of ``job_id`` on ``gpu_type``.

        ``weight`` > 0: how much the measurement counts, e.g. its duration in
        rounds; see the class docstring for the update rule.
        """
        self.observe_many([job_id], [gpu_type], [steps_per_s], weights=[weight])

    def observe_many(self, job_ids: Sequence[Hashable], gpu_types: Sequence[str] | str, values: Any, *,
                     weights: Any = None) -> None:
        """Record many measurements at once, applied in order (vectorized).

        Parameters
        ----------
        job_ids : sequence of hashable, length n
        gpu_types : sequence of str of length n, or one str for all
        values : array-like of shape (n,)
            Measured steps/s, finite and >= 0.
        weights : float or array-like of shape (n,), optional
            Default 1.0. Nothing is recorded if any input is invalid.
        """
        rows = self._rows(job_ids)
        n = rows.size
        cols = self._cols([gpu_types] * n if isinstance(gpu_types, str) else gpu_types)
        if cols.size != n:
            raise InvalidProblemError(f"gpu_types has {cols.size} entries, expected {n}", field="gpu_type")
        x = self._vector(values, "steps_per_s", n=n)
        bad = ~np.isfinite(x) | (x < 0)
        if bad.any():
            p = int(np.flatnonzero(bad)[0])
            raise InvalidProblemError(f"measured throughput of job {self._ids[rows[p]]!r} on "
                                      f"{self._gpu_types[cols[p]]!r} is {x[p]}; give finite steps/s >= 0",
                                      field="steps_per_s", job=self._ids[rows[p]])
        w = self._vector(1.0 if weights is None else weights, "weight", n=n)
        if not ((w > 0) & np.isfinite(w)).all():
            p = int(np.flatnonzero(~((w > 0) & np.isfinite(w)))[0])
            raise InvalidProblemError(f"weight of the measurement of job {self._ids[rows[p]]!r} is {w[p]}; give "
                                      "a finite weight > 0", field="weight", job=self._ids[rows[p]])
        alpha = 1.0 - (1.0 - self._smoothing) ** w
        # Repeated cells are applied in order: pass r updates each cell's r-th measurement.
        cell = rows * len(self._gpu_types) + cols
        order = np.argsort(cell, kind="stable")
        starts = np.r_[True, cell[order][1:] != cell[order][:-1]]
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n) - np.maximum.accumulate(np.where(starts, np.arange(n), 0))
        for r in range(int(rank.max(initial=-1)) + 1):
            sel = rank == r
            i, j, a = rows[sel], cols[sel], alpha[sel]
            old = self._value[i, j]
            self._value[i, j] = np.where(self._count[i, j] > 0, (1.0 - a) * old + a * x[sel], x[sel])
            self._count[i, j] += 1
        self._ratios = None

    # ----- estimates -------------------------------------------------------------------
    def matrix(self, job_ids: Sequence[Hashable] | None = None,
               gpu_types: Sequence[str] | None = None) -> np.ndarray:
        """Estimated steps/s, shape (n_jobs, n_gpu_types).

        Parameters
        ----------
        job_ids : sequence of hashable, optional
            Default: all registered jobs, in :attr:`job_ids` order.
        gpu_types : sequence of str, optional
            Default: :attr:`gpu_types` (pass ``cluster.gpu_types`` for a Problem).
        """
        rows = np.arange(len(self._ids)) if job_ids is None else self._rows(job_ids)
        cols = np.arange(len(self._gpu_types)) if gpu_types is None else self._cols(gpu_types)
        out = self._estimates(rows)[:, cols]
        missing = np.isnan(out)
        if missing.any():
            p, q = (int(v[0]) for v in np.nonzero(missing))
            job, gpu = self._ids[rows[p]], self._gpu_types[cols[q]]
            raise InvalidProblemError(
                f"job {job!r} has no measurement on {gpu!r} and no prior for it (no own prior, no table value, "
                f"no learned ratio from a type it was measured on); pass default_steps_per_s=..., a model in the "
                "table or add_job(..., prior=...)", field="prior", job=job)
        return out

    def estimate(self, job_id: Hashable, gpu_type: str) -> float:
        """Estimated steps/s of ``job_id`` on ``gpu_type``."""
        return float(self.matrix([job_id], [gpu_type])[0, 0])

    def measured_mask(self, job_ids: Sequence[Hashable] | None = None,
                      gpu_types: Sequence[str] | None = None) -> np.ndarray:
        """Bool (n_jobs, n_gpu_types): True where the cell has at least one measurement."""
        return self.observation_counts(job_ids, gpu_types) > 0

    def observation_counts(self, job_ids: Sequence[Hashable] | None = None,
                           gpu_types: Sequence[str] | None = None) -> np.ndarray:
        """Int (n_jobs, n_gpu_types): number of measurements of each cell."""
        rows = np.arange(len(self._ids)) if job_ids is None else self._rows(job_ids)
        cols = np.arange(len(self._gpu_types)) if gpu_types is None else self._cols(gpu_types)
        return self._count[np.ix_(rows, cols)]

    def _estimates(self, rows: np.ndarray) -> np.ndarray:
        """Measured EMA, else own/table prior, else learned ratio, else default; NaN where none."""
        value, measured = self._value[rows], self._count[rows] > 0
        prior = self._prior[rows]
        need = np.isnan(prior) & ~measured
        if need.any():
            log_ratio, _ = self._log_ratios()
            with np.errstate(divide="ignore", invalid="ignore"):
                base = np.where(measured & (value > 0), np.log(value), np.nan)
            candidates = base[:, :, None] + log_ratio[None, :, :]  # (job, measured type a, target type b)
            valid = ~np.isnan(candidates)
            count = valid.sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                learned = np.exp(np.where(valid, candidates, 0.0).sum(axis=1) / count)
            prior = np.where(need & (count > 0), learned, prior)
            prior = np.where(np.isnan(prior), self._default[None, :], prior)
        return np.where(measured, value, prior)

    def _log_ratios(self) -> tuple[np.ndarray, np.ndarray]:
        """``L[a, b]``: median of ``log(T_b / T_a)`` over jobs measured with positive steps/s on both
        (NaN with fewer than ``min_ratio_jobs`` such jobs), and those job counts."""
        if self._ratios is None:
            n, k = len(self._ids), len(self._gpu_types)
            value = self._value[:n]
            with np.errstate(divide="ignore", invalid="ignore"):
                logs = np.where((self._count[:n] > 0) & (value > 0), np.log(value), np.nan)
            diff = logs[:, None, :] - logs[:, :, None]  # (job, a, b): log T_b - log T_a
            counts = (~np.isnan(diff)).sum(axis=0)
            enough = (counts >= self._min_ratio_jobs) & ~np.eye(k, dtype=bool)
            log_ratio = np.full((k, k), np.nan)
            if enough.any():
                log_ratio[enough] = np.nanmedian(diff[:, enough], axis=0)
            self._ratios = (log_ratio, counts)
        return self._ratios

    def learned_ratios(self) -> np.ndarray:
        """``r[a, b]``: learned ratio of steps/s on type ``b`` to type ``a``, shape (n_gpu_types,
        n_gpu_types); NaN where fewer than ``min_ratio_jobs`` jobs were measured on both."""
        return np.exp(self._log_ratios()[0])

    # ----- state -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A JSON-serializable snapshot (job ids must be str or int); :meth:`from_state` restores it.

        Jobs' priors are stored as resolved from the table, so restoring needs
        the table only to add more jobs with a model.
        """
        bad = next((j for j in self._ids if isinstance(j, bool) or not isinstance(j, (str, int))), None)
        if bad is not None:
            raise InvalidProblemError(f"job id {bad!r} cannot be saved as JSON; use str or int job ids",
                                      field="job_id", job=bad)
        n = len(self._ids)

        def nullable(arr: np.ndarray) -> list[list[float | None]]:
            return [[None if math.isnan(v) else v for v in row] for row in arr.tolist()]

        return {"version": _STATE_VERSION, "gpu_types": list(self._gpu_types), "smoothing": self._smoothing,
                "min_ratio_jobs": self._min_ratio_jobs, "default_steps_per_s": nullable(self._default[None])[0],
                "jobs": [{"id": job, "model": model, "scale_factor": scale, "prior": prior, "estimate": value,
                          "observations": count}
                         for job, model, scale, prior, value, count in zip(
                             self._ids, self._models, self._scales, nullable(self._prior[:n]),
                             nullable(self._value[:n]), self._count[:n].tolist())]}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], table: ThroughputTable | None = None) -> ThroughputEstimator:
        """Restore an estimator saved with :meth:`state_dict` (``table``: for jobs added later)."""
        try:
            if state["version"] != _STATE_VERSION:
                raise InvalidProblemError(f"state version {state['version']!r} is not {_STATE_VERSION}",
                                          field="version")
            default = dict(zip(state["gpu_types"], state["default_steps_per_s"]))
            est = cls(table, state["gpu_types"], smoothing=state["smoothing"],
                      min_ratio_jobs=state["min_ratio_jobs"],
                      default_steps_per_s={t: v for t, v in default.items() if v is not None})
            jobs = list(state["jobs"])
            for job in jobs:
                est._restore_job(job)
        except (KeyError, TypeError) as err:
            raise InvalidProblemError(f"malformed estimator state: {err!r}; pass a dict from "
                                      "ThroughputEstimator.state_dict()", field="state") from None
        return est

    def _restore_job(self, job: Mapping[str, Any]) -> None:
        k = len(self._gpu_types)
        prior = np.array([np.nan if v is None else v for v in job["prior"]], dtype=np.float64)
        value = np.array([np.nan if v is None else v for v in job["estimate"]], dtype=np.float64)
        count = np.array(job["observations"], dtype=np.int64)
        if prior.shape != (k,) or value.shape != (k,) or count.shape != (k,) or (count < 0).any() \
                or (np.isnan(value) != (count == 0)).any():
            raise InvalidProblemError(f"malformed state of job {job['id']!r}: prior, estimate and observations "
                                      f"need {k} values, estimates exactly where observations > 0",
                                      field="state", job=job["id"])
        table, self._table = self._table, None  # the saved prior already includes the table's
        try:
            self.add_job(job["id"], job["model"], job["scale_factor"], prior=prior)
        finally:
            self._table = table
        i = self._row[job["id"]]
        self._value[i], self._count[i] = value, count
        self._ratios = None

    # ----- helpers -----------------------------------------------------------------------
    def _rows(self, job_ids: Sequence[Hashable]) -> np.ndarray:
        try:
            return np.array([self._row[j] for j in job_ids], dtype=np.int64)
        except (KeyError, TypeError):
            unknown = next(j for j in job_ids if not _known(self._row, j))
            raise InvalidProblemError(f"unknown job {unknown!r}; register it with add_job first",
                                      field="job_id", job=unknown) from None

    def _cols(self, gpu_types: Sequence[str]) -> np.ndarray:
        try:
            return np.array([self._col[t] for t in gpu_types], dtype=np.int64)
        except (KeyError, TypeError):
            unknown = next(t for t in gpu_types if not _known(self._col, t))
            raise InvalidProblemError(f"unknown GPU type {unknown!r}; the estimator has "
                                      f"{list(self._gpu_types)}", field="gpu_type") from None

    def _per_type(self, values: Mapping[str, Any] | Any, name: str, job: Hashable = None) -> np.ndarray:
        """Steps/s per GPU type (NaN: none) from a mapping (types not given: NaN), a vector or a
        scalar, validated."""
        if isinstance(values, Mapping):
            unknown = [t for t in values if not _known(self._col, t)]
            if unknown:
                raise InvalidProblemError(f"{name} names unknown GPU type(s) {unknown}; the estimator has "
                                          f"{list(self._gpu_types)}", field=name, job=job)
            out = np.full(len(self._gpu_types), np.nan)
            out[self._cols(list(values))] = self._vector(list(values.values()), name, job, n=len(values))
        else:
            out = self._vector(values, name, job)
        if (out < 0).any() or np.isinf(out).any():
            raise InvalidProblemError(f"{name} has {dict(zip(self._gpu_types, out.tolist()))}; give finite "
                                      "steps/s >= 0", field=name, job=job)
        return out

    def _vector(self, values: Any, name: str, job: Hashable = None, *, n: int | None = None) -> np.ndarray:
        """Float vector of length ``n`` (default: the number of GPU types); scalars broadcast."""
        n = len(self._gpu_types) if n is None else n
        raw = np.asarray(values)
        if raw.dtype.kind not in "iuf" or raw.ndim > 1 or raw.size not in (1, n):
            raise InvalidProblemError(f"{name} must be a number or {n} numbers, got {values!r}", field=name,
                                      job=job)
        return np.broadcast_to(raw.astype(np.float64), (n,)).copy()


def _known(index: Mapping[Any, int], key: Any) -> bool:
    try:
        return key in index
    except TypeError:
        return False


__all__ = ["ThroughputEstimator"]
