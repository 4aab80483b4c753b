#!/usr/bin/env python
"""Benchmark: the Sia configuration MILP at 2,048 GPUs and 5,120 jobs, first and steady rounds, vs cvxpy.

The instance (:func:`allocopt.bench.instances.sia_rounds`) has the shape of
Sia's scale experiment ``scale_32x``: the saturn cluster scaled 32x (2,048
GPUs) and 5,120 jobs (the applications and replicas of
``workloads/scale/scale_32x/workload-N.csv`` when ``--data-dir`` holds Sia's
data, else a seeded draw with its application mix), synthetic seeded goodput.

``first``
    no job has a previous configuration;
``steady``
    the next round: every job has the configuration the first round gave it,
    goodput moved by a log-normal factor (sigma 0.1), restart factors from
    synthetic ages and restart counts, and 2% of the running jobs pinned.

For each round: ``allocopt[highs]``; ``cvxpy-sia[HIGHS]``, the same model as one
cvxpy expression tree (:func:`allocopt.bench.baselines.sia`) with the HiGHS
options allocopt passes (presolve off); ``allocopt[cvxpy]`` (allocopt's cvxpy
backend on HiGHS); with ``--cvxpy-defaults`` also cvxpy with HiGHS's defaults
(presolve on: about a minute). ``allocopt bench --policies sia`` runs the
first round at other sizes.

Usage::

    python benchmarks/bench_sia.py                      # both rounds, 3 repeats
    python benchmarks/bench_sia.py --repeat 1 --rounds first --json out.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from allocopt.bench import baselines
from allocopt.bench.instances import SIA_JOBS_PER_SCALE, sia_rounds
from allocopt.bench.machine import format_machine, machine_info
from allocopt.bench.output import Column, format_table, ratio, seconds, write_json
from allocopt.bench.timing import Measurement, time_allocopt

TARGET_HIGHS_S = 0.5  # issue 7: sia, 5,120 jobs on 2,048 GPUs

COLUMNS = (Column("round", "round", left=True), Column("solver", "solver", left=True),
           Column("build_s", "build_s", seconds), Column("transfer_s", "transfer_s", seconds),
           Column("solve_s", "solve_s", seconds), Column("total_s", "total_s", seconds),
           Column("ratio", "vs highs", ratio), Column("objective", "objective", ".6f"),
           Column("rel_diff", "rel.diff", ".1e"), Column("note", "note", left=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=32, help="cluster and trace scale (default 32: 2,048 GPUs)")
    parser.add_argument("--workload", type=int, default=1, help="workload-N.csv of the scale trace")
    parser.add_argument("--data-dir", type=Path,
                        help="a folder with Sia's released data under sia/ (sia/workloads/scale, sia/seed_profiles) "
                             "to read the scale trace from; default: Sia's application mix, drawn with --seed, and "
                             "the seed profiles shipped with allocopt")
    parser.add_argument("--rounds", default="first,steady", help="comma-separated: first, steady")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--uncapped", action="store_true",
                        help="configurations up to every node of a type (default: Sia's profiled node caps)")
    parser.add_argument("--no-cvxpy", action="store_true", help="allocopt[highs] only")
    parser.add_argument("--cvxpy-defaults", action="store_true", help="also cvxpy's HIGHS with default options")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    info = machine_info()
    print(format_machine(info), flush=True)
    names = args.rounds.split(",")
    problems, source = sia_rounds(SIA_JOBS_PER_SCALE * args.scale, args.seed, data_dir=args.data_dir,
                                  workload=args.workload, capped=not args.uncapped, steady="steady" in names)
    first = problems["first"]
    print(f"{first.num_jobs} jobs from {source}; {int(first.cluster.capacity.sum())} GPUs; "
          f"{first.num_configurations} configurations")
    rows = []
    for name in names:
        problem = problems[name]
        runs: dict[str, Measurement] = {"allocopt[highs]": time_allocopt(problem, "sia", repeat=args.repeat)}
        if not args.no_cvxpy:
            runs["cvxpy-sia[HIGHS]"] = baselines.sia(problem, {}, None, args.repeat)
            runs["allocopt[cvxpy:HIGHS]"] = time_allocopt(problem, "sia", backend="cvxpy", repeat=args.repeat,
                                                          solver_options={"solver": "HIGHS"})
            if args.cvxpy_defaults:
                runs["cvxpy-sia[HIGHS, defaults]"] = baselines.sia(problem, {}, None, highs_defaults=True)
        base = runs["allocopt[highs]"]
        for solver, m in runs.items():
            row = {"round": name, "solver": solver, **m.summary(), "note": "" if m.ok else m.status}
            if m.ok and base.ok and m is not base:
                row["ratio"] = m.total_s / base.total_s
                row["rel_diff"] = abs(m.objective - base.objective) / max(1.0, abs(base.objective))
            rows.append(row)
        if base.ok:
            print(f"target [{name}]: allocopt[highs] {base.total_s:.3f} s per solve, target <= {TARGET_HIGHS_S} s: "
                  f"{'MET' if base.total_s <= TARGET_HIGHS_S else 'MISSED'}")
    print(format_table(rows, COLUMNS, group="round"))
    print("vs highs: this solver's total / allocopt[highs]'s total (above 1: allocopt is faster)")
    if args.json:
        write_json(args.json, {"machine": info, "source": source, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
