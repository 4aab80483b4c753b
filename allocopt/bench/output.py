"""Benchmark output: fixed-width tables, JSON, CSV, log-log plots and a progress bar."""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Column:
    """A table column: the row key, its header and how a value is shown (``-`` for None)."""

    key: str
    header: str
    fmt: str | Callable[[Any], str] = ""
    left: bool = False

    def show(self, value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        if callable(self.fmt):
            return self.fmt(value)
        return format(value, self.fmt)


def seconds(value: float) -> str:
    """Seconds with 3 significant digits, e.g. ``0.0123``, ``1.23``, ``123``."""
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def ratio(value: float) -> str:
    """A ratio formatted for a table (e.g. ``12x``)."""
    return f"{value:.2g}x" if value < 10 else f"{value:.0f}x"


def format_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[Column], *, group: str | None = None) -> str:
    """``rows`` as a fixed-width table; a blank line wherever ``row[group]`` changes."""
    cells = [[c.header for c in columns]]
    breaks = []
    last = object()
    for row in rows:
        if group is not None and row.get(group) != last and len(cells) > 1:
            breaks.append(len(cells))
        last = row.get(group) if group is not None else last
        cells.append([c.show(row.get(c.key)) for c in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = []
    for n, r in enumerate(cells):
        if n in breaks:
            lines.append("")
        lines.append("  ".join(v.ljust(w) if c.left else v.rjust(w)
                               for v, w, c in zip(r, widths, columns)).rstrip())
        if n == 0:
            lines.append("-" * len(lines[0]))
    return "\n".join(lines)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.floating, np.integer, np.bool_)):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def _finite(obj: Any) -> Any:
    """NaN and infinities become None (JSON has neither)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    """Write ``document`` as indented JSON (NaN and infinities as null, numpy values as numbers)."""
    path.write_text(json.dumps(_finite(document), indent=2, default=_json_default) + "\n")


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> None:
    """Write ``rows`` as CSV with the columns ``fields`` (other keys left out)."""
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def plot_times(rows: Sequence[Mapping[str, Any]], out_dir: Path) -> list[Path]:
    """One PNG per backend, ``bench-<backend>.png``: a log-log panel per policy of total seconds vs jobs,
    a solid line per (technique, instance, GPU types) and a dashed one for the cvxpy baseline.
    Returns the files written; [] when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        return []
    written = []
    for backend in dict.fromkeys(r["backend"] for r in rows):
        mine = [r for r in rows if r["backend"] == backend]
        policies = list(dict.fromkeys(r["policy"] for r in mine))
        cols = min(3, len(policies))
        nrows = math.ceil(len(policies) / cols)
        fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.8 * nrows), squeeze=False)
        for ax, policy in zip(axes.flat, policies):
            lines: dict[tuple[str, ...], list[tuple[int, float]]] = {}
            for r in mine:
                if r["policy"] != policy:
                    continue
                series = f"{r['instance']}, {r['n_gpu_types']} types"
                if r["status"] == "ok":
                    lines.setdefault((r["technique"], series), []).append((r["n_jobs"], r["total_s"]))
                if r.get("baseline_total_s") and r.get("baseline_status") == "ok":
                    lines.setdefault(("cvxpy baseline", series), []).append((r["n_jobs"], r["baseline_total_s"]))
            for (label, series), points in lines.items():
                xs, ys = zip(*sorted(set(points)))
                ax.loglog(xs, ys, marker="o", linestyle="--" if label == "cvxpy baseline" else "-",
                          label=f"{label} ({series})")
            sizes = sorted({x for points in lines.values() for x, _ in points})
            ax.set_xticks(sizes, [f"{x:,}" for x in sizes], fontsize=7)
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_title(policy)
            ax.set_xlabel("jobs")
            ax.set_ylabel("seconds, end to end")
            ax.grid(True, which="both", alpha=0.3)
            if lines:
                ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(policies):]:
            ax.axis("off")
        fig.suptitle(f"allocopt backend {backend} vs cvxpy baselines")
        fig.tight_layout()
        path = out_dir / f"bench-{backend}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


class Progress:
    """A tqdm bar on stderr when tqdm is installed, else ``[i/N] what`` lines on stderr."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.enabled = total, 0, enabled
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, file=sys.stderr, unit="run", dynamic_ncols=True)

    def step(self, what: str) -> None:
        """Announce the run about to start."""
        if self._bar is not None:
            self._bar.set_description_str(what, refresh=True)
        elif self.enabled:
            sys.stderr.write(f"[{self.done + 1}/{self.total}] {what}\n")  # the bench command's progress
            sys.stderr.flush()

    def advance(self) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
