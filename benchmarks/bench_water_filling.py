#!/usr/bin/env python
"""Benchmark: hierarchical water-filling, allocopt vs. Gavel's LP + MILP scheme in cvxpy.

``allocopt bench --policies water_filling`` with this script's defaults: 256
to 2,048 jobs in 8 entities (half ``fifo``, half ``fairness``) on 3 GPU types
(:func:`allocopt.bench.instances.water_filling_problem`), allocopt on highs
against Gavel's ``WaterFillingAlgorithm`` ported to vectorized cvxpy with
HiGHS (:class:`allocopt.bench.baselines.GavelWaterFilling`: per iteration a
max-min LP and a bottleneck MILP), which may run up to 900 s per size (past
it, its time is a lower bound). The objectives compared are the first water
level. Any ``allocopt bench`` option overrides the defaults. Target (reported,
not asserted): allocopt at least 20x faster at 2,048 jobs.

Usage::

    python benchmarks/bench_water_filling.py                        # 256, 512, 1024, 2048
    python benchmarks/bench_water_filling.py --sizes 256 --baseline-time-limit 60
"""

from __future__ import annotations

import sys
from pathlib import Path

from allocopt.bench.cli import run

DEFAULTS = ["--policies", "water_filling", "--sizes", "256,512,1024,2048", "--types", "3",
            "--baseline-time-limit", "900", "--out", str(Path(__file__).parent / "results" / "bench-water-filling")]

if __name__ == "__main__":
    sys.exit(run(DEFAULTS + sys.argv[1:]))
