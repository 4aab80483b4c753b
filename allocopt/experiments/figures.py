"""The standard figures of a sweep (matplotlib, the ``plot`` extra), written as PNG files.

* ``jct_vs_load.png``: average and p99 JCT against the arrival rate, one line per policy with its 95%
  confidence band over seeds (generated workloads);
* ``jct_cdf.png`` and ``ftf_cdf.png``: JCT and finish-time-fairness CDFs over the measured jobs of every
  seed, one panel per workload (and rate, cluster, round length), one line per policy;
* ``timeline.png``: utilization (GPUs leased over GPUs) and queue length (jobs arrived, not finished) over
  time, one line per policy, for the busiest workload's first seed.

Figures are built without pyplot, so matplotlib's backend and pyplot's state are left alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from allocopt.experiments.metrics import queue_length
from allocopt.experiments.run import load_run
from allocopt.experiments.summary import summarize

logger = logging.getLogger(__name__)

#: The settings that make a panel: every one but the policy and the seed.
CASE_COLUMNS = ("workload", "jobs_per_hour", "cluster", "round_seconds")
MAX_PANELS = 6


def _case(row: Mapping[str, Any]) -> tuple:
    return tuple(row[c] for c in CASE_COLUMNS)


def _case_title(case: tuple) -> str:
    workload, rate, cluster, round_s = case
    return f"{workload}{f' {rate:g} jobs/h' if rate is not None else ''}\n{cluster}, {round_s:g} s rounds"


def _colors(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    labels = list(dict.fromkeys(r["policy_label"] for r in rows))
    return {label: f"C{k % 10}" for k, label in enumerate(labels)}


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    return path


def plot_load(rows: Sequence[Mapping[str, Any]], path: Path) -> Path | None:
    """Average and p99 JCT (hours) against arrival rate (jobs/hour), per policy, with 95% CI bands."""
    from matplotlib.figure import Figure

    generated = [r for r in rows if r["jobs_per_hour"] is not None]
    if not generated:
        logger.info("no generated workloads: no JCT-against-load figure")
        return None
    colors = _colors(generated)
    fig = Figure(figsize=(11, 4), layout="constrained")
    axes = fig.subplots(1, 2)
    summary = summarize(generated, ("average_jct_s", "p99_jct_s"))
    series: dict[tuple, list[dict[str, Any]]] = {}
    for s in summary:
        series.setdefault((s["policy_label"], s["workload"], s["cluster"], s["round_seconds"], s["metric"]),
                          []).append(s)
    others = {(k[1], k[2], k[3]) for k in series}
    for (label, workload, cluster, round_s, metric), points in series.items():
        ax = axes[0 if metric == "average_jct_s" else 1]
        points.sort(key=lambda s: s["jobs_per_hour"])
        x = np.array([s["jobs_per_hour"] for s in points])
        y = np.array([s["mean"] for s in points]) / 3600
        name = label if len(others) == 1 else f"{label} ({workload}, {cluster}, {round_s:g} s)"
        ax.plot(x, y, marker="o", color=colors[label], label=name)
        if all(s["ci95_low"] is not None for s in points):
            ax.fill_between(x, np.array([s["ci95_low"] for s in points]) / 3600,
                            np.array([s["ci95_high"] for s in points]) / 3600, color=colors[label], alpha=0.25)
    for ax, what in zip(axes, ("average JCT", "p99 JCT")):
        ax.set(xlabel="arrival rate (jobs/hour)", ylabel=f"{what} (hours)", title=f"{what}, mean and 95% CI")
        ax.legend(fontsize="small")
    return _save(fig, path)


def _cases(rows: Sequence[Mapping[str, Any]]) -> list[tuple]:
    cases = list(dict.fromkeys(_case(r) for r in rows))
    if len(cases) > MAX_PANELS:
        cases = [cases[int(k)] for k in np.linspace(0, len(cases) - 1, MAX_PANELS).round()]
    return cases


def plot_cdf(rows: Sequence[Mapping[str, Any]], output: Path, column: str, xlabel: str, path: Path,
             scale: float = 1.0) -> Path | None:
    """CDF of the per-job array ``job_<column>`` over each panel's measured jobs of every seed."""
    from matplotlib.figure import Figure

    cases = _cases(rows)
    colors = _colors(rows)
    fig = Figure(figsize=(4.5 * min(len(cases), 3), 3.6 * ((len(cases) + 2) // 3)), layout="constrained")
    axes = np.atleast_1d(fig.subplots((len(cases) + 2) // 3, min(len(cases), 3))).ravel()
    drawn = False
    for ax, case in zip(axes, cases):
        for label in colors:
            values = []
            for row in rows:
                if _case(row) == case and row["policy_label"] == label:
                    arrays = load_run(output, row["key"])
                    if f"job_{column}" in arrays:
                        a, b = arrays["window"]
                        values.append(arrays[f"job_{column}"][a:b])
            if values:
                v = np.sort(np.concatenate(values)) / scale
                ax.plot(v, np.arange(1, v.size + 1) / v.size, color=colors[label], label=label)
                drawn = True
        ax.set(xlabel=xlabel, ylabel="fraction of jobs", title=_case_title(case))
        ax.title.set_fontsize("small")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    for ax in axes[len(cases):]:
        ax.set_visible(False)
    if not drawn:
        return None
    return _save(fig, path)


def plot_timeline(rows: Sequence[Mapping[str, Any]], output: Path, path: Path) -> Path:
    """Utilization and queue length over time (hours), per policy, for one workload's first seed."""
    from matplotlib.figure import Figure

    case = max(_cases(rows), key=lambda c: (c[1] or 0.0))  # the highest arrival rate (the first file otherwise)
    seed = min(r["seed"] for r in rows if _case(r) == case)
    colors = _colors(rows)
    fig = Figure(figsize=(11, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    gpus = None
    for row in rows:
        if _case(row) != case or row["seed"] != seed:
            continue
        if gpus is None:
            gpus = sum(int(item.split("=")[1]) for item in row["cluster"].split(","))
        arrays = load_run(output, row["key"])
        start = arrays["round_start_s"]
        hours = start / 3600
        left.step(hours, arrays["round_busy_gpus"] / max(gpus, 1), where="post", color=colors[row["policy_label"]],
                  label=row["policy_label"], linewidth=0.8)
        jobs = {"arrival_s": arrays["job_arrival_s"], "finish_s": arrays["job_finish_s"]}
        right.step(hours, queue_length(jobs, start), where="post", color=colors[row["policy_label"]],
                   label=row["policy_label"], linewidth=0.8)
    left.set(xlabel="time (hours)", ylabel="GPUs leased / GPUs", title=f"utilization ({_case_title(case)}, seed {seed})")
    right.set(xlabel="time (hours)", ylabel="jobs in the system", title="queue length")
    for ax in (left, right):
        ax.title.set_fontsize("small")
        ax.legend(fontsize="small")
    return _save(fig, path)


def plot_sweep(rows: Sequence[Mapping[str, Any]], output: str | os.PathLike[str],
               directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """Every figure of the module docstring for ``rows`` (a sweep's table) whose runs are in ``output``;
    written to ``directory`` (default ``output/figures``). Returns the files written.

    Raises
    ------
    BackendNotInstalledError
        Without matplotlib (``pip install 'allocopt[plot]'``).
    """
    from allocopt.extras import require_extra
    require_extra("matplotlib", "plot", "the sweep's figures")
    output = Path(output)
    directory = Path(directory) if directory is not None else output / "figures"
    directory.mkdir(parents=True, exist_ok=True)
    if not rows:
        return []
    written = [plot_load(rows, directory / "jct_vs_load.png"),
               plot_cdf(rows, output, "jct_s", "JCT (hours)", directory / "jct_cdf.png", scale=3600),
               plot_cdf(rows, output, "ftf", "finish-time fairness", directory / "ftf_cdf.png"),
               plot_timeline(rows, output, directory / "timeline.png")]
    return [p for p in written if p is not None]


__all__ = ["plot_cdf", "plot_load", "plot_sweep", "plot_timeline"]
