#!/usr/bin/env python
"""Benchmark: ``Engine.allocate()`` after one change, and where its time goes.

An engine holds ``--jobs`` jobs of the bench's ``uniform`` family (throughputs
U[1, 10] steps/s on each of ``--types`` types, weight 5 on 20% of the jobs,
scale factors 1/2/4/8 with probabilities .7/.1/.15/.05, n/4 GPUs per type).
After a cold allocation, each of ``--repeat`` rounds changes one thing (a
throughput measurement, an arrival, a departure) and times

* ``problem``: cutting the Problem from the engine's job columns (:meth:`Engine.problem`);
* ``rebuild``: the same problem built the way the engine used to, from per-job
  records (a problem document of :meth:`Engine.get_job` objects, ``Problem.from_json``),
  measured in the same run as the baseline;
* ``allocate``: the whole warm :meth:`Engine.allocate` (problem + warm re-solve).

Medians are reported, with ``problem`` / ``rebuild`` as the ratio that counts.

Usage::

    python benchmarks/bench_engine.py --jobs 16384 --types 8 --repeat 5
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import allocopt
from allocopt.bench.machine import format_machine, machine_info
from allocopt.bench.output import (
    Column,
    add_results_option,
    milliseconds,
    ratio,
    results_table,
    seconds,
    write_results,
)


def build(jobs: int, types: int, seed: int) -> allocopt.Engine:
    rng = np.random.default_rng(seed)
    names = [f"t{j}" for j in range(types)]
    engine = allocopt.Engine({t: max(8, jobs // 4) for t in names})
    scale = rng.choice([1, 2, 4, 8], size=jobs, p=[0.7, 0.1, 0.15, 0.05])
    weight = np.where(rng.random(jobs) < 0.2, 5.0, 1.0)
    T = rng.uniform(1, 10, size=(jobs, types))
    for i in range(jobs):
        engine.add_job(f"j{i}", dict(zip(names, T[i].tolist())), scale_factor=int(scale[i]),
                       priority_weight=float(weight[i]))
    return engine


def rebuild(engine: allocopt.Engine) -> allocopt.Problem:
    """The problem from per-job records, as the engine built it before it kept columns."""
    cluster = engine.cluster
    jobs = [engine.get_job(job) for job in engine.job_ids]
    return allocopt.Problem.from_json({"cluster": {"gpus": dict(zip(cluster.gpu_types, cluster.capacity.tolist()))},
                                       "jobs": jobs})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=16384)
    parser.add_argument("--types", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    add_results_option(parser, "bench_engine", Path(__file__).parent / "results", ("--results", "--json"))
    args = parser.parse_args()
    report: dict = {"machine": machine_info(), "jobs": args.jobs, "types": args.types}
    print(format_machine(report["machine"]))
    rng = np.random.default_rng(args.seed + 1)
    started = time.perf_counter()
    engine = build(args.jobs, args.types, args.seed)
    report["build_s"] = time.perf_counter() - started
    started = time.perf_counter()
    engine.allocate()
    report["cold_allocate_s"] = time.perf_counter() - started
    times: dict[str, list[float]] = {"problem": [], "rebuild": [], "allocate": []}
    for k in range(args.repeat):
        ids = engine.job_ids
        change = ("measure", "arrive", "leave")[k % 3]
        if change == "measure":
            engine.observe_throughput(ids[int(rng.integers(len(ids)))], "t0", float(rng.uniform(1, 10)))
        elif change == "arrive":
            engine.add_job(f"new{k}", {f"t{j}": float(rng.uniform(1, 10)) for j in range(args.types)})
        else:
            engine.remove_job(ids[int(rng.integers(len(ids)))])
        started = time.perf_counter()
        problem, _ = engine.problem()
        times["problem"].append(time.perf_counter() - started)
        started = time.perf_counter()
        baseline = rebuild(engine)
        times["rebuild"].append(time.perf_counter() - started)
        if not np.array_equal(baseline.throughputs, problem.throughputs) or baseline.job_ids != problem.job_ids:
            raise SystemExit("the engine's problem differs from the one rebuilt from its records")
        started = time.perf_counter()
        engine.allocate()
        times["allocate"].append(time.perf_counter() - started)
    for name, values in times.items():
        report[f"{name}_s"] = float(np.median(values))
    report["rebuild_over_problem"] = report["rebuild_s"] / report["problem_s"]
    print(f"engine with {args.jobs} jobs x {args.types} types: cold allocate {report['cold_allocate_s']:.2f} s; "
          f"after one change (median of {args.repeat}): allocate {report['allocate_s']:.3f} s, of which problem "
          f"{report['problem_s'] * 1e3:.1f} ms (rebuilt from per-job records: {report['rebuild_s'] * 1e3:.0f} ms, "
          f"{report['rebuild_over_problem']:.0f}x)")
    if args.results:
        table = results_table(f"Engine with {args.jobs:,} jobs x {args.types} GPU types, after one change "
                              f"(median of {args.repeat})", [report],
                              [Column("cold_allocate_s", "cold allocate s", seconds),
                               Column("allocate_s", "allocate after one change s", seconds),
                               Column("problem_s", "problem from the job columns ms", milliseconds),
                               Column("rebuild_s", "problem rebuilt from per-job records ms", milliseconds),
                               Column("rebuild_over_problem", "rebuilt / columns", ratio)])
        write_results(args.results, "bench_engine", tables=[table], machine=report.pop("machine"), data=report)


if __name__ == "__main__":
    main()
