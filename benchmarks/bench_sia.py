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

``--dumped DIR`` instead times the rounds Sia's own simulator produced, as
``conformance_sia.py --dump-rounds DIR`` pickled them (the stand-in's
``GoodputProblem`` and options, per round): ``allocopt.solve`` as the stand-in
calls it (``mip_gap`` 1e-4, the default technique), the same at ``mip_gap=0``,
each of the two techniques by name, and Sia's own program (:func:`allocopt.formulations.sia_programs.solve_sia_round`:
Sia's float32 utilities and cvxpy expressions) with each of ``--sia-solvers``
installed in cvxpy (default GLPK_MI, which needs cvxopt, and CBC, which needs
cylp), each timed whole (building included), best of ``--repeat``.

Usage::

    python benchmarks/bench_sia.py                      # both rounds, 3 repeats
    python benchmarks/bench_sia.py --repeat 1 --rounds first --json out.json
    python benchmarks/bench_sia.py --dumped /tmp/sia_rounds --json dumped.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from allocopt.bench import baselines
from allocopt.bench.instances import SIA_JOBS_PER_SCALE, sia_rounds
from allocopt.bench.machine import format_machine, machine_info
from allocopt.bench.output import (
    Column,
    add_results_option,
    format_table,
    ratio,
    results_table,
    seconds,
    write_results,
)
from allocopt.bench.timing import Measurement, time_allocopt

TARGET_HIGHS_S = 0.5  # sia, 5,120 jobs on 2,048 GPUs: seconds per round

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
    add_results_option(parser, "bench_sia", Path(__file__).parent / "results", ("--results", "--json"))
    parser.add_argument("--dumped", type=Path, metavar="DIR",
                        help="time the rounds conformance_sia.py --dump-rounds DIR pickled (every round-*.pkl "
                             "under DIR) instead of the scale rounds")
    parser.add_argument("--sia-solvers", default="GLPK_MI,CBC",
                        help="cvxpy solvers for Sia's own program on the dumped rounds (those not installed are "
                             "left out)")
    args = parser.parse_args(argv)

    info = machine_info()
    print(format_machine(info), flush=True)
    if args.dumped:
        return dumped_rounds(args.dumped, args.sia_solvers.split(","), args.repeat, info, args.results or None)
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
    if args.results:
        write_results(args.results, "bench_sia", machine=info, data={"source": source, "rows": rows},
                      tables=[results_table(f"Sia's goodput MILP, {first.num_jobs:,} jobs on "
                                            f"{int(first.cluster.capacity.sum()):,} GPUs ({source})", rows, COLUMNS)])
    return 0


def dumped_rounds(directory: Path, sia_solvers: list[str], repeat: int, info: dict, out: str | None) -> int:
    """Per dumped round: allocopt as the stand-in calls it, exact, and Sia's program with each solver."""
    import pickle
    import time

    import cvxpy as cp
    import numpy as np

    import allocopt
    from allocopt.formulations.sia_programs import ZERO_GOODPUT, solve_sia_round

    solvers = [name for name in sia_solvers if name in cp.installed_solvers()]
    paths = sorted(directory.rglob("round-*.pkl"))
    if not paths:
        print(f"no round-*.pkl under {directory}; write them with conformance_sia.py --dump-rounds", file=sys.stderr)
        return 2

    def best(call) -> tuple[float, object]:
        times, result = [], None
        for _ in range(repeat):
            t0 = time.perf_counter()
            result = call()
            times.append(time.perf_counter() - t0)
        return min(times), result

    rows = []
    for path in paths:
        record = pickle.loads(path.read_bytes())
        problem, options = record["problem"], dict(record["options"])
        row = {"round": f"{path.parent.name}/{path.stem}", "jobs": problem.num_jobs,
               "configurations": problem.num_configurations}
        row["allocopt_s"], alloc = best(lambda: allocopt.solve(problem, record["policy"], **options))
        row["technique"] = alloc.extras.get("technique")
        row["allocopt_exact_s"], _ = best(lambda: allocopt.solve(problem, record["policy"],
                                                                     **{**options, "mip_gap": 0.0}))
        for technique in ("relaxation_first", "whole_milp"):
            row[f"{technique}_s"], _ = best(lambda: allocopt.solve(problem, record["policy"], technique=technique,
                                                                   **options))
        configs = problem.configurations
        goodput = np.where(problem.goodput > 0, problem.goodput, ZERO_GOODPUT).astype(np.float32)
        for name in solvers:
            row[f"sia_{name}_s"], result = best(lambda: solve_sia_round(
                goodput, configs.gpu_type, configs.num_gpus, problem.cluster.capacity, problem.previous,
                problem.pinned, problem.restart_factor, options["p"], options["lambda_n"],
                decimals=options.get("utility_decimals", 2), clip=options.get("utility_clip", 3000.0),
                solver=name, mip_gap=options.get("mip_gap", 1e-4)))
            row[f"sia_{name}_status"] = result.status
        rows.append(row)
    summary = {"rounds": len(rows), "jobs": [min(r["jobs"] for r in rows), max(r["jobs"] for r in rows)]}
    print(f"{len(rows)} rounds from {directory}: {summary['jobs'][0]}-{summary['jobs'][1]} jobs; seconds per "
          "round, best of --repeat (median / max over the rounds)")
    columns = ["allocopt_s", "allocopt_exact_s", "relaxation_first_s", "whole_milp_s",
               *(f"sia_{name}_s" for name in solvers)]
    for column in columns:
        values = np.array([r[column] for r in rows])
        summary[column] = {"median": float(np.median(values)), "max": float(values.max()),
                           "total": float(values.sum())}
        print(f"  {column:<20} median {np.median(values) * 1e3:8.2f} ms   max {values.max() * 1e3:8.2f} ms   "
              f"total {values.sum():7.2f} s")
    for name in solvers:
        own = np.array([r[f"sia_{name}_s"] for r in rows])
        for column in ("allocopt_s", "allocopt_exact_s"):
            ours = np.array([r[column] for r in rows])
            faster = int((ours <= own).sum())
            summary[f"{column}_vs_{name}"] = {"rounds_at_least_as_fast": faster,
                                              "median_ratio": float(np.median(ours / own))}
            print(f"  {column} vs Sia's program with {name}: at least as fast on {faster} of {len(rows)} rounds, "
                  f"median ratio {np.median(ours / own):.2f}")
    if out:
        write_results(out, "bench_sia", machine=info, data={"source": str(directory), "summary": summary, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
