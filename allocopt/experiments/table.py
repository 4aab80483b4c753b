"""A sweep's results table: one CSV row per run, appended atomically, read back typed; Parquet from it.

Each row is written as one line, flushed and fsync'ed before the next point is
reported done, so a sweep killed at any moment leaves whole rows and at most a
torn last line, which :meth:`ResultsTable.open` removes. The CSV is always written;
``results.parquet`` (needs pyarrow, the ``parquet`` extra) is written from it.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from allocopt.errors import DataFileError
from allocopt.experiments.metrics import METRICS

logger = logging.getLogger(__name__)

#: Parameter columns, in order (see :class:`~allocopt.experiments.grid.Point`).
PARAMETERS: tuple[str, ...] = (
    "policy_label", "policy", "policy_options", "workload_set", "workload", "workload_kind", "workload_path",
    "workload_sha256", "trace_format", "task_table", "profiles", "num_jobs_generated", "jobs_per_hour",
    "scale_factor_probs", "cluster", "gpus_per_node", "seed", "round_seconds", "recompute_min_seconds", "mode",
    "window", "backend", "fidelity", "placement", "admission", "tenants", "capacity_events", "restart_overhead_s",
    "run_unallocated", "ftf", "throughputs", "allocopt_version")
#: Every column: the point's key, its parameters, its metrics.
COLUMNS: tuple[str, ...] = ("key", *PARAMETERS, *METRICS)
_TEXT = {"key", "policy_label", "policy", "workload_set", "workload", "workload_kind", "workload_path",
         "workload_sha256", "profiles", "trace_format", "task_table", "cluster", "mode", "backend", "fidelity",
         "placement", "admission", "tenants", "capacity_events", "throughputs", "allocopt_version"}
_JSON = {"policy_options", "window", "scale_factor_probs", "gpus_per_node", "gpu_hours_by_type",
         "tenant_average_jct_s", "tenant_gpu_hours", "tenant_average_ftf"}
_BOOL = {"run_unallocated", "ftf"}


def row_of(key: str, params: Mapping[str, Any], metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A table row: ``key``, the parameters (``num_jobs`` of a generated workload as ``num_jobs_generated``), metrics."""
    values = {**params, "num_jobs_generated": params.get("num_jobs")}
    return {"key": key, **{c: values.get(c) for c in PARAMETERS}, **{c: metrics.get(c) for c in METRICS}}


def _cell(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column in _JSON:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _parse(column: str, text: str) -> Any:
    if text == "":
        return None
    if column in _TEXT:
        return text
    if column in _JSON:
        return json.loads(text)
    if column in _BOOL:
        return text == "true"
    try:
        return int(text)
    except ValueError:
        return float(text)


def _line(values: Sequence[str]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(values)
    return buffer.getvalue()


class ResultsTable:
    """The CSV journal of a sweep (``results.csv`` in its output directory).

    Parameters
    ----------
    path : path
        The CSV file; created with a header at the first :meth:`append`. One process appends to a
        table at a time (:func:`~allocopt.experiments.run.run_sweep` holds a lock on its directory).
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.rows: list[dict[str, Any]] = []
        self._open()

    def _open(self) -> None:
        """Read the rows there are, dropping a torn last line (reading changes nothing else)."""
        self._migrate = False
        if not self.path.exists() or self.path.stat().st_size == 0:
            self._migrate = True
            return
        raw = self.path.read_bytes()
        if not raw.endswith(b"\n"):  # a run killed while writing its row: that point runs again
            cut = raw.rfind(b"\n") + 1
            logger.warning("%s: dropping a torn last line (%d bytes); its point runs again", self.path, len(raw) - cut)
            with open(self.path, "r+b") as fh:
                fh.truncate(cut)
                os.fsync(fh.fileno())
            raw = raw[:cut]
        reader = csv.reader(io.StringIO(raw.decode("utf-8")))
        header = next(reader, None)
        if not header or header[0] != "key":
            raise DataFileError("not a sweep results table (its first column is not 'key'); give the sweep another "
                                "output directory", path=self.path, line=1)
        rows = []
        for number, values in enumerate(reader, start=2):
            if len(values) != len(header):
                raise DataFileError(f"{len(values)} columns, the header has {len(header)}", path=self.path,
                                    line=number)
            try:
                rows.append({c: _parse(c, v) for c, v in zip(header, values)})
            except ValueError as err:
                raise DataFileError(f"unreadable cell: {err}", path=self.path, line=number) from None
        self.rows = [{c: row.get(c) for c in COLUMNS} for row in rows]
        self._migrate = tuple(header) != COLUMNS  # another version's columns: rewritten before the first append

    def _rewrite(self, rows: Iterable[Mapping[str, Any]]) -> None:
        temporary = self.path.with_name(self.path.name + ".tmp")
        with open(temporary, "w", encoding="utf-8", newline="") as fh:
            fh.write(_line(COLUMNS))
            for row in rows:
                fh.write(_line([_cell(c, row.get(c)) for c in COLUMNS]))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temporary, self.path)

    @property
    def keys(self) -> set[str]:
        """Keys of the points in the table."""
        return {row["key"] for row in self.rows}

    def append(self, row: Mapping[str, Any]) -> None:
        """Write ``row`` (:func:`row_of`) as one line, flushed and fsync'ed before returning."""
        if self._migrate:  # a new table, or one with another version's columns: this version's header first
            if self.rows:
                logger.info("%s: rewriting with this version's columns", self.path)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._rewrite(self.rows)
            self._migrate = False
        line = _line([_cell(c, row.get(c)) for c in COLUMNS])
        with open(self.path, "a", encoding="utf-8", newline="") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        self.rows.append({c: _parse(c, v) for c, v in zip(COLUMNS, next(csv.reader([line])))})

    def write_parquet(self, path: str | os.PathLike[str]) -> Path | None:
        """The table as Parquet at ``path`` (JSON cells as text); None, with a log line, without pyarrow."""
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            logger.info("pyarrow is not installed: no Parquet table (pip install 'allocopt[parquet]')")
            return None
        columns = {c: [_cell(c, r[c]) if c in _JSON else r[c] for r in self.rows] for c in COLUMNS}
        schema = pa.schema([(c, pa.string() if c in _TEXT | _JSON else pa.bool_() if c in _BOOL else pa.float64())
                            for c in COLUMNS])
        table = pa.table({c: pa.array([None if v is None else (float(v) if schema.field(c).type == pa.float64()
                                                               else v) for v in columns[c]],
                                      type=schema.field(c).type) for c in COLUMNS}, schema=schema)
        path = Path(path)
        temporary = path.with_name(path.name + ".tmp")
        pq.write_table(table, temporary)
        os.replace(temporary, path)
        return path


__all__ = ["COLUMNS", "PARAMETERS", "ResultsTable", "row_of"]
