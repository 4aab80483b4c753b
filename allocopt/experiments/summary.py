"""Per-group statistics of a sweep's runs: mean, standard deviation and 95% confidence interval over seeds."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from allocopt.errors import InvalidOptionError
from allocopt.experiments.metrics import METRICS
from allocopt.experiments.table import PARAMETERS

#: Columns that identify a group: every parameter but the seed (and the per-file hash, which the path implies).
GROUP_COLUMNS: tuple[str, ...] = tuple(c for c in PARAMETERS if c not in ("seed", "workload_sha256"))
#: Columns of the summary table, after the group's columns.
SUMMARY_COLUMNS: tuple[str, ...] = ("metric", "n", "mean", "std", "ci95_low", "ci95_high")


def summarize(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str] = METRICS,
              confidence: float = 0.95, over: Sequence[str] = ("seed",)) -> list[dict[str, Any]]:
    """One row per (group, metric): runs ``n``, ``mean``, sample ``std`` (ddof 1) and the ``confidence``
    interval of the mean by Student's t with ``n - 1`` degrees of freedom (``mean +- t * std / sqrt(n)``).

    Groups are the runs that differ only in the columns ``over`` (by default the seed: the other
    :data:`GROUP_COLUMNS`), in first-seen order; ``over=("seed", "workload", "workload_path")``
    averages over the files of a directory entry too (its ``workload_set`` label).
    A metric holding a mapping (``gpu_hours_by_type``) is summarized per key, as metric ``NAME.KEY``.
    Runs where the metric is missing are left out of its ``n``; ``std`` and the interval are None for
    ``n < 2`` (and the interval is the mean itself for ``std == 0``).

    Parameters
    ----------
    rows : sequence of mapping
        The results table's rows (:attr:`~allocopt.experiments.run.SweepResult.rows`).
    metrics : sequence of str
    confidence : float, default 0.95
    over : sequence of str, default ("seed",)
        Parameter columns aggregated over (left out of the group's columns).
    """
    unknown = set(over) - set(PARAMETERS)
    if unknown:
        raise InvalidOptionError(f"over: {sorted(unknown)} are not parameter columns; choose from {list(PARAMETERS)}")
    columns = [c for c in PARAMETERS if c not in over and c != "workload_sha256"]
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(json.dumps([row.get(c) for c in columns], sort_keys=True, default=str), []).append(row)
    out = []
    for members in groups.values():
        head = {c: members[0].get(c) for c in columns}
        expanded = []  # a metric holding a mapping (gpu_hours_by_type) gives one metric per key: "NAME.KEY"
        for metric in metrics:
            present = [r[metric] for r in members if r.get(metric) is not None]
            if present and isinstance(present[0], Mapping):
                keys = list(dict.fromkeys(k for value in present for k in value))
                expanded += [(f"{metric}.{k}", [value.get(k) for value in present]) for k in keys]
            else:
                expanded.append((metric, present))
        for metric, present in expanded:
            values = np.array([v for v in present if v is not None], dtype=np.float64)
            n = int(values.size)
            if n == 0:
                continue
            mean = float(values.mean())
            std = float(values.std(ddof=1)) if n > 1 else None
            low = high = None
            if std is not None:
                half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * std / math.sqrt(n)
                low, high = mean - half, mean + half
            out.append({**head, "metric": metric, "n": n, "mean": mean, "std": std, "ci95_low": low,
                        "ci95_high": high})
    return out


def write_summary(summary: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> None:
    """Write :func:`summarize`'s rows as CSV (JSON cells for lists and mappings, empty for None)."""
    columns = [c for c in GROUP_COLUMNS if not summary or c in summary[0]] + list(SUMMARY_COLUMNS)
    temporary = f"{path}.tmp"
    with open(temporary, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(columns)
        for row in summary:
            writer.writerow(["" if row.get(c) is None else json.dumps(row[c], sort_keys=True)
                             if isinstance(row[c], (dict, list)) else row[c] for c in columns])
    os.replace(temporary, path)


__all__ = ["GROUP_COLUMNS", "SUMMARY_COLUMNS", "summarize", "write_summary"]
