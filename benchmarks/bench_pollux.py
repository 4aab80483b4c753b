"""Pollux's policy: the exact MILP against Pollux's genetic search, per round, and at scale.

``--dumped DIR`` reads the rounds ``conformance_pollux.py --dump-rounds DIR`` pickled
from Sia's own Pollux run (each round's :class:`~allocopt.PolluxProblem`, the
replicas Sia's NSGA-II search chose, the fitness Sia's own code gives them and
the seconds its ``optimize()`` took) and solves each round exactly: the
distributions of fitness (exact - Sia's search, and allocopt's fitness of Sia's
answer against Sia's own, which checks the objective) and of time per round, and
the ratio of Sia's ``optimize()`` time to the exact solve's::

    python benchmarks/bench_pollux.py --dumped /tmp/pollux-rounds [--genetic]
    python benchmarks/bench_pollux.py --dumped /tmp/pollux-rounds --scale 512 2048 --genetic

``--genetic`` also runs allocopt's genetic search (pymoo 0.6, seed 0) on each round.
``--scale JOBS GPUS`` builds one round of ``JOBS`` jobs on ``GPUS`` GPUs (4-GPU
nodes, as Sia's unaware simulator sees its cluster) from the dumped rounds' jobs
(each job of the dumped rounds repeated, speedups as dumped; half of them holding
their previous allocation; restart factors drawn per job, so the jobs are distinct) and times the
exact solve (by default the MILP over groups of nodes,
:mod:`allocopt.formulations.pollux_groups`) and the genetic search on it (``--generations``:
Pollux's 100 take about 15 s each at 512 jobs on 512 nodes, so the results use fewer and give
seconds per generation).

Either mode writes its results file (``--results``, default ``benchmarks/results/bench_pollux.json``):
the dumped rounds it read (directory and rounds per run), every round's numbers and their
distributions, or the scaled round's.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

import allocopt
from allocopt import Cluster
from allocopt.bench.machine import machine_info
from allocopt.bench.output import (
    Column,
    add_results_option,
    results_table,
    seconds,
    write_results,
)
from allocopt.formulations.pollux import fitness
from allocopt.pollux_problem import PolluxProblem

RESULTS = Path(__file__).parent / "results"
QUANTILE_COLUMNS = ("min", "median", "p90", "max")


def quantiles(values: list[float]) -> str:
    a = np.asarray(values, dtype=np.float64)
    if not a.size:
        return "-"
    return (f"min {a.min():.4g}  median {np.median(a):.4g}  p90 {np.quantile(a, 0.9):.4g}  max {a.max():.4g}  "
            f"(n={a.size})")


def distribution(values: list[float]) -> dict[str, float | int | None]:
    """min, median, p90 and max of ``values`` (None when empty), and their number."""
    a = np.asarray(values, dtype=np.float64)
    if not a.size:
        return {**dict.fromkeys(QUANTILE_COLUMNS), "n": 0}
    return {"min": float(a.min()), "median": float(np.median(a)), "p90": float(np.quantile(a, 0.9)),
            "max": float(a.max()), "n": int(a.size)}


def dumped(directory: Path, genetic: bool, tolerance: float, machine: dict, out: str | None) -> int:
    rounds = sorted(directory.rglob("round-*.pkl"))
    if not rounds:
        print(f"no round-*.pkl under {directory}")
        return 1
    gain, objective_error, exact_s, sia_s, speedup, ours_ga_s, ours_ga_gain = [], [], [], [], [], [], []
    worse = within = 0
    per_round = []
    for path in rounds:
        data = pickle.loads(path.read_bytes())
        problem, replicas, p = data["problem"], data["replicas"], float(data["p"])
        ga = fitness(problem, replicas, p)
        objective_error.append(abs(ga - data["sia_fitness"]) / abs(data["sia_fitness"]))
        t0 = time.perf_counter()
        alloc = allocopt.solve(problem, "pollux", p=p)
        elapsed = time.perf_counter() - t0
        exact_s.append(elapsed)
        sia_s.append(data["seconds"])
        speedup.append(data["seconds"] / elapsed)
        gain.append(alloc.objective - ga)
        if alloc.objective < ga * (1 - tolerance):
            worse += 1
            print(f"  {path}: exact {alloc.objective:.9g} < Sia's search {ga:.9g}")
        elif alloc.objective < ga:
            within += 1
        if genetic:
            t0 = time.perf_counter()
            ours = allocopt.solve(problem, "pollux", p=p, technique="genetic", seed=0)
            ours_ga_s.append(time.perf_counter() - t0)
            ours_ga_gain.append(alloc.objective - ours.objective)
        per_round.append({"round": path.relative_to(directory).as_posix(), "jobs": int(problem.num_jobs),
                          "nodes": int(replicas.shape[1]), "sia_fitness": float(data["sia_fitness"]),
                          "exact_fitness": float(alloc.objective), "exact_s": elapsed, "sia_optimize_s": sia_s[-1],
                          **({"genetic_s": ours_ga_s[-1], "exact_minus_genetic": ours_ga_gain[-1]} if genetic else {})})
    print(f"{len(rounds)} rounds from {directory}")
    print(f"  allocopt's fitness of Sia's answer vs Sia's own, relative error: {quantiles(objective_error)}")
    print(f"  exact fitness - Sia's search fitness: {quantiles(gain)}; exact below it by more than {tolerance:g} "
          f"(relative) in {worse} rounds, by less in {within}")
    print(f"  exact solve s: {quantiles(exact_s)}")
    print(f"  Sia's optimize() s: {quantiles(sia_s)}")
    print(f"  Sia's optimize() s / exact s: {quantiles(speedup)}; median-time ratio "
          f"{np.median(sia_s) / np.median(exact_s):.1f}x")
    if genetic:
        print(f"  allocopt genetic s: {quantiles(ours_ga_s)}; exact - its fitness: {quantiles(ours_ga_gain)}")
    if out:
        runs = dict(Counter(path.parent.relative_to(directory).as_posix() for path in rounds))
        times = [{"solve": "exact (allocopt MILP)", **distribution(exact_s)},
                 {"solve": "Sia's optimize() (NSGA-II, pymoo 0.4)", **distribution(sia_s)}]
        if genetic:
            times.append({"solve": "allocopt genetic (pymoo 0.6, seed 0)", **distribution(ours_ga_s)})
        fitnesses = [{"quantity": "allocopt's fitness of Sia's answer vs Sia's own, relative error",
                      **distribution(objective_error)},
                     {"quantity": "exact fitness - Sia's search fitness", **distribution(gain)},
                     {"quantity": "Sia's optimize() s / exact s", **distribution(speedup)}]
        if genetic:
            fitnesses.append({"quantity": "exact fitness - allocopt genetic fitness", **distribution(ours_ga_gain)})
        source = ", ".join(f"{name}: {n}" for name, n in runs.items())
        jobs = [min(r["jobs"] for r in per_round), max(r["jobs"] for r in per_round)]
        summary = {"rounds": len(rounds), "runs": runs, "jobs_per_round": jobs, "tolerance": tolerance,
                   "rounds_exact_below_tolerance": worse, "rounds_exact_below_within_tolerance": within,
                   "median_time_ratio": float(np.median(sia_s) / np.median(exact_s))}
        seconds_table = results_table(f"Seconds per round, {len(rounds)} rounds of Sia's Pollux, {jobs[0]}-{jobs[1]} "
                                      f"jobs per round ({source})", times,
                                      [Column("solve", "solve", left=True),
                                       *(Column(q, f"{q} s", seconds) for q in QUANTILE_COLUMNS)])
        seconds_table["notes"] = ["Sia's optimize() seconds are those its own run measured (conformance_pollux.py "
                                  "--dump-rounds), under that run's machine load; the exact solves are timed here."]
        tables = [seconds_table,
                  results_table(f"Exact MILP against Sia's search, {len(rounds)} rounds (exact below the search by "
                                f"more than {tolerance:g} relative in {worse})", fitnesses,
                                [Column("quantity", "quantity", left=True), *(Column(q, q, ".4g")
                                                                              for q in QUANTILE_COLUMNS)])]
        write_results(out, "bench_pollux", tables=tables, machine=machine,
                      data={"mode": "dumped", "source": str(directory), "summary": summary,
                            "distributions": {"exact_s": distribution(exact_s), "sia_optimize_s": distribution(sia_s),
                                              "sia_over_exact_s": distribution(speedup),
                                              "exact_minus_sia_fitness": distribution(gain),
                                              "objective_relative_error": distribution(objective_error),
                                              **({"genetic_s": distribution(ours_ga_s),
                                                  "exact_minus_genetic_fitness": distribution(ours_ga_gain)}
                                                 if genetic else {})},
                            "per_round": per_round})
    return 0 if worse == 0 else 2


def scaled(directory: Path, jobs: int, gpus: int, genetic: bool, machine: dict, out: str | None,
           generations: int = 100) -> int:
    rounds = sorted(directory.rglob("round-*.pkl"))
    tables = []
    for path in rounds:
        problem = pickle.loads(path.read_bytes())["problem"]
        tables.extend(problem.speedup[i, 0] for i in range(problem.num_jobs))
    if not tables:
        print(f"no round-*.pkl under {directory}")
        return 1
    width = max(t.shape[1] for t in tables)
    pool = np.stack([np.pad(t, ((0, 0), (0, width - t.shape[1]))) for t in tables])
    rng = np.random.default_rng(0)
    S = pool[rng.integers(0, pool.shape[0], jobs)][:, None]
    nodes = gpus // 4
    previous = np.zeros((jobs, nodes), dtype=np.int64)
    free = np.full(nodes, 4)
    for i in range(0, jobs, 2):  # half the jobs hold a one-node allocation from the last round
        want = int(rng.integers(1, 5))
        fits = np.flatnonzero(free >= want)
        if fits.size and S[i, 0, 0, want] > 0:
            previous[i, fits[0]] = want
            free[fits[0]] -= want
    problem = PolluxProblem(S, Cluster({"gpu": gpus}, gpus_per_node=4), previous=previous,
                            restart_factor=rng.uniform(0.5, 0.99, jobs))
    t0 = time.perf_counter()
    alloc = allocopt.solve(problem, "pollux")
    elapsed = time.perf_counter() - t0
    extras = alloc.extras
    print(f"{jobs} jobs on {gpus} GPUs ({nodes} nodes of 4): exact {elapsed:.3f} s (solver {alloc.timings.solve_s:.3f} s "
          f"in {alloc.timings.num_solves} solves), fitness {alloc.objective:.6g}, status {alloc.status.value}, gap "
          f"{extras['mip_gap']}, MILP {extras.get('milp_columns')} columns x {extras.get('milp_rows')} rows, "
          f"integer flows solved whole: {extras.get('integer_flows_solved_whole')}", flush=True)
    row = {"jobs": jobs, "gpus": gpus, "nodes": nodes, "dumped_rounds": len(rounds), "exact_s": elapsed,
           "exact_solver_s": alloc.timings.solve_s, "exact_fitness": float(alloc.objective),
           "status": alloc.status.value, "mip_gap": extras.get("mip_gap"), "milp_columns": extras.get("milp_columns"),
           "milp_rows": extras.get("milp_rows"), "job_classes": extras.get("job_classes"),
           "integer_flows_solved_whole": extras.get("integer_flows_solved_whole")}
    if genetic:
        t0 = time.perf_counter()
        ga = allocopt.solve(problem, "pollux", technique="genetic", seed=0, generations=generations)
        row.update(genetic_s=time.perf_counter() - t0, genetic_fitness=float(ga.objective), generations=generations)
        row["genetic_s_per_generation"] = row["genetic_s"] / generations
        print(f"  genetic (pymoo 0.6, population 100, {generations} generations): {row['genetic_s']:.2f} s, "
              f"fitness {ga.objective:.6g}", flush=True)
    if out:
        columns = [Column("jobs", "jobs", ","), Column("gpus", "GPUs", ","), Column("exact_s", "exact s", seconds),
                   Column("exact_solver_s", "of which HiGHS s", seconds), Column("exact_fitness", "exact fitness", ".6g"),
                   Column("status", "status", left=True), Column("mip_gap", "gap"),
                   Column("milp_columns", "MILP columns", ",")]
        if genetic:
            columns += [Column("generations", "genetic generations"), Column("genetic_s", "genetic s", seconds),
                        Column("genetic_s_per_generation", "genetic s per generation", seconds),
                        Column("genetic_fitness", "genetic fitness", ".6g")]
        table = results_table(f"One round of {jobs:,} jobs on {gpus:,} GPUs ({nodes:,} nodes of 4), speedup tables "
                              f"drawn from {len(rounds)} dumped rounds", [row], columns)
        write_results(out, "bench_pollux", tables=[table], machine=machine,
                      data={"mode": "scale", "source": str(directory), **row})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dumped", type=Path, required=True, help="rounds from conformance_pollux.py --dump-rounds")
    parser.add_argument("--genetic", action="store_true", help="also run allocopt's genetic search")
    parser.add_argument("--generations", type=int, default=100, help="generations of the genetic search (--scale)")
    parser.add_argument("--tolerance", type=float, default=1e-8,
                        help="relative shortfall of the exact fitness counted as the solver's tolerance (HiGHS "
                             "settles ties of 1e-9 relative either way)")
    parser.add_argument("--scale", nargs=2, type=int, metavar=("JOBS", "GPUS"),
                        help="one round of JOBS jobs on GPUS GPUs built from the dumped jobs")
    add_results_option(parser, "bench_pollux", RESULTS)
    args = parser.parse_args(argv)
    machine = machine_info()
    if args.scale:
        return scaled(args.dumped, *args.scale, args.genetic, machine, args.results or None, args.generations)
    return dumped(args.dumped, args.genetic, args.tolerance, machine, args.results or None)


if __name__ == "__main__":
    sys.exit(main())
