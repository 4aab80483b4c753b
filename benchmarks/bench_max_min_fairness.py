#!/usr/bin/env python
"""Benchmark: heterogeneity-aware max-min fairness, allocopt vs. Gavel-style cvxpy.

``allocopt bench --policies max_min_fairness`` with this script's defaults:
random instances (:func:`allocopt.bench.instances.random_problem`) and jobs
drawn from Gavel's table, 256 to 16,384 jobs, 3 and 8 GPU types, every
installed backend, every technique, against Gavel's ``max_min_fairness_perf``
in cvxpy with HiGHS (:func:`allocopt.bench.baselines.max_min_fairness`). Any
``allocopt bench`` option overrides them.

``--profile NxK`` instead cProfiles ``allocopt.solve`` on highs for N random
jobs x K types with HiGHS's ``run()`` stubbed out: where allocopt's time
outside the solver goes.

Usage::

    python benchmarks/bench_max_min_fairness.py                          # tens of minutes on 2 cores
    python benchmarks/bench_max_min_fairness.py --sizes 256,1024 --types 3 --backends highs,scipy
    python benchmarks/bench_max_min_fairness.py --profile 16384x8
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path

import numpy as np

import allocopt
from allocopt.bench.cli import run
from allocopt.bench.instances import random_problem
from allocopt.bench.machine import format_machine, machine_info
from allocopt.bench.timing import time_allocopt


def profile_model_building(n: int, k: int, seed: int = 0, top: int = 30) -> str:
    """Time ``allocopt.solve`` on highs, then cProfile it with ``HighsBackend.run`` stubbed (returning
    zeros), so the profile holds only formulation, ``Model.compile`` and ``HighsBackend.build``."""
    from allocopt.backends.base import RawResult
    from allocopt.backends.highs import HighsBackend
    from allocopt.solution import Status

    problem = random_problem(n, k, seed)
    allocopt.solve(random_problem(64, k, seed))  # warm up imports
    real = time_allocopt(problem, "max_min_fairness")
    out = io.StringIO()
    print(f"allocopt.solve, highs, {n} jobs x {k} types: build {real.build_s:.4f} s, transfer "
          f"{real.transfer_s:.4f} s, solve {real.solve_s:.4f} s, total {real.total_s:.4f} s", file=out)
    real_run = HighsBackend.run

    def stub_run(self, handle, model, options):  # noqa: ANN001
        return RawResult(Status.OPTIMAL, "stub", x=np.zeros(model.num_cols), objective=0.0)

    HighsBackend.run = stub_run
    try:
        reps = max(3, min(200, 20000 // max(n * k, 1)))
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(reps):
            allocopt.solve(problem, "max_min_fairness")
        prof.disable()
    finally:
        HighsBackend.run = real_run
    for key in ("cumulative", "tottime"):
        print(f"\ncProfile of {reps} solves with run() stubbed, top {top} by {key}:", file=out)
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(top)
    return out.getvalue()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--profile"] and len(argv) == 2:
        try:
            n, k = (int(v) for v in argv[1].lower().split("x"))
        except ValueError:
            sys.exit(f"--profile expects NxK, e.g. 16384x8, got {argv[1]!r}")
        print(format_machine(machine_info()))
        print(profile_model_building(n, k))
        return 0
    defaults = ["--policies", "max_min_fairness", "--sizes", "256,1024,4096,16384", "--types", "3,8",
                "--backends", ",".join(allocopt.installed_backends()), "--out", str(Path(__file__).parent / "results" / "bench-max-min-fairness")]
    return run(defaults + argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
