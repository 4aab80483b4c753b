"""Measured throughputs of job types (model, scale factor) on GPU types.

A :class:`ThroughputTable` holds one row per measured ``(model, scale_factor)``
entry and one column per GPU type: the steps per second of the whole job on
``scale_factor`` GPUs of that type, running alone (0.0 where it cannot run).
It may also hold co-located pair throughputs (two jobs of equal scale factor
sharing the same GPUs). It turns lists of job types into
:class:`~allocopt.Problem` instances (with ``pair_throughputs`` for space
sharing), draws random workloads from them, and reads and writes a user's own
measurements as CSV, JSON or pandas.
"""

from __future__ import annotations

import csv
import difflib
import functools
import io
import json
import math
import numbers
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import resources
from os import PathLike
from types import MappingProxyType
from typing import Any, overload

import numpy as np

from allocopt.cluster import Cluster
from allocopt.documents import check_depth, read_text
from allocopt.errors import BackendNotInstalledError, InvalidProblemError
from allocopt.jsonio import is_path
from allocopt.problem import PairThroughputs, Problem

#: Gavel's distribution of job scale factors (GPUs per job) in its generated workloads.
DEFAULT_SCALE_FACTOR_PROBS: Mapping[int, float] = MappingProxyType({1: 0.7, 2: 0.1, 4: 0.15, 8: 0.05})

#: Columns of a measurements file (:meth:`ThroughputTable.from_csv`): required, then optional pair columns.
MEASUREMENT_COLUMNS: tuple[str, ...] = ("model", "scale_factor", "gpu_type", "throughput",
                                        "other_model", "throughput_other")
_REQUIRED = MEASUREMENT_COLUMNS[:4]

_GAVEL_FILE = "gavel_throughputs.json"
_GAVEL_PAIR_FILE = "gavel_pair_throughputs.json"


class ThroughputTable:
    """Isolated (and optionally co-located pair) throughput of ``(model, scale_factor)`` entries.

    Build one with :meth:`gavel` (Gavel's measurements on k80, p100 and v100,
    shipped with allocopt), :meth:`from_csv`, :meth:`from_json` or
    :meth:`from_frame` (your own measurements, with pairs), or
    :meth:`from_records` (isolated throughputs only). Tables are immutable.

    Parameters
    ----------
    entries : sequence of (str, int)
        Distinct ``(model, scale_factor)`` pairs, one per row.
    gpu_types : sequence of str
        Distinct GPU type names, one per column.
    throughputs_steps_per_s : array-like of shape (n_entries, n_gpu_types)
        Steps/s of the whole job on ``scale_factor`` GPUs of each type;
        finite and >= 0, with 0.0 where the job cannot run.
    pairs : sequence of (str, str, int), optional
        ``(model_a, model_b, scale_factor)`` of each measured co-located pair:
        a job of ``model_a`` and one of ``model_b``, both at ``scale_factor``,
        sharing the same GPUs. Both entries must be in ``entries``; each
        unordered pair at most once (``model_a == model_b`` is allowed).
    pair_throughputs_steps_per_s : array-like of shape (n_pairs, n_gpu_types, 2)
        Steps/s of ``(model_a, model_b)`` while sharing each GPU type;
        ``(0, 0)`` where the pair cannot share (e.g. out of memory).
    """

    def __init__(self, entries: Sequence[tuple[str, int]], gpu_types: Sequence[str],
                 throughputs_steps_per_s: Any, *, pairs: Sequence[tuple[str, str, int]] = (),
                 pair_throughputs_steps_per_s: Any = None):
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
        self._init_pairs(pairs, pair_throughputs_steps_per_s)

    def _init_pairs(self, pairs: Sequence[tuple[str, str, int]], values: Any) -> None:
        """Validate the pairs; index both orientations by ``row_a * n_entries + row_b``."""
        self._pairs = tuple((str(a), str(b), int(s)) for a, b, s in pairs)
        n, k = len(self._pairs), len(self._gpu_types)
        P = np.zeros((0, k, 2)) if values is None and n == 0 else np.array(values, dtype=np.float64)
        if P.shape != (n, k, 2):
            raise InvalidProblemError(f"pair_throughputs_steps_per_s has shape {P.shape}, expected "
                                      f"(n_pairs, n_gpu_types, 2) = ({n}, {k}, 2)",
                                      field="pair_throughputs_steps_per_s")
        rows = np.empty((n, 2), dtype=np.int64)
        for p, (a, b, s) in enumerate(self._pairs):
            missing = [m for m in (a, b) if (m, s) not in self._row]
            if missing:
                raise InvalidProblemError(f"pair ({a!r}, {b!r}) at scale_factor {s}: model {missing[0]!r} has "
                                          f"no isolated entry at scale_factor {s}; add it", field="pairs")
            rows[p] = self._row[(a, s)], self._row[(b, s)]
        bad = ~np.isfinite(P) | (P < 0)
        if bad.any():
            p, j, _ = (int(v[0]) for v in np.nonzero(bad))
            a, b, s = self._pairs[p]
            raise InvalidProblemError(f"pair ({a!r}, {b!r}) at scale_factor {s} on GPU type {self._gpu_types[j]!r}"
                                      f" has throughputs {P[p, j].tolist()}; give finite steps/s >= 0 ((0, 0) "
                                      "where the pair cannot share)", field="pair_throughputs_steps_per_s")
        unordered = np.sort(rows, axis=1)
        _, first, counts = np.unique(unordered, axis=0, return_index=True, return_counts=True)
        if (counts > 1).any():
            a, b, s = self._pairs[int(first[np.argmax(counts > 1)])]
            raise InvalidProblemError(f"pair ({a!r}, {b!r}) at scale_factor {s} appears twice (in either order)",
                                      field="pairs")
        # Both orientations; a self pair (a, a) keeps its given orientation (np.unique keeps the first).
        keys = np.concatenate([rows[:, 0] * len(self._entries) + rows[:, 1],
                               rows[:, 1] * len(self._entries) + rows[:, 0]])
        self._pair_keys, slot = np.unique(keys, return_index=True)
        self._pair_oriented = np.concatenate([P, P[:, :, ::-1]])[slot]
        P.setflags(write=False)
        self._P = P

    # ----- construction ----------------------------------------------------------
    @classmethod
    def gavel(cls, *, consolidated: bool = True) -> ThroughputTable:
        """Gavel's measurements: 26 models, scale factors 1-8, k80/p100/v100, with 921 pairs.

        From https://github.com/stanford-futuredata/gavel (MIT License); see
        ``allocopt/data/README.md`` for how the shipped copy was derived.
        The table is loaded once and shared (tables are immutable).

        Parameters
        ----------
        consolidated : bool, default True
            True: isolated throughputs with a job's GPUs on one server; False:
            Gavel's ``*_unconsolidated`` throughputs, GPUs spread over servers
            (same at scale factor 1). Pair throughputs are the same in both.
        """
        return _gavel_table(bool(consolidated))

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]]) -> ThroughputTable:
        """Build from one record per measured entry (isolated throughputs only).

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
        """One record per entry, in the layout :meth:`from_records` reads (pairs are not included)."""
        return [{"model": m, "scale_factor": s, "throughputs_steps_per_s": dict(zip(self._gpu_types, row))}
                for (m, s), row in zip(self._entries, self._T.tolist())]

    # ----- measurement files ------------------------------------------------------------
    @classmethod
    def from_csv(cls, path: str | PathLike[str]) -> ThroughputTable:
        """Read a user's measurements: one CSV row per (model, scale factor, GPU type).

        Columns (header on line 1, any order, extra columns ignored):
        ``model, scale_factor, gpu_type, throughput`` (steps/s of the whole job
        on ``scale_factor`` GPUs of ``gpu_type``, 0 where it cannot run), and
        for co-located measurements ``other_model, throughput_other``: a row
        with ``other_model`` set gives the steps/s of ``model`` (``throughput``)
        and of ``other_model`` (``throughput_other``), both at ``scale_factor``,
        sharing the GPUs; leave both empty on isolated rows. Every entry and
        every pair needs a row for every GPU type in the file, and both models
        of a pair need isolated rows. GPU types, entries and pairs keep their
        order of first appearance.

        Raises
        ------
        InvalidProblemError
            For a missing column, a non-numeric, negative or non-integer value,
            a duplicate row or a missing GPU type; the message starts with
            ``path:line:column`` (lines 1-based, the header is line 1).
        """
        name = str(path)
        reader = csv.reader(io.StringIO(read_text(path, what="the throughput table"), newline=""))
        try:
            header = next((row for row in reader if row), None)
            if header is None:
                raise InvalidProblemError(f"{name}:1: empty file; expected a header with columns "
                                          f"{', '.join(_REQUIRED)}", field="header")
            header = [h.strip() for h in header]
            position = {h: c for c, h in reversed(list(enumerate(header)))}
            missing = [c for c in _REQUIRED if c not in position]
            if missing:
                raise InvalidProblemError(f"{name}:{reader.line_num}: missing column(s) {missing}; the header has "
                                          f"{header}, required: {', '.join(_REQUIRED)} (optional: other_model, "
                                          "throughput_other)", field=missing[0])
            rows, lines = [], []
            for row in reader:
                if not row:
                    continue
                if len(row) > len(header):
                    raise InvalidProblemError(f"{name}:{reader.line_num}:{len(header) + 1}: {len(row)} fields but the "
                                              f"header has {len(header)}", field="header")
                rows.append(row + [""] * (len(header) - len(row)))
                lines.append(reader.line_num)
        except csv.Error as err:
            raise InvalidProblemError(f"{name}:{reader.line_num}: not a CSV file: {err}", field="csv") from None
        columns = {c: [row[position[c]] for row in rows] for c in MEASUREMENT_COLUMNS if c in position}
        return cls._from_columns(columns, len(rows), lambda k, c: f"{name}:{lines[k]}:{position[c] + 1}: "
                                 f"column {c!r}", lambda k: f"{name}:{lines[k]}")

    @classmethod
    def from_json(cls, source: str | PathLike[str] | Sequence[Mapping[str, Any]]) -> ThroughputTable:
        """Read a user's measurements: a JSON array of objects with the keys of :meth:`from_csv`'s columns.

        E.g. ``[{"model": "bert", "scale_factor": 1, "gpu_type": "a100",
        "throughput": 9.0}, ...]``; ``other_model`` and ``throughput_other`` are
        optional (absent or null on isolated rows). ``source`` is the path of
        such a file (errors name ``path:line``, where the object starts, and the
        key) or the array itself, as :meth:`to_json` returns it (errors name the element).
        """
        if is_path(source):
            records, lines = _json_array(str(source), read_text(source, what="the throughput table"))
            where = [f"{source}:{line}" for line in lines]
        elif isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
            records = list(source)
            where = [f"element {k}" for k in range(len(records))]
        else:
            raise InvalidProblemError(f"from_json needs a path or a list of measurement objects, got "
                                      f"{type(source).__name__}", field="document")
        for k, rec in enumerate(records):
            if not isinstance(rec, Mapping):
                raise InvalidProblemError(f"{where[k]}: element {k} is {type(rec).__name__}; give one "
                                          f"object per measurement with keys {', '.join(_REQUIRED)}",
                                          field="record")
        columns = {c: [rec.get(c) for rec in records] for c in MEASUREMENT_COLUMNS}
        return cls._from_columns(columns, len(records), lambda k, c: f"{where[k]}: key {c!r}", where.__getitem__)

    @classmethod
    def from_frame(cls, frame: Any) -> ThroughputTable:
        """Read a user's measurements from a pandas DataFrame with :meth:`from_csv`'s columns.

        Missing values (NaN, None) in ``other_model`` and ``throughput_other``
        mark isolated rows. Errors name the row position and index label.
        """
        if not all(hasattr(frame, a) for a in ("columns", "index", "to_numpy")):
            raise InvalidProblemError(f"from_frame needs a pandas DataFrame, got {type(frame).__name__}",
                                      field="frame")
        missing = [c for c in _REQUIRED if c not in frame.columns]
        if missing:
            raise InvalidProblemError(f"DataFrame: missing column(s) {missing}; it has {list(frame.columns)}, "
                                      f"required: {', '.join(_REQUIRED)} (optional: other_model, throughput_other)",
                                      field=missing[0])
        labels = list(frame.index)
        columns = {c: frame[c].tolist() for c in MEASUREMENT_COLUMNS if c in frame.columns}
        return cls._from_columns(columns, len(labels), lambda k, c: f"DataFrame row {k} (index {labels[k]!r}): "
                                 f"column {c!r}", lambda k: f"DataFrame row {k} (index {labels[k]!r})")

    def to_csv(self, path: str | PathLike[str]) -> None:
        """Write the table as a measurements file that :meth:`from_csv` reads back exactly.

        Isolated rows first (entries in table order, GPU types in column
        order), then one row per pair and GPU type; the pair columns are
        written only when the table has pairs.
        """
        columns = self._measurement_columns()
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(list(columns))
            writer.writerows(zip(*(["" if v is None else v for v in col] for col in columns.values())))

    @overload
    def to_json(self, path: None = None) -> list[dict[str, Any]]: ...

    @overload
    def to_json(self, path: str | PathLike[str]) -> None: ...

    def to_json(self, path: str | PathLike[str] | None = None) -> list[dict[str, Any]] | None:
        """The table as a JSON array of measurements that :meth:`from_json` reads back exactly;
        written to ``path`` (one object per line) when given."""
        columns = self._measurement_columns()
        records = [{c: v for c, v in zip(columns, values) if v is not None} for values in zip(*columns.values())]
        if path is None:
            return records
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("[\n" + ",\n".join(" " + json.dumps(rec) for rec in records) + "\n]\n")

    def to_frame(self) -> Any:
        """The measurements as a pandas DataFrame with :meth:`from_csv`'s columns (needs pandas)."""
        try:
            import pandas as pd
        except ImportError:
            raise BackendNotInstalledError("ThroughputTable.to_frame needs pandas: pip install "
                                           "'allocopt[pandas]'") from None
        return pd.DataFrame(self._measurement_columns())

    def _measurement_columns(self) -> dict[str, list[Any]]:
        """Columns of the measurement rows (None: empty pair field of an isolated row)."""
        n, k, n_pairs = len(self._entries), len(self._gpu_types), len(self._pairs)
        models = np.array([m for m, _ in self._entries] + [a for a, _, _ in self._pairs], dtype=object)
        scales = np.concatenate([self._scale_of, np.array([s for *_, s in self._pairs], dtype=np.int64)])
        columns: dict[str, list[Any]] = {
            "model": np.repeat(models, k).tolist(), "scale_factor": np.repeat(scales, k).tolist(),
            "gpu_type": list(self._gpu_types) * (n + n_pairs),
            "throughput": np.concatenate([self._T.reshape(-1), self._P[:, :, 0].reshape(-1)]).tolist()}
        if n_pairs:
            others = np.array([b for _, b, _ in self._pairs], dtype=object)
            columns["other_model"] = [None] * (n * k) + np.repeat(others, k).tolist()
            columns["throughput_other"] = [None] * (n * k) + self._P[:, :, 1].reshape(-1).tolist()
        return columns

    @classmethod
    def _from_columns(cls, columns: Mapping[str, Sequence[Any]], n_rows: int,
                      where: Callable[[int, str], str], line: Callable[[int], str]) -> ThroughputTable:
        """Validate measurement rows (raw values per column) and assemble the table.

        ``where(k, column)`` and ``line(k)`` locate row ``k`` in the source for error messages.
        """
        def fail(k: int, column: str, message: str) -> InvalidProblemError:
            return InvalidProblemError(f"{where(k, column)}: {message}", field=column)

        def text(column: str, k: int, required: bool = True) -> str | None:
            value = columns[column][k] if column in columns else None
            if _is_missing(value):
                if required:
                    raise fail(k, column, "missing value")
                return None
            if not isinstance(value, str):
                raise fail(k, column, f"{value!r} is not a name; give a string")
            return value.strip()

        def number(column: str, k: int, required: bool = True) -> float | None:
            value = columns[column][k] if column in columns else None
            if _is_missing(value):
                if required:
                    raise fail(k, column, "missing value")
                return None
            try:
                if isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):
                    raise ValueError
                x = float(value)
            except (ValueError, OverflowError):
                raise fail(k, column, f"{value!r} is not a number") from None
            if not math.isfinite(x) or x < 0:
                raise fail(k, column, f"{value!r} must be a finite number >= 0")
            return x

        entries: dict[tuple[str, int], int] = {}  # (model, scale) -> index
        pairs: dict[tuple[str, str, int], int] = {}  # (model_a, model_b, scale) as first given -> index
        types: dict[str, int] = {}
        first_row: dict[tuple, int] = {}  # ("entry", index) / ("pair", index) / duplicate keys -> first row
        iso, co = [], []  # (entry, type, steps/s) and (pair, type, steps/s a, steps/s b)
        for k in range(n_rows):
            model, gpu = text("model", k), text("gpu_type", k)
            scale = number("scale_factor", k)
            if scale != int(scale) or not 1 <= scale <= _MAX_SCALE_FACTOR:
                raise fail(k, "scale_factor", f"{columns['scale_factor'][k]!r} must be an integer number of "
                                              f"GPUs >= 1 (at most {_MAX_SCALE_FACTOR})")
            scale, tput = int(scale), number("throughput", k)
            other, other_tput = text("other_model", k, required=False), number("throughput_other", k, required=False)
            if (other is None) != (other_tput is None):
                raise fail(k, "other_model" if other is None else "throughput_other",
                           "missing value; a co-located row needs both other_model and throughput_other, "
                           "an isolated row neither")
            j = types.setdefault(gpu, len(types))
            if other is None:
                e = entries.setdefault((model, scale), len(entries))
                first_row.setdefault(("entry", e), k)
                key: tuple = ("entry", e, j)
                iso.append((e, j, tput))
            else:
                flip = (model, other, scale) not in pairs and (other, model, scale) in pairs
                p = pairs[(other, model, scale)] if flip else pairs.setdefault((model, other, scale), len(pairs))
                first_row.setdefault(("pair", p), k)
                key = ("pair", p, j)
                co.append((p, j, other_tput, tput) if flip else (p, j, tput, other_tput))
            if first_row.setdefault(key, k) != k:
                raise InvalidProblemError(f"{line(k)}: duplicate row: same model, scale_factor, gpu_type and "
                                          f"other_model (in either order) as {line(first_row[key])}", field="row")
        T = np.full((len(entries), len(types)), np.nan)
        P = np.full((len(pairs), len(types), 2), np.nan)
        if iso:
            e, j, tput = np.array(iso).T
            T[e.astype(np.int64), j.astype(np.int64)] = tput
        if co:
            p, j, a, b = np.array(co).T
            P[p.astype(np.int64), j.astype(np.int64)] = np.stack([a, b], axis=1)
        names = list(types)
        for kind, keys, missing in (("entry", list(entries), np.isnan(T)), ("pair", list(pairs), np.isnan(P[..., 0]))):
            if missing.any():
                i = int(np.flatnonzero(missing.any(axis=1))[0])
                what = (f"model {keys[i][0]!r} at scale_factor {keys[i][1]}" if kind == "entry" else
                        f"pair ({keys[i][0]!r}, {keys[i][1]!r}) at scale_factor {keys[i][2]}")
                raise fail(first_row[(kind, i)], "gpu_type",
                           f"{what} has no row for GPU type(s) {[names[j] for j in np.flatnonzero(missing[i])]}; "
                           "give every GPU type of the file (throughput 0 where it cannot run or share)")
        for (a, b, s), p in pairs.items():
            for column, m in (("model", a), ("other_model", b)):
                if (m, s) not in entries:
                    raise fail(first_row[("pair", p)], column, f"model {m!r} has no isolated row at scale_factor "
                                                               f"{s}; pairs need both models' isolated throughputs")
        return cls(list(entries), names, T, pairs=list(pairs), pair_throughputs_steps_per_s=P)

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

    @property
    def pairs(self) -> tuple[tuple[str, str, int], ...]:
        """``(model_a, model_b, scale_factor)`` of each measured co-located pair, each unordered pair once."""
        return self._pairs

    @property
    def pair_throughputs_steps_per_s(self) -> np.ndarray:
        """Read-only array of shape (n_pairs, n_gpu_types, 2): steps/s of ``(model_a, model_b)``
        of each of :attr:`pairs` while sharing a GPU type; ``(0, 0)``: cannot share."""
        return self._P

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

    def pair_throughput(self, model_a: str, model_b: str, scale_factor: int, gpu_type: str) -> tuple[float, float]:
        """Steps/s of ``(model_a, model_b)`` sharing ``scale_factor`` GPUs of ``gpu_type``.

        ``(0.0, 0.0)`` where the pair was measured and cannot share; raises
        :class:`~allocopt.errors.InvalidProblemError` where it was not measured.
        """
        value = self.pair_throughputs([model_a], [model_b], scale_factor, [gpu_type])[0, 0]
        if np.isnan(value[0]):
            raise InvalidProblemError(f"no co-located measurement of {model_a!r} with {model_b!r} at scale_factor "
                                      f"{scale_factor} ({len(self._pairs)} pairs measured, see "
                                      "ThroughputTable.pairs)", field="pair")
        return float(value[0]), float(value[1])

    def pair_throughputs(self, models_a: Sequence[str], models_b: Sequence[str], scale_factors: int | Any,
                         gpu_types: Sequence[str] | None = None) -> np.ndarray:
        """Steps/s of many pairs ``(models_a[p], models_b[p])`` sharing GPUs, vectorized.

        Parameters
        ----------
        models_a, models_b : sequence of str, length n
        scale_factors : int or array-like of int of shape (n,)
            GPUs of each pair (both members use the same GPUs).
        gpu_types : sequence of str, optional
            Default: all, in column order.

        Returns
        -------
        ndarray of shape (n, len(gpu_types), 2)
            ``[..., 0]`` steps/s of ``models_a``, ``[..., 1]`` of ``models_b``;
            ``(0, 0)`` where the pair cannot share, NaN where it was not measured.
        """
        n = len(models_a)
        scales = np.broadcast_to(np.asarray(scale_factors), (n,)).tolist()
        if len(models_b) != n:
            raise InvalidProblemError(f"models_a has {n} entries but models_b {len(models_b)}", field="models_b")
        rows_a = np.array([self._row_index(m, s) for m, s in zip(models_a, scales)], dtype=np.int64)
        rows_b = np.array([self._row_index(m, s) for m, s in zip(models_b, scales)], dtype=np.int64)
        cols = self._columns(self._gpu_types if gpu_types is None else gpu_types)
        found, slot = self._pair_slots(rows_a, rows_b)
        out = np.full((n, cols.size, 2), np.nan)
        out[found] = self._pair_oriented[slot[found]][:, cols]
        return out

    def problem(self, jobs: Sequence[tuple[str, int]], cluster: Cluster, *,
                job_ids: Sequence[Any] | None = None, priority_weights: Any = None,
                space_sharing: bool = False) -> Problem:
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
        space_sharing : bool, default False
            Also give ``pair_throughputs`` for every pair of jobs ``(i, j)``,
            ``i < j`` in job order, with equal scale factors whose model pair is
            in the table (``(0, 0)`` on GPU types where it cannot share), as
            ``(steps/s of job i, steps/s of job j)``.
        """
        cols = self._columns(cluster.gpu_types)
        rows = np.fromiter((self._row_index(m, s) for m, s in jobs), dtype=np.int64, count=len(jobs))
        pair_throughputs = None
        if space_sharing:
            if not self._pairs:
                raise InvalidProblemError("space_sharing=True needs pair throughputs, but this table has none; "
                                          "measure co-located pairs (other_model, throughput_other columns)",
                                          field="space_sharing")
            ids = list(range(len(jobs)) if job_ids is None else job_ids)
            if len(ids) != len(jobs):
                raise InvalidProblemError(f"job_ids has {len(ids)} entries but there are {len(jobs)} jobs",
                                          field="job_ids")
            first, second, slot = self._job_pairs(rows)
            id_array = np.fromiter(ids, dtype=object, count=len(ids))
            pair_throughputs = PairThroughputs(list(zip(id_array[first].tolist(), id_array[second].tolist())),
                                               self._pair_oriented[slot[:, None], cols])
        return Problem(self._T[np.ix_(rows, cols)], cluster, job_ids=job_ids,
                       scale_factors=self._scale_of[rows], priority_weights=priority_weights,
                       pair_throughputs=pair_throughputs)

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
                       priority_weights: Mapping[float, float] | None = None,
                       space_sharing: bool = False) -> Problem:
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
        space_sharing : bool, default False
            Include pair throughputs, as :meth:`problem` does.

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
                            priority_weights=weights, space_sharing=space_sharing)

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

    def _pair_slots(self, rows_a: np.ndarray, rows_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whether each pair of entry rows was measured, and its row in ``_pair_oriented``."""
        keys = rows_a * len(self._entries) + rows_b
        slot = np.minimum(np.searchsorted(self._pair_keys, keys), max(self._pair_keys.size - 1, 0))
        found = self._pair_keys[slot] == keys if self._pair_keys.size else np.zeros(keys.shape, dtype=bool)
        return found, slot

    def _job_pairs(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Job pairs ``(i, j)``, ``i < j``, of equal scale factor with a measured pair, in (i, j) order,
        and their rows in ``_pair_oriented``; one block of all pairs per scale factor."""
        scales = self._scale_of[rows]
        order = np.argsort(scales, kind="stable")
        blocks = np.split(order, np.flatnonzero(np.diff(scales[order])) + 1)
        first = [block[np.triu_indices(block.size, 1)[0]] for block in blocks]
        second = [block[np.triu_indices(block.size, 1)[1]] for block in blocks]
        i, j = np.concatenate([np.empty(0, np.int64), *first]), np.concatenate([np.empty(0, np.int64), *second])
        found, slot = self._pair_slots(rows[i], rows[j])
        keep = np.flatnonzero(found)
        keep = keep[np.argsort(i[keep] * rows.size + j[keep])]
        return i[keep], j[keep], slot[keep]

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


@functools.cache
def _gavel_table(consolidated: bool) -> ThroughputTable:
    data = resources.files("allocopt").joinpath("data")
    isolated = json.loads(data.joinpath(_GAVEL_FILE).read_text(encoding="utf-8"))
    paired = json.loads(data.joinpath(_GAVEL_PAIR_FILE).read_text(encoding="utf-8"))
    table = ThroughputTable.from_records(isolated["jobs" if consolidated else "jobs_unconsolidated"])
    types = table.gpu_types
    return ThroughputTable(table.entries, types, table.throughputs_steps_per_s,
                           pairs=[(a, b, s) for a, s, b, _ in paired["pairs"]],
                           pair_throughputs_steps_per_s=[[v[t] for t in types] for *_, v in paired["pairs"]])


def _is_missing(value: Any) -> bool:
    """An empty cell: None, NaN or a blank string."""
    return value is None or (isinstance(value, float) and math.isnan(value)) \
        or (isinstance(value, str) and not value.strip())


_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_MAX_SCALE_FACTOR = 2**31 - 1


def _json_array(name: str, text: str) -> tuple[list[Any], list[int]]:
    """The elements of a top-level JSON array and the line (1-based) on which each starts."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    lines: list[int] = []
    line, counted = 1, 0
    try:
        pos = _JSON_SPACE.match(text).end()
        if text[pos:pos + 1] != "[":
            raise json.JSONDecodeError("expected a JSON array [{...}, ...] of measurements", text, pos)
        pos = _JSON_SPACE.match(text, pos + 1).end()
        while text[pos:pos + 1] != "]":
            line += text.count("\n", counted, pos)
            counted = pos
            lines.append(line)
            value, pos = decoder.raw_decode(text, pos)
            values.append(value)
            pos = _JSON_SPACE.match(text, pos).end()
            if text[pos:pos + 1] == ",":
                pos = _JSON_SPACE.match(text, pos + 1).end()
            elif text[pos:pos + 1] != "]":
                raise json.JSONDecodeError("expected ',' or ']'", text, pos)
        end = _JSON_SPACE.match(text, pos + 1).end()
        if end != len(text):
            raise json.JSONDecodeError("extra data after the array", text, end)
    except json.JSONDecodeError as err:
        raise InvalidProblemError(f"{name}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}", field="json") from None
    except (ValueError, RecursionError):  # an integer over Python's digit limit, or absurd nesting
        raise InvalidProblemError(f"{name}:{line}: invalid JSON: a number too long or values nested too deeply",
                                  field="json") from None
    for value, start in zip(values, lines):
        check_depth(value, f"{name}:{start}")
    return values, lines


__all__ = ["DEFAULT_SCALE_FACTOR_PROBS", "MEASUREMENT_COLUMNS", "ThroughputTable"]
