"""Experiments: sweeps of simulations over policies, workloads, clusters, seeds and settings.

:func:`load_spec` reads a sweep (YAML or TOML), :func:`expand` turns it into keyed
points, :func:`run_sweep` runs them (processes or Ray; resumable) into a results
table, :func:`summarize` gives means and confidence intervals over seeds and
:func:`plot_sweep` the standard figures. ``allocopt sweep SPEC`` does all four.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from allocopt._lazy import attach

if TYPE_CHECKING:
    from allocopt.experiments.figures import plot_sweep
    from allocopt.experiments.grid import Point, expand, point_key
    from allocopt.experiments.metrics import METRICS, run_metrics
    from allocopt.experiments.run import SweepResult, load_run, run_point, run_sweep, simulate_point
    from allocopt.experiments.spec import (PolicySpec, SweepSpec, SweepSpecError, WorkloadSpec, load_spec,
                                           parse_spec)
    from allocopt.experiments.summary import summarize, write_summary

# name -> module; each module is imported on first use (``allocopt sweep --help`` needs only the spec)
_EXPORTS = {"plot_sweep": "allocopt.experiments.figures",
            **dict.fromkeys(("Point", "expand", "point_key"), "allocopt.experiments.grid"),
            **dict.fromkeys(("METRICS", "run_metrics"), "allocopt.experiments.metrics"),
            **dict.fromkeys(("SweepResult", "load_run", "run_point", "run_sweep", "simulate_point"),
                            "allocopt.experiments.run"),
            **dict.fromkeys(("PolicySpec", "SweepSpec", "SweepSpecError", "WorkloadSpec", "load_spec", "parse_spec"),
                            "allocopt.experiments.spec"),
            **dict.fromkeys(("summarize", "write_summary"), "allocopt.experiments.summary")}

__all__ = ["METRICS", "Point", "PolicySpec", "SweepResult", "SweepSpec", "SweepSpecError", "WorkloadSpec", "expand",
           "load_run", "load_spec", "parse_spec", "plot_sweep", "point_key", "run_metrics", "run_point", "run_sweep",
           "simulate_point", "summarize", "write_summary"]
__getattr__, __dir__ = attach(__name__, _EXPORTS, __all__)
