"""Sia/Pollux application profiles: measured step times per placement, gradient statistics.

A profile directory holds one folder per application::

    <app>/placements-<gpu type>.csv    local_bsz, step_time, sync_time, placement
    <app>/scalability-<gpu type>.csv   num_nodes, num_replicas, local_bsz, step_time, sync_time
    <app>/validation-<batch size>.csv  progress, iteration, metric, grad_sqr, grad_var
    seed_profiles/<app>.csv            gpu_type, local_bsz, placement, step_time, sync_time (1 GPU)

(columns in any order; extra columns are ignored). A placement is the GPUs
used on each node as a digit string: ``"44"`` is 2 nodes x 4 GPUs. Times are
seconds per iteration of one micro-batch of ``local_bsz`` samples per GPU:
``step_time`` is the whole iteration, synchronization included, and
``sync_time`` the part spent waiting for the gradient all-reduce after the
last backward pass, so the compute time of a micro-batch is
``step_time - sync_time`` -- how the Pollux and Sia simulators read these
files (``step_time + (step_time - sync_time) * accum_steps`` per iteration
with accumulation). :class:`ApplicationProfile` fits a
:class:`~allocopt.throughput.goodput.PerfParams` per (application, GPU type),
builds its :class:`~allocopt.throughput.goodput.GoodputModel` and gives a
simulator the true times of any placement. A copy of part of Sia's profiles
ships with allocopt (:func:`shipped_profiles_dir`).
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from scipy.interpolate import LinearNDInterpolator

from allocopt.errors import InvalidProblemError, ProfileFormatError
from allocopt.throughput.goodput import (DEFAULT_LOSS, DEFAULT_LOSS_SCALE, GoodputModel, GradParams, PerfParams,
                                         fit_perf_params)

#: GPU type names of Sia's seed profiles mapped to the profile file suffix with the same
#: 1-GPU measurements (found by matching rows): T4 nodes are ``aws``, V100 ``azure``, A100 ``dgx-ext``.
SEED_GPU_TYPES: Mapping[str, str] = {"t4": "aws", "v100": "azure", "dgx": "dgx-ext", "rtx": "rtx", "quad": "quad"}

_SEED_DIR = "seed_profiles"
_PLACEMENTS = re.compile(r"placements-(.+)\.csv")
_VALIDATION = re.compile(r"validation-(\d+)\.csv")


# ----- observations -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Observations:
    """Measured iterations, one row each (read-only arrays of equal length).

    Attributes
    ----------
    num_nodes, num_replicas, local_bsz : ndarray of int
        Nodes, GPUs and micro-batch size (samples per GPU).
    iter_time_s : ndarray of float
        Seconds per iteration (the files' ``step_time``), synchronization included.
    sync_time_s : ndarray of float
        Seconds of it spent in the gradient all-reduce (``sync_time``).
    placement : ndarray of str
        GPUs per node as digits (e.g. ``"44"``), ``""`` where only the node and
        replica counts are known (scalability rows).
    origin : ndarray of str
        ``"file:line"`` of each row, for error messages.
    """

    num_nodes: np.ndarray
    num_replicas: np.ndarray
    local_bsz: np.ndarray
    iter_time_s: np.ndarray
    sync_time_s: np.ndarray
    placement: np.ndarray
    origin: np.ndarray

    def __post_init__(self) -> None:
        for name in ("num_nodes", "num_replicas", "local_bsz", "iter_time_s", "sync_time_s", "placement", "origin"):
            getattr(self, name).setflags(write=False)

    def __len__(self) -> int:
        return int(self.num_nodes.size)

    @property
    def compute_time_s(self) -> np.ndarray:
        """Compute seconds of one micro-batch, ``iter_time_s - sync_time_s``."""
        return self.iter_time_s - self.sync_time_s

    def select(self, rows: Any) -> Observations:
        """The rows picked by a boolean mask, index array or index."""
        rows = np.atleast_1d(rows)
        return Observations(*(getattr(self, f)[rows] for f in _OBS_FIELDS))

    @staticmethod
    def concat(parts: list[Observations]) -> Observations:
        """The rows of several observation sets, in order."""
        return Observations(*(np.concatenate([getattr(p, f) for p in parts]) for f in _OBS_FIELDS))

    def fit(self, *, initial: PerfParams | None = None, loss: str = DEFAULT_LOSS,
            loss_scale: float = DEFAULT_LOSS_SCALE) -> PerfParams:
        """:func:`~allocopt.throughput.goodput.fit_perf_params` on these rows (with its ``loss``, ``loss_scale``).

        Raises
        ------
        ProfileFormatError
            Naming the row whose compute time (``step_time - sync_time``) is not
            positive (e.g. a pipeline-parallel profile, whose ``step_time`` is
            the time of one stage).
        """
        bad = np.flatnonzero(~(self.compute_time_s > 0))
        if bad.size:
            path, _, line = str(self.origin[bad[0]]).rpartition(":")
            raise ProfileFormatError(
                f"step_time {self.iter_time_s[bad[0]]:g} s is not larger than sync_time {self.sync_time_s[bad[0]]:g} s "
                f"({bad.size} such rows), so the compute time step_time - sync_time is not positive; the "
                "data-parallel throughput model cannot be fitted (is this a pipeline-parallel profile?)",
                path=path, line=int(line))
        return fit_perf_params(self.num_nodes, self.num_replicas, self.local_bsz, self.compute_time_s,
                               self.iter_time_s, initial=initial, loss=loss, loss_scale=loss_scale)


_OBS_FIELDS = ("num_nodes", "num_replicas", "local_bsz", "iter_time_s", "sync_time_s", "placement", "origin")


@dataclass(frozen=True)
class ValidationCurve:
    """Per-epoch progress and gradient statistics of training at one global batch size.

    Attributes
    ----------
    batch_size : int
    progress, iteration, metric, grad_sqr, grad_var : ndarray of float, one entry per epoch
    """

    batch_size: int
    progress: np.ndarray
    iteration: np.ndarray
    metric: np.ndarray
    grad_sqr: np.ndarray
    grad_var: np.ndarray


# ----- reading files ----------------------------------------------------------------------------------
def normalize_placement(placement: str | int | tuple[int, ...]) -> str:
    """A placement as the digit string used in the files: empty nodes dropped, lexicographically
    smallest rotation (as Sia looks placements up), e.g. ``(4, 1)`` -> ``"14"``."""
    counts = tuple(int(c) for c in str(placement)) if isinstance(placement, (str, int)) else tuple(placement)
    counts = tuple(c for c in counts if c)
    if not counts or any(c < 0 or c > 9 for c in counts):
        raise ValueError(f"placement {placement!r} must give 1 to 9 GPUs on each of one or more nodes")
    return "".join(map(str, min(counts[i:] + counts[:i] for i in range(len(counts)))))


_DECIMAL = re.compile(r"([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?")


def pandas_float(text: str) -> float:
    """``text`` read as pandas' C CSV parser reads a float (pandas 1.x and 2.x default; Sia's
    simulator reads its profiles so): the first 17 decimal digits, leading zeros included,
    accumulated as ``x = 10 x + d`` in double precision, the rest dropped, then multiplied or
    divided by the double nearest ``10^k``. Not always the nearest double: ``"0.035044655203819275"``
    reads 0.0350446552038192. ValueError if ``text`` is not a decimal number."""
    match = _DECIMAL.fullmatch(text.strip())
    if not match or not (match.group(2) or match.group(3)):
        raise ValueError(f"could not convert string to float: {text!r}")
    sign, whole, fraction, exponent = match.groups()
    number, digits, scale = 0.0, 0, int(exponent or 0)
    for ch in whole:
        if digits < 17:
            number, digits = number * 10.0 + (ord(ch) - 48), digits + 1
        else:
            scale += 1
    for ch in (fraction or "")[:max(17 - digits, 0)]:
        number, scale = number * 10.0 + (ord(ch) - 48), scale - 1
    if sign == "-":
        number = -number
    if scale > 308:
        return math.copysign(math.inf, number) if number else number
    if scale > 0:
        return number * float(f"1e{scale}")
    if scale < -308:
        return number / float(f"1e{-308 - scale}") / 1e308 if scale >= -616 else 0.0 * number
    return number / float(f"1e{-scale}")


def _parse(kind: str, text: str, sia_numbers: bool = False) -> Any:
    """One field (floats by :func:`pandas_float` with ``sia_numbers``); raises ValueError with the
    requirement it breaks."""
    if kind == "str":
        if not text:
            raise ValueError("it must not be empty")
        return text
    if kind == "placement":
        if not re.fullmatch(r"[1-9]+", text):
            raise ValueError("it must be a digit string of GPUs per node, e.g. 44 for 2 nodes x 4 GPUs")
        return text
    value = pandas_float(text) if sia_numbers and kind != "count" else float(text)  # ValueError: not numeric
    if not math.isfinite(value):
        raise ValueError("it must be finite")
    if kind == "count":
        if value < 1 or value != int(value):
            raise ValueError("it must be a positive integer")
        return int(value)
    if kind == "time" and value < 0:
        raise ValueError("it must be a time in seconds >= 0")
    if kind == "nonneg" and value < 0:
        raise ValueError("it must be >= 0")
    return value


def _read_csv(path: Path, columns: Mapping[str, str], sia_numbers: bool = False
              ) -> tuple[dict[str, list[Any]], list[int]]:
    """Columns ``{name: kind}`` of a CSV file and the line of each row; errors name file and line."""
    try:
        handle = open(path, newline="", encoding="utf-8")
    except OSError as err:
        raise ProfileFormatError(f"cannot read: {err.strerror or err}", path=path) from None
    with handle:
        reader = csv.reader(handle)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise ProfileFormatError(f"empty file; expected a header with {', '.join(columns)}", path=path,
                                     line=1) from None
        except (csv.Error, UnicodeDecodeError) as err:
            raise ProfileFormatError(f"not a CSV text file: {err}", path=path, line=1) from None
        missing = [c for c in columns if c not in header]
        if missing:
            raise ProfileFormatError(f"missing column(s) {', '.join(missing)}; the header has {', '.join(header)}",
                                     path=path, line=1)
        index = {c: header.index(c) for c in columns}
        values: dict[str, list[Any]] = {c: [] for c in columns}
        lines: list[int] = []
        try:
            for row in reader:
                if not any(cell.strip() for cell in row):
                    continue
                line = reader.line_num
                if len(row) != len(header):
                    raise ProfileFormatError(f"{len(row)} fields, the header has {len(header)}", path=path, line=line)
                for c, kind in columns.items():
                    text = row[index[c]].strip()
                    try:
                        values[c].append(_parse(kind, text, sia_numbers))
                    except ValueError as err:
                        why = "it is not a number" if "could not convert" in str(err) else err
                        raise ProfileFormatError(f"column {c} is {text!r}; {why}", path=path, line=line) from None
                lines.append(line)
        except (csv.Error, UnicodeDecodeError) as err:
            raise ProfileFormatError(f"not a CSV text file: {err}", path=path, line=reader.line_num) from None
    if not lines:
        raise ProfileFormatError("no data rows", path=path)
    return values, lines


def _observations(path: Path, values: dict[str, list[Any]], lines: list[int], placement: list[str]) -> Observations:
    return Observations(np.array(values["num_nodes"], dtype=np.int64), np.array(values["num_replicas"], dtype=np.int64),
                        np.array(values["local_bsz"], dtype=np.int64), np.array(values["step_time"], dtype=np.float64),
                        np.array(values["sync_time"], dtype=np.float64), np.array(placement, dtype=str),
                        np.array([f"{path}:{line}" for line in lines], dtype=str))


def read_placements(path: str | Path, *, sia_numbers: bool = False) -> Observations:
    """A ``placements-<type>.csv`` file (columns ``placement, local_bsz, step_time, sync_time``).

    Parameters
    ----------
    path : path
    sia_numbers : bool, default False
        Read floats as Sia's simulator does (:func:`pandas_float`) instead of to the nearest double.

    Raises
    ------
    ProfileFormatError
        Naming file and line, for a missing file or column, a non-numeric or
        negative value, or a malformed placement.
    """
    path = Path(path)
    values, lines = _read_csv(path, {"placement": "placement", "local_bsz": "count", "step_time": "time",
                                     "sync_time": "time"}, sia_numbers)
    values["num_nodes"] = [len(p) for p in values["placement"]]
    values["num_replicas"] = [sum(map(int, p)) for p in values["placement"]]
    return _observations(path, values, lines, [normalize_placement(p) for p in values["placement"]])


def read_scalability(path: str | Path, *, sia_numbers: bool = False) -> Observations:
    """A ``scalability-<type>.csv`` file (``num_nodes, num_replicas, local_bsz, step_time, sync_time``;
    ``sia_numbers`` as :func:`read_placements`).

    Raises
    ------
    ProfileFormatError
        As :func:`read_placements`, and for more nodes than replicas.
    """
    path = Path(path)
    values, lines = _read_csv(path, {"num_nodes": "count", "num_replicas": "count", "local_bsz": "count",
                                     "step_time": "time", "sync_time": "time"}, sia_numbers)
    for nodes, replicas, line in zip(values["num_nodes"], values["num_replicas"], lines):
        if nodes > replicas:
            raise ProfileFormatError(f"num_nodes {nodes} is larger than num_replicas {replicas}", path=path, line=line)
    return _observations(path, values, lines, [""] * len(lines))


def read_validation(path: str | Path, *, sia_numbers: bool = False) -> ValidationCurve:
    """A ``validation-<batch size>.csv`` file (``progress, iteration, metric, grad_sqr, grad_var``;
    ``sia_numbers`` as :func:`read_placements`)."""
    path = Path(path)
    match = _VALIDATION.fullmatch(path.name)
    if not match or int(match.group(1)) < 1:
        raise ProfileFormatError("name a validation file validation-<batch size>.csv, e.g. validation-128.csv",
                                 path=path)
    values, _ = _read_csv(path, {"progress": "nonneg", "iteration": "nonneg", "metric": "real",
                                 "grad_sqr": "nonneg", "grad_var": "nonneg"}, sia_numbers)
    return ValidationCurve(int(match.group(1)), *(np.array(values[c], dtype=np.float64)
                                                  for c in ("progress", "iteration", "metric", "grad_sqr", "grad_var")))


def read_seed_profile(path: str | Path) -> dict[str, Observations]:
    """A seed profile ``<app>.csv`` (``gpu_type, local_bsz, placement, step_time, sync_time``), by GPU type.

    GPU type names are kept as written (Sia's files use ``t4, v100, dgx, rtx,
    quad``; see :data:`SEED_GPU_TYPES` for the matching profile suffixes).
    """
    path = Path(path)
    values, lines = _read_csv(path, {"gpu_type": "str", "local_bsz": "count", "placement": "placement",
                                     "step_time": "time", "sync_time": "time"})
    values["num_nodes"] = [len(p) for p in values["placement"]]
    values["num_replicas"] = [sum(map(int, p)) for p in values["placement"]]
    obs = _observations(path, values, lines, [normalize_placement(p) for p in values["placement"]])
    types = np.array(values["gpu_type"], dtype=str)
    return {t: obs.select(types == t) for t in dict.fromkeys(values["gpu_type"])}


# ----- application profiles -----------------------------------------------------------------------------
@dataclass(frozen=True)
class HeldOutError:
    """Prediction error of iteration times on placements held out of the fit.

    Attributes
    ----------
    median_abs_rel_error : float
        Median of ``|predicted / measured - 1|`` over held-out rows (NaN if none).
    n_heldout : int
        Held-out rows (measurements).
    heldout : Observations
        The held-out rows.
    predicted_iter_time_s : ndarray of float
        Predicted seconds per iteration of each held-out row.
    perf_params : PerfParams
        Fitted on the other rows.
    """

    median_abs_rel_error: float
    n_heldout: int
    heldout: Observations
    predicted_iter_time_s: np.ndarray
    perf_params: PerfParams


@dataclass(frozen=True)
class ApplicationProfile:
    """The profile of one application on one GPU type.

    Attributes
    ----------
    application, gpu_type : str
    placements : Observations
        Rows of ``placements-<type>.csv``.
    scalability : Observations or None
        Rows of ``scalability-<type>.csv``, where present.
    validation : mapping of int to ValidationCurve
        By global batch size.
    """

    application: str
    gpu_type: str
    placements: Observations
    scalability: Observations | None
    validation: Mapping[int, ValidationCurve]
    _interpolators: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @cached_property
    def observations(self) -> Observations:
        """Placement rows plus the scalability rows at (nodes, replicas, local_bsz) not in them (Sia's seeding)."""
        if self.scalability is None:
            return self.placements
        seen = set(zip(self.placements.num_nodes.tolist(), self.placements.num_replicas.tolist(),
                       self.placements.local_bsz.tolist()))
        new = [k not in seen for k in zip(self.scalability.num_nodes.tolist(), self.scalability.num_replicas.tolist(),
                                         self.scalability.local_bsz.tolist())]
        return Observations.concat([self.placements, self.scalability.select(np.array(new, dtype=bool))])

    @property
    def init_batch_size(self) -> int:
        """Smallest validated global batch size (Sia's default initial batch size)."""
        return min(self._validated())

    @property
    def max_batch_size(self) -> int:
        """Largest validated global batch size."""
        return max(self._validated())

    @property
    def min_local_bsz(self) -> int:
        """Smallest micro-batch size (samples per GPU) in the placements data."""
        return int(self.placements.local_bsz.min())

    @property
    def max_local_bsz(self) -> int:
        """Largest measured micro-batch: the memory limit of this GPU type."""
        return int(self.placements.local_bsz.max())

    def _validated(self) -> Mapping[int, ValidationCurve]:
        if not self.validation:
            folder = Path(str(self.placements.origin[0]).rpartition(":")[0]).parent
            raise ProfileFormatError("no validation-<batch size>.csv files, so the batch size range and gradient "
                                     "statistics are unknown", path=folder)
        return self.validation

    def fit(self, *, initial: PerfParams | None = None, loss: str = DEFAULT_LOSS,
            loss_scale: float = DEFAULT_LOSS_SCALE) -> PerfParams:
        """Throughput model fitted to all rows (:attr:`observations`; see :meth:`Observations.fit`)."""
        return self.observations.fit(initial=initial, loss=loss, loss_scale=loss_scale)

    def grad_params(self, batch_size: float | None = None, epoch: int = 0) -> GradParams:
        """Gradient statistics in ``epoch`` at ``batch_size`` (default the initial one), linearly
        interpolated between the validated batch sizes around it, as Sia's simulator does."""
        curves = self._validated()
        sizes = np.array(sorted(curves), dtype=np.float64)
        size = sizes[0] if batch_size is None else float(np.clip(batch_size, sizes[0], sizes[-1]))
        epochs = min(c.grad_sqr.size for c in curves.values())
        if not 0 <= epoch < epochs:
            raise InvalidProblemError(f"epoch {epoch} is out of range: the validation files of {self.application} "
                                      f"cover epochs 0..{epochs - 1}", field="epoch")
        hi = int(np.searchsorted(sizes, size, side="left"))
        lo = hi if sizes[hi] == size else hi - 1
        low, high = curves[int(sizes[lo])], curves[int(sizes[hi])]
        if lo == hi:
            return GradParams(float(low.grad_sqr[epoch]), float(low.grad_var[epoch]))
        # Sia's weighted mean ((M - lo) * y_hi + (hi - M) * y_lo) / (hi - lo), to its last bit
        a, b, width = size - sizes[lo], sizes[hi] - size, sizes[hi] - sizes[lo]
        return GradParams(float((a * high.grad_sqr[epoch] + b * low.grad_sqr[epoch]) / width),
                          float((a * high.grad_var[epoch] + b * low.grad_var[epoch]) / width))

    def goodput_model(self, perf_params: PerfParams | None = None, *, grad_params: GradParams | None = None,
                      epoch: int = 0) -> GoodputModel:
        """A :class:`GoodputModel` with this profile's batch-size limits.

        Defaults: the throughput model fitted to every row, and the gradient
        statistics of ``epoch`` at the initial batch size.
        """
        return GoodputModel(perf_params or self.fit(), grad_params or self.grad_params(epoch=epoch),
                            self.init_batch_size, self.max_batch_size, self.max_local_bsz,
                            min_local_bsz=self.min_local_bsz)

    def true_times(self, placement: str | int | tuple[int, ...], local_bsz: Any) -> tuple[np.ndarray, np.ndarray]:
        """Measured seconds per iteration and of synchronization of ``placement`` (what a simulator runs).

        A measured placement is interpolated linearly in ``local_bsz``; any other
        one at the same (nodes, replicas) likewise from the mean of those rows;
        beyond that linearly over (nodes, replicas, local_bsz) of all rows,
        as Sia's simulator does. NaN where ``local_bsz`` is outside the measured
        range (e.g. it does not fit in memory).

        Returns
        -------
        iter_time_s, sync_time_s : ndarray of float, shaped like ``local_bsz``
        """
        key = normalize_placement(placement)
        bsz = np.asarray(local_bsz, dtype=np.float64)
        interp = self._interpolators.get(key)
        if interp is None:
            interp = self._interpolators[key] = self._interpolator(key)
        out = interp(bsz)
        return out[..., 0], out[..., 1]

    def _interpolator(self, key: str) -> Any:
        obs = self.observations
        rows = obs.placement == key
        nodes, replicas = len(key), sum(map(int, key))
        if not rows.any():
            rows = (obs.num_nodes == nodes) & (obs.num_replicas == replicas)
        times = np.stack([obs.iter_time_s, obs.sync_time_s], axis=1)
        if rows.any():
            sizes, mean = _group_mean(obs.local_bsz[rows].astype(np.float64), times[rows])
            return lambda m: np.stack([np.interp(m, sizes, mean[:, k], left=np.nan, right=np.nan) for k in (0, 1)],
                                      axis=-1)
        points, mean = _group_mean(np.stack([obs.num_nodes, obs.num_replicas, obs.local_bsz], axis=1)
                                   .astype(np.float64), times)
        nd = LinearNDInterpolator(points, mean)
        return lambda m: nd(np.stack(np.broadcast_arrays(float(nodes), float(replicas), m), axis=-1)).reshape(
            np.shape(m) + (2,))

    def sia_times(self, placement: str | int | tuple[int, ...], local_bsz: int) -> tuple[float, float]:
        """Seconds per iteration and of synchronization of ``placement`` at micro-batch ``local_bsz``
        exactly as Sia's simulator looks them up (``Application.get_throughput``), to the bit.

        A profiled placement: linear between its two rows around ``local_bsz``
        (the rows ``lo < local_bsz <= hi``, the first two at the smallest one),
        as ``(y_hi - y_lo) / (x_hi - x_lo) * (local_bsz - x_lo) + y_lo``. Any
        other: linear interpolation in (nodes, replicas, ``local_bsz``) over the
        placements rows averaged per (nodes, replicas, ``local_bsz``) followed
        by every scalability row. NaN where ``local_bsz`` is outside the
        measured range (Sia's simulator then records -1 s).
        """
        key = normalize_placement(placement)
        interp = self._interpolators.get(("sia", key))
        if interp is None:
            interp = self._interpolators["sia", key] = self._sia_interpolator(key)
        return interp(int(local_bsz))

    def _sia_interpolator(self, key: str) -> Any:
        pl = self.placements
        rows = np.flatnonzero(pl.placement == key)
        if rows.size:
            rows = rows[np.argsort(pl.local_bsz[rows], kind="stable")]
            x, y = pl.local_bsz[rows], np.stack([pl.iter_time_s[rows], pl.sync_time_s[rows]], axis=1)

            def along_bsz(m: int) -> tuple[float, float]:
                if not x[0] <= m <= x[-1] or x.size < 2:
                    return math.nan, math.nan
                hi = min(max(int(np.searchsorted(x, m, side="left")), 1), x.size - 1)
                out = (y[hi] - y[hi - 1]) / float(x[hi] - x[hi - 1]) * float(m - x[hi - 1]) + y[hi - 1]
                return float(out[0]), float(out[1])
            return along_bsz
        nd = self._interpolators.get(("sia", None))
        if nd is None:  # one triangulation for every placement that is not profiled
            keys = np.stack([pl.num_nodes, pl.num_replicas, pl.local_bsz], axis=1)
            points, mean = _kahan_group_mean(keys, np.stack([pl.iter_time_s, pl.sync_time_s], axis=1))
            sc = self.scalability
            if sc is not None:
                points = np.concatenate([points, np.stack([sc.num_nodes, sc.num_replicas, sc.local_bsz], axis=1)])
                mean = np.concatenate([mean, np.stack([sc.iter_time_s, sc.sync_time_s], axis=1)])
            nd = self._interpolators["sia", None] = LinearNDInterpolator(points.astype(np.float64), mean)
        where = (min(len(key), 16), sum(map(int, key)))

        def across(m: int) -> tuple[float, float]:
            out = nd([[*where, m]])[0]
            return float(out[0]), float(out[1])
        return across

    def heldout_error(self, every: int = 3, *, loss: str = DEFAULT_LOSS,
                      loss_scale: float = DEFAULT_LOSS_SCALE) -> HeldOutError:
        """Fit on part of the placements and measure the error on the others.

        Multi-GPU placements (a placement string, or a (nodes, replicas) pair
        for scalability rows) are sorted by replicas, nodes and name; every
        ``every``-th of them, starting with the second, is held out with all of
        its rows. The throughput model is fitted to the remaining rows
        (including every 1-GPU row), with ``loss`` and ``loss_scale`` (see
        :func:`~allocopt.throughput.goodput.fit_perf_params`), and predicts the
        held-out iteration times.
        """
        if isinstance(every, bool) or not isinstance(every, int) or every < 2:
            raise ValueError(f"every must be an integer >= 2, got {every!r}")
        obs = self.observations
        keys = np.array([p or f"{n}x{r}" for p, n, r in zip(obs.placement.tolist(), obs.num_nodes.tolist(),
                                                             obs.num_replicas.tolist())], dtype=str)
        multi = sorted({(r, n, k) for k, n, r in zip(keys.tolist(), obs.num_nodes.tolist(),
                                                     obs.num_replicas.tolist()) if r > 1})
        held_keys = [k for _, _, k in multi[1::every]]
        held = np.isin(keys, held_keys)
        params = obs.select(~held).fit(loss=loss, loss_scale=loss_scale)
        test = obs.select(held)
        predicted = params.iter_time(test.num_nodes, test.num_replicas, test.local_bsz)
        errors = np.abs(predicted / test.iter_time_s - 1)
        median = float(np.median(errors)) if errors.size else math.nan
        return HeldOutError(median, int(errors.size), test, predicted, params)


def _group_mean(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``keys`` (rows, if 2-D), sorted, and the mean of the rows of ``values`` for each."""
    unique, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    sums = np.stack([np.bincount(inverse, weights=column) for column in values.T], axis=1)
    return unique, sums / np.bincount(inverse)[:, None]


def _kahan_group_mean(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of ``keys``, sorted, and the mean of the rows of ``values`` for each, summed in
    row order with Kahan compensation (pandas' ``groupby().mean()``, which Sia's simulator uses)."""
    unique, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    total = np.zeros((unique.shape[0], values.shape[1]))
    carry = np.zeros_like(total)
    for group, row in zip(inverse.tolist(), values):
        y = row - carry[group]
        t = total[group] + y
        carry[group] = t - total[group] - y
        total[group] = t
    return unique, total / np.bincount(inverse)[:, None]


# ----- directories -----------------------------------------------------------------------------------
def shipped_profiles_dir() -> Path:
    """The copy of Sia's profiles shipped with allocopt (see its README.md for what it holds)."""
    return Path(str(resources.files("allocopt").joinpath("data", "sia_profiles")))


def discover(profile_dir: str | Path) -> list[tuple[str, str]]:
    """``(application, gpu_type)`` of every ``<app>/placements-<type>.csv`` under ``profile_dir``, sorted.

    Raises
    ------
    ProfileFormatError
        If ``profile_dir`` is not a directory or holds no placements file.
    """
    root = Path(profile_dir)
    if not root.is_dir():
        raise ProfileFormatError("not a directory of application profiles", path=root)
    pairs = sorted((app.name, m.group(1)) for app in root.iterdir() if app.is_dir() and app.name != _SEED_DIR
                   for f in app.iterdir() if (m := _PLACEMENTS.fullmatch(f.name)))
    if not pairs:
        raise ProfileFormatError("no <application>/placements-<gpu type>.csv files found", path=root)
    return pairs


def load_application(profile_dir: str | Path, application: str, gpu_type: str, *,
                     sia_numbers: bool = False) -> ApplicationProfile:
    """The profile of ``application`` on ``gpu_type`` under ``profile_dir`` (its scalability and
    validation files are optional; ``sia_numbers`` as :func:`read_placements`)."""
    folder = Path(profile_dir) / application
    placements = read_placements(folder / f"placements-{gpu_type}.csv", sia_numbers=sia_numbers)
    scalability_path = folder / f"scalability-{gpu_type}.csv"
    scalability = read_scalability(scalability_path, sia_numbers=sia_numbers) if scalability_path.exists() else None
    curves = [read_validation(p, sia_numbers=sia_numbers) for p in folder.glob("validation-*.csv")]
    return ApplicationProfile(application, gpu_type, placements, scalability,
                              {c.batch_size: c for c in sorted(curves, key=lambda c: c.batch_size)})


def load_profiles(profile_dir: str | Path, *, sia_numbers: bool = False) -> dict[tuple[str, str], ApplicationProfile]:
    """Every ``(application, gpu_type)`` profile under ``profile_dir`` (see :func:`discover`).

    ``sia_numbers``: read floats as Sia's simulator does (:func:`pandas_float`: its step times,
    sync times and gradient statistics to the bit, for simulations that reproduce Sia's).
    """
    return {(app, t): load_application(profile_dir, app, t, sia_numbers=sia_numbers)
            for app, t in discover(profile_dir)}


def load_seed_profiles(seed_dir: str | Path) -> dict[str, dict[str, Observations]]:
    """The 1-GPU seed profiles ``<app>.csv`` of a directory, by application and GPU type."""
    root = Path(seed_dir)
    files = sorted(root.glob("*.csv")) if root.is_dir() else []
    if not files:
        raise ProfileFormatError("no seed profiles <application>.csv found", path=root)
    return {f.stem: read_seed_profile(f) for f in files}


__all__ = ["SEED_GPU_TYPES", "ApplicationProfile", "HeldOutError", "Observations", "ProfileFormatError",
           "ValidationCurve", "discover", "load_application", "load_profiles", "load_seed_profiles",
           "normalize_placement", "pandas_float", "read_placements", "read_scalability", "read_seed_profile",
           "read_validation",
           "shipped_profiles_dir"]
