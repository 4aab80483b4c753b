#!/usr/bin/env python
"""Benchmark: space-sharing max-min fairness with every pair of jobs allowed to share GPUs.

``allocopt bench --policies mmf_space_sharing`` with this script's defaults:
512 single-GPU jobs drawn from the 26 scale-factor-1 models of Gavel's
measured table shipped with allocopt, all 130,816 pairs with their measured
co-located throughputs, k80/p100/v100 (:func:`allocopt.bench.instances.table_problem`),
solved three exact ways on highs (the pairwise LP, ``aggregate_job_types=True``
and ``column_generation=True``) against Gavel's
``MaxMinFairnessPolicyWithPacking`` in cvxpy with HiGHS
(:func:`allocopt.bench.baselines.max_min_fairness_space_sharing`). Any
``allocopt bench`` option overrides them. Target (reported, not
asserted): the pairwise LP at least 10x faster than cvxpy, same optimum.

Usage::

    python benchmarks/bench_space_sharing.py                   # a few minutes on 2 cores
    python benchmarks/bench_space_sharing.py --sizes 128,256   # quick
"""

from __future__ import annotations

import sys
from pathlib import Path

from allocopt.bench.cli import run

DEFAULTS = ["--policies", "mmf_space_sharing", "--sizes", "512", "--types", "3", "--baseline-time-limit", "600",
            "--out", str(Path(__file__).parent / "results" / "bench-space-sharing")]

if __name__ == "__main__":
    sys.exit(run(DEFAULTS + sys.argv[1:]))
