"""Benchmark output: fixed-width tables, JSON, CSV, log-log plots, a progress bar, and results files.

A results file (:func:`write_results`) is the machine-readable record of one benchmark run: allocopt's
version, the machine (:func:`allocopt.bench.machine.machine_info`), the date, the command line, and the
run's tables (:func:`results_table`) and raw data. ``benchmarks/render.py`` turns the results files under
``benchmarks/results/`` into the tables the documentation shows.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import shlex
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


def milliseconds(value: float) -> str:
    """Seconds shown as milliseconds with 3 significant digits, e.g. ``1.23`` for 0.00123 s."""
    return seconds(1e3 * value)


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


#: Version of the results-file layout written by :func:`write_results`.
RESULTS_FORMAT = 1


def results_table(title: str, rows: Iterable[Mapping[str, Any]], columns: Sequence[Column]) -> dict[str, Any]:
    """A table of a results file: ``title``, the columns' headers, and each row's cells as
    :class:`Column` shows them (``-`` for None)."""
    return {"title": title, "columns": [c.header for c in columns],
            "rows": [[c.show(row.get(c.key)) for c in columns] for row in rows]}


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that ran this process, as a reader would type it: ``python benchmarks/x.py ...``
    (the script's path relative to the working directory when it lies below it)."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return "python"
    script = argv[0]
    name = os.path.basename(script)
    package = os.path.basename(os.path.dirname(os.path.abspath(script)))
    if name == "allocopt" or (name == "__main__.py" and package == "allocopt"):
        head = ["allocopt"]  # the console script, or python -m allocopt
    elif name == "__main__.py":
        head = ["python", "-m", f"allocopt.{package}"]
    elif script in ("-m", "-c"):
        head = ["python", script]
    else:
        try:
            script = os.path.relpath(script)
        except ValueError:  # another drive (Windows)
            pass
        head = ["python", script]
    return shlex.join([*head, *argv[1:]])


def write_results(path: str | os.PathLike[str], benchmark: str, *, tables: Sequence[Mapping[str, Any]] = (),
                  data: Mapping[str, Any] | None = None, machine: Mapping[str, Any] | None = None,
                  command: str | None = None) -> Path:
    """Write one benchmark run's results file and return its path.

    Parameters
    ----------
    path : path-like
        The JSON file to write (its directory is created).
    benchmark : str
        The benchmark's name, e.g. ``"bench_goodput"``.
    tables : sequence of dict
        Tables the documentation shows, each from :func:`results_table`.
    data : dict, optional
        The run's raw numbers (seconds, ratios, counts; units in the keys' names), as top-level keys
        of the document next to the ones above (a key of theirs raises ``ValueError``).
    machine : dict, optional
        :func:`allocopt.bench.machine.machine_info` taken at the start of the run (default: now).
    command : str, optional
        The command line (default: this process's, :func:`command_line`).
    """
    from allocopt import __version__
    from allocopt.bench.machine import machine_info

    info = dict(machine) if machine is not None else machine_info()
    try:
        info["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        pass
    document = {"format": RESULTS_FORMAT, "benchmark": benchmark, "allocopt_version": __version__,
                "date": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
                "command": command if command is not None else command_line(), "machine": info,
                "tables": [dict(t) for t in tables]}
    clash = sorted(set(document) & set(data or {}))
    if clash:
        raise ValueError(f"results data may not use the keys {clash}")
    document.update(data or {})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, document)
    return path


def add_results_option(parser: Any, benchmark: str, directory: str | os.PathLike[str],
                       flags: Sequence[str] = ("--results",)) -> None:
    """Add ``--results FILE`` (or ``flags``, e.g. an older ``--json``) to a benchmark script's argument
    parser, as ``args.results``: where its results file goes (default ``DIRECTORY/BENCHMARK.json``;
    an empty string writes none)."""
    default = Path(directory) / f"{benchmark}.json"
    parser.add_argument(*flags, dest="results", type=str, default=str(default), metavar="FILE",
                        help=f"write the machine-readable results here (default: {os.path.relpath(default)}; "
                             "'' for none)")


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
