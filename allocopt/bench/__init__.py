"""The solver-scaling benchmark suite behind ``allocopt bench``.

Modules: :mod:`~allocopt.bench.instances` (seeded instance generators),
:mod:`~allocopt.bench.baselines` (each policy written the straightforward way
in cvxpy), :mod:`~allocopt.bench.timing` (one timed solve, split the same way
on both sides), :mod:`~allocopt.bench.suite` (policies, techniques, targets:
data), :mod:`~allocopt.bench.runner` (the grid and the targets),
:mod:`~allocopt.bench.families` (every technique on every instance family),
:mod:`~allocopt.bench.resolve` (warm re-solves), :mod:`~allocopt.bench.bounded`
(baselines in a child process bounded by time and memory),
:mod:`~allocopt.bench.output` (tables, JSON, CSV, plots, progress),
:mod:`~allocopt.bench.machine` (the machine a run was on) and
:mod:`~allocopt.bench.cli` (``add_parser`` and ``main``).
"""

from __future__ import annotations

from allocopt.bench.cli import add_parser, main

__all__ = ["add_parser", "main"]
